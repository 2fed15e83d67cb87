//! The loader: one epoch of one split for one rank, as an iterator of batches, prefetched on
//! background threads, with a resume state of a few numbers.

use crate::batch::{Batch, BatchTensor, Pool};
use crate::body::{Body, ShardBytes};
use crate::cache::{Cache, Inner, Shard};
use crate::error::LoadError;
use crate::handoff::{handoff, Empty, Receiver};
use crate::mmap::Mapped;
use crate::order::{EpochOrder, Sample, Steps, DEFAULT_INTERLEAVE, DEFAULT_WINDOW};
use crate::rows;
use dsc_format::spec::format_size;
use dsc_format::{TensorRole, TensorSpec};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What to load. Every field has a documented default (`LoaderOptions::default()`).
#[derive(Debug, Clone, PartialEq)]
pub struct LoaderOptions {
    /// Split to read [default: `train`].
    pub split: String,
    /// Contexts per batch per rank [default: 256].
    pub batch_size: usize,
    /// Shuffle the epoch (window shuffle) [default: true].
    pub shuffle: bool,
    /// Seed of the epoch order [default: 0].
    pub seed: u64,
    /// Epoch number: each epoch has its own order [default: 0].
    pub epoch: u64,
    /// This process's rank [default: 0].
    pub rank: usize,
    /// Number of ranks [default: 1].
    pub world_size: usize,
    /// Drop the last partial global batch; otherwise complete it by repeating the epoch's first
    /// contexts [default: true].
    pub drop_last: bool,
    /// Batches prepared ahead per thread [default: 4].
    pub prefetch: usize,
    /// Background threads preparing batches; 0 prepares them in the caller's thread
    /// [default: 1]. An uncompressed split kept resident (one that fits a quarter of memory) runs
    /// at most one thread per core the process may use: its gather never waits on the disk,
    /// so further threads only take turns on the same cores (3 threads on 2 cores gathered
    /// a fifth slower than 2). [`Loader::threads`] says how many run.
    pub threads: usize,
    /// Cut sequence tensors to the longest stored length in the batch [default: false].
    pub trim: bool,
    /// Contexts permuted together in a shuffled epoch; resident memory is about
    /// `3 * window * bytes per context` (the window read, the one before, the one ahead)
    /// [default: 4096].
    pub window: usize,
    /// Shards read side by side, so that each window mixes this many shards [default: 8].
    pub interleave: usize,
    /// Length-bucketed batches: inside each window, contexts of similar stored length form a
    /// global batch, the batches come in random order, and each is trimmed to its longest
    /// sequence (implies `trim`). The window is rounded up to a multiple of the global batch.
    /// Still one pass over every context, exact resume and equal batches per rank
    /// [default: false].
    pub bucket: bool,
    /// The tensors to load, by name, in manifest order whatever the order given; empty loads
    /// every tensor [default: empty]. Leaving out tensors the model does not read saves their
    /// gather.
    pub columns: Vec<String>,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions {
            split: "train".into(),
            batch_size: 256,
            shuffle: true,
            seed: 0,
            epoch: 0,
            rank: 0,
            world_size: 1,
            drop_last: true,
            prefetch: 4,
            threads: 1,
            trim: false,
            window: DEFAULT_WINDOW,
            interleave: DEFAULT_INTERLEAVE,
            bucket: false,
            columns: Vec::new(),
        }
    }
}

impl LoaderOptions {
    /// `batch_size * world_size`, or an error where that product overflows.
    fn global_batch(&self) -> Result<usize, LoadError> {
        self.batch_size.checked_mul(self.world_size).ok_or_else(|| {
            LoadError::Options(format!(
                "batch_size {} x world_size {}: the global batch overflows",
                self.batch_size, self.world_size
            ))
        })
    }
}

/// Where a loader stands: enough to continue exactly, on any number of ranks with the same
/// global batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// The split.
    pub split: String,
    /// The epoch.
    pub epoch: u64,
    /// Contexts of the epoch consumed by all ranks together (a multiple of `global_batch`).
    pub samples: usize,
    /// The order seed.
    pub seed: u64,
    /// Whether the epoch is shuffled.
    pub shuffle: bool,
    /// The shuffle window.
    pub window: usize,
    /// Shards read side by side.
    pub interleave: usize,
    /// Whether the last partial global batch is dropped.
    pub drop_last: bool,
    /// `batch_size * world_size` of the run.
    pub global_batch: usize,
    /// Whether batches are length-bucketed (absent in states from before bucketing: false).
    #[serde(default)]
    pub bucket: bool,
}

