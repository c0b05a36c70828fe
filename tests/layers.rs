//! Module (user structs, buffers, modes, state_dict, moving) and the layers, against values
//! computed by hand (checked with PyTorch), finite differences, and the CPU on every device.
mod common;
mod fd;
use common::{assert_close, on_each_device};
use rand::SeedableRng;
use tandem::nn::{
    self, AdaptiveAvgPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, Conv2d, Dropout, Embedding, GeluApproximate, LayerNorm, Linear, Module, ReLU,
    Sequential, SiLU, GELU,
};
use tandem::tensor::random::{philox4x32, uniform};
use tandem::{Device, Error, Result, Tensor};

fn rng(seed: u64) -> rand_chacha::ChaCha8Rng {
    rand_chacha::ChaCha8Rng::seed_from_u64(seed)
}

/// A user's model: a skip connection, a BatchNorm, and one Linear applied twice (shared weights).
struct Net {
    fc: Linear,
    bn: BatchNorm1d,
    drop: Dropout,
}

impl Net {
    fn new(dev: &Device) -> Result<Net> {
        Ok(Net { fc: Linear::new(3, 3, &mut rng(1), dev)?, bn: BatchNorm1d::new(3, dev)?, drop: Dropout::new(0.5)? })
    }
}

impl Module for Net {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.bn.forward(&self.fc.forward(x)?)?.relu()?;
        x.add(&self.fc.forward(&self.drop.forward(&h)?)?)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("fc".into(), &self.fc), ("bn".into(), &self.bn), ("drop".into(), &self.drop)]
    }
    fn describe(&self) -> String {
        "Net".into()
    }
}

