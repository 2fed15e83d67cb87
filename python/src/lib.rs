//! `dsc._dsc`: the Rust half of the Python package. It opens caches, runs loaders and compiles;
//! the pure-Python half (`python/dsc/`) turns what it returns into NumPy arrays or torch tensors.
//!
//! Nothing here links libtorch: batches leave as [`Buffer`] objects (`buffer.rs`) that export
//! their bytes, typed and shaped, through NumPy's array interface (`__array_struct__`), and
//! Python wraps them with `numpy.asarray` (and `torch.from_numpy`); the caller's arrays come
//! in the same way (their `__array_struct__`). That is all the limited API of CPython 3.9 offers
//! (the buffer protocol joined it in 3.11), so one abi3 build serves every CPython >= 3.9.
//! A `Buffer` owns its bytes (a pooled gather buffer, or a range of the shard mapping with a
//! reference to the whole cache), so any array or tensor over it stays valid for as long as it
//! lives. Long work runs with the GIL released.

#![deny(clippy::undocumented_unsafe_blocks)]

mod buffer;
mod errors;
mod tables;

use buffer::Buffer;
use dsc_compiler::partition::{self, Partition, Stage};
use dsc_compiler::{CompileOptions, CompileSpec, Interrupt, Storage, TerminalBars};
use dsc_format::choice::Choice;
use dsc_format::{Codec, Dtype};
use dsc_loader::pack::PackInfo;
use dsc_loader::{Cache, Filler, LoadError, LoaderOptions, Mix, State, TensorLayout};
use errors::{compile_error, load_error, option_error, options_error};
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};

fn dtype_name(d: Dtype) -> &'static str {
    match d {
        Dtype::F32 => "float32",
        Dtype::U8 => "uint8",
        Dtype::I32 => "int32",
        Dtype::I64 => "int64",
    }
}

/// An open cache, or a mix of several (its loaders draw from all of them).
#[pyclass(frozen, module = "dsc._dsc")]
struct CacheHandle {
    /// The cache (a mix's first).
    cache: Cache,
    /// What loaders read: the cache alone, or the mix.
    mix: Mix,
    /// The epoch last planned (`plan`), taken by the loader of the same options so that an
    /// epoch is planned once (a packed one walks the whole order).
    planned: Mutex<Option<dsc_loader::Planned>>,
}

