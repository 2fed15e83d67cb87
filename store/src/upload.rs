//! A cache on its way to object storage: made in a local staging folder, then uploaded with its
//! manifest last, the folder removed whatever happens.

use crate::{upload_cache, Remote, StoreError, Uploaded};
use std::path::{Path, PathBuf};

/// A cache to be made locally and uploaded to a URL (`dsc compile --out s3://…`,
/// `dsc.compile(out="s3://…")`, `dsc compress CACHE --out s3://…`): [`Upload::local`] is where
/// to make it, [`Upload::send`] uploads it; the staging folder is removed when dropped.
#[derive(Debug)]
pub struct Upload {
    remote: Remote,
    replace: bool,
    staging: PathBuf,
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
        let staging = root.join("upload").join(std::process::id().to_string());
        remove_stale(&root.join("upload"));
        std::fs::create_dir_all(&staging).map_err(|e| StoreError::io(&staging, e))?;
        Ok(Upload {
            remote,
            replace,
            staging,
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

    /// Uploads the cache made at [`Upload::local`], manifest last ([`upload_cache`]);
    /// `progress(done, total)` in bytes.
    pub fn send(&self, progress: impl FnMut(u64, u64)) -> Result<Uploaded, StoreError> {
        upload_cache(&self.local(), &self.remote, self.replace, progress)
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.staging);
    }
}

/// Removes the staging folders (named by process id) of uploads whose process is gone: a
/// killed compile's. A folder of this process's id is one too (another process, long gone, had
/// it); a live process's is left to it.
fn remove_stale(uploads: &Path) {
    let Ok(entries) = std::fs::read_dir(uploads) else {
        return;
    };
    let me = std::process::id();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let alive = pid != me && Path::new("/proc").join(pid.to_string()).exists();
        if !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
