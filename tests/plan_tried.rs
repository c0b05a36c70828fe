//! Layouts tried before they are chosen (tandem::parallel::plan::tried): the chosen layout is
//! always one that ran, a trial slower than its prediction moves the choice, a trial's
//! overhead carries to the untried variants of its degrees, a failed trial rejects its layout
//! with the error, and the trials stop; `step_seconds` times a real strategy.
use tandem::parallel::plan::{measure, plan, plan_within, step_seconds, tried, unbuildable, Cluster, LayerCost, Plan, Workload, MAX_TRIALS};
use tandem::parallel::{Loss, OptimConfig};
use tandem::{Device, Error, Result};

/// 8 light layers at batch 64: the layer model alone spreads them over all four GPUs of a
/// dual-M60 server.
fn light() -> (Workload, Cluster) {
    let layer = LayerCost {
        name: "block".into(),
        forward_s: 1e-5,
        backward_s: 2e-5,
        fixed_s: 0.0,
        param_bytes: 1 << 20,
        largest_param_bytes: 1 << 18,
        activation_bytes: 1 << 16,
        output_bytes: 1 << 12,
        tensor_parallel: true,
        tied: None,
        update_s: 0.0,
    };
    (
        Workload { layers: vec![layer; 8], batch: 64, state_per_param_byte: 4, grad_dtype: tandem::DType::F32, offloaded_states: 0 },
        Cluster::dual_m60(1),
    )
}

/// `plan` as the search of [`tried`].
fn search(work: &Workload, cluster: &Cluster) -> Result<Plan> {
    plan(work, cluster)
}

#[test]
fn a_slow_trial_moves_the_choice_to_a_layout_that_ran() {
    let (work, cluster) = light();
    let untried = plan(&work, &cluster).unwrap();
    assert!(untried.best.layout.devices() > 1, "the layer model alone spreads the model: {untried}");
    // Each device beyond the first costs 20 ms a step that the layer model does not see.
    let mut runs = Vec::new();
    let p = tried(&work, &cluster, &search, &mut |p: &Plan| {
        runs.push(p.best.layout.clone());
        Ok(p.best.step_s + 20e-3 * (p.best.layout.devices() - 1) as f64)
    })
    .unwrap();
    println!("{p}");
    assert_eq!(p.best.layout.devices(), 1, "{p}");
    assert!(runs.len() >= 2 && runs.len() <= MAX_TRIALS, "{runs:?}");
    assert_eq!(p.tried.iter().map(|t| t.layout.clone()).collect::<Vec<_>>(), runs);
    // The chosen layout ran, and its prediction is what it measured.
    let own = p.tried.iter().find(|t| t.layout == p.best.layout).expect("the chosen layout was tried");
    assert!((p.best.step_s - own.measured_s).abs() < 1e-12, "{} {}", p.best.step_s, own.measured_s);
    assert_eq!(p.best.overhead_s, 0.0, "one device costs what the layer model says");
    // Every layout on several devices now carries the overhead its triple measured (the
    // untried variants that of their tried sibling), so none undercuts the choice.
    for e in &p.alternatives {
        let alike =
            p.tried.iter().any(|t| (t.layout.data, t.layout.tensor, t.layout.pipeline) == (e.layout.data, e.layout.tensor, e.layout.pipeline));
        if alike {
            assert!((e.overhead_s - 20e-3 * (e.layout.devices() - 1) as f64).abs() < 1e-9, "{}: {}", e.layout, e.overhead_s);
        }
        assert!(e.step_s >= p.best.step_s || alike, "{} predicted {} without a trial of its kind", e.layout, e.step_s);
    }
}

#[test]
fn a_trial_as_fast_as_predicted_keeps_the_first_choice() {
    let (work, cluster) = light();
    let untried = plan(&work, &cluster).unwrap();
    let mut runs = 0;
    let p = tried(&work, &cluster, &search, &mut |p: &Plan| {
        runs += 1;
        Ok(p.best.step_s)
    })
    .unwrap();
    assert_eq!(runs, 1);
    assert_eq!(p.best.layout, untried.best.layout);
    assert!((p.best.step_s - untried.best.step_s).abs() < 1e-12);
}

#[test]
fn a_failed_trial_rejects_its_layout_with_the_error() {
    let (work, cluster) = light();
    let untried = plan(&work, &cluster).unwrap();
    // The layer model's choice runs out of memory where the estimate said it fits.
    let p = tried(&work, &cluster, &search, &mut |p: &Plan| match p.best.layout == untried.best.layout {
        false => Ok(p.best.step_s),
        true => Err(Error::invalid("trial", "out of memory on M60#0")),
    })
    .unwrap();
    println!("{p}");
    assert_ne!(p.best.layout, untried.best.layout, "{p}");
    assert!(p.tried.iter().any(|t| t.layout == p.best.layout && t.failed.is_none()), "the choice ran: {p}");
    let failed: Vec<_> = p.tried.iter().filter(|t| t.failed.is_some()).collect();
    assert!(!failed.is_empty(), "{p}");
    for t in failed {
        let why = &p.rejected.iter().find(|r| r.layout == t.layout).expect("the failed layout is rejected").why;
        assert!(why.starts_with("tried, and failed:") && why.contains("out of memory on M60#0"), "{why}");
        assert!(p.alternatives.iter().all(|e| e.layout != t.layout));
    }
    assert!(p.to_string().contains("tried, and failed"), "{p}");
}

#[test]
fn trials_stop_however_slow_every_layout_runs() {
    let (work, cluster) = light();
    let mut runs = 0;
    let p = tried(&work, &cluster, &search, &mut |p: &Plan| {
        runs += 1;
        Ok(p.best.step_s * 100.0 + 1.0)
    })
    .unwrap();
    assert!(runs <= MAX_TRIALS, "{runs}");
    assert_eq!(p.tried.len(), runs);
}

#[test]
fn a_plan_on_this_machine_is_tried_with_real_steps() {
    use tandem::nn::models::SeedModel;
    let devices = Device::parse("cpu,cpu").unwrap();
    let model = SeedModel::Cnn.build(0, &devices[0]).unwrap();
    let data = tandem::data::synthetic::seed_images(16, 0).unwrap();
    let batch = data.batch(&(0..16).collect::<Vec<_>>()).unwrap();
    let probe = tandem::parallel::inputs_to_device(&data.batch(&[0, 1, 2, 3]).unwrap(), &devices[0]).unwrap();
    let (work, cluster) = measure(&model, &probe, &devices, 16, 1).unwrap();
    let search = |w: &Workload, c: &Cluster| plan_within(w, c, &|l, shares| unbuildable(l, shares, &model));
    let opt = OptimConfig::sgd(Default::default());
    let p =
        tried(&work, &cluster, &search, &mut |p: &Plan| step_seconds(&mut *p.build(&model, &devices, &opt, Loss::CrossEntropy)?, &batch)).unwrap();
    println!("{p}");
    let own = p.tried.iter().find(|t| t.layout == p.best.layout).expect("the chosen layout was tried");
    assert!(own.failed.is_none() && own.measured_s > 0.0 && own.measured_s.is_finite(), "{own:?}");
    assert!((p.best.step_s - own.measured_s).abs() < 1e-12);
    assert!(p.to_string().contains("tried before choosing"), "{p}");
}
