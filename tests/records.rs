//! Tables without sequences: `dsc compile` with no `--key` stores every row as its own sample,
//! keyed by its row number across the rows files, in tensors without a step axis (`x [n, F]`,
//! a code `[n]` per categorical column, `[n, W]` per string column, `y [n, T]` from the rows'
//! own columns); byte-identical whatever the threads, memory or partitions; what only
//! sequences have (ordering, a context table, padding) is refused by name.

use crate::util::*;
use std::collections::BTreeMap;

/// The linkage records cut into two rows files (rows 0..cut and cut..), so that row numbers
/// run across files.
fn two_files(dir: &Dir, records: usize, cut: usize) {
    dsc(
        dir.path(),
        &[
            "gen",
            "linkage",
            "--out",
            "people",
            "--records",
            &records.to_string(),
        ],
    )
    .ok();
    std::fs::create_dir_all(dir.join("tables")).unwrap();
    for (i, keep) in [(0, true), (1, false)] {
        let path = dir.join(&format!("tables/part-{i}.parquet"));
        std::fs::copy(dir.join("people/records.parquet"), &path).unwrap();
        filter_rows(&path, |r| (r < cut) == keep);
    }
}

fn compile(dir: &Dir, extra: &[&str]) -> Run {
    let mut args = vec![
        "compile",
        "tables/*.parquet",
        "--features",
        "yob",
        "--categorical",
        "last_name",
        "--encode",
        "bloom=bits",
        "--encode",
        "first_name=ngrams:2",
        "--targets",
        "uid",
        "--val-fraction",
        "0.2",
        "--shard-size",
        "64KiB",
        "--quiet",
    ];
    args.extend(extra);
    dsc(dir.path(), &args)
}

