//! `dsc order`: the loader's order for an epoch, as keys, a quality report or a resume state.

use crate::args::OrderArgs;
use crate::output::{bold, bytes, outln};
use anyhow::Context as _;
use dsc_loader::args::{LoaderArgs, ShapeArgs};
use dsc_loader::order::Order;
use dsc_loader::order::{Padding, Quality};
use dsc_loader::pack::PackFigures;
use dsc_loader::{Batches, Cache, Loader, LoaderOptions, Mix, OrderSpec, State};
use serde::Serialize;

#[derive(Serialize)]
struct Report {
    split: String,
    epoch: u64,
    seed: u64,
    shuffle: bool,
    bucket: bool,
    batch_size: usize,
    world_size: usize,
    batches_per_rank: usize,
    contexts: usize,
    /// With --pack: the packs' figures (token efficiency, …); `figures` are then those of
    /// padded batches of --batch-size over the same epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pack: Option<PackFigures>,
    #[serde(flatten)]
    figures: Figures,
    window_bytes: u64,
    /// With --bucket: the same epoch without bucketing, for comparison.
    #[serde(skip_serializing_if = "Option::is_none")]
    unbucketed: Option<Figures>,
    /// With --pack: the same epoch in length-bucketed batches of --batch-size.
    #[serde(skip_serializing_if = "Option::is_none")]
    bucketed: Option<Figures>,
    /// With several caches: each one's share of the epoch.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    mix: Vec<MixShare>,
    /// With --schedule: each stage's realised shares over the run up to this epoch's end.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stages: Vec<StageReport>,
    /// With --series-window: the windows (`contexts` then counts windows).
    #[serde(skip_serializing_if = "Option::is_none")]
    series: Option<dsc_loader::SeriesWindows>,
}

/// One cache of a mix: what it was asked for and what the epoch holds of it.
#[derive(Serialize)]
struct MixShare {
    cache: String,
    /// Its weight, normalised (with a schedule: its target share of this epoch).
    weight: f64,
    /// Contexts of its split.
    contexts: usize,
    /// Its positions in the epoch.
    drawn: usize,
    /// `drawn` ÷ the epoch's positions.
    share: f64,
    /// Its own epochs the mix has read so far by the end of this one (a cache drawn beyond its
    /// size continues with its next epoch).
    passes: f64,
}

/// Each cache's share of a mix's epoch.
fn shares(loader: &Loader, paths: &[std::path::PathBuf]) -> anyhow::Result<Vec<MixShare>> {
    let Order::Mix(order) = loader.order() else {
        return Ok(Vec::new());
    };
    let o = &loader.options().order;
    let sources = loader.sources();
    let mut sizes = Vec::new();
    for cache in &sources {
        // The contexts its readers see (a generation may hide some).
        sizes.push(cache.contexts(&o.split)?.len());
    }
    let schedule = order.schedule();
    let epoch = loader.options().epoch;
    // The epoch's target: each segment's positions times its weights (fixed weights: the
    // weights as given, normalised).
    let weights: Vec<f64> = if !o.schedule.is_empty() {
        let share = schedule.shares(epoch..epoch + 1);
        let mut target = vec![0.0; sizes.len()];
        for stage in &share {
            for (t, x) in target.iter_mut().zip(&stage.target) {
                *t += x / order.len().max(1) as f64;
            }
        }
        target
    } else {
        let weights: Vec<f64> = if o.weights.is_empty() {
            sizes.iter().map(|&n| n as f64).collect()
        } else {
            o.weights.clone()
        };
        // Scaled by the largest first: equal weights of 1e308 summed to infinity and printed
        // as `weight 0.0000`.
        let largest = weights
            .iter()
            .copied()
            .fold(0.0f64, f64::max)
            .max(f64::MIN_POSITIVE);
        let weights: Vec<f64> = weights.iter().map(|w| w / largest).collect();
        let sum: f64 = weights.iter().sum();
        weights.iter().map(|w| w / sum).collect()
    };
    let (start, end) = (order.draws_before(0), order.draws_before(order.len()));
    let total = order.len().max(1) as f64;
    Ok(paths
        .iter()
        .zip(weights)
        .zip(sizes)
        .zip(start.into_iter().zip(end))
        .map(|(((path, weight), contexts), (start, end))| {
            let drawn = (end - start) as usize;
            MixShare {
                cache: path.display().to_string(),
                weight,
                contexts,
                drawn,
                share: drawn as f64 / total,
                passes: end as f64 / contexts.max(1) as f64,
            }
        })
        .collect())
}

