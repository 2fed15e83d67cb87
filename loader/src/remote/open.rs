//! Opening a cache in object storage, and the shard order its loaders hand to the fetcher.

use super::fetch::{Fetcher, PlanGuard};
use super::RemoteOptions;
use crate::body::{Body, Cold, Shard};
use crate::cache::{Cache, Inner, Origin};
use crate::error::LoadError;
use crate::gather::Source;
use crate::order::Order;
use dsc_format::spelling::OptionError;
use dsc_format::{Manifest, ShardEntry};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// Shard headers read at once while opening: each is one or two small ranged requests, whose
/// time is the store's latency, not its bandwidth.
const HEADER_READS: usize = 16;

impl Cache {
    /// Opens the cache at `url` in object storage. Reads `manifest.json` and every shard's
    /// header (ranged requests for the first KBs of each, several at once; from the local copy
    /// when one is kept from an earlier run) and checks them against the manifest as
    /// [`Cache::open`] does; shards are fetched into `opts.dir` as loaders need them, ahead of
    /// use in their order, and checked against the manifest's size and xxh3 on arrival.
    pub fn open_remote(url: &str, opts: &RemoteOptions) -> Result<Cache, LoadError> {
        let (remote, manifest) = read_manifest(url, opts)?;
        let url = remote.url().to_string();
        let largest = manifest
            .shards()
            .iter()
            .map(ShardEntry::stored_bytes)
            .max()
            .unwrap_or(0);
        if let Some(limit) = opts.limit.filter(|&l| l < largest) {
            return Err(OptionError::new(
                "cache_limit",
                format!(
                    "{} is less than the largest shard of {url} ({}): one shard must fit",
                    dsc_format::spec::format_size(limit),
                    dsc_format::spec::format_size(largest)
                ),
            )
            .into());
        }
        let fetcher = Fetcher::new(remote, &manifest, opts)?;
        let resident = crate::body::Resident::with_counters(fetcher.counters());
        let shards = open_shards(&fetcher, &manifest)?;
        let mut splits: Vec<(String, Vec<Shard>)> = manifest
            .splits()
            .iter()
            .map(|s| (s.name.clone(), Vec::with_capacity(s.shards)))
            .collect();
        for shard in shards {
            splits
                .iter_mut()
                .find(|(name, _)| *name == shard.entry.split)
                .expect("validated: every shard names a listed split")
                .1
                .push(shard);
        }
        Ok(Cache {
            inner: Arc::new(Inner {
                dir: PathBuf::from(url),
                origin: Origin::Remote(fetcher),
                manifest,
                lengths: splits.iter().map(|_| OnceLock::new()).collect(),
                splits,
                resident,
                pool: Arc::default(),
            }),
        })
    }
}

/// Every shard of `manifest`, its header read and checked, on `HEADER_READS` threads.
fn open_shards(fetcher: &Fetcher, manifest: &Manifest) -> Result<Vec<Shard>, LoadError> {
    let entries = manifest.shards();
    let mut out: Vec<Option<Result<Shard, LoadError>>> = (0..entries.len()).map(|_| None).collect();
    let per = entries.len().div_ceil(HEADER_READS).max(1);
    std::thread::scope(|scope| {
        for (k, slots) in out.chunks_mut(per).enumerate() {
            scope.spawn(move || {
                for (j, slot) in slots.iter_mut().enumerate() {
                    let id = k * per + j;
                    *slot = Some(open_shard(fetcher, manifest, id));
                }
            });
        }
    });
    out.into_iter()
        .map(|s| s.expect("every shard was opened"))
        .collect()
}

fn open_shard(fetcher: &Fetcher, manifest: &Manifest, id: usize) -> Result<Shard, LoadError> {
    let entry = &manifest.shards()[id];
    let layout = fetcher.layout(id, entry)?;
    let path = PathBuf::from(fetcher.url_of(id));
    layout.check(manifest, entry, &path)?;
    let body = Body::Remote {
        id,
        cold: entry.compressed.is_some().then(Cold::default),
    };
    Ok(Shard::new(manifest, entry, &layout, body, None, path))
}

