//! The layers: Linear, Conv2d, MaxPool2d, ReLU, Flatten, Embedding, with PyTorch's default initialisation.
use super::Module;
use crate::{Device, Error, Result, Tensor};
use rand::Rng;

/// PyTorch's default for Linear and Conv2d: kaiming_uniform(a = sqrt(5)) for the weight, which
/// is U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the bias from the same range.
fn init_pair(w_shape: Vec<usize>, fan_in: usize, bias: bool, rng: &mut impl Rng, dev: &Device) -> Result<(Tensor, Option<Tensor>)> {
    let bound = 1.0 / (fan_in.max(1) as f32).sqrt();
    let w = Tensor::rand_uniform(-bound, bound, w_shape.clone(), rng, dev)?.requires_grad();
    let b = if bias { Some(Tensor::rand_uniform(-bound, bound, [w_shape[0]], rng, dev)?.requires_grad()) } else { None };
    Ok((w, b))
}

/// A layer of width 0 has nothing to learn and is always a slip: each of `args` must be at
/// least 1, else an [`Error::Invalid`] of `layer` naming the argument.
pub(super) fn nonzero(layer: &'static str, args: &[(&str, usize)]) -> Result<()> {
    match args.iter().find(|(_, v)| *v == 0) {
        Some((name, _)) => Err(Error::invalid(layer, format!("{name} is 0; a layer needs at least 1"))),
        None => Ok(()),
    }
}

pub(super) fn leaf_on(t: &Tensor, dev: &Device) -> Result<Tensor> {
    Ok(copy_on(t, dev)?.requires_grad())
}

/// A copy of `t` on `dev` that shares no storage with it (buffers, and leaves before
/// `requires_grad`): `to` on the same device would share, and the copy must train on its own.
pub(super) fn copy_on(t: &Tensor, dev: &Device) -> Result<Tensor> {
    if !t.device().same(dev) {
        return Ok(t.detach().to(dev)?.detach());
    }
    let own = match t.dtype() {
        crate::DType::I32 => Tensor::from_labels(vec![0; t.numel()], t.shape().clone(), dev)?,
        _ => Tensor::zeros(t.shape().clone(), dev)?,
    };
    own.assign(t)?;
    Ok(own)
}

fn params(w: &Tensor, b: &Option<Tensor>) -> Vec<(String, Tensor)> {
    let mut p = vec![("weight".to_string(), w.clone())];
    if let Some(b) = b {
        p.push(("bias".to_string(), b.clone()));
    }
    p
}

/// `y = x·Wᵀ + b` with weight `[out, in]`. A width of 0 is an [`Error::Invalid`] of `Linear`
/// naming `inputs` or `outputs`.
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    pub fn new(inputs: usize, outputs: usize, rng: &mut impl Rng, dev: &Device) -> Result<Self> {
        nonzero("Linear", &[("inputs", inputs), ("outputs", outputs)])?;
        let (weight, bias) = init_pair(vec![outputs, inputs], inputs, true, rng, dev)?;
        Ok(Linear { weight, bias })
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (o, i) = (self.weight.dims()[0], self.weight.dims()[1]);
        if x.dims().last() != Some(&i) {
            return Err(Error::shape("Linear", format!("input {:?} does not end in in_features {i} (weight [{o}, {i}])", x.shape())));
        }
        let y = x.matmul_t(&self.weight, false, true)?;
        match &self.bias {
            // Under autocast the bias joins the product's type, as in PyTorch's addmm.
            Some(b) => y.add(&b.autocast_operand()?),
            None => Ok(y),
        }
    }
    fn parameters(&self) -> Vec<(String, Tensor)> {
        params(&self.weight, &self.bias)
    }
    fn to_device(&self, dev: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(Linear { weight: leaf_on(&self.weight, dev)?, bias: self.bias.as_ref().map(|b| leaf_on(b, dev)).transpose()? }))
    }
    fn describe(&self) -> String {
        format!("Linear({}, {})", self.weight.dims()[1], self.weight.dims()[0])
    }
}

/// 2-D convolution with weight `[out, in, kh, kw]`.
pub struct Conv2d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub stride: (usize, usize),
    pub padding: (usize, usize),
}

