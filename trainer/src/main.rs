//! `dsc-train`: the reference training loop on a dsc cache. The command line over the
//! `dsc_train` library: flags in, a run or a diagnostic, a summary out.

mod args;

use anyhow::{bail, Context};
use clap::Parser;
use dsc_format::spelling::{spell, Spelling};
use dsc_train::{alloc, checkpoint, cuda, device, diag, machine, session, train};
use serde::Serialize;
use std::process::ExitCode;
use tch::Device;

const EXIT_FAILED: u8 = 1;
const EXIT_ERROR: u8 = 2;

fn main() -> ExitCode {
    // Before any tch call: see `cuda` and `alloc`.
    alloc::reuse_freed_memory();
    let cuda = cuda::load_torch_cuda();
    let cli = args::Cli::parse();
    // Every cache this process opens, the resumed run's included, reads these (before any
    // thread starts: the environment is the process's).
    if let Some(dir) = &cli.cache_dir {
        std::env::set_var("DSC_CACHE_DIR", dir);
    }
    if let Some(limit) = &cli.cache_limit {
        std::env::set_var("DSC_CACHE_LIMIT", limit);
    }
    match run(cli, &cuda) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            // The library names options by their keys; the command line spells them as flags.
            eprintln!("dsc-train: {}", spell(&format!("{e:#}"), Spelling::Cli));
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn run(cli: args::Cli, cuda: &cuda::CudaLoad) -> anyhow::Result<u8> {
    cli.refuse_old_spellings()?;
    if let Some(n) = cli.torch_threads {
        tch::set_num_threads(n);
    }
    let (mut cfg, resume) = match &cli.resume {
        Some(path) => {
            let (cfg, ck) = resumed(&cli, path)?;
            (cfg, Some(ck))
        }
        None => (cli.run_config()?, None),
    };
    // A resumed run asks for the device its run chose, unless the command line names one.
    let recorded = cfg.device.clone();
    let want = machine::device_wanted(cli.device.as_deref(), recorded.as_deref());
    let device = device::choose(want, cuda).with_context(|| match (&recorded, &cli.device) {
        (Some(r), None) => format!(
            "the checkpoint's run trained on {r}; pass --device cpu (or another) to continue \
             it there"
        ),
        _ => "choosing the device".into(),
    })?;
    if let Device::Cuda(i) = device {
        cuda::set_device(i).map_err(anyhow::Error::msg)?;
    }
    // A new run whose command line left --graph open lets the machine choose it.
    let graph_open = resume.is_none() && cli.graph_asked().is_none();
    for c in machine::settle(
        &mut cfg,
        &device::name(device),
        device.is_cuda(),
        cli.amp,
        graph_open,
    ) {
        eprintln!(
            "dsc-train: resuming with {} {} (the checkpoint's run had {}), as the command \
             line asks",
            c.setting, c.now, c.recorded
        );
    }
    if !cli.json {
        eprintln!(
            "dsc-train on {} · cache {}{}",
            device::describe(device),
            std::iter::once(&cfg.cache)
                .chain(&cfg.mix)
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" + "),
            match (cfg.mixing.weights.as_deref(), &cfg.mixing.schedule) {
                _ if cfg.mix.is_empty() => String::new(),
                (_, Some(s)) => format!(" (a schedule of {} stages)", s.0.len()),
                (None, None) => " (weighed by size)".into(),
                (Some(w), None) => format!(" (weights {w:?})"),
            }
        );
    }
    if cli.find_batch_size {
        let report = diag::find_batch_size(&cfg, device, cli.max_batch_size);
        emit(&cli, &report)?;
        return Ok(if report.largest.is_some() {
            0
        } else {
            EXIT_FAILED
        });
    }
    let slots = cfg.host_buffers + 2;
    if cli.overfit_batch {
        let mut cfg = cfg;
        cfg.accumulate = 1;
        let s = session::Session::new(cfg, device, slots)?;
        let summary = diag::overfit_batch(s, cli.overfit_steps)?;
        emit(&cli, &summary)?;
        return Ok(if summary.overfit_passed == Some(true) {
            0
        } else {
            EXIT_FAILED
        });
    }
    let s = session::Session::new(cfg, device, slots)?;
    if !cli.json {
        eprintln!(
            "{:?} with {} parameters · task {:?} ({} → {}) · amp {:?} · step {}",
            s.cfg.model,
            s.parameters(),
            s.cfg.task,
            s.task.column_names.join(","),
            s.task.metric,
            s.amp,
            match (s.cfg.graph, s.cfg.shape.trim_multiple) {
                (true, _) => "captured as CUDA graphs (--graph; uncaptured without CUDA)",
                (false, Some(_)) => "eager, trimmed batches",
                (false, None) => "eager",
            }
        );
    }
    let out = cli.out_dir();
    let opts = train::RunOptions {
        out: out.clone(),
        max_steps: cli.max_steps,
        quiet: cli.json,
    };
    let summary = train::run(s, resume, &opts)?;
    let text = serde_json::to_string_pretty(&summary)?;
    std::fs::write(out.join("summary.json"), &text)
        .with_context(|| format!("writing {}", out.join("summary.json").display()))?;
    emit(&cli, &summary)?;
    if !cli.json {
        print_done(&summary);
    }
    Ok(0)
}

