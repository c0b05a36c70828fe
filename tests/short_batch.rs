//! Data parallelism takes a batch with fewer samples than devices (an epoch's short last batch):
//! the devices without samples still join every collective with zero gradients, and losses and
//! weights equal single-device training, in every shard mode and through the `Trainer`.
use std::sync::Arc;
use tandem::data::{synthetic, Batch, DataLoader, Dataset};
use tandem::nn::models::SeedModel;
use tandem::optim::AdamConfig;
use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Shard, Single, Strategy};
use tandem::tolerance::assert_close;
use tandem::train::Trainer;
use tandem::{Device, Result};

const BATCH: usize = 64;
const DEVICES: &str = "cpu,cpu,cpu,cpu";
/// Relative tolerance on losses and weights against single-device training (the sums run in
/// another order); the absolute one only covers values near zero.
const RTOL: f32 = 1e-5;
const ATOL: f32 = 1e-7;

fn data(n: usize) -> Result<Arc<Dataset>> {
    Ok(Arc::new(synthetic::regression(n, 10, 5)?))
}

/// The dataset in order, in batches of `BATCH` and a short last one.
fn batches(ds: &Dataset) -> Result<Vec<Batch>> {
    let n = ds.len();
    (0..n.div_ceil(BATCH)).map(|b| ds.batch(&(b * BATCH..((b + 1) * BATCH).min(n)).collect::<Vec<_>>())).collect()
}

fn adam() -> OptimConfig {
    OptimConfig::adam(AdamConfig { lr: 0.01, ..Default::default() })
}

fn single() -> Result<Single> {
    Single::new(SeedModel::TwoLayer.build(3, &Device::cpu())?, &adam(), Loss::Mse, &Device::cpu())
}

fn data_parallel(cfg: DataParallelConfig) -> Result<DataParallel> {
    DataParallel::from_factory(|d| SeedModel::TwoLayer.build(3, d), &Device::parse(DEVICES)?, &adam(), Loss::Mse, cfg)
}

fn flat_weights(s: &dyn Strategy) -> Result<Vec<f32>> {
    Ok(s.state_dict()?.iter().map(|(_, t)| t.to_vec()).collect::<Result<Vec<_>>>()?.concat())
}

/// Losses of every step (two epochs of `batches`) and the final weights.
fn train(s: &mut dyn Strategy, batches: &[Batch]) -> Result<(Vec<f32>, Vec<f32>)> {
    let mut losses = Vec::new();
    for b in batches.iter().chain(batches) {
        losses.push(s.step(b)?.loss);
    }
    Ok((losses, flat_weights(s)?))
}

fn configs() -> Vec<(String, DataParallelConfig)> {
    let mut out: Vec<(String, DataParallelConfig)> = [Shard::None, Shard::Optimizer, Shard::Grads, Shard::Full]
        .into_iter()
        .map(|shard| (format!("shard {shard:?}"), DataParallelConfig { shard, bucket_bytes: 64, ..Default::default() }))
        .collect();
    out.push(("2 micro-batches".into(), DataParallelConfig { micro_batches: 2, ..Default::default() }));
    out.push(("deterministic".into(), DataParallelConfig { deterministic: true, ..Default::default() }));
    out.push(("deterministic, shard full".into(), DataParallelConfig { deterministic: true, shard: Shard::Full, ..Default::default() }));
    out.push(("weighted".into(), DataParallelConfig { weights: Some(vec![1.0, 2.0, 3.0, 4.0]), ..Default::default() }));
    out
}

fn matches_single(samples: usize) -> Result<()> {
    let batches = batches(&*data(samples)?)?;
    assert!(batches.last().unwrap().len() < 4, "the last batch leaves a device without samples");
    let (want_l, want_w) = train(&mut single()?, &batches)?;
    for (what, cfg) in configs() {
        let (got_l, got_w) = train(&mut data_parallel(cfg)?, &batches)?;
        assert_close(&format!("{what}, {samples} samples: losses"), &got_l, &want_l, ATOL, RTOL);
        assert_close(&format!("{what}, {samples} samples: weights"), &got_w, &want_w, ATOL, RTOL);
    }
    Ok(())
}

#[test]
fn a_last_batch_of_one_on_four_devices_trains_as_on_one() -> Result<()> {
    matches_single(2 * BATCH + 1)
}

#[test]
fn a_last_batch_of_three_on_four_devices_trains_as_on_one() -> Result<()> {
    matches_single(BATCH + 3)
}

/// `check_batches` accepts the source, and two epochs of a `DataLoader` that keeps its last
/// batch of 1 give the losses and weights of one device.
#[test]
fn the_trainer_keeps_a_short_last_batch_on_four_devices() -> Result<()> {
    let ds = data(2 * BATCH + 1)?;
    let fit = |s: Box<dyn Strategy>| -> Result<(Vec<f32>, Vec<f32>)> {
        let mut t = Trainer::boxed(s).epochs(2);
        let fit = t.fit(&mut DataLoader::new(ds.clone(), BATCH, false, 0)?.drop_last(false)?)?;
        Ok((fit.losses.iter().map(|l| l.1).collect(), flat_weights(t.strategy())?))
    };
    let (want_l, want_w) = fit(Box::new(single()?))?;
    let (got_l, got_w) = fit(Box::new(data_parallel(DataParallelConfig::default())?))?;
    assert_eq!(got_l.len(), 6, "two epochs of 3 batches, the last of 1 sample");
    assert_close("Trainer losses", &got_l, &want_l, ATOL, RTOL);
    assert_close("Trainer weights", &got_w, &want_w, ATOL, RTOL);
    Ok(())
}

/// An empty batch is still refused, with one prefix.
#[test]
fn an_empty_batch_is_refused_once() -> Result<()> {
    let ds = data(8)?;
    let mut dp = data_parallel(DataParallelConfig::default())?;
    let err = dp.step(&ds.batch(&[])?).expect_err("no samples").to_string();
    assert!(err.contains("empty batch") && err.matches("invalid argument").count() == 1, "{err}");
    Ok(())
}
