//! The gather side of packed batches ([`crate::pack`] plans them over the order): the pack size
//! checked against the caches, the bytes of one pack, and the gather of a pack's sequences end
//! to end with its own five tensors.

use super::{is_sequence, write_i32, Batching, Gather, Resolved};
use crate::cache::Cache;
use crate::error::LoadError;
use crate::options::LoaderOptions;
use crate::order::{Order, Sample};
use crate::pack::{default_max_seqs, PackInfo, Packs};
use crate::rows;
use dsc_format::spelling::OptionError;
use dsc_format::{TensorRole, TensorSpec};

/// The names of the tensors a packed batch adds to the cache's.
pub const PACK_TENSORS: [&str; 5] = [
    "cu_seqlens",
    "seq_idx",
    "position",
    "num_seqs",
    "num_tokens",
];

/// The pack size (`T`, `S`) asked for by `opts`, checked against the caches (`max_len`: the
/// longest `L` of them); `None` for padded batches.
pub(crate) fn size(
    sources: &[Cache],
    max_len: usize,
    opts: &LoaderOptions,
    loaded: &[&TensorSpec],
) -> Result<Option<(usize, usize)>, LoadError> {
    let Some(pack) = opts.order.batches.pack() else {
        return Ok(None);
    };
    let refuse = |key, why: String| Err(OptionError::new(key, why).into());
    if pack.tokens < max_len.max(1) {
        return Err(OptionError::given(
            "pack",
            pack.tokens,
            format!(
                "tokens are fewer than the cache's L = {max_len}: a sequence of L steps would \
                 not fit; pack at least {max_len} tokens"
            ),
        )
        .into());
    }
    if pack.max_seqs == Some(0) {
        return refuse("max_seqs", "must be at least 1".into());
    }
    if let Some(t) = loaded.iter().find(|t| t.role == TensorRole::SubColumn) {
        return refuse(
            "columns",
            format!(
                "must leave out tensor {:?} for packed batches (`pack`): it holds engine \
                 sub-column codes of L + 1 steps, which have no packed layout",
                t.name
            ),
        );
    }
    if let Some(t) = sources[0]
        .tensors()
        .iter()
        .find(|t| PACK_TENSORS.contains(&t.name.as_str()))
    {
        return refuse(
            "pack",
            format!(
                "cannot be used: the cache has a tensor named {:?}, the name of a tensor a packed \
                 batch adds ({})",
                t.name,
                PACK_TENSORS.join(", ")
            ),
        );
    }
    let max_seqs = match pack.max_seqs {
        Some(s) => s,
        None => {
            let mut all = Vec::new();
            for cache in sources {
                for split in cache.manifest().splits() {
                    all.push(cache.lengths(&split.name)?);
                }
            }
            default_max_seqs(pack.tokens, all.iter().flat_map(|l| l.iter().copied()))
        }
    };
    Ok(Some((pack.tokens, max_seqs)))
}

/// The bytes of one pack of `size` (`T`, `S`) of the tensors `loaded` (of a cache of `L =
/// max_len`), and of its per-sequence rows alone; `None` where the product overflows.
pub(crate) fn batch_bytes(
    loaded: &[&TensorSpec],
    max_len: usize,
    (tokens, seqs): (usize, usize),
) -> (Option<usize>, Option<usize>) {
    let per_token: usize = loaded
        .iter()
        .filter(|t| is_sequence(t))
        .map(|t| t.sample_bytes() / max_len.max(1))
        .sum::<usize>()
        + 8;
    let per_seq: usize = loaded
        .iter()
        .filter(|t| !is_sequence(t))
        .map(|t| t.sample_bytes())
        .sum::<usize>()
        + 4
        + std::mem::size_of::<Sample>();
    let seq_bytes = per_seq.checked_mul(seqs);
    let all = per_token
        .checked_mul(tokens)
        .zip(seq_bytes)
        .and_then(|(a, b)| a.checked_add(b));
    (all, seq_bytes)
}

/// The packs of `opts`' epoch `order` over `sources` (of the longest `L = max_len`), cut in
/// packs of `size` (`T`, `S`).
pub(crate) fn batching(
    sources: &[Cache],
    order: &Order,
    max_len: usize,
    size: (usize, usize),
    opts: &LoaderOptions,
) -> Result<Batching, LoadError> {
    let o = &opts.order;
    let lengths = crate::cache::lengths_of(sources, &o.split)?;
    let packs = Packs::plan(order, &lengths, max_len, size, opts.world_size, o.drop_last)
        .after(opts.skip, o.drop_last);
    Ok(Batching::Packed { packs, lengths })
}

