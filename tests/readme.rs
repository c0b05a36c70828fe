//! README.md stays a short front page: at most 300 lines of at most 200 columns, the two
//! commands CI and users run, and a library example identical to the crate documentation's
//! doc-tested one, so it cannot rot.
use std::path::Path;

const MAX_LINES: usize = 300;
/// Columns a README line may take: a reader's terminal or diff shows it whole.
const MAX_COLUMNS: usize = 200;

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The first fenced block opened with exactly `` ```rust ``, without its fences.
fn first_rust_block(text: &str) -> Option<String> {
    let mut lines = text.lines().skip_while(|l| l.trim_end() != "```rust");
    lines.next()?;
    let body: Vec<&str> = lines.take_while(|l| l.trim_end() != "```").collect();
    Some(body.join("\n"))
}

/// The crate's `//!` documentation as markdown.
fn crate_docs() -> String {
    read("src/lib.rs").lines().filter_map(|l| l.strip_prefix("//!")).map(|l| l.strip_prefix(' ').unwrap_or(l)).collect::<Vec<_>>().join("\n")
}

#[test]
fn readme_is_short() {
    let n = read("README.md").lines().count();
    assert!(n <= MAX_LINES, "README.md has {n} lines; at most {MAX_LINES} (the rest belongs in the rustdoc guides)");
}

#[test]
fn readme_lines_are_at_most_200_columns() {
    let long: Vec<String> = read("README.md")
        .lines()
        .enumerate()
        .filter(|(_, l)| l.chars().count() > MAX_COLUMNS)
        .map(|(i, l)| format!("line {}: {} columns", i + 1, l.chars().count()))
        .collect();
    assert!(long.is_empty(), "README.md lines over {MAX_COLUMNS} columns (wrap them, or shorten a table cell):\n{}", long.join("\n"));
}

#[test]
fn readme_has_the_two_commands() {
    let readme = read("README.md");
    for command in ["cargo run --release -- train", "bash scripts/test.sh"] {
        assert!(readme.lines().any(|l| l.trim() == command), "README.md has no line `{command}`");
    }
    // CI runs the README's test command: it must be the script .ci/run runs.
    assert!(read(".ci/run").lines().any(|l| l.trim() == "bash scripts/test.sh"), ".ci/run does not run `bash scripts/test.sh`");
}

#[test]
fn readme_example_is_the_doc_tested_one() {
    let readme = first_rust_block(&read("README.md")).expect("README.md has a ```rust example");
    let docs = first_rust_block(&crate_docs()).expect("the crate docs in src/lib.rs have a ```rust example");
    assert_eq!(readme, docs, "README.md's example differs from the doc-tested one in src/lib.rs; make them identical");
    assert!(readme.contains("fn main()"), "the example is a whole program");
}
