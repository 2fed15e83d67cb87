//! The house's layering: inside each crate, and inside the Python package, no module imports a
//! module that imports it back, directly or through others (issue 29, item 5). A circle means
//! two modules can only be read, tested and changed together; the check keeps new ones out.
//!
//! The graph is read from the sources as the compiler resolves them (issue 40, item 4). In
//! Rust every `crate::…` and `super::…` path outside comments (in `use` trees and in code,
//! `#[cfg(test)]` modules included) is followed through the front doors' re-exports (`pub use`
//! in `lib.rs` or a folder's `mod.rs`, globs included) to the module that defines the name;
//! paths relative to a module (its own children) are not counted. In Python every relative
//! import (`from .x import`, `from . import x`, lazy ones included), with a name re-exported by
//! `__init__.py` followed to its module.
//!
//! A folder module counts as one with its files when seen from its siblings: an edge from
//! `cache` to `remote::open` is an edge from `cache` to `remote`, and one from `remote::open`
//! to `cache` closes the circle. Inside the folder its files are checked among themselves. The
//! crate root (`lib.rs`, `main.rs`) and `__init__.py` are the front doors: they declare and
//! re-export the modules, so edges into and out of them are not counted, nor are edges between
//! a folder's `mod.rs` and its own files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The checkout to check: this one, or `DSC_LAYERING_ROOT` (e.g. an older commit unpacked with
/// `git archive`, to see which circles the check finds there).
fn repo() -> PathBuf {
    std::env::var_os("DSC_LAYERING_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
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

/// `a::b`, or `b` alone where `a` is the crate root (`""`).
fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}::{b}"),
    }
}

/// Where each re-exported name leads: `"m::Name"` (`"Name"` at the crate root) to the path,
/// from the crate root, that its `pub use` names. Globs (`pub use entry::*`) map every `pub`
/// item the target file declares.
type Reexports = BTreeMap<String, String>;

/// The `pub use` (and `pub(crate) use`) statements of `text`, each as its tree (`a::{B, c::D}`).
fn pub_uses(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("use ") {
        let head = rest[..at].trim_end();
        rest = &rest[at + 4..];
        if !(head.ends_with("pub") || head.ends_with("pub(crate)")) {
            continue;
        }
        let end = rest.find(';').unwrap_or(rest.len());
        out.push(rest[..end].split_whitespace().collect::<Vec<_>>().join(" "));
        rest = &rest[end..];
    }
    out
}

/// The leaves of a use tree: (path from the tree's start, the name it is exported as).
fn use_leaves(tree: &str) -> Vec<(String, String)> {
    fn walk(prefix: &str, tree: &str, out: &mut Vec<(String, String)>) {
        let tree = tree.trim();
        if let Some(open) = tree.find('{') {
            let base = tree[..open].trim().trim_end_matches("::");
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let (mut depth, mut start) = (0, 0);
            let mut parts = Vec::new();
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        parts.push(&inner[start..i]);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            parts.push(&inner[start..]);
            let prefix = join(prefix, base);
            for part in parts.into_iter().filter(|p| !p.trim().is_empty()) {
                walk(&prefix, part, out);
            }
        } else {
            let (path, alias) = match tree.split_once(" as ") {
                Some((p, a)) => (p.trim(), Some(a.trim())),
                None => (tree, None),
            };
            let full = if path == "self" {
                prefix.to_string()
            } else {
                join(prefix, path)
            };
            let name = alias
                .unwrap_or_else(|| full.rsplit("::").next().unwrap_or(""))
                .to_string();
            out.push((full, name));
        }
    }
    let mut out = Vec::new();
    walk("", tree, &mut out);
    out
}

/// The names a file declares `pub` (for glob re-exports).
fn pub_items(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim_start) {
        let Some(rest) = line
            .strip_prefix("pub ")
            .or_else(|| line.strip_prefix("pub(crate) "))
        else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let kind = words.next().unwrap_or("");
        let kind = if kind == "unsafe" || kind == "const" && rest.starts_with("const fn") {
            words.next().unwrap_or("")
        } else {
            kind
        };
        if matches!(
            kind,
            "struct" | "enum" | "fn" | "trait" | "type" | "const" | "static" | "mod"
        ) {
            if let Some(name) = words.next() {
                let name: String = name
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        }
    }
    out
}

/// The path of a `use` in `module` as a path from the crate root (`crate::`, `self::`,
/// `super::` and a child module's name resolved), or None for another crate's.
fn from_root(modules: &BTreeSet<String>, module: &str, path: &str) -> Option<String> {
    if let Some(rest) = path.strip_prefix("crate::") {
        return Some(rest.to_string());
    }
    if let Some(rest) = path.strip_prefix("self::") {
        return Some(join(module, rest));
    }
    if let Some(rest) = path.strip_prefix("super::") {
        let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
        return Some(join(parent, rest));
    }
    let first = path.split("::").next().unwrap_or("");
    modules
        .contains(&join(module, first))
        .then(|| join(module, path))
}