impl Gather {
    /// Lays `samples` end to end into the pack buffers `dst` (the layout's: loaded tensors,
    /// then the pack's own); the unused tail of every tensor is zeroed, the tail tokens belong
    /// to sequence `S` (one past the last).
    pub(crate) fn gather_pack(
        &self,
        packs: &Packs,
        lengths: &[u32],
        (samples, repeated): (&[Sample], bool),
        held: &Resolved<'_>,
        dst: &mut [&mut [u8]],
    ) -> PackInfo {
        let lens = self.pack_lens(lengths, samples);
        let tokens: usize = lens.iter().sum();
        let seqs = samples.len();
        let bodies: Vec<&[u8]> = samples.iter().map(|s| self.shard_bytes(s, held)).collect();
        let (capacity, max_seqs) = (packs.tokens(), packs.max_seqs());
        for (t, out) in dst.iter_mut().take(self.loaded).enumerate() {
            let ranges: Vec<(usize, usize)> =
                samples.iter().map(|s| self.source(s).range(s, t)).collect();
            let start_of = |i: usize| ranges[i].0;
            if is_sequence(self.spec(t)) {
                // Each sequence's stored steps are the first bytes of its sample: one copy.
                let step = self.copy_bytes(t, 1);
                let mut at = 0;
                for (i, &len) in lens.iter().enumerate() {
                    let n = len * step;
                    out[at..at + n].copy_from_slice(&bodies[i][start_of(i)..start_of(i) + n]);
                    at += n;
                }
                out[at..capacity * step].fill(0);
            } else {
                let size = self.copy_bytes(t, 0);
                rows::gather(&mut out[..seqs * size], size, seqs, |i| {
                    &bodies[i][start_of(i)..start_of(i) + size]
                });
                out[seqs * size..max_seqs * size].fill(0);
            }
        }
        write_pack_index(packs, &lens, &mut dst[self.loaded..]);
        PackInfo {
            seqs,
            tokens,
            max_seqlen: lens.iter().copied().max().unwrap_or(0),
            repeated,
        }
    }

    /// The stored lengths of a pack's `samples`, at most `L`.
    pub(crate) fn pack_lens(&self, lengths: &[u32], samples: &[Sample]) -> Vec<usize> {
        let max_len = self.max_len().max(1);
        samples
            .iter()
            .map(|s| (lengths[s.position] as usize).min(max_len))
            .collect()
    }
}

/// Writes a pack's own tensors (`cu_seqlens`, `seq_idx`, `position`, `num_seqs`,
/// `num_tokens`, in that order in `dst`) for sequences of `lens` stored steps.
pub(crate) fn write_pack_index(packs: &Packs, lens: &[usize], dst: &mut [&mut [u8]]) {
    let [cu, seq_idx, position, num_seqs, num_tokens] = dst else {
        unreachable!("a pack has five tensors of its own");
    };
    let (capacity, max_seqs) = (packs.tokens(), packs.max_seqs());
    let (tokens, seqs) = (lens.iter().sum::<usize>(), lens.len());
    let mut offsets = Vec::with_capacity(max_seqs + 1);
    offsets.push(0usize);
    for &len in lens {
        offsets.push(offsets.last().expect("non-empty") + len);
    }
    offsets.resize(max_seqs + 1, tokens);
    write_i32(cu, offsets.iter().map(|&o| o as i32));
    // Each token's sequence and step, sequence by sequence (a plain loop per sequence: the
    // iterator chain it replaces took a quarter of a pack's gather).
    let mut at = 0;
    for (i, &len) in lens.iter().enumerate() {
        let owner = (i as i32).to_le_bytes();
        let (owners, steps) = (
            &mut seq_idx[at * 4..(at + len) * 4],
            &mut position[at * 4..(at + len) * 4],
        );
        for (k, (o, p)) in owners
            .chunks_exact_mut(4)
            .zip(steps.chunks_exact_mut(4))
            .enumerate()
        {
            o.copy_from_slice(&owner);
            p.copy_from_slice(&(k as i32).to_le_bytes());
        }
        at += len;
    }
    let spare = (max_seqs as i32).to_le_bytes();
    for o in seq_idx[tokens * 4..capacity * 4].chunks_exact_mut(4) {
        o.copy_from_slice(&spare);
    }
    position[tokens * 4..capacity * 4].fill(0);
    write_i32(num_seqs, std::iter::once(seqs as i32));
    write_i32(num_tokens, std::iter::once(tokens as i32));
}
