//! The `Backend` primitives of `CudaBackend`: argument checks, then one kernel launch, cuBLAS call
//! or driver copy on the device's stream.
use super::device::{grid, window, CudaBackend, THREADS};
use super::memory::CudaBuf;
use super::peer;
use crate::backend::contract;
use crate::backend::*;
use crate::{DType, Error, Layout, Result};
use cudarc::driver::{result, sys, LaunchConfig, PushKernelArg};
use std::any::Any;

impl Backend for CudaBackend {
    fn info(&self) -> &DeviceInfo {
        self.info_ref()
    }

    fn alloc(&self, len: usize, dtype: DType) -> Result<Buffer> {
        contract::alloc(self.info_ref(), len, dtype)?;
        let bytes = len * dtype.size();
        Ok(Buffer::new(self.pool.alloc(bytes)?, len, dtype))
    }

    fn upload(&self, bytes: &[u8], dtype: DType) -> Result<Buffer> {
        contract::upload(self.info_ref(), bytes, dtype)?;
        let buf = self.alloc(bytes.len() / dtype.size(), dtype)?;
        let ptr = self.ptr("upload", &buf, 0, dtype)?;
        self.staging.upload(bytes, ptr)?;
        Ok(buf)
    }

    fn download(&self, buf: &Buffer) -> Result<Vec<u8>> {
        let ptr = self.ptr("download", buf, 0, buf.dtype())?;
        self.staging.download(ptr, buf.len() * buf.dtype().size())
    }

    fn fill(&self, buf: &Buffer, value: f32) -> Result<()> {
        contract::fill(self.info_ref(), buf)?;
        let ptr = self.ptr("fill", buf, 0, buf.dtype())?;
        let bits = CastOp::fill_word(buf.dtype(), value);
        if buf.is_empty() {
            return Ok(());
        }
        self.bind()?;
        if buf.dtype().is_half() {
            // SAFETY: `ptr` holds `buf.len()` 2-byte elements of this context.
            return unsafe { sys::cuMemsetD16Async(ptr, bits as u16, buf.len(), self.stream().cu_stream()) }
                .result()
                .map_err(|e| self.err("cuMemsetD16Async", e));
        }
        // SAFETY: `ptr` holds `buf.len()` 4-byte elements of this context.
        unsafe { sys::cuMemsetD32Async(ptr, bits, buf.len(), self.stream().cu_stream()) }.result().map_err(|e| self.err("cuMemsetD32Async", e))
    }

    fn copy(&self, src: &Buffer, src_off: usize, dst: &Buffer, dst_off: usize, len: usize) -> Result<()> {
        contract::copy(self.info_ref(), src, src_off, dst, dst_off, len)?;
        let s = self.ptr("copy", src, 0, src.dtype())?;
        let d = self.ptr("copy", dst, 0, dst.dtype())?;
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        let overlap = s == d && src_off.abs_diff(dst_off) < len;
        // `contract::copy` checked that both dtypes have this width.
        let w = src.dtype().size();
        let (s, d) = (s + (w * src_off) as u64, d + (w * dst_off) as u64);
        let stream = self.stream().cu_stream();
        if !overlap {
            // SAFETY: both ranges were checked to lie inside their buffers.
            return unsafe { result::memcpy_dtod_async(d, s, w * len, stream) }.map_err(|e| self.err("cuMemcpyDtoDAsync", e));
        }
        if s == d {
            return Ok(());
        }
        // CUDA promises nothing for overlapping ranges of one copy: through a temporary, the
        // result is memmove's (as on wgpu and the CPU). The temporary goes back to the pool when
        // dropped; the pool hands it out again only to work later on this same stream.
        let tmp = self.pool.alloc(w * len)?;
        // SAFETY: the ranges lie inside their buffers and `tmp` holds `w * len` bytes.
        unsafe {
            result::memcpy_dtod_async(tmp.ptr(), s, w * len, stream).map_err(|e| self.err("cuMemcpyDtoDAsync", e))?;
            result::memcpy_dtod_async(d, tmp.ptr(), w * len, stream).map_err(|e| self.err("cuMemcpyDtoDAsync", e))
        }
    }

    fn unary(&self, op: UnaryOp, x: &Buffer, layout: &Layout, out: &Buffer) -> Result<()> {
        self.unary_code(op.code(), op.params(), x, layout, out)
    }

