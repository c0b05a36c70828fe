//! Every op of the Tensor API, and its gradient, on special values (0, -0, ±inf, NaN,
//! subnormals, 1 ± 1 ulp, ±1e30, the largest finite, ...) and special shapes (empty axes, one
//! element, length one in every broadcast position), on each device, against PyTorch's answers
//! in tests/fixtures/torch_edge_cases.json (written by scripts/torch_edge_cases.py).
//!
//! One rule for every value: NaN where PyTorch has NaN, the same infinity, a zero of the same
//! sign where both are zero, else `tandem::tolerance::check_close` with the op's bounds from
//! `OPS`; where PyTorch's scalar and vector paths differ (the fixture's `alternatives`), either
//! of its answers passes.
mod common;

use serde_json::Value;
use tandem::backend::{BinaryOp, UnaryOp};
use tandem::nn::{BatchNorm1d, BatchNorm2d, LayerNorm, Module};
use tandem::tolerance::check_close;
use tandem::{CrossEntropy, DType, Device, Result, Shape, Tensor};

/// Subnormal results may be flushed to zero on GPUs (Mesa's drivers do): every output allows an
/// absolute error of the smallest normal, every gradient that times the largest loss weight.
const FLUSH: f32 = f32::MIN_POSITIVE;
const GRAD_FLUSH: f32 = 3.0 * FLUSH;

type Run = fn(&[Tensor], &Value) -> Result<Vec<Tensor>>;

/// One op: its name in the fixture, the relative bound of its outputs and of its gradients,
/// an absolute bound where cancellation makes a relative one meaningless near 0, whether the
/// sign of a zero gradient is checked, and how tandem runs it.
struct Op {
    name: &'static str,
    rtol: f32,
    grad_rtol: f32,
    atol: f32,
    grad_zero_sign: bool,
    run: Run,
}

const fn op(name: &'static str, rtol: f32, grad_rtol: f32, run: Run) -> Op {
    Op { name, rtol, grad_rtol, atol: 0.0, grad_zero_sign: true, run }
}

impl Op {
    const fn atol(self, atol: f32) -> Op {
        Op { atol, ..self }
    }
    /// For gradients whose zero sign PyTorch leaves to its BLAS path (matmul's): MKL's product
    /// with k = 1 is the single product (-0 from 0 · -0.5, as in the gradient of a 1-D
    /// operand), its 1×1×1 product and tandem's GPU kernels sum from +0 (+0).
    const fn any_zero_sign_in_grads(self) -> Op {
        Op { grad_zero_sign: false, ..self }
    }
}

/// A float argument; the script writes a non-finite one as "nan", "inf" or "-inf".
fn f(a: &Value, k: &str) -> f32 {
    match &a[k] {
        Value::String(s) => s.parse().expect("nan, inf or -inf"),
        v => v.as_f64().expect("numeric argument") as f32,
    }
}
fn opt(a: &Value, k: &str) -> Option<f32> {
    (!a[k].is_null()).then(|| f(a, k))
}
fn u(a: &Value, k: &str) -> usize {
    a[k].as_u64().expect("integer argument") as usize
}
fn i(a: &Value, k: &str) -> isize {
    a[k].as_i64().expect("integer argument") as isize
}
fn b(a: &Value, k: &str) -> bool {
    a[k].as_bool().expect("boolean argument")
}
fn list(a: &Value, k: &str) -> Vec<usize> {
    a[k].as_array().expect("list argument").iter().map(|v| v.as_u64().expect("integer") as usize).collect()
}
fn pair(a: &Value, k: &str) -> (usize, usize) {
    let l = list(a, k);
    (l[0], l[1])
}
fn s<'a>(a: &'a Value, k: &str) -> &'a str {
    a[k].as_str().expect("string argument")
}
/// The comparison a fixture name stands for.
fn comparison(name: &str) -> fn(&Tensor, &Tensor) -> Result<Tensor> {
    match name {
        "gt" => Tensor::gt,
        "lt" => Tensor::lt,
        "ge" => Tensor::ge,
        "le" => Tensor::le,
        "ne" => Tensor::ne,
        "eq_elem" => Tensor::eq_elem,
        other => panic!("no comparison '{other}'"),
    }
}
/// `clip_grad_norm` over parameters whose gradients are `grads`: the norm, then the gradients.
fn clip(grads: &[Tensor], max_norm: f32) -> Result<Vec<Tensor>> {
    let params = grads
        .iter()
        .enumerate()
        .map(|(k, g)| {
            let p = Tensor::zeros(g.dims().to_vec(), g.device())?.requires_grad();
            p.set_grad(Some(g.clone()));
            Ok((format!("p{k}"), p))
        })
        .collect::<Result<Vec<_>>>()?;
    let norm = tandem::optim::clip_grad_norm(&params, max_norm)?;
    let mut out = vec![Tensor::from_vec(vec![norm], Shape(vec![]), grads[0].device())?];
    out.extend(params.iter().map(|(_, p)| p.grad().expect("a gradient")));
    Ok(out)
}
fn one(t: Result<Tensor>) -> Result<Vec<Tensor>> {
    t.map(|t| vec![t])
}

