//! `tandem plan` and the plan in `tandem train` through the binary: the printed plan (choice,
//! predicted step time and memory, next best, rejections with their reasons), a paper
//! cluster held against Megatron-LM's rule, `--save-plan` and `train --plan`, predicted
//! against measured step time, a resumed run repeating its recorded plan, and clear errors for
//! bad plan files, plans for other devices and unknown clusters; the GPT planned, trained with
//! its plan and resumed with it, and `--memory-limit` budgets too small for plain data
//! parallelism leaving only sharded or offloaded layouts (and the run fitting them).
mod common;
use common::{ok, s, text};
use std::os::unix::fs::FileTypeExt;
use tandem::parallel::plan::{Layout, Plan};
use tandem::parallel::Shard;
use tandem::Device;

fn out(args: &[&str]) -> String {
    let o = ok(args);
    text(&o.stdout) + &text(&o.stderr)
}

/// A plan for `cpu,cpu` at batch 16, saved by `tandem plan`.
fn saved_plan(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("plan.json");
    let printed = out(&["plan", "--devices", "cpu,cpu", "--batch", "16", "--save-plan", s(&path)]);
    for needle in ["plan for cpu,cpu (batch 16):", "ms/step", "memory: cpu", "next best:", "rejected (", "plan written to"] {
        assert!(printed.contains(needle), "no '{needle}' in:\n{printed}");
    }
    path
}

#[test]
fn plan_prints_and_saves_a_plan_train_runs_with() {
    let dir = common::scratch("plan_cli", "save_and_train");
    let path = saved_plan(&dir);
    let devices = Device::parse("cpu,cpu").unwrap();
    let p = Plan::load(&path, &devices).unwrap();
    assert_eq!(p.batch, 16);
    let trained = out(&["train", "--devices", "cpu,cpu", "--plan", s(&path), "--batch", "16", "--steps", "3"]);
    let line = trained.lines().find(|l| l.starts_with("planned ")).unwrap_or_else(|| panic!("no predicted-against-measured line in:\n{trained}"));
    assert!(line.contains(&p.best.layout.to_string()) && line.contains("predicted") && line.contains("measured"), "{line}");
}

#[test]
fn the_rejected_layouts_say_what_excluded_them() {
    let printed = out(&["plan", "--devices", "cpu,cpu,cpu,cpu", "--batch", "18"]);
    let rejected = printed.split("rejected (").nth(1).expect("a rejected section");
    // 18 samples do not split into 2 equal pipelines of equal micro-batches (data parallelism
    // alone cuts them 5, 5, 4, 4); tensor parallelism combines with data, not pipelines.
    assert!(rejected.contains("data 2 x tensor 1 x pipeline 2: the batch of 18 does not split into 2 replicas"), "{printed}");
    assert!(rejected.contains("does not combine with pipeline parallelism"), "{printed}");
    assert!(!rejected.contains("data 2 x tensor 2 x pipeline 1:"), "data over tensor groups builds now: {printed}");
}

#[test]
fn a_paper_cluster_is_planned_and_held_against_megatrons_rule() {
    let printed = out(&["plan", "--cluster", "dual-m60:2"]);
    assert!(printed.contains("plan for M60#0,M60#1"), "{printed}");
    assert!(printed.contains("Megatron-LM's rule"), "{printed}");
    common::fails(&["plan", "--cluster", "tpu:2"], "unknown cluster name");
    common::fails(&["plan", "--cluster", "h100:0"], "at least 1");
    let o = common::run(&["plan", "--cluster", "tpu:2"]);
    assert_eq!(o.status.code(), Some(2), "a bad --cluster is a usage error");
}

#[test]
fn bad_plan_files_and_plans_for_other_devices_are_refused() {
    let dir = common::scratch("plan_cli", "bad_files");
    let path = saved_plan(&dir);
    let err = common::fails(&["train", "--devices", "cpu", "--plan", s(&path), "--batch", "16", "--steps", "1"], "field plan.devices");
    assert!(err.contains("plan.json"), "{err}");
    let junk = dir.join("junk.json");
    std::fs::write(&junk, "[1, 2").unwrap();
    common::fails(&["train", "--devices", "cpu,cpu", "--plan", s(&junk), "--steps", "1"], "not JSON");
    common::fails(&["train", "--devices", "cpu,cpu", "--plan", s(&path), "--batch", "32", "--steps", "1"], "batches of 16");
    common::fails(&["train", "--devices", "cpu,cpu", "--plan", s(&path), "--strategy", "data"], "--strategy");
}

