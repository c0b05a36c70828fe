//! Pipeline schedules as explicit per-stage action lists, and a dependency simulation that
//! checks a list runs to the end and measures its ideal bubble.
use crate::{Error, Result};
use std::fmt;

/// Which order each stage runs its micro-batches' forwards and backwards in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// All forwards, then all backwards (Huang et al. 2019): every micro-batch's activations
    /// are alive at once.
    GPipe,
    /// Stage `s` runs `p-1-s` warm-up forwards, then alternates one forward and one backward,
    /// then finishes the backwards (PipeDream-Flush): at most `p - s` micro-batches in flight.
    OneFOneB,
}

/// One unit of a stage's work on a micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Forward(usize),
    Backward(usize),
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Forward(mb) => write!(f, "F{mb}"),
            Action::Backward(mb) => write!(f, "B{mb}"),
        }
    }
}

/// The per-stage action lists of `kind` for `stages` stages and `micro_batches` micro-batches.
pub fn schedule(kind: Schedule, stages: usize, micro_batches: usize) -> Vec<Vec<Action>> {
    let m = micro_batches;
    (0..stages)
        .map(|s| match kind {
            Schedule::GPipe => (0..m).map(Action::Forward).chain((0..m).map(Action::Backward)).collect(),
            Schedule::OneFOneB => {
                let warmup = (stages - 1 - s).min(m);
                let mut list: Vec<Action> = (0..warmup).map(Action::Forward).collect();
                for i in 0..m - warmup {
                    list.push(Action::Forward(warmup + i));
                    list.push(Action::Backward(i));
                }
                list.extend((m - warmup..m).map(Action::Backward));
                list
            }
        })
        .collect()
}

/// Per-stage action lists, one line per stage: `stage 0: F0 F1 B0 F2 B1 B2`.
pub struct Plan<'a>(pub &'a [Vec<Action>]);

impl fmt::Display for Plan<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (s, list) in self.0.iter().enumerate() {
            let items: Vec<String> = list.iter().map(Action::to_string).collect();
            writeln!(f, "stage {s}: {}", items.join(" "))?;
        }
        Ok(())
    }
}

/// What running a plan with fixed action times gives.
#[derive(Clone, Debug, PartialEq)]
pub struct Simulation {
    /// Time the last action ends.
    pub makespan: f64,
    /// Each stage's (start, end) per action, in its list's order.
    pub timeline: Vec<Vec<(f64, f64)>>,
    /// Each stage's most micro-batches forwarded but not yet backwarded at once.
    pub max_in_flight: Vec<usize>,
    /// Idle stage time over `stages × makespan`.
    pub bubble: f64,
}

/// Runs `plan` as dataflow: each stage does its list in order, an action starting once its
/// inputs exist (forward of mb on `s` after forward of mb on `s-1`; backward of mb on `s` after
/// its own forward and the backward on `s+1`). Forwards take `forward_time`, backwards
/// `backward_time`. Errors if some micro-batch is missing or repeated on a stage, or if the
/// plan deadlocks (no stage can proceed while work remains).
pub fn simulate(plan: &[Vec<Action>], micro_batches: usize, forward_time: f64, backward_time: f64) -> Result<Simulation> {
    let p = plan.len();
    simulate_stages(plan, micro_batches, &vec![forward_time; p], &vec![backward_time; p])
}

