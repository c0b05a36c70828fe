//! Products of Bf16 and F16 tensors on the CPU read their halves directly: on shapes past the
//! kernel's output tiles and the `gemm` crate's blocking, in every transposition and with a
//! batch, the product and its gradients are the f32 product of the widened operands rounded
//! once (within a half ulp where f32 sums in another order round the other way); a NaN reaches
//! every output it takes part in; and the product allocates only its half output (no f32
//! copies of its operands, as the cast composition made).
mod common;
use common::*;
use tandem::{DType, Device, Result, Tensor};

/// `(dtype, relative tolerance)`: one ulp of each half type's 8 and 11 significant bits.
const HALVES: [(DType, f32); 2] = [(DType::Bf16, 1.0 / 128.0), (DType::F16, 1.0 / 1024.0)];

/// `[batch.., rows, cols]` of random values in [-2, 2], rounded to `dtype`, needing a gradient.
fn operand(dev: &Device, dims: &[usize], dtype: DType, seed: u64) -> Result<Tensor> {
    let v = uniform(&mut rng(seed), dims.iter().product(), -2.0, 2.0);
    Ok(Tensor::from_vec(v, dims.to_vec(), dev)?.to_dtype(dtype)?.detach().requires_grad())
}

/// A product's type and values (as f32), and each operand's gradient's.
type Outputs = (DType, Vec<f32>, Vec<(DType, Vec<f32>)>);

/// The product, and the gradients of both operands for the upstream gradient `g`, as f32.
fn product(a: &Tensor, b: &Tensor, ta: bool, tb: bool, g: &[f32]) -> Result<Outputs> {
    let y = a.matmul_t(b, ta, tb)?;
    let gt = Tensor::from_vec(g.to_vec(), y.dims().to_vec(), y.device())?;
    y.to_dtype(DType::F32)?.mul(&gt)?.sum_all()?.backward()?;
    let grads = [a, b].iter().map(|t| t.grad().map(|g| (g.dtype(), g.to_vec().unwrap())).expect("a gradient")).collect();
    Ok((y.dtype(), y.to_vec()?, grads))
}

fn round(v: &[f32], dtype: DType, dev: &Device) -> Result<Vec<f32>> {
    Tensor::from_vec(v.to_vec(), [v.len()], dev)?.to_dtype(dtype)?.to_vec()
}

/// 131 × 301 · 301 × 259 (and a batch of 2 with m = 67): past the 64 × 128 output tiles, the
/// `gemm` crate's register blocks and its k blocking, none a multiple of either.
#[test]
fn half_products_past_the_blocking_are_the_f32_product_rounded_once() -> Result<()> {
    let dev = Device::cpu();
    let cases: [(&[usize], usize, usize, usize); 2] = [(&[], 131, 259, 301), (&[2], 67, 259, 301)];
    for (seed, (&(batch, m, n, k), (dtype, ulp))) in cases.iter().flat_map(|c| HALVES.iter().map(move |h| (c, *h))).enumerate() {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            let dims = |r: usize, c: usize, t: bool| [batch, &if t { [c, r] } else { [r, c] }].concat();
            let (a_dims, b_dims) = (dims(m, k, ta), dims(k, n, tb));
            let outputs = batch.iter().product::<usize>() * m * n;
            let g: Vec<f32> = (0..outputs).map(|i| ((i % 7) as f32 - 3.0) * 0.25).collect();
            let seed = seed as u64 * 8;
            let (a, b) = (operand(&dev, &a_dims, dtype, seed)?, operand(&dev, &b_dims, dtype, seed + 1)?);
            let (ydt, y, grads) = product(&a, &b, ta, tb, &g)?;
            let wide = |t: &Tensor| t.to_dtype(DType::F32).map(|t| t.detach().requires_grad());
            let (_, want_y, want_grads) = product(&wide(&a)?, &wide(&b)?, ta, tb, &g)?;
            let name = format!("{dtype:?} {batch:?}{m}x{k}{} · {k}x{n}{}", if ta { "ᵀ" } else { "" }, if tb { "ᵀ" } else { "" });
            assert_eq!(ydt, dtype, "{name}: the product's dtype");
            // f32 sums of up to 301 terms of at most 4 differ by a few of their ulps with the
            // order: 1e-3 absolute covers that next to a near-zero output.
            assert_close(&name, &y, &round(&want_y, dtype, &dev)?, 1e-3, ulp);
            for (i, ((gdt, got), want)) in grads.iter().zip(&want_grads).enumerate() {
                assert_eq!(*gdt, dtype, "{name}: gradient {i}'s dtype");
                assert_close(&format!("{name} gradient {i}"), got, &round(&want.1, dtype, &dev)?, 1e-3, ulp);
            }
        }
    }
    Ok(())
}

