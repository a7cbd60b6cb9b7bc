//! What `loadgen login-storm` shows a sysadmin: input refused before anything runs or is
//! printed, the progress of every run (a line a phase off a terminal, a status line on
//! one, through a real pty), the exit code of an interrupted storm, and the table's
//! wording.

use e2e::text;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn loadgen_bin() -> PathBuf {
    e2e::ccfs_bin().with_file_name("loadgen")
}

/// `loadgen login-storm` on `share` with scratch space `work`, two users, a session of
/// `session` seconds, the given profile and more arguments.
fn storm_args(share: &Path, work: &Path, profile: &Path, session: &str) -> Vec<String> {
    [
        "login-storm",
        "--share",
        &share.display().to_string(),
        "--work",
        &work.display().to_string(),
        "--ccfs",
        &e2e::ccfs_bin().display().to_string(),
        "--users",
        "2",
        "--session",
        session,
        "--profile",
        &profile.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn run(args: &[String], extra: &[&str]) -> Output {
    Command::new(loadgen_bin())
        .args(args)
        .args(extra)
        .output()
        .expect("run loadgen")
}

/// A small profile: a config file replaced at login, a line appended each second.
fn profile(dir: &Path) -> PathBuf {
    let p = dir.join("profile.txt");
    std::fs::write(
        &p,
        "[home]\nfile .config/app.conf 10\n[login]\nreplace .config/app.conf 123\n\
         [session 1]\nappend .history 3\n[logout]\n",
    )
    .expect("profile");
    p
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// Every mistake below is refused with exit code 2 and a line naming it, before the
/// first run: nothing on stdout (no table of zeros), nothing made on the share or in
/// `--work`.
#[test]
fn bad_input_is_refused_before_anything_runs_or_is_printed() {
    let share = e2e::share_dir();
    let scratch = tempfile::tempdir().expect("scratch");
    let work = scratch.path().join("work");
    let profile = profile(scratch.path());
    let bad_config = scratch.path().join("bad.toml");
    std::fs::write(&bad_config, "[paths]\ndotfiles_cached = \"maybe\"\n").expect("config");
    let cfg = bad_config.display().to_string();
    // No process has this id: pid_max is at most 2^22.
    let gone = "2000000000";
    let args = storm_args(share.path(), &work, &profile, "1");
    for (extra, want) in [
        (vec!["--with-ccfs", "--ccfs-config", &cfg], "--ccfs-config"),
        (vec!["--compare", "--ccfs-config", &cfg], "dotfiles_cached"),
        (vec!["--ccfs-config", &cfg], "add --with-ccfs or --compare"),
        (
            vec!["--no-meter", "--server-pids", gone],
            "no process 2000000000",
        ),
    ] {
        let o = run(&args, &extra);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{extra:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{extra:?}: one line: {err}");
        assert!(
            o.stdout.is_empty(),
            "{extra:?}: nothing printed: {}",
            text(&o)
        );
        assert!(!work.exists(), "{extra:?}: --work not made");
        assert_eq!(entries(share.path()), 0, "{extra:?}: nothing on the share");
    }
}

/// A share mounted read-only is refused before the first run, with nothing printed and
/// no scratch space made.
#[test]
fn a_read_only_share_is_refused_before_anything_is_made() {
    let scratch = tempfile::tempdir().expect("scratch");
    let ro = e2e::Tmpfs::mount(&scratch.path().join("ro"), "1m", "ro");
    let share = ro.at.clone();
    let work = scratch.path().join("work");
    let profile = profile(scratch.path());
    let o = run(&storm_args(&share, &work, &profile, "1"), &["--no-meter"]);
    drop(ro);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--share") && err.contains("not writable"),
        "{err}"
    );
    assert!(o.stdout.is_empty(), "{}", text(&o));
    assert!(!work.exists(), "--work not made");
}

/// Off a terminal, every phase of every run is a line on stderr, in order, and each run
/// ends with its times, numbered within its mode; `--quiet` says none of it. The table
/// says which way its ratios divide, and that a local share cannot show what ccfs buys.
#[test]
fn every_phase_of_every_run_is_said_in_order_off_a_terminal() {
    let share = e2e::share_dir();
    let scratch = tempfile::tempdir().expect("scratch");
    let work = tempfile::tempdir().expect("work");
    let profile = profile(scratch.path());
    let args = storm_args(share.path(), work.path(), &profile, "1");
    let o = run(&args, &["--compare", "--no-meter"]);
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let want = [
        "run 1/2, without ccfs: preparing the homes",
        "run 1/2, without ccfs: settling",
        "run 1/2, without ccfs: login",
        "run 1/2, without ccfs: session",
        "run 1/2, without ccfs: logout",
        "run 1/2, without ccfs #1: done: login p50",
        "run 2/2, with ccfs: preparing the homes",
        "run 2/2, with ccfs: login",
        "run 2/2, with ccfs: session",
        "run 2/2, with ccfs: logout",
        "run 2/2, with ccfs #1: done: login p50",
    ];
    let mut at = 0;
    for w in want {
        let found = err[at..].find(w);
        assert!(found.is_some(), "{w:?} after byte {at}: {err}");
        at += found.unwrap_or(0) + w.len();
    }
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("with/without"), "{table}");
    let local = e2e::share_root().is_none();
    assert_eq!(
        table.contains("note: the share is a local filesystem"),
        local,
        "the caveat on a local share only: {table}"
    );
    let o = run(&args, &["--no-meter", "--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("run 1/1"),
        "{}",
        text(&o)
    );
}

/// On a terminal (a real pty, through script(1)) the status line names the run and its
/// phase as it goes.
#[test]
fn on_a_terminal_a_status_line_names_the_run_and_its_phase() {
    let share = e2e::share_dir();
    let scratch = tempfile::tempdir().expect("scratch");
    let work = tempfile::tempdir().expect("work");
    let profile = profile(scratch.path());
    let mut cmd = vec![loadgen_bin().display().to_string()];
    // A session long enough to be drawn on a busy machine too.
    cmd.extend(storm_args(share.path(), work.path(), &profile, "5"));
    cmd.push("--no-meter".into());
    let line = cmd
        .iter()
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let o = e2e::on_a_terminal(&line);
    assert!(o.status.success(), "{}", text(&o));
    let shown = String::from_utf8_lossy(&o.stdout);
    // The five-second session is drawn at least once (ten times a second).
    assert!(shown.contains("run 1/1, without ccfs: session"), "{shown}");
    assert!(shown.contains("run 1/1, without ccfs #1: done"), "{shown}");
    assert!(shown.contains("time to login p50"), "{shown}");
}

/// `--users 1,2,3`: each size on homes of its own, without and with ccfs; the sweep's
/// table has a line a size and each column's knee; the JSON holds every run, and the
/// report draws the login time against the class size for both columns. Sizes out of
/// order are refused.
#[test]
fn a_class_size_sweep_runs_every_size_and_names_each_column_s_knee() {
    let share = e2e::share_dir();
    let scratch = tempfile::tempdir().expect("scratch");
    let work = tempfile::tempdir().expect("work");
    let profile = profile(scratch.path());
    let json = scratch.path().join("sweep.json");
    let mut args = storm_args(share.path(), work.path(), &profile, "0");
    let at = args.iter().position(|a| a == "--users").expect("--users") + 1;
    args[at] = "1,2,3".into();
    // Kept, each size's homes stay: storms started within a second or two, each under a
    // name of its own.
    let o = run(
        &args,
        &[
            "--compare",
            "--no-meter",
            "--keep",
            "--json",
            json.to_str().expect("utf8"),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(entries(share.path()), 3, "a storm a size, each kept");
    let out = String::from_utf8_lossy(&o.stdout);
    let sweep = out
        .split("class-size sweep")
        .nth(1)
        .unwrap_or_else(|| panic!("the sweep's table: {out}"));
    for size in ["    1  ", "    2  ", "    3  "] {
        assert!(
            sweep.lines().any(|l| l.starts_with(size)),
            "{size:?}: {sweep}"
        );
    }
    assert!(sweep.contains("knee without ccfs: ") && sweep.contains("knee with ccfs: "));
    let runs = e2e::read_json(&json);
    let mut seen: Vec<(u64, bool)> = runs
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| (r["users"].as_u64().unwrap_or(0), r["with_ccfs"] == true))
        .collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        [
            (1, false),
            (1, true),
            (2, false),
            (2, true),
            (3, false),
            (3, true)
        ]
    );
    let report = scratch.path().join("report");
    let o = Command::new(loadgen_bin())
        .arg("report")
        .arg(&json)
        .arg("-o")
        .arg(&report)
        .output()
        .expect("report");
    assert!(o.status.success(), "{}", text(&o));
    let svg = std::fs::read_to_string(report.join("class-login-p50.svg")).expect("chart");
    assert!(
        svg.contains("without ccfs") && svg.contains("with ccfs") && svg.contains("3 users"),
        "{svg}"
    );
    args[at] = "3,2".into();
    let o = run(&args, &["--no-meter"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("increasing order"));
}
