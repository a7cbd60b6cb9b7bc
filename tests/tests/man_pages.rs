//! The man pages the package installs (`ccfs generate-docs`, `loadgen generate-docs`):
//! the sections a sysadmin looks for (EXAMPLES, FILES with the configuration's format,
//! ENVIRONMENT, EXIT STATUS), and no reference to a page that is not made.

use std::path::Path;
use std::process::Command;

fn generate(bin: &Path, dir: &Path) {
    let o = Command::new(bin)
        .arg("generate-docs")
        .arg(dir)
        .output()
        .expect("generate-docs");
    assert!(o.status.success(), "{}", e2e::text(&o));
}

fn page(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join("man").join(format!("{name}.1")))
        .unwrap_or_else(|e| panic!("{name}.1: {e}"))
}

/// Every `NAME(1)` a page names, as its page's file name.
fn references(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("(1)") {
        let name: String = text[..i]
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '\\')
            .collect();
        out.push(name.chars().rev().collect::<String>().replace("\\-", "-"));
    }
    out
}

#[test]
fn the_pages_have_their_sections_and_refer_only_to_pages_that_exist() {
    let dir = tempfile::tempdir().expect("dir");
    let ccfs = e2e::ccfs_bin();
    generate(&ccfs, dir.path());
    generate(&ccfs.with_file_name("loadgen"), dir.path());
    let top = page(dir.path(), "ccfs");
    for section in ["EXAMPLES", "FILES", "ENVIRONMENT", "EXIT STATUS"] {
        assert!(
            top.contains(&format!(".SH \"{section}\"")),
            "ccfs.1: {section}"
        );
    }
    for word in ["CCFS_LOG", "CCFS_CACHE_ROOT", "/etc/ccfs/ccfs.toml"] {
        assert!(top.contains(word), "ccfs.1: {word}");
    }
    // The configuration's whole format, each line of the shipped file as it is.
    let shipped = include_str!("../../deploy/etc/ccfs.toml");
    for line in shipped
        .lines()
        .filter(|l| l.starts_with('[') || l.starts_with("#by_block"))
    {
        assert!(
            top.contains(&format!("\n{line}\n")),
            "ccfs.1 shows {line:?} on a line of its own"
        );
    }
    assert!(page(dir.path(), "ccfs-config-check").contains(".SH \"FILES\""));
    assert!(page(dir.path(), "ccfs-umount").contains(".SH \"EXIT STATUS\""));
    let loadgen = page(dir.path(), "loadgen");
    assert!(loadgen.contains(".SH \"EXAMPLES\"") && loadgen.contains("\n130\n"));
    for e in std::fs::read_dir(dir.path().join("man"))
        .expect("ls")
        .flatten()
    {
        let text = std::fs::read_to_string(e.path()).expect("page");
        for name in references(&text) {
            assert!(
                dir.path().join("man").join(format!("{name}.1")).is_file(),
                "{} refers to {name}(1), which is not made",
                e.path().display()
            );
        }
    }
}

/// A configuration error says where the format is described.
#[test]
fn a_config_error_points_to_the_format() {
    let dir = tempfile::tempdir().expect("dir");
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "[paths]\nno_such_key = 1\n").expect("write");
    let o = Command::new(e2e::ccfs_bin())
        .args(["config", "check", "--config"])
        .arg(&cfg)
        .output()
        .expect("ccfs");
    assert_eq!(o.status.code(), Some(2), "{}", e2e::text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no_such_key") && err.contains("ccfs(1) (FILES)"),
        "{err}"
    );
}
