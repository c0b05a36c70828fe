//! The one table of WGSL sources, one file per op family, compiled lazily per device.
use std::sync::OnceLock;
mod wide;
use wide::tiled_wide;
pub use wide::TILED_WIDE;

/// `(name, source)` of every shader file the wgpu backend runs; names are what pipelines refer
/// to. `source` adds generated kernels to some of them.
pub const SHADERS: &[(&str, &str)] = &[
    ("unary", include_str!("../../../shaders/unary.wgsl")),
    ("binary", include_str!("../../../shaders/binary.wgsl")),
    ("util", include_str!("../../../shaders/util.wgsl")),
    ("reduce", include_str!("../../../shaders/reduce.wgsl")),
    ("matmul", include_str!("../../../shaders/matmul.wgsl")),
    ("conv", include_str!("../../../shaders/conv.wgsl")),
    ("pool", include_str!("../../../shaders/pool.wgsl")),
    ("index", include_str!("../../../shaders/index.wgsl")),
    ("cast", include_str!("../../../shaders/cast.wgsl")),
    ("halves", include_str!("../../../shaders/halves.wgsl")),
    ("optim", include_str!("../../../shaders/optim.wgsl")),
    ("transformer", include_str!("../../../shaders/transformer.wgsl")),
    ("attention", include_str!("../../../shaders/attention.wgsl")),
];

/// Modules of generated kernels that use subgroup operations and assume a subgroup of exactly 8
/// invocations (lavapipe's at 256-bit vectors): `(name, shader they extend)`. A device compiles
/// them only when it has `Features::SUBGROUP` and reports 8 as both its smallest and largest
/// subgroup (`Ctx::subgroup8`); elsewhere the kernels of the extended shader serve.
pub const SUBGROUP8_MODULES: &[(&str, &str)] = &[("matmul_sg", "matmul")];

/// Modules that use subgroup operations at any subgroup size, `(name, shader they extend)`:
/// compiled only on devices with `Features::SUBGROUP` (`Ctx::subgroups`).
pub const SUBGROUP_MODULES: &[(&str, &str)] = &[("reduce_sg", "reduce")];

/// Row counts of the generated `tb_sg{R}x4` kernels (C = A·Bᵀ, subgroup-shared rows of A): the
/// product takes the smallest that covers M, else the largest, because one block over all of
/// a small M (a convolution's output channels) wastes least at the edge. There is no 32-row
/// kernel: it is no faster for larger M and takes longer to compile (benches/README.md).
pub const TB_SG_ROWS: [usize; 3] = [8, 16, 24];

/// The helpers several shader files share (NaN by the bits, the grid's linear index, ...): WGSL
/// has no includes, so `source` appends this text to every module, after the module's own file.
pub const COMMON: &str = include_str!("../../../shaders/common.wgsl");

/// The parameters and bindings of the fused transformer kernels, appended (before `COMMON`) to
/// the modules that run `FusedOp`s, `(name, layout)`.
pub const SHARED_LAYOUTS: &[(&str, &str)] =
    &[("transformer", include_str!("../../../shaders/fused_layout.wgsl")), ("attention", include_str!("../../../shaders/fused_layout.wgsl"))];

