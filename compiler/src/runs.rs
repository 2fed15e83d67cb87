//! Sorted runs of values and exact rank queries over them: how exact quantiles and histograms
//! merge across buckets without holding a column in memory. Each bucket appends each split's
//! values, sorted, with every [`SAMPLE`]-th as a sample; a statistic's runs are read back by
//! positioned reads (never mapped, so they do not count in the compile's memory). A column read
//! through a small join, a boolean one, or any whose values in a bucket are few distinct ones,
//! appends a counted run instead: its distinct values, each with how many of the values are at
//! most it, which stand for the sorted values without writing them.

use crate::error::{CompileError, Result};
use crate::stats::{linear_quantiles, Moments};
use dsc_format::stats::{Bin, NumericStats, Quantile};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Sorted runs of finite values, one per (column, split, bucket), in one spill file, or in
/// memory while they fit a limit.
pub(crate) struct ValueRuns {
    path: PathBuf,
    /// Which values file of the compile this is (one per statistics partition).
    file: u32,
    /// Where runs go, the bytes written, and their checksum (runs are appended in order).
    out: Mutex<(Sink, u64, dsc_format::checksum::Hasher)>,
    /// Bytes held in memory before the runs move to the file.
    memory: u64,
}

/// Where a values file's bytes are written.
enum Sink {
    File(File),
    /// Each run's offset and bytes as they were appended (moved in, never copied into one
    /// buffer): what [`RunsFile::Memory`] reads.
    Memory(Vec<(u64, Vec<u8>)>),
}

/// A values file, for positioned reads: on disk, or the bytes a compile that holds its input in
/// memory kept (the values file is then never written: the page cache's copy of half a
/// gigabyte of values was a tenth of a 2-core compile).
pub(crate) enum RunsFile {
    File(File),
    /// Each run's bytes, with the offset each starts at.
    Memory(Vec<(u64, Vec<u8>)>),
}

impl RunsFile {
    /// Reads `buf.len()` bytes at `offset`.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        match self {
            RunsFile::File(f) => f.read_exact_at(buf, offset),
            RunsFile::Memory(pieces) => {
                // Reads stay inside one run, but nothing here relies on it.
                let (mut at, mut filled) = (offset, 0);
                while filled < buf.len() {
                    let i = pieces.partition_point(|(start, _)| *start <= at);
                    let Some((start, bytes)) = i.checked_sub(1).map(|i| &pieces[i]) else {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    };
                    let from = (at - start) as usize;
                    let n = bytes.len().saturating_sub(from).min(buf.len() - filled);
                    if n == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    buf[filled..filled + n].copy_from_slice(&bytes[from..from + n]);
                    filled += n;
                    at += n as u64;
                }
                Ok(())
            }
        }
    }
}

/// Where one run lies: its values, then every [`SAMPLE`]-th of them.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Run {
    file: u32,
    offset: u64,
    len: u64,
    /// A counted run's distinct values (0: a run of every value, then its samples).
    #[serde(default)]
    distinct: u64,
}

/// A counted run as read: its distinct values' order keys, ascending, and `ends[i]`, the values
/// at most value `i` (so the sorted run holds value `i` at positions `ends[i - 1]..ends[i]`).
struct Counted {
    keys: Vec<u64>,
    ends: Vec<u64>,
}

impl Counted {
    fn read(file: &RunsFile, run: Run) -> Result<Counted> {
        let m = run.distinct as usize;
        let keys = read_f64s(file, run.offset, m)?
            .into_iter()
            .map(ord_key)
            .collect();
        let ends = read_f64s(file, run.offset + run.distinct * 8, m)?
            .into_iter()
            .map(f64::to_bits)
            .collect();
        Ok(Counted { keys, ends })
    }

    /// The sorted values at positions `from..to`.
    fn range(&self, from: u64, to: u64) -> Vec<f64> {
        let mut out = Vec::with_capacity((to - from) as usize);
        let mut i = self.ends.partition_point(|&e| e <= from);
        let mut at = from;
        while at < to {
            let until = self.ends[i].min(to);
            let x = from_ord_key(self.keys[i]);
            out.extend(std::iter::repeat_n(x, (until - at) as usize));
            at = until;
            i += 1;
        }
        out
    }
}

/// Values `from..to` of sorted `run`.
fn run_values(files: &[RunsFile], run: Run, from: u64, to: u64) -> Result<Vec<f64>> {
    let file = &files[run.file as usize];
    match run.distinct {
        0 => read_f64s(file, run.offset + from * 8, (to - from) as usize),
        _ => Ok(Counted::read(file, run)?.range(from, to)),
    }
}

/// One value in this many is kept as a run's sample: what rank queries search in memory before
/// reading one block of the run.
const SAMPLE: u64 = 256;

impl ValueRuns {
    /// Runs written to the file at `path`.
    pub fn create(path: PathBuf, file: u32) -> Result<ValueRuns> {
        let f = File::create(&path).map_err(|e| CompileError::io(&path, e))?;
        Ok(ValueRuns {
            path,
            file,
            out: Mutex::new((Sink::File(f), 0, dsc_format::checksum::Hasher::new())),
            memory: 0,
        })
    }

