//! Optimizers with PyTorch's exact update rules: SGD (momentum, dampening, nesterov, weight
//! decay), Adam and AdamW, with parameter groups; LR schedules and gradient clipping beside them.
//! Each optimizer uses a backend's fused update when it has one.
#![doc = include_str!("training.md")]
mod clip;
mod config;
mod offload;
mod precision;
mod schedule;

pub use clip::{clip_grad_norm, clip_scale, grad_norm_sq, grads_norm_sq, scale_grads};
pub use config::{GroupFn, GroupRule, OptimConfig, OptimKind, ParamGroup, ParamGroups};
pub use precision::{GradScaler, Precision};
pub use schedule::LrSchedule;

use crate::autograd::no_grad;
use crate::backend::OptimStep;
use crate::{Error, Result, Tensor};
use config::Resolved;
use offload::StateHome;

/// Updates parameters from their gradients.
pub trait Optimizer: Send {
    /// One update of every parameter that has a gradient.
    fn step(&mut self) -> Result<()>;
    fn params(&self) -> &[(String, Tensor)];
    /// Clears every parameter's gradient (PyTorch's `zero_grad(set_to_none=True)`).
    fn zero_grad(&self) {
        for (_, p) in self.params() {
            p.set_grad(None);
        }
    }
    /// Named state tensors (`fc1.weight.momentum_buffer`, `fc1.weight.exp_avg`, ...) and the
    /// step count, for checkpoints.
    fn state(&self) -> (Vec<(String, Tensor)>, u64);
    /// Restores what `state` returned.
    fn load_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()>;
    /// The base learning rate.
    fn lr(&self) -> f32;
    /// Sets the base learning rate; each parameter group keeps its configured ratio to it (a
    /// group built with lr 2e-3 over a base of 1e-3 runs at `2 * lr`), so a schedule scales
    /// every group as PyTorch's `LambdaLR` does. Weight decay is not scaled.
    fn set_lr(&mut self, lr: f32);
}

/// Settings of `Sgd`, PyTorch's names and defaults (lr has none there; 0.01 here).
#[derive(Clone, Copy, Debug)]
pub struct SgdConfig {
    pub lr: f32,
    pub momentum: f32,
    pub dampening: f32,
    pub nesterov: bool,
    pub weight_decay: f32,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig { lr: 0.01, momentum: 0.0, dampening: 0.0, nesterov: false, weight_decay: 0.0 }
    }
}

pub struct Sgd {
    cfg: SgdConfig,
    params: Vec<(String, Tensor)>,
    momentum: Vec<Option<Tensor>>,
    groups: Resolved,
    steps: u64,
    home: StateHome,
}

impl Sgd {
    pub fn new(params: Vec<(String, Tensor)>, cfg: SgdConfig) -> Result<Self> {
        Sgd::grouped(params, cfg, None)
    }
    /// `cfg` gives the base lr and weight decay, which `groups` may override per parameter.
    pub fn grouped(params: Vec<(String, Tensor)>, cfg: SgdConfig, groups: Option<&ParamGroups>) -> Result<Self> {
        if cfg.nesterov && (cfg.momentum <= 0.0 || cfg.dampening != 0.0) {
            return Err(Error::invalid("Sgd", "nesterov needs momentum > 0 and dampening 0"));
        }
        let groups = Resolved::new("Sgd", groups, &params, cfg.lr, cfg.weight_decay)?;
        let n = params.len();
        Ok(Sgd { cfg, params, momentum: vec![None; n], groups, steps: 0, home: StateHome::Device })
    }
    /// Keeps the momentum buffers in host memory, each on the device only for its parameter's
    /// update (see [`OptimConfig::offload`]).
    pub fn with_state_offloaded(mut self, offload: bool) -> Self {
        self.home = StateHome::new(offload);
        self
    }
}

/// A gradient kept in a narrower type than its parameter (ZeRO's half gradient shards,
/// [`DataParallelConfig::grad_dtype`](crate::parallel::DataParallelConfig::grad_dtype)) in the
/// parameter's type, for the update.
fn widened(g: Tensor, p: &Tensor) -> Result<Tensor> {
    if g.dtype() == p.dtype() {
        Ok(g)
    } else {
        g.to_dtype(p.dtype())
    }
}

