//! Splits users already have (issue 15): a context-table column or files of keys name each
//! context's split; encodings and statistics are fitted on `train` alone; every split gets its
//! own shards and statistics, and every reader takes any split name.

use crate::util::*;
use arrow_array::{Array, Int64Array, StringArray};
use std::collections::BTreeSet;

/// The official split of the test data: events whose id is a multiple of 5 are `test`.
fn is_test(key: i64) -> bool {
    key % 5 == 0
}

/// What a context's split is, by key (`None`: null).
type SplitOf = fn(i64) -> Option<&'static str>;

/// Writes (or rewrites) the `split` column of the generated context table.
fn write_split_column(dir: &Dir, split_of: SplitOf) {
    replace_column(
        &dir.join("data/train_meta.parquet"),
        "split",
        move |_, batch| {
            let keys = batch
                .column_by_name("event_id")
                .unwrap()
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            let names: Vec<Option<&str>> = keys.values().iter().map(|&k| split_of(k)).collect();
            arc(StringArray::from(names))
        },
    );
}

/// IceCube-like data whose context table has a `split` column (`train` or `test`).
fn data_with_split_column() -> Dir {
    let dir = Dir::new();
    gen_icecube(&dir, 2, 60);
    write_split_column(&dir, |k| Some(if is_test(k) { "test" } else { "train" }));
    dir
}

/// The README compile without its hash split (`--val-fraction`), plus `extra`.
fn args<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = icecube_args(out, extra);
    let at = args.iter().position(|a| *a == "--val-fraction").unwrap();
    args.drain(at..at + 2);
    args
}

fn keys_of(cache: &std::path::Path, split: &str) -> BTreeSet<i64> {
    let (samples, _) = read_cache(cache);
    samples
        .iter()
        .filter(|(_, s)| s.split == split)
        .map(|(k, _)| *k)
        .collect()
}

fn stats_split(cache: &std::path::Path, split: &str) -> serde_json::Value {
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cache.join("stats.json")).unwrap()).unwrap();
    stats["splits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["split"] == split)
        .unwrap_or_else(|| panic!("no stats for {split}"))
        .clone()
}

