//! A student against root's `loadgen login-storm`: the storm's mounts (root's, open to
//! every user that can reach them) are out of reach, its cleanup never removes anything
//! through a mount, a name planted in a sticky `--work` is not written through, and a
//! process that names a leftover does not hold root's storm. The student is the test
//! user `ccfs-alice` (scripts/setup).

use e2e::{as_user, text};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn loadgen_bin() -> PathBuf {
    e2e::ccfs_bin().with_file_name("loadgen")
}

const PROFILE: &str = "[home]\nfile .config/app.conf 10\n[login]\nreplace .config/app.conf 123\n\
                       [session 1]\nappend .history 3\n[logout]\n";

/// A storm through ccfs in the background.
fn storm(share: &Path, work: &Path, profile: &Path, extra: &[&str]) -> Child {
    Command::new(loadgen_bin())
        .arg("login-storm")
        .arg("--share")
        .arg(share)
        .arg("--work")
        .arg(work)
        .arg("--ccfs")
        .arg(e2e::ccfs_bin())
        .args(["--users", "1", "--with-ccfs", "--profile"])
        .arg(profile)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("loadgen")
}

/// A pid no process has: a killed storm's.
fn free_pid() -> u32 {
    (3_000_000u32..)
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .expect("a free pid")
}

/// A command run as the student (`setpriv`), its program and arguments to follow.
fn as_alice() -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid",
        "ccfs-alice",
        "--regid",
        "ccfs-alice",
        "--init-groups",
    ]);
    c
}

/// A directory any user may pass through (tempdirs are 0700).
fn open_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("dir");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    d
}

fn profile(dir: &Path) -> PathBuf {
    let p = dir.join("profile.txt");
    std::fs::write(&p, PROFILE).expect("profile");
    p
}

/// The first mount below `dir` whose path ends in `leaf`.
fn mount_below(dir: &Path, leaf: &str) -> Option<PathBuf> {
    fsinfo::mounts()
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.mount_point)
        .find(|p| p.starts_with(dir) && p.ends_with(leaf))
}

fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The share meter (root's ccfs mount of the whole share, `allow_other`) sits in the run's
/// scratch directory, which is root's alone (0700): a student cannot enter it to keep it
/// busy, and the storm ends with the share as it was. (When a student could, root's
/// cleanup removed the whole share through the still mounted meter.)
#[test]
fn a_student_cannot_enter_the_storm_s_meter_and_the_share_survives() {
    let share = e2e::share_dir();
    std::fs::create_dir_all(share.path().join("bob")).expect("bob");
    std::fs::write(share.path().join("bob/homework.txt"), "due monday\n").expect("file");
    let work = open_dir();
    let scratch = tempfile::tempdir().expect("scratch");
    let p = profile(scratch.path());
    // One timed run (no meter), then the metered one.
    let child = storm(share.path(), work.path(), &p, &["--session", "4"]);
    let meter = wait_for("the share meter", Duration::from_secs(120), || {
        mount_below(work.path(), "meter")
    });
    let run_dir = meter.parent().expect("run dir").to_path_buf();
    let mode = std::fs::metadata(&run_dir)
        .expect("run dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "{}", run_dir.display());
    let o = as_user(
        "ccfs-alice",
        &format!("cd '{}' && echo in", meter.display()),
    );
    assert!(
        !o.status.success() && !String::from_utf8_lossy(&o.stdout).contains("in"),
        "a student entered the meter: {}",
        text(&o)
    );
    let out = child.wait_with_output().expect("storm");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(share.path().join("bob/homework.txt")).expect("homework"),
        "due monday\n"
    );
    assert!(
        mount_below(work.path(), "").is_none(),
        "nothing left mounted"
    );
}

/// A name a student planted in a sticky `--work` for the next run's directory (a link to a
/// directory of root's) fails the run; root writes nothing through it.
#[test]
fn a_link_planted_for_the_next_run_s_directory_is_not_written_through() {
    let share = e2e::share_dir();
    let work = open_dir();
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let target = open_dir();
    std::fs::write(target.path().join("config"), "root's\n").expect("target file");
    let scratch = tempfile::tempdir().expect("scratch");
    let p = profile(scratch.path());
    let child = storm(
        share.path(),
        work.path(),
        &p,
        &["--session", "3", "--no-meter", "--repeat", "2"],
    );
    // Run 0's directory names run 1's: storm-TIME-PID-0, then -1.
    let first = wait_for("the first run's directory", Duration::from_secs(60), || {
        std::fs::read_dir(work.path())
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("storm-") && n.ends_with("-0"))
    });
    let planted = work
        .path()
        .join(format!("{}1", first.trim_end_matches('0')));
    let o = as_user(
        "ccfs-alice",
        &format!(
            "ln -s '{}' '{}'",
            target.path().display(),
            planted.display()
        ),
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = child.wait_with_output().expect("storm");
    assert!(
        !out.status.success(),
        "the second run cannot start: {}",
        text(&out)
    );
    let names: Vec<String> = std::fs::read_dir(target.path())
        .expect("ls")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["config"], "nothing written through the link");
}

