//! Sample data in the layout of the Kaggle IceCube "Neutrinos in Deep Ice" competition.
//!
//! `train/batch_{i}.parquet` holds one row per sensor pulse, events contiguous and `event_id`
//! ascending across all files; `train_meta.parquet` holds one row per event with its row range
//! and its direction (the targets); `sensor_geometry.csv` holds the detector. The physics is a
//! caricature, but enough of it is kept for a model to learn direction: each event is a muon track
//! with a random direction, hits lie near the track and pulse times follow the Cherenkov arrival
//! time along it, plus scattering delays and uncorrelated noise pulses.

use std::f64::consts::TAU;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int16Array, Int64Array};
use arrow_schema::DataType;
use rayon::prelude::*;

use super::{
    create_dir, schema, write_bytes, GenError, GenSummary, ParquetSink, Rng, ROW_GROUP_ROWS,
};

/// Strings in the detector: 78 on a hexagonal grid plus 8 DeepCore strings in its centre.
pub const STRINGS: usize = 86;
/// Digital optical modules (sensors) per string.
pub const DOMS_PER_STRING: usize = 60;
/// Sensors in the detector; `sensor_id` is in `0..SENSORS`.
pub const SENSORS: usize = STRINGS * DOMS_PER_STRING;

const REGULAR_STRINGS: usize = 78;
const STRING_SPACING_M: f64 = 125.0;
/// Speed of light in vacuum, m/ns: the muon's speed.
const C_M_PER_NS: f64 = 0.299_792_458;
/// tan of the Cherenkov angle in ice (refractive index 1.32): direct light reaches a sensor at
/// perpendicular distance `rho` from the track `rho * TAN_CHERENKOV / c` after the muon passes.
const TAN_CHERENKOV: f64 = 0.8588;
/// Fraction of pulses that are dark noise, unrelated to the track.
const NOISE_FRACTION: f64 = 0.2;
/// A track hit whose nearest sensor is further than this is outside the detector: noise instead.
const MAX_HIT_DISTANCE_M: f64 = 80.0;

// Separate streams keep the event ids, the geometry and each file independent of each other.
const STREAM_EVENT_IDS: u64 = 0x1CE_0001;
const STREAM_GEOMETRY: u64 = 0x1CE_0002;
const STREAM_FILE: u64 = 0x1CE_1000;

/// What to generate; see the module documentation for the layout.
#[derive(Debug, Clone, PartialEq)]
pub struct IcecubeOptions {
    /// Number of `train/batch_{i}.parquet` files.
    pub files: usize,
    /// Events in each batch file.
    pub events_per_file: usize,
    /// Seed: the same options give byte-identical files.
    pub seed: u64,
    /// Median pulses per event (log-normal).
    pub median_pulses: f64,
    /// Standard deviation of the logarithm of pulses per event: the tail's weight.
    pub sigma: f64,
    /// Cap on pulses per event.
    pub max_pulses: usize,
}

impl Default for IcecubeOptions {
    fn default() -> Self {
        IcecubeOptions {
            files: 4,
            events_per_file: 2000,
            seed: 0,
            median_pulses: 50.0,
            sigma: 0.9,
            max_pulses: 5000,
        }
    }
}

/// Writes `out/train/batch_{i}.parquet` (i in `1..=files`), `out/train_meta.parquet` and
/// `out/sensor_geometry.csv`. Batch files are generated in parallel, each from its own stream of
/// the seed, so the bytes do not depend on the thread count.
pub fn generate(out: &Path, opts: &IcecubeOptions) -> Result<GenSummary, GenError> {
    validate(opts)?;
    let train = out.join("train");
    create_dir(&train)?;
    let geometry = Detector::new();

    // Event ids are drawn up front, in one sequence, so that they ascend across files while each
    // file is still generated independently.
    let mut rng = Rng::new(opts.seed, STREAM_EVENT_IDS);
    let mut next_id = 1 + rng.below(64) as i64;
    let ids: Vec<i64> = (0..opts.files * opts.events_per_file)
        .map(|_| {
            let id = next_id;
            next_id += 1 + rng.below(32) as i64;
            id
        })
        .collect();

    let batches = ids
        .par_chunks(opts.events_per_file)
        .enumerate()
        .map(|(i, ids)| write_batch(&train, i + 1, ids, opts, &geometry))
        .collect::<Result<Vec<_>, _>>()?;

    let mut summary = GenSummary::default();
    let mut meta = Vec::with_capacity(ids.len());
    for (path, rows, part) in batches {
        summary.files.push(path);
        summary.rows += rows;
        meta.extend(part);
    }
    summary.contexts = meta.len() as u64;
    summary.files.push(write_meta(out, &meta)?);
    summary.files.push(write_geometry(out, &geometry)?);
    Ok(summary)
}

