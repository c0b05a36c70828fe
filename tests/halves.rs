//! Bf16 and F16 storage on every backend: the casts give the CPU reference's bits (the `half`
//! crate's, as PyTorch's) for every special value, every half bit pattern and random f32 bits;
//! copies, fills and partial reads and writes at odd positions keep the neighbouring halves;
//! the split into sub-range dispatches under a small binding limit; gradients through casts;
//! and the errors of mixing widths.
mod common;
use common::*;
use rand::Rng;
use tandem::backend::CastOp;
use tandem::{DType, Device, Error, Result, Tensor};

const HALVES: [(DType, CastOp, CastOp); 2] = [(DType::Bf16, CastOp::F32ToBf16, CastOp::Bf16ToF32), (DType::F16, CastOp::F32ToF16, CastOp::F16ToF32)];

/// f32 values whose conversion is easy to get wrong: ties to even, the f16 overflow edge,
/// f16 subnormals and their ties, f32 subnormals, infinities and NaNs with payloads.
fn special_values() -> Vec<f32> {
    let p = |e: i32| 2f32.powi(e);
    let mut v = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        1.0 + p(-8),           // bf16 tie, to even (down)
        1.0 + 3.0 * p(-8),     // bf16 tie, to even (up)
        1.0 + p(-11),          // f16 tie, to even (down)
        1.0 + 3.0 * p(-11),    // f16 tie, to even (up)
        1.0 + p(-11) + p(-20), // past the f16 tie: up
        65504.0,
        65519.0, // rounds to 65504
        65520.0, // rounds to inf in f16
        -65520.0,
        f32::MAX, // bf16: rounds to inf
        f32::MIN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        p(-14),          // smallest normal f16
        p(-14) - p(-25), // rounds up to it
        p(-24),          // smallest f16 subnormal
        p(-25),          // tie with 0: to even (0)
        3.0 * p(-25),    // tie: to even (2^-23)
        p(-25) + p(-40), // past the tie: up
        p(-26),
        -p(-24),
        f32::MIN_POSITIVE,
        1e-40, // f32 subnormal
        -1e-45,
        std::f32::consts::PI,
        -123.456,
    ];
    for bits in [0x7fc0_0000u32, 0xffc0_0000, 0x7f80_0001, 0x7fbf_ffff, 0x7fc0_1234, 0xff80_2000] {
        v.push(f32::from_bits(bits));
    }
    v
}

/// The bits `dev` writes for `x` as `dtype`, through `Backend::cast`.
fn to_bits(dev: &Device, op: CastOp, x: &[f32]) -> Result<Vec<u16>> {
    let out = dev.backend().alloc(x.len(), op.dtypes().1)?;
    dev.backend().cast(op, &up(dev, x), &out, x.len())?;
    Ok(bytemuck::pod_collect_to_vec(&dev.backend().download(&out)?))
}

/// The f32 bits `dev` reads from half bits `h`.
fn from_bits(dev: &Device, op: CastOp, h: &[u16]) -> Result<Vec<u32>> {
    let x = dev.backend().upload(bytemuck::cast_slice(h), op.dtypes().0)?;
    let out = dev.backend().alloc(h.len(), DType::F32)?;
    dev.backend().cast(op, &x, &out, h.len())?;
    Ok(bytemuck::pod_collect_to_vec(&dev.backend().download(&out)?))
}

fn op_from(dtype: DType) -> CastOp {
    CastOp::between(dtype, DType::F32).expect("a half type")
}

fn reference_to(op: CastOp, x: &[f32]) -> Vec<u16> {
    x.iter().map(|&v| op.to_half(v)).collect()
}

