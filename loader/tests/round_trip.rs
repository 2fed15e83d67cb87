//! Any cache the format allows, written through `dsc-format` alone (not the compiler), passes
//! the full `verify` and comes back from the loader exactly as written: every sample of a split
//! once per epoch (the last batch completed as documented), byte for byte, whatever the shapes,
//! shard sizes, batch size and threads. And one byte changed anywhere in a shard's data is found
//! by `verify`.

use dsc_format::manifest::{CompileSummary, Inputs, ShardEntry};
use dsc_format::rng::Xoshiro256;
use dsc_format::shard::{build_header, shard_file_name, ShardMeta};
use dsc_format::stats::{LengthStats, SplitStats};
use dsc_format::verify::{verify, Depth};
use dsc_format::{
    checksum, ColumnSource, ColumnSpec, CompileSpec, Encoding, Manifest, Stats, TensorRole,
    TensorSpec,
};
use dsc_loader::{Cache, LoaderOptions, OrderSpec};
use proptest::prelude::*;
use std::collections::HashMap;
use std::path::Path;

/// The shape of a cache: everything the format lets vary.
#[derive(Debug, Clone)]
struct Shape {
    max_len: usize,
    features: usize,
    /// Vocabulary sizes of the categorical tensors.
    vocabularies: Vec<usize>,
    full_length: bool,
    targets: usize,
    context_features: usize,
    /// Contexts per split: train, then val (0 = no val split).
    contexts: [usize; 2],
    per_shard: usize,
    seed: u64,
}

fn shapes() -> impl Strategy<Value = Shape> {
    (
        1usize..=6,
        0usize..=3,
        prop::collection::vec(0usize..=4, 0..=2),
        any::<bool>(),
        0usize..=2,
        0usize..=2,
        (1usize..=40, 0usize..=15),
        1usize..=16,
        any::<u64>(),
    )
        .prop_map(
            |(max_len, features, vocabularies, full_length, targets, cf, (tr, va), per, seed)| {
                Shape {
                    max_len,
                    features,
                    vocabularies,
                    full_length,
                    targets,
                    context_features: cf,
                    contexts: [tr, va],
                    per_shard: per,
                    seed,
                }
            },
        )
}

fn column(name: String, source: ColumnSource, encoding: Encoding) -> ColumnSpec {
    ColumnSpec {
        name,
        source,
        source_type: "Float64".into(),
        encoding,
    }
}

fn numeric() -> Encoding {
    Encoding::Numeric {
        stages: vec![],
        fill: None,
    }
}

fn tensor(name: &str, role: TensorRole, shape: Vec<usize>, columns: Vec<ColumnSpec>) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        dtype: role.dtype(),
        role,
        sample_shape: shape,
        columns,
    }
}

/// The tensors of `s`, `key` first as the format requires.
fn tensors(s: &Shape) -> Vec<TensorSpec> {
    let raw = |n: &str| vec![column(n.into(), ColumnSource::Rows, Encoding::Raw)];
    let mut out = vec![
        tensor("key", TensorRole::Key, vec![], raw("key")),
        tensor("length", TensorRole::Length, vec![], raw("length")),
    ];
    if s.full_length {
        out.push(tensor(
            "full_length",
            TensorRole::FullLength,
            vec![],
            raw("full_length"),
        ));
    }
    if s.features > 0 {
        let cols = (0..s.features)
            .map(|i| column(format!("f{i}"), ColumnSource::Rows, numeric()))
            .collect();
        out.push(tensor(
            "x",
            TensorRole::Features,
            vec![s.max_len, s.features],
            cols,
        ));
    }
    for (i, &v) in s.vocabularies.iter().enumerate() {
        let vocabulary = (0..v).map(|j| serde_json::json!(format!("v{j}"))).collect();
        let col = column(
            format!("cat{i}"),
            ColumnSource::Rows,
            Encoding::Category { vocabulary },
        );
        out.push(tensor(
            &format!("cat{i}"),
            TensorRole::Categorical,
            vec![s.max_len],
            vec![col],
        ));
    }
    for (name, role, width) in [
        ("y", TensorRole::Targets, s.targets),
        ("c", TensorRole::ContextFeatures, s.context_features),
    ] {
        if width > 0 {
            let cols = (0..width)
                .map(|i| column(format!("{name}{i}"), ColumnSource::Context, numeric()))
                .collect();
            out.push(tensor(name, role, vec![width], cols));
        }
    }
    out
}

