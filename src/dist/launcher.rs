//! Which launcher started this process, read from the environment it sets for each rank.
use std::fmt;

/// A program that starts one process per rank and tells each its place through the environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// Open MPI's `mpirun`/`mpiexec` (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`).
    OpenMpi,
    /// A PMIx server (`PMIX_RANK`): Open MPI 5's `prterun`, Slurm's `srun --mpi=pmix`.
    Pmix,
    /// A PMI-1/2 launcher such as MPICH's Hydra (`PMI_RANK`, `PMI_SIZE`).
    Pmi,
    /// Slurm's `srun` with its own bootstrap (`SLURM_PROCID`, `SLURM_STEP_NUM_TASKS`).
    Slurm,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::OpenMpi => "mpirun (Open MPI)",
            Launcher::Pmix => "a PMIx launcher",
            Launcher::Pmi => "a PMI launcher",
            Launcher::Slurm => "srun (Slurm)",
        })
    }
}

/// What a launcher told this process: who started it, its rank, and the number of ranks when
/// the launcher says (PMIx alone does not put the size in the environment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub launcher: Launcher,
    pub rank: usize,
    pub size: Option<usize>,
}

/// The launcher whose variables `var` finds, most specific first. Slurm's batch script (one
/// process, before any `srun`) sets `SLURM_PROCID` too, so Slurm needs `SLURM_STEP_NUM_TASKS`,
/// which only a job step started by `srun` has.
pub fn detect(var: impl Fn(&str) -> Option<String>) -> Option<Launch> {
    let num = |name: &str| var(name).and_then(|v| v.trim().parse::<usize>().ok());
    let found = |launcher, rank: &str, size: &str| num(rank).map(|rank| Launch { launcher, rank, size: num(size) });
    found(Launcher::OpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
        .or_else(|| found(Launcher::Pmix, "PMIX_RANK", "PMIX_SIZE"))
        .or_else(|| found(Launcher::Pmi, "PMI_RANK", "PMI_SIZE"))
        .or_else(|| num("SLURM_STEP_NUM_TASKS").and_then(|_| found(Launcher::Slurm, "SLURM_PROCID", "SLURM_STEP_NUM_TASKS")))
}

/// `detect` on this process's environment.
pub fn from_env() -> Option<Launch> {
    detect(|name| std::env::var(name).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn launchers_are_told_apart() {
        assert_eq!(detect(env(&[])), None);
        let ompi = detect(env(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "3"), ("PMIX_RANK", "1")]));
        assert_eq!(ompi, Some(Launch { launcher: Launcher::OpenMpi, rank: 1, size: Some(3) }));
        let pmix = detect(env(&[("PMIX_RANK", "2")]));
        assert_eq!(pmix, Some(Launch { launcher: Launcher::Pmix, rank: 2, size: None }));
        let hydra = detect(env(&[("PMI_RANK", "0"), ("PMI_SIZE", "4")]));
        assert_eq!(hydra, Some(Launch { launcher: Launcher::Pmi, rank: 0, size: Some(4) }));
        let srun = detect(env(&[("SLURM_PROCID", "5"), ("SLURM_STEP_NUM_TASKS", "8")]));
        assert_eq!(srun, Some(Launch { launcher: Launcher::Slurm, rank: 5, size: Some(8) }));
    }

    #[test]
    fn a_slurm_batch_script_is_not_a_launch() {
        assert_eq!(detect(env(&[("SLURM_PROCID", "0"), ("SLURM_JOB_ID", "77")])), None);
        assert_eq!(detect(env(&[("OMPI_COMM_WORLD_RANK", "x")])), None);
    }
}
