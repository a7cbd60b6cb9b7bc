//! `loadgen login-storm` end to end: real ccfs mounts (one per user and the share meter),
//! real rsync at logout, counts taken at the share side.

use e2e::text;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn loadgen_bin() -> PathBuf {
    e2e::ccfs_bin().with_file_name("loadgen")
}

fn storm(share: &Path, work: &Path, extra: &[&str]) -> Output {
    storm_with(&e2e::ccfs_bin(), share, work, extra)
}

/// [`storm`] with the given `ccfs` program.
fn storm_with(ccfs: &Path, share: &Path, work: &Path, extra: &[&str]) -> Output {
    Command::new(loadgen_bin())
        .arg("login-storm")
        .arg("--share")
        .arg(share)
        .arg("--work")
        .arg(work)
        .arg("--ccfs")
        .arg(ccfs)
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
        share: e2e::share_dir(),
        work: tempfile::tempdir().expect("work"),
        scratch,
        profile: path,
    }
}

/// The homes of every run a `--keep` storm left on the share (run-0, run-1, ...).
fn kept_runs(share: &Path) -> Vec<PathBuf> {
    let top: Vec<PathBuf> = std::fs::read_dir(share)
        .expect("ls")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(top.len(), 1, "{top:?}");
    let mut runs: Vec<PathBuf> = std::fs::read_dir(&top[0])
        .expect("ls")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    runs.sort();
    runs
}

/// The runs of a `--json` list: the timed ones, then the metered ones.
fn timed_and_metered(json: &Path) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let all = e2e::read_json(json);
    let runs = all.as_array().expect("a list of runs").clone();
    for r in &runs {
        assert_eq!(r["schema"], "loadgen-login-storm/2");
    }
    runs.into_iter().partition(|r| r["metered"] == false)
}

fn per_user_sum(r: &serde_json::Value, k: &str) -> u64 {
    r["per_user"]
        .as_array()
        .expect("users")
        .iter()
        .map(|u| u[k].as_u64().expect(k))
        .sum()
}

/// How many mounts are at or below `dir`.
fn mounts_under(dir: &Path) -> usize {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let d = dir.display().to_string();
    mi.lines().filter(|l| l.contains(&d)).count()
}

fn no_mounts_under(dir: &Path) -> bool {
    mounts_under(dir) == 0
}