/// A NaN in row 3 of A gives NaN in all of output row 3 and nowhere else; an infinity in a
/// column of B gives ±inf or NaN in that column only.
#[test]
fn a_nan_in_a_half_operand_reaches_every_output_it_takes_part_in() {
    let dev = Device::cpu();
    let (m, n, k) = (70, 130, 33);
    for (dtype, _) in HALVES {
        let mut av = uniform(&mut rng(1), m * k, -1.0, 1.0);
        av[3 * k + 5] = f32::NAN;
        let mut bv = uniform(&mut rng(2), k * n, -1.0, 1.0);
        bv[7 * n + 129] = f32::INFINITY;
        let a = Tensor::from_vec(av, [m, k], &dev).unwrap().to_dtype(dtype).unwrap();
        let b = Tensor::from_vec(bv, [k, n], &dev).unwrap().to_dtype(dtype).unwrap();
        let y = a.matmul(&b).unwrap().to_vec().unwrap();
        for (i, row) in y.chunks(n).enumerate() {
            for (j, &v) in row.iter().enumerate() {
                match (i, j) {
                    (3, _) => assert!(v.is_nan(), "{dtype:?} output ({i}, {j}) = {v}, want NaN"),
                    (_, 129) => assert!(!v.is_finite(), "{dtype:?} output ({i}, {j}) = {v}, want ±inf or NaN"),
                    _ => assert!(v.is_finite(), "{dtype:?} output ({i}, {j}) = {v}, want a number"),
                }
            }
        }
    }
}

/// The product of two halves allocates its half output and nothing else on the device; the
/// composition (cast both operands to F32, multiply, cast back) also allocated 4 bytes per
/// element of each operand and of the output.
#[test]
fn a_half_product_allocates_only_its_half_output() {
    // A device of its own: the other tests allocate on the shared one meanwhile.
    let dev = Device::cpu_independent();
    let (m, n, k) = (96, 200, 150);
    for (dtype, _) in HALVES {
        let a = Tensor::from_vec(uniform(&mut rng(3), m * k, -1.0, 1.0), [m, k], &dev).unwrap().to_dtype(dtype).unwrap();
        let b = Tensor::from_vec(uniform(&mut rng(4), k * n, -1.0, 1.0), [n, k], &dev).unwrap().to_dtype(dtype).unwrap();
        dev.reset_peak_memory();
        let before = dev.memory();
        let y = a.matmul_t(&b, false, true).unwrap();
        let grew = dev.memory().peak - before.in_use;
        assert_eq!(y.dtype(), dtype);
        assert_eq!(grew, (m * n * 2) as u64, "{dtype:?}: the product allocated {grew} bytes at its peak, its output is {}", m * n * 2);
    }
}

/// The exact bits of `op` on f32 copies of `inputs`, rounded to `dtype` (or left F32).
fn widened_then_rounded(op: impl Fn(&[Tensor]) -> Result<Tensor>, inputs: &[Tensor], dtype: DType) -> Result<Vec<u32>> {
    let wide: Vec<Tensor> = inputs.iter().map(|t| t.to_dtype(DType::F32)).collect::<Result<_>>()?;
    Ok(op(&wide)?.to_dtype(dtype)?.to_dtype(DType::F32)?.to_vec()?.iter().map(|v| v.to_bits()).collect())
}

/// Elementwise ops of halves on the CPU (a sum with a bias row, a product, a difference with
/// one value, a sum with an F32 tensor, tanh) over 300 rows of 257, long enough to split over
/// threads: the f32 op's bits rounded once, and only the output allocated (the composition
/// also made an F32 copy of each half operand and an F32 result).
#[test]
fn elementwise_ops_on_halves_read_them_directly() {
    let dev = Device::cpu_independent();
    let (rows, width) = (300, 257);
    type Op = fn(&[Tensor]) -> Result<Tensor>;
    let ops: [(&str, Op); 5] = [
        ("x + bias", |t| t[0].add(&t[1])),
        ("x * y", |t| t[0].mul(&t[2])),
        ("x - scalar", |t| t[0].sub(&t[3])),
        ("x + f32", |t| t[0].add(&t[4])),
        ("tanh x", |t| t[0].tanh()),
    ];
    for (dtype, _) in HALVES {
        let half = |n: usize, dims: Vec<usize>, seed: u64| Tensor::from_vec(uniform(&mut rng(seed), n, -3.0, 3.0), dims, &dev)?.to_dtype(dtype);
        let inputs = vec![
            half(rows * width, vec![rows, width], 1).unwrap(),
            half(width, vec![width], 2).unwrap(),
            half(rows * width, vec![rows, width], 3).unwrap(),
            half(1, vec![1], 4).unwrap(),
            Tensor::from_vec(uniform(&mut rng(5), rows * width, -3.0, 3.0), [rows, width], &dev).unwrap(),
        ];
        for (name, op) in ops {
            let out_dtype = if name == "x + f32" { DType::F32 } else { dtype };
            let want = widened_then_rounded(op, &inputs, out_dtype).unwrap();
            dev.reset_peak_memory();
            let before = dev.memory();
            let y = op(&inputs).unwrap();
            let grew = dev.memory().peak - before.in_use;
            assert_eq!(y.dtype(), out_dtype, "{dtype:?} {name}: the result's dtype");
            let got: Vec<u32> = y.to_dtype(DType::F32).unwrap().to_vec().unwrap().iter().map(|v| v.to_bits()).collect();
            assert!(got == want, "{dtype:?} {name}: not the f32 op's bits rounded once");
            let bytes = (rows * width * out_dtype.size()) as u64;
            assert_eq!(grew, bytes, "{dtype:?} {name}: allocated {grew} bytes at its peak, its output is {bytes}");
        }
    }
}

