//! Several caches read as one: their contexts drawn in fixed proportions, in an order that is a
//! pure function of (seed, epoch, weights) ([`crate::order::MixOrder`]).

use crate::cache::Cache;
use crate::error::LoadError;
use dsc_format::{Encoding, TensorRole, TensorSpec};

/// Caches whose batches are drawn together: the same tensors (name, dtype, role, columns, and
/// each column's encoding with its fitted parameters and vocabularies) in every cache, of any
/// `L` (batches are padded to the longest).
///
/// ```
/// use dsc_loader::{Cache, LoaderOptions, Mix, OrderSpec};
/// # let dir = tempfile::tempdir()?;
/// # for (name, seed) in [("a", 1), ("b", 2)] {
/// #     let sample = dsc_gen::icecube::IcecubeOptions {
/// #         files: 1, events_per_file: 400, seed, ..Default::default()
/// #     };
/// #     dsc_gen::icecube::generate(&dir.path().join(name), &sample)?;
/// #     let rows = dir.path().join(name).join("train/batch_*.parquet");
/// #     let mut spec = dsc_compiler::CompileSpec::new(vec![rows.display().to_string()], "event_id");
/// #     spec.features = vec!["time".into(), "charge".into()];
/// #     spec.max_len = Some(32 * seed as usize);
/// #     dsc_compiler::compile(&spec, &dsc_compiler::CompileOptions {
/// #         out: dir.path().join(format!("{name}-cache")), force: false, max_memory: None,
/// #         storage: dsc_compiler::Storage::Hot, progress: &dsc_compiler::NoProgress,
/// #     })?;
/// # }
/// # let (path_a, path_b) = (dir.path().join("a-cache"), dir.path().join("b-cache"));
/// let mix = Mix::new(vec![Cache::open(path_a)?, Cache::open(path_b)?])?;
/// let opts = LoaderOptions {
///     order: OrderSpec { weights: vec![0.7, 0.3], ..Default::default() },
///     batch_size: 100,
///     ..Default::default()
/// };
/// let mut loader = mix.loader(opts.clone())?;
/// let batch = loader.next().ok_or("no batch")??;
/// assert_eq!(batch.tensor("x").ok_or("no x")?.shape(), [100, 64, 2]); // the longer L
/// let state = loader.state();                 // the weights are part of the order
/// let rest = mix.loader_from_state(opts, &state)?;
/// assert_eq!(rest.next_step(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Mix {
    sources: Vec<Cache>,
}

impl Mix {
    /// The mix of `caches`, in this order (the order of `weights`). Refuses caches whose
    /// tensors differ, naming the tensor and how.
    pub fn new(caches: Vec<Cache>) -> Result<Mix, LoadError> {
        let Some(first) = caches.first() else {
            return Err(crate::error::Misuse::EmptyMix.into());
        };
        for other in &caches[1..] {
            if let Some((tensor, problem)) = mismatch(first.tensors(), other.tensors()) {
                return Err(LoadError::Mismatch {
                    dir: other.dir().to_path_buf(),
                    first: first.dir().to_path_buf(),
                    tensor,
                    problem,
                });
            }
        }
        Ok(Mix { sources: caches })
    }

    /// The caches mixed, in order.
    pub fn sources(&self) -> &[Cache] {
        &self.sources
    }

    /// The stored lengths of split `split` of every source, one source after another: a
    /// sample's `position` indexes it.
    pub fn lengths(&self, split: &str) -> Result<std::sync::Arc<[u32]>, LoadError> {
        crate::cache::lengths_of(&self.sources, split)
    }
}

/// The first tensor in which `other` differs from `first` beyond the length of its step axis,
/// and how.
/// Whether a stored value of a column means the same in two caches: the same encoding, its
/// fitted parameters and vocabularies included. A numeric column's `fill` (what a bad value was
/// stored as: zero, or the cache's own train mean with `nan: mean`) may differ: it imputes
/// values that were not there, in the same units as the rest.
fn same_meaning(a: &Encoding, b: &Encoding) -> bool {
    match (a, b) {
        (Encoding::Numeric { stages: sa, .. }, Encoding::Numeric { stages: sb, .. }) => sa == sb,
        _ => a == b,
    }
}

fn mismatch(first: &[TensorSpec], other: &[TensorSpec]) -> Option<(String, String)> {
    let names = |t: &[TensorSpec]| t.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
    for a in first {
        let Some(b) = other.iter().find(|b| b.name == a.name) else {
            return Some((a.name.clone(), "is missing".into()));
        };
        if a.dtype != b.dtype {
            return Some((
                a.name.clone(),
                format!("is {} here, {} there", b.dtype.as_str(), a.dtype.as_str()),
            ));
        }
        if a.role != b.role {
            return Some((
                a.name.clone(),
                format!("is {:?} here, {:?} there", b.role, a.role),
            ));
        }
        // The step axis of a sequence tensor may differ: batches are padded to the longest.
        let skip = usize::from(matches!(
            a.role,
            TensorRole::Features | TensorRole::Categorical | TensorRole::Encoded
        ));
        if a.sample_shape.len() != b.sample_shape.len()
            || a.sample_shape[skip..] != b.sample_shape[skip..]
        {
            return Some((
                a.name.clone(),
                format!(
                    "has samples of shape {:?} here, {:?} there",
                    b.sample_shape, a.sample_shape
                ),
            ));
        }
        let columns = |t: &TensorSpec| t.columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
        if columns(a) != columns(b) {
            return Some((
                a.name.clone(),
                format!(
                    "holds columns {:?} here, {:?} there",
                    columns(b),
                    columns(a)
                ),
            ));
        }
        for (ca, cb) in a.columns.iter().zip(&b.columns) {
            if same_meaning(&ca.encoding, &cb.encoding) {
                continue;
            }
            if let (Encoding::Category { vocabulary: va }, Encoding::Category { vocabulary: vb }) =
                (&ca.encoding, &cb.encoding)
            {
                return Some((
                    a.name.clone(),
                    format!(
                        "codes column {:?} over another vocabulary ({} values here, {} \
                         there): its codes would mean different values",
                        ca.name,
                        vb.len(),
                        va.len()
                    ),
                ));
            }
            // A stored number means what its encoding makes of the source value: raw ticks
            // beside z-scores, or z-scores about two different means, would be one column of
            // values that mean different things. Re-expressing one cache's values in the
            // other's encoding would not give the bytes a compile with it gives (f32 rounding),
            // so a mix takes only equal encodings.
            return Some((
                a.name.clone(),
                format!(
                    "encodes column {:?} as {} here and as {} there: its values would mean \
                     different things in one batch. Compile the caches with the same encoding \
                     and fitted parameters: a fitted stage (zscore, minmax) is fitted on each \
                     cache's own train split, so encode without one (log1p, or none; the \
                     trainers normalise) or compile the caches' inputs together",
                    ca.name,
                    cb.encoding.describe(),
                    ca.encoding.describe()
                ),
            ));
        }
    }
    if first.len() != other.len() {
        let extra = names(other)
            .into_iter()
            .find(|n| !first.iter().any(|t| &t.name == n))
            .unwrap_or_default();
        return Some((extra, "is not in the first cache".into()));
    }
    // Same tensors, another order: batches follow the first cache's order, fine.
    None
}
