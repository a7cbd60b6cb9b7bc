//! `ccfs status` and `ccfs sync`: the control socket, from the client side.

use crate::*;

/// A path as ccfs prints it: printable ASCII only (see [`daemon::LogPath`]).
pub(crate) fn shown(p: &Path) -> String {
    daemon::LogPath(p).to_string()
}

/// How long `ccfs status` and `ccfs umount` wait for a daemon's status (the daemon looks
/// at the share for at most `control::PROBE_TIMEOUT` of it).
pub(crate) const STATUS_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `ccfs umount` waits for the logout sync's answer between two looks at whether
/// the share still answers.
pub(crate) const WAIT_SLICE: Duration = Duration::from_secs(5);

/// The ccfs mount at `mountpoint` and where its daemon listens, found in the mount table:
/// nothing asks the mount itself, which may be waiting on a dead or hung share.
pub(crate) fn control_socket(mountpoint: &Path) -> Result<control::MountRef, Error> {
    let entry = control::find_mount(mountpoint).map_err(|e| {
        user_error(
            format!("mountpoint {}: {e}", mountpoint.display()),
            "give the directory where ccfs is mounted",
        )
    })?;
    let Some(entry) = entry else {
        // Not a mount point of ccfs: looking at the path cannot hang on a share.
        if std::fs::symlink_metadata(mountpoint).is_err() {
            return Err(user_error(
                format!("mountpoint {} does not exist", mountpoint.display()),
                "give the directory where ccfs is mounted",
            )
            .into());
        }
        return Err(user_error(
            format!("{} is not a ccfs mount", mountpoint.display()),
            "see `ccfs status` for the ccfs mounts of this machine",
        )
        .into());
    };
    control::mount_ref(&entry).map_err(fail)
}

/// Why a mount's daemon could not be asked, in one line with what to do.
pub(crate) fn daemon_error(m: &control::MountRef, e: &std::io::Error) -> Error {
    let mp = m.mountpoint.display();
    if control::daemon_gone(e) {
        fail(format!(
            "{mp}: its ccfs daemon is gone ({e}): `fusermount3 -u -z {mp}`, then `ccfs recover --cache-dir {}`",
            m.cache_dir.display()
        ))
    } else if control::timed_out(e) {
        fail(format!(
            "{mp}: its ccfs daemon did not answer in time (stopped or stuck?); its log is {}",
            m.cache_dir.join("ccfs.log").display()
        ))
    } else {
        fail(format!("{mp}: cannot ask its ccfs daemon: {e}"))
    }
}

pub(crate) fn bad_answer(e: impl std::fmt::Display) -> Error {
    fail(format!("the ccfs daemon answered badly: {e}"))
}

pub(crate) fn print_outcome(what: &str, o: &SyncOutcome) {
    match (&o.report, &o.error) {
        (Some(r), _) => {
            say!(
                "ccfs: {what}: sent {} paths, deleted {} on the share in {:.2}s; left unsynced: {} paths, {} deletions",
                r.sent, r.deleted, r.seconds, r.remaining_dirty, r.remaining_deletions
            );
            match r.unchanged {
                0 => {}
                1 => say!("ccfs: {what}: 1 changed file was on the share as it is: not sent"),
                n => {
                    say!("ccfs: {what}: {n} changed files were on the share as they are: not sent")
                }
            }
            for e in &r.errors {
                say!("ccfs: {what}: {}", daemon::LogText(e));
            }
            for c in &r.conflicts {
                say!("ccfs: {what}: {}", describe_conflict(c));
            }
            for p in &r.kept_open {
                say!(
                    "ccfs: {what}: {} was sent as it was, and is kept as unsynced work: a program may still write it (it is open for writing, or mapped); the next sync, logout or recovery sends what it writes",
                    shown(p)
                );
            }
        }
        (None, Some(e)) if o.share_unreachable.is_some() => {
            say!("ccfs: {what} not started: {}", daemon::LogText(e))
        }
        (None, Some(e)) => say!("ccfs: {what} failed: {}", daemon::LogText(e)),
        (None, None) => {}
    }
}