/// A storm of two users through ccfs with a long session, started in the background.
fn long_storm(share: &Path, work: &Path, profile: &Path, extra: &[&str]) -> std::process::Child {
    Command::new(loadgen_bin())
        .arg("login-storm")
        .arg("--share")
        .arg(share)
        .arg("--work")
        .arg(work)
        .arg("--ccfs")
        .arg(e2e::ccfs_bin())
        .args([
            "--users",
            "2",
            "--session",
            "300",
            "--with-ccfs",
            "--no-meter",
        ])
        .args(extra)
        .arg("--profile")
        .arg(profile)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("loadgen")
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// The shipped profile, both ways, twice each in ABBA order on homes of their own, then
/// once each through the meter: with ccfs caching every dotfile (databases too, as the
/// default does) nothing changing reaches the share until the logout, without
/// it every config write does; everything is cleaned up after.
#[test]
fn compare_counts_share_writes_at_the_share_side() {
    // On $CCFS_TEST_SHARE_ROOT when set: scripts/test runs this on GlusterFS too.
    let share = e2e::share_dir();
    let work = tempfile::tempdir().expect("work");
    let out = tempfile::tempdir().expect("out");
    let json = out.path().join("storm.json");
    let config = out.path().join("databases-cached.toml");
    std::fs::write(&config, "[paths]\npassthrough = []\n").expect("config");
    // On the testbeds scripts/test names the command that reads the server's own counts
    // (deploy/testbed/gluster.sh counts, moosefs.sh counts, ceph.sh counts).
    let server_counts = std::env::var("CCFS_TEST_SERVER_COUNTS")
        .ok()
        .filter(|c| !c.is_empty());
    let mut args = vec![
        "--users",
        "2",
        "--session",
        "0",
        "--compare",
        "--repeat",
        "2",
        "--ccfs-config",
        config.to_str().expect("utf8"),
        "--json",
        json.to_str().expect("utf8"),
    ];
    if let Some(c) = &server_counts {
        args.extend(["--server-counts", c.as_str()]);
    }
    let o = storm(share.path(), work.path(), &args);
    assert!(o.status.success(), "{}", text(&o));
    let (timed, metered) = timed_and_metered(&json);
    let modes = |rs: &[serde_json::Value]| -> Vec<bool> {
        rs.iter()
            .map(|r| r["with_ccfs"].as_bool().expect("mode"))
            .collect()
    };
    assert_eq!(modes(&timed), [false, true, true, false], "ABBA");
    assert_eq!(modes(&metered), [false, true]);
    for r in timed.iter().chain(&metered) {
        assert_eq!(r["complete"], true, "{r}");
        assert_eq!(r["baseline"], "fair");
        assert_eq!(r["per_user"].as_array().expect("users").len(), 2);
        assert!(r["time_to_login"]["p50_s"].as_f64().expect("p50") > 0.0);
        // Tests run as root: the page cache was dropped before every run.
        assert_eq!(r["settled"]["caches_dropped"], true, "{}", r["settled"]);
        // A first login on a workstation never used: `.cache` is empty either way, and
        // its files are rebuilt either way.
        assert!(per_user_sum(r, "rebuilt_files") > 0, "{r}");
    }
    for r in &timed {
        assert!(r["share_login"].is_null(), "no meter in a timed run");
        if r["with_ccfs"] == true {
            assert!(
                r["ccfs_cpu_s"].as_f64().is_some_and(|c| c > 0.0),
                "the daemons' CPU: {}",
                r["ccfs_cpu_s"]
            );
        }
    }
    let rebuilt = |r: &serde_json::Value| per_user_sum(r, "rebuilt_files");
    assert_eq!(
        rebuilt(&metered[0]),
        rebuilt(&metered[1]),
        "both modes rebuild the same cache files"
    );
    let (without, with) = (&metered[0], &metered[1]);
    let n = |r: &serde_json::Value, part: &str, k: &str| r[part][k].as_u64().expect(k);
    assert!(
        n(without, "share_login", "mutating") > 100,
        "{}",
        without["share_login"]
    );
    assert!(n(without, "share_login", "write_bytes") > 1_000_000);
    for part in ["share_login", "share_session"] {
        assert_eq!(
            n(with, part, "mutating"),
            0,
            "with ccfs the login and session change nothing on the share: {}",
            with[part]
        );
    }
    assert!(n(with, "share_logout", "mutating") > 0, "the logout syncs");
    assert!(n(with, "share_logout", "write_bytes") > 0);
    if server_counts.is_some() {
        server_counts_match_the_meter(without, with);
    }
    // Where the requests went, by path below the homes: every request of a part is
    // counted at one path, the paths are relative to a home (the profile's dot-directories),
    // and the logout with ccfs asks the share mostly about dotfiles.
    for r in [without, with] {
        for part in ["share_login", "share_logout"] {
            let by_path = r[part]["by_path"].as_object().expect("by_path");
            let sum: u64 = by_path.values().map(|v| v.as_u64().expect("count")).sum();
            assert_eq!(sum, n(r, part, "total"), "{part}: {by_path:?}");
            assert!(
                by_path.keys().all(|k| k.split('/').count() <= 3
                    && !k.starts_with("user")
                    && !k.starts_with("loadgen-storm")),
                "{part}: {by_path:?}"
            );
        }
    }
    let mozilla = |r: &serde_json::Value, part: &str| -> u64 {
        r[part]["by_path"]
            .as_object()
            .expect("by_path")
            .iter()
            .filter(|(k, _)| k.starts_with(".mozilla"))
            .map(|(_, v)| v.as_u64().expect("count"))
            .sum()
    };
    assert!(
        mozilla(without, "share_login") > 0,
        "{}",
        without["share_login"]
    );
    assert!(
        mozilla(with, "share_logout") > 0,
        "{}",
        with["share_logout"]
    );
    let table = String::from_utf8_lossy(&o.stdout);
    for row in [
        "time to login p50",
        "with/without",
        "order ABBA",
        "share bytes written, whole run",
        "client CPU: ccfs, mount to exit",
        "share requests of the logins without ccfs, by path in the home",
    ] {
        assert!(table.contains(row), "{row}: {table}");
    }
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

/// The server's own counts (the bricks' profile, MooseFS's master's counters, Ceph's MDS
/// and OSD counters) beside the meter's, in the metered runs: the server wrote at least
/// every byte that reached it (a replicated write is written by every brick), and its
/// writes during the login and the session are the baseline's, not ccfs's, which sends its
/// changes at the logout.
fn server_counts_match_the_meter(without: &serde_json::Value, with: &serde_json::Value) {
    let get = |r: &serde_json::Value, part: &str, key: &str| -> u64 {
        let parts: Vec<&str> = match part {
            "whole" => vec!["server_login_session", "server_logout"],
            p => vec![p],
        };
        parts
            .iter()
            .map(|p| {
                let v = match key {
                    "WRITE" => &r[*p]["fops"]["WRITE"]["calls"],
                    k => &r[*p][k],
                };
                // An operation the server did not serve is left out.
                if v.is_null() && key == "WRITE" && r[*p].is_object() {
                    0
                } else {
                    v.as_u64().unwrap_or_else(|| panic!("{p}.{key}: {r}"))
                }
            })
            .sum()
    };
    let meter_written = |r: &serde_json::Value| -> u64 {
        ["share_login", "share_session", "share_logout"]
            .iter()
            .map(|p| r[*p]["write_bytes"].as_u64().expect("write_bytes"))
            .sum()
    };
    // A server that tells no bytes (MooseFS's master) leaves them out.
    let tells_bytes = |r: &serde_json::Value| !r["server_logout"]["bytes_written"].is_null();
    for r in [without, with].into_iter().filter(|r| tells_bytes(r)) {
        assert!(
            get(r, "whole", "bytes_written") >= meter_written(r),
            "the bricks wrote fewer bytes than the meter saw reach the share: {r}"
        );
    }
    let during = |r: &serde_json::Value| get(r, "server_login_session", "WRITE");
    assert!(during(without) > 0, "{without}");
    assert!(
        during(with) < during(without),
        "with ccfs the bricks see fewer writes during the login and the session: {} against {}",
        during(with),
        during(without)
    );
    assert!(get(with, "server_logout", "WRITE") > 0, "the logout syncs");
}

/// `--server-counts`: the command is read before the start, at the end of the sessions
/// (before any logout starts) and at the end of the logouts, and every run gets the
/// difference; a command that fails is refused before anything is made.
#[test]
fn server_counts_are_read_at_the_start_the_end_of_the_sessions_and_of_the_logouts() {
    let Setup {
        share,
        work,
        scratch,
        profile,
    } = setup("[home]\nfile .a 10\n[login]\nread .a\n[logout]\nwrite .a 20\n");
    // Each reading adds 5 calls and 500 bytes: every part of a run sees exactly 5.
    let state = scratch.path().join("n");
    let cmd = format!(
        "n=$(cat {s} 2>/dev/null || echo 0); n=$((n+5)); echo $n > {s}; \
         printf '{{\"fops\":{{\"WRITE\":{{\"calls\":%d,\"latency_us\":%d}}}},\"bytes_read\":0,\"bytes_written\":%d}}' $n $((n*10)) $((n*100))",
        s = state.display()
    );
    let json = scratch.path().join("storm.json");
    let o = storm(
        share.path(),
        work.path(),
        &[
            "--users",
            "1",
            "--session",
            "0",
            "--no-meter",
            "--repeat",
            "2",
            "--profile",
            profile.to_str().expect("utf8"),
            "--server-counts",
            &cmd,
            "--json",
            json.to_str().expect("utf8"),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let runs: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&json).expect("json")).expect("parse");
    assert_eq!(runs.len(), 2);
    for r in &runs {
        for part in ["server_login_session", "server_logout"] {
            assert_eq!(r[part]["fops"]["WRITE"]["calls"], 5, "{part}: {r}");
            assert_eq!(r[part]["bytes_written"], 500, "{part}: {r}");
        }
    }
    // One reading before the first run (the check), three a run.
    let readings: u64 = std::fs::read_to_string(&state)
        .expect("n")
        .trim()
        .parse()
        .expect("n");
    assert_eq!(readings, 5 * 7);
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("server writes, whole run") && table.contains("server calls, logout"),
        "{table}"
    );
    // A command that fails, or prints something else, is refused up front.
    for (bad, want) in [
        ("exit 3", "failed"),
        ("echo calls: 5", "not the JSON object expected"),
    ] {
        let o = storm(
            share.path(),
            work.path(),
            &["--users", "1", "--no-meter", "--server-counts", bad],
        );
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("--server-counts") && err.contains(want),
            "{bad}: {err}"
        );
    }
    assert_eq!(entries(share.path()), 0, "nothing left on the share");
}

