//! The loader's options as a caller spells them: one flat key per option, declared once here
//! for every front end. The command line flattens these groups into `dsc order`, `dsc bench`
//! and `dsc-train` (feature `cli`: each field's doc comment is its `--help`), and Python's
//! `dsc.Loader` sends its keywords by the same keys as JSON ([`LoaderArgs::from_json`]). Each
//! group turns its keys into the typed options ([`LoaderOptions`], [`OrderSpec`], [`Batches`]),
//! refusing what does not fit by key, so the rules live in the loader and nowhere else.
//!
//! A new option is a field here (its key, default and help) and its use in the loader.

use crate::error::LoadError;
use crate::options::{
    check_trim_multiple, Batches, LoaderOptions, OrderSpec, Pack, DEFAULT_BATCH_SIZE,
};
use crate::order::{SeriesWindows, Stage, DEFAULT_INTERLEAVE, DEFAULT_WINDOW};
use dsc_format::spelling::OptionError;
use serde::{Deserialize, Serialize};

/// Which contexts an epoch holds, and in which order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default)]
pub struct EpochArgs {
    /// The split.
    #[cfg_attr(feature = "cli", arg(long, default_value = "train"))]
    pub split: String,
    /// Seed of the epoch order.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub seed: u64,
    /// Contexts permuted together in a shuffled epoch.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = DEFAULT_WINDOW))]
    pub window: usize,
    /// Shards read side by side (each window mixes this many).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = DEFAULT_INTERLEAVE))]
    pub interleave: usize,
    /// Cache order: no shuffle.
    #[cfg_attr(feature = "cli", arg(long = "no-shuffle", action = clap::ArgAction::SetFalse))]
    pub shuffle: bool,
    /// Keep the last partial global batch, completed by repeating the first contexts (packs).
    #[cfg_attr(feature = "cli", arg(long = "keep-last", action = clap::ArgAction::SetFalse))]
    pub drop_last: bool,
}

impl Default for EpochArgs {
    fn default() -> Self {
        EpochArgs {
            split: "train".into(),
            seed: 0,
            window: DEFAULT_WINDOW,
            interleave: DEFAULT_INTERLEAVE,
            shuffle: true,
            drop_last: true,
        }
    }
}

/// What a batch is: padded contexts (the default), length-bucketed ones, packs or windows of
/// long series; and how padded ones are trimmed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default)]
pub struct ShapeArgs {
    /// Length-bucketed batches: contexts of similar length form each batch (inside each
    /// shuffle window, the batches still in random order), and each batch is cut to its
    /// longest sequence, so little of a step computes on padding.
    #[cfg_attr(feature = "cli", arg(long))]
    pub bucket: bool,
    /// Packed batches of T tokens (at least the cache's L) instead of padded contexts: whole
    /// sequences end to end, one pack per rank and step, one static shape, almost no padding.
    /// Choose T near the batch size x the mean stored length to keep the steps per epoch.
    #[cfg_attr(feature = "cli", arg(long, value_name = "T"))]
    pub pack: Option<usize>,
    /// The most sequences in a pack [default: from T and the stored lengths, so that it almost
    /// never binds].
    #[cfg_attr(feature = "cli", arg(long, value_name = "S"))]
    pub max_seqs: Option<usize>,
    /// Windows of long series: each sample is W consecutive stored steps of one context,
    /// starting at a multiple of the stride, shuffled across all contexts (the cache holds
    /// each series whole: compile with a max length as long as the longest).
    #[cfg_attr(
        feature = "cli",
        arg(long, value_name = "W", help_heading = "Series windows")
    )]
    pub series_window: Option<usize>,
    /// Steps between a series' window starts [default: the window, no overlap].
    #[cfg_attr(
        feature = "cli",
        arg(long, value_name = "S", help_heading = "Series windows")
    )]
    pub stride: Option<usize>,
    /// Steps after each window given as its target (`y_next`) [default: 0].
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            value_name = "H",
            default_value_t = 0,
            help_heading = "Series windows"
        )
    )]
    pub horizon: usize,
    /// Columns of x the target takes [default: all].
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            value_delimiter = ',',
            value_name = "COL,..",
            help_heading = "Series windows"
        )
    )]
    pub horizon_columns: Vec<String>,
    /// Keep windows that run past the end of their series, zero-padded (otherwise only whole
    /// windows, with their whole horizon, are kept).
    #[cfg_attr(feature = "cli", arg(long, help_heading = "Series windows"))]
    pub pad_windows: bool,
    /// Cut each padded batch to its longest sequence (`bucket` always does). The command line
    /// decides it per command.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub trim: bool,
    /// Round each trimmed batch's length up the ladder of M (M, 2M, 3M, 4M, then four sizes
    /// per doubling, at most L), so that a run sees a handful of batch shapes [default: 16 on
    /// a GPU, 1 (exact lengths) elsewhere].
    #[cfg_attr(feature = "cli", arg(long, value_name = "M"))]
    pub trim_multiple: Option<usize>,
}

