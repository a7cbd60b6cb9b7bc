//! `ccfs umount`: the logout (unmount, sync, busy mounts).

use crate::*;

/// How an unmount went.
pub(crate) enum Unmounted {
    Done,
    /// Detached lazily: programs still use it.
    Lazily,
    /// Programs use it (fusermount3's words).
    Busy(String),
}

pub(crate) fn fusermount(mp: &Path, args: &[&str]) -> Result<Result<(), String>, Error> {
    let out = Command::new("fusermount3")
        .args(args)
        .arg(mp)
        .output()
        .map_err(|e| fail(format!("cannot run fusermount3: {e} (install fuse3)")))?;
    Ok(if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    })
}

/// Unmounts `mp`. While the share is unreachable a busy mount is detached lazily (the
/// programs holding it may be stuck on the share for good).
pub(crate) fn unmount_mount(mp: &Path, share_unreachable: bool) -> Result<Unmounted, Error> {
    let err = match fusermount(mp, &["-u"])? {
        Ok(()) => return Ok(Unmounted::Done),
        Err(err) => err,
    };
    if !err.contains("busy") {
        return Err(fail(format!("cannot unmount {}: {err}", mp.display())));
    }
    if !share_unreachable {
        return Ok(Unmounted::Busy(err));
    }
    match fusermount(mp, &["-u", "-z"])? {
        Ok(()) => Ok(Unmounted::Lazily),
        Err(err) => Err(fail(format!("cannot unmount {}: {err}", mp.display()))),
    }
}

/// The processes that use something below `mp` (working or root directory, program, open
/// file), as "name (pid N)", at most `max`. Only /proc is read, never the mount itself.
pub(crate) fn processes_using(mp: &Path, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    let below = |link: PathBuf| std::fs::read_link(link).is_ok_and(|t| t.starts_with(mp));
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let dir = p.path();
        let uses = ["cwd", "root", "exe"].iter().any(|l| below(dir.join(l)))
            || std::fs::read_dir(dir.join("fd"))
                .map(|fds| fds.flatten().any(|fd| below(fd.path())))
                .unwrap_or(false);
        if uses {
            let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            out.push(format!("{} (pid {pid})", daemon::LogText(name.trim())));
            if out.len() >= max {
                break;
            }
        }
    }
    out
}

/// Waits for the answer to `Wait` (the logout sync's outcome). Between slices it asks the
/// daemon whether the share still answers: when it does not, a sync under way may be stuck
/// on it for good, and the wait ends with None and that status.
/// How a wait for the logout sync's answer ended.
pub(crate) enum LogoutAnswer {
    Done(Box<SyncOutcome>),
    /// The share stopped answering during the sync.
    Unreachable(Box<Status>),
    /// No answer within the time given (a daemon still sending much data, or a control
    /// socket that answers but never finishes).
    Late,
}

pub(crate) fn wait_logout_answer(
    m: &control::MountRef,
    stream: &UnixStream,
    reader: &mut impl std::io::BufRead,
    limit: Duration,
) -> Result<LogoutAnswer, Error> {
    let ended = |e: &dyn std::fmt::Display| {
        fail(format!(
            "the ccfs daemon ended without finishing the logout sync ({e}); the changes are kept in {}: run `ccfs recover --cache-dir {}`",
            m.cache_dir.display(),
            m.cache_dir.display()
        ))
    };
    stream
        .set_read_timeout(Some(WAIT_SLICE))
        .map_err(|e| fail(format!("daemon: {e}")))?;
    let mut line = Vec::new();
    // The whole wait, however the answer trickles in, ends at the limit.
    let deadline = Instant::now() + limit;
    loop {
        match control::read_line_until(reader, &mut line, Some(deadline)) {
            Ok(control::LineRead::Closed) => return Err(ended(&"it closed the connection")),
            Ok(control::LineRead::Line) => {
                let outcome = serde_json::from_slice(&line).map_err(bad_answer)?;
                return Ok(LogoutAnswer::Done(Box::new(outcome)));
            }
            Ok(control::LineRead::Partial) => return Ok(LogoutAnswer::Late),
            Err(e) if control::timed_out(&e) => match control::status(m, STATUS_TIMEOUT) {
                Ok(st) if st.share_health.as_ref().is_some_and(|h| !h.is_reachable()) => {
                    return Ok(LogoutAnswer::Unreachable(Box::new(st)))
                }
                Ok(_) => {}
                // Between its answer on the other connection and its exit (it may take
                // this connection and end before answering it, or end before it read the
                // question: the kernel then resets this connection): that connection has
                // the answer, or ends without one.
                Err(e) if control::daemon_ending(&e) => {}
                Err(e) => return Err(daemon_error(m, &e)),
            },
            Err(e) => return Err(ended(&e)),
        }
    }
}