#[test]
fn the_reference_rounds_as_pytorch_documents() {
    let p = |e: i32| 2f32.powi(e);
    let bf = |x: f32| CastOp::Bf16ToF32.from_half(CastOp::F32ToBf16.to_half(x));
    let f16 = |x: f32| CastOp::F16ToF32.from_half(CastOp::F32ToF16.to_half(x));
    assert_eq!([bf(1.0 + p(-8)), bf(1.0 + 3.0 * p(-8)), bf(f32::MAX)], [1.0, 1.0 + p(-6), f32::INFINITY]);
    assert_eq!([f16(65519.0), f16(65520.0), f16(p(-25)), f16(3.0 * p(-25))], [65504.0, f32::INFINITY, 0.0, p(-23)]);
    assert!(bf(f32::NAN).is_nan() && f16(-f32::NAN).is_nan() && f16(-f32::NAN).is_sign_negative());
    assert_eq!(f16(-0.0).to_bits(), (-0.0f32).to_bits());
}

#[test]
fn casts_to_halves_give_the_reference_bits_on_every_device() {
    let mut r = rng(71);
    // Random bit patterns reach every exponent, NaN payloads and subnormals; 70,001 values
    // (odd, so the last word is half used) are past a 65,535-iteration loop and one workgroup row.
    let mut x = special_values();
    x.extend((0..70_001 - x.len()).map(|_| f32::from_bits(r.random::<u32>())));
    on_each_device(|dev, _| {
        for (dtype, to, _) in HALVES {
            let (got, want) = (to_bits(dev, to, &x)?, reference_to(to, &x));
            if let Some(i) = (0..x.len()).find(|&i| got[i] != want[i]) {
                panic!("{dtype:?} of {:e} ({:#010x}) on {dev}: {:#06x}, want {:#06x}", x[i], x[i].to_bits(), got[i], want[i]);
            }
        }
        Ok(())
    });
}

#[test]
fn every_half_bit_pattern_widens_exactly_on_every_device() {
    let all: Vec<u16> = (0..=u16::MAX).chain([7, 0x8001, 0x7c01]).collect();
    on_each_device(|dev, _| {
        for (dtype, _, from) in HALVES {
            let got = from_bits(dev, from, &all)?;
            for (i, &h) in all.iter().enumerate() {
                let want = from.from_half(h).to_bits();
                assert_eq!(got[i], want, "{dtype:?} bits {h:#06x} on {dev}: {:#010x}, want {want:#010x}", got[i]);
            }
        }
        Ok(())
    });
}

#[test]
fn a_cast_of_fewer_elements_keeps_the_rest_of_the_output() {
    // Casting 5 values into a buffer of 8 halves writes the low half of word 2 only.
    on_each_device(|dev, cpu| {
        for d in [dev, cpu] {
            for (dtype, to, _) in HALVES {
                let out = d.backend().alloc(8, dtype)?;
                d.backend().fill(&out, 3.0)?;
                d.backend().cast(to, &up(d, &[1.0, 2.0, -1.0, 0.5, 4.0, 9.0]), &out, 5)?;
                let bits: Vec<u16> = bytemuck::pod_collect_to_vec(&d.backend().download(&out)?);
                let got: Vec<f32> = bits.iter().map(|&h| op_from(dtype).from_half(h)).collect();
                assert_eq!(got, [1.0, 2.0, -1.0, 0.5, 4.0, 3.0, 3.0, 3.0], "{dtype:?} on {d}");
            }
        }
        Ok(())
    });
}

/// Every (source offset, destination offset, length) below 7 and 6, in a 13-half buffer.
fn copy_cases() -> Vec<(usize, usize, usize)> {
    let mut cases = Vec::new();
    for s in 0..4 {
        for d in 0..4 {
            for len in 0..7 {
                cases.push((s, d, len));
            }
        }
    }
    cases
}

fn halves_of(d: &Device, dtype: DType, v: &[f32]) -> Result<Tensor> {
    Tensor::from_vec(v.to_vec(), [v.len()], d)?.to_dtype(dtype)
}