impl State {
    pub(crate) fn check(&self, opts: &LoaderOptions) -> Result<(), LoadError> {
        let global = opts.global_batch()?;
        if opts.split != self.split {
            return Err(LoadError::State(format!(
                "the state is for split {:?}, the options ask for {:?}",
                self.split, opts.split
            )));
        }
        if global != self.global_batch {
            return Err(LoadError::State(format!(
                "the state's global batch is {}, the options give {} ({} x {} ranks); keep batch_size x world_size fixed",
                self.global_batch, global, opts.batch_size, opts.world_size
            )));
        }
        if !self.samples.is_multiple_of(global.max(1)) {
            return Err(LoadError::State(format!(
                "{} samples consumed is not a whole number of global batches of {global}",
                self.samples
            )));
        }
        Ok(())
    }
}

/// Everything a batch is built from; shared by the loader's threads.
#[derive(Debug)]
struct Plan {
    cache: Arc<Inner>,
    split_index: usize,
    order: EpochOrder,
    steps: Steps,
    rank: usize,
    trim: bool,
    /// Each loaded tensor's index among the manifest's (and so among a shard's tensors), in
    /// manifest order. The specs stay in the manifest: a categorical column's vocabulary can
    /// be hundreds of KB, and a loader is built every epoch.
    slots: Vec<usize>,
    /// The manifest index of `length`, read for trimming whether or not it is loaded.
    length_index: usize,
    pool: Arc<Pool>,
    /// Whether the split's shards are compressed (decompressed on use, not mapped).
    cold: bool,
    /// Whether the split's pages stay in the process's page tables between windows and epochs
    /// (the split fits [`resident_budget`]) instead of being released behind the reader.
    keep_resident: bool,
}

/// The most loader threads and prefetched batches per thread a loader accepts: far beyond any
/// use, and small enough that the thread and buffer counts never overflow.
const MAX_THREADS: usize = 1024;
const MAX_PREFETCH: usize = 1 << 16;

/// Mapped bytes of a split up to which its pages are kept resident: a quarter of the memory
/// this process may use (the machine's, or its cgroup's limit when lower). Releasing pages
/// behind the reader (`MADV_DONTNEED`) bounds the resident set, but costs a page-table
/// teardown, a TLB shootdown and a fault for every page on every epoch: measured on the 344 MB
/// loader benchmark cache, keeping it resident and hinting each tensor of a shard once raises
/// the shuffled rate about 1.7x (docs/PERFORMANCE.md). The pages are clean page-cache pages either way, which the
/// kernel can reclaim under pressure; only the reported RSS differs.
fn resident_budget() -> usize {
    memory_limit() / 4
}

/// The memory this process may use (the machine's, or its container's limit when lower).
fn memory_limit() -> usize {
    usize::try_from(dsc_format::system::memory_limit()).unwrap_or(usize::MAX)
}

impl Plan {
    fn shards(&self) -> &[Shard] {
        &self.cache.splits[self.split_index].1
    }

    /// The spec of loaded tensor `t`.
    fn spec(&self, t: usize) -> &TensorSpec {
        &self.cache.manifest.tensors()[self.slots[t]]
    }

    /// The loaded tensors' specs, in manifest order.
    fn specs(&self) -> impl ExactSizeIterator<Item = &TensorSpec> {
        self.loaded().map(|(_, spec)| spec)
    }

    /// The loaded tensors as (manifest index, spec), in manifest order.
    fn loaded(&self) -> impl ExactSizeIterator<Item = (usize, &TensorSpec)> {
        let all = self.cache.manifest.tensors();
        self.slots.iter().map(move |&i| (i, &all[i]))
    }

    fn samples(&self, step: usize, cache: &mut (usize, Vec<u32>)) -> Vec<Sample> {
        self.steps
            .positions(step, self.rank)
            .map(|p| self.order.sample_at(p, cache))
            .collect()
    }

