//! Batch-size constraints checked before training, against every batch a source can draw
//! (`Strategy::check_batches`): pipeline micro-batches that must divide the batch (and the
//! short last one), data-parallel batches with fewer samples than devices; and the GPT's
//! stages declaring their tied head, so that a pipeline ties it without being told.
use std::sync::Arc;
use tandem::backend::cpu::CpuBackend;
use tandem::data::{DataLoader, Dataset, Targets};
use tandem::nn::models::{Gpt, GptConfig, SeedModel};
use tandem::nn::Module;
use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Pipeline, Split, Stages, Strategy};
use tandem::{Device, Result};

fn cpus(n: usize) -> Vec<Device> {
    (0..n).map(|_| Device::from_backend(Arc::new(CpuBackend::new()))).collect()
}

/// `n` samples of 10 features with one regression target each, in batches of `batch`.
fn loader(n: usize, batch: usize) -> Result<DataLoader> {
    let data = Dataset { x: vec![0.5; n * 10], sample_shape: vec![10], y: Targets::Values { data: vec![1.0; n], shape_per_sample: vec![1] } };
    DataLoader::new(Arc::new(data), batch, false, 0)
}

#[test]
fn a_pipeline_refuses_a_short_last_batch_its_micro_batches_do_not_divide() -> Result<()> {
    let devs = cpus(2);
    let model = SeedModel::TwoLayer.build(0, &devs[0])?;
    let pipe = Pipeline::builder(Stages::Split(&model, Split::At(vec![1])), &devs, &OptimConfig::sgd(Default::default()), Loss::Mse)
        .micro_batches(2)
        .build()?;
    pipe.check_batches(&loader(12, 4)?)?;
    let err = pipe.check_batches(&loader(11, 4)?).expect_err("a last batch of 3").to_string();
    assert!(err.contains("short last batch of 3") && err.contains("2 micro-batches do not divide"), "{err}");
    assert_eq!(err.matches("invalid argument to").count(), 1, "the prefix is said once: {err}");
    pipe.check_batches(&loader(11, 4)?.drop_last(true)?)?;
    let err = pipe.check_batches(&loader(12, 3)?).expect_err("a batch of 3").to_string();
    assert!(err.contains("2 micro-batches do not divide a batch of 3"), "{err}");
    Ok(())
}

/// A device left without samples joins the collectives with zero gradients (tests/short_batch.rs
/// checks the results), so any batch of at least one sample passes.
#[test]
fn data_parallel_accepts_a_short_last_batch_that_leaves_a_device_without_samples() -> Result<()> {
    let devs = cpus(3);
    let dp = DataParallel::from_factory(
        |d| SeedModel::TwoLayer.build(0, d),
        &devs,
        &OptimConfig::sgd(Default::default()),
        Loss::Mse,
        DataParallelConfig::default(),
    )?;
    dp.check_batches(&loader(15, 5)?)?;
    dp.check_batches(&loader(10, 4)?)?;
    dp.check_batches(&loader(2, 2)?)?;
    Ok(())
}

#[test]
fn gpt_stages_declare_the_tied_head() -> Result<()> {
    let cfg = GptConfig { n_layer: 2, n_head: 2, n_embd: 8, block_size: 4, vocab_size: 7, dropout: 0.0, bias: true };
    let gpt = Gpt::new(cfg, 0, &Device::cpu())?;
    let stages = gpt.stages(&cpus(2), None)?;
    assert!(stages[0].tied_parameters().is_empty());
    assert_eq!(stages[1].tied_parameters(), vec![(Gpt::LM_HEAD.to_string(), Gpt::WTE.to_string())]);
    Ok(())
}
