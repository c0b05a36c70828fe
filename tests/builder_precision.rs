//! Every builder of `Parallel` sets the precision (and F16's loss scaler): each strategy built
//! with `.precision(Bf16)` trains bit for bit as the same strategy given
//! `Strategy::set_precision` after it is built, and not as in F32.
mod common;
use common::{cycled_devices, seed_image_batches};
use tandem::nn::models::SeedModel;
use tandem::optim::{GradScaler, Precision, SgdConfig};
use tandem::parallel::{Loss, OptimConfig, Parallel, Split, Stages, Strategy};
use tandem::Device;

fn opt() -> OptimConfig {
    OptimConfig::sgd(SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() })
}

fn cnn(d: &Device) -> tandem::Result<tandem::nn::Sequential> {
    SeedModel::Cnn.build(3, d)
}

/// Every kind of strategy from its builder, named, in `precision` when it is given.
fn every_strategy(precision: Option<Precision>) -> Vec<(&'static str, Box<dyn Strategy>)> {
    let d = cycled_devices(4);
    let model = cnn(&d[0]).unwrap();
    let loss = || Loss::CrossEntropy;
    let p = precision.unwrap_or_default();
    let split = || Stages::Split(&model, Split::At(vec![6]));
    // Each builder untouched without a precision, so that the F32 strategies come from the code
    // path that does not set one.
    macro_rules! with {
        ($b:expr) => {
            match precision {
                Some(_) => $b.precision(p).boxed().unwrap(),
                None => $b.boxed().unwrap(),
            }
        };
    }
    vec![
        ("single", with!(Parallel::single(cnn, &d[0], &opt(), loss()))),
        ("data", with!(Parallel::data(cnn, &d[..2], &opt(), loss()))),
        ("layers", with!(Parallel::layers(split(), &d[..2], &opt(), loss()))),
        ("pipeline", with!(Parallel::pipeline(split(), &d[..2], &opt(), loss()).micro_batches(2))),
        ("tensor", with!(Parallel::tensor(&model, &d[..2], &opt(), loss()))),
        ("grid", with!(Parallel::grid(|_| Ok(split()), &d, 2, &opt(), loss()).micro_batches(2))),
    ]
}

fn losses(s: &mut dyn Strategy) -> Vec<u32> {
    seed_image_batches(8, 2, 5).iter().map(|b| s.step(b).unwrap().loss.to_bits()).collect()
}

#[test]
fn every_builder_sets_the_precision() {
    let built = every_strategy(Some(Precision::Bf16));
    let mut set_after = every_strategy(None);
    let mut f32s = every_strategy(None);
    for (((name, mut a), (_, b)), (_, c)) in built.into_iter().zip(set_after.iter_mut()).zip(f32s.iter_mut()) {
        assert_eq!(a.core().precision(), Precision::Bf16, "{name}: the builder's precision was not set");
        b.set_precision(Precision::Bf16, None).unwrap();
        let (got, want, f32) = (losses(&mut *a), losses(&mut **b), losses(&mut **c));
        assert_eq!(got, want, "{name}: built in bf16 differs from set_precision(Bf16)");
        assert_ne!(got, f32, "{name}: built in bf16 trains as in f32");
    }
}

#[test]
fn the_grad_scaler_sets_f16_with_that_scaler() {
    let d = cycled_devices(2);
    let scaler = GradScaler::with(1024.0, 7).unwrap();
    let s = Parallel::data(cnn, &d, &opt(), Loss::CrossEntropy).grad_scaler(scaler).build().unwrap();
    assert_eq!(s.core().precision(), Precision::F16);
    assert_eq!(s.core().grad_scaler(), Some(&scaler));
    // The last of the two settings decides; F16 alone takes PyTorch's default scaler.
    let s = Parallel::single(cnn, &d[0], &opt(), Loss::CrossEntropy).grad_scaler(scaler).precision(Precision::F16).build().unwrap();
    assert_eq!(s.core().grad_scaler(), Some(&GradScaler::new()));
    let s = Parallel::single(cnn, &d[0], &opt(), Loss::CrossEntropy).grad_scaler(scaler).precision(Precision::Bf16).build().unwrap();
    assert_eq!((s.core().precision(), s.core().grad_scaler()), (Precision::Bf16, None));
}
