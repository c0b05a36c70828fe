//! The CPU backend's OpenBLAS path (feature `openblas`): forced and by rule, its products
//! against an f64 oracle on odd shapes, all four transposes, offsets into a larger tensor and
//! batches, sizes past OpenBLAS's blocking; pinned kernels take the `gemm` crate, bit for bit.
//! Skipped where `libopenblas.so.0` is missing, a failure with `CI=true` (CI installs it).
#![cfg(feature = "openblas")]
mod common;
use std::sync::Arc;
use tandem::backend::cpu::{openblas, CpuBackend, GemmChoice, OPENBLAS_FROM};
use tandem::{autograd::no_grad, Device, Tensor};

fn have_openblas() -> bool {
    match openblas::library() {
        Ok(_) => true,
        Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("CI needs OpenBLAS (apt-get install libopenblas0): {why}"),
        Err(why) => {
            eprintln!("skipped: {why}");
            false
        }
    }
}

fn device(choice: GemmChoice) -> Device {
    Device::from_backend(Arc::new(CpuBackend::with_gemm(choice)))
}

/// op(A)·op(B) in f64, A and B as stored: m×k (or k×m when `ta`), k×n (or n×k when `tb`).
fn oracle(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, ta: bool, tb: bool) -> Vec<f32> {
    let at = |i: usize, p: usize| if ta { a[p * m + i] } else { a[i * k + p] } as f64;
    let bt = |p: usize, j: usize| if tb { b[j * k + p] } else { b[p * n + j] } as f64;
    (0..m * n).map(|ij| (0..k).map(|p| at(ij / n, p) * bt(p, ij % n)).sum::<f64>() as f32).collect()
}

/// (m, n, k): single values, odd sizes across OpenBLAS's register and cache blocks, a long K
/// (past 65,535), skinny products, products split by rows over threads and, with few rows, by
/// columns (uneven last blocks).
const SHAPES: &[(usize, usize, usize)] =
    &[(1, 1, 1), (37, 53, 71), (129, 65, 257), (300, 2, 500), (8, 8, 70_001), (256, 256, 256), (8, 3001, 200), (3, 1001, 1000)];

#[test]
fn forced_openblas_matches_the_oracle_on_odd_shapes_and_every_transpose() {
    if !have_openblas() {
        return;
    }
    let dev = device(GemmChoice::OpenBlas);
    assert!(dev.info().matmul.contains("OpenBLAS"), "{}", dev.info().matmul);
    let mut r = common::rng(1);
    for &(m, n, k) in SHAPES {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let a = common::uniform(&mut r, m * k, -1.0, 1.0);
            let b = common::uniform(&mut r, k * n, -1.0, 1.0);
            let ad = if ta { [k, m] } else { [m, k] };
            let bd = if tb { [n, k] } else { [k, n] };
            let got = no_grad(|| Tensor::from_vec(a.clone(), ad, &dev)?.matmul_t(&Tensor::from_vec(b.clone(), bd, &dev)?, ta, tb)?.to_vec()).unwrap();
            // f32 sums of k products of values in [-1, 1]: error grows as sqrt(k) ulps of k.
            let atol = 1e-6 * (k as f32).sqrt() * 4.0;
            common::assert_close(&format!("openblas {m}x{n}x{k} ta={ta} tb={tb}"), &got, &oracle(&a, &b, m, n, k, ta, tb), atol, 1e-5);
        }
    }
}

