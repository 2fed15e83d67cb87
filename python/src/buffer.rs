//! The bytes of one tensor of a batch, as Python sees them: a [`Buffer`] exports them through
//! the buffer protocol (typed and shaped to NumPy, flat to `torch.frombuffer`), and owns them
//! (a pooled gather buffer, a private mapping of the shard, or a reference to the cache's
//! mapping) for as long as any array or tensor over it lives.

use dsc_format::Dtype;
use dsc_loader::BatchTensor;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use std::os::raw::c_int;

/// One tensor's bytes, exported through the buffer protocol: as its typed, shaped array to a
/// consumer that asks for format and shape (`numpy.asarray`), else as flat bytes
/// (`torch.frombuffer`, `numpy.frombuffer`).
#[pyclass(frozen, module = "dsc._dsc")]
pub(crate) struct Buffer {
    bytes: Bytes,
    /// The element's struct format (a C string).
    format: &'static std::ffi::CStr,
    itemsize: isize,
    /// Shape and C-order strides in bytes, as the buffer protocol wants them (they live as
    /// long as the exporter, which every export keeps alive).
    shape: Vec<isize>,
    strides: Vec<isize>,
}

/// Where a [`Buffer`]'s bytes live.
enum Bytes {
    /// Gathered into a buffer this object owns (returned to the cache's pool when it dies), or
    /// a read-only view of the loader's shared shard mapping (exported read-only: NumPy).
    Loader { tensor: BatchTensor, writable: bool },
    /// A zero-copy view given to torch, which has no read-only tensors: a private,
    /// copy-on-write mapping of the tensor's file range made for this buffer alone, so that a
    /// write changes this buffer's pages only, never the file nor what the loader reads.
    Private {
        /// Names the shard if the file is cut short under this map; dropped before the map.
        _guard: Option<dsc_loader::sigbus::Registration>,
        map: memmap2::MmapMut,
        skip: usize,
    },
    /// A view of a compressed shard's decompressed bytes (shared with the loader) asked for
    /// writable: copied, so that a write never reaches what other batches read.
    Copied(Vec<u8>),
}

impl Buffer {
    /// A buffer over `tensor`; `writable` asks for memory a consumer may write into.
    pub(crate) fn new(tensor: BatchTensor, writable: bool) -> std::io::Result<Buffer> {
        let (format, itemsize) = buffer_format(tensor.dtype());
        let shape: Vec<isize> = tensor.shape().iter().map(|&d| d as isize).collect();
        let mut strides = vec![itemsize; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        let bytes = match tensor.mapped_source() {
            Some((file, start, len)) if writable && len > 0 => {
                // mmap offsets are page-aligned: map from the page holding `start`.
                let skip = (start % PAGE) as usize;
                // SAFETY: a private map of a shard file the loader validated (size and header)
                // before mapping it itself; writes stay in this process's copy of the pages.
                // As for every mapping of a cache, a concurrent truncation of the file by
                // another process could raise SIGBUS (documented in the loader's mmap module).
                // No MAP_POPULATE: on a private writable map it would copy every page up front;
                // read faults map the page cache's pages and copy only what is written.
                let map = unsafe {
                    memmap2::MmapOptions::new()
                        .offset(start - skip as u64)
                        .len(skip + len)
                        .map_copy(file)?
                };
                let _guard = tensor
                    .mapped_path()
                    .map(|p| dsc_loader::sigbus::register(map.as_ptr(), map.len(), p));
                Bytes::Private { _guard, map, skip }
            }
            None if writable && tensor.is_zero_copy() => Bytes::Copied(tensor.bytes().to_vec()),
            _ => Bytes::Loader {
                // Gathered bytes belong to this buffer alone; views of the shared map are read-only.
                writable: !tensor.is_zero_copy(),
                tensor,
            },
        };
        Ok(Buffer {
            bytes,
            format,
            itemsize,
            shape,
            strides,
        })
    }

    /// The exported address, length and whether consumers may write.
    fn region(&self) -> (*mut u8, usize, bool) {
        match &self.bytes {
            Bytes::Loader { tensor, writable } => {
                let b = tensor.bytes();
                (b.as_ptr().cast_mut(), b.len(), *writable)
            }
            Bytes::Private { map, skip, .. } => {
                // Python writes through this pointer; Rust never reads the map after this.
                let base = map.as_ptr().cast_mut();
                // SAFETY: `skip < PAGE <= map.len()` by construction in `Buffer::new`.
                (unsafe { base.add(*skip) }, map.len() - skip, true)
            }
            Bytes::Copied(buf) => (buf.as_ptr().cast_mut(), buf.len(), true),
        }
    }
}

/// The struct format and size of an element of `dtype` (native byte order: dsc's shards are
/// little-endian, as every platform it runs on).
fn buffer_format(dtype: Dtype) -> (&'static std::ffi::CStr, isize) {
    match dtype {
        Dtype::F32 => (c"f", 4),
        Dtype::U8 => (c"B", 1),
        Dtype::I32 => (c"i", 4),
        Dtype::I64 => (c"q", 8),
    }
}

/// The page size mmap offsets must be multiples of (4 KiB on the platforms dsc supports; a
/// larger page size makes `map_copy` fail with a clear error, not a wrong mapping).
const PAGE: u64 = 4096;

#[pymethods]
impl Buffer {
    /// True when no gather copy was made (a view of the shard file's bytes).
    #[getter]
    fn zero_copy(&self) -> bool {
        match &self.bytes {
            Bytes::Loader { tensor, .. } => tensor.is_zero_copy(),
            Bytes::Private { .. } => true,
            Bytes::Copied(_) => false,
        }
    }

