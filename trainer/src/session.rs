//! A training session: the cache, the network, the optimizer, and the buffers between them,
//! set up once per run. The loops in `train` and `diag` drive it.

use crate::config::{Amp, RunConfig, Task};
use crate::cuda::Event;
use crate::error::{Result, ResumeMismatch, TrainError};
use crate::feed::{block_views, index_parts, Filled, HostRing};
use crate::model::{Inputs, Packed, SequenceModel, Shape};
use crate::normalise::Scaling;
use crate::optim::{AdamW, LossScaler};
use crate::readback::{self, Purpose};
use crate::report::{Readbacks, StepReport, Summary};
use crate::task::TaskSpec;
use crate::timing::Shares;
use dsc_format::spelling::OptionError;
use dsc_format::stats::SplitStats;
use dsc_format::{Encoding, TensorRole};
use dsc_loader::{Cache, IndexLayout, Mix, TensorLayout};
use std::collections::VecDeque;
use std::rc::Rc;
use tch::{nn, Device, Tensor};

/// Which tensors of a batch (indices into the loader's layout, and so into a ring slot) feed
/// which input.
#[derive(Debug)]
struct Layout {
    x: Option<usize>,
    cats: Vec<usize>,
    length: usize,
    y: usize,
    ctx: Option<usize>,
    /// Tensors with a sequence axis (trimmed by the loader).
    sequence: Vec<bool>,
    /// Tensors stored with a step axis (`[n, L, ..]`), packed or padded.
    steps: Vec<bool>,
    /// A packed batch's `seq_idx`, `position` and `num_seqs`.
    pack: Option<[usize; 3]>,
}

/// One run's cache, network, optimizer and buffers.
#[derive(Debug)]
pub struct Session {
    /// What defines the run.
    pub cfg: RunConfig,
    /// The open cache (a mix's first: its manifest and statistics describe the batches).
    pub cache: Cache,
    /// What the loaders read: the cache, or its mix with `cfg.mix`.
    pub sources: Mix,
    /// Where the network runs.
    pub device: Device,
    /// Mixed precision in use.
    pub amp: Amp,
    /// `cfg.shape.trim_multiple` resolved for the device.
    pub trim_multiple: usize,
    /// The train split's loader options at epoch 0 (`cfg.loader_options`, checked by the
    /// loader once): every epoch's are these at its epoch.
    pub train_options: dsc_loader::LoaderOptions,
    /// Epoch 0 of the train split as planned for the layout, kept for that epoch's loader
    /// (taken by the first epoch that starts at its beginning, dropped otherwise).
    pub planned: Option<dsc_loader::Planned>,
    /// The task: loss, metric, targets.
    pub task: TaskSpec,
    /// The network's variables.
    pub vs: nn::VarStore,
    /// The network.
    pub net: Box<dyn SequenceModel>,
    /// The optimizer.
    pub opt: AdamW,
    /// The fp16 loss scaler, if fp16.
    pub scaler: Option<LossScaler>,
    layout: Layout,
    /// Host buffers; `ring.slot(i)` are pinned on CUDA.
    pub ring: Rc<HostRing>,
    /// CUDA: per slot, marks when its copy to the device has finished.
    copy_done: Vec<Event>,
    /// Slots whose copies are queued, oldest first.
    in_flight: VecDeque<usize>,
    /// The train split on the device (`--resident`); `None`: batches come through `ring`.
    pub resident: Option<Resident>,
    /// `--graph`: where each training batch is copied for the step to read.
    fixed: Option<Fixed>,
}

/// The train split's tensors on the device, gathered into batches there by index.
#[derive(Debug)]
pub struct Resident {
    /// Per tensor of the batch layout that the network reads: the split's `[contexts + 1, ..]`,
    /// whose last row is zeros, where a pack's unused rows and tokens point
    /// ([`dsc_loader::Filler::fill_rows`]): each tensor of a batch is one gather.
    tensors: Vec<Option<Tensor>>,
    /// Index slots (pinned on CUDA), as many as `ring`'s, each one block of [`Resident::parts`].
    pub ring: Rc<HostRing>,
    /// The tensors of an index ([`crate::feed::index_parts`]).
    parts: Vec<TensorLayout>,
}

