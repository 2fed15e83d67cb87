//! `dsc bench`: loader throughput against memcpy of the same bytes, in one run.

use crate::args::BenchArgs;
use crate::output::{bold, outln};
use dsc_loader::args::MixArgs;
use dsc_loader::{
    Batches, Cache, LoadError, Loader, LoaderOptions, LoaderStats, Mix, OrderSpec, Pack,
};
use serde::Serialize;
use std::time::Instant;

#[derive(Serialize)]
struct Report {
    cache: std::path::PathBuf,
    split: String,
    contexts: usize,
    /// Each pass is the fastest of this many epochs.
    repeat: usize,
    batch_size: usize,
    /// Loader threads asked for.
    threads: usize,
    /// Loader threads that ran: fewer for a hot resident split (one per core at most).
    threads_running: usize,
    bytes_per_epoch: u64,
    open_ms: f64,
    /// memcpy of the same bytes on one thread.
    gbps_memcpy: f64,
    /// memcpy of the same bytes on `memcpy_threads` threads: the loader's running threads, so
    /// that the shuffled pass is compared with memory bandwidth at the same parallelism.
    gbps_memcpy_threads: f64,
    memcpy_threads: usize,
    gbps_sequential: f64,
    contexts_per_s_sequential: f64,
    gbps_shuffled_1_thread: f64,
    gbps_shuffled: f64,
    contexts_per_s_shuffled: f64,
    /// The shuffled pass on 1 thread ÷ memcpy on 1 thread.
    shuffled_1_thread_over_memcpy: f64,
    /// The shuffled pass on `threads_running` threads ÷ memcpy on as many: like with like.
    shuffled_over_memcpy_threads: f64,
    /// Kept for older scripts: the shuffled pass on N threads ÷ memcpy on one thread, which
    /// says little on a machine with many cores (use `shuffled_over_memcpy_threads`).
    shuffled_over_memcpy: f64,
    peak_rss_mib: Option<f64>,
    /// Whether the shards are compressed (zstd).
    compressed: bool,
    /// A compressed cache: its shards' safetensors bytes decompressed per second (reading
    /// and checking included), one shard at a time.
    #[serde(skip_serializing_if = "Option::is_none")]
    gbps_decompress: Option<f64>,
    /// With --bucket: the shuffled pass on N threads with length-bucketed, trimmed batches.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    bucketed: Option<Bucketed>,
    /// With --pack: the shuffled pass on N threads with packed batches.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    packed: Option<Packed>,
    /// A cache in object storage: what the shuffled passes on N threads fetched.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    fetched: Option<Fetched>,
    /// With --mix: shuffled epochs of the mix on N threads.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    mixed: Option<Mixed>,
}

#[derive(Serialize)]
struct Mixed {
    /// Caches mixed, the benchmarked cache first.
    mix_caches: usize,
    /// Positions of a mix epoch.
    mix_contexts: usize,
    /// A shuffled epoch of the mix drawn by --weights (or the caches' sizes), N threads.
    contexts_per_s_mixed: f64,
    /// The same ÷ the shuffled pass of the cache alone.
    mixed_over_shuffled: f64,
    /// With --schedule: the same mix drawn by the schedule.
    #[serde(skip_serializing_if = "Option::is_none")]
    contexts_per_s_scheduled: Option<f64>,
    /// contexts_per_s_scheduled ÷ contexts_per_s_mixed, in one run: what a schedule costs.
    #[serde(skip_serializing_if = "Option::is_none")]
    scheduled_over_mixed: Option<f64>,
}

#[derive(Serialize)]
struct Fetched {
    /// The split's stored bytes (of every shard).
    split_stored_bytes: u64,
    /// `--cache-limit` (none: every shard kept once fetched).
    cache_limit: Option<u64>,
    /// Per shuffled epoch: shards downloaded and their bytes.
    shards_fetched_per_epoch: f64,
    bytes_fetched_per_epoch: f64,
    /// Bytes fetched per epoch ÷ the split's stored bytes: 1 when each shard is fetched once.
    fetched_over_split: f64,
    /// Per shuffled epoch: waits of the loader's threads for a download, and their seconds.
    fetch_waits_per_epoch: f64,
    fetch_wait_s_per_epoch: f64,
    /// Per shuffled epoch: fetched shards removed to stay within the limit.
    fetch_evictions_per_epoch: f64,
}

