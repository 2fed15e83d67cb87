//! AdamW, the warmup + cosine schedule, global-norm clipping and dynamic loss scaling, written
//! on plain tensor ops so that every piece of state can be checkpointed (tch's optimizers keep
//! theirs inside libtorch) and so that nothing in a step reads a value back to the host: the
//! clip factor, the skip of an overflowed fp16 step and the loss scale stay on the device.

use crate::error::Result;
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
///
/// The parameters, their gradients and both moments each live in one flat f32 buffer (every
/// parameter a view of its span), so that a step is a score of whole-buffer ops whatever the
/// number of parameters. Per-parameter ops made a step of a small network on a GPU a few
/// hundred kernel launches, most of the gap to PyTorch's fused AdamW measured on an H100
/// (docs/PERFORMANCE.md; tch exposes neither `_fused_adamw_` nor the `_foreach_` ops).
/// Gradients join their buffer at the first step that finds them defined: each parameter's
/// gradient is re-seated onto its span, and autograd accumulates into it in place from then on
/// (it adds into a defined gradient when the backward pass does not build a graph).
#[derive(Debug)]
pub struct AdamW {
    params: Vec<(String, Tensor)>,
    /// Each parameter's place in the flat buffers.
    spans: Vec<Span>,
    /// Whether a parameter's gradient is a view of `grads` yet.
    seated: Vec<bool>,
    /// Per parameter: whether weight decay applies.
    decays: Vec<bool>,
    flat: Tensor,
    grads: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// 1 over the elements that decay (matrices whose gradient is seated), 0 elsewhere.
    decay_mask: Tensor,
    /// Applied updates (skipped fp16 steps do not count), f32 scalar on the device.
    steps: Tensor,
    /// The learning rate of the next update, f32 scalar on the device: written in place before
    /// each step, so that a captured step ([`crate::graph`]) reads the schedule's value.
    lr: Tensor,
    weight_decay: f64,
    /// Whether the update runs libtorch's fused AdamW kernel ([`fused`]); otherwise the
    /// whole-buffer operations below.
    fused: bool,
    /// The fused kernel's tensor lists (parameters, gradients, both moments; with decay, then
    /// without), as views of the flat buffers, for the parameters seated so far: made again
    /// only when one more is seated, not every step.
    fused_views: Vec<(f64, [Vec<Tensor>; 4])>,
    /// Parameters seated when `fused_views` was made.
    views_of: usize,
}

#[derive(Debug, Clone)]
struct Span {
    start: i64,
    len: i64,
    shape: Vec<i64>,
}

impl Span {
    fn of(&self, flat: &Tensor) -> Tensor {
        flat.narrow(0, self.start, self.len)
            .view(self.shape.as_slice())
    }
}

impl AdamW {
    /// Takes `params` (f32, on `device`) into one flat buffer: each becomes a view of it.
    pub fn new(params: Vec<(String, Tensor)>, weight_decay: f64, device: Device) -> AdamW {
        let mut spans = Vec::with_capacity(params.len());
        let mut start = 0;
        for (name, p) in &params {
            assert!(
                p.kind() == Kind::Float && p.device() == device,
                "parameter {name} is {:?} on {:?}: the optimizer keeps f32 on {device:?}",
                p.kind(),
                p.device()
            );
            let len = p.numel() as i64;
            spans.push(Span {
                start,
                len,
                shape: p.size(),
            });
            start += len;
        }
        let zeros = || Tensor::zeros([start], (Kind::Float, device));
        let flat = zeros();
        tch::no_grad(|| {
            for ((_, p), span) in params.iter().zip(&spans) {
                span.of(&flat).copy_(p);
                p.shallow_clone().set_data(&span.of(&flat));
            }
        });
        AdamW {
            decays: params.iter().map(|(_, p)| p.dim() >= 2).collect(),
            seated: vec![false; params.len()],
            grads: zeros(),
            exp_avg: zeros(),
            exp_avg_sq: zeros(),
            decay_mask: zeros(),
            flat,
            spans,
            params,
            steps: Tensor::zeros([], (Kind::Float, device)),
            lr: Tensor::zeros([], (Kind::Float, device)),
            weight_decay,
            fused: fused::AVAILABLE,
            fused_views: Vec::new(),
            views_of: 0,
        }
    }

