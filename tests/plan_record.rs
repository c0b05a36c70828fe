//! A run's plan recorded in its settings and repeated on resume, through the library
//! (`tandem::train::plan_record`) and the binary: the recorded form, the plan read back (not
//! for another number of processes; a damaged entry names the checkpoint), a `--plan` given
//! to a resumed run refused when it is another plan (both named) and accepted when it is the
//! same; `--strategy auto` saying its layout before the first step and in the JSON summary.
mod common;
use common::{ok, s, text};
use std::path::Path;
use tandem::parallel::plan::{Estimate, Layout, Plan, Rejected};
use tandem::parallel::Shard;
use tandem::train::plan_record::{check_given_plan, plan_setting, recorded_form, recorded_plan, PLAN_SETTING};
use tandem::Device;

fn data2() -> Layout {
    Layout {
        data: 2,
        tensor: 1,
        pipeline: 1,
        micro_batches: 1,
        recompute: false,
        cuts: vec![],
        shard: Shard::None,
        offload: false,
        bucket: None,
        data_inner: false,
    }
}

fn cpu_plan(layout: Layout, shares: Vec<usize>) -> Plan {
    let best =
        Estimate { layout: layout.clone(), step_s: 1e-3, compute_s: 1e-3, comm_s: 0.0, bubble: 0.0, overhead_s: 0.0, memory: vec![1 << 20, 1 << 20] };
    Plan {
        model: String::new(),
        devices: vec!["cpu".into(), "cpu".into()],
        batch: 16,
        shares,
        best: best.clone(),
        alternatives: vec![best.clone()],
        rejected: vec![Rejected { layout, why: "a reason".into() }],
        grad_dtype: tandem::DType::F32,
        offloaded_states: 0,
        processes: vec![],
        tried: vec![],
        precision: None,
        precisions: vec![],
    }
}

#[test]
fn a_plan_is_recorded_and_read_back_through_the_library() {
    let devices = Device::parse("cpu,cpu").unwrap();
    let p = cpu_plan(data2(), vec![8, 8]);
    let ckpt = Path::new("/nonexistent/ckpt-00000002.safetensors");
    // A new run records the plan without its alternatives and rejections.
    let entry = plan_setting(None, Some(&p)).unwrap().expect("an entry");
    let settings = serde_json::json!({ "batch": 16, PLAN_SETTING: entry });
    let back = recorded_plan(&settings, ckpt, 0, 1, &devices).unwrap().expect("the recorded plan");
    assert_eq!(back, recorded_form(&p));
    assert!(back.alternatives.is_empty() && back.rejected.is_empty());
    // A resumed run keeps its checkpoint's entry, present or not, whatever it planned now.
    let other = cpu_plan(data2(), vec![9, 7]);
    assert_eq!(plan_setting(Some(&settings), Some(&other)).unwrap(), Some(settings[PLAN_SETTING].clone()));
    assert_eq!(plan_setting(Some(&serde_json::json!({ "batch": 16 })), Some(&other)).unwrap(), None);
    assert_eq!(plan_setting(None, None).unwrap(), None);
    // A plan of one process is not repeated under a launcher of two: that run plans again.
    assert_eq!(recorded_plan(&settings, ckpt, 0, 2, &devices).unwrap(), None);
    assert_eq!(recorded_plan(&serde_json::json!({}), ckpt, 0, 1, &devices).unwrap(), None);
    // Another device set, or an inconsistent entry, is an error naming the checkpoint.
    let err = recorded_plan(&settings, ckpt, 0, 1, &Device::parse("cpu").unwrap()).unwrap_err().to_string();
    assert!(err.contains(s(ckpt)) && err.contains("the recorded plan"), "{err}");
    let mut zero = settings.clone();
    zero[PLAN_SETTING]["shares"] = serde_json::json!([16, 0]);
    let err = recorded_plan(&zero, ckpt, 0, 1, &devices).unwrap_err().to_string();
    assert!(err.contains(s(ckpt)) && err.contains("plan.shares"), "{err}");
    let mut ranks = settings.clone();
    ranks[PLAN_SETTING]["processes"] = serde_json::json!([[usize::MAX, 0], [0, 0]]);
    let err = recorded_plan(&ranks, ckpt, 0, 1, &devices).expect_err("a rank past any job").to_string();
    assert!(err.contains(s(ckpt)) && err.contains("plan.processes"), "{err}");
    // The same plan given again is accepted (alternatives aside); another is named with the recorded one.
    let given = Path::new("/somewhere/given.json");
    check_given_plan(&back, ckpt, &p, given).unwrap();
    let err = check_given_plan(&back, ckpt, &other, given).unwrap_err().to_string();
    assert!(err.contains(s(ckpt)) && err.contains(s(given)) && err.contains("[8, 8]") && err.contains("[9, 7]"), "{err}");
}