#[pymethods]
impl CacheHandle {
    /// Opens and validates the cache in `path` (manifest, then every shard's size and header);
    /// a URL in object storage with `remote` (JSON: `cache_dir`, `cache_limit`,
    /// `storage_options`) over the environment's options.
    #[new]
    #[pyo3(signature = (path, remote=None))]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        remote: Option<&str>,
    ) -> PyResult<CacheHandle> {
        let remote = remote_options(py, remote)?;
        let cache = py
            .detach(|| Cache::open_with(&path, &remote))
            .map_err(|e| load_error(py, e))?;
        let mix = Mix::new(vec![cache.clone()]).map_err(|e| load_error(py, e))?;
        Ok(CacheHandle {
            cache,
            mix,
            planned: Mutex::new(None),
        })
    }

    /// The mix of the caches of `handles`, in order; refuses caches whose tensors differ
    /// (`dsc.OptionsError` naming the tensor).
    #[staticmethod]
    fn mix(py: Python<'_>, handles: Vec<PyRef<'_, CacheHandle>>) -> PyResult<CacheHandle> {
        let caches: Vec<Cache> = handles.iter().map(|h| h.cache.clone()).collect();
        let Some(first) = caches.first().cloned() else {
            return Err(load_error(py, dsc_loader::Misuse::EmptyMix.into()));
        };
        let mix = Mix::new(caches).map_err(|e| load_error(py, e))?;
        Ok(CacheHandle {
            cache: first,
            mix,
            planned: Mutex::new(None),
        })
    }

    /// What the caches' compressed and remote shards have cost so far (a mix's summed), as the
    /// JSON of the Rust `LoaderStats` (its loader fields zero).
    fn shard_stats(&self) -> String {
        let all = dsc_loader::LoaderStats::sum_of_shards(
            self.mix.sources().iter().map(Cache::shard_stats),
        );
        serde_json::to_string(&all).expect("stats serialize")
    }

    /// For a cache in object storage, the local folder its shards are fetched into.
    fn fetch_folder(&self) -> Option<std::path::PathBuf> {
        self.cache.fetch_folder().map(Into::into)
    }

    /// Positions in an epoch of split `split` with `options` (JSON): the split's contexts, or
    /// a mix's `mix_samples` (default: its caches' contexts together).
    fn positions(&self, py: Python<'_>, options: &str) -> PyResult<usize> {
        let opts = parse_options(py, options)?;
        positions(&self.mix, &opts).map_err(|e| load_error(py, e))
    }

    /// The identity of the cache's data (`Manifest::content_id`): shard names and checksums,
    /// whether stored hot or compressed.
    fn content_id(&self) -> String {
        self.cache.manifest().content_id()
    }

    /// `Manifest::stored_id`: the content id of compressed caches before it left storage out.
    fn stored_id(&self) -> String {
        self.cache.manifest().stored_id()
    }

    /// The keys of `split` as the data held them, in compiled order, with their ids (the
    /// `key` tensor's values), from its shards' key tables: `None` for integer keys.
    fn key_table(&self, py: Python<'_>, split: &str) -> PyResult<Option<(Vec<i64>, Vec<String>)>> {
        let cache = self.cache.clone();
        let table = py
            .detach(|| cache.key_table(split))
            .map_err(|e| load_error(py, e))?;
        Ok(table.map(|t| (t.ids, t.texts)))
    }

    /// `split`'s `key` tensor (each context's key id), in compiled order.
    fn key_ids(&self, py: Python<'_>, split: &str) -> PyResult<Vec<i64>> {
        let cache = self.cache.clone();
        py.detach(|| cache.key_ids(split))
            .map_err(|e| load_error(py, e))
    }

    /// The id (the `key` tensor's value) of the key `key` as the data holds it, spelled as
    /// text; raises `ValueError` when it cannot be a key of this cache.
    fn key_id(&self, key: &str) -> PyResult<i64> {
        dsc_format::keys::key_type(self.cache.manifest())
            .id_of(key)
            .map_err(pyo3::exceptions::PyValueError::new_err)
    }

    /// The position of the context with id `id` in `split`'s compiled order, if it holds one.
    fn find_id(&self, py: Python<'_>, split: &str, id: i64) -> PyResult<Option<usize>> {
        let cache = self.cache.clone();
        py.detach(|| cache.find_key(split, id))
            .map_err(|e| load_error(py, e))
    }

    /// The manifest as JSON text.
    fn manifest_json(&self) -> String {
        String::from_utf8(self.cache.manifest().to_json()).expect("serde_json writes UTF-8")
    }

    /// `stats.json` as JSON text (validated by parsing it), from the directory the cache was
    /// opened from: the statistics of the same version as its shards.
    fn stats_json(&self, py: Python<'_>) -> PyResult<String> {
        let stats = self.cache.stats().map_err(|e| load_error(py, e))?;
        Ok(serde_json::to_string(&stats).expect("stats serialise"))
    }

    /// Steps (batches per rank) of the epoch that a loader with `options` (the JSON of the
    /// Rust `LoaderOptions`) would run, and its batches' tensors as
    /// `(name, dtype, whole-batch shape, trimmed axis or None)`. The plan of local caches is
    /// kept for the next `loader` of the same options (threads and prefetch aside), which
    /// starts from it.
    fn plan(&self, py: Python<'_>, options: &str) -> PyResult<(usize, Vec<LayoutInfo>)> {
        let opts = parse_options(py, options)?;
        let mix = self.mix.clone();
        let planned = py
            .detach(|| mix.plan(&opts))
            .map_err(|e| load_error(py, e))?;
        let answer = (
            planned.steps(),
            planned.layout().iter().map(layout_info).collect(),
        );
        // A plan of caches in object storage registers its shard order with their fetchers,
        // which would fetch for an epoch that may never run: not kept.
        let local = self
            .mix
            .sources()
            .iter()
            .all(|c| c.fetch_folder().is_none());
        *self.planned.lock().unwrap_or_else(|p| p.into_inner()) = local.then_some(planned);
        Ok(answer)
    }

    /// A loader with `options` (JSON) starting at step `step` of its epoch; `threads` 0 in the
    /// options leaves the gathering to `LoaderHandle.fill`.
    fn loader(
        &self,
        py: Python<'_>,
        options: &str,
        step: usize,
        writable: bool,
    ) -> PyResult<LoaderHandle> {
        let opts = parse_options(py, options)?;
        let mix = self.mix.clone();
        let kept = self
            .planned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let loader = py
            .detach(|| match kept.map(|p| p.for_options(&opts)).transpose()? {
                Some(Some(planned)) => planned.loader_at(step),
                _ => mix.loader_at(opts, step),
            })
            .map_err(|e| load_error(py, e))?;
        Ok(LoaderHandle {
            filler: loader.filler(),
            loader: Mutex::new(Some(loader)),
            writable,
            pid: std::process::id(),
            remote: self
                .mix
                .sources()
                .iter()
                .any(|c| c.fetch_folder().is_some()),
        })
    }

    /// The split `split` in cache order for a copy of it kept on a device (a resident split):
    /// a loader of `piece` contexts a batch, unshuffled, every context once (the last batch
    /// completed with the split's first contexts, which the reader leaves out), the tensors
    /// `columns`, one thread. What the Python loader uploads, without a second `dsc.Loader`.
    fn split_reader(
        &self,
        py: Python<'_>,
        split: String,
        columns: Vec<String>,
        piece: usize,
    ) -> PyResult<LoaderHandle> {
        let opts = LoaderOptions {
            order: dsc_loader::OrderSpec {
                split,
                shuffle: false,
                drop_last: false,
                ..Default::default()
            },
            batch_size: piece.max(1),
            threads: 1,
            columns,
            ..Default::default()
        };
        let cache = self.cache.clone();
        let loader = py
            .detach(|| cache.loader(opts))
            .map_err(|e| load_error(py, e))?;
        Ok(LoaderHandle {
            filler: loader.filler(),
            loader: Mutex::new(Some(loader)),
            writable: true,
            pid: std::process::id(),
            remote: self.cache.fetch_folder().is_some(),
        })
    }

    /// Where a mix's run of `options` stands at `step` of its epoch (JSON of the Rust
    /// `Progress`: the stage, its weights, each cache's realised share), or `None` for one cache.
    fn mix_progress(&self, py: Python<'_>, options: &str, step: usize) -> PyResult<Option<String>> {
        let opts = parse_options(py, options)?;
        let mix = self.mix.clone();
        let progress = py
            .detach(|| mix.plan(&opts).map(|p| p.mix_progress(step)))
            .map_err(|e| load_error(py, e))?;
        Ok(progress.map(|p| serde_json::to_string(&p).expect("progress serialises")))
    }

    /// The resume state (JSON) of a loader with `options` after `step` batches of its epoch:
    /// the Rust `State`, which `resume` reads back.
    fn state(&self, py: Python<'_>, options: &str, step: usize) -> PyResult<String> {
        let opts = parse_options(py, options)?;
        let state = State::new(&opts, step).map_err(|e| load_error(py, e))?;
        Ok(serde_json::to_string(&state).expect("a state serialises"))
    }

    /// Where a loader with `options` continues from `state` (JSON): `(epoch, step, skip)`
    /// (`State::start`: at another global batch, step 0 after `skip` units). Refuses
    /// (`dsc.StateError`) a state whose order differs from the options in any field, a bucketed
    /// state at another global batch, or a position outside the state's epoch.
    fn resume(&self, py: Python<'_>, options: &str, state: &str) -> PyResult<(u64, usize, usize)> {
        let mut opts = parse_options(py, options)?;
        let state: State = serde_json::from_str(state).map_err(|e| {
            let problem = format!("not a dsc loader state: {e}");
            load_error(
                py,
                LoadError::State {
                    field: String::new(),
                    problem,
                },
            )
        })?;
        let mix = self.mix.clone();
        let start = py
            .detach(|| mix.check_state(&opts, &state))
            .map_err(|e| load_error(py, e))?;
        let step = start.step;
        opts.epoch = state.epoch;
        opts.skip = start.skip;
        let mix = self.mix.clone();
        let steps = py
            .detach(|| mix.plan(&opts).map(|p| p.steps()))
            .map_err(|e| load_error(py, e))?;
        let contexts = positions(&self.mix, &opts).map_err(|e| load_error(py, e))?;
        if step > steps || start.skip > contexts {
            return Err(load_error(
                py,
                LoadError::State {
                    field: "samples".into(),
                    problem: format!(
                        "epoch {} / samples {} do not fit this loader: its epoch has {steps} \
                         steps of {}",
                        state.epoch, state.samples, state.global_batch
                    ),
                },
            ));
        }
        Ok((state.epoch, step, start.skip))
    }
}

