//! `--profile mostlyai` against the output of mostlyai-engine 2.7.3 itself
//! (`tests/vectors/mostlyai/`, see its README): for both data sets and both partition counts the
//! statistics parse equal to the engine's, and every non-random code of every context equals the
//! engine's encoded output.

use crate::util::{dsc, manifest, read_cache, Dir};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::Array;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn vectors() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/mostlyai")
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{path:?}: {e}")))
        .expect("json")
}

/// The validation keys of an engine run: the contexts of its `-val` partition files.
fn write_val_keys(run: &Path, to: &Path) {
    let parts = json(&run.join("partitions.json"));
    let mut lines = String::new();
    for (name, part) in parts.as_object().unwrap() {
        if name.ends_with("-val") {
            for k in part["context_ids"].as_array().unwrap() {
                lines.push_str(&format!("{k}\n"));
            }
        }
    }
    std::fs::write(to, lines).unwrap();
}

fn compile(dir: &Dir, data_set: &str, partitions: usize, extra: &[&str]) -> PathBuf {
    let data = vectors().join(data_set).join("data");
    let run = vectors().join(data_set).join(format!("p{partitions}"));
    let val = dir.join("val-keys.txt");
    write_val_keys(&run, &val);
    let out = dir.join("cache");
    let (tgt, ctx) = (data.join("tgt.parquet"), data.join("ctx.parquet"));
    let p = partitions.to_string();
    let mut args = vec![
        "compile",
        tgt.to_str().unwrap(),
        "--key",
        "id",
        "--context",
        ctx.to_str().unwrap(),
        "--profile",
        "mostlyai",
        "--val-keys",
        val.to_str().unwrap(),
        "--partitions",
        &p,
        "--out",
        out.to_str().unwrap(),
        "-q",
    ];
    args.extend_from_slice(extra);
    dsc(dir.path(), &args).ok();
    out
}

/// The engine's encoded rows: per file, per column, per row, the codes (one for `ctxflt:`).
fn engine_rows(run: &Path) -> Vec<(i64, BTreeMap<String, Vec<i64>>)> {
    let mut rows = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(run.join("encoded-data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for file in files {
        let stem = file.file_stem().unwrap().to_str().unwrap().to_string();
        let keys = json(&run.join("encoded-keys").join(format!("{stem}.json")));
        let keys: Vec<i64> = keys["id"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_i64().unwrap())
            .collect();
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&file).unwrap())
            .unwrap()
            .build()
            .unwrap();
        let mut at = 0;
        for batch in reader {
            let batch = batch.unwrap();
            for r in 0..batch.num_rows() {
                let mut cols = BTreeMap::new();
                for (field, col) in batch.schema().fields().iter().zip(batch.columns()) {
                    let cast = arrow::cast(col, field.name());
                    let values = match col.data_type() {
                        arrow_schema::DataType::List(_) => {
                            let list = cast.as_list::<i32>().value(r);
                            list.as_primitive::<Int64Type>().values().to_vec()
                        }
                        _ => vec![cast.as_primitive::<Int64Type>().value(r)],
                    };
                    cols.insert(field.name().clone(), values);
                }
                rows.push((keys[at], cols));
                at += 1;
            }
        }
        assert_eq!(at, keys.len(), "{file:?}");
    }
    rows
}

/// Casting the engine's int8 / int64 / list<int64> columns to int64 values.
mod arrow {
    use arrow_array::{Array, ArrayRef, Int64Array, ListArray};
    use std::sync::Arc;

    pub fn cast(col: &ArrayRef, name: &str) -> ArrayRef {
        use arrow_array::cast::AsArray;
        use arrow_array::types::*;
        use arrow_schema::DataType as T;
        match col.data_type() {
            T::Int64 => col.clone(),
            T::Int8 => Arc::new(Int64Array::from_iter(
                col.as_primitive::<Int8Type>()
                    .iter()
                    .map(|v| v.map(i64::from)),
            )),
            T::Int16 => Arc::new(Int64Array::from_iter(
                col.as_primitive::<Int16Type>()
                    .iter()
                    .map(|v| v.map(i64::from)),
            )),
            T::Int32 => Arc::new(Int64Array::from_iter(
                col.as_primitive::<Int32Type>()
                    .iter()
                    .map(|v| v.map(i64::from)),
            )),
            T::List(f) if f.data_type() == &T::Int64 => {
                let l: &ListArray = col.as_list::<i32>();
                Arc::new(l.clone()) as ArrayRef
            }
            other => panic!("column {name}: unexpected type {other:?}"),
        }
    }
}