/// The sensor positions `[x, y, z]` in metres, indexed by `sensor_id`; the same for every seed,
/// as the detector is.
pub fn sensor_positions() -> Vec<[f64; 3]> {
    Detector::new().sensors
}

fn validate(o: &IcecubeOptions) -> Result<(), GenError> {
    let ok = o.files > 0 && o.events_per_file > 0 && o.max_pulses > 0;
    let ok = ok && o.median_pulses.is_finite() && o.median_pulses > 0.0;
    if ok && o.sigma.is_finite() && o.sigma >= 0.0 {
        return Ok(());
    }
    let reason = format!(
        "need files, events_per_file, max_pulses >= 1, median_pulses > 0 and sigma >= 0: {o:?}"
    );
    Err(GenError::InvalidOptions { reason })
}

/// The detector: sensor positions and a lookup from a point to the sensor nearest to it.
#[derive(Debug)]
struct Detector {
    /// Indexed by sensor id; along each string z decreases with the id.
    sensors: Vec<[f64; 3]>,
    /// The string nearest to the centre of each `CELL_M` square of the horizontal plane.
    nearest_string: Vec<u8>,
}

const CELL_M: f64 = 10.0;
const GRID_HALF_M: f64 = 650.0;
const GRID_CELLS: usize = (2.0 * GRID_HALF_M / CELL_M) as usize;

impl Detector {
    fn new() -> Self {
        // Hexagonal grid points in axial coordinates, nearest to the centre first; the ordering
        // is on integers so the chosen 78 never depend on floating-point ties.
        let mut hex: Vec<(i64, i64, i64)> = (-6i64..=6)
            .flat_map(|a| (-6i64..=6).map(move |b| (a * a + a * b + b * b, a, b)))
            .collect();
        hex.sort_unstable();
        let mut rng = Rng::new(0, STREAM_GEOMETRY);
        let mut jitter = || rng.uniform(-4.0, 4.0);
        let mut xy: Vec<(f64, f64)> = hex[..REGULAR_STRINGS]
            .iter()
            .map(|&(_, a, b)| {
                let x = STRING_SPACING_M * (a as f64 + 0.5 * b as f64) + jitter();
                (x, STRING_SPACING_M * 0.75f64.sqrt() * b as f64 + jitter())
            })
            .collect();
        // DeepCore: a denser ring around the central string.
        xy.extend((0..STRINGS - REGULAR_STRINGS).map(|k| {
            let angle = (k as f64 + 0.5) * TAU / 8.0;
            (60.0 * angle.cos() + 10.0, 60.0 * angle.sin() - 30.0)
        }));
        let sensors = (0..SENSORS)
            .map(|id| {
                let (s, d) = (id / DOMS_PER_STRING, (id % DOMS_PER_STRING) as f64);
                let z = if s < REGULAR_STRINGS {
                    500.0 - d * 1000.0 / 59.0
                } else if d < 10.0 {
                    // DeepCore's veto modules sit above the dust layer, the rest densely below it.
                    190.0 - d * 10.0
                } else {
                    -150.0 - (d - 10.0) * 350.0 / 49.0
                };
                [xy[s].0, xy[s].1, z]
            })
            .collect();
        let nearest_string = (0..GRID_CELLS * GRID_CELLS)
            .map(|cell| {
                let cx = -GRID_HALF_M + ((cell % GRID_CELLS) as f64 + 0.5) * CELL_M;
                let cy = -GRID_HALF_M + ((cell / GRID_CELLS) as f64 + 0.5) * CELL_M;
                let d2 = |s: &usize| (xy[*s].0 - cx).powi(2) + (xy[*s].1 - cy).powi(2);
                (0..STRINGS)
                    .min_by(|a, b| d2(a).total_cmp(&d2(b)))
                    .unwrap_or(0) as u8
            })
            .collect();
        Detector {
            sensors,
            nearest_string,
        }
    }

