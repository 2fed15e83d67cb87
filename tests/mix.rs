//! Mixing caches: proportions, each cache's own epochs, determinism, ranks, resume, padding to
//! the longest L, packing, and refusals of caches that do not fit together.

use crate::util::*;
use dsc_loader::{Batch, Batches, Cache, LoadError, LoaderOptions, Mix, OrderSpec, Pack, Stage};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::OnceLock;

/// Two caches of disjoint events: `a` (L = 64, hot, small shards) and `b` (L = 128,
/// compressed), the same tensors; `c` and `d` each with a categorical column coded over its
/// own events' vocabulary; `e` with one feature fewer; `f` to `k` with other encodings. Shared
/// by the tests (read-only).
fn dir() -> &'static Path {
    static DIR: OnceLock<Dir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Dir::new();
        gen_icecube(&dir, 2, 300);
        let compile = |out: &str, file: usize, extra: &[&str]| {
            let rows = format!("data/train/batch_{file}.parquet");
            let mut args = vec![
                "compile",
                &rows,
                "--key",
                "event_id",
                "--order-by",
                "time",
                "--context",
                "data/train_meta.parquet",
                "--empty-contexts",
                "drop",
                "--targets",
                "azimuth,zenith",
                "--shard-size",
                "64KiB",
                "--out",
                out,
            ];
            args.extend_from_slice(extra);
            dsc(dir.path(), &args).ok();
        };
        let features = ["--features", "time,charge"];
        compile("a", 1, &[&features[..], &["--max-len", "64"]].concat());
        compile(
            "b",
            2,
            &[&features[..], &["--max-len", "128", "--compress", "zstd"]].concat(),
        );
        for (out, file) in [("c", 1), ("d", 2)] {
            compile(
                out,
                file,
                &[&features[..], &["--categorical", "sensor_id"]].concat(),
            );
        }
        compile("e", 2, &["--features", "time"]);
        // The same column encoded differently (f: z-scored, against a's raw time), fitted on
        // other files (f and g), and an unfitted chain on both files (h and i).
        for (out, file, encode) in [
            ("f", 1, "time=zscore"),
            ("g", 2, "time=zscore"),
            ("h", 1, "charge=log1p"),
            ("i", 2, "charge=log1p"),
        ] {
            compile(out, file, &[&features[..], &["--encode", encode]].concat());
        }
        // Bad values imputed with each cache's own train mean (j, k).
        for (out, file) in [("j", 1), ("k", 2)] {
            let nan = ["--encode", "charge=log1p", "--nan", "mean"];
            compile(out, file, &[&features[..], &nan[..]].concat());
        }
        dir
    })
    .path()
}

fn open(name: &str) -> Cache {
    Cache::open(dir().join(name)).unwrap()
}

fn mix() -> Mix {
    Mix::new(vec![open("a"), open("b")]).unwrap()
}

