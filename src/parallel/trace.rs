//! Chrome trace-event timelines: one track per device, spans for forward, backward,
//! communication and idle time; opens in Perfetto or chrome://tracing.
use crate::Result;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What a span of device time was spent on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Phase {
    Forward,
    Backward,
    Compute,
    Optimizer,
    Comm,
    Idle,
}

#[derive(Clone, Debug, serde::Serialize)]
struct Event {
    name: String,
    cat: &'static str,
    ph: &'static str,
    ts: f64,
    dur: f64,
    pid: u32,
    tid: u32,
}

/// A shared recorder; clones append to the same timeline from any thread.
#[derive(Clone)]
pub struct Trace {
    inner: Arc<Mutex<TraceInner>>,
}

struct TraceInner {
    origin: Instant,
    tracks: Vec<String>,
    events: Vec<Event>,
}

impl Default for Trace {
    fn default() -> Self {
        Self::new()
    }
}

impl Trace {
    pub fn new() -> Self {
        Trace { inner: Arc::new(Mutex::new(TraceInner { origin: Instant::now(), tracks: Vec::new(), events: Vec::new() })) }
    }
    /// Records `name` on `track` (a device spec such as `wgpu:0`, or a stage name) from `start`
    /// for `dur_s` seconds.
    pub fn span(&self, track: &str, name: &str, phase: Phase, start: Instant, dur_s: f64) {
        let mut t = self.inner.lock().unwrap();
        let tid = match t.tracks.iter().position(|x| x == track) {
            Some(i) => i,
            None => {
                t.tracks.push(track.to_string());
                t.tracks.len() - 1
            }
        } as u32;
        let ts = start.saturating_duration_since(t.origin).as_secs_f64() * 1e6;
        let cat = match phase {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Compute => "compute",
            Phase::Optimizer => "optimizer",
            Phase::Comm => "comm",
            Phase::Idle => "idle",
        };
        t.events.push(Event { name: name.to_string(), cat, ph: "X", ts, dur: dur_s * 1e6, pid: 1, tid });
    }
    /// Names of the tracks recorded so far, in first-seen order.
    pub fn tracks(&self) -> Vec<String> {
        self.inner.lock().unwrap().tracks.clone()
    }
    /// The trace as Chrome trace-event JSON (with track names as thread-name metadata).
    pub fn to_json(&self) -> String {
        let t = self.inner.lock().unwrap();
        let mut events: Vec<serde_json::Value> = t
            .tracks
            .iter()
            .enumerate()
            .map(|(i, name)| serde_json::json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": i, "args": {"name": name}}))
            .collect();
        events.extend(t.events.iter().map(|e| serde_json::to_value(e).expect("plain struct")));
        serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" }).to_string()
    }
    /// Writes the JSON atomically to `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        crate::checkpoint::write_atomic(path, self.to_json().as_bytes())
    }
}