/// The source of shader `name` as it is compiled: its file, then its `SHARED_LAYOUTS` entry if
/// any, `COMMON` and the elementwise ops' codes (`op_table::wgsl_constants`), and for `matmul` the generated `regs16x4`,
/// `regs_k1_ua{8x2,8x4,16x2,24x2}`, `tb8x8` and every `TILED` and `TILED_WIDE` kernel appended;
/// `matmul_sg` is all of `matmul` plus the generated `regs_sg32x2` and `tb_sg{R}x4` for each R
/// of `TB_SG_ROWS`.
pub fn source(name: &str) -> Option<&'static str> {
    static MATMUL: OnceLock<String> = OnceLock::new();
    static MATMUL_SG: OnceLock<String> = OnceLock::new();
    if name == "matmul_sg" {
        let base = source("matmul")?;
        return Some(MATMUL_SG.get_or_init(|| {
            let mut kernels = vec![regs_unrolled(Regs::SubgroupA, 32, 2)];
            kernels.extend(TB_SG_ROWS.iter().map(|&rows| tb_unrolled(rows, 4, true)));
            format!("{base}\n{}", kernels.join("\n"))
        }));
    }
    if name == "reduce_sg" {
        static REDUCE_SG: OnceLock<String> = OnceLock::new();
        let base = source("reduce")?;
        return Some(REDUCE_SG.get_or_init(|| format!("{base}\n{}", include_str!("../../../shaders/reduce_sg.wgsl"))));
    }
    let at = SHADERS.iter().position(|(n, _)| *n == name)?;
    static WITH_COMMON: OnceLock<Vec<String>> = OnceLock::new();
    let file = &WITH_COMMON.get_or_init(|| {
        let layout = |name: &str| SHARED_LAYOUTS.iter().find(|(n, _)| *n == name).map_or("", |(_, l)| *l);
        let ops = crate::backend::op_table::wgsl_constants();
        SHADERS.iter().map(|(name, s)| format!("{s}\n{}{COMMON}\n{ops}", layout(name))).collect()
    })[at];
    if name == "matmul" {
        return Some(MATMUL.get_or_init(|| {
            let kernels = [
                regs_unrolled(Regs::Vec4, 16, 4),
                regs_unrolled(Regs::UniformA, 8, 2),
                regs_unrolled(Regs::UniformA, 16, 2),
                regs_unrolled(Regs::UniformA, 8, 4),
                regs_unrolled(Regs::UniformA, 24, 2),
                tb_unrolled(8, 8, false),
            ];
            let tiled: Vec<String> =
                TILED.iter().flatten().map(|name| tiled(name)).chain(TILED_WIDE.iter().flatten().map(|name| tiled_wide(name))).collect();
            format!("{file}\n{}\n{}", kernels.join("\n"), tiled.join("\n"))
        }));
    }
    Some(file.as_str())
}

/// The two `regs`-family kernels of matmul.wgsl that `regs_unrolled` writes bigger blocks of.
#[derive(Clone, Copy, Debug)]
pub enum Regs {
    /// `regs`: A and B read four K values at a time as vec4 (entry `regs{rows}x{groups}`).
    Vec4,
    /// `regs_k1` with A from the uniform copy `au`: one K value per step (entry
    /// `regs_k1_ua{rows}x{groups}`).
    UniformA,
    /// `Vec4` where each of the 8 lanes loads `rows / 8` of the block's rows of A and shares
    /// them by `subgroupBroadcast` (entry `regs_sg{rows}x{groups}`, module `matmul_sg`).
    SubgroupA,
}