    /// Runs held in memory up to `memory` bytes, then moved to the file at `path` (created
    /// then).
    pub fn in_memory(path: PathBuf, file: u32, memory: u64) -> ValueRuns {
        ValueRuns {
            path,
            file,
            out: Mutex::new((
                Sink::Memory(Vec::new()),
                0,
                dsc_format::checksum::Hasher::new(),
            )),
            memory,
        }
    }

    /// Appends sorted values and their samples; returns where they lie.
    pub fn append(&self, values: &[f64]) -> Result<Run> {
        let samples = values.len().div_ceil(SAMPLE as usize);
        let mut bytes = vec![0u8; (values.len() + samples) * 8];
        let (head, tail) = bytes.split_at_mut(values.len() * 8);
        for (to, x) in head.chunks_exact_mut(8).zip(values) {
            to.copy_from_slice(&x.to_le_bytes());
        }
        for (to, x) in tail
            .chunks_exact_mut(8)
            .zip(values.iter().step_by(SAMPLE as usize))
        {
            to.copy_from_slice(&x.to_le_bytes());
        }
        self.write_run(bytes, values.len())
    }

    /// Appends `values` (finite, in any order) as a run: counted when they hold few distinct
    /// values (a time in whole units, a charge in steps of its sensor's resolution: what event
    /// data mostly holds), else sorted. Counting is one pass through a small hash table where a
    /// sort is log2(n) passes, and the counted run is written in 16 bytes per distinct value.
    /// `values` is left sorted, or as it was where it was counted.
    pub fn append_values(&self, values: &mut [f64]) -> Result<Run> {
        match count_distinct(values) {
            Some((table, counts)) => self.append_counted(&table, &counts),
            None => {
                sort_total(values);
                self.append(values)
            }
        }
    }

    /// Appends the sorted run of values that holds `table[r]` exactly `counts[r]` times for
    /// each `r` (a column read through a join, booleans, or values counted by `append_values`),
    /// as a counted run: the same answers to every query as the sorted values, in 16 bytes per
    /// distinct value instead of 8 per value.
    pub fn append_counted(&self, table: &[Option<f64>], counts: &[u64]) -> Result<Run> {
        let mut order: Vec<(u64, u64)> = table
            .iter()
            .zip(counts)
            .filter(|(_, &c)| c > 0)
            .map(|(x, &c)| (ord_key(x.expect("a counted value is finite")), c))
            .collect();
        order.sort_unstable();
        // Equal values of two joined rows are one distinct value.
        order.dedup_by(|later, first| {
            let same = later.0 == first.0;
            if same {
                first.1 += later.1;
            }
            same
        });
        let mut bytes = Vec::with_capacity(order.len() * 16);
        for &(k, _) in &order {
            bytes.extend_from_slice(&from_ord_key(k).to_le_bytes());
        }
        let mut end = 0u64;
        for &(_, c) in &order {
            end += c;
            bytes.extend_from_slice(&end.to_le_bytes());
        }
        let mut run = self.write_run(bytes, end as usize)?;
        run.distinct = order.len() as u64;
        Ok(run)
    }

    /// Appends integers (datetime donors: written, never ranked, so no samples).
    pub fn append_i64(&self, values: &[i64]) -> Result<Run> {
        let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.write_run(bytes, values.len())
    }

    /// Writes a run of `len` values (and whatever follows them in `bytes`) at the end.
    fn write_run(&self, bytes: Vec<u8>, len: usize) -> Result<Run> {
        let mut out = self.out.lock().expect("no writer panics");
        let held = out.1 + bytes.len() as u64;
        if let Sink::Memory(kept) = &mut out.0 {
            if held > self.memory {
                let mut f =
                    File::create(&self.path).map_err(|e| CompileError::io(&self.path, e))?;
                for (_, piece) in kept.iter() {
                    f.write_all(piece)
                        .map_err(|e| CompileError::io(&self.path, e))?;
                }
                out.0 = Sink::File(f);
            }
        }
        out.2.update(&bytes);
        let run = Run {
            file: self.file,
            offset: out.1,
            len: len as u64,
            distinct: 0,
        };
        out.1 += bytes.len() as u64;
        match &mut out.0 {
            Sink::File(f) => f
                .write_all(&bytes)
                .map_err(|e| CompileError::io(&self.path, e))?,
            Sink::Memory(kept) => kept.push((run.offset, bytes)),
        }
        Ok(run)
    }

    /// Makes what was written durable and opens it for reading (the bytes themselves, when they
    /// stayed in memory; nothing more can be appended then).
    pub fn finish(&self) -> Result<RunsFile> {
        let mut out = self.out.lock().expect("no writer panics");
        match &mut out.0 {
            Sink::Memory(kept) => Ok(RunsFile::Memory(std::mem::take(kept))),
            Sink::File(f) => {
                f.sync_data().map_err(|e| CompileError::io(&self.path, e))?;
                File::open(&self.path)
                    .map(RunsFile::File)
                    .map_err(|e| CompileError::io(&self.path, e))
            }
        }
    }

