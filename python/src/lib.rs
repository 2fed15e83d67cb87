//! `dsc._dsc`: the Rust half of the Python package. It opens caches, runs loaders and compiles;
//! the pure-Python half (`python/dsc/`) turns what it returns into NumPy arrays or torch tensors.
//!
//! Nothing here links libtorch: batches leave as [`Buffer`] objects that export their bytes
//! through the buffer protocol, and Python wraps them with `numpy.frombuffer` or
//! `torch.frombuffer`. A `Buffer` owns its bytes (a pooled gather buffer, or a range of the shard
//! mapping with a reference to the whole cache), so any array or tensor over it stays valid for
//! as long as it lives. Long work runs with the GIL released.

mod errors;

use dsc_compiler::{CompileOptions, CompileSpec, TerminalBars};
use dsc_format::{Dtype, Manifest, Stats, TensorRole};
use dsc_loader::order::Steps;
use dsc_loader::{BatchTensor, Cache, Filler, LoaderOptions, State};
use errors::{compile_error, format_error, load_error, options_error};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use std::os::raw::c_int;
use std::sync::Mutex;

/// One tensor's bytes, exported through the buffer protocol as a flat byte buffer.
#[pyclass(frozen, module = "dsc._dsc")]
struct Buffer {
    tensor: BatchTensor,
    /// Whether consumers may write. Gathered bytes belong to this buffer alone; a zero-copy
    /// range lies in a private copy-on-write map, so a write changes this process's copy of
    /// the page and never the shard file.
    writable: bool,
}

#[pymethods]
impl Buffer {
    /// True when the bytes are a view of the mapped shard (no copy was made).
    #[getter]
    fn zero_copy(&self) -> bool {
        self.tensor.is_zero_copy()
    }

    fn __len__(&self) -> usize {
        self.tensor.bytes().len()
    }

    /// # Safety
    /// Called by CPython with a valid `view` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        let bytes = this.tensor.bytes();
        let readonly = c_int::from(!this.writable);
        // SAFETY: `view` comes from CPython. The pointer stays valid while the exporter lives:
        // FillInfo takes a reference to `slf`, and `slf` owns the bytes (or the mapping they lie
        // in). A writable export is only offered for memory Rust never reads through a shared
        // reference again while Python holds it (a gather buffer owned by this object) or for a
        // private copy-on-write mapping (see `Buffer::writable`).
        let rc = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                bytes.as_ptr() as *mut std::ffi::c_void,
                bytes.len() as pyo3::ffi::Py_ssize_t,
                readonly,
                flags,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(PyErr::take(slf.py())
                .unwrap_or_else(|| PyBufferError::new_err("cannot export the batch buffer")))
        }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}

fn dtype_name(d: Dtype) -> &'static str {
    match d {
        Dtype::F32 => "float32",
        Dtype::I32 => "int32",
        Dtype::I64 => "int64",
    }
}

fn is_sequence(role: TensorRole) -> bool {
    matches!(role, TensorRole::Features | TensorRole::Categorical)
}

/// An open cache.
#[pyclass(frozen, module = "dsc._dsc")]
struct CacheHandle {
    cache: Cache,
}

#[pymethods]
impl CacheHandle {
    /// Opens and validates the cache in `path` (manifest, then every shard's size and header).
    #[new]
    fn new(py: Python<'_>, path: std::path::PathBuf) -> PyResult<CacheHandle> {
        let cache = py
            .detach(|| Cache::open(&path))
            .map_err(|e| load_error(py, e))?;
        Ok(CacheHandle { cache })
    }

    /// The manifest as JSON text.
    fn manifest_json(&self) -> String {
        String::from_utf8(self.cache.manifest().to_json()).expect("serde_json writes UTF-8")
    }

    /// `stats.json` as JSON text (validated by parsing it).
    fn stats_json(&self, py: Python<'_>) -> PyResult<String> {
        let stats = Stats::read(self.cache.dir()).map_err(|e| format_error(py, e))?;
        Ok(serde_json::to_string(&stats).expect("stats serialise"))
    }

