//! The POSIX test suite pjdfstest on a ccfs mount (a passthrough and a cached directory)
//! and on the bare share directory: every case that fails on ccfs must also fail bare.
//! Needs `pjdfstest` on PATH (scripts/setup installs it) and the users named in
//! tests/pjdfstest.toml (scripts/setup creates them).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use e2e::*;

struct Run {
    summary: String,
    failed: BTreeSet<String>,
    passed: usize,
}

fn pjdfstest(dir: &Path) -> Run {
    let bin = ccfs::sync::find_program("pjdfstest")
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| Path::new(&h).join(".cargo/bin/pjdfstest"))
                .filter(|p| p.is_file())
        })
        .expect("pjdfstest is not installed: run scripts/setup (cargo install pjdfstest)");
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("pjdfstest.toml");
    let out = Command::new(bin)
        .arg("-c")
        .arg(&config)
        .arg("-p")
        .arg(dir)
        .output()
        .expect("run pjdfstest");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("Summary:"))
        .unwrap_or_else(|| panic!("pjdfstest printed no summary: {}", text(&out)))
        .to_string();
    let mut failed = BTreeSet::new();
    let mut passed = 0;
    for line in stdout.lines() {
        let mut parts = line.split_whitespace();
        if let (Some(name), Some(result), None) = (parts.next(), parts.next(), parts.next()) {
            match result {
                "FAILED" => {
                    failed.insert(name.to_string());
                }
                "ok" => passed += 1,
                _ => {}
            }
        }
    }
    Run {
        summary,
        failed,
        passed,
    }
}

fn prepare(dir: &Path) {
    std::fs::create_dir_all(dir).expect("mkdir");
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
}

#[test]
fn pjdfstest_fails_nothing_on_ccfs_that_passes_on_the_bare_share() {
    let fx = Fixture::new();
    std::fs::set_permissions(
        fx.tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    prepare(&fx.share);
    prepare(&fx.s("bare"));
    let bare = pjdfstest(&fx.s("bare"));
    println!("bare share:        {}", bare.summary);
    let m = fx.mount();
    prepare(&fx.m("Documents"));
    prepare(&fx.m(".config"));
    let pass = pjdfstest(&fx.m("Documents"));
    println!("ccfs passthrough:  {}", pass.summary);
    let cached = pjdfstest(&fx.m(".config"));
    println!("ccfs cached:       {}", cached.summary);
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        bare.passed > 300,
        "the suite must really run: {}",
        bare.summary
    );
    for (what, run) in [("passthrough", &pass), ("cached", &cached)] {
        let worse: Vec<&String> = run.failed.difference(&bare.failed).collect();
        assert!(
            worse.is_empty(),
            "{what}: fail on ccfs but pass bare: {worse:?}"
        );
        assert!(
            run.passed + 5 >= bare.passed,
            "{what}: far fewer cases ran on ccfs ({}) than bare ({})",
            run.summary,
            bare.summary
        );
    }
}