    /// The bytes of the shards of a compressed cache that `samples` lie in (nothing for a hot
    /// cache, whose maps are read directly), held for one batch.
    fn resolve(&self, samples: &[Sample]) -> Result<Resolved<'_>, LoadError> {
        let mut held: Vec<(usize, ShardBytes<'_>)> = Vec::new();
        for s in samples {
            if matches!(self.shards()[s.shard].body, Body::Cold(_))
                && !held.iter().any(|(k, _)| *k == s.shard)
            {
                held.push((s.shard, self.cache.shard_bytes(self.split_index, s.shard)?));
            }
        }
        Ok(Resolved(held))
    }

    /// The bytes of shard `shard`: its map, or (compressed) its bytes in `held`.
    fn shard_bytes<'a>(&'a self, shard: usize, held: &'a Resolved<'a>) -> &'a [u8] {
        match &self.shards()[shard].body {
            Body::Mapped(map) => map.bytes(),
            Body::Cold(_) => held.get(shard),
        }
    }

    /// The bytes of sample `s` of the manifest's tensor `slot`.
    fn sample_bytes<'a>(&'a self, s: &Sample, slot: usize, held: &'a Resolved<'a>) -> &'a [u8] {
        let size = self.cache.manifest.tensors()[slot].sample_bytes();
        let start = self.shards()[s.shard].tensor_starts[slot] + s.offset * size;
        &self.shard_bytes(s.shard, held)[start..start + size]
    }

    fn stored_length(&self, s: &Sample, held: &Resolved<'_>) -> usize {
        let b = self.sample_bytes(s, self.length_index, held);
        i32::from_le_bytes(b.try_into().expect("4 bytes")).max(0) as usize
    }

    /// The trimmed sequence length of a batch: its longest stored length, at least 1.
    fn seq_len(&self, samples: &[Sample], held: &Resolved<'_>) -> usize {
        let max_len = self.cache.manifest.max_len();
        if !self.trim {
            return max_len;
        }
        samples
            .iter()
            .map(|s| self.stored_length(s, held))
            .max()
            .unwrap_or(0)
            .clamp(1, max_len)
    }

    fn shape(&self, t: usize, n: usize, seq_len: usize) -> Vec<usize> {
        let spec = self.spec(t);
        let mut shape = vec![n];
        shape.extend_from_slice(&spec.sample_shape);
        if is_sequence(spec) {
            shape[1] = seq_len;
        }
        shape
    }

    /// Bytes of one sample of tensor `t` after trimming.
    fn copy_bytes(&self, t: usize, seq_len: usize) -> usize {
        let spec = self.spec(t);
        if is_sequence(spec) {
            spec.sample_bytes() / self.cache.manifest.max_len().max(1) * seq_len
        } else {
            spec.sample_bytes()
        }
    }

    /// Copies the batch of `samples` into `dst` (one slice per tensor, each at least the
    /// batch's bytes); returns the sequence length used.
    fn gather_into(&self, samples: &[Sample], dst: &mut [&mut [u8]]) -> Result<usize, LoadError> {
        let held = self.resolve(samples)?;
        let seq_len = self.seq_len(samples, &held);
        self.gather(samples, &held, seq_len, dst);
        Ok(seq_len)
    }

    /// Copies `samples`, cut to `seq_len`, from their shards (`held`: the compressed ones)
    /// into `dst`.
    fn gather(
        &self,
        samples: &[Sample],
        held: &Resolved<'_>,
        seq_len: usize,
        dst: &mut [&mut [u8]],
    ) {
        // Everything but the copies is looked up once per batch or tensor: at a few dozen
        // nanoseconds per sample and tensor, the lookups cost a sixth of the gather.
        let shards = self.shards();
        let bodies: Vec<&[u8]> = samples
            .iter()
            .map(|s| self.shard_bytes(s.shard, held))
            .collect();
        for (t, out) in dst.iter_mut().enumerate() {
            let n = self.copy_bytes(t, seq_len);
            if n == 0 {
                continue;
            }
            let slot = self.slots[t];
            let size = self.spec(t).sample_bytes();
            let count = samples.len();
            rows::gather(&mut out[..count * n], n, count, |i| {
                let start = shards[samples[i].shard].tensor_starts[slot] + samples[i].offset * size;
                &bodies[i][start..start + n]
            });
        }
    }

    fn build(&self, step: usize, cache: &mut (usize, Vec<u32>)) -> Result<Batch, LoadError> {
        let samples = self.samples(step, cache);
        let n = samples.len();
        let contiguous = samples
            .windows(2)
            .all(|w| w[1].shard == w[0].shard && w[1].offset == w[0].offset + 1);
        if !self.trim && contiguous && n > 0 {
            // A view: of the map of a hot shard, of the decompressed bytes of a cold one.
            let first = samples[0];
            let shard = &self.shards()[first.shard];
            let cold = match &shard.body {
                Body::Cold(_) => Some(self.cache.shard_bytes(self.split_index, first.shard)?),
                Body::Mapped(_) => None,
            };
            let tensors = self
                .specs()
                .enumerate()
                .map(|(t, spec)| {
                    let size = spec.sample_bytes();
                    let start = shard.tensor_starts[self.slots[t]] + first.offset * size;
                    let shape = self.shape(t, n, self.cache.manifest.max_len());
                    match &cold {
                        Some(ShardBytes::Cold(bytes)) => {
                            BatchTensor::shared(spec, shape, bytes.clone(), start, n * size)
                        }
                        _ => BatchTensor::mapped(
                            spec,
                            shape,
                            self.cache.clone(),
                            (self.split_index, first.shard, start, n * size),
                        ),
                    }
                })
                .collect();
            return Ok(Batch {
                step,
                size: n,
                seq_len: self.cache.manifest.max_len(),
                tensors,
            });
        }
        let held = self.resolve(&samples)?;
        let seq_len = self.seq_len(&samples, &held);
        let lens: Vec<usize> = (0..self.slots.len())
            .map(|t| n * self.copy_bytes(t, seq_len))
            .collect();
        let mut bufs: Vec<Vec<u8>> = lens.iter().map(|&len| self.pool.take(len)).collect();
        let mut slices: Vec<&mut [u8]> = bufs
            .iter_mut()
            .zip(&lens)
            .map(|(b, &len)| &mut b[..len])
            .collect();
        self.gather(&samples, &held, seq_len, &mut slices);
        drop(held);
        let tensors = bufs
            .into_iter()
            .zip(lens)
            .enumerate()
            .map(|(t, (buf, len))| {
                BatchTensor::owned(
                    self.spec(t),
                    self.shape(t, n, seq_len),
                    buf,
                    len,
                    self.pool.clone(),
                )
            })
            .collect();
        Ok(Batch {
            step,
            size: n,
            seq_len,
            tensors,
        })
    }

    /// Page-cache hints for the window after `w` (read ahead) and the one before `w - 1`
    /// (release from this process's resident set).
    fn advise(&self, w: usize) {
        let window = self.order.window();
        let total = self.order.len();
        let ahead = ((w + 1) * window).min(total)..((w + 2) * window).min(total);
        if self.cold {
            // Decompress the next window's shards here, off the gathering threads; a failure
            // is reported by the gather that needs the shard.
            for (shard, _, _) in self.order.spans(ahead) {
                let _ = self.cache.shard_bytes(self.split_index, shard);
            }
            return;
        }
        if self.keep_resident {
            // Fault each loaded tensor of a shard in once, whole, ahead of its first use; it
            // then stays mapped.
            for (shard, _, _) in self.order.spans(ahead) {
                let shard = &self.shards()[shard];
                let Body::Mapped(map) = &shard.body else {
                    continue;
                };
                for (slot, spec) in self.loaded() {
                    if !shard.populated[slot].swap(true, Ordering::Relaxed) {
                        let len = spec.sample_bytes() * shard.entry.contexts;
                        map.will_need(shard.tensor_starts[slot], len);
                    }
                }
            }
            return;
        }
        self.for_spans(ahead, |map, start, len| map.will_need(start, len));
        if w >= 2 {
            let behind = (w - 2) * window..(w - 1) * window;
            self.for_spans(behind, |map, start, len| map.release(start, len));
        }
    }

    /// Calls `f` with the map and byte range of every loaded tensor of the hot shards in
    /// `virtual_range`.
    fn for_spans(&self, virtual_range: std::ops::Range<usize>, f: impl Fn(&Mapped, usize, usize)) {
        for (shard, lo, hi) in self.order.spans(virtual_range) {
            let shard = &self.shards()[shard];
            let Body::Mapped(map) = &shard.body else {
                continue;
            };
            for (slot, spec) in self.loaded() {
                let size = spec.sample_bytes();
                f(map, shard.tensor_starts[slot] + lo * size, (hi - lo) * size);
            }
        }
    }
}