#[test]
fn a_resumed_run_repeats_the_plan_its_checkpoint_recorded() {
    let dir = common::scratch("plan_cli", "resume");
    let path = saved_plan(&dir);
    let devices = Device::parse("cpu,cpu").unwrap();
    // A layout no fresh plan would choose: a pipeline of 16 micro-batches of one sample.
    let mut p = Plan::load(&path, &devices).unwrap();
    p.best.layout = Layout {
        data: 1,
        tensor: 1,
        pipeline: 2,
        micro_batches: 16,
        recompute: false,
        cuts: vec![1],
        shard: Shard::None,
        offload: false,
        bucket: None,
        data_inner: false,
    };
    p.best.memory = vec![0, 0];
    p.shares = vec![16];
    let odd = dir.join("odd.json");
    p.save(&odd).unwrap();
    let ckpt = dir.join("ckpt");
    let common = ["--devices", "cpu,cpu", "--batch", "16", "--checkpoint-dir", s(&ckpt), "--checkpoint-every", "2"];
    let first = out(&[&["train", "--plan", s(&odd), "--steps", "2"][..], &common[..]].concat());
    assert!(first.contains("planned data 1 x tensor 1 x pipeline 2, 16 micro-batches, cuts at [1]"), "{first}");
    // No --plan now: `--strategy auto` would plan afresh, but the checkpoint's plan wins.
    let resumed = out(&[&["train", "--resume", "--steps", "4"][..], &common[..]].concat());
    assert!(resumed.contains("planned data 1 x tensor 1 x pipeline 2, 16 micro-batches, cuts at [1]"), "{resumed}");
}

#[test]
fn data_parallel_shares_follow_balance() {
    // The shares a run trains with are recorded in its checkpoints' configuration
    // (`batch_weights`), which a resume repeats: measured speeds, one per device, or none.
    let recorded = |balance: &str| -> serde_json::Value {
        let dir = common::scratch("plan_cli", &format!("balance-{balance}"));
        let ckpt = dir.join("ckpt");
        out(&[
            "train",
            "--strategy",
            "data",
            "--devices",
            "cpu,cpu",
            "--balance",
            balance,
            "--batch",
            "16",
            "--steps",
            "2",
            "--checkpoint-dir",
            s(&ckpt),
        ]);
        let bytes = std::fs::read(ckpt.join("ckpt-00000002.safetensors")).expect("a checkpoint at the last step");
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        let config: serde_json::Value = serde_json::from_str(&meta.metadata().as_ref().unwrap()["config"]).unwrap();
        config["batch_weights"].clone()
    };
    let measured: Vec<f64> = serde_json::from_value(recorded("measured")).expect("--balance measured records one weight per device");
    assert!(measured.len() == 2 && measured.iter().all(|w| w.is_finite() && *w > 0.0), "{measured:?}");
    assert!(recorded("even").is_null(), "--balance even splits equally and records no weights");
}

/// A GPT whose state, more than its activations, decides what fits: one block 256 wide with
/// one head, so that tensor parallelism (whole heads per device) and a pipeline (a block per
/// stage) are excluded over two devices and data parallelism, sharded or not, is left.
const GPT: [&str; 16] = [
    "--model",
    "gpt",
    "--data",
    "text",
    "--devices",
    "cpu,cpu",
    "--batch",
    "4",
    "--n-layer",
    "1",
    "--n-embd",
    "256",
    "--n-head",
    "1",
    "--block-size",
    "8",
];

fn gpt(args: &[&str]) -> Vec<String> {
    let mut all: Vec<String> = args[..1].iter().map(|a| a.to_string()).collect();
    all.extend(GPT.iter().chain(&args[1..]).map(|a| a.to_string()));
    all
}