pub(crate) fn describe_conflict(c: &ccfs::overlay::Conflict) -> String {
    use ccfs::overlay::ConflictKind as K;
    // Names from the cache and the share are the user's: printed escaped, one line each.
    let p = shown(&c.path);
    let kept = daemon::LogText(&c.kept);
    match c.kind {
        K::ModifiedOnBoth => format!(
            "conflict: {p} was changed on the share (another login?) and here; the share keeps the other version, ours is saved as {kept}"
        ),
        K::CreatedOnBoth => format!(
            "conflict: {p} was created on the share and here; the share keeps the other version, ours is saved as {kept}"
        ),
        K::DeletedHereModifiedThere => {
            format!("conflict: {p} was deleted here but changed on the share; the share's version is kept")
        }
        K::ModifiedHereDeletedThere => {
            format!("conflict: {p} was deleted on the share but changed here; ours is written back")
        }
        K::DatabaseChangedThere => format!(
            "conflict: the database {p} belongs to was changed on the share (another login?) since this journal or WAL was written here; the share keeps its database, ours is saved as {kept}"
        ),
        K::BlocksKeptHere => format!(
            "not on the share: {p} was changed here while held by block, and the share's version the blocks this workstation lacks come from was rewritten meanwhile (in place by another program or login, or replaced while this workstation did not hold it); ours cannot be made whole: the share's version shows, and the blocks written here are kept in the cache directory as {kept} (their list beside it)"
        ),
    }
}

pub(crate) fn sync_cmd(mountpoint: &Path) -> Result<(), Error> {
    let m = control_socket(mountpoint)?;
    // No time limit: sending much data takes long, and the daemon does not start a sync
    // the share would hold up (it looks at the share first, for a bounded time).
    let answer = control::request(&m, &Request::Sync, None).map_err(|e| daemon_error(&m, &e))?;
    let outcome: SyncOutcome = serde_json::from_value(answer).map_err(bad_answer)?;
    if outcome.share_unreachable.is_some() {
        return Err(fail(format!(
            "sync not started: {}",
            outcome.error.as_deref().unwrap_or("share unreachable")
        )));
    }
    print_outcome("sync", &outcome);
    if outcome.ok {
        Ok(())
    } else {
        Err(fail(
            "the sync did not finish; the changes stay in the cache",
        ))
    }
}

pub(crate) fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

/// A unix time as `2026-11-29 09:30:12 UTC (5 min ago)`.
pub(crate) fn when(unix: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_secs(unix);
    let ago = std::time::SystemTime::now()
        .duration_since(t)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let ago = match ago {
        s if s < 60 => format!("{s} s ago"),
        s if s < 3600 => format!("{} min ago", s / 60),
        s if s < 86_400 => format!("{} h {} min ago", s / 3600, s / 60 % 60),
        s => format!("{} days ago", s / 86_400),
    };
    format!("{} ({ago})", ccfs::sync::readable(t))
}

/// What `ccfs status --verbose` adds for a mount: the cache's size, the unsynced paths
/// and the pending deletions.
fn say_pending(m: &control::MountRef, st: &Status) {
    match control::pending(m, STATUS_TIMEOUT) {
        Ok(p) => {
            // Counted by the daemon, as the cache's owner: root walks no user's directory.
            if let Some((bytes, whole)) = p.cache_bytes {
                say!(
                    "  cache: {}{} on its disk",
                    if whole { "" } else { "at least " },
                    human_bytes(bytes)
                );
            }
            for (what, list, of) in [
                ("unsynced", &p.dirty, st.dirty_files),
                ("to delete on the share", &p.deletions, st.pending_deletions),
            ] {
                if list.is_empty() {
                    continue;
                }
                say!("  {what}:");
                for path in list {
                    say!("    {}", shown(path));
                }
                if of > list.len() {
                    say!("    ... and {} more", of - list.len());
                }
            }
        }
        Err(e) => say!("  paths: not listed: {}", daemon::LogText(&e.to_string())),
    }
}
/// The status's transport line.
fn say_transport(t: &ccfs::fuse::TransportState) {
    // The daemon's words (a user's daemon): escaped, as every text it sends.
    let serving = daemon::LogText(&t.serving);
    match &t.refused {
        Some(why) => say!(
            "  transport: {serving} (io-uring asked for, not used: {})",
            daemon::LogText(why)
        ),
        None if t.serving == "io-uring" => say!(
            "  transport: io-uring ({} requests over the ring)",
            t.ring_requests
        ),
        None => say!("  transport: {serving}"),
    }
}

