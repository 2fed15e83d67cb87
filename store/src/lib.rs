//! dsc caches in object storage: S3 (and S3-compatible servers), Google Cloud Storage, Azure
//! Blob Storage and plain HTTP, through the `object_store` crate, as blocking calls.
//!
//! A cache in object storage is the cache directory's files under a prefix:
//! `s3://bucket/caches/pulses/manifest.json`, `…/stats.json`, `…/shards/train-00000.safetensors`.
//! Two rules make it safe to read while it is written:
//!
//! - **The manifest is published last** ([`upload_cache`]): every shard and `stats.json` are in
//!   place before `manifest.json` names them, so a reader that finds a manifest finds its shards.
//! - **Nothing downloaded is used unchecked** ([`Remote::download`]): a shard arrives in a
//!   partial file, its size and xxh3 are compared with the manifest's, and only then is it
//!   renamed into place. A download cut short leaves a partial file that no reader opens.
//!
//! Credentials and endpoints come the way `object_store` and the AWS tools take them
//! ([`Remote::open`]): `AWS_*`, `GOOGLE_*` and `AZURE_*` environment variables, and for S3 the
//! shared files `~/.aws/credentials` and `~/.aws/config` (`AWS_PROFILE`); an `http://` endpoint
//! (a server on localhost, say) is allowed without TLS.
//!
//! ```no_run
//! let remote = dsc_store::Remote::open("s3://bucket/caches/pulses")?;
//! let manifest = remote.get("manifest.json")?;
//! # Ok::<(), dsc_store::StoreError>(())
//! ```
#![deny(missing_docs)]

mod cache_files;
mod connect;
mod error;
mod runtime;
mod transfer;
mod upload;

pub use connect::is_remote;
pub use error::StoreError;
pub use transfer::{
    stop_downloads_when, upload_cache, upload_cache_until, Expected, ObjectReader, Uploaded,
};
pub use upload::Upload;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use std::sync::{Arc, Mutex};

/// A cache's location in object storage: a store and the prefix its files live under.
/// Cheap to clone; safe to share between threads.
#[derive(Debug, Clone)]
pub struct Remote {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The URL as given, without a trailing `/`: what messages name.
    url: String,
    /// Configuration keys given with it ([`Remote::open_with`]).
    options: Vec<(String, String)>,
    prefix: ObjectPath,
    /// The store's client and the runtime it runs on, for the process that made them: a
    /// forked child (whose copy of the runtime has no threads) makes its own.
    client: Mutex<Client>,
}

#[derive(Debug, Clone)]
struct Client {
    pid: u32,
    store: Arc<dyn ObjectStore>,
    runtime: Arc<tokio::runtime::Runtime>,
}

/// The bytes of a side file given where a local path or an object's URL may stand (a spec
/// file, a key file, a loader state): read from disk, or fetched whole with `options`.
pub fn read_location(location: &str, options: &[(String, String)]) -> Result<Vec<u8>, StoreError> {
    if !is_remote(location) {
        let path = std::path::Path::new(location);
        return std::fs::read(path).map_err(|e| StoreError::io(path, e));
    }
    let (folder, name) = location.rsplit_once('/').unwrap_or((location, ""));
    Remote::open_with(folder, options)?.get(name)
}

impl Remote {
    /// The cache at `url` (`s3://bucket/prefix`, `gs://…`, `az://…`, `https://…`). Nothing is
    /// read yet: a bad URL or missing credentials fail here, an absent cache at the first read.
    pub fn open(url: &str) -> Result<Remote, StoreError> {
        Remote::open_with(url, &[])
    }

    /// [`Remote::open`] with configuration keys of object_store's builders, which win over the
    /// environment: `aws_endpoint`, `aws_region`, `aws_access_key_id`, `aws_allow_http`,
    /// `google_service_account`, `azure_storage_account_name`, … (an unknown key is refused).
    pub fn open_with(url: &str, options: &[(String, String)]) -> Result<Remote, StoreError> {
        let url = url.trim_end_matches('/').to_string();
        let (store, prefix) = connect::connect(&url, options)?;
        Ok(Remote {
            inner: Arc::new(Inner {
                client: Mutex::new(Client {
                    pid: std::process::id(),
                    store,
                    runtime: runtime::shared()?,
                }),
                url,
                options: options.to_vec(),
                prefix,
            }),
        })
    }

    /// The URL the cache was opened at.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// The URL of the cache's file `name` (relative, e.g. `shards/train-00000.safetensors`).
    pub fn url_of(&self, name: &str) -> String {
        format!("{}/{name}", self.inner.url)
    }

    /// The object `name` names under the prefix, as given: `ObjectPath::from` would
    /// percent-encode `é`, `~`, `%`, `#`, `?` and more, and the client encodes the request
    /// again, so the store would hold `cach%C3%A9` where the user named `caché`.
    fn path_of(&self, name: &str) -> Result<ObjectPath, StoreError> {
        let prefix = self.inner.prefix.as_ref();
        let full = match prefix.is_empty() {
            true => name.to_string(),
            false => format!("{prefix}/{name}"),
        };
        ObjectPath::parse(&full).map_err(|e| StoreError::Url {
            url: self.url_of(name),
            problem: format!("not an object name a store takes: {e}"),
        })
    }

