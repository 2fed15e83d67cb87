//! The fetcher of a cache in object storage: downloads its shards into a bounded local folder
//! ahead of use, in the order its loaders will read them, and lets go of the shard needed
//! furthest in the future when room is needed.
//!
//! Why not least-recently-used: a loader's order is known in advance (a pure function of seed
//! and epoch), so eviction can be optimal (Belady's rule) instead of guessing. LRU evicts at the
//! end of an epoch exactly the shards the next epoch (reshuffled) may start with; here every
//! loader hands over its plan, this epoch's windows and the next epoch's, and
//!
//! - the next shard fetched is the absent one needed soonest (a reader waiting on one comes
//!   first);
//! - room is made by removing the kept shard needed furthest ahead (never again: first), and
//!   only when it is needed later than the one fetched: a prefetch never pushes out a shard
//!   that will be read before it.
//!
//! With a limit of a quarter of the cache and the default window, each shard is fetched once
//! per epoch. A download is checked (size and xxh3 against the manifest) before it is renamed
//! into place ([`dsc_store::Remote::download`]) and stamped; files kept from an earlier run of
//! the same cache (the folder is named by its content id) are taken as they are while they look
//! as stamped, and hashed again otherwise. One process at a time uses a folder (an advisory
//! lock); another process reading the same cache at once (a second rank on the machine) takes
//! the next free folder, with a limit of its own.

use super::RemoteOptions;
use crate::error::LoadError;
use crate::mmap::Mapped;
use crate::stats::ShardCounters;
use dsc_format::shard::ShardLayout;
use dsc_format::{Manifest, ShardEntry};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Folders tried for one cache before giving up: processes reading it at once on one machine.
const FOLDERS: usize = 64;

/// The folder, beside `shards/`, of the stamps of checked local copies ([`Object::looks`]).
const STAMPS_DIR: &str = "stamps";

/// The fetcher of one open cache; its threads stop when it is dropped.
#[derive(Debug)]
pub(crate) struct Fetcher {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    remote: dsc_store::Remote,
    /// This cache's local folder, and the lock that makes it this process's.
    folder: PathBuf,
    _lock: std::fs::File,
    /// Every shard of the manifest, in its order.
    objects: Vec<Object>,
    /// Bytes kept at most (`None`: no limit).
    limit: Option<u64>,
    threads: usize,
    state: Mutex<State>,
    /// Raised when a download ends, a reader asks, takes or gives up, or a plan moves.
    changed: Condvar,
    counters: Arc<ShardCounters>,
}

/// One shard as the manifest lists it, and where its local copy goes.
#[derive(Debug)]
struct Object {
    name: String,
    bytes: u64,
    xxh3: String,
    compressed: bool,
    local: PathBuf,
    /// The stamp of a checked local copy ([`Object::stamp`]).
    stamp: PathBuf,
}

