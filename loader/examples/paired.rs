//! Shuffled loader epochs against memcpy of the same bytes, paired round by round, for
//! comparing loader settings on a machine whose memory speed drifts between runs.
//!
//! Each round copies the split's bytes once (1 MiB pieces into one buffer, as `dsc bench`
//! does), then runs one shuffled epoch per setting, each followed by another memcpy; a
//! setting's ratio in a round is its epoch's rate over the mean of the memcpy just before
//! and just after it. The medians and quartiles of those ratios are printed per setting.
//!
//! cargo run --release -p dsc-loader --example paired -- CACHE ROUNDS SETTING...
//!
//! SETTING: `T` (T loader threads), `T/P` (and P batches prefetched per thread), or `rN`
//! (N ranks, each gathering its share of every batch in its own thread, no hand-over: what
//! the gather alone can do). Set `COLUMNS=x,sensor_id` to load only those tensors.

use dsc_loader::{Cache, LoaderOptions};
use std::time::Instant;

enum Setting {
    Threads { threads: usize, prefetch: usize },
    Ranks(usize),
}

fn parse(s: &str) -> Result<Setting, String> {
    let number = |v: &str| v.parse::<usize>().map_err(|_| format!("bad setting {s:?}"));
    if let Some(n) = s.strip_prefix('r') {
        return Ok(Setting::Ranks(number(n)?.max(1)));
    }
    let (threads, prefetch) = s.split_once('/').unwrap_or((s, "4"));
    Ok(Setting::Threads {
        threads: number(threads)?,
        prefetch: number(prefetch)?,
    })
}

/// Seconds per byte of copying every shard of `split` in 1 MiB pieces.
fn memcpy(cache: &Cache, split: &str, buf: &mut [u8]) -> f64 {
    let (mut bytes, mut sink) = (0usize, 0u8);
    let t = Instant::now();
    for k in 0..cache.manifest().shards_of(split).count() {
        let shard = cache.shard_bytes(split, k).expect("shard");
        for piece in shard.chunks(buf.len()) {
            buf[..piece.len()].copy_from_slice(piece);
            sink ^= buf[piece.len() / 2];
        }
        bytes += shard.len();
    }
    std::hint::black_box(sink);
    t.elapsed().as_secs_f64() / bytes as f64
}

/// Bytes one epoch of `opts` yields.
fn epoch(cache: &Cache, opts: LoaderOptions) -> usize {
    cache
        .loader(opts)
        .expect("loader")
        .map(|b| {
            b.expect("batch")
                .tensors()
                .iter()
                .map(|t| t.bytes().len())
                .sum::<usize>()
        })
        .sum()
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        return Err("usage: paired CACHE ROUNDS SETTING... (SETTING: T, T/P or rN)".into());
    }
    let cache = Cache::open(&args[0]).map_err(|e| e.to_string())?;
    let rounds: usize = match args[1].parse() {
        Ok(n) if n > 0 => n,
        _ => return Err("ROUNDS: a number of at least 1".into()),
    };
    let settings = args[2..]
        .iter()
        .map(|s| parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    let batch_size = LoaderOptions::default().batch_size;
    if settings
        .iter()
        .any(|s| matches!(s, Setting::Ranks(n) if *n > batch_size))
    {
        return Err(format!(
            "rN: at most {batch_size} ranks (the batch is split between them)"
        ));
    }
    let columns: Vec<String> = std::env::var("COLUMNS")
        .map(|c| c.split(',').map(String::from).collect())
        .unwrap_or_default();
    let base = LoaderOptions {
        columns,
        ..LoaderOptions::default()
    };
    let mut buf = vec![0u8; 1 << 20];
    let mut ratios = vec![Vec::new(); settings.len()];
    let mut rates = vec![Vec::new(); settings.len()];
    let mut before = memcpy(&cache, &base.order.split, &mut buf);
    for round in 0..rounds as u64 {
        for (k, setting) in settings.iter().enumerate() {
            let t = Instant::now();
            let bytes = match *setting {
                Setting::Threads { threads, prefetch } => epoch(
                    &cache,
                    LoaderOptions {
                        threads,
                        prefetch,
                        epoch: round,
                        ..base.clone()
                    },
                ),
                Setting::Ranks(ranks) => std::thread::scope(|s| {
                    let handles: Vec<_> = (0..ranks)
                        .map(|rank| {
                            let opts = LoaderOptions {
                                batch_size: base.batch_size / ranks,
                                threads: 0,
                                rank,
                                world_size: ranks,
                                epoch: round,
                                ..base.clone()
                            };
                            let cache = &cache;
                            s.spawn(move || epoch(cache, opts))
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().expect("rank")).sum()
                }),
            };
            let seconds = t.elapsed().as_secs_f64();
            let after = memcpy(&cache, &base.order.split, &mut buf);
            ratios[k].push((before + after) / 2.0 * bytes as f64 / seconds);
            rates[k].push(bytes as f64 / seconds / 1e9);
            before = after;
        }
    }
    println!("setting   ÷ memcpy: median (quartiles)   GB/s: median (max)");
    for (k, name) in args[2..].iter().enumerate() {
        let (r, g) = (quartiles(&mut ratios[k]), quartiles(&mut rates[k]));
        println!(
            "{name:8}  {:.3} ({:.3} – {:.3})          {:.2} ({:.2})",
            r[1], r[0], r[2], g[1], g[3]
        );
    }
    Ok(())
}

/// First quartile, median, third quartile and maximum.
fn quartiles(v: &mut [f64]) -> [f64; 4] {
    v.sort_by(f64::total_cmp);
    let at = |q: usize| v[(v.len() - 1) * q / 4];
    [at(1), at(2), at(3), at(4)]
}