/// The bytes of the compressed shards one batch reads, held while it is gathered.
struct Resolved<'a>(Vec<(usize, ShardBytes<'a>)>);

impl Resolved<'_> {
    fn get(&self, shard: usize) -> &[u8] {
        &self
            .0
            .iter()
            .find(|(k, _)| *k == shard)
            .expect("resolved before the gather")
            .1
    }
}

fn is_sequence(spec: &TensorSpec) -> bool {
    matches!(spec.role, TensorRole::Features | TensorRole::Categorical)
}

/// A batch a loader thread prepared, or why it could not (a compressed shard that does not
/// decompress).
type Built = Result<Batch, LoadError>;

/// Batches of one epoch of one split for one rank. Iterate it; take [`Loader::state`] at any
/// point to resume later with [`Cache::loader_from_state`].
#[derive(Debug)]
pub struct Loader {
    opts: LoaderOptions,
    /// Background threads started (`opts.threads`, or fewer: see [`LoaderOptions::threads`]).
    threads: usize,
    first_step: usize,
    next_step: usize,
    workers: Vec<(Receiver<Built>, JoinHandle<()>)>,
    /// Page-cache hints run on their own thread so that populating the next window never
    /// stalls the consumer.
    advisor: Option<JoinHandle<()>>,
    hints: Arc<Hints>,
    window_cache: (usize, Vec<u32>),
    /// Poll for batches before sleeping: the loader threads leave this thread a core.
    poll: bool,
}