/// [`simulate`] with each stage's own forward and backward time per micro-batch (stage `s`
/// takes `forward_time[s]` and `backward_time[s]`): the bubble a split of unequal stages
/// gives with free communication and no fixed costs.
pub fn simulate_stages(plan: &[Vec<Action>], micro_batches: usize, forward_time: &[f64], backward_time: &[f64]) -> Result<Simulation> {
    let p = plan.len();
    if forward_time.len() != p || backward_time.len() != p {
        return Err(Error::invalid(
            "pipeline schedule",
            format!("{p} stages but {} forward and {} backward times", forward_time.len(), backward_time.len()),
        ));
    }
    for (s, list) in plan.iter().enumerate() {
        for want in (0..micro_batches).flat_map(|mb| [Action::Forward(mb), Action::Backward(mb)]) {
            let n = list.iter().filter(|a| **a == want).count();
            if n != 1 {
                return Err(Error::invalid("pipeline schedule", format!("stage {s} has {want} {n} times, expected once")));
            }
        }
        if list.len() != 2 * micro_batches {
            return Err(Error::invalid("pipeline schedule", format!("stage {s} has {} actions for {micro_batches} micro-batches", list.len())));
        }
    }
    // end[s][mb] of forwards and backwards, once done.
    let mut f_end = vec![vec![None::<f64>; micro_batches]; p];
    let mut b_end = vec![vec![None::<f64>; micro_batches]; p];
    let mut next = vec![0usize; p];
    let mut free = vec![0.0f64; p];
    let mut timeline = vec![Vec::new(); p];
    let mut in_flight = vec![0usize; p];
    let mut max_in_flight = vec![0usize; p];
    loop {
        let mut progressed = false;
        for s in 0..p {
            while let Some(&a) = plan[s].get(next[s]) {
                let ready = match a {
                    Action::Forward(mb) => {
                        if s == 0 {
                            Some(0.0)
                        } else {
                            f_end[s - 1][mb]
                        }
                    }
                    Action::Backward(mb) => match (f_end[s][mb], if s + 1 == p { Some(0.0) } else { b_end[s + 1][mb] }) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        _ => None,
                    },
                };
                let Some(ready) = ready else { break };
                let start = ready.max(free[s]);
                let (end, slot) = match a {
                    Action::Forward(mb) => {
                        in_flight[s] += 1;
                        max_in_flight[s] = max_in_flight[s].max(in_flight[s]);
                        (start + forward_time[s], &mut f_end[s][mb])
                    }
                    Action::Backward(mb) => {
                        in_flight[s] -= 1;
                        (start + backward_time[s], &mut b_end[s][mb])
                    }
                };
                *slot = Some(end);
                free[s] = end;
                timeline[s].push((start, end));
                next[s] += 1;
                progressed = true;
            }
        }
        if next.iter().zip(plan).all(|(n, l)| *n == l.len()) {
            break;
        }
        if !progressed {
            let stuck: Vec<String> = (0..p).filter_map(|s| plan[s].get(next[s]).map(|a| format!("stage {s} at {a}"))).collect();
            return Err(Error::invalid("pipeline schedule", format!("deadlock: {}", stuck.join(", "))));
        }
    }
    let makespan = free.iter().copied().fold(0.0, f64::max);
    let busy: f64 = micro_batches as f64 * forward_time.iter().chain(backward_time).sum::<f64>();
    let bubble = if makespan > 0.0 { 1.0 - busy / (p as f64 * makespan) } else { 0.0 };
    Ok(Simulation { makespan, timeline, max_in_flight, bubble })
}

/// The textbook bubble fraction `(p-1)/(m+p-1)` of a pipeline with equal stages.
pub fn theoretical_bubble(stages: usize, micro_batches: usize) -> f64 {
    let (p, m) = (stages as f64, micro_batches as f64);
    if p + m <= 1.0 {
        return 0.0;
    }
    (p - 1.0) / (m + p - 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_f_one_b_lists_by_hand() {
        let plan = schedule(Schedule::OneFOneB, 3, 4);
        let text = Plan(&plan).to_string();
        assert_eq!(text, "stage 0: F0 F1 F2 B0 F3 B1 B2 B3\nstage 1: F0 F1 B0 F2 B1 F3 B2 B3\nstage 2: F0 B0 F1 B1 F2 B2 F3 B3\n");
    }

    #[test]
    fn simulated_bubble_matches_the_formula_for_equal_times() {
        for kind in [Schedule::GPipe, Schedule::OneFOneB] {
            for (p, m) in [(2, 1), (2, 4), (3, 8), (4, 4)] {
                let sim = simulate(&schedule(kind, p, m), m, 1.0, 1.0).unwrap();
                assert!((sim.bubble - theoretical_bubble(p, m)).abs() < 1e-9, "{kind:?} p={p} m={m}: {}", sim.bubble);
            }
        }
    }

    #[test]
    fn a_backward_before_its_forward_deadlocks() {
        let plan = vec![vec![Action::Backward(0), Action::Forward(0)]];
        let err = simulate(&plan, 1, 1.0, 1.0).unwrap_err().to_string();
        assert!(err.contains("deadlock"), "{err}");
    }

    #[test]
    fn unequal_stages_by_hand() {
        // GPipe, m = 2, stage 1 twice as slow: stage 0 F0 [0,1] F1 [1,2]; stage 1 F0 [1,3]
        // F1 [3,5] B0 [5,7] B1 [7,9]; stage 0 B0 [7,8] B1 [9,10]. Busy 12 of 2 x 10.
        let sim = simulate_stages(&schedule(Schedule::GPipe, 2, 2), 2, &[1.0, 2.0], &[1.0, 2.0]).unwrap();
        assert_eq!(sim.makespan, 10.0);
        assert!((sim.bubble - 0.4).abs() < 1e-12, "{}", sim.bubble);
        assert!(sim.bubble > theoretical_bubble(2, 2));
        let err = simulate_stages(&schedule(Schedule::GPipe, 2, 2), 2, &[1.0], &[1.0, 2.0]).unwrap_err().to_string();
        assert!(err.contains("2 stages") && err.contains("1 forward"), "{err}");
    }
}
