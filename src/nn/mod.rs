//! Neural-network layers: the `Module` trait, `Sequential`, the layers and the seed models.
#![doc = include_str!("models.md")]
mod activation;
pub mod init;
mod layers;
pub mod models;
mod norm;
mod pool;

pub use activation::{Dropout, GeluApproximate, Identity, SiLU, Sigmoid, Tanh, GELU};
// The sample context is autograd's (a recomputed forward reruns under it); Dropout is its user.
pub use crate::autograd::{current_samples, with_samples, SampleContext};
pub use layers::{Conv2d, Embedding, Flatten, Linear, MaxPool2d, ReLU};
pub use norm::{BatchNorm1d, BatchNorm2d, LayerNorm};
pub use pool::{AdaptiveAvgPool2d, AvgPool2d};

use crate::{Device, Error, Result, Tensor};
use std::any::Any;
use std::collections::{HashMap, HashSet};

/// A layer or model. A user's struct with any `forward` is a module: it lists its submodules in
/// `children` and gets named parameters, buffers, `state_dict`, `load_state_dict`, `train` and
/// `eval` from them; a leaf layer lists its own tensors in `parameters` and `named_buffers`.
/// Names and layouts are PyTorch's (`conv1.weight`, `bn1.running_mean`).
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// use tandem::nn::{BatchNorm1d, Linear, Module};
/// use tandem::{Device, Result, Tensor};
/// struct Residual { fc: Linear, bn: BatchNorm1d }
/// impl Module for Residual {
///     fn forward(&self, x: &Tensor) -> Result<Tensor> {
///         x.add(&self.bn.forward(&self.fc.forward(x)?)?.relu()?)
///     }
///     fn children(&self) -> Vec<(String, &dyn Module)> {
///         vec![("fc".into(), &self.fc), ("bn".into(), &self.bn)]
///     }
///     fn describe(&self) -> String { "Residual".into() }
/// }
/// let dev = Device::cpu();
/// let mut rng = tandem::rng(0);
/// let m = Residual { fc: Linear::new(4, 4, &mut rng, &dev)?, bn: BatchNorm1d::new(4, &dev)? };
/// let names: Vec<String> = m.state_dict().into_iter().map(|p| p.0).collect();
/// assert_eq!(names, ["fc.weight", "fc.bias", "bn.weight", "bn.bias",
///                    "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]);
/// m.eval(); // reaches the BatchNorm
/// # Ok(()) }
/// ```
pub trait Module: Any + Send + Sync {
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
    /// A short description for traces and errors, such as `Linear(320, 50)`.
    fn describe(&self) -> String;
    /// The named submodules (attribute names, used as prefixes); a module used twice is listed once.
    fn children(&self) -> Vec<(String, &dyn Module)> {
        Vec::new()
    }
    /// Named trainable leaves in state_dict order. The default gathers the children's, each
    /// tensor once (a weight shared by two submodules keeps its first name, as PyTorch's
    /// `named_parameters`).
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut seen = HashSet::new();
        prefixed(self.children(), |m| m.parameters()).into_iter().filter(|(_, t)| seen.insert(t.id())).collect()
    }
    /// Parameters of this module that are copies of another parameter of the whole model, as
    /// `(own name, the primary's name in the whole model's state_dict)`: a language model's
    /// output projection that is its token embedding. Where the two are one tensor (one
    /// device) nothing needs it; a pipeline whose stages hold the two as separate tensors ties
    /// every pair its stages declare, so a model split across stages trains as one. The
    /// default gathers the children's, own names prefixed with the child's name.
    fn tied_parameters(&self) -> Vec<(String, String)> {
        self.children()
            .into_iter()
            .flat_map(|(name, m)| m.tied_parameters().into_iter().map(move |(own, primary)| (format!("{name}.{own}"), primary)))
            .collect()
    }
    /// Named state that is saved but not trained (BatchNorm's running statistics).
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        prefixed(self.children(), |m| m.named_buffers())
    }
    /// Switches training behaviour (Dropout, BatchNorm) on or off here and in every submodule.
    fn set_training(&self, training: bool) {
        for (_, c) in self.children() {
            c.set_training(training);
        }
    }
    /// PyTorch's `model.train()`.
    fn train(&self) {
        self.set_training(true)
    }
    /// PyTorch's `model.eval()`.
    fn eval(&self) {
        self.set_training(false)
    }
    /// A copy of this module whose tensors are fresh leaves on `device`. Layers have one; a
    /// user's module is moved by [`to_device`] (build it there, copy the state).
    fn to_device(&self, device: &Device) -> Result<Box<dyn Module>> {
        Err(Error::invalid("Module::to_device", format!("{} on {device}: use nn::to_device with a constructor", self.describe())))
    }
    /// Parameters then buffers, by name: what a checkpoint holds.
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut s = self.parameters();
        s.extend(self.named_buffers());
        s
    }
    /// Copies values from `state` into this module's parameters and buffers, by name. Every
    /// entry must be present with the same shape and dtype; extra names are an error too
    /// (PyTorch's strict load).
    fn load_state_dict(&self, state: &[(String, Tensor)]) -> Result<()> {
        load_into(&self.state_dict(), state)
    }
    /// Clears every parameter's gradient.
    fn zero_grad(&self) {
        for (_, p) in self.parameters() {
            p.set_grad(None);
        }
    }
}

