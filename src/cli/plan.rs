//! `tandem plan` and the planner's part in `tandem train`: calibrate the model on the devices
//! (or scale it to a described cluster), search the layouts, print the plan and save it; and
//! for `train --strategy auto` / `--plan FILE`, the plan a run trains with, which a resumed run
//! takes from its checkpoint instead of planning again.
use super::{PlanArgs, TrainArgs};
use super::{Balance, ModelArg, OptimizerKind};
use tandem::data::Dataset;
use tandem::nn::Sequential;
use tandem::parallel::plan::{self, unbuildable, Cluster, Plan, REFERENCE_FLOPS};
use tandem::optim::OptimKind;
use tandem::parallel::{inputs_to_device, OptimConfig};
use tandem::{Device, Error, Result, Tensor};

/// Samples of the training data the calibration times each layer on (and twice as many).
const PROBE: usize = 16;

/// `tandem plan`: the plan for `train`'s flags on `--devices`, or on `--cluster`.
pub fn run(args: &PlanArgs, ranks: &super::ranks::Ranks) -> Result<()> {
    let t = &args.train;
    let ModelArg::Seed(kind) = t.model else {
        return Err(Error::invalid("--model", "tandem plan plans the seed models; the GPT's layouts are chosen by hand (--strategy)"));
    };
    if t.batch == 0 {
        return Err(Error::invalid("--batch", "must be at least 1"));
    }
    if let Some(path) = &args.save_plan {
        super::setup::check_output("--save-plan", path)?;
    }
    let optim = super::setup::optim_config(t, OptimizerKind::Sgd)?;
    let (train, _) = super::setup::DataSource::parse(&t.data)?.load(kind, t.seed)?;
    super::setup::check_fit(kind, &train, "training data")?;
    let model = kind.build(t.seed, &Device::cpu())?;
    let p = match &args.cluster {
        Some(name) => {
            let cluster = Cluster::parse(name)?;
            let p = on_cluster(&model, &train, t.batch, &optim, &cluster)?;
            out!("{p}");
            out!("{}", p.megatron(&cluster));
            p
        }
        None => {
            let devices = ranks.devices(&t.devices)?;
            let p = on_devices(&model, &train, t.batch, &optim, &devices)?;
            out!("{p}");
            p
        }
    };
    if let Some(path) = &args.save_plan {
        p.save(path)?;
        out!("plan written to {}", path.display());
    }
    Ok(())
}

/// The plan for training `model` on `devices` at `batch`, calibrated here, among the layouts
/// [`Plan::build`] can make.
pub fn on_devices(model: &Sequential, train: &Dataset, batch: usize, optim: &OptimConfig, devices: &[Device]) -> Result<Plan> {
    let probe = probe(train, &devices[0])?;
    let (work, cluster) = plan::measure(model, &probe, devices, batch, optimizer_states(optim))?;
    plan::plan_within(&work, &cluster, &|l, shares| unbuildable(l, shares, model))
}

/// The plan on a described cluster: the layers timed on this machine's CPU, scaled by its
/// measured matmul throughput to the cluster's reference GPU. Every layout is searched, as the
/// paper's strategies would build them, not only those [`Plan::build`] makes of a Sequential.
fn on_cluster(model: &Sequential, train: &Dataset, batch: usize, optim: &OptimConfig, cluster: &Cluster) -> Result<Plan> {
    let cpu = Device::cpu();
    let (work, _) = plan::measure(model, &probe(train, &cpu)?, std::slice::from_ref(&cpu), batch, optimizer_states(optim))?;
    plan::plan(&work.scaled(matmul_flops(&cpu)? / REFERENCE_FLOPS), cluster)
}

