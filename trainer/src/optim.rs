//! AdamW, the warmup + cosine schedule, global-norm clipping and dynamic loss scaling, written
//! on plain tensor ops so that every piece of state can be checkpointed (tch's optimizers keep
//! theirs inside libtorch) and so that nothing in a step reads a value back to the host: the
//! clip factor, the skip of an overflowed fp16 step and the loss scale stay on the device.

use tch::{Device, Kind, Tensor};

const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;
const EPS: f64 = 1e-8;
/// Loss scaling as in common practice: start at 2^16, halve on overflow, double after 2000
/// clean steps.
const SCALE_INIT: f64 = 65536.0;
const SCALE_GROWTH_INTERVAL: i64 = 2000;

/// Learning rate at optimizer step `step` (0-based) of `total`: linear warmup, then a cosine
/// decay to a tenth of the peak.
pub fn learning_rate(peak: f64, step: u64, warmup: u64, total: u64) -> f64 {
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1) as f64;
    let progress = ((step - warmup) as f64 / span).min(1.0);
    let floor = 0.1 * peak;
    floor + (peak - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
}

/// AdamW with decoupled weight decay over named parameters, as `torch.optim.AdamW` computes it
/// (`tests/adamw_parity.rs` compares the two). Weight decay applies to matrices only (linear
/// weights, embeddings, positions): decaying biases and layer-norm gains towards zero only
/// fights the normalisation, which is the usual parameter grouping of PyTorch code.
#[derive(Debug)]
pub struct AdamW {
    params: Vec<(String, Tensor)>,
    /// Per parameter: whether weight decay applies.
    decays: Vec<bool>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// Applied updates (skipped fp16 steps do not count), f32 scalar on the device.
    steps: Tensor,
    weight_decay: f64,
}

impl AdamW {
    pub fn new(params: Vec<(String, Tensor)>, weight_decay: f64, device: Device) -> AdamW {
        let zeros = |p: &Tensor| p.zeros_like();
        AdamW {
            decays: params.iter().map(|(_, p)| p.dim() >= 2).collect(),
            exp_avg: params.iter().map(|(_, p)| zeros(p)).collect(),
            exp_avg_sq: params.iter().map(|(_, p)| zeros(p)).collect(),
            params,
            steps: Tensor::zeros([], (Kind::Float, device)),
            weight_decay,
        }
    }

    /// Zeroes the gradients for the next accumulation.
    pub fn zero_grad(&mut self) {
        for (_, p) in &mut self.params {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
    }

    /// Unscales (fp16), clips to `max_norm` (0: off) and applies one update with learning rate
    /// `lr`. With a scaler, a step whose gradients overflowed changes nothing but the scale.
    pub fn step(&mut self, lr: f64, max_norm: f64, scaler: Option<&mut LossScaler>) {
        tch::no_grad(|| {
            let grads: Vec<Tensor> = self.params.iter().map(|(_, p)| p.grad()).collect();
            if let Some(s) = &scaler {
                let inv = s.scale.reciprocal();
                for g in &grads {
                    let _ = g.shallow_clone().g_mul_(&inv);
                }
            }
            // The global norm is needed to clip and, with fp16, to detect an overflow.
            let norm = (max_norm > 0.0 || scaler.is_some()).then(|| {
                let norm_sq: Vec<Tensor> = grads
                    .iter()
                    .filter(|g| g.defined())
                    .map(|g| g.square().sum(Kind::Float))
                    .collect();
                Tensor::stack(&norm_sq, 0).sum(Kind::Float).sqrt()
            });
            // 1 when the step applies, 0 when fp16 gradients overflowed.
            let ok = match (&scaler, &norm) {
                (Some(_), Some(n)) => n.isfinite().to_kind(Kind::Float),
                _ => Tensor::ones([], (Kind::Float, self.steps.device())),
            };
            let factor = match &norm {
                Some(n) if max_norm > 0.0 => Some((max_norm / (n + 1e-6)).clamp_max(1.0)),
                _ => None,
            };
            let _ = self.steps.g_add_(&ok);
            let t = self.steps.clamp_min(1.0);
            // Scalar bases: no host tensor is copied to the device (a pageable copy would block).
            let bias1 = 1.0 - Tensor::pow_scalar(BETA1, &t);
            let bias2 = 1.0 - Tensor::pow_scalar(BETA2, &t);
            let step_size = &ok * lr / &bias1;
            let decay = 1.0 - &ok * (lr * self.weight_decay);
            let (rate1, rate2) = (&ok * (1.0 - BETA1), &ok * (1.0 - BETA2));
            for (i, (_, p)) in self.params.iter_mut().enumerate() {
                let g = &grads[i];
                if !g.defined() {
                    continue;
                }
                // An overflowed gradient is zeroed so that `ok * (g - m)` stays finite.
                let g = match &scaler {
                    Some(_) => g.nan_to_num(0.0, 0.0, 0.0),
                    None => g.shallow_clone(),
                };
                let g = match &factor {
                    Some(f) => (g * f).to_kind(Kind::Float),
                    None => g.to_kind(Kind::Float),
                };
                let m = &mut self.exp_avg[i];
                let _ = m.g_add_(&((&g - &*m) * &rate1));
                let v = &mut self.exp_avg_sq[i];
                let _ = v.g_add_(&((g.square() - &*v) * &rate2));
                let denom = (&*v / &bias2).sqrt() + EPS;
                if self.decays[i] {
                    let _ = p.g_mul_(&decay);
                }
                let _ = p.g_sub_(&(&*m / denom * &step_size));
            }
            if let Some(s) = scaler {
                s.update(&ok);
            }
        });
    }

    /// Named state for checkpoints: `m.<param>`, `v.<param>`, `steps`.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(2 * self.params.len() + 1);
        for (i, (name, _)) in self.params.iter().enumerate() {
            out.push((format!("m.{name}"), self.exp_avg[i].shallow_clone()));
            out.push((format!("v.{name}"), self.exp_avg_sq[i].shallow_clone()));
        }
        out.push(("steps".into(), self.steps.shallow_clone()));
        out
    }