/// WGSL of a `regs`-family kernel with `rows` rows of C and `groups` vec4 column groups, 8
/// apart, per invocation, written out in full: CPU rasterizers keep values in registers only
/// when every accumulator is its own variable; loops over arrays this large are not unrolled by
/// their compilers and run much slower. More outputs per lane mean fewer loads per product:
/// 16×4 (each B load feeds 16 rows, each A load 16 columns) rather than `regs`' 8×8, and the
/// uniform-A kernel's 16×2 and 8×4 blocks rather than its 8×2.
/// Every lane of `Vec4` loads the same A values, lane by lane; `SubgroupA` loads each once and
/// broadcasts it (a register extract on lavapipe), which leaves so few A loads that 32 rows × 2
/// groups (each B load feeds 32 rows) beat 16×4 (the figures are in benches/README.md). Operand
/// conditions, clamping and grid are the hand-written kernel's; `SubgroupA` needs `rows` a
/// multiple of 8 and a subgroup of 8 whose invocation ids are the workgroup's.
pub fn regs_unrolled(kind: Regs, rows: usize, groups: usize) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let sg = matches!(kind, Regs::SubgroupA);
    let (cols, vec4) = (8 * groups, matches!(kind, Regs::Vec4 | Regs::SubgroupA));
    let name = match kind {
        Regs::Vec4 => format!("regs{rows}x{groups}"),
        Regs::SubgroupA => format!("regs_sg{rows}x{groups}"),
        Regs::UniformA => format!("regs_k1_ua{rows}x{groups}"),
    };
    kernel_header(&mut s, &format!("`shaders::regs_unrolled({kind:?}, {rows}, {groups})`."), &name, sg);
    let _ = writeln!(s, "    let n4 = p.n / 4u;\n    let k4 = p.k / 4u;\n    let row0 = wid.x * {rows}u;");
    let _ = writeln!(s, "    let col = wid.y * {cols}u + lid.x;\n    let z = wid.z;\n    let bbase = (p.b_off + z * p.b_bs) / 4u;");
    // A's row starts: vec4 indices (`a4`) or element indices into the uniform copy (`au`).
    let (abase, row_stride) = if vec4 { ("(p.a_off + z * p.a_bs) / 4u", "k4") } else { ("p.a_off + z * p.a_bs", "p.a_rs") };
    let _ = writeln!(s, "    let abase = {abase};");
    a_row_starts(&mut s, rows, sg, row_stride);
    for g in 0..groups {
        let _ = writeln!(s, "    let bc{g} = bbase + min(col + {}u, n4 - 1u);", 8 * g);
    }
    for r in 0..rows {
        let accs: Vec<String> = (0..groups).map(|g| format!("var c{r}_{g} = vec4<f32>(0.0);")).collect();
        let _ = writeln!(s, "    {}", accs.join(" "));
    }
    if vec4 {
        let _ = writeln!(s, "    for (var kk = 0u; kk < k4; kk++) {{\n        let br = kk * 4u * n4;");
        for g in 0..groups {
            let loads: Vec<String> = (0..4).map(|t| format!("let b{g}{t} = b4[bc{g} + br + {t}u * n4];")).collect();
            let _ = writeln!(s, "        {}", loads.join(" "));
        }
    } else {
        let _ = writeln!(s, "    for (var kk = 0u; kk < p.k; kk++) {{\n        let ak = kk * p.a_cs;");
        let loads: Vec<String> = (0..groups).map(|g| format!("let b{g} = b4[bc{g} + kk * n4];")).collect();
        let _ = writeln!(s, "        {}", loads.join(" "));
    }
    a_lane_loads(&mut s, rows, sg);
    for r in 0..rows {
        if vec4 {
            let _ = writeln!(s, "        let x{r} = {};", a_row(r, rows, sg));
        } else {
            let _ = writeln!(s, "        let e{r} = ar{r} + ak;\n        let x{r} = au[e{r} / 4u][e{r} % 4u];");
        }
        let fmas: Vec<String> = (0..groups)
            .map(|g| if vec4 { format!("c{r}_{g} += dot4(x{r}, b{g}0, b{g}1, b{g}2, b{g}3);") } else { format!("c{r}_{g} += x{r} * b{g};") })
            .collect();
        let _ = writeln!(s, "        {}", fmas.join(" "));
    }
    let _ = writeln!(s, "    }}\n    let cb = (p.c_off + z * p.m * p.n) / 4u + row0 * n4 + col;");
    for r in 0..rows {
        let _ = writeln!(s, "    if row0 + {r}u < p.m {{");
        // The uniform-A kernels add a per-row bias from `au` when `p.epi` is 1 (a convolution's),
        // and clamp at 0 as well when it is 2 (a ReLU after it).
        let bias = if vec4 {
            String::new()
        } else {
            let _ = writeln!(s, "        let q{r} = p.bias_at + row0 + {r}u;");
            let _ = writeln!(s, "        let y{r} = select(0.0, au[q{r} / 4u][q{r} % 4u], p.epi >= 1u);");
            format!(" + y{r}")
        };
        for g in 0..groups {
            let v = if vec4 { format!("c{r}_{g}") } else { format!("epilogue(c{r}_{g}{bias})") };
            let _ = writeln!(s, "        if col + {0}u < n4 {{ c4[cb + {r}u * n4 + {0}u] = {v}; }}", 8 * g);
        }
        let _ = writeln!(s, "    }}");
    }
    s.push_str("}\n");
    s
}

