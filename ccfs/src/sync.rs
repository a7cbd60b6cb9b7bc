//! Sync-back: the rsync command line (pure) and the runner that sends the cache's dirty
//! paths to the share, then applies the recorded deletions.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
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
pub fn rsync_args(
    opts: &RsyncOptions,
    list: &Path,
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
    let mut files_from = OsString::from("--files-from=");
    files_from.push(list.as_os_str());
    args.push(files_from);
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
    #[error("cannot write the rsync file list: {0}")]
    List(std::io::Error),
}

fn write_list(path: &Path, files: &[PathBuf]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    for p in files {
        f.write_all(p.as_os_str().as_bytes())?;
        f.write_all(b"\0")?;
    }
    f.sync_all()
}

fn tail(text: &[u8], lines: usize) -> String {
    let s = String::from_utf8_lossy(text);
    let v: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    v[v.len().saturating_sub(lines)..].join(" | ")
}

/// Sends what the cache has and the share lacks. With `everything` (crash recovery) the
/// whole cache is offered to rsync with `--update`, since the journal may lag the cache.
/// Nothing is marked clean unless rsync reported success.
pub fn run_sync(
    overlay: &Overlay,
    opts: &RsyncOptions,
    list: &Path,
    everything: bool,
) -> Result<SyncReport, SyncError> {
    let start = Instant::now();
    let snap = overlay.begin_sync(everything)?;
    let result = (|| -> Result<SyncReport, SyncError> {
        let mut report = SyncReport {
            sent: snap.files.len(),
            ..Default::default()
        };
        if !snap.files.is_empty() {
            write_list(list, &snap.files).map_err(SyncError::List)?;
            let args = rsync_args(opts, list, overlay.upper(), overlay.share(), everything);
            tracing::info!(files = snap.files.len(), "rsync to share");
            let out = Command::new(&opts.binary)
                .args(&args)
                .output()
                .map_err(|source| SyncError::Spawn {
                    binary: opts.binary.clone(),
                    source,
                })?;
            let _ = std::fs::remove_file(list);
            let code = out.status.code().unwrap_or(-1);
            // 24: some source files vanished (deleted meanwhile): still dirty-safe, since
            // only paths unchanged since the snapshot are marked clean.
            if code != 0 && code != 24 {
                return Err(SyncError::Rsync {
                    code,
                    stderr: tail(&out.stderr, 4),
                });
            }
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
    overlay.compact()?;
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
            Path::new("/c/list"),
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
        assert!(a.contains(&"--files-from=/c/list".to_string()));
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
            Path::new("l"),
            Path::new("u"),
            Path::new("s"),
            true,
        );
        assert!(a.iter().any(|x| x == "--update"));
        assert!(!a.iter().any(|x| x == "--xattrs" || x == "--acls"));
    }

    #[test]
    fn find_program_checks_path_and_explicit_paths() {
        assert!(find_program("sh").is_some());
        assert!(find_program("/bin/sh").is_some());
        assert!(find_program("/nonexistent/rsync").is_none());
        assert!(find_program("no-such-program-ccfs").is_none());
    }
}
