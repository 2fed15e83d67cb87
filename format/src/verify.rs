//! Checking a cache against its manifest: structure, headers, sizes, checksums, and (the full
//! pass) every stored value the format constrains: lengths within `[0, L]` and at most the full
//! length, zero padding, category and sub-column codes within their vocabularies, finite floats
//! (no NaN policy stores a NaN or an infinity), bools of 0 or 1, keys unique across all shards,
//! and `stats.json` describing the same splits as the manifest.

use crate::manifest::{Encoding, Manifest, TensorRole, CODE_FIRST};
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

/// Verifies generation `at` of the cache in `dir`. A missing or invalid manifest is returned as `Err`; problems
/// with shards and `stats.json` are collected in the report so that one run names all of them.
pub fn verify(
    dir: &Path,
    at: &crate::GenerationRef,
    depth: Depth,
    on_shard: impl FnMut(usize, usize),
) -> Result<Report, FormatError> {
    let manifest = Manifest::read_at(dir, at)?;
    let stats = crate::Stats::read(dir, &manifest);
    Ok(verify_parts(
        dir,
        &manifest,
        stats,
        depth,
        |entry| Ok(dir.join(&entry.file)),
        on_shard,
    ))
}

/// [`verify`] of a cache whose manifest and statistics were read already (`stats`, or why they
/// could not be), each shard's file found by `locate` (a local copy of a shard in object
/// storage, say; its error is reported as the shard's problem). `dir` names the cache in
/// messages.
pub fn verify_parts(
    dir: &Path,
    manifest: &Manifest,
    stats: Result<crate::Stats, FormatError>,
    depth: Depth,
    mut locate: impl FnMut(&crate::ShardEntry) -> Result<std::path::PathBuf, FormatError>,
    mut on_shard: impl FnMut(usize, usize),
) -> Report {
    let mut report = Report::default();
    match stats {
        Ok(stats) => report.problems.extend(stats_mismatch(
            manifest,
            &stats,
            &dir.join(crate::STATS_FILE),
        )),
        Err(problem) => report.problems.push(problem),
    }
    let total = manifest.shards().len();
    // Every key seen so far: where it was stored.
    let mut keys: std::collections::HashMap<i64, (usize, usize)> = Default::default();
    for (i, entry) in manifest.shards().iter().enumerate() {
        on_shard(i, total);
        let path = dir.join(&entry.file);
        let checked = locate(entry)
            .and_then(|local| verify_shard(manifest, entry, &local, depth, &mut report.bytes_read))
            .and_then(|shard_keys| {
                if let (Some(table), Depth::Full) = (&entry.keys, depth) {
                    let as_entry = crate::ShardEntry {
                        file: table.file.clone(),
                        bytes: table.bytes,
                        xxh3: table.xxh3.clone(),
                        compressed: None,
                        keys: None,
                        ..entry.clone()
                    };
                    let local = locate(&as_entry)?;
                    report.bytes_read += table.bytes;
                    verify_key_table(table, &local, &shard_keys)?;
                }
                Ok(shard_keys)
            });
        match checked {
            Ok(shard_keys) => {
                for (sample, key) in shard_keys.into_iter().enumerate() {
                    // A hidden context's key was replaced: a later shard holds it again.
                    if entry.is_hidden(sample) {
                        continue;
                    }
                    if let Some(&(shard, first)) = keys.get(&key) {
                        report.problems.push(FormatError::BadValue {
                            shard: path.clone(),
                            tensor: "key".into(),
                            sample,
                            reason: format!(
                                "key {key} is stored twice: also sample {first} of {}",
                                dir.join(&manifest.shards()[shard].file).display()
                            ),
                        });
                    } else {
                        keys.insert(key, (i, sample));
                    }
                }
            }
            Err(problem) => report.problems.push(problem),
        }
        report.shards_checked += 1;
    }
    report
}