fn check_lr(lr: f32) -> Result<()> {
    if !(lr >= 0.0 && lr.is_finite()) {
        return Err(Error::invalid("optimizer", format!("learning rate must be a finite number >= 0, got {lr}")));
    }
    Ok(())
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        let (c, home) = (self.cfg, self.home);
        no_grad(|| {
            for (i, ((_, p), buf)) in self.params.iter().zip(self.momentum.iter_mut()).enumerate() {
                let Some(g) = p.grad() else { continue };
                let g = widened(g, p)?;
                let (lr, wd) = (self.groups.lr(i, c.lr), self.groups.weight_decay(i));
                let first = buf.is_none();
                if c.momentum != 0.0 && first {
                    *buf = Some(home.zeros(p)?);
                }
                let state = buf.as_ref().map(|b| home.fetch(b, p)).transpose()?;
                sgd_update(&c, (lr, wd, first), p, &g, state.as_ref())?;
                if let (Some(b), Some(s)) = (buf.as_mut(), state.as_ref()) {
                    home.put_back(b, s)?;
                }
            }
            self.steps += 1;
            Ok(())
        })
    }
    fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }
    fn state(&self) -> (Vec<(String, Tensor)>, u64) {
        let s = self
            .params
            .iter()
            .zip(&self.momentum)
            .filter_map(|((n, _), b)| b.as_ref().map(|b| (format!("{n}.momentum_buffer"), b.clone())))
            .collect();
        (s, self.steps)
    }
    fn load_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()> {
        for ((n, p), buf) in self.params.iter().zip(self.momentum.iter_mut()) {
            *buf = find_state(state, &format!("{n}.momentum_buffer"), p, self.home)?;
        }
        self.steps = steps;
        Ok(())
    }
    fn lr(&self) -> f32 {
        self.cfg.lr
    }
    fn set_lr(&mut self, lr: f32) {
        self.cfg.lr = lr;
    }
}

/// One SGD update of `p` with momentum buffer `buf` (on `p`'s device): the backend's fused
/// kernel, or the same rule as ops.
fn sgd_update(c: &SgdConfig, (lr, wd, first): (f32, f32, bool), p: &Tensor, g: &Tensor, buf: Option<&Tensor>) -> Result<()> {
    let step = OptimStep::Sgd { lr, momentum: c.momentum, dampening: c.dampening, nesterov: c.nesterov, weight_decay: wd, first };
    let state: Vec<&crate::backend::Buffer> = buf.iter().map(|b| b.buffer()).collect();
    if p.backend().optim_step(step, p.buffer(), g.buffer(), &state)? {
        return Ok(());
    }
    let mut d = if wd != 0.0 { g.add(&p.mul_scalar(wd)?)? } else { g.clone() };
    if let Some(b) = buf {
        let nb = if first { d.clone() } else { b.mul_scalar(c.momentum)?.add(&d.mul_scalar(1.0 - c.dampening)?)? };
        b.assign(&nb)?;
        d = if c.nesterov { d.add(&nb.mul_scalar(c.momentum)?)? } else { nb };
    }
    p.assign(&p.sub(&d.mul_scalar(lr)?)?)
}

/// State entry `name` for parameter `p`, copied into a tensor of the optimizer's own, kept
/// where `home` keeps state.
fn find_state(state: &[(String, Tensor)], name: &str, p: &Tensor, home: StateHome) -> Result<Option<Tensor>> {
    match state.iter().find(|(n, _)| n == name) {
        None => Ok(None),
        Some((_, t)) if t.shape() == p.shape() => {
            let own = home.zeros(p)?;
            own.assign(t)?;
            Ok(Some(own))
        }
        Some((_, t)) => Err(Error::shape("optimizer load_state", format!("{name}: {:?} for parameter {:?}", t.shape(), p.shape()))),
    }
}

/// One Adam (AdamW when `c.decoupled`) update of `p` with moments `m` and `v` (on `p`'s
/// device) at step `t`: the backend's fused kernel, or the same rule as ops.
fn adam_update(c: &AdamConfig, (lr, wd, t): (f32, f32, u64), p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor) -> Result<()> {
    let step = OptimStep::Adam { lr, beta1: c.beta1, beta2: c.beta2, eps: c.eps, weight_decay: wd, decoupled: c.decoupled, step: t };
    if p.backend().optim_step(step, p.buffer(), g.buffer(), &[m.buffer(), v.buffer()])? {
        return Ok(());
    }
    let mut g = g.clone();
    let mut pv = p.clone();
    if wd != 0.0 {
        if c.decoupled {
            pv = p.mul_scalar(1.0 - lr * wd)?;
        } else {
            g = g.add(&p.mul_scalar(wd)?)?;
        }
    }
    m.assign(&m.mul_scalar(c.beta1)?.add(&g.mul_scalar(1.0 - c.beta1)?)?)?;
    v.assign(&v.mul_scalar(c.beta2)?.add(&g.square()?.mul_scalar(1.0 - c.beta2)?)?)?;
    let bc1 = 1.0 - c.beta1.powi(t as i32);
    let bc2 = 1.0 - c.beta2.powi(t as i32);
    let denom = v.sqrt()?.mul_scalar(1.0 / bc2.sqrt())?.add_scalar(c.eps)?;
    p.assign(&pv.sub(&m.div(&denom)?.mul_scalar(lr / bc1)?)?)
}

