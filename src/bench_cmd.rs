//! `dsc bench`: loader throughput against memcpy of the same bytes, in one run.

use crate::args::BenchArgs;
use crate::output::{bold, outln};
use dsc_loader::args::MixArgs;
use dsc_loader::{Batches, Cache, LoaderOptions, OrderSpec, Pack};
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

pub fn run(a: BenchArgs) -> anyhow::Result<u8> {
    let threads = a
        .loader_threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    let remote = a.remote.options()?;
    // Open twice: the first run warms the file metadata; the second is the figure.
    drop(Cache::open_with(&a.cache, &remote)?);
    let t = Instant::now();
    let cache = Cache::open_with(&a.cache, &remote)?;
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    let order = |batches| a.epoch.order(batches, &MixArgs::default());
    let opts = |shuffle: bool, threads: usize| LoaderOptions {
        order: OrderSpec {
            shuffle: shuffle && a.epoch.shuffle,
            ..order(Batches::Padded)
        },
        batch_size: a.batch_size,
        threads,
        columns: a.columns.clone(),
        ..Default::default()
    };
    let bucketed_opts = LoaderOptions {
        order: order(Batches::Bucketed),
        ..opts(true, threads)
    };
    let (contexts, steps, per_context) = {
        let probe = cache.loader(opts(false, 0))?;
        let loaded: usize = probe.tensor_specs().map(|t| t.sample_bytes()).sum();
        (probe.order().len(), probe.steps(), loaded)
    };
    let bytes = (steps * a.batch_size * per_context) as u64;
    anyhow::ensure!(
        steps > 0,
        "split {:?} has fewer than {} contexts",
        a.epoch.split,
        a.batch_size
    );

    // The loader's threads that will run, probed without starting them: memcpy runs on as many.
    let running = cache.loader(opts(true, threads))?.threads();
    // memcpy of the same bytes: every shard's mapped data copied in 1 MiB pieces, on one
    // thread and on `running` threads (each into its own buffer), `repeat` times at least
    // twice; the first pass also brings the shards into the page cache.
    let mut sink = 0u64;
    // A second mapping, dropped afterwards, so that the pages it touches do not count in the
    // loader's resident memory measured below.
    // (Of a cache in object storage, the same open cache: a second would fetch every shard
    // again into a folder of its own.)
    let fetching = cache.fetch_folder().is_some();
    let copy_of = if fetching {
        cache.clone()
    } else {
        Cache::open_with(&a.cache, &remote)?
    };
    let count = copy_of.manifest().shards_of(&a.epoch.split).count();
    let mut shard_total = 0usize;
    let mut buffers = vec![vec![0u8; 1 << 20]; running.max(1)];
    let (mut memcpy_s, mut memcpy_n_s) = (f64::INFINITY, f64::INFINITY);
    // A compressed cache: its shards' decompression, timed on its own (one shard at a time,
    // so that the whole cache never needs to be in memory).
    let mut decompress_s = 0.0;
    let repeat = a.repeat.max(1);
    for pass in 0..repeat.max(2) {
        let (mut one_s, mut many_s) = (0.0, 0.0);
        for k in 0..count {
            let t = Instant::now();
            let shard = copy_of.shard_bytes(&a.epoch.split, k)?;
            if pass == 0 {
                decompress_s += t.elapsed().as_secs_f64();
                shard_total += shard.len();
            }
            let t = Instant::now();
            sink = sink.wrapping_add(copy_pieces(&shard[..], &mut buffers[..1]));
            one_s += t.elapsed().as_secs_f64();
            let t = Instant::now();
            sink = sink.wrapping_add(copy_pieces(&shard[..], &mut buffers));
            many_s += t.elapsed().as_secs_f64();
        }
        memcpy_s = memcpy_s.min(one_s);
        memcpy_n_s = memcpy_n_s.min(many_s);
    }
    // Per epoch byte, as the other passes move `bytes`.
    let memcpy_s = memcpy_s * bytes as f64 / shard_total as f64;
    let memcpy_n_s = memcpy_n_s * bytes as f64 / shard_total as f64;
    let compressed = copy_of
        .manifest()
        .shards_of(&a.epoch.split)
        .any(|s| s.compressed.is_some());
    drop(copy_of);

    reset_peak();
    let mut sequential_s = f64::INFINITY;
    for _ in 0..repeat {
        let t = Instant::now();
        for batch in cache.loader(opts(false, 0))? {
            for tensor in batch?.tensors() {
                sink = sink.wrapping_add(touch(tensor.bytes()));
            }
        }
        sequential_s = sequential_s.min(t.elapsed().as_secs_f64());
    }

    // The fastest of `repeat` epochs (epochs 0, 1, …: each its own order), in seconds, the
    // bytes one yields, and the loader threads that ran.
    let pass = |o: LoaderOptions| -> anyhow::Result<(f64, u64, usize)> {
        let mut best = (f64::INFINITY, 0, 0);
        for epoch in 0..repeat as u64 {
            let t = Instant::now();
            let mut n = 0u64;
            let loader = cache.loader(LoaderOptions { epoch, ..o.clone() })?;
            let running = loader.threads();
            for batch in loader {
                n += batch?
                    .tensors()
                    .iter()
                    .map(|t| t.bytes().len() as u64)
                    .sum::<u64>();
            }
            let s = t.elapsed().as_secs_f64();
            if s < best.0 {
                best = (s, std::hint::black_box(n), running);
            }
        }
        Ok(best)
    };
    let (one_s, _, _) = pass(opts(true, 1))?;
    let before = cache.shard_stats();
    let (many_s, _, _) = pass(opts(true, threads))?;
    let after = cache.shard_stats();
    let fetched = fetching.then(|| {
        let per = |a: u64, b: u64| (a - b) as f64 / repeat as f64;
        let split_stored_bytes: u64 = cache
            .manifest()
            .shards_of(&a.epoch.split)
            .map(dsc_format::ShardEntry::stored_bytes)
            .sum();
        let bytes_fetched_per_epoch = per(after.bytes_fetched, before.bytes_fetched);
        Fetched {
            split_stored_bytes,
            cache_limit: remote.limit,
            shards_fetched_per_epoch: per(after.shards_fetched, before.shards_fetched),
            bytes_fetched_per_epoch,
            fetched_over_split: bytes_fetched_per_epoch / split_stored_bytes.max(1) as f64,
            fetch_waits_per_epoch: per(after.fetch_waits, before.fetch_waits),
            fetch_wait_s_per_epoch: (after.fetch_wait_s - before.fetch_wait_s) / repeat as f64,
            fetch_evictions_per_epoch: per(after.fetch_evictions, before.fetch_evictions),
        }
    });
    let bucketed_pass = if a.bucket {
        Some(pass(bucketed_opts.clone())?)
    } else {
        None
    };
    let packed_opts = a.pack.map(|tokens| LoaderOptions {
        order: order(Batches::Packed(Pack::tokens(tokens))),
        ..opts(true, threads)
    });
    let packed_pass = match &packed_opts {
        Some(o) => {
            let (seconds, yielded, _) = pass(o.clone())?;
            let probe = cache.loader(LoaderOptions {
                threads: 0,
                ..o.clone()
            })?;
            let packs = probe.packs().expect("a packed loader");
            let lengths = cache.lengths(&a.epoch.split)?;
            let f = packs.figures(probe.order(), &lengths, cache.manifest().max_len());
            Some((seconds, yielded, f))
        }
        None => None,
    };
    let peak_rss_mib = crate::output::peak_rss_mib();
    std::hint::black_box(sink);

    let gb = bytes as f64 / 1e9;
    let epoch_contexts = (steps * a.batch_size) as f64;
    let r = Report {
        cache: a.cache.clone(),
        split: a.epoch.split.clone(),
        contexts,
        repeat,
        batch_size: a.batch_size,
        threads,
        threads_running: running,
        bytes_per_epoch: bytes,
        open_ms,
        gbps_memcpy: gb / memcpy_s,
        gbps_memcpy_threads: gb / memcpy_n_s,
        memcpy_threads: buffers.len(),
        gbps_sequential: gb / sequential_s,
        contexts_per_s_sequential: epoch_contexts / sequential_s,
        gbps_shuffled_1_thread: gb / one_s,
        gbps_shuffled: gb / many_s,
        contexts_per_s_shuffled: epoch_contexts / many_s,
        shuffled_1_thread_over_memcpy: memcpy_s / one_s,
        shuffled_over_memcpy_threads: memcpy_n_s / many_s,
        shuffled_over_memcpy: memcpy_s / many_s,
        peak_rss_mib,
        compressed,
        gbps_decompress: compressed.then(|| shard_total as f64 / 1e9 / decompress_s),
        bucketed: match bucketed_pass {
            Some((seconds, yielded, _)) => {
                let figures =
                    |o: LoaderOptions| cache.loader(LoaderOptions { threads: 0, ..o })?.padding();
                Some(Bucketed {
                    contexts_per_s_bucketed: epoch_contexts / seconds,
                    gbps_bucketed: yielded as f64 / 1e9 / seconds,
                    bucketed_over_shuffled: many_s / seconds,
                    padding_efficiency_bucketed: figures(bucketed_opts)?.padding_efficiency,
                    // The plain passes above yield untrimmed batches.
                    padding_efficiency_shuffled: figures(opts(true, 0))?
                        .padding_efficiency_untrimmed,
                })
            }
            None => None,
        },
        packed: packed_pass.map(|(seconds, yielded, f)| {
            let contexts = f.sequences_per_pack * f.packs_trained as f64;
            Packed {
                pack_tokens: f.tokens,
                contexts_per_s_packed: contexts / seconds,
                gbps_packed: yielded as f64 / 1e9 / seconds,
                packed_over_shuffled: contexts / seconds / (epoch_contexts / many_s),
                token_efficiency_packed: f.token_efficiency,
            }
        }),
        fetched,
    };
    if a.json {
        crate::output::print_json(&r)?;
        return Ok(0);
    }
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
    Ok(0)
}
