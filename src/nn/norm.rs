//! Normalisation layers: BatchNorm1d/2d (with running statistics as buffers) and LayerNorm.
use super::layers::{copy_on, leaf_on, nonzero};
use super::Module;
use crate::autograd::no_grad;
use crate::{Device, Error, Result, Shape, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};

/// The shared body of BatchNorm1d and BatchNorm2d: PyTorch's defaults (eps 1e-5, momentum
/// 0.1, affine, tracking running statistics); weight 1, bias 0, running mean 0 and var 1.
struct BatchNorm {
    weight: Tensor,
    bias: Tensor,
    running_mean: Tensor,
    running_var: Tensor,
    /// F32 (PyTorch's is int64): it is counted on the device, where arithmetic is F32.
    num_batches_tracked: Tensor,
    eps: f32,
    momentum: f32,
    training: AtomicBool,
}

impl BatchNorm {
    fn new(features: usize, dev: &Device) -> Result<Self> {
        Ok(BatchNorm {
            weight: Tensor::ones([features], dev)?.requires_grad(),
            bias: Tensor::zeros([features], dev)?.requires_grad(),
            running_mean: Tensor::zeros([features], dev)?,
            running_var: Tensor::ones([features], dev)?,
            num_batches_tracked: Tensor::zeros(Shape(vec![]), dev)?,
            eps: 1e-5,
            momentum: 0.1,
            training: AtomicBool::new(true),
        })
    }

    fn forward(&self, op: &'static str, x: &Tensor, ranks: &[usize]) -> Result<Tensor> {
        let c = self.weight.numel();
        if !ranks.contains(&x.rank()) || x.dims()[1] != c {
            return Err(Error::shape(op, format!("input {:?}: need rank {ranks:?} with {c} channels in dim 1", x.shape())));
        }
        let mut per_channel = vec![1; x.rank()];
        per_channel[1] = c;
        let chan = |t: &Tensor| t.reshape(per_channel.clone());
        let (mean, var) = if self.training.load(Ordering::Relaxed) {
            let n = x.numel() / c;
            if n < 2 {
                return Err(Error::shape(op, format!("input {:?} has {n} value per channel; training needs more than 1", x.shape())));
            }
            let axes: Vec<isize> = (0..x.rank() as isize).filter(|&a| a != 1).collect();
            let mean = x.mean_axes(&axes)?;
            let var = x.sub(&mean)?.square()?.mean_axes(&axes)?;
            no_grad(|| self.track(&mean.detach(), &var.detach(), n))?;
            (mean, var)
        } else {
            (chan(&self.running_mean)?, chan(&self.running_var)?)
        };
        let scale = var.add_scalar(self.eps)?.sqrt()?;
        x.sub(&mean)?.div(&scale)?.mul(&chan(&self.weight)?)?.add(&chan(&self.bias)?)
    }

    /// Running statistics as PyTorch keeps them: the batch's unbiased variance (`n/(n-1)` times
    /// the biased one the batch is normalised with), blended in with `momentum`.
    fn track(&self, mean: &Tensor, var: &Tensor, n: usize) -> Result<()> {
        let c = [self.weight.numel()];
        let m = self.momentum;
        let blend = |old: &Tensor, new: Tensor| -> Result<()> { old.assign(&old.mul_scalar(1.0 - m)?.add(&new.reshape(c)?.mul_scalar(m)?)?) };
        blend(&self.running_mean, mean.clone())?;
        blend(&self.running_var, var.mul_scalar(n as f32 / (n - 1) as f32)?)?;
        self.num_batches_tracked.assign(&self.num_batches_tracked.add_scalar(1.0)?)
    }

    fn to_device(&self, dev: &Device) -> Result<Self> {
        Ok(BatchNorm {
            weight: leaf_on(&self.weight, dev)?,
            bias: leaf_on(&self.bias, dev)?,
            running_mean: copy_on(&self.running_mean, dev)?,
            running_var: copy_on(&self.running_var, dev)?,
            num_batches_tracked: copy_on(&self.num_batches_tracked, dev)?,
            eps: self.eps,
            momentum: self.momentum,
            training: AtomicBool::new(self.training.load(Ordering::Relaxed)),
        })
    }
}

