//! A Megatron-LM parallel MLP block, `c_proj(act(c_fc(x)))` with `c_fc` column-parallel and
//! `c_proj` row-parallel over the same devices: a module a user places inside their own model.
use super::{ColumnParallelLinear, RowParallelLinear};
use crate::nn::{Linear, Module, GELU};
use crate::{Device, Error, Result, Tensor};

/// `c_proj(act(c_fc(x)))` split over devices: device `i` holds a slice of `c_fc`'s output rows
/// and the matching input columns of `c_proj`, so the hidden activation never leaves its
/// device. One reduction forward (the partial outputs summed on the first device, where the
/// output and `c_proj`'s bias live) and one backward (autograd sums the input's gradient over
/// the copies each device took of it).
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// use std::sync::Arc;
/// use tandem::nn::{Linear, Module, GELU};
/// use tandem::parallel::ParallelMlp;
/// let dev = || tandem::Device::from_backend(Arc::new(tandem::backend::cpu::CpuBackend::new()));
/// let (home, mut rng) = (dev(), tandem::rng(0));
/// let (fc, proj) = (Linear::new(4, 16, &mut rng, &home)?, Linear::new(16, 4, &mut rng, &home)?);
/// let mlp = ParallelMlp::from_linears(&fc, &proj, GELU::default(), &[home.clone(), dev()])?;
/// let x = tandem::Tensor::ones([2, 4], &home)?;
/// let want = proj.forward(&GELU::default().forward(&fc.forward(&x)?)?)?;
/// tandem::tolerance::check_close("mlp", &mlp.forward(&x)?.to_vec()?, &want.to_vec()?, 1e-6, 1e-5).map_err(tandem::Error::Msg)?;
/// # Ok(()) }
/// ```
pub struct ParallelMlp {
    c_fc: ColumnParallelLinear,
    c_proj: RowParallelLinear,
    act: GELU,
}

impl ParallelMlp {
    /// The MLP of `c_fc` (`[hidden, d]`) and `c_proj` (`[d_out, hidden]`) with activation
    /// `act`, the hidden features split over `devices` (the first holds the output).
    pub fn from_linears(c_fc: &Linear, c_proj: &Linear, act: GELU, devices: &[Device]) -> Result<Self> {
        let (hidden, takes) = (c_fc.weight.dims()[0], c_proj.weight.dims()[1]);
        if hidden != takes {
            let what =
                format!("c_fc weight {:?} gives {hidden} features but c_proj weight {:?} takes {takes}", c_fc.weight.shape(), c_proj.weight.shape());
            return Err(Error::shape("ParallelMlp", what));
        }
        // Both layers split `hidden` over the same devices the same way, so slice i of the
        // hidden activation meets slice i of c_proj's columns.
        Ok(ParallelMlp { c_fc: ColumnParallelLinear::from_linear(c_fc, devices)?, c_proj: RowParallelLinear::from_linear(c_proj, devices)?, act })
    }
    pub fn c_fc(&self) -> &ColumnParallelLinear {
        &self.c_fc
    }
    pub fn c_proj(&self) -> &RowParallelLinear {
        &self.c_proj
    }
    /// The unsplit `c_fc.weight`, `c_fc.bias`, `c_proj.weight`, `c_proj.bias` on the first
    /// device: what the same MLP without tensor parallelism would save.
    pub fn unsplit_state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = vec![("c_fc.weight".to_string(), self.c_fc.weight()?)];
        if let Some(b) = self.c_fc.bias()? {
            out.push(("c_fc.bias".into(), b));
        }
        out.push(("c_proj.weight".into(), self.c_proj.weight()?));
        if let Some(b) = self.c_proj.bias() {
            out.push(("c_proj.bias".into(), b));
        }
        Ok(out)
    }
}

impl Module for ParallelMlp {
    /// The output on the first device, whatever device `x` is on.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let hidden = self.c_fc.forward_shards(x)?.iter().map(|h| self.act.forward(h)).collect::<Result<Vec<_>>>()?;
        self.c_proj.forward_shards(&hidden)
    }
    /// `c_fc.weight.shard{i}`, `c_fc.bias.shard{i}`, `c_proj.weight.shard{i}`, `c_proj.bias`.
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("c_fc".into(), &self.c_fc), ("c_proj".into(), &self.c_proj)]
    }
    fn describe(&self) -> String {
        format!("ParallelMlp({}, {}, {:?})", self.c_fc.describe(), self.c_proj.describe(), self.act.approximate)
    }
}