#[test]
fn copies_fills_and_partial_transfers_of_halves_at_odd_positions() {
    let src: Vec<f32> = (1..=13).map(|i| i as f32).collect();
    let dst: Vec<f32> = (1..=13).map(|i| -(i as f32)).collect();
    on_each_device(|dev, _| {
        for (dtype, _, _) in HALVES {
            for (so, doff, len) in copy_cases() {
                let (s, t) = (halves_of(dev, dtype, &src)?, halves_of(dev, dtype, &dst)?);
                dev.backend().copy(s.buffer(), so, t.buffer(), doff, len)?;
                let mut want = dst.clone();
                want[doff..doff + len].copy_from_slice(&src[so..so + len]);
                assert_eq!(t.to_vec()?, want, "{dtype:?} copy {so}->{doff} x{len} on {dev}");
                // Within one buffer, overlapping: memmove's result.
                let t = halves_of(dev, dtype, &dst)?;
                dev.backend().copy(t.buffer(), so, t.buffer(), doff, len)?;
                let mut want = dst.clone();
                want.copy_within(so..so + len, doff);
                assert_eq!(t.to_vec()?, want, "{dtype:?} copy within {so}->{doff} x{len} on {dev}");
            }
            let t = halves_of(dev, dtype, &dst)?;
            for (start, len) in [(0, 13), (1, 1), (3, 4), (4, 9), (12, 1), (5, 0)] {
                let bytes = dev.backend().download_range(t.buffer(), start, len)?;
                let bits: Vec<u16> = bytemuck::pod_collect_to_vec(&bytes);
                assert_eq!(bits, t.to_half_bits()?[start..start + len], "{dtype:?} download_range {start} x{len} on {dev}");
            }
            for (start, len) in [(0, 4), (1, 3), (2, 2), (5, 1), (11, 2)] {
                let t = halves_of(dev, dtype, &dst)?;
                let bits = halves_of(dev, dtype, &src[..len])?.to_half_bits()?;
                dev.backend().write_at(t.buffer(), start, bytemuck::cast_slice(&bits))?;
                let mut want = dst.clone();
                want[start..start + len].copy_from_slice(&src[..len]);
                assert_eq!(t.to_vec()?, want, "{dtype:?} write_at {start} x{len} on {dev}");
            }
            let t = halves_of(dev, dtype, &dst)?;
            dev.backend().fill(t.buffer(), -2.5)?;
            assert_eq!(t.to_vec()?, vec![-2.5; 13], "{dtype:?} fill on {dev}");
            // Across devices, both ways.
            let there = halves_of(&Device::cpu(), dtype, &src)?.to(dev)?;
            assert_eq!((there.dtype(), there.to(&Device::cpu())?.to_vec()?), (dtype, src.clone()), "{dtype:?} to {dev} and back");
        }
        Ok(())
    });
}

#[cfg(feature = "wgpu")]
#[test]
fn half_casts_and_copies_split_under_a_small_binding_limit() {
    use tandem::backend::wgpu::{open_with, Options};
    let _guard = shared();
    let mut r = rng(72);
    let n = 5001;
    let x: Vec<f32> = (0..n).map(|_| f32::from_bits(r.random::<u32>())).collect();
    let adapters = Device::list().iter().filter(|i| i.backend == tandem::BackendKind::Wgpu).count();
    assert!(adapters > 0 || std::env::var("CI").is_err(), "CI without a wgpu adapter");
    for i in 0..adapters {
        let dev = Device::from_backend(open_with(i, Options { max_binding_bytes: Some(4096), ..Default::default() }).expect("open_with"));
        for (dtype, to, from) in HALVES {
            let bits = to_bits(&dev, to, &x).unwrap();
            assert_eq!(bits, reference_to(to, &x), "{dtype:?} cast in chunks on {dev}");
            let back = from_bits(&dev, from, &bits).unwrap();
            assert_eq!(back, bits.iter().map(|&h| from.from_half(h).to_bits()).collect::<Vec<_>>(), "{dtype:?} widening in chunks on {dev}");
            let b = dev.backend();
            let (src, dst) = (b.upload(bytemuck::cast_slice(&bits), dtype).unwrap(), b.alloc(n + 3, dtype).unwrap());
            b.fill(&dst, 0.0).unwrap();
            b.copy(&src, 1, &dst, 2, n - 1).unwrap();
            let got: Vec<u16> = bytemuck::pod_collect_to_vec(&b.download(&dst).unwrap());
            let mut want = vec![0u16; n + 3];
            want[2..n + 1].copy_from_slice(&bits[1..]);
            assert_eq!(got, want, "{dtype:?} odd copy in chunks on {dev}");
        }
    }
}

