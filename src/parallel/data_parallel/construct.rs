//! Building a `DataParallel`: the replicas from the user's constructor (deferred under ZeRO-3),
//! the checks of the configuration, the first broadcast, the buckets, the owners or shards of
//! the parameters and one optimizer per replica.
use super::buckets::{self, assign_buckets};
use super::{shard, update, DataParallel, DataParallelConfig, Replica, Shard};
use crate::nn::Module;
use crate::parallel::comm::Communicator;
use crate::parallel::step::StepCore;
use crate::parallel::{Loss, OptimConfig};
use crate::{DType, Device, Error, Result, Tensor};

impl DataParallel {
    /// One replica per device of `comm`, `models[i]` on device `i`.
    pub(super) fn from_models(
        models: Vec<Box<dyn Module>>,
        comm: Box<dyn Communicator>,
        opt: &OptimConfig,
        loss: Loss,
        cfg: DataParallelConfig,
    ) -> Result<Self> {
        let devices = comm.devices().to_vec();
        let devices = &devices[..];
        let n = devices.len();
        if n == 0 {
            return Err(Error::invalid("DataParallel::new", "needs at least one device"));
        }
        for (i, (m, d)) in models.iter().zip(devices).enumerate() {
            if let Some((name, t)) = m.state_dict().into_iter().find(|(_, t)| !t.device().same(d)) {
                let (on, own) = crate::Device::names_of(t.device(), d);
                return Err(Error::invalid(
                    "DataParallel::new",
                    format!("replica {i}'s {name} is on {on}, not on {own}; build each replica on its device"),
                ));
            }
        }
        check_grad_dtype("DataParallel::new", &cfg)?;
        if cfg.micro_batches == 0 || cfg.deterministic_shards == 0 {
            return Err(Error::invalid("DataParallel::new", "micro_batches and deterministic_shards must be at least 1"));
        }
        if let Some(w) = &cfg.weights {
            let world = comm.device_span().1;
            if w.len() != n && w.len() != world {
                let job = if world > n { format!(" (or the job's {world})") } else { String::new() };
                return Err(Error::invalid("DataParallel::new", format!("{} split weights for {n} devices{job}", w.len())));
            }
            crate::parallel::split::proportional_split(n, w)?;
            if cfg.calibrate {
                return Err(Error::invalid("DataParallel::new", "give split weights or calibrate, not both"));
            }
        }
        if cfg.deterministic {
            // A kernel chosen by timing may differ from run to run; pinned, it cannot.
            devices.iter().for_each(|d| d.backend().pin_kernels());
        }
        let params: Vec<Vec<(String, Tensor)>> = models.iter().map(|m| m.parameters()).collect();
        let zero = matches!(cfg.shard, Shard::Grads | Shard::Full);
        if !zero {
            // ZeRO-2/3 broadcast parameter by parameter as they cut their pieces (`Sharded::new`).
            for p in 0..params[0].len() {
                let group: Vec<Tensor> = params.iter().map(|ps| ps[p].1.clone()).collect();
                comm.broadcast(&group, 0)?;
            }
        }
        let sizes: Vec<usize> = params[0].iter().map(|(_, t)| 4 * t.numel()).collect();
        let buckets = assign_buckets(&sizes, cfg.bucket_bytes);
        let bucket_of = buckets::bucket_of(&buckets, sizes.len());
        let (first, world) = comm.device_span();
        let owners = if zero {
            // Every piece has one owner by construction and is all-gathered to the others.
            None
        } else if cfg.shard == Shard::Optimizer {
            Some(update::assign_owners(&sizes, world))
        } else if !update::one_kernel_family(devices) {
            // One owner rather than ZeRO-1's balanced ones: one broadcast a step instead of one
            // per device, which waits on one download per device (see update.rs).
            Some(vec![0; sizes.len()])
        } else {
            None
        };
        let replicas: Vec<Replica> = models
            .into_iter()
            .zip(params)
            .enumerate()
            .map(|(i, (model, params))| Replica {
                device: devices[i].clone(),
                track: format!("dp{i}:{}", devices[i].spec()),
                index_of: params.iter().enumerate().map(|(p, (_, t))| (t.id(), p)).collect(),
                model,
                params,
            })
            .collect();
        let sharded = if zero { Some(shard::Sharded::new(cfg.shard, &replicas, &buckets, first, world, &*comm)?) } else { None };
        let params: Vec<&Vec<(String, Tensor)>> = match &sharded {
            Some(s) => s.values.iter().collect(),
            None => replicas.iter().map(|r| &r.params).collect(),
        };
        let opts = params
            .iter()
            .enumerate()
            .map(|(i, params)| {
                let mine = params.iter().enumerate().filter(|(p, _)| owners.as_ref().is_none_or(|o| o[*p] == first + i)).map(|(_, p)| p.clone());
                opt.build(mine.collect())
            })
            .collect::<Result<Vec<_>>>()?;
        let run = StepCore::new(loss, devices);
        Ok(DataParallel {
            replicas,
            opts,
            comm,
            run,
            split_weights: cfg.weights.clone(),
            cfg,
            buckets,
            bucket_of,
            owners,
            sharded,
            full_kept: false,
            gather_orders: Vec::new(),
            gathers: None,
            events: Vec::new(),
            overlap: None,
        })
    }
}

/// One replica per device from the user's constructor. Under ZeRO-3 each is built deferred
/// ([`build_deferred`](crate::tensor::build_deferred)): its parameters stay on the host until
/// sharded one by one, so a model larger than a device is never whole on it. Only replica 0's
/// parameters keep their host values; the others' are overwritten by its broadcast, so they are
/// dropped as each replica is built, and the host holds at most two copies at a time.
pub(super) fn built<M: Module>(build: &impl Fn(&Device) -> Result<M>, devices: &[Device], shard: Shard) -> Result<Vec<Box<dyn Module>>> {
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let m = if shard == Shard::Full {
                let m = crate::tensor::build_deferred(d, || build(d))?;
                if i > 0 {
                    m.parameters().iter().for_each(|(_, t)| crate::tensor::forget_host_values(t));
                }
                m
            } else {
                build(d)?
            };
            Ok(Box::new(m) as Box<dyn Module>)
        })
        .collect()
}

/// What a data axis (`op`) asks of `cfg.grad_dtype`: a half type only where gradients are
/// sharded (ZeRO-2/3), never an integer type.
pub(crate) fn check_grad_dtype(op: &'static str, cfg: &DataParallelConfig) -> Result<()> {
    if cfg.grad_dtype != DType::F32 && !matches!(cfg.shard, Shard::Grads | Shard::Full) {
        let what = format!("a {:?} gradient shard needs sharded gradients (Shard::Grads or Shard::Full), not {:?}", cfg.grad_dtype, cfg.shard);
        return Err(Error::invalid(op, what));
    }
    if cfg.grad_dtype == DType::I32 {
        return Err(Error::invalid(op, "gradients are kept in F32, Bf16 or F16, not I32"));
    }
    Ok(())
}