/// The plan `train` runs with: the one its checkpoint recorded when resuming, `--plan FILE`,
/// or a fresh one (`--strategy auto`). `--balance even` makes the data-parallel shares equal.
pub fn for_training(args: &TrainArgs, model: &Sequential, train: &Dataset, optim: &OptimConfig, devices: &[Device]) -> Result<Plan> {
    let mut p = match (recorded(args, devices)?, &args.plan) {
        (Some(p), _) => p,
        (None, Some(path)) => Plan::load(path, devices)?,
        (None, None) => on_devices(model, train, args.batch, optim, devices)?,
    };
    if p.batch != args.batch {
        return Err(Error::invalid("--plan", format!("the plan is for batches of {}, --batch is {}", p.batch, args.batch)));
    }
    if args.balance == Some(Balance::Even) && p.shares.len() > 1 {
        let n = p.shares.len();
        p.shares = (0..n).map(|i| p.batch / n + usize::from(i < p.batch % n)).collect();
    }
    Ok(p)
}

/// The plan a checkpoint of this run recorded (`--resume`), so the resumed run repeats its
/// layout and batch shares instead of measuring anew.
fn recorded(args: &TrainArgs, devices: &[Device]) -> Result<Option<Plan>> {
    let Some(dir) = args.checkpoint_dir.as_deref().filter(|_| args.resume) else { return Ok(None) };
    let Ok((ckpt, _)) = tandem::train::run_file::load_newest(dir, |_, _| {}) else { return Ok(None) };
    match ckpt.state.config.get("plan") {
        Some(v) => {
            let p: Plan = serde_json::from_value(v.clone()).map_err(|e| Error::format(&ckpt.path, format!("the recorded plan: {e}")))?;
            p.check_devices(devices).map_err(|e| Error::format(&ckpt.path, format!("the recorded plan: {e}")))?;
            Ok(Some(p))
        }
        None => Ok(None),
    }
}

/// Data-parallel batch weights for `--strategy data`: measured speeds unless `--balance even`,
/// or the devices are all alike (same name) and `--balance` is not given; the weights a
/// checkpoint recorded when resuming.
pub fn data_weights(args: &TrainArgs, model: &Sequential, train: &Dataset, devices: &[Device]) -> Result<Option<Vec<f64>>> {
    let differ = devices.windows(2).any(|w| w[0].spec() != w[1].spec());
    let measured = match args.balance {
        Some(Balance::Measured) => true,
        Some(Balance::Even) => false,
        None => differ,
    };
    if !measured || devices.len() < 2 {
        return Ok(None);
    }
    if let Some(dir) = args.checkpoint_dir.as_deref().filter(|_| args.resume) {
        if let Ok((ckpt, _)) = tandem::train::run_file::load_newest(dir, |_, _| {}) {
            if let Some(w) = ckpt.state.config.get("batch_weights").and_then(|v| serde_json::from_value::<Vec<f64>>(v.clone()).ok()) {
                return Ok(Some(w));
            }
        }
    }
    plan::measure_speeds(model, &probe(train, &devices[0])?, devices).map(Some)
}

/// The first [`PROBE`] samples of `train` on `device`.
fn probe(train: &Dataset, device: &Device) -> Result<Tensor> {
    let n = PROBE.min(train.len()).max(1);
    inputs_to_device(&train.batch(&(0..n).collect::<Vec<_>>())?, device)
}

/// Optimizer state tensors per parameter: SGD's momentum, Adam's two moments.
fn optimizer_states(optim: &OptimConfig) -> usize {
    match optim.optimizer {
        OptimKind::Sgd(c) => usize::from(c.momentum != 0.0),
        OptimKind::Adam(_) => 2,
    }
}

/// The device's f32 matmul throughput, best of three 256³ products.
fn matmul_flops(device: &Device) -> Result<f64> {
    let n = 256;
    let mut rng = tandem::rand::rng();
    let a = Tensor::randn([n, n], &mut rng, device)?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t0 = std::time::Instant::now();
        let c = a.matmul(&a)?;
        device.sync()?;
        best = best.min(t0.elapsed().as_secs_f64());
        drop(c);
    }
    Ok(2.0 * (n * n * n) as f64 / best.max(1e-9))
}
