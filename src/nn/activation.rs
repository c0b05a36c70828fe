//! Parameter-free layers: Identity, Tanh, Sigmoid, SiLU, GELU, and Dropout (the only one with a mode).
use super::Module;
use crate::{Device, Result, Tensor};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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
/// the identity in eval mode. Masks come from a counter-based generator keyed by the seed,
/// and each call moves the counter past the values it used, so a run is reproducible and
/// identical on every backend.
pub struct Dropout {
    pub p: f32,
    seed: u64,
    offset: AtomicU64,
    training: AtomicBool,
}

impl Dropout {
    /// PyTorch's `Dropout(p)`, in training mode, with seed 0.
    pub fn new(p: f32) -> Result<Self> {
        if !(0.0..=1.0).contains(&p) {
            return Err(crate::Error::invalid("Dropout", format!("p = {p} is not a probability in [0, 1]")));
        }
        Ok(Dropout { p, seed: 0, offset: AtomicU64::new(0), training: AtomicBool::new(true) })
    }
    /// The same layer drawing its masks from `seed`.
    pub fn seed(self, seed: u64) -> Self {
        Dropout { seed, offset: AtomicU64::new(0), ..self }
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.training.load(Ordering::Relaxed) || self.p == 0.0 {
            return Ok(x.clone());
        }
        let offset = self.offset.fetch_add(x.numel() as u64, Ordering::Relaxed);
        x.mul(&Tensor::dropout_mask(self.p, self.seed, offset, x.shape().clone(), x.device())?)
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
        }))
    }
    fn describe(&self) -> String {
        format!("Dropout(p={})", self.p)
    }
}
