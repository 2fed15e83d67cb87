//! How a shard is kept on disk: as its safetensors file (hot: the loader maps it) or as one
//! zstd frame of that file (cold: read and decompressed into memory on first use). Every
//! reader of shard bytes goes through here, so a compressed shard gets the same checks as a
//! hot one: the stored size and checksum first, then the decompressed size.

use crate::manifest::{Codec, ShardEntry};
use crate::shard::{read_header, ShardLayout};
use crate::{checksum, FormatError};
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
    if stored.len() as u64 != entry.stored_bytes() {
        return Err(FormatError::ShardSize {
            shard: path.into(),
            expected: entry.stored_bytes(),
            found: stored.len() as u64,
        });
    }
    let Some(c) = &entry.compressed else {
        return Ok(stored);
    };
    let found = checksum::xxh3_hex(&stored);
    if found != c.xxh3 {
        return Err(FormatError::Checksum {
            shard: path.into(),
            expected: c.xxh3.clone(),
            found,
        });
    }
    let want = usize::try_from(entry.bytes)
        .map_err(|_| decompress_err(path, format!("{} bytes do not fit in memory", entry.bytes)))?;
    let hot = match c.codec {
        // A frame that would decompress past `want` is an error, not an allocation.
        Codec::Zstd => zstd::bulk::decompress(&stored, want)
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
    if size != entry.stored_bytes() {
        return Err(FormatError::ShardSize {
            shard: path.into(),
            expected: entry.stored_bytes(),
            found: size,
        });
    }
    Ok(())
}

/// The header of shard `entry` at `path` without reading its data: for a compressed shard,
/// only the start of the frame is decompressed.
pub fn read_layout(entry: &ShardEntry, path: &Path) -> Result<ShardLayout, FormatError> {
    let Some(c) = &entry.compressed else {
        return crate::shard::read_layout(path);
    };
    check_size(entry, path)?;
    let file = std::fs::File::open(path).map_err(|e| FormatError::io(path, e))?;
    match c.codec {
        Codec::Zstd => {
            let mut frame =
                zstd::stream::read::Decoder::new(file).map_err(|e| decompress_err(path, e))?;
            read_header(&mut frame, entry.bytes, path, |e| decompress_err(path, e))
        }
    }
}
