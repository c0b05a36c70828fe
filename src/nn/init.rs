//! Weight initialisation in place, PyTorch's `torch.nn.init` functions and fan rules: values are
//! drawn on the host from the caller's seeded rng (so they do not depend on the device) and
//! written into the tensor without touching autograd.
//!
//! ```
//! # fn main() -> tandem::Result<()> {
//! use tandem::nn::init::{self, FanMode, Nonlinearity};
//! use tandem::nn::Linear;
//! use tandem::Device;
//! let mut rng = tandem::rng(0);
//! let fc = Linear::new(256, 128, &mut rng, &Device::cpu())?;
//! init::kaiming_normal_(&fc.weight, FanMode::FanIn, Nonlinearity::Relu, &mut rng)?;
//! init::zeros_(fc.bias.as_ref().unwrap())?;
//! # Ok(()) }
//! ```
use crate::backend::host;
use crate::tensor::normal_vec;
use crate::{DType, Error, Result, Tensor};
use rand::Rng;

/// The nonlinearity a layer feeds, for [`calculate_gain`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Nonlinearity {
    Linear,
    /// Any convolution (`conv1d`, `conv2d`, `conv_transpose2d`, ...): gain 1.
    Conv,
    Sigmoid,
    Tanh,
    Relu,
    /// With its negative slope (PyTorch's `a`; 0.01 for `nn.LeakyReLU`'s default, 0 for the
    /// `kaiming_*` default, which makes it ReLU's gain).
    LeakyRelu(f32),
    Selu,
}

/// Which fan the `kaiming_*` variance preserves: `FanIn` the forward pass's, `FanOut` the
/// backward pass's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FanMode {
    FanIn,
    FanOut,
}

/// PyTorch's `calculate_gain`: 1 for linear, conv and sigmoid, 5/3 for tanh, sqrt(2) for ReLU,
/// sqrt(2 / (1 + slope^2)) for leaky ReLU, 3/4 for SELU.
pub fn calculate_gain(nonlinearity: Nonlinearity) -> f32 {
    match nonlinearity {
        Nonlinearity::Linear | Nonlinearity::Conv | Nonlinearity::Sigmoid => 1.0,
        Nonlinearity::Tanh => 5.0 / 3.0,
        Nonlinearity::Relu => 2f32.sqrt(),
        Nonlinearity::LeakyRelu(slope) => (2.0 / (1.0 + slope * slope)).sqrt(),
        Nonlinearity::Selu => 0.75,
    }
}

/// PyTorch's fans: `fan_in = dims[1] * receptive`, `fan_out = dims[0] * receptive` with
/// `receptive` the product of `dims[2..]`, so a Linear weight `[out, in]` has fan_in `in` and a
/// Conv2d weight `[out, in, kh, kw]` has fan_in `in * kh * kw`. Rank < 2 is an error.
pub fn fan_in_and_fan_out(t: &Tensor) -> Result<(usize, usize)> {
    let d = t.dims();
    if d.len() < 2 {
        return Err(Error::shape("init fans", format!("fan in and fan out need a tensor of rank >= 2, got {:?}", t.shape())));
    }
    let receptive: usize = d[2..].iter().product();
    Ok((d[1] * receptive, d[0] * receptive))
}

/// Values from N(mean, std²).
pub fn normal_(t: &Tensor, mean: f32, std: f32, rng: &mut impl Rng) -> Result<()> {
    check_spread("normal_", std)?;
    let mut v = normal_vec(t.numel(), rng)?;
    v.iter_mut().for_each(|z| *z = mean + std * *z);
    fill(t, "normal_", v)
}

/// Values from U(lo, hi) (PyTorch's `uniform_(a, b)`).
pub fn uniform_(t: &Tensor, lo: f32, hi: f32, rng: &mut impl Rng) -> Result<()> {
    if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
        return Err(Error::invalid("uniform_", format!("bounds must be finite with lo <= hi, got [{lo}, {hi})")));
    }
    let n = t.numel();
    fill(t, "uniform_", host::try_collect(n, (0..n).map(|_| lo + (hi - lo) * rng.random::<f32>()), "host", "uniform_")?)
}

pub fn constant_(t: &Tensor, value: f32) -> Result<()> {
    fill(t, "constant_", host::try_filled(t.numel(), value, "host", "constant_")?)
}

pub fn zeros_(t: &Tensor) -> Result<()> {
    constant_(t, 0.0)
}

pub fn ones_(t: &Tensor) -> Result<()> {
    constant_(t, 1.0)
}

