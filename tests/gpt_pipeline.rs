//! The GPT under `data` (2 devices), `pipeline` (2 stages, 1F1B) and `data,pipeline` (2 × 2):
//! the PyTorch fixture's 10 AdamW steps (tests/fixtures/gpt_tiny.safetensors, weight decay,
//! clipping, dropout 0) on CPU devices and on logical devices of `wgpu:0`; the tied
//! embedding's two copies and the grid's replicas bit-identical (also on a CPU + wgpu:0
//! pipeline); the tie's errors; and the command line with each new strategy, resume included.
//! Each parity run writes its checkpoint under target/tmp for
//! `python scripts/gpt_parity.py check` (a strict load into nanoGPT's GPT).
mod common;
#[path = "common/gpt_fixture.rs"]
mod gpt_fixture;
use common::{assert_close, fails, ok, s, text};
use gpt_fixture::Fixture;
use std::collections::HashMap;
use std::sync::Arc;
use tandem::backend::cpu::CpuBackend;
use tandem::checkpoint::{read_safetensors, HostTensor};
use tandem::nn::models::Gpt;
use tandem::nn::Module;
use tandem::parallel::{DataParallel, DataParallelConfig, Loss, Pipeline, PipelineGrid, Schedule, Stages, Strategy};
use tandem::{BackendKind, Device, Tensor};

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().unwrap().iter().map(|x| x.to_bits()).collect()
}

/// A GPT pipeline over `devs` with the fixture's initial weights; the stages declare the tied
/// head themselves (no `.tie`).
fn pipeline(fx: &Fixture, devs: &[Device], micro: usize, schedule: Schedule) -> Pipeline {
    let gpt = Gpt::new(fx.config(), 0, &Device::cpu()).unwrap();
    gpt.load_state_dict(&fx.init(&Device::cpu())).unwrap();
    let stages = Stages::Built(gpt.stages(devs, None).unwrap());
    Pipeline::builder(stages, devs, &fx.adamw(), Loss::CrossEntropy).micro_batches(micro).schedule(schedule).build().unwrap()
}

/// [`Fixture::check_steps`] under `s`, and the checkpoint's lm_head.weight equal to the
/// embedding bit for bit.
fn parity(what: &str, s: &mut dyn Strategy, fx: &Fixture) {
    let state = fx.check_steps(s, what);
    assert_eq!(bits(&state[Gpt::LM_HEAD]), bits(&state[Gpt::WTE]), "{what}: the tied lm_head.weight differs from the embedding");
    // The optimizer trains the tied parameter once: state for the embedding, none for the head.
    let names: Vec<String> = s.optimizer_state().unwrap().0.into_iter().map(|p| p.0).collect();
    assert!(
        names.contains(&format!("{}.exp_avg", Gpt::WTE)) && !names.iter().any(|n| n.starts_with(Gpt::LM_HEAD)),
        "{what}: optimizer state {names:?}"
    );
}

#[test]
fn data_pipeline_and_grid_match_pytorch() {
    let _guard = common::shared();
    let fx = Fixture::load();
    for (family, devs) in common::device_families(4) {
        let mut dp =
            DataParallel::from_factory(|d| Gpt::new(fx.config(), 0, d), &devs[..2], &fx.adamw(), Loss::CrossEntropy, DataParallelConfig::default())
                .unwrap();
        dp.load_state_dict(&fx.init(&Device::cpu())).unwrap();
        parity(&format!("data on 2 {family}"), &mut dp, &fx);

        let mut pipe = pipeline(&fx, &devs[..2], 4, Schedule::OneFOneB);
        parity(&format!("pipeline, 2 stages of {family}, 1F1B, 4 micro-batches"), &mut pipe, &fx);

        let mut grid = PipelineGrid::from_factory(&devs, 2, |row| Ok(pipeline(&fx, row, 2, Schedule::OneFOneB))).unwrap();
        parity(&format!("data,pipeline 2 x 2 on {family}"), &mut grid, &fx);
        let replica =
            |r: usize| -> Vec<(String, Vec<u32>)> { grid.replicas()[r].state_dict().unwrap().iter().map(|(n, t)| (n.clone(), bits(t))).collect() };
        assert_eq!(replica(0), replica(1), "{family}: the grid's two replicas differ after 10 steps");
    }
}