    /// The size and xxh3 (hex) of everything written so far.
    pub fn checksum(&self) -> (u64, String) {
        let out = self.out.lock().expect("no writer panics");
        (out.1, out.2.hex())
    }
}

fn from_ord_key(k: u64) -> f64 {
    if k >> 63 == 1 {
        f64::from_bits(k & !(1 << 63))
    } else {
        f64::from_bits(!k)
    }
}

/// Sorts doubles in IEEE total order (`-0.0` before `0.0`), as integers: the same order as
/// `f64::total_cmp`, without its bit twiddling in every comparison.
pub(crate) fn sort_total(values: &mut [f64]) {
    let mut keys: Vec<u64> = values.iter().map(|&x| ord_key(x)).collect();
    keys.sort_unstable();
    for (v, k) in values.iter_mut().zip(keys) {
        *v = from_ord_key(k);
    }
}

/// Runs shorter than this are sorted: counting them saves little.
const COUNT_MIN: usize = 4096;

/// The distinct values of `values` (finite) and how often each occurs, in no order; `None` when
/// they are more than one in 16 of the values (or 65,536), found out after at most that many
/// insertions, so that a column of mostly distinct values loses little before it is sorted.
fn count_distinct(values: &[f64]) -> Option<(Vec<Option<f64>>, Vec<u64>)> {
    if values.len() < COUNT_MIN {
        return None;
    }
    let limit = (values.len() / 16).min(1 << 16);
    // Open addressing at most half full. No finite value has the bits of `EMPTY` (a NaN).
    const EMPTY: u64 = u64::MAX;
    let bits = (2 * limit).next_power_of_two().trailing_zeros();
    let mask = (1usize << bits) - 1;
    let mut slots: Vec<(u64, u64)> = vec![(EMPTY, 0); mask + 1];
    let mut distinct = 0;
    for &x in values {
        let key = x.to_bits();
        let mut i = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize;
        loop {
            let slot = &mut slots[i];
            if slot.0 == key {
                slot.1 += 1;
                break;
            }
            if slot.0 == EMPTY {
                if distinct == limit {
                    return None;
                }
                distinct += 1;
                *slot = (key, 1);
                break;
            }
            i = (i + 1) & mask;
        }
    }
    Some(
        slots
            .into_iter()
            .filter(|s| s.0 != EMPTY)
            .map(|(key, count)| (Some(f64::from_bits(key)), count))
            .unzip(),
    )
}

/// Order-preserving map of finite doubles onto integers: rank queries compare these.
fn ord_key(x: f64) -> u64 {
    let b = x.to_bits();
    if b >> 63 == 1 {
        !b
    } else {
        b | 1 << 63
    }
}

fn read_f64s(file: &RunsFile, offset: u64, n: usize) -> Result<Vec<f64>> {
    let mut bytes = vec![0u8; n * 8];
    file.read_exact_at(&mut bytes, offset)
        .map_err(|e| CompileError::io(Path::new("values spill"), e))?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

/// Runs read as one sequence, in the order given: the `k`-th value by one positioned read. What
/// a uniform draw over a statistic's values (in any order) needs, without holding them.
pub(crate) struct Pool<'f> {
    files: &'f [RunsFile],
    runs: Vec<Run>,
    /// `ends[i]`: values in runs `..=i`.
    ends: Vec<u64>,
}

