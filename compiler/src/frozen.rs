//! Fitted parameters taken from another cache instead of fitted (`fit_from`, and every append):
//! the numeric stages and fills, vocabularies, string encodings and `max_len` that cache's
//! manifest records. A compile that takes them writes tensors equal to that cache's, so its
//! shards read as that cache's would (same codes, same normalisation) and can join its lineage.

use crate::bucket::ColumnId;
use crate::encode::{CatValue, NumericResult};
use crate::error::{CompileError, Result};
use dsc_format::spec::NanPolicy;
use dsc_format::spelling::OptionError;
use dsc_format::stats::{Bin, ColumnStats, Stats};
use dsc_format::{ColumnSource, ColumnSpec, Encoding, Manifest, TensorSpec};
use std::path::{Path, PathBuf};

/// Another cache's fitted parameters.
#[derive(Debug)]
pub(crate) struct Frozen {
    dir: PathBuf,
    manifest: Manifest,
    /// Its statistics: the edges new histograms are binned on, and the one fill its manifest
    /// does not hold (a boolean column's train mean under `nan = "mean"`).
    stats: Stats,
    /// Its first generation's statistics: its train split is what the parameters were fitted
    /// on, what new data is measured against.
    first: Stats,
}

/// What a column of new data is measured against: the edges of the other cache's histograms
/// per split (`all` first, then this compile's splits; `None` where it has no values), and the
/// range its parameters were fitted on.
pub(crate) struct Reference {
    pub edges: Vec<Option<Vec<Bin>>>,
    pub range: Option<(f64, f64)>,
}

impl Frozen {
    /// The parameters of the cache at `dir` (its last generation: every generation of a
    /// lineage holds the first one's).
    pub fn read(dir: &Path) -> Result<Frozen> {
        let manifest = Manifest::read(dir)?;
        if manifest.spec().profile.is_some() {
            return Err(refuse(format!(
                "{} was compiled with a profile, whose encodings live in the engine's own \
                 statistics files",
                dir.display()
            )));
        }
        let stats = Stats::read(dir, &manifest)?;
        let first = match manifest.generation_number() {
            1 => stats.clone(),
            _ => Stats::read(
                dir,
                &Manifest::read_at(dir, &dsc_format::GenerationRef::Number(1))?,
            )?,
        };
        Ok(Frozen {
            dir: dir.into(),
            manifest,
            stats,
            first,
        })
    }

    /// What a numeric column `id` of this compile (with splits `splits`) is measured against.
    pub fn reference(&self, id: &ColumnId, splits: &[String]) -> Reference {
        let numeric = |stats: &Stats, split: &str| {
            column_stats(stats, split, id).and_then(|c| c.numeric.clone())
        };
        let edges = std::iter::once(dsc_format::ALL_SPLITS)
            .chain(splits.iter().map(String::as_str))
            .map(|s| numeric(&self.stats, s).map(|n| n.histogram))
            .collect();
        Reference {
            edges,
            range: numeric(&self.first, "train").map(|n| (n.min, n.max)),
        }
    }

    /// The first generation's train statistics of a column (table and name), and the
    /// vocabulary its encoding holds: the drift report's reference.
    pub fn fitted_on(&self, table: &str, name: &str) -> Option<&ColumnStats> {
        self.first
            .splits
            .iter()
            .find(|s| s.split == "train")?
            .columns
            .iter()
            .find(|c| c.name == name && c.table == table)
    }

    /// The first generation's train length statistics and contexts.
    pub fn lengths_fitted_on(&self) -> Option<(&dsc_format::stats::LengthStats, u64)> {
        let train = self.first.splits.iter().find(|s| s.split == "train")?;
        Some((&train.lengths, train.contexts))
    }

    /// The other cache's encoding of column `name` of `table`.
    pub fn encoding_of(&self, table: &str, name: &str) -> Option<&Encoding> {
        self.column_named(table, name).map(|c| &c.encoding)
    }

    /// The other cache's statistics (of its last generation).
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The padded length of the other cache.
    pub fn max_len(&self) -> usize {
        self.manifest.max_len()
    }

