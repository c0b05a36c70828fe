//! Two logical devices on the GL adapter, driven from two threads at once with a cold shader
//! cache (issue 12): wgpu-hal shares one GL context among all devices of an adapter, behind a
//! lock that panics after 6 s, and a long submission or a first-use compile on one device held
//! it longer than that while the other waited; the panic then aborted the process.
#![cfg(feature = "wgpu")]
mod common;

use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tandem::backend::{BinaryOp, MatmulSpec, ReduceOp, ReduceSpec, UnaryOp, WindowSpec};
use tandem::{DType, Device, Result};

/// How long the first device's one submission should run: past wgpu-hal's 6 s, so that the
/// second device's calls during it used to time out.
const LONG: Duration = Duration::from_secs(9);

/// The big product the first device runs, and its inputs.
fn big_matmul(dev: &Device, a: &[f32], b: &[f32], out: &tandem::backend::Buffer, s: MatmulSpec) -> Result<()> {
    dev.backend().matmul(&up(dev, a), &up(dev, b), out, s)
}

/// Kernels the first device has not used, all recorded before any is read back, so that one
/// submission compiles them all; outputs in order.
fn first_use_kernels(dev: &Device, seed: u64) -> Result<Vec<Vec<f32>>> {
    let be = dev.backend();
    let mut r = rng(seed);
    let x = uniform(&mut r, 4096, 0.1, 2.0);
    let xb = up(dev, &x);
    let flat = layout(&[4096], &[1], 0);
    let mut outs = Vec::new();
    let unary = [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Relu,
        UnaryOp::Sqrt,
        UnaryOp::Recip,
        UnaryOp::Square,
        UnaryOp::Abs,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Affine { mul: 2.0, add: 0.5 },
        UnaryOp::Powf(2.0),
    ];
    for op in unary {
        let out = be.alloc(4096, DType::F32)?;
        be.unary(op, &xb, &flat, &out)?;
        outs.push(out);
    }
    let rows = layout(&[64, 64], &[64, 1], 0);
    for (i, op) in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min].into_iter().enumerate() {
        let out = be.alloc(4096, DType::F32)?;
        // Alternately contiguous and broadcast second operands: different entry points.
        let second = if i % 2 == 0 { layout(&[64, 64], &[0, 1], 0) } else { rows.clone() };
        be.binary(op, &xb, &rows, &xb, &second, &out)?;
        outs.push(out);
    }
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
        let out = be.alloc(64, DType::F32)?;
        be.reduce(op, &xb, ReduceSpec { outer: 8, len: 64, inner: 8 }, &out)?;
        outs.push(out);
    }
    let w = WindowSpec::new("t", [2, 4, 16, 16], (3, 3), (1, 1), (1, 1))?;
    let cols = be.alloc(2 * w.col_rows() * w.col_len(), DType::F32)?;
    be.im2col(&xb, &cols, w)?;
    let back = be.alloc(4096, DType::F32)?;
    be.col2im(&cols, &back, w)?;
    outs.extend([cols, back]);
    for (m, n, k, trans_b) in [(20, 250, 36, true), (33, 68, 20, false), (64, 64, 64, false)] {
        let mut s = MatmulSpec::new(1, m, n, k);
        s.trans_b = trans_b;
        let out = be.alloc(m * n, DType::F32)?;
        be.matmul(&xb, &xb, &out, s)?;
        outs.push(out);
    }
    Ok(outs.iter().map(|o| down(dev, o)).collect())
}

#[test]
fn two_gl_devices_on_two_threads_with_a_cold_shader_cache() {
    // A fresh machine: Mesa compiles every kernel. Mesa reads this when the adapter is created,
    // which is below (this file's only test, so no other thread reads the environment).
    std::env::set_var("MESA_SHADER_CACHE_DISABLE", "true");
    // The driver column starts with wgpu's backend name.
    let gl = Device::list().into_iter().find(|i| i.backend == tandem::BackendKind::Wgpu && i.driver.starts_with("Gl")).map(|i| i.ordinal);
    let Some(gl) = gl else {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true but no GL adapter was found (llvmpipe expected)");
        eprintln!("skipping: no GL adapter");
        return;
    };
    let open = || Device::from_backend(tandem::backend::wgpu::open(gl).expect("open the GL adapter"));
    let (long, short) = (open(), open());
    let cpu = Device::cpu();

    // Size one submission of the first device to run about `LONG` on this machine.
    let (m, n, k) = (512, 512, 1024);
    let s = MatmulSpec::new(1, m, n, k);
    let mut r = rng(7);
    let (a, b) = (uniform(&mut r, m * k, -1.0, 1.0), uniform(&mut r, k * n, -1.0, 1.0));
    let out = long.backend().alloc(m * n, DType::F32).expect("alloc");
    big_matmul(&long, &a, &b, &out, s).expect("compile the big product");
    long.sync().expect("sync");
    let t = Instant::now();
    big_matmul(&long, &a, &b, &out, s).expect("time the big product");
    long.sync().expect("sync");
    let repeats = (LONG.as_secs_f64() / t.elapsed().as_secs_f64()).ceil().clamp(1.0, 200.0) as usize;
    eprintln!("one product takes {:?}: {repeats} in one submission", t.elapsed());

    let submitting = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let long_job = scope.spawn(|| {
            // Recorded into one batch, submitted as one by the readback below.
            for _ in 0..repeats {
                big_matmul(&long, &a, &b, &out, s).expect("big product");
            }
            submitting.store(true, Ordering::SeqCst);
            let got = down(&long, &out);
            let want = {
                let o = cpu.backend().alloc(m * n, DType::F32).expect("alloc");
                big_matmul(&cpu, &a, &b, &o, s).expect("cpu product");
                down(&cpu, &o)
            };
            assert_close("big product", &got, &want, 1e-5 * k as f32, 1e-5);
            // Then long waits while the other device compiles.
            for _ in 0..3 {
                big_matmul(&long, &a, &b, &out, s).expect("big product");
                long.sync().expect("a long wait");
            }
        });
        let compiles = scope.spawn(|| {
            while !submitting.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
            }
            // Into the other device's submission, then first-use compiles beside its waits.
            std::thread::sleep(Duration::from_millis(300));
            let got = first_use_kernels(&short, 8).expect("first-use kernels on the second GL device");
            let want = first_use_kernels(&cpu, 8).expect("the same on the CPU");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_close(&format!("first-use kernel {i}"), g, w, 1e-4, 1e-5);
            }
        });
        long_job.join().expect("the long job");
        compiles.join().expect("the compiles");
    });
    // Both devices close from two threads at once: closing takes the shared context too.
    std::thread::scope(|scope| {
        scope.spawn(move || drop(long));
        scope.spawn(move || drop(short));
    });
}
