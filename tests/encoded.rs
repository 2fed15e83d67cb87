//! String columns encoded to a fixed width (`--encode COL=bits`, `chars:W`, `ngrams:N`): each
//! its own tensor, of the rows table `[n, L, W]` and of the context table `[n, W]`, fitted on
//! the train split, decoded back to the source by `dsc show`, checked by `dsc verify`, counted
//! in stats.json, byte-identical whatever the threads, memory or partitions; a string `bits`
//! cannot store is an error naming file, column and row.

use crate::util::*;
use arrow_array::Array;
use std::collections::{BTreeMap, BTreeSet};

/// The microbiome sample data and its compile with `asv=chars:150` (rows) and
/// `site_name=ngrams:2` (context table).
fn microbiome(dir: &Dir, extra: &[&str]) -> Run {
    let mut args = vec![
        "compile",
        "microbes/asvs.parquet",
        "--key",
        "sample_id",
        "--features",
        "count",
        "--encode",
        "asv=chars:150",
        "--context",
        "microbes/samples.parquet",
        "--targets",
        "site",
        "--encode",
        "site_name=ngrams:2",
        "--val-fraction",
        "0.25",
        "--quiet",
    ];
    args.extend(extra);
    dsc(dir.path(), &args)
}

fn gen(dir: &Dir, what: &str, out: &str, n: &str) {
    dsc(dir.path(), &["gen", what, "--out", out, "--records", n]).ok();
}