    /// The same optimizer updating through whole-buffer operations instead of the fused
    /// kernel (what a build without the shim does; the tests compare the two).
    pub fn unfused(mut self) -> AdamW {
        self.fused = false;
        self
    }

    /// Whether updates run libtorch's fused AdamW kernel.
    pub fn is_fused(&self) -> bool {
        self.fused
    }

    /// Moves every newly defined gradient onto its span of `grads` (once per parameter).
    fn seat_gradients(&mut self) {
        for (i, (_, p)) in self.params.iter().enumerate() {
            if self.seated[i] {
                continue;
            }
            let mut g = p.grad();
            if !g.defined() {
                continue;
            }
            let mut span = self.spans[i].of(&self.grads);
            span.copy_(&g);
            g.set_data(&span);
            if self.decays[i] {
                let _ = self.spans[i].of(&self.decay_mask).fill_(1.0);
            }
            self.seated[i] = true;
        }
    }

    /// Zeroes the gradients for the next accumulation.
    pub fn zero_grad(&mut self) {
        tch::no_grad(|| {
            let _ = self.grads.zero_();
            if self.seated.iter().all(|&s| s) {
                return;
            }
            // Gradients defined since the last step are not seated yet.
            for (i, (_, p)) in self.params.iter().enumerate() {
                let mut g = p.grad();
                if !self.seated[i] && g.defined() {
                    let _ = g.zero_();
                }
            }
        });
    }

    /// Unscales (fp16), clips to `max_norm` (0: off) and applies one update with learning rate
    /// `lr`. With a scaler, a step whose gradients overflowed changes nothing but the scale.
    pub fn step(&mut self, lr: f64, max_norm: f64, scaler: Option<&mut LossScaler>) {
        self.set_lr(lr);
        self.apply(max_norm, scaler);
    }

    /// Sets the learning rate of the next [`AdamW::apply`] (one fill on the device, no copy).
    pub fn set_lr(&mut self, lr: f64) {
        tch::no_grad(|| {
            let _ = self.lr.fill_(lr);
        });
    }

    /// [`AdamW::step`] at the rate last set ([`AdamW::set_lr`]): device work only, the host
    /// reads nothing, so it can be captured. Gradients seen for the first time are seated on
    /// the host first, so capture only after a step has seated them all.
    pub fn apply(&mut self, max_norm: f64, scaler: Option<&mut LossScaler>) {
        if self.fused {
            return self.apply_fused(max_norm, scaler);
        }
        tch::no_grad(|| {
            let (clip, ok) = self.begin_update(max_norm, scaler.as_deref());
            let t = self.steps.clamp_min(1.0);
            // Scalar bases: no host tensor is copied to the device (a pageable copy would block).
            let bias1 = 1.0 - Tensor::pow_scalar(BETA1, &t);
            let bias2 = 1.0 - Tensor::pow_scalar(BETA2, &t);
            let step_size = &ok * &self.lr / &bias1;
            let (rate1, rate2) = (&ok * (1.0 - BETA1), &ok * (1.0 - BETA2));
            // An overflowed gradient is zeroed so that `ok * (g - m)` stays finite.
            let g = match &scaler {
                Some(_) => self.grads.nan_to_num(0.0, 0.0, 0.0),
                None => self.grads.shallow_clone(),
            };
            let g = match &clip {
                Some(c) => g * c,
                None => g,
            };
            let _ = self.exp_avg.g_add_(&((&g - &self.exp_avg) * &rate1));
            let _ = self
                .exp_avg_sq
                .g_add_(&((g.square() - &self.exp_avg_sq) * &rate2));
            let denom = (&self.exp_avg_sq / &bias2).sqrt() + EPS;
            if self.weight_decay != 0.0 {
                let decay = 1.0 - &self.decay_mask * (&ok * &self.lr * self.weight_decay);
                let _ = self.flat.g_mul_(&decay);
            }
            let _ = self.flat.g_sub_(&(&self.exp_avg / denom * &step_size));
            if let Some(s) = scaler {
                s.update(&ok);
            }
        });
    }

