//! Data parallelism's overlap figures: marks on a device's own timeline (wgpu timestamp
//! queries), the host-clock fallback where a device has none, and the hidden / exposed
//! all-reduce time each step reports, checked against the spans it was computed from.
//! Speed is measured by `tandem bench` (the `dp-overlap` figure), never asserted here.
mod common;
use std::sync::Arc;
use tandem::backend::cpu::CpuBackend;
use tandem::data::synthetic;
use tandem::nn::models::SeedModel;
use tandem::optim::SgdConfig;
use tandem::parallel::{DataParallel, DataParallelConfig, DeviceSpans, Loss, OptimConfig, Overlap, Strategy};
use tandem::{BackendKind, Device, Tensor};

/// Steps of a seed CNN, batch 32, one bucket per parameter (so that the first buckets are
/// all-reduced while the convolutions' backward runs); returns the last step's report and
/// overlap.
fn run(devices: &[Device]) -> (tandem::parallel::StepReport, Overlap, usize) {
    let model = SeedModel::Cnn.build(7, &Device::cpu()).unwrap();
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() });
    let cfg = DataParallelConfig { bucket_bytes: 1, ..Default::default() };
    let mut dp = DataParallel::new(&model, devices, &opt, Loss::CrossEntropy, cfg).unwrap();
    let data = synthetic::seed_images(32, 3).unwrap();
    let batch = data.batch(&(0..32).collect::<Vec<_>>()).unwrap();
    assert!(dp.last_overlap().is_none(), "no overlap before the first step");
    // The first step compiles kernels; the second is the one checked.
    dp.step(&batch).unwrap();
    let report = dp.step(&batch).unwrap();
    (report, dp.last_overlap().unwrap().clone(), dp.buckets().len())
}

/// Length of the union of `spans`, and of its part inside `window`: worked out point by point
/// on the sorted ends, independently of the library's interval merging.
fn covered(spans: &[(f64, f64)], window: (f64, f64)) -> (f64, f64) {
    let mut ends: Vec<f64> = spans.iter().flat_map(|&(s, e)| [s, e]).chain([window.0, window.1]).collect();
    ends.sort_by(f64::total_cmp);
    let (mut total, mut inside) = (0.0, 0.0);
    for w in ends.windows(2) {
        let mid = (w[0] + w[1]) / 2.0;
        if spans.iter().any(|&(s, e)| s <= mid && mid <= e) {
            total += w[1] - w[0];
            if window.0 <= mid && mid <= window.1 {
                inside += w[1] - w[0];
            }
        }
    }
    (total, inside)
}

/// Every figure agrees with the spans: all-reduce = hidden + exposed, each within [0, 1] of
/// the all-reduce time, buckets after backward started, one span per bucket.
fn check(what: &str, report: &tandem::parallel::StepReport, o: &Overlap, buckets: usize, devices: usize) {
    assert_eq!(o.spans.len(), devices, "{what}: one timeline per device");
    for (d, DeviceSpans { backward, allreduce }) in o.spans.iter().enumerate() {
        assert_eq!(allreduce.len(), buckets, "{what} device {d}: one all-reduce span per bucket");
        assert!(backward.0 <= backward.1, "{what} device {d}: backward {backward:?}");
        for &(s, e) in allreduce {
            assert!(s <= e && s >= backward.0, "{what} device {d}: all-reduce ({s}, {e}) against backward {backward:?}");
        }
        let (total, hidden) = covered(allreduce, *backward);
        let tol = 1e-9 + 1e-9 * total;
        assert!((o.allreduce_s[d] - total).abs() <= tol, "{what} device {d}: all-reduce {} s, spans cover {total} s", o.allreduce_s[d]);
        assert!((o.hidden_s[d] - hidden).abs() <= tol, "{what} device {d}: hidden {} s, spans say {hidden} s", o.hidden_s[d]);
        assert!((o.hidden_s[d] + o.exposed_s[d] - o.allreduce_s[d]).abs() <= tol, "{what} device {d}: hidden + exposed != all-reduce in {o:?}");
        assert!(o.exposed_s[d] >= 0.0 && o.hidden_s[d] >= 0.0, "{what} device {d}: {o:?}");
    }
    for (d, (h, t)) in o.host_hidden_s.iter().zip(&o.host_allreduce_s).enumerate() {
        assert!(0.0 <= *h && h <= t, "{what} device {d}: on the host clock {h} s of {t} s hidden");
    }
    if o.device_clock.iter().all(|c| !c) {
        assert_eq!((&o.host_allreduce_s, &o.host_hidden_s), (&o.allreduce_s, &o.hidden_s), "{what}: one clock, one set of figures");
    }
    let f = o.hidden_fraction();
    assert!((0.0..=1.0).contains(&f), "{what}: hidden fraction {f}");
    assert!((0.0..=1.0).contains(&report.overlap), "{what}: step overlap {}", report.overlap);
    assert!(report.comm_s >= o.mean_allreduce_s() - 1e-12, "{what}: comm_s {} below the all-reduce time {}", report.comm_s, o.mean_allreduce_s());
    eprintln!(
        "{what}: all-reduce {:.3} ms per device, hidden fraction {f:.3} (host clock {:.3}), clocks {:?}",
        o.mean_allreduce_s() * 1e3,
        o.host_hidden_fraction(),
        o.device_clock
    );
}

