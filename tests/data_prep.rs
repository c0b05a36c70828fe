//! Preparing a dataset as a scikit-learn or PyTorch user would: the loader as an iterator
//! (one epoch, or the endless stream), seeded shuffles and train/test splits, and
//! standardisation of features and targets.
use std::collections::HashSet;
use std::sync::Arc;
use tandem::data::{Batch, DataLoader, Dataset, LoaderState, Standardizer, Targets, TestSize};
use tandem::Error;

/// Sample `i` is `[i, -i]` with the regression target `10 i`, so batches reveal their samples.
fn numbered(n: usize) -> Dataset {
    Dataset {
        x: (0..n).flat_map(|i| [i as f32, -(i as f32)]).collect(),
        sample_shape: vec![2],
        y: Targets::Values { data: (0..n).map(|i| 10.0 * i as f32).collect(), shape_per_sample: vec![1] },
    }
}

fn ids(x: &[f32]) -> Vec<usize> {
    x.chunks(2).map(|c| c[0] as usize).collect()
}

fn batch_ids(b: &Batch) -> Vec<usize> {
    ids(b.x.as_f32().unwrap())
}

// --- the loader as an iterator ------------------------------------------------------------

#[test]
fn one_epoch_is_every_sample_once_then_none() {
    let mut loader = DataLoader::new(Arc::new(numbered(10)), 4, true, 3).unwrap();
    let mut orders = Vec::new();
    for epoch in 0..3u64 {
        let it = loader.epoch();
        assert_eq!(it.len(), 3, "epoch {epoch} knows its length");
        let batches: Vec<Batch> = it.collect();
        assert_eq!(batches.iter().map(Batch::len).collect::<Vec<_>>(), [4, 4, 2]);
        let seen: Vec<usize> = batches.iter().flat_map(batch_ids).collect();
        assert_eq!(seen.iter().copied().collect::<HashSet<_>>().len(), 10, "epoch {epoch}: {seen:?}");
        orders.push(seen);
        assert_eq!(loader.state(), LoaderState { epoch: epoch + 1, position: 0 });
    }
    assert_ne!(orders[0], orders[1], "each epoch has its own order");
    // ChaCha8 keyed by (seed 3, epoch): the orders every checkpoint written so far resumes into.
    assert_eq!(orders[0], [6, 9, 0, 4, 1, 2, 8, 5, 3, 7]);
    assert_eq!(orders[1], [5, 4, 7, 2, 8, 0, 6, 3, 1, 9]);

    // Stopped part-way, an epoch's iterator leaves the loader where it stopped; the next one
    // serves only the rest of that epoch.
    let mut loader = DataLoader::new(Arc::new(numbered(10)), 4, false, 0).unwrap().drop_last(true).unwrap();
    assert_eq!(loader.epoch().take(1).count(), 1);
    let rest: Vec<Vec<usize>> = loader.epoch().map(|b| batch_ids(&b)).collect();
    assert_eq!(rest, [vec![4, 5, 6, 7]], "the rest of epoch 0, its short tail dropped");
    assert_eq!(loader.state().epoch, 1);
}

#[test]
fn the_loader_itself_is_the_endless_stream_of_next_batch() {
    let make = || DataLoader::new(Arc::new(numbered(10)), 4, true, 9).unwrap();
    let mut by_hand = make();
    let want: Vec<Batch> = (0..7).map(|_| by_hand.next_batch()).collect();
    let mut loader = make();
    assert_eq!(loader.size_hint(), (usize::MAX, None));
    let got: Vec<Batch> = loader.by_ref().take(7).collect();
    assert_eq!(got, want, "seven steps across epoch boundaries");
    assert_eq!(loader.state(), by_hand.state());
    // A step-counted loop over an owned loader.
    let sizes: Vec<usize> = make().skip(2).step_by(3).take(3).map(|b| b.len()).collect();
    assert_eq!(sizes, [2, 2, 2], "every epoch's third batch is its short one");
}

// --- shuffle and split --------------------------------------------------------------------

