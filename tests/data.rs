//! Datasets, the loader, and every data source, including their error paths.
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tandem::data::{digits, mnist, synthetic, tensor_file, DataLoader, Dataset, LoaderState, Targets};
use tandem::Error;

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-data-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Dataset whose sample `i` is `[i, i]`, so batches reveal which samples they hold.
fn numbered(n: usize) -> Dataset {
    Dataset {
        x: (0..n).flat_map(|i| [i as f32, i as f32]).collect(),
        sample_shape: vec![2],
        y: Targets::Classes { labels: (0..n).map(|i| (i % 3) as i32).collect(), classes: 3 },
    }
}

fn ids(b: &tandem::data::Batch) -> Vec<usize> {
    b.x.as_f32().expect("f32 inputs").chunks(2).map(|c| c[0] as usize).collect()
}

#[test]
fn validate_names_first_bad_label() {
    let mut ds = numbered(5);
    ds.y = Targets::Classes { labels: vec![0, 1, 3, -1, 2], classes: 3 };
    let msg = ds.validate().unwrap_err().to_string();
    assert!(msg.contains("label 3 at index 2"), "{msg}");
    let mut ds = numbered(5);
    ds.x.pop();
    assert!(ds.validate().is_err());
}

#[test]
fn subset_and_split() {
    let mut ds = numbered(10);
    assert_eq!(ids(&ds.batch(&[3, 1]).unwrap()), [3, 1]);
    assert!(ds.subset(5..11).is_err());
    let test = ds.split_off_test(0.3).unwrap();
    assert_eq!((ds.len(), test.len()), (7, 3));
    assert_eq!(test.x[0], 7.0);
    assert!(ds.split_off_test(1.5).is_err());
}

#[test]
fn loader_sees_every_sample_once_per_epoch_with_uneven_last_batch() {
    let mut l = DataLoader::new(Arc::new(numbered(10)), 4, true, 9).unwrap();
    assert_eq!(l.batches_per_epoch(), 3);
    let mut orders = Vec::new();
    for epoch in 0..3u64 {
        assert_eq!(l.state(), LoaderState { epoch, position: 0 });
        let sizes: Vec<usize> = (0..3)
            .map(|_| l.next_batch())
            .map(|b| {
                orders.extend(ids(&b));
                b.len()
            })
            .collect();
        assert_eq!(sizes, [4, 4, 2]);
        let seen: HashSet<usize> = orders[orders.len() - 10..].iter().copied().collect();
        assert_eq!(seen.len(), 10);
    }
    // Shuffled: epochs differ from each other and from the identity.
    assert_ne!(orders[..10], orders[10..20]);
    assert_ne!(orders[..10], (0..10).collect::<Vec<_>>()[..]);
    let plain: Vec<usize> = {
        let mut l = DataLoader::new(Arc::new(numbered(10)), 4, false, 9).unwrap();
        (0..3).flat_map(|_| ids(&l.next_batch())).collect()
    };
    assert_eq!(plain, (0..10).collect::<Vec<_>>());
}

#[test]
fn loader_drop_last_and_bad_sizes() {
    let l = DataLoader::new(Arc::new(numbered(10)), 4, true, 1).unwrap();
    let mut l = l.drop_last(true).unwrap();
    assert_eq!(l.batches_per_epoch(), 2);
    for _ in 0..5 {
        assert_eq!(l.next_batch().len(), 4);
    }
    assert_eq!(l.state(), LoaderState { epoch: 2, position: 4 });
    assert!(DataLoader::new(Arc::new(numbered(10)), 0, true, 1).is_err());
    let big = DataLoader::new(Arc::new(numbered(3)), 4, true, 1).unwrap();
    assert_eq!(big.batches_per_epoch(), 1);
    assert!(big.drop_last(true).is_err());
    let l = DataLoader::new(Arc::new(numbered(3)), 2, false, 1).unwrap();
    assert!(l.batch_at(&[0, 3]).is_err());
    assert_eq!(ids(&l.batch_at(&[2, 0]).unwrap()), [2, 0]);
}

