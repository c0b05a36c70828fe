//! Two logical devices on the GL adapter, driven from two threads at once with a cold shader
//! cache (issue 12): wgpu-hal shares one GL context among all devices of an adapter, behind a
//! lock that panics after 6 s. With Mesa's shader cache empty, llvmpipe's GL driver takes tens
//! of seconds to compile the tiled matmul kernel (55 s here; under a second once cached), all
//! that time inside one submission holding the context, so any call of another device on the
//! adapter meanwhile panicked, and the panic aborted the process from a destructor.
#![cfg(feature = "wgpu")]
mod common;

use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tandem::backend::wgpu::{open_with, MatmulKernel, Options};
use tandem::backend::{BinaryOp, MatmulSpec, ReduceOp, ReduceSpec, UnaryOp, WindowSpec};
use tandem::{DType, Device, Result};

/// Kernels the first device has not used, all recorded before any is read back, so that one
/// submission compiles them all; outputs in order.
fn first_use_kernels(dev: &Device, seed: u64) -> Result<Vec<Vec<f32>>> {
    let be = dev.backend();
    let mut r = rng(seed);
    // Long enough for every operand below (the A·Bᵀ product's B has 250 x 36).
    let x = uniform(&mut r, 9000, 0.1, 2.0);
    let xb = up(dev, &x);
    let flat = layout(&[4096], &[1], 0);
    let mut outs = Vec::new();
    for op in UnaryOp::ALL {
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
    let open = |matmul| Device::from_backend(open_with(gl, Options { matmul, ..Default::default() }).expect("open the GL adapter"));
    // The tiled family is the slow compile; the other device keeps the default family.
    let (tiled, other) = (open(Some(MatmulKernel::Tiled)), open(None));
    let cpu = Device::cpu();
    let (m, n, k) = (256, 256, 512);
    let mut r = rng(7);
    let (a, b) = (uniform(&mut r, m * k, -1.0, 1.0), uniform(&mut r, k * n, -1.0, 1.0));
    let product = |d: &Device| -> Result<Vec<f32>> {
        let out = d.backend().alloc(m * n, DType::F32)?;
        d.backend().matmul(&up(d, &a), &up(d, &b), &out, MatmulSpec::new(1, m, n, k))?;
        d.sync()?;
        Ok(down(d, &out))
    };
    let want = product(&cpu).expect("cpu product");

    let (compiling, compiled) = (AtomicBool::new(false), AtomicBool::new(false));
    std::thread::scope(|scope| {
        let compile = scope.spawn(|| {
            compiling.store(true, Ordering::SeqCst);
            let t = Instant::now();
            let mut s = MatmulSpec::new(2, 70, 132, 36);
            s.b_batch_stride = 0;
            matmul_case(&tiled, &cpu, s, 60).expect("the tiled product on the first GL device");
            eprintln!("first tiled product (with its compile): {:?}", t.elapsed());
            compiled.store(true, Ordering::SeqCst);
        });
        let meanwhile = scope.spawn(|| {
            while !compiling.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
            }
            // Into the other thread's compile, then products with waits, and first-use kernels
            // of our own, until that compile is over.
            std::thread::sleep(Duration::from_millis(500));
            let mut rounds = 0;
            while rounds == 0 || !compiled.load(Ordering::SeqCst) {
                assert_close("product", &product(&other).expect("product on the second GL device"), &want, 1e-5 * k as f32, 1e-5);
                if rounds == 0 {
                    let got = first_use_kernels(&other, 8).expect("first-use kernels on the second GL device");
                    let want = first_use_kernels(&cpu, 8).expect("the same on the CPU");
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert_close(&format!("first-use kernel {i}"), g, w, 1e-4, 1e-5);
                    }
                }
                rounds += 1;
            }
        });
        compile.join().expect("the compile");
        meanwhile.join().expect("the other device");
    });
    // Both devices close from two threads at once: closing takes the shared context too.
    std::thread::scope(|scope| {
        scope.spawn(move || drop(tiled));
        scope.spawn(move || drop(other));
    });
}