#[test]
fn a_table_without_a_key_stores_each_row_as_one_sample_without_a_step_axis() {
    let dir = Dir::new();
    two_files(&dir, 700, 300);
    compile(&dir, &["--out", "cache"]).ok();
    let m = manifest(&dir.join("cache"));
    let shapes: BTreeMap<String, (String, String, serde_json::Value)> = m["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                (
                    t["role"].as_str().unwrap().to_string(),
                    t["dtype"].as_str().unwrap().to_string(),
                    t["sample_shape"].clone(),
                ),
            )
        })
        .collect();
    let want = |role: &str, dtype: &str, shape: serde_json::Value| {
        (role.to_string(), dtype.to_string(), shape)
    };
    use serde_json::json;
    assert_eq!(shapes["key"], want("key", "I64", json!([])));
    assert_eq!(shapes["x"], want("context_features", "F32", json!([1])));
    assert_eq!(
        shapes["last_name"],
        want("context_categorical", "I32", json!([]))
    );
    assert_eq!(shapes["bloom"], want("context_encoded", "U8", json!([256])));
    assert_eq!(shapes["y"], want("targets", "F32", json!([1])));
    assert_eq!(shapes["length"], want("length", "I32", json!([])));
    assert!(!shapes.contains_key("full_length"), "{shapes:?}");
    assert_eq!(m["max_len"], 1);
    assert_eq!(m["tensors"][0]["columns"][0]["name"], "row");

    // Every row is one sample, keyed by its row number across both files, its values its own.
    let mut yob = Vec::new();
    let mut uid = Vec::new();
    let mut bloom = Vec::new();
    let mut last = Vec::new();
    for i in 0..2 {
        let t = Table::read(&dir.join(&format!("tables/part-{i}.parquet")));
        yob.extend(t.f64s("yob"));
        uid.extend(t.f64s("uid"));
        bloom.extend(t.strings("bloom"));
        last.extend(t.strings("last_name"));
    }
    let vocabulary: Vec<String> = m["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "last_name")
        .unwrap()["columns"][0]["encoding"]["vocabulary"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let (samples, order) = read_cache(&dir.join("cache"));
    assert_eq!(samples.len(), 700);
    assert_eq!(
        samples.keys().copied().collect::<Vec<i64>>(),
        (0..700).collect::<Vec<i64>>()
    );
    assert!(
        order["val"].len() > 100 && order["val"].len() < 180,
        "{order:?}"
    );
    for (&row, s) in &samples {
        let r = row as usize;
        assert_eq!(s.tensors["x"], vec![yob[r].unwrap()], "row {row}");
        assert_eq!(s.tensors["y"], vec![uid[r].unwrap()], "row {row}");
        assert_eq!(s.tensors["length"], vec![1.0]);
        let bits: String = s.tensors["bloom"]
            .iter()
            .map(|&b| if b == 1.0 { '1' } else { '0' })
            .collect();
        assert_eq!(Some(bits), bloom[r], "row {row}");
        // Codes: 0 padding, 1 unknown (a name only the validation split has), 2.. vocabulary.
        let code = s.tensors["last_name"][0] as usize;
        let name = last[r].clone().unwrap();
        match vocabulary.iter().position(|v| *v == name) {
            Some(i) => assert_eq!(code, i + 2, "row {row}"),
            None => assert_eq!((code, s.split.as_str()), (1, "val"), "row {row}"),
        }
    }

    // dsc show gives a record back by its row number; verify checks codes and bits.
    let shown: serde_json::Value = serde_json::from_str(
        &dsc(
            dir.path(),
            &[
                "show",
                "cache",
                "--split",
                "val",
                "--key",
                &order["val"][0].to_string(),
                "--json",
            ],
        )
        .ok(),
    )
    .unwrap();
    let r = order["val"][0] as usize;
    assert_eq!(shown["context"]["yob"], json!(yob[r].unwrap()));
    assert_eq!(shown["context"]["bloom"], json!(bloom[r].clone().unwrap()));
    assert_eq!(shown["targets"]["uid"], json!(uid[r].unwrap()));
    dsc(dir.path(), &["verify", "cache"]).ok();
    let inspect = dsc(dir.path(), &["inspect", "cache"]).ok();
    assert!(inspect.contains("a table of records"), "{inspect}");
}

#[test]
fn a_table_of_records_gives_the_same_bytes_whatever_the_threads_memory_and_partitions() {
    let dir = Dir::new();
    two_files(&dir, 900, 500);
    compile(&dir, &["--out", "one"]).ok();
    compile(&dir, &["--out", "small", "--max-memory", "2MiB"]).ok();
    compile(&dir, &["--out", "t1", "--threads", "1"]).ok();
    for stage in ["scan", "fit", "write"] {
        for part in ["0/2", "1/2"] {
            compile(
                &dir,
                &["--partition", part, "--stage", stage, "--out", "parts"],
            )
            .ok();
        }
    }
    dsc(dir.path(), &["merge", "parts", "--quiet"]).ok();
    let one = tree(&dir.join("one"));
    for other in ["small", "t1", "parts"] {
        assert_eq!(tree(&dir.join(other)), one, "{other}");
    }
}

#[test]
fn what_only_sequences_have_is_refused_without_a_key() {
    let dir = Dir::new();
    two_files(&dir, 50, 20);
    for (extra, says) in [
        (vec!["--order-by", "yob"], "orders rows within a context"),
        (vec!["--max-len", "4"], "pads sequences"),
        (vec!["--truncate", "tail"], "cuts sequences"),
        (
            vec!["--context", "people/records.parquet"],
            "joins a context table",
        ),
        (vec!["--targets", "yob"], "both list column \"yob\""),
        (
            vec![
                "--profile",
                "mostlyai",
                "--context",
                "people/records.parquet",
            ],
            "mostlyai compiles sequences",
        ),
    ] {
        let mut args = extra.clone();
        args.extend(["--out", "cache"]);
        let err = compile(&dir, &args).fails(2);
        assert!(err.contains(says), "{extra:?}: {err}");
        assert!(
            says.contains("both") || err.contains("--key"),
            "{extra:?}: {err}"
        );
        assert!(!dir.join("cache").exists(), "{extra:?}: nothing written");
    }
}