/// Positions in an epoch of `opts` over `mix`: a mix's `mix_samples`, else its caches' contexts
/// of the split together.
fn positions(mix: &Mix, opts: &LoaderOptions) -> Result<usize, LoadError> {
    // Windows of long series: as many as the split's contexts hold.
    if let Some(windows) = opts.order.batches.windows() {
        let Some(cache) = mix.sources().first() else {
            return Ok(0);
        };
        let lengths = cache.lengths(&opts.order.split)?;
        let contexts = cache.contexts(&opts.order.split)?;
        let lengths = contexts.zero_hidden(&lengths);
        return Ok(lengths.iter().map(|&l| windows.count(l as usize)).sum());
    }
    let contexts = mix
        .sources()
        .iter()
        .map(|c| {
            c.manifest()
                .split(&opts.order.split)
                .map_or(0, |s| s.contexts)
        })
        .sum();
    Ok(match mix.sources() {
        [_, _, ..] => opts.order.mix_samples.unwrap_or(contexts),
        _ => contexts,
    })
}

/// `dsc.Loader`'s keywords (a JSON object by the loader's keys, `dsc_loader::args::KEYS`) as the
/// canonical options JSON that the loader calls take, every rule checked by the loader and a
/// refusal raised as `dsc.OptionsError` naming its keyword. `trim_multiple` defaults to
/// `default_trim_multiple` (the GPU's ladder when batches go to one).
#[pyfunction]
fn loader_options(
    py: Python<'_>,
    keywords: &str,
    default_trim_multiple: usize,
) -> PyResult<String> {
    let opts = dsc_loader::args::LoaderArgs::from_json(keywords, default_trim_multiple)
        .map_err(|e| load_error(py, e))?;
    serde_json::to_string(&opts).map_err(|e| options_error(py, &format!("loader options: {e}")))
}

/// `text` (a library message, options as `` `key` ``) with its options spelled as command-line
/// flags: what `OptionsError.flags` gives a script whose flags are the loader's keys.
#[pyfunction]
fn spell_flags(text: &str) -> String {
    dsc_format::spelling::spell(text, dsc_format::spelling::Spelling::Cli)
}

/// The keys (`dsc_loader::args::KEYS`) that ask for loader options (the JSON
/// `loader_options` returns), as a JSON object: what `dsc.Loader` reads its resolved options
/// back by.
#[pyfunction]
fn loader_keys(py: Python<'_>, options: &str) -> PyResult<String> {
    let opts = parse_options(py, options)?;
    serde_json::to_string(&dsc_loader::args::LoaderArgs::of(&opts))
        .map_err(|e| options_error(py, &format!("loader options: {e}")))
}

/// Refuses loader options (the JSON `loader_options` returns) whose batches change shape from
/// step to step, for static buffers: the loader's one rule, which `dsc-train --graph` asks too.
#[pyfunction]
fn static_shape(py: Python<'_>, options: &str) -> PyResult<()> {
    let opts = parse_options(py, options)?;
    opts.order
        .batches
        .static_shape(opts.trim.is_some())
        .map_err(|e| option_error(py, &e))
}

/// The Rust `LoaderOptions` from the JSON that `dsc.Loader` builds.
fn parse_options(py: Python<'_>, json: &str) -> PyResult<LoaderOptions> {
    serde_json::from_str(json).map_err(|e| options_error(py, &format!("loader options: {e}")))
}

