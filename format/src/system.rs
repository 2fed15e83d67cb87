//! What the machine gives a dsc process, for the compiler and the loader to size themselves by.

/// The memory this process may use: the machine's (`MemTotal`), or its container's limit
/// (cgroup v2, then v1) when lower. 4 GiB where neither can be read.
pub fn memory_limit() -> u64 {
    static LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        let total_kib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .unwrap_or(4 << 20);
        // "max" or a missing file means no limit.
        let cgroup = [
            "/sys/fs/cgroup/memory.max",
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        ]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .find_map(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(u64::MAX);
        total_kib.saturating_mul(1024).min(cgroup)
    })
}
