//! Opening a cache: read the manifest, validate every shard's size and header, map it.
//!
//! Every file of the cache is opened relative to its directory, held open for as long as the
//! cache (`Folder`): `dsc compile --force` replaces a cache by swapping whole directories, so a
//! reader that holds one directory reads one version of the cache, never the manifest of one
//! and the shards of the other (shards of the same inputs compiled with another seed pass every
//! size and header check, and an epoch of both would hold some contexts twice and miss others).
//! A version removed while it is being opened makes the open fail on a missing file; the open
//! is then retried on the directory now at the path.

use crate::body::{read_stored, Body, Cold, Resident, Shard, ShardBytes};
use crate::error::LoadError;
use crate::mmap::Mapped;
use crate::pool::Pool;
use dsc_format::keys::KeyTable;
use dsc_format::stored::read_layout_of;
use dsc_format::{FormatError, GenerationRef, Manifest, ShardEntry, Stats, TensorRole, TensorSpec};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// A cache's directory, held open: its files are opened relative to it (`openat`), whatever
/// later happens to its path.
#[derive(Debug)]
pub(crate) struct Folder {
    handle: std::fs::File,
    path: PathBuf,
}

impl Folder {
    fn open(path: &Path) -> std::io::Result<Folder> {
        let handle = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(path)?;
        Ok(Folder {
            handle,
            path: path.into(),
        })
    }

    /// The file `name` (relative, e.g. `shards/train-00000.safetensors`) of this directory.
    fn open_file(&self, name: &str) -> std::io::Result<std::fs::File> {
        use std::os::fd::{AsRawFd, FromRawFd};
        let c = std::ffi::CString::new(name)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        // SAFETY: `openat` with a directory descriptor this struct owns (open for its lifetime)
        // and a NUL-terminated name; it only opens a file, read-only.
        let fd = unsafe {
            libc::openat(
                self.handle.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a descriptor `openat` just returned, owned by nothing else.
        Ok(unsafe { std::fs::File::from_raw_fd(fd) })
    }

    fn read(&self, name: &str) -> std::io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut self.open_file(name)?, &mut bytes)?;
        Ok(bytes)
    }

    /// The generations after the first of the cache held (listed by its path: a cache replaced
    /// meanwhile makes the open fail on a missing file, and it is retried).
    fn generations(&self) -> std::io::Result<Vec<u32>> {
        dsc_format::generation::listed(&self.path)
    }

    /// Whether the path now names another directory than the one held: the cache was replaced
    /// (or removed) since it was opened.
    fn replaced(&self) -> bool {
        match (self.handle.metadata(), std::fs::metadata(&self.path)) {
            (Ok(held), Ok(now)) => (held.dev(), held.ino()) != (now.dev(), now.ino()),
            _ => true,
        }
    }
}

/// A held folder's files, for [`Manifest::open_generation`].
struct HeldFiles<'a>(&'a Folder);

impl dsc_format::generation::CacheFiles for HeldFiles<'_> {
    fn read(&mut self, name: &str) -> std::io::Result<Vec<u8>> {
        self.0.read(name)
    }

    fn generations(&mut self) -> std::io::Result<Vec<u32>> {
        self.0.generations()
    }
}

/// Where an open cache's files come from.
#[derive(Debug)]
pub(crate) enum Origin {
    /// A local directory, held open: every file was opened from it.
    Folder(Folder),
    /// Object storage: shards are fetched into a bounded local folder ahead of use.
    #[cfg(feature = "remote")]
    Remote(crate::remote::Fetcher),
}

#[derive(Debug)]
pub(crate) struct Inner {
    /// The cache's directory, or its URL (for messages).
    pub dir: PathBuf,
    pub origin: Origin,
    pub manifest: Manifest,
    /// Shards by split name, in index order.
    pub splits: Vec<(String, Vec<Shard>)>,
    /// The decompressed shards of a compressed cache.
    pub resident: Resident,
    /// Each split's stored lengths, once read (for length bucketing).
    pub lengths: Vec<OnceLock<Arc<[u32]>>>,
    /// Gather buffers, shared by this cache's loaders.
    pub pool: Arc<Pool>,
}

impl Inner {
    /// The error for a split this cache lacks, naming the ones it has.
    pub(crate) fn no_split(&self, split: &str) -> LoadError {
        LoadError::NoSplit {
            dir: self.dir.clone(),
            split: split.into(),
            splits: self.splits.iter().map(|(n, _)| n.clone()).collect(),
        }
    }

