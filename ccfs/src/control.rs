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

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{user_error, LogText, UserError};
use crate::gate::ShareGate;
use crate::locks::Locked;
use crate::overlay::Overlay;
use crate::sync::{run_sync, RsyncOptions, SyncMode, SyncReport};

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
}

impl Status {
    /// Unsynced paths plus pending deletions.
    pub fn changes(&self) -> usize {
        self.dirty_files + self.pending_deletions
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.locked()
}

// ---- the share probe --------------------------------------------------------------------

/// Looks at the share (stat and statfs of its root) on a thread of its own, so a share
/// that hangs holds up that thread only; callers wait at most [`PROBE_TIMEOUT`] for an
/// answer. One look runs at a time: while one hangs, callers learn "not answering since"
/// at once, without starting more.
#[derive(Debug)]
pub struct ShareProbe {
    share: PathBuf,
    timeout: Duration,
    /// Closed while the share does not answer, opened when it does again.
    gate: Arc<ShareGate>,
    state: Mutex<ProbeState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct ProbeState {
    /// The number of the newest look asked for; `started`/`finished`: of the newest look
    /// begun and ended.
    wanted: u64,
    started: u64,
    finished: u64,
    /// When the look in flight began (monotonic, and unix time for reports).
    running_since: Option<(Instant, u64)>,
    /// When the last look ended.
    finished_at: Option<Instant>,
    /// The outcome of look `finished`.
    last: Option<ShareHealth>,
}

impl ShareProbe {
    /// Starts the probe thread for `share`.
    /// Starts the probe thread for `share`, and a watch that asks it to look while
    /// `gate` is closed (to open it again) or while accesses to the share make no progress
    /// (to close it when the share hangs).
    pub fn start(
        share: &Path,
        timeout: Duration,
        gate: Arc<ShareGate>,
    ) -> std::io::Result<Arc<Self>> {
        let probe = Arc::new(ShareProbe {
            share: share.to_path_buf(),
            timeout,
            gate,
            state: Mutex::new(ProbeState::default()),
            cv: Condvar::new(),
        });
        let p = probe.clone();
        std::thread::Builder::new()
            .name("ccfs-share-probe".into())
            .spawn(move || p.run())?;
        let watched = Arc::downgrade(&probe);
        std::thread::Builder::new()
            .name("ccfs-share-watch".into())
            .spawn(move || {
                while let Some(p) = watched.upgrade() {
                    if p.gate.is_closed() || p.gate.stalled(STALL) {
                        p.peek();
                    }
                    drop(p);
                    std::thread::sleep(Duration::from_millis(500));
                }
            })?;
        Ok(probe)
    }

    fn run(&self) {
        loop {
            let number = {
                let mut st = lock(&self.state);
                while st.wanted == st.started {
                    st = crate::locks::wait(&self.cv, st);
                }
                st.started = st.wanted;
                st.running_since = Some((Instant::now(), unix_now()));
                st.started
            };
            let result = look_at(&self.share);
            let mut st = lock(&self.state);
            let since = st.running_since.map(|(_, t)| t).unwrap_or_else(unix_now);
            st.running_since = None;
            st.finished = number;
            st.finished_at = Some(Instant::now());
            self.gate.set_closed(result.is_err());
            st.last = Some(match result {
                Ok(()) => ShareHealth::Reachable,
                Err(error) => {
                    let since = match &st.last {
                        Some(ShareHealth::Error { since, .. }) => *since,
                        _ => since,
                    };
                    ShareHealth::Error { error, since }
                }
            });
            self.cv.notify_all();
        }
    }

    /// Asks for a new look without waiting for it; returns the number it will have.
    fn ask(&self, st: &mut ProbeState) -> u64 {
        let number = st.started + 1;
        st.wanted = st.wanted.max(number);
        self.cv.notify_all();
        number
    }

    fn hung(&self, st: &ProbeState) -> Option<ShareHealth> {
        match st.running_since {
            // An access that got an answer meanwhile shows the share is back: the look
            // ends too (a check waits for it, bounded); the gate stays as that answer
            // left it.
            Some((t, _)) if t.elapsed() >= self.timeout && self.gate.answered_since(t) => None,
            Some((t, since)) if t.elapsed() >= self.timeout => {
                self.gate.set_closed(true);
                Some(ShareHealth::NotAnswering { since })
            }
            _ => None,
        }
    }

