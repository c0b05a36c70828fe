//! ZeRO-3 with the optimizer state offloaded to host memory: a GPT whose f32 training state is
//! four times each device's budget trains under it on four devices in f32, bit for bit as
//! plain deterministic data parallelism without a budget; from the library and the CLI.
use tandem::data::text::TextCorpus;
use tandem::parallel::{DataParallelConfig, Shard};
use tandem::tolerance::assert_close;
use tandem::Device;

#[path = "common/zero3_gpt.rs"]
mod zero3_gpt;
use zero3_gpt::{adamw, configured_with, devices, gpt, gpt_batches, out_of_memory, train};

/// The f32 demonstration. Per device, ZeRO-3 keeps a quarter of the weights, the
/// gradients and AdamW's two moments: 16 bytes a parameter over 4, which is the budget
/// itself, so it cannot also hold a unit being gathered or an activation. With the moments in
/// host memory a device keeps 8 of the 16 bytes a parameter over 4 (half the budget) and one
/// parameter's moments during its update. The update runs the same kernel on the same values,
/// so deterministic mode gives plain data parallelism's losses and weights bit for bit.
#[test]
fn deterministic_f32_zero3_four_times_the_budget_offloaded_is_plain_bit_for_bit() {
    let corpus = TextCorpus::builtin(0);
    let cfg = gpt(48, &corpus);
    let state = 16 * cfg.parameter_count().unwrap();
    let budget = state / 4;
    let batches = gpt_batches(&cfg, &corpus, 8, 3);
    let det = |shard| DataParallelConfig { shard, bucket_bytes: 32 << 10, deterministic: true, ..Default::default() };
    let (want_l, want_w) = train(&mut configured_with(cfg, &devices(4), det(Shard::None), &adamw()).unwrap(), &batches).unwrap();

    let budgeted = || {
        let devs = devices(4);
        devs.iter().for_each(|d| d.set_memory_budget(Some(budget)));
        devs
    };
    let devs = budgeted();
    let mut s = configured_with(cfg, &devs, det(Shard::Full), &adamw().offloaded(true)).unwrap();
    let (losses, weights) = train(&mut s, &batches).unwrap();
    let peaks: Vec<u64> = devs.iter().map(|d| d.memory().peak).collect();
    println!("{} parameters, f32 state {state} B, budget {budget} B per device; offloaded ZeRO-3 peaks {peaks:?}", cfg.parameter_count().unwrap());
    assert!(peaks.iter().all(|&p| p <= budget), "{peaks:?} against {budget}");
    assert_close("offloaded deterministic ZeRO-3 losses", &losses, &want_l, 0.0, 0.0);
    assert_close("offloaded deterministic ZeRO-3 weights", &weights, &want_w, 0.0, 0.0);

    // The same without the offload, and plain data parallelism with it, do not fit (the first
    // without offload only from the second step: AdamW's moments are made by the first update,
    // once the activations are gone, and fill the budget exactly).
    for (shard, offload) in [(Shard::Full, false), (Shard::None, true)] {
        let failed = configured_with(cfg, &budgeted(), det(shard), &adamw().offloaded(offload)).and_then(|mut s| train(&mut s, &batches[..2]));
        out_of_memory(failed, &format!("{shard:?} (offload {offload}) under a quarter of the state"), &[]);
    }
}

/// From the command line: `--offload-optimizer` with `--shard full` under a quarter of the
/// state trains, checkpoints, resumes and saves plain deterministic data parallelism's weights bit for bit; without the
/// flag the same run is refused before it starts, with the out-of-memory error.
#[test]
fn cli_offloaded_zero3_four_times_the_limit_saves_the_plain_weights() {
    let dir = std::env::temp_dir().join(format!("tandem-zero3-offload-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let run = |args: &[&str]| std::process::Command::new(env!("CARGO_BIN_EXE_tandem")).args(args).output().unwrap();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let gpt = [
        "train",
        "--model",
        "gpt",
        "--data",
        "text",
        "--n-layer",
        "24",
        "--n-embd",
        "64",
        "--n-head",
        "4",
        "--block-size",
        "16",
        "--batch",
        "8",
        "--optimizer",
        "adamw",
        "--lr",
        "0.001",
        "--grad-clip",
        "0.5",
        "--devices",
        "cpu,cpu,cpu,cpu",
        "--strategy",
        "data",
        "--recompute",
        "--bucket-size",
        "32KiB",
        "--deterministic",
    ];
    // 1,203,584 parameters: 19.26 MB of f32 weights, gradients and moments; a quarter is 4.81 MB.
    let limit = ["--memory-limit", "4696KiB"];
    let (plain, zero3, ck) = (path("plain.safetensors"), path("zero3.safetensors"), path("ck"));
    let ok = |args: Vec<&str>| {
        let out = run(&[&gpt[..], &args].concat());
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    ok(vec!["--steps", "4", "--save", &plain]);
    let zero3_args = ["--shard", "full", limit[0], limit[1]];
    ok([&zero3_args[..], &["--offload-optimizer", "--steps", "2", "--checkpoint-dir", &ck]].concat());
    ok([&zero3_args[..], &["--offload-optimizer", "--steps", "4", "--checkpoint-dir", &ck, "--resume", "--save", &zero3]].concat());
    let load =
        |p: &str| tandem::checkpoint::load_weights(p, &Device::cpu()).unwrap().iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect::<Vec<f32>>();
    assert_close("offloaded ZeRO-3 under the limit, resumed, from the command line", &load(&zero3), &load(&plain), 0.0, 0.0);
    let out = run(&[&gpt[..], &zero3_args[..], &["--steps", "1"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("out of memory on cpu") && err.contains("optimizer state"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
