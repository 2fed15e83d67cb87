//! A shard's bytes: mapped when the shard is hot; for a compressed (cold) shard, decompressed
//! into memory on first use and kept while it is among the most recently used, so that a
//! window's shards are decompressed once per pass, not once per batch; for a shard in object
//! storage, fetched into the local folder ahead of use (`remote`), then mapped or decompressed.

use crate::error::LoadError;
use crate::mmap::Mapped;
use crate::stats::ShardCounters;
use dsc_format::ShardEntry;
use std::ops::Deref;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Shards kept decompressed at least: two groups of the default interleave (the group being
/// read and the next one, read ahead).
pub(crate) const MIN_RESIDENT: usize = 2 * crate::order::DEFAULT_INTERLEAVE;

/// One validated, mapped shard.
#[derive(Debug)]
pub(crate) struct Shard {
    pub entry: ShardEntry,
    /// Start of each tensor's data in the file, in manifest tensor order.
    pub tensor_starts: Vec<usize>,
    /// The bytes: mapped, decompressed on use, or fetched on use.
    pub body: Body,
    /// The open file behind `body` (the validated inode, whatever later happens to the path);
    /// `None` for a shard in object storage, whose local copy comes and goes.
    pub file: Option<std::fs::File>,
    /// Where `file` was opened (the object's URL for a remote shard), for messages.
    pub path: std::path::PathBuf,
    /// Per tensor (manifest order): set once the tensor's data was asked into this process's
    /// page tables, for splits that stay resident (see `loader::resident_budget`), so that
    /// later epochs skip the hint.
    pub populated: Vec<AtomicBool>,
}

impl Shard {
    /// Shard `entry` of `manifest`, whose header `layout` was checked, held as `body`.
    pub fn new(
        manifest: &dsc_format::Manifest,
        entry: &ShardEntry,
        layout: &dsc_format::shard::ShardLayout,
        body: Body,
        file: Option<std::fs::File>,
        path: std::path::PathBuf,
    ) -> Shard {
        Shard {
            entry: entry.clone(),
            tensor_starts: layout.tensors.iter().map(|t| t.start as usize).collect(),
            body,
            file,
            path,
            populated: manifest
                .tensors()
                .iter()
                .map(|_| AtomicBool::new(false))
                .collect(),
        }
    }
}

/// How a shard's bytes are held.
#[derive(Debug)]
pub(crate) enum Body {
    /// A hot shard, mapped whole.
    Mapped(Mapped),
    /// A compressed shard.
    Cold(Cold),
    /// A shard in object storage (shard `id` of the manifest), fetched into the local folder
    /// ahead of use; decompressed on use when stored compressed (`Some`).
    #[cfg(feature = "remote")]
    Remote { id: usize, cold: Option<Cold> },
}

impl Body {
    /// The decompressed bytes' slot of a compressed shard, local or remote.
    fn cold(&self) -> Option<&Cold> {
        match self {
            Body::Mapped(_) => None,
            Body::Cold(c) => Some(c),
            #[cfg(feature = "remote")]
            Body::Remote { cold, .. } => cold.as_ref(),
        }
    }

    /// Whether the shard is mapped whole at open: its bytes are read in place, without asking
    /// for them ([`crate::cache::Inner::shard_bytes`]).
    pub fn is_mapped(&self) -> bool {
        matches!(self, Body::Mapped(_))
    }
}

/// Bytes of a shard that batches share while they are alive: a compressed shard's
/// decompressed bytes, or a fetched shard's map.
pub type Held = Arc<dyn HeldBytes>;

/// What [`Held`] bytes are: readable from any thread, and printable without printing them.
pub trait HeldBytes: AsRef<[u8]> + Send + Sync + std::fmt::Debug {}

impl<T: AsRef<[u8]> + Send + Sync + std::fmt::Debug> HeldBytes for T {}

/// A compressed shard's safetensors bytes, decompressed.
struct Decompressed(Vec<u8>);

impl AsRef<[u8]> for Decompressed {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Decompressed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Decompressed({} bytes)", self.0.len())
    }
}

/// A compressed shard's decompressed bytes, while resident.
#[derive(Debug, Default)]
pub(crate) struct Cold {
    /// Held while decompressing, so that threads asking for the same shard wait for one
    /// decompression instead of each doing it.
    bytes: Mutex<Option<Held>>,
    /// When it was last asked for (a tick of [`Resident`]).
    last_use: AtomicU64,
}

