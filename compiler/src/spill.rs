//! Spilling the rows files: each file is read in batches, every row goes to the bucket of its
//! key's position hash, and buffered buckets are written to a spill file beside the output
//! whenever the file's share of the memory budget is full. A bucket is later read back whole
//! (every file's pieces of it, in input order), so a compile holds a few buckets at a time
//! instead of its whole input.

use crate::column::{Column, TypeInfo};
use crate::error::{CompileError, Result};
use crate::phases::{Phase, Phases};
use crate::read::{Inputs, Opened, Role, RowsTable, Want};
use crate::Progress;
use dsc_format::rng::position_hash;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// The folder inside the staging directory that holds a compile's spill files.
pub(crate) const SPILL_DIR: &str = "spill";

/// How keys are spread over buckets: by the top `bits` bits of their position hash, so that a
/// bucket holds one contiguous stretch of every split's stored order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Buckets {
    pub bits: u32,
    pub seed: u64,
}

impl Buckets {
    /// The fewest buckets (a power of two) in which `bytes` of decoded rows come to at most
    /// `per_bucket` each.
    pub fn for_size(bytes: u64, per_bucket: u64, seed: u64) -> Buckets {
        let wanted = bytes.div_ceil(per_bucket.max(1)).max(1);
        let bits = wanted.next_power_of_two().trailing_zeros().min(20);
        Buckets { bits, seed }
    }

    pub fn count(&self) -> usize {
        1 << self.bits
    }

    #[inline]
    pub fn of(&self, key: i64) -> usize {
        if self.bits == 0 {
            0
        } else {
            (position_hash(key, self.seed) >> (64 - self.bits)) as usize
        }
    }
}

/// How many low bits of a global row number of a table with these columns number a list's
/// elements (`crate::lists`): none unless a column is a list.
pub(crate) fn element_bits(types: &[TypeInfo]) -> u32 {
    if types.iter().any(|t| t.list) {
        crate::lists::ELEMENT_BITS
    } else {
        0
    }
}

/// Decoded bytes per row of the wanted columns, estimated from their types alone (strings
/// count 16): what sizes buckets, so that the bucket count depends on the input only.
pub(crate) fn row_width(types: &[TypeInfo]) -> u64 {
    use crate::column::Kind;
    // The global row number each spilled row carries.
    8 + types
        .iter()
        .map(|t| match t.kind {
            Kind::Int | Kind::Time | Kind::F64 => 8,
            Kind::F32 => 4,
            Kind::Bool => 1,
            Kind::Str => 16,
        })
        .sum::<u64>()
}

/// Where one bucket's rows of one flush lie in a spill file.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Piece {
    bucket: u32,
    first_row: u64,
    run: u32,
    offset: u64,
    len: u64,
    rows: u64,
    /// The xxh3-64 of the piece's bytes, checked when it is read back: a spill file changed
    /// after it was written (a byte flipped on disk, a retried task's file under this name) is
    /// an error naming it, never wrong values.
    xxh3: u64,
}

/// The rows files as the spill knows them: paths, first global rows (and the total), types.
#[derive(Debug, Clone)]
pub(crate) struct Described {
    pub files: Vec<PathBuf>,
    pub offsets: Vec<u64>,
    pub types: Vec<TypeInfo>,
}

/// The spilled rows files: which pieces of which spill file hold each bucket.
/// One spill file, or its bytes where the spill stayed in memory.
enum RunData {
    File(PathBuf),
    Memory(Arc<Vec<u8>>),
}

pub(crate) struct Spill {
    runs: Vec<RunData>,
    /// Sorted by bucket, then by first row (input order).
    pieces: Vec<Piece>,
    /// `starts[b]..starts[b + 1]` are bucket `b`'s pieces.
    starts: Vec<usize>,
    files: Vec<PathBuf>,
    offsets: Vec<u64>,
    wants: Vec<Want>,
    types: Vec<TypeInfo>,
}

