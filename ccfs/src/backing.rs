//! Kernel passthrough of open files (FUSE passthrough, Linux 6.9 and later): the kernel
//! reads and writes an open file's backing file (the share's or the cache's) itself,
//! without a round trip to the daemon per read or write.
//!
//! The kernel's rules (Linux 6.18), which every open here keeps: all the open files of one
//! inode are either in passthrough mode, all with the same backing file, or in the cached
//! mode (the page cache, reads and writes through the daemon); an inode in passthrough
//! mode takes no other open, not even FOPEN_DIRECT_IO. An open that breaks them fails with
//! EIO, so the daemon tracks each node's open files here and picks the mode of each new
//! open from them:
//!
//! - the node has a backing file: passthrough with it (it is open for reading and
//!   writing); an open of another object behind the name, or one whose writes the daemon
//!   must see, fails with ESTALE (it cannot happen but when the share's file was replaced
//!   under an open one);
//! - the node's open files are in the cached mode, or this handle's writes must reach the
//!   daemon (a deferred copy-up, see [`crate::overlay::Overlay::open_deferred`]): cached;
//! - no open file: passthrough, with a new descriptor of the file for reading and writing
//!   as the backing file; cached when the user may not both read and write it.
//!
//! Registering a backing file needs CAP_SYS_ADMIN. Root's own daemon registers itself; the
//! daemon of a user's mount holds no capability, and asks its broker, a child process that
//! runs as the user with CAP_SYS_ADMIN alone (see [`crate::sys::spawn_backing_broker`]).
//! When registering fails for good (no capability, no broker, a kernel without it), the
//! daemon goes on without passthrough and says so once in its log.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::locks::Locked;
use crate::sys::{self, Stat};

/// Who registers backing files with the kernel.
#[derive(Debug)]
pub enum Registrar {
    /// The daemon itself (it runs as root): a copy of the FUSE device.
    Direct(OwnedFd),
    /// The broker of a user's mount: the daemon's end of its socket. Lock order: 10
    /// (ARCHITECTURE.md, Locks), held for one request and its answer.
    Broker(Mutex<OwnedFd>),
}

impl Registrar {
    fn open(&self, file: BorrowedFd<'_>) -> io::Result<u32> {
        match self {
            Registrar::Direct(dev) => sys::fuse_backing_open(dev.as_fd(), file),
            Registrar::Broker(sock) => {
                let sock = sock.locked();
                sys::broker_send(sock.as_fd(), sys::BROKER_OPEN, 0, Some(file))?;
                sys::broker_answer(sock.as_fd())
            }
        }
    }

    fn close(&self, id: u32) -> io::Result<()> {
        match self {
            Registrar::Direct(dev) => sys::fuse_backing_close(dev.as_fd(), id),
            Registrar::Broker(sock) => {
                let sock = sock.locked();
                sys::broker_send(sock.as_fd(), sys::BROKER_CLOSE, id, None)
            }
        }
    }
}

/// How the kernel does the I/O of one open file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// The kernel reads and writes this backing file itself.
    Passthrough(u32),
    /// Through the daemon and the page cache; `keep_cache`: the pages the kernel holds of
    /// the file are still right (nothing changed it since they were read).
    Cached { keep_cache: bool },
}

/// What an open needs of its I/O mode.
#[derive(Debug, Clone, Copy)]
pub struct OpenKind {
    /// The daemon must see this handle's writes (a deferred copy-up).
    pub through_daemon: bool,
    /// How long the kernel's pages of an unchanged file may be kept: a file's version
    /// (size and times) may stay the same across a change (a share that keeps times to the
    /// second, two same-size writes in one clock tick), so pages read longer ago than this
    /// are read again.
    pub keep_for: Duration,
}

#[derive(Debug)]
struct Backed {
    id: u32,
    object: (u64, u64),
    handles: usize,
}

/// The open files of one node, as the kernel sees their modes.
#[derive(Debug, Default)]
struct NodeIo {
    cached: usize,
    backing: Option<Backed>,
    /// The file as it was when the kernel's pages of it were last dropped at a cached-mode
    /// open, and when that was: they are kept while it is unchanged, for at most
    /// [`OpenKind::keep_for`].
    seen: Option<(sys::Version, Instant)>,
}