/// One stage of a mix's schedule over the run up to the end of the epoch shown.
#[derive(Serialize)]
struct StageReport {
    /// Its index in the schedule.
    stage: usize,
    /// The position it starts at.
    at: u64,
    /// Reached linearly from the previous stage's weights.
    linear: bool,
    /// Its weights, normalised.
    weights: Vec<f64>,
    /// Its positions up to the end of the epoch shown (with a linear stage after it: the span
    /// of that stage's ramp).
    positions: u64,
    /// Each cache's share of those positions, as drawn.
    realised: Vec<f64>,
    /// Each cache's share, as its blocks' weights ask.
    target: Vec<f64>,
    /// The largest |drawn - target| of a cache over the stage, in positions.
    largest_gap: f64,
}

/// The stages of a mix's schedule over epochs 0 to the one shown: what each drew.
fn stages(loader: &Loader) -> Vec<StageReport> {
    let Order::Mix(order) = loader.order() else {
        return Vec::new();
    };
    let o = &loader.options().order;
    if o.schedule.is_empty() {
        return Vec::new();
    }
    let epoch = loader.options().epoch;
    order
        .schedule()
        .shares(0..epoch + 1)
        .into_iter()
        .map(|share| {
            let stage = &o.schedule[share.stage];
            let sum: f64 = stage.weights.iter().sum();
            let n = share.positions.max(1) as f64;
            StageReport {
                stage: share.stage,
                at: stage.at,
                linear: stage.linear,
                weights: stage.weights.iter().map(|w| w / sum).collect(),
                positions: share.positions,
                realised: share.realised.iter().map(|&d| d as f64 / n).collect(),
                target: share.target.iter().map(|t| t / n).collect(),
                largest_gap: share
                    .realised
                    .iter()
                    .zip(&share.target)
                    .map(|(&d, t)| (d as f64 - t).abs())
                    .fold(0.0, f64::max),
            }
        })
        .collect()
}

/// Shuffle quality and padding of one epoch order.
#[derive(Serialize)]
struct Figures {
    #[serde(flatten)]
    quality: Quality,
    #[serde(flatten)]
    padding: Padding,
}

fn figures(loader: &Loader) -> anyhow::Result<Figures> {
    let o = loader.options();
    Ok(Figures {
        quality: loader.order().quality(o.batch_size * o.world_size),
        padding: loader.padding()?,
    })
}

/// The figures of the same epoch as `opts` in padded batches of `batch_size`, bucketed or not,
/// trimmed up the ladder of `multiple`.
fn padded_figures(
    mix: &Mix,
    opts: &LoaderOptions,
    bucket: bool,
    multiple: usize,
) -> anyhow::Result<Figures> {
    let padded = mix.loader(LoaderOptions {
        order: OrderSpec {
            batches: if bucket {
                Batches::Bucketed
            } else {
                Batches::Padded
            },
            ..opts.order.clone()
        },
        trim: Some(multiple),
        ..opts.clone()
    })?;
    figures(&padded)
}

/// What a shape of batches is, in words.
fn describe(batches: &Batches) -> String {
    match batches {
        Batches::Padded => "padded batches of whole contexts".into(),
        Batches::Bucketed => "length-bucketed batches".into(),
        Batches::Packed(p) => match p.max_seqs {
            Some(s) => format!("packs of {} tokens, at most {s} sequences", p.tokens),
            None => format!("packs of {} tokens", p.tokens),
        },
        Batches::Windows(w) => format!(
            "windows of {} steps every {} steps, horizon {}{}{}",
            w.len,
            w.stride,
            w.horizon,
            if w.horizon_columns.is_empty() {
                String::new()
            } else {
                format!(" of {}", w.horizon_columns.join(","))
            },
            if w.pad { ", padded" } else { ", whole" }
        ),
    }
}

/// The content ids a state file records (one per cache of a mix), if it records them.
fn state_content(path: &std::path::Path) -> anyhow::Result<Option<Vec<String>>> {
    let text = crate::side_file::read_text(path, "state file")?;
    let written: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a loader state", path.display()))?;
    Ok(written
        .get("content_id")
        .and_then(|v| v.as_str())
        .map(|id| id.split('+').map(str::to_string).collect()))
}