    /// Batches per rank of one epoch (equal on every rank).
    fn steps(
        &self,
        py: Python<'_>,
        split: &str,
        batch_size: usize,
        world_size: usize,
        drop_last: bool,
    ) -> PyResult<usize> {
        let Some(info) = self.cache.manifest().split(split) else {
            return Err(options_error(
                py,
                &unknown_split(self.cache.manifest(), &self.cache, split),
            ));
        };
        Ok(Steps::new(info.contexts, batch_size, world_size, drop_last).steps)
    }

    /// A loader over `split` from the state given as JSON (`epoch`, `samples`, …); `threads`
    /// 0 leaves the gathering to `LoaderHandle.fill`.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (split, batch_size, shuffle, seed, epoch, samples, rank, world_size,
                        drop_last, prefetch, threads, trim, window, interleave, columns, writable))]
    fn loader(
        &self,
        py: Python<'_>,
        split: String,
        batch_size: usize,
        shuffle: bool,
        seed: u64,
        epoch: u64,
        samples: usize,
        rank: usize,
        world_size: usize,
        drop_last: bool,
        prefetch: usize,
        threads: usize,
        trim: bool,
        window: usize,
        interleave: usize,
        columns: Vec<String>,
        writable: bool,
    ) -> PyResult<LoaderHandle> {
        let opts = LoaderOptions {
            split: split.clone(),
            batch_size,
            shuffle,
            seed,
            epoch,
            rank,
            world_size,
            drop_last,
            prefetch,
            threads,
            trim,
            window,
            interleave,
            columns,
        };
        let state = State {
            split,
            epoch,
            samples,
            seed,
            shuffle,
            window,
            interleave,
            drop_last,
            global_batch: batch_size.saturating_mul(world_size),
        };
        let cache = self.cache.clone();
        let loader = py
            .detach(|| {
                if samples == 0 {
                    cache.loader(opts)
                } else {
                    cache.loader_from_state(opts, &state)
                }
            })
            .map_err(|e| load_error(py, e))?;
        Ok(LoaderHandle {
            filler: loader.filler(),
            loader: Mutex::new(Some(loader)),
            writable,
            pid: std::process::id(),
        })
    }
}

fn unknown_split(m: &Manifest, cache: &Cache, split: &str) -> String {
    let names: Vec<&str> = m.splits.iter().map(|s| s.name.as_str()).collect();
    format!(
        "{}: no split {split:?} (splits: {names:?})",
        cache.dir().display()
    )
}

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

