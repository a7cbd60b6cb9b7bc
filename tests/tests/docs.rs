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
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("doc"))
        .expect("doc/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.push(root.join("README.md"));
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