/// `(name, dtype, whole-batch shape, trimmed axis)` of one tensor of a loader's batches.
type LayoutInfo = (String, &'static str, Vec<usize>, Option<usize>);

fn layout_info(t: &TensorLayout) -> LayoutInfo {
    (
        t.name.clone(),
        dtype_name(t.dtype),
        t.shape.clone(),
        t.trimmed_axis,
    )
}

/// What a batch is beyond its tensors: `(seq_len, pack)`, `pack` being `None` for a padded
/// batch and `(seqs, tokens, max_seqlen, repeated)` for a packed one.
type Info = (usize, Option<(usize, usize, usize, bool)>);

fn info(seq_len: usize, pack: Option<PackInfo>) -> Info {
    (
        seq_len,
        pack.map(|p| (p.seqs, p.tokens, p.max_seqlen, p.repeated)),
    )
}

/// A batch as `next` gives it: `(step, (seq_len, pack), one buffer per tensor)`.
type Delivered = (usize, Info, Vec<Py<Buffer>>);

/// One epoch of one split for one rank.
#[pyclass(frozen, module = "dsc._dsc")]
struct LoaderHandle {
    /// `None` once closed. A mutex because Python may call from any thread; iteration holds it
    /// only for the hand-over of one batch.
    loader: Mutex<Option<dsc_loader::Loader>>,
    /// Gathers into caller buffers without the lock, so that several threads can fill at once.
    filler: Filler,
    writable: bool,
    /// The process that started the loader's threads.
    pid: u32,
    /// Whether a source is in object storage: its waits for downloads then honour Ctrl-C
    /// (local shards never wait, and skip the polling thread).
    remote: bool,
}

impl Drop for LoaderHandle {
    fn drop(&mut self) {
        // In a forked child the prefetch threads do not exist: joining them would hang, so the
        // loader is leaked instead (the child cannot use it anyway; see `dsc/_loader.py`).
        if std::process::id() != self.pid {
            let loader = self
                .loader
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            std::mem::forget(loader);
        }
    }
}

impl LoaderHandle {
    /// Refuses use in a forked child, where the loader's threads (and maybe its lock's owner)
    /// do not exist: waiting on them would hang.
    fn check_process(&self, py: Python<'_>) -> PyResult<()> {
        if std::process::id() == self.pid {
            return Ok(());
        }
        Err(errors::worker_error(
            py,
            &format!(
                "this dsc loader was started in process {} and used in process {} (a fork)",
                self.pid,
                std::process::id()
            ),
        ))
    }

    fn with<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut dsc_loader::Loader) -> R + Send,
    ) -> PyResult<R>
    where
        R: Send,
    {
        self.check_process(py)?;
        py.detach(|| {
            let mut guard = self.loader.lock().unwrap_or_else(|p| p.into_inner());
            guard.as_mut().map(f)
        })
        .ok_or_else(|| options_error(py, "the loader is closed"))
    }
}

#[pymethods]
impl LoaderHandle {
    /// Batches per rank in this epoch.
    fn steps(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |l| l.steps())
    }

    /// The step of the next batch.
    fn position(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |l| l.next_step())
    }

    /// Batches the loader's threads have prepared ahead now.
    fn queued(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |l| l.queued())
    }

    /// The tensors of every batch: `(name, dtype, whole-batch shape, trimmed axis or None)`.
    fn tensors(&self, py: Python<'_>) -> PyResult<Vec<LayoutInfo>> {
        self.with(py, |l| l.layout().iter().map(layout_info).collect())
    }

    /// The parts of a batch's index (`fill_rows`), by name, as `tensors()` gives tensors:
    /// positions, token rows (an empty part for padded batches), then the tensors of the
    /// shape's own that the index carries whole (a pack's five). `None` for series windows.
    fn index_layout(&self, py: Python<'_>) -> PyResult<Option<Vec<LayoutInfo>>> {
        self.with(py, |l| {
            l.index_layout()
                .map(|i| i.parts().iter().map(layout_info).collect())
        })
    }

    /// Bytes of one whole (untrimmed) batch per tensor.
    fn batch_bytes(&self, py: Python<'_>) -> PyResult<Vec<usize>> {
        self.with(py, |l| l.batch_bytes())
    }

    /// The next batch as `(step, (seq_len, pack), [Buffer])`, one buffer per tensor of
    /// `tensors()` in its order (each tensor's shape is its whole-batch shape with the trimmed
    /// axis, if any, at `seq_len`), or `None` at the end of the epoch. Waits for the prefetch
    /// threads with the GIL released. Names, dtypes and shapes are not repeated per batch:
    /// the objects Python makes per batch are most of its cost (issue 28, item 3).
    fn next(&self, py: Python<'_>) -> PyResult<Option<Delivered>> {
        let next = |l: &mut dsc_loader::Loader| l.next();
        let got = match self.downloads() {
            Some(filler) => {
                self.check_process(py)?;
                interruptible(py, &|| filler.interrupt(), || {
                    let mut guard = self.loader.lock().unwrap_or_else(|p| p.into_inner());
                    guard.as_mut().map(next)
                })?
                .ok_or_else(|| options_error(py, "the loader is closed"))?
            }
            None => self.with(py, next)?,
        };
        let Some(batch) = got else {
            return Ok(None);
        };
        let batch = batch.map_err(|e| load_error(py, e))?;
        let (step, meta) = (batch.step, info(batch.seq_len, batch.pack));
        let tensors = batch.into_tensors();
        let mut out = Vec::with_capacity(tensors.len());
        for tensor in tensors {
            let buffer = Buffer::new(tensor, self.writable).map_err(|e| {
                errors::cache_io_error(py, &format!("cannot map a zero-copy view privately: {e}"))
            })?;
            out.push(Py::new(py, buffer)?);
        }
        Ok(Some((step, meta, out)))
    }

    /// Gathers batch `step` into the caller's buffers (writable, C-contiguous NumPy arrays, one
    /// per tensor of `tensors()`, e.g. the NumPy views of pinned uint8 torch tensors); returns
    /// `(seq_len, pack)` as `next` does. The GIL is released while copying, so several Python
    /// threads can fill different steps at once.
    fn fill(&self, py: Python<'_>, step: usize, buffers: Vec<Bound<'_, PyAny>>) -> PyResult<Info> {
        self.check_process(py)?;
        let filled = with_regions(py, &buffers, self.downloads(), |slices| {
            self.filler.fill(step, slices)
        })?;
        Ok(info(filled.seq_len, filled.pack))
    }

    /// Bytes of a block that any batch of the epoch fits (`fill_block`).
    fn block_bytes(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |l| l.block_bytes())
    }

    /// Gathers batch `step` into one contiguous block (a writable NumPy byte array of at least
    /// `block_bytes()`): its tensors one after another at aligned offsets, each cut to the
    /// batch, so that one transfer moves it to a GPU. Returns `((seq_len, pack), [(offset,
    /// bytes)])`, the ranges in `tensors()` order. The GIL is released while copying.
    fn fill_block(
        &self,
        py: Python<'_>,
        step: usize,
        block: Bound<'_, PyAny>,
    ) -> PyResult<(Info, Vec<(usize, usize)>)> {
        self.check_process(py)?;
        let (filled, ranges) = with_regions(py, &[block], self.downloads(), |slices| {
            self.filler.fill_block(step, slices[0])
        })?;
        Ok((info(filled.seq_len, filled.pack), ranges))
    }

    /// Rows of a batch's index (`fill_rows`): the batch size, or a pack's sequence slots.
    fn index_rows(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |l| l.index_rows())
    }

    /// Writes batch `step`'s index for a consumer holding the split's tensors followed by one
    /// row of zeros (row `contexts`, on a GPU): `buffers[0]` gets each row's compiled-order
    /// position (int64, `index_rows()` of them; a pack's unused rows `contexts`), `buffers[1]`
    /// a pack's token rows (int64 `[T]`: `position * L + step`, the unused tail `contexts *
    /// L`; empty for padded batches), and for a pack `buffers[2..7]` its own five tensors:
    /// the parts of `index_layout()`, in its order. Returns `(seq_len, pack)` as `fill` does.
    /// Reads no shard.
    fn fill_rows(
        &self,
        py: Python<'_>,
        step: usize,
        buffers: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Info> {
        self.check_process(py)?;
        let filled = with_regions(py, &buffers, None, |slices| match slices {
            [positions, token_rows, pack @ ..] => {
                self.filler.fill_rows(step, positions, token_rows, pack)
            }
            _ => Err(dsc_loader::Misuse::FillRowsBuffers.into()),
        })?;
        Ok(info(filled.seq_len, filled.pack))
    }

    /// Marks `n` batches filled by `fill` as consumed.
    fn advance(&self, py: Python<'_>, n: usize) -> PyResult<()> {
        self.with(py, |l| l.advance(n))
    }

    /// Stops the prefetch threads and releases the loader's hold on the cache (batches already
    /// returned stay valid).
    fn close(&self, py: Python<'_>) {
        if std::process::id() != self.pid {
            // A forked child: the threads to join do not exist here (see `Drop`). Leave the
            // loader as it is; the child cannot use it.
            return;
        }
        // A thread waiting for a download gives up first: joining it must not wait for one.
        self.filler.interrupt();
        py.detach(|| {
            // Taken out first so that joining the threads does not hold the lock.
            let taken = self.loader.lock().unwrap_or_else(|p| p.into_inner()).take();
            drop(taken);
        });
    }

    /// Gives up this loader's waits for downloads (`Loader::interrupt`): for a Python thread
    /// that stops the threads filling for it before joining them.
    fn interrupt(&self) {
        self.filler.interrupt();
    }
}