/// A student's process naming a leftover run directory in its arguments (as a killed
/// storm's daemons do) does not hold root's next storm: the leftover is removed at once.
#[test]
fn a_student_s_process_naming_a_leftover_does_not_hold_the_next_storm() {
    let share = e2e::share_dir();
    let work = open_dir();
    // A killed storm's run directory: its pid no longer runs.
    let pid = free_pid();
    let leftover = work.path().join(format!("storm-1700000000-{pid}-0"));
    std::fs::create_dir(&leftover).expect("leftover");
    let mut holder = as_alice()
        .args(["sh", "-c", "sleep 60; :"])
        .arg(leftover.join("x"))
        .process_group(0)
        .spawn()
        .expect("holder");
    // A setuid-root program she started, waiting at its password prompt: its process is
    // root's, its real user hers.
    let mut setuid_holder = as_alice()
        .args(["sh", "-c"])
        .arg(format!(
            "sleep 60 | su ccfs-alice -c true -- '{}'",
            leftover.join("y").display()
        ))
        .process_group(0)
        .stderr(Stdio::null())
        .spawn()
        .expect("setuid holder");
    let scratch = tempfile::tempdir().expect("scratch");
    let p = profile(scratch.path());
    let out = storm(
        share.path(),
        work.path(),
        &p,
        &["--session", "0", "--no-meter"],
    )
    .wait_with_output()
    .expect("storm");
    for h in [&mut holder, &mut setuid_holder] {
        // SAFETY: signalling the process group of our own child.
        unsafe { libc::kill(-(h.id() as i32), libc::SIGKILL) };
        let _ = h.wait();
    }
    assert!(out.status.success(), "{}", text(&out));
    assert!(!leftover.exists(), "the leftover removed: {}", text(&out));
}

/// A killed storm's run directory whose daemon still runs (a logout sync still sending)
/// is left, and so are its homes on the share: they are not removed under the daemon.
#[test]
fn the_homes_of_a_storm_whose_daemons_still_run_are_left() {
    let share = e2e::share_dir();
    let work = open_dir();
    let pid = free_pid();
    let stamp = format!("1700000000-{pid}");
    let leftover = work.path().join(format!("storm-{stamp}-0"));
    std::fs::create_dir(&leftover).expect("leftover");
    let homes = share.path().join(format!("loadgen-storm-{stamp}"));
    std::fs::create_dir_all(homes.join("run-0/user000")).expect("homes");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    std::fs::write(
        homes.join(".loadgen-run"),
        format!(
            "{{\"tool\":\"loadgen\",\"pid\":{pid},\"host\":\"{}\",\"kept\":false}}\n",
            host.trim()
        ),
    )
    .expect("marker");
    // Root's daemon of that storm, still at work (for 40 s: past the cleaner's wait).
    let mut daemon = Command::new("sh")
        .args(["-c", "sleep 40; :"])
        .arg(leftover.join("cache"))
        .spawn()
        .expect("daemon");
    let scratch = tempfile::tempdir().expect("scratch");
    let p = profile(scratch.path());
    let out = storm(
        share.path(),
        work.path(),
        &p,
        &["--session", "0", "--no-meter"],
    )
    .wait_with_output()
    .expect("storm");
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert!(out.status.success(), "{}", text(&out));
    assert!(leftover.exists(), "its run directory left");
    assert!(
        homes.join("run-0/user000").is_dir(),
        "its homes left: {}",
        text(&out)
    );
}