pub(crate) fn changes(n: usize) -> String {
    format!("{n} change{}", if n == 1 { "" } else { "s" })
}

pub(crate) fn umount(
    mountpoint: &Path,
    wait: Duration,
    busy_timeout: Option<Duration>,
) -> Result<(), Error> {
    let m = control_socket(mountpoint)?;
    let mp = m.mountpoint.clone();
    let status = control::status(&m, STATUS_TIMEOUT).map_err(|e| daemon_error(&m, &e))?;
    if status.mountpoint != mp {
        return Err(fail(format!(
            "the mount table names the cache of the mount at {} for {}; unmount that one",
            status.mountpoint.display(),
            mp.display()
        )));
    }
    let outage = status.share_health.clone().filter(|h| !h.is_reachable());
    let stream = control::connect(&m).map_err(|e| daemon_error(&m, &e))?;
    stream
        .set_read_timeout(Some(STATUS_TIMEOUT))
        .map_err(|e| fail(format!("daemon: {e}")))?;
    control::send(&stream, &Request::Wait).map_err(|e| daemon_error(&m, &e))?;
    let mut reader = std::io::BufReader::new(&stream);
    let ack = control::read_line_value(&mut reader, Some(Instant::now() + STATUS_TIMEOUT))
        .map_err(|e| daemon_error(&m, &e))?;
    if ack["waiting"] != true {
        return Err(bad_answer(ack));
    }
    let unmounted = match unmount_mount(&mp, outage.is_some())? {
        Unmounted::Busy(err) => match busy_timeout {
            None => {
                return Err(fail(format!(
                    "cannot unmount {}: {err}; close the programs using it (`fuser -vm {}`) and try again, or give --busy-timeout",
                    mp.display(),
                    mp.display()
                )))
            }
            Some(limit) => match busy_logout(&m, &mp, wait, limit)? {
                BusyEnd::Detached(result) => return result,
                // Unmounted after all: the logout sync runs, as at any unmount.
                BusyEnd::Unmounted => Unmounted::Done,
            },
        },
        u => u,
    };
    if matches!(unmounted, Unmounted::Lazily) {
        // The session, and with it the logout sync, ends only once the last program lets
        // go of the mount: nothing to wait for here.
        let health = outage.map(|h| h.describe()).unwrap_or_default();
        return Err(fail(format!(
            "unmounted {} lazily (programs still use it); share unreachable: {health}; {} kept in {}; the daemon (pid {}) sends them once those programs end if the share is back by then, else `ccfs recover` does once it is back",
            mp.display(),
            changes(status.changes()),
            m.cache_dir.display(),
            status.pid
        )));
    }
    let outcome = match wait_logout_answer(&m, &stream, &mut reader, wait)? {
        LogoutAnswer::Done(outcome) => *outcome,
        LogoutAnswer::Late => {
            return Err(fail(format!(
                "unmounted {}, but the daemon (pid {}) has not said within {} s how its logout sync went; it goes on in the background, and what it leaves in {} is sent by `ccfs recover`",
                mp.display(),
                status.pid,
                wait.as_secs(),
                m.cache_dir.display()
            )));
        }
        LogoutAnswer::Unreachable(st) => {
            let health = st
                .share_health
                .as_ref()
                .map(|h| h.describe())
                .unwrap_or_default();
            return Err(fail(format!(
                "unmounted {}, but the share stopped answering during the logout sync: {health}; {} kept in {}; the daemon (pid {}) finishes the sync if the share comes back, else `ccfs recover` sends them once it is back",
                mp.display(),
                changes(st.changes()),
                m.cache_dir.display(),
                st.pid
            )));
        }
    };
    // The daemon exits right after answering; wait so the cache is free for the next mount.
    let start = Instant::now();
    while ccfs::sys::process_alive(status.pid) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    if outcome.share_unreachable.is_some() {
        return Err(fail(format!(
            "unmounted {}; logout sync not started: {}",
            mp.display(),
            outcome.error.as_deref().unwrap_or("share unreachable")
        )));
    }
    print_outcome("logout sync", &outcome);
    if outcome.ok {
        say!(
            "ccfs: unmounted {}; all changes are on the share",
            mp.display()
        );
        Ok(())
    } else if only_blocks_kept(&outcome) {
        // Nothing left for a recovery to send: what stays is ours, kept aside.
        Err(fail(format!(
            "unmounted {}, but not everything reached the share: the changes named above are kept in {} and were not put on the share",
            mp.display(),
            m.cache_dir.display()
        )))
    } else {
        Err(fail(format!(
            "unmounted {}, but not everything reached the share; the rest is kept in {} (run `ccfs recover --cache-dir {}`)",
            mp.display(),
            m.cache_dir.display(),
            m.cache_dir.display()
        )))
    }
}

