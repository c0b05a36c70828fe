//! Central finite differences: the one gradient checker of the test suites (gradcheck, layers, composed ops, losses).
#![allow(dead_code)]
use rand::{Rng, SeedableRng};
use tandem::tolerance::check_close;
use tandem::{Device, Result, Tensor};

/// Checks d(sum(f(x) · r))/dx for a random `r` against central differences, on the CPU, for
/// inputs drawn from `lo..hi`.
pub fn gradcheck(name: &str, shapes: &[&[usize]], lo: f32, hi: f32, f: &dyn Fn(&[Tensor]) -> Result<Tensor>) {
    gradcheck_with(name, shapes, 11, f, |rng| rng.random_range(lo..hi))
}

/// `gradcheck` with inputs drawn by `sample` from a generator seeded with `seed`.
pub fn gradcheck_with(
    name: &str,
    shapes: &[&[usize]],
    seed: u64,
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    sample: impl Fn(&mut rand_chacha::ChaCha8Rng) -> f32,
) {
    let dev = Device::cpu();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let values: Vec<Vec<f32>> = shapes.iter().map(|s| (0..s.iter().product()).map(|_| sample(&mut rng)).collect()).collect();
    let make = |vals: &[Vec<f32>], grad: bool| -> Vec<Tensor> {
        vals.iter()
            .zip(shapes)
            .map(|(v, s)| {
                let t = Tensor::from_vec(v.clone(), s.to_vec(), &dev).unwrap();
                if grad {
                    t.requires_grad()
                } else {
                    t
                }
            })
            .collect()
    };
    let shape = f(&make(&values, false)).unwrap().dims().to_vec();
    let r = Tensor::rand_uniform(-1.0, 1.0, shape, &mut rng, &dev).unwrap();
    let loss = |xs: &[Tensor]| f(xs).unwrap().mul(&r).unwrap().sum_all().unwrap().to_scalar().unwrap() as f64;
    let inputs = make(&values, true);
    f(&inputs).unwrap().mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
    let h = 1e-2f32;
    for (i, input) in inputs.iter().enumerate() {
        let analytic = input.grad().expect("gradient reached the input").to_vec().unwrap();
        let numeric: Vec<f32> = (0..analytic.len())
            .map(|j| {
                let (mut plus, mut minus) = (values.clone(), values.clone());
                plus[i][j] += h;
                minus[i][j] -= h;
                ((loss(&make(&plus, false)) - loss(&make(&minus, false))) / (2.0 * h as f64)) as f32
            })
            .collect();
        if let Err(e) = check_close(&format!("d{name}/dx{i}"), &analytic, &numeric, 5e-3, 2e-2) {
            panic!("{e}");
        }
    }
}
