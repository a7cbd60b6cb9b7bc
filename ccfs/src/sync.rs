//! Sync-back: the rsync command line (pure) and the runner that sends the cache's dirty
//! paths to the share, then applies the recorded deletions.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::overlay::{Overlay, Transfer};

/// What the share supports, probed once per mount.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ShareCaps {
    pub xattrs: bool,
    pub acls: bool,
}

/// Probes the share root without writing to it: an absent attribute answers ENODATA where
/// the filesystem supports attributes, ENOTSUP where it does not.
pub fn probe_share(share: &Path) -> ShareCaps {
    let supported = |name: &str| match crate::sys::lgetxattr(share, std::ffi::OsStr::new(name)) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() == Some(libc::ENODATA),
    };
    ShareCaps {
        xattrs: supported("user.ccfs.probe"),
        acls: supported("system.posix_acl_access") || supported("system.posix_acl_default"),
    }
}

/// The holding directory rsync's `--delay-updates` uses in each directory it writes to.
/// Not rsync's default (`.~tmp~`), which may be a user's own: after an interrupted sync,
/// ccfs removes from this directory only the names it was sending (see
/// [`crate::overlay::SyncSession`]).
pub const PARTIAL_DIR: &str = ".ccfs-sync-partial~";

/// How to run rsync.
#[derive(Debug, Clone)]
pub struct RsyncOptions {
    pub binary: PathBuf,
    pub extra_args: Vec<String>,
    pub timeout: Duration,
    pub caps: ShareCaps,
    /// rsync 3.2.4+ knows `--fsync`.
    pub fsync: bool,
    /// A descriptor rsync (and every process it forks) inherits and keeps open while it
    /// runs: the cache's lock, so that `ccfs recover` cannot start while an rsync of a dead
    /// daemon still writes to the share.
    pub hold_fd: Option<std::os::fd::RawFd>,
}

/// Which sync this is: a logout or a recovery empties the cache once everything is on the
/// share; a sync while mounted keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    Session,
    Logout,
    Recover,
}

/// The rsync command line (without the program name) for one sync. Recovery runs the
/// same command as a logout: no `--update`, every listed path is sent, after the same
/// conflict checks. The file list is read from standard input (`--files-from=-`), so a
/// sync needs no space in a full cache.
pub fn rsync_args(opts: &RsyncOptions, upper: &Path, share: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "--archive".into(),
        // Every listed path changed: never let the size+mtime quick check skip one.
        "--ignore-times".into(),
        "--hard-links".into(),
        "--sparse".into(),
        "--delay-updates".into(),
        format!("--partial-dir={PARTIAL_DIR}").into(),
        "--force".into(),
        "--from0".into(),
        format!("--timeout={}", opts.timeout.as_secs().max(1)).into(),
    ];
    args.push("--files-from=-".into());
    if opts.caps.acls {
        args.push("--acls".into());
    }
    if opts.caps.xattrs {
        args.push("--xattrs".into());
    }
    if opts.fsync {
        args.push("--fsync".into());
    }
    args.extend(opts.extra_args.iter().map(OsString::from));
    let mut src = upper.as_os_str().to_os_string();
    src.push("/");
    let mut dst = share.as_os_str().to_os_string();
    dst.push("/");
    args.push(src);
    args.push(dst);
    args
}

/// Finds a program on PATH (or checks an explicit path).
pub fn find_program(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let is_exec = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        let p = PathBuf::from(name);
        return is_exec(&p).then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_exec(p))
}

/// True when this rsync knows `--fsync`.
pub fn rsync_has_fsync(binary: &Path) -> bool {
    Command::new(binary)
        .arg("--help")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("--fsync"))
        .unwrap_or(false)
}

/// The outcome of one sync.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SyncReport {
    /// Paths handed to rsync.
    pub sent: usize,
    /// Paths whose dirty mark was cleared.
    pub cleaned: usize,
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
    /// The cache was emptied after a logout or recovery that put everything on the share.
    #[serde(default)]
    pub cache_dropped: bool,
    /// Files the cache was not emptied of because they were still open for writing (a
    /// program of a session whose daemon ended writes them through kernel passthrough):
    /// kept as unsynced work for the next sync.
    #[serde(default)]
    pub kept_open: Vec<PathBuf>,
    pub ok: bool,
    pub seconds: f64,
    /// Unix time at the end of the sync.
    pub finished_at: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("rsync failed (exit {code}): {stderr}")]
    Rsync { code: i32, stderr: String },
    #[error("cannot start rsync {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Fs(#[from] crate::error::FsError),
    #[error("cannot pass the file list to rsync: {0}")]
    List(std::io::Error),
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
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn tail(text: &[u8], lines: usize) -> String {
    let s = String::from_utf8_lossy(text);
    let v: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    v[v.len().saturating_sub(lines)..].join(" | ")
}