    /// The safetensors bytes of shard `shard` of split `split`: mapped; decompressed (kept
    /// among the resident shards, [`Resident::decompressed`]); or, from object storage, its
    /// fetched copy (waiting for the download when it is not there yet, until `stop` is set:
    /// [`crate::remote::Fetcher::get`]).
    pub(crate) fn shard_bytes(
        &self,
        split: usize,
        shard: usize,
        stop: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<ShardBytes<'_>, LoadError> {
        #[cfg(not(feature = "remote"))]
        let _ = stop;
        let s = &self.splits[split].1[shard];
        let held = match &s.body {
            Body::Mapped(map) => return Ok(ShardBytes::Mapped(map.bytes())),
            Body::Cold(_) => self
                .resident
                .decompressed(&self.splits, split, shard, || read_stored(s))?,
            #[cfg(feature = "remote")]
            Body::Remote { id, cold } => {
                let local = self.fetcher().get(*id, stop)?;
                if cold.is_none() {
                    return Ok(ShardBytes::Held(local));
                }
                self.resident
                    .decompressed(&self.splits, split, shard, || local.read_stored())?
            }
        };
        Ok(ShardBytes::Held(held))
    }

    /// The position of split `split` among the cache's.
    fn split_index(&self, split: &str) -> Result<usize, LoadError> {
        self.splits
            .iter()
            .position(|(name, _)| name == split)
            .ok_or_else(|| self.no_split(split))
    }

    /// The manifest position of the tensor of `role` (the key, the length: every cache has
    /// one of each).
    fn slot(&self, role: TensorRole) -> usize {
        self.manifest
            .tensors()
            .iter()
            .position(|t| t.role == role)
            .expect("a validated manifest has a key and a length tensor")
    }

    /// The first `end` bytes of `shard`'s safetensors file, for what lies at its start (keys,
    /// lengths): mapped; of a compressed shard, its frame decompressed up to them into a
    /// buffer dropped after use (decompressed whole, every shard of the split passed through
    /// the resident set before the first batch: 331 MB peak for `dsc order --bucket` on a
    /// 344 MB cache, 30 MB this way); of a shard in object storage not fetched, by ranged
    /// requests. The data is decompressed and checked when its batches are read.
    fn head<'a>(
        &self,
        shard: &'a Shard,
        end: usize,
    ) -> Result<std::borrow::Cow<'a, [u8]>, LoadError> {
        Ok(match &shard.body {
            Body::Mapped(map) => std::borrow::Cow::Borrowed(map.bytes()),
            Body::Cold(_) => std::borrow::Cow::Owned(dsc_format::stored::read_prefix(
                &shard.entry,
                shard.file.as_ref().expect("a local shard has its file"),
                &shard.path,
                end,
            )?),
            #[cfg(feature = "remote")]
            Body::Remote { id, .. } => {
                std::borrow::Cow::Owned(self.fetcher().prefix(*id, &shard.entry, end)?)
            }
        })
    }

    /// The fetcher of a cache in object storage.
    #[cfg(feature = "remote")]
    pub(crate) fn fetcher(&self) -> &crate::remote::Fetcher {
        match &self.origin {
            Origin::Remote(f) => f,
            Origin::Folder(_) => unreachable!("only a remote cache has remote shards"),
        }
    }
}

/// An open cache. Cheap to clone; loaders share it.
#[derive(Debug, Clone)]
pub struct Cache {
    pub(crate) inner: Arc<Inner>,
}

impl Cache {
    /// Opens the cache in `dir`: reads and validates the manifest, then checks every shard's size
    /// and safetensors header against it before mapping it. Costs O(shards): the header of each
    /// shard is read, its data is not. The manifest and the shards come from one version of the
    /// cache even while `dsc compile --force` replaces it (see the module documentation).
    ///
    /// A URL (`s3://bucket/cache`, `gs://…`, `az://…`, `https://…`) opens a cache in object
    /// storage with the local folder and limit of the environment
    /// ([`crate::RemoteOptions::from_env`]; [`Cache::open_remote`] takes them as arguments).
    pub fn open(dir: impl AsRef<Path>) -> Result<Cache, LoadError> {
        let dir = dir.as_ref();
        if let Some(url) = dir.to_str().filter(|d| crate::remote::is_remote(d)) {
            return Cache::open_remote(url, &crate::RemoteOptions::from_env()?);
        }
        Cache::open_local(dir, &GenerationRef::Latest)
    }