#[test]
fn gradients_flow_back_through_casts_and_add_up_in_f32() {
    let p = |e: i32| 2f32.powi(e);
    on_each_device(|dev, cpu| {
        for d in [dev, cpu] {
            for (dtype, to, from) in HALVES {
                let x = Tensor::from_vec(vec![0.5, -3.0, 7.0], [3], d)?.requires_grad();
                let w = Tensor::from_vec(vec![1.0 + p(-9), 2.0, -0.25], [3], d)?;
                let h = x.to_dtype(dtype)?;
                // `h` feeds two casts back, so its gradient is a sum of two half gradients.
                let y = h.to_dtype(DType::F32)?.mul(&w)?.add(&h.to_dtype(DType::F32)?)?.sum_all()?;
                y.backward()?;
                let round = |v: f32| from.from_half(to.to_half(v));
                let want: Vec<f32> = [1.0 + p(-9), 2.0, -0.25].iter().map(|&w| round(round(w) + 1.0)).collect();
                assert_eq!(x.grad().expect("x.grad").to_vec()?, want, "{dtype:?} on {d}");
                assert_eq!(y.to_scalar()?, 0.5 * (1.0 + p(-9)) - 6.0 - 1.75 + 4.5, "{dtype:?} forward on {d}");
            }
        }
        Ok(())
    });
}

#[test]
fn mixing_widths_and_computing_on_halves_are_clear_errors() {
    let cpu = Device::cpu();
    let h = halves_of(&cpu, DType::Bf16, &[1.0, 2.0, 3.0]).unwrap();
    let err = h.to_dtype(DType::I32).unwrap_err();
    assert!(err.to_string().contains("Bf16 to I32"), "{err}");
    // Tensor ops compute on halves through f32 (tests/half_ops.rs); the backend's arithmetic
    // primitives take F32 only, and say so.
    let out = cpu.backend().alloc(3, DType::F32).unwrap();
    let err = cpu.backend().unary(tandem::backend::UnaryOp::Exp, h.buffer(), &layout(&[3], &[1], 0), &out).unwrap_err();
    assert!(matches!(err, Error::DType { op: "unary", expected: DType::F32, got: DType::Bf16 }), "{err}");
    let f = cpu.backend().alloc(3, DType::F32).unwrap();
    let err = cpu.backend().copy(h.buffer(), 0, &f, 0, 3).unwrap_err();
    assert!(err.to_string().contains("widths differ"), "{err}");
    let err = cpu.backend().upload(&[0, 0, 0], DType::F16).unwrap_err();
    assert!(err.to_string().contains("3 bytes"), "{err}");
    let err = cpu.backend().cast(CastOp::F32ToF16, &f, &cpu.backend().alloc(3, DType::Bf16).unwrap(), 3).unwrap_err();
    assert!(matches!(err, Error::DType { op: "cast", expected: DType::F16, got: DType::Bf16 }), "{err}");
    // A buffer of halves holds two per word: 1001 of them take 501 words.
    let before = cpu.backend().memory().in_use;
    let b = cpu.backend().alloc(1001, DType::F16).unwrap();
    assert_eq!(cpu.backend().memory().in_use - before, 2004);
    assert_eq!(cpu.backend().download(&b).unwrap().len(), 2002);
}