fn out(args: &[&str]) -> String {
    let o = ok(args);
    text(&o.stdout) + &text(&o.stderr)
}

#[test]
fn a_plan_given_to_a_resumed_run_must_be_the_recorded_one() {
    let dir = common::scratch("plan_record", "resume");
    let saved = dir.join("plan.json");
    out(&["plan", "--devices", "cpu,cpu", "--batch", "16", "--no-trials", "--save-plan", s(&saved)]);
    let mut p = Plan::load(&saved, &Device::parse("cpu,cpu").unwrap()).unwrap();
    // A layout no fresh plan would choose: a pipeline of 16 micro-batches of one sample.
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
    out(&[&["train", "--plan", s(&odd), "--steps", "2"][..], &common[..]].concat());
    let o = common::run(&[&["train", "--resume", "--plan", s(&saved), "--steps", "4"][..], &common[..]].concat());
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "a usage error:\n{err}");
    for needle in ["--plan", s(&saved), s(&ckpt), "data 1 x tensor 1 x pipeline 2, 16 micro-batches"] {
        assert!(err.contains(needle), "no '{needle}' in:\n{err}");
    }
    let same = out(&[&["train", "--resume", "--plan", s(&odd), "--steps", "4"][..], &common[..]].concat());
    assert!(same.contains("planned data 1 x tensor 1 x pipeline 2, 16 micro-batches, cuts at [1]") && same.contains("trained 4 steps"), "{same}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn strategy_auto_says_its_layout_before_the_first_step_and_in_the_json_summary() {
    let args = ["train", "--devices", "cpu,cpu", "--strategy", "auto", "--batch", "16", "--steps", "2", "--no-trials"];
    let o = ok(&args);
    let stdout = text(&o.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let said =
        lines.iter().position(|l| l.starts_with("training with the planned layout data ")).unwrap_or_else(|| panic!("no layout line:\n{stdout}"));
    let first = lines.iter().position(|l| l.starts_with("step 1/2")).unwrap_or_else(|| panic!("no step 1:\n{stdout}"));
    assert!(said < first, "the layout is said before step 1:\n{stdout}");
    let layout = lines[said].trim_start_matches("training with the planned layout ").split(':').next().unwrap().to_string();
    let all = stdout.clone() + &text(&o.stderr);
    assert!(all.contains(&format!("planned {layout}: predicted")), "the same layout at the end:\n{all}");

    let o = ok(&[&args[..], &["--log-format", "json"]].concat());
    let stdout = text(&o.stdout);
    assert!(text(&o.stderr).contains("training with the planned layout data "), "{}", text(&o.stderr));
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let plan = &summary["plan"];
    assert!(plan["layout"].as_str().is_some_and(|l| l.starts_with("data ")), "{summary}");
    assert!(plan["predicted_step_s"].as_f64().is_some_and(|s| s > 0.0) && plan["measured_step_s"].as_f64().is_some_and(|s| s > 0.0), "{summary}");
    // A run without a plan has no entry.
    let plain = ok(&["train", "--devices", "cpu", "--batch", "16", "--steps", "1", "--log-format", "json"]);
    let summary: serde_json::Value = serde_json::from_str(text(&plain.stdout).lines().last().unwrap()).unwrap();
    assert!(summary.get("plan").is_none(), "{summary}");
}