    /// Opens the cache at `url` in object storage. Reads `manifest.json` and every shard's
    /// header (ranged requests for the first KBs of each, several at once; from the local copy
    /// when one is kept from an earlier run) and checks them against the manifest as
    /// [`Cache::open`] does; shards are fetched into `opts.dir` as loaders need them, ahead of
    /// use in their order, and checked against the manifest's size and xxh3 on arrival.
    #[cfg(feature = "remote")]
    pub fn open_remote(url: &str, opts: &crate::RemoteOptions) -> Result<Cache, LoadError> {
        let opened = crate::remote::open(url, opts)?;
        Ok(Cache {
            inner: Arc::new(Inner {
                dir: PathBuf::from(opened.url),
                origin: Origin::Remote(opened.fetcher),
                manifest: opened.manifest,
                lengths: opened.splits.iter().map(|_| OnceLock::new()).collect(),
                splits: opened.splits,
                resident: opened.resident,
                pool: Arc::default(),
            }),
        })
    }

    /// Refused: this build has no object storage support (the `remote` feature).
    #[cfg(not(feature = "remote"))]
    pub fn open_remote(url: &str, _opts: &crate::RemoteOptions) -> Result<Cache, LoadError> {
        Err(LoadError::NoRemote { url: url.into() })
    }

    /// Opens the cache at `location`: a local directory ([`Cache::open`]), or a URL with these
    /// options for object storage ([`Cache::open_remote`]).
    pub fn open_with(
        location: impl AsRef<Path>,
        remote: &crate::RemoteOptions,
    ) -> Result<Cache, LoadError> {
        let location = location.as_ref();
        match location.to_str().filter(|d| crate::remote::is_remote(d)) {
            Some(url) => Cache::open_remote(url, remote),
            None => Cache::open_local(location, &remote.generation),
        }
    }

