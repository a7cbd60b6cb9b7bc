//! The `loadgen` binary end to end: JSON against its schema, CSV, safety, bad input,
//! a run stopped by a full target, sweep and access.

mod common;

use std::path::Path;
use std::process::Command;

use common::{loadgen, read_json, text, validate, validate_against};

#[test]
fn every_phase_runs_and_its_json_matches_the_schema() {
    let dir = tempfile::tempdir().expect("tmp");
    let out_dir = tempfile::tempdir().expect("out");
    let json = out_dir.path().join("r.json");
    let csv = out_dir.path().join("r.csv");
    let phases = "initial-create,create,patch,compile,clean,read-tree,read-compiled,delete-tree,delete-compiled,stat-tree,stat-compiled";
    let o = loadgen(&[
        "compilebench",
        dir.path().to_str().expect("utf8"),
        "--clients",
        "2",
        "--scale",
        "0.02",
        "--phases",
        phases,
        "--json",
        json.to_str().expect("utf8"),
        "--csv",
        csv.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v = read_json(&json);
    validate(&v);
    assert_eq!(v["complete"], true);
    assert_eq!(v["phases"].as_array().expect("phases").len(), 11);
    assert_eq!(v["config"]["mode"], "phases");
    assert_eq!(v["config"]["sync"], true, "compilebench syncs by default");
    for p in v["phases"].as_array().expect("phases") {
        let name = p["name"].as_str().expect("name");
        // compilebench's units: MB/s for what moves data, seconds for delete and stat.
        if name.starts_with("delete") || name.starts_with("stat") {
            assert_eq!(p["unit"], "seconds", "{name}");
            assert!(
                p["aggregate_mb_s"].is_null() && p["wall_mb_s"].is_null(),
                "{name}"
            );
            assert!(p["clients"][0]["mb_s"].is_null(), "{name}");
        } else {
            assert_eq!(p["unit"], "MB/s", "{name}");
            assert!(p["aggregate_mb_s"].as_f64().expect("mb") > 0.0, "{name}");
        }
        assert!(p["seconds"].as_f64().expect("s") > 0.0, "{name}");
        assert_eq!(p["partial"], false);
        assert_eq!(p["clients"].as_array().expect("c").len(), 2);
        assert!(
            p["latency"]["sync"]["count"].as_u64().expect("sync") >= 2,
            "{name}"
        );
    }
    assert_eq!(v["summary"].as_array().expect("summary").len(), 11);
    assert_eq!(v["phases"][2]["name"], "patch");
    assert!(
        v["phases"][2]["latency"]["read"]["count"]
            .as_u64()
            .expect("patch reads")
            > 0,
        "patch reads the old files"
    );
    assert!(v["environment"]["kernel"].as_str().expect("k").len() > 2);
    assert!(v["args"]
        .as_array()
        .expect("args")
        .iter()
        .any(|a| a == "--scale"));
    let csv = std::fs::read_to_string(&csv).expect("csv");
    assert!(csv.starts_with("round,phase,tree,client,wall_mb_s"));
    assert_eq!(csv.lines().count(), 1 + 11 * 3);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("read-compiled") && stdout.contains("p99.9 us"),
        "{stdout}"
    );
    // Everything it made is gone; the directory is as it was.
    assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0);
}

#[test]
fn a_non_empty_target_is_refused_unless_allowed_and_foreign_files_stay() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("thesis.odt"), "keep").expect("foreign");
    let d = dir.path().to_str().expect("utf8");
    let o = loadgen(&["compilebench", d, "--scale", "0.01", "--phases", "create"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not empty"),
        "{}",
        text(&o)
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("ls").count(),
        1,
        "nothing created"
    );
    let o = loadgen(&[
        "compilebench",
        d,
        "--scale",
        "0.01",
        "--phases",
        "create,delete-tree",
        "--allow-nonempty",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("thesis.odt")).expect("kept"),
        "keep"
    );
    assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 1);
}

#[test]
fn bad_input_is_refused_with_exit_2() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path().to_str().expect("utf8");
    for (args, word) in [
        (
            vec!["compilebench", d, "--phases", "create,bake"],
            "unknown phase",
        ),
        (vec!["compilebench", d, "--clients", "0"], "--clients"),
        (vec!["compilebench", d, "--scale", "2"], "--scale"),
        (vec!["compilebench", "/nonexistent/dir"], "not usable"),
        (
            vec!["compilebench", d, "--runs", "3", "--phases", "create"],
            "exclude",
        ),
        (vec!["access", d, "--files", "0"], "--files"),
        (
            vec!["compilebench", d, "--hosts", "h1", "--clients", "4"],
            "--clients-per-host",
        ),
        (
            vec!["compilebench", "nfs://127.0.0.1"],
            "nfs://HOST[:PORT]/EXPORT",
        ),
        // Nothing listens on port 1: no portmapper, a clear refusal.
        (
            vec!["compilebench", "nfs://127.0.0.1:1/export"],
            "cannot mount",
        ),
        // A result file that could not be written at the end is refused at the start.
        (
            vec![
                "compilebench",
                d,
                "--phases",
                "create",
                "--json",
                "/nonexistent/r.json",
            ],
            "does not exist",
        ),
        (
            vec![
                "compilebench",
                d,
                "--phases",
                "create",
                "--csv",
                "/nonexistent/r.csv",
            ],
            "does not exist",
        ),
        (
            vec![
                "compilebench",
                d,
                "--phases",
                "create",
                "--phase-timeout",
                "0",
            ],
            "--phase-timeout",
        ),
    ] {
        let o = loadgen(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.starts_with("loadgen: error: ") && err.contains(word),
            "{args:?}: {err}"
        );
    }
    assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0);
}

