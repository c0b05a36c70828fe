//! `tandem bench --bench allreduce`: the all-reduce across the job's processes (`mpirun -np
//! N`) of 4 KiB to 64 MiB, through tandem's `Hierarchical` communicator on each rank's
//! device (downloads and uploads included) and, in the same run and on the same bytes, a plain
//! `MPI_Allreduce` of host memory (rsmpi's `all_reduce_into`, `"backend":"mpi-raw"`), so that
//! the ratio shows what tandem adds. After timing a size, one more all-reduce of integers that differ
//! by rank checks every element's sum. Figures are algorithm bandwidth: buffer bytes over the
//! median time of one call, every call started together on every rank; the two kinds of call
//! alternate, so that a load on the machine that comes and goes weighs on both alike.
use super::devices::print_table;
use super::ranks::Ranks;
use super::{BenchArgs, LogFormat};
use std::time::Instant;
use tandem::dist::Order;
use tandem::parallel::comm::{Communicator, Hierarchical, ReduceKind};
use tandem::{Error, Result, Tensor};

/// Buffer sizes: 4 KiB to 64 MiB in powers of 4 (1 MiB at most with `--quick`).
fn sizes(quick: bool) -> Vec<usize> {
    let top = if quick { 1 << 20 } else { 64 << 20 };
    std::iter::successors(Some(4096usize), |b| Some(b * 4)).take_while(|&b| b <= top).collect()
}

/// Timed calls per size: about 256 MiB of buffer in all, at least 5 (2 with `--quick`).
fn reps(bytes: usize, quick: bool) -> usize {
    if quick {
        return 2;
    }
    (256usize << 20).div_ceil(bytes).clamp(5, 200)
}

/// One timed call, or `None` where there is nothing to time.
type Call<'a> = Option<Box<dyn FnMut() -> Result<()> + 'a>>;

/// One figure, `{"bench":"allreduce","backend","processes","bytes","gbps"}`.
#[derive(serde::Serialize)]
struct Figure {
    bench: &'static str,
    backend: String,
    processes: usize,
    bytes: usize,
    gbps: f64,
}

pub fn run(args: &BenchArgs, ranks: &Ranks) -> Result<()> {
    let devices = ranks.devices(&args.devices)?;
    let group = ranks.group();
    // Sums in MPI's order: the raw call's, so that the two figures compare like with like.
    let comm = Hierarchical::new(&devices, group.clone(), Order::Mpi)?;
    let backend = devices.iter().map(|d| d.spec()).collect::<Vec<_>>().join(",");
    let mut rows = Vec::new();
    for bytes in sizes(args.quick) {
        let n = bytes / 4;
        let reps = reps(bytes, args.quick);
        let values: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
        let tensors = devices.iter().map(|d| Tensor::from_vec(values.clone(), [n], d)).collect::<Result<Vec<_>>>()?;
        let mut raw = raw_mpi(ranks, &values);
        let mut both: [Call<'_>; 2] = [
            // Synced: an upload a backend only queues counts until it has landed.
            Some(Box::new(|| {
                comm.all_reduce(&tensors, ReduceKind::Sum)?;
                devices.iter().try_for_each(|d| d.sync())
            }) as Box<dyn FnMut() -> Result<()>>),
            raw.as_mut().map(|f| Box::new(f) as Box<dyn FnMut() -> Result<()>>),
        ];
        let times = timed(ranks, reps, &mut both)?;
        drop(both);
        check(&comm, &tensors, ranks, group.size())?;
        let names = [backend.clone(), "mpi-raw".to_string()];
        let figures = names.into_iter().zip(times).filter_map(|(backend, s)| {
            s.map(|s| Figure { bench: "allreduce", backend, processes: group.size(), bytes, gbps: bytes as f64 / s / 1e9 })
        });
        if !ranks.leader() {
            continue;
        }
        for f in figures {
            match args.log_format {
                LogFormat::Json => out!("{}", serde_json::to_string(&f).map_err(|e| Error::Msg(e.to_string()))?),
                LogFormat::Text => rows.push(vec![f.backend, f.processes.to_string(), f.bytes.to_string(), format!("{:.3} GB/s", f.gbps)]),
            }
        }
    }
    if ranks.leader() && args.log_format == LogFormat::Text {
        print_table(&["BACKEND", "PROCESSES", "BYTES", "ALGORITHM BANDWIDTH"], &rows);
    }
    Ok(())
}

/// One more all-reduce, of small integers whose sums are exact in any order: the first
/// device of rank `r` holds `i % 7 + r` at `i`, every other device `i % 7`. Every element must
/// hold its own sum, whatever path and chunks the communicator took.
fn check(comm: &Hierarchical, tensors: &[Tensor], ranks: &Ranks, size: usize) -> Result<()> {
    let rank = ranks.group().rank();
    let n = tensors.first().map_or(0, Tensor::numel);
    for (k, t) in tensors.iter().enumerate() {
        let shift = if k == 0 { rank } else { 0 };
        t.assign(&Tensor::from_vec((0..n).map(|i| (i % 7 + shift) as f32).collect(), [n], t.device())?)?;
    }
    comm.all_reduce(tensors, ReduceKind::Sum)?;
    let (copies, base) = (comm.device_span().1, size * (size - 1) / 2);
    for t in tensors {
        let got = t.to_vec()?;
        if let Some(i) = (0..n).find(|&i| got[i] != (copies * (i % 7) + base) as f32) {
            return Err(Error::Msg(format!(
                "bench allreduce: element {i} of {n} on {} (rank {rank}) is {}, not {}",
                t.device().spec(),
                got[i],
                copies * (i % 7) + base
            )));
        }
    }
    Ok(())
}

/// A call of rsmpi's `all_reduce_into` of `values` (into a buffer of its own), or `None` when
/// MPI is not running (one process, or built without the `mpi` feature).
#[cfg(feature = "mpi")]
fn raw_mpi<'a>(ranks: &Ranks, values: &'a [f32]) -> Option<impl FnMut() -> Result<()> + 'a> {
    use mpi::traits::*;
    if !ranks.many() {
        return None;
    }
    let world = mpi::topology::SimpleCommunicator::world();
    let mut recv = vec![0f32; values.len()];
    Some(move || {
        world.all_reduce_into(values, &mut recv[..], mpi::collective::SystemOperation::sum());
        Ok(())
    })
}

#[cfg(not(feature = "mpi"))]
fn raw_mpi(_: &Ranks, _: &[f32]) -> Option<fn() -> Result<()>> {
    None
}

/// Median seconds of one call of each of `calls` over `reps` rounds, after two warm-up rounds
/// (page faults, staging buffers); in each round the calls take turns, each started together
/// on every rank.
fn timed(ranks: &Ranks, reps: usize, calls: &mut [Call<'_>]) -> Result<Vec<Option<f64>>> {
    let mut s = vec![Vec::with_capacity(reps); calls.len()];
    for i in 0..reps + 2 {
        for (f, s) in calls.iter_mut().zip(&mut s) {
            let Some(f) = f else { continue };
            ranks.barrier()?;
            let t = Instant::now();
            f()?;
            if i >= 2 {
                s.push(t.elapsed().as_secs_f64());
            }
        }
    }
    Ok(s.into_iter()
        .map(|mut s| {
            s.sort_by(f64::total_cmp);
            s.get(s.len() / 2).copied()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_are_powers_of_four_from_4_kib() {
        assert_eq!(super::sizes(false), [4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20]);
        assert_eq!(super::sizes(true).last(), Some(&(1 << 20)));
    }
}