impl Object {
    /// What a checked local copy looks like: its size, device and inode, modification and
    /// status-change times, and the checksum it was checked against. Written once a download
    /// is checked and in place; a copy kept from an earlier run is taken as it is only while it
    /// still looks so. Another copy (written over, replaced, unstamped) is hashed once: a
    /// damaged one was otherwise served by every later run, since only downloads are checked.
    /// The status-change time is the kernel's: every write sets it, and so does putting a
    /// modification time back (`touch -d`, `utimensat`), so an edit in place cannot pass for
    /// the checked copy by restoring its mtime, by accident or on purpose.
    fn looks(&self, meta: &std::fs::Metadata) -> String {
        use std::os::unix::fs::MetadataExt;
        format!(
            "{} {}:{} {}.{} {}.{} {}",
            meta.len(),
            meta.dev(),
            meta.ino(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.ctime(),
            meta.ctime_nsec(),
            self.xxh3
        )
    }

    /// Records the local copy as checked.
    fn stamp(&self) {
        if let Ok(meta) = std::fs::metadata(&self.local) {
            let _ = std::fs::write(&self.stamp, self.looks(&meta));
        }
    }

    /// Whether the local copy is whole and as checked: as stamped, else hashed now (and
    /// stamped when right).
    fn intact(&self) -> bool {
        let Ok(meta) = std::fs::metadata(&self.local) else {
            return false;
        };
        if meta.len() != self.bytes {
            return false;
        }
        if std::fs::read_to_string(&self.stamp).is_ok_and(|s| s == self.looks(&meta)) {
            return true;
        }
        let right = dsc_format::checksum::hash_file(&self.local)
            .is_ok_and(|(len, hex)| len == self.bytes && hex == self.xxh3);
        if right {
            self.stamp();
        }
        right
    }

    /// Takes a checked copy of this object from `other`, the fetch folder of another
    /// generation of the same cache (a shard both list, the same name and checksum): a hard
    /// link, taken only while the other copy looks as its stamp says, then stamped here.
    /// Whether it did.
    fn adopt_from(&self, other: &Path) -> bool {
        let theirs = Object {
            local: other.join(&self.name),
            stamp: other
                .join(STAMPS_DIR)
                .join(self.stamp.file_name().expect("a stamp has a name")),
            name: self.name.clone(),
            bytes: self.bytes,
            xxh3: self.xxh3.clone(),
            compressed: self.compressed,
        };
        let Ok(meta) = std::fs::metadata(&theirs.local) else {
            return false;
        };
        let stamped =
            std::fs::read_to_string(&theirs.stamp).is_ok_and(|s| s == theirs.looks(&meta));
        if !stamped || meta.len() != self.bytes {
            return false;
        }
        if std::fs::hard_link(&theirs.local, &self.local).is_err() {
            return false;
        }
        // The link is the file that was checked only if it is the same inode.
        use std::os::unix::fs::MetadataExt;
        let same = std::fs::metadata(&self.local)
            .is_ok_and(|m| (m.dev(), m.ino()) == (meta.dev(), meta.ino()));
        if !same {
            let _ = std::fs::remove_file(&self.local);
            return false;
        }
        self.stamp();
        true
    }

    /// Removes the local copy, its stamp first (a copy without one is hashed before use).
    fn remove(&self) {
        let _ = std::fs::remove_file(&self.stamp);
        let _ = std::fs::remove_file(&self.local);
    }
}

#[derive(Debug, Default)]
struct State {
    slots: Vec<Slot>,
    /// Bytes of the kept shards and of the downloads under way.
    held: u64,
    /// Per shard: readers waiting for it.
    demand: Vec<u32>,
    /// Per shard: its last download failed. Not fetched ahead again (a damaged or replaced
    /// object would be downloaded over and over); only when a reader asks.
    failed: Vec<bool>,
    plans: Vec<Plan>,
    next_plan: u64,
    started: bool,
    stop: bool,
}

#[derive(Debug, Default)]
enum Slot {
    #[default]
    Absent,
    Fetching,
    Local(Arc<Local>),
    /// The last download failed: its error, given to the next reader that asks (then the shard
    /// is absent again, and fetched anew when asked for again).
    Failed(LoadError),
}

/// One loader's order: `(window, shard)` in the order of reading, and how far it has read.
#[derive(Debug)]
struct Plan {
    id: u64,
    uses: Vec<(usize, usize)>,
    /// The window the reader is in.
    at: usize,
    /// The first entry of `uses` at or after `at`.
    from: usize,
}

/// A shard's local copy: mapped when stored hot, kept open to be read and decompressed when
/// compressed. Batches that hold it keep it alive after an eviction removed its file.
#[derive(Debug)]
pub(crate) struct Local {
    path: PathBuf,
    file: std::fs::File,
    map: Option<Mapped>,
    bytes: u64,
}

impl AsRef<[u8]> for Local {
    fn as_ref(&self) -> &[u8] {
        self.map.as_ref().map_or(&[], Mapped::bytes)
    }
}

impl Local {
    fn open(path: &Path, bytes: u64, compressed: bool) -> Result<Local, LoadError> {
        let map_err = |source| LoadError::Map {
            path: path.into(),
            source,
        };
        let file = std::fs::File::open(path).map_err(map_err)?;
        let map = if compressed {
            None
        } else {
            Some(Mapped::map(&file, bytes, path).map_err(map_err)?)
        };
        Ok(Local {
            path: path.into(),
            file,
            map,
            bytes,
        })
    }