fn reexports(modules: &BTreeSet<String>, texts: &BTreeMap<String, String>) -> Reexports {
    let mut map = Reexports::new();
    for (module, text) in texts {
        for tree in pub_uses(text) {
            for (path, name) in use_leaves(&tree) {
                let Some(target) = from_root(modules, module, &path) else {
                    continue;
                };
                if name == "*" {
                    let target = target.trim_end_matches("::*").to_string();
                    for item in texts.get(&target).map(|t| pub_items(t)).unwrap_or_default() {
                        map.insert(join(module, &item), format!("{target}::{item}"));
                    }
                } else {
                    map.insert(join(module, &name), target);
                }
            }
        }
    }
    map
}

/// The module that defines what `path` (segments after `crate::`) names: re-exports followed,
/// then its longest prefix that is a module.
fn resolve(modules: &BTreeSet<String>, reexports: &Reexports, path: &str) -> Option<String> {
    let mut path = path.to_string();
    for _ in 0..16 {
        let segs: Vec<&str> = path.split("::").collect();
        let hop = (1..=segs.len()).rev().find_map(|n| {
            let target = reexports.get(&segs[..n].join("::"))?;
            Some(
                std::iter::once(target.as_str())
                    .chain(segs[n..].iter().copied())
                    .collect::<Vec<_>>()
                    .join("::"),
            )
        });
        match hop {
            Some(next) if next != path => path = next,
            _ => break,
        }
    }
    let segs: Vec<&str> = path.split("::").collect();
    (1..=segs.len())
        .rev()
        .map(|n| segs[..n].join("::"))
        .find(|m| modules.contains(m))
}

/// The edges between modules that sit side by side: an edge from `a::x` to `b::y` is one from
/// `a` to `b` (a folder counts as one with its files seen from outside), one from `a::x` to
/// `a::y` stays inside the folder `a`, and one between a folder and its own files is none.
fn side_by_side(edges: &[(String, String)]) -> Graph {
    let mut graph = Graph::new();
    for (from, to) in edges {
        let f: Vec<&str> = from.split("::").collect();
        let t: Vec<&str> = to.split("::").collect();
        let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
        if common == f.len() || common == t.len() {
            continue; // a module and its own folder's files, or itself
        }
        let node = |segs: &[&str]| segs[..=common].join("::");
        graph.entry(node(&f)).or_default().insert(node(&t));
    }
    graph
}

fn rust_graph(src: &Path) -> Graph {
    let mut paths = Vec::new();
    files(src, "rs", &mut paths);
    let texts: BTreeMap<String, String> = paths
        .iter()
        .map(|f| {
            let text = without_comments(&std::fs::read_to_string(f).unwrap());
            (rust_module(src, f), text)
        })
        .collect();
    let modules: BTreeSet<String> = texts.keys().cloned().collect();
    let reexports = reexports(&modules, &texts);
    let mut edges = Vec::new();
    for (module, text) in &texts {
        if module.is_empty() {
            continue; // the crate root
        }
        let mut targets: Vec<String> = named_paths(text, "crate::")
            .iter()
            .filter_map(|p| resolve(&modules, &reexports, p))
            .collect();
        // `super::x` in a file module names a sibling (inline test modules' `super::*` is the
        // file itself).
        for p in named_paths(text, "super::") {
            let full = from_root(&modules, module, &format!("super::{p}"));
            targets.extend(full.and_then(|f| resolve(&modules, &reexports, &f)));
        }
        edges.extend(
            targets
                .into_iter()
                .filter(|t| !t.is_empty() && t != module)
                .map(|t| (module.clone(), t)),
        );
    }
    side_by_side(&edges)
}

/// The relative imports of a Python file: (module, names) for `from .module import names`, and
/// ("", names) for `from . import names`; parenthesised lists over several lines joined.
fn python_imports(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    // Comments dropped line by line, before a parenthesised list's lines are joined.
    let mut lines = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim());
    while let Some(line) = lines.next() {
        let Some(rest) = line.strip_prefix("from .") else {
            continue;
        };
        let (target, names) = rest.split_once(" import ").unwrap_or((rest, ""));
        let mut names = names.to_string();
        if names.starts_with('(') {
            while !names.contains(')') {
                match lines.next() {
                    Some(more) => names.push_str(more),
                    None => break,
                }
            }
        }
        let names = names
            .trim_matches(|c| c == '(' || c == ')')
            .split(',')
            .filter_map(|n| n.split_whitespace().next())
            .map(|n| n.trim_matches(|c| c == '(' || c == ')').to_string())
            .filter(|n| !n.is_empty())
            .collect();
        out.push((target.trim().to_string(), names));
    }
    out
}