/// He initialisation: U(-b, b) with `b = gain * sqrt(3 / fan)`, i.e. std `gain / sqrt(fan)`.
/// PyTorch's default is `FanIn` with `LeakyRelu(0.0)`.
pub fn kaiming_uniform_(t: &Tensor, mode: FanMode, nonlinearity: Nonlinearity, rng: &mut impl Rng) -> Result<()> {
    let std = kaiming_std(t, mode, nonlinearity)?;
    let bound = 3f32.sqrt() * std;
    uniform_(t, -bound, bound, rng)
}

/// He initialisation: N(0, std²) with `std = gain / sqrt(fan)`.
pub fn kaiming_normal_(t: &Tensor, mode: FanMode, nonlinearity: Nonlinearity, rng: &mut impl Rng) -> Result<()> {
    let std = kaiming_std(t, mode, nonlinearity)?;
    normal_(t, 0.0, std, rng)
}

/// Glorot initialisation: U(-b, b) with `b = gain * sqrt(6 / (fan_in + fan_out))`.
pub fn xavier_uniform_(t: &Tensor, gain: f32, rng: &mut impl Rng) -> Result<()> {
    let std = xavier_std(t, gain)?;
    let bound = 3f32.sqrt() * std;
    uniform_(t, -bound, bound, rng)
}

/// Glorot initialisation: N(0, std²) with `std = gain * sqrt(2 / (fan_in + fan_out))`.
pub fn xavier_normal_(t: &Tensor, gain: f32, rng: &mut impl Rng) -> Result<()> {
    let std = xavier_std(t, gain)?;
    normal_(t, 0.0, std, rng)
}

/// N(mean, std²) restricted to `[lo, hi]` (absolute bounds, as PyTorch's `trunc_normal_`, whose
/// defaults are -2 and 2), by redrawing values that fall outside: exact, and cheap while the
/// interval holds a fair share of the distribution; an interval holding under 0.1% of it is an
/// error rather than a long wait.
pub fn trunc_normal_(t: &Tensor, mean: f32, std: f32, lo: f32, hi: f32, rng: &mut impl Rng) -> Result<()> {
    check_spread("trunc_normal_", std)?;
    if !(lo.is_finite() && hi.is_finite() && lo < hi) {
        return Err(Error::invalid("trunc_normal_", format!("bounds must be finite with lo < hi, got [{lo}, {hi}]")));
    }
    let cdf = |x: f32| 0.5 * (1.0 + crate::backend::erf((x as f64 - mean as f64) / (std as f64 * std::f64::consts::SQRT_2)));
    let mass = if std == 0.0 { f64::from(u8::from((lo..=hi).contains(&mean))) } else { cdf(hi) - cdf(lo) };
    if mass < 1e-3 {
        return Err(Error::invalid(
            "trunc_normal_",
            format!("[{lo}, {hi}] holds {mass:.1e} of N({mean}, {std}²): too little to sample by redrawing"),
        ));
    }
    let mut out = host::try_vec(t.numel(), "host", "trunc_normal_")?;
    while out.len() < t.numel() {
        let batch = normal_vec(t.numel() - out.len(), rng)?;
        out.extend(batch.into_iter().map(|z| mean + std * z).filter(|x| (lo..=hi).contains(x)));
    }
    fill(t, "trunc_normal_", out)
}

fn kaiming_std(t: &Tensor, mode: FanMode, nonlinearity: Nonlinearity) -> Result<f32> {
    let (fan_in, fan_out) = fan_in_and_fan_out(t)?;
    let fan = match mode {
        FanMode::FanIn => fan_in,
        FanMode::FanOut => fan_out,
    };
    Ok(calculate_gain(nonlinearity) / (fan.max(1) as f32).sqrt())
}

fn xavier_std(t: &Tensor, gain: f32) -> Result<f32> {
    let (fan_in, fan_out) = fan_in_and_fan_out(t)?;
    Ok(gain * (2.0 / (fan_in + fan_out).max(1) as f32).sqrt())
}

fn check_spread(op: &'static str, std: f32) -> Result<()> {
    if !(std.is_finite() && std >= 0.0) {
        return Err(Error::invalid(op, format!("std must be finite and >= 0, got {std}")));
    }
    Ok(())
}

/// Writes `values` into `t`, which must be an f32 tensor.
fn fill(t: &Tensor, op: &'static str, values: Vec<f32>) -> Result<()> {
    if t.dtype() != DType::F32 {
        return Err(Error::DType { op, expected: DType::F32, got: t.dtype() });
    }
    t.assign(&Tensor::from_vec(values, t.shape().clone(), t.device())?)
}