/// Where the baseline keeps `.cache`: on the workstation (fair, the default: the share
/// never sees it, the login rebuilds it locally) or on the share (share-cache). Every run
/// gets homes of its own, made after the `--remount` command ran.
#[test]
fn the_baseline_keeps_cache_local_unless_asked_and_every_run_has_fresh_homes() {
    let Setup {
        share,
        work,
        scratch,
        profile,
    } = setup(
        "[home]\nfile .cache/fonts/a.cache 5000\nfile .config/app.conf 10\n\
         [login]\nread .cache/fonts/a.cache\nread .config/app.conf\nappend .config/app.conf 5\n[logout]\n",
    );
    let json = scratch.path().join("s.json");
    let remounts = scratch.path().join("remounts");
    let remount = format!("echo run >> {}", remounts.display());
    for (baseline, on_share) in [("fair", false), ("share-cache", true)] {
        let o = storm(
            share.path(),
            work.path(),
            &[
                "--users",
                "2",
                "--session",
                "0",
                "--repeat",
                "2",
                "--no-meter",
                "--keep",
                "--baseline",
                baseline,
                "--remount",
                &remount,
                "--profile",
                profile.to_str().expect("utf8"),
                "--json",
                json.to_str().expect("utf8"),
            ],
        );
        assert!(o.status.success(), "{}", text(&o));
        let (timed, _) = timed_and_metered(&json);
        assert_eq!(timed.len(), 2);
        let runs = kept_runs(share.path());
        assert_eq!(runs.len(), 2, "a home set a run: {runs:?}");
        for (r, dir) in timed.iter().zip(&runs) {
            assert_eq!(r["baseline"], baseline);
            assert_eq!(r["settled"]["remounted"], true);
            assert_eq!(
                per_user_sum(r, "rebuilt_files"),
                if on_share { 0 } else { 2 }
            );
            for u in 0..2 {
                let home = dir.join(format!("user{u:03}"));
                // Each run's homes start as prepared: one append each, never two.
                assert_eq!(
                    std::fs::metadata(home.join(".config/app.conf"))
                        .map(|m| m.len())
                        .ok(),
                    Some(15),
                    "{}",
                    home.display()
                );
                assert_eq!(
                    home.join(".cache/fonts/a.cache").exists(),
                    on_share,
                    "{baseline}: {}",
                    home.display()
                );
            }
        }
        std::fs::remove_dir_all(kept_runs(share.path())[0].parent().expect("run")).expect("rm");
    }
    let lines = std::fs::read_to_string(&remounts).expect("remount ran");
    assert_eq!(lines.lines().count(), 4, "once before every run");
    // A remount that fails stops the storm before its users start, says why, and leaves
    // nothing on the share.
    let o = storm(
        share.path(),
        work.path(),
        &[
            "--users",
            "1",
            "--session",
            "0",
            "--no-meter",
            "--remount",
            "echo no client >&2; exit 3",
            "--profile",
            profile.to_str().expect("utf8"),
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--remount") && err.contains("no client"),
        "{err}"
    );
    assert_eq!(entries(share.path()), 0, "nothing left on the share");
    assert!(no_mounts_under(work.path()));
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
    let runs = kept_runs(share.path());
    assert_eq!(runs.len(), 2, "the timed run and the metered one: {runs:?}");
    for home in runs
        .iter()
        .flat_map(|r| (0..3).map(move |u| r.join(format!("user{u:03}"))))
    {
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
    let share = e2e::share_dir();
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
        (vec!["--repeat", "0"], "--repeat"),
        (vec!["--cpu-window", "0"], "--cpu-window"),
        (vec!["--remount", " "], "--remount"),
        (vec!["--server-counts", " "], "--server-counts"),
        (vec!["--baseline", "local"], "--baseline"),
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
        "[home]\nfile .db/big.db 65536\nfile .config/a 1\n\
         [login]\nsqlite .db/big.db 3 1\nreplace .config/a 10\n[logout]\n",
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
    let mut fsyncs: Vec<u64> = Vec::new();
    for cfg in [None, Some(config.as_path())] {
        let a = args(cfg);
        let o = storm(
            share.path(),
            work.path(),
            &a.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        assert!(o.status.success(), "{}", text(&o));
        let (_, metered) = timed_and_metered(&json);
        let r = &metered[0];
        fsyncs.push(
            ["share_login", "share_session"]
                .iter()
                .map(|part| r[part]["by_op"]["fsync"].as_u64().unwrap_or(0))
                .sum(),
        );
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
    let mut child = long_storm(share.path(), work.path(), &profile, &["--keep"]);
    let mounts = || mounts_under(work.path());
    // Both users' mounts (a timed run has no meter).
    e2e::wait_until(
        "both users' mounts",
        std::time::Duration::from_secs(60),
        || mounts() == 2,
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
    e2e::wait_until(
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
    assert_eq!(status.code(), Some(130), "as compilebench: {}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("interrupted"),
        "{}",
        text(&out)
    );
    assert_eq!(mounts(), 0, "no mount left");
    assert_eq!(entries(work.path()), 0, "scratch space removed");
    // Kept homes: what the users wrote reached the share at their forced logout.
    let runs = kept_runs(share.path());
    assert_eq!(runs.len(), 1, "stopped in the first run: {runs:?}");
    for u in 0..2 {
        let home = runs[0].join(format!("user{u:03}"));
        let len = |r: &str| std::fs::metadata(home.join(r)).map(|m| m.len()).ok();
        assert_eq!(len(".config/app.conf"), Some(123), "{}", home.display());
        assert!(len(".history").is_some_and(|n| n > 0 && n % 3 == 0));
    }
}

/// Returning users find their local `.cache` (with ccfs: local-only, in the workstation's
/// ccfs cache; without: on the workstation's disk); first-time users do not, and rebuild
/// it. Making it is preparation: nothing of it is counted.
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
    for returning in [false, true] {
        let mut args = vec![
            "--users",
            "2",
            "--session",
            "0",
            "--compare",
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
        let (timed, metered) = timed_and_metered(&json);
        for r in timed.iter().chain(&metered) {
            assert_eq!(r["returning_users"], returning);
            let want = if returning { 0 } else { 2 };
            assert_eq!(
                (
                    per_user_sum(r, "missing_files"),
                    per_user_sum(r, "rebuilt_files")
                ),
                (want, want),
                "first login: one miss a user, rebuilt; returning: none ({})",
                r["with_ccfs"]
            );
        }
        assert_eq!(metered[1]["share_login"]["mutating"], 0, "{}", metered[1]);
    }
    assert!(no_mounts_under(work.path()));
}

/// A storm killed outright (SIGKILL: no logout) leaves its users' live mounts, their
/// daemons, its scratch space and its homes on the share; the next storm finds them, says
/// so, detaches the mounts and removes the rest; and a user whose ccfs died mid-storm
/// leaves no dead mount behind (it is detached, the run says why).
#[test]
fn a_killed_storm_is_cleaned_up_by_the_next() {
    let Setup {
        share,
        work,
        scratch: _keep,
        profile,
    } = setup(
        "[home]\nfile .config/app.conf 10\n[login]\nreplace .config/app.conf 123\n\
         [session 1]\nappend .history 3\n[logout]\n",
    );
    let work_name = work.path().display().to_string();
    let mounts = || mounts_under(work.path());
    let long_storm = || long_storm(share.path(), work.path(), &profile, &[]);
    let mut child = long_storm();
    e2e::wait_until(
        "both users' mounts",
        std::time::Duration::from_secs(60),
        || mounts() == 2,
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    assert_eq!(mounts(), 2, "a killed storm leaves its users' mounts");
    assert_eq!(entries(share.path()), 1, "and its homes");
    let out = Command::new(loadgen_bin())
        .arg("login-storm")
        .arg("--share")
        .arg(share.path())
        .arg("--work")
        .arg(work.path())
        .arg("--ccfs")
        .arg(e2e::ccfs_bin())
        .args(["--users", "1", "--session", "1", "--no-meter"])
        .arg("--profile")
        .arg(&profile)
        .output()
        .expect("loadgen");
    assert!(out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("2 mounts detached") && err.contains("the homes of a storm that was killed"),
        "{err}"
    );
    assert_eq!(mounts(), 0, "no mount left");
    assert_eq!(entries(share.path()), 0, "no homes left");
    assert_eq!(entries(work.path()), 0, "no scratch space left");

    // A user's ccfs that dies mid-storm: the storm stops with that said, and detaches it.
    let child = long_storm();
    // Both mounts live: in the mount table, and neither `ccfs mount` still waiting for its
    // daemon (a daemon killed before it is live is a mount that failed, not one that died).
    let mounting = || {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                    let c = String::from_utf8_lossy(&c);
                    c.contains(&work_name) && c.contains("\0mount\0") && !c.contains("--daemon")
                })
            })
    };
    e2e::wait_until(
        "both users' mounts",
        std::time::Duration::from_secs(60),
        || mounts() == 2 && !mounting(),
    );
    let killed = Command::new("pkill")
        .args(["-KILL", "-f"])
        .arg(format!("ccfs .*{work_name}/storm-.*/home/user001"))
        .status()
        .expect("pkill");
    assert!(killed.success(), "user001's daemon was running");
    // A session tick meets the dead mount (ticks come every second; a loaded machine may
    // take several): the storm stops by itself, or is stopped with Ctrl-C after 10 s.
    let mut child = child;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while child.try_wait().expect("wait").is_none() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    if child.try_wait().expect("wait").is_none() {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    }
    let out = child.wait_with_output().expect("output");
    assert!(!out.status.success(), "{}", text(&out));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("home/user001") && said.contains("had died"),
        "the run says which user's mount died: {said}"
    );
    assert_eq!(mounts(), 0, "the dead mount is detached too");
}

/// A user's daemon that ends badly at logout (killed here, as it is told to log out) fails
/// the storm with the daemon's end (the signal) and its log named; what the failed run
/// kept (its caches and their logs, its homes) is evidence: the next storm on the same
/// scratch space and share leaves it in place and says so.
#[test]
fn a_failed_storm_keeps_its_evidence_and_names_how_the_daemon_ended() {
    let Setup {
        share,
        work,
        scratch,
        profile,
    } = setup("[home]\nfile .app.conf 10\n[login]\nreplace .app.conf 123\n[session 1]\n[logout]\n");
    let real = e2e::ccfs_bin();
    let wrapper = scratch.path().join("ccfs-killed-at-logout");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nif [ \"$1\" = umount ]; then\n  pid=$('{r}' status --json \"$2\" | grep -o '\"pid\": *[0-9]*' | head -1 | tr -cd 0-9)\n  [ -n \"$pid\" ] && kill -9 \"$pid\" && sleep 0.5\nfi\nexec '{r}' \"$@\"\n",
            r = real.display()
        ),
    )
    .expect("wrapper");
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let profile = profile.to_str().expect("utf8").to_string();
    let run = |ccfs: &Path| {
        storm_with(
            ccfs,
            share.path(),
            work.path(),
            &[
                "--users",
                "1",
                "--session",
                "1",
                "--no-meter",
                "--with-ccfs",
                "--profile",
                &profile,
            ],
        )
    };
    let out = run(&wrapper);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("had died (killed by signal 9)") && said.contains("ccfs.log"),
        "the error says how the daemon ended and names its log: {said}"
    );
    let kept: Vec<PathBuf> = std::fs::read_dir(work.path())
        .expect("ls")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join(".loadgen-kept").is_file())
        .collect();
    assert_eq!(
        kept.len(),
        1,
        "the failed run's scratch space is marked kept: {said}"
    );
    let logs_before = logs_below(&kept[0]);
    assert!(
        !logs_before.is_empty(),
        "the failed run kept its daemons' logs"
    );
    assert_eq!(entries(share.path()), 1, "and its homes");

    let out = run(&real);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("kept by an earlier storm that failed"),
        "the next storm says what it left: {said}"
    );
    assert_eq!(
        logs_below(&kept[0]),
        logs_before,
        "the evidence is still there"
    );
    assert!(
        std::fs::read_dir(share.path()).expect("ls").any(|e| e
            .expect("entry")
            .path()
            .join(".loadgen-run")
            .is_file()),
        "the failed run's homes are still there"
    );
}

/// Every `ccfs.log` below `dir`.
fn logs_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let ft = e.file_type().expect("type");
            if ft.is_dir() {
                todo.push(p);
            } else if p.file_name().is_some_and(|n| n == "ccfs.log") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}