    /// Looks at the share now and waits (bounded) for the answer.
    pub fn check(&self) -> ShareHealth {
        let begun = Instant::now();
        let since = unix_now();
        let mut st = lock(&self.state);
        if let Some(h) = self.hung(&st) {
            return h;
        }
        let number = self.ask(&mut st);
        loop {
            if st.finished >= number {
                if let Some(h) = &st.last {
                    return h.clone();
                }
            }
            if let Some(h) = self.hung(&st) {
                return h;
            }
            // Only if the probe thread itself is gone: nothing would ever answer.
            if begun.elapsed() >= self.timeout * 2 {
                return ShareHealth::NotAnswering { since };
            }
            st = self
                .cv
                .wait_timeout(st, Duration::from_millis(100))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// What is known now, without waiting: "not answering" when the look in flight is
    /// overdue, else the last outcome. Asks for a new look for next time (at most one a
    /// second).
    fn peek(&self) -> Option<ShareHealth> {
        let mut st = lock(&self.state);
        if let Some(h) = self.hung(&st) {
            return Some(h);
        }
        let stale = st
            .finished_at
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        if st.running_since.is_none() && stale {
            self.ask(&mut st);
        }
        st.last.clone()
    }
}

/// One look at the share on a thread of its own, waited for at most `timeout`: a share
/// that hangs holds up that thread only. `Err` names what is wrong, or that it did not
/// answer in time.
pub fn look_within(share: &Path, timeout: Duration) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let path = share.to_path_buf();
    std::thread::Builder::new()
        .name("ccfs-share-look".into())
        .spawn(move || {
            let _ = tx.send(look_at(&path));
        })
        .map_err(|e| e.to_string())?;
    rx.recv_timeout(timeout)
        .unwrap_or_else(|_| Err(format!("no answer within {} s", timeout.as_secs())))
}

/// One look at the share: its root must be a directory and statfs must answer.
fn look_at(share: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(share).map_err(|e| e.to_string())?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", share.display()));
    }
    fsinfo::statfs(share).map_err(|e| e.to_string())?;
    Ok(())
}

// ---- pending changes, counted without blocking --------------------------------------------

/// (dirty paths, dirty bytes, pending deletions) and the unix time they were counted.
type Counts = ((usize, u64, usize), u64);

/// Counts pending changes with `Overlay::pending` on a helper thread: it takes the
/// filesystem's lock, which a request waiting on a hung share may hold. When the count
/// does not come in time, the last one is used (and said to be old).
#[derive(Debug)]
struct PendingCounter {
    overlay: Arc<Overlay>,
    last: Arc<Mutex<Counts>>,
    counting: Arc<AtomicBool>,
}

impl PendingCounter {
    fn new(overlay: Arc<Overlay>) -> Self {
        let first = (overlay.pending(), unix_now());
        Self {
            overlay,
            last: Arc::new(Mutex::new(first)),
            counting: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The counts, and the unix time they are from when they are not fresh.
    fn get(&self) -> ((usize, u64, usize), Option<u64>) {
        let (tx, rx) = std::sync::mpsc::channel();
        if !self.counting.swap(true, Ordering::AcqRel) {
            let (overlay, last, counting) = (
                self.overlay.clone(),
                self.last.clone(),
                self.counting.clone(),
            );
            let spawned = std::thread::Builder::new()
                .name("ccfs-count".into())
                .spawn(move || {
                    let counts = overlay.pending();
                    *lock(&last) = (counts, unix_now());
                    counting.store(false, Ordering::Release);
                    let _ = tx.send(counts);
                });
            if spawned.is_err() {
                self.counting.store(false, Ordering::Release);
            }
        }
        if let Ok(counts) = rx.recv_timeout(COUNT_TIMEOUT) {
            return (counts, None);
        }
        let (counts, at) = *lock(&self.last);
        let old = unix_now().saturating_sub(at) > COUNT_TIMEOUT.as_secs();
        (counts, old.then_some(at))
    }
}

// ---- the daemon's side ----------------------------------------------------------------------

/// State shared by the FUSE session, the control socket and the final sync.
#[derive(Debug)]
pub struct Daemon {
    pub overlay: Arc<Overlay>,
    pub rsync: RsyncOptions,
    pub share: PathBuf,
    pub mountpoint: PathBuf,
    pub cache_dir: PathBuf,
    probe: Arc<ShareProbe>,
    counter: PendingCounter,
    sync_lock: Mutex<()>,
    last_sync: Mutex<Option<SyncOutcome>>,
    conflicts: Mutex<Vec<crate::overlay::Conflict>>,
    final_sync: Mutex<Option<SyncOutcome>>,
    final_cv: Condvar,
    /// `ccfs umount` clients waiting for the final answer.
    waiters: AtomicUsize,
    /// The kernel's names, once the session is up (see [`Daemon::set_kernel_view`]).
    kernel: std::sync::OnceLock<crate::fuse::KernelView>,
}

impl Daemon {
    /// Sets up the daemon's state and starts its share probe.
    pub fn new(
        overlay: Arc<Overlay>,
        rsync: RsyncOptions,
        share: PathBuf,
        mountpoint: PathBuf,
        cache_dir: PathBuf,
    ) -> std::io::Result<Self> {
        Ok(Self {
            probe: ShareProbe::start(&share, PROBE_TIMEOUT, overlay.share_gate().clone())?,
            counter: PendingCounter::new(overlay.clone()),
            overlay,
            rsync,
            share,
            mountpoint,
            cache_dir,
            sync_lock: Mutex::new(()),
            last_sync: Mutex::new(None),
            conflicts: Mutex::new(Vec::new()),
            final_sync: Mutex::new(None),
            final_cv: Condvar::new(),
            waiters: AtomicUsize::new(0),
            kernel: std::sync::OnceLock::new(),
        })
    }

    /// Lets syncs tell the kernel which names show another file after them.
    pub fn set_kernel_view(&self, view: crate::fuse::KernelView) {
        let _ = self.kernel.set(view);
    }

    /// Whether the share answers now (waits at most [`PROBE_TIMEOUT`]).
    pub fn share_health(&self) -> ShareHealth {
        self.probe.check()
    }

    /// Runs one sync (syncs never overlap) and remembers its outcome. When the share does
    /// not answer, rsync is not started (it would hang in the kernel on a hung share);
    /// the outcome says so and where the changes are kept.
    pub fn sync_now(&self, mode: SyncMode) -> SyncOutcome {
        let _one_at_a_time = match self.lock_sync_unless_unreachable() {
            Ok(g) => g,
            Err(health) => return self.not_started(health, mode),
        };
        let health = self.probe.check();
        if !health.is_reachable() {
            return self.not_started(health, mode);
        }
        let outcome = SyncOutcome::from(run_sync(&self.overlay, &self.rsync, mode));
        if let Some(err) = &outcome.error {
            // rsync's messages quote file names, which are the user's: escaped.
            tracing::error!("sync failed: {}", LogText(err));
        }
        if let Some(report) = &outcome.report {
            log_conflicts(&self.cache_dir, &report.conflicts);
            // A conflict's name shows the share's version now (ours went to the conflict
            // copy beside it): the kernel must not keep the old file's size or pages.
            if let Some(kernel) = self.kernel.get().filter(|_| mode == SyncMode::Session) {
                let paths: Vec<PathBuf> = report.conflicts.iter().map(|c| c.path.clone()).collect();
                kernel.forget_paths(&paths);
            }
            lock(&self.conflicts).extend(report.conflicts.iter().cloned());
        }
        self.remember(&outcome);
        outcome
    }

    fn remember(&self, outcome: &SyncOutcome) {
        if let Ok(text) = serde_json::to_vec_pretty(outcome) {
            let _ = crate::journal::write_atomic(&self.cache_dir.join("last-sync.json"), &text);
        }
        *lock(&self.last_sync) = Some(outcome.clone());
    }

    /// Takes the sync lock; while another sync holds it, waits unless the share stops
    /// answering meanwhile (that sync may then be stuck on it for good).
    fn lock_sync_unless_unreachable(&self) -> Result<MutexGuard<'_, ()>, ShareHealth> {
        loop {
            match self.sync_lock.try_lock() {
                Ok(g) => return Ok(g),
                Err(TryLockError::Poisoned(p)) => return Ok(p.into_inner()),
                Err(TryLockError::WouldBlock) => {}
            }
            if let Some(h) = self.probe.peek().filter(|h| !h.is_reachable()) {
                return Err(h);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn not_started(&self, health: ShareHealth, mode: SyncMode) -> SyncOutcome {
        let ((files, _, deletions), _) = self.counter.get();
        let kept = files + deletions;
        let how = match mode {
            SyncMode::Session => {
                "they are sent by the next sync or the logout once the share is back, or by `ccfs recover`"
            }
            SyncMode::Logout | SyncMode::Recover => {
                "they are sent by `ccfs recover` once the share is back (the login hook runs it)"
            }
        };
        let message = format!(
            "share unreachable: {}; {kept} change{} kept in {}; {how}",
            health.describe(),
            if kept == 1 { "" } else { "s" },
            self.cache_dir.display()
        );
        tracing::warn!("sync not started: {message}");
        let outcome = SyncOutcome {
            ok: false,
            report: None,
            error: Some(message),
            share_unreachable: Some(health),
            kept: Some(kept),
        };
        self.remember(&outcome);
        outcome
    }

    pub fn status(&self) -> Status {
        let ((dirty_files, dirty_bytes, pending_deletions), counts_as_of) = self.counter.get();
        Status {
            pid: std::process::id(),
            share: self.share.clone(),
            mountpoint: self.mountpoint.clone(),
            cache_dir: self.cache_dir.clone(),
            dirty_files,
            dirty_bytes,
            pending_deletions,
            counts_as_of,
            share_health: Some(self.probe.check()),
            last_sync: lock(&self.last_sync).clone(),
            conflicts: lock(&self.conflicts).clone(),
            requests: self.overlay.requests.snapshot(),
        }
    }

    /// Publishes the final sync's outcome to `ccfs umount` waiting on the socket.
    pub fn set_final(&self, outcome: SyncOutcome) {
        *lock(&self.final_sync) = Some(outcome);
        self.final_cv.notify_all();
    }

    fn wait_final(&self) -> SyncOutcome {
        let mut g = lock(&self.final_sync);
        loop {
            if let Some(o) = g.as_ref() {
                return o.clone();
            }
            g = crate::locks::wait(&self.final_cv, g);
        }
    }

    /// Waits (a bounded time) until every `ccfs umount` waiting has been answered.
    pub fn drain_waiters(&self, timeout: Duration) {
        let start = Instant::now();
        while self.waiters.load(Ordering::Acquire) > 0 && start.elapsed() < timeout {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn answer(&self, req: &Request) -> serde_json::Value {
        let v = match req {
            Request::Status => serde_json::to_value(self.status()),
            Request::Sync => serde_json::to_value(self.sync_now(SyncMode::Session)),
            Request::Wait => serde_json::to_value(self.wait_final()),
        };
        v.unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
    }
}

/// Appends conflicts to `CACHE/conflicts.log` (one JSON object a line) for the admin.
pub fn log_conflicts(cache_dir: &Path, conflicts: &[crate::overlay::Conflict]) {
    if conflicts.is_empty() {
        return;
    }
    let mut text = String::new();
    for c in conflicts {
        if let Ok(line) = serde_json::to_string(c) {
            text.push_str(&line);
            text.push('\n');
        }
    }
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(cache_dir.join("conflicts.log"))
        .and_then(|mut f| f.write_all(text.as_bytes()));
    if let Err(e) = written {
        tracing::warn!("cannot write conflicts.log: {e}");
    }
}

fn serve_one(daemon: &Daemon, stream: UnixStream, owner: u32) -> std::io::Result<()> {
    // The socket is the owner's only (0600 in a 0700 directory); this holds even if the
    // modes were loosened: only root and the cache's owner (whom the daemon runs as) are
    // answered.
    let peer = crate::sys::peer_credentials(&stream)?;
    if peer.uid != 0 && peer.uid != owner {
        tracing::warn!(
            uid = peer.uid,
            pid = peer.pid,
            "control connection from another user refused"
        );
        return Ok(());
    }
    let mut line = String::new();
    BufReader::new((&stream).take(64 * 1024)).read_line(&mut line)?;
    let req = serde_json::from_str::<Request>(line.trim());
    let waiting = matches!(req, Ok(Request::Wait));
    if waiting {
        daemon.waiters.fetch_add(1, Ordering::AcqRel);
        // Acknowledge first: the client unmounts only once we are known to be waiting.
        let mut w = &stream;
        w.write_all(b"{\"waiting\":true}\n")?;
    }
    let answer = match &req {
        Ok(req) => daemon.answer(req),
        Err(e) => serde_json::json!({ "error": format!("bad request: {e}") }),
    };
    let mut w = &stream;
    let result = w
        .write_all(answer.to_string().as_bytes())
        .and_then(|()| w.write_all(b"\n"));
    if waiting {
        daemon.waiters.fetch_sub(1, Ordering::AcqRel);
    }
    result
}

/// Binds the socket (owner-only) and answers requests on background threads.
pub fn serve(daemon: Arc<Daemon>, socket: &Path) -> std::io::Result<()> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)?;
    // The mode is set on the name itself, never through a symlink swapped in meanwhile.
    let (dir, name) = match (socket.parent(), socket.file_name()) {
        (Some(d), Some(n)) => (d, Path::new(n)),
        _ => return Err(std::io::Error::from_raw_os_error(libc::EINVAL)),
    };
    crate::sys::Root::open(dir)?.chmod(name, 0o600)?;
    let owner = std::fs::symlink_metadata(&daemon.cache_dir)?.uid();
    std::thread::Builder::new()
        .name("ccfs-control".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let d = daemon.clone();
                let _ = std::thread::Builder::new()
                    .name("ccfs-control-conn".into())
                    .spawn(move || {
                        if let Err(e) = serve_one(&d, stream, owner) {
                            tracing::debug!("control connection: {e}");
                        }
                    });
            }
        })?;
    Ok(())
}

// ---- finding a mount's daemon through the mount table ---------------------------------------

/// The prefix of a ccfs mount's source in the mount table; the cache directory follows.
const SOURCE_PREFIX: &str = "ccfs:";

/// The mount source (FUSE `fsname`) that records `cache_dir` in the mount table:
/// `ccfs:/var/tmp/ccfs/1000/home-alice`. Refuses a path the mount table cannot carry
/// back unchanged: not absolute or not UTF-8, or with a comma (it separates mount
/// options), a backslash (fusermount3 takes it as an escape) or a control character.
pub fn mount_source(cache_dir: &Path) -> Result<String, UserError> {
    let refuse = |why: &str| {
        user_error(
            format!(
                "cache dir {} {why}, which the mount table cannot record",
                cache_dir.display()
            ),
            "choose a --cache-dir without commas, backslashes or control characters",
        )
    };
    let Some(text) = cache_dir.to_str() else {
        return Err(refuse("is not valid UTF-8"));
    };
    if !cache_dir.is_absolute() {
        return Err(refuse("is not absolute"));
    }
    if text.contains(',') {
        return Err(refuse("contains a comma"));
    }
    if text.contains('\\') {
        return Err(refuse("contains a backslash"));
    }
    if text.chars().any(char::is_control) {
        return Err(refuse("contains a control character"));
    }
    Ok(format!("{SOURCE_PREFIX}{text}"))
}

/// The cache directory a ccfs mount's source records (None for a source without one).
pub fn cache_dir_of_source(source: &str) -> Option<PathBuf> {
    let path = Path::new(source.strip_prefix(SOURCE_PREFIX)?);
    path.is_absolute().then(|| path.to_path_buf())
}

/// A ccfs mount from the mount table and where its daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountRef {
    pub mountpoint: PathBuf,
    pub cache_dir: PathBuf,
    pub socket: PathBuf,
    /// The mount's owner in the mount table (`user_id=`): who mounted; 0 when root
    /// mounted, also for a user (`--user`).
    pub mount_uid: u32,
    /// The owner of the cache directory: whom the daemon runs as.
    pub cache_uid: u32,
}

/// Every ccfs mount in this mount namespace, from the mount table (the mounts are not
/// touched). A mount point mounted over twice is listed once, for the top mount.
pub fn ccfs_mount_table() -> std::io::Result<Vec<fsinfo::MountEntry>> {
    let all = fsinfo::mounts()?;
    let mut out: Vec<fsinfo::MountEntry> = Vec::new();
    for m in all {
        if let Some(i) = out.iter().position(|o| o.mount_point == m.mount_point) {
            out.remove(i);
        }
        out.push(m);
    }
    out.retain(is_ccfs_mount);
    Ok(out)
}

fn user_id_option(options: &str) -> Option<u32> {
    options
        .split(',')
        .find_map(|o| o.strip_prefix("user_id="))
        .and_then(|v| v.parse().ok())
}

/// Where the daemon of a mount-table entry listens, checked: the cache directory the
/// source names must be a real directory (not a symlink) that belongs to the mount's
/// owner (or, for a mount root made for a user, to anyone: the daemon runs as them).
/// Reads nothing through the mount.
pub fn mount_ref(entry: &fsinfo::MountEntry) -> Result<MountRef, String> {
    let mp = entry.mount_point.display();
    let cache_dir = cache_dir_of_source(&entry.source).ok_or_else(|| {
        format!(
            "{mp} is a ccfs mount whose mount table entry names no cache dir (source {:?}: made by an older ccfs)",
            entry.source
        )
    })?;
    let mount_uid = user_id_option(&entry.options)
        .ok_or_else(|| format!("{mp}: the mount table gives no owner (user_id) for it"))?;
    let meta = std::fs::symlink_metadata(&cache_dir)
        .map_err(|e| format!("{mp}: its cache dir {}: {e}", cache_dir.display()))?;
    if !meta.is_dir() {
        return Err(format!(
            "{mp}: its cache dir {} is not a directory",
            cache_dir.display()
        ));
    }
    if mount_uid != 0 && meta.uid() != mount_uid {
        return Err(format!(
            "{mp}: its cache dir {} belongs to uid {}, not to the mount's owner (uid {mount_uid})",
            cache_dir.display(),
            meta.uid()
        ));
    }
    let socket = cache_dir.join("control.sock");
    Ok(MountRef {
        mountpoint: entry.mount_point.clone(),
        cache_uid: meta.uid(),
        socket,
        cache_dir,
        mount_uid,
    })
}

/// The path the mount table uses for the mount point `p`, found without touching what is
/// mounted there: the parent is resolved, the last component only read as a link (a stat
/// of a mount point asks its filesystem, which hangs with a hung share behind it).
pub fn mount_point_path(p: &Path) -> std::io::Result<PathBuf> {
    let mut p = std::path::absolute(p)?;
    for _ in 0..40 {
        let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
            // "/" or a path ending in "..": nothing to guard, resolve it.
            return p.canonicalize();
        };
        let here = parent.canonicalize()?.join(name);
        match std::fs::read_link(&here) {
            Ok(target) => p = here.parent().unwrap_or(Path::new("/")).join(target),
            Err(_) => return Ok(here),
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::ELOOP))
}

/// The mount-table entry of the ccfs mount at `p` (None if there is none).
pub fn find_mount(p: &Path) -> std::io::Result<Option<fsinfo::MountEntry>> {
    let mp = mount_point_path(p)?;
    Ok(ccfs_mount_table()?
        .into_iter()
        .find(|m| m.mount_point == mp))
}

// ---- the client's side ---------------------------------------------------------------------

/// Connects to a mount's daemon and makes sure it is that mount's: the peer must run as
/// root, the mount's owner or the cache directory's owner (whom the daemon runs as).
pub fn connect(m: &MountRef) -> std::io::Result<UnixStream> {
    // The socket lies in a directory its user controls: it is opened without following any
    // symlink on the way (a name swapped for one after a check could lead root's client to
    // any socket), checked, and connected to through that very descriptor.
    let rel = m
        .socket
        .strip_prefix("/")
        .map_err(|_| std::io::Error::other(format!("{} is not absolute", m.socket.display())))?;
    let fd = crate::sys::Root::open(Path::new("/"))?
        .open_fd(rel, libc::O_PATH, 0)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", m.socket.display())))?;
    if crate::sys::fstat(&fd)?.file_type() != libc::S_IFSOCK {
        return Err(std::io::Error::other(format!(
            "{} is not a socket",
            m.socket.display()
        )));
    }
    let stream = UnixStream::connect(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    ))?;
    let peer = crate::sys::peer_credentials(&stream)?;
    if peer.uid != 0 && peer.uid != m.mount_uid && peer.uid != m.cache_uid {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is served by uid {} (pid {}), neither root nor the owner of the mount or its cache",
                m.socket.display(),
                peer.uid,
                peer.pid
            ),
        ));
    }
    Ok(stream)
}

