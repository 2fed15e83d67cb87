//! Caches in object storage (`s3://…`, `gs://…`, `az://…`, `https://…`): opened from their
//! manifest and shard headers, their shards fetched into a bounded local folder ahead of use in
//! the loader's known order ([`fetch`]), checked on arrival, then read like a local cache's.
//!
//! Built with the `remote` feature; without it a URL is refused with a message saying so.

#[cfg(feature = "remote")]
mod fetch;
#[cfg(feature = "remote")]
mod open;

#[cfg(feature = "remote")]
pub(crate) use fetch::{Fetcher, Local, PlanGuard};
#[cfg(feature = "remote")]
pub(crate) use open::open;
#[cfg(feature = "remote")]
pub use open::{fetch_shards, ShardFile, ShardFiles};

use crate::error::LoadError;
use std::path::PathBuf;

/// Whether `location` names a cache in object storage rather than a local directory.
pub fn is_remote(location: &str) -> bool {
    #[cfg(feature = "remote")]
    {
        dsc_store::is_remote(location)
    }
    #[cfg(not(feature = "remote"))]
    {
        location.contains("://")
    }
}

/// Where a cache in object storage is kept while it is read, and how much of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteOptions {
    /// The folder under which fetched shards are kept, one subfolder per cache (named by its
    /// content id, so that a run reuses what an earlier run of the same cache fetched).
    pub dir: PathBuf,
    /// Bytes of fetched shards kept at most (`None`: every shard is kept once fetched). At
    /// least the largest shard; a quarter of the cache keeps every shard fetched once per
    /// epoch with the default window.
    pub limit: Option<u64>,
    /// Downloads at once.
    pub fetch_threads: usize,
    /// Configuration of the store, as object_store's keys (`aws_endpoint`, `aws_region`,
    /// `aws_access_key_id`, `google_service_account`, …): these win over the environment.
    pub store: Vec<(String, String)>,
    /// Which generation of the cache to open, local or in object storage: the last one unless
    /// told (a loader resuming a state opens the generation the state names).
    pub generation: dsc_format::GenerationRef,
}

impl RemoteOptions {
    /// The local folder where an append to the cache at `url` compiles its generation before
    /// publishing it (`DIR/appends/{xxh3 of the URL}`), its parent created.
    pub fn append_folder(&self, url: &str) -> std::io::Result<PathBuf> {
        let dir = self.dir.join("appends");
        std::fs::create_dir_all(&dir)?;
        Ok(dir.join(dsc_format::checksum::xxh3_hex(url.as_bytes())))
    }
}

/// Downloads at once unless told otherwise: enough to fill a link to object storage from one
/// machine, few enough not to crowd the loader's own threads.
pub const DEFAULT_FETCH_THREADS: usize = 4;

impl RemoteOptions {
    /// The options of the environment: `DSC_CACHE_DIR` (else `$XDG_CACHE_HOME/dsc`, else
    /// `~/.cache/dsc`), `DSC_CACHE_LIMIT` (a size such as `20GiB`; else no limit) and
    /// `DSC_FETCH_THREADS` (else 4).
    pub fn from_env() -> Result<RemoteOptions, LoadError> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let dir = match env("DSC_CACHE_DIR") {
            Some(d) => PathBuf::from(d),
            None => match env("XDG_CACHE_HOME") {
                Some(x) => PathBuf::from(x).join("dsc"),
                None => {
                    PathBuf::from(env("HOME").unwrap_or_else(|| "/tmp".into())).join(".cache/dsc")
                }
            },
        };
        let limit = match env("DSC_CACHE_LIMIT") {
            Some(s) => Some(dsc_format::spec::parse_size(&s).map_err(|problem| {
                dsc_format::spelling::OptionError::new(
                    "cache_limit",
                    format!("DSC_CACHE_LIMIT={s}: {problem}"),
                )
            })?),
            None => None,
        };
        let fetch_threads = match env("DSC_FETCH_THREADS") {
            Some(s) => s.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                dsc_format::spelling::OptionError::new(
                    "fetch_threads",
                    format!("DSC_FETCH_THREADS={s}: not a positive whole number"),
                )
            })?,
            None => DEFAULT_FETCH_THREADS,
        };
        Ok(RemoteOptions {
            dir,
            limit,
            fetch_threads,
            store: Vec::new(),
            generation: dsc_format::GenerationRef::Latest,
        })
    }
}