/// The op table. Bounds are relative errors against PyTorch's float32 CPU answers: 1e-6 (a few
/// ulp) for correctly rounded or nearly so arithmetic; more where a GPU builtin is only as good
/// as WGSL requires (exp: 3 + 2|x| ulp) or sums run in another order.
const OPS: &[Op] = &[
    op("identity", 0.0, 0.0, |x, _| one(x[0].unary(UnaryOp::Identity))),
    op("step", 0.0, 0.0, |x, _| one(x[0].unary(UnaryOp::Step))),
    op("neg", 0.0, 0.0, |x, _| one(x[0].neg())),
    op("exp", 2e-5, 2e-5, |x, _| one(x[0].exp())),
    op("log", 1e-6, 1e-6, |x, _| one(x[0].log())),
    op("relu", 0.0, 0.0, |x, _| one(x[0].relu())),
    op("sqrt", 1e-6, 1e-6, |x, _| one(x[0].sqrt())),
    op("square", 1e-6, 1e-6, |x, _| one(x[0].square())),
    op("tanh", 2e-6, 4e-6, |x, _| one(x[0].tanh())),
    op("sigmoid", 2e-6, 4e-6, |x, _| one(x[0].sigmoid())),
    op("recip", 1e-6, 1e-6, |x, _| one(x[0].recip())),
    op("abs", 0.0, 0.0, |x, _| one(x[0].abs())),
    // exp(p ln|x|) for non-integer p: the argument's rounding grows with |p ln x| (up to 89)
    op("powf", 2e-5, 2e-5, |x, a| one(x[0].powf(f(a, "p")))),
    op("affine", 1e-6, 1e-6, |x, a| one(x[0].affine(f(a, "mul"), f(a, "add")))),
    // gradients of broadcast operands are sums over the broadcast axes, in any order
    op("add", 1e-6, 1e-5, |x, _| one(x[0].add(&x[1]))),
    op("sub", 1e-6, 1e-5, |x, _| one(x[0].sub(&x[1]))),
    op("mul", 1e-6, 1e-5, |x, _| one(x[0].mul(&x[1]))),
    op("div", 1e-6, 1e-5, |x, _| one(x[0].div(&x[1]))),
    op("maximum", 0.0, 1e-5, |x, _| one(x[0].maximum(&x[1]))),
    op("minimum", 0.0, 1e-5, |x, _| one(x[0].minimum(&x[1]))),
    op("gt", 0.0, 0.0, |x, _| one(x[0].gt(&x[1]))),
    op("lt", 0.0, 0.0, |x, _| one(x[0].lt(&x[1]))),
    op("ge", 0.0, 0.0, |x, _| one(x[0].ge(&x[1]))),
    op("le", 0.0, 0.0, |x, _| one(x[0].le(&x[1]))),
    op("ne", 0.0, 0.0, |x, _| one(x[0].ne(&x[1]))),
    op("eq_elem", 0.0, 0.0, |x, _| one(x[0].eq_elem(&x[1]))),
    // both sides cast to I32 on the device, so that their range is not known on the host
    op("cast_compare", 0.0, 0.0, |x, a| one(comparison(s(a, "cmp"))(&x[0].to_dtype(DType::I32)?, &x[1].to_dtype(DType::I32)?))),
    op("to_dtype", 0.0, 0.0, |x, a| one(x[0].to_dtype(if s(a, "dtype") == "i32" { DType::I32 } else { DType::F32 }))),
    // PyTorch's threshold_backward(a, b, 0)
    op("relu_backward", 0.0, 1e-5, |x, _| one(x[0].binary(BinaryOp::ReluBackward, &x[1]))),
    op("sum", 1e-6, 1e-6, |x, a| one(x[0].sum(i(a, "axis"), b(a, "keepdim")))),
    op("mean", 1e-6, 1e-6, |x, a| one(x[0].mean(i(a, "axis"), b(a, "keepdim")))),
    op("max", 0.0, 0.0, |x, a| one(x[0].max(i(a, "axis"), b(a, "keepdim")))),
    op("min", 0.0, 0.0, |x, a| one(x[0].min(i(a, "axis"), b(a, "keepdim")))),
    op("argmax", 0.0, 0.0, |x, a| one(x[0].argmax(i(a, "axis")))),
    op("sum_all", 1e-6, 1e-6, |x, _| one(x[0].sum_all())),
    op("mean_all", 1e-6, 1e-6, |x, _| one(x[0].mean_all())),
    // gradients are differences of O(1) terms: absolute error near 0
    op("softmax", 2e-5, 2e-5, |x, a| one(x[0].softmax(i(a, "axis")))).atol(1e-6),
    op("log_softmax", 2e-5, 2e-5, |x, a| one(x[0].log_softmax(i(a, "axis")))).atol(1e-6),
    op("gather_rows", 0.0, 0.0, |x, _| one(x[0].gather_rows(&x[1]))),
    op("cross_entropy", 2e-5, 2e-5, |x, _| one(x[0].cross_entropy(&x[1]))).atol(1e-6),
    op("mse_loss", 1e-6, 1e-6, |x, _| one(x[0].mse_loss(&x[1]))),
    // sums of O(1) products in another order: absolute error where they cancel
    op("matmul", 1e-6, 1e-6, |x, _| one(x[0].matmul(&x[1]))).atol(1e-6).any_zero_sign_in_grads(),
    op("matmul_t", 1e-6, 1e-6, |x, a| one(x[0].matmul_t(&x[1], b(a, "ta"), b(a, "tb")))),
    op("conv2d", 1e-5, 1e-5, |x, a| one(x[0].conv2d(&x[1], pair(a, "stride"), pair(a, "pad")))).atol(1e-5),
    op("conv2d_bias", 1e-5, 1e-5, |x, a| one(x[0].conv2d_bias(&x[1], &x[2], pair(a, "stride"), pair(a, "pad")))).atol(1e-5),
    op("conv2d_bias_relu", 1e-5, 1e-5, |x, a| one(x[0].conv2d_bias_relu(&x[1], &x[2], pair(a, "stride"), pair(a, "pad")))).atol(1e-5),
    op("max_pool2d", 0.0, 0.0, |x, a| one(x[0].max_pool2d(pair(a, "kernel"), pair(a, "stride"), pair(a, "pad")))),
    op("reshape", 0.0, 0.0, |x, a| one(x[0].reshape(list(a, "shape")))),
    op("flatten", 0.0, 0.0, |x, _| one(x[0].flatten())),
    op("flatten_all", 0.0, 0.0, |x, _| one(x[0].flatten_all())),
    op("permute", 0.0, 0.0, |x, a| one(x[0].permute(&list(a, "perm")))),
    op("t", 0.0, 0.0, |x, _| one(x[0].t())),
    op("broadcast_to", 0.0, 1e-6, |x, a| one(x[0].broadcast_to(list(a, "shape")))),
    op("sum_to", 1e-6, 0.0, |x, a| one(x[0].sum_to(&Shape(list(a, "shape"))))),
    op("narrow", 0.0, 0.0, |x, a| one(x[0].narrow(u(a, "dim"), u(a, "start"), u(a, "len")))),
    op("split", 0.0, 0.0, |x, a| x[0].split(&list(a, "sizes"))),
    op("cat", 0.0, 0.0, |x, a| one(Tensor::cat(x, u(a, "dim")))),
    op("to", 0.0, 0.0, |x, _| one(x[0].to(&Device::cpu()).and_then(|c| c.to(x[0].device())))),
    // composed ops and the layers' forward functions
    op("sin", 1e-6, 1e-6, |x, _| one(x[0].sin())),
    op("cos", 1e-6, 1e-6, |x, _| one(x[0].cos())),
    // the gradient is exp(-x²): exp's bound at x² up to 16
    op("erf", 1e-6, 2e-5, |x, _| one(x[0].erf())),
    // 1 + erf(x/√2) and 1 + tanh(..) cancel for negative x: absolute error near 0
    op("gelu", 1e-5, 2e-5, |x, _| one(x[0].gelu())).atol(1e-6),
    op("gelu_tanh", 1e-5, 2e-5, |x, _| one(x[0].gelu_tanh())).atol(1e-6),
    op("silu", 4e-6, 1e-5, |x, _| one(x[0].silu())),
    // ln(1 + e^x) and its gradient sigmoid(x): e^x's bound where the result is e^x (x below -15)
    op("softplus", 2e-5, 2e-5, |x, _| one(x[0].softplus())),
    op("mul_scalar", 0.0, 0.0, |x, a| one(x[0].mul_scalar(f(a, "s")))),
    op("add_scalar", 0.0, 0.0, |x, a| one(x[0].add_scalar(f(a, "s")))),
    op("clamp", 0.0, 0.0, |x, a| one(x[0].clamp(opt(a, "min"), opt(a, "max")))),
    op("where", 0.0, 1e-6, |x, _| one(x[0].where_(&x[1], &x[2]))),
    op("masked_fill", 0.0, 0.0, |x, a| one(x[0].masked_fill(&x[1], f(a, "value")))),
    // a sum of squares of centred values
    op("var", 1e-5, 1e-5, |x, a| one(x[0].var(i(a, "axis"), u(a, "correction"), b(a, "keepdim")))).atol(1e-6),
    op("std", 1e-5, 1e-5, |x, a| one(x[0].std(i(a, "axis"), u(a, "correction"), b(a, "keepdim")))).atol(1e-6),
    op("mean_axes", 1e-6, 1e-6, |x, a| {
        one(x[0].mean_axes(&a["axes"].as_array().expect("axes").iter().map(|v| v.as_i64().expect("axis") as isize).collect::<Vec<_>>()))
    }),
    op("stack", 0.0, 0.0, |x, a| one(Tensor::stack(x, u(a, "dim")))),
    op("unsqueeze", 0.0, 0.0, |x, a| one(x[0].unsqueeze(i(a, "dim")))),
    op("squeeze", 0.0, 0.0, |x, a| one(x[0].squeeze(i(a, "dim")))),
    // no input: on the CPU (the fixture's inputs say nothing of a device)
    op("arange", 0.0, 0.0, |_, a| one(Tensor::arange(f(a, "start"), f(a, "end"), f(a, "step"), &Device::cpu()))),
    op("one_hot", 0.0, 0.0, |x, a| one(x[0].one_hot(u(a, "classes")))),
    op("triu", 0.0, 0.0, |x, a| one(x[0].triu(i(a, "diagonal")))),
    op("tril", 0.0, 0.0, |x, a| one(x[0].tril(i(a, "diagonal")))),
    op("index_select", 0.0, 0.0, |x, _| one(x[0].index_select(&x[1]))),
    // ids made on the device: checked and planned from one read
    op("index_select_cast", 0.0, 0.0, |x, _| one(x[0].index_select(&x[1].to_dtype(DType::I32)?))),
    op("avg_pool2d", 1e-5, 1e-5, |x, a| one(x[0].avg_pool2d(u(a, "kernel"), u(a, "stride"), u(a, "pad")))).atol(1e-6),
    op("adaptive_avg_pool2d", 1e-6, 1e-6, |x, a| one(x[0].adaptive_avg_pool2d(pair(a, "size")))),
    op("cross_entropy_with", 2e-5, 2e-5, |x, a| {
        let opts = CrossEntropy { ignore_index: Some(i(a, "ignore_index") as i32), label_smoothing: f(a, "label_smoothing") };
        one(x[0].cross_entropy_with(&x[1], opts))
    })
    .atol(1e-6),
    op("nll_loss", 1e-6, 1e-6, |x, a| one(x[0].nll_loss(&x[1], Some(i(a, "ignore_index") as i32)))),
    op("bce_with_logits", 2e-5, 2e-5, |x, _| one(x[0].bce_with_logits(&x[1]))).atol(1e-6),
    op("l1_loss", 1e-6, 1e-6, |x, _| one(x[0].l1_loss(&x[1]))),
    op("huber_loss", 1e-6, 1e-6, |x, a| one(x[0].huber_loss(&x[1], f(a, "delta")))),
    op("layer_norm", 1e-5, 1e-5, |x, _| one(LayerNorm { weight: x[1].clone(), bias: x[2].clone(), eps: 1e-5 }.forward(&x[0]))).atol(1e-6),
    op("batch_norm", 1e-5, 1e-5, |x, a| {
        let (c, dev) = (x[0].dims()[1], x[0].device());
        let layer: Box<dyn Module> = if x[0].rank() == 4 { Box::new(BatchNorm2d::new(c, dev)?) } else { Box::new(BatchNorm1d::new(c, dev)?) };
        layer.set_training(b(a, "train"));
        one(layer.forward(&x[0]))
    })
    .atol(1e-6),
    // sums of exp over a row in another order (the online softmax rescales as it goes)
    op("causal_softmax", 2e-5, 2e-5, |x, a| one(x[0].causal_softmax(f(a, "scale")))).atol(1e-6),
    // the gradients with respect to q and k carry the scale: at scale 40 rounding in the scores
    // is amplified 40 times
    op("causal_attention", 2e-5, 1e-4, |x, a| one(Tensor::causal_attention(&x[0], &x[1], &x[2], f(a, "scale")))).atol(1e-6),
    // the norm is summed in another order (f64 over tensors)
    op("clip_grad_norm", 1e-6, 0.0, |x, a| clip(x, f(a, "max_norm"))),
];

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/torch_edge_cases.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture readable")).expect("fixture is JSON")
}

