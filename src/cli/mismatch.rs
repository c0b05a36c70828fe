//! How a resumed run's settings differ from its checkpoint's, in `tandem train`'s own flags and
//! with the values as one would type them (`--grad-clip 1 (checkpoint: not given)`), from the
//! two run configurations (see `train::run_config` and `gpt::run_config`).
use serde_json::Value;

/// One `--flag value (checkpoint: value)` entry for each setting in which `now` and `then`
/// differ, in the order of `now`'s keys.
pub(super) fn changed(now: &Value, then: &Value) -> Vec<String> {
    let mut out = Vec::new();
    // A run of characters records none (and its vocabulary); other tokenizers by name.
    let tokenizer = |c: &Value| c.get("tokenizer").and_then(Value::as_str).unwrap_or("chars").to_string();
    let (tok_now, tok_then) = (tokenizer(now), tokenizer(then));
    if tok_now != tok_then {
        out.push(format!("--tokenizer {tok_now} (checkpoint: {tok_then})"));
    }
    for (key, v) in now.as_object().into_iter().flatten() {
        let old = then.get(key.as_str()).unwrap_or(&Value::Null);
        if v == old {
            continue;
        }
        match key.as_str() {
            "optimizer" => optimizer(v, old, &mut out),
            "lr_schedule" => schedule(v, old, &mut out),
            "gpt" => {
                for (k, x) in v.as_object().into_iter().flatten() {
                    let y = old.get(k.as_str()).unwrap_or(&Value::Null);
                    if x != y {
                        push(&mut out, &gpt_flag(k), x, y);
                    }
                }
            }
            // The characters of the training text: only --data changes them.
            "vocab" if tok_now == tok_then && !out.iter().any(|c| c.starts_with("--data ")) => {
                out.push("--data (the text's characters differ from the checkpoint's)".to_string());
            }
            "vocab" | "tokenizer" => {}
            "init" => out.push(format!("--init {} (checkpoint: {})", init_typed(v), init_typed(old))),
            k => push(&mut out, &format!("--{}", k.replace('_', "-")), v, old),
        }
    }
    if out.is_empty() && now != then {
        out.push("the run configuration (written by another version of tandem?)".to_string());
    }
    out
}

/// An `--init` record (`{"path": .., "sha256": ..}`) as the message shows it: `PATH (sha256 HEX)`.
pub(super) fn init_typed(v: &Value) -> String {
    match (v.get("path").and_then(Value::as_str), v.get("sha256").and_then(Value::as_str)) {
        (Some(path), Some(sha256)) => format!("{path} (sha256 {sha256})"),
        _ => typed(v),
    }
}

fn push(out: &mut Vec<String>, flag: &str, now: &Value, then: &Value) {
    out.push(format!("{flag} {} (checkpoint: {})", typed(now), typed(then)));
}

fn gpt_flag(key: &str) -> String {
    match key {
        // The vocabulary is the data's: a text with other characters, or other token ids.
        "vocab_size" => "--data, whose vocabulary size is".to_string(),
        "bias" => "the model's biases".to_string(),
        k => format!("--{}", k.replace('_', "-")),
    }
}

/// A JSON value as a flag's value is typed: strings unquoted, f32 settings in their shortest
/// form (`0.1`, not `0.10000000149011612`), an absent one as "not given".
fn typed(v: &Value) -> String {
    match v {
        Value::Null => "not given".to_string(),
        Value::String(s) => s.clone(),
        Value::Number(n) if n.is_f64() => n.as_f64().map_or_else(|| n.to_string(), |x| (x as f32).to_string()),
        v => v.to_string(),
    }
}

/// The optimizer flags an optimizer's recorded form (its Debug text, `Sgd(SgdConfig { lr:
/// 0.01, momentum: 0.9, .. })` or `Adam(AdamConfig { .., decoupled: true })`) stands for.
fn optimizer_flags(v: &Value) -> Vec<(&'static str, String)> {
    let Some(text) = v.as_str() else { return Vec::new() };
    let field = |name: &str| {
        let at = text.find(&format!(" {name}: "))? + name.len() + 3;
        let rest = &text[at..];
        Some(rest[..rest.find([',', ' ', '}']).unwrap_or(rest.len())].to_string())
    };
    let (kind, extra) = if text.starts_with("Sgd(") {
        ("sgd", ("--momentum", "momentum"))
    } else if field("decoupled").as_deref() == Some("true") {
        ("adamw", ("--weight-decay", "weight_decay"))
    } else {
        ("adam", ("", ""))
    };
    let mut flags = vec![("--optimizer", kind.to_string())];
    flags.extend(field("lr").map(|lr| ("--lr", lr)));
    if !extra.0.is_empty() {
        flags.extend(field(extra.1).map(|x| (extra.0, x)));
    }
    flags
}

