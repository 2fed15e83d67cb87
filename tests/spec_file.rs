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
