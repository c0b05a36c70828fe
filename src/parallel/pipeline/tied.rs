//! Parameters that two stages share (a language model's token embedding on the first stage and
//! its output projection on the last): each stage holds its own tensor, and the pipeline keeps
//! them one parameter.
//!
//! After every micro-batch's backward the copy's gradient is moved into the primary's (added:
//! one cross-device copy of the gradient per step), so the copy has none when the optimizers
//! run: clipping and weight decay see the parameter once, as PyTorch's `parameters()` of a
//! tied model does, and the optimizers skip the copy (no state for it, as for any parameter
//! without a gradient). The primary's update is then copied over the copy (one copy of the
//! weight per step): the two stay bit-identical even on devices of different backends.
use crate::autograd::no_grad;
use crate::nn::Module;
use crate::parallel::stages::Stage;
use crate::{Error, Result, Tensor};

/// A parameter as `(stage index, name in that stage's state_dict)`.
pub type StageParam = (usize, String);

/// One resolved tie.
pub(super) struct Tied {
    pub primary: StageParam,
    pub copy: StageParam,
    primary_t: Tensor,
    copy_t: Tensor,
}

fn find(stages: &[Stage], (s, name): &StageParam) -> Result<Tensor> {
    let stage = stages.get(*s).ok_or_else(|| Error::invalid("Pipeline::tie", format!("stage {s} of {name}: the pipeline has {} stages", stages.len())))?;
    stage.model.parameters().into_iter().find(|(n, _)| n == name).map(|(_, t)| t).ok_or_else(|| {
        let names: Vec<String> = stage.model.parameters().into_iter().map(|p| p.0).collect();
        Error::invalid("Pipeline::tie", format!("stage {s} on {} has no parameter {name}; it has {names:?}", stage.device))
    })
}

/// The ties the stages' modules declare ([`Module::tied_parameters`]) besides `given`: each
/// declared copy with the stage that holds its primary. A declared pair that is one tensor
/// needs no tie; a primary that no stage holds is an error (`spread`: the stages of other
/// processes are not here, and ties across processes are not supported).
pub(super) fn declared(stages: &[Stage], mut given: Vec<(StageParam, StageParam)>, spread: bool) -> Result<Vec<(StageParam, StageParam)>> {
    for (c, stage) in stages.iter().enumerate() {
        for (copy, primary) in stage.model.tied_parameters() {
            let holder = stages.iter().enumerate().find_map(|(p, s)| s.model.parameters().into_iter().find(|(n, _)| *n == primary).map(|(_, t)| (p, t)));
            let Some((p, primary_t)) = holder else {
                let why = if spread { "no stage of this process holds it (tied parameters across processes are not supported)" } else { "no stage holds it" };
                return Err(Error::invalid("Pipeline", format!("stage {c}'s {copy} is declared a copy of {primary}, but {why}")));
            };
            let copy_is_primary = stage.model.parameters().into_iter().any(|(n, t)| n == copy && t.id() == primary_t.id());
            let pair = ((p, primary), (c, copy));
            if !copy_is_primary && !given.contains(&pair) {
                given.push(pair);
            }
        }
    }
    Ok(given)
}

/// Checks each `(primary, copy)` pair and makes the copy equal to the primary.
pub(super) fn resolve(stages: &[Stage], ties: Vec<(StageParam, StageParam)>) -> Result<Vec<Tied>> {
    let mut out: Vec<Tied> = Vec::with_capacity(ties.len());
    for (primary, copy) in ties {
        let (p, c) = (find(stages, &primary)?, find(stages, &copy)?);
        let used = |sp: &StageParam| out.iter().any(|t| t.copy == *sp || t.primary == *sp);
        if p.id() == c.id() || primary == copy || used(&primary) || used(&copy) {
            return Err(Error::invalid("Pipeline::tie", format!("{primary:?} and {copy:?}: each tie needs two distinct parameters, each in one tie")));
        }
        if p.shape() != c.shape() || p.dtype() != c.dtype() {
            return Err(Error::shape("Pipeline::tie", format!("{primary:?} is {:?} {:?}, {copy:?} is {:?} {:?}", p.shape(), p.dtype(), c.shape(), c.dtype())));
        }
        c.assign(&p)?;
        out.push(Tied { primary, copy, primary_t: p, copy_t: c });
    }
    Ok(out)
}

/// Adds each copy's gradient into its primary's and clears the copy's.
pub(super) fn sum_grads(ties: &[Tied]) -> Result<()> {
    no_grad(|| {
        for t in ties {
            let Some(g) = t.copy_t.grad() else { continue };
            let g = g.to(t.primary_t.device())?;
            let sum = match t.primary_t.grad() {
                Some(p) => p.add(&g)?,
                None => g,
            };
            t.primary_t.set_grad(Some(sum));
            t.copy_t.set_grad(None);
        }
        Ok(())
    })
}

/// Copies each primary's value over its copy (after an update, or a load).
pub(super) fn sync(ties: &[Tied]) -> Result<()> {
    ties.iter().try_for_each(|t| t.copy_t.assign(&t.primary_t))
}

/// Whether `t` is the copy side of a tie.
pub(super) fn is_copy(ties: &[Tied], t: &Tensor) -> bool {
    ties.iter().any(|tie| tie.copy_t.id() == t.id())
}

pub(super) fn clear_copy_grads(ties: &[Tied]) {
    ties.iter().for_each(|t| t.copy_t.set_grad(None));
}

/// `state` for a load: a copy left out is filled from its primary's entry (a checkpoint of the
/// untied parameters); a copy given must equal its primary bit for bit.
pub(super) fn complete_state(ties: &[Tied], state: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
    let mut out = state.to_vec();
    for t in ties {
        let Some(primary) = state.iter().find(|(n, _)| *n == t.primary.1).map(|(_, v)| v.clone()) else { continue };
        match state.iter().find(|(n, _)| *n == t.copy.1) {
            None => out.push((t.copy.1.clone(), primary)),
            Some((_, given)) => {
                let same = given.shape() == primary.shape() && given.to_vec()?.iter().zip(primary.to_vec()?).all(|(a, b)| a.to_bits() == b.to_bits());
                if !same {
                    return Err(Error::invalid("load_state_dict", format!("{} differs from {}, to which it is tied", t.copy.1, t.primary.1)));
                }
            }
        }
    }
    Ok(out)
}
