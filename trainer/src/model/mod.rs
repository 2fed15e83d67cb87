//! The networks: a transformer encoder and a GRU over the padded sequence, each built from its
//! own config type, sharing the input front ([`embed`]) and the output head ([`Mlp`]).
//!
//! Mixed precision is explicit rather than through libtorch's autocast: tch can switch autocast
//! on but cannot choose its dtype (it would always be float16 on CUDA). Matrix products and
//! attention in the encoder run in the compute dtype; weights, the residual stream,
//! normalisation, pooling, the small output head and the loss stay in f32 (autocast would also
//! run the head's products in the compute dtype; they are a negligible share of the work).
//!
//! Initialisation follows PyTorch's modules, not tch's defaults: tch initialises linear and GRU
//! weights with ReLU-gain Kaiming bounds, `sqrt(6 / fan_in)`, 2.45 times PyTorch's
//! `1 / sqrt(fan_in)`, and embeddings with N(0, 1). Both made the reference networks start far
//! from where a plain PyTorch loop starts (see `docs/PERFORMANCE.md`, "Learning").

mod embed;
mod gru;
mod transformer;

pub use embed::Standardise;
pub use gru::{Gru, GruConfig};
pub use transformer::{Transformer, TransformerConfig};

use crate::normalise::Scaling;
use tch::nn::{self, Module, ModuleT};
use tch::{Kind, Tensor};

/// Mixed precision of the matrix products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Amp {
    /// Full f32.
    None,
    /// bfloat16 products, f32 weights and reductions.
    Bf16,
    /// float16 products with dynamic loss scaling.
    Fp16,
}

dsc_format::choice!(Amp, "amp", { None => "none", Bf16 => "bf16", Fp16 => "fp16" });

/// One batch on the device, trimmed to its longest sequence `S`; or one pack, whose per-step
/// tensors are `[T, ..]` instead of `[B, S, ..]` and per-context ones `[S, ..]` (`S` its
/// sequence slots).
#[derive(Debug)]
pub struct Inputs {
    /// f32 `[B, S, F]` per-step features, if the cache has any.
    pub x: Option<Tensor>,
    /// Integer `[B, S]` codes of each categorical tensor.
    pub cats: Vec<Tensor>,
    /// Integer `[B]` stored lengths.
    pub length: Tensor,
    /// f32 `[B, C]` per-context features, if any.
    pub ctx: Option<Tensor>,
    /// For a packed batch: where each token belongs.
    pub pack: Option<Packed>,
}

/// What a packed batch says of its tokens (the loader's `seq_idx`, `position`, `num_seqs`).
#[derive(Debug)]
pub struct Packed {
    /// i32 `[T]`: the sequence of each token; `S` for the unused tail.
    pub seq_idx: Tensor,
    /// i32 `[T]`: each token's step within its sequence.
    pub position: Tensor,
    /// i32 `[1]`: the sequences in the pack (its leading per-context rows).
    pub num_seqs: Tensor,
}

/// A pack's tokens mapped onto its sequences: the `[S, L]` view in which every sequence sits
/// at its own row, as in a padded batch. Attention and the GRU run on the view, so that no
/// sequence sees another; memory stays linear in `T` (a dense `[T, T]` mask would not).
/// libtorch's varlen attention (`_flash_attention_forward` with `cu_seqlens`) has no binding
/// in tch 0.24, so CUDA uses the view too.
pub(crate) struct PackedView {
    /// i64 `[T]`: each token's row in the flattened view; `S * L` (a spare row) for the tail.
    index: Tensor,
    /// i64 `[T]`: each token's sequence (`S` for the tail).
    seq: Tensor,
    seqs: i64,
    max_len: i64,
}

impl PackedView {
    pub(crate) fn new(pack: &Packed, length: &Tensor, max_len: i64) -> PackedView {
        let seqs = length.size()[0];
        let seq = pack.seq_idx.to_kind(Kind::Int64);
        let spare = Tensor::full_like(&seq, seqs * max_len);
        let index =
            (&seq * max_len + pack.position.to_kind(Kind::Int64)).where_self(&seq.lt(seqs), &spare);
        PackedView {
            index,
            seq,
            seqs,
            max_len,
        }
    }

    /// `[T, ..]` tokens to the `[S, L, ..]` view (zeros where no token is).
    pub(crate) fn scatter(&self, x: &Tensor) -> Tensor {
        let mut size = x.size();
        size[0] = self.seqs * self.max_len + 1;
        let out =
            Tensor::zeros(size.as_slice(), (x.kind(), x.device())).index_copy(0, &self.index, x);
        size[0] = self.seqs * self.max_len;
        let mut view = vec![self.seqs, self.max_len];
        view.extend_from_slice(&size[1..]);
        out.narrow(0, 0, size[0]).view(view.as_slice())
    }

