//! Bad input: each case is one clear line naming the file, column or row, exit code 2, and no
//! cache (nor a staging directory) left behind.

use crate::util::*;
use arrow_array::{Float64Array, Int64Array, RecordBatch};

fn data() -> Dir {
    let dir = Dir::new();
    gen_icecube(&dir, 2, 60);
    dir
}

/// Runs the README compile with `extra` flags (or replaced rows pattern) and checks the failure.
fn fails_cleanly(dir: &Dir, args: &[&str], needles: &[&str]) {
    let err = dsc(dir.path(), args).fails(2);
    assert_eq!(err.trim().lines().count(), 1, "one line:\n{err}");
    assert!(err.starts_with("dsc: "), "{err}");
    for n in needles {
        assert!(err.contains(n), "missing {n:?} in: {err}");
    }
    for left in ["cache", ".cache.dsc-partial"] {
        assert!(
            !dir.join(left).exists(),
            "{left} was left behind after: {err}"
        );
    }
}

/// The README compile with `flag` set to `value` instead of its usual value.
fn with_flag<'a>(flag: &'a str, value: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = icecube_args("cache", extra);
    match args.iter().position(|a| *a == flag) {
        Some(i) => args[i + 1] = value,
        None => args.extend([flag, value]),
    }
    args
}

fn with_rows<'a>(rows: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = icecube_args("cache", extra);
    args[1] = rows;
    args
}

#[test]
fn missing_files() {
    let dir = data();
    fails_cleanly(
        &dir,
        &with_rows("data/nope/*.parquet", &[]),
        &["data/nope/*.parquet: no such file"],
    );
    fails_cleanly(
        &dir,
        &with_rows("data/train/batch_9.parquet", &[]),
        &["batch_9.parquet", "no such file"],
    );
    let mut args = icecube_args("cache", &[]);
    let ctx = args
        .iter()
        .position(|a| *a == "data/train_meta.parquet")
        .unwrap();
    args[ctx] = "data/meta.parquet";
    fails_cleanly(&dir, &args, &["data/meta.parquet"]);
}

#[test]
fn a_file_that_is_not_parquet() {
    let dir = data();
    std::fs::write(
        dir.join("data/train/batch_3.parquet"),
        "event_id,time\n1,2\n",
    )
    .unwrap();
    fails_cleanly(
        &dir,
        &icecube_args("cache", &[]),
        &["batch_3.parquet: not a readable Parquet file"],
    );
}

#[test]
fn a_truncated_parquet_file() {
    let dir = data();
    let path = dir.join("data/train/batch_2.parquet");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    fails_cleanly(
        &dir,
        &icecube_args("cache", &[]),
        &["batch_2.parquet: not a readable Parquet file"],
    );
}

#[test]
fn empty_rows_files() {
    let dir = data();
    std::fs::write(dir.join("data/train/batch_3.parquet"), "").unwrap();
    fails_cleanly(
        &dir,
        &icecube_args("cache", &[]),
        &["batch_3.parquet", "empty (0 bytes)"],
    );
    let empty =
        RecordBatch::try_from_iter([("event_id", arc(Int64Array::from(Vec::<i64>::new())))])
            .unwrap();
    write_parquet(
        &dir.join("data/train/batch_3.parquet"),
        vec![("event_id", empty.column(0).clone())],
    );
    fails_cleanly(
        &dir,
        &icecube_args("cache", &[]),
        &["batch_3.parquet: the file holds no rows"],
    );
}

#[test]
fn a_missing_column() {
    let dir = data();
    let mut args = icecube_args("cache", &[]);
    let f = args.iter().position(|a| a.starts_with("x,y,z")).unwrap();
    args[f] = "x,y,z,time,charge,energy";
    fails_cleanly(
        &dir,
        &args,
        &["batch_1.parquet", "no column \"energy\"", "auxiliary"],
    );
}

#[test]
fn a_wrongly_typed_column() {
    let dir = data();
    let mut args = icecube_args("cache", &[]);
    let k = args.iter().position(|a| *a == "event_id").unwrap();
    args[k] = "charge";
    fails_cleanly(
        &dir,
        &args,
        &[
            "batch_1.parquet",
            "column \"charge\" is double",
            "the key",
            "integer",
        ],
    );
}

#[test]
fn schemas_that_differ_between_files() {
    let dir = data();
    replace_column(&dir.join("data/train/batch_2.parquet"), "time", |_, b| {
        let t = b.column_by_name("time").unwrap();
        let t = t.as_any().downcast_ref::<Int64Array>().unwrap();
        arc(Float64Array::from_iter_values(
            t.values().iter().map(|&v| v as f64),
        ))
    });
    fails_cleanly(
        &dir,
        &icecube_args("cache", &[]),
        &[
            "batch_2.parquet",
            "\"time\" is double",
            "int64 in",
            "batch_1.parquet",
        ],
    );
}

