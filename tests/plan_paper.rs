//! A GPT planned for a described cluster from a reduced model: the scaled calibration of a
//! small GPT counts the bytes of the GPT's own calibration exactly (its times are timings), and
//! `tandem plan --cluster dual-m60:2` plans GPT-2 XL's shape without building it, in bounded
//! memory, choosing a layout tandem builds; with heads that split over a server, tensor inside
//! and pipeline across, which builds at a scaled-down width on 8 CPU devices and trains as one.
mod common;
use common::{s, text};
use tandem::nn::models::{Gpt, GptConfig};
use tandem::parallel::plan::{measure_gpt, measure_gpt_scaled, Plan, Reduction, Reuse};
use tandem::parallel::Strategy;
use tandem::{Device, Tensor};

/// Token ids `[k, t]` below `vocab`, the same for every call.
fn windows(k: usize, t: usize, vocab: usize) -> Tensor {
    let ids = (0..k * t).map(|i| ((i * 7 + 3) % vocab) as i32).collect();
    Tensor::from_labels(ids, [k, t], &Device::cpu()).unwrap()
}

#[test]
fn a_reduction_keeps_the_head_size_and_caps_width_and_window() {
    let xl = GptConfig { n_layer: 48, n_head: 25, n_embd: 1600, block_size: 1024, vocab_size: 65, dropout: 0.0, bias: true };
    let r = Reduction::default().of(&xl);
    assert_eq!((r.n_layer, r.n_head, r.n_embd, r.block_size, r.vocab_size), (1, 4, 256, 64, 65));
    let small = GptConfig { n_layer: 2, n_head: 2, n_embd: 32, block_size: 8, ..xl };
    assert_eq!(Reduction::default().of(&small), GptConfig { n_layer: 1, ..small });
}

#[test]
fn a_scaled_calibration_has_the_full_ones_bytes_and_finite_times() {
    let full = GptConfig { n_layer: 3, n_head: 4, n_embd: 128, block_size: 64, vocab_size: 50, dropout: 0.0, bias: true };
    let reduction = Reduction { n_embd: 64, block_size: 32 };
    let small = reduction.of(&full);
    assert_eq!((small.n_layer, small.n_head, small.n_embd, small.block_size), (1, 2, 64, 32), "a reduced model, of the same head size");
    let cpu = Device::cpu();
    for precision in [tandem::optim::Precision::F32, tandem::optim::Precision::Bf16] {
        let cast = precision.autocast();
        let whole = || measure_gpt(&Gpt::new(full, 0, &cpu)?, &windows(4, 64, 50), std::slice::from_ref(&cpu), 8, 2);
        let (measured, _) = tandem::autocast(cast, whole).unwrap();
        let (scaled, _) = tandem::autocast(cast, || measure_gpt_scaled(full, 0, &windows(4, 32, 50), &cpu, 8, 2, Reuse::Off, reduction)).unwrap();
        assert_eq!(scaled.layers.len(), measured.layers.len());
        assert_eq!((scaled.batch, scaled.state_per_param_byte), (measured.batch, measured.state_per_param_byte));
        for (a, b) in scaled.layers.iter().zip(&measured.layers) {
            let bytes = |l: &tandem::parallel::plan::LayerCost| {
                (l.name.clone(), l.param_bytes, l.largest_param_bytes, l.activation_bytes, l.output_bytes, l.tensor_parallel, l.tied)
            };
            assert_eq!(bytes(a), bytes(b), "{precision:?}: the counted bytes are the measured ones");
        }
        // Times are timings (of products of another size, on a shared machine): held here only
        // to be present and finite; how near they come is benches/README.md's to say.
        let block_s = |w: &tandem::parallel::plan::Workload| w.layers[1..=full.n_layer].iter().map(|l| l.forward_s + l.backward_s).sum::<f64>();
        assert!(block_s(&scaled).is_finite() && block_s(&scaled) > 0.0, "{precision:?}: scaled block time {:.3e} s", block_s(&scaled));
    }
}