    /// [`AdamW::apply`] through libtorch's fused kernel: the unscaling, the global norm, the
    /// clip and the step count as whole-buffer operations, then one fused update per group
    /// (matrices with weight decay, the rest without). An fp16 overflow skips the update in the
    /// kernel (`found_inf`).
    fn apply_fused(&mut self, max_norm: f64, scaler: Option<&mut LossScaler>) {
        tch::no_grad(|| {
            let (clip, ok) = self.begin_update(max_norm, scaler.as_deref());
            if let Some(c) = &clip {
                let _ = self.grads.g_mul_(c);
            }
            let found_inf = scaler.is_some().then(|| 1.0 - &ok);
            let seated = self.seated.iter().filter(|&&s| s).count();
            if seated != self.views_of {
                self.fused_views = self.views_by_decay();
                self.views_of = seated;
            }
            for (weight_decay, [params, grads, m, v]) in &self.fused_views {
                fused::adamw(
                    params,
                    grads,
                    m,
                    v,
                    &self.steps,
                    &self.lr,
                    *weight_decay,
                    found_inf.as_ref(),
                );
            }
            if let Some(s) = scaler {
                s.update(&ok);
            }
        });
    }

    /// What both updates do first: seat new gradients, unscale them (fp16), count the step
    /// (`ok`: 1, or 0 when fp16 gradients overflowed) and give the clip factor (`None`: no
    /// clipping).
    fn begin_update(
        &mut self,
        max_norm: f64,
        scaler: Option<&LossScaler>,
    ) -> (Option<Tensor>, Tensor) {
        self.seat_gradients();
        if let Some(s) = scaler {
            let _ = self.grads.g_mul_(&s.scale.reciprocal());
        }
        // The global norm is needed to clip and, with fp16, to detect an overflow.
        let norm = (max_norm > 0.0 || scaler.is_some())
            .then(|| self.grads.square().sum(Kind::Float).sqrt());
        let ok = match (scaler, &norm) {
            (Some(_), Some(n)) => n.isfinite().to_kind(Kind::Float),
            _ => Tensor::ones([], (Kind::Float, self.steps.device())),
        };
        let _ = self.steps.g_add_(&ok);
        // An overflowed step's norm may be NaN, and so its clip factor: it must not reach the
        // moments (NaN x 0 is NaN), which it did, leaving every later weight NaN.
        let clip = norm.filter(|_| max_norm > 0.0).map(|n| {
            (max_norm / (n + 1e-6))
                .clamp_max(1.0)
                .nan_to_num(1.0, 1.0, 1.0)
        });
        (clip, ok)
    }

    /// The seated parameters' views for the fused kernel, by weight decay: matrices with it,
    /// the rest without (a group left out when empty).
    fn views_by_decay(&self) -> Vec<(f64, [Vec<Tensor>; 4])> {
        [(true, self.weight_decay), (false, 0.0)]
            .into_iter()
            .filter_map(|(decay, weight_decay)| {
                let chosen: Vec<usize> = (0..self.params.len())
                    .filter(|&i| self.seated[i] && self.decays[i] == decay)
                    .collect();
                let each = |of: &Tensor| chosen.iter().map(|&i| self.spans[i].of(of)).collect();
                (!chosen.is_empty()).then(|| {
                    (
                        weight_decay,
                        [
                            each(&self.flat),
                            each(&self.grads),
                            each(&self.exp_avg),
                            each(&self.exp_avg_sq),
                        ],
                    )
                })
            })
            .collect()
    }

    /// Named state for checkpoints: `m.<param>`, `v.<param>`, `steps`.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(2 * self.params.len() + 1);
        for ((name, _), span) in self.params.iter().zip(&self.spans) {
            out.push((format!("m.{name}"), span.of(&self.exp_avg)));
            out.push((format!("v.{name}"), span.of(&self.exp_avg_sq)));
        }
        out.push(("steps".into(), self.steps.shallow_clone()));
        out
    }

    /// Restores [`AdamW::state`]; `get` returns the saved tensor of a name.
    pub fn load(&mut self, get: impl Fn(&str) -> Result<Tensor>) -> Result<()> {
        tch::no_grad(|| {
            for ((name, _), span) in self.params.iter().zip(&self.spans) {
                span.of(&self.exp_avg).copy_(&get(&format!("m.{name}"))?);
                span.of(&self.exp_avg_sq).copy_(&get(&format!("v.{name}"))?);
            }
            self.steps.copy_(&get("steps")?);
            Ok(())
        })
    }
}