/// WGSL of `tb{rows}x{cols}`: C = A·Bᵀ with A [M, K] and B [N, K] both read along K as vec4
/// (K, offsets and batch strides multiples of 4), each invocation `rows` rows by `cols`
/// consecutive columns (a multiple of 4), written out in full as `regs_unrolled`. A's rows are
/// the same for all 8 lanes of a workgroup; each lane reads its own rows of B. Serves
/// convolution weight gradients (grad_out · colsᵀ per image), whose N = C·kh·kw is rarely a
/// multiple of 4; 8×8 per lane does 16 dot products per vec4 load where `generic_tb` does 8
/// (8×4 is not enough to gain on `generic_tb`).
/// With `subgroup` (entry `tb_sg{rows}x{cols}`, module `matmul_sg`; `rows` a multiple of 8) each
/// lane loads `rows / 8` of the rows of A and `subgroupBroadcast` shares them, as
/// `Regs::SubgroupA`: with A's loads gone, 16×4 and 24×4 are the fastest on the seed CNN's two
/// weight gradients (benches/README.md).
pub fn tb_unrolled(rows: usize, cols: usize, subgroup: bool) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let name = if subgroup { format!("tb_sg{rows}x{cols}") } else { format!("tb{rows}x{cols}") };
    let what = format!("`shaders::tb_unrolled({rows}, {cols}, {subgroup})`: C = A·Bᵀ, {rows}×{cols} outputs per invocation.");
    kernel_header(&mut s, &what, &name, subgroup);
    let _ = writeln!(s, "    let k4 = p.k / 4u;\n    let row0 = wid.y * {rows}u;\n    let col0 = (wid.x * 8u + lid.x) * {cols}u;");
    let _ = writeln!(s, "    let z = wid.z;\n    let abase = (p.a_off + z * p.a_bs) / 4u;\n    let bbase = (p.b_off + z * p.b_bs) / 4u;");
    a_row_starts(&mut s, rows, subgroup, "k4");
    for c in 0..cols {
        let _ = writeln!(s, "    let bc{c} = bbase + min(col0 + {c}u, p.n - 1u) * k4;");
    }
    for r in 0..rows {
        let accs: Vec<String> = (0..cols / 4).map(|q| format!("var c{r}_{q} = vec4<f32>(0.0);")).collect();
        let _ = writeln!(s, "    {}", accs.join(" "));
    }
    let _ = writeln!(s, "    for (var kk = 0u; kk < k4; kk++) {{");
    for c in 0..cols {
        let _ = writeln!(s, "        let y{c} = b4[bc{c} + kk];");
    }
    a_lane_loads(&mut s, rows, subgroup);
    for r in 0..rows {
        let _ = writeln!(s, "        let x{r} = {};", a_row(r, rows, subgroup));
        for q in 0..cols / 4 {
            let d: Vec<String> = (0..4).map(|j| format!("dot(x{r}, y{})", 4 * q + j)).collect();
            let _ = writeln!(s, "        c{r}_{q} += vec4<f32>({});", d.join(", "));
        }
    }
    let _ = writeln!(s, "    }}\n    let cb = p.c_off + z * p.m * p.n;");
    for r in 0..rows {
        let _ = writeln!(s, "    if row0 + {r}u < p.m {{\n        let cr = cb + (row0 + {r}u) * p.n + col0;");
        for c in 0..cols {
            let _ = writeln!(s, "        if col0 + {c}u < p.n {{ c1[cr + {c}u] = c{r}_{}[{}]; }}", c / 4, c % 4);
        }
        let _ = writeln!(s, "    }}");
    }
    s.push_str("}\n");
    s
}

