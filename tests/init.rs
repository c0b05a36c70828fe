//! `nn::init`: PyTorch's gains and fans, the distributions' bounds and their mean and standard
//! deviation within sampling error at fixed seeds, the same values on every device, and errors.
mod common;
use common::{on_each_device, rng};
use tandem::nn::init::{self, calculate_gain, fan_in_and_fan_out, FanMode, Nonlinearity};
use tandem::tolerance::assert_close;
use tandem::{Device, Tensor};

/// torch 2.15 `calculate_gain` for linear, conv2d, sigmoid, tanh, relu, selu, leaky_relu (0.01)
/// and leaky_relu with 0.2.
#[test]
fn gains_match_pytorch() {
    use Nonlinearity::*;
    let got: Vec<f32> = [Linear, Conv, Sigmoid, Tanh, Relu, Selu, LeakyRelu(0.01), LeakyRelu(0.2)].map(calculate_gain).to_vec();
    let torch = [1.0, 1.0, 1.0, 1.6666666, std::f32::consts::SQRT_2, 0.75, 1.4141429, 1.3867505];
    assert_close("gains", &got, &torch, 0.0, 1e-7);
}

#[test]
fn fans_follow_linear_and_conv_layouts() {
    let dev = Device::cpu();
    assert_eq!(fan_in_and_fan_out(&Tensor::zeros([50, 320], &dev).unwrap()).unwrap(), (320, 50));
    assert_eq!(fan_in_and_fan_out(&Tensor::zeros([8, 3, 5, 5], &dev).unwrap()).unwrap(), (75, 200));
    let e = fan_in_and_fan_out(&Tensor::zeros([7], &dev).unwrap()).err().unwrap().to_string();
    assert!(e.contains("rank >= 2") && e.contains("[7]"), "{e}");
}