/// The state in `path`, checked to continue these caches with what the flags ask: a state's
/// order continues as it was, so flags that ask for another are refused rather than ignored.
fn read_state(
    path: &std::path::Path,
    mix: &Mix,
    asked: &OrderSpec,
    a: &OrderArgs,
) -> anyhow::Result<State> {
    let text = crate::side_file::read_text(path, "state file")?;
    let state: State = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a loader state", path.display()))?;
    // A state Python wrote names the data it was taken over (a mix's joined by +): it
    // resumes those caches, in that order, or none.
    let written: serde_json::Value = serde_json::from_str(&text)?;
    if let Some(id) = written.get("content_id").and_then(|v| v.as_str()) {
        let ids = |f: fn(&dsc_format::Manifest) -> String| -> Vec<String> {
            mix.sources().iter().map(|c| f(c.manifest())).collect()
        };
        let here = ids(dsc_format::Manifest::content_id);
        // A state of a compressed cache written before the content id left storage out.
        let stored = ids(dsc_format::Manifest::stored_id);
        anyhow::ensure!(
            id == here.join("+") || id == stored.join("+"),
            "--from-state {}: that state was taken over other data (content id {id}, these \
             caches' {}): it resumes the caches it was taken over, in their order",
            path.display(),
            here.join("+")
        );
    }
    let o = &state.order;
    // --weights or --schedule amend the state's schedule past its position: the loader checks.
    anyhow::ensure!(
        a.mix.mix_samples.is_none() || a.mix.mix_samples == o.mix_samples,
        "--mix-samples with --from-state {}: that state's is {:?} (drop --mix-samples; the \
         state's order continues)",
        path.display(),
        o.mix_samples
    );
    // Flags that leave a part of the shape to its default (`--pack T` without `--max-seqs`)
    // ask for whatever the state chose there.
    let same = match (&asked.batches, &o.batches) {
        (Batches::Packed(a), Batches::Packed(s)) => {
            a.tokens == s.tokens && a.max_seqs.is_none_or(|m| Some(m) == s.max_seqs)
        }
        (a, s) => a == s,
    };
    if let Some(key) = asked.batches.key() {
        anyhow::ensure!(
            same,
            "--{} with --from-state {}: that state is of {}, the flags ask for {} (drop the \
             flags of the shape; the state's order continues)",
            key.replace('_', "-"),
            path.display(),
            describe(&o.batches),
            describe(&asked.batches)
        );
    }
    Ok(state)
}

pub fn run(a: OrderArgs) -> anyhow::Result<u8> {
    let mut caches = Vec::new();
    let remote = a.remote.options_at(&a.at)?;
    // A state names the generations it read: a resume opens them, whatever was appended since.
    let read = match &a.from_state {
        Some(path) => state_content(path)?,
        None => None,
    };
    for (i, path) in a.caches.iter().enumerate() {
        let mut at = remote.clone();
        if let Some(ids) = read.as_ref().filter(|ids| ids.len() == a.caches.len()) {
            at.generation = dsc_format::GenerationRef::Id(ids[i].clone());
        }
        let opened = match Cache::open_with(path, &at) {
            // No generation holds what the state read: the caches as asked, which the state's
            // check then names as other data.
            Err(dsc_loader::LoadError::Format(dsc_format::FormatError::NoGeneration {
                ..
            })) => Cache::open_with(path, &remote),
            other => other,
        };
        caches.push(opened?);
    }
    let cache = caches[0].clone();
    let mix = Mix::new(caches)?;
    // The report's padding figures are those of batches trimmed up the ladder asked for.
    let multiple = a.shape.trim_multiple.unwrap_or(1);
    let args = LoaderArgs {
        epoch: a.epoch.clone(),
        shape: ShapeArgs {
            trim: !(a.shape.pack.is_some() || a.shape.series_window.is_some()),
            ..a.shape.clone()
        },
        mix: a.mix.clone(),
        batch: a.batch.clone(),
        rank: a.rank.clone(),
        threads: 0,
        ..LoaderArgs::default()
    };
    let mut opts = args.options(1)?;
    let mut loader = match &a.from_state {
        Some(path) => {
            let state = read_state(path, &mix, &opts.order, &a)?;
            // The state's shape continues: its batches are trimmed if they have padding.
            opts.trim = state.order.batches.is_padded().then_some(multiple);
            mix.loader_from_state(opts, &state)?
        }
        None => mix.loader(opts)?,
    };
    if let Some(n) = a.state_after {
        for _ in 0..n {
            if loader.next().transpose()?.is_none() {
                break;
            }
        }
        crate::output::print_json(&loader.state())?;
        return Ok(0);
    }
    if a.keys {
        print_keys(&mut loader, a.json)?;
        return Ok(0);
    }
    let report = report(&loader, &mix, &cache, multiple, &a.caches)?;
    if a.json {
        crate::output::print_json(&report)?;
    } else {
        print_report(&report)?;
    }
    Ok(0)
}

