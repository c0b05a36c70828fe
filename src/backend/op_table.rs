//! The one table of elementwise ops: every unary and binary op is one entry of `unary_ops!` or
//! `binary_ops!` here, from which the op enums, their kernel codes, the CPU reference, the
//! gradient rules, the `Tensor` methods and the kernels' code constants are all generated.
//!
//! An entry gives, in order: the doc (the variant's, and the method's if it has one); the
//! variant, with its `f32` parameters and the representative values `ALL` gives them; its code,
//! the number the kernels switch on; its short name (errors use it); for a unary op
//! optionally `fn name`, a `Tensor` method applying it; the CPU expression of the inputs (and
//! parameters); the gradient rule, an expression giving the input's gradient (a unary op) or
//! both inputs' optional gradients before broadcasting is undone (a binary op) from the inputs,
//! the output and the incoming gradient `g`; and which of the inputs and the output that rule
//! reads (what autograd must keep alive).
//!
//! The tables are macros so that each layer expands what it owns: `define` (below) the enums;
//! `cpu` in `backend::cpu::kernels`, the scalar reference; `pass` in `backend::cpu::elementwise`,
//! one strided loop per op with the op constant, so that the CPU expression is inlined; `grad`
//! in `autograd::rules`; `methods` in `tensor::ops`. An expression's names resolve where its
//! mode expands (`tanh` is the CPU kernels', `g.mul` a `Tensor` method). The kernels get the codes
//! from [`wgsl_constants`] and [`cuda_constants`], appended to every shader module and prepended
//! to every kernel file (`const UNARY_TANH: u32 = 10u;` in WGSL, an enumerator in CUDA), so a
//! kernel's `switch` names the ops; a code without a case gives NaN on every backend, as
//! [`UnaryOp::reference`] does on the host.