impl LoaderHandle {
    /// The filler whose `interrupt` gives up this loader's waits for downloads, where a source
    /// is in object storage: Ctrl-C then ends a wait at once. `None` for local shards, which
    /// never wait, and skip the polling thread.
    fn downloads(&self) -> Option<&Filler> {
        self.remote.then_some(&self.filler)
    }
}

/// Runs `work` on the memory of `buffers` (writable, C-contiguous NumPy arrays, e.g. the views
/// of pinned uint8 torch tensors) with the GIL released, so that several Python threads can
/// fill at once. Refuses read-only, strided or overlapping buffers.
fn with_regions<T: Send>(
    py: Python<'_>,
    buffers: &[Bound<'_, PyAny>],
    downloads: Option<&Filler>,
    work: impl FnOnce(&mut [&mut [u8]]) -> Result<T, LoadError> + Send,
) -> PyResult<T> {
    let regions = buffers
        .iter()
        .map(|b| writable_region(py, b))
        .collect::<PyResult<Vec<(usize, usize)>>>()?;
    let mut sorted = regions.clone();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
        return Err(options_error(
            py,
            "fill needs distinct buffers; two of them overlap",
        ));
    }
    let work = || {
        let mut slices: Vec<&mut [u8]> = regions
            .iter()
            // SAFETY: each region is the writable, contiguous memory of an array that
            // `buffers` holds (alive, and with a second reference NumPy refuses to resize it)
            // until after this call; the regions were checked not to overlap.
            .map(|&(addr, len)| unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) })
            .collect();
        work(&mut slices)
    };
    // With Ctrl-C honoured (a loader over object storage), the work runs in a thread of its
    // own while this one looks for Python's signals; `buffers` outlives it either way.
    let result = match downloads {
        Some(filler) => interruptible(py, &|| filler.interrupt(), work),
        None => Ok(py.detach(work)),
    };
    result?.map_err(|e| load_error(py, e))
}

/// The address and length in bytes of `array`'s memory, read from NumPy's array interface
/// (`__array_struct__`: the limited API of CPython before 3.11 has no buffer protocol), or an
/// error unless it is writable and C-contiguous.
fn writable_region(py: Python<'_>, array: &Bound<'_, PyAny>) -> PyResult<(usize, usize)> {
    let refuse = |why: &str| {
        options_error(
            py,
            &format!("fill needs writable, C-contiguous NumPy arrays; {why}"),
        )
    };
    let capsule = array
        .getattr(pyo3::intern!(py, "__array_struct__"))
        .map_err(|_| refuse("this object has no __array_struct__"))?;
    let capsule = capsule
        .cast::<pyo3::types::PyCapsule>()
        .map_err(|_| refuse("its __array_struct__ is not a capsule"))?;
    // SAFETY: a live capsule (held by `capsule`); NumPy's array-interface capsules have no name.
    let pointer = unsafe { pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), std::ptr::null()) };
    if pointer.is_null() {
        return Err(PyErr::take(py).unwrap_or_else(|| refuse("its capsule is empty")));
    }
    // SAFETY: NumPy's `__array_struct__` points to its `PyArrayInterface`, valid while the
    // capsule lives; `two == 2` is the interface's own check that it is one.
    let interface = unsafe { &*pointer.cast::<buffer::ArrayInterface>() };
    if interface.two != 2 {
        return Err(refuse(
            "its __array_struct__ is not NumPy's array interface",
        ));
    }
    if interface.flags & buffer::WRITEABLE == 0 {
        return Err(refuse("this one is read-only"));
    }
    if interface.flags & buffer::C_CONTIGUOUS == 0 {
        return Err(refuse("this one is not C-contiguous"));
    }
    let dims = interface.nd.max(0) as usize;
    let elements: usize = if dims == 0 {
        1
    } else {
        // SAFETY: `shape` points to `nd` sizes, valid while the capsule lives.
        unsafe { std::slice::from_raw_parts(interface.shape, dims) }
            .iter()
            .map(|&d| d.max(0) as usize)
            .product()
    };
    Ok((
        interface.data as usize,
        elements * interface.itemsize.max(0) as usize,
    ))
}

