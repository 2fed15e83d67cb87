//! The training loop: epochs of micro-batches from the feed, optimizer steps, a loss read back
//! once per logged window, validation and a checkpoint at each epoch's end.

use crate::checkpoint::{self, Checkpoint, Position};
use crate::error::{Result, TrainError};
use crate::feed::{Feed, Fill};
use crate::optim::learning_rate;
use crate::readback::{self, Purpose};
use crate::report::{EpochReport, SplitEvaluation, StepReport, Summary};
use crate::session::{named_weights, Session};
use crate::step::Stepper;
use crate::timing::{Clock, Totals};
use dsc_format::spelling::OptionError;
use dsc_loader::{LoaderOptions, State};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tch::{Kind, Tensor};

/// Copies kept queued on the device before their host slots are recycled, in evaluation.
const IN_FLIGHT: usize = 1;

/// Training's copies kept queued before their slots are recycled: all but two of the ring's
/// slots (one being filled, one being taken), so that the host may run that many steps ahead
/// of the device. Waiting for the last step's copy instead kept a captured step's host one
/// replay ahead, and the GPU idled between replays (docs/PERFORMANCE.md).
fn train_in_flight(s: &Session) -> usize {
    s.ring.len().saturating_sub(2).max(1)
}

/// Options that are not part of the run's arithmetic.
#[derive(Debug)]
pub struct RunOptions {
    /// The run's output folder.
    pub out: PathBuf,
    /// Stop after this many optimizer steps in all.
    pub max_steps: Option<u64>,
    /// No progress bars or log lines (the `--json` mode).
    pub quiet: bool,
}

/// The training split's loader options for `epoch`: shuffled, whole batches (trimmed, or
/// packs), filled in the calling (feed) thread.
pub(crate) fn train_options(s: &Session, epoch: u64) -> LoaderOptions {
    LoaderOptions {
        epoch,
        ..s.train_options.clone()
    }
}

/// Micro-batches per epoch that are trained: whole optimizer steps only.
fn micro_per_epoch(s: &Session) -> Result<u64> {
    let steps = match &s.planned {
        Some(planned) => planned.steps(),
        None => s.sources.plan(&train_options(s, 0))?.steps(),
    } as u64;
    let micro = steps / s.cfg.accumulate as u64 * s.cfg.accumulate as u64;
    if steps == 0 {
        // Not one whole batch: the batch is at fault, not `accumulate` (which may not be given).
        let what = if s.cfg.batches().windows().is_some() {
            "windows (series_window, stride)"
        } else {
            "contexts"
        };
        let (key, problem) = match s.cfg.batches().pack().map(|p| p.tokens) {
            Some(t) => (
                "pack",
                format!("{t}: the training split's {what} fill no whole pack of {t} tokens"),
            ),
            None => (
                "batch_size",
                format!(
                    "{}: the training split has fewer {what} than one batch (whole batches \
                     only)",
                    s.cfg.batch.batch_size
                ),
            ),
        };
        return Err(OptionError::new(key, problem).into());
    }
    if micro == 0 {
        let problem = format!(
            "{}: more than the training split's {steps} full {}",
            s.cfg.accumulate,
            match s.cfg.batches().pack().map(|p| p.tokens) {
                Some(t) => format!("packs of {t} tokens"),
                None => format!("batches of {}", s.cfg.batch.batch_size),
            }
        );
        return Err(OptionError::new("accumulate", problem).into());
    }
    Ok(micro)
}

/// The fixed figures of a run's schedule.
struct Schedule {
    /// Micro-batches trained per epoch (whole optimizer steps).
    micro_epoch: u64,
    total_steps: u64,
    warmup: u64,
    ckpt_path: std::path::PathBuf,
}

/// What a run gathers over its epochs for the summary, and whether it has stopped.
struct Gathered {
    logged: Vec<StepReport>,
    totals: Totals,
    /// Training batches by sequence length: the shapes the run's steps saw.
    batch_lens: std::collections::BTreeMap<usize, u64>,
    loader: Option<dsc_loader::LoaderStats>,
    /// A mix's last progress on its weights (logged when the weights change).
    mix: Option<dsc_loader::Progress>,
    clock: Clock,
    /// `max_steps` reached.
    stopped: bool,
}

