//! The front shared by the networks: per-step features standardised and projected to the
//! model width, plus one embedding per categorical tensor.

use super::{linear, torch_linear, Inputs, Shape};
use crate::normalise::Scaling;
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

/// Embedding rows start at N(0, 0.02), as the learned positions do. tch's default, N(0, 1),
/// gives thousands of random unit-scale vectors (one per IceCube sensor) that drown the
/// projected features, and rare codes never learn them away.
const EMBED_STD: f64 = 0.02;

/// `(x - shift) / scale` per feature, with the shift and scale kept as non-trainable variables so
/// that checkpoints and `model.safetensors` carry the preprocessing. Identity scalings create
/// no variables (checkpoints of runs without `normalise` load unchanged).
#[derive(Debug)]
pub struct Standardise {
    shift_scale: Option<(Tensor, Tensor)>,
}

impl Standardise {
    /// Shift and scale from `s` as non-trainable variables under `vs`.
    pub fn new(vs: nn::Path, s: &Scaling) -> Standardise {
        if s.is_identity() {
            return Standardise { shift_scale: None };
        }
        let n = s.shift.len() as i64;
        let shift = vs.zeros_no_train("shift", &[n]);
        let scale = vs.ones_no_train("scale", &[n]);
        let host = |v: &[f64]| {
            let v: Vec<f32> = v.iter().map(|&x| x as f32).collect();
            Tensor::from_slice(&v).to_device(vs.device())
        };
        tch::no_grad(|| {
            shift.shallow_clone().copy_(&host(&s.shift));
            scale.shallow_clone().copy_(&host(&s.scale));
        });
        Standardise {
            shift_scale: Some((shift, scale)),
        }
    }
}

impl Standardise {
    /// Undoes [`Module::forward`]: `z * scale + shift`.
    pub fn inverse(&self, zs: &Tensor) -> Tensor {
        match &self.shift_scale {
            Some((shift, scale)) => zs * scale + shift,
            None => zs.shallow_clone(),
        }
    }
}

impl Module for Standardise {
    /// Standardises the last axis.
    fn forward(&self, xs: &Tensor) -> Tensor {
        match &self.shift_scale {
            Some((shift, scale)) => (xs - shift) / scale,
            None => xs.shallow_clone(),
        }
    }
}

#[derive(Debug)]
pub(super) struct Embed {
    norm: Standardise,
    proj: Option<nn::Linear>,
    cats: Vec<nn::Embedding>,
}

impl Embed {
    pub(super) fn new(vs: &nn::Path, shape: &Shape, dim: i64) -> Embed {
        let proj = (shape.features > 0).then(|| torch_linear(vs / "input", shape.features, dim));
        let cfg = nn::EmbeddingConfig {
            ws_init: nn::Init::Randn {
                mean: 0.0,
                stdev: EMBED_STD,
            },
            // Code 0 is null and padding: a zero row that gets no gradient, so padded steps
            // add nothing to the stream.
            padding_idx: 0,
            ..Default::default()
        };
        let cats = shape
            .vocabularies
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let e = nn::embedding(vs / format!("embed{i}"), v, dim, cfg);
                tch::no_grad(|| {
                    let _ = e.ws.get(0).zero_();
                });
                e
            })
            .collect();
        Embed {
            norm: Standardise::new(vs / "x_norm", &shape.x_scaling),
            proj,
            cats,
        }
    }

    /// f32 `[B, S, dim]`.
    pub(super) fn forward(&self, inp: &Inputs, ct: Kind) -> Tensor {
        let mut h: Option<Tensor> = match (&self.proj, &inp.x) {
            (Some(p), Some(x)) => Some(linear(&self.norm.forward(x), p, ct).to_kind(Kind::Float)),
            _ => None,
        };
        for (e, codes) in self.cats.iter().zip(&inp.cats) {
            let v = codes.apply(e);
            h = Some(match h {
                Some(h) => h + v,
                None => v,
            });
        }
        h.expect("the session checks that the cache has per-step inputs")
    }
}