    /// The cache in local directory `dir` ([`Cache::open`]).
    fn open_local(dir: &Path, at: &GenerationRef) -> Result<Cache, LoadError> {
        // A replace swaps directories and then removes the old one: an open that loses that
        // race finds files missing from the directory it holds. Three replaces in a row within
        // one open would be a loop of compiles, not a replace; its error is then returned.
        let mut tries = 0;
        loop {
            let folder = Folder::open(dir).map_err(|e| FormatError::io(dir, e))?;
            match Self::read_in(dir, &folder, at) {
                Ok((manifest, splits)) => {
                    return Ok(Cache {
                        inner: Arc::new(Inner {
                            dir: dir.into(),
                            origin: Origin::Folder(folder),
                            manifest,
                            lengths: splits.iter().map(|_| OnceLock::new()).collect(),
                            splits,
                            resident: Resident::default(),
                            pool: Arc::default(),
                        }),
                    })
                }
                Err(_) if tries < 3 && folder.replaced() => tries += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// The manifest of the cache held as `folder` (at `dir`), and its shards by split, each
    /// checked and mapped.
    #[allow(clippy::type_complexity)]
    fn read_in(
        dir: &Path,
        folder: &Folder,
        at: &GenerationRef,
    ) -> Result<(Manifest, Vec<(String, Vec<Shard>)>), LoadError> {
        let manifest = Manifest::open_generation(dir, at, &mut HeldFiles(folder))?;
        let mut splits: Vec<(String, Vec<Shard>)> = manifest
            .splits()
            .iter()
            .map(|s| (s.name.clone(), Vec::with_capacity(s.shards)))
            .collect();
        for (mapped, entry) in manifest.shards().iter().enumerate() {
            let shard = open_shard(dir, folder, &manifest, entry, mapped)?;
            splits
                .iter_mut()
                .find(|(name, _)| *name == entry.split)
                .expect("validated: every shard names a listed split")
                .1
                .push(shard);
        }
        Ok((manifest, splits))
    }

    /// `stats.json`, read from the directory the cache was opened from (the statistics of the
    /// same version as the shards, whatever replaced the cache since).
    pub fn stats(&self) -> Result<Stats, LoadError> {
        let name = self.inner.manifest.stats_file();
        let path = self.inner.dir.join(&name);
        let bytes = match &self.inner.origin {
            Origin::Folder(folder) => folder.read(&name).map_err(|e| FormatError::io(&path, e))?,
            #[cfg(feature = "remote")]
            Origin::Remote(fetcher) => fetcher.read(&name)?,
        };
        Ok(Stats::from_json(&bytes, &path)?)
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.inner.manifest
    }

    /// The cache directory (its URL for a cache in object storage).
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// For a cache in object storage, the local folder its shards are fetched into (`None` for
    /// a local cache).
    pub fn fetch_folder(&self) -> Option<&Path> {
        match &self.inner.origin {
            Origin::Folder(_) => None,
            #[cfg(feature = "remote")]
            Origin::Remote(f) => Some(f.folder()),
        }
    }

    /// The safetensors bytes of shard `index` of `split` (mapped, or decompressed and kept
    /// among the resident shards): for measuring (e.g. memcpy of the same bytes) and for tools
    /// that read shards directly.
    pub fn shard_bytes(&self, split: &str, index: usize) -> Result<ShardBytes<'_>, LoadError> {
        match self.inner.splits.iter().position(|(name, _)| name == split) {
            Some(s) if index < self.inner.splits[s].1.len() => {
                self.inner.shard_bytes(s, index, None)
            }
            _ => Err(LoadError::NoShard {
                dir: self.inner.dir.clone(),
                split: split.into(),
                index,
            }),
        }
    }

    /// The stored length of every context of `split`, in compiled order: 4 bytes per context
    /// read from each shard's `length` tensor (of a compressed shard, the start of its frame is
    /// decompressed up to them), once per open cache.
    pub fn lengths(&self, split: &str) -> Result<Arc<[u32]>, LoadError> {
        let inner = &self.inner;
        let index = inner.split_index(split)?;
        if let Some(lengths) = inner.lengths[index].get() {
            return Ok(lengths.clone());
        }
        let mut out = Vec::new();
        self.each_shards_samples(index, TensorRole::Length, 4, |_, samples| {
            out.extend(
                samples
                    .chunks_exact(4)
                    .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")).max(0) as u32),
            );
            true
        })?;
        Ok(inner.lengths[index].get_or_init(|| out.into()).clone())
    }

    /// The contexts of `split` per shard: those stored, and those a reader of this generation
    /// sees (all but the ones a later generation hides).
    pub fn contexts(&self, split: &str) -> Result<crate::order::SplitContexts, LoadError> {
        let shards = &self.inner.splits[self.inner.split_index(split)?].1;
        Ok(crate::order::SplitContexts::of_entries(
            shards.iter().map(|s| &s.entry),
        ))
    }

    /// The `key` tensor of `split` (each context's key id), in compiled order: 8 bytes per
    /// context read as [`Cache::lengths`] reads lengths.
    pub fn key_ids(&self, split: &str) -> Result<Vec<i64>, LoadError> {
        let mut out = Vec::new();
        let index = self.inner.split_index(split)?;
        self.each_shards_samples(index, TensorRole::Key, 8, |_, samples| {
            out.extend(
                samples
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))),
            );
            true
        })?;
        Ok(out)
    }

    /// The position in `split`'s compiled order of the context with `key`, if it holds one:
    /// each shard's `key` tensor read as [`Cache::lengths`] reads lengths (of a shard in object
    /// storage, its start by ranged requests, nothing fetched), shard by shard until found.
    pub fn find_key(&self, split: &str, key: i64) -> Result<Option<usize>, LoadError> {
        let mut found = None;
        let index = self.inner.split_index(split)?;
        self.each_shards_samples(index, TensorRole::Key, 8, |entry, samples| {
            // A context a later generation hides is not found: its key is elsewhere now.
            let at = samples.chunks_exact(8).enumerate().position(|(at, b)| {
                i64::from_le_bytes(b.try_into().expect("8 bytes")) == key && !entry.is_hidden(at)
            });
            found = at.map(|at| entry.first_context + at);
            found.is_none()
        })?;
        Ok(found)
    }

    /// Calls `f(shard entry, samples)` with each shard of split `index` in order, `samples`
    /// its per-context tensor of `role` (`width` bytes a context), read from the start of the
    /// shard only, until `f` returns false.
    fn each_shards_samples(
        &self,
        index: usize,
        role: TensorRole,
        width: usize,
        mut f: impl FnMut(&ShardEntry, &[u8]) -> bool,
    ) -> Result<(), LoadError> {
        let inner = &self.inner;
        let slot = inner.slot(role);
        for shard in &inner.splits[index].1 {
            let start = shard.tensor_starts[slot];
            let end = start + width * shard.entry.contexts;
            let head = inner.head(shard, end)?;
            if !f(&shard.entry, &head[start..end]) {
                break;
            }
        }
        Ok(())
    }

    /// The keys of `split` as the data held them, in compiled order, with their ids: read from
    /// its shards' key tables (fetched from object storage, checked against the manifest's
    /// checksums). `None` for a cache of integer keys, whose `key` tensor holds the keys.
    pub fn key_table(&self, split: &str) -> Result<Option<KeyTable>, LoadError> {
        let inner = &self.inner;
        let shards = &inner.splits[inner.split_index(split)?].1;
        if !dsc_format::keys::key_type(&inner.manifest).is_hashed() {
            return Ok(None);
        }
        let mut all = KeyTable {
            ids: Vec::new(),
            texts: Vec::new(),
        };
        for shard in shards {
            let Some(table) = &shard.entry.keys else {
                return Err(FormatError::BadValue {
                    shard: inner.dir.join(&shard.entry.file),
                    tensor: "key".into(),
                    sample: 0,
                    reason: "the keys are hashed, but the manifest lists no key table".into(),
                }
                .into());
            };
            let path = inner.dir.join(&table.file);
            let bytes = match &inner.origin {
                Origin::Folder(folder) => folder
                    .read(&table.file)
                    .map_err(|e| FormatError::io(&path, e))?,
                #[cfg(feature = "remote")]
                Origin::Remote(fetcher) => fetcher.read(&table.file)?,
            };
            dsc_format::checksum::check(
                dsc_format::checksum::xxh3_hex(&bytes),
                &table.xxh3,
                &path,
            )?;
            let read = dsc_format::keys::read_key_table(&bytes, &path)?;
            all.ids.extend(read.ids);
            all.texts.extend(read.texts);
        }
        Ok(Some(all))
    }

    /// The tensors of every batch, in order.
    pub fn tensors(&self) -> &[TensorSpec] {
        self.inner.manifest.tensors()
    }
}

