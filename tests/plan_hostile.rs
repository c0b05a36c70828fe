//! Hostile sizes for the planner: a described cluster's server count, a plan file's
//! micro-batches, shares and degrees, and a kept calibration's figures are bounded (or their
//! sums checked) before they size anything; a refusal names the flag or the file and field
//! with the value, and a damaged calibration is measured again with a note saying why.
mod common;
use common::{s, text};
use tandem::parallel::plan::{estimate, plan, Cluster, Estimate, LayerCost, Layout, Plan, Workload, MAX_BYTES, MAX_CLUSTER_DEVICES};
use tandem::parallel::Shard;
use tandem::Device;

#[test]
fn a_described_cluster_is_bounded_before_it_is_built() {
    for (spec, servers) in
        [("dual-m60:99999999999", "99999999999"), ("h100:1000", "1000"), ("h100:33", "33"), ("dual-m60:18446744073709551615", "18446744073709551615")]
    {
        let t0 = std::time::Instant::now();
        let o = common::run(&["plan", "--cluster", spec]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{spec}: a usage error, not an abort:\n{err}");
        for needle in ["--cluster", servers, &MAX_CLUSTER_DEVICES.to_string()] {
            assert!(err.contains(needle), "{spec}: no '{needle}' in:\n{err}");
        }
        assert!(t0.elapsed().as_secs() < 30, "{spec} was refused only after {:?}", t0.elapsed());
    }
    assert_eq!(Cluster::parse("h100:32").unwrap().devices.len(), MAX_CLUSTER_DEVICES);
    assert_eq!(Cluster::parse("dual-m60:64").unwrap().devices.len(), MAX_CLUSTER_DEVICES);
    assert!(Cluster::parse("dual-m60:65").is_err());
}

fn layer() -> LayerCost {
    LayerCost {
        name: "block".into(),
        forward_s: 1e-4,
        backward_s: 2e-4,
        fixed_s: 0.0,
        param_bytes: 1 << 20,
        largest_param_bytes: 1 << 18,
        activation_bytes: 1 << 12,
        output_bytes: 1 << 10,
        tensor_parallel: false,
        tied: None,
        update_s: 0.0,
    }
}

fn work(layer: LayerCost) -> Workload {
    Workload { layers: vec![layer; 4], batch: 16, state_per_param_byte: 3, grad_dtype: tandem::DType::F32, offloaded_states: 0 }
}

#[test]
fn the_planner_refuses_figures_out_of_bounds_and_sizes_saturate() {
    let cluster = Cluster::dual_m60(1);
    let huge = LayerCost { param_bytes: u64::MAX, largest_param_bytes: 1, ..layer() };
    let err = plan(&work(huge.clone()), &cluster).unwrap_err().to_string();
    assert!(err.contains("param_bytes") && err.contains(&u64::MAX.to_string()) && err.contains(&MAX_BYTES.to_string()), "{err}");
    // Called directly, the estimate's sizes saturate: no wrap into a small peak that fits.
    let one = Layout {
        data: 1,
        tensor: 1,
        pipeline: 1,
        micro_batches: 1,
        recompute: false,
        cuts: vec![],
        shard: Shard::None,
        offload: false,
        bucket: None,
        data_inner: false,
    };
    assert_eq!(estimate(&work(huge.clone()), &cluster, &one).memory, vec![u64::MAX]);
    let sharded = Layout { data: 2, shard: Shard::Full, ..one };
    assert!(estimate(&work(huge), &cluster, &sharded).memory.iter().all(|m| *m > MAX_BYTES), "a sharded peak saturates too");
    for (bad, field) in [
        (LayerCost { forward_s: 1e308, ..layer() }, "forward_s"),
        (LayerCost { backward_s: f64::NAN, ..layer() }, "backward_s"),
        (LayerCost { update_s: -1.0, ..layer() }, "update_s"),
    ] {
        let err = plan(&work(bad), &cluster).unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
    }
    let many = Cluster::servers(MAX_CLUSTER_DEVICES + 1, 1, cluster.devices[0].clone(), cluster.within, cluster.across);
    let err = plan(&work(layer()), &many).unwrap_err().to_string();
    assert!(err.contains(&format!("{} devices", MAX_CLUSTER_DEVICES + 1)), "{err}");
}

/// A consistent plan of data parallelism over `cpu,cpu` at batch 16, as `tandem plan` would
/// write it.
fn cpu_plan() -> Plan {
    let layout = Layout {
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
    };
    let best = Estimate { layout, step_s: 1e-3, compute_s: 1e-3, comm_s: 0.0, bubble: 0.0, overhead_s: 0.0, memory: vec![1 << 20, 1 << 20] };
    Plan {
        model: String::new(),
        devices: vec!["cpu".into(), "cpu".into()],
        batch: 16,
        shares: vec![8, 8],
        best,
        alternatives: vec![],
        rejected: vec![],
        grad_dtype: tandem::DType::F32,
        offloaded_states: 0,
        processes: vec![],
        tried: vec![],
        precision: None,
        precisions: vec![],
    }
}

/// `cpu_plan` saved to `dir/name.json` with `edit` applied to its JSON's `plan` object.
fn edited(dir: &std::path::Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.json"));
    cpu_plan().save(&path).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut doc["plan"]);
    std::fs::write(&path, serde_json::to_string(&doc).unwrap()).unwrap();
    path
}