impl ShapeArgs {
    /// The shape these keys ask for, or the first key that does not fit.
    pub fn batches(&self) -> Result<Batches, OptionError> {
        for (key, value) in [("pack", self.pack), ("max_seqs", self.max_seqs)] {
            if value == Some(0) {
                return Err(OptionError::given(key, 0, "must be at least 1"));
            }
        }
        if self.pack.is_none() && self.max_seqs.is_some() {
            return Err(OptionError::new(
                "max_seqs",
                "sizes packed batches: give `pack` too",
            ));
        }
        let windows = match self.series_window {
            Some(len) => Some(SeriesWindows {
                len,
                stride: self.stride.unwrap_or(len),
                horizon: self.horizon,
                horizon_columns: self.horizon_columns.clone(),
                pad: self.pad_windows,
            }),
            None => {
                let given = [
                    ("stride", self.stride.is_some()),
                    ("horizon", self.horizon > 0),
                    ("horizon_columns", !self.horizon_columns.is_empty()),
                    ("pad_windows", self.pad_windows),
                ];
                if let Some((key, _)) = given.iter().find(|(_, given)| *given) {
                    return Err(OptionError::new(
                        "series_window",
                        format!(
                            "is missing: `{key}` shapes series windows; pass `series_window` too"
                        ),
                    ));
                }
                None
            }
        };
        let pack = self.pack.map(|tokens| Pack {
            tokens,
            max_seqs: self.max_seqs,
        });
        let batches = Batches::from_options(self.bucket, pack, windows)?;
        if self.trim {
            batches.check_trim()?;
        }
        if let Some(m) = self.trim_multiple {
            check_trim_multiple(m)?;
            // A multiple given for shapes without padding would be ignored without a word.
            if !batches.is_padded() {
                return Err(OptionError::new(
                    "trim_multiple",
                    "rounds trimmed lengths; packs and series windows have one shape already",
                ));
            }
        }
        Ok(batches)
    }

    /// How padded batches of `batches` are trimmed: with `trim` or `bucket`, up the ladder of
    /// `trim_multiple`, else of `default_multiple`; `None` for untrimmed batches and for shapes
    /// without padding.
    pub fn trim_for(&self, batches: &Batches, default_multiple: usize) -> Option<usize> {
        (batches.is_padded() && (self.trim || self.bucket))
            .then(|| self.trim_multiple.unwrap_or(default_multiple))
    }
}

/// Several caches read as one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default)]
pub struct MixArgs {
    /// A mix's weights, one per cache, in their order (normalised): every shuffle window holds
    /// each cache within one context of its weight, and a cache that runs out continues with
    /// its next epoch [default: the caches' sizes, as if they were one].
    #[cfg_attr(
        feature = "cli",
        arg(long, value_delimiter = ',', value_name = "W,W,..")
    )]
    pub weights: Option<Vec<f64>>,
    /// Positions in an epoch of a mix [default: the caches' contexts together].
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub mix_samples: Option<usize>,
    /// A mix's schedule, a JSON file of stages: `[{"at": 0, "weights": [0.9, 0.1]}, {"at":
    /// 32000, "weights": [0.3, 0.7], "linear": true}]`. Each stage starts at a sample position
    /// of the run (epoch x positions per mix epoch + position; the trainers also take `"step":
    /// N`, an optimizer step) and weighs the caches from there on (0 leaves a cache out); a
    /// `linear` stage moves there from the previous stage's weights. A stage takes effect from
    /// the first window of positions that starts at or after it. Not with --weights, which is
    /// the schedule of one stage [default: none].
    #[cfg_attr(
        feature = "cli",
        arg(long, value_name = "FILE", value_parser = read_schedule)
    )]
    pub schedule: Option<Stages>,
}

