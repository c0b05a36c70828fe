use rand::SeedableRng;
use tandem::nn::{models::SeedModel, Module};
use tandem::optim::{Optimizer, Sgd, SgdConfig};
use tandem::{Device, Tensor};
fn main() -> tandem::Result<()> {
    let dev = Device::cpu();
    let b: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let m = SeedModel::Cnn.build(0, &dev)?;
    let mut opt = Sgd::new(
        m.parameters(),
        SgdConfig {
            lr: 0.01,
            momentum: 0.9,
            ..Default::default()
        },
    )?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let x = Tensor::randn([b, 1, 28, 28], &mut rng, &dev)?;
    let y = Tensor::from_labels((0..b as i32).map(|i| i % 10).collect(), [b], &dev)?;
    for i in 0..6 {
        let t = std::time::Instant::now();
        let loss = m.forward(&x)?.cross_entropy(&y)?;
        opt.zero_grad();
        loss.backward()?;
        opt.step()?;
        let l = loss.to_scalar()?;
        println!(
            "step {i} loss {l:.5} {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(())
}