/// The page-cache hints of one loader, shared with its [`Filler`]s.
#[derive(Debug)]
struct Hints {
    plan: Arc<Plan>,
    /// The advisor thread's queue; `None` once the loader is dropped (or when there is no
    /// thread: hints are then given in the caller's thread).
    tx: Mutex<Option<SyncSender<usize>>>,
    /// The last window hinted, `usize::MAX` for none.
    advised: AtomicUsize,
}

impl Hints {
    /// Advises the kernel once per window: read the next window ahead, release the one before
    /// last from the resident set.
    fn hint(&self, step: usize, rank: usize) {
        let p = self.plan.steps.positions(step, rank).next().unwrap_or(0);
        let w = p / self.plan.order.window();
        if self.advised.swap(w, Ordering::Relaxed) != w {
            match &*self.tx.lock().unwrap_or_else(|p| p.into_inner()) {
                // A full queue means the advisor is behind: skipping a hint is harmless.
                Some(tx) => match tx.try_send(w) {
                    Ok(()) | Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
                },
                None => self.plan.advise(w),
            }
        }
    }
}

/// Fills any batch of a loader's epoch into the caller's buffers, from any thread: for callers
/// that gather several batches at once into memory of their own (pinned buffers) and order
/// them themselves. Get one with [`Loader::filler`]; report consumed batches with
/// [`Loader::advance`].
#[derive(Debug, Clone)]
pub struct Filler {
    hints: Arc<Hints>,
    rank: usize,
    batch_bytes: Vec<usize>,
}

impl Filler {
    /// Copies batch `step` of the epoch into `dst` (one slice per loaded tensor, in manifest
    /// order, each at least the loader's `batch_bytes`) with one copy from the mapped shards;
    /// returns the batch's sequence length.
    pub fn fill(&self, step: usize, dst: &mut [&mut [u8]]) -> Result<usize, LoadError> {
        let plan = &self.hints.plan;
        if step >= plan.steps.steps {
            return Err(LoadError::Options(format!(
                "step {step} of an epoch of {} steps",
                plan.steps.steps
            )));
        }
        check_buffers(dst, &self.batch_bytes)?;
        let samples = plan.samples(step, &mut (usize::MAX, Vec::new()));
        self.hints.hint(step, self.rank);
        plan.gather_into(&samples, dst)
    }
}