/// `extra`: more compile flags (the statistics and codes must not depend on them).
fn check(data_set: &str, partitions: usize, extra: &[&str]) {
    let dir = Dir::new();
    let cache = compile(&dir, data_set, partitions, extra);
    let run = vectors().join(data_set).join(format!("p{partitions}"));
    for f in ["tgt-stats.json", "ctx-stats.json"] {
        let ours = json(&cache.join(f));
        let engine = json(&run.join(f));
        assert!(
            ours == engine,
            "{data_set} p{partitions} {f} differs from the engine's:\n{}",
            serde_json::to_string(&ours).unwrap()
        );
        // Same key order too (serde_json keeps insertion order).
        assert_eq!(
            serde_json::to_string(&ours).unwrap(),
            serde_json::to_string(&engine).unwrap()
        );
    }
    let imputed = json(&run.join("imputed-subcolumns.json"));
    let mut random: BTreeMap<String, String> = BTreeMap::new();
    for side in ["tgt", "ctx"] {
        if let Some(map) = imputed.get(side).and_then(Value::as_object) {
            for (k, v) in map {
                random.insert(k.clone(), v.as_str().unwrap().to_string());
            }
        }
    }
    let (samples, _) = read_cache(&cache);
    let m = manifest(&cache);
    let max_len = m["max_len"].as_u64().unwrap() as usize;
    let rows = engine_rows(&run);
    assert_eq!(rows.len(), samples.len(), "one row per context");
    let (mut compared, mut skipped) = (0usize, 0usize);
    for (key, cols) in &rows {
        let sample = &samples[key];
        let length = sample.tensors["length"][0] as usize;
        for (name, want) in cols {
            let ours = sample
                .tensors
                .get(name)
                .unwrap_or_else(|| panic!("{data_set}: no tensor {name}"));
            let nan = random.get(name).map(|n| &cols[n]);
            if name.starts_with("ctxflt:") {
                assert_eq!(ours.len(), 1);
                if nan.is_some_and(|n| n[0] == 1) {
                    skipped += 1;
                    continue;
                }
                assert_eq!(
                    ours[0] as i64, want[0],
                    "{data_set} p{partitions} key {key} {name}"
                );
                compared += 1;
                continue;
            }
            assert_eq!(ours.len(), max_len + 1, "{name}");
            assert_eq!(want.len(), length + 1, "key {key} {name}: steps");
            for (t, &w) in want.iter().enumerate() {
                if nan.is_some_and(|n| n[t] == 1) {
                    skipped += 1;
                    continue;
                }
                assert_eq!(
                    ours[t] as i64, w,
                    "{data_set} p{partitions} key {key} {name} step {t}"
                );
                compared += 1;
            }
            assert!(ours[want.len()..].iter().all(|&v| v == 0.0), "{name}: tail");
        }
        // Every sub-column the engine wrote is a tensor, and no other (besides key, length).
        assert_eq!(sample.tensors.len(), cols.len() + 2, "key {key}");
    }
    assert!(compared > 30_000, "{compared}");
    if data_set == "seq_extra" {
        assert!(
            skipped > 900,
            "random cells of the imputed columns: {skipped}"
        );
    } else {
        assert_eq!(skipped, 0);
    }
    dsc(dir.path(), &["verify", cache.to_str().unwrap()]).ok();
    let shown = dsc(dir.path(), &["inspect", cache.to_str().unwrap()]).ok();
    assert!(shown.contains("tgt:/__sidx_"), "{shown}");
}

#[test]
fn seq_one_partition_matches_the_engine() {
    check("seq", 1, &[]);
}

#[test]
fn seq_two_partitions_matches_the_engine() {
    check("seq", 2, &[]);
}

