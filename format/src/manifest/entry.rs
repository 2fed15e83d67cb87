//! One shard file as the manifest records it: where it is, what it holds, how it is stored.

use serde::{Deserialize, Serialize};

/// One shard file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    /// Path relative to the cache directory, `shards/{split}-{NNNNN}.safetensors`, with `.zst`
    /// appended when the shard is stored compressed.
    pub file: String,
    /// The split it belongs to.
    pub split: String,
    /// Its position among the split's shards (0-based, equal to `NNNNN`).
    pub index: usize,
    /// Contexts stored.
    pub contexts: usize,
    /// Position of its first context in the split's compiled order.
    pub first_context: usize,
    /// Size in bytes of the safetensors file (decompressed, when `compressed`).
    pub bytes: u64,
    /// xxh3-64 of the whole safetensors file (decompressed, when `compressed`), 16 hex digits.
    pub xxh3: String,
    /// Set when the shard is stored compressed: `file` then holds the safetensors file that
    /// `bytes` and `xxh3` describe as one frame of this codec (FORMAT.md §3.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compressed: Option<Compressed>,
    /// The shard's key table, where the keys are hashed to their ids (strings, binary):
    /// `shards/{split}-{NNNNN}.keys.safetensors` ([`crate::keys`], FORMAT.md §4.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<KeyTableEntry>,
    /// The generation that wrote it, when later than the first (`dsc append`, `dsc compact`):
    /// its files then live in that generation's folder, `generations/{NNNNN}/` (FORMAT.md §14).
    /// Absent for the first generation's shards, so a cache never appended to keeps its bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u32>,
    /// The rows (offsets within the shard, increasing) that a later generation hides: contexts
    /// whose key an append replaced (`dsc append --existing replace`, FORMAT.md §14, "Removed rows"). The
    /// shard's bytes keep them; no reader of this generation sees them. Absent when none is
    /// hidden, so a cache never appended to keeps its bytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<u32>,
}

/// A shard's key table file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyTableEntry {
    /// Path relative to the cache directory.
    pub file: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// xxh3-64 of the whole file, 16 hex digits.
    pub xxh3: String,
}

/// How a compressed shard is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compressed {
    /// The codec.
    pub codec: Codec,
    /// The level the file was written at (absent in caches compressed before it was
    /// recorded): what `dsc compress --level` compares, to rewrite shards at another level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<i32>,
    /// Size in bytes of the stored (compressed) file.
    pub bytes: u64,
    /// xxh3-64 of the stored (compressed) file, 16 hex digits.
    pub xxh3: String,
}

/// A shard compression codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// Zstandard (RFC 8878), one frame holding the whole safetensors file.
    Zstd,
}

crate::choice!(Codec, "codec", { Zstd => "zstd" });

impl Codec {
    /// The suffix appended to the shard's file name.
    pub fn suffix(self) -> &'static str {
        match self {
            Codec::Zstd => ".zst",
        }
    }
}

impl ShardEntry {
    /// The file name this entry must have: `shards/{split}-{NNNNN}.safetensors` in its
    /// generation's folder ([`ShardEntry::folder`]), plus the codec's suffix when compressed.
    pub fn expected_file(&self) -> String {
        let hot = self.folder_prefix() + &shard_file_name(&self.split, self.index);
        match &self.compressed {
            Some(c) => hot + c.codec.suffix(),
            None => hot,
        }
    }

    /// The file name its key table must have (in the shard's folder).
    pub fn expected_key_file(&self) -> String {
        self.folder_prefix() + &key_table_file_name(&self.split, self.index)
    }

    /// The folder of a later generation's shard, `generations/{NNNNN}-{ID}`, as its file
    /// names it: `None` for the first generation's (at the top of the cache), and for a file
    /// outside any generation's folder (which validation then refuses).
    pub fn folder(&self) -> Option<&str> {
        let g = self.generation.filter(|&g| g > 1)?;
        let folder = self.file.get(..generation_folder_len(g))?;
        is_generation_folder(folder, g).then_some(folder)
    }

    fn folder_prefix(&self) -> String {
        match (self.generation.filter(|&g| g > 1), self.folder()) {
            (None, _) => String::new(),
            (Some(_), Some(f)) => format!("{f}/"),
            // Named nowhere valid: no name matches, so validation names the file.
            (Some(g), None) => format!("{}/{g:05}-?/", crate::GENERATIONS_DIR),
        }
    }

    /// Contexts a reader of this generation sees: those stored less those hidden.
    pub fn live_contexts(&self) -> usize {
        self.contexts - self.removed.len().min(self.contexts)
    }

    /// Whether row `offset` of the shard is hidden by a later generation.
    pub fn is_hidden(&self, offset: usize) -> bool {
        u32::try_from(offset).is_ok_and(|o| self.removed.binary_search(&o).is_ok())
    }

    /// The generation that wrote it: 1 unless a later one did.
    pub fn written_by(&self) -> u32 {
        self.generation.unwrap_or(1)
    }

    /// Bytes the file takes on disk: the compressed size when compressed.
    pub fn stored_bytes(&self) -> u64 {
        self.compressed.as_ref().map_or(self.bytes, |c| c.bytes)
    }
}

/// `shards/{split}-{index:05}.keys.safetensors`: the key table of shard `index` of `split`
/// (`crate::keys`).
pub fn key_table_file_name(split: &str, index: usize) -> String {
    format!("{}/{split}-{index:05}.keys.safetensors", crate::SHARDS_DIR)
}

/// `shards/{split}-{index:05}.safetensors`: the file of shard `index` of `split`.
pub fn shard_file_name(split: &str, index: usize) -> String {
    format!("{}/{split}-{index:05}.safetensors", crate::SHARDS_DIR)
}

/// `generations/{NNNNN}-{ID}`: the folder of generation `n`'s new files, `ID` 16 hex digits
/// of its content (FORMAT.md §14), so that two writers racing to commit generation `n` never
/// write the same file unless they write the same bytes.
pub fn generation_folder(n: u32, id: &str) -> String {
    format!("{}/{n:05}-{id}", crate::GENERATIONS_DIR)
}

/// The length of [`generation_folder`]'s name for generation `n`.
fn generation_folder_len(n: u32) -> usize {
    generation_folder(n, "0123456789abcdef").len()
}

/// Whether `folder` is a folder of generation `n`: `generations/{NNNNN}-{16 hex digits}`.
pub fn is_generation_folder(folder: &str, n: u32) -> bool {
    let Some(rest) = folder.strip_prefix(&format!("{}/{n:05}-", crate::GENERATIONS_DIR)) else {
        return false;
    };
    rest.len() == 16 && rest.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The generation number of an entry of the `generations/` folder named `name`: a manifest
/// `NNNNN.json`, or a folder `NNNNN-ID` (or its staging name); `None` for anything else.
pub fn generation_of(name: &str) -> Option<u32> {
    let digits: &str = name.split(['-', '.']).next()?;
    (digits.len() >= 5 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// `generations/{NNNNN}.json`: the manifest of generation `n > 1` (the first is `manifest.json`).
pub fn generation_manifest_name(n: u32) -> String {
    format!("{}/{n:05}.json", crate::GENERATIONS_DIR)
}
