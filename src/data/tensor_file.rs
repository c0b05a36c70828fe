//! A dataset from a safetensors file holding an `x` tensor and a `y` tensor.
use super::{Dataset, Targets};
use crate::checkpoint::{host_from_view, parse, HostData};
use crate::{Error, Result};
use safetensors::Dtype;
use std::path::Path;

/// Loads `x` (F32, first dimension = samples) and `y` from a safetensors file.
/// A NaN or infinity in `x` or in F32 `y` is an error naming the tensor and its first index.
///
/// Integer `y` (I64, I32 or U8, shape `[n]` or `[n, 1]`) gives class labels; their count is
/// `classes` when given, else the largest label plus one. F32 `y` gives regression targets of
/// shape `y.shape[1..]` per sample.
///
/// ```no_run
/// let ds = tandem::data::tensor_file::load("train.safetensors", Some(10))?;
/// # Ok::<(), tandem::Error>(())
/// ```
pub fn load(path: impl AsRef<Path>, classes: Option<usize>) -> Result<Dataset> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let st = parse(path, &bytes)?;
    let get = |name: &str| {
        st.tensor(name).map_err(|_| {
            let mut names = st.names();
            names.sort();
            Error::format(path, format!("no tensor named '{name}'; the file holds: {}", crate::error::capped_list(names)))
        })
    };
    let (xv, yv) = (get("x")?, get("y")?);
    if xv.dtype() != Dtype::F32 {
        return Err(Error::format(path, format!("x has dtype {:?}; expected F32", xv.dtype())));
    }
    let Some((&n, sample_shape)) = xv.shape().split_first() else {
        return Err(Error::format(path, "x is a scalar; its first dimension must count the samples"));
    };
    let y_n = yv.shape().first().copied();
    if y_n != Some(n) {
        return Err(Error::format(path, format!("x has shape {:?} but y has shape {:?}: first dimensions differ", xv.shape(), yv.shape())));
    }
    let HostData::F32(x) = host_from_view(path, "x", &xv)?.data else {
        return Err(Error::format(path, "x did not decode to f32"));
    };
    finite(path, "x", &x, xv.shape())?;
    let y = match yv.dtype() {
        Dtype::I64 | Dtype::I32 | Dtype::U8 => {
            if !(yv.shape().len() == 1 || yv.shape() == [n, 1]) {
                return Err(Error::format(path, format!("class labels y must have shape [{n}] or [{n}, 1], not {:?}", yv.shape())));
            }
            let HostData::I32(labels) = host_from_view(path, "y", &yv)?.data else {
                return Err(Error::format(path, "y did not decode to integers"));
            };
            if let Some((i, &l)) = labels.iter().enumerate().find(|&(_, &l)| l < 0) {
                return Err(Error::format(path, format!("y holds negative label {l} at index {i}")));
            }
            let max_plus_one = labels.iter().map(|&l| l as usize + 1).max().unwrap_or(0);
            let classes = classes.unwrap_or(max_plus_one);
            if max_plus_one > classes {
                let (i, l) = labels.iter().enumerate().find(|&(_, &l)| l as usize >= classes).map_or((0, 0), |(i, &l)| (i, l));
                return Err(Error::format(path, format!("y holds label {l} at index {i}, outside 0..{classes}")));
            }
            Targets::Classes { labels, classes }
        }
        Dtype::F32 => {
            let HostData::F32(data) = host_from_view(path, "y", &yv)?.data else {
                return Err(Error::format(path, "y did not decode to f32"));
            };
            finite(path, "y", &data, yv.shape())?;
            let mut per = yv.shape()[1..].to_vec();
            if per.is_empty() {
                per.push(1);
            }
            Targets::Values { data, shape_per_sample: per }
        }
        other => return Err(Error::format(path, format!("y has dtype {other:?}; expected I64, I32 or U8 labels or F32 targets"))),
    };
    let ds = Dataset { x, sample_shape: sample_shape.to_vec(), y };
    ds.validate().map_err(|e| Error::format(path, e.to_string()))?;
    Ok(ds)
}

/// Rejects a NaN or infinite value: training on it would only turn every loss into NaN (or,
/// through a ReLU in older versions, silently into garbage). Names the first one.
fn finite(path: &Path, name: &str, v: &[f32], shape: &[usize]) -> Result<()> {
    let Some(i) = v.iter().position(|x| !x.is_finite()) else {
        return Ok(());
    };
    let mut at = vec![0; shape.len()];
    let mut rem = i;
    for (a, &d) in at.iter_mut().zip(shape).rev() {
        *a = rem % d;
        rem /= d;
    }
    Err(Error::format(path, format!("tensor '{name}' {shape:?} holds {} at flat index {i} (index {at:?}); inputs must be finite", v[i])))
}
