//! Faults as a sysadmin meets them: a server that closes the connection or stops
//! answering, a hung mount, Ctrl-C and SIGTERM, a host's agent that dies, the coordinator
//! interrupted, an NFS server killed or stopped mid-run. Each ends with a clear message,
//! the results so far in the JSON, and nothing left behind or what is left named.

mod common;

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{read_json, text, validate};

/// Waits for `child` at most `limit`; kills it and fails if it is still running.
fn wait_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let start = Instant::now();
    loop {
        if let Some(_status) = child.try_wait().expect("wait") {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().expect("output");
            panic!("{what}: still running after {limit:?}; {}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn loadgen")
}

/// Waits until the JSON at `path` holds at least `n` rounds.
fn wait_rounds(path: &Path, n: usize) {
    let start = Instant::now();
    loop {
        let v = std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
        let rounds = v
            .as_ref()
            .and_then(|v| v["phases"].as_array().map(Vec::len))
            .unwrap_or(0);
        if rounds >= n {
            return;
        }
        // A run that ended before the test acted (a round over its deadline on a loaded
        // machine) says so here rather than as a silent two-minute wait.
        if let Some(e) = v.as_ref().and_then(|v| v["error"].as_str()) {
            panic!("the run ended after {rounds} rounds, before the test acted: {e}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no round written"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: signalling a process this test started.
    unsafe { libc::kill(pid as i32, sig) };
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Many cheap rounds: a run that is still going when the test acts.
const LONG: &str = "create,stat-tree,read-tree,stat-tree,read-tree,stat-tree,read-tree,stat-tree,read-tree,stat-tree,read-tree,stat-tree,read-tree,stat-tree,read-tree,stat-tree,read-tree,stat-tree,read-tree,stat-tree,read-tree,stat-tree,read-tree,stat-tree,read-tree,stat-tree,read-tree,stat-tree,read-tree,stat-tree,read-tree";

/// A "server" that accepts and closes at once spun loadgen at 100% CPU forever (a closed
/// connection read as 0 bytes again and again); one that accepts and never answers hung
/// it. Both are now errors naming what happened, also a close with our call unread there
/// (the kernel then resets the connection instead of closing it).
#[test]
fn an_nfs_server_that_closes_or_never_answers_is_a_clear_error() {
    #[derive(Clone, Copy, PartialEq)]
    enum Server {
        Closes,
        ClosesWithTheCallUnread,
        NeverAnswers,
    }
    for server in [
        Server::Closes,
        Server::ClosesWithTheCallUnread,
        Server::NeverAnswers,
    ] {
        let answers = server == Server::NeverAnswers;
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                match server {
                    // Takes the call and says nothing, for ever.
                    Server::NeverAnswers => {
                        std::thread::spawn(move || {
                            let mut buf = [0u8; 1024];
                            while c.read(&mut buf).map(|n| n > 0).unwrap_or(false) {}
                        });
                    }
                    Server::Closes => drop(c),
                    Server::ClosesWithTheCallUnread => {
                        std::thread::spawn(move || {
                            let mut one = [0u8; 1];
                            // The call has begun to arrive; the rest stays unread.
                            let _ = c.peek(&mut one);
                            std::thread::sleep(Duration::from_millis(100));
                            drop(c);
                        });
                    }
                }
            }
        });
        let url = format!("nfs://127.0.0.1:{port}/export");
        let child = spawn(&[
            "compilebench",
            &url,
            "--phases",
            "create",
            "--io-timeout",
            "2",
        ]);
        let o = wait_within(child, Duration::from_secs(30), &url);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let err = stderr(&o);
        let why = if answers {
            "did not answer within 2 s"
        } else {
            "closed the connection"
        };
        assert!(
            err.contains("cannot mount") && err.contains(why),
            "{}",
            text(&o)
        );
    }
}

/// Ctrl-C and SIGTERM: the clients stop at their next call, the table and the JSON say
/// "interrupted" with the rounds so far (the cut round marked partial), everything the
/// run made is removed, exit 130.
#[test]
fn ctrl_c_and_sigterm_stop_cleanly_with_the_results_so_far() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let dir = tempfile::tempdir().expect("tmp");
        let out = tempfile::tempdir().expect("out");
        let json = out.path().join("r.json");
        let child = spawn(&[
            "compilebench",
            dir.path().to_str().expect("utf8"),
            "--scale",
            "0.05",
            "--phases",
            LONG,
            "--no-sync",
            "--json",
            json.to_str().expect("utf8"),
        ]);
        wait_rounds(&json, 3);
        signal(child.id(), sig);
        let o = wait_within(child, Duration::from_secs(60), "interrupted run");
        assert_eq!(o.status.code(), Some(130), "{}", text(&o));
        assert!(stderr(&o).contains("interrupted"), "{}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("stat-tree"),
            "the table of the rounds so far: {}",
            text(&o)
        );
        let v = read_json(&json);
        validate(&v);
        assert_eq!(v["complete"], false);
        assert_eq!(v["error"], "interrupted by a signal");
        let rounds = v["phases"].as_array().expect("rounds");
        assert!(rounds.len() >= 3 && rounds.len() < 31, "{}", rounds.len());
        assert!(rounds[..rounds.len() - 1]
            .iter()
            .all(|r| r["partial"] == false));
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("ls").count(),
            0,
            "everything the run made is removed"
        );
    }
}