#[test]
fn seq_extra_one_partition_matches_the_engine() {
    check("seq_extra", 1, &[]);
}

#[test]
fn seq_extra_two_partitions_matches_the_engine() {
    check("seq_extra", 2, &[]);
}

/// Buckets of 8 KiB cut these tables into 32 buckets, each partition's statistics merged from
/// many pieces, in a budget that holds one bucket at a time: still the engine's output.
#[test]
fn many_buckets_in_a_small_budget_match_the_engine() {
    let tight = ["--bucket-size", "8KiB", "--max-memory", "1MiB"];
    check("seq", 2, &tight);
    check("seq_extra", 1, &tight);
    check("seq_extra", 2, &tight);
}

/// A small two-table data set written by the test: `ctx(id, age)`, `tgt(id, amount)`.
fn small(dir: &Dir, amount: Vec<Option<f64>>) {
    use arrow_array::{Float64Array, Int64Array};
    let n = amount.len() as i64;
    crate::util::write_parquet(
        &dir.join("ctx.parquet"),
        vec![
            ("id", crate::util::arc(Int64Array::from_iter_values(0..4))),
            (
                "age",
                crate::util::arc(Int64Array::from_iter_values(20..24)),
            ),
        ],
    );
    crate::util::write_parquet(
        &dir.join("tgt.parquet"),
        vec![
            (
                "id",
                crate::util::arc(Int64Array::from_iter_values((0..n).map(|i| i % 4))),
            ),
            ("amount", crate::util::arc(Float64Array::from(amount))),
        ],
    );
}

fn compile_small(dir: &Dir, extra: &[&str]) -> crate::util::Run {
    let mut args = vec![
        "compile",
        "tgt.parquet",
        "--key",
        "id",
        "--context",
        "ctx.parquet",
        "--profile",
        "mostlyai",
        "--out",
        "cache",
    ];
    args.extend_from_slice(extra);
    dsc(dir.path(), &args)
}

#[test]
fn infinities_are_refused_with_file_column_and_row() {
    for bad in [f64::INFINITY, f64::NEG_INFINITY] {
        let dir = Dir::new();
        let mut v: Vec<Option<f64>> = (0..9).map(|i| Some(f64::from(i) * 1.5)).collect();
        v[6] = Some(bad);
        small(&dir, v);
        let err = compile_small(&dir, &[]).fails(2);
        assert!(
            err.contains("tgt.parquet") && err.contains("\"amount\"") && err.contains("row 6"),
            "{err}"
        );
        assert!(err.contains("infinite"), "{err}");
        assert!(!dir.join("cache").exists());
    }
}

#[test]
fn huge_values_encode_like_the_engine() {
    // |x| >= 1e50: every digit position holds 0 and `neg` the sign (docs/COMPAT-mostlyai.md).
    // Contexts 0 and 2 get only huge values (negative in 0), 1 and 3 ordinary ones; with over
    // 100 distinct values and two non-zero digit positions the column is digit-encoded.
    let dir = Dir::new();
    let v: Vec<Option<f64>> = (0..400)
        .map(|i| {
            Some(match i % 4 {
                0 => -1e60 * f64::from(1 + i),
                2 => 1e50 * f64::from(1 + i),
                _ => f64::from(i % 100),
            })
        })
        .collect();
    small(&dir, v);
    compile_small(&dir, &[]).ok();
    let stats = json(&dir.join("cache/tgt-stats.json"));
    let col = &stats["columns"]["amount"];
    assert_eq!(col["encoding_type"], "TABULAR_NUMERIC_DIGIT", "{col}");
    let shard = crate::util::read_shard(&dir.join("cache/shards/train-00000.safetensors"));
    let keys = shard["key"].i64s();
    let lengths = shard["length"].i32s();
    let digit_names: Vec<&String> = shard
        .keys()
        .filter(|n| n.starts_with("tgt:t0/c0__E"))
        .collect();
    assert!(
        !digit_names.is_empty(),
        "{:?}",
        shard.keys().collect::<Vec<_>>()
    );
    let width = shard["tgt:t0/c0__neg"].shape[1];
    let neg = shard["tgt:t0/c0__neg"].i32s();
    for (row, &key) in keys.iter().enumerate() {
        let steps = lengths[row] as usize;
        assert_eq!(steps, 100);
        for t in 0..steps {
            let at = row * width + t;
            assert_eq!(
                neg[at],
                i32::from(key == 0),
                "neg of context {key}, step {t}"
            );
            if key % 2 == 0 {
                for name in &digit_names {
                    assert_eq!(
                        shard[*name].i32s()[at],
                        0,
                        "{name} of context {key}, step {t}"
                    );
                }
            }
        }
    }
}