impl<'f> Pool<'f> {
    pub fn new(files: &'f [RunsFile], runs: impl Iterator<Item = Run>) -> Pool<'f> {
        let runs: Vec<Run> = runs.filter(|r| r.len > 0).collect();
        let ends = runs
            .iter()
            .scan(0, |n, r| {
                *n += r.len;
                Some(*n)
            })
            .collect();
        Pool { files, runs, ends }
    }

    pub fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// The 8 bytes of value `k` (`k < len`).
    pub fn bytes_at(&self, k: u64) -> Result<[u8; 8]> {
        let i = self.ends.partition_point(|&e| e <= k);
        let before = if i == 0 { 0 } else { self.ends[i - 1] };
        let r = self.runs[i];
        let at = k - before;
        if r.distinct > 0 {
            return Ok(run_values(self.files, r, at, at + 1)?[0].to_le_bytes());
        }
        let mut b = [0u8; 8];
        self.files[r.file as usize]
            .read_exact_at(&mut b, r.offset + at * 8)
            .map_err(|e| CompileError::io(Path::new("values spill"), e))?;
        Ok(b)
    }
}

/// The values at `ranks` (ascending, each below the runs' total) of the union of sorted
/// `runs`, by one merge of the runs read block by block: what many ranks of one statistic
/// cost, in a few blocks of memory per run, whatever the values' count.
pub(crate) fn ranks_by_merge(files: &[RunsFile], runs: &[Run], ranks: &[u64]) -> Result<Vec<f64>> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    const BLOCK: u64 = 8192;
    struct Cursor {
        run: Run,
        read: u64,
        block: Vec<f64>,
        at: usize,
    }
    impl Cursor {
        /// The next value's order key, reading the next block when this one is used up.
        fn next_key(&mut self, files: &[RunsFile]) -> Result<Option<u64>> {
            if self.at == self.block.len() {
                if self.read == self.run.len {
                    return Ok(None);
                }
                let n = BLOCK.min(self.run.len - self.read);
                self.block = run_values(files, self.run, self.read, self.read + n)?;
                self.read += n;
                self.at = 0;
            }
            self.at += 1;
            Ok(Some(ord_key(self.block[self.at - 1])))
        }
    }
    let mut cursors: Vec<Cursor> = runs
        .iter()
        .map(|&run| Cursor {
            run,
            read: 0,
            block: Vec::new(),
            at: 0,
        })
        .collect();
    let mut heap = BinaryHeap::with_capacity(cursors.len());
    for (i, c) in cursors.iter_mut().enumerate() {
        if let Some(k) = c.next_key(files)? {
            heap.push(Reverse((k, i)));
        }
    }
    let mut out = Vec::with_capacity(ranks.len());
    let mut rank = 0u64;
    while out.len() < ranks.len() {
        let Some(Reverse((key, i))) = heap.pop() else {
            return Err(CompileError::Internal(format!(
                "rank {} asked of {rank} values",
                ranks[out.len()]
            )));
        };
        while out.len() < ranks.len() && ranks[out.len()] == rank {
            out.push(from_ord_key(key));
        }
        rank += 1;
        if let Some(k) = cursors[i].next_key(files)? {
            heap.push(Reverse((k, i)));
        }
    }
    Ok(out)
}

/// One sorted run, with its samples in memory.
struct Sample<'f> {
    file: &'f RunsFile,
    offset: u64,
    len: u64,
    /// `keys[j]` is the order key of value `j · SAMPLE` (of a counted run: of distinct value
    /// `j · SAMPLE`).
    keys: Vec<u64>,
    /// A counted run's samples beyond the keys.
    counted: Option<CountedSamples>,
}

/// Of a counted run of `distinct` values: for each sampled distinct value, how many values are
/// at most it (`ends`) and below it (`below`). As much memory as a plain run's samples: the
/// rest is read when a query needs it.
struct CountedSamples {
    run: Run,
    ends: Vec<u64>,
    below: Vec<u64>,
}

impl CountedSamples {
    /// The run's keys sampled, the samples, and its candidates for rank queries: every key
    /// where they are no more than a plain run of the same values has samples (a joined
    /// column's runs share their few distinct values, so that ranks are found among them, not
    /// read between samples); else the keys that plain run's samples would be (the values at
    /// positions 0, `SAMPLE`, 2 `SAMPLE`, …), so that no more values lie between two candidates
    /// than in a plain run, however often one value repeats.
    fn read(file: &RunsFile, run: Run) -> Result<(Vec<u64>, CountedSamples, Vec<u64>)> {
        let c = Counted::read(file, run)?;
        let sampled = (0..c.keys.len()).step_by(SAMPLE as usize);
        let keys = sampled.clone().map(|i| c.keys[i]).collect();
        let ends = sampled.clone().map(|i| c.ends[i]).collect();
        let below = sampled
            .map(|i| i.checked_sub(1).map_or(0, |i| c.ends[i]))
            .collect();
        let samples = run.len.div_ceil(SAMPLE);
        let candidates = if c.keys.len() as u64 <= samples {
            c.keys
        } else {
            // Key i holds positions ends[i - 1]..ends[i]; `next` is the first sample position
            // no key taken so far holds.
            let mut taken = Vec::with_capacity(samples as usize);
            let mut next = 0;
            for (&key, &end) in c.keys.iter().zip(&c.ends) {
                if end > next {
                    taken.push(key);
                    next = end.div_ceil(SAMPLE) * SAMPLE;
                }
            }
            taken
        };
        Ok((keys, CountedSamples { run, ends, below }, candidates))
    }
}