/// The opening of generated kernel `name` (8 invocations; with `subgroup` its lane id `sid`),
/// after a comment saying it was generated by `what`.
fn kernel_header(s: &mut String, what: &str, name: &str, subgroup: bool) {
    use std::fmt::Write;
    let _ = writeln!(s, "// Generated by {what}");
    let _ = writeln!(s, "@compute @workgroup_size(8)");
    let sid = if subgroup { ", @builtin(subgroup_invocation_id) sid: u32" } else { "" };
    let _ = writeln!(s, "fn {name}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>{sid}) {{");
}

/// The starts of a block's `rows` rows of A (`ar{r}`, `stride` apart), or with `subgroup` of this
/// lane's `rows / 8` of them (`al{j}`), clamped to the last row.
fn a_row_starts(s: &mut String, rows: usize, subgroup: bool, stride: &str) {
    use std::fmt::Write;
    if subgroup {
        let per_lane = rows / 8;
        for j in 0..per_lane {
            let _ = writeln!(s, "    let al{j} = abase + min(row0 + sid * {per_lane}u + {j}u, p.m - 1u) * {stride};");
        }
    } else {
        for r in 0..rows {
            let _ = writeln!(s, "    let ar{r} = abase + min(row0 + {r}u, p.m - 1u) * {stride};");
        }
    }
}

/// With `subgroup`, this lane's vec4 loads of A at step `kk` (`xl{j}`), which `a_row` shares.
fn a_lane_loads(s: &mut String, rows: usize, subgroup: bool) {
    use std::fmt::Write;
    for j in 0..if subgroup { rows / 8 } else { 0 } {
        let _ = writeln!(s, "        let xl{j} = a4[al{j} + kk];");
    }
}

/// The vec4 of row `r` of A at step `kk`: loaded by this lane, or with `subgroup` broadcast from
/// the lane that loaded it.
fn a_row(r: usize, rows: usize, subgroup: bool) -> String {
    if subgroup {
        let per_lane = rows / 8;
        format!("subgroupBroadcast(xl{}, {}u)", r % per_lane, r / per_lane)
    } else {
        format!("a4[ar{r} + kk]")
    }
}

/// Entry points of the hardware (`MatmulKernel::Tiled`) kernels, `TILED[a][b]` for A loaded
/// the `a`-th way and B the `b`-th of `TILE_LOADS`.
pub const TILED: [[&str; 4]; 4] = [
    ["tiled_k1k1", "tiled_k1k4", "tiled_k1o1", "tiled_k1o4"],
    ["tiled_k4k1", "tiled_k4k4", "tiled_k4o1", "tiled_k4o4"],
    ["tiled_o1k1", "tiled_o1k4", "tiled_o1o1", "tiled_o1o4"],
    ["tiled_o4k1", "tiled_o4k4", "tiled_o4o1", "tiled_o4o4"],
];

/// How a tiled kernel loads an operand's 64 rows (of op(A)) or columns (of op(B)) by 16 K
/// values, in the order of `TILED`'s indices: along K where K is its contiguous dimension
/// (untransposed A, transposed B), else along M or N (`o`); one element (`1`) or an aligned
/// vec4 (`4`) per load. Consecutive lanes read consecutive addresses in all four.
pub const TILE_LOADS: [&str; 4] = ["k1", "k4", "o1", "o4"];