/// Where `stats.json` and the manifest disagree about the splits.
fn stats_mismatch(manifest: &Manifest, stats: &crate::Stats, path: &Path) -> Vec<FormatError> {
    let problem = |reason: String| FormatError::StatsMismatch {
        path: path.into(),
        reason,
    };
    let mut out = Vec::new();
    // Statistics still count the contexts a generation hides (`Stats::includes_hidden`).
    let counted = |name: &str, live: usize| {
        live as u64 + stats.includes_hidden.get(name).copied().unwrap_or(0)
    };
    for split in manifest.splits() {
        match stats.split(&split.name) {
            None => out.push(problem(format!(
                "no statistics for split {:?} of the manifest",
                split.name
            ))),
            Some(s) if s.contexts != counted(&split.name, split.contexts) => {
                out.push(problem(format!(
                    "split {:?} has {} contexts in the statistics, {} in the manifest",
                    split.name,
                    s.contexts,
                    counted(&split.name, split.contexts)
                )))
            }
            Some(_) => {}
        }
    }
    let total = counted(
        crate::stats::ALL_SPLITS,
        manifest.splits().iter().map(|s| s.contexts).sum(),
    );
    match stats.split(crate::stats::ALL_SPLITS) {
        Some(all) if all.contexts != total => out.push(problem(format!(
            "\"all\" has {} contexts in the statistics, the manifest's splits {total}",
            all.contexts
        ))),
        None => out.push(problem("no statistics for \"all\"".into())),
        Some(_) => {}
    }
    out
}

/// Checks a shard's key table: its size and checksum, its layout, the shard's ids in the
/// shard's order, and each key hashing to its id.
fn verify_key_table(
    table: &crate::KeyTableEntry,
    path: &Path,
    shard_keys: &[i64],
) -> Result<(), FormatError> {
    let bytes = std::fs::read(path).map_err(|e| FormatError::io(path, e))?;
    checksum::check(checksum::xxh3_hex(&bytes), &table.xxh3, path)?;
    let read = crate::keys::read_key_table(&bytes, path)?;
    let bad = |sample: usize, reason: String| FormatError::BadValue {
        shard: path.into(),
        tensor: "key".into(),
        sample,
        reason,
    };
    if read.ids != shard_keys {
        let at = read.ids.iter().zip(shard_keys).position(|(a, b)| a != b);
        return Err(bad(
            at.unwrap_or(read.ids.len().min(shard_keys.len())),
            format!(
                "the key table's ids ({} of them) are not its shard's ({})",
                read.ids.len(),
                shard_keys.len()
            ),
        ));
    }
    for (i, (id, text)) in read.ids.iter().zip(&read.texts).enumerate() {
        if crate::keys::text_id(text) != *id {
            return Err(bad(i, format!("key {text:?} does not hash to its id {id}")));
        }
    }
    Ok(())
}

