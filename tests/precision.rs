//! Mixed-precision training (`Strategy::set_precision`, `--precision`): bf16 and f16 GPT
//! training follows f32's losses within the bound stated below, data parallelism in a half
//! precision (with ZeRO-3) equals one device in it, so do the strategies that split the model,
//! f16's loss scaler skips overflowing steps and backs off, the scale survives a checkpoint, and
//! the GPT follows PyTorch's own autocast (bf16; f16 with GradScaler) from the same start.
mod common;
#[path = "common/gpt_fixture.rs"]
mod gpt_fixture;
use common::*;
use tandem::data::text::{Split, TextCorpus};
use tandem::data::{Batch, Inputs, Targets};
use tandem::nn::models::{Gpt, GptConfig};
use tandem::nn::{Linear, Module, Sequential};
use tandem::optim::{AdamConfig, GradScaler, Precision};
use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Shard, Single, Strategy};
use tandem::Device;

/// `n` independent CPU devices, or `TANDEM_TEST_DEVICES` cycled to `n` (scripts/gpu-check.sh
/// runs these tests on logical devices of cuda:0 so).
fn devices(n: usize) -> Vec<Device> {
    cycled_devices(n)
}

fn gpt_batches(steps: usize) -> (GptConfig, Vec<Batch>) {
    let corpus = TextCorpus::builtin(0);
    let cfg = GptConfig { n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: corpus.vocab.len(), dropout: 0.0, bias: true };
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(11);
    let batches = (0..steps)
        .map(|_| {
            let b = corpus.batch(Split::Train, 8, 16, &mut rng).unwrap();
            Batch::tokens(b.x, b.y, b.block, corpus.vocab.len()).unwrap()
        })
        .collect();
    (cfg, batches)
}

fn adamw() -> OptimConfig {
    OptimConfig::adam(AdamConfig { lr: 3e-3, ..AdamConfig::adamw() })
}

fn losses(s: &mut dyn Strategy, batches: &[Batch]) -> Vec<f32> {
    batches.iter().map(|b| s.step(b).unwrap().loss).collect()
}

/// tandem's `--precision` against PyTorch's autocast (CPU, bf16; f16 with `GradScaler`) from
/// the parity fixture's nanoGPT weights and batches, with its AdamW groups and clipping.
///
/// The bound: each side's losses stay within ~6u (relative) of the exact f32 run's, by the
/// rounding argument below, where they round differently (PyTorch keeps LayerNorm, softmax and
/// the loss in f32 and the residual sums in bf16 where their operands are; tandem rounds each
/// autocast product's operands and output once and computes everything else in f32), so the
/// two may differ by 12u: 4.7% in bf16, 0.6% in f16. Measured with torch 2.15: 9.0e-5 in bf16
/// and 7.0e-6 in f16, closer than PyTorch's own autocast is to its f32 (1.2e-4, 1.9e-5).
/// f32 is held to the f32 parity test's 1e-4. The half runs must differ from f32 (autocast
/// did something) on both sides.
#[test]
fn half_precision_gpt_follows_pytorch_autocast() {
    let (fx, amp) = (gpt_fixture::Fixture::load(), gpt_fixture::Fixture::amp());
    let dev = Device::cpu();
    for (precision, key, u) in
        [(Precision::F32, "losses_f32", 0.0), (Precision::Bf16, "losses_bf16", 2f32.powi(-8)), (Precision::F16, "losses_f16", 2f32.powi(-11))]
    {
        let gpt = Gpt::new(fx.config(), 0, &dev).unwrap();
        gpt.load_state_dict(&fx.init(&dev)).unwrap();
        let mut s = Single::new(gpt, &fx.adamw(), Loss::CrossEntropy, &dev).unwrap();
        s.set_grad_clip(Some(fx.hp("grad_clip"))).unwrap();
        s.set_precision(precision, None).unwrap();
        let steps = fx.json("train")["steps"].as_u64().unwrap() as usize;
        let got: Vec<f32> = (0..steps).map(|i| s.step(&fx.batch(i)).unwrap().loss).collect();
        let want = amp.f32s(key);
        let worst = got.iter().zip(want).map(|(g, w)| ((g - w) / w).abs()).fold(0f32, f32::max);
        let torch_off = want.iter().zip(amp.f32s("losses_f32")).map(|(h, f)| ((h - f) / f).abs()).fold(0f32, f32::max);
        let bound = if u == 0.0 { 1e-4 } else { 12.0 * u };
        eprintln!("{precision:?}: tandem against PyTorch autocast, worst relative loss difference {worst:.2e} (bound {bound:.2e}); PyTorch's own against its f32 {torch_off:.2e}");
        assert_close(&format!("{precision:?} losses against PyTorch's autocast"), &got, want, 0.0, bound);
        if u > 0.0 {
            assert!(torch_off > 0.0, "PyTorch's {key} equal its f32 losses: its autocast did nothing");
            assert!(got.iter().zip(fx.f32s("losses")).any(|(g, f)| g != f), "tandem's {precision:?} losses equal f32's");
        }
    }
}

