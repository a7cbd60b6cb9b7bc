//! The FUSE adapter: the only module that knows fuser's request and reply types.
//!
//! Each handler turns node ids into paths ([`crate::nodes`]), calls the [`Overlay`], and
//! turns the result into a reply; every error goes through [`reply_err`]. A node keeps its
//! id (the inode number programs see) across copy-up and rename for the life of the mount.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use crate::locks::Locked;
use fuse_ring::reply as rep;
use fuse_ring::Caller;
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, TimeOrNow, WriteFlags,
};

use crate::backing::{IoMode, Passthrough};
use crate::counters::Req;
use crate::error::FsError;
use crate::nodes::Nodes;
use crate::overlay::{Layer, Overlay, SetAttr};

/// How long the kernel may keep what ccfs answered, by where the answer came from.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Names, attributes and missing names on the share (another workstation of the same
    /// user may change them).
    pub share: Duration,
    /// Names and attributes of what the cache holds (only this mount changes it).
    pub cache: Duration,
    /// Whether listings carry each entry's attributes (READDIRPLUS).
    pub readdirplus: crate::config::Readdirplus,
}

/// The ccfs filesystem as fuser sees it.
#[derive(Debug)]
pub struct CcfsFs {
    overlay: Arc<Overlay>,
    /// Lock order: 11 (ARCHITECTURE.md, Locks), a leaf (as `links` and `listed`).
    nodes: Arc<Mutex<Nodes>>,
    /// Signalled when a request lets go of the nodes it pinned or marked (with `nodes`).
    moved: Condvar,
    /// The node of a file with several links, by its backing object (see [`CcfsFs::entry`]).
    links: Mutex<HashMap<(u64, u64), u64>>,
    /// Lock order: 5, a leaf (a handle's own locks are taken after it is let go).
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    ttl: Timeouts,
    /// Kernel passthrough of open files, and every node's open files.
    io: Arc<Passthrough>,
    /// Each directory's last listing: an OPENDIR that finds the directory unchanged lets
    /// the kernel keep that listing (FOPEN_KEEP_CACHE).
    listed: Mutex<HashMap<u64, Listed>>,
    /// Whether listings give their entries' attributes at once. Lock order: 11, a leaf.
    habit: Mutex<habit::ListingHabit>,
    /// FUSE over io_uring, when the mount asks for it.
    pub ring: Arc<RingSlot>,
}

macro_rules! try_reply {
    ($reply:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(err) => {
                $reply.error(err);
                return;
            }
        }
    };
}

mod adapter;
mod convert;
mod habit;
mod handles;
mod kernel_view;
mod names;
mod ring;

pub use adapter::Served;
use convert::*;
use handles::*;
pub use kernel_view::KernelView;
pub use ring::{RingSlot, TransportState};

/// How many times a request that found something at a path takes the path again after a
/// node on its way moved (see [`Nodes::moved_since`]) before it gives up with EAGAIN.
const MOVED_TRIES: usize = 16;

impl CcfsFs {
    pub fn new(overlay: Arc<Overlay>, ttl: Timeouts, io: Arc<Passthrough>) -> Self {
        Self {
            overlay,
            nodes: Arc::new(Mutex::new(Nodes::new())),
            moved: Condvar::new(),
            links: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            ttl,
            io,
            listed: Mutex::new(HashMap::new()),
            habit: Mutex::new(habit::ListingHabit::default()),
            ring: Arc::new(RingSlot::off()),
        }
    }

    /// The node table, for a [`KernelView`] made once the session exists.
    pub fn node_table(&self) -> Arc<Mutex<Nodes>> {
        self.nodes.clone()
    }
}