impl Sample<'_> {
    /// Bounds on how many values are at most `t`, from the samples alone.
    fn bounds(&self, t: u64) -> (u64, u64) {
        let j = self.keys.partition_point(|&k| k <= t);
        if j == 0 {
            return (0, 0);
        }
        match &self.counted {
            // At least those up to sample j - 1, fewer than those below sample j.
            Some(c) => (c.ends[j - 1], c.below.get(j).copied().unwrap_or(self.len)),
            None => {
                let j = j as u64;
                ((j - 1) * SAMPLE + 1, (j * SAMPLE).min(self.len))
            }
        }
    }

    /// How many values are at most `t`: the samples narrow it to one block, which is read.
    fn count_le(&self, t: u64) -> Result<u64> {
        let (lo, hi) = self.bounds(t);
        if lo == hi {
            return Ok(lo);
        }
        if let Some(c) = &self.counted {
            // The distinct values from sample j - 1 to sample j, and their ends.
            let j = self.keys.partition_point(|&k| k <= t) as u64;
            let from = (j - 1) * SAMPLE;
            let n = (c.run.distinct - from).min(SAMPLE) as usize;
            let keys = read_f64s(self.file, self.offset + from * 8, n)?;
            let at = keys.partition_point(|&v| ord_key(v) <= t);
            let ends = read_f64s(self.file, self.offset + (c.run.distinct + from) * 8, at)?;
            return Ok(ends[at - 1].to_bits());
        }
        let block = read_f64s(self.file, self.offset + lo * 8, (hi - lo) as usize)?;
        Ok(lo + block.partition_point(|&v| ord_key(v) <= t) as u64)
    }

    /// The values at positions `from..to`.
    fn range(&self, from: u64, to: u64) -> Result<Vec<f64>> {
        match &self.counted {
            Some(c) => Ok(Counted::read(self.file, c.run)?.range(from, to)),
            None => read_f64s(self.file, self.offset + from * 8, (to - from) as usize),
        }
    }
}

/// Sorted runs of one statistic, read through positioned reads (never mapped, so that they do
/// not count in the compile's memory): the samples locate a rank to within a few blocks.
pub(crate) struct Sorted<'f> {
    runs: Vec<Sample<'f>>,
    pub n: u64,
    /// Sample keys of every run, ascending, distinct, at most [`POOLED`] of them: the
    /// candidates rank queries search.
    pooled: Vec<u64>,
}

/// At most this many candidate keys per statistic: about `n / POOLED` values lie between two
/// neighbours, so a billion-row column still reads only a few thousand values per rank query.
const POOLED: usize = 1 << 20;

impl<'f> Sorted<'f> {
    pub fn new(files: &'f [RunsFile], runs: impl Iterator<Item = Run>) -> Result<Sorted<'f>> {
        Self::with_candidates(files, runs, POOLED)
    }

    fn with_candidates(
        files: &'f [RunsFile],
        runs: impl Iterator<Item = Run>,
        cap: usize,
    ) -> Result<Sorted<'f>> {
        let mut pooled: Vec<u64> = Vec::new();
        let runs: Vec<Sample> = runs
            .filter(|r| r.len > 0)
            .map(|r| {
                let file = &files[r.file as usize];
                let (keys, counted) = match r.distinct {
                    0 => {
                        let samples = r.len.div_ceil(SAMPLE) as usize;
                        let keys: Vec<u64> = read_f64s(file, r.offset + r.len * 8, samples)?
                            .into_iter()
                            .map(ord_key)
                            .collect();
                        pooled.extend_from_slice(&keys);
                        (keys, None)
                    }
                    _ => {
                        let (keys, samples, every) = CountedSamples::read(file, r)?;
                        pooled.extend(every);
                        (keys, Some(samples))
                    }
                };
                // Many runs of many distinct values: their repeats go as they come, and where
                // they are still many, every other one, so that the merge holds a few times
                // `cap` keys whatever the input's size (runs of up to 65,536 distinct values
                // each, counted, would otherwise pool 16 times a plain run's samples). Any
                // candidates find the same ranks; fewer read more values between them.
                if pooled.len() > 4 * cap {
                    pooled.sort_unstable();
                    pooled.dedup();
                    if pooled.len() > 2 * cap {
                        let mut i = 0;
                        pooled.retain(|_| {
                            i += 1;
                            i % 2 == 1
                        });
                    }
                }
                Ok(Sample {
                    file,
                    offset: r.offset,
                    len: r.len,
                    keys,
                    counted,
                })
            })
            .collect::<Result<_>>()?;
        let n = runs.iter().map(|r| r.len).sum();
        pooled.sort_unstable();
        pooled.dedup();
        if pooled.len() > cap {
            let step = pooled.len().div_ceil(cap);
            pooled = pooled.into_iter().step_by(step).collect();
        }
        Ok(Sorted { runs, n, pooled })
    }

    fn count_le(&self, t: u64) -> Result<u64> {
        self.runs.iter().map(|r| r.count_le(t)).sum()
    }

    /// Values strictly below `x`.
    pub fn count_lt(&self, x: f64) -> Result<u64> {
        match ord_key(x).checked_sub(1) {
            Some(t) => self.count_le(t),
            None => Ok(0),
        }
    }

    /// Values strictly above `x`.
    pub fn count_gt(&self, x: f64) -> Result<u64> {
        Ok(self.n - self.count_le(ord_key(x))?)
    }

    /// The values binned on `bins`' edges (another statistics file's, an earlier
    /// generation's): bin 0 from −∞, the last to +∞, each from its lower edge, so that counts
    /// of two generations binned alike add up to the whole's.
    pub fn histogram_at(&self, bins: &[Bin]) -> Result<Vec<Bin>> {
        let mut below = vec![0u64];
        for b in bins.iter().skip(1) {
            below.push(self.count_lt(b.lo)?);
        }
        below.push(self.n);
        Ok(bins
            .iter()
            .enumerate()
            .map(|(i, b)| Bin {
                count: below[i + 1] - below[i],
                ..*b
            })
            .collect())
    }

