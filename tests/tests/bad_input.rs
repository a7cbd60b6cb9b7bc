//! Bad input gets a one-line error naming the problem and the fix, exit code 2, and
//! changes nothing: no mount, no cache directory.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use e2e::*;

/// Runs `ccfs ARGS` expecting a refusal that mentions every word in `words`.
fn refused(fx: &Fixture, args: &[&OsStr], words: &[&str]) {
    let out = ccfs(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].starts_with("ccfs: error: "), "{stderr}");
    for w in words {
        assert!(lines[0].contains(w), "{w:?} missing from: {stderr}");
    }
    assert!(
        lines[0].contains(';'),
        "the line must say what to do: {stderr}"
    );
    assert!(!is_mounted(&fx.mnt), "nothing may be mounted");
}

fn mount_args<'a>(cache: &'a Path, share: &'a Path, mnt: &'a Path) -> Vec<&'a OsStr> {
    vec![
        "mount".as_ref(),
        "--cache-dir".as_ref(),
        cache.as_os_str(),
        share.as_os_str(),
        mnt.as_os_str(),
    ]
}

#[test]
fn missing_share() {
    let fx = Fixture::new();
    let missing = fx.tmp.path().join("nope");
    refused(
        &fx,
        &mount_args(&fx.cache, &missing, &fx.mnt),
        &["share", "nope"],
    );
    assert!(!fx.cache.exists(), "the cache dir must not be created");
}

#[test]
fn share_is_a_file() {
    let fx = Fixture::new();
    let file = fx.tmp.path().join("file");
    write(&file, "x");
    refused(
        &fx,
        &mount_args(&fx.cache, &file, &fx.mnt),
        &["not a directory"],
    );
    assert!(!fx.cache.exists());
}

#[test]
fn missing_mountpoint() {
    let fx = Fixture::new();
    let missing = fx.tmp.path().join("nomnt");
    refused(
        &fx,
        &mount_args(&fx.cache, &fx.share, &missing),
        &["mountpoint", "does not exist"],
    );
    assert!(!fx.cache.exists());
}

#[test]
fn non_empty_mountpoint() {
    let fx = Fixture::new();
    write(&fx.m("local-file"), "keep me");
    refused(
        &fx,
        &mount_args(&fx.cache, &fx.share, &fx.mnt),
        &["not empty"],
    );
    assert_eq!(read(&fx.m("local-file")), "keep me");
    assert!(!fx.cache.exists());
}

#[test]
fn already_mounted_mountpoint() {
    let fx = Fixture::new();
    let m = fx.mount();
    let other_cache = fx.tmp.path().join("cache2");
    let out = ccfs(&mount_args(&other_cache, &fx.share, &fx.mnt));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already mounted"),
        "{}",
        text(&out)
    );
    assert!(!other_cache.exists());
    drop(m);
}

#[test]
fn cache_dir_inside_the_share() {
    let fx = Fixture::new();
    let inside = fx.share.join(".ccfs-cache");
    refused(
        &fx,
        &mount_args(&inside, &fx.share, &fx.mnt),
        &["inside the share"],
    );
    assert!(!inside.exists());
}

/// A cache on a network filesystem (here sshfs): its files would count as the share's, and
/// a close its client failed would go untold. Refused before the mount, leaving nothing.
#[test]
fn cache_dir_on_a_network_filesystem() {
    let fx = Fixture::new();
    let remote = fx.tmp.path().join("remote");
    let _sftp = SftpShare::mount_at(&fx, &remote, "8m");
    let cache = remote.join("cache");
    refused(
        &fx,
        &mount_args(&cache, &fx.share, &fx.mnt),
        &["not a local disk", "fuse"],
    );
    assert!(!cache.exists(), "the cache dir made for the mount is gone");
}

#[test]
fn mountpoint_inside_the_share() {
    let fx = Fixture::new();
    let inner = fx.share.join("mnt");
    fs::create_dir(&inner).expect("mkdir");
    let out = ccfs(&mount_args(&fx.cache, &fx.share, &inner));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("overlap"),
        "{}",
        text(&out)
    );
    assert!(!is_mounted(&inner));
}

#[test]
fn cache_dir_that_is_a_symlink() {
    let fx = Fixture::new();
    let target = fx.tmp.path().join("elsewhere");
    fs::create_dir(&target).expect("mkdir");
    std::os::unix::fs::symlink(&target, &fx.cache).expect("symlink");
    refused(
        &fx,
        &mount_args(&fx.cache, &fx.share, &fx.mnt),
        &["symlink"],
    );
    assert_eq!(fs::read_dir(&target).expect("ls").count(), 0);
}

