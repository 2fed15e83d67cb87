//! Windows cut from long series (`OrderSpec::series`): every window of every context once per
//! epoch, shuffled across contexts, each the exact slice of its context's stored steps with the
//! next steps as its target, resumable mid-epoch, split across ranks, and refused where it
//! cannot hold.

use crate::util::*;
use dsc_loader::{Batch, Batches, Cache, LoaderOptions, OrderSpec, SeriesWindows};
use std::collections::BTreeMap;

/// Long series (30 of 40 to 260 steps) compiled whole (`--max-len 260`).
fn series_cache() -> Dir {
    let dir = Dir::new();
    dsc(
        dir.path(),
        &[
            "gen", "series", "--out", "data", "--series", "30", "--steps", "40:260", "--seed", "4",
        ],
    )
    .ok();
    dsc(
        dir.path(),
        &[
            "compile",
            "data/readings.parquet",
            "--key",
            "series_id",
            "--order-by",
            "t",
            "--features",
            "value,load,temp",
            "--max-len",
            "260",
            "--val-fraction",
            "0",
            "--shard-size",
            "64KiB",
            "--out",
            "cache",
        ],
    )
    .ok();
    dir
}

fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Every context's stored `x` rows (`[length][3]`), by key.
fn contexts(cache: &Cache) -> BTreeMap<i64, Vec<[f32; 3]>> {
    let opts = LoaderOptions {
        order: OrderSpec {
            shuffle: false,
            drop_last: false,
            ..Default::default()
        },
        batch_size: 1,
        ..Default::default()
    };
    cache
        .loader(opts)
        .unwrap()
        .map(|b| {
            let b = b.unwrap();
            let len = i32s(b.tensor("length").unwrap().bytes())[0] as usize;
            let x = f32s(b.tensor("x").unwrap().bytes());
            let rows = x.chunks_exact(3).take(len).map(|r| [r[0], r[1], r[2]]);
            (b.keys()[0], rows.collect())
        })
        .collect()
}

fn windows(len: usize, stride: usize, horizon: usize, pad: bool) -> SeriesWindows {
    SeriesWindows {
        len,
        stride,
        horizon,
        horizon_columns: if horizon > 0 {
            vec!["value".into()]
        } else {
            Vec::new()
        },
        pad,
    }
}

fn options(series: SeriesWindows, batch_size: usize) -> LoaderOptions {
    LoaderOptions {
        order: OrderSpec {
            batches: Batches::Windows(series),
            window: 64,
            interleave: 2,
            seed: 9,
            drop_last: false,
            ..Default::default()
        },
        batch_size,
        ..Default::default()
    }
}

/// Each row of `b` as (key, start), checked against its context: `x` the slice of the
/// context's rows from `start` (zeros past its end), `length` the real steps, `y_next` the next
/// steps of `value`.
fn check_rows(
    b: &Batch,
    stored: &BTreeMap<i64, Vec<[f32; 3]>>,
    w: &SeriesWindows,
) -> Vec<(i64, usize)> {
    let x = f32s(b.tensor("x").unwrap().bytes());
    let length = i32s(b.tensor("length").unwrap().bytes());
    let start = i32s(b.tensor("start").unwrap().bytes());
    assert_eq!(b.tensor("x").unwrap().shape(), [b.size, w.len, 3]);
    let (y, real_h) = if w.horizon > 0 {
        let y = b.tensor("y_next").unwrap();
        assert_eq!(y.shape(), [b.size, w.horizon, 1]);
        (
            f32s(y.bytes()),
            i32s(b.tensor("horizon_length").unwrap().bytes()),
        )
    } else {
        assert!(b.tensor("y_next").is_none());
        (Vec::new(), Vec::new())
    };
    b.keys()
        .into_iter()
        .enumerate()
        .map(|(i, key)| {
            let rows = &stored[&key];
            let t = start[i] as usize;
            assert!(
                t < rows.len() && t.is_multiple_of(w.stride),
                "key {key} start {t}"
            );
            let real = (rows.len() - t).min(w.len);
            assert_eq!(length[i] as usize, real, "key {key} start {t}");
            if !w.pad {
                assert!(
                    t + w.len + w.horizon <= rows.len(),
                    "a window crosses its series' end"
                );
            }
            for s in 0..w.len {
                let got = &x[(i * w.len + s) * 3..(i * w.len + s + 1) * 3];
                let want = if s < real { rows[t + s] } else { [0.0; 3] };
                assert_eq!(got, want, "key {key} start {t} step {s}");
            }
            for h in 0..w.horizon {
                let want = rows.get(t + w.len + h).map_or(0.0, |r| r[0]);
                assert_eq!(y[i * w.horizon + h], want, "key {key} start {t} target {h}");
            }
            if w.horizon > 0 {
                let want = rows.len().saturating_sub(t + w.len).min(w.horizon);
                assert_eq!(real_h[i] as usize, want);
            }
            (key, t)
        })
        .collect()
}

