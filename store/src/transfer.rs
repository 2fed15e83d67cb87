//! Moving a cache's files: checked downloads into a local folder, ranged reads of an object's
//! start, and uploads that publish the manifest last.

use crate::{Remote, StoreError};
use dsc_format::checksum::Hasher;
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStoreExt, WriteMultipart};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What a downloaded object must be: the manifest's size and xxh3 of the stored file.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// Size in bytes.
    pub bytes: u64,
    /// xxh3-64, 16 hex digits.
    pub xxh3: &'a str,
}

/// Attempts of one download before its error is returned: object_store retries each request,
/// but not a body cut off half way.
const ATTEMPTS: usize = 3;

/// Files at most this large are uploaded in one request; larger ones in parts of this size.
const PART: usize = 32 << 20;

/// Uploads in flight at once.
const UPLOADS: usize = 4;

/// What a download asks between the chunks of its body: the signal that stops it, if one came.
type StopCheck = Box<dyn Fn() -> Option<i32> + Send + Sync>;

static STOP_DOWNLOADS: std::sync::OnceLock<StopCheck> = std::sync::OnceLock::new();

/// Stops every download of this process once `stop` names a signal (a command's handler of
/// SIGINT and SIGTERM): the download in progress ends between two chunks with
/// [`StoreError::Stopped`], naming its object, and its partial file is removed. Set once; a
/// process that never sets it (a library) downloads whatever its signals do.
pub fn stop_downloads_when(stop: impl Fn() -> Option<i32> + Send + Sync + 'static) {
    let _ = STOP_DOWNLOADS.set(Box::new(stop));
}

fn stop_requested() -> Option<i32> {
    STOP_DOWNLOADS.get().and_then(|stop| stop())
}

impl Remote {
    /// Downloads object `name` to `dest`, checked: it is written to a partial file beside
    /// `dest` (`.NAME.partial-PID`), its size and xxh3 compared with `expected` as it streams,
    /// synced, and only then renamed to `dest`. On any failure nothing is left at `dest` nor
    /// beside it. Returns the bytes fetched (every attempt's).
    pub fn download(
        &self,
        name: &str,
        dest: &Path,
        expected: Expected<'_>,
    ) -> Result<u64, StoreError> {
        let file_name = dest
            .file_name()
            .map_or_else(|| "download".into(), |n| n.to_string_lossy().into_owned());
        let partial = dest.with_file_name(format!(".{file_name}.partial-{}", std::process::id()));
        let mut fetched = 0;
        let mut attempt = 1;
        loop {
            let result = self.download_once(name, &partial, expected, &mut fetched);
            match result {
                Ok(()) => {
                    return std::fs::rename(&partial, dest)
                        .map(|()| fetched)
                        .map_err(|e| {
                            let _ = std::fs::remove_file(&partial);
                            StoreError::io(dest, e)
                        })
                }
                Err(e) if e.is_transient() && attempt < ATTEMPTS => attempt += 1,
                Err(e) => {
                    let _ = std::fs::remove_file(&partial);
                    return Err(e);
                }
            }
        }
    }

    fn download_once(
        &self,
        name: &str,
        partial: &Path,
        expected: Expected<'_>,
        fetched: &mut u64,
    ) -> Result<(), StoreError> {
        let url = self.url_of(name);
        let client = self.client()?;
        let path = self.path_of(name)?;
        let mut file = std::fs::File::create(partial).map_err(|e| StoreError::io(partial, e))?;
        let mut hasher = Hasher::new();
        let mut got = 0u64;
        let streamed: Result<(), StoreError> = client.runtime.block_on(async {
            let from_store = |e| StoreError::from_store(url.clone(), e);
            let mut body = client
                .store
                .get(&path)
                .await
                .map_err(from_store)?
                .into_stream();
            while let Some(chunk) = body.try_next().await.map_err(from_store)? {
                got += chunk.len() as u64;
                *fetched += chunk.len() as u64;
                if got > expected.bytes {
                    break; // reported below; a larger object is never read to its end
                }
                hasher.update(&chunk);
                file.write_all(&chunk)
                    .map_err(|e| StoreError::io(partial, e))?;
                dsc_format::failpoint::at("fetch:chunk");
                if let Some(signal) = stop_requested() {
                    return Err(StoreError::Stopped {
                        url: url.clone(),
                        signal,
                    });
                }
            }
            Ok(())
        });
        streamed?;
        if got != expected.bytes {
            return Err(StoreError::Short {
                url,
                expected: expected.bytes,
                found: got,
            });
        }
        let found = hasher.hex();
        if found != expected.xxh3 {
            return Err(StoreError::Checksum {
                url,
                expected: expected.xxh3.into(),
                found,
            });
        }
        file.sync_all().map_err(|e| StoreError::io(partial, e))
    }