    /// The sensor (approximately) nearest to `p`, and its distance.
    fn nearest(&self, p: [f64; 3]) -> (i16, f64) {
        let cell = |v: f64| (((v + GRID_HALF_M) / CELL_M).max(0.0) as usize).min(GRID_CELLS - 1);
        let first =
            self.nearest_string[cell(p[1]) * GRID_CELLS + cell(p[0])] as usize * DOMS_PER_STRING;
        let doms = &self.sensors[first..first + DOMS_PER_STRING];
        let i = doms
            .partition_point(|q| q[2] > p[2])
            .min(DOMS_PER_STRING - 1);
        let i = if i > 0 && doms[i - 1][2] - p[2] < (p[2] - doms[i][2]).abs() {
            i - 1
        } else {
            i
        };
        let dist = (0..3)
            .map(|k| (doms[i][k] - p[k]).powi(2))
            .sum::<f64>()
            .sqrt();
        ((first + i) as i16, dist)
    }
}

/// One pulse before sorting by time.
#[derive(Debug, Clone, Copy)]
struct Pulse {
    time: i64,
    sensor: i16,
    charge: f64,
    auxiliary: bool,
}

/// A `train_meta` row: batch id, event id, first and last row, azimuth, zenith.
type MetaRow = (i64, i64, i64, i64, f64, f64);

/// Writes `train/batch_{batch}.parquet` with the events `ids`; returns its path, its row count
/// and its `train_meta` rows.
fn write_batch(
    dir: &Path,
    batch: usize,
    ids: &[i64],
    opts: &IcecubeOptions,
    det: &Detector,
) -> Result<(PathBuf, u64, Vec<MetaRow>), GenError> {
    let mut rng = Rng::new(opts.seed, STREAM_FILE + batch as u64);
    let schema = schema(&[
        ("event_id", DataType::Int64, false),
        ("sensor_id", DataType::Int16, false),
        ("time", DataType::Int64, false),
        ("charge", DataType::Float64, false),
        ("auxiliary", DataType::Boolean, false),
    ]);
    let mut sink = ParquetSink::create(&dir.join(format!("batch_{batch}.parquet")), schema)?;
    let mut buf: Vec<(i64, Pulse)> = Vec::new();
    let mut meta = Vec::with_capacity(ids.len());
    let mut rows = 0u64;
    let mut event = Vec::new();
    for &id in ids {
        let n = rng.lognormal(opts.median_pulses, opts.sigma).round();
        let n = n.clamp(1.0, opts.max_pulses as f64) as u64;
        // The direction the neutrino came from, isotropic: cos(zenith) uniform.
        let azimuth = rng.uniform(0.0, TAU) % TAU;
        let zenith = rng.uniform(-1.0, 1.0).acos();
        simulate_event(&mut rng, det, n, azimuth, zenith, &mut event);
        event.sort_by_key(|p| p.time);
        let last = (rows + n - 1) as i64;
        meta.push((batch as i64, id, rows as i64, last, azimuth, zenith));
        rows += n;
        buf.extend(event.drain(..).map(|p| (id, p)));
        if buf.len() >= ROW_GROUP_ROWS {
            sink.write(pulse_columns(&std::mem::take(&mut buf)))?;
        }
    }
    if !buf.is_empty() {
        sink.write(pulse_columns(&buf))?;
    }
    Ok((sink.finish()?, rows, meta))
}

fn pulse_columns(rows: &[(i64, Pulse)]) -> Vec<ArrayRef> {
    let it = || rows.iter().map(|r| &r.1);
    vec![
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(Int16Array::from_iter_values(it().map(|p| p.sensor))),
        Arc::new(Int64Array::from_iter_values(it().map(|p| p.time))),
        Arc::new(Float64Array::from_iter_values(it().map(|p| p.charge))),
        Arc::new(BooleanArray::from_iter(it().map(|p| Some(p.auxiliary)))),
    ]
}

