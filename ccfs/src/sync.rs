//! Sync-back: sends the cache's dirty paths to the share with rsync (see [`crate::rsync`])
//! under the overlay's conflict checks, then applies the recorded deletions.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::overlay::Overlay;
pub use crate::rsync::*;

/// Which sync this is: a logout or a recovery empties the cache once everything is on the
/// share; a sync while mounted keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    Session,
    Logout,
    Recover,
}

/// A file the sync sends itself (not through rsync).
type Sender<'a> = dyn Fn(&Overlay, &Path) -> std::io::Result<Put> + 'a;

/// Sends the plain files `direct` (see `overlay/send_files.rs`); what each rename put
/// there, which settles them whatever became of the other transfers (the share's file must
/// still be the one renamed into place: another workstation's save renamed over it since,
/// in another second, is not ours).
fn send_plain_files(
    overlay: &Overlay,
    direct: &[PathBuf],
    why: &mut Vec<String>,
) -> HashMap<PathBuf, Option<Put>> {
    let sent = overlay.send_files(direct);
    why.extend(sent.errors);
    direct
        .iter()
        .map(|p| (p.clone(), sent.put.get(p).copied()))
        .collect()
}

/// Sends the files the sync sends itself besides the plain ones (mostly holes, held by
/// block), each kind one
/// part of the transfer, with what it says landed; why a file could not be sent goes to
/// `why`.
fn send_ourselves(
    overlay: &Overlay,
    session: &crate::overlay::SyncSession<'_>,
    parts: &mut Vec<(Transfer, Option<Listed>)>,
    why: &mut Vec<String>,
) {
    let send_sparse = |o: &Overlay, p: &Path| o.send_sparse(p);
    let send_blocks = |o: &Overlay, p: &Path| o.send_blocks(p, session.block_snapshots.get(p));
    let senders: [(&Vec<PathBuf>, &Sender); 2] = [
        (&session.sparse, &send_sparse),
        (&session.by_blocks, &send_blocks),
    ];
    for (sent_here, send) in senders {
        if sent_here.is_empty() {
            continue;
        }
        let mut put = HashMap::new();
        for p in sent_here {
            match send(overlay, p) {
                Ok(what) => {
                    put.insert(p.clone(), what);
                }
                Err(e) => why.push(format!("cannot send {}: {e}", crate::journal::escape(p))),
            }
        }
        let t = if put.len() == sent_here.len() {
            Transfer::Complete
        } else {
            Transfer::Reported(put.clone())
        };
        parts.push((t, Some(put)));
    }
}

/// The part of a sync rsync does: the snapshots first, into directories the share has (no
/// directory is made for them: the cache's may be gone by now), and the cache's `files`
/// after them: where the two views of a path differ (a file written, then renamed away
/// and a directory made at its name while the sync took its snapshots), the later one
/// stands, as when rsync reads everything from the cache. (The snapshots stay until the
/// session is settled: a file found as its snapshot then is clean, see
/// `SyncSession::finish`.) ACLs and xattrs go only when a handed file has some (see
/// `carried_attributes`).
fn send_with_rsync(
    overlay: &Overlay,
    session: &crate::overlay::SyncSession<'_>,
    opts: &RsyncOptions,
    files: &[PathBuf],
    parts: &mut Vec<(Transfer, Option<Listed>)>,
    why: &mut Vec<String>,
) -> Result<(), SyncError> {
    let mut rsync_opts = opts.clone();
    rsync_opts.caps.acls &= session.carries.acls;
    rsync_opts.caps.xattrs &= session.carries.xattrs;
    rsync_opts.implied_dirs |= session.carries.implied_dirs;
    if !session.snapshots.is_empty() {
        let mut snapshot_opts = rsync_opts.clone();
        snapshot_opts.implied_dirs = false;
        let sent = rsync_reported(
            &snapshot_opts,
            &overlay.snapshot_root(),
            overlay.share(),
            &session.snapshots,
        );
        if sent.is_err() {
            overlay.drop_snapshots();
        }
        let (t, w, l) = sent?;
        parts.push((t, l));
        why.extend(w);
    }
    if !files.is_empty() {
        let (t, w, l) = rsync_reported(&rsync_opts, overlay.upper(), overlay.share(), files)?;
        parts.push((t, l));
        why.extend(w);
    }
    Ok(())
}