/// Whether `dev` keeps a clock of its own (its marks read back); leaves no mark behind.
fn has_clock(dev: &Device) -> bool {
    let mark = dev.backend().mark().unwrap();
    dev.backend().read_marks().unwrap();
    mark.is_some()
}

#[test]
fn two_cpu_devices_report_host_clock_overlap_consistent_with_spans() {
    let devices: Vec<Device> = (0..2).map(|_| Device::from_backend(Arc::new(CpuBackend::new()))).collect();
    let (report, o, buckets) = run(&devices);
    check("2 cpu", &report, &o, buckets, 2);
    assert_eq!(o.device_clock, [false, false], "a CPU device's timeline is its thread's host clock");
}

#[test]
fn two_logical_wgpu_devices_report_overlap_on_the_device_clock_where_it_has_one() {
    let _guard = common::shared();
    for info in Device::list().into_iter().filter(|i| i.backend == BackendKind::Wgpu) {
        let Ok(first) = Device::open(info.backend, info.ordinal) else { continue };
        let devices = [first, Device::open(info.backend, info.ordinal).unwrap()];
        let clock = has_clock(&devices[0]);
        let what = format!("2 x {} ({})", devices[0].spec(), info.driver);
        let (report, o, buckets) = run(&devices);
        check(&what, &report, &o, buckets, 2);
        assert_eq!(o.device_clock, [clock, clock], "{what}: timestamps are used exactly when the device has them");
        // lavapipe (Vulkan) has timestamp queries: the device clock path must be the one tested.
        if info.driver.starts_with("Vulkan") {
            assert!(clock, "{what}: a Vulkan adapter without timestamp queries");
        }
    }
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_devices_opened_without_timestamps_fall_back_to_the_host_clock() {
    use tandem::backend::wgpu::{open_with, Options};
    let _guard = common::shared();
    let Some(info) = Device::list().into_iter().find(|i| i.backend == BackendKind::Wgpu) else {
        eprintln!("skipping: no wgpu adapter");
        return;
    };
    let open = || Device::from_backend(open_with(info.ordinal, Options { without_timestamps: true, ..Default::default() }).unwrap());
    let devices = [open(), open()];
    assert!(!has_clock(&devices[0]), "opened without timestamps, the device still marks");
    let (report, o, buckets) = run(&devices);
    check("wgpu without timestamps", &report, &o, buckets, 2);
    assert_eq!(o.device_clock, [false, false]);
}

#[test]
fn marks_follow_the_device_timeline_and_number_from_zero_after_each_read() {
    let cpu = Device::cpu();
    assert_eq!(cpu.backend().mark().unwrap(), None, "the CPU has no clock of its own");
    assert!(cpu.backend().read_marks().unwrap().is_empty());
    common::on_each_device(|dev, _| {
        if !has_clock(dev) {
            eprintln!("skipping {dev}: no timestamp queries");
            return Ok(());
        }
        let a = Tensor::ones([256, 256], dev).unwrap();
        let b = dev.backend().mark().unwrap();
        let product = tandem::autograd::no_grad(|| (0..4).try_fold(a.clone(), |x, _| x.matmul(&a))).unwrap();
        let c = dev.backend().mark().unwrap();
        let d = dev.backend().mark().unwrap();
        assert_eq!((b, c, d), (Some(0), Some(1), Some(2)), "{dev}: marks are numbered in order");
        let t = dev.backend().read_marks().unwrap();
        assert_eq!(t.len(), 3, "{dev}: one time per mark");
        // Four 256³ products take well over a microsecond on any device; two marks with nothing
        // between them take no time at all beside it.
        assert!(t[1] - t[0] > 1e-6, "{dev}: the products took {} s on the device clock", t[1] - t[0]);
        assert!(t[2] >= t[1] && t[2] - t[1] < t[1] - t[0], "{dev}: marks at {t:?}");
        assert_eq!(dev.backend().mark().unwrap(), Some(0), "{dev}: numbering starts again after a read");
        dev.backend().read_marks().unwrap();
        drop(product);
        Ok(())
    });
}
