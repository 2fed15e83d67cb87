//! Shard files: safetensors with the tensors of the manifest, in its order.
//!
//! A shard is a standard safetensors file: an 8-byte little-endian header length `N`, `N` bytes
//! of JSON (padded with spaces so the data starts on a 64-byte boundary), then the tensors' bytes,
//! contiguous, in manifest order. `key` (i64) comes first so that every tensor is aligned to its
//! element size.

use crate::manifest::{Dtype, ShardEntry, TensorSpec};
use crate::{FormatError, Manifest, FORMAT_NAME, FORMAT_VERSION};
use serde_json::{Map, Value};
use std::io::Read;
use std::path::Path;

/// Headers above this size are refused before they are read: a real one is a few KiB.
pub const MAX_HEADER_BYTES: u64 = 16 << 20;
/// Data start alignment.
pub const DATA_ALIGN: usize = 64;

/// `shards/{split}-{index:05}.safetensors` (a manifest names its shards' files; re-exported
/// here beside the rest of the shard layout).
pub use crate::manifest::shard_file_name;

/// Where one tensor's bytes lie in a shard file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorExtent {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Full shape, `[n, ..sample_shape]`.
    pub shape: Vec<usize>,
    /// First byte, from the start of the file.
    pub start: u64,
    /// One past the last byte, from the start of the file.
    pub end: u64,
}

/// The parsed header of a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLayout {
    /// Where the tensor data begins.
    pub data_start: u64,
    /// The tensors in file order.
    pub tensors: Vec<TensorExtent>,
    /// safetensors' `__metadata__`, in file order.
    pub metadata: Vec<(String, String)>,
}

/// Who a shard is, as its header's `__metadata__` says: the same facts as its [`ShardEntry`],
/// so that a shard under another name of its cache (two swapped, say) is caught by its header
/// alone. A shard from another cache at the same place is the checksum's to catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardMeta<'a> {
    /// The split it belongs to.
    pub split: &'a str,
    /// Its index within the split.
    pub index: usize,
    /// Position of its first context in the split's order.
    pub first_context: usize,
    /// The compile profile that wrote it, where not dsc's own (`mostlyai`).
    pub profile: Option<&'a str>,
}

