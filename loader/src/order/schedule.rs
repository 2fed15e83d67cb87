//! A mix's schedule: the weights of its sources along the run, as whole blocks of positions
//! count them.
//!
//! A run of a mix is one sequence of positions across its epochs: position `p` of epoch `e` is
//! global position `g = e * M + p` (`M` positions per mix epoch). A schedule is a list of
//! [`Stage`]s, each starting at a global position with one weight per source; a linear stage
//! moves from the previous stage's weights to its own over the span between them, in at most
//! [`MAX_RAMP_STEPS`] steps of constant weights. The result is a list of *pieces* of constant
//! weights ([`Schedule`]); a block of positions takes the weights of the piece in force at its
//! first position, so a stage (or a step of a ramp) takes effect from the first block that
//! starts at or after it.
//!
//! Inside an epoch, the blocks of one piece form a *segment*, and a segment is drawn as a mix of
//! fixed weights has always been: its first `n` positions hold `apportion(w, n)[s]` of source
//! `s`, so every whole-block prefix of a segment holds each source within one position of its
//! weight, and a one-stage schedule (`weights=`) is today's order to the bit. The draws of each
//! source before any position are sums over segments, and every epoch whose blocks all lie in
//! one piece draws the same counts, so a position of any epoch is found in O(pieces), never by
//! replaying the run.

use serde::{Deserialize, Serialize};

/// Positions of each source among `n`: `n × weight` (normalised) rounded by largest remainder,
/// ties to the lower source. A source of weight 0 has none.
pub fn apportion(weights: &[f64], n: usize) -> Vec<usize> {
    let sum: f64 = weights.iter().sum();
    let quotas: Vec<f64> = weights.iter().map(|w| w / sum * n as f64).collect();
    let mut counts: Vec<usize> = quotas.iter().map(|q| q.floor() as usize).collect();
    let mut rest: Vec<usize> = (0..weights.len()).filter(|&s| weights[s] > 0.0).collect();
    rest.sort_by(|&a, &b| {
        let (fa, fb) = (quotas[a] - quotas[a].floor(), quotas[b] - quotas[b].floor());
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    let short = n.saturating_sub(counts.iter().sum());
    for &s in rest.iter().take(short) {
        counts[s] += 1;
    }
    counts
}

/// One stage of a schedule: from global position `at` on, the sources in proportion to
/// `weights` (one per source, at least zero, normalised); `linear`: reached by moving from the
/// previous stage's weights over the span between the two stages.
///
/// A cache that enters mid-run, and the schedule amended at a checkpoint (docs/GUIDE.md,
/// "Mixing caches"):
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # for (name, seed) in [("a", 1), ("b", 2)] {
/// #     let sample = dsc_gen::icecube::IcecubeOptions {
/// #         files: 1, events_per_file: 400, seed, ..Default::default()
/// #     };
/// #     dsc_gen::icecube::generate(&dir.path().join(name), &sample)?;
/// #     let rows = dir.path().join(name).join("train/batch_*.parquet");
/// #     let mut spec = dsc_compiler::CompileSpec::new(vec![rows.display().to_string()], "event_id");
/// #     spec.features = vec!["time".into(), "charge".into()];
/// #     spec.max_len = Some(64);
/// #     dsc_compiler::compile(&spec, &dsc_compiler::CompileOptions {
/// #         out: dir.path().join(format!("{name}-cache")), force: false, max_memory: None,
/// #         storage: dsc_compiler::Storage::Hot, progress: &dsc_compiler::NoProgress,
/// #     })?;
/// # }
/// # let (path_a, path_b) = (dir.path().join("a-cache"), dir.path().join("b-cache"));
/// use dsc_loader::{Cache, LoaderOptions, Mix, OrderSpec, Stage};
/// let mix = Mix::new(vec![Cache::open(path_a)?, Cache::open(path_b)?])?;
/// let stage = |at, weights: &[f64], linear| Stage { at, weights: weights.to_vec(), linear };
/// // b out for the first 1,000 samples of the run, then moved in to a fifth by 2,000.
/// let entering = vec![
///     stage(0, &[1.0, 0.0], false),
///     stage(1_000, &[1.0, 0.0], false),
///     stage(2_000, &[0.8, 0.2], true),
/// ];
/// let at = |schedule: Vec<Stage>| LoaderOptions {
///     order: OrderSpec { schedule, window: 250, mix_samples: Some(4_000), ..Default::default() },
///     batch_size: 100,
///     ..Default::default()
/// };
/// // A curriculum: mostly a at first, annealed to mostly b by sample 3,000.
/// let curriculum = vec![stage(0, &[0.9, 0.1], false), stage(3_000, &[0.3, 0.7], true)];
/// let batches = mix.loader(at(curriculum))?.count();
/// assert_eq!(batches, 40);
/// let mut loader = mix.loader(at(entering.clone()))?;
/// for batch in (&mut loader).take(15) {
///     batch?;
/// }
/// let state = loader.state();                     // at sample 1,500; records its schedule
/// // Amended at the checkpoint: b grows to half by 4,000, after the state's position.
/// let mut grown = entering.clone();
/// grown.push(stage(4_000, &[0.5, 0.5], true));
/// let rest = mix.loader_from_state(at(grown), &state)?;
/// assert_eq!(rest.next_step(), 15);
/// let now = rest.mix_progress().ok_or("a mix")?; // the stage in force, its weights, shares
/// assert_eq!(now.stage, 1);
/// // Moving the ramp's end would change what was drawn: refused, naming the stage.
/// let mut moved = entering;
/// moved[2].at = 2_500;
/// assert!(mix.check_state(&at(moved), &state).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// The global position (epoch × positions per mix epoch + position) the stage starts at.
    pub at: u64,
    /// One weight per source, in their order.
    pub weights: Vec<f64>,
    /// Move linearly from the previous stage's weights, reaching these at `at`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub linear: bool,
}

/// Steps of constant weights a linear stage is cut into at most (fewer when its span holds
/// fewer blocks): each step's weights are the line's at the step's middle. A bound on the
/// pieces, so that finding a position stays cheap whatever the span.
pub const MAX_RAMP_STEPS: u64 = 256;

/// Pieces of constant weights along the run, in order of their start.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pieces: Vec<Piece>,
    /// Positions per mix epoch (`M`).
    epoch_len: u64,
    /// Positions per block.
    block: u64,
}