/// The unary ops: expands `unary_expand!` in the given mode over the table.
macro_rules! unary_ops {
    ($($mode:tt)*) => {
        $crate::backend::op_table::unary_expand! { [$($mode)*]
            /// `x` itself (a strided copy).
            Identity = 0, "identity";
                cpu |x| x; grad |x, y, g| Ok(g.clone()); reads input: false, output: false;
            /// `-x`.
            Neg = 1, "neg", fn neg;
                cpu |x| -x; grad |x, y, g| g.neg(); reads input: false, output: false;
            /// `e^x`.
            Exp = 2, "exp", fn exp;
                cpu |x| x.exp(); grad |x, y, g| g.mul(y); reads input: true, output: true;
            /// The natural logarithm.
            Log = 3, "log", fn log;
                cpu |x| x.ln(); grad |x, y, g| g.div(x); reads input: true, output: false;
            /// `max(x, 0)`; NaN and -0 pass through, as in PyTorch (`x < 0` is false for both).
            Relu = 4, "relu", fn relu;
                cpu |x| if x < 0.0 { 0.0 } else { x };
                grad |x, y, g| g.binary(BinaryOp::ReluBackward, x); reads input: true, output: false;
            /// 1 where x > 0, else 0 (the derivative of relu).
            Step = 5, "step";
                cpu |x| (x > 0.0) as i32 as f32; grad |x, y, g| g.mul_scalar(0.0); reads input: true, output: false;
            /// The square root.
            Sqrt = 6, "sqrt", fn sqrt;
                // d sqrt(x) = 1 / (2 sqrt(x))
                cpu |x| x.sqrt(); grad |x, y, g| g.div(y)?.mul_scalar(0.5); reads input: true, output: true;
            /// `1 / x`.
            Recip = 7, "recip", fn recip;
                // d (1/x) = -1/x² = -y²
                cpu |x| 1.0 / x; grad |x, y, g| g.mul(&y.square()?)?.neg(); reads input: true, output: true;
            /// `x²`.
            Square = 8, "square", fn square;
                cpu |x| x * x; grad |x, y, g| g.mul(x)?.mul_scalar(2.0); reads input: true, output: false;
            /// `|x|`.
            Abs = 9, "abs", fn abs;
                // sign(x) = step(x) - step(-x)
                cpu |x| x.abs();
                grad |x, y, g| g.mul(&x.unary(UnaryOp::Step)?.sub(&x.neg()?.unary(UnaryOp::Step)?)?);
                reads input: true, output: false;
            /// The hyperbolic tangent.
            Tanh = 10, "tanh", fn tanh;
                cpu |x| tanh(x); grad |x, y, g| g.mul(&y.square()?.affine(-1.0, 1.0)?); reads input: true, output: true;
            /// The logistic function `1 / (1 + e^-x)`.
            Sigmoid = 11, "sigmoid", fn sigmoid;
                cpu |x| 1.0 / (1.0 + (-x).exp()); grad |x, y, g| g.mul(&y.mul(&y.affine(-1.0, 1.0)?)?);
                reads input: true, output: true;
            /// `x * mul + add`.
            Affine { mul = 0.5, add = -1.25 } = 12, "affine";
                cpu |x| x * mul + add; grad |x, y, g| g.mul_scalar(mul); reads input: false, output: false;
            /// `x ^ p` (PyTorch's `pow` with a scalar exponent).
            Powf(p = 1.5) = 13, "powf";
                // p·x^(p-1), in PyTorch's order and with its special case: zeros for p = 0 (not
                // 0·x^-1, which is NaN at x = 0)
                cpu |x| powf(x, p);
                grad |x, y, g| if p == 0.0 { Tensor::zeros(x.dims().to_vec(), g.device()) } else { g.mul(&x.powf(p - 1.0)?.mul_scalar(p)?) };
                reads input: true, output: false;
            /// The sine.
            Sin = 14, "sin", fn sin;
                cpu |x| x.sin(); grad |x, y, g| g.mul(&x.cos()?); reads input: true, output: false;
            /// The cosine.
            Cos = 15, "cos", fn cos;
                cpu |x| x.cos(); grad |x, y, g| g.mul(&x.sin()?.neg()?); reads input: true, output: false;
            /// The error function, `2/√π ∫₀ˣ e^(-t²) dt`.
            Erf = 16, "erf", fn erf;
                // odd, so the sign is x's: erf(-0) = -0; d erf(x) = 2/√π · e^(-x²)
                cpu |x| (crate::backend::erf(x as f64) as f32).copysign(x);
                grad |x, y, g| g.mul(&x.square()?.neg()?.exp()?.mul_scalar(std::f32::consts::FRAC_2_SQRT_PI)?);
                reads input: true, output: false;
            /// `ln(1 + e^x)`, and `x` itself above 20, as PyTorch's `softplus` (beta 1, threshold
            /// 20); its gradient is `sigmoid(x)` (exactly 1 in f32 above 20, as PyTorch's).
            Softplus = 17, "softplus", fn softplus;
                cpu |x| if x > 20.0 { x } else { x.exp().ln_1p() }; grad |x, y, g| g.mul(&x.sigmoid()?);
                reads input: true, output: false;
        }
    };
}
pub(crate) use unary_ops;

