// matmul.wgsl: batched C[z] = op(A[z]) · op(B[z]), C[z] M×N row-major, op(A) M×K, op(B) K×N.
//
// Each invocation computes a block of C in registers, reading A and B straight from storage:
// on software rasterizers (lavapipe, llvmpipe) workgroup memory and barriers cost more than they
// save, and caches serve the reuse. `workgroup_id.z` is the batch entry z.
// Bindings: 0 `p` parameters; 1 A (`splitk_sum`: the partial sums); 2 B; 3 C (written); 4 the
// bias (`tiled_*` and `splitk_sum` only). The `regs` entry points view A, B, C as vec4 arrays,
// the `generic` one as f32 arrays, `tiled_*` as either.
//
// More kernels are generated and appended by `shaders::source` (src/backend/wgpu/shaders.rs):
// bigger blocks of `regs`; `regs_k1_ua*`, which are `regs_k1` with A bound as the 64 KiB
// uniform buffer `au` (a staged copy of a small A, such as a convolution's weights: every lane
// reads the same A value, which CPU rasterizers load once from a uniform buffer but lane by
// lane from a storage buffer); and `tb8x8` for C = A·Bᵀ.
// Shape letters: M, K, N as above; Z batch entries in this dispatch; S slices of K (split-K).

struct Params {
    m: u32,
    n: u32,
    k: u32,
    a_off: u32, // element offsets relative to each bound range
    b_off: u32,
    c_off: u32,
    a_bs: u32,  // batch strides in elements; 0 reuses one matrix
    b_bs: u32,
    a_rs: u32,  // strides of op(A) along M and K, and of op(B) along K and N (transposes)
    a_cs: u32,
    b_rs: u32,
    b_cs: u32,
    bias_at: u32, // generated `regs_k1_ua*` only: where the bias starts in `au`, and the
    epi: u32,     // epilogue: 0 none, 1 add it to each row of C, 2 add it then ReLU; 3
                  // (`generic` only) add the product to what C holds: a later slice of a K
                  // that the host cut into slices
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> b4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c4: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> a1: array<f32>;
@group(0) @binding(2) var<storage, read_write> b1: array<f32>;
@group(0) @binding(3) var<storage, read_write> c1: array<f32>;
@group(0) @binding(1) var<uniform> au: array<vec4<f32>, 4096>;

// The `epi` = 2 clamp of the uniform-A kernels' outputs (bias already added): ReLU as
// PyTorch's, only values below 0 become 0 (NaN and -0 pass, judged from the bits since the
// drivers may assume `max` never sees a NaN).
fn epilogue(v: vec4<f32>) -> vec4<f32> {
    let b = bitcast<vec4<u32>>(v);
    let below = b > vec4<u32>(0x80000000u) & b <= vec4<u32>(0xff800000u);
    return select(v, vec4<f32>(0.0), below & vec4<bool>(p.epi == 2u));
}

// Row a (four consecutive K values) times the 4×4 block of B rows r0..r3.
fn dot4(a: vec4<f32>, r0: vec4<f32>, r1: vec4<f32>, r2: vec4<f32>, r3: vec4<f32>) -> vec4<f32> {
    return a.x * r0 + a.y * r1 + a.z * r2 + a.w * r3;
}

// Untransposed operands, N and K multiples of 4, offsets and batch strides multiples of 4.
// A workgroup owns 8 rows of C and 64 columns: each of its 8 invocations two vec4 column groups
// 8 apart (32 accumulators). CPU rasterizers load storage lane by lane, so what counts is
// outputs per load: each B load feeds 8 rows and each A load 8 columns (8×4 outputs ran about
// 25% slower on lavapipe; more spill registers). Consecutive workgroups (`workgroup_id.x`) walk
// down the rows of one strip of B. Rows and columns past the edge are clamped on load and
// skipped on store.
@compute @workgroup_size(8)
fn regs(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let n4 = p.n / 4u;
    let k4 = p.k / 4u;
    let row0 = wid.x * 8u;
    let col = wid.y * 16u + lid.x;
    let z = wid.z;
    let abase = (p.a_off + z * p.a_bs) / 4u;
    let last = p.m - 1u;
    var ar = array<u32, 8>();
    for (var r = 0u; r < 8u; r++) { ar[r] = abase + min(row0 + r, last) * k4; }
    let bbase = (p.b_off + z * p.b_bs) / 4u;
    let bc0 = bbase + min(col, n4 - 1u);
    let bc1 = bbase + min(col + 8u, n4 - 1u);
    var acc = array<vec4<f32>, 16>();
    for (var kk = 0u; kk < k4; kk++) {
        let br = kk * 4u * n4;
        let b0 = b4[bc0 + br];
        let b1 = b4[bc0 + br + n4];
        let b2 = b4[bc0 + br + 2u * n4];
        let b3 = b4[bc0 + br + 3u * n4];
        let d0 = b4[bc1 + br];
        let d1 = b4[bc1 + br + n4];
        let d2 = b4[bc1 + br + 2u * n4];
        let d3 = b4[bc1 + br + 3u * n4];
        for (var r = 0u; r < 8u; r++) {
            let x = a4[ar[r] + kk];
            acc[r] += dot4(x, b0, b1, b2, b3);
            acc[r + 8u] += dot4(x, d0, d1, d2, d3);
        }
    }
    store8x8(row0, col, z, acc);
}

// Writes an 8-row block of C from `acc` (rows 0..7 at vec4 column `col`, then at `col + 8`),
// skipping rows and columns past the edge.
fn store8x8(row0: u32, col: u32, z: u32, acc: array<vec4<f32>, 16>) {
    let n4 = p.n / 4u;
    let cb = (p.c_off + z * p.m * p.n) / 4u + row0 * n4 + col;
    for (var r = 0u; r < 8u; r++) {
        if row0 + r < p.m {
            if col < n4 { c4[cb + r * n4] = acc[r]; }
            if col + 8u < n4 { c4[cb + r * n4 + 8u] = acc[r + 8u]; }
        }
    }
}

// Where one `regs_k1` invocation reads: A's 8 row starts (element indices, clamped to M) and
// B's two vec4 columns (clamped to N); output block origin `row0`, `col`.
struct K1 {
    ar: array<u32, 8>,
    bc0: u32,
    bc1: u32,
    row0: u32,
    col: u32,
}

fn k1_setup(wid: vec3<u32>, lid: vec3<u32>) -> K1 {
    var s: K1;
    let n4 = p.n / 4u;
    s.row0 = wid.x * 8u;
    s.col = wid.y * 16u + lid.x;
    let abase = p.a_off + wid.z * p.a_bs;
    for (var r = 0u; r < 8u; r++) { s.ar[r] = abase + min(s.row0 + r, p.m - 1u) * p.a_rs; }
    let bbase = (p.b_off + wid.z * p.b_bs) / 4u;
    s.bc0 = bbase + min(s.col, n4 - 1u);
    s.bc1 = bbase + min(s.col + 8u, n4 - 1u);
    return s;
}

// Any op(A) (scalar loads through its strides), untransposed B with N a multiple of 4 and its
// offset and batch stride multiples of 4, any K: the `regs` layout (8 rows by two vec4 column
// groups per invocation), one K value per step. Serves the small batched GEMMs of
// convolutions, whose K (C·kh·kw) is rarely a multiple of 4.
@compute @workgroup_size(8)
fn regs_k1(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let s = k1_setup(wid, lid);
    let n4 = p.n / 4u;
    var acc = array<vec4<f32>, 16>();
    for (var kk = 0u; kk < p.k; kk++) {
        let b0 = b4[s.bc0 + kk * n4];
        let b1 = b4[s.bc1 + kk * n4];
        for (var r = 0u; r < 8u; r++) {
            let x = a1[s.ar[r] + kk * p.a_cs];
            acc[r] += x * b0;
            acc[r + 8u] += x * b1;
        }
    }
    store8x8(s.row0, s.col, wid.z, acc);
}

// Writes the 4×4 block of C at (`row0`, `col0`) of batch entry `z` with scalar stores (any N),
// skipping rows and columns past the edge.
fn store4x4(row0: u32, col0: u32, z: u32, acc0: vec4<f32>, acc1: vec4<f32>, acc2: vec4<f32>, acc3: vec4<f32>) {
    let cb = p.c_off + z * p.m * p.n;
    store_row(cb, row0, col0, acc0);
    store_row(cb, row0 + 1u, col0, acc1);
    store_row(cb, row0 + 2u, col0, acc2);
    store_row(cb, row0 + 3u, col0, acc3);
}

// Row `row` of C from column `col0`, what lies inside C; no loops or indexing by variables,
// which llvmpipe compiles slowly (indexing a local array by a variable took ~0.8 s to JIT).
fn store_row(cb: u32, row: u32, col0: u32, v: vec4<f32>) {
    if row >= p.m { return; }
    let at = cb + row * p.n + col0;
    if col0 < p.n { c1[at] = v.x + prior(at); }
    if col0 + 1u < p.n { c1[at + 1u] = v.y + prior(at + 1u); }
    if col0 + 2u < p.n { c1[at + 2u] = v.z + prior(at + 2u); }
    if col0 + 3u < p.n { c1[at + 3u] = v.w + prior(at + 3u); }
}

// What C holds at `at` when this dispatch adds a later slice of K (`p.epi` = 3), else 0.
fn prior(at: u32) -> f32 {
    var c = 0.0;
    if p.epi == 3u { c = c1[at]; }
    return c;
}

// Any shapes, transposes, offsets and strides: 4×4 outputs per invocation, scalar loads.
@compute @workgroup_size(8, 8)
fn generic(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row0 = (wid.y * 8u + lid.y) * 4u;
    let col0 = (wid.x * 8u + lid.x) * 4u;
    if row0 >= p.m || col0 >= p.n { return; }
    let z = wid.z;
    let ab = p.a_off + z * p.a_bs;
    let bb = p.b_off + z * p.b_bs;
    let r = min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.m - 1u));
    let c = min(vec4<u32>(col0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.n - 1u));
    let ar = vec4<u32>(ab) + r * p.a_rs;
    let bc = vec4<u32>(bb) + c * p.b_cs;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var kk = 0u; kk < p.k; kk++) {
        let ak = kk * p.a_cs;
        let bk = kk * p.b_rs;
        let bv = vec4<f32>(b1[bc.x + bk], b1[bc.y + bk], b1[bc.z + bk], b1[bc.w + bk]);
        acc0 += a1[ar.x + ak] * bv;
        acc1 += a1[ar.y + ak] * bv;
        acc2 += a1[ar.z + ak] * bv;
        acc3 += a1[ar.w + ak] * bv;
    }
    store4x4(row0, col0, z, acc0, acc1, acc2, acc3);
}

