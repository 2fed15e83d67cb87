//! How a compile divides its memory budget: the default, the share that buffers reading, and
//! how many buckets are worked on at once. Shared by dsc's own passes and the profile's.

use crate::error::{CompileError, Result};

/// The memory a compile may use when not told: half of what this process may use (the
/// machine's memory, or its container's limit when lower), at least 256 MiB.
pub(crate) fn default_budget() -> u64 {
    (dsc_format::system::memory_limit() / 2).max(256 << 20)
}

/// A bucket in memory takes about this many times its decoded rows (the rows, the grouping,
/// gathered values, encode buffers).
const BUCKET_OVERHEAD: u64 = 4;

/// How many buckets may be in memory at once under `budget`, the largest holding `rows` rows
/// of `bytes` decoded bytes; an error when even one does not fit.
pub(crate) fn at_once(rows: u64, bytes: u64, budget: u64) -> Result<usize> {
    let bucket_bytes = (bytes * BUCKET_OVERHEAD).max(1);
    if bucket_bytes > budget {
        return Err(CompileError::Budget {
            budget,
            rows,
            needed: bucket_bytes,
        });
    }
    let threads = rayon::current_num_threads().max(1);
    Ok(((budget / bucket_bytes) as usize).clamp(1, threads))
}

/// Half the budget reads, shared by the files read at once.
pub(crate) fn read_share(budget: u64) -> usize {
    let threads = rayon::current_num_threads().max(1) as u64;
    (budget / 2 / threads).max(1 << 20) as usize
}
