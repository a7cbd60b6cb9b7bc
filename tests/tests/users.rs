//! Root starts ccfs for a user (as a PAM hook does): the daemon works as that user, the
//! cache is theirs and private, and another local user cannot read their cached dotfiles.
//! Needs the users ccfs-alice and ccfs-bob (scripts/setup creates them).

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use e2e::*;

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
    assert_eq!(
        ids[2],
        alice.uid.to_string(),
        "saved uid (root is gone for good): {ids:?}"
    );
    for task in fs::read_dir(format!("/proc/{pid}/task")).expect("tasks") {
        let tid: u32 = task
            .expect("t")
            .file_name()
            .to_string_lossy()
            .parse()
            .expect("tid");
        let status = fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).expect("status");
        let uids: Vec<String> = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .expect("Uid")
            .split_whitespace()
            .skip(1)
            .map(str::to_string)
            .collect();
        assert_eq!(
            uids,
            vec![alice.uid.to_string(); 4],
            "thread {tid} works as alice, and only as alice"
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
    // Only alice gets into her mount (no allow_other unless the admin asks for it): bob is
    // refused by the kernel even where the file's mode would let him read.
    let out = as_user("ccfs-bob", &format!("cat {mnt}/.public"));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{}",
        text(&out)
    );
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

/// The daemon is alice's: she may stop it (SIGSTOP). That holds up her own programs only:
/// root's `stat -f` of her mount (as `df` does) is answered by the kernel, root's and bob's
/// `ls` are refused by it, at once, instead of waiting on her daemon.
#[test]
fn a_daemon_its_user_stops_holds_up_nobody_else() {
    let alice = account("ccfs-alice");
    let fx = Fixture::new();
    fs::set_permissions(fx.tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod tmp");
    std::os::unix::fs::chown(&fx.share, Some(alice.uid), Some(alice.gid)).expect("chown");
    let m = fx.mount_with(&["--user", "ccfs-alice"]);
    let pid = m.daemon_pid();
    let out = as_user("ccfs-alice", &format!("kill -STOP {pid}"));
    assert!(
        out.status.success(),
        "alice may stop her daemon: {}",
        text(&out)
    );
    struct Resume(u32);
    impl Drop for Resume {
        fn drop(&mut self) {
            kill(self.0, libc::SIGCONT);
        }
    }
    let _resume = Resume(pid);
    let mnt = fx.mnt.display().to_string();
    let refused_at_once = |what: &str, out: Option<Output>| {
        let out = out.unwrap_or_else(|| panic!("{what} waited on the stopped daemon"));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
            "{what}: {}",
            text(&out)
        );
    };
    // statfs of a mount one may not enter is answered by the kernel itself (all zeros).
    let out = run_bounded(Command::new("stat").args(["-f", &mnt]))
        .expect("root's stat -f waited on the stopped daemon");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Block size: 0"),
        "root's stat -f: {}",
        text(&out)
    );
    refused_at_once("root's ls", run_bounded(Command::new("ls").arg(&mnt)));
    refused_at_once(
        "bob's ls",
        run_bounded(Command::new("setpriv").args([
            "--reuid",
            "ccfs-bob",
            "--regid",
            "ccfs-bob",
            "--init-groups",
            "ls",
            &mnt,
        ])),
    );
    drop(_resume);
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
}

/// With `[mount] allow_other = true` in root's config, other local users get the usual
/// permission checks: bob reads alice's world-readable dotfile, not her private one.
#[test]
fn allow_other_lets_other_users_in_with_the_usual_checks() {
    let alice = account("ccfs-alice");
    let fx = Fixture::new();
    fs::set_permissions(fx.tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod tmp");
    write(&fx.s(".public"), "public\n");
    write(&fx.s(".secret"), "secret\n");
    fs::set_permissions(fx.s(".public"), fs::Permissions::from_mode(0o644)).expect("chmod");
    fs::set_permissions(fx.s(".secret"), fs::Permissions::from_mode(0o600)).expect("chmod");
    for p in [fx.share.clone(), fx.s(".public"), fx.s(".secret")] {
        std::os::unix::fs::chown(&p, Some(alice.uid), Some(alice.gid)).expect("chown");
    }
    let config = fx.tmp.path().join("ccfs.toml");
    write(&config, "[mount]\nallow_other = true\n");
    let config = config.display().to_string();
    let m = fx.mount_with(&["--user", "ccfs-alice", "--config", &config]);
    let mnt = fx.mnt.display().to_string();
    let out = as_user("ccfs-bob", &format!("cat {mnt}/.public"));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "public\n");
    let out = as_user("ccfs-bob", &format!("cat {mnt}/.secret"));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{}",
        text(&out)
    );
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
}

