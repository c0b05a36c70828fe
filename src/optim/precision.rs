//! Mixed-precision training: the precision policy and f16's dynamic loss scaling.
use crate::{DType, Error, Result, Tensor};

/// What a training step computes in, PyTorch's `torch.autocast` dtype: parameters stay F32
/// master weights (the optimizer updates them in F32); with `Bf16` or `F16` the forward runs
/// under [`crate::autocast`], so products and the activations after them are stored in the
/// half type (computed in f32, rounded once), and their gradients come back through the casts.
/// `F16`'s 5 exponent bits underflow small gradients, so it trains with a [`GradScaler`];
/// `Bf16` has F32's range and needs none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Precision {
    #[default]
    F32,
    Bf16,
    F16,
}

impl Precision {
    /// The type products compute from, `None` for F32.
    pub fn autocast(self) -> Option<DType> {
        match self {
            Precision::F32 => None,
            Precision::Bf16 => Some(DType::Bf16),
            Precision::F16 => Some(DType::F16),
        }
    }
    /// `f32`, `bf16` or `f16`, as `--precision` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Ok(Precision::F32),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            "f16" | "fp16" | "float16" | "half" => Ok(Precision::F16),
            other => Err(Error::invalid("precision", format!("{other:?} is not a precision: use f32, bf16 or f16"))),
        }
    }
}

/// Dynamic loss scaling, PyTorch's `torch.amp.GradScaler` with its defaults: the loss is
/// multiplied by `scale` before backward so that f16 gradients do not underflow; before the
/// update the gradients are divided by it again, and a step whose gradients hold an inf or NaN
/// is skipped and halves the scale; after `growth_interval` clean steps in a row it doubles.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GradScaler {
    scale: f32,
    growth_factor: f32,
    backoff_factor: f32,
    growth_interval: u32,
    /// Clean steps since the scale last changed.
    growth_tracker: u32,
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler { scale: 65536.0, growth_factor: 2.0, backoff_factor: 0.5, growth_interval: 2000, growth_tracker: 0 }
    }
}

impl GradScaler {
    /// PyTorch's defaults: scale 2^16, ×2 after 2000 clean steps, ×0.5 on an overflow.
    pub fn new() -> Self {
        Self::default()
    }
    /// Another starting scale and growth interval (factors as PyTorch's defaults).
    pub fn with(init_scale: f32, growth_interval: u32) -> Result<Self> {
        if !(init_scale.is_finite() && init_scale > 0.0) || growth_interval == 0 {
            return Err(Error::invalid(
                "GradScaler",
                format!("scale {init_scale} must be positive and finite and the growth interval ({growth_interval}) at least 1"),
            ));
        }
        Ok(GradScaler { scale: init_scale, growth_interval, ..Self::default() })
    }
    /// The factor the loss is multiplied by.
    pub fn scale(&self) -> f32 {
        self.scale
    }
    /// Clean steps since the scale last changed.
    pub fn growth_tracker(&self) -> u32 {
        self.growth_tracker
    }
    /// `loss` with its gradient multiplied by the scale: the value (what is reported) stays
    /// the loss, backward sees `scale · loss` (PyTorch's `scaler.scale(loss).backward()`).
    pub fn scale_loss(&self, loss: &Tensor) -> Result<Tensor> {
        loss.scale_grad(self.scale)
    }
    /// Divides every gradient of `params` by the scale and says whether any is inf or NaN
    /// (`scaler.unscale_(optimizer)`); a step that found one is skipped.
    pub fn unscale(&self, params: &[(String, Tensor)]) -> Result<bool> {
        super::scale_grads(params, 1.0 / self.scale)?;
        Ok(!super::grad_norm_sq(params)?.is_finite())
    }
    /// After a step: backs off when its gradients were not finite, else counts toward growth.
    pub fn update(&mut self, found_inf: bool) {
        if found_inf {
            self.scale *= self.backoff_factor;
            self.growth_tracker = 0;
            return;
        }
        self.growth_tracker += 1;
        if self.growth_tracker == self.growth_interval {
            // PyTorch keeps a scale that would overflow f32 as it is.
            let grown = self.scale * self.growth_factor;
            if grown.is_finite() {
                self.scale = grown;
            }
            self.growth_tracker = 0;
        }
    }
    /// Restores a checkpoint's `scale` and `growth_tracker`.
    pub fn load(&mut self, scale: f32, growth_tracker: u32) -> Result<()> {
        if !(scale.is_finite() && scale > 0.0) || growth_tracker >= self.growth_interval {
            return Err(Error::invalid(
                "GradScaler",
                format!(
                    "a checkpoint's loss scale {scale} must be positive and finite, its growth tracker {growth_tracker} below {}",
                    self.growth_interval
                ),
            ));
        }
        (self.scale, self.growth_tracker) = (scale, growth_tracker);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backs_off_on_overflow_and_grows_after_clean_intervals() {
        let mut s = GradScaler::with(8.0, 3).unwrap();
        s.update(false);
        s.update(false);
        assert_eq!((s.scale(), s.growth_tracker()), (8.0, 2));
        s.update(true);
        assert_eq!((s.scale(), s.growth_tracker()), (4.0, 0));
        (0..3).for_each(|_| s.update(false));
        assert_eq!((s.scale(), s.growth_tracker()), (8.0, 0));
        let mut big = GradScaler::with(f32::MAX, 1).unwrap();
        big.update(false);
        assert_eq!(big.scale(), f32::MAX);
        assert!(s.load(0.0, 0).is_err() && s.load(2.0, 3).is_err());
        s.load(2.0, 2).unwrap();
        assert_eq!((s.scale(), s.growth_tracker()), (2.0, 2));
        assert_eq!("BF16".parse::<Precision>().unwrap(), Precision::Bf16);
        assert!("f8".parse::<Precision>().unwrap_err().to_string().contains("f32, bf16 or f16"));
    }
}