    fn __len__(&self) -> usize {
        self.region().1
    }

    /// # Safety
    /// Called by CPython with a valid `view` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        use pyo3::ffi;
        let this = slf.get();
        let (ptr, len, writable) = this.region();
        let typed = flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT
            && flags & ffi::PyBUF_ND == ffi::PyBUF_ND;
        if !typed {
            // SAFETY: `view` comes from CPython. The pointer stays valid while the exporter
            // lives: FillInfo takes a reference to `slf`, and `slf` owns the bytes (a gather
            // buffer, a private mapping, or a reference to the cache that keeps the shared
            // mapping). Writable exports are only memory no Rust code reads while Python holds
            // it: a gather buffer owned by this object, or this object's private mapping.
            let rc = unsafe {
                ffi::PyBuffer_FillInfo(
                    view,
                    slf.as_ptr(),
                    ptr.cast(),
                    len as ffi::Py_ssize_t,
                    c_int::from(!writable),
                    flags,
                )
            };
            return if rc == 0 {
                Ok(())
            } else {
                Err(PyErr::take(slf.py())
                    .unwrap_or_else(|| PyBufferError::new_err("cannot export the batch buffer")))
            };
        }
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE && !writable {
            return Err(PyBufferError::new_err("the batch buffer is read-only"));
        }
        // The typed export: one call gives NumPy the batch's array with its dtype and shape
        // (and `torch.from_numpy` a tensor over it), where bytes need a cast and a view each.
        // SAFETY: `view` comes from CPython and is ours to fill. `obj` holds a new reference to
        // the exporter, so the bytes (as above), `format` (static) and `shape`/`strides` (owned
        // by the frozen exporter, never changed) outlive the export.
        unsafe {
            (*view).obj = slf.clone().into_any().unbind().into_ptr();
            (*view).buf = ptr.cast();
            (*view).len = len as ffi::Py_ssize_t;
            (*view).readonly = c_int::from(!writable);
            (*view).itemsize = this.itemsize;
            (*view).format = this.format.as_ptr().cast_mut();
            (*view).ndim = this.shape.len() as c_int;
            (*view).shape = this.shape.as_ptr().cast_mut();
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                this.strides.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}
