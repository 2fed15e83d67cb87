//! Keeping the memory a training step frees for the next step.
//!
//! libtorch allocates every activation and gradient of a step anew and frees them when the step
//! ends. glibc hands large blocks back to the kernel (blocks above its mmap threshold are
//! unmapped on free, and the top of the heap is trimmed beyond its trim threshold), so the next
//! step page-faults the same memory in again and the kernel zeroes it first: on the demo model
//! (CPU) 10,000 faults a step and 5–11% of the process's CPU time in the kernel. Fixed
//! thresholds well above one step's working set make glibc reuse the freed blocks instead:
//! 2,000 faults a step (docs/PERFORMANCE.md, "Learning").

/// Blocks up to this size come from the heap, not from fresh mappings.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: i32 = 256 << 20;
/// Free memory at the heap top kept rather than returned to the kernel.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: i32 = 1 << 30;

/// Sets glibc's thresholds, unless the user chose them (`MALLOC_MMAP_THRESHOLD_`,
/// `MALLOC_TRIM_THRESHOLD_`). Call before the first large allocation. Elsewhere: nothing.
pub fn reuse_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    for (param, env, value) in [
        (
            libc::M_MMAP_THRESHOLD,
            "MALLOC_MMAP_THRESHOLD_",
            MMAP_THRESHOLD,
        ),
        (
            libc::M_TRIM_THRESHOLD,
            "MALLOC_TRIM_THRESHOLD_",
            TRIM_THRESHOLD,
        ),
    ] {
        if std::env::var_os(env).is_none() {
            // SAFETY: mallopt only changes glibc's allocation policy; it is called with valid
            // parameters and touches no memory of ours.
            unsafe {
                libc::mallopt(param, value);
            }
        }
    }
}
