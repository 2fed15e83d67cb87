//! The networks: a transformer encoder and a GRU over the padded sequence.
//!
//! Mixed precision is explicit rather than through libtorch's autocast: tch can switch autocast
//! on but cannot choose its dtype (it would always be float16 on CUDA). Matrix products and
//! attention run in the compute dtype; weights, the residual stream, normalisation, pooling and
//! the loss stay in f32, which is what autocast does for these ops.

use crate::args::{Amp, ModelKind, RunConfig};
use tch::nn::{self, RNN};
use tch::{Kind, Tensor};

/// One batch on the device, trimmed to its longest sequence `S`.
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
}

/// What the network sees of the cache.
#[derive(Debug, Clone)]
pub struct Shape {
    pub features: i64,
    /// Number of codes of each categorical tensor (null, unknown and the vocabulary).
    pub vocabularies: Vec<i64>,
    pub context: i64,
    pub max_len: i64,
    pub outputs: i64,
}

/// The compute dtype of matrix products.
pub fn compute_kind(amp: Amp) -> Kind {
    match amp {
        Amp::None => Kind::Float,
        Amp::Bf16 => Kind::BFloat16,
        Amp::Fp16 => Kind::Half,
    }
}

/// A network from inputs to `[B, outputs]` f32.
#[derive(Debug)]
pub enum Net {
    Transformer(Transformer),
    Gru(Gru),
}

impl Net {
    pub fn new(vs: &nn::Path, cfg: &RunConfig, shape: &Shape, amp: Amp) -> Net {
        let ct = compute_kind(amp);
        match cfg.model {
            ModelKind::Transformer => Net::Transformer(Transformer::new(vs, cfg, shape, ct)),
            ModelKind::Gru => Net::Gru(Gru::new(vs, cfg, shape, ct)),
        }
    }

    pub fn forward(&self, inp: &Inputs, train: bool) -> Tensor {
        match self {
            Net::Transformer(t) => t.forward(inp, train),
            Net::Gru(g) => g.forward(inp, train),
        }
    }
}

fn linear(x: &Tensor, l: &nn::Linear, ct: Kind) -> Tensor {
    if ct == Kind::Float {
        return x.apply(l);
    }
    x.to_kind(ct)
        .linear(&l.ws.to_kind(ct), l.bs.as_ref().map(|b| b.to_kind(ct)))
}

/// The shared front: per-step features projected to `dim`, plus one embedding per categorical.
#[derive(Debug)]
struct Embed {
    proj: Option<nn::Linear>,
    cats: Vec<nn::Embedding>,
}

impl Embed {
    fn new(vs: &nn::Path, shape: &Shape, dim: i64) -> Embed {
        let proj = (shape.features > 0)
            .then(|| nn::linear(vs / "input", shape.features, dim, Default::default()));
        let cats = shape
            .vocabularies
            .iter()
            .enumerate()
            .map(|(i, &v)| nn::embedding(vs / format!("embed{i}"), v, dim, Default::default()))
            .collect();
        Embed { proj, cats }
    }

    /// f32 `[B, S, dim]`.
    fn forward(&self, inp: &Inputs, ct: Kind) -> Tensor {
        let mut h: Option<Tensor> = match (&self.proj, &inp.x) {
            (Some(p), Some(x)) => Some(linear(x, p, ct).to_kind(Kind::Float)),
            _ => None,
        };
        for (e, codes) in self.cats.iter().zip(&inp.cats) {
            let v = codes.apply(e);
            h = Some(match h {
                Some(h) => h + v,
                None => v,
            });
        }
        h.expect("the trainer checks that the cache has per-step inputs")
    }
}

/// `[B, S]` true where a step is stored. A context with no stored step keeps step 0 so that
/// attention and pooling never divide by an empty set.
fn step_mask(length: &Tensor, s: i64) -> Tensor {
    let len = length.clamp_min(1).unsqueeze(1);
    Tensor::arange(s, (Kind::Int64, length.device()))
        .unsqueeze(0)
        .lt_tensor(&len)
}

/// Two-layer head on the pooled sequence (and the per-context features).
#[derive(Debug)]
struct Head {
    hidden: nn::Linear,
    out: nn::Linear,
}

impl Head {
    fn new(vs: &nn::Path, input: i64, dim: i64, outputs: i64) -> Head {
        Head {
            hidden: nn::linear(vs / "head_hidden", input, dim, Default::default()),
            out: nn::linear(vs / "head_out", dim, outputs, Default::default()),
        }
    }

    fn forward(&self, pooled: &Tensor, ctx: Option<&Tensor>) -> Tensor {
        let h = match ctx {
            Some(c) => Tensor::cat(&[pooled, c], 1),
            None => pooled.shallow_clone(),
        };
        h.apply(&self.hidden).gelu("none").apply(&self.out)
    }
}

#[derive(Debug)]
struct Block {
    norm1: nn::LayerNorm,
    qkv: nn::Linear,
    proj: nn::Linear,
    norm2: nn::LayerNorm,
    ff1: nn::Linear,
    ff2: nn::Linear,
}

