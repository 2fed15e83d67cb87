//! Partitioned compiles: the stages of a compile run as separate tasks (a Slurm job array, a
//! Kubernetes Indexed Job, Ray tasks) that share a file system, then `dsc merge` commits.
//!
//! - `scan I/N`: rows files `[I·F/N, (I+1)·F/N)` read and spilled into buckets;
//! - `fit I/N`: buckets `[I·B/N, (I+1)·B/N)` grouped and summarised (after every scan);
//! - `write I/N`: every fit merged (each task computes the same merge), the task's buckets
//!   encoded and written as their shards (after every fit);
//! - `merge`: every part checked, `stats.json`, then `manifest.json`, then one rename.
//!
//! Everything lives in a work folder beside the output (`.NAME.dsc-work`). Each part is written
//! under a temporary name and renamed, under a fixed name: a retried or duplicated task writes
//! the same bytes, a killed one leaves nothing a later stage would read. Every part carries the
//! plan's fingerprint (spec, partition count, every input's size and modification time), so
//! parts of another compile, or of inputs changed since, are refused by name. Nothing is a cache
//! until `merge` writes the manifest; the cache is byte-identical to a compile in one process.
//!
//! Nothing a stage reads is trusted: the plan and every part end in a checksum line; spill
//! pieces carry checksums checked when read, a fit's values file and a write's shards are
//! hashed whole against what their part recorded; the side files (context and join tables,
//! key files) are hashed by the last scan and checked by every later stage, since their size
//! and modification time can survive a rewrite. The files a scan or fit writes are named after
//! their attempt and listed by its part, so a retried task killed after writing its files but
//! before renaming its part leaves the earlier attempt's part with the earlier attempt's files.

use crate::budget;
use crate::commit::{self, CompileReport, Timer};
use crate::error::{CompileError, Result};
use crate::job::Job;
use crate::lookup::ContextPart;
use crate::recipe::Recipe;
use crate::runs::ValueRuns;
use crate::shards::WritePart;
use crate::spill::{self, SpillPart, SpillTo};
use crate::write::{sibling, Staging};
use crate::Progress;
use dsc_format::choice::Choice;
use dsc_format::manifest::{InputFile, Inputs};
use dsc_format::CompileSpec;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The stages a partition runs, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Read rows files and spill them into buckets.
    Scan,
    /// Group buckets and summarise their statistics.
    Fit,
    /// Encode buckets and write their shards.
    Write,
}

dsc_format::choice!(Stage, "stage", { Scan => "scan", Fit => "fit", Write => "write" });

/// Partition `index` of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// Which partition, from 0.
    pub index: usize,
    /// How many.
    pub count: usize,
}

impl Partition {
    /// Parses `I/N` (0 ≤ I < N).
    pub fn parse(text: &str) -> std::result::Result<Partition, String> {
        let (i, n) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not I/N (e.g. 0/4)"))?;
        let index: usize = i
            .trim()
            .parse()
            .map_err(|_| format!("{i:?} is not a number"))?;
        let count: usize = n
            .trim()
            .parse()
            .map_err(|_| format!("{n:?} is not a number"))?;
        if count == 0 || index >= count {
            return Err(format!("partition {index} of {count}: need 0 <= I < N"));
        }
        Ok(Partition { index, count })
    }