/// The kernel passthrough of one mount: whether it works, and every node's open files.
#[derive(Debug)]
pub struct Passthrough {
    registrar: OnceLock<Registrar>,
    enabled: AtomicBool,
    /// Lock order: 9 (ARCHITECTURE.md, Locks): held while a backing file is registered
    /// (the broker's socket, 9).
    nodes: Mutex<HashMap<u64, NodeIo>>,
}

impl Passthrough {
    /// `enabled`: the configuration asks for passthrough (it still needs a registrar and
    /// the kernel's agreement at init).
    pub fn new(enabled: bool) -> Self {
        Self {
            registrar: OnceLock::new(),
            enabled: AtomicBool::new(enabled),
            nodes: Mutex::new(HashMap::new()),
        }
    }

    /// Sets who registers backing files; once, before the session serves requests.
    pub fn set_registrar(&self, r: Registrar) {
        let _ = self.registrar.set(r);
    }

    /// Whether passthrough is asked for (and not turned off): the kernel is asked for it
    /// at init, which may come before the registrar is set.
    pub fn wanted(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Whether opens may use passthrough now.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed) && self.registrar.get().is_some()
    }

    /// Turns passthrough off for the rest of the mount, saying why once.
    pub fn disable(&self, why: &str) {
        if self.enabled.swap(false, Ordering::Relaxed) {
            tracing::warn!("kernel passthrough is off for this mount: {why}");
        }
    }

    fn nodes(&self) -> MutexGuard<'_, HashMap<u64, NodeIo>> {
        self.nodes.locked()
    }

    /// The mode of a new open file of `node` (`file`, whose attributes are `meta`), counted
    /// as open until [`Passthrough::released`]; an error when the open cannot be served
    /// (see [`OpenKind`]).
    pub fn choose(
        &self,
        node: u64,
        file: &File,
        meta: &Stat,
        kind: OpenKind,
    ) -> io::Result<IoMode> {
        let mut nodes = self.nodes();
        let io = nodes.entry(node).or_default();
        // The kernel takes every open of an inode in passthrough mode in that mode, with
        // its backing file, and no other: the backing file is open for reading and
        // writing, so it serves any open of the same object.
        if let Some(b) = io.backing.as_mut() {
            if b.object == (meta.dev(), meta.ino()) && !kind.through_daemon {
                b.handles += 1;
                return Ok(IoMode::Passthrough(b.id));
            }
            // Another object behind the name now (the share's file was replaced while
            // open here), or a handle the daemon must see: the kernel would refuse it.
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
        let passthrough = self.enabled() && meta.is_file() && !kind.through_daemon;
        if passthrough && io.cached == 0 {
            if let Some(r) = self.registrar.get() {
                // A descriptor for reading and writing, with no flags of its own (the
                // kernel passes O_APPEND and O_SYNC of each open file with each write),
                // so that it serves every later open; a file the user may not both read
                // and write goes the cached way.
                let own = sys::is_plain_read_write(file, libc::O_APPEND | libc::O_DIRECT);
                let reopened = if own {
                    None
                } else {
                    match sys::reopen_read_write(file) {
                        Ok(f) => Some(f),
                        Err(_) => return Ok(self.cached(&mut nodes, node, meta, kind)),
                    }
                };
                let backing = reopened.as_ref().unwrap_or(file);
                match r.open(backing.as_fd()) {
                    Ok(id) => {
                        let io = nodes.entry(node).or_default();
                        io.backing = Some(Backed {
                            id,
                            object: (meta.dev(), meta.ino()),
                            handles: 1,
                        });
                        io.seen = None;
                        return Ok(IoMode::Passthrough(id));
                    }
                    // A backing file the kernel will not stack (a share that is itself a
                    // passthrough FUSE mount): this file goes the cached way.
                    Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {}
                    Err(e) => {
                        drop(nodes);
                        self.disable(&format!("registering a backing file failed: {e}"));
                        nodes = self.nodes();
                    }
                }
            }
        }
        Ok(self.cached(&mut nodes, node, meta, kind))
    }

    /// Counts a cached-mode open of `node`.
    fn cached(
        &self,
        nodes: &mut HashMap<u64, NodeIo>,
        node: u64,
        meta: &Stat,
        kind: OpenKind,
    ) -> IoMode {
        let io = nodes.entry(node).or_default();
        io.cached += 1;
        let now = meta.version();
        let keep_cache = io
            .seen
            .is_some_and(|(v, at)| v == now && at.elapsed() < kind.keep_for);
        if !keep_cache {
            io.seen = Some((now, Instant::now()));
        }
        IoMode::Cached { keep_cache }
    }

    /// An open file of `node` in `mode` was released.
    pub fn released(&self, node: u64, mode: IoMode) {
        let mut nodes = self.nodes();
        let Some(io) = nodes.get_mut(&node) else {
            return;
        };
        let mut close = None;
        match mode {
            IoMode::Passthrough(id) => {
                if let Some(b) = io.backing.as_mut().filter(|b| b.id == id) {
                    b.handles -= 1;
                    if b.handles == 0 {
                        close = Some(id);
                        io.backing = None;
                    }
                }
            }
            IoMode::Cached { .. } => io.cached = io.cached.saturating_sub(1),
        }
        if io.backing.is_none() && io.cached == 0 && io.seen.is_none() {
            nodes.remove(&node);
        }
        drop(nodes);
        if let (Some(id), Some(r)) = (close, self.registrar.get()) {
            if let Err(e) = r.close(id) {
                tracing::debug!(id, "closing a backing file failed: {e}");
            }
        }
    }

    /// Forgets the pages the kernel may keep of `node` (its node is gone).
    pub fn forget(&self, node: u64) {
        let mut nodes = self.nodes();
        if let Some(io) = nodes.get_mut(&node) {
            io.seen = None;
            if io.backing.is_none() && io.cached == 0 {
                nodes.remove(&node);
            }
        }
    }

    /// The open files counted now: in passthrough mode and in the cached mode.
    pub fn open_counts(&self) -> (usize, usize) {
        let nodes = self.nodes();
        nodes.values().fold((0, 0), |(p, c), io| {
            (
                p + io.backing.as_ref().map_or(0, |b| b.handles),
                c + io.cached,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta_of(f: &File) -> Stat {
        sys::fstat(f).expect("fstat")
    }

    #[test]
    fn without_a_registrar_every_open_is_cached_and_unchanged_files_keep_their_pages() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("f");
        std::fs::write(&p, b"one").expect("write");
        let io = Passthrough::new(true);
        let f = File::open(&p).expect("open");
        let kind = OpenKind {
            through_daemon: false,
            keep_for: Duration::from_secs(600),
        };
        let first = io.choose(7, &f, &meta_of(&f), kind).expect("mode");
        assert_eq!(first, IoMode::Cached { keep_cache: false });
        io.released(7, first);
        let again = io.choose(7, &f, &meta_of(&f), kind).expect("mode");
        assert_eq!(again, IoMode::Cached { keep_cache: true });
        io.released(7, again);
        std::fs::write(&p, b"changed").expect("write");
        let changed = io.choose(7, &f, &meta_of(&f), kind).expect("mode");
        assert_eq!(changed, IoMode::Cached { keep_cache: false });
        io.released(7, changed);
        io.forget(7);
        assert_eq!(io.open_counts(), (0, 0));
    }

    #[test]
    fn pages_of_an_unchanged_file_are_kept_no_longer_than_asked() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("f");
        std::fs::write(&p, b"one").expect("write");
        let io = Passthrough::new(false);
        let f = File::open(&p).expect("open");
        let kind = OpenKind {
            through_daemon: false,
            keep_for: Duration::from_millis(200),
        };
        let first = io.choose(7, &f, &meta_of(&f), kind).expect("mode");
        let soon = io.choose(7, &f, &meta_of(&f), kind).expect("mode");
        assert_eq!(soon, IoMode::Cached { keep_cache: true });
        std::thread::sleep(Duration::from_millis(300));
        let later = io.choose(7, &f, &meta_of(&f), kind).expect("mode");
        assert_eq!(later, IoMode::Cached { keep_cache: false });
        let after = io.choose(7, &f, &meta_of(&f), kind).expect("mode");
        assert_eq!(after, IoMode::Cached { keep_cache: true });
        for m in [first, soon, later, after] {
            io.released(7, m);
        }
        assert_eq!(io.open_counts(), (0, 0));
    }
}
