//! What is learned from the cache's `y` tensor: the loss and the validation metric.

use crate::config::{RunConfig, Task};
use crate::error::{Result, TrainError};
use crate::model::Standardise;
use crate::normalise::Scaling;
use dsc_format::stats::SplitStats;
use dsc_format::{Encoding, Stage, TensorRole};
use dsc_loader::{Cache, LoaderOptions, Mix, OrderSpec};
use tch::nn::{self, Module};
use tch::{Kind, Reduction, Tensor};

/// A task resolved against a cache: which columns of `y`, and the network's output width.
#[derive(Debug)]
pub struct TaskSpec {
    /// Which task.
    pub task: Task,
    /// The target columns of `y` it reads.
    pub column_names: Vec<String>,
    /// Outputs the network's head needs.
    pub outputs: i64,
    /// Name of the validation metric (lower is better except accuracy).
    pub metric: &'static str,
    index: Tensor,
    /// Regression: the loss is on the standardised targets (in source units the squared error,
    /// and its gradients, would be as large as the units squared); `pred` is in those
    /// standardised units, the metric in stored ones. Variables `y_norm.*` of the model, so
    /// `model.safetensors` says how to read its outputs.
    y_norm: Standardise,
}

impl TaskSpec {
    /// The task of `cfg` on `cache`; `stats` (the train split's) scales regression targets,
    /// whose scaling becomes variables under `vs`.
    pub fn resolve(
        cfg: &RunConfig,
        sources: &Mix,
        stats: Option<&SplitStats>,
        vs: &nn::Path,
    ) -> Result<TaskSpec> {
        let device = vs.device();
        let cache = &sources.sources()[0];
        let manifest = cache.manifest();
        if cfg.task == Task::Forecast {
            return Self::forecast(cfg, cache, stats, vs);
        }
        let Some(y) = manifest
            .tensors()
            .iter()
            .find(|t| t.role == TensorRole::Targets)
        else {
            return Err(TrainError::cache(
                cache.dir(),
                "the cache has no targets tensor `y`; compile it with `targets`",
            ));
        };
        let names: Vec<&str> = y.columns.iter().map(|c| c.name.as_str()).collect();
        let bad = |what: String| TrainError::cache(cache.dir(), what);
        let find = |want: &str| -> Result<i64> {
            names
                .iter()
                .position(|n| *n == want)
                .map(|i| i as i64)
                .ok_or_else(|| {
                    bad(format!(
                        "no target column {want:?} in y (columns: {names:?})"
                    ))
                })
        };
        let wanted: Vec<String> = match (cfg.task, cfg.target.is_empty()) {
            (_, false) => cfg.target.clone(),
            (Task::Direction, true) => vec!["azimuth".into(), "zenith".into()],
            (Task::Regression, true) => names.iter().map(|s| s.to_string()).collect(),
            (Task::Forecast, true) => unreachable!("resolved above"),
            (Task::Classification, true) if names.len() == 1 => vec![names[0].to_string()],
            (Task::Classification, true) => {
                return Err(bad(format!(
                    "y has {} columns {names:?}; name the class column with `target`",
                    names.len()
                )))
            }
        };
        let columns = wanted.iter().map(|w| find(w)).collect::<Result<Vec<_>>>()?;
        let (outputs, metric) = match cfg.task {
            Task::Regression => (columns.len() as i64, "mae"),
            Task::Direction => {
                if columns.len() != 2 {
                    return Err(bad(format!(
                        "`task=direction` takes two target columns (azimuth, zenith), got \
                         {wanted:?}"
                    )));
                }
                for &c in &columns {
                    let col = &y.columns[c as usize];
                    let identity = matches!(&col.encoding, Encoding::Numeric { stages, .. }
                        if stages.iter().all(|s| *s == Stage::Identity));
                    if !identity {
                        return Err(bad(format!(
                            "`task=direction` needs {} in radians as stored; it is encoded as {:?} \
                             (compile it with `encode={}=identity`)",
                            col.name, col.encoding, col.name
                        )));
                    }
                }
                (3, "mean_angular_error_rad")
            }
            Task::Forecast => unreachable!("resolved above"),
            Task::Classification => {
                if columns.len() != 1 {
                    return Err(bad(format!(
                        "`task=classification` takes one target column, got {wanted:?}"
                    )));
                }
                (count_classes(sources, columns[0], &wanted[0])?, "accuracy")
            }
        };
        let scaling = match (cfg.task, stats) {
            (Task::Regression, Some(s)) if cfg.scale_targets => {
                Scaling::of_columns(y, columns.iter().map(|&c| c as usize), s)
            }
            _ => Scaling::identity(columns.len()),
        };
        Ok(TaskSpec {
            task: cfg.task,
            y_norm: Standardise::new(vs / "y_norm", &scaling),
            index: Tensor::from_slice(&columns).to_device(device),
            column_names: wanted,
            outputs,
            metric,
        })
    }

