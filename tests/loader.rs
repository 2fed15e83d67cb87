//! The loader on real compiled caches: coverage, determinism, ranks, resume, trimming, bytes,
//! and damaged shards.

use crate::util::*;
use dsc_loader::{Batches, Cache, LoadError, LoaderOptions, OrderSpec};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// One compiled IceCube-like cache with many small shards, shared by the tests (read-only).
fn cache_dir() -> &'static std::path::Path {
    static DIR: OnceLock<Dir> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = Dir::new();
        gen_icecube(&dir, 2, 300);
        dsc(
            dir.path(),
            &icecube_args("cache", &["--shard-size", "96KiB"]),
        )
        .ok();
        dir
    });
    Box::leak(Box::new(dir.join("cache")))
}

fn opts(batch: usize) -> LoaderOptions {
    LoaderOptions {
        batch_size: batch,
        order: OrderSpec {
            window: 100,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn keys_by_step(cache: &Cache, o: LoaderOptions) -> Vec<Vec<i64>> {
    cache
        .loader(o)
        .unwrap()
        .map(|b| b.unwrap().keys())
        .collect()
}

#[test]
fn every_context_once_per_epoch_across_ranks() {
    let cache = Cache::open(cache_dir()).unwrap();
    let n = cache.manifest().split("train").unwrap().contexts;
    assert!(
        cache.manifest().shards_of("train").count() > 5,
        "several shards"
    );
    for (drop_last, bucket) in [(true, false), (false, false), (true, true), (false, true)] {
        let mut all = Vec::new();
        let mut per_rank = Vec::new();
        for rank in 0..3 {
            let o = LoaderOptions {
                order: OrderSpec {
                    drop_last,
                    batches: shape(bucket),
                    ..opts(7).order
                },
                rank,
                world_size: 3,
                ..opts(7)
            };
            let keys: Vec<i64> = keys_by_step(&cache, o).concat();
            per_rank.push(keys.len());
            all.extend(keys);
        }
        assert!(
            per_rank.iter().all(|&l| l == per_rank[0]),
            "equal rank lengths {per_rank:?}"
        );
        let global = 21;
        let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
        all.iter().for_each(|k| *counts.entry(*k).or_default() += 1);
        if drop_last {
            assert_eq!(all.len(), n / global * global);
            assert!(counts.values().all(|&c| c == 1), "no context twice");
        } else {
            assert_eq!(all.len(), n.div_ceil(global) * global);
            assert_eq!(counts.len(), n, "every context present");
            let repeated: usize = counts.values().map(|c| c - 1).sum();
            assert_eq!(
                repeated,
                n.div_ceil(global) * global - n,
                "only the padding repeats"
            );
        }
    }
}

#[test]
fn order_is_a_function_of_seed_and_epoch() {
    for bucket in [false, true] {
        order_is_a_function_of_seed_and_epoch_with(bucket);
    }
}

/// Length-bucketed batches, or padded ones.
fn shape(bucket: bool) -> Batches {
    if bucket {
        Batches::Bucketed
    } else {
        Batches::Padded
    }
}

fn order_is_a_function_of_seed_and_epoch_with(bucket: bool) {
    let cache = Cache::open(cache_dir()).unwrap();
    let opts = |batch| LoaderOptions {
        order: OrderSpec {
            batches: shape(bucket),
            ..opts(batch).order
        },
        ..opts(batch)
    };
    let a = keys_by_step(&cache, opts(16));
    assert_eq!(a, keys_by_step(&cache, opts(16)));
    assert_ne!(
        a,
        keys_by_step(
            &cache,
            LoaderOptions {
                epoch: 1,
                ..opts(16)
            }
        )
    );
    assert_ne!(
        a,
        keys_by_step(
            &cache,
            LoaderOptions {
                order: OrderSpec {
                    seed: 5,
                    ..opts(16).order
                },
                ..opts(16)
            }
        )
    );
    // Thread count changes nothing.
    assert_eq!(
        a,
        keys_by_step(
            &cache,
            LoaderOptions {
                threads: 0,
                ..opts(16)
            }
        )
    );
    assert_eq!(
        a,
        keys_by_step(
            &cache,
            LoaderOptions {
                threads: 3,
                prefetch: 1,
                ..opts(16)
            }
        )
    );
    if bucket {
        return;
    }
    // Unshuffled is the compiled order.
    let (_, compiled) = read_cache(cache_dir());
    let flat: Vec<i64> = keys_by_step(
        &cache,
        LoaderOptions {
            order: OrderSpec {
                shuffle: false,
                drop_last: false,
                ..opts(16).order
            },
            ..opts(16)
        },
    )
    .concat();
    assert_eq!(flat[..compiled["train"].len()], compiled["train"][..]);
}

#[test]
fn the_global_order_does_not_depend_on_world_size() {
    let cache = Cache::open(cache_dir()).unwrap();
    let global = |world: usize, bucket: bool| -> Vec<Vec<i64>> {
        let ranks: Vec<Vec<Vec<i64>>> = (0..world)
            .map(|rank| {
                keys_by_step(
                    &cache,
                    LoaderOptions {
                        order: OrderSpec {
                            batches: shape(bucket),
                            ..opts(12 / world).order
                        },
                        rank,
                        world_size: world,
                        ..opts(12 / world)
                    },
                )
            })
            .collect();
        (0..ranks[0].len())
            .map(|s| ranks.iter().flat_map(|r| r[s].clone()).collect())
            .collect()
    };
    for bucket in [false, true] {
        let one = global(1, bucket);
        assert_eq!(one, global(2, bucket));
        assert_eq!(one, global(4, bucket));
    }
    // Rank slices of one step are disjoint.
    let two: Vec<Vec<i64>> = (0..2)
        .map(|rank| {
            keys_by_step(
                &cache,
                LoaderOptions {
                    rank,
                    world_size: 2,
                    ..opts(6)
                },
            )
            .concat()
        })
        .collect();
    assert!(two[0].iter().all(|k| !two[1].contains(k)));
}

#[test]
fn trimmed_batches_equal_untrimmed_ones_cut_to_length() {
    let cache = Cache::open(cache_dir()).unwrap();
    let full: Vec<_> = cache.loader(opts(8)).unwrap().map(Result::unwrap).collect();
    let trimmed: Vec<_> = cache
        .loader(LoaderOptions {
            trim: Some(1),
            ..opts(8)
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let l = cache.manifest().max_len();
    let mut shorter = 0;
    for (f, t) in full.iter().zip(&trimmed) {
        let lengths: Vec<i32> = t
            .tensor("length")
            .unwrap()
            .bytes()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(t.seq_len, *lengths.iter().max().unwrap() as usize);
        shorter += usize::from(t.seq_len < l);
        for (ft, tt) in f.tensors().iter().zip(t.tensors()) {
            let seq = matches!(
                ft.role(),
                Some(dsc_loader::TensorRole::Features | dsc_loader::TensorRole::Categorical)
            );
            if !seq {
                assert_eq!(ft.bytes(), tt.bytes(), "{}", ft.name());
                continue;
            }
            let step = ft.bytes().len() / f.size / l;
            assert_eq!(tt.shape()[1], t.seq_len);
            for i in 0..f.size {
                let a = &ft.bytes()[i * l * step..i * l * step + t.seq_len * step];
                let b = &tt.bytes()[i * t.seq_len * step..(i + 1) * t.seq_len * step];
                assert_eq!(a, b, "{} sample {i}", ft.name());
            }
        }
    }
    assert!(shorter > 0, "trimming shortened some batches");
}

fn lengths_of(batch: &dsc_loader::Batch) -> Vec<i32> {
    batch
        .tensor("length")
        .unwrap()
        .bytes()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Bucketing regroups each window's contexts: the global batches of a window are its contexts
/// sorted by length and cut into whole batches (in some order), each trimmed to its longest,
/// with the same bytes as an unbucketed batch of those contexts; and the batches' order
/// differs between epochs.
#[test]
fn bucketed_batches_are_a_windows_contexts_sorted_by_length() {
    let cache = Cache::open(cache_dir()).unwrap();
    let window = 60; // rounded up to 64 for global batches of 8 (4 x 2 ranks)
    let o = |rank, epoch| LoaderOptions {
        order: OrderSpec {
            window,
            batches: Batches::Bucketed,
            ..opts(4).order
        },
        rank,
        world_size: 2,
        epoch,
        ..opts(4)
    };
    let ranks: Vec<Vec<dsc_loader::Batch>> = (0..2)
        .map(|r| cache.loader(o(r, 0)).unwrap().map(Result::unwrap).collect())
        .collect();
    let global: Vec<Vec<i32>> = (0..ranks[0].len())
        .map(|s| [lengths_of(&ranks[0][s]), lengths_of(&ranks[1][s])].concat())
        .collect();
    for (s, batches) in ranks.iter().flatten().enumerate() {
        let longest = *lengths_of(batches).iter().max().unwrap() as usize;
        assert_eq!(
            batches.seq_len,
            longest.max(1),
            "batch {s} trimmed to its longest"
        );
    }
    let per_window = 64 / 8;
    let mut spread = 0;
    for (w, chunk) in global.chunks(per_window).enumerate() {
        let mut all: Vec<i32> = chunk.concat();
        all.sort_unstable();
        let mut expect: Vec<Vec<i32>> = all.chunks(8).map(<[i32]>::to_vec).collect();
        let mut got: Vec<Vec<i32>> = chunk
            .iter()
            .map(|b| {
                let mut b = b.clone();
                b.sort_unstable();
                b
            })
            .collect();
        if chunk.len() == per_window {
            expect.sort();
            got.sort();
            assert_eq!(
                got, expect,
                "window {w}: batches are its sorted lengths, cut"
            );
        }
        spread += got.iter().map(|b| b[7] - b[0]).sum::<i32>();
    }
    let plain: Vec<Vec<i32>> = cache
        .loader(LoaderOptions {
            order: OrderSpec {
                batches: Batches::Padded,
                ..opts(8).order
            },
            rank: 0,
            world_size: 1,
            ..opts(8)
        })
        .unwrap()
        .map(|b| lengths_of(&b.unwrap()))
        .collect();
    let plain_spread: i32 = plain
        .iter()
        .map(|b| b.iter().max().unwrap() - b.iter().min().unwrap())
        .sum();
    assert!(spread * 4 < plain_spread, "{spread} vs {plain_spread}");
    // The same contexts with bucketing off give the same bytes, cut to the batch's length.
    let all_bytes: BTreeMap<i64, Vec<u8>> = cache
        .loader(LoaderOptions {
            order: OrderSpec {
                shuffle: false,
                drop_last: false,
                ..opts(1).order
            },
            ..opts(1)
        })
        .unwrap()
        .map(|b| {
            let b = b.unwrap();
            (b.keys()[0], b.tensor("x").unwrap().bytes().to_vec())
        })
        .collect();
    let l = cache.manifest().max_len();
    for b in &ranks[0] {
        let x = b.tensor("x").unwrap().bytes();
        let per = x.len() / b.size;
        for (i, k) in b.keys().iter().enumerate() {
            let full = &all_bytes[k];
            let step = full.len() / l;
            assert_eq!(&x[i * per..(i + 1) * per], &full[..b.seq_len * step]);
        }
    }
    let epoch = |e| keys_by_step(&cache, o(0, e));
    assert_ne!(epoch(0), epoch(1));
}

#[test]
fn batch_bytes_equal_the_shard_bytes_of_those_contexts() {
    let cache = Cache::open(cache_dir()).unwrap();
    // Every sample of the cache by key, as the safetensors crate reads it.
    let mut by_key: BTreeMap<i64, BTreeMap<String, Vec<u8>>> = BTreeMap::new();
    for shard in cache.manifest().shards_of("train") {
        let tensors = read_shard(&cache_dir().join(&shard.file));
        let keys = tensors["key"].i64s();
        for (i, k) in keys.iter().enumerate() {
            let per = tensors
                .iter()
                .map(|(name, t)| {
                    let n = t.bytes.len() / keys.len();
                    (name.clone(), t.bytes[i * n..(i + 1) * n].to_vec())
                })
                .collect();
            by_key.insert(*k, per);
        }
    }
    for shuffle in [true, false] {
        let mut zero_copy = 0;
        for batch in cache
            .loader(LoaderOptions {
                order: OrderSpec {
                    shuffle,
                    ..opts(10).order
                },
                ..opts(10)
            })
            .unwrap()
        {
            let batch = batch.unwrap();
            zero_copy += usize::from(batch.is_zero_copy());
            for (i, k) in batch.keys().iter().enumerate() {
                for t in batch.tensors() {
                    let n = t.bytes().len() / batch.size;
                    assert_eq!(
                        &t.bytes()[i * n..(i + 1) * n],
                        &by_key[k][t.name()][..],
                        "key {k} tensor {}",
                        t.name()
                    );
                }
            }
        }
        if shuffle {
            assert_eq!(zero_copy, 0);
        } else {
            assert!(
                zero_copy > 0,
                "cache-order batches inside one shard are views"
            );
        }
    }
}

/// A cache's loaders hand their gather buffers on: the second epoch (a new loader) allocates
/// none, so it does not fault in and zero fresh pages again.
#[test]
fn later_epochs_reuse_the_gather_buffers() {
    let cache = Cache::open(cache_dir()).unwrap();
    let epoch = |epoch: u64| {
        // Counted from before the loader is built: it must not copy the manifest's specs
        // either, whose sensor vocabulary is this cache's largest piece of metadata.
        let before = large_allocations_on_this_thread();
        // Gathered in this thread (threads: 0), so that its allocations are the loader's.
        let loader = cache
            .loader(LoaderOptions {
                epoch,
                threads: 0,
                ..opts(64)
            })
            .unwrap();
        let mut batches = 0;
        for batch in loader {
            let batch = batch.unwrap();
            assert!(batch.tensor("x").unwrap().bytes().len() >= 64 << 10);
            batches += 1;
        }
        assert!(batches > 3);
        large_allocations_on_this_thread() - before
    };
    assert!(epoch(0) > 0, "the first epoch allocates its buffers");
    assert_eq!(epoch(1), 0, "the next epoch's loader reuses them");
    assert_eq!(epoch(2), 0);
}

/// Threads beyond the cores only take turns on them where the gather never waits on the
/// disk: a resident split runs one per core at most, and yields the same batches.
#[test]
fn a_resident_split_runs_at_most_one_thread_per_core() {
    let cache = Cache::open(cache_dir()).unwrap();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let with = |threads: usize| LoaderOptions {
        threads,
        ..opts(16)
    };
    assert_eq!(cache.loader(with(cores + 3)).unwrap().threads(), cores);
    assert_eq!(cache.loader(with(1)).unwrap().threads(), 1);
    assert_eq!(cache.loader(with(0)).unwrap().threads(), 0);
    assert_eq!(
        keys_by_step(&cache, with(cores + 3)),
        keys_by_step(&cache, with(1))
    );
}

#[test]
fn next_into_fills_caller_buffers_like_the_iterator() {
    let cache = Cache::open(cache_dir()).unwrap();
    let batches: Vec<_> = cache.loader(opts(9)).unwrap().map(Result::unwrap).collect();
    let mut loader = cache
        .loader(LoaderOptions {
            threads: 0,
            ..opts(9)
        })
        .unwrap();
    let mut bufs: Vec<Vec<u8>> = loader
        .batch_bytes()
        .into_iter()
        .map(|n| vec![0u8; n])
        .collect();
    let mut i = 0;
    loop {
        let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
        let Some(_) = loader.next_into(&mut slices).unwrap() else {
            break;
        };
        for (t, buf) in batches[i].tensors().iter().zip(&bufs) {
            assert_eq!(t.bytes(), &buf[..t.bytes().len()]);
        }
        i += 1;
    }
    assert_eq!(i, batches.len());
}

#[test]
fn fillers_on_several_threads_give_the_iterators_batches() {
    let cache = Cache::open(cache_dir()).unwrap();
    let o = LoaderOptions {
        trim: Some(1),
        ..opts(9)
    };
    let batches: Vec<_> = cache
        .loader(o.clone())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut loader = cache.loader(LoaderOptions { threads: 0, ..o }).unwrap();
    let filler = loader.filler();
    let steps = loader.steps();
    let sizes = loader.batch_bytes();
    // Three threads fill interleaved steps; the caller orders them.
    let filled: Vec<(usize, usize, Vec<Vec<u8>>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|k| {
                let (filler, sizes) = (filler.clone(), sizes.clone());
                s.spawn(move || {
                    (k..steps)
                        .step_by(3)
                        .map(|step| {
                            let mut bufs: Vec<Vec<u8>> =
                                sizes.iter().map(|&n| vec![0; n]).collect();
                            let mut slices: Vec<&mut [u8]> =
                                bufs.iter_mut().map(Vec::as_mut_slice).collect();
                            let seq_len = filler.fill(step, &mut slices).unwrap().seq_len;
                            (step, seq_len, bufs)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<_> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        all.sort_by_key(|f| f.0);
        all
    });
    assert_eq!(filled.len(), batches.len());
    for ((step, seq_len, bufs), batch) in filled.iter().zip(&batches) {
        assert_eq!((*step, *seq_len), (batch.step, batch.seq_len));
        for (t, buf) in batch.tensors().iter().zip(bufs) {
            assert_eq!(
                t.bytes(),
                &buf[..t.bytes().len()],
                "step {step} {}",
                t.name()
            );
        }
    }
    assert_eq!(loader.state().samples, 0);
    loader.advance(steps + 5);
    assert_eq!(
        loader.state().samples,
        steps * 9,
        "advance stops at the epoch's end"
    );
    assert!(filler.fill(steps, &mut []).is_err());
}

#[test]
fn columns_load_a_subset_with_the_same_bytes() {
    let cache = Cache::open(cache_dir()).unwrap();
    let full: Vec<_> = cache.loader(opts(9)).unwrap().map(Result::unwrap).collect();
    let o = LoaderOptions {
        columns: vec!["y".into(), "key".into()],
        ..opts(9)
    };
    let part: Vec<_> = cache.loader(o).unwrap().map(Result::unwrap).collect();
    assert_eq!(full.len(), part.len());
    for (f, p) in full.iter().zip(&part) {
        let names: Vec<&str> = p.tensors().iter().map(|t| t.name()).collect();
        assert_eq!(names, ["key", "y"], "manifest order");
        for t in p.tensors() {
            assert_eq!(t.bytes(), f.tensor(t.name()).unwrap().bytes());
        }
    }
    let err = cache
        .loader(LoaderOptions {
            columns: vec!["nope".into()],
            ..opts(9)
        })
        .unwrap_err();
    assert!(err.to_string().contains("no tensor \"nope\""), "{err}");
    let err = cache
        .loader(LoaderOptions {
            batch_size: usize::MAX / 2,
            world_size: 4,
            ..opts(9)
        })
        .unwrap_err();
    assert!(err.to_string().contains("overflows"), "{err}");
    let err = cache
        .loader(LoaderOptions {
            batch_size: usize::MAX / 8,
            ..opts(9)
        })
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("more than half of this machine's memory"),
        "{err}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// Stopping after any number of batches and resuming from the state (on any rank layout
    /// with the same global batch) continues with exactly the batches of an uninterrupted run.
    #[test]
    fn resume_anywhere_equals_the_uninterrupted_run(stop in 0usize..60, epoch in 0u64..3, threads in 0usize..3, world in prop::sample::select(vec![1usize, 2, 4]), bucket in any::<bool>()) {
        let cache = Cache::open(cache_dir()).unwrap();
        let base = LoaderOptions { order: OrderSpec { window: 64, batches: shape(bucket), ..opts(8).order }, epoch, threads, ..opts(8) };
        let straight: Vec<Vec<i64>> = keys_by_step(&cache, base.clone());
        let stop = stop.min(straight.len());
        let mut first = cache.loader(base.clone()).unwrap();
        for _ in 0..stop {
            first.next().unwrap().unwrap();
        }
        let state = first.state();
        drop(first);
        let json = serde_json::to_string(&state).unwrap();
        let state: dsc_loader::State = serde_json::from_str(&json).unwrap();
        // Resume on `world` ranks with the same global batch of 8.
        let ranks: Vec<Vec<Vec<i64>>> = (0..world)
            .map(|rank| {
                let o = LoaderOptions { rank, world_size: world, batch_size: 8 / world, threads, ..Default::default() };
                cache.loader_from_state(o, &state).unwrap().map(|b| b.unwrap().keys()).collect()
            })
            .collect();
        let resumed: Vec<Vec<i64>> = (0..ranks[0].len()).map(|s| ranks.iter().flat_map(|r| r[s].clone()).collect()).collect();
        prop_assert_eq!(&resumed[..], &straight[stop..]);
    }
}

/// Issue 30, item 2: a state saved at one global batch continues at another (more or fewer
/// ranks, another batch size) from the same position of the same global order: what the ranks
/// took before and after, in (step, rank) order, is the global order's prefix with nothing
/// repeated or left out. A bucketed order, cut into global batches of its own size, refuses.
#[test]
fn a_state_resumes_at_another_global_batch_from_the_same_position() {
    let cache = Cache::open(cache_dir()).unwrap();
    let at = |batch: usize, world: usize| LoaderOptions {
        world_size: world,
        ..opts(batch)
    };
    // Every rank's batches of a loader, in (step, rank) order: the global order as taken.
    let taken = |loaders: Vec<dsc_loader::Loader>, steps: Option<usize>| -> Vec<i64> {
        let ranks: Vec<Vec<Vec<i64>>> = loaders
            .into_iter()
            .map(|l| {
                l.take(steps.unwrap_or(usize::MAX))
                    .map(|b| b.unwrap().keys())
                    .collect()
            })
            .collect();
        let n = ranks[0].len();
        assert!(
            ranks.iter().all(|r| r.len() == n),
            "every rank takes the same steps"
        );
        (0..n)
            .flat_map(|step| ranks.iter().flat_map(move |r| r[step].clone()))
            .collect()
    };
    let global: Vec<i64> = keys_by_step(&cache, at(1, 1)).concat();
    for ((b, w), (b2, w2), k) in [
        ((8, 1), (3, 2), 5),
        ((4, 2), (16, 1), 3),
        ((6, 1), (5, 1), 7),
    ] {
        let before: Vec<_> = (0..w)
            .map(|r| {
                cache
                    .loader(LoaderOptions {
                        rank: r,
                        ..at(b, w)
                    })
                    .unwrap()
            })
            .collect();
        let mut first = cache.loader(at(b, w)).unwrap();
        (&mut first).take(k).for_each(|b| drop(b.unwrap()));
        let state = first.state();
        assert_eq!(state.samples, k * b * w);
        let after: Vec<_> = (0..w2)
            .map(|r| {
                let o = LoaderOptions {
                    rank: r,
                    ..at(b2, w2)
                };
                cache.loader_from_state(o, &state).unwrap()
            })
            .collect();
        let mut seen = taken(before, Some(k));
        let resumed = taken(after, None);
        seen.extend(&resumed);
        assert_eq!(
            seen[..],
            global[..seen.len()],
            "{b}x{w} -> {b2}x{w2} after {k} steps"
        );
        assert!(
            global.len() - seen.len() < b2 * w2,
            "only a partial global batch is left"
        );
        // The state of the resumed loader counts from the same origin.
        let mut again = cache.loader_from_state(at(b2, w2), &state).unwrap();
        (&mut again).take(2).for_each(|b| drop(b.unwrap()));
        assert_eq!(again.state().samples, k * b * w + 2 * b2 * w2);
    }
    let bucketed = |batch: usize| LoaderOptions {
        order: OrderSpec {
            batches: Batches::Bucketed,
            ..opts(batch).order
        },
        ..opts(batch)
    };
    let state = cache.loader(bucketed(8)).unwrap().state();
    let err = cache.loader_from_state(bucketed(6), &state).unwrap_err();
    assert!(
        matches!(&err, LoadError::State { field, .. } if field == "global_batch"),
        "{err}"
    );
    assert!(err.to_string().contains("bucketed"), "{err}");
}

fn copy_cache(to: &Dir) -> std::path::PathBuf {
    let dst = to.join("cache");
    for (rel, bytes) in tree(cache_dir()) {
        let p = dst.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
    dst
}

#[test]
fn truncated_and_corrupt_shards_are_errors_naming_the_shard() {
    let dir = Dir::new();
    let cache = copy_cache(&dir);
    let shard = cache.join("shards/train-00002.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 1]).unwrap();
    let err = Cache::open(&cache).unwrap_err().to_string();
    assert!(err.contains("train-00002.safetensors: size is"), "{err}");
    // Same size, broken header.
    let mut broken = bytes.clone();
    broken[8..16].copy_from_slice(b"{\"x\":[1,");
    std::fs::write(&shard, &broken).unwrap();
    let err = Cache::open(&cache).unwrap_err().to_string();
    assert!(
        err.contains("train-00002.safetensors: bad safetensors header"),
        "{err}"
    );
    std::fs::remove_file(&shard).unwrap();
    let err = Cache::open(&cache).unwrap_err().to_string();
    assert!(err.contains("train-00002.safetensors"), "{err}");
}

#[test]
fn dsc_order_prints_the_loaders_keys_and_resumes_from_a_state() {
    let dir = Dir::new();
    let cache = copy_cache(&dir);
    let lib = keys_by_step(
        &Cache::open(&cache).unwrap(),
        LoaderOptions {
            epoch: 2,
            ..opts(16)
        },
    );
    let run = |args: &[&str]| dsc(dir.path(), args).ok();
    let base = [
        "order",
        "cache",
        "--epoch",
        "2",
        "--batch-size",
        "16",
        "--window",
        "100",
    ];
    let keys = run(&[&base[..], &["--keys"]].concat());
    let printed: Vec<Vec<i64>> = keys
        .lines()
        .map(|l| l.split(' ').map(|k| k.parse().unwrap()).collect())
        .collect();
    assert_eq!(printed, lib);
    let state = run(&[&base[..], &["--state-after", "5"]].concat());
    std::fs::write(dir.join("state.json"), &state).unwrap();
    // Resume on two ranks of 8: together they continue the same global order.
    let halves: Vec<Vec<Vec<i64>>> = (0..2)
        .map(|rank| {
            let rank = rank.to_string();
            let out = run(&[
                "order",
                "cache",
                "--batch-size",
                "8",
                "--world-size",
                "2",
                "--rank",
                &rank,
                "--from-state",
                "state.json",
                "--keys",
                "--json",
            ]);
            serde_json::from_str(&out).unwrap()
        })
        .collect();
    let resumed: Vec<Vec<i64>> = (0..halves[0].len())
        .map(|s| [halves[0][s].clone(), halves[1][s].clone()].concat())
        .collect();
    assert_eq!(resumed, lib[5..]);
    let report: serde_json::Value =
        serde_json::from_str(&run(&[&base[..], &["--json"]].concat())).unwrap();
    for field in [
        "distinct_shards_per_batch",
        "neighbour_entropy",
        "uniform_entropy",
        "batches_per_rank",
        "window_bytes",
    ] {
        assert!(report[field].as_f64().is_some(), "{field} in {report}");
    }
    assert_eq!(
        report["batches_per_rank"].as_u64().unwrap() as usize,
        lib.len()
    );
    let text = run(&base);
    assert!(
        text.contains("neighbour-distance entropy")
            && text.lines().all(|l| l.chars().count() <= 100),
        "{text}"
    );
    // A bucketed order cannot continue an unbucketed state.
    let err = dsc(
        dir.path(),
        &[
            "order",
            "cache",
            "--batch-size",
            "16",
            "--bucket",
            "--from-state",
            "state.json",
        ],
    )
    .fails(2);
    assert!(err.contains("that state is of padded batches"), "{err}");
    // Bucketed: the loader's keys, and a report against the plain order.
    let bucketed = [&base[..], &["--bucket"]].concat();
    let keys = run(&[&bucketed[..], &["--keys", "--json"]].concat());
    let printed: Vec<Vec<i64>> = serde_json::from_str(&keys).unwrap();
    let lib = keys_by_step(
        &Cache::open(&cache).unwrap(),
        LoaderOptions {
            order: OrderSpec {
                batches: Batches::Bucketed,
                ..opts(16).order
            },
            epoch: 2,
            ..opts(16)
        },
    );
    assert_eq!(printed, lib);
    let r: serde_json::Value =
        serde_json::from_str(&run(&[&bucketed[..], &["--json"]].concat())).unwrap();
    assert_eq!(r["bucket"], true);
    let (b, p) = (
        &r["padding_efficiency"],
        &r["unbucketed"]["padding_efficiency"],
    );
    assert!(b.as_f64().unwrap() > p.as_f64().unwrap() + 0.1, "{r}");
    assert!(
        r["length_spread_in_batch"].as_f64().unwrap()
            < r["unbucketed"]["length_spread_in_batch"].as_f64().unwrap() / 2.0,
        "{r}"
    );
    // --trim-multiple: the shapes of the epoch's batches, fewer than one per length.
    let shapes = |r: &serde_json::Value| -> Vec<usize> {
        let m = r["batch_lens"].as_object().expect("batch_lens");
        let batches: u64 = m.values().map(|n| n.as_u64().unwrap()).sum();
        assert_eq!(batches, r["batches_per_rank"].as_u64().unwrap(), "{r}");
        m.keys().map(|k| k.parse().unwrap()).collect()
    };
    let rounded: serde_json::Value =
        serde_json::from_str(&run(
            &[&bucketed[..], &["--trim-multiple", "8", "--json"]].concat()
        ))
        .unwrap();
    let (exact, ladder) = (shapes(&r), shapes(&rounded));
    assert!(ladder.len() < exact.len(), "{ladder:?} {exact:?}");
    let max_len = Cache::open(&cache).unwrap().manifest().max_len();
    assert!(
        ladder.iter().all(|&l| l % 8 == 0 || l == max_len),
        "{ladder:?}"
    );
    assert!(
        rounded["padding_efficiency"].as_f64().unwrap() <= b.as_f64().unwrap(),
        "{rounded}"
    );
    let text = run(&bucketed);
    assert!(
        text.contains("bucketed: padding efficiency")
            && text.contains("plain: padding efficiency")
            && text.contains("bucketed: batch lengths:")
            && text.lines().all(|l| l.chars().count() <= 100),
        "{text}"
    );
}

#[test]
fn dsc_bench_reports_throughput_against_memcpy() {
    let dir = Dir::new();
    copy_cache(&dir);
    let out = dsc(
        dir.path(),
        &[
            "bench",
            "cache",
            "--batch-size",
            "16",
            "--loader-threads",
            "64",
            "--json",
        ],
    )
    .ok();
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    // The small cache stays resident: at most one loader thread per core runs.
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    assert_eq!(r["threads"], 64, "{r}");
    assert_eq!(r["threads_running"], cores.min(64), "{r}");
    // memcpy runs on as many threads as the shuffled pass, so that their ratio compares like
    // with like (issue 28, item 6).
    assert_eq!(r["memcpy_threads"], r["threads_running"], "{r}");
    for field in [
        "contexts_per_s_shuffled",
        "gbps_shuffled",
        "gbps_sequential",
        "gbps_memcpy",
        "gbps_memcpy_threads",
        "shuffled_1_thread_over_memcpy",
        "shuffled_over_memcpy_threads",
        "open_ms",
        "peak_rss_mib",
    ] {
        assert!(r[field].as_f64().is_some_and(|v| v > 0.0), "{field} in {r}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Any values of the loader's options (as a program, a resume state or Python may give
    /// them) give a loader or an options error: never a panic, an abort or a hang. A loader
    /// given yields its first batches and a state that resumes (issue 27, item 3).
    #[test]
    fn any_loader_options_give_a_loader_or_an_error(
        batch in prop_oneof![0usize..40, Just(1usize << 40), Just(usize::MAX)],
        world in 0usize..5,
        rank in 0usize..6,
        threads in 0usize..4,
        prefetch in 0usize..6,
        window in prop_oneof![0usize..300, Just(usize::MAX)],
        interleave in prop_oneof![0usize..20, Just(usize::MAX)],
        flags in any::<(bool, bool, bool, bool)>(),
        pack in proptest::option::of((0usize..5000, proptest::option::of(0usize..200))),
        epoch in any::<u64>(),
        seed in any::<u64>(),
    ) {
        let cache = Cache::open(cache_dir()).unwrap();
        let (shuffle, drop_last, bucket, trim) = flags;
        // Keys that ask for two shapes are refused by name before any loader is made.
        let keys = dsc_loader::args::ShapeArgs {
            bucket,
            pack: pack.map(|p| p.0),
            max_seqs: pack.and_then(|p| p.1),
            trim,
            ..Default::default()
        };
        let batches = match keys.batches() {
            Ok(b) => b,
            Err(m) => {
                prop_assert!(!m.key.is_empty() && !m.problem.is_empty());
                return Ok(());
            }
        };
        let trim = keys.trim_for(&batches, 1);
        let o = LoaderOptions {
            order: OrderSpec {
                seed,
                shuffle,
                drop_last,
                window,
                interleave,
                batches,
                ..Default::default()
            },
            batch_size: batch,
            epoch,
            rank,
            world_size: world,
            prefetch,
            threads,
            trim,
            ..Default::default()
        };
        match cache.loader(o.clone()) {
            Err(LoadError::Options(m)) => prop_assert!(!m.key.is_empty() && !m.problem.is_empty()),
            Err(e) => prop_assert!(false, "not an options error: {e}"),
            Ok(mut loader) => {
                for _ in 0..3 {
                    if let Some(b) = loader.next() {
                        b.unwrap();
                    }
                }
                let state = loader.state();
                drop(loader);
                let again = cache.loader_from_state(o, &state);
                prop_assert!(again.is_ok(), "{:?}", again.err());
            }
        }
    }
}

/// Issue 30, item 4: a loader's telemetry counts what it handed over (batches, contexts, the
/// bytes of their tensors, trimmed ones as trimmed), whichever way the consumer takes them, and
/// what the cache read from disk: nothing for a hot cache, each compressed shard read and
/// decompressed, with hits and evictions, for a cold one.
#[test]
fn loader_stats_count_what_was_handed_over_and_what_the_cache_read() {
    let dir = Dir::new();
    let (hot, cold) = hot_and_cold_caches(&dir);
    for (path, compressed) in [(&hot, false), (&cold, true)] {
        let cache = Cache::open(path).unwrap();
        for threads in [0, 2] {
            let o = LoaderOptions {
                threads,
                trim: Some(1),
                ..opts(16)
            };
            let mut loader = cache.loader(o).unwrap();
            let (mut batches, mut contexts, mut bytes) = (0u64, 0u64, 0u64);
            for b in &mut loader {
                let b = b.unwrap();
                batches += 1;
                contexts += b.size as u64;
                bytes += b
                    .tensors()
                    .iter()
                    .map(|t| t.bytes().len() as u64)
                    .sum::<u64>();
            }
            let s = loader.stats();
            assert_eq!(
                (s.batches, s.contexts, s.bytes),
                (batches, contexts, bytes),
                "{s:?}"
            );
            assert!(s.waits <= s.batches && s.wait_s >= 0.0, "{s:?}");
            if threads == 0 {
                // The consumer's own thread gathers every batch: each one a wait, none queued.
                assert_eq!((s.waits, s.queued), (s.batches, 0), "{s:?}");
            }
            let shards = cache.manifest().split("train").unwrap().shards;
            if compressed {
                assert!(s.shard_reads >= shards as u64, "{s:?}");
                assert!(s.stored_bytes_read > 0 && s.shard_hits > 0, "{s:?}");
                assert!(
                    s.shard_evictions > 0,
                    "more shards than stay resident: {s:?}"
                );
            } else {
                assert_eq!(
                    (
                        s.shard_reads,
                        s.stored_bytes_read,
                        s.shard_hits,
                        s.shard_evictions
                    ),
                    (0, 0, 0, 0)
                );
            }
        }
    }
    // A filler counts the batches it fills, in its callers' threads.
    let cache = Cache::open(&hot).unwrap();
    let loader = cache
        .loader(LoaderOptions {
            threads: 0,
            ..opts(16)
        })
        .unwrap();
    let filler = loader.filler();
    let mut buffers: Vec<Vec<u8>> = loader.batch_bytes().iter().map(|&n| vec![0; n]).collect();
    for step in 0..3 {
        let mut dst: Vec<&mut [u8]> = buffers.iter_mut().map(|b| &mut b[..]).collect();
        filler.fill(step, &mut dst).unwrap();
    }
    let s = filler.stats();
    assert_eq!((s.batches, s.contexts), (3, 48), "{s:?}");
    assert_eq!(
        s.bytes,
        loader.batch_bytes().iter().sum::<usize>() as u64 * 3
    );
}
