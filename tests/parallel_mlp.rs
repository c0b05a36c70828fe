//! `ParallelMlp` (Megatron's column-parallel `c_fc`, row-parallel `c_proj`) equals the unsplit
//! MLP on 2 devices, values and gradients, alone and trained inside a user's model; on CPU
//! devices and on logical devices of `wgpu:0`.
mod common;

use common::assert_close;
use tandem::nn::{GeluApproximate, LayerNorm, Linear, Module, GELU};
use tandem::optim::{clip_grad_norm, AdamConfig, OptimConfig};
use tandem::parallel::ParallelMlp;
use tandem::{Device, Error, Result, Tensor};

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec().unwrap()
}

fn grad(t: &Tensor) -> Vec<f32> {
    t.grad().expect("a gradient").to_vec().unwrap()
}

/// `sum(out * c)` for a fixed `c`: every output element gets its own gradient.
fn probe(out: &Tensor, seed: u64) -> Result<Tensor> {
    let c = Tensor::randn(out.shape().clone(), &mut common::rng(seed), out.device())?;
    out.mul(&c)?.sum_all()
}

#[test]
fn parallel_mlp_equals_the_unsplit_mlp_values_and_gradients() {
    let _guard = common::shared();
    for (family, devs) in common::device_families(3) {
        let home = &devs[0];
        // 7 hidden features: an uneven split (4 + 3); both GELU forms.
        for (hidden, act) in [(7, GELU::default()), (16, GELU { approximate: GeluApproximate::Tanh })] {
            let what = format!("{family}, hidden {hidden}, {act:?}");
            let mut rng = common::rng(1);
            let (fc, proj) = (Linear::new(5, hidden, &mut rng, home).unwrap(), Linear::new(hidden, 5, &mut rng, home).unwrap());
            let x = Tensor::randn([3, 5], &mut rng, home).unwrap().requires_grad();
            let y = proj.forward(&act.forward(&fc.forward(&x).unwrap()).unwrap()).unwrap();
            probe(&y, 2).unwrap().backward().unwrap();
            let gx = grad(&x);
            x.set_grad(None);

            let mlp = ParallelMlp::from_linears(&fc, &proj, act, &devs[..2]).unwrap();
            let py = mlp.forward(&x).unwrap();
            assert!(py.device().same(home), "{what}: the output is on the first device");
            probe(&py, 2).unwrap().backward().unwrap();
            assert_close(&format!("{what}: forward"), &values(&py), &values(&y), 1e-6, 1e-5);
            assert_close(&format!("{what}: input gradient"), &grad(&x), &gx, 1e-6, 1e-5);
            let (c_fc, c_proj) = (mlp.c_fc(), mlp.c_proj());
            assert_close(&format!("{what}: c_fc weight gradient"), &values(&c_fc.weight_grad().unwrap().unwrap()), &grad(&fc.weight), 1e-6, 1e-5);
            assert_close(
                &format!("{what}: c_fc bias gradient"),
                &values(&c_fc.bias_grad().unwrap().unwrap()),
                &grad(fc.bias.as_ref().unwrap()),
                1e-6,
                1e-5,
            );
            assert_close(
                &format!("{what}: c_proj weight gradient"),
                &values(&c_proj.weight_grad().unwrap().unwrap()),
                &grad(&proj.weight),
                1e-6,
                1e-5,
            );
            assert_close(&format!("{what}: c_proj bias gradient"), &grad(&c_proj.bias().unwrap()), &grad(proj.bias.as_ref().unwrap()), 1e-6, 1e-5);
            let shard_devices: Vec<bool> = mlp.parameters().iter().map(|(_, t)| t.device().same(&devs[1])).collect();
            assert!(shard_devices.contains(&true) && shard_devices.contains(&false), "{what}: the shards sit on both devices");
        }
    }
}

/// A user's pre-LayerNorm residual block around an MLP, unsplit or parallel.
struct Block<M> {
    ln: LayerNorm,
    mlp: M,
}

