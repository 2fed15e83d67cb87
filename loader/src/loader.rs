//! The loader: one epoch of one split for one rank, as an iterator of batches, prefetched on
//! background threads, with a resume state of a few numbers.

use crate::batch::{Batch, BatchInfo, TensorLayout};
use crate::cache::lengths_of;
use crate::cache::Cache;
use crate::epoch::Epoch;
use crate::error::{LoadError, Misuse};
use crate::handoff::{handoff, Empty, Receiver};
use crate::options::{LoaderOptions, State};
use crate::order::{Cursor, Order};
use crate::pack::Packs;
use crate::prepare::Planned;
use crate::shape::{IndexDst, IndexLayout, Shape};
use crate::stats::LoaderStats;
use dsc_format::TensorSpec;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    cursor: Cursor,
    /// Poll for batches before sleeping: the loader threads leave this thread a core.
    poll: bool,
    /// Batches the threads have queued and the consumer not yet taken (a counter, so that
    /// reading it costs no lock per queue).
    ahead: Arc<AtomicUsize>,
    /// The content id of the data read ([`crate::cache::content_of`]), recorded in its states.
    content: String,
}

/// Where a mix's run stands on its weights at any step of one loader's epoch
/// ([`Loader::mix_tracker`]).
#[derive(Clone)]
pub struct MixTracker {
    epoch: Arc<Epoch>,
    opts: LoaderOptions,
}

impl std::fmt::Debug for MixTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MixTracker")
            .field("epoch", &self.opts.epoch)
            .finish()
    }
}

impl MixTracker {
    /// The progress at `step` of the epoch (`None` for one cache).
    pub fn at(&self, step: usize) -> Option<crate::order::Progress> {
        self.epoch.mix_progress(&self.opts, step)
    }
}

/// The page-cache hints of one loader, shared with its [`Filler`]s.
#[derive(Debug)]
struct Hints {
    epoch: Arc<Epoch>,
    /// The advisor thread's queue; `None` once the loader is dropped (or when there is no
    /// thread: hints are then given in the caller's thread).
    tx: Mutex<Option<SyncSender<usize>>>,
    /// The last window hinted, `usize::MAX` for none.
    advised: AtomicUsize,
}

impl Hints {
    fn stats(&self) -> LoaderStats {
        let e = &self.epoch;
        e.counters
            .snapshot(e.reader.sources.iter().map(|s| &*s.cache.resident.counters))
    }

    /// Advises the kernel once per window: read the next window ahead, release the one before
    /// last from the resident set.
    fn hint(&self, step: usize, rank: usize) {
        let p = self.epoch.shape.first_position(step, rank);
        let w = p / self.epoch.order.window();
        if self.advised.swap(w, Ordering::Relaxed) != w {
            match &*self.tx.lock().unwrap_or_else(|p| p.into_inner()) {
                // A full queue means the advisor is behind: skipping a hint is harmless.
                Some(tx) => match tx.try_send(w) {
                    Ok(()) | Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
                },
                None => self.epoch.advise(w),
            }
        }
    }
}