fn emit<T: Serialize>(cli: &args::Cli, value: &T) -> anyhow::Result<()> {
    if cli.json {
        println!("{}", serde_json::to_string_pretty(value)?);
    }
    Ok(())
}

/// The manifests of the caches a run reads, each at the run's generation of it.
fn read_manifests(cfg: &dsc_train::RunConfig) -> anyhow::Result<Vec<dsc_format::Manifest>> {
    std::iter::once(&cfg.cache)
        .chain(&cfg.mix)
        .enumerate()
        .map(|(i, path)| {
            Ok(dsc_loader::read_meta(path, &cfg.open_options(i)?)
                .with_context(|| format!("opening the cache {}", path.display()))?
                .0)
        })
        .collect()
}

/// Whether `e` says that the cache holds no generation of the content id asked for.
fn no_generation(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<dsc_loader::LoadError>(),
            Some(dsc_loader::LoadError::Format(
                dsc_format::FormatError::NoGeneration { .. }
            ))
        )
    })
}

/// The run configuration and checkpoint of `--resume PATH`, checked against the caches it
/// read, with what the command line may change on a resume (`--epochs`, `--graph`,
/// `--no-graph`).
fn resumed(
    cli: &args::Cli,
    path: &std::path::Path,
) -> anyhow::Result<(dsc_train::config::RunConfig, checkpoint::Checkpoint)> {
    let ck = checkpoint::Checkpoint::read(path)?;
    let mut cfg = ck.position.config.clone();
    // The generations the run read, whatever was appended since: the saved position
    // counts in their order.
    if let Some(content) = &ck.position.cache_content {
        cfg.generation = Some(content.clone());
    }
    // The same rules as the command line: a checkpoint is a file anyone can edit.
    cfg.validate()
        .with_context(|| format!("{}: the saved run configuration", path.display()))?;
    // Before anything reads the cache: a resumed run must see the same data, in the
    // same shards (a recompile with another --seed or --shard-size keeps the inputs'
    // fingerprint but not the order the saved position counts in).
    let manifests = match read_manifests(&cfg) {
        // No generation of the cache holds what the run read: the checks below say
        // what changed (other inputs, another seed) on its last generation.
        Err(e) if no_generation(&e) => {
            cfg.generation = None;
            read_manifests(&cfg)?
        }
        other => other?,
    };
    let manifest = manifests[0].clone();
    let content = checkpoint::content_of(&manifests);
    let stored = checkpoint::stored_content_of(&manifests);
    let now = &manifest.inputs().fingerprint;
    if *now != ck.position.cache_fingerprint {
        bail!(
            "the cache {} was compiled from other inputs (fingerprint {now}) than when \
             {} was written ({}); resume on the same cache",
            cfg.cache.display(),
            path.display(),
            ck.position.cache_fingerprint
        );
    }
    match &ck.position.cache_content {
        // Compressed or hot, the same shards: `dsc compress` keeps the content id.
        Some(then) if *then != content && *then != stored => bail!(
            "the cache {} holds other shards (content {content}) than when {} was \
             written ({then}): it was recompiled from the same inputs with another \
             --seed, --shard-size or option, so the saved position would continue a \
             different order; resume on the cache the run started on, or start a new run",
            std::iter::once(&cfg.cache)
                .chain(&cfg.mix)
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" + "),
            path.display()
        ),
        Some(_) => {}
        None => eprintln!(
            "dsc-train: {} predates content checks: resuming on the inputs' \
             fingerprint alone (a recompile with another seed would not be noticed)",
            path.display()
        ),
    }
    if let Some(e) = cli.epochs {
        cfg.epochs = e;
    }
    // A schedule given again amends the run's: the loader takes the stages that start after
    // the saved position and refuses one that would change what was trained.
    if let Some(schedule) = &cli.mix_args.schedule {
        eprintln!("dsc-train: resuming with the schedule of --schedule (its stages past the saved position apply)");
        cfg.mixing.schedule = Some(schedule.clone());
        cfg.mixing.weights = None;
    }
    // How the step is launched, not what it computes: a resume may capture it, or
    // run it eagerly.
    if cli.graph && !cfg.graph {
        eprintln!("dsc-train: resuming with the step captured (--graph)");
        cfg.graph = true;
        cfg.shape.trim_multiple = None;
        cfg.shape.trim = false;
    }
    if cli.no_graph && cfg.graph {
        eprintln!("dsc-train: resuming with the step eager (--no-graph)");
        cfg.graph = false;
    }
    Ok((cfg, ck))
}

