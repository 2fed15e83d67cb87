//! A cache's identities: hashes over its manifest's list of shards, which name the bytes a
//! cache holds whatever directory or bucket it is in. Apart from `manifest/` so that the manifest
//! stays below the hashing (`checksum`) and the errors (`error`) that carry its problems.

use crate::checksum::Hasher;
use crate::manifest::{Manifest, ShardEntry};

impl Manifest {
    /// An identity of the cache's data: a hash over every shard's name (as stored hot) and
    /// checksum (of the safetensors bytes), in order. Two caches with the same identity hold the
    /// same bytes in the same shards, so the same loader order, whether stored hot or
    /// compressed (`dsc compress` keeps it); a recompile with another seed, shard size or input
    /// changes it (unlike `inputs.fingerprint`, which names the input files alone).
    pub fn content_id(&self) -> String {
        self.id_over(|s| match s.compressed {
            // `NAME.safetensors.zst` holds `NAME.safetensors`.
            Some(_) => s
                .file
                .rsplit_once('.')
                .map_or(s.file.as_str(), |(hot, _)| hot),
            None => &s.file,
        })
    }

    /// [`Manifest::content_id`] over the names as stored, compressed ones with their codec's
    /// extension: what tells a compressed copy from its hot cache (a fetch folder holds one
    /// form), and the content id states and checkpoints of a compressed cache recorded before
    /// the content id left storage out (still accepted on resume).
    pub fn stored_id(&self) -> String {
        self.id_over(|s| s.file.as_str())
    }

    fn id_over(&self, name: impl Fn(&ShardEntry) -> &str) -> String {
        let mut h = Hasher::new();
        for s in self.shards() {
            h.update(format!("{}\0{}\n", name(s), s.xxh3).as_bytes());
            // A generation that hides rows holds other data than one that does not; a shard
            // hiding none hashes as before, so content ids of existing caches stay.
            if !s.removed.is_empty() {
                let rows: Vec<String> = s.removed.iter().map(u32::to_string).collect();
                h.update(format!("removed\0{}\n", rows.join(",")).as_bytes());
            }
        }
        h.hex()
    }
}
