//! CUDA kernel timings on device 0 (criterion): matmul through cuBLAS, elementwise, reduction,
//! im2col and host transfers. Without a CUDA device it prints why and measures nothing.
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tandem::backend::{cuda, BinaryOp, MatmulSpec, ReduceOp, ReduceSpec, WindowSpec};
use tandem::{DType, Layout, Shape};

fn kernels(c: &mut Criterion) {
    let dev = match cuda::probe().and_then(|n| if n > 0 { cuda::open(0) } else { Err(tandem::Error::Msg("0 devices".into())) }) {
        Ok(dev) => dev,
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            return;
        }
    };
    let run = |name: &str, c: &mut Criterion, elems: u64, f: &dyn Fn() -> tandem::Result<()>| {
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Elements(elems));
        g.bench_function(dev.info().name.as_str(), |b| {
            b.iter(|| {
                f().expect("launch");
                dev.sync().expect("sync");
            })
        });
        g.finish();
    };

    let n = 1024;
    let (a, b, out) = (dev.alloc(n * n, DType::F32).unwrap(), dev.alloc(n * n, DType::F32).unwrap(), dev.alloc(n * n, DType::F32).unwrap());
    for buf in [&a, &b] {
        dev.fill(buf, 0.5).unwrap();
    }
    // Throughput in elements counts FLOPs here: 2 per multiply-add.
    run("matmul_1024_flops", c, 2 * (n * n * n) as u64, &|| dev.matmul(&a, &b, &out, MatmulSpec::new(1, n, n, n)));

    let len = 1 << 24;
    let (x, y, z) = (dev.alloc(len, DType::F32).unwrap(), dev.alloc(len, DType::F32).unwrap(), dev.alloc(len, DType::F32).unwrap());
    let l = Layout::contiguous(&Shape::new([len]));
    run("add_16M", c, len as u64, &|| dev.binary(BinaryOp::Add, &x, &l, &y, &l, &z));
    let bcast = Layout::broadcast_to(&Shape::new([4096]), &Shape::new([4096, 4096]));
    let full = Layout::contiguous(&Shape::new([4096, 4096]));
    run("add_broadcast_16M", c, len as u64, &|| dev.binary(BinaryOp::Add, &x, &full, &y, &bcast, &z));
    run("sum_rows_4096x4096", c, len as u64, &|| dev.reduce(ReduceOp::Sum, &x, ReduceSpec { outer: 4096, len: 4096, inner: 1 }, &z));
    run("sum_cols_4096x4096", c, len as u64, &|| dev.reduce(ReduceOp::Sum, &x, ReduceSpec { outer: 1, len: 4096, inner: 4096 }, &z));

    let spec = WindowSpec::new("im2col", [64, 10, 12, 12], (5, 5), (1, 1), (0, 0)).unwrap();
    let cols = dev.alloc(spec.n * spec.col_rows() * spec.col_len(), DType::F32).unwrap();
    run("im2col_seed_cnn_conv2_b64", c, (spec.n * spec.col_rows() * spec.col_len()) as u64, &|| dev.im2col(&x, &cols, spec));

    let host = vec![0u8; 64 << 20];
    let mut g = c.benchmark_group("transfer_64MiB");
    g.throughput(Throughput::Bytes(host.len() as u64));
    g.bench_function("upload", |b| b.iter(|| drop(dev.upload(&host, DType::F32).expect("upload"))));
    let on_dev = dev.upload(&host, DType::F32).unwrap();
    g.bench_function("download", |b| b.iter(|| dev.download(&on_dev).expect("download")));
    g.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