/// Trains (or continues `resume`) and returns the summary.
pub fn run(mut s: Session, resume: Option<Checkpoint>, opts: &RunOptions) -> Result<Summary> {
    std::fs::create_dir_all(&opts.out).map_err(|e| TrainError::io(&opts.out, e))?;
    check_eval_split(&s)?;
    let micro_epoch = micro_per_epoch(&s)?;
    let steps_epoch = micro_epoch / s.cfg.accumulate as u64;
    let total_steps = steps_epoch * s.cfg.epochs;
    let plan = Schedule {
        micro_epoch,
        total_steps,
        warmup: s.cfg.warmup.unwrap_or(total_steps / 20),
        ckpt_path: opts.out.join("last.ckpt"),
    };
    let mut pos = match resume {
        Some(ck) => {
            let device = s.device;
            s.load_state(|n| ck.tensor(n, device))?;
            let mut p = ck.position;
            // The saved run's configuration with what the resume may change: --epochs, and
            // a device or precision the command line named (`crate::machine`).
            p.config = s.cfg.clone();
            p
        }
        None => start_position(&s),
    };
    let log_micro = s.cfg.log_every as usize * s.cfg.accumulate;
    let mut run = Gathered {
        logged: Vec::new(),
        totals: Totals::default(),
        batch_lens: Default::default(),
        loader: None,
        mix: None,
        clock: Clock::new(if s.device.is_cuda() { log_micro } else { 0 })?,
        // A run resumed with `max_steps` at or below the steps already taken trains nothing
        // more.
        stopped: opts.max_steps.is_some_and(|m| pos.optimizer_steps >= m),
    };
    let mut stepper = Stepper::new(&s)?;
    let busy = match s.device {
        tch::Device::Cuda(i) => crate::cuda::pci_bus_id(i)
            .ok()
            .and_then(|id| crate::nvml::sample(&id)),
        _ => None,
    };
    while pos.epoch < s.cfg.epochs && !run.stopped {
        let epoch = pos.epoch;
        // A resumed epoch's mean training loss covers the batches trained since the resume.
        let first_micro = pos.micro_in_epoch;
        let epoch_totals = train_epoch(&mut s, &mut stepper, &mut pos, (&plan, opts), &mut run)?;
        run.totals.add(&epoch_totals);
        if run.stopped && pos.micro_in_epoch < micro_epoch {
            break;
        }
        let (val_loss, val_metric, train_loss) =
            validate(&mut s, &stepper.epoch_loss, micro_epoch - first_micro)?;
        let sh = epoch_totals.shares();
        let report = EpochReport {
            epoch,
            steps: steps_epoch,
            train_loss,
            val_loss,
            val_metric,
            samples_per_s: sh.samples_per_s,
            data_wait_share: sh.data_wait_share,
            h2d_share: sh.h2d_share,
            compute_share: sh.compute_share,
        };
        if !opts.quiet {
            eprintln!("{}", epoch_line(&report, s.task.metric, &s.cfg.eval_split));
        }
        pos.history.push(report);
        pos.epoch += 1;
        pos.micro_in_epoch = 0;
        pos.loader = None;
        checkpoint::write(&plan.ckpt_path, &pos, &s.state_tensors())?;
    }
    let gpu_busy = busy.and_then(crate::nvml::Busy::finish);
    save_weights(&s, &opts.out.join("model.safetensors"))?;
    // A run stopped by `max_steps` before its last epoch ended resumes later; evaluate it then.
    let evaluation = if pos.epoch < s.cfg.epochs {
        Vec::new()
    } else {
        final_evaluation(&mut s, opts.quiet)?
    };
    let mut summary = Summary::new(
        &s,
        "train",
        run.logged,
        pos.optimizer_steps,
        run.totals.shares(),
    );
    summary.epochs = pos.history;
    summary.checkpoint = Some(plan.ckpt_path.display().to_string());
    summary.eval_split = Some(s.cfg.eval_split.clone());
    summary.evaluation = evaluation;
    summary.batch_lens = run.batch_lens;
    summary.loader = run.loader;
    summary.mix = run.mix.take();
    summary.gpu_busy_nvml = gpu_busy;
    let (step, why) = stepper.describe();
    summary.step = step;
    summary.graph_unavailable = why;
    Ok(summary)
}

