//! Reading single contexts from a cache without mapping it, and decoding them back to source
//! units: what `dsc show` prints and what tests compare against the source data.

use crate::manifest::{Encoding, Manifest, ShardEntry, TensorRole, CODE_FIRST, CODE_NULL};
use crate::stored::read_layout;
use crate::FormatError;
use serde_json::Value;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// One context's stored bytes, per tensor in manifest order.
#[derive(Debug, Clone)]
pub struct RawContext {
    /// The split it belongs to.
    pub split: String,
    /// Its position in the split's compiled order.
    pub index: usize,
    /// `(tensor name, sample bytes)` in manifest order.
    pub tensors: Vec<(String, Vec<u8>)>,
}

fn io(path: &Path, e: std::io::Error) -> FormatError {
    FormatError::Io {
        path: path.into(),
        source: e,
    }
}

/// Byte ranges of one shard's safetensors file: read from the file when hot; from the
/// decompressed file, held whole, when compressed (a compressed frame has no random access).
enum Ranges {
    Hot {
        file: std::fs::File,
        path: std::path::PathBuf,
    },
    Cold(Vec<u8>),
}

impl Ranges {
    fn open(dir: &Path, entry: &ShardEntry) -> Result<Ranges, FormatError> {
        let path = dir.join(&entry.file);
        if entry.compressed.is_some() {
            return Ok(Ranges::Cold(crate::stored::read(dir, entry)?));
        }
        let file = std::fs::File::open(&path).map_err(|e| io(&path, e))?;
        Ok(Ranges::Hot { file, path })
    }

    fn read_at(&mut self, offset: u64, len: usize) -> Result<Vec<u8>, FormatError> {
        match self {
            Ranges::Hot { file, path } => {
                let mut buf = vec![0u8; len];
                file.seek(SeekFrom::Start(offset))
                    .map_err(|e| io(path, e))?;
                file.read_exact(&mut buf).map_err(|e| io(path, e))?;
                Ok(buf)
            }
            Ranges::Cold(bytes) => Ok(usize::try_from(offset)
                .ok()
                .and_then(|o| bytes.get(o..o.checked_add(len)?))
                .expect("ranges come from a layout checked against the file")
                .to_vec()),
        }
    }
}

fn shard_for<'a>(manifest: &'a Manifest, split: &'a str, index: usize) -> Option<&'a ShardEntry> {
    manifest
        .shards_of(split)
        .find(|s| (s.first_context..s.first_context + s.contexts).contains(&index))
}

/// Reads context `index` of `split`, checking the shard's header against the manifest first.
pub fn read_context(
    dir: &Path,
    manifest: &Manifest,
    split: &str,
    index: usize,
) -> Result<Option<RawContext>, FormatError> {
    let Some(entry) = shard_for(manifest, split, index) else {
        return Ok(None);
    };
    let path = dir.join(&entry.file);
    let layout = read_layout(entry, &path)?;
    layout.check(manifest, entry, &path)?;
    let mut file = Ranges::open(dir, entry)?;
    context_at(manifest, entry, &layout, split, index, |at, len| {
        file.read_at(at, len)
    })
    .map(Some)
}

/// [`read_context`] from shard `entry`'s safetensors bytes held in memory (a shard fetched
/// from object storage, or decompressed; `path` names it in messages), its header checked
/// against the manifest first. `None` when the shard does not hold context `index`.
pub fn read_context_in(
    manifest: &Manifest,
    entry: &ShardEntry,
    bytes: &[u8],
    path: &Path,
    split: &str,
    index: usize,
) -> Result<Option<RawContext>, FormatError> {
    if !(entry.first_context..entry.first_context + entry.contexts).contains(&index) {
        return Ok(None);
    }
    let layout =
        crate::shard::read_header(&mut &bytes[..], bytes.len() as u64, path, |e| io(path, e))?;
    layout.check(manifest, entry, path)?;
    context_at(manifest, entry, &layout, split, index, |at, len| {
        Ok(usize::try_from(at)
            .ok()
            .and_then(|a| bytes.get(a..a.checked_add(len)?))
            .expect("ranges come from a layout checked against the file")
            .to_vec())
    })
    .map(Some)
}