    /// The `k`-th smallest value (from 0). Among the sample keys, find the smallest `hi` with
    /// more than `k` values at or below it (the samples' bounds narrow the search, exact counts
    /// finish it); the answer is `hi`'s value when fewer than `k + 1` values lie below it, else
    /// it lies strictly between `hi` and the candidate before it, a short stretch of each run,
    /// which is read. A value repeated across many rows costs nothing.
    fn kth(&self, k: u64) -> Result<f64> {
        let pooled = &self.pooled;
        let lower = |t: u64| self.runs.iter().map(|r| r.bounds(t).0).sum::<u64>();
        let upper = |t: u64| self.runs.iter().map(|r| r.bounds(t).1).sum::<u64>();
        let mut a = pooled.partition_point(|&t| upper(t) <= k);
        let mut b = pooled.partition_point(|&t| lower(t) <= k);
        while a < b {
            let m = (a + b) / 2;
            if self.count_le(pooled[m])? > k {
                b = m;
            } else {
                a = m + 1;
            }
        }
        let hi = pooled.get(a).copied();
        let lo = a.checked_sub(1).map(|i| pooled[i]);
        if let Some(hi) = hi {
            let below_hi = match hi.checked_sub(1) {
                Some(t) => self.count_le(t)?,
                None => 0,
            };
            if below_hi <= k {
                return Ok(from_ord_key(hi));
            }
        }
        let mut between = Vec::new();
        let mut below = 0;
        for r in &self.runs {
            let from = match lo {
                Some(lo) => r.count_le(lo)?,
                None => 0,
            };
            let to = match hi.and_then(|h| h.checked_sub(1)) {
                Some(t) => r.count_le(t)?,
                None if hi.is_some() => 0,
                None => r.len,
            };
            below += from;
            between.extend(r.range(from, to)?);
        }
        let at = (k - below) as usize;
        let (_, x, _) = between.select_nth_unstable_by(at, f64::total_cmp);
        Ok(*x)
    }

    fn quantiles(&self) -> Result<Vec<Quantile>> {
        linear_quantiles(self.n, |k| self.kth(k))
    }

    /// 20 equal-width bins over `[min, max]`, each counting the values from its lower edge up
    /// to (the last bin: including) its upper edge.
    fn histogram(&self, min: f64, max: f64) -> Result<Vec<Bin>> {
        const BINS: usize = 20;
        let width = (max - min) / BINS as f64;
        let edge = |i: usize| {
            if i == BINS {
                max
            } else {
                min + width * i as f64
            }
        };
        let below: Vec<u64> = (0..=BINS)
            .map(|i| {
                if i == BINS {
                    Ok(self.n)
                } else if i == 0 || width <= 0.0 {
                    Ok(0)
                } else {
                    self.count_lt(edge(i))
                }
            })
            .collect::<Result<_>>()?;
        Ok((0..BINS)
            .map(|i| Bin {
                lo: edge(i),
                hi: edge(i + 1),
                count: below[i + 1] - below[i],
            })
            .collect())
    }

