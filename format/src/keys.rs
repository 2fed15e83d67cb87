//! Keys that are not small integers: strings, binary identifiers (UUIDs) and 64-bit unsigned
//! integers.
//!
//! Everything that orders, splits, groups or finds a context works on one `i64` per context,
//! the **key id**, which the `key` tensor stores:
//!
//! - a signed integer key (or an unsigned one below 64 bits) is its own id, as it always was;
//! - a `uint64` key is its 64 bits read as an `i64` (two's complement): the same bits, so a
//!   reader that knows the key's `source_type` (`UInt64`) views the tensor as `uint64`;
//! - a string key's id is the xxh3-64 (seed 0) of its UTF-8 bytes, read as an `i64`; a binary
//!   key is first spelled as text ([`uuid_text`] for 16 bytes, lowercase hex otherwise).
//!
//! A hashed id is not the key, so every shard of such a cache has a **key table** beside it
//! (`shards/{split}-{NNNNN}.keys.safetensors`): row `i` is the original key of the shard's
//! context `i`. Two keys of one input with the same id are an error of the compile, never one
//! context (FORMAT.md §4.3).

use crate::manifest::Dtype;
use crate::shard::{header_of, parse_header, ShardMeta};
use crate::{FormatError, FORMAT_VERSION};
use std::path::Path;

/// How a cache's keys become ids, from the key column's `source_type` in the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    /// A signed integer (or an unsigned one below 64 bits): the id is the key.
    Int,
    /// `uint64`: the id holds the same 64 bits.
    UInt64,
    /// A string: the id is the hash of its UTF-8 bytes.
    Text,
    /// 16 bytes (a UUID): spelled `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, then hashed.
    Uuid,
    /// Other binary: spelled as lowercase hex, then hashed.
    Bytes,
}

impl KeyType {
    /// The key type of a key column whose manifest `source_type` is `source_type`.
    pub fn of_source_type(source_type: &str) -> KeyType {
        match source_type {
            "UInt64" => KeyType::UInt64,
            "Utf8" => KeyType::Text,
            "FixedSizeBinary(16)" => KeyType::Uuid,
            t if t == "Binary" || t.starts_with("FixedSizeBinary(") => KeyType::Bytes,
            _ => KeyType::Int,
        }
    }

    /// Whether ids are hashes, so that the shards carry key tables.
    pub fn is_hashed(self) -> bool {
        matches!(self, KeyType::Text | KeyType::Uuid | KeyType::Bytes)
    }

    /// The id of a key as a user writes it (`dsc show --key`, a key file's line): an integer
    /// for integer keys, the string itself, a UUID with or without dashes, hex for binary.
    pub fn id_of(self, given: &str) -> Result<i64, String> {
        let key = self.canonical(given)?;
        Ok(match self {
            KeyType::Int => key.parse::<i64>().expect("canonical"),
            KeyType::UInt64 => key.parse::<u64>().expect("canonical") as i64,
            KeyType::Text | KeyType::Uuid | KeyType::Bytes => text_id(&key),
        })
    }

    /// A key as a user writes it, spelled as the compile spells it (`007` → `7`, a UUID in
    /// lowercase with dashes): two spellings of one key give one text.
    pub fn canonical(self, given: &str) -> Result<String, String> {
        match self {
            KeyType::Int => given
                .trim()
                .parse::<i64>()
                .map(|k| k.to_string())
                .map_err(|_| format!("{given:?} is not an integer key (the keys are integers)")),
            KeyType::UInt64 => given
                .trim()
                .parse::<u64>()
                .map(|k| k.to_string())
                .map_err(|_| format!("{given:?} is not a uint64 key (the keys are uint64)")),
            KeyType::Text => Ok(given.to_string()),
            KeyType::Uuid => parse_uuid(given).map(|b| uuid_text(&b)),
            KeyType::Bytes => parse_hex(given).map(|b| hex_text(&b)),
        }
    }

    /// An integer key as its user knows it, from its id (`None` for hashed ids: their table
    /// holds them).
    pub fn integer_of(self, id: i64) -> Option<String> {
        match self {
            KeyType::Int => Some(id.to_string()),
            KeyType::UInt64 => Some((id as u64).to_string()),
            _ => None,
        }
    }
}

/// How the keys of the cache `manifest` describes became ids: from its `key` tensor's column.
pub fn key_type(manifest: &crate::Manifest) -> KeyType {
    manifest
        .tensors()
        .iter()
        .find(|t| t.role == crate::TensorRole::Key)
        .and_then(|t| t.columns.first())
        .map_or(KeyType::Int, |c| KeyType::of_source_type(&c.source_type))
}

