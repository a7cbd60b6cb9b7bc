//! Kernel passthrough of open files (FUSE passthrough, Linux 6.9 and later): the kernel
//! reads and writes an open file's backing file (the share's or the cache's) itself,
//! without a round trip to the daemon per read or write.
//!
//! The kernel's rules, which every open here keeps: all the open files of one inode are
//! either in passthrough mode, all with the same backing file, or in the cached mode (the
//! page cache, reads and writes through the daemon); a file opened with FOPEN_DIRECT_IO
//! may be open beside either (its reads and writes go through the daemon, uncached). An
//! open that breaks them fails with EIO, so the daemon tracks each node's open files here
//! and picks the mode of each new open from them:
//!
//! - a handle whose writes the daemon must see (a deferred copy-up, see
//!   [`crate::overlay::Overlay::open_deferred`]): the cached mode, or FOPEN_DIRECT_IO
//!   when the node is in passthrough mode;
//! - any other: passthrough, with the node's backing file when it has one (same object,
//!   and writable if this open writes), with its own file when the node has no open file;
//!   the cached mode when the node's open files are in it; FOPEN_DIRECT_IO otherwise.
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

use crate::sys::{self, Stat};

/// Who registers backing files with the kernel.
#[derive(Debug)]
pub enum Registrar {
    /// The daemon itself (it runs as root): a copy of the FUSE device.
    Direct(OwnedFd),
    /// The broker of a user's mount: the daemon's end of its socket.
    Broker(Mutex<OwnedFd>),
}

impl Registrar {
    fn open(&self, file: BorrowedFd<'_>) -> io::Result<u32> {
        match self {
            Registrar::Direct(dev) => sys::fuse_backing_open(dev.as_fd(), file),
            Registrar::Broker(sock) => {
                let sock = sock.lock().unwrap_or_else(|e| e.into_inner());
                sys::broker_send(sock.as_fd(), sys::BROKER_OPEN, 0, Some(file))?;
                sys::broker_answer(sock.as_fd())
            }
        }
    }

    fn close(&self, id: u32) -> io::Result<()> {
        match self {
            Registrar::Direct(dev) => sys::fuse_backing_close(dev.as_fd(), id),
            Registrar::Broker(sock) => {
                let sock = sock.lock().unwrap_or_else(|e| e.into_inner());
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
    /// Through the daemon, uncached (FOPEN_DIRECT_IO).
    Direct,
}

/// What an open needs of its I/O mode.
#[derive(Debug, Clone, Copy)]
pub struct OpenKind {
    /// The daemon must see this handle's writes (a deferred copy-up).
    pub through_daemon: bool,
    /// The handle may write.
    pub writes: bool,
}

#[derive(Debug)]
struct Backed {
    id: u32,
    object: (u64, u64),
    writable: bool,
    handles: usize,
}

/// The open files of one node, as the kernel sees their modes.
#[derive(Debug, Default)]
struct NodeIo {
    cached: usize,
    backing: Option<Backed>,
    /// The file as it was at the node's last cached-mode open: the kernel's pages of it
    /// are kept while it is unchanged.
    seen: Option<sys::Version>,
}

/// The kernel passthrough of one mount: whether it works, and every node's open files.
#[derive(Debug)]
pub struct Passthrough {
    registrar: OnceLock<Registrar>,
    enabled: AtomicBool,
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
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The mode of a new open file of `node` (`file`, whose attributes are `meta`), counted
    /// as open until [`Passthrough::released`].
    pub fn choose(&self, node: u64, file: &File, meta: &Stat, kind: OpenKind) -> IoMode {
        let passthrough = self.enabled() && meta.is_file() && !kind.through_daemon;
        let mut nodes = self.nodes();
        let io = nodes.entry(node).or_default();
        if let Some(b) = io.backing.as_mut() {
            if passthrough && b.object == (meta.dev(), meta.ino()) && (b.writable || !kind.writes) {
                b.handles += 1;
                return IoMode::Passthrough(b.id);
            }
            return IoMode::Direct;
        }
        if passthrough && io.cached == 0 {
            if let Some(r) = self.registrar.get() {
                // The backing file's own flags apply to every open file that shares it:
                // it appends and bypasses the page cache only where a program asked (the
                // kernel passes O_APPEND and O_SYNC of each open file with each write).
                let had = match sys::clear_status_flags(file, libc::O_APPEND | libc::O_DIRECT) {
                    Ok(had) => had,
                    Err(_) => return self.cached(&mut nodes, node, meta),
                };
                let registered = r.open(file.as_fd());
                if registered.is_err() {
                    let _ = sys::set_status_flags(file, had);
                }
                match registered {
                    Ok(id) => {
                        io.backing = Some(Backed {
                            id,
                            object: (meta.dev(), meta.ino()),
                            writable: kind.writes,
                            handles: 1,
                        });
                        io.seen = None;
                        return IoMode::Passthrough(id);
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
        self.cached(&mut nodes, node, meta)
    }

    /// Counts a cached-mode open of `node`.
    fn cached(&self, nodes: &mut HashMap<u64, NodeIo>, node: u64, meta: &Stat) -> IoMode {
        let io = nodes.entry(node).or_default();
        io.cached += 1;
        let now = meta.version();
        let keep_cache = io.seen == Some(now);
        io.seen = Some(now);
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
            IoMode::Direct => {}
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
            writes: false,
        };
        let first = io.choose(7, &f, &meta_of(&f), kind);
        assert_eq!(first, IoMode::Cached { keep_cache: false });
        io.released(7, first);
        let again = io.choose(7, &f, &meta_of(&f), kind);
        assert_eq!(again, IoMode::Cached { keep_cache: true });
        io.released(7, again);
        std::fs::write(&p, b"changed").expect("write");
        let changed = io.choose(7, &f, &meta_of(&f), kind);
        assert_eq!(changed, IoMode::Cached { keep_cache: false });
        io.released(7, changed);
        io.forget(7);
        assert_eq!(io.open_counts(), (0, 0));
    }
}