pub(crate) fn status_cmd(
    mountpoint: Option<&Path>,
    json: bool,
    verbose: bool,
) -> Result<(), Error> {
    let mounts: Vec<Result<control::MountRef, Error>> = match mountpoint {
        Some(m) => vec![Ok(control_socket(m)?)],
        None => control::ccfs_mount_table()
            .map_err(|e| fail(format!("cannot read the mount table: {e}")))?
            .iter()
            .map(|e| control::mount_ref(e).map_err(fail))
            .collect(),
    };
    let listed = mounts.len();
    let mut all: Vec<(control::MountRef, Status)> = Vec::new();
    for m in mounts {
        let one = m.and_then(|m| {
            let st = control::status(&m, STATUS_TIMEOUT).map_err(|e| daemon_error(&m, &e))?;
            Ok((m, st))
        });
        match one {
            // The same daemon seen through a second mount point (a bind mount).
            Ok((_, st)) if all.iter().any(|(_, s)| s.cache_dir == st.cache_dir) => {}
            Ok(pair) => all.push(pair),
            // Listing every mount: one that cannot be asked is reported, not fatal.
            Err(Error::Failure(Failure(msg))) if mountpoint.is_none() => {
                daemon::report_fatal(&format!("ccfs: {msg}"))
            }
            Err(e) => return Err(e),
        }
    }
    if json {
        let statuses: Vec<&Status> = all.iter().map(|(_, s)| s).collect();
        let text = match (mountpoint, statuses.first()) {
            (Some(_), Some(st)) => serde_json::to_string_pretty(st),
            _ => serde_json::to_string_pretty(&statuses),
        };
        say!("{}", text.map_err(|e| fail(e.to_string()))?);
        return Ok(());
    }
    if listed == 0 {
        say!("no ccfs mounts");
    }
    for (m, st) in all {
        say!(
            "{}  share {}  cache {}  pid {}",
            st.mountpoint.display(),
            st.share.display(),
            st.cache_dir.display(),
            st.pid
        );
        match &st.share_health {
            Some(h) if h.is_reachable() => say!("  share: reachable"),
            Some(h) => say!(
                "  share: unreachable: {}; syncs are not started, the cache keeps the changes",
                h.describe()
            ),
            None => say!("  share: not known (an older daemon)"),
        }
        say!(
            "  dirty: {} paths, {}   pending deletions: {}{}",
            st.dirty_files,
            human_bytes(st.dirty_bytes),
            st.pending_deletions,
            match st.counts_as_of {
                Some(t) => format!(
                    "   (counted at {}: the filesystem is busy waiting on the share)",
                    when(t)
                ),
                None => String::new(),
            }
        );
        let r = &st.requests;
        say!(
            "  requests served: {} ({} changing), read {}, written {}",
            r.total,
            r.mutating,
            human_bytes(r.read_bytes),
            human_bytes(r.write_bytes)
        );
        if let Some(t) = &st.transport {
            say_transport(t);
        }
        for c in &st.conflicts {
            say!("  {}", describe_conflict(c));
        }
        match &st.last_sync {
            None => say!("  last sync: none yet"),
            Some(o) => match (&o.report, &o.error) {
                (Some(r), _) => say!(
                    "  last sync: {} at {}: {} sent, {} deleted in {:.2} s",
                    if o.ok { "ok" } else { "incomplete" },
                    when(r.finished_at),
                    r.sent,
                    r.deleted,
                    r.seconds
                ),
                (None, Some(_)) if o.share_unreachable.is_some() => {
                    say!("  last sync: not started (share unreachable)")
                }
                (None, Some(e)) => say!("  last sync: failed: {e}"),
                (None, None) => {}
            },
        }
        if verbose {
            say_pending(&m, &st);
        }
    }
    Ok(())
}