/// Trains the rest of epoch `pos.epoch` (or up to `max_steps`), checkpointing where asked;
/// returns the epoch's time shares.
fn train_epoch(
    s: &mut Session,
    stepper: &mut Stepper,
    pos: &mut Position,
    (plan, opts): (&Schedule, &RunOptions),
    run: &mut Gathered,
) -> Result<Totals> {
    let (epoch, micro_epoch) = (pos.epoch, plan.micro_epoch);
    // Epoch 0 from its start was planned when the session was made: not again. Any other
    // start drops that plan (and the shard order it gave a remote cache's fetcher).
    let planned = s.planned.take().filter(|_| epoch == 0);
    let loader = match (&pos.loader, planned) {
        (Some(state), _) => s
            .sources
            .loader_from_state(train_options(s, epoch), state)?,
        (None, Some(planned)) => planned.loader_at(0)?,
        (None, None) => s.sources.loader(train_options(s, epoch))?,
    };
    let bar = progress(opts.quiet, micro_epoch, epoch, s.cfg.epochs);
    bar.set_position(pos.micro_in_epoch);
    // Summed on the device by the step, read back at each window's end (in place, as a
    // captured step adds into the same tensors every replay).
    tch::no_grad(|| {
        let _ = stepper.window_loss.zero_();
        let _ = stepper.epoch_loss.zero_();
    });
    let mut epoch_totals = Totals::default();
    let mut window_steps = 0u64;
    let (ring, fill) = match &s.resident {
        Some(r) => (r.ring.clone(), Fill::Index),
        None => (s.ring.clone(), Fill::Batch),
    };
    let mix = loader.mix_tracker();
    log_mix(
        (&bar, opts.quiet),
        &mut run.mix,
        mix.at(pos.micro_in_epoch as usize),
    );
    let feed = Feed::start(loader, &ring, fill);
    let clock = &mut run.clock;
    while pos.micro_in_epoch < micro_epoch {
        let t0 = Instant::now();
        let Some(filled) = feed.next()? else { break };
        clock.waited(t0.elapsed());
        if filled.info.pack.is_none() {
            *run.batch_lens.entry(filled.info.seq_len).or_insert(0) += 1;
        }
        // A pack's sequence count is known on the host: no read-back.
        let samples = filled.info.pack.map_or(s.cfg.batch.batch_size, |p| p.seqs);
        s.seed_step(epoch * micro_epoch + pos.micro_in_epoch);
        let lr = learning_rate(s.cfg.lr, pos.optimizer_steps, plan.warmup, plan.total_steps);
        let updates = (pos.micro_in_epoch + 1).is_multiple_of(s.cfg.accumulate as u64);
        stepper.micro(s, filled, updates.then_some(lr), clock)?;
        pos.micro_in_epoch += 1;
        clock.samples(samples);
        if updates {
            pos.optimizer_steps += 1;
            window_steps += 1;
            clock.step_done()?;
            if pos.optimizer_steps.is_multiple_of(s.cfg.log_every) {
                let loss = readback::values(&stepper.window_loss, Purpose::Training)[0]
                    / window_steps as f64;
                tch::no_grad(|| {
                    let _ = stepper.window_loss.zero_();
                });
                let t = clock.close()?;
                epoch_totals.add(&t);
                let sh = t.shares();
                bar.set_message(format!(
                    "loss {loss:.4} · {:.0} samples/s · data wait {:.1}%",
                    sh.samples_per_s,
                    100.0 * sh.data_wait_share
                ));
                run.logged
                    .push(StepReport::new(pos.optimizer_steps, loss, lr, sh));
                log_mix(
                    (&bar, opts.quiet),
                    &mut run.mix,
                    mix.at(pos.micro_in_epoch as usize),
                );
                window_steps = 0;
            }
            let at_limit = opts.max_steps.is_some_and(|m| pos.optimizer_steps >= m);
            let periodic = s
                .cfg
                .checkpoint_every
                .is_some_and(|n| pos.optimizer_steps.is_multiple_of(n));
            if (at_limit || periodic) && pos.micro_in_epoch < micro_epoch {
                pos.loader = Some(loader_state(s, epoch, pos.micro_in_epoch)?);
                checkpoint::write(&plan.ckpt_path, pos, &s.state_tensors())?;
            }
            run.stopped |= at_limit;
        } else {
            clock.step_done()?;
        }
        for slot in s.release(Some(filled.slot), train_in_flight(s))? {
            feed.release(slot);
        }
        bar.inc(1);
        if run.stopped {
            break;
        }
    }
    // Drain the queued copies before the feed (and its slots) goes away.
    for slot in s.release(None, 0)? {
        feed.release(slot);
    }
    run.loader
        .get_or_insert_with(Default::default)
        .merge(&feed.stats());
    if let Some(now) = mix.at(pos.micro_in_epoch as usize) {
        run.mix = Some(now);
    }
    drop(feed);
    epoch_totals.add(&clock.close()?);
    bar.finish_and_clear();
    Ok(epoch_totals)
}

