//! Parameter-free layers: Identity, Tanh, Sigmoid, SiLU, GELU, and Dropout (the only one with a
//! mode), which keys its masks by the sample context ([`crate::autograd::SampleContext`]) rather
//! than by device split.
use super::Module;
use crate::autograd::SampleContext;
use crate::tensor::random::philox4x32;
use crate::{Device, Error, Result, Tensor};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

macro_rules! stateless {
    ($(#[$doc:meta])* $name:ident, $x:ident => $body:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default)]
        pub struct $name;
        impl Module for $name {
            fn forward(&self, $x: &Tensor) -> Result<Tensor> {
                $body
            }
            fn to_device(&self, _: &Device) -> Result<Box<dyn Module>> {
                Ok(Box::new(*self))
            }
            fn describe(&self) -> String {
                stringify!($name).into()
            }
        }
    };
}

stateless!(
    /// Returns its input.
    Identity, x => Ok(x.clone())
);
stateless!(Tanh, x => x.tanh());
stateless!(Sigmoid, x => x.sigmoid());
stateless!(
    /// `x · sigmoid(x)`.
    SiLU, x => x.silu()
);

/// PyTorch's `approximate` argument of GELU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GeluApproximate {
    /// `x · Φ(x)` with the exact error function (PyTorch's default, `'none'`).
    #[default]
    None,
    /// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))` (`'tanh'`, GPT-2's).
    Tanh,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct GELU {
    pub approximate: GeluApproximate,
}

impl Module for GELU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self.approximate {
            GeluApproximate::None => x.gelu(),
            GeluApproximate::Tanh => x.gelu_tanh(),
        }
    }
    fn to_device(&self, _: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(*self))
    }
    fn describe(&self) -> String {
        format!("GELU({:?})", self.approximate)
    }
}

/// Zeroes each value with probability `p` in training and scales the rest by `1/(1-p)`;
/// the identity in eval mode. Masks come from Philox keyed by the seed, identical on every
/// backend.
///
/// Under a [`SampleContext`] (every strategy's step sets one) sample `g` of step `s` takes the
/// Philox counters `[j, call, g, s]` (`j` the block of 4 values within the sample, `call` this
/// layer's call number within the forward): masks depend on the global sample index, never on
/// how the batch is split. The input's values must be sample-major (`[B, ...]`, or `[B·T, C]`
/// with each sample's rows together). Without a context (a forward run by hand) each call moves
/// an offset past the values it used, so a run is still reproducible.
pub struct Dropout {
    pub p: f32,
    seed: u64,
    offset: AtomicU64,
    training: AtomicBool,
    /// The context generation last seen and the calls made under it.
    calls: Mutex<(u64, u32)>,
}

impl Dropout {
    /// PyTorch's `Dropout(p)`, in training mode, with seed 0.
    pub fn new(p: f32) -> Result<Self> {
        if !(0.0..=1.0).contains(&p) {
            return Err(crate::Error::invalid("Dropout", format!("p = {p} is not a probability in [0, 1]")));
        }
        Ok(Dropout { p, seed: 0, offset: AtomicU64::new(0), training: AtomicBool::new(true), calls: Mutex::new((0, 0)) })
    }
    /// The same layer drawing its masks from `seed`.
    pub fn seed(self, seed: u64) -> Self {
        Dropout { seed, offset: AtomicU64::new(0), ..self }
    }

    /// The mask of `x` under `ctx` (generation `generation`), per sample as the type documents.
    fn sample_mask(&self, x: &Tensor, ctx: SampleContext, generation: u64) -> Result<Tensor> {
        let n = x.numel();
        if ctx.samples == 0 || !n.is_multiple_of(ctx.samples) {
            let what = format!("input {:?} on {:?} does not split into the {} samples of the forward", x.shape(), x.device(), ctx.samples);
            return Err(Error::shape("Dropout", what));
        }
        let call = {
            let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
            if calls.0 != generation {
                *calls = (generation, 0);
            }
            calls.1 += 1;
            calls.1 - 1
        };
        let (per, key) = (n / ctx.samples, [self.seed as u32, (self.seed >> 32) as u32]);
        let keep = if self.p < 1.0 { 1.0 / (1.0 - self.p) } else { 0.0 };
        let mut mask = crate::backend::host::try_vec(n, "host", "a dropout mask")?;
        for i in 0..ctx.samples as u64 {
            let g = ctx.first_sample + i;
            for block in 0..per.div_ceil(4) {
                let words = philox4x32([block as u32, call, g as u32, ctx.step as u32], key);
                for &w in words.iter().take(per - 4 * block) {
                    let u = (w >> 8) as f32 * (1.0 / 16_777_216.0);
                    mask.push(if u >= self.p { keep } else { 0.0 });
                }
            }
        }
        Tensor::from_vec(mask, x.shape().clone(), x.device())
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.training.load(Ordering::Relaxed) || self.p == 0.0 {
            return Ok(x.clone());
        }
        // A half input keeps its type (the mask is cast to it, as PyTorch's bf16 dropout scales).
        if let Some((ctx, generation)) = crate::autograd::samples_in_progress() {
            return x.mul(&self.sample_mask(x, ctx, generation)?.to_dtype(x.dtype())?);
        }
        let offset = self.offset.fetch_add(x.numel() as u64, Ordering::Relaxed);
        x.mul(&Tensor::dropout_mask(self.p, self.seed, offset, x.shape().clone(), x.device())?.to_dtype(x.dtype())?)
    }
    fn set_training(&self, training: bool) {
        self.training.store(training, Ordering::Relaxed);
    }
    fn to_device(&self, _: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(Dropout {
            p: self.p,
            seed: self.seed,
            offset: AtomicU64::new(self.offset.load(Ordering::Relaxed)),
            training: AtomicBool::new(self.training.load(Ordering::Relaxed)),
            calls: Mutex::new((0, 0)),
        }))
    }
    fn describe(&self) -> String {
        format!("Dropout(p={})", self.p)
    }
}
