//! Host-side checkpoint I/O: safetensors files of named host tensors, written atomically.
//!
//! This layer knows nothing about devices: a `HostTensor` is a plain `Vec` plus a shape. The
//! tensor-facing layer copies device tensors into `HostTensor`s and calls these functions.
//!
//! Every file tandem writes goes through [`write_atomic`]: a regular file (or a new path) is
//! replaced atomically, a symbolic link is followed so that the link survives, a character
//! device such as `/dev/null` or a FIFO is written in place, and anything else (a directory, a
//! block device, a socket) is refused. Nothing that is not a regular file is ever replaced.
#![doc = include_str!("checkpoint.md")]
mod output;

use crate::{DType, Error, Result};
pub use output::{output_target, write_atomic, OutputTarget};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::Path;

/// The elements of a host tensor, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    F32(Vec<f32>),
    I32(Vec<i32>),
}

/// A tensor in host memory: what a checkpoint stores under one name.
///
/// ```
/// use tandem::checkpoint::HostTensor;
/// let w = HostTensor::f32(vec![2, 2], vec![1.0, 0.0, 0.0, 1.0])?;
/// assert_eq!(w.shape, [2, 2]);
/// # Ok::<(), tandem::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: HostData,
}

impl HostTensor {
    /// An f32 tensor; errors if `data` does not hold exactly `shape`'s element count.
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> Result<Self> {
        check_numel(&shape, data.len())?;
        Ok(HostTensor { dtype: DType::F32, shape, data: HostData::F32(data) })
    }

    /// An i32 tensor; errors if `data` does not hold exactly `shape`'s element count.
    pub fn i32(shape: Vec<usize>, data: Vec<i32>) -> Result<Self> {
        check_numel(&shape, data.len())?;
        Ok(HostTensor { dtype: DType::I32, shape, data: HostData::I32(data) })
    }

    /// Number of elements stored.
    pub fn numel(&self) -> usize {
        match &self.data {
            HostData::F32(v) => v.len(),
            HostData::I32(v) => v.len(),
        }
    }
}

fn check_numel(shape: &[usize], len: usize) -> Result<()> {
    let numel = shape.iter().product::<usize>();
    if numel != len {
        return Err(Error::shape("HostTensor", format!("shape {shape:?} holds {numel} elements but {len} were given")));
    }
    Ok(())
}

/// Lowercase hex SHA-256 of `bytes`, for checkpoint integrity records.
///
/// ```
/// let h = tandem::checkpoint::sha256_hex(b"abc");
/// assert!(h.starts_with("ba7816bf"));
/// ```
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes named tensors (e.g. PyTorch state_dict names like `conv1.weight`) and string
/// metadata to a safetensors file, atomically (see [`write_atomic`]).
///
/// ```
/// use std::collections::BTreeMap;
/// use tandem::checkpoint::{read_safetensors, write_safetensors, HostTensor};
/// let path = std::env::temp_dir().join(format!("tandem-doc-{}.safetensors", std::process::id()));
/// let w = HostTensor::f32(vec![2], vec![0.5, -1.0])?;
/// write_safetensors(&path, &[("fc.weight".to_string(), w.clone())], &BTreeMap::new())?;
/// let (tensors, _meta) = read_safetensors(&path)?;
/// assert_eq!(tensors[0], ("fc.weight".to_string(), w));
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), tandem::Error>(())
/// ```
pub fn write_safetensors(path: impl AsRef<Path>, tensors: &[(String, HostTensor)], metadata: &BTreeMap<String, String>) -> Result<()> {
    let path = path.as_ref();
    write_atomic(path, &safetensors_bytes(path, tensors, metadata)?)
}