fn check_buffers(dst: &[&mut [u8]], need: &[usize]) -> Result<(), LoadError> {
    if dst.len() != need.len() {
        return Err(LoadError::Options(format!(
            "{} buffers for {} tensors",
            dst.len(),
            need.len()
        )));
    }
    for (d, &need) in dst.iter().zip(need) {
        if d.len() < need {
            return Err(LoadError::Options(format!(
                "a buffer of {} bytes for a tensor of {need}",
                d.len()
            )));
        }
    }
    Ok(())
}

impl Loader {
    pub(crate) fn new(
        cache: Cache,
        opts: LoaderOptions,
        first_step: usize,
    ) -> Result<Loader, LoadError> {
        let inner = cache.inner.clone();
        let Some(split_index) = inner.splits.iter().position(|(n, _)| *n == opts.split) else {
            let names: Vec<&str> = inner.splits.iter().map(|(n, _)| n.as_str()).collect();
            return Err(LoadError::Options(format!(
                "{}: no split {:?} (splits: {names:?})",
                inner.dir.display(),
                opts.split
            )));
        };
        if opts.batch_size == 0 || opts.world_size == 0 || opts.rank >= opts.world_size {
            return Err(LoadError::Options(format!(
                "batch_size {} / rank {} / world_size {}: need batch_size >= 1 and rank < world_size",
                opts.batch_size, opts.rank, opts.world_size
            )));
        }
        if opts.threads > MAX_THREADS || opts.prefetch > MAX_PREFETCH {
            return Err(LoadError::Options(format!(
                "threads {} / prefetch {}: at most {MAX_THREADS} threads and {MAX_PREFETCH} batches ahead",
                opts.threads, opts.prefetch
            )));
        }
        // A batch is allocated whole (its tensors, and its list of samples): refuse sizes this
        // machine cannot hold before multiplying them into an overflow or an allocation that
        // aborts the process.
        let per_context = inner.manifest.bytes_per_context() + std::mem::size_of::<Sample>();
        let batch_bytes = per_context.checked_mul(opts.batch_size);
        opts.global_batch()?;
        if batch_bytes.is_none_or(|b| b > memory_limit() / 2) {
            return Err(LoadError::Options(format!(
                "batch_size {}: one batch of this cache ({per_context} bytes per context) needs \
                 {}, more than half of this machine's memory ({}); use a smaller batch_size",
                opts.batch_size,
                batch_bytes.map_or("more than 16 EiB".into(), |b| format_size(b as u64)),
                format_size(memory_limit() as u64)
            )));
        }
        let sizes: Vec<usize> = inner.splits[split_index]
            .1
            .iter()
            .map(|s| s.entry.contexts)
            .collect();
        let cold = inner.splits[split_index]
            .1
            .iter()
            .any(|s| matches!(s.body, Body::Cold(_)));
        let split_bytes: u64 = inner.splits[split_index]
            .1
            .iter()
            .map(|s| s.entry.bytes)
            .sum();
        let mut order = EpochOrder::new(
            &sizes,
            opts.shuffle,
            opts.seed,
            opts.epoch,
            opts.window,
            opts.interleave,
        );
        if opts.bucket {
            order = order.bucketed(cache.lengths(&opts.split)?, opts.global_batch()?);
        }
        if cold {
            // The shards of the window being read and of the next one stay decompressed.
            inner.resident.at_least(order.shards_in_reach());
        }
        let steps = Steps::new(
            order.len(),
            opts.batch_size,
            opts.world_size,
            opts.drop_last,
        );
        let all = &inner.manifest.tensors();
        if let Some(unknown) = opts
            .columns
            .iter()
            .find(|c| !all.iter().any(|t| &t.name == *c))
        {
            let names: Vec<&str> = all.iter().map(|t| t.name.as_str()).collect();
            return Err(LoadError::Options(format!(
                "{}: no tensor {unknown:?} to load (tensors: {names:?})",
                inner.dir.display()
            )));
        }
        let slots: Vec<usize> = (0..all.len())
            .filter(|&i| opts.columns.is_empty() || opts.columns.contains(&all[i].name))
            .collect();
        let keep_resident = split_bytes <= resident_budget() as u64;
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let threads = if keep_resident && !cold {
            // Hot and resident: the gather never waits on a read (LoaderOptions::threads).
            opts.threads.min(cores)
        } else {
            opts.threads
        };
        let length_index = all
            .iter()
            .position(|t| t.role == TensorRole::Length)
            .expect("validated manifest has length");
        let loaded_per_context: usize = slots.iter().map(|&i| all[i].sample_bytes()).sum();
        let plan = Arc::new(Plan {
            cache: inner,
            split_index,
            order,
            steps,
            rank: opts.rank,
            trim: opts.trim || opts.bucket,
            pool: {
                // What this loader can have in flight: each thread's queue and the batch it
                // builds, and the consumer's.
                let pool = cache.inner.pool.for_this_process();
                pool.keep_at_least(
                    (opts.prefetch + 2)
                        .saturating_mul(threads + 1)
                        .saturating_mul(loaded_per_context)
                        .saturating_mul(opts.batch_size),
                );
                pool
            },
            slots,
            length_index,
            keep_resident,
            cold,
        });
        let first_step = first_step.min(steps.steps);
        let poll = threads > 0 && threads < cores;
        let mut loader = Loader {
            opts,
            threads,
            first_step,
            next_step: first_step,
            workers: Vec::new(),
            advisor: None,
            hints: Arc::new(Hints {
                plan,
                tx: Mutex::new(None),
                advised: AtomicUsize::new(usize::MAX),
            }),
            window_cache: (usize::MAX, Vec::new()),
            poll,
        };
        loader.spawn()?;
        Ok(loader)
    }