/// A user may stop her own daemon; over FUSE over io_uring its ring entries would still be
/// handed requests, which then wait unkillably, root's unmount among them. A mount for a
/// user keeps to /dev/fuse, and says why.
#[test]
fn a_mount_for_a_user_keeps_to_dev_fuse() {
    let alice = account("ccfs-alice");
    let fx = Fixture::new();
    fs::set_permissions(fx.tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod tmp");
    std::os::unix::fs::chown(&fx.share, Some(alice.uid), Some(alice.gid)).expect("chown");
    let config = fx.tmp.path().join("ccfs.toml");
    write(&config, "[mount]\ntransport = \"io-uring\"\n");
    let config = config.display().to_string();
    let m = fx.mount_with(&["--user", "ccfs-alice", "--config", &config]);
    let t = m.status()["transport"].clone();
    assert_eq!(t["serving"], "dev-fuse", "{t}");
    assert!(
        t["refused"]
            .as_str()
            .unwrap_or_default()
            .contains("a mount for a user"),
        "{t}"
    );
    let out = as_user("ccfs-alice", &format!("ls -a {}", fx.mnt.display()));
    assert!(out.status.success(), "she still gets in: {}", text(&out));
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
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

/// The daemon of a mount root made for a user holds no root to unmount with: the mount is
/// the user's (the kernel's user_id), so SIGTERM unmounts it (fusermount3, as the user)
/// and the final sync runs.
#[test]
fn sigterm_to_a_users_daemon_unmounts_and_syncs() {
    let alice = account("ccfs-alice");
    let fx = Fixture::new();
    fs::set_permissions(fx.tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod tmp");
    std::os::unix::fs::chown(&fx.share, Some(alice.uid), Some(alice.gid)).expect("chown");
    let m = fx.mount_with(&["--user", "ccfs-alice"]);
    let pid = m.daemon_pid();
    let out = as_user(
        "ccfs-alice",
        &format!("echo on-term > {}/.termrc", fx.mnt.display()),
    );
    assert!(out.status.success(), "{}", text(&out));
    kill(pid, libc::SIGTERM);
    wait_until("daemon exit", Duration::from_secs(30), || !alive(pid));
    assert!(!is_mounted(&fx.mnt), "the daemon unmounts on SIGTERM");
    m.abandon();
    assert_eq!(read(&fx.s(".termrc")), "on-term\n");
}

/// A user's own mount (no root: /dev/fuse opened to her for the test) on a share that
/// writes behind, its server's disk full: SIGTERM to her daemon (what `kill` and a
/// session's end send) while a document whose save the server failed is still open
/// unmounts lazily, through the daemon's launcher, and her program's close still tells
/// of the failed save (an unmount the daemon started itself would hold a copy of the
/// document, whose close is a flush that takes the error).
#[test]
fn a_signal_to_a_users_own_daemon_leaves_a_failed_saves_error_to_its_close() {
    struct DevFuseFor(String);
    impl Drop for DevFuseFor {
        fn drop(&mut self) {
            let _ = Command::new("setfacl")
                .args(["-x", &format!("u:{}", self.0), "/dev/fuse"])
                .status();
        }
    }
    let alice = account("ccfs-alice");
    let fx = Fixture::new();
    fs::set_permissions(fx.tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod tmp");
    let share = SftpShare::mount_for(&fx, "2m", &alice);
    let own = fx.tmp.path().join("alice");
    fs::create_dir(&own).expect("mkdir");
    for d in [&own, &fx.mnt] {
        std::os::unix::fs::chown(d, Some(alice.uid), Some(alice.gid)).expect("chown");
    }
    let st = Command::new("setfacl")
        .args(["-m", "u:ccfs-alice:rw", "/dev/fuse"])
        .status()
        .expect("setfacl");
    assert!(st.success(), "setfacl on /dev/fuse");
    let _fuse = DevFuseFor("ccfs-alice".into());
    let cache = own.join("cache");
    let out = as_user(
        "ccfs-alice",
        &format!(
            "HOME={} {} mount --cache-dir {} {} {}",
            own.display(),
            ccfs_bin().display(),
            cache.display(),
            fx.share.display(),
            fx.mnt.display()
        ),
    );
    assert!(out.status.success(), "her own mount: {}", text(&out));
    let pid = ccfs(&["status".as_ref(), "--json".as_ref(), fx.mnt.as_os_str()]);
    let pid = serde_json::from_slice::<serde_json::Value>(&pid.stdout).expect("status")["pid"]
        .as_u64()
        .expect("pid") as u32;
    let docs = share.server().join("Documents");
    fs::create_dir(&docs).expect("mkdir");
    std::os::unix::fs::chown(&docs, Some(alice.uid), Some(alice.gid)).expect("chown");
    share.fill_leaving(100 << 10);
    let (save, wrote) = HeldSave::start(
        Some("ccfs-alice"),
        &fx.m("Documents/report.odt"),
        300 << 10,
        None,
    );
    assert_eq!(wrote, format!("written {}", 300 << 10));
    kill(pid, libc::SIGTERM);
    wait_until("the lazy unmount", Duration::from_secs(10), || {
        !is_mounted(&fx.mnt)
    });
    // (The unmount's own work done: the daemon may have started a program meanwhile.)
    std::thread::sleep(Duration::from_secs(1));
    let closed = save.close();
    wait_until("daemon exit", Duration::from_secs(30), || !alive(pid));
    assert!(
        told_the_save_failed(&closed),
        "a save the server could not take must not be answered as done at its close: {closed}"
    );
    share.empty();
}

/// The user may log out of the mount root made for them, with `ccfs umount`.
#[test]
fn the_user_may_unmount_the_mount_root_made_for_them() {
    let alice = account("ccfs-alice");
    let fx = Fixture::new();
    fs::set_permissions(fx.tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod tmp");
    std::os::unix::fs::chown(&fx.share, Some(alice.uid), Some(alice.gid)).expect("chown");
    let m = fx.mount_with(&["--user", "ccfs-alice"]);
    let out = as_user(
        "ccfs-alice",
        &format!(
            "echo mine > {mnt}/.myrc && {ccfs} umount {mnt}",
            mnt = fx.mnt.display(),
            ccfs = ccfs_bin().display()
        ),
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(!is_mounted(&fx.mnt));
    m.abandon();
    assert_eq!(read(&fx.s(".myrc")), "mine\n");
}

/// The mode of `path` as the user sees it through the mount.
fn mode_seen_by(user: &str, path: &Path) -> String {
    let out = as_user(user, &format!("stat -c %a '{}'", path.display()));
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A share for ccfs-alice: `dirs` and `files` (path, mode) made below it and hers, the
/// files holding "old\n"; modes set deepest first, so read-only directories can be filled.
fn alices_share(fx: &Fixture, dirs: &[(&str, u32)], files: &[(&str, u32)]) {
    let alice = account("ccfs-alice");
    fs::set_permissions(fx.tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod tmp");
    std::os::unix::fs::chown(&fx.share, Some(alice.uid), Some(alice.gid)).expect("chown");
    for (d, _) in dirs {
        fs::create_dir(fx.s(d)).expect("mkdir");
    }
    for (f, mode) in files {
        write(&fx.s(f), "old\n");
        fs::set_permissions(fx.s(f), fs::Permissions::from_mode(*mode)).expect("chmod");
    }
    for (p, _) in dirs.iter().chain(files) {
        std::os::unix::fs::chown(fx.s(p), Some(alice.uid), Some(alice.gid)).expect("chown");
    }
    for (d, mode) in dirs.iter().rev() {
        fs::set_permissions(fx.s(d), fs::Permissions::from_mode(*mode)).expect("chmod");
    }
}

/// `chmod 555 ~/.ssh` (as some lock their keys) leaves the user's own 0644 `known_hosts`
/// writable, as on the bare share: the copy-up into the read-only directory's cache copy
/// works for the daemon, which is the user without privileges; the directory keeps its
/// mode, in the mount and on the share.
#[test]
fn a_writable_file_in_a_read_only_dot_directory_stays_writable() {
    let fx = Fixture::new();
    alices_share(&fx, &[(".ssh", 0o555)], &[(".ssh/known_hosts", 0o644)]);
    let m = fx.mount_with(&["--user", "ccfs-alice"]);
    let file = fx.m(".ssh/known_hosts");
    let out = as_user(
        "ccfs-alice",
        &format!("echo 'new host' >> '{}'", file.display()),
    );
    assert!(
        out.status.success(),
        "the user's append to their own 0644 file failed: {}",
        text(&out)
    );
    let out = as_user("ccfs-alice", &format!("cat '{}'", file.display()));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "old\nnew host\n",
        "{}",
        text(&out)
    );
    assert_eq!(mode_seen_by("ccfs-alice", &fx.m(".ssh")), "555");
    let out = as_user(
        "ccfs-alice",
        &format!("echo x > '{}/.ssh/new'", fx.mnt.display()),
    );
    assert!(
        !out.status.success(),
        "a new file in the read-only directory is refused, as on the share: {}",
        text(&out)
    );
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".ssh/known_hosts")), "old\nnew host\n");
    assert_eq!(
        fs::metadata(fx.s(".ssh")).expect("ssh").mode() & 0o7777,
        0o555
    );
    assert!(!fx.s(".ssh/new").exists());
    assert_eq!(
        not_clean_copies(&fx.cache, &fx.share, ".ssh"),
        Vec::<String>::new(),
        "the logout leaves only clean copies in the cache, in read-only directories too"
    );
}

/// Two workstations add to `known_hosts` in the read-only `.ssh`: the second logout keeps
/// both versions (its own beside the share's), as for any file.
#[test]
fn a_conflict_in_a_read_only_dot_directory_keeps_both_versions() {
    let fx = Fixture::new();
    alices_share(&fx, &[(".ssh", 0o555)], &[(".ssh/known_hosts", 0o644)]);
    let (mnt_b, cache_b) = fx.workstation("b");
    for d in [&mnt_b, &fx.mnt] {
        std::os::unix::fs::chown(d, Some(account("ccfs-alice").uid), None).expect("chown");
    }
    let a = fx.mount_with(&["--user", "ccfs-alice"]);
    let b = fx.mount_at(&mnt_b, &cache_b, &["--user", "ccfs-alice"]);
    for (mnt, host) in [(&fx.mnt, "a"), (&mnt_b, "b")] {
        let out = as_user(
            "ccfs-alice",
            &format!("echo 'host {host}' >> '{}/.ssh/known_hosts'", mnt.display()),
        );
        assert!(out.status.success(), "{}", text(&out));
    }
    let out = b.umount();
    assert!(out.status.success(), "{}", text(&out));
    let out = a.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".ssh/known_hosts")), "old\nhost b\n");
    let copies = conflict_copies(&fx.s(".ssh"), "known_hosts");
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_eq!(read(&copies[0]), "old\nhost a\n");
    assert_eq!(
        fs::metadata(fx.s(".ssh")).expect("ssh").mode() & 0o7777,
        0o555
    );
}

/// Directories copied to the cache below a read-only dot directory: a new file in a
/// writable directory whose parent is read-only, and a chmod of a directory in a
/// read-only one, work as on the share; every directory keeps the mode the user gave it.
#[test]
fn directories_below_a_read_only_dot_directory_are_copied_up_with_their_modes() {
    let fx = Fixture::new();
    alices_share(
        &fx,
        &[
            (".locked", 0o555),
            (".locked/a", 0o755),
            (".locked/b", 0o755),
        ],
        &[(".locked/b/f", 0o644)],
    );
    let m = fx.mount_with(&["--user", "ccfs-alice"]);
    let out = as_user(
        "ccfs-alice",
        &format!(
            "cd '{}' && chmod 700 .locked/a && echo new > .locked/b/new && echo more >> .locked/b/f",
            fx.mnt.display()
        ),
    );
    assert!(out.status.success(), "{}", text(&out));
    for (p, mode) in [
        (".locked", "555"),
        (".locked/a", "700"),
        (".locked/b", "755"),
    ] {
        assert_eq!(mode_seen_by("ccfs-alice", &fx.m(p)), mode, "{p}");
    }
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".locked/b/new")), "new\n");
    assert_eq!(read(&fx.s(".locked/b/f")), "old\nmore\n");
    for (p, mode) in [
        (".locked", 0o555),
        (".locked/a", 0o700),
        (".locked/b", 0o755),
    ] {
        assert_eq!(
            fs::metadata(fx.s(p)).expect("dir").mode() & 0o7777,
            mode,
            "{p} on the share"
        );
    }
}

