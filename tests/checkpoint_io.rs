//! Safetensors checkpoints: bit-exact round trips, dtype conversions, atomic writes, bad files.
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::PathBuf;
use tandem::checkpoint::{read_safetensors, sha256_hex, write_atomic, write_safetensors, HostData, HostTensor};
use tandem::{DType, Error};

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn bits(t: &HostTensor) -> Vec<u32> {
    match &t.data {
        HostData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        HostData::I32(v) => v.iter().map(|&x| x as u32).collect(),
    }
}

#[test]
fn round_trip_is_bit_exact() {
    let dir = temp_dir("rt");
    let p = dir.join("model.safetensors");
    let odd = vec![f32::from_bits(0x7fc0_1234), f32::from_bits(0xffa0_0001), -0.0, 0.0, f32::INFINITY, f32::MIN_POSITIVE / 4.0];
    let tensors = vec![
        ("conv1.weight".to_string(), HostTensor::f32(vec![2, 3], odd).unwrap()),
        ("fc.bias".to_string(), HostTensor::f32(vec![0], vec![]).unwrap()),
        ("a.steps".to_string(), HostTensor::i32(vec![3], vec![i32::MIN, -1, i32::MAX]).unwrap()),
    ];
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string()), ("step".to_string(), "12".to_string())]);
    write_safetensors(&p, &tensors, &meta).unwrap();
    let (back, meta_back) = read_safetensors(&p).unwrap();
    assert_eq!(meta_back, meta);
    let names: Vec<&str> = back.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a.steps", "conv1.weight", "fc.bias"]);
    for (name, t) in &tensors {
        let (_, b) = back.iter().find(|(n, _)| n == name).unwrap();
        assert_eq!((b.dtype, &b.shape), (t.dtype, &t.shape), "{name}");
        assert_eq!(bits(b), bits(t), "{name}");
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temp file may be left behind");
}

#[test]
fn host_tensor_checks_its_size() {
    assert!(HostTensor::f32(vec![2, 2], vec![0.0; 3]).is_err());
    assert!(HostTensor::i32(vec![2], vec![0; 2]).is_ok());
}

fn write_raw(p: &std::path::Path, entries: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<_> = entries.iter().map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).unwrap())).collect();
    std::fs::write(p, safetensors::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn reads_and_converts_foreign_dtypes() {
    let dir = temp_dir("dtypes");
    let p = dir.join("t.safetensors");
    // f16: 1.0, -2.0, smallest subnormal, +inf; bf16: 1.0, -0.5.
    let f16: Vec<u8> = [0x3c00u16, 0xc000, 0x0001, 0x7c00].iter().flat_map(|h| h.to_le_bytes()).collect();
    let bf16: Vec<u8> = [0x3f80u16, 0xbf00].iter().flat_map(|h| h.to_le_bytes()).collect();
    let i64s: Vec<u8> = [-5i64, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
    write_raw(
        &p,
        &[
            ("h", Dtype::F16, vec![4], f16),
            ("b", Dtype::BF16, vec![2], bf16),
            ("l", Dtype::I64, vec![2], i64s),
            ("u", Dtype::U8, vec![2], vec![0, 255]),
        ],
    );
    let (t, meta) = read_safetensors(&p).unwrap();
    assert!(meta.is_empty());
    let get = |n: &str| t.iter().find(|(m, _)| m == n).unwrap().1.clone();
    assert_eq!(get("h").data, HostData::F32(vec![1.0, -2.0, 2f32.powi(-24), f32::INFINITY]));
    assert_eq!(get("b").data, HostData::F32(vec![1.0, -0.5]));
    assert_eq!(get("l").data, HostData::I32(vec![-5, 7]));
    assert_eq!(get("l").dtype, DType::I32);
    assert_eq!(get("u").data, HostData::I32(vec![0, 255]));

    write_raw(&p, &[("l", Dtype::I64, vec![1], (1i64 << 35).to_le_bytes().to_vec())]);
    assert!(matches!(read_safetensors(&p), Err(Error::Format { path, detail }) if path == p && detail.contains("does not fit")));
    write_raw(&p, &[("d", Dtype::F64, vec![1], vec![0; 8])]);
    assert!(matches!(read_safetensors(&p), Err(Error::Format { path, detail }) if path == p && detail.contains("F64")));
}

#[test]
fn truncated_or_garbage_files_are_format_errors() {
    let dir = temp_dir("trunc");
    let p = dir.join("m.safetensors");
    let t = vec![("w".to_string(), HostTensor::f32(vec![4], vec![1.0; 4]).unwrap())];
    write_safetensors(&p, &t, &BTreeMap::new()).unwrap();
    let whole = std::fs::read(&p).unwrap();
    for cut in [whole.len() - 1, 20, 3, 0] {
        std::fs::write(&p, &whole[..cut]).unwrap();
        match read_safetensors(&p) {
            Err(Error::Format { path, .. }) => assert_eq!(path, p),
            other => panic!("cut at {cut}: expected Format, got {other:?}"),
        }
    }
    assert!(matches!(read_safetensors(dir.join("nope")), Err(Error::Io { path, .. }) if path == dir.join("nope")));
}

#[test]
fn atomic_write_replaces_whole_file() {
    let dir = temp_dir("atomic");
    let p = dir.join("state.json");
    write_atomic(&p, b"old contents").unwrap();
    write_atomic(&p, b"new").unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), b"new");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
}

#[test]
fn failed_rename_leaves_target_and_no_temp() {
    // The target is a non-empty directory, so the final rename fails after the temp file was
    // written: this fails even for root, unlike permission tricks.
    let dir = temp_dir("rename");
    let target = dir.join("ckpt");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("old"), b"keep me").unwrap();
    match write_atomic(&target, b"new") {
        Err(Error::Io { path, .. }) => assert_eq!(path, target),
        other => panic!("expected Io error, got {other:?}"),
    }
    assert_eq!(std::fs::read(target.join("old")).unwrap(), b"keep me");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "temp file left behind");
}

#[cfg(unix)]
#[test]
fn read_only_dir_keeps_old_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("ro");
    let p = dir.join("model.safetensors");
    let old = vec![("w".to_string(), HostTensor::f32(vec![1], vec![1.0]).unwrap())];
    write_safetensors(&p, &old, &BTreeMap::new()).unwrap();
    let before = std::fs::read(&p).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).unwrap();
    // Root ignores directory permissions; there the failure is forced through a missing
    // parent instead, which still must name the path and touch nothing.
    let probe = std::fs::File::create(dir.join("probe")).is_ok();
    let target = if probe { dir.join("absent").join("model.safetensors") } else { p.clone() };
    let new = vec![("w".to_string(), HostTensor::f32(vec![1], vec![2.0]).unwrap())];
    let result = write_safetensors(&target, &new, &BTreeMap::new());
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    match result {
        Err(Error::Io { path, .. }) => assert_eq!(path, target),
        other => panic!("expected Io error, got {other:?}"),
    }
    assert_eq!(std::fs::read(&p).unwrap(), before);
}

#[test]
fn sha256_known_vectors() {
    assert_eq!(sha256_hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}