/// Each half precision's GPT losses against f32's from the same weights and data.
///
/// The bound: a product's operands and output each round once to the half type, a relative
/// error of at most u = 2^-8 (bf16) or 2^-11 (f16) each, so a logit moves by at most about
/// 3u of the magnitudes it sums; the loss (a log-sum-exp minus a logit) then moves by at most
/// twice the largest logit change. At initialisation the logits' terms are O(1), so one step's
/// loss differs by at most ~6u (2.3% for bf16, 0.3% for f16); later steps also inherit the
/// weights' drift, which stays within the same order over these 12 steps (measured: bf16
/// 3.0e-4 relative at worst, f16 1.9e-5). The test allows 6u relative.
#[test]
fn half_precision_gpt_losses_follow_f32_within_the_rounding_bound() {
    let (cfg, batches) = gpt_batches(12);
    let dev = devices(1).remove(0);
    let mut f32_run = Single::new(Gpt::new(cfg, 1, &dev).unwrap(), &adamw(), Loss::CrossEntropy, &dev).unwrap();
    let want = losses(&mut f32_run, &batches);
    for (precision, u) in [(Precision::Bf16, 2f32.powi(-8)), (Precision::F16, 2f32.powi(-11))] {
        let mut s = Single::new(Gpt::new(cfg, 1, &dev).unwrap(), &adamw(), Loss::CrossEntropy, &dev).unwrap();
        s.set_precision(precision, None).unwrap();
        let got = losses(&mut s, &batches);
        let worst = got.iter().zip(&want).map(|(g, w)| ((g - w) / w).abs()).fold(0f32, f32::max);
        eprintln!("{precision:?}: worst relative loss difference {worst:.2e} (bound {:.2e})", 6.0 * u);
        assert_close(&format!("{precision:?} GPT losses"), &got, &want, 0.0, 6.0 * u);
        assert!(got != want, "{precision:?} computed exactly f32's losses: autocast did nothing");
        assert!(want.last() < want.first() && got.last() < got.first(), "{precision:?} trains: {got:?}");
        // Weights stay F32 master weights.
        assert!(s.state_dict().unwrap().iter().all(|(_, t)| t.dtype() == tandem::DType::F32));
    }
}

#[test]
fn half_precision_data_parallelism_and_zero3_equal_one_device() {
    let (cfg, batches) = gpt_batches(5);
    for precision in [Precision::Bf16, Precision::F16] {
        let dev = devices(1).remove(0);
        let mut one = Single::new(Gpt::new(cfg, 1, &dev).unwrap(), &adamw(), Loss::CrossEntropy, &dev).unwrap();
        one.set_precision(precision, None).unwrap();
        let want = losses(&mut one, &batches);
        for shard in [Shard::None, Shard::Full] {
            let mut dp = DataParallel::from_factory(
                |d| Gpt::new(cfg, 1, d),
                &devices(2),
                &adamw(),
                Loss::CrossEntropy,
                DataParallelConfig { shard, ..Default::default() },
            )
            .unwrap();
            dp.set_precision(precision, None).unwrap();
            let got = losses(&mut dp, &batches);
            // Halves of the batch round their products alike; only the order of the weight
            // gradients' sums differs (then rounded to the half type): a few of its ulps.
            assert_close(&format!("{precision:?} {shard:?} data parallel losses"), &got, &want, 0.0, 2e-3);
        }
    }
}

/// A linear model whose f16 gradients overflow at a scale of 2^20 (and fit from 2^13 down).
fn overflowing() -> (Single, Batch) {
    let dev = Device::cpu();
    let mut rng = rng(4);
    let model = Sequential::new().push("fc", Linear::new(4, 1, &mut rng, &dev).unwrap());
    let x: Vec<f32> = (0..32).map(|i| 1.0 + i as f32 / 32.0).collect();
    let batch = Batch { x: Inputs::F32(x), x_shape: vec![8, 4], y: Targets::Values { data: vec![0.0; 8], shape_per_sample: vec![1] } };
    let s = Single::new(model, &OptimConfig::sgd(tandem::optim::SgdConfig { lr: 1e-7, ..Default::default() }), Loss::Mse, &dev).unwrap();
    (s, batch)
}

