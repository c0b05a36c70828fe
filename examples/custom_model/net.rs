//! The custom model's network, optimizer, schedule, loss and training run, shared by the
//! example (`main.rs`) and its tests (`tests/custom_model.rs`). The network is
//! scripts/custom_model_parity.py's `Net` with the same attribute names, so its `state_dict`
//! loads into PyTorch with `strict=True`: two strided Conv2d (no bias) + BatchNorm2d + ReLU
//! blocks, a Linear, two pre-LayerNorm residual MLP blocks with GELU and Dropout, and a
//! LayerNorm + Linear head.
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tandem::data::{DataLoader, Dataset};
use tandem::nn::{self, BatchNorm2d, Conv2d, Dropout, Flatten, LayerNorm, Linear, Module, Sequential, GELU};
use tandem::optim::{AdamConfig, LrSchedule, OptimConfig, ParamGroups};
use tandem::parallel::{Loss, Strategy};
use tandem::train::{Accuracy, Trainer};
use tandem::{CrossEntropy, Device, Result, Tensor};

/// Widths and training-time behaviour of the network.
#[derive(Clone, Copy, Debug)]
pub struct NetConfig {
    /// Channels of the two convolutions.
    pub c1: usize,
    pub c2: usize,
    /// Width of the residual stream and of each block's hidden layer.
    pub d: usize,
    pub hidden: usize,
    pub dropout: f32,
    /// BatchNorm always in eval mode (running statistics, only the affine part trains), whatever
    /// `set_training` says: the usual way to fine-tune a BatchNorm model, and what makes data
    /// and pipeline parallelism equal `Single` (their training statistics are per shard).
    pub freeze_bn: bool,
    /// Seeds the initial weights and the dropout masks.
    pub seed: u64,
}

impl NetConfig {
    /// What the example trains.
    pub const EXAMPLE: NetConfig = NetConfig { c1: 16, c2: 32, d: 128, hidden: 256, dropout: 0.1, freeze_bn: false, seed: 0 };
}

/// Conv2d without bias, BatchNorm2d, ReLU.
struct ConvBn {
    conv: Conv2d,
    bn: BatchNorm2d,
    /// (in, out, kernel, stride, padding), to rebuild the block on another device.
    shape: [usize; 5],
    freeze_bn: bool,
}

impl ConvBn {
    fn new(shape: [usize; 5], freeze_bn: bool, rng: &mut ChaCha8Rng, dev: &Device) -> Result<Self> {
        let [cin, cout, k, stride, padding] = shape;
        // No bias: BatchNorm subtracts the channel mean, so a bias would get a zero gradient
        // (up to rounding, which AdamW would amplify into steps of ~lr).
        let conv = Conv2d::new(cin, cout, k, rng, dev)?.stride(stride).padding(padding).no_bias();
        let block = ConvBn { conv, bn: BatchNorm2d::new(cout, dev)?, shape, freeze_bn };
        block.set_training(true);
        Ok(block)
    }
}

impl Module for ConvBn {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.bn.forward(&self.conv.forward(x)?)?.relu()
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("conv".into(), &self.conv), ("bn".into(), &self.bn)]
    }
    fn set_training(&self, training: bool) {
        self.bn.set_training(training && !self.freeze_bn);
    }
    fn to_device(&self, device: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(nn::to_device(self, device, |d| ConvBn::new(self.shape, self.freeze_bn, &mut ChaCha8Rng::seed_from_u64(0), d))?))
    }
    fn describe(&self) -> String {
        format!("ConvBn{:?}", self.shape)
    }
}

/// Pre-LayerNorm residual MLP: `x + fc2(drop(gelu(fc1(ln(x)))))`.
struct Residual {
    ln: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    drop: Dropout,
    /// (d, hidden, dropout seed) and p, to rebuild the block on another device.
    dims: [usize; 3],
    p: f32,
}

impl Residual {
    fn new(dims: [usize; 3], p: f32, rng: &mut ChaCha8Rng, dev: &Device) -> Result<Self> {
        let [d, hidden, seed] = dims;
        Ok(Residual {
            ln: LayerNorm::new(&[d], dev)?,
            fc1: Linear::new(d, hidden, rng, dev)?,
            fc2: Linear::new(hidden, d, rng, dev)?,
            drop: Dropout::new(p)?.seed(seed as u64),
            dims,
            p,
        })
    }
}