#[test]
fn null_keys() {
    let dir = data();
    replace_column(
        &dir.join("data/train/batch_2.parquet"),
        "event_id",
        |n, b| {
            let k = b.column_by_name("event_id").unwrap();
            let k = k.as_any().downcast_ref::<Int64Array>().unwrap();
            arc(Int64Array::from_iter(
                (0..k.len()).map(|i| (i != 7 || n > 0).then(|| k.value(i))),
            ))
        },
    );
    fails_cleanly(
        &dir,
        &icecube_args("cache", &[]),
        &["batch_2.parquet", "\"event_id\" is null at row 7"],
    );
}

#[test]
fn nan_and_inf_in_a_feature() {
    for (bad, shown) in [(f64::NAN, "NaN"), (f64::INFINITY, "inf")] {
        let dir = data();
        replace_column(&dir.join("data/train/batch_1.parquet"), "charge", |n, b| {
            let c = b.column_by_name("charge").unwrap();
            let c = c.as_any().downcast_ref::<Float64Array>().unwrap();
            arc(Float64Array::from_iter_values((0..c.len()).map(|i| {
                if i == 5 && n == 0 {
                    bad
                } else {
                    c.value(i)
                }
            })))
        });
        fails_cleanly(
            &dir,
            &icecube_args("cache", &[]),
            &["batch_1.parquet", "column \"charge\" row 5", shown, "--nan"],
        );
        // With a policy it compiles and counts the replacement (if the row was kept).
        let out = dsc(
            dir.path(),
            &with_flag("--max-len", "4096", &["--nan", "zero", "--json"]),
        )
        .ok();
        let report: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(report["summary"]["values_filled"], 1);
    }
}

#[test]
fn log1p_of_a_value_below_minus_one_is_reported() {
    let dir = data();
    replace_column(&dir.join("data/train/batch_1.parquet"), "charge", |n, b| {
        let c = b.column_by_name("charge").unwrap();
        let c = c.as_any().downcast_ref::<Float64Array>().unwrap();
        arc(Float64Array::from_iter_values((0..c.len()).map(|i| {
            if i == 2 && n == 0 {
                -3.0
            } else {
                c.value(i)
            }
        })))
    });
    fails_cleanly(
        &dir,
        &icecube_args("cache", &[]),
        &["column \"charge\" row 2", "-3 encodes to NaN under log1p"],
    );
}

#[test]
fn keys_in_rows_but_not_in_the_context_table_and_the_reverse() {
    let dir = data();
    let meta = dir.join("data/train_meta.parquet");
    let original = std::fs::read(&meta).unwrap();
    let first_key = Table::read(&meta).i64s("event_id")[0];
    filter_rows(&meta, |i| i != 0);
    fails_cleanly(
        &dir,
        &icecube_args("cache", &[]),
        &[
            "batch_1.parquet",
            &format!("key {first_key} (row 0) has no row in the context table"),
            "--unmatched-rows drop",
        ],
    );
    let out = dsc(
        dir.path(),
        &icecube_args("cache", &["--unmatched-rows", "drop", "--json"]),
    )
    .ok();
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["summary"]["contexts_without_context_row"], 1);
    assert_eq!(report["contexts"], 119);
    std::fs::remove_dir_all(dir.join("cache")).unwrap();

    // The reverse: the context table names events whose rows file is not compiled.
    std::fs::write(&meta, original).unwrap();
    let args = with_rows("data/train/batch_1.parquet", &[]);
    fails_cleanly(
        &dir,
        &args,
        &[
            "train_meta.parquet",
            "has no rows in the rows files",
            "--empty-contexts",
        ],
    );
    let out = dsc(
        dir.path(),
        &with_rows(
            "data/train/batch_1.parquet",
            &["--empty-contexts", "drop", "--json"],
        ),
    )
    .ok();
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["summary"]["contexts_without_rows"], 60);
    assert_eq!(report["contexts"], 60);
}

#[test]
fn max_len_zero() {
    let dir = data();
    fails_cleanly(
        &dir,
        &with_flag("--max-len", "0", &[]),
        &["--max-len must be at least 1"],
    );
}

