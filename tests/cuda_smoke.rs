//! CUDA smoke tests against the CPU reference: matmul with transposes, im2col/col2im, reductions,
//! pooling, optimizer steps, the allocator, released buffers (ZeRO-3) and peer copies. Without a CUDA device each test prints
//! "skipped: no CUDA device (reason)" and passes; the no-driver behaviour itself is checked.
#![cfg(feature = "cuda")]
mod common;

use std::sync::Arc;
use tandem::backend::cpu::CpuBackend;
use tandem::backend::{cuda, Backend, BinaryOp, IndexOp, MatmulSpec, OptimStep, ReduceOp, ReduceSpec, UnaryOp, WindowSpec};
use tandem::{DType, Error, Layout, Result, Shape};

/// The first CUDA device, or `None` after printing why there is none.
fn device(test: &str) -> Option<Arc<dyn Backend>> {
    let reason = match cuda::probe() {
        Ok(0) => "the driver reports 0 devices".to_string(),
        Ok(_) => match cuda::open(0) {
            Ok(dev) => return Some(dev),
            Err(e) => panic!("{test}: a CUDA device exists but does not open: {e}"),
        },
        Err(e) => e.to_string(),
    };
    println!("{test}: skipped: no CUDA device ({reason})");
    None
}

/// Deterministic values in [-1, 1).
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(dev: &dyn Backend, b: &tandem::backend::Buffer) -> Result<Vec<f32>> {
    Ok(dev.download(b)?.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

fn ints(dev: &dyn Backend, b: &tandem::backend::Buffer) -> Result<Vec<i32>> {
    Ok(dev.download(b)?.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// Runs `f` on the CUDA device and on the CPU reference with the same f32 inputs, comparing the
/// output buffer of `out_len` elements.
fn compare(
    what: &str,
    gpu: &dyn Backend,
    inputs: &[Vec<f32>],
    out_len: usize,
    f: impl Fn(&dyn Backend, &[tandem::backend::Buffer], &tandem::backend::Buffer) -> Result<()>,
) -> Result<()> {
    let cpu = CpuBackend::new();
    let mut results = Vec::new();
    for dev in [gpu, &cpu as &dyn Backend] {
        let ins = inputs.iter().map(|v| dev.upload(&bytes(v), DType::F32)).collect::<Result<Vec<_>>>()?;
        let out = dev.alloc(out_len, DType::F32)?;
        f(dev, &ins, &out)?;
        results.push(floats(dev, &out)?);
    }
    tandem::tolerance::assert_close(what, &results[0], &results[1], 1e-4, 1e-4);
    Ok(())
}

#[test]
fn no_driver_is_an_error_not_a_panic() {
    if cuda::probe().is_ok() {
        return;
    }
    assert!(cuda::devices().is_empty());
    assert!(cuda::peer_matrix().is_empty());
    match cuda::open(0) {
        Err(Error::Unavailable { backend: "cuda", reason }) => println!("skipped: no CUDA device ({reason})"),
        Err(e) => panic!("expected Error::Unavailable, got {e}"),
        Ok(_) => panic!("opened a CUDA device although probing failed"),
    }
}

#[test]
fn matmul_transposes_batches_and_offsets() -> Result<()> {
    let Some(gpu) = device("matmul") else { return Ok(()) };
    let (batch, m, n, k) = (3, 5, 7, 4);
    for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
        let a_off = 2;
        let spec = MatmulSpec {
            trans_a,
            trans_b,
            a_offset: a_off,
            // B is shared by every batch entry (stride 0).
            b_batch_stride: 0,
            ..MatmulSpec::new(batch, m, n, k)
        };
        let inputs = [data(a_off + batch * m * k, 1), data(k * n, 2)];
        compare(&format!("matmul ta={trans_a} tb={trans_b}"), &*gpu, &inputs, batch * m * n, |d, i, o| d.matmul(&i[0], &i[1], o, spec))?;
    }
    Ok(())
}

#[test]
fn im2col_and_col2im() -> Result<()> {
    let Some(gpu) = device("im2col") else { return Ok(()) };
    let spec = WindowSpec::new("im2col", [2, 3, 7, 6], (3, 2), (2, 1), (1, 1))?;
    let x_len = 2 * 3 * 7 * 6;
    let cols_len = spec.n * spec.col_rows() * spec.col_len();
    compare("im2col", &*gpu, &[data(x_len, 3)], cols_len, |d, i, o| d.im2col(&i[0], o, spec))?;
    compare("col2im", &*gpu, &[data(cols_len, 4)], x_len, |d, i, o| d.col2im(&i[0], o, spec))
}

#[test]
fn reductions_rows_and_columns() -> Result<()> {
    let Some(gpu) = device("reduce") else { return Ok(()) };
    let cpu = CpuBackend::new();
    for spec in [ReduceSpec { outer: 5, len: 1000, inner: 1 }, ReduceSpec { outer: 3, len: 17, inner: 9 }, ReduceSpec { outer: 2, len: 0, inner: 1 }]
    {
        let x = data(spec.outer * spec.len * spec.inner, 5);
        for op in ReduceOp::ALL {
            let dtype = if op == ReduceOp::ArgMax { DType::I32 } else { DType::F32 };
            let run = |d: &dyn Backend| -> Result<tandem::backend::Buffer> {
                let xb = d.upload(&bytes(&x), DType::F32)?;
                let out = d.alloc(spec.outer * spec.inner, dtype)?;
                d.reduce(op, &xb, spec, &out)?;
                Ok(out)
            };
            let (g, c) = (run(&*gpu)?, run(&cpu)?);
            if op == ReduceOp::ArgMax {
                assert_eq!(ints(&*gpu, &g)?, ints(&cpu, &c)?, "argmax {spec:?}");
            } else {
                tandem::tolerance::assert_close(&format!("{op:?} {spec:?}"), &floats(&*gpu, &g)?, &floats(&cpu, &c)?, 1e-4, 1e-4);
            }
        }
    }
    Ok(())
}

#[test]
fn strided_elementwise_pool_index_and_optim() -> Result<()> {
    let Some(gpu) = device("elementwise") else { return Ok(()) };
    // A [4, 3] transposed view of a [3, 4] buffer, and a row vector broadcast over it.
    let la = Layout { shape: vec![4, 3], strides: vec![1, 4], offset: 0 };
    let lb = Layout::broadcast_to(&Shape::new([3]), &Shape::new([4, 3]));
    for op in UnaryOp::ALL {
        compare(&format!("{op:?}"), &*gpu, &[data(12, 6).iter().map(|v| v.abs() + 0.1).collect()], 12, |d, i, o| d.unary(op, &i[0], &la, o))?;
    }
    for op in BinaryOp::ALL {
        compare(&format!("{op:?}"), &*gpu, &[data(12, 7), data(3, 8)], 12, |d, i, o| d.binary(op, &i[0], &la, &i[1], &lb, o))?;
    }
    let spec = WindowSpec::new("max_pool2d", [2, 2, 5, 5], (2, 2), (2, 2), (1, 1))?;
    let outs = 2 * 2 * spec.oh * spec.ow;
    compare("max_pool2d", &*gpu, &[data(100, 9)], outs, |d, i, o| {
        let arg = d.alloc(outs, DType::I32)?;
        d.max_pool2d(&i[0], o, &arg, spec)
    })?;
    compare("max_pool2d_backward", &*gpu, &[data(100, 9), data(outs, 10)], 100, |d, i, o| {
        let (y, arg) = (d.alloc(outs, DType::F32)?, d.alloc(outs, DType::I32)?);
        d.max_pool2d(&i[0], &y, &arg, spec)?;
        d.max_pool2d_backward(&i[1], &arg, o, spec)
    })?;
    let labels: Vec<u8> = [2i32, -1, 0, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
    for op in [IndexOp::Gather, IndexOp::Scatter] {
        let out_len = if op == IndexOp::Gather { 4 } else { 12 };
        compare(&format!("{op:?}"), &*gpu, &[data(12, 11)], out_len, |d, i, o| {
            let idx = d.upload(&labels, DType::I32)?;
            d.index(op, &i[0], &idx, o, 4, 3)
        })?;
    }
    let steps = [
        OptimStep::Sgd { lr: 0.1, momentum: 0.9, dampening: 0.1, nesterov: true, weight_decay: 0.01, first: false },
        OptimStep::Adam { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.1, decoupled: true, step: 3 },
    ];
    for step in steps {
        let (p, g, m, v) = (data(33, 12), data(33, 13), data(33, 14), data(33, 15).iter().map(|x| x.abs()).collect::<Vec<_>>());
        let gpu_p = gpu.upload(&bytes(&p), DType::F32)?;
        let state = [gpu.upload(&bytes(&m), DType::F32)?, gpu.upload(&bytes(&v), DType::F32)?];
        assert!(gpu.optim_step(step, &gpu_p, &gpu.upload(&bytes(&g), DType::F32)?, &[&state[0], &state[1]])?);
        let (mut want, mut m, mut v) = (p.clone(), m.clone(), v.clone());
        common::host_step(step, &mut want, &g, &mut m, &mut v);
        tandem::tolerance::assert_close(&format!("{step:?}"), &floats(&*gpu, &gpu_p)?, &want, 1e-4, 1e-4);
    }
    Ok(())
}

#[test]
fn allocator_reuses_freed_buffers() -> Result<()> {
    let Some(gpu) = device("allocator") else { return Ok(()) };
    let first = gpu.alloc(1000, DType::F32)?;
    drop(first);
    let pooled = gpu.memory().pooled;
    assert!(pooled >= 4000, "a dropped buffer returns to the pool");
    let _again = gpu.alloc(1000, DType::F32)?;
    assert_eq!(gpu.memory().pooled, pooled - 4096, "the same size class is reused");
    assert!(gpu.memory().peak >= 4000);
    Ok(())
}

#[test]
fn peer_copies() -> Result<()> {
    let Some(first) = device("peer") else { return Ok(()) };
    let n = cuda::probe()?;
    // Two logical devices on one GPU always have a direct path; distinct GPUs when the driver allows.
    let mut pairs = vec![(first.clone(), cuda::open(0)?)];
    if n >= 2 {
        pairs.push((first.clone(), cuda::open(1)?));
        println!("peer matrix: {:?}", cuda::peer_matrix());
    } else {
        println!("peer copies between GPUs: skipped: one CUDA device");
    }
    let v = data(100_003, 16);
    for (src_dev, dst_dev) in pairs {
        let src = src_dev.upload(&bytes(&v), DType::F32)?;
        let path = dst_dev.has_peer_path(&*src_dev);
        match dst_dev.copy_from_peer(&*src_dev, &src)? {
            Some(copy) => {
                assert!(path);
                assert_eq!(floats(&*dst_dev, &copy)?, v);
            }
            None => assert!(!path, "has_peer_path promised a direct copy"),
        }
    }
    Ok(())
}

/// `Backend::release` gives a buffer's memory back to the pool while its handle lives (ZeRO-3
/// between uses of a parameter): an op on it is then a clear error, and `restore` gives it
/// memory again.
#[test]
fn release_and_restore() -> Result<()> {
    let Some(gpu) = device("release") else { return Ok(()) };
    let v = data(300_001, 21);
    let b = gpu.upload(&bytes(&v), DType::F32)?;
    let held = gpu.memory().in_use;
    assert!(gpu.release(&b)?, "CUDA releases memory");
    assert!(gpu.release(&b)?, "releasing twice does nothing");
    assert!(gpu.memory().in_use + 4 * 300_001 <= held, "released bytes leave in_use: {held} -> {}", gpu.memory().in_use);
    let err = gpu.download(&b).unwrap_err().to_string();
    assert!(err.contains("released") && err.contains("cuda:0"), "{err}");
    // The freed block is what the next allocation of its class gets.
    let other = gpu.alloc(300_001, DType::F32)?;
    gpu.fill(&other, 0.0)?;
    assert!(gpu.restore(&b)?);
    // 1,200,004 bytes take a 2 MiB block: `other` holds the released one, `b` a new one.
    assert_eq!(gpu.memory().in_use, held + (2 << 20), "restored into a block of its own");
    gpu.write_at(&b, 0, &bytes(&v))?;
    assert_eq!(floats(&*gpu, &b)?, v);
    assert_eq!(floats(&*gpu, &other)?, vec![0.0; 300_001], "the other buffer is untouched");
    Ok(())
}

/// ZeRO-3 on two logical CUDA devices (replicas built deferred: released buffers filled from the
/// host) trains as plain data parallelism does, and frees the parameters' memory between
/// steps; with bf16 gradient shards within their rounding.
#[test]
fn zero3_frees_parameters_and_matches_plain() -> Result<()> {
    use tandem::nn::{Linear, ReLU, Sequential};
    use tandem::optim::AdamConfig;
    use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Shard, Strategy};
    if device("zero3").is_none() {
        return Ok(());
    }
    let mlp = |dev: &tandem::Device| -> Result<Sequential> {
        let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(3);
        let mut m = Sequential::new();
        for (i, w) in [64, 512, 512, 1].windows(2).enumerate() {
            if i > 0 {
                m = m.push(format!("relu{i}"), ReLU);
            }
            m = m.push(format!("fc{i}"), Linear::new(w[0], w[1], &mut rng, dev)?);
        }
        Ok(m)
    };
    let ds = tandem::data::synthetic::regression(16 * 4, 64, 5)?;
    let batches: Vec<_> = (0..4).map(|s| ds.batch(&(s * 16..(s + 1) * 16).collect::<Vec<_>>())).collect::<Result<_>>()?;
    let opt = OptimConfig::adam(AdamConfig { lr: 2e-3, ..Default::default() });
    let mut runs = Vec::new();
    for (shard, grad_dtype) in [(Shard::None, tandem::DType::F32), (Shard::Full, tandem::DType::F32), (Shard::Full, tandem::DType::Bf16)] {
        let devices = vec![tandem::Device::from_backend(cuda::open(0)?), tandem::Device::from_backend(cuda::open(0)?)];
        // 64 KiB buckets: a unit per layer, each gathered by the CUDA ops that find it released.
        let mut s = DataParallel::from_factory(
            mlp,
            &devices,
            &opt,
            Loss::Mse,
            DataParallelConfig { shard, bucket_bytes: 64 << 10, grad_dtype, ..Default::default() },
        )?;
        let losses: Vec<f32> = batches.iter().map(|b| s.step(b).map(|r| r.loss)).collect::<Result<_>>()?;
        let held = devices.iter().map(|d| d.memory().in_use).max().unwrap_or(0);
        if shard == Shard::Full {
            let g = s.last_gathers().expect("ZeRO-3 gathered unit by unit");
            println!("ZeRO-3 on CUDA, {} units: {g:?}", s.buckets().len());
            assert!(g.per_device.iter().all(|d| d.gathers >= s.buckets().len() && d.prefetched > 0), "{g:?}");
            match s.replica_parameters()[1][0].1.to_vec() {
                Ok(_) => panic!("a ZeRO-3 parameter was readable between steps: its memory was kept"),
                Err(e) => assert!(e.to_string().contains("released"), "{e}"),
            }
        }
        let weights: Vec<f32> = s.state_dict()?.iter().map(|(_, t)| t.to_vec()).collect::<Result<Vec<_>>>()?.concat();
        println!("{shard:?}: held between steps {held} B per device, losses {losses:?}");
        runs.push((losses, weights, held));
    }
    tandem::tolerance::assert_close("ZeRO-3 losses", &runs[1].0, &runs[0].0, 1e-5, 1e-4);
    tandem::tolerance::assert_close("ZeRO-3 weights", &runs[1].1, &runs[0].1, 1e-5, 1e-4);
    // bf16 shards: each gradient rounded once (2^-9) before Adam, whose steps it barely moves.
    let norm = |v: &mut dyn Iterator<Item = f32>| v.map(|x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let apart = norm(&mut runs[2].1.iter().zip(&runs[0].1).map(|(a, b)| a - b)) / norm(&mut runs[0].1.iter().copied());
    println!("bf16 gradient shards: weights {apart:.2e} from plain (relative 2-norm)");
    assert!(apart <= 2f64.powi(-9), "bf16 gradient shards: weights {apart} from plain");
    tandem::tolerance::assert_close("ZeRO-3 bf16-gradient losses", &runs[2].0, &runs[0].0, 0.0, 2f32.powi(-8));
    // Plain holds the 296k parameters (1.19 MB), their gradients and Adam's moments; ZeRO-3
    // only pieces of the last two, each in a block of the allocator's size class (up to twice
    // its bytes below 1 MiB), and no parameters: less than plain without its parameters.
    let param_bytes = 4.0 * 296_449.0;
    assert!((runs[1].2 as f64) < runs[0].2 as f64 - 0.9 * param_bytes, "held: ZeRO-3 {} B, plain {} B", runs[1].2, runs[0].2);
    Ok(())
}
