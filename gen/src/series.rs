//! Sample long series: sensors read at regular steps, for forecasting on windows cut from them.
//!
//! Each series has its own period, amplitude, phase and level. At step `t`
//!
//! - `load` is a slow random walk around 1 plus a periodic component (a machine's duty cycle);
//! - `temp` follows the period with a lag, plus noise;
//! - `value` = level + amplitude · sin(2πt / period + phase) + 0.5 · load(t − 1) + an AR(1)
//!   noise (coefficient 0.6, σ 0.15).
//!
//! So the next steps of `value` are predictable from the recent steps of all three columns, better
//! than by repeating the last value (the seasonal swing and the response to load move it), but
//! not exactly (the noise).

use std::path::Path;

use arrow_array::{ArrayRef, Float32Array, Int64Array, StringArray};
use arrow_schema::DataType;

use super::{create_dir, schema, GenError, GenSummary, ParquetSink, Rng, ROW_GROUP_ROWS};

/// Values of `kind` in the sensors table.
pub const KINDS: [&str; 3] = ["pump", "fan", "press"];

// One stream for the series' parameters, one per series for its steps.
const STREAM_PARAMS: u64 = 0x5E5_0001;
const STREAM_SERIES: u64 = 0x5E5_1000_0000;

/// What to generate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeriesOptions {
    /// Series (contexts).
    pub series: usize,
    /// Shortest and longest series, in steps.
    pub min_len: usize,
    /// Longest series, in steps.
    pub max_len: usize,
    /// Seed: the same options give byte-identical files.
    pub seed: u64,
}

impl Default for SeriesOptions {
    fn default() -> Self {
        SeriesOptions {
            series: 200,
            min_len: 500,
            max_len: 3000,
            seed: 0,
        }
    }
}

/// Writes `out/readings.parquet` (one row per series and step: `series_id`, `t`, `value`,
/// `load`, `temp`; each series' rows together, by step) and `out/sensors.parquet` (one row
/// per series: `series_id`, `kind`).
pub fn generate(out: &Path, opts: &SeriesOptions) -> Result<GenSummary, GenError> {
    if opts.series == 0 || opts.min_len == 0 || opts.min_len > opts.max_len {
        let reason = format!("need a series and 0 < min_len <= max_len: {opts:?}");
        return Err(GenError::InvalidOptions { reason });
    }
    create_dir(out)?;
    let mut params = Rng::new(opts.seed, STREAM_PARAMS);
    let readings = out.join("readings.parquet");
    let mut sink = ParquetSink::create(
        &readings,
        schema(&[
            ("series_id", DataType::Int64, false),
            ("t", DataType::Int64, false),
            ("value", DataType::Float32, false),
            ("load", DataType::Float32, false),
            ("temp", DataType::Float32, false),
        ]),
    )?;
    let mut columns = Columns::default();
    let mut kinds = Vec::with_capacity(opts.series);
    let mut rows = 0u64;
    for s in 0..opts.series {
        let len = opts.min_len + params.below((opts.max_len - opts.min_len + 1) as u64) as usize;
        let period = params.uniform(12.0, 60.0);
        let amplitude = params.uniform(0.5, 2.0);
        let phase = params.uniform(0.0, std::f64::consts::TAU);
        let level = params.normal() * 2.0;
        kinds.push(KINDS[params.below(KINDS.len() as u64) as usize]);
        let mut rng = Rng::new(opts.seed, STREAM_SERIES + s as u64);
        let (mut walk, mut noise, mut last_load) = (0.0f64, 0.0f64, 1.0f64);
        for t in 0..len {
            let angle = std::f64::consts::TAU * t as f64 / period + phase;
            walk = (walk + 0.05 * rng.normal()).clamp(-1.0, 1.0);
            let load = 1.0 + 0.3 * walk + 0.4 * (angle * 0.5).sin().max(0.0);
            let temp = 20.0 + 3.0 * (angle - 0.8).sin() + 0.3 * rng.normal();
            noise = 0.6 * noise + 0.15 * rng.normal();
            let value = level + amplitude * angle.sin() + 0.5 * last_load + noise;
            last_load = load;
            columns.push(s as i64, t as i64, value, load, temp);
            if columns.len() == ROW_GROUP_ROWS {
                rows += columns.flush(&mut sink)?;
            }
        }
    }
    rows += columns.flush(&mut sink)?;
    let readings = sink.finish()?;
    let mut sensors = ParquetSink::create(
        &out.join("sensors.parquet"),
        schema(&[
            ("series_id", DataType::Int64, false),
            ("kind", DataType::Utf8, false),
        ]),
    )?;
    sensors.write(vec![
        std::sync::Arc::new(Int64Array::from_iter_values(0..opts.series as i64)) as ArrayRef,
        std::sync::Arc::new(StringArray::from(kinds)),
    ])?;
    Ok(GenSummary {
        files: vec![readings, sensors.finish()?],
        rows,
        contexts: opts.series as u64,
    })
}

/// Rows not yet written.
#[derive(Default)]
struct Columns {
    ids: Vec<i64>,
    steps: Vec<i64>,
    values: Vec<f32>,
    loads: Vec<f32>,
    temps: Vec<f32>,
}

impl Columns {
    fn push(&mut self, id: i64, t: i64, value: f64, load: f64, temp: f64) {
        self.ids.push(id);
        self.steps.push(t);
        self.values.push(value as f32);
        self.loads.push(load as f32);
        self.temps.push(temp as f32);
    }

    fn len(&self) -> usize {
        self.ids.len()
    }

    /// Writes the rows held as one batch; returns how many.
    fn flush(&mut self, sink: &mut ParquetSink) -> Result<u64, GenError> {
        let n = self.len() as u64;
        if n == 0 {
            return Ok(0);
        }
        let arc = |a: ArrayRef| a;
        sink.write(vec![
            arc(std::sync::Arc::new(Int64Array::from(std::mem::take(
                &mut self.ids,
            )))),
            arc(std::sync::Arc::new(Int64Array::from(std::mem::take(
                &mut self.steps,
            )))),
            arc(std::sync::Arc::new(Float32Array::from(std::mem::take(
                &mut self.values,
            )))),
            arc(std::sync::Arc::new(Float32Array::from(std::mem::take(
                &mut self.loads,
            )))),
            arc(std::sync::Arc::new(Float32Array::from(std::mem::take(
                &mut self.temps,
            )))),
        ])?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_writes_the_same_bytes_and_every_series_is_whole_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let opts = SeriesOptions {
            series: 5,
            min_len: 40,
            max_len: 90,
            seed: 3,
        };
        let a = generate(&dir.path().join("a"), &opts).unwrap();
        let b = generate(&dir.path().join("b"), &opts).unwrap();
        for (x, y) in a.files.iter().zip(&b.files) {
            assert_eq!(std::fs::read(x).unwrap(), std::fs::read(y).unwrap());
        }
        let t = crate::test_support::Table::read(&a.files[0]);
        let (ids, steps) = (t.i64s("series_id"), t.i64s("t"));
        assert_eq!(t.rows() as u64, a.rows);
        for w in ids.windows(2).zip(steps.windows(2)) {
            let ((i0, i1), (t0, t1)) = ((w.0[0], w.0[1]), (w.1[0], w.1[1]));
            assert!(i1 == i0 && t1 == t0 + 1 || i1 == i0 + 1 && t1 == 0, "{w:?}");
        }
        let lens: Vec<usize> = (0..5)
            .map(|s| ids.iter().filter(|&&i| i == s).count())
            .collect();
        assert!(lens.iter().all(|&l| (40..=90).contains(&l)), "{lens:?}");
    }
}
