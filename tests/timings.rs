//! `dsc compile` says where its time went: the stages' wall seconds and every phase's
//! thread-seconds, in `--json` for scripts and `--timings` for people.

use crate::util::*;

const PHASES: [&str; 13] = [
    "footers",
    "decode",
    "spill",
    "load",
    "grouping",
    "ordering",
    "join",
    "statistics",
    "encode",
    "shuffle",
    "write",
    "checksums",
    "commit",
];

#[test]
fn the_compile_reports_its_phases_in_json_and_as_a_table() {
    let dir = Dir::new();
    gen_icecube(&dir, 3, 300);
    let out = dsc(dir.path(), &icecube_args("cache", &["--json"])).ok();
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let phases: Vec<(String, f64)> = serde_json::from_value(report["phases"].clone()).unwrap();
    let names: Vec<&str> = phases.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, PHASES, "every phase, in the order the data flows");
    let of = |name: &str| phases.iter().find(|(n, _)| n == name).unwrap().1;
    // The README's compile does all of these; each takes some time, none a negative one.
    for name in [
        "decode",
        "spill",
        "load",
        "grouping",
        "statistics",
        "encode",
        "write",
    ] {
        assert!(of(name) > 0.0, "{name}: {phases:?}");
    }
    assert!(phases.iter().all(|(_, s)| s.is_finite() && *s >= 0.0));
    // Thread-seconds: never more than every thread busy for the whole compile.
    let threads = report["threads"].as_u64().unwrap() as f64;
    let seconds = report["seconds"].as_f64().unwrap();
    let sum: f64 = phases.iter().map(|(_, s)| s).sum();
    assert!(
        threads >= 1.0 && sum <= threads * seconds * 1.05,
        "{sum} > {threads} x {seconds}"
    );
    let stages: Vec<(String, f64)> = serde_json::from_value(report["timings"].clone()).unwrap();
    let stage_names: Vec<&str> = stages.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(stage_names, ["read", "statistics", "write", "commit"]);
    // The commit runs on one thread: its phase is its stage (to the nanosecond).
    assert!(
        (of("commit") - stages[3].1).abs() < 2e-9,
        "{phases:?} {stages:?}"
    );

    let text = dsc(dir.path(), &icecube_args("cache2", &["--timings", "-q"])).ok();
    let table = &text[text.find("where the time went").expect(&text)..];
    for name in [
        "read",
        "statistics",
        "write",
        "commit",
        "decode",
        "encode",
        "sum",
    ] {
        assert!(
            table.lines().any(|l| l.trim_start().starts_with(name)),
            "{name} missing:\n{table}"
        );
    }
    assert!(table.contains('%'), "{table}");
}

/// Each stage of a partitioned compile reports the phases it ran, in the same shape.
#[test]
fn each_stage_of_a_partitioned_compile_reports_its_phases() {
    let dir = Dir::new();
    gen_icecube(&dir, 3, 300);
    let mut worked = Vec::new();
    for stage in ["scan", "fit", "write"] {
        let args = icecube_args("cache", &["--partition", "0/1", "--stage", stage, "--json"]);
        let report: serde_json::Value = serde_json::from_str(&dsc(dir.path(), &args).ok()).unwrap();
        let phases: Vec<(String, f64)> = serde_json::from_value(report["phases"].clone()).unwrap();
        assert_eq!(
            phases.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            PHASES,
            "{stage}"
        );
        let busy: Vec<String> = phases
            .into_iter()
            .filter(|(_, s)| *s > 0.0)
            .map(|(n, _)| n)
            .collect();
        worked.push((stage, busy));
    }
    let did = |stage: &str, phase: &str| {
        worked
            .iter()
            .any(|(s, b)| *s == stage && b.iter().any(|p| p == phase))
    };
    assert!(did("scan", "decode") && did("scan", "spill"), "{worked:?}");
    assert!(did("fit", "load") && did("fit", "statistics"), "{worked:?}");
    assert!(
        did("write", "encode") && did("write", "write"),
        "{worked:?}"
    );
    // A stage does only its own work.
    assert!(
        !did("scan", "encode") && !did("fit", "write") && !did("write", "decode"),
        "{worked:?}"
    );
    dsc(dir.path(), &["merge", "cache", "-q"]).ok();
}