/// Context `index` (of `split`, in shard `entry` laid out as `layout`), each tensor's sample
/// read by `read_at(offset, len)`.
fn context_at(
    manifest: &Manifest,
    entry: &ShardEntry,
    layout: &crate::shard::ShardLayout,
    split: &str,
    index: usize,
    mut read_at: impl FnMut(u64, usize) -> Result<Vec<u8>, FormatError>,
) -> Result<RawContext, FormatError> {
    let i = index - entry.first_context;
    let mut tensors = Vec::with_capacity(manifest.tensors().len());
    for (spec, extent) in manifest.tensors().iter().zip(&layout.tensors) {
        let size = spec.sample_bytes();
        tensors.push((
            spec.name.clone(),
            read_at(extent.start + (i * size) as u64, size)?,
        ));
    }
    Ok(RawContext {
        split: split.into(),
        index,
        tensors,
    })
}

/// Finds the context with `key` in `split` by reading the shards' `key` tensors. `key` is
/// every shard's first tensor, so only the start of each file is read (of a compressed one,
/// the start of its frame decompressed): looking through a compressed split no longer
/// decompresses it whole.
pub fn find_key(
    dir: &Path,
    manifest: &Manifest,
    split: &str,
    key: i64,
) -> Result<Option<usize>, FormatError> {
    for entry in manifest.shards_of(split) {
        if let Some(index) = find_key_in(dir, manifest, entry, key)? {
            return Ok(Some(index));
        }
    }
    Ok(None)
}

/// [`find_key`] in one shard, `entry`, stored under `dir`: the split position of the context
/// with `key`, if this shard holds it.
fn find_key_in(
    dir: &Path,
    manifest: &Manifest,
    entry: &ShardEntry,
    key: i64,
) -> Result<Option<usize>, FormatError> {
    // A context a later generation hides is not found: its key is elsewhere now.
    Ok(shard_keys(dir, manifest, entry)?
        .iter()
        .enumerate()
        .position(|(pos, &k)| k == key && !entry.is_hidden(pos))
        .map(|pos| entry.first_context + pos))
}

/// The key ids of shard `entry` (stored under `dir`), in its order: its `key` tensor, the
/// first of every shard, so only the start of the file is read.
pub fn shard_keys(
    dir: &Path,
    manifest: &Manifest,
    entry: &ShardEntry,
) -> Result<Vec<i64>, FormatError> {
    let path = dir.join(&entry.file);
    let layout = read_layout(entry, &path)?;
    layout.check(manifest, entry, &path)?;
    let extent = layout.tensor("key").expect("checked against the manifest");
    let file = std::fs::File::open(&path).map_err(|e| io(&path, e))?;
    let start = extent.start as usize;
    let prefix = crate::stored::read_prefix(entry, &file, &path, extent.end as usize)?;
    Ok(prefix[start..]
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

/// A context decoded to source units.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Decoded {
    /// The context key as its user knows it: a number for integer keys (uint64 included); for
    /// string and binary keys its id, which a reader with the key table replaces by the key
    /// (`dsc show` does).
    pub key: Value,
    /// Its split.
    pub split: String,
    /// Its position in the split's compiled order.
    pub index: usize,
    /// Stored steps.
    pub length: usize,
    /// Steps before truncation.
    pub full_length: usize,
    /// Per-row columns, one value per stored step, in source units.
    pub columns: serde_json::Map<String, Value>,
    /// Targets in source units.
    pub targets: serde_json::Map<String, Value>,
    /// Per-context features in source units.
    pub context: serde_json::Map<String, Value>,
}

fn f32_at(bytes: &[u8], i: usize) -> f64 {
    f64::from(f32::from_le_bytes(
        bytes[i * 4..i * 4 + 4].try_into().expect("4 bytes"),
    ))
}

fn i32_at(bytes: &[u8], i: usize) -> i32 {
    i32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().expect("4 bytes"))
}

