//! Opening a cache in object storage: its manifest and shard headers, read and checked, as the
//! parts `Cache::open_remote` assembles (this module never names the cache it becomes).

use super::fetch::{Fetcher, PlanGuard};
use super::RemoteOptions;
use crate::body::{Body, Cold, Resident, Shard};
use crate::error::LoadError;
use dsc_format::spelling::OptionError;
use dsc_format::{Manifest, ShardEntry};
use std::path::PathBuf;
use std::sync::Arc;

/// Shard headers read at once while opening: each is one or two small ranged requests, whose
/// time is the store's latency, not its bandwidth.
const HEADER_READS: usize = 16;

/// What an open cache in object storage is made of, for `Cache::open_remote` to assemble: its
/// URL, manifest and fetcher, the shards of each split (headers read and checked), and the
/// store of its decompressed shards.
pub(crate) struct Opened {
    pub url: String,
    pub manifest: Manifest,
    pub fetcher: Fetcher,
    pub splits: Vec<(String, Vec<Shard>)>,
    pub resident: Resident,
}

/// Opens the cache at `url`: reads `manifest.json` and every shard's header (ranged requests
/// for the first KBs of each, several at once; from the local copy when one is kept from an
/// earlier run) and checks them against the manifest as a local open does. Shards are fetched
/// into `opts.dir` as loaders need them, ahead of use in their order, and checked against the
/// manifest's size and xxh3 on arrival.
pub(crate) fn open(url: &str, opts: &RemoteOptions) -> Result<Opened, LoadError> {
    {
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
        let resident = Resident::with_counters(fetcher.counters());
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
        Ok(Opened {
            url,
            manifest,
            fetcher,
            splits,
            resident,
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
    let manifest = super::remote_manifest(&remote, &opts.generation)?;
    Ok((remote, manifest))
}
