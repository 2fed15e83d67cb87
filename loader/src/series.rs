//! What a loader of series windows ([`crate::order::SeriesWindows`]) reads beyond the order: the
//! windows checked against the cache, where a horizon's target columns lie in `x`, and the
//! tensors a window adds to a batch: `start` (its first step), and with a horizon `y_next` (the
//! next `H` steps of chosen columns of `x`) and `horizon_length` (its real steps). The gather of
//! a batch of windows is `series_gather.rs`.

use crate::batch::TensorLayout;
use crate::cache::Inner;
use crate::error::LoadError;
use crate::order::SeriesWindows;
use dsc_format::spelling::OptionError;
use dsc_format::{Dtype, TensorRole};

/// The tensors a series window adds after the loaded ones: `start`, and with a horizon
/// `y_next` and `horizon_length`.
pub const SERIES_TENSORS: [&str; 3] = ["start", "y_next", "horizon_length"];

/// What a loader of windows needs besides the order: where the target columns lie in `x`.
#[derive(Debug, Clone)]
pub(crate) struct SeriesPlan {
    pub windows: SeriesWindows,
    /// The manifest index of `x` (the features tensor), when the windows have a horizon.
    pub x: Option<usize>,
    /// The columns of `x` the target takes, as indices of its last axis.
    pub columns: Vec<usize>,
}

impl SeriesPlan {
    /// The windows of `windows` checked against the cache of `inner`
    /// ([`SeriesWindows::check`]), with target columns that `x` holds.
    pub fn new(inner: &Inner, windows: &SeriesWindows) -> Result<SeriesPlan, LoadError> {
        windows.check(&inner.manifest)?;
        let bad =
            |problem: String| -> LoadError { OptionError::new("horizon_columns", problem).into() };
        if windows.horizon == 0 {
            return Ok(SeriesPlan {
                windows: windows.clone(),
                x: None,
                columns: Vec::new(),
            });
        }
        let tensors = inner.manifest.tensors();
        let Some(x) = tensors.iter().position(|t| t.role == TensorRole::Features) else {
            return Err(OptionError::new(
                "horizon",
                format!(
                    "a horizon's target is taken from the features tensor x, and {} has none",
                    inner.dir.display()
                ),
            )
            .into());
        };
        let names: Vec<&str> = tensors[x].columns.iter().map(|c| c.name.as_str()).collect();
        let columns = if windows.horizon_columns.is_empty() {
            (0..names.len()).collect()
        } else {
            windows
                .horizon_columns
                .iter()
                .map(|c| {
                    names.iter().position(|n| n == c).ok_or_else(|| {
                        bad(format!(
                            "target column {c:?} is not a column of x (its columns: {names:?})"
                        ))
                    })
                })
                .collect::<Result<_, _>>()?
        };
        Ok(SeriesPlan {
            windows: windows.clone(),
            x: Some(x),
            columns,
        })
    }

    /// The tensors a window adds to a batch of `batch_size` rows.
    pub fn layout(&self, batch_size: usize) -> Vec<TensorLayout> {
        let tensor = |name: &str, dtype, shape| TensorLayout {
            name: name.into(),
            dtype,
            role: None,
            shape,
            trimmed_axis: None,
        };
        let mut out = vec![tensor(SERIES_TENSORS[0], Dtype::I32, vec![batch_size])];
        if self.windows.horizon > 0 {
            let (h, k) = (self.windows.horizon, self.columns.len());
            out.push(tensor(
                SERIES_TENSORS[1],
                Dtype::F32,
                vec![batch_size, h, k],
            ));
            out.push(tensor(SERIES_TENSORS[2], Dtype::I32, vec![batch_size]));
        }
        out
    }
}