/// The request handlers, one per FUSE request, with the parameter lists of fuser's
/// `Filesystem` (every transport calls them: [`Served`]).
#[allow(clippy::too_many_arguments)]
impl CcfsFs {
    /// What ccfs asks of the kernel at INIT.
    fn init(&self, config: &mut KernelConfig) -> std::io::Result<()> {
        use fuser::InitFlags as F;
        // Lookups and listings of one directory may run at once; symlink targets are
        // kept by the kernel (a target never changes in place). Not FUSE_ATOMIC_O_TRUNC:
        // with it the daemon truncates at OPEN, before the kernel checks that the file is
        // not a running program (ETXTBSY), which then comes too late.
        let mut wanted = F::FUSE_PARALLEL_DIROPS | F::FUSE_CACHE_SYMLINKS;
        if self.ttl.readdirplus != crate::config::Readdirplus::Never {
            // A listing with each entry's attributes when the kernel finds it useful: the
            // first part of a listing, and the rest only while the entries are looked at.
            wanted |= F::FUSE_DO_READDIRPLUS | F::FUSE_READDIRPLUS_AUTO;
        }
        let _ = config.add_capabilities(wanted & config.capabilities());
        if self.io.wanted() {
            let stacked = config.set_max_stack_depth(1).is_ok();
            if stacked && config.add_capabilities(F::FUSE_PASSTHROUGH).is_ok() {
                tracing::info!("kernel passthrough of open files is on");
            } else {
                self.io
                    .disable("the kernel does not offer it (Linux 6.9 or later has it)");
            }
        }
        tracing::info!(share = %self.overlay.share().display(), "mounted");
        Ok(())
    }

    fn lookup(&self, _req: &Caller, parent: INodeNo, name: &OsStr, reply: impl rep::Entry) {
        self.count(Req::Lookup, parent, Some(name));
        self.habit.locked().looked_up(parent.0);
        // The parent's path holds until a directory moves through this mount: what was
        // found at a path taken before a move is looked at again (see `Nodes::moves`).
        for _ in 0..MOVED_TRIES {
            let (dir, seen) = try_reply!(reply, self.path_seen(parent));
            let path = dir.join(name);
            let found = self.overlay.resolve(&path);
            if found.is_err() && self.moved_since(parent, seen) {
                continue;
            }
            match found {
                Ok(found) => {
                    let Some(a) = self.entry_seen(parent, name, &found, Some(seen)) else {
                        continue;
                    };
                    reply.entry(&self.ttl(found.layer), &a, Generation(0));
                }
                // A name that is nowhere: the kernel may remember that as long as what
                // the share holds (node 0: a negative entry). Names made through this
                // mount replace it at once.
                Err(e) if e.errno() == libc::ENOENT && !self.ttl.share.is_zero() => {
                    let none = negative_attr();
                    reply.entry_with_ttls(&Duration::ZERO, &self.ttl.share, &none, Generation(0))
                }
                Err(e) => reply.error(reply_err("lookup", &path, &e)),
            }
            return;
        }
        // Directories kept moving under the lookup: the caller may try again.
        reply.error(Errno::EAGAIN);
    }

    fn forget(&self, _req: &Caller, ino: INodeNo, nlookup: u64) {
        self.nodes().forget(ino.0, nlookup);
        // The kernel dropped the inode, and its pages and listing with it.
        self.io.forget(ino.0);
        self.listed().remove(&ino.0);
    }

    fn getattr<R: rep::Attr>(&self, _req: &Caller, ino: INodeNo, fh: Option<FileHandle>, reply: R) {
        self.count(Req::Getattr, ino, None);
        if let Some(fh) = fh {
            if let Ok(h) = self.handle(fh) {
                if let Handle::File { file, .. } = &*h {
                    if let Ok(m) = self.overlay.stat_open(&file.current()) {
                        reply.attr(&self.ttl.share, &attr(ino.0, &m));
                        return;
                    }
                }
            }
        }
        // fstat of a file unlinked while open comes without a handle: use any handle
        // still open on the node.
        let fallback = |e: Errno, reply: R| match self.open_node_stat(ino.0) {
            Some(m) => reply.attr(&self.ttl.share, &attr(ino.0, &m)),
            None => reply.error(e),
        };
        // What is found at a path taken before a directory moved is looked at again; an
        // object of another type than the node's is never given as its attributes (the
        // kernel would take the node for broken, and fail its open files for good).
        for _ in 0..MOVED_TRIES {
            let (path, seen) = match self.path_seen(ino) {
                Ok(p) => p,
                Err(e) => return fallback(e, reply),
            };
            let found = self.overlay.resolve(&path);
            // One look at the table for both checks (getattr is the busiest request).
            let (moved, other_kind) = {
                let nodes = self.nodes();
                let other = found
                    .as_ref()
                    .is_ok_and(|f| !nodes.is_kind(ino.0, f.meta.file_type()));
                (nodes.moved_since(ino.0, seen), other)
            };
            if moved {
                continue;
            }
            return match found {
                Ok(_) if other_kind => fallback(Errno::ESTALE, reply),
                Ok(found) => reply.attr(&self.ttl(found.layer), &attr(ino.0, &found.meta)),
                Err(e) => fallback(reply_err("getattr", &path, &e), reply),
            };
        }
        reply.error(Errno::EAGAIN)
    }

