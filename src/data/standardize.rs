//! Per-feature standardisation to zero mean and unit variance (scikit-learn's
//! `StandardScaler`), for a dataset's features and its real-valued targets.
use super::{Dataset, Targets};
use crate::{Error, Result};

/// Per-feature mean and scale fitted on training data: `transform` maps `x` to
/// `(x - mean) / scale`, `inverse_transform` maps it back.
///
/// As scikit-learn's `StandardScaler`: the scale is the standard deviation with `ddof = 0`
/// (divided by `n`, not `n - 1`), and a feature whose values are all equal keeps the scale 1
/// (it becomes 0 rather than NaN). Sums run in `f64`. Fit on the training split only, then
/// transform every split with the same standardizer, so that no test statistic leaks into
/// training; standardise regression targets too, and `inverse_transform` the predictions to
/// report MSE or R² in the targets' own units.
///
/// It is `serde`-serialisable: save it beside a checkpoint to apply the same scaling at
/// inference.
///
/// ```
/// use tandem::data::Standardizer;
/// // Two features per row: [1, 10], [3, 10], [5, 10].
/// let rows = [1.0, 10.0, 3.0, 10.0, 5.0, 10.0];
/// let s = Standardizer::fit(&rows, 2)?;
/// assert_eq!(s.mean(), [3.0, 10.0]);
/// assert_eq!(s.scale(), [(8.0f64 / 3.0).sqrt(), 1.0]); // the constant feature keeps scale 1
/// let z = s.transform(&rows)?;
/// assert_eq!(z[1], 0.0);
/// let back = s.inverse_transform(&z)?; // through f32: equal to a rounding
/// assert!(back.iter().zip(&rows).all(|(b, r)| (b - r).abs() < 1e-6));
/// let json = serde_json::to_string(&s).unwrap();
/// assert_eq!(serde_json::from_str::<Standardizer>(&json).unwrap(), s);
/// # Ok::<(), tandem::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "Parts")]
pub struct Standardizer {
    mean: Vec<f64>,
    scale: Vec<f64>,
}

/// A standardizer as read back, checked before use (see `TryFrom`).
#[derive(serde::Deserialize)]
struct Parts {
    mean: Vec<f64>,
    scale: Vec<f64>,
}

impl TryFrom<Parts> for Standardizer {
    type Error = String;
    fn try_from(p: Parts) -> std::result::Result<Standardizer, String> {
        if p.mean.len() != p.scale.len() || p.mean.is_empty() {
            return Err(format!("a standardizer needs as many means as scales, at least one: {} and {}", p.mean.len(), p.scale.len()));
        }
        if let Some((i, s)) = p.scale.iter().enumerate().find(|(_, s)| !(s.is_finite() && **s > 0.0)) {
            return Err(format!("scale {s} of feature {i} is not a finite number > 0"));
        }
        if let Some((i, m)) = p.mean.iter().enumerate().find(|(_, m)| !m.is_finite()) {
            return Err(format!("mean {m} of feature {i} is not finite"));
        }
        Ok(Standardizer { mean: p.mean, scale: p.scale })
    }
}

impl Standardizer {
    /// Fits rows of `features` values each (`values` row-major, `[n, features]`). Errors when
    /// `values` is empty or not whole rows, or holds a NaN or infinity (named by row and
    /// feature).
    pub fn fit(values: &[f32], features: usize) -> Result<Standardizer> {
        const OP: &str = "Standardizer::fit";
        if features == 0 || values.is_empty() || !values.len().is_multiple_of(features) {
            return Err(Error::shape(OP, format!("{} values are not a whole number of rows of {features} features, at least one", values.len())));
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(Error::invalid(OP, format!("row {} feature {} is {}; every value must be finite", i / features, i % features, values[i])));
        }
        let n = (values.len() / features) as f64;
        let mut mean = vec![0.0f64; features];
        for row in values.chunks_exact(features) {
            for (m, &v) in mean.iter_mut().zip(row) {
                *m += f64::from(v);
            }
        }
        mean.iter_mut().for_each(|m| *m /= n);
        // Two passes (the mean first): no cancellation of the sum of squares on data far from 0.
        let mut var = vec![0.0f64; features];
        let (mut lo, mut hi) = (values[..features].to_vec(), values[..features].to_vec());
        for row in values.chunks_exact(features) {
            for (j, &v) in row.iter().enumerate() {
                var[j] += (f64::from(v) - mean[j]).powi(2);
                lo[j] = lo[j].min(v);
                hi[j] = hi[j].max(v);
            }
        }
        // Constant by comparison, not by a variance threshold: the rounding of the f64 mean can
        // leave a constant feature a variance of 1e-30, which would divide by almost nothing.
        let scale = var.iter().zip(lo.iter().zip(&hi)).map(|(v, (l, h))| if l == h { 1.0 } else { (v / n).sqrt() }).collect();
        Ok(Standardizer { mean, scale })
    }

