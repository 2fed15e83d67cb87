//! Packed batches on real compiled caches: every context of an epoch exactly once, each
//! sequence byte-identical to the same context of a padded batch (hot and zstd caches, any
//! thread count, several ranks, resumed mid-epoch), and the options a pack refuses.

use crate::util::*;
use dsc_loader::{Batch, Batches, Cache, LoadError, LoaderOptions, OrderSpec, Pack};
use std::collections::BTreeMap;
use std::path::Path;

fn packed(tokens: usize, max_seqs: Option<usize>) -> LoaderOptions {
    LoaderOptions {
        order: OrderSpec {
            window: 96,
            interleave: 3,
            seed: 11,
            batches: Batches::Packed(Pack { tokens, max_seqs }),
            ..Default::default()
        },
        epoch: 2,
        ..Default::default()
    }
}

/// Every context of `split` as it is stored, padded: key → tensor name → one sample's bytes.
type Padded = BTreeMap<i64, BTreeMap<String, Vec<u8>>>;

fn padded_contexts(cache: &Path, split: &str) -> Padded {
    let cache = Cache::open(cache).unwrap();
    let opts = LoaderOptions {
        order: OrderSpec {
            split: split.into(),
            shuffle: false,
            drop_last: false,
            ..Default::default()
        },
        batch_size: 50,
        ..Default::default()
    };
    let mut out = Padded::new();
    for batch in cache.loader(opts).unwrap() {
        let batch = batch.unwrap();
        for (i, key) in batch.keys().into_iter().enumerate() {
            let row = batch
                .tensors()
                .iter()
                .map(|t| {
                    let size = t.bytes().len() / t.shape()[0];
                    (
                        t.name().to_string(),
                        t.bytes()[i * size..(i + 1) * size].to_vec(),
                    )
                })
                .collect();
            out.entry(key).or_insert(row);
        }
    }
    out
}

fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Checks one pack against the padded contexts: every tensor's rows, the unused tails, and the
/// pack's own tensors. Returns the pack's keys.
fn check_pack(batch: &Batch, padded: &Padded, max_len: usize) -> Vec<i64> {
    let info = batch.pack.expect("a packed batch");
    let keys = batch.keys();
    assert_eq!(keys.len(), info.seqs);
    let tensor = |name: &str| batch.tensor(name).unwrap_or_else(|| panic!("no {name}"));
    let (tokens, seqs) = (
        tensor("seq_idx").shape()[0],
        tensor("cu_seqlens").shape()[0] - 1,
    );
    let cu = i32s(tensor("cu_seqlens").bytes());
    let seq_idx = i32s(tensor("seq_idx").bytes());
    let position = i32s(tensor("position").bytes());
    assert_eq!(i32s(tensor("num_seqs").bytes()), [info.seqs as i32]);
    assert_eq!(i32s(tensor("num_tokens").bytes()), [info.tokens as i32]);
    assert_eq!(cu[0], 0);
    assert!(cu[info.seqs..].iter().all(|&c| c as usize == info.tokens));
    let mut longest = 0;
    for (i, key) in keys.iter().enumerate() {
        let row = &padded[key];
        let len = i32s(&row["length"])[0] as usize;
        longest = longest.max(len);
        let (lo, hi) = (cu[i] as usize, cu[i + 1] as usize);
        assert_eq!(
            hi - lo,
            len,
            "sequence {i} (key {key}) is its stored length"
        );
        assert!(seq_idx[lo..hi].iter().all(|&s| s == i as i32));
        assert_eq!(position[lo..hi], (0..len as i32).collect::<Vec<_>>()[..]);
        for t in batch.tensors() {
            let Some(stored) = row.get(t.name()) else {
                continue;
            };
            let per_row = t.bytes().len() / t.shape()[0];
            if t.shape()[0] == tokens && per_row * max_len == stored.len() {
                // Per-step: the stored steps, end to end.
                assert_eq!(
                    &t.bytes()[lo * per_row..hi * per_row],
                    &stored[..len * per_row],
                    "{} of key {key}",
                    t.name()
                );
            } else {
                assert_eq!(
                    &t.bytes()[i * per_row..(i + 1) * per_row],
                    &stored[..],
                    "{} of key {key}",
                    t.name()
                );
            }
        }
    }
    assert_eq!(info.max_seqlen, longest);
    assert!(seq_idx[info.tokens..].iter().all(|&s| s == seqs as i32));
    assert!(position[info.tokens..].iter().all(|&p| p == 0));
    for t in batch.tensors() {
        let per_row = t.bytes().len() / t.shape()[0];
        let used = if t.shape()[0] == tokens && t.name() != "seq_idx" && t.name() != "position" {
            info.tokens
        } else if t.shape()[0] == seqs {
            info.seqs
        } else {
            continue;
        };
        assert!(
            t.bytes()[used * per_row..].iter().all(|&b| b == 0),
            "the unused tail of {} is zero",
            t.name()
        );
    }
    keys
}

