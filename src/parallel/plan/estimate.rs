//! The cost of one layout: each layer's time per micro-batch on its stage, the best cut of
//! the layers into stages, and the step time and memory per device the planner predicts.
use super::{device_states, offloaded_states, shard, Cluster, Estimate, Layout, Shard, Workload};

/// The slowest device of replica `r`: its pace, and its weight in the batch shares.
pub(super) fn replica_speed(cluster: &Cluster, l: &Layout, r: usize) -> f64 {
    (0..l.pipeline)
        .flat_map(|s| (0..l.tensor).map(move |t| (s, t)))
        .map(|(s, t)| cluster.devices[l.device(r, s, t)].speed)
        .fold(f64::INFINITY, f64::min)
}

/// Replica `r`'s samples per micro-batch: data-parallel shares are proportional to the
/// replicas' speeds, so unequal devices finish together.
pub(super) fn micro_batch(work: &Workload, cluster: &Cluster, l: &Layout, r: usize) -> f64 {
    let total: f64 = (0..l.data).map(|q| replica_speed(cluster, l, q)).sum();
    work.batch as f64 * replica_speed(cluster, l, r) / total / l.micro_batches as f64
}

/// The slowest device of stage `s` of replica `r` (its tensor group).
fn stage_speed(cluster: &Cluster, l: &Layout, r: usize, s: usize) -> f64 {
    (0..l.tensor).map(|t| cluster.devices[l.device(r, s, t)].speed).fold(f64::INFINITY, f64::min)
}

/// Seconds of layer `i` per micro-batch on stage `s` of replica `r`, its tensor all-reduces
/// included.
fn layer_s(work: &Workload, cluster: &Cluster, l: &Layout, r: usize, s: usize, i: usize) -> f64 {
    let layer = &work.layers[i];
    let mb = micro_batch(work, cluster, l, r);
    let split = if layer.tensor_parallel { l.tensor as f64 } else { 1.0 };
    // Without stages, recomputation is the GPT's per block: only the blocks run twice.
    let forwards = if l.recompute && (l.pipeline > 1 || layer.tensor_parallel) { 2.0 } else { 1.0 };
    let passes = layer.forward_s * forwards + layer.backward_s;
    let mut t = passes * mb * cluster.contention_of(l.devices()) / stage_speed(cluster, l, r, s) / split + (forwards + 1.0) * layer.fixed_s;
    if layer.tensor_parallel && l.tensor > 1 {
        let group: Vec<usize> = (0..l.tensor).map(|k| l.device(r, s, k)).collect();
        t += 4.0 * cluster.group_link(&group).all_reduce_s(layer.output_bytes as f64 * mb, l.tensor);
    }
    t
}

/// The layer cut minimising the slowest stage, by dynamic programming over (stage, first
/// layer): each stage at its own devices' speed, the slowest replica's; stages start only
/// where `cuttable` allows. `None` when no cut is allowed.
pub(super) fn best_cuts(work: &Workload, cluster: &Cluster, l: &Layout, cuttable: &dyn Fn(usize) -> bool) -> Option<Vec<usize>> {
    let (n, p) = (work.layers.len(), l.pipeline);
    if p == 1 {
        return Some(Vec::new());
    }
    // Each layer's seconds on each (replica, stage), computed once: the search reads them for
    // every candidate range.
    let cost: Vec<Vec<Vec<f64>>> =
        (0..l.data).map(|r| (0..p).map(|s| (0..n).map(|i| layer_s(work, cluster, l, r, s, i)).collect()).collect()).collect();
    let stage_s = |s: usize, a: usize, b: usize| cost.iter().map(|rep| rep[s][a..b].iter().sum::<f64>()).fold(0.0, f64::max);
    // best[s][a]: the slowest stage of stages s.. over layers a..n; choice[s][a]: stage s's end.
    let mut best = vec![vec![f64::INFINITY; n + 1]; p + 1];
    let mut choice = vec![vec![n; n + 1]; p + 1];
    best[p][n] = 0.0;
    for s in (0..p).rev() {
        for a in 0..n {
            let left = p - s - 1;
            for b in (a + 1..=n - left).filter(|&b| b == n || cuttable(b)) {
                let v = stage_s(s, a, b).max(best[s + 1][b]);
                if v < best[s][a] {
                    best[s][a] = v;
                    choice[s][a] = b;
                }
            }
        }
    }
    if !best[0][0].is_finite() {
        return None;
    }
    let mut cuts = Vec::new();
    let mut a = 0;
    for stage_choice in &choice[..p - 1] {
        a = stage_choice[a];
        cuts.push(a);
    }
    Some(cuts)
}

