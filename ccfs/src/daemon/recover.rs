//! Recovery: a cache left by a session that ended without its logout sync is brought to the
//! share.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::Settings;
use crate::control::{self, SyncOutcome};
use crate::overlay::Overlay;
use crate::sync::{self, RsyncOptions};
use crate::sys::{self, DirFd};

use super::*;

/// How this mount's (or recovery's) syncs run rsync: started by `launcher` in a daemon
/// (see [`crate::sys::launcher`]), by this process itself without one.
pub fn rsync_options(
    settings: &Settings,
    binary: &Path,
    share: &Path,
    launcher: Option<std::sync::Arc<sys::launcher::Launcher>>,
) -> RsyncOptions {
    RsyncOptions {
        binary: binary.to_path_buf(),
        extra_args: settings.rsync_extra_args.clone(),
        timeout: settings.rsync_timeout,
        caps: sync::probe_share(share),
        fsync: sync::FsyncProbe::start(binary, launcher.clone()),
        hold_fd: None,
        launcher,
        implied_dirs: false,
    }
}

/// Brings a cache up to date with the share after an earlier session ended without its
/// logout sync: sends exactly the work its journal records (with the same conflict checks as
/// a logout), and empties the cache once all of it is on the share. What the cache holds
/// beyond the journal is a clean copy and is never sent. Returns the outcome, or None when
/// the journal had no work.
///
/// A file still open for writing (a program of the crashed session may write it through
/// kernel passthrough, without a daemon) is not removed: it stays as unsynced work, and the
/// outcome names it (also when the journal had no work).
pub fn recover_overlay(overlay: &Overlay, rsync: &RsyncOptions) -> Option<SyncOutcome> {
    if !overlay.has_unsynced_work() {
        match overlay.drop_clean_cache(&Default::default()) {
            Ok(e) if !e.kept_open.is_empty() => {
                let (dirty, _, deletions) = overlay.pending();
                let report = sync::SyncReport {
                    kept_open: e.kept_open,
                    remaining_dirty: dirty,
                    remaining_deletions: deletions,
                    ok: true,
                    finished_at: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0),
                    ..Default::default()
                };
                return Some(SyncOutcome::from(Ok(report)));
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("cannot empty the clean cache: {e}"),
        }
        return None;
    }
    Some(SyncOutcome::from(sync::run_sync(
        overlay,
        rsync,
        sync::SyncMode::Recover,
    )))
}

/// What recovering one cache came to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Recovered {
    /// Nothing was left unsynced.
    Nothing,
    /// What an earlier session left was synced (see the outcome).
    Synced(Box<SyncOutcome>),
    /// A running mount holds the cache (its pid, 0 if unknown): left alone.
    InUse(u32),
}

/// An error of work done in a child process as a user, carried back to root.
#[derive(Debug, Serialize, Deserialize)]
enum ChildError {
    User { problem: String, fix: String },
    Failure(String),
}

impl ChildError {
    fn from_anyhow(e: anyhow::Error) -> Self {
        match e.downcast::<UserError>() {
            Ok(u) => ChildError::User {
                problem: u.problem,
                fix: u.fix,
            },
            Err(e) => ChildError::Failure(format!("{e:#}")),
        }
    }

    fn into_anyhow(self) -> anyhow::Error {
        match self {
            ChildError::User { problem, fix } => user_error(problem, fix).into(),
            ChildError::Failure(m) => anyhow::anyhow!(m),
        }
    }
}