impl Module for Residual {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = GELU::default().forward(&self.fc1.forward(&self.ln.forward(x)?)?)?;
        x.add(&self.fc2.forward(&self.drop.forward(&h)?)?)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("ln".into(), &self.ln), ("fc1".into(), &self.fc1), ("fc2".into(), &self.fc2), ("drop".into(), &self.drop)]
    }
    fn to_device(&self, device: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(nn::to_device(self, device, |d| Residual::new(self.dims, self.p, &mut ChaCha8Rng::seed_from_u64(0), d))?))
    }
    fn describe(&self) -> String {
        format!("Residual({}, {})", self.dims[0], self.dims[1])
    }
}

/// LayerNorm, then Linear to the 10 classes.
struct Head {
    ln: LayerNorm,
    fc: Linear,
}

impl Head {
    fn new(d: usize, rng: &mut ChaCha8Rng, dev: &Device) -> Result<Self> {
        Ok(Head { ln: LayerNorm::new(&[d], dev)?, fc: Linear::new(d, 10, rng, dev)? })
    }
}

impl Module for Head {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.fc.forward(&self.ln.forward(x)?)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("ln".into(), &self.ln), ("fc".into(), &self.fc)]
    }
    fn to_device(&self, device: &Device) -> Result<Box<dyn Module>> {
        let d = self.ln.weight.numel();
        Ok(Box::new(nn::to_device(self, device, |dev| Head::new(d, &mut ChaCha8Rng::seed_from_u64(0), dev))?))
    }
    fn describe(&self) -> String {
        "Head".into()
    }
}

/// The network on `dev`, as a `Sequential` of the blocks (layer placement and the pipeline cut
/// it between blocks). `[N, 1, 28, 28]` images to `[N, 10]` logits.
pub fn build(cfg: NetConfig, dev: &Device) -> Result<Sequential> {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let seed = cfg.seed as usize;
    Ok(Sequential::new()
        .push("conv1", ConvBn::new([1, cfg.c1, 5, 2, 2], cfg.freeze_bn, &mut rng, dev)?) // 28x28 -> 14x14
        .push("conv2", ConvBn::new([cfg.c1, cfg.c2, 3, 2, 1], cfg.freeze_bn, &mut rng, dev)?) // 14x14 -> 7x7
        .push("flat", Flatten)
        .push("fc", Linear::new(cfg.c2 * 49, cfg.d, &mut rng, dev)?)
        .push("block1", Residual::new([cfg.d, cfg.hidden, seed + 1], cfg.dropout, &mut rng, dev)?)
        .push("block2", Residual::new([cfg.d, cfg.hidden, seed + 2], cfg.dropout, &mut rng, dev)?)
        .push("head", Head::new(cfg.d, &mut rng, dev)?))
}

/// Peak learning rate of AdamW; the schedule ends at a tenth of it.
pub const LR: f32 = 3e-3;
/// Global gradient-norm bound.
pub const CLIP: f32 = 1.0;

/// AdamW (lr 3e-3, weight decay 0.05) without decay on biases and norm weights (rank < 2).
pub fn optimizer() -> OptimConfig {
    OptimConfig::adam(AdamConfig { lr: LR, weight_decay: 0.05, ..AdamConfig::adamw() }).with_groups(ParamGroups::no_decay_for_biases_and_norms())
}

/// Linear warmup over the first `warmup` steps, then cosine down to `LR / 10` at `steps`.
pub fn schedule(steps: u64, warmup: u64) -> LrSchedule {
    LrSchedule::WarmupCosine { lr: LR, warmup_steps: warmup, decay_steps: steps, min_lr: LR / 10.0 }
}

/// Cross-entropy with label smoothing 0.1, as a closure over (logits, labels).
pub fn loss() -> Loss {
    Loss::custom(|out, y| out.cross_entropy_with(y, CrossEntropy { label_smoothing: 0.1, ..Default::default() }))
}

/// The example's run of `steps` steps on `strategy`: the schedule (a tenth of the steps warm
/// up), clipping at [`CLIP`], and test accuracy measured after the last step.
pub fn trainer(strategy: Box<dyn Strategy>, steps: u64, test: Arc<Dataset>) -> Result<Trainer> {
    let test = DataLoader::new(test, 256, false, 0)?;
    Ok(Trainer::boxed(strategy).steps(steps).schedule(schedule(steps, steps / 10)).grad_clip(Some(CLIP)).validate(
        steps,
        test,
        vec![Box::new(Accuracy::new())],
    ))
}

/// The training batches: `batch` samples, reshuffled each epoch, no short last batch.
pub fn loader(train: Arc<Dataset>, batch: usize) -> Result<DataLoader> {
    DataLoader::new(train, batch, true, 0)?.drop_last(true)
}