/// The spec of a compile: the spec file's keys (if any) with the JSON object `spec_json` (what
/// `dsc.compile`'s keyword arguments give) laid over them, by the command line's rule
/// ([`CompileSpec::with_overrides`]).
fn spec_from(
    py: Python<'_>,
    spec_json: &str,
    spec_file: Option<&std::path::Path>,
) -> PyResult<CompileSpec> {
    let base = match spec_file {
        Some(path) => {
            // A URL wherever rows take one, with the environment's store options.
            let location = path.to_string_lossy();
            let options = match dsc_store::is_remote(&location) {
                true => {
                    dsc_loader::RemoteOptions::from_env()
                        .map_err(|e| options_error(py, &e.to_string()))?
                        .store
                }
                false => Vec::new(),
            };
            let cannot = |e: &dyn std::fmt::Display| {
                options_error(
                    py,
                    &format!("{}: cannot read the spec file: {e}", path.display()),
                )
            };
            let bytes = dsc_store::read_location(&location, &options).map_err(|e| cannot(&e))?;
            let text = String::from_utf8(bytes).map_err(|e| cannot(&e))?;
            // Parsed as a spec first, so a bad key or value is named with its line.
            let file: CompileSpec = toml::from_str(&text).map_err(|e| {
                options_error(py, &format!("{}: invalid spec file: {e}", path.display()))
            })?;
            dsc_format::spelling::fields(&file)
        }
        None => serde_json::Map::new(),
    };
    let overrides: serde_json::Map<String, serde_json::Value> = serde_json::from_str(spec_json)
        .map_err(|e| options_error(py, &format!("invalid spec: {e}")))?;
    CompileSpec::with_overrides(base, overrides).map_err(|e| option_error(py, &e))
}

/// Appends `rows` (with the new contexts' `context` table, and `joins` instead of the cache's)
/// to the cache at `cache` as its next generation; returns the drift report as JSON.
#[pyfunction]
#[pyo3(signature = (cache, rows, context, joins, progress, max_memory=None, remote=None,
                    tables=Vec::new(), existing="refuse"))]
#[allow(clippy::too_many_arguments)]
fn append(
    py: Python<'_>,
    cache: std::path::PathBuf,
    rows: Vec<String>,
    context: Option<String>,
    joins: Option<Vec<(String, String)>>,
    progress: bool,
    max_memory: Option<u64>,
    remote: Option<&str>,
    tables: Vec<(String, Bound<'_, PyAny>)>,
    existing: &str,
) -> PyResult<String> {
    let existing: dsc_compiler::Existing = existing
        .parse()
        .map_err(|e: String| options_error(py, &format!("existing={existing:?}: {e}")))?;
    // Tables in memory are registered as a compile's are (their placeholders replaced by
    // their names), and held until the append is done.
    let mut spec = dsc_compiler::CompileSpec::new(rows, "");
    spec.context = context;
    let given_joins = joins.is_some();
    spec.joins = joins
        .unwrap_or_default()
        .into_iter()
        .map(|(file, on)| dsc_format::spec::JoinSpec { file, on })
        .collect();
    let (spec, _held) = tables::register(py, spec, tables)?;
    let inputs = dsc_compiler::AppendInputs {
        rows: spec.rows,
        context: spec.context,
        joins: given_joins.then_some(spec.joins),
        existing,
    };
    // A cache in object storage is appended to through a local folder of its own.
    let out = match cache.to_str().filter(|c| dsc_store::is_remote(c)) {
        Some(url) => {
            let opts = remote_options(py, remote)?;
            dsc_compiler::remote::set_options(&opts.store);
            opts.append_folder(url).map_err(|e| {
                options_error(py, &format!("the local folder of an append to {url}: {e}"))
            })?
        }
        None => cache.clone(),
    };
    let interrupt = Arc::new(Interrupt::new());
    let bars = TerminalBars::new(!progress).with_interrupt(interrupt.clone());
    let report = interruptible(py, &|| interrupt.request(libc_sigint()), || {
        dsc_compiler::append(
            &cache,
            &inputs,
            &CompileOptions {
                out,
                force: false,
                max_memory,
                storage: dsc_compiler::Storage::Hot,
                progress: &bars,
            },
        )
        // The cache it replaced is removed here, before the interpreter is held again.
        .map(|mut report| {
            drop(report.replaced.take());
            report
        })
        .map_err(Box::new)
    })?
    .map_err(|e| compile_error(py, *e))?;
    Ok(serde_json::to_string(&report.drift).expect("drift serializes"))
}

/// Compiles from a JSON spec (and optional spec file) into `out`; returns the manifest as JSON.
#[pyfunction]
#[pyo3(signature = (spec_json, spec_file, out, force, progress, max_memory=None, compress=None,
                    compress_level=None, remote=None, tables=Vec::new()))]
