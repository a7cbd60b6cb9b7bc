//! Processes: whether one has ended, which name a directory, reaping the ccfs daemons
//! (this process is their subreaper) for their CPU time, CPU seconds of given processes.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Whether process `pid` has ended (gone, or a zombie not reaped yet: this process is a
/// subreaper, so a killed daemon stays one until reaped).
pub(super) fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // "PID (COMM) STATE ...": the state follows the last ')'.
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// Whether every user id of process `pid` (real, effective, saved, filesystem) is `uid`:
/// a process another user started is not, a setuid program among them (its real id is
/// the user's).
fn all_ids_are(pid: u32, uid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .is_some_and(|ids| ids.split_whitespace().all(|id| id == uid.to_string()))
    })
}

/// Pids of the live processes of this user with an argument naming `dir` or a path below
/// it (another user's process can name any path: it is no daemon of ours to wait for).
fn processes_naming(dir: &Path) -> Vec<u32> {
    let me = std::process::id();
    let uid = crate::sys::geteuid();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && !gone(pid))
        .filter(|&pid| all_ids_are(pid, uid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|&b| b == 0)
                    .any(|a| Path::new(std::ffi::OsStr::from_bytes(a)).starts_with(dir))
            })
        })
        .collect()
}

/// Waits up to `limit` for the processes naming `dir` to end; returns those still running.
pub(super) fn await_processes_naming(dir: &Path, limit: Duration) -> Vec<u32> {
    let until = std::time::Instant::now() + limit;
    loop {
        let left = processes_naming(dir);
        if left.is_empty() || std::time::Instant::now() >= until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (at most `limit`) for our child `pid` to exit: its wait status and CPU seconds,
/// user and system, its reaped children's included; None when it is not ours or did not
/// exit.
pub(super) fn reap(pid: u32, limit: Duration) -> Option<(i32, f64)> {
    let t = Instant::now();
    loop {
        match crate::sys::try_reap(pid) {
            Ok(Some(done)) => return Some(done),
            Ok(None) if t.elapsed() <= limit => {}
            _ => return None,
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits (at most `limit`) for our child `pid` to exit and returns its CPU seconds, user
/// and system, its reaped children's included; None when it is not ours or did not exit.
pub(super) fn reap_cpu(pid: u32, limit: Duration) -> Option<f64> {
    reap(pid, limit).map(|(_, cpu)| cpu)
}

/// Makes this process the reaper of its orphaned descendants: the ccfs daemons, whose
/// `ccfs mount` exits once they are up, become its children, and their CPU time is read
/// when they are reaped.
pub(super) fn become_subreaper() {
    crate::sys::become_subreaper();
}

/// CPU seconds (user + system) of the processes, those still alive.
pub fn cpu_seconds(pids: &[u32]) -> f64 {
    let hz = crate::sys::clock_ticks();
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|s| {
            // Fields after the command name (which may hold spaces) in parentheses.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ut: f64 = f.get(11)?.parse().ok()?;
            let st: f64 = f.get(12)?.parse().ok()?;
            Some((ut + st) / hz)
        })
        .sum()
}

/// Process ids from a file, one a line (its first word), as deploy/testbed keeps them.
pub fn read_pids_file(path: &Path) -> Result<Vec<u32>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            line.split_whitespace()
                .next()
                .and_then(|w| w.parse::<u32>().ok())
                .ok_or_else(|| {
                    format!(
                        "{}: {line:?} does not start with a process id",
                        path.display()
                    )
                })
        })
        .collect()
}

/// Runs a shell command given as the option `option` (`--remount`, `--server-counts`);
/// what it printed, once it succeeded.
pub(super) fn run_given(option: &str, cmd: &str) -> Result<String, String> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .map_err(|e| format!("cannot run {option} {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{option} {cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The server's own counters: what `cmd` (`--server-counts`) prints.
pub fn read_server_counts(cmd: &str) -> Result<super::ServerCounts, String> {
    super::ServerCounts::parse(&run_given("--server-counts", cmd)?)
        .map_err(|e| format!("--server-counts {cmd:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_files_are_read_or_refused_by_line() {
        let d = tempfile::tempdir().expect("tmp");
        let f = d.path().join("pids");
        std::fs::write(&f, "12 345 glusterd\n\n67\n").expect("write");
        assert_eq!(read_pids_file(&f), Ok(vec![12, 67]));
        std::fs::write(&f, "12\nglusterd 3\n").expect("write");
        let e = read_pids_file(&f).expect_err("refused");
        assert!(
            e.contains("\"glusterd 3\" does not start with a process id"),
            "{e}"
        );
    }

    #[test]
    fn cpu_seconds_reads_this_process() {
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_add(1);
        }
        assert!(x > 0);
        assert!(cpu_seconds(&[std::process::id()]) > 0.0);
        assert_eq!(cpu_seconds(&[u32::MAX]), 0.0);
    }
}
