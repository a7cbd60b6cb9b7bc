//! Sync-back: the rsync command line (pure) and the runner that sends the cache's dirty
//! paths to the share, then applies the recorded deletions.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::overlay::Overlay;

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

/// How to run rsync.
#[derive(Debug, Clone)]
pub struct RsyncOptions {
    pub binary: PathBuf,
    pub extra_args: Vec<String>,
    pub timeout: Duration,
    pub caps: ShareCaps,
    /// rsync 3.2.4+ knows `--fsync`.
    pub fsync: bool,
}

/// The rsync command line (without the program name) for one sync.
/// `update_only` (crash recovery) keeps any share file newer than the cache's copy.
/// The file list is read from standard input (`--files-from=-`), so a sync needs no space
/// in a full cache.
pub fn rsync_args(
    opts: &RsyncOptions,
    upper: &Path,
    share: &Path,
    update_only: bool,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "--archive".into(),
        // Every listed path changed: never let the size+mtime quick check skip one.
        "--ignore-times".into(),
        "--hard-links".into(),
        "--delay-updates".into(),
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
    if update_only {
        args.push("--update".into());
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

/// Sends what the cache has and the share lacks. With `everything` (crash recovery) the
/// whole cache is offered to rsync with `--update`, since the journal may lag the cache.
/// Conflicts with changes made on the share are resolved first (both versions kept).
/// Nothing is marked clean unless rsync reported success.
pub fn run_sync(
    overlay: &Overlay,
    opts: &RsyncOptions,
    everything: bool,
) -> Result<SyncReport, SyncError> {
    let start = Instant::now();
    let conflicts = overlay.resolve_conflicts(&hostname(), &stamp(SystemTime::now()))?;
    let snap = overlay.begin_sync(everything)?;
    let result = (|| -> Result<SyncReport, SyncError> {
        let mut report = SyncReport {
            sent: snap.files.len(),
            conflicts,
            ..Default::default()
        };
        if !snap.files.is_empty() {
            overlay.clean_partial_transfers(&snap)?;
            overlay.mark_sending(&snap)?;
            let args = rsync_args(opts, overlay.upper(), overlay.share(), everything);
            tracing::info!(files = snap.files.len(), "rsync to share");
            let mut child = Command::new(&opts.binary)
                .args(&args)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|source| SyncError::Spawn {
                    binary: opts.binary.clone(),
                    source,
                })?;
            let mut list = Vec::new();
            for p in &snap.files {
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
            let code = out.status.code().unwrap_or(-1);
            if let Some(sig) = std::os::unix::process::ExitStatusExt::signal(&out.status) {
                return Err(SyncError::Rsync {
                    code,
                    stderr: format!("rsync was killed by signal {sig}"),
                });
            }
            // 24: some source files vanished (deleted meanwhile): still dirty-safe, since
            // only paths unchanged since the snapshot are marked clean.
            if code != 0 && code != 24 {
                return Err(SyncError::Rsync {
                    code,
                    stderr: tail(&out.stderr, 4),
                });
            }
            fed.map_err(SyncError::List)?;
        }
        report.cleaned = overlay.finish_sync(&snap)?;
        for d in &snap.deletions {
            match overlay.apply_deletion(d) {
                Ok(()) => report.deleted += 1,
                Err(e) => report
                    .errors
                    .push(format!("cannot delete {} on the share: {e}", d.display())),
            }
        }
        Ok(report)
    })();
    overlay.end_sync();
    let mut report = result?;
    if let Err(e) = overlay.compact() {
        // The journal stays valid (uncompacted); a full cache is the usual cause.
        tracing::warn!("journal compaction failed: {e}");
    }
    let inner = overlay.lock();
    report.remaining_dirty = inner.state().dirty_count();
    report.remaining_deletions = inner.state().whiteout_count();
    drop(inner);
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
            false,
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
    fn recovery_keeps_newer_share_files() {
        let a = rsync_args(
            &opts(ShareCaps::default()),
            Path::new("u"),
            Path::new("s"),
            true,
        );
        assert!(a.iter().any(|x| x == "--update"));
        assert!(!a.iter().any(|x| x == "--xattrs" || x == "--acls"));
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