fn gpt_out(args: &[&str]) -> String {
    let all = gpt(args);
    out(&all.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The chosen layout's line of a printed plan.
fn best(printed: &str) -> &str {
    printed.lines().nth(1).unwrap_or_default()
}

#[test]
fn the_gpt_is_planned_with_its_exclusions_and_trains_with_its_plan() {
    let dir = common::scratch("plan_cli", "gpt");
    let path = dir.join("gpt.json");
    let printed = gpt_out(&["plan", "--save-plan", s(&path)]);
    for needle in [
        "plan for cpu,cpu (batch 4):",
        "ms/step",
        "n_head 1 does not split into 2 equal groups of heads",
        "2 stages for 1 blocks: every stage needs a block",
        "plan written to",
    ] {
        assert!(printed.contains(needle), "no '{needle}' in:\n{printed}");
    }
    let p = Plan::load(&path, &Device::parse("cpu,cpu").unwrap()).unwrap();
    assert!(p.model.starts_with("Gpt(n_layer=1, n_head=1, n_embd=256"), "{}", p.model);
    let trained = gpt_out(&["train", "--plan", s(&path), "--steps", "2"]);
    let line = trained.lines().find(|l| l.starts_with("planned ")).unwrap_or_else(|| panic!("no predicted-against-measured line in:\n{trained}"));
    assert!(line.contains(&p.best.layout.to_string()) && line.contains("measured"), "{line}");
    // `--strategy auto` on several devices trains the GPT with a fresh plan.
    let auto = gpt_out(&["train", "--steps", "2"]);
    assert!(auto.lines().any(|l| l.starts_with("planned data")), "{auto}");
    // A plan is for its model, and chooses the layout's knobs itself.
    common::fails(&["train", "--devices", "cpu,cpu", "--plan", s(&path), "--batch", "4", "--steps", "1"], "the plan is for Gpt(");
    let by_hand = gpt(&["train", "--shard", "grads", "--steps", "1"]);
    common::fails(&by_hand.iter().map(String::as_str).collect::<Vec<_>>(), "--shard");
}

/// [`gpt`] on four CPU devices.
/// Its runs reuse one calibration on purpose (a `plan`, then a `train` that must take the same
/// plan): speeds measured on this shared machine drift past the default factor under load, so
/// the reuse is not refused for that here.
fn gpt4_out(args: &[&str]) -> String {
    let all: Vec<String> = gpt(args).into_iter().map(|a| if a == "cpu,cpu" { "cpu,cpu,cpu,cpu".into() } else { a }).collect();
    let o = common::tandem().env("TANDEM_CALIBRATION_DRIFT", "1000").args(&all).output().expect("the tandem binary runs");
    assert!(o.status.success(), "tandem {all:?} failed:\n{}", text(&o.stderr));
    text(&o.stdout) + &text(&o.stderr)
}

#[test]
fn a_memory_limit_too_small_for_plain_data_parallelism_keeps_only_sharded_or_offloaded_gpt_layouts() {
    // Without budgets memory excludes nothing (sharding may still win on its smaller update).
    let free = gpt4_out(&["plan"]);
    assert!(!free.contains("memory: needs"), "{free}");
    // Under 15 MiB budgets the whole model on one device (~16.7 MiB, ~13.5 with gradient
    // accumulation) and plain data parallelism (~17.7 MiB over two devices) are over 85% of a
    // device, and fit only with the optimizer state in host memory; ZeRO over four devices fits
    // as it is (at two, ZeRO-1 saves only what the gradient bucket costs). Which of those kept
    // layouts is fastest is the calibration's to say (on CI's machine the offload has won), so
    // the memory rules are what is held here, not the choice.
    let dir = common::scratch("plan_cli", "grad-dtype");
    let limited_path = dir.join("f32.json");
    let limited = gpt4_out(&["plan", "--memory-limit", "15MiB", "--no-trials", "--save-plan", s(&limited_path)]);
    let p = Plan::load(&limited_path, &Device::parse("cpu,cpu,cpu,cpu").unwrap()).unwrap();
    let budget = 0.85 * 15.0 * 1024.0 * 1024.0;
    let kept: Vec<&tandem::parallel::plan::Estimate> = std::iter::once(&p.best).chain(&p.alternatives).collect();
    for e in &kept {
        assert!(e.layout.shard != Shard::None || e.layout.offload, "{} kept, neither sharded nor offloaded:\n{limited}", e.layout);
        assert!(e.memory.iter().all(|&m| m as f64 <= budget), "{} kept over the budget:\n{limited}", e.layout);
    }
    let zero4 = |e: &&tandem::parallel::plan::Estimate| e.layout.data == 4 && e.layout.shard != Shard::None && !e.layout.offload;
    assert!(kept.iter().any(zero4), "ZeRO over four devices not kept:\n{limited}");
    assert!(kept.iter().any(|e| e.layout.data == 1 && e.layout.offload), "one device with the offload not kept:\n{limited}");
    for rejected in ["of kept layouts: memory: needs", "over 85% of its 15 MiB"] {
        assert!(limited.contains(rejected), "no '{rejected}' in:\n{limited}");
    }
    // Training under the same budgets (and the same kept calibration) takes that plan, and fits
    // them; so does the plan its trials choose, a trial out of memory rejecting its layout.
    let trained = gpt4_out(&["train", "--memory-limit", "15MiB", "--steps", "2", "--no-trials"]);
    let planned = p.best.layout.to_string();
    assert!(trained.lines().any(|l| l.starts_with("planned ") && l.contains(&planned)), "no 'planned {planned}' in:\n{trained}");
    let tried = gpt4_out(&["train", "--memory-limit", "15MiB", "--steps", "2"]);
    assert!(tried.contains("for a few steps before choosing") && tried.lines().any(|l| l.starts_with("planned ")), "{tried}");
    // Gradient shards in bf16 are planned for, saved with the plan and kept by the run that
    // trains it (the plan's ZeRO layout made its choice by hand, as above the calibration may
    // prefer the offload); a run asking for another type is refused.
    let path = dir.join("bf16.json");
    gpt4_out(&["plan", "--memory-limit", "15MiB", "--grad-dtype", "bf16", "--no-trials", "--save-plan", s(&path)]);
    let mut p = Plan::load(&path, &Device::parse("cpu,cpu,cpu,cpu").unwrap()).unwrap();
    assert_eq!(p.grad_dtype, tandem::DType::Bf16);
    // ZeRO-2 or 3: ZeRO-1 keeps whole gradients.
    let halves = |p: &Plan, e: &tandem::parallel::plan::Estimate| zero4(&e) && p.grad_dtype_of(&e.layout) == tandem::DType::Bf16;
    if !halves(&p, &p.best) {
        let i = p.alternatives.iter().position(|e| halves(&p, e)).unwrap_or_else(|| panic!("ZeRO-2/3 over four devices not kept in bf16:\n{p}"));
        p.best = p.alternatives.remove(i);
        p.shares = vec![1; 4];
        p.offloaded_states = 0;
        p.save(&path).unwrap();
    }
    assert!(p.to_string().contains("gradient shards in bf16"), "{p}");
    let trained = gpt4_out(&["train", "--memory-limit", "15MiB", "--plan", s(&path), "--steps", "2"]);
    assert!(trained.lines().any(|l| l.starts_with("planned data 4") && l.contains("shard")), "{trained}");
    let other = gpt(&["train", "--plan", s(&path), "--grad-dtype", "f16", "--steps", "1"]);
    let other: Vec<&str> = other.iter().map(|a| if a == "cpu,cpu" { "cpu,cpu,cpu,cpu" } else { a.as_str() }).collect();
    common::fails(&other, "the plan was made for bf16 gradient shards, not f16");
    // Budgets nothing fits are a clear error naming the constraint.
    let tiny = gpt(&["plan", "--memory-limit", "8MiB"]);
    common::fails(&tiny.iter().map(String::as_str).collect::<Vec<_>>(), "no layout fits the devices' memory");
    common::fails(&["plan", "--cluster", "dual-m60:1", "--memory-limit", "1GiB"], "--memory-limit");
    // Under 13 MiB nothing fits with Adam's moments on the devices and the default buckets: the
    // plan keeps layouts with smaller buckets (ZeRO's units) or the moments in host memory, each
    // at the default rejected for memory. A plan that keeps them in host memory (the fastest
    // such layout, made the choice by hand where smaller buckets won) says so; a run of it
    // offloads them too, with the losses of a run that asked for the offload, bit for bit.
    let path = dir.join("offloaded.json");
    let offloaded = gpt4_out(&["plan", "--memory-limit", "13MiB", "--save-plan", s(&path)]);
    assert!(offloaded.contains("memory: needs"), "{offloaded}");
    let mut p = Plan::load(&path, &Device::parse("cpu,cpu,cpu,cpu").unwrap()).unwrap();
    for e in std::iter::once(&p.best).chain(&p.alternatives) {
        let why = "kept with Adam's moments on the devices in default buckets";
        assert!(e.layout.offload || e.layout.bucket.is_some(), "{} {why}:\n{offloaded}", e.layout);
    }
    if !p.best.layout.offload {
        let i = p.alternatives.iter().position(|e| e.layout.offload).unwrap_or_else(|| panic!("no offloaded layout kept:\n{offloaded}"));
        p.best = p.alternatives.remove(i);
        let d = p.best.layout.data;
        p.shares = (0..d).map(|r| 4 / d + usize::from(r < 4 % d)).collect();
        p.offloaded_states = 2;
        p.save(&path).unwrap();
    }
    assert!(p.to_string().contains("optimizer state in host memory"), "{p}");
    let asked = gpt4_out(&["plan", "--memory-limit", "13MiB", "--offload-optimizer"]);
    assert!(asked.contains("optimizer state in host memory"), "{asked}");
    let final_loss = |printed: &str| {
        printed.lines().find_map(|l| l.split("final loss ").nth(1)).map(str::to_string).unwrap_or_else(|| panic!("no final loss:\n{printed}"))
    };
    let searched = gpt4_out(&["train", "--memory-limit", "13MiB", "--plan", s(&path), "--steps", "2"]);
    assert!(searched.lines().any(|l| l.starts_with("planned ") && l.contains(", offload")), "{searched}");
    let by_hand = gpt4_out(&["train", "--memory-limit", "13MiB", "--offload-optimizer", "--plan", s(&path), "--steps", "2"]);
    assert_eq!(final_loss(&searched), final_loss(&by_hand), "{searched}\n{by_hand}");
}

#[test]
fn a_resumed_gpt_run_repeats_the_plan_its_checkpoint_recorded() {
    let dir = common::scratch("plan_cli", "gpt_resume");
    let shape = [
        "--model",
        "gpt",
        "--data",
        "text",
        "--devices",
        "cpu,cpu",
        "--batch",
        "4",
        "--n-layer",
        "2",
        "--n-head",
        "2",
        "--n-embd",
        "32",
        "--block-size",
        "8",
    ];
    let path = dir.join("plan.json");
    out(&[&["plan"][..], &shape, &["--save-plan", s(&path)]].concat());
    // A layout no fresh plan is likely to choose: a pipeline of 4 micro-batches of one window,
    // cut before the second block.
    let mut p = Plan::load(&path, &Device::parse("cpu,cpu").unwrap()).unwrap();
    p.best.layout = Layout {
        data: 1,
        tensor: 1,
        pipeline: 2,
        micro_batches: 4,
        recompute: false,
        cuts: vec![2],
        shard: Shard::None,
        offload: false,
        bucket: None,
        data_inner: false,
    };
    p.best.memory = vec![0, 0];
    p.shares = vec![4];
    let odd = dir.join("odd.json");
    p.save(&odd).unwrap();
    let ckpt = dir.join("ckpt");
    let common = [&shape[..], &["--checkpoint-dir", s(&ckpt), "--checkpoint-every", "2"]].concat();
    let first = out(&[&["train", "--plan", s(&odd), "--steps", "2"][..], &common[..]].concat());
    let line = "planned data 1 x tensor 1 x pipeline 2, 4 micro-batches, cuts at [2]";
    assert!(first.contains(line), "{first}");
    let resumed = out(&[&["train", "--resume", "--steps", "4"][..], &common[..]].concat());
    assert!(resumed.contains(line), "{resumed}");
}

/// The calibration is kept and reused: a second `tandem plan` on the same devices reads it
/// (and prints the same plan), with the budgets of this run, not the file's; `--recalibrate`
/// measures again; bf16 and other devices are other calibrations (one device's too, whose missing
/// link is an infinite bandwidth in the file); `TANDEM_CALIBRATION=off` writes
/// nothing; a damaged file, or a FIFO at its path, is measured over and said so, the FIFO left
/// as it is.
#[test]
fn a_calibration_is_kept_reused_and_measured_over_when_it_cannot_be() {
    let dir = common::scratch("plan_cli", "calibration");
    let run = |env: &[(&str, &str)], args: &[&str]| {
        let mut cmd = common::tandem();
        // This machine's load swings past SPEED_DRIFT between runs; reuse is what is tested here
        // (tests/plan_hostile.rs tests the drift rule).
        cmd.env("TANDEM_CACHE_DIR", &dir).env_remove("TANDEM_CALIBRATION").env("TANDEM_CALIBRATION_DRIFT", "1000");
        cmd.envs(env.iter().copied());
        let o = cmd.args(args).output().unwrap();
        (o.status.success(), text(&o.stdout) + &text(&o.stderr))
    };
    // Trials are timings of this moment, not part of the kept calibration.
    let plan = ["plan", "--devices", "cpu,cpu", "--batch", "16", "--no-trials"];
    let files = || std::fs::read_dir(dir.join("plan")).map_or(0, |d| d.count());
    let calibration = |printed: &str| {
        printed.lines().find(|l| l.starts_with("calibration ")).unwrap_or_else(|| panic!("no calibration line in:\n{printed}")).to_string()
    };
    let without = |printed: &str| printed.lines().filter(|l| !l.starts_with("calibration ")).collect::<Vec<_>>().join("\n");

    let (ok1, first) = run(&[], &plan);
    assert!(ok1 && calibration(&first).contains("measured in") && calibration(&first).contains("kept in"), "{first}");
    assert_eq!(files(), 1);
    let (ok2, second) = run(&[], &plan);
    assert!(ok2 && calibration(&second).contains("reused from"), "{second}");
    assert_eq!(without(&second), without(&first), "the reused calibration plans the same");
    let (fits, limited) = run(&[], &[&plan[..], &["--memory-limit", "400KiB"]].concat());
    assert!(
        fits && calibration(&limited).contains("reused from") && limited.contains("over 85% of its 400 KiB"),
        "this run's budgets, not the file's:\n{limited}"
    );
    assert_ne!(best(&limited), best(&first), "the budgets change the plan");
    let (_, again) = run(&[], &[&plan[..], &["--recalibrate"]].concat());
    assert!(calibration(&again).contains("measured in"), "{again}");
    // bf16 is planned from its own times and half activations: another calibration.
    let (_, half) = run(&[], &[&plan[..], &["--precision", "bf16"]].concat());
    assert!(calibration(&half).contains("measured in") && files() == 2, "{half}");
    assert_ne!(best(&half), best(&first), "bf16 predicts other times and memory");
    std::fs::remove_file(half.lines().find_map(|l| l.split("kept in ").nth(1)).expect("the bf16 file")).unwrap();
    let (_, one) = run(&[], &["plan", "--devices", "cpu", "--batch", "16"]);
    assert!(calibration(&one).contains("measured in") && files() == 2, "{one}");
    // One device has no link: its unbounded bandwidth goes to the file and back.
    let (_, one_again) = run(&[], &["plan", "--devices", "cpu", "--batch", "16"]);
    assert!(calibration(&one_again).contains("reused from"), "{one_again}");
    let (_, off) = run(&[("TANDEM_CALIBRATION", "off")], &["plan", "--devices", "cpu,cpu,cpu", "--batch", "16"]);
    assert!(calibration(&off).contains("measured in") && !off.contains("kept in") && files() == 2, "{off}");

    let kept = std::fs::read_dir(dir.join("plan"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| calibration(&first).contains(p.to_str().unwrap()))
        .expect("the first run's file");
    std::fs::write(&kept, b"{ not json").unwrap();
    let (ok3, damaged) = run(&[], &plan);
    assert!(ok3 && calibration(&damaged).contains("not reused: not a calibration file") && calibration(&damaged).contains("kept in"), "{damaged}");
    std::fs::remove_file(&kept).unwrap();
    common::mkfifo(&kept);
    let (ok4, fifo) = run(&[], &plan);
    assert!(ok4 && calibration(&fifo).contains("not a regular file") && calibration(&fifo).contains("left as it is"), "{fifo}");
    assert!(std::fs::symlink_metadata(&kept).unwrap().file_type().is_fifo(), "the FIFO is left in place");
    let (bad_ok, bad) = run(&[("TANDEM_CALIBRATION", "sometimes")], &plan);
    assert!(!bad_ok && bad.contains("TANDEM_CALIBRATION") && bad.contains("cached, fresh or off"), "{bad}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--search-precision`: the plan says which precision it chose over which, a plan that chose
/// bf16 trains in bf16 (the losses of `--precision bf16` with the same layout), and the flag
/// is refused where no plan is made here or beside `--precision`.
#[test]
fn a_plan_may_choose_the_precision_and_its_run_trains_in_it() {
    let dir = common::scratch("plan_cli", "precision");
    let base = ["--devices", "cpu,cpu", "--batch", "16", "--no-trials"];
    let printed = out(&[&["plan", "--search-precision"][..], &base].concat());
    assert!(printed.contains("(searched; ") && printed.contains("bf16: ") && printed.contains("f16: "), "{printed}");
    // The same layout, saved once as it is and once as if bf16 had won.
    let path = dir.join("plain.json");
    out(&[&["plan", "--save-plan", s(&path)][..], &base].concat());
    let mut file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    file["plan"]["precision"] = "Bf16".into();
    let chose = dir.join("bf16.json");
    std::fs::write(&chose, serde_json::to_string(&file).unwrap()).unwrap();
    let final_loss = |printed: &str| {
        printed.lines().find_map(|l| l.split("final loss ").nth(1)).map(str::to_string).unwrap_or_else(|| panic!("no final loss:\n{printed}"))
    };
    let train =
        |plan: &std::path::Path, extra: &[&str]| final_loss(&out(&[&["train", "--plan", s(plan), "--steps", "3"][..], &base, extra].concat()));
    let by_plan = train(&chose, &[]);
    assert_eq!(by_plan, train(&path, &["--precision", "bf16"]), "the plan's bf16 is --precision bf16");
    assert_ne!(by_plan, train(&path, &[]), "bf16 is not f32");
    common::fails(&[&["train", "--plan", s(&chose), "--steps", "1", "--precision", "f16"][..], &base].concat(), "the plan trains in bf16");
    common::fails(&["train", "--devices", "cpu,cpu", "--strategy", "data", "--search-precision", "--steps", "1"], "needs a plan made here");
    common::fails(&["plan", "--devices", "cpu,cpu", "--search-precision", "--precision", "bf16"], "give one");
    common::fails(&["plan", "--cluster", "dual-m60:1", "--search-precision"], "--search-precision");
}

/// Issue 50's case: a 16-block, 128-wide GPT (51 MB of f32 training state) on four CPU devices
/// of 13 MiB each, whose default layouts (plain data parallelism, ZeRO with its default
/// buckets, the whole model offloaded) do not fit. `--strategy auto`, with no flag beyond the
/// budgets, plans a layout that does (of smaller ZeRO-3 units, recomputation, the optimizer
/// state in host memory) and trains with it under them.
#[test]
fn a_gpt_over_four_small_budgets_trains_with_strategy_auto() {
    let shape = ["--model", "gpt", "--data", "text", "--devices", "cpu,cpu,cpu,cpu", "--n-layer", "16", "--n-embd", "128"];
    let shape = [&shape[..], &["--n-head", "4", "--block-size", "64", "--batch", "8", "--memory-limit", "13MiB"]].concat();
    let planned = out(&[&["plan", "--no-trials"][..], &shape[..]].concat());
    assert!(!planned.contains("no layout fits"), "{planned}");
    let trained = out(&[&["train", "--steps", "2"][..], &shape[..]].concat());
    let line = trained.lines().find(|l| l.starts_with("planned ")).unwrap_or_else(|| panic!("no planned layout in:\n{trained}"));
    assert!(line.contains("recompute") || line.contains("buckets of") || line.contains("offload"), "{line}");
    assert!(trained.lines().any(|l| l.contains("final loss ")), "{trained}");
}
