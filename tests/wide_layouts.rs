//! Layouts whose sizes or strides do not fit 32 bits: kernels take 32-bit shapes and strides,
//! so such a view is read right or refused with a shape error naming the op, never truncated.
//! A size-1 dimension never moves the index, so its stride may be anything; a view that really
//! reaches past 2^32 - 1 elements needs a buffer of 16 GiB, which tests do not allocate (the
//! conversion itself is unit-tested in src/shape.rs).
mod common;
use common::{down, layout, up};
use tandem::backend::{BinaryOp, UnaryOp};
use tandem::DType;

#[test]
fn a_size_one_dimension_with_a_stride_past_32_bits_reads_right_on_every_device() {
    let huge = (u32::MAX as usize + 1) * 3 + 5; // truncated to 32 bits it would be 5
    let x: Vec<f32> = (0..6).map(|i| i as f32).collect();
    common::on_every_device(|dev| {
        let b = dev.backend();
        let xb = up(dev, &x);
        // [1, 2, 3] read with strides [huge, 3, 1]: the first dimension is never stepped.
        let l = layout(&[1, 2, 3], &[huge, 1, 2], 0);
        let out = b.alloc(6, DType::F32).unwrap();
        b.unary(UnaryOp::Neg, &xb, &l, &out).unwrap_or_else(|e| panic!("{}: {e}", dev.spec()));
        assert_eq!(down(dev, &out), vec![-0.0, -2.0, -4.0, -1.0, -3.0, -5.0], "{}", dev.spec());
        let out = b.alloc(6, DType::F32).unwrap();
        b.binary(BinaryOp::Add, &xb, &l, &xb, &layout(&[1, 2, 3], &[huge * 2, 3, 1], 0), &out).unwrap_or_else(|e| panic!("{}: {e}", dev.spec()));
        assert_eq!(down(dev, &out), vec![0.0, 3.0, 6.0, 4.0, 7.0, 10.0], "{}", dev.spec());
        Ok(())
    });
}