/// Mean and standard deviation of `v`.
fn stats(v: &[f32]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// Passes when the sample mean is within 5 standard errors of 0 and the sample std within 5
/// of its own standard errors (`sqrt((kurtosis - 1) / 4n)` relative) of `std`.
fn check_spread(what: &str, v: &[f32], mean: f64, std: f64, kurtosis: f64) {
    let (m, s) = stats(v);
    let n = v.len() as f64;
    assert!((m - mean).abs() <= 5.0 * std / n.sqrt(), "{what}: mean {m}, want {mean}");
    let rel = ((kurtosis - 1.0) / (4.0 * n)).sqrt();
    assert!((s / std - 1.0).abs() <= 5.0 * rel, "{what}: std {s}, want {std} (within {:.2}%)", 500.0 * rel);
}

const UNIFORM_KURTOSIS: f64 = 1.8;
const NORMAL_KURTOSIS: f64 = 3.0;

#[test]
fn kaiming_and_xavier_spreads_and_bounds() {
    let dev = Device::cpu();
    // A Conv2d weight [out 64, in 16, 5, 5]: fan_in 400, fan_out 1600; 25,600 values.
    let w = Tensor::zeros([64, 16, 5, 5], &dev).unwrap();
    let mut r = rng(7);
    init::kaiming_uniform_(&w, FanMode::FanIn, Nonlinearity::Relu, &mut r).unwrap();
    let v = w.to_vec().unwrap();
    let bound = (2.0f64).sqrt() * (3.0f64 / 400.0).sqrt();
    assert!(v.iter().all(|&x| (x as f64).abs() <= bound * (1.0 + 1e-6)), "kaiming_uniform past its bound {bound}");
    assert!(v.iter().any(|&x| (x as f64).abs() > 0.99 * bound), "kaiming_uniform never near its bound");
    check_spread("kaiming_uniform fan_in relu", &v, 0.0, bound / 3f64.sqrt(), UNIFORM_KURTOSIS);

    init::kaiming_normal_(&w, FanMode::FanOut, Nonlinearity::LeakyRelu(0.2), &mut r).unwrap();
    let gain = (2.0f64 / 1.04).sqrt();
    check_spread("kaiming_normal fan_out leaky", &w.to_vec().unwrap(), 0.0, gain / 1600f64.sqrt(), NORMAL_KURTOSIS);

    init::xavier_uniform_(&w, 5.0 / 3.0, &mut r).unwrap();
    let v = w.to_vec().unwrap();
    let bound = 5.0 / 3.0 * (6.0f64 / 2000.0).sqrt();
    assert!(v.iter().all(|&x| (x as f64).abs() <= bound * (1.0 + 1e-6)), "xavier_uniform past its bound {bound}");
    check_spread("xavier_uniform tanh", &v, 0.0, bound / 3f64.sqrt(), UNIFORM_KURTOSIS);

    init::xavier_normal_(&w, 1.0, &mut r).unwrap();
    check_spread("xavier_normal", &w.to_vec().unwrap(), 0.0, (2.0f64 / 2000.0).sqrt(), NORMAL_KURTOSIS);
}

#[test]
fn normal_uniform_constant_and_truncated() {
    let dev = Device::cpu();
    let t = Tensor::zeros([200, 100], &dev).unwrap().requires_grad();
    let mut r = rng(11);
    init::normal_(&t, 0.5, 0.02, &mut r).unwrap();
    check_spread("normal(0.5, 0.02)", &t.to_vec().unwrap(), 0.5, 0.02, NORMAL_KURTOSIS);
    init::uniform_(&t, -1.0, 3.0, &mut r).unwrap();
    let v = t.to_vec().unwrap();
    assert!(v.iter().all(|&x| (-1.0..3.0).contains(&x)));
    check_spread("uniform(-1, 3)", &v, 1.0, 4.0 / 12f64.sqrt(), UNIFORM_KURTOSIS);
    // N(0, 1) cut to [-2, 2]: variance 1 - 2 * 2 * phi(2) / (Phi(2) - Phi(-2)).
    init::trunc_normal_(&t, 0.0, 1.0, -2.0, 2.0, &mut r).unwrap();
    let v = t.to_vec().unwrap();
    assert!(v.iter().all(|&x| (-2.0..=2.0).contains(&x)));
    let phi2 = (-2.0f64).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let mass = 0.9544997361036416;
    let var = 1.0 - 4.0 * phi2 / mass;
    // kurtosis of this truncated normal is about 2.37
    check_spread("trunc_normal", &v, 0.0, var.sqrt(), 2.4);
    init::constant_(&t, 0.25).unwrap();
    assert!(t.to_vec().unwrap().iter().all(|&x| x == 0.25));
    init::ones_(&t).unwrap();
    assert!(t.to_vec().unwrap().iter().all(|&x| x == 1.0));
    init::zeros_(&t).unwrap();
    assert!(t.to_vec().unwrap().iter().all(|&x| x == 0.0));
    assert!(t.needs_grad() && t.is_leaf(), "init keeps a parameter a trainable leaf");
}

/// Values are drawn on the host: every device gets the CPU's, bit for bit, from the same seed.
#[test]
fn same_seed_same_values_on_every_device() {
    let cpu = Tensor::zeros([33, 7], &Device::cpu()).unwrap();
    init::kaiming_uniform_(&cpu, FanMode::FanIn, Nonlinearity::LeakyRelu(0.0), &mut rng(3)).unwrap();
    on_each_device(|dev, _| {
        let t = Tensor::zeros([33, 7], dev).unwrap();
        init::kaiming_uniform_(&t, FanMode::FanIn, Nonlinearity::LeakyRelu(0.0), &mut rng(3)).unwrap();
        assert_eq!(t.to_vec().unwrap(), cpu.to_vec().unwrap(), "on {dev}");
        Ok(())
    });
}

#[test]
fn bad_arguments_are_errors() {
    let dev = Device::cpu();
    let mut r = rng(0);
    let labels = Tensor::from_labels(vec![1, 2, 3, 4], [2, 2], &dev).unwrap();
    let e = init::normal_(&labels, 0.0, 1.0, &mut r).err().unwrap().to_string();
    assert!(e.contains("normal_"), "{e}");
    let bias = Tensor::zeros([4], &dev).unwrap();
    assert!(init::kaiming_normal_(&bias, FanMode::FanIn, Nonlinearity::Relu, &mut r).is_err());
    assert!(init::xavier_uniform_(&bias, 1.0, &mut r).is_err());
    let w = Tensor::zeros([4, 4], &dev).unwrap();
    assert!(init::normal_(&w, 0.0, -1.0, &mut r).is_err());
    assert!(init::uniform_(&w, 1.0, -1.0, &mut r).is_err());
    let e = init::trunc_normal_(&w, 0.0, 1.0, 10.0, 11.0, &mut r).err().unwrap().to_string();
    assert!(e.contains("too little"), "{e}");
    assert!(init::trunc_normal_(&w, 0.0, 1.0, 1.0, -1.0, &mut r).is_err());
}
