//! The 128×128-tile hardware matmul (`tiled_wide_*`, what large products get on a real GPU)
//! on every wgpu adapter, forced for every product (`MatmulKernel::Tiled128`) so that small
//! shapes reach its edges: every way of loading each operand, odd M, N, K around the tile (128)
//! and K step (8) sizes, batches, offsets, the bias/ReLU epilogue and a K cut on the host; and
//! large products under the plain hardware profile, which choose that kernel by size.
#![cfg(feature = "wgpu")]
mod common;

use common::*;
use std::sync::OnceLock;
use tandem::backend::wgpu::{open_with, MatmulKernel, Options};
use tandem::backend::MatmulSpec;
use tandem::Device;

/// Every wgpu adapter under the hardware profile, with the matmul family `kernel`, opened once
/// for all the tests of this file: each pipeline is compiled once per adapter (about a second
/// on lavapipe and llvmpipe for a wide kernel: 64 accumulators spill a CPU's registers).
fn devices(kernel: MatmulKernel) -> &'static [Device] {
    static WIDE: OnceLock<Vec<Device>> = OnceLock::new();
    static TILED: OnceLock<Vec<Device>> = OnceLock::new();
    let once = if kernel == MatmulKernel::Tiled128 { &WIDE } else { &TILED };
    once.get_or_init(|| {
        let n = Device::list().iter().filter(|i| i.backend == tandem::BackendKind::Wgpu).count();
        let options = Options { hardware_profile: true, matmul: Some(kernel), ..Default::default() };
        (0..n).map(|i| Device::from_backend(open_with(i, options.clone()).expect("open_with"))).collect()
    })
}

fn spec(batch: usize, m: usize, n: usize, k: usize, trans: (bool, bool), offsets: (usize, usize)) -> MatmulSpec {
    let mut s = MatmulSpec::new(batch, m, n, k);
    (s.trans_a, s.trans_b) = trans;
    (s.a_offset, s.b_offset) = offsets;
    s
}

const TRANSPOSES: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

/// All 16 pairs of `TILE_LOADS` ways: each transpose pair (along K or along M/N) with each
/// operand aligned for vec4 loads (M, N, K, batch strides multiples of 4, offset 0) or not
/// (offset 1), over two row tiles and two column tiles, the second of each partial, and a K
/// of 3 steps of 8 the last partial (20: vec4 loads past K are whole quads).
#[test]
fn every_load_way_at_partial_tiles() {
    let _guard = shared();
    let cpu = Device::cpu();
    for dev in devices(MatmulKernel::Tiled128) {
        for trans in TRANSPOSES {
            for offsets in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                let s = spec(2, 132, 196, 20, trans, offsets);
                matmul_case(dev, &cpu, s, 70).unwrap_or_else(|e| panic!("{s:?} on {dev}: {e}"));
            }
        }
    }
}

/// Odd M and N just below, at and past 128, and K around the K step (8) and twice it, with
/// scalar loads along every dimension; a single element; a column and a row.
#[test]
fn odd_shapes_around_the_tile_and_k_step() {
    let _guard = shared();
    let cpu = Device::cpu();
    let shapes = [(127, 129, 9), (128, 128, 8), (129, 127, 7), (131, 1, 15), (1, 257, 16), (129, 130, 17), (1, 1, 1), (3, 5, 1)];
    for dev in devices(MatmulKernel::Tiled128) {
        for (i, (m, n, k)) in shapes.into_iter().enumerate() {
            let trans = TRANSPOSES[i % 4];
            let s = spec(1, m, n, k, trans, (0, 0));
            matmul_case(dev, &cpu, s, 71).unwrap_or_else(|e| panic!("{s:?} on {dev}: {e}"));
        }
    }
}

/// Batches: each entry its own A and B, a B shared by every entry (stride 0), odd batch
/// strides (scalar loads) and offsets into a larger buffer.
#[test]
fn batches_shared_operands_and_offsets() {
    let _guard = shared();
    let cpu = Device::cpu();
    for dev in devices(MatmulKernel::Tiled128) {
        let mut shared_b = spec(3, 130, 36, 12, (false, false), (8, 4));
        shared_b.b_batch_stride = 0;
        let mut odd_strides = spec(2, 33, 129, 11, (true, false), (3, 5));
        (odd_strides.a_batch_stride, odd_strides.b_batch_stride) = (33 * 11 + 3, 11 * 129 + 1);
        for s in [spec(3, 68, 140, 24, (false, true), (4, 8)), shared_b, odd_strides] {
            matmul_case(dev, &cpu, s, 72).unwrap_or_else(|e| panic!("{s:?} on {dev}: {e}"));
        }
    }
}

/// The bias (per row of C) and ReLU in the epilogue, over transposes, partial tiles and
/// batches, and on the last slice of a K past the host's 16,384 split (which also checks that
/// later slices add to what the first wrote).
#[test]
fn bias_relu_epilogue_and_k_past_the_split() {
    let _guard = shared();
    let cpu = Device::cpu();
    for dev in devices(MatmulKernel::Tiled128) {
        for case in [(2, 130, 25, 27, false), (1, 20, 131, 40, true), (1, 129, 6, 16_421, false)] {
            bias_relu_epilogue_case(dev, &cpu, case, 73, "the wide tiled kernel");
        }
    }
}

/// Under the plain hardware profile a product of at least 64 wide tiles takes the wide kernel
/// by size (a batch of 64 of 128×128, and 2 of 4×8 wide tiles with partial ones), a smaller
/// one the 64×64 kernel: the same products either way.
#[test]
fn hardware_profile_chooses_by_size() {
    let _guard = shared();
    let cpu = Device::cpu();
    for dev in devices(MatmulKernel::Tiled) {
        for s in [
            spec(64, 128, 128, 9, (false, false), (0, 0)),
            spec(2, 500, 1001, 9, (false, true), (0, 0)),
            spec(1, 128, 256, 9, (false, false), (0, 0)),
        ] {
            matmul_case(dev, &cpu, s, 74).unwrap_or_else(|e| panic!("{s:?} on {dev}: {e}"));
        }
    }
}
