//! The elementwise op table (`backend/op_table.rs`): codes, the constants the kernels switch on,
//! NaN for a code outside the table on every backend, and softplus (the op added through the
//! table alone) on special values, large sizes and with its gradient on every device.
mod common;

use common::*;
use tandem::backend::op_table::{cuda_constants, kernel_constants, wgsl_constants};
use tandem::backend::{BinaryOp, Buffer, UnaryOp};
use tandem::{Device, Layout, Result, Tensor};

#[test]
fn codes_round_trip_and_constant_names_are_distinct() {
    for op in UnaryOp::ALL {
        assert_eq!(UnaryOp::from_code(op.code(), op.params()), Some(op), "{op:?}");
    }
    for op in BinaryOp::ALL {
        assert_eq!(BinaryOp::from_code(op.code()), Some(op), "{op:?}");
    }
    let names = kernel_constants();
    assert_eq!(names.len(), UnaryOp::ALL.len() + BinaryOp::ALL.len());
    for (i, (n, _)) in names.iter().enumerate() {
        assert!(names[..i].iter().all(|(m, _)| m != n), "{n} twice");
    }
    assert!(wgsl_constants().contains("\nconst UNARY_TANH: u32 = 10u;\n"), "{}", wgsl_constants());
    assert!(wgsl_constants().contains("\nconst UNARY_SOFTPLUS: u32 = 17u;\n"));
    assert!(cuda_constants().contains("\n    BINARY_RELU_BACKWARD = 8,\n"), "{}", cuda_constants());
}

/// Codes just past each table, and far past it.
fn unknown(codes: impl Iterator<Item = u32>) -> [u32; 2] {
    [codes.max().unwrap() + 1, 999]
}

#[test]
fn an_unknown_code_is_nan_on_the_host() {
    for code in unknown(UnaryOp::ALL.iter().map(|op| op.code())).into_iter().chain([u32::MAX]) {
        assert_eq!(UnaryOp::from_code(code, [1.0, 2.0]), None);
        assert!(UnaryOp::reference(code, [1.0, 2.0], 0.5).is_nan(), "unary code {code}");
    }
    for code in unknown(BinaryOp::ALL.iter().map(|op| op.code())).into_iter().chain([u32::MAX]) {
        assert_eq!(BinaryOp::from_code(code), None);
        assert!(BinaryOp::reference(code, 1.0, 2.0).is_nan(), "binary code {code}");
    }
    assert_eq!(UnaryOp::reference(UnaryOp::Affine { mul: 2.0, add: 1.0 }.code(), [2.0, 1.0], 3.0), 7.0);
    assert_eq!(BinaryOp::reference(BinaryOp::Sub.code(), 5.0, 2.0), 3.0);
}

/// A device's elementwise kernels run by raw code (the GPU backends' `unary_code`).
fn unary_code(dev: &Device, code: u32, params: [f32; 2], x: &Buffer, l: &Layout, out: &Buffer) -> Result<()> {
    let any = dev.backend().as_any();
    #[cfg(feature = "wgpu")]
    if let Some(b) = any.downcast_ref::<tandem::backend::wgpu::WgpuBackend>() {
        return b.unary_code(code, params, x, l, out);
    }
    #[cfg(feature = "cuda")]
    if let Some(b) = any.downcast_ref::<tandem::backend::cuda::CudaBackend>() {
        return b.unary_code(code, params, x, l, out);
    }
    panic!("{dev}: no kernels by code ({any:?})")
}

fn binary_code(dev: &Device, code: u32, a: &Buffer, l: &Layout, b: &Buffer, out: &Buffer) -> Result<()> {
    let any = dev.backend().as_any();
    #[cfg(feature = "wgpu")]
    if let Some(be) = any.downcast_ref::<tandem::backend::wgpu::WgpuBackend>() {
        return be.binary_code(code, a, l, b, l, out);
    }
    #[cfg(feature = "cuda")]
    if let Some(be) = any.downcast_ref::<tandem::backend::cuda::CudaBackend>() {
        return be.binary_code(code, a, l, b, l, out);
    }
    panic!("{dev}: no kernels by code ({any:?})")
}

