//! The layers of `src/` in their declared order, and a scan of every source file for a path
//! (`crate::x`, `crate::{x, ..}`, `super::..` reaching the crate root, or a root re-export such
//! as `crate::Tensor`) from a lower layer into a higher one.
//!
//! A layer may use itself and anything below it. Modules in one layer use each other by design
//! (a `Tensor` op records its `GradOp`, and the gradient rules are `Tensor` ops). Comments and
//! string literals are not imports: a doc link to a higher layer's guide is allowed.
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The top-level modules of `src/`, lowest layer first; a module of `src/` missing from this
/// list fails the test, so that a new module is placed on purpose.
const LAYERS: &[&[&str]] = &[
    // Dtypes, shapes, the one error enum and the comparison bound every test uses.
    &["shape", "error", "tolerance"],
    // Backends and the `Device` handle over one (a backend answers with the device it runs on).
    &["backend", "device"],
    // The tensor API and the autograd tape it records.
    &["tensor", "autograd"],
    // Host tensors in safetensors files: the file format, below everything that saves.
    &["checkpoint"],
    // Host batches and the sources that draw them (a vocabulary, a tensor file).
    &["data"],
    &["nn"],
    &["optim"],
    // Processes (MPI groups, launching, agreeing across ranks): below the collectives that span them.
    &["dist"],
    // Strategies and the collectives between devices.
    &["parallel"],
    // The training loop, its run directories and resumable state.
    &["train"],
    // The command line: a client of everything above, declared by the binary.
    &["cli", "main"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Source with comments, string and char literals blanked to spaces (newlines kept, so that
/// line numbers stay right).
fn code_only(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || (next == Some('#') && !b[i.saturating_sub(1)].is_alphanumeric())) {
            // A raw string: r"..", r#".."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let rest: String = b[j + 1..].iter().collect();
            let end = rest.find(&close).map(|k| j + 1 + rest[..k].chars().count() + close.chars().count()).unwrap_or(b.len());
            for &ch in &b[i..end] {
                blank(&mut out, ch);
            }
            i = end;
        } else if c == '"' {
            blank(&mut out, c);
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            if i < b.len() {
                out.push(' ');
                i += 1;
            }
        } else if c == '\'' && (next == Some('\\') || b.get(i + 2) == Some(&'\'')) {
            // A char literal ('x', '\n', '\u{..}'); a lifetime ('a) has no closing quote.
            let start = i;
            i += 1;
            if b[i] == '\\' {
                i += 2;
            } else {
                i += 1;
            }
            while i < b.len() && b[i] != '\'' {
                i += 1;
            }
            for &ch in &b[start..=i.min(b.len() - 1)] {
                blank(&mut out, ch);
            }
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_at(s: &[char], mut i: usize) -> (String, usize) {
    while i < s.len() && s[i].is_whitespace() {
        i += 1;
    }
    let start = i;
    while i < s.len() && (s[i].is_alphanumeric() || s[i] == '_') {
        i += 1;
    }
    (s[start..i].iter().collect(), i)
}

/// The first segments of the paths at `i`: one identifier, or each item of a `{..}` group.
fn first_segments(s: &[char], i: usize) -> Vec<String> {
    let mut j = i;
    while j < s.len() && s[j].is_whitespace() {
        j += 1;
    }
    if s.get(j) != Some(&'{') {
        return vec![ident_at(s, j).0];
    }
    let mut out = Vec::new();
    let mut depth = 0;
    let mut expect = true;
    while j < s.len() {
        match s[j] {
            '{' => {
                depth += 1;
                expect = depth == 1;
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => expect = true,
            c if expect && depth == 1 && (c.is_alphabetic() || c == '_') => {
                let (id, end) = ident_at(s, j);
                out.push(id);
                expect = false;
                j = end;
                continue;
            }
            _ => {}
        }
        j += 1;
    }
    out
}

/// The names the crate root re-exports (`pub use device::{Device, ..}`), by the module they
/// come from.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let code = code_only(lib);
    let mut map = BTreeMap::new();
    for stmt in code.split(';') {
        let stmt = stmt.trim();
        let Some(rest) = stmt.strip_prefix("pub use ") else { continue };
        let Some((module, names)) = rest.split_once("::") else { continue };
        let names = names.trim().trim_start_matches('{').trim_end_matches('}');
        for name in names.split(',') {
            let name = name.trim();
            let name = name.rsplit(" as ").next().unwrap_or(name).trim();
            if !name.is_empty() {
                map.insert(name.to_string(), module.trim().to_string());
            }
        }
    }
    map
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file under `src/` (`parallel/comm/mod.rs` -> `[parallel, comm]`).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && !(parts.is_empty() && stem == "lib") {
        parts.push(stem.to_string());
    }
    parts
}

/// Every import in `code` of a file at `module` (inline `mod x { .. }` blocks followed by brace
/// depth) that names a top-level module: (line, top-level module, the path as written).
fn imports(code: &str, module: &[String], reexports: &BTreeMap<String, String>) -> Vec<(usize, String, String)> {
    let s: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut line = 1;
    let mut depth = 0usize;
    // Inline modules open at the brace depth they were declared at.
    let mut inline: Vec<(usize, String)> = Vec::new();
    let mut pending_mod: Option<String> = None;
    let mut i = 0;
    let boundary = |i: usize| i == 0 || !(s[i - 1].is_alphanumeric() || s[i - 1] == '_' || s[i - 1] == '$' || s[i - 1] == ':');
    let top = |name: &str| -> Option<String> {
        if layer_of(name).is_some() {
            Some(name.to_string())
        } else {
            reexports.get(name).cloned()
        }
    };
    while i < s.len() {
        let c = s[i];
        if c == '\n' {
            line += 1;
        } else if c == '{' {
            depth += 1;
            if let Some(m) = pending_mod.take() {
                inline.push((depth, m));
            }
        } else if c == '}' {
            if inline.last().is_some_and(|(d, _)| *d == depth) {
                inline.pop();
            }
            depth = depth.saturating_sub(1);
        } else if c == ';' {
            pending_mod = None;
        }
        let rest = |p: &str| s[i..].iter().take(p.len()).copied().eq(p.chars());
        if boundary(i) && rest("mod ") {
            let (name, end) = ident_at(&s, i + 4);
            pending_mod = Some(name);
            i = end;
            continue;
        }
        if boundary(i) && (rest("crate::") || rest("super::")) {
            let written_at = i;
            let mut segs = 0;
            let from_crate = rest("crate::");
            i += 7;
            if !from_crate {
                segs = 1;
                while s[i..].iter().take(7).copied().eq("super::".chars()) {
                    segs += 1;
                    i += 7;
                }
            }
            let here: Vec<String> = module.iter().cloned().chain(inline.iter().map(|(_, m)| m.clone())).collect();
            let reaches_root = from_crate || segs >= here.len();
            if reaches_root {
                let end = s[i..].iter().position(|&ch| ch == ';' || ch == '\n').map(|k| i + k).unwrap_or(s.len());
                let written: String = s[written_at..end].iter().collect();
                for seg in first_segments(&s, i) {
                    if let Some(m) = top(&seg) {
                        found.push((line, m, written.trim().to_string()));
                    }
                }
            }
            continue;
        }
        i += 1;
    }
    found
}

#[test]
fn every_src_module_has_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut missing = Vec::new();
    for entry in fs::read_dir(&src).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        let is_module = p.is_dir() || p.extension().is_some_and(|e| e == "rs");
        if is_module && name != "lib" && layer_of(&name).is_none() {
            missing.push(name);
        }
    }
    assert!(missing.is_empty(), "src/ modules without a layer in LAYERS: {missing:?}");
}

#[test]
fn no_import_reaches_a_higher_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let reexports = root_reexports(&fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut upward = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let module = module_path(rel);
        let Some(own) = module.first() else { continue };
        let own_layer = layer_of(own).unwrap_or_else(|| panic!("{} is in no layer", rel.display()));
        let code = code_only(&fs::read_to_string(file).unwrap());
        for (line, target, written) in imports(&code, &module, &reexports) {
            let target_layer = layer_of(&target).unwrap();
            if target_layer > own_layer {
                upward.push(format!("src/{}:{line}: {own} -> {target}: {written}", rel.display()));
            }
        }
    }
    assert!(upward.is_empty(), "{} import(s) from a lower layer into a higher one:\n{}", upward.len(), upward.join("\n"));
}

#[test]
fn the_scan_sees_each_form_of_path() {
    let reexports = root_reexports("pub use tensor::{CrossEntropy, Tensor};\npub use device::Device;");
    let code = code_only(
        "use crate::{nn::Module, Tensor};\nfn f() { super::parallel::x(); }\n// crate::cli in a comment\nlet s = \"crate::cli\";\nmod tests { use super::*; fn g() { super::super::data::y(); } }\nuse crate::Device;",
    );
    let module = vec!["backend".to_string()];
    let found: Vec<(usize, String)> = imports(&code, &module, &reexports).into_iter().map(|(l, m, _)| (l, m)).collect();
    let want = [(1, "nn"), (1, "tensor"), (2, "parallel"), (5, "data"), (6, "device")];
    assert_eq!(found, want.map(|(l, m)| (l, m.to_string())).to_vec());
}