/// The key of context `index` of the shard `entry` (a split position), read from its key table
/// in the cache folder `dir`; `None` when the shard has none (integer keys).
pub fn key_text_at(
    dir: &Path,
    entry: &crate::ShardEntry,
    index: usize,
) -> Result<Option<String>, FormatError> {
    let Some(table) = &entry.keys else {
        return Ok(None);
    };
    let path = dir.join(&table.file);
    let bytes = std::fs::read(&path).map_err(|e| FormatError::io(&path, e))?;
    crate::checksum::check(crate::checksum::xxh3_hex(&bytes), &table.xxh3, &path)?;
    let mut read = read_key_table(&bytes, &path)?;
    let i = index
        .checked_sub(entry.first_context)
        .filter(|&i| i < read.texts.len());
    Ok(i.map(|i| read.texts.swap_remove(i)))
}

/// The id of a string key: the xxh3-64 of its UTF-8 bytes, as an `i64`.
pub fn text_id(text: &str) -> i64 {
    bytes_id(text.as_bytes())
}

/// [`text_id`] of a key's UTF-8 bytes.
pub fn bytes_id(bytes: &[u8]) -> i64 {
    xxhash_rust::xxh3::xxh3_64(bytes) as i64
}

/// 16 bytes spelled as a UUID: lowercase hex in groups of 8-4-4-4-12.
pub fn uuid_text(bytes: &[u8; 16]) -> String {
    let mut s = String::with_capacity(36);
    write_uuid(bytes, &mut s);
    s
}

/// Appends [`uuid_text`] of `bytes` to `out` (a reader reuses one buffer for every row).
pub fn write_uuid(bytes: &[u8; 16], out: &mut String) {
    for (i, chunk) in [
        &bytes[..4],
        &bytes[4..6],
        &bytes[6..8],
        &bytes[8..10],
        &bytes[10..],
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            out.push('-');
        }
        write_hex(chunk, out);
    }
}

/// Bytes spelled as lowercase hex.
pub fn hex_text(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    write_hex(bytes, &mut s);
    s
}

/// Appends [`hex_text`] of `bytes` to `out`.
pub fn write_hex(bytes: &[u8], out: &mut String) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
}

fn parse_hex(given: &str) -> Result<Vec<u8>, String> {
    let t = given.trim();
    let t = t.strip_prefix("0x").unwrap_or(t);
    let digits: Vec<u8> = t
        .chars()
        .map(|c| c.to_digit(16).map(|d| d as u8))
        .collect::<Option<_>>()
        .filter(|d: &Vec<u8>| d.len().is_multiple_of(2))
        .ok_or_else(|| format!("{given:?} is not hex bytes (the keys are binary)"))?;
    Ok(digits.chunks(2).map(|p| p[0] << 4 | p[1]).collect())
}

fn parse_uuid(given: &str) -> Result<[u8; 16], String> {
    let t = given.trim();
    let t = t.strip_prefix("urn:uuid:").unwrap_or(t);
    let t = t.trim_start_matches('{').trim_end_matches('}');
    let hex: String = t.chars().filter(|&c| c != '-').collect();
    parse_hex(&hex)
        .ok()
        .and_then(|b| <[u8; 16]>::try_from(b).ok())
        .ok_or_else(|| format!("{given:?} is not a UUID (the keys are 16-byte UUIDs)"))
}

/// `shards/{split}-{index:05}.keys.safetensors`: the key table of shard `index` of `split`
/// (beside the shard file names, in the manifest).
pub use crate::manifest::key_table_file_name;

/// The bytes of the key table of the shard `meta` names, whose contexts have the ids `ids` and
/// the keys `texts` (as [`KeyType::id_of`] spells them): a safetensors file holding `key` (i64
/// `[n]`, the shard's `key` tensor again), `offsets` (i64 `[n + 1]`) and `text` (u8 `[m]`, the
/// keys' UTF-8 bytes, key `i` at `offsets[i]..offsets[i + 1]`), with the shard's metadata.
pub fn key_table_bytes(ids: &[i64], texts: &[&str], meta: &ShardMeta) -> Vec<u8> {
    assert_eq!(ids.len(), texts.len(), "one key per id");
    let n = ids.len();
    let m: usize = texts.iter().map(|t| t.len()).sum();
    let mut metadata = meta.entries(FORMAT_VERSION);
    metadata.push(("table".into(), "keys".into()));
    let (mut out, _) = header_of(
        &[
            ("key", Dtype::I64, vec![n]),
            ("offsets", Dtype::I64, vec![n + 1]),
            ("text", Dtype::U8, vec![m]),
        ],
        metadata,
    );
    out.reserve(n * 16 + 8 + m);
    ids.iter()
        .for_each(|k| out.extend_from_slice(&k.to_le_bytes()));
    let mut offset = 0i64;
    out.extend_from_slice(&offset.to_le_bytes());
    for t in texts {
        offset += t.len() as i64;
        out.extend_from_slice(&offset.to_le_bytes());
    }
    texts
        .iter()
        .for_each(|t| out.extend_from_slice(t.as_bytes()));
    out
}

/// One shard's key table, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTable {
    /// The contexts' ids, in shard order.
    pub ids: Vec<i64>,
    /// Their keys, as the compile spelled them.
    pub texts: Vec<String>,
}

