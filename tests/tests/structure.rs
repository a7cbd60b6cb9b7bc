//! The code's shape, as doc/ARCHITECTURE.md promises it: no import loop between the files
//! of a crate, no source file over 1,000 lines, no function over 120 lines outside tests,
//! and every `unsafe` block of ccfs and loadgen in their `sys` modules.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 1000;
const MAX_FN_LINES: usize = 120;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace holds tests/")
        .to_path_buf()
}

/// Every `.rs` file below `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.expect("entry").path();
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

/// The crates' own sources and the benches' (not the tests/ of any).
fn source_dirs() -> Vec<PathBuf> {
    let ws = workspace();
    let mut dirs = vec![
        ws.join("ccfs/src"),
        ws.join("loadgen/src"),
        ws.join("benches/src"),
    ];
    for e in fs::read_dir(ws.join("crates")).expect("crates/") {
        let src = e.expect("entry").path().join("src");
        if src.is_dir() {
            dirs.push(src);
        }
    }
    dirs
}

/// The lines of a source file that are not its test module (`#[cfg(test)] mod tests`, to
/// the end of the file as the code keeps it), or none for a file of tests.
fn production_lines(path: &Path, text: &str) -> Vec<String> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.ends_with("_tests.rs") || name == "test_support.rs" {
        return Vec::new();
    }
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    let end = lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod tests"))
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// The functions of `lines` longer than `max` lines: name and length. A function starts at
/// a line `fn NAME` (after its qualifiers) and ends at the first line that is its own
/// indentation and `}`.
fn long_functions(lines: &[String], max: usize) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let indent = line.len() - line.trim_start().len();
        let mut rest = line.trim_start();
        for q in [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "const ",
            "unsafe ",
            "async ",
        ] {
            if let Some(r) = rest.strip_prefix(q) {
                rest = r;
            }
        }
        if rest.starts_with("pub(in ") {
            rest = rest.split_once(") ").map_or(rest, |(_, r)| r);
        }
        let Some(sig) = rest.strip_prefix("fn ") else {
            continue;
        };
        let name: String = sig
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // A declaration without a body (a trait's) ends its signature with `;`.
        let sig_end = lines[i..]
            .iter()
            .map(|l| l.trim_end())
            .find(|l| l.ends_with('{') || l.ends_with(';'));
        if sig_end.is_some_and(|l| l.ends_with(';')) {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        let Some(len) = lines[i..].iter().position(|l| *l == close) else {
            continue; // a declaration without a body
        };
        if len + 1 > max {
            out.push((name, len + 1));
        }
    }
    out
}

#[test]
fn no_source_file_is_over_a_thousand_lines() {
    let mut long = Vec::new();
    for dir in source_dirs() {
        for f in rust_files(&dir) {
            let n = fs::read_to_string(&f).expect("read").lines().count();
            if n > MAX_FILE_LINES {
                long.push(format!("{} ({n} lines)", f.display()));
            }
        }
    }
    assert!(long.is_empty(), "over {MAX_FILE_LINES} lines: {long:#?}");
}

#[test]
fn no_function_outside_tests_is_over_120_lines() {
    let mut long = Vec::new();
    for dir in source_dirs() {
        for f in rust_files(&dir) {
            let text = fs::read_to_string(&f).expect("read");
            for (name, n) in long_functions(&production_lines(&f, &text), MAX_FN_LINES) {
                long.push(format!("{}: {name} ({n} lines)", f.display()));
            }
        }
    }
    assert!(long.is_empty(), "over {MAX_FN_LINES} lines: {long:#?}");
}

#[test]
fn the_length_check_finds_a_long_function() {
    let mut lines = vec!["    pub(super) fn long(&self) {".to_string()];
    lines.extend((0..130).map(|i| format!("        let _x{i} = {i};")));
    lines.push("    }".into());
    lines.push("fn short() {}".into());
    assert_eq!(
        long_functions(&lines, MAX_FN_LINES),
        vec![("long".into(), 132)]
    );
}

/// Each file's module path in its crate (`overlay::session::conflicts`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file
        .strip_prefix(src)
        .expect("below src")
        .with_extension("");
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

