//! Root starts ccfs for a user (as a PAM hook does): the daemon works as that user, the
//! cache is theirs and private, and another local user cannot read their cached dotfiles.
//! Needs the users ccfs-alice and ccfs-bob (scripts/setup creates them).

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Output};

use common::*;

fn account(name: &str) -> ccfs::sys::Account {
    ccfs::sys::user_by_name(name)
        .expect("passwd")
        .unwrap_or_else(|| panic!("user {name} missing: run scripts/setup"))
}

fn as_user(name: &str, script: &str) -> Output {
    Command::new("setpriv")
        .args([
            "--reuid",
            name,
            "--regid",
            name,
            "--init-groups",
            "sh",
            "-c",
            script,
        ])
        .output()
        .expect("setpriv")
}

fn ids_of(pid: u32) -> Vec<String> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let uid_line = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .expect("Uid line");
    uid_line
        .split_whitespace()
        .skip(1)
        .map(str::to_string)
        .collect()
}

#[test]
fn a_mount_for_a_user_runs_as_that_user_and_keeps_other_users_out() {
    let alice = account("ccfs-alice");
    let bob = account("ccfs-bob");
    let fx = Fixture::new();
    fs::set_permissions(fx.tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod tmp");
    write(&fx.s(".public"), "public\n");
    write(&fx.s(".secret"), "secret\n");
    fs::set_permissions(fx.s(".public"), fs::Permissions::from_mode(0o644)).expect("chmod");
    fs::set_permissions(fx.s(".secret"), fs::Permissions::from_mode(0o600)).expect("chmod");
    for p in [fx.share.clone(), fx.s(".public"), fx.s(".secret")] {
        std::os::unix::fs::chown(&p, Some(alice.uid), Some(alice.gid)).expect("chown");
    }
    fs::set_permissions(&fx.share, fs::Permissions::from_mode(0o755)).expect("chmod share");

    let m = fx.mount_with(&["--user", "ccfs-alice"]);
    let pid = m.daemon_pid();
    let ids = ids_of(pid);
    assert_eq!(ids[0], alice.uid.to_string(), "real uid: {ids:?}");
    assert_eq!(ids[1], alice.uid.to_string(), "effective uid: {ids:?}");
    for task in fs::read_dir(format!("/proc/{pid}/task")).expect("tasks") {
        let tid: u32 = task
            .expect("t")
            .file_name()
            .to_string_lossy()
            .parse()
            .expect("tid");
        let status = fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).expect("status");
        let euid = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .expect("Uid")
            .split_whitespace()
            .nth(2)
            .map(str::to_string);
        assert_eq!(
            euid,
            Some(alice.uid.to_string()),
            "thread {tid} works as alice"
        );
    }
    let cache_meta = fs::metadata(&fx.cache).expect("cache");
    assert_eq!(cache_meta.uid(), alice.uid);
    assert_eq!(cache_meta.mode() & 0o777, 0o700);

    let mnt = fx.mnt.display().to_string();
    let out = as_user(
        "ccfs-alice",
        &format!("echo changed > {mnt}/.secret && cat {mnt}/.secret && echo mine > {mnt}/.newrc"),
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "changed\n");

    let out = as_user("ccfs-bob", &format!("cat {mnt}/.secret"));
    assert!(
        !out.status.success(),
        "bob must not read alice's dotfile: {}",
        text(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{}",
        text(&out)
    );
    let out = as_user(
        "ccfs-bob",
        &format!("cat {}/upper/.secret", fx.cache.display()),
    );
    assert!(
        !out.status.success(),
        "bob must not read the cache either: {}",
        text(&out)
    );
    let out = as_user("ccfs-bob", &format!("cat {mnt}/.public"));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "public\n");
    let _ = bob;

    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".secret")), "changed\n");
    assert_eq!(
        fs::metadata(fx.s(".newrc")).expect("newrc").uid(),
        alice.uid,
        "files are the user's on the share"
    );
    assert_eq!(
        fs::metadata(fx.s(".secret")).expect("secret").mode() & 0o777,
        0o600
    );
}

#[test]
fn recover_as_root_runs_as_the_cache_owner() {
    let alice = account("ccfs-alice");
    let fx = Fixture::new();
    fs::set_permissions(fx.tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod tmp");
    std::os::unix::fs::chown(&fx.share, Some(alice.uid), Some(alice.gid)).expect("chown");
    let m = fx.mount_with(&["--user", "ccfs-alice"]);
    let out = as_user(
        "ccfs-alice",
        &format!("echo unsynced > {}/.vimrc", fx.mnt.display()),
    );
    assert!(out.status.success(), "{}", text(&out));
    m.crash();
    let out = ccfs(&[
        "recover".as_ref(),
        "--cache-dir".as_ref(),
        fx.cache.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".vimrc")), "unsynced\n");
    assert_eq!(
        fs::metadata(fx.s(".vimrc")).expect("vimrc").uid(),
        alice.uid
    );
}

#[test]
fn mount_for_a_user_needs_an_existing_user() {
    let fx = Fixture::new();
    let out = ccfs(&[
        "mount".as_ref(),
        "--user".as_ref(),
        "no-such-user-ccfs".as_ref(),
        fx.share.as_os_str(),
        fx.mnt.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no such user"),
        "{}",
        text(&out)
    );
    assert!(!is_mounted(&fx.mnt));
}