    /// The `[S, L, ..]` view back to `[T, ..]` tokens (the tail gets zeros).
    pub(crate) fn gather(&self, v: &Tensor) -> Tensor {
        let mut size = v.size();
        let rest = size.split_off(2);
        let mut flat = vec![self.seqs * self.max_len];
        flat.extend_from_slice(&rest);
        let flat = v.reshape(flat.as_slice());
        let mut zero = vec![1];
        zero.extend_from_slice(&rest);
        let spare = Tensor::zeros(zero.as_slice(), (v.kind(), v.device()));
        Tensor::cat(&[flat, spare], 0).index_select(0, &self.index)
    }

    /// The mean of each sequence's tokens `[T, D]`, f32 `[S, D]`.
    pub(crate) fn pool(&self, h: &Tensor, length: &Tensor) -> Tensor {
        let d = h.size()[1];
        let sums = Tensor::zeros([self.seqs + 1, d], (Kind::Float, h.device())).index_add(
            0,
            &self.seq,
            &h.to_kind(Kind::Float),
        );
        sums.narrow(0, 0, self.seqs) / length.clamp_min(1).to_kind(Kind::Float).unsqueeze(1)
    }
}

/// What the network sees of the cache.
#[derive(Debug, Clone)]
pub struct Shape {
    /// Features per step (`x`'s last axis; 0 without `x`).
    pub features: i64,
    /// Number of codes of each categorical tensor (null, unknown and the vocabulary).
    pub vocabularies: Vec<i64>,
    /// Context features per context (0 without them).
    pub context: i64,
    /// The cache's `L`.
    pub max_len: i64,
    /// Outputs of the head (the task's).
    pub outputs: i64,
    /// Shift and scale of each per-step feature (identity when not normalised).
    pub x_scaling: Scaling,
    /// Shift and scale of each per-context feature.
    pub ctx_scaling: Scaling,
}

/// A network over a batch of sequences. Not [`nn::ModuleT`]: that trait takes one tensor, and a
/// batch is several (features, codes, lengths, per-context features). Its parts that do take
/// one tensor are `ModuleT`s.
pub trait SequenceModel: std::fmt::Debug {
    /// `[B, outputs]` f32.
    fn forward_t(&self, inputs: &Inputs, train: bool) -> Tensor;
}

/// Which network, with its configuration.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelConfig {
    /// A transformer encoder.
    Transformer(TransformerConfig),
    /// A GRU.
    Gru(GruConfig),
}

impl ModelConfig {
    /// Builds the network's variables under `vs`.
    pub fn build(&self, vs: &nn::Path, shape: &Shape, amp: Amp) -> Box<dyn SequenceModel> {
        let ct = compute_kind(amp);
        match self {
            ModelConfig::Transformer(c) => Box::new(Transformer::new(vs, c, shape, ct)),
            ModelConfig::Gru(c) => Box::new(Gru::new(vs, c, shape, ct)),
        }
    }
}

/// The compute dtype of matrix products.
pub fn compute_kind(amp: Amp) -> Kind {
    match amp {
        Amp::None => Kind::Float,
        Amp::Bf16 => Kind::BFloat16,
        Amp::Fp16 => Kind::Half,
    }
}

/// A linear layer initialised as `torch.nn.Linear` is: weight and bias uniform in
/// `±1 / sqrt(fan_in)`.
pub(crate) fn torch_linear(vs: nn::Path, input: i64, output: i64) -> nn::Linear {
    let bound = 1.0 / (input as f64).sqrt();
    let init = nn::Init::Uniform {
        lo: -bound,
        up: bound,
    };
    nn::linear(
        vs,
        input,
        output,
        nn::LinearConfig {
            ws_init: init,
            bs_init: Some(init),
            bias: true,
        },
    )
}

/// `x @ W^T + b` in the compute dtype `ct` (the result stays in `ct`).
fn linear(x: &Tensor, l: &nn::Linear, ct: Kind) -> Tensor {
    if ct == Kind::Float {
        return x.apply(l);
    }
    x.to_kind(ct)
        .linear(&l.ws.to_kind(ct), l.bs.as_ref().map(|b| b.to_kind(ct)))
}

/// `[B, S]` true where a step is stored. A context with no stored step keeps step 0 so that
/// attention and pooling never divide by an empty set.
fn step_mask(length: &Tensor, s: i64) -> Tensor {
    let len = length.clamp_min(1).unsqueeze(1);
    Tensor::arange(s, (Kind::Int64, length.device()))
        .unsqueeze(0)
        .lt_tensor(&len)
}

/// Two linear layers with a GELU between them, products in the compute dtype, f32 out: the
/// transformer's feed-forward block and the output head.
#[derive(Debug)]
pub struct Mlp {
    hidden: nn::Linear,
    out: nn::Linear,
    ct: Kind,
}

impl Mlp {
    /// `input → hidden → output`, the two layers' variables under `first` and `second`.
    pub fn new(
        first: nn::Path,
        second: nn::Path,
        (input, hidden, output): (i64, i64, i64),
        ct: Kind,
    ) -> Mlp {
        Mlp {
            hidden: torch_linear(first, input, hidden),
            out: torch_linear(second, hidden, output),
            ct,
        }
    }
}

