//! The reference vectors made by running mostlyai-engine 2.7.3 (`tests/vectors/mostlyai/`,
//! see its README): every digit of the digit table and every quantile / bin case.

use super::digits::{self, MAX_DECIMAL, MIN_DECIMAL};
use super::numeric;
use super::quantiles::{closest_observation, find_distinct_bins, linspace01, Branch};
use serde_json::Value;
use std::path::PathBuf;

fn vectors() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors/mostlyai")
}

struct DigitRow {
    line: usize,
    x: f64,
    ge_1e50: bool,
    nan: bool,
    neg: bool,
    digits: String,
}

fn digit_rows() -> Vec<DigitRow> {
    let path = vectors().join("digits.csv");
    let mut reader = csv::Reader::from_path(&path).expect("digits.csv opens");
    let mut rows = Vec::new();
    for (i, rec) in reader.records().enumerate() {
        let rec = rec.expect("csv row");
        // f64_bits is authoritative for float rows; int64 rows go through f64 as the engine does.
        let x = if &rec[1] == "int64" {
            rec[3].parse::<i64>().expect("int64") as f64
        } else {
            f64::from_bits(u64::from_str_radix(&rec[2], 16).expect("hex bits"))
        };
        if &rec[1] == "int64" {
            assert_eq!(x.to_bits(), u64::from_str_radix(&rec[2], 16).unwrap());
        }
        rows.push(DigitRow {
            line: i + 2,
            x,
            ge_1e50: &rec[5] == "1",
            nan: &rec[6] == "1",
            neg: &rec[7] == "1",
            digits: rec[8].to_string(),
        });
    }
    assert_eq!(rows.len(), 20_000);
    rows
}

fn window(d: &digits::Digits) -> String {
    (MIN_DECIMAL..=MAX_DECIMAL)
        .rev()
        .map(|p| char::from(b'0' + d.at(p)))
        .collect()
}

#[test]
fn every_digit_of_the_digit_table_equals_the_engines() {
    let mut checked = 0;
    for r in digit_rows().iter().filter(|r| !r.ge_1e50) {
        let d = digits::split(r.x);
        assert_eq!(
            (d.nan, d.neg, window(&d)),
            (r.nan, r.neg, r.digits.clone()),
            "digits.csv line {}: {:e}",
            r.line,
            r.x
        );
        checked += 1;
    }
    assert_eq!(checked, 20_000 - 189);
}

/// dsc's documented behaviour for `|x| >= 1e50`: the digits of `|x| mod 10^19` of the shortest
/// form, which are all zero (a double has at most 17 significant digits); `neg` by sign. This is
/// also what the engine's sliding window produces.
#[test]
fn values_from_1e50_split_to_zero_digits() {
    let big: Vec<DigitRow> = digit_rows().into_iter().filter(|r| r.ge_1e50).collect();
    assert_eq!(big.len(), 189);
    for r in &big {
        let d = digits::split(r.x);
        assert!(!d.nan);
        assert_eq!(d.neg, r.x < 0.0, "line {}", r.line);
        assert_eq!(window(&d), "0".repeat(39), "line {}", r.line);
        assert_eq!((r.neg, r.digits.as_str()), (d.neg, "0".repeat(39).as_str()));
    }
}

#[derive(Clone, Copy, PartialOrd, Debug)]
enum Num {
    I(i64),
    F(f64),
}

/// Equality of the exact value: floats by their bits, so that `-0.0` and `0.0` differ.
impl PartialEq for Num {
    fn eq(&self, other: &Num) -> bool {
        match (self, other) {
            (Num::I(a), Num::I(b)) => a == b,
            (Num::F(a), Num::F(b)) => a.to_bits() == b.to_bits(),
            _ => false,
        }
    }
}

fn nums(v: &Value) -> Vec<Num> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| match x.as_i64() {
            Some(i) if !x.is_f64() => Num::I(i),
            _ => Num::F(x.as_f64().expect("number")),
        })
        .collect()
}

fn cases() -> Vec<Value> {
    let text = std::fs::read_to_string(vectors().join("quantiles.json")).expect("quantiles.json");
    let v: Value = serde_json::from_str(&text).expect("json");
    v["cases"].as_array().expect("cases").clone()
}

#[test]
fn every_quantile_and_bin_case_equals_the_engines() {
    let cases = cases();
    assert_eq!(cases.len(), 34);
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let x = nums(&case["x"]);
        let mut sorted = x.clone();
        sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let q = closest_observation(&sorted, &linspace01(1001));
        assert_eq!(q, nums(&case["quantiles_1001"]), "{name}: quantiles");
        for n in [100usize, 10] {
            let want = &case[format!("find_distinct_bins_{n}")];
            let (bins, branch, iterations) = find_distinct_bins(&x, n, 1000);
            let branch = match branch {
                Branch::FewDistinct => "few_distinct",
                Branch::Exact => "exact",
                Branch::CutToNPlus1 => "cut_to_n_plus_1",
                Branch::FallbackNMax => "fallback_n_max",
            };
            assert_eq!(bins, nums(&want["bins"]), "{name}: bins for n={n}");
            assert_eq!(branch, want["branch"], "{name}: branch for n={n}");
            assert_eq!(
                iterations as u64,
                want["iterations"].as_u64().unwrap(),
                "{name}: iterations for n={n}"
            );
        }
        check_binned_reduce(name, case);
    }
}

/// The engine's binned path: contiguous parts analysed as partitions, then reduced.
fn check_binned_reduce(name: &str, case: &Value) {
    let want = &case["binned_reduce"];
    let x = nums(&case["x"]);
    let vals: Vec<f64> = x
        .iter()
        .map(|v| match *v {
            Num::I(i) => i as f64,
            Num::F(f) => f,
        })
        .collect();
    let ints: Option<Vec<i64>> = x
        .iter()
        .map(|v| match *v {
            Num::I(i) => Some(i),
            Num::F(_) => None,
        })
        .collect();
    let mut partials = Vec::new();
    let mut start = 0u32;
    for len in want["parts"].as_array().unwrap() {
        let len = len.as_u64().unwrap() as u32;
        let rows: Vec<u32> = (start..start + len).collect();
        partials.push(numeric::analyze(&vals, ints.as_deref(), &rows).expect("non-empty part"));
        start += len;
    }
    let refs: Vec<&numeric::Partial> = partials.iter().collect();
    let stats = numeric::reduce_as(&refs, true);
    let json = Value::Object(stats.to_json());
    for key in ["min_decimal", "cardinalities", "codes", "bins"] {
        assert_eq!(json[key], want[key], "{name}: binned_reduce {key}");
    }
}
