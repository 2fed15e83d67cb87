//! One micro-batch of training, launched one of two ways.
//!
//! Eager: each tensor op is launched as the loop reaches it, the batch copied into fresh device
//! tensors. With `--graph`: the batch (or, from a resident split, its index) is copied into
//! fixed device buffers ([`Session::stage`]), and the same arithmetic, gather included, reads
//! them. On CUDA the first [`WARMUP_UPDATES`] optimizer steps run that way on a side stream
//! (where cuBLAS and autograd set up what capture cannot); then the micro-step and the
//! micro-step with the optimizer update are each captured once ([`crate::graph::Graph`]) and
//! replayed: the host's work per step is the copy, the learning rate's fill and one replay.
//! Where graphs are unavailable the fixed step runs uncaptured, which is also how CPU tests
//! hold the captured arithmetic equal to the eager one.

use crate::error::Result;
use crate::feed::Filled;
use crate::graph::{Graph, SideStream};
use crate::session::Session;
use crate::timing::Clock;
use tch::{Device, Kind, Tensor};

/// Optimizer steps run uncaptured (on the capture's side stream) before capturing: libraries
/// allocate their workspaces and the optimizer seats its gradients on the first ones.
pub const WARMUP_UPDATES: u64 = 3;

/// How a run's steps are launched, and the losses they add up on the device.
#[derive(Debug)]
pub struct Stepper {
    launch: Launch,
    /// The training loss summed since the last read-back (scaled by `1 / accumulate`).
    pub window_loss: Tensor,
    /// The training loss summed over the epoch so far.
    pub epoch_loss: Tensor,
}

#[derive(Debug)]
enum Launch {
    Eager,
    /// Fixed buffers; `None`: uncaptured, for the reason given.
    Fixed(std::result::Result<Capture, String>),
}

#[derive(Debug)]
struct Capture {
    side: SideStream,
    /// Optimizer steps run on the side stream so far.
    warm: u64,
    /// The micro-step without the update (accumulation), captured at its first use.
    micro: Option<Graph>,
    /// The micro-step with the update.
    update: Option<Graph>,
}

impl Stepper {
    /// The launch `s.cfg.graph` asks for, captured where the device allows.
    pub fn new(s: &Session) -> Result<Stepper> {
        let launch = if !s.cfg.graph {
            Launch::Eager
        } else {
            match (crate::graph::unavailable(s.device), s.device) {
                (None, Device::Cuda(i)) => Launch::Fixed(Ok(Capture {
                    side: SideStream::new(i)?,
                    warm: 0,
                    micro: None,
                    update: None,
                })),
                (why, _) => Launch::Fixed(Err(why.unwrap_or_default())),
            }
        };
        let zero = || Tensor::zeros([], (Kind::Float, s.device));
        Ok(Stepper {
            launch,
            window_loss: zero(),
            epoch_loss: zero(),
        })
    }

    /// How the steps ran: `eager`, `graph` (captured, after the warm-up) or `uncaptured`, and
    /// why not captured where `--graph` asked.
    pub fn describe(&self) -> (&'static str, Option<String>) {
        match &self.launch {
            Launch::Eager => ("eager", None),
            Launch::Fixed(Ok(c)) if c.update.is_some() || c.micro.is_some() => ("graph", None),
            Launch::Fixed(Ok(_)) => (
                "uncaptured",
                Some(format!(
                    "the run ended within the {WARMUP_UPDATES} warm-up steps before capture"
                )),
            ),
            Launch::Fixed(Err(why)) => ("uncaptured", Some(why.clone())),
        }
    }

    /// Trains on micro-batch `f`; `update`: the learning rate of the optimizer step that ends
    /// with it (the last micro-batch of an accumulation). Times the copy on `clock`.
    pub fn micro(
        &mut self,
        s: &mut Session,
        f: Filled,
        update: Option<f64>,
        clock: &mut Clock,
    ) -> Result<()> {
        let (window, epoch) = (&self.window_loss, &self.epoch_loss);
        match &mut self.launch {
            Launch::Eager => {
                clock.step_start()?;
                let batch = s.train_batch(f);
                clock.copied()?;
                let loss = s.train_micro(&batch);
                drop(batch);
                add_loss(window, epoch, &loss);
                if let Some(lr) = update {
                    s.opt.step(lr, s.cfg.clip, s.scaler.as_mut());
                    s.opt.zero_grad();
                }
                Ok(())
            }
            Launch::Fixed(capture) => {
                clock.step_start()?;
                s.stage(f)?;
                clock.copied()?;
                if let Some(lr) = update {
                    s.opt.set_lr(lr);
                }
                let step = |s: &mut Session| fixed_step(s, window, epoch, update.is_some());
                let Ok(c) = capture else {
                    step(s);
                    return Ok(());
                };
                if c.warm < WARMUP_UPDATES {
                    c.side.run(|| {
                        step(s);
                        Ok(())
                    })?;
                    c.warm += u64::from(update.is_some());
                    return Ok(());
                }
                let graph = match update {
                    Some(_) => &mut c.update,
                    None => &mut c.micro,
                };
                if graph.is_none() {
                    *graph = Some(Graph::capture(&c.side, || {
                        step(s);
                        Ok(())
                    })?);
                }
                graph.as_ref().expect("captured").replay()
            }
        }
    }
}

/// The micro-step on the fixed buffers: gather, forward, loss, backward, the losses summed,
/// and with `update` clipping, AdamW at the rate set and zeroed gradients. Device work only.
fn fixed_step(s: &mut Session, window: &Tensor, epoch: &Tensor, update: bool) {
    let batch = s.fixed_batch();
    let loss = s.train_micro(&batch);
    drop(batch);
    add_loss(window, epoch, &loss);
    if update {
        s.opt.apply(s.cfg.clip, s.scaler.as_mut());
        s.opt.zero_grad();
    }
}

fn add_loss(window: &Tensor, epoch: &Tensor, loss: &Tensor) {
    tch::no_grad(|| {
        let _ = window.shallow_clone().g_add_(loss);
        let _ = epoch.shallow_clone().g_add_(loss);
    });
}
