//! The daemon's control socket (`CACHE/control.sock`): `ccfs status`, `ccfs sync` and
//! `ccfs umount` talk to a running mount through it, one JSON line each way.
//!
//! Nothing on the control path touches the share or the FUSE mount, so it keeps working
//! while the share is down or hangs:
//! - a client finds the daemon through the mount table: the mount's source is
//!   `ccfs:CACHE_DIR` (see [`mount_source`]), never through the mount itself;
//! - the daemon learns whether the share answers from a [`ShareProbe`] thread, and counts
//!   pending changes on a helper thread, each waited for a bounded time;
//! - a sync first asks the probe, and does not start rsync (which would hang in the
//!   kernel) when the share does not answer.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::locks::Locked;
use crate::sync::SyncReport;

mod client;
mod mounts;
mod pending;
mod probe;
mod server;

pub use client::*;
pub use mounts::*;
use pending::*;
pub use probe::*;
pub use server::*;

/// How long a look at the share (stat and statfs of its root) may take before the share
/// counts as not answering. Generous: a busy server is slow, not down.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long accesses to the share may be in flight without any finishing before the
/// probe is asked to look (and, if its look hangs for [`PROBE_TIMEOUT`], closes the gate).
const STALL: Duration = Duration::from_secs(2);

/// How long counting the pending changes may wait for the filesystem's lock (which a
/// request waiting on a hung share may hold) before the last count is shown instead.
const COUNT_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest answer line a client reads (a status with many conflicts is a few KiB).
const MAX_ANSWER: u64 = 16 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "lowercase")]
pub enum Request {
    Status,
    /// The unsynced paths and pending deletions ([`Pending`]).
    Pending,
    Sync,
    /// Acknowledged at once with `{"waiting":true}`, then answered once the daemon's
    /// final sync (after unmount) is done.
    Wait,
}

/// Whether the share answered the daemon's last look at it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ShareHealth {
    Reachable,
    /// A look at the share has been waiting longer than [`PROBE_TIMEOUT`] (a hung server);
    /// `since`: when that look started, unix time.
    NotAnswering {
        since: u64,
    },
    /// The share answered with an error (ENOTCONN when its server died, EIO, ...);
    /// `since`: the first of the failed looks in a row, unix time.
    Error {
        error: String,
        since: u64,
    },
}

impl ShareHealth {
    pub fn is_reachable(&self) -> bool {
        matches!(self, ShareHealth::Reachable)
    }

    /// `reachable`, `not answering for N s (since T)`, `error: E (since T)`.
    pub fn describe(&self) -> String {
        let stamp = |since: u64| crate::sync::stamp(UNIX_EPOCH + Duration::from_secs(since));
        match self {
            ShareHealth::Reachable => "reachable".to_string(),
            ShareHealth::NotAnswering { since } => format!(
                "not answering for {} s (since {})",
                unix_now().saturating_sub(*since),
                stamp(*since)
            ),
            ShareHealth::Error { error, since } => {
                format!("error: {error} (since {})", stamp(*since))
            }
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The result of one sync as the daemon reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SyncOutcome {
    pub ok: bool,
    pub report: Option<SyncReport>,
    pub error: Option<String>,
    /// Set when the sync did not start because the share did not answer.
    #[serde(default)]
    pub share_unreachable: Option<ShareHealth>,
    /// With `share_unreachable`: the changes left in the cache (paths and deletions).
    #[serde(default)]
    pub kept: Option<usize>,
}

impl From<Result<SyncReport, crate::sync::SyncError>> for SyncOutcome {
    /// Ok only when rsync succeeded and nothing is left unsynced.
    fn from(r: Result<SyncReport, crate::sync::SyncError>) -> Self {
        match r {
            Ok(report) => SyncOutcome {
                ok: report.ok && report.remaining_dirty == 0 && report.remaining_deletions == 0,
                report: Some(report),
                error: None,
                share_unreachable: None,
                kept: None,
            },
            Err(e) => SyncOutcome {
                ok: false,
                report: None,
                error: Some(e.to_string()),
                share_unreachable: None,
                kept: None,
            },
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Status {
    pub pid: u32,
    pub share: PathBuf,
    pub mountpoint: PathBuf,
    pub cache_dir: PathBuf,
    pub dirty_files: usize,
    pub dirty_bytes: u64,
    pub pending_deletions: usize,
    /// Set when the counts above could not be taken now (the filesystem was busy waiting
    /// on the share): the unix time they are from.
    #[serde(default)]
    pub counts_as_of: Option<u64>,
    /// Whether the share answers (None from a daemon that does not look).
    #[serde(default)]
    pub share_health: Option<ShareHealth>,
    pub last_sync: Option<SyncOutcome>,
    /// Conflicts found by the syncs of this mount (both versions kept).
    #[serde(default)]
    pub conflicts: Vec<crate::overlay::Conflict>,
    /// The FUSE requests served since the mount, by kind, and the bytes moved.
    #[serde(default)]
    pub requests: crate::counters::RequestCounts,
    /// How requests travel (None from a daemon that does not say).
    #[serde(default)]
    pub transport: Option<crate::fuse::TransportState>,
    /// Files held by block, and the bytes of the blocks they lack (read from the share
    /// until the background fill, if it runs, has copied them).
    #[serde(default)]
    pub held_by_block: HeldByBlock,
}

/// The unsynced paths and the pending deletions, at most [`PENDING_LISTED`] of each, in
/// order (`ccfs status --verbose`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Pending {
    pub dirty: Vec<PathBuf>,
    pub deletions: Vec<PathBuf>,
    /// What the cache takes on its disk, counted by the daemon (as the cache's owner).
    #[serde(default)]
    pub cache_bytes: Option<(u64, bool)>,
}

/// The longest the daemon counts its cache's size (then says "at least").
const DISK_USAGE_TIME: Duration = Duration::from_secs(5);

/// How long `ccfs status --verbose` waits for the daemon's listing.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// The bytes the files under `dir` take on its disk, and whether every entry was counted:
/// links not followed, other filesystems not entered, at most a million entries and
/// [`DISK_USAGE_TIME`].
pub fn disk_usage(dir: &Path) -> (u64, bool) {
    use std::os::unix::fs::MetadataExt;
    let Ok(top) = std::fs::metadata(dir) else {
        return (0, false);
    };
    let deadline = std::time::Instant::now() + DISK_USAGE_TIME;
    let mut total = 0u64;
    let mut seen = 0usize;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > 1_000_000 || std::time::Instant::now() > deadline {
                return (total, false);
            }
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            total += m.blocks() * 512;
            if m.is_dir() && m.dev() == top.dev() {
                todo.push(e.path());
            }
        }
    }
    (total, true)
}

/// How many paths of each kind [`Pending`] lists.
pub const PENDING_LISTED: usize = 1000;

/// See [`Status::held_by_block`].
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct HeldByBlock {
    pub files: usize,
    pub lacking_bytes: u64,
    /// Of those, the bytes the background fill is to copy: of files with blocks written
    /// here, where the cache's disk has room for them (0: nothing left for it to do).
    #[serde(default)]
    pub to_fill_bytes: u64,
}

impl Status {
    /// Unsynced paths plus pending deletions.
    pub fn changes(&self) -> usize {
        self.dirty_files + self.pending_deletions
    }
}
