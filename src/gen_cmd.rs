//! `dsc gen`: write a sample data set.

use crate::args::{Dataset, GenArgs};
use crate::output::outln;
use crate::output::thousands;
use dsc_gen::{icecube, linkage, microbiome, sequences, series};
use serde::Serialize;

#[derive(Serialize)]
struct Report {
    dataset: &'static str,
    out: std::path::PathBuf,
    files: Vec<std::path::PathBuf>,
    rows: u64,
    contexts: u64,
}

pub fn run(a: GenArgs) -> anyhow::Result<u8> {
    let (name, summary) = match a.dataset {
        Dataset::Icecube => (
            "icecube",
            icecube::generate(
                &a.out,
                &icecube::IcecubeOptions {
                    files: a.files,
                    events_per_file: a.events_per_file,
                    seed: a.seed,
                    ..Default::default()
                },
            )?,
        ),
        Dataset::Sequences => (
            "sequences",
            sequences::generate(
                &a.out,
                &sequences::SequencesOptions {
                    customers: a.customers,
                    files: a.files,
                    seed: a.seed,
                    keys: a.key_type.into(),
                    layout: a.layout.into(),
                },
            )?,
        ),
        Dataset::Series => {
            let (min, max) = a
                .steps
                .split_once(':')
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                .ok_or_else(|| anyhow::anyhow!("--steps {:?}: expected MIN:MAX", a.steps))?;
            (
                "series",
                series::generate(
                    &a.out,
                    &series::SeriesOptions {
                        series: a.series,
                        min_len: min,
                        max_len: max,
                        seed: a.seed,
                    },
                )?,
            )
        }
        Dataset::Linkage => (
            "linkage",
            linkage::generate(
                &a.out,
                &linkage::LinkageOptions {
                    records: a.records.unwrap_or(4000),
                    seed: a.seed,
                },
            )?,
        ),
        Dataset::Microbiome => (
            "microbiome",
            microbiome::generate(
                &a.out,
                &microbiome::MicrobiomeOptions {
                    samples: a.records.unwrap_or(600),
                    length: 150,
                    seed: a.seed,
                },
            )?,
        ),
    };
    if a.json {
        crate::output::print_json(&Report {
            dataset: name,
            out: a.out,
            files: summary.files,
            rows: summary.rows,
            contexts: summary.contexts,
        })?;
    } else {
        outln!(
            "wrote {name} sample data to {}: {} files, {} rows, {} contexts",
            a.out.display(),
            summary.files.len(),
            thousands(summary.rows),
            thousands(summary.contexts)
        );
    }
    Ok(0)
}
