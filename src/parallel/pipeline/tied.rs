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
use super::remote::Across;
use super::tied_across::{self, RemoteTie};
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
    let stage =
        stages.get(*s).ok_or_else(|| Error::invalid("Pipeline::tie", format!("stage {s} of {name}: the pipeline has {} stages", stages.len())))?;
    stage.model.parameters().into_iter().find(|(n, _)| n == name).map(|(_, t)| t).ok_or_else(|| {
        let names: Vec<String> = stage.model.parameters().into_iter().map(|p| p.0).collect();
        Error::invalid("Pipeline::tie", format!("stage {s} on {} has no parameter {name}; it has {names:?}", stage.device))
    })
}

/// The ties inside this process, and the declared copies whose primary is on another rank.
pub(super) type Resolved = (Vec<(StageParam, StageParam)>, Vec<super::tied_across::Declared>);

/// The ties the stages' modules declare ([`Module::tied_parameters`]) besides `given`: each
/// declared copy with the stage that holds its primary. A declared pair that is one tensor
/// needs no tie. A primary that no stage holds is an error, unless the pipeline spans
/// processes (`spread`: the first stage here is global stage `spread.unwrap()`): then the copy
/// is returned apart, `(global stage, copy, primary)`, for the ranks to resolve together.
pub(super) fn declared(stages: &[Stage], mut given: Vec<(StageParam, StageParam)>, spread: Option<usize>) -> Result<Resolved> {
    let mut elsewhere = Vec::new();
    for (c, stage) in stages.iter().enumerate() {
        for (copy, primary) in stage.model.tied_parameters() {
            let holder =
                stages.iter().enumerate().find_map(|(p, s)| s.model.parameters().into_iter().find(|(n, _)| *n == primary).map(|(_, t)| (p, t)));
            let Some((p, primary_t)) = holder else {
                if let Some(first) = spread {
                    elsewhere.push((first + c, copy, primary));
                    continue;
                }
                return Err(Error::invalid("Pipeline", format!("stage {c}'s {copy} is declared a copy of {primary}, but no stage holds it")));
            };
            let copy_is_primary = stage.model.parameters().into_iter().any(|(n, t)| n == copy && t.id() == primary_t.id());
            let pair = ((p, primary), (c, copy));
            if !copy_is_primary && !given.contains(&pair) {
                given.push(pair);
            }
        }
    }
    Ok((given, elsewhere))
}

/// Checks each `(primary, copy)` pair and makes the copy equal to the primary.
pub(super) fn resolve(stages: &[Stage], ties: Vec<(StageParam, StageParam)>) -> Result<Vec<Tied>> {
    let mut out: Vec<Tied> = Vec::with_capacity(ties.len());
    for (primary, copy) in ties {
        let (p, c) = (find(stages, &primary)?, find(stages, &copy)?);
        let used = |sp: &StageParam| out.iter().any(|t| t.copy == *sp || t.primary == *sp);
        if p.id() == c.id() || primary == copy || used(&primary) || used(&copy) {
            return Err(Error::invalid(
                "Pipeline::tie",
                format!("{primary:?} and {copy:?}: each tie needs two distinct parameters, each in one tie"),
            ));
        }
        if p.shape() != c.shape() || p.dtype() != c.dtype() {
            return Err(Error::shape(
                "Pipeline::tie",
                format!("{primary:?} is {:?} {:?}, {copy:?} is {:?} {:?}", p.shape(), p.dtype(), c.shape(), c.dtype()),
            ));
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

/// The `(primary, copy)` names of each tie.
pub(super) fn names(ties: &[Tied]) -> Vec<(String, String)> {
    ties.iter().map(|t| (t.primary.1.clone(), t.copy.1.clone())).collect()
}

/// `state` for a load, given the `(primary, copy)` names of the ties: a copy left out is
/// filled from its primary's entry (a checkpoint of the untied parameters); a copy given must
/// equal its primary bit for bit.
pub(super) fn complete_state(ties: &[(String, String)], state: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
    let mut out = state.to_vec();
    for (primary_name, copy_name) in ties {
        let Some(primary) = state.iter().find(|(n, _)| n == primary_name).map(|(_, v)| v.clone()) else { continue };
        match state.iter().find(|(n, _)| n == copy_name) {
            None => out.push((copy_name.clone(), primary)),
            Some((_, given)) => {
                let same = given.shape() == primary.shape() && given.to_vec()?.iter().zip(primary.to_vec()?).all(|(a, b)| a.to_bits() == b.to_bits());
                if !same {
                    return Err(Error::invalid("load_state_dict", format!("{copy_name} differs from {primary_name}, to which it is tied")));
                }
            }
        }
    }
    Ok(out)
}

/// A pipeline's ties: those inside this process and those to stages on other ranks.
#[derive(Default)]
pub(super) struct Ties {
    local: Vec<Tied>,
    remote: Vec<RemoteTie>,
}

impl Ties {
    /// The ties `given` to the builder and those the stages declare, checked, each copy set to
    /// its primary's value. Across processes (`across`, collective) `given` names global stage
    /// indices and every rank must be given the same ties; a pair inside this rank is tied
    /// here, a pair across ranks by [`tied_across`].
    pub fn new(stages: &[Stage], given: Vec<(StageParam, StageParam)>, across: Option<&Across>, balance_pending: bool) -> Result<Ties> {
        let (inside, all_given) = match across {
            Some(a) => {
                let here = |s: usize| a.rank_of(s) == a.group.rank() && s >= a.first && s - a.first < stages.len();
                let local = |((ps, pn), (cs, cn)): &(StageParam, StageParam)| ((ps - a.first, pn.clone()), (cs - a.first, cn.clone()));
                (given.iter().filter(|((ps, _), (cs, _))| here(*ps) && here(*cs)).map(local).collect(), given)
            }
            None => (given, Vec::new()),
        };
        let (inside, elsewhere) = declared(stages, inside, across.map(|a| a.first))?;
        if balance_pending && !(inside.is_empty() && elsewhere.is_empty()) {
            return Err(Error::invalid("Pipeline::tie", "tied parameters need fixed stages (Stages::Built or Split::At), not Split::Auto"));
        }
        let local = resolve(stages, inside)?;
        let remote = match across {
            Some(a) => tied_across::agree(a, stages, &all_given, &elsewhere)?,
            None => Vec::new(),
        };
        Ok(Ties { local, remote })
    }

    /// Clears the copies' gradients (before a backward).
    pub fn clear_copy_grads(&self) {
        clear_copy_grads(&self.local);
    }

    /// Adds each copy's gradient into its primary's, across processes too (collective there).
    pub fn sum_grads(&self, across: Option<&Across>) -> Result<()> {
        sum_grads(&self.local)?;
        match across {
            Some(a) => tied_across::sum_grads(a, &self.remote),
            None => Ok(()),
        }
    }

    /// Copies each primary's value over its copy, across processes too (collective there).
    pub fn sync(&self, across: Option<&Across>) -> Result<()> {
        sync(&self.local)?;
        match across {
            Some(a) => tied_across::sync(a, &self.remote),
            None => Ok(()),
        }
    }

    /// Whether `t` is the copy side of a tie.
    pub fn is_copy(&self, t: &Tensor) -> bool {
        is_copy(&self.local, t) || tied_across::is_copy(&self.remote, t)
    }

    /// `state` with the copies it leaves out filled from their primaries ([`complete_state`]).
    pub fn complete_state(&self, state: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        let mut pairs = names(&self.local);
        pairs.extend(tied_across::names(&self.remote));
        complete_state(&pairs, state)
    }
}
