//! The integer-indexing ops (`IndexOp`, with the plan of the embedding gradient) and the dtype
//! conversions (`CastOp`) of the `Backend` trait.
use crate::DType;

/// Indexing with I32 integers. `Gather` and `Scatter` are row-wise by class labels: `Gather`
/// reads `out[r] = x[r, idx[r]]` from `[rows, cols]`; `Scatter` writes `out[r, c] = (c ==
/// idx[r]) ? g[r] : 0`. `GatherRows` and `ScatterAddRows` are the embedding lookup and its
/// adjoint over a `[table_rows, cols]` table and `rows` ids: `GatherRows` writes `out[i, :] =
/// x[idx[i], :]` into `[rows, cols]`; `ScatterAddRows` writes `out[v, :] = Σ x[i, :]` over the
/// `i` whose id is `v`, summed from +0 in ascending `i`, into `[table_rows, cols]` from `x`
/// `[rows, cols]`, with `idx` a [`row_plan`] (so that every backend adds in one order, without
/// atomics, and a run's bits do not depend on thread counts). Labels and ids belong in range:
/// `Tensor` rejects others before it calls (`gather_rows`, `cross_entropy`, `index_select`), and
/// a backend called directly with one reads 0 and writes nothing for it, never out of bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexOp {
    Gather,
    Scatter,
    GatherRows { table_rows: usize },
    ScatterAddRows { table_rows: usize },
}

/// The plan `IndexOp::ScatterAddRows` reads for ids `ids` (each in `0..table_rows`; others are
/// left out): `row_ptr` (`table_rows + 1` entries) then `order` (one entry per id kept), where
/// `order[row_ptr[v]..row_ptr[v + 1]]` are the positions of id `v` in ascending order (a
/// counting sort, so building it is O(N + V)).
pub fn row_plan(ids: &[i32], table_rows: usize) -> Vec<i32> {
    let slot = |id: i32| usize::try_from(id).ok().filter(|&v| v < table_rows);
    let mut plan = vec![0i32; table_rows + 1];
    for &id in ids {
        if let Some(v) = slot(id) {
            plan[v + 1] += 1;
        }
    }
    for v in 0..table_rows {
        plan[v + 1] += plan[v];
    }
    let mut next: Vec<i32> = plan[..table_rows].to_vec();
    plan.resize(table_rows + 1 + plan[table_rows] as usize, 0);
    for (i, &id) in ids.iter().enumerate() {
        if let Some(v) = slot(id) {
            plan[table_rows + 1 + next[v] as usize] = i as i32;
            next[v] += 1;
        }
    }
    plan
}

/// Conversions between dtypes, elementwise over contiguous buffers: the 32-bit ones as raw
/// words ([`CastOp::word`]), F32 to and from the half types as [`CastOp::to_half`] and
/// [`CastOp::from_half`] define them (the `half` crate's conversions, as PyTorch's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CastOp {
    /// F32 to I32 toward zero, as PyTorch's `.to(torch.int32)`; beyond the I32 range the result
    /// saturates (±inf too), and NaN gives 0 (PyTorch leaves both undefined).
    F32ToI32,
    /// I32 to the nearest F32 (exact up to 2^24 in magnitude).
    I32ToF32,
    /// The high half `x >> 16` (arithmetic, so `floor(x / 65536)`) of an I32, as an exact F32.
    I32High,
    /// The low half `x & 0xFFFF` of an I32, as an exact F32: with the high half it compares
    /// I32 values exactly in F32 arithmetic (`x = 65536·high + low`).
    I32Low,
    /// F32 to bfloat16, rounding to nearest even; NaN stays a (quiet) NaN of the same sign.
    F32ToBf16,
    /// bfloat16 to F32, exactly.
    Bf16ToF32,
    /// F32 to IEEE binary16, rounding to nearest even; beyond 65504 (after rounding) ±inf,
    /// below 2^-24 toward ±0 through the subnormals; NaN stays a quiet NaN of the same sign.
    F32ToF16,
    /// IEEE binary16 to F32, exactly (subnormals included).
    F16ToF32,
}

