//! MNIST from IDX files in a directory, plain or gzip-compressed.
use super::{normalize, Dataset, Targets};
use crate::{Error, Result};
use std::io::Read;
use std::path::{Path, PathBuf};

const IMAGES_MAGIC: u32 = 0x0000_0803; // unsigned bytes, 3 dimensions
const LABELS_MAGIC: u32 = 0x0000_0801; // unsigned bytes, 1 dimension

/// Loads `(train, test)` from `dir`, which holds `train-images-idx3-ubyte`,
/// `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte`, each
/// either plain or with a `.gz` suffix. Images become `[1, rows, cols]` samples normalized with
/// `(x/255 - 0.1307) / 0.3081`; labels are classes `0..10`.
///
/// ```no_run
/// let (train, test) = tandem::data::mnist::load("data/mnist")?;
/// assert_eq!(train.len(), 60_000);
/// # Ok::<(), tandem::Error>(())
/// ```
pub fn load(dir: impl AsRef<Path>) -> Result<(Dataset, Dataset)> {
    let dir = dir.as_ref();
    let train = load_split(dir, "train")?;
    let test = load_split(dir, "t10k")?;
    Ok((train, test))
}

fn load_split(dir: &Path, prefix: &str) -> Result<Dataset> {
    let (img_path, img_bytes) = read_maybe_gz(&dir.join(format!("{prefix}-images-idx3-ubyte")))?;
    let (lbl_path, lbl_bytes) = read_maybe_gz(&dir.join(format!("{prefix}-labels-idx1-ubyte")))?;
    let (dims, pixels) = parse_idx(&img_path, &img_bytes, IMAGES_MAGIC, 3)?;
    let (ldims, labels) = parse_idx(&lbl_path, &lbl_bytes, LABELS_MAGIC, 1)?;
    if dims[0] != ldims[0] {
        return Err(Error::format(&lbl_path, format!("holds {} labels but {} holds {} images", ldims[0], img_path.display(), dims[0])));
    }
    if let Some((i, &l)) = labels.iter().enumerate().find(|&(_, &l)| l > 9) {
        return Err(Error::format(&lbl_path, format!("label {l} at index {i} is not a digit 0-9")));
    }
    let ds = Dataset {
        x: pixels.iter().map(|&p| normalize(p as f32 / 255.0)).collect(),
        sample_shape: vec![1, dims[1], dims[2]],
        y: Targets::Classes { labels: labels.iter().map(|&l| l as i32).collect(), classes: 10 },
    };
    ds.validate()?;
    Ok(ds)
}

/// Reads `path`, or `path.gz` decompressed when only that exists. Returns the path read.
fn read_maybe_gz(path: &Path) -> Result<(PathBuf, Vec<u8>)> {
    if path.exists() {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        return Ok((path.to_path_buf(), bytes));
    }
    let mut gz_name = path.as_os_str().to_owned();
    gz_name.push(".gz");
    let gz = PathBuf::from(gz_name);
    if !gz.exists() {
        let msg = format!("not found (nor {})", gz.display());
        return Err(Error::io(path, std::io::Error::new(std::io::ErrorKind::NotFound, msg)));
    }
    let compressed = std::fs::read(&gz).map_err(|e| Error::io(&gz, e))?;
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(compressed.as_slice())
        .read_to_end(&mut bytes)
        .map_err(|e| Error::format(&gz, format!("not a valid gzip stream: {e}")))?;
    Ok((gz, bytes))
}

/// Parses an IDX file of unsigned bytes: big-endian magic, `rank` big-endian u32 dimensions,
/// then exactly the product of the dimensions in bytes.
fn parse_idx<'a>(path: &Path, bytes: &'a [u8], magic: u32, rank: usize) -> Result<(Vec<usize>, &'a [u8])> {
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(Error::format(path, format!("truncated: {} bytes, shorter than the {header}-byte IDX header", bytes.len())));
    }
    let word = |i: usize| u32::from_be_bytes([bytes[4 * i], bytes[4 * i + 1], bytes[4 * i + 2], bytes[4 * i + 3]]);
    if word(0) != magic {
        return Err(Error::format(path, format!("bad magic number 0x{:08x}, expected 0x{magic:08x}", word(0))));
    }
    let dims: Vec<usize> = (1..=rank).map(|i| word(i) as usize).collect();
    let want = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let data = &bytes[header..];
    match want {
        Some(w) if w == data.len() => Ok((dims, data)),
        Some(w) if w > data.len() => Err(Error::format(path, format!("truncated: dimensions {dims:?} need {w} data bytes, found {}", data.len()))),
        Some(w) => Err(Error::format(path, format!("{} trailing bytes after the {w} data bytes", data.len() - w))),
        None => Err(Error::format(path, format!("dimensions {dims:?} overflow"))),
    }
}