#[derive(Serialize)]
struct Packed {
    /// Tokens per pack.
    pack_tokens: usize,
    /// Contexts (sequences) per second of the packed pass.
    contexts_per_s_packed: f64,
    /// Bytes per second of the packs it yields (the pack's own tensors included).
    gbps_packed: f64,
    /// Its contexts per second ÷ the plain shuffled pass's.
    packed_over_shuffled: f64,
    /// Stored tokens ÷ tokens of the packs (`dsc order --pack`).
    token_efficiency_packed: f64,
}

#[derive(Serialize)]
struct Bucketed {
    /// Contexts per second of the bucketed pass.
    contexts_per_s_bucketed: f64,
    /// Bytes per second of the trimmed batches it yields.
    gbps_bucketed: f64,
    /// Its contexts per second ÷ the plain shuffled pass's.
    bucketed_over_shuffled: f64,
    /// Stored values ÷ values in its trimmed batches (`dsc order --bucket`).
    padding_efficiency_bucketed: f64,
    /// The same for the plain shuffled order, whose batches are not trimmed.
    padding_efficiency_shuffled: f64,
}

/// Reads every byte (so that a zero-copy view costs what reading it costs).
fn touch(bytes: &[u8]) -> u64 {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .fold(0u64, u64::wrapping_add)
}

/// Copies `bytes` in 1 MiB pieces, one contiguous run of pieces per buffer, each on a thread
/// of its own when there are several; returns a byte of each piece so that no copy is elided.
fn copy_pieces(bytes: &[u8], buffers: &mut [Vec<u8>]) -> u64 {
    let piece = buffers[0].len();
    let pieces = bytes.len().div_ceil(piece);
    let per = pieces.div_ceil(buffers.len()).max(1) * piece;
    let copy = |part: &[u8], buf: &mut Vec<u8>| {
        part.chunks(piece).fold(0u64, |sink, p| {
            buf[..p.len()].copy_from_slice(p);
            sink.wrapping_add(u64::from(buf[p.len() / 2]))
        })
    };
    if buffers.len() == 1 {
        return copy(bytes, &mut buffers[0]);
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = bytes
            .chunks(per)
            .zip(buffers.iter_mut())
            .map(|(part, buf)| scope.spawn(move || copy(part, buf)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a memcpy thread does not panic"))
            .fold(0u64, u64::wrapping_add)
    })
}

fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The passes' loader options: the order's flags, padded batches of `--batch-size`.
struct Passes<'a> {
    a: &'a BenchArgs,
}

impl Passes<'_> {
    fn order(&self, batches: Batches) -> OrderSpec {
        self.a
            .epoch
            .order(batches, &MixArgs::default(), None)
            .expect("no schedule to convert")
    }

    /// Padded batches in cache order or shuffled, on `threads` threads.
    fn padded(&self, shuffle: bool, threads: usize) -> LoaderOptions {
        LoaderOptions {
            order: OrderSpec {
                shuffle: shuffle && self.a.epoch.shuffle,
                ..self.order(Batches::Padded)
            },
            batch_size: self.a.batch.batch_size,
            threads,
            columns: self.a.columns.clone(),
            ..Default::default()
        }
    }

    /// Shuffled batches of `batches` on `threads` threads.
    fn shaped(&self, batches: Batches, threads: usize) -> LoaderOptions {
        LoaderOptions {
            order: self.order(batches),
            ..self.padded(true, threads)
        }
    }
}

/// memcpy of a split's bytes: every shard's mapped data copied in 1 MiB pieces, on one thread
/// and on `threads` (each into its own buffer), the fastest of `repeat` passes (at least two:
/// the first also brings the shards into the page cache).
struct Memcpy {
    one_s: f64,
    many_s: f64,
    threads: usize,
    /// The split's safetensors bytes.
    bytes: usize,
    /// The first pass's reading and decompressing of a compressed split, one shard at a time.
    decompress_s: f64,
    compressed: bool,
}