#[test]
fn chars_and_ngrams_store_each_row_and_show_gives_the_source_back() {
    let dir = Dir::new();
    gen(&dir, "microbiome", "microbes", "60");
    microbiome(&dir, &["--out", "cache"]).ok();
    let m = manifest(&dir.join("cache"));
    let tensors = m["tensors"].as_array().unwrap();
    let asv = tensors.iter().find(|t| t["name"] == "asv").unwrap();
    let l = m["max_len"].as_u64().unwrap();
    assert_eq!(asv["dtype"], "I32");
    assert_eq!(asv["role"], "encoded");
    assert_eq!(asv["sample_shape"], serde_json::json!([l, 150]));
    assert_eq!(
        asv["columns"][0]["encoding"],
        serde_json::json!({"kind": "chars", "width": 150, "vocabulary": ["A", "C", "G", "T"]})
    );
    let site = tensors.iter().find(|t| t["name"] == "site_name").unwrap();
    assert_eq!(
        (&site["dtype"], &site["role"]),
        (&"U8".into(), &"context_encoded".into())
    );
    // Every stored row is its source string: per key, the ASVs in file order.
    let rows = Table::read(&dir.join("microbes/asvs.parquet"));
    let mut by_key: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for (k, s) in rows.i64s("sample_id").into_iter().zip(rows.strings("asv")) {
        by_key.entry(k).or_default().push(s.unwrap());
    }
    let names = Table::read(&dir.join("microbes/samples.parquet"));
    let site_of: BTreeMap<i64, String> = names
        .i64s("sample_id")
        .into_iter()
        .zip(names.strings("site_name"))
        .map(|(k, s)| (k, s.unwrap()))
        .collect();
    let (samples, _) = read_cache(&dir.join("cache"));
    assert_eq!(samples.len(), by_key.len());
    for (key, sample) in &samples {
        let codes = &sample.tensors["asv"];
        let len = sample.tensors["length"][0] as usize;
        assert_eq!(len, by_key[key].len());
        for (step, want) in by_key[key].iter().enumerate() {
            let got: String = codes[step * 150..(step + 1) * 150]
                .iter()
                .map(|&c| ['?', '?', 'A', 'C', 'G', 'T'][c as usize])
                .collect();
            assert_eq!(&got, want, "key {key} step {step}");
        }
        assert!(codes[len * 150..].iter().all(|&c| c == 0.0), "padding");
    }
    // dsc show decodes both back to the source: the strings, and the set of 2-grams.
    let key = *samples.keys().next().unwrap();
    let shown: serde_json::Value = serde_json::from_str(
        &dsc(
            dir.path(),
            &["show", "cache", "--key", &key.to_string(), "--json"],
        )
        .ok(),
    )
    .unwrap();
    let split = samples[&key].split.clone();
    let shown = if shown["split"] == split.as_str() {
        shown
    } else {
        serde_json::from_str(
            &dsc(
                dir.path(),
                &[
                    "show",
                    "cache",
                    "--split",
                    &split,
                    "--key",
                    &key.to_string(),
                    "--json",
                ],
            )
            .ok(),
        )
        .unwrap()
    };
    let asvs: Vec<String> = shown["columns"]["asv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(asvs, by_key[&key]);
    let grams: BTreeSet<String> = shown["context"]["site_name"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let chars: Vec<char> = site_of[&key].chars().collect();
    let want: BTreeSet<String> = chars.windows(2).map(|w| w.iter().collect()).collect();
    assert_eq!(grams, want);
    dsc(dir.path(), &["verify", "cache"]).ok();
}

#[test]
fn ngram_vocabularies_are_the_train_splits_most_frequent_counted_in_stats() {
    let dir = Dir::new();
    gen(&dir, "linkage", "people", "800");
    let compile = |out: &str, cap: &str| {
        dsc(
            dir.path(),
            &[
                "compile",
                "people/records.parquet",
                "--key",
                "uid",
                "--features",
                "yob",
                "--encode",
                "bloom=bits",
                "--encode",
                "first_name=ngrams:2",
                "--ngram-vocab",
                cap,
                "--val-fraction",
                "0.25",
                "--out",
                out,
                "--quiet",
            ],
        )
        .ok();
    };
    compile("all", "4096");
    compile("ten", "10");
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("all/stats.json")).unwrap()).unwrap();
    let train = stats["splits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["split"] == "train")
        .unwrap();
    let column = train["columns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "first_name")
        .unwrap();
    let vocabulary: Vec<(String, u64)> = column["vocabulary"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["value"].as_str().unwrap().into(),
                e["count"].as_u64().unwrap(),
            )
        })
        .collect();
    // Counts are rows holding each gram, most frequent first, ties ascending.
    for w in vocabulary.windows(2) {
        assert!(
            w[0].1 > w[1].1 || w[0].1 == w[1].1 && w[0].0 < w[1].0,
            "{w:?}"
        );
    }
    let encoding = |cache: &str| -> Vec<String> {
        manifest(&dir.join(cache))["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "first_name")
            .unwrap()["columns"][0]["encoding"]["vocabulary"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().into())
            .collect()
    };
    let all: Vec<String> = vocabulary.iter().map(|(g, _)| g.clone()).collect();
    assert_eq!(encoding("all"), all);
    assert_eq!(encoding("ten"), all[..10].to_vec());
    // Each record's vector holds exactly its name's grams that are in the vocabulary.
    let records = Table::read(&dir.join("people/records.parquet"));
    let name_of: BTreeMap<i64, String> = records
        .i64s("uid")
        .into_iter()
        .zip(records.strings("first_name"))
        .map(|(k, s)| (k, s.unwrap()))
        .collect();
    let bloom_of: BTreeMap<i64, String> = records
        .i64s("uid")
        .into_iter()
        .zip(records.strings("bloom"))
        .map(|(k, s)| (k, s.unwrap()))
        .collect();
    let vocab = encoding("ten");
    for (key, sample) in read_cache(&dir.join("ten")).0 {
        let chars: Vec<char> = name_of[&key].chars().collect();
        let grams: BTreeSet<String> = chars.windows(2).map(|w| w.iter().collect()).collect();
        let hot = &sample.tensors["first_name"];
        for (i, g) in vocab.iter().enumerate() {
            assert_eq!(hot[i] == 1.0, grams.contains(g), "key {key} gram {g}");
        }
        let bits: String = sample.tensors["bloom"]
            .iter()
            .map(|&b| if b == 1.0 { '1' } else { '0' })
            .collect();
        assert_eq!(bits, bloom_of[&key]);
    }
}

#[test]
fn the_same_strings_give_the_same_bytes_whatever_the_threads_memory_and_partitions() {
    let dir = Dir::new();
    gen(&dir, "microbiome", "microbes", "80");
    microbiome(&dir, &["--out", "one"]).ok();
    microbiome(&dir, &["--out", "small", "--max-memory", "2MiB"]).ok();
    let mut threads = vec!["--threads", "1"];
    threads.extend(["--out", "t1"]);
    microbiome(&dir, &threads).ok();
    for stage in ["scan", "fit", "write"] {
        for part in ["0/2", "1/2"] {
            microbiome(
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

/// Rewrites `path`'s `bloom` column with row `row` of its first batch as `edit` makes it.
fn edit_bloom(path: &std::path::Path, row: usize, edit: impl Fn(&str) -> String) {
    replace_column(path, "bloom", |i, batch| {
        let strings = batch
            .column_by_name("bloom")
            .unwrap()
            .as_any()
            .downcast_ref::<arrow_array::StringArray>()
            .unwrap()
            .clone();
        let changed: arrow_array::StringArray = (0..strings.len())
            .map(|j| {
                let s = strings.value(j);
                Some(if (i, j) == (0, row) {
                    edit(s)
                } else {
                    s.to_string()
                })
            })
            .collect();
        arc(changed)
    });
}

#[test]
fn a_string_bits_cannot_store_is_named_by_file_column_and_row() {
    let dir = Dir::new();
    gen(&dir, "linkage", "people", "50");
    let path = dir.join("people/records.parquet");
    for (row, bad, says) in [
        (
            17usize,
            "short",
            "a bit string of 255 characters; the column's are 256",
        ),
        (23, "char", "is not a bit string: character 3 is 'x'"),
    ] {
        let original = std::fs::read(&path).unwrap();
        edit_bloom(&path, row, |s| {
            if bad == "short" {
                s[1..].to_string()
            } else {
                format!("{}x{}", &s[..3], &s[4..])
            }
        });
        let err = dsc(
            dir.path(),
            &[
                "compile",
                "people/records.parquet",
                "--key",
                "uid",
                "--features",
                "yob",
                "--encode",
                "bloom=bits",
                "--out",
                "cache",
            ],
        )
        .fails(2);
        assert!(
            err.contains("records.parquet")
                && err.contains("column \"bloom\"")
                && err.contains(&format!("row {row}"))
                && err.contains(says),
            "{err}"
        );
        assert!(!dir.join("cache").exists(), "nothing written");
        std::fs::write(&path, original).unwrap();
    }
}

#[test]
fn a_string_encoding_that_would_store_nothing_or_twice_is_refused() {
    let dir = Dir::new();
    gen(&dir, "linkage", "people", "60");
    let compile = |extra: &[&str]| {
        let mut args = vec![
            "compile",
            "people/records.parquet",
            "--out",
            "cache",
            "--quiet",
        ];
        args.extend(extra);
        dsc(dir.path(), &args)
    };
    for (extra, says) in [
        (
            &[
                "--features",
                "yob",
                "--encode",
                "first_name=ngrams:2",
                "--ngram-vocab",
                "0",
            ][..],
            "--ngram-vocab 0 keeps no gram",
        ),
        (
            &["--features", "yob", "--encode", "first_name=ngrams:17"][..],
            "the gram length must be a whole number from 1 to 16, got \"17\"",
        ),
        (
            &["--features", "yob", "--encode", "first_name=chars:+3"][..],
            "the width must be a whole number from 1 to 65536, got \"+3\"",
        ),
        // No first name of the train split has 16 characters: no gram to encode.
        (
            &["--features", "yob", "--encode", "first_name=ngrams:16"][..],
            "no string of the train split holds 16 characters",
        ),
        (
            &[
                "--features",
                "yob",
                "--encode",
                "first_name=chars:3",
                "--encode",
                "first_name=ngrams:2",
            ][..],
            "--encode names column \"first_name\" twice (chars:3 and ngrams:2)",
        ),
        (&["--targets", "yob"][..], "nothing to store"),
        // A string column named like a reserved tensor, or the key: which of them it is.
        (
            &[
                "--key",
                "uid",
                "--features",
                "yob",
                "--encode",
                "uid=chars:4",
            ][..],
            "uid=chars:4: \"uid\" is the key column",
        ),
        // Without a feature, a misspelt encoding is still named for what it is.
        (
            &["--targets", "yob", "--encode", "bloom=chars:0"][..],
            "the width must be a whole number from 1 to 65536, got \"0\"",
        ),
    ] {
        let err = compile(extra).fails(2);
        assert!(err.contains(says), "{extra:?}: {err}");
        assert!(!dir.join("cache").exists(), "nothing written");
    }
    // An empty first bit string would make the column's width 0: named by its place.
    let path = dir.join("people/records.parquet");
    let original = std::fs::read(&path).unwrap();
    edit_bloom(&path, 0, |_| String::new());
    let err = compile(&["--targets", "yob", "--encode", "bloom=bits"]).fails(2);
    assert!(
        err.contains("records.parquet: column \"bloom\" row 0: an empty bit string"),
        "{err}"
    );
    std::fs::write(&path, original).unwrap();
    // A Bloom filter and a label, nothing else, is something to store: [n, 256] and [n, 1].
    compile(&["--targets", "yob", "--encode", "bloom=bits"]).ok();
    let m = manifest(&dir.join("cache"));
    let names: Vec<&str> = m["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["key", "bloom", "length", "y"]);
    dsc(dir.path(), &["verify", "cache"]).ok();
}