/// Constant weights from `start` to the next piece's start.
#[derive(Debug, Clone, PartialEq)]
struct Piece {
    start: u64,
    /// Normalised weights.
    weights: Vec<f64>,
    /// The stage whose span the piece belongs to: the one in force (a ramp's pieces belong to
    /// the stage the ramp starts from).
    stage: usize,
}

/// A run of blocks of one epoch in one piece.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// The segment's first block in the epoch.
    pub first: usize,
    /// The block after its last.
    pub end: usize,
    /// The piece's index.
    piece: usize,
}

impl Schedule {
    /// The pieces of `stages` (checked: the first at 0, starts increasing, one weight per
    /// source, positive sums) for epochs of `epoch_len` positions in blocks of `block`. A
    /// ramp's weight that falls under one position of a block is taken as zero (the source
    /// enters at its first whole position, or retires after its last), so that every block
    /// holds each source it draws at least once in its own right.
    pub fn new(stages: &[Stage], epoch_len: u64, block: u64) -> Schedule {
        let block = block.max(1);
        let normal = |w: &[f64]| {
            let sum: f64 = w.iter().sum();
            w.iter().map(|x| x / sum).collect::<Vec<f64>>()
        };
        let mut pieces = Vec::new();
        for (i, stage) in stages.iter().enumerate() {
            let next = stages.get(i + 1).filter(|n| n.linear);
            let Some(next) = next else {
                pieces.push(Piece {
                    start: stage.at,
                    weights: normal(&stage.weights),
                    stage: i,
                });
                continue;
            };
            let (from, to) = (normal(&stage.weights), normal(&next.weights));
            let span = next.at - stage.at;
            let steps = (span / block).clamp(1, MAX_RAMP_STEPS);
            for j in 0..steps {
                let start =
                    stage.at + (u128::from(span) * u128::from(j) / u128::from(steps)) as u64;
                let t = (j as f64 + 0.5) / steps as f64;
                let line: Vec<f64> = from.iter().zip(&to).map(|(a, b)| a + (b - a) * t).collect();
                let mut kept: Vec<f64> = line
                    .iter()
                    .map(|&w| if w * block as f64 >= 1.0 { w } else { 0.0 })
                    .collect();
                if kept.iter().all(|&w| w == 0.0) {
                    // More sources between two stages than a block has positions (a window
                    // of 2 moving from two sources to two others): the largest stays.
                    let top = (0..line.len())
                        .max_by(|&a, &b| line[a].total_cmp(&line[b]).then(b.cmp(&a)))
                        .expect("a schedule weighs one source at least");
                    kept[top] = line[top];
                }
                let line = kept;
                pieces.push(Piece {
                    start,
                    weights: normal(&line),
                    stage: i,
                });
            }
        }
        Schedule {
            pieces,
            epoch_len,
            block,
        }
    }

