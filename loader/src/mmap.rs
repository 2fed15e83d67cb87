//! Mapping shard files and advising the kernel about them: with `sigbus`, the loader's `unsafe`
//! code (besides a prefetch hint in `rows`).
//!
//! Safety argument. A memory map is only sound while nobody changes the file underneath it.
//! We map read-only, privately, only files whose size and safetensors header were validated
//! against the manifest just before (so every range the loader reads lies inside the file), and
//! dsc never writes to a published shard: the compiler writes new caches into a staging directory
//! and renames them into place. What remains is a file truncated or rewritten in place by another
//! process while it is mapped: reading the lost pages then raises SIGBUS. That risk is inherent to
//! `mmap` and is documented for users (`docs/GUIDE.md`): do not modify a cache that is being read.
//! Every map is registered with `sigbus`, whose handler names the shard when it happens.

use memmap2::{Advice, Mmap, MmapOptions, UncheckedAdvice};
use std::fs::File;

/// A read-only map of one whole shard file.
#[derive(Debug)]
pub struct Mapped {
    /// Dropped (unregistered) before the map is unmapped.
    _guard: crate::sigbus::Registration,
    map: Mmap,
}

impl Mapped {
    /// Maps `file` (at `path`), which the caller has just validated to be `len` bytes long.
    pub fn map(file: &File, len: u64, path: &std::path::Path) -> std::io::Result<Mapped> {
        if len == 0 {
            // A zero-length map is an error on Linux; an empty split has no shards anyway.
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "empty shard file",
            ));
        }
        // SAFETY: read-only private map of a file whose size and header were validated against
        // the manifest immediately before; dsc never modifies published shards. A concurrent
        // truncation by another process could still cause SIGBUS on access (module docs).
        let map = unsafe { MmapOptions::new().len(len as usize).map(file)? };
        if map.len() as u64 != len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "short map",
            ));
        }
        Ok(Mapped {
            _guard: crate::sigbus::register(map.as_ptr(), map.len(), path),
            map,
        })
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
            // SAFETY: DONTNEED discards private modifications of the range; this map is
            // read-only and never written, so the next access re-reads the file's unchanged data.
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