    fn setattr(
        &self,
        req: &Caller,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: impl rep::Attr,
    ) {
        self.count(Req::Setattr, ino, None);
        // Pinned before the handle's file is taken (see `CcfsFs::settle`).
        let (path, _pins) = try_reply!(reply, self.pin(ino));
        let handle = fh.and_then(|fh| self.handle(fh).ok());
        let guard = match handle.as_deref() {
            Some(h @ Handle::File { .. }) => {
                Some(try_reply!(reply, self.writable_at(req, h, Some(&path))))
            }
            _ => None,
        };
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
        };
        let done = match guard.as_deref() {
            // The attributes after the change are the handle's own file's: its path may
            // name another object by now (a directory moved).
            Some(g) => self
                .overlay
                .setattr_handle(&ctx(req, 0), &path, change, g)
                .map(|m| crate::sys::fstat(g.file()).unwrap_or(m)),
            None => self.overlay.setattr(&ctx(req, 0), &path, change, None),
        };
        match done {
            // (Never the attributes of an object of another type: see `getattr`.)
            Ok(meta) if !self.nodes().is_kind(ino.0, meta.file_type()) => {
                reply.error(Errno::ESTALE)
            }
            Ok(meta) => reply.attr(&self.ttl.share, &attr(ino.0, &meta)),
            Err(e) => reply.error(reply_err("setattr", &path, &e)),
        }
    }

    fn readlink(&self, _req: &Caller, ino: INodeNo, reply: impl rep::Data) {
        self.count(Req::Readlink, ino, None);
        let (path, target) = try_reply!(reply, self.at_path(ino, |p| self.overlay.readlink(p)));
        match target {
            Ok(target) => reply.data(target.as_os_str().as_bytes()),
            Err(e) => reply.error(reply_err("readlink", &path, &e)),
        }
    }

    fn mknod(
        &self,
        req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: impl rep::Entry,
    ) {
        self.count(Req::Mknod, parent, Some(name));
        let (dir, _pins) = try_reply!(reply, self.pin(parent));
        let path = dir.join(name);
        match self
            .overlay
            .mknod(&ctx(req, umask), &dir, name, mode, u64::from(rdev))
        {
            Ok(found) => reply.entry(
                &self.ttl(found.layer),
                &self.entry(parent, name, &found),
                Generation(0),
            ),
            Err(e) => reply.error(reply_err("mknod", &path, &e)),
        }
    }

    fn mkdir(
        &self,
        req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: impl rep::Entry,
    ) {
        self.count(Req::Mkdir, parent, Some(name));
        let (dir, _pins) = try_reply!(reply, self.pin(parent));
        let path = dir.join(name);
        match self.overlay.mkdir(&ctx(req, umask), &dir, name, mode) {
            Ok(found) => reply.entry(
                &self.ttl(found.layer),
                &self.entry(parent, name, &found),
                Generation(0),
            ),
            Err(e) => reply.error(reply_err("mkdir", &path, &e)),
        }
    }

    fn unlink(&self, _req: &Caller, parent: INodeNo, name: &OsStr, reply: impl rep::Empty) {
        self.count(Req::Unlink, parent, Some(name));
        self.remove(parent, name, false, reply);
    }

    fn rmdir(&self, _req: &Caller, parent: INodeNo, name: &OsStr, reply: impl rep::Empty) {
        self.count(Req::Rmdir, parent, Some(name));
        self.remove(parent, name, true, reply);
    }

    fn symlink(
        &self,
        req: &Caller,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: impl rep::Entry,
    ) {
        self.count(Req::Symlink, parent, Some(link_name));
        let (dir, _pins) = try_reply!(reply, self.pin(parent));
        let path = dir.join(link_name);
        match self.overlay.symlink(&ctx(req, 0), &dir, link_name, target) {
            Ok(found) => reply.entry(
                &self.ttl(found.layer),
                &self.entry(parent, link_name, &found),
                Generation(0),
            ),
            Err(e) => reply.error(reply_err("symlink", &path, &e)),
        }
    }

    fn rename(
        &self,
        req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: impl rep::Empty,
    ) {
        self.count(Req::Rename, parent, Some(name));
        let (from_dir, to_dir, mut pins) = try_reply!(reply, self.pin_two(parent, newparent));
        let from = from_dir.join(name);
        // The files held by block below are made whole before anything waits for the
        // move (the overlay's rename does it too, for what was written since).
        if let Err(e) = self.overlay.make_whole_below(&from) {
            reply.error(reply_err("rename", &from, &e));
            return;
        }
        // Both objects leave their names: what is under way on or below them ends first,
        // and what looks at a path through them waits for the move.
        try_reply!(
            reply,
            self.settle(&mut pins, &[(parent, name), (newparent, newname)])
        );
        self.begin_moves(&mut pins);
        let replaced = self.nodes().detach(newparent.0, newname);
        let result = self.overlay.rename(
            &ctx(req, 0),
            &from_dir,
            name,
            &to_dir,
            newname,
            flags.bits(),
        );
        match result {
            Ok(()) => {
                self.nodes()
                    .rename((parent.0, name), (newparent.0, newname));
                drop(pins);
                reply.ok()
            }
            Err(e) => {
                if let Some(id) = replaced {
                    self.nodes().reattach(newparent.0, newname, id);
                }
                reply.error(reply_err("rename", &from, &e))
            }
        }
    }

    fn link(
        &self,
        req: &Caller,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: impl rep::Entry,
    ) {
        self.count(Req::Link, newparent, Some(newname));
        let (src, dir, _pins) = try_reply!(reply, self.pin_two(ino, newparent));
        let path = dir.join(newname);
        match self.overlay.link(&ctx(req, 0), &src, &dir, newname) {
            Ok(found) => {
                // The new name is another name of the source's node.
                let id = if self.nodes().add_name(ino.0, newparent.0, newname) {
                    self.links()
                        .insert((found.meta.dev(), found.meta.ino()), ino.0);
                    ino.0
                } else {
                    self.entry(newparent, newname, &found).ino.0
                };
                reply.entry(
                    &self.ttl(found.layer),
                    &attr(id, &found.meta),
                    Generation(0),
                )
            }
            Err(e) => reply.error(reply_err("link", &path, &e)),
        }
    }

    fn open(&self, req: &Caller, ino: INodeNo, flags: OpenFlags, reply: impl rep::Open) {
        self.count(Req::Open, ino, None);
        let (path, _pins) = try_reply!(reply, self.pin(ino));
        match self.overlay.open_file(&ctx(req, 0), &path, flags.0) {
            Ok(file) => {
                let chosen = {
                    let g = file.current();
                    // A file held by block is read and written through the daemon.
                    let through = g.is_deferred() || g.is_held_by_block();
                    self.io_mode(ino.0, g.file(), through, writable(flags.0))
                };
                let (mode, flush) = match chosen {
                    Ok(chosen) => chosen,
                    Err(e) => {
                        self.overlay.close_file(&file);
                        let e = FsError::from(e);
                        reply.error(reply_err("open", &path, &e));
                        return;
                    }
                };
                let fh = self.add_handle(Handle::file(ino.0, file, mode));
                match mode {
                    // `id` is registered with this session and stays so while a handle
                    // uses it (closed in `released` after the last one).
                    IoMode::Passthrough(id) => {
                        reply.opened_passthrough_raw(fh, fopen_flags(mode, flush), id)
                    }
                    _ => reply.opened(fh, fopen_flags(mode, flush)),
                }
            }
            Err(e) => reply.error(reply_err("open", &path, &e)),
        }
    }

    fn read(
        &self,
        req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: impl rep::Data,
    ) {
        self.count(Req::Read, ino, None);
        let h = try_reply!(reply, self.file_of(fh));
        let g = try_reply!(reply, self.readable(req, &h));
        let mut buf = vec![0u8; size as usize];
        match self.overlay.read_at(&g, &mut buf, offset) {
            Ok(got) => {
                self.overlay.requests.read(got);
                reply.data(&buf[..got]);
            }
            Err(e) => reply.error(Errno::from(e)),
        }
    }

    fn write(
        &self,
        req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: impl rep::Write,
    ) {
        self.count(Req::Write, ino, None);
        let h = try_reply!(reply, self.file_of(fh));
        let g = try_reply!(reply, self.writable(req, &h));
        match self.overlay.write_at(&g, data, offset) {
            Ok(()) => {
                self.overlay.requests.wrote(data.len());
                reply.written(data.len() as u32)
            }
            Err(e) => reply.error(Errno::from(e)),
        }
    }

    /// A close of a handle of a share's file opened for writing (the others are opened
    /// with FOPEN_NOFLUSH): the share's client is told of it as a close of its own file
    /// would, and its answer is the close's (an NFS client writes out what it holds at
    /// a close; a client that writes behind answers with a write that failed).
    fn flush(
        &self,
        _req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: impl rep::Empty,
    ) {
        self.count(Req::Flush, ino, None);
        let h = try_reply!(reply, self.file_of(fh));
        let r = match &*h {
            Handle::File { file, .. } => self.overlay.flush_file(&file.current()),
            Handle::Dir { .. } => Ok(()),
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => {
                let path = self.path(ino).unwrap_or_default();
                reply.error(reply_err("flush", &path, &FsError::from(e)))
            }
        }
    }

    fn release(
        &self,
        _req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: impl rep::Empty,
    ) {
        self.count(Req::Release, ino, None);
        let removed = self.handles().remove(&fh.0);
        if let Some(h) = removed {
            self.let_go(&h);
        }
        reply.ok();
    }

    /// The session ended (the mount is gone, and with it every open file): a handle still
    /// in the table lost its RELEASE (the kernel ends the requests it has not handed over
    /// when it tears the connection down at unmount). Each is let go as a RELEASE would,
    /// so the logout sync that follows sees no writer the session no longer has (a file
    /// counted as written still was never marked synced: "not everything reached the
    /// share") and the kernel's backing files are given back.
    pub fn end(&self) {
        // The ring's threads first: none may still be serving a handle let go below.
        self.ring.finish();
        let left: Vec<Arc<Handle>> = self.handles().drain().map(|(_, h)| h).collect();
        if !left.is_empty() {
            tracing::debug!(
                handles = left.len(),
                "letting go of handles whose RELEASE never came"
            );
        }
        for h in &left {
            self.let_go(h);
        }
    }

    fn fsync(
        &self,
        _req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: impl rep::Empty,
    ) {
        self.count(Req::Fsync, ino, None);
        let h = try_reply!(reply, self.file_of(fh));
        let g = match &*h {
            Handle::File { file, .. } => file.current(),
            Handle::Dir { .. } => {
                reply.error(Errno::EISDIR);
                return;
            }
        };
        if g.is_deferred() {
            // Nothing was written through this handle: nothing to sync.
            reply.ok();
            return;
        }
        match self.overlay.sync_file(&g, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => {
                let path = self.path(ino).unwrap_or_default();
                reply.error(reply_err("fsync", &path, &e))
            }
        }
    }

    fn opendir(&self, _req: &Caller, ino: INodeNo, _flags: OpenFlags, reply: impl rep::Open) {
        self.count(Req::Opendir, ino, None);
        let (path, sig) = try_reply!(reply, self.at_path(ino, |p| self.overlay.dir_signature(p)));
        // The kernel keeps the listing it reads through this handle (FOPEN_CACHE_DIR),
        // and keeps the one it has when the directory is as it was when that was listed.
        let mut flags = FopenFlags::FOPEN_CACHE_DIR;
        let (listing, sig) = match sig {
            Ok(sig) if sig.is_none() => {
                let e = FsError::enoent();
                reply.error(reply_err("opendir", &path, &e));
                return;
            }
            Ok(sig) => {
                if self
                    .listed()
                    .get(&ino.0)
                    .is_some_and(|l| l.still(&sig, self.ttl.share))
                {
                    flags |= FopenFlags::FOPEN_KEEP_CACHE;
                }
                (None, Some(sig))
            }
            // Not told (the share does not answer): listed now, as the share allows
            // (a cached directory lists what the cache holds), and never kept.
            // (A directory moved meanwhile: listed at the first read.)
            Err(_) => {
                let (path, seen) = try_reply!(reply, self.path_seen(ino));
                (try_reply!(reply, self.list(ino, &path, seen)), None)
            }
        };
        let fh = self.add_handle(Handle::Dir {
            listing: Mutex::new(listing),
            sig,
        });
        reply.opened(fh, flags);
    }

    fn readdir(
        &self,
        _req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: impl rep::Directory,
    ) {
        self.count(Req::Readdir, ino, None);
        let h = try_reply!(reply, self.handle(fh));
        let g = try_reply!(reply, self.listing(ino, &h, offset));
        let entries = g.as_deref().unwrap_or_default();
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    /// A listing with each entry's attributes, as a lookup of each would give them (and
    /// counted as one: the kernel takes every entry of the reply as looked up). An entry
    /// gone since the listing was made is left out. Counted with the listings.
    fn readdirplus(
        &self,
        _req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: impl rep::DirectoryPlus,
    ) {
        self.count(Req::Readdir, ino, None);
        let h = try_reply!(reply, self.handle(fh));
        let adapts = self.ttl.readdirplus == crate::config::Readdirplus::Adapt;
        if adapts && offset > 0 {
            self.habit.locked().read_on_with_attributes(ino.0);
        }
        // The habit decides once a read, not again at each look after a move.
        let mut first: Option<Option<habit::FirstReply>> = None;
        for _ in 0..MOVED_TRIES {
            let (dir, seen) = try_reply!(reply, self.path_seen(ino));
            let g = try_reply!(reply, self.listing(ino, &h, offset));
            let entries = g.as_deref().unwrap_or_default();
            // The first read: the entries with their attributes, or `.` and `..` alone
            // (the kernel then reads on without attributes; see `habit`).
            let first = *first.get_or_insert_with(|| {
                (offset == 0 && adapts).then(|| {
                    let n = entries.len().saturating_sub(2);
                    self.habit.locked().first_reply(ino.0, n)
                })
            });
            let upto = match first {
                Some(habit::FirstReply::First(n)) => 2 + n,
                Some(habit::FirstReply::All) | None => usize::MAX,
            };
            let part = entries.iter().enumerate().skip(offset as usize).take(upto);
            match self.plus_entries(ino, &dir, seen, part, &mut reply) {
                // A directory moved before anything was added: all again, from its path.
                Ok(Plus::Moved) => continue,
                Ok(Plus::Added) => reply.ok(),
                Err(e) => reply.error(e),
            }
            return;
        }
        reply.error(Errno::EAGAIN);
    }

    fn releasedir(
        &self,
        _req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: impl rep::Empty,
    ) {
        self.count(Req::Releasedir, ino, None);
        self.handles().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Caller,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: impl rep::Empty,
    ) {
        self.count(Req::Fsyncdir, ino, None);
        reply.ok();
    }

    fn statfs(&self, _req: &Caller, ino: INodeNo, reply: impl rep::Statfs) {
        self.count(Req::Statfs, ino, None);
        match self.overlay.statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_avail,
                s.files,
                s.files_free,
                s.block_size as u32,
                s.name_max as u32,
                s.fragment_size as u32,
            ),
            Err(e) => reply.error(reply_err("statfs", Path::new(""), &e)),
        }
    }

    fn setxattr(
        &self,
        req: &Caller,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: impl rep::Empty,
    ) {
        self.count(Req::Setxattr, ino, None);
        let (path, _pins) = try_reply!(reply, self.pin(ino));
        match self
            .overlay
            .setxattr(&ctx(req, 0), &path, name, value, flags)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(reply_err("setxattr", &path, &e)),
        }
    }

    fn getxattr(
        &self,
        _req: &Caller,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: impl rep::Xattr,
    ) {
        self.count(Req::Getxattr, ino, None);
        let (path, value) =
            try_reply!(reply, self.at_path(ino, |p| self.overlay.getxattr(p, name)));
        let value = value.map_err(|e| reply_err("getxattr", &path, &e));
        match value {
            Ok(v) => reply_xattr(reply, size, &v),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Caller, ino: INodeNo, size: u32, reply: impl rep::Xattr) {
        self.count(Req::Listxattr, ino, None);
        let (path, names) = try_reply!(reply, self.at_path(ino, |p| self.overlay.listxattr(p)));
        match names {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(n.as_bytes());
                    buf.push(0);
                }
                reply_xattr(reply, size, &buf);
            }
            Err(e) => reply.error(reply_err("listxattr", &path, &e)),
        }
    }

    fn removexattr(&self, req: &Caller, ino: INodeNo, name: &OsStr, reply: impl rep::Empty) {
        self.count(Req::Removexattr, ino, None);
        let (path, _pins) = try_reply!(reply, self.pin(ino));
        match self.overlay.removexattr(&ctx(req, 0), &path, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(reply_err("removexattr", &path, &e)),
        }
    }

    fn access(&self, _req: &Caller, ino: INodeNo, _mask: AccessFlags, reply: impl rep::Empty) {
        self.count(Req::Access, ino, None);
        // Permission bits are checked by the kernel (default_permissions); this only
        // answers whether the object still exists.
        let (path, found) = try_reply!(reply, self.at_path(ino, |p| self.overlay.resolve(p)));
        match found {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(reply_err("access", &path, &e)),
        }
    }

    fn create(
        &self,
        req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: impl rep::Create,
    ) {
        self.count(Req::Create, parent, Some(name));
        let (dir, _pins) = try_reply!(reply, self.pin(parent));
        let path = dir.join(name);
        match self
            .overlay
            .create(&ctx(req, umask), &dir, name, mode, flags)
        {
            Ok((found, file, writer)) => {
                let a = self.entry(parent, name, &found);
                let opened = match self.overlay.created_file(&path, file, writer) {
                    Ok(f) => f,
                    Err(e) => {
                        reply.error(reply_err("create", &path, &e));
                        return;
                    }
                };
                // An existing dotfile still on the share, opened by a create without
                // O_EXCL: its copy-up is still to come, which the daemon must see; a file
                // held by block is read and written through the daemon.
                let chosen = {
                    let g = opened.current();
                    let through = found.layer == Layer::Lower || g.is_held_by_block();
                    self.io_mode(a.ino.0, g.file(), through, writable(flags))
                };
                let (mode, flush) = match chosen {
                    Ok(chosen) => chosen,
                    Err(e) => {
                        self.overlay.close_file(&opened);
                        let e = FsError::from(e);
                        reply.error(reply_err("create", &path, &e));
                        return;
                    }
                };
                let fh = self.add_handle(Handle::file(a.ino.0, opened, mode));
                let ttl = self.ttl(found.layer);
                match mode {
                    IoMode::Passthrough(id) => reply.created_passthrough_raw(
                        &ttl,
                        &a,
                        Generation(0),
                        fh,
                        fopen_flags(mode, flush),
                        id,
                    ),
                    _ => reply.created(&ttl, &a, Generation(0), fh, fopen_flags(mode, flush)),
                }
            }
            Err(e) => reply.error(reply_err("create", &path, &e)),
        }
    }

    fn fallocate(
        &self,
        req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: impl rep::Empty,
    ) {
        self.count(Req::Fallocate, ino, None);
        let h = try_reply!(reply, self.file_of(fh));
        // Pinned before the handle's file is taken (see `CcfsFs::settle`).
        let (path, _pins) = try_reply!(reply, self.pin(ino));
        let g = try_reply!(reply, self.writable_at(req, &h, Some(&path)));
        // A file held by block is made whole first: a hole punched or a range zeroed
        // changes blocks its cache file may lack.
        if g.is_held_by_block() {
            if let Err(e) = self.overlay.make_whole(&path) {
                reply.error(reply_err("fallocate", &path, &e));
                return;
            }
        }
        let file = g.file();
        match crate::sys::fallocate(file, mode, offset, length) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(Errno::from(e)),
        }
    }
}