/// Sends one request and reads the answer (client side), waiting at most `timeout` for it
/// when one is given.
pub fn request(
    m: &MountRef,
    req: &Request,
    timeout: Option<Duration>,
) -> std::io::Result<serde_json::Value> {
    let stream = connect(m)?;
    stream.set_read_timeout(timeout)?;
    send(&stream, req)?;
    let deadline = timeout.map(|t| Instant::now() + t);
    read_line_value(&mut BufReader::new(&stream), deadline)
}

/// Asks a mount's daemon for its status, waiting at most `timeout`.
pub fn status(m: &MountRef, timeout: Duration) -> std::io::Result<Status> {
    let v = request(m, &Request::Status, Some(timeout))?;
    serde_json::from_value(v).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("the daemon answered badly: {e}"),
        )
    })
}

pub fn send(stream: &UnixStream, req: &Request) -> std::io::Result<()> {
    let mut w = stream;
    let text = serde_json::to_string(req).map_err(std::io::Error::other)?;
    w.write_all(text.as_bytes())?;
    w.write_all(b"\n")
}

/// Reads one JSON line from a buffered connection (several answers may follow), all of
/// it by `deadline` when one is given (the stream's read timeout bounds each read; the
/// deadline bounds the whole answer, which a peer sending a byte now and then would
/// otherwise stretch for ever).
pub fn read_line_value(
    reader: &mut impl BufRead,
    deadline: Option<Instant>,
) -> std::io::Result<serde_json::Value> {
    let mut line = Vec::new();
    match read_line_until(reader, &mut line, deadline)? {
        LineRead::Line | LineRead::Closed => {}
        LineRead::Partial => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the daemon did not finish its answer in time",
            ))
        }
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the daemon closed the connection without an answer",
        ));
    }
    serde_json::from_slice(&line).map_err(std::io::Error::other)
}

