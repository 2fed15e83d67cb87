//! Padded batches: `batch_size` whole contexts per rank and step, in the epoch's order or
//! length-bucketed ([`crate::order::EpochOrder::bucketed`]), each padded to `L` or trimmed to
//! its longest stored sequence ([`crate::order::trimmed_len`]). A mix's source of a shorter
//! `L` is padded to the longest.

use super::Batching;
use super::{is_sequence, Gather, Resolved};
use crate::options::LoaderOptions;
use crate::order::{Sample, Steps};
use crate::rows;

/// `opts`' epoch of `contexts` positions cut in batches of `batch_size` per rank: trimmed as
/// asked, and a bucketed one always (to exact lengths unless a multiple is given).
pub(crate) fn batching(contexts: usize, opts: &LoaderOptions) -> Batching {
    let o = &opts.order;
    Batching::Padded {
        steps: Steps::new(contexts, opts.batch_size, opts.world_size, o.drop_last)
            .after(opts.skip, o.drop_last),
        trim: match opts.trim {
            None if o.batches.is_bucketed() => Some(1),
            trim => trim,
        },
    }
}

impl Gather {
    /// Copies `samples`, cut to `seq_len`, from their shards (`held`: the compressed ones)
    /// into `dst`.
    pub(crate) fn gather_padded(
        &self,
        samples: &[Sample],
        held: &Resolved<'_>,
        seq_len: usize,
        dst: &mut [&mut [u8]],
    ) {
        // Everything but the copies is looked up once per batch or tensor: at a few dozen
        // nanoseconds per sample and tensor, the lookups cost a sixth of the gather.
        let bodies: Vec<&[u8]> = samples.iter().map(|s| self.shard_bytes(s, held)).collect();
        let short = samples.iter().any(|s| self.source(s).max_len < seq_len);
        for (t, out) in dst.iter_mut().enumerate() {
            let n = self.copy_bytes(t, seq_len);
            if n == 0 {
                continue;
            }
            let count = samples.len();
            let starts: Vec<usize> = samples
                .iter()
                .map(|s| self.source(s).range(s, t).0)
                .collect();
            if short && is_sequence(self.spec(t)) {
                // A mix's source of a shorter L: its steps, then zeros to `seq_len`.
                let step = n / seq_len.max(1);
                for (i, (row, s)) in out.chunks_exact_mut(n).zip(samples).enumerate() {
                    let k = step * self.source(s).max_len.min(seq_len);
                    row[..k].copy_from_slice(&bodies[i][starts[i]..starts[i] + k]);
                    row[k..].fill(0);
                }
                continue;
            }
            rows::gather(&mut out[..count * n], n, count, |i| {
                &bodies[i][starts[i]..starts[i] + n]
            });
        }
    }
}