/// `ccfs recover --user NAME` (the PAM hook at login) recovers that user's caches only.
#[test]
fn recover_for_one_user_leaves_other_users_caches_alone() {
    let fx = Fixture::new();
    fs::set_permissions(fx.tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod tmp");
    let root = fx.tmp.path().join("cache-root");
    let env = |c: &mut Command| {
        c.env("CCFS_CACHE_ROOT", &root);
    };
    let mut shares = Vec::new();
    for name in ["ccfs-alice", "ccfs-bob"] {
        let user = account(name);
        let share = fx.tmp.path().join(format!("share-{name}"));
        let mnt = fx.tmp.path().join(format!("mnt-{name}"));
        fs::create_dir(&share).expect("mkdir");
        fs::create_dir(&mnt).expect("mkdir");
        std::os::unix::fs::chown(&share, Some(user.uid), Some(user.gid)).expect("chown");
        let mut c = Command::new(ccfs_bin());
        env(&mut c);
        let out = c
            .args(["mount", "--user", name])
            .arg(&share)
            .arg(&mnt)
            .output()
            .expect("mount");
        assert!(out.status.success(), "{}", text(&out));
        let out = as_user(name, &format!("echo {name} > {}/.left", mnt.display()));
        assert!(out.status.success(), "{}", text(&out));
        crash(&mnt);
        shares.push(share);
    }
    let recover = |extra: &[&str]| {
        let mut c = Command::new(ccfs_bin());
        env(&mut c);
        c.arg("recover").args(extra).output().expect("recover")
    };
    let out = recover(&["--user", "ccfs-alice"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&shares[0].join(".left")), "ccfs-alice\n");
    assert!(
        !shares[1].join(".left").exists(),
        "bob's cache is not touched: {}",
        text(&out)
    );
    let out = recover(&[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&shares[1].join(".left")), "ccfs-bob\n");
}

fn crash(mnt: &Path) {
    let out = ccfs(&["status".as_ref(), "--json".as_ref(), mnt.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let pid = v["pid"].as_u64().expect("pid") as u32;
    kill(pid, libc::SIGKILL);
    wait_until("daemon death", Duration::from_secs(10), || !alive(pid));
    let _ = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(mnt)
        .output();
}

/// Databases passed through to the share (the variant's list) also where the user made
/// their dot directory in this session (only the cache has it): ccfs makes the directories
/// on the share. Such a directory removed or moved (`mv` copies: EXDEV) leaves nothing behind
/// and no conflict; a read-only directory on the way takes its new subdirectory; a file
/// deleted and replaced by a directory makes way on the share; a database moved or
/// linked into a new directory gets it made too.
#[test]
fn databases_in_dot_directories_made_in_the_session() {
    let fx = Fixture::new();
    alices_share(
        &fx,
        &[(".a", 0o755)],
        &[(".ff", 0o644), (".a/old.sqlite", 0o644)],
    );
    let cfg = fx.databases_passed_through();
    let m = fx.mount_with(&["--user", "ccfs-alice", "--config", &cfg]);
    let sh = |script: &str| {
        let out = as_user(
            "ccfs-alice",
            &format!("cd '{}' && {script}", fx.mnt.display()),
        );
        assert!(out.status.success(), "{script}: {}", text(&out));
    };
    let db = "sqlite3 {} 'CREATE TABLE t(x); INSERT INTO t VALUES(1);'";
    let make = |at: &str| sh(&db.replace("{}", at));
    // Removed, and moved away, in the session.
    sh("mkdir -p .gone/p && echo a > .gone/p/prefs");
    make(".gone/p/places.sqlite");
    sh("rm -rf .gone");
    sh("mkdir .moved && echo a > .moved/prefs");
    make(".moved/places.sqlite");
    sh("mv .moved .renamed");
    // Below a read-only directory of the user's.
    sh("mkdir -p .ro/sub && chmod 555 .ro");
    make(".ro/sub/x.sqlite");
    // A file replaced by a directory.
    sh("rm .ff && mkdir .ff");
    make(".ff/x.sqlite");
    // Moved and linked into a new directory.
    sh("mkdir .new && ln .a/old.sqlite .new/linked.sqlite && mv .a/old.sqlite .new/moved.sqlite");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(!said.contains("conflict"), "{said}");
    assert!(!fx.s(".gone").exists(), "removed in the session: gone");
    assert!(!fx.s(".moved").exists(), "moved in the session: gone");
    for at in [".renamed/places.sqlite", ".ro/sub/x.sqlite", ".ff/x.sqlite"] {
        let o = Command::new("sqlite3")
            .arg(fx.s(at))
            .arg("SELECT count(*) FROM t; PRAGMA integrity_check;")
            .output()
            .expect("sqlite3");
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "1\nok\n",
            "{at}: {}",
            text(&o)
        );
    }
    assert_eq!(read(&fx.s(".renamed/prefs")), "a\n");
    assert_eq!(
        fs::metadata(fx.s(".ro")).expect("ro").mode() & 0o7777,
        0o555
    );
    assert!(fs::metadata(fx.s(".ff")).expect("ff").is_dir());
    assert_eq!(read(&fx.s(".new/linked.sqlite")), "old\n");
    assert_eq!(read(&fx.s(".new/moved.sqlite")), "old\n");
    assert!(!fx.s(".a/old.sqlite").exists());
    let alice = account("ccfs-alice");
    for d in [".renamed", ".ro", ".ro/sub", ".ff", ".new"] {
        assert_eq!(fs::metadata(fx.s(d)).expect("dir").uid(), alice.uid, "{d}");
    }
}

/// A directory kept in the cache for its clean copies whose share directory the owner
/// made unreadable meanwhile (`chmod 300`) holds up no logout: the next session shows
/// the share's directory, and its logout empties the cache as usual.
#[test]
fn a_kept_directory_made_unreadable_on_the_share_holds_up_no_logout() {
    let fx = Fixture::new();
    alices_share(&fx, &[(".nr", 0o755)], &[(".nr/f", 0o644)]);
    let m = fx.mount_with(&["--user", "ccfs-alice"]);
    let out = as_user(
        "ccfs-alice",
        &format!("echo x1 > '{}'", fx.m(".nr/f").display()),
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    fs::set_permissions(fx.s(".nr"), fs::Permissions::from_mode(0o300)).expect("chmod");
    let m = fx.mount_with(&["--user", "ccfs-alice"]);
    let _ = as_user("ccfs-alice", &format!("ls -l '{}'", fx.m(".nr").display()));
    assert_eq!(mode_seen_by("ccfs-alice", &fx.m(".nr")), "300");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("all changes are on the share"),
        "{}",
        text(&out)
    );
    fs::set_permissions(fx.s(".nr"), fs::Permissions::from_mode(0o755)).expect("chmod");
    assert_eq!(read(&fx.s(".nr/f")), "x1\n");
}

/// A file whose group is not the one its directory on the share hands out (a setgid
/// directory of a group the user is not in) keeps its own group when the logout sends it,
/// as rsync --archive keeps it: a file private to the user's group is not opened to the
/// directory's.
#[test]
fn a_file_sent_into_a_setgid_directory_of_another_group_keeps_its_group() {
    let alice = account("ccfs-alice");
    let bob = account("ccfs-bob");
    let fx = Fixture::new();
    fs::set_permissions(fx.tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod tmp");
    let proj = fx.s(".proj");
    fs::create_dir(&proj).expect("mkdir");
    write(&fx.s(".proj/secret"), "v1\n");
    std::os::unix::fs::chown(&fx.share, Some(alice.uid), Some(alice.gid)).expect("chown");
    std::os::unix::fs::chown(&proj, Some(alice.uid), Some(bob.gid)).expect("chown");
    fs::set_permissions(&proj, fs::Permissions::from_mode(0o2775)).expect("chmod");
    let secret = fx.s(".proj/secret");
    std::os::unix::fs::chown(&secret, Some(alice.uid), Some(alice.gid)).expect("chown");
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o640)).expect("chmod");
    fs::set_permissions(&fx.share, fs::Permissions::from_mode(0o755)).expect("chmod share");
    let m = fx.mount_with(&["--user", "ccfs-alice"]);
    let out = as_user(
        "ccfs-alice",
        &format!("echo v2 > {}/.proj/secret", fx.mnt.display()),
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&secret), "v2\n");
    let there = fs::metadata(&secret).expect("stat");
    assert_eq!(
        (there.uid(), there.gid(), there.mode() & 0o7777),
        (alice.uid, alice.gid, 0o640),
        "owner, group and bits as the user's file has them"
    );
}
