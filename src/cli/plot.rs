//! `--plot`: the loss curve (and the final test accuracy) as a self-contained SVG, drawn by
//! hand so that no plotting dependency is needed.
use std::fmt::Write;

const W: f64 = 720.0;
const H: f64 = 400.0;
/// Margins: left for the loss axis labels, right for the accuracy axis.
const L: f64 = 60.0;
const R: f64 = 60.0;
const T: f64 = 30.0;
const B: f64 = 40.0;
/// Longer runs are averaged into this many points; the SVG stays small and the curve readable.
const MAX_POINTS: usize = 600;

/// An SVG of `losses` (step, loss) on a linear axis from 0, with `accuracy` (step, fraction)
/// as a marked point on a 0-100% axis at the right.
pub fn svg(losses: &[(u64, f32)], accuracy: Option<(u64, f64)>) -> String {
    let pts = downsample(losses);
    let (s0, s1) = match (pts.first(), pts.last()) {
        (Some(a), Some(b)) => (a.0, b.0.max(a.0 + 1.0)),
        _ => (0.0, 1.0),
    };
    let max_loss = pts.iter().map(|p| p.1).fold(0.0f64, f64::max);
    let top = nice_ceiling(max_loss);
    let x = |s: f64| L + (s - s0) / (s1 - s0) * (W - L - R);
    let y = |v: f64| T + (1.0 - v / top) * (H - T - B);

    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(o, r#"<text x="{}" y="18" text-anchor="middle" font-size="14">training loss</text>"#, W / 2.0);
    for i in 0..=4 {
        let v = top * i as f64 / 4.0;
        let _ = writeln!(o, r##"<line x1="{L}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/>"##, W - R, y(v), y(v));
        let _ = writeln!(o, r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#, L - 6.0, y(v) + 4.0, short(v));
    }
    let _ = writeln!(o, r#"<text x="{L}" y="{}" text-anchor="start">step {}</text>"#, H - 12.0, s0);
    let _ = writeln!(o, r#"<text x="{}" y="{}" text-anchor="end">step {}</text>"#, W - R, H - 12.0, s1);
    let path: Vec<String> = pts.iter().map(|&(s, v)| format!("{:.1},{:.1}", x(s), y(v))).collect();
    let _ = writeln!(o, r##"<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{}"/>"##, path.join(" "));
    if let Some((step, acc)) = accuracy {
        let ya = T + (1.0 - acc) * (H - T - B);
        let xa = x(step as f64).min(W - R);
        let _ = writeln!(o, r##"<line x1="{L}" x2="{}" y1="{ya:.1}" y2="{ya:.1}" stroke="#d62728" stroke-dasharray="4 4"/>"##, W - R);
        let _ = writeln!(o, r##"<circle cx="{xa:.1}" cy="{ya:.1}" r="4" fill="#d62728"/>"##);
        let _ = writeln!(o, r##"<text x="{}" y="{:.1}" fill="#d62728">{:.2}% test</text>"##, W - R + 4.0, ya + 4.0, acc * 100.0);
    }
    o.push_str("</svg>\n");
    o
}

/// Bucket means, so that every step still counts in a long run's curve.
fn downsample(losses: &[(u64, f32)]) -> Vec<(f64, f64)> {
    let per = losses.len().div_ceil(MAX_POINTS).max(1);
    losses
        .chunks(per)
        .map(|c| {
            let step = c.iter().map(|p| p.0 as f64).sum::<f64>() / c.len() as f64;
            let loss = c.iter().map(|p| p.1 as f64).sum::<f64>() / c.len() as f64;
            (step, loss)
        })
        .collect()
}

/// The smallest of 1, 2, 5 times a power of ten at or above `v` (1 for an empty curve).
fn nice_ceiling(v: f64) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * p).find(|&c| c >= v).unwrap_or(10.0 * p)
}

fn short(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}