#[test]
fn an_existing_output_is_kept_unless_forced() {
    let dir = data();
    dsc(dir.path(), &icecube_args("cache", &[])).ok();
    let before = tree(&dir.join("cache"));
    let err = dsc(dir.path(), &with_flag("--seed", "5", &[])).fails(2);
    assert!(
        err.contains("cache: already exists and is not empty; pass --force"),
        "{err}"
    );
    assert_eq!(
        tree(&dir.join("cache")),
        before,
        "the existing cache is untouched"
    );
    dsc(dir.path(), &with_flag("--seed", "5", &["--force"])).ok();
    assert_ne!(tree(&dir.join("cache")), before);
    dsc(dir.path(), &["verify", "cache"]).ok();
    wait_replaced_removed(dir.path(), "cache");
    assert!(!dir.join(".cache.dsc-old").exists() && !dir.join(".cache.dsc-partial").exists());
    // A failing forced compile leaves the old cache in place.
    let after = tree(&dir.join("cache"));
    let err = dsc(dir.path(), &with_flag("--max-len", "0", &["--force"])).fails(2);
    assert!(err.contains("--max-len"));
    assert_eq!(tree(&dir.join("cache")), after);
}

#[test]
fn a_killed_compile_leaves_no_cache_and_the_next_run_succeeds() {
    let dir = Dir::new();
    gen_icecube(&dir, 4, 1500);
    let args = icecube_args("cache", &["--shard-size", "64KiB"]);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
        .args(&args)
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let partial = dir.join(".cache.dsc-partial/shards");
    let start = std::time::Instant::now();
    // Kill it once it has started writing shards: the most dangerous moment.
    loop {
        let written = std::fs::read_dir(&partial).map(|d| d.count()).unwrap_or(0);
        if written >= 2 {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the compile finished before it could be killed"
        );
        assert!(start.elapsed().as_secs() < 120, "no shard appeared");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!dir.join("cache").exists(), "no cache directory");
    assert!(!dir.join(".cache.dsc-partial/manifest.json").exists());
    let err = dsc(dir.path(), &["inspect", ".cache.dsc-partial"]).fails(2);
    assert!(
        err.contains("the staging directory of an unfinished"),
        "{err}"
    );
    dsc(dir.path(), &args).ok();
    dsc(dir.path(), &["verify", "cache"]).ok();
    assert!(
        !dir.join(".cache.dsc-partial").exists(),
        "the stale staging directory was cleared"
    );
}

#[test]
fn a_categorical_column_named_like_a_reserved_tensor() {
    let dir = Dir::new();
    gen_sequences(&dir, 50, 2);
    replace_column(
        &dir.join("seq/transactions/part-000.parquet"),
        "length",
        |_, b| b.column_by_name("channel").unwrap().clone(),
    );
    let args = [
        "compile",
        "seq/transactions/part-000.parquet",
        "--key",
        "customer_id",
        "--features",
        "amount",
        "--nan",
        "zero",
        "--categorical",
        "length",
        "--out",
        "cache",
    ];
    fails_cleanly(&dir, &args, &["\"length\"", "reserves"]);
}

#[test]
fn a_column_in_two_roles_is_checked_for_both() {
    let dir = data();
    // charge is double: fine to order by, not a categorical.
    let args = [
        "compile",
        "data/train/batch_*.parquet",
        "--key",
        "event_id",
        "--order-by",
        "charge",
        "--features",
        "time",
        "--categorical",
        "charge",
        "--out",
        "cache",
    ];
    fails_cleanly(&dir, &args, &["column \"charge\" is double", "categorical"]);
}

#[test]
fn errors_name_the_same_row_whatever_the_thread_count() {
    let dir = data();
    // A geometry file missing some sensors: the first pulse (in file order) on one of them is
    // the row to report.
    let csv = std::fs::read_to_string(dir.join("data/sensor_geometry.csv")).unwrap();
    let kept: Vec<&str> = csv
        .lines()
        .enumerate()
        .filter(|(i, _)| i % 7 != 3)
        .map(|(_, l)| l)
        .collect();
    std::fs::write(dir.join("data/sensor_geometry.csv"), kept.join("\n")).unwrap();
    let mut messages = Vec::new();
    for threads in ["1", "2", "3"] {
        let mut args = vec!["--threads", threads];
        args.extend(icecube_args("cache", &[]));
        let err = dsc(dir.path(), &args).fails(2);
        assert!(
            err.contains("has no entry in data/sensor_geometry.csv"),
            "{err}"
        );
        messages.push(err);
    }
    assert!(messages.windows(2).all(|w| w[0] == w[1]), "{messages:?}");
}

