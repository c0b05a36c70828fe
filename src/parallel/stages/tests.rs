//! `refine`: how measured stage times move a `Split::Auto` split, without timing anything.
use super::*;
use crate::backend::cpu::CpuBackend;
use crate::nn::{Flatten, Linear};
use crate::optim::SgdConfig;
use std::sync::Arc;

/// Flatten and four small linear layers cut `at`, on two CPU devices, with SGD + momentum.
fn stages(at: usize) -> (Vec<Stage>, OptimConfig) {
    let cpu = Device::cpu();
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(1);
    let mut model = Sequential::new().push("flat", Flatten);
    for i in 0..4 {
        model = model.push(format!("l{i}"), Linear::new(4, 4, &mut rng, &cpu).unwrap());
    }
    let devices = [Device::from_backend(Arc::new(CpuBackend::new())), Device::from_backend(Arc::new(CpuBackend::new()))];
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() });
    let layers: Vec<_> = model.layers().iter().collect();
    (build(&layers, &[0..at, at..5], &devices, &opt).unwrap(), opt)
}

fn ranges(stages: &[Stage]) -> Vec<Range<usize>> {
    stages.iter().map(|s| s.range.clone()).collect()
}

/// Equal profiled layers split 2 | 2; stage 1 measured 5x slower moves one layer to stage 0
/// (3 | 1 is best at 1 : 5); measured times that agree with the estimate move nothing.
#[test]
fn measured_stage_times_move_layers_toward_the_faster_stage() {
    let (mut st, opt) = stages(3);
    let mut cost = vec![vec![0.0, 1.0, 1.0, 1.0, 1.0]; 2];
    assert!(refine(&mut st, &mut cost, &[2.0, 10.0], &opt).unwrap());
    assert_eq!(ranges(&st), vec![0..4, 4..5]);
    // Corrected: l2 costs 5 now (its stage's factor), l0 and l1 still 1.
    assert_eq!(cost[0], vec![0.0, 1.0, 1.0, 5.0, 5.0]);
    // Stage 0 (l0, l1, l2) measured 3, stage 1 (l3) 5: the estimate said 7 and 5, so the
    // split 3 | 1 stays best (its slower stage 5 against 7.1 for 2 | 2).
    assert!(!refine(&mut st, &mut cost, &[3.0, 5.0], &opt).unwrap());
    assert_eq!(ranges(&st), vec![0..4, 4..5]);
}

/// A stage that measured nothing (an empty or failed step) leaves its estimate as it was.
#[test]
fn zero_measured_times_keep_the_estimate() {
    let (mut st, opt) = stages(3);
    let mut cost = vec![vec![0.0, 1.0, 1.0, 1.0, 1.0]; 2];
    assert!(!refine(&mut st, &mut cost, &[0.0, 0.0], &opt).unwrap());
    assert_eq!(cost, vec![vec![0.0, 1.0, 1.0, 1.0, 1.0]; 2]);
}

/// Moving layers keeps their weights and the optimizer's momentum, under the same names.
#[test]
fn moved_layers_keep_weights_and_optimizer_state() {
    let (mut st, opt) = stages(3);
    let x = Tensor::from_vec((0..8).map(|i| i as f32 * 0.1).collect(), [2, 4], &st[0].device).unwrap();
    let h = st[0].model.forward(&x).unwrap().to(&st[1].device).unwrap();
    st[1].model.forward(&h).unwrap().sum_all().unwrap().backward().unwrap();
    for s in &mut st {
        s.opts[0].step().unwrap();
    }
    let before: Vec<(String, Vec<f32>)> = stage_params(&st).unwrap().into_iter().map(|(n, t)| (n, t.to_vec().unwrap())).collect();
    let state_before = st[1].opts[0].state().0.into_iter().map(|(n, t)| (n, t.to_vec().unwrap())).collect::<Vec<_>>();
    let mut cost = vec![vec![0.0, 1.0, 1.0, 1.0, 1.0]; 2];
    assert!(refine(&mut st, &mut cost, &[2.0, 10.0], &opt).unwrap());
    let after: Vec<(String, Vec<f32>)> = stage_params(&st).unwrap().into_iter().map(|(n, t)| (n, t.to_vec().unwrap())).collect();
    assert_eq!(before, after);
    let state_after: Vec<(String, Vec<f32>)> = st.iter().flat_map(|s| s.opts[0].state().0).map(|(n, t)| (n, t.to_vec().unwrap())).collect();
    for (name, v) in &state_before {
        let moved = state_after.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} lost its optimizer state"));
        assert_eq!(&moved.1, v, "{name}");
    }
    assert!(st[0].device.same(st[0].model.parameters()[0].1.device()));
}