/// The binary ops: expands `binary_expand!` in the given mode over the table.
macro_rules! binary_ops {
    ($($mode:tt)*) => {
        $crate::backend::op_table::binary_expand! { [$($mode)*]
            /// `a + b`.
            Add = 0, "add";
                cpu |a, b| a + b; grad |a, b, y, g| (Some(g.clone()), Some(g.clone())); reads input: false, output: false;
            /// `a - b`.
            Sub = 1, "sub";
                cpu |a, b| a - b; grad |a, b, y, g| (Some(g.clone()), Some(g.neg()?)); reads input: false, output: false;
            /// `a * b`.
            Mul = 2, "mul";
                cpu |a, b| a * b; grad |a, b, y, g| (Some(g.mul(b)?), Some(g.mul(a)?)); reads input: true, output: false;
            /// `a / b`.
            Div = 3, "div";
                // d(a/b)/db = -a/b² = -(y/b), in that order (PyTorch's), so that it does not
                // overflow where the result does not
                cpu |a, b| a / b; grad |a, b, y, g| (Some(g.div(b)?), Some(y.div(b)?.mul(g)?.neg()?));
                reads input: true, output: true;
            /// `torch.maximum`: NaN if either is NaN; +0 above -0.
            Max = 4, "maximum";
                cpu |a, b| maximum(a, b); grad |a, b, y, g| max_min(true, a, b, g)?; reads input: true, output: false;
            /// `torch.minimum`: NaN if either is NaN; -0 below +0.
            Min = 5, "minimum";
                cpu |a, b| -maximum(-a, -b); grad |a, b, y, g| max_min(false, a, b, g)?; reads input: true, output: false;
            /// 1.0 where a > b, else 0.0
            Gt = 6, "gt";
                cpu |a, b| (a > b) as i32 as f32; grad |a, b, y, g| (None, None); reads input: true, output: false;
            /// 1.0 where a == b, else 0.0
            Eq = 7, "eq";
                cpu |a, b| (a == b) as i32 as f32; grad |a, b, y, g| (None, None); reads input: true, output: false;
            /// 0.0 where b <= 0, else a: ReLU's gradient in one pass (a = grad_out, b = the ReLU's
            /// input), 0 even where a is NaN or infinite and a where b is NaN, as PyTorch's
            /// threshold_backward.
            ReluBackward = 8, "relu_backward";
                // piecewise constant in b: zero wherever defined
                cpu |a, b| if b <= 0.0 { 0.0 } else { a };
                grad |a, b, y, g| (Some(g.binary(BinaryOp::ReluBackward, b)?), Some(Tensor::zeros(b.dims().to_vec(), g.device())?));
                reads input: true, output: false;
        }
    };
}
pub(crate) use binary_ops;

