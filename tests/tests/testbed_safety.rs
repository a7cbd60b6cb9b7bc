//! The testbed scripts run as root and keep their state in a directory below world-writable
//! /var/tmp by default: a state directory someone else made (to plant an ssh key, a pid
//! file or a link for root to use) is refused before anything is done, and a pid file is
//! only ever read as a number.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../deploy/testbed/{name}"))
}

#[test]
fn a_state_directory_another_user_made_is_refused_and_nothing_is_done() {
    let base = tempfile::tempdir().expect("base");
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // The student made the testbed's directory first, with a key of hers in it.
    let state = base.path().join("ccfs-testbed");
    let alice = e2e::account("ccfs-alice");
    std::fs::create_dir(&state).expect("state");
    std::fs::create_dir(state.join("hosts")).expect("hosts");
    std::fs::write(state.join("hosts/id.pub"), "ssh-ed25519 AAAA student\n").expect("key");
    for p in [
        state.clone(),
        state.join("hosts"),
        state.join("hosts/id.pub"),
    ] {
        std::os::unix::fs::lchown(&p, Some(alice.uid), Some(alice.gid)).expect("chown");
    }
    for name in ["hosts.sh", "gluster.sh", "moosefs.sh"] {
        let o = Command::new(script(name))
            .arg(if name == "hosts.sh" { "up" } else { "counts" })
            .env("CCFS_TESTBED_DIR", &state)
            .output()
            .expect("script");
        assert_eq!(o.status.code(), Some(2), "{name}: {}", e2e::text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("is not a directory of root's"),
            "{name}: {}",
            e2e::text(&o)
        );
    }
    let mut left: Vec<String> = std::fs::read_dir(state.join("hosts"))
        .expect("ls")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["id.pub"], "nothing made or copied there");
    // A directory of root's that others can write in is refused alike.
    let open = base.path().join("open");
    std::fs::create_dir(&open).expect("open");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let o = Command::new(script("gluster.sh"))
        .arg("counts")
        .env("CCFS_TESTBED_DIR", &open)
        .output()
        .expect("script");
    assert_eq!(o.status.code(), Some(2), "{}", e2e::text(&o));
}

#[test]
fn a_pid_file_is_read_as_a_number_and_never_run() {
    let dir = tempfile::tempdir().expect("dir");
    // A "pid" that names a file of the student's standing for /proc/PID/cmdline, and runs
    // a command once put into a shell command unquoted (as stop_client once did).
    let pid = format!("self/root{}/x;touch${{IFS}}ran;", dir.path().display());
    let fake = dir.path().join("x;touch${IFS}ran;");
    std::fs::create_dir(&fake).expect("fake proc dir");
    std::fs::write(fake.join("cmdline"), "glusterfs /mnt/share\0").expect("cmdline");
    let pidfile = dir.path().join("client.pid");
    std::fs::write(&pidfile, &pid).expect("pid file");
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            ". '{}'; stop_client '{}' /mnt/share; record \"$(cat '{}')\"; echo done",
            script("lib.sh").display(),
            pidfile.display(),
            pidfile.display()
        ))
        .env("STATE", dir.path())
        .current_dir(dir.path())
        .output()
        .expect("bash");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("done"),
        "{}",
        e2e::text(&o)
    );
    assert!(
        !dir.path().join("ran").exists(),
        "the pid file's text was run"
    );
    assert!(!dir.path().join("pids").exists(), "nothing recorded");
}
