//! What a loader of series windows ([`crate::order::SeriesWindows`]) reads beyond the order: the
//! windows checked against the cache, where a horizon's target columns lie in `x`, and the
//! tensors a window adds to a batch: `start` (its first step), and with a horizon `y_next` (the
//! next `H` steps of chosen columns of `x`) and `horizon_length` (its real steps); and the
//! gather of a batch of windows: each row is `W` steps of one context from its window's start,
//! per-context tensors as they are, `length` the window's real steps, then the tensors a window
//! adds ([`SeriesPlan::layout`]). The order of windows is `order::series`.

use super::{own_tensor, Cut, Planning, Shape};
use crate::batch::TensorLayout;
use crate::cache::Cache;
use crate::cache::Inner;
use crate::error::LoadError;
use crate::gather::{is_sequence, Reader, Resolved};
use crate::options::LoaderOptions;
use crate::order::{EpochOrder, Order, SeriesOrder, SeriesWindows, SplitContexts, WindowIndex};
use crate::order::{Sample, Steps};
use crate::rows;
use dsc_format::spelling::OptionError;
use dsc_format::{Dtype, TensorRole};
use std::sync::Arc;

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
        let tensor = own_tensor;
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

/// The steps of an epoch of windows, and what a window reads beyond its sample.
#[derive(Debug)]
pub(crate) struct Windows {
    pub steps: Steps,
    pub plan: SeriesPlan,
}

/// Windows `windows` of `p`'s one cache: checked against it and against memory, over the
/// epoch's order of windows; a batch's step axis is the window's.
pub(crate) fn plan(p: &Planning<'_>, windows: &SeriesWindows) -> Result<Cut, LoadError> {
    let opts = p.opts;
    let plan = SeriesPlan::new(&p.sources[0].cache, windows)?;
    // A window's target steps, y_next [H, K] f32, come on top of its stored tensors.
    let horizon = windows
        .horizon
        .saturating_mul(plan.columns.len())
        .saturating_mul(4);
    p.bound(
        p.rows_bytes(opts.batch_size, horizon),
        ("batch_size", opts.batch_size),
    )?;
    let order = super::order(p, opts)?;
    let drop_last = opts.order.drop_last;
    let steps = Steps::new(order.len(), opts.batch_size, opts.world_size, drop_last)
        .after(opts.skip, drop_last);
    let mut layout = p.stored_layout(opts.batch_size, windows.len);
    layout.extend(plan.layout(opts.batch_size));
    Ok(Cut {
        shape: Shape::Windows(Windows { steps, plan }),
        layout,
        order,
        max_len: windows.len,
    })
}

/// The epoch's order of windows over `sizes` (the one source's contexts per shard): windows
/// are cut from one cache's series, shuffled across all contexts as contexts are.
pub(crate) fn order(
    sources: &[Cache],
    sizes: &[Arc<SplitContexts>],
    opts: &LoaderOptions,
    windows: &SeriesWindows,
) -> Result<Order, LoadError> {
    let o = &opts.order;
    let [one] = sizes else {
        return Err(OptionError::new(
            "series_window",
            format!(
                "windows are cut from one cache's series, and this loader mixes {} caches",
                sizes.len()
            ),
        )
        .into());
    };
    windows.check(sources[0].manifest())?;
    let lengths = sources[0].lengths(&o.split)?;
    // A hidden context has no window (a length of 0 has none).
    let lengths = match one.hides_any() {
        true => one.zero_hidden(&lengths).into(),
        false => lengths,
    };
    let index = Arc::new(WindowIndex::new(windows, one.stored(), &lengths));
    let order = EpochOrder::new(
        &index.sizes,
        o.shuffle,
        o.seed,
        opts.epoch,
        o.window,
        o.interleave,
    );
    Ok(Order::Series(SeriesOrder::new(
        order,
        index,
        windows.clone(),
    )))
}

/// Little-endian i32s into `out`, front to back.
fn write_i32s(out: &mut [u8], values: impl Iterator<Item = usize>) {
    for (slot, v) in out.chunks_exact_mut(4).zip(values) {
        slot.copy_from_slice(&(v as i32).to_le_bytes());
    }
}

impl Windows {
    /// Copies the windows `samples` (`held`: the shards they lie in when not mapped) into
    /// `dst`: the loaded tensors, then [`SeriesPlan::layout`]'s.
    pub fn gather(
        &self,
        reader: &Reader,
        samples: &[Sample],
        held: &Resolved<'_>,
        dst: &mut [&mut [u8]],
    ) {
        let plan = &self.plan;
        let w = &plan.windows;
        let n = samples.len();
        let bodies: Vec<&[u8]> = samples
            .iter()
            .map(|s| reader.shard_bytes(s, held))
            .collect();
        let lengths: Vec<usize> = samples
            .iter()
            .map(|s| reader.stored_length(s, held))
            .collect();
        for (t, out) in dst.iter_mut().take(reader.loaded).enumerate() {
            let spec = reader.spec(t);
            let starts: Vec<usize> = samples
                .iter()
                .map(|s| reader.source(s).range(s, t).0)
                .collect();
            if is_sequence(spec) {
                // The window's real steps of its context, then zeros.
                let step = reader.copy_bytes(t, 1);
                let row = step * w.len;
                for (i, (s, out)) in samples.iter().zip(out.chunks_exact_mut(row)).enumerate() {
                    let real = w.input_steps(s.step, lengths[i]) * step;
                    let from = starts[i] + s.step * step;
                    out[..real].copy_from_slice(&bodies[i][from..from + real]);
                    out[real..].fill(0);
                }
            } else if spec.role == TensorRole::Length {
                let real = samples
                    .iter()
                    .zip(&lengths)
                    .map(|(s, &len)| w.input_steps(s.step, len));
                write_i32s(out, real);
            } else {
                let size = reader.copy_bytes(t, 0);
                rows::gather(&mut out[..n * size], size, n, |i| {
                    &bodies[i][starts[i]..starts[i] + size]
                });
            }
        }
        let extra = &mut dst[reader.loaded..];
        write_i32s(extra[0], samples.iter().map(|s| s.step));
        let Some(x) = plan.x else {
            return;
        };
        let k = plan.columns.len();
        let row = w.horizon * k * 4;
        for (i, (s, out)) in samples
            .iter()
            .zip(extra[1].chunks_exact_mut(row))
            .enumerate()
        {
            let source = reader.source(s);
            let spec = &source.cache.manifest.tensors()[x];
            let features = spec.sample_shape[1];
            let at = source.shards()[s.shard].tensor_starts[x] + s.offset * spec.sample_bytes();
            let real = w.target_steps(s.step, lengths[i]);
            for h in 0..w.horizon {
                for (j, &c) in plan.columns.iter().enumerate() {
                    let to = (h * k + j) * 4;
                    if h < real {
                        let from = at + ((s.step + w.len + h) * features + c) * 4;
                        out[to..to + 4].copy_from_slice(&bodies[i][from..from + 4]);
                    } else {
                        out[to..to + 4].fill(0);
                    }
                }
            }
        }
        let real = samples
            .iter()
            .zip(&lengths)
            .map(|(s, &len)| w.target_steps(s.step, len));
        write_i32s(extra[2], real);
    }
}
