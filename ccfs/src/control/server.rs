//! The daemon's side: its state as the control socket shows it, one client served at a time
//! per connection, syncs on request.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use crate::error::LogText;
use crate::overlay::Overlay;
use crate::sync::{run_sync, RsyncOptions, SyncMode};

use super::*;

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
    /// One sync at a time. Lock order: 1 (ARCHITECTURE.md, Locks), held for the whole
    /// sync.
    sync_lock: Mutex<()>,
    /// Lock order: 16, a leaf (as `conflicts` and `final_sync`).
    last_sync: Mutex<Option<SyncOutcome>>,
    conflicts: Mutex<Vec<crate::overlay::Conflict>>,
    final_sync: Mutex<Option<SyncOutcome>>,
    final_cv: Condvar,
    /// `ccfs umount` clients waiting for the final answer.
    waiters: AtomicUsize,
    /// A listing for `ccfs status --verbose` under way (one at a time).
    listing: Arc<std::sync::atomic::AtomicBool>,
    /// The kernel's names, once the session is up (see [`Daemon::set_kernel_view`]).
    kernel: std::sync::OnceLock<crate::fuse::KernelView>,
    /// How requests travel, once the session is up.
    transport: std::sync::OnceLock<Arc<crate::fuse::RingSlot>>,
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
            listing: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            kernel: std::sync::OnceLock::new(),
            transport: std::sync::OnceLock::new(),
        })
    }

    /// Lets syncs tell the kernel which names show another file after them.
    pub fn set_kernel_view(&self, view: crate::fuse::KernelView) {
        let _ = self.kernel.set(view);
    }

    /// Lets `ccfs status` say how requests travel.
    pub fn set_transport(&self, ring: Arc<crate::fuse::RingSlot>) {
        let _ = self.transport.set(ring);
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
            self.conflicts
                .locked()
                .extend(report.conflicts.iter().cloned());
        }
        self.remember(&outcome);
        outcome
    }

    fn remember(&self, outcome: &SyncOutcome) {
        if let Ok(text) = serde_json::to_vec_pretty(outcome) {
            let _ = crate::journal::write_atomic(&self.cache_dir.join("last-sync.json"), &text);
        }
        *self.last_sync.locked() = Some(outcome.clone());
    }

    /// Runs `f` unless a sync runs now (then None), holding the sync lock meanwhile: work
    /// that must not change what a sync looks at (the background copy of the blocks a
    /// file held by block lacks: its descriptor open for writing, the mtime put back).
    pub fn unless_syncing<T>(&self, f: impl FnOnce() -> T) -> Option<T> {
        let _one_at_a_time = match self.sync_lock.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(f())
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
            last_sync: self.last_sync.locked().clone(),
            conflicts: self.conflicts.locked().clone(),
            requests: self.overlay.requests.snapshot(),
            transport: self.transport.get().map(|r| r.transport()),
            held_by_block: {
                let (files, lacking_bytes, to_fill_bytes) = self.overlay.held_by_block_now();
                super::HeldByBlock {
                    files,
                    lacking_bytes,
                    to_fill_bytes,
                }
            },
        }
    }

    /// The unsynced paths and pending deletions, taken on a helper thread (the filesystem's
    /// lock may be held by a request waiting on a hung share); none when they do not come
    /// in time.
    fn pending_paths(&self) -> Option<super::Pending> {
        // One listing at a time: a request while one waits on the filesystem's lock gets
        // none rather than a thread of its own.
        if self.listing.swap(true, Ordering::AcqRel) {
            return None;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let overlay = self.overlay.clone();
        let cache = self.cache_dir.clone();
        let listing = self.listing.clone();
        let spawned = std::thread::Builder::new()
            .name("ccfs-list".into())
            .spawn(move || {
                let (dirty, deletions) = overlay.pending_paths(super::PENDING_LISTED);
                let cache_bytes = Some(super::disk_usage(&cache));
                listing.store(false, Ordering::Release);
                let _ = tx.send(super::Pending {
                    dirty,
                    deletions,
                    cache_bytes,
                });
            });
        if spawned.is_err() {
            self.listing.store(false, Ordering::Release);
            return None;
        }
        let got = rx.recv_timeout(super::LIST_TIMEOUT).ok();
        if got.is_none() {
            // Still waiting on the filesystem: the next request may try again.
            self.listing.store(false, Ordering::Release);
        }
        got
    }

    /// Publishes the final sync's outcome to `ccfs umount` waiting on the socket.
    pub fn set_final(&self, outcome: SyncOutcome) {
        *self.final_sync.locked() = Some(outcome);
        self.final_cv.notify_all();
    }

    fn wait_final(&self) -> SyncOutcome {
        let mut g = self.final_sync.locked();
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
            Request::Pending => match self.pending_paths() {
                Some(p) => serde_json::to_value(p),
                None => Ok(serde_json::json!({
                    "error": "the filesystem is busy waiting on the share: no list now"
                })),
            },
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

pub(super) fn serve_one(daemon: &Daemon, stream: UnixStream, owner: u32) -> std::io::Result<()> {
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