#[test]
fn values_beyond_f32_or_exact_statistics_are_reported() {
    let dir = data();
    replace_column(&dir.join("data/train/batch_1.parquet"), "charge", |n, b| {
        let c = b.column_by_name("charge").unwrap();
        let c = c.as_any().downcast_ref::<Float64Array>().unwrap();
        arc(Float64Array::from_iter_values((0..c.len()).map(|i| {
            if i == 4 && n == 0 {
                1e39
            } else {
                c.value(i)
            }
        })))
    });
    let mut args = icecube_args("cache", &[]);
    let e = args.iter().position(|a| *a == "charge=log1p").unwrap();
    args[e] = "charge=identity";
    fails_cleanly(
        &dir,
        &args,
        &[
            "column \"charge\" row 4",
            "1e39 is 1e39 after the encoding identity, beyond the f32 range of the tensor",
            "log1p",
        ],
    );
    replace_column(&dir.join("data/train/batch_1.parquet"), "charge", |n, b| {
        let c = b.column_by_name("charge").unwrap();
        let c = c.as_any().downcast_ref::<Float64Array>().unwrap();
        arc(Float64Array::from_iter_values((0..c.len()).map(|i| {
            if i == 4 && n == 0 {
                1e300
            } else {
                c.value(i)
            }
        })))
    });
    args.extend(["--nan", "mean"]);
    fails_cleanly(
        &dir,
        &args,
        &["column \"charge\"", "overflow its statistics"],
    );
}

#[test]
fn force_refuses_to_replace_a_directory_holding_the_inputs() {
    let dir = data();
    let mut args = icecube_args("data", &["--force"]);
    args[1] = "data/train/batch_*.parquet";
    let err = dsc(dir.path(), &args).fails(2);
    assert!(err.contains("is inside it; choose another --out"), "{err}");
    assert!(dir.join("data/train/batch_1.parquet").exists());
}

/// Issue 41, item 5: data as it usually arrives (uint64 values, lists where one value is wanted,
/// targets on the rows themselves) is refused with each type named as Arrow's tools print it,
/// never Rust's debug form, and with what to do instead.
#[test]
fn data_as_users_keep_it_is_refused_with_readable_types_and_a_way_forward() {
    use arrow_array::builder::{Float64Builder, ListBuilder};
    use arrow_array::StringArray;
    let dir = Dir::new();
    write_parquet(
        &dir.join("tx.parquet"),
        vec![
            ("cust", arc(StringArray::from(vec!["a", "a", "b"]))),
            ("ts", arc(Int64Array::from(vec![1, 2, 1]))),
            ("amt", arc(Float64Array::from(vec![1.0, 2.0, 3.0]))),
            ("churn", arc(Float64Array::from(vec![0.0, 0.0, 1.0]))),
        ],
    );
    let mut time = ListBuilder::new(Float64Builder::new());
    for row in [vec![0.5, 1.5], vec![2.5]] {
        time.values().append_slice(&row);
        time.append(true);
    }
    write_parquet(
        &dir.join("events.parquet"),
        vec![
            ("id", arc(Int64Array::from(vec![1, 2]))),
            ("time", arc(time.finish())),
            ("y", arc(Float64Array::from(vec![0.0, 1.0]))),
        ],
    );
    let compile = |args: &[&str], needles: &[&str]| {
        let mut all = vec!["compile"];
        all.extend_from_slice(args);
        all.extend(["--out", "cache"]);
        fails_cleanly(&dir, &all, needles);
    };
    // A string key compiles (issue 41, item 1); a uint64 feature is read as bits, so refused.
    dsc(
        dir.path(),
        &[
            "compile",
            "tx.parquet",
            "--key",
            "cust",
            "--order-by",
            "ts",
            "--features",
            "amt",
            "--out",
            "tx",
        ],
    )
    .ok();
    replace_column(&dir.join("tx.parquet"), "amt", |_, _| {
        arc(arrow_array::UInt64Array::from(vec![1u64, 2, u64::MAX]))
    });
    compile(
        &[
            "tx.parquet",
            "--key",
            "cust",
            "--order-by",
            "ts",
            "--features",
            "amt",
        ],
        &[
            "tx.parquet",
            "column \"amt\" is uint64, but as a numeric feature or target",
            "cast it to int64 or double first",
        ],
    );
    // A list column compiles (issue 41, item 2); as a target, one value per context, it is
    // refused with its type named as Arrow names it.
    dsc(
        dir.path(),
        &[
            "compile",
            "events.parquet",
            "--key",
            "id",
            "--features",
            "time",
            "--targets",
            "y",
            "--out",
            "ev",
        ],
    )
    .ok();
    compile(
        &["events.parquet", "--key", "id", "--features", "y", "--targets", "time"],
        &[
            "events.parquet",
            "column \"time\" is list<double>, but as a numeric feature or target it must be one value per row",
            "a list column is a per-step column",
        ],
    );
    compile(
        &[
            "events.parquet",
            "--key",
            "id",
            "--features",
            "y",
            "--targets",
            "y",
        ],
        &[
            "--targets needs a context table (--context)",
            "compile it without --key",
        ],
    );
    let err = dsc(
        dir.path(),
        &[
            "compile",
            "events.parquet",
            "--key",
            "id",
            "--features",
            "y",
            "--targets",
            "time",
            "--out",
            "c",
        ],
    )
    .fails(2);
    assert!(!err.contains("Field {") && !err.contains("List("), "{err}");
}
