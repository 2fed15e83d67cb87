//! The gather of a batch of series windows: each row is `W` steps of one context from its
//! window's start, per-context tensors as they are, `length` the window's real steps, then the
//! tensors a window adds ([`SeriesPlan::layout`]).

use crate::gather::{is_sequence, Gather, Resolved};
use crate::order::Sample;
use crate::rows;
use crate::series::SeriesPlan;
use dsc_format::TensorRole;

/// Little-endian i32s into `out`, front to back.
fn write_i32s(out: &mut [u8], values: impl Iterator<Item = usize>) {
    for (slot, v) in out.chunks_exact_mut(4).zip(values) {
        slot.copy_from_slice(&(v as i32).to_le_bytes());
    }
}

impl Gather {
    /// Copies the windows `samples` (`held`: the shards they lie in when not mapped) into
    /// `dst`: the loaded tensors, then [`SeriesPlan::layout`]'s.
    pub(crate) fn gather_windows(
        &self,
        plan: &SeriesPlan,
        samples: &[Sample],
        held: &Resolved<'_>,
        dst: &mut [&mut [u8]],
    ) {
        let w = &plan.windows;
        let n = samples.len();
        let bodies: Vec<&[u8]> = samples.iter().map(|s| self.shard_bytes(s, held)).collect();
        let lengths: Vec<usize> = samples
            .iter()
            .map(|s| self.stored_length(s, held))
            .collect();
        for (t, out) in dst.iter_mut().take(self.loaded).enumerate() {
            let spec = self.spec(t);
            let starts: Vec<usize> = samples
                .iter()
                .map(|s| self.source(s).range(s, t).0)
                .collect();
            if is_sequence(spec) {
                // The window's real steps of its context, then zeros.
                let step = self.copy_bytes(t, 1);
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
                let size = self.copy_bytes(t, 0);
                rows::gather(&mut out[..n * size], size, n, |i| {
                    &bodies[i][starts[i]..starts[i] + size]
                });
            }
        }
        let extra = &mut dst[self.loaded..];
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
            let source = self.source(s);
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
