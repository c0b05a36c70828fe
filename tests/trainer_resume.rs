//! The Trainer's exact resume: a model with Dropout trained 200 steps, stopped after step 100
//! (by its stop token, and separately by SIGKILL of the process), resumed in a new process,
//! ends with the same weights bit for bit as the run that never stopped, on cpu and wgpu:0,
//! under `Single`, data parallelism and a pipeline.
//!
//! Every run is a child process: this test binary started again with `TANDEM_TRAINER_CHILD`
//! naming the device, the strategy, the phase and the directory (see `child`).
//!
//! What the trainer records by itself (the strategy's kind, the precision, the clipping bound,
//! the LR schedule) decides a resume too: another one is refused, naming it.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem::backend::cpu::CpuBackend;
use tandem::data::{synthetic, DataLoader};
use tandem::nn::{Dropout, Linear, ReLU, Sequential};
use tandem::optim::{AdamConfig, LrSchedule, Precision};
use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Parallel, Pipeline, Shard, Single, Split, Stages, Strategy};
use tandem::train::{Checkpoints, Fit, Observer, StepInfo, StopToken, Trainer};
use tandem::{Device, Error, Result};

const STEPS: u64 = 200;
const STOP_AT: u64 = 100;
const CHILD: &str = "TANDEM_TRAINER_CHILD";

fn model() -> Result<Sequential> {
    let dev = Device::cpu();
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(5);
    Ok(Sequential::new()
        .push("0", Linear::new(6, 24, &mut rng, &dev)?)
        .push("1", ReLU)
        .push("2", Dropout::new(0.25)?.seed(11))
        .push("3", Linear::new(24, 24, &mut rng, &dev)?)
        .push("4", ReLU)
        .push("5", Dropout::new(0.25)?.seed(12))
        .push("6", Linear::new(24, 1, &mut rng, &dev)?))
}

fn devices(backend: &str, n: usize) -> Result<Vec<Device>> {
    match backend {
        "cpu" => Ok((0..n).map(|_| Device::from_backend(Arc::new(CpuBackend::new()))).collect()),
        spec => Device::parse(&vec![spec; n].join(",")),
    }
}

fn strategy(backend: &str, kind: &str) -> Result<Box<dyn Strategy>> {
    let opt = OptimConfig::adam(AdamConfig { lr: 3e-3, ..Default::default() });
    let model = model()?;
    Ok(match kind {
        "single" => Box::new(Single::new(model, &opt, Loss::Mse, &devices(backend, 1)?[0])?),
        "data" => Box::new(DataParallel::new(&model, &devices(backend, 2)?, &opt, Loss::Mse, DataParallelConfig::default())?),
        "pipeline" => {
            Box::new(Pipeline::builder(Stages::Split(&model, Split::At(vec![3])), &devices(backend, 2)?, &opt, Loss::Mse).micro_batches(2).build()?)
        }
        other => panic!("unknown strategy {other}"),
    })
}

/// Stops the run once `at` steps have run (the stop token), or slows every step after `at`
/// so that the parent's SIGKILL lands mid-run.
struct After {
    at: u64,
    token: Option<StopToken>,
    slow: bool,
}

impl Observer for After {
    fn step(&mut self, s: &StepInfo<'_>) {
        if s.step >= self.at {
            if let Some(t) = &self.token {
                t.stop();
            }
            if self.slow {
                std::thread::sleep(Duration::from_millis(40));
            }
        }
    }
}

/// One run, as the child process: `backend`, `kind` (strategy), `phase` and `dir` from the
/// environment. Phase `full` (200 steps), `stop` (stop token after step 100), `slow` (slowed
/// after 100, killed by the parent) or `resume` (from the directory's newest checkpoint to
/// 200). Writes the final weights to `dir/final.safetensors` when all steps ran.
fn child(backend: &str, kind: &str, phase: &str, dir: &Path) -> Result<()> {
    let data = Arc::new(synthetic::regression(96, 6, 2)?);
    let mut loader = DataLoader::new(data, 16, true, 9)?;
    let mut plan = Checkpoints::new(dir.join("ckpt")).every(10).keep(30);
    if phase == "resume" {
        plan = plan.resume();
    }
    let token = StopToken::new();
    let mut trainer = Trainer::boxed(strategy(backend, kind)?)
        .steps(STEPS)
        .schedule(LrSchedule::WarmupCosine { lr: 3e-3, warmup_steps: 10, decay_steps: STEPS, min_lr: 3e-4 })
        .grad_clip(Some(0.5))
        .checkpoints(plan)
        .settings(serde_json::json!({ "kind": kind }), 9)
        .stop_token(token.clone());
    match phase {
        "stop" => trainer = trainer.observe(After { at: STOP_AT, token: Some(token), slow: false }),
        "slow" => trainer = trainer.observe(After { at: STOP_AT, token: None, slow: true }),
        _ => {}
    }
    let fit = trainer.fit(&mut loader)?;
    let end = if fit.stopped.is_some() { "stopped.safetensors" } else { "final.safetensors" };
    tandem::checkpoint::save_weights(dir.join(end), &trainer.strategy().state_dict()?)?;
    std::fs::write(dir.join(format!("{phase}.steps")), format!("{} {}", fit.first_step, fit.step)).map_err(|e| tandem::Error::io(dir, e))?;
    Ok(())
}

