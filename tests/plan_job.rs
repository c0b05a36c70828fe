//! Planning a job of several processes without a launcher: the ranks' calibrations combined
//! into one cluster (speeds on rank 0's reference, a server per rank, alike devices at their
//! mean speed), only data parallelism over every device accepted, and the plan's shares
//! handed out in rank order.
use tandem::parallel::plan::{combine, job_unbuildable, plan_within, Cluster, DeviceSpec, LayerCost, Link, RankCalibration, Workload};
use tandem::Device;

fn layer(ms: f64) -> LayerCost {
    LayerCost {
        name: "layer".into(),
        forward_s: ms * 1e-3,
        backward_s: 2.0 * ms * 1e-3,
        fixed_s: 0.0,
        param_bytes: 1 << 20,
        largest_param_bytes: 1 << 20,
        activation_bytes: 1 << 10,
        output_bytes: 1 << 10,
        tensor_parallel: false,
        tied: None,
        update_s: 1e-4,
    }
}

/// A rank whose reference device runs each layer in `ms` (per sample), with devices named and
/// of speeds (relative to it) as `devices` says.
fn rank(ms: f64, devices: &[(&str, f64)]) -> RankCalibration {
    let link = Link { latency_s: 1e-6, bytes_per_s: 1e10 };
    let devices = devices.iter().map(|&(name, speed)| DeviceSpec { name: name.into(), speed, memory: 1 << 30, server: 0 }).collect();
    RankCalibration {
        work: Workload { layers: vec![layer(ms); 3], batch: 60, state_per_param_byte: 3, grad_dtype: tandem::DType::F32, offloaded_states: 0 },
        cluster: Cluster { devices, within: link, across: link, contention: 1.2, step_overheads: vec![], links: vec![] },
    }
}

fn speeds(cluster: &Cluster) -> Vec<f64> {
    cluster.devices.iter().map(|d| d.speed).collect()
}

#[test]
fn ranks_combine_on_rank_zeros_reference() {
    let across = Link { latency_s: 1e-4, bytes_per_s: 1e9 };
    // Rank 1's reference device is twice as slow as rank 0's; its second device half that.
    let (work, cluster, processes) = combine(&[rank(1.0, &[("a", 1.0)]), rank(2.0, &[("b", 1.0), ("c", 0.5)])], across, 1.5).unwrap();
    assert_eq!(work, rank(1.0, &[("a", 1.0)]).work);
    assert_eq!(speeds(&cluster), vec![1.0, 0.5, 0.25]);
    assert_eq!(cluster.devices.iter().map(|d| d.server).collect::<Vec<_>>(), vec![0, 1, 1]);
    assert_eq!(processes, vec![(0, 0), (1, 0), (1, 1)]);
    assert_eq!(cluster.across, across);
    assert_eq!(cluster.contention, 1.5);
    assert!(cluster.links.is_empty(), "no rank measured its pairs");
    // A rank's measured pair keeps its link in the job; pairs across ranks take `across`.
    let mut measured = rank(2.0, &[("b", 1.0), ("c", 0.5)]);
    let (inf, pair) = (Link { latency_s: 0.0, bytes_per_s: f64::INFINITY }, Link { latency_s: 5e-6, bytes_per_s: 3e9 });
    measured.cluster.links = vec![vec![inf, pair], vec![pair, inf]];
    let (_, cluster, _) = combine(&[rank(1.0, &[("a", 1.0)]), measured], across, 1.0).unwrap();
    assert_eq!((cluster.link(1, 2), cluster.link(2, 1)), (pair, pair));
    assert_eq!((cluster.link(0, 1), cluster.link(2, 0)), (across, across));
    // One kind of device timed a little apart on two ranks runs at its mean speed on both.
    let (_, cluster, _) = combine(&[rank(1.0, &[("cpu", 1.0)]), rank(1.1, &[("cpu", 1.0)])], across, 1.0).unwrap();
    let s = speeds(&cluster);
    assert!(s[0] == s[1] && (s[0] - (1.0 + 1.0 / 1.1) / 2.0).abs() < 1e-12, "{s:?}");
    // Ranks of different models are refused.
    let mut other = rank(1.0, &[("a", 1.0)]);
    other.work.layers.pop();
    assert!(combine(&[rank(1.0, &[("a", 1.0)]), other], across, 1.0).is_err());
}

#[test]
fn a_job_plans_data_parallelism_over_all_its_devices_with_shares_by_speed() {
    let across = Link { latency_s: 1e-4, bytes_per_s: 1e9 };
    let (work, cluster, processes) = combine(&[rank(1.0, &[("fast", 1.0)]), rank(2.0, &[("cpu", 1.0), ("cpu", 1.0)])], across, 1.0).unwrap();
    let n = cluster.devices.len();
    let mut p = plan_within(&work, &cluster, &|l, _| job_unbuildable(l, n)).unwrap();
    let l = &p.best.layout;
    assert_eq!((l.data, l.tensor, l.pipeline, l.recompute), (3, 1, 1, false), "{p}");
    assert!(p.rejected.iter().any(|r| r.why.contains("only data parallelism")), "{p}");
    assert!(p.rejected.iter().any(|r| r.why.contains("runs on all its 3 devices")), "{p}");
    // Rank 0's device is twice as fast: it takes half the batch.
    assert_eq!(p.shares, vec![30, 15, 15]);
    p.processes = processes;
    assert_eq!(p.job_weights(), Some(vec![30.0, 15.0, 15.0]));
    let cpu = |n: usize| (0..n).map(|_| Device::cpu_independent()).collect::<Vec<_>>();
    p.devices = vec!["fast".into(), "cpu".into(), "cpu".into()];
    p.check_rank_devices(1, &cpu(2)).unwrap();
    assert!(p.check_rank_devices(1, &cpu(1)).is_err());
    assert!(p.check_rank_devices(0, &cpu(1)).is_err(), "rank 0 was planned a device named fast");
    // A plan of one process is not a job's.
    p.processes.clear();
    assert!(p.job_weights().is_none());
    assert!(p.check_rank_devices(1, &cpu(2)).is_err());
}