    /// The schedule of fixed `weights` (normalised as given: a mix's order of old).
    pub fn fixed(weights: Vec<f64>, epoch_len: u64, block: u64) -> Schedule {
        Schedule {
            pieces: vec![Piece {
                start: 0,
                weights,
                stage: 0,
            }],
            epoch_len,
            block: block.max(1),
        }
    }

    /// Positions per mix epoch.
    pub fn epoch_len(&self) -> u64 {
        self.epoch_len
    }

    /// Sources mixed.
    pub fn sources(&self) -> usize {
        self.pieces[0].weights.len()
    }

    /// Blocks per epoch (the last may be partial).
    fn blocks(&self) -> u64 {
        self.epoch_len.div_ceil(self.block)
    }

    /// The piece in force at global position `g`.
    fn piece_at(&self, g: u64) -> usize {
        self.pieces
            .partition_point(|p| p.start <= g)
            .saturating_sub(1)
    }

    /// The segments of epoch `epoch`, in order.
    pub fn segments(&self, epoch: u64) -> Vec<Segment> {
        let (m, b) = (self.epoch_len, self.block);
        let first = u128::from(epoch) * u128::from(m);
        let last_block = first + u128::from(self.blocks().saturating_sub(1) * b);
        let mut out = vec![Segment {
            first: 0,
            end: 0,
            piece: self.piece_at(first.min(u64::MAX as u128) as u64),
        }];
        for (i, piece) in self.pieces.iter().enumerate().skip(out[0].piece + 1) {
            let start = u128::from(piece.start);
            if start > last_block {
                break;
            }
            let at = (start - first).div_ceil(u128::from(b)) as usize;
            let last = out.last_mut().expect("one segment at least");
            if at == last.first {
                last.piece = i;
            } else {
                out.push(Segment {
                    first: at,
                    end: 0,
                    piece: i,
                });
            }
        }
        let blocks = self.blocks() as usize;
        for k in 0..out.len() {
            out[k].end = out.get(k + 1).map_or(blocks, |n| n.first);
        }
        out
    }

    /// The weights of a segment.
    pub fn weights(&self, segment: &Segment) -> &[f64] {
        &self.pieces[segment.piece].weights
    }

    /// The stage a segment's blocks belong to.
    pub fn stage(&self, segment: &Segment) -> usize {
        self.pieces[segment.piece].stage
    }

    /// Positions of a segment of an epoch.
    pub fn positions(&self, segment: &Segment) -> u64 {
        let end = (segment.end as u64 * self.block).min(self.epoch_len);
        end - segment.first as u64 * self.block
    }

    /// Each source's draws over the whole of a segment.
    pub fn segment_draws(&self, segment: &Segment) -> Vec<u64> {
        self.drawn(self.weights(segment), self.positions(segment))
    }