/// The keys of each batch, one batch per line (a series window as KEY:START), or as JSON.
fn print_keys(loader: &mut Loader, json: bool) -> anyhow::Result<()> {
    // A state's order continues with its own windows, or none: print what it yields.
    let windows = loader.order().series().is_some();
    let mut all = Vec::new();
    for batch in loader {
        let batch = batch?;
        let keys = batch.keys();
        let line: Vec<String> = if windows {
            // A window is its context's key and its first step.
            let starts: Vec<i64> = batch
                .tensor("start")
                .map(|t| t.bytes().to_vec())
                .unwrap_or_default()
                .chunks_exact(4)
                .map(|c| i64::from(i32::from_le_bytes(c.try_into().expect("4 bytes"))))
                .collect();
            let pairs: Vec<[i64; 2]> = keys.into_iter().zip(starts).map(|(k, s)| [k, s]).collect();
            if json {
                all.push(serde_json::to_value(&pairs)?);
                continue;
            }
            pairs.iter().map(|[k, s]| format!("{k}:{s}")).collect()
        } else {
            if json {
                all.push(serde_json::to_value(&keys)?);
                continue;
            }
            keys.iter().map(ToString::to_string).collect()
        };
        outln!("{}", line.join(" "));
    }
    if json {
        crate::output::print_json(&all)?;
    }
    Ok(())
}

/// The shuffle quality and padding of `loader`'s epoch over `mix` (with packs: the packs'
/// figures beside those of padded and bucketed batches), its windows and its mix's shares.
fn report(
    loader: &Loader,
    mix: &Mix,
    cache: &Cache,
    multiple: usize,
    paths: &[std::path::PathBuf],
) -> anyhow::Result<Report> {
    let order = loader.order();
    // The report's figures are computed over every position of the epoch (about 48 bytes
    // each): a mix of 10^9 positions aborted on a 40 GB allocation.
    let limit = dsc_format::system::memory_limit() / 2;
    if (order.len() as u64).saturating_mul(48) > limit {
        anyhow::bail!(
            "an epoch of {} positions: its report needs more than half of this machine's \
             memory ({}); --keys and --state-after stream it (or give a smaller --mix-samples)",
            order.len(),
            dsc_format::spec::format_size(limit * 2)
        );
    }
    let opts = loader.options().clone();
    let unbucketed = if order.is_bucketed() {
        Some(padded_figures(mix, &opts, false, multiple)?)
    } else {
        None
    };
    let (figures, pack, bucketed) = match loader.packs() {
        Some(packs) => {
            let lengths = mix.lengths(&opts.order.split)?;
            let max_len = mix.sources().iter().map(|c| c.manifest().max_len()).max();
            let pack = packs.figures(order, &lengths, max_len.unwrap_or(0));
            let mut padded = padded_figures(mix, &opts, false, multiple)?;
            // The packs' global batch in contexts, for the shuffle quality.
            padded.quality = order.quality(
                ((pack.sequences_per_pack * opts.world_size as f64).round() as usize).max(1),
            );
            // A mix is not bucketed (buckets are cut from one cache's windows).
            let bucketed = match order {
                Order::One(_) => Some(padded_figures(mix, &opts, true, multiple)?),
                Order::Mix(_) | Order::Series(_) => None,
            };
            (padded, Some(pack), bucketed)
        }
        None => (figures(loader)?, None, None),
    };
    let per_context = cache.manifest().bytes_per_context() as u64;
    Ok(Report {
        split: opts.order.split.clone(),
        epoch: loader.options().epoch,
        seed: loader.options().order.seed,
        shuffle: loader.options().order.shuffle,
        bucket: order.is_bucketed(),
        batch_size: opts.batch_size,
        world_size: opts.world_size,
        batches_per_rank: loader.steps(),
        contexts: order.len(),
        pack,
        bucketed,
        // The window being read, the one before (released when the next begins) and the one
        // read ahead.
        window_bytes: 3 * figures.quality.window.min(order.len()) as u64 * per_context,
        figures,
        unbucketed,
        mix: shares(loader, paths)?,
        stages: stages(loader),
        series: order.series().cloned(),
    })
}