fn optimizer(now: &Value, then: &Value, out: &mut Vec<String>) {
    let (a, b) = (optimizer_flags(now), optimizer_flags(then));
    let before = out.len();
    match (a.first(), b.first()) {
        (Some(x), Some(y)) if x != y => out.push(format!("--optimizer {} (checkpoint: {})", x.1, y.1)),
        _ => {
            for (flag, x) in &a {
                let y = b.iter().find(|(f, _)| f == flag).map_or("not given", |(_, y)| y.as_str());
                if x != y {
                    out.push(format!("{flag} {x} (checkpoint: {y})"));
                }
            }
        }
    }
    if out.len() == before {
        out.push("the optimizer's settings (--optimizer, --lr, --momentum, --weight-decay)".to_string());
    }
}

/// `--warmup-steps` and the `--steps` its cosine decays over (a warmup schedule ends at the
/// run's last step, so a longer run decays more slowly).
fn schedule(now: &Value, then: &Value, out: &mut Vec<String>) {
    let warmup = |v: &Value| v.get("warmup_steps").cloned().unwrap_or(Value::Null);
    let steps = |v: &Value| v.get("decay_steps").and_then(Value::as_u64).map_or(Value::Null, |d| Value::from(d + 1));
    if warmup(now) != warmup(then) {
        push(out, "--warmup-steps", &warmup(now), &warmup(then));
    }
    if steps(now) != steps(then) && !steps(now).is_null() && !steps(then).is_null() {
        let (a, b) = (typed(&steps(now)), typed(&steps(then)));
        out.push(format!(
            "--steps {a} (checkpoint: {b}; with --warmup-steps the learning rate decays until the last step, so the run's length is fixed)"
        ));
    }
    // Otherwise only the learning rate differs, which the optimizer's entry names.
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_real_flags_with_values_as_typed() {
        let now = json!({
            "batch": 20, "grad_clip": 1.0, "optimizer": "Adam(AdamConfig { lr: 0.002, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, decoupled: true })",
            "lr_schedule": {"kind": "warmup_cosine", "lr": 0.002, "warmup_steps": 5, "decay_steps": 199, "min_lr": 0.0002},
            "gpt": {"n_layer": 2, "n_embd": 64, "dropout": 0.1f32},
        });
        let then = json!({
            "batch": 10, "grad_clip": null, "optimizer": "Adam(AdamConfig { lr: 0.001, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, decoupled: true })",
            "lr_schedule": {"kind": "warmup_cosine", "lr": 0.001, "warmup_steps": 5, "decay_steps": 99, "min_lr": 0.0001},
            "gpt": {"n_layer": 4, "n_embd": 64, "dropout": 0.0},
        });
        let got = changed(&now, &then).join(", ");
        for want in [
            "--batch 20 (checkpoint: 10)",
            "--grad-clip 1 (checkpoint: not given)",
            "--lr 0.002 (checkpoint: 0.001)",
            "--n-layer 2 (checkpoint: 4)",
            "--dropout 0.1 (checkpoint: 0)",
            "--steps 200 (checkpoint: 100",
        ] {
            assert!(got.contains(want), "lacks '{want}': {got}");
        }
        for wrong in ["--gpt", "--grad_clip", "--lr_schedule", "--lr-schedule", "Some(", "\""] {
            assert!(!got.contains(wrong), "names '{wrong}': {got}");
        }
        let sgd = |m: &str| json!({ "optimizer": format!("Sgd(SgdConfig {{ lr: 0.01, momentum: {m}, dampening: 0.0, nesterov: false, weight_decay: 0.0 }})") });
        assert_eq!(changed(&sgd("0.5"), &sgd("0.9")), ["--momentum 0.5 (checkpoint: 0.9)"]);
        let adam = json!({ "optimizer": "Adam(AdamConfig { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, decoupled: false })" });
        assert_eq!(changed(&adam, &sgd("0.9")), ["--optimizer adam (checkpoint: sgd)"]);
        let init = |p: &str, h: &str| json!({ "init": { "path": p, "sha256": h } });
        assert_eq!(
            changed(&init("b.safetensors", "bb"), &init("a.safetensors", "aa")),
            ["--init b.safetensors (sha256 bb) (checkpoint: a.safetensors (sha256 aa))"]
        );
        assert_eq!(changed(&init("b.safetensors", "bb"), &json!({})), ["--init b.safetensors (sha256 bb) (checkpoint: not given)"]);
    }

    #[test]
    fn a_changed_tokenizer_is_named_either_way_and_not_as_changed_characters() {
        let chars = json!({ "data": "text:a.txt", "vocab": "abc" });
        let gpt2 = json!({ "data": "text:a.txt", "vocab": null, "tokenizer": "gpt2" });
        assert_eq!(changed(&gpt2, &chars), ["--tokenizer gpt2 (checkpoint: chars)"]);
        assert_eq!(changed(&chars, &gpt2), ["--tokenizer chars (checkpoint: gpt2)"]);
        assert_eq!(changed(&json!({ "vocab": "abd" }), &chars), ["--data (the text's characters differ from the checkpoint's)"]);
    }
}
