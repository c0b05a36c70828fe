//! Validation metrics: the [`Metric`] trait and the usual ones (loss, accuracy, mean squared
//! error, R², perplexity), each accumulated over every batch of a validation pass.
use crate::data::{Batch, Targets};
use crate::parallel::{batch_to_device, Loss};
use crate::{Error, Result, Tensor};

/// A quantity measured over a validation pass: [`update`](Metric::update) sees each batch's
/// model output and the batch itself, [`finish`](Metric::finish) gives the value over all of
/// them and starts afresh. Implement it for a metric of your own.
///
/// ```
/// use tandem::data::Batch;
/// use tandem::train::Metric;
/// use tandem::{Result, Tensor};
/// /// The largest absolute output seen.
/// #[derive(Default)]
/// struct MaxAbs(f64);
/// impl Metric for MaxAbs {
///     fn name(&self) -> String { "max_abs".into() }
///     fn update(&mut self, output: &Tensor, _batch: &Batch) -> Result<()> {
///         let m = output.to_vec()?.iter().fold(0.0f64, |m, v| m.max(v.abs() as f64));
///         self.0 = self.0.max(m);
///         Ok(())
///     }
///     fn finish(&mut self) -> f64 { std::mem::take(&mut self.0) }
/// }
/// ```
pub trait Metric: Send {
    /// The name it is reported under (`val_loss`, `accuracy`, ...).
    fn name(&self) -> String;
    /// Accumulates one batch: `output` is the model's output for it, on the first device.
    fn update(&mut self, output: &Tensor, batch: &Batch) -> Result<()>;
    /// The value over every batch since the last `finish`, and a fresh start.
    fn finish(&mut self) -> f64;
}

/// The mean training loss over the samples of the source measured (each batch weighted by its
/// samples), reported as `val_loss` by [`Trainer::validate`](super::Trainer::validate) and
/// [`Trainer::evaluate`](super::Trainer::evaluate), and as `test_loss` (the source's name and
/// `_loss`) by [`validate_named`](super::Trainer::validate_named) and
/// [`evaluate_named`](super::Trainer::evaluate_named) with the name `test`.
pub struct MeanLoss {
    loss: Loss,
    sum: f64,
    samples: usize,
}

impl MeanLoss {
    pub fn new(loss: Loss) -> MeanLoss {
        MeanLoss { loss, sum: 0.0, samples: 0 }
    }
}

impl Metric for MeanLoss {
    fn name(&self) -> String {
        "val_loss".into()
    }
    fn update(&mut self, output: &Tensor, batch: &Batch) -> Result<()> {
        let (_, y) = batch_to_device(batch, output.device())?;
        let l = self.loss.compute(output, &y)?.to_scalar()? as f64;
        self.sum += l * batch.len() as f64;
        self.samples += batch.len();
        Ok(())
    }
    fn finish(&mut self) -> f64 {
        let v = self.sum / self.samples.max(1) as f64;
        (self.sum, self.samples) = (0.0, 0);
        v
    }
}

/// What a metric named `metric` is reported as when measured on a source named `source`:
/// `source_metric`, without the `val_` of a name that has one (`val_loss` on `test` is
/// `test_loss`, `accuracy` is `test_accuracy`); the metric's own name for a source without one.
///
/// ```
/// use tandem::train::metric::metric_name;
/// assert_eq!(metric_name(Some("test"), "val_loss"), "test_loss");
/// assert_eq!(metric_name(Some("test"), "accuracy"), "test_accuracy");
/// assert_eq!(metric_name(None, "val_loss"), "val_loss");
/// ```
pub fn metric_name(source: Option<&str>, metric: &str) -> String {
    match source {
        Some(source) => format!("{source}_{}", metric.strip_prefix("val_").unwrap_or(metric)),
        None => metric.to_string(),
    }
}

/// The fraction of class labels (or tokens) whose largest output is the right class.
#[derive(Default)]
pub struct Accuracy {
    correct: u64,
    total: u64,
}

impl Accuracy {
    pub fn new() -> Accuracy {
        Accuracy::default()
    }
}

impl Metric for Accuracy {
    fn name(&self) -> String {
        "accuracy".into()
    }
    fn update(&mut self, output: &Tensor, batch: &Batch) -> Result<()> {
        let labels = match &batch.y {
            Targets::Classes { labels, .. } => labels,
            Targets::Tokens { ids, .. } => ids,
            Targets::Values { .. } => return Err(Error::invalid("Accuracy", "targets are real values, not classes: use Mse or R2")),
        };
        let classes = output.dims().last().copied().unwrap_or(0);
        if classes == 0 || output.numel() != labels.len() * classes {
            return Err(Error::shape(
                "Accuracy",
                format!("outputs {:?} do not hold one row of class scores per label ({} labels)", output.shape(), labels.len()),
            ));
        }
        // The device's argmax (torch.argmax's rule): only one index per row is read back.
        let best = output.argmax(-1)?.to_vec_i32()?;
        self.correct += best.iter().zip(labels).filter(|(b, l)| b == l).count() as u64;
        self.total += labels.len() as u64;
        Ok(())
    }
    fn finish(&mut self) -> f64 {
        let v = self.correct as f64 / self.total.max(1) as f64;
        *self = Accuracy::default();
        v
    }
}

