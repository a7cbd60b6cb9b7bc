//! What a storm killed earlier left (run directories, mounts, homes on the share), and
//! the mark that keeps a failed run's evidence from being taken for it.

use std::path::Path;
use std::time::Duration;

use super::mount::detach;
use super::procs::await_processes_naming;
use super::StormConfig;

/// `remove_dir_all`, tried again a few times when an entry appeared while it ran (a
/// daemon's last log line, a lazily detached mount's last writer).
fn remove_dir_settled(dir: &Path) -> std::io::Result<()> {
    let mut tries = 0;
    loop {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) && tries < 5 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            r => return r,
        }
    }
}

/// Removes a run's scratch directory `dir` (its caches, mount points, logs), never through
/// a mount: whatever is still mounted below it (a mount someone kept busy, a daemon that
/// died) is detached first, deepest first, so that the removal cannot reach into the share
/// a mount shows.
pub fn remove_run_dir(dir: &Path) -> std::io::Result<()> {
    detach_below(dir);
    let still: Vec<_> = fsinfo::mounts()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.mount_point.starts_with(dir))
        .collect();
    if let Some(m) = still.first() {
        return Err(std::io::Error::other(format!(
            "{} is still mounted; not removed",
            m.mount_point.display()
        )));
    }
    remove_dir_settled(dir)
}

/// Detaches every mount at or below `dir`, deepest first; how many there were.
fn detach_below(dir: &Path) -> usize {
    let mut below: Vec<std::path::PathBuf> = fsinfo::mounts()
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect();
    below.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for m in &below {
        // Any kind of mount (root's lazy unmount), else as FUSE's own tool does it.
        if !crate::sys::detach_mount(m) {
            detach(m);
        }
    }
    below.len()
}

/// A storm's marker, read only when it is a small regular file (not a link, nor a FIFO
/// someone left to hold root's read forever).
fn marker_text(p: &Path) -> String {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(p)
    else {
        return String::new();
    };
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return String::new();
    }
    let mut text = String::new();
    let _ = f.take(64 * 1024).read_to_string(&mut text);
    text
}

/// The scratch space's part of [`clear_leftovers`]: the run directories of storms killed
/// earlier in `work` (`storm-TIME-PID-I`, whose process is gone), with every mount below
/// them detached. Returns what it did, a line each.
pub fn clear_work_leftovers(work: &Path) -> Vec<String> {
    clear_work(work).0
}

/// [`clear_work_leftovers`], with the storms (`TIME-PID`) whose daemons still run: their
/// homes on the share are not removed under them.
fn clear_work(work: &Path) -> (Vec<String>, Vec<String>) {
    let mut said = Vec::new();
    let mut busy = Vec::new();
    for e in std::fs::read_dir(work).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !dead(&name, "storm-", 3) {
            continue;
        }
        let dir = e.path();
        if std::fs::symlink_metadata(dir.join(KEPT_MARK)).is_ok() {
            said.push(format!(
                "{} was kept by an earlier storm that failed (its error is in {}); remove it when done with it",
                dir.display(),
                dir.join(KEPT_MARK).display()
            ));
            continue;
        }
        if !crate::safety::owned_by_me(&dir) {
            said.push(not_mine(&dir));
            continue;
        }
        let detached = detach_below(&dir);
        // A detached user's daemon still ends its session (its logout sync writes its
        // cache and the share's home): removing under it would race it.
        let left = await_processes_naming(&dir, Duration::from_secs(30));
        if !left.is_empty() {
            said.push(format!(
                "{} still has daemons running after 30 s (pids {left:?}); stop them, then remove it",
                dir.display()
            ));
            if let Some((stamp, _)) = name.trim_start_matches("storm-").rsplit_once('-') {
                busy.push(stamp.to_string());
            }
            continue;
        }
        match remove_run_dir(&dir) {
            Ok(()) => said.push(format!(
                "removed {} ({detached} mounts detached), left by a storm that was killed",
                dir.display(),
            )),
            Err(e) => said.push(format!(
                "{} was left by a storm that was killed and cannot be removed ({e}); \
                 detach what is mounted below it (fusermount3 -u -z) and remove it",
                dir.display()
            )),
        }
    }
    (said, busy)
}