// Untransposed A times transposed B (C = A·Bᵀ, both read along K), K a multiple of 4 and
// offsets and batch strides of A and B multiples of 4, any M and N: the `generic` layout (4×4
// outputs per invocation) with vec4 loads along K of both operands. Serves convolution weight
// gradients (grad_out · colsᵀ), whose N = C·kh·kw is rarely a multiple of 4.
@compute @workgroup_size(8, 8)
fn generic_tb(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row0 = (wid.y * 8u + lid.y) * 4u;
    let col0 = (wid.x * 8u + lid.x) * 4u;
    if row0 >= p.m || col0 >= p.n { return; }
    let z = wid.z;
    let k4 = p.k / 4u;
    let ab = (p.a_off + z * p.a_bs) / 4u;
    let bb = (p.b_off + z * p.b_bs) / 4u;
    let r = min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.m - 1u));
    let c = min(vec4<u32>(col0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.n - 1u));
    let ar = vec4<u32>(ab) + r * k4;
    let bc = vec4<u32>(bb) + c * k4;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var kk = 0u; kk < k4; kk++) {
        let b0 = b4[bc.x + kk];
        let b1v = b4[bc.y + kk];
        let b2 = b4[bc.z + kk];
        let b3 = b4[bc.w + kk];
        let a0 = a4[ar.x + kk];
        let a1v = a4[ar.y + kk];
        let a2 = a4[ar.z + kk];
        let a3 = a4[ar.w + kk];
        acc0 += vec4<f32>(dot(a0, b0), dot(a0, b1v), dot(a0, b2), dot(a0, b3));
        acc1 += vec4<f32>(dot(a1v, b0), dot(a1v, b1v), dot(a1v, b2), dot(a1v, b3));
        acc2 += vec4<f32>(dot(a2, b0), dot(a2, b1v), dot(a2, b2), dot(a2, b3));
        acc3 += vec4<f32>(dot(a3, b0), dot(a3, b1v), dot(a3, b2), dot(a3, b3));
    }
    store4x4(row0, col0, z, acc0, acc1, acc2, acc3);
}