impl<'a> ShardMeta<'a> {
    /// What the shard listed as `entry` says about itself (its profile aside).
    fn of(entry: &'a ShardEntry) -> ShardMeta<'a> {
        ShardMeta {
            split: &entry.split,
            index: entry.index,
            first_context: entry.first_context,
            profile: None,
        }
    }

    /// The `__metadata__` entries of a shard of format `version`, in the order of
    /// `docs/FORMAT.md` §6.1.
    pub(crate) fn entries(&self, version: u32) -> Vec<(String, String)> {
        let mut out = vec![
            ("format", FORMAT_NAME.to_string()),
            ("format_version", version.to_string()),
            ("split", self.split.to_string()),
            ("shard", self.index.to_string()),
            ("first_context", self.first_context.to_string()),
        ];
        if let Some(p) = self.profile {
            out.push(("profile", p.to_string()));
        }
        out.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }
}

/// The header bytes (length prefix included) of a shard holding `n` contexts, and the tensors'
/// extents. The format owns the header: writers say which shard it is, nothing more.
pub fn build_header(tensors: &[TensorSpec], n: usize, meta: &ShardMeta) -> (Vec<u8>, ShardLayout) {
    let entries: Vec<(&str, Dtype, Vec<usize>)> = tensors
        .iter()
        .map(|t| {
            let mut shape = vec![n];
            shape.extend_from_slice(&t.sample_shape);
            (t.name.as_str(), t.dtype, shape)
        })
        .collect();
    header_of(&entries, meta.entries(FORMAT_VERSION))
}

/// The header of a safetensors file holding `tensors` (name, dtype, full shape) contiguously in
/// that order, with `metadata`: shards and key tables (`crate::keys`) alike.
pub(crate) fn header_of(
    tensors: &[(&str, Dtype, Vec<usize>)],
    metadata: Vec<(String, String)>,
) -> (Vec<u8>, ShardLayout) {
    let mut map = Map::new();
    let json_meta: Map<String, Value> = metadata
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    map.insert("__metadata__".into(), Value::Object(json_meta));
    let mut offset = 0u64;
    let mut extents = Vec::with_capacity(tensors.len());
    for (name, dtype, shape) in tensors {
        let len = (shape.iter().product::<usize>() * dtype.size()) as u64;
        let mut entry = Map::new();
        entry.insert("dtype".into(), Value::String(dtype.as_str().into()));
        entry.insert("shape".into(), Value::from(shape.clone()));
        entry.insert(
            "data_offsets".into(),
            Value::from(vec![offset, offset + len]),
        );
        map.insert((*name).to_string(), Value::Object(entry));
        extents.push(TensorExtent {
            name: (*name).to_string(),
            dtype: *dtype,
            shape: shape.clone(),
            start: offset,
            end: offset + len,
        });
        offset += len;
    }
    let mut json = serde_json::to_vec(&Value::Object(map)).expect("header serializes");
    while !(8 + json.len()).is_multiple_of(DATA_ALIGN) {
        json.push(b' ');
    }
    let data_start = (8 + json.len()) as u64;
    for e in &mut extents {
        e.start += data_start;
        e.end += data_start;
    }
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    (
        out,
        ShardLayout {
            data_start,
            tensors: extents,
            metadata,
        },
    )
}

fn header_err(shard: &Path, reason: impl Into<String>) -> FormatError {
    FormatError::ShardHeader {
        shard: shard.into(),
        reason: reason.into(),
    }
}

/// Parses a safetensors header from its JSON bytes, for a file of `file_len` bytes, checking
/// every rule of the format: known dtypes, shapes whose byte size matches the offsets (with
/// overflow checks), offsets contiguous from 0 with no holes, and the data ending exactly at the
/// end of the file.
pub fn parse_header(json: &[u8], file_len: u64, shard: &Path) -> Result<ShardLayout, FormatError> {
    let data_start = 8 + json.len() as u64;
    let value: Value = serde_json::from_slice(json)
        .map_err(|e| header_err(shard, format!("header is not JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(header_err(shard, "header is not a JSON object"));
    };
    let mut tensors = Vec::new();
    let mut metadata = Vec::new();
    for (name, entry) in &map {
        if name == "__metadata__" {
            let pairs = entry.as_object().and_then(|m| {
                m.iter()
                    .map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect::<Option<Vec<_>>>()
            });
            metadata = pairs
                .ok_or_else(|| header_err(shard, "__metadata__ is not an object of strings"))?;
            continue;
        }
        let dtype = match entry.get("dtype").and_then(Value::as_str) {
            Some("F32") => Dtype::F32,
            Some("U8") => Dtype::U8,
            Some("I32") => Dtype::I32,
            Some("I64") => Dtype::I64,
            other => {
                return Err(header_err(
                    shard,
                    format!("tensor {name:?} has dtype {other:?}, dsc stores only F32, I32, I64"),
                ))
            }
        };
        let shape: Vec<usize> = entry
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect())
            .ok_or_else(|| header_err(shard, format!("tensor {name:?} has no valid shape")))?;
        let offsets: Vec<u64> = entry
            .get("data_offsets")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_u64).collect())
            .filter(|o: &Vec<u64>| o.len() == 2)
            .ok_or_else(|| {
                header_err(shard, format!("tensor {name:?} has no valid data_offsets"))
            })?;
        let bytes = shape
            .iter()
            .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                header_err(shard, format!("tensor {name:?} shape {shape:?} overflows"))
            })?;
        if offsets[1] < offsets[0] || offsets[1] - offsets[0] != bytes as u64 {
            return Err(header_err(
                shard,
                format!(
                    "tensor {name:?} shape {shape:?} needs {bytes} bytes, its offsets {:?} span {}",
                    offsets,
                    offsets[1].saturating_sub(offsets[0])
                ),
            ));
        }
        let (Some(start), Some(end)) = (
            data_start.checked_add(offsets[0]),
            data_start.checked_add(offsets[1]),
        ) else {
            return Err(header_err(
                shard,
                format!("tensor {name:?} has offsets {offsets:?} beyond any file"),
            ));
        };
        tensors.push(TensorExtent {
            name: name.clone(),
            dtype,
            shape,
            start,
            end,
        });
    }
    tensors.sort_by_key(|t| t.start);
    let mut expected = data_start;
    for t in &tensors {
        if t.start != expected {
            return Err(header_err(
                shard,
                format!(
                    "tensor {:?} starts at data offset {}, expected {} (no holes or overlaps allowed)",
                    t.name,
                    t.start - data_start,
                    expected - data_start
                ),
            ));
        }
        expected = t.end;
    }
    if expected != file_len {
        return Err(header_err(
            shard,
            format!("tensor data ends at byte {expected}, the file has {file_len} bytes"),
        ));
    }
    Ok(ShardLayout {
        data_start,
        tensors,
        metadata,
    })
}

