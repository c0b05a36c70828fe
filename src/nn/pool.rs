//! Average pooling layers: AvgPool2d (fixed window) and AdaptiveAvgPool2d (fixed output size).
use super::Module;
use crate::{Device, Result, Tensor};

/// PyTorch's `AvgPool2d(kernel, stride=kernel, padding=0)`; padding counts in the average
/// (`count_include_pad=True`, PyTorch's default).
#[derive(Clone, Copy, Debug)]
pub struct AvgPool2d {
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
}

impl AvgPool2d {
    pub fn new(kernel: usize) -> Self {
        AvgPool2d { kernel, stride: kernel, padding: 0 }
    }
}

impl Module for AvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.avg_pool2d(self.kernel, self.stride, self.padding)
    }
    fn to_device(&self, _: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(*self))
    }
    fn describe(&self) -> String {
        format!("AvgPool2d({}, {}, {})", self.kernel, self.stride, self.padding)
    }
}

/// PyTorch's `AdaptiveAvgPool2d((oh, ow))`: output cell `i` averages input rows
/// `floor(i·H/oh) .. ceil((i+1)·H/oh)`, and likewise for columns.
#[derive(Clone, Copy, Debug)]
pub struct AdaptiveAvgPool2d {
    pub output: (usize, usize),
}

impl Module for AdaptiveAvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.adaptive_avg_pool2d(self.output)
    }
    fn to_device(&self, _: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(*self))
    }
    fn describe(&self) -> String {
        format!("AdaptiveAvgPool2d({:?})", self.output)
    }
}