/// Where and how rows are spilled: spill files `NAME-FILE.spill` in `dir`, rows into `buckets`,
/// each file buffering at most `budget` bytes between flushes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SpillTo<'a> {
    pub dir: &'a Path,
    pub name: &'a str,
    pub buckets: Buckets,
    pub budget: usize,
    /// Keep the spill in memory instead of writing it (when the whole input fits the budget
    /// several times over): the same pieces, without a write and a read of every byte.
    pub in_memory: bool,
}

/// Per rows file, the keys whose rows it leaves out: a compaction's, of the keys a later
/// generation replaced (their rows in this file are not the live context's). Empty for a compile.
pub(crate) type SkipKeys = HashMap<PathBuf, HashSet<i64>>;

/// Which rows a scan keeps, by key: all but those `skip` names for their file, and of those,
/// only the keys `keep` names when given (the statistics of the contexts an append hides, read
/// back from their inputs).
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyFilter {
    pub skip: SkipKeys,
    pub keep: Option<HashSet<i64>>,
}

impl KeyFilter {
    /// The filter of one file's rows.
    fn of(&self, file: &Path) -> FileFilter<'_> {
        FileFilter {
            skip: self.skip.get(file),
            keep: self.keep.as_ref(),
        }
    }
}

/// [`KeyFilter`] for the rows of one file.
#[derive(Debug, Clone, Copy, Default)]
struct FileFilter<'a> {
    skip: Option<&'a HashSet<i64>>,
    keep: Option<&'a HashSet<i64>>,
}

impl FileFilter<'_> {
    fn drops(&self, key: i64) -> bool {
        self.skip.is_some_and(|s| s.contains(&key)) || self.keep.is_some_and(|k| !k.contains(&key))
    }
}

/// One bucket's rows of one file, buffered until the next flush.
struct Buffer {
    origin: Vec<u64>,
    columns: Vec<Column>,
}

/// What spilling some of the rows files wrote: spill file names (in the spill folder) and the
/// pieces in them (`Piece::run` indexes `runs`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SpillPart {
    pub runs: Vec<String>,
    pieces: Vec<Piece>,
    /// The runs' bytes, where the spill stayed in memory (never for partitions' parts).
    #[serde(skip)]
    memory: Vec<Option<Arc<Vec<u8>>>>,
}

/// Reads the files `files` of `inputs`, sends each row to its bucket and writes the buckets to
/// spill files in `dir`. Each file buffers at most `budget` bytes of rows between flushes. The
/// first error in file order wins, whatever the thread count.
pub(crate) fn spill_rows(
    inputs: Inputs,
    files: Range<usize>,
    wants: &[Want],
    to: SpillTo,
    filter: &KeyFilter,
    progress: &dyn Progress,
    phases: &Phases,
) -> Result<SpillPart> {
    let SpillTo {
        dir,
        name,
        buckets,
        budget,
        in_memory,
    } = to;
    let Inputs {
        opened,
        types,
        offsets,
    } = inputs;
    type Spilled = (String, Vec<Piece>, Option<Vec<u8>>);
    let chunks = read_chunks(opened, files, &offsets)?;
    let results: Vec<Result<Spilled>> = chunks
        .into_par_iter()
        .enumerate()
        .map(|(local, chunk)| {
            crate::progress::check(progress)?;
            let name = format!("{name}-{:06}-{:03}.spill", chunk.file, chunk.index);
            let filter = filter.of(&chunk.opened.path);
            let (pieces, memory) = spill_file(
                chunk.opened,
                filter,
                local as u32,
                (chunk.first_row, chunk.first_row - offsets[chunk.file]),
                (!in_memory).then(|| dir.join(&name)),
                wants,
                &types,
                buckets,
                budget,
                phases,
            )?;
            if chunk.last {
                progress.advance(1);
            }
            Ok((name, pieces, memory))
        })
        .collect();
    let mut part = SpillPart {
        runs: Vec::with_capacity(results.len()),
        pieces: Vec::new(),
        memory: Vec::new(),
    };
    for r in results {
        let (name, pieces, memory) = r?;
        part.runs.push(name);
        part.pieces.extend(pieces);
        part.memory.push(memory.map(Arc::new));
    }
    Ok(part)
}

