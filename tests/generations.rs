//! Generations (`dsc append`, `dsc log`, `--generation`, `--fit-from`): a cache that grows by
//! immutable generations holds the live contexts a compile of all its inputs with the first
//! generation's encodings holds; every generation stays readable; states resume on the
//! generation they read; appends that fail, race or are killed leave the cache as it was.

use crate::util::{
    arc, dsc, files_in, filter_rows, gen_icecube, gen_sequences_as, icecube_args, read_cache_as,
    replace_column, tree, Dir, Sample, Table,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{Float64Array, Int64Array};
use std::collections::BTreeMap;
use std::path::Path;

/// The IceCube compile of the README over `rows`, into `out`, with `extra` flags. Each batch
/// file holds whole events and `train_meta` every event, so empty contexts are dropped.
fn compile_icecube(dir: &Dir, rows: &str, out: &str, extra: &[&str]) {
    let mut args = icecube_args(out, &["--empty-contexts", "drop"]);
    args[1] = rows;
    args.extend_from_slice(extra);
    dsc(dir.path(), &args).ok();
}

/// IceCube-like data of `files` files of `events` events in a folder of its own, and the
/// first generation of `cache`: the first file compiled with `extra` flags.
fn first_generation(files: usize, events: usize, extra: &[&str]) -> Dir {
    let dir = Dir::new();
    gen_icecube(&dir, files, events);
    compile_icecube(&dir, "data/train/batch_1.parquet", "cache", extra);
    dir
}

/// Appends file `i` of the data to `cache` (with the context table every event is in).
fn append_file(dir: &Dir, i: usize) -> String {
    let rows = format!("data/train/batch_{i}.parquet");
    append(
        dir,
        "cache",
        &rows,
        &["--context", "data/train_meta.parquet"],
    )
}

fn append(dir: &Dir, cache: &str, rows: &str, extra: &[&str]) -> String {
    let mut args = vec!["append", cache, rows];
    args.extend_from_slice(extra);
    dsc(dir.path(), &args).ok()
}

/// The manifest of generation `n` (`manifest.json` for 1) as JSON.
fn generation(cache: &Path, n: u32) -> serde_json::Value {
    let file = match n {
        1 => "manifest.json".to_string(),
        n => format!("generations/{n:05}.json"),
    };
    serde_json::from_slice(&std::fs::read(cache.join(file)).expect("a generation")).unwrap()
}

/// The folder of generation `n`'s own files (`generations/NNNNN-ID`).
fn folder(cache: &Path, n: u32) -> std::path::PathBuf {
    cache.join(
        generation(cache, n)["generation"]["folder"]
            .as_str()
            .unwrap(),
    )
}

/// Asserts that every shard of the compile whose files are `theirs` is, byte for byte, the
/// file of that name in generation folder `ours` (`when` says which compaction, if any).
fn assert_same_shards(theirs: &BTreeMap<String, Vec<u8>>, ours: &Path, when: &str) {
    for (name, bytes) in theirs.iter().filter(|(n, _)| n.starts_with("shards/")) {
        let mine = std::fs::read(ours.join(name)).unwrap();
        assert!(mine == *bytes, "{name} differs {when}");
    }
}

/// Every context of generation `n` by key.
fn contexts(cache: &Path, n: u32) -> BTreeMap<i64, Sample> {
    read_cache_as(cache, &generation(cache, n)).0
}

/// Asserts that two sets of contexts are equal by key, split and every tensor, naming the
/// first difference.
fn assert_same_contexts(a: &BTreeMap<i64, Sample>, b: &BTreeMap<i64, Sample>) {
    assert_eq!(a.len(), b.len(), "context counts");
    for (key, x) in a {
        let y = b.get(key).unwrap_or_else(|| panic!("key {key} missing"));
        assert_eq!(x.split, y.split, "split of key {key}");
        for (name, values) in &x.tensors {
            assert_eq!(
                Some(values),
                y.tensors.get(name),
                "tensor {name} of key {key}"
            );
        }
    }
}

#[test]
fn a_lineage_holds_the_contexts_of_the_fit_from_compile_of_all_its_inputs() {
    let dir = Dir::new();
    gen_icecube(&dir, 4, 150);
    compile_icecube(
        &dir,
        "data/train/batch_[12].parquet",
        "cache",
        &["--shard-size", "96KiB"],
    );
    let meta = ["--context", "data/train_meta.parquet"];
    append(&dir, "cache", "data/train/batch_3.parquet", &meta);
    let said = append(&dir, "cache", "data/train/batch_4.parquet", &meta);
    assert!(said.contains("generation 3"), "{said}");
    let cache = dir.join("cache");
    compile_icecube(
        &dir,
        "data/train/batch_*.parquet",
        "all",
        &["--fit-from", "cache"],
    );
    let lineage = contexts(&cache, 3);
    let all = contexts(&dir.join("all"), 1);
    assert_eq!(lineage.len(), 600);
    assert_same_contexts(&lineage, &all);
    // The whole lineage's tensors (encodings included) are the first generation's, and so
    // are the fit-from compile's.
    let tensors = &generation(&cache, 1)["tensors"];
    assert_eq!(&generation(&cache, 3)["tensors"], tensors);
    assert_eq!(&generation(&dir.join("all"), 1)["tensors"], tensors);
    // Each generation keeps the ones before it whole: the first's shards, file for file.
    let first: Vec<_> = generation(&cache, 1)["shards"].as_array().unwrap().clone();
    let third = generation(&cache, 3);
    assert_eq!(
        third["shards"].as_array().unwrap()[..first.len() / 2],
        first[..first.len() / 2]
    );
    assert_eq!(third["generation"]["number"], 3);
    // Statistics of the whole generation merge exactly where they can: counts and moments
    // equal those of the compile of everything.
    let stats = |p: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let merged = stats(&folder(&cache, 3).join("stats.json"));
    let whole = stats(&dir.join("all/stats.json"));
    assert_eq!(merged["quantiles_of"], 1);
    for (m, w) in merged["splits"]
        .as_array()
        .unwrap()
        .iter()
        .zip(whole["splits"].as_array().unwrap())
    {
        assert_eq!(m["split"], w["split"]);
        assert_eq!(m["contexts"], w["contexts"]);
        assert_eq!(m["rows"], w["rows"]);
        assert_eq!(m["lengths"]["histogram"], w["lengths"]["histogram"]);
        for (a, b) in m["columns"]
            .as_array()
            .unwrap()
            .iter()
            .zip(w["columns"].as_array().unwrap())
        {
            assert_eq!(
                (&a["name"], &a["count"], &a["nulls"]),
                (&b["name"], &b["count"], &b["nulls"])
            );
            if let (Some(x), Some(y)) = (a["numeric"].as_object(), b["numeric"].as_object()) {
                for k in ["mean", "std", "min", "max"] {
                    let (x, y) = (x[k].as_f64().unwrap(), y[k].as_f64().unwrap());
                    assert!(
                        (x - y).abs() <= 1e-9 * y.abs().max(1.0),
                        "{} {k}: {x} vs {y}",
                        a["name"]
                    );
                }
            }
            assert_eq!(
                a["vocabulary"], b["vocabulary"],
                "vocabulary of {}",
                a["name"]
            );
        }
    }
    // Histograms are binned on the first generation's edges, so they add up exactly: the
    // merged `charge` histogram counts every raw value of the four files in its bins.
    let first = stats(&cache.join("stats.json"));
    let column = |s: &serde_json::Value, name: &str| {
        s["splits"][0]["columns"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()["numeric"]["histogram"]
            .clone()
    };
    let edges: Vec<f64> = column(&first, "charge")
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["lo"].as_f64().unwrap())
        .collect();
    let mut counts = vec![0u64; edges.len()];
    for f in 1..=4 {
        let table = Table::read(&dir.join(&format!("data/train/batch_{f}.parquet")));
        for v in table.f64s("charge").into_iter().flatten() {
            counts[edges[1..].iter().take_while(|&&e| e <= v).count()] += 1;
        }
    }
    let merged_counts: Vec<u64> = column(&merged, "charge")
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["count"].as_u64().unwrap())
        .collect();
    assert_eq!(merged_counts, counts);
}