#[test]
fn a_full_target_stops_cleanly_and_keeps_the_phases_measured() {
    let dir = tempfile::tempdir().expect("tmp");
    let small = dir.path().join("small");
    std::fs::create_dir(&small).expect("mkdir");
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=10m", "tmpfs"])
        .arg(&small)
        .status()
        .expect("mount");
    assert!(st.success(), "needs root for a small tmpfs");
    let json = dir.path().join("r.json");
    let o = loadgen(&[
        "compilebench",
        small.to_str().expect("utf8"),
        "--scale",
        "0.02",
        "--phases",
        "create,create,create",
        "--json",
        json.to_str().expect("utf8"),
    ]);
    let _ = Command::new("umount").arg("-l").arg(&small).status();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("filled up"),
        "{}",
        text(&o)
    );
    let v = read_json(&json);
    validate(&v);
    assert_eq!(v["complete"], false);
    assert_eq!(v["phases"][0]["name"], "create");
    assert!(
        v["phases"][0]["clients"][0]["error"].is_null(),
        "create fits"
    );
    assert!(
        v["error"]
            .as_str()
            .expect("error")
            .contains("No space left"),
        "{v}"
    );
}

#[test]
fn sweep_prints_the_clients_by_phase_table() {
    let dir = tempfile::tempdir().expect("tmp");
    let o = loadgen(&[
        "sweep",
        dir.path().to_str().expect("utf8"),
        "--clients",
        "1,3",
        "--scale",
        "0.01",
        "--phases",
        "create,read-tree,delete-tree",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    let rows: Vec<&str> = s
        .lines()
        .filter(|l| l.trim_start().starts_with(['1', '3']))
        .collect();
    // The wall rates, then the sums of the clients' rates: one row a client count each.
    assert_eq!(rows.len(), 4, "{s}");
    assert!(
        s.contains("wall MB/s") && s.contains("sum of the clients"),
        "{s}"
    );
    assert!(s.contains("create") && s.contains("read-tree"), "{s}");
}

#[test]
fn access_creates_and_removes_empty_files() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = tempfile::tempdir().expect("out");
    let json = out.path().join("a.json");
    let o = loadgen(&[
        "access",
        dir.path().to_str().expect("utf8"),
        "--files",
        "500",
        "--clients",
        "2",
        "--json",
        json.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v = read_json(&json);
    validate(&v);
    assert_eq!(v["phases"][0]["files"], 1000);
    assert_eq!(v["phases"][1]["files"], 1000);
    assert_eq!(v["phases"][1]["latency"]["unlink"]["count"], 1000);
    assert!(v["phases"][0]["files_per_s"].as_f64().expect("rate") > 0.0);
    assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0);
}

#[test]
fn a_killed_run_keeps_the_phases_it_finished() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = tempfile::tempdir().expect("out");
    let json = out.path().join("r.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args([
            "compilebench",
            dir.path().to_str().expect("utf8"),
            "--scale",
            "0.05",
            "--phases",
            "create,stat-tree,stat-tree,stat-tree,stat-tree,stat-tree,stat-tree,stat-tree,stat-tree,read-tree,read-tree,read-tree,read-tree,read-tree,read-tree,read-tree,read-tree,read-tree,read-tree",
            "--json",
            json.to_str().expect("utf8"),
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let start = std::time::Instant::now();
    loop {
        let phases = std::fs::read(&json)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["phases"].as_array().map(|a| a.len()))
            .unwrap_or(0);
        if phases >= 2 {
            break;
        }
        assert!(start.elapsed().as_secs() < 60, "no phase written in time");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    let v = read_json(&json);
    validate(&v);
    assert_eq!(v["complete"], false);
    assert_eq!(v["phases"][0]["name"], "create");
    assert!(v["phases"][0]["files"].as_u64().expect("files") > 0);
    // The next run finds what the killed one left, says so and removes it.
    let d = dir.path().to_str().expect("utf8");
    let o = loadgen(&["compilebench", d, "--scale", "0.01", "--phases", "create"]);
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("removed") && err.contains("killed"), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0);
    // A run kept on purpose is not a leftover: the next run leaves it and says so.
    let o = loadgen(&[
        "compilebench",
        d,
        "--scale",
        "0.01",
        "--phases",
        "create",
        "--keep",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = loadgen(&["compilebench", d, "--scale", "0.01", "--phases", "create"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("kept by an earlier run"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 1);
}

/// Run as root, loadgen refuses a directory another user could change (that user could
/// swap its run directory for a symbolic link and steer root's writes and deletes), makes
/// nothing there, and accepts a sticky one (as /tmp); a leftover "run directory" another
/// user made, with a marker naming this host and a dead process, is left alone.
#[test]
fn root_never_works_where_another_user_can_steer_it() {
    use std::os::unix::fs::{chown, PermissionsExt};
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        e2e::skip("the check applies to root only");
        return;
    }
    let nobody = 65534;
    let nothing_in = |d: &Path| std::fs::read_dir(d).expect("ls").count() == 0;
    // Refused as bad input (exit 2), saying `says`.
    let refused = |o: &std::process::Output, says: &str| {
        assert_eq!(o.status.code(), Some(2), "{}", text(o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(says),
            "{}",
            text(o)
        );
    };
    let top = tempfile::tempdir().expect("tmp");
    let run = |d: &Path, extra: &[&str]| {
        let mut args = vec![
            "compilebench",
            d.to_str().expect("utf8"),
            "--scale",
            "0.01",
            "--phases",
            "create",
        ];
        args.extend_from_slice(extra);
        loadgen(&args)
    };
    // Owned by another user; then root's but writable by everyone (no sticky bit); then a
    // safe directory below one another user owns.
    let owned = top.path().join("owned");
    std::fs::create_dir(&owned).expect("mkdir");
    chown(&owned, Some(nobody), Some(nobody)).expect("chown");
    let open = top.path().join("open");
    std::fs::create_dir(&open).expect("mkdir");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let below = owned.join("bench");
    std::fs::create_dir(&below).expect("mkdir");
    for (d, culprit) in [(&owned, &owned), (&open, &open), (&below, &owned)] {
        let o = run(d, &[]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!(
                "{} can be changed by a user other than root",
                culprit.display()
            )),
            "{err}"
        );
    }
    assert!(nothing_in(&open), "nothing made");
    assert!(nothing_in(&below), "nothing made");
    // A symbolic link on the way that another user owns (a trailing slash follows it),
    // and a directory whose ACL lets another user write.
    let safe = top.path().join("safe");
    std::fs::create_dir(&safe).expect("mkdir");
    let link = top.path().join("link");
    std::os::unix::fs::symlink(&safe, &link).expect("ln -s");
    std::os::unix::fs::lchown(&link, Some(nobody), Some(nobody)).expect("lchown");
    let acl = top.path().join("acl");
    std::fs::create_dir(&acl).expect("mkdir");
    let set = Command::new("setfacl")
        .args(["-m", "u:65534:rwx"])
        .arg(&acl)
        .status()
        .expect("setfacl (acl)");
    assert!(set.success());
    for (d, says) in [
        (
            format!("{}/", link.display()),
            "is a symbolic link of uid 65534",
        ),
        (acl.display().to_string(), "with an ACL"),
    ] {
        let o = run(Path::new(&d), &[]);
        refused(&o, says);
    }
    assert!(nothing_in(&safe), "nothing made");
    assert!(nothing_in(&acl), "nothing made");
    // Results are never written through a link someone put at their name (or at the
    // name of a temporary file), and a user's own `.tmp` file stays.
    let results = top.path().join("results");
    std::fs::create_dir(&results).expect("mkdir");
    let precious = top.path().join("precious");
    std::fs::write(&precious, "root's\n").expect("write");
    std::os::unix::fs::symlink(&precious, results.join("r.json")).expect("ln -s");
    std::os::unix::fs::symlink(&precious, results.join("r.tmp")).expect("ln -s");
    std::fs::write(results.join("r.csv.tmp"), "notes\n").expect("write");
    let o = run(
        &safe,
        &[
            "--json",
            results.join("r.json").to_str().expect("utf8"),
            "--csv",
            results.join("r.csv").to_str().expect("utf8"),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(&precious).expect("read"),
        "root's\n"
    );
    assert!(std::fs::symlink_metadata(results.join("r.json"))
        .expect("stat")
        .is_file());
    validate(&read_json(&results.join("r.json")));
    assert_eq!(
        std::fs::read_to_string(results.join("r.csv.tmp")).expect("read"),
        "notes\n"
    );
    // A report into another user's directory is refused.
    let o = loadgen(&[
        "report",
        results.join("r.json").to_str().expect("utf8"),
        "-o",
        owned.join("report").to_str().expect("utf8"),
    ]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("can be changed by a user other than root"),
        "{}",
        text(&o)
    );
    assert!(!owned.join("report").exists(), "nothing made");
    // A root-owned link that leads through another user's link is theirs to point.
    let theirs = top.path().join("theirs");
    std::os::unix::fs::symlink(&safe, &theirs).expect("ln -s");
    std::os::unix::fs::lchown(&theirs, Some(nobody), Some(nobody)).expect("lchown");
    let chain = top.path().join("chain");
    std::os::unix::fs::symlink(&theirs, &chain).expect("ln -s");
    let o = run(Path::new(&format!("{}/", chain.display())), &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("is a symbolic link of uid 65534"),
        "{}",
        text(&o)
    );
    // Results into a directory another user can change: refused, nothing written.
    let o = run(
        &safe,
        &["--json", owned.join("r.json").to_str().expect("utf8")],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!owned.join("r.json").exists());
    assert!(nothing_in(&safe), "nothing made");
    // Started with umask 000, what loadgen makes is still only its own to change.
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "umask 000; exec {} compilebench {} --scale 0.01 --phases create --keep",
            env!("CARGO_BIN_EXE_loadgen"),
            safe.display()
        ))
        .output()
        .expect("sh");
    assert!(o.status.success(), "{}", text(&o));
    for e in std::fs::read_dir(&safe).expect("ls") {
        let p = e.expect("entry").path();
        let mode = std::fs::metadata(&p).expect("stat").permissions().mode();
        assert_eq!(mode & 0o022, 0, "{} is {mode:o}", p.display());
        std::fs::remove_dir_all(&p).expect("rm kept run");
    }
    // login-storm: root makes homes on --share and mounts in --work.
    let work = owned.join("work");
    for (share, work, says) in [(&owned, &safe, "--share: "), (&safe, &work, "--work: ")] {
        let o = loadgen(&[
            "login-storm",
            "--share",
            share.to_str().expect("utf8"),
            "--work",
            work.to_str().expect("utf8"),
            "--users",
            "1",
            "--no-meter",
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!("{says}{} can be changed", owned.display())),
            "{err}"
        );
    }
    assert!(!work.exists(), "--work not made");
    assert!(nothing_in(&safe), "nothing made");
    // Sticky and world-writable, as /tmp: no user can rename root's entries there.
    let sticky = top.path().join("sticky");
    std::fs::create_dir(&sticky).expect("mkdir");
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    // Another user's planted leftover with a marker that claims this host and a dead run.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let planted = sticky.join("loadgen-run-1-999999999");
    std::fs::create_dir(&planted).expect("mkdir");
    std::fs::write(
        planted.join(".loadgen-run"),
        format!(
            "{{\"tool\":\"loadgen\",\"pid\":999999999,\"host\":\"{}\",\"kept\":false}}",
            host.trim()
        ),
    )
    .expect("marker");
    std::fs::write(planted.join("precious"), "theirs\n").expect("write");
    chown(&planted, Some(nobody), Some(nobody)).expect("chown");
    // And another user's leftover whose marker is a FIFO: the scan does not hang on it.
    let fifo_run = sticky.join("loadgen-run-1-999999998");
    std::fs::create_dir(&fifo_run).expect("mkdir");
    let made = Command::new("mkfifo")
        .arg(fifo_run.join(".loadgen-run"))
        .status()
        .expect("mkfifo");
    assert!(made.success());
    chown(&fifo_run, Some(nobody), Some(nobody)).expect("chown");
    let o = Command::new("timeout")
        .args(["-s", "KILL", "120", env!("CARGO_BIN_EXE_loadgen")])
        .args(["compilebench", sticky.to_str().expect("utf8")])
        .args(["--scale", "0.01", "--phases", "create", "--allow-nonempty"])
        .output()
        .expect("timeout");
    assert!(o.status.success(), "{}", text(&o));
    std::fs::remove_dir_all(&fifo_run).expect("rm");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("is not this user's own directory"),
        "{}",
        text(&o)
    );
    assert_eq!(
        std::fs::read_to_string(planted.join("precious")).expect("still there"),
        "theirs\n"
    );
    let names: Vec<_> = std::fs::read_dir(&sticky)
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(
        names,
        vec![planted.file_name().expect("name").to_owned()],
        "the run cleaned up its own"
    );
}

/// Runs the default phases with two clients on `target` and checks that every file written
/// is read back and deleted, with non-zero rates; returns the JSON report.
fn compilebench_accounts(target: &str, extra: &[&str]) -> serde_json::Value {
    let out = tempfile::tempdir().expect("out");
    let json = out.path().join("r.json");
    let mut args = vec![
        "compilebench",
        target,
        "--clients",
        "2",
        "--scale",
        "0.02",
        "--phases",
        "create,compile,read-compiled,delete-compiled",
        "--json",
        json.to_str().expect("utf8"),
    ];
    args.extend_from_slice(extra);
    let o = loadgen(&args);
    assert!(o.status.success(), "{}", text(&o));
    let v = read_json(&json);
    validate(&v);
    assert_eq!(v["complete"], true);
    let phase = |name: &str| {
        v["phases"]
            .as_array()
            .expect("phases")
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .clone()
    };
    let files = |name: &str| phase(name)["files"].as_u64().expect("files");
    let (create, compile, read, delete) = (
        files("create"),
        files("compile"),
        files("read-compiled"),
        files("delete-compiled"),
    );
    assert!(create > 0 && compile > 0);
    assert_eq!(
        read,
        create + compile,
        "read-compiled reads every file written"
    );
    assert_eq!(
        delete,
        create + compile,
        "delete-compiled deletes every file written"
    );
    assert!(phase("delete-compiled")["seconds"].as_f64().expect("s") > 0.0);
    for name in ["create", "compile", "read-compiled"] {
        let sum = phase(name)["aggregate_mb_s"].as_f64().expect("mb");
        let wall = phase(name)["wall_mb_s"].as_f64().expect("wall");
        assert!(sum > 0.0 && wall > 0.0, "{name}");
        assert!(
            wall <= sum * 1.001,
            "{name}: the wall-clock rate never exceeds the sum of rates"
        );
    }
    v
}

/// The default workload with two clients accounts for every file and measures something.
/// Runs in a temporary directory, or in $LOADGEN_TEST_DIR (scripts/test points it at a real
/// GlusterFS volume from deploy/testbed).
#[test]
fn compilebench_accounts_for_every_file() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = match std::env::var_os("LOADGEN_TEST_DIR") {
        Some(d) => {
            let d = std::path::PathBuf::from(d);
            std::fs::create_dir_all(&d).expect("test dir");
            d
        }
        None => tmp.path().to_path_buf(),
    };
    let v = compilebench_accounts(dir.to_str().expect("utf8"), &["--allow-nonempty"]);
    assert!(v["environment"]["fs_type"].is_string());
    let left: Vec<_> = std::fs::read_dir(&dir)
        .expect("ls")
        .map(|e| e.expect("e").file_name())
        .filter(|n| n.to_string_lossy().starts_with("loadgen-run-"))
        .collect();
    assert!(left.is_empty(), "run directory left behind: {left:?}");
}

/// The stream on the test directory: in a temporary directory, or in $LOADGEN_TEST_DIR
/// (scripts/test points it at each testbed's volume: GlusterFS, MooseFS).
#[test]
fn stream_accounts_for_every_byte() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = match std::env::var_os("LOADGEN_TEST_DIR") {
        Some(d) => {
            let d = std::path::PathBuf::from(d).join("stream");
            std::fs::create_dir_all(&d).expect("test dir");
            d
        }
        None => tmp.path().to_path_buf(),
    };
    let out = tempfile::tempdir().expect("out");
    let json = out.path().join("s.json");
    let o = loadgen(&[
        "stream",
        dir.to_str().expect("utf8"),
        "--clients",
        "2",
        "--size",
        "16M",
        "--block",
        "1M",
        "--fsync",
        "--json",
        json.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    check_stream(&read_json(&json), 2, 16 << 20, 1 << 20);
    assert_eq!(
        std::fs::read_dir(&dir).expect("ls").count(),
        0,
        "nothing left"
    );
}

#[test]
fn report_draws_charts_and_a_page_from_results() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = tempfile::tempdir().expect("out");
    let mut files = Vec::new();
    for (label, clients) in [("alpha", "1"), ("alpha", "2"), ("beta", "1"), ("beta", "2")] {
        let json = out.path().join(format!("{label}-{clients}.json"));
        let o = loadgen(&[
            "compilebench",
            dir.path().to_str().expect("utf8"),
            "--scale",
            "0.01",
            "--clients",
            clients,
            // The phases the charts below name; the page cache kept (the report is
            // tested, not the run).
            "--phases",
            "create,read-compiled",
            "--no-drop-caches",
            "--label",
            label,
            "--json",
            json.to_str().expect("utf8"),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        files.push(json);
    }
    let report = out.path().join("report");
    let mut args = vec!["report".to_string()];
    args.extend(files.iter().map(|f| f.display().to_string()));
    args.extend(["-o".to_string(), report.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = loadgen(&args);
    assert!(o.status.success(), "{}", text(&o));
    for stem in [
        "throughput-1-clients",
        "throughput-2-clients",
        "latency-create-1-clients",
        "latency-read-compiled-2-clients",
        "scaling-create",
    ] {
        let png = std::fs::read(report.join(format!("{stem}.png"))).expect("png");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{stem}.png is a PNG");
        assert!(png.len() > 5000, "{stem}.png has content");
        let svg = std::fs::read_to_string(report.join(format!("{stem}.svg"))).expect("svg");
        assert!(
            svg.contains("<svg") && svg.contains("alpha") && svg.contains("beta"),
            "{stem}.svg"
        );
    }
    let html = std::fs::read_to_string(report.join("index.html")).expect("html");
    assert!(html.contains("<h3>alpha</h3>") && html.contains("<h3>beta</h3>"));
    assert!(html.contains("throughput-2-clients.svg"));
    // A missing font is a clear input error.
    let o = loadgen(&[
        "report",
        &files[0].display().to_string(),
        "-o",
        &report.display().to_string(),
        "--font",
        "/nonexistent.ttf",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("fonts-dejavu-core"),
        "{}",
        text(&o)
    );
    // A file that is not a result is refused.
    let bogus = out.path().join("bogus.json");
    std::fs::write(&bogus, "{\"x\":1}").expect("w");
    let o = loadgen(&[
        "report",
        &bogus.display().to_string(),
        "-o",
        &report.display().to_string(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// A multi-host run through a stand-in for ssh (tests/fake-ssh runs the agent here): every
/// host's clients are counted, their histograms merged exactly, their trees removed.
#[test]
fn hosts_run_agents_behind_one_barrier_and_merge_their_results() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = tempfile::tempdir().expect("out");
    let json = out.path().join("m.json");
    // Real hosts when scripts/test brought up deploy/testbed hosts (three network
    // namespaces with sshd): $LOADGEN_TEST_SSH is the ssh command reaching h1..h3.
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-ssh");
    let ssh = std::env::var("LOADGEN_TEST_SSH").unwrap_or_else(|_| fake.display().to_string());
    let o = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args([
            "compilebench",
            dir.path().to_str().expect("utf8"),
            "--hosts",
            "h1,h2,h3",
            "--clients-per-host",
            "2",
            "--ssh-command",
            &ssh,
            "--scale",
            "0.01",
            "--phases",
            "create,read-tree",
            "--json",
            json.to_str().expect("utf8"),
        ])
        // With the stand-in: h2's agent starts a second late, its clock a second behind.
        .env("LOADGEN_FAKE_SSH_LATE", "h2")
        .output()
        .expect("run loadgen");
    assert!(o.status.success(), "{}", text(&o));
    let v = read_json(&json);
    validate(&v);
    assert_eq!(v["config"]["clients"], 6);
    assert_eq!(v["complete"], true);
    let create = &v["phases"][0];
    assert_eq!(create["name"], "create");
    let clients = create["clients"].as_array().expect("clients");
    let ids: Vec<u64> = clients
        .iter()
        .map(|c| c["client"].as_u64().expect("id"))
        .collect();
    assert_eq!(ids, vec![0, 1, 2, 3, 4, 5]);
    let per_client = clients[0]["files"].as_u64().expect("files");
    assert!(clients
        .iter()
        .all(|c| c["files"].as_u64() == Some(per_client)));
    assert_eq!(create["files"].as_u64(), Some(6 * per_client));
    // The hosts' clocks are put on the coordinator's (each agent's clock starts with its
    // process): released together, every client started before the first one ended.
    let starts = clients
        .iter()
        .map(|c| c["start_s"].as_f64().expect("start"));
    let ends = clients.iter().map(|c| c["end_s"].as_f64().expect("end"));
    let (last_start, first_end) = (starts.fold(0.0, f64::max), ends.fold(f64::MAX, f64::min));
    assert!(
        last_start < first_end,
        "{last_start} >= {first_end}: {create}"
    );
    assert_eq!(
        create["latency"]["open"]["count"].as_u64(),
        Some(6 * per_client),
        "merged exactly"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("ls").count(),
        0,
        "agents clean up"
    );
    // The stream over the same hosts: each host's client writes and reads its file.
    let json = out.path().join("s.json");
    let o = loadgen(&[
        "stream",
        dir.path().to_str().expect("utf8"),
        "--hosts",
        "h1,h2,h3",
        "--ssh-command",
        &ssh,
        "--size",
        "4M",
        "--block",
        "256K",
        "--json",
        json.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    check_stream(&read_json(&json), 3, 4 << 20, 256 << 10);
    assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0);
    // A host that cannot be reached is refused before the run, named.
    let o = loadgen(&[
        "compilebench",
        dir.path().to_str().expect("utf8"),
        "--hosts",
        "nowhere",
        "--ssh-command",
        "/bin/false",
        "--scale",
        "0.01",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("nowhere"),
        "{}",
        text(&o)
    );
}

/// Every regular file under `root` with its content, by path relative to the single
/// `loadgen-run-*` directory in it.
fn run_tree(root: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let runs: Vec<_> = std::fs::read_dir(root)
        .expect("ls")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("loadgen-run-"))
        })
        .collect();
    assert_eq!(runs.len(), 1, "one run directory in {}", root.display());
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![runs[0].clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("ls").filter_map(Result::ok) {
            let p = e.path();
            let t = e.file_type().expect("type");
            if t.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n != ".loadgen-run") {
                let rel = p.strip_prefix(&runs[0]).expect("inside");
                out.insert(rel.display().to_string(), std::fs::read(&p).expect("read"));
            }
        }
    }
    out
}

/// loadgen speaks NFSv3 itself (no kernel mount): the tree it writes through an NFS export
/// is byte for byte the tree it writes in a local directory, and a full run accounts for
/// every file. Needs a server: scripts/test starts NFS-Ganesha from deploy/testbed and sets
/// LOADGEN_TEST_NFS (the URL) and LOADGEN_TEST_NFS_EXPORT (the exported directory, to look
/// at what reached the server).
#[test]
fn nfs_target_writes_the_same_tree_as_a_local_run() {
    let (Some(url), Some(export)) = (
        std::env::var_os("LOADGEN_TEST_NFS"),
        std::env::var_os("LOADGEN_TEST_NFS_EXPORT"),
    ) else {
        e2e::skip("LOADGEN_TEST_NFS and LOADGEN_TEST_NFS_EXPORT are not set (scripts/test sets them for the NFS-Ganesha testbed)");
        return;
    };
    let url = url.to_str().expect("utf8");
    let export = Path::new(&export);
    assert_eq!(
        std::fs::read_dir(export).expect("export").count(),
        0,
        "the export starts empty"
    );
    let local = tempfile::tempdir().expect("tmp");
    let args = |target: &str| {
        vec![
            "compilebench".to_string(),
            target.to_string(),
            "--clients".into(),
            "2".into(),
            "--scale".into(),
            "0.02".into(),
            "--phases".into(),
            "create,compile,patch".into(),
            "--write-size".into(),
            "10000".into(),
            "--keep".into(),
        ]
    };
    for target in [url, local.path().to_str().expect("utf8")] {
        let a = args(target);
        let o = loadgen(&a.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "{target}: {}", text(&o));
    }
    let over_nfs = run_tree(export);
    let on_disk = run_tree(local.path());
    assert!(on_disk.len() > 100, "{} files", on_disk.len());
    assert_eq!(
        over_nfs.keys().collect::<Vec<_>>(),
        on_disk.keys().collect::<Vec<_>>(),
        "same names"
    );
    for (name, data) in &on_disk {
        assert!(over_nfs[name] == *data, "{name} differs over NFS");
    }
    for e in std::fs::read_dir(export)
        .expect("ls")
        .filter_map(Result::ok)
    {
        std::fs::remove_dir_all(e.path()).expect("clean the export");
    }
    // The stream through NFS: every byte written reaches the server and is read back.
    let json = local.path().join("s.json");
    let o = loadgen(&[
        "stream",
        url,
        "--clients",
        "2",
        "--size",
        "8M",
        "--block",
        "1M",
        "--json",
        json.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let runs = read_json(&json);
    check_stream(&runs, 2, 8 << 20, 1 << 20);
    assert_eq!(std::fs::read_dir(export).expect("ls").count(), 0);
    // The default phases end to end: every file written is read back and deleted.
    let v = compilebench_accounts(url, &[]);
    assert_eq!(v["environment"]["fs_type"], "nfs3");
    assert_eq!(
        std::fs::read_dir(export).expect("ls").count(),
        0,
        "nothing left on the server"
    );
}

/// login-storm without ccfs needs no ccfs at all (--no-meter): its JSON follows
/// schema/login-storm-v2.schema.json, and every user's home was written.
/// A storm's homes kept on purpose (--keep) are no leftovers: the next storm leaves them
/// and says so.
#[test]
fn a_kept_storm_is_left_by_the_next() {
    let share = tempfile::tempdir().expect("share");
    let work = tempfile::tempdir().expect("work");
    let storm = |keep: bool| {
        let mut args = vec![
            "login-storm",
            "--share",
            share.path().to_str().expect("utf8"),
            "--work",
            work.path().to_str().expect("utf8"),
            "--users",
            "1",
            "--session",
            "0",
            "--no-meter",
        ];
        if keep {
            args.push("--keep");
        }
        loadgen(&args)
    };
    let o = storm(true);
    assert!(o.status.success(), "{}", text(&o));
    let kept: Vec<_> = std::fs::read_dir(share.path())
        .expect("ls")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let o = storm(false);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("kept by an earlier storm"),
        "{}",
        text(&o)
    );
    assert!(kept[0].is_dir(), "the kept homes stay");
}

#[test]
fn login_storm_json_matches_its_schema() {
    let share = tempfile::tempdir().expect("share");
    let work = tempfile::tempdir().expect("work");
    let out = tempfile::tempdir().expect("out");
    let json = out.path().join("s.json");
    // This test process stands in for a server and for the share's client (lines as
    // deploy/testbed keeps them).
    let pids = out.path().join("pids");
    std::fs::write(
        &pids,
        format!("{} 12345 cargo test\n\n", std::process::id()),
    )
    .expect("pids");
    let o = loadgen(&[
        "login-storm",
        "--server-pids-file",
        pids.to_str().expect("utf8"),
        "--client-pids-file",
        pids.to_str().expect("utf8"),
        "--cpu-window",
        "1",
        "--share",
        share.path().to_str().expect("utf8"),
        "--work",
        work.path().to_str().expect("utf8"),
        "--users",
        "3",
        "--session",
        "0",
        "--no-meter",
        "--json",
        json.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let all = read_json(&json);
    validate_against("login-storm-v2.schema.json", &all);
    let runs = all.as_array().expect("a list of runs");
    assert_eq!(runs.len(), 1, "one timed run, no metered one");
    let v = &runs[0];
    assert_eq!(v["complete"], true);
    assert_eq!(v["per_user"].as_array().expect("users").len(), 3);
    for u in v["per_user"].as_array().expect("users") {
        assert!(u["login_s"].as_f64().expect("login") > 0.0);
        assert!(u["bytes_written"].as_u64().expect("bytes") > 100_000, "{u}");
    }
    assert!(v["share_login"].is_null(), "no meter, no counts");
    for k in ["server_cpu_s", "client_cpu_s"] {
        assert!(v[k].as_f64().is_some_and(|c| c >= 0.0), "{k}: {}", v[k]);
    }
    assert!(
        v["cpu_window_s"].as_f64().is_some_and(|w| w >= 1.0),
        "the window is at least the one asked for: {}",
        v["cpu_window_s"]
    );
    // A pids file that is not one refuses the run and makes nothing.
    std::fs::write(&pids, "glusterd 12\n").expect("pids");
    let work2 = work.path().join("fresh");
    let o = loadgen(&[
        "login-storm",
        "--share",
        share.path().to_str().expect("utf8"),
        "--work",
        work2.to_str().expect("utf8"),
        "--no-meter",
        "--server-pids-file",
        pids.to_str().expect("utf8"),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not start with a process id"));
    assert!(!work2.exists(), "nothing made");
    assert_eq!(std::fs::read_dir(share.path()).expect("ls").count(), 0);
    // The published results (with ccfs, share-side counts, server CPU) follow it too.
    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("../doc/results");
    let mut seen = 0;
    for dir in std::fs::read_dir(&results).expect("doc/results").flatten() {
        if !dir.file_name().to_string_lossy().ends_with("-login-storm") {
            continue;
        }
        for f in std::fs::read_dir(dir.path()).expect("ls").flatten() {
            if f.path().extension().is_some_and(|e| e == "json") {
                let v: serde_json::Value = read_json(&f.path());
                for run in v.as_array().cloned().unwrap_or_else(|| vec![v.clone()]) {
                    match run["schema"].as_str() {
                        Some("loadgen-login-storm/1") => {
                            validate_against("login-storm-v1.schema.json", &run)
                        }
                        _ => validate_against(
                            "login-storm-v2.schema.json",
                            &serde_json::Value::Array(vec![run]),
                        ),
                    }
                    seen += 1;
                }
            }
        }
    }
    assert!(seen >= 3, "{seen} published storms");
}

/// Checks a stream's JSON: every phase moved `clients` x `size` bytes in `size / block`
/// calls a client, and the file is gone at the end.
fn check_stream(v: &serde_json::Value, clients: u64, size: u64, block: u64) {
    validate(v);
    assert_eq!(v["complete"], true, "{v}");
    assert_eq!(v["config"]["mode"], "stream");
    let names: Vec<&str> = v["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .map(|p| p["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["write", "rewrite", "read", "reread"]);
    for p in v["phases"].as_array().expect("phases") {
        let name = p["name"].as_str().expect("name");
        assert_eq!(p["bytes"].as_u64(), Some(clients * size), "{name}");
        assert!(p["wall_mb_s"].as_f64().expect("rate") > 0.0, "{name}");
        let op = if name.contains("write") {
            "write"
        } else {
            "read"
        };
        assert_eq!(
            p["latency"][op]["count"].as_u64(),
            Some(clients * size.div_ceil(block)),
            "{name}: one call a block"
        );
    }
    assert_eq!(v["summary"].as_array().expect("summary").len(), 4);
}

#[test]
fn stream_writes_rewrites_and_reads_one_file_a_client() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = tempfile::tempdir().expect("out");
    let json = out.path().join("s.json");
    let csv = out.path().join("s.csv");
    let d = dir.path().to_str().expect("utf8");
    let o = loadgen(&[
        "stream",
        d,
        "--clients",
        "1,3",
        "--size",
        "8M",
        "--block",
        "64K",
        "--fsync",
        "--json",
        json.to_str().expect("utf8"),
        "--csv",
        csv.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let runs = read_json(&json);
    let runs = runs.as_array().expect("one run a client count");
    assert_eq!(runs.len(), 2);
    check_stream(&runs[0], 1, 8 << 20, 64 << 10);
    check_stream(&runs[1], 3, 8 << 20, 64 << 10);
    assert_eq!(runs[1]["phases"][0]["latency"]["fsync"]["count"], 3);
    let csv = std::fs::read_to_string(&csv).expect("csv");
    assert!(csv.starts_with("clients,round,phase"), "{csv}");
    assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0);
    // O_DIRECT where the filesystem has it; refused when the block is not aligned.
    let json = out.path().join("d.json");
    let o = loadgen(&[
        "stream",
        d,
        "--size",
        "4M",
        "--block",
        "128K",
        "--direct",
        "--json",
        json.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v = read_json(&json);
    check_stream(&v, 1, 4 << 20, 128 << 10);
    assert_eq!(v["config"]["direct"], true);
    for (args, word) in [
        (vec!["stream", d, "--size", "0"], "--size"),
        (vec!["stream", d, "--size", "1X"], "--size"),
        (
            vec!["stream", d, "--block", "1000", "--direct"],
            "multiple of 4K",
        ),
        (vec!["stream", d, "--clients", "0"], "--clients"),
    ] {
        let o = loadgen(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(word),
            "{}",
            text(&o)
        );
    }
    assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0);
}

/// A run on a terminal shows a progress bar (round, phase, files done of the total, the
/// rate, the time left); --quiet, or output to a pipe, shows none.
#[test]
fn a_terminal_gets_a_progress_bar_and_a_pipe_or_quiet_does_not() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path().to_str().expect("utf8");
    let cmd = |extra: &str| {
        format!(
            "{} compilebench {d} --scale 0.1 --phases create,read-tree --no-sync{extra}",
            env!("CARGO_BIN_EXE_loadgen")
        )
    };
    // `script` gives the run a terminal and copies what it shows to stdout.
    let on_tty = |extra: &str| {
        let o = Command::new("script")
            .args(["-qec", &cmd(extra), "/dev/null"])
            .output()
            .expect("script (util-linux)");
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let shown = on_tty("");
    assert!(
        shown.contains("round 1/2") && shown.contains("create") && shown.contains("ETA"),
        "{shown}"
    );
    assert!(shown.contains("files"), "{shown}");
    assert!(!on_tty(" --quiet").contains("ETA"));
    let o = loadgen(&[
        "compilebench",
        d,
        "--scale",
        "0.02",
        "--phases",
        "create",
        "--no-sync",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!String::from_utf8_lossy(&o.stderr).contains("ETA"));
}

/// What the record says was done is what was done: as another user than root the caches
/// cannot be dropped (the JSON says false, with a warning); --read-other with one client
/// on each host reads nothing of another's (false, with a warning).
#[test]
fn the_record_says_what_was_really_done() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = tempfile::tempdir().expect("out");
    for d in [dir.path(), out.path()] {
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .expect("chmod");
    }
    let json = out.path().join("n.json");
    // A copy the other user can run wherever the checkout is (its directory may be closed).
    let bin = out.path().join("loadgen");
    std::fs::copy(env!("CARGO_BIN_EXE_loadgen"), &bin).expect("copy loadgen");
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .args(["compilebench", dir.path().to_str().expect("utf8")])
        .args(["--scale", "0.01", "--phases", "create", "--json"])
        .arg(&json)
        .output()
        .expect("setpriv (util-linux)");
    assert!(o.status.success(), "{}", text(&o));
    let v = read_json(&json);
    validate(&v);
    assert_eq!(v["config"]["drop_caches"], false);
    assert_eq!(v["config"]["sync"], true);
    assert!(
        v["warnings"][0]
            .as_str()
            .unwrap_or("")
            .contains("needs root"),
        "{v}"
    );
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-ssh");
    // Directories of root's own (root refuses ones any user may change).
    let out = tempfile::tempdir().expect("out");
    let json = out.path().join("r.json");
    let dir = tempfile::tempdir().expect("tmp");
    let o = loadgen(&[
        "compilebench",
        dir.path().to_str().expect("utf8"),
        "--hosts",
        "h1,h2",
        "--ssh-command",
        fake.to_str().expect("utf8"),
        "--scale",
        "0.01",
        "--phases",
        "create,read-tree",
        "--read-other",
        "--json",
        json.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v = read_json(&json);
    assert_eq!(v["config"]["read_other"], false);
    assert!(
        v["warnings"].as_array().expect("w").iter().any(|w| w
            .as_str()
            .is_some_and(|w| w.contains("--read-other needs two"))),
        "{v}"
    );
}

/// What a file holds depends on the file only, not on which worker thread wrote it or what
/// that worker read before (a patch reads a file whole before it writes): the same run
/// with one worker thread and with one per client writes the same bytes. (The NFS test
/// compares a tree written through NFS with one written locally.)
#[test]
fn a_files_bytes_do_not_depend_on_the_worker_that_wrote_it() {
    let trees: Vec<_> = ["1", "2"]
        .iter()
        .map(|threads| {
            let dir = tempfile::tempdir().expect("tmp");
            let o = loadgen(&[
                "compilebench",
                dir.path().to_str().expect("utf8"),
                "--clients",
                "2",
                "--threads",
                threads,
                "--scale",
                "0.02",
                "--phases",
                "create,compile,patch,patch",
                "--write-size",
                "10000",
                "--no-sync",
                "--keep",
            ]);
            assert!(o.status.success(), "{}", text(&o));
            (run_tree(dir.path()), dir)
        })
        .collect();
    let (one, two) = (&trees[0].0, &trees[1].0);
    assert!(one.len() > 100, "{} files", one.len());
    assert_eq!(
        one.keys().collect::<Vec<_>>(),
        two.keys().collect::<Vec<_>>()
    );
    for (name, data) in one {
        assert!(
            two[name] == *data,
            "{name} differs between 1 and 2 worker threads"
        );
    }
}
