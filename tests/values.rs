//! Every stored value checked against the source Parquet, read independently with the
//! `parquet` crate and grouped naively here.

use crate::util::*;
use std::collections::{BTreeMap, BTreeSet};

struct Pulse {
    sensor: i64,
    time: i64,
    charge: f64,
    aux: f64,
}

fn close(got: f64, want: f64, what: &str) {
    let tol = 1e-6 * want.abs().max(1.0);
    assert!((got - want).abs() <= tol, "{what}: got {got}, want {want}");
}

fn stage_params(m: &serde_json::Value, column: &str) -> Vec<serde_json::Value> {
    let x = m["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "x")
        .unwrap();
    let col = x["columns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == column)
        .unwrap();
    col["encoding"]["stages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn icecube_cache_matches_source_rows() {
    let dir = Dir::new();
    gen_icecube(&dir, 3, 150);
    dsc(
        dir.path(),
        &icecube_args("cache", &["--shard-size", "200KiB"]),
    )
    .ok();
    let cache = dir.join("cache");
    let m = manifest(&cache);
    let (samples, order) = read_cache(&cache);

    // Source, grouped naively: every pulse of every file, by event, in time order (stable).
    let mut events: BTreeMap<i64, Vec<Pulse>> = BTreeMap::new();
    for i in 1..=3 {
        let t = Table::read(&dir.join(&format!("data/train/batch_{i}.parquet")));
        let (ids, sensors, times) = (t.i64s("event_id"), t.i64s("sensor_id"), t.i64s("time"));
        let (charge, aux) = (t.f64s("charge"), t.f64s("auxiliary"));
        for r in 0..t.rows() {
            events.entry(ids[r]).or_default().push(Pulse {
                sensor: sensors[r],
                time: times[r],
                charge: charge[r].unwrap(),
                aux: aux[r].unwrap(),
            });
        }
    }
    for pulses in events.values_mut() {
        pulses.sort_by_key(|p| p.time);
    }
    let geometry: BTreeMap<i64, [f64; 3]> =
        std::fs::read_to_string(dir.join("data/sensor_geometry.csv"))
            .unwrap()
            .lines()
            .skip(1)
            .map(|l| {
                let f: Vec<f64> = l.split(',').map(|v| v.parse().unwrap()).collect();
                (f[0] as i64, [f[1], f[2], f[3]])
            })
            .collect();
    let meta = Table::read(&dir.join("data/train_meta.parquet"));
    let targets: BTreeMap<i64, (f64, f64)> = meta
        .i64s("event_id")
        .into_iter()
        .zip(meta.f64s("azimuth").into_iter().zip(meta.f64s("zenith")))
        .map(|(k, (a, z))| (k, (a.unwrap(), z.unwrap())))
        .collect();

    // Completeness and disjointness: every event stored exactly once (read_cache asserts once).
    assert_eq!(
        samples.keys().copied().collect::<BTreeSet<_>>(),
        events.keys().copied().collect()
    );
    let val = order.get("val").map_or(0, Vec::len);
    assert!(
        val > 0 && val < samples.len() / 4,
        "val split of {val} contexts"
    );

    let l = 128;
    let time_stage = &stage_params(&m, "time")[0];
    let (mean, std) = (
        time_stage["mean"].as_f64().unwrap(),
        time_stage["std"].as_f64().unwrap(),
    );
    let vocab: Vec<i64> = m["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "sensor_id")
        .unwrap()["columns"][0]["encoding"]["vocabulary"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let train_sensors: BTreeSet<i64> = events
        .iter()
        .filter(|(k, _)| samples[k].split == "train")
        .flat_map(|(_, p)| p.iter().map(|p| p.sensor))
        .collect();
    assert_eq!(
        vocab,
        train_sensors.into_iter().collect::<Vec<_>>(),
        "vocabulary = train values, ascending"
    );

    let mut truncated = 0;
    for (key, pulses) in &events {
        let s = &samples[key];
        let kept = pulses.len().min(l);
        truncated += usize::from(pulses.len() > l);
        assert_eq!(s.tensors["length"], vec![kept as f64], "length of {key}");
        assert_eq!(s.tensors["full_length"], vec![pulses.len() as f64]);
        let x = &s.tensors["x"];
        let codes = &s.tensors["sensor_id"];
        assert_eq!(x.len(), l * 6);
        for (t, p) in pulses.iter().take(kept).enumerate() {
            let xyz = geometry[&p.sensor];
            let row = &x[t * 6..t * 6 + 6];
            for k in 0..3 {
                assert_eq!(
                    row[k],
                    f64::from(xyz[k] as f32),
                    "event {key} step {t} geometry {k}"
                );
            }
            close(row[3], (p.time as f64 - mean) / std, "time zscore");
            close(row[4], p.charge.ln_1p(), "charge log1p");
            assert_eq!(row[5], p.aux, "auxiliary");
            let code = codes[t] as i64;
            match vocab.binary_search(&p.sensor) {
                Ok(i) => assert_eq!(code, 2 + i as i64, "sensor code"),
                Err(_) => assert_eq!(code, 1, "unknown sensor code"),
            }
        }
        assert!(
            x[kept * 6..].iter().all(|&v| v == 0.0),
            "x padding of {key}"
        );
        assert!(
            codes[kept..].iter().all(|&v| v == 0.0),
            "code padding of {key}"
        );
        let (az, zen) = targets[key];
        assert_eq!(
            s.tensors["y"],
            vec![f64::from(az as f32), f64::from(zen as f32)]
        );
    }
    assert_eq!(
        m["summary"]["contexts_truncated"].as_u64().unwrap(),
        truncated as u64
    );
    assert!(truncated > 0, "the sample data has sequences longer than L");
    assert!(
        m["shards"].as_array().unwrap().len() > 2,
        "small --shard-size gives several shards"
    );
}

#[test]
fn truncate_tail_keeps_the_last_rows() {
    let dir = Dir::new();
    gen_icecube(&dir, 1, 100);
    let mut args = icecube_args("cache", &["--truncate", "tail"]);
    let at = args.iter().position(|a| *a == "--max-len").unwrap();
    args[at + 1] = "16";
    dsc(dir.path(), &args).ok();
    let (samples, _) = read_cache(&dir.join("cache"));
    let t = Table::read(&dir.join("data/train/batch_1.parquet"));
    let (ids, charge) = (t.i64s("event_id"), t.f64s("charge"));
    let mut by_event: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
    for (k, c) in ids.iter().zip(charge) {
        by_event.entry(*k).or_default().push(c.unwrap());
    }
    let mut checked = 0;
    for (k, charges) in by_event.iter().filter(|(_, c)| c.len() > 16) {
        let x = &samples[k].tensors["x"];
        let tail = &charges[charges.len() - 16..];
        for (t, c) in tail.iter().enumerate() {
            close(x[t * 6 + 4], c.ln_1p(), "tail charge");
        }
        checked += 1;
    }
    assert!(checked > 10);
}

/// The scattered layout: customers' rows spread over files, nulls, strings, timestamps.
#[test]
fn scattered_sequences_match_source_rows() {
    let dir = Dir::new();
    gen_sequences(&dir, 300, 3);
    let run = dsc(
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
            "ts=zscore",
            "--nan",
            "zero",
            "--empty-contexts",
            "keep",
            "--val-fraction",
            "0.2",
            "--max-len",
            "64",
            "--out",
            "cache",
            "--json",
        ],
    );
    let report: serde_json::Value = serde_json::from_str(&run.ok()).unwrap();
    assert!(report["summary"]["contexts_without_rows"].as_u64().unwrap() > 0);
    assert!(
        report["summary"]["values_filled"].as_u64().unwrap() > 0,
        "null amounts and ages were filled"
    );
    let cache = dir.join("cache");
    let m = manifest(&cache);
    let (samples, _) = read_cache(&cache);

    struct Tx {
        ts: i64,
        file: usize,
        row: usize,
        amount: Option<f64>,
        items: f64,
        discount: f64,
        refund: f64,
        ts_s: f64,
        merchant: Option<String>,
        channel: Option<String>,
    }
    let mut by_customer: BTreeMap<i64, Vec<Tx>> = BTreeMap::new();
    let mut files: Vec<_> = std::fs::read_dir(dir.join("seq/transactions"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut files_per_customer: BTreeMap<i64, BTreeSet<usize>> = BTreeMap::new();
    for (fi, f) in files.iter().enumerate() {
        let t = Table::read(f);
        let ids = t.i64s("customer_id");
        let ts = t.ticks("ts");
        let (amount, items, discount) = (t.f64s("amount"), t.f64s("items"), t.f64s("discount"));
        let (refund, ts_s) = (t.f64s("is_refund"), t.f64s("ts"));
        let (merchant, channel) = (t.strings("merchant_category"), t.strings("channel"));
        for r in 0..t.rows() {
            files_per_customer.entry(ids[r]).or_default().insert(fi);
            by_customer.entry(ids[r]).or_default().push(Tx {
                ts: ts[r].unwrap(),
                file: fi,
                row: r,
                amount: amount[r],
                items: items[r].unwrap(),
                discount: discount[r].unwrap(),
                refund: refund[r].unwrap(),
                ts_s: ts_s[r].unwrap(),
                merchant: merchant[r].clone(),
                channel: channel[r].clone(),
            });
        }
    }
    assert!(
        files_per_customer.values().any(|f| f.len() > 1),
        "rows are scattered across files"
    );
    for txs in by_customer.values_mut() {
        txs.sort_by_key(|t| (t.ts, t.file, t.row));
    }
    let column = |tensor: &str, name: &str| -> serde_json::Value {
        let t = m["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == tensor)
            .unwrap();
        t["columns"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()["encoding"]
            .clone()
    };
    let amount_enc = column("x", "amount");
    let (amin, amax) = (
        amount_enc["stages"][0]["min"].as_f64().unwrap(),
        amount_enc["stages"][0]["max"].as_f64().unwrap(),
    );
    assert_eq!(amount_enc["fill"].as_f64(), Some(0.0));
    let ts_enc = column("x", "ts");
    let (tmean, tstd) = (
        ts_enc["stages"][0]["mean"].as_f64().unwrap(),
        ts_enc["stages"][0]["std"].as_f64().unwrap(),
    );
    let vocab = |name: &str| -> Vec<String> {
        column(name, name)["vocabulary"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    let (merchants, channels) = (vocab("merchant_category"), vocab("channel"));
    let code_of = |vocab: &[String], v: &Option<String>| match v {
        None => 0.0,
        Some(s) => vocab
            .iter()
            .position(|x| x == s)
            .map_or(1.0, |i| 2.0 + i as f64),
    };

    let customers = Table::read(&dir.join("seq/customers.parquet"));
    let ids = customers.i64s("customer_id");
    let (churned, ltv) = (customers.f64s("churned"), customers.f64s("lifetime_value"));
    let (age, tenure) = (customers.f64s("age"), customers.f64s("tenure_years"));
    assert_eq!(
        samples.len(),
        ids.len(),
        "every customer is stored, empty ones too"
    );
    let mut empty = 0;
    for (i, id) in ids.iter().enumerate() {
        let s = &samples[id];
        assert_eq!(
            s.tensors["y"],
            vec![churned[i].unwrap(), f64::from(ltv[i].unwrap() as f32)]
        );
        let c = &s.tensors["c"];
        assert_eq!(c[0], age[i].map_or(0.0, |a| a), "age (null filled with 0)");
        assert_eq!(c[1], f64::from(tenure[i].unwrap() as f32));
        let txs = by_customer.get(id).map(Vec::as_slice).unwrap_or(&[]);
        empty += usize::from(txs.is_empty());
        let kept = txs.len().min(64);
        assert_eq!(s.tensors["length"], vec![kept as f64]);
        let x = &s.tensors["x"];
        for (t, tx) in txs.iter().take(kept).enumerate() {
            let row = &x[t * 5..t * 5 + 5];
            match tx.amount {
                Some(a) => close(row[0], (a - amin) / (amax - amin), "amount minmax"),
                None => assert_eq!(row[0], 0.0, "null amount filled with 0"),
            }
            assert_eq!(row[1], tx.items);
            assert_eq!(row[2], tx.discount);
            assert_eq!(row[3], tx.refund);
            close(row[4], (tx.ts_s - tmean) / tstd, "ts zscore");
            assert_eq!(
                s.tensors["merchant_category"][t],
                code_of(&merchants, &tx.merchant)
            );
            assert_eq!(s.tensors["channel"][t], code_of(&channels, &tx.channel));
        }
        assert!(x[kept * 5..].iter().all(|&v| v == 0.0));
    }
    assert!(
        empty > 0,
        "customers without transactions are kept as empty sequences"
    );
}

/// `--max-len` beyond the longest sequence pads to the longest, not to `--max-len`: the cache is
/// the one compiled without it, byte for byte; a `--max-len` below the longest still cuts.
#[test]
fn a_max_len_beyond_the_longest_sequence_pads_only_to_the_longest() {
    let dir = Dir::new();
    gen_sequences(&dir, 300, 2);
    let run = |out: &str, extra: &[&str]| {
        let mut args = sequences_args(out);
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        dsc(dir.path(), &args).ok();
    };
    run("natural", &[]);
    run("huge", &["--max-len", "100000"]);
    run("cut", &["--max-len", "8"]);
    let longest = manifest(&dir.join("natural"))["max_len"].as_u64().unwrap();
    assert!(longest > 8 && longest < 100_000, "longest {longest}");
    assert_eq!(manifest(&dir.join("huge"))["max_len"], longest);
    assert!(
        tree(&dir.join("natural")) == tree(&dir.join("huge")),
        "--max-len past the longest sequence changed the cache"
    );
    assert_eq!(manifest(&dir.join("cut"))["max_len"], 8);
}

/// A join table longer than the compile counts per joined row (65,536 rows), read by index
/// (dense ids, no null keys, no longer than the bucket): the statistics and the stored values
/// are those of the joined rows.
#[test]
fn a_join_table_of_many_rows_gives_the_joined_values() {
    use arrow_array::{ArrayRef, Float64Array, Int64Array};
    use std::sync::Arc;
    let dir = Dir::new();
    let sites = 70_000i64;
    let rows = 140_000i64;
    // Each row visits site (row * 7919) mod 70000, whose height is site / 1000.
    let site: Vec<i64> = (0..rows).map(|r| (r * 7919) % sites).collect();
    let height = |s: i64| s as f64 / 1000.0;
    let col = |v: Vec<i64>| -> ArrayRef { Arc::new(Int64Array::from(v)) };
    write_parquet(
        &dir.join("visits.parquet"),
        vec![
            ("walker", col((0..rows).map(|r| r / 70).collect())),
            ("step", col((0..rows).collect())),
            ("site", col(site.clone())),
        ],
    );
    write_parquet(
        &dir.join("sites.parquet"),
        vec![
            ("site", col((0..sites).collect())),
            (
                "height",
                Arc::new(Float64Array::from_iter_values((0..sites).map(height))),
            ),
        ],
    );
    let args = [
        "compile",
        "visits.parquet",
        "--key",
        "walker",
        "--order-by",
        "step",
        "--join",
        "sites.parquet",
        "--on",
        "site",
        "--features",
        "height",
        "--val-fraction",
        "0",
        "--out",
        "cache",
    ];
    dsc(dir.path(), &args).ok();
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("cache/stats.json")).unwrap()).unwrap();
    let column = stats["splits"][0]["columns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "height")
        .unwrap();
    assert_eq!(column["count"], rows);
    let mut heights: Vec<f64> = site.iter().map(|&s| height(s)).collect();
    heights.sort_by(f64::total_cmp);
    // numpy's linear rule, as the compile states it.
    let linear = |q: f64| {
        let h = (heights.len() - 1) as f64 * q;
        let k = h.floor() as usize;
        match heights.get(k + 1) {
            Some(next) => heights[k] + (h - k as f64) * (next - heights[k]),
            None => heights[k],
        }
    };
    for quantile in column["numeric"]["quantiles"].as_array().unwrap() {
        let q = quantile["q"].as_f64().unwrap();
        assert_eq!(
            quantile["value"].as_f64().unwrap(),
            linear(q),
            "quantile {q}"
        );
    }
    let (samples, _) = read_cache(&dir.join("cache"));
    let stored = &samples[&0].tensors["x"];
    for (t, &h) in stored.iter().take(70).enumerate() {
        close(
            h,
            height(site[t]),
            "walker 0's stored heights, in step order",
        );
    }
}

/// Each kind of numeric column (floats with null, NaN, ±inf and values past f32; floats under
/// one stage and under two; integers with and without nulls; times, which are scaled; booleans;
/// a joined column with a NaN in its table) stores, row by row, its chain's value of the row as
/// f32, or the NaN policy's fill where that is not finite: the encoder's loops per kind and
/// chain give what one row at a time gives. Every fill is counted.
#[test]
fn every_kind_of_column_stores_its_encoding_of_each_row() {
    use arrow_array::{
        ArrayRef, BooleanArray, Float64Array, Int64Array, TimestampMillisecondArray,
    };
    use std::sync::Arc;
    let dir = Dir::new();
    let n = 240usize;
    // Context r / 6 (6 rows each), rows in step order.
    let wave = |r: usize, k: f64| ((r as f64 * k).sin() * 50.0).round() / 4.0;
    let f: Vec<Option<f64>> = (0..n)
        .map(|r| match r % 17 {
            3 => None,
            5 => Some(f64::NAN),
            8 => Some(f64::INFINITY),
            9 => Some(f64::NEG_INFINITY),
            11 => Some(1e39), // past f32 under identity
            _ => Some(wave(r, 0.7)),
        })
        .collect();
    let g: Vec<f64> = (0..n)
        .map(|r| {
            if r % 13 == 4 {
                -3.0
            } else {
                wave(r, 1.3).abs()
            }
        })
        .collect(); // log1p of -3: NaN
    let h: Vec<f64> = (0..n).map(|r| wave(r, 0.31) * 1e3).collect();
    let c: Vec<f64> = (0..n)
        .map(|r| {
            if r % 29 == 7 {
                -1.0
            } else {
                wave(r, 2.1).abs()
            }
        })
        .collect(); // log1p of -1: -inf
    let i: Vec<i64> = (0..n).map(|r| (r as i64 * 37) % 101 - 50).collect();
    let j: Vec<Option<i64>> = (0..n)
        .map(|r| (r % 7 != 2).then_some(r as i64 * 3))
        .collect();
    let ts: Vec<i64> = (0..n)
        .map(|r| 1_700_000_000_000 + r as i64 * 61_000)
        .collect();
    let b: Vec<bool> = (0..n).map(|r| r % 3 == 0).collect();
    let site: Vec<i64> = (0..n).map(|r| (r as i64 * 7) % 20).collect();
    let height = |s: i64| if s == 13 { f64::NAN } else { s as f64 * 0.5 };
    let arc = |a: ArrayRef| a;
    write_parquet(
        &dir.join("rows.parquet"),
        vec![
            (
                "key",
                arc(Arc::new(Int64Array::from_iter_values(
                    (0..n).map(|r| r as i64 / 6),
                ))),
            ),
            (
                "step",
                arc(Arc::new(Int64Array::from_iter_values(
                    (0..n).map(|r| r as i64),
                ))),
            ),
            ("f", arc(Arc::new(Float64Array::from(f.clone())))),
            ("g", arc(Arc::new(Float64Array::from(g.clone())))),
            ("h", arc(Arc::new(Float64Array::from(h.clone())))),
            ("c", arc(Arc::new(Float64Array::from(c.clone())))),
            ("i", arc(Arc::new(Int64Array::from(i.clone())))),
            ("j", arc(Arc::new(Int64Array::from(j.clone())))),
            (
                "ts",
                arc(Arc::new(TimestampMillisecondArray::from(ts.clone()))),
            ),
            ("b", arc(Arc::new(BooleanArray::from(b.clone())))),
            ("site", arc(Arc::new(Int64Array::from(site.clone())))),
        ],
    );
    write_parquet(
        &dir.join("sites.parquet"),
        vec![
            ("site", arc(Arc::new(Int64Array::from_iter_values(0..20)))),
            (
                "height",
                arc(Arc::new(Float64Array::from_iter_values(
                    (0..20).map(height),
                ))),
            ),
        ],
    );
    let features = ["f", "g", "h", "c", "i", "j", "ts", "b", "height"];
    let report = dsc(
        dir.path(),
        &[
            "compile",
            "rows.parquet",
            "--key",
            "key",
            "--order-by",
            "step",
            "--join",
            "sites.parquet",
            "--on",
            "site",
            "--features",
            &features.join(","),
            "--encode",
            "g=log1p,zscore",
            "--encode",
            "h=zscore",
            "--encode",
            "c=log1p",
            "--encode",
            "i=minmax",
            "--encode",
            "ts=zscore",
            "--nan",
            "zero",
            "--val-fraction",
            "0",
            "--max-len",
            "6",
            "--out",
            "cache",
            "--json",
        ],
    )
    .ok();
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    let m = manifest(&dir.join("cache"));
    // Each column's chain as the manifest states it, applied in f64 as the encoder does.
    let chain = |column: &str| {
        let stages = stage_params(&m, column);
        move |x: f64| {
            stages.iter().fold(x, |v, s| {
                let p = |k: &str| s[k].as_f64().unwrap();
                match s["op"].as_str().unwrap() {
                    "identity" => v,
                    "log1p" => v.ln_1p(),
                    "zscore" => (v - p("mean")) / p("std"),
                    "minmax" => (v - p("min")) / (p("max") - p("min")),
                    other => panic!("stage {other}: {s}"),
                }
            })
        }
    };
    let stored = |raw: Option<f64>, chain: &dyn Fn(f64) -> f64| -> (f64, bool) {
        match raw.filter(|x| x.is_finite()).map(chain) {
            Some(v) if v.is_finite() && (v as f32).is_finite() => (f64::from(v as f32), false),
            _ => (0.0, true),
        }
    };
    let raws: Vec<Box<dyn Fn(usize) -> Option<f64>>> = vec![
        Box::new(|r| f[r]),
        Box::new(|r| Some(g[r])),
        Box::new(|r| Some(h[r])),
        Box::new(|r| Some(c[r])),
        Box::new(|r| Some(i[r] as f64)),
        Box::new(|r| j[r].map(|x| x as f64)),
        Box::new(|_| None), // times: checked apart, their unit scaled
        Box::new(|r| Some(if b[r] { 1.0 } else { 0.0 })),
        Box::new(|r| Some(height(site[r]))),
    ];
    let (samples, _) = read_cache(&dir.join("cache"));
    let mut fills = 0u64;
    let mut kinds_filled = BTreeSet::new();
    for (key, sample) in &samples {
        let x = &sample.tensors["x"];
        for t in 0..6 {
            let r = *key as usize * 6 + t;
            for (k, name) in features.iter().enumerate() {
                let got = x[t * features.len() + k];
                if *name == "ts" {
                    // Minutes apart, standardised: the row's rank, centred and scaled.
                    let want = (r as f64 - (n - 1) as f64 / 2.0) * 61.0;
                    let spread = (((n * n - 1) as f64) / 12.0).sqrt() * 61.0;
                    close(got, want / spread, &format!("ts of row {r}"));
                    continue;
                }
                let (want, filled) = stored(raws[k](r), &chain(name));
                fills += u64::from(filled);
                if filled {
                    kinds_filled.insert(*name);
                }
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{name} of row {r}: {got} != {want}"
                );
            }
        }
    }
    assert_eq!(
        kinds_filled,
        BTreeSet::from(["c", "f", "g", "height", "j"]),
        "every kind of bad value was met"
    );
    assert_eq!(report["summary"]["values_filled"], fills, "{report}");
}

/// A joined column's statistics come from how many rows read each joined row where the join
/// table is small beside the rows, and value by value where it is not: the same counts of null,
/// NaN and inf values, the same quantiles, and the same moments but for the last bits. The
/// join's key, categorical, is counted from the same counts: the same statistics and vocabulary.
#[test]
fn a_joined_columns_statistics_are_the_same_counted_or_gathered() {
    let dir = Dir::new();
    gen_icecube(&dir, 2, 150);
    let mut read: BTreeMap<i64, u64> = BTreeMap::new();
    for f in files_in(&dir, "data/train") {
        for s in Table::read(&dir.join(&f)).i64s("sensor_id") {
            *read.entry(s).or_insert(0) += 1;
        }
    }
    let mut busiest: Vec<(u64, i64)> = read.iter().map(|(&s, &n)| (n, s)).collect();
    busiest.sort_unstable_by(|a, b| b.cmp(a));
    // The three most read sensors' x: missing, NaN and infinite.
    let bad: Vec<(i64, &str, u64)> = busiest[..3]
        .iter()
        .zip(["", "NaN", "inf"])
        .map(|(&(n, s), x)| (s, x, n))
        .collect();
    let csv = std::fs::read_to_string(dir.join("data/sensor_geometry.csv")).unwrap();
    let mut lines: Vec<String> = csv.lines().map(String::from).collect();
    let mut last = 0;
    for line in lines.iter_mut().skip(1) {
        let (id, rest) = line.split_once(',').unwrap();
        let id: i64 = id.parse().unwrap();
        last = last.max(id);
        if let Some((_, x, _)) = bad.iter().find(|(s, _, _)| *s == id) {
            let (_, yz) = rest.split_once(',').unwrap();
            *line = format!("{id},{x},{yz}");
        }
    }
    std::fs::write(dir.join("data/small.csv"), lines.join("\n") + "\n").unwrap();
    // Sensors no row reads make the table longer than the rows read through it.
    let more = (1..=40_000).map(|i| format!("{},1.0,2.0,3.0", last + i));
    let long: Vec<String> = lines.iter().cloned().chain(more).collect();
    std::fs::write(dir.join("data/long.csv"), long.join("\n") + "\n").unwrap();
    let stats = |table: &str| -> serde_json::Value {
        let args: Vec<&str> = icecube_args(table, &["--nan", "zero", "--quiet"])
            .into_iter()
            .map(|a| match a {
                "data/sensor_geometry.csv" if table == "small" => "data/small.csv",
                "data/sensor_geometry.csv" => "data/long.csv",
                a => a,
            })
            .collect();
        dsc(dir.path(), &args).ok();
        serde_json::from_slice(&std::fs::read(dir.join(table).join("stats.json")).unwrap()).unwrap()
    };
    let (counted, gathered) = (stats("small"), stats("long"));
    // The small table's joined columns are encoded together, each row's joined row found once;
    // the long table's row by row through the lookup. The same stored values, NaN policy
    // included.
    let shards =
        |table: &str| -> BTreeMap<String, Vec<u8>> { tree(&dir.join(table).join("shards")) };
    assert!(
        shards("small") == shards("long"),
        "the same shards through either join"
    );
    let column = |s: &serde_json::Value, split: usize, name: &str| {
        s["splits"][split]["columns"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()
            .clone()
    };
    let all_x = column(&counted, 0, "x");
    assert_eq!(
        [&all_x["nulls"], &all_x["nan"], &all_x["inf"]].map(|v| v.as_u64().unwrap()),
        [bad[0].2, bad[1].2, bad[2].2],
        "each bad value counted once per row that reads it"
    );
    let sensor = |table: &str| {
        let m = manifest(&dir.join(table));
        m["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "sensor_id")
            .unwrap()["columns"][0]["encoding"]
            .clone()
    };
    assert_eq!(sensor("small"), sensor("long"), "the same vocabulary");
    for split in 0..3 {
        assert_eq!(
            column(&counted, split, "sensor_id"),
            column(&gathered, split, "sensor_id"),
            "sensor_id of split {split}"
        );
        for name in ["x", "y", "z", "auxiliary"] {
            let (a, b) = (
                column(&counted, split, name),
                column(&gathered, split, name),
            );
            for key in ["count", "nulls", "nan", "inf"] {
                assert_eq!(a[key], b[key], "{name} {key} of split {split}");
            }
            let (a, b) = (&a["numeric"], &b["numeric"]);
            for key in ["min", "max", "quantiles", "histogram"] {
                assert_eq!(a[key], b[key], "{name} {key} of split {split}");
            }
            for key in ["mean", "std"] {
                let (a, b) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
                assert!(
                    (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                    "{name} {key} of split {split}: {a} counted, {b} gathered"
                );
            }
        }
    }
}