type TensorInfo = (String, &'static str, Vec<usize>, bool);

impl LoaderHandle {
    fn with<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut dsc_loader::Loader) -> R + Send,
    ) -> PyResult<R>
    where
        R: Send,
    {
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

    /// The loaded tensors: `(name, dtype, sample shape, is a sequence tensor)`.
    fn tensors(&self, py: Python<'_>) -> PyResult<Vec<TensorInfo>> {
        self.with(py, |l| {
            l.tensor_specs()
                .iter()
                .map(|t| {
                    (
                        t.name.clone(),
                        dtype_name(t.dtype),
                        t.sample_shape.clone(),
                        is_sequence(t.role),
                    )
                })
                .collect()
        })
    }

    /// Bytes of one untrimmed batch per loaded tensor.
    fn batch_bytes(&self, py: Python<'_>) -> PyResult<Vec<usize>> {
        self.with(py, |l| l.batch_bytes())
    }

    /// The next batch as `(step, seq_len, [(name, dtype, shape, Buffer)])`, or `None` at the end
    /// of the epoch. Waits for the prefetch threads with the GIL released.
    #[allow(clippy::type_complexity)]
    fn next(
        &self,
        py: Python<'_>,
    ) -> PyResult<
        Option<(
            usize,
            usize,
            Vec<(String, &'static str, Vec<usize>, Py<Buffer>)>,
        )>,
    > {
        let Some(batch) = self.with(py, |l| l.next())? else {
            return Ok(None);
        };
        let batch = batch.map_err(|e| load_error(py, e))?;
        let (step, seq_len) = (batch.step, batch.seq_len);
        let mut out = Vec::new();
        for tensor in batch.into_tensors() {
            let name = tensor.name().to_string();
            let dtype = dtype_name(tensor.dtype());
            let shape = tensor.shape().to_vec();
            let buffer = Py::new(
                py,
                Buffer {
                    writable: self.writable || !tensor.is_zero_copy(),
                    tensor,
                },
            )?;
            out.push((name, dtype, shape, buffer));
        }
        Ok(Some((step, seq_len, out)))
    }

    /// Gathers batch `step` into the caller's buffers, given as `(address, length)` pairs of
    /// writable memory that the caller keeps alive for the call (e.g. pinned torch tensors);
    /// returns the sequence length. The GIL is released, so several Python threads can fill
    /// different steps at once.
    fn fill(&self, py: Python<'_>, step: usize, buffers: Vec<(usize, usize)>) -> PyResult<usize> {
        let result = py.detach(|| {
            let mut slices: Vec<&mut [u8]> = buffers
                .iter()
                // SAFETY: the Python caller passes the addresses and lengths of distinct, live,
                // writable buffers (torch tensors it holds across this call); see
                // `dsc/_loader.py`, the only caller.
                .map(|&(addr, len)| unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) })
                .collect();
            self.filler.fill(step, &mut slices)
        });
        result.map_err(|e| load_error(py, e))
    }

    /// Marks `n` batches filled by `fill` as consumed.
    fn advance(&self, py: Python<'_>, n: usize) -> PyResult<()> {
        self.with(py, |l| l.advance(n))
    }

    /// Stops the prefetch threads and releases the loader's hold on the cache (batches already
    /// returned stay valid).
    fn close(&self, py: Python<'_>) {
        let taken = py.detach(|| self.loader.lock().unwrap_or_else(|p| p.into_inner()).take());
        py.detach(move || drop(taken));
    }
}

/// Runs `dsc compile` for the spec given as JSON text (spec-file keys) and/or a spec file
/// (TOML; keys given in `spec_json` override it); returns the manifest as JSON text.
#[pyfunction]
#[pyo3(signature = (spec_json, spec_file, out, force, progress))]
fn compile(
    py: Python<'_>,
    spec_json: &str,
    spec_file: Option<std::path::PathBuf>,
    out: std::path::PathBuf,
    force: bool,
    progress: bool,
) -> PyResult<String> {
    let mut merged = match &spec_file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                options_error(
                    py,
                    &format!("{}: cannot read the spec file: {e}", path.display()),
                )
            })?;
            let table: toml::Table = toml::from_str(&text).map_err(|e| {
                options_error(py, &format!("{}: invalid spec file: {e}", path.display()))
            })?;
            serde_json::to_value(table).expect("TOML values are JSON values")
        }
        None => serde_json::Value::Object(Default::default()),
    };
    let overrides: serde_json::Value = serde_json::from_str(spec_json)
        .map_err(|e| options_error(py, &format!("invalid spec: {e}")))?;
    if let (Some(base), Some(extra)) = (merged.as_object_mut(), overrides.as_object()) {
        for (k, v) in extra {
            base.insert(k.clone(), v.clone());
        }
    }
    let spec: CompileSpec = serde_json::from_value(merged)
        .map_err(|e| options_error(py, &format!("invalid spec: {e}")))?;
    let bars = TerminalBars::new(!progress);
    let report = py
        .detach(|| {
            dsc_compiler::compile(
                &spec,
                &CompileOptions {
                    out,
                    force,
                    progress: &bars,
                },
            )
            .map_err(Box::new)
        })
        .map_err(|e| compile_error(py, *e))?;
    Ok(String::from_utf8(report.manifest.to_json()).expect("serde_json writes UTF-8"))
}

/// Parses a size such as `256MiB` into bytes.
#[pyfunction]
fn parse_size(py: Python<'_>, text: &str) -> PyResult<u64> {
    dsc_format::spec::parse_size(text).map_err(|e| options_error(py, &format!("{text:?}: {e}")))
}

#[pymodule]
fn _dsc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Buffer>()?;
    m.add_class::<CacheHandle>()?;
    m.add_class::<LoaderHandle>()?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