/// Seconds per tick of a time source type (`Timestamp(Microsecond)`, `Date32`, …); dsc stores
/// times in seconds, so decoding divides by this to give the source's own ticks.
fn seconds_per_tick(source_type: &str) -> f64 {
    match source_type {
        "Timestamp(Second)" => 1.0,
        "Timestamp(Millisecond)" | "Date64" => 1e-3,
        "Timestamp(Microsecond)" => 1e-6,
        "Timestamp(Nanosecond)" => 1e-9,
        "Date32" => 86_400.0,
        _ => 1.0,
    }
}

/// The source value of a stored number or code, as JSON: numbers by inverting the stages (and
/// converting seconds back to the source's ticks), booleans as `true`/`false`, category codes as
/// their vocabulary value, `null` for the null code and `"<unknown>"` for the unknown code.
pub fn decode_value(encoding: &Encoding, source_type: &str, stored: f64) -> Value {
    match encoding {
        Encoding::Numeric { stages, .. } => {
            let x = stages.iter().rev().fold(stored, |v, s| s.invert(v));
            Value::from(x / seconds_per_tick(source_type))
        }
        Encoding::Bool => Value::Bool(stored != 0.0),
        Encoding::Category { vocabulary } => {
            let code = stored as i32;
            if code == CODE_NULL {
                Value::Null
            } else if code < CODE_FIRST {
                Value::String("<unknown>".into())
            } else {
                vocabulary
                    .get((code - CODE_FIRST) as usize)
                    .cloned()
                    .unwrap_or_else(|| Value::String("<unknown>".into()))
            }
        }
        Encoding::Raw
        | Encoding::SubColumn { .. }
        | Encoding::Bits { .. }
        | Encoding::Chars { .. }
        | Encoding::Ngrams { .. } => Value::from(stored),
    }
}

/// One row of an encoded string column back as its source, from the row's stored values
/// `bytes` (`width` of them): bits as the string of `0` and `1`; chars as the string (padding
/// dropped, an unknown character as U+FFFD); n-grams as the set of the grams present, in
/// vocabulary order. A null source row reads back as zeros, an empty string or an empty set.
pub fn decode_encoded(encoding: &Encoding, bytes: &[u8]) -> Value {
    match encoding {
        Encoding::Bits { width } => {
            let row = &bytes[..*width];
            Value::String(
                row.iter()
                    .map(|&b| if b != 0 { '1' } else { '0' })
                    .collect(),
            )
        }
        Encoding::Chars { width, vocabulary } => {
            let codes = (0..*width).map(|i| i32_at(bytes, i));
            let text: String = codes
                .filter(|&c| c != CODE_NULL)
                .map(|c| {
                    usize::try_from(c - CODE_FIRST)
                        .ok()
                        .and_then(|i| vocabulary.get(i))
                        .and_then(|s| s.chars().next())
                        .unwrap_or('\u{FFFD}')
                })
                .collect();
            Value::String(text)
        }
        Encoding::Ngrams { vocabulary, .. } => Value::Array(
            vocabulary
                .iter()
                .zip(bytes)
                .filter(|(_, &b)| b != 0)
                .map(|(g, _)| Value::String(g.clone()))
                .collect(),
        ),
        _ => Value::Null,
    }
}

fn bytes_of<'a>(raw: &'a RawContext, name: &str) -> &'a [u8] {
    &raw.tensors
        .iter()
        .find(|(n, _)| n == name)
        .expect("every manifest tensor was read")
        .1
}

