//! Keys as users keep them (issue 41, item 1): strings, UUIDs and uint64 compile to exactly the
//! cache of their ids, carry key tables that give the keys back, and are found by their keys.

use crate::util::*;
use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::{Array, Int64Array};
use dsc_format::keys::text_id;
use std::collections::BTreeMap;
use std::path::Path;

/// `dsc gen sequences` of one key style into `out`: 300 customers over 3 files, seed 3.
fn gen_keys(dir: &Dir, out: &str, style: &str) {
    gen_sequences_as(dir, out, (300, 3), &["--key-type", style]);
}

/// The customer compile of `tests/util`'s `sequences_args`, on the data in `data`, with `extra`
/// flags (a flag it has already takes the value given here).
fn compile_args(data: &str, out: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = sequences_args(out)
        .into_iter()
        .map(|s| s.replace("seq/", &format!("{data}/")))
        .collect();
    let mut extra = extra.iter().map(|s| s.to_string()).peekable();
    while let Some(flag) = extra.next() {
        let value = extra.next_if(|v| !v.starts_with("--"));
        match (a.iter().position(|x| *x == flag), value) {
            (Some(at), Some(v)) => a[at + 1] = v,
            (_, v) => a.extend(std::iter::once(flag).chain(v)),
        }
    }
    a
}

/// Names the first file that differs between the caches `a` and `b`.
fn assert_same_tree(dir: &Dir, a: &str, b: &str) {
    let (ta, tb) = (tree(&dir.join(a)), tree(&dir.join(b)));
    assert_eq!(
        ta.keys().collect::<Vec<_>>(),
        tb.keys().collect::<Vec<_>>(),
        "{a} and {b}"
    );
    for (name, bytes) in &ta {
        assert!(*bytes == tb[name], "{a}/{name} differs from {b}/{name}");
    }
}