/// Keeps a mix's progress `now` in `last`, and says so above the bar when its weights change
/// (a schedule's next stage, or a linear stage's next step).
fn log_mix(
    (bar, quiet): (&indicatif::ProgressBar, bool),
    last: &mut Option<dsc_loader::Progress>,
    now: Option<dsc_loader::Progress>,
) {
    let Some(now) = now else { return };
    let changed = !quiet
        && last
            .as_ref()
            .is_none_or(|l| l.stage != now.stage || l.weights != now.weights);
    if changed {
        let line = format!(
            "mix: stage {} (from sample {}) at sample {}: weights {}",
            now.stage,
            now.at,
            now.position,
            crate::report::shares_text(&now.weights)
        );
        // A hidden bar (no terminal, --quiet) prints nothing.
        match bar.is_hidden() {
            true => eprintln!("{line}"),
            false => bar.println(line),
        }
    }
    *last = Some(now);
}

/// The loader state after `micro` batches of `epoch` (what a resumed run starts from).
fn loader_state(s: &Session, epoch: u64, micro: u64) -> Result<State> {
    Ok(State::new(&train_options(s, epoch), micro as usize)?)
}

/// `--eval-split` must name a split of the cache; only the default `val` may be absent (then
/// epochs report no validation, as a cache compiled without one has none).
fn check_eval_split(s: &Session) -> Result<()> {
    let name = &s.cfg.eval_split;
    let m = s.cache.manifest();
    let known: Vec<&str> = m.splits().iter().map(|x| x.name.as_str()).collect();
    if name == "train" {
        let problem = format!(
            "train: the split trained on says nothing about generalisation; the cache has \
             {known:?}"
        );
        return Err(OptionError::new("eval_split", problem).into());
    }
    if m.split(name).is_none() && name != crate::config::defaults::EVAL_SPLIT {
        let problem = format!("{name}: the cache has no such split (it has {known:?})");
        return Err(OptionError::new("eval_split", problem).into());
    }
    Ok(())
}

/// Sums of the per-context loss and metric over the whole of `split` (each context once), left
/// on the device as one `[2]` tensor, and the contexts summed; `None` for an empty or absent
/// split.
fn split_sums(s: &mut Session, split: &str) -> Result<Option<(Tensor, usize)>> {
    // Every cache's split once (a mix's evaluation weighs its caches by size, one pass).
    let contexts = s
        .sources
        .sources()
        .iter()
        .map(|c| c.manifest().split(split).map_or(0, |v| v.contexts))
        .sum::<usize>();
    if contexts == 0 {
        return Ok(None);
    }
    let opts = s
        .cfg
        .loader_options(s.cache.manifest(), split, 0, s.trim_multiple)?;
    let mut loss_sum = Tensor::zeros([], (Kind::Float, s.device));
    let mut metric_sum = Tensor::zeros([], (Kind::Float, s.device));
    let loader = s.sources.loader(opts)?;
    // What one pass reads: the split's contexts, or the windows cut from them.
    let contexts = loader.order().len();
    let b = s.cfg.batch.batch_size;
    let mut seen = 0usize;
    let ring = s.ring.clone();
    let feed = Feed::start(loader, &ring, Fill::Batch);
    while let Some(filled) = feed.next()? {
        // The last batch is completed with repeated contexts (packs): count the real ones only,
        // a pack's leading rows.
        let rows = match filled.info.pack {
            Some(p) if p.repeated => 0,
            Some(p) => p.seqs,
            None => (contexts - seen).min(b),
        };
        let batch = s.upload(filled, rows);
        let (l, m) = s.evaluate(&batch);
        let (l, m) = (l.narrow(0, 0, rows as i64), m.narrow(0, 0, rows as i64));
        drop(batch);
        tch::no_grad(|| {
            let _ = loss_sum.g_add_(&l.sum(Kind::Float));
            let _ = metric_sum.g_add_(&m.sum(Kind::Float));
        });
        seen += rows;
        for slot in s.release(Some(filled.slot), IN_FLIGHT)? {
            feed.release(slot);
        }
    }
    for slot in s.release(None, 0)? {
        feed.release(slot);
    }
    Ok(Some((Tensor::stack(&[loss_sum, metric_sum], 0), seen)))
}