/// The loaders of an open cache (here rather than in `cache.rs`, which holds the open files
/// and knows nothing of loading).
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
    /// [`Loader::interrupt`] of the loader this filler fills for.
    pub fn interrupt(&self) {
        self.hints.epoch.reader.interrupt();
    }

    /// [`Loader::stats`] of the loader this filler fills for (it counts the batches filled).
    pub fn stats(&self) -> LoaderStats {
        self.hints.stats()
    }

    /// Records that the consumer of a queue this filler feeds (a ring of buffers) asked for a
    /// batch with `queued` filled ahead, and waited `wait` when none was: [`LoaderStats`]'s
    /// `waits`, `wait_s` and `queued` describe that consumer.
    pub fn record_ask(&self, queued: usize, wait: Option<std::time::Duration>) {
        self.hints.epoch.counters.asked(queued, wait);
    }

    /// The epoch, if `step` is one of its steps.
    fn step(&self, step: usize) -> Result<&Epoch, LoadError> {
        let epoch = &self.hints.epoch;
        if step >= epoch.steps() {
            return Err(Misuse::StepOutOfEpoch {
                step,
                steps: epoch.steps(),
            }
            .into());
        }
        Ok(epoch)
    }

    /// Copies batch `step` of the epoch into `dst` (one slice per tensor of
    /// [`Loader::layout`], each at least its [`Loader::batch_bytes`]) with one copy from the
    /// mapped shards; returns what the batch is (its sequence length, or its pack).
    pub fn fill(&self, step: usize, dst: &mut [&mut [u8]]) -> Result<BatchInfo, LoadError> {
        let epoch = self.step(step)?;
        check_buffers(dst, &self.batch_bytes)?;
        let (samples, repeated) = epoch.samples(step, &mut Cursor::default());
        self.hints.hint(step, self.rank);
        let info = epoch.gather_into((&samples, repeated), dst)?;
        epoch.delivered(samples.len(), &info);
        Ok(info)
    }

    /// Copies batch `step` into one contiguous `block` (at least [`Loader::block_bytes`]): its
    /// tensors one after another at aligned offsets, each cut to the batch, so that one
    /// transfer moves it (to a GPU). Returns what the batch is and each tensor's `(offset,
    /// bytes)` in the block, in [`Loader::layout`] order.
    pub fn fill_block(
        &self,
        step: usize,
        block: &mut [u8],
    ) -> Result<(BatchInfo, Vec<(usize, usize)>), LoadError> {
        let epoch = self.step(step)?;
        let (samples, repeated) = epoch.samples(step, &mut Cursor::default());
        self.hints.hint(step, self.rank);
        let (info, ranges) = epoch.gather_block((&samples, repeated), block)?;
        epoch.delivered(samples.len(), &info);
        Ok((info, ranges))
    }

    /// Writes batch `step`'s index for a consumer that holds the split's tensors itself (on a
    /// GPU) and gathers the batch there: the compiled-order position of each of its
    /// [`Loader::index_rows`] rows as little-endian i64 into `positions` (a pack's sequences,
    /// then zeros), and for a pack its own five tensors into `pack` ([`IndexLayout::own`],
    /// each at least its bytes; empty for padded batches). Returns what the
    /// batch is, as [`Filler::fill`] would: the same batch, from the stored lengths alone.
    pub fn fill_index(
        &self,
        step: usize,
        positions: &mut [u8],
        pack: &mut [&mut [u8]],
    ) -> Result<BatchInfo, LoadError> {
        self.index(step, positions, None, pack, false)
    }

    /// [`Filler::fill_index`] for a consumer whose copy of the split ends in one row of zeros
    /// (row `contexts`, the split's context count), so that every tensor of a batch is one
    /// gather by row with nothing to zero afterwards (what a captured CUDA graph can replay):
    /// a pack's unused rows point at that row, and `token_rows` (i64 `[T]`, packs only; empty
    /// for padded batches) gets each token's row of the split's per-step tensors flattened to
    /// `[(contexts + 1) * L, ...]`: `position * L + step`, the unused tail `contexts * L`.
    pub fn fill_rows(
        &self,
        step: usize,
        positions: &mut [u8],
        token_rows: &mut [u8],
        pack: &mut [&mut [u8]],
    ) -> Result<BatchInfo, LoadError> {
        let tokens = match &self.step(step)?.shape {
            Shape::Packed(p) => Some(p.packs.tokens()),
            _ => None,
        };
        if token_rows.len() != tokens.unwrap_or(0) * 8 {
            return Err(Misuse::TokenRows {
                bytes: token_rows.len(),
                tokens: tokens.unwrap_or(0),
            }
            .into());
        }
        let token_rows = tokens.map(|_| token_rows);
        self.index(step, positions, token_rows, pack, true)
    }

    /// Batch `step`'s index (`fill_index`, `fill_rows`); `zero_row`: a pack's unused rows point
    /// at the consumer's zero row after the split (else at row 0).
    fn index(
        &self,
        step: usize,
        positions: &mut [u8],
        token_rows: Option<&mut [u8]>,
        pack: &mut [&mut [u8]],
        zero_row: bool,
    ) -> Result<BatchInfo, LoadError> {
        let epoch = self.step(step)?;
        let rows = epoch.shape.rows();
        if positions.len() != rows * 8 {
            return Err(Misuse::Positions {
                bytes: positions.len(),
                rows,
            }
            .into());
        }
        let parts = epoch.index_layout();
        let own: Vec<usize> = parts
            .iter()
            .flat_map(|p| p.own.iter().map(TensorLayout::bytes))
            .collect();
        check_buffers(pack, &own)?;
        let [source] = &epoch.reader.sources[..] else {
            return Err(Misuse::MixNotIndexed.into());
        };
        if parts.is_none() {
            return Err(Misuse::SeriesNotIndexed.into());
        }
        let cache = Cache {
            inner: source.cache.clone(),
        };
        let lengths = cache.lengths(&source.cache.splits[source.split_index].0)?;
        let (samples, repeated) = epoch.samples(step, &mut Cursor::default());
        let dst = IndexDst {
            positions,
            unused: if zero_row { lengths.len() } else { 0 },
            token_rows,
            own: pack,
        };
        let info = epoch.index_into((&samples, repeated), &lengths, dst)?;
        epoch.delivered(samples.len(), &info);
        Ok(info)
    }
}

