//! A user's ccfs mount (and the meter's): `ccfs mount`, `ccfs umount` tried again while
//! busy, a dead daemon's mount detached, the request counters of `ccfs status`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::procs::{gone, reap, reap_cpu};
use super::ShareCounts;

/// A mounted ccfs, unmounted (and synced) on drop if still there.
pub(super) struct CcfsMount {
    ccfs: PathBuf,
    pub(super) mnt: PathBuf,
    /// The cache directory (its `ccfs.log` is the daemon's log).
    cache: PathBuf,
    mounted: bool,
    /// The daemon's process id, as `ccfs mount` printed it.
    pid: Option<u32>,
    /// The daemon's CPU seconds, once it exited and was reaped.
    pub(super) cpu_s: Option<f64>,
}

impl CcfsMount {
    pub(super) fn mount(
        ccfs: &Path,
        share: &Path,
        mnt: &Path,
        cache: &Path,
        config: Option<&Path>,
    ) -> Result<Self, String> {
        std::fs::create_dir_all(mnt).map_err(|e| format!("mkdir {}: {e}", mnt.display()))?;
        let mut c = Command::new(ccfs);
        c.arg("mount")
            .arg(share)
            .arg(mnt)
            .arg("--cache-dir")
            .arg(cache);
        if let Some(cfg) = config {
            c.arg("--config").arg(cfg);
        }
        let out = c.output().map_err(|e| {
            format!(
                "cannot run {}: {e}; build ccfs or pass --ccfs",
                ccfs.display()
            )
        })?;
        if !out.status.success() {
            return Err(format!(
                "ccfs mount {} failed: {}",
                mnt.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Self {
            ccfs: ccfs.to_path_buf(),
            mnt: mnt.to_path_buf(),
            cache: cache.to_path_buf(),
            mounted: true,
            pid: daemon_pid(&String::from_utf8_lossy(&out.stdout)),
            cpu_s: None,
        })
    }

    /// `ccfs umount` (which syncs). The other users' threads start processes all the time,
    /// and a child between fork and exec briefly holds this user's open files: a busy
    /// mount is tried again. The mount counts as gone only once it is. The daemon, ours
    /// once `ccfs mount` exited (this process is a subreaper), is then reaped for its CPU.
    pub(super) fn umount(&mut self) -> Result<(), String> {
        let mut tries = 0;
        while self.mounted {
            let out = Command::new(&self.ccfs)
                .arg("umount")
                .arg(&self.mnt)
                .output()
                .map_err(|e| format!("cannot run ccfs umount: {e}"))?;
            if out.status.success() {
                self.mounted = false;
                break;
            }
            let err = String::from_utf8_lossy(&out.stderr);
            tries += 1;
            let dead_mount = mount_dead(&self.mnt);
            if dead_mount || self.pid.is_some_and(gone) {
                // Its daemon has ended. Unmounted (the mount table no longer has it) and
                // exited 0, it ended as every logout ends, with everything on the share:
                // only `ccfs umount`'s report of it failed. Else it died mid-storm: its
                // mount is detached so that nothing is left mounted (its cache stays).
                let ended = self
                    .pid
                    .take()
                    .and_then(|pid| reap(pid, Duration::from_secs(5)));
                let unmounted = !dead_mount && !is_mounted(&self.mnt);
                if unmounted && ended.is_some_and(|(status, _)| status == 0) {
                    self.mounted = false;
                    self.cpu_s = ended.map(|(_, cpu)| cpu);
                    eprintln!(
                        "loadgen login-storm: ccfs umount {} failed ({}), but its daemon unmounted, synced everything and exited 0",
                        self.mnt.display(),
                        err.trim()
                    );
                    return Ok(());
                }
                detach(&self.mnt);
                self.mounted = false;
                return Err(format!(
                    "the ccfs daemon of {} had died ({}); its mount was detached; its log: {}; ccfs umount said: {}",
                    self.mnt.display(),
                    match ended {
                        Some((st, _)) if libc::WIFSIGNALED(st) =>
                            format!("killed by signal {}", libc::WTERMSIG(st)),
                        Some((st, _)) => format!("exit status {}", libc::WEXITSTATUS(st)),
                        None => "its exit status unknown: not this process's child".to_string(),
                    },
                    self.cache.join("ccfs.log").display(),
                    err.trim()
                ));
            }
            if !err.contains("busy") || tries == 20 {
                return Err(format!(
                    "ccfs umount {} failed: {}",
                    self.mnt.display(),
                    err.trim()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(pid) = self.pid.take() {
            self.cpu_s = reap_cpu(pid, Duration::from_secs(30));
        }
        Ok(())
    }

    /// Waits, at most `limit`, until the daemon's background copy of the blocks its files
    /// held by block lack has nothing left to do; the bytes left to it then.
    pub(super) fn wait_filled(&self, limit: Duration) -> Result<u64, String> {
        let start = std::time::Instant::now();
        loop {
            let left = self.status()?["held_by_block"]["to_fill_bytes"]
                .as_u64()
                .unwrap_or(0);
            if left == 0 || start.elapsed() >= limit || crate::stop::interrupted() {
                return Ok(left);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `ccfs status --json` of this mount.
    fn status(&self) -> Result<serde_json::Value, String> {
        let out = Command::new(&self.ccfs)
            .arg("status")
            .arg("--json")
            .arg(&self.mnt)
            .output()
            .map_err(|e| format!("cannot run ccfs status: {e}"))?;
        serde_json::from_slice(&out.stdout).map_err(|e| format!("ccfs status answered badly: {e}"))
    }

    pub(super) fn counts(&self) -> Result<ShareCounts, String> {
        let v = self.status()?;
        serde_json::from_value(v["requests"].clone())
            .map_err(|e| format!("ccfs status has no request counts: {e}"))
    }
}

impl Drop for CcfsMount {
    fn drop(&mut self) {
        let _ = self.umount();
    }
}

/// Whether a FUSE mount's daemon is gone (the kernel answers ENOTCONN).
fn mount_dead(mnt: &Path) -> bool {
    std::fs::metadata(mnt).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN))
}

/// Detaches a FUSE mount lazily (its daemon is gone, or is to be let go).
pub(super) fn detach(mnt: &Path) {
    let _ = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(mnt)
        .output();
}

/// The daemon's pid in `ccfs mount`'s line "ccfs: mounted ... (cache ..., pid N)".
fn daemon_pid(stdout: &str) -> Option<u32> {
    let line = stdout.lines().find(|l| l.starts_with("ccfs: mounted"))?;
    let at = line.rfind("pid ")?;
    line[at + 4..].trim_end_matches(')').trim().parse().ok()
}

/// Whether something is mounted at `mnt` (the mount table; the mount is not touched).
fn is_mounted(mnt: &Path) -> bool {
    fsinfo::mounts()
        .unwrap_or_default()
        .iter()
        .any(|m| m.mount_point == mnt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_pid_comes_from_ccfs_mount_s_line() {
        assert_eq!(
            daemon_pid("ccfs: mounted /s at /m (cache /var/tmp/c (1), pid 4242)\n"),
            Some(4242)
        );
        assert_eq!(daemon_pid("something else\n"), None);
    }
}
