//! The data path from page cache to the step: a ring of host buffers (pinned when the device is
//! CUDA) that a producer thread fills with [`Loader::next_into`], one copy from the mapped shards
//! into memory the GPU can read by DMA. Buffers are allocated once per run and handed back and
//! forth through two channels, so a slot is only ever touched by one side at a time. With a
//! split resident on the device, the slots hold only each batch's index
//! ([`dsc_loader::Filler::fill_rows`]: positions, a pack's token rows and own tensors) in one
//! block, copied to the device in one piece, which the session gathers by there.

use crate::error::{Result, TrainError};
use dsc_format::Dtype;
use dsc_loader::{
    BatchInfo, Filler, IndexLayout, LoadError, Loader, LoaderStats, TensorLayout, BLOCK_ALIGN,
};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// The tch element type of a stored dtype.
pub fn kind_of(dtype: Dtype) -> Kind {
    match dtype {
        Dtype::F32 => Kind::Float,
        Dtype::U8 => Kind::Uint8,
        Dtype::I32 => Kind::Int,
        Dtype::I64 => Kind::Int64,
    }
}

/// Host buffers for `slots` batches: one tensor per tensor of the loader's batches, each shaped
/// as a whole batch (untrimmed, or a pack).
#[derive(Debug)]
pub struct HostRing {
    slots: Vec<Vec<Tensor>>,
    /// An index ring's slots each as one block of bytes, whose views `slots` are; empty for a
    /// batch ring.
    blocks: Vec<Tensor>,
}

/// What the producer writes into a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// The whole batch (one tensor per tensor of the loader's layout).
    Batch,
    /// Its index ([`Filler::fill_rows`], for a split that ends in a row of zeros): positions
    /// (i64, [`Loader::index_rows`]), then a pack's token rows (i64 `[T]`) and its five own
    /// tensors.
    Index,
}