/// A schedule's stages as given (`--schedule FILE`, or `schedule` in JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Stages(pub Vec<StageArg>);

impl Stages {
    /// The stages of a loader's schedule, each at its sample position.
    pub fn at(stages: &[Stage]) -> Stages {
        Stages(
            stages
                .iter()
                .map(|s| StageArg {
                    at: Some(s.at),
                    step: None,
                    weights: s.weights.clone(),
                    linear: s.linear,
                })
                .collect(),
        )
    }
}

/// One stage of a schedule as given: where it starts (a sample position, or, for a trainer,
/// an optimizer step), its weights, and whether it is reached linearly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageArg {
    /// The sample position of the run the stage starts at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<u64>,
    /// The optimizer step it starts at (the trainers convert it with their global batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// One weight per cache, at least 0.
    pub weights: Vec<f64>,
    /// Reached by moving from the previous stage's weights over the span between them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub linear: bool,
}

/// The stages of a schedule file (`--schedule FILE`): a JSON list of stages.
#[cfg(feature = "cli")]
fn read_schedule(path: &str) -> Result<Stages, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "{path} is not a schedule: {e}; expected a JSON list of stages such as \
             [{{\"at\": 0, \"weights\": [0.9, 0.1]}}, {{\"at\": 32000, \"weights\": [0.3, \
             0.7], \"linear\": true}}]"
        )
    })
}

impl MixArgs {
    /// These keys with a schedule's stages given by optimizer step placed at their sample
    /// position, `per_step` samples a step ([`MixArgs::stages`]): what a trainer whose step is
    /// not the loader's (gradient accumulation) hands the loader.
    pub fn in_samples(&self, per_step: Option<u64>) -> Result<MixArgs, OptionError> {
        let schedule = match &self.schedule {
            Some(_) => Some(Stages::at(&self.stages(per_step)?)),
            None => None,
        };
        Ok(MixArgs {
            schedule,
            ..self.clone()
        })
    }

    /// The stages of the schedule in sample positions: a stage given by optimizer step starts
    /// at `step * per_step` samples (`per_step`: samples per optimizer step, `None` where a
    /// step has no fixed number of samples, as with packs).
    pub fn stages(&self, per_step: Option<u64>) -> Result<Vec<Stage>, OptionError> {
        let Some(Stages(stages)) = &self.schedule else {
            return Ok(Vec::new());
        };
        if stages.is_empty() {
            return Err(OptionError::new(
                "schedule",
                "names no stage: give at least one, starting at 0 (or leave it out)",
            ));
        }
        stages
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let at = match (s.at, s.step) {
                    (Some(at), None) => at,
                    (None, Some(step)) => {
                        let Some(per) = per_step else {
                            return Err(OptionError::new(
                                "schedule",
                                format!(
                                    "stage {i} starts at step {step}: a packed step holds no \
                                     fixed number of samples, so give its sample position \
                                     (`at`)"
                                ),
                            ));
                        };
                        step.checked_mul(per).ok_or_else(|| {
                            OptionError::new(
                                "schedule",
                                format!("stage {i}: step {step} x {per} samples overflows"),
                            )
                        })?
                    }
                    _ => {
                        return Err(OptionError::new(
                            "schedule",
                            format!(
                                "stage {i} gives {}: a stage starts at a sample position \
                                 (`at`) or an optimizer step (`step`), one of them",
                                if s.at.is_some() {
                                    "both `at` and `step`"
                                } else {
                                    "neither `at` nor `step`"
                                }
                            ),
                        ))
                    }
                };
                Ok(Stage {
                    at,
                    weights: s.weights.clone(),
                    linear: s.linear,
                })
            })
            .collect()
    }
}