/// Reads and parses the header of the shard at `path` without reading its data.
pub fn read_layout(path: &Path) -> Result<ShardLayout, FormatError> {
    let mut file = std::fs::File::open(path).map_err(|e| FormatError::io(path, e))?;
    let file_len = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
    read_header(&mut file, file_len, path, |e| FormatError::io(path, e))
}

/// Reads and parses a safetensors header from the start of `reader`, a file of `file_len`
/// bytes; `read_err` turns a read failure into the caller's error (I/O, or a decompression
/// failure for a compressed shard).
pub(crate) fn read_header(
    reader: &mut impl Read,
    file_len: u64,
    path: &Path,
    read_err: impl Fn(std::io::Error) -> FormatError,
) -> Result<ShardLayout, FormatError> {
    let mut len_bytes = [0u8; 8];
    if file_len < 8 {
        return Err(header_err(
            path,
            format!("file has {file_len} bytes, too short for a header"),
        ));
    }
    reader.read_exact(&mut len_bytes).map_err(&read_err)?;
    let n = u64::from_le_bytes(len_bytes);
    if n > MAX_HEADER_BYTES || n > file_len - 8 {
        return Err(header_err(
            path,
            format!("header length {n} is impossible for a {file_len}-byte file"),
        ));
    }
    let mut json = vec![0u8; n as usize];
    reader.read_exact(&mut json).map_err(&read_err)?;
    parse_header(&json, file_len, path)
}

impl ShardLayout {
    /// Checks that the shard is the one `entry` of `manifest` lists: its `__metadata__` names
    /// the same format, version (the manifest's, checked to be this build's), split, index and
    /// first context, its data starts aligned, and it
    /// holds exactly the manifest's tensors with `entry.contexts` samples each, in manifest order.
    pub fn check(
        &self,
        manifest: &Manifest,
        entry: &ShardEntry,
        shard: &Path,
    ) -> Result<(), FormatError> {
        self.check_metadata(entry, shard, manifest.format_version())?;
        if !self.data_start.is_multiple_of(DATA_ALIGN as u64) {
            return Err(header_err(
                shard,
                format!(
                    "tensor data starts at byte {}, not on a {DATA_ALIGN}-byte boundary",
                    self.data_start
                ),
            ));
        }
        let tensors = manifest.tensors();
        let n = entry.contexts;
        if self.tensors.len() != tensors.len() {
            let found: Vec<&str> = self.tensors.iter().map(|t| t.name.as_str()).collect();
            let expected: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
            return Err(header_err(
                shard,
                format!("holds tensors {found:?}, the manifest lists {expected:?}"),
            ));
        }
        for (found, spec) in self.tensors.iter().zip(tensors) {
            let mut shape = vec![n];
            shape.extend_from_slice(&spec.sample_shape);
            if found.name != spec.name || found.dtype != spec.dtype || found.shape != shape {
                return Err(header_err(
                    shard,
                    format!(
                        "tensor {:?} {:?} {:?} where the manifest expects {:?} {:?} {:?}",
                        found.name, found.dtype, found.shape, spec.name, spec.dtype, shape
                    ),
                ));
            }
        }
        Ok(())
    }

