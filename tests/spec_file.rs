//! The same compile as a spec file: `--print-spec` output fed back through `--spec` gives the
//! same cache, and flags override the file.

use crate::util::*;

#[test]
fn printed_spec_round_trips_to_the_same_cache() {
    let dir = Dir::new();
    gen_icecube(&dir, 2, 100);
    let printed = dsc(dir.path(), &icecube_args("cache", &["--print-spec"])).ok();
    assert!(printed.contains("key = \"event_id\""), "{printed}");
    assert!(
        printed.contains("[encode]") && printed.contains("charge = \"log1p\""),
        "{printed}"
    );
    assert!(!dir.join("cache").exists(), "--print-spec compiles nothing");
    std::fs::write(dir.join("dsc.toml"), &printed).unwrap();
    dsc(dir.path(), &icecube_args("a", &[])).ok();
    dsc(dir.path(), &["compile", "--spec", "dsc.toml", "--out", "b"]).ok();
    assert_eq!(tree(&dir.join("a")), tree(&dir.join("b")));

    dsc(
        dir.path(),
        &["compile", "--spec", "dsc.toml", "--seed", "1", "--out", "c"],
    )
    .ok();
    assert_eq!(manifest(&dir.join("c"))["spec"]["seed"], 1);
}

#[test]
fn a_bad_spec_file_is_reported_with_its_line() {
    let dir = Dir::new();
    std::fs::write(
        dir.join("dsc.toml"),
        "rows = [\"a.parquet\"]\nkey = \"id\"\nmax_lenn = 3\n",
    )
    .unwrap();
    let err = dsc(dir.path(), &["compile", "--spec", "dsc.toml", "--out", "c"]).fails(2);
    assert!(
        err.contains("dsc.toml: invalid spec") && err.contains("max_lenn"),
        "{err}"
    );
}

#[test]
fn help_teaches_with_an_example() {
    let dir = Dir::new();
    let help = dsc(dir.path(), &["compile", "--help"]).ok();
    assert!(
        help.contains("Example:") && help.contains("--encode"),
        "{help}"
    );
    assert!(help.lines().all(|l| l.chars().count() <= 100));
    for command in ["gen", "compile", "inspect", "show", "verify", "report"] {
        let help = dsc(dir.path(), &[command, "--help"]).ok();
        assert!(
            help.contains("Example:"),
            "dsc {command} --help has an example:\n{help}"
        );
        assert!(
            help.lines().all(|l| l.chars().count() <= 100),
            "dsc {command} --help fits 100 columns:\n{help}"
        );
    }
}

/// Issue 29, item 4: the compiler names an option by its spec key (a Rust caller matches on
/// it), and each front end spells it its own way: the command line as its flag, a spec-file
/// problem the same way, never a flag inside the library.
#[test]
fn a_bad_option_is_named_by_its_key_and_spelled_as_a_flag_on_the_command_line() {
    let dir = Dir::new();
    gen_icecube(&dir, 1, 50);
    let rows = dir.join("data/train/batch_*.parquet");
    let spec: dsc_compiler::CompileSpec = serde_json::from_value(serde_json::json!({
        "rows": [rows.display().to_string()],
        "key": "event_id",
        "features": ["charge"],
        "max_len": 0,
    }))
    .unwrap();
    let opts = dsc_compiler::CompileOptions {
        out: dir.join("lib"),
        force: false,
        max_memory: None,
        storage: dsc_compiler::Storage::Hot,
        progress: &dsc_compiler::NoProgress,
    };
    match dsc_compiler::compile(&spec, &opts) {
        Err(dsc_compiler::CompileError::Spec(e)) => {
            assert_eq!(
                (e.key, e.problem.as_str()),
                ("max_len", "must be at least 1")
            );
            assert_eq!(e.to_string(), "`max_len` must be at least 1");
        }
        other => panic!("expected a spec error, got {other:?}"),
    }
    let bad_len = [
        "compile",
        "data/train/batch_*.parquet",
        "--key",
        "event_id",
        "--features",
        "charge",
        "--max-len",
        "0",
        "--out",
        "c",
    ];
    let err = dsc(dir.path(), &bad_len).fails(2);
    assert!(err.contains("dsc: --max-len must be at least 1"), "{err}");
    let mut no_context = bad_len;
    no_context[6..8].copy_from_slice(&["--split-by", "x"]);
    let err = dsc(dir.path(), &no_context).fails(2);
    assert!(
        err.contains("dsc: --split-by reads a column of the context table: give --context"),
        "{err}"
    );
    assert!(!err.contains('`'), "every key spelled as a flag: {err}");
}

/// Issue 52 C17: a spec file's errors name the file and its keys as it spells them, never a
/// command-line flag (`--max-len must be at least 1`, `unknown field --featurez`, `missing
/// field --on` before), and a value the file gives that a flag overrides is the flag's.
#[test]
fn a_spec_files_errors_name_the_file_and_its_keys() {
    let dir = Dir::new();
    gen_icecube(&dir, 1, 50);
    let base = "rows = [\"data/train/batch_1.parquet\"]\nkey = \"event_id\"\n";
    for (body, expected) in [
        (
            "max_len = 0\n",
            "bad.toml: \"max_len\" = 0: must be at least 1",
        ),
        (
            "featurez = [\"x\"]\n",
            "unknown field \"featurez\", expected one of \"rows\"",
        ),
        ("[[joins]]\nfile = \"j.csv\"\n", "missing field \"on\""),
        (
            "val_fraction = nan\n",
            "bad.toml: invalid spec file: \"val_fraction\" = NaN",
        ),
    ] {
        std::fs::write(dir.join("bad.toml"), format!("{base}{body}")).unwrap();
        let err = dsc(dir.path(), &["compile", "--spec", "bad.toml", "--out", "c"]).fails(2);
        assert!(err.contains(expected), "{body}: {err}");
        assert!(
            err.contains("bad.toml") && !err.contains("--"),
            "{body}: {err}"
        );
    }
    // A flag's bad value is the flag's, whatever the file says.
    std::fs::write(dir.join("bad.toml"), format!("{base}max_len = 8\n")).unwrap();
    let err = dsc(
        dir.path(),
        &[
            "compile",
            "--spec",
            "bad.toml",
            "--max-len",
            "0",
            "--out",
            "c",
        ],
    )
    .fails(2);
    assert!(err.contains("--max-len must be at least 1"), "{err}");
}

/// Issue 52 C18: `dsc bench` given a loader option it does not take says which loader options
/// it takes (clap's tip was to pass the flag as a value after `--`).
#[test]
fn bench_names_the_loader_options_it_takes() {
    let dir = Dir::new();
    for flag in ["--world-size", "--max-seqs", "--stride", "--series-window"] {
        let err = dsc(dir.path(), &["bench", "cache", flag, "2"]).fails(2);
        assert!(
            err.contains(&format!(
                "dsc bench takes no {flag}: it is a loader option of `dsc order`"
            )) && err.contains("dsc bench takes --split, --seed")
                && err.contains("--batch-size")
                && !err.contains("tip:"),
            "{err}"
        );
    }
}