/// Device tensors at fixed addresses that each training batch (or, from a resident split, its
/// index block) is copied into before the step: what a captured step reads on every replay.
#[derive(Debug)]
struct Fixed {
    /// Resident: the index block, whose views `tensors` are; else `None`.
    block: Option<Tensor>,
    /// The index's tensors (resident), or one per tensor of the batch layout (whole batches).
    tensors: Vec<Tensor>,
}

/// A batch on the device, ready for the network.
#[derive(Debug)]
pub struct DeviceBatch {
    /// What the network reads.
    pub inputs: Inputs,
    /// The targets.
    pub y: Tensor,
}

impl Session {
    /// Sets up a run of `cfg` on `device` with `slots` ring slots.
    pub fn new(cfg: RunConfig, device: Device, slots: usize) -> Result<Session> {
        cfg.validate()?;
        let cache = Cache::open_with(&cfg.cache, &cfg.open_options(0)?)?;
        let mut caches = vec![cache.clone()];
        for (i, path) in cfg.mix.iter().enumerate() {
            caches.push(Cache::open_with(path, &cfg.open_options(1 + i)?)?);
        }
        let sources = Mix::new(caches)?;
        let amp = cfg.amp.unwrap_or(if device.is_cuda() {
            Amp::Bf16
        } else {
            Amp::None
        });
        let trim_multiple = cfg.shape.trim_multiple.unwrap_or(if device.is_cuda() {
            crate::config::defaults::GPU_TRIM_MULTIPLE
        } else {
            1
        });
        let targets_scaled =
            matches!(cfg.task, Task::Regression | Task::Forecast) && cfg.scale_targets;
        let stats = match cfg.normalise || targets_scaled {
            true => Some(crate::normalise::train_stats(&cache)?),
            false => None,
        };
        // The task sizes its targets from the windows (a forecast's [H, K]): checked against
        // the cache first, as the loader will, so that no size comes from an unchecked horizon.
        if let Some(windows) = cfg.batches().windows() {
            windows
                .check(cache.manifest())
                .map_err(dsc_loader::LoadError::from)?;
        }
        let vs = nn::VarStore::new(device);
        let task = TaskSpec::resolve(&cfg, &sources, stats.as_ref(), &vs.root())?;
        let inputs_stats = stats.as_ref().filter(|_| cfg.normalise);
        // Train and evaluation batches have the same layout (the same T and S when packed).
        let train_options = cfg.loader_options(cache.manifest(), "train", 0, trim_multiple)?;
        let planned = sources.plan(&train_options)?;
        let (batch_layout, index) = (planned.layout().to_vec(), planned.index_layout());
        let (layout, mut shape) = layout(&cache, &batch_layout, task.outputs, inputs_stats)?;
        // A mix's batches are as long as its longest cache, and so are a pack's positions,
        // whichever cache comes first.
        let longest = sources
            .sources()
            .iter()
            .map(|c| c.manifest().max_len() as i64)
            .max()
            .unwrap_or(shape.max_len);
        shape.max_len = batch_layout
            .iter()
            .filter_map(|t| t.trimmed_axis.map(|a| t.shape[a] as i64))
            .max()
            .unwrap_or(if cfg.batches().pack().is_some() {
                longest
            } else {
                shape.max_len
            });
        tch::manual_seed(cfg.seed as i64);
        let net = cfg.model_config().build(&vs.root(), &shape, amp);
        let trainable = named_weights(&vs)
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect();
        let opt = AdamW::new(trainable, cfg.weight_decay, device);
        let scaler = (amp == Amp::Fp16).then(|| LossScaler::new(device));
        let ring = Rc::new(HostRing::new(
            &batch_layout,
            slots,
            device.is_cuda().then_some(device),
        )?);
        let resident = match &index {
            Some(index) => {
                resident_split(&cfg, &cache, (&batch_layout, index), &layout, device, slots)?
            }
            None => None,
        };
        let fixed = cfg
            .graph
            .then(|| Fixed::new(&ring, resident.as_ref(), device));
        let copy_done = if device.is_cuda() {
            (0..slots)
                .map(|_| Event::new())
                .collect::<Result<Vec<_>, crate::cuda::CudaError>>()?
        } else {
            Vec::new()
        };
        Ok(Session {
            cfg,
            cache,
            sources,
            device,
            amp,
            trim_multiple,
            train_options,
            planned: Some(planned),
            task,
            vs,
            net,
            opt,
            scaler,
            layout,
            ring,
            copy_done,
            in_flight: VecDeque::new(),
            resident,
            fixed,
        })
    }