/// Every window a context of each stored length holds, as (key, start).
fn every_window(stored: &BTreeMap<i64, Vec<[f32; 3]>>, w: &SeriesWindows) -> Vec<(i64, usize)> {
    let mut all: Vec<(i64, usize)> = stored
        .iter()
        .flat_map(|(&key, rows)| (0..w.count(rows.len())).map(move |k| (key, k * w.stride)))
        .collect();
    all.sort_unstable();
    all
}

#[test]
fn every_window_comes_once_per_epoch_as_the_slice_of_its_context_with_the_next_steps() {
    let dir = series_cache();
    let cache = Cache::open(dir.join("cache")).unwrap();
    let stored = contexts(&cache);
    assert!(stored.values().any(|r| r.len() > 200), "long series");
    for w in [
        windows(16, 8, 4, false),
        windows(24, 24, 0, false),
        windows(16, 10, 3, true),
    ] {
        let want = every_window(&stored, &w);
        assert!(want.len() > 3 * stored.len(), "{} windows", want.len());
        let mut orders = Vec::new();
        for epoch in 0..2 {
            let opts = LoaderOptions {
                epoch,
                ..options(w.clone(), 32)
            };
            let mut seen = Vec::new();
            for b in cache.loader(opts).unwrap() {
                seen.extend(check_rows(&b.unwrap(), &stored, &w));
            }
            orders.push(seen.clone());
            // The last batch is completed with the epoch's first windows.
            seen.truncate(want.len());
            seen.sort_unstable();
            assert_eq!(seen, want, "{w:?} epoch {epoch}");
        }
        // Shuffled across contexts, and differently each epoch.
        assert_ne!(orders[0], orders[1]);
        let first: Vec<i64> = orders[0][..32].iter().map(|(k, _)| *k).collect();
        let distinct: std::collections::BTreeSet<i64> = first.iter().copied().collect();
        assert!(distinct.len() > 4, "a batch mixes series: {first:?}");
    }
}

#[test]
fn a_windowed_epoch_resumes_exactly_and_splits_across_ranks() {
    let dir = series_cache();
    let cache = Cache::open(dir.join("cache")).unwrap();
    let w = windows(16, 8, 4, false);
    let keyed = |b: Batch| -> Vec<(i64, i32)> {
        let start = i32s(b.tensor("start").unwrap().bytes());
        b.keys().into_iter().zip(start).collect()
    };
    let all: Vec<(i64, i32)> = cache
        .loader(options(w.clone(), 16))
        .unwrap()
        .flat_map(|b| keyed(b.unwrap()))
        .collect();
    let mut loader = cache.loader(options(w.clone(), 16)).unwrap();
    let mut resumed: Vec<(i64, i32)> = (&mut loader)
        .take(5)
        .flat_map(|b| keyed(b.unwrap()))
        .collect();
    let state = loader.state();
    assert_eq!(
        state.order.batches.windows(),
        Some(&w),
        "the windows are part of the state"
    );
    drop(loader);
    resumed.extend(
        cache
            .loader_from_state(options(w.clone(), 16), &state)
            .unwrap()
            .flat_map(|b| keyed(b.unwrap())),
    );
    assert_eq!(resumed, all);
    // Two ranks of 8: their batches interleave into the one-rank order of 16.
    let ranks: Vec<Vec<Vec<(i64, i32)>>> = (0..2)
        .map(|rank| {
            let opts = LoaderOptions {
                rank,
                world_size: 2,
                ..options(w.clone(), 8)
            };
            cache
                .loader(opts)
                .unwrap()
                .map(|b| keyed(b.unwrap()))
                .collect()
        })
        .collect();
    let interleaved: Vec<(i64, i32)> = ranks[0]
        .iter()
        .zip(&ranks[1])
        .flat_map(|(a, b)| a.iter().chain(b).copied())
        .collect();
    assert_eq!(interleaved, all);
}

