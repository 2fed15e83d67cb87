//! `dsc digit-split`: the engine-exact digit split of raw f64 values, timed (for the side-by-side
//! benchmark against mostlyai-engine's `split_sub_columns_digit`).

use crate::args::DigitSplitArgs;
use crate::output::outln;
use anyhow::{bail, Context as _};
use dsc_compiler::mostlyai::digits::{self, MAX_DECIMAL, MIN_DECIMAL};

use rayon::prelude::*;
use std::time::Instant;

/// Bytes written per value: `nan`, `neg`, then E18..E-20.
const WIDTH: usize = 2 + (MAX_DECIMAL - MIN_DECIMAL + 1) as usize;

pub fn run(a: DigitSplitArgs) -> anyhow::Result<u8> {
    let bytes =
        std::fs::read(&a.input).with_context(|| format!("cannot read {}", a.input.display()))?;
    if bytes.len() % 8 != 0 {
        bail!(
            "{}: {} bytes is not a whole number of float64 values",
            a.input.display(),
            bytes.len()
        );
    }
    let values: Vec<f64> = bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    if let Some(i) = values.iter().position(|x| x.is_infinite()) {
        bail!(
            "{}: value {i} is infinite; the engine cannot split infinities",
            a.input.display()
        );
    }
    let mut out = vec![0u8; values.len() * WIDTH];
    let start = Instant::now();
    out.par_chunks_mut(WIDTH * 4096)
        .zip(values.par_chunks(4096))
        .for_each(|(dst, src)| {
            for (row, &x) in dst.chunks_exact_mut(WIDTH).zip(src) {
                let d = digits::split(x);
                row[0] = u8::from(d.nan);
                row[1] = u8::from(d.neg);
                let digits: &mut [u8; 39] = (&mut row[2..]).try_into().expect("41 bytes a row");
                d.write_all(digits);
            }
        });
    let seconds = start.elapsed().as_secs_f64();
    if let Some(path) = &a.out {
        std::fs::write(path, &out).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if a.json {
        crate::output::outln!("{{\"values\": {}, \"seconds\": {seconds}}}", values.len());
    } else {
        outln!("split {} values in {:.1} ms", values.len(), seconds * 1e3);
    }
    Ok(0)
}
