//! The house's layering: inside each crate, and inside the Python package, no module imports a
//! module that imports it back, directly or through others (issue 29, item 5). A circle means
//! two modules can only be read, tested and changed together; the check keeps new ones out.
//!
//! The graph is read from the sources: in Rust every `crate::…` and `super::…` path outside
//! comments (in `use` trees and in code, `#[cfg(test)]` modules included), resolved to the
//! longest module prefix; paths relative to a module (its own children) are not counted, so a
//! module and the modules it declares count as one;
//! in Python every relative import (`from .x import`, `from . import x`), lazy ones included.
//! The crate root (`lib.rs`, `main.rs`) and the package's `__init__.py` are the front doors:
//! they declare and re-export the modules, so edges into and out of them are not counted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

/// The module path of a Rust source file under `src` (`""` for the crate root).
fn rust_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// The paths named after each `crate::` or `super::` in `text`, with `use` groups
/// (`crate::{a::{self, B}, c}`) expanded into one path per top-level item.
fn named_paths(text: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `foo_crate::` and the like
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 1 => break,
                    '}' => depth -= 1,
                    ',' if depth == 1 => {
                        out.push(std::mem::take(&mut item));
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            out.push(item);
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            out.push(rest[..end].to_string());
        }
    }
    out.iter()
        .map(|p| {
            p.trim()
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .next()
                .unwrap_or("")
                .trim_matches(':')
                .to_string()
        })
        .filter(|p| !p.is_empty())
        .collect()
}

/// `text` without its line comments (doc comments included): a doc link is not an import.
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.split_once("//").map_or(l, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module of `path` (segments after `crate::`): its longest prefix that is a module.
fn resolve(modules: &BTreeSet<String>, path: &str) -> Option<String> {
    let segs: Vec<&str> = path.split("::").collect();
    (1..=segs.len())
        .rev()
        .map(|n| segs[..n].join("::"))
        .find(|m| modules.contains(m))
}

fn rust_graph(src: &Path) -> Graph {
    let mut paths = Vec::new();
    files(src, "rs", &mut paths);
    let modules: BTreeSet<String> = paths.iter().map(|f| rust_module(src, f)).collect();
    let mut graph = Graph::new();
    for file in &paths {
        let module = rust_module(src, file);
        if module.is_empty() {
            continue; // the crate root
        }
        let text = without_comments(&std::fs::read_to_string(file).unwrap());
        let parent = module.rsplit_once("::").map_or("", |(p, _)| p).to_string();
        let mut targets: Vec<String> = named_paths(&text, "crate::")
            .iter()
            .filter_map(|p| resolve(&modules, p))
            .collect();
        // `super::x` in a file module names a sibling (inline test modules' `super::*` is the
        // file itself).
        for p in named_paths(&text, "super::") {
            let full = if parent.is_empty() {
                p.clone()
            } else {
                format!("{parent}::{p}")
            };
            targets.extend(resolve(&modules, &full));
        }
        let edges = graph.entry(module.clone()).or_default();
        edges.extend(
            targets
                .into_iter()
                .filter(|t| !t.is_empty() && *t != module),
        );
    }
    graph
}

fn python_graph(package: &Path) -> Graph {
    let mut paths = Vec::new();
    files(package, "py", &mut paths);
    let mut graph = Graph::new();
    for file in &paths {
        let module = file.file_stem().unwrap().to_string_lossy().into_owned();
        if module == "__init__" {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        let edges = graph.entry(module.clone()).or_default();
        for line in text.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
            if let Some(rest) = line.strip_prefix("from .") {
                let (target, names) = rest.split_once(" import ").unwrap_or((rest, ""));
                if target.is_empty() {
                    // `from . import a, b`
                    edges.extend(
                        names
                            .split(',')
                            .map(|n| n.split_whitespace().next().unwrap_or("").to_string()),
                    );
                } else {
                    edges.insert(target.to_string());
                }
            }
        }
        edges.retain(|t| !t.is_empty() && *t != module);
    }
    graph
}

/// A cycle of `graph`, if there is one.
fn cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()) {
                Some(1) => {
                    let from = stack.iter().position(|n| n == next).unwrap();
                    let mut found = stack[from..].to_vec();
                    found.push(next.clone());
                    return Some(found);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(next, graph, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node.as_str()) {
            if let Some(c) = visit(node, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let root = repo();
    let mut found = Vec::new();
    for krate in [
        "format", "gen", "compiler", "loader", "trainer", "python", "src",
    ] {
        let src = match krate {
            "src" => root.join("src"),
            k => root.join(k).join("src"),
        };
        if let Some(c) = cycle(&rust_graph(&src)) {
            found.push(format!("{krate}: {}", c.join(" -> ")));
        }
    }
    if let Some(c) = cycle(&python_graph(&root.join("python/dsc"))) {
        found.push(format!("python/dsc: {}", c.join(" -> ")));
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// The check itself sees a circle where there is one, through `use` groups, `super::` and
/// lazy Python imports alike.
#[test]
fn the_layering_check_finds_circles() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a; mod b; pub use a::X;").unwrap();
    std::fs::write(
        src.join("a/mod.rs"),
        "use crate::{a::inner::Z,\n    b::{self, Y}};",
    )
    .unwrap();
    std::fs::write(src.join("a/inner.rs"), "pub struct Z;").unwrap();
    std::fs::write(src.join("b.rs"), "fn f() { let _ = super::a::inner::Z; }").unwrap();
    assert_eq!(
        cycle(&rust_graph(&src)),
        None,
        "b names a::inner, not a: no circle"
    );
    std::fs::write(src.join("b.rs"), "fn f() { crate::a::X; }").unwrap();
    let found = cycle(&rust_graph(&src)).expect("a -> b -> a");
    assert!(found.contains(&"a".to_string()) && found.contains(&"b".to_string()));

    let pkg = dir.path().join("pkg");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(
        pkg.join("__init__.py"),
        "from ._a import A\nfrom ._b import B\n",
    )
    .unwrap();
    std::fs::write(pkg.join("_a.py"), "from . import _b, _c\n").unwrap();
    std::fs::write(pkg.join("_b.py"), "def f():\n    from ._a import A\n").unwrap();
    std::fs::write(pkg.join("_c.py"), "import os\n").unwrap();
    let found = cycle(&python_graph(&pkg)).expect("_a -> _b -> _a");
    assert_eq!(found, ["_a", "_b", "_a"]);
}