#[test]
fn an_append_reports_how_far_the_new_data_is_from_the_fitted_parameters() {
    let dir = first_generation(3, 150, &[]);
    // Batch 2 as it comes; batch 3 with its charges ten times larger (a recalibrated sensor).
    let meta = ["--context", "data/train_meta.parquet", "--json"];
    let calm: serde_json::Value =
        serde_json::from_str(&append(&dir, "cache", "data/train/batch_2.parquet", &meta)).unwrap();
    // Few events see few of the 5,160 sensors: new ones are outside the vocabulary (and said
    // so), while the charges are as they were.
    let said = calm["drift"]["reasons"].as_array().unwrap();
    assert!(
        said.iter()
            .all(|r| !r.as_str().unwrap().starts_with("charge")),
        "{calm}"
    );
    let column = |d: &serde_json::Value, name: &str| {
        d["drift"]["columns"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["column"] == name)
            .cloned()
            .unwrap()
    };
    assert!(
        column(&calm, "charge")["mean_shift_sd"]
            .as_f64()
            .unwrap()
            .abs()
            < 0.2,
        "{calm}"
    );
    replace_column(&dir.join("data/train/batch_3.parquet"), "charge", |_, b| {
        let c = b
            .column_by_name("charge")
            .unwrap()
            .as_primitive::<Float64Type>();
        arc(Float64Array::from_iter_values(
            c.values().iter().map(|v| v * 10.0),
        ))
    });
    let moved: serde_json::Value =
        serde_json::from_str(&append(&dir, "cache", "data/train/batch_3.parquet", &meta)).unwrap();
    let c = column(&moved, "charge");
    assert!(c["mean_shift_sd"].as_f64().unwrap() > 3.0, "{c}");
    assert!(c["std_ratio"].as_f64().unwrap() > 5.0, "{c}");
    // Charges are heavy-tailed: most of ten times the usual still lies below the fitted
    // maximum, but some values do not (counted exactly, from the sorted values).
    assert!(c["outside_range"].as_f64().unwrap() > 0.0, "{c}");
    assert_eq!(moved["drift"]["refit_due"], true);
    // The generation keeps the report beside its shards.
    let kept: serde_json::Value = serde_json::from_slice(
        &std::fs::read(folder(&dir.join("cache"), 3).join("drift.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(kept, moved["drift"]);
    let reasons = kept["reasons"].as_array().unwrap();
    assert!(
        reasons
            .iter()
            .any(|r| r.as_str().unwrap().starts_with("charge:")),
        "{kept}"
    );
    // Categories outside the vocabulary are counted.
    assert!(column(&moved, "sensor_id")["unknown"].as_f64().is_some());
}

#[test]
fn the_text_report_warns_that_a_refit_is_due() {
    let dir = first_generation(2, 100, &[]);
    replace_column(&dir.join("data/train/batch_2.parquet"), "charge", |_, b| {
        let c = b
            .column_by_name("charge")
            .unwrap()
            .as_primitive::<Float64Type>();
        arc(Float64Array::from_iter_values(
            c.values().iter().map(|v| v + 50.0),
        ))
    });
    let run = dsc(
        dir.path(),
        &[
            "append",
            "cache",
            "data/train/batch_2.parquet",
            "--context",
            "data/train_meta.parquet",
        ],
    );
    let out = run.ok();
    assert!(
        out.contains("mean shift") && out.contains("charge"),
        "{out}"
    );
    let err = run.stderr();
    assert!(
        err.contains("a refit) is due") && err.contains("charge:"),
        "{err}"
    );
}

#[test]
fn string_keys_and_list_columns_append_as_integer_keys_do() {
    let dir = Dir::new();
    gen_sequences_as(
        &dir,
        "seq",
        (300, 5),
        &["--key-type", "string", "--layout", "lists"],
    );
    let files = files_in(&dir, "seq/lists");
    assert_eq!(files.len(), 3);
    let compile = |rows: &[&str], out: &str, extra: &[&str]| {
        let mut args = vec!["compile"];
        args.extend_from_slice(rows);
        args.extend_from_slice(&[
            "--key",
            "customer_id",
            "--order-by",
            "ts",
            "--targets",
            "lifetime_value",
            "--features",
            "amount,items",
            "--categorical",
            "merchant_category",
            "--encode",
            "amount=log1p,zscore",
            "--nan",
            "mean",
            "--val-fraction",
            "0.2",
            "--empty-contexts",
            "drop",
            "--shard-size",
            "32KiB",
            "--out",
            out,
        ]);
        args.extend_from_slice(extra);
        dsc(dir.path(), &args).ok();
    };
    compile(&[&files[0]], "cache", &[]);
    append(&dir, "cache", &files[1], &[]);
    append(&dir, "cache", &files[2], &[]);
    let all: Vec<&str> = files.iter().map(String::as_str).collect();
    compile(&all, "all", &["--fit-from", "cache"]);
    let cache = dir.join("cache");
    assert_same_contexts(&contexts(&cache, 3), &contexts(&dir.join("all"), 1));
    // Every key is readable back as the text it was: key tables travel with their shards.
    let shown = dsc(
        dir.path(),
        &[
            "show", "cache", "--split", "train", "--index", "0", "--json",
        ],
    )
    .ok();
    let key: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert!(
        key["key"].as_str().is_some_and(|k| k.starts_with("C-")),
        "{shown}"
    );
    dsc(dir.path(), &["verify", "cache"]).ok();
    // A key of the cache appended again is refused, named as the column holds it.
    let err = dsc(dir.path(), &["append", "cache", &files[1]]).fails(2);
    assert!(
        err.contains("key \"C-") && err.contains("generation 2"),
        "{err}"
    );
    // Appended again replacing its keys, the same file gives the same live contexts; compacted,
    // the lineage is the compile of the three files once each, byte for byte.
    append(&dir, "cache", &files[1], &["--existing", "replace"]);
    assert_same_contexts(&contexts(&cache, 4), &contexts(&cache, 3));
    dsc(dir.path(), &["verify", "cache"]).ok();
    dsc(dir.path(), &["compact", "cache"]).ok();
    let theirs = tree(&dir.join("all"));
    assert_same_shards(&theirs, &folder(&cache, 5), "");
}

#[test]
fn every_generation_stays_readable_by_number_and_content_id() {
    let dir = first_generation(3, 100, &[]);
    let first = tree(&dir.join("cache"));
    append_file(&dir, 2);
    append_file(&dir, 3);
    // No file of an earlier generation changed.
    let now = tree(&dir.join("cache"));
    for (name, bytes) in &first {
        assert_eq!(now.get(name), Some(bytes), "{name} changed");
    }
    let log: serde_json::Value =
        serde_json::from_str(&dsc(dir.path(), &["log", "cache", "--json"]).ok()).unwrap();
    let log = log.as_array().unwrap();
    assert_eq!(log.len(), 3);
    for (i, g) in log.iter().enumerate() {
        let n = (i + 1).to_string();
        let id = g["content_id"].as_str().unwrap();
        for at in [n.as_str(), id] {
            let inspect: serde_json::Value = serde_json::from_str(
                &dsc(
                    dir.path(),
                    &["inspect", "cache", "--generation", at, "--json"],
                )
                .ok(),
            )
            .unwrap();
            assert_eq!(inspect["generation"], i + 1);
            assert_eq!(inspect["content_id"], id);
        }
        dsc(dir.path(), &["verify", "cache", "--generation", &n]).ok();
        let added: u64 = g["added"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s[1].as_u64().unwrap())
            .sum();
        assert_eq!(added, 100, "generation {n} added one file's events");
    }
    let inspect: serde_json::Value =
        serde_json::from_str(&dsc(dir.path(), &["inspect", "cache", "--json"]).ok()).unwrap();
    assert_eq!(inspect["generation"], 3, "the last one by default");
    assert_eq!(inspect["contexts"], 300);
    let err = dsc(dir.path(), &["inspect", "cache", "--generation", "4"]).fails(2);
    assert!(
        err.contains("no generation 4 (generations 1 to 3)"),
        "{err}"
    );
    let err = dsc(
        dir.path(),
        &["inspect", "cache", "--generation", "00000000deadbeef"],
    )
    .fails(2);
    assert!(err.contains("no content id 00000000deadbeef"), "{err}");
}

/// The distinct event ids of data file `i`, in the order they first appear.
fn event_ids(dir: &Dir, i: usize) -> Vec<i64> {
    let mut seen = Vec::new();
    for id in Table::read(&dir.join(&format!("data/train/batch_{i}.parquet"))).i64s("event_id") {
        if !seen.contains(&id) {
            seen.push(id);
        }
    }
    seen
}

/// Writes `out`: data file `from` whose first `n` events take the ids of `keys` (new rows for
/// keys the cache holds; the other events keep theirs). Returns the keys taken.
fn rekeyed(dir: &Dir, from: usize, keys: &[i64], n: usize, out: &str) -> Vec<i64> {
    let taken: BTreeMap<i64, i64> = event_ids(dir, from)
        .into_iter()
        .zip(keys.iter().copied())
        .take(n)
        .collect();
    let path = dir.join(out);
    std::fs::copy(dir.join(&format!("data/train/batch_{from}.parquet")), &path).unwrap();
    replace_column(&path, "event_id", |_, batch| {
        let ids = batch
            .column_by_name("event_id")
            .unwrap()
            .as_primitive::<Int64Type>();
        arc(Int64Array::from_iter_values(
            ids.values().iter().map(|id| *taken.get(id).unwrap_or(id)),
        ))
    });
    taken.into_values().collect()
}

/// Asserts that two `stats.json` agree where statistics can be taken apart exactly: per split
/// its contexts and rows, length histogram and truncations, and per column its counts, moments
/// (to rounding), histogram and vocabulary.
fn assert_same_figures(a: &serde_json::Value, b: &serde_json::Value) {
    let splits = |s: &serde_json::Value| s["splits"].as_array().unwrap().clone();
    assert_eq!(splits(a).len(), splits(b).len());
    for (x, y) in splits(a).iter().zip(splits(b).iter()) {
        let split = &x["split"];
        assert_eq!(split, &y["split"]);
        for key in ["contexts", "rows"] {
            assert_eq!(x[key], y[key], "{split} {key}");
        }
        for key in ["histogram", "truncated"] {
            assert_eq!(
                x["lengths"][key], y["lengths"][key],
                "{split} lengths {key}"
            );
        }
        let close = |p: &serde_json::Value, q: &serde_json::Value, what: &str| {
            let (p, q) = (p.as_f64().unwrap(), q.as_f64().unwrap());
            assert!(
                (p - q).abs() <= 1e-9 * (1.0 + p.abs().max(q.abs())),
                "{what}: {p} {q}"
            );
        };
        close(&x["lengths"]["mean"], &y["lengths"]["mean"], "lengths mean");
        let columns = |s: &serde_json::Value| s["columns"].as_array().unwrap().clone();
        for (c, d) in columns(x).iter().zip(columns(y).iter()) {
            let what = format!("{split} {}", c["name"]);
            for key in ["count", "nulls", "nan", "inf", "vocabulary"] {
                assert_eq!(c[key], d[key], "{what} {key}");
            }
            if c["numeric"].is_object() {
                close(
                    &c["numeric"]["mean"],
                    &d["numeric"]["mean"],
                    &format!("{what} mean"),
                );
                close(
                    &c["numeric"]["std"],
                    &d["numeric"]["std"],
                    &format!("{what} std"),
                );
                assert_eq!(
                    c["numeric"]["histogram"], d["numeric"]["histogram"],
                    "{what} histogram"
                );
            }
        }
    }
}

#[test]
fn an_append_that_replaces_keys_hides_their_old_contexts_and_reads_as_a_compile_without_them() {
    let dir = Dir::new();
    gen_icecube(&dir, 3, 100);
    let small = ["--shard-size", "64KiB"];
    compile_icecube(&dir, "data/train/batch_1.parquet", "cache", &small);
    let cache = dir.join("cache");
    let before = contexts(&cache, 1);
    // 30 events of file 2 under keys of file 1: refused by default, naming a key ...
    let replaced = rekeyed(&dir, 2, &event_ids(&dir, 1), 30, "data/new.parquet");
    let meta = ["--context", "data/train_meta.parquet"];
    let err = dsc(
        dir.path(),
        &["append", "cache", "data/new.parquet", meta[0], meta[1]],
    )
    .fails(2);
    assert!(
        err.contains("is already in the cache") && err.contains("--existing replace"),
        "{err}"
    );
    // ... and with --existing replace, stored whole and the old ones hidden.
    let said = append(
        &dir,
        "cache",
        "data/new.parquet",
        &[meta[0], meta[1], "--existing", "replace"],
    );
    assert!(said.contains("(replacing train"), "{said}");
    let second = generation(&cache, 2);
    let hidden: usize = second["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["removed"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(hidden, 30);
    let removed: u64 = second["splits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["removed"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(removed, 30);
    // Generation 2 holds each key once: the new contexts of the replaced keys, the rest of
    // file 1, and the new keys of file 2; generation 1 is as it was.
    let live = contexts(&cache, 2);
    assert_eq!(live.len(), 170);
    assert_same_contexts(&contexts(&cache, 1), &before);
    // They are the contexts of a compile, with the same encodings, of file 1 without the
    // replaced keys' rows and the new file.
    std::fs::create_dir(dir.join("both")).unwrap();
    let kept = dir.join("both/kept.parquet");
    std::fs::copy(dir.join("data/train/batch_1.parquet"), &kept).unwrap();
    std::fs::copy(dir.join("data/new.parquet"), dir.join("both/new.parquet")).unwrap();
    let ids = Table::read(&kept).i64s("event_id");
    filter_rows(&kept, |row| !replaced.contains(&ids[row]));
    let mut args = vec!["--fit-from", "cache"];
    args.extend_from_slice(&small);
    compile_icecube(&dir, "both/*.parquet", "all", &args);
    assert_same_contexts(&live, &contexts(&dir.join("all"), 1));
    for key in &replaced {
        assert_ne!(
            live[key].tensors["x"], before[key].tensors["x"],
            "key {key}"
        );
    }
    dsc(dir.path(), &["verify", "cache"]).ok();
    // An epoch reads each live context once; a key is shown as its new context.
    let keys = dsc(
        dir.path(),
        &["order", "cache", "--batch-size", "1", "--keys"],
    )
    .ok();
    let mut read: Vec<i64> = keys
        .split_whitespace()
        .map(|k| k.parse().unwrap())
        .collect();
    read.sort_unstable();
    let train: Vec<i64> = live
        .iter()
        .filter(|(_, s)| s.split == "train")
        .map(|(k, _)| *k)
        .collect();
    assert_eq!(read, train);
    let key = replaced[0].to_string();
    let shown = dsc(dir.path(), &["show", "cache", "--key", &key, "--json"]).ok();
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    let old_index = dsc(
        dir.path(),
        &[
            "show",
            "cache",
            "--key",
            &key,
            "--generation",
            "1",
            "--json",
        ],
    )
    .ok();
    let old_index: serde_json::Value = serde_json::from_str(&old_index).unwrap();
    assert_ne!(shown["index"], old_index["index"]);
    let split = shown["split"].as_str().unwrap();
    let index = old_index["index"].to_string();
    let err = dsc(
        dir.path(),
        &["show", "cache", "--split", split, "--index", &index],
    )
    .fails(2);
    assert!(err.contains("hides that context"), "{err}");
    let log: serde_json::Value =
        serde_json::from_str(&dsc(dir.path(), &["log", "cache", "--json"]).ok()).unwrap();
    let removed: u64 = log[1]["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s[1].as_u64().unwrap())
        .sum();
    assert_eq!(removed, 30);
    // Its statistics are the live contexts': the hidden ones' own, read back from the first
    // file for those keys, are taken out; counts, moments, histograms and vocabularies equal
    // those of the compile of the live data (extremes and quantiles are not compared: they
    // stay bounds).
    let read = |p: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let stats = read(&folder(&cache, 2).join("stats.json"));
    assert!(stats.get("includes_hidden").is_none(), "{stats}");
    assert_same_figures(&stats, &read(&dir.join("all/stats.json")));
    // A key replaced again hides its second context too; a state taken on generation 2
    // resumes there with the uninterrupted batches.
    let order = ["order", "cache", "--batch-size", "8", "--epoch", "1"];
    let uninterrupted = dsc(dir.path(), &[&order[..], &["--keys"]].concat()).ok();
    let state = dsc(dir.path(), &[&order[..], &["--state-after", "2"]].concat()).ok();
    std::fs::write(dir.join("state.json"), &state).unwrap();
    let again = rekeyed(&dir, 3, &replaced, 10, "data/again.parquet");
    append(
        &dir,
        "cache",
        "data/again.parquet",
        &[meta[0], meta[1], "--existing", "replace"],
    );
    let third = contexts(&cache, 3);
    assert_eq!(third.len(), 170 + 90);
    for key in &again {
        assert_ne!(third[key].tensors["x"], live[key].tensors["x"], "key {key}");
    }
    dsc(dir.path(), &["verify", "cache"]).ok();
    let resumed = dsc(
        dir.path(),
        &[
            "order",
            "cache",
            "--batch-size",
            "8",
            "--from-state",
            "state.json",
            "--keys",
        ],
    )
    .ok();
    let rest: Vec<&str> = uninterrupted.lines().skip(2).collect();
    assert_eq!(resumed.lines().collect::<Vec<_>>(), rest);
    // A compaction leaves out the rows of replaced keys' earlier contexts: its shards are
    // byte for byte those of a compile of the files without those rows.
    dsc(dir.path(), &["compact", "cache"]).ok();
    let compacted = generation(&cache, 4);
    assert!(compacted["splits"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s.get("removed").is_none()));
    std::fs::create_dir(dir.join("live")).unwrap();
    for (from, to) in [
        ("both/kept.parquet", "live/1.parquet"),
        ("data/new.parquet", "live/2.parquet"),
        ("data/again.parquet", "live/3.parquet"),
    ] {
        std::fs::copy(dir.join(from), dir.join(to)).unwrap();
    }
    let ids = Table::read(&dir.join("live/2.parquet")).i64s("event_id");
    filter_rows(&dir.join("live/2.parquet"), |row| {
        !again.contains(&ids[row])
    });
    compile_icecube(&dir, "live/*.parquet", "fresh", &args);
    assert_same_contexts(&contexts(&cache, 4), &third);
    let theirs = tree(&dir.join("fresh"));
    assert_same_shards(&theirs, &folder(&cache, 4), "");
    assert_eq!(
        std::fs::read(folder(&cache, 4).join("stats.json")).unwrap(),
        theirs["stats.json"]
    );
    // A later compaction reads the same files and leaves out the same rows.
    dsc(dir.path(), &["compact", "cache"]).ok();
    assert_same_shards(&theirs, &folder(&cache, 5), "after a second compaction");
    // Where the hidden contexts' inputs are gone, their statistics cannot be read back: the
    // figures keep counting them, and say how many.
    std::fs::remove_file(dir.join("data/again.parquet")).unwrap();
    rekeyed(&dir, 3, &again, 5, "data/last.parquet");
    append(
        &dir,
        "cache",
        "data/last.parquet",
        &[meta[0], meta[1], "--existing", "replace"],
    );
    let hidden: u64 = generation(&cache, 6)["generation"]["removed"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert!(hidden > 0);
    let stats = read(&folder(&cache, 6).join("stats.json"));
    assert_eq!(stats["includes_hidden"]["all"], hidden, "{stats}");
    dsc(dir.path(), &["verify", "cache"]).ok();
}

#[test]
fn a_state_resumes_with_the_uninterrupted_batches_after_an_append() {
    let dir = first_generation(2, 200, &["--shard-size", "64KiB"]);
    let order = ["order", "cache", "--batch-size", "16", "--epoch", "1"];
    let uninterrupted = dsc(dir.path(), &[&order[..], &["--keys"]].concat()).ok();
    let state = dsc(dir.path(), &[&order[..], &["--state-after", "3"]].concat()).ok();
    std::fs::write(dir.join("state.json"), &state).unwrap();
    let id = generation(&dir.join("cache"), 1);
    assert!(state.contains("content_id"), "{state}");
    append_file(&dir, 2);
    // The last generation orders more contexts; the state still reads the one it was taken on.
    let latest = dsc(dir.path(), &[&order[..], &["--keys"]].concat()).ok();
    assert_ne!(latest, uninterrupted);
    let resumed = dsc(
        dir.path(),
        &[
            "order",
            "cache",
            "--batch-size",
            "16",
            "--from-state",
            "state.json",
            "--keys",
        ],
    )
    .ok();
    let rest: Vec<&str> = uninterrupted.lines().skip(3).collect();
    assert_eq!(resumed.lines().collect::<Vec<_>>(), rest);
    assert!(!id["shards"].as_array().unwrap().is_empty());
    // A state naming data no generation holds is refused, naming it.
    std::fs::write(
        dir.join("other.json"),
        state.replace(
            &format!("\"{}\"", json_field(&state, "content_id")),
            "\"00000000deadbeef\"",
        ),
    )
    .unwrap();
    let err = dsc(
        dir.path(),
        &[
            "order",
            "cache",
            "--batch-size",
            "16",
            "--from-state",
            "other.json",
        ],
    )
    .fails(2);
    assert!(
        err.contains("taken over other data (content id 00000000deadbeef"),
        "{err}"
    );
}

fn json_field(text: &str, field: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    v[field].as_str().unwrap().to_string()
}

#[test]
fn refused_appends_change_nothing() {
    let dir = first_generation(2, 100, &[]);
    let before = tree(&dir.join("cache"));
    let meta = ["--context", "data/train_meta.parquet"];
    // A key the cache holds: named, with the shard and generation that hold it.
    let err = dsc(
        dir.path(),
        &[
            "append",
            "cache",
            "data/train/batch_1.parquet",
            meta[0],
            meta[1],
        ],
    )
    .fails(2);
    assert!(
        err.contains("is already in the cache: shards/") && err.contains("(generation 1)"),
        "{err}"
    );
    // The cache has a context table: an append without one is refused, naming it.
    let err = dsc(
        dir.path(),
        &["append", "cache", "data/train/batch_2.parquet"],
    )
    .fails(2);
    assert!(
        err.contains("context") && err.contains("train_meta.parquet"),
        "{err}"
    );
    // A join on another column than the cache's.
    let err = dsc(
        dir.path(),
        &[
            "append",
            "cache",
            "data/train/batch_2.parquet",
            meta[0],
            meta[1],
            "--join",
            "data/sensor_geometry.csv",
            "--on",
            "x",
        ],
    )
    .fails(2);
    assert!(err.contains("joins on [\"sensor_id\"]"), "{err}");
    // A flag of the spec saying other than the cache's: named, with the cache's value.
    let err = dsc(
        dir.path(),
        &[
            "append",
            "cache",
            "data/train/batch_2.parquet",
            meta[0],
            meta[1],
            "--seed",
            "7",
        ],
    )
    .fails(2);
    assert!(err.contains("--seed 7: the cache has seed = 42"), "{err}");
    assert_eq!(
        tree(&dir.join("cache")),
        before,
        "nothing of the cache changed"
    );
    // The cache's own value is no change.
    let said = dsc(
        dir.path(),
        &[
            "append",
            "cache",
            "data/train/batch_2.parquet",
            meta[0],
            meta[1],
            "--seed",
            "42",
        ],
    )
    .ok();
    assert!(said.contains("generation 2"), "{said}");
}

#[test]
fn an_append_killed_at_any_step_leaves_the_last_generation_and_the_next_one_succeeds() {
    let dir = first_generation(3, 100, &[]);
    let meta = ["--context", "data/train_meta.parquet"];
    for point in [
        "append:shards-written",
        "append:stats-written",
        "append:moved",
        "append:manifest-written",
        "append:linked",
    ] {
        let committed = point == "append:linked";
        let before = tree(&dir.join("cache"));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
            .args([
                "append",
                "cache",
                "data/train/batch_2.parquet",
                meta[0],
                meta[1],
            ])
            .env("DSC_FAILPOINT", point)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{point}: the append was not stopped");
        let log: serde_json::Value =
            serde_json::from_str(&dsc(dir.path(), &["log", "cache", "--json"]).ok()).unwrap();
        assert_eq!(
            log.as_array().unwrap().len(),
            if committed { 2 } else { 1 },
            "{point}"
        );
        dsc(dir.path(), &["verify", "cache"]).ok();
        if committed {
            continue;
        }
        // Every file of the first generation is as it was.
        let now = tree(&dir.join("cache"));
        for (name, bytes) in before.iter().filter(|(n, _)| !n.starts_with("generations")) {
            assert_eq!(now.get(name), Some(bytes), "{point}: {name}");
        }
        // What was left is no obstacle: the next append commits generation 2 ...
        let said = append(&dir, "cache", "data/train/batch_3.parquet", &meta);
        assert!(said.contains("generation 2"), "{point}: {said}");
        dsc(dir.path(), &["verify", "cache"]).ok();
        // ... which is taken back (a test's shortcut) for the next point.
        std::fs::remove_file(dir.join("cache/generations/00002.json")).unwrap();
    }
}

#[test]
fn two_appends_at_once_both_commit_one_after_the_other() {
    let dir = first_generation(3, 150, &[]);
    let spawn = |rows: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
            .args([
                "append",
                "cache",
                rows,
                "--context",
                "data/train_meta.parquet",
                "--json",
            ])
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| spawn("data/train/batch_2.parquet"));
        let b = s.spawn(|| spawn("data/train/batch_3.parquet"));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    let numbers: Vec<u64> = [&a, &b]
        .iter()
        .map(|o| {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            v["generation"].as_u64().unwrap()
        })
        .collect();
    let mut sorted = numbers.clone();
    sorted.sort();
    assert_eq!(sorted, [2, 3], "one appended on top of the other");
    let third = contexts(&dir.join("cache"), 3);
    assert_eq!(third.len(), 450, "no append lost");
    dsc(dir.path(), &["verify", "cache"]).ok();
}

#[test]
fn a_reader_under_a_looping_appender_keeps_its_generation() {
    let dir = first_generation(5, 80, &["--shard-size", "32KiB"]);
    let cache = dsc_loader::Cache::open(dir.join("cache")).unwrap();
    let opts = || dsc_loader::LoaderOptions {
        batch_size: 8,
        ..Default::default()
    };
    let before = crate::util::epoch_of(&cache, opts());
    std::thread::scope(|s| {
        let appender = s.spawn(|| {
            for f in 2..=5 {
                append(
                    &dir,
                    "cache",
                    &format!("data/train/batch_{f}.parquet"),
                    &["--context", "data/train_meta.parquet"],
                );
            }
        });
        // Epochs read while generations commit: the same batches every time.
        while !appender.is_finished() {
            assert_eq!(crate::util::epoch_of(&cache, opts()), before);
        }
    });
    assert_eq!(crate::util::epoch_of(&cache, opts()), before);
    let reopened = dsc_loader::Cache::open(dir.join("cache")).unwrap();
    assert_eq!(reopened.manifest().generation_number(), 5);
}

#[test]
fn compaction_writes_the_shards_of_the_fit_from_compile_of_all_inputs_byte_for_byte() {
    let dir = Dir::new();
    gen_icecube(&dir, 5, 120);
    let small = ["--shard-size", "96KiB"];
    compile_icecube(&dir, "data/train/batch_[12].parquet", "cache", &small);
    let meta = ["--context", "data/train_meta.parquet"];
    append(&dir, "cache", "data/train/batch_3.parquet", &meta);
    append(&dir, "cache", "data/train/batch_4.parquet", &meta);
    let said = dsc(dir.path(), &["compact", "cache"]).ok();
    assert!(said.contains("generation 4"), "{said}");
    let mut args = vec!["--fit-from", "cache"];
    args.extend_from_slice(&small);
    compile_icecube(&dir, "data/train/batch_[1234].parquet", "all", &args);
    let cache = dir.join("cache");
    let compacted = generation(&cache, 4);
    assert_eq!(compacted["generation"]["kind"], "compact");
    let whole = generation(&dir.join("all"), 1);
    // The same shards, entry for entry (their files in the generation's folder) ...
    let strip = |m: &serde_json::Value| -> Vec<serde_json::Value> {
        m["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let mut s = s.clone();
                s.as_object_mut().unwrap().remove("generation");
                s["file"] = s["file"]
                    .as_str()
                    .unwrap()
                    .trim_start_matches(&format!(
                        "{}/",
                        compacted["generation"]["folder"].as_str().unwrap()
                    ))
                    .into();
                s
            })
            .collect()
    };
    assert_eq!(strip(&compacted), strip(&whole));
    // ... byte for byte, and the statistics of the one compile.
    let theirs = tree(&dir.join("all"));
    assert_same_shards(&theirs, &folder(&cache, 4), "");
    assert_eq!(
        std::fs::read(folder(&cache, 4).join("stats.json")).unwrap(),
        theirs["stats.json"]
    );
    dsc(dir.path(), &["verify", "cache"]).ok();
    // An input changed since the cache read it would compile other contexts: refused.
    let four = dir.join("data/train/batch_4.parquet");
    let kept = std::fs::read(&four).unwrap();
    std::fs::copy(dir.join("data/train/batch_5.parquet"), &four).unwrap();
    let err = dsc(dir.path(), &["compact", "cache"]).fails(2);
    assert!(
        err.contains("batch_4.parquet changed since the cache read it"),
        "{err}"
    );
    std::fs::write(&four, kept).unwrap();
    // An append continues the compacted generation's shards.
    append(&dir, "cache", "data/train/batch_5.parquet", &meta);
    dsc(dir.path(), &["verify", "cache"]).ok();
    let fifth = generation(&cache, 5);
    let contexts = |m: &serde_json::Value| m["summary"]["contexts"].as_u64().unwrap();
    assert_eq!(contexts(&fifth), contexts(&whole) + 120);
}

#[test]
fn tags_name_generations_and_gc_removes_what_no_kept_generation_needs() {
    let dir = first_generation(3, 100, &[]);
    let meta = ["--context", "data/train_meta.parquet"];
    append(&dir, "cache", "data/train/batch_2.parquet", &meta);
    dsc(dir.path(), &["tag", "cache", "before-3"]).ok();
    append(&dir, "cache", "data/train/batch_3.parquet", &meta);
    let inspect = |at: &str| -> serde_json::Value {
        serde_json::from_str(
            &dsc(
                dir.path(),
                &["inspect", "cache", "--generation", at, "--json"],
            )
            .ok(),
        )
        .unwrap()
    };
    assert_eq!(inspect("before-3")["generation"], 2);
    let err = dsc(dir.path(), &["tag", "cache", "before-3", "3"]).fails(2);
    assert!(err.contains("already names generation 2"), "{err}");
    let err = dsc(dir.path(), &["tag", "cache", "Bad/Name"]).fails(2);
    assert!(err.contains("tag"), "{err}");
    // What a killed append leaves is garbage too.
    std::fs::create_dir_all(dir.join("cache/generations/.00004.dsc-partial/shards")).unwrap();
    std::fs::write(
        dir.join("cache/generations/.00004.dsc-partial/shards/x"),
        b"half",
    )
    .unwrap();
    dsc(dir.path(), &["compact", "cache"]).ok();
    let dry: serde_json::Value =
        serde_json::from_str(&dsc(dir.path(), &["gc", "cache", "--dry-run", "--json"]).ok())
            .unwrap();
    assert_eq!(dry["kept"], serde_json::json!([1, 2, 4]));
    assert_eq!(dry["removed"], serde_json::json!([3]));
    assert!(
        dir.join("cache/generations/00003.json").exists(),
        "a dry run removes nothing"
    );
    let before = inspect("4");
    let third = folder(&dir.join("cache"), 3);
    let r: serde_json::Value =
        serde_json::from_str(&dsc(dir.path(), &["gc", "cache", "--json"]).ok()).unwrap();
    assert_eq!(r["removed"], serde_json::json!([3]));
    assert!(!dir.join("cache/generations/.00004.dsc-partial").exists());
    // Generation 3's own shards are gone; generation 2's stay (the tag keeps it), and every
    // kept generation reads and verifies whole.
    assert!(!third.exists(), "{}", third.display());
    for at in ["1", "before-3", "4"] {
        dsc(dir.path(), &["verify", "cache", "--generation", at]).ok();
    }
    assert_eq!(inspect("4")["content_id"], before["content_id"]);
    let err = dsc(dir.path(), &["inspect", "cache", "--generation", "3"]).fails(2);
    assert!(err.contains("generations 1, 2, 4"), "{err}");
}

#[test]
fn a_lineage_in_object_storage_reads_as_it_does_locally() {
    let dir = first_generation(2, 100, &["--shard-size", "48KiB"]);
    append_file(&dir, 2);
    let server = crate::util::S3Server::start();
    let url = format!("{}/grown", server.bucket("caches"));
    let remote = dsc_store::Remote::open_with(&url, &server.options()).unwrap();
    dsc_store::upload_cache(&dir.join("cache"), &remote, false, |_, _| {}).unwrap();
    let opts = |at: dsc_format::GenerationRef| dsc_loader::RemoteOptions {
        dir: dir.join("fetched"),
        limit: None,
        fetch_threads: 2,
        store: server.options(),
        generation: at,
    };
    let loader = || dsc_loader::LoaderOptions {
        batch_size: 8,
        ..Default::default()
    };
    for at in [
        dsc_format::GenerationRef::Number(1),
        dsc_format::GenerationRef::Latest,
    ] {
        let there = dsc_loader::Cache::open_remote(&url, &opts(at.clone())).unwrap();
        let here = dsc_loader::Cache::open_with(dir.join("cache"), &opts(at.clone())).unwrap();
        assert_eq!(there.manifest(), here.manifest());
        assert_eq!(
            crate::util::epoch_of(&there, loader()),
            crate::util::epoch_of(&here, loader())
        );
        // The last generation's folder takes the first's shards from the folder its reader
        // filled: only the shards the append added are fetched.
        let new: u64 = there
            .manifest()
            .shards()
            .iter()
            .filter(|s| s.split == "train" && s.generation.is_some())
            .count() as u64;
        let fetched = there.shard_stats().shards_fetched;
        match at {
            dsc_format::GenerationRef::Latest => assert_eq!(fetched, new, "only the new shards"),
            _ => assert!(fetched > 0),
        }
    }
    // The CLI too, with the store's settings from the environment.
    let mut verify = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"));
    verify
        .args(["verify", &url, "--generation", "1", "--cache-dir"])
        .arg(dir.join("fetched-cli"));
    for (k, v) in server.env() {
        verify.env(k, v);
    }
    let out = verify.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `dsc` with the test S3 server's settings in the environment and a fetch folder of the
/// test's own.
fn dsc_s3(
    dir: &Dir,
    server: &crate::util::S3Server,
    args: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"));
    cmd.args(args).current_dir(dir.path());
    cmd.env("DSC_CACHE_DIR", dir.join("dsc-cache"));
    for (k, v) in server.env() {
        cmd.env(k, v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn appends_to_a_cache_in_object_storage_commit_once_each() {
    let dir = first_generation(4, 100, &["--shard-size", "48KiB"]);
    let server = crate::util::S3Server::start();
    let url = format!("{}/daily", server.bucket("caches"));
    let remote = dsc_store::Remote::open_with(&url, &server.options()).unwrap();
    dsc_store::upload_cache(&dir.join("cache"), &remote, false, |_, _| {}).unwrap();
    let meta = ["--context", "data/train_meta.parquet"];
    let ok = |out: std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let said = ok(dsc_s3(
        &dir,
        &server,
        &[
            "append",
            &url,
            "data/train/batch_2.parquet",
            meta[0],
            meta[1],
        ],
        &[],
    ));
    assert!(said.contains("generation 2"), "{said}");
    // The same append to a local copy commits the same generation, file for file.
    append_file(&dir, 2);
    let published: serde_json::Value =
        serde_json::from_slice(&remote.get("generations/00002.json").unwrap()).unwrap();
    assert_eq!(published, generation(&dir.join("cache"), 2));
    ok(dsc_s3(&dir, &server, &["verify", &url], &[]));
    // Two writers race for generation 3: one is held before its commit while the other
    // commits; the held one is then refused, and nothing of it is read.
    let flag = dir.join("go");
    let pause = format!("append:uploaded:{}", flag.display());
    let mut held = {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"));
        cmd.args([
            "append",
            &url,
            "data/train/batch_4.parquet",
            meta[0],
            meta[1],
        ])
        .current_dir(dir.path())
        .env("DSC_CACHE_DIR", dir.join("dsc-cache-b"))
        .env("DSC_PAUSE", &pause);
        for (k, v) in server.env() {
            cmd.env(k, v);
        }
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let paused = dir.join("go.paused");
    let start = std::time::Instant::now();
    while !paused.exists() {
        if held.try_wait().unwrap().is_some() || start.elapsed().as_secs() > 60 {
            let _ = held.kill();
            let out = held.wait_with_output().unwrap();
            panic!(
                "the held append never reached its commit: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    ok(dsc_s3(
        &dir,
        &server,
        &[
            "append",
            &url,
            "data/train/batch_3.parquet",
            meta[0],
            meta[1],
        ],
        &[],
    ));
    std::fs::write(&flag, b"").unwrap();
    let lost = held.wait_with_output().unwrap();
    assert!(!lost.status.success());
    let err = String::from_utf8_lossy(&lost.stderr);
    assert!(
        err.contains("generation 3 was committed by another writer"),
        "{err}"
    );
    ok(dsc_s3(&dir, &server, &["verify", &url], &[]));
    let third: serde_json::Value =
        serde_json::from_slice(&remote.get("generations/00003.json").unwrap()).unwrap();
    let inputs = third["generation"]["inputs"]["files"].to_string();
    assert!(
        inputs.contains("batch_3") && !inputs.contains("batch_4"),
        "{inputs}"
    );
    // Run again, it appends on top of the winner.
    let said = ok(dsc_s3(
        &dir,
        &server,
        &[
            "append",
            &url,
            "data/train/batch_4.parquet",
            meta[0],
            meta[1],
        ],
        &[],
    ));
    assert!(said.contains("generation 4"), "{said}");
    let log = ok(dsc_s3(&dir, &server, &["inspect", &url, "--json"], &[]));
    let log: serde_json::Value = serde_json::from_str(&log).unwrap();
    assert_eq!(log["generation"], 4);
    assert_eq!(log["contexts"], 400);
    // A file again, replacing the keys it holds: the remote parent's keys are read by ranged
    // requests, and a reader of the store sees each key once.
    let said = ok(dsc_s3(
        &dir,
        &server,
        &[
            "append",
            &url,
            "data/train/batch_3.parquet",
            meta[0],
            meta[1],
            "--existing",
            "replace",
        ],
        &[],
    ));
    assert!(
        said.contains("generation 5") && said.contains("replacing"),
        "{said}"
    );
    let log = ok(dsc_s3(&dir, &server, &["inspect", &url, "--json"], &[]));
    let log: serde_json::Value = serde_json::from_str(&log).unwrap();
    assert_eq!(
        (&log["contexts"], &log["hidden"]),
        (&400.into(), &100.into())
    );
    ok(dsc_s3(&dir, &server, &["verify", &url], &[]));
    let keys = ok(dsc_s3(
        &dir,
        &server,
        &["order", &url, "--batch-size", "1", "--keys"],
        &[],
    ));
    let mut read: Vec<&str> = keys.split_whitespace().collect();
    let all = read.len();
    read.sort_unstable();
    read.dedup();
    assert_eq!(read.len(), all, "a key read twice");
    assert_eq!(all as u64, log["splits"][0]["contexts"].as_u64().unwrap());
}