/// Runs `tandem` with `args` to its end, with its peak resident memory (KiB) from `wait4`.
fn run_with_peak(args: &[&str]) -> (std::process::ExitStatus, String, u64) {
    use std::os::unix::process::ExitStatusExt;
    let dir = common::scratch("plan_paper", "out");
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let (stdout, stderr) = (std::fs::File::create(&out).unwrap(), std::fs::File::create(&err).unwrap());
    #[allow(clippy::zombie_processes)] // reaped by the wait4 below, which also returns its resource usage
    let child = common::tandem().args(args).stdout(stdout).stderr(stderr).spawn().unwrap();
    let (mut status, mut usage) = (0i32, unsafe { std::mem::zeroed::<libc::rusage>() });
    // SAFETY: waits for this test's own child, writing into the two locals.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4: {}", std::io::Error::last_os_error());
    let printed = text(&std::fs::read(&out).unwrap()) + &text(&std::fs::read(&err).unwrap());
    (std::process::ExitStatus::from_raw(status), printed, usage.ru_maxrss as u64)
}

/// `tandem plan --cluster dual-m60:2` of `shape` (GPT-2 XL's size), saved and read back, with
/// what it printed; held to under 1 GiB of resident memory.
fn plan_paper(name: &str, shape: &[&str]) -> (Plan, String) {
    let dir = common::scratch("plan_paper", name);
    let path = dir.join("plan.json");
    let (status, printed, peak_kib) = run_with_peak(&[&["plan", "--cluster", "dual-m60:2", "--save-plan", s(&path)][..], shape].concat());
    assert!(status.success(), "{printed}");
    // The whole model's f32 parameters alone are 6 GB: a process that built it would hold that.
    assert!(peak_kib < 1 << 20, "peak resident memory {peak_kib} KiB, over 1 GiB:\n{printed}");
    let file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    (serde_json::from_value(file["plan"].clone()).unwrap(), printed)
}

const XL: [&str; 14] =
    ["--model", "gpt", "--data", "text", "--n-layer", "48", "--n-embd", "1600", "--n-head", "25", "--block-size", "1024", "--batch", "8"];

/// GPT-2 XL's shape: 1.5 billion parameters with Adam's state (24 GB in f32) do not fit one
/// 8 GB M60, so the plan splits the model within 85% of each M60 (25 heads split over no
/// group of 2 or 4 devices); a layout that combines axes (data over pipelines, ZeRO on the data
/// axis) is within 5% of the best, and builds at a scaled-down width (48 blocks of 50
/// features, 25 heads) on 8 CPU devices and trains as one.
#[test]
fn gpt2_xl_on_a_paper_cluster_is_planned_from_a_reduced_measurement() {
    let (plan, printed) = plan_paper("xl", &XL);
    assert!(plan.model.starts_with("Gpt(n_layer=48, n_head=25, n_embd=1600, block_size=1024"), "{}", plan.model);
    let l = &plan.best.layout;
    assert!(l.tensor > 1 || l.pipeline > 1 || l.shard != tandem::parallel::Shard::None, "{l} splits nothing:\n{printed}");
    let cfg = GptConfig { n_layer: 48, n_head: 25, n_embd: 1600, block_size: 1024, vocab_size: 65, dropout: 0.0, bias: true };
    assert_eq!(tandem::parallel::plan::gpt_unbuildable(l, &plan.shares, &cfg), None, "{l} is not a layout tandem builds");
    assert!(printed.contains("Megatron-LM's rule"), "{printed}");
    let peak: u64 = plan.best.memory.iter().copied().max().unwrap_or(0);
    assert!(peak > 1 << 30 && peak as f64 <= 0.85 * (8u64 << 30) as f64, "peak {peak} B per M60:\n{printed}");
    // The layouts are costed from this host's timings, so their order can change with its
    // load: the best layout that combines axes (data over pipelines, ZeRO on the data axis,
    // the data axis inside the servers) must be within 5% of the best, and build.
    let combines =
        |e: &tandem::parallel::plan::Estimate| [e.layout.data > 1, e.layout.tensor > 1, e.layout.pipeline > 1].iter().filter(|a| **a).count() >= 2;
    let combined = std::iter::once(&plan.best)
        .chain(&plan.alternatives)
        .find(|e| combines(e))
        .unwrap_or_else(|| panic!("no layout that combines axes among the best:\n{printed}"))
        .clone();
    assert!(
        combined.step_s <= 1.05 * plan.best.step_s,
        "{} at {} s against the best {} s:\n{printed}",
        combined.layout,
        combined.step_s,
        plan.best.step_s
    );
    let shares = vec![plan.batch / combined.layout.data; combined.layout.data];
    let small = GptConfig { n_layer: 48, n_head: 25, n_embd: 50, block_size: 16, vocab_size: 65, dropout: 0.0, bias: true };
    trains_scaled_down(Plan { best: combined, shares, ..plan }, small);
}