/// The gradients of a half product are products of halves too: the backward allocates the
/// half gradients of both operands and the upstream gradient (F32 ones and their half copy),
/// no F32 copies of the operands (4 bytes per element each, and their F32 gradients), as the
/// cast composition did. 32 × 300 · 300 × 16: the operands dominate.
#[test]
fn the_backward_of_a_half_product_reads_its_halves_directly() {
    let dev = Device::cpu_independent();
    let (m, n, k) = (32, 16, 300);
    for (dtype, _) in HALVES {
        let a = operand(&dev, &[m, k], dtype, 1).unwrap();
        let b = operand(&dev, &[k, n], dtype, 2).unwrap();
        let y = a.matmul(&b).unwrap().to_dtype(DType::F32).unwrap().sum_all().unwrap();
        dev.reset_peak_memory();
        let before = dev.memory();
        y.backward().unwrap();
        let grew = dev.memory().peak - before.in_use;
        assert_eq!((a.grad().unwrap().dtype(), b.grad().unwrap().dtype()), (dtype, dtype));
        // Upstream 4mn + 2mn, gradients 2mk + 2kn; one more byte per operand element of slack.
        let bound = (6 * m * n + 3 * (m * k + k * n)) as u64;
        assert!(grew <= bound, "{dtype:?}: the backward allocated {grew} bytes at its peak, over {bound}");
    }
}

/// The causal softmax over 12 matrices of 40 × 40 and the tanh GELU over 300 rows of 257 on
/// halves, each longer than one task of the kernels that read halves: the forward is the f32
/// kernel's bits rounded once and allocates only its half output; the gradient is the f32 op's
/// within a few half ulps and the backward allocates the upstream gradient (F32 and its half
/// copy) and the half gradient, no F32 copies of the output, the input or the gradients (the
/// composition also made two of 4 bytes per element and an F32 gradient).
#[test]
fn the_causal_softmax_and_gelu_read_halves_directly() {
    let dev = Device::cpu_independent();
    type Op = fn(&Tensor) -> Result<Tensor>;
    let ops: [(&str, Op, Vec<usize>); 2] =
        [("causal_softmax", |x| x.causal_softmax(0.3), vec![12, 40, 40]), ("gelu_tanh", |x| x.gelu_tanh(), vec![300, 257])];
    for (dtype, tol) in HALVES {
        for (name, op, dims) in &ops {
            let n: usize = dims.iter().product();
            let x = Tensor::from_vec(uniform(&mut rng(7), n, -4.0, 4.0), dims.clone(), &dev).unwrap().to_dtype(dtype).unwrap();
            let want = widened_then_rounded(|t| op(&t[0]), std::slice::from_ref(&x), dtype).unwrap();
            let x = x.detach().requires_grad();
            dev.reset_peak_memory();
            let before = dev.memory();
            let y = op(&x).unwrap();
            let grew = dev.memory().peak - before.in_use;
            assert_eq!(y.dtype(), dtype, "{dtype:?} {name}: the result's dtype");
            let got: Vec<u32> = y.to_dtype(DType::F32).unwrap().to_vec().unwrap().iter().map(|v| v.to_bits()).collect();
            assert!(got == want, "{dtype:?} {name}: not the f32 kernel's bits rounded once");
            assert_eq!(grew, (n * 2) as u64, "{dtype:?} {name}: allocated {grew} bytes at its peak, its output is {}", n * 2);

            let g = Tensor::from_vec(uniform(&mut rng(8), n, -1.0, 1.0), dims.clone(), &dev).unwrap();
            let loss = y.to_dtype(DType::F32).unwrap().mul(&g).unwrap().sum_all().unwrap();
            dev.reset_peak_memory();
            let before = dev.memory();
            loss.backward().unwrap();
            let grew = dev.memory().peak - before.in_use;
            let dx = x.grad().expect("a gradient");
            assert_eq!(dx.dtype(), dtype, "{dtype:?} {name}: the gradient's dtype");
            // Upstream 8n (the F32 ones of the sum and their product with g) + 2n (its half
            // copy), the gradient 2n, one byte per element of slack; the composition also
            // widened the output or input and the gradient and computed an F32 gradient (12n).
            let bound = (13 * n) as u64;
            assert!(grew <= bound, "{dtype:?} {name}: the backward allocated {grew} bytes at its peak, over {bound}");

            let x32 = x.to_dtype(DType::F32).unwrap().detach().requires_grad();
            op(&x32).unwrap().mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
            let want = x32.grad().unwrap().to_vec().unwrap();
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert_close(&format!("{dtype:?} {name} gradient"), &dx.to_vec().unwrap(), &want, 4.0 * tol * scale, 4.0 * tol);
        }
    }
}