/// WGSL of tiled kernel `name` (`tiled_{A}{B}`, each a `TILE_LOADS` code); see the tiled
/// section of matmul.wgsl.
fn tiled(name: &str) -> String {
    let (a, b) = (&name[6..8], &name[8..10]);
    format!(
        "// Generated by `shaders::tiled(\"{name}\")`.
@compute @workgroup_size(16, 16)
fn {name}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let row0 = wid.y * 64u;
    let col0 = wid.x * 64u;
    let z = wid.z;
    let abase = p.a_off + z * p.a_bs;
    let bbase = p.b_off + z * p.b_bs;
    var acc = array<vec4<f32>, 4>();
    for (var kt = 0u; kt < p.k; kt += 16u) {{
{}
{}
        workgroupBarrier();
        for (var t = 0u; t < 16u; t++) {{
            let at = t * TILE_ROW;
            let x = vec4<f32>(ta[at + lid.y], ta[at + lid.y + 16u], ta[at + lid.y + 32u], ta[at + lid.y + 48u]);
            let y = vec4<f32>(tb[at + lid.x], tb[at + lid.x + 16u], tb[at + lid.x + 32u], tb[at + lid.x + 48u]);
            acc[0] += x.x * y;
            acc[1] += x.y * y;
            acc[2] += x.z * y;
            acc[3] += x.w * y;
        }}
        workgroupBarrier();
    }}
    tile_store(row0 + lid.y, col0 + lid.x, z, acc);
}}
",
        tile_load(a, "ta", "a", "row0", "p.m", "p.a_rs", "p.a_cs"),
        tile_load(b, "tb", "b", "col0", "p.n", "p.b_cs", "p.b_rs")
    )
}

/// WGSL filling `tile` ([k][o], `TILE_ROW` apart) from operand `x` (`a` or `b`) the way `how`
/// says (a `TILE_LOADS` code); element (o, k) of the operand's tile sits at
/// `{x}base + (o0 + o) * os + (kt + k) * ks`, `ext` rows or columns in all. Past the edge: 0.
fn tile_load(how: &str, tile: &str, x: &str, o0: &str, ext: &str, os: &str, ks: &str) -> String {
    let at = |o: &str, k: &str| format!("{x}base + ({o0} + {o}) * {os} + (kt + {k}) * {ks}");
    match how {
        // 16 lanes along K of one row, 16 rows per pass.
        "k1" => format!(
            "        for (var i = 0u; i < 4u; i++) {{
            let o = i * 16u + li / 16u;
            let k = li % 16u;
            var v = 0.0;
            if {o0} + o < {ext} && kt + k < p.k {{ v = {x}1[{}]; }}
            {tile}[k * TILE_ROW + o] = v;
        }}",
            at("o", "k")
        ),
        // 64 lanes along the row or column dimension, 4 K values per pass.
        "o1" => format!(
            "        for (var i = 0u; i < 4u; i++) {{
            let k = i * 4u + li / 64u;
            let o = li % 64u;
            var v = 0.0;
            if {o0} + o < {ext} && kt + k < p.k {{ v = {x}1[{}]; }}
            {tile}[k * TILE_ROW + o] = v;
        }}",
            at("o", "k")
        ),
        // Four lanes a row, one vec4 of K each (K, `ks` = 1 and the base aligned to 4).
        "k4" => format!(
            "        {{
            let o = li / 4u;
            let q = li % 4u;
            var v = vec4<f32>(0.0);
            if {o0} + o < {ext} && kt + q * 4u < p.k {{ v = {x}4[({}) / 4u + q]; }}
            let at = q * 4u * TILE_ROW + o;
            {tile}[at] = v.x;
            {tile}[at + TILE_ROW] = v.y;
            {tile}[at + 2u * TILE_ROW] = v.z;
            {tile}[at + 3u * TILE_ROW] = v.w;
        }}",
            at("o", "0u")
        ),
        // 16 lanes a K value, one vec4 of rows or columns each (`ext`, `os` = 1 and the base aligned to 4).
        _ => format!(
            "        {{
            let k = li / 16u;
            let q = li % 16u;
            var v = vec4<f32>(0.0);
            if {o0} + q * 4u < {ext} && kt + k < p.k {{ v = {x}4[({}) / 4u + q]; }}
            let at = k * TILE_ROW + q * 4u;
            {tile}[at] = v.x;
            {tile}[at + 1u] = v.y;
            {tile}[at + 2u] = v.z;
            {tile}[at + 3u] = v.w;
        }}",
            at("0u", "k")
        ),
    }
}