/// One context's bytes per tensor, valid under every rule of the format.
fn context(t: &[TensorSpec], key: i64, max_len: usize, rng: &mut Xoshiro256) -> Vec<Vec<u8>> {
    let length = rng.below(max_len as u64 + 1) as usize;
    t.iter()
        .map(|spec| match spec.role {
            TensorRole::Key => key.to_le_bytes().to_vec(),
            TensorRole::Length => (length as i32).to_le_bytes().to_vec(),
            TensorRole::FullLength => ((length + rng.below(4) as usize) as i32)
                .to_le_bytes()
                .to_vec(),
            TensorRole::Features | TensorRole::Categorical => {
                let step = spec.sample_elems() / max_len;
                let mut out = vec![0u8; spec.sample_bytes()];
                for (i, v) in out.chunks_exact_mut(4).take(length * step).enumerate() {
                    let value = match &spec.columns[0].encoding {
                        Encoding::Category { vocabulary } => {
                            (rng.below(vocabulary.len() as u64 + 2) as i32).to_le_bytes()
                        }
                        _ => ((rng.unit_f64() * 200.0 - 100.0) as f32 + i as f32).to_le_bytes(),
                    };
                    v.copy_from_slice(&value);
                }
                out
            }
            _ => (0..spec.sample_elems())
                .flat_map(|_| ((rng.unit_f64() * 2.0 - 1.0) as f32).to_le_bytes())
                .collect(),
        })
        .collect()
}

fn lengths(contexts: usize, rows: u64) -> LengthStats {
    LengthStats {
        min: 0,
        max: 0,
        mean: if contexts == 0 {
            0.0
        } else {
            rows as f64 / contexts as f64
        },
        quantiles: vec![],
        histogram: vec![],
        truncated: 0,
        truncated_fraction: 0.0,
    }
}

type Samples = HashMap<i64, Vec<Vec<u8>>>;

