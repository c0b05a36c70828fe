//! `Tensor::matmul` with PyTorch's rules: 1-D operands promoted and squeezed, batch dimensions
//! broadcast; values against a host reference and the CPU on every device, gradients by finite
//! differences and against the CPU, and which operands are read in place (batch stride 0 or one
//! stacked product) rather than copied.
mod common;
mod fd;
#[path = "common/watched.rs"]
mod watched;
use common::*;
use std::sync::{Arc, Mutex};
use tandem::backend::*;
use tandem::{Device, Error, Result, Tensor};
use watched::{watched_cpu, Call};

/// `torch.matmul` on the host, by its definition.
fn reference(a: &[f32], ad: &[usize], b: &[f32], bd: &[usize]) -> (Vec<f32>, Vec<usize>) {
    let (a2, b2) = (if ad.len() == 1 { vec![1, ad[0]] } else { ad.to_vec() }, if bd.len() == 1 { vec![bd[0], 1] } else { bd.to_vec() });
    let (m, k, n) = (a2[a2.len() - 2], a2[a2.len() - 1], b2[b2.len() - 1]);
    let (ba, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let rank = ba.len().max(bb.len());
    let pad = |d: &[usize]| [vec![1; rank - d.len()], d.to_vec()].concat();
    let (pa, pb) = (pad(ba), pad(bb));
    let batch: Vec<usize> = pa.iter().zip(&pb).map(|(&x, &y)| x.max(y)).collect();
    let total: usize = batch.iter().product();
    let mut out = vec![0.0; total * m * n];
    for z in 0..total {
        // the operands' batch entries: each dimension of size 1 stays at 0
        let (mut za, mut zb, mut rest) = (0, 0, z);
        let (mut sa, mut sb) = (1, 1);
        for d in (0..rank).rev() {
            let i = rest % batch[d];
            rest /= batch[d];
            za += if pa[d] == 1 { 0 } else { i * sa };
            zb += if pb[d] == 1 { 0 } else { i * sb };
            sa *= pa[d];
            sb *= pb[d];
        }
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k).map(|p| a[za * m * k + i * k + p] as f64 * b[zb * k * n + p * n + j] as f64).sum();
                out[z * m * n + i * n + j] = s as f32;
            }
        }
    }
    let mut dims = batch;
    if ad.len() > 1 {
        dims.push(m);
    }
    if bd.len() > 1 {
        dims.push(n);
    }
    (out, dims)
}

const CASES: &[(&[usize], &[usize])] = &[
    (&[3, 4], &[4, 5]),
    (&[4], &[4]),
    (&[4], &[4, 5]),
    (&[3, 4], &[4]),
    (&[2, 3, 4], &[4]),
    (&[4], &[2, 4, 5]),
    (&[2, 3, 4], &[4, 5]),
    (&[3, 4], &[2, 4, 5]),
    (&[2, 3, 4, 5], &[2, 3, 5, 6]),
    (&[2, 1, 3, 4], &[5, 4, 6]),
    (&[1, 3, 4], &[2, 4, 5]),
    (&[2, 3, 4], &[1, 1, 4, 5]),
    (&[2, 2, 3, 4], &[2, 1, 4, 5]),
];

#[test]
fn matmul_hand_values() {
    let dev = Device::cpu();
    // one row times a batch of two columns: [1, 2]·[3, 4]ᵀ = 11, [1, 2]·[5, 6]ᵀ = 17
    let a = Tensor::from_vec(vec![1.0, 2.0], [1, 2], &dev).unwrap();
    let b = Tensor::from_vec(vec![3.0, 4.0, 5.0, 6.0], [2, 2, 1], &dev).unwrap();
    let y = a.matmul(&b).unwrap();
    assert_eq!((y.dims(), y.to_vec().unwrap()), (&[2usize, 1, 1][..], vec![11.0, 17.0]));
    // a dot product is a scalar; a matrix times a vector is a vector
    let v = Tensor::from_vec(vec![1.0, 2.0], [2], &dev).unwrap();
    let dot = v.matmul(&v).unwrap();
    assert_eq!((dot.dims(), dot.to_vec().unwrap()), (&[][..], vec![5.0]));
    let m = Tensor::from_vec(vec![1.0, 0.0, 2.0, 3.0], [2, 2], &dev).unwrap();
    assert_eq!(m.matmul(&v).unwrap().to_vec().unwrap(), [1.0, 8.0]);
    assert_eq!(v.matmul(&m).unwrap().to_vec().unwrap(), [5.0, 6.0]);
    // an empty inner dimension sums nothing
    let e = Tensor::zeros([2, 3, 0], &dev).unwrap().matmul(&Tensor::zeros([0, 5], &dev).unwrap()).unwrap();
    assert_eq!((e.dims(), e.to_vec().unwrap()), (&[2usize, 3, 5][..], vec![0.0; 30]));
}

#[test]
fn matmul_broadcasts_as_torch_on_every_device() {
    on_each_device(|dev, cpu| {
        for (i, (ad, bd)) in CASES.iter().enumerate() {
            let mut r = rng(i as u64);
            let (a, b) = (uniform(&mut r, ad.iter().product(), -1.0, 1.0), uniform(&mut r, bd.iter().product(), -1.0, 1.0));
            let (want, dims) = reference(&a, ad, &b, bd);
            for d in [dev, cpu] {
                let y = Tensor::from_vec(a.clone(), ad.to_vec(), d)?.matmul(&Tensor::from_vec(b.clone(), bd.to_vec(), d)?)?;
                assert_eq!(y.dims(), dims, "{ad:?}·{bd:?}");
                assert_close(&format!("matmul {ad:?}·{bd:?} on {d}"), &y.to_vec()?, &want, 1e-5, 1e-5);
            }
        }
        Ok(())
    });
}