#[test]
fn f16_skips_overflowing_steps_and_backs_off_its_scale() {
    let (mut s, batch) = overflowing();
    s.set_precision(Precision::F16, Some(GradScaler::with(2f32.powi(20), 2000).unwrap())).unwrap();
    let before = s.state_dict().unwrap()[0].1.to_vec().unwrap();
    let first = s.step(&batch).unwrap();
    // dL/dy = 2y/8 is ~0.5, times 2^20 past f16's 65504: inf, so no update.
    assert_eq!(s.core().skipped_steps(), 1);
    assert_eq!(s.core().grad_scaler().unwrap().scale(), 2f32.powi(19));
    assert_eq!(s.state_dict().unwrap()[0].1.to_vec().unwrap(), before, "a skipped step leaves the weights");
    assert!(first.loss.is_finite(), "the reported loss is the unscaled one: {}", first.loss);
    for _ in 0..12 {
        s.step(&batch).unwrap();
    }
    let skipped = s.core().skipped_steps();
    assert!((2..13).contains(&skipped), "backed off until the gradients fit, then stepped: {skipped} skipped");
    assert_ne!(s.state_dict().unwrap()[0].1.to_vec().unwrap(), before);
    // A scale restored from a checkpoint continues; one outside f16 is refused.
    s.core_mut().load_grad_scaler(1024.0, 5).unwrap();
    assert_eq!(s.core().grad_scaler().unwrap().scale(), 1024.0);
    let (mut plain, _) = overflowing();
    assert!(plain.core_mut().load_grad_scaler(1024.0, 5).unwrap_err().to_string().contains("f16"));
    // A scaler of one's own.
    let (mut own, _) = overflowing();
    own.set_precision(Precision::F16, Some(GradScaler::with(8.0, 10).unwrap())).unwrap();
    own.step(&batch).unwrap();
    assert_eq!((own.core().skipped_steps(), own.core().grad_scaler().unwrap().growth_tracker()), (0, 1));
}

/// The strategies that split the model (layers on devices, a pipeline, a grid of pipelines,
/// tensor parallelism) train the GPT in bf16 and f16 as one device does. Layers and pipelines
/// run the same ops on the same values as one device (only the micro-batches' gradient sums
/// differ in order): within 2e-3 relative, as data parallelism. Tensor parallelism rounds each
/// device's partial product to the half type before the all-reduce sums them, where one device
/// rounds the whole sum once: two more roundings per split product, so within the 6u bound of
/// `half_precision_gpt_losses_follow_f32_within_the_rounding_bound` (measured below it).
#[test]
fn half_precision_model_splitting_strategies_equal_one_device() {
    use tandem::parallel::{Pipeline, PipelineGrid, Stages, TensorParallelGpt};
    let (cfg, batches) = gpt_batches(4);
    let dev = devices(1).remove(0);
    let in_f32 = losses(&mut Single::new(Gpt::new(cfg, 1, &dev).unwrap(), &adamw(), Loss::CrossEntropy, &dev).unwrap(), &batches);
    for (precision, u) in [(Precision::Bf16, 2f32.powi(-8)), (Precision::F16, 2f32.powi(-11))] {
        let mut one = Single::new(Gpt::new(cfg, 1, &dev).unwrap(), &adamw(), Loss::CrossEntropy, &dev).unwrap();
        one.set_precision(precision, None).unwrap();
        let want = losses(&mut one, &batches);
        let devs = devices(4);
        let pipeline = |d: &[Device], micro: usize| {
            let gpt = Gpt::new(cfg, 1, &Device::cpu()).unwrap();
            Pipeline::builder(Stages::Built(gpt.stages(d, None).unwrap()), d, &adamw(), Loss::CrossEntropy).micro_batches(micro).build().unwrap()
        };
        let mut runs: Vec<(&str, Box<dyn Strategy>, f32)> = vec![
            ("layers on 2 devices", Box::new(pipeline(&devs[..2], 1)), 2e-3),
            ("pipeline of 2, 4 micro-batches", Box::new(pipeline(&devs[..2], 4)), 2e-3),
            ("grid of 2 pipelines of 2", Box::new(PipelineGrid::new(vec![pipeline(&devs[..2], 2), pipeline(&devs[2..], 2)]).unwrap()), 2e-3),
            (
                "tensor parallel on 2",
                Box::new(TensorParallelGpt::new(Gpt::new(cfg, 1, &devs[0]).unwrap(), &devs[..2], &adamw(), Loss::CrossEntropy).unwrap()),
                6.0 * u,
            ),
        ];
        for (what, s, bound) in &mut runs {
            s.set_precision(precision, None).unwrap();
            let got = losses(&mut **s, &batches);
            let worst = got.iter().zip(&want).map(|(g, w)| ((g - w) / w).abs()).fold(0f32, f32::max);
            eprintln!("{precision:?} {what}: worst relative loss difference {worst:.2e} (bound {bound:.2e})");
            assert_close(&format!("{precision:?} {what} losses"), &got, &want, 0.0, *bound);
            // Within the bound of one device's half run, and not f32's: autocast did its work.
            assert!(got != in_f32, "{precision:?} {what}: f32's losses exactly");
        }
    }
}