/// Opens, checks and maps shard `entry` (the `mapped`-th of the manifest) from `folder`.
fn open_shard(
    dir: &Path,
    folder: &Folder,
    manifest: &Manifest,
    entry: &ShardEntry,
    mapped: usize,
) -> Result<Shard, LoadError> {
    let path = dir.join(&entry.file);
    let map_err = |source| LoadError::Map {
        path: path.clone(),
        source,
    };
    let file = folder.open_file(&entry.file).map_err(map_err)?;
    let size = file.metadata().map_err(map_err)?.len();
    if size != entry.stored_bytes() {
        return Err(FormatError::ShardSize {
            shard: path,
            expected: entry.stored_bytes(),
            found: size,
        }
        .into());
    }
    let layout = read_layout_of(entry, &file, &path)?;
    layout.check(manifest, entry, &path)?;
    let body = if entry.compressed.is_some() {
        Body::Cold(Cold::default())
    } else {
        Body::Mapped(Mapped::map(&file, size, &path).map_err(|source| {
            if source.raw_os_error() == Some(libc::ENOMEM) {
                LoadError::OutOfMaps {
                    path: path.clone(),
                    source,
                    mapped,
                    shards: manifest.shards().len(),
                    max_map_count: std::fs::read_to_string("/proc/sys/vm/max_map_count")
                        .map_or_else(|_| "an unknown number of".into(), |s| s.trim().into()),
                }
            } else {
                LoadError::Map {
                    path: path.clone(),
                    source,
                }
            }
        })?)
    };
    Ok(Shard::new(manifest, entry, &layout, body, Some(file), path))
}

/// The stored lengths of split `split` of each of `sources`, one after another (the positions
/// of a mix's samples).
pub(crate) fn lengths_of(sources: &[Cache], split: &str) -> Result<Arc<[u32]>, LoadError> {
    if let [one] = sources {
        return one.lengths(split);
    }
    let mut all = Vec::new();
    for cache in sources {
        all.extend_from_slice(&cache.lengths(split)?);
    }
    Ok(all.into())
}

/// The content id of the caches of `manifests` (a generation each): their `content_id`s,
/// joined by `+`.
pub(crate) fn content_of<'a>(manifests: impl IntoIterator<Item = &'a Manifest>) -> String {
    manifests
        .into_iter()
        .map(Manifest::content_id)
        .collect::<Vec<_>>()
        .join("+")
}
