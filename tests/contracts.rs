//! Every `Backend` op checks its buffers at the trait boundary: on the CPU reference and every
//! device under test, a buffer one element short or of the wrong dtype, a spec that reaches
//! past a buffer or overflows, and an output aliasing an input are errors naming the op, never
//! a panic or an out-of-bounds read.
mod common;

use tandem::backend::{Backend, Buffer, CastOp, IndexOp, MatmulSpec, OptimStep, ReduceOp, ReduceSpec, UnaryOp, WindowSpec};
use tandem::{DType, Device, Error, Layout, Result};

type Run = Box<dyn Fn(&dyn Backend, &[Buffer]) -> Result<()>>;

/// One op: the errors' op name, its operands as (length, dtype, whether a shorter buffer is an
/// error, whether the other dtype is), and the call.
struct Case {
    op: &'static str,
    operands: Vec<(usize, DType, bool, bool)>,
    run: Run,
}

fn case(op: &'static str, operands: &[(usize, DType, bool, bool)], run: impl Fn(&dyn Backend, &[Buffer]) -> Result<()> + 'static) -> Case {
    Case { op, operands: operands.to_vec(), run: Box::new(run) }
}

const F: DType = DType::F32;
const I: DType = DType::I32;

fn mm() -> MatmulSpec {
    MatmulSpec::new(2, 2, 3, 4)
}
fn conv() -> WindowSpec {
    WindowSpec::new("test", [1, 2, 5, 5], (3, 3), (1, 1), (1, 1)).unwrap()
}
fn pool() -> WindowSpec {
    WindowSpec::new("test", [1, 2, 5, 5], (2, 2), (2, 2), (0, 0)).unwrap()
}

fn cases() -> Vec<Case> {
    let transposed = Layout { shape: vec![3, 2], strides: vec![1, 3], offset: 0 };
    let (t1, t2) = (transposed.clone(), transposed.clone());
    let red = ReduceSpec { outer: 2, len: 3, inner: 4 };
    let (sgd, adam) = (optim_sgd(), optim_adam(1));
    let c = conv();
    let cols = c.n * c.col_rows() * c.col_len();
    vec![
        // A copy moves words of any dtype.
        case("copy", &[(5, F, true, false), (5, F, true, false)], |b, x| b.copy(&x[0], 1, &x[1], 1, 4)),
        case("unary", &[(6, F, true, true), (6, F, true, true)], move |b, x| b.unary(UnaryOp::Exp, &x[0], &t1, &x[1])),
        case("binary", &[(6, F, true, true), (6, F, true, true), (6, F, true, true)], move |b, x| {
            b.binary(tandem::backend::BinaryOp::Add, &x[0], &t2, &x[1], &Layout::contiguous(&[3, 2].into()), &x[2])
        }),
        case("reduce", &[(24, F, true, true), (8, F, true, true)], move |b, x| b.reduce(ReduceOp::Sum, &x[0], red, &x[1])),
        case("reduce", &[(24, F, true, true), (8, I, true, true)], move |b, x| b.reduce(ReduceOp::ArgMax, &x[0], red, &x[1])),
        case("matmul", &[(16, F, true, true), (24, F, true, true), (12, F, true, true)], |b, x| b.matmul(&x[0], &x[1], &x[2], mm())),
        case("matmul", &[(16, F, true, true), (24, F, true, true), (2, F, true, true), (12, F, true, true)], |b, x| {
            b.matmul_row_bias(&x[0], &x[1], &x[2], &x[3], mm(), true).map(drop)
        }),
        case("im2col", &[(50, F, true, true), (cols, F, true, true)], |b, x| b.im2col(&x[0], &x[1], conv())),
        case("col2im", &[(cols, F, true, true), (50, F, true, true)], |b, x| b.col2im(&x[0], &x[1], conv())),
        case("max_pool2d", &[(50, F, true, true), (8, F, true, true), (8, I, true, true)], |b, x| b.max_pool2d(&x[0], &x[1], &x[2], pool())),
        case("max_pool2d_backward", &[(8, F, true, true), (8, I, true, true), (50, F, true, true)], |b, x| {
            b.max_pool2d_backward(&x[0], &x[1], &x[2], pool())
        }),
        case("index", &[(12, F, true, true), (3, I, true, true), (3, F, true, true)], |b, x| b.index(IndexOp::Gather, &x[0], &x[1], &x[2], 3, 4)),
        case("index", &[(3, F, true, true), (3, I, true, true), (12, F, true, true)], |b, x| b.index(IndexOp::Scatter, &x[0], &x[1], &x[2], 3, 4)),
        case("index", &[(12, F, true, true), (5, I, true, true), (20, F, true, true)], |b, x| {
            b.index(IndexOp::GatherRows { table_rows: 3 }, &x[0], &x[1], &x[2], 5, 4)
        }),
        case("index", &[(20, F, true, true), (9, I, true, true), (12, F, true, true)], |b, x| {
            b.index(IndexOp::ScatterAddRows { table_rows: 3 }, &x[0], &x[1], &x[2], 5, 4)
        }),
        case("cast", &[(5, I, true, true), (5, F, true, true)], |b, x| b.cast(CastOp::I32ToF32, &x[0], &x[1], 5)),
        case("cast", &[(5, F, true, true), (5, I, true, true)], |b, x| b.cast(CastOp::F32ToI32, &x[0], &x[1], 5)),
        // The parameter's length is the update's length: a shorter one is a smaller update.
        case("optim_step", &[(5, F, false, true), (5, F, true, true), (5, F, true, true)], move |b, x| {
            b.optim_step(sgd, &x[0], &x[1], &[&x[2]]).map(drop)
        }),
        case("optim_step", &[(5, F, false, true), (5, F, true, true), (5, F, true, true), (5, F, true, true)], move |b, x| {
            b.optim_step(adam, &x[0], &x[1], &[&x[2], &x[3]]).map(drop)
        }),
    ]
}