/// libtorch's fused AdamW kernel (`at::_fused_adamw_`, what `torch.optim.AdamW(fused=True)`
/// runs) through `csrc/fused.cpp`, which build.rs compiles wherever libtorch's headers are
/// (`cfg(dsc_fused_adamw)`); tch binds neither it nor the `_foreach_` operations.
mod fused {
    use tch::Tensor;

    /// Whether this build has the kernel.
    pub const AVAILABLE: bool = cfg!(dsc_fused_adamw);

    #[cfg(dsc_fused_adamw)]
    mod ffi {
        use std::ffi::{c_char, c_int, c_void};

        extern "C" {
            pub fn dsc_fused_last_error() -> *const c_char;
            #[allow(clippy::too_many_arguments)]
            pub fn dsc_fused_adamw(
                params: *const *mut c_void,
                grads: *const *mut c_void,
                exp_avgs: *const *mut c_void,
                exp_avg_sqs: *const *mut c_void,
                n: i64,
                steps: *const c_void,
                lr: *const c_void,
                beta1: f64,
                beta2: f64,
                weight_decay: f64,
                eps: f64,
                found_inf: *const c_void,
            ) -> c_int;
        }
    }

    /// One update of `params` (with their gradients and moments) at the device rate `lr`, the
    /// step count `steps` (counting this update) and `weight_decay`; `found_inf` 1 skips it.
    /// Panics with libtorch's message if the kernel refuses (mismatched devices or dtypes:
    /// the optimizer's own buffers never are).
    #[allow(clippy::too_many_arguments)]
    pub fn adamw(
        params: &[Tensor],
        grads: &[Tensor],
        exp_avgs: &[Tensor],
        exp_avg_sqs: &[Tensor],
        steps: &Tensor,
        lr: &Tensor,
        weight_decay: f64,
        found_inf: Option<&Tensor>,
    ) {
        #[cfg(dsc_fused_adamw)]
        {
            let handles = |ts: &[Tensor]| -> Vec<*mut std::ffi::c_void> {
                ts.iter().map(|t| t.as_ptr() as *mut _).collect()
            };
            let (p, g, m, v) = (
                handles(params),
                handles(grads),
                handles(exp_avgs),
                handles(exp_avg_sqs),
            );
            // SAFETY: every handle is a live tch tensor borrowed for the call (the shim copies
            // the handles, not the data, and keeps none); the shim catches every C++ exception.
            let code = unsafe {
                ffi::dsc_fused_adamw(
                    p.as_ptr(),
                    g.as_ptr(),
                    m.as_ptr(),
                    v.as_ptr(),
                    params.len() as i64,
                    steps.as_ptr().cast(),
                    lr.as_ptr().cast(),
                    super::BETA1,
                    super::BETA2,
                    weight_decay,
                    super::EPS,
                    found_inf.map_or(std::ptr::null(), |t| t.as_ptr().cast()),
                )
            };
            if code != 0 {
                // SAFETY: the shim's thread-local message, NUL-terminated, copied at once.
                let msg = unsafe { std::ffi::CStr::from_ptr(ffi::dsc_fused_last_error()) };
                panic!("fused AdamW: {}", msg.to_string_lossy());
            }
        }
        #[cfg(not(dsc_fused_adamw))]
        {
            let _ = (
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                steps,
                lr,
                weight_decay,
                found_inf,
            );
            unreachable!("AdamW::fused is false where the kernel is not built");
        }
    }
}

/// Dynamic loss scale for fp16, kept on the device.
#[derive(Debug)]
pub struct LossScaler {
    /// The current loss scale (f32 scalar on the device).
    pub scale: Tensor,
    /// Clean steps since the scale last changed.
    pub growth_tracker: Tensor,
}

impl LossScaler {
    /// A scaler at the initial scale on `device`.
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

