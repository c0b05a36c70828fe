//! Where a `Split::Auto` pipeline stands: layers timed once, then the split corrected by the
//! stages' measured compute in the first steps.
use super::worker::Outcome;
use crate::data::Batch;
use crate::parallel::stages::{self, Stage};
use crate::parallel::OptimConfig;
use crate::Result;

/// The most steps whose measured stage times may move a `Split::Auto` split after the first.
const REFINE_STEPS: usize = 3;

pub(super) enum Balance {
    /// Fixed stages (`Split::At`, `Stages::Built`) or a split that no longer moves.
    Fixed,
    /// Nothing measured yet.
    Pending,
    /// Layer times (`[device][layer]`), steps left to correct them, and the stages' compute
    /// seconds in the last step.
    Refining { cost: Vec<Vec<f64>>, left: usize, busy: Option<Vec<f64>> },
}

impl Balance {
    /// Times the layers on one micro-batch of `part` and splits by those times, if nothing was
    /// measured yet.
    pub(super) fn first_split(&mut self, stages: &mut Vec<Stage>, part: &Batch, micro_batches: usize, opt: &OptimConfig) -> Result<()> {
        if let Balance::Pending = self {
            // Timed at the micro-batch size the stages will see: per-op costs that do not grow
            // with the batch weigh more on small micro-batches.
            let probe = stages::probe_input(part, part.len() / micro_batches, &stages[0].device)?;
            let cost = stages::rebalance(stages, &probe, opt)?;
            *self = Balance::Refining { cost, left: REFINE_STEPS, busy: None };
        }
        Ok(())
    }

    /// Records the stages' compute seconds of a step for the next correction (nothing once the
    /// split is fixed).
    pub(super) fn measured(&mut self, outcomes: &[Outcome]) {
        if let Balance::Refining { busy, .. } = self {
            *busy = Some(outcomes.iter().map(|o| o.compute_s).collect());
        }
    }

    /// Moves layers between stages when the last step's measured stage times say that another
    /// split is faster. Only `Pipeline::step` calls it, before a step: between a backward and
    /// its update, or under a [`PipelineGrid`](crate::parallel::PipelineGrid) whose replicas
    /// must keep the same stages, layers stay where they are.
    pub(super) fn correct(&mut self, stages: &mut Vec<Stage>, opt: &OptimConfig) -> Result<()> {
        let Balance::Refining { cost, left, busy: Some(busy) } = self else { return Ok(()) };
        let moved = stages::refine(stages, cost, busy, opt)?;
        *left -= 1;
        if !moved || *left == 0 {
            *self = Balance::Fixed;
        } else if let Balance::Refining { busy, .. } = self {
            *busy = None;
        }
        Ok(())
    }
}
