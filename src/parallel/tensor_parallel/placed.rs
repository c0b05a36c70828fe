//! Parameters placed over a tensor-parallel group (whole on the first device, split along a
//! dimension, or split by attention heads), and the one implementation of what every
//! tensor-parallel strategy does with them: each device's parameters for its optimizer, and
//! checkpoints (weights and optimizer state) in the unsplit model's names and shapes.
use super::attention::qkv_order;
use crate::autograd::no_grad;
use crate::optim::Optimizer;
use crate::{Device, Error, Result, Tensor};

/// How a logical (unsplit) parameter lies on the group's devices.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Placement {
    /// Whole, on the first device.
    Whole,
    /// Split along this dimension, slice `i` on device `i`.
    Split(usize),
    /// `c_attn`'s rows, split by heads: device `i` holds its heads' q, k and v rows.
    Qkv,
}

/// One logical tensor: its name, placement and the tensors that hold it (device order).
pub(crate) struct Logical {
    pub name: String,
    pub placement: Placement,
    pub parts: Vec<Tensor>,
    /// A parameter (given to an optimizer), or a buffer that checkpoints carry (BatchNorm's
    /// running statistics).
    pub trained: bool,
}

impl Logical {
    pub fn param(name: impl Into<String>, placement: Placement, parts: Vec<Tensor>) -> Self {
        Logical { name: name.into(), placement, parts, trained: true }
    }
    pub fn whole(name: impl Into<String>, t: Tensor) -> Self {
        Logical::param(name, Placement::Whole, vec![t])
    }
    /// Every tensor of `model`'s state_dict, whole (its parameters trained, its buffers not).
    pub fn all_of(model: &dyn crate::nn::Module) -> Vec<Logical> {
        let params: Vec<u64> = model.parameters().iter().map(|(_, t)| t.id()).collect();
        model.state_dict().into_iter().map(|(n, t)| Logical { trained: params.contains(&t.id()), ..Logical::whole(n, t) }).collect()
    }
    /// The whole tensor from per-device `parts` of this logical tensor (its values, a gradient
    /// or optimizer state), on `first`, without history.
    fn gather(&self, parts: &[Tensor], first: &Device) -> Result<Tensor> {
        no_grad(|| {
            let on_first = || parts.iter().map(|p| p.to(first)).collect::<Result<Vec<_>>>();
            match self.placement {
                Placement::Whole => parts[0].to(first),
                Placement::Split(d) => Tensor::cat(&on_first()?, d),
                Placement::Qkv => qkv_order(&Tensor::cat(&on_first()?, 0)?, parts.len(), false),
            }
        })
    }
    /// The unsplit shape.
    fn whole_dims(&self) -> Vec<usize> {
        let mut dims = self.parts[0].dims().to_vec();
        match self.placement {
            Placement::Whole => {}
            Placement::Split(d) => dims[d] = self.parts.iter().map(|p| p.dims()[d]).sum(),
            Placement::Qkv => dims[0] = self.parts.iter().map(|p| p.dims()[0]).sum(),
        }
        dims
    }
    /// Device `i`'s slice of `full` (the whole tensor, or state of its shape).
    fn slice(&self, full: &Tensor, i: usize) -> Result<Tensor> {
        let (dim, full) = match self.placement {
            Placement::Whole => return Ok(full.clone()),
            Placement::Split(d) => (d, full.clone()),
            Placement::Qkv => (0, qkv_order(full, self.parts.len(), true)?),
        };
        let start = self.parts[..i].iter().map(|p| p.dims()[dim]).sum();
        no_grad(|| full.narrow(dim, start, self.parts[i].dims()[dim]))
    }
}

/// A model's logical tensors over a tensor-parallel group, in state_dict order.
pub(crate) struct Placed {
    pub logical: Vec<Logical>,
    /// The group's first device, where gathered tensors are put.
    pub first: Device,
}

impl Placed {
    /// Device `i`'s parameters under their logical names, for its optimizer.
    pub fn device_params(&self, i: usize) -> Vec<(String, Tensor)> {
        self.logical.iter().filter(|l| l.trained).filter_map(|l| l.parts.get(i).map(|t| (l.name.clone(), t.clone()))).collect()
    }

    /// Each of the group's `devices` devices' parameters, in device order: a data-parallel
    /// grid's slots.
    pub fn slot_params(&self, devices: usize) -> Vec<Vec<(String, Tensor)>> {
        (0..devices).map(|i| self.device_params(i)).collect()
    }