/// Operands that start inside a larger tensor (a `narrow` of rows) and batches of products
/// above the per-image size, which OpenBLAS runs one after another.
#[test]
fn offsets_and_batches_reach_openblas_right() {
    if !have_openblas() {
        return;
    }
    let backend = Arc::new(CpuBackend::with_gemm(GemmChoice::OpenBlas));
    let (cpu, blas) = (device(GemmChoice::Gemm), Device::from_backend(backend.clone()));
    let mut r = common::rng(2);
    let (bt, m, n, k) = (3, 200, 210, 190);
    // Each product is past the per-image size (2^22 multiply-adds), below which a batch stays
    // on the gemm crate, one product per thread.
    assert!(m * n * k > 1 << 22);
    let a = common::uniform(&mut r, bt * m * k + 5 * k, -1.0, 1.0);
    let b = common::uniform(&mut r, bt * k * n, -1.0, 1.0);
    let run = |dev: &Device| {
        no_grad(|| {
            let a = Tensor::from_vec(a.clone(), [bt * m + 5, k], dev)?.narrow(0, 5, bt * m)?.reshape([bt, m, k])?;
            a.matmul(&Tensor::from_vec(b.clone(), [bt, k, n], dev)?)?.to_vec()
        })
        .unwrap()
    };
    let want: Vec<f32> = (0..bt).flat_map(|z| oracle(&a[5 * k + z * m * k..], &b[z * k * n..], m, n, k, false, false)).collect();
    common::assert_close("openblas batch with offset", &run(&blas), &want, 1e-4, 1e-5);
    assert_eq!(backend.openblas_products(), 1, "the batched product did not go to OpenBLAS");
    common::assert_close("gemm batch with offset", &run(&cpu), &want, 1e-4, 1e-5);
}

/// `auto` gives OpenBLAS the products from `OPENBLAS_FROM` multiply-adds where the `gemm`
/// crate has no AVX-512 kernels, and keeps everything on `gemm` where it has them.
#[test]
fn auto_takes_openblas_only_where_it_was_measured_faster() {
    if !have_openblas() {
        return;
    }
    let backend = Arc::new(CpuBackend::with_gemm(GemmChoice::Auto));
    let auto = Device::from_backend(backend.clone());
    let avx512 = tandem::backend::cpu::gemm_kernels() == "AVX-512";
    let mut r = common::rng(3);
    let (m, n, k) = (512, 512, 512);
    assert!(m * n * k >= OPENBLAS_FROM && 64 * 64 * 64 < OPENBLAS_FROM);
    for (m, n, k) in [(64, 64, 64), (m, n, k)] {
        let (a, b) = (common::uniform(&mut r, m * k, -1.0, 1.0), common::uniform(&mut r, k * n, -1.0, 1.0));
        let got = no_grad(|| Tensor::from_vec(a.clone(), [m, k], &auto)?.matmul(&Tensor::from_vec(b.clone(), [k, n], &auto)?)?.to_vec()).unwrap();
        common::assert_close(&format!("auto {m}x{n}x{k}"), &got, &oracle(&a, &b, m, n, k, false, false), 1e-4, 1e-5);
    }
    let want = u64::from(!avx512);
    assert_eq!(backend.openblas_products(), want, "products given to OpenBLAS by auto (gemm kernels {})", tandem::backend::cpu::gemm_kernels());
    assert!(auto.info().matmul.contains("OpenBLAS") && auto.info().matmul.contains("gemm crate"), "{}", auto.info().matmul);
}

/// Pinned kernels (what deterministic data parallelism asks) take the `gemm` crate only, even on
/// a device told to use OpenBLAS: the same bits as a device that never uses it.
#[test]
fn pinned_kernels_are_the_gemm_crates_bit_for_bit() {
    if !have_openblas() {
        return;
    }
    let backend = Arc::new(CpuBackend::with_gemm(GemmChoice::OpenBlas));
    let blas = Device::from_backend(backend.clone());
    let gemm = device(GemmChoice::Gemm);
    let mut r = common::rng(4);
    let (n, k) = (160, 1000);
    let (a, b) = (common::uniform(&mut r, n * k, -1.0, 1.0), common::uniform(&mut r, k * n, -1.0, 1.0));
    let product =
        |dev: &Device| no_grad(|| Tensor::from_vec(a.clone(), [n, k], dev)?.matmul(&Tensor::from_vec(b.clone(), [k, n], dev)?)?.to_vec()).unwrap();
    common::assert_close("openblas 160x160x1000", &product(&blas), &oracle(&a, &b, n, n, k, false, false), 1e-4, 1e-5);
    assert_eq!(backend.openblas_products(), 1, "the forced device did not use OpenBLAS");
    blas.backend().pin_kernels();
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    assert!(bits(product(&blas)) == bits(product(&gemm)), "a pinned device's product differs from the gemm crate's");
    assert_eq!(backend.openblas_products(), 1, "a pinned device gave OpenBLAS a product");
}
