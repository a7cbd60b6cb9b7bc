//! The daemon's control socket (`CACHE/control.sock`): `ccfs status`, `ccfs sync` and
//! `ccfs umount` talk to a running mount through it, one JSON line each way.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use serde::{Deserialize, Serialize};

use crate::overlay::Overlay;
use crate::sync::{run_sync, RsyncOptions, SyncMode, SyncReport};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "lowercase")]
pub enum Request {
    Status,
    Sync,
    /// Acknowledged at once with `{"waiting":true}`, then answered once the daemon's
    /// final sync (after unmount) is done.
    Wait,
}

/// The result of one sync as the daemon reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SyncOutcome {
    pub ok: bool,
    pub report: Option<SyncReport>,
    pub error: Option<String>,
}

impl From<Result<SyncReport, crate::sync::SyncError>> for SyncOutcome {
    /// Ok only when rsync succeeded and nothing is left unsynced.
    fn from(r: Result<SyncReport, crate::sync::SyncError>) -> Self {
        match r {
            Ok(report) => SyncOutcome {
                ok: report.ok && report.remaining_dirty == 0 && report.remaining_deletions == 0,
                report: Some(report),
                error: None,
            },
            Err(e) => SyncOutcome {
                ok: false,
                report: None,
                error: Some(e.to_string()),
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
    pub last_sync: Option<SyncOutcome>,
    /// Conflicts found by the syncs of this mount (both versions kept).
    #[serde(default)]
    pub conflicts: Vec<crate::overlay::Conflict>,
    /// The FUSE requests served since the mount, by kind, and the bytes moved.
    #[serde(default)]
    pub requests: crate::counters::RequestCounts,
}

/// State shared by the FUSE session, the control socket and the final sync.
#[derive(Debug)]
pub struct Daemon {
    pub overlay: Arc<Overlay>,
    pub rsync: RsyncOptions,
    pub share: PathBuf,
    pub mountpoint: PathBuf,
    pub cache_dir: PathBuf,
    sync_lock: Mutex<()>,
    last_sync: Mutex<Option<SyncOutcome>>,
    conflicts: Mutex<Vec<crate::overlay::Conflict>>,
    final_sync: Mutex<Option<SyncOutcome>>,
    final_cv: Condvar,
    /// `ccfs umount` clients waiting for the final answer.
    waiters: std::sync::atomic::AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Daemon {
    pub fn new(
        overlay: Arc<Overlay>,
        rsync: RsyncOptions,
        share: PathBuf,
        mountpoint: PathBuf,
        cache_dir: PathBuf,
    ) -> Self {
        Self {
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
            waiters: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Runs one sync (syncs never overlap) and remembers its outcome.
    pub fn sync_now(&self, mode: SyncMode) -> SyncOutcome {
        let _one_at_a_time = lock(&self.sync_lock);
        let outcome = SyncOutcome::from(run_sync(&self.overlay, &self.rsync, mode));
        if let Some(err) = &outcome.error {
            // rsync's messages quote file names, which are the user's: escaped.
            tracing::error!("sync failed: {}", crate::daemon::LogText(err));
        }
        if let Some(report) = &outcome.report {
            log_conflicts(&self.cache_dir, &report.conflicts);
            lock(&self.conflicts).extend(report.conflicts.iter().cloned());
        }
        if let Ok(text) = serde_json::to_vec_pretty(&outcome) {
            let _ = crate::daemon::write_atomic(&self.cache_dir.join("last-sync.json"), &text);
        }
        *lock(&self.last_sync) = Some(outcome.clone());
        outcome
    }

    pub fn status(&self) -> Status {
        let (dirty_files, dirty_bytes, pending_deletions) = self.overlay.pending();
        Status {
            pid: std::process::id(),
            share: self.share.clone(),
            mountpoint: self.mountpoint.clone(),
            cache_dir: self.cache_dir.clone(),
            dirty_files,
            dirty_bytes,
            pending_deletions,
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
            g = self.final_cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Waits (a bounded time) until every `ccfs umount` waiting has been answered.
    pub fn drain_waiters(&self, timeout: std::time::Duration) {
        let start = std::time::Instant::now();
        while self.waiters.load(std::sync::atomic::Ordering::Acquire) > 0
            && start.elapsed() < timeout
        {
            std::thread::sleep(std::time::Duration::from_millis(2));
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

fn serve_one(daemon: &Daemon, stream: UnixStream) -> std::io::Result<()> {
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    let req = serde_json::from_str::<Request>(line.trim());
    let waiting = matches!(req, Ok(Request::Wait));
    if waiting {
        daemon
            .waiters
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
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
        daemon
            .waiters
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
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
    std::thread::Builder::new()
        .name("ccfs-control".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let d = daemon.clone();
                let _ = std::thread::Builder::new()
                    .name("ccfs-control-conn".into())
                    .spawn(move || {
                        if let Err(e) = serve_one(&d, stream) {
                            tracing::debug!("control connection: {e}");
                        }
                    });
            }
        })?;
    Ok(())
}

/// Sends one request and reads the answer (client side).
pub fn request(socket: &Path, req: &Request) -> std::io::Result<serde_json::Value> {
    let stream = UnixStream::connect(socket)?;
    send(&stream, req)?;
    read_answer(&stream)
}

pub fn send(stream: &UnixStream, req: &Request) -> std::io::Result<()> {
    let mut w = stream;
    let text = serde_json::to_string(req).map_err(std::io::Error::other)?;
    w.write_all(text.as_bytes())?;
    w.write_all(b"\n")
}

pub fn read_answer(stream: &UnixStream) -> std::io::Result<serde_json::Value> {
    read_line_value(&mut BufReader::new(stream))
}

/// Reads one JSON line from a buffered connection (several answers may follow).
pub fn read_line_value(reader: &mut impl BufRead) -> std::io::Result<serde_json::Value> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if line.trim().is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the daemon closed the connection without an answer",
        ));
    }
    serde_json::from_str(line.trim()).map_err(std::io::Error::other)
}
