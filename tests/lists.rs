//! Sequences stored as list columns (issue 41, item 2): a table with one row per context whose
//! sequence columns are lists compiles to the bytes of its exploded table with the row's own
//! columns as the context table, and lists that cannot be exploded are refused by file, row and
//! column.

use crate::util::*;
use arrow_array::builder::{Float64Builder, ListBuilder};
use arrow_array::{Float64Array, Int64Array, StringArray};

/// `dsc gen sequences` of one layout and key type into `out`: 400 customers over 3 files.
fn gen(dir: &Dir, out: &str, layout: &str, keys: &str) {
    gen_sequences_as(
        dir,
        out,
        (400, 5),
        &["--layout", layout, "--key-type", keys],
    );
}

/// Every step column, a log1p-zscore chain, categorical lists of strings, a list of strings
/// encoded per step, and the row's own columns as targets, a context feature and a string of
/// the context.
const FLAGS: &[&str] = &[
    "--key",
    "customer_id",
    "--features",
    "amount,items,discount,is_refund",
    "--categorical",
    "merchant_category",
    "--encode",
    "amount=log1p,zscore",
    "--encode",
    "channel=chars:5",
    "--encode",
    "segment=ngrams:2",
    "--nan",
    "mean",
    "--targets",
    "lifetime_value,churned",
    "--context-features",
    "tenure_years",
    "--empty-contexts",
    "keep",
    "--val-fraction",
    "0.2",
    "--shard-size",
    "32KiB",
];

fn compile(dir: &Dir, rows: &str, out: &str, extra: &[&str]) {
    let mut a = vec!["compile", rows];
    a.extend_from_slice(FLAGS);
    a.extend_from_slice(extra);
    a.extend_from_slice(&["--out", out, "-q"]);
    dsc(dir.path(), &a).ok();
}

/// The shards and statistics of a cache (its manifest records the spec and inputs, which
/// differ between the layouts).
fn data_files(dir: &Dir, cache: &str) -> std::collections::BTreeMap<String, Vec<u8>> {
    tree(&dir.join(cache))
        .into_iter()
        .filter(|(name, _)| name != "manifest.json")
        .collect()
}

fn assert_same_data(dir: &Dir, a: &str, b: &str) {
    let (ta, tb) = (data_files(dir, a), data_files(dir, b));
    assert_eq!(
        ta.keys().collect::<Vec<_>>(),
        tb.keys().collect::<Vec<_>>(),
        "{a} and {b}"
    );
    assert!(ta.len() > 6, "several shards: {:?}", ta.keys());
    for (name, bytes) in &ta {
        assert!(*bytes == tb[name], "{a}/{name} differs from {b}/{name}");
    }
}

#[test]
fn a_list_table_compiles_to_the_bytes_of_its_exploded_table() {
    let dir = Dir::new();
    for keys in ["int", "string"] {
        let (lists, exploded) = (format!("lists-{keys}"), format!("exploded-{keys}"));
        gen(&dir, &lists, "lists", keys);
        gen(&dir, &exploded, "exploded", keys);
        let context = format!("{exploded}/customers.parquet");
        for (order, extra) in [("list-order", vec![]), ("by-ts", vec!["--order-by", "ts"])] {
            let (a, b) = (format!("{keys}-{order}-l"), format!("{keys}-{order}-e"));
            compile(&dir, &format!("{lists}/lists"), &a, &extra);
            let mut with_context = extra.clone();
            with_context.extend_from_slice(&["--context", &context]);
            compile(&dir, &format!("{exploded}/transactions"), &b, &with_context);
            assert_same_data(&dir, &a, &b);
        }
    }
    // Partitions and a small memory budget give the same bytes too.
    compile(
        &dir,
        "lists-int/lists",
        "spilled",
        &["--bucket-size", "16KiB", "--max-memory", "1MiB"],
    );
    for stage in ["scan", "fit", "write"] {
        for p in ["0/2", "1/2"] {
            compile(
                &dir,
                "lists-int/lists",
                "parted",
                &["--bucket-size", "16KiB", "--partition", p, "--stage", stage],
            );
        }
    }
    dsc(dir.path(), &["merge", "parted", "-q"]).ok();
    assert_eq!(tree(&dir.join("spilled")), tree(&dir.join("parted")));
    // The cache reads back as the lists: one context per row, its steps the list elements.
    let shown = dsc(
        dir.path(),
        &["show", "int-list-order-l", "--index", "0", "--json"],
    )
    .ok();
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    let key = shown["key"].as_i64().unwrap();
    let lists = Table::read(&dir.join("lists-int/lists/part-000.parquet"));
    let ids = lists.i64s("customer_id");
    if let Some(row) = ids.iter().position(|&k| k == key) {
        let items = lists.batches[0]
            .column_by_name("items")
            .unwrap()
            .as_any()
            .downcast_ref::<arrow_array::ListArray>()
            .unwrap()
            .value(row);
        assert_eq!(shown["length"].as_u64().unwrap() as usize, items.len());
    }
}