    /// A reader of object `name` (`len` bytes long) from its start, fetching ranges as it is
    /// read: small at first (a shard's header is a few KB), doubling up to 4 MiB.
    pub fn reader(&self, name: &str, len: u64) -> ObjectReader<'_> {
        ObjectReader {
            remote: self,
            name: name.into(),
            len,
            at: 0,
            chunk: 64 << 10,
            buf: Vec::new(),
            used: 0,
        }
    }
}

/// Reads an object from its start by ranged requests ([`Remote::reader`]).
#[derive(Debug)]
pub struct ObjectReader<'a> {
    remote: &'a Remote,
    name: String,
    len: u64,
    /// Offset of the end of `buf` in the object.
    at: u64,
    chunk: u64,
    buf: Vec<u8>,
    used: usize,
}

impl std::io::Read for ObjectReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.used == self.buf.len() {
            if self.at >= self.len {
                return Ok(0);
            }
            let end = (self.at + self.chunk).min(self.len);
            self.buf = self
                .remote
                .get_range(&self.name, self.at..end)
                .map_err(|e| std::io::Error::other(e.problem()))?;
            self.used = 0;
            self.at = end;
            self.chunk = (self.chunk * 2).min(4 << 20);
        }
        let n = out.len().min(self.buf.len() - self.used);
        out[..n].copy_from_slice(&self.buf[self.used..self.used + n]);
        self.used += n;
        Ok(n)
    }
}

/// What [`upload_cache`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Uploaded {
    /// Files uploaded, the manifest included.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Objects of a replaced cache removed afterwards (its shards the new one does not have).
    pub removed: usize,
    /// Objects under the prefix that are not the cache's, left as they were: without
    /// `replace` nothing is removed (a killed upload's shards, or files of the user's own; a
    /// concurrent upload's shards could be among them too). A replace removes them.
    pub stray: usize,
}

/// Uploads the committed cache in `dir` to `remote`: every file but the manifest first (up to
/// four at a time; large ones in parts), then `manifest.json` last, so that a reader either
/// finds no manifest or finds every file it names. A cache already at `remote` is refused unless
/// `replace`; then its manifest is removed first (readers opening from then on find no cache
/// until the new one is published, never the old manifest over new shards), and after the new
/// manifest its objects that the new cache does not have are removed. A reader that opened the
/// old version before the replace reads shards that fail their checksum on arrival: an error,
/// never another version's data. `progress(done, total)` is called in bytes.
pub fn upload_cache(
    dir: &Path,
    remote: &Remote,
    replace: bool,
    progress: impl FnMut(u64, u64),
) -> Result<Uploaded, StoreError> {
    upload_cache_until(dir, remote, replace, progress, &|| None)
}

