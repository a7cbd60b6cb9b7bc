//! `ccfs status` as a person reads it: times as dates with how long ago, and with
//! `--verbose` the cache's size, the unsynced paths and the pending deletions.

use std::fs;

use e2e::*;

fn status(fx: &Fixture, verbose: bool) -> String {
    let mut args: Vec<&std::ffi::OsStr> = vec!["status".as_ref()];
    if verbose {
        args.push("--verbose".as_ref());
    }
    args.push(fx.mnt.as_os_str());
    let out = ccfs(&args);
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn verbose_status_lists_what_waits_for_the_share_and_times_read_as_dates() {
    let fx = Fixture::new();
    fs::write(fx.s(".old"), "on the share").expect("share file");
    let m = fx.mount();
    fs::create_dir_all(fx.m(".config/app")).expect("mkdir");
    fs::write(fx.m(".config/app/settings"), "x".repeat(10_000)).expect("write");
    fs::write(fx.m(".bashrc"), "alias l=ls\n").expect("write");
    fs::remove_file(fx.m(".old")).expect("rm");
    let plain = status(&fx, false);
    assert!(!plain.contains("unsynced:"), "only with --verbose: {plain}");
    let v = status(&fx, true);
    let at = |s: &str| v.find(s).unwrap_or_else(|| panic!("{s:?} in {v}"));
    assert!(at("  unsynced:") < at("    .bashrc"));
    assert!(
        at("    .bashrc") < at("    .config/app/settings"),
        "in order: {v}"
    );
    assert!(at("  to delete on the share:") < at("    .old"));
    // The cache holds at least the 10,000 bytes written.
    let line = v
        .lines()
        .find(|l| l.starts_with("  cache: "))
        .expect("cache line");
    assert!(!line.contains("  cache: 0 B"), "{line}");
    assert!(v.contains("last sync: none yet"), "{v}");
    let out = ccfs(&["sync".as_ref(), fx.mnt.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out));
    let v = status(&fx, true);
    let line = v
        .lines()
        .find(|l| l.contains("last sync: ok at "))
        .unwrap_or_else(|| panic!("{v}"));
    // `2026-11-29 09:30:12 UTC (3 s ago)`: a date, a time, how long ago.
    let when = &line[line.find(" at ").expect("at") + 4..];
    let b = when.as_bytes();
    assert!(
        b.len() > 23
            && b[4] == b'-'
            && b[7] == b'-'
            && b[13] == b':'
            && when[19..].starts_with(" UTC (")
            && when.contains(" ago)"),
        "{line}"
    );
    assert!(
        !v.contains("  unsynced:"),
        "nothing left after the sync: {v}"
    );
    drop(m);
}
