//! How a cache's shards are stored: hot (safetensors files, mapped by the loader) or
//! compressed (one zstd frame per shard, for cold storage). A compile writes hot shards and,
//! with `--compress`, converts them in its staging directory before the commit;
//! `dsc compress` / `dsc decompress` convert a committed cache through a staging copy,
//! committed like a compile, so that a failed or killed conversion leaves the cache as it was.

use crate::codec::Storage;
use crate::error::{CompileError, Result};
use crate::write::{ShardWriter, Staging};
use crate::Progress;
use dsc_format::checksum::{hash_file, Hasher};
use dsc_format::{Codec, Compressed, FormatError, Manifest, ShardEntry};
use rayon::prelude::*;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

/// What a conversion did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StorageReport {
    /// Shards rewritten (the others were already in the asked form).
    pub shards_converted: usize,
    /// Shards in the cache.
    pub shards: usize,
    /// Bytes of the shard files before.
    pub bytes_before: u64,
    /// Bytes of the shard files after.
    pub bytes_after: u64,
    /// Bytes of the shards' safetensors files (what a hot cache holds).
    pub bytes_hot: u64,
    /// Seconds of the whole conversion.
    pub seconds: f64,
}

/// Counts and hashes what passes through, and remembers whether reading failed (so that a
/// failed copy blames the right file).
struct Hashing<R> {
    inner: R,
    hasher: Hasher,
    bytes: u64,
    failed: bool,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf).inspect_err(|_| self.failed = true)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

/// A [`ShardWriter`] as an `io::Write`, for the encoder.
struct Sink(ShardWriter);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .write(buf)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes shard `entry` of the cache in `from` into `to` in `storage`'s form and returns the
/// entry describing the new file. The source is checked on the way: its safetensors bytes
/// must have the manifest's size and xxh3 (and a compressed file its own), so that a damaged
/// shard is refused, never re-encoded under a fresh checksum.
fn convert(from: &Path, to: &Path, entry: &ShardEntry, storage: Storage) -> Result<ShardEntry> {
    let src = from.join(&entry.file);
    dsc_format::stored::check_size(entry, &src)?;
    if let Some(c) = &entry.compressed {
        // The size was checked just above; a file rewritten since fails its hash.
        let (_, xxh3) = hash_file(&src)?;
        dsc_format::checksum::check(xxh3, &c.xxh3, &src)?;
    }
    let file = std::fs::File::open(&src).map_err(|e| CompileError::io(&src, e))?;
    let hot: Box<dyn Read> = match entry.compressed.as_ref().map(|c| c.codec) {
        None => Box::new(std::io::BufReader::with_capacity(1 << 20, file)),
        Some(Codec::Zstd) => {
            Box::new(zstd::stream::read::Decoder::new(file).map_err(|e| CompileError::io(&src, e))?)
        }
    };
    // Never more than one byte past the manifest's size: a frame that holds more is refused
    // below, not written out until the disk is full.
    let mut hot = Hashing {
        inner: hot.take(entry.bytes.saturating_add(1)),
        hasher: Hasher::new(),
        bytes: 0,
        failed: false,
    };
    let mut out = ShardEntry {
        compressed: storage.codec().map(|codec| Compressed {
            codec,
            level: storage.level(),
            bytes: 0,
            xxh3: String::new(),
        }),
        ..entry.clone()
    };
    out.file = out.expected_file();
    let dst = to.join(&out.file);
    let copy_err = |e: std::io::Error, failed_reading: bool| -> CompileError {
        match (failed_reading, &entry.compressed) {
            (false, _) => CompileError::io(&dst, e),
            (true, Some(_)) => FormatError::Decompress {
                shard: src.clone(),
                reason: e.to_string(),
            }
            .into(),
            (true, None) => CompileError::io(&src, e),
        }
    };
    let writer = ShardWriter::create(dst.clone())?;
    let (bytes, xxh3) = match storage {
        Storage::Hot => {
            let mut sink = Sink(writer);
            std::io::copy(&mut hot, &mut sink).map_err(|e| copy_err(e, hot.failed))?;
            sink.0.finish()?
        }
        Storage::Zstd { level } => {
            let mut enc = zstd::stream::write::Encoder::new(Sink(writer), level)
                .map_err(|e| CompileError::io(&dst, e))?;
            // The frame records the size it holds, for any zstd tool; no frame checksum: the
            // manifest holds one for the file and one for what it decompresses to.
            enc.set_pledged_src_size(Some(entry.bytes))
                .map_err(|e| CompileError::io(&dst, e))?;
            std::io::copy(&mut hot, &mut enc).map_err(|e| copy_err(e, hot.failed))?;
            enc.finish()
                .map_err(|e| CompileError::io(&dst, e))?
                .0
                .finish()?
        }
    };
    if hot.bytes != entry.bytes || hot.hasher.hex() != entry.xxh3 {
        let _ = std::fs::remove_file(&dst);
        return Err(FormatError::Checksum {
            shard: src,
            expected: format!("{} ({} bytes)", entry.xxh3, entry.bytes),
            found: format!("{} ({} bytes)", hot.hasher.hex(), hot.bytes),
        }
        .into());
    }
    match &mut out.compressed {
        Some(c) => {
            c.bytes = bytes;
            c.xxh3 = xxh3;
        }
        None => debug_assert_eq!((bytes, &xxh3), (entry.bytes, &entry.xxh3)),
    }
    Ok(out)
}

