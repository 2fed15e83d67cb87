//! The contexts an epoch runs over, shard by shard: every context a split's shards store, less
//! those a later generation hides (an append that replaced their keys, FORMAT.md §14, "Removed rows").
//!
//! An epoch order is built over the contexts a reader sees, so that hidden ones take no place in
//! any window, batch or step count; the samples it yields name stored offsets and compiled
//! positions, so that everything read by position (lengths, rows, keys) reads the shards as they
//! are. A split that hides nothing maps each offset to itself, at no cost.

use std::sync::Arc;

/// One split's contexts per shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitContexts {
    /// Per shard: contexts stored.
    stored: Vec<usize>,
    /// Per shard: contexts a reader sees.
    live: Vec<usize>,
    /// Per shard that hides any: the stored offsets of its live contexts, in order.
    kept: Vec<Option<Arc<[u32]>>>,
}

impl SplitContexts {
    /// Shards holding `sizes` contexts each, none hidden.
    pub fn all(sizes: &[usize]) -> SplitContexts {
        SplitContexts {
            stored: sizes.to_vec(),
            live: sizes.to_vec(),
            kept: vec![None; sizes.len()],
        }
    }

    /// Shards given as (contexts stored, increasing offsets of those hidden).
    pub fn hiding<'a>(shards: impl IntoIterator<Item = (usize, &'a [u32])>) -> SplitContexts {
        let mut out = SplitContexts::all(&[]);
        for (stored, removed) in shards {
            out.stored.push(stored);
            if removed.is_empty() {
                out.live.push(stored);
                out.kept.push(None);
                continue;
            }
            let mut gone = removed.iter().map(|&r| r as usize).peekable();
            let kept: Arc<[u32]> = (0..stored)
                .filter(|&o| match gone.peek() {
                    Some(&r) if r == o => {
                        gone.next();
                        false
                    }
                    _ => true,
                })
                .map(|o| o as u32)
                .collect();
            out.live.push(kept.len());
            out.kept.push(Some(kept));
        }
        out
    }

    /// The contexts of shards `entries`, hiding the rows each lists as removed.
    pub fn of_entries<'a>(
        entries: impl IntoIterator<Item = &'a dsc_format::ShardEntry>,
    ) -> SplitContexts {
        SplitContexts::hiding(entries.into_iter().map(|e| (e.contexts, &e.removed[..])))
    }

    /// Contexts a reader sees, per shard.
    pub fn live(&self) -> &[usize] {
        &self.live
    }

    /// Contexts stored, per shard.
    pub fn stored(&self) -> &[usize] {
        &self.stored
    }

    /// Contexts a reader sees in the split.
    pub fn len(&self) -> usize {
        self.live.iter().sum()
    }

    /// True when a reader sees no context.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Contexts stored in the split (live and hidden).
    pub fn stored_len(&self) -> usize {
        self.stored.iter().sum()
    }

    /// Shards.
    pub fn shards(&self) -> usize {
        self.stored.len()
    }

    /// Whether any context is hidden.
    pub fn hides_any(&self) -> bool {
        self.kept.iter().any(Option::is_some)
    }

    /// The stored offset of the `live`-th context a reader sees in shard `shard`.
    pub fn stored_offset(&self, shard: usize, live: usize) -> usize {
        match &self.kept[shard] {
            None => live,
            Some(kept) => kept[live] as usize,
        }
    }

    /// The compiled positions (counting every stored context) of the contexts a reader sees,
    /// in order.
    pub fn positions(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.len());
        let mut start = 0;
        for (shard, &n) in self.stored.iter().enumerate() {
            out.extend((0..self.live[shard]).map(|live| start + self.stored_offset(shard, live)));
            start += n;
        }
        out
    }

    /// `lengths` (one per stored context, compiled order) with every hidden context's set to 0:
    /// what series windows count, so that a hidden context has no window.
    pub fn zero_hidden(&self, lengths: &[u32]) -> Vec<u32> {
        let mut out = vec![0; lengths.len()];
        for at in self.positions() {
            out[at] = lengths[at];
        }
        out
    }
}

impl From<&[usize]> for SplitContexts {
    fn from(sizes: &[usize]) -> SplitContexts {
        SplitContexts::all(sizes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_contexts_are_skipped_and_live_ones_keep_their_stored_offsets() {
        let c = SplitContexts::hiding([(4, &[1u32, 3][..]), (3, &[][..]), (2, &[0u32, 1][..])]);
        assert_eq!(c.live(), &[2, 3, 0]);
        assert_eq!((c.len(), c.stored_len(), c.shards()), (5, 9, 3));
        assert!(c.hides_any());
        assert_eq!((c.stored_offset(0, 0), c.stored_offset(0, 1)), (0, 2));
        assert_eq!(c.stored_offset(1, 2), 2);
        let lengths = [5, 6, 7, 8, 1, 2, 3, 9, 9];
        assert_eq!(c.zero_hidden(&lengths), vec![5, 0, 7, 0, 1, 2, 3, 0, 0]);
        assert_eq!(c.positions(), vec![0, 2, 4, 5, 6]);
        assert!(!SplitContexts::all(&[3, 4]).hides_any());
    }
}