#[test]
fn cli_f16_checkpoints_keep_the_loss_scale_and_a_resume_must_repeat_the_precision() {
    let dir = tempfile_dir("precision-resume");
    let d = dir.to_str().unwrap();
    let base = [
        "train",
        "--model",
        "gpt",
        "--data",
        "text",
        "--devices",
        "cpu",
        "--n-layer",
        "1",
        "--n-head",
        "2",
        "--n-embd",
        "16",
        "--block-size",
        "16",
        "--batch",
        "8",
        "--lr",
        "3e-3",
        "--checkpoint-dir",
        d,
        "--checkpoint-every",
        "3",
    ];
    let out = ok(&[&base[..], &["--steps", "3", "--precision", "f16"]].concat());
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(said.contains("f16 loss scale 65536 at the end; 0 steps skipped"), "{said}");
    let read = |step: &str| {
        let path = dir.join(format!("ckpt-0000000{step}.safetensors"));
        tandem::train::run_file::from_bytes(&path, &std::fs::read(&path).unwrap()).unwrap()
    };
    let ckpt = read("3");
    assert_eq!(ckpt.grad_scaler, Some((65536.0, 3)));
    let err = fails(&[&base[..], &["--steps", "6", "--precision", "bf16", "--resume"]].concat(), "precision");
    assert!(err.contains("bf16") || err.contains("f16"), "{err}");
    let out = ok(&[&base[..], &["--steps", "6", "--precision", "f16", "--resume"]].concat());
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(said.contains("trained 6 steps (3 in this run)"), "{said}");
    let ckpt = read("6");
    assert_eq!(ckpt.grad_scaler, Some((65536.0, 6)), "the tracker continued from the checkpoint's");
    std::fs::remove_dir_all(&dir).ok();
}

fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tandem-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What the graph keeps for the backward of a GPT's forward (`autograd::activation_bytes`):
/// under bf16 autocast the products' outputs and what follows them are halves, and the casts
/// and sums keep no values (measured: 24.4 MiB against f32's 36.2 MiB at block 256, 0.67).
#[test]
fn bf16_autocast_keeps_a_third_fewer_activation_bytes_than_f32() {
    use tandem::{autocast, DType, Tensor};
    let dev = Device::cpu();
    let cfg = GptConfig { n_layer: 2, n_head: 4, n_embd: 128, block_size: 256, vocab_size: 65, dropout: 0.0, bias: true };
    let gpt = Gpt::new(cfg, 0, &dev).unwrap();
    let ids: Vec<i32> = (0..4 * 256).map(|i| i * 7 % 65).collect();
    let x = Tensor::from_labels(ids.clone(), [4, 256], &dev).unwrap();
    let kept = |dtype: Option<DType>| {
        let logits = autocast(dtype, || tandem::nn::Module::forward(&gpt, &x)).unwrap();
        let loss = logits.reshape([4 * 256, 65]).unwrap().cross_entropy(&Tensor::from_labels(ids.clone(), [4 * 256], &dev).unwrap()).unwrap();
        tandem::autograd::activation_bytes(&loss)
    };
    let (wide, half) = (kept(None), kept(Some(DType::Bf16)));
    eprintln!("activations kept: f32 {wide} bytes, bf16 {half} bytes ({:.2})", half as f64 / wide as f64);
    assert!(half * 4 < wide * 3, "bf16 keeps {half} bytes, f32 {wide}");
}
