//! A pre-norm transformer encoder with learned positions and masked mean pooling.

use super::embed::Embed;
use super::{
    linear, step_mask, torch_linear, Head, Inputs, Mlp, Packed, PackedView, SequenceModel, Shape,
};
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

/// A pre-norm transformer encoder with masked mean pooling and a linear head.
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
    /// A transformer for inputs of `shape` under `vs`, computing in `ct`.
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
        if let Some(pack) = &inp.pack {
            return self.forward_packed(inp, pack, train);
        }
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

impl Transformer {
    /// The same network on a pack's tokens `[T, D]`: every product but attention runs on the
    /// tokens alone, none on padding; attention runs in the pack's `[S, L]` view with the
    /// padded batches' mask, so each sequence sees only itself. `[S, outputs]`; rows past the
    /// pack's sequences are unused.
    #[allow(clippy::assign_op_pattern)]
    fn forward_packed(&self, inp: &Inputs, pack: &Packed, train: bool) -> Tensor {
        let max_len = self.positions.size()[0];
        let view = PackedView::new(pack, &inp.length, max_len);
        let mut h = self.embed.forward(inp, self.ct);
        let (t, d) = h.size2().expect("[T, D]");
        h = h + self
            .positions
            .index_select(0, &pack.position.to_kind(Kind::Int64));
        let mask = step_mask(&inp.length, max_len);
        let seqs = mask.size()[0];
        let attn_mask = mask.view([seqs, 1, 1, max_len]);
        let dh = d / self.heads;
        let p = if train { self.dropout } else { 0.0 };
        for blk in &self.blocks {
            // One scatter of q, k and v together into the [S, L] view: [3, S, heads, L, dh].
            let qkv = view
                .scatter(
                    &linear(&h.apply(&blk.norm1), &blk.qkv, self.ct).view([t, 3, self.heads, dh]),
                )
                .permute([2, 0, 3, 1, 4]);
            let a = Tensor::scaled_dot_product_attention(
                &qkv.get(0),
                &qkv.get(1),
                &qkv.get(2),
                Some(&attn_mask),
                p,
                false,
                None,
                false,
            );
            let a = view.gather(&a.permute([0, 2, 1, 3])).reshape([t, d]);
            let a = linear(&a, &blk.proj, self.ct).to_kind(Kind::Float);
            h = h + a.dropout(p, train);
            let f = blk.ff.forward_t(&h.apply(&blk.norm2), train);
            h = h + f.dropout(p, train);
        }
        let h = h.apply(&self.norm);
        self.head
            .forward(&view.pool(&h, &inp.length), inp.ctx.as_ref())
    }
}