/// Reads the key table `bytes` (the file at `path`, for messages), checking its layout.
pub fn read_key_table(bytes: &[u8], path: &Path) -> Result<KeyTable, FormatError> {
    let bad = |reason: String| FormatError::ShardHeader {
        shard: path.into(),
        reason,
    };
    let head = bytes
        .get(..8)
        .ok_or_else(|| bad("too short for a header".into()))?;
    let len = u64::from_le_bytes(head.try_into().expect("8 bytes")) as usize;
    let json = bytes
        .get(8..8 + len)
        .ok_or_else(|| bad(format!("header length {len} is past the file's end")))?;
    let layout = parse_header(json, bytes.len() as u64, path)?;
    let slice = |name: &str, dtype: Dtype| {
        let t = layout
            .tensor(name)
            .filter(|t| t.dtype == dtype && t.shape.len() == 1)
            .ok_or_else(|| {
                bad(format!(
                    "a key table holds a 1-d {} tensor {name:?}",
                    dtype.as_str()
                ))
            })?;
        Ok::<_, FormatError>((&bytes[t.start as usize..t.end as usize], t.shape[0]))
    };
    let i64s = |b: &[u8]| -> Vec<i64> {
        b.chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect()
    };
    let (ids, n) = slice("key", Dtype::I64)?;
    let (offsets, n1) = slice("offsets", Dtype::I64)?;
    let (text, m) = slice("text", Dtype::U8)?;
    if n1 != n + 1 {
        return Err(bad(format!("{n} keys need {} offsets, it has {n1}", n + 1)));
    }
    let offsets = i64s(offsets);
    let mut texts = Vec::with_capacity(n);
    for (i, w) in offsets.windows(2).enumerate() {
        let (a, b) = (w[0], w[1]);
        if a < 0 || b < a || b as usize > m || (i == 0 && a != 0) {
            return Err(bad(format!(
                "key {i}'s offsets {a}..{b} are outside its {m} bytes"
            )));
        }
        let s = std::str::from_utf8(&text[a as usize..b as usize])
            .map_err(|_| bad(format!("key {i} is not UTF-8")))?;
        texts.push(s.to_string());
    }
    Ok(KeyTable {
        ids: i64s(ids),
        texts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_the_keys_as_users_write_them() {
        // Integer keys are their own ids; uint64 keep their bits.
        assert_eq!(KeyType::Int.id_of("-42"), Ok(-42));
        assert_eq!(KeyType::UInt64.id_of("18446744073709551615"), Ok(-1));
        assert_eq!(
            KeyType::UInt64.integer_of(-1).unwrap(),
            "18446744073709551615"
        );
        // Strings hash their bytes: the same string, the same id, in any cache.
        assert_eq!(KeyType::Text.id_of("cust-001"), Ok(text_id("cust-001")));
        assert_ne!(text_id("cust-001"), text_id("cust-002"));
        // A UUID in any usual spelling is one key.
        let canonical = "1b4e28ba-2fa1-11d2-883f-0016d3cca427";
        let id = text_id(canonical);
        for given in [
            canonical,
            "1B4E28BA2FA111D2883F0016D3CCA427",
            "{1b4e28ba-2fa1-11d2-883f-0016d3cca427}",
            "urn:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427",
        ] {
            assert_eq!(KeyType::Uuid.id_of(given), Ok(id), "{given}");
        }
        assert!(KeyType::Uuid.id_of("1b4e28ba").is_err());
        assert_eq!(KeyType::Bytes.id_of("0xBEEF"), Ok(text_id("beef")));
        assert!(KeyType::Int.id_of("abc").unwrap_err().contains("integer"));
        assert_eq!(
            KeyType::of_source_type("FixedSizeBinary(16)"),
            KeyType::Uuid
        );
        assert_eq!(KeyType::of_source_type("Int32"), KeyType::Int);
        // The id of the empty string is fixed by xxh3 (FORMAT.md gives it as a check value).
        assert_eq!(text_id(""), 0x2d06800538d394c2_u64 as i64);
    }

    #[test]
    fn a_key_table_round_trips_and_checks_its_layout() {
        let meta = ShardMeta {
            split: "train",
            index: 3,
            first_context: 40,
            profile: None,
        };
        let texts = ["a", "", "ключ", "cust-0042"];
        let ids: Vec<i64> = texts.iter().map(|t| text_id(t)).collect();
        let bytes = key_table_bytes(&ids, &texts, &meta);
        let table = read_key_table(&bytes, Path::new("t.keys.safetensors")).unwrap();
        assert_eq!(table.ids, ids);
        assert_eq!(table.texts, texts);
        // Its data starts aligned, as every safetensors file dsc writes.
        let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!((8 + len) % crate::shard::DATA_ALIGN, 0);
        // A cut file is refused, not read short.
        let err = read_key_table(&bytes[..bytes.len() - 1], Path::new("t")).unwrap_err();
        assert!(err.to_string().contains("ends at byte"), "{err}");
    }
}