fn dims(v: &Value) -> Vec<usize> {
    v["shape"].as_array().expect("shape").iter().map(|d| d.as_u64().expect("dim") as usize).collect()
}

fn floats(v: &Value) -> Vec<f32> {
    let hex = v["f32"].as_array().expect("f32 values");
    hex.iter().map(|h| f32::from_bits(u32::from_str_radix(h.as_str().expect("hex"), 16).expect("hex bits"))).collect()
}

fn ints(v: &Value) -> Vec<i32> {
    v["i32"].as_array().expect("i32 values").iter().map(|x| x.as_i64().expect("integer") as i32).collect()
}

/// The case's inputs on `dev`; floats require a gradient when the case has gradients.
fn inputs(case: &Value, dev: &Device) -> Result<Vec<Tensor>> {
    let grad = case.get("grads").is_some();
    let ins = case["inputs"].as_array().expect("inputs");
    ins.iter()
        .map(|x| {
            if x.get("i32").is_some() {
                Tensor::from_labels(ints(x), dims(x), dev)
            } else {
                let t = Tensor::from_vec(floats(x), dims(x), dev)?;
                Ok(if grad { t.requires_grad() } else { t })
            }
        })
        .collect()
}

/// Whether `g` is `w` by the comparison rule.
fn agrees(g: f32, w: f32, atol: f32, rtol: f32, zero_sign: bool) -> bool {
    if w.is_nan() || g.is_nan() {
        return w.is_nan() && g.is_nan();
    }
    if g == 0.0 && w == 0.0 {
        return !zero_sign || g.is_sign_negative() == w.is_sign_negative();
    }
    g == w || (w.is_finite() && (g - w).abs() <= atol + rtol * w.abs())
}

