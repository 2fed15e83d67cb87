//! Sample record-linkage data: people's records encoded as Bloom filters, the way
//! privacy-preserving record linkage shares them.
//!
//! Each record has a first and a last name built from syllables, a year of birth, and `bloom`:
//! a string of `0` and `1`, the Bloom filter (`BITS` bits, `HASHES` hash functions) of the
//! character 2-grams of `_first_last_` (lower case, `_` marking the ends). What the filter
//! hides is learnable from it (each gram sets the same bits in every record, up to collisions),
//! which is the point of the attack such data is exposed to: recovering the 2-grams of the names
//! from the bits.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, StringArray};
use arrow_schema::DataType;

use super::{create_dir, schema, GenError, GenSummary, ParquetSink, Rng};

/// Bits per Bloom filter.
pub const BITS: usize = 256;
/// Hash functions per 2-gram.
pub const HASHES: u64 = 2;

const FIRST: [&str; 12] = [
    "an", "bel", "car", "dan", "el", "fi", "gre", "ha", "jo", "ka", "li", "mar",
];
const SECOND: [&str; 10] = ["a", "en", "ie", "o", "us", "ina", "el", "et", "on", "ra"];
const LAST: [&str; 12] = [
    "berg", "dorf", "hol", "kamp", "lind", "mann", "ner", "rich", "sen", "stein", "wald", "zel",
];
const STREAM: u64 = 0x11C_0001;

/// What to generate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkageOptions {
    /// Records.
    pub records: usize,
    /// Seed: the same options give byte-identical files.
    pub seed: u64,
}

impl Default for LinkageOptions {
    fn default() -> Self {
        LinkageOptions {
            records: 4000,
            seed: 0,
        }
    }
}

/// The Bloom filter of `text`'s 2-grams: for each gram, `HASHES` bits from a seeded mix of its
/// bytes.
pub fn bloom(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut bits = [false; BITS];
    for gram in chars.windows(2) {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for c in gram {
            h = (h ^ u64::from(*c)).wrapping_mul(0x0100_0000_01b3);
        }
        for k in 0..HASHES {
            let mixed =
                dsc_format::rng::mix64(h.wrapping_add(k.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
            bits[(mixed % BITS as u64) as usize] = true;
        }
    }
    bits.iter().map(|&b| if b { '1' } else { '0' }).collect()
}

/// Writes `out/records.parquet`: `uid`, `first_name`, `last_name`, `yob`, `bloom`.
pub fn generate(out: &Path, opts: &LinkageOptions) -> Result<GenSummary, GenError> {
    if opts.records == 0 {
        let reason = format!("need a record: {opts:?}");
        return Err(GenError::InvalidOptions { reason });
    }
    create_dir(out)?;
    let mut rng = Rng::new(opts.seed, STREAM);
    let (mut uids, mut firsts, mut lasts, mut years, mut blooms) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for uid in 0..opts.records {
        let first = format!(
            "{}{}",
            FIRST[rng.below(FIRST.len() as u64) as usize],
            SECOND[rng.below(SECOND.len() as u64) as usize]
        );
        let last = format!(
            "{}{}",
            FIRST[rng.below(FIRST.len() as u64) as usize],
            LAST[rng.below(LAST.len() as u64) as usize]
        );
        blooms.push(bloom(&format!("_{first}_{last}_")));
        uids.push(uid as i64);
        firsts.push(first);
        lasts.push(last);
        years.push(1930 + rng.below(80) as i64);
    }
    let mut sink = ParquetSink::create(
        &out.join("records.parquet"),
        schema(&[
            ("uid", DataType::Int64, false),
            ("first_name", DataType::Utf8, false),
            ("last_name", DataType::Utf8, false),
            ("yob", DataType::Int64, false),
            ("bloom", DataType::Utf8, false),
        ]),
    )?;
    sink.write(vec![
        Arc::new(Int64Array::from(uids)) as ArrayRef,
        Arc::new(StringArray::from(firsts)),
        Arc::new(StringArray::from(lasts)),
        Arc::new(Int64Array::from(years)),
        Arc::new(StringArray::from(blooms)),
    ])?;
    Ok(GenSummary {
        files: vec![sink.finish()?],
        rows: opts.records as u64,
        contexts: opts.records as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gram_sets_the_same_bits_in_every_filter() {
        let a = bloom("_ab_");
        assert_eq!(a.len(), BITS);
        assert!(a.chars().all(|c| c == '0' || c == '1'));
        // "_ab_" holds the grams of "_a" and of "b_": its bits are theirs together.
        let (x, y) = (bloom("_a"), bloom("b_"));
        let union: String = x
            .chars()
            .zip(y.chars())
            .zip(bloom("ab").chars())
            .map(|((p, q), r)| {
                if p == '1' || q == '1' || r == '1' {
                    '1'
                } else {
                    '0'
                }
            })
            .collect();
        assert_eq!(a, union);
    }
}
