//! A class across hosts (`login-storm --hosts`), each host's agent started through a
//! stand-in for ssh that runs it here: every host's users play their part behind the
//! same gates, the coordinator reads the server at those gates, and the class's report
//! merges the hosts' parts with each host's beside it.

use e2e::text;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn loadgen_bin() -> PathBuf {
    e2e::ccfs_bin().with_file_name("loadgen")
}

fn fake_ssh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../loadgen/tests/fake-ssh")
}

fn storm(share: &Path, work: &Path, extra: &[&str]) -> Output {
    Command::new(loadgen_bin())
        .arg("login-storm")
        .arg("--share")
        .arg(share)
        .arg("--work")
        .arg(work)
        .arg("--ssh-command")
        .arg(fake_ssh())
        .args(extra)
        .output()
        .expect("run loadgen")
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn a_class_across_hosts_plays_every_host_s_part_behind_the_same_gates() {
    let share = e2e::share_dir();
    let work = tempfile::tempdir().expect("work");
    let scratch = tempfile::tempdir().expect("scratch");
    let profile = scratch.path().join("profile.txt");
    std::fs::write(
        &profile,
        "[home]\nfile .config/app.conf 10\nfile Documents/a.txt 50\n[login]\n\
         replace .config/app.conf 123\n[session 1]\nappend .history 3\n[logout]\n",
    )
    .expect("profile");
    // Each reading of the server adds 5 calls: every part of a run sees exactly 5.
    let state = scratch.path().join("n");
    let counts = format!(
        "n=$(cat {s} 2>/dev/null || echo 0); n=$((n+5)); echo $n > {s}; \
         printf '{{\"fops\":{{\"WRITE\":{{\"calls\":%d,\"latency_us\":%d}}}},\"bytes_read\":0,\"bytes_written\":%d}}' $n $((n*10)) $((n*100))",
        s = state.display()
    );
    let json = scratch.path().join("storm.json");
    let remounts = scratch.path().join("remounts");
    let remount = format!("echo {{host}} >> {}", remounts.display());
    let o = storm(
        share.path(),
        work.path(),
        &[
            "--hosts",
            "h1,h2",
            "--users-per-host",
            "2",
            "--compare",
            "--session",
            "1",
            "--profile",
            profile.to_str().expect("utf8"),
            "--server-counts",
            &counts,
            // Several words and a redirection, passed to each host's shell as one word;
            // `{host}` is the host's name.
            "--remount",
            &remount,
            "--json",
            json.to_str().expect("utf8"),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let runs = e2e::read_json(&json);
    let runs = runs.as_array().expect("runs");
    assert_eq!(runs.len(), 4, "a timed and a metered run a mode");
    for r in runs {
        assert_eq!(r["users"], 4, "{r}");
        let users: Vec<u64> = r["per_user"]
            .as_array()
            .expect("per user")
            .iter()
            .map(|u| u["user"].as_u64().unwrap_or(99))
            .collect();
        assert_eq!(users, [0, 1, 2, 3], "every user of the class, once");
        let hosts = r["hosts"].as_array().expect("hosts");
        assert_eq!(hosts.len(), 2);
        assert_eq!(
            (&hosts[0]["host"], &hosts[0]["first_user"]),
            (&"h1".into(), &0.into())
        );
        assert_eq!(
            (&hosts[1]["host"], &hosts[1]["first_user"]),
            (&"h2".into(), &2.into())
        );
        for part in ["server_login_session", "server_logout"] {
            assert_eq!(r[part]["fops"]["WRITE"]["calls"], 5, "{part}: {r}");
        }
        if r["metered"] == true {
            // The class's counts are the sum of its hosts'.
            let sum: u64 = hosts
                .iter()
                .map(|h| h["share_whole"]["total"].as_u64().unwrap_or(0))
                .sum();
            let whole: u64 = ["share_login", "share_session", "share_logout"]
                .iter()
                .map(|p| r[p]["total"].as_u64().unwrap_or(0))
                .sum();
            assert!(sum > 0 && sum == whole, "{sum} vs {whole}: {r}");
        }
    }
    // One reading before the first run (the check), three a run.
    let readings: u64 = std::fs::read_to_string(&state)
        .expect("n")
        .trim()
        .parse()
        .expect("n");
    assert_eq!(readings, 5 * (1 + 3 * 4));
    let mut said: Vec<String> = std::fs::read_to_string(&remounts)
        .expect("remounts")
        .lines()
        .map(str::to_string)
        .collect();
    said.sort();
    assert_eq!(
        said,
        ["h1", "h1", "h1", "h1", "h2", "h2", "h2", "h2"],
        "each host remounts its own client before every run"
    );
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("hosts, with ccfs #1"), "{table}");
    assert_eq!(entries(share.path()), 0, "the hosts' homes removed");
    assert_eq!(entries(work.path()), 0, "the hosts' scratch space removed");
}

#[test]
fn a_class_smaller_than_its_hosts_is_refused() {
    let share = e2e::share_dir();
    let work = tempfile::tempdir().expect("work");
    let o = storm(
        share.path(),
        work.path(),
        &["--hosts", "h1,h2,h3", "--users", "2"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("at least 3 users"));
}

/// Ctrl-C at the coordinator in the middle of a class across hosts: every host is told
/// to stop, its users log out (ccfs syncs what they wrote), nothing stays mounted, and
/// loadgen exits 130.
#[test]
fn an_interrupted_class_across_hosts_logs_everyone_out() {
    let share = e2e::share_dir();
    let work = tempfile::tempdir().expect("work");
    let scratch = tempfile::tempdir().expect("scratch");
    let profile = scratch.path().join("profile.txt");
    std::fs::write(
        &profile,
        "[home]\nfile .config/app.conf 10\n[login]\nreplace .config/app.conf 123\n\
         [session 1]\nappend .history 3\n[logout]\n",
    )
    .expect("profile");
    let mut child = Command::new(loadgen_bin())
        .arg("login-storm")
        .arg("--share")
        .arg(share.path())
        .arg("--work")
        .arg(work.path())
        .arg("--ssh-command")
        .arg(fake_ssh())
        .args(["--hosts", "h1,h2", "--users-per-host", "1", "--with-ccfs"])
        .args(["--session", "120", "--no-meter", "--keep", "--profile"])
        .arg(&profile)
        // Its own process group: the signal goes to the coordinator alone, as at a
        // terminal whose agents run on other hosts.
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    // Both users in their session: each has appended to .history through its mount.
    let appended = |u: usize| {
        walk(work.path())
            .iter()
            .any(|p| p.ends_with(format!("home/user{u:03}/.history")))
    };
    e2e::wait_until(
        "both hosts' users in their session",
        std::time::Duration::from_secs(60),
        || appended(0) && appended(1),
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
    assert_eq!(status.code(), Some(130), "{}", text(&out));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(&work.path().display().to_string()),
        "nothing left mounted"
    );
    // The kept homes got what the users wrote before their forced logout.
    let homes = walk(share.path());
    for u in 0..2 {
        let conf = homes
            .iter()
            .find(|p| p.ends_with(format!("user{u:03}/.config/app.conf")))
            .unwrap_or_else(|| panic!("user{u:03}'s home: {homes:?}"));
        assert_eq!(std::fs::metadata(conf).expect("conf").len(), 123);
    }
}

/// Every path below `dir` (not following links).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

/// A host's agent checks its share as the one-machine storm does: a share directory any
/// user can change (swap a home for a link to steer where root mounts) is refused there,
/// naming it, and nothing is made in it.
#[test]
fn a_host_refuses_a_share_another_user_could_change() {
    use std::os::unix::fs::PermissionsExt;
    let share = e2e::share_dir();
    std::fs::set_permissions(share.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let work = tempfile::tempdir().expect("work");
    let o = storm(
        share.path(),
        work.path(),
        &[
            "--hosts",
            "h1,h2",
            "--users",
            "2",
            "--no-meter",
            "--session",
            "0",
        ],
    );
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--share: "), "{err}");
    assert_eq!(entries(share.path()), 0, "nothing made in it");
}

/// A class of 30 across the test hosts (`deploy/testbed/up hosts`: three network
/// namespaces reached over real SSH), on the GlusterFS testbed, each host with its own
/// client of the volume (`gluster.sh mount-on`): with `CCFS_TEST_STORM_SSH` (the ssh
/// command reaching h1..h3) and `CCFS_TEST_GLUSTER_STATE` (the testbed's state dir); skipped
/// without them. Every host plays its ten users through its own client (its client's CPU
/// counted, its client living in the host's network namespace); without ccfs the bricks
/// take the logins' writes, with ccfs none until the logout.
#[test]
fn a_class_of_thirty_on_three_test_hosts_each_with_its_own_gluster_client() {
    let (Some(ssh), Some(state)) = (
        std::env::var_os("CCFS_TEST_STORM_SSH"),
        std::env::var_os("CCFS_TEST_GLUSTER_STATE"),
    ) else {
        e2e::skip(
            "CCFS_TEST_STORM_SSH and CCFS_TEST_GLUSTER_STATE not set (scripts/test sets them)",
        );
        return;
    };
    let state = PathBuf::from(state);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/testbed/gluster.sh");
    let hosts = ["h1", "h2", "h3"];
    for h in hosts {
        let o = Command::new(&script)
            .args(["mount-on", h])
            .output()
            .expect("mount-on");
        assert!(o.status.success(), "mount-on {h}: {}", text(&o));
    }
    let scratch = tempfile::tempdir().expect("scratch");
    let pids = scratch.path().join("server.pids");
    let o = Command::new(&script)
        .arg("server-pids")
        .output()
        .expect("server-pids");
    assert!(o.status.success(), "{}", text(&o));
    std::fs::write(&pids, &o.stdout).expect("pids");
    let work = tempfile::tempdir().expect("work");
    let json = scratch.path().join("storm.json");
    let per_host = |leaf: &str| state.join("hosts/{host}").join(leaf);
    // A directory of the class's own on the volume (which other tests use too).
    let class = format!("class-{}", std::process::id());
    std::fs::create_dir(state.join("hosts/h1/mnt").join(&class)).expect("the class's directory");
    let o = Command::new(loadgen_bin())
        .arg("login-storm")
        .arg("--share")
        .arg(per_host("mnt").join(&class))
        .arg("--work")
        .arg(work.path())
        .arg("--ssh-command")
        .arg(&ssh)
        .args([
            "--hosts",
            "h1,h2,h3",
            "--users",
            "30",
            "--compare",
            "--no-meter",
        ])
        .args(["--session", "2", "--cpu-window", "10"])
        .arg("--remount")
        .arg(format!("{} remount-on {{host}}", script.display()))
        .arg("--client-pids-file")
        .arg(per_host("client.pid"))
        .arg("--server-pids-file")
        .arg(&pids)
        .arg("--server-counts")
        .arg(format!("{} counts", script.display()))
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run loadgen");
    assert!(o.status.success(), "{}", text(&o));
    let runs = e2e::read_json(&json);
    let runs = runs.as_array().expect("runs");
    assert_eq!(runs.len(), 2, "a timed run a mode");
    for r in runs {
        assert_eq!(r["complete"], true, "{r}");
        let users: Vec<u64> = r["per_user"]
            .as_array()
            .expect("per user")
            .iter()
            .filter_map(|u| u["user"].as_u64())
            .collect();
        assert_eq!(users, (0..30).collect::<Vec<u64>>(), "every user, once");
        let parts = r["hosts"].as_array().expect("hosts");
        for (k, h) in hosts.iter().enumerate() {
            let p = &parts[k];
            assert_eq!((&p["host"], &p["users"]), (&(*h).into(), &10.into()), "{p}");
            assert_eq!(p["first_user"], 10 * k, "{p}");
            assert!(p["error"].is_null(), "{p}");
            // The host's users went through its own client.
            assert!(p["client_cpu_s"].as_f64().unwrap_or(0.0) > 0.0, "{p}");
        }
        let writes = |part: &str| r[part]["fops"]["WRITE"]["calls"].as_u64().unwrap_or(0);
        assert!(
            writes("server_logout") > 0 || r["with_ccfs"] == false,
            "the logout syncs: {r}"
        );
        if r["with_ccfs"] == true {
            assert_eq!(
                writes("server_login_session"),
                0,
                "ccfs keeps the login's writes: {r}"
            );
        } else {
            assert!(
                writes("server_login_session") > 0,
                "without ccfs the login writes: {r}"
            );
        }
    }
    // Each host's client lives in that host's network namespace, not this one's.
    let ns = |p: &Path| std::fs::metadata(p).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    let ours = ns(Path::new("/proc/self/ns/net")).expect("our netns");
    for h in hosts {
        let pid =
            std::fs::read_to_string(state.join(format!("hosts/{h}/client.pid"))).expect("pid");
        let theirs = ns(&PathBuf::from(format!("/proc/{}/ns/net", pid.trim()))).expect("its netns");
        let host_ns = ns(&PathBuf::from(format!("/run/netns/ccfs-{h}"))).expect("host netns");
        assert_eq!(theirs, host_ns, "{h}'s client in {h}'s namespace");
        assert_ne!(theirs, ours);
        assert_eq!(
            entries(&state.join(format!("hosts/{h}/mnt")).join(&class)),
            0,
            "{h}: the homes removed"
        );
    }
    std::fs::remove_dir(state.join("hosts/h1/mnt").join(&class)).expect("the class's directory");
    assert_eq!(entries(work.path()), 0, "the hosts' scratch space removed");
}

/// The testbed's `mount-on HOST` for the server named by `CCFS_TEST_HOSTS_SERVER`
/// (gluster, moosefs or ceph; its state dir in `CCFS_TEST_SERVER_STATE`), with the test
/// hosts up: each host gets a client of its own, living in that host's network namespace,
/// and all of them see one file system (what one host writes the others read; a remount
/// starts a new client). Skipped without those variables.
#[test]
fn each_test_host_mounts_the_share_with_a_client_of_its_own() {
    let (Some(server), Some(state)) = (
        std::env::var_os("CCFS_TEST_HOSTS_SERVER"),
        std::env::var_os("CCFS_TEST_SERVER_STATE"),
    ) else {
        e2e::skip(
            "CCFS_TEST_HOSTS_SERVER and CCFS_TEST_SERVER_STATE not set (scripts/test sets them)",
        );
        return;
    };
    let server = server.to_string_lossy().into_owned();
    let state = PathBuf::from(state);
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../deploy/testbed/{server}.sh"));
    let on = |what: &str, h: &str| -> PathBuf {
        let o = Command::new(&script)
            .args([what, h])
            .output()
            .expect("testbed");
        assert!(o.status.success(), "{what} {h}: {}", text(&o));
        PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
    };
    let netns = |p: &Path| std::fs::metadata(p).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    let client = |h: &str| -> String {
        std::fs::read_to_string(state.join(format!("hosts/{h}/client.pid")))
            .expect("client.pid")
            .trim()
            .to_string()
    };
    let ours = netns(Path::new("/proc/self/ns/net")).expect("our netns");
    let mut mounts = Vec::new();
    for h in ["h1", "h2", "h3"] {
        let m = on("mount-on", h);
        assert_eq!(m, state.join(format!("hosts/{h}/mnt")));
        let theirs = netns(&PathBuf::from(format!("/proc/{}/ns/net", client(h)))).expect("netns");
        let host = netns(&PathBuf::from(format!("/run/netns/ccfs-{h}"))).expect("host netns");
        assert_eq!(theirs, host, "{h}'s client runs in {h}'s namespace");
        assert_ne!(theirs, ours);
        mounts.push(m);
    }
    let pids: Vec<String> = ["h1", "h2", "h3"].iter().map(|h| client(h)).collect();
    assert!(
        pids[0] != pids[1] && pids[1] != pids[2],
        "a client a host: {pids:?}"
    );
    let name = format!("written-on-h1-{}", std::process::id());
    std::fs::write(mounts[0].join(&name), "through h1's client\n").expect("write on h1");
    for m in &mounts[1..] {
        let got = std::fs::read_to_string(m.join(&name)).expect("read on another host");
        assert_eq!(got, "through h1's client\n");
    }
    let before = client("h2");
    assert_eq!(on("remount-on", "h2"), mounts[1]);
    assert_ne!(client("h2"), before, "a remount is a new client");
    assert!(
        mounts[1].join(&name).is_file(),
        "the new client sees the file"
    );
    std::fs::remove_file(mounts[2].join(&name)).expect("remove on h3");
    e2e::wait_until(
        "h1 to see the file gone",
        std::time::Duration::from_secs(15),
        || !mounts[0].join(&name).exists(),
    );
}

/// What a killed agent left in a host's `--work` (its run directory, its process gone) is
/// cleared by the next agent there, as the next storm on one machine clears its own.
#[test]
fn a_killed_agent_s_scratch_space_is_cleared_by_the_next_agent() {
    let share = e2e::share_dir();
    let work = tempfile::tempdir().expect("work");
    let pid = (3_000_000u32..)
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .expect("a free pid");
    let left = work.path().join(format!("storm-1700000000-{pid}-0"));
    std::fs::create_dir_all(left.join("home/user000")).expect("leftover");
    let o = storm(
        share.path(),
        work.path(),
        &[
            "--hosts",
            "h1,h2",
            "--users",
            "2",
            "--no-meter",
            "--session",
            "0",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        !left.exists(),
        "the killed agent's run directory: {}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("left by a storm that was killed"),
        "{}",
        text(&o)
    );
}