/// A stretch of one rows file read by one thread: some of its row groups.
struct Chunk {
    file: usize,
    index: usize,
    last: bool,
    first_row: u64,
    opened: Opened,
}

/// The files `files` of `opened`, each cut into contiguous runs of row groups so that every
/// thread has a stretch to read when there are fewer files than threads. Which rows a chunk
/// holds changes nothing but the spill's layout: its pieces carry their first global row.
fn read_chunks(opened: Vec<Opened>, files: Range<usize>, offsets: &[u64]) -> Result<Vec<Chunk>> {
    let threads = rayon::current_num_threads().max(1);
    let per_file = threads.div_ceil(files.len().max(1));
    let mut chunks = Vec::new();
    for (i, o) in opened.into_iter().enumerate() {
        if !files.contains(&i) {
            continue;
        }
        let groups = o.row_group_rows();
        let n = per_file.min(groups.len()).max(1);
        if n == 1 {
            chunks.push(Chunk {
                file: i,
                index: 0,
                last: true,
                first_row: offsets[i],
                opened: o,
            });
            continue;
        }
        let path = o.path.clone();
        drop(o);
        let mut first_row = offsets[i];
        for j in 0..n {
            let range = groups.len() * j / n..groups.len() * (j + 1) / n;
            let rows: u64 = groups[range.clone()].iter().sum();
            chunks.push(Chunk {
                file: i,
                index: j,
                last: j + 1 == n,
                first_row,
                opened: crate::read::open(&path)?.row_groups(range),
            });
            first_row += rows;
        }
    }
    Ok(chunks)
}

