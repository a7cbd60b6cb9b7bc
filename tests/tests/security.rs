//! A hostile user against root's ccfs: what the user controls (their cache, its meta.json,
//! journal, log and lock, symlinks planted there, file names) never steers what root
//! runs, opens or writes, and filling the cache's filesystem does not take the daemon
//! down. Needs the user ccfs-alice (scripts/setup creates it).

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use e2e::*;

fn ccfs_with_env(env: &[(&str, &OsStr)], args: &[&OsStr]) -> Output {
    let mut c = Command::new(ccfs_bin());
    for (k, v) in env {
        c.env(k, v);
    }
    c.args(args).output().expect("run ccfs")
}

/// A fixture whose share is alice's and whose directories she can reach.
fn alice_fixture() -> (Fixture, ccfs::sys::Account) {
    let alice = account("ccfs-alice");
    let fx = Fixture::new();
    fs::set_permissions(fx.tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod tmp");
    std::os::unix::fs::chown(&fx.share, Some(alice.uid), Some(alice.gid)).expect("chown");
    (fx, alice)
}

fn mount_for_alice(fx: &Fixture, extra: &[&str]) -> Output {
    let mut args: Vec<&OsStr> = vec![
        "mount".as_ref(),
        "--user".as_ref(),
        "ccfs-alice".as_ref(),
        "--cache-dir".as_ref(),
        fx.cache.as_os_str(),
    ];
    args.extend(extra.iter().map(OsStr::new));
    args.push(fx.share.as_os_str());
    args.push(fx.mnt.as_os_str());
    ccfs(&args)
}

/// `ccfs mount --user ccfs-alice` with the default cache dir (under $CCFS_CACHE_ROOT
/// from `env`).
fn mount_for_alice_in(fx: &Fixture, env: &[(&str, &OsStr)]) -> Output {
    ccfs_with_env(
        env,
        &[
            "mount".as_ref(),
            "--user".as_ref(),
            "ccfs-alice".as_ref(),
            fx.share.as_os_str(),
            fx.mnt.as_os_str(),
        ],
    )
}

fn umount(mnt: &Path) -> Output {
    let out = ccfs(&["umount".as_ref(), mnt.as_os_str()]);
    if is_mounted(mnt) {
        let _ = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(mnt)
            .output();
    }
    out
}

fn daemon_pid(mnt: &Path) -> u32 {
    let out = ccfs(&["status".as_ref(), "--json".as_ref(), mnt.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    v["pid"].as_u64().expect("pid") as u32
}

/// kill -9 of a mount's daemon, then the dead mount is detached.
fn crash(mnt: &Path) {
    let pid = daemon_pid(mnt);
    kill(pid, libc::SIGKILL);
    wait_until("daemon death", Duration::from_secs(10), || !alive(pid));
    let _ = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(mnt)
        .output();
}

fn recover(cache: &Path, extra: &[&str]) -> Output {
    let mut args: Vec<&OsStr> = vec![
        "recover".as_ref(),
        "--cache-dir".as_ref(),
        cache.as_os_str(),
    ];
    args.extend(extra.iter().map(OsStr::new));
    ccfs(&args)
}

/// An `id`-like record: the Uid, Gid, Groups and NoNewPrivs lines of /proc/PID/status.
fn ids_in(status: &str) -> (Vec<String>, Vec<String>, Vec<String>, String) {
    let field = |name: &str| -> Vec<String> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} missing from {status}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let nnp = field("NoNewPrivs:").join("");
    (field("Uid:"), field("Gid:"), field("Groups:"), nnp)
}

/// A program path in a config the user wrote (in meta.json, or given to root's
/// --config) is never run by root's recover, not even as the user; root's recover uses
/// the built-in defaults, and a config anyone but root could change is refused.
#[test]
fn root_never_runs_a_program_that_the_cache_names() {
    let (fx, _alice) = alice_fixture();
    let out = mount_for_alice(&fx, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let out = as_user(
        "ccfs-alice",
        &format!("echo unsynced > {}/.vimrc", fx.mnt.display()),
    );
    assert!(out.status.success(), "{}", text(&out));
    crash(&fx.mnt);

    // Anyone may leave a mark here: if the program ran at all, as root or as alice.
    let marks = fx.tmp.path().join("marks");
    fs::create_dir(&marks).expect("mkdir");
    fs::set_permissions(&marks, fs::Permissions::from_mode(0o1777)).expect("chmod");
    let marker = marks.join("evil-ran");
    let cache = fx.cache.display().to_string();
    let out = as_user(
        "ccfs-alice",
        &format!(
            "set -e; cd {cache}
             printf '#!/bin/sh\\nid -u > {marker}\\nexec rsync \"$@\"\\n' > evil.sh
             chmod 755 evil.sh
             printf '[sync]\\nrsync = \"{cache}/evil.sh\"\\n' > evil.toml
             sed 's|\"config\": null|\"config\": \"{cache}/evil.toml\"|' meta.json > meta.new
             mv meta.new meta.json
             grep -q evil.toml meta.json",
            marker = marker.display()
        ),
    );
    assert!(out.status.success(), "{}", text(&out));

    let out = recover(&fx.cache, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !marker.exists(),
        "root's recover ran the program the cache's meta.json names"
    );
    assert_eq!(
        read(&fx.s(".vimrc")),
        "unsynced\n",
        "recovered with the defaults"
    );

    // The user's config given to root directly is refused, with the reason.
    let evil_toml = fx.cache.join("evil.toml");
    let evil = evil_toml.to_str().expect("utf8");
    let out = recover(&fx.cache, &["--config", evil]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("only root can change") && err.contains("uid"),
        "{}",
        text(&out)
    );
    let out = mount_for_alice(&fx, &["--config", evil]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(!is_mounted(&fx.mnt));
    assert!(!marker.exists(), "no refused config's program ran");
}

/// Everything root starts for a user runs as the user for good: the daemon's threads and
/// the rsync it runs have real, effective, saved and filesystem uid and gid the user's
/// and only the user's groups; the rsync root's recover runs also has no_new_privs. The
/// rsync is a wrapper script in a root-only directory, named by root's own config, that
/// records its ids and then runs rsync.
#[test]
fn everything_root_starts_for_a_user_runs_as_the_user_for_good() {
    let (fx, alice) = alice_fixture();
    let admin = fx.tmp.path().join("admin");
    fs::create_dir(&admin).expect("mkdir");
    let records = fx.tmp.path().join("records");
    fs::create_dir(&records).expect("mkdir");
    fs::set_permissions(&records, fs::Permissions::from_mode(0o1777)).expect("chmod");
    let wrapper = admin.join("rsync-ids");
    write(
        &wrapper,
        &format!(
            // (The signal mask as the wrapper starts, read by the shell's own builtins: a
            // shell blocks every signal while it waits for a command it forked, cat's too.)
            "#!/bin/sh\nwhile read -r k v; do [ \"$k\" = SigBlk: ] && m=$v; done < /proc/$$/status\n\
             {{ echo \"StartBlk: $m\"; cat /proc/$$/status; }} > {r}/ids-$$\nexec rsync \"$@\"\n",
            r = records.display()
        ),
    );
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).expect("chmod");
    let config = admin.join("ccfs.toml");
    write(
        &config,
        &format!(
            "[sync]\nrsync = \"{}\"\ninterval_secs = 0\n",
            wrapper.display()
        ),
    );
    let cfg = config.to_str().expect("utf8");
    let alice_ids = vec![alice.uid.to_string(); 4];
    let alice_gids = vec![alice.gid.to_string(); 4];
    let mut alice_groups: Vec<String> = alice.groups.iter().map(u32::to_string).collect();
    alice_groups.sort();
    let check = |what: &str, status: &str, nnp: Option<&str>| {
        let (uid, gid, mut groups, no_new_privs) = ids_in(status);
        groups.sort();
        assert_eq!(uid, alice_ids, "{what}: uids");
        assert_eq!(gid, alice_gids, "{what}: gids");
        assert_eq!(groups, alice_groups, "{what}: groups");
        if let Some(want) = nnp {
            assert_eq!(no_new_privs, want, "{what}: no_new_privs");
        }
    };
    let take_records = || -> Vec<String> {
        let mut v = Vec::new();
        for e in fs::read_dir(&records).expect("ls") {
            let p = e.expect("e").path();
            v.push(read(&p));
            fs::remove_file(&p).expect("rm");
        }
        v
    };

    let out = mount_for_alice(&fx, &["--config", cfg]);
    assert!(out.status.success(), "{}", text(&out));
    let pid = daemon_pid(&fx.mnt);
    for task in fs::read_dir(format!("/proc/{pid}/task")).expect("tasks") {
        let tid = task.expect("task").file_name();
        // (A thread that ended meanwhile, as the rsync probe's does, is not looked at.)
        let Ok(status) =
            fs::read_to_string(format!("/proc/{pid}/task/{}/status", tid.to_string_lossy()))
        else {
            continue;
        };
        check("a daemon thread", &status, None);
    }
    // The launcher that starts the daemon's programs: the user's, with no capability.
    let launchers = descendants_named(pid, "ccfs-launcher");
    assert_eq!(launchers.len(), 1, "the daemon's launcher");
    let status = fs::read_to_string(format!("/proc/{}/status", launchers[0])).expect("status");
    check("the daemon's launcher", &status, None);
    assert_eq!(status_field(&status, "CapPrm:"), "0000000000000000");
    assert_eq!(status_field(&status, "CapEff:"), "0000000000000000");
    let out = as_user(
        "ccfs-alice",
        &format!("echo set > {}/.exrc", fx.mnt.display()),
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = umount(&fx.mnt);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".exrc")), "set\n");
    let logout = take_records();
    assert!(!logout.is_empty(), "the logout sync ran the wrapper");
    for r in &logout {
        check("the daemon's rsync", r, None);
        // (Started by the daemon's launcher, which blocks every signal: rsync has its own.)
        assert_eq!(status_field(r, "StartBlk:"), "0000000000000000", "{r}");
    }

    let out = mount_for_alice(&fx, &["--config", cfg]);
    assert!(out.status.success(), "{}", text(&out));
    let out = as_user(
        "ccfs-alice",
        &format!("echo crashed > {}/.exrc", fx.mnt.display()),
    );
    assert!(out.status.success(), "{}", text(&out));
    crash(&fx.mnt);
    take_records();
    let out = recover(&fx.cache, &["--config", cfg]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".exrc")), "crashed\n");
    let recovered = take_records();
    assert!(!recovered.is_empty(), "root's recover ran the wrapper");
    for r in &recovered {
        check("root's recover's rsync", r, Some("1"));
    }
}

