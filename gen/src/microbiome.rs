//! Sample microbiome data: each sample a set of amplicon sequence variants (ASVs), a DNA string
//! and a read count each, and the body site it was taken from.
//!
//! Every site has a pool of characteristic ASVs, and all sites share a pool of common ones. A
//! sample draws most of its ASVs from its site's pool and the rest from the common pool, each
//! read with a few point errors, with log-normal counts. The site is learnable from the
//! sequences (its characteristic ones), not from any single position, and not from the counts.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, StringArray};
use arrow_schema::DataType;

use super::{create_dir, schema, GenError, GenSummary, ParquetSink, Rng};

/// Values of `site_name`, by `site`.
pub const SITES: [&str; 4] = ["gut", "oral", "skin", "vaginal"];

const BASES: [char; 4] = ['A', 'C', 'G', 'T'];
const STREAM_POOLS: u64 = 0x31C_0001;
const STREAM_SAMPLE: u64 = 0x31C_1000_0000;

/// What to generate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MicrobiomeOptions {
    /// Samples (contexts).
    pub samples: usize,
    /// Characters per ASV.
    pub length: usize,
    /// Seed: the same options give byte-identical files.
    pub seed: u64,
}

impl Default for MicrobiomeOptions {
    fn default() -> Self {
        MicrobiomeOptions {
            samples: 600,
            length: 150,
            seed: 0,
        }
    }
}

fn random_dna(rng: &mut Rng, len: usize) -> String {
    (0..len).map(|_| BASES[rng.below(4) as usize]).collect()
}

/// Writes `out/asvs.parquet` (one row per ASV of a sample: `sample_id`, `asv`, `count`) and
/// `out/samples.parquet` (one row per sample: `sample_id`, `site`, `site_name`).
pub fn generate(out: &Path, opts: &MicrobiomeOptions) -> Result<GenSummary, GenError> {
    if opts.samples == 0 || opts.length < 8 {
        let reason = format!("need a sample and ASVs of at least 8 bases: {opts:?}");
        return Err(GenError::InvalidOptions { reason });
    }
    create_dir(out)?;
    let mut pools = Rng::new(opts.seed, STREAM_POOLS);
    let site_pools: Vec<Vec<String>> = (0..SITES.len())
        .map(|_| {
            (0..30)
                .map(|_| random_dna(&mut pools, opts.length))
                .collect()
        })
        .collect();
    let common: Vec<String> = (0..60)
        .map(|_| random_dna(&mut pools, opts.length))
        .collect();
    let (mut ids, mut asvs, mut counts) = (Vec::new(), Vec::new(), Vec::new());
    let (mut sample_ids, mut sites, mut names) = (Vec::new(), Vec::new(), Vec::new());
    for s in 0..opts.samples {
        let mut rng = Rng::new(opts.seed, STREAM_SAMPLE + s as u64);
        let site = rng.below(SITES.len() as u64) as usize;
        sample_ids.push(s as i64);
        sites.push(site as i64);
        names.push(SITES[site]);
        let n = 8 + rng.below(25) as usize;
        for _ in 0..n {
            let pool = if rng.bernoulli(0.55) {
                &site_pools[site]
            } else {
                &common
            };
            let base = &pool[rng.below(pool.len() as u64) as usize];
            // Sequencing errors: about 2 % of the bases read wrong.
            let read: String = base
                .chars()
                .map(|c| {
                    if rng.bernoulli(0.02) {
                        BASES[rng.below(4) as usize]
                    } else {
                        c
                    }
                })
                .collect();
            ids.push(s as i64);
            asvs.push(read);
            counts.push(rng.lognormal(40.0, 1.2).round().max(1.0) as i64);
        }
    }
    let rows = ids.len() as u64;
    let mut sink = ParquetSink::create(
        &out.join("asvs.parquet"),
        schema(&[
            ("sample_id", DataType::Int64, false),
            ("asv", DataType::Utf8, false),
            ("count", DataType::Int64, false),
        ]),
    )?;
    sink.write(vec![
        Arc::new(Int64Array::from(ids)) as ArrayRef,
        Arc::new(StringArray::from(asvs)),
        Arc::new(Int64Array::from(counts)),
    ])?;
    let asvs = sink.finish()?;
    let mut table = ParquetSink::create(
        &out.join("samples.parquet"),
        schema(&[
            ("sample_id", DataType::Int64, false),
            ("site", DataType::Int64, false),
            ("site_name", DataType::Utf8, false),
        ]),
    )?;
    table.write(vec![
        Arc::new(Int64Array::from(sample_ids)) as ArrayRef,
        Arc::new(Int64Array::from(sites)),
        Arc::new(StringArray::from(names)),
    ])?;
    Ok(GenSummary {
        files: vec![asvs, table.finish()?],
        rows,
        contexts: opts.samples as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_writes_the_same_bytes_and_every_asv_is_dna_of_the_length() {
        let dir = tempfile::tempdir().unwrap();
        let opts = MicrobiomeOptions {
            samples: 20,
            length: 30,
            seed: 5,
        };
        let a = generate(&dir.path().join("a"), &opts).unwrap();
        let b = generate(&dir.path().join("b"), &opts).unwrap();
        for (x, y) in a.files.iter().zip(&b.files) {
            assert_eq!(std::fs::read(x).unwrap(), std::fs::read(y).unwrap());
        }
        let t = crate::test_support::Table::read(&a.files[0]);
        let asvs = t.strs("asv");
        assert_eq!(asvs.len() as u64, a.rows);
        assert!(asvs.iter().all(|s| {
            let s = s.as_deref().unwrap();
            s.len() == 30 && s.chars().all(|c| "ACGT".contains(c))
        }));
    }
}