    fn check_metadata(
        &self,
        entry: &ShardEntry,
        shard: &Path,
        version: u32,
    ) -> Result<(), FormatError> {
        for (key, want) in ShardMeta::of(entry).entries(version) {
            let found = self
                .metadata
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.as_str());
            if found != Some(want.as_str()) {
                let found = found.map_or("missing".to_string(), |v| format!("{v:?}"));
                return Err(header_err(
                    shard,
                    format!(
                        "__metadata__ {key:?} is {found}, the manifest's entry for this file \
                         says {want:?} (a shard moved from another place?)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The extent of tensor `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorExtent> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::TensorRole;

    fn specs() -> Vec<TensorSpec> {
        let t = |name: &str, dtype, role, shape: Vec<usize>| TensorSpec {
            name: name.into(),
            dtype,
            role,
            sample_shape: shape,
            columns: vec![],
        };
        vec![
            t("key", Dtype::I64, TensorRole::Key, vec![]),
            t("x", Dtype::F32, TensorRole::Features, vec![3, 2]),
            t("length", Dtype::I32, TensorRole::Length, vec![]),
        ]
    }

    const META: ShardMeta = ShardMeta {
        split: "train",
        index: 0,
        first_context: 0,
        profile: None,
    };

    fn file_bytes(n: usize) -> Vec<u8> {
        let (mut bytes, layout) = build_header(&specs(), n, &META);
        bytes.resize(layout.tensors.last().unwrap().end as usize, 0);
        bytes
    }

    /// A manifest listing one train shard of `n` contexts with the tensors of `specs()`.
    fn manifest(n: usize) -> (Manifest, ShardEntry) {
        let entry = ShardEntry {
            file: shard_file_name("train", 0),
            split: "train".into(),
            index: 0,
            contexts: n,
            first_context: 0,
            bytes: 0,
            xxh3: String::new(),
            compressed: None,
            keys: None,
            generation: None,
            removed: Vec::new(),
        };
        let mut tensors = specs();
        tensors[1].columns = (0..2)
            .map(|i| crate::ColumnSpec {
                name: format!("f{i}"),
                source: crate::ColumnSource::Rows,
                source_type: "Float64".into(),
                encoding: crate::Encoding::Numeric {
                    stages: vec![],
                    fill: None,
                },
            })
            .collect();
        for t in [0, 2] {
            tensors[t].columns = vec![crate::ColumnSpec {
                name: tensors[t].name.clone(),
                source: crate::ColumnSource::Rows,
                source_type: "Int64".into(),
                encoding: crate::Encoding::Raw,
            }];
        }
        let inputs = crate::manifest::Inputs {
            fingerprint: "0".repeat(16),
            files: vec![],
        };
        let m = Manifest::builder(
            env!("CARGO_PKG_VERSION"),
            3,
            tensors,
            inputs,
            crate::CompileSpec::new(vec![], "k"),
        )
        .split("train", 0, vec![entry.clone()])
        .build()
        .unwrap();
        (m, entry)
    }

    fn parse(bytes: &[u8]) -> Result<ShardLayout, FormatError> {
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        parse_header(&bytes[8..8 + n], bytes.len() as u64, Path::new("s"))
    }

    #[test]
    fn header_round_trips_and_is_aligned() {
        let bytes = file_bytes(5);
        let layout = parse(&bytes).unwrap();
        assert_eq!(layout.data_start as usize % DATA_ALIGN, 0);
        let (m, entry) = manifest(5);
        layout.check(&m, &entry, Path::new("s")).unwrap();
        assert_eq!(layout.tensor("x").unwrap().shape, vec![5, 3, 2]);
        let (m4, entry4) = manifest(4);
        assert!(matches!(
            layout.check(&m4, &entry4, Path::new("s")),
            Err(FormatError::ShardHeader { .. })
        ));
    }

    #[test]
    fn a_header_naming_another_shard_is_refused() {
        let (m, entry) = manifest(5);
        for other in [
            ShardMeta {
                split: "val",
                ..META
            },
            ShardMeta { index: 1, ..META },
            ShardMeta {
                first_context: 7,
                ..META
            },
        ] {
            let (mut bytes, layout) = build_header(&specs(), 5, &other);
            bytes.resize(layout.tensors.last().unwrap().end as usize, 0);
            let err = parse(&bytes).unwrap().check(&m, &entry, Path::new("s"));
            let msg = err.unwrap_err().to_string();
            assert!(msg.contains("__metadata__"), "{msg}");
        }
    }

    #[test]
    fn truncated_and_extended_files_are_rejected() {
        let bytes = file_bytes(5);
        assert!(matches!(
            parse(&bytes[..bytes.len() - 1]),
            Err(FormatError::ShardHeader { .. })
        ));
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            parse(&longer),
            Err(FormatError::ShardHeader { .. })
        ));
    }

    #[test]
    fn bad_offsets_and_dtypes_are_rejected() {
        let bad = |json: &str, len: u64| parse_header(json.as_bytes(), len, Path::new("s"));
        let hole = r#"{"a":{"dtype":"I32","shape":[1],"data_offsets":[4,8]}}"#;
        assert!(matches!(
            bad(hole, 8 + hole.len() as u64 + 8),
            Err(FormatError::ShardHeader { .. })
        ));
        let size = r#"{"a":{"dtype":"I32","shape":[2],"data_offsets":[0,4]}}"#;
        assert!(bad(size, 8 + size.len() as u64 + 4).is_err());
        let dtype = r#"{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}"#;
        assert!(bad(dtype, 8 + dtype.len() as u64 + 4).is_err());
        let overflow =
            r#"{"a":{"dtype":"I64","shape":[4611686018427387904,8],"data_offsets":[0,4]}}"#;
        assert!(bad(overflow, 8 + overflow.len() as u64 + 4).is_err());
        assert!(bad("[1,2]", 13).is_err());
        assert!(bad("{not json", 17).is_err());
    }
}