/// Recovers one cache directory (left alone if a mount holds it).
///
/// `settings` come from the `--config` of the command line. Root recovers a user's cache
/// in a child process that has become the cache's owner for good (and may not gain
/// privileges again) before anything in the cache is opened: root itself only looks at
/// who owns the directory. Root uses `settings` or the defaults, never the config a
/// cache's meta.json names (the user can write that file); a user recovering their own
/// cache may use the config their mount used.
///
/// `limit`: how long root waits for the child (None: as long as it takes); one that has
/// not answered by then is killed, as a crash would stop it (the journal keeps what is
/// left for the next recovery), and the error is an [`io::ErrorKind::TimedOut`].
pub fn recover_cache(
    cache_dir: &Path,
    settings: Option<&Settings>,
    patience: Duration,
    limit: Option<Duration>,
) -> anyhow::Result<Recovered> {
    let not_a_cache = || {
        user_error(
            format!("{} is not a ccfs cache directory", LogPath(cache_dir)),
            "give the --cache-dir of an earlier mount",
        )
    };
    let md = fs::symlink_metadata(cache_dir).map_err(|_| not_a_cache())?;
    if !md.is_dir() {
        return Err(not_a_cache().into());
    }
    let euid = sys::geteuid();
    // Root recovers every user's cache, as that user; a user only their own.
    let owner = if euid == 0 { md.uid() } else { euid };
    check_cache_path(cache_dir, owner)?;
    if euid != 0 {
        return recover_as_owner(cache_dir, settings, true, patience);
    }
    // Root works on each cache in a child process, its own caches too: whatever a cache
    // leads to (a share that hangs holds a thread for good) stays in that child, and the
    // next cache starts from a clean process.
    let account = sys::user_by_uid(owner)?.ok_or_else(|| {
        user_error(
            format!(
                "cache dir {} belongs to uid {owner}, which has no account",
                LogPath(cache_dir)
            ),
            "remove the cache or restore the account",
        )
    })?;
    let answer = sys::run_as_user_within(&account, limit, || {
        let r =
            recover_as_owner(cache_dir, settings, false, patience).map_err(ChildError::from_anyhow);
        serde_json::to_vec(&r).unwrap_or_default()
    })?;
    let r: Result<Recovered, ChildError> = serde_json::from_slice(&answer).map_err(|e| {
        anyhow::anyhow!(
            "the recovery as {} gave no readable answer: {e}",
            LogText(&account.name)
        )
    })?;
    r.map_err(ChildError::into_anyhow)
}

/// Reads CACHE/meta.json: never through a symlink, only a regular file, at most 1 MiB.
fn read_meta(cache_dir: &Path) -> Result<CacheMeta, UserError> {
    let not_a_cache = |why: String| {
        user_error(
            format!(
                "{} is not a ccfs cache (meta.json: {why})",
                LogPath(cache_dir)
            ),
            "give the --cache-dir of an earlier mount",
        )
    };
    let dir = DirFd::open(cache_dir).map_err(|e| not_a_cache(e.to_string()))?;
    let f = dir
        .open_file(
            OsStr::new("meta.json"),
            libc::O_RDONLY | libc::O_NONBLOCK,
            0,
        )
        .map_err(|e| not_a_cache(e.to_string()))?;
    if !sys::fstat(&f).is_ok_and(|st| st.is_file()) {
        return Err(not_a_cache("not a regular file".to_string()));
    }
    let mut text = Vec::new();
    io::Read::read_to_end(&mut io::Read::take(&f, 1 << 20), &mut text)
        .map_err(|e| not_a_cache(e.to_string()))?;
    serde_json::from_slice(&text).map_err(|e| not_a_cache(e.to_string()))
}

