//! A cache on its way to object storage: made in a local staging folder, then uploaded with its
//! manifest last, the folder removed whatever happens.

use crate::{upload_cache_until, Remote, StoreError, Uploaded};
use std::path::{Path, PathBuf};

/// A cache to be made locally and uploaded to a URL (`dsc compile --out s3://…`,
/// `dsc.compile(out="s3://…")`, `dsc compress CACHE --out s3://…`): [`Upload::local`] is where
/// to make it, [`Upload::send`] uploads it; the staging folder is removed when dropped.
#[derive(Debug)]
pub struct Upload {
    remote: Remote,
    replace: bool,
    staging: PathBuf,
    /// `upload/<pid>.lock`, locked for as long as the staging folder is in use: what tells a
    /// live upload's folder from a killed one's ([`remove_stale`]).
    _lock: std::fs::File,
}

impl Upload {
    /// An upload to `remote`, staged in a folder of this process under `root`. A cache
    /// already at the URL is refused now, before any work is done, unless `replace`.
    pub fn new(remote: Remote, root: &Path, replace: bool) -> Result<Upload, StoreError> {
        // The bucket is asked for now, not after the compile: a missing bucket or a refused
        // credential answers a listing, where a missing object's 404 says nothing of either.
        remote.list()?;
        if !replace && remote.exists(dsc_format::MANIFEST_FILE)? {
            return Err(StoreError::Exists {
                url: remote.url().into(),
            });
        }
        let uploads = root.join("upload");
        std::fs::create_dir_all(&uploads).map_err(|e| StoreError::io(&uploads, e))?;
        let (name, lock) = claim(&uploads)?;
        lock.lock()
            .map_err(|e| StoreError::io(&uploads.join(format!("{name}.lock")), e))?;
        remove_stale(&uploads, &name);
        let staging = uploads.join(&name);
        std::fs::create_dir(&staging).map_err(|e| StoreError::io(&staging, e))?;
        Ok(Upload {
            remote,
            replace,
            staging,
            _lock: lock,
        })
    }

    /// Where to make the cache (a path that does not exist yet).
    pub fn local(&self) -> PathBuf {
        self.staging.join("cache")
    }

    /// The URL it goes to.
    pub fn url(&self) -> &str {
        self.remote.url()
    }

    /// Uploads the cache made at [`Upload::local`], manifest last
    /// ([`crate::upload_cache_until`]); `progress(done, total)` in bytes; `stop` names a signal
    /// that stops it before the manifest is published.
    pub fn send(
        &self,
        progress: impl FnMut(u64, u64),
        stop: &dyn Fn() -> Option<i32>,
    ) -> Result<Uploaded, StoreError> {
        upload_cache_until(&self.local(), &self.remote, self.replace, progress, stop)
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.staging);
        // Its own lock file, while still holding the lock: a process that opens the name
        // later makes a new file, and no other process uses this name while this one lives.
        let mut lock = self.staging.clone().into_os_string();
        lock.push(".lock");
        let _ = std::fs::remove_file(lock);
    }
}

/// A staging name of this process's own, `<pid>-<nonce>`, and its lock file, created here and
/// nowhere else: the pid says whose it is, the nonce keeps two processes apart whose pids are
/// equal (in two pid namespaces sharing the folder, or an id reused), and the lock file's
/// exclusive creation checks it (a name taken is never shared: another nonce is drawn).
fn claim(uploads: &Path) -> Result<(String, std::fs::File), StoreError> {
    static DRAWN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let pid = std::process::id();
    let mut last = None;
    for _ in 0..16 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let drawn = DRAWN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let local = &drawn as *const u64 as u64;
        let nonce =
            dsc_format::rng::mix64(nanos ^ local.rotate_left(32) ^ (u64::from(pid) << 20) ^ drawn);
        let name = format!("{pid}-{nonce:016x}");
        let path = uploads.join(format!("{name}.lock"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(file) => return Ok((name, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(StoreError::io(&path, e)),
        }
    }
    Err(StoreError::io(
        uploads,
        last.unwrap_or_else(|| std::io::Error::other("no staging name is free")),
    ))
}

/// `uploads/<name>.lock`, made if missing (an older dsc's folder, named by its pid alone).
fn lock_file(uploads: &Path, name: &str) -> Result<std::fs::File, StoreError> {
    let path = uploads.join(format!("{name}.lock"));
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| StoreError::io(&path, e))
}

/// Removes the staging folders of uploads that are over: a folder whose lock (`<name>.lock`
/// beside it) no process holds. A killed process's lock went with it, whatever the moment of
/// the kill; a process id seen alive in `/proc` was no proof of a live upload (a zombie not yet
/// reaped, a reused id, another pid namespace), so the lock, not the id, decides. `own` is this
/// process's folder.
///
/// A name is never used twice ([`claim`]), so the lock file of an upload that is over goes with
/// its folder, and one a killed upload left without a folder too.
fn remove_stale(uploads: &Path, own: &str) {
    let Ok(entries) = std::fs::read_dir(uploads) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(file) = file.to_str() else { continue };
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let name = match is_dir {
            true => file,
            false => match file.strip_suffix(".lock") {
                Some(name) if !uploads.join(name).is_dir() => name,
                _ => continue,
            },
        };
        if name == own {
            continue;
        }
        let Ok(lock) = lock_file(uploads, name) else {
            continue;
        };
        if lock.try_lock().is_ok() {
            if is_dir {
                let _ = std::fs::remove_dir_all(entry.path());
            }
            let _ = std::fs::remove_file(uploads.join(format!("{name}.lock")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_names_are_never_shared() {
        let dir = tempfile::tempdir().unwrap();
        let (a, _held) = claim(dir.path()).unwrap();
        let (b, also) = claim(dir.path()).unwrap();
        also.lock().unwrap();
        assert_ne!(a, b);
        let pid = std::process::id().to_string();
        assert!(a.starts_with(&format!("{pid}-")) && b.starts_with(&format!("{pid}-")));
        // A killed upload's lock file without its folder is reclaimed; a held one is not.
        std::fs::write(dir.path().join("7-dead.lock"), b"").unwrap();
        remove_stale(dir.path(), &a);
        assert!(!dir.path().join("7-dead.lock").exists());
        assert!(
            dir.path().join(format!("{b}.lock")).exists(),
            "held by this process"
        );
    }
}
