//! A shard's bytes: mapped when the shard is hot; for a compressed (cold) shard, decompressed
//! into memory on first use and kept while it is among the most recently used, so that a
//! window's shards are decompressed once per pass, not once per batch.

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
    /// The bytes: mapped, or decompressed on use.
    pub body: Body,
    /// The open file behind `map`: the validated inode, whatever later happens to the path.
    pub file: std::fs::File,
    /// Where `file` was opened, for messages.
    pub path: std::path::PathBuf,
    /// Per tensor (manifest order): set once the tensor's data was asked into this process's
    /// page tables, for splits that stay resident (see `loader::resident_budget`), so that
    /// later epochs skip the hint.
    pub populated: Vec<AtomicBool>,
}

/// How a shard's bytes are held.
#[derive(Debug)]
pub(crate) enum Body {
    /// A hot shard, mapped whole.
    Mapped(Mapped),
    /// A compressed shard.
    Cold(Cold),
}

/// A compressed shard's decompressed bytes, while resident.
#[derive(Debug, Default)]
pub(crate) struct Cold {
    /// Held while decompressing, so that threads asking for the same shard wait for one
    /// decompression instead of each doing it.
    bytes: Mutex<Option<Arc<Vec<u8>>>>,
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
    /// Reads, hits and evictions, for loaders' telemetry.
    pub counters: ShardCounters,
}

impl Default for Resident {
    fn default() -> Resident {
        Resident {
            held: Mutex::new(Vec::new()),
            limit: AtomicUsize::new(MIN_RESIDENT),
            tick: AtomicU64::new(0),
            counters: ShardCounters::default(),
        }
    }
}

impl Resident {
    /// Keeps at least `n` shards resident.
    pub fn at_least(&self, n: usize) {
        self.limit.fetch_max(n, Ordering::Relaxed);
    }
}

/// A shard's safetensors bytes: borrowed from its map (hot), or shared with the cache's
/// resident decompressed shards (compressed). Dereferences to the bytes.
#[derive(Debug, Clone)]
pub enum ShardBytes<'a> {
    /// A hot shard's mapped file.
    Mapped(&'a [u8]),
    /// A compressed shard, decompressed.
    Cold(Arc<Vec<u8>>),
}

impl Deref for ShardBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ShardBytes::Mapped(b) => b,
            ShardBytes::Cold(b) => b,
        }
    }
}

/// Shards by split: the open cache's (split name, shards in index order).
pub(crate) type Splits = [(String, Vec<Shard>)];

impl Resident {
    /// The safetensors bytes of shard `shard` of split `split` of `splits`: mapped, or
    /// decompressed (read from the validated open file, checked, decompressed:
    /// `dsc_format::stored::decode`), after which the least recently used cold shards beyond
    /// the limit are let go (batches that hold their bytes keep them alive until dropped).
    pub(crate) fn shard_bytes<'a>(
        &self,
        splits: &'a Splits,
        split: usize,
        shard: usize,
    ) -> Result<ShardBytes<'a>, LoadError> {
        let s = &splits[split].1[shard];
        let cold = match &s.body {
            Body::Mapped(map) => return Ok(ShardBytes::Mapped(map.bytes())),
            Body::Cold(cold) => cold,
        };
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        cold.last_use.store(tick, Ordering::Relaxed);
        let mut slot = cold.bytes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(bytes) = &*slot {
            self.counters.hit();
            return Ok(ShardBytes::Cold(bytes.clone()));
        }
        let mut stored = vec![0u8; s.entry.stored_bytes() as usize];
        s.file
            .read_exact_at(&mut stored, 0)
            .map_err(|source| dsc_format::FormatError::Io {
                path: s.path.clone(),
                source,
            })?;
        self.counters.read(stored.len());
        let bytes = Arc::new(dsc_format::stored::decode(&s.entry, stored, &s.path)?);
        *slot = Some(bytes.clone());
        drop(slot);
        self.evict_beyond_limit(splits, (split, shard));
        Ok(ShardBytes::Cold(bytes))
    }

    /// Records `id` as resident and lets go of the least recently used shards beyond the limit.
    fn evict_beyond_limit(&self, splits: &Splits, id: (usize, usize)) {
        let cold = |(split, shard): (usize, usize)| match &splits[split].1[shard].body {
            Body::Cold(c) => c,
            Body::Mapped(_) => unreachable!("only cold shards are resident"),
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
