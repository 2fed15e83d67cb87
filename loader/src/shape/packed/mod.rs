//! Packed batches' room: the pack size checked against the caches, the plan of the epoch's
//! packs (`plan`, published as [`crate::pack`]), a pack's layout (the per-step tensors `[T,
//! ..]`, the per-context ones `[S, ..]`, then its own five tensors), the gather of its
//! sequences end to end, and its index for a consumer holding the split.

pub mod plan;

use super::{own_tensor, Cut, IndexDst, Planning, Shape};
use crate::batch::{PackInfo, TensorLayout};
use crate::error::LoadError;
use crate::gather::{is_sequence, write_i32, write_i64, Reader, Resolved};
use crate::options::Pack;
use crate::order::Sample;
use crate::rows;
use dsc_format::spelling::OptionError;
use dsc_format::{Dtype, TensorRole, TensorSpec};
use plan::{default_max_seqs, Packs};
use std::sync::Arc;

/// The names of the tensors a packed batch adds to the cache's.
pub const PACK_TENSORS: [&str; 5] = [
    "cu_seqlens",
    "seq_idx",
    "position",
    "num_seqs",
    "num_tokens",
];

/// The packs of an epoch.
#[derive(Debug)]
pub(crate) struct Packed {
    pub packs: Packs,
    /// Each context's stored length, compiled order.
    pub lengths: Arc<[u32]>,
}

/// Packs of `pack` over `p`'s caches: the size checked against them and against memory, the
/// epoch's packs planned over its order.
pub(crate) fn plan(p: &Planning<'_>, pack: Pack) -> Result<Cut, LoadError> {
    let opts = p.opts;
    let max_len = p.longest();
    let loaded = p.loaded();
    let size = size(p, max_len, pack, &loaded)?;
    let (all, seqs) = batch_bytes(&loaded, p.sources[0].max_len, size);
    // A `max_seqs` given that alone is too much is named, not `pack`.
    let named = match pack.max_seqs {
        Some(s) if p.bound(seqs, ("max_seqs", s)).is_err() => ("max_seqs", s),
        _ => ("pack", pack.tokens),
    };
    p.bound(all, named)?;
    let order = super::order(p, opts)?;
    let o = &opts.order;
    let lengths = crate::cache::lengths_of(p.caches, &o.split)?;
    let packs = Packs::plan(
        &order,
        &lengths,
        max_len,
        size,
        opts.world_size,
        o.drop_last,
    )
    .after(opts.skip, o.drop_last);
    Ok(Cut {
        shape: Shape::Packed(Packed { packs, lengths }),
        layout: layout(&loaded, size),
        order,
        max_len,
    })
}

/// The tensors of a pack of `size` (`T`, `S`): the loaded ones by token or by sequence, then
/// the pack's own.
fn layout(loaded: &[&TensorSpec], (tokens, seqs): (usize, usize)) -> Vec<TensorLayout> {
    let mut out: Vec<TensorLayout> = loaded
        .iter()
        .map(|spec| {
            let shape = match is_sequence(spec) {
                true => [&[tokens][..], &spec.sample_shape[1..]].concat(),
                false => [&[seqs][..], &spec.sample_shape[..]].concat(),
            };
            TensorLayout {
                name: spec.name.clone(),
                dtype: spec.dtype,
                role: Some(spec.role),
                shape,
                trimmed_axis: None,
            }
        })
        .collect();
    for (name, len) in PACK_TENSORS.iter().zip([seqs + 1, tokens, tokens, 1, 1]) {
        out.push(own_tensor(name, Dtype::I32, vec![len]));
    }
    out
}

/// The pack size (`T`, `S`) of `pack`, checked against `p`'s caches (`max_len`: the longest
/// `L` of them) and the tensors they load.
fn size(
    p: &Planning<'_>,
    max_len: usize,
    pack: Pack,
    loaded: &[&TensorSpec],
) -> Result<(usize, usize), LoadError> {
    let sources = p.caches;
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
    Ok((pack.tokens, max_seqs))
}