    /// Forecasting the series windows' `y_next` (`[B, H, K]`, read flat as `[B, H·K]`): the
    /// target columns of `x`, standardised as the network's inputs are (the train statistics
    /// of those columns of `x`), the metric in stored units.
    fn forecast(
        cfg: &RunConfig,
        cache: &Cache,
        stats: Option<&SplitStats>,
        vs: &nn::Path,
    ) -> Result<TaskSpec> {
        let batches = cfg.batches();
        let series = batches.windows().expect("validated: forecast has windows");
        let manifest = cache.manifest();
        let Some(x) = manifest
            .tensors()
            .iter()
            .find(|t| t.role == TensorRole::Features)
        else {
            return Err(TrainError::cache(
                cache.dir(),
                "`task=forecast` predicts columns of the features tensor `x`, and the cache has none",
            ));
        };
        let names: Vec<String> = x.columns.iter().map(|c| c.name.clone()).collect();
        let wanted: Vec<String> = if series.horizon_columns.is_empty() {
            names.clone()
        } else {
            series.horizon_columns.clone()
        };
        let columns: Vec<usize> = wanted
            .iter()
            .map(|w| {
                names.iter().position(|n| n == w).ok_or_else(|| {
                    TrainError::cache(
                        cache.dir(),
                        format!("no column {w:?} in x to forecast (columns: {names:?})"),
                    )
                })
            })
            .collect::<Result<_>>()?;
        // y_next is [H, K]: each step repeats the columns' scaling.
        let per_step = match stats.filter(|_| cfg.scale_targets) {
            Some(s) => Scaling::of_columns(x, columns.iter().copied(), s),
            None => Scaling::identity(columns.len()),
        };
        let steps = series.horizon;
        let scaling = Scaling {
            shift: per_step.shift.repeat(steps),
            scale: per_step.scale.repeat(steps),
        };
        let outputs = (steps * columns.len()) as i64;
        Ok(TaskSpec {
            task: Task::Forecast,
            y_norm: Standardise::new(vs / "y_norm", &scaling),
            index: Tensor::arange(outputs, (Kind::Int64, vs.device())),
            column_names: wanted,
            outputs,
            metric: "mae",
        })
    }

    /// The selected target columns of `y`, f32 `[B, k]` (a forecast's `y_next` flattened).
    fn targets(&self, y: &Tensor) -> Tensor {
        match self.task {
            Task::Forecast => y.flatten(1, -1),
            _ => y.index_select(1, &self.index),
        }
    }

    /// Mean loss over the batch, an f32 scalar on the device; for a pack (`seqs`: its
    /// `num_seqs`, `[1]`) over its leading `seqs` rows, the rest being unused, so that a step
    /// weighs each context as a padded batch does.
    pub fn loss(&self, pred: &Tensor, y: &Tensor, seqs: Option<&Tensor>) -> Tensor {
        let per = self.evaluate(pred, y, false).0;
        let Some(seqs) = seqs else {
            return per.mean(Kind::Float);
        };
        let rows = Tensor::arange(per.size()[0], (Kind::Int64, per.device()));
        let used = rows.lt_tensor(seqs);
        let zero = Tensor::zeros_like(&per);
        let count = seqs.clamp_min(1).to_kind(Kind::Float).reshape([]);
        per.where_self(&used, &zero).sum(Kind::Float) / count
    }

