//! What a loader has done: batches and bytes handed over, how long its consumer waited, how many
//! batches were ready ahead of it, and what its cache read from disk. A starved consumer shows
//! waits and empty queues; a slow one (the model is the bottleneck) shows none and full queues.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A loader's telemetry since it started ([`crate::Loader::stats`]); the shard counters are
/// its open cache's, shared by every loader of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LoaderStats {
    /// Batches handed over (by the iterator, `next_into` or a [`crate::Filler`]).
    pub batches: u64,
    /// Contexts in them (a pack's sequences), repeats included.
    pub contexts: u64,
    /// Bytes of their tensors, as handed over (trimmed batches count their trimmed bytes).
    pub bytes: u64,
    /// Batches the consumer asked for before they were ready (or, from a loader without
    /// threads, waited for while its own thread gathered them; `next_into` and a
    /// [`crate::Filler`] record none: their callers' queues do, with
    /// [`crate::Filler::record_ask`]).
    pub waits: u64,
    /// Seconds the consumer spent waiting for those batches.
    pub wait_s: f64,
    /// Batches ready ahead of the consumer, summed over its asks: divided by `batches`, the
    /// mean queue occupancy (0 without loader threads).
    pub queued: u64,
    /// Compressed shards read from disk and decompressed (0 for a hot cache, which the page
    /// cache serves).
    pub shard_reads: u64,
    /// Stored (compressed) bytes those reads fetched.
    pub stored_bytes_read: u64,
    /// Compressed shards asked for and found decompressed already.
    pub shard_hits: u64,
    /// Decompressed shards let go to stay within the resident limit.
    pub shard_evictions: u64,
    /// Shards of a cache in object storage downloaded into the local folder.
    pub shards_fetched: u64,
    /// Bytes those downloads brought (retries included).
    pub bytes_fetched: u64,
    /// Remote shards asked for and found in the local folder already.
    pub fetch_hits: u64,
    /// Remote shards asked for and waited for (their download under way or not started).
    pub fetch_waits: u64,
    /// Seconds spent in those waits (by the loader's threads, not only the consumer).
    pub fetch_wait_s: f64,
    /// Fetched shards removed from the local folder to stay within its limit.
    pub fetch_evictions: u64,
}

impl LoaderStats {
    /// The mean number of batches ready when the consumer asked.
    pub fn queue_mean(&self) -> f64 {
        self.queued as f64 / self.batches.max(1) as f64
    }

    /// The shard counters of several caches' (a mix's) together; the loader's own fields zero.
    pub fn sum_of_shards(caches: impl IntoIterator<Item = LoaderStats>) -> LoaderStats {
        caches
            .into_iter()
            .fold(LoaderStats::default(), |a, b| LoaderStats {
                shard_reads: a.shard_reads + b.shard_reads,
                stored_bytes_read: a.stored_bytes_read + b.stored_bytes_read,
                shard_hits: a.shard_hits + b.shard_hits,
                shard_evictions: a.shard_evictions + b.shard_evictions,
                shards_fetched: a.shards_fetched + b.shards_fetched,
                bytes_fetched: a.bytes_fetched + b.bytes_fetched,
                fetch_hits: a.fetch_hits + b.fetch_hits,
                fetch_waits: a.fetch_waits + b.fetch_waits,
                fetch_wait_s: a.fetch_wait_s + b.fetch_wait_s,
                fetch_evictions: a.fetch_evictions + b.fetch_evictions,
                ..a
            })
    }

    /// Adds a later loader's counts (the next epoch's, say); the shard counters, which are the
    /// open cache's running totals, are taken from `later`.
    pub fn merge(&mut self, later: &LoaderStats) {
        self.batches += later.batches;
        self.contexts += later.contexts;
        self.bytes += later.bytes;
        self.waits += later.waits;
        self.wait_s += later.wait_s;
        self.queued += later.queued;
        self.shard_reads = later.shard_reads;
        self.stored_bytes_read = later.stored_bytes_read;
        self.shard_hits = later.shard_hits;
        self.shard_evictions = later.shard_evictions;
        self.shards_fetched = later.shards_fetched;
        self.bytes_fetched = later.bytes_fetched;
        self.fetch_hits = later.fetch_hits;
        self.fetch_waits = later.fetch_waits;
        self.fetch_wait_s = later.fetch_wait_s;
        self.fetch_evictions = later.fetch_evictions;
    }
}