#[test]
fn child_entry() {
    if let Ok(phase) = std::env::var(CHILD) {
        let var = |k: &str| std::env::var(k).unwrap();
        child(&var("TANDEM_TRAINER_BACKEND"), &var("TANDEM_TRAINER_KIND"), &phase, Path::new(&var("TANDEM_TRAINER_DIR"))).unwrap();
    }
}

fn spawn(backend: &str, kind: &str, phase: &str, dir: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture", "--test-threads", "1"])
        .env(CHILD, phase)
        .env("TANDEM_TRAINER_BACKEND", backend)
        .env("TANDEM_TRAINER_KIND", kind)
        .env("TANDEM_TRAINER_DIR", dir)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

fn run(backend: &str, kind: &str, phase: &str, dir: &Path) {
    let status = spawn(backend, kind, phase, dir).wait().unwrap();
    assert!(status.success(), "{backend} {kind} {phase}: child failed ({status})");
}

fn steps(dir: &Path, phase: &str) -> (u64, u64) {
    let s = std::fs::read_to_string(dir.join(format!("{phase}.steps"))).unwrap();
    let v: Vec<u64> = s.split(' ').map(|x| x.parse().unwrap()).collect();
    (v[0], v[1])
}

/// The weights of `file` in `dir`, as bits.
fn bits(dir: &Path, file: &str) -> Vec<(String, Vec<u32>)> {
    let w = tandem::checkpoint::load_weights(dir.join(file), &Device::cpu()).unwrap();
    w.into_iter().map(|(n, t)| (n, t.to_vec().unwrap().into_iter().map(f32::to_bits).collect())).collect()
}

fn assert_same(a: &Path, b: &Path, what: &str) {
    let (x, y) = (bits(a, "final.safetensors"), bits(b, "final.safetensors"));
    assert_eq!(x.len(), y.len());
    for ((n, u), (_, v)) in x.iter().zip(&y) {
        if let Some(i) = u.iter().zip(v).position(|(p, q)| p != q) {
            panic!("{what}: {n}[{i}] is {} resumed, {} uninterrupted", f32::from_bits(v[i]), f32::from_bits(u[i]));
        }
    }
}

fn fresh_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-trainer-resume-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn check(backend: &str, kind: &str) {
    let tag = format!("{}-{kind}", backend.replace(':', ""));
    let full = fresh_dir(&format!("{tag}-full"));
    run(backend, kind, "full", &full);
    assert_eq!(steps(&full, "full"), (0, STEPS));

    // Stopped by its token after step 100, resumed in another process.
    let stopped = fresh_dir(&format!("{tag}-stop"));
    run(backend, kind, "stop", &stopped);
    assert_eq!(steps(&stopped, "stop"), (0, STOP_AT), "the stop token did not stop the run after step {STOP_AT}");
    run(backend, kind, "resume", &stopped);
    assert_eq!(steps(&stopped, "resume"), (STOP_AT, STEPS));
    assert_same(&stopped, &full, &format!("{backend} {kind}, stop token"));

    // Killed with SIGKILL once checkpoint 100 is on disk; resumed from the newest one.
    let killed = fresh_dir(&format!("{tag}-kill"));
    let mut child = spawn(backend, kind, "slow", &killed);
    let ckpt = killed.join("ckpt").join(format!("ckpt-{STOP_AT:08}.safetensors"));
    let t0 = Instant::now();
    while !ckpt.exists() {
        assert!(t0.elapsed() < Duration::from_secs(300), "no checkpoint {} after 300 s", ckpt.display());
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the child ended ({status}) before checkpoint {STOP_AT}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL on Unix
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child finished before it was killed");
    assert!(!killed.join("final.safetensors").exists());
    run(backend, kind, "resume", &killed);
    let (from, to) = steps(&killed, "resume");
    assert!(from >= STOP_AT && to == STEPS, "resumed from step {from} to {to}");
    assert_same(&killed, &full, &format!("{backend} {kind}, SIGKILL"));
    for d in [full, stopped, killed] {
        let _ = std::fs::remove_dir_all(d);
    }
}

fn wgpu() -> bool {
    let ok = Device::parse("wgpu:0").is_ok();
    if !ok {
        assert!(std::env::var("CI").map_or(true, |v| v != "true"), "CI=true but wgpu:0 does not open");
        eprintln!("skipping wgpu:0: no adapter");
    }
    ok
}

#[test]
fn single_resumes_exactly_on_cpu() {
    check("cpu", "single");
}

#[test]
fn data_parallel_resumes_exactly_on_cpu() {
    check("cpu", "data");
}

#[test]
fn pipeline_resumes_exactly_on_cpu() {
    check("cpu", "pipeline");
}

#[test]
fn single_resumes_exactly_on_wgpu() {
    if wgpu() {
        check("wgpu:0", "single");
    }
}

#[test]
fn data_parallel_resumes_exactly_on_wgpu() {
    if wgpu() {
        check("wgpu:0", "data");
    }
}

#[test]
fn pipeline_resumes_exactly_on_wgpu() {
    if wgpu() {
        check("wgpu:0", "pipeline");
    }
}

/// A run of `strategy` to `steps` in `dir`, every 2 steps checkpointed, resumed from there
/// when `resume`; what it did and its weights' bits.
fn recorded_run(
    strategy: Box<dyn Strategy>,
    dir: &Path,
    steps: u64,
    resume: bool,
    schedule: LrSchedule,
    clip: Option<f32>,
) -> Result<(Fit, Vec<u32>)> {
    let mut loader = DataLoader::new(Arc::new(synthetic::regression(96, 6, 2)?), 16, true, 9)?;
    let plan = Checkpoints::new(dir).every(2);
    let plan = if resume { plan.resume() } else { plan };
    let settings = tandem::serde_json::json!({ "kind": "any" });
    let mut t = Trainer::boxed(strategy).steps(steps).schedule(schedule).grad_clip(clip).checkpoints(plan).settings(settings, 9);
    let fit = t.fit(&mut loader)?;
    let bits = t.state_dict()?.iter().flat_map(|(_, w)| w.to_vec().unwrap()).map(f32::to_bits).collect();
    Ok((fit, bits))
}

fn changed(r: Result<(Fit, Vec<u32>)>) -> Vec<String> {
    match r {
        Err(Error::ResumeMismatch { changed, .. }) => changed,
        Err(e) => panic!("expected ResumeMismatch, got {e}"),
        Ok(_) => panic!("expected ResumeMismatch, the run resumed"),
    }
}

#[test]
fn a_resume_repeats_the_precision_the_strategy_the_clipping_and_the_schedule() {
    let dir = fresh_dir("recorded");
    let opt = OptimConfig::adam(AdamConfig { lr: 3e-3, ..Default::default() });
    let single = |p: Precision| Parallel::single(|_| model(), &Device::cpu(), &opt, Loss::Mse).precision(p).boxed().unwrap();
    let data = |shard: Shard| -> Box<dyn Strategy> {
        let cfg = DataParallelConfig { shard, ..Default::default() };
        Box::new(DataParallel::new(&model().unwrap(), &devices("cpu", 2).unwrap(), &opt, Loss::Mse, cfg).unwrap())
    };
    let sched = LrSchedule::Constant { lr: 3e-3 };
    let ck = dir.join("ckpt");
    recorded_run(single(Precision::F32), &ck, 4, false, sched, None).unwrap();

    assert_eq!(changed(recorded_run(single(Precision::Bf16), &ck, 6, true, sched, None)), ["precision bf16 (checkpoint: f32)"]);
    let mut by_hand = single(Precision::F32);
    by_hand.set_precision(Precision::F16, None).unwrap();
    assert_eq!(changed(recorded_run(by_hand, &ck, 6, true, sched, None)), ["precision f16 (checkpoint: f32)"]);
    // Another strategy is not refused: a checkpoint of any layout resumes under any other.
    assert_eq!(changed(recorded_run(single(Precision::F32), &ck, 6, true, sched, Some(0.5))), ["grad_clip 0.5 (checkpoint: none)"]);
    let other = changed(recorded_run(single(Precision::F32), &ck, 6, true, LrSchedule::Constant { lr: 1e-3 }, None));
    assert_eq!(other, ["lr_schedule {kind: constant, lr: 0.001} (checkpoint: {kind: constant, lr: 0.003})"]);

    // The same settings resume, and end as the run that never stopped.
    let (fit, resumed) = recorded_run(single(Precision::F32), &ck, 6, true, sched, None).unwrap();
    assert_eq!((fit.first_step, fit.step), (4, 6));
    let (_, whole) = recorded_run(single(Precision::F32), &dir.join("whole"), 6, false, sched, None).unwrap();
    assert!(resumed == whole, "the resumed weights differ from the uninterrupted run's");

    // Data parallelism's sharding shards memory, not the arithmetic: a plain checkpoint resumes
    // under ZeRO-1.
    let dp = dir.join("dp");
    recorded_run(data(Shard::None), &dp, 4, false, sched, None).unwrap();
    let (fit, _) = recorded_run(data(Shard::Optimizer), &dp, 6, true, sched, None).unwrap();
    assert_eq!((fit.first_step, fit.step), (4, 6));
    let _ = std::fs::remove_dir_all(dir);
}