/// Whether all a failed logout left is files kept in the cache as their blocks (nothing
/// unsynced for a recovery to send).
fn only_blocks_kept(outcome: &SyncOutcome) -> bool {
    outcome.report.as_ref().is_some_and(|r| {
        r.errors.is_empty()
            && r.not_sent.is_empty()
            && r.remaining_dirty == 0
            && r.remaining_deletions == 0
            && r.conflicts
                .iter()
                .any(|c| c.kind == ccfs::overlay::ConflictKind::BlocksKeptHere)
    })
}

/// A logout while programs still use the mount: what the session wrote is synced now,
/// then the programs get `limit` to let go; past that the mount is detached lazily and the
/// daemon, still serving them, syncs again and exits once the last one ends.
pub(crate) fn busy_logout(
    m: &control::MountRef,
    mp: &Path,
    wait: Duration,
    limit: Duration,
) -> Result<BusyEnd, Error> {
    let answer =
        control::request(m, &Request::Sync, Some(wait)).map_err(|e| daemon_error(m, &e))?;
    let outcome: SyncOutcome = serde_json::from_value(answer).map_err(bad_answer)?;
    if outcome.share_unreachable.is_none() {
        print_outcome("sync", &outcome);
    }
    let until = Instant::now() + limit;
    loop {
        match fusermount(mp, &["-u"])? {
            Ok(()) => return Ok(BusyEnd::Unmounted),
            Err(err) if !err.contains("busy") => {
                return Err(fail(format!("cannot unmount {}: {err}", mp.display())))
            }
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(200)),
            Err(_) => break,
        }
    }
    let users = processes_using(mp, 10);
    let pid = control::status(m, STATUS_TIMEOUT)
        .map(|s| s.pid.to_string())
        .unwrap_or_else(|_| "?".into());
    if let Err(err) = fusermount(mp, &["-u", "-z"])? {
        return Err(fail(format!("cannot detach {}: {err}", mp.display())));
    }
    let who = if users.is_empty() {
        "programs".to_string()
    } else {
        users.join(", ")
    };
    let detached = format!(
        "{} still in use after {} s by {who}; detached lazily: the daemon (pid {pid}) serves them and syncs again once the last one lets go",
        mp.display(),
        limit.as_secs()
    );
    Ok(BusyEnd::Detached(if outcome.ok {
        say!("ccfs: everything written so far is on the share; {detached}");
        Ok(())
    } else {
        Err(fail(format!(
            "the sync before detaching did not finish ({}); {detached}; what is left is kept in {}",
            outcome.error.as_deref().unwrap_or("incomplete"),
            m.cache_dir.display()
        )))
    }))
}

/// How a logout with a busy mount ended.
pub(crate) enum BusyEnd {
    /// The programs let go in time: unmounted the usual way.
    Unmounted,
    /// Detached lazily; the command's result.
    Detached(Result<(), Error>),
}

pub(crate) fn umount_cmd(
    mountpoint: Option<PathBuf>,
    user: Option<String>,
    config: Option<PathBuf>,
    wait: u64,
    busy_timeout: Option<u64>,
) -> Result<(), Error> {
    let mountpoint = match (mountpoint, user) {
        (Some(m), _) => m,
        (None, user) => {
            let (_, settings) = daemon::effective_config(config.as_deref())?;
            let name = named_user(user.as_deref())?;
            daemon::home_paths(&settings, &name)?.1
        }
    };
    umount(
        &mountpoint,
        Duration::from_secs(wait),
        busy_timeout.map(Duration::from_secs),
    )
}