/// The bytes of a safetensors file of `tensors` and `metadata` (`path` names it in errors): what
/// [`write_safetensors`] writes, for a writer with rules of its own (a run's checkpoints).
pub(crate) fn safetensors_bytes(path: &Path, tensors: &[(String, HostTensor)], metadata: &BTreeMap<String, String>) -> Result<Vec<u8>> {
    let mut encoded = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        check_numel(&t.shape, t.numel()).map_err(|e| Error::invalid("write_safetensors", format!("{name}: {e}")))?;
        let (dtype, bytes) = match &t.data {
            HostData::F32(v) => (Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()),
            HostData::I32(v) => (Dtype::I32, v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()),
        };
        encoded.push((name.as_str(), dtype, t.shape.clone(), bytes));
    }
    let views = encoded
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes).map(|v| (*name, v)).map_err(|e| Error::format(path, format!("tensor {name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let info: HashMap<String, String> = metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let info = if info.is_empty() { None } else { Some(info) };
    safetensors::serialize(views, info).map_err(|e| Error::format(path, e.to_string()))
}

/// What `read_safetensors` returns: the tensors sorted by name, and the string metadata.
pub type SafetensorsContents = (Vec<(String, HostTensor)>, BTreeMap<String, String>);

/// Reads every tensor of a safetensors file, sorted by name, with its string metadata.
///
/// F32 stays F32; F16 and BF16 widen exactly to F32; I64, I32 and U8 become I32 (an I64 value
/// outside the i32 range is an error, since WGSL has no 64-bit integers). Other dtypes are
/// errors. Every error names the path. See [`write_safetensors`] for an example.
pub fn read_safetensors(path: impl AsRef<Path>) -> Result<SafetensorsContents> {
    let path = path.as_ref();
    let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;
    safetensors_from_bytes(path, &bytes)
}

/// [`read_safetensors`] of a file's `bytes` already in memory; `path` names it in errors.
pub fn safetensors_from_bytes(path: &Path, bytes: &[u8]) -> Result<SafetensorsContents> {
    let st = parse(path, bytes)?;
    let mut out = Vec::with_capacity(st.len());
    for (name, view) in st.tensors() {
        let t = host_from_view(path, &name, &view)?;
        out.push((name, t));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| Error::format(path, e.to_string()))?;
    let meta = meta.metadata().clone().unwrap_or_default().into_iter().collect();
    Ok((out, meta))
}

/// Parses a safetensors buffer, turning the library's errors into a Format error on `path`.
pub(crate) fn parse<'a>(path: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>> {
    SafeTensors::deserialize(bytes).map_err(|e| Error::format(path, format!("not a valid safetensors file: {e}")))
}

/// Converts one stored tensor to host form (see [`read_safetensors`] for the dtype rules).
pub(crate) fn host_from_view(path: &Path, name: &str, view: &TensorView<'_>) -> Result<HostTensor> {
    let raw = view.data();
    let shape = view.shape().to_vec();
    let words = |n: usize| raw.chunks_exact(n);
    let data = match view.dtype() {
        Dtype::F32 => HostData::F32(words(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
        Dtype::F16 => HostData::F32(words(2).map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect()),
        // bf16 is the top half of an f32, so widening is a shift.
        Dtype::BF16 => HostData::F32(words(2).map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)).collect()),
        Dtype::I32 => HostData::I32(words(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
        Dtype::U8 => HostData::I32(raw.iter().map(|&b| b as i32).collect()),
        Dtype::I64 => {
            let mut v = Vec::with_capacity(raw.len() / 8);
            for (i, c) in words(8).enumerate() {
                let x = i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
                let x =
                    i32::try_from(x).map_err(|_| Error::format(path, format!("tensor {name}: I64 value {x} at index {i} does not fit in i32")))?;
                v.push(x);
            }
            HostData::I32(v)
        }
        other => return Err(Error::format(path, format!("tensor {name}: dtype {other:?} is not supported (use F32, F16, BF16, I64, I32 or U8)"))),
    };
    let dtype = match data {
        HostData::F32(_) => DType::F32,
        HostData::I32(_) => DType::I32,
    };
    Ok(HostTensor { dtype, shape, data })
}

/// Exact IEEE half -> single widening (every f16 value is representable as f32).
fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        // Subnormal: value = man * 2^-24, exact in f32.
        (0, m) => {
            let v = m as f32 * 2f32.powi(-24);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// Copies named tensors to the host.
pub fn to_host(tensors: &[(String, crate::Tensor)]) -> Result<Vec<(String, HostTensor)>> {
    tensors
        .iter()
        .map(|(n, t)| {
            let shape = t.dims().to_vec();
            let h = match t.dtype() {
                // Halves widen exactly: checkpoints hold F32 (the master weights' type).
                DType::F32 | DType::Bf16 | DType::F16 => HostTensor::f32(shape, t.to_vec()?)?,
                DType::I32 => HostTensor::i32(shape, t.to_vec_i32()?)?,
            };
            Ok((n.clone(), h))
        })
        .collect()
}

/// Writes named tensors (a model's `parameters()` or `state_dict()`) as safetensors with
/// PyTorch's names and layouts, atomically.
///
/// ```no_run
/// # fn main() -> tandem::Result<()> {
/// use tandem::nn::{models::SeedModel, Module};
/// let model = SeedModel::Cnn.build(0, &tandem::Device::cpu())?;
/// tandem::checkpoint::save_weights("model.safetensors", &model.parameters())?;
/// let back = tandem::checkpoint::load_weights("model.safetensors", &tandem::Device::cpu())?;
/// model.load_state_dict(&back)?;
/// # Ok(()) }
/// ```
pub fn save_weights(path: impl AsRef<Path>, tensors: &[(String, crate::Tensor)]) -> Result<()> {
    write_safetensors(path, &to_host(tensors)?, &BTreeMap::new())
}

/// Reads every tensor of a safetensors file onto `device`, sorted by name.
pub fn load_weights(path: impl AsRef<Path>, device: &crate::Device) -> Result<Vec<(String, crate::Tensor)>> {
    let (tensors, _) = read_safetensors(path)?;
    tensors
        .into_iter()
        .map(|(n, h)| {
            let t = match h.data {
                HostData::F32(v) => crate::Tensor::from_vec(v, h.shape, device)?,
                HostData::I32(v) => crate::Tensor::from_labels(v, h.shape, device)?,
            };
            Ok((n, t))
        })
        .collect()
}