/// [`upload_cache`] that stops when `stop` names a signal: asked after each file and before the
/// manifest, it fails with [`StoreError::Interrupted`] and never publishes the manifest (the
/// uploads in flight are dropped).
pub fn upload_cache_until(
    dir: &Path,
    remote: &Remote,
    replace: bool,
    mut progress: impl FnMut(u64, u64),
    stop: &dyn Fn() -> Option<i32>,
) -> Result<Uploaded, StoreError> {
    let manifest_path = dir.join(dsc_format::MANIFEST_FILE);
    let manifest = std::fs::read(&manifest_path).map_err(|e| StoreError::io(&manifest_path, e))?;
    let mut replaced = false;
    if remote.exists(dsc_format::MANIFEST_FILE)? {
        if !replace {
            return Err(StoreError::Exists {
                url: remote.url().into(),
            });
        }
        remote.delete(dsc_format::MANIFEST_FILE)?;
        replaced = true;
    }
    let stopped = || {
        stop().map(|signal| StoreError::Interrupted {
            url: remote.url().into(),
            signal,
            replaced,
        })
    };
    let mut files = Vec::new();
    list_files(dir, dir, &mut files)?;
    files.retain(|(name, _)| name != dsc_format::MANIFEST_FILE);
    let total: u64 = files.iter().map(|(_, size)| size).sum::<u64>() + manifest.len() as u64;
    let client = remote.client()?;
    let mut done = 0u64;
    let mut uploads = futures::stream::iter(files.iter())
        .map(|(name, size)| async move {
            put_file(remote, name, &dir.join(name))
                .await
                .map(|()| *size)
        })
        .buffer_unordered(UPLOADS);
    // Each completion is reported outside the runtime, so that `progress` may itself call the
    // store (a test checks the manifest is absent while files go up).
    while let Some(size) = client.runtime.block_on(uploads.next()) {
        done += size?;
        progress(done, total);
        if let Some(e) = stopped() {
            return Err(e);
        }
    }
    if let Some(e) = stopped() {
        return Err(e);
    }
    remote.put(dsc_format::MANIFEST_FILE, manifest)?;
    progress(total, total);
    let (mut removed, mut stray) = (0, 0);
    for (name, _) in remote.list()? {
        if name != dsc_format::MANIFEST_FILE && !files.iter().any(|(f, _)| *f == name) {
            if replace {
                remote.delete(&name)?;
                removed += 1;
            } else {
                stray += 1;
            }
        }
    }
    Ok(Uploaded {
        files: files.len() + 1,
        bytes: total,
        removed,
        stray,
    })
}

/// Uploads local file `path` as object `name`: whole, or in parts when large.
async fn put_file(remote: &Remote, name: &str, path: &Path) -> Result<(), StoreError> {
    let client = remote.client()?;
    let object = remote.path_of(name)?;
    let url = remote.url_of(name);
    let from_store = |e| StoreError::from_store(url.clone(), e);
    let size = std::fs::metadata(path)
        .map_err(|e| StoreError::io(path, e))?
        .len();
    if size as usize <= PART {
        let bytes = std::fs::read(path).map_err(|e| StoreError::io(path, e))?;
        client
            .store
            .put(&object, bytes.into())
            .await
            .map_err(from_store)?;
        return Ok(());
    }
    let upload = client
        .store
        .put_multipart(&object)
        .await
        .map_err(from_store)?;
    let mut parts = WriteMultipart::new_with_chunk_size(upload, PART);
    let mut file = std::fs::File::open(path).map_err(|e| StoreError::io(path, e))?;
    let mut buf = vec![0u8; PART];
    loop {
        let n = std::io::Read::read(&mut file, &mut buf).map_err(|e| StoreError::io(path, e))?;
        if n == 0 {
            break;
        }
        parts.wait_for_capacity(2).await.map_err(from_store)?;
        parts.write(&buf[..n]);
    }
    parts.finish().await.map_err(from_store)?;
    Ok(())
}

/// Every file under `dir` (relative to `root`, `/`-separated) with its size, sorted.
fn list_files(root: &Path, dir: &Path, out: &mut Vec<(String, u64)>) -> Result<(), StoreError> {
    let entries = std::fs::read_dir(dir).map_err(|e| StoreError::io(dir, e))?;
    let mut paths: Vec<PathBuf> = Vec::new();
    for entry in entries {
        paths.push(entry.map_err(|e| StoreError::io(dir, e))?.path());
    }
    paths.sort();
    for path in paths {
        let meta = std::fs::metadata(&path).map_err(|e| StoreError::io(&path, e))?;
        if meta.is_dir() {
            list_files(root, &path, out)?;
        } else {
            let rel = path.strip_prefix(root).expect("under the root");
            let name: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push((name.join("/"), meta.len()));
        }
    }
    Ok(())
}