impl CastOp {
    pub const ALL: [CastOp; 8] = [
        CastOp::F32ToI32,
        CastOp::I32ToF32,
        CastOp::I32High,
        CastOp::I32Low,
        CastOp::F32ToBf16,
        CastOp::Bf16ToF32,
        CastOp::F32ToF16,
        CastOp::F16ToF32,
    ];
    /// Stable small integer passed to kernels; the WGSL and CUDA kernels use the same codes.
    pub fn code(self) -> u32 {
        self as u32
    }
    /// The conversion of one element between 32-bit dtypes, as raw words: the definition every
    /// kernel follows. A half cast takes one value per word here (see `to_half`, `from_half`).
    pub fn word(self, w: u32) -> u32 {
        match self {
            // Rust's `as` truncates toward zero, saturates and maps NaN to 0: the documented rule.
            CastOp::F32ToI32 => f32::from_bits(w) as i32 as u32,
            CastOp::I32ToF32 => (w as i32 as f32).to_bits(),
            CastOp::I32High => (((w as i32) >> 16) as f32).to_bits(),
            CastOp::I32Low => ((w & 0xFFFF) as f32).to_bits(),
            CastOp::F32ToBf16 | CastOp::F32ToF16 => u32::from(self.to_half(f32::from_bits(w))),
            CastOp::Bf16ToF32 | CastOp::F16ToF32 => self.from_half(w as u16).to_bits(),
        }
    }
    /// The bits of `x` as this cast's half type (`F32ToBf16` or `F32ToF16`; any other op gives
    /// the bfloat16 bits).
    pub fn to_half(self, x: f32) -> u16 {
        match self {
            CastOp::F32ToF16 => half::f16::from_f32(x).to_bits(),
            _ => half::bf16::from_f32(x).to_bits(),
        }
    }
    /// The value of half bits `h` of this cast's source type (`Bf16ToF32` or `F16ToF32`; any
    /// other op reads bfloat16). bfloat16 widens by a shift, as PyTorch's, so even a signaling
    /// NaN keeps its bits; binary16 widens as the `half` crate (and x86's F16C), which quiets one.
    pub fn from_half(self, h: u16) -> f32 {
        match self {
            CastOp::F16ToF32 => half::f16::from_bits(h).to_f32(),
            _ => f32::from_bits(u32::from(h) << 16),
        }
    }
    /// The dtypes read and written.
    pub fn dtypes(self) -> (DType, DType) {
        match self {
            CastOp::F32ToI32 => (DType::F32, DType::I32),
            CastOp::I32ToF32 | CastOp::I32High | CastOp::I32Low => (DType::I32, DType::F32),
            CastOp::F32ToBf16 => (DType::F32, DType::Bf16),
            CastOp::Bf16ToF32 => (DType::Bf16, DType::F32),
            CastOp::F32ToF16 => (DType::F32, DType::F16),
            CastOp::F16ToF32 => (DType::F16, DType::F32),
        }
    }
    /// The cast of the first `len` elements of `x` (little-endian bytes of the source dtype)
    /// into the target dtype's bytes, on the host: the reference, and the trait's default.
    pub fn host(self, x: &[u8], len: usize) -> Vec<u8> {
        let (from, to) = self.dtypes();
        let x = &x[..len * from.size()];
        match (from.is_half(), to.is_half()) {
            (false, true) => x.chunks_exact(4).flat_map(|c| self.to_half(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes()).collect(),
            (true, _) => x.chunks_exact(2).flat_map(|c| self.from_half(u16::from_le_bytes([c[0], c[1]])).to_le_bytes()).collect(),
            _ => x.chunks_exact(4).flat_map(|c| self.word(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes()).collect(),
        }
    }
    /// The 32-bit word `Backend::fill` writes for `value` in a buffer of `dtype`: its bits (an
    /// I32 truncated as `as` does), a half's bits twice (element `2k` low, `2k + 1` high).
    pub fn fill_word(dtype: DType, value: f32) -> u32 {
        let half = |op: CastOp| u32::from(op.to_half(value)) * 0x1_0001;
        match dtype {
            DType::F32 => value.to_bits(),
            DType::I32 => value as i32 as u32,
            DType::Bf16 => half(CastOp::F32ToBf16),
            DType::F16 => half(CastOp::F32ToF16),
        }
    }
    /// The cast from `from` to `to`, if there is one.
    pub fn between(from: DType, to: DType) -> Option<CastOp> {
        CastOp::ALL.into_iter().find(|c| c.dtypes() == (from, to))
    }
}