impl<M: Module> Module for Block<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.add(&self.mlp.forward(&self.ln.forward(x)?)?)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("ln".into(), &self.ln), ("mlp".into(), &self.mlp)]
    }
    fn describe(&self) -> String {
        "Block".into()
    }
}

/// The unsplit MLP, for the reference block.
struct Mlp {
    c_fc: Linear,
    c_proj: Linear,
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.c_proj.forward(&GELU::default().forward(&self.c_fc.forward(x)?)?)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("c_fc".into(), &self.c_fc), ("c_proj".into(), &self.c_proj)]
    }
    fn describe(&self) -> String {
        "Mlp".into()
    }
}

/// Five AdamW steps with clipping; the losses and the final state by unsplit name.
fn train(block: &dyn Module, x: &Tensor, target: &Tensor) -> (Vec<f32>, Vec<(String, Tensor)>) {
    let mut opt = OptimConfig::adam(AdamConfig { lr: 1e-2, ..AdamConfig::adamw() }).build(block.parameters()).unwrap();
    let mut losses = Vec::new();
    for _ in 0..5 {
        opt.zero_grad();
        let loss = block.forward(x).unwrap().mse_loss(target).unwrap();
        losses.push(loss.to_scalar().unwrap());
        loss.backward().unwrap();
        clip_grad_norm(opt.params(), 0.5).unwrap();
        opt.step().unwrap();
    }
    (losses, block.state_dict())
}

#[test]
fn parallel_mlp_trains_inside_a_users_model_like_the_unsplit_one() {
    let _guard = common::shared();
    for (family, devs) in common::device_families(3) {
        let home = &devs[0];
        let mut rng = common::rng(4);
        let (fc, proj) = (Linear::new(6, 12, &mut rng, home).unwrap(), Linear::new(12, 6, &mut rng, home).unwrap());
        let x = Tensor::randn([4, 6], &mut rng, home).unwrap();
        let target = Tensor::randn([4, 6], &mut rng, home).unwrap();
        let parallel =
            Block { ln: LayerNorm::new(&[6], home).unwrap(), mlp: ParallelMlp::from_linears(&fc, &proj, GELU::default(), &devs[..2]).unwrap() };
        let (got, _) = train(&parallel, &x, &target);
        let plain = Block { ln: LayerNorm::new(&[6], home).unwrap(), mlp: Mlp { c_fc: fc, c_proj: proj } };
        let (want, state) = train(&plain, &x, &target);
        assert_close(&format!("{family}: losses"), &got, &want, 1e-6, 1e-5);
        let mut got_state = parallel.mlp.unsplit_state().unwrap();
        got_state.extend(parallel.ln.state_dict().into_iter().map(|(n, t)| (format!("ln.{n}"), t)));
        for (name, t) in &state {
            let short = name.strip_prefix("mlp.").unwrap_or(name);
            let (_, mine) = got_state.iter().find(|(n, _)| n == short).unwrap_or_else(|| panic!("{name} in the parallel block"));
            assert_close(&format!("{family}: {name} after 5 steps"), &values(mine), &values(t), 1e-5, 1e-4);
        }
    }
}

#[test]
fn mismatched_layers_are_an_error() {
    let dev = Device::cpu();
    let mut rng = common::rng(0);
    let (fc, proj) = (Linear::new(4, 8, &mut rng, &dev).unwrap(), Linear::new(6, 4, &mut rng, &dev).unwrap());
    let err = ParallelMlp::from_linears(&fc, &proj, GELU::default(), &[dev.clone(), dev.clone()]).err().expect("8 features into 6");
    assert!(
        matches!(err, Error::Shape { op: "ParallelMlp", .. }) && err.to_string().contains("[8, 4]") && err.to_string().contains("[4, 6]"),
        "{err}"
    );
    let small = Linear::new(4, 1, &mut rng, &dev).unwrap();
    let back = Linear::new(1, 4, &mut rng, &dev).unwrap();
    assert!(ParallelMlp::from_linears(&small, &back, GELU::default(), &[dev.clone(), dev]).is_err(), "1 hidden feature over 2 devices");
}