/// How [`read_line_until`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineRead {
    /// A whole line, its newline included.
    Line,
    /// The peer closed the connection (what came before is in the buffer).
    Closed,
    /// The deadline passed with the line unfinished.
    Partial,
}

/// Appends to `line` what the peer sends, up to its first newline, until `deadline`. A
/// read that times out (the stream's read timeout) is an error of kind `WouldBlock` or
/// `TimedOut` unless the deadline has passed; a line longer than [`MAX_ANSWER`] is an
/// error: no peer makes the reader wait or grow without bound.
pub fn read_line_until(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    deadline: Option<Instant>,
) -> std::io::Result<LineRead> {
    let past = |d: Option<Instant>| d.is_some_and(|d| Instant::now() >= d);
    loop {
        // One read at a time (`read_until` would go on reading until the newline, which a
        // peer sending a byte now and then never sends).
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if timed_out(&e) && past(deadline) => return Ok(LineRead::Partial),
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(LineRead::Closed);
        }
        let (take, whole) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        line.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if whole {
            return Ok(LineRead::Line);
        }
        if line.len() as u64 > MAX_ANSWER {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the daemon's answer is longer than {MAX_ANSWER} bytes"),
            ));
        }
        if past(deadline) {
            return Ok(LineRead::Partial);
        }
    }
}

