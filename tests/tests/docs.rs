//! The documents name the tests that back what they say (`file.rs::test_name`, and now and
//! then a function or type the same way): each one named exists in a file of that name (a name ending in `_` names the tests a macro makes
//! with that prefix). A test renamed or moved without its document fails here.

use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively (no `target`).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.file_name().is_some_and(|n| n == "target" || n == ".git") {
            continue;
        }
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The `file.rs::name` references in `text`.
/// The documents: doc/*.md and the README.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("doc"))
        .expect("doc/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.push(root.join("README.md"));
    docs
}

fn references(text: &str) -> Vec<(String, String)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while let Some(at) = text[i..].find(".rs::") {
        let dot = i + at;
        let mut start = dot;
        while start > 0 && ident(bytes[start - 1]) {
            start -= 1;
        }
        let mut end = dot + 5;
        while end < bytes.len() && ident(bytes[end]) {
            end += 1;
        }
        if start < dot && end > dot + 5 {
            out.push((
                format!("{}.rs", &text[start..dot]),
                text[dot + 5..end].to_string(),
            ));
        }
        i = dot + 5;
    }
    out
}

#[test]
fn every_test_the_documents_name_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for d in ["ccfs", "loadgen", "tests", "crates", "benches"] {
        sources(&root.join(d), &mut files);
    }
    let docs = documents(&root);
    let mut missing = Vec::new();
    for doc in &docs {
        let text = fs::read_to_string(doc).expect("doc");
        for (file, name) in references(&text) {
            let found = files
                .iter()
                .filter(|f| f.file_name().is_some_and(|n| n.to_string_lossy() == file))
                .any(|f| {
                    let src = fs::read_to_string(f).unwrap_or_default();
                    if name.ends_with('_') {
                        src.contains(&name)
                    } else if name.starts_with(|c: char| c.is_ascii_uppercase()) {
                        ["struct", "enum", "trait", "type"]
                            .iter()
                            .any(|k| src.contains(&format!("{k} {name}")))
                    } else {
                        src.contains(&format!("fn {name}(")) || src.contains(&format!("fn {name}<"))
                    }
                });
            if !found {
                missing.push(format!(
                    "{}: {file}::{name}",
                    doc.file_name().expect("name").to_string_lossy()
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "tests named in the documents that do not exist: {missing:#?}"
    );
}

/// The unit tests the documents name by module path (`` `overlay::session::settle::tests::x` ``,
/// `` `overlay::interleave_tests::x` ``, `` `config::tests::*` ``): each path is a module
/// of ccfs or loadgen, and the test is in it. A module moved or split leaves no stale name.
fn module_references(text: &str) -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    for token in text.split('`').skip(1).step_by(2) {
        let parts: Vec<&str> = token.split("::").collect();
        let Some(at) = parts
            .iter()
            .position(|p| *p == "tests" || p.ends_with("_tests"))
        else {
            continue;
        };
        let name = parts[parts.len() - 1];
        let plain = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        if at + 2 != parts.len()
            || !parts[..=at].iter().all(|p| plain(p))
            || !(plain(name) || name == "*")
        {
            continue;
        }
        let mut module: Vec<String> = parts[..at].iter().map(|s| s.to_string()).collect();
        if parts[at] != "tests" {
            module.push(parts[at].to_string());
        }
        out.push((module, name.to_string()));
    }
    out
}

/// The file of module `path` in one of the crates' `src/`, if there is one.
fn module_file(root: &Path, path: &[String]) -> Option<PathBuf> {
    ["ccfs/src", "loadgen/src"].iter().find_map(|src| {
        let base = path.iter().fold(root.join(src), |p, c| p.join(c));
        [base.with_extension("rs"), base.join("mod.rs")]
            .into_iter()
            .find(|f| f.is_file())
    })
}

#[test]
fn every_unit_test_the_documents_name_by_module_is_in_that_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let docs = documents(&root);
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = fs::read_to_string(doc).expect("doc");
        for (module, name) in module_references(&text) {
            checked += 1;
            let src = module_file(&root, &module).and_then(|f| fs::read_to_string(f).ok());
            let found = src.is_some_and(|src| {
                if name == "*" {
                    src.contains("mod tests")
                        || module.last().is_some_and(|m| m.ends_with("_tests"))
                } else {
                    src.contains(&format!("fn {name}("))
                }
            });
            if !found {
                missing.push(format!(
                    "{}: {}::{name}",
                    doc.file_name().expect("name").to_string_lossy(),
                    module.join("::")
                ));
            }
        }
    }
    assert!(checked > 0, "the documents name unit tests by module");
    assert!(
        missing.is_empty(),
        "unit tests named in the documents that are not in that module: {missing:#?}"
    );
}

#[test]
fn module_references_are_read_from_backquoted_paths() {
    let refs = module_references(
        "a `overlay::session::settle::tests::x_y`, `overlay::interleave_tests::z`, \
         `config::tests::*`, `mount.rs::a`, `Overlay::lock`",
    );
    let want = |m: &[&str], n: &str| (m.iter().map(|s| s.to_string()).collect(), n.to_string());
    assert_eq!(
        refs,
        vec![
            want(&["overlay", "session", "settle"], "x_y"),
            want(&["overlay", "interleave_tests"], "z"),
            want(&["config"], "*"),
        ]
    );
}