    fn binary(&self, op: BinaryOp, a: &Buffer, la: &Layout, b: &Buffer, lb: &Layout, out: &Buffer) -> Result<()> {
        self.binary_code(op.code(), a, la, b, lb, out)
    }

    fn reduce(&self, op: ReduceOp, x: &Buffer, spec: ReduceSpec, out: &Buffer) -> Result<()> {
        let out_dtype = if op == ReduceOp::ArgMax { DType::I32 } else { DType::F32 };
        contract::reduce(self.info_ref(), op, x, spec, out)?;
        let x = self.ptr("reduce", x, 0, DType::F32)?;
        let out = self.ptr("reduce", out, 0, out_dtype)?;
        let (outer, len, inner) = (spec.outer as u64, spec.len as u64, spec.inner as u64);
        if outer * inner == 0 {
            return Ok(());
        }
        let code = op.code();
        if inner == 1 {
            let cfg = LaunchConfig { grid_dim: (outer.min(65535) as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
            launch!(self, "reduce_rows_f32", cfg, code, x, out, outer, len)
        } else {
            // Blocks of 32 × 8 threads, one per 32 outputs of an outer row (reduce.cu's COLS_X, COLS_Y).
            let cfg = LaunchConfig { grid_dim: ((outer * inner.div_ceil(32)).min(65535) as u32, 1, 1), block_dim: (32, 8, 1), shared_mem_bytes: 0 };
            launch!(self, "reduce_cols_f32", cfg, code, x, out, outer, len, inner)
        }
    }

    fn matmul(&self, a: &Buffer, b: &Buffer, out: &Buffer, spec: MatmulSpec) -> Result<()> {
        contract::matmul(self.info_ref(), a, b, None, out, spec)?;
        let s = &spec;
        let a = self.ptr("matmul", a, 0, DType::F32)?;
        let b = self.ptr("matmul", b, 0, DType::F32)?;
        let c_len = s.batch * s.m * s.n;
        let c = self.ptr("matmul", out, 0, DType::F32)?;
        if c_len == 0 {
            return Ok(());
        }
        if s.k == 0 {
            self.bind()?;
            // SAFETY: `c` holds `c_len` floats; an empty sum is 0.
            return unsafe { sys::cuMemsetD32Async(c, 0, c_len, self.stream().cu_stream()) }.result().map_err(|e| self.err("cuMemsetD32Async", e));
        }
        match self.blas.as_ref() {
            Some(blas) => {
                self.bind()?;
                blas.sgemm(a, b, c, s).map_err(|e| self.err("matmul", e))
            }
            None => self.matmul_kernel(a, b, c, s),
        }
    }

    fn im2col(&self, x: &Buffer, cols: &Buffer, spec: WindowSpec) -> Result<()> {
        contract::im2col(self.info_ref(), x, cols, spec)?;
        let n = (spec.n * spec.col_rows() * spec.col_len()) as u64;
        let x = self.ptr("im2col", x, 0, DType::F32)?;
        let cols = self.ptr("im2col", cols, 0, DType::F32)?;
        let s = window("im2col", &spec)?;
        if n == 0 {
            return Ok(());
        }
        launch!(self, "im2col_f32", grid(n), x, cols, s)
    }

    fn col2im(&self, cols: &Buffer, x: &Buffer, spec: WindowSpec) -> Result<()> {
        contract::col2im(self.info_ref(), cols, x, spec)?;
        let n = (spec.n * spec.c * spec.h * spec.w) as u64;
        let cols = self.ptr("col2im", cols, 0, DType::F32)?;
        let x = self.ptr("col2im", x, 0, DType::F32)?;
        let s = window("col2im", &spec)?;
        if n == 0 {
            return Ok(());
        }
        launch!(self, "col2im_f32", grid(n), cols, x, s)
    }

    fn max_pool2d(&self, x: &Buffer, out: &Buffer, argmax: &Buffer, spec: WindowSpec) -> Result<()> {
        contract::max_pool2d(self.info_ref(), x, out, argmax, spec)?;
        let n = (spec.n * spec.c * spec.oh * spec.ow) as u64;
        let x = self.ptr("max_pool2d", x, 0, DType::F32)?;
        let out = self.ptr("max_pool2d", out, 0, DType::F32)?;
        let arg = self.ptr("max_pool2d", argmax, 0, DType::I32)?;
        let s = window("max_pool2d", &spec)?;
        if n == 0 {
            return Ok(());
        }
        launch!(self, "max_pool2d_f32", grid(n), x, out, arg, s)
    }

    fn max_pool2d_backward(&self, grad_out: &Buffer, argmax: &Buffer, grad_x: &Buffer, spec: WindowSpec) -> Result<()> {
        contract::max_pool2d_backward(self.info_ref(), grad_out, argmax, grad_x, spec)?;
        let n = (spec.n * spec.c * spec.h * spec.w) as u64;
        let gy = self.ptr("max_pool2d_backward", grad_out, 0, DType::F32)?;
        let arg = self.ptr("max_pool2d_backward", argmax, 0, DType::I32)?;
        let gx = self.ptr("max_pool2d_backward", grad_x, 0, DType::F32)?;
        let s = window("max_pool2d_backward", &spec)?;
        if n == 0 {
            return Ok(());
        }
        launch!(self, "max_pool2d_backward_f32", grid(n), gy, arg, gx, s)
    }

    fn index(&self, op: IndexOp, x: &Buffer, idx: &Buffer, out: &Buffer, rows: usize, cols: usize) -> Result<()> {
        contract::index(self.info_ref(), op, x, idx, out, rows, cols)?;
        let out_len = match op {
            IndexOp::Gather => rows,
            IndexOp::Scatter | IndexOp::GatherRows { .. } => rows * cols,
            IndexOp::ScatterAddRows { table_rows } => table_rows * cols,
        };
        let x = self.ptr("index", x, 0, DType::F32)?;
        let idx = self.ptr("index", idx, 0, DType::I32)?;
        let out = self.ptr("index", out, 0, DType::F32)?;
        let (r, c) = (rows as u64, cols as u64);
        if out_len == 0 {
            return Ok(());
        }
        match op {
            IndexOp::Gather => launch!(self, "gather_f32", grid(r), x, idx, out, r, c),
            IndexOp::Scatter => launch!(self, "scatter_f32", grid(r * c), x, idx, out, r, c),
            IndexOp::GatherRows { table_rows } => {
                let v = table_rows as u64;
                launch!(self, "gather_rows_f32", grid(r * c), x, idx, out, r, c, v)
            }
            IndexOp::ScatterAddRows { table_rows } => {
                let v = table_rows as u64;
                launch!(self, "scatter_add_rows_f32", grid(v * c), x, idx, out, r, c, v)
            }
        }
    }

    fn cast(&self, op: CastOp, x: &Buffer, out: &Buffer, len: usize) -> Result<()> {
        contract::cast(self.info_ref(), op, x, out, len)?;
        let (from, to) = op.dtypes();
        let x = self.ptr("cast", x, 0, from)?;
        let out = self.ptr("cast", out, 0, to)?;
        let (n, code) = (len as u64, op.code());
        if len == 0 {
            return Ok(());
        }
        let kernel = match (from.is_half(), to.is_half()) {
            (false, true) => "cast_to_half",
            (true, _) => "cast_from_half",
            _ => "cast_32",
        };
        launch!(self, kernel, grid(n), x, out, n, code)
    }

    fn optim_step(&self, step: OptimStep, param: &Buffer, grad: &Buffer, state: &[&Buffer]) -> Result<bool> {
        contract::optim_step(self.info_ref(), step, param, grad, state)?;
        let n = param.len() as u64;
        let p = self.ptr("optim_step", param, 0, DType::F32)?;
        let g = self.ptr("optim_step", grad, 0, DType::F32)?;
        let slot = |i: usize| {
            let b = state.get(i).ok_or_else(|| Error::invalid("optim_step", format!("missing optimizer state {i}")))?;
            self.ptr("optim_step", b, 0, DType::F32)
        };
        match step {
            OptimStep::Sgd { lr, momentum, dampening, nesterov, weight_decay, first } => {
                // Without momentum the kernel never touches the buffer; any valid address will do.
                let buf = if momentum != 0.0 { slot(0)? } else { p };
                let (nesterov, first) = (nesterov as u32, first as u32);
                if n > 0 {
                    launch!(self, "sgd_f32", grid(n), p, g, buf, n, lr, momentum, dampening, nesterov, weight_decay, first)?;
                }
            }
            OptimStep::Adam { lr, beta1, beta2, eps, weight_decay, decoupled, step } => {
                let (m, v) = (slot(0)?, slot(1)?);
                let t = step.max(1) as f64;
                let bc1 = (1.0 - (beta1 as f64).powf(t)) as f32;
                let bc2 = (1.0 - (beta2 as f64).powf(t)) as f32;
                let decoupled = decoupled as u32;
                if n > 0 {
                    launch!(self, "adam_f32", grid(n), p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, decoupled, bc1, bc2)?;
                }
            }
        }
        Ok(true)
    }

    fn fused(&self, op: FusedOp, bufs: &[&Buffer]) -> Result<bool> {
        // TF_BR and TF_DMAX of kernels/transformer.cu.
        const TILE_ROWS: u32 = 64;
        const TILE_DMAX: usize = 64;
        contract::fused(self.info_ref(), op, bufs)?;
        let p = bufs.iter().map(|b| self.ptr(op.name(), b, 0, DType::F32)).collect::<Result<Vec<u64>>>()?;
        // One block of THREADS per row, grid-stride past the grid limit.
        let per_row = |rows: usize| LaunchConfig { grid_dim: (rows.clamp(1, 65535) as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let tiles = |n: u64, t: u64| {
            let blocks = (n * t.div_ceil(TILE_ROWS as u64)).clamp(1, 65535) as u32;
            LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (TILE_ROWS, 1, 1), shared_mem_bytes: 0 }
        };
        match op {
            FusedOp::LayerNorm { rows, cols, eps } => {
                let [x, w, b, y, mean, rstd] = [p[0], p[1], p[2], p[3], p[4], p[5]];
                let (r, c) = (rows as u64, cols as u64);
                launch!(self, "layer_norm_f32", per_row(rows), x, w, b, y, mean, rstd, r, c, eps)?;
            }
            FusedOp::LayerNormBackward { rows, cols } => {
                let [g, x, w, mean, rstd, dx, dwp, dbp] = [p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]];
                let (r, c, blocks) = (rows as u64, cols as u64, ln_blocks(rows) as u64);
                launch!(self, "layer_norm_dx_f32", per_row(rows), g, x, w, mean, rstd, dx, r, c)?;
                launch!(self, "layer_norm_dwb_f32", grid(blocks * c), g, x, mean, rstd, dwp, dbp, r, c, blocks)?;
            }
            FusedOp::CausalSoftmax { n, t, scale } => {
                let ([x, y], cfg) = ([p[0], p[1]], per_row(n * t));
                let (rows, t) = ((n * t) as u64, t as u64);
                launch!(self, "causal_softmax_f32", cfg, x, y, rows, t, scale)?;
            }
            FusedOp::CausalSoftmaxBackward { n, t, scale } => {
                let ([g, y, dx], cfg) = ([p[0], p[1], p[2]], per_row(n * t));
                let (rows, t) = ((n * t) as u64, t as u64);
                launch!(self, "causal_softmax_dx_f32", cfg, g, y, dx, rows, t, scale)?;
            }
            // kernels/transformer.cu's tiled kernels: one block of TILE_ROWS threads per row block
            // of a matrix, for heads up to TILE_DMAX (the size of their shared tiles).
            FusedOp::Attention { n, t, d, scale } if d <= TILE_DMAX => {
                let [q, k, v, o, lse] = [p[0], p[1], p[2], p[3], p[4]];
                let (n, t, d) = (n as u64, t as u64, d as u64);
                launch!(self, "attention_tiled_f32", tiles(n, t), q, k, v, o, lse, n, t, d, scale)?;
            }
            FusedOp::AttentionBackward { n, t, d, scale } if d <= TILE_DMAX => {
                let [q, k, v, o, lse, g, dq, dk, dv, delta] = [p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9]];
                let (n, t, d) = (n as u64, t as u64, d as u64);
                launch!(self, "attention_dq_tiled_f32", tiles(n, t), q, k, v, o, lse, g, dq, delta, n, t, d, scale)?;
                launch!(self, "attention_dkv_tiled_f32", tiles(n, t), q, k, v, delta, lse, g, dk, dv, n, t, d, scale)?;
            }
            FusedOp::Attention { n, t, d, scale } => {
                let [q, k, v, o, lse] = [p[0], p[1], p[2], p[3], p[4]];
                let (rows, t, d) = ((n * t) as u64, t as u64, d as u64);
                launch!(self, "attention_f32", grid(rows), q, k, v, o, lse, rows, t, d, scale)?;
            }
            FusedOp::AttentionBackward { n, t, d, scale } => {
                let [q, k, v, o, lse, g, dq, dk, dv, delta] = [p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9]];
                let (rows, t, d) = ((n * t) as u64, t as u64, d as u64);
                launch!(self, "attention_dq_f32", grid(rows), q, k, v, o, lse, g, dq, delta, rows, t, d, scale)?;
                launch!(self, "attention_dkv_f32", grid(rows), q, k, v, delta, lse, g, dk, dv, rows, t, d, scale)?;
            }
            // Not fused here: the composition's elementwise kernels.
            FusedOp::GeluTanh { .. } | FusedOp::GeluTanhBackward { .. } => return Ok(false),
        }
        Ok(true)
    }
    fn fuses(&self, op: &FusedOp) -> bool {
        !matches!(op, FusedOp::GeluTanh { .. } | FusedOp::GeluTanhBackward { .. })
    }

