//! Inputs in object storage: rows, context and join files given as URLs (`s3://…`, `gs://…`,
//! `az://…`, `https://…`), through the store client the caches use (`dsc_store`), configured
//! as theirs are (the `AWS_*`, `GOOGLE_*`, `AZURE_*` environment, or [`set_options`]). A
//! Parquet object is read as a local file is, its footer and then each wanted column chunk
//! by a ranged request: nothing is downloaded whole but a CSV lookup table. A rows pattern may
//! glob the names under a prefix (`s3://bucket/events/*.parquet`), or name the prefix itself.
//!
//! An object's `xxh3` among the manifest's inputs hashes its size and version (entity tag, else
//! last-modified time), not its bytes, which the compile does not read whole.

use crate::error::{CompileError, Result};
use bytes::Bytes;
use dsc_store::{Remote, StoreError};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Store configuration keys for inputs (object_store's: `aws_endpoint`, …), over the
/// environment; Python's `storage_options`.
static OPTIONS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// Clients by folder URL: one per prefix, shared by its objects.
static CLIENTS: Mutex<Option<HashMap<String, Remote>>> = Mutex::new(None);

/// Sets the store configuration keys inputs in object storage are read with (the same for
/// every compile of the process that follows).
pub fn set_options(options: &[(String, String)]) {
    *OPTIONS.lock().unwrap_or_else(|p| p.into_inner()) = options.to_vec();
    *CLIENTS.lock().unwrap_or_else(|p| p.into_inner()) = None;
}

/// Whether `path` is a URL rather than a local path.
pub(crate) fn is_url(path: &Path) -> bool {
    path.to_str().is_some_and(dsc_store::is_remote)
}

fn store_err(e: StoreError) -> CompileError {
    CompileError::Store(Box::new(e))
}

/// The folder URL and the object name of `url`.
fn split(url: &str) -> (&str, &str) {
    let cut = url.rfind('/').unwrap_or(0);
    (&url[..cut], &url[cut + 1..])
}

/// The store of the cache at `url`, with the inputs' configuration keys (a cache appended to
/// in object storage).
pub(crate) fn cache_store(url: &Path) -> Result<Remote> {
    client(&url.display().to_string())
}

/// The client of the folder `folder`.
fn client(folder: &str) -> Result<Remote> {
    let mut all = CLIENTS.lock().unwrap_or_else(|p| p.into_inner());
    let map = all.get_or_insert_with(HashMap::new);
    if let Some(r) = map.get(folder) {
        return Ok(r.clone());
    }
    let options = OPTIONS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let remote = Remote::open_with(folder, &options).map_err(store_err)?;
    map.insert(folder.to_string(), remote.clone());
    Ok(remote)
}

/// The objects a rows pattern names: one object, the `*.parquet` objects under a prefix, or
/// those a glob over the names under a prefix matches (`*` within one level), sorted.
pub(crate) fn resolve(pattern: &str) -> Result<Vec<PathBuf>> {
    let glob_at = pattern.find(['*', '?', '[']);
    let (folder, matcher) = match glob_at {
        Some(at) => {
            let cut = pattern[..at].rfind('/').unwrap_or(0);
            let glob = glob::Pattern::new(&pattern[cut + 1..]).map_err(|e| {
                dsc_format::spelling::OptionError::new(
                    "rows",
                    format!("has a bad glob pattern {pattern:?}: {e}"),
                )
            })?;
            (&pattern[..cut], Some(glob))
        }
        None => {
            let (folder, name) = split(pattern.trim_end_matches('/'));
            if !name.is_empty() && !pattern.ends_with('/') {
                match client(folder)?.head(name) {
                    Ok(_) => return Ok(vec![PathBuf::from(pattern)]),
                    Err(StoreError::NotFound { .. }) => {}
                    Err(e) => return Err(store_err(e)),
                }
                // Not an object: a folder of them, or nothing at all (said as such).
                let folder = pattern.trim_end_matches('/');
                if client(folder)?.list().map_err(store_err)?.is_empty() {
                    return Err(store_err(StoreError::Url {
                        url: pattern.to_string(),
                        problem: "no such object (nor a folder of .parquet objects)".into(),
                    }));
                }
            }
            (pattern.trim_end_matches('/'), None)
        }
    };
    let options = glob::MatchOptions {
        require_literal_separator: true,
        ..Default::default()
    };
    let listed = client(folder)?.list().map_err(store_err)?;
    let mut found: Vec<PathBuf> = listed
        .into_iter()
        .filter(|(name, _)| match &matcher {
            Some(g) => g.matches_with(name, options),
            None => !name.contains('/') && name.ends_with(".parquet"),
        })
        .map(|(name, _)| PathBuf::from(format!("{folder}/{name}")))
        .collect();
    if found.is_empty() {
        return Err(CompileError::NoMatch {
            pattern: match matcher {
                Some(_) => pattern.to_string(),
                None => format!("{folder}/*.parquet"),
            },
        });
    }
    found.sort();
    Ok(found)
}

/// An object's size and version: what a stamp compares and what the manifest hashes.
pub(crate) fn head(url: &Path) -> Result<(u64, String)> {
    let url = url.to_str().expect("a URL is UTF-8");
    let (folder, name) = split(url);
    client(folder)?.head(name).map_err(store_err)
}

/// The whole object (a CSV lookup table).
pub(crate) fn get(url: &Path) -> Result<Vec<u8>> {
    let url = url.to_str().expect("a URL is UTF-8");
    let (folder, name) = split(url);
    client(folder)?.get(name).map_err(store_err)
}

/// An object in storage read as a Parquet file is: by ranged requests.
pub(crate) struct RemoteFile {
    remote: Remote,
    name: String,
    len: u64,
}

impl RemoteFile {
    pub fn open(url: &Path) -> Result<RemoteFile> {
        let text = url.to_str().expect("a URL is UTF-8");
        let (folder, name) = split(text);
        let remote = client(folder)?;
        let (len, _) = remote.head(name).map_err(store_err)?;
        Ok(RemoteFile {
            remote,
            name: name.to_string(),
            len,
        })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn read(&self, start: u64, len: usize) -> std::io::Result<Bytes> {
        self.remote
            .get_range(&self.name, start..start + len as u64)
            .map(Bytes::from)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// The bytes from `start` on, fetched a window at a time as they are read: the Parquet
    /// reader asks for a reader at each page only to read that page's header.
    pub fn reader(&self, start: u64) -> std::io::Result<Box<dyn Read + Send>> {
        Ok(Box::new(Window {
            file: RemoteFile {
                remote: self.remote.clone(),
                name: self.name.clone(),
                len: self.len,
            },
            pos: start,
            buf: Bytes::new(),
            size: 64 << 10,
        }))
    }
}

/// A reader of an object from a position on, by ranged requests that double in size (from
/// 64 KiB to 8 MiB) while it keeps reading.
struct Window {
    file: RemoteFile,
    pos: u64,
    buf: Bytes,
    size: usize,
}

impl Read for Window {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.buf.is_empty() {
            let left = self.file.len.saturating_sub(self.pos) as usize;
            if left == 0 {
                return Ok(0);
            }
            let n = self.size.min(left);
            self.buf = self.file.read(self.pos, n)?;
            self.pos += n as u64;
            self.size = (self.size * 2).min(8 << 20);
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf[..n]);
        self.buf = self.buf.slice(n..);
        Ok(n)
    }
}
