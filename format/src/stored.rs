//! How a shard is kept on disk: as its safetensors file (hot: the loader maps it) or as one
//! zstd frame of that file (cold: read and decompressed into memory on first use). Every
//! reader of shard bytes goes through here, so a compressed shard gets the same checks as a
//! hot one: the stored size and checksum first, then the decompressed size.

use crate::manifest::{Codec, ShardEntry};
use crate::shard::{read_header, ShardLayout};
use crate::{checksum, FormatError};
use std::io::Read;
use std::path::Path;

/// The zstd level `--compress zstd` uses unless told otherwise: fast to write, and on dsc's
/// caches (padding, small codes) within a few percent of the slow levels' size.
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;

/// `hot` (a whole safetensors file) as `codec`'s stored form.
pub fn compress(codec: Codec, hot: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    match codec {
        Codec::Zstd => zstd::bulk::compress(hot, level),
    }
}

fn decompress_err(path: &Path, reason: impl std::fmt::Display) -> FormatError {
    FormatError::Decompress {
        shard: path.into(),
        reason: reason.to_string(),
    }
}

/// The safetensors bytes of shard `entry`, from `stored`, the bytes of its file at `path`:
/// the file itself when hot (its size checked); decompressed when compressed, after checking
/// the stored size and xxh3, and checked to be exactly `entry.bytes` long.
pub fn decode(entry: &ShardEntry, stored: Vec<u8>, path: &Path) -> Result<Vec<u8>, FormatError> {
    check_stored_size(entry, stored.len() as u64, path)?;
    let Some(c) = &entry.compressed else {
        return Ok(stored);
    };
    checksum::check(checksum::xxh3_hex(&stored), &c.xxh3, path)?;
    let want = usize::try_from(entry.bytes)
        .map_err(|_| decompress_err(path, format!("{} bytes do not fit in memory", entry.bytes)))?;
    // Memory grows with what the frame actually holds, never with what the manifest claims
    // (a crafted entry could claim terabytes): sized for this codec's usual ratio up front,
    // and reading stops one byte past `want`.
    let mut hot = Vec::with_capacity(want.min(stored.len().saturating_mul(32).max(1 << 16)));
    match c.codec {
        Codec::Zstd => zstd::stream::read::Decoder::new(&stored[..])
            .and_then(|d| d.take(want as u64 + 1).read_to_end(&mut hot))
            .map_err(|e| decompress_err(path, format!("{e} (expected {want} bytes)")))?,
    };
    if hot.len() != want {
        return Err(decompress_err(
            path,
            format!("{} bytes, the manifest says {want}", hot.len()),
        ));
    }
    Ok(hot)
}

/// Reads shard `entry` of the cache in `dir` whole and returns its safetensors bytes
/// ([`decode`]).
pub fn read(dir: &Path, entry: &ShardEntry) -> Result<Vec<u8>, FormatError> {
    let path = dir.join(&entry.file);
    let stored = std::fs::read(&path).map_err(|e| FormatError::io(&path, e))?;
    decode(entry, stored, &path)
}

/// The stored file's size, checked against the manifest.
pub fn check_size(entry: &ShardEntry, path: &Path) -> Result<(), FormatError> {
    let size = std::fs::metadata(path)
        .map_err(|e| FormatError::io(path, e))?
        .len();
    check_stored_size(entry, size, path)
}

/// `found`, the size of shard `entry`'s file at `path`, checked against the manifest.
fn check_stored_size(entry: &ShardEntry, found: u64, path: &Path) -> Result<(), FormatError> {
    if found != entry.stored_bytes() {
        return Err(FormatError::ShardSize {
            shard: path.into(),
            expected: entry.stored_bytes(),
            found,
        });
    }
    Ok(())
}

/// The header of shard `entry` at `path` without reading its data: for a compressed shard,
/// only the start of the frame is decompressed.
pub fn read_layout(entry: &ShardEntry, path: &Path) -> Result<ShardLayout, FormatError> {
    let file = std::fs::File::open(path).map_err(|e| FormatError::io(path, e))?;
    read_layout_of(entry, &file, path)
}

/// [`read_layout`] of the shard already open as `file` (stored at `path`, for messages): its
/// stored size checked, its header read from the start with `pread` (the file's cursor is
/// neither used nor moved).
pub fn read_layout_of(
    entry: &ShardEntry,
    file: &std::fs::File,
    path: &Path,
) -> Result<ShardLayout, FormatError> {
    let stored = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
    if entry.compressed.is_some() {
        check_stored_size(entry, stored, path)?;
    }
    read_layout_from(entry, ReadAt(file, 0), stored, path)
}

/// [`read_layout_of`] from `stored`, a reader of the stored file from its start (`len` bytes
/// long), wherever it comes from (a local file, ranged requests to object storage): the header
/// is read and parsed, and only as much of the file as it takes (of a compressed shard, the
/// start of the frame).
pub fn read_layout_from(
    entry: &ShardEntry,
    mut stored: impl Read,
    len: u64,
    path: &Path,
) -> Result<ShardLayout, FormatError> {
    let Some(c) = &entry.compressed else {
        return crate::shard::read_header(&mut stored, len, path, |e| FormatError::io(path, e));
    };
    match c.codec {
        Codec::Zstd => {
            let mut frame =
                zstd::stream::read::Decoder::new(stored).map_err(|e| decompress_err(path, e))?;
            read_header(&mut frame, entry.bytes, path, |e| decompress_err(path, e))
        }
    }
}