#[test]
fn windows_are_refused_where_they_cannot_hold_naming_the_option() {
    let dir = series_cache();
    let cache = Cache::open(dir.join("cache")).unwrap();
    let refused_by = |e: dsc_loader::LoadError, key: &str, says: &str| {
        assert!(
            matches!(&e, dsc_loader::LoadError::Options(o) if o.key == key && o.problem.contains(says)),
            "{key}: {e}"
        );
    };
    let refused = |opts: LoaderOptions, key: &str, says: &str| {
        refused_by(cache.loader(opts).unwrap_err(), key, says);
    };
    let w = windows(16, 8, 4, false);
    // Windows and buckets are two shapes: no order holds both, and keys that ask for both are
    // refused by name.
    let both = dsc_loader::args::ShapeArgs {
        bucket: true,
        series_window: Some(16),
        ..Default::default()
    };
    let e = both.batches().unwrap_err();
    assert!(
        e.key == "bucket" && e.problem.contains("series windows"),
        "{e}"
    );
    let mut o = options(w.clone(), 8);
    o.trim = Some(1);
    refused(o, "trim", "series_window");
    // A mix's options on one cache are refused whatever the shape (they were ignored with
    // windows), a single weight too (issue 52: the rule of every front end).
    let mut o = options(w.clone(), 8);
    o.order.mix_samples = Some(100);
    refused(o, "mix_samples", "two or more caches");
    let mut o = options(w.clone(), 8);
    o.order.weights = vec![2.0, 1.0];
    refused(o, "weights", "two or more caches");
    let mut o = options(w.clone(), 8);
    o.order.weights = vec![2.0];
    refused(o, "weights", "two or more caches");
    let l = cache.manifest().max_len();
    refused(
        options(windows(l + 1, 8, 0, false), 8),
        "series_window",
        &format!("longer than the {l} steps"),
    );
    refused(
        options(windows(0, 8, 0, false), 8),
        "series_window",
        "at least 1",
    );
    refused(options(windows(16, 0, 0, false), 8), "stride", "at least 1");
    // A horizon that runs past L (zeros there in every window): refused before any size is
    // derived from it, however large (no overflow, no allocation of it).
    for horizon in [l - 15, 1 << 40, usize::MAX - 1, usize::MAX] {
        for pad in [false, true] {
            refused(
                options(windows(16, 8, horizon, pad), 8),
                "horizon",
                &format!("(at most {})", l - 16),
            );
        }
    }
    assert!(cache
        .loader(options(windows(16, 8, l - 16, true), 8))
        .is_ok());
    let mut bad = w.clone();
    bad.horizon_columns = vec!["pressure".into()];
    refused(
        options(bad, 8),
        "horizon_columns",
        "\"pressure\" is not a column of x",
    );
    let mut bad = w.clone();
    bad.horizon_columns = vec!["value".into(), "load".into(), "value".into()];
    refused(options(bad, 8), "horizon_columns", "\"value\" twice");
    let mut bad = windows(16, 8, 0, false);
    bad.horizon_columns = vec!["value".into()];
    refused(options(bad, 8), "horizon_columns", "horizon is 0 steps");
    let mix = dsc_loader::Mix::new(vec![cache.clone(), cache.clone()]).unwrap();
    refused_by(
        mix.loader(options(w, 8)).unwrap_err(),
        "series_window",
        "mixes 2 caches",
    );
}

#[test]
fn dsc_order_refuses_hostile_windows_and_a_state_of_other_windows() {
    let dir = series_cache();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let l = dsc_format::Manifest::read(&dir.join("cache"))
        .unwrap()
        .max_len();
    for horizon in [
        "18446744073709551614",
        "9223372036854775807",
        "1000000000000",
    ] {
        let (code, _, err) = run(&[
            "order",
            "cache",
            "--series-window",
            "3",
            "--horizon",
            horizon,
            "--pad-windows",
            "--keys",
        ]);
        assert_eq!(code, 2, "{err}");
        let at_most = format!("(at most {})", l - 3);
        assert!(err.contains("--horizon") && err.contains(&at_most), "{err}");
    }
    let windows = ["--series-window", "4", "--stride", "3", "--batch-size", "2"];
    let (code, state, err) =
        run(&[&["order", "cache", "--state-after", "3"], &windows[..]].concat());
    assert_eq!(code, 0, "{err}");
    std::fs::write(dir.join("windows.json"), state).unwrap();
    let (code, state, err) = run(&["order", "cache", "--batch-size", "2", "--state-after", "2"]);
    assert_eq!(code, 0, "{err}");
    std::fs::write(dir.join("plain.json"), state).unwrap();
    // Flags that ask for other windows than the state's, or for windows of a state of whole
    // contexts: refused, naming what the state holds.
    for (flags, state, says) in [
        (
            &["--series-window", "5", "--stride", "3"][..],
            "windows.json",
            "that state is of windows of 4 steps every 3 steps, horizon 0, whole, the flags ask for windows of 5 steps",
        ),
        (
            &["--series-window", "4", "--stride", "3", "--pad-windows"][..],
            "windows.json",
            "horizon 0, whole, the flags ask for windows of 4 steps every 3 steps, horizon 0, padded",
        ),
        (
            &["--series-window", "4"][..],
            "plain.json",
            "that state is of padded batches of whole contexts",
        ),
    ] {
        let (code, _, err) = run(&[
            &[
                "order",
                "cache",
                "--batch-size",
                "2",
                "--keys",
                "--from-state",
                state,
            ],
            flags,
        ]
        .concat());
        assert_eq!(code, 2, "{flags:?}: {err}");
        assert!(err.contains("--from-state") && err.contains(says), "{err}");
    }
    // Without the flags the state's windows continue, and print as windows (KEY:START), as
    // with the flags that match them.
    let (code, bare, err) = run(&[
        "order",
        "cache",
        "--batch-size",
        "2",
        "--keys",
        "--from-state",
        "windows.json",
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, same, err) = run(&[
        &["order", "cache", "--keys", "--from-state", "windows.json"],
        &windows[..],
    ]
    .concat());
    assert_eq!(code, 0, "{err}");
    assert_eq!(bare, same);
    assert!(
        bare.lines()
            .next()
            .unwrap()
            .split(' ')
            .all(|w| w.contains(':')),
        "{bare}"
    );
}
