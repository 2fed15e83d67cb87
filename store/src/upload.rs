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
        let name = std::process::id().to_string();
        let lock = lock_file(&uploads, &name)?;
        // Blocks only while another process reclaims a folder of this name (a dead process's
        // of the same pid).
        lock.lock()
            .map_err(|e| StoreError::io(&uploads.join(format!("{name}.lock")), e))?;
        remove_stale(&uploads, &name);
        let staging = uploads.join(&name);
        // A folder of this name is a dead process's (this one has just started it).
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging).map_err(|e| StoreError::io(&staging, e))?;
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

/// `uploads/<name>.lock`, made if missing. Only its owner removes one, when done ([`Upload`]'s
/// drop): a process that removed another's could not know that a third had not just opened it
/// to lock it. A killed upload's lock file stays (empty) until its name is used again.
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
fn remove_stale(uploads: &Path, own: &str) {
    let Ok(entries) = std::fs::read_dir(uploads) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name == own || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(lock) = lock_file(uploads, name) else {
            continue;
        };
        if lock.try_lock().is_ok() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