    /// Its NaN policy: the fills it stores follow it, so a compile with another is refused.
    pub fn check_policy(&self, nan: NanPolicy) -> Result<()> {
        let theirs = self.manifest.spec().nan;
        if theirs != nan {
            return Err(refuse(format!(
                "{} was compiled with nan={theirs:?}, this compile asks for nan={nan:?}: \
                 the fills must be the same",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// The other cache's column of `id`'s table and name.
    fn column(&self, id: &ColumnId) -> Result<&ColumnSpec> {
        self.column_named(id.table, &id.name).ok_or_else(|| {
            refuse(format!(
                "{} has no {} column {:?} to take its encoding from",
                self.dir.display(),
                id.table,
                id.name
            ))
        })
    }

    /// The other cache's column `name` of `table` (`rows`, `join`, `context`).
    fn column_named(&self, table: &str, name: &str) -> Option<&ColumnSpec> {
        let same_table = |c: &ColumnSpec| {
            matches!(
                (&c.source, table),
                (ColumnSource::Rows, "rows")
                    | (ColumnSource::Context, "context")
                    | (ColumnSource::Join { .. }, "join")
            )
        };
        self.manifest
            .tensors()
            .iter()
            .flat_map(|t| &t.columns)
            .find(|c| c.name == name && same_table(c))
    }

    /// Replaces a numeric column's fitted stages (and fill) with the other cache's.
    pub fn numeric(&self, id: &ColumnId, result: &mut NumericResult) -> Result<()> {
        match &self.column(id)?.encoding {
            Encoding::Numeric { stages, fill } => {
                result.stages = stages.clone();
                result.fill = Some(*fill);
            }
            Encoding::Bool => {
                result.stages = vec![dsc_format::manifest::Stage::Identity];
                // The one fill a manifest does not record: the train mean of 0/1.
                let train = self.stats.splits.iter().find(|s| s.split == "train");
                result.train_mean = train
                    .and_then(|s| {
                        s.columns
                            .iter()
                            .find(|c| c.name == id.name && c.table == id.table)
                    })
                    .and_then(|c| c.numeric.as_ref())
                    .map_or(0.0, |n| n.mean);
            }
            other => return Err(self.other_kind(id, other)),
        }
        result.has_bad |= crate::encode::out_of_f32(&result.stats, &result.stages);
        Ok(())
    }

    /// The other cache's vocabulary of a categorical column, as values of `id`'s kind.
    pub fn vocabulary(&self, id: &ColumnId) -> Result<Vec<CatValue>> {
        let Encoding::Category { vocabulary } = &self.column(id)?.encoding else {
            return Err(self.other_kind(id, &self.column(id)?.encoding));
        };
        let values: Option<Vec<CatValue>> = vocabulary
            .iter()
            .map(|v| match v {
                serde_json::Value::Bool(b) => Some(CatValue::Int(i64::from(*b))),
                serde_json::Value::Number(n) => n.as_i64().map(CatValue::Int),
                serde_json::Value::String(s) => Some(CatValue::Str(s.clone())),
                _ => None,
            })
            .collect();
        let values = values.filter(|v| v.windows(2).all(|w| w[0] < w[1]));
        values.ok_or_else(|| {
            refuse(format!(
                "{}: the vocabulary of {:?} is not one this build reads (ascending numbers, \
                 strings or booleans)",
                self.dir.display(),
                id.name
            ))
        })
    }

    /// The other cache's fixed-width encoding of a string column.
    pub fn text(&self, id: &ColumnId) -> Result<Encoding> {
        let encoding = &self.column(id)?.encoding;
        if encoding.width().is_none() {
            return Err(self.other_kind(id, encoding));
        }
        Ok(encoding.clone())
    }

    fn other_kind(&self, id: &ColumnId, theirs: &Encoding) -> CompileError {
        refuse(format!(
            "{} encodes {:?} as {}, which this compile's spec does not",
            self.dir.display(),
            id.name,
            serde_json::to_string(theirs).unwrap_or_default()
        ))
    }

    /// Refuses a compile whose tensors would differ from the other cache's: another column,
    /// source type, join file or encoding, named.
    pub fn check_tensors(&self, ours: &[TensorSpec]) -> Result<()> {
        let theirs = self.manifest.tensors();
        let names = |t: &[TensorSpec]| t.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
        if names(ours) != names(theirs) {
            return Err(refuse(format!(
                "this compile's tensors {:?} differ from those of {}, {:?}",
                names(ours),
                self.dir.display(),
                names(theirs)
            )));
        }
        for (a, b) in ours.iter().zip(theirs) {
            if a == b {
                continue;
            }
            let column = a
                .columns
                .iter()
                .zip(&b.columns)
                .find(|(x, y)| x != y)
                .map(|(x, y)| {
                    format!(
                        ": column {:?} is {} here and {} there",
                        x.name,
                        serde_json::to_string(x).unwrap_or_default(),
                        serde_json::to_string(y).unwrap_or_default()
                    )
                })
                .unwrap_or_default();
            return Err(refuse(format!(
                "tensor {:?} would differ from that of {}{column}",
                a.name,
                self.dir.display()
            )));
        }
        Ok(())
    }
}

/// The statistics of column `id` in `split` of `stats`.
fn column_stats<'a>(stats: &'a Stats, split: &str, id: &ColumnId) -> Option<&'a ColumnStats> {
    stats
        .splits
        .iter()
        .find(|s| s.split == split)?
        .columns
        .iter()
        .find(|c| c.name == id.name && c.table == id.table)
}

fn refuse(problem: String) -> CompileError {
    OptionError::new("fit_from", problem).into()
}
