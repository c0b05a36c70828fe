//! Neural-network layers: the `Module` trait, `Sequential`, and the seed models.
mod layers;
pub mod models;

pub use layers::{Conv2d, Flatten, Linear, MaxPool2d, ReLU};

use crate::{Device, Error, Result, Tensor};
use std::collections::HashMap;

/// A layer or model. Parameters are leaf tensors named as in a PyTorch `state_dict`
/// (`conv1.weight`, `fc2.bias`) with PyTorch's layouts.
pub trait Module: Send + Sync {
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
    /// Named parameters in state_dict order.
    fn parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    /// A copy of this module whose parameters are fresh leaves on `device`.
    fn to_device(&self, device: &Device) -> Result<Box<dyn Module>>;
    /// A short description for traces and errors, such as `Linear(320, 50)`.
    fn describe(&self) -> String;
    /// `relu(self.forward(x))` as one fused op, where this module has one (a convolution with a
    /// bias adds both in its product's epilogue); `None` where it has not. `Sequential` uses it
    /// for a layer followed by a `ReLU`; values and gradients are those of the two layers.
    fn forward_relu(&self, _x: &Tensor) -> Option<Result<Tensor>> {
        None
    }
    /// Whether this module is a plain ReLU, which the layer before it may absorb.
    fn is_relu(&self) -> bool {
        false
    }

    /// Copies values from `state` into this module's parameters, by name. Every parameter must
    /// be present with the same shape; extra names are an error too (PyTorch's strict load).
    fn load_state(&self, state: &[(String, Tensor)]) -> Result<()> {
        let params = self.parameters();
        let by_name: HashMap<&str, &Tensor> = state.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let missing: Vec<&str> = params.iter().map(|p| p.0.as_str()).filter(|n| !by_name.contains_key(n)).collect();
        let unexpected: Vec<&str> = state.iter().map(|s| s.0.as_str()).filter(|n| !params.iter().any(|p| p.0 == *n)).collect();
        if !missing.is_empty() || !unexpected.is_empty() {
            return Err(Error::invalid("load_state", format!("missing {missing:?}, unexpected {unexpected:?}")));
        }
        for (name, p) in &params {
            let src = by_name[name.as_str()];
            if src.shape() != p.shape() {
                return Err(Error::shape("load_state", format!("{name}: file has {:?}, model has {:?}", src.shape(), p.shape())));
            }
            p.assign(src)?;
        }
        Ok(())
    }
    /// Clears every parameter's gradient.
    fn zero_grad(&self) {
        for (_, p) in self.parameters() {
            p.set_grad(None);
        }
    }
}

/// Layers applied in order. Each has a name (parametric layers use theirs as the state_dict
/// prefix, as attribute names do in a PyTorch model).
pub struct Sequential {
    layers: Vec<(String, Box<dyn Module>)>,
}

impl Sequential {
    pub fn new() -> Self {
        Sequential { layers: Vec::new() }
    }
    /// Appends a named layer.
    pub fn push(mut self, name: impl Into<String>, layer: impl Module + 'static) -> Self {
        self.layers.push((name.into(), Box::new(layer)));
        self
    }
    pub fn push_boxed(&mut self, name: String, layer: Box<dyn Module>) {
        self.layers.push((name, layer));
    }
    pub fn len(&self) -> usize {
        self.layers.len()
    }
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
    pub fn layers(&self) -> &[(String, Box<dyn Module>)] {
        &self.layers
    }
    /// Consecutive layers `range` as their own model, on `device` (pipeline stages, layer placement).
    pub fn slice(&self, range: std::ops::Range<usize>, device: &Device) -> Result<Sequential> {
        if range.start >= range.end || range.end > self.layers.len() {
            return Err(Error::invalid("Sequential::slice", format!("layers {range:?} of {}", self.layers.len())));
        }
        let mut out = Sequential::new();
        for (name, layer) in &self.layers[range] {
            out.layers.push((name.clone(), layer.to_device(device)?));
        }
        Ok(out)
    }
}

impl Default for Sequential {
    fn default() -> Self {
        Self::new()
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        let mut i = 0;
        while i < self.layers.len() {
            let layer = &self.layers[i].1;
            let fused = match self.layers.get(i + 1) {
                Some((_, next)) if next.is_relu() => layer.forward_relu(&h),
                _ => None,
            };
            match fused {
                Some(y) => {
                    h = y?;
                    i += 2;
                }
                None => {
                    h = layer.forward(&h)?;
                    i += 1;
                }
            }
        }
        Ok(h)
    }
    fn parameters(&self) -> Vec<(String, Tensor)> {
        self.layers
            .iter()
            .flat_map(|(name, l)| l.parameters().into_iter().map(move |(p, t)| (format!("{name}.{p}"), t)))
            .collect()
    }
    fn to_device(&self, device: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(self.slice(0..self.layers.len(), device)?))
    }
    fn describe(&self) -> String {
        let inner: Vec<String> = self.layers.iter().map(|(n, l)| format!("{n}: {}", l.describe())).collect();
        format!("Sequential[{}]", inner.join(", "))
    }
}
