//! Collectives (HostStaged and PeerRing) against expectations computed on the host.
//!
//! Each test runs on independent CPU devices, groups of 2 and 3; set `TANDEM_TEST_DEVICES`
//! (for example `cpu,wgpu:0,wgpu:1`) to run the same checks on those devices instead.
mod common;
use common::{cpu_devices, rank_tensors, rank_values};
use tandem::parallel::comm::{self, Communicator, HostStaged, PeerRing, ReduceKind};
use tandem::tolerance::assert_close;
use tandem::{Device, Tensor};

/// The device groups to test: `TANDEM_TEST_DEVICES` if set, else 2 and 3 CPU devices.
fn groups() -> Vec<Vec<Device>> {
    match std::env::var("TANDEM_TEST_DEVICES") {
        Ok(spec) => vec![Device::parse(&spec).expect("TANDEM_TEST_DEVICES names devices")],
        Err(_) => vec![cpu_devices(2), cpu_devices(3)],
    }
}

/// Both algorithms over `devices`.
fn communicators(devices: &[Device]) -> Vec<Box<dyn Communicator>> {
    vec![Box::new(HostStaged::new(devices).unwrap()), Box::new(PeerRing::new(devices).unwrap())]
}

fn host_sum(n: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| (0..n).map(|r| rank_values(r, len)[i] as f64).sum::<f64>() as f32).collect()
}

#[test]
fn all_reduce_sum_and_mean_in_place() {
    // 7 elements on 2 or 3 devices: ring chunks of unequal size; 2 elements on 3: an empty chunk.
    for devices in groups() {
        let n = devices.len();
        for c in communicators(&devices) {
            for shape in [vec![7usize], vec![2, 3], vec![2]] {
                let len: usize = shape.iter().product();
                let ts = rank_tensors(&devices, &shape);
                c.all_reduce(&ts, ReduceKind::Sum).unwrap();
                for (r, t) in ts.iter().enumerate() {
                    assert_eq!(t.dims(), &shape[..], "{} keeps the shape", c.name());
                    assert!(t.device().same(&devices[r]));
                    assert_close(&format!("{} sum rank {r}", c.name()), &t.to_vec().unwrap(), &host_sum(n, len), 1e-6, 1e-6);
                }
                let ts = rank_tensors(&devices, &shape);
                c.all_reduce(&ts, ReduceKind::Mean).unwrap();
                let mean: Vec<f32> = host_sum(n, len).iter().map(|s| s / n as f32).collect();
                for t in &ts {
                    assert_close(&format!("{} mean", c.name()), &t.to_vec().unwrap(), &mean, 1e-6, 1e-6);
                }
            }
        }
    }
}

#[test]
fn broadcast_from_every_root() {
    for devices in groups() {
        for c in communicators(&devices) {
            for root in 0..devices.len() {
                let ts = rank_tensors(&devices, &[3, 2]);
                c.broadcast(&ts, root).unwrap();
                for t in &ts {
                    assert_close(&format!("{} broadcast from {root}", c.name()), &t.to_vec().unwrap(), &rank_values(root, 6), 0.0, 0.0);
                }
            }
            let ts = rank_tensors(&devices, &[2]);
            assert!(c.broadcast(&ts, devices.len()).is_err(), "root outside the group");
        }
    }
}

#[test]
fn all_gather_uneven_parts() {
    for devices in groups() {
        let n = devices.len();
        for c in communicators(&devices) {
            // Rank r holds r + 1 rows of 2.
            let parts: Vec<Tensor> =
                devices.iter().enumerate().map(|(r, d)| Tensor::from_vec(rank_values(r, 2 * (r + 1)), [r + 1, 2], d).unwrap()).collect();
            let want: Vec<f32> = (0..n).flat_map(|r| rank_values(r, 2 * (r + 1))).collect();
            let rows = n * (n + 1) / 2;
            let out = c.all_gather(&parts).unwrap();
            assert_eq!(out.len(), n);
            for (r, t) in out.iter().enumerate() {
                assert_eq!(t.dims(), &[rows, 2]);
                assert!(t.device().same(&devices[r]));
                assert_close(&format!("{} all_gather rank {r}", c.name()), &t.to_vec().unwrap(), &want, 0.0, 0.0);
            }
        }
    }
}

