//! The bytes of one tensor of a batch, as Python sees them: a [`Buffer`] exports them to NumPy
//! typed and shaped through the array interface's C side (`__array_struct__`, which every NumPy
//! reads and the limited API of every CPython >= 3.9 can build, where the buffer protocol's slots
//! joined it only in 3.11), and owns them (a pooled gather buffer, a private mapping of the
//! shard, or a reference to the cache's mapping) for as long as any array or tensor over it lives.

use dsc_format::Dtype;
use dsc_loader::BatchTensor;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::os::raw::{c_char, c_int, c_void};

/// One tensor's bytes, exported as its typed, shaped array to `numpy.asarray` (and so to
/// `torch.from_numpy`) through `__array_struct__`.
#[pyclass(frozen, module = "dsc._dsc")]
pub(crate) struct Buffer {
    bytes: Bytes,
    /// NumPy's kind of the element ('f', 'u', 'i') and its size in bytes.
    kind: c_char,
    itemsize: c_int,
    /// Shape and C-order strides in bytes, as NumPy's interface wants them (the exported
    /// interface points into them; the frozen buffer never changes them).
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
        let (kind, itemsize) = element(tensor.dtype());
        let shape: Vec<isize> = tensor.shape().iter().map(|&d| d as isize).collect();
        let mut strides = vec![itemsize as isize; shape.len()];
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
            kind,
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

/// NumPy's kind and the size of an element of `dtype` (native byte order: dsc's shards are
/// little-endian, as every platform it runs on).
fn element(dtype: Dtype) -> (c_char, c_int) {
    let (kind, size) = match dtype {
        Dtype::F32 => (b'f', 4),
        Dtype::U8 => (b'u', 1),
        Dtype::I32 => (b'i', 4),
        Dtype::I64 => (b'i', 8),
    };
    (kind as c_char, size)
}

/// NumPy's `PyArrayInterface` (numpy/ndarraytypes.h), the struct an `__array_struct__` capsule
/// points to; its layout is part of NumPy's stable interface (version 3 of the array interface).
/// The batch buffers leave through it, and the caller's arrays that `fill` writes into come in
/// through it.
#[repr(C)]
pub(crate) struct ArrayInterface {
    /// Always 2: NumPy's check that the capsule holds this struct.
    pub(crate) two: c_int,
    pub(crate) nd: c_int,
    typekind: c_char,
    pub(crate) itemsize: c_int,
    pub(crate) flags: c_int,
    pub(crate) shape: *mut isize,
    strides: *mut isize,
    pub(crate) data: *mut c_void,
    descr: *mut pyo3::ffi::PyObject,
}

/// NumPy's flags for the array it makes: C-contiguous, aligned, in native byte order (without
/// `NOTSWAPPED` NumPy would swap every element), and writeable where the bytes are this
/// buffer's own.
pub(crate) const C_CONTIGUOUS: c_int = 0x0001;
const ALIGNED: c_int = 0x0100;
const NOTSWAPPED: c_int = 0x0200;
pub(crate) const WRITEABLE: c_int = 0x0400;

/// The capsule's struct and a strong reference to the [`Buffer`] whose bytes, shape and strides
/// it points into, so that the capsule alone keeps them valid; both go when NumPy (or whoever
/// asked) drops the capsule. `repr(C)` with the interface first: the capsule's pointer is both
/// the interface NumPy reads and the box the destructor frees.
#[repr(C)]
struct Exported {
    interface: ArrayInterface,
    owner: *mut pyo3::ffi::PyObject,
}

unsafe extern "C" fn free_exported(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: the capsule was made by `__array_struct__` below with no name, around a pointer
    // from `Box::into_raw` holding a new reference to its buffer; CPython calls this destructor
    // once, with the GIL held, when the capsule dies.
    unsafe {
        let ptr = pyo3::ffi::PyCapsule_GetPointer(capsule, std::ptr::null());
        if !ptr.is_null() {
            let exported = Box::from_raw(ptr.cast::<Exported>());
            pyo3::ffi::Py_DecRef(exported.owner);
        }
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

    /// The array interface's C side: a capsule around NumPy's `PyArrayInterface` for these
    /// bytes. NumPy makes its array over them with this object as the array's base, so the
    /// bytes (a gather buffer, a private mapping, or a reference to the cache that keeps the
    /// shared mapping) live as long as the array, and a tensor made from it by `from_numpy`.
    #[getter]
    fn __array_struct__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyCapsule>> {
        let this = slf.get();
        let (ptr, _, writable) = this.region();
        let mut flags = C_CONTIGUOUS | ALIGNED | NOTSWAPPED;
        if writable {
            // Writable exports are only memory no Rust code reads while Python holds it: a
            // gather buffer owned by this object, or this object's private mapping.
            flags |= WRITEABLE;
        }
        let interface = ArrayInterface {
            two: 2,
            nd: this.shape.len() as c_int,
            typekind: this.kind,
            itemsize: this.itemsize,
            flags,
            // NumPy reads both and copies them into its array; nothing writes through them.
            shape: this.shape.as_ptr().cast_mut(),
            strides: this.strides.as_ptr().cast_mut(),
            data: ptr.cast(),
            descr: std::ptr::null_mut(),
        };
        let exported = Box::into_raw(Box::new(Exported {
            interface,
            owner: slf.clone().into_any().unbind().into_ptr(),
        }));
        // NumPy reads the capsule with `PyCapsule_GetPointer(capsule, NULL)`: it has no name.
        // SAFETY: `exported` is a live box until the capsule's destructor frees it;
        // `PyCapsule_New` returns a new reference or NULL with an exception set.
        unsafe {
            let capsule =
                pyo3::ffi::PyCapsule_New(exported.cast(), std::ptr::null(), Some(free_exported));
            if capsule.is_null() {
                pyo3::ffi::Py_DecRef(Box::from_raw(exported).owner);
                return Err(PyErr::fetch(slf.py()));
            }
            Ok(Bound::from_owned_ptr(slf.py(), capsule).cast_into_unchecked())
        }
    }
}
