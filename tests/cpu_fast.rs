//! The CPU backend's fast paths change no bit: the fused convolution epilogue and optimizer
//! updates against the same backend with both fusions declined, and every kernel run on one
//! thread against several.
use rand::SeedableRng;
use std::sync::Arc;
use tandem::backend::cpu::CpuBackend;
use tandem::backend::*;
use tandem::nn::{Conv2d, Flatten, Linear, MaxPool2d, Module, ReLU, Sequential};
use tandem::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use tandem::{DType, Device, Layout, Result, Tensor};

/// The CPU backend with the trait's defaults for `matmul_row_bias` and `optim_step`, so that the
/// tensor and optimizer code compose both from plain ops.
struct Unfused(CpuBackend);

impl Backend for Unfused {
    fn info(&self) -> &DeviceInfo {
        self.0.info()
    }
    fn alloc(&self, len: usize, dtype: DType) -> Result<Buffer> {
        self.0.alloc(len, dtype)
    }
    fn upload(&self, bytes: &[u8], dtype: DType) -> Result<Buffer> {
        self.0.upload(bytes, dtype)
    }
    fn download(&self, buf: &Buffer) -> Result<Vec<u8>> {
        self.0.download(buf)
    }
    fn fill(&self, buf: &Buffer, value: f32) -> Result<()> {
        self.0.fill(buf, value)
    }
    fn copy(&self, src: &Buffer, so: usize, dst: &Buffer, d: usize, len: usize) -> Result<()> {
        self.0.copy(src, so, dst, d, len)
    }
    fn unary(&self, op: UnaryOp, x: &Buffer, l: &Layout, out: &Buffer) -> Result<()> {
        self.0.unary(op, x, l, out)
    }
    fn binary(&self, op: BinaryOp, a: &Buffer, la: &Layout, b: &Buffer, lb: &Layout, out: &Buffer) -> Result<()> {
        self.0.binary(op, a, la, b, lb, out)
    }
    fn reduce(&self, op: ReduceOp, x: &Buffer, spec: ReduceSpec, out: &Buffer) -> Result<()> {
        self.0.reduce(op, x, spec, out)
    }
    fn matmul(&self, a: &Buffer, b: &Buffer, out: &Buffer, spec: MatmulSpec) -> Result<()> {
        self.0.matmul(a, b, out, spec)
    }
    fn im2col(&self, x: &Buffer, cols: &Buffer, spec: WindowSpec) -> Result<()> {
        self.0.im2col(x, cols, spec)
    }
    fn col2im(&self, cols: &Buffer, x: &Buffer, spec: WindowSpec) -> Result<()> {
        self.0.col2im(cols, x, spec)
    }
    fn max_pool2d(&self, x: &Buffer, out: &Buffer, argmax: &Buffer, spec: WindowSpec) -> Result<()> {
        self.0.max_pool2d(x, out, argmax, spec)
    }
    fn max_pool2d_backward(&self, g: &Buffer, argmax: &Buffer, gx: &Buffer, spec: WindowSpec) -> Result<()> {
        self.0.max_pool2d_backward(g, argmax, gx, spec)
    }
    fn index(&self, op: IndexOp, x: &Buffer, idx: &Buffer, out: &Buffer, rows: usize, cols: usize) -> Result<()> {
        self.0.index(op, x, idx, out, rows, cols)
    }
    fn sync(&self) -> Result<()> {
        self.0.sync()
    }
    fn memory(&self) -> MemoryStats {
        self.0.memory()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A CNN with a linear layer of more parameters than one elementwise chunk (so the updates run
/// on several threads), with padding (so some columns are zero).
fn model(dev: &Device) -> Sequential {
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    Sequential::new()
        .push("conv1", Conv2d::new(3, 8, 3, &mut r, dev).unwrap())
        .push("relu1", ReLU)
        .push("pool1", MaxPool2d { kernel: 2, stride: 2 })
        .push("flatten", Flatten)
        .push("fc1", Linear::new(8 * 7 * 7, 300, &mut r, dev).unwrap())
        .push("relu2", ReLU)
        .push("fc2", Linear::new(300, 10, &mut r, dev).unwrap())
}

/// Builds an optimizer over the given parameters.
type MakeOptimizer = Box<dyn Fn(Vec<(String, Tensor)>) -> Box<dyn Optimizer>>;

/// Parameters after three steps of `opt` on fixed data, as bit patterns.
fn train(dev: &Device, opt: &dyn Fn(Vec<(String, Tensor)>) -> Box<dyn Optimizer>) -> Vec<Vec<u32>> {
    let m = model(dev);
    let mut o = opt(m.parameters());
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(6);
    let x = Tensor::randn([6, 3, 16, 16], &mut r, dev).unwrap();
    let y = Tensor::from_labels(vec![0, 3, 9, 1, 1, 7], [6], dev).unwrap();
    for _ in 0..3 {
        let loss = m.forward(&x).unwrap().cross_entropy(&y).unwrap();
        o.zero_grad();
        loss.backward().unwrap();
        o.step().unwrap();
    }
    m.parameters().iter().map(|(_, p)| p.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()).collect()
}

#[test]
fn fused_conv_epilogue_and_updates_equal_the_composition_bit_for_bit() {
    let sgd = |c: SgdConfig| move |p| Box::new(Sgd::new(p, c).unwrap()) as Box<dyn Optimizer>;
    let adam = |c: AdamConfig| move |p| Box::new(Adam::new(p, c).unwrap()) as Box<dyn Optimizer>;
    let cases: Vec<(&str, MakeOptimizer)> = vec![
        ("sgd", Box::new(sgd(SgdConfig { lr: 0.1, ..Default::default() }))),
        ("sgd momentum dampening decay", Box::new(sgd(SgdConfig { lr: 0.05, momentum: 0.9, dampening: 0.3, weight_decay: 0.01, ..Default::default() }))),
        ("sgd nesterov", Box::new(sgd(SgdConfig { lr: 0.05, momentum: 0.8, nesterov: true, ..Default::default() }))),
        ("adam decay", Box::new(adam(AdamConfig { lr: 0.01, weight_decay: 0.1, ..Default::default() }))),
        ("adamw", Box::new(adam(AdamConfig { lr: 0.01, ..AdamConfig::adamw() }))),
    ];
    for (name, opt) in &cases {
        let fused = train(&Device::cpu(), opt.as_ref());
        let composed = train(&Device::from_backend(Arc::new(Unfused(CpuBackend::new()))), opt.as_ref());
        for (i, (f, c)) in fused.iter().zip(&composed).enumerate() {
            assert!(f == c, "{name}: parameter {i} differs between the fused and composed CPU paths");
        }
    }
}

/// Forward and backward of the model on a rayon pool of `threads`, outputs and gradients as bits.
fn pass(threads: usize, batch: usize) -> Vec<Vec<u32>> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    pool.install(|| {
        let dev = Device::cpu();
        let m = model(&dev);
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let x = Tensor::randn([batch, 3, 16, 16], &mut r, &dev).unwrap().requires_grad();
        let y = m.forward(&x).unwrap();
        // Sums over long axes of large tensors: the reductions' threaded path.
        let s = x.square().unwrap().sum_all().unwrap();
        y.sum_all().unwrap().add(&s).unwrap().backward().unwrap();
        let mut out = vec![y.to_vec().unwrap(), s.to_vec().unwrap(), x.grad().unwrap().to_vec().unwrap()];
        out.extend(m.parameters().iter().map(|(_, p)| p.grad().unwrap().to_vec().unwrap()));
        out.into_iter().map(|v| v.iter().map(|f| f.to_bits()).collect()).collect()
    })
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let one = pass(1, 96);
    for threads in [2, 3] {
        assert!(pass(threads, 96) == one, "{threads} threads give other bits than one");
    }
}
