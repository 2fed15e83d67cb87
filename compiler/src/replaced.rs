//! The cache a `--force` compile replaced: moved beside the output under a name of its own
//! (`.NAME.PID-N.dsc-old`, which no reader takes for a cache) and locked, then removed by
//! whoever holds the lock. Removing it is the slowest step of a commit (the file system frees
//! every page and block of the old shards, one file at a time), and nothing waits for it: the
//! CLI hands it to a process of its own and returns, a library call removes it when the report
//! is dropped. A remover killed half way leaves its folder unlocked; the next compile into the
//! same output removes it, and leaves alone a folder that a live remover holds.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A replaced cache under its own name, locked while this value (or a process it was handed
/// to) lives; removed on drop unless handed over.
#[derive(Debug)]
pub struct Replaced {
    path: PathBuf,
    /// The folder itself, opened and locked (an OS lock: released however its holder ends).
    lock: Option<File>,
}

impl Replaced {
    /// Moves `dir` (a replaced cache) beside `out` under a fresh leftover name and locks it.
    pub(crate) fn take(dir: &Path, out: &Path) -> std::io::Result<Replaced> {
        static TAKEN: AtomicU32 = AtomicU32::new(0);
        let unique = format!(
            "{}-{}",
            std::process::id(),
            TAKEN.fetch_add(1, Ordering::Relaxed)
        );
        let path = leftover_name(out, &unique);
        std::fs::rename(dir, &path)?;
        // Locked after the rename: until then the folder had the staging name, which only this
        // process (holding the output's lock) touches.
        let lock = File::open(&path).and_then(|f| f.lock().map(|()| f)).ok();
        Ok(Replaced { path, lock })
    }

    /// Where the replaced cache lies until it is removed.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The folder and the open, locked handle that keeps other compiles from removing it: what
    /// a process that removes it must hold (as its standard input, say) until it is done.
    pub fn hand_over(mut self) -> (PathBuf, Option<File>) {
        let lock = self.lock.take();
        let path = std::mem::take(&mut self.path);
        (path, lock)
    }
}

impl Drop for Replaced {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            remove_leftover(&self.path);
        }
    }
}

/// `.NAME.UNIQUE.dsc-old` beside `out`.
fn leftover_name(out: &Path, unique: &str) -> PathBuf {
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    out.with_file_name(format!(".{name}.{unique}.{}", dsc_format::REPLACED_SUFFIX))
}

/// Whether `name` is a leftover of a compile into `out`'s name: `.NAME.` then pid and counter
/// (digits and one '-'), then `.dsc-old`; the leftovers of `NAME.v2` are not `NAME`'s.
fn is_leftover_of(out: &Path, name: &str) -> bool {
    let Some(own) = out.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    name.strip_prefix('.')
        .and_then(|n| n.strip_prefix(own))
        .and_then(|n| n.strip_prefix('.'))
        .and_then(|n| n.strip_suffix(dsc_format::REPLACED_SUFFIX))
        .and_then(|n| n.strip_suffix('.'))
        .is_some_and(is_unique)
}

/// Whether `name` is a replaced cache's leftover of any output: `.NAME.PID-N.dsc-old`. What the
/// hidden `dsc remove-replaced` accepts: it deletes nothing else, whoever calls it.
pub fn is_replaced_name(name: &str) -> bool {
    name.strip_prefix('.')
        .and_then(|n| n.strip_suffix(dsc_format::REPLACED_SUFFIX))
        .and_then(|n| n.strip_suffix('.'))
        .and_then(|n| n.rsplit_once('.'))
        .is_some_and(|(own, unique)| !own.is_empty() && is_unique(unique))
}

/// `PID-N`.
fn is_unique(unique: &str) -> bool {
    unique
        .split_once('-')
        .is_some_and(|(pid, n)| !pid.is_empty() && !n.is_empty())
        && unique.bytes().all(|b| b.is_ascii_digit() || b == b'-')
}

/// Removes a leftover folder as far as it can: what is already gone (another remover got
/// there first) is no error; what cannot be removed stays for the next compile to name.
pub fn remove_leftover(path: &Path) {
    let _ = std::fs::remove_dir_all(path);
}