    fn client(&self) -> Result<Client, StoreError> {
        let mut client = self.inner.client.lock().unwrap_or_else(|p| p.into_inner());
        if client.pid != std::process::id() {
            let (store, _) = connect::connect(&self.inner.url, &self.inner.options)?;
            let parents = std::mem::replace(
                &mut *client,
                Client {
                    pid: std::process::id(),
                    store,
                    runtime: runtime::shared()?,
                },
            );
            // A forked child's copy of its parent's client and runtime: dropping the runtime
            // would wait for threads that do not exist in this process.
            std::mem::forget(parents);
        }
        Ok(client.clone())
    }

    /// Runs `f(store, path of name)` to completion on the store's runtime; its error names
    /// the object's URL.
    fn run<T, F>(
        &self,
        name: &str,
        f: impl FnOnce(Arc<dyn ObjectStore>, ObjectPath) -> F,
    ) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = object_store::Result<T>>,
    {
        let client = self.client()?;
        let path = self.path_of(name)?;
        client
            .runtime
            .block_on(f(client.store.clone(), path))
            .map_err(|e| StoreError::from_store(self.url_of(name), e))
    }

    /// The whole object `name`.
    pub fn get(&self, name: &str) -> Result<Vec<u8>, StoreError> {
        self.run(name, |store, path| async move {
            let bytes = store.get(&path).await?.bytes().await?;
            Ok(bytes.to_vec())
        })
    }

    /// Bytes `range` of object `name`.
    pub fn get_range(
        &self,
        name: &str,
        range: std::ops::Range<u64>,
    ) -> Result<Vec<u8>, StoreError> {
        let want = range.end - range.start;
        let bytes = self.run(name, |store, path| async move {
            Ok(store.get_range(&path, range).await?.to_vec())
        })?;
        if bytes.len() as u64 != want {
            return Err(StoreError::Short {
                url: self.url_of(name),
                expected: want,
                found: bytes.len() as u64,
            });
        }
        Ok(bytes)
    }

    /// What the store says of object `name`: its size and its version (the entity tag, else
    /// the time it was last written), which changes whenever its bytes do.
    pub fn head(&self, name: &str) -> Result<(u64, String), StoreError> {
        self.run(name, |store, path| async move { store.head(&path).await })
            .map(|m| {
                let version = m.e_tag.unwrap_or_else(|| m.last_modified.to_rfc3339());
                (m.size, version)
            })
    }

    /// Whether object `name` exists.
    pub fn exists(&self, name: &str) -> Result<bool, StoreError> {
        match self.run(name, |store, path| async move { store.head(&path).await }) {
            Ok(_) => Ok(true),
            Err(StoreError::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes `bytes` as object `name` (whole: readers see the old object or the new one).
    pub fn put(&self, name: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.run(name, |store, path| async move {
            store.put(&path, bytes.into()).await.map(|_| ())
        })
    }

    /// Writes `bytes` as object `name` only if no object has that name (a conditional put:
    /// S3's `If-None-Match: *`, and the preconditions of GCS and Azure): `Ok(false)`, writing
    /// nothing, when one has. How a cache's generation is committed by one writer only.
    pub fn put_new(&self, name: &str, bytes: Vec<u8>) -> Result<bool, StoreError> {
        let put = self.run(name, |store, path| async move {
            let opts = object_store::PutOptions::from(object_store::PutMode::Create);
            match store.put_opts(&path, bytes.into(), opts).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        });
        put
    }

    /// Removes object `name` (absent already is not an error).
    pub fn delete(&self, name: &str) -> Result<(), StoreError> {
        match self.run(name, |store, path| async move { store.delete(&path).await }) {
            Err(StoreError::NotFound { .. }) => Ok(()),
            other => other,
        }
    }

    /// Every object under the cache's prefix: its name relative to the prefix, and its size.
    pub fn list(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.list_under(self.inner.prefix.clone())
    }

    /// Every object under the cache's folder `folder` (e.g. `generations`): its name relative
    /// to that folder, and its size. Lists that folder alone, not the whole cache.
    pub fn list_in(&self, folder: &str) -> Result<Vec<(String, u64)>, StoreError> {
        self.list_under(self.path_of(folder)?)
    }

    fn list_under(&self, prefix: ObjectPath) -> Result<Vec<(String, u64)>, StoreError> {
        let client = self.client()?;
        let found: Vec<object_store::ObjectMeta> = client
            .runtime
            .block_on(client.store.list(Some(&prefix)).try_collect())
            .map_err(|e| StoreError::from_store(self.inner.url.clone(), e))?;
        let skip = prefix.parts().count();
        let mut out: Vec<(String, u64)> = found
            .into_iter()
            .map(|m| {
                let name: Vec<String> = m
                    .location
                    .parts()
                    .skip(skip)
                    .map(|p| p.as_ref().to_string())
                    .collect();
                (name.join("/"), m.size)
            })
            .collect();
        out.sort();
        Ok(out)
    }
}
