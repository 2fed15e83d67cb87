//! Windows cut from long series: a sample is `len` consecutive stored steps of one context,
//! starting at a multiple of `stride`, with the `horizon` steps after it as a target.
//!
//! The windows of a split are numbered in compiled order (context by context, each context's
//! windows by start step), so that a shard holds a known number of windows and the usual
//! epoch order ([`EpochOrder`]: shards permuted, windows of positions permuted) runs over
//! windows as it runs over contexts: every window once per epoch, shuffled across all contexts,
//! exact resume, disjoint rank slices. Nothing is duplicated on disk: a window is a range of its
//! context's stored steps.

use super::window::{EpochOrder, Sample, WindowCursor};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Windows of long series ([`crate::OrderSpec::series`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeriesWindows {
    /// Steps per window, `W`: the length of every per-step tensor of a batch.
    pub len: usize,
    /// Steps between the starts of a context's windows, `S` (windows overlap when less than
    /// `W`).
    pub stride: usize,
    /// Steps after the window given as its target `y_next` `[H, K]`, `H` [default: 0, none].
    #[serde(default)]
    pub horizon: usize,
    /// Columns of the features tensor `x` the target takes, by name, `K` of them [default: every
    /// column of `x`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub horizon_columns: Vec<String>,
    /// Keep windows that run past the end of their series, zero-padded: a window at step `t`
    /// is kept when `t < length` (its real input steps are `min(W, length - t)`, told by the
    /// batch's `length`; its real target steps by `horizon_length`). Otherwise only whole
    /// windows are kept: `t + W + H <= length` [default: false].
    #[serde(default)]
    pub pad: bool,
}

impl SeriesWindows {
    /// These windows checked against the cache of `manifest`, naming the option at fault: a
    /// cache of sequences (not a table of records), a window of at least one step and at most
    /// the `L` steps stored per context, a stride of at least one, a horizon that ends within
    /// `L` (no stored step lies past it: whole windows could not fit, padded ones would hold
    /// zeros there in every window, and the batch would only grow), target columns named once
    /// and only with a horizon. Every size a loader derives from them then fits in memory's
    /// range.
    pub fn check(
        &self,
        manifest: &dsc_format::Manifest,
    ) -> Result<(), dsc_format::spelling::OptionError> {
        use dsc_format::spelling::OptionError;
        if manifest.is_records() {
            return Err(OptionError::new(
                "series_window",
                "cuts windows from the steps of each context, and this cache is a table of \
                 records (compiled without a key): each row is one sample, without steps",
            ));
        }
        let max_len = manifest.max_len();
        if self.len == 0 {
            return Err(OptionError::given(
                "series_window",
                0,
                "is no window: a window holds at least 1 step",
            ));
        }
        if self.stride == 0 {
            return Err(OptionError::given(
                "stride",
                0,
                "is no stride: windows start at least 1 step apart",
            ));
        }
        if self.len > max_len {
            return Err(OptionError::given(
                "series_window",
                self.len,
                format!(
                    "makes windows longer than the {max_len} steps stored per context (the \
                     cache's L): compile with `max_len` at least the window (and as large as \
                     the longest series, so that none is cut)"
                ),
            ));
        }
        if self
            .len
            .checked_add(self.horizon)
            .is_none_or(|end| end > max_len)
        {
            return Err(OptionError::given(
                "horizon",
                self.horizon,
                format!(
                    "is too far: a window of {} steps and its horizon reach past the {max_len} \
                     steps stored per context, where no step lies (at most {})",
                    self.len,
                    max_len - self.len
                ),
            ));
        }
        if self.horizon == 0 && !self.horizon_columns.is_empty() {
            return Err(OptionError::new(
                "horizon_columns",
                "names target columns, and the horizon is 0 steps: give `horizon` of at least 1",
            ));
        }
        for (i, c) in self.horizon_columns.iter().enumerate() {
            if self.horizon_columns[..i].contains(c) {
                return Err(OptionError::new(
                    "horizon_columns",
                    format!("names {c:?} twice: each target column once"),
                ));
            }
        }
        Ok(())
    }

    /// Windows of a context of `length` stored steps.
    pub fn count(&self, length: usize) -> usize {
        let stride = self.stride.max(1);
        if self.pad {
            length.div_ceil(stride)
        } else {
            match length.checked_sub(self.len + self.horizon) {
                Some(rest) => rest / stride + 1,
                None => 0,
            }
        }
    }

    /// Real input steps of the window at step `start` of a context of `length` steps.
    pub fn input_steps(&self, start: usize, length: usize) -> usize {
        length.saturating_sub(start).min(self.len)
    }

    /// Real target steps of the window at step `start` of a context of `length` steps.
    pub fn target_steps(&self, start: usize, length: usize) -> usize {
        length.saturating_sub(start + self.len).min(self.horizon)
    }
}

/// Where each window of a split lies: per shard, the first window of each of its contexts.
#[derive(Debug)]
pub(crate) struct WindowIndex {
    /// Per shard: the number of windows before each of its contexts, then its total (u64: a
    /// shard of billions of steps at stride 1 holds more than u32 counts).
    before: Vec<Vec<u64>>,
    /// First compiled position of each shard's contexts.
    starts: Vec<usize>,
    /// Windows per shard: the sizes the epoch order runs over.
    pub sizes: Vec<usize>,
}

impl WindowIndex {
    /// The windows of a split whose shards hold `contexts` contexts each, of stored `lengths`
    /// (compiled order).
    pub fn new(windows: &SeriesWindows, contexts: &[usize], lengths: &[u32]) -> WindowIndex {
        let mut before = Vec::with_capacity(contexts.len());
        let mut starts = Vec::with_capacity(contexts.len());
        let mut sizes = Vec::with_capacity(contexts.len());
        let mut at = 0;
        for &n in contexts {
            starts.push(at);
            let mut acc = 0u64;
            let mut counts = Vec::with_capacity(n + 1);
            for &len in &lengths[at..at + n] {
                counts.push(acc);
                acc += windows.count(len as usize) as u64;
            }
            counts.push(acc);
            sizes.push(acc as usize);
            before.push(counts);
            at += n;
        }
        WindowIndex {
            before,
            starts,
            sizes,
        }
    }

    /// The context and first step of window `k` of shard `shard`.
    fn locate(&self, shard: usize, k: usize, stride: usize) -> (usize, usize) {
        let before = &self.before[shard];
        let context = before.partition_point(|&b| b as usize <= k) - 1;
        (context, (k - before[context] as usize) * stride)
    }

    /// The contexts of shard `shard` that windows `lo..hi` of it read, as offsets `a..b`.
    fn contexts(&self, shard: usize, lo: usize, hi: usize) -> (usize, usize) {
        let before = &self.before[shard];
        let a = before.partition_point(|&b| b as usize <= lo) - 1;
        let b = before.partition_point(|&b| (b as usize) < hi);
        (a, b.max(a + 1))
    }
}

/// The order of an epoch of windows: the epoch order over the split's windows, each position
/// turned into its context and first step.
#[derive(Debug, Clone)]
pub struct SeriesOrder {
    order: EpochOrder,
    index: Arc<WindowIndex>,
    windows: SeriesWindows,
}

impl SeriesOrder {
    pub(crate) fn new(order: EpochOrder, index: Arc<WindowIndex>, windows: SeriesWindows) -> Self {
        SeriesOrder {
            order,
            index,
            windows,
        }
    }

    /// The windows.
    pub fn windows(&self) -> &SeriesWindows {
        &self.windows
    }

    /// The order over windows.
    pub fn windows_order(&self) -> &EpochOrder {
        &self.order
    }

    /// Windows in the epoch.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// True when no context holds a window.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The window read at epoch position `p`: its context (`offset`, `position`) and first
    /// step (`step`).
    pub fn sample_at(&self, p: usize, cursor: &mut WindowCursor) -> Sample {
        self.context_of(self.order.sample_at(p, cursor))
    }

    /// A sample of the order over windows as the context and first step it reads.
    fn context_of(&self, w: Sample) -> Sample {
        let (offset, step) = self
            .index
            .locate(w.shard, w.offset, self.windows.stride.max(1));
        Sample {
            offset,
            position: self.index.starts[w.shard] + offset,
            step,
            ..w
        }
    }

    /// The shard context ranges `(shard, first offset, end offset)` that epoch positions
    /// `range` read.
    pub fn spans(&self, range: std::ops::Range<usize>) -> Vec<(usize, usize, usize)> {
        self.order
            .spans(range)
            .into_iter()
            .map(|(shard, lo, hi)| {
                let (a, b) = self.index.contexts(shard, lo, hi);
                (shard, a, b)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windows(len: usize, stride: usize, horizon: usize, pad: bool) -> SeriesWindows {
        SeriesWindows {
            len,
            stride,
            horizon,
            horizon_columns: Vec::new(),
            pad,
        }
    }

    #[test]
    fn whole_windows_fit_their_series_and_padded_ones_start_inside_it() {
        let w = windows(4, 2, 1, false);
        // Starts 0, 2, 4 fit 9 steps (4 + 4 + 1 = 9); 6 would need 11.
        assert_eq!(w.count(9), 3);
        assert_eq!((w.count(5), w.count(4)), (1, 0));
        let p = windows(4, 2, 1, true);
        // Starts 0, 2, 4, 6, 8: every start inside the series.
        assert_eq!(p.count(9), 5);
        assert_eq!((p.input_steps(6, 9), p.target_steps(6, 9)), (3, 0));
        assert_eq!((p.input_steps(4, 9), p.target_steps(4, 9)), (4, 1));
        assert_eq!(p.count(0), 0);
    }

    #[test]
    fn every_window_of_every_context_comes_once_and_none_crosses_two_contexts() {
        let w = windows(3, 2, 1, false);
        let lengths: Vec<u32> = vec![7, 0, 4, 10, 3, 12, 6];
        let contexts = [3, 2, 2];
        let index = Arc::new(WindowIndex::new(&w, &contexts, &lengths));
        for shuffle in [false, true] {
            let order = EpochOrder::new(&index.sizes, shuffle, 5, 2, 4, 2);
            let series = SeriesOrder::new(order, index.clone(), w.clone());
            let mut cursor = WindowCursor::default();
            let mut seen: Vec<(usize, usize)> = (0..series.len())
                .map(|p| series.sample_at(p, &mut cursor))
                .map(|s| {
                    let len = lengths[s.position] as usize;
                    assert!(s.step + w.len + w.horizon <= len, "{s:?} of {len}");
                    assert!(s.step.is_multiple_of(w.stride));
                    (s.position, s.step)
                })
                .collect();
            seen.sort_unstable();
            let want: Vec<(usize, usize)> = lengths
                .iter()
                .enumerate()
                .flat_map(|(p, &len)| (0..w.count(len as usize)).map(move |k| (p, k * 2)))
                .collect();
            assert_eq!(seen, want, "shuffle {shuffle}");
        }
    }
}