#[test]
fn flags_the_profile_does_not_use_are_refused() {
    let dir = Dir::new();
    small(&dir, (0..9).map(|i| Some(f64::from(i))).collect());
    for flags in [
        &["--val-fraction", "0.2"][..],
        &["--nan", "zero"],
        &["--empty-contexts", "drop"],
        &["--truncate", "tail"],
        &["--max-len", "4"],
    ] {
        let err = compile_small(&dir, flags).fails(2);
        assert!(
            err.contains(flags[0]) && err.contains("--profile mostlyai"),
            "{flags:?}: {err}"
        );
        assert!(!dir.join("cache").exists());
    }
}

#[test]
fn bad_val_keys_lines_are_named() {
    let dir = Dir::new();
    small(&dir, (0..9).map(|i| Some(f64::from(i))).collect());
    std::fs::write(dir.join("val.txt"), "1\n\nx7\n").unwrap();
    let err = compile_small(&dir, &["--val-keys", "val.txt"]).fails(2);
    assert!(
        err.contains("val.txt") && err.contains("line 3") && err.contains("\"x7\""),
        "{err}"
    );
    std::fs::write(dir.join("val.txt"), "1\n99\n").unwrap();
    let err = compile_small(&dir, &["--val-keys", "val.txt"]).fails(2);
    assert!(err.contains("line 2") && err.contains("key 99"), "{err}");
}

#[test]
fn missing_context_key_and_unknown_profile_are_clear() {
    let dir = Dir::new();
    small(&dir, (0..9).map(|i| Some(f64::from(i))).collect());
    let err = compile_small(&dir, &["--context-key", "cid"]).fails(2);
    assert!(
        err.contains("ctx.parquet") && err.contains("\"cid\""),
        "{err}"
    );
    let err = dsc(
        dir.path(),
        &[
            "compile",
            "tgt.parquet",
            "--key",
            "id",
            "--profile",
            "nope",
            "--out",
            "c",
        ],
    )
    .fails(2);
    assert!(err.contains("--profile \"nope\" is unknown"), "{err}");
    let err = dsc(
        dir.path(),
        &[
            "compile",
            "tgt.parquet",
            "--key",
            "id",
            "--profile",
            "mostlyai",
            "--out",
            "c",
        ],
    )
    .fails(2);
    assert!(err.contains("--context"), "{err}");
}

#[test]
fn same_seed_same_cache_any_thread_count() {
    let dir = Dir::new();
    let data = vectors().join("seq_extra/data");
    let (tgt, ctx) = (data.join("tgt.parquet"), data.join("ctx.parquet"));
    // Two partitions and a validation split: per-partition donors and both splits' shards.
    let val = dir.join("val.txt");
    write_val_keys(&vectors().join("seq_extra/p2"), &val);
    let mut trees = Vec::new();
    for threads in ["1", "2"] {
        let out = dir.join(&format!("c{threads}"));
        dsc(
            dir.path(),
            &[
                "--threads",
                threads,
                "compile",
                tgt.to_str().unwrap(),
                "--key",
                "id",
                "--context",
                ctx.to_str().unwrap(),
                "--profile",
                "mostlyai",
                "--seed",
                "7",
                "--partitions",
                "2",
                "--val-keys",
                val.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "-q",
            ],
        )
        .ok();
        let mut t = crate::util::tree(&out);
        t.remove("manifest.json");
        assert!(
            t.keys().any(|f| f.starts_with("shards/val-")),
            "{:?}",
            t.keys()
        );
        trees.push(t);
    }
    assert!(
        trees[0] == trees[1],
        "the cache depends on the thread count"
    );
}