impl HostRing {
    /// A ring for batch indices ([`Fill::Index`]) made of `parts` ([`index_parts`]): each slot
    /// one block ([`HostRing::block`]) that the parts are views of.
    pub fn index(
        parts: &[TensorLayout],
        slots: usize,
        pin_for: Option<Device>,
    ) -> Result<HostRing> {
        let bytes = block_bytes(parts) as i64;
        let blocks = (0..slots)
            .map(|_| {
                pinned(
                    Tensor::zeros([bytes], (Kind::Uint8, Device::Cpu)),
                    pin_for,
                    "an index",
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(HostRing {
            slots: blocks.iter().map(|b| block_views(b, parts)).collect(),
            blocks,
        })
    }

    /// Allocates the ring for batches of `layout` (`Loader::layout`); `pin_for` pins the memory
    /// for DMA to that CUDA device.
    pub fn new(layout: &[TensorLayout], slots: usize, pin_for: Option<Device>) -> Result<HostRing> {
        let slots = (0..slots)
            .map(|_| {
                layout
                    .iter()
                    .map(|s| {
                        let shape: Vec<i64> = s.shape.iter().map(|&d| d as i64).collect();
                        let t = Tensor::zeros(shape.as_slice(), (kind_of(s.dtype), Device::Cpu));
                        pinned(t, pin_for, &s.name)
                    })
                    .collect::<Result<Vec<Tensor>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(HostRing {
            slots,
            blocks: Vec::new(),
        })
    }

    /// An index ring's slot as one block of bytes (its tensors are views of it).
    pub fn block(&self, slot: usize) -> Option<&Tensor> {
        self.blocks.get(slot)
    }

    /// The tensors of one slot (full batch shape; a trimmed batch occupies a prefix).
    pub fn slot(&self, slot: usize) -> &[Tensor] {
        &self.slots[slot]
    }

    /// Slots in the ring.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the ring has no slot (never, for a ring a feed can use).
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn raw(&self, slot: usize) -> SlotMemory {
        SlotMemory(
            self.slots[slot]
                .iter()
                .map(|t| {
                    (
                        t.data_ptr() as *mut u8,
                        t.numel() * t.kind().elt_size_in_bytes(),
                    )
                })
                .collect(),
        )
    }
}

/// `t` pinned for DMA to `pin_for`, or as it is.
fn pinned(t: Tensor, pin_for: Option<Device>, what: &str) -> Result<Tensor> {
    match pin_for {
        Some(d) => t.f_pin_memory(d).map_err(|source| TrainError::Torch {
            what: format!("pinning a host buffer for {what}"),
            source,
        }),
        None => Ok(t),
    }
}

/// The tensors of a batch's index ([`Fill::Index`]), as the loader names them
/// ([`IndexLayout`]): positions `[rows]` (i64), then, when packed, each token's row `[T]` (i64)
/// and the pack's own tensors.
pub fn index_parts(index: &IndexLayout) -> Vec<TensorLayout> {
    let mut parts = vec![index.positions.clone()];
    parts.extend(index.token_rows.iter().cloned());
    parts.extend(index.own.iter().cloned());
    parts
}

/// Bytes of a block holding `parts`, each at a multiple of [`BLOCK_ALIGN`].
fn block_bytes(parts: &[TensorLayout]) -> usize {
    parts.iter().fold(0, |end, p| {
        end.next_multiple_of(BLOCK_ALIGN) + part_bytes(p)
    })
}

fn part_bytes(p: &TensorLayout) -> usize {
    p.shape.iter().product::<usize>() * p.dtype.size()
}

/// The tensors of `parts` as views of `block` (u8, host or device), laid out as
/// [`block_bytes`] counts them: one copy of the block moves them all.
pub fn block_views(block: &Tensor, parts: &[TensorLayout]) -> Vec<Tensor> {
    let mut end = 0usize;
    parts
        .iter()
        .map(|p| {
            let start = end.next_multiple_of(BLOCK_ALIGN);
            end = start + part_bytes(p);
            let shape: Vec<i64> = p.shape.iter().map(|&d| d as i64).collect();
            block
                .narrow(0, start as i64, part_bytes(p) as i64)
                .view_dtype(kind_of(p.dtype))
                .view(shape.as_slice())
        })
        .collect()
}

/// The address and length of each tensor of a slot, for the producer thread.
struct SlotMemory(Vec<(*mut u8, usize)>);

// SAFETY: the pointers address tensors owned by the `HostRing`, which the `Feed` borrows, and
// `Feed::drop` joins the thread, so the memory outlives every write. A slot's memory is written only by the producer between
// receiving the slot index and sending it back, and read by the consumer only after that, so
// the two threads never touch a slot at the same time.
unsafe impl Send for SlotMemory {}

/// A filled slot: which one, and what the batch is (its trimmed sequence length, or its pack).
#[derive(Debug, Clone, Copy)]
pub struct Filled {
    /// The ring slot that holds it.
    pub slot: usize,
    /// What the batch is: its sequence length, or its pack.
    pub info: BatchInfo,
}

/// One epoch's producer thread.
///
/// Batches into the ring, in one's own loop (docs/GUIDE.md, "The loader in your own tch loop";
/// the whole program is `trainer/examples/own_loop.rs`):
///
/// ```
/// # use dsc_loader::{Cache, LoaderOptions};
/// # use dsc_train::cuda::Event;
/// # use dsc_train::feed::{Feed, Fill, HostRing};
/// # use std::collections::VecDeque;
/// # use tch::{Device, Kind};
/// # let dir = tempfile::tempdir()?;
/// # std::env::set_current_dir(dir.path())?;
/// # let sample = dsc_gen::icecube::IcecubeOptions {
/// #     files: 2, events_per_file: 300, seed: 7, ..Default::default()
/// # };
/// # dsc_gen::icecube::generate(std::path::Path::new("data"), &sample)?;
/// # let mut spec = dsc_compiler::CompileSpec::new(vec!["data/train/batch_*.parquet".into()], "event_id");
/// # spec.features = vec!["time".into(), "charge".into()];
/// # spec.max_len = Some(64);
/// # dsc_compiler::compile(&spec, &dsc_compiler::CompileOptions {
/// #     out: "cache".into(), force: false, max_memory: None,
/// #     storage: dsc_compiler::Storage::Hot, progress: &dsc_compiler::NoProgress,
/// # })?;
/// # let cache = Cache::open("cache")?;
/// # let device = Device::Cpu;
/// # let events: Vec<Event> = Vec::new();
/// # let x = cache.tensors().iter().position(|t| t.name == "x").ok_or("no x")?;
/// let loader = cache.loader(LoaderOptions { batch_size: 128, threads: 0, ..Default::default() })?;
/// let ring = HostRing::new(loader.layout(), 3, device.is_cuda().then_some(device))?;
/// let feed = Feed::start(loader, &ring, Fill::Batch);   // whole batches into the ring
/// let mut queued = VecDeque::new();
/// while let Some(filled) = feed.next()? {
///     let host = ring.slot(filled.slot);            // filled in place: one copy from page cache
///     let xs = host[x].to_device_(device, Kind::Float, true, false);   // non-blocking
///     // ... forward, backward, step; read the loss back only every N steps ...
///     if device.is_cuda() {
///         events[filled.slot].record()?;            // after this slot's copies in the queue
///         queued.push_back(filled.slot);
///         while queued.len() > 1 {                  // keep one batch's copies in flight
///             let slot = queued.pop_front().unwrap();
///             events[slot].synchronize()?;          // its copy has run: the slot may be refilled
///             feed.release(slot);
///         }
///     } else {
///         feed.release(filled.slot);                // the CPU step read the slot in place
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Feed<'ring> {
    ring: PhantomData<&'ring HostRing>,
    free: Option<SyncSender<usize>>,
    ready: Receiver<Result<Filled, LoadError>>,
    /// Slots filled and not yet taken by the consumer.
    filled: Arc<AtomicUsize>,
    /// The loader's counters, which [`Feed::next`] adds the consumer's view to.
    stats: Filler,
    handle: Option<JoinHandle<()>>,
}

impl<'ring> Feed<'ring> {
    /// Starts filling the ring from `loader` (which must have `threads: 0`) with whole batches
    /// or (`Fill::Index`) their index; every slot starts free. The borrow keeps the ring alive
    /// while the thread writes into it.
    pub fn start(mut loader: Loader, ring: &'ring HostRing, fill: Fill) -> Feed<'ring> {
        let n = ring.len();
        let (free_tx, free_rx) = sync_channel::<usize>(n);
        let (ready_tx, ready_rx) = sync_channel::<Result<Filled, LoadError>>(n);
        let memory: Vec<SlotMemory> = (0..n).map(|s| ring.raw(s)).collect();
        let filler = loader.filler();
        let stats = loader.filler();
        let filled = Arc::new(AtomicUsize::new(0));
        let filled_by_producer = filled.clone();
        for s in 0..n {
            free_tx.send(s).expect("receiver alive");
        }
        let handle = std::thread::Builder::new()
            .name("dsc-train-feed".into())
            .spawn(move || {
                for slot in free_rx {
                    let mem = &memory[slot];
                    // SAFETY: see `SlotMemory`: this thread owns the slot until it sends it
                    // back, and the memory is live for as long as the feed.
                    let mut dst: Vec<&mut [u8]> = mem
                        .0
                        .iter()
                        .map(|&(p, len)| unsafe { std::slice::from_raw_parts_mut(p, len) })
                        .collect();
                    let next = match fill {
                        Fill::Batch => loader.next_into(&mut dst),
                        Fill::Index => next_index(&mut loader, &filler, &mut dst),
                    };
                    let msg = match next {
                        Ok(Some(info)) => Ok(Filled { slot, info }),
                        Ok(None) => return, // end of epoch: dropping the sender says so
                        Err(e) => Err(e),
                    };
                    let failed = msg.is_err();
                    // Counted before it is sent, so the consumer never takes more than counted.
                    filled_by_producer.fetch_add(1, Ordering::Relaxed);
                    if ready_tx.send(msg).is_err() || failed {
                        return;
                    }
                }
            })
            .expect("spawn the feed thread");
        Feed {
            ring: PhantomData,
            free: Some(free_tx),
            ready: ready_rx,
            filled,
            stats,
            handle: Some(handle),
        }
    }

    /// The next filled slot, or `None` at the end of the epoch. Blocks while the producer is
    /// behind (that time is the step's data wait).
    pub fn next(&self) -> Result<Option<Filled>> {
        let queued = self.filled.load(Ordering::Relaxed);
        let asked = Instant::now();
        let got = self.ready.recv();
        if matches!(got, Ok(Ok(_))) {
            self.filled.fetch_sub(1, Ordering::Relaxed);
            let wait = (queued == 0).then(|| asked.elapsed());
            self.stats.record_ask(queued, wait);
        }
        match got {
            Ok(Ok(f)) => Ok(Some(f)),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Ok(None),
        }
    }

    /// What the epoch's loader has handed over so far, with this feed's consumer's waits and
    /// the slots filled ahead of it.
    pub fn stats(&self) -> LoaderStats {
        self.stats.stats()
    }

    /// Gives a slot back to the producer; its contents must no longer be needed (on CUDA: its
    /// copy to the device has completed).
    pub fn release(&self, slot: usize) {
        if let Some(tx) = &self.free {
            // The producer may have finished the epoch; then nobody needs the slot.
            let _ = tx.send(slot);
        }
    }
}

/// The next batch's index into `dst` ([`index_parts`]), or `None` at the end of the epoch.
fn next_index(
    loader: &mut Loader,
    filler: &Filler,
    dst: &mut [&mut [u8]],
) -> Result<Option<BatchInfo>, LoadError> {
    let step = loader.next_step();
    if step >= loader.steps() {
        return Ok(None);
    }
    let (positions, rest) = dst.split_first_mut().expect("a positions buffer");
    let info = match rest.split_first_mut() {
        Some((token_rows, pack)) => filler.fill_rows(step, positions, token_rows, pack)?,
        None => filler.fill_rows(step, positions, &mut [], &mut [])?,
    };
    loader.advance(1);
    Ok(Some(info))
}

impl Drop for Feed<'_> {
    fn drop(&mut self) {
        // Closing the free channel ends the producer's loop; join so the ring outlives it.
        self.free = None;
        while self.ready.try_recv().is_ok() {}
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