#[test]
fn shuffled_is_a_seeded_permutation_pinned_across_versions() {
    let ds = numbered(10);
    let a = ds.shuffled(42).unwrap();
    assert_eq!(a, ds.shuffled(42).unwrap());
    assert_ne!(a, ds.shuffled(43).unwrap());
    let order = ids(&a.x);
    // Pinned: a change here would reorder every user's split and break their resumes.
    assert_eq!(order, PERMUTATION_10_SEED_42);
    let Targets::Values { data, .. } = &a.y else { panic!("values") };
    let pairs: Vec<(f32, f32)> = order.iter().map(|&i| i as f32).zip(data.iter().map(|v| v / 10.0)).collect();
    assert!(pairs.iter().all(|(i, y)| i == y), "features and targets move together: {pairs:?}");
    assert_eq!(a.x.chunks(2).map(|c| c[1]).collect::<Vec<_>>(), order.iter().map(|&i| -(i as f32)).collect::<Vec<_>>());
}

/// `Dataset::shuffled(42)` of 10 samples: Fisher–Yates from the top, `j = (u64 · (i + 1)) >> 64`
/// over the ChaCha8 stream keyed by seed 42 (bytes 0..8), epoch 0 (8..16) and the shuffle stream
/// 1 (16..24), as an independent ChaCha8 (the RFC 7539 block function at 8 rounds) gives it.
const PERMUTATION_10_SEED_42: [usize; 10] = [8, 6, 0, 2, 5, 4, 1, 3, 7, 9];

#[test]
fn split_holds_out_a_random_test_set_as_train_test_split() {
    let ds = numbered(10);
    let (train, test) = ds.split(TestSize::Fraction(0.25), 42).unwrap();
    // scikit-learn: n_test = ceil(0.25 * 10) = 3, the first 3 of the permutation.
    assert_eq!((train.len(), test.len()), (7, 3));
    assert_eq!(ids(&test.x), PERMUTATION_10_SEED_42[..3]);
    assert_eq!(ids(&train.x), PERMUTATION_10_SEED_42[3..]);
    let (train2, test2) = ds.split(TestSize::Fraction(0.25), 42).unwrap();
    assert_eq!((train2, test2), (train.clone(), test.clone()), "the same seed, the same split");
    let (_, other) = ds.split(TestSize::Fraction(0.25), 7).unwrap();
    assert_ne!(other, test);
    let (train, test) = ds.split(TestSize::Count(4), 1).unwrap();
    let all: HashSet<usize> = ids(&train.x).into_iter().chain(ids(&test.x)).collect();
    assert_eq!((train.len(), test.len(), all.len()), (6, 4, 10), "disjoint, and every sample on one side");
    train.validate().unwrap();
    test.validate().unwrap();

    for bad in [TestSize::Fraction(0.0), TestSize::Fraction(1.0), TestSize::Fraction(f64::NAN), TestSize::Count(0), TestSize::Count(10)] {
        let err = ds.split(bad, 0).unwrap_err();
        assert!(matches!(err, Error::Invalid { op: "Dataset::split", .. }), "{bad:?}: {err}");
    }
    let mut broken = numbered(3);
    broken.x.pop();
    assert!(broken.split(TestSize::Count(1), 0).is_err() && broken.shuffled(0).is_err());
}

// --- standardisation ----------------------------------------------------------------------