/// The decompressed shards of one open cache, bounded in number.
#[derive(Debug)]
pub(crate) struct Resident {
    /// (split index, shard index) of every resident shard.
    held: Mutex<Vec<(usize, usize)>>,
    /// Shards kept at most (raised by loaders that interleave more shards).
    limit: AtomicUsize,
    tick: AtomicU64,
    /// Reads, hits and evictions (and a remote cache's fetches), for loaders' telemetry.
    pub counters: Arc<ShardCounters>,
}

impl Default for Resident {
    fn default() -> Resident {
        Resident {
            held: Mutex::new(Vec::new()),
            limit: AtomicUsize::new(MIN_RESIDENT),
            tick: AtomicU64::new(0),
            counters: Arc::default(),
        }
    }
}

impl Resident {
    /// No shard resident yet; counting into `counters` (a remote cache's, shared with its
    /// fetcher).
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    pub fn with_counters(counters: Arc<ShardCounters>) -> Resident {
        Resident {
            counters,
            ..Resident::default()
        }
    }

    /// Keeps at least `n` shards resident.
    pub fn at_least(&self, n: usize) {
        self.limit.fetch_max(n, Ordering::Relaxed);
    }
}

/// A shard's safetensors bytes: borrowed from its map (hot), or shared with the cache's
/// resident decompressed shards (compressed) or with its fetched copy (object storage).
/// Dereferences to the bytes.
#[derive(Clone)]
pub enum ShardBytes<'a> {
    /// A hot shard's mapped file.
    Mapped(&'a [u8]),
    /// A compressed shard decompressed, or a fetched shard's map: alive while held.
    Held(Held),
}

impl std::fmt::Debug for ShardBytes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            ShardBytes::Mapped(_) => "Mapped",
            ShardBytes::Held(_) => "Held",
        };
        write!(f, "ShardBytes::{kind}({} bytes)", self.len())
    }
}

impl Deref for ShardBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ShardBytes::Mapped(b) => b,
            ShardBytes::Held(b) => (**b).as_ref(),
        }
    }
}

/// Shards by split: the open cache's (split name, shards in index order).
pub(crate) type Splits = [(String, Vec<Shard>)];

impl Resident {
    /// The decompressed bytes of compressed shard `shard` of split `split` of `splits`: kept
    /// from an earlier ask, or `stored()` (the stored file's bytes) checked and decompressed
    /// (`dsc_format::stored::decode`), after which the least recently used compressed shards
    /// beyond the limit are let go (batches that hold their bytes keep them alive until
    /// dropped).
    pub(crate) fn decompressed(
        &self,
        splits: &Splits,
        split: usize,
        shard: usize,
        stored: impl FnOnce() -> Result<Vec<u8>, LoadError>,
    ) -> Result<Held, LoadError> {
        let s = &splits[split].1[shard];
        let cold = s.body.cold().expect("a compressed shard");
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        cold.last_use.store(tick, Ordering::Relaxed);
        let mut slot = cold.bytes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(bytes) = &*slot {
            self.counters.hit();
            return Ok(bytes.clone());
        }
        let stored = stored()?;
        self.counters.read(stored.len());
        let bytes: Held = Arc::new(Decompressed(dsc_format::stored::decode(
            &s.entry, stored, &s.path,
        )?));
        *slot = Some(bytes.clone());
        drop(slot);
        self.evict_beyond_limit(splits, (split, shard));
        Ok(bytes)
    }

    /// Records `id` as resident and lets go of the least recently used shards beyond the limit.
    fn evict_beyond_limit(&self, splits: &Splits, id: (usize, usize)) {
        let cold = |(split, shard): (usize, usize)| {
            splits[split].1[shard]
                .body
                .cold()
                .expect("only compressed shards are resident")
        };
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.push(id);
        let limit = self.limit.load(Ordering::Relaxed).max(1);
        while held.len() > limit {
            let (oldest, _) = held
                .iter()
                .enumerate()
                .filter(|(_, &h)| h != id)
                .min_by_key(|(_, &h)| cold(h).last_use.load(Ordering::Relaxed))
                .expect("more than one shard held");
            let gone = held.swap_remove(oldest);
            *cold(gone).bytes.lock().unwrap_or_else(|p| p.into_inner()) = None;
            self.counters.evicted();
        }
    }
}

/// The stored bytes of local shard `s`, read whole from its validated open file.
pub(crate) fn read_stored(s: &Shard) -> Result<Vec<u8>, LoadError> {
    let file = s.file.as_ref().expect("a local shard has its file");
    let mut stored = vec![0u8; s.entry.stored_bytes() as usize];
    file.read_exact_at(&mut stored, 0)
        .map_err(|source| dsc_format::FormatError::Io {
            path: s.path.clone(),
            source,
        })?;
    Ok(stored)
}