macro_rules! batch_norm {
    ($(#[$doc:meta])* $name:ident, $ranks:expr) => {
        $(#[$doc])*
        pub struct $name(BatchNorm);
        impl $name {
            /// PyTorch's defaults for `num_features` channels, in training mode; 0 channels
            /// is an [`Error::Invalid`] naming `num_features`.
            pub fn new(num_features: usize, dev: &Device) -> Result<Self> {
                nonzero(stringify!($name), &[("num_features", num_features)])?;
                Ok($name(BatchNorm::new(num_features, dev)?))
            }
            /// The same layer with another `eps` and `momentum`.
            pub fn with(mut self, eps: f32, momentum: f32) -> Self {
                self.0.eps = eps;
                self.0.momentum = momentum;
                self
            }
        }
        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                self.0.forward(stringify!($name), x, &$ranks)
            }
            fn parameters(&self) -> Vec<(String, Tensor)> {
                vec![("weight".into(), self.0.weight.clone()), ("bias".into(), self.0.bias.clone())]
            }
            fn named_buffers(&self) -> Vec<(String, Tensor)> {
                let b = &self.0;
                vec![
                    ("running_mean".into(), b.running_mean.clone()),
                    ("running_var".into(), b.running_var.clone()),
                    ("num_batches_tracked".into(), b.num_batches_tracked.clone()),
                ]
            }
            fn set_training(&self, training: bool) {
                self.0.training.store(training, Ordering::Relaxed);
            }
            fn to_device(&self, dev: &Device) -> Result<Box<dyn Module>> {
                Ok(Box::new($name(self.0.to_device(dev)?)))
            }
            fn describe(&self) -> String {
                format!("{}({})", stringify!($name), self.0.weight.numel())
            }
        }
    };
}

batch_norm!(
    /// Batch normalisation of `[N, C]` or `[N, C, L]` over every dimension but the channels.
    BatchNorm1d, [2, 3]
);
batch_norm!(
    /// Batch normalisation of `[N, C, H, W]` over every dimension but the channels.
    BatchNorm2d, [4]
);

/// Normalises over the trailing `normalized_shape` dimensions (biased variance, eps 1e-5),
/// then scales by `weight` (ones) and shifts by `bias` (zeros), as PyTorch's LayerNorm.
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f32,
}

impl LayerNorm {
    /// A 0 in `normalized_shape` is an [`Error::Invalid`] of `LayerNorm` naming it.
    pub fn new(normalized_shape: &[usize], dev: &Device) -> Result<Self> {
        if normalized_shape.contains(&0) {
            return Err(Error::invalid("LayerNorm", format!("normalized_shape {normalized_shape:?} has a 0; a layer needs at least 1")));
        }
        Ok(LayerNorm {
            weight: Tensor::ones(normalized_shape, dev)?.requires_grad(),
            bias: Tensor::zeros(normalized_shape, dev)?.requires_grad(),
            eps: 1e-5,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let norm = self.weight.dims();
        if x.rank() < norm.len() || &x.dims()[x.rank() - norm.len()..] != norm {
            return Err(Error::shape("LayerNorm", format!("input {:?} does not end in normalized_shape {norm:?}", x.shape())));
        }
        // One fused pass over rows of all the normalised values, where the device has it.
        let k = self.weight.numel();
        let rows = x.reshape([x.numel() / k.max(1), k])?;
        let y = rows.layer_norm(&self.weight.reshape([k])?, &self.bias.reshape([k])?, self.eps)?;
        y.reshape(x.shape().clone())
    }
    fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".into(), self.weight.clone()), ("bias".into(), self.bias.clone())]
    }
    fn to_device(&self, dev: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(LayerNorm { weight: leaf_on(&self.weight, dev)?, bias: leaf_on(&self.bias, dev)?, eps: self.eps }))
    }
    fn describe(&self) -> String {
        format!("LayerNorm({:?})", self.weight.dims())
    }
}