/// Every code of each table gives the table's CPU value, and a code past it NaN, on every
/// device: in the wgpu scalar kernel (37 elements) and its four-wide one (40), and CUDA's.
#[test]
fn every_device_computes_each_code_as_the_table_and_nan_for_an_unknown_one() {
    on_each_device(|dev, _| {
        for n in [37, 40] {
            let x = uniform(&mut rng(n as u64), n, 0.1, 2.0);
            let y = uniform(&mut rng(n as u64 + 1), n, -2.0, 2.0);
            let l = Layout::contiguous(&tandem::Shape(vec![n]));
            let (xb, yb, out) = (up(dev, &x), up(dev, &y), dev.backend().alloc(n, tandem::DType::F32)?);
            let params = [1.5, -0.25];
            let known = UnaryOp::ALL.map(|op| op.code());
            for code in known.into_iter().chain(unknown(known.into_iter())) {
                unary_code(dev, code, params, &xb, &l, &out)?;
                let want: Vec<f32> = x.iter().map(|&v| UnaryOp::reference(code, params, v)).collect();
                assert_close(&format!("unary code {code}, {n} elements"), &down(dev, &out), &want, 1e-5, 1e-5);
            }
            let known = BinaryOp::ALL.map(|op| op.code());
            for code in known.into_iter().chain(unknown(known.into_iter())) {
                binary_code(dev, code, &xb, &l, &yb, &out)?;
                let want: Vec<f32> = x.iter().zip(&y).map(|(&a, &b)| BinaryOp::reference(code, a, b)).collect();
                assert_close(&format!("binary code {code}, {n} elements"), &down(dev, &out), &want, 1e-6, 1e-6);
            }
        }
        Ok(())
    });
}

/// PyTorch's `softplus` (beta 1, threshold 20) in f64, rounded: x above 20, else log1p(e^x).
fn torch_softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (x as f64).exp().ln_1p() as f32
    }
}

/// Its gradient, PyTorch's `softplus_backward`: z / (z + 1) with z = e^x, 1 above 20.
fn torch_softplus_grad(x: f32) -> f32 {
    if x > 20.0 {
        1.0
    } else {
        let z = (x as f64).exp();
        if z.is_infinite() {
            1.0
        } else {
            (z / (z + 1.0)) as f32
        }
    }
}

#[test]
fn softplus_of_special_values_on_every_device() {
    let nan = f32::NAN;
    let special = [
        nan,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e-30,
        -1e-30,
        1.0,
        -1.0,
        19.99,
        20.0,
        20.001,
        25.0,
        -20.0,
        -80.0,
        -100.0,
        88.0,
        1e30,
        -1e30,
        f32::MAX,
        f32::MIN,
    ];
    let want: Vec<f32> = special.iter().map(|&x| torch_softplus(x)).collect();
    assert_eq!(want[1], f32::INFINITY);
    assert_eq!(want[2], 0.0);
    assert_eq!(want[11], 20.001f32, "above the threshold, x itself");
    // Subnormal results (e^-100) may be flushed by GPUs: an absolute bound of the smallest normal.
    let cpu = Device::cpu();
    let got = Tensor::from_vec(special.to_vec(), [special.len()], &cpu).unwrap().softplus().unwrap().to_vec().unwrap();
    assert_close("softplus on the CPU", &got, &want, f32::MIN_POSITIVE, 2e-7);
    assert!(got[0].is_nan());
    let grad_want: Vec<f32> = special.iter().map(|&x| torch_softplus_grad(x)).collect();
    on_each_device(|dev, cpu| {
        for d in [dev, cpu] {
            let x = Tensor::from_vec(special.to_vec(), [special.len()], d)?.requires_grad();
            let y = x.softplus()?;
            assert_close(&format!("softplus on {d}"), &y.to_vec()?, &want, f32::MIN_POSITIVE, 2e-6);
            y.sum_all()?.backward()?;
            let g = x.grad().expect("a gradient").to_vec()?;
            assert_close(&format!("softplus gradient on {d}"), &g, &grad_want, f32::MIN_POSITIVE, 2e-6);
        }
        Ok(())
    });
}

/// Large and odd sizes across the threshold, against PyTorch's definition and the CPU.
#[test]
fn softplus_large_and_odd_sizes_match_the_cpu_on_every_device() {
    let n = (1 << 20) + 3;
    let x = uniform(&mut rng(17), n, -30.0, 30.0);
    let cpu = Device::cpu();
    let host = Tensor::from_vec(x.clone(), [n], &cpu).unwrap().softplus().unwrap().to_vec().unwrap();
    let want: Vec<f32> = x.iter().map(|&v| torch_softplus(v)).collect();
    assert_close("softplus on the CPU, 2^20 + 3 elements", &host, &want, 0.0, 2e-7);
    on_each_device(|dev, cpu| {
        same_f32(dev, cpu, "softplus 2^20 + 3", f32::MIN_POSITIVE, 1e-5, |d| Tensor::from_vec(x.clone(), [n], d)?.softplus()?.to_vec())?;
        // an odd shape (the wgpu scalar kernel); strided layouts: conformance.rs's every-op test
        same_f32(dev, cpu, "softplus [7, 13]", f32::MIN_POSITIVE, 1e-5, |d| Tensor::from_vec(x[..91].to_vec(), [7, 13], d)?.softplus()?.to_vec())
    });
}