#[test]
fn reduce_scatter_uneven_rows() {
    for devices in groups() {
        let n = devices.len();
        for c in communicators(&devices) {
            // 5 rows of 3 over n devices: blocks of ceil/floor rows.
            let rows = 5;
            let ts = rank_tensors(&devices, &[rows, 3]);
            let sum = host_sum(n, rows * 3);
            for (kind, div) in [(ReduceKind::Sum, 1.0), (ReduceKind::Mean, n as f32)] {
                let out = c.reduce_scatter(&ts, kind).unwrap();
                let mut start = 0;
                for (r, t) in out.iter().enumerate() {
                    let len = rows / n + usize::from(r < rows % n);
                    assert_eq!(t.dims(), &[len, 3]);
                    assert!(t.device().same(&devices[r]));
                    let want: Vec<f32> = sum[start * 3..(start + len) * 3].iter().map(|v| v / div).collect();
                    assert_close(&format!("{} reduce_scatter {kind:?} rank {r}", c.name()), &t.to_vec().unwrap(), &want, 1e-6, 1e-6);
                    start += len;
                }
            }
            // The inputs are untouched.
            assert_close("inputs kept", &ts[0].to_vec().unwrap(), &rank_values(0, rows * 3), 0.0, 0.0);
            let few = rank_tensors(&devices, &[n - 1, 2]);
            assert!(c.reduce_scatter(&few, ReduceKind::Sum).is_err(), "fewer rows than devices");
        }
    }
}

#[test]
fn send_recv_and_byte_counts() {
    for devices in groups() {
        let n = devices.len() as u64;
        for c in communicators(&devices) {
            let src = Tensor::from_vec(rank_values(0, 4), [2, 2], &devices[0]).unwrap();
            let before = c.bytes_moved();
            let got = c.send_recv(&src, &devices[1]).unwrap();
            assert!(got.device().same(&devices[1]));
            assert_close("send_recv", &got.to_vec().unwrap(), &rank_values(0, 4), 0.0, 0.0);
            assert!(c.bytes_moved() > before);
            // An all-reduce of 12 elements: the ring sends 2(n-1)/n of it per device; host
            // staging moves it down and up once per device.
            let ts = rank_tensors(&devices, &[12]);
            let before = c.bytes_moved();
            c.all_reduce(&ts, ReduceKind::Sum).unwrap();
            let moved = c.bytes_moved() - before;
            let want = match c.name() {
                "peer-ring" => 2 * (n - 1) * 48,
                _ => 2 * n * 48,
            };
            assert_eq!(moved, want, "{} bytes for an all-reduce of 48 bytes on {n} devices", c.name());
        }
    }
}

#[test]
fn bad_groups_are_errors() {
    let devices = cpu_devices(2);
    for c in communicators(&devices) {
        let one = rank_tensors(&devices[..1], &[3]);
        assert!(c.all_reduce(&one, ReduceKind::Sum).is_err(), "one tensor for two devices");
        let swapped: Vec<Tensor> = rank_tensors(&devices, &[3]).into_iter().rev().collect();
        assert!(c.all_reduce(&swapped, ReduceKind::Sum).is_err(), "tensor on the wrong rank");
        let mixed = vec![rank_tensors(&devices[..1], &[3]).remove(0), Tensor::zeros([4], &devices[1]).unwrap()];
        assert!(c.all_reduce(&mixed, ReduceKind::Sum).is_err(), "different shapes");
    }
    assert!(comm::for_devices(&[]).is_err());
    assert_eq!(comm::for_devices(&devices).unwrap().name(), "host-staged", "CPU devices have no peer path");
}