/// A FUSE mount whose daemon stops answering (bindfs, SIGSTOPped mid-run): the round's
/// deadline ends the run with the target named, the JSON written, and the run directory
/// named as left (nothing can be removed from a mount that does not answer).
#[test]
fn a_hung_mount_ends_the_run_at_the_phase_timeout() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (under, mnt) = (tmp.path().join("under"), tmp.path().join("mnt"));
    std::fs::create_dir(&under).expect("mkdir");
    std::fs::create_dir(&mnt).expect("mkdir");
    let st = Command::new("bindfs")
        .arg(&under)
        .arg(&mnt)
        .status()
        .expect("bindfs (scripts/setup installs it)");
    assert!(st.success());
    let bindfs_pid = pid_of_mount(&mnt);
    let json = tmp.path().join("r.json");
    let child = spawn(&[
        "compilebench",
        mnt.to_str().expect("utf8"),
        "--scale",
        "0.05",
        "--phases",
        LONG,
        "--no-sync",
        "--phase-timeout",
        // Long enough for a round on a loaded machine (bindfs, 2 cores, a test suite
        // beside it); the hang is what has to outlast it.
        "12",
        "--json",
        json.to_str().expect("utf8"),
    ]);
    wait_rounds(&json, 2);
    signal(bindfs_pid, libc::SIGSTOP);
    // The run reports and writes its JSON at the deadline; its process can end only once
    // the calls stuck in the kernel come back (a FUSE request the daemon had taken is
    // waited out), so the daemon is let go on after the report.
    let start = Instant::now();
    while !std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .is_some_and(|v| {
            v["error"]
                .as_str()
                .is_some_and(|e| e.contains("did not answer"))
        })
    {
        if start.elapsed() > Duration::from_secs(60) {
            signal(bindfs_pid, libc::SIGCONT);
            panic!("no report of the hang within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(bindfs_pid, libc::SIGCONT);
    let o = wait_within(child, Duration::from_secs(60), "hung run");
    let _ = Command::new("umount").arg(&mnt).status();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = stderr(&o);
    assert!(
        err.contains(mnt.to_str().expect("utf8")) && err.contains("did not answer"),
        "{}",
        text(&o)
    );
    let v = read_json(&json);
    validate(&v);
    assert_eq!(v["complete"], false);
    let last = v["phases"].as_array().expect("rounds").last().expect("one");
    assert_eq!(last["partial"], true);
    let left = v["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .filter_map(|w| w.as_str())
        .find(|w| w.contains("left in place"))
        .unwrap_or_else(|| panic!("the run directory is named: {v}"))
        .to_string();
    let run_dir = std::fs::read_dir(&under)
        .expect("ls")
        .map(|e| e.expect("e").file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("loadgen-run-"))
        .expect("the run directory is there");
    assert!(left.contains(&run_dir) && left.contains("rm -r"), "{left}");
}

/// The FUSE daemon serving `mnt` (bindfs was started from this test: its newest process).
fn pid_of_mount(mnt: &Path) -> u32 {
    let o = Command::new("pgrep")
        .args(["-n", "-f"])
        .arg(format!("bindfs .* {}", mnt.display()))
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no bindfs for {}", mnt.display()))
}

/// A long run in `dir` on `hosts` through the stand-in for ssh, writing `json`.
fn on_hosts(dir: &Path, hosts: &str, json: &Path) -> Child {
    let fake: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-ssh");
    spawn(&[
        "compilebench",
        dir.to_str().expect("utf8"),
        "--hosts",
        hosts,
        "--ssh-command",
        fake.to_str().expect("utf8"),
        "--scale",
        "0.03",
        "--phases",
        LONG,
        "--no-sync",
        "--json",
        json.to_str().expect("utf8"),
    ])
}

/// Multi-host: an agent killed mid-run ends the run with that host named, the table and
/// the JSON of the rounds so far, and the warning that its run directory may be left;
/// the other agents are told to stop and clean up.
#[test]
fn a_dead_agent_ends_the_run_naming_its_host() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = tempfile::tempdir().expect("out");
    let json = out.path().join("m.json");
    let child = on_hosts(dir.path(), "h1,h2,h3", &json);
    wait_rounds(&json, 2);
    // h2's agent (its clients are numbered from 1; this test's directory), killed as a
    // host dies.
    let o = Command::new("pkill")
        .args(["-KILL", "-f"])
        .arg(format!(
            "loadgen agent {} .*--client-base 1$",
            dir.path().display()
        ))
        .status()
        .expect("pkill");
    assert!(o.success(), "h2's agent was running");
    let o = wait_within(child, Duration::from_secs(120), "run with a dead agent");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(stderr(&o).contains("h2"), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("create"),
        "the table of the rounds so far: {}",
        text(&o)
    );
    let v = read_json(&json);
    validate(&v);
    assert_eq!(v["complete"], false);
    let error = v["error"].as_str().expect("error");
    assert!(error.contains("h2: the agent ended"), "{error}");
    assert!(
        !v["phases"].as_array().expect("rounds").is_empty(),
        "the rounds before the death are kept"
    );
    assert!(
        v["warnings"]
            .as_array()
            .expect("w")
            .iter()
            .any(|w| w.as_str().is_some_and(|w| w.contains("run directory"))),
        "{v}"
    );
    // h1 and h3 cleaned up; h2's directory (killed) is the one left.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("ls")
        .map(|e| e.expect("e").file_name())
        .collect();
    assert!(left.len() <= 1, "{left:?}");
}

/// Ctrl-C of the coordinator stops the agents at their next call: they clean up and end
/// at once rather than finishing the run.
#[test]
fn an_interrupted_coordinator_stops_its_agents() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = tempfile::tempdir().expect("out");
    let json = out.path().join("m.json");
    let child = on_hosts(dir.path(), "h1,h2", &json);
    wait_rounds(&json, 3);
    signal(child.id(), libc::SIGINT);
    let o = wait_within(child, Duration::from_secs(60), "interrupted coordinator");
    assert_eq!(o.status.code(), Some(130), "{}", text(&o));
    let v = read_json(&json);
    validate(&v);
    assert_eq!(v["error"], "interrupted by a signal");
    assert!(v["phases"].as_array().expect("rounds").len() < 31);
    // The agents have ended, their trees removed.
    let start = Instant::now();
    while std::fs::read_dir(dir.path()).expect("ls").count() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "agents left their run directories"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An NFS server (NFS-Ganesha from deploy/testbed) stopped, then killed, mid-run: each
/// ends the run with the server named and the results so far. Needs LOADGEN_TEST_NFS,
/// LOADGEN_TEST_NFS_EXPORT and LOADGEN_TEST_NFS_PIDFILE (scripts/test sets them); kills
/// the server, so it runs last on that testbed.
#[test]
fn an_nfs_server_stopped_or_killed_mid_run_ends_it_clearly() {
    let (Some(url), Some(export), Some(pidfile)) = (
        std::env::var_os("LOADGEN_TEST_NFS"),
        std::env::var_os("LOADGEN_TEST_NFS_EXPORT"),
        std::env::var_os("LOADGEN_TEST_NFS_PIDFILE"),
    ) else {
        e2e::skip("LOADGEN_TEST_NFS, _EXPORT and _PIDFILE are not set (scripts/test sets them for the NFS-Ganesha testbed)");
        return;
    };
    let url = url.to_str().expect("utf8").to_string();
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    let out = tempfile::tempdir().expect("out");
    for (sig, why) in [
        (libc::SIGSTOP, "did not answer within 3 s"),
        (libc::SIGKILL, "NFS"),
    ] {
        let json = out.path().join(format!("r{sig}.json"));
        let child = spawn(&[
            "compilebench",
            &url,
            "--scale",
            "0.03",
            "--phases",
            LONG,
            "--no-sync",
            "--io-timeout",
            "3",
            "--allow-nonempty",
            "--json",
            json.to_str().expect("utf8"),
        ]);
        wait_rounds(&json, 2);
        signal(pid, sig);
        let o = wait_within(child, Duration::from_secs(90), "run against a dead server");
        if sig == libc::SIGSTOP {
            signal(pid, libc::SIGCONT);
        }
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        let v = read_json(&json);
        validate(&v);
        assert_eq!(v["complete"], false);
        let err = v["error"].as_str().expect("error").to_string();
        assert!(err.contains(why), "{err}");
        assert!(stderr(&o).contains(why), "{}", text(&o));
        assert!(
            v["warnings"]
                .as_array()
                .expect("w")
                .iter()
                .any(|w| w.as_str().is_some_and(|w| w.contains("rm -r"))),
            "what is left is named: {v}"
        );
        for e in std::fs::read_dir(&export).expect("ls").flatten() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