    /// Parameters of the network.
    pub fn parameters(&self) -> i64 {
        self.vs
            .trainable_variables()
            .iter()
            .map(|t| t.numel() as i64)
            .sum()
    }

    /// The filled slot as device tensors, trimmed to its sequence length and to its first
    /// `rows` contexts (a pack is taken whole: its shapes are fixed). On CUDA the copies are
    /// queued without blocking; [`Session::release`] later hands the slot back once they are
    /// done.
    pub fn upload(&mut self, f: Filled, rows: usize) -> DeviceBatch {
        let ring = self.ring.clone();
        let bufs = ring.slot(f.slot);
        let s = f.info.seq_len as i64;
        let padded = f.info.pack.is_none();
        let cut_rows = (padded && rows < self.cfg.batch.batch_size).then_some(rows as i64);
        let view = |i: usize| -> Tensor {
            let t = &bufs[i];
            let t = if self.layout.sequence[i] && padded {
                let mut shape = t.size();
                shape[1] = s;
                let n: i64 = shape.iter().product();
                t.view([-1]).narrow(0, 0, n).view(shape.as_slice())
            } else {
                t.shallow_clone()
            };
            let t = match cut_rows {
                Some(rows) => t.narrow(0, 0, rows),
                None => t,
            };
            if self.device.is_cuda() {
                // tch exposes no non-blocking `copy_` into an existing tensor (its `copy_` blocks,
                // `_copy_from` has no CUDA kernel), so the device side of each copy is a fresh
                // tensor from libtorch's caching allocator: after the first steps it reuses the
                // same blocks and never calls cudaMalloc. The host side is the reused ring.
                t.to_device_(self.device, t.kind(), true, false)
            } else {
                t
            }
        };
        let batch = self.device_batch(view);
        self.queued(f.slot);
        batch
    }

    /// A training batch from the feed: gathered on the device from the resident split when
    /// there is one (the slot holds its index), else copied from the slot ([`Session::upload`]).
    pub fn train_batch(&mut self, f: Filled) -> DeviceBatch {
        match &self.resident {
            Some(_) => self.gather(f),
            None => self.upload(f, self.cfg.batch.batch_size),
        }
    }

    /// Batch `f` gathered from the resident split by its index (the slot): the tensors
    /// [`Session::upload`] would give for the same batch, byte for byte.
    fn gather(&mut self, f: Filled) -> DeviceBatch {
        let r = self.resident.as_ref().expect("a resident split");
        let block = r.ring.block(f.slot).expect("an index ring");
        let block = if self.device.is_cuda() {
            block.to_device_(self.device, block.kind(), true, false)
        } else {
            block.shallow_clone()
        };
        let batch = self.gather_rows(&block_views(&block, &r.parts), f.info.seq_len as i64);
        self.queued(f.slot);
        batch
    }

    /// The batch whose index ([`crate::feed::index_parts`], on the device) is `index`, from the
    /// resident split: one gather per tensor (a padded batch's cut to `seq_len` first).
    fn gather_rows(&self, index: &[Tensor], seq_len: i64) -> DeviceBatch {
        let r = self.resident.as_ref().expect("a resident split");
        let positions = &index[0];
        let (token_rows, own) = match self.layout.pack {
            Some(_) => (Some(&index[1]), &index[2..]),
            None => (None, &index[1..]),
        };
        let max_len = self.cache.manifest().max_len() as i64;
        let l = &self.layout;
        let loaded = self.ring.slot(0).len() - own.len();
        let view = |i: usize| -> Tensor {
            if i >= loaded {
                return own[i - loaded].shallow_clone();
            }
            let res = r.tensors[i].as_ref().expect("a tensor the network reads");
            match token_rows {
                // A pack's tokens: rows of the per-step tensors flattened to `[.. * L, ..]`.
                Some(rows) if l.steps[i] => {
                    let mut shape = res.size();
                    shape.remove(0);
                    shape[0] = -1;
                    res.view(shape.as_slice()).index_select(0, rows)
                }
                None if l.sequence[i] && seq_len < max_len => {
                    res.narrow(1, 0, seq_len).index_select(0, positions)
                }
                _ => res.index_select(0, positions),
            }
        };
        self.device_batch(view)
    }