    fn copy_from_peer(&self, src_device: &dyn Backend, src: &Buffer) -> Result<Option<Buffer>> {
        let Some(owner) = src_device.as_any().downcast_ref::<CudaBackend>() else { return Ok(None) };
        if !self.has_peer_path(src_device) {
            return Ok(None);
        }
        let src_mem = src.downcast::<CudaBuf>().ok_or_else(|| Error::invalid("copy_from_peer", "source buffer is not a CUDA buffer"))?;
        if src_mem.is_released() {
            src.refill("copy_from_peer", &owner.label)?;
            if src_mem.is_released() {
                return Err(crate::backend::released("copy_from_peer", &owner.label, src.len()));
            }
        }
        let out = self.alloc(src.len(), src.dtype())?;
        let bytes = src.len() * src.dtype().size();
        if bytes > 0 {
            let dst_mem = out.downcast::<CudaBuf>().ok_or_else(|| self.err("copy_from_peer", "fresh buffer"))?;
            peer::copy(self, dst_mem, owner, src_mem, bytes)?;
        }
        Ok(Some(out))
    }

    fn has_peer_path(&self, other: &dyn Backend) -> bool {
        other.as_any().downcast_ref::<CudaBackend>().is_some_and(|o| peer::enable(self, o))
    }

    fn mark(&self) -> Result<Option<u32>> {
        self.marks.mark(self)
    }
    fn read_marks(&self) -> Result<Vec<f64>> {
        self.marks.read(self)
    }