impl ModuleT for Mlp {
    fn forward_t(&self, xs: &Tensor, _train: bool) -> Tensor {
        let h = linear(xs, &self.hidden, self.ct).gelu("none");
        linear(&h, &self.out, self.ct).to_kind(Kind::Float)
    }
}

/// The head: the pooled sequence, joined by the standardised per-context features, through an
/// f32 [`Mlp`].
#[derive(Debug)]
struct Head {
    ctx: Standardise,
    mlp: Mlp,
}

impl Head {
    fn new(vs: &nn::Path, pooled: i64, shape: &Shape, dim: i64) -> Head {
        Head {
            ctx: Standardise::new(vs / "ctx_norm", &shape.ctx_scaling),
            mlp: Mlp::new(
                vs / "head_hidden",
                vs / "head_out",
                (pooled + shape.context, dim, shape.outputs),
                Kind::Float,
            ),
        }
    }

    fn forward(&self, pooled: &Tensor, ctx: Option<&Tensor>) -> Tensor {
        let h = match ctx {
            Some(c) => Tensor::cat(&[pooled, &self.ctx.forward(c)], 1),
            None => pooled.shallow_clone(),
        };
        self.mlp.forward_t(&h, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    /// Four sequences of lengths 5, 1, 7 and 3 (L = 8), as a padded batch and as one pack of
    /// 24 tokens and 6 sequence slots (two unused), with the same features and codes.
    fn batches() -> (Inputs, Inputs) {
        tch::manual_seed(3);
        let (l, f, lengths) = (8i64, 3i64, [5i64, 1, 7, 3]);
        let x = Tensor::randn([4, l, f], (Kind::Float, Device::Cpu));
        let codes = Tensor::randint_low(2, 9, [4, l], (Kind::Int, Device::Cpu));
        let len = Tensor::from_slice(&lengths).to_kind(Kind::Int);
        let ctx = Tensor::randn([4, 2], (Kind::Float, Device::Cpu));
        let (tokens, slots) = (24i64, 6i64);
        let mut rows = Vec::new();
        let (mut seq_idx, mut position) = (Vec::new(), Vec::new());
        for (i, &n) in lengths.iter().enumerate() {
            for t in 0..n {
                rows.push(i as i64 * l + t);
                seq_idx.push(i as i32);
                position.push(t as i32);
            }
        }
        let used = rows.len() as i64;
        seq_idx.resize(tokens as usize, slots as i32);
        position.resize(tokens as usize, 0);
        let idx = Tensor::from_slice(&rows);
        let pad_rows = |t: &Tensor, n: i64| {
            Tensor::cat(&[t, &t.zeros_like().narrow(0, 0, 1).repeat([n, 1])], 0)
        };
        let xs = x.view([4 * l, f]).index_select(0, &idx);
        let cs = codes.view([4 * l, 1]).index_select(0, &idx);
        let packed = Inputs {
            x: Some(pad_rows(&xs, tokens - used)),
            cats: vec![pad_rows(&cs, tokens - used).view([tokens])],
            length: Tensor::cat(
                &[&len, &Tensor::zeros([slots - 4], (Kind::Int, Device::Cpu))],
                0,
            ),
            ctx: Some(pad_rows(&ctx, slots - 4)),
            pack: Some(Packed {
                seq_idx: Tensor::from_slice(&seq_idx),
                position: Tensor::from_slice(&position),
                num_seqs: Tensor::from_slice(&[4i32]),
            }),
        };
        let padded = Inputs {
            x: Some(x),
            cats: vec![codes],
            length: len,
            ctx: Some(ctx),
            pack: None,
        };
        (padded, packed)
    }

    /// The packed forward of each network gives, for every sequence, what the padded forward
    /// gives for the same context: the packing changes the layout, never the arithmetic.
    #[test]
    fn a_pack_and_a_padded_batch_of_the_same_contexts_give_the_same_outputs() {
        let shape = Shape {
            features: 3,
            vocabularies: vec![9],
            context: 2,
            max_len: 8,
            outputs: 3,
            x_scaling: Scaling::identity(3),
            ctx_scaling: Scaling::identity(2),
        };
        let configs = [
            ModelConfig::Transformer(TransformerConfig {
                dim: 16,
                layers: 2,
                heads: 4,
                dropout: 0.0,
            }),
            ModelConfig::Gru(GruConfig {
                dim: 16,
                layers: 2,
                dropout: 0.0,
            }),
        ];
        let (padded, packed) = batches();
        for config in configs {
            let vs = nn::VarStore::new(Device::Cpu);
            let net = config.build(&vs.root(), &shape, Amp::None);
            let a = net.forward_t(&padded, false);
            let b = net.forward_t(&packed, false);
            assert_eq!(b.size(), [6, 3], "{config:?}: [S, outputs]");
            let diff = f64::try_from((a - b.narrow(0, 0, 4)).abs().max()).unwrap();
            assert!(diff < 1e-5, "{config:?}: largest difference {diff}");
        }
    }
}
