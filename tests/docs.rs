//! The Rust in the docs runs (issue 29, item 6): every ```rust block of docs/*.md and the README
//! is the visible part of a doctest in the workspace's sources, which `cargo test` runs with its
//! hidden lines making the data. An edited block whose doctest was not edited with it fails here.
//! (tests/python/test_docs.py runs the shell and Python blocks.)

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The fenced blocks of `lang` in a Markdown text, each as its lines.
fn fenced(text: &str, lang: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim_end() == format!("```{lang}") {
            out.push(
                lines
                    .by_ref()
                    .take_while(|l| !l.starts_with("```"))
                    .map(str::to_string)
                    .collect(),
            );
        }
    }
    out
}

/// Every doctest of a Rust source file, as the lines rustdoc shows: doc comments' code blocks
/// without their hidden (`# `) lines.
fn doctests(source: &str) -> Vec<Vec<String>> {
    let mut docs = String::new();
    for line in source.lines() {
        let t = line.trim_start();
        let body = t
            .strip_prefix("///")
            .or_else(|| t.strip_prefix("//!"))
            .map(|b| b.strip_prefix(' ').unwrap_or(b));
        match body {
            Some(b) => {
                docs.push_str(b);
                docs.push('\n');
            }
            None => docs.push_str("\n\n"),
        }
    }
    let mut out = Vec::new();
    let mut lines = docs.lines();
    while let Some(line) = lines.next() {
        if line == "```" || line.starts_with("```rust") {
            out.push(
                lines
                    .by_ref()
                    .take_while(|l| !l.starts_with("```"))
                    .filter(|l| *l != "#" && !l.starts_with("# "))
                    .map(str::to_string)
                    .collect(),
            );
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_rust_block_of_the_docs_is_a_doctest_that_runs() {
    let mut sources = Vec::new();
    for krate in [
        "src",
        "format/src",
        "gen/src",
        "compiler/src",
        "loader/src",
        "trainer/src",
    ] {
        rust_files(&repo().join(krate), &mut sources);
    }
    let tested: Vec<Vec<String>> = sources
        .iter()
        .flat_map(|p| doctests(&std::fs::read_to_string(p).unwrap()))
        .collect();
    let mut docs = vec![repo().join("README.md")];
    for entry in std::fs::read_dir(repo().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            docs.push(path);
        }
    }
    let mut checked = 0;
    for doc in &docs {
        for block in fenced(&std::fs::read_to_string(doc).unwrap(), "rust") {
            assert!(
                tested.contains(&block),
                "{}: this Rust block is no doctest's visible part; put it (with hidden lines \
                 that make its data) on the item it shows, or edit both together:\n{}",
                doc.display(),
                block.join("\n")
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "the guide's Rust blocks were not found");
}