#[test]
fn loader_is_deterministic_and_resumes_mid_epoch() {
    let data = Arc::new(numbered(23));
    let run = |seed| {
        let mut l = DataLoader::new(data.clone(), 5, true, seed).unwrap();
        (0..12).map(|_| l.next_batch()).collect::<Vec<_>>()
    };
    let a = run(3);
    assert_eq!(a, run(3));
    assert_ne!(a, run(4));
    // Stop after 7 batches (mid epoch 1), save the state through JSON, resume in a new loader.
    let mut l = DataLoader::new(data.clone(), 5, true, 3).unwrap();
    for _ in 0..7 {
        l.next_batch();
    }
    let json = serde_json::to_string(&l.state()).unwrap();
    let state: LoaderState = serde_json::from_str(&json).unwrap();
    assert_eq!(state, LoaderState { epoch: 1, position: 10 });
    let mut resumed = DataLoader::new(data.clone(), 5, true, 3).unwrap();
    resumed.set_state(state).unwrap();
    let rest: Vec<_> = (0..5).map(|_| resumed.next_batch()).collect();
    assert_eq!(rest, a[7..]);
    assert!(resumed.set_state(LoaderState { epoch: 0, position: 24 }).is_err());
}

#[test]
fn synthetic_sets_are_seeded() {
    let a = synthetic::seed_images(50, 1).unwrap();
    assert_eq!(a, synthetic::seed_images(50, 1).unwrap());
    assert_ne!(a.x, synthetic::seed_images(50, 2).unwrap().x);
    let mean = a.x.iter().sum::<f32>() / a.x.len() as f32;
    let var = a.x.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / a.x.len() as f32;
    assert!(mean.abs() < 0.02 && (var - 1.0).abs() < 0.03, "mean {mean} var {var}");
    let r = synthetic::regression(20, 4, 5).unwrap();
    assert_eq!(r.y, synthetic::regression(20, 4, 5).unwrap().y);
    assert!(matches!(&r.y, Targets::Values { data, shape_per_sample } if data.len() == 20 && shape_per_sample == &[1]));
}

fn labels(ds: &Dataset) -> &[i32] {
    match &ds.y {
        Targets::Classes { labels, .. } => labels,
        _ => panic!("expected class labels"),
    }
}

#[test]
fn digits_are_deterministic_balanced_and_not_trivial() {
    let (train, test) = digits::load(2000, 1000, 7).unwrap();
    let (train2, _) = digits::load(2000, 10, 7).unwrap();
    assert_eq!(train, train2);
    assert_ne!(train.x[..784], test.x[..784], "the test split must be a different draw");
    assert_ne!(train.x, digits::load(2000, 0, 8).unwrap().0.x);
    for c in 0..10 {
        assert_eq!(labels(&train).iter().filter(|&&l| l == c).count(), 200);
    }
    // Normalized like MNIST: raw pixels in [0, 1] with a dark background.
    let lo = (0.0 - 0.1307) / 0.3081 - 1e-5;
    let hi = (1.0 - 0.1307) / 0.3081 + 1e-5;
    assert!(train.x.iter().all(|&v| v >= lo && v <= hi));
    let mean = train.x.iter().sum::<f32>() / train.x.len() as f32;
    assert!(mean.abs() < 0.5, "normalized mean {mean}");

    // Nearest centroid: far above chance (10%), far from perfect.
    let mut centroids = vec![0.0f32; 10 * 784];
    for (img, &l) in train.x.chunks(784).zip(labels(&train)) {
        for (c, v) in centroids[l as usize * 784..][..784].iter_mut().zip(img) {
            *c += v / 200.0;
        }
    }
    let correct = test
        .x
        .chunks(784)
        .zip(labels(&test))
        .filter(|(img, &l)| {
            let d = |c: usize| centroids[c * 784..][..784].iter().zip(img.iter()).map(|(a, b)| (a - b).powi(2)).sum::<f32>();
            (0..10).min_by(|&a, &b| d(a).total_cmp(&d(b))) == Some(l as usize)
        })
        .count();
    let acc = correct as f32 / test.len() as f32;
    println!("nearest-centroid accuracy on digits: {acc}");
    assert!(acc > 0.4 && acc < 0.95, "nearest-centroid accuracy {acc}");
}