    pub fn numeric(&self, m: &Moments) -> Result<Option<NumericStats>> {
        if self.n == 0 {
            return Ok(None);
        }
        Ok(Some(NumericStats {
            min: m.min,
            max: m.max,
            mean: m.mean,
            std: m.std(),
            quantiles: self.quantiles()?,
            histogram: self.histogram(m.min, m.max)?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The integer sort orders like `f64::total_cmp`: signs, zeros of both signs, infinities,
    /// subnormals and repeated values.
    #[test]
    fn sorted_as_by_total_order() {
        let mut rng = dsc_format::rng::Xoshiro256::seed_from(11);
        let specials = [
            0.0,
            -0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MIN_POSITIVE / 4.0,
        ];
        for n in [0, 3, 4095, 50_000] {
            for repeats in [false, true] {
                let mut values: Vec<f64> = (0..n)
                    .map(|i| match rng.below(10) {
                        0 => specials[i % specials.len()],
                        _ if repeats => (rng.below(7) as f64 - 3.0) * 0.5,
                        _ => (rng.unit_f64() - 0.5) * 10f64.powi(rng.below(20) as i32 - 10),
                    })
                    .collect();
                let mut want = values.clone();
                want.sort_by(f64::total_cmp);
                sort_total(&mut values);
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&values), bits(&want), "n = {n}, repeats = {repeats}");
            }
        }
    }
    use dsc_format::rng::Xoshiro256;
    use dsc_format::stats::QUANTILE_LEVELS;

    /// Counted runs (a joined column's values, counted per joined row) answer every query as
    /// the sorted runs of the same values do, beside plain runs, on disk and in memory:
    /// repeated values (in one joined row and across rows), signed zeros, rows never read.
    #[test]
    fn counted_runs_answer_as_sorted_values() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = Xoshiro256::seed_from(5);
        let table: Vec<Option<f64>> = (0..300)
            .map(|i| match i % 7 {
                0 => Some(-0.0),
                1 => Some(0.0),
                2 => Some(1.5),
                _ => Some((rng.unit_f64() - 0.5) * 1e3),
            })
            .collect();
        // Many distinct values: more than a sample interval between two samples' keys.
        let wide: Vec<Option<f64>> = (0..5000)
            .map(|i| Some(((i * 7919) % 5000) as f64 / 8.0 - 100.0))
            .collect();
        // On disk, in memory, and moved to disk part way.
        for (k, memory) in [None, Some(u64::MAX), Some(30_000)].into_iter().enumerate() {
            let path = dir.path().join(format!("c{k}"));
            let runs = match memory {
                None => ValueRuns::create(path, 0).unwrap(),
                Some(limit) => ValueRuns::in_memory(path, 0, limit),
            };
            let (mut in_order, mut written) = (Vec::new(), Vec::new());
            for (n, plain) in [
                (20_000, false),
                (1, false),
                (0, false),
                (3000, true),
                (700, false),
                (90_000, false),
            ] {
                // The first runs count few joined rows, the last many distinct values.
                let table = if n == 90_000 { &wide } else { &table };
                let mut counts = vec![0u64; table.len()];
                let mut values = Vec::new();
                for _ in 0..n {
                    let r = rng.below(table.len() as u64 / 2) as usize * 2;
                    counts[r] += 1;
                    values.push(table[r].unwrap());
                }
                sort_total(&mut values);
                written.push(match plain {
                    true => runs.append(&values).unwrap(),
                    false => runs.append_counted(table, &counts).unwrap(),
                });
                in_order.extend_from_slice(&values);
            }
            let files = vec![runs.finish().unwrap()];
            assert_eq!(
                matches!(files[0], RunsFile::File(_)),
                memory != Some(u64::MAX)
            );
            answer_as_sorted(&files, &written, &in_order);
        }
    }

    /// Every query over `written` (runs of `files`) answers as the sorted values: order
    /// statistics, quantiles and histograms with every candidate and with few, ranks by merge,
    /// and each value in run order (`in_order`, each run's values sorted).
    fn answer_as_sorted(files: &[RunsFile], written: &[Run], in_order: &[f64]) {
        let mut all = in_order.to_vec();
        sort_total(&mut all);
        // Every sampled key a candidate, and few (a rank is then read between them).
        for cap in [POOLED, 16] {
            let sorted = Sorted::with_candidates(files, written.iter().copied(), cap);
            check(&sorted.unwrap(), &all);
        }
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let n = all.len() as u64;
        let ranks: Vec<u64> = (0..n).step_by(37).chain([n - 1]).collect();
        let merged = ranks_by_merge(files, written, &ranks).unwrap();
        let want: Vec<f64> = ranks.iter().map(|&r| all[r as usize]).collect();
        assert_eq!(bits(&merged), bits(&want));
        let pool = Pool::new(files, written.iter().copied());
        assert_eq!(pool.len(), n);
        for k in (0..n).step_by(13) {
            let got = f64::from_le_bytes(pool.bytes_at(k).unwrap());
            assert_eq!(got.to_bits(), in_order[k as usize].to_bits(), "value {k}");
        }
    }

    /// `append_values` counts a bucket's values where they are few distinct ones and sorts
    /// them otherwise, and both runs answer as the sorted values: whole-unit times, charges in
    /// steps with `-0.0` and `0.0` (two values), exactly one distinct value in 16 and one more,
    /// continuous values, and a short run.
    #[test]
    fn few_distinct_values_are_counted_and_answer_as_sorted() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = Xoshiro256::seed_from(8);
        let times = (0..64_000)
            .map(|_| 6000.0 + rng.below(3001) as f64)
            .collect();
        let charges = (0..20_000)
            .map(|i| match i % 97 {
                0 => -0.0,
                1 => 0.0,
                _ => 0.05 + 0.025 * rng.below(1200) as f64,
            })
            .collect();
        let continuous = (0..20_000).map(|_| rng.unit_f64() * 1e3 - 500.0).collect();
        let cases: Vec<(&str, Vec<f64>, bool)> = vec![
            ("times", times, true),
            ("charges", charges, true),
            (
                "at the limit",
                (0..16_000).map(|i| (i % 1000) as f64).collect(),
                true,
            ),
            (
                "past it",
                (0..16_000).map(|i| (i % 1001) as f64).collect(),
                false,
            ),
            ("continuous", continuous, false),
            ("short", (0..100).map(|i| (i % 3) as f64).collect(), false),
        ];
        for memory in [None, Some(u64::MAX)] {
            let path = dir.path().join(format!("v{memory:?}"));
            let runs = match memory {
                None => ValueRuns::create(path, 0).unwrap(),
                Some(limit) => ValueRuns::in_memory(path, 0, limit),
            };
            let (mut in_order, mut written) = (Vec::new(), Vec::new());
            for (what, values, counted) in &cases {
                let mut values = values.clone();
                let run = runs.append_values(&mut values).unwrap();
                assert_eq!(run.distinct > 0, *counted, "{what}");
                sort_total(&mut values);
                in_order.extend_from_slice(&values);
                written.push(run);
            }
            answer_as_sorted(&[runs.finish().unwrap()], &written, &in_order);
        }
    }

