//! The one tolerance rule every comparison in tandem uses: `|got - want| <= atol + rtol * |want|`.

/// Checks `got` against the reference `want` element by element; the error names `what`, the
/// worst element and how far it is from passing. NaN matches only NaN; equal infinities match.
pub fn check_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} values, reference has {}", got.len(), want.len()));
    }
    let mut worst: Option<(usize, f32)> = None;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if (g.is_nan() && w.is_nan()) || g == w {
            continue;
        }
        let excess = (g - w).abs() - (atol + rtol * w.abs());
        let excess = if excess.is_nan() { f32::INFINITY } else { excess };
        if excess > 0.0 && worst.is_none_or(|(_, e)| excess > e) {
            worst = Some((i, excess));
        }
    }
    match worst {
        None => Ok(()),
        Some((i, _)) => Err(format!(
            "{what}: element {i} is {} but the reference is {} (|diff| {} > atol {atol} + rtol {rtol} * |ref|)",
            got[i],
            want[i],
            (got[i] - want[i]).abs()
        )),
    }
}

/// `check_close` that panics with its message; for tests.
#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    if let Err(e) = check_close(what, got, want, atol, rtol) {
        panic!("{e}");
    }
}