/// A two-row list table: `id`, `x` and `t` lists, `y` one value per row.
fn write_events(dir: &Dir, x: &[Option<Vec<Option<f64>>>], t: &[Vec<f64>]) {
    let list = |rows: Vec<Option<Vec<Option<f64>>>>| {
        let mut b = ListBuilder::new(Float64Builder::new());
        for row in rows {
            match row {
                Some(v) => {
                    for e in v {
                        b.values().append_option(e);
                    }
                    b.append(true);
                }
                None => b.append(false),
            }
        }
        arc(b.finish())
    };
    let n = x.len() as i64;
    write_parquet(
        &dir.join("events.parquet"),
        vec![
            ("id", arc(Int64Array::from((0..n).collect::<Vec<_>>()))),
            ("x", list(x.to_vec())),
            (
                "t",
                list(
                    t.iter()
                        .map(|v| Some(v.iter().map(|&e| Some(e)).collect()))
                        .collect(),
                ),
            ),
            (
                "y",
                arc(Float64Array::from(
                    (0..n).map(|i| i as f64).collect::<Vec<_>>(),
                )),
            ),
            ("name", arc(StringArray::from(vec!["a"; n as usize]))),
        ],
    );
}

#[test]
fn lists_that_cannot_be_exploded_are_refused_by_file_row_and_column() {
    let dir = Dir::new();
    let run = |args: &[&str]| -> String {
        let mut a = vec!["compile", "events.parquet", "--key", "id"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["--out", "c"]);
        dsc(dir.path(), &a).fails(2)
    };
    // Row 1's lists differ in length.
    write_events(
        &dir,
        &[
            Some(vec![Some(1.0), Some(2.0)]),
            Some(vec![Some(3.0)]),
            Some(vec![Some(4.0)]),
        ],
        &[vec![0.1, 0.2], vec![0.3, 0.4], vec![0.5]],
    );
    let err = run(&["--features", "x,t", "--targets", "y"]);
    assert!(
        err.contains("events.parquet: row 1: the lists of columns x and t differ in length (x has 1, t has 2)"),
        "{err}"
    );
    // A null inside a list follows --nan, named by its row; a null list is an empty one.
    write_events(
        &dir,
        &[Some(vec![Some(1.0), None]), None, Some(vec![Some(4.0)])],
        &[vec![0.1, 0.2], vec![], vec![0.5]],
    );
    let err = run(&[
        "--features",
        "x,t",
        "--targets",
        "y",
        "--empty-contexts",
        "drop",
    ]);
    assert!(
        err.contains("events.parquet") && err.contains("\"x\" row 0: null"),
        "{err}"
    );
    dsc(
        dir.path(),
        &[
            "compile",
            "events.parquet",
            "--key",
            "id",
            "--features",
            "x,t",
            "--targets",
            "y",
            "--nan",
            "zero",
            "--empty-contexts",
            "drop",
            "--out",
            "ok",
        ],
    )
    .ok();
    assert_eq!(manifest(&dir.join("ok"))["splits"][0]["contexts"], 2);
    // Without --empty-contexts, the row whose lists are empty (or null) is named.
    let err = run(&["--features", "x,t", "--targets", "y", "--nan", "zero"]);
    assert!(
        err.contains("key 1 (row 1) holds only empty lists"),
        "{err}"
    );
    // A list where one value per context is wanted, and a list key.
    let err = run(&["--features", "x", "--targets", "t"]);
    assert!(err.contains("column \"t\" is list<double>, but as a numeric feature or target it must be one value per row"), "{err}");
    let err = dsc(
        dir.path(),
        &[
            "compile",
            "events.parquet",
            "--key",
            "x",
            "--features",
            "t",
            "--out",
            "c",
        ],
    )
    .fails(2);
    assert!(
        err.contains("column \"x\" is list<double>, but as the key"),
        "{err}"
    );
    // Without a key, a list table has no rows to group.
    let err = dsc(
        dir.path(),
        &["compile", "events.parquet", "--features", "x", "--out", "c"],
    )
    .fails(2);
    assert!(
        err.contains("--key is needed: the rows hold their sequences as list columns"),
        "{err}"
    );
}