/// The bytes of one pack of `size` (`T`, `S`) of the tensors `loaded` (of a cache of `L =
/// max_len`), and of its per-sequence rows alone; `None` where the product overflows.
fn batch_bytes(
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

impl Packed {
    /// Lays `samples` end to end into the pack buffers `dst` (the layout's: loaded tensors,
    /// then the pack's own); the unused tail of every tensor is zeroed, the tail tokens belong
    /// to sequence `S` (one past the last).
    pub fn gather(
        &self,
        reader: &Reader,
        (samples, repeated): (&[Sample], bool),
        held: &Resolved<'_>,
        dst: &mut [&mut [u8]],
    ) -> PackInfo {
        let lens = self.lens(reader.max_len, samples);
        let seqs = samples.len();
        let bodies: Vec<&[u8]> = samples
            .iter()
            .map(|s| reader.shard_bytes(s, held))
            .collect();
        let (capacity, max_seqs) = (self.packs.tokens(), self.packs.max_seqs());
        for (t, out) in dst.iter_mut().take(reader.loaded).enumerate() {
            let ranges: Vec<(usize, usize)> = samples
                .iter()
                .map(|s| reader.source(s).range(s, t))
                .collect();
            let start_of = |i: usize| ranges[i].0;
            if is_sequence(reader.spec(t)) {
                // Each sequence's stored steps are the first bytes of its sample: one copy.
                let step = reader.copy_bytes(t, 1);
                let mut at = 0;
                for (i, &len) in lens.iter().enumerate() {
                    let n = len * step;
                    out[at..at + n].copy_from_slice(&bodies[i][start_of(i)..start_of(i) + n]);
                    at += n;
                }
                out[at..capacity * step].fill(0);
            } else {
                let size = reader.copy_bytes(t, 0);
                rows::gather(&mut out[..seqs * size], size, seqs, |i| {
                    &bodies[i][start_of(i)..start_of(i) + size]
                });
                out[seqs * size..max_seqs * size].fill(0);
            }
        }
        write_pack_index(&self.packs, &lens, &mut dst[reader.loaded..]);
        info(&lens, repeated)
    }

    /// The stored lengths of a pack's `samples`, at most `L = max_len`.
    fn lens(&self, max_len: usize, samples: &[Sample]) -> Vec<usize> {
        let max_len = max_len.max(1);
        samples
            .iter()
            .map(|s| (self.lengths[s.position] as usize).min(max_len))
            .collect()
    }

    /// The pack's own tensors in `layout`, by name.
    pub fn own(&self, layout: &[TensorLayout]) -> Vec<TensorLayout> {
        PACK_TENSORS
            .iter()
            .map(|name| {
                let t = layout.iter().find(|t| t.name == *name);
                t.expect("a pack's layout holds its own tensors").clone()
            })
            .collect()
    }

    /// [`super::Shape::index_into`] of a pack, its positions written: its token rows into
    /// `dst.token_rows` when asked for, its own five tensors into `dst.own`, from the stored
    /// lengths the packs were planned with (`L = max_len`).
    pub fn index(
        &self,
        max_len: usize,
        (samples, repeated): (&[Sample], bool),
        dst: IndexDst<'_, '_>,
    ) -> PackInfo {
        let lens = self.lens(max_len, samples);
        let unused = dst.unused as i64;
        if let Some(token_rows) = dst.token_rows {
            // Row `position * L + step` of the split's tensors flattened to
            // `[contexts * L, ...]`; the tail reads the consumer's zero row.
            let l = max_len as i64;
            let rows = samples.iter().zip(&lens).flat_map(|(s, &len)| {
                let first = s.position as i64 * l;
                first..first + len as i64
            });
            write_i64(
                token_rows,
                rows.chain(std::iter::repeat(unused * l))
                    .take(self.packs.tokens()),
            );
        }
        write_pack_index(&self.packs, &lens, dst.own);
        info(&lens, repeated)
    }
}

/// What a pack of sequences of `lens` stored steps is (`repeated`: a repeat of an earlier one).
fn info(lens: &[usize], repeated: bool) -> PackInfo {
    PackInfo {
        seqs: lens.len(),
        tokens: lens.iter().sum(),
        max_seqlen: lens.iter().copied().max().unwrap_or(0),
        repeated,
    }
}

/// Writes a pack's own tensors (`cu_seqlens`, `seq_idx`, `position`, `num_seqs`,
/// `num_tokens`, in that order in `dst`) for sequences of `lens` stored steps.
fn write_pack_index(packs: &Packs, lens: &[usize], dst: &mut [&mut [u8]]) {
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