#[test]
fn a_split_column_gives_each_context_its_split_and_train_alone_is_fitted() {
    let dir = data_with_split_column();
    dsc(dir.path(), &args("cache", &["--split-by", "split"])).ok();
    let m = manifest(&dir.join("cache"));
    let names: Vec<&str> = m["splits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["train", "test"]);
    let test = keys_of(&dir.join("cache"), "test");
    let train = keys_of(&dir.join("cache"), "train");
    assert!(!test.is_empty() && test.iter().all(|&k| is_test(k)));
    assert!(!train.is_empty() && train.iter().all(|&k| !is_test(k)));
    dsc(dir.path(), &["verify", "cache"]).ok();

    // The same data without its test events, compiled as one split: the train split is the
    // same contexts, so its encodings and statistics must be the same (nothing leaked from test).
    let test_keys = test.clone();
    let meta = Table::read(&dir.join("data/train_meta.parquet"));
    let meta_keys = meta.i64s("event_id");
    filter_rows(&dir.join("data/train_meta.parquet"), |i| {
        !test_keys.contains(&meta_keys[i])
    });
    for f in ["data/train/batch_1.parquet", "data/train/batch_2.parquet"] {
        let keys = Table::read(&dir.join(f)).i64s("event_id");
        filter_rows(&dir.join(f), |i| !test_keys.contains(&keys[i]));
    }
    dsc(dir.path(), &args("train_only", &[])).ok();
    let alone = manifest(&dir.join("train_only"));
    assert_eq!(
        m["tensors"], alone["tensors"],
        "encodings fitted on train only"
    );
    let (a, b) = (
        stats_split(&dir.join("cache"), "train"),
        stats_split(&dir.join("train_only"), "train"),
    );
    assert_eq!(a, b);
    let test_stats = stats_split(&dir.join("cache"), "test");
    assert_eq!(test_stats["contexts"], test.len());
}

#[test]
fn key_files_give_the_same_shards_as_the_column() {
    let dir = data_with_split_column();
    dsc(dir.path(), &args("by_column", &["--split-by", "split"])).ok();
    let test: Vec<String> = keys_of(&dir.join("by_column"), "test")
        .iter()
        .map(|k| k.to_string())
        .collect();
    std::fs::write(
        dir.join("test_ids.txt"),
        // Integer keys may stand between spaces; a line is a key (no comments).
        format!(" {}\n", test.join("\n")),
    )
    .unwrap();
    dsc(
        dir.path(),
        &args("by_keys", &["--split-keys", "test=test_ids.txt"]),
    )
    .ok();
    let checksums = |c: &str| -> Vec<serde_json::Value> {
        manifest(&dir.join(c))["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["xxh3"].clone())
            .collect()
    };
    assert_eq!(checksums("by_column"), checksums("by_keys"));
    assert_eq!(
        std::fs::read(dir.join("by_column/stats.json")).unwrap(),
        std::fs::read(dir.join("by_keys/stats.json")).unwrap()
    );
    // The key file is an input: fingerprinted like the data.
    let inputs = manifest(&dir.join("by_keys"))["inputs"]["files"].clone();
    assert!(inputs
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["role"] == "split_keys" && f["path"] == "test_ids.txt"));
}

#[test]
fn val_fraction_carves_val_out_of_train_and_leaves_test_alone() {
    let dir = data_with_split_column();
    dsc(dir.path(), &args("plain", &["--split-by", "split"])).ok();
    dsc(
        dir.path(),
        &args("carved", &["--split-by", "split", "--val-fraction", "0.3"]),
    )
    .ok();
    let names: Vec<String> = manifest(&dir.join("carved"))["splits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["train", "test", "val"]);
    let (plain, carved) = (dir.join("plain"), dir.join("carved"));
    assert_eq!(keys_of(&plain, "test"), keys_of(&carved, "test"));
    let val = keys_of(&carved, "val");
    assert!(!val.is_empty());
    let train: BTreeSet<i64> = keys_of(&carved, "train").union(&val).copied().collect();
    assert_eq!(train, keys_of(&plain, "train"));
    // Every reader takes the new split names.
    for split in ["test", "val"] {
        dsc(
            dir.path(),
            &["order", "carved", "--split", split, "--batch-size", "4"],
        )
        .ok();
        dsc(
            dir.path(),
            &["bench", "carved", "--split", split, "--batch-size", "4"],
        )
        .ok();
    }
    let shown = dsc(
        dir.path(),
        &["show", "carved", "--split", "test", "--index", "0"],
    )
    .ok();
    assert!(shown.contains("split test"), "{shown}");
    dsc(dir.path(), &["verify", "carved"]).ok();
    let inspect = dsc(dir.path(), &["inspect", "carved"]).ok();
    assert!(inspect.contains("test"), "{inspect}");
}

/// A split name of 300 characters.
fn long_name() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| "x".repeat(300))
}