    /// The partition from the scheduler's environment: a Slurm job array
    /// (`SLURM_ARRAY_TASK_ID` from `SLURM_ARRAY_TASK_MIN`, `SLURM_ARRAY_TASK_COUNT`) or a
    /// Kubernetes Indexed Job (`JOB_COMPLETION_INDEX`, with the count given as `count`).
    pub fn from_env(
        count: Option<usize>,
        env: impl Fn(&str) -> Option<String>,
    ) -> std::result::Result<Partition, String> {
        let num = |name: &str| -> std::result::Result<Option<usize>, String> {
            env(name)
                .map(|v| {
                    v.trim()
                        .parse::<usize>()
                        .map_err(|_| format!("{name}={v:?} is not a number"))
                })
                .transpose()
        };
        let (index, count) = if let Some(id) = num("SLURM_ARRAY_TASK_ID")? {
            let min = num("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
            let n = match (num("SLURM_ARRAY_TASK_COUNT")?, count) {
                (Some(n), Some(given)) if n != given => {
                    return Err(format!(
                        "SLURM_ARRAY_TASK_COUNT is {n} but auto/{given} was given"
                    ))
                }
                (Some(n), _) => n,
                (None, Some(given)) => given,
                (None, None) => return Err("SLURM_ARRAY_TASK_COUNT is not set; give auto/N".into()),
            };
            if id < min {
                return Err(format!(
                    "SLURM_ARRAY_TASK_ID {id} is below SLURM_ARRAY_TASK_MIN {min}"
                ));
            }
            (id - min, n)
        } else if let Some(i) = num("JOB_COMPLETION_INDEX")? {
            let n = count.ok_or(
                "JOB_COMPLETION_INDEX gives the index only: give the count as auto/N \
                 (the Job's spec.completions)",
            )?;
            (i, n)
        } else {
            return Err(
                "`partition=auto` needs a Slurm job array (SLURM_ARRAY_TASK_ID) or a \
                 Kubernetes Indexed Job (JOB_COMPLETION_INDEX) in the environment"
                    .into(),
            );
        };
        Partition::parse(&format!("{index}/{count}"))
    }

    /// This partition's share of `0..total`: contiguous, in order, every item once.
    fn share(&self, total: usize) -> Range<usize> {
        total * self.index / self.count..total * (self.index + 1) / self.count
    }
}

/// The work folder of a partitioned compile into `out`.
pub fn work_dir(out: &Path) -> PathBuf {
    sibling(out, "dsc-work")
}

/// What every part of one partitioned compile agrees on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct WorkPlan {
    spec: CompileSpec,
    partitions: usize,
    fingerprint: String,
}

/// One stage's part: the plan's fingerprint, what the stage computed, and the work files it
/// wrote that later stages read whole.
#[derive(Debug, Serialize, Deserialize)]
struct Part<T> {
    fingerprint: String,
    partition: usize,
    partitions: usize,
    stage: Stage,
    body: T,
    #[serde(default)]
    files: Vec<WorkFile>,
}

/// A work file a part refers to: its name in the work folder, size and xxh3.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct WorkFile {
    name: String,
    bytes: u64,
    xxh3: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct ScanBody {
    spill: SpillPart,
    /// Size and checksum of each rows file read, in file order.
    inputs: Vec<InputFile>,
    /// The context table's spill (the last partition's part only).
    context: Option<ContextPart>,
    /// Size and checksum of every side file (context and join tables, key files), as the last
    /// partition's scan read them; later stages read them again and must find the same bytes.
    #[serde(default)]
    side: Vec<InputFile>,
}

/// A name for the files of this attempt at a stage: two attempts (a retry, a duplicated task)
/// never write under one name.
fn attempt() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = dsc_format::checksum::Hasher::new();
    h.update(format!("{}:{nanos}", std::process::id()).as_bytes());
    h.hex()[..12].to_string()
}

/// The plan's fingerprint: the spec, the partition count and each input's size and modification
/// time, so that parts of another compile, or of inputs changed since, never mix.
fn fingerprint(spec: &CompileSpec, partitions: usize, named: &[(PathBuf, &str)]) -> Result<String> {
    let mut h = dsc_format::checksum::Hasher::new();
    h.update(&serde_json::to_vec(spec).expect("a spec serializes"));
    h.update(format!("\n{partitions}\n").as_bytes());
    for (path, role) in named {
        let m = std::fs::metadata(path).map_err(|e| CompileError::io(path, e))?;
        let mtime = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        h.update(format!("{role}\0{}\0{}\0{mtime}\n", path.display(), m.len()).as_bytes());
    }
    Ok(h.hex())
}

fn part_name(stage: Stage, p: Partition) -> String {
    format!("{}-{}-of-{}.json", stage.name(), p.index, p.count)
}

/// Writes `bytes` to `path` through a temporary name (unique to this process) and a rename;
/// the temporary file is removed when anything fails (a full disk, say).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(|e| CompileError::io(&tmp, e))?;
        f.write_all(bytes).map_err(|e| CompileError::io(&tmp, e))?;
        f.sync_all().map_err(|e| CompileError::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| CompileError::io(path, e))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// What ends a checked file: this, then the xxh3 of everything before it.
const CHECK_LINE: &[u8] = b"\n#xxh3 ";