/// Settings of `Adam`/`AdamW`, PyTorch's defaults.
#[derive(Clone, Copy, Debug)]
pub struct AdamConfig {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// AdamW: decay the weights directly instead of adding to the gradient.
    pub decoupled: bool,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, decoupled: false }
    }
}

impl AdamConfig {
    /// PyTorch's AdamW defaults (weight decay 0.01).
    pub fn adamw() -> Self {
        AdamConfig { weight_decay: 0.01, decoupled: true, ..Default::default() }
    }
}

pub struct Adam {
    cfg: AdamConfig,
    params: Vec<(String, Tensor)>,
    moments: Vec<Option<(Tensor, Tensor)>>,
    groups: Resolved,
    steps: u64,
    home: StateHome,
}

impl Adam {
    pub fn new(params: Vec<(String, Tensor)>, cfg: AdamConfig) -> Result<Self> {
        Adam::grouped(params, cfg, None)
    }
    /// `cfg` gives the base lr and weight decay, which `groups` may override per parameter.
    pub fn grouped(params: Vec<(String, Tensor)>, cfg: AdamConfig, groups: Option<&ParamGroups>) -> Result<Self> {
        if !(0.0..1.0).contains(&cfg.beta1) || !(0.0..1.0).contains(&cfg.beta2) {
            return Err(Error::invalid("Adam", format!("betas must be in [0, 1), got ({}, {})", cfg.beta1, cfg.beta2)));
        }
        let groups = Resolved::new("Adam", groups, &params, cfg.lr, cfg.weight_decay)?;
        let n = params.len();
        Ok(Adam { cfg, params, moments: vec![None; n], groups, steps: 0, home: StateHome::Device })
    }
    /// Keeps the two moments in host memory, each on the device only for its parameter's
    /// update (see [`OptimConfig::offload`]).
    pub fn with_state_offloaded(mut self, offload: bool) -> Self {
        self.home = StateHome::new(offload);
        self
    }
}

impl Optimizer for Adam {
    fn step(&mut self) -> Result<()> {
        let (c, home) = (self.cfg, self.home);
        self.steps += 1;
        let t = self.steps;
        no_grad(|| {
            for (i, ((_, p), mom)) in self.params.iter().zip(self.moments.iter_mut()).enumerate() {
                let Some(g) = p.grad() else { continue };
                let g = widened(g, p)?;
                let (lr, wd) = (self.groups.lr(i, c.lr), self.groups.weight_decay(i));
                if mom.is_none() {
                    *mom = Some((home.zeros(p)?, home.zeros(p)?));
                }
                let (m, v) = mom.as_mut().expect("set above");
                let (dm, dv) = (home.fetch(m, p)?, home.fetch(v, p)?);
                adam_update(&c, (lr, wd, t), p, &g, &dm, &dv)?;
                home.put_back(m, &dm)?;
                home.put_back(v, &dv)?;
            }
            Ok(())
        })
    }
    fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }
    fn state(&self) -> (Vec<(String, Tensor)>, u64) {
        let mut s = Vec::new();
        for ((n, _), mom) in self.params.iter().zip(&self.moments) {
            if let Some((m, v)) = mom {
                s.push((format!("{n}.exp_avg"), m.clone()));
                s.push((format!("{n}.exp_avg_sq"), v.clone()));
            }
        }
        (s, self.steps)
    }
    fn load_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()> {
        for ((n, p), mom) in self.params.iter().zip(self.moments.iter_mut()) {
            let m = find_state(state, &format!("{n}.exp_avg"), p, self.home)?;
            let v = find_state(state, &format!("{n}.exp_avg_sq"), p, self.home)?;
            *mom = m.zip(v);
        }
        self.steps = steps;
        Ok(())
    }
    fn lr(&self) -> f32 {
        self.cfg.lr
    }
    fn set_lr(&mut self, lr: f32) {
        self.cfg.lr = lr;
    }
}