/// Runs rsync over `files` (relative to `upper`); returns how the transfer ended and, when
/// it did not complete, why.
pub fn run_rsync(
    opts: &RsyncOptions,
    upper: &Path,
    share: &Path,
    files: &[PathBuf],
) -> Result<(Transfer, Option<String>), SyncError> {
    let args = rsync_args(opts, upper, share);
    tracing::info!(files = files.len(), "rsync to share");
    let mut cmd = Command::new(&opts.binary);
    cmd.args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    crate::sys::die_with_parent(&mut cmd, opts.hold_fd);
    let mut child = cmd.spawn().map_err(|source| SyncError::Spawn {
        binary: opts.binary.clone(),
        source,
    })?;
    let mut list = Vec::new();
    for p in files {
        list.extend_from_slice(p.as_os_str().as_bytes());
        list.push(0);
    }
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| SyncError::List(std::io::Error::other("no stdin")))?;
    let feeder = std::thread::spawn(move || stdin.write_all(&list));
    let out = child.wait_with_output().map_err(SyncError::List)?;
    let fed = feeder
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("list writer panicked")));
    if let Some(sig) = std::os::unix::process::ExitStatusExt::signal(&out.status) {
        return Ok((
            Transfer::Incomplete,
            Some(format!("rsync was killed by signal {sig}")),
        ));
    }
    let code = out.status.code().unwrap_or(-1);
    if code != 0 {
        return Ok((
            Transfer::Incomplete,
            Some(format!("rsync exit {code}: {}", tail(&out.stderr, 4))),
        ));
    }
    if let Err(e) = fed {
        return Ok((
            Transfer::Incomplete,
            Some(format!("cannot pass the file list to rsync: {e}")),
        ));
    }
    Ok((Transfer::Complete, None))
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
    let mut report = SyncReport {
        sent: session.files.len(),
        conflicts: session.conflicts.clone(),
        ..Default::default()
    };
    // What each file is as it is handed over: one that is not so afterwards was written
    // meanwhile, and emptying the cache keeps it (a program of a crashed session writes
    // without the daemon, see `Overlay::drop_clean_cache`).
    let handed: std::collections::HashMap<PathBuf, crate::sys::Version> = session
        .files
        .iter()
        .filter_map(|p| overlay.upper_version(p).map(|v| (p.clone(), v)))
        .collect();
    let (transfer, why) = if session.files.is_empty() {
        (Transfer::Complete, None)
    } else {
        run_rsync(opts, overlay.upper(), overlay.share(), &session.files)?
    };
    let settled = session.finish(transfer)?;
    report.cleaned = settled.cleaned;
    report.deleted = settled.deleted;
    report.conflicts.extend(settled.conflicts);
    report.errors = settled.errors;
    report.errors.extend(why);
    report.not_sent = settled.not_sent;
    if mode != SyncMode::Session {
        let emptied = overlay.drop_clean_cache(&handed)?;
        report.cache_dropped = emptied.dropped;
        report.kept_open = emptied.kept_open;
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
    report.ok = report.errors.is_empty();
    report.seconds = start.elapsed().as_secs_f64();
    report.finished_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(caps: ShareCaps) -> RsyncOptions {
        RsyncOptions {
            binary: PathBuf::from("rsync"),
            extra_args: vec!["--bwlimit=100".into()],
            timeout: Duration::from_secs(30),
            caps,
            fsync: true,
            hold_fd: None,
        }
    }

    #[test]
    fn argv_has_delay_updates_list_and_trailing_slashes() {
        let a = rsync_args(
            &opts(ShareCaps {
                xattrs: true,
                acls: false,
            }),
            Path::new("/c/upper"),
            Path::new("/share/alice"),
        );
        let a: Vec<String> = a.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        for want in [
            "--archive",
            "--ignore-times",
            "--delay-updates",
            "--hard-links",
            "--from0",
            "--xattrs",
            "--fsync",
            "--sparse",
            "--partial-dir=.ccfs-sync-partial~",
        ] {
            assert!(a.contains(&want.to_string()), "{want} missing from {a:?}");
        }
        assert!(!a.contains(&"--acls".to_string()));
        assert!(!a.contains(&"--update".to_string()));
        assert!(a.contains(&"--files-from=-".to_string()));
        assert!(a.contains(&"--timeout=30".to_string()));
        assert_eq!(
            &a[a.len() - 3..],
            ["--bwlimit=100", "/c/upper/", "/share/alice/"]
        );
    }

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

    #[test]
    fn find_program_checks_path_and_explicit_paths() {
        assert!(find_program("sh").is_some());
        assert!(find_program("/bin/sh").is_some());
        assert!(find_program("/nonexistent/rsync").is_none());
        assert!(find_program("no-such-program-ccfs").is_none());
    }
}