/// The size of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default)]
pub struct BatchArgs {
    /// Contexts per batch on each rank (in dsc-train, per micro-batch); packed batches hold as
    /// many as fit their tokens instead, and use it only in reports.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = DEFAULT_BATCH_SIZE))]
    pub batch_size: usize,
}

impl Default for BatchArgs {
    fn default() -> Self {
        BatchArgs {
            batch_size: DEFAULT_BATCH_SIZE,
        }
    }
}

/// Which epoch, and this rank's share of each of its steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default)]
pub struct RankArgs {
    /// The epoch: each has its own order.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub epoch: u64,
    /// This rank.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub rank: usize,
    /// Number of ranks.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub world_size: usize,
}

impl Default for RankArgs {
    fn default() -> Self {
        let d = LoaderOptions::default();
        RankArgs {
            epoch: d.epoch,
            rank: d.rank,
            world_size: d.world_size,
        }
    }
}

impl EpochArgs {
    /// The order these keys, `batches` and `mix` ask for (a schedule's steps converted at
    /// `per_step` samples, [`MixArgs::stages`]).
    pub fn order(
        &self,
        batches: Batches,
        mix: &MixArgs,
        per_step: Option<u64>,
    ) -> Result<OrderSpec, OptionError> {
        Ok(OrderSpec {
            split: self.split.clone(),
            seed: self.seed,
            shuffle: self.shuffle,
            window: self.window,
            interleave: self.interleave,
            drop_last: self.drop_last,
            batches,
            weights: mix.weights.clone().unwrap_or_default(),
            schedule: mix.stages(per_step)?,
            mix_samples: mix.mix_samples,
        })
    }
}

/// Every key of a loader, flat: what `dsc.Loader` sends ([`LoaderArgs::from_json`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoaderArgs {
    /// The order.
    #[serde(flatten)]
    pub epoch: EpochArgs,
    /// The batch shape.
    #[serde(flatten)]
    pub shape: ShapeArgs,
    /// A mix.
    #[serde(flatten)]
    pub mix: MixArgs,
    /// The size of a batch.
    #[serde(flatten)]
    pub batch: BatchArgs,
    /// The rank's share.
    #[serde(flatten)]
    pub rank: RankArgs,
    /// Background threads preparing batches (0: in the caller's thread).
    pub threads: usize,
    /// Batches prepared ahead per thread.
    pub prefetch: usize,
    /// The tensors to load, by name; empty loads every tensor.
    pub columns: Vec<String>,
}

impl Default for LoaderArgs {
    fn default() -> Self {
        let d = LoaderOptions::default();
        LoaderArgs {
            epoch: EpochArgs::default(),
            shape: ShapeArgs::default(),
            mix: MixArgs::default(),
            batch: BatchArgs::default(),
            rank: RankArgs::default(),
            threads: d.threads,
            prefetch: d.prefetch,
            columns: d.columns,
        }
    }
}

/// Every key of [`LoaderArgs`], in declaration order: the fields of the groups, then the
/// loader's own (a test holds it equal to the fields).
pub const KEYS: &[&str] = &[
    "split",
    "seed",
    "window",
    "interleave",
    "shuffle",
    "drop_last",
    "bucket",
    "pack",
    "max_seqs",
    "series_window",
    "stride",
    "horizon",
    "horizon_columns",
    "pad_windows",
    "trim",
    "trim_multiple",
    "weights",
    "mix_samples",
    "schedule",
    "batch_size",
    "epoch",
    "rank",
    "world_size",
    "threads",
    "prefetch",
    "columns",
];

/// Every loader flag with its help text, as the groups declare them: what a command that
/// flattens a group shows, and what a test holds a command's own flags of the same name to.
#[cfg(feature = "cli")]
pub fn flag_help() -> Vec<(String, String)> {
    use clap::Args;
    let cmd = clap::Command::new("loader");
    let cmd = EpochArgs::augment_args(cmd);
    let cmd = MixArgs::augment_args(ShapeArgs::augment_args(cmd));
    let cmd = RankArgs::augment_args(BatchArgs::augment_args(cmd));
    cmd.get_arguments()
        .map(|a| {
            let help = a.get_long_help().or(a.get_help()).map(ToString::to_string);
            (a.get_id().to_string(), help.unwrap_or_default())
        })
        .collect()
}