#[test]
fn a_plan_files_counts_and_shares_are_checked_naming_the_file_and_field() {
    let dir = common::scratch("plan_hostile", "files");
    let devices = Device::parse("cpu,cpu").unwrap();
    let fine = edited(&dir, "fine", |_| {});
    Plan::load(&fine, &devices).expect("the unedited plan loads");
    type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        ("mb_trillion", Box::new(|p| p["best"]["layout"]["micro_batches"] = 1_000_000_000_000u64.into()), "plan.best.layout.micro_batches"),
        ("mb_max", Box::new(|p| p["best"]["layout"]["micro_batches"] = u64::MAX.into()), "plan.best.layout.micro_batches"),
        // 3 micro-batches do not fill a share of 2 samples each.
        (
            "mb_share",
            Box::new(|p| {
                p["batch"] = 4.into();
                p["shares"] = serde_json::json!([2, 2]);
                p["best"]["layout"]["micro_batches"] = 3.into();
            }),
            "plan.shares",
        ),
        // Shares whose sum wraps past 2^64 to the batch.
        ("wrapping_shares", Box::new(|p| p["shares"] = serde_json::json!([u64::MAX, 17])), "plan.shares"),
        (
            "zero_share",
            Box::new(|p| {
                p["batch"] = 4.into();
                p["shares"] = serde_json::json!([4, 0]);
            }),
            "plan.shares",
        ),
        (
            "huge_degrees",
            Box::new(|p| {
                p["best"]["layout"]["data"] = (1u64 << 63).into();
                p["best"]["layout"]["tensor"] = 4.into();
            }),
            "plan.best.layout",
        ),
        ("many_devices", Box::new(|p| p["devices"] = serde_json::json!(vec!["cpu"; MAX_CLUSTER_DEVICES + 1])), "plan.devices: 257 devices"),
    ];
    for (name, edit, field) in cases {
        let path = edited(&dir, name, edit);
        let err = Plan::load(&path, &devices).expect_err(name).to_string();
        assert!(err.contains(s(&path)) && err.contains(field), "{name}: no file or no '{field}' in: {err}");
    }
    // Equal pipelines split the batch into equal micro-batches, as the planner has it.
    let path = edited(&dir, "pipeline", |p| {
        p["batch"] = 6.into();
        p["shares"] = serde_json::json!([6]);
        p["best"]["layout"] = serde_json::json!({"data": 1, "tensor": 1, "pipeline": 2, "micro_batches": 4, "recompute": false, "cuts": [1]});
    });
    let err = Plan::load(&path, &devices).unwrap_err().to_string();
    assert!(err.contains("micro_batches") && err.contains("4 micro-batches"), "{err}");
    // What `train --micro-batches 3 --batch 4` refuses, `train --plan` refuses too.
    let three = edited(&dir, "three", |p| p["best"]["layout"]["micro_batches"] = 1_000_000_000_000u64.into());
    let err = common::fails(&["train", "--devices", "cpu,cpu", "--plan", s(&three), "--batch", "16", "--steps", "1"], "micro_batches");
    assert!(err.contains(s(&three)), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tandem plan` with `TANDEM_CACHE_DIR` at `dir`: whether it succeeded, and what it printed.
fn plan_in(dir: &std::path::Path, args: &[&str]) -> (bool, String) {
    let o = common::tandem().env("TANDEM_CACHE_DIR", dir).env_remove("TANDEM_CALIBRATION").args(args).output().unwrap();
    (o.status.success(), text(&o.stdout) + &text(&o.stderr))
}

/// Whether `plan_in(dir, args)` reuses the kept calibration, `prepare` run before each try:
/// on a loaded host the speed probe may find the device's pace moved (and measure again for
/// that reason), so up to four tries.
fn reused(dir: &std::path::Path, args: &[&str], prepare: &dyn Fn()) -> Result<(), Vec<String>> {
    let mut lines = Vec::new();
    for _ in 0..4 {
        prepare();
        let (ok, printed) = plan_in(dir, args);
        assert!(ok, "{printed}");
        let line = calibration(&printed);
        if line.contains("reused from") {
            return Ok(());
        }
        assert!(line.contains("speed moved"), "measured again for another reason: {line}");
        lines.push(line);
    }
    Err(lines)
}

fn calibration(printed: &str) -> String {
    printed.lines().find(|l| l.starts_with("calibration ")).unwrap_or_else(|| panic!("no calibration line in:\n{printed}")).to_string()
}

/// The one calibration file under `dir`.
fn kept(dir: &std::path::Path) -> std::path::PathBuf {
    let files: Vec<_> = std::fs::read_dir(dir.join("plan")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

/// A kept calibration with no layers, a device of speed 0, a parameter size of 2^64-1, a time
/// of 1e308 s, a timestamp in the future, or a speed probe its device no longer runs at is
/// measured again, and the note says why; the plan is made from the new measurement.
#[test]
fn a_damaged_or_outdated_calibration_is_measured_again_with_a_note() {
    let dir = common::scratch("plan_hostile", "calibration");
    let args = ["plan", "--devices", "cpu", "--batch", "16", "--no-trials"];
    let (ok, first) = plan_in(&dir, &args);
    assert!(ok && calibration(&first).contains("measured in"), "{first}");
    let path = kept(&dir);
    reused(&dir, &args, &|| {}).expect("an intact file is reused");
    let original: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let future = original["measured_unix"].as_u64().unwrap() + 10 * 24 * 3600;
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        ("no layers", Box::new(|f| f["workload"]["layers"] = serde_json::json!([])), "0 layers"),
        ("speed 0", Box::new(|f| f["cluster"]["devices"][0]["speed"] = 0.into()), "speed 0"),
        ("param_bytes 2^64-1", Box::new(|f| f["workload"]["layers"][0]["param_bytes"] = u64::MAX.into()), "param_bytes is 18446744073709551615"),
        ("forward_s 1e308", Box::new(|f| f["workload"]["layers"][0]["forward_s"] = 1e308.into()), "forward_s is 1000"),
        ("future", Box::new(move |f| f["measured_unix"] = future.into()), "from now"),
        // The device ran the probe ten times slower when calibrated: its speed moved.
        ("speed moved", Box::new(|f| f["probe_s"][0] = (f["probe_s"][0].as_f64().unwrap() * 10.0).into()), "speed moved more than 1.5x"),
    ];
    for (what, edit, why) in cases {
        let mut file = original.clone();
        edit(&mut file);
        std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
        let (ok, printed) = plan_in(&dir, &args);
        let line = calibration(&printed);
        assert!(ok && line.contains("measured in") && line.contains("not reused") && line.contains(why), "{what}: {line}\n{printed}");
        assert!(printed.contains("plan for cpu (batch 16)"), "{what}: planned from the new measurement:\n{printed}");
    }
    // A device slower now than when calibrated is this moment's load: the file is reused.
    let mut faster_then = original.clone();
    faster_then["probe_s"][0] = (original["probe_s"][0].as_f64().unwrap() / 10.0).into();
    reused(&dir, &args, &|| std::fs::write(&path, serde_json::to_vec(&faster_then).unwrap()).unwrap()).expect("reused while slower");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A kept calibration whose layer times are far slower than this machine now runs them: the
/// trial of the chosen layout runs faster than predicted (a negative overhead), so the
/// calibration is measured again and the note says so.
#[test]
fn a_negative_measured_overhead_measures_a_kept_calibration_again() {
    let dir = common::scratch("plan_hostile", "negative");
    let args = ["plan", "--devices", "cpu", "--batch", "16"];
    let (ok, first) = plan_in(&dir, &args);
    assert!(ok && calibration(&first).contains("measured in"), "{first}");
    let path = kept(&dir);
    let slowed = || {
        let mut file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for layer in file["workload"]["layers"].as_array_mut().unwrap() {
            for t in ["forward_s", "backward_s", "fixed_s"] {
                layer[t] = (layer[t].as_f64().unwrap() * 50.0 + 1e-3).into();
            }
        }
        file
    };
    // On a loaded host the speed probe may also find the device's pace moved (and measure
    // again for that reason, rewriting the file): slow the new file's layers and try again.
    let mut lines = Vec::new();
    for _ in 0..4 {
        std::fs::write(&path, serde_json::to_vec(&slowed()).unwrap()).unwrap();
        let (ok, printed) = plan_in(&dir, &args);
        let line = calibration(&printed);
        assert!(ok && line.contains("measured in") && line.contains("not reused"), "{line}\n{printed}");
        if line.contains("negative overhead") {
            lines.clear();
            break;
        }
        lines.push(line);
    }
    assert!(lines.is_empty(), "no negative overhead named: {lines:?}");
    // With --no-trials nothing contradicts the file: it is reused as it is.
    let untried = [&args[..], &["--no-trials"]].concat();
    reused(&dir, &untried, &|| std::fs::write(&path, serde_json::to_vec(&slowed()).unwrap()).unwrap()).expect("reused without trials");
    let _ = std::fs::remove_dir_all(&dir);
}
