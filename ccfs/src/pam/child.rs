//! Child processes of the hook, each with a time limit: a child that does not end in time
//! is killed with its process group, and one that cannot exit is waited for within the same
//! limit.

use std::ffi::OsStr;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::sys::{self};

/// What a child said and how it ended.
pub(super) struct ChildRun {
    /// None: it did not end in time (it was killed, or abandoned if it cannot die: a
    /// process stuck on a hung share).
    pub(super) ok: Option<bool>,
    pub(super) output: String,
}

/// Runs `program args` with a clean environment (PATH only), waiting at most `limit`.
pub(super) fn run_limited(program: &Path, args: &[&OsStr], limit: Duration) -> ChildRun {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return ChildRun {
                ok: Some(false),
                output: format!("cannot run {}: {e}", program.display()),
            }
        }
    };
    let (tx, rx) = std::sync::mpsc::channel();
    for pipe in [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.take(64 << 10).read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
    }
    drop(tx);
    let deadline = Instant::now() + limit;
    let ok = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status.success()),
            Ok(None) if Instant::now() >= deadline => {
                // The child's own process group (made above).
                sys::kill_group(child.id());
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break Some(false),
        }
    };
    // What it wrote: a process it left behind may hold the pipe, so wait only a moment.
    let mut output = Vec::new();
    let until = Instant::now() + Duration::from_secs(1);
    while let Ok(part) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
        output.extend(part);
    }
    ChildRun {
        ok,
        output: String::from_utf8_lossy(&output).trim().to_string(),
    }
}