    /// The local file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The stored (compressed) bytes, read whole.
    pub fn read_stored(&self) -> Result<Vec<u8>, LoadError> {
        let mut stored = vec![0u8; self.bytes as usize];
        self.file
            .read_exact_at(&mut stored, 0)
            .map_err(|e| dsc_format::FormatError::io(&self.path, e))?;
        Ok(stored)
    }
}

/// A loader's plan, withdrawn when dropped ([`Fetcher::plan`]).
#[derive(Debug)]
pub(crate) struct PlanGuard {
    shared: Arc<Shared>,
    id: u64,
}

impl Plan {
    /// The reader is in window `window` now: what lies behind no longer counts as a use.
    fn at(&mut self, window: usize) {
        self.at = self.at.max(window);
        while self.from < self.uses.len() && self.uses[self.from].0 < self.at {
            self.from += 1;
        }
    }
}

impl PlanGuard {
    /// The reader is in window `window` now: what lies behind no longer counts as a use.
    pub fn at(&self, window: usize) {
        let mut st = self.shared.lock();
        if let Some(plan) = st.plans.iter_mut().find(|p| p.id == self.id) {
            plan.at(window);
        }
        self.shared.changed.notify_all();
    }
}

impl Drop for PlanGuard {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.plans.retain(|p| p.id != self.id);
        self.shared.changed.notify_all();
    }
}

impl Drop for Fetcher {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
    }
}