fn check_buffers(dst: &[&mut [u8]], need: &[usize]) -> Result<(), LoadError> {
    if dst.len() != need.len() {
        return Err(Misuse::BufferCount {
            given: dst.len(),
            tensors: need.len(),
        }
        .into());
    }
    for (d, &need) in dst.iter().zip(need) {
        if d.len() < need {
            return Err(Misuse::BufferTooSmall {
                bytes: d.len(),
                need,
            }
            .into());
        }
    }
    Ok(())
}

impl Loader {
    pub(crate) fn new(
        sources: &[Cache],
        opts: LoaderOptions,
        first_step: usize,
    ) -> Result<Loader, LoadError> {
        Loader::start(crate::prepare::prepare(sources, &opts)?, first_step)
    }

    /// The loader of an epoch planned already ([`crate::Cache::plan`]), from step `first_step`.
    pub(crate) fn start(planned: Planned, first_step: usize) -> Result<Loader, LoadError> {
        let threads = planned.threads();
        let Planned { epoch, opts } = planned;
        // What this loader can have in flight: each thread's queue and the batch it builds,
        // and the consumer's.
        let whole_batch: usize = epoch.layout.iter().map(TensorLayout::bytes).sum();
        epoch.pool.keep_at_least(
            (opts.prefetch + 2)
                .saturating_mul(threads + 1)
                .saturating_mul(whole_batch),
        );
        let steps = epoch.steps();
        let content = epoch.reader.content_id();
        let epoch = Arc::new(epoch);
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let first_step = first_step.min(steps);
        let poll = threads > 0 && threads < cores;
        let mut loader = Loader {
            content,
            opts,
            threads,
            first_step,
            next_step: first_step,
            workers: Vec::new(),
            advisor: None,
            hints: Arc::new(Hints {
                epoch,
                tx: Mutex::new(None),
                advised: AtomicUsize::new(usize::MAX),
            }),
            cursor: Cursor::default(),
            poll,
            ahead: Arc::new(AtomicUsize::new(0)),
        };
        loader.spawn()?;
        Ok(loader)
    }