/// A symlink the user plants at any file ccfs keeps in the cache, pointing at a file of
/// root's: mount, logout and recover, all started by root, leave that file as it was.
#[test]
fn symlinks_planted_in_the_cache_never_lead_root_to_write() {
    let (fx, _alice) = alice_fixture();
    let out = mount_for_alice(&fx, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let out = umount(&fx.mnt);
    assert!(out.status.success(), "{}", text(&out));
    let victims = fx.tmp.path().join("victims");
    fs::create_dir(&victims).expect("mkdir");
    let names = [
        "ccfs.log",
        "journal",
        "lock",
        "meta.json",
        "control.sock",
        "conflicts.log",
        "last-sync.json",
    ];
    for name in names {
        let victim = victims.join(name);
        write(&victim, &format!("root's own {name}\n"));
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    let snapshot = |p: &Path| {
        let m = fs::symlink_metadata(p).expect("victim");
        (read(p), m.uid(), m.gid(), m.mode(), m.nlink())
    };
    for name in names {
        let victim = victims.join(name);
        let before = snapshot(&victim);
        let planted = fx.cache.join(name);
        let out = as_user(
            "ccfs-alice",
            &format!(
                "rm -f {p} && ln -s {v} {p}",
                p = planted.display(),
                v = victim.display()
            ),
        );
        assert!(out.status.success(), "{}", text(&out));
        // The mount may refuse a cache with a planted symlink; it must not write through.
        if mount_for_alice(&fx, &[]).status.success() {
            let _ = as_user(
                "ccfs-alice",
                &format!("echo {name} > {}/.planted", fx.mnt.display()),
            );
            let _ = ccfs(&["sync".as_ref(), fx.mnt.as_os_str()]);
            let _ = umount(&fx.mnt);
        }
        let _ = recover(&fx.cache, &[]);
        assert_eq!(
            snapshot(&victim),
            before,
            "root's {name} changed through a symlink planted at CACHE/{name}"
        );
        let _ = as_user(
            "ccfs-alice",
            &format!("[ -L {p} ] && rm -f {p}; true", p = planted.display()),
        );
    }
    let mut left: Vec<String> = fs::read_dir(&victims)
        .expect("ls")
        .map(|e| e.expect("e").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    let mut want: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(left, want, "nothing new appeared next to root's files");
}

/// A log root made in the cache (as ccfs did before the daemon opened its own) cannot be
/// appended to by the user: the daemon, as the user, replaces it with a log of its own
/// (the cache directory is the user's), and says so there.
#[test]
fn a_log_that_is_not_the_users_is_replaced_by_the_users_own() {
    let (fx, alice) = alice_fixture();
    let out = mount_for_alice(&fx, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(umount(&fx.mnt).status.success());
    let log = fx.cache.join("ccfs.log");
    fs::remove_file(&log).expect("rm");
    write(&log, "a log root made\n");
    fs::set_permissions(&log, fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = mount_for_alice(&fx, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(umount(&fx.mnt).status.success());
    let m = fs::symlink_metadata(&log).expect("log");
    assert!(m.is_file());
    assert_eq!(m.uid(), alice.uid, "the log is the user's now");
    let text = read(&log);
    assert!(!text.contains("a log root made"), "{text}");
    assert!(
        text.contains("replaced") && text.contains("ccfs is mounted"),
        "{text}"
    );
}

/// The text after a newline in a file name never starts a line of the daemon's log, and
/// the name did reach the log (escaped).
#[test]
fn a_file_name_with_a_newline_cannot_forge_a_log_line() {
    let (fx, alice) = alice_fixture();
    let forged = "* * * * * root touch ccfs-forged";
    let name = format!(".evil\n{forged}");
    // On the share, so that changing it through the mount copies it up (logged at debug).
    write(&fx.share.join(&name), "old\n");
    std::os::unix::fs::chown(fx.share.join(&name), Some(alice.uid), Some(alice.gid))
        .expect("chown");
    let out = ccfs_with_env(
        &[("CCFS_LOG", OsStr::new("debug"))],
        &[
            "mount".as_ref(),
            "--user".as_ref(),
            "ccfs-alice".as_ref(),
            "--cache-dir".as_ref(),
            fx.cache.as_os_str(),
            fx.share.as_os_str(),
            fx.mnt.as_os_str(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = as_user(
        "ccfs-alice",
        &format!(
            "n=\"$(printf '.evil\\n{forged}')\"; echo new >> \"{mnt}/$n\" && echo x > \"{mnt}/$n.2\"",
            mnt = fx.mnt.display()
        ),
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = umount(&fx.mnt);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.share.join(&name)), "old\nnew\n");
    let log = read(&fx.cache.join("ccfs.log"));
    for line in log.lines() {
        assert!(
            !line.starts_with(forged),
            "a file name forged a log line: {line:?}"
        );
    }
    assert!(
        log.lines().any(|l| l.contains(".evil\\x0a")),
        "the name reached the log, escaped:\n{log}"
    );
}

/// A conflict on such a name is printed by `ccfs umount` on one line too (the PAM hook
/// sends that output to syslog).
#[test]
fn a_conflict_on_a_file_name_with_a_newline_is_reported_on_one_line() {
    let fx = Fixture::new();
    let forged = "* * * * * root touch ccfs-forged";
    let name = format!(".evil\n{forged}");
    write(&fx.share.join(&name), "original\n");
    let (mnt_a, cache_a) = fx.workstation("a");
    let (mnt_b, cache_b) = fx.workstation("b");
    let a = fx.mount_at(&mnt_a, &cache_a, &[]);
    let b = fx.mount_at(&mnt_b, &cache_b, &[]);
    write(&mnt_a.join(&name), "from a\n");
    write(&mnt_b.join(&name), "from b\n");
    let out = a.umount();
    assert!(out.status.success(), "{}", text(&out));
    let out = b.umount();
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.contains("conflict: .evil\\x0a"),
        "the conflict is reported: {said}"
    );
    for line in said.lines() {
        assert!(!line.starts_with(forged), "forged line: {line:?}");
    }
    assert_eq!(read(&fx.share.join(&name)), "from a\n");
}

/// A user process keeps swapping the cache directory (below the user's own directory of
/// the cache root) between a directory, nothing and symlinks to root's directory and
/// file, while root runs `ccfs mount --user` again and again: no file or directory of
/// root's ever changes owner or mode, and nothing appears in root's directory.
#[test]
fn swapping_the_cache_dir_for_symlinks_never_hands_root_files_to_the_user() {
    let (fx, alice) = alice_fixture();
    let root = fx.tmp.path().join("cache-root");
    let env = [("CCFS_CACHE_ROOT", root.as_os_str())];
    // Root makes ROOT (root's) and ROOT/UID (alice's) with a first mount.
    let out = mount_for_alice_in(&fx, &env);
    assert!(out.status.success(), "{}", text(&out));
    assert!(umount(&fx.mnt).status.success());
    let user_dir = root.join(alice.uid.to_string());
    assert_eq!(fs::metadata(&user_dir).expect("user dir").uid(), alice.uid);

    let victim_dir = fx.tmp.path().join("root-dir");
    fs::create_dir(&victim_dir).expect("mkdir");
    fs::set_permissions(&victim_dir, fs::Permissions::from_mode(0o755)).expect("chmod");
    write(&victim_dir.join("inside"), "root's\n");
    let victim_file = fx.tmp.path().join("root-file");
    write(&victim_file, "root's\n");
    let victims: Vec<PathBuf> = vec![
        victim_dir.clone(),
        victim_dir.join("inside"),
        victim_file.clone(),
    ];
    let state = |p: &Path| {
        let m = fs::symlink_metadata(p).expect("victim");
        (m.uid(), m.gid(), m.mode())
    };
    let before: Vec<_> = victims.iter().map(|p| state(p)).collect();

    let stop = fx.tmp.path().join("stop");
    let cache = user_dir.join("race");
    // A tight loop (perl, which Debian always has): the cache directory is there (the
    // user's), then renamed away (root's, if root just made it) with a symlink to root's
    // directory or file in its place for a moment, then gone.
    let swapper = Command::new("setpriv")
        .args([
            "--reuid",
            "ccfs-alice",
            "--regid",
            "ccfs-alice",
            "--init-groups",
        ])
        .args(["perl", "-e"])
        .arg(
            r#"my ($dir, $stop, @to) = @ARGV; chdir $dir or die; my $n = 0;
               until (-e $stop) {
                 mkdir("race");
                 for (1 .. 300) { last if ! -d "race" }
                 $n++;
                 if (rename("race", "race.old.$n")) {
                   symlink($to[$n % 2], "race");
                   for (1 .. 300) { last if ! -l "race" }
                   unlink("race");
                   rmdir("race.old.$n");
                 }
               }"#,
        )
        .arg(&user_dir)
        .arg(&stop)
        .arg(&victim_dir)
        .arg(&victim_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("swapper");
    let mut reached_the_daemon = 0;
    for round in 0..40 {
        let out = ccfs_with_env(
            &env,
            &[
                "mount".as_ref(),
                "--user".as_ref(),
                "ccfs-alice".as_ref(),
                "--cache-dir".as_ref(),
                cache.as_os_str(),
                fx.share.as_os_str(),
                fx.mnt.as_os_str(),
            ],
        );
        // Exit 2 is a refusal at the checks; 0 and 1 got as far as the daemon.
        if out.status.code() != Some(2) {
            reached_the_daemon += 1;
        }
        if is_mounted(&fx.mnt) {
            let _ = umount(&fx.mnt);
        }
        let now: Vec<_> = victims.iter().map(|p| state(p)).collect();
        assert_eq!(
            now,
            before,
            "round {round}: a root file changed: {}",
            text(&out)
        );
    }
    write(&stop, "");
    let mut swapper = swapper;
    let _ = swapper.wait();
    let now: Vec<_> = victims.iter().map(|p| state(p)).collect();
    assert_eq!(now, before);
    assert_eq!(
        fs::read_dir(&victim_dir).expect("ls").count(),
        1,
        "nothing was made in root's directory"
    );
    assert!(
        reached_the_daemon > 0,
        "the race never got past the checks; the test proved nothing"
    );
}

/// The cache's filesystem fills up while the daemon logs at debug level into
/// CACHE/ccfs.log on that same filesystem: writes answer ENOSPC, the daemon stays alive
/// and answers, and once space is freed the logout syncs what was written.
#[test]
fn a_full_cache_filesystem_with_debug_logging_keeps_the_daemon_alive() {
    let fx = Fixture::new();
    let small = fx.tmp.path().join("small");
    let _guard = SmallTmpfs::mount(&small, "2m");
    // Room to free later, beside the cache on its filesystem.
    let ballast = small.join("ballast");
    fs::write(&ballast, pattern(512 * 1024, 3)).expect("ballast");
    let cache = small.join("cache");
    let out = ccfs_with_env(
        &[("CCFS_LOG", OsStr::new("debug"))],
        &[
            "mount".as_ref(),
            "--cache-dir".as_ref(),
            cache.as_os_str(),
            fx.share.as_os_str(),
            fx.mnt.as_os_str(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let pid = daemon_pid(&fx.mnt);
    fs::create_dir(fx.m(".data")).expect("mkdir");
    let mut written = Vec::new();
    let mut full = false;
    for i in 0..64 {
        let p = fx.m(&format!(".data/f{i}"));
        let data = pattern(96 * 1024, 7 + i);
        match fs::write(&p, &data) {
            Ok(()) => written.push((p, data)),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                let _ = fs::remove_file(&p);
                full = true;
                break;
            }
        }
    }
    assert!(full, "the 2 MiB cache must fill up");
    // Every request now logs (debug) into a log that cannot grow.
    for i in 0..200 {
        let _ = fs::write(fx.m(&format!(".data/more{i}")), b"x");
        let _ = fs::metadata(fx.m(".data"));
        let _ = fs::read_dir(fx.m(".data")).map(|d| d.count());
    }
    assert!(
        alive(pid),
        "the daemon died when its log could not be written"
    );
    assert_eq!(daemon_pid(&fx.mnt), pid, "the daemon still answers");
    // Free space (even an unlink needs a journal record, so it is made outside ccfs).
    fs::remove_file(&ballast).expect("rm ballast");
    let out = umount(&fx.mnt);
    assert!(out.status.success(), "the logout syncs: {}", text(&out));
    for (p, data) in &written {
        let rel = p.strip_prefix(&fx.mnt).expect("rel");
        assert!(
            fs::read(fx.share.join(rel)).expect("on the share") == *data,
            "{}",
            rel.display()
        );
    }
    assert!(!written.is_empty());
}

/// The field `name` of a /proc status file, as a number (hex for the capability sets).
fn status_field(status: &str, name: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .unwrap_or_else(|| panic!("{name} missing from {status}"))
        .trim()
        .to_string()
}

/// Kernel passthrough needs CAP_SYS_ADMIN to register a backing file. A user's daemon
/// keeps no capability; its broker keeps that one and nothing else, runs as the user, can
/// gain nothing by exec, and cannot be read or traced by the user. A user who kills the
/// broker (it is theirs) loses passthrough only: files are still read and written, through
/// the daemon.
#[test]
fn the_backing_broker_keeps_one_capability_and_the_user_gains_nothing_from_it() {
    let (fx, alice) = alice_fixture();
    let out = mount_for_alice(&fx, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let pid = daemon_pid(&fx.mnt);
    let daemon = fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    assert_eq!(status_field(&daemon, "CapPrm:"), "0000000000000000");
    assert_eq!(status_field(&daemon, "CapEff:"), "0000000000000000");
    let brokers: Vec<u32> = fs::read_dir("/proc")
        .expect("proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            fs::read_to_string(format!("/proc/{p}/stat"))
                .is_ok_and(|s| s.contains("(ccfs-backing)") && s.contains(&format!(") S {pid} ")))
        })
        .collect();
    assert_eq!(brokers.len(), 1, "one broker, a child of the daemon");
    let broker = brokers[0];
    let status = fs::read_to_string(format!("/proc/{broker}/status")).expect("status");
    let (uid, gid, _, nnp) = ids_in(&status);
    assert_eq!(uid, vec![alice.uid.to_string(); 4]);
    assert_eq!(gid, vec![alice.gid.to_string(); 4]);
    assert_eq!(nnp, "1");
    let sys_admin = format!("{:016x}", 1u64 << 21);
    assert_eq!(status_field(&status, "CapPrm:"), sys_admin);
    assert_eq!(status_field(&status, "CapEff:"), sys_admin);
    assert_eq!(status_field(&status, "CapInh:"), "0000000000000000");
    assert_eq!(status_field(&status, "CapAmb:"), "0000000000000000");
    // The user cannot look into it (not dumpable, more capabilities than the user's).
    let peek = as_user(
        "ccfs-alice",
        &format!("cat /proc/{broker}/environ >/dev/null && echo READ; grep -c . /proc/{broker}/maps && echo MAPS; true"),
    );
    let said = String::from_utf8_lossy(&peek.stdout);
    assert!(!said.contains("READ") && !said.contains("MAPS"), "{said}");

    // Killed by the user: the mount goes on without passthrough.
    let kill = as_user("ccfs-alice", &format!("kill -9 {broker}"));
    assert!(kill.status.success(), "{}", text(&kill));
    wait_until("broker death", Duration::from_secs(10), || !alive(broker));
    let written = as_user(
        "ccfs-alice",
        &format!(
            "printf 'after the broker\\n' > {m}/doc.txt && printf 'rc\\n' > {m}/.rc && cat {m}/doc.txt {m}/.rc",
            m = fx.mnt.display()
        ),
    );
    assert_eq!(
        String::from_utf8_lossy(&written.stdout),
        "after the broker\nrc\n",
        "{}",
        text(&written)
    );
    let out = ccfs(&["umount".as_ref(), fx.mnt.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".rc")), "rc\n");
}

/// A student replaces her daemon's control socket with one of her own that acknowledges
/// root's wait for the logout sync and then never answers it, or answers a byte every
/// second and never ends the line, or sends an endless line: root's `ccfs umount` (the
/// logout hook) still unmounts, and returns within the time it was given (or at the first
/// 16 MiB of a line), saying the daemon has not answered, instead of holding the
/// workstation's session close for ever or growing its memory without bound (the trickle
/// held it for good and the flood took gigabytes before each read counted against the
/// whole wait).
#[test]
fn a_control_socket_that_never_answers_does_not_hold_the_logout() {
    for (mode, says) in [
        ("silent", "has not said within 3 s"),
        ("trickle", "has not said within 3 s"),
        ("flood", "longer than"),
    ] {
        let (fx, alice) = alice_fixture();
        let out = mount_for_alice(&fx, &[]);
        assert!(out.status.success(), "{}", text(&out));
        let pid = daemon_pid(&fx.mnt);
        let mp = fx.mnt.canonicalize().expect("mnt");
        let fake = fx.tmp.path().join("fake-sock.py");
        std::fs::write(
            &fake,
            r#"import socket, os, sys, json, threading, time
cache, mp, pid, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
path = os.path.join(cache, "control.sock")
os.rename(path, path + ".real")
s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen(16)
st = {"pid": pid, "share": "/x", "mountpoint": mp, "cache_dir": cache, "dirty_files": 0,
      "dirty_bytes": 0, "pending_deletions": 0, "last_sync": None}
print("ready", flush=True)
def serve(c):
    for line in c.makefile("rb"):
        if b"wait" not in line.lower():
            c.sendall((json.dumps(st) + "\n").encode())
            continue
        c.sendall(b'{"waiting":true}\n')
        if mode == "trickle":
            while True:
                c.sendall(b" "); time.sleep(1)
        if mode == "flood":
            # 64 MiB without a newline, then nothing (bounded, for a reader without bound).
            for _ in range(64):
                c.sendall(b"a" * (1 << 20))
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"#,
        )
        .expect("script");
        let mut cmd = Command::new("setpriv");
        cmd.args([
            "--reuid",
            &alice.uid.to_string(),
            "--regid",
            &alice.gid.to_string(),
            "--clear-groups",
            "/usr/bin/python3",
        ])
        .arg(&fake)
        .arg(&fx.cache)
        .arg(&mp)
        .arg(pid.to_string())
        .arg(mode);
        let (mut server, ready) = spawn_and_read_line(&mut cmd);
        if ready.trim() != "ready" {
            let _ = server.kill();
            let out = server.wait_with_output().expect("fake server");
            panic!("the fake server did not start: {}", text(&out));
        }

        let out = run_bounded(
            Command::new(ccfs_bin())
                .args(["umount", "--wait", "3"])
                .arg(&fx.mnt),
        );
        let _ = server.kill();
        let _ = server.wait();
        let out = out.unwrap_or_else(|| panic!("{mode}: ccfs umount did not return in 60 s"));
        assert!(!out.status.success(), "{mode}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "{mode}: {}",
            text(&out)
        );
        assert!(
            !is_mounted(&fx.mnt),
            "{mode}: the mount is gone: {}",
            text(&out)
        );
        // The real daemon's logout sync went on: it ends by itself.
        wait_until("the daemon to end", Duration::from_secs(60), || !alive(pid));
    }
}

/// Caches a user plants to hold up the recovery of every cache (the boot's, which logins
/// wait for): one whose lock is a symlink, one whose lock the user's own process holds
/// naming a pid that is gone, one whose journal is a FIFO nobody writes. Root's recovery
/// goes past all three at once, naming them, and recovers the real cache too. (The run is
/// bounded by a minute, the wait each planted cache used to cost.)
#[test]
fn planted_caches_do_not_hold_up_the_recovery_of_every_cache() {
    let (fx, alice) = alice_fixture();
    let root = fx.tmp.path().join("cache-root");
    let env = [("CCFS_CACHE_ROOT", root.as_os_str())];
    let out = mount_for_alice_in(&fx, &env);
    assert!(out.status.success(), "{}", text(&out));
    let out = as_user(
        "ccfs-alice",
        &format!("echo unsynced > {}/.vimrc", fx.mnt.display()),
    );
    assert!(out.status.success(), "{}", text(&out));
    crash(&fx.mnt);
    let user_dir = root.join(alice.uid.to_string());
    let real = fs::read_dir(&user_dir)
        .expect("user dir")
        .next()
        .expect("the real cache")
        .expect("entry")
        .path();
    let out = as_user(
        "ccfs-alice",
        &format!(
            "set -e; cd {u}
             mkdir fake-link fake-held fake-fifo
             cp {real}/meta.json fake-link/; cp {real}/meta.json fake-held/
             cp {real}/meta.json fake-fifo/
             ln -s /nonexistent fake-link/lock
             : > fake-held/lock
             mkfifo fake-fifo/journal",
            u = user_dir.display(),
            real = real.display()
        ),
    );
    assert!(out.status.success(), "{}", text(&out));
    let held = user_dir.join("fake-held/lock");
    let mut holder = Command::new("setpriv")
        .args([
            "--reuid",
            "ccfs-alice",
            "--regid",
            "ccfs-alice",
            "--init-groups",
        ])
        .arg("flock")
        .arg(&held)
        .args([
            "-c",
            &format!("echo 999999 > {}; exec sleep 120", held.display()),
        ])
        .spawn()
        .expect("holder");
    wait_until("the planted lock held", Duration::from_secs(10), || {
        read(&held).trim() == "999999"
    });
    let mut cmd = Command::new(ccfs_bin());
    cmd.arg("recover").env("CCFS_CACHE_ROOT", &root);
    let out =
        run_bounded(&mut cmd).expect("root's recovery of every cache did not end in a minute");
    let _ = holder.kill();
    let _ = holder.wait();
    let said = text(&out);
    assert!(
        said.contains("fake-link") && said.contains("cannot use"),
        "{said}"
    );
    assert!(
        said.contains("fake-held") && said.contains("in use"),
        "{said}"
    );
    assert!(
        said.contains("fake-fifo") && said.contains("not a regular file"),
        "{said}"
    );
    assert_eq!(
        read(&fx.s(".vimrc")),
        "unsynced\n",
        "the real cache recovered: {said}"
    );
}