fn opts(batch: usize, weights: &[f64], samples: Option<usize>) -> LoaderOptions {
    LoaderOptions {
        batch_size: batch,
        order: OrderSpec {
            window: 500,
            weights: weights.to_vec(),
            mix_samples: samples,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Every key of a cache's train split.
fn keys_of(cache: &Cache) -> BTreeSet<i64> {
    let o = LoaderOptions {
        order: OrderSpec {
            shuffle: false,
            drop_last: false,
            ..Default::default()
        },
        batch_size: 1,
        ..Default::default()
    };
    cache
        .loader(o)
        .unwrap()
        .flat_map(|b| b.unwrap().keys())
        .collect()
}

fn keys(mix: &Mix, o: LoaderOptions) -> Vec<Vec<i64>> {
    mix.loader(o).unwrap().map(|b| b.unwrap().keys()).collect()
}

#[test]
fn a_mix_draws_its_weights_and_reads_each_cache_in_its_own_epochs() {
    let (a, b) = (keys_of(&open("a")), keys_of(&open("b")));
    assert!(a.is_disjoint(&b) && a.len() > 250 && b.len() > 250);
    let mix = mix();
    let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
    for epoch in 0..2 {
        let all: Vec<i64> = keys(
            &mix,
            LoaderOptions {
                epoch,
                ..opts(1000, &[0.7, 0.3], Some(100_000))
            },
        )
        .concat();
        assert_eq!(all.len(), 100_000);
        let from_a = all.iter().filter(|k| a.contains(k)).count();
        assert!(all.iter().all(|k| a.contains(k) || b.contains(k)));
        let share = from_a as f64 / all.len() as f64;
        assert!((share - 0.7).abs() < 0.007, "share of a {share}");
        for k in all {
            *counts.entry(k).or_default() += 1;
        }
        // Each cache is read one of its own epochs after another (each a permutation of it),
        // across the mix's epochs: no context of a cache is drawn twice more than another.
        for keys in [&a, &b] {
            let drawn: Vec<usize> = keys.iter().map(|k| counts[k]).collect();
            let (lo, hi) = (drawn.iter().min().unwrap(), drawn.iter().max().unwrap());
            assert!(hi - lo <= 1, "epoch {epoch}: drawn {lo}..={hi} times");
        }
    }
    // Without weights: each cache in proportion to its size, an epoch as long as both: every
    // context exactly once, as if the caches were one.
    let once: Vec<i64> = keys(
        &mix,
        LoaderOptions {
            order: OrderSpec {
                drop_last: false,
                ..opts(1, &[], None).order
            },
            ..opts(1, &[], None)
        },
    )
    .concat();
    let sorted: BTreeSet<i64> = once.iter().copied().collect();
    assert_eq!(once.len(), a.len() + b.len());
    assert_eq!(sorted, a.union(&b).copied().collect());
}

#[test]
fn a_mix_is_a_function_of_seed_epoch_and_weights_split_across_ranks_and_resumable() {
    let mix = mix();
    let base = opts(12, &[0.6, 0.4], Some(3000));
    let one = keys(&mix, base.clone());
    assert_eq!(one, keys(&mix, base.clone()), "deterministic");
    for other in [
        LoaderOptions {
            epoch: 1,
            ..base.clone()
        },
        opts(12, &[0.5, 0.5], Some(3000)),
        LoaderOptions {
            order: OrderSpec {
                seed: 3,
                ..base.order.clone()
            },
            ..base.clone()
        },
    ] {
        assert_ne!(
            one,
            keys(&mix, other),
            "another epoch, seed or weights: another order"
        );
    }
    // Three ranks of 4 take the one global order of 12 in disjoint slices.
    let ranks: Vec<Vec<Vec<i64>>> = (0..3)
        .map(|rank| {
            keys(
                &mix,
                LoaderOptions {
                    batch_size: 4,
                    rank,
                    world_size: 3,
                    ..base.clone()
                },
            )
        })
        .collect();
    for (step, global) in one.iter().enumerate() {
        let joined: Vec<i64> = ranks.iter().flat_map(|r| r[step].clone()).collect();
        assert_eq!(&joined, global, "step {step}");
    }
    // A state resumes exactly, at the same global batch and at another one.
    let mut loader = mix.loader(base.clone()).unwrap();
    let first: Vec<Vec<i64>> = (&mut loader).take(7).map(|b| b.unwrap().keys()).collect();
    let state = loader.state();
    let rest: Vec<Vec<i64>> = mix
        .loader_from_state(base.clone(), &state)
        .unwrap()
        .map(|b| b.unwrap().keys())
        .collect();
    assert_eq!([first.clone(), rest].concat(), one);
    let flat: Vec<i64> = one.concat();
    let other: Vec<i64> = mix
        .loader_from_state(
            LoaderOptions {
                batch_size: 5,
                ..base.clone()
            },
            &state,
        )
        .unwrap()
        .flat_map(|b| b.unwrap().keys())
        .collect();
    assert_eq!(
        other,
        flat[7 * 12..7 * 12 + other.len()],
        "at a global batch of 5"
    );
    assert!(flat.len() - 7 * 12 - other.len() < 5);
    // The weights are part of the order a state keeps.
    let err = state.check(&opts(12, &[0.5, 0.5], Some(3000))).unwrap_err();
    assert!(
        matches!(&err, LoadError::State { field, .. } if field == "weights"),
        "{err}"
    );
}

/// Each key's stored bytes of tensor `name` in `cache`.
fn rows(cache: &Cache, name: &str) -> BTreeMap<i64, Vec<u8>> {
    let o = LoaderOptions {
        order: OrderSpec {
            shuffle: false,
            drop_last: false,
            ..Default::default()
        },
        batch_size: 1,
        ..Default::default()
    };
    cache
        .loader(o)
        .unwrap()
        .map(|b| {
            let b = b.unwrap();
            (b.keys()[0], b.tensor(name).unwrap().bytes().to_vec())
        })
        .collect()
}

fn check_padded(batch: &Batch, stored: &[BTreeMap<i64, Vec<u8>>]) {
    let x = batch.tensor("x").unwrap();
    let row = x.bytes().len() / batch.size;
    for (i, key) in batch.keys().into_iter().enumerate() {
        let own = stored
            .iter()
            .find_map(|s| s.get(&key))
            .expect("a key of a source");
        let got = &x.bytes()[i * row..(i + 1) * row];
        let n = own.len().min(row);
        assert_eq!(&got[..n], &own[..n], "key {key}: its stored steps");
        assert!(
            got[n..].iter().all(|&v| v == 0),
            "key {key}: zeros past its cache's L"
        );
    }
}

#[test]
fn rows_of_a_cache_of_shorter_l_are_padded_with_zeros_to_the_longest() {
    let stored = [rows(&open("a"), "x"), rows(&open("b"), "x")];
    assert_eq!(stored[0].values().next().unwrap().len(), 64 * 2 * 4);
    let mix = mix();
    for trim in [false, true] {
        let o = LoaderOptions {
            trim: trim.then_some(1),
            ..opts(50, &[1.0, 1.0], Some(1000))
        };
        let mut seen = 0;
        for batch in mix.loader(o).unwrap() {
            let batch = batch.unwrap();
            let x = batch.tensor("x").unwrap();
            assert_eq!(x.shape()[1], if trim { batch.seq_len } else { 128 });
            check_padded(&batch, &stored);
            seen += batch.size;
        }
        assert_eq!(seen, 1000);
    }
    // The caller's buffers are filled with the same bytes.
    let o = LoaderOptions {
        threads: 0,
        ..opts(50, &[1.0, 1.0], Some(1000))
    };
    let mut loader = mix.loader(o.clone()).unwrap();
    let expected: Vec<Batch> = mix.loader(o).unwrap().map(Result::unwrap).collect();
    let mut bufs: Vec<Vec<u8>> = loader
        .batch_bytes()
        .into_iter()
        .map(|n| vec![7; n])
        .collect();
    for want in expected {
        let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        loader.next_into(&mut slices).unwrap().unwrap();
        let x = want.tensor("x").unwrap().bytes();
        assert_eq!(
            &bufs[loader.layout().iter().position(|t| t.name == "x").unwrap()][..x.len()],
            x
        );
    }
}

#[test]
fn packed_mix_batches_hold_whole_sequences_of_both_caches() {
    let stored = [rows(&open("a"), "x"), rows(&open("b"), "x")];
    let mix = mix();
    let o = LoaderOptions {
        order: OrderSpec {
            batches: Batches::Packed(Pack::tokens(512)),
            ..opts(1, &[], None).order
        },
        ..Default::default()
    };
    let mut keys = Vec::new();
    for batch in mix.loader(o).unwrap() {
        let batch = batch.unwrap();
        let pack = batch.pack.unwrap();
        let x = batch.tensor("x").unwrap().bytes();
        let cu: Vec<i32> = batch
            .tensor("cu_seqlens")
            .unwrap()
            .bytes()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let batch_keys = batch.keys();
        for (i, key) in batch_keys.iter().take(pack.seqs).enumerate() {
            let own = stored.iter().find_map(|s| s.get(key)).unwrap();
            let (start, end) = (cu[i] as usize * 8, cu[i + 1] as usize * 8);
            assert_eq!(&x[start..end], &own[..end - start], "key {key}");
        }
        keys.extend(batch_keys.into_iter().take(pack.seqs));
    }
    let distinct: BTreeSet<i64> = keys.iter().copied().collect();
    assert_eq!(distinct.len(), keys.len(), "no sequence twice");
    let total = stored[0].len() + stored[1].len();
    assert!(
        keys.len() * 10 > total * 9,
        "{} of {total} trained",
        keys.len()
    );
}

#[test]
fn caches_that_do_not_fit_together_are_refused_naming_the_tensor() {
    let refused = |a: &str, b: &str| Mix::new(vec![open(a), open(b)]).unwrap_err().to_string();
    let msg = refused("a", "e");
    assert!(
        msg.contains("tensor \"x\"") && msg.contains("shape"),
        "{msg}"
    );
    let msg = refused("c", "d");
    assert!(
        msg.contains("\"sensor_id\"") && msg.contains("vocabulary"),
        "{msg}"
    );
    let msg = refused("a", "d");
    assert!(msg.contains("\"sensor_id\""), "{msg}");
    // Issue 39, class A: raw ticks beside z-scores, and z-scores about other means, are one
    // column of values that mean different things; an unfitted chain means the same in both.
    let msg = refused("a", "f");
    assert!(
        msg.contains("column \"time\"") && msg.contains("zscore(mean") && msg.contains("as it is"),
        "{msg}"
    );
    let msg = refused("f", "g");
    let means = |c: &str| match &open(c).manifest().tensor("x").unwrap().columns[0].encoding {
        dsc_format::Encoding::Numeric { stages, .. } => stages[0].describe(),
        other => panic!("{other:?}"),
    };
    assert_ne!(means("f"), means("g"), "fitted on other files");
    assert!(
        msg.contains(&means("f")) && msg.contains(&means("g")),
        "{msg}"
    );
    Mix::new(vec![open("h"), open("i")]).expect("log1p means the same in both caches");
    // What a bad value was stored as (each cache's own mean) may differ: it imputes, in the
    // same units as the rest (from review: these were refused).
    let fill = |c: &str| match &open(c).manifest().tensor("x").unwrap().columns[1].encoding {
        dsc_format::Encoding::Numeric { fill, .. } => *fill,
        other => panic!("{other:?}"),
    };
    assert_ne!(fill("j"), fill("k"), "means of other files");
    Mix::new(vec![open("j"), open("k")]).expect("imputed values do not change the units");
    let mix = mix();
    let bad = |o: LoaderOptions| match mix.loader(o) {
        Err(LoadError::Options(e)) => e.key,
        other => panic!("{other:?}"),
    };
    assert_eq!(bad(opts(8, &[1.0, 2.0, 3.0], None)), "weights");
    assert_eq!(bad(opts(8, &[1.0, -1.0], None)), "weights");
    assert_eq!(
        bad(opts(8, &[1.0, 1e-4], None)),
        "weights",
        "never drawn in a window"
    );
    let bucket = LoaderOptions {
        order: OrderSpec {
            batches: Batches::Bucketed,
            ..opts(8, &[], None).order
        },
        ..opts(8, &[], None)
    };
    assert_eq!(bad(bucket), "bucket");
    let one = open("a").loader(opts(8, &[1.0, 1.0], None)).unwrap_err();
    assert!(matches!(one, LoadError::Options(e) if e.key == "weights"));
    // One weight of one cache too: the rule of every front end (issue 52 C19: `dsc order
    // --weights 1` and `dsc-train --weights 1` were taken where Python refused it).
    let one = open("a").loader(opts(8, &[1.0], None)).unwrap_err();
    assert!(matches!(one, LoadError::Options(e) if e.key == "weights"));
    let err = crate::util::dsc(
        dir(),
        &["order", "a", "--weights", "1", "--batch-size", "4"],
    )
    .fails(2);
    assert!(
        err.contains("--weights is for a mix: pass two or more caches"),
        "{err}"
    );
}

#[test]
fn dsc_order_reports_a_mixs_realised_shares() {
    let out = dsc(
        dir(),
        &[
            "order",
            "a",
            "b",
            "--weights",
            "0.7,0.3",
            "--mix-samples",
            "100000",
            "--json",
        ],
    )
    .ok();
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mix = report["mix"].as_array().unwrap();
    assert_eq!(mix.len(), 2);
    for (m, w) in mix.iter().zip([0.7, 0.3]) {
        let share = m["share"].as_f64().unwrap();
        assert!((share - w).abs() / w < 0.01, "{m}");
        assert_eq!(m["weight"].as_f64().unwrap(), w);
    }
    assert!(
        mix[0]["passes"].as_f64().unwrap() > 200.0,
        "a small cache read many times"
    );
    // The keys the loader gives, as the CLI prints them.
    let cli: Vec<Vec<i64>> = serde_json::from_str(
        &dsc(
            dir(),
            &[
                "order",
                "a",
                "b",
                "--weights",
                "0.6,0.4",
                "--mix-samples",
                "3000",
                "--window",
                "500",
                "--batch-size",
                "12",
                "--keys",
                "--json",
            ],
        )
        .ok(),
    )
    .unwrap();
    assert_eq!(
        cli,
        keys(
            &Mix::new(vec![open("a"), open("b")]).unwrap(),
            opts(12, &[0.6, 0.4], Some(3000))
        )
    );
    let err = dsc(dir(), &["order", "a", "e"]).fails(2);
    assert!(
        err.contains("cannot be mixed") && err.contains("\"x\""),
        "{err}"
    );
}

#[test]
fn hostile_numbers_and_the_same_data_twice_are_refused_naming_the_option() {
    let refused = |args: &[&str], says: &str| {
        let err = dsc(dir(), args).fails(2);
        assert!(err.contains(says), "{args:?}: {err}");
    };
    // Each panicked on an overflow (or aborted on an allocation) before.
    refused(
        &["order", "a", "--epoch", "18446744073709551615"],
        "--epoch 18446744073709551615 is past 2^63 - 1",
    );
    refused(
        &["order", "a", "b", "--epoch", "9223372036854775800"],
        "past 2^64 positions of the mix",
    );
    refused(
        &["order", "a", "b", "--mix-samples", "18446744073709551615"],
        "--mix-samples 18446744073709551615: at most 2^48 positions per epoch",
    );
    refused(
        &["order", "a", "b", "--mix-samples", "100000000000"],
        "its report needs more than half of this machine's memory",
    );
    // Relative weights: equal huge ones are an even mix, not each 0 of an infinite sum.
    let report: serde_json::Value = serde_json::from_str(
        &dsc(
            dir(),
            &[
                "order",
                "a",
                "b",
                "--weights",
                "1e308,1e308",
                "--mix-samples",
                "4000",
                "--json",
            ],
        )
        .ok(),
    )
    .unwrap();
    for m in report["mix"].as_array().unwrap() {
        let share = m["share"].as_f64().unwrap();
        assert!((share - 0.5).abs() < 0.01, "{m}");
        // Issue 39, class F: reported as `weight 0.0000` (each over an infinite sum).
        assert_eq!(m["weight"].as_f64(), Some(0.5), "{m}");
    }
    refused(
        &["order", "a", "b", "--weights", "1e-300,1"],
        "--weights 1e-300 of cache a is under one position",
    );
    // The same data twice (one cache, or a copy of it) would deliver each context twice.
    refused(&["order", "a", "a"], "hold the same data");
    let keys = Mix::new(vec![open("a"), open("a")])
        .unwrap()
        .loader(opts(4, &[], None));
    assert!(matches!(keys, Err(dsc_loader::LoadError::Options(o)) if o.key == "weights"));
}

/// A curriculum over the mix of `a` and `b`: mostly `a`, then a linear move to mostly `b`, `a`
/// retired, then both back at even weights, over epochs of 1000 positions in blocks of 64.
fn curriculum() -> Vec<Stage> {
    let stage = |at, weights: [f64; 2], linear| Stage {
        at,
        weights: weights.to_vec(),
        linear,
    };
    vec![
        stage(0, [0.9, 0.1], false),
        stage(600, [0.3, 0.7], true),
        stage(1400, [0.0, 1.0], false),
        stage(2000, [0.5, 0.5], false),
    ]
}

fn scheduled(batch: usize, schedule: Vec<Stage>, epoch: u64) -> LoaderOptions {
    LoaderOptions {
        batch_size: batch,
        epoch,
        order: OrderSpec {
            window: 64,
            schedule,
            mix_samples: Some(1000),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A schedule draws each cache's own epochs one after another whatever its stages (none lost,
/// none repeated), leaves a retired cache out, and a state taken at any step (before, at or
/// after a stage change) resumes on the uninterrupted batches, at the same or another global
/// batch, padded or packed.
#[test]
fn a_schedule_is_exact_and_resumes_anywhere() {
    let mix = mix();
    let (in_a, in_b) = (keys_of(&open("a")), keys_of(&open("b")));
    let mut drawn: [Vec<i64>; 2] = [Vec::new(), Vec::new()];
    for epoch in 0..3 {
        let batches = keys(&mix, scheduled(12, curriculum(), epoch));
        // Batches of 8 deliver all 1000 positions of an epoch (of 12, drop_last leaves 4).
        for k in keys(&mix, scheduled(8, curriculum(), epoch))
            .iter()
            .flatten()
        {
            drawn[usize::from(in_b.contains(k))].push(*k);
        }
        if epoch == 1 {
            // Positions 1448.. (the first block from 1400) to 2000 hold no `a`.
            let retired: Vec<&i64> = batches.iter().flatten().skip(448).collect();
            assert!(retired.iter().all(|k| in_b.contains(k)), "a is retired");
        }
        for (batch, world, step) in [
            (12, 1, 5),
            (12, 1, 37),
            (12, 1, 50),
            (8, 1, 5),
            (6, 2, 37),
            (4, 3, 50),
            (3, 2, 49),
        ] {
            let taken = mix
                .loader_at(scheduled(12, curriculum(), epoch), step)
                .unwrap();
            let state = taken.state();
            let mut ranks = Vec::new();
            for rank in 0..world {
                let o = LoaderOptions {
                    rank,
                    world_size: world,
                    ..scheduled(batch, curriculum(), epoch)
                };
                let rest = mix.loader_from_state(o, &state).unwrap();
                ranks.push(rest.map(|b| b.unwrap().keys()).collect::<Vec<_>>());
            }
            let resumed: Vec<i64> = (0..ranks[0].len())
                .flat_map(|s| ranks.iter().flat_map(move |r| r[s].clone()))
                .collect();
            let whole: Vec<i64> = batches.iter().flatten().copied().collect();
            // With drop_last, the global batches of another size end elsewhere.
            let n = resumed.len().min(whole.len() - step * 12);
            assert_eq!(
                resumed[..n],
                whole[step * 12..step * 12 + n],
                "epoch {epoch} step {step} at {batch} x {world}"
            );
        }
    }
    // Each cache's draws: its keys once per own epoch, one epoch after another.
    for (cache, d) in [(&in_a, &drawn[0]), (&in_b, &drawn[1])] {
        for chunk in d.chunks(cache.len()) {
            let distinct: BTreeSet<&i64> = chunk.iter().collect();
            assert_eq!(distinct.len(), chunk.len(), "a context repeated");
            assert!(chunk.iter().all(|k| cache.contains(k)));
        }
    }
    assert!(drawn[0].len() > in_a.len(), "a read past its first epoch");
    // Packed: a state at any pack resumes on the same packs, on one rank or spread over two.
    let packed = |epoch, rank, world_size| LoaderOptions {
        order: OrderSpec {
            batches: Batches::Packed(Pack::tokens(512)),
            ..scheduled(1, curriculum(), epoch).order
        },
        rank,
        world_size,
        ..scheduled(1, curriculum(), epoch)
    };
    let whole = keys(&mix, packed(1, 0, 1));
    for step in [0, 3, whole.len() / 2] {
        let state = mix.loader_at(packed(1, 0, 1), step).unwrap().state();
        let rest: Vec<Vec<i64>> = mix
            .loader_from_state(packed(1, 0, 1), &state)
            .unwrap()
            .map(|b| b.unwrap().keys())
            .collect();
        assert_eq!(rest, whole[step..], "packed step {step}");
        let ranks: Vec<Vec<Vec<i64>>> = (0..2)
            .map(|rank| {
                mix.loader_from_state(packed(1, rank, 2), &state)
                    .unwrap()
                    .map(|b| b.unwrap().keys())
                    .collect()
            })
            .collect();
        // Step s of two ranks holds the packs 2s and 2s + 1 of one rank's run.
        let spread: Vec<Vec<i64>> = (0..ranks[0].len())
            .flat_map(|s| ranks.iter().map(move |r| r[s].clone()))
            .collect();
        assert!(spread.len() + 1 >= whole.len() - step, "packed step {step}");
        assert_eq!(
            spread,
            whole[step..step + spread.len()],
            "packed step {step}, 2 ranks"
        );
    }
}

/// A resume may change the stages that start after the state's position (taken: the same
/// batches up to the end of its block, the new weights after), not one before it (refused,
/// naming the stage), and the state records the schedule it ran.
#[test]
fn a_schedule_is_amended_past_a_state_and_refused_before_it() {
    let mix = mix();
    let state = mix
        .loader_at(scheduled(12, curriculum(), 0), 60)
        .unwrap()
        .state();
    assert_eq!(
        state.order.schedule,
        curriculum(),
        "the state records its schedule"
    );
    // Position 720, in stage 1: `a` retired from 800 instead of 1400.
    let mut later = curriculum();
    later[2].at = 800;
    let start = mix
        .check_state(&scheduled(12, later.clone(), 0), &state)
        .unwrap();
    assert_eq!(start.step, 60);
    let old: Vec<i64> = keys(&mix, scheduled(12, curriculum(), 0)).concat();
    let new: Vec<i64> = mix
        .loader_from_state(scheduled(12, later.clone(), 0), &state)
        .unwrap()
        .flat_map(|b| b.unwrap().keys())
        .collect();
    // The same up to the end of the block of position 720 (768), then b alone from 832.
    assert_eq!(new[..768 - 720], old[720..768]);
    let in_b = keys_of(&open("b"));
    assert!(new[832 - 720..].iter().all(|k| in_b.contains(k)));
    assert!(!old[832..].iter().all(|k| in_b.contains(k)));
    // Stage 2 moved to 700, before the state's position.
    let mut earlier = curriculum();
    earlier[2].at = 700;
    for err in [
        mix.check_state(&scheduled(12, earlier.clone(), 0), &state)
            .unwrap_err(),
        mix.loader_from_state(scheduled(12, earlier, 0), &state)
            .unwrap_err(),
    ] {
        let text = err.to_string();
        assert!(
            text.contains("stage 2 differs before") && text.contains("(720)"),
            "{text}"
        );
    }
    // Stage 2 made linear would ramp from stage 1's start, before the state's position.
    let mut ramped = curriculum();
    ramped[2].linear = true;
    let err = mix
        .check_state(&scheduled(12, ramped, 0), &state)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Stage 2 is linear and after the position") && err.contains("stage 1's"),
        "{err}"
    );
    // At 360 the ramp to stage 1 is under way: moving its end changes the past.
    let at_360 = mix
        .loader_at(scheduled(12, curriculum(), 0), 30)
        .unwrap()
        .state();
    let mut stretched = curriculum();
    stretched[1].at = 700;
    let err = mix
        .check_state(&scheduled(12, stretched, 0), &at_360)
        .unwrap_err()
        .to_string();
    assert!(err.contains("stage 1 differs"), "{err}");
}

/// `dsc bench CACHE --mix OTHER --schedule FILE` times the mix's shuffled epoch at fixed
/// weights and by its schedule in one run, and says what the schedule costs; a schedule that
/// cannot be drawn is refused before anything is timed.
#[test]
fn dsc_bench_times_a_mix_by_its_weights_and_its_schedule() {
    let file = dir().join("bench-curriculum.json");
    std::fs::write(&file, serde_json::to_string(&curriculum()).unwrap()).unwrap();
    let bench = |schedule: &str, json: bool| {
        let mut a = vec![
            "bench",
            "a",
            "--mix",
            "b",
            "--schedule",
            schedule,
            "--mix-samples",
            "1000",
            "--window",
            "64",
            "--batch-size",
            "8",
            "--repeat",
            "1",
        ];
        if json {
            a.push("--json");
        }
        dsc(dir(), &a)
    };
    let r: serde_json::Value =
        serde_json::from_str(&bench("bench-curriculum.json", true).ok()).unwrap();
    assert_eq!(r["mix_caches"], 2, "{r}");
    assert_eq!(r["mix_contexts"], 1000, "{r}");
    for field in [
        "contexts_per_s_mixed",
        "contexts_per_s_scheduled",
        "scheduled_over_mixed",
    ] {
        assert!(r[field].as_f64().is_some_and(|v| v > 0.0), "{field} in {r}");
    }
    let ratio = r["contexts_per_s_scheduled"].as_f64().unwrap()
        / r["contexts_per_s_mixed"].as_f64().unwrap();
    let said = r["scheduled_over_mixed"].as_f64().unwrap();
    assert!((ratio - said).abs() < 1e-9 * said, "{r}");
    let text = bench("bench-curriculum.json", false).ok();
    assert!(text.contains("schedul"), "{text}");
    std::fs::write(
        dir().join("bench-late.json"),
        r#"[{"at": 5, "weights": [1, 1]}]"#,
    )
    .unwrap();
    let err = bench("bench-late.json", true).fails(2);
    assert!(err.contains("stage 0 starts at 5"), "{err}");
}

/// `dsc order --schedule FILE` reports each stage's realised shares beside its target, and
/// refuses a schedule that cannot be drawn, naming the stage.
#[test]
fn dsc_order_reports_a_schedule_and_refuses_bad_ones() {
    let file = dir().join("curriculum.json");
    std::fs::write(&file, serde_json::to_string(&curriculum()).unwrap()).unwrap();
    let args = |extra: &[&str]| {
        let mut a = vec![
            "order",
            "a",
            "b",
            "--schedule",
            "curriculum.json",
            "--window",
            "64",
            "--mix-samples",
            "1000",
            "--batch-size",
            "12",
        ];
        a.extend_from_slice(extra);
        a.iter().map(ToString::to_string).collect::<Vec<_>>()
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        dsc(dir(), &a)
    };
    let report: serde_json::Value =
        serde_json::from_str(&run(&["--epoch", "2", "--json"]).ok()).unwrap();
    let stages = report["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 4, "{report}");
    for s in stages {
        let gap = s["largest_gap"].as_f64().unwrap();
        // A constant stage inside one epoch is one segment: within a position of its target.
        if matches!(s["stage"].as_u64(), Some(0) | Some(2)) {
            assert!(gap < 1.0, "{s}");
        }
        let (realised, target) = (&s["realised"], &s["target"]);
        for k in 0..2 {
            let (r, t) = (realised[k].as_f64().unwrap(), target[k].as_f64().unwrap());
            assert!((r - t).abs() < 0.01, "{s}");
        }
    }
    assert_eq!(stages[2]["realised"][0].as_f64(), Some(0.0), "a retired");
    let text = run(&["--epoch", "1"]).ok();
    assert!(text.contains("stage 2 from 1400"), "{text}");
    // The same keys as the Rust loader.
    let cli: Vec<Vec<i64>> = serde_json::from_str(&run(&["--keys", "--json"]).ok()).unwrap();
    assert_eq!(cli, keys(&mix(), scheduled(12, curriculum(), 0)));
    for (schedule, says) in [
        (r#"[{"at": 5, "weights": [1, 1]}]"#, "stage 0 starts at 5"),
        (
            r#"[{"at": 0, "weights": [1, 1]}, {"at": 0, "weights": [1, 2]}]"#,
            "stage 1 starts at 0, not after stage 0",
        ),
        (
            r#"[{"at": 0, "weights": [1, 1, 1]}]"#,
            "stage 0 gives 3 weights for 2 caches",
        ),
        (
            r#"[{"at": 0, "weights": [0, 0]}]"#,
            "stage 0 weighs every cache 0",
        ),
        (
            r#"[{"at": 0, "weights": [1, -1]}]"#,
            "stage 0: -1 is not a weight",
        ),
        (
            r#"[{"at": 0, "weights": [1, 1], "linear": true}]"#,
            "stage 0 is linear",
        ),
        (
            r#"[{"at": 0, "weights": [1000, 1]}]"#,
            "under one position in a window of 64",
        ),
        (
            r#"[{"step": 3, "weights": [1, 1]}, {"at": 9, "weights": [1, 2]}]"#,
            "stage 0 starts at 36",
        ),
        (r#"[]"#, "names no stage"),
        (r#"{"at": 0}"#, "is not a schedule"),
    ] {
        std::fs::write(&file, schedule).unwrap();
        let err = run(&[]).fails(2);
        assert!(err.contains(says), "{schedule}: {err}");
    }
    std::fs::write(&file, serde_json::to_string(&curriculum()).unwrap()).unwrap();
    let err = run(&["--weights", "1,1"]).fails(2);
    assert!(err.contains("exclude each other"), "{err}");
}