/// The files of `session` rsync sends from the cache: all but the snapshots (which it
/// sends from theirs) and those the sync sends itself (`direct`, mostly holes, held by
/// block).
fn rsync_files(session: &crate::overlay::SyncSession<'_>, direct: &[PathBuf]) -> Vec<PathBuf> {
    let sent_here: std::collections::HashSet<&PathBuf> = session
        .snapshots
        .iter()
        .chain(&session.sparse)
        .chain(&session.by_blocks)
        .chain(direct)
        .collect();
    session
        .files
        .iter()
        .filter(|p| !sent_here.contains(p))
        .cloned()
        .collect()
}

/// The outcome of one sync.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SyncReport {
    /// Paths handed to rsync.
    pub sent: usize,
    /// Paths whose dirty mark was cleared.
    pub cleaned: usize,
    /// Changed files whose bytes, mode and owner the share already had: not sent, clean
    /// (counted in `cleaned` too).
    #[serde(default)]
    pub unchanged: usize,
    /// Deletions applied on the share.
    pub deleted: usize,
    /// Unsynced paths and deletions left after this sync.
    pub remaining_dirty: usize,
    pub remaining_deletions: usize,
    pub errors: Vec<String>,
    /// Conflicts found before sending (both versions kept).
    #[serde(default)]
    pub conflicts: Vec<crate::overlay::Conflict>,
    /// Paths handed to rsync that did not reach the share (they stay in the cache).
    #[serde(default)]
    pub not_sent: Vec<PathBuf>,
    /// The cache was emptied of unsynced work after a logout or recovery that put
    /// everything on the share (clean copies stay for the next login, checked against the
    /// share before they serve).
    #[serde(default)]
    pub cache_dropped: bool,
    /// Files sent but kept as unsynced work because something could still write them:
    /// open for writing (a program, a shared mapping whose descriptor was closed, a
    /// program of a session whose daemon ended, writing through kernel passthrough), or
    /// written after they were handed to rsync. The next sync sends them again.
    #[serde(default)]
    pub kept_open: Vec<PathBuf>,
    /// The regular files the sync sent itself, not through rsync (see
    /// `overlay/send_files.rs`), in the order sent.
    #[serde(skip)]
    pub sent_directly: Vec<PathBuf>,
    pub ok: bool,
    pub seconds: f64,
    /// Unix time at the end of the sync.
    pub finished_at: u64,
}

/// This machine's name, for conflict copies.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_string())
        .replace(['/', ' '], "_")
}

/// A UTC timestamp `YYYYMMDDTHHMMSSZ` for conflict copies.
pub fn stamp(t: SystemTime) -> String {
    let (y, m, d, h, min, s) = civil(t);
    format!("{y:04}{m:02}{d:02}T{h:02}{min:02}{s:02}Z")
}

/// A UTC time as a person reads it: `2026-11-29 09:30:12 UTC`.
pub fn readable(t: SystemTime) -> String {
    let (y, m, d, h, min, s) = civil(t);
    format!("{y:04}-{m:02}-{d:02} {h:02}:{min:02}:{s:02} UTC")
}

/// Year, month, day, hour, minute, second of `t` in UTC.
fn civil(t: SystemTime) -> (i64, i64, i64, i64, i64, i64) {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, rem / 3600, rem / 60 % 60, rem % 60)
}

