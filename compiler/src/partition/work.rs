//! The work folder of a partitioned compile: its plan, the parts each task writes under a
//! fixed name with a checksum line, the files they list, and what a later stage checks before
//! it reads them.

use super::{work_dir, Partition, Stage};
use crate::budget;
use crate::commit;
use crate::error::{CompileError, Result};
use crate::lookup::ContextPart;
use crate::recipe::Recipe;
use crate::runs::{RunsFile, ValueRuns};
use crate::shards::WritePart;
use crate::spill::{self, SpillPart, SpillTo};
use crate::write::Staging;
use crate::Progress;
use dsc_format::choice::Choice;
use dsc_format::manifest::{InputFile, Inputs};
use dsc_format::CompileSpec;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What every part of one partitioned compile agrees on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(super) struct WorkPlan {
    pub(super) spec: CompileSpec,
    pub(super) partitions: usize,
    pub(super) fingerprint: String,
}

/// One stage's part: the plan's fingerprint, what the stage computed, and the work files it
/// wrote that later stages read whole.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Part<T> {
    pub(super) fingerprint: String,
    pub(super) partition: usize,
    pub(super) partitions: usize,
    pub(super) stage: Stage,
    pub(super) body: T,
    #[serde(default)]
    pub(super) files: Vec<WorkFile>,
}

/// A work file a part refers to: its name in the work folder, size and xxh3.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct WorkFile {
    pub(super) name: String,
    pub(super) bytes: u64,
    xxh3: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ScanBody {
    pub(super) spill: SpillPart,
    /// Size and checksum of each rows file read, in file order.
    pub(super) inputs: Vec<InputFile>,
    /// The context table's spill (the last partition's part only).
    pub(super) context: Option<ContextPart>,
    /// Size and checksum of every side file (context and join tables, key files), as the last
    /// partition's scan read them; later stages read them again and must find the same bytes.
    #[serde(default)]
    pub(super) side: Vec<InputFile>,
}

/// A name for the files of this attempt at a stage: two attempts (a retry, a duplicated task)
/// never write under one name.
pub(super) fn attempt() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = dsc_format::checksum::Hasher::new();
    h.update(format!("{}:{nanos}", std::process::id()).as_bytes());
    h.hex()[..12].to_string()
}

/// The layout of the files stages hand each other (parts, spills, values runs): raised when it
/// changes, so that stages run by different versions of dsc never read each other's.
const WORK_LAYOUT: u32 = 2;

/// The plan's fingerprint: the spec, the partition count, each input's size and modification
/// time, and the version of dsc and of its work files, so that parts of another compile, of
/// inputs changed since, or of another dsc never mix.
fn fingerprint(spec: &CompileSpec, partitions: usize, named: &[(PathBuf, &str)]) -> Result<String> {
    let mut h = dsc_format::checksum::Hasher::new();
    h.update(format!("dsc {} work {WORK_LAYOUT}\n", env!("CARGO_PKG_VERSION")).as_bytes());
    h.update(&serde_json::to_vec(spec).expect("a spec serializes"));
    h.update(format!("\n{partitions}\n").as_bytes());
    for (path, role) in named {
        if crate::remote::is_url(path) {
            let (size, version) = crate::remote::head(path)?;
            h.update(format!("{role}\0{}\0{size}\0{version}\n", path.display()).as_bytes());
            continue;
        }
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

/// The work folder of one partitioned compile, with its plan.
pub(super) struct Work {
    pub(super) dir: PathBuf,
    /// Where the scans' spill files lie.
    pub(super) scan: PathBuf,
    pub(super) plan: WorkPlan,
}

impl Work {
    /// Opens (or starts) the work folder for `spec` in `partitions` parts; refuses one that
    /// belongs to another compile.
    pub(super) fn open(
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
    pub(super) fn existing(out: &Path) -> Result<Work> {
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
    pub(super) fn existing_if_any(out: &Path) -> Result<Option<Work>> {
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

    pub(super) fn write_part<T: Serialize>(
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
    pub(super) fn read_parts<T: DeserializeOwned>(&self, stage: Stage) -> Result<Vec<T>> {
        Ok(self
            .read_envelopes(stage)?
            .into_iter()
            .map(|p| p.body)
            .collect())
    }

    /// Every partition's part of `stage`, in partition order; a missing, corrupt or foreign one
    /// is an error that names it and says what to run.
    pub(super) fn read_envelopes<T: DeserializeOwned>(&self, stage: Stage) -> Result<Vec<Part<T>>> {
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
                            "belongs to another compile (another spec, partition count, inputs \
                             or version of dsc); rerun partition {i}/{n} of the {} stage",
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
    pub(super) fn scans(&self, named: &[(PathBuf, &str)], rows: usize) -> Result<Vec<ScanBody>> {
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
    pub(super) fn spilled<R: Recipe>(
        &self,
        recipe: &mut R,
        scans: Vec<ScanBody>,
    ) -> Result<R::Spilled> {
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
    pub(super) fn fits<T: DeserializeOwned>(&self) -> Result<(Vec<T>, Vec<RunsFile>)> {
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
            files.push(RunsFile::File(
                std::fs::File::open(&path).map_err(|e| CompileError::io(&path, e))?,
            ));
            parts.push(part.body);
        }
        Ok((parts, files))
    }
}

impl Work {
    /// Checks the inputs against the plan and reads every scan and write part, before anything
    /// is touched; then takes the output lock and starts the staging folder.
    pub(super) fn start_merge(
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
                       time), or its stages ran under another version of dsc; run them again"
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
    pub(super) fn merge_inputs(
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
                let shard = (&e.file, e.bytes, &e.xxh3);
                let keys = e.keys.as_ref().map(|k| (&k.file, k.bytes, &k.xxh3));
                for (name, bytes, xxh3) in std::iter::once(shard).chain(keys) {
                    let recorded = WorkFile {
                        name: name.clone(),
                        bytes,
                        xxh3: xxh3.clone(),
                    };
                    let from = check_work_file(&self.dir, &recorded, &rerun(Stage::Write, i, n))?;
                    let to = staging.dir.join(name);
                    std::fs::hard_link(&from, &to)
                        .or_else(|_| std::fs::copy(&from, &to).map(|_| ()))
                        .map_err(|e| CompileError::io(&from, e))?;
                }
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

    pub(super) fn scan_dir(&self) -> &Path {
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

/// Where one partition's scan writes its part of the spill (`name`: unique to the attempt).
pub(super) fn scan_to<'a>(
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
pub(super) fn with_values<T>(
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