impl Fetcher {
    /// The fetcher of the cache of `manifest` at `remote`, in its folder under `opts.dir`: the
    /// folder claimed, downloads cut short by an earlier run removed, whole shards kept (as
    /// many as the limit allows).
    pub fn new(
        remote: dsc_store::Remote,
        manifest: &Manifest,
        opts: &RemoteOptions,
    ) -> Result<Fetcher, LoadError> {
        let (folder, lock) = claim_folder(&opts.dir, &manifest.stored_id())?;
        let objects: Vec<Object> = manifest
            .shards()
            .iter()
            .map(|e| Object {
                name: e.file.clone(),
                bytes: e.stored_bytes(),
                xxh3: e.compressed.as_ref().map_or(&e.xxh3, |c| &c.xxh3).clone(),
                compressed: e.compressed.is_some(),
                local: folder.join(&e.file),
                stamp: folder.join(STAMPS_DIR).join(stamp_name(e)),
            })
            .collect();
        remove_partials(&folder.join(dsc_format::SHARDS_DIR))?;
        // A later generation's shards live in its own folder (FORMAT.md §14).
        for o in &objects {
            let parent = o.local.parent().expect("a shard file is inside the folder");
            if !parent.is_dir() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| dsc_format::FormatError::io(parent, e))?;
                remove_partials(parent)?;
            }
        }
        let stamps = folder.join(STAMPS_DIR);
        std::fs::create_dir_all(&stamps).map_err(|e| dsc_format::FormatError::io(&stamps, e))?;
        let mut state = State {
            slots: objects.iter().map(|_| Slot::Absent).collect(),
            demand: vec![0; objects.len()],
            failed: vec![false; objects.len()],
            ..State::default()
        };
        // Another generation of this cache read on this machine holds most of these shards:
        // they are taken from its folder rather than fetched again.
        let url = remote.url().to_string();
        let siblings = sibling_folders(&opts.dir, &folder, &url);
        for (id, o) in objects.iter().enumerate() {
            let fits = opts.limit.is_none_or(|l| state.held + o.bytes <= l);
            if fits && !o.local.exists() {
                siblings.iter().any(|other| o.adopt_from(other));
            }
            if fits && o.intact() {
                state.slots[id] =
                    Slot::Local(Arc::new(Local::open(&o.local, o.bytes, o.compressed)?));
                state.held += o.bytes;
            } else {
                o.remove();
            }
        }
        Ok(Fetcher {
            shared: Arc::new(Shared {
                remote,
                folder,
                _lock: lock,
                objects,
                limit: opts.limit,
                threads: opts.fetch_threads.max(1),
                state: Mutex::new(state),
                changed: Condvar::new(),
                counters: Arc::default(),
            }),
        })
    }

    /// The counters of this cache's fetches (shared with its resident shards' counters).
    pub fn counters(&self) -> Arc<ShardCounters> {
        self.shared.counters.clone()
    }

    /// Bytes kept at most.
    pub fn limit(&self) -> Option<u64> {
        self.shared.limit
    }

    /// Stored bytes of shard `id`.
    pub fn stored_bytes(&self, id: usize) -> u64 {
        self.shared.objects[id].bytes
    }

    /// The folder the shards are fetched into.
    pub fn folder(&self) -> &Path {
        &self.shared.folder
    }

    /// The URL of shard `id`.
    pub fn url_of(&self, id: usize) -> String {
        self.shared.remote.url_of(&self.shared.objects[id].name)
    }

    /// The cache's file `name` (e.g. `stats.json`), read from object storage.
    pub fn read(&self, name: &str) -> Result<Vec<u8>, LoadError> {
        Ok(self.shared.remote.get(name)?)
    }

    /// The local copy of shard `id`, if it is kept now.
    fn kept(&self, id: usize) -> Option<Arc<Local>> {
        match &self.shared.lock().slots[id] {
            Slot::Local(l) => Some(l.clone()),
            _ => None,
        }
    }

    /// The header of shard `id` (`entry`): from its local copy when kept, else by ranged
    /// requests for the start of the object.
    pub fn layout(&self, id: usize, entry: &ShardEntry) -> Result<ShardLayout, LoadError> {
        if let Some(local) = self.kept(id) {
            return Ok(dsc_format::stored::read_layout_of(
                entry,
                &local.file,
                &local.path,
            )?);
        }
        let o = &self.shared.objects[id];
        let reader = self.shared.remote.reader(&o.name, o.bytes);
        let url = PathBuf::from(self.url_of(id));
        Ok(dsc_format::stored::read_layout_from(
            entry, reader, o.bytes, &url,
        )?)
    }

    /// The first `len` bytes of shard `id`'s safetensors file (`entry`): from its local copy
    /// when kept, else by ranged requests (decompressing the start of a compressed one).
    pub fn prefix(&self, id: usize, entry: &ShardEntry, len: usize) -> Result<Vec<u8>, LoadError> {
        if let Some(local) = self.kept(id) {
            return Ok(dsc_format::stored::read_prefix(
                entry,
                &local.file,
                &local.path,
                len,
            )?);
        }
        let o = &self.shared.objects[id];
        let reader = self.shared.remote.reader(&o.name, o.bytes);
        let url = PathBuf::from(self.url_of(id));
        Ok(dsc_format::stored::read_prefix_from(
            entry, reader, &url, len,
        )?)
    }

    /// Hands over a loader's plan: the shards it reads, `(window, shard)` in order of
    /// reading, from window `at`. The fetch threads start on the first plan or ask.
    pub fn plan(&self, uses: Vec<(usize, usize)>, at: usize) -> PlanGuard {
        let mut st = self.shared.lock();
        let id = st.next_plan;
        st.next_plan += 1;
        let from = uses.iter().take_while(|(w, _)| *w < at).count();
        st.plans.push(Plan { id, uses, at, from });
        // A thread that cannot be started now is tried again at the next ask, which reports it.
        let _ = self.start(&mut st);
        self.shared.changed.notify_all();
        PlanGuard {
            shared: self.shared.clone(),
            id,
        }
    }

    /// The local copy of shard `id`, waiting for its download when it is not kept: fetched
    /// first, before any prefetch. The wait ends with [`LoadError::Stopped`] once `stop` is set
    /// (it is looked at every 20 ms); the download goes on for the cache's other readers.
    pub fn get(
        &self,
        id: usize,
        stop: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<Arc<Local>, LoadError> {
        let shared = &self.shared;
        let mut st = shared.lock();
        let mut asked: Option<Instant> = None;
        loop {
            match &st.slots[id] {
                Slot::Local(local) => {
                    let local = local.clone();
                    match asked {
                        None => shared.counters.fetch_hit(),
                        Some(t) => {
                            st.demand[id] -= 1;
                            shared.counters.fetch_wait(t.elapsed());
                            shared.changed.notify_all();
                        }
                    }
                    return Ok(local);
                }
                Slot::Failed(_) => {
                    let Slot::Failed(e) = std::mem::take(&mut st.slots[id]) else {
                        unreachable!("matched above");
                    };
                    if asked.is_some() {
                        st.demand[id] -= 1;
                    }
                    shared.changed.notify_all();
                    return Err(e);
                }
                Slot::Absent | Slot::Fetching => {
                    if asked.is_none() {
                        asked = Some(Instant::now());
                        st.demand[id] += 1;
                        if let Err(e) = self.start(&mut st) {
                            st.demand[id] -= 1;
                            return Err(e);
                        }
                        shared.changed.notify_all();
                    }
                    let Some(stop) = stop else {
                        st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                        continue;
                    };
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        st.demand[id] -= 1;
                        shared.changed.notify_all();
                        return Err(LoadError::Stopped {
                            url: shared.remote.url_of(&shared.objects[id].name),
                        });
                    }
                    st = shared
                        .changed
                        .wait_timeout(st, std::time::Duration::from_millis(20))
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }

    /// Starts the fetch threads, once.
    fn start(&self, st: &mut State) -> Result<(), LoadError> {
        if st.started {
            return Ok(());
        }
        for k in 0..self.shared.threads {
            let shared = self.shared.clone();
            std::thread::Builder::new()
                .name(format!("dsc-fetch-{k}"))
                .spawn(move || shared.work())
                .map_err(LoadError::Threads)?;
        }
        st.started = true;
        Ok(())
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fetch thread: downloads what [`Shared::pick`] chooses until the fetcher is dropped.
    fn work(self: Arc<Self>) {
        let mut st = self.lock();
        loop {
            if st.stop {
                return;
            }
            let Some(id) = self.pick(&mut st) else {
                st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                continue;
            };
            drop(st);
            let result = self.fetch(id);
            st = self.lock();
            st.failed[id] = result.is_err();
            st.slots[id] = match result {
                Ok(local) => Slot::Local(Arc::new(local)),
                Err(e) => {
                    st.held -= self.objects[id].bytes;
                    Slot::Failed(e)
                }
            };
            self.changed.notify_all();
        }
    }

    /// Downloads shard `id` (checked) and opens its local copy.
    fn fetch(&self, id: usize) -> Result<Local, LoadError> {
        let o = &self.objects[id];
        let expected = dsc_store::Expected {
            bytes: o.bytes,
            xxh3: &o.xxh3,
        };
        let fetched = self.remote.download(&o.name, &o.local, expected);
        let fetched = fetched?;
        o.stamp();
        self.counters.fetched(fetched);
        Local::open(&o.local, o.bytes, o.compressed)
    }

    fn next_uses(&self, st: &State) -> Vec<u64> {
        next_uses(self.objects.len(), &st.plans, &st.demand)
    }

    /// The shard to download next, its room made (the shards chosen to go removed) and
    /// reserved ([`choose`]); `None` when there is nothing to fetch, or no room without
    /// evicting what is needed sooner.
    fn pick(&self, st: &mut State) -> Option<usize> {
        let next = self.next_uses(st);
        let kept: Vec<bool> = st
            .slots
            .iter()
            .map(|s| matches!(s, Slot::Local(_)))
            .collect();
        let absent: Vec<bool> = (0..st.slots.len())
            .map(|s| matches!(st.slots[s], Slot::Absent) && (!st.failed[s] || st.demand[s] > 0))
            .collect();
        let sizes: Vec<u64> = self.objects.iter().map(|o| o.bytes).collect();
        let choice = choose(&Choice {
            next: &next,
            kept: &kept,
            absent: &absent,
            demand: &st.demand,
            sizes: &sizes,
            held: st.held,
            limit: self.limit,
        })?;
        for &victim in &choice.evict {
            st.slots[victim] = Slot::Absent;
            st.held -= sizes[victim];
            // Batches holding its map keep reading it; the file's blocks are freed after them.
            self.objects[victim].remove();
            self.counters.fetch_evicted();
        }
        st.slots[choice.fetch] = Slot::Fetching;
        st.held += sizes[choice.fetch];
        Some(choice.fetch)
    }
}

/// When each of `n` shards is next needed: 0 for a shard a reader waits for (`demand`), else by
/// how many windows ahead (then its place in the plan) in the plan that needs it soonest;
/// `u64::MAX` for a shard no plan needs again.
fn next_uses(n: usize, plans: &[Plan], demand: &[u32]) -> Vec<u64> {
    let mut next = vec![u64::MAX; n];
    for plan in plans {
        for (k, &(window, shard)) in plan.uses[plan.from..].iter().enumerate() {
            let windows = window.saturating_sub(plan.at) as u64;
            let d = (windows << 32 | (k as u64).min(u32::MAX.into())).saturating_add(1);
            next[shard] = next[shard].min(d);
        }
    }
    for (shard, &waiting) in demand.iter().enumerate() {
        if waiting > 0 {
            next[shard] = 0;
        }
    }
    next
}

/// What [`choose`] decides from: per shard, when it is next needed ([`Shared::next_uses`];
/// `u64::MAX`: never), whether it is kept, absent (neither kept nor being fetched, and not
/// failed unless asked for), and waited for, and its size; the bytes held and the limit.
struct Choice<'a> {
    next: &'a [u64],
    kept: &'a [bool],
    absent: &'a [bool],
    demand: &'a [u32],
    sizes: &'a [u64],
    held: u64,
    limit: Option<u64>,
}

/// A fetch to start, and the kept shards to remove first to make room for it.
#[derive(Debug, PartialEq)]
struct Fetch {
    fetch: usize,
    evict: Vec<usize>,
}

/// Belady's rule with a reservation: the absent shard needed soonest, if the limit leaves room
/// for it once kept shards are removed, furthest-needed first, each only if it is needed later
/// than the one fetched (or the one fetched is waited for) and nobody waits for it.
fn choose(c: &Choice<'_>) -> Option<Fetch> {
    let n = c.next.len();
    let fetch = (0..n)
        .filter(|&s| c.absent[s] && c.next[s] != u64::MAX)
        .min_by_key(|&s| c.next[s])?;
    let mut candidates: Vec<usize> = (0..n).filter(|&s| c.kept[s] && c.demand[s] == 0).collect();
    // Furthest ahead last, to be popped first.
    candidates.sort_by_key(|&s| c.next[s]);
    let mut held = c.held;
    let mut evict = Vec::new();
    while c.limit.is_some_and(|limit| held + c.sizes[fetch] > limit) {
        let victim = candidates.pop()?;
        // Waited for, a shard is fetched even at the cost of one needed soon after it.
        if c.next[fetch] != 0 && c.next[victim] <= c.next[fetch] {
            return None;
        }
        held -= c.sizes[victim];
        evict.push(victim);
    }
    Some(Fetch { fetch, evict })
}

/// The file in a fetch folder naming the cache it holds a copy of.
const URL_FILE: &str = "url";

/// The other fetch folders under `dir` of the cache at `url` (other generations of it, or other
/// processes' copies), which [`claim_folder`]s mark with the URL; `ours` is left out.
fn sibling_folders(dir: &Path, ours: &Path, url: &str) -> Vec<PathBuf> {
    let _ = std::fs::write(ours.join(URL_FILE), url);
    let Ok(entries) = std::fs::read_dir(dir.join("remote")) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p != ours)
        .filter(|p| std::fs::read_to_string(p.join(URL_FILE)).is_ok_and(|u| u == url))
        .collect();
    found.sort();
    found
}

/// This process's folder for the cache of content id `id` under `dir`: `dir/remote/ID`, or
/// `ID.2`, `ID.3`, … while another process holds it; locked (flock) for this process's life.
fn claim_folder(dir: &Path, id: &str) -> Result<(PathBuf, std::fs::File), LoadError> {
    let base = dir.join("remote");
    for k in 1..=FOLDERS {
        let folder = if k == 1 {
            base.join(id)
        } else {
            base.join(format!("{id}.{k}"))
        };
        let shards = folder.join(dsc_format::SHARDS_DIR);
        std::fs::create_dir_all(&shards).map_err(|e| dsc_format::FormatError::io(&shards, e))?;
        let lock_path = folder.join(".lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| dsc_format::FormatError::io(&lock_path, e))?;
        // SAFETY: flock on a descriptor this function owns; it only takes an advisory lock.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok((folder, lock));
        }
    }
    Err(LoadError::Fetch {
        url: base.join(id).display().to_string(),
        reason: format!("{FOLDERS} processes of this machine already read this cache"),
    })
}

/// The name of a shard's stamp: its file name, prefixed by its generation's when a later
/// generation wrote it (two generations' folders may hold files of the same name).
fn stamp_name(e: &dsc_format::ShardEntry) -> String {
    let name = Path::new(&e.file)
        .file_name()
        .expect("a validated shard file has a name")
        .to_string_lossy();
    match e.generation {
        Some(g) if g > 1 => format!("g{g:05}-{name}"),
        _ => name.into_owned(),
    }
}

/// Removes the partial downloads (`.NAME.partial-PID`) of runs that were killed.
fn remove_partials(shards: &Path) -> Result<(), LoadError> {
    let entries = std::fs::read_dir(shards).map_err(|e| dsc_format::FormatError::io(shards, e))?;
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with('.') {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of one reader over `epochs` (each a shard order cut into windows of `per_window`)
    /// with instant downloads: before each window the fetcher prefetches all it may, then the
    /// reader asks for the window's shards. Returns the downloads.
    fn simulate(sizes: &[u64], epochs: &[Vec<usize>], per_window: usize, limit: u64) -> usize {
        let n = sizes.len();
        let mut uses = Vec::new();
        let mut windows = 0;
        for order in epochs {
            for (k, &s) in order.iter().enumerate() {
                uses.push((windows + k / per_window, s));
            }
            windows += order.len().div_ceil(per_window);
        }
        let mut plan = Plan {
            id: 0,
            uses: uses.clone(),
            at: 0,
            from: 0,
        };
        let (mut kept, mut demand, mut held, mut fetches) = (vec![false; n], vec![0; n], 0, 0);
        let step = |plan: &[Plan], kept: &mut Vec<bool>, demand: &[u32], held: &mut u64| {
            let next = next_uses(n, plan, demand);
            let absent: Vec<bool> = kept.iter().map(|k| !k).collect();
            let c = choose(&Choice {
                next: &next,
                kept,
                absent: &absent,
                demand,
                sizes,
                held: *held,
                limit: Some(limit),
            })?;
            for v in c.evict {
                kept[v] = false;
                *held -= sizes[v];
            }
            kept[c.fetch] = true;
            *held += sizes[c.fetch];
            assert!(*held <= limit, "held {held} over the limit {limit}");
            Some(c.fetch)
        };
        for w in 0..windows {
            plan.at(w);
            let plans = std::slice::from_ref(&plan);
            while step(plans, &mut kept, &demand, &mut held).is_some() {
                fetches += 1;
            }
            for &(_, s) in uses.iter().filter(|(window, _)| *window == w) {
                if !kept[s] {
                    demand[s] = 1;
                    assert_eq!(step(plans, &mut kept, &demand, &mut held), Some(s));
                    demand[s] = 0;
                    fetches += 1;
                }
            }
        }
        fetches
    }

    /// A seeded shuffle (xorshift), enough for orders of a few dozen shards.
    fn shuffled(n: usize, seed: &mut u64) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            v.swap(i, (*seed % (i as u64 + 1)) as usize);
        }
        v
    }

    #[test]
    fn each_shard_is_fetched_at_most_once_per_epoch_when_the_limit_holds_two_windows() {
        let mut seed = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..40 {
            let n = 24;
            let sizes: Vec<u64> = (0..n)
                .map(|_| 5 + shuffled(11, &mut seed)[0] as u64)
                .collect();
            let epochs: Vec<Vec<usize>> = (0..3).map(|_| shuffled(n, &mut seed)).collect();
            let largest = *sizes.iter().max().unwrap();
            // Two windows of three of the largest shards: under a third of the cache.
            let limit = 2 * 3 * largest;
            assert!(limit * 3 < sizes.iter().sum::<u64>() * 2);
            // At most once per epoch; fewer where a shard read at the end of one epoch is read
            // again at the start of the next, kept in between.
            let fetches = simulate(&sizes, &epochs, 3, limit);
            let across = (limit / sizes.iter().min().unwrap()) as usize;
            assert!(
                fetches <= 3 * n && fetches + 2 * across >= 3 * n,
                "{fetches}: {sizes:?} {epochs:?}"
            );
        }
    }

    #[test]
    fn a_prefetch_never_pushes_out_a_shard_needed_before_it_but_a_wait_does() {
        // Shards 0 and 1 kept (0 needed next, 1 never again), 2 absent and needed after 0.
        let next = [1, u64::MAX, 5];
        let c = Choice {
            next: &next,
            kept: &[true, true, false],
            absent: &[false, false, true],
            demand: &[0, 0, 0],
            sizes: &[10, 10, 10],
            held: 20,
            limit: Some(20),
        };
        assert_eq!(
            choose(&c),
            Some(Fetch {
                fetch: 2,
                evict: vec![1]
            })
        );
        // Only 0 kept: prefetching 2 would push out 0, needed first.
        let c = Choice {
            kept: &[true, false, false],
            absent: &[false, false, true],
            held: 10,
            limit: Some(10),
            ..c
        };
        assert_eq!(choose(&c), None);
        // A reader waits for 2: it comes first, whatever it costs.
        let waited = [1, u64::MAX, 0];
        let c = Choice {
            next: &waited,
            demand: &[0, 0, 1],
            ..c
        };
        assert_eq!(
            choose(&c),
            Some(Fetch {
                fetch: 2,
                evict: vec![0]
            })
        );
        // ... but never a shard another reader waits for.
        let both = [0, u64::MAX, 0];
        let c = Choice {
            next: &both,
            demand: &[1, 0, 1],
            ..c
        };
        assert_eq!(choose(&c), None);
    }
}
