//! What the [`Trainer`](super::Trainer) records in every checkpoint by itself, beside the
//! caller's settings, and a resume must repeat: the strategy's kind, the precision, the clipping
//! bound and the LR schedule. Stored under the key `"trainer"` of the checkpoint's run
//! configuration ([`RunState::config`](super::RunState)), the caller's settings' keys beside it.
use crate::optim::LrSchedule;
use crate::parallel::Strategy;
use serde_json::{json, Value};

/// The key of the record in the stored configuration.
const KEY: &str = "trainer";

/// What `strategy` trains with and the run's `schedule`, as recorded.
pub(super) fn record<S: Strategy + ?Sized>(strategy: &S, schedule: Option<&LrSchedule>) -> Value {
    json!({
        "strategy": strategy.describe(),
        "precision": strategy.core().precision().name(),
        "grad_clip": strategy.core().grad_clip(),
        "lr_schedule": schedule,
    })
}

/// The run configuration a checkpoint stores: the caller's `settings` with the record added
/// under `"trainer"`; settings that are not a JSON object (or use that key themselves) go
/// under `"settings"` beside it.
pub(super) fn stored(settings: &Value, record: &Value) -> Value {
    match settings {
        Value::Object(map) if !map.contains_key(KEY) => {
            let mut map = map.clone();
            map.insert(KEY.to_string(), record.clone());
            Value::Object(map)
        }
        Value::Null => json!({ KEY: record }),
        other => json!({ "settings": other, KEY: record }),
    }
}

/// A checkpoint's configuration taken apart into the caller's settings and the record, as
/// [`stored`] put them together for settings shaped like `now`; `None` for a checkpoint written
/// before the Trainer recorded anything (its whole configuration is the caller's).
pub(super) fn split(config: &Value, now: &Value) -> (Value, Option<Value>) {
    let Some(map) = config.as_object().filter(|m| m.contains_key(KEY)) else { return (config.clone(), None) };
    let mut map = map.clone();
    let record = map.remove(KEY);
    let wrapped = !matches!(now, Value::Object(m) if !m.contains_key(KEY)) && !now.is_null();
    let settings = match map.remove("settings") {
        Some(s) if wrapped && map.is_empty() => s,
        Some(s) => {
            map.insert("settings".to_string(), s);
            Value::Object(map)
        }
        None if map.is_empty() && now.is_null() => Value::Null,
        None => Value::Object(map),
    };
    (settings, record)
}

/// `key value (checkpoint: value)` for each recorded item that differs.
pub(super) fn changes(now: &Value, then: &Value) -> Vec<String> {
    let null = Value::Null;
    // The strategy is recorded but not compared: a checkpoint of any layout resumes under any
    // other (ZeRO shard modes, device and process counts).
    let keys = ["precision", "grad_clip", "lr_schedule"];
    keys.iter()
        .filter(|k| now.get(**k).unwrap_or(&null) != then.get(**k).unwrap_or(&null))
        .map(|k| format!("{k} {} (checkpoint: {})", shown(now.get(*k).unwrap_or(&null)), shown(then.get(*k).unwrap_or(&null))))
        .collect()
}

/// A recorded value as a sentence shows it: strings unquoted, f32 settings in their shortest
/// form, none for an absent one, a schedule as `{kind: constant, lr: 0.001}`.
fn shown(v: &Value) -> String {
    match v {
        Value::Null => "none".to_string(),
        Value::String(s) => s.clone(),
        Value::Number(n) if n.is_f64() => n.as_f64().map_or_else(|| n.to_string(), |x| (x as f32).to_string()),
        Value::Object(map) => format!("{{{}}}", map.iter().map(|(k, v)| format!("{k}: {}", shown(v))).collect::<Vec<_>>().join(", ")),
        v => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_settings_split_back_whatever_their_shape() {
        let rec = json!({ "precision": "bf16" });
        for settings in [json!({ "batch": 8 }), Value::Null, json!(3), json!({ "trainer": 1 }), json!({ "settings": 2 })] {
            let (back, r) = split(&stored(&settings, &rec), &settings);
            assert_eq!((back, r), (settings.clone(), Some(rec.clone())), "{settings}");
        }
        assert_eq!(split(&json!({ "batch": 8 }), &json!({ "batch": 8 })), (json!({ "batch": 8 }), None));
    }

    #[test]
    fn changes_name_each_item_as_typed() {
        let now = json!({ "strategy": "Single", "precision": "bf16", "grad_clip": 0.1f32, "lr_schedule": null });
        let then = json!({ "strategy": "DataParallel", "precision": "f32", "grad_clip": null, "lr_schedule": null });
        let want = ["precision bf16 (checkpoint: f32)", "grad_clip 0.1 (checkpoint: none)"];
        assert_eq!(changes(&now, &then), want);
        let sched = |lr: f32| json!({ "lr_schedule": crate::optim::LrSchedule::Constant { lr } });
        assert_eq!(changes(&sched(1e-3), &sched(3e-3)), ["lr_schedule {kind: constant, lr: 0.001} (checkpoint: {kind: constant, lr: 0.003})"]);
    }
}