#[test]
fn bad_split_assignments_name_what_is_wrong_and_write_nothing() {
    let dir = data_with_split_column();
    let cases: Vec<(SplitOf, &[&str])> = vec![
        (
            |k| if k == 7 { None } else { Some("train") },
            &["train_meta.parquet", "column \"split\"", "key 7", "null"],
        ),
        (
            |k| {
                if k == 11 {
                    Some("Test set")
                } else {
                    Some("train")
                }
            },
            &["key 11", "\"Test set\"", "lower-case"],
        ),
        (|_| Some("test"), &["no context is in the split \"train\""]),
        (
            |k| Some(if k == 29 { "all" } else { "train" }),
            &["key 29", "\"all\" is reserved"],
        ),
        // Issue 27: a 300-character name passed and failed at the shard write ("File name too
        // long").
        (
            |k| Some(if k == 11 { long_name() } else { "train" }),
            &["key 11", "longer than 64 characters"],
        ),
    ];
    for (f, needles) in cases {
        write_split_column(&dir, f);
        let err = dsc(dir.path(), &args("cache", &["--split-by", "split"])).fails(2);
        for n in needles {
            assert!(err.contains(n), "missing {n:?} in: {err}");
        }
        // Issue 27: every split error advised `--nan zero`, which does not help.
        assert!(!err.contains("--nan"), "{err}");
        assert!(!dir.join("cache").exists());
    }

    // 7, 11 and 29 are events of the generated data.
    std::fs::write(dir.join("a.txt"), "7\n11\n").unwrap();
    std::fs::write(dir.join("b.txt"), "29\n\n11\n").unwrap();
    std::fs::write(dir.join("c.txt"), "7\n123456789\n").unwrap();
    std::fs::write(dir.join("d.txt"), "7\nten\n").unwrap();
    let key_cases: Vec<(Vec<&str>, &[&str])> = vec![
        (
            vec![
                "--split-keys",
                "test=a.txt",
                "--split-keys",
                "holdout=b.txt",
            ],
            // Splits are read in name order: holdout (b.txt) first.
            &[
                "a.txt: line 2: key 11",
                "also listed for split \"holdout\" (b.txt line 3)",
            ],
        ),
        (
            vec!["--split-keys", "test=c.txt"],
            &[
                "c.txt",
                "line 2",
                "key 123456789",
                "not a context of the data",
            ],
        ),
        (
            vec!["--split-keys", "test=d.txt"],
            &["d.txt", "line 2", "\"ten\" is not an integer key"],
        ),
        (
            vec!["--split-keys", "test=a.txt", "--split-by", "split"],
            &["--split-by and --split-keys"],
        ),
        (
            vec!["--split-keys", "Test=a.txt"],
            &["\"Test\"", "lower-case"],
        ),
    ];
    for (extra, needles) in key_cases {
        let err = dsc(dir.path(), &args("cache", &extra)).fails(2);
        for n in needles {
            assert!(err.contains(n), "missing {n:?} in: {err}");
        }
        assert!(!dir.join("cache").exists());
    }
}

#[test]
fn a_csv_context_table_and_a_spec_file_take_splits_too() {
    let dir = data_with_split_column();
    // The same context table as CSV: the split column is read as strings.
    let meta = Table::read(&dir.join("data/train_meta.parquet"));
    let (keys, az, ze, split) = (
        meta.i64s("event_id"),
        meta.f64s("azimuth"),
        meta.f64s("zenith"),
        meta.strings("split"),
    );
    let mut csv = String::from("event_id,azimuth,zenith,split\n");
    for i in 0..keys.len() {
        let (a, z, sp) = (az[i].unwrap(), ze[i].unwrap(), split[i].as_deref().unwrap());
        csv.push_str(&format!("{},{a:?},{z:?},{sp}\n", keys[i]));
    }
    std::fs::write(dir.join("meta.csv"), csv).unwrap();
    dsc(dir.path(), &args("parquet", &["--split-by", "split"])).ok();
    let mut from_csv = args("csv", &["--split-by", "split"]);
    let at = from_csv
        .iter()
        .position(|a| *a == "data/train_meta.parquet")
        .unwrap();
    from_csv[at] = "meta.csv";
    dsc(dir.path(), &from_csv).ok();
    assert_eq!(
        keys_of(&dir.join("csv"), "test"),
        keys_of(&dir.join("parquet"), "test")
    );

    // A split assignment on the command line replaces the spec file's, whichever kind.
    std::fs::write(dir.join("ids.txt"), "7\n").unwrap();
    let mut print = args("unused", &["--split-keys", "holdout=ids.txt"]);
    print.push("--print-spec");
    std::fs::write(dir.join("dsc.toml"), dsc(dir.path(), &print).ok()).unwrap();
    dsc(
        dir.path(),
        &[
            "compile",
            "--spec",
            "dsc.toml",
            "--split-by",
            "split",
            "--out",
            "replaced",
        ],
    )
    .ok();
    assert_eq!(
        keys_of(&dir.join("replaced"), "test"),
        keys_of(&dir.join("parquet"), "test")
    );

    // Integers are not split names.
    replace_column(&dir.join("data/train_meta.parquet"), "split", |_, batch| {
        arc(Int64Array::from(vec![0i64; batch.num_rows()]))
    });
    let err = dsc(dir.path(), &args("ints", &["--split-by", "split"])).fails(2);
    assert!(err.contains("strings naming splits"), "{err}");
}