/// The modules a file's code names through `crate::` (in `use` and in paths), resolved
/// to the deepest module that is a file; comments and the test module left out. A file
/// naming a module it is itself inside (its parent's re-exports) is no edge.
fn crate_deps(module: &str, lines: &[String], modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let code: String = lines
        .iter()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| format!("{l}\n"))
        .collect();
    // `use crate::a::{b, c::d}` names a::b and a::c::d: expanded one level.
    let mut paths: Vec<String> = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        if i > 0 {
            let before = code[..i].chars().last().unwrap_or(' ');
            if before.is_alphanumeric() || before == '_' || before == ':' {
                continue;
            }
        }
        let rest = &code[i + "crate::".len()..];
        let head: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        let head = head.trim_end_matches(':').to_string();
        let after = &rest[head.len()..];
        if let Some(group) = after.strip_prefix("::{") {
            let inner = group.split('}').next().unwrap_or("");
            for item in inner.split(',') {
                let item = item.trim().split(" as ").next().unwrap_or("").trim();
                match item {
                    "" => {}
                    "self" => paths.push(head.clone()),
                    _ => paths.push(format!("{head}::{item}")),
                }
            }
        } else {
            paths.push(head);
        }
    }
    for p in paths {
        let comps: Vec<&str> = p.split("::").collect();
        let found = (1..=comps.len())
            .rev()
            .map(|k| comps[..k].join("::"))
            .find(|m| modules.contains(m));
        if let Some(m) = found {
            if m != module && !module.starts_with(&format!("{m}::")) {
                out.insert(m);
            }
        }
    }
    out
}

/// The import loops of a crate: groups of files each reachable from the others.
fn import_loops(src: &Path) -> Vec<Vec<String>> {
    let mut texts = BTreeMap::new();
    for f in rust_files(src) {
        let text = fs::read_to_string(&f).expect("read");
        texts.insert(module_of(src, &f), production_lines(&f, &text));
    }
    let modules: BTreeSet<String> = texts.keys().cloned().collect();
    let graph: BTreeMap<String, BTreeSet<String>> = texts
        .iter()
        .map(|(m, lines)| (m.clone(), crate_deps(m, lines, &modules)))
        .collect();
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(m) = stack.pop() {
            for d in graph.get(&m).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    stack.push(d.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut loops: Vec<Vec<String>> = Vec::new();
    for m in graph.keys() {
        if !reachable[m].contains(m) || loops.iter().any(|l| l.contains(m)) {
            continue;
        }
        let group: Vec<String> = graph
            .keys()
            .filter(|o| reachable[m].contains(*o) && reachable[*o].contains(m))
            .cloned()
            .collect();
        loops.push(group);
    }
    loops
}

#[test]
fn no_import_loop_between_the_files_of_a_crate() {
    for src in source_dirs() {
        let loops = import_loops(&src);
        assert!(
            loops.is_empty(),
            "{}: import loops {loops:?}",
            src.display()
        );
    }
}

#[test]
fn the_loop_check_finds_a_loop() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path();
    fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\n").expect("lib");
    fs::write(src.join("a.rs"), "use crate::b::Thing;\n").expect("a");
    fs::write(
        src.join("b.rs"),
        "pub struct Thing;\nfn f() { crate::a::g(); }\n",
    )
    .expect("b");
    assert_eq!(
        import_loops(src),
        vec![vec!["a".to_string(), "b".to_string()]]
    );
    fs::write(
        src.join("b.rs"),
        "pub struct Thing;\n// crate::a::g() in a comment\n",
    )
    .expect("b");
    assert!(import_loops(src).is_empty(), "a comment names no module");
}

#[test]
fn every_unsafe_block_of_ccfs_and_loadgen_is_in_their_sys_modules() {
    let ws = workspace();
    let mut outside = Vec::new();
    for krate in ["ccfs/src", "loadgen/src"] {
        let src = ws.join(krate);
        for f in rust_files(&src) {
            let module = module_of(&src, &f);
            if module == "sys" || module.starts_with("sys::") {
                continue;
            }
            let text = fs::read_to_string(&f).expect("read");
            for (i, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if code.contains("unsafe {") || code.contains("unsafe fn") {
                    outside.push(format!("{}:{}", f.display(), i + 1));
                }
            }
        }
    }
    assert!(outside.is_empty(), "unsafe outside sys: {outside:#?}");
}
