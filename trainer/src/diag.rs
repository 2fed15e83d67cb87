//! Diagnostics: `--overfit-batch` (can the network learn at all?) and `--find-batch-size`
//! (how large a batch fits, and how fast is each size?).

use crate::config::RunConfig;
use crate::error::{Result, TrainError};
use crate::feed::{Feed, Fill};
use crate::readback::{self, Purpose};
use crate::report::{BatchSizeReport, BatchTrial, StepReport, Summary};
use crate::session::Session;
use crate::timing::{Clock, Totals};
use crate::train::train_options;
use dsc_loader::{LoaderOptions, OrderSpec};
use std::panic::{self, AssertUnwindSafe};
use std::time::Instant;
use tch::Device;

/// Trains up to `steps` optimizer steps on the first batch of epoch 0 at a constant learning
/// rate. Passes, and stops, once a logged window's mean loss is under a tenth of the first
/// step's (the loss is read every `--log-every` steps, so that is when it can tell).
pub fn overfit_batch(mut s: Session, steps: u64) -> Result<Summary> {
    // Not `drop_last`: a split smaller than one batch still gives one.
    let loader = s.sources.loader(LoaderOptions {
        order: OrderSpec {
            drop_last: false,
            ..train_options(&s, 0).order
        },
        ..train_options(&s, 0)
    })?;
    let ring = s.ring.clone();
    let feed = Feed::start(loader, &ring, Fill::Batch);
    let filled = feed
        .next()?
        .ok_or_else(|| TrainError::cache(&s.cfg.cache, "the training split is empty"))?;
    let batch = s.upload(filled, s.cfg.batch.batch_size);
    // The batch now lives on the device for good; the host slot is no longer needed.
    let _ = s.release(None, 0)?;
    drop(feed);
    let mut clock = Clock::new(0)?;
    let mut logged = Vec::new();
    let mut totals = Totals::default();
    let mut window = tch::Tensor::zeros([], (tch::Kind::Float, s.device));
    let mut in_window = 0u64;
    let mut taken = 0;
    for step in 1..=steps {
        taken = step;
        s.seed_step(step);
        let loss = s.train_micro(&batch);
        tch::no_grad(|| {
            let _ = window.g_add_(&loss);
        });
        s.opt.step(s.cfg.lr, s.cfg.clip, s.scaler.as_mut());
        s.opt.zero_grad();
        clock.samples(s.cfg.batch.batch_size);
        in_window += 1;
        if step == 1 || step % s.cfg.log_every == 0 || step == steps {
            let loss = readback::values(&window, Purpose::Training)[0] / in_window as f64;
            let _ = window.zero_();
            let t = clock.close()?;
            totals.add(&t);
            logged.push(StepReport::new(step, loss, s.cfg.lr, t.shares()));
            in_window = 0;
            if step > 1 && loss < 0.1 * logged[0].train_loss {
                break;
            }
        }
    }
    let first = logged
        .first()
        .map_or(f64::NAN, |r: &StepReport| r.train_loss);
    let last = logged
        .last()
        .map_or(f64::NAN, |r: &StepReport| r.train_loss);
    let passed = last < 0.1 * first;
    eprintln!(
        "overfit one batch of {}: loss {first:.4} -> {last:.4} ({:.1}% lower) in {taken} steps: {}",
        s.cfg.batch.batch_size,
        100.0 * (1.0 - last / first),
        if passed {
            "PASS"
        } else {
            "FAIL (the loss must fall by over 90%)"
        }
    );
    let mut summary = Summary::new(&s, "overfit_batch", logged, taken, totals.shares());
    summary.overfit_passed = Some(passed);
    Ok(summary)
}

/// Tries batch sizes from 16, doubling up to `max`, each for a few full training steps, until
/// one does not fit in memory.
pub fn find_batch_size(cfg: &RunConfig, device: Device, max: usize) -> BatchSizeReport {
    let mut trials = Vec::new();
    let mut b = cfg.batch.batch_size.clamp(1, 16);
    let hook = panic::take_hook();
    // libtorch reports out-of-memory as a panic in tch; keep its message out of the output.
    panic::set_hook(Box::new(|_| {}));
    while b <= max {
        let mut c = cfg.clone();
        c.batch.batch_size = b;
        let result = panic::catch_unwind(AssertUnwindSafe(|| trial(c, device)));
        let t = match result {
            Ok(Ok(rate)) => BatchTrial {
                batch_size: b,
                fits: true,
                samples_per_s: Some(rate),
                error: None,
            },
            Ok(Err(e)) => BatchTrial {
                batch_size: b,
                fits: false,
                samples_per_s: None,
                error: Some(format!("{e:#}")),
            },
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into());
                let first = msg.lines().next().unwrap_or_default().to_string();
                BatchTrial {
                    batch_size: b,
                    fits: false,
                    samples_per_s: None,
                    error: Some(first),
                }
            }
        };
        let fits = t.fits;
        eprintln!(
            "batch {:>6}: {}",
            b,
            match (&t.samples_per_s, &t.error) {
                (Some(r), _) => format!("fits, {r:.0} samples/s"),
                (_, Some(e)) => format!("does not fit: {e}"),
                _ => String::new(),
            }
        );
        trials.push(t);
        if !fits {
            break;
        }
        b *= 2;
    }
    panic::set_hook(hook);
    let largest = trials.iter().filter(|t| t.fits).map(|t| t.batch_size).max();
    BatchSizeReport {
        mode: "find_batch_size",
        device: crate::device::describe(device),
        largest,
        trials,
    }
}

/// Samples/s of a few training steps at the configured batch size (one warm-up step).
fn trial(cfg: RunConfig, device: Device) -> Result<f64> {
    const MEASURED: usize = 3;
    let mut s = Session::new(cfg, device, 2)?;
    let loader = s.sources.loader(train_options(&s, 0))?;
    if loader.steps() <= MEASURED {
        let what = format!(
            "the training split has fewer than {} batches of {}",
            MEASURED + 1,
            s.cfg.batch.batch_size
        );
        return Err(TrainError::cache(&s.cfg.cache, what));
    }
    let ring = s.ring.clone();
    let feed = Feed::start(loader, &ring, Fill::Batch);
    let mut start = Instant::now();
    for i in 0..=MEASURED {
        if i == 1 {
            start = Instant::now();
        }
        let filled = feed.next()?.ok_or_else(|| {
            TrainError::cache(&s.cfg.cache, "the training split ended during a trial")
        })?;
        let batch = s.upload(filled, s.cfg.batch.batch_size);
        let loss = s.train_micro(&batch);
        s.opt.step(s.cfg.lr, s.cfg.clip, s.scaler.as_mut());
        s.opt.zero_grad();
        // The read waits for the step, so the timing covers the device's work.
        let _ = readback::values(&loss, Purpose::Other);
        for slot in s.release(Some(filled.slot), 0)? {
            feed.release(slot);
        }
    }
    Ok((MEASURED * s.cfg.batch.batch_size) as f64 / start.elapsed().as_secs_f64())
}
