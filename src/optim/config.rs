//! `OptimConfig`: which optimizer, its settings and its parameter groups, as a value every
//! replica or pipeline stage builds its own optimizer from.
use super::{check_lr, Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use crate::{Error, Result, Tensor};
use std::fmt;
use std::sync::Arc;

/// Optimizer choice and settings; each device's replica or stage builds its own from it.
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// use tandem::nn::{Linear, Module};
/// use tandem::optim::{AdamConfig, OptimConfig, ParamGroups};
/// use tandem::Device;
/// let mut rng = tandem::rng(0);
/// let fc = Linear::new(4, 2, &mut rng, &Device::cpu())?;
/// // nanoGPT's AdamW: weight decay on matrices only, none on biases and norm weights.
/// let cfg = OptimConfig::adam(AdamConfig { lr: 6e-4, weight_decay: 0.1, ..AdamConfig::adamw() })
///     .with_groups(ParamGroups::no_decay_for_biases_and_norms());
/// let mut opt = cfg.build(fc.parameters())?;
/// opt.set_lr(3e-4); // the base lr; every group keeps its ratio to it
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct OptimConfig {
    pub optimizer: OptimKind,
    /// `None`: one group with the optimizer's own lr and weight decay.
    pub groups: Option<ParamGroups>,
    /// Keep the optimizer state in host memory (DeepSpeed's `offload_optimizer`): each
    /// parameter's state goes to its device for that parameter's update and back, so a device
    /// holds one parameter's state at a time. The update runs on the device with the same
    /// kernel, so results are bit for bit those without offload; each step moves the state
    /// over the bus both ways (AdamW: 16 bytes a parameter). With ZeRO it offloads each
    /// device's shard of the state. Not part of the run's recorded configuration: it changes
    /// where the state lives, not what is computed, so a run may resume with or without it.
    pub offload: bool,
}

/// The update rule and its base settings (the lr and weight decay of parameters whose group
/// does not override them).
#[derive(Clone, Copy, Debug)]
pub enum OptimKind {
    Sgd(SgdConfig),
    Adam(AdamConfig),
}

impl OptimConfig {
    pub fn sgd(cfg: SgdConfig) -> Self {
        OptimConfig { optimizer: OptimKind::Sgd(cfg), groups: None, offload: false }
    }
    /// Adam, or AdamW when `cfg.decoupled` (see [`AdamConfig::adamw`]).
    pub fn adam(cfg: AdamConfig) -> Self {
        OptimConfig { optimizer: OptimKind::Adam(cfg), groups: None, offload: false }
    }
    pub fn with_groups(mut self, groups: ParamGroups) -> Self {
        self.groups = Some(groups);
        self
    }
    /// The same optimizer with its state in host memory (see [`OptimConfig::offload`]).
    pub fn offloaded(mut self, offload: bool) -> Self {
        self.offload = offload;
        self
    }
    /// The base learning rate.
    pub fn lr(&self) -> f32 {
        match self.optimizer {
            OptimKind::Sgd(c) => c.lr,
            OptimKind::Adam(c) => c.lr,
        }
    }
    /// State tensors the optimizer keeps per parameter, each of the parameter's shape: SGD's
    /// momentum buffer (none without momentum), Adam's and AdamW's two moments.
    pub fn states_per_parameter(&self) -> u64 {
        match self.optimizer {
            OptimKind::Sgd(c) if c.momentum == 0.0 => 0,
            OptimKind::Sgd(_) => 1,
            OptimKind::Adam(_) => 2,
        }
    }
    /// State tensors per parameter that live on the parameter's device between steps: none
    /// when [offloaded](OptimConfig::offload) (the update holds one parameter's at a time).
    pub fn device_states_per_parameter(&self) -> u64 {
        if self.offload {
            0
        } else {
            self.states_per_parameter()
        }
    }
    /// An optimizer over `params`, each placed in its group by the rule.
    pub fn build(&self, params: Vec<(String, Tensor)>) -> Result<Box<dyn Optimizer>> {
        let groups = self.groups.as_ref();
        Ok(match self.optimizer {
            OptimKind::Sgd(c) => Box::new(Sgd::grouped(params, c, groups)?.with_state_offloaded(self.offload)),
            OptimKind::Adam(c) => Box::new(Adam::grouped(params, c, groups)?.with_state_offloaded(self.offload)),
        })
    }
}

/// Without groups this prints what the old `OptimConfig` enum printed (`Sgd(SgdConfig { .. })`),
/// so that run configs recorded in earlier checkpoints still match on resume.
impl fmt::Debug for OptimConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.optimizer {
            OptimKind::Sgd(c) => write!(f, "Sgd({c:?})")?,
            OptimKind::Adam(c) => write!(f, "Adam({c:?})")?,
        }
        match &self.groups {
            Some(g) => write!(f, " with {g:?}"),
            None => Ok(()),
        }
    }
}

/// One group's settings; `None` takes the optimizer's base value.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ParamGroup {
    /// The group's lr at the configured base lr; `set_lr` scales it with the base.
    pub lr: Option<f32>,
    pub weight_decay: Option<f32>,
}