#[allow(clippy::too_many_arguments)]
fn compile(
    py: Python<'_>,
    spec_json: &str,
    spec_file: Option<std::path::PathBuf>,
    out: std::path::PathBuf,
    force: bool,
    progress: bool,
    max_memory: Option<u64>,
    compress: Option<String>,
    compress_level: Option<i32>,
    remote: Option<&str>,
    tables: Vec<(String, Bound<'_, PyAny>)>,
) -> PyResult<String> {
    let spec = spec_from(py, spec_json, spec_file.as_deref())?;
    // Tables in memory, held until the compile is done.
    let (spec, _held) = tables::register(py, spec, tables)?;
    // Inputs in object storage are read with the storage options given (over the environment).
    dsc_compiler::remote::set_options(&remote_options(py, remote)?.store);
    let storage = storage_of(py, compress.as_deref(), compress_level)?;
    // A URL: compiled under the cache folder, then uploaded with its manifest last (a cache
    // already there refused now, before any work, unless `force`).
    let upload = match out.to_str().filter(|o| dsc_store::is_remote(o)) {
        Some(url) => {
            let opts = remote_options(py, remote)?;
            let upload = py
                .detach(|| {
                    let store = dsc_store::Remote::open_with(url, &opts.store)?;
                    dsc_store::Upload::new(store, &opts.dir, force)
                })
                .map_err(|e| errors::store_error(py, e))?;
            Some(upload)
        }
        None => None,
    };
    let interrupt = Arc::new(Interrupt::new());
    let bars = TerminalBars::new(!progress).with_interrupt(interrupt.clone());
    let report = interruptible(py, &|| interrupt.request(libc_sigint()), || {
        dsc_compiler::compile(
            &spec,
            &CompileOptions {
                out: upload.as_ref().map_or(out, dsc_store::Upload::local),
                force,
                max_memory,
                storage,
                progress: &bars,
            },
        )
        // The cache it replaced is removed here, before the interpreter is held again.
        .map(|mut report| {
            drop(report.replaced.take());
            report
        })
        .map_err(Box::new)
    })?
    .map_err(|e| compile_error(py, *e))?;
    if let Some(upload) = &upload {
        // Ctrl-C during the upload stops it before the manifest is published, as in the
        // compile; the staging folder goes with `upload`.
        let sent = interruptible(py, &|| interrupt.request(libc_sigint()), || {
            upload.send(|_, _| {}, &|| interrupt.requested())
        })?
        .map_err(|e| errors::store_error(py, e))?;
        if sent.stray > 0 {
            let note = std::ffi::CString::new(format!(
                "{} objects under {} are not part of the cache (an interrupted upload's, or files \
                 of your own); they were left as they were (force=True removes them)",
                sent.stray,
                upload.url()
            ))
            .expect("no NUL in a URL");
            PyErr::warn(
                py,
                &py.get_type::<pyo3::exceptions::PyUserWarning>(),
                &note,
                1,
            )?;
        }
    }
    Ok(String::from_utf8(report.manifest.to_json()).expect("serde_json writes UTF-8"))
}

/// The options of a cache in object storage: the environment's, with `json`'s over them
/// (`cache_dir`, `cache_limit` in bytes, `storage_options` as object_store's keys).
fn remote_options(py: Python<'_>, json: Option<&str>) -> PyResult<dsc_loader::RemoteOptions> {
    let mut o = dsc_loader::RemoteOptions::from_env().map_err(|e| load_error(py, e))?;
    let Some(json) = json else {
        return Ok(o);
    };
    let given: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| options_error(py, &format!("remote options: {e}")))?;
    if let Some(dir) = given["cache_dir"].as_str() {
        o.dir = dir.into();
    }
    if let Some(limit) = given["cache_limit"].as_u64() {
        o.limit = Some(limit);
    }
    match &given["generation"] {
        serde_json::Value::Null => {}
        serde_json::Value::Number(n) => {
            o.generation = n
                .as_u64()
                .filter(|&n| (1..=u64::from(u32::MAX)).contains(&n))
                .map(|n| dsc_format::GenerationRef::Number(n as u32))
                .ok_or_else(|| {
                    options_error(py, &format!("generation={n}: generations count from 1"))
                })?;
        }
        serde_json::Value::String(s) => {
            o.generation = s.parse().map_err(|e: String| options_error(py, &e))?;
        }
        other => {
            return Err(options_error(
                py,
                &format!("generation={other}: a number, a content id or a tag"),
            ))
        }
    }
    if let Some(map) = given["storage_options"].as_object() {
        for (key, value) in map {
            let value = match value {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            o.store.push((key.clone(), value));
        }
    }
    Ok(o)
}

/// Runs `work` (a compile) off the GIL in a thread of its own, while this thread looks for
/// Python's signals (Ctrl-C) every 50 ms: with the GIL released the interpreter cannot run its
/// handlers, and the compile used to run to its end and commit before `KeyboardInterrupt` came.
/// A signal's exception asks the work to stop through `on_signal` (a compile's interrupt, a
/// loader's [`dsc_loader::Loader::interrupt`]); it is raised once the work has returned (a
/// compile having removed what it wrote).
fn interruptible<T: Send>(
    py: Python<'_>,
    on_signal: &(dyn Fn() + Sync),
    work: impl FnOnce() -> T + Send,
) -> PyResult<T> {
    let (result, signalled) = py.detach(|| {
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel();
            scope.spawn(move || {
                let _ = tx.send(work());
            });
            let mut signalled = None;
            loop {
                match rx.recv_timeout(std::time::Duration::from_millis(50)) {
                    Ok(result) => return (Some(result), signalled),
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                        return (None, signalled)
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                }
                if signalled.is_none() {
                    if let Err(e) = Python::attach(|py| py.check_signals()) {
                        on_signal();
                        signalled = Some(e);
                    }
                }
            }
        })
    });
    match (signalled, result) {
        (Some(e), _) => Err(e),
        (None, Some(result)) => Ok(result),
        (None, None) => Err(errors::worker_error(
            py,
            "the compile thread stopped unexpectedly",
        )),
    }
}

/// SIGINT, which a Python signal handler's exception stands for (Ctrl-C).
fn libc_sigint() -> i32 {
    2
}