/// Appends `n` pulses of one track event to `out`.
fn simulate_event(
    rng: &mut Rng,
    det: &Detector,
    n: u64,
    azimuth: f64,
    zenith: f64,
    out: &mut Vec<Pulse>,
) {
    let (sz, cz, sa, ca) = (zenith.sin(), zenith.cos(), azimuth.sin(), azimuth.cos());
    // The muon travels away from where the neutrino came from; e1 and e2 span the plane
    // perpendicular to its track.
    let v = [-sz * ca, -sz * sa, -cz];
    let (e1, e2) = ([cz * ca, cz * sa, -sz], [-sa, ca, 0.0]);
    // A point the track passes through, inside the instrumented volume, at time t0.
    let r = 480.0 * rng.unit_f64().sqrt();
    let phi = rng.uniform(0.0, TAU);
    let p0 = [r * phi.cos(), r * phi.sin(), rng.uniform(-450.0, 450.0)];
    let t0 = rng.uniform(9_500.0, 11_500.0);
    for _ in 0..n {
        let mut hit = None;
        if !rng.bernoulli(NOISE_FRACTION) {
            // Light is seen along the track, mostly close to it.
            let s = rng.uniform(-600.0, 600.0);
            let rho = rng.exponential(35.0);
            let a = rng.uniform(0.0, TAU);
            let (c, d) = (rho * a.cos(), rho * a.sin());
            let q: [f64; 3] = std::array::from_fn(|k| p0[k] + s * v[k] + c * e1[k] + d * e2[k]);
            let (sensor, dist) = det.nearest(q);
            hit = (dist <= MAX_HIT_DISTANCE_M).then_some(sensor);
        }
        out.push(match hit {
            Some(sensor) => track_pulse(rng, det.sensors[sensor as usize], sensor, p0, t0, v),
            None => Pulse {
                time: rng.uniform(6_000.0, 20_000.0).round() as i64,
                sensor: rng.below(SENSORS as u64) as i16,
                charge: quantize_charge(rng.lognormal(0.9, 0.5)),
                auxiliary: rng.bernoulli(0.85),
            },
        });
    }
}

/// A pulse from the track's light at sensor `sensor` (at `x`): the Cherenkov arrival time plus a
/// scattering delay that grows with distance, and a charge that falls with it.
fn track_pulse(
    rng: &mut Rng,
    x: [f64; 3],
    sensor: i16,
    p0: [f64; 3],
    t0: f64,
    v: [f64; 3],
) -> Pulse {
    let rel: [f64; 3] = std::array::from_fn(|k| x[k] - p0[k]);
    let along = rel[0] * v[0] + rel[1] * v[1] + rel[2] * v[2];
    let rho = (rel.iter().map(|c| c * c).sum::<f64>() - along * along)
        .max(0.0)
        .sqrt();
    let time = t0 + (along + rho * TAN_CHERENKOV) / C_M_PER_NS;
    let time = time + rng.exponential(5.0 + 1.5 * rho) + 3.0 * rng.normal();
    let mut charge = rng.lognormal(0.5 + 3.0 * (-rho / 25.0).exp(), 0.7);
    // Occasional bright pulses (stochastic energy losses) give the charge its long tail.
    if rng.bernoulli(0.01) {
        charge *= rng.uniform(5.0, 50.0);
    }
    Pulse {
        time: time.round().max(0.0) as i64,
        sensor,
        charge: quantize_charge(charge),
        auxiliary: rng.bernoulli(0.15 + 0.5 * (rho / MAX_HIT_DISTANCE_M).min(1.0)),
    }
}

/// Charges in the real data are multiples of 0.025; dividing the count by 40 gives the double
/// nearest to that decimal, as a reader of the real files would see.
fn quantize_charge(charge: f64) -> f64 {
    (charge * 40.0).round().max(1.0) / 40.0
}