/// What earlier forced compiles into `out` replaced and left unlocked (their remover was
/// killed, or failed), for the next compile to remove under the output's lock before it starts;
/// a folder that a live remover holds is left to it.
pub(crate) fn abandoned(out: &Path) -> Vec<PathBuf> {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new(); // nothing there yet
    };
    let mut left = Vec::new();
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .to_str()
            .is_some_and(|n| is_leftover_of(out, n))
        {
            continue;
        }
        let path = entry.path();
        let Ok(folder) = File::open(&path) else {
            continue; // removed meanwhile
        };
        match folder.try_lock() {
            Ok(()) => left.push(path),
            Err(std::fs::TryLockError::WouldBlock) => {} // its remover is at work
            // A file system that cannot lock folders (NFS): nobody could lock it, so its
            // remover, if alive, is at work unlocked too; both remove what they find.
            Err(std::fs::TryLockError::Error(_)) => remove_leftover(&path),
        }
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_outputs_leftovers_are_its_own() {
        let out = Path::new("runs/cache");
        assert!(is_leftover_of(out, ".cache.1234-0.dsc-old"));
        assert!(is_leftover_of(out, ".cache.7-12.dsc-old"));
        // The fixed names of the staging folder and of older builds' replaced cache.
        assert!(!is_leftover_of(out, ".cache.dsc-old"));
        assert!(!is_leftover_of(out, ".cache.dsc-partial"));
        // Another output whose name starts with this one's.
        assert!(!is_leftover_of(out, ".cache.v2.1-0.dsc-old"));
        assert!(!is_leftover_of(out, ".cache2.1-0.dsc-old"));
        assert!(!is_leftover_of(out, "cache.1-0.dsc-old"));
        // What the hidden remover accepts: a leftover of any output, nothing else.
        assert!(is_replaced_name(".cache.1234-0.dsc-old"));
        assert!(is_replaced_name(".cache.v2.7-3.dsc-old"));
        for not in [
            ".cache.dsc-old",
            ".dsc-old",
            "..1-0.dsc-old",
            ".cache.1-.dsc-old",
            ".cache.-0.dsc-old",
            ".cache.12.dsc-old",
            "cache.1-0.dsc-old",
            ".cache.1-0.dsc-partial",
            "home",
        ] {
            assert!(!is_replaced_name(not), "{not}");
        }
        assert_eq!(
            leftover_name(out, "5-1"),
            Path::new("runs/.cache.5-1.dsc-old")
        );
    }

    #[test]
    fn a_locked_leftover_is_left_to_its_remover_and_an_abandoned_one_removed() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("cache");
        let held = dir.path().join(".cache.1-0.dsc-old");
        let abandoned = dir.path().join(".cache.2-0.dsc-old");
        let other = dir.path().join(".cache.v2.3-0.dsc-old");
        for d in [&held, &abandoned, &other] {
            std::fs::create_dir_all(d.join("shards")).unwrap();
            std::fs::write(d.join("shards/train-00000.safetensors"), b"old").unwrap();
        }
        let lock = File::open(&held).unwrap();
        lock.lock().unwrap();
        remove_abandoned(&out);
        assert!(held.exists(), "a live remover's folder is its own");
        assert!(!abandoned.exists());
        assert!(
            other.exists(),
            "another output's leftover is not this one's"
        );
        drop(lock);
        remove_abandoned(&out);
        assert!(!held.exists());
    }

    #[test]
    fn a_replaced_cache_is_removed_when_dropped_and_kept_when_handed_over() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("cache");
        let staged = dir.path().join(".cache.dsc-partial");
        std::fs::create_dir_all(&staged).unwrap();
        let r = Replaced::take(&staged, &out).unwrap();
        let path = r.path().to_path_buf();
        assert!(path.exists() && !staged.exists());
        drop(r);
        assert!(!path.exists());

        std::fs::create_dir_all(&staged).unwrap();
        let (path, lock) = Replaced::take(&staged, &out).unwrap().hand_over();
        assert!(path.exists(), "handed over: its new holder removes it");
        assert!(lock.is_some());
        remove_abandoned(&out);
        assert!(path.exists(), "locked by the handle handed over");
        drop(lock);
        remove_abandoned(&out);
        assert!(!path.exists());
    }

    /// What the next compile does with [`abandoned`]'s folders.
    fn remove_abandoned(out: &Path) {
        for left in abandoned(out) {
            std::fs::remove_dir_all(left).unwrap();
        }
    }
}
