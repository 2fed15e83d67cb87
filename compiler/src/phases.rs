//! Where a compile's time goes, phase by phase: the thread-seconds each phase took, summed over
//! every thread that ran it. Stages (read, statistics, write, commit) are wall time and follow
//! one another; phases run inside them on all threads at once, so on many cores their sum
//! exceeds the wall time, and a phase's share of that sum says what bounds the compile. A phase
//! that runs on one thread while the others wait shows as a small share and a long stage.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One kind of work of a compile, in the order the data flows through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Opening the inputs: Parquet footers, schemas, the checks that all files agree.
    Footers,
    /// Decoding Parquet pages into columns (and a table in memory into the same).
    Decode,
    /// Writing the decoded rows into the spill by bucket (in memory when the input fits).
    Spill,
    /// Reading a bucket back from the spill.
    Load,
    /// Finding each context's rows: runs of equal keys, sorted by key.
    Grouping,
    /// Ordering each context's rows by `--order-by`.
    Ordering,
    /// Matching contexts with the context table, truncating and assigning splits.
    Join,
    /// Gathering values per split, their moments, sorted runs and category counts; merging them.
    Statistics,
    /// Encoding values into tensor bytes.
    Encode,
    /// The stored order of each split: position hashes, sorted.
    Shuffle,
    /// Writing shard files.
    Write,
    /// Hashing shard bytes (xxh3).
    Checksums,
    /// Writing stats and the manifest, moving the cache into place.
    Commit,
}

impl Phase {
    pub const ALL: [Phase; 13] = [
        Phase::Footers,
        Phase::Decode,
        Phase::Spill,
        Phase::Load,
        Phase::Grouping,
        Phase::Ordering,
        Phase::Join,
        Phase::Statistics,
        Phase::Encode,
        Phase::Shuffle,
        Phase::Write,
        Phase::Checksums,
        Phase::Commit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Footers => "footers",
            Phase::Decode => "decode",
            Phase::Spill => "spill",
            Phase::Load => "load",
            Phase::Grouping => "grouping",
            Phase::Ordering => "ordering",
            Phase::Join => "join",
            Phase::Statistics => "statistics",
            Phase::Encode => "encode",
            Phase::Shuffle => "shuffle",
            Phase::Write => "write",
            Phase::Checksums => "checksums",
            Phase::Commit => "commit",
        }
    }
}

/// Nanoseconds per phase, added to from any thread.
#[derive(Debug, Default)]
pub(crate) struct Phases([AtomicU64; Phase::ALL.len()]);

impl Phases {
    /// Runs `f`, counting its time to `phase`.
    pub fn time<T>(&self, phase: Phase, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.add(phase, start.elapsed());
        out
    }

    pub fn add(&self, phase: Phase, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.0[phase as usize].fetch_add(nanos, Ordering::Relaxed);
    }

    /// What a writer spent hashing and writing.
    pub fn add_written(&self, times: Split) {
        self.add(Phase::Write, times.write);
        self.add(Phase::Checksums, times.checksums);
    }

    /// Every phase (those that did not run too, so that the report's shape is fixed) with its
    /// thread-seconds, in flow order.
    pub fn report(&self) -> Vec<(String, f64)> {
        Phase::ALL
            .iter()
            .map(|&p| {
                let nanos = self.0[p as usize].load(Ordering::Relaxed);
                // As `Duration::as_secs_f64` rounds, so that a phase timed once reads as its stage.
                let seconds = Duration::from_nanos(nanos).as_secs_f64();
                (p.name().to_string(), seconds)
            })
            .collect()
    }
}

/// Time spent apart from the phase timed around it, to be moved to another phase afterwards:
/// what a writer that hashes and writes in one call keeps, so that neither counts the other.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Split {
    pub checksums: Duration,
    pub write: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_across_threads_and_report_every_phase_in_flow_order() {
        let phases = Phases::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| phases.add(Phase::Encode, Duration::from_millis(250)));
            }
        });
        let seen = phases.time(Phase::Grouping, || 7);
        assert_eq!(seen, 7);
        let report = phases.report();
        let names: Vec<&str> = report.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, Phase::ALL.map(Phase::name));
        let encode = report.iter().find(|(n, _)| n == "encode").unwrap().1;
        assert!((encode - 1.0).abs() < 1e-9, "{encode}");
        assert_eq!(report.iter().find(|(n, _)| n == "commit").unwrap().1, 0.0);
    }
}