fn verify_shard(
    manifest: &Manifest,
    entry: &crate::ShardEntry,
    path: &Path,
    depth: Depth,
    bytes_read: &mut u64,
) -> Result<Vec<i64>, FormatError> {
    crate::stored::check_size(entry, path)?;
    if depth == Depth::Quick {
        let layout = crate::stored::read_layout(entry, path)?;
        *bytes_read += layout.data_start;
        layout.check(manifest, entry, path)?;
        return Ok(Vec::new());
    }
    let stored = std::fs::read(path).map_err(|e| FormatError::io(path, e))?;
    *bytes_read += stored.len() as u64;
    // A compressed shard's own checksum is checked before it is decompressed; the
    // safetensors file it holds is then checked like a hot one.
    let bytes = crate::stored::decode(entry, stored, path)?;
    checksum::check(checksum::xxh3_hex(&bytes), &entry.xxh3, path)?;
    let layout = layout_of(&bytes, path)?;
    layout.check(manifest, entry, path)?;
    check_values(manifest, &layout, &bytes, entry.contexts, path)?;
    let key = manifest
        .tensors()
        .iter()
        .find(|t| t.role == TensorRole::Key);
    Ok(key.map_or_else(Vec::new, |t| {
        let extent = layout.tensor(&t.name).expect("checked against manifest");
        bytes[extent.start as usize..extent.end as usize]
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect()
    }))
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
    let max_len = manifest.max_len();
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
    for spec in manifest.tensors() {
        if !matches!(
            spec.role,
            TensorRole::Features | TensorRole::Categorical | TensorRole::Encoded
        ) {
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
    for spec in manifest.tensors() {
        let extent = layout.tensor(&spec.name).expect("checked against manifest");
        let data = &bytes[extent.start as usize..extent.end as usize];
        let per_sample = spec.sample_elems();
        let bad = |sample: usize, reason: String| FormatError::BadValue {
            shard: path.into(),
            tensor: spec.name.clone(),
            sample,
            reason,
        };
        let i32s = || {
            data.chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
        };
        let f32s = || {
            data.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        };
        match spec.role {
            TensorRole::FullLength => {
                for (i, full) in i32s().enumerate().take(n) {
                    if full < lengths[i] {
                        return Err(bad(
                            i,
                            format!(
                                "full length {full} is below the stored length {}",
                                lengths[i]
                            ),
                        ));
                    }
                }
            }
            TensorRole::Categorical | TensorRole::ContextCategorical => {
                let codes = match &spec.columns[0].encoding {
                    Encoding::Category { vocabulary } => {
                        vocabulary.len() as i64 + CODE_FIRST as i64
                    }
                    _ => continue,
                };
                for (at, code) in i32s().enumerate().take(n * per_sample) {
                    if i64::from(code) < 0 || i64::from(code) >= codes {
                        return Err(bad(
                            at / per_sample,
                            format!(
                                "code {code} at step {} is outside the vocabulary (codes 0..{codes})",
                                at % per_sample
                            ),
                        ));
                    }
                }
            }
            TensorRole::SubColumn | TensorRole::ContextSubColumn => {
                let Encoding::SubColumn { cardinality, .. } = &spec.columns[0].encoding else {
                    continue;
                };
                for (at, code) in i32s().enumerate().take(n * per_sample) {
                    if code < 0 || code as usize >= *cardinality {
                        return Err(bad(
                            at / per_sample,
                            format!("code {code} is outside the sub-column's 0..{cardinality}"),
                        ));
                    }
                }
            }
            TensorRole::Features | TensorRole::Targets | TensorRole::ContextFeatures => {
                let width = spec.columns.len().max(1);
                for (at, v) in f32s().enumerate().take(n * per_sample) {
                    let column = &spec.columns[at % width];
                    let wrong = if !v.is_finite() {
                        Some(format!(
                            "{v} in column {:?}: no NaN policy stores it",
                            column.name
                        ))
                    } else if column.encoding == Encoding::Bool && v != 0.0 && v != 1.0 {
                        Some(format!("{v} in bool column {:?}", column.name))
                    } else {
                        None
                    };
                    if let Some(reason) = wrong {
                        return Err(bad(at / per_sample, reason));
                    }
                }
            }
            TensorRole::Encoded | TensorRole::ContextEncoded => {
                let encoding = &spec.columns[0].encoding;
                match encoding {
                    Encoding::Bits { .. } | Encoding::Ngrams { .. } => {
                        for (at, &b) in data.iter().enumerate().take(n * per_sample) {
                            if b > 1 {
                                return Err(bad(
                                    at / per_sample,
                                    format!("{b} at value {} is not 0 or 1", at % per_sample),
                                ));
                            }
                        }
                    }
                    Encoding::Chars { vocabulary, width } => {
                        let codes = vocabulary.len() as i64 + CODE_FIRST as i64;
                        // A string's codes, then padding (0) to the width: a code after the
                        // padding has begun would decode as a string with a character lost.
                        let mut padded = false;
                        for (at, code) in i32s().enumerate().take(n * per_sample) {
                            if at % width.max(&1) == 0 {
                                padded = false;
                            }
                            if i64::from(code) < 0 || i64::from(code) >= codes {
                                return Err(bad(
                                    at / per_sample,
                                    format!(
                                        "character code {code} at value {} is outside the \
                                         vocabulary (codes 0..{codes})",
                                        at % per_sample
                                    ),
                                ));
                            }
                            if padded && code != 0 {
                                return Err(bad(
                                    at / per_sample,
                                    format!(
                                        "character code {code} at value {} follows the \
                                         string's padding (0)",
                                        at % per_sample
                                    ),
                                ));
                            }
                            padded |= code == 0;
                        }
                    }
                    _ => {}
                }
            }
            TensorRole::Key | TensorRole::Length => {}
        }
    }
    Ok(())
}