    /// Starts the advisor and the prefetch threads. On failure (a thread limit) the threads
    /// already started stop when the loader is dropped.
    fn spawn(&mut self) -> Result<(), LoadError> {
        let (tx, rx) = sync_channel::<usize>(4);
        let plan = self.hints.plan.clone();
        let handle = std::thread::Builder::new()
            .name("dsc-loader-advice".into())
            .spawn(move || {
                for w in rx {
                    plan.advise(w);
                }
            })
            .map_err(LoadError::Threads)?;
        self.advisor = Some(handle);
        *self.hints.tx.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        let threads = self.threads;
        for k in 0..threads {
            let (tx, rx) = handoff::<Built>(self.opts.prefetch.max(1));
            let plan = self.hints.plan.clone();
            let (first, total) = (self.first_step, self.hints.plan.steps.steps);
            let handle = std::thread::Builder::new()
                .name(format!("dsc-loader-{k}"))
                .spawn(move || {
                    let mut cache = (usize::MAX, Vec::new());
                    let mut step = first + k;
                    while step < total {
                        if tx.send(plan.build(step, &mut cache)).is_err() {
                            return; // the loader was dropped
                        }
                        step += threads;
                    }
                })
                .map_err(LoadError::Threads)?;
            self.workers.push((rx, handle));
        }
        Ok(())
    }

    /// Background threads preparing batches: the `threads` asked for, or one per core for a
    /// hot split kept resident ([`LoaderOptions::threads`]).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Steps (batches per rank) in this epoch.
    pub fn steps(&self) -> usize {
        self.hints.plan.steps.steps
    }

    /// The order of this epoch.
    pub fn order(&self) -> &EpochOrder {
        &self.hints.plan.order
    }

    /// What padding costs in this epoch's batches, every rank's ([`crate::order::padding`]),
    /// from the split's stored lengths.
    pub fn padding(&self) -> Result<crate::order::Padding, LoadError> {
        let plan = &self.hints.plan;
        let cache = Cache {
            inner: plan.cache.clone(),
        };
        let lengths = cache.lengths(&self.opts.split)?;
        Ok(crate::order::padding(
            &plan.order,
            &plan.steps,
            &lengths,
            plan.cache.manifest.max_len(),
        ))
    }

    /// The tensors each batch holds (the `columns` asked for, in manifest order).
    pub fn tensor_specs(&self) -> impl ExactSizeIterator<Item = &TensorSpec> {
        self.hints.plan.specs()
    }

    /// The options in force.
    pub fn options(&self) -> &LoaderOptions {
        &self.opts
    }

    /// The state after the batches yielded so far.
    pub fn state(&self) -> State {
        State {
            split: self.opts.split.clone(),
            epoch: self.opts.epoch,
            samples: self.next_step * self.opts.batch_size * self.opts.world_size,
            seed: self.opts.seed,
            shuffle: self.opts.shuffle,
            window: self.opts.window,
            interleave: self.opts.interleave,
            drop_last: self.opts.drop_last,
            global_batch: self.opts.batch_size * self.opts.world_size,
            bucket: self.opts.bucket,
        }
    }

