//! Bad input is refused alike everywhere: one line naming the problem (clap's mistakes
//! too), exit code 2, nothing made and no table printed. Negative numbers reach the
//! options' own checks; every size takes K and M; an option that does nothing in its
//! combination is refused; a host loadgen cannot run on is named before anything runs.

mod common;

use std::process::Command;

use common::{loadgen, text};

/// Exit code 2, one line on stderr containing `want`, nothing on stdout.
fn refused(args: &[&str], want: &str) {
    let o = loadgen(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
    assert!(err.contains(want), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
    assert!(err.starts_with("loadgen: error: "), "{args:?}: {err}");
    assert!(o.stdout.is_empty(), "{args:?}: {}", text(&o));
}

#[test]
fn mistakes_are_one_line_and_exit_2_everywhere() {
    let dir = tempfile::tempdir().expect("dir");
    let d = dir.path().to_str().expect("utf8");
    refused(
        &["compilebench", d, "--bogus"],
        "unexpected argument '--bogus'",
    );
    refused(
        &["compilebench", d, "--scale", "-1"],
        "--scale must be a fraction",
    );
    refused(
        &["login-storm", "--share", d, "--users", "-3"],
        "'-3' for '--users",
    );
    refused(&["compilebench", d, "--write-size", "256X"], "not a size");
    refused(&["compilebench", d, "--clients-per-host", "2"], "--hosts");
    refused(
        &["compilebench", d, "--scale", "0.0000001"],
        "use at least 0.0000",
    );
    refused(
        &[
            "login-storm",
            "--share",
            d,
            "--with-ccfs",
            "--baseline",
            "share-cache",
        ],
        "--baseline",
    );
    refused(
        &["login-storm", "--share", d, "--cpu-window", "10"],
        "--server-pids",
    );
    refused(
        &["compilebench", d, "--hosts", "h1,-oProxyCommand=x"],
        "is not a host name",
    );
    refused(
        &["login-storm", "--share", d, "--hosts", "a/b"],
        "is not a host name",
    );
    assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0);
}

#[test]
fn sizes_take_their_suffixes() {
    let dir = tempfile::tempdir().expect("dir");
    let out = tempfile::tempdir().expect("out");
    let json = out.path().join("r.json");
    let o = loadgen(&[
        "compilebench",
        dir.path().to_str().expect("utf8"),
        "--scale",
        "0.01",
        "--phases",
        "create",
        "--write-size",
        "64K",
        "--json",
        json.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v = common::read_json(&json);
    assert_eq!(v["config"]["write_size"], 64 * 1024, "{}", v["config"]);
}

#[test]
fn a_read_only_directory_is_the_caller_s_to_fix() {
    let scratch = tempfile::tempdir().expect("scratch");
    let ro = e2e::Tmpfs::mount(&scratch.path().join("ro"), "1m", "ro");
    let o = loadgen(&[
        "compilebench",
        ro.at.to_str().expect("utf8"),
        "--scale",
        "0.01",
    ]);
    drop(ro);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Read-only file system"),
        "{}",
        text(&o)
    );
}

/// A host loadgen cannot run on (the launcher refuses it, as ssh does an unknown host)
/// is named before anything runs: no table, nothing made on the others.
#[test]
fn an_unreachable_host_is_named_before_anything_runs() {
    let dir = tempfile::tempdir().expect("dir");
    let scratch = tempfile::tempdir().expect("scratch");
    let launcher = scratch.path().join("ssh");
    std::fs::write(
        &launcher,
        "#!/bin/sh\nhost=$1\nshift\nif [ \"$host\" = nowhere ]; then\n  \
         echo \"ssh: Could not resolve hostname nowhere\" >&2\n  exit 255\nfi\nexec sh -c \"$*\"\n",
    )
    .expect("launcher");
    Command::new("chmod")
        .arg("+x")
        .arg(&launcher)
        .status()
        .expect("chmod");
    refused(
        &[
            "compilebench",
            dir.path().to_str().expect("utf8"),
            "--scale",
            "0.01",
            "--hosts",
            "here,nowhere",
            "--ssh-command",
            launcher.to_str().expect("utf8"),
        ],
        "nowhere: ssh: Could not resolve hostname nowhere (exit 255)",
    );
    assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0);
}