#[test]
fn cache_dir_not_writable() {
    let fx = Fixture::new();
    let ro = fx.tmp.path().join("ro");
    fs::create_dir(&ro).expect("mkdir");
    // A read-only filesystem refuses even root.
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"])
        .arg(&ro)
        .status()
        .expect("mount tmpfs");
    assert!(st.success(), "needs root to mount a read-only tmpfs");
    let cache = ro.join("cache");
    let out = ccfs(&mount_args(&cache, &fx.share, &fx.mnt));
    let _ = Command::new("umount").arg(&ro).status();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not writable"),
        "{}",
        text(&out)
    );
    assert!(!is_mounted(&fx.mnt));
}

#[test]
fn rsync_not_installed() {
    let fx = Fixture::new();
    let cfg = fx.tmp.path().join("c.toml");
    write(&cfg, "[sync]\nrsync = \"/nonexistent/bin/rsync\"\n");
    let mut args = vec!["mount".as_ref(), "--config".as_ref(), cfg.as_os_str()];
    args.extend(
        mount_args(&fx.cache, &fx.share, &fx.mnt)
            .into_iter()
            .skip(1),
    );
    refused(
        &fx,
        &args,
        &["rsync", "not installed", "apt-get install rsync"],
    );
    assert!(!fx.cache.exists());
    // And with the default name when PATH has no rsync.
    let out = Command::new(ccfs_bin())
        .env("PATH", fx.tmp.path())
        .args(mount_args(&fx.cache, &fx.share, &fx.mnt))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("rsync"),
        "{}",
        text(&out)
    );
}

#[test]
fn invalid_config_files() {
    let fx = Fixture::new();
    let cfg = fx.tmp.path().join("c.toml");
    for (content, word) in [
        ("[paths]\ncahced = [\".x\"]\n", "cahced"),
        ("[paths]\nlocal_only = [\"[oops\"]\n", "local_only"),
        ("[mount]\nthreads = 0\n", "threads"),
        ("[mount]\ncount_paths = 99\n", "count_paths"),
        ("this is = not [ toml", "c.toml"),
    ] {
        write(&cfg, content);
        let mut args = vec!["mount".as_ref(), "--config".as_ref(), cfg.as_os_str()];
        args.extend(
            mount_args(&fx.cache, &fx.share, &fx.mnt)
                .into_iter()
                .skip(1),
        );
        refused(&fx, &args, &[word]);
        assert!(!fx.cache.exists());
    }
    let missing = fx.tmp.path().join("missing.toml");
    let mut args = vec!["mount".as_ref(), "--config".as_ref(), missing.as_os_str()];
    args.extend(
        mount_args(&fx.cache, &fx.share, &fx.mnt)
            .into_iter()
            .skip(1),
    );
    refused(&fx, &args, &["missing.toml"]);
}

#[test]
fn commands_on_something_that_is_not_a_ccfs_mount() {
    let fx = Fixture::new();
    for cmd in ["umount", "sync", "status"] {
        refused(
            &fx,
            &[cmd.as_ref(), fx.mnt.as_os_str()],
            &["not a ccfs mount"],
        );
    }
    refused(
        &fx,
        &[
            "recover".as_ref(),
            "--cache-dir".as_ref(),
            fx.tmp.path().as_os_str(),
        ],
        &["not a ccfs cache"],
    );
}

#[test]
fn second_mount_of_a_cache_in_use_is_refused() {
    let fx = Fixture::new();
    let m = fx.mount();
    let mnt2 = fx.tmp.path().join("mnt2");
    fs::create_dir(&mnt2).expect("mkdir");
    let out = ccfs(&mount_args(&fx.cache, &fx.share, &mnt2));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use"),
        "{}",
        text(&out)
    );
    assert!(!is_mounted(&mnt2));
    drop(m);
}

#[test]
fn planted_cache_dirs_are_refused() {
    let fx = Fixture::new();
    // Owned by another user.
    fs::create_dir(&fx.cache).expect("mkdir");
    std::os::unix::fs::chown(&fx.cache, Some(65534), Some(65534)).expect("chown");
    fs::set_permissions(
        &fx.cache,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod");
    refused(
        &fx,
        &mount_args(&fx.cache, &fx.share, &fx.mnt),
        &["belongs to uid 65534"],
    );
    // Writable by everyone.
    std::os::unix::fs::chown(&fx.cache, Some(0), Some(0)).expect("chown");
    fs::set_permissions(
        &fx.cache,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .expect("chmod");
    refused(
        &fx,
        &mount_args(&fx.cache, &fx.share, &fx.mnt),
        &["writable by other users", "777"],
    );
    assert_eq!(
        fs::read_dir(&fx.cache).expect("ls").count(),
        0,
        "nothing created inside"
    );
    // A parent another user can write to.
    let open = fx.tmp.path().join("open");
    fs::create_dir(&open).expect("mkdir");
    fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777)).expect("chmod");
    refused(
        &fx,
        &mount_args(&open.join("cache"), &fx.share, &fx.mnt),
        &["writable by other users"],
    );
    assert!(!open.join("cache").exists());
}