/// A zeroed buffer: zero is a valid label and a valid pooling position.
fn buffer(dev: &Device, len: usize, dtype: DType) -> Buffer {
    let b = dev.backend().alloc(len, dtype).expect("alloc");
    dev.backend().fill(&b, 0.0).expect("fill");
    b
}

#[track_caller]
fn rejected(dev: &Device, op: &str, what: &str, r: Result<()>) {
    match r {
        Ok(()) => panic!("on {dev}: {op} with {what} succeeded"),
        Err(e) => assert!(e.to_string().contains(op), "on {dev}: {op} with {what}: the error does not name the op: {e}"),
    }
}

/// Each case runs once as given (and must pass, so the errors below are the operand's), then
/// once per operand with a buffer one element short and once with the other dtype.
fn short_and_mistyped_operands_are_errors(dev: &Device) {
    let b = dev.backend();
    for Case { op, operands, run } in cases() {
        let good: Vec<Buffer> = operands.iter().map(|&(n, t, _, _)| buffer(dev, n, t)).collect();
        run(b, &good).unwrap_or_else(|e| panic!("on {dev}: {op} with valid operands failed: {e}"));
        for (i, &(n, t, short, typed)) in operands.iter().enumerate() {
            let mut args = good.clone();
            if short {
                args[i] = buffer(dev, n - 1, t);
                rejected(dev, op, &format!("operand {i} one element short"), run(b, &args));
            }
            if typed {
                args[i] = buffer(dev, n, if t == F { I } else { F });
                rejected(dev, op, &format!("operand {i} of the wrong dtype"), run(b, &args));
            }
        }
    }
}

/// Specs that reach past their buffers or overflow, aliasing, and malformed host input.
fn bad_specs_are_errors(dev: &Device) {
    let b = dev.backend();
    let f = |n| buffer(dev, n, F);
    let (a, x, out) = (f(16), f(24), f(12));
    rejected(dev, "matmul", "an output aliasing an input", b.matmul(&a, &x, &a, MatmulSpec { batch: 1, ..mm() }));
    let offset = MatmulSpec { a_offset: 1, ..mm() };
    rejected(dev, "matmul", "an offset past the end", b.matmul(&a, &x, &out, offset));
    let huge = MatmulSpec { m: usize::MAX / 2, a_batch_stride: 0, ..mm() };
    rejected(dev, "matmul", "sizes that overflow", b.matmul(&a, &x, &out, huge));
    let wide = Layout { shape: vec![3, 2], strides: vec![2, 1], offset: 1 };
    rejected(dev, "unary", "a layout offset past the end", b.unary(UnaryOp::Neg, &f(6), &wide, &f(6)));
    let ragged = Layout { shape: vec![3, 2], strides: vec![2], offset: 0 };
    rejected(dev, "unary", "a stride missing", b.unary(UnaryOp::Neg, &f(6), &ragged, &f(6)));
    let overflow = ReduceSpec { outer: usize::MAX, len: 2, inner: 2 };
    rejected(dev, "reduce", "sizes that overflow", b.reduce(ReduceOp::Sum, &f(8), overflow, &f(8)));
    let tall = WindowSpec { oh: 9, ..conv() };
    rejected(dev, "im2col", "an output size the window does not give", b.im2col(&f(50), &f(9 * 18 * 5), tall));
    let zero = WindowSpec { stride: (0, 1), ..conv() };
    rejected(dev, "im2col", "a zero stride", b.im2col(&f(50), &f(450), zero));
    rejected(dev, "alloc", "a size that overflows", b.alloc(usize::MAX, F).map(drop));
    rejected(dev, "upload", "a partial element", b.upload(&[0, 0, 0], F).map(drop));
    rejected(dev, "optim_step", "no momentum buffer", b.optim_step(optim_sgd(), &f(5), &f(5), &[]).map(drop));
    rejected(dev, "optim_step", "step 0", b.optim_step(optim_adam(0), &f(5), &f(5), &[&f(5), &f(5)]).map(drop));
}

fn optim_sgd() -> OptimStep {
    OptimStep::Sgd { lr: 0.1, momentum: 0.9, dampening: 0.0, nesterov: false, weight_decay: 0.0, first: true }
}
fn optim_adam(step: u64) -> OptimStep {
    OptimStep::Adam { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, decoupled: true, step }
}

/// The CPU reference indexes its planes with the recorded positions: one outside is an error
/// there; the GPU kernels only compare positions, so there it must simply not fail.
fn bad_pool_positions(dev: &Device) {
    let b = dev.backend();
    let arg = b.upload(bytemuck::cast_slice(&[0i32, 1, 2, 3, 4, 5, 6, 99]), I).unwrap();
    let r = b.max_pool2d_backward(&buffer(dev, 8, F), &arg, &buffer(dev, 50, F), pool());
    if dev.info().backend == tandem::BackendKind::Cpu {
        let e = r.expect_err("a position outside the plane");
        assert!(matches!(e, Error::Invalid { op: "max_pool2d_backward", .. }), "{e}");
    } else {
        r.unwrap_or_else(|e| panic!("on {dev}: {e}"));
    }
}

fn every_device(check: impl Fn(&Device)) {
    common::on_every_device(|dev| {
        check(dev);
        Ok(())
    });
}

#[test]
fn every_op_rejects_short_and_mistyped_buffers() {
    every_device(short_and_mistyped_operands_are_errors);
}

#[test]
fn specs_past_their_buffers_are_errors() {
    every_device(bad_specs_are_errors);
}

#[test]
fn pooling_positions_outside_the_plane() {
    every_device(bad_pool_positions);
}