impl Conv2d {
    /// PyTorch's `Conv2d(inputs, outputs, kernel)`: stride 1, no padding, with a bias. Any of
    /// the three 0 is an [`Error::Invalid`] of `Conv2d` naming it.
    pub fn new(inputs: usize, outputs: usize, kernel: usize, rng: &mut impl Rng, dev: &Device) -> Result<Self> {
        nonzero("Conv2d", &[("inputs", inputs), ("outputs", outputs), ("kernel", kernel)])?;
        let (weight, bias) = init_pair(vec![outputs, inputs, kernel, kernel], inputs * kernel * kernel, true, rng, dev)?;
        Ok(Conv2d { weight, bias, stride: (1, 1), padding: (0, 0) })
    }
    /// The same layer with `stride` (both dimensions).
    pub fn stride(mut self, stride: usize) -> Self {
        self.stride = (stride, stride);
        self
    }
    /// The same layer with zero `padding` on every side.
    pub fn padding(mut self, padding: usize) -> Self {
        self.padding = (padding, padding);
        self
    }
    /// The same layer without its bias (`bias=False`).
    pub fn no_bias(mut self) -> Self {
        self.bias = None;
        self
    }
    /// `relu(self.forward(x))` with the ReLU in the product's epilogue (`Sequential` calls it
    /// for a convolution followed by a `ReLU`).
    pub(super) fn forward_relu(&self, x: &Tensor) -> Result<Tensor> {
        match &self.bias {
            Some(b) => x.conv2d_bias_relu(&self.weight, b, self.stride, self.padding),
            None => self.forward(x)?.relu(),
        }
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.bias {
            Some(b) => x.conv2d_bias(&self.weight, b, self.stride, self.padding),
            None => x.conv2d(&self.weight, self.stride, self.padding),
        }
    }
    fn parameters(&self) -> Vec<(String, Tensor)> {
        params(&self.weight, &self.bias)
    }
    fn to_device(&self, dev: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(Conv2d {
            weight: leaf_on(&self.weight, dev)?,
            bias: self.bias.as_ref().map(|b| leaf_on(b, dev)).transpose()?,
            stride: self.stride,
            padding: self.padding,
        }))
    }
    fn describe(&self) -> String {
        let d = self.weight.dims();
        format!("Conv2d({}, {}, k={}, stride={:?}, padding={:?})", d[1], d[0], d[2], self.stride, self.padding)
    }
}

/// Max pooling with a square window; the stride defaults to the window (PyTorch's default).
#[derive(Clone, Copy)]
pub struct MaxPool2d {
    pub kernel: usize,
    pub stride: usize,
}

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.max_pool2d((self.kernel, self.kernel), (self.stride, self.stride), (0, 0))
    }
    fn to_device(&self, _: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(*self))
    }
    fn describe(&self) -> String {
        format!("MaxPool2d({}, {})", self.kernel, self.stride)
    }
}

#[derive(Clone, Copy)]
pub struct ReLU;

impl Module for ReLU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.relu()
    }
    fn to_device(&self, _: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(ReLU))
    }
    fn describe(&self) -> String {
        "ReLU".into()
    }
}

/// `x.view(N, -1)`.
#[derive(Clone, Copy)]
pub struct Flatten;

impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.flatten()
    }
    fn to_device(&self, _: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(Flatten))
    }
    fn describe(&self) -> String {
        "Flatten".into()
    }
}

/// A lookup table `[num_embeddings, embedding_dim]`, initialised N(0, 1) as PyTorch's; the
/// input is I32 ids of any shape, the output has `embedding_dim` appended. Either size 0 is
/// an [`Error::Invalid`] of `Embedding` naming it.
pub struct Embedding {
    pub weight: Tensor,
}

impl Embedding {
    pub fn new(num_embeddings: usize, embedding_dim: usize, rng: &mut impl Rng, dev: &Device) -> Result<Self> {
        nonzero("Embedding", &[("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)])?;
        Ok(Embedding { weight: Tensor::randn([num_embeddings, embedding_dim], rng, dev)?.requires_grad() })
    }
}

impl Module for Embedding {
    /// An id outside `0..num_embeddings` is an [`Error::Label`](crate::Error::Label) of
    /// `Embedding`: "token id X at index I is outside 0..V (vocab_size V)".
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        ids.check_labels("Embedding", self.weight.dims()[0])?;
        self.weight.index_select(ids)
    }
    fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".into(), self.weight.clone())]
    }
    fn to_device(&self, dev: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(Embedding { weight: leaf_on(&self.weight, dev)? }))
    }
    fn describe(&self) -> String {
        format!("Embedding({}, {})", self.weight.dims()[0], self.weight.dims()[1])
    }
}