#[allow(clippy::too_many_arguments)]
fn spill_file(
    opened: Opened,
    filter: FileFilter<'_>,
    run: u32,
    (first_row, row_in_file): (u64, u64),
    path: Option<PathBuf>,
    wants: &[Want],
    types: &[TypeInfo],
    buckets: Buckets,
    budget: usize,
    phases: &Phases,
) -> Result<(Vec<Piece>, Option<Vec<u8>>)> {
    let source = opened.path.clone();
    let expected = opened.rows;
    let mut reader = phases.time(Phase::Decode, || opened.into_wanted_reader(wants))?;
    // Written under a temporary name and renamed when complete: a retried or duplicated task
    // never leaves, nor reads, half a spill file.
    let tmp = path
        .as_ref()
        .map(|p| p.with_extension(format!("spill.{}.tmp", std::process::id())));
    let sink = match &tmp {
        Some(tmp) => Sink::File(BufWriter::with_capacity(
            1 << 20,
            File::create(tmp).map_err(|e| spill_err(tmp, e))?,
        )),
        None => Sink::Memory(Vec::new()),
    };
    let mut out = Writer {
        path: tmp.as_deref().unwrap_or(&source),
        run,
        sink,
        offset: 0,
        pieces: Vec::new(),
    };
    let mut buffers: Vec<Option<Buffer>> = (0..buckets.count()).map(|_| None).collect();
    let mut members: Vec<Vec<u32>> = vec![Vec::new(); buckets.count()];
    let mut read = 0u64;
    let shift = element_bits(types);
    let exploded = shift > 0;
    let names: Vec<&str> = wants.iter().map(|w| w.name.as_str()).collect();
    loop {
        let decoding = Instant::now();
        let Some(batch) = reader.next() else {
            phases.add(Phase::Decode, decoding.elapsed());
            break;
        };
        let batch = batch.map_err(|e| {
            let at = format!("after row {}", row_in_file + read);
            CompileError::parquet(source.clone(), Some(at), e)
        })?;
        let n = batch.num_rows();
        let base = first_row + read;
        // A list table's batch becomes one row per element (`crate::lists`), each with its
        // global number; any other batch keeps its rows, numbered from `base`.
        let (columns, origin): (Vec<Column>, Option<Vec<u64>>) = if exploded {
            let e =
                crate::lists::explode(&batch, &names, types, base, (&source, row_in_file + read))?;
            (e.columns, Some(e.origin))
        } else {
            let columns = types
                .iter()
                .zip(wants)
                .map(|(t, w)| {
                    let mut c = Column::new(t.clone(), n);
                    if w.role == Role::RowNumber {
                        // A table of records is keyed by each row's number across the rows
                        // files.
                        let numbers = (base..base + n as u64).map(|r| r as i64);
                        let array: arrow_array::ArrayRef =
                            std::sync::Arc::new(arrow_array::Int64Array::from_iter_values(numbers));
                        c.push_array(&array);
                    } else {
                        c.push_array(batch.column_by_name(&w.name).expect("projected"));
                    }
                    c
                })
                .collect();
            (columns, None)
        };
        let spilling = Instant::now();
        phases.add(Phase::Decode, spilling - decoding);
        let global = |r: usize| origin.as_ref().map_or(base + r as u64, |o| o[r]);
        let key = &columns[0];
        if let Some(valid) = &key.valid {
            if let Some(r) = valid.iter().position(|v| !v) {
                let file_row = (global(r) >> shift) - first_row + row_in_file;
                return Err(CompileError::NullKey {
                    path: source.clone(),
                    column: wants[0].name.clone(),
                    row: file_row,
                });
            }
        }
        for (r, &k) in key.key_ids().iter().enumerate() {
            if filter.drops(k) {
                continue;
            }
            members[buckets.of(k)].push(r as u32);
        }
        for (b, rows) in members.iter_mut().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let buf = buffers[b].get_or_insert_with(|| Buffer {
                origin: Vec::new(),
                columns: types.iter().map(|t| Column::new(t.clone(), 0)).collect(),
            });
            buf.origin.extend(rows.iter().map(|&r| global(r as usize)));
            for (dst, src) in buf.columns.iter_mut().zip(&columns) {
                dst.push_rows(src, rows);
            }
            rows.clear();
        }
        read += n as u64;
        // What the buffers hold now, each bucket's dictionaries included, and the batch.
        let buffered: usize = buffers
            .iter()
            .flatten()
            .map(|b| {
                b.origin.capacity() * 8 + b.columns.iter().map(Column::heap_bytes).sum::<usize>()
            })
            .sum::<usize>()
            + columns.iter().map(Column::heap_bytes).sum::<usize>();
        if buffered >= budget {
            out.flush(&mut buffers)?;
        }
        phases.add(Phase::Spill, spilling.elapsed());
    }
    phases.time(Phase::Spill, || out.flush(&mut buffers))?;
    if read != expected {
        let from = if row_in_file > 0 {
            format!(" from row {row_in_file}")
        } else {
            String::new()
        };
        return Err(CompileError::BadParquet {
            path: source,
            reason: format!("the footer promises {expected} rows{from}, {read} could be read"),
            source: None,
        });
    }
    let Writer { sink, pieces, .. } = out;
    match (sink, &tmp, &path) {
        (Sink::File(mut file), Some(tmp), Some(path)) => {
            file.flush().map_err(|e| spill_err(tmp, e))?;
            std::fs::rename(tmp, path).map_err(|e| CompileError::io(path, e))?;
            Ok((pieces, None))
        }
        (Sink::Memory(bytes), _, _) => Ok((pieces, Some(bytes))),
        _ => unreachable!("a file sink has a path"),
    }
}

/// Where a spill's pieces go.
enum Sink {
    File(BufWriter<File>),
    Memory(Vec<u8>),
}

struct Writer<'a> {
    path: &'a Path,
    run: u32,
    sink: Sink,
    offset: u64,
    pieces: Vec<Piece>,
}