/// The manifest and statistics of the cache at `location` (a local directory, or a URL read
/// with `remote`'s store options), without opening its shards: what `dsc inspect` shows.
pub fn read_meta(
    location: &std::path::Path,
    remote: &RemoteOptions,
) -> Result<(dsc_format::Manifest, dsc_format::Stats), LoadError> {
    let Some(url) = location.to_str().filter(|l| is_remote(l)) else {
        let manifest = dsc_format::Manifest::read_at(location, &remote.generation)?;
        let stats = dsc_format::Stats::read(location, &manifest)?;
        return Ok((manifest, stats));
    };
    #[cfg(feature = "remote")]
    {
        let store = dsc_store::Remote::open_with(url, &remote.store)?;
        let manifest = remote_manifest(&store, &remote.generation)?;
        let name = manifest.stats_file();
        let bytes = store.get(&name)?;
        let path = PathBuf::from(store.url_of(&name));
        let stats = dsc_format::Stats::from_json(&bytes, &path)?;
        Ok((manifest, stats))
    }
    #[cfg(not(feature = "remote"))]
    {
        let _ = remote;
        Err(LoadError::NoRemote { url: url.into() })
    }
}

/// Generation `at` of the cache at `store`'s URL, validated.
#[cfg(feature = "remote")]
pub(crate) fn remote_manifest(
    store: &dsc_store::Remote,
    at: &dsc_format::GenerationRef,
) -> Result<dsc_format::Manifest, LoadError> {
    // The first manifest's absence is told apart from a missing bucket before anything else.
    let first = manifest_bytes(store)?;
    let mut files = StoreFiles {
        store,
        first: Some(first),
    };
    let dir = PathBuf::from(store.url());
    Ok(dsc_format::Manifest::open_generation(&dir, at, &mut files)?)
}

/// A cache's files in object storage, for [`dsc_format::Manifest::open_generation`], with
/// `manifest.json` already fetched.
#[cfg(feature = "remote")]
struct StoreFiles<'a> {
    store: &'a dsc_store::Remote,
    first: Option<Vec<u8>>,
}

#[cfg(feature = "remote")]
impl dsc_format::generation::CacheFiles for StoreFiles<'_> {
    fn read(&mut self, name: &str) -> std::io::Result<Vec<u8>> {
        match self
            .first
            .take()
            .filter(|_| name == dsc_format::MANIFEST_FILE)
        {
            Some(bytes) => Ok(bytes),
            None => self.store.clone().read(name),
        }
    }

    fn generations(&mut self) -> std::io::Result<Vec<u32>> {
        self.store.clone().generations()
    }
}

/// The bytes of the manifest of the cache at `store`'s URL. Without one, a listing tells a
/// missing bucket (or refused credentials) from a prefix that holds no cache: the manifest's
/// 404 alone said "not a dsc cache" of a bucket that does not exist.
#[cfg(feature = "remote")]
pub(crate) fn manifest_bytes(store: &dsc_store::Remote) -> Result<Vec<u8>, LoadError> {
    match store.get(dsc_format::MANIFEST_FILE) {
        Ok(bytes) => Ok(bytes),
        Err(dsc_store::StoreError::NotFound { .. }) => {
            store.list()?;
            Err(dsc_format::FormatError::NotACache {
                dir: PathBuf::from(store.url()),
            }
            .into())
        }
        Err(e) => Err(e.into()),
    }
}
