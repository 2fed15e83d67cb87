//! Assembling a compile's manifest from what its writers wrote.

use super::*;

/// Assembles the manifest of a compile: the writers give what they wrote, the builder derives
/// every count that follows from it (contexts and shards per split) and validates the whole.
#[derive(Debug, Clone)]
pub struct ManifestBuilder {
    pub(super) dsc_version: String,
    pub(super) max_len: usize,
    pub(super) tensors: Vec<TensorSpec>,
    pub(super) inputs: Inputs,
    pub(super) spec: CompileSpec,
    pub(super) splits: Vec<(String, u64)>,
    pub(super) shards: Vec<ShardEntry>,
    pub(super) summary: CompileSummary,
}

impl ManifestBuilder {
    /// Adds a split (after those added before; `train` first) with the source rows it stores
    /// and its shards in index order.
    pub fn split(mut self, name: &str, rows_stored: u64, shards: Vec<ShardEntry>) -> Self {
        self.splits.push((name.to_string(), rows_stored));
        self.shards.extend(shards);
        self
    }

    /// The compile's counts.
    pub fn summary(mut self, summary: CompileSummary) -> Self {
        self.summary = summary;
        self
    }

    /// The manifest, if it satisfies every rule of the format.
    pub fn build(self) -> Result<Manifest, ManifestProblem> {
        let splits = self
            .splits
            .into_iter()
            .map(|(name, rows_stored)| {
                let mine = || self.shards.iter().filter(|s| s.split == name);
                SplitInfo {
                    contexts: mine().map(|s| s.contexts).sum(),
                    removed: 0,
                    shards: mine().count(),
                    rows_stored,
                    name,
                }
            })
            .collect();
        Manifest::try_from(ManifestFields {
            format: FORMAT_NAME.into(),
            format_version: FORMAT_VERSION,
            dsc_version: self.dsc_version,
            max_len: self.max_len,
            splits,
            tensors: self.tensors,
            shards: self.shards,
            inputs: self.inputs,
            summary: self.summary,
            spec: self.spec,
            generation: None,
        })
    }
}
