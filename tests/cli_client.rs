//! The command line is a client of the library: `src/main.rs` declares `mod cli` (so the
//! compiler holds it to the public API), the library declares none and carries no
//! `cfg(feature = "cli")` item, and every variant of `tandem::Error` is built by the library
//! itself, none only for the command line.
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The library's sources: `src/` without the binary's `main.rs` and `cli/`.
fn library_files() -> Vec<(PathBuf, String)> {
    let (main, cli) = (src().join("main.rs"), src().join("cli"));
    rust_files(&src()).into_iter().filter(|p| *p != main && !p.starts_with(&cli)).map(|p| (p.clone(), std::fs::read_to_string(&p).unwrap())).collect()
}

/// Whether `text` has a line declaring `mod cli` (any visibility, any attributes before it).
fn declares_mod_cli(text: &str) -> bool {
    text.lines().map(str::trim).any(|l| {
        let l = l.strip_prefix("pub(crate) ").or_else(|| l.strip_prefix("pub ")).unwrap_or(l);
        l == "mod cli;" || l.starts_with("mod cli {")
    })
}

#[test]
fn the_binary_declares_the_cli_and_the_library_does_not() {
    let main = std::fs::read_to_string(src().join("main.rs")).unwrap();
    assert!(declares_mod_cli(&main), "src/main.rs does not declare `mod cli`");
    let mut found = Vec::new();
    for (path, text) in library_files() {
        for (i, line) in text.lines().enumerate() {
            let squeezed: String = line.chars().filter(|c| !c.is_whitespace()).collect();
            if squeezed.contains("feature=\"cli\"") || declares_mod_cli(line) {
                found.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "the library refers to the command line:\n{}", found.join("\n"));
}

/// The variant names of `pub enum Error` in src/error.rs.
fn error_variants() -> Vec<String> {
    let text = std::fs::read_to_string(src().join("error.rs")).unwrap();
    let body = text.split("pub enum Error {").nth(1).expect("src/error.rs defines pub enum Error");
    let body = &body[..body.find("\n}").expect("the enum ends")];
    body.lines()
        .filter(|l| l.starts_with("    ") && !l.starts_with("     "))
        .map(str::trim)
        .filter(|l| l.starts_with(|c: char| c.is_ascii_uppercase()))
        .map(|l| l.chars().take_while(|c| c.is_alphanumeric()).collect())
        .collect()
}

/// The `pub fn`s of src/error.rs (`Error::invalid`, `in_worker`, ...), each with its text.
fn error_fns(error_rs: &str) -> Vec<(String, String)> {
    error_rs
        .split("    pub fn ")
        .skip(1)
        .map(|chunk| {
            let name: String = chunk.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            let body = chunk.split("\n    }").next().unwrap_or(chunk).to_string();
            (name, body)
        })
        .collect()
}

#[test]
fn every_error_variant_is_built_by_the_library() {
    let variants = error_variants();
    assert!(variants.len() >= 10 && variants.iter().any(|v| v == "Invalid"), "read the variants wrong: {variants:?}");
    let error_rs = src().join("error.rs");
    let lib: Vec<String> = library_files().into_iter().filter(|(p, _)| *p != error_rs).map(|(_, t)| t).collect();
    let fns = error_fns(&std::fs::read_to_string(&error_rs).unwrap());
    assert!(fns.iter().any(|(n, _)| n == "invalid"), "read the constructors wrong");
    let unbuilt: Vec<&String> = variants
        .iter()
        .filter(|v| {
            let built = |t: &String| t.contains(&format!("Error::{v} ")) || t.contains(&format!("Error::{v}("));
            // Or through a function of error.rs that builds it (`Error::invalid(..)` makes
            // `Invalid`, `e.in_worker(..)` makes `Worker`).
            let via: Vec<&String> = fns.iter().filter(|(_, body)| built(body)).map(|(n, _)| n).collect();
            !lib.iter().any(|t| built(t) || via.iter().any(|f| t.contains(&format!("Error::{f}(")) || t.contains(&format!(".{f}("))))
        })
        .collect();
    assert!(unbuilt.is_empty(), "variants of tandem::Error that no library code builds (the command line's own errors belong to it): {unbuilt:?}");
}