/// Sends what the journal says the cache has and the share lacks, after checking each path
/// against the share (conflicts keep both versions). Paths that cannot be checked or sent
/// are reported and stay in the cache; the others go on. A logout or a recovery that put
/// everything on the share empties the cache, so the next mount starts from the share.
pub fn run_sync(
    overlay: &Overlay,
    opts: &RsyncOptions,
    mode: SyncMode,
) -> Result<SyncReport, SyncError> {
    let start = Instant::now();
    let session = overlay.begin_sync(&hostname(), &stamp(SystemTime::now()))?;
    let checked = start.elapsed();
    let by_block = session.by_blocks.len();
    let mut report = SyncReport {
        sent: session.files.len(),
        unchanged: session.unchanged,
        conflicts: session.conflicts.clone(),
        ..Default::default()
    };
    // What each file was as it was handed over: one that is not so afterwards was written
    // meanwhile, and emptying the cache keeps it (a program of a crashed session writes
    // without the daemon, see `Overlay::drop_clean_cache`).
    let handed = session.handed();
    // Kinds of transfer, each with what it says landed: the snapshots of files being
    // written (see `overlay/snapshot.rs`) and the cache's files that rsync sends, then
    // the files ccfs sends itself (plain ones, mostly holes, held by block). rsync
    // arguments of the configuration's own apply to every file: then rsync sends them all.
    let direct: &[PathBuf] = if opts.extra_args.is_empty() {
        &session.direct
    } else {
        &[]
    };
    let files = rsync_files(&session, direct);
    let mut parts: Vec<(Transfer, Option<Listed>)> = Vec::new();
    let mut why: Vec<String> = Vec::new();
    send_with_rsync(overlay, &session, opts, &files, &mut parts, &mut why)?;
    let rsynced = start.elapsed();
    let exact = overlay.while_sending(|| {
        let exact = send_plain_files(overlay, direct, &mut why);
        send_ourselves(overlay, &session, &mut parts, &mut why);
        exact
    });
    report.sent_directly = direct.to_vec();
    // The directories rsync sent keep the times it gave them.
    let own_dirs: std::collections::HashSet<&Path> = direct
        .iter()
        .chain(&session.sparse)
        .chain(&session.by_blocks)
        .filter_map(|p| p.parent())
        .collect();
    let rsync_dirs: Vec<&Path> = files
        .iter()
        .map(PathBuf::as_path)
        .filter(|p| own_dirs.contains(p))
        .collect();
    overlay.restore_dir_times(&rsync_dirs);
    let sent_here = start.elapsed();
    let transfer = match all_of(parts) {
        rest if exact.is_empty() => rest,
        rest => Transfer::Partly {
            exact,
            rest: Box::new(rest),
        },
    };
    let why = (!why.is_empty()).then(|| why.join("; "));
    let settled = session.finish(transfer);
    overlay.drop_snapshots();
    let settled = settled?;
    let finished = start.elapsed();
    report.cleaned = settled.cleaned + report.unchanged;
    report.deleted = settled.deleted;
    report.conflicts.extend(settled.conflicts);
    report.errors = settled.errors;
    report.errors.extend(why);
    report.not_sent = settled.not_sent;
    report.kept_open = settled.still_written;
    if mode != SyncMode::Session {
        let emptied = overlay.drop_clean_cache(&handed)?;
        report.cache_dropped = emptied.dropped;
        for p in emptied.kept_open {
            if !report.kept_open.contains(&p) {
                report.kept_open.push(p);
            }
        }
    }
    if !report.cache_dropped {
        if let Err(e) = overlay.compact() {
            // The journal stays valid (uncompacted); a full cache is the usual cause.
            tracing::warn!("journal compaction failed: {e}");
        }
    }
    let (dirty, _, deletions) = overlay.pending();
    report.remaining_dirty = dirty;
    report.remaining_deletions = deletions;
    // A file whose changes were kept in the cache as blocks did not reach the share.
    report.ok = report.errors.is_empty()
        && !report
            .conflicts
            .iter()
            .any(|c| c.kind == crate::overlay::ConflictKind::BlocksKeptHere);
    report.seconds = start.elapsed().as_secs_f64();
    // Where a sync's time goes, each phase as milliseconds from its start.
    let ms = |d: std::time::Duration| d.as_millis() as u64;
    tracing::info!(
        mode = ?mode,
        rsync_files = files.len(),
        sent_directly = report.sent_directly.len(),
        by_block,
        checked_ms = ms(checked),
        rsynced_ms = ms(rsynced),
        sent_here_ms = ms(sent_here),
        settled_ms = ms(finished),
        total_ms = ms(start.elapsed()),
        "sync phases"
    );
    report.finished_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stamps_are_utc_calendar_times() {
        assert_eq!(stamp(UNIX_EPOCH), "19700101T000000Z");
        assert_eq!(
            stamp(UNIX_EPOCH + Duration::from_secs(951_782_400 + 3_723)),
            "20000229T010203Z"
        );
        assert_eq!(
            stamp(UNIX_EPOCH + Duration::from_secs(1_795_298_334)),
            "20261121T215854Z"
        );
    }
}