/// `plan`'s layout, planned for the M60s, built through `Plan::build_gpt` for the GPT `small`
/// on as many CPU devices, trains two AdamW steps as `Single` does (1e-5).
fn trains_scaled_down(plan: Plan, small: GptConfig) {
    let l = plan.best.layout.clone();
    let gpt = |d: &Device| Gpt::new(small, 1, d);
    let cpus = common::cpu_devices(l.devices());
    let scaled =
        Plan { model: tandem::nn::Module::describe(&gpt(&Device::cpu()).unwrap()), devices: cpus.iter().map(Device::spec).collect(), ..plan };
    let adam = tandem::parallel::OptimConfig::adam(tandem::optim::AdamConfig::adamw());
    let mut built = scaled.build_gpt(&gpt, &cpus, &adam).unwrap_or_else(|e| panic!("{l} at {} wide: {e}", small.n_embd));
    assert_eq!(built.devices().len(), l.devices());
    let mut single =
        tandem::parallel::Single::new(gpt(&Device::cpu()).unwrap(), &scaled.optim(&adam), tandem::parallel::Loss::CrossEntropy, &Device::cpu())
            .unwrap();
    let mut rng = common::rng(3);
    for step in 0..2 {
        let ids: Vec<i32> = common::uniform(&mut rng, 2 * 8 * 16, 0.0, 64.0).iter().map(|&v| v as i32).collect();
        let batch = tandem::data::Batch::tokens(ids[..128].to_vec(), ids[128..].to_vec(), 16, 65).unwrap();
        let (a, b) = (built.step(&batch).unwrap().loss, single.step(&batch).unwrap().loss);
        common::assert_close(&format!("{l} at {} wide, step {step}", small.n_embd), &[a], &[b], 0.0, 1e-5);
    }
}

/// XL's size with 32 heads (which split over a server's four M60s): the plan puts tensor
/// parallelism inside a server and pipeline stages across (Megatron-LM's layout), and that
/// layout, planned for the M60s, builds through `Plan::build_gpt` at a scaled-down width (48
/// blocks of 64 features) on 8 logical CPU devices and trains as `Single` does.
#[test]
fn a_combined_paper_layout_builds_and_trains_scaled_down_on_8_devices() {
    let mut shape = XL;
    shape[9] = "32";
    let (plan, printed) = plan_paper("xl32", &shape);
    let l = plan.best.layout.clone();
    let axes = [l.data > 1, l.tensor > 1, l.pipeline > 1].iter().filter(|a| **a).count();
    assert!(axes >= 2 && l.tensor > 1 && l.tensor <= 4, "{l}: tensor parallelism inside a server of four, combined with another axis:\n{printed}");
    let small = GptConfig { n_layer: 48, n_head: 32, n_embd: 64, block_size: 16, vocab_size: 65, dropout: 0.0, bias: true };
    trains_scaled_down(plan, small);
}