/// Writes `json` followed by a line holding its checksum (see [`write_atomic`]).
fn write_checked(path: &Path, json: &[u8]) -> Result<()> {
    let mut bytes = json.to_vec();
    bytes.extend_from_slice(CHECK_LINE);
    bytes.extend_from_slice(dsc_format::checksum::xxh3_hex(json).as_bytes());
    bytes.push(b'\n');
    write_atomic(path, &bytes)
}

/// The JSON of a file [`write_checked`] wrote, or what is wrong with it.
fn checked(bytes: &[u8]) -> std::result::Result<&[u8], &'static str> {
    let at = bytes
        .windows(CHECK_LINE.len())
        .rposition(|w| w == CHECK_LINE)
        .ok_or("it has no checksum line, so dsc did not write it (or it was cut short)")?;
    let (json, tail) = (&bytes[..at], &bytes[at + CHECK_LINE.len()..]);
    let sum = tail.strip_suffix(b"\n").unwrap_or(tail);
    if sum != dsc_format::checksum::xxh3_hex(json).as_bytes() {
        return Err("its checksum does not match its contents: it changed after dsc wrote it");
    }
    Ok(json)
}

/// The size and xxh3 of the file `name` in the work folder `dir`, checked against `want`.
fn check_work_file(dir: &Path, want: &WorkFile, rerun: &str) -> Result<PathBuf> {
    let path = dir.join(&want.name);
    let (bytes, xxh3) =
        dsc_format::checksum::hash_file(&path).map_err(|e| CompileError::CorruptWork {
            path: path.clone(),
            what: format!("cannot be read ({e}); rerun it: {rerun}"),
        })?;
    if (bytes, xxh3.as_str()) != (want.bytes, want.xxh3.as_str()) {
        return Err(CompileError::CorruptWork {
            path,
            what: format!(
                "its checksum does not match what its part recorded: it changed after it was \
                 written; rerun it: {rerun}"
            ),
        });
    }
    Ok(path)
}

/// How to rerun `stage` of partition `i` of `n`, by the options' keys (each front end spells
/// them: `--partition 2/4 --stage fit` on the command line, `partition="2/4"` and
/// `stage="fit"` for `dsc.compile_stage`).
fn rerun(stage: Stage, i: usize, n: usize) -> String {
    format!(
        "the compile with `partition={i}/{n}` `stage={}`",
        stage.name()
    )
}

/// Where a partitioned compile stands.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// The output folder.
    pub out: PathBuf,
    /// Whether `out` holds a committed cache.
    pub committed: bool,
    /// The partition count of the work in progress, if any.
    pub partitions: Option<usize>,
    /// Per stage, the partitions whose part is written.
    pub done: Vec<(Stage, Vec<usize>)>,
}

/// What a stage task did.
#[derive(Debug, Clone, Serialize)]
pub struct StageReport {
    /// The stage run.
    pub stage: Stage,
    /// The partition, from 0.
    pub partition: usize,
    /// The partition count.
    pub partitions: usize,
    /// Rows files (scan) or buckets (fit, write) this task handled.
    pub items: usize,
    /// Wall time.
    pub seconds: f64,
}

/// The work folder of one partitioned compile, with its plan.
struct Work {
    dir: PathBuf,
    /// Where the scans' spill files lie.
    scan: PathBuf,
    plan: WorkPlan,
}