    /// `--graph`: copies batch `f` (or its index) into the fixed device buffers that
    /// [`Session::fixed_batch`] reads, queued on the device; the slot is released as
    /// [`Session::upload`]'s are.
    pub fn stage(&mut self, f: Filled) -> Result<()> {
        let fixed = self.fixed.as_mut().expect("fixed buffers (`graph`)");
        match (&self.resident, &mut fixed.block) {
            (Some(r), Some(block)) => {
                crate::graph::copy_async(block, r.ring.block(f.slot).expect("an index ring"))?
            }
            _ => {
                for (dst, src) in fixed.tensors.iter_mut().zip(self.ring.slot(f.slot)) {
                    crate::graph::copy_async(dst, src)?;
                }
            }
        }
        self.queued(f.slot);
        Ok(())
    }

    /// The batch last [`Session::stage`]d, as views of the fixed buffers or gathered from the
    /// resident split by the fixed index: device work only, at the same addresses every step,
    /// so it can be captured.
    pub fn fixed_batch(&self) -> DeviceBatch {
        let fixed = self.fixed.as_ref().expect("fixed buffers (`graph`)");
        match &self.resident {
            Some(_) => self.gather_rows(&fixed.tensors, self.cache.manifest().max_len() as i64),
            None => self.device_batch(|i| fixed.tensors[i].shallow_clone()),
        }
    }

    /// On CUDA, marks the end of `slot`'s copies in the queue ([`Session::release`]).
    fn queued(&mut self, slot: usize) {
        if let Some(e) = self.copy_done.get(slot) {
            e.record().expect("recording a CUDA event");
            self.in_flight.push_back(slot);
        }
    }

    /// The network's inputs and targets from `view` of each tensor of the batch layout.
    fn device_batch(&self, view: impl Fn(usize) -> Tensor) -> DeviceBatch {
        let l = &self.layout;
        DeviceBatch {
            inputs: Inputs {
                x: l.x.map(&view),
                cats: l.cats.iter().map(|&i| view(i)).collect(),
                length: view(l.length),
                ctx: l.ctx.map(&view),
                pack: l.pack.map(|[seq_idx, position, num_seqs]| Packed {
                    seq_idx: view(seq_idx),
                    position: view(position),
                    num_seqs: view(num_seqs),
                }),
            },
            y: view(l.y),
        }
    }

    /// Slots that may be refilled now. On the CPU, `done`: the step has finished with it. On
    /// CUDA, the oldest queued copies are waited for, keeping `keep` in flight.
    pub fn release(&mut self, done: Option<usize>, keep: usize) -> Result<Vec<usize>> {
        if !self.device.is_cuda() {
            return Ok(done.into_iter().collect());
        }
        let mut out = Vec::new();
        while self.in_flight.len() > keep {
            let slot = self.in_flight.pop_front().expect("non-empty");
            self.copy_done[slot].synchronize()?;
            out.push(slot);
        }
        Ok(out)
    }

    /// Seeds libtorch's generator from the run seed and a step number, so dropout masks depend
    /// on the step alone and a resumed run draws the same ones.
    pub fn seed_step(&self, step: u64) {
        let mixed = self.cfg.seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        tch::manual_seed((mixed >> 1) as i64);
    }

    /// Forward and backward of one micro-batch; returns the detached loss (scaled by
    /// `1 / accumulate`), on the device.
    pub fn train_micro(&mut self, batch: &DeviceBatch) -> Tensor {
        let pred = self.net.forward_t(&batch.inputs, true);
        let seqs = batch.inputs.pack.as_ref().map(|p| &p.num_seqs);
        let loss = self.task.loss(&pred, &batch.y, seqs) / self.cfg.accumulate as f64;
        match &self.scaler {
            Some(s) => (&loss * &s.scale).backward(),
            None => loss.backward(),
        }
        loss.detach()
    }

    /// Per-sample loss and metric of a batch, without gradients.
    pub fn evaluate(&self, batch: &DeviceBatch) -> (Tensor, Tensor) {
        tch::no_grad(|| {
            let pred = self.net.forward_t(&batch.inputs, false);
            self.task.per_sample(&pred, &batch.y)
        })
    }