/// GPipe with recomputation gives the 1F1B pipeline's run; and a pipeline of `Gpt::stages`
/// ties its head without being told, which keeps it on PyTorch's track.
#[test]
fn gpipe_with_recompute_matches_and_ties_itself() {
    let _guard = common::shared();
    let fx = Fixture::load();
    let devs: Vec<Device> = (0..2).map(|_| Device::from_backend(Arc::new(CpuBackend::new()))).collect();
    let gpt = Gpt::new(fx.config(), 0, &Device::cpu()).unwrap();
    gpt.load_state_dict(&fx.init(&Device::cpu())).unwrap();
    let mut gpipe = Pipeline::builder(Stages::Built(gpt.stages(&devs, Some(&[1])).unwrap()), &devs, &fx.adamw(), Loss::CrossEntropy)
        .micro_batches(2)
        .schedule(Schedule::GPipe)
        .recompute(true)
        .build()
        .unwrap();
    parity("GPipe, recomputing", &mut gpipe, &fx);

    // Built without `.tie`, as the GPipe one above: the stages declare the tied head, so the
    // pipeline keeps PyTorch's losses (an untied head leaves them by more than 1e-4).
    let mut plain = Pipeline::builder(Stages::Built(gpt.stages(&devs, None).unwrap()), &devs, &fx.adamw(), Loss::CrossEntropy).build().unwrap();
    plain.set_grad_clip(Some(fx.hp("grad_clip"))).unwrap();
    let losses: Vec<f32> = (0..10).map(|i| plain.step(&fx.batch(i)).unwrap().loss).collect();
    let off = losses.iter().zip(fx.f32s("losses")).any(|(a, b)| ((a - b) / b).abs() > 1e-4);
    assert!(!off, "a pipeline of Gpt::stages must tie its head itself: {losses:?}");
}

/// On two backends the copy still equals the embedding bit for bit: it is copied, not updated.
#[test]
fn tied_copies_stay_identical_across_backends() {
    let _guard = common::shared();
    let Some(wgpu) = common::devices_under_test().into_iter().find(|d| d.info().backend == BackendKind::Wgpu && d.info().ordinal == 0) else {
        eprintln!("skipping: no wgpu:0");
        return;
    };
    let fx = Fixture::load();
    let devs = [Device::from_backend(Arc::new(CpuBackend::new())), wgpu];
    let mut pipe = pipeline(&fx, &devs, 2, Schedule::OneFOneB);
    pipe.set_grad_clip(Some(fx.hp("grad_clip"))).unwrap();
    // after every step, not only the last
    for i in 0..3 {
        pipe.step(&fx.batch(i)).unwrap();
        let state: HashMap<String, Tensor> = pipe.state_dict().unwrap().into_iter().collect();
        assert_eq!(bits(&state[Gpt::LM_HEAD]), bits(&state[Gpt::WTE]), "cpu + wgpu:0, step {i}: the head differs from the embedding");
        assert!(state[Gpt::LM_HEAD].device().same(&devs[1]), "the head lives on the last stage");
    }
}

#[test]
fn ties_and_stage_splits_that_cannot_work_are_errors() {
    let fx = Fixture::load();
    let devs: Vec<Device> = (0..3).map(|_| Device::from_backend(Arc::new(CpuBackend::new()))).collect();
    let gpt = Gpt::new(fx.config(), 0, &Device::cpu()).unwrap();
    let build = |tie: ((usize, &str), (usize, &str))| {
        let stages = Stages::Built(gpt.stages(&devs[..2], None).unwrap());
        Pipeline::builder(stages, &devs[..2], &fx.adamw(), Loss::CrossEntropy).tie(tie.0, tie.1).build().err().expect("a bad tie").to_string()
    };
    assert!(build(((0, Gpt::WTE), (1, "lm_head.bias"))).contains("has no parameter lm_head.bias"));
    assert!(build(((0, Gpt::WTE), (2, Gpt::LM_HEAD))).contains("the pipeline has 2 stages"));
    assert!(build(((0, Gpt::WTE), (0, "transformer.wpe.weight"))).contains("transformer.wpe.weight"));
    assert!(build(((0, Gpt::WTE), (0, Gpt::WTE))).contains("two distinct parameters"));
    // 2 blocks cannot make 3 stages; split points must exist
    assert!(gpt.stages(&devs, None).err().unwrap().to_string().contains("3 stages for 2 blocks"));
    assert!(gpt.stages(&devs[..2], Some(&[2])).err().unwrap().to_string().contains("block starts [2]"));
    // a checkpoint whose lm_head.weight is not the embedding
    let mut pipe = pipeline(&fx, &devs[..2], 1, Schedule::OneFOneB);
    let mut state = fx.init(&Device::cpu());
    let head = state.iter().position(|(n, _)| n == Gpt::LM_HEAD).unwrap();
    state[head].1 = state[head].1.mul_scalar(2.0).unwrap();
    assert!(pipe.load_state_dict(&state).unwrap_err().to_string().contains("lm_head.weight differs from transformer.wte.weight"));
    // without lm_head.weight the copy is filled from the embedding
    state.remove(head);
    pipe.load_state_dict(&state).unwrap();
}