fn prefixed(children: Vec<(String, &dyn Module)>, f: impl Fn(&dyn Module) -> Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    children.into_iter().flat_map(|(name, m)| f(m).into_iter().map(move |(p, t)| (format!("{name}.{p}"), t))).collect()
}

fn load_into(own: &[(String, Tensor)], state: &[(String, Tensor)]) -> Result<()> {
    let by_name: HashMap<&str, &Tensor> = state.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let missing: Vec<&str> = own.iter().map(|p| p.0.as_str()).filter(|n| !by_name.contains_key(n)).collect();
    let own_names: std::collections::HashSet<&str> = own.iter().map(|p| p.0.as_str()).collect();
    let unexpected: Vec<&str> = state.iter().map(|s| s.0.as_str()).filter(|n| !own_names.contains(n)).collect();
    if !missing.is_empty() || !unexpected.is_empty() {
        let (missing, unexpected) = (crate::error::capped_list(missing), crate::error::capped_list(unexpected));
        return Err(Error::invalid("load_state_dict", format!("missing [{missing}], unexpected [{unexpected}]")));
    }
    for (name, p) in own {
        let src = by_name[name.as_str()];
        if src.shape() != p.shape() || src.dtype() != p.dtype() {
            let (got, want) = ((src.shape(), src.dtype()), (p.shape(), p.dtype()));
            return Err(Error::shape("load_state_dict", format!("{name}: file has {got:?}, model has {want:?}")));
        }
        p.assign(src)?;
    }
    Ok(())
}

/// `module` on `device`: `build(device)` makes a fresh one there (the user's constructor), and
/// the state (parameters and buffers) is copied into it. No per-model plumbing is needed.
pub fn to_device<M: Module>(module: &M, device: &Device, build: impl FnOnce(&Device) -> Result<M>) -> Result<M> {
    let moved = build(device)?;
    moved.load_state_dict(&module.state_dict())?;
    Ok(moved)
}

/// Layers applied in order. Each has a name (parametric layers use theirs as the state_dict
/// prefix, as attribute names do in a PyTorch model). A `Conv2d` with a bias followed by a
/// `ReLU` runs as one fused op where the backend has it; values and gradients are the layers'.
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

/// The layer at `i` as a convolution that absorbs the ReLU after it, if the pattern is there.
fn conv_then_relu(layers: &[(String, Box<dyn Module>)], i: usize) -> Option<&Conv2d> {
    let next: &dyn Any = layers.get(i + 1)?.1.as_ref();
    let this: &dyn Any = layers[i].1.as_ref();
    if next.is::<ReLU>() {
        this.downcast_ref::<Conv2d>().filter(|c| c.bias.is_some())
    } else {
        None
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        let mut i = 0;
        while i < self.layers.len() {
            if let Some(conv) = conv_then_relu(&self.layers, i) {
                h = conv.forward_relu(&h)?;
                i += 2;
            } else {
                h = self.layers[i].1.forward(&h)?;
                i += 1;
            }
        }
        Ok(h)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        self.layers.iter().map(|(n, l)| (n.clone(), l.as_ref())).collect()
    }
    fn to_device(&self, device: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(self.slice(0..self.layers.len(), device)?))
    }
    fn describe(&self) -> String {
        let inner: Vec<String> = self.layers.iter().map(|(n, l)| format!("{n}: {}", l.describe())).collect();
        format!("Sequential[{}]", inner.join(", "))
    }
}