    /// The draws of each source among the first `n` positions of a segment of weights `w`,
    /// where `n` ends a block (or the epoch).
    pub fn drawn(&self, w: &[f64], n: u64) -> Vec<u64> {
        let whole = n / self.block * self.block;
        let mut seats: Vec<u64> = apportion(w, whole as usize)
            .into_iter()
            .map(|c| c as u64)
            .collect();
        if n > whole {
            for (s, c) in seats.iter_mut().zip(self.block_counts(w, whole, n - whole)) {
                *s += c as u64;
            }
        }
        seats
    }

    /// Each source's positions in a block of a segment of weights `w`: the block's `len`
    /// positions after the segment's first `a`. A whole block holds the difference of the
    /// apportionments of its end and its start, never negative (every drawn source takes at
    /// least one position of a block); the epoch's last, partial block can meet the paradox of
    /// largest remainders (more positions, a seat fewer), and then a source keeps its seats and
    /// the position is taken from the source furthest over its quota.
    pub fn block_counts(&self, w: &[f64], a: u64, len: u64) -> Vec<usize> {
        let (lo, hi) = (apportion(w, a as usize), apportion(w, (a + len) as usize));
        let mut counts: Vec<i64> = hi
            .iter()
            .zip(&lo)
            .map(|(h, l)| *h as i64 - *l as i64)
            .collect();
        let mut owed: i64 = counts.iter().filter(|c| **c < 0).map(|c| -c).sum();
        for c in counts.iter_mut() {
            *c = (*c).max(0);
        }
        let sum: f64 = w.iter().sum();
        while owed > 0 {
            let over = |s: usize| (lo[s] as i64 + counts[s]) as f64 - w[s] / sum * (a + len) as f64;
            let s = (0..counts.len())
                .filter(|&s| counts[s] > 0)
                .max_by(|&x, &y| over(x).total_cmp(&over(y)).then(y.cmp(&x)))
                .expect("a block's positions are someone's");
            counts[s] -= 1;
            owed -= 1;
        }
        counts.into_iter().map(|c| c as usize).collect()
    }

    /// Each source's draws over the whole of epoch `epoch`.
    fn epoch_draws(&self, epoch: u64) -> Vec<u64> {
        let mut sum = vec![0u64; self.sources()];
        for segment in self.segments(epoch) {
            add_draws(&mut sum, 1, self.segment_draws(&segment));
        }
        sum
    }

    /// Each source's draws in the epochs before `epoch`. An epoch whose first block is in piece
    /// `i` and whose last block starts before the next piece's start lies in piece `i` alone
    /// and draws what every such epoch draws; the other epochs (at most one per piece) are
    /// counted segment by segment.
    pub fn draws_before_epoch(&self, epoch: u64) -> Vec<u64> {
        let (m, b) = (u128::from(self.epoch_len.max(1)), u128::from(self.block));
        let tail = u128::from(self.blocks().saturating_sub(1)) * b;
        let mut sum = vec![0u64; self.sources()];
        let epoch = u128::from(epoch);
        for (i, piece) in self.pieces.iter().enumerate() {
            let next = self.pieces.get(i + 1).map(|n| u128::from(n.start));
            // Epochs whose first position is in the piece.
            let lo = u128::from(piece.start).div_ceil(m);
            let hi = next.map_or(epoch, |n| n.div_ceil(m)).min(epoch);
            if lo >= hi {
                continue;
            }
            // The last of them holds the next piece's start in a later block.
            let mixed = next
                .filter(|&n| n <= (n.div_ceil(m) - 1) * m + tail)
                .map(|n| n.div_ceil(m) - 1)
                .filter(|&e| e < hi);
            let pure = (hi - lo) as u64 - u64::from(mixed.is_some());
            if pure > 0 {
                add_draws(&mut sum, pure, self.drawn(&piece.weights, self.epoch_len));
            }
            if let Some(e) = mixed {
                add_draws(&mut sum, 1, self.epoch_draws(e as u64));
            }
        }
        sum
    }