fn write_meta(out: &Path, meta: &[MetaRow]) -> Result<PathBuf, GenError> {
    let schema = schema(&[
        ("batch_id", DataType::Int64, false),
        ("event_id", DataType::Int64, false),
        ("first_pulse_index", DataType::Int64, false),
        ("last_pulse_index", DataType::Int64, false),
        ("azimuth", DataType::Float64, false),
        ("zenith", DataType::Float64, false),
    ]);
    let ints = |f: fn(&MetaRow) -> i64| -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(meta.iter().map(f)))
    };
    let floats = |f: fn(&MetaRow) -> f64| -> ArrayRef {
        Arc::new(Float64Array::from_iter_values(meta.iter().map(f)))
    };
    let mut sink = ParquetSink::create(&out.join("train_meta.parquet"), schema)?;
    sink.write(vec![
        ints(|r| r.0),
        ints(|r| r.1),
        ints(|r| r.2),
        ints(|r| r.3),
        floats(|r| r.4),
        floats(|r| r.5),
    ])?;
    sink.finish()
}

fn write_geometry(out: &Path, det: &Detector) -> Result<PathBuf, GenError> {
    let path = out.join("sensor_geometry.csv");
    let csv_err = |source| GenError::Csv {
        path: path.clone(),
        source,
    };
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["sensor_id", "x", "y", "z"])
        .map_err(csv_err)?;
    for (id, p) in det.sensors.iter().enumerate() {
        let [x, y, z] = p.map(|c| format!("{c:.2}"));
        w.write_record([id.to_string(), x, y, z]).map_err(csv_err)?;
    }
    let bytes = w.into_inner().map_err(|e| csv_err(e.into_error().into()))?;
    write_bytes(&path, &bytes)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use std::f64::consts::PI;

    use arrow_array::types::Int16Type;

    use super::super::test_support::{run, Table};
    use super::*;

    fn small(seed: u64) -> IcecubeOptions {
        IcecubeOptions {
            files: 3,
            events_per_file: 150,
            seed,
            ..IcecubeOptions::default()
        }
    }

    #[test]
    fn same_seed_gives_identical_bytes_whatever_the_threads() {
        let files = |seed, threads| run(threads, |dir| generate(dir, &small(seed)));
        let a = files(1, 2);
        assert_eq!(a, files(1, 1));
        assert_eq!(a.len(), 5);
        // Another seed changes every data file but not the detector.
        for (x, y) in a.iter().zip(&files(2, 2)) {
            assert_eq!(x.0, y.0);
            assert_eq!(
                x.0.ends_with("sensor_geometry.csv"),
                x.1 == y.1,
                "{:?}",
                x.0
            );
        }
    }

    #[test]
    fn files_satisfy_the_documented_invariants() {
        let dir = tempfile::tempdir().unwrap();
        let opts = small(7);
        let summary = generate(dir.path(), &opts).unwrap();
        assert_eq!(summary.contexts, 450);
        let meta = Table::read(&dir.path().join("train_meta.parquet"));
        assert_eq!(meta.rows(), 450);
        let (batch_id, event_id) = (meta.i64s("batch_id"), meta.i64s("event_id"));
        let first = meta.i64s("first_pulse_index");
        let last = meta.i64s("last_pulse_index");
        assert!(event_id.windows(2).all(|w| w[0] < w[1]));
        assert!(meta.f64s("azimuth").iter().all(|a| (0.0..TAU).contains(a)));
        assert!(meta.f64s("zenith").iter().all(|z| (0.0..=PI).contains(z)));

        let (mut rows, mut m, mut lengths) = (0, 0, Vec::new());
        for b in 1..=opts.files {
            let pulses = Table::read(&dir.path().join(format!("train/batch_{b}.parquet")));
            rows += pulses.rows() as u64;
            let (ids, times) = (pulses.i64s("event_id"), pulses.i64s("time"));
            assert!(ids.windows(2).all(|w| w[0] <= w[1]));
            let sensors = pulses.col::<Int16Type>("sensor_id");
            assert!(sensors.iter().all(|&s| (0..SENSORS as i16).contains(&s)));
            for c in pulses.f64s("charge") {
                assert!(c > 0.0 && (c * 40.0).round() / 40.0 == c, "{c}");
            }
            let mut expected_first = 0;
            while m < meta.rows() && batch_id[m] == b as i64 {
                let (f, l) = (first[m] as usize, last[m] as usize);
                assert_eq!(f, expected_first);
                assert!(ids[f..=l].iter().all(|&id| id == event_id[m]));
                assert!(times[f..=l].windows(2).all(|w| w[0] <= w[1]));
                assert!(times[f..=l].iter().all(|t| (4_000..30_000).contains(t)));
                lengths.push(l - f + 1);
                (expected_first, m) = (l + 1, m + 1);
            }
            assert_eq!(expected_first, ids.len(), "meta covers batch {b} exactly");
        }
        assert_eq!((m, rows), (meta.rows(), summary.rows));
        lengths.sort_unstable();
        let median = lengths[lengths.len() / 2];
        assert!((35..70).contains(&median), "median pulses {median}");
        assert!(lengths.iter().all(|&n| (1..=opts.max_pulses).contains(&n)));

        let csv = std::fs::read_to_string(dir.path().join("sensor_geometry.csv")).unwrap();
        let mut lines = csv.lines();
        assert_eq!(lines.next(), Some("sensor_id,x,y,z"));
        for (i, line) in lines.by_ref().enumerate() {
            let v: Vec<f64> = line.split(',').map(|x| x.parse().unwrap()).collect();
            assert_eq!(v[0], i as f64);
            assert!(
                v[1].abs() <= 600.0 && v[2].abs() <= 600.0 && v[3].abs() <= 500.0,
                "{line}"
            );
        }
        assert_eq!(csv.lines().count(), SENSORS + 1);
    }

    /// The line-fit estimate (velocity = cov(position, time) / var(time)) of IceCube's first-guess
    /// reconstruction should point roughly along the true track: the direction is learnable.
    #[test]
    fn pulse_times_carry_the_direction() {
        let dir = tempfile::tempdir().unwrap();
        let opts = IcecubeOptions {
            files: 1,
            events_per_file: 300,
            ..IcecubeOptions::default()
        };
        generate(dir.path(), &opts).unwrap();
        let geo = sensor_positions();
        let meta = Table::read(&dir.path().join("train_meta.parquet"));
        let pulses = Table::read(&dir.path().join("train/batch_1.parquet"));
        let (first, last) = (
            meta.i64s("first_pulse_index"),
            meta.i64s("last_pulse_index"),
        );
        let (az, zen) = (meta.f64s("azimuth"), meta.f64s("zenith"));
        let (sensor, time) = (pulses.col::<Int16Type>("sensor_id"), pulses.i64s("time"));
        let aux = pulses.bools("auxiliary");
        let mut cosines = Vec::new();
        for e in 0..meta.rows() {
            let hits: Vec<usize> = (first[e] as usize..=last[e] as usize)
                .filter(|&r| !aux[r])
                .collect();
            if hits.len() < 10 {
                continue;
            }
            let mean = |f: &dyn Fn(usize) -> f64| {
                hits.iter().map(|&r| f(r)).sum::<f64>() / hits.len() as f64
            };
            let t = |r: usize| time[r] as f64;
            let tm = mean(&t);
            let vel: [f64; 3] = std::array::from_fn(|k| {
                let x = |r: usize| geo[sensor[r] as usize][k];
                let xm = mean(&x);
                mean(&|r| (x(r) - xm) * (t(r) - tm))
            });
            let norm = vel.iter().map(|c| c * c).sum::<f64>().sqrt();
            let truth = [
                -zen[e].sin() * az[e].cos(),
                -zen[e].sin() * az[e].sin(),
                -zen[e].cos(),
            ];
            cosines.push((0..3).map(|k| vel[k] * truth[k]).sum::<f64>() / norm);
        }
        let mean = cosines.iter().sum::<f64>() / cosines.len() as f64;
        assert!(
            cosines.len() > 200 && mean > 0.5,
            "{} events, mean cos {mean}",
            cosines.len()
        );
    }

    #[test]
    fn rejects_options_without_data() {
        let dir = tempfile::tempdir().unwrap();
        let opts = IcecubeOptions {
            files: 0,
            ..IcecubeOptions::default()
        };
        assert!(matches!(
            generate(dir.path(), &opts),
            Err(GenError::InvalidOptions { .. })
        ));
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    }
}