#[test]
fn standardizer_is_standard_scaler_with_ddof_0() {
    // Columns: [1, 2, 4, 9] (mean 4, population variance 9.5), a constant 7, and [-3, 0, 0, 3].
    let rows = [1.0, 7.0, -3.0, 2.0, 7.0, 0.0, 4.0, 7.0, 0.0, 9.0, 7.0, 3.0];
    let s = Standardizer::fit(&rows, 3).unwrap();
    assert_eq!(s.features(), 3);
    assert_eq!(s.mean(), [4.0, 7.0, 0.0]);
    assert_eq!(s.scale(), [9.5f64.sqrt(), 1.0, 4.5f64.sqrt()]);
    let z = s.transform(&rows).unwrap();
    let want: Vec<f32> =
        rows.chunks(3).flat_map(|r| [((r[0] as f64 - 4.0) / 9.5f64.sqrt()) as f32, 0.0, (r[2] as f64 / 4.5f64.sqrt()) as f32]).collect();
    assert_eq!(z, want);
    tandem::tolerance::assert_close("inverse_transform", &s.inverse_transform(&z).unwrap(), &rows, 1e-6, 1e-6);

    // A constant feature far from 0 stays constant at 0, not NaN or huge.
    let s = Standardizer::fit(&[0.1, 0.1, 0.1], 1).unwrap();
    assert_eq!((s.scale(), s.transform(&[0.1, 0.3]).unwrap()[0]), (&[1.0][..], 0.0));

    // Errors name the op and what is wrong.
    let err = Standardizer::fit(&[1.0, f32::NAN, 2.0, 3.0], 2).unwrap_err().to_string();
    assert!(err.contains("row 0 feature 1 is NaN"), "{err}");
    assert!(matches!(Standardizer::fit(&[1.0, 2.0, 3.0], 2), Err(Error::Shape { .. })));
    assert!(matches!(Standardizer::fit(&[], 2), Err(Error::Shape { .. })));
    let s = Standardizer::fit(&rows, 3).unwrap();
    assert!(matches!(s.transform(&[1.0, 2.0]), Err(Error::Shape { op: "Standardizer::transform", .. })));
}

#[test]
fn fit_on_train_then_scale_both_and_report_in_target_units() {
    let (train, test) = numbered(20).split(TestSize::Count(5), 3).unwrap();
    let (fx, fy) = (Standardizer::fit_features(&train).unwrap(), Standardizer::fit_targets(&train).unwrap());
    let scaled = fy.transform_targets(&fx.transform_features(&train).unwrap()).unwrap();
    // The training split has mean 0 and variance 1 per feature and target.
    for s in [Standardizer::fit_features(&scaled).unwrap(), Standardizer::fit_targets(&scaled).unwrap()] {
        assert!(s.mean().iter().all(|m| m.abs() < 1e-6) && s.scale().iter().all(|v| (v - 1.0).abs() < 1e-6), "{s:?}");
    }
    // The test split is scaled with the training statistics, not its own.
    let t = fx.transform_features(&test).unwrap();
    let by_hand: Vec<f32> = test
        .x
        .chunks(2)
        .flat_map(|r| [((r[0] as f64 - fx.mean()[0]) / fx.scale()[0]) as f32, ((r[1] as f64 - fx.mean()[1]) / fx.scale()[1]) as f32])
        .collect();
    assert_eq!(t.x, by_hand);
    assert_eq!(t.y, test.y, "transform_features leaves the targets");
    // Predictions of standardised targets come back in the targets' units.
    let Targets::Values { data, .. } = &fy.transform_targets(&test).unwrap().y else { panic!() };
    let Targets::Values { data: want, .. } = &test.y else { panic!() };
    tandem::tolerance::assert_close("targets back in units", &fy.inverse_transform(data).unwrap(), want, 1e-4, 1e-6);

    let classes = Dataset { x: vec![1.0, 2.0], sample_shape: vec![1], y: Targets::Classes { labels: vec![0, 1], classes: 2 } };
    assert!(matches!(Standardizer::fit_targets(&classes), Err(Error::Invalid { op: "Standardizer::fit_targets", .. })));
    assert!(Standardizer::fit(&[1.0, 2.0], 1).unwrap().transform_targets(&classes).is_err());
}

#[test]
fn standardizer_round_trips_through_serde_and_refuses_a_bad_one() {
    let s = Standardizer::fit(&[1.0, 5.0, 2.0, 5.0, 6.0, 5.0], 2).unwrap();
    let json = serde_json::to_string(&s).unwrap();
    assert_eq!(serde_json::from_str::<Standardizer>(&json).unwrap(), s);
    for bad in
        [r#"{"mean":[0.0],"scale":[0.0]}"#, r#"{"mean":[0.0,1.0],"scale":[1.0]}"#, r#"{"mean":[],"scale":[]}"#, r#"{"mean":[0.0],"scale":[-1.0]}"#]
    {
        assert!(serde_json::from_str::<Standardizer>(bad).is_err(), "{bad} should not read back");
    }
}
