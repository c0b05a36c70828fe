//! The NCCL communicator: refusal of non-CUDA devices, the fallback of `for_devices`, and, where
//! CUDA GPUs and the NCCL library exist, every collective against `HostStaged`. Without them
//! the GPU test prints "skipped: ..." with the reason and passes.
#![cfg(feature = "nccl")]

mod common;
use common::{cpu_devices, rank_tensors, rank_values};
use tandem::backend::{cuda, BackendKind};
use tandem::parallel::comm::{self, Communicator, HostStaged, Nccl, ReduceKind};
use tandem::tolerance::assert_close;
use tandem::{Device, Error, Tensor};

fn host(ts: &[Tensor]) -> Vec<Vec<f32>> {
    ts.iter().map(|t| t.to_vec().unwrap()).collect()
}

#[test]
fn nccl_refuses_non_cuda_devices_by_name() {
    let devices = cpu_devices(2);
    match Nccl::new(&devices) {
        Err(Error::Invalid { op, detail }) => {
            assert_eq!(op, "Nccl");
            assert!(detail.contains("rank 0 is cpu") && detail.contains("not a CUDA device"), "{detail}");
        }
        Err(e) => panic!("expected an invalid-argument error, got {e}"),
        Ok(_) => panic!("NCCL accepted CPU devices"),
    }
    assert!(matches!(Nccl::new(&[]), Err(Error::Invalid { .. })));
}

#[test]
fn for_devices_falls_back_without_cuda() {
    for n in [1, 2, 3] {
        let c = comm::for_devices(&cpu_devices(n)).unwrap();
        assert_eq!(c.name(), "host-staged", "{n} CPU devices");
    }
}

/// Whether the library probe answers without panicking, and says what to install when it fails.
#[test]
fn probe_explains_a_missing_library() {
    match comm::nccl::probe() {
        Ok(version) => println!("NCCL {version}"),
        Err(Error::Unavailable { backend, reason }) => {
            assert_eq!(backend, "nccl");
            assert!(reason.contains("libnccl"), "{reason}");
            println!("no NCCL: {reason}");
        }
        Err(e) => panic!("unexpected probe error {e}"),
    }
}

/// One logical device per CUDA GPU (NCCL has one rank per GPU), or why there are none.
fn gpus(test: &str) -> Option<Vec<Device>> {
    let n = match cuda::probe() {
        Ok(0) => Err("the driver reports 0 CUDA devices".to_string()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    };
    let n = match n.and_then(|n| comm::nccl::probe().map(|_| n).map_err(|e| e.to_string())) {
        Ok(n) => n,
        Err(reason) => {
            println!("{test}: skipped: {reason}");
            return None;
        }
    };
    Some((0..n).map(|i| Device::open(BackendKind::Cuda, i).expect("a CUDA device opens")).collect())
}

#[test]
fn nccl_matches_host_staged() {
    let Some(devices) = gpus("nccl_matches_host_staged") else { return };
    let n = devices.len();
    let nccl = Nccl::new(&devices).expect("NCCL starts on the CUDA devices");
    println!("NCCL {} on {n} GPU(s)", nccl.version());
    let staged = HostStaged::new(&devices).unwrap();
    assert_eq!(comm::for_devices(&devices).unwrap().name(), "nccl");

    for shape in [vec![7usize], vec![2 * n + 1, 3], vec![1]] {
        for op in [ReduceKind::Sum, ReduceKind::Mean] {
            let (a, b) = (rank_tensors(&devices, &shape), rank_tensors(&devices, &shape));
            nccl.all_reduce(&a, op).unwrap();
            staged.all_reduce(&b, op).unwrap();
            for (r, (x, y)) in host(&a).iter().zip(host(&b)).enumerate() {
                assert_close(&format!("all_reduce {op:?} {shape:?} rank {r}"), x, &y, 1e-5, 1e-5);
            }
        }
        for root in 0..n {
            let (a, b) = (rank_tensors(&devices, &shape), rank_tensors(&devices, &shape));
            nccl.broadcast(&a, root).unwrap();
            staged.broadcast(&b, root).unwrap();
            assert_eq!(host(&a), host(&b), "broadcast {shape:?} from {root}");
        }
    }

    // Equal parts (ncclAllGather) and parts with different rows (grouped broadcasts).
    for rows in [vec![2; n], (0..n).map(|r| r + 1).collect()] {
        let parts: Vec<Tensor> =
            devices.iter().enumerate().map(|(r, d)| Tensor::from_vec(rank_values(r, rows[r] * 3), vec![rows[r], 3], d).unwrap()).collect();
        let (a, b) = (nccl.all_gather(&parts).unwrap(), staged.all_gather(&parts).unwrap());
        for (r, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x.dims(), y.dims());
            assert!(x.device().same(&devices[r]));
            assert_eq!(x.to_vec().unwrap(), y.to_vec().unwrap(), "all_gather rows {rows:?} rank {r}");
        }
    }

    // Rows that split evenly (ncclReduceScatter) and unevenly (grouped ncclReduce).
    for rows in [2 * n, 2 * n + 1] {
        for op in [ReduceKind::Sum, ReduceKind::Mean] {
            let ts = rank_tensors(&devices, &[rows, 3]);
            let (a, b) = (nccl.reduce_scatter(&ts, op).unwrap(), staged.reduce_scatter(&ts, op).unwrap());
            for (r, (x, y)) in a.iter().zip(&b).enumerate() {
                assert_eq!(x.dims(), y.dims());
                assert_close(&format!("reduce_scatter {rows} rows {op:?} rank {r}"), &x.to_vec().unwrap(), &y.to_vec().unwrap(), 1e-5, 1e-5);
            }
        }
    }

    let t = Tensor::from_vec(rank_values(0, 10), vec![2, 5], &devices[0]).unwrap();
    let moved = nccl.send_recv(&t, &devices[n - 1]).unwrap();
    assert!(moved.device().same(&devices[n - 1]));
    assert_eq!(moved.to_vec().unwrap(), rank_values(0, 10));
    if n > 1 {
        assert!(nccl.bytes_moved() > 0);
    }
}
