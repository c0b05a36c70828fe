//! How a plan reads: the chosen layout with its time and memory, the next best, and what was
//! rejected and why (`tandem plan` prints it).
use super::{bytes, Estimate, Layout, Plan, MORE_DEVICES_MARGIN};
use std::fmt;

/// Device names for a line of text: all of a few, the first four of many.
fn names(devices: &[String]) -> String {
    match devices.len() {
        0..=8 => devices.join(","),
        n => format!("{},... ({n} devices)", devices[..4].join(",")),
    }
}

impl Plan {
    /// The devices' names, each with its rank (`r1:cpu`) in a plan of several processes.
    fn labels(&self) -> Vec<String> {
        match self.processes.len() == self.devices.len() {
            true => self.devices.iter().zip(&self.processes).map(|(n, (r, _))| format!("r{r}:{n}")).collect(),
            false => self.devices.clone(),
        }
    }
}

impl fmt::Display for Plan {
    /// The chosen layout with its predicted step time and each device's memory, the best of
    /// each other degree triple, and each degree triple no variant of which was kept, with the
    /// constraint that excluded it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let line = |f: &mut fmt::Formatter<'_>, e: &Estimate| {
            let peak = bytes(e.memory.iter().copied().max().unwrap_or(0));
            // Shown where it shows at the figures' precision.
            let tried = match e.overhead_s {
                o if o.abs() < 5e-6 => String::new(),
                o => format!(", {:+.2} ms measured overhead", o * 1e3),
            };
            writeln!(
                f,
                "  {}: {:.2} ms/step (compute {:.2} ms, bubble {:.0}%{tried}), peak {peak}/device",
                e.layout,
                e.step_s * 1e3,
                e.compute_s * 1e3,
                e.bubble * 100.0
            )
        };
        let degrees = |l: &Layout| (l.data, l.tensor, l.pipeline);
        let labels = self.labels();
        writeln!(f, "plan for {} (batch {}):", names(&labels), self.batch)?;
        line(f, &self.best)?;
        let l = &self.best.layout;
        let used: Vec<String> = (0..l.devices().min(8)).map(|i| format!("{} {}", labels[i], bytes(self.best.memory[i]))).collect();
        writeln!(f, "  memory: {}", used.join(", "))?;
        if self.grad_dtype_of(l) != crate::DType::F32 {
            writeln!(f, "  gradient shards in {}", format!("{:?}", self.grad_dtype).to_lowercase())?;
        }
        if let Some(chosen) = self.precision {
            let others: Vec<String> = self.precisions.iter().map(|(c, said)| format!("{}: {said}", c.name())).collect();
            writeln!(f, "  precision {} (searched; {})", chosen.name(), others.join("; "))?;
        }
        if self.offloaded_states > 0 {
            writeln!(f, "  optimizer state in host memory ({} tensors a parameter, to the devices and back each step)", self.offloaded_states)?;
        }
        if l.data > 1 {
            writeln!(f, "  batch shares: {:?}", self.shares)?;
        }
        if l.devices() < self.devices.len() {
            writeln!(f, "  left out: {} (predicted less than {:.0}% faster with them)", names(&labels[l.devices()..]), MORE_DEVICES_MARGIN * 100.0)?;
        }
        let mut seen = vec![degrees(l)];
        if !self.alternatives.is_empty() {
            writeln!(f, "next best:")?;
            // One line per degree triple: its best micro-batch count and recompute choice.
            for e in &self.alternatives {
                if seen.len() < 6 && !seen.contains(&degrees(&e.layout)) {
                    seen.push(degrees(&e.layout));
                    line(f, e)?;
                }
            }
        }
        if !self.tried.is_empty() {
            writeln!(f, "tried before choosing (a few steps each; the difference is added to the layout's estimate):")?;
            for t in &self.tried {
                match &t.failed {
                    None => writeln!(f, "  {}: measured {:.2} ms/step, layer model {:.2}", t.layout, t.measured_s * 1e3, t.modelled_s * 1e3)?,
                    Some(why) => writeln!(f, "  {}: {why}", t.layout)?,
                }
            }
        }
        // One line per degree triple none of whose variants fits, with the first variant's
        // reason; the excluded variants of kept triples are counted, with their reasons.
        seen.extend(self.alternatives.iter().map(|e| degrees(&e.layout)));
        let kept = seen.clone();
        writeln!(f, "rejected ({} layouts):", self.rejected.len())?;
        let mut variants: Vec<(&str, usize)> = Vec::new();
        for r in &self.rejected {
            let d = degrees(&r.layout);
            if kept.contains(&d) {
                // Memory rejections differ in their figures: counted together, the first
                // one's figures shown.
                let kind = match variants.iter().find(|(w, _)| w.starts_with("memory:")) {
                    Some((w, _)) if r.why.starts_with("memory:") => *w,
                    _ => r.why.split(" into ").next().unwrap_or(&r.why),
                };
                match variants.iter_mut().find(|(w, _)| *w == kind) {
                    Some((_, n)) => *n += 1,
                    None => variants.push((kind, 1)),
                }
            } else if !seen.contains(&d) {
                seen.push(d);
                writeln!(f, "  data {} x tensor {} x pipeline {}: {}", d.0, d.1, d.2, r.why)?;
            }
        }
        for (why, n) in variants {
            writeln!(f, "  {n} variants (micro-batch counts, recomputation, sharding, offload) of kept layouts: {why}")?;
        }
        Ok(())
    }
}

/// The rejections summarised by reason, most frequent first: how many layouts each reason
/// excluded and the first of them. Memory rejections, whose figures differ, count as one
/// reason, shown with the variant that came closest to fitting.
pub(super) fn by_reason(rejected: &[super::Rejected]) -> String {
    // (key, count, the example shown, its need in bytes for memory rejections)
    let mut reasons: Vec<(String, usize, &super::Rejected, u64)> = Vec::new();
    for r in rejected {
        let need = r.why.strip_prefix("memory: needs ").map(need_bytes);
        let key = if need.is_some() { "memory".to_string() } else { r.why.clone() };
        match reasons.iter_mut().find(|(k, ..)| *k == key) {
            Some((_, n, shown, least)) => {
                *n += 1;
                if need.is_some_and(|b| b < *least) {
                    (*shown, *least) = (r, need.unwrap_or(u64::MAX));
                }
            }
            None => reasons.push((key, 1, r, need.unwrap_or(u64::MAX))),
        }
    }
    reasons.sort_by_key(|r| std::cmp::Reverse(r.1));
    let parts: Vec<String> = reasons
        .iter()
        .map(|(key, n, r, _)| match key.as_str() {
            "memory" => format!("{n} over memory, the closest {}: {}", r.layout, r.why),
            _ => format!("{n} because {} (as {})", r.why, r.layout),
        })
        .collect();
    format!("{} layouts rejected: {}", rejected.len(), parts.join("; "))
}

/// The bytes of a memory rejection's "12.50 MiB on cpu, ..." text (as
/// [`format_bytes`](crate::backend::format_bytes) writes them), for ordering; the largest
/// where it does not read.
fn need_bytes(text: &str) -> u64 {
    let mut words = text.split_whitespace();
    let (Some(n), Some(unit)) = (words.next().and_then(|n| n.parse::<f64>().ok()), words.next()) else { return u64::MAX };
    let scale = match unit {
        "bytes" => 1.0,
        _ => match ["KiB", "MiB", "GiB", "TiB", "PiB"].iter().position(|u| *u == unit) {
            Some(i) => 1024f64.powi(i as i32 + 1),
            None => return u64::MAX,
        },
    };
    (n * scale) as u64
}