/// Root reads only a config only root can change (it names the program every sync runs):
/// one writable by others, another user's, or one in a directory others can write is
/// refused for mount and recover, and nothing is made.
#[test]
fn configs_others_can_change_are_refused_for_root() {
    let fx = Fixture::new();
    let cfg = fx.tmp.path().join("c.toml");
    write(&cfg, "[sync]\ninterval_secs = 0\n");
    let open_dir = fx.tmp.path().join("open");
    fs::create_dir(&open_dir).expect("mkdir");
    fs::set_permissions(&open_dir, fs::Permissions::from_mode(0o777)).expect("chmod");
    let in_open_dir = open_dir.join("c.toml");
    write(&in_open_dir, "");
    let cases: [(&Path, u32, u32, &str); 3] = [
        (&cfg, 0o666, 0, "writable by group or others (mode 666)"),
        (&cfg, 0o644, 65534, "belongs to uid 65534"),
        (
            &in_open_dir,
            0o644,
            0,
            "writable by group or others (mode 777)",
        ),
    ];
    for (path, mode, uid, why) in cases {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
        std::os::unix::fs::chown(path, Some(uid), None).expect("chown");
        let mut args = vec!["mount".as_ref(), "--config".as_ref(), path.as_os_str()];
        args.extend(
            mount_args(&fx.cache, &fx.share, &fx.mnt)
                .into_iter()
                .skip(1),
        );
        refused(&fx, &args, &[why, "only root can change", "chmod go-w"]);
        assert!(!fx.cache.exists(), "nothing made");
        refused(
            &fx,
            &["recover".as_ref(), "--config".as_ref(), path.as_os_str()],
            &[why, "only root can change"],
        );
    }
}

/// `ccfs config check` prints every key in effect and where it came from; a bad value is
/// named with its line (exit 2); a cache root another user could make things in is a
/// problem (exit 1), a missing share a note.
#[test]
fn config_check_prints_the_configuration_and_names_its_problems() {
    let check = |config: &Path| {
        ccfs(&[
            "config".as_ref(),
            "check".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
        ])
    };
    let tmp = tempfile::tempdir().expect("tmp");
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let cache_root = tmp.path().join("caches");
    std::fs::create_dir(&cache_root).expect("mkdir");
    std::fs::set_permissions(&cache_root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let good = tmp.path().join("good.toml");
    std::fs::write(
        &good,
        format!(
            "[homes]\nshare_root = \"{0}/share\"\ncache_root = \"{0}/caches\"\n[sync]\ninterval_secs = 60\n",
            tmp.path().display()
        ),
    )
    .expect("write");
    let out = check(&good);
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!("from {} (valid)", good.display())),
        "{said}"
    );
    assert!(
        said.contains("interval_secs = 60"),
        "the value given: {said}"
    );
    assert!(said.contains("threads = 4"), "a default: {said}");
    assert!(
        said.contains("share_root") && said.contains("is not there"),
        "{said}"
    );

    // An entry that is not a directory of the uid it is named for.
    std::os::unix::fs::symlink("/dev/shm", cache_root.join("1234")).expect("symlink");
    let out = check(&good);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("caches/1234 is not a directory of the uid"),
        "{}",
        text(&out)
    );
    std::fs::remove_file(cache_root.join("1234")).expect("rm");

    std::fs::set_permissions(&cache_root, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let out = check(&good);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("cache_root") && text(&out).contains("1777"),
        "{}",
        text(&out)
    );

    let bad = tmp.path().join("bad.toml");
    std::fs::write(&bad, "[session]\n\nfallback = \"tmpfs\"\n").expect("write");
    let out = check(&bad);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("line 3 (fallback = \"tmpfs\")"),
        "{}",
        text(&out)
    );
}

/// A reader that goes away (`ccfs config check | head -1`) ends the output, not in a panic.
#[test]
fn a_closed_standard_output_is_no_panic() {
    // Standard output: a pipe whose reader has gone before the command writes.
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(ccfs_bin())
        .args(["config", "check"])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("ccfs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.status.success(), "{err}");
}