fn steps(cache: &Path, o: LoaderOptions) -> Vec<Batch> {
    Cache::open(cache)
        .unwrap()
        .loader(o)
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn every_context_is_packed_once_with_the_bytes_of_its_padded_batch() {
    let dir = Dir::new();
    let (hot, cold) = hot_and_cold_caches(&dir);
    let padded = padded_contexts(&hot, "train");
    let max_len = Cache::open(&hot).unwrap().manifest().max_len();
    let keep_last = |mut o: LoaderOptions| {
        o.order.drop_last = false;
        o
    };
    let reference: Vec<Vec<i64>> = steps(&hot, keep_last(packed(1024, None)))
        .iter()
        .map(|b| check_pack(b, &padded, max_len))
        .collect();
    let mut all: Vec<i64> = reference.concat();
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        all,
        padded.keys().copied().collect::<Vec<_>>(),
        "every context once"
    );
    assert_eq!(reference.concat().len(), padded.len(), "none twice");
    assert!(reference.len() > 10, "{} packs", reference.len());
    for cache in [&hot, &cold] {
        for threads in [0, 1, 3] {
            for world in [1usize, 3] {
                let ranks: Vec<Vec<Vec<i64>>> = (0..world)
                    .map(|rank| {
                        let o = LoaderOptions {
                            rank,
                            world_size: world,
                            threads,
                            ..keep_last(packed(1024, None))
                        };
                        let batches = steps(cache, o);
                        let repeated = batches.iter().filter(|b| b.pack.unwrap().repeated);
                        assert!(repeated.count() <= 1, "only the last global step repeats");
                        batches
                            .iter()
                            .map(|b| check_pack(b, &padded, max_len))
                            .collect()
                    })
                    .collect();
                // Rank r's step k is pack k * world + r of the one plan; the last global
                // step is completed with the epoch's first packs.
                let lens: Vec<usize> = ranks.iter().map(Vec::len).collect();
                assert!(lens.iter().all(|&l| l == lens[0]), "{lens:?}");
                for (k, rank) in ranks.iter().enumerate() {
                    for (step, keys) in rank.iter().enumerate() {
                        let q = (step * world + k) % reference.len();
                        assert_eq!(
                            keys, &reference[q],
                            "{cache:?} t{threads} rank {k} step {step}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_packed_epoch_resumes_mid_epoch_from_its_state_with_the_same_bytes() {
    let dir = Dir::new();
    let (hot, cold) = hot_and_cold_caches(&dir);
    let padded = padded_contexts(&hot, "train");
    let max_len = Cache::open(&hot).unwrap().manifest().max_len();
    for cache in [&hot, &cold] {
        let c = Cache::open(cache).unwrap();
        let straight: Vec<Vec<i64>> = steps(cache, packed(2048, Some(24)))
            .iter()
            .map(Batch::keys)
            .collect();
        assert!(straight.len() > 4);
        for stop in [0, 1, straight.len() / 2, straight.len()] {
            let mut first = c.loader(packed(2048, Some(24))).unwrap();
            for _ in 0..stop {
                first.next().unwrap().unwrap();
            }
            let json = serde_json::to_string(&first.state()).unwrap();
            assert!(
                json.contains("\"pack\":{\"tokens\":2048,\"max_seqs\":24}"),
                "{json}"
            );
            let state: dsc_loader::State = serde_json::from_str(&json).unwrap();
            assert_eq!(state.samples, stop);
            // The state's order wins over the options' (other seed, no pack).
            let resumed: Vec<Vec<i64>> = c
                .loader_from_state(LoaderOptions::default(), &state)
                .unwrap()
                .map(|b| check_pack(&b.unwrap(), &padded, max_len))
                .collect();
            assert_eq!(resumed, straight[stop..], "{cache:?} from step {stop}");
        }
    }
}

#[test]
fn a_pack_holds_at_most_its_tokens_and_sequences_and_the_steps_are_fixed() {
    let dir = Dir::new();
    let (hot, _) = hot_and_cold_caches(&dir);
    let c = Cache::open(&hot).unwrap();
    let mut lens = Vec::new();
    for epoch in 0..3 {
        let loader = c
            .loader(LoaderOptions {
                epoch,
                ..packed(600, Some(7))
            })
            .unwrap();
        lens.push(loader.steps());
        let packs = loader.packs().unwrap();
        assert_eq!((packs.tokens(), packs.max_seqs()), (600, 7));
        for batch in loader {
            let p = batch.unwrap().pack.unwrap();
            assert!(p.tokens <= 600 && p.seqs <= 7 && p.seqs > 0 && !p.repeated);
        }
    }
    assert!(lens.iter().all(|&l| l == lens[0]), "{lens:?}");
}

#[test]
fn packing_refuses_what_it_cannot_do_and_says_why() {
    let dir = Dir::new();
    let (hot, _) = hot_and_cold_caches(&dir);
    let c = Cache::open(&hot).unwrap();
    let max_len = c.manifest().max_len();
    // Each refusal names the option by its key (which the CLI and Python spell their own way).
    let refused = |o: LoaderOptions| match c.loader(o) {
        Err(LoadError::Options(m)) => (m.key, m.problem),
        other => panic!("expected an options error, got {other:?}"),
    };
    let (key, why) = refused(packed(max_len - 1, None));
    assert!(
        key == "pack" && why.contains(&format!("L = {max_len}")),
        "{why}"
    );
    let json = serde_json::json!({"bucket": true, "pack": 1024});
    let why = dsc_loader::args::LoaderArgs::from_json(&json.to_string(), 1)
        .unwrap_err()
        .to_string();
    assert!(why.contains("`pack`") && why.contains("`bucket`"), "{why}");
    let o = LoaderOptions {
        trim: Some(1),
        ..packed(1024, None)
    };
    assert_eq!(refused(o).0, "trim");
    assert_eq!(refused(packed(1024, Some(0))).0, "max_seqs");
    let o = LoaderOptions {
        columns: vec!["x".into(), "nope".into()],
        ..packed(1024, None)
    };
    match c.loader(o) {
        Err(LoadError::NoTensor { tensor, .. }) => assert_eq!(tensor, "nope"),
        other => panic!("expected an unknown tensor, got {other:?}"),
    }
    // A padded state does not resume as packed by Python's strict check.
    let mut padded = packed(1024, None);
    padded.order.batches = Batches::Padded;
    let state = c.loader(padded).unwrap().state();
    let err = state.check(&packed(1024, None)).unwrap_err().to_string();
    assert!(err.contains("pack=none"), "{err}");
}

/// A consumer holding the split's tensors (a GPU) gathers every batch itself from
/// `Filler::fill_index`, and `Filler::fill_block` gives every batch as one block: the positions pick the same contexts, the batch description is the
/// same, and a pack's own tensors are the same bytes as the loader's, for padded, trimmed,
/// bucketed (rounded) and packed epochs, the last batch completed, on two ranks (issue 28,
/// item 5). The split is read in compiled order once; each batch is rebuilt from it here as
/// `dsc.Loader(resident=True)` does with torch.
#[test]
fn a_resident_consumer_rebuilds_every_batch_from_its_index() {
    let dir = Dir::new();
    let (hot, cold) = hot_and_cold_caches(&dir);
    let cache = Cache::open(&hot).unwrap();
    let max_len = cache.manifest().max_len();
    // Every context's bytes per tensor, in compiled order.
    let compiled: Vec<BTreeMap<String, Vec<u8>>> = {
        let opts = LoaderOptions {
            order: OrderSpec {
                shuffle: false,
                drop_last: false,
                ..Default::default()
            },
            batch_size: 1,
            threads: 0,
            ..Default::default()
        };
        cache
            .loader(opts)
            .unwrap()
            .map(|b| {
                let b = b.unwrap();
                let tensors = b.tensors();
                tensors
                    .iter()
                    .map(|t| (t.name().to_string(), t.bytes().to_vec()))
                    .collect()
            })
            .collect()
    };
    let padded = |trim: bool, bucket: bool, multiple: usize| LoaderOptions {
        order: OrderSpec {
            window: 96,
            seed: 5,
            batches: if bucket {
                Batches::Bucketed
            } else {
                Batches::Padded
            },
            drop_last: false,
            ..Default::default()
        },
        batch_size: 24,
        trim: (trim || bucket).then_some(multiple),
        epoch: 1,
        ..Default::default()
    };
    let mut keep_last = packed(1024, None);
    keep_last.order.drop_last = false;
    for path in [&hot, &cold] {
        let cache = Cache::open(path).unwrap();
        for base in [
            padded(false, false, 1),
            padded(true, false, 1),
            padded(false, true, 16),
            keep_last.clone(),
        ] {
            for (rank, world_size) in [(0, 1), (1, 2)] {
                let opts = LoaderOptions {
                    rank,
                    world_size,
                    threads: 0,
                    ..base.clone()
                };
                let loader = cache.loader(opts.clone()).unwrap();
                let (filler, rows) = (loader.filler(), loader.index_rows());
                let layout = loader.layout().to_vec();
                let sizes = loader.batch_bytes();
                let own = if opts.order.batches.pack().is_some() {
                    5
                } else {
                    0
                };
                for step in 0..loader.steps() {
                    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
                    let mut slices: Vec<&mut [u8]> =
                        bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
                    let info = filler.fill(step, &mut slices).unwrap();
                    let mut positions = vec![0u8; rows * 8];
                    let mut pack: Vec<Vec<u8>> = sizes[sizes.len() - own..]
                        .iter()
                        .map(|&n| vec![0xAAu8; n])
                        .collect();
                    let mut pack_slices: Vec<&mut [u8]> =
                        pack.iter_mut().map(|b| b.as_mut_slice()).collect();
                    let index = filler
                        .fill_index(step, &mut positions, &mut pack_slices)
                        .unwrap();
                    let what = format!("{path:?} {opts:?} step {step}");
                    assert_eq!(index, info, "{what}");
                    rows_rebuild_the_batch(
                        &filler,
                        (step, rows),
                        &layout,
                        &sizes,
                        own,
                        &compiled,
                        max_len,
                    )
                    .iter()
                    .zip(&bufs)
                    .enumerate()
                    .for_each(|(t, (rebuilt, loaded))| {
                        assert!(
                            rebuilt[..] == loaded[..rebuilt.len()],
                            "{what}: {} from fill_rows differs",
                            layout[t].name
                        )
                    });
                    // One contiguous block (what one transfer to a GPU moves): the same bytes,
                    // each tensor cut to the batch, at aligned offsets, one after another.
                    let mut block = vec![0x55u8; loader.block_bytes()];
                    let (block_info, ranges) = filler.fill_block(step, &mut block).unwrap();
                    assert_eq!(block_info, info, "{what}");
                    let mut end = 0;
                    for (t, &(start, len)) in ranges.iter().enumerate() {
                        assert!(
                            start >= end && start % dsc_loader::BLOCK_ALIGN == 0,
                            "{what}"
                        );
                        assert!(
                            block[start..start + len] == bufs[t][..len],
                            "{what}: {} differs in the block",
                            layout[t].name
                        );
                        end = start + len;
                    }
                    let positions: Vec<usize> = positions
                        .chunks_exact(8)
                        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as usize)
                        .collect();
                    let used = info.pack.map_or(rows, |p| p.seqs);
                    assert!(positions[used..].iter().all(|&p| p == 0), "{what}");
                    for (k, own_bytes) in pack.iter().enumerate() {
                        let t = sizes.len() - own + k;
                        assert_eq!(
                            own_bytes,
                            &bufs[t][..own_bytes.len()],
                            "{what}: {}",
                            layout[t].name
                        );
                    }
                    // Per-context tensors: the rows at the positions, cut to the batch.
                    for (t, l) in layout.iter().enumerate().take(layout.len() - own) {
                        if l.shape[0] != rows {
                            continue; // a pack's tokens: checked against padded batches above
                        }
                        let per_step = compiled[0][&l.name].len() / max_len;
                        for (row, &p) in positions[..used].iter().enumerate() {
                            let stored = &compiled[p][&l.name];
                            let want = match l.trimmed_axis {
                                Some(_) => &stored[..per_step * info.seq_len],
                                None => &stored[..],
                            };
                            let n = want.len();
                            assert!(
                                &bufs[t][row * n..(row + 1) * n] == want,
                                "{what}: {} row {row} differs",
                                l.name
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Batch `step` as a consumer of `Filler::fill_rows` builds it: one gather by row per stored
/// tensor from the split in compiled order followed by a row of zeros (`compiled`, then
/// zeros), nothing zeroed afterwards; a pack's own tensors as written. Returns each tensor of
/// `layout` cut to the batch (a trimmed batch's length).
fn rows_rebuild_the_batch(
    filler: &dsc_loader::Filler,
    (step, rows): (usize, usize),
    layout: &[dsc_loader::TensorLayout],
    sizes: &[usize],
    own: usize,
    compiled: &[BTreeMap<String, Vec<u8>>],
    max_len: usize,
) -> Vec<Vec<u8>> {
    // A pack's T is the length of its `seq_idx`, the fourth of its own five tensors.
    let tokens = if own > 0 {
        layout[layout.len() - 4].shape[0]
    } else {
        0
    };
    let (mut positions, mut token_rows) = (vec![0xAAu8; rows * 8], vec![0xAAu8; tokens * 8]);
    let mut pack: Vec<Vec<u8>> = sizes[sizes.len() - own..]
        .iter()
        .map(|&n| vec![0u8; n])
        .collect();
    let mut pack_slices: Vec<&mut [u8]> = pack.iter_mut().map(|b| b.as_mut_slice()).collect();
    let info = filler
        .fill_rows(step, &mut positions, &mut token_rows, &mut pack_slices)
        .unwrap();
    let read = |b: &[u8]| -> Vec<usize> {
        b.chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as usize)
            .collect()
    };
    let (positions, token_rows) = (read(&positions), read(&token_rows));
    let contexts = compiled.len();
    let mut out = Vec::with_capacity(layout.len());
    for l in &layout[..layout.len() - own] {
        let whole = compiled[0][&l.name].len();
        let bytes_of = |p: usize| -> Vec<u8> {
            if p == contexts {
                vec![0u8; whole]
            } else {
                compiled[p][&l.name].clone()
            }
        };
        let mut t = Vec::new();
        if own > 0 && l.shape[0] == tokens {
            let step_bytes = whole / max_len;
            for &r in &token_rows {
                let (p, k) = (r / max_len, r % max_len);
                t.extend_from_slice(&bytes_of(p)[k * step_bytes..(k + 1) * step_bytes]);
            }
        } else {
            let keep = l
                .trimmed_axis
                .map_or(whole, |_| whole / max_len * info.seq_len);
            for &p in &positions {
                t.extend_from_slice(&bytes_of(p)[..keep]);
            }
        }
        out.push(t);
    }
    out.extend(pack);
    out
}

/// Issue 30, item 2, for packs: a state saved on 2 ranks continues on 3 (and on 1) from the same
/// pack of the same sequence of packs, nothing repeated or left out.
#[test]
fn a_packed_state_resumes_on_another_number_of_ranks() {
    let dir = Dir::new();
    let (hot, _) = hot_and_cold_caches(&dir);
    let c = Cache::open(&hot).unwrap();
    let on = |world: usize, rank: usize| LoaderOptions {
        world_size: world,
        rank,
        ..packed(1024, None)
    };
    let packs = |l: dsc_loader::Loader, steps: usize| -> Vec<Vec<i64>> {
        l.take(steps).map(|b| b.unwrap().keys()).collect()
    };
    let all = packs(c.loader(on(1, 0)).unwrap(), usize::MAX);
    assert!(all.len() > 8, "enough packs to cut: {}", all.len());
    let interleave = |per_rank: Vec<Vec<Vec<i64>>>| -> Vec<Vec<i64>> {
        let n = per_rank[0].len();
        (0..n)
            .flat_map(|s| per_rank.iter().map(move |r| r[s].clone()))
            .collect()
    };
    for world in [3, 1] {
        let k = 2;
        let before = interleave(
            (0..2)
                .map(|r| packs(c.loader(on(2, r)).unwrap(), k))
                .collect(),
        );
        let mut first = c.loader(on(2, 0)).unwrap();
        (&mut first).take(k).for_each(|b| drop(b.unwrap()));
        let state = first.state();
        assert_eq!(state.samples, 2 * k, "packs consumed by both ranks");
        let after = interleave(
            (0..world)
                .map(|r| {
                    packs(
                        c.loader_from_state(on(world, r), &state).unwrap(),
                        usize::MAX,
                    )
                })
                .collect(),
        );
        let mut seen = before;
        seen.extend(after);
        assert_eq!(seen[..], all[..seen.len()], "2 ranks -> {world}");
        assert!(
            all.len() - seen.len() < world,
            "only a partial step is left"
        );
    }
}

/// `dsc order --pack T --from-state S`: a state of packs of T tokens continues whatever
/// `--max-seqs` it chose, since the flags leave it to its default; other packs are refused,
/// naming both, sequence limit included.
#[test]
fn dsc_order_continues_a_packed_state_that_the_flags_do_not_contradict() {
    let dir = small_icecube_cache();
    let state = dsc(
        dir.path(),
        &[
            "order",
            "cache",
            "--pack",
            "4096",
            "--max-seqs",
            "40",
            "--state-after",
            "1",
        ],
    )
    .ok();
    std::fs::write(dir.join("state.json"), state).unwrap();
    let from = |pack: &str| {
        dsc(
            dir.path(),
            &[
                "order",
                "cache",
                "--pack",
                pack,
                "--from-state",
                "state.json",
                "--keys",
            ],
        )
    };
    from("4096").ok();
    let err = from("2048").fails(2);
    assert!(
        err.contains("packs of 4096 tokens, at most 40 sequences")
            && err.contains("packs of 2048 tokens"),
        "{err}"
    );
}