    /// Bytes of one untrimmed batch per tensor, for callers that supply their own buffers.
    pub fn batch_bytes(&self) -> Vec<usize> {
        self.hints
            .plan
            .specs()
            .map(|t| t.sample_bytes() * self.opts.batch_size)
            .collect()
    }

    /// Copies the next batch into the caller's buffers (one slice per loaded tensor, in manifest
    /// order, each at least [`Loader::batch_bytes`]) with exactly one copy from the mapped
    /// shards, in the calling thread; returns the batch's sequence length, or `None` at the end
    /// of the epoch. Use with `threads: 0` (background threads would prepare batches that this
    /// call does not use).
    pub fn next_into(&mut self, dst: &mut [&mut [u8]]) -> Result<Option<usize>, LoadError> {
        if self.next_step >= self.hints.plan.steps.steps {
            return Ok(None);
        }
        check_buffers(dst, &self.batch_bytes())?;
        let samples = self
            .hints
            .plan
            .samples(self.next_step, &mut self.window_cache);
        self.hints.hint(self.next_step, self.opts.rank);
        let seq_len = self.hints.plan.gather_into(&samples, dst)?;
        self.next_step += 1;
        Ok(Some(seq_len))
    }

    /// A [`Filler`] for this epoch: gathers any step into the caller's buffers from any thread.
    /// Use with `threads: 0`.
    pub fn filler(&self) -> Filler {
        Filler {
            hints: self.hints.clone(),
            rank: self.opts.rank,
            batch_bytes: self.batch_bytes(),
        }
    }

    /// Marks `n` more batches as consumed (after [`Filler::fill`]), so that [`Loader::state`]
    /// counts them; stops at the end of the epoch.
    pub fn advance(&mut self, n: usize) {
        self.next_step = (self.next_step + n).min(self.hints.plan.steps.steps);
    }

    /// The step the next batch belongs to.
    pub fn next_step(&self) -> usize {
        self.next_step
    }
}

impl Iterator for Loader {
    type Item = Result<Batch, LoadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next_step >= self.hints.plan.steps.steps {
            return None;
        }
        let batch = if self.workers.is_empty() {
            self.hints
                .plan
                .build(self.next_step, &mut self.window_cache)
        } else {
            let k = (self.next_step - self.first_step) % self.workers.len();
            receive(&self.workers[k].0, self.poll)
        };
        self.hints.hint(self.next_step, self.opts.rank);
        match batch {
            Ok(b) => {
                self.next_step += 1;
                Some(Ok(b))
            }
            Err(e) => {
                self.next_step = self.hints.plan.steps.steps;
                Some(Err(e))
            }
        }
    }
}

/// How long a consumer with a core to spare polls for its next batch before it sleeps.
///
/// A sleeping consumer has to be woken by the worker that sends it the batch, and on a virtual
/// machine waking an idle core is an interrupt the hypervisor delivers: measured on a 2-core VM,
/// those wake-ups took a quarter of a lone loader thread's time (docs/PERFORMANCE.md, "Handing
/// batches over"). A batch takes a few hundred microseconds to gather, so most waits end inside
/// this time.
const POLL: Duration = Duration::from_micros(300);

/// The next batch of a worker: polled for up to [`POLL`] first when `poll`, then waited for.
fn receive(rx: &Receiver<Built>, poll: bool) -> Built {
    if poll {
        let start = Instant::now();
        loop {
            match rx.try_recv() {
                Ok(built) => return built,
                Err(Empty::Finished) => return Err(LoadError::WorkerLost),
                Err(Empty::Waiting) if start.elapsed() < POLL => std::hint::spin_loop(),
                Err(Empty::Waiting) => break,
            }
        }
    }
    rx.recv().unwrap_or(Err(LoadError::WorkerLost))
}

impl Drop for Loader {
    fn drop(&mut self) {
        for (rx, handle) in self.workers.drain(..) {
            drop(rx);
            let _ = handle.join();
        }
        if let Some(handle) = self.advisor.take() {
            // Fillers may outlive the loader: they then hint in their own thread.
            drop(
                self.hints
                    .tx
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take(),
            );
            let _ = handle.join();
        }
    }
}
