//! Ties between stages on different processes (cargo feature `mpi`): a language model's token
//! embedding on the first rank and its output projection on the last.
//!
//! At build the ranks agree on the ties (collective): every rank publishes its stages'
//! parameters (name, shape, dtype), the ties given to its builder and the ties its stages
//! declare ([`Module::tied_parameters`](crate::nn::Module::tied_parameters)); the ranks must
//! have been given the same ties, and each declared primary must be held by exactly one stage
//! of one rank. Then, as inside one process ([`super::tied`]): after the backward the copy's
//! rank sends the copy's gradient to the primary's rank, which adds it into the primary's (so
//! clipping's norm and the optimizers see the parameter once), and after each update the
//! primary's rank sends the new value back to the copy. The ties are walked in one order on
//! every rank and each message has its own tag, so the point-to-point messages pair up.
use super::remote::Across;
use super::tied::StageParam;
use crate::autograd::no_grad;
use crate::nn::Module;
use crate::parallel::stages::Stage;
use crate::{Error, Result, Tensor};
use std::collections::{BTreeMap, BTreeSet};

/// The tag of a tie's messages, apart from the pipeline's activations and gradients.
pub(super) const TIE_TAG: u16 = u16::MAX - 1;

/// A tie whose two sides sit on different ranks; stage indices are global.
pub(super) struct RemoteTie {
    pub primary: StageParam,
    pub copy: StageParam,
    primary_rank: usize,
    copy_rank: usize,
    /// This rank's side of the tie, if it holds one.
    here: Option<Side>,
}

enum Side {
    Primary(Tensor),
    Copy(Tensor),
}

/// A declared tie as its copy's rank sees it: the copy's global stage and name, and the
/// primary's name (its stage unknown there).
pub(super) type Declared = (usize, String, String);

/// One published fact, as a line of tab-separated fields.
fn line(rank: usize, fields: &[String]) -> String {
    std::iter::once(rank.to_string()).chain(fields.iter().cloned()).collect::<Vec<_>>().join("\t")
}

/// What every rank published: parameters by `(stage, name)` with their shape and dtype, the
/// ties each rank was given, and the declared ties.
struct Published {
    params: BTreeMap<StageParam, String>,
    given: Vec<BTreeSet<(StageParam, StageParam)>>,
    declared: Vec<Declared>,
}

fn publish(a: &Across, stages: &[Stage], given: &[(StageParam, StageParam)], declared: &[Declared]) -> Result<Published> {
    let rank = a.group.rank();
    let mut mine = Vec::new();
    for (i, s) in stages.iter().enumerate() {
        for (name, t) in s.model.parameters() {
            mine.push(line(rank, &["P".into(), (a.first + i).to_string(), name, format!("{:?} {:?}", t.dims(), t.dtype())]));
        }
    }
    for ((ps, pn), (cs, cn)) in given {
        mine.push(line(rank, &["G".into(), ps.to_string(), pn.clone(), cs.to_string(), cn.clone()]));
    }
    for (cs, cn, pn) in declared {
        mine.push(line(rank, &["D".into(), cs.to_string(), cn.clone(), pn.clone()]));
    }
    let mut out = Published { params: BTreeMap::new(), given: vec![BTreeSet::new(); a.group.size()], declared: Vec::new() };
    let bad = |l: &str| Error::invalid("Pipeline::tie", format!("a rank published {l:?}, which is not a tie or a parameter"));
    for l in a.group.all_gather_names(&mine)? {
        let f: Vec<&str> = l.split('\t').collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<usize>().ok()).ok_or_else(|| bad(&l));
        let text = |i: usize| f.get(i).map(|v| v.to_string()).ok_or_else(|| bad(&l));
        let from = num(0)?;
        match f.get(1).copied() {
            Some("P") => {
                out.params.insert((num(2)?, text(3)?), text(4)?);
            }
            Some("G") if from < out.given.len() => {
                out.given[from].insert(((num(2)?, text(3)?), (num(4)?, text(5)?)));
            }
            Some("D") => out.declared.push((num(2)?, text(3)?, text(4)?)),
            _ => return Err(bad(&l)),
        }
    }
    Ok(out)
}