/// The predicted step time and memory of `l`.
pub fn estimate(work: &Workload, cluster: &Cluster, l: &Layout) -> Estimate {
    let n = work.layers.len();
    let rounds = (l.micro_batches + l.pipeline - 1) as f64;
    let mut memory = vec![0u64; l.devices()];
    let (mut pipeline_s, mut compute_s, mut grad_sync, mut update_s) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    // Optimizer state tensors per parameter in host memory, and those left on the devices.
    let offloaded = offloaded_states(work, l);
    let states = if l.offload { 0 } else { device_states(work) };
    for r in 0..l.data {
        let mb = micro_batch(work, cluster, l, r);
        let (mut slowest, mut slowest_compute) = (0.0f64, 0.0f64);
        for s in 0..l.pipeline {
            let range = l.stage_layers(s, n);
            let compute: f64 = range.clone().map(|i| layer_s(work, cluster, l, r, s, i)).sum();
            let sends = if s + 1 < l.pipeline {
                let bytes = work.layers[range.end - 1].output_bytes as f64 * mb;
                2.0 * cluster.link(l.device(r, s, 0), l.device(r, s + 1, 0)).send_s(bytes)
            } else {
                0.0
            };
            slowest = slowest.max(compute + sends);
            slowest_compute = slowest_compute.max(compute);
            let split = |i: usize| if work.layers[i].tensor_parallel { l.tensor as u64 } else { 1 };
            // A tied copy inside the stage is the same tensor as its primary: counted once.
            let tied_here = |i: usize| work.layers[i].tied.filter(|(j, _)| range.contains(j)).map_or(0, |(_, b)| b);
            // Sizes saturate (and a saturated peak fits no device) rather than wrap into a small one.
            let params: u64 = range.clone().map(|i| work.layers[i].param_bytes.saturating_sub(tied_here(i)) / split(i)).fold(0, u64::saturating_add);
            let in_flight = l.micro_batches.min(l.pipeline - s) as f64;
            let activations = if l.recompute && l.pipeline == 1 {
                // The GPT's per-block recomputation (`Gpt::set_recompute`): each block (the
                // layers tensor parallelism splits) keeps only its input, one block's
                // intermediates live again in the backward, the other layers keep theirs.
                let input = |i: usize| if i == 0 { 0 } else { work.layers[i - 1].output_bytes };
                let own = |i: usize| work.layers[i].activation_bytes / split(i);
                let block = |i: &usize| work.layers[*i].tensor_parallel;
                let kept: f64 = range.clone().map(|i| (if block(&i) { input(i) } else { own(i) }) as f64).sum();
                let one_block = range.clone().filter(block).map(own).max().unwrap_or(0);
                in_flight * mb * kept + mb * one_block as f64
            } else if l.recompute {
                let input = if range.start == 0 { 0 } else { work.layers[range.start - 1].output_bytes };
                let one_layer = range.clone().map(|i| work.layers[i].activation_bytes / split(i)).max().unwrap_or(0);
                in_flight * mb * input as f64 + mb * one_layer as f64
            } else {
                in_flight * mb * range.clone().map(|i| (work.layers[i].activation_bytes / split(i)) as f64).sum::<f64>()
            };
            // The optimizer's update after the step, on the stage's slowest device.
            let updated = if l.shard == Shard::None { 1.0 } else { l.data as f64 };
            let slowest_speed = (0..l.tensor).map(|t| cluster.devices[l.device(r, s, t)].speed).fold(f64::INFINITY, f64::min);
            let update: f64 = range.clone().map(|i| work.layers[i].update_s / split(i) as f64).sum::<f64>() / updated / slowest_speed;
            // Offloaded state: each layer's share goes to the device and back around its update.
            let offload: f64 = range
                .clone()
                .filter(|_| offloaded > 0)
                .map(|i| cluster.within.send_s((work.layers[i].param_bytes / split(i)).saturating_mul(offloaded) as f64 / updated))
                .sum();
            let update = update + offload;
            update_s = update_s.max(update);
            // An offloaded update holds one parameter's state on the device at a time.
            let largest = |i: usize| match work.layers[i].largest_param_bytes {
                0 => work.layers[i].param_bytes,
                b => b,
            };
            let visiting = range.clone().map(|i| (largest(i) / split(i)).saturating_mul(offloaded)).max().unwrap_or(0);
            let visiting = (visiting as f64 / updated).ceil() as u64;
            // One device accumulating micro-batches runs as data parallelism of one replica.
            let accumulates = l.micro_batches > 1 && l.tensor == 1 && l.pipeline == 1;
            let bucket = range.clone().map(largest).max().unwrap_or(0).max(l.bucket_bytes());
            let grid = l.tensor > 1 || l.pipeline > 1;
            let state = shard::state_bytes(params, states, work.grad_dtype.size() as u64, l.shard, (l.data, accumulates), bucket, grid);
            let bytes = state.saturating_add(activations.ceil() as u64).saturating_add(visiting);
            for t in 0..l.tensor {
                memory[l.device(r, s, t)] = bytes;
            }
            if r == 0 {
                let replicas: Vec<usize> = (0..l.data).map(|q| l.device(q, s, 0)).collect();
                grad_sync = grad_sync.max(shard::sync_s(&cluster.group_link(&replicas), params as f64, l.shard, l.data, bucket, grid));
            }
        }
        pipeline_s = pipeline_s.max(rounds * slowest);
        compute_s = compute_s.max(rounds * slowest_compute);
    }
    let overhead_s = cluster.overhead_for(l);
    let step_s = pipeline_s + grad_sync + update_s + overhead_s;
    let bubble = (l.pipeline - 1) as f64 / rounds;
    let compute_s = compute_s + update_s;
    Estimate { layout: l.clone(), step_s, compute_s, comm_s: step_s - compute_s - overhead_s, bubble, overhead_s, memory }
}