impl Work {
    /// Opens (or starts) the work folder for `spec` in `partitions` parts; refuses one that
    /// belongs to another compile.
    fn open(
        out: &Path,
        spec: &CompileSpec,
        partitions: usize,
        named: &[(PathBuf, &str)],
    ) -> Result<Work> {
        let dir = work_dir(out);
        for sub in ["scan", "fit", dsc_format::SHARDS_DIR] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| CompileError::io(&dir, e))?;
        }
        let plan = WorkPlan {
            spec: spec.clone(),
            partitions,
            fingerprint: fingerprint(spec, partitions, named)?,
        };
        let path = dir.join("plan.json");
        match std::fs::read(&path) {
            Ok(bytes) => {
                let theirs = parse_plan(&path, &bytes)?;
                if theirs != plan {
                    let why = if theirs.partitions != partitions {
                        format!("{} partitions, not {partitions}", theirs.partitions)
                    } else if theirs.spec != plan.spec {
                        "another spec".to_string()
                    } else {
                        "inputs that have changed since (size or modification time)".to_string()
                    };
                    return Err(CompileError::Partition {
                        path: dir,
                        what: format!(
                            "holds the work of another compile ({why}); finish or remove it, \
                             or compile into another `out`"
                        ),
                    });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                write_checked(
                    &path,
                    &serde_json::to_vec_pretty(&plan).expect("serializes"),
                )?;
            }
            Err(e) => return Err(CompileError::io(&path, e)),
        }
        Ok(Work {
            scan: dir.join("scan"),
            dir,
            plan,
        })
    }

    /// Reads the plan of the work folder beside `out`.
    fn existing(out: &Path) -> Result<Work> {
        Self::existing_if_any(out)?.ok_or_else(|| CompileError::Partition {
            path: out.into(),
            what: format!(
                "no partitioned compile into it is under way ({} is missing): run the stages \
                 first (`stage=scan`, `stage=fit`, then `stage=write`, each in every \
                 `partition=I/N`)",
                work_dir(out).join("plan.json").display()
            ),
        })
    }

    /// The work folder beside `out` with its plan, `None` where there is none; a plan that
    /// cannot be read is an error.
    fn existing_if_any(out: &Path) -> Result<Option<Work>> {
        let dir = work_dir(out);
        let path = dir.join("plan.json");
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(CompileError::io(&path, e)),
        };
        let plan = parse_plan(&path, &bytes)?;
        Ok(Some(Work {
            scan: dir.join("scan"),
            dir,
            plan,
        }))
    }

    fn write_part<T: Serialize>(
        &self,
        stage: Stage,
        p: Partition,
        body: T,
        files: Vec<WorkFile>,
    ) -> Result<()> {
        let part = Part {
            fingerprint: self.plan.fingerprint.clone(),
            partition: p.index,
            partitions: p.count,
            stage,
            body,
            files,
        };
        write_checked(
            &self.dir.join(part_name(stage, p)),
            &serde_json::to_vec(&part).expect("a part serializes"),
        )
    }

    /// Every partition's part body of `stage`, in partition order.
    fn read_parts<T: DeserializeOwned>(&self, stage: Stage) -> Result<Vec<T>> {
        Ok(self
            .read_envelopes(stage)?
            .into_iter()
            .map(|p| p.body)
            .collect())
    }

    /// Every partition's part of `stage`, in partition order; a missing, corrupt or foreign one
    /// is an error that names it and says what to run.
    fn read_envelopes<T: DeserializeOwned>(&self, stage: Stage) -> Result<Vec<Part<T>>> {
        let n = self.plan.partitions;
        (0..n)
            .map(|i| {
                let p = Partition { index: i, count: n };
                let path = self.dir.join(part_name(stage, p));
                let bytes = std::fs::read(&path).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        CompileError::Partition {
                            path: path.clone(),
                            what: format!(
                                "partition {i}/{n} has not finished the {} stage: run it ({}) \
                                 and try again",
                                stage.name(),
                                rerun(stage, i, n)
                            ),
                        }
                    } else {
                        CompileError::io(&path, e)
                    }
                })?;
                let json = checked(&bytes).map_err(|problem| CompileError::CorruptWork {
                    path: path.clone(),
                    what: format!("{problem}; rerun it: {}", rerun(stage, i, n)),
                })?;
                let part: Part<T> =
                    serde_json::from_slice(json).map_err(|e| CompileError::Partition {
                        path: path.clone(),
                        what: format!("not a dsc part ({e}); rerun it: {}", rerun(stage, i, n)),
                    })?;
                if part.fingerprint != self.plan.fingerprint || part.partitions != n {
                    return Err(CompileError::Partition {
                        path,
                        what: format!(
                            "belongs to another compile (another spec, partition count or \
                             inputs); rerun partition {i}/{n} of the {} stage",
                            stage.name()
                        ),
                    });
                }
                Ok(part)
            })
            .collect()
    }

    /// Every scan part, after checking that the side files (`named` after its first `rows`
    /// entries) still hold the bytes the last scan read.
    fn scans(&self, named: &[(PathBuf, &str)], rows: usize) -> Result<Vec<ScanBody>> {
        let scans: Vec<ScanBody> = self.read_parts(Stage::Scan)?;
        let recorded = scans.iter().flat_map(|s| &s.side);
        let now = commit::hash_files(&named[rows.min(named.len())..])?;
        for (then, now) in recorded.zip(&now) {
            if (then.bytes, &then.xxh3) != (now.bytes, &now.xxh3) {
                return Err(CompileError::Partition {
                    path: PathBuf::from(&now.path),
                    what: "changed since the scan stage read it (its checksum differs, whatever \
                           its size and modification time say): the stages would mix two \
                           versions of it; put it back, or run every stage again from the scan"
                        .into(),
                });
            }
        }
        Ok(scans)
    }

    /// What every scan part spilled, assembled by `recipe`; a compile with a context table
    /// refuses scans whose last part holds none.
    fn spilled<R: Recipe>(&self, recipe: &mut R, scans: Vec<ScanBody>) -> Result<R::Spilled> {
        let mut parts = Vec::with_capacity(scans.len());
        let mut context = None;
        for s in scans {
            parts.push(s.spill);
            context = context.or(s.context);
        }
        if recipe.has_context() && context.is_none() {
            let n = self.plan.partitions;
            let last = Partition {
                index: n - 1,
                count: n,
            };
            return Err(CompileError::Partition {
                path: self.dir.join(part_name(Stage::Scan, last)),
                what: format!(
                    "the last scan part holds no context table; rerun it: {}",
                    rerun(Stage::Scan, n - 1, n)
                ),
            });
        }
        recipe.spilled(self.scan_dir(), parts, context)
    }

    /// Every fit part and its values file, checked whole and opened.
    fn fits<T: DeserializeOwned>(&self) -> Result<(Vec<T>, Vec<std::fs::File>)> {
        let n = self.plan.partitions;
        let mut parts = Vec::with_capacity(n);
        let mut files = Vec::with_capacity(n);
        for (i, part) in self
            .read_envelopes::<T>(Stage::Fit)?
            .into_iter()
            .enumerate()
        {
            let rerun = rerun(Stage::Fit, i, n);
            let values = part.files.first().ok_or_else(|| CompileError::Partition {
                path: self
                    .dir
                    .join(part_name(Stage::Fit, Partition { index: i, count: n })),
                what: format!("names no values file; rerun it: {rerun}"),
            })?;
            let path = check_work_file(&self.dir, values, &rerun)?;
            files.push(std::fs::File::open(&path).map_err(|e| CompileError::io(&path, e))?);
            parts.push(part.body);
        }
        Ok((parts, files))
    }
}

