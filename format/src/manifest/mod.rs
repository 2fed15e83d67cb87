//! `manifest.json`: what a cache holds and how it was made. Written last; its presence makes a
//! directory a cache.

use crate::spec::CompileSpec;
use crate::{FORMAT_NAME, FORMAT_VERSION};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

mod builder;
mod entry;
mod problem;
mod tensor;

pub use builder::ManifestBuilder;
pub use entry::*;
pub use problem::*;
pub use tensor::*;

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One split.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitInfo {
    /// `train` or `val`.
    pub name: String,
    /// Contexts in the split: those its shards store less those a later generation hides.
    pub contexts: usize,
    /// Contexts its shards store that a later generation hides (FORMAT.md §14, "Removed rows"). Absent when
    /// none is.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub removed: usize,
    /// Source rows stored (after truncation).
    pub rows_stored: u64,
    /// Shards holding the split.
    pub shards: usize,
}

/// One input file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    /// The path as given to the compiler.
    pub path: String,
    /// What it was used as: `rows`, `context` or `join`.
    pub role: String,
    /// Size in bytes.
    pub bytes: u64,
    /// xxh3-64 of its content.
    pub xxh3: String,
}

/// The inputs and their combined fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inputs {
    /// xxh3-64 over every input's role, size and hash, in order: equal fingerprints mean equal
    /// inputs.
    pub fingerprint: String,
    /// The files, in the order read.
    pub files: Vec<InputFile>,
}

/// Counts reported by the compile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CompileSummary {
    /// Rows read from the rows files.
    pub rows_read: u64,
    /// Rows stored in shards (after truncation and dropping).
    pub rows_stored: u64,
    /// Contexts stored.
    pub contexts: usize,
    /// Contexts cut to `max_len`.
    pub contexts_truncated: usize,
    /// Contexts present in rows but not in the context table, dropped by policy.
    pub contexts_without_context_row: usize,
    /// Rows belonging to those contexts.
    pub rows_without_context_row: u64,
    /// Context-table keys with no rows.
    pub contexts_without_rows: usize,
    /// Of those, how many were kept as empty sequences.
    pub empty_contexts_kept: usize,
    /// Null/NaN/inf values replaced by the NaN policy.
    pub values_filled: u64,
}

/// The manifest of a cache. Only ever holds a manifest that passed every rule of the format:
/// it is built by [`ManifestBuilder::build`] (writers) or parsed by [`Manifest::from_json`]
/// (readers), both of which validate, and its fields are read through accessors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "ManifestFields")]
pub struct Manifest {
    format: String,
    format_version: u32,
    dsc_version: String,
    max_len: usize,
    splits: Vec<SplitInfo>,
    tensors: Vec<TensorSpec>,
    shards: Vec<ShardEntry>,
    inputs: Inputs,
    summary: CompileSummary,
    spec: CompileSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    generation: Option<Generation>,
}

/// What a generation after the first adds to the one before it (`dsc append`, `dsc compact`):
/// its number, the content id of the generation it extends, and what its own compile read and
/// counted. The manifest's other fields describe the whole generation (every live shard).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generation {
    /// Its number: 2 for the first append.
    pub number: u32,
    /// `content_id` of the generation it was made from.
    pub parent: String,
    /// How it was made: `append` (the parent's shards and new ones) or `compact` (the live
    /// contexts rewritten as new shards only).
    pub kind: String,
    /// The folder of its own files (`generations/{NNNNN}-{ID}`): its new shards and its
    /// statistics.
    pub folder: String,
    /// The inputs its own compile read.
    pub inputs: Inputs,
    /// Its own compile's counts.
    pub summary: CompileSummary,
    /// Contexts of earlier generations it hides, per split: those whose keys its data replaced
    /// (`dsc append --existing replace`). Absent when none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub removed: BTreeMap<String, usize>,
    /// A compaction's rows files, each with the key ids whose rows it left out (keys a later
    /// generation had replaced, their rows there no longer live): what a later compaction of
    /// these inputs leaves out too. Absent when none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub skipped: BTreeMap<String, Vec<i64>>,
}