    /// The realised draws and the target (each block's positions times its weights) of each
    /// source and stage over epochs `epochs`: `(stage, positions, realised, target)` for each
    /// stage with positions there, in order.
    pub fn shares(&self, epochs: std::ops::Range<u64>) -> Vec<StageShare> {
        let mut out: Vec<StageShare> = Vec::new();
        for epoch in epochs {
            for segment in self.segments(epoch) {
                let stage = self.stage(&segment);
                let w = self.weights(&segment);
                let n = self.positions(&segment);
                let drawn = self.drawn(w, n);
                let at = out.iter().position(|s| s.stage == stage);
                let share = match at {
                    Some(k) => &mut out[k],
                    None => {
                        out.push(StageShare {
                            stage,
                            positions: 0,
                            realised: vec![0; w.len()],
                            target: vec![0.0; w.len()],
                        });
                        out.last_mut().expect("just pushed")
                    }
                };
                share.positions += n;
                for s in 0..w.len() {
                    share.realised[s] += drawn[s];
                    share.target[s] += w[s] * n as f64;
                }
            }
        }
        out.sort_by_key(|s| s.stage);
        out
    }

    /// Each source's draws before block `b` of epoch `epoch` (`b` may be the epoch's block
    /// count: its end).
    fn draws_before_block(&self, epoch: u64, b: usize) -> Vec<u64> {
        let mut drawn = self.draws_before_epoch(epoch);
        for segment in self.segments(epoch) {
            let upto = b.min(segment.end);
            if upto <= segment.first {
                break;
            }
            let n = match upto == segment.end {
                true => self.positions(&segment),
                false => ((upto - segment.first) as u64) * self.block,
            };
            add_draws(&mut drawn, 1, self.drawn(self.weights(&segment), n));
        }
        drawn
    }

    /// The block a global position is drawn in from: `(epoch, block)` of the first block that
    /// starts at or after `g`.
    fn block_from(&self, g: u64) -> (u64, usize) {
        let m = self.epoch_len.max(1);
        let (epoch, p) = (g / m, g % m);
        let b = p.div_ceil(self.block);
        match b >= self.blocks() {
            true => (epoch + 1, 0),
            false => (epoch, b as usize),
        }
    }

    /// Where a run stands at global position `g` of `stages` (those this schedule was made
    /// of), each source having drawn `now` since the run began: the stage in force (that of
    /// the block `g` is in), its weights there, and each source's share of the stage's draws
    /// so far.
    pub fn progress(&self, stages: &[Stage], g: u64, now: Vec<u64>) -> Progress {
        let m = self.epoch_len.max(1);
        let block_start = g / m * m + (g % m) / self.block * self.block;
        let piece = &self.pieces[self.piece_at(block_start)];
        let stage = piece.stage;
        let at = stages.get(stage).map_or(0, |s| s.at);
        let (e0, b0) = self.block_from(at);
        let from = self.draws_before_block(e0, b0);
        let drawn: Vec<u64> = now
            .iter()
            .zip(&from)
            .map(|(t, f)| t.saturating_sub(*f))
            .collect();
        let sum = drawn.iter().sum::<u64>().max(1) as f64;
        Progress {
            position: g,
            stage,
            at,
            weights: piece.weights.clone(),
            realised: drawn.iter().map(|&d| d as f64 / sum).collect(),
            drawn,
        }
    }

    /// The first position at or after `g` that starts a block: where weights given from `g`
    /// take effect.
    pub fn effective(&self, g: u64) -> u64 {
        let (epoch, b) = self.block_from(g);
        epoch
            .saturating_mul(self.epoch_len)
            .saturating_add(b as u64 * self.block)
    }
}

/// Adds `n` times each source's `draws` to `sum`.
pub(crate) fn add_draws(sum: &mut [u64], n: u64, draws: Vec<u64>) {
    for (a, d) in sum.iter_mut().zip(draws) {
        *a += n * d;
    }
}