/// The comparison rule; `alt` holds PyTorch's other answer at some positions (its scalar path
/// where it differs from its vector path), either of which is accepted; `zero_sign`: whether
/// the sign of a zero is checked.
fn compare(what: &str, got: &[f32], want: &[f32], alt: &Value, atol: f32, rtol: f32, zero_sign: bool) -> std::result::Result<(), String> {
    let mut want = want.to_vec();
    for (k, (&g, w)) in got.iter().zip(want.iter_mut()).enumerate() {
        if let Some(a) = alt.get(k.to_string()).map(|h| f32::from_bits(u32::from_str_radix(h.as_str().expect("hex"), 16).expect("hex bits"))) {
            if agrees(g, a, atol, rtol, zero_sign) {
                *w = a;
            }
        }
        if zero_sign && g == 0.0 && *w == 0.0 && g.is_sign_negative() != w.is_sign_negative() {
            return Err(format!("{what}: element {k} is {g:?} but PyTorch has {w:?}"));
        }
    }
    check_close(what, got, &want, atol, rtol)
}

/// Runs one case on `dev`; Err describes the first mismatch. Gradients are those of
/// sum_k sum(out_k * w_k), w_k the fixture's `weights` repeated.
fn check_case(case: &Value, dev: &Device, weights: &[f32]) -> std::result::Result<(), String> {
    let name = case["name"].as_str().expect("name");
    let op_name = case["op"].as_str().expect("op");
    let op = OPS.iter().find(|o| o.name == op_name).ok_or_else(|| format!("{name}: op '{op_name}' is not in OPS"))?;
    let xs = inputs(case, dev).map_err(|e| format!("{name}: inputs: {e}"))?;
    let result = (op.run)(&xs, &case["args"]);
    if let Some(err) = case.get("error") {
        return match result {
            Err(_) => Ok(()),
            Ok(_) => Err(format!("{name}: PyTorch fails ({err}) but tandem returns a value")),
        };
    }
    let outs = result.map_err(|e| format!("{name}: tandem fails: {e}"))?;
    let want = case["outputs"].as_array().expect("outputs");
    if outs.len() != want.len() {
        return Err(format!("{name}: {} outputs, PyTorch has {}", outs.len(), want.len()));
    }
    let alt = &case["alternatives"];
    for (k, (o, w)) in outs.iter().zip(want).enumerate() {
        if o.dims() != dims(w) {
            return Err(format!("{name}: output {k} has shape {:?}, PyTorch's {:?}", o.dims(), dims(w)));
        }
        if w.get("i32").is_some() {
            let got = o.to_vec_i32().map_err(|e| e.to_string())?;
            if got != ints(w) {
                return Err(format!("{name}: output {k} is {got:?}, PyTorch's {:?}", ints(w)));
            }
        } else {
            compare(
                &format!("{name}: output {k}"),
                &o.to_vec().map_err(|e| e.to_string())?,
                &floats(w),
                &alt["outputs"],
                op.atol.max(FLUSH),
                op.rtol,
                true,
            )?;
        }
    }
    let Some(grads) = case.get("grads") else {
        return Ok(());
    };
    let mut loss: Option<Tensor> = None;
    for o in &outs {
        let w: Vec<f32> = (0..o.numel()).map(|j| weights[j % weights.len()]).collect();
        let term = o
            .mul(&Tensor::from_vec(w, o.dims().to_vec(), dev).map_err(|e| e.to_string())?)
            .and_then(|t| t.sum_all())
            .map_err(|e| format!("{name}: loss: {e}"))?;
        loss = Some(match loss {
            None => term,
            Some(l) => l.add(&term).map_err(|e| e.to_string())?,
        });
    }
    loss.expect("an output").backward().map_err(|e| format!("{name}: backward: {e}"))?;
    for (k, (x, g)) in xs.iter().zip(grads.as_array().expect("grads")).enumerate() {
        if g.is_null() {
            continue;
        }
        let got = match x.grad() {
            Some(t) => t.to_vec().map_err(|e| e.to_string())?,
            None => vec![0.0; x.numel()],
        };
        compare(
            &format!("{name}: gradient of input {k}"),
            &got,
            &floats(g),
            &alt["grads"][k],
            op.atol.max(GRAD_FLUSH),
            op.grad_rtol,
            op.grad_zero_sign,
        )?;
    }
    Ok(())
}

/// Every case on one device; panics listing every mismatch.
fn check_device(dev: &Device) -> Result<()> {
    let info = dev.info();
    let fx = fixture();
    let weights: Vec<f32> = fx["weights"].as_array().expect("weights").iter().map(|w| w.as_f64().expect("weight") as f32).collect();
    let cases = fx["cases"].as_array().expect("cases");
    let failures: Vec<String> = cases.iter().filter_map(|c| check_case(c, dev, &weights).err()).collect();
    let covered: Vec<&str> = cases.iter().map(|c| c["op"].as_str().expect("op")).collect();
    let missing: Vec<&str> = OPS.iter().map(|o| o.name).filter(|n| !covered.contains(n)).collect();
    assert!(missing.is_empty(), "ops without a fixture case (rerun scripts/torch_edge_cases.py): {missing:?}");
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from PyTorch on {dev} ({}):\n{}",
        failures.len(),
        cases.len(),
        info.name,
        failures.join("\n")
    );
    Ok(())
}

#[test]
fn edge_cases() {
    common::on_every_device(check_device);
}
