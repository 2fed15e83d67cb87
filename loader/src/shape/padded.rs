//! Padded batches: `batch_size` whole contexts per rank and step, in the epoch's order, each
//! padded to `L` or trimmed to the batch's longest stored sequence ([`trimmed_len`]). A mix's
//! source of a shorter `L` is padded to the longest. Bucketed batches (`bucketed`) are padded
//! batches of an order of like lengths, and are gathered here too.

use super::{Cut, Planning, Shape};
use crate::error::LoadError;
use crate::gather::{is_sequence, Reader, Resolved};
use crate::options::LoaderOptions;
use crate::order::{trimmed_len, Sample, Steps};
use crate::rows;

/// The steps of an epoch of padded batches, and how they are cut.
#[derive(Debug)]
pub(crate) struct Padded {
    pub steps: Steps,
    /// `None`: padded to `L`; `Some(m)`: cut to the batch's longest stored sequence rounded up
    /// the ladder of `m`.
    pub trim: Option<usize>,
}

/// Padded batches of `p.opts` (bucketed ones too): checked against memory, over the epoch's
/// order (a bucketed one always trimmed, to exact lengths unless a multiple is given).
pub(crate) fn plan(p: &Planning<'_>) -> Result<Cut, LoadError> {
    let opts = p.opts;
    p.bound(
        p.rows_bytes(opts.batch_size, 0),
        ("batch_size", opts.batch_size),
    )?;
    let order = super::order(p, opts)?;
    let max_len = p.longest();
    let shape = match opts.order.batches.is_bucketed() {
        true => Shape::Bucketed(Padded::new(order.len(), opts, Some(opts.trim.unwrap_or(1)))),
        false => Shape::Padded(Padded::new(order.len(), opts, opts.trim)),
    };
    Ok(Cut {
        shape,
        layout: p.stored_layout(opts.batch_size, max_len),
        order,
        max_len,
    })
}

impl Padded {
    /// `opts`' epoch of `contexts` positions cut in batches of `batch_size` per rank, trimmed
    /// by `trim`.
    pub fn new(contexts: usize, opts: &LoaderOptions, trim: Option<usize>) -> Padded {
        let drop_last = opts.order.drop_last;
        Padded {
            steps: Steps::new(contexts, opts.batch_size, opts.world_size, drop_last)
                .after(opts.skip, drop_last),
            trim,
        }
    }

    /// The sequence length of a batch of `samples`: `L`, or trimmed its longest stored length
    /// rounded up the ladder ([`trimmed_len`]).
    pub fn seq_len(&self, reader: &Reader, samples: &[Sample], held: &Resolved<'_>) -> usize {
        let Some(multiple) = self.trim else {
            return reader.max_len;
        };
        let longest = samples
            .iter()
            .map(|s| reader.stored_length(s, held))
            .max()
            .unwrap_or(0);
        trimmed_len(longest, multiple, reader.max_len)
    }

    /// [`Padded::seq_len`] from the split's stored lengths (compiled order), for an index.
    pub fn indexed_len(&self, max_len: usize, samples: &[Sample], lengths: &[u32]) -> usize {
        match self.trim {
            Some(multiple) => {
                let longest = samples.iter().map(|s| lengths[s.position] as usize).max();
                trimmed_len(longest.unwrap_or(0), multiple, max_len)
            }
            None => max_len,
        }
    }
}

/// Copies `samples`, cut to `seq_len`, from their shards (`held`: the compressed ones) into
/// `dst`.
pub(crate) fn gather(
    reader: &Reader,
    samples: &[Sample],
    held: &Resolved<'_>,
    seq_len: usize,
    dst: &mut [&mut [u8]],
) {
    // Everything but the copies is looked up once per batch or tensor: at a few dozen
    // nanoseconds per sample and tensor, the lookups cost a sixth of the gather.
    let bodies: Vec<&[u8]> = samples
        .iter()
        .map(|s| reader.shard_bytes(s, held))
        .collect();
    let short = samples.iter().any(|s| reader.source(s).max_len < seq_len);
    for (t, out) in dst.iter_mut().enumerate() {
        let n = reader.copy_bytes(t, seq_len);
        if n == 0 {
            continue;
        }
        let count = samples.len();
        let starts: Vec<usize> = samples
            .iter()
            .map(|s| reader.source(s).range(s, t).0)
            .collect();
        if short && is_sequence(reader.spec(t)) {
            // A mix's source of a shorter L: its steps, then zeros to `seq_len`.
            let step = n / seq_len.max(1);
            for (i, (row, s)) in out.chunks_exact_mut(n).zip(samples).enumerate() {
                let k = step * reader.source(s).max_len.min(seq_len);
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