    /// Every tensor of a checkpoint: model weights, optimizer and scaler state.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = named_weights(&self.vs)
            .into_iter()
            .map(|(n, t)| (format!("model.{n}"), t))
            .collect();
        out.extend(
            self.opt
                .state()
                .into_iter()
                .map(|(n, t)| (format!("optim.{n}"), t)),
        );
        if let Some(s) = &self.scaler {
            out.push(("scaler.scale".into(), s.scale.shallow_clone()));
            out.push((
                "scaler.growth_tracker".into(),
                s.growth_tracker.shallow_clone(),
            ));
        }
        out
    }

    /// Restores [`Session::state_tensors`].
    pub fn load_state(&mut self, get: impl Fn(&str) -> Result<Tensor>) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            for (name, mut var) in self.vs.variables() {
                // Non-trainable variables are the input and target scalings, computed afresh
                // from the cache's statistics: they must be what the checkpoint trained with.
                let scaling = !var.requires_grad();
                let saved = get(&format!("model.{name}")).map_err(|e| {
                    if scaling {
                        ResumeMismatch::Scaling {
                            reading: Box::new(e),
                        }
                        .into()
                    } else {
                        e
                    }
                })?;
                if saved.size() != var.size() {
                    return Err(ResumeMismatch::Shape {
                        name,
                        saved: saved.size(),
                        model: var.size(),
                    }
                    .into());
                }
                if scaling {
                    let (then, now) = (
                        readback::values(&saved, Purpose::Other),
                        readback::values(&var, Purpose::Other),
                    );
                    let same = then
                        .iter()
                        .zip(&now)
                        .all(|(a, b)| (a - b).abs() <= 1e-6 * a.abs().max(1.0));
                    if !same {
                        return Err(ResumeMismatch::Statistics { name, now, then }.into());
                    }
                }
                var.copy_(&saved);
            }
            Ok(())
        })?;
        self.opt.load(|n| get(&format!("optim.{n}")))?;
        if let Some(s) = &mut self.scaler {
            tch::no_grad(|| -> Result<()> {
                s.scale.copy_(&get("scaler.scale")?);
                s.growth_tracker.copy_(&get("scaler.growth_tracker")?);
                Ok(())
            })?;
        }
        Ok(())
    }
}

impl Fixed {
    /// Buffers on `device` for the batches of `ring` or, with a resident split, for the
    /// indices of its ring.
    fn new(ring: &HostRing, resident: Option<&Resident>, device: Device) -> Fixed {
        let like = |t: &Tensor| Tensor::zeros(t.size().as_slice(), (t.kind(), device));
        match resident.and_then(|r| Some((r, r.ring.block(0)?))) {
            Some((r, block)) => {
                let block = like(block);
                Fixed {
                    tensors: block_views(&block, &r.parts),
                    block: Some(block),
                }
            }
            None => Fixed {
                block: None,
                tensors: ring.slot(0).iter().map(like).collect(),
            },
        }
    }
}