/// The order in which a loader reads each of its sources in object storage, handed to their
/// fetchers: window by window, this epoch's `order` from window `from`, then the next epoch's
/// (`next`, when it could be planned), so that the shards the next epoch starts with are
/// neither evicted at the end of this one nor fetched late. Empty when no source is remote.
///
/// Refused when a source's `cache_limit` cannot hold the shards of two consecutive windows
/// (the one being read and the one read ahead): every shard of a window is read through the
/// whole window, so a smaller limit would fetch shards again and again within it.
pub(crate) fn plans(
    sources: &[Source],
    order: &Order,
    next: Option<&Order>,
    from: usize,
) -> Result<Vec<PlanGuard>, LoadError> {
    let fetchers: Vec<Option<&Fetcher>> = sources
        .iter()
        .map(|s| match &s.cache.origin {
            Origin::Remote(f) => Some(f),
            Origin::Folder(_) => None,
        })
        .collect();
    if fetchers.iter().all(Option::is_none) {
        return Ok(Vec::new());
    }
    let mut uses: Vec<Vec<(usize, usize)>> = vec![Vec::new(); sources.len()];
    let mut add = |order: &Order, first: usize, offset: usize| {
        let w = order.window().max(1);
        let windows = order.len().div_ceil(w);
        for k in first..windows {
            for (source, shard, _, _) in order.spans(k * w..((k + 1) * w).min(order.len())) {
                if fetchers[source].is_none() {
                    continue;
                }
                let Body::Remote { id, .. } = sources[source].shards()[shard].body else {
                    unreachable!("a remote cache's shards are remote");
                };
                // A window's entries are together: a shard is listed once per window.
                let listed = uses[source]
                    .iter()
                    .rev()
                    .take_while(|(window, _)| *window == offset + k)
                    .any(|&(_, s)| s == id);
                if !listed {
                    uses[source].push((offset + k, id));
                }
            }
        }
        windows
    };
    let windows = add(order, from, 0);
    if let Some(next) = next {
        add(next, 0, windows);
    }
    for (source, (fetcher, uses)) in fetchers.iter().zip(&uses).enumerate() {
        let Some(f) = fetcher else { continue };
        let Some(limit) = f.limit() else { continue };
        let need = reach(uses, |id| f.stored_bytes(id));
        if need > limit {
            let format = dsc_format::spec::format_size;
            return Err(OptionError::new(
                "cache_limit",
                format!(
                    "{} is less than the {} of shards that two shuffle windows of {} read \
                     (the one being read and the next): within it shards would be fetched \
                     again and again; raise the limit, or lower `window` or `interleave`",
                    format(limit),
                    format(need),
                    sources[source].cache.dir.display()
                ),
            )
            .into());
        }
    }
    Ok(fetchers
        .into_iter()
        .zip(uses)
        .filter_map(|(f, uses)| f.map(|f| f.plan(uses, from)))
        .collect())
}

/// The most bytes of distinct shards that two consecutive windows of `uses` (`(window, shard)`
/// in order) read, shards weighing `bytes(id)`.
fn reach(uses: &[(usize, usize)], bytes: impl Fn(usize) -> u64) -> u64 {
    let mut most = 0;
    let mut start = 0;
    while start < uses.len() {
        let w = uses[start].0;
        let mut seen: Vec<usize> = uses[start..]
            .iter()
            .take_while(|(window, _)| *window <= w + 1)
            .map(|&(_, id)| id)
            .collect();
        seen.sort_unstable();
        seen.dedup();
        most = most.max(seen.iter().map(|&id| bytes(id)).sum());
        start += uses[start..]
            .iter()
            .take_while(|(window, _)| *window == w)
            .count();
    }
    most
}

/// A shard's fetched file ([`fetch_shards`]).
#[derive(Debug)]
pub struct ShardFile {
    /// The shard as the manifest lists it.
    pub entry: ShardEntry,
    /// Its local copy, kept at least while this is held.
    pub path: PathBuf,
    _held: Arc<super::Local>,
}

/// Every shard of a cache in object storage, fetched in manifest order ([`fetch_shards`]).
#[derive(Debug)]
pub struct ShardFiles {
    fetcher: Fetcher,
    plan: PlanGuard,
    entries: Vec<ShardEntry>,
    next: usize,
}

impl Iterator for ShardFiles {
    type Item = Result<ShardFile, LoadError>;

    fn next(&mut self) -> Option<Self::Item> {
        let id = self.next;
        let entry = self.entries.get(id)?.clone();
        self.next += 1;
        self.plan.at(id);
        Some(self.fetcher.get(id, None).map(|local| ShardFile {
            entry,
            path: local.path().into(),
            _held: local,
        }))
    }
}

/// The manifest of the cache at `url` and every one of its shards, fetched in manifest order
/// into its local folder (ahead of use, within the limit), each checked against the manifest's
/// size and xxh3 on arrival: for tools that check shards whole (`dsc verify`). Unlike
/// [`Cache::open_remote`] no header is read first, so that a damaged shard is one item's error
/// (the others still come), not a failed open.
pub fn fetch_shards(url: &str, opts: &RemoteOptions) -> Result<(Manifest, ShardFiles), LoadError> {
    let (remote, manifest) = read_manifest(url, opts)?;
    let fetcher = Fetcher::new(remote, &manifest, opts)?;
    let n = manifest.shards().len();
    let plan = fetcher.plan((0..n).map(|i| (i, i)).collect(), 0);
    let entries = manifest.shards().to_vec();
    Ok((
        manifest,
        ShardFiles {
            fetcher,
            plan,
            entries,
            next: 0,
        },
    ))
}

/// The store of `url` and the cache's validated manifest there.
fn read_manifest(
    url: &str,
    opts: &RemoteOptions,
) -> Result<(dsc_store::Remote, Manifest), LoadError> {
    let remote = dsc_store::Remote::open_with(url, &opts.store)?;
    let bytes = super::manifest_bytes(&remote)?;
    let path = PathBuf::from(remote.url_of(dsc_format::MANIFEST_FILE));
    let manifest = Manifest::from_json(&bytes, &path)?;
    Ok((remote, manifest))
}