#[test]
fn matmul_batches_past_65535_on_every_device() {
    // 70,000 batch entries: one shared matrix (stride 0) and a plain batch
    let cases: [(&[usize], &[usize]); 2] = [(&[2, 3], &[70_000, 3, 2]), (&[70_000, 1, 3], &[70_000, 3, 1])];
    on_each_device(|dev, cpu| {
        for (ad, bd) in cases {
            let mut r = rng(7);
            let (a, b) = (uniform(&mut r, ad.iter().product(), -1.0, 1.0), uniform(&mut r, bd.iter().product(), -1.0, 1.0));
            same_f32(dev, cpu, &format!("matmul {ad:?}·{bd:?}"), 1e-5, 1e-5, |d| {
                Tensor::from_vec(a.clone(), ad.to_vec(), d)?.matmul(&Tensor::from_vec(b.clone(), bd.to_vec(), d)?)?.to_vec()
            })?;
        }
        Ok(())
    });
}

#[test]
fn matmul_gradients_match_finite_differences() {
    for (ad, bd) in CASES {
        fd::gradcheck(&format!("matmul {ad:?}·{bd:?}"), &[ad, bd], -1.0, 1.0, &|x| x[0].matmul(&x[1]));
    }
    // transposed operands with broadcast batches
    fd::gradcheck("matmul_t", &[&[2, 1, 4, 3], &[5, 6, 4]], -1.0, 1.0, &|x| x[0].matmul_t(&x[1], true, true));
}

#[test]
fn matmul_gradients_on_every_device() {
    on_each_device(|dev, cpu| {
        for (i, (ad, bd)) in CASES.iter().enumerate() {
            let mut r = rng(100 + i as u64);
            let (a, b) = (uniform(&mut r, ad.iter().product(), -1.0, 1.0), uniform(&mut r, bd.iter().product(), -1.0, 1.0));
            let run = |d: &Device| -> Result<Vec<f32>> {
                let ta = Tensor::from_vec(a.clone(), ad.to_vec(), d)?.requires_grad();
                let tb = Tensor::from_vec(b.clone(), bd.to_vec(), d)?.requires_grad();
                ta.matmul(&tb)?.square()?.sum_all()?.backward()?;
                Ok([ta.grad().expect("da").to_vec()?, tb.grad().expect("db").to_vec()?].concat())
            };
            assert_close(&format!("matmul gradients {ad:?}·{bd:?}"), &run(dev)?, &run(cpu)?, 1e-4, 1e-4);
        }
        Ok(())
    });
}

#[test]
fn matmul_errors_name_the_shapes() {
    let dev = Device::cpu();
    let t = |d: &[usize]| Tensor::zeros(d.to_vec(), &dev).unwrap();
    for (ad, bd) in [(&[2, 3, 4][..], &[3, 4, 5][..]), (&[3, 4], &[5, 6]), (&[4], &[5]), (&[], &[4])] {
        match t(ad).matmul(&t(bd)) {
            Err(Error::Shape { op: "matmul", detail }) => assert!(detail.contains(&format!("{ad:?}")) || ad.is_empty(), "{detail}"),
            other => panic!("{ad:?}·{bd:?}: expected a shape error, got {other:?}"),
        }
    }
    let labels = Tensor::from_labels(vec![1, 2], [1, 2], &dev).unwrap();
    assert!(matches!(labels.matmul(&t(&[2, 1])), Err(Error::DType { op: "matmul", .. })));
}

#[test]
fn whole_operand_broadcasts_are_read_in_place() {
    // Every matmul spec, and every strided copy (`unary` Identity).
    let (specs, copies) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(0usize)));
    let (s, c) = (specs.clone(), copies.clone());
    let dev = watched_cpu(
        |_| {},
        move |call| match call {
            Call::Matmul(spec) => s.lock().unwrap().push(spec),
            Call::Unary(op) => *c.lock().unwrap() += usize::from(op == UnaryOp::Identity),
            Call::Upload(_) => {}
        },
    );
    let run = |ad: &[usize], bd: &[usize]| -> (Vec<(usize, usize, usize, usize)>, usize) {
        specs.lock().unwrap().clear();
        *copies.lock().unwrap() = 0;
        Tensor::zeros(ad.to_vec(), &dev).unwrap().matmul(&Tensor::zeros(bd.to_vec(), &dev).unwrap()).unwrap();
        let seen = specs.lock().unwrap().iter().map(|s| (s.batch, s.m, s.a_batch_stride, s.b_batch_stride)).collect();
        (seen, *copies.lock().unwrap())
    };
    // [B,T,C]·[C,N]: one product of B·T rows
    assert_eq!(run(&[2, 3, 4], &[4, 5]), (vec![(1, 6, 0, 0)], 0));
    // one matrix against a batch: stride 0, no copy
    assert_eq!(run(&[3, 4], &[2, 2, 4, 5]), (vec![(4, 3, 0, 20)], 0));
    assert_eq!(run(&[1, 3, 4], &[2, 4, 5]), (vec![(2, 3, 0, 20)], 0));
    // equal batches: plain strides
    assert_eq!(run(&[2, 3, 3, 4], &[2, 3, 4, 5]), (vec![(6, 3, 12, 20)], 0));
    // [2,1]·[5] batches: both copied out to [2,5]
    assert_eq!(run(&[2, 1, 3, 4], &[5, 4, 6]), (vec![(10, 3, 12, 24)], 2));
    // [2,2]·[2,1]: only the second is copied
    assert_eq!(run(&[2, 2, 3, 4], &[2, 1, 4, 5]), (vec![(4, 3, 12, 20)], 1));
}
