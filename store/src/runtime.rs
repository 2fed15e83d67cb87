//! The one runtime that drives every request of a process: two threads of network I/O, whatever
//! the number of caches, loaders or fetch threads (each blocks on its own request, the runtime
//! only moves bytes).

use crate::StoreError;
use std::sync::{Arc, Mutex};

static SHARED: Mutex<Option<(u32, Arc<tokio::runtime::Runtime>)>> = Mutex::new(None);

/// This process's runtime, started on first use (again in a forked child, whose copy of its
/// parent's has no threads).
pub(crate) fn shared() -> Result<Arc<tokio::runtime::Runtime>, StoreError> {
    let mut slot = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if let Some((owner, rt)) = &*slot {
        if *owner == pid {
            return Ok(rt.clone());
        }
    }
    let rt = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("dsc-store")
            .enable_all()
            .build()
            .map_err(StoreError::Runtime)?,
    );
    if let Some((_, old)) = slot.replace((pid, rt.clone())) {
        // A forked child's copy of its parent's runtime: dropping it would join threads that
        // do not exist in this process.
        std::mem::forget(old);
    }
    Ok(rt)
}