// --- the command line ----------------------------------------------------------------------

fn train(dir: &std::path::Path, extra: &[&str]) -> Vec<f64> {
    let mut a = vec![
        "train",
        "--model",
        "gpt",
        "--data",
        "text",
        "--log-format",
        "json",
        "--n-layer",
        "2",
        "--n-head",
        "2",
        "--n-embd",
        "16",
        "--block-size",
        "16",
        "--batch",
        "8",
    ];
    a.extend(["--grad-clip", "1", "--dropout", "0.1", "--checkpoint-every", "2", "--checkpoint-dir", s(dir)]);
    a.extend(extra);
    let out = ok(&a);
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l.get("summary").is_none())
        .filter_map(|l| l.get("loss").and_then(serde_json::Value::as_f64))
        .collect()
}

fn checkpoint(path: &std::path::Path) -> HashMap<String, HostTensor> {
    read_safetensors(path).unwrap().0.into_iter().filter_map(|(n, t)| n.strip_prefix("model.").map(|m| (m.to_string(), t))).collect()
}

/// Each new strategy follows `single` (dropout masks are keyed by sample, so every split
/// gives the same run), stops and resumes to the uninterrupted run's weights bit for bit, and
/// writes nanoGPT-shaped checkpoints (lm_head.weight = wte).
#[test]
fn cli_trains_pipeline_and_data_pipeline_and_resumes() {
    let dir = common::scratch("gpt-pipeline", "cli");
    let single = train(&dir.join("single"), &["--devices", "cpu", "--steps", "4"]);
    let cases: [(&str, &[&str]); 2] = [
        ("pipeline", &["--strategy", "pipeline", "--devices", "cpu,cpu", "--micro-batches", "2", "--schedule", "gpipe", "--recompute"]),
        ("data,pipeline", &["--strategy", "data,pipeline", "--pipelines", "2", "--devices", "cpu,cpu,cpu,cpu", "--micro-batches", "2"]),
    ];
    for (name, flags) in cases {
        let (whole, part) = (dir.join(format!("{name}-whole")), dir.join(format!("{name}-part")));
        let losses = train(&whole, &[flags, &["--steps", "4"]].concat());
        assert_close(
            &format!("tandem train --strategy {name}: losses"),
            &losses.iter().map(|&l| l as f32).collect::<Vec<_>>(),
            &single.iter().map(|&l| l as f32).collect::<Vec<_>>(),
            1e-5,
            1e-4,
        );
        train(&part, &[flags, &["--steps", "2"]].concat());
        let resumed = train(&part, &[flags, &["--steps", "4", "--resume"]].concat());
        assert_eq!(resumed, losses[2..], "{name}: steps 3..4 after the resume");
        let ckpt = "ckpt-00000004.safetensors";
        let (a, b) = (checkpoint(&whole.join(ckpt)), checkpoint(&part.join(ckpt)));
        assert!(!a.is_empty() && a == b, "{name}: the resumed run's weights differ from the uninterrupted run's");
        assert!(a[Gpt::LM_HEAD] == a[Gpt::WTE], "{name}: the checkpoint's lm_head.weight is not the embedding");
    }
    let base =
        ["train", "--model", "gpt", "--data", "text", "--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--steps", "1"];
    let with = |extra: &[&'static str]| [&base[..], extra].concat();
    fails(&with(&["--strategy", "data,pipeline", "--devices", "cpu,cpu,cpu", "--batch", "8"]), "--pipelines");
    fails(
        &with(&["--strategy", "data,pipeline", "--devices", "cpu,cpu,cpu,cpu", "--batch", "6", "--micro-batches", "2"]),
        "does not split into 2 pipelines",
    );
    fails(&with(&["--strategy", "pipeline", "--devices", "cpu,cpu,cpu", "--batch", "8"]), "every stage needs a block");
    fails(&with(&["--pipelines", "2", "--devices", "cpu,cpu", "--batch", "8"]), "--pipelines: needs --strategy data,pipeline");
    fails(
        &["train", "--model", "seed-linear", "--data", "synthetic", "--strategy", "data,pipeline", "--devices", "cpu,cpu"],
        "written for --model gpt",
    );
}
