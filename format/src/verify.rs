//! Checking a cache against its manifest: structure, headers, sizes, checksums and the stored
//! values that the format constrains (lengths within bounds, zero padding).

use crate::manifest::{Manifest, TensorRole};
use crate::shard::{parse_header, ShardLayout, MAX_HEADER_BYTES};
use crate::{checksum, FormatError};
use std::path::Path;

/// How thoroughly to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Depth {
    /// Sizes and headers only: reads a few KiB per shard.
    Quick,
    /// Everything: reads every byte (checksums, lengths, padding).
    #[default]
    Full,
}

/// What a verification found.
#[derive(Debug, Default)]
pub struct Report {
    /// Shards checked.
    pub shards_checked: usize,
    /// Bytes read.
    pub bytes_read: u64,
    /// Every problem found; empty means the cache is sound.
    pub problems: Vec<FormatError>,
}

/// Verifies the cache in `dir`. A missing or invalid manifest is returned as `Err`; problems
/// with shards and `stats.json` are collected in the report so that one run names all of them.
pub fn verify(
    dir: &Path,
    depth: Depth,
    mut on_shard: impl FnMut(usize, usize),
) -> Result<Report, FormatError> {
    let manifest = Manifest::read(dir)?;
    let mut report = Report::default();
    if let Err(problem) = crate::Stats::read(dir) {
        report.problems.push(problem);
    }
    let total = manifest.shards.len();
    for (i, entry) in manifest.shards.iter().enumerate() {
        on_shard(i, total);
        let path = dir.join(&entry.file);
        if let Err(problem) = verify_shard(&manifest, entry, &path, depth, &mut report.bytes_read) {
            report.problems.push(problem);
        }
        report.shards_checked += 1;
    }
    Ok(report)
}

fn verify_shard(
    manifest: &Manifest,
    entry: &crate::ShardEntry,
    path: &Path,
    depth: Depth,
    bytes_read: &mut u64,
) -> Result<(), FormatError> {
    let size = std::fs::metadata(path)
        .map_err(|e| FormatError::io(path, e))?
        .len();
    if size != entry.bytes {
        return Err(FormatError::ShardSize {
            shard: path.into(),
            expected: entry.bytes,
            found: size,
        });
    }
    if depth == Depth::Quick {
        let layout = crate::shard::read_layout(path)?;
        *bytes_read += layout.data_start;
        return layout.check(&manifest.tensors, entry.contexts, path);
    }
    let bytes = std::fs::read(path).map_err(|e| FormatError::io(path, e))?;
    *bytes_read += bytes.len() as u64;
    let found = checksum::xxh3_hex(&bytes);
    if found != entry.xxh3 {
        return Err(FormatError::Checksum {
            shard: path.into(),
            expected: entry.xxh3.clone(),
            found,
        });
    }
    let layout = layout_of(&bytes, path)?;
    layout.check(&manifest.tensors, entry.contexts, path)?;
    check_values(manifest, &layout, &bytes, entry.contexts, path)
}

fn layout_of(bytes: &[u8], path: &Path) -> Result<ShardLayout, FormatError> {
    let bad = |reason: String| FormatError::ShardHeader {
        shard: path.into(),
        reason,
    };
    let prefix: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| {
            bad(format!(
                "file has {} bytes, too short for a header",
                bytes.len()
            ))
        })?;
    let n = u64::from_le_bytes(prefix);
    if n > MAX_HEADER_BYTES || n > bytes.len() as u64 - 8 {
        return Err(bad(format!(
            "header length {n} is impossible for a {}-byte file",
            bytes.len()
        )));
    }
    parse_header(&bytes[8..8 + n as usize], bytes.len() as u64, path)
}

fn check_values(
    manifest: &Manifest,
    layout: &ShardLayout,
    bytes: &[u8],
    n: usize,
    path: &Path,
) -> Result<(), FormatError> {
    let max_len = manifest.max_len;
    let length = layout.tensor("length").expect("checked against manifest");
    let lengths: Vec<i32> = bytes[length.start as usize..length.end as usize]
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    for (i, &len) in lengths.iter().enumerate() {
        if len < 0 || len as usize > max_len {
            return Err(FormatError::BadValue {
                shard: path.into(),
                tensor: "length".into(),
                sample: i,
                reason: format!("length {len} is outside 0..={max_len}"),
            });
        }
    }
    for spec in &manifest.tensors {
        if !matches!(spec.role, TensorRole::Features | TensorRole::Categorical) {
            continue;
        }
        let extent = layout.tensor(&spec.name).expect("checked against manifest");
        let data = &bytes[extent.start as usize..extent.end as usize];
        let step_bytes = spec.sample_bytes() / max_len.max(1);
        let sample_bytes = spec.sample_bytes();
        for (i, &len) in lengths.iter().enumerate().take(n) {
            let sample = &data[i * sample_bytes..(i + 1) * sample_bytes];
            let padding = &sample[len as usize * step_bytes..];
            if let Some(pos) = padding.iter().position(|&b| b != 0) {
                return Err(FormatError::BadValue {
                    shard: path.into(),
                    tensor: spec.name.clone(),
                    sample: i,
                    reason: format!(
                        "padding is not zero at step {} (length {len})",
                        len as usize + pos / step_bytes
                    ),
                });
            }
        }
    }
    Ok(())
}