/// Pre-norm transformer encoder with learned positions and masked mean pooling.
#[derive(Debug)]
pub struct Transformer {
    embed: Embed,
    positions: Tensor,
    blocks: Vec<Block>,
    norm: nn::LayerNorm,
    head: Head,
    heads: i64,
    dropout: f64,
    ct: Kind,
}

impl Transformer {
    fn new(vs: &nn::Path, cfg: &RunConfig, shape: &Shape, ct: Kind) -> Transformer {
        let d = cfg.dim;
        let ln = Default::default();
        let blocks = (0..cfg.layers)
            .map(|i| {
                let p = vs / format!("block{i}");
                Block {
                    norm1: nn::layer_norm(&p / "norm1", vec![d], ln),
                    qkv: nn::linear(&p / "qkv", d, 3 * d, Default::default()),
                    proj: nn::linear(&p / "proj", d, d, Default::default()),
                    norm2: nn::layer_norm(&p / "norm2", vec![d], ln),
                    ff1: nn::linear(&p / "ff1", d, 4 * d, Default::default()),
                    ff2: nn::linear(&p / "ff2", 4 * d, d, Default::default()),
                }
            })
            .collect();
        Transformer {
            embed: Embed::new(vs, shape, d),
            positions: vs.var(
                "positions",
                &[shape.max_len, d],
                nn::Init::Randn {
                    mean: 0.0,
                    stdev: 0.02,
                },
            ),
            blocks,
            norm: nn::layer_norm(vs / "norm", vec![d], ln),
            head: Head::new(vs, d + shape.context, d, shape.outputs),
            heads: cfg.heads,
            dropout: cfg.dropout,
            ct,
        }
    }

    // `h = h + …` is deliberate: `+=` on a tch tensor adds in place, and the layer norms saved
    // `h` for the backward pass.
    #[allow(clippy::assign_op_pattern)]
    fn forward(&self, inp: &Inputs, train: bool) -> Tensor {
        let mut h = self.embed.forward(inp, self.ct);
        let (b, s, d) = h.size3().expect("[B, S, D]");
        h += self.positions.narrow(0, 0, s).unsqueeze(0);
        let mask = step_mask(&inp.length, s);
        let attn_mask = mask.view([b, 1, 1, s]);
        let dh = d / self.heads;
        let p = if train { self.dropout } else { 0.0 };
        for blk in &self.blocks {
            let qkv = linear(&h.apply(&blk.norm1), &blk.qkv, self.ct)
                .view([b, s, 3, self.heads, dh])
                .permute([2, 0, 3, 1, 4]);
            let (q, k, v) = (qkv.get(0), qkv.get(1), qkv.get(2));
            let a = Tensor::scaled_dot_product_attention(
                &q,
                &k,
                &v,
                Some(&attn_mask),
                p,
                false,
                None,
                false,
            )
            .transpose(1, 2)
            .reshape([b, s, d]);
            let a = linear(&a, &blk.proj, self.ct).to_kind(Kind::Float);
            h = h + a.dropout(p, train);
            let f = linear(&h.apply(&blk.norm2), &blk.ff1, self.ct).gelu("none");
            let f = linear(&f, &blk.ff2, self.ct).to_kind(Kind::Float);
            h = h + f.dropout(p, train);
        }
        let h = h.apply(&self.norm);
        let w = mask.to_kind(Kind::Float).unsqueeze(-1);
        let pooled = (h * &w).sum_dim_intlist(1, false, Kind::Float)
            / w.sum_dim_intlist(1, false, Kind::Float);
        self.head.forward(&pooled, inp.ctx.as_ref())
    }
}

/// A GRU read at each context's last stored step. It runs in f32: libtorch's fused GRU keeps
/// its own weights, so only the input projection follows `--amp`.
#[derive(Debug)]
pub struct Gru {
    embed: Embed,
    gru: nn::GRU,
    head: Head,
    ct: Kind,
}

impl Gru {
    fn new(vs: &nn::Path, cfg: &RunConfig, shape: &Shape, ct: Kind) -> Gru {
        let rnn = nn::RNNConfig {
            num_layers: cfg.layers,
            dropout: cfg.dropout,
            batch_first: true,
            ..Default::default()
        };
        Gru {
            embed: Embed::new(vs, shape, cfg.dim),
            gru: nn::gru(vs / "gru", cfg.dim, cfg.dim, rnn),
            head: Head::new(vs, cfg.dim + shape.context, cfg.dim, shape.outputs),
            ct,
        }
    }

    fn forward(&self, inp: &Inputs, train: bool) -> Tensor {
        let h = self.embed.forward(inp, self.ct);
        let (_, _, d) = h.size3().expect("[B, S, D]");
        let _ = train; // tch's GRU applies its inter-layer dropout from its own config
        let (out, _) = self.gru.seq(&h);
        // A unidirectional GRU's output at step t ignores later (padding) steps, so the output
        // at the last stored step is exact without packing.
        let last = (inp.length.to_kind(Kind::Int64) - 1).clamp_min(0);
        let idx = last.view([-1, 1, 1]).expand([-1, 1, d], false);
        let pooled = out.gather(1, &idx, false).squeeze_dim(1);
        self.head.forward(&pooled, inp.ctx.as_ref())
    }
}
