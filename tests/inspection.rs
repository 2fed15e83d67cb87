//! `dsc show`, `dsc inspect --column/--shards/--json` and `dsc report` on generated caches.

use crate::util::*;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The inverse of a stage chain, written from docs/FORMAT.md §5 (not dsc's code).
fn invert(stages: &[serde_json::Value], v: f64) -> f64 {
    stages
        .iter()
        .rev()
        .fold(v, |v, s| match s["op"].as_str().unwrap() {
            "identity" => v,
            "log1p" => v.exp_m1(),
            "zscore" => v * s["std"].as_f64().unwrap() + s["mean"].as_f64().unwrap(),
            "minmax" => {
                let (lo, hi) = (s["min"].as_f64().unwrap(), s["max"].as_f64().unwrap());
                v * (hi - lo) + lo
            }
            other => panic!("unknown stage {other}"),
        })
}

/// One source transaction: column name to value.
type SourceRow = BTreeMap<&'static str, serde_json::Value>;

fn sequences_cache(dir: &Dir) {
    gen_sequences(dir, 120, 2);
    dsc(
        dir.path(),
        &[
            "compile",
            "seq/transactions",
            "--key",
            "customer_id",
            "--order-by",
            "ts",
            "--context",
            "seq/customers.parquet",
            "--targets",
            "churned,lifetime_value",
            "--context-features",
            "age,tenure_years",
            "--features",
            "amount,items,discount,is_refund,ts",
            "--categorical",
            "merchant_category,channel",
            "--encode",
            "amount=minmax",
            "--encode",
            "items=log1p",
            "--encode",
            "discount=zscore",
            "--encode",
            "ts=zscore",
            "--encode",
            "tenure_years=log1p,zscore",
            "--nan",
            "mean",
            "--empty-contexts",
            "drop",
            "--val-fraction",
            "0.25",
            "--out",
            "cache",
        ],
    )
    .ok();
}

#[test]
fn show_decodes_every_encoding_back_to_the_source_values() {
    let dir = Dir::new();
    sequences_cache(&dir);
    let m = manifest(&dir.join("cache"));
    let stages_of = |name: &str| -> Vec<serde_json::Value> {
        for t in m["tensors"].as_array().unwrap() {
            for c in t["columns"].as_array().unwrap() {
                if c["name"] == name {
                    return c["encoding"]["stages"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                }
            }
        }
        panic!("no column {name}")
    };
    // Source rows per customer, in ts order.
    let mut rows: BTreeMap<i64, Vec<(i64, SourceRow)>> = BTreeMap::new();
    let mut files: Vec<_> = std::fs::read_dir(dir.join("seq/transactions"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in &files {
        let t = Table::read(f);
        let ids = t.i64s("customer_id");
        let ts = t.ticks("ts");
        let nums: Vec<(&str, Vec<Option<f64>>)> = ["amount", "items", "discount"]
            .iter()
            .map(|c| (*c, t.f64s(c)))
            .collect();
        let refund = t.f64s("is_refund");
        let (merchant, channel) = (t.strings("merchant_category"), t.strings("channel"));
        for r in 0..t.rows() {
            let mut v = BTreeMap::new();
            for (name, col) in &nums {
                v.insert(
                    *name,
                    col[r].map_or(serde_json::Value::Null, serde_json::Value::from),
                );
            }
            v.insert("ts", (ts[r].unwrap() as f64).into());
            v.insert("is_refund", (refund[r].unwrap() != 0.0).into());
            v.insert(
                "merchant_category",
                merchant[r]
                    .clone()
                    .map_or(serde_json::Value::Null, Into::into),
            );
            v.insert("channel", channel[r].clone().into());
            rows.entry(ids[r]).or_default().push((ts[r].unwrap(), v));
        }
    }
    for list in rows.values_mut() {
        list.sort_by_key(|(ts, _)| *ts);
    }
    let customers = Table::read(&dir.join("seq/customers.parquet"));
    let cids = customers.i64s("customer_id");
    let ltv = customers.f64s("lifetime_value");
    let tenure = customers.f64s("tenure_years");
    let mut checked = 0;
    for (split, count) in m["splits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), s["contexts"].as_u64().unwrap()))
    {
        for index in (0..count).step_by(7) {
            let idx = index.to_string();
            let shown: serde_json::Value = serde_json::from_str(
                &dsc(
                    dir.path(),
                    &["show", "cache", "--split", split, "--index", &idx, "--json"],
                )
                .ok(),
            )
            .unwrap();
            let raw: serde_json::Value = serde_json::from_str(
                &dsc(
                    dir.path(),
                    &[
                        "show", "cache", "--split", split, "--index", &idx, "--json", "--raw",
                    ],
                )
                .ok(),
            )
            .unwrap();
            let key = shown["key"].as_i64().unwrap();
            let by_key: serde_json::Value = serde_json::from_str(
                &dsc(
                    dir.path(),
                    &[
                        "show",
                        "cache",
                        "--split",
                        split,
                        "--key",
                        &key.to_string(),
                        "--json",
                    ],
                )
                .ok(),
            )
            .unwrap();
            assert_eq!(by_key, shown, "--key and --index agree");
            let source = &rows[&key];
            let length = shown["length"].as_u64().unwrap() as usize;
            assert_eq!(
                length,
                source.len().min(m["max_len"].as_u64().unwrap() as usize)
            );
            for (step, (_, values)) in source.iter().take(length).enumerate() {
                for (name, want) in values {
                    let got = &shown["columns"][name][step];
                    match want {
                        serde_json::Value::Number(w)
                            if ["amount", "items", "discount", "ts"].contains(name) =>
                        {
                            let w = w.as_f64().unwrap();
                            let stored = raw["columns"][name][step].as_f64().unwrap() as f32;
                            let stages = stages_of(name);
                            let scale = if *name == "ts" { 1e-6 } else { 1.0 };
                            // Tolerance: one f32 step of the stored value, through the inverse.
                            let next = invert(&stages, f64::from(stored.next_up())) / scale;
                            let here = invert(&stages, f64::from(stored)) / scale;
                            let tol = 2.0 * (next - here).abs() + 1e-9 * w.abs();
                            let g = got.as_f64().unwrap();
                            assert!((g - w).abs() <= tol, "key {key} step {step} {name}: got {g}, source {w}, tolerance {tol}");
                        }
                        // Nulls were filled with the train mean: the decoded value is that mean.
                        serde_json::Value::Null
                            if ["amount", "items", "discount"].contains(name) =>
                        {
                            assert!(got.is_number(), "{name} filled");
                        }
                        _ => assert!(
                            got == want || got == "<unknown>",
                            "key {key} step {step} {name}: got {got}, source {want}"
                        ),
                    }
                }
            }
            let c = cids.iter().position(|&k| k == key).unwrap();
            let got_ltv = shown["targets"]["lifetime_value"].as_f64().unwrap();
            assert_eq!(got_ltv, f64::from(ltv[c].unwrap() as f32));
            let got_tenure = shown["context"]["tenure_years"].as_f64().unwrap();
            assert!(
                (got_tenure - tenure[c].unwrap()).abs() < 1e-4 * (1.0 + tenure[c].unwrap()),
                "tenure"
            );
            assert!(shown["targets"]["churned"].is_boolean());
            checked += 1;
        }
    }
    assert!(checked > 10);
    // The human view fits 100 columns and names the key.
    let text = dsc(dir.path(), &["show", "cache", "--index", "0"]).ok();
    assert!(text.starts_with("key "), "{text}");
    assert!(text.lines().all(|l| l.chars().count() <= 100), "{text}");
    let err = dsc(dir.path(), &["show", "cache", "--key", "-5"]).fails(2);
    assert!(err.contains("no context with key -5"), "{err}");
}

/// The documented `dsc inspect --json` document (docs/FORMAT.md §11): unknown or missing fields
/// fail this test, so a change to the interface is a deliberate one.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Inspect {
    cache: String,
    compiled_at: Option<String>,
    generation: u32,
    content_id: String,
    spec: serde_json::Value,
    format_version: u32,
    dsc_version: String,
    inputs_fingerprint: String,
    input_files: usize,
    input_bytes: u64,
    max_len: usize,
    contexts: usize,
    hidden: usize,
    shards: usize,
    bytes: u64,
    compression: Option<String>,
    stored_bytes: u64,
    padding_efficiency: f64,
    splits: Vec<InspectSplit>,
    tensors: Vec<InspectTensor>,
    columns: Vec<InspectColumn>,
    lengths: serde_json::Value,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct InspectSplit {
    name: String,
    contexts: usize,
    rows_stored: u64,
    shards: usize,
    bytes: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct InspectTensor {
    name: String,
    dtype: String,
    shape: Vec<String>,
    columns: Vec<String>,
    encodings: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct InspectColumn {
    name: String,
    table: String,
    source_type: String,
    count: u64,
    nulls: u64,
    nan_inf: u64,
    min: Option<f64>,
    mean: Option<f64>,
    std: Option<f64>,
    median: Option<f64>,
    max: Option<f64>,
    distinct: Option<u64>,
}

#[test]
fn inspect_json_is_the_documented_interface() {
    let dir = Dir::new();
    sequences_cache(&dir);
    let out = dsc(dir.path(), &["inspect", "cache", "--json"]).ok();
    let i: Inspect = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}\n{out}"));
    assert_eq!(
        i.splits.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["train", "val"]
    );
    assert_eq!(
        i.splits.iter().map(|s| s.contexts).sum::<usize>(),
        i.contexts
    );
    assert!(i.compiled_at.unwrap().ends_with('Z'));
    assert_eq!(i.generation, 1, "a compiled cache is its first generation");
    assert_eq!(i.content_id.len(), 16);
    assert_eq!(
        (i.compression, i.stored_bytes),
        (None, i.bytes),
        "a hot cache"
    );
    let channel = i.columns.iter().find(|c| c.name == "channel").unwrap();
    assert_eq!(channel.distinct, Some(3));
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/FORMAT.md")).unwrap();
    for field in [
        "padding_efficiency",
        "compiled_at",
        "content_id",
        "inputs_fingerprint",
        "nan_inf",
    ] {
        assert!(docs.contains(field), "docs/FORMAT.md documents {field}");
    }
}

#[test]
fn inspect_shows_one_column_in_depth_and_lists_shards() {
    let dir = Dir::new();
    sequences_cache(&dir);
    let out = dsc(dir.path(), &["inspect", "cache", "--column", "amount"]).ok();
    assert!(
        out.contains("column amount") && out.contains("minmax") && out.contains("quantiles"),
        "{out}"
    );
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("train ") || l.starts_with("val ") || l.starts_with("all "))
            .count(),
        3,
        "{out}"
    );
    let out = dsc(
        dir.path(),
        &[
            "inspect",
            "cache",
            "--column",
            "merchant_category",
            "--top",
            "3",
        ],
    )
    .ok();
    assert!(out.contains("distinct values; top 3"), "{out}");
    assert!(out.lines().all(|l| l.chars().count() <= 100));
    let err = dsc(dir.path(), &["inspect", "cache", "--column", "nope"]).fails(2);
    assert!(err.contains("no column \"nope\""), "{err}");
    let out = dsc(dir.path(), &["inspect", "cache", "--shards"]).ok();
    assert!(
        out.contains("shards/train-00000.safetensors")
            && out.contains("shards/val-00000.safetensors"),
        "{out}"
    );
}

fn chromium() -> std::path::PathBuf {
    let path = std::env::var_os("DSC_CHROMIUM")
        .map_or_else(|| "/usr/bin/chromium".into(), std::path::PathBuf::from);
    assert!(
        path.exists(),
        "no Chromium at {}: scripts/test.sh installs Debian's chromium, or set DSC_CHROMIUM",
        path.display()
    );
    path
}

fn hex(c: &str) -> [u8; 3] {
    let v = u32::from_str_radix(c.trim_start_matches('#'), 16).unwrap();
    [(v >> 16) as u8, (v >> 8) as u8, v as u8]
}

#[test]
fn report_renders_every_plot_in_a_real_browser() {
    let dir = small_icecube_cache();
    let out = dsc(dir.path(), &["report", "cache", "-o", "report.html"]).ok();
    assert!(out.contains("report.html"));
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(
        !html.contains("<script") && !html.contains("src=") && !html.contains("href="),
        "self-contained"
    );
    let profile = dir.join("chromium-profile");
    let status = std::process::Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1280,3000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", dir.join("shot.png").display()))
        .arg(format!("file://{}", dir.join("report.html").display()))
        .output()
        .expect("run chromium");
    assert!(
        dir.join("shot.png").exists(),
        "no screenshot: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(dir.join("shot.png")).unwrap(),
    ));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let pixels = &buf[..info.buffer_size()];
    let count = |c: &str| {
        let want = hex(c);
        pixels
            .chunks_exact(channels)
            .filter(|p| (0..3).all(|i| (i32::from(p[i]) - i32::from(want[i])).abs() <= 6))
            .count()
    };
    // Each kind of plot has its own colour: every one must have drawn bars.
    for (what, colour, min) in [
        ("length histogram", "#1f77b4", 2000),
        ("column histograms", "#2ca02c", 10_000),
        ("shard sizes", "#d62728", 2000),
        ("split sizes", "#9467bd", 2000),
    ] {
        let n = count(colour);
        assert!(
            n >= min,
            "{what}: {n} pixels of {colour} in the screenshot (want >= {min})"
        );
    }
}

/// Issue 52 C7: a command whose reader goes away (`dsc show … | head`) stops quietly, exit 0,
/// as command-line tools do: every printing command, JSON or text. Its stdout here is a pipe
/// whose reader is closed before it starts, so its first write fails.
#[test]
fn every_command_stops_quietly_when_its_reader_goes_away() {
    let dir = Dir::new();
    sequences_cache(&dir);
    let commands: &[&[&str]] = &[
        &["inspect", "cache"],
        &["inspect", "cache", "--json"],
        &["inspect", "cache", "--shards", "--json"],
        &["inspect", "cache", "--column", "amount"],
        &["show", "cache", "--index", "0"],
        &["show", "cache", "--index", "0", "--json"],
        &["order", "cache", "--batch-size", "4", "--keys"],
        &["order", "cache", "--batch-size", "4", "--json"],
        &["log", "cache", "--json"],
        &["verify", "cache"],
        &[
            "compile",
            "seq/transactions",
            "--key",
            "customer_id",
            "--print-spec",
        ],
    ];
    for args in commands {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
            .args(*args)
            .current_dir(dir.path())
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "dsc {}: {err}", args.join(" "));
        assert!(err.is_empty(), "dsc {}: {err}", args.join(" "));
    }
}
