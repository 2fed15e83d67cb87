//! Naming the shard when a mapped file is truncated under the reader.
//!
//! Reading a page of a memory map whose file was cut short raises SIGBUS, and a process killed
//! by it says nothing about which file broke (`mmap.rs` explains why the risk remains). Every
//! shard map registers its address range and path here; a SIGBUS handler installed with the
//! first map looks the faulting address up and writes one line naming the shard to stderr.
//! Then, in a program that chose an exit code ([`exit_with`]; the `dsc` CLI chooses 2), the
//! process exits with it; otherwise the previous disposition is restored and the fault
//! re-raised, so a library user's process (Python, say) still dies of SIGBUS, after the line.
//!
//! The handler may only do async-signal-safe work: it reads a fixed table of atomics (no locks,
//! no allocation) and calls `write(2)`, `sigaction(2)` and `_exit(2)`.

use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

/// Maps tracked at once; more are still mapped and read, just not named on a fault.
const SLOTS: usize = 4096;

struct Slot {
    /// Start of the mapped range; 0 when free.
    start: AtomicUsize,
    len: AtomicUsize,
    /// The shard's path bytes, owned by the [`Registration`].
    path: AtomicPtr<u8>,
    path_len: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    path: AtomicPtr::new(std::ptr::null_mut()),
    path_len: AtomicUsize::new(0),
};
static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
/// Exit code after naming the shard; 0: re-raise instead.
static EXIT_CODE: AtomicI32 = AtomicI32::new(0);
static INSTALL: Once = Once::new();
/// The disposition before ours, restored to re-raise.
static PREVIOUS: OnceLock<Previous> = OnceLock::new();

struct Previous(libc::sigaction);
// SAFETY: a plain C struct of a handler address, flags and a signal mask, only ever read.
unsafe impl Sync for Previous {}
// SAFETY: as above; it is moved into the OnceLock once and never mutated.
unsafe impl Send for Previous {}

/// Makes a SIGBUS inside a shard map end the process with `code` after naming the shard (the
/// CLI's behaviour). Without it the fault is re-raised after the message.
pub fn exit_with(code: i32) {
    EXIT_CODE.store(code, Ordering::SeqCst);
}

/// A map's entry in the table, removed on drop: keep it alive exactly as long as the map.
#[derive(Debug)]
pub struct Registration {
    slot: Option<usize>,
    _path: Box<[u8]>,
}

/// Registers `[start, start + len)` as a map of the shard at `path` (the loader's own maps, and
/// any other map of a shard, e.g. the Python package's private zero-copy views).
pub fn register(start: *const u8, len: usize, path: &std::path::Path) -> Registration {
    INSTALL.call_once(install);
    let mut bytes = path.display().to_string().into_bytes().into_boxed_slice();
    for (i, s) in TABLE.iter().enumerate() {
        // Claim a free slot with a placeholder start, fill it, then publish the real start.
        if s.start
            .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            s.len.store(len, Ordering::Relaxed);
            s.path.store(bytes.as_mut_ptr(), Ordering::Relaxed);
            s.path_len.store(bytes.len(), Ordering::Relaxed);
            s.start.store(start as usize, Ordering::Release);
            return Registration {
                slot: Some(i),
                _path: bytes,
            };
        }
    }
    Registration {
        slot: None,
        _path: bytes,
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            // Unpublish first: the handler no longer matches this range before the path goes.
            TABLE[i].start.store(usize::MAX, Ordering::Release);
            TABLE[i].path.store(std::ptr::null_mut(), Ordering::Release);
            TABLE[i].start.store(0, Ordering::Release);
        }
    }
}

fn install() {
    // SAFETY: plain sigaction(2) calls with zero-initialised, fully set structs. PREVIOUS is
    // set before our handler is installed, so the handler always finds it.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
            return;
        }
        let _ = PREVIOUS.set(Previous(old));
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigbus as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
    }
}

extern "C" fn on_sigbus(_sig: i32, info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers; the table holds only
    // atomics, and a published path pointer stays valid while its range is published (the
    // registration unpublishes before freeing it). Only async-signal-safe calls follow.
    unsafe {
        let addr = (*info).si_addr() as usize;
        let mut named = false;
        for s in &TABLE {
            let start = s.start.load(Ordering::Acquire);
            if start == 0 || start == usize::MAX {
                continue;
            }
            if addr >= start && addr - start < s.len.load(Ordering::Relaxed) {
                let path = s.path.load(Ordering::Acquire);
                if !path.is_null() {
                    write_all(b"dsc: ");
                    write_all(std::slice::from_raw_parts(
                        path,
                        s.path_len.load(Ordering::Relaxed),
                    ));
                    write_all(
                        b": the shard changed under the reader (truncated or rewritten while \
                          mapped); a cache must not be modified while it is read: open it again \
                          once it is complete\n",
                    );
                    named = true;
                }
                break;
            }
        }
        let code = EXIT_CODE.load(Ordering::SeqCst);
        if named && code != 0 {
            libc::_exit(code);
        }
        // Not ours, or a library user: the previous disposition handles the re-executed fault.
        match PREVIOUS.get() {
            Some(Previous(old)) => {
                libc::sigaction(libc::SIGBUS, old, std::ptr::null_mut());
            }
            None => {
                libc::signal(libc::SIGBUS, libc::SIG_DFL);
            }
        }
    }
}

fn write_all(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: write(2) of a valid byte range to stderr; async-signal-safe.
        let n = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            return;
        }
        bytes = &bytes[n as usize..];
    }
}