/// The JSON shape of a manifest, before validation: the only way from it to a [`Manifest`] is
/// `TryFrom`, so no unchecked manifest exists (the reader in `manifest_file.rs` only parses
/// JSON into it and converts).
#[derive(Deserialize)]
pub(crate) struct ManifestFields {
    format: String,
    format_version: u32,
    dsc_version: String,
    max_len: usize,
    splits: Vec<SplitInfo>,
    tensors: Vec<TensorSpec>,
    shards: Vec<ShardEntry>,
    inputs: Inputs,
    summary: CompileSummary,
    spec: CompileSpec,
    #[serde(default)]
    generation: Option<Generation>,
}

impl TryFrom<ManifestFields> for Manifest {
    type Error = ManifestProblem;

    fn try_from(f: ManifestFields) -> Result<Manifest, ManifestProblem> {
        let manifest = Manifest {
            format: f.format,
            format_version: f.format_version,
            dsc_version: f.dsc_version,
            max_len: f.max_len,
            splits: f.splits,
            tensors: f.tensors,
            shards: f.shards,
            inputs: f.inputs,
            summary: f.summary,
            spec: f.spec,
            generation: f.generation,
        };
        manifest.validate()?;
        Ok(manifest)
    }
}

/// Format versions this build reads.
pub const SUPPORTED_VERSIONS: &[u32] = &[1, 2];

impl Manifest {
    /// Starts a manifest for the writers: the dsc release writing it, tensors padded to
    /// `max_len`, the inputs they were compiled from and the resolved spec. Splits are added with their shards; [`build`]
    /// derives the counts and validates.
    ///
    /// [`build`]: ManifestBuilder::build
    pub fn builder(
        dsc_version: &str,
        max_len: usize,
        tensors: Vec<TensorSpec>,
        inputs: Inputs,
        spec: CompileSpec,
    ) -> ManifestBuilder {
        ManifestBuilder {
            dsc_version: dsc_version.into(),
            max_len,
            tensors,
            inputs,
            spec,
            splits: Vec::new(),
            shards: Vec::new(),
            summary: CompileSummary::default(),
        }
    }