/// The report for a person.
fn print_report(report: &Report) -> anyhow::Result<()> {
    outln!(
        "{} split {} epoch {} seed {}{}: {} {}, {} batches per rank ({} x {} ranks)",
        bold("order"),
        report.split,
        report.epoch,
        report.seed,
        if report.shuffle { "" } else { " (cache order)" },
        report.contexts,
        if report.series.is_some() {
            "windows"
        } else {
            "contexts"
        },
        report.batches_per_rank,
        match report.pack {
            Some(_) => "one pack".to_string(),
            None => report.batch_size.to_string(),
        },
        report.world_size
    );
    if let Some(p) = &report.pack {
        outln!(
            "{}: {} tokens a pack, at most {} sequences; {} packs, {} trained ({} per rank)",
            bold("packed"),
            p.tokens,
            p.max_seqs,
            p.packs,
            p.packs_trained,
            report.batches_per_rank
        );
        outln!(
            "packed: token efficiency {:.4} (stored tokens ÷ tokens of the packs trained); \
             {:.1} sequences a pack, {:.3} of the sequence slots used",
            p.token_efficiency,
            p.sequences_per_pack,
            p.sequence_slot_use
        );
        outln!(
            "packed: {} contexts left out past the last step; {} packs closed by the sequence \
             limit",
            p.contexts_left_out,
            p.closed_by_sequence_limit
        );
        outln!(
            "the same epoch in batches of {} (token efficiency of padded batches is their \
             padding efficiency):",
            report.batch_size
        );
    }
    for m in &report.mix {
        outln!(
            "{} {}: weight {:.4}, {} of {} positions, share {:.4}; {:.2} passes over its {} \
             contexts by the end of this epoch",
            bold("mix"),
            m.cache,
            m.weight,
            m.drawn,
            report.contexts,
            m.share,
            m.passes,
            m.contexts
        );
    }
    for s in &report.stages {
        let shares = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.4}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        outln!(
            "{} {} from {}{}: {} positions so far, drawn {} for a target of {} (largest gap \
             {:.2} positions)",
            bold("stage"),
            s.stage,
            s.at,
            if s.linear { " (linear)" } else { "" },
            s.positions,
            shares(&s.realised),
            shares(&s.target),
            s.largest_gap
        );
    }
    print_figures(&report.figures, if report.bucket { "bucketed" } else { "" })?;
    if let Some(plain) = &report.unbucketed {
        print_figures(plain, "plain")?;
    }
    if let Some(bucketed) = &report.bucketed {
        outln!(
            "bucketed: padding efficiency {:.3}; mean batch length {:.1}",
            bucketed.padding.padding_efficiency,
            bucketed.padding.mean_batch_len
        );
    }
    outln!(
        "window {} contexts: about {} resident while reading",
        report.figures.quality.window,
        bytes(report.window_bytes)
    );
    Ok(())
}

fn print_figures(f: &Figures, label: &str) -> anyhow::Result<()> {
    let (q, p) = (&f.quality, &f.padding);
    let label = if label.is_empty() {
        String::new()
    } else {
        format!("{label}: ")
    };
    outln!(
        "{label}distinct shards per global batch {:.2} (of {} shards)",
        q.distinct_shards_per_batch,
        q.shards
    );
    outln!(
        "{label}neighbour-distance entropy {:.3} bits; a uniform shuffle gives {:.3} ({:.1}%)",
        q.neighbour_entropy,
        q.uniform_entropy,
        if q.uniform_entropy > 0.0 {
            100.0 * q.neighbour_entropy / q.uniform_entropy
        } else {
            0.0
        }
    );
    outln!(
        "{label}padding efficiency {:.3} trimmed, {:.3} untrimmed; mean batch length {:.1}",
        p.padding_efficiency,
        p.padding_efficiency_untrimmed,
        p.mean_batch_len
    );
    outln!(
        "{label}length spread in a batch {:.3} of the split's (random batches: about 1)",
        p.length_spread_in_batch
    );
    let shapes: Vec<String> = p
        .batch_lens
        .iter()
        .map(|(len, n)| format!("{len} ({n})"))
        .collect();
    outln!(
        "{label}batch lengths: {} shapes: {}",
        shapes.len(),
        abbreviate(&shapes, 6)
    );
    Ok(())
}

/// The first `keep` items, then how many more.
fn abbreviate(items: &[String], keep: usize) -> String {
    if items.len() <= keep {
        return items.join(", ");
    }
    format!(
        "{}, … {} more",
        items[..keep].join(", "),
        items.len() - keep
    )
}