/// The unary table in one mode: `[define]` the enum and its impl, `[cpu op, x]` the CPU
/// value of `op` at `x`, `[pass op, layout, xs, out]` the CPU pass, `[grad op, x, y, g]` the
/// gradient rule, `[methods]` the `Tensor` methods.
macro_rules! unary_expand {
    ([define] $(
        $(#[$attr:meta])*
        $V:ident $(($tn:ident = $te:expr))? $({ $($fname:ident = $fe:expr),* })? = $code:literal, $name:literal $(, fn $method:ident)?;
        cpu |$x:ident| $cpu:expr; grad |$gx:ident, $gy:ident, $g:ident| $grad:expr; reads input: $ri:literal, output: $ro:literal;
    )*) => {
        /// Elementwise ops of one input. Parameters travel in the variant. Defined by the table in
        /// `backend/op_table.rs`.
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub enum UnaryOp {
            $( $(#[$attr])* $V $((  $crate::backend::op_table::f32_of!($tn) ))? $({ $($fname: f32),* })?, )*
        }

        #[allow(unused_variables, unused_mut)]
        impl UnaryOp {
            /// Every op, with representative parameters: conformance tests iterate over this list.
            pub const ALL: [UnaryOp; [$(stringify!($V)),*].len()] = [$( UnaryOp::$V $(($te))? $({ $($fname: $fe),* })? ),*];
            /// Every op's variant name and code, in table order: the kernels' constants.
            pub const CODES: [(&'static str, u32); [$(stringify!($V)),*].len()] = [$( (stringify!($V), $code) ),*];

            /// Stable small integer passed to kernels; the WGSL and CUDA `switch` name it by the
            /// constant `UNARY_<NAME>` (see [`wgsl_constants`](crate::backend::op_table::wgsl_constants)).
            pub fn code(self) -> u32 {
                match self { $( UnaryOp::$V $(($tn))? $({ $($fname),* })? => $code, )* }
            }
            /// The two f32 parameters passed to kernels beside the code (0 where unused).
            pub fn params(self) -> [f32; 2] {
                match self {
                    $( UnaryOp::$V $(($tn))? $({ $($fname),* })? => {
                        let given: &[f32] = &[$($tn,)? $($($fname,)*)?];
                        [given.first().copied().unwrap_or(0.0), given.get(1).copied().unwrap_or(0.0)]
                    } )*
                }
            }
            /// The op of kernel code `code` with parameters `params` (as `params()` gives them),
            /// or `None` for a code outside the table.
            pub fn from_code(code: u32, params: [f32; 2]) -> Option<UnaryOp> {
                let mut next = params.into_iter();
                match code {
                    $( $code => Some(UnaryOp::$V $(({ let _ = stringify!($tn); next.next().unwrap_or(0.0) }))?
                        $({ $($fname: next.next().unwrap_or(0.0)),* })?), )*
                    _ => None,
                }
            }
            /// The op's short name (`"tanh"`).
            pub fn name(self) -> &'static str {
                match self { $( UnaryOp::$V $(($tn))? $({ $($fname),* })? => $name, )* }
            }
            /// What every kernel computes for code `code` with parameters `params` at `x`: the
            /// CPU reference of the op, or NaN for a code outside the table.
            pub fn reference(code: u32, params: [f32; 2], x: f32) -> f32 {
                UnaryOp::from_code(code, params).map_or(f32::NAN, |op| $crate::backend::cpu::unary(op, x))
            }
            /// Whether the gradient rule reads the op's input.
            pub(crate) fn grad_reads_input(self) -> bool {
                match self { $( UnaryOp::$V $(($tn))? $({ $($fname),* })? => $ri, )* }
            }
            /// Whether the gradient rule reads the op's output.
            pub(crate) fn grad_reads_output(self) -> bool {
                match self { $( UnaryOp::$V $(($tn))? $({ $($fname),* })? => $ro, )* }
            }
        }
        $crate::backend::op_table::distinct_codes!("UnaryOp", $($code),*);
    };
    ([cpu $op:ident, $v:ident] $(
        $(#[$attr:meta])*
        $V:ident $(($tn:ident = $te:expr))? $({ $($fname:ident = $fe:expr),* })? = $code:literal, $name:literal $(, fn $method:ident)?;
        cpu |$x:ident| $cpu:expr; grad |$gx:ident, $gy:ident, $g:ident| $grad:expr; reads input: $ri:literal, output: $ro:literal;
    )*) => {
        match $op { $( $crate::backend::UnaryOp::$V $(($tn))? $({ $($fname),* })? => { let $x = $v; $cpu } )* }
    };
    ([pass $op:ident, $l:ident, $xs:ident, $out:ident] $(
        $(#[$attr:meta])*
        $V:ident $(($tn:ident = $te:expr))? $({ $($fname:ident = $fe:expr),* })? = $code:literal, $name:literal $(, fn $method:ident)?;
        cpu |$x:ident| $cpu:expr; grad |$gx:ident, $gy:ident, $g:ident| $grad:expr; reads input: $ri:literal, output: $ro:literal;
    )*) => {
        // Each arm names the op as a constant, so `unary` folds to that op's expression.
        match $op { $(
            $crate::backend::UnaryOp::$V $(($tn))? $({ $($fname),* })? => strided_map($l, $xs, $out, |a| {
                unary($crate::backend::UnaryOp::$V $(($tn))? $({ $($fname),* })?, a)
            }),
        )* }
    };
    ([grad $op:ident, $x0:ident, $y0:ident, $g0:ident] $(
        $(#[$attr:meta])*
        $V:ident $(($tn:ident = $te:expr))? $({ $($fname:ident = $fe:expr),* })? = $code:literal, $name:literal $(, fn $method:ident)?;
        cpu |$x:ident| $cpu:expr; grad |$gx:ident, $gy:ident, $g:ident| $grad:expr; reads input: $ri:literal, output: $ro:literal;
    )*) => {
        match $op { $(
            #[allow(unused_variables)]
            $crate::backend::UnaryOp::$V $(($tn))? $({ $($fname),* })? => {
                let ($gx, $gy, $g) = ($x0, $y0, $g0);
                $grad
            }
        )* }
    };
    ([methods] $(
        $(#[$attr:meta])*
        $V:ident $(($tn:ident = $te:expr))? $({ $($fname:ident = $fe:expr),* })? = $code:literal, $name:literal $(, fn $method:ident)?;
        cpu |$x:ident| $cpu:expr; grad |$gx:ident, $gy:ident, $g:ident| $grad:expr; reads input: $ri:literal, output: $ro:literal;
    )*) => {
        $( $crate::backend::op_table::unary_method! { [$($method)?] $(#[$attr])* $V } )*
    };
}
pub(crate) use unary_expand;

/// The binary table in one mode: `[define]`, `[cpu op, a, b]`, `[pass op, la, a, lb, b, out]`,
/// `[grad op, a, b, y, g]` (the pair of optional gradients), as `unary_expand!`.
macro_rules! binary_expand {
    ([define] $(
        $(#[$attr:meta])*
        $V:ident = $code:literal, $name:literal;
        cpu |$a:ident, $b:ident| $cpu:expr; grad |$ga:ident, $gb:ident, $gy:ident, $g:ident| $grad:expr;
        reads input: $ri:literal, output: $ro:literal;
    )*) => {
        /// Elementwise ops of two inputs, broadcast through their layouts. Defined by the table
        /// in `backend/op_table.rs`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum BinaryOp {
            $( $(#[$attr])* $V, )*
        }

        impl BinaryOp {
            /// Every op: conformance tests iterate over this list.
            pub const ALL: [BinaryOp; [$(stringify!($V)),*].len()] = [$( BinaryOp::$V ),*];
            /// Every op's variant name and code, in table order: the kernels' constants.
            pub const CODES: [(&'static str, u32); [$(stringify!($V)),*].len()] = [$( (stringify!($V), $code) ),*];

            /// Stable small integer passed to kernels, named `BINARY_<NAME>` in their `switch`.
            pub fn code(self) -> u32 {
                match self { $( BinaryOp::$V => $code, )* }
            }
            /// The op of kernel code `code`, or `None` for a code outside the table.
            pub fn from_code(code: u32) -> Option<BinaryOp> {
                match code { $( $code => Some(BinaryOp::$V), )* _ => None }
            }
            /// The op's short name, as errors write it (`"maximum"`).
            pub fn name(self) -> &'static str {
                match self { $( BinaryOp::$V => $name, )* }
            }
            /// What every kernel computes for code `code` at `(a, b)`: the CPU reference of the
            /// op, or NaN for a code outside the table.
            pub fn reference(code: u32, a: f32, b: f32) -> f32 {
                BinaryOp::from_code(code).map_or(f32::NAN, |op| $crate::backend::cpu::binary(op, a, b))
            }
            /// Whether the gradient rule reads the op's inputs.
            pub(crate) fn grad_reads_inputs(self) -> bool {
                match self { $( BinaryOp::$V => $ri, )* }
            }
            /// Whether the gradient rule reads the op's output.
            pub(crate) fn grad_reads_output(self) -> bool {
                match self { $( BinaryOp::$V => $ro, )* }
            }
        }
        $crate::backend::op_table::distinct_codes!("BinaryOp", $($code),*);
    };
    ([cpu $op:ident, $va:ident, $vb:ident] $(
        $(#[$attr:meta])*
        $V:ident = $code:literal, $name:literal;
        cpu |$a:ident, $b:ident| $cpu:expr; grad |$ga:ident, $gb:ident, $gy:ident, $g:ident| $grad:expr;
        reads input: $ri:literal, output: $ro:literal;
    )*) => {
        match $op { $( $crate::backend::BinaryOp::$V => { let ($a, $b) = ($va, $vb); $cpu } )* }
    };
    ([pass $op:ident, $la:ident, $xa:ident, $lb:ident, $xb:ident, $out:ident] $(
        $(#[$attr:meta])*
        $V:ident = $code:literal, $name:literal;
        cpu |$a:ident, $b:ident| $cpu:expr; grad |$ga:ident, $gb:ident, $gy:ident, $g:ident| $grad:expr;
        reads input: $ri:literal, output: $ro:literal;
    )*) => {
        match $op { $(
            $crate::backend::BinaryOp::$V => strided_zip($la, $xa, $lb, $xb, $out, |x, y| binary($crate::backend::BinaryOp::$V, x, y)),
        )* }
    };
    ([grad $op:ident, $a0:ident, $b0:ident, $y0:ident, $g0:ident] $(
        $(#[$attr:meta])*
        $V:ident = $code:literal, $name:literal;
        cpu |$a:ident, $b:ident| $cpu:expr; grad |$ga:ident, $gb:ident, $gy:ident, $g:ident| $grad:expr;
        reads input: $ri:literal, output: $ro:literal;
    )*) => {
        match $op { $(
            #[allow(unused_variables)]
            $crate::backend::BinaryOp::$V => {
                let ($ga, $gb, $gy, $g) = ($a0, $b0, $y0, $g0);
                $grad
            }
        )* }
    };
}
pub(crate) use binary_expand;

/// `f32`, whatever the parameter's name (a tuple variant's field type).
macro_rules! f32_of {
    ($t:ident) => {
        f32
    };
}
pub(crate) use f32_of;

/// A `Tensor` method applying unary op `$V`, for table entries with `fn name`.
macro_rules! unary_method {
    ([] $(#[$attr:meta])* $V:ident) => {};
    ([$method:ident] $(#[$attr:meta])* $V:ident) => {
        $(#[$attr])*
        pub fn $method(&self) -> Result<Tensor> {
            self.unary($crate::backend::UnaryOp::$V)
        }
    };
}
pub(crate) use unary_method;

/// A compile-time check that no two ops of a table share a code.
macro_rules! distinct_codes {
    ($what:literal, $($code:literal),*) => {
        const _: () = {
            let codes: &[u32] = &[$($code),*];
            let mut i = 0;
            while i < codes.len() {
                let mut j = i + 1;
                while j < codes.len() {
                    assert!(codes[i] != codes[j], concat!("two ", $what, " entries of backend/op_table.rs share a code"));
                    j += 1;
                }
                i += 1;
            }
        };
    };
}
pub(crate) use distinct_codes;

unary_ops!(define);
binary_ops!(define);

/// `Tanh` as `TANH`, `ReluBackward` as `RELU_BACKWARD`.
fn upper_snake(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// `(UNARY_TANH, 10)`, ... then `(BINARY_ADD, 0)`, ...: every op's kernel constant.
pub fn kernel_constants() -> Vec<(String, u32)> {
    let unary = UnaryOp::CODES.iter().map(|(n, c)| (format!("UNARY_{}", upper_snake(n)), *c));
    unary.chain(BinaryOp::CODES.iter().map(|(n, c)| (format!("BINARY_{}", upper_snake(n)), *c))).collect()
}

/// WGSL declarations of every op's code (`const UNARY_TANH: u32 = 10u;`), appended to every
/// shader module so that `switch OP` names its cases.
pub fn wgsl_constants() -> String {
    let lines: Vec<String> = kernel_constants().iter().map(|(n, c)| format!("const {n}: u32 = {c}u;")).collect();
    format!("// Generated from backend/op_table.rs.\n{}\n", lines.join("\n"))
}

/// CUDA declarations of every op's code, as enumerators (`enum UnaryCode : u32 { UNARY_TANH =
/// 10, .. }`: NVRTC warns of an unused constant variable, not of an unused enumerator),
/// prepended (after common.cuh) to every kernel file.
pub fn cuda_constants() -> String {
    let entries =
        |codes: &[(&str, u32)], prefix: &str| -> String { codes.iter().map(|(n, c)| format!("    {prefix}_{} = {c},\n", upper_snake(n))).collect() };
    format!(
        "// Generated from backend/op_table.rs.\nenum UnaryCode : u32 {{\n{}}};\nenum BinaryCode : u32 {{\n{}}};\n",
        entries(&UnaryOp::CODES, "UNARY"),
        entries(&BinaryOp::CODES, "BINARY")
    )
}