    /// Starts the advisor and the prefetch threads. On failure (a thread limit) the threads
    /// already started stop when the loader is dropped.
    fn spawn(&mut self) -> Result<(), LoadError> {
        let (tx, rx) = sync_channel::<usize>(4);
        let epoch = self.hints.epoch.clone();
        let handle = std::thread::Builder::new()
            .name("dsc-loader-advice".into())
            .spawn(move || {
                for w in rx {
                    epoch.advise(w);
                }
            })
            .map_err(LoadError::Threads)?;
        self.advisor = Some(handle);
        *self.hints.tx.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        let threads = self.threads;
        for k in 0..threads {
            let (tx, rx) = handoff::<Built>(self.opts.prefetch.max(1));
            let epoch = self.hints.epoch.clone();
            let ahead = self.ahead.clone();
            let (first, total) = (self.first_step, self.hints.epoch.steps());
            let handle = std::thread::Builder::new()
                .name(format!("dsc-loader-{k}"))
                .spawn(move || {
                    let mut cursor = Cursor::default();
                    let mut step = first + k;
                    while step < total {
                        let built = epoch.build(step, &mut cursor);
                        // Counted before it is sent: the consumer never takes more than counted.
                        ahead.fetch_add(1, Ordering::Relaxed);
                        if tx.send(built).is_err() {
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
        self.hints.epoch.steps()
    }

    /// The order of this epoch.
    pub fn order(&self) -> &Order {
        &self.hints.epoch.order
    }

    /// Where a mix's run stands on its weights (a schedule's stage, or the one stage of fixed
    /// weights) at the next step: the stage in force, its weights and each source's realised
    /// share of the stage so far. `None` for one cache.
    pub fn mix_progress(&self) -> Option<crate::order::Progress> {
        self.hints.epoch.mix_progress(&self.opts, self.next_step)
    }

    /// What finds [`Loader::mix_progress`] at any step of this loader's epoch, apart from the
    /// loader (which a trainer hands to the thread that feeds its step).
    pub fn mix_tracker(&self) -> MixTracker {
        MixTracker {
            epoch: self.hints.epoch.clone(),
            opts: self.opts.clone(),
        }
    }

    /// The packs of this epoch, for a packed loader.
    pub fn packs(&self) -> Option<&Packs> {
        match &self.hints.epoch.shape {
            Shape::Packed(p) => Some(&p.packs),
            _ => None,
        }
    }

    /// What padding costs in this epoch's batches, every rank's ([`crate::order::padding`]),
    /// from the split's stored lengths; for a packed loader, what packing gives
    /// ([`Packs::figures`]) is asked of [`Loader::packs`] instead.
    pub fn padding(&self) -> Result<crate::order::Padding, LoadError> {
        let epoch = &self.hints.epoch;
        // Windows are rows of `W` steps cut from their contexts: figured as padded rows.
        let (steps, trim) = match &epoch.shape {
            Shape::Padded(p) | Shape::Bucketed(p) => (&p.steps, p.trim),
            Shape::Windows(w) => (&w.steps, None),
            Shape::Packed(_) => return Err(Misuse::NoPaddedBatches.into()),
        };
        let lengths = lengths_of(&self.sources(), &self.opts.order.split)?;
        // An untrimmed loader's figures say what trimming to exact lengths would give.
        Ok(crate::order::padding(
            &epoch.order,
            steps,
            &lengths,
            epoch.reader.max_len,
            trim.unwrap_or(1),
        ))
    }

    /// The cache this loader reads (a mix's first).
    pub fn cache(&self) -> Cache {
        Cache {
            inner: self.hints.epoch.reader.sources[0].cache.clone(),
        }
    }

    /// The caches this loader reads: one, or a mix's sources in order.
    pub fn sources(&self) -> Vec<Cache> {
        self.hints
            .epoch
            .reader
            .sources
            .iter()
            .map(|s| Cache {
                inner: s.cache.clone(),
            })
            .collect()
    }

    /// The stored tensors each batch holds (the `columns` asked for, in manifest order).
    pub fn tensor_specs(&self) -> impl ExactSizeIterator<Item = &TensorSpec> {
        self.hints.epoch.reader.specs()
    }

    /// The tensors of every batch with the shapes of a whole batch: the stored tensors asked
    /// for, in manifest order, then (packed) `cu_seqlens`, `seq_idx`, `position`, `num_seqs`
    /// and `num_tokens`.
    pub fn layout(&self) -> &[TensorLayout] {
        &self.hints.epoch.layout
    }

    /// The options in force.
    pub fn options(&self) -> &LoaderOptions {
        &self.opts
    }

    /// The state after the batches yielded so far.
    pub fn state(&self) -> State {
        let mut state =
            State::new(&self.opts, self.next_step).expect("validated when the loader was made");
        state.content_id = Some(self.content.clone());
        state
    }

    /// The bytes of a block that any batch of the epoch fits ([`Filler::fill_block`]).
    pub fn block_bytes(&self) -> usize {
        self.hints.epoch.block_bytes()
    }

    /// The parts of a batch's index ([`Filler::fill_rows`]), by name: positions, a pack's token
    /// rows and its own tensors; `None` for series windows, which are not indexed.
    pub fn index_layout(&self) -> Option<IndexLayout> {
        self.hints.epoch.index_layout()
    }

    /// Rows of a batch's index ([`Filler::fill_index`]): the batch size, or a pack's `S`.
    pub fn index_rows(&self) -> usize {
        self.hints.epoch.shape.rows()
    }

    /// Bytes of one whole (untrimmed) batch per tensor of [`Loader::layout`], for callers
    /// that supply their own buffers.
    pub fn batch_bytes(&self) -> Vec<usize> {
        self.layout().iter().map(TensorLayout::bytes).collect()
    }

    /// Copies the next batch into the caller's buffers (one slice per tensor of
    /// [`Loader::layout`], each at least its [`Loader::batch_bytes`]) with exactly one copy
    /// from the mapped shards, in the calling thread; returns what the batch is, or `None` at
    /// the end of the epoch. Use with `threads: 0` (background threads would prepare batches
    /// that this call does not use).
    pub fn next_into(&mut self, dst: &mut [&mut [u8]]) -> Result<Option<BatchInfo>, LoadError> {
        if self.next_step >= self.steps() {
            return Ok(None);
        }
        check_buffers(dst, &self.batch_bytes())?;
        let epoch = &self.hints.epoch;
        let (samples, repeated) = epoch.samples(self.next_step, &mut self.cursor);
        self.hints.hint(self.next_step, self.opts.rank);
        let info = epoch.gather_into((&samples, repeated), dst)?;
        epoch.delivered(samples.len(), &info);
        self.next_step += 1;
        Ok(Some(info))
    }

    /// Gives up every wait of this loader (its threads' and its fillers') for a shard still
    /// downloading from object storage: those fail with [`LoadError::Stopped`] at once, and so
    /// does every later batch that needs one. For Ctrl-C and for closing a loader without
    /// waiting for its downloads; the downloads themselves finish (or fail) in the fetcher's
    /// threads, whole or not kept, for the cache's other readers. Batches of shards already
    /// here are unaffected. A loader of local shards never waits, so this changes nothing.
    pub fn interrupt(&self) {
        self.hints.epoch.reader.interrupt();
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
        self.next_step = (self.next_step + n).min(self.steps());
    }

    /// The step the next batch belongs to.
    pub fn next_step(&self) -> usize {
        self.next_step
    }

    /// What this loader (and its fillers) has handed over so far, how long its consumer
    /// waited and how many batches were ready ahead of it; the shard counters are the open
    /// cache's.
    pub fn stats(&self) -> LoaderStats {
        self.hints.stats()
    }

    /// Batches its threads have prepared ahead of the consumer now (0 without threads).
    pub fn queued(&self) -> usize {
        self.ahead.load(Ordering::Relaxed)
    }
}

impl Iterator for Loader {
    type Item = Result<Batch, LoadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next_step >= self.steps() {
            return None;
        }
        let asked = Instant::now();
        let epoch = &self.hints.epoch;
        let (batch, queued, ready) = if self.workers.is_empty() {
            (epoch.build(self.next_step, &mut self.cursor), 0, false)
        } else {
            let k = (self.next_step - self.first_step) % self.workers.len();
            let queued = self.ahead.load(Ordering::Relaxed);
            let (built, ready) = receive(&self.workers[k].0, self.poll);
            // Not below zero: a lost worker hands over nothing.
            let _ = self
                .ahead
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            (built, queued, ready)
        };
        epoch
            .counters
            .asked(queued, (!ready).then(|| asked.elapsed()));
        self.hints.hint(self.next_step, self.opts.rank);
        match batch {
            Ok(b) => {
                let bytes = b.tensors.iter().map(|t| t.bytes().len()).sum();
                epoch.counters.delivered(b.size, bytes);
                self.next_step += 1;
                Some(Ok(b))
            }
            Err(e) => {
                self.next_step = self.steps();
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

/// The next batch of a worker: polled for up to [`POLL`] first when `poll`, then waited for;
/// and whether it was ready at once.
fn receive(rx: &Receiver<Built>, poll: bool) -> (Built, bool) {
    match rx.try_recv() {
        Ok(built) => return (built, true),
        Err(Empty::Finished) => return (Err(LoadError::WorkerLost), true),
        Err(Empty::Waiting) => {}
    }
    (wait_for(rx, poll), false)
}

/// [`receive`] once the queue was found empty.
fn wait_for(rx: &Receiver<Built>, poll: bool) -> Built {
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
