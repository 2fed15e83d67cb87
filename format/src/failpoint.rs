//! Points where the tests stop or pause a process, deterministically: named steps of a commit, a
//! download's chunks. Both knobs are environment variables read only at these points.

use std::path::Path;

/// Stops the process at once, as `kill -9` would (no destructor runs, nothing is cleaned up),
/// when `DSC_FAILPOINT` names `point`; and with `DSC_PAUSE=POINT:FILE`, at `POINT` writes
/// `FILE.paused` and waits (a minute at most) for `FILE` to appear: how the tests kill an append
/// at each step of its commit, let another writer commit at a chosen moment, or signal a
/// download half way.
pub fn at(point: &str) {
    if std::env::var_os("DSC_FAILPOINT").is_some_and(|p| p == point) {
        std::process::abort();
    }
    let pause = std::env::var("DSC_PAUSE").ok();
    if let Some((_, file)) = pause
        .as_deref()
        .and_then(|v| v.rsplit_once(':'))
        .filter(|(at, _)| *at == point)
    {
        let _ = std::fs::write(format!("{file}.paused"), b"");
        let start = std::time::Instant::now();
        while !Path::new(&file).exists() && start.elapsed().as_secs() < 60 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