// Hardware GPUs (`MatmulKernel::Tiled`): the generated `tiled_{A}{B}` kernels (see
// `shaders::tiled`), one per way of loading each operand, serve every product: any transposes,
// any M, N, K, offsets and batch strides. A 16×16 workgroup owns a 64×64 tile of C, each
// invocation rows `lid.y + 16i` by columns `lid.x + 16j` (i, j < 4), so that consecutive lanes
// read consecutive words of `tb` and store consecutive columns of C. A and B are staged 16 K
// values at a time as [k][row] and [k][column] in `ta` and `tb`, rows of `TILE_ROW` = 66 words:
// two words of padding put the 32 lanes that write one K step's column of a tile from a vec4
// along K (8 rows × 4 K-quads) into 32 different banks, where 64 put them into 8 (4-way
// conflicts). Every element of both tiles is written (zero past an edge) before the barrier
// that precedes any read, so pipelines skip workgroup-memory zeroing.
// Binding 4 `bias1`: the bias of `epi` 1, 2, 4, 5 (from `p.bias_at`); another binding otherwise.
const TILE_ROW: u32 = 66u;
var<workgroup> ta: array<f32, 1056>; // 16 × TILE_ROW
var<workgroup> tb: array<f32, 1056>;
@group(0) @binding(4) var<storage, read_write> bias1: array<f32>;