/// Writes a cache of shape `s` into `dir`: what each key's sample holds, per split.
fn write_cache(dir: &Path, s: &Shape) -> (Manifest, Vec<Samples>) {
    std::fs::create_dir_all(dir.join("shards")).unwrap();
    let t = tensors(s);
    let mut rng = Xoshiro256::seed_from(s.seed);
    let inputs = Inputs {
        fingerprint: format!("{:016x}", s.seed),
        files: vec![],
    };
    let spec = CompileSpec::new(vec![], "key");
    let mut builder = Manifest::builder(
        env!("CARGO_PKG_VERSION"),
        s.max_len,
        t.clone(),
        inputs,
        spec,
    );
    let mut written = Vec::new();
    let mut split_stats = Vec::new();
    // Keys unique across splits, spread over the whole i64 range.
    let mut next_key = rng.next_u64() as i64;
    for (name, &count) in ["train", "val"].iter().zip(&s.contexts) {
        if count == 0 {
            continue;
        }
        let samples: Vec<(i64, Vec<Vec<u8>>)> = (0..count)
            .map(|_| {
                next_key = next_key.wrapping_add(1 + rng.below(1 << 40) as i64);
                (next_key, context(&t, next_key, s.max_len, &mut rng))
            })
            .collect();
        let mut shards = Vec::new();
        let mut rows = 0u64;
        for (index, chunk) in samples.chunks(s.per_shard).enumerate() {
            let meta = ShardMeta {
                split: name,
                index,
                first_context: index * s.per_shard,
                profile: None,
            };
            let (mut bytes, _) = build_header(&t, chunk.len(), &meta);
            for ti in 0..t.len() {
                for (_, tensors) in chunk {
                    bytes.extend_from_slice(&tensors[ti]);
                }
            }
            rows += chunk
                .iter()
                .map(|(_, x)| i32::from_le_bytes(x[1][..4].try_into().unwrap()) as u64)
                .sum::<u64>();
            let file = shard_file_name(name, index);
            std::fs::write(dir.join(&file), &bytes).unwrap();
            shards.push(ShardEntry {
                file,
                split: name.to_string(),
                index,
                contexts: chunk.len(),
                first_context: index * s.per_shard,
                bytes: bytes.len() as u64,
                xxh3: checksum::xxh3_hex(&bytes),
                compressed: None,
                keys: None,
                generation: None,
                removed: Vec::new(),
            });
        }
        builder = builder.split(name, rows, shards);
        split_stats.push(SplitStats {
            split: name.to_string(),
            contexts: count as u64,
            rows,
            lengths: lengths(count, rows),
            columns: vec![],
        });
        written.push(samples.into_iter().collect());
    }
    let total: usize = s.contexts.iter().sum();
    let rows: u64 = split_stats.iter().map(|x| x.rows).sum();
    split_stats.insert(
        0,
        SplitStats {
            split: "all".into(),
            contexts: total as u64,
            rows,
            lengths: lengths(total, rows),
            columns: vec![],
        },
    );
    let manifest = builder
        .summary(CompileSummary {
            contexts: total,
            rows_stored: rows,
            ..CompileSummary::default()
        })
        .build()
        .expect("a manifest the format allows");
    let stats = Stats {
        format_version: dsc_format::FORMAT_VERSION,
        splits: split_stats,
        quantiles_of: None,
        includes_hidden: Default::default(),
    };
    std::fs::write(dir.join("stats.json"), serde_json::to_vec(&stats).unwrap()).unwrap();
    std::fs::write(dir.join("manifest.json"), manifest.to_json()).unwrap();
    (manifest, written)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_valid_cache_verifies_and_loads_back_exactly(
        s in shapes(),
        batch in 1usize..=24,
        threads in 1usize..=2,
        epoch in 0u64..3,
        trim in any::<bool>(),
        flip in any::<prop::sample::Index>(),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cache");
        let (manifest, written) = write_cache(&dir, &s);

        prop_assert_eq!(&Manifest::read(&dir).unwrap(), &manifest);
        let report = verify(&dir, &Default::default(), Depth::Full, |_, _| {}).unwrap();
        prop_assert!(report.problems.is_empty(), "{:?}", report.problems);

        let cache = Cache::open(&dir).unwrap();
        for (split, samples) in ["train", "val"].iter().zip(&written) {
            let opts = LoaderOptions { order: OrderSpec { split: split.to_string(), drop_last: false, seed: s.seed, ..Default::default() }, batch_size: batch, threads, epoch, trim: trim.then_some(1), ..LoaderOptions::default() };
            let mut seen = HashMap::new();
            for b in cache.loader(opts).unwrap() {
                let b = b.unwrap();
                for (i, key) in b.keys().into_iter().enumerate() {
                    *seen.entry(key).or_insert(0) += 1;
                    let want = &samples[&key];
                    for (ti, spec) in manifest.tensors().iter().enumerate() {
                        let got = b.tensor(&spec.name).unwrap().bytes();
                        // A trimmed batch keeps the first `seq_len` steps of each sample; the
                        // steps cut are padding, zero by the format's rules.
                        let mut want = want[ti].clone();
                        if matches!(spec.role, TensorRole::Features | TensorRole::Categorical) {
                            let step = spec.sample_bytes() / s.max_len;
                            prop_assert!(want[b.seq_len * step..].iter().all(|&x| x == 0));
                            want.truncate(b.seq_len * step);
                        }
                        let n = want.len();
                        prop_assert_eq!(
                            &got[i * n..(i + 1) * n],
                            &want[..],
                            "{} of key {}",
                            spec.name,
                            key
                        );
                    }
                }
            }
            // Every sample, once; the last batch is completed by repeating the epoch's first
            // contexts (`drop_last: false`).
            prop_assert_eq!(seen.len(), samples.len());
            prop_assert_eq!(
                seen.values().sum::<usize>(),
                samples.len().div_ceil(batch) * batch
            );
        }

        // One byte changed in any shard's data: the full pass finds it.
        let entry = &manifest.shards()[flip.index(manifest.shards().len())];
        let path = dir.join(&entry.file);
        let mut bytes = std::fs::read(&path).unwrap();
        let start = dsc_format::shard::read_layout(&path).unwrap().data_start as usize;
        let at = start + flip.index(bytes.len() - start);
        bytes[at] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        let report = verify(&dir, &Default::default(), Depth::Full, |_, _| {}).unwrap();
        prop_assert!(!report.problems.is_empty());
    }
}