    fn sync(&self) -> Result<()> {
        self.stream().synchronize().map_err(|e| self.err("cuStreamSynchronize", e))
    }

    fn memory(&self) -> MemoryStats {
        self.pool.stats()
    }
    fn release(&self, buf: &Buffer) -> Result<bool> {
        self.own("release", buf)?.release();
        Ok(true)
    }
    fn restore(&self, buf: &Buffer) -> Result<bool> {
        self.own("restore", buf)?.restore()?;
        Ok(true)
    }
    fn reset_peak_memory(&self) {
        self.pool.reset_peak();
    }
    fn set_memory_budget(&self, bytes: Option<u64>) {
        self.pool.set_budget(bytes);
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl CudaBackend {
    /// [`Backend::unary`] by kernel code and parameters (`UnaryOp::code`, `UnaryOp::params`): a
    /// code outside the op table writes NaN, as on every backend (`UnaryOp::reference`).
    pub fn unary_code(&self, code: u32, [p0, p1]: [f32; 2], x: &Buffer, layout: &Layout, out: &Buffer) -> Result<()> {
        contract::unary(self.info_ref(), x, layout, out)?;
        let n = layout.numel() as u64;
        let (x, lx) = self.layout("unary", x, layout)?;
        let out = self.ptr("unary", out, 0, DType::F32)?;
        if n == 0 {
            return Ok(());
        }
        launch!(self, "unary_f32", grid(n), code, p0, p1, x, lx, out, n)
    }

    /// [`Backend::binary`] by kernel code (`BinaryOp::code`): a code outside the op table writes
    /// NaN, as on every backend (`BinaryOp::reference`).
    pub fn binary_code(&self, code: u32, a: &Buffer, la: &Layout, b: &Buffer, lb: &Layout, out: &Buffer) -> Result<()> {
        contract::binary(self.info_ref(), a, la, b, lb, out)?;
        let n = la.numel() as u64;
        let (a, la) = self.layout("binary", a, la)?;
        let (b, lb) = self.layout("binary", b, lb)?;
        let out = self.ptr("binary", out, 0, DType::F32)?;
        if n == 0 {
            return Ok(());
        }
        launch!(self, "binary_f32", grid(n), code, a, la, b, lb, out, n)
    }
}