/// A name `PREFIX` then `parts` numbers joined by `-`, the second a pid no longer running.
fn dead(name: &str, prefix: &str, parts: usize) -> bool {
    let Some(rest) = name.strip_prefix(prefix) else {
        return false;
    };
    let fields: Vec<&str> = rest.split('-').collect();
    fields.len() == parts
        && fields.iter().all(|f| f.parse::<u64>().is_ok())
        && !Path::new(&format!("/proc/{}", fields[1])).exists()
}

/// What is said of a leftover that is not this user's own directory.
fn not_mine(p: &Path) -> String {
    format!(
        "{} looks left by a storm that was killed, but is not this user's own \
         directory; left alone (remove it by hand if it is a leftover)",
        p.display()
    )
}

/// What a storm killed earlier left, found and removed: in the scratch space, its run
/// directories (`storm-TIME-PID-I`, whose process is gone) with every mount below them
/// (detached, deepest first); on the share, its homes (`loadgen-storm-TIME-PID` with the
/// marker of this host). Returns what it did, a line each.
pub fn clear_leftovers(cfg: &StormConfig) -> Vec<String> {
    let (mut said, busy) = clear_work(&cfg.work);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    for e in std::fs::read_dir(&cfg.share)
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if !dead(&name, "loadgen-storm-", 2) {
            continue;
        }
        if busy.iter().any(|b| name == format!("loadgen-storm-{b}")) {
            said.push(format!(
                "{} holds the homes of a storm whose daemons still run; left until they end",
                e.path().display()
            ));
            continue;
        }
        let marker = marker_text(&e.path().join(".loadgen-run"));
        let m = serde_json::from_str::<serde_json::Value>(&marker).unwrap_or_default();
        let ours = m["tool"] == "loadgen" && m["host"] == host.trim();
        if ours && m["kept"] == true {
            said.push(format!(
                "{} was kept by an earlier storm (--keep); remove it when done with it",
                e.path().display()
            ));
            continue;
        }
        if ours && !crate::safety::owned_by_me(&e.path()) {
            said.push(not_mine(&e.path()));
            continue;
        }
        if !ours {
            said.push(format!(
                "{} is another storm's (another host's, or an older loadgen's); if it is over, remove it",
                e.path().display()
            ));
            continue;
        }
        match remove_dir_settled(&e.path()) {
            Ok(()) => said.push(format!(
                "removed {}, the homes of a storm that was killed",
                e.path().display()
            )),
            Err(err) => said.push(format!(
                "{} holds the homes of a storm that was killed and cannot be removed ({err})",
                e.path().display()
            )),
        }
    }
    said
}

/// The name of the file that marks a storm's run directory as kept (a failed run's
/// evidence): [`clear_leftovers`] leaves it.
pub const KEPT_MARK: &str = ".loadgen-kept";

/// Marks the run directory `work` as kept, with the error that kept it.
pub fn keep_evidence(work: &Path, error: &str) {
    if let Err(e) =
        crate::safety::write_atomic(&work.join(KEPT_MARK), format!("{error}\n").as_bytes())
    {
        eprintln!(
            "loadgen login-storm: cannot mark {} as kept ({e}); a later storm may remove it",
            work.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_that_is_a_fifo_or_a_link_is_not_read() {
        let d = tempfile::tempdir().expect("dir");
        let fifo = d.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        assert_eq!(marker_text(&fifo), "", "no writer: read nothing, at once");
        std::fs::write(d.path().join("real"), "{}").expect("w");
        std::os::unix::fs::symlink(d.path().join("real"), d.path().join("link")).expect("l");
        assert_eq!(marker_text(&d.path().join("link")), "");
        assert_eq!(marker_text(&d.path().join("real")), "{}");
    }
}