// Stores a tiled invocation's outputs: row `r0 + 16i` of C holds `acc[i]` at columns `c0 + 16j`,
// skipping what lies past the edge. `p.epi`: 0 the product; 1 plus `bias1[row]`; 2 that, then
// ReLU; 3 plus what C holds (a later slice of a K cut on the host); 4 and 5 that plus 1 and 2.
fn tile_store(r0: u32, c0: u32, z: u32, acc: array<vec4<f32>, 4>) {
    let cb = p.c_off + z * p.m * p.n;
    let accumulate = p.epi >= 3u;
    let with_bias = p.epi != 0u && p.epi != 3u;
    let relu = p.epi == 2u || p.epi == 5u;
    for (var i = 0u; i < 4u; i++) {
        let row = r0 + 16u * i;
        if row >= p.m { break; }
        var bias = 0.0;
        if with_bias { bias = bias1[p.bias_at + row]; }
        for (var j = 0u; j < 4u; j++) {
            let col = c0 + 16u * j;
            if col >= p.n { break; }
            let at = cb + row * p.n + col;
            c1[at] = tile_out(at, acc[i][j], bias, accumulate, relu);
        }
    }
}

// One output of a tiled kernel after its epilogue: plus what C holds at `at` when
// `accumulate`, plus `bias`, then ReLU when `relu` (as PyTorch's, judged from the bits: see
// `epilogue`).
fn tile_out(at: u32, acc: f32, bias: f32, accumulate: bool, relu: bool) -> f32 {
    var v = acc;
    if accumulate { v += c1[at]; }
    v += bias;
    let bits = bitcast<u32>(v);
    if relu && bits > 0x80000000u && bits <= 0xff800000u { v = 0.0; }
    return v;
}

// The 128×128-tile kernels (`shaders::tiled_wide`): the same operands, epilogues and K slices as
// the 64×64 ones, for large products (`ops::matmul_tiled` says when). Their tiles hold vec4s,
// [k][row / 4] and [k][column / 4], 8 K values of 128 rows or columns, `WIDE_ROW` = 33 vec4s
// a K value (one of padding); as above, every element is written before the barrier that
// precedes any read.
const WIDE_ROW: u32 = 33u;
var<workgroup> wa: array<vec4<f32>, 264>; // 8 × WIDE_ROW
var<workgroup> wb: array<vec4<f32>, 264>;

// Stores four consecutive outputs `v` of a 128×128-tile invocation at row `row`, columns
// `col..col+3` of C, with `p.epi`'s epilogue as `tile_store` (on the vec4 at once: sixteen of
// these per invocation, each written out), skipping what lies past the edge.
fn wide_store(row: u32, col: u32, z: u32, v: vec4<f32>) {
    if row >= p.m || col >= p.n { return; }
    let at = p.c_off + z * p.m * p.n + row * p.n + col;
    let inside = vec4<u32>(col) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(p.n);
    var prior = vec4<f32>(0.0);
    if p.epi >= 3u {
        prior.x = c1[at];
        if inside.y { prior.y = c1[at + 1u]; }
        if inside.z { prior.z = c1[at + 2u]; }
        if inside.w { prior.w = c1[at + 3u]; }
    }
    var bias = 0.0;
    if p.epi != 0u && p.epi != 3u { bias = bias1[p.bias_at + row]; }
    let x = v + prior + bias;
    let bits = bitcast<vec4<u32>>(x);
    let below = bits > vec4<u32>(0x80000000u) & bits <= vec4<u32>(0xff800000u);
    let y = select(x, vec4<f32>(0.0), below & vec4<bool>(p.epi == 2u || p.epi == 5u));
    c1[at] = y.x;
    if inside.y { c1[at + 1u] = y.y; }
    if inside.z { c1[at + 2u] = y.z; }
    if inside.w { c1[at + 3u] = y.w; }
}

// Split-K (`MatmulKernel::SplitK`, src/backend/wgpu/tiled.rs): the tiled kernels wrote the
// products of S slices of K side by side as partial sums P[s] (each M×N, bound as binding 1;
// binding 2 is unread). `splitk_sum` adds them in slice order, s = 0 first, so that the result
// never depends on which workgroup finished first, then applies `p.epi` 0-2 (`tile_store`'s
// codes) and writes C. Here `p.k` is S, `p.a_off` where P starts, one invocation per element
// of C.
@compute @workgroup_size(256)
fn splitk_sum(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = grid_index(gid, nwg, 256u);
    let mn = p.m * p.n;
    if i >= mn { return; }
    var v = 0.0;
    for (var s = 0u; s < p.k; s++) { v += a1[p.a_off + s * mn + i]; }
    var bias = 0.0;
    if p.epi != 0u { bias = bias1[p.bias_at + i / p.n]; }
    let at = p.c_off + i;
    c1[at] = tile_out(at, v, bias, false, p.epi == 2u);
}