/// Decodes a raw context with the manifest's encodings. With `raw_values`, stored numbers are
/// returned as stored (encoded values and codes) instead.
pub fn decode(manifest: &Manifest, raw: &RawContext, raw_values: bool) -> Decoded {
    let key_bytes = bytes_of(raw, "key");
    let key = i64::from_le_bytes(key_bytes[..8].try_into().expect("8 bytes"));
    // A damaged shard may hold any length: decode at most the padded length.
    let length = (i32_at(bytes_of(raw, "length"), 0).max(0) as usize).min(manifest.max_len());
    let full_length = raw
        .tensors
        .iter()
        .find(|(n, _)| n == "full_length")
        .map_or(length, |(_, b)| i32_at(b, 0).max(0) as usize);
    let key = match crate::keys::key_type(manifest) {
        crate::keys::KeyType::UInt64 => Value::from(key as u64),
        _ => Value::from(key),
    };
    let mut decoded = Decoded {
        key,
        split: raw.split.clone(),
        index: raw.index,
        length,
        full_length,
        columns: serde_json::Map::new(),
        targets: serde_json::Map::new(),
        context: serde_json::Map::new(),
    };
    let value = |spec: &crate::ColumnSpec, stored: f64| {
        if raw_values {
            Value::from(stored)
        } else {
            decode_value(&spec.encoding, &spec.source_type, stored)
        }
    };
    for t in manifest.tensors() {
        let bytes = bytes_of(raw, &t.name);
        match t.role {
            TensorRole::Features => {
                let width = t.sample_shape[1];
                for (f, spec) in t.columns.iter().enumerate() {
                    let values = (0..length)
                        .map(|s| value(spec, f32_at(bytes, s * width + f)))
                        .collect();
                    decoded
                        .columns
                        .insert(spec.name.clone(), Value::Array(values));
                }
            }
            TensorRole::Categorical => {
                let spec = &t.columns[0];
                let values = (0..length)
                    .map(|s| value(spec, f64::from(i32_at(bytes, s))))
                    .collect();
                decoded
                    .columns
                    .insert(spec.name.clone(), Value::Array(values));
            }
            TensorRole::Targets | TensorRole::ContextFeatures => {
                let into = if t.role == TensorRole::Targets {
                    &mut decoded.targets
                } else {
                    &mut decoded.context
                };
                for (j, spec) in t.columns.iter().enumerate() {
                    into.insert(spec.name.clone(), value(spec, f32_at(bytes, j)));
                }
            }
            TensorRole::SubColumn => {
                // The engine's sequence: the stored steps and its padding step.
                let values = (0..=length)
                    .map(|s| Value::from(i32_at(bytes, s)))
                    .collect();
                decoded.columns.insert(t.name.clone(), Value::Array(values));
            }
            TensorRole::ContextCategorical => {
                let spec = &t.columns[0];
                decoded
                    .context
                    .insert(spec.name.clone(), value(spec, f64::from(i32_at(bytes, 0))));
            }
            TensorRole::ContextSubColumn => {
                decoded
                    .context
                    .insert(t.name.clone(), Value::from(i32_at(bytes, 0)));
            }
            TensorRole::Encoded => {
                // One row's values per step: decoded back to the source string (or n-grams).
                let spec = &t.columns[0];
                let row = t.sample_bytes() / manifest.max_len().max(1);
                let values = (0..length)
                    .map(|s| {
                        let bytes = &bytes[s * row..(s + 1) * row];
                        if raw_values {
                            encoded_raw(t.dtype, bytes)
                        } else {
                            decode_encoded(&spec.encoding, bytes)
                        }
                    })
                    .collect();
                decoded
                    .columns
                    .insert(spec.name.clone(), Value::Array(values));
            }
            TensorRole::ContextEncoded => {
                let spec = &t.columns[0];
                let v = if raw_values {
                    encoded_raw(t.dtype, bytes)
                } else {
                    decode_encoded(&spec.encoding, bytes)
                };
                decoded.context.insert(spec.name.clone(), v);
            }
            TensorRole::Key | TensorRole::Length | TensorRole::FullLength => {}
        }
    }
    decoded
}

/// A row of an encoded string column as stored: its u8 or i32 values.
fn encoded_raw(dtype: crate::Dtype, bytes: &[u8]) -> Value {
    match dtype {
        crate::Dtype::U8 => Value::Array(bytes.iter().map(|&b| Value::from(b)).collect()),
        _ => Value::Array(
            (0..bytes.len() / 4)
                .map(|i| Value::from(i32_at(bytes, i)))
                .collect(),
        ),
    }
}