/// Whether shard `entry` is stored in `storage`'s form already: hot, or with the same codec
/// at the same level. A shard whose level was not recorded (compressed by an older dsc) is
/// taken as it is.
fn stored_as(entry: &ShardEntry, storage: Storage) -> bool {
    match &entry.compressed {
        None => storage == Storage::Hot,
        Some(c) => {
            Some(c.codec) == storage.codec() && c.level.is_none_or(|l| Some(l) == storage.level())
        }
    }
}

/// Shards of `manifest` a conversion to `storage` rewrites.
fn shards_in(manifest: &Manifest, storage: Storage) -> usize {
    manifest
        .shards()
        .iter()
        .filter(|s| !stored_as(s, storage))
        .count()
}

/// Converts the hot shards a compile wrote into `staging` to `storage`, in place, and returns
/// the manifest describing them.
pub(crate) fn store_staged(
    staging: &Staging,
    manifest: Manifest,
    storage: Storage,
    progress: &dyn Progress,
) -> Result<Manifest> {
    if storage == Storage::Hot {
        return Ok(manifest);
    }
    progress.stage("compress", shards_in(&manifest, storage) as u64);
    let dir = &staging.dir;
    let shards = manifest
        .shards()
        .par_iter()
        .map(|entry| {
            crate::progress::check(progress)?;
            let out = convert(dir, dir, entry, storage)?;
            std::fs::remove_file(dir.join(&entry.file))
                .map_err(|e| CompileError::io(dir.join(&entry.file), e))?;
            progress.advance(1);
            Ok(out)
        })
        .collect::<Result<Vec<_>>>()?;
    with_shards(manifest, shards)
}

fn with_shards(manifest: Manifest, shards: Vec<ShardEntry>) -> Result<Manifest> {
    manifest
        .with_shards(shards)
        .map_err(|p| CompileError::Internal(format!("the manifest is inconsistent: {p}")))
}

/// Rewrites the cache in `dir` with its shards in `storage`'s form (`dsc compress`,
/// `dsc decompress`): shards already in that form and every other file are linked into a
/// staging copy, the others converted into it, and the copy replaces the cache in one step.
/// Needs room for the converted shards beside the cache until then.
pub fn restore(dir: &Path, storage: Storage, progress: &dyn Progress) -> Result<StorageReport> {
    let start = Instant::now();
    let storage = storage.check()?;
    // The manifest is read under the output's lock: a compile or conversion committing at the
    // same time cannot change the cache between reading it and replacing it.
    let staging = Staging::create(dir, true)?;
    let manifest = Manifest::read(dir)?;
    one_generation(dir, &manifest)?;
    let (manifest, report) = convert_cache(dir, &staging.dir, manifest, storage, progress)?;
    staging.write_file(dsc_format::MANIFEST_FILE, &manifest.to_json())?;
    crate::progress::check(progress)?;
    // The cache it converted is removed before returning: a conversion is not timed to the
    // moment it commits.
    let (_, replaced) = staging.commit()?;
    drop(replaced);
    progress.finish();
    Ok(StorageReport {
        seconds: start.elapsed().as_secs_f64(),
        ..report
    })
}