impl Writer<'_> {
    /// Writes every buffered bucket as one piece, in bucket order, and empties the buffers.
    fn flush(&mut self, buffers: &mut [Option<Buffer>]) -> Result<()> {
        let mut staged = Vec::new();
        for (b, slot) in buffers.iter_mut().enumerate() {
            let Some(buf) = slot.take() else { continue };
            // A piece in memory is written where it stays; one for the file is staged first.
            let (bytes, from) = match &mut self.sink {
                Sink::Memory(all) => {
                    let from = all.len();
                    (all, from)
                }
                Sink::File(_) => {
                    staged.clear();
                    (&mut staged, 0)
                }
            };
            crate::column::put_narrow(bytes, &buf.origin);
            buf.columns.iter().for_each(|c| c.write_to(bytes));
            let piece = &bytes[from..];
            let (len, xxh3) = (piece.len() as u64, dsc_format::checksum::xxh3(piece));
            if let Sink::File(file) = &mut self.sink {
                file.write_all(&staged)
                    .map_err(|e| spill_err(self.path, e))?;
            }
            self.pieces.push(Piece {
                bucket: b as u32,
                first_row: buf.origin[0],
                run: self.run,
                offset: self.offset,
                len,
                rows: buf.origin.len() as u64,
                xxh3,
            });
            self.offset += len;
        }
        Ok(())
    }
}

/// A failed spill write: most often a full disk, which the message says.
fn spill_err(path: &Path, e: std::io::Error) -> CompileError {
    let what = if e.raw_os_error() == Some(libc::ENOSPC) {
        "the disk beside `out` is full: the compile spills its input there (about the size of \
         the decoded columns); free space or choose another `out`"
            .to_string()
    } else {
        e.to_string()
    };
    CompileError::io(path, std::io::Error::new(e.kind(), what))
}

/// Spills a table already in memory (a CSV context table) into `buckets`, as one piece per
/// bucket in the spill file `NAME.spill` in `dir`.
pub(crate) fn spill_table(
    table: &RowsTable,
    buckets: Buckets,
    dir: &Path,
    name: &str,
) -> Result<SpillPart> {
    let mut members: Vec<Vec<u32>> = vec![Vec::new(); buckets.count()];
    for (r, &k) in table.columns[0].key_ids().iter().enumerate() {
        members[buckets.of(k)].push(r as u32);
    }
    let name = format!("{name}.spill");
    let path = dir.join(&name);
    let tmp = path.with_extension(format!("spill.{}.tmp", std::process::id()));
    let file = File::create(&tmp).map_err(|e| spill_err(&tmp, e))?;
    let mut out = Writer {
        path: &tmp,
        run: 0,
        sink: Sink::File(BufWriter::with_capacity(1 << 20, file)),
        offset: 0,
        pieces: Vec::new(),
    };
    let mut buffers: Vec<Option<Buffer>> = members
        .iter()
        .map(|rows| {
            (!rows.is_empty()).then(|| Buffer {
                origin: rows.iter().map(|&r| u64::from(r)).collect(),
                columns: table
                    .columns
                    .iter()
                    .map(|c| {
                        let mut col = Column::new(c.info.clone(), rows.len());
                        col.push_rows(c, rows);
                        col
                    })
                    .collect(),
            })
        })
        .collect();
    out.flush(&mut buffers)?;
    if let Sink::File(mut file) = out.sink {
        file.flush().map_err(|e| spill_err(&tmp, e))?;
    }
    std::fs::rename(&tmp, &path).map_err(|e| CompileError::io(&path, e))?;
    Ok(SpillPart {
        runs: vec![name],
        pieces: out.pieces,
        memory: Vec::new(),
    })
}