/// Runs one stage of one partition of a compile of `spec` into `out`.
pub fn run_stage(
    spec: &CompileSpec,
    out: &Path,
    max_memory: Option<u64>,
    partition: Partition,
    stage: Stage,
    progress: &dyn Progress,
) -> Result<StageReport> {
    let start = std::time::Instant::now();
    let budget = max_memory.unwrap_or_else(budget::default_budget);
    let items = match Job::new(spec)? {
        Job::Own(recipe) => self::stage(recipe, spec, out, budget, partition, stage, progress)?,
        Job::Profile(recipe) => self::stage(recipe, spec, out, budget, partition, stage, progress)?,
    };
    progress.finish();
    Ok(StageReport {
        stage,
        partition: partition.index,
        partitions: partition.count,
        items,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Where one partition's scan writes its part of the spill (`name`: unique to the attempt).
fn scan_to<'a>(
    work: &'a Work,
    setup_buckets: spill::Buckets,
    name: &'a str,
    budget: u64,
) -> SpillTo<'a> {
    SpillTo {
        dir: work.scan_dir(),
        name,
        buckets: setup_buckets,
        budget: budget::read_share(budget),
        // Other stages, maybe on other machines, read it back.
        in_memory: false,
    }
}

/// Runs `f` writing partition `i`'s values file (named after this attempt) under a temporary
/// name, renamed when done; returns what `f` returned and the file as its part records it. The
/// temporary file is removed when anything fails.
fn with_values<T>(
    work: &Work,
    i: usize,
    f: impl FnOnce(&ValueRuns) -> Result<T>,
) -> Result<(T, WorkFile)> {
    let name = format!("fit/values-{i}-{}.spill", attempt());
    let final_path = work.dir.join(&name);
    let tmp = final_path.with_extension(format!("{}.tmp", std::process::id()));
    let done = (|| {
        let runs = ValueRuns::create(tmp.clone(), i as u32)?;
        let out = f(&runs)?;
        runs.finish()?;
        let (bytes, xxh3) = runs.checksum();
        std::fs::rename(&tmp, &final_path).map_err(|e| CompileError::io(&final_path, e))?;
        Ok((out, WorkFile { name, bytes, xxh3 }))
    })();
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// The plan in `bytes` (of the file at `path`), its checksum verified.
fn parse_plan(path: &Path, bytes: &[u8]) -> Result<WorkPlan> {
    let dir = path.parent().unwrap_or(path).display().to_string();
    let json = checked(bytes).map_err(|problem| CompileError::CorruptWork {
        path: path.into(),
        what: format!("{problem}; remove the work folder {dir} and run every stage again"),
    })?;
    serde_json::from_slice(json).map_err(|e| CompileError::Partition {
        path: path.into(),
        what: format!(
            "not a dsc plan ({e}); remove the work folder {dir} and run every stage again"
        ),
    })
}

/// One stage of one partition of a recipe's compile; returns the items (files or buckets) it
/// handled.
fn stage<R: Recipe>(
    mut recipe: R,
    spec: &CompileSpec,
    out: &Path,
    budget: u64,
    partition: Partition,
    stage: Stage,
    progress: &dyn Progress,
) -> Result<usize> {
    let work = Work::open(out, spec, partition.count, recipe.inputs())?;
    let rows_files = recipe.rows_files();
    if stage == Stage::Scan {
        let files = partition.share(rows_files);
        progress.stage("reading", files.len() as u64);
        let attempt = attempt();
        let rows_name = format!("rows-{attempt}");
        let to = scan_to(&work, recipe.buckets(), &rows_name, budget);
        let spill = recipe.scan(files.clone(), to, progress)?;
        let inputs = commit::hash_files(&recipe.inputs()[files.clone()])?;
        // The last partition also spills the context table, once for every stage, and records
        // what every side file holds.
        let (context, side) = if partition.index + 1 == partition.count {
            let context_name = format!("context-{attempt}");
            let to = scan_to(&work, recipe.buckets(), &context_name, budget);
            let context = recipe.scan_context(to, progress)?;
            (context, commit::hash_files(&recipe.inputs()[rows_files..])?)
        } else {
            (None, Vec::new())
        };
        let body = ScanBody {
            spill,
            inputs,
            context,
            side,
        };
        work.write_part(Stage::Scan, partition, body, Vec::new())?;
        return Ok(files.len());
    }
    let scans = work.scans(recipe.inputs(), rows_files)?;
    let spilled = work.spilled(&mut recipe, scans)?;
    let at_once = recipe.at_once(&spilled, budget)?;
    let buckets = partition.share(recipe.buckets().count());
    if stage == Stage::Fit {
        progress.stage("statistics", buckets.len() as u64);
        let (part, values) = with_values(&work, partition.index, |runs| {
            recipe.fit(&spilled, buckets.clone(), at_once, runs, progress)
        })?;
        work.write_part(Stage::Fit, partition, part, vec![values])?;
    } else {
        let (fits, values) = work.fits::<R::FitPart>()?;
        let fitted = recipe.reduce(&spilled, fits, &values)?;
        progress.stage("writing shards", buckets.len() as u64);
        let part = recipe.write(
            &spilled,
            &fitted,
            &values,
            buckets.clone(),
            at_once,
            &work.dir,
            progress,
        )?;
        work.write_part(Stage::Write, partition, part, Vec::new())?;
    }
    Ok(buckets.len())
}

/// Commits a partitioned compile into `out` once every partition has run every stage: checks
/// every part, writes `stats.json` and `manifest.json`, moves the shards in and renames the
/// cache into place; then removes the work folder.
pub fn merge(
    out: &Path,
    force: bool,
    storage: crate::Storage,
    progress: &dyn Progress,
) -> Result<CompileReport> {
    let storage = storage.check()?;
    let timer = Timer::start();
    let work = Work::existing(out)?;
    let spec = work.plan.spec.clone();
    let report = match Job::new(&spec)? {
        Job::Own(recipe) => merge_with(recipe, &work, out, force, storage, timer, progress)?,
        Job::Profile(recipe) => merge_with(recipe, &work, out, force, storage, timer, progress)?,
    };
    progress.advance(1);
    progress.finish();
    std::fs::remove_dir_all(&work.dir).map_err(|e| CompileError::io(&work.dir, e))?;
    Ok(report)
}

/// The merge of a recipe's parts: every part checked, then the recipe's statistics and
/// manifest over them, committed.
fn merge_with<R: Recipe>(
    mut recipe: R,
    work: &Work,
    out: &Path,
    force: bool,
    storage: crate::Storage,
    timer: Timer,
    progress: &dyn Progress,
) -> Result<CompileReport> {
    let (scans, writes, mut staging) =
        work.start_merge(out, force, (recipe.inputs(), recipe.rows_files()), progress)?;
    staging.storage = storage;
    let inputs = work.merge_inputs(&scans, &writes, &staging)?;
    let spilled = work.spilled(&mut recipe, scans)?;
    let (fits, values) = work.fits::<R::FitPart>()?;
    let fitted = recipe.reduce(&spilled, fits, &values)?;
    drop((spilled, values));
    recipe.finish(fitted, writes, inputs, staging, timer, progress)
}

impl Work {
    /// Checks the inputs against the plan and reads every scan and write part, before anything
    /// is touched; then takes the output lock and starts the staging folder.
    fn start_merge(
        &self,
        out: &Path,
        force: bool,
        (named, rows): (&[(PathBuf, &str)], usize),
        progress: &dyn Progress,
    ) -> Result<(Vec<ScanBody>, Vec<WritePart>, Staging)> {
        if fingerprint(&self.plan.spec, self.plan.partitions, named)? != self.plan.fingerprint {
            return Err(CompileError::Partition {
                path: self.dir.clone(),
                what: "the compile's inputs changed since its stages ran (size or modification \
                       time); run them again"
                    .into(),
            });
        }
        let scans = self.scans(named, rows)?;
        let writes: Vec<WritePart> = self.read_parts(Stage::Write)?;
        let staging = Staging::create(out, force)?;
        progress.stage("merging", 1);
        Ok((scans, writes, staging))
    }

    /// Links every written shard into `staging`, each checked whole against the checksum its
    /// write stage recorded, and describes the inputs: the rows files as their scans hashed
    /// them, the side files as the last scan hashed them (every stage since found the same).
    fn merge_inputs(
        &self,
        scans: &[ScanBody],
        writes: &[WritePart],
        staging: &Staging,
    ) -> Result<Inputs> {
        let n = writes.len();
        // Linked, not moved: a merge that fails (or is killed) before the commit leaves every
        // part in the work folder, and can simply be run again.
        for (i, w) in writes.iter().enumerate() {
            for e in &w.entries {
                let recorded = WorkFile {
                    name: e.file.clone(),
                    bytes: e.bytes,
                    xxh3: e.xxh3.clone(),
                };
                let from = check_work_file(&self.dir, &recorded, &rerun(Stage::Write, i, n))?;
                let to = staging.dir.join(&e.file);
                std::fs::hard_link(&from, &to)
                    .or_else(|_| std::fs::copy(&from, &to).map(|_| ()))
                    .map_err(|e| CompileError::io(&from, e))?;
            }
        }
        let rows_inputs = scans.iter().flat_map(|s| s.inputs.clone());
        let side = scans.iter().flat_map(|s| s.side.clone());
        let files: Vec<InputFile> = rows_inputs.chain(side).collect();
        Ok(Inputs {
            fingerprint: commit::combined_fingerprint(&files),
            files,
        })
    }

    fn scan_dir(&self) -> &Path {
        &self.scan
    }
}

/// Which stages of a partitioned compile into `out` are done.
pub fn status(out: &Path) -> Result<Status> {
    let committed = out.join(dsc_format::MANIFEST_FILE).is_file();
    let Some(work) = Work::existing_if_any(out)? else {
        return Ok(Status {
            out: out.into(),
            committed,
            partitions: None,
            done: Vec::new(),
        });
    };
    let n = work.plan.partitions;
    let done = Stage::ALL
        .iter()
        .map(|&stage| {
            let ready = (0..n)
                .filter(|&i| {
                    work.dir
                        .join(part_name(stage, Partition { index: i, count: n }))
                        .is_file()
                })
                .collect();
            (stage, ready)
        })
        .collect();
    Ok(Status {
        out: out.into(),
        committed,
        partitions: Some(n),
        done,
    })
}