/// The network's variables by name, in name order (the order the optimizer and checkpoints
/// use, so that it does not depend on hash-map iteration).
pub fn named_weights(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

/// The train split on `device` when `cfg.resident` asks for it (or, unset, on CUDA when the
/// tensors the network reads fit a quarter of the GPU's memory): read once in cache order and
/// copied there, with an index ring of `slots` beside the batch ring (`index`: the parts of a
/// batch's index, [`IndexLayout`]).
fn resident_split(
    cfg: &RunConfig,
    cache: &Cache,
    (batch, index): (&[TensorLayout], &IndexLayout),
    l: &Layout,
    device: Device,
    slots: usize,
) -> Result<Option<Resident>> {
    if cfg.resident == Some(false)
        || (cfg.resident.is_none() && !device.is_cuda())
        || !cfg.mix.is_empty()
        || cfg.batches().windows().is_some()
    {
        return Ok(None);
    }
    let m = cache.manifest();
    let contexts = m.split("train").map_or(0, |s| s.contexts);
    let mut used: Vec<usize> = [Some(l.length), Some(l.y), l.x, l.ctx]
        .into_iter()
        .flatten()
        .chain(l.cats.iter().copied())
        .collect();
    used.sort_unstable();
    let spec = |i: usize| m.tensor(&batch[i].name).expect("a stored tensor");
    let need: usize = used
        .iter()
        .map(|&i| spec(i).sample_bytes() * contexts)
        .sum();
    let budget = if device.is_cuda() {
        crate::cuda::memory_total()? / 4
    } else {
        // SAFETY: sysconf has no preconditions.
        let (page, pages) = unsafe {
            (
                libc::sysconf(libc::_SC_PAGESIZE),
                libc::sysconf(libc::_SC_PHYS_PAGES),
            )
        };
        (page.max(0) as usize).saturating_mul(pages.max(0) as usize) / 4
    };
    if need > budget {
        if cfg.resident == Some(true) {
            return Err(OptionError::new(
                "resident",
                format!(
                    "on: the train split's tensors take {need} bytes, more than a quarter of the \
                     device's memory ({budget} bytes); use `resident=auto` or off"
                ),
            )
            .into());
        }
        return Ok(None);
    }
    let (mut host, contexts) = read_split(cfg, cache, (batch, &used), contexts)?;

    let mut tensors: Vec<Option<Tensor>> = (0..batch.len()).map(|_| None).collect();
    for &i in &used {
        let s = spec(i);
        // The row of zeros that unused index rows point at.
        let with_zeros = host[i].len() + s.sample_bytes();
        host[i].resize(with_zeros, 0);
        let shape: Vec<i64> = std::iter::once(contexts as i64 + 1)
            .chain(s.sample_shape.iter().map(|&d| d as i64))
            .collect();
        let t = Tensor::f_from_data_size(&host[i], &shape, crate::feed::kind_of(s.dtype)).map_err(
            |source| TrainError::Torch {
                what: format!("uploading the train split's {}", s.name),
                source,
            },
        )?;
        tensors[i] = Some(t.to_device(device));
    }
    let parts = index_parts(index);
    let ring = Rc::new(HostRing::index(
        &parts,
        slots,
        device.is_cuda().then_some(device),
    )?);
    Ok(Some(Resident {
        tensors,
        ring,
        parts,
    }))
}

/// The train split's bytes of the tensors `used` (indices into `batch`, the loader's layout) in
/// compiled order, each context at its compiled position (a generation's hidden contexts
/// counted, their rows zeros), read once in cache order; and the contexts they hold.
fn read_split(
    cfg: &RunConfig,
    cache: &Cache,
    (batch, used): (&[TensorLayout], &[usize]),
    contexts: usize,
) -> Result<(Vec<Vec<u8>>, usize)> {
    let m = cache.manifest();
    let spec = |i: usize| m.tensor(&batch[i].name).expect("a stored tensor");
    // The split in cache order, padded, the tensors the batches load.
    let opts = cfg.loader_options(m, "train", 0, 1)?;
    let reader = cache.loader(dsc_loader::LoaderOptions {
        order: dsc_loader::OrderSpec {
            split: "train".into(),
            shuffle: false,
            drop_last: false,
            ..Default::default()
        },
        batch_size: 4096,
        threads: 0,
        columns: opts.columns.clone(),
        ..Default::default()
    })?;
    let mut host: Vec<Vec<u8>> = vec![Vec::new(); batch.len()];
    let mut read = 0;
    for b in reader {
        let b = b?;
        let n = b.keys().len();
        // The last batch is completed with the split's first contexts: not stored twice.
        let rows = (contexts - read).min(n);
        for &i in used {
            let bytes = b.tensors()[i].bytes();
            host[i].extend_from_slice(&bytes[..bytes.len() / n * rows]);
        }
        read += rows;
    }
    // A generation that hides contexts (their keys replaced) is read without them, but an
    // index addresses rows by compiled position, hidden ones counted: each row goes there.
    let hiding = cache.contexts("train").ok().filter(|s| s.hides_any());
    if let Some(split) = &hiding {
        let positions = split.positions();
        for &i in used {
            let width = spec(i).sample_bytes();
            let mut placed = vec![0u8; split.stored_len() * width];
            for (row, &p) in positions.iter().enumerate() {
                placed[p * width..(p + 1) * width]
                    .copy_from_slice(&host[i][row * width..(row + 1) * width]);
            }
            host[i] = placed;
        }
    }
    Ok((host, hiding.map_or(contexts, |s| s.stored_len())))
}

/// Which tensors of the batches (`batch`, the loader's layout) feed which input, and their
/// scaling from `stats` (train split; `None`: the stored values as they are).
fn layout(
    cache: &Cache,
    batch: &[TensorLayout],
    outputs: i64,
    stats: Option<&SplitStats>,
) -> Result<(Layout, Shape)> {
    let m = cache.manifest();
    let scaling = |t: &dsc_format::TensorSpec| match stats {
        Some(s) => Scaling::from_stats(t, s),
        None => Scaling::identity(t.columns.len()),
    };
    let max_len = m.max_len();
    let mut l = Layout {
        x: None,
        cats: Vec::new(),
        length: usize::MAX,
        y: usize::MAX,
        ctx: None,
        sequence: Vec::new(),
        steps: Vec::new(),
        pack: None,
    };
    let mut shape = Shape {
        features: 0,
        vocabularies: Vec::new(),
        context: 0,
        max_len: max_len as i64,
        outputs,
        x_scaling: Scaling::identity(0),
        ctx_scaling: Scaling::identity(0),
    };
    let find = |name: &str| batch.iter().position(|t| t.name == name);
    for (i, tl) in batch.iter().enumerate() {
        l.sequence.push(tl.trimmed_axis.is_some());
        l.steps.push(matches!(
            tl.role,
            Some(TensorRole::Features | TensorRole::Categorical | TensorRole::Encoded)
        ));
        let Some(t) = m.tensor(&tl.name).filter(|_| tl.role.is_some()) else {
            continue; // a pack's own tensors, found by name below
        };
        match t.role {
            TensorRole::Features => {
                l.x = Some(i);
                shape.features = t.sample_shape[1] as i64;
                shape.x_scaling = scaling(t);
            }
            TensorRole::Categorical => {
                let vocab = match &t.columns[0].encoding {
                    Encoding::Category { vocabulary } => vocabulary.len(),
                    _ => 0,
                };
                l.cats.push(i);
                shape
                    .vocabularies
                    .push(vocab as i64 + i64::from(dsc_format::manifest::CODE_FIRST));
            }
            TensorRole::Length => l.length = i,
            TensorRole::Targets => l.y = i,
            TensorRole::ContextFeatures => {
                l.ctx = Some(i);
                shape.context = t.sample_shape[0] as i64;
                shape.ctx_scaling = scaling(t);
            }
            // Engine-compatible sub-column codes (`--profile mostlyai`) are for the engine's own
            // models; the reference networks read dsc's features and categoricals.
            // Strings encoded to a fixed width (bits, chars, n-grams) are for models of one's
            // own; the reference networks read dsc's features and categoricals.
            TensorRole::Key
            | TensorRole::FullLength
            | TensorRole::SubColumn
            | TensorRole::ContextSubColumn
            | TensorRole::Encoded
            | TensorRole::ContextEncoded
            | TensorRole::ContextCategorical => {}
        }
    }
    // A forecast's targets are the steps after each series window (not stored: the loader
    // adds them).
    if let Some(y_next) = find(dsc_loader::SERIES_TENSORS[1]).filter(|&i| batch[i].role.is_none()) {
        l.y = y_next;
    }
    if let (Some(seq_idx), Some(position), Some(num_seqs)) =
        (find("seq_idx"), find("position"), find("num_seqs"))
    {
        if batch[seq_idx].role.is_none() {
            l.pack = Some([seq_idx, position, num_seqs]);
        }
    }
    if m.is_records() {
        return Err(TrainError::cache(
            cache.dir(),
            "the cache is a table of records (compiled without `key`): the reference networks \
             are sequence models; read it with dsc.Loader or the Rust loader into a model of \
             your own (examples/linkage.py)",
        ));
    }
    if l.x.is_none() && l.cats.is_empty() {
        return Err(TrainError::cache(
            cache.dir(),
            "the cache has no per-step tensor (features or categorical) to train on",
        ));
    }
    Ok((l, shape))
}

impl Summary {
    /// A summary of `s` in `mode` with the run-wide fields filled in.
    pub fn new(
        s: &Session,
        mode: &'static str,
        steps: Vec<StepReport>,
        optimizer_steps: u64,
        total: Shares,
    ) -> Summary {
        Summary {
            mode,
            device: crate::device::describe(s.device),
            cuda_backend: crate::cuda::backend_status(),
            amp: format!("{:?}", s.amp).to_lowercase(),
            resident: s.resident.is_some(),
            step: "eager",
            graph_unavailable: None,
            task: format!("{:?}", s.cfg.task).to_lowercase(),
            model: format!("{:?}", s.cfg.model).to_lowercase(),
            parameters: s.parameters(),
            metric: s.task.metric.to_string(),
            epochs: Vec::new(),
            steps,
            optimizer_steps,
            total,
            gpu_busy_nvml: None,
            readbacks: Readbacks {
                training: readback::training_reads(),
                other: readback::other_reads(),
                event_waits: crate::cuda::event_waits(),
            },
            overfit_passed: None,
            checkpoint: None,
            eval_split: None,
            evaluation: Vec::new(),
            batch_lens: std::collections::BTreeMap::new(),
            loader: None,
            mix: None,
        }
    }
}