/// Sums per output column of real-valued targets: what MSE and R² are computed from.
#[derive(Default)]
struct Residuals {
    n: u64,
    sum_y: Vec<f64>,
    sum_y2: Vec<f64>,
    ss_res: Vec<f64>,
}

impl Residuals {
    fn update(&mut self, op: &'static str, output: &Tensor, batch: &Batch) -> Result<()> {
        let Targets::Values { data, .. } = &batch.y else {
            return Err(Error::invalid(op, "targets are class labels: use Accuracy"));
        };
        let pred = output.to_vec()?;
        if pred.len() != data.len() {
            return Err(Error::shape(op, format!("outputs {:?} against {} target values", output.shape(), data.len())));
        }
        let cols = data.len() / batch.len().max(1);
        if self.sum_y.len() != cols {
            if self.n > 0 {
                return Err(Error::shape(op, format!("{cols} target values per sample after {}", self.sum_y.len())));
            }
            *self = Residuals { n: 0, sum_y: vec![0.0; cols], sum_y2: vec![0.0; cols], ss_res: vec![0.0; cols] };
        }
        for (i, (&p, &y)) in pred.iter().zip(data).enumerate() {
            let c = i % cols.max(1);
            let (p, y) = (p as f64, y as f64);
            self.sum_y[c] += y;
            self.sum_y2[c] += y * y;
            self.ss_res[c] += (y - p) * (y - p);
        }
        self.n += batch.len() as u64;
        Ok(())
    }
}

/// Mean squared error over every target value (PyTorch's `MSELoss()`, sklearn's
/// `mean_squared_error`), reported as `mse`.
#[derive(Default)]
pub struct Mse(Residuals);

impl Mse {
    pub fn new() -> Mse {
        Mse::default()
    }
}

impl Metric for Mse {
    fn name(&self) -> String {
        "mse".into()
    }
    fn update(&mut self, output: &Tensor, batch: &Batch) -> Result<()> {
        self.0.update("Mse", output, batch)
    }
    fn finish(&mut self) -> f64 {
        let r = std::mem::take(&mut self.0);
        let values = r.n as f64 * r.sum_y.len() as f64;
        r.ss_res.iter().sum::<f64>() / values.max(1.0)
    }
}

/// The coefficient of determination, sklearn's `r2_score` (uniform average over output
/// columns; a constant column scores 1 when predicted exactly, else 0), reported as `r2`.
#[derive(Default)]
pub struct R2(Residuals);

impl R2 {
    pub fn new() -> R2 {
        R2::default()
    }
}

impl Metric for R2 {
    fn name(&self) -> String {
        "r2".into()
    }
    fn update(&mut self, output: &Tensor, batch: &Batch) -> Result<()> {
        self.0.update("R2", output, batch)
    }
    fn finish(&mut self) -> f64 {
        let r = std::mem::take(&mut self.0);
        let n = r.n as f64;
        let cols = r.sum_y.len();
        let score = |c: usize| {
            let ss_tot = r.sum_y2[c] - r.sum_y[c] * r.sum_y[c] / n;
            match (ss_tot > 0.0, r.ss_res[c] == 0.0) {
                (true, _) => 1.0 - r.ss_res[c] / ss_tot,
                (false, true) => 1.0,
                (false, false) => 0.0,
            }
        };
        (0..cols).map(score).sum::<f64>() / cols.max(1) as f64
    }
}

/// `exp` of the mean cross-entropy per token (or per sample for class labels): a language
/// model's perplexity, reported as `perplexity`.
#[derive(Default)]
pub struct Perplexity {
    sum: f64,
    count: u64,
}

impl Perplexity {
    pub fn new() -> Perplexity {
        Perplexity::default()
    }
}

impl Metric for Perplexity {
    fn name(&self) -> String {
        "perplexity".into()
    }
    fn update(&mut self, output: &Tensor, batch: &Batch) -> Result<()> {
        if matches!(batch.y, Targets::Values { .. }) {
            return Err(Error::invalid("Perplexity", "targets are real values, not tokens"));
        }
        let (_, y) = batch_to_device(batch, output.device())?;
        let mean = Loss::CrossEntropy.compute(output, &y)?.to_scalar()? as f64;
        let n = y.numel() as u64;
        self.sum += mean * n as f64;
        self.count += n;
        Ok(())
    }
    fn finish(&mut self) -> f64 {
        let v = (self.sum / self.count.max(1) as f64).exp();
        *self = Perplexity::default();
        v
    }
}