    /// Fits a dataset's features, one per element of its sample shape.
    ///
    /// ```
    /// use tandem::data::{synthetic, Standardizer};
    /// let ds = synthetic::regression(20, 3, 0)?;
    /// let s = Standardizer::fit_features(&ds)?;
    /// let z = s.transform_features(&ds)?;
    /// let again = Standardizer::fit_features(&z)?;
    /// assert!(again.mean().iter().all(|m| m.abs() < 1e-6));
    /// assert!(again.scale().iter().all(|s| (s - 1.0).abs() < 1e-6));
    /// # Ok::<(), tandem::Error>(())
    /// ```
    pub fn fit_features(ds: &Dataset) -> Result<Standardizer> {
        ds.validate()?;
        Standardizer::fit(&ds.x, ds.sample_numel())
    }

    /// Fits a dataset's real-valued targets ([`Targets::Values`]), one feature per element of
    /// the per-sample shape; class targets are an error.
    pub fn fit_targets(ds: &Dataset) -> Result<Standardizer> {
        ds.validate()?;
        let (data, per) = values_of("Standardizer::fit_targets", &ds.y)?;
        Standardizer::fit(data, per)
    }

    /// Features per row.
    pub fn features(&self) -> usize {
        self.mean.len()
    }

    /// Each feature's mean.
    pub fn mean(&self) -> &[f64] {
        &self.mean
    }

    /// Each feature's scale: its standard deviation (`ddof = 0`), or 1 for a constant feature.
    pub fn scale(&self) -> &[f64] {
        &self.scale
    }

    /// `(x - mean) / scale` of rows of [`features`](Standardizer::features) values.
    pub fn transform(&self, values: &[f32]) -> Result<Vec<f32>> {
        self.map("Standardizer::transform", values, |v, m, s| (v - m) / s)
    }

    /// `x * scale + mean`: values in the units the standardizer was fitted on (predictions of
    /// standardised targets back in the targets' units).
    pub fn inverse_transform(&self, values: &[f32]) -> Result<Vec<f32>> {
        self.map("Standardizer::inverse_transform", values, |v, m, s| v * s + m)
    }

    /// The dataset with its features transformed.
    pub fn transform_features(&self, ds: &Dataset) -> Result<Dataset> {
        ds.validate()?;
        Ok(Dataset { x: self.transform(&ds.x)?, ..ds.clone() })
    }

    /// The dataset with its real-valued targets transformed; class targets are an error.
    pub fn transform_targets(&self, ds: &Dataset) -> Result<Dataset> {
        ds.validate()?;
        let (data, _) = values_of("Standardizer::transform_targets", &ds.y)?;
        let Targets::Values { shape_per_sample, .. } = &ds.y else { unreachable!("values_of accepts only Values") };
        let y = Targets::Values { data: self.transform(data)?, shape_per_sample: shape_per_sample.clone() };
        Ok(Dataset { x: ds.x.clone(), sample_shape: ds.sample_shape.clone(), y })
    }

    fn map(&self, op: &'static str, values: &[f32], f: impl Fn(f64, f64, f64) -> f64) -> Result<Vec<f32>> {
        let k = self.features();
        if !values.len().is_multiple_of(k) {
            return Err(Error::shape(op, format!("{} values are not whole rows of the {k} features fitted", values.len())));
        }
        let mut out = crate::backend::host::try_vec(values.len(), "host", op)?;
        for row in values.chunks_exact(k) {
            out.extend(row.iter().enumerate().map(|(j, &v)| f(f64::from(v), self.mean[j], self.scale[j]) as f32));
        }
        Ok(out)
    }
}

/// The values and their count per sample of real-valued targets.
fn values_of<'a>(op: &'static str, y: &'a Targets) -> Result<(&'a [f32], usize)> {
    match y {
        Targets::Values { data, .. } => Ok((data, y.per_sample())),
        _ => Err(Error::invalid(op, "the targets are class labels or token ids; only real-valued targets (Targets::Values) are standardised")),
    }
}