    /// Restores [`AdamW::state`]; `get` returns the saved tensor of a name.
    pub fn load(&mut self, get: impl Fn(&str) -> anyhow::Result<Tensor>) -> anyhow::Result<()> {
        tch::no_grad(|| {
            for (i, (name, _)) in self.params.iter().enumerate() {
                self.exp_avg[i].copy_(&get(&format!("m.{name}"))?);
                self.exp_avg_sq[i].copy_(&get(&format!("v.{name}"))?);
            }
            self.steps.copy_(&get("steps")?);
            Ok(())
        })
    }
}

/// Dynamic loss scale for fp16, kept on the device.
#[derive(Debug)]
pub struct LossScaler {
    pub scale: Tensor,
    pub growth_tracker: Tensor,
}

impl LossScaler {
    pub fn new(device: Device) -> LossScaler {
        LossScaler {
            scale: Tensor::full([], SCALE_INIT, (Kind::Float, device)),
            growth_tracker: Tensor::zeros([], (Kind::Int, device)),
        }
    }

    fn update(&mut self, ok: &Tensor) {
        let found_inf = 1.0 - ok;
        let _ = self.scale.internal_amp_update_scale_(
            &self.growth_tracker,
            &found_inf,
            2.0,
            0.5,
            SCALE_GROWTH_INTERVAL,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_decays_to_a_tenth() {
        let lr = |s| learning_rate(1.0, s, 10, 110);
        assert!((lr(0) - 0.1).abs() < 1e-12);
        assert!((lr(9) - 1.0).abs() < 1e-12);
        assert!((lr(10) - 1.0).abs() < 1e-12);
        assert!((lr(60) - 0.55).abs() < 1e-12);
        assert!((lr(110) - 0.1).abs() < 1e-12);
        assert!((1..200).all(|s| lr(s) <= lr(s - 1) + 1e-12 || s <= 10));
    }

    #[test]
    fn adamw_matches_the_closed_form_first_step() {
        // After one step from zero state, Adam moves each weight by lr * sign(g) (to within eps),
        // after decoupled decay.
        let p = Tensor::from_slice(&[1.0f32, -2.0, 3.0])
            .view([1, 3])
            .set_requires_grad(true);
        let loss = (&p * Tensor::from_slice(&[0.5f32, -4.0, 0.0])).sum(Kind::Float);
        loss.backward();
        let mut opt = AdamW::new(vec![("w".into(), p.shallow_clone())], 0.1, Device::Cpu);
        opt.step(0.01, 0.0, None);
        let got: Vec<f32> = Vec::try_from(&p.view([-1])).unwrap();
        let want = [
            1.0 * (1.0 - 0.001) - 0.01,
            -2.0 * (1.0 - 0.001) + 0.01,
            3.0 * (1.0 - 0.001),
        ];
        for (g, w) in got.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn an_overflowed_fp16_step_changes_nothing_and_halves_the_scale() {
        let p = Tensor::from_slice(&[1.0f32, 2.0]).set_requires_grad(true);
        let loss = (&p * Tensor::from_slice(&[f32::INFINITY, 1.0])).sum(Kind::Float);
        loss.backward();
        let mut opt = AdamW::new(vec![("w".into(), p.shallow_clone())], 0.1, Device::Cpu);
        let mut scaler = LossScaler::new(Device::Cpu);
        opt.step(0.01, 1.0, Some(&mut scaler));
        let got: Vec<f32> = Vec::try_from(&p).unwrap();
        assert_eq!(got, vec![1.0, 2.0]);
        assert_eq!(f64::try_from(&scaler.scale).unwrap(), SCALE_INIT / 2.0);
        assert_eq!(f64::try_from(&opt.steps).unwrap(), 0.0);
    }
}