fn memcpy(cache: &Cache, split: &str, threads: usize, repeat: usize) -> anyhow::Result<Memcpy> {
    let count = cache.manifest().shards_of(split).count();
    let mut buffers = vec![vec![0u8; 1 << 20]; threads.max(1)];
    let (mut best_one, mut best_many) = (f64::INFINITY, f64::INFINITY);
    let (mut bytes, mut decompress_s, mut sink) = (0usize, 0.0, 0u64);
    for pass in 0..repeat.max(2) {
        let (mut one_s, mut many_s) = (0.0, 0.0);
        for k in 0..count {
            let t = Instant::now();
            let shard = cache.shard_bytes(split, k)?;
            if pass == 0 {
                decompress_s += t.elapsed().as_secs_f64();
                bytes += shard.len();
            }
            let t = Instant::now();
            sink = sink.wrapping_add(copy_pieces(&shard[..], &mut buffers[..1]));
            one_s += t.elapsed().as_secs_f64();
            let t = Instant::now();
            sink = sink.wrapping_add(copy_pieces(&shard[..], &mut buffers));
            many_s += t.elapsed().as_secs_f64();
        }
        best_one = best_one.min(one_s);
        best_many = best_many.min(many_s);
    }
    std::hint::black_box(sink);
    Ok(Memcpy {
        one_s: best_one,
        many_s: best_many,
        threads: buffers.len(),
        bytes,
        decompress_s,
        compressed: cache
            .manifest()
            .shards_of(split)
            .any(|s| s.compressed.is_some()),
    })
}