    /// Runs on disk, held in memory, and moved from memory to disk part way give the ranks of
    /// a full sort.
    #[test]
    fn ranks_by_merge_equal_a_full_sort() {
        let dir = tempfile::tempdir().unwrap();
        for (k, memory) in [None, Some(u64::MAX), Some(100_000)]
            .into_iter()
            .enumerate()
        {
            let path = dir.path().join(format!("v{k}"));
            let runs = match memory {
                None => ValueRuns::create(path.clone(), 0).unwrap(),
                Some(limit) => ValueRuns::in_memory(path.clone(), 0, limit),
            };
            let mut rng = dsc_format::rng::Xoshiro256::for_stream(9, 0);
            let mut all = Vec::new();
            let mut written = Vec::new();
            // Runs of every size around the block, with repeated values and signed zeros.
            for len in [0usize, 1, 3, 8191, 8192, 8193, 20_000] {
                let mut v: Vec<f64> = (0..len)
                    .map(|_| match rng.below(10) {
                        0 => -0.0,
                        1 => 0.0,
                        2 => 7.5,
                        _ => (rng.below(1 << 20) as f64 - 5e5) / 3.0,
                    })
                    .collect();
                sort_total(&mut v);
                all.extend_from_slice(&v);
                written.push(runs.append(&v).unwrap());
            }
            let files = vec![runs.finish().unwrap()];
            let on_disk = matches!(files[0], RunsFile::File(_));
            assert_eq!(on_disk, memory != Some(u64::MAX), "{memory:?}");
            assert_eq!(path.exists(), on_disk, "{memory:?}");
            sort_total(&mut all);
            let n = all.len() as u64;
            let ranks: Vec<u64> = (0..1001).map(|i| (n - 1) * i / 1000).collect();
            let got = ranks_by_merge(&files, &written, &ranks).unwrap();
            for (r, g) in ranks.iter().zip(&got) {
                assert_eq!(
                    g.to_bits(),
                    all[*r as usize].to_bits(),
                    "rank {r}, {memory:?}"
                );
            }
        }
    }

    /// Runs of sorted values written through `ValueRuns`, read back by rank queries: every
    /// order statistic and every bin count equals a full sort's, with spikes (one value in most
    /// rows), signed zeros and runs of every size around the sample interval.
    #[test]
    fn rank_queries_over_runs_equal_a_full_sort() {
        let dir = tempfile::tempdir().unwrap();
        let runs = ValueRuns::create(dir.path().join("v"), 0).unwrap();
        let mut rng = Xoshiro256::seed_from(11);
        let mut all = Vec::new();
        let mut refs = Vec::new();
        for (r, len) in [0usize, 1, 255, 256, 257, 5000, 70_000, 3]
            .into_iter()
            .enumerate()
        {
            let mut values: Vec<f64> = (0..len)
                .map(|_| match rng.below(10) {
                    0..=5 if r % 2 == 1 => 7.0,
                    6 => -0.0,
                    7 => 0.0,
                    _ => (rng.unit_f64() - 0.3) * 1e3,
                })
                .collect();
            values.sort_unstable_by(f64::total_cmp);
            all.extend_from_slice(&values);
            refs.push(runs.append(&values).unwrap());
        }
        let files = [runs.finish().unwrap()];
        all.sort_unstable_by(f64::total_cmp);
        // Every candidate sample, and few (as for a billion rows): the same answers.
        for cap in [POOLED, 16] {
            check(
                &Sorted::with_candidates(&files, refs.iter().copied(), cap).unwrap(),
                &all,
            );
        }
    }

    fn check(sorted: &Sorted, all: &[f64]) {
        assert_eq!(sorted.n, all.len() as u64);
        for k in (0..all.len()).step_by(997).chain([0, all.len() - 1]) {
            assert_eq!(
                sorted.kth(k as u64).unwrap().to_bits(),
                all[k].to_bits(),
                "k = {k}"
            );
        }
        let want = crate::stats::quantiles(&mut all.to_vec(), &QUANTILE_LEVELS);
        assert_eq!(sorted.quantiles().unwrap(), want);
        let (min, max) = (all[0], all[all.len() - 1]);
        for b in sorted.histogram(min, max).unwrap() {
            let count = all
                .iter()
                .filter(|&&x| x >= b.lo && (x < b.hi || (b.hi == max && x <= max)))
                .count() as u64;
            assert_eq!(b.count, count, "{b:?}");
        }
    }
}
