//! `loadgen login-storm` end to end: real ccfs mounts (one per user and the share meter),
//! real rsync at logout, counts taken at the share side.

mod common;

use common::text;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn loadgen_bin() -> PathBuf {
    common::ccfs_bin().with_file_name("loadgen")
}

fn storm(share: &Path, work: &Path, extra: &[&str]) -> Output {
    Command::new(loadgen_bin())
        .arg("login-storm")
        .arg("--share")
        .arg(share)
        .arg("--work")
        .arg(work)
        .arg("--ccfs")
        .arg(common::ccfs_bin())
        .args(extra)
        .output()
        .expect("run loadgen")
}

/// A share (on $CCFS_TEST_SHARE_ROOT when set), scratch space, and a profile file.
struct Setup {
    share: tempfile::TempDir,
    work: tempfile::TempDir,
    scratch: tempfile::TempDir,
    profile: PathBuf,
}

fn setup(profile: &str) -> Setup {
    let scratch = tempfile::tempdir().expect("scratch");
    let path = scratch.path().join("profile.txt");
    std::fs::write(&path, profile).expect("profile");
    Setup {
        share: common::share_dir(),
        work: tempfile::tempdir().expect("work"),
        scratch,
        profile: path,
    }
}

/// User `u`'s home in the one run directory a `--keep` storm left on the share.
fn kept_home(share: &Path, u: usize) -> PathBuf {
    let run: Vec<PathBuf> = std::fs::read_dir(share)
        .expect("ls")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(run.len(), 1, "{run:?}");
    run[0].join(format!("user{u:03}"))
}