    /// Per-sample loss and metric, f32 `[B]` each.
    pub fn per_sample(&self, pred: &Tensor, y: &Tensor) -> (Tensor, Tensor) {
        let (loss, metric) = self.evaluate(pred, y, true);
        (loss, metric.expect("asked for"))
    }

    /// Per-sample loss, and the metric only when asked (training steps do not compute it).
    fn evaluate(&self, pred: &Tensor, y: &Tensor, metric: bool) -> (Tensor, Option<Tensor>) {
        let t = self.targets(y);
        match self.task {
            Task::Regression | Task::Forecast => {
                let z = self.y_norm.forward(&t);
                let loss = (pred - z).square().mean_dim(1, false, Kind::Float);
                let mae = || {
                    (self.y_norm.inverse(pred) - &t)
                        .abs()
                        .mean_dim(1, false, Kind::Float)
                };
                (loss, metric.then(mae))
            }
            Task::Classification => {
                let class = t.squeeze_dim(1).to_kind(Kind::Int64);
                let loss = pred.log_softmax(1, Kind::Float).nll_loss_nd(
                    &class,
                    None::<Tensor>,
                    Reduction::None,
                    -100,
                );
                let hit = || pred.argmax(1, false).eq_tensor(&class).to_kind(Kind::Float);
                (loss, metric.then(hit))
            }
            Task::Direction => {
                let (az, zen) = (t.select(1, 0), t.select(1, 1));
                let unit =
                    Tensor::stack(&[az.cos() * zen.sin(), az.sin() * zen.sin(), zen.cos()], 1);
                let p = pred / pred.norm_scalaropt_dim(2, [1], true).clamp_min(1e-6);
                let cos = (p * unit).sum_dim_intlist(1, false, Kind::Float);
                let angle = metric.then(|| cos.clamp(-1.0 + 1e-7, 1.0 - 1e-7).acos());
                (1.0 - cos, angle)
            }
        }
    }
}

/// The number of classes of an integer target: its training-split maximum (over every cache of
/// a mix) plus one. Every value must be a non-negative integer.
fn count_classes(sources: &Mix, column: i64, name: &str) -> Result<i64> {
    let mut max = -1i64;
    for cache in sources.sources() {
        max = max.max(largest_class(cache, column, name)?);
    }
    if max < 1 {
        return Err(TrainError::cache(
            sources.sources()[0].dir(),
            format!(
                "`task=classification`: target {name:?} has a single class in the training split"
            ),
        ));
    }
    Ok(max + 1)
}

/// The largest class number of an integer target in `cache`'s training split (-1 if empty).
fn largest_class(cache: &Cache, column: i64, name: &str) -> Result<i64> {
    let bad = |what: String| TrainError::cache(cache.dir(), what);
    let mut max = -1i64;
    let y = cache
        .tensors()
        .iter()
        .position(|t| t.role == TensorRole::Targets)
        .expect("resolved above");
    let width = cache.tensors()[y].sample_elems();
    let opts = LoaderOptions {
        order: OrderSpec {
            shuffle: false,
            drop_last: false,
            ..Default::default()
        },
        batch_size: 4096,
        threads: 0,
        ..Default::default()
    };
    let mut row = 0usize;
    for batch in cache.loader(opts)? {
        let batch = batch?;
        let bytes = batch.tensors()[y].bytes();
        for (i, sample) in bytes.chunks_exact(width * 4).take(batch.size).enumerate() {
            let at = column as usize * 4;
            let v = f32::from_le_bytes(sample[at..at + 4].try_into().expect("4 bytes"));
            if !(v >= 0.0 && v.fract() == 0.0 && v < 1e6) {
                return Err(bad(format!(
                    "`task=classification`: target {name:?} of training context {} is {v}, not a \
                     class number 0, 1, 2, …",
                    row + i
                )));
            }
            max = max.max(v as i64);
        }
        row += batch.size;
    }
    Ok(max)
}