/// The flags of `cmd` (and its subcommands) that share a loader flag's name but not its help:
/// `(command, flag)`, except those in `own` (a command's flag of the same name that means
/// something else, such as `dsc bench --pack`, which also times a packed epoch).
#[cfg(feature = "cli")]
pub fn flags_with_other_help(cmd: &clap::Command, own: &[(&str, &str)]) -> Vec<(String, String)> {
    let shared = flag_help();
    let mut out = Vec::new();
    let mut visit = vec![cmd.clone()];
    while let Some(c) = visit.pop() {
        for a in c.get_arguments() {
            let id = a.get_id().as_str();
            let Some((_, help)) = shared.iter().find(|(k, _)| k == id) else {
                continue;
            };
            let mine = a.get_long_help().or(a.get_help()).map(ToString::to_string);
            let name = c.get_name().to_string();
            if mine.as_deref() != Some(help.as_str()) && !own.contains(&(name.as_str(), id)) {
                out.push((name, id.to_string()));
            }
        }
        visit.extend(c.get_subcommands().cloned());
    }
    out
}

impl LoaderArgs {
    /// The keys of a JSON object read, each checked by the rule that owns it: an unknown key,
    /// a value of the wrong type or one the loader refuses is an [`OptionError`] naming its
    /// key. `default_trim_multiple` is the caller's ladder for trimmed batches (16 on a GPU).
    pub fn from_json(json: &str, default_trim_multiple: usize) -> Result<LoaderOptions, LoadError> {
        let value: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| OptionError::new("options", format!("not a JSON object: {e}")))?;
        let serde_json::Value::Object(given) = value else {
            return Err(OptionError::new("options", "not a JSON object").into());
        };
        let mut fields = dsc_format::spelling::fields(&LoaderArgs::default());
        dsc_format::spelling::check_each_key::<LoaderArgs>(&fields, &given, KEYS, "options")?;
        fields.extend(given);
        let args: LoaderArgs = serde_json::from_value(fields.into())
            .map_err(|e| OptionError::new("options", e.to_string()))?;
        args.options(default_trim_multiple)
    }

    /// The keys that ask for `opts` (the inverse of [`LoaderArgs::options`]): how a front end
    /// reads back what the loader resolved, by the keys it gave, not by the state's spelling.
    pub fn of(opts: &LoaderOptions) -> LoaderArgs {
        let order = &opts.order;
        let pack = order.batches.pack();
        let windows = order.batches.windows();
        LoaderArgs {
            epoch: EpochArgs {
                split: order.split.clone(),
                seed: order.seed,
                window: order.window,
                interleave: order.interleave,
                shuffle: order.shuffle,
                drop_last: order.drop_last,
            },
            shape: ShapeArgs {
                bucket: order.batches.is_bucketed(),
                pack: pack.map(|p| p.tokens),
                max_seqs: pack.and_then(|p| p.max_seqs),
                series_window: windows.map(|w| w.len),
                stride: windows.map(|w| w.stride),
                horizon: windows.map_or(0, |w| w.horizon),
                horizon_columns: windows.map_or_else(Vec::new, |w| w.horizon_columns.clone()),
                pad_windows: windows.is_some_and(|w| w.pad),
                trim: opts.trim.is_some(),
                trim_multiple: opts.trim,
            },
            mix: MixArgs {
                weights: (!order.weights.is_empty()).then(|| order.weights.clone()),
                mix_samples: order.mix_samples,
                schedule: (!order.schedule.is_empty()).then(|| Stages::at(&order.schedule)),
            },
            batch: BatchArgs {
                batch_size: opts.batch_size,
            },
            rank: RankArgs {
                epoch: opts.epoch,
                rank: opts.rank,
                world_size: opts.world_size,
            },
            threads: opts.threads,
            prefetch: opts.prefetch,
            columns: opts.columns.clone(),
        }
    }

    /// The loader options these keys ask for.
    pub fn options(&self, default_trim_multiple: usize) -> Result<LoaderOptions, LoadError> {
        if self.mix.weights.as_ref().is_some_and(Vec::is_empty) {
            return Err(OptionError::new(
                "weights",
                "names no weight: one positive number per cache (or none for the caches' sizes)",
            )
            .into());
        }
        let batches = self.shape.batches()?;
        let trim = self.shape.trim_for(&batches, default_trim_multiple);
        // A step of a loader is a global batch of contexts (of packs: no fixed number).
        let per_step = match batches.pack() {
            Some(_) => None,
            None => {
                Some((self.batch.batch_size as u64).saturating_mul(self.rank.world_size as u64))
            }
        };
        let opts = LoaderOptions {
            order: self.epoch.order(batches, &self.mix, per_step)?,
            batch_size: self.batch.batch_size,
            epoch: self.rank.epoch,
            skip: 0,
            rank: self.rank.rank,
            world_size: self.rank.world_size,
            prefetch: self.prefetch,
            threads: self.threads,
            trim,
            columns: self.columns.clone(),
        };
        opts.check()?;
        Ok(opts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a front end reads back is what it gave: every shape, trimmed or not, mixed or not.
    #[test]
    fn the_keys_of_resolved_options_give_them_again() {
        for json in [
            r#"{}"#,
            r#"{"bucket": true, "trim_multiple": 16, "seed": 3}"#,
            r#"{"pack": 4096, "max_seqs": 40, "rank": 1, "world_size": 2}"#,
            r#"{"series_window": 48, "stride": 4, "horizon": 2, "horizon_columns": ["a"],
                "pad_windows": true}"#,
            r#"{"trim": true, "weights": [0.7, 0.3], "mix_samples": 100, "columns": ["x"]}"#,
        ] {
            let opts = LoaderArgs::from_json(json, 16).unwrap();
            assert_eq!(LoaderArgs::of(&opts).options(16).unwrap(), opts, "{json}");
        }
    }

    #[test]
    fn the_keys_are_the_fields() {
        let fields = dsc_format::spelling::fields(&LoaderArgs::default());
        assert_eq!(fields.keys().collect::<Vec<_>>(), KEYS);
    }

    #[test]
    fn the_default_keys_are_the_default_options() {
        assert_eq!(
            LoaderArgs::default().options(1).unwrap(),
            LoaderOptions::default()
        );
        assert_eq!(
            LoaderArgs::from_json("{}", 1).unwrap(),
            LoaderOptions::default()
        );
    }

    #[test]
    fn each_key_is_checked_by_name() {
        let err = |json: &str| LoaderArgs::from_json(json, 1).unwrap_err().to_string();
        assert!(err(r#"{"bucket": true, "pack": 4096}"#).contains("`pack`"));
        assert!(err(r#"{"batch_size": "big"}"#).contains("batch_size"));
        assert!(err(r#"{"stride": 4}"#).contains("`stride`"));
        assert!(err(r#"{"trim": true, "series_window": 8}"#).contains("`trim`"));
        assert!(err(r#"{"trim_multiple": 16, "pack": 4096}"#).contains("trim_multiple"));
        let unknown = err(r#"{"bucket_size": 4}"#);
        assert!(
            unknown.contains("bucket_size") && unknown.contains("trim_multiple"),
            "{unknown}"
        );
        let opts = LoaderArgs::from_json(r#"{"bucket": true, "seed": 3}"#, 16).unwrap();
        assert_eq!(opts.trim, Some(16), "a bucketed batch is cut");
        assert_eq!(
            (opts.order.seed, opts.order.batches),
            (3, Batches::Bucketed)
        );
    }

    #[cfg(feature = "cli")]
    #[test]
    fn the_flags_are_the_keys() {
        let flags: Vec<String> = flag_help().into_iter().map(|(id, _)| id).collect();
        let own = ["threads", "prefetch", "columns", "trim"];
        let expected: Vec<&str> = KEYS.iter().copied().filter(|k| !own.contains(k)).collect();
        assert_eq!(flags, expected);
    }
}