/// The counters behind [`LoaderStats`], updated from the consumer's and the fillers' threads.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    batches: AtomicU64,
    contexts: AtomicU64,
    bytes: AtomicU64,
    waits: AtomicU64,
    wait_ns: AtomicU64,
    queued: AtomicU64,
}

impl Counters {
    /// A batch of `contexts` contexts and `bytes` bytes handed over.
    pub fn delivered(&self, contexts: usize, bytes: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.contexts.fetch_add(contexts as u64, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// The consumer asked with `queued` batches ready, and waited `wait` when none was.
    pub fn asked(&self, queued: usize, wait: Option<Duration>) {
        self.queued.fetch_add(queued as u64, Ordering::Relaxed);
        if let Some(w) = wait {
            self.waits.fetch_add(1, Ordering::Relaxed);
            let ns = u64::try_from(w.as_nanos()).unwrap_or(u64::MAX);
            self.wait_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }

    /// The counts so far, with the shard counters of the caches read (summed for a mix).
    pub fn snapshot<'a>(&self, shards: impl IntoIterator<Item = &'a ShardCounters>) -> LoaderStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let shards = LoaderStats::sum_of_shards(shards.into_iter().map(ShardCounters::snapshot));
        LoaderStats {
            batches: get(&self.batches),
            contexts: get(&self.contexts),
            bytes: get(&self.bytes),
            waits: get(&self.waits),
            wait_s: get(&self.wait_ns) as f64 * 1e-9,
            queued: get(&self.queued),
            ..shards
        }
    }
}

/// What an open cache's compressed shards cost (reads, bytes read, hits, evictions), and its
/// remote shards (fetches, bytes fetched, hits, waits, evictions).
#[derive(Debug, Default)]
pub(crate) struct ShardCounters {
    reads: AtomicU64,
    stored_bytes: AtomicU64,
    hits: AtomicU64,
    evictions: AtomicU64,
    fetches: AtomicU64,
    fetched_bytes: AtomicU64,
    fetch_hits: AtomicU64,
    fetch_waits: AtomicU64,
    fetch_wait_ns: AtomicU64,
    fetch_evictions: AtomicU64,
}

impl ShardCounters {
    /// The shard counts so far; the loader's own fields zero.
    pub fn snapshot(&self) -> LoaderStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LoaderStats {
            shard_reads: get(&self.reads),
            stored_bytes_read: get(&self.stored_bytes),
            shard_hits: get(&self.hits),
            shard_evictions: get(&self.evictions),
            shards_fetched: get(&self.fetches),
            bytes_fetched: get(&self.fetched_bytes),
            fetch_hits: get(&self.fetch_hits),
            fetch_waits: get(&self.fetch_waits),
            fetch_wait_s: get(&self.fetch_wait_ns) as f64 * 1e-9,
            fetch_evictions: get(&self.fetch_evictions),
            ..LoaderStats::default()
        }
    }

    /// A compressed shard of `stored` bytes read and decompressed.
    pub fn read(&self, stored: usize) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.stored_bytes
            .fetch_add(stored as u64, Ordering::Relaxed);
    }

    /// A compressed shard found decompressed.
    pub fn hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }

    /// A decompressed shard let go.
    pub fn evicted(&self) {
        self.evictions.fetch_add(1, Ordering::Relaxed);
    }

    /// A remote shard downloaded, `bytes` brought.
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    pub fn fetched(&self, bytes: u64) {
        self.fetches.fetch_add(1, Ordering::Relaxed);
        self.fetched_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A remote shard found in the local folder.
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    pub fn fetch_hit(&self) {
        self.fetch_hits.fetch_add(1, Ordering::Relaxed);
    }

    /// A remote shard waited for, for `wait`.
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    pub fn fetch_wait(&self, wait: Duration) {
        self.fetch_waits.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.fetch_wait_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// A fetched shard removed from the local folder.
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    pub fn fetch_evicted(&self) {
        self.fetch_evictions.fetch_add(1, Ordering::Relaxed);
    }
}