    /// The flat buffers are what the network trains: parameters are views of one buffer, and
    /// after the first step autograd accumulates every gradient into its span in place (if it
    /// made a new gradient tensor instead, the optimizer would step on stale gradients).
    #[test]
    fn gradients_accumulate_into_the_flat_buffer_after_the_first_step() {
        let w = Tensor::from_slice(&[1.0f32, -2.0, 0.5, 4.0])
            .view([2, 2])
            .set_requires_grad(true);
        let b = Tensor::from_slice(&[0.25f32, 0.5]).set_requires_grad(true);
        let x = Tensor::from_slice(&[1.0f32, 3.0]).view([1, 2]);
        let loss = |w: &Tensor, b: &Tensor| (x.matmul(w) + b).square().sum(Kind::Float);
        let named = vec![
            ("w".to_string(), w.shallow_clone()),
            ("b".to_string(), b.shallow_clone()),
        ];
        let mut opt = AdamW::new(named, 0.1, Device::Cpu);
        loss(&w, &b).backward();
        opt.step(0.01, 1.0, None);
        for _ in 0..3 {
            opt.zero_grad();
            // Two micro-batches: accumulation adds into the same spans.
            loss(&w, &b).backward();
            loss(&w, &b).backward();
            let flat: Vec<f32> = Vec::try_from(&opt.grads).unwrap();
            let mut each: Vec<f32> = Vec::try_from(&w.grad().view([-1])).unwrap();
            each.extend(Vec::<f32>::try_from(&b.grad()).unwrap());
            assert_eq!(flat, each, "autograd wrote outside the flat gradients");
            assert!(flat.iter().any(|&g| g != 0.0));
            opt.step(0.01, 1.0, None);
        }
        // The parameters the network holds are the flat buffer's views.
        let flat: Vec<f32> = Vec::try_from(&opt.flat).unwrap();
        let mut each: Vec<f32> = Vec::try_from(&w.view([-1])).unwrap();
        each.extend(Vec::<f32>::try_from(&b).unwrap());
        assert_eq!(flat, each);
    }

    /// The fused kernel's update is the whole-buffer one's within float rounding: matrices
    /// decayed and the rest not, clipped, over steps whose gradients change, and an fp16
    /// overflow skipped by both.
    #[test]
    fn the_fused_update_trains_to_the_unfused_weights() {
        if !fused::AVAILABLE {
            eprintln!("skipped: this build has no fused AdamW shim");
            return;
        }
        // The weights and inputs come from a seeded generator of the test's own: libtorch's
        // global one is shared with the tests running beside this one, whose draws between a
        // `manual_seed` and a `randn` here once gave the two runs different inputs.
        let mut rng = dsc_format::rng::Xoshiro256::seed_from(7);
        let mut uniform = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| (rng.unit_f64() * 2.0 - 1.0) as f32)
                .collect()
        };
        let (w0, b0) = (uniform(40), uniform(5));
        let xs: Vec<Vec<f32>> = (0..12).map(|_| uniform(32)).collect();
        let run = |fused: bool| {
            let w = Tensor::from_slice(&w0).view([8, 5]).set_requires_grad(true);
            let b = Tensor::from_slice(&b0).set_requires_grad(true);
            let named = vec![
                ("w".into(), w.shallow_clone()),
                ("b".into(), b.shallow_clone()),
            ];
            let mut opt = AdamW::new(named, 0.1, Device::Cpu);
            if !fused {
                opt = opt.unfused();
            }
            assert_eq!(opt.is_fused(), fused);
            let mut scaler = LossScaler::new(Device::Cpu);
            for (step, x) in xs.iter().enumerate() {
                opt.zero_grad();
                let x = Tensor::from_slice(x).view([4, 8]);
                let mut loss = (x.matmul(&w) + &b).square().sum(Kind::Float) * 65536.0;
                if step == 5 {
                    loss *= f64::INFINITY; // an overflowed fp16 step
                }
                loss.backward();
                opt.step(0.01 * (step + 1) as f64, 1.0, Some(&mut scaler));
            }
            let mut out: Vec<f32> = Vec::try_from(&opt.flat).unwrap();
            out.extend(Vec::<f32>::try_from(&opt.exp_avg_sq).unwrap());
            (out, f64::try_from(&opt.steps).unwrap())
        };
        let (fused, fused_steps) = run(true);
        let (flat, flat_steps) = run(false);
        assert_eq!((fused_steps, flat_steps), (11.0, 11.0));
        for (a, b) in fused.iter().zip(&flat) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
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