/// The closing lines of a run on standard error: throughput and time shares, GPU busy, the
/// loader's counts, the batch shapes seen.
fn print_done(summary: &dsc_train::report::Summary) {
    let t = summary.total;
    eprintln!(
        "done: {} optimizer steps · {:.0} samples/s · data wait {:.2}% · h2d {:.2}% · compute {:.1}% · {} loss reads in training · {}",
        summary.optimizer_steps,
        t.samples_per_s,
        100.0 * t.data_wait_share,
        100.0 * t.h2d_share,
        100.0 * t.compute_share,
        summary.readbacks.training,
        summary.checkpoint.as_deref().unwrap_or("")
    );
    if let Some(busy) = summary.gpu_busy_nvml {
        eprintln!(
            "GPU busy {:.0}% (NVML, while training; the compute share above is the \
             trainer's own event split, not GPU busy)",
            100.0 * busy
        );
    }
    if let Some(m) = &summary.mix {
        let show = dsc_train::report::shares_text;
        eprintln!(
            "mix: stage {} (from sample {}) · weights {} · realised in the stage {} ({} samples)",
            m.stage,
            m.at,
            show(&m.weights),
            show(&m.realised),
            m.drawn.iter().sum::<u64>()
        );
    }
    if let Some(l) = &summary.loader {
        let reads = if l.shard_reads > 0 {
            format!(
                " · {} compressed shards read ({:.1} MB), {} hits, {} evictions",
                l.shard_reads,
                l.stored_bytes_read as f64 / 1e6,
                l.shard_hits,
                l.shard_evictions
            )
        } else {
            String::new()
        };
        eprintln!(
            "loader: {} batches · {:.1} MB · the step found none ready {} times ({:.2} s) · \
             {:.1} ready ahead on average{reads}",
            l.batches,
            l.bytes as f64 / 1e6,
            l.waits,
            l.wait_s,
            l.queue_mean()
        );
    }
    if summary.batch_lens.len() > 1 {
        let lens: Vec<String> = summary.batch_lens.keys().map(|l| l.to_string()).collect();
        eprintln!(
            "batch shapes: {} sequence lengths ({}){}",
            lens.len(),
            lens.join(", "),
            if summary.batch_lens.len() > 16 {
                "; --trim-multiple 16 rounds them to a few"
            } else {
                ""
            }
        );
    }
}