    /// The manifest as pretty JSON with a trailing newline.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("manifest serializes");
        out.push(b'\n');
        out
    }

    /// Checks the manifest's internal consistency: unique tensor names, shapes that match their
    /// roles and `max_len`, shard names and indices, and split counts equal to their shards' sums.
    fn validate(&self) -> Result<(), ManifestProblem> {
        if self.format != FORMAT_NAME || !SUPPORTED_VERSIONS.contains(&self.format_version) {
            return Err(ManifestProblem::NotThisFormat {
                found: Some(self.format.clone()),
                version: self.format_version,
            });
        }
        let mut names = BTreeSet::new();
        for t in &self.tensors {
            if !names.insert(t.name.as_str()) {
                return Err(ManifestProblem::DuplicateTensor {
                    tensor: t.name.clone(),
                });
            }
            self.validate_tensor(t)?;
        }
        for required in ["key", "length"] {
            if !names.contains(required) {
                return Err(ManifestProblem::MissingTensor { tensor: required });
            }
        }
        let keys: Vec<&TensorSpec> = self
            .tensors
            .iter()
            .filter(|t| t.role == TensorRole::Key)
            .collect();
        let first = &self.tensors[0];
        if keys.len() != 1 || first.name != "key" || first.role != TensorRole::Key {
            return Err(ManifestProblem::KeyNotFirst {
                first: format!("{:?} ({:?})", first.name, first.role),
                keys: keys.len(),
            });
        }
        let mut split_names = BTreeSet::new();
        for split in &self.splits {
            if !split_names.insert(split.name.as_str()) {
                return Err(ManifestProblem::DuplicateSplit {
                    split: split.name.clone(),
                });
            }
            self.validate_split(split)?;
        }
        let number = self.generation_number();
        if let Some(g) = self
            .generation
            .as_ref()
            .filter(|g| !is_generation_folder(&g.folder, g.number))
        {
            return Err(ManifestProblem::GenerationFolder {
                folder: g.folder.clone(),
                number: g.number,
            });
        }
        let foreign = |s: &&ShardEntry| match s.generation {
            Some(g) => g < 2 || g > number,
            None => false,
        };
        if let Some(s) = self.shards.iter().find(foreign) {
            return Err(ManifestProblem::ShardGeneration {
                file: s.file.clone(),
                generation: s.generation.unwrap_or(1),
                number,
            });
        }
        if let Some(s) = self
            .shards
            .iter()
            .find(|s| !split_names.contains(s.split.as_str()))
        {
            return Err(ManifestProblem::UnknownSplit {
                file: s.file.clone(),
                split: s.split.clone(),
            });
        }
        Ok(())
    }

    fn validate_tensor(&self, t: &TensorSpec) -> Result<(), ManifestProblem> {
        let expected = t.role.rank();
        if t.sample_shape.len() != expected {
            return Err(ManifestProblem::Rank {
                tensor: t.name.clone(),
                role: t.role,
                shape: t.sample_shape.clone(),
                expected,
            });
        }
        // An encoded string column's element type is its encoding's.
        let dtype = match t.role {
            TensorRole::Encoded | TensorRole::ContextEncoded => t
                .columns
                .first()
                .and_then(|c| c.encoding.dtype())
                .unwrap_or(Dtype::U8),
            role => role.dtype(),
        };
        if t.dtype != dtype {
            return Err(ManifestProblem::Dtype {
                tensor: t.name.clone(),
                role: t.role,
                found: t.dtype,
                expected: dtype,
            });
        }
        let fits = t
            .sample_shape
            .iter()
            .try_fold(t.dtype.size(), |acc, &d| acc.checked_mul(d))
            .is_some_and(|b| b < 1 << 40);
        if !fits {
            return Err(ManifestProblem::ImpossibleShape {
                tensor: t.name.clone(),
                shape: t.sample_shape.clone(),
            });
        }
        // Engine sub-columns carry the engine's one padding step.
        let seq_axis = match t.role {
            TensorRole::Features | TensorRole::Categorical | TensorRole::Encoded => {
                Some(self.max_len)
            }
            TensorRole::SubColumn => Some(self.max_len.saturating_add(1)),
            _ => None,
        };
        if let Some(expected) = seq_axis.filter(|&e| t.sample_shape[0] != e) {
            return Err(ManifestProblem::SequenceAxis {
                tensor: t.name.clone(),
                found: t.sample_shape[0],
                expected,
                max_len: self.max_len,
            });
        }
        let width = match t.role {
            TensorRole::Features => t.sample_shape[1],
            TensorRole::Targets | TensorRole::ContextFeatures => t.sample_shape[0],
            _ => 1,
        };
        if t.columns.len() != width {
            return Err(ManifestProblem::Columns {
                tensor: t.name.clone(),
                found: t.columns.len(),
                width,
            });
        }
        if matches!(t.role, TensorRole::Encoded | TensorRole::ContextEncoded) {
            let encoding = &t.columns[0].encoding;
            let found = t.sample_shape.last().copied().unwrap_or(0);
            match encoding.width() {
                Some(w) if w == found => {}
                Some(w) => {
                    return Err(ManifestProblem::EncodedWidth {
                        tensor: t.name.clone(),
                        found,
                        width: w,
                    })
                }
                None => {
                    return Err(ManifestProblem::NotEncoded {
                        tensor: t.name.clone(),
                    })
                }
            }
        }
        Ok(())
    }

    fn validate_split(&self, split: &SplitInfo) -> Result<(), ManifestProblem> {
        if split_name_problem(&split.name).is_some() {
            return Err(ManifestProblem::SplitName {
                split: split.name.clone(),
            });
        }
        let listed = self.shards_of(&split.name).count();
        if listed != split.shards {
            return Err(ManifestProblem::SplitShards {
                split: split.name.clone(),
                said: split.shards,
                listed,
            });
        }
        let mut next_first = 0usize;
        let mut removed = 0usize;
        for (i, s) in self.shards_of(&split.name).enumerate() {
            let increasing = s.removed.windows(2).all(|w| w[0] < w[1]);
            if !increasing || s.removed.last().is_some_and(|&r| r as usize >= s.contexts) {
                return Err(ManifestProblem::Removed {
                    file: s.file.clone(),
                    contexts: s.contexts,
                });
            }
            removed += s.removed.len();
            let expected = ShardEntry {
                index: i,
                split: split.name.clone(),
                ..s.clone()
            }
            .expected_file();
            if s.index != i || s.file != expected {
                return Err(ManifestProblem::ShardName {
                    file: s.file.clone(),
                    index: s.index,
                    split: split.name.clone(),
                    expected,
                });
            }
            if let Some(keys) = &s.keys {
                let expected = ShardEntry {
                    index: i,
                    split: split.name.clone(),
                    ..s.clone()
                }
                .expected_key_file();
                if keys.file != expected {
                    return Err(ManifestProblem::ShardName {
                        file: keys.file.clone(),
                        index: s.index,
                        split: split.name.clone(),
                        expected,
                    });
                }
            }
            if s.first_context != next_first {
                return Err(ManifestProblem::ShardStart {
                    file: s.file.clone(),
                    found: s.first_context,
                    expected: next_first,
                });
            }
            next_first = next_first.saturating_add(s.contexts);
        }
        if next_first - removed != split.contexts || removed != split.removed {
            return Err(ManifestProblem::SplitContexts {
                split: split.name.clone(),
                said: split.contexts,
                held: next_first - removed,
            });
        }
        Ok(())
    }

    /// The format version (one of [`SUPPORTED_VERSIONS`]).
    pub fn format_version(&self) -> u32 {
        self.format_version
    }

    /// The dsc release that wrote the cache.
    pub fn dsc_version(&self) -> &str {
        &self.dsc_version
    }

    /// The padded sequence length `L`.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The splits, `train` first.
    pub fn splits(&self) -> &[SplitInfo] {
        &self.splits
    }

    /// The tensors every shard holds, in storage order.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Every shard, by split then index.
    pub fn shards(&self) -> &[ShardEntry] {
        &self.shards
    }

    /// The inputs and their fingerprint.
    pub fn inputs(&self) -> &Inputs {
        &self.inputs
    }

    /// Counts reported by the compile.
    pub fn summary(&self) -> &CompileSummary {
        &self.summary
    }

    /// The resolved compile spec.
    pub fn spec(&self) -> &CompileSpec {
        &self.spec
    }

    /// Whether the cache is a table of records (compiled without a key): each sample one row,
    /// keyed by its row number, its tensors without a step axis.
    pub fn is_records(&self) -> bool {
        self.spec.key.is_empty()
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorSpec> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The split called `name`.
    pub fn split(&self, name: &str) -> Option<&SplitInfo> {
        self.splits.iter().find(|s| s.name == name)
    }

    /// The shards of one split, in order.
    pub fn shards_of<'a>(&'a self, split: &'a str) -> impl Iterator<Item = &'a ShardEntry> + 'a {
        self.shards.iter().filter(move |s| s.split == split)
    }

    /// The same manifest over `shards` (the same shards stored another way: compressed or
    /// not), validated.
    pub fn with_shards(mut self, shards: Vec<ShardEntry>) -> Result<Manifest, ManifestProblem> {
        self.shards = shards;
        self.validate()?;
        Ok(self)
    }

    /// The generation this manifest describes: 1 for a compiled cache.
    pub fn generation_number(&self) -> u32 {
        self.generation.as_ref().map_or(1, |g| g.number)
    }

    /// What this generation added to its parent, if it is not the first.
    pub fn generation(&self) -> Option<&Generation> {
        self.generation.as_ref()
    }

    /// The same cache as a later generation: `shards` (the parent's and new ones), `summary`
    /// and `inputs` of the whole, and what the generation itself is; validated.
    pub fn next_generation(
        mut self,
        generation: Generation,
        splits: Vec<SplitInfo>,
        shards: Vec<ShardEntry>,
        inputs: Inputs,
        summary: CompileSummary,
    ) -> Result<Manifest, ManifestProblem> {
        self.generation = Some(generation);
        self.splits = splits;
        self.shards = shards;
        self.inputs = inputs;
        self.summary = summary;
        self.dsc_version = env!("CARGO_PKG_VERSION").into();
        self.validate()?;
        Ok(self)
    }

    /// The statistics file of this generation, relative to the cache: `stats.json` for the
    /// first, `generations/{NNNNN}/stats.json` for a later one.
    pub fn stats_file(&self) -> String {
        match self.generation_number() {
            1 => crate::STATS_FILE.into(),
            _ => match &self.generation {
                Some(g) => format!("{}/{}", g.folder, crate::STATS_FILE),
                None => crate::STATS_FILE.into(),
            },
        }
    }

    /// The manifest file of this generation, relative to the cache.
    pub fn manifest_file(&self) -> String {
        match self.generation_number() {
            1 => crate::MANIFEST_FILE.into(),
            n => generation_manifest_name(n),
        }
    }

    /// Bytes per context across all tensors.
    pub fn bytes_per_context(&self) -> usize {
        self.tensors.iter().map(TensorSpec::sample_bytes).sum()
    }
}