fn no_mounts_under(dir: &Path) -> bool {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let d = dir.display().to_string();
    !mi.lines().any(|l| l.contains(&d))
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// The shipped profile, both ways: with ccfs nothing changing reaches the share until the
/// logout, without it every config write does; everything is cleaned up after.
#[test]
fn compare_counts_share_writes_at_the_share_side() {
    // On $CCFS_TEST_SHARE_ROOT when set: scripts/test runs this on GlusterFS too.
    let share = common::share_dir();
    let work = tempfile::tempdir().expect("work");
    let out = tempfile::tempdir().expect("out");
    let json = out.path().join("storm.json");
    let o = storm(
        share.path(),
        work.path(),
        &[
            "--users",
            "2",
            "--session",
            "0",
            "--compare",
            "--json",
            json.to_str().expect("utf8"),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let runs = common::read_json(&json);
    let (without, with) = (&runs[0], &runs[1]);
    assert_eq!(without["schema"], "loadgen-login-storm/1");
    assert_eq!(
        (without["with_ccfs"].as_bool(), with["with_ccfs"].as_bool()),
        (Some(false), Some(true))
    );
    for r in [without, with] {
        assert_eq!(r["complete"], true, "{r}");
        assert_eq!(r["per_user"].as_array().expect("users").len(), 2);
        assert!(r["time_to_login"]["p50_s"].as_f64().expect("p50") > 0.0);
    }
    let n = |r: &serde_json::Value, part: &str, k: &str| r[part][k].as_u64().expect(k);
    assert!(
        n(without, "share_login_session", "mutating") > 100,
        "{}",
        without["share_login_session"]
    );
    assert!(n(without, "share_login_session", "write_bytes") > 1_000_000);
    assert_eq!(
        n(with, "share_login_session", "mutating"),
        0,
        "with ccfs the login changes nothing on the share: {}",
        with["share_login_session"]
    );
    assert!(n(with, "share_logout", "mutating") > 0, "the logout syncs");
    assert!(n(with, "share_logout", "write_bytes") > 0);
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("time to login p50") && table.contains("ratio"),
        "{table}"
    );
    // Homes removed, scratch removed, nothing left mounted.
    assert_eq!(entries(share.path()), 0, "share left clean");
    assert_eq!(entries(work.path()), 0, "work left clean");
    assert!(no_mounts_under(work.path()));
    // The report draws the storm charts.
    let rep = out.path().join("report");
    let o = Command::new(loadgen_bin())
        .args(["report", json.to_str().expect("utf8"), "-o"])
        .arg(&rep)
        .output()
        .expect("report");
    assert!(o.status.success(), "{}", text(&o));
    for f in [
        "login-distribution.svg",
        "login-percentiles.png",
        "share-writes.svg",
        "index.html",
    ] {
        assert!(rep.join(f).is_file(), "{f}");
    }
    let html = std::fs::read_to_string(rep.join("index.html")).expect("html");
    assert!(
        html.contains("Login storms") && html.contains("with ccfs"),
        "{html}"
    );
}

/// What the users wrote during login and session is on the share after the logout.
#[test]
fn with_ccfs_every_change_reaches_the_share_at_logout() {
    let Setup {
        share,
        work,
        scratch: _keep,
        profile,
    } = setup(
        "[home]\nfile .config/app.conf 10\nfile Documents/old.txt 5\n\
         [login]\nread .config/app.conf\nreplace .config/app.conf 123\nwrite Documents/a.txt 50\n\
         [session 1]\nreplace .config/s.conf 77\nappend .history 3\n\
         [logout]\nunlink Documents/old.txt\n",
    );
    let o = storm(
        share.path(),
        work.path(),
        &[
            "--users",
            "3",
            "--session",
            "2",
            "--with-ccfs",
            "--keep",
            "--profile",
            profile.to_str().expect("utf8"),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    for u in 0..3 {
        let home = kept_home(share.path(), u);
        let len = |r: &str| std::fs::metadata(home.join(r)).map(|m| m.len()).ok();
        assert_eq!(len(".config/app.conf"), Some(123), "{}", home.display());
        assert_eq!(len("Documents/a.txt"), Some(50));
        assert_eq!(len(".config/s.conf"), Some(77), "written in the session");
        assert_eq!(len(".history"), Some(6), "two session ticks appended");
        assert_eq!(len("Documents/old.txt"), None, "deleted at logout");
    }
    assert!(no_mounts_under(work.path()));
}

#[test]
fn bad_storm_input_is_refused_and_changes_nothing() {
    let share = common::share_dir();
    let work = tempfile::tempdir().expect("work");
    let bad_profile = work.path().join("bad.txt");
    std::fs::write(&bad_profile, "[login]\nread /etc/shadow\n").expect("write");
    let inside = share.path().join("w");
    for (args, want) in [
        (vec!["--users", "0"], "--users"),
        (vec!["--session", "999999"], "--session"),
        (
            vec!["--profile", bad_profile.to_str().expect("utf8")],
            "line 2",
        ),
        (
            vec!["--profile", "/nonexistent/p.txt"],
            "cannot read --profile",
        ),
        (vec!["--with-ccfs", "--compare"], "cannot be used with"),
        (
            vec!["--ccfs-config", "/nonexistent/c.toml"],
            "--ccfs-config",
        ),
    ] {
        let o = storm(share.path(), work.path(), &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let o = storm(Path::new("/nonexistent/share"), work.path(), &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--share"));
    let o = storm(share.path(), &inside, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("outside --share"));
    let o = Command::new(loadgen_bin())
        .args(["login-storm", "--share"])
        .arg(share.path())
        .args(["--work"])
        .arg(work.path())
        .args(["--ccfs", "/nonexistent/ccfs"])
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--ccfs"));
    assert_eq!(entries(share.path()), 0, "nothing made on the share");
}

/// The users' ccfs mounts take a configuration: paths passed through reach the share at
/// once, during the login.
#[test]
fn a_ccfs_config_for_the_users_passes_chosen_paths_through() {
    let Setup {
        share,
        work,
        scratch,
        profile,
    } = setup(
        "[home]\nfile .db/big.sqlite 65536\nfile .config/a 1\n\
         [login]\nsqlite .db/big.sqlite 3 1\nreplace .config/a 10\n[logout]\n",
    );
    let config = scratch.path().join("ccfs.toml");
    std::fs::write(&config, "[paths]\npassthrough = [\".db/**\"]\n").expect("config");
    let json = scratch.path().join("s.json");
    let args = |cfg: Option<&Path>| {
        let mut a = vec![
            "--users".to_string(),
            "2".into(),
            "--session".into(),
            "0".into(),
            "--with-ccfs".into(),
            "--profile".into(),
            profile.display().to_string(),
            "--json".into(),
            json.display().to_string(),
        ];
        if let Some(c) = cfg {
            a.push("--ccfs-config".into());
            a.push(c.display().to_string());
        }
        a
    };
    let mut fsyncs = Vec::new();
    for cfg in [None, Some(config.as_path())] {
        let a = args(cfg);
        let o = storm(
            share.path(),
            work.path(),
            &a.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        assert!(o.status.success(), "{}", text(&o));
        let r = common::read_json(&json);
        let during = &r["share_login_session"]["by_op"];
        fsyncs.push(during["fsync"].as_u64().unwrap_or(0));
    }
    assert_eq!(
        fsyncs[0], 0,
        "cached: no fsync reaches the share during the login"
    );
    // Each user's three transactions each end in an fdatasync; more may come on top (the
    // kernel and ccfs are free to sync more often), never fewer.
    assert!(
        fsyncs[1] >= 2 * 3,
        "passed through: every transaction's fsync reaches the share, got {}",
        fsyncs[1]
    );
}

/// Ctrl-C in the middle of a session: the users log out (ccfs syncs what they wrote), the
/// mounts go, the scratch space is removed, and loadgen says it was interrupted.
#[test]
fn an_interrupted_storm_logs_everyone_out_and_leaves_no_mount() {
    let Setup {
        share,
        work,
        scratch: _keep,
        profile,
    } = setup(
        "[home]\nfile .config/app.conf 10\n[login]\nreplace .config/app.conf 123\n\
         [session 1]\nappend .history 3\n[logout]\n",
    );
    let mut child = Command::new(loadgen_bin())
        .arg("login-storm")
        .arg("--share")
        .arg(share.path())
        .arg("--work")
        .arg(work.path())
        .arg("--ccfs")
        .arg(common::ccfs_bin())
        .args(["--users", "2", "--session", "300", "--with-ccfs", "--keep"])
        .arg("--profile")
        .arg(&profile)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("loadgen");
    let work_name = work.path().display().to_string();
    let mounts = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .expect("mountinfo")
            .lines()
            .filter(|l| l.contains(&work_name))
            .count()
    };
    // The meter and both users' mounts.
    common::wait_until(
        "the meter's and both users' mounts",
        std::time::Duration::from_secs(60),
        || mounts() == 3,
    );
    // Both users are in their session: each has appended to .history (seen through their
    // mount, work/storm-*/home/userNNN) at least once.
    let in_session = |u: usize| {
        std::fs::read_dir(work.path()).is_ok_and(|d| {
            d.flatten().any(|run| {
                run.path()
                    .join(format!("home/user{u:03}/.history"))
                    .exists()
            })
        })
    };
    common::wait_until(
        "a session tick of both users",
        std::time::Duration::from_secs(60),
        || (0..2).all(in_session),
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(60),
            "loadgen did not stop after SIGINT"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let out = child.wait_with_output().expect("output");
    assert_eq!(status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("interrupted"),
        "{}",
        text(&out)
    );
    assert_eq!(mounts(), 0, "no mount left");
    assert_eq!(entries(work.path()), 0, "scratch space removed");
    // Kept homes: what the users wrote reached the share at their forced logout.
    for u in 0..2 {
        let home = kept_home(share.path(), u);
        let len = |r: &str| std::fs::metadata(home.join(r)).map(|m| m.len()).ok();
        assert_eq!(len(".config/app.conf"), Some(123), "{}", home.display());
        assert!(len(".history").is_some_and(|n| n > 0 && n % 3 == 0));
    }
}

/// Returning users find their local-only files (`.cache`) in their workstation's cache;
/// first-time users do not. Making them is preparation: nothing of it is counted.
#[test]
fn returning_users_find_their_local_cache() {
    let Setup {
        share,
        work,
        scratch,
        profile,
    } = setup(
        "[home]\nfile .cache/fonts/a.cache 5000\nfile .config/app.conf 10\n\
         [login]\nread .cache/fonts/a.cache\nread .config/app.conf\n[logout]\n",
    );
    let json = scratch.path().join("s.json");
    let mut found = Vec::new();
    for returning in [false, true] {
        let mut args = vec![
            "--users",
            "2",
            "--session",
            "0",
            "--with-ccfs",
            "--profile",
            profile.to_str().expect("utf8"),
            "--json",
            json.to_str().expect("utf8"),
        ];
        if returning {
            args.push("--returning-users");
        }
        let o = storm(share.path(), work.path(), &args);
        assert!(o.status.success(), "{}", text(&o));
        let r = common::read_json(&json);
        assert_eq!(r["returning_users"], returning);
        assert_eq!(r["share_login_session"]["mutating"], 0, "{r}");
        let missing: u64 = r["per_user"]
            .as_array()
            .expect("users")
            .iter()
            .map(|u| u["missing_files"].as_u64().expect("missing"))
            .sum();
        found.push(missing);
    }
    assert_eq!(
        found,
        vec![2, 0],
        "first login: one miss a user; returning: none"
    );
    assert!(no_mounts_under(work.path()));
}