/// Loss and metric over the whole `--eval-split`, and the epoch's mean training loss over its
/// `trained` micro-batches, read back together in one transfer.
fn validate(
    s: &mut Session,
    epoch_loss: &Tensor,
    trained: u64,
) -> Result<(Option<f64>, Option<f64>, f64)> {
    let accumulate = s.cfg.accumulate as f64;
    let train_loss = |v: f64| v * accumulate / trained.max(1) as f64;
    let split = s.cfg.eval_split.clone();
    let Some((sums, seen)) = split_sums(s, &split)? else {
        let v = readback::values(epoch_loss, Purpose::Other)[0];
        return Ok((None, None, train_loss(v)));
    };
    let v = readback::values(
        &Tensor::cat(&[sums, epoch_loss.reshape([1])], 0),
        Purpose::Other,
    );
    let n = seen.max(1) as f64;
    Ok((Some(v[0] / n), Some(v[1] / n), train_loss(v[2])))
}

/// The final model on every split but train: what a held-out test split is for.
fn final_evaluation(s: &mut Session, quiet: bool) -> Result<Vec<SplitEvaluation>> {
    let splits: Vec<String> = s
        .cache
        .manifest()
        .splits()
        .iter()
        .filter(|x| x.name != "train")
        .map(|x| x.name.clone())
        .collect();
    let mut out = Vec::new();
    for split in splits {
        let Some((sums, seen)) = split_sums(s, &split)? else {
            continue;
        };
        let v = readback::values(&sums, Purpose::Other);
        let n = seen.max(1) as f64;
        let e = SplitEvaluation {
            split,
            contexts: seen,
            loss: v[0] / n,
            metric: v[1] / n,
        };
        if !quiet {
            let what = if s.cfg.batches().windows().is_some() {
                "windows"
            } else {
                "contexts"
            };
            eprintln!(
                "final model · {} ({} {what}) · loss {:.4} · {} {:.4}",
                e.split, e.contexts, e.loss, s.task.metric, e.metric
            );
        }
        out.push(e);
    }
    Ok(out)
}

/// The position at the start of a run of `s`.
fn start_position(s: &Session) -> Position {
    Position::start(
        s.cfg.clone(),
        s.cache.manifest().inputs().fingerprint.clone(),
        crate::checkpoint::content_of(s.sources.sources().iter().map(|c| c.manifest())),
    )
}

/// Saves the weights alone, for inference and other tools.
fn save_weights(s: &Session, path: &Path) -> Result<()> {
    checkpoint::write(path, &start_position(s), &named_weights(&s.vs))
}

fn epoch_line(r: &EpochReport, metric: &str, split: &str) -> String {
    let val = match (r.val_loss, r.val_metric) {
        (Some(l), Some(m)) => format!("{split} loss {l:.4} · {metric} {m:.4}"),
        _ => format!("no {split} split"),
    };
    format!(
        "epoch {} · train loss {:.4} · {val} · {:.0} samples/s · data wait {:.2}% · h2d {:.2}% · compute {:.1}%",
        r.epoch,
        r.train_loss,
        r.samples_per_s,
        100.0 * r.data_wait_share,
        100.0 * r.h2d_share,
        100.0 * r.compute_share
    )
}

fn progress(quiet: bool, len: u64, epoch: u64, epochs: u64) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(format!("epoch {}/{}", epoch + 1, epochs));
    bar
}