    /// Every logical tensor gathered whole, in order.
    pub fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        self.logical.iter().map(|l| Ok((l.name.clone(), l.gather(&l.parts, &self.first)?))).collect()
    }

    /// Each logical parameter's gradient gathered whole (`None` where backward has not reached
    /// every part).
    pub fn gathered_grads(&self) -> Result<Vec<(String, Option<Tensor>)>> {
        self.logical
            .iter()
            .filter(|l| l.trained)
            .map(|l| {
                let grads: Option<Vec<Tensor>> = l.parts.iter().map(Tensor::grad).collect();
                Ok((l.name.clone(), grads.map(|g| l.gather(&g, &self.first)).transpose()?))
            })
            .collect()
    }

    /// A strict load of an unsplit state (`skipped` names what `state` may carry besides, such
    /// as a tied copy): every logical tensor present at its whole shape, nothing unknown; each
    /// device's parts take their slices. Errors name `op` and the tensors.
    pub fn load_state_dict(&self, op: &'static str, state: &[(String, Tensor)], skipped: &dyn Fn(&str, &Tensor) -> bool) -> Result<()> {
        let unexpected: Vec<&str> =
            state.iter().filter(|(n, t)| !skipped(n, t) && !self.logical.iter().any(|l| &l.name == n)).map(|p| p.0.as_str()).collect();
        let missing: Vec<&str> = self.logical.iter().filter(|l| !state.iter().any(|s| s.0 == l.name)).map(|l| l.name.as_str()).collect();
        if !missing.is_empty() || !unexpected.is_empty() {
            return Err(Error::invalid(
                op,
                format!("missing [{}], unexpected [{}]", crate::error::capped_list(missing), crate::error::capped_list(unexpected)),
            ));
        }
        for l in &self.logical {
            let full = &state.iter().find(|s| s.0 == l.name).expect("checked above").1;
            let want = l.whole_dims();
            if full.dims() != want {
                return Err(Error::shape(op, format!("{} is {:?}, the model's is {want:?}", l.name, full.shape())));
            }
            for (i, p) in l.parts.iter().enumerate() {
                p.assign(&l.slice(full, i)?)?;
            }
        }
        Ok(())
    }

    /// The logical parameter optimizer state `name` (`param.moment`) belongs to.
    pub fn owner(&self, name: &str) -> Option<&Logical> {
        let param = name.rsplit_once('.').map_or("", |(p, _)| p);
        self.logical.iter().find(|l| l.trained && l.name == param)
    }

    /// The optimizers' state (`opts[i]` over device `i`'s parameters), each gathered like its
    /// parameter, and the step count.
    pub fn optimizer_state(&self, opts: &[Box<dyn Optimizer>]) -> Result<(Vec<(String, Tensor)>, u64)> {
        self.gather_states(opts.iter().map(|o| o.state()).collect())
    }

    /// `per[i]`, device `i`'s optimizer state (its own optimizer's, or assembled from a data
    /// axis's shards of it), each entry gathered like its parameter; the step count.
    pub fn gather_states(&self, per: Vec<(Vec<(String, Tensor)>, u64)>) -> Result<(Vec<(String, Tensor)>, u64)> {
        let mut out = Vec::new();
        for (name, _) in &per[0].0 {
            let l = self.owner(name).ok_or_else(|| Error::Msg(format!("optimizer state {name} names no parameter")))?;
            let parts = per.iter().take(l.parts.len()).map(|(s, _)| s.iter().find(|x| &x.0 == name).map(|x| x.1.clone())).collect::<Option<Vec<_>>>();
            let parts = parts.ok_or_else(|| Error::Msg(format!("optimizer state {name} is missing on some device")))?;
            out.push((name.clone(), l.gather(&parts, &self.first)?));
        }
        Ok((out, per[0].1))
    }

    /// Gives each optimizer its devices' slices of an unsplit optimizer state.
    pub fn load_optimizer_state(&self, opts: &mut [Box<dyn Optimizer>], state: &[(String, Tensor)], steps: u64) -> Result<()> {
        let slices = self.slice_states(opts.len(), state)?;
        for (opt, mine) in opts.iter_mut().zip(slices) {
            opt.load_state(&mine, steps)?;
        }
        Ok(())
    }

    /// Each of `devices` devices' slices of an unsplit optimizer state, in device order.
    pub fn slice_states(&self, devices: usize, state: &[(String, Tensor)]) -> Result<Vec<Vec<(String, Tensor)>>> {
        (0..devices)
            .map(|i| {
                let mut mine = Vec::new();
                for (name, t) in state {
                    match self.owner(name) {
                        Some(l) if i < l.parts.len() => mine.push((name.clone(), l.slice(t, i)?)),
                        Some(_) => {}
                        None => return Err(Error::invalid("load_optimizer_state", format!("{name} names no parameter of the model"))),
                    }
                }
                Ok(mine)
            })
            .collect()
    }
}