/// Which group a parameter belongs to, from its name and tensor. Every replica and stage applies
/// the rule to its own named parameters, so it must give the same answer for a shard as for the
/// whole tensor (rank and name do; a size threshold would not).
///
/// An enum rather than a bare closure: the built-in rules print their meaning in `Debug`, which
/// the CLI records in a run's config and compares on resume; a closure cannot describe itself,
/// so `Custom` carries a label that stands for it.
#[derive(Clone)]
pub enum GroupRule {
    /// Parameters of rank below `n` go to group 1, the others to group 0.
    RankBelow(usize),
    /// The first pattern found in the parameter's name gives its group; no match: group 0.
    NameContains(Vec<(String, usize)>),
    /// Any rule; `label` stands for it in `Debug` output and run configs.
    Custom { label: String, rule: GroupFn },
}

/// A custom group rule: parameter name and tensor to group index.
pub type GroupFn = Arc<dyn Fn(&str, &Tensor) -> usize + Send + Sync>;

impl fmt::Debug for GroupRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupRule::RankBelow(n) => write!(f, "RankBelow({n})"),
            GroupRule::NameContains(p) => write!(f, "NameContains({p:?})"),
            GroupRule::Custom { label, .. } => write!(f, "Custom({label:?})"),
        }
    }
}

impl GroupRule {
    fn group_of(&self, name: &str, t: &Tensor) -> usize {
        match self {
            GroupRule::RankBelow(n) => usize::from(t.rank() < *n),
            GroupRule::NameContains(patterns) => patterns.iter().find(|(p, _)| name.contains(p.as_str())).map_or(0, |(_, g)| *g),
            GroupRule::Custom { rule, .. } => rule(name, t),
        }
    }
}

/// Parameter groups: a rule and the groups it indexes.
#[derive(Clone, Debug)]
pub struct ParamGroups {
    pub rule: GroupRule,
    pub groups: Vec<ParamGroup>,
}

impl ParamGroups {
    pub fn new(rule: GroupRule, groups: Vec<ParamGroup>) -> Self {
        ParamGroups { rule, groups }
    }
    /// PyTorch and nanoGPT practice: weight decay 0 on parameters of rank < 2 (biases, norm
    /// weights and biases), the base weight decay on matrices, embeddings and kernels.
    pub fn no_decay_for_biases_and_norms() -> Self {
        ParamGroups::new(GroupRule::RankBelow(2), vec![ParamGroup::default(), ParamGroup { lr: None, weight_decay: Some(0.0) }])
    }
}

/// Each parameter's group resolved against the base settings: what the update reads.
pub(crate) struct Resolved {
    group_of: Vec<usize>,
    /// Group lr over base lr, in f64 so that the configured base gives each group's lr exactly.
    lr_ratio: Vec<f64>,
    weight_decay: Vec<f32>,
}

impl Resolved {
    pub(crate) fn new(op: &'static str, groups: Option<&ParamGroups>, params: &[(String, Tensor)], lr: f32, weight_decay: f32) -> Result<Self> {
        check_lr(lr)?;
        check_decay(op, weight_decay)?;
        let Some(g) = groups else {
            return Ok(Resolved { group_of: vec![0; params.len()], lr_ratio: vec![1.0], weight_decay: vec![weight_decay] });
        };
        let mut group_of = Vec::with_capacity(params.len());
        for (name, t) in params {
            let i = g.rule.group_of(name, t);
            if i >= g.groups.len() {
                return Err(Error::invalid(
                    op,
                    format!("the group rule {:?} put parameter {name} {:?} in group {i}, but there are {} groups", g.rule, t.shape(), g.groups.len()),
                ));
            }
            group_of.push(i);
        }
        let mut lr_ratio = Vec::with_capacity(g.groups.len());
        let mut decays = Vec::with_capacity(g.groups.len());
        for (i, pg) in g.groups.iter().enumerate() {
            let glr = pg.lr.unwrap_or(lr);
            check_lr(glr)?;
            if lr == 0.0 && glr != 0.0 {
                return Err(Error::invalid(
                    op,
                    format!("group {i} has lr {glr} but the base lr is 0: a group keeps its ratio to the base lr, so give the base a nonzero lr"),
                ));
            }
            lr_ratio.push(if lr == 0.0 { 1.0 } else { glr as f64 / lr as f64 });
            let wd = pg.weight_decay.unwrap_or(weight_decay);
            check_decay(op, wd)?;
            decays.push(wd);
        }
        Ok(Resolved { group_of, lr_ratio, weight_decay: decays })
    }
    /// Parameter `i`'s lr when the base lr is `base`.
    pub(crate) fn lr(&self, i: usize, base: f32) -> f32 {
        (base as f64 * self.lr_ratio[self.group_of[i]]) as f32
    }
    pub(crate) fn weight_decay(&self, i: usize) -> f32 {
        self.weight_decay[self.group_of[i]]
    }
}

fn check_decay(op: &'static str, wd: f32) -> Result<()> {
    if !wd.is_finite() {
        return Err(Error::invalid(op, format!("weight decay must be finite, got {wd}")));
    }
    Ok(())
}