fn idx(magic: u32, dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut b = magic.to_be_bytes().to_vec();
    for d in dims {
        b.extend(d.to_be_bytes());
    }
    b.extend(data);
    b
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// Writes a tiny MNIST set: `n` 2x3 training images and `n` test images.
fn write_mnist(dir: &Path, compress: bool) {
    let files = [
        ("train-images-idx3-ubyte", idx(0x803, &[3, 2, 3], &(0..18).map(|i| i * 10).collect::<Vec<u8>>())),
        ("train-labels-idx1-ubyte", idx(0x801, &[3], &[7, 0, 9])),
        ("t10k-images-idx3-ubyte", idx(0x803, &[1, 2, 3], &[255; 6])),
        ("t10k-labels-idx1-ubyte", idx(0x801, &[1], &[4])),
    ];
    for (name, bytes) in files {
        if compress {
            std::fs::write(dir.join(format!("{name}.gz")), gz(&bytes)).unwrap();
        } else {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
}

#[test]
fn mnist_plain_and_gz() {
    for compress in [false, true] {
        let dir = temp_dir(&format!("mnist-{compress}"));
        write_mnist(&dir, compress);
        let (train, test) = mnist::load(&dir).unwrap();
        assert_eq!(train.sample_shape, [1, 2, 3]);
        assert_eq!(labels(&train), [7, 0, 9]);
        assert_eq!(labels(&test), [4]);
        assert!((train.x[1] - (10.0 / 255.0 - 0.1307) / 0.3081).abs() < 1e-6);
        assert!((test.x[0] - (1.0 - 0.1307) / 0.3081).abs() < 1e-6);
    }
}

#[test]
fn mnist_errors_name_the_file() {
    let dir = temp_dir("mnist-bad");
    write_mnist(&dir, false);
    let labels_path = dir.join("t10k-labels-idx1-ubyte");
    std::fs::remove_file(&labels_path).unwrap();
    match mnist::load(&dir).unwrap_err() {
        Error::Io { path, .. } => assert_eq!(path, labels_path),
        e => panic!("expected Io, got {e}"),
    }
    let images = dir.join("train-images-idx3-ubyte");
    std::fs::write(&labels_path, idx(0x801, &[1], &[4])).unwrap();
    std::fs::write(&images, idx(0x802, &[3, 2, 3], &[0; 18])).unwrap();
    let e = mnist::load(&dir).unwrap_err();
    assert!(matches!(&e, Error::Format { path, detail } if *path == images && detail.contains("magic")), "{e}");
    std::fs::write(&images, idx(0x803, &[3, 2, 3], &[0; 17])).unwrap();
    let e = mnist::load(&dir).unwrap_err();
    assert!(matches!(&e, Error::Format { path, detail } if *path == images && detail.contains("truncated")), "{e}");
    std::fs::write(&images, [0, 0]).unwrap();
    assert!(matches!(mnist::load(&dir).unwrap_err(), Error::Format { .. }));
    std::fs::remove_file(&images).unwrap();
    let gz_path = dir.join("train-images-idx3-ubyte.gz");
    std::fs::write(&gz_path, b"not gzip").unwrap();
    let e = mnist::load(&dir).unwrap_err();
    assert!(matches!(&e, Error::Format { path, .. } if *path == gz_path), "{e}");
}

fn le<T: Copy, const N: usize>(v: &[T], f: fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

/// Writes a safetensors file of `(name, dtype, shape, bytes)` entries.
fn write_st(path: &Path, entries: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<_> = entries.iter().map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).unwrap())).collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn x_entry(n: usize) -> (&'static str, Dtype, Vec<usize>, Vec<u8>) {
    ("x", Dtype::F32, vec![n, 2], le(&(0..2 * n).map(|i| i as f32).collect::<Vec<_>>(), f32::to_le_bytes))
}

#[test]
fn tensor_file_label_dtypes_and_values() {
    let dir = temp_dir("tf");
    let p = dir.join("d.safetensors");
    let cases = [(Dtype::I64, le(&[2i64, 0, 1], i64::to_le_bytes)), (Dtype::I32, le(&[2i32, 0, 1], i32::to_le_bytes)), (Dtype::U8, vec![2, 0, 1])];
    for (dtype, bytes) in cases {
        write_st(&p, &[x_entry(3), ("y", dtype, vec![3], bytes)]);
        let ds = tensor_file::load(&p, None).unwrap();
        assert_eq!(ds.sample_shape, [2]);
        assert_eq!(ds.x, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(ds.y, Targets::Classes { labels: vec![2, 0, 1], classes: 3 }, "{dtype:?}");
        assert_eq!(tensor_file::load(&p, Some(10)).unwrap().y, Targets::Classes { labels: vec![2, 0, 1], classes: 10 });
        assert!(matches!(tensor_file::load(&p, Some(2)), Err(Error::Format { .. })));
    }
    write_st(&p, &[x_entry(3), ("y", Dtype::F32, vec![3, 2], le(&[0.5f32; 6], f32::to_le_bytes))]);
    let ds = tensor_file::load(&p, None).unwrap();
    assert_eq!(ds.y, Targets::Values { data: vec![0.5; 6], shape_per_sample: vec![2] });
}

fn format_detail(p: &Path) -> String {
    match tensor_file::load(p, None) {
        Err(Error::Format { path, detail }) => {
            assert_eq!(path, p);
            detail
        }
        other => panic!("expected a Format error, got {other:?}"),
    }
}

#[test]
fn tensor_file_errors() {
    let dir = temp_dir("tf-bad");
    let p = dir.join("d.safetensors");
    let y3 = ("y", Dtype::I32, vec![3], le(&[0i32, 1, 2], i32::to_le_bytes));
    write_st(&p, &[x_entry(3), ("labels", Dtype::I32, vec![3], le(&[0i32, 1, 2], i32::to_le_bytes))]);
    let d = format_detail(&p);
    assert!(d.contains("'y'") && d.contains("labels, x"), "{d}");
    write_st(&p, &[("x", Dtype::I32, vec![3], le(&[0i32; 3], i32::to_le_bytes)), y3.clone()]);
    assert!(format_detail(&p).contains("x has dtype I32"));
    write_st(&p, &[x_entry(3), ("y", Dtype::F64, vec![3], vec![0; 24])]);
    assert!(format_detail(&p).contains("F64"));
    write_st(&p, &[x_entry(4), y3.clone()]);
    assert!(format_detail(&p).contains("first dimensions differ"));
    write_st(&p, &[x_entry(3), ("y", Dtype::I32, vec![3], le(&[0i32, -1, 2], i32::to_le_bytes))]);
    assert!(format_detail(&p).contains("-1 at index 1"));
    write_st(&p, &[x_entry(3), ("y", Dtype::I64, vec![3], le(&[0i64, 1, 1 << 40], i64::to_le_bytes))]);
    assert!(format_detail(&p).contains("does not fit"));
    write_st(&p, &[x_entry(3), y3]);
    let whole = std::fs::read(&p).unwrap();
    std::fs::write(&p, &whole[..whole.len() - 5]).unwrap();
    assert!(format_detail(&p).contains("safetensors"));
    std::fs::write(&p, b"hello, not a tensor file").unwrap();
    assert!(format_detail(&p).contains("safetensors"));
    assert!(matches!(tensor_file::load(dir.join("missing"), None), Err(Error::Io { .. })));
}

#[test]
fn tensor_file_rejects_non_finite_inputs() {
    let dir = temp_dir("tf-nonfinite");
    let p = dir.join("d.safetensors");
    let labels = ("y", Dtype::I32, vec![3], le(&[0i32, 1, 2], i32::to_le_bytes));
    for (bad, shown) in [(f32::NAN, "NaN"), (f32::INFINITY, "inf"), (f32::NEG_INFINITY, "-inf")] {
        let mut x = vec![0.5f32; 6];
        x[3] = bad;
        x[5] = f32::NAN;
        write_st(&p, &[("x", Dtype::F32, vec![3, 2], le(&x, f32::to_le_bytes)), labels.clone()]);
        let d = format_detail(&p);
        assert!(d.contains(&format!("tensor 'x' [3, 2] holds {shown} at flat index 3 (index [1, 1])")), "{d}");
    }
    let mut y = vec![0.25f32; 6];
    y[4] = f32::INFINITY;
    write_st(&p, &[x_entry(3), ("y", Dtype::F32, vec![3, 2], le(&y, f32::to_le_bytes))]);
    let d = format_detail(&p);
    assert!(d.contains("tensor 'y' [3, 2] holds inf at flat index 4 (index [2, 0])"), "{d}");
}
