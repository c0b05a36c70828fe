//! The built-in models: the seed models (with the seeds' parameter names) and [`Gpt`], a
//! GPT-2-shaped transformer with nanoGPT's names.
mod generate;
pub(crate) mod gpt;
pub(crate) mod gpt_checkpoint;
mod gpt_config;
mod gpt_stages;
pub mod hf_gpt2;

pub use gpt::{Block, Blocks, Gpt, GptConfig, StateShards, Transformer};
pub use gpt_checkpoint::GptCheckpoint;
pub use hf_gpt2::HfGpt2;

use super::{Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential};
use crate::{Device, Error, Result};
use rand::SeedableRng;

/// Which seed model; parsed from the CLI's `--model`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeedModel {
    /// conv1 = Conv2d(1,10,5), conv2 = Conv2d(10,20,5), fc1 = Linear(320,50), fc2 = Linear(50,10).
    Cnn,
    /// linear = Linear(10, 1).
    Linear,
    /// linear1 = Linear(10, 5), linear2 = Linear(5, 1).
    TwoLayer,
}

impl std::str::FromStr for SeedModel {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "seed-cnn" => Ok(SeedModel::Cnn),
            "seed-linear" => Ok(SeedModel::Linear),
            "seed-two-layer" => Ok(SeedModel::TwoLayer),
            _ => Err(Error::invalid("--model", format!("'{s}' is not one of seed-cnn, seed-linear, seed-two-layer"))),
        }
    }
}

impl SeedModel {
    /// Builds the model on `device` with PyTorch's default initialisation from `seed`.
    pub fn build(self, seed: u64, device: &Device) -> Result<Sequential> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let r = &mut rng;
        Ok(match self {
            SeedModel::Cnn => seed_cnn_layers(r, device)?,
            SeedModel::Linear => Sequential::new().push("linear", Linear::new(10, 1, r, device)?),
            // Linear -> Linear with no activation between, as in the seed.
            SeedModel::TwoLayer => Sequential::new().push("linear1", Linear::new(10, 5, r, device)?).push("linear2", Linear::new(5, 1, r, device)?),
        })
    }
    /// One sample's input shape.
    pub fn input_shape(self) -> Vec<usize> {
        match self {
            SeedModel::Cnn => vec![1, 28, 28],
            _ => vec![10],
        }
    }
    pub fn is_classifier(self) -> bool {
        self == SeedModel::Cnn
    }
}

fn seed_cnn_layers(r: &mut rand_chacha::ChaCha8Rng, d: &Device) -> Result<Sequential> {
    let pool = MaxPool2d { kernel: 2, stride: 2 };
    Ok(Sequential::new()
        .push("conv1", Conv2d::new(1, 10, 5, r, d)?)
        .push("relu1", ReLU)
        .push("pool1", pool)
        .push("conv2", Conv2d::new(10, 20, 5, r, d)?)
        .push("relu2", ReLU)
        .push("pool2", pool)
        .push("flatten", Flatten)
        .push("fc1", Linear::new(320, 50, r, d)?)
        .push("relu3", ReLU)
        .push("fc2", Linear::new(50, 10, r, d)?))
}
