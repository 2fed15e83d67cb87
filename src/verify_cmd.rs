//! `dsc verify`: check a cache; exit 1 naming every problem.

use crate::args::VerifyArgs;
use crate::output::outln;
use dsc_format::verify::{verify, Depth};
use serde::Serialize;

#[derive(Serialize)]
struct Report {
    cache: std::path::PathBuf,
    ok: bool,
    depth: &'static str,
    shards_checked: usize,
    bytes_read: u64,
    problems: Vec<String>,
}

pub fn run(a: VerifyArgs) -> anyhow::Result<u8> {
    let depth = if a.quick { Depth::Quick } else { Depth::Full };
    let report = verify(&a.cache, depth, |_, _| {})?;
    let problems: Vec<String> = report.problems.iter().map(ToString::to_string).collect();
    let ok = problems.is_empty();
    if a.json {
        crate::output::print_json(&Report {
            cache: a.cache.clone(),
            ok,
            depth: if a.quick { "quick" } else { "full" },
            shards_checked: report.shards_checked,
            bytes_read: report.bytes_read,
            problems: problems.clone(),
        })?;
    } else if ok {
        outln!(
            "ok: {} shards, {} checked{}",
            report.shards_checked,
            crate::output::bytes(report.bytes_read),
            if a.quick {
                " (quick: sizes and headers only)"
            } else {
                ""
            }
        );
    } else {
        for p in &problems {
            eprintln!("dsc: {p}");
        }
        eprintln!(
            "dsc: {} problem(s) in {}",
            problems.len(),
            a.cache.display()
        );
    }
    Ok(if ok { 0 } else { crate::EXIT_PROBLEMS })
}