fn python_graph(package: &Path) -> Graph {
    let mut paths = Vec::new();
    files(package, "py", &mut paths);
    let module_of = |f: &PathBuf| f.file_stem().unwrap().to_string_lossy().into_owned();
    let modules: BTreeSet<String> = paths.iter().map(module_of).collect();
    // Names `__init__.py` re-exports (`from ._loader import Loader`), to their modules.
    let mut exported = BTreeMap::new();
    if let Ok(text) = std::fs::read_to_string(package.join("__init__.py")) {
        for (target, names) in python_imports(&text) {
            if !target.is_empty() {
                for name in names {
                    exported.insert(name, target.clone());
                }
            }
        }
    }
    let mut graph = Graph::new();
    for file in &paths {
        let module = module_of(file);
        if module == "__init__" {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        let edges = graph.entry(module.clone()).or_default();
        for (target, names) in python_imports(&text) {
            if !target.is_empty() {
                edges.insert(target);
                continue;
            }
            // `from . import a, Name`: a module, or a name the package re-exports.
            for name in names {
                if modules.contains(&name) {
                    edges.insert(name);
                } else if let Some(m) = exported.get(&name) {
                    edges.insert(m.clone());
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
        "format", "gen", "compiler", "loader", "store", "trainer", "python", "src",
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

/// The check itself sees a circle where there is one: through `use` groups, `super::`, a
/// front door's re-exports (named and glob) and a folder's files, and through lazy Python
/// imports and names `__init__.py` re-exports.
#[test]
fn the_layering_check_finds_circles() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    let write = |file: &str, text: &str| std::fs::write(src.join(file), text).unwrap();
    write(
        "lib.rs",
        "mod a; mod b; mod c;\npub use a::{X, inner::Z as Zed};\npub use c::*;",
    );
    write(
        "a/mod.rs",
        "mod inner;\npub struct X;\nuse crate::{a::inner::Z,\n    b::{self, Y}};",
    );
    write("a/inner.rs", "pub struct Z;");
    write("b.rs", "pub struct Y;");
    write("c.rs", "pub fn helper() {}\npub(crate) struct Deep;");
    assert_eq!(cycle(&rust_graph(&src)), None, "a -> b only");

    // A name taken through the crate root leads to its module.
    write("b.rs", "fn f() { crate::X; }");
    assert_eq!(
        cycle(&rust_graph(&src)).expect("a -> b -> a"),
        ["a", "b", "a"]
    );
    write("b.rs", "use crate::Zed;");
    assert_eq!(
        cycle(&rust_graph(&src)).expect("through the alias"),
        ["a", "b", "a"]
    );

    // A folder counts as one with its files: b naming a::inner closes the circle with a.
    write("b.rs", "fn f() { let _ = super::a::inner::Z; }");
    assert_eq!(
        cycle(&rust_graph(&src)).expect("a -> b -> a::inner"),
        ["a", "b", "a"]
    );

    // A glob re-export: `crate::helper` is c's, and c naming a closes a circle through b.
    write("b.rs", "use crate::helper;");
    write("a/mod.rs", "mod inner;\npub struct X;\nuse crate::Deep;");
    write(
        "c.rs",
        "pub fn helper() {}\npub(crate) struct Deep;\nuse crate::b;",
    );
    let found = cycle(&rust_graph(&src)).expect("b -> c -> b");
    assert!(
        found.contains(&"b".to_string()) && found.contains(&"c".to_string()),
        "{found:?}"
    );

    // Inside a folder its files are checked among themselves; a folder and its files are one.
    write("b.rs", "pub struct Y;");
    write("c.rs", "pub fn helper() {}\npub(crate) struct Deep;");
    write(
        "a/mod.rs",
        "mod inner;\nmod other;\npub struct X;\nuse crate::a::inner::Z;",
    );
    write("a/inner.rs", "pub struct Z;\nuse super::X;");
    write("a/other.rs", "use super::inner::Z;");
    assert_eq!(
        cycle(&rust_graph(&src)),
        None,
        "a folder's files may use its mod.rs"
    );
    write("a/inner.rs", "pub struct Z;\nuse super::other;");
    assert_eq!(
        cycle(&rust_graph(&src)).expect("inner -> other -> inner"),
        ["a::inner", "a::other", "a::inner"]
    );

    let pkg = dir.path().join("pkg");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(
        pkg.join("__init__.py"),
        "from ._a import A\nfrom ._b import (\n    B,  # the first\n    Bee,\n)\n",
    )
    .unwrap();
    std::fs::write(pkg.join("_a.py"), "from . import _b, _c\n").unwrap();
    std::fs::write(pkg.join("_b.py"), "def f():\n    from ._a import A\n").unwrap();
    std::fs::write(pkg.join("_c.py"), "import os\n").unwrap();
    let found = cycle(&python_graph(&pkg)).expect("_a -> _b -> _a");
    assert_eq!(found, ["_a", "_b", "_a"]);
    // A class taken from the package root leads to the module that defines it.
    std::fs::write(pkg.join("_b.py"), "import os\n").unwrap();
    std::fs::write(pkg.join("_c.py"), "def f():\n    from . import Bee\n").unwrap();
    assert_eq!(
        cycle(&python_graph(&pkg)),
        None,
        "_c takes Bee from _b, which imports nothing"
    );
    std::fs::write(pkg.join("_c.py"), "def f():\n    from . import A\n").unwrap();
    assert_eq!(
        cycle(&python_graph(&pkg)).expect("_a -> _c -> _a"),
        ["_a", "_c", "_a"]
    );
}
