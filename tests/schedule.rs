//! Learning-rate schedules against PyTorch's schedulers and nanoGPT's `get_lr`, at their
//! endpoints and midpoints, and their settings checks and JSON form.
use tandem::optim::LrSchedule;
use tandem::tolerance::assert_close;

fn lrs(s: &LrSchedule, steps: &[u64]) -> Vec<f32> {
    steps.iter().map(|&k| s.lr_at(k)).collect()
}

/// torch 2.15 `OneCycleLR(SGD(lr=0.1), max_lr=0.1, total_steps=100, cycle_momentum=False)`, the
/// lr of steps 0, 1, 14, 28, 29 (the peak, 0.3 * 100 - 1), 30, 64, 98 and 99 (the last).
#[test]
fn one_cycle_matches_pytorch() {
    let s = LrSchedule::one_cycle(0.1, 100);
    s.check().unwrap();
    let steps = [0, 1, 14, 28, 29, 30, 64, 98, 99];
    let torch = [0.004, 0.004281378, 0.04940133, 0.09971862, 0.1, 0.09994965, 0.0500002, 5.0746472e-05, 4e-07];
    assert_close("one-cycle", &lrs(&s, &steps), &torch, 0.0, 1e-6);
    // PyTorch raises past total_steps; here the final lr holds.
    assert_eq!(s.lr_at(150), s.lr_at(99));
}

/// torch 2.15 `StepLR(SGD(lr=0.1), step_size=3, gamma=0.5)`, steps 0 to 9.
#[test]
fn step_matches_pytorch() {
    let s = LrSchedule::Step { lr: 0.1, step_size: 3, gamma: 0.5 };
    let torch = [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125];
    assert_close("step", &lrs(&s, &(0..10).collect::<Vec<_>>()), &torch, 0.0, 1e-7);
}

/// nanoGPT's get_lr with learning_rate 1, warmup_iters 4, lr_decay_iters 14, min_lr 0.1: warmup
/// (k + 1) / 5, the peak at 4, half way down at 9 (0.1 + 0.9 / 2), min_lr from 14 on.
#[test]
fn warmup_cosine_matches_nanogpt() {
    let s = LrSchedule::WarmupCosine { lr: 1.0, warmup_steps: 4, decay_steps: 14, min_lr: 0.1 };
    s.check().unwrap();
    let steps = [0, 3, 4, 9, 14, 15, 1000];
    let want = [0.2, 0.8, 1.0, 0.55, 0.1, 0.1, 0.1];
    assert_close("warmup-cosine", &lrs(&s, &steps), &want, 0.0, 1e-6);
    // A quarter of the way down: 0.1 + 0.9 * (1 + cos(pi / 4)) / 2.
    let quarter = 0.1 + 0.9 * (1.0 + std::f64::consts::FRAC_PI_4.cos()) / 2.0;
    let mid = LrSchedule::WarmupCosine { lr: 1.0, warmup_steps: 4, decay_steps: 12, min_lr: 0.1 };
    assert_close("warmup-cosine quarter", &[mid.lr_at(6)], &[quarter as f32], 0.0, 1e-6);
    let no_warmup = LrSchedule::WarmupCosine { lr: 1.0, warmup_steps: 0, decay_steps: 0, min_lr: 0.25 };
    assert_eq!(lrs(&no_warmup, &[0, 5]), [0.25, 0.25]);
    assert_eq!(LrSchedule::Constant { lr: 3e-4 }.lr_at(12345), 3e-4);
}

#[test]
fn settings_without_a_schedule_are_errors() {
    let bad = [
        LrSchedule::Constant { lr: f32::NAN },
        LrSchedule::Step { lr: 0.1, step_size: 0, gamma: 0.5 },
        LrSchedule::Step { lr: 0.1, step_size: 2, gamma: -0.5 },
        LrSchedule::WarmupCosine { lr: 1.0, warmup_steps: 10, decay_steps: 5, min_lr: 0.0 },
        LrSchedule::WarmupCosine { lr: -1.0, warmup_steps: 1, decay_steps: 5, min_lr: 0.0 },
        // 0.3 * 3 - 1 < 0: the warmup phase would have no step (PyTorch divides by zero).
        LrSchedule::one_cycle(0.1, 3),
        LrSchedule::OneCycle { max_lr: 0.1, total_steps: 100, pct_start: 1.5, div_factor: 25.0, final_div_factor: 1e4 },
        LrSchedule::OneCycle { max_lr: 0.1, total_steps: 100, pct_start: 0.3, div_factor: 0.0, final_div_factor: 1e4 },
    ];
    for s in bad {
        let e = s.check().err().unwrap_or_else(|| panic!("{s:?} passed the check"));
        assert!(e.to_string().contains("LrSchedule"), "{e}");
    }
}

#[test]
fn schedules_are_described_in_json() {
    let s = LrSchedule::WarmupCosine { lr: 0.5, warmup_steps: 100, decay_steps: 5000, min_lr: 0.25 };
    let v = serde_json::to_value(s).unwrap();
    assert_eq!(v, serde_json::json!({"kind": "warmup_cosine", "lr": 0.5, "warmup_steps": 100, "decay_steps": 5000, "min_lr": 0.25}));
    let back: LrSchedule = serde_json::from_value(v).unwrap();
    assert_eq!(back, s);
    let one = serde_json::to_value(LrSchedule::one_cycle(0.5, 10)).unwrap();
    assert_eq!(one["kind"], "one_cycle");
    assert_eq!(one["pct_start"].as_f64(), Some(0.30000001192092896));
}