fn compile(dir: &Dir, data: &str, out: &str, extra: &[&str]) {
    let a = compile_args(data, out, extra);
    dsc(
        dir.path(),
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .ok();
}

/// Every Parquet file under `data` with `customer_id` replaced by the key's id as an int64.
fn to_ids(data: &Path) {
    for (name, _) in tree(data) {
        replace_column(&data.join(&name), "customer_id", |_, batch| {
            let col = batch.column_by_name("customer_id").expect("key column");
            let ids: Vec<i64> = match col.data_type() {
                arrow_schema::DataType::Utf8 => col
                    .as_string::<i32>()
                    .iter()
                    .map(|s| text_id(s.unwrap()))
                    .collect(),
                arrow_schema::DataType::FixedSizeBinary(16) => {
                    let b = col.as_fixed_size_binary();
                    (0..b.len())
                        .map(|i| {
                            text_id(&dsc_format::keys::uuid_text(b.value(i).try_into().unwrap()))
                        })
                        .collect()
                }
                arrow_schema::DataType::UInt64 => col
                    .as_primitive::<UInt64Type>()
                    .values()
                    .iter()
                    .map(|&k| k as i64)
                    .collect(),
                other => panic!("{other}"),
            };
            arc(Int64Array::from(ids))
        });
    }
}

/// The key tables of a cache: each shard's (ids, keys).
fn key_tables(cache: &Path) -> BTreeMap<String, (Vec<i64>, Vec<String>)> {
    let m = manifest(cache);
    let mut out = BTreeMap::new();
    for shard in m["shards"].as_array().unwrap() {
        let file = shard["keys"]["file"]
            .as_str()
            .expect("every shard has a key table");
        let bytes = std::fs::read(cache.join(file)).unwrap();
        let t = dsc_format::keys::read_key_table(&bytes, Path::new(file)).unwrap();
        out.insert(
            shard["file"].as_str().unwrap().to_string(),
            (t.ids, t.texts),
        );
    }
    out
}

#[test]
fn string_uuid_and_uint64_keys_compile_to_the_cache_of_their_ids_with_the_keys_beside_it() {
    let dir = Dir::new();
    for style in ["string", "uuid", "uint64"] {
        gen_keys(&dir, style, style);
        let ids = format!("{style}-ids");
        std::fs::create_dir_all(dir.join(&ids)).unwrap();
        for (name, bytes) in tree(&dir.join(style)) {
            let to = dir.join(&ids).join(&name);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::write(to, bytes).unwrap();
        }
        to_ids(&dir.join(&ids));
        compile(&dir, style, &format!("c-{style}"), &[]);
        compile(&dir, &ids, &format!("c-{ids}"), &[]);
        // The shards and statistics are those of the integer ids, byte for byte: the same
        // buckets, order, split, encodings and values.
        let (keyed, by_id) = (
            tree(&dir.join(&format!("c-{style}"))),
            tree(&dir.join(&format!("c-{ids}"))),
        );
        let shards = |t: &BTreeMap<String, Vec<u8>>| -> Vec<String> {
            t.keys()
                .filter(|k| k.starts_with("shards/") && !k.contains(".keys."))
                .cloned()
                .collect()
        };
        assert_eq!(shards(&keyed), shards(&by_id), "{style}");
        assert!(
            shards(&keyed).len() > 3,
            "several shards: {:?}",
            shards(&keyed)
        );
        for name in shards(&keyed).iter().chain([&"stats.json".to_string()]) {
            assert!(
                keyed[name] == by_id[name],
                "{style}: {name} differs from the ids' cache"
            );
        }
        // The manifest says what the keys were; only hashed keys have key tables.
        let m = manifest(&dir.join(&format!("c-{style}")));
        let source = m["tensors"][0]["columns"][0]["source_type"]
            .as_str()
            .unwrap()
            .to_string();
        let hashed = style != "uint64";
        assert_eq!(
            source,
            match style {
                "string" => "Utf8",
                "uuid" => "FixedSizeBinary(16)",
                _ => "UInt64",
            }
        );
        let tables = m["shards"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["keys"].is_object())
            .count();
        assert_eq!(
            tables,
            if hashed {
                m["shards"].as_array().unwrap().len()
            } else {
                0
            }
        );
        dsc(dir.path(), &["verify", &format!("c-{style}")]).ok();
        if !hashed {
            continue;
        }
        // Each key table holds its shard's ids in order, and the keys of the input.
        let input = Table::read(&dir.join(style).join("customers.parquet"));
        let col = input.batches[0]
            .column_by_name("customer_id")
            .unwrap()
            .clone();
        let input_keys: std::collections::HashSet<String> = (0..col.len())
            .map(|i| match style {
                "string" => col.as_string::<i32>().value(i).to_string(),
                _ => dsc_format::keys::uuid_text(
                    col.as_fixed_size_binary().value(i).try_into().unwrap(),
                ),
            })
            .collect();
        let (samples, _) = read_cache(&dir.join(&format!("c-{style}")));
        let mut stored = 0;
        for (shard, (ids, texts)) in key_tables(&dir.join(&format!("c-{style}"))) {
            let shard_ids = read_shard(&dir.join(&format!("c-{style}")).join(&shard))["key"].i64s();
            assert_eq!(ids, shard_ids, "{shard}");
            for (id, text) in ids.iter().zip(&texts) {
                assert_eq!(text_id(text), *id);
                assert!(
                    input_keys.contains(text),
                    "{text} is not a key of the input"
                );
                assert!(samples.contains_key(id));
            }
            stored += ids.len();
        }
        assert_eq!(stored, samples.len());
    }
}

#[test]
fn string_keyed_caches_are_byte_identical_whatever_the_threads_memory_or_partitions() {
    let dir = Dir::new();
    gen_keys(&dir, "tx", "string");
    compile(
        &dir,
        "tx",
        "one",
        &["--threads", "1", "--bucket-size", "16KiB"],
    );
    // A budget this small spills every bucket to disk (what more than one machine's worth of
    // input does), and buckets of 16 KiB split the input many ways.
    compile(
        &dir,
        "tx",
        "two",
        &[
            "--threads",
            "2",
            "--bucket-size",
            "16KiB",
            "--max-memory",
            "1MiB",
        ],
    );
    for stage in ["scan", "fit", "write"] {
        for i in 0..2 {
            let p = format!("{i}/2");
            compile(
                &dir,
                "tx",
                "parted",
                &[
                    "--bucket-size",
                    "16KiB",
                    "--partition",
                    &p,
                    "--stage",
                    stage,
                    "-q",
                ],
            );
        }
    }
    dsc(dir.path(), &["merge", "parted", "-q"]).ok();
    assert!(tree(&dir.join("one"))
        .keys()
        .any(|k| k.ends_with(".keys.safetensors")));
    assert_same_tree(&dir, "one", "two");
    assert_same_tree(&dir, "one", "parted");
}

#[test]
fn string_keys_are_found_listed_and_joined_as_the_data_holds_them() {
    let dir = Dir::new();
    gen_keys(&dir, "tx", "string");
    gen_keys(&dir, "ids", "uuid");
    let customers = Table::read(&dir.join("tx/customers.parquet"));
    let keys: Vec<String> = customers
        .strings("customer_id")
        .into_iter()
        .map(Option::unwrap)
        .collect();
    // A key file of strings puts exactly those customers in `test`.
    let listed: Vec<&String> = keys.iter().step_by(10).collect();
    let mut list = String::new();
    for k in &listed {
        list.push_str(k);
        list.push('\n');
    }
    std::fs::write(dir.join("test.txt"), list).unwrap();
    compile(
        &dir,
        "tx",
        "c",
        &[
            "--val-fraction",
            "0",
            "--empty-contexts",
            "keep",
            "--split-keys",
            "test=test.txt",
        ],
    );
    let out = dsc(
        dir.path(),
        &["show", "c", "--split", "test", "--key", listed[0], "--json"],
    )
    .ok();
    let shown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["key"], serde_json::json!(listed[0]));
    assert_eq!(
        manifest(&dir.join("c"))["splits"][1]["contexts"],
        listed.len()
    );
    // Without --key, the key is read from the shard's key table.
    let out = dsc(
        dir.path(),
        &["show", "c", "--split", "test", "--index", "0"],
    )
    .ok();
    assert!(
        listed.iter().any(|k| out.starts_with(&format!("key {k} "))),
        "{out}"
    );
    // A key the split lacks, and one that cannot be a key, are named.
    let err = dsc(dir.path(), &["show", "c", "--key", "C-missing"]).fails(2);
    assert!(err.contains("no context with key C-missing"), "{err}");

    // A CSV context table keyed by the same strings gives the same cache as its Parquet.
    let mut csv = String::from("customer_id,lifetime_value\n");
    let values = customers.f64s("lifetime_value");
    for (k, v) in keys.iter().zip(&values) {
        csv.push_str(&format!("{k},{}\n", v.unwrap()));
    }
    std::fs::write(dir.join("tx/customers.csv"), csv).unwrap();
    let with = |ctx: &str, out: &str| {
        let a: Vec<String> = compile_args("tx", out, &[])
            .into_iter()
            .map(|s| {
                if s.ends_with("customers.parquet") {
                    ctx.to_string()
                } else {
                    s
                }
            })
            .collect();
        dsc(
            dir.path(),
            &a.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .ok();
    };
    with("tx/customers.csv", "from-csv");
    with("tx/customers.parquet", "from-parquet");
    assert_eq!(
        shard_files(&dir.join("from-csv")),
        shard_files(&dir.join("from-parquet"))
    );

    // UUID keys are found in any usual spelling.
    compile(&dir, "ids", "u", &[]);
    let first = dsc(dir.path(), &["show", "u", "--index", "0", "--json"]).ok();
    let uuid = serde_json::from_str::<serde_json::Value>(&first).unwrap()["key"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(uuid.len(), 36, "{uuid}");
    let bare = uuid.replace('-', "").to_uppercase();
    let found = dsc(dir.path(), &["show", "u", "--key", &bare]).ok();
    assert!(
        found.starts_with(&format!("key {uuid}  split train  index 0")),
        "{found}"
    );
}

#[test]
fn mismatched_null_and_repeated_string_keys_are_refused_by_file_column_and_row() {
    let dir = Dir::new();
    gen_keys(&dir, "tx", "string");
    gen_keys(&dir, "int", "int");
    let run = |rows: &str, context: &str| -> String {
        let a: Vec<String> = compile_args(rows, "c", &[])
            .into_iter()
            .map(|s| {
                if s.ends_with("customers.parquet") {
                    context.to_string()
                } else {
                    s
                }
            })
            .collect();
        dsc(
            dir.path(),
            &a.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .fails(2)
    };
    // A string-keyed rows table with an integer-keyed context table, and the other way round.
    let err = run("tx", "int/customers.parquet");
    assert!(
        err.contains("int/customers.parquet: column \"customer_id\" is int64, but as the context key it must be a string or binary type, as the rows' key is"),
        "{err}"
    );
    let err = run("int", "tx/customers.parquet");
    assert!(
        err.contains("is string, but as the context key it must be an integer type"),
        "{err}"
    );

    // A null key names its file and row.
    replace_column(
        &dir.join("tx/customers.parquet"),
        "customer_id",
        |_, batch| {
            let col = batch
                .column_by_name("customer_id")
                .unwrap()
                .as_string::<i32>();
            arc(arrow_array::StringArray::from_iter(
                (0..col.len()).map(|i| (i != 7).then(|| col.value(i).to_string())),
            ))
        },
    );
    let err = run("tx", "tx/customers.parquet");
    assert!(
        err.contains("tx/customers.parquet") && err.contains("row 7"),
        "{err}"
    );
    // A repeated key names both rows and the key as written.
    replace_column(
        &dir.join("tx/customers.parquet"),
        "customer_id",
        |_, batch| {
            let col = batch
                .column_by_name("customer_id")
                .unwrap()
                .as_string::<i32>();
            arc(arrow_array::StringArray::from_iter_values(
                (0..col.len()).map(|i| {
                    if i == 0 || i == 5 {
                        "dup".to_string()
                    } else {
                        format!("K{i}")
                    }
                }),
            ))
        },
    );
    let err = run("tx", "tx/customers.parquet");
    assert!(
        err.contains("appears twice") && err.contains("(row 0 and row 5)"),
        "{err}"
    );
}

#[test]
fn uint64_keys_past_2_63_join_a_csv_context_and_a_key_is_no_split_column() {
    let dir = Dir::new();
    gen_keys(&dir, "u", "uint64");
    let customers = Table::read(&dir.join("u/customers.parquet"));
    let col = customers.batches[0]
        .column_by_name("customer_id")
        .unwrap()
        .clone();
    let keys = col.as_primitive::<UInt64Type>();
    let values = customers.f64s("lifetime_value");
    let mut csv = String::from("customer_id,lifetime_value\n");
    for (k, v) in keys.values().iter().zip(&values) {
        assert!(*k > 1 << 63);
        csv.push_str(&format!("{k},{}\n", v.unwrap()));
    }
    std::fs::write(dir.join("u/customers.csv"), csv).unwrap();
    let with = |ctx: &str, out: &str, extra: &[&str]| -> Vec<String> {
        compile_args("u", out, extra)
            .into_iter()
            .map(|s| {
                if s.ends_with("customers.parquet") {
                    ctx.to_string()
                } else {
                    s
                }
            })
            .collect()
    };
    for (ctx, out) in [
        ("u/customers.csv", "csv"),
        ("u/customers.parquet", "parquet"),
    ] {
        let a = with(ctx, out, &[]);
        dsc(
            dir.path(),
            &a.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .ok();
    }
    assert_eq!(
        shard_files(&dir.join("csv")),
        shard_files(&dir.join("parquet"))
    );
    let a = with("u/customers.parquet", "x", &["--split-by", "customer_id"]);
    let err = dsc(
        dir.path(),
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .fails(2);
    assert!(err.contains("the split column cannot be the key"), "{err}");
}

/// The bytes of every file under a cache's `shards/` (shards and key tables), in name order.
fn shard_files(cache: &std::path::Path) -> Vec<Vec<u8>> {
    tree(cache)
        .into_iter()
        .filter(|(k, _)| k.starts_with("shards/"))
        .map(|(_, v)| v)
        .collect()
}

/// Issue 52 B4: `dsc verify` of a cache in object storage with key tables (string keys hot,
/// UUIDs compressed) checks the key tables as a local verify does; it panicked before ("one
/// file per shard"). A damaged key table is reported, naming it.
#[test]
fn a_remote_cache_with_key_tables_verifies_as_a_local_one() {
    let dir = Dir::new();
    let server = S3Server::start();
    for (style, compress) in [("string", false), ("uuid", true)] {
        gen_keys(&dir, style, style);
        compile(&dir, style, &format!("{style}-cache"), &[]);
        let local = dir.join(&format!("{style}-cache"));
        if compress {
            dsc(dir.path(), &["compress", &format!("{style}-cache")]).ok();
        }
        let url = format!("{}/{style}", server.bucket("keys"));
        let remote = dsc_store::Remote::open_with(&url, &server.options()).unwrap();
        dsc_store::upload_cache(&local, &remote, false, |_, _| {}).unwrap();
        let verify = || {
            let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"));
            cmd.args(["verify", &url])
                .current_dir(dir.path())
                .env("DSC_CACHE_DIR", dir.join("dsc-cache"));
            for (k, v) in server.env() {
                cmd.env(k, v);
            }
            cmd.output().unwrap()
        };
        let out = verify();
        assert!(
            out.status.success(),
            "{style}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // A key table replaced by other bytes is named.
        let m = manifest(&local);
        let table = m["shards"][0]["keys"]["file"].as_str().unwrap().to_string();
        let mut bytes = remote.get(&table).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        remote.put(&table, bytes).unwrap();
        let out = verify();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{style}: {err}");
        assert!(err.contains(&table), "{style}: {err}");
    }
}

/// Issue 52 C8: a key in two list files names both files and rows ("(row 1 of p3.parquet and
/// row and 2)" before).
#[test]
fn a_key_in_two_list_files_names_both() {
    let dir = Dir::new();
    gen_sequences_as(
        &dir,
        "seq",
        (90, 3),
        &["--key-type", "string", "--layout", "lists"],
    );
    let files = files_in(&dir, "seq/lists");
    for (file, dup) in [(&files[0], 1), (&files[2], 2)] {
        replace_column(&dir.join(file), "customer_id", |_, batch| {
            let col = batch
                .column_by_name("customer_id")
                .unwrap()
                .as_string::<i32>();
            arc(arrow_array::StringArray::from_iter_values(
                (0..col.len()).map(|i| match i == dup {
                    true => "twice".to_string(),
                    false => col.value(i).to_string(),
                }),
            ))
        });
    }
    let err = dsc(
        dir.path(),
        &[
            "compile",
            "seq/lists",
            "--key",
            "customer_id",
            "--order-by",
            "ts",
            "--targets",
            "lifetime_value",
            "--features",
            "amount",
            "--out",
            "c",
        ],
    )
    .fails(2);
    let expected = format!(
        "{}: key \"twice\" appears twice in column \"customer_id\" (row 1 of {} and row 2)",
        files[2], files[0]
    );
    assert!(err.contains(&expected), "{err}");
}