#[test]
fn a_user_struct_has_pytorch_names_buffers_and_modes() -> Result<()> {
    let dev = Device::cpu();
    let net = Net::new(&dev)?;
    let names: Vec<String> = net.state_dict().into_iter().map(|p| p.0).collect();
    assert_eq!(names, ["fc.weight", "fc.bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]);
    let x = Tensor::from_vec(vec![1.0, -2.0, 0.5, 3.0, 0.0, -1.0], [2, 3], &dev)?;
    net.forward(&x)?.sum_all()?.backward()?;
    // the shared Linear gets gradient from both uses; every parameter reached
    assert!(net.parameters().iter().all(|(_, p)| p.grad().is_some()));
    assert_eq!(net.bn.named_buffers()[2].1.to_vec()?, [1.0]);
    // eval reaches the BatchNorm (running statistics, no update) and the Dropout (identity)
    net.eval();
    let a = net.forward(&x)?.to_vec()?;
    let b = net.forward(&x)?.to_vec()?;
    assert_eq!(a, b, "eval is deterministic");
    assert_eq!(net.bn.named_buffers()[2].1.to_vec()?, [1.0], "eval does not track");
    net.train();
    net.forward(&x)?;
    assert_eq!(net.bn.named_buffers()[2].1.to_vec()?, [2.0], "train() reached the BatchNorm again");
    Ok(())
}

#[test]
fn shared_weights_are_listed_once() -> Result<()> {
    struct Tied {
        a: Linear,
    }
    impl Module for Tied {
        fn forward(&self, x: &Tensor) -> Result<Tensor> {
            self.a.forward(x)
        }
        fn children(&self) -> Vec<(String, &dyn Module)> {
            vec![("enc".into(), &self.a), ("dec".into(), &self.a)]
        }
        fn describe(&self) -> String {
            "Tied".into()
        }
    }
    let t = Tied { a: Linear::new(2, 2, &mut rng(0), &Device::cpu())? };
    let names: Vec<String> = t.parameters().into_iter().map(|p| p.0).collect();
    assert_eq!(names, ["enc.weight", "enc.bias"]);
    Ok(())
}

/// A reloaded BatchNorm keeps its running statistics (issue 13's 99.6% -> 96.7% bug), on every device.
#[test]
fn load_state_dict_restores_buffers() {
    on_each_device(|dev, _| {
        let net = Net::new(dev)?;
        let x = Tensor::from_vec(vec![1.0, -2.0, 0.5, 3.0, 0.0, -1.0, 2.0, 2.0, -3.0], [3, 3], dev)?;
        for _ in 0..3 {
            net.forward(&x)?;
        }
        net.eval();
        let want = net.forward(&x)?.to_vec()?;
        let fresh = Net::new(dev)?;
        fresh.eval();
        assert_ne!(fresh.forward(&x)?.to_vec()?, want, "a fresh model differs before loading");
        fresh.load_state_dict(&net.state_dict())?;
        assert_eq!(fresh.forward(&x)?.to_vec()?, want);
        assert_eq!(fresh.bn.named_buffers()[2].1.to_vec()?, [3.0]);
        // moved with the public helper: state included
        let moved = nn::to_device(&net, &Device::cpu(), Net::new)?;
        moved.eval();
        assert_close("to_device", &moved.forward(&x.to(&Device::cpu())?)?.to_vec()?, &want, 1e-5, 1e-5);
        Ok(())
    });
}

#[test]
fn load_state_dict_errors_name_the_entry() -> Result<()> {
    let dev = Device::cpu();
    let net = Net::new(&dev)?;
    let mut state = net.state_dict();
    state.pop();
    let e = net.load_state_dict(&state).unwrap_err().to_string();
    assert!(e.contains("missing") && e.contains("bn.num_batches_tracked"), "{e}");
    let mut state = net.state_dict();
    state[4].1 = Tensor::zeros([4], &dev)?;
    let e = net.load_state_dict(&state).unwrap_err().to_string();
    assert!(e.contains("bn.running_mean"), "{e}");
    Ok(())
}

/// Sequential slices (the strategies' copies) carry buffers and mode, and the conv+ReLU fusion
/// is found without a hook in the trait.
#[test]
fn sequential_copies_carry_buffers_and_fuse_conv_relu() -> Result<()> {
    let dev = Device::cpu();
    let mut r = rng(2);
    let model = Sequential::new()
        .push("conv", Conv2d::new(1, 2, 3, &mut r, &dev)?.padding(1).stride(2))
        .push("relu", ReLU)
        .push("bn", BatchNorm2d::new(2, &dev)?);
    let x = Tensor::randn([2, 1, 5, 5], &mut r, &dev)?;
    let y = model.forward(&x)?;
    assert_eq!(y.dims(), [2, 2, 3, 3]);
    let names: Vec<String> = model.state_dict().into_iter().map(|p| p.0).collect();
    assert!(names.contains(&"bn.running_var".to_string()), "{names:?}");
    model.eval();
    let copy = model.slice(0..3, &dev)?;
    assert_eq!(copy.forward(&x)?.to_vec()?, model.forward(&x)?.to_vec()?);
    Ok(())
}

#[test]
fn batch_norm_matches_pytorch_in_train_and_eval() {
    on_each_device(|dev, _| {
        let bn = BatchNorm1d::new(2, dev)?;
        let x = Tensor::from_vec(vec![1.0, 2.0, 3.0, 6.0], [2, 2], dev)?;
        let y = bn.forward(&x)?.to_vec()?;
        assert_close("bn train", &y, &[-0.999995, -0.9999987, 0.999995, 0.9999987], 1e-6, 1e-5);
        let buf = bn.named_buffers();
        assert_close("running_mean", &buf[0].1.to_vec()?, &[0.2, 0.4], 1e-6, 1e-5);
        // unbiased batch variance (2, 8) blended in: 0.9 + 0.1 * (2, 8)
        assert_close("running_var", &buf[1].1.to_vec()?, &[1.1, 1.7], 1e-6, 1e-5);
        bn.eval();
        let want: Vec<f32> = [(1.0, 0.2, 1.1), (2.0, 0.4, 1.7), (3.0, 0.2, 1.1), (6.0, 0.4, 1.7)]
            .iter()
            .map(|&(v, m, s): &(f32, f32, f32)| (v - m) / (s + 1e-5).sqrt())
            .collect();
        assert_close("bn eval", &bn.forward(&x)?.to_vec()?, &want, 1e-6, 1e-5);
        bn.train();
        let one = Tensor::zeros([1, 2], dev)?;
        assert!(matches!(bn.forward(&one), Err(Error::Shape { .. })), "one value per channel cannot train");
        assert!(matches!(bn.forward(&Tensor::zeros([2, 3], dev)?), Err(Error::Shape { .. })));
        Ok(())
    });
}

#[test]
fn norm_layers_have_finite_difference_gradients() {
    fd::gradcheck("batch_norm2d", &[&[3, 2, 2, 2]], -1.0, 1.0, &|x| BatchNorm2d::new(2, &Device::cpu())?.forward(&x[0]));
    fd::gradcheck("layer_norm", &[&[3, 4]], -1.0, 1.0, &|x| LayerNorm::new(&[4], &Device::cpu())?.forward(&x[0]));
    fd::gradcheck("gelu", &[&[2, 5]], -2.0, 2.0, &|x| x[0].gelu());
    fd::gradcheck("gelu_tanh", &[&[2, 5]], -2.0, 2.0, &|x| x[0].gelu_tanh());
    fd::gradcheck("silu", &[&[2, 5]], -2.0, 2.0, &|x| x[0].silu());
    fd::gradcheck("avg_pool2d", &[&[1, 2, 5, 5]], -1.0, 1.0, &|x| x[0].avg_pool2d(3, 2, 1));
    fd::gradcheck("adaptive_avg_pool2d", &[&[1, 2, 5, 5]], -1.0, 1.0, &|x| x[0].adaptive_avg_pool2d((3, 2)));
}

#[test]
fn layer_norm_activations_and_pools_match_pytorch() {
    on_each_device(|dev, _| {
        let ln = LayerNorm::new(&[3], dev)?;
        let y = ln.forward(&Tensor::from_vec(vec![1.0, 2.0, 3.0], [1, 3], dev)?)?.to_vec()?;
        assert_close("layer_norm", &y, &[-1.2247357, 0.0, 1.2247357], 1e-6, 1e-5);
        let x = Tensor::from_vec(vec![-1.0, 0.0, 0.5, 2.0], [4], dev)?;
        let exact = GELU::default().forward(&x)?.to_vec()?;
        assert_close("gelu", &exact, &[-0.15865526, 0.0, 0.34573123, 1.9544997], 1e-6, 2e-6);
        let tanh = GELU { approximate: GeluApproximate::Tanh }.forward(&x)?.to_vec()?;
        assert_close("gelu_tanh", &tanh, &[-0.158808, 0.0, 0.345714, 1.9545977], 1e-6, 2e-6);
        assert_close("silu", &SiLU.forward(&Tensor::ones([1], dev)?)?.to_vec()?, &[0.7310586], 1e-6, 1e-6);
        let img = Tensor::from_vec((0..25).map(|v| v as f32).collect(), [1, 1, 5, 5], dev)?;
        let ad = AdaptiveAvgPool2d { output: (3, 3) }.forward(&img)?.to_vec()?;
        assert_close("adaptive", &ad, &[3.0, 4.5, 6.0, 10.5, 12.0, 13.5, 18.0, 19.5, 21.0], 1e-6, 1e-6);
        let av = AvgPool2d { kernel: 3, stride: 2, padding: 1 }.forward(&img)?.to_vec()?;
        assert_close("avg_pool", &av, &[1.3333334, 3.0, 2.6666667, 7.0, 12.0, 9.0, 8.0, 13.0, 9.333333], 1e-6, 1e-6);
        assert!(matches!(LayerNorm::new(&[4], dev)?.forward(&img), Err(Error::Shape { .. })));
        assert!(matches!(x.avg_pool2d(2, 2, 0), Err(Error::Shape { .. })));
        Ok(())
    });
}

/// Random123's known-answer vectors for philox4x32_10.
#[test]
fn philox_matches_the_reference_vectors() {
    assert_eq!(philox4x32([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
    assert_eq!(philox4x32([u32::MAX; 4], [u32::MAX; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
    let pi = philox4x32([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]);
    assert_eq!(pi, [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]);
    // a stream read from an offset is the same stream
    assert_eq!(uniform(5, 7, 10).unwrap(), uniform(5, 0, 17).unwrap()[7..]);
}

#[test]
fn dropout_masks_are_the_same_on_every_device_and_scale_the_kept() {
    on_each_device(|dev, cpu| {
        let n = 70_000;
        let (d, c) = (Dropout::new(0.25)?.seed(9), Dropout::new(0.25)?.seed(9));
        let x = Tensor::ones([n], dev)?;
        let got = d.forward(&x)?.to_vec()?;
        assert_eq!(got, c.forward(&Tensor::ones([n], cpu)?)?.to_vec()?, "same mask as the CPU's");
        assert!(got.iter().all(|&v| v == 0.0 || v == 1.0 / 0.75));
        let dropped = got.iter().filter(|&&v| v == 0.0).count() as f32 / n as f32;
        assert!((dropped - 0.25).abs() < 0.01, "dropped {dropped}");
        assert_ne!(d.forward(&x)?.to_vec()?, got, "the next call draws new values");
        d.eval();
        assert_eq!(d.forward(&x)?.to_vec()?, vec![1.0; n]);
        Ok(())
    });
    assert!(matches!(Dropout::new(1.5), Err(Error::Invalid { .. })));
}

#[test]
fn embedding_looks_up_rows_and_sums_repeated_gradients() {
    on_each_device(|dev, _| {
        let e = Embedding { weight: Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 2], dev)?.requires_grad() };
        let ids = Tensor::from_labels(vec![2, 0, 2, 2], [2, 2], dev)?;
        let y = e.forward(&ids)?;
        assert_eq!(y.dims(), [2, 2, 2]);
        assert_eq!(y.to_vec()?, [5.0, 6.0, 1.0, 2.0, 5.0, 6.0, 5.0, 6.0]);
        y.sum_all()?.backward()?;
        assert_eq!(e.weight.grad().unwrap().to_vec()?, [1.0, 1.0, 0.0, 0.0, 3.0, 3.0]);
        let bad = Tensor::from_labels(vec![3], [1], dev)?;
        assert!(matches!(e.forward(&bad), Err(Error::Label { label: 3, .. })));
        Ok(())
    });
}

/// A strategy's state_dict holds the model's buffers, and loading it back is strict and restores
/// them (Single and DataParallel; LayerPlacement and Pipeline share `stage_params`).
#[test]
fn strategy_state_dicts_carry_buffers() -> Result<()> {
    use std::sync::Arc;
    use tandem::backend::cpu::CpuBackend;
    use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Single, Strategy};
    let dev = Device::cpu();
    let model = || -> Result<Sequential> {
        Ok(Sequential::new().push("fc", Linear::new(4, 3, &mut rng(5), &Device::cpu())?).push("bn", BatchNorm1d::new(3, &Device::cpu())?))
    };
    let opt = OptimConfig::sgd(Default::default());
    let single = Single::new(model()?, &opt, Loss::Mse, &dev)?;
    let cpus: Vec<Device> = (0..2).map(|_| Device::from_backend(Arc::new(CpuBackend::new()))).collect();
    let mut dp = DataParallel::new(&model()?, &cpus, &opt, Loss::Mse, DataParallelConfig::default())?;
    for s in [&single as &dyn Strategy, &dp] {
        let names: Vec<String> = s.state_dict()?.into_iter().map(|p| p.0).collect();
        assert!(names.contains(&"bn.running_var".to_string()), "{names:?}");
    }
    let mut state = single.state_dict()?;
    let var = state.iter().position(|p| p.0 == "bn.running_var").unwrap();
    state[var].1 = Tensor::full(4.0, [3], &dev)?;
    dp.load_state_dict(&state)?;
    let back = dp.state_dict()?;
    assert_eq!(back.iter().find(|p| p.0 == "bn.running_var").unwrap().1.to_vec()?, [4.0; 3]);
    Ok(())
}
