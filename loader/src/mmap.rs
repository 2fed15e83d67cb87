//! The loader's only `unsafe` code: mapping shard files and advising the kernel about them.
//!
//! Safety argument. A memory map is only sound while nobody changes the file underneath it.
//! We map read-only, privately, only files whose size and safetensors header were validated
//! against the manifest just before (so every range the loader reads lies inside the file), and
//! dsc never writes to a published shard: the compiler writes new caches into a staging directory
//! and renames them into place. What remains is a file truncated or rewritten in place by another
//! process while it is mapped: reading the lost pages then raises SIGBUS. That risk is inherent to
//! `mmap` and is documented for users (`docs/GUIDE.md`): do not modify a cache that is being read.
//!
//! The map is private and writable (copy-on-write): the Python binding hands zero-copy views of
//! it to PyTorch, which has no read-only tensors, and a write through such a view must change a
//! private copy of the page, never the shard file (nor crash on a read-only page). Rust code
//! only ever reads it; reading costs the same as a read-only map.

use memmap2::{Advice, MmapMut, MmapOptions, UncheckedAdvice};
use std::fs::File;

/// A private (copy-on-write) map of one whole shard file.
#[derive(Debug)]
pub struct Mapped {
    map: MmapMut,
}

impl Mapped {
    /// Maps `file`, which the caller has just validated to be `len` bytes long.
    pub fn map(file: &File, len: u64) -> std::io::Result<Mapped> {
        if len == 0 {
            // A zero-length map is an error on Linux; an empty split has no shards anyway.
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "empty shard file",
            ));
        }
        // SAFETY: private copy-on-write map of a file whose size and header were validated
        // against the manifest immediately before; dsc never modifies published shards, and
        // writes to a private map never reach the file. A concurrent truncation by another
        // process could still cause SIGBUS on access (module docs).
        let map = unsafe { MmapOptions::new().len(len as usize).map_copy(file)? };
        if map.len() as u64 != len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "short map",
            ));
        }
        Ok(Mapped { map })
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Hints that `range` will be read soon (read-ahead into the page cache).
    pub fn will_need(&self, start: usize, len: usize) {
        let (start, len) = self.clamp(start, len);
        if len > 0 {
            // Populate the page tables too (Linux 5.14+), so that the gather does not take one
            // minor fault per page; older kernels only read ahead.
            if self
                .map
                .advise_range(Advice::PopulateRead, start, len)
                .is_err()
            {
                let _ = self.map.advise_range(Advice::WillNeed, start, len);
            }
        }
    }

    /// Drops `range` from this process's resident set; the page cache keeps the data, so a later
    /// read only costs a minor fault.
    pub fn release(&self, start: usize, len: usize) {
        let (start, len) = self.clamp(start, len);
        if len > 0 {
            // SAFETY: DONTNEED discards private modifications of the range, so the next access
            // re-reads the file's unchanged data: dsc itself never writes the map, and a user's
            // write through a zero-copy view is documented to be a private, temporary change.
            let _ = unsafe {
                self.map
                    .unchecked_advise_range(UncheckedAdvice::DontNeed, start, len)
            };
        }
    }

    fn clamp(&self, start: usize, len: usize) -> (usize, usize) {
        // madvise wants page-aligned starts; widen down to the page boundary.
        const PAGE: usize = 4096;
        let start = start.min(self.map.len());
        let aligned = start - start % PAGE;
        let end = (start + len).min(self.map.len());
        (aligned, end - aligned)
    }
}
