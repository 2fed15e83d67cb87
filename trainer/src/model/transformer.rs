//! A pre-norm transformer encoder with learned positions and masked mean pooling.

use super::embed::Embed;
use super::{linear, step_mask, torch_linear, Head, Inputs, Mlp, SequenceModel, Shape};
use tch::nn::{self, ModuleT};
use tch::{Kind, Tensor};

/// The transformer's size.
#[derive(Debug, Clone, PartialEq)]
pub struct TransformerConfig {
    /// Width of the residual stream.
    pub dim: i64,
    /// Encoder layers.
    pub layers: i64,
    /// Attention heads (`dim` must be a multiple).
    pub heads: i64,
    /// Dropout on attention weights and on each residual branch.
    pub dropout: f64,
}

/// One layer: `h + attn(norm(h))`, then `h + mlp(norm(h))`.
#[derive(Debug)]
struct Block {
    norm1: nn::LayerNorm,
    qkv: nn::Linear,
    proj: nn::Linear,
    norm2: nn::LayerNorm,
    ff: Mlp,
}

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
    pub fn new(vs: &nn::Path, c: &TransformerConfig, shape: &Shape, ct: Kind) -> Transformer {
        let d = c.dim;
        let ln = Default::default();
        let blocks = (0..c.layers)
            .map(|i| {
                let p = vs / format!("block{i}");
                Block {
                    norm1: nn::layer_norm(&p / "norm1", vec![d], ln),
                    qkv: torch_linear(&p / "qkv", d, 3 * d),
                    proj: torch_linear(&p / "proj", d, d),
                    norm2: nn::layer_norm(&p / "norm2", vec![d], ln),
                    ff: Mlp::new(&p / "ff1", &p / "ff2", (d, 4 * d, d), ct),
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
            head: Head::new(vs, d, shape, d),
            heads: c.heads,
            dropout: c.dropout,
            ct,
        }
    }
}

impl SequenceModel for Transformer {
    // `h = h + …` is deliberate: `+=` on a tch tensor adds in place, and the layer norms saved
    // `h` for the backward pass.
    #[allow(clippy::assign_op_pattern)]
    fn forward_t(&self, inp: &Inputs, train: bool) -> Tensor {
        let mut h = self.embed.forward(inp, self.ct);
        let (b, s, d) = h.size3().expect("[B, S, D]");
        h = h + self.positions.narrow(0, 0, s).unsqueeze(0);
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
            let f = blk.ff.forward_t(&h.apply(&blk.norm2), train);
            h = h + f.dropout(p, train);
        }
        let h = h.apply(&self.norm);
        let w = mask.to_kind(Kind::Float).unsqueeze(-1);
        let pooled = (h * &w).sum_dim_intlist(1, false, Kind::Float)
            / w.sum_dim_intlist(1, false, Kind::Float);
        self.head.forward(&pooled, inp.ctx.as_ref())
    }
}