/// A file read from an offset with `pread`, so that the file's cursor (shared with other
/// readers of the same handle) is neither used nor moved.
struct ReadAt<'a>(&'a std::fs::File, u64);

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let n = self.0.read_at(buf, self.1)?;
        self.1 += n as u64;
        Ok(n)
    }
}

/// The first `len` bytes of shard `entry`'s safetensors file, read from `file` (stored at
/// `path`): for a compressed shard only the start of the frame is decompressed. Unlike
/// [`decode`] nothing is checked beyond the stored size and the length: for metadata that sits
/// at the start of a shard (its keys and lengths) and is read before the shard's data, which is
/// checked when it is read whole.
pub fn read_prefix(
    entry: &ShardEntry,
    file: &std::fs::File,
    path: &Path,
    len: usize,
) -> Result<Vec<u8>, FormatError> {
    let stored = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
    check_stored_size(entry, stored, path)?;
    read_prefix_from(entry, ReadAt(file, 0), path, len)
}

/// [`read_prefix`] from `stored`, a reader of the stored file from its start (a local file,
/// ranged requests to object storage).
pub fn read_prefix_from(
    entry: &ShardEntry,
    stored: impl Read,
    path: &Path,
    len: usize,
) -> Result<Vec<u8>, FormatError> {
    if len as u64 > entry.bytes {
        return Err(decompress_err(
            path,
            format!("{len} bytes asked of a {}-byte shard", entry.bytes),
        ));
    }
    let mut out = vec![0; len];
    let read = match entry.compressed.as_ref().map(|c| c.codec) {
        None => {
            let mut stored = stored;
            stored.read_exact(&mut out)
        }
        Some(Codec::Zstd) => zstd::stream::read::Decoder::new(stored)
            .and_then(|mut frame| frame.read_exact(&mut out)),
    };
    read.map_err(|e| decompress_err(path, format!("{e} (reading its first {len} bytes)")))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Compressed;

    fn entry(hot: &[u8], stored: &[u8], claimed: u64) -> ShardEntry {
        ShardEntry {
            file: "shards/train-00000.safetensors.zst".into(),
            split: "train".into(),
            index: 0,
            contexts: 1,
            first_context: 0,
            bytes: claimed,
            xxh3: checksum::xxh3_hex(hot),
            compressed: Some(Compressed {
                codec: Codec::Zstd,
                level: Some(DEFAULT_ZSTD_LEVEL),
                bytes: stored.len() as u64,
                xxh3: checksum::xxh3_hex(stored),
            }),
            keys: None,
            generation: None,
            removed: Vec::new(),
        }
    }

    #[test]
    fn decode_gives_back_the_bytes_and_refuses_any_other_size() {
        let hot: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let stored = compress(Codec::Zstd, &hot, DEFAULT_ZSTD_LEVEL).unwrap();
        let path = Path::new("s.zst");
        let e = entry(&hot, &stored, hot.len() as u64);
        assert_eq!(decode(&e, stored.clone(), path).unwrap(), hot);
        // A manifest claiming far more (or less) than the frame holds is an error naming the
        // file, without allocating what it claims.
        for claimed in [1u64 << 50, hot.len() as u64 - 1, hot.len() as u64 + 1] {
            let err = decode(&entry(&hot, &stored, claimed), stored.clone(), path).unwrap_err();
            assert!(
                matches!(err, FormatError::Decompress { .. }) && err.to_string().contains("s.zst"),
                "{claimed}: {err}"
            );
        }
        // A frame cut short or not zstd at all.
        for bad in [
            stored[..stored.len() / 2].to_vec(),
            b"not a zstd frame".to_vec(),
        ] {
            let err = decode(&entry(&hot, &bad, hot.len() as u64), bad.clone(), path).unwrap_err();
            assert!(matches!(err, FormatError::Decompress { .. }), "{err}");
        }
    }

    #[test]
    fn read_prefix_decompresses_the_start_only_and_refuses_a_short_file() {
        let hot: Vec<u8> = (0..300_000u32).map(|i| (i % 241) as u8).collect();
        let stored = compress(Codec::Zstd, &hot, DEFAULT_ZSTD_LEVEL).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.zst");
        std::fs::write(&path, &stored).unwrap();
        let e = entry(&hot, &stored, hot.len() as u64);
        let file = std::fs::File::open(&path).unwrap();
        for len in [0, 1, 4096, 200_001, hot.len()] {
            assert_eq!(read_prefix(&e, &file, &path, len).unwrap(), hot[..len]);
        }
        let err = read_prefix(&e, &file, &path, hot.len() + 1).unwrap_err();
        assert!(err.to_string().contains("s.zst"), "{err}");
        // A file cut short is refused by its size before anything is decompressed.
        std::fs::write(&path, &stored[..stored.len() - 1]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let err = read_prefix(&e, &file, &path, 10).unwrap_err();
        assert!(matches!(err, FormatError::ShardSize { .. }), "{err}");
    }
}