/// Refuses to convert a cache that grew by generations: its files belong to several manifests,
/// which a conversion into one would not keep.
fn one_generation(dir: &Path, manifest: &Manifest) -> Result<()> {
    if manifest.generation_number() > 1 {
        return Err(dsc_format::spelling::OptionError::new(
            "compress",
            format!(
                "cannot convert {}: it has {} generations (dsc append), and converting one is \
                 not supported yet; compile its inputs into a new cache to convert them",
                dir.display(),
                manifest.generation_number()
            ),
        )
        .into());
    }
    Ok(())
}

/// Writes a copy of the cache in `dir` with its shards in `storage`'s form into `dest`, a
/// directory that must not exist yet, leaving `dir` as it is (`dsc compress --out URL`
/// uploads such a copy). Shards already in that form and every other file are linked (or
/// copied, across file systems); the manifest is written last.
pub fn export(
    dir: &Path,
    dest: &Path,
    storage: Storage,
    progress: &dyn Progress,
) -> Result<StorageReport> {
    let start = Instant::now();
    let storage = storage.check()?;
    let manifest = Manifest::read(dir)?;
    one_generation(dir, &manifest)?;
    std::fs::create_dir(dest).map_err(|e| CompileError::io(dest, e))?;
    let shards = dest.join(dsc_format::SHARDS_DIR);
    std::fs::create_dir_all(&shards).map_err(|e| CompileError::io(&shards, e))?;
    let (manifest, report) = convert_cache(dir, dest, manifest, storage, progress)?;
    let path = dest.join(dsc_format::MANIFEST_FILE);
    std::fs::write(&path, manifest.to_json()).map_err(|e| CompileError::io(&path, e))?;
    progress.finish();
    Ok(StorageReport {
        seconds: start.elapsed().as_secs_f64(),
        ..report
    })
}

/// Links or converts every file of the cache in `dir` (`manifest`) into `to`, but its manifest:
/// the manifest of the result, and what the conversion did.
fn convert_cache(
    dir: &Path,
    to: &Path,
    manifest: Manifest,
    storage: Storage,
    progress: &dyn Progress,
) -> Result<(Manifest, StorageReport)> {
    link_others(dir, to, &manifest)?;
    progress.stage("convert shards", shards_in(&manifest, storage) as u64);
    let shards = manifest
        .shards()
        .par_iter()
        .map(|entry| {
            crate::progress::check(progress)?;
            if stored_as(entry, storage) {
                link_or_copy(&dir.join(&entry.file), &to.join(&entry.file))?;
                return Ok(entry.clone());
            }
            let out = convert(dir, to, entry, storage)?;
            progress.advance(1);
            Ok(out)
        })
        .collect::<Result<Vec<_>>>()?;
    let report = StorageReport {
        shards_converted: shards_in(&manifest, storage),
        shards: shards.len(),
        bytes_before: manifest.shards().iter().map(ShardEntry::stored_bytes).sum(),
        bytes_after: shards.iter().map(ShardEntry::stored_bytes).sum(),
        bytes_hot: shards.iter().map(|s| s.bytes).sum(),
        seconds: 0.0,
    };
    Ok((with_shards(manifest, shards)?, report))
}

/// Links every file of the cache except its manifest and shards into `to`, keeping folders.
fn link_others(dir: &Path, to: &Path, manifest: &Manifest) -> Result<()> {
    let shards: std::collections::HashSet<&str> =
        manifest.shards().iter().map(|s| s.file.as_str()).collect();
    let mut stack = vec![std::path::PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let here = dir.join(&rel);
        for item in std::fs::read_dir(&here).map_err(|e| CompileError::io(&here, e))? {
            let item = item.map_err(|e| CompileError::io(&here, e))?;
            let rel = rel.join(item.file_name());
            let kind = item
                .file_type()
                .map_err(|e| CompileError::io(item.path(), e))?;
            let name = rel.to_string_lossy();
            if kind.is_dir() {
                std::fs::create_dir_all(to.join(&rel))
                    .map_err(|e| CompileError::io(to.join(&rel), e))?;
                stack.push(rel);
            } else if name != dsc_format::MANIFEST_FILE && !shards.contains(name.as_ref()) {
                link_or_copy(&item.path(), &to.join(&rel))?;
            }
        }
    }
    Ok(())
}

fn link_or_copy(from: &Path, to: &Path) -> Result<()> {
    if std::fs::hard_link(from, to).is_ok() {
        return Ok(());
    }
    std::fs::copy(from, to).map_err(|e| CompileError::io(to, e))?;
    Ok(())
}