impl Spill {
    /// The spill of every part (in file order), read from `dir`.
    pub fn from_parts(
        dir: &Path,
        parts: Vec<SpillPart>,
        buckets: Buckets,
        inputs: Described,
        wants: Vec<Want>,
    ) -> Spill {
        let mut runs = Vec::new();
        let mut pieces = Vec::new();
        for part in parts {
            let base = runs.len() as u32;
            for (i, r) in part.runs.iter().enumerate() {
                runs.push(match part.memory.get(i).cloned().flatten() {
                    Some(bytes) => RunData::Memory(bytes),
                    None => RunData::File(dir.join(r)),
                });
            }
            pieces.extend(part.pieces.into_iter().map(|p| Piece {
                run: base + p.run,
                ..p
            }));
        }
        pieces.sort_unstable_by_key(|p| (p.bucket, p.first_row));
        let starts = (0..=buckets.count())
            .map(|b| pieces.partition_point(|p| (p.bucket as usize) < b))
            .collect();
        let Described {
            files,
            offsets,
            types,
        } = inputs;
        Spill {
            runs,
            pieces,
            starts,
            files,
            offsets,
            wants,
            types,
        }
    }

    /// The type of a spilled column.
    pub fn type_of(&self, name: &str) -> &TypeInfo {
        let i = self
            .wants
            .iter()
            .position(|w| w.name == name)
            .expect("a spilled column");
        &self.types[i]
    }

    /// Rows in bucket `b`.
    pub fn rows(&self, b: usize) -> u64 {
        self.pieces[self.starts[b]..self.starts[b + 1]]
            .iter()
            .map(|p| p.rows)
            .sum()
    }

    /// Reads bucket `b` back: its rows in input order, as a table that locates them in their
    /// files.
    pub fn load(&self, b: usize) -> Result<RowsTable> {
        let pieces = &self.pieces[self.starts[b]..self.starts[b + 1]];
        let total = pieces.iter().map(|p| p.rows as usize).sum();
        let mut columns: Vec<Column> = self
            .types
            .iter()
            .map(|t| Column::new(t.clone(), total))
            .collect();
        let mut origin = Vec::with_capacity(total);
        let mut read = Vec::new();
        for p in pieces {
            let bytes: &[u8] = match &self.runs[p.run as usize] {
                RunData::Memory(all) => &all[p.offset as usize..(p.offset + p.len) as usize],
                RunData::File(path) => {
                    read.resize(p.len as usize, 0);
                    File::open(path)
                        .and_then(|f| f.read_exact_at(&mut read, p.offset))
                        .map_err(|e| match e.kind() {
                            std::io::ErrorKind::NotFound | std::io::ErrorKind::UnexpectedEof => {
                                CompileError::CorruptWork {
                                    path: path.clone(),
                                    what: format!(
                                        "{e}: the spill file is missing or cut short; in a \
                                         partitioned compile rerun the scan stage that read its \
                                         rows file (`stage=scan` of its `partition=I/N`), else \
                                         the compile"
                                    ),
                                }
                            }
                            _ => CompileError::io(path, e),
                        })?;
                    if dsc_format::checksum::xxh3(&read) != p.xxh3 {
                        return Err(CompileError::CorruptWork {
                            path: path.clone(),
                            what: format!(
                                "the piece of bucket {b} at byte {} does not match its checksum: \
                                 the spill file changed after it was written; in a partitioned \
                                 compile rerun the scan stage that read its rows file \
                                 (`stage=scan` of its `partition=I/N`), else the compile",
                                p.offset
                            ),
                        });
                    }
                    &read
                }
            };
            let mut rest = bytes;
            crate::column::take_narrow(&mut rest, p.rows as usize, &mut origin);
            for all in columns.iter_mut() {
                all.read_onto(&mut rest);
            }
        }
        columns.iter_mut().for_each(Column::finish);
        Ok(RowsTable {
            files: self.files.clone(),
            offsets: self.offsets.clone(),
            columns,
            wants: self.wants.clone(),
            origin: Some(origin),
            element_bits: element_bits(&self.types),
        })
    }
}