/// Runs one stage of one partition of a compile; returns the stage report as JSON.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn compile_stage(
    py: Python<'_>,
    spec_json: &str,
    spec_file: Option<std::path::PathBuf>,
    out: std::path::PathBuf,
    stage: &str,
    index: usize,
    count: usize,
    max_memory: Option<u64>,
    progress: bool,
) -> PyResult<String> {
    let spec = spec_from(py, spec_json, spec_file.as_deref())?;
    let stage: Stage = stage
        .parse()
        .map_err(|e| options_error(py, &format!("{e}")))?;
    let partition = Partition::parse(&format!("{index}/{count}"))
        .map_err(|e| options_error(py, &format!("partition: {e}")))?;
    let interrupt = Arc::new(Interrupt::new());
    let bars = TerminalBars::new(!progress).with_interrupt(interrupt.clone());
    let report = interruptible(py, &|| interrupt.request(libc_sigint()), || {
        partition::run_stage(&spec, &out, max_memory, partition, stage, &bars).map_err(Box::new)
    })?
    .map_err(|e| compile_error(py, *e))?;
    Ok(serde_json::to_string(&report).expect("a report serializes"))
}

/// `compress=` and `compress_level=` of `dsc.compile` as a shard storage.
fn storage_of(py: Python<'_>, codec: Option<&str>, level: Option<i32>) -> PyResult<Storage> {
    let codec = codec
        .map(|c| c.parse::<Codec>())
        .transpose()
        .map_err(|e| options_error(py, &format!("compress: {e} (or None for hot shards)")))?;
    match codec {
        None if level.is_some() => {
            Err(options_error(py, "compress_level= needs compress=\"zstd\""))
        }
        None => Ok(Storage::Hot),
        Some(Codec::Zstd) => Ok(Storage::Zstd {
            level: level.unwrap_or(dsc_format::stored::DEFAULT_ZSTD_LEVEL),
        }),
    }
}

/// Commits a partitioned compile into `out`; returns the manifest as JSON.
#[pyfunction]
#[pyo3(signature = (out, force, progress, compress=None, compress_level=None))]
fn merge(
    py: Python<'_>,
    out: std::path::PathBuf,
    force: bool,
    progress: bool,
    compress: Option<String>,
    compress_level: Option<i32>,
) -> PyResult<String> {
    let storage = storage_of(py, compress.as_deref(), compress_level)?;
    let interrupt = Arc::new(Interrupt::new());
    let bars = TerminalBars::new(!progress).with_interrupt(interrupt.clone());
    let report = interruptible(py, &|| interrupt.request(libc_sigint()), || {
        partition::merge(&out, force, storage, &bars)
            .map(|mut report| {
                drop(report.replaced.take());
                report
            })
            .map_err(Box::new)
    })?
    .map_err(|e| compile_error(py, *e))?;
    Ok(String::from_utf8(report.manifest.to_json()).expect("serde_json writes UTF-8"))
}

/// The names of each choice of a compile spec (`truncate`, `nan`, …), as the CLI and spec files
/// spell them: what `dsc.compile` checks its keywords against.
#[pyfunction]
fn choices() -> Vec<(&'static str, Vec<&'static str>)> {
    use dsc_format::spec::{EmptyContexts, NanPolicy, Truncate, UnmatchedRows};
    fn of<T: Choice>() -> (&'static str, Vec<&'static str>) {
        (T::WHAT, T::NAMES.to_vec())
    }
    vec![
        of::<Truncate>(),
        of::<NanPolicy>(),
        of::<UnmatchedRows>(),
        of::<EmptyContexts>(),
        of::<Codec>(),
        of::<Stage>(),
    ]
}

/// Parses a size such as `256MiB` into bytes.
#[pyfunction]
fn parse_size(py: Python<'_>, text: &str) -> PyResult<u64> {
    dsc_format::spec::parse_size(text).map_err(|e| options_error(py, &format!("{text:?}: {e}")))
}

/// Runs the `dsc` command line with `argv` (the program's name first) and returns its exit code:
/// the package's `dsc` console script (`dsc/_cli.py`), the same CLI as the cargo-built binary.
/// The GIL is released for the whole command.
#[pyfunction]
fn cli(py: Python<'_>, argv: Vec<std::ffi::OsString>) -> u8 {
    py.detach(|| dsc_cli::run(argv))
}

#[pymodule]
fn _dsc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Buffer>()?;
    m.add_class::<CacheHandle>()?;
    m.add_class::<LoaderHandle>()?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(append, m)?)?;
    m.add_function(wrap_pyfunction!(compile_stage, m)?)?;
    m.add_function(wrap_pyfunction!(merge, m)?)?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(choices, m)?)?;
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    m.add_function(wrap_pyfunction!(loader_options, m)?)?;
    m.add_function(wrap_pyfunction!(static_shape, m)?)?;
    m.add_function(wrap_pyfunction!(loader_keys, m)?)?;
    m.add_function(wrap_pyfunction!(spell_flags, m)?)?;
    m.add("LOADER_KEYS", dsc_loader::args::KEYS.to_vec())?;
    // Every key's default, as JSON: `dsc.Loader` leaves a keyword out (None) to take it, and
    // its docstring and tests are held to it.
    let defaults = serde_json::to_string(&dsc_loader::args::LoaderArgs::default())
        .expect("the loader's defaults are JSON");
    m.add("LOADER_DEFAULTS", defaults)?;
    m.add("SPEC_KEYS", dsc_format::spec::SPEC_KEYS.to_vec())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Where `fill_block` puts each tensor: static buffers view a block at these offsets.
    m.add("BLOCK_ALIGN", dsc_loader::BLOCK_ALIGN)?;
    m.add("PACK_TENSORS", dsc_loader::PACK_TENSORS.to_vec())?;
    // Limits and the GPU default of the loader's options, declared once in Rust.
    m.add("MAX_THREADS", dsc_loader::MAX_THREADS)?;
    m.add("MAX_PREFETCH", dsc_loader::MAX_PREFETCH)?;
    m.add("MAX_TRIM_MULTIPLE", dsc_loader::MAX_TRIM_MULTIPLE)?;
    m.add("GPU_TRIM_MULTIPLE", dsc_loader::GPU_TRIM_MULTIPLE)?;
    Ok(())
}