fn recover_as_owner(
    cache_dir: &Path,
    settings: Option<&Settings>,
    use_cache_config: bool,
    patience: Duration,
) -> anyhow::Result<Recovered> {
    // A lock held by processes of a dead daemon (its rsync finishing) is waited for below;
    // only a live owner (or a lock that names none) means a running mount.
    if let Some(pid) = cache_owner(cache_dir).filter(|&p| p == 0 || sys::process_alive(p)) {
        return Ok(Recovered::InUse(pid));
    }
    let meta = read_meta(cache_dir)?;
    let settings = match (settings, &meta.config) {
        (Some(s), _) => s.clone(),
        (None, Some(c)) if use_cache_config => Settings::load(c).map_err(|e| {
            user_error(
                LogText(&e.to_string()).to_string(),
                "fix the config file, or give one with --config",
            )
        })?,
        // The machine's config (as the cache's owner here), else the defaults.
        _ => effective_config(None)?.1,
    };
    let _lock = lock_for_recovery(cache_dir, patience)?;
    // A share that hangs (its server stopped, or one the cache's owner made hang) must not
    // hold up the recovery of every later cache: one look, waited for a bounded time.
    if let Err(why) = control::look_within(&meta.share, control::PROBE_TIMEOUT) {
        anyhow::bail!(user_error(
            format!(
                "share {} is not reachable: {}",
                LogPath(&meta.share),
                LogText(&why)
            ),
            "run `ccfs recover` again once the share is mounted and answers"
        ));
    }
    let rsync = sync::find_program(&settings.rsync).ok_or_else(|| {
        user_error(
            format!("rsync ({}) is not installed", LogText(&settings.rsync)),
            "install it (apt-get install rsync)",
        )
    })?;
    sys::set_umask(0);
    let overlay = Overlay::new(&meta.share, cache_dir, settings.policy.clone())?;
    overlay.set_keep_copies(settings.keep_copies);
    overlay.set_by_block_from(settings.by_block_from);
    // (`ccfs recover` opens no user's document: it starts rsync itself.)
    let mut opts = rsync_options(&settings, &rsync, &meta.share, None);
    opts.hold_fd = Some(std::os::fd::AsRawFd::as_raw_fd(&_lock));
    let outcome = recover_overlay(&overlay, &opts);
    if let Some(report) = outcome.as_ref().and_then(|o| o.report.as_ref()) {
        control::log_conflicts(cache_dir, &report.conflicts);
    }
    Ok(match outcome {
        None => Recovered::Nothing,
        Some(o) => Recovered::Synced(Box::new(o)),
    })
}

/// Every cache directory under the cache root (ROOT/UID/NAME with a meta.json).
pub fn all_caches() -> Vec<PathBuf> {
    list_caches(None)
}

/// `caches` (paths ROOT/UID/NAME, sorted) in turns, one cache of each owner's directory a
/// turn: the first cache of every user comes before anyone's second, so that one user
/// with many caches cannot take the recovery's whole time from the others.
pub fn in_turns(caches: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut index: HashMap<PathBuf, usize> = HashMap::new();
    let mut by_owner: Vec<VecDeque<PathBuf>> = Vec::new();
    for c in caches {
        let owner = c.parent().map(Path::to_path_buf).unwrap_or_default();
        let i = *index.entry(owner).or_insert_with(|| {
            by_owner.push(VecDeque::new());
            by_owner.len() - 1
        });
        by_owner[i].push_back(c);
    }
    let mut out = Vec::new();
    loop {
        let mut any = false;
        for q in by_owner.iter_mut() {
            if let Some(c) = q.pop_front() {
                out.push(c);
                any = true;
            }
        }
        if !any {
            return out;
        }
    }
}

/// The caches of one user: ROOT/UID/NAME where ROOT/UID is named for them and theirs.
pub fn user_caches(uid: u32) -> Vec<PathBuf> {
    list_caches(Some(uid))
}

/// Lists caches by name only (lstat; nothing in them is opened: a recovery does that, as
/// the owner).
fn list_caches(only: Option<u32>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(users) = fs::read_dir(cache_root()) else {
        return out;
    };
    for u in users.flatten() {
        let Ok(m) = fs::symlink_metadata(u.path()) else {
            continue;
        };
        if !m.is_dir() {
            continue;
        }
        if let Some(uid) = only {
            if m.uid() != uid || u.file_name() != OsStr::new(&uid.to_string()) {
                continue;
            }
        }
        if let Ok(caches) = fs::read_dir(u.path()) {
            for c in caches.flatten() {
                let is_cache = fs::symlink_metadata(c.path()).is_ok_and(|m| m.is_dir())
                    && fs::symlink_metadata(c.path().join("meta.json")).is_ok_and(|m| m.is_file());
                if is_cache {
                    out.push(c.path());
                }
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caches_are_taken_in_turns_one_of_each_owner_a_turn() {
        let p = |s: &str| PathBuf::from(s);
        let got = in_turns(vec![
            p("/c/1000/a"),
            p("/c/1000/b"),
            p("/c/1000/c"),
            p("/c/1001/a"),
            p("/c/1002/a"),
            p("/c/1002/b"),
        ]);
        assert_eq!(
            got,
            [
                "/c/1000/a",
                "/c/1001/a",
                "/c/1002/a",
                "/c/1000/b",
                "/c/1002/b",
                "/c/1000/c"
            ]
            .map(PathBuf::from)
        );
    }
}