/// True for an error that means nobody listens on the socket (the daemon is gone), as
/// opposed to one that does not answer in time or may not be asked.
pub fn daemon_gone(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
    )
}

/// True for an error that means the daemon went away during a request: gone already
/// ([`daemon_gone`]), or ending as it was asked: it closed the connection without an
/// answer (end of file), or ended before it even read the question, which makes the
/// kernel reset the connection (ECONNRESET; EPIPE when the question is written after).
pub fn daemon_ending(e: &std::io::Error) -> bool {
    daemon_gone(e)
        || matches!(
            e.kind(),
            std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe
        )
}

/// True for an error that means the daemon did not answer in time.
pub fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// True for a mount-table entry made by ccfs (`fuse.ccfs`, or `fuse` with source `ccfs` or
/// `ccfs:CACHE_DIR` where the mount helper drops the subtype).
pub fn is_ccfs_mount(m: &fsinfo::MountEntry) -> bool {
    m.fs_type == "fuse.ccfs"
        || (m.fs_type.starts_with("fuse")
            && (m.source == "ccfs" || cache_dir_of_source(&m.source).is_some()))
}

/// The mount points of every ccfs mount in this mount namespace.
pub fn ccfs_mounts() -> std::io::Result<Vec<PathBuf>> {
    Ok(fsinfo::mounts()?
        .into_iter()
        .filter(is_ccfs_mount)
        .map(|m| m.mount_point)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache dir goes into the mount table as the mount's source and comes back
    /// unchanged through the kernel's octal escapes (a space is `\040` there).
    #[test]
    fn the_cache_dir_survives_the_mount_table() {
        let dir = Path::new("/var/tmp/ccfs/1000/home alice#1");
        let source = mount_source(dir).expect("carriable");
        assert_eq!(source, "ccfs:/var/tmp/ccfs/1000/home alice#1");
        let escaped = source.replace(' ', "\\040").replace('#', "\\043");
        let line = format!(
            "50 27 0:45 / /home/alice rw,nosuid,nodev,relatime - fuse {escaped} rw,user_id=0,group_id=0,default_permissions,allow_other\n"
        );
        let entries = fsinfo::parse_mountinfo(&line);
        assert_eq!(entries.len(), 1);
        assert!(is_ccfs_mount(&entries[0]));
        assert_eq!(
            cache_dir_of_source(&entries[0].source).as_deref(),
            Some(dir)
        );
        assert_eq!(user_id_option(&entries[0].options), Some(0));
    }

    #[test]
    fn cache_dirs_the_mount_table_cannot_carry_are_refused_with_the_fix() {
        use std::os::unix::ffi::OsStrExt;
        let bad: [(&Path, &str); 5] = [
            (Path::new("/var/tmp/a,b"), "comma"),
            (Path::new("/var/tmp/a\\b"), "backslash"),
            (Path::new("/var/tmp/a\nb"), "control character"),
            (Path::new("relative/cache"), "not absolute"),
            (
                Path::new(std::ffi::OsStr::from_bytes(b"/var/tmp/\xff")),
                "UTF-8",
            ),
        ];
        for (dir, why) in bad {
            let e = mount_source(dir).expect_err("refused");
            assert!(e.problem.contains(why), "{dir:?}: {e}");
            assert!(e.fix.contains("--cache-dir"), "{e}");
        }
        // Sources that name no cache dir: the plain "ccfs" of older mounts, a relative path.
        assert_eq!(cache_dir_of_source("ccfs"), None);
        assert_eq!(cache_dir_of_source("ccfs:relative"), None);
        assert_eq!(cache_dir_of_source("/dev/sda1"), None);
    }

    fn entry(source: &str, options: &str) -> fsinfo::MountEntry {
        fsinfo::MountEntry {
            mount_point: PathBuf::from("/home/alice"),
            fs_type: "fuse.ccfs".into(),
            source: source.into(),
            options: options.into(),
        }
    }

    /// A mount made by a user must name a cache dir of that user; a mount root made (for
    /// a user, with --user) may name anyone's, since the daemon runs as them.
    #[test]
    fn a_mount_naming_someone_elses_cache_is_refused() {
        let tmp = tempfile::tempdir().expect("tmp");
        let owner = std::fs::metadata(tmp.path()).expect("meta").uid();
        let source = mount_source(tmp.path()).expect("source");
        let by_owner = mount_ref(&entry(&source, &format!("rw,user_id={owner}"))).expect("ok");
        assert_eq!(by_owner.socket, tmp.path().join("control.sock"));
        assert_eq!((by_owner.mount_uid, by_owner.cache_uid), (owner, owner));
        assert!(mount_ref(&entry(&source, "rw,user_id=0")).is_ok());
        let other = owner.wrapping_add(4242).max(1);
        let e = mount_ref(&entry(&source, &format!("rw,user_id={other}"))).expect_err("refused");
        assert!(e.contains("not to the mount's owner"), "{e}");
        let e = mount_ref(&entry("ccfs", "rw,user_id=0")).expect_err("no cache dir");
        assert!(e.contains("names no cache dir"), "{e}");
        let e = mount_ref(&entry(&source, "rw")).expect_err("no owner");
        assert!(e.contains("user_id"), "{e}");
    }

    /// The last component of a mount point is only read as a link, never stat-ed; a
    /// symlink to the mount point leads to it.
    #[test]
    fn mount_point_paths_follow_links_and_parents() {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path().canonicalize().expect("canonical");
        let real = root.join("real");
        std::fs::create_dir(&real).expect("mkdir");
        std::os::unix::fs::symlink(&real, root.join("abs-link")).expect("symlink");
        std::os::unix::fs::symlink("real", root.join("rel-link")).expect("symlink");
        std::fs::create_dir(root.join("sub")).expect("mkdir");
        for p in [
            root.join("real"),
            root.join("real/"),
            root.join("real/."),
            root.join("abs-link"),
            root.join("rel-link"),
            root.join("sub/../real"),
        ] {
            assert_eq!(mount_point_path(&p).expect("resolved"), real, "{p:?}");
        }
        // A path that does not exist resolves lexically below its parent.
        assert_eq!(
            mount_point_path(&root.join("missing")).expect("resolved"),
            root.join("missing")
        );
    }

    #[test]
    fn the_probe_tells_a_reachable_share_from_one_that_fails() {
        let tmp = tempfile::tempdir().expect("tmp");
        let share = tmp.path().join("share");
        std::fs::create_dir(&share).expect("mkdir");
        let gate = Arc::new(ShareGate::default());
        let probe = ShareProbe::start(&share, PROBE_TIMEOUT, gate.clone()).expect("probe");
        assert_eq!(probe.check(), ShareHealth::Reachable);
        std::fs::remove_dir(&share).expect("rmdir");
        let first = probe.check();
        let ShareHealth::Error { error, since } = &first else {
            panic!("an error: {first:?}");
        };
        assert!(error.contains("No such file"), "{error}");
        assert!(gate.is_closed(), "a failed look closes the gate");
        assert!(
            first.describe().starts_with("error: "),
            "{}",
            first.describe()
        );
        // The outage started with the first failed look, not the latest.
        std::thread::sleep(Duration::from_millis(1100));
        assert!(matches!(probe.check(), ShareHealth::Error { since: s, .. } if s == *since));
        std::fs::create_dir(&share).expect("mkdir");
        assert_eq!(probe.check(), ShareHealth::Reachable);
        assert!(!gate.is_closed(), "an answer opens it again");
    }
}
