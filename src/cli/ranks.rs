//! The command line under `mpirun`/`srun`: the process group of the job, which devices each
//! rank drives, the data-parallel strategy that spans the ranks, and what only rank 0 does.
//!
//! Every rank runs the same command with the same flags (checked first, see `same_run.rs`) and
//! checks its inputs itself; rank 0
//! alone prints, owns the checkpoint directory and writes the outputs, while the others wait at
//! a barrier. An error on any rank ends the whole job through `Group::abort`, naming the rank.
//! Started without a launcher, the group is this process alone and nothing here changes what
//! a command does.
use tandem::dist::{self, Group, Order};
use tandem::nn::Module;
use tandem::parallel::comm::Hierarchical;
use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Strategy};
use tandem::{Device, Error, Result};

/// This process's place in the job.
pub struct Ranks {
    group: Group,
}

impl Ranks {
    /// The launcher's process group (see [`dist::init`]), or this process alone.
    pub fn init() -> Result<Ranks> {
        Ok(Ranks { group: dist::init()? })
    }

    pub fn group(&self) -> &Group {
        &self.group
    }
    /// More than one process: the strategy must span them.
    pub fn many(&self) -> bool {
        self.group.size() > 1
    }
    /// Rank 0, which prints and writes files.
    pub fn leader(&self) -> bool {
        self.group.rank() == 0
    }

    /// This rank's devices: under a launcher `spec` names the machine's devices, shared out by
    /// local rank ([`dist::local_devices`]); alone, all of them.
    pub fn devices(&self, spec: &str) -> Result<Vec<Device>> {
        if self.many() {
            dist::local_devices(spec, &self.group)
        } else {
            Device::parse(spec)
        }
    }

    /// Refuses a strategy that does not span processes when the job has several: from the
    /// command line, data parallelism spans them, over one-device replicas (`data`, `auto`) or
    /// over tensor-parallel groups inside each process (`data,tensor`); for the GPT
    /// (`pipeline_across`) a pipeline does too, its stages (tensor-parallel groups with
    /// `--tensor`) over the processes in rank order.
    pub fn check_strategy(&self, kind: super::StrategyKind, pipeline_across: bool) -> Result<()> {
        use super::StrategyKind::{Auto, Data, DataTensor, Pipeline};
        if !self.many() || matches!(kind, Data | Auto | DataTensor) || (pipeline_across && kind == Pipeline) {
            return Ok(());
        }
        let name = format!("{kind:?}").to_lowercase();
        let also = if pipeline_across { ", pipeline" } else { "" };
        let what = format!("{name} runs inside one process; under {} processes use --strategy data, data,tensor{also} or auto", self.group.size());
        Err(Error::invalid("--strategy", what))
    }

    /// Data parallelism across the processes over this rank's `replicas` (tensor-parallel
    /// groups inside the process), each rank training its replicas' shares of every global
    /// batch (`DataGrid::across`), its data axis sharded as `cfg` says (`DataGrid::shard`).
    pub fn grid<R: tandem::parallel::Replica + 'static>(
        &self,
        replicas: Vec<R>,
        cfg: &DataParallelConfig,
        optim: &OptimConfig,
    ) -> Result<Box<dyn Strategy>> {
        Ok(Box::new(tandem::parallel::DataGrid::across(replicas, &self.group)?.shard(cfg, optim)?))
    }

    /// Data parallelism over this rank's `devices` and every other rank's, through NCCL across
    /// the processes when every rank's devices are CUDA GPUs (feature `nccl`, not
    /// `deterministic`), else `Hierarchical` (rank order sums with `deterministic`); replica 0
    /// of rank 0 initialises every replica. Each rank must be given the same global batches: it trains on its share.
    pub fn data_parallel<M: Module>(
        &self,
        build: impl Fn(&Device) -> Result<M>,
        devices: &[Device],
        optim: &OptimConfig,
        loss: Loss,
        cfg: DataParallelConfig,
    ) -> Result<Box<dyn Strategy>> {
        // The ranks may drive different kinds of device: NCCL only when every rank's are CUDA
        // GPUs, decided together so that all of them take the same branch.
        #[cfg(feature = "nccl")]
        if !cfg.deterministic && self.all_ranks(devices.iter().all(|d| d.info().backend == tandem::backend::BackendKind::Cuda))? {
            let comm = tandem::parallel::comm::Nccl::across(devices, &self.group)?;
            return Ok(Box::new(DataParallel::from_factory_with(build, Box::new(comm), optim, loss, cfg)?));
        }
        let order = if cfg.deterministic { Order::Ranks } else { Order::Mpi };
        let comm = Hierarchical::new(devices, self.group.clone(), order)?;
        Ok(Box::new(DataParallel::from_factory_with(build, Box::new(comm), optim, loss, cfg)?))
    }

    /// Whether `mine` holds on every rank (collective).
    #[cfg(feature = "nccl")]
    fn all_ranks(&self, mine: bool) -> Result<bool> {
        Ok(self.group.all_gather_u64(&[u64::from(mine)])?.iter().all(|v| v.first() == Some(&1)))
    }

    /// Waits for every rank (a no-op alone).
    pub fn barrier(&self) -> Result<()> {
        self.group.barrier()
    }

    /// Ends the job for an error on this rank: every rank's message names it. Alone, the error
    /// is returned for the usual message and exit status.
    pub fn fail<T>(&self, e: super::Failure) -> Result<T, super::Failure> {
        if self.many() {
            self.group.abort(&format!("error: {e}"));
        }
        Err(e)
    }
}
