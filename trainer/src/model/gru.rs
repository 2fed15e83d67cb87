//! A GRU read at each context's last stored step.

use super::embed::Embed;
use super::{Head, Inputs, PackedView, SequenceModel, Shape};
use tch::nn;
use tch::{Kind, Tensor};

/// The GRU's size.
#[derive(Debug, Clone, PartialEq)]
pub struct GruConfig {
    /// Hidden size (and the width of the input embedding).
    pub dim: i64,
    /// Stacked GRU layers.
    pub layers: i64,
    /// Dropout between GRU layers.
    pub dropout: f64,
}

/// It runs in f32 (only the input projection follows `--amp`): errors would compound over up to
/// `L` steps, and the recurrence is a small share of the work.
///
/// The weights are its own rather than `tch::nn::GRU`'s, whose inter-layer dropout stays on in
/// evaluation (its `train` flag is fixed at construction).
#[derive(Debug)]
pub struct Gru {
    embed: Embed,
    /// libtorch's flat order: per layer `w_ih`, `w_hh`, `b_ih`, `b_hh`.
    weights: Vec<Tensor>,
    layers: i64,
    dropout: f64,
    head: Head,
    ct: Kind,
    /// The cache's `L`: the length of a pack's `[S, L]` view.
    max_len: i64,
}

impl Gru {
    /// A GRU for inputs of `shape` under `vs`, computing in `ct`.
    pub fn new(vs: &nn::Path, c: &GruConfig, shape: &Shape, ct: Kind) -> Gru {
        // torch.nn.GRU's initialisation: every weight and bias uniform in ±1/sqrt(hidden).
        let bound = 1.0 / (c.dim as f64).sqrt();
        let init = nn::Init::Uniform {
            lo: -bound,
            up: bound,
        };
        let p = vs / "gru";
        let gates = 3 * c.dim;
        let mut weights = Vec::new();
        for l in 0..c.layers {
            // The names tch's GRU gives them, so weights saved before this module still load.
            weights.push(p.var(&format!("weight_ih_l{l}"), &[gates, c.dim], init));
            weights.push(p.var(&format!("weight_hh_l{l}"), &[gates, c.dim], init));
            weights.push(p.var(&format!("bias_ih_l{l}"), &[gates], init));
            weights.push(p.var(&format!("bias_hh_l{l}"), &[gates], init));
        }
        if vs.device().is_cuda() && tch::Cuda::cudnn_is_available() {
            // Moves the weights into one contiguous buffer (each weight becomes a view of it),
            // as torch.nn.GRU does; otherwise cuDNN copies them together on every call.
            tch::no_grad(|| {
                let _ = Tensor::internal_cudnn_rnn_flatten_weight(
                    &weights, 4, c.dim, 3, c.dim, 0, c.layers, true, false,
                );
            });
        }
        Gru {
            embed: Embed::new(vs, shape, c.dim),
            weights,
            layers: c.layers,
            dropout: c.dropout,
            head: Head::new(vs, c.dim, shape, c.dim),
            ct,
            max_len: shape.max_len,
        }
    }
}

impl SequenceModel for Gru {
    fn forward_t(&self, inp: &Inputs, train: bool) -> Tensor {
        let h = self.embed.forward(inp, self.ct);
        // A pack's sequences as its [S, L] view: the recurrence reads them as a padded batch.
        let h = match &inp.pack {
            Some(p) => PackedView::new(p, &inp.length, self.max_len).scatter(&h),
            None => h,
        };
        let (b, _, d) = h.size3().expect("[B, S, D]");
        let h0 = Tensor::zeros([self.layers, b, d], (Kind::Float, h.device()));
        let (out, _) = h.gru(
            &h0,
            &self.weights,
            true,
            self.layers,
            self.dropout,
            train,
            false,
            true,
        );
        // A unidirectional GRU's output at step t ignores later (padding) steps, so the output
        // at the last stored step is exact without packing.
        let last = (inp.length.to_kind(Kind::Int64) - 1).clamp_min(0);
        let idx = last.view([-1, 1, 1]).expand([-1, 1, d], false);
        let pooled = out.gather(1, &idx, false).squeeze_dim(1);
        self.head.forward(&pooled, inp.ctx.as_ref())
    }
}