/// The ties among every rank's stages that cross ranks, agreed by every rank (collective), the
/// copies set to their primaries' values. `given`: the ties given to this rank's builder,
/// global stage indices (those inside one rank included, which every rank must also be given);
/// `declared`: this rank's stages' declared copies whose primary no stage here holds.
pub(super) fn agree(a: &Across, stages: &[Stage], given: &[(StageParam, StageParam)], declared: &[Declared]) -> Result<Vec<RemoteTie>> {
    let p = publish(a, stages, given, declared)?;
    let all: BTreeSet<(StageParam, StageParam)> = p.given.iter().flatten().cloned().collect();
    for (r, set) in p.given.iter().enumerate() {
        if let Some(((ps, pn), (cs, cn))) = all.iter().find(|t| !set.contains(*t)) {
            let what =
                format!("rank {r} does not tie stage {cs}'s {cn} to stage {ps}'s {pn}, which another rank ties: give every rank the same ties");
            return Err(Error::invalid("Pipeline::tie", what));
        }
    }
    let rank_of = |s: usize| a.rank_of(s);
    let mut ties: BTreeSet<(StageParam, StageParam)> = all.into_iter().filter(|((ps, _), (cs, _))| rank_of(*ps) != rank_of(*cs)).collect();
    for (cs, cn, pn) in &p.declared {
        let holders: Vec<usize> = p.params.keys().filter(|(s, n)| n == pn && s != cs).map(|(s, _)| *s).collect();
        let declared = format!("stage {cs}'s {cn} is declared a copy of {pn}");
        let ps = match holders[..] {
            [s] => s,
            [] => return Err(Error::invalid("Pipeline", format!("{declared}, but no stage of any rank holds {pn}"))),
            _ => return Err(Error::invalid("Pipeline", format!("{declared}, which stages {holders:?} hold: tie it explicitly"))),
        };
        ties.insert(((ps, pn.clone()), (*cs, cn.clone())));
    }
    let mut used = BTreeSet::new();
    for ((ps, pn), (cs, cn)) in &ties {
        let shape = |s: usize, n: &str| {
            p.params.get(&(s, n.to_string())).cloned().ok_or_else(|| {
                let total = a.total;
                let why = if s < total {
                    format!("stage {s} (on rank {}) has no parameter {n}", rank_of(s))
                } else {
                    format!("stage {s} of {n}: the pipeline has {total} stages")
                };
                Error::invalid("Pipeline::tie", why)
            })
        };
        let (p_shape, c_shape) = (shape(*ps, pn)?, shape(*cs, cn)?);
        if p_shape != c_shape {
            return Err(Error::shape("Pipeline::tie", format!("stage {ps}'s {pn} is {p_shape}, stage {cs}'s {cn}, tied to it, is {c_shape}")));
        }
        for sp in [(*ps, pn), (*cs, cn)] {
            if !used.insert(sp) {
                let what = format!("stage {}'s {} is in two ties across processes; each parameter may be in one", sp.0, sp.1);
                return Err(Error::invalid("Pipeline::tie", what));
            }
        }
    }
    let here = |(s, n): &StageParam| -> Option<Tensor> {
        let local = s.checked_sub(a.first).filter(|&l| l < stages.len())?;
        stages[local].model.parameters().into_iter().find(|(pn, _)| pn == n).map(|(_, t)| t)
    };
    let out: Vec<RemoteTie> = ties
        .into_iter()
        .map(|(primary, copy)| {
            let side = here(&primary).map(Side::Primary).or_else(|| here(&copy).map(Side::Copy));
            RemoteTie { primary_rank: rank_of(primary.0), copy_rank: rank_of(copy.0), primary, copy, here: side }
        })
        .collect();
    sync(a, &out)?;
    Ok(out)
}

/// `body` (values from rank `src`) as a tensor shaped and typed like `like`, on its device.
fn tensor_like(body: Vec<f32>, like: &Tensor, src: usize, what: &str) -> Result<Tensor> {
    if body.len() != like.numel() {
        return Err(Error::shape("Pipeline::tie", format!("rank {src} sent {} values for {what}, which has {}", body.len(), like.numel())));
    }
    let t = Tensor::from_vec(body, like.dims().to_vec(), like.device())?;
    if t.dtype() == like.dtype() {
        Ok(t)
    } else {
        t.to_dtype(like.dtype())
    }
}

/// Sends each copy's gradient to its primary's rank, which adds it into the primary's; the
/// copy's is cleared (after the backward, before clipping and the update).
pub(super) fn sum_grads(a: &Across, ties: &[RemoteTie]) -> Result<()> {
    no_grad(|| {
        for t in ties {
            match &t.here {
                Some(Side::Copy(c)) => {
                    let body = c.grad().map(|g| g.to_vec()).transpose()?.unwrap_or_default();
                    a.group.send(&body, t.primary_rank, TIE_TAG)?;
                    c.set_grad(None);
                }
                Some(Side::Primary(p)) => {
                    let body = a.group.recv(t.copy_rank, TIE_TAG)?;
                    if body.is_empty() {
                        continue;
                    }
                    let like = p.grad().unwrap_or_else(|| p.clone());
                    let g = tensor_like(body, &like, t.copy_rank, &format!("the gradient of {}", t.copy.1))?;
                    p.set_grad(Some(match p.grad() {
                        Some(own) => own.add(&g)?,
                        None => g,
                    }));
                }
                None => {}
            }
        }
        Ok(())
    })
}

/// Sends each primary's value to its copy's rank, which takes it (after an update, or a load).
pub(super) fn sync(a: &Across, ties: &[RemoteTie]) -> Result<()> {
    no_grad(|| {
        for t in ties {
            match &t.here {
                Some(Side::Primary(p)) => a.group.send(&p.to_vec()?, t.copy_rank, TIE_TAG)?,
                Some(Side::Copy(c)) => {
                    let body = a.group.recv(t.primary_rank, TIE_TAG)?;
                    c.assign(&tensor_like(body, c, t.primary_rank, &t.primary.1)?)?;
                }
                None => {}
            }
        }
        Ok(())
    })
}

/// Whether `t` is this rank's copy side of a tie.
pub(super) fn is_copy(ties: &[RemoteTie], t: &Tensor) -> bool {
    ties.iter().any(|tie| matches!(&tie.here, Some(Side::Copy(c)) if c.id() == t.id()))
}

/// The `(primary, copy)` names of every tie, for filling a load's missing copies.
pub(super) fn names(ties: &[RemoteTie]) -> Vec<(String, String)> {
    ties.iter().map(|t| (t.primary.1.clone(), t.copy.1.clone())).collect()
}