/// Where a run of a mix stands on its schedule ([`Schedule::progress`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Progress {
    /// The global position (epoch × positions per mix epoch + position).
    pub position: u64,
    /// The stage in force (its index in the schedule; 0 for fixed weights).
    pub stage: usize,
    /// The position the stage starts at.
    pub at: u64,
    /// The weights in force (normalised; a linear stage's current step).
    pub weights: Vec<f64>,
    /// Each source's draws in the stage so far.
    pub drawn: Vec<u64>,
    /// Each source's share of them.
    pub realised: Vec<f64>,
}

/// What a stage of a schedule drew over some epochs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageShare {
    /// The stage (its index in the schedule).
    pub stage: usize,
    /// Positions of the stage there.
    pub positions: u64,
    /// Draws of each source.
    pub realised: Vec<u64>,
    /// Each source's positions times its weights, summed.
    pub target: Vec<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::order::{MixOrder, Order, Params, Sample, SplitContexts};
    use dsc_format::rng::Xoshiro256;
    use std::collections::BTreeSet;
    use std::sync::Arc;

    /// Stages over `horizon` positions for `k` sources: whole weights up to 20 (0 included,
    /// never all zero), so that with blocks of 80 or more every drawn source has a position
    /// of a block; some linear.
    fn random_stages(rng: &mut Xoshiro256, k: usize, horizon: u64, from: u64) -> Vec<Stage> {
        let mut stages = Vec::new();
        let mut at = from;
        for i in 0..1 + rng.below(5) {
            let mut weights: Vec<f64> = (0..k)
                .map(|_| match rng.below(3) {
                    0 => 0.0,
                    _ => 1.0 + rng.below(20) as f64,
                })
                .collect();
            if weights.iter().all(|w| *w == 0.0) {
                weights[rng.below(k as u64) as usize] = 1.0;
            }
            let linear = i > 0 && rng.below(2) == 0;
            stages.push(Stage {
                at,
                weights,
                linear,
            });
            at += 1 + rng.below(horizon / 3);
        }
        stages
    }

    struct Case {
        sizes: Vec<Arc<SplitContexts>>,
        samples: u64,
        params: Params,
    }

    impl Case {
        fn random(rng: &mut Xoshiro256) -> Case {
            let k = 2 + rng.below(3) as usize;
            let sizes = (0..k)
                .map(|_| {
                    let shards: Vec<usize> = (0..1 + rng.below(3))
                        .map(|_| 5 + rng.below(200) as usize)
                        .collect();
                    Arc::new(SplitContexts::all(&shards))
                })
                .collect();
            let params = Params {
                shuffle: rng.below(4) != 0,
                seed: rng.below(1000),
                window: 80 + rng.below(220) as usize,
                interleave: 1 + rng.below(3) as usize,
            };
            Case {
                sizes,
                samples: 50 + rng.below(2000),
                params,
            }
        }

        fn order(&self, stages: &[Stage], epoch: u64) -> MixOrder {
            let schedule = Schedule::new(stages, self.samples, self.params.window as u64);
            MixOrder::scheduled(&self.sizes, Arc::new(schedule), self.params, epoch)
        }
    }

    fn all(order: &MixOrder) -> Vec<Sample> {
        Order::Mix(order.clone()).iter_from(0).collect()
    }

    /// Random schedules (weights of 0, linear stages, stages inside a block and across epochs)
    /// over random mixes: each source's draws are whole permutations of its split one after
    /// another, any position resumes on the uninterrupted order, every whole-block prefix of a
    /// segment holds each source within one position of its weight, and a schedule amended
    /// after a position draws the same up to the end of its block.
    #[test]
    fn random_schedules_are_exact_resumable_and_amendable() {
        let mut rng = Xoshiro256::seed_from(55);
        for _ in 0..200 {
            let case = Case::random(&mut rng);
            let k = case.sizes.len();
            let epochs = 4;
            let stages = random_stages(&mut rng, k, epochs * case.samples, 0);
            let mut drawn: Vec<Vec<usize>> = vec![Vec::new(); k];
            let mut before = vec![0u64; k];
            for epoch in 0..epochs {
                let order = case.order(&stages, epoch);
                let samples = all(&order);
                assert_eq!(order.draws_before(0), before, "epoch {epoch}");
                for s in &samples {
                    drawn[s.source].push(s.position);
                }
                before = order.draws_before(samples.len());
                for (s, d) in drawn.iter().enumerate() {
                    assert_eq!(before[s], d.len() as u64, "source {s} epoch {epoch}");
                }
                // Resumed at a random position, by a new order.
                let p = rng.below(samples.len() as u64) as usize;
                let resumed: Vec<Sample> = Order::Mix(case.order(&stages, epoch))
                    .iter_from(p)
                    .collect();
                assert_eq!(resumed, samples[p..]);
                check_blocks(&order, &samples, epoch);
            }
            // Each source's draws: its split once per own epoch, one epoch after another.
            for (s, d) in drawn.iter().enumerate() {
                let len = case.sizes[s].len();
                for chunk in d.chunks(len) {
                    let distinct: BTreeSet<&usize> = chunk.iter().collect();
                    assert_eq!(distinct.len(), chunk.len(), "source {s} repeats a context");
                }
            }
            // Amended after a random position: the same up to the end of its block.
            let g = rng.below(epochs * case.samples);
            let (epoch, p) = (g / case.samples, (g % case.samples) as usize);
            let mut kept: Vec<Stage> = stages.iter().filter(|s| s.at <= g).cloned().collect();
            if let Some(next) = stages.iter().find(|s| s.at > g).filter(|s| s.linear) {
                kept.push(next.clone());
            }
            let from = kept.last().map_or(0, |s| s.at.max(g)) + 1;
            kept.extend(random_stages(&mut rng, k, case.samples, from));
            let block = case.params.window;
            let end = ((p / block + 1) * block).min(case.samples as usize);
            let (old, new) = (case.order(&stages, epoch), case.order(&kept, epoch));
            let (old, new) = (all(&old), all(&new));
            let differs = (0..end).find(|&q| old[q] != new[q]);
            assert_eq!(differs, None, "amended at {g}: {stages:?} then {kept:?}");
        }
    }

    /// A ramp between disjoint sources whose middle gives every source less than a position
    /// of a block keeps the largest: weights that sum to one, never 0/0.
    #[test]
    fn a_ramp_on_a_small_window_keeps_a_source_in_every_step() {
        let stage = |at, weights: [f64; 4], linear| Stage {
            at,
            weights: weights.to_vec(),
            linear,
        };
        let stages = [
            stage(0, [1.0, 1.0, 0.0, 0.0], false),
            stage(40, [0.0, 0.0, 1.0, 1.0], true),
        ];
        let schedule = Schedule::new(&stages, 100, 2);
        for piece in &schedule.pieces {
            let sum: f64 = piece.weights.iter().sum();
            assert!((sum - 1.0).abs() < 1e-12, "{:?}", piece.weights);
        }
    }

    /// Every whole-block prefix of each segment of `order`'s epoch holds each source within
    /// one position of its weight's share.
    fn check_blocks(order: &MixOrder, samples: &[Sample], epoch: u64) {
        let schedule = order.schedule();
        let block = order.block();
        for segment in schedule.segments(epoch) {
            let w = schedule.weights(&segment);
            let mut seen = vec![0u64; w.len()];
            for b in segment.first..segment.end {
                let range = b * block..((b + 1) * block).min(samples.len());
                for s in &samples[range.clone()] {
                    seen[s.source] += 1;
                }
                let n = (range.end - segment.first * block) as f64;
                for (s, &c) in seen.iter().enumerate() {
                    let target = w[s] * n;
                    assert!(
                        (c as f64 - target).abs() < 1.0,
                        "block {b}: source {s} drew {c}, its share is {target}"
                    );
                }
            }
        }
    }
}