/// The fastest of `repeat` epochs in cache order, every byte of every batch read.
fn sequential(cache: &Cache, opts: &LoaderOptions, repeat: usize) -> anyhow::Result<f64> {
    let (mut best, mut sink) = (f64::INFINITY, 0u64);
    for _ in 0..repeat {
        let t = Instant::now();
        for batch in cache.loader(opts.clone())? {
            for tensor in batch?.tensors() {
                sink = sink.wrapping_add(touch(tensor.bytes()));
            }
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink);
    Ok(best)
}

/// The fastest of `repeat` epochs (epochs 0, 1, …: each its own order), in seconds, and the
/// bytes one yields.
fn timed(cache: &Cache, o: &LoaderOptions, repeat: usize) -> anyhow::Result<(f64, u64)> {
    timed_on(&|o| cache.loader(o), o, repeat)
}

/// [`timed`] of the loaders `make` gives.
fn timed_on(
    make: &dyn Fn(LoaderOptions) -> Result<Loader, LoadError>,
    o: &LoaderOptions,
    repeat: usize,
) -> anyhow::Result<(f64, u64)> {
    let mut best = (f64::INFINITY, 0);
    for epoch in 0..repeat as u64 {
        let t = Instant::now();
        let mut n = 0u64;
        for batch in make(LoaderOptions { epoch, ..o.clone() })? {
            n += batch?
                .tensors()
                .iter()
                .map(|t| t.bytes().len() as u64)
                .sum::<u64>();
        }
        let s = t.elapsed().as_secs_f64();
        if s < best.0 {
            best = (s, std::hint::black_box(n));
        }
    }
    Ok(best)
}

/// Shuffled epochs of the mix of `cache` with `--mix`: by fixed weights, then (with
/// `--schedule`) by the schedule, against the cache's own shuffled pass (`per_s`).
fn mixed(
    cache: &Cache,
    passes: &Passes,
    (threads, repeat): (usize, usize),
    remote: &dsc_loader::RemoteOptions,
    per_s: f64,
) -> anyhow::Result<Mixed> {
    let a = passes.a;
    let mut caches = vec![cache.clone()];
    for path in &a.mix_with {
        caches.push(Cache::open_with(path, remote)?);
    }
    let mix = Mix::new(caches)?;
    let fixed = dsc_loader::args::MixArgs {
        schedule: None,
        ..a.mix.clone()
    };
    let opts = |mix_args: &dsc_loader::args::MixArgs| -> anyhow::Result<LoaderOptions> {
        let per_step = (a.batch.batch_size) as u64;
        Ok(LoaderOptions {
            order: a.epoch.order(Batches::Padded, mix_args, Some(per_step))?,
            ..passes.padded(true, threads)
        })
    };
    let make = |o| mix.loader(o);
    let fixed_opts = opts(&fixed)?;
    let probe = mix.loader(LoaderOptions {
        threads: 0,
        ..fixed_opts.clone()
    })?;
    let contexts = (probe.steps() * a.batch.batch_size) as f64;
    let mix_contexts = probe.order().len();
    drop(probe);
    let (fixed_s, _) = timed_on(&make, &fixed_opts, repeat)?;
    let scheduled_s = match a.mix.schedule {
        Some(_) => {
            let scheduled = dsc_loader::args::MixArgs {
                weights: None,
                ..a.mix.clone()
            };
            Some(timed_on(&make, &opts(&scheduled)?, repeat)?.0)
        }
        None => None,
    };
    Ok(Mixed {
        mix_caches: mix.sources().len(),
        mix_contexts,
        contexts_per_s_mixed: contexts / fixed_s,
        mixed_over_shuffled: contexts / fixed_s / per_s,
        contexts_per_s_scheduled: scheduled_s.map(|s| contexts / s),
        scheduled_over_mixed: scheduled_s.map(|s| fixed_s / s),
    })
}

/// What the shuffled passes fetched from object storage, per epoch, between `before` and
/// `after`.
fn fetched(
    cache: &Cache,
    split: &str,
    limit: Option<u64>,
    (before, after): (&LoaderStats, &LoaderStats),
    repeat: usize,
) -> Fetched {
    let per = |a: u64, b: u64| (a - b) as f64 / repeat as f64;
    let split_stored_bytes: u64 = cache
        .manifest()
        .shards_of(split)
        .map(dsc_format::ShardEntry::stored_bytes)
        .sum();
    let bytes_fetched_per_epoch = per(after.bytes_fetched, before.bytes_fetched);
    Fetched {
        split_stored_bytes,
        cache_limit: limit,
        shards_fetched_per_epoch: per(after.shards_fetched, before.shards_fetched),
        bytes_fetched_per_epoch,
        fetched_over_split: bytes_fetched_per_epoch / split_stored_bytes.max(1) as f64,
        fetch_waits_per_epoch: per(after.fetch_waits, before.fetch_waits),
        fetch_wait_s_per_epoch: (after.fetch_wait_s - before.fetch_wait_s) / repeat as f64,
        fetch_evictions_per_epoch: per(after.fetch_evictions, before.fetch_evictions),
    }
}

/// A shuffled epoch of length-bucketed batches against the plain one (`many_s`, `contexts`
/// per epoch).
fn bucketed(
    cache: &Cache,
    passes: &Passes,
    threads: usize,
    repeat: usize,
    (contexts, many_s): (f64, f64),
) -> anyhow::Result<Bucketed> {
    let opts = passes.shaped(Batches::Bucketed, threads);
    let (seconds, yielded) = timed(cache, &opts, repeat)?;
    let figures = |o: LoaderOptions| cache.loader(LoaderOptions { threads: 0, ..o })?.padding();
    Ok(Bucketed {
        contexts_per_s_bucketed: contexts / seconds,
        gbps_bucketed: yielded as f64 / 1e9 / seconds,
        bucketed_over_shuffled: many_s / seconds,
        padding_efficiency_bucketed: figures(opts)?.padding_efficiency,
        // The plain passes yield untrimmed batches.
        padding_efficiency_shuffled: figures(passes.padded(true, 0))?.padding_efficiency_untrimmed,
    })
}

/// A shuffled epoch of packs of `tokens` against the plain one (`many_s`, `contexts` per
/// epoch).
fn packed(
    cache: &Cache,
    passes: &Passes,
    (tokens, threads): (usize, usize),
    repeat: usize,
    (contexts, many_s): (f64, f64),
) -> anyhow::Result<Packed> {
    let opts = passes.shaped(Batches::Packed(Pack::tokens(tokens)), threads);
    let (seconds, yielded) = timed(cache, &opts, repeat)?;
    let probe = cache.loader(LoaderOptions { threads: 0, ..opts })?;
    let packs = probe.packs().expect("a packed loader");
    let lengths = cache.lengths(&passes.a.epoch.split)?;
    let f = packs.figures(probe.order(), &lengths, cache.manifest().max_len());
    let packed_contexts = f.sequences_per_pack * f.packs_trained as f64;
    Ok(Packed {
        pack_tokens: f.tokens,
        contexts_per_s_packed: packed_contexts / seconds,
        gbps_packed: yielded as f64 / 1e9 / seconds,
        packed_over_shuffled: packed_contexts / seconds / (contexts / many_s),
        token_efficiency_packed: f.token_efficiency,
    })
}

pub fn run(a: BenchArgs) -> anyhow::Result<u8> {
    let m = &a.mix;
    anyhow::ensure!(
        !a.mix_with.is_empty()
            || (m.weights.is_none() && m.schedule.is_none() && m.mix_samples.is_none()),
        "--weights, --schedule and --mix-samples weigh a mix: name the caches mixed with {} \
         by --mix",
        a.cache.display()
    );
    let threads = a
        .loader_threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    let remote = a.remote.options_at(&a.at)?;
    // Open twice: the first run warms the file metadata; the second is the figure.
    drop(Cache::open_with(&a.cache, &remote)?);
    let t = Instant::now();
    let cache = Cache::open_with(&a.cache, &remote)?;
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    let passes = Passes { a: &a };
    let split = &a.epoch.split;
    let (contexts, steps, per_context) = {
        let probe = cache.loader(passes.padded(false, 0))?;
        let loaded: usize = probe.tensor_specs().map(|t| t.sample_bytes()).sum();
        (probe.order().len(), probe.steps(), loaded)
    };
    let bytes = (steps * a.batch.batch_size * per_context) as u64;
    anyhow::ensure!(
        steps > 0,
        "split {split:?} has fewer than {} contexts",
        a.batch.batch_size
    );
    // The loader's threads that will run, probed without starting them: memcpy runs on as many.
    let running = cache.loader(passes.padded(true, threads))?.threads();
    let repeat = a.repeat.max(1);
    let fetching = cache.fetch_folder().is_some();
    // memcpy over a second mapping, dropped afterwards, so that the pages it touches do not
    // count in the loader's resident memory measured below (of a cache in object storage, the
    // same open cache: a second would fetch every shard again into a folder of its own).
    let copy = if fetching {
        memcpy(&cache, split, running, repeat)?
    } else {
        memcpy(
            &Cache::open_with(&a.cache, &remote)?,
            split,
            running,
            repeat,
        )?
    };
    // Per epoch byte, as the other passes move `bytes`.
    let memcpy_s = copy.one_s * bytes as f64 / copy.bytes as f64;
    let memcpy_n_s = copy.many_s * bytes as f64 / copy.bytes as f64;

    reset_peak();
    let sequential_s = sequential(&cache, &passes.padded(false, 0), repeat)?;
    let (one_s, _) = timed(&cache, &passes.padded(true, 1), repeat)?;
    let before = cache.shard_stats();
    let (many_s, _) = timed(&cache, &passes.padded(true, threads), repeat)?;
    let after = cache.shard_stats();
    let epoch_contexts = (steps * a.batch.batch_size) as f64;
    let against = (epoch_contexts, many_s);
    let bucketed = match a.bucket {
        true => Some(bucketed(&cache, &passes, threads, repeat, against)?),
        false => None,
    };
    let packed = match a.pack {
        Some(tokens) => Some(packed(&cache, &passes, (tokens, threads), repeat, against)?),
        None => None,
    };
    let mixed = match a.mix_with.is_empty() {
        true => None,
        false => Some(mixed(
            &cache,
            &passes,
            (threads, repeat),
            &remote,
            epoch_contexts / many_s,
        )?),
    };
    let peak_rss_mib = crate::output::peak_rss_mib();

    let gb = bytes as f64 / 1e9;
    let r = Report {
        cache: a.cache.clone(),
        split: split.clone(),
        contexts,
        repeat,
        batch_size: a.batch.batch_size,
        threads,
        threads_running: running,
        bytes_per_epoch: bytes,
        open_ms,
        gbps_memcpy: gb / memcpy_s,
        gbps_memcpy_threads: gb / memcpy_n_s,
        memcpy_threads: copy.threads,
        gbps_sequential: gb / sequential_s,
        contexts_per_s_sequential: epoch_contexts / sequential_s,
        gbps_shuffled_1_thread: gb / one_s,
        gbps_shuffled: gb / many_s,
        contexts_per_s_shuffled: epoch_contexts / many_s,
        shuffled_1_thread_over_memcpy: memcpy_s / one_s,
        shuffled_over_memcpy_threads: memcpy_n_s / many_s,
        shuffled_over_memcpy: memcpy_s / many_s,
        peak_rss_mib,
        compressed: copy.compressed,
        gbps_decompress: copy
            .compressed
            .then(|| copy.bytes as f64 / 1e9 / copy.decompress_s),
        bucketed,
        packed,
        fetched: fetching.then(|| fetched(&cache, split, remote.limit, (&before, &after), repeat)),
        mixed,
    };
    if a.json {
        crate::output::print_json(&r)?;
    } else {
        print_human(&r, per_context)?;
    }
    Ok(0)
}

/// The report as a table of passes against memcpy, then what each extra pass found.
fn print_human(r: &Report, per_context: usize) -> anyhow::Result<()> {
    let (bytes, running) = (r.bytes_per_epoch, r.threads_running);
    outln!(
        "{} {}: {} contexts in split {:?}, batches of {}, {:.1} MB per epoch; open {:.1} ms",
        bold("bench"),
        r.cache.display(),
        r.contexts,
        r.split,
        r.batch_size,
        bytes as f64 / 1e6,
        r.open_ms
    );
    outln!(
        "{}",
        bold(&format!(
            "{:<34} {:>10} {:>14} {:>10}",
            "pass", "GB/s", "contexts/s", "÷ memcpy"
        ))
    );
    // Each pass against memcpy on as many threads as it ran.
    let row = |name: &str, gbps: f64, memcpy: f64| {
        format!(
            "{name:<34} {gbps:>10.2} {:>14.0} {:>10.2}",
            gbps * 1e9 / per_context as f64,
            gbps / memcpy
        )
    };
    let (one, many) = (r.gbps_memcpy, r.gbps_memcpy_threads);
    outln!("{}", row("memcpy of the same bytes, 1 thread", one, one));
    if r.memcpy_threads > 1 {
        let name = format!("memcpy of the same bytes, {} threads", r.memcpy_threads);
        outln!("{}", row(&name, many, many));
    }
    outln!(
        "{}",
        row("cache order (views, bytes read)", r.gbps_sequential, one)
    );
    outln!(
        "{}",
        row(
            "shuffled, 1 thread (one copy)",
            r.gbps_shuffled_1_thread,
            one
        )
    );
    outln!(
        "{}",
        row(
            &format!("shuffled, {running} threads (one copy)"),
            r.gbps_shuffled,
            many
        )
    );
    if let Some(b) = &r.bucketed {
        outln!(
            "{:<34} {:>10.2} {:>14.0} {:>10}",
            format!("bucketed, {running} threads (trimmed)"),
            b.gbps_bucketed,
            b.contexts_per_s_bucketed,
            "-"
        );
        outln!(
            "bucketed: {:.2}x the shuffled contexts/s; padding efficiency {:.3} (shuffled: {:.3})",
            b.bucketed_over_shuffled,
            b.padding_efficiency_bucketed,
            b.padding_efficiency_shuffled
        );
    }
    if let Some(p) = &r.packed {
        outln!(
            "{:<34} {:>10.2} {:>14.0} {:>10}",
            format!("packed, {running} threads ({} tokens)", p.pack_tokens),
            p.gbps_packed,
            p.contexts_per_s_packed,
            "-"
        );
        outln!(
            "packed: {:.2}x the shuffled contexts/s; token efficiency {:.4}",
            p.packed_over_shuffled,
            p.token_efficiency_packed
        );
    }
    if let Some(m) = &r.mixed {
        outln!(
            "mix of {} caches ({} positions an epoch), {running} threads: {:.0} contexts/s, \
             {:.2}x the cache alone",
            m.mix_caches,
            m.mix_contexts,
            m.contexts_per_s_mixed,
            m.mixed_over_shuffled
        );
        if let (Some(per_s), Some(ratio)) = (m.contexts_per_s_scheduled, m.scheduled_over_mixed) {
            outln!("scheduled mix: {per_s:.0} contexts/s, {ratio:.3}x the mix of fixed weights");
        }
    }
    if let Some(gbps) = r.gbps_decompress {
        outln!("compressed shards: decompressed at {gbps:.2} GB/s (of safetensors bytes)");
    }
    if let Some(f) = &r.fetched {
        outln!(
            "object storage, per shuffled epoch: {:.1} shards, {:.1} MB fetched ({:.2} of the \
             split's {:.1} MB), {:.1} waits ({:.3} s), {:.1} evictions; limit {}",
            f.shards_fetched_per_epoch,
            f.bytes_fetched_per_epoch / 1e6,
            f.fetched_over_split,
            f.split_stored_bytes as f64 / 1e6,
            f.fetch_waits_per_epoch,
            f.fetch_wait_s_per_epoch,
            f.fetch_evictions_per_epoch,
            f.cache_limit
                .map_or("none".into(), |l| format!("{:.1} MB", l as f64 / 1e6))
        );
    }
    if let Some(mib) = r.peak_rss_mib {
        outln!("peak resident memory while loading: {mib:.0} MiB");
    }
    Ok(())
}
