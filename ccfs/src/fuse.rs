//! The FUSE adapter: the only module that knows fuser's request and reply types.
//!
//! Each handler turns node ids into paths ([`crate::nodes`]), calls the [`Overlay`], and
//! turns the result into a reply; every error goes through [`reply_err`]. A node keeps its
//! id (the inode number programs see) across copy-up and rename for the life of the mount.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLockReadGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::backing::{IoMode, OpenKind, Passthrough};
use crate::counters::Req;
use crate::error::FsError;
use crate::locks::Locked;
use crate::overlay::{Ctx, DirSignature, FileIo, Layer, OpenFile, Overlay, SetAttr};
use crate::sys::{self, SetTime, Stat};

use crate::nodes::Nodes;

#[derive(Debug)]
enum Handle {
    File {
        file: OpenFile,
        node: u64,
        /// How the kernel does this handle's I/O (see [`crate::backing`]).
        mode: IoMode,
    },
    Dir {
        /// Listed at the first READDIR (and again at a rewind), not at OPENDIR: when the
        /// kernel keeps the directory's listing, it asks for none.
        listing: Mutex<Option<Vec<DirListEntry>>>,
        /// What the directory was at OPENDIR; None when that could not be told.
        sig: Option<DirSignature>,
    },
}

type DirListEntry = (u64, FileType, std::ffi::OsString);

impl Handle {
    fn file(node: u64, file: OpenFile, mode: IoMode) -> Self {
        Handle::File { file, node, mode }
    }
}

/// How long the kernel may keep what ccfs answered, by where the answer came from.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Names, attributes and missing names on the share (another workstation of the same
    /// user may change them).
    pub share: Duration,
    /// Names and attributes of what the cache holds (only this mount changes it).
    pub cache: Duration,
    /// Listings carry each entry's attributes (READDIRPLUS).
    pub readdirplus: bool,
}

/// The open flags that tell the kernel how to do a handle's I/O.
fn fopen_flags(mode: IoMode) -> FopenFlags {
    // ccfs has nothing to do at close (FLUSH): the kernel need not ask.
    let mut f = FopenFlags::FOPEN_NOFLUSH;
    match mode {
        IoMode::Passthrough(_) => {}
        IoMode::Cached { keep_cache: true } => f |= FopenFlags::FOPEN_KEEP_CACHE,
        IoMode::Cached { keep_cache: false } => {}
    }
    f
}

/// The kernel's names and inodes as this mount gave them, for telling the kernel to drop
/// what it keeps of a name: a sync that keeps the share's version at a conflict shows
/// another file at the name, whose size the kernel would otherwise keep for its timeout
/// (and clip reads to it).
#[derive(Debug)]
pub struct KernelView {
    nodes: Arc<Mutex<Nodes>>,
    notifier: fuser::Notifier,
}

impl KernelView {
    pub fn new(nodes: Arc<Mutex<Nodes>>, notifier: fuser::Notifier) -> Self {
        Self { nodes, notifier }
    }

    /// Drops the kernel's entry, attributes and pages of each path (below the mount root)
    /// and of its directory's listing; paths the kernel never saw are skipped.
    pub fn forget_paths(&self, paths: &[PathBuf]) {
        for rel in paths {
            let found = {
                let nodes = self.nodes.locked();
                nodes.walk(rel)
            };
            let Some((parent, name, node)) = found else {
                continue;
            };
            let mut sent = vec![self.notifier.inval_entry(INodeNo(parent), &name)];
            if let Some(node) = node {
                sent.push(self.notifier.inval_inode(INodeNo(node), 0, 0));
            }
            sent.push(self.notifier.inval_inode(INodeNo(parent), 0, 0));
            for e in sent.into_iter().filter_map(Result::err) {
                tracing::debug!(
                    path = %crate::journal::escape(rel),
                    "the kernel refused an invalidation: {e}"
                );
            }
        }
    }
}

/// The ccfs filesystem as fuser sees it.
#[derive(Debug)]
pub struct CcfsFs {
    overlay: Arc<Overlay>,
    nodes: Arc<Mutex<Nodes>>,
    /// The node of a file with several links, by its backing object (see [`CcfsFs::entry`]).
    links: Mutex<HashMap<(u64, u64), u64>>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    ttl: Timeouts,
    /// Kernel passthrough of open files, and every node's open files.
    io: Arc<Passthrough>,
    /// Each directory's last listing: an OPENDIR that finds the directory unchanged lets
    /// the kernel keep that listing (FOPEN_KEEP_CACHE).
    listed: Mutex<HashMap<u64, Listed>>,
}

/// A directory's signature when it was last listed, and when that was.
#[derive(Debug, Clone, Copy)]
struct Listed {
    sig: DirSignature,
    at: std::time::Instant,
    /// Whether an unchanged signature means an unchanged listing for good: only for a
    /// directory the cache alone holds (this mount alone changes it). A share's times may
    /// show two changes as one (a share that keeps them to the second, two changes in one
    /// clock tick, times set back by `tar`, `cp -a` or a server clock behind ours), so a
    /// listing of a share directory is kept no longer than the share's names are
    /// ([`Timeouts::share`]).
    lasting: bool,
}

impl Listed {
    fn new(sig: DirSignature) -> Self {
        Self {
            sig,
            at: std::time::Instant::now(),
            lasting: sig.share_mtime().is_none(),
        }
    }

    /// Whether the kernel may keep this listing of a directory whose signature is `now`.
    fn still(&self, now: &DirSignature, ttl: Duration) -> bool {
        self.sig == *now && (self.lasting || self.at.elapsed() < ttl)
    }
}

fn reply_err(op: &'static str, path: &Path, e: &FsError) -> Errno {
    let n = e.errno();
    let path = crate::journal::escape(path);
    if matches!(
        n,
        libc::ENOENT
            | libc::EEXIST
            | libc::ENOTEMPTY
            | libc::ENODATA
            | libc::EXDEV
            | libc::ENAMETOOLONG
    ) {
        tracing::trace!(op, path, "{e}");
    } else {
        tracing::warn!(op, path, errno = n, "{e}");
    }
    Errno::from_i32(n)
}

/// An xattr value or list: its size when asked with size 0, ERANGE when it does not fit.
fn reply_xattr(reply: ReplyXattr, size: u32, data: &[u8]) {
    if size == 0 {
        reply.size(data.len() as u32);
    } else if data.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(data);
    }
}

fn file_type(kind: u32) -> FileType {
    match kind {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nsecs as u64)
    }
}

fn attr(ino: u64, m: &Stat) -> FileAttr {
    let t = |(s, n): (i64, i64)| time(s, n);
    FileAttr {
        ino: INodeNo(ino),
        size: m.len(),
        blocks: m.blocks(),
        atime: t(m.atime()),
        mtime: t(m.mtime()),
        ctime: t(m.ctime()),
        crtime: t(m.ctime()),
        kind: file_type(m.file_type()),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: m.blksize() as u32,
        flags: 0,
    }
}

/// The attributes of a negative entry (node 0): the kernel reads none of them.
fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(st) => match st.duration_since(UNIX_EPOCH) {
            Ok(d) => SetTime::At {
                secs: d.as_secs() as i64,
                nsecs: i64::from(d.subsec_nanos()),
            },
            Err(e) => {
                let d = e.duration();
                let mut secs = -(d.as_secs() as i64);
                let mut nsecs = i64::from(d.subsec_nanos());
                if nsecs > 0 {
                    secs -= 1;
                    nsecs = 1_000_000_000 - nsecs;
                }
                SetTime::At { secs, nsecs }
            }
        },
    }
}

fn ctx(req: &Request, umask: u32) -> Ctx {
    Ctx {
        uid: req.uid(),
        gid: req.gid(),
        umask,
    }
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

impl CcfsFs {
    pub fn new(overlay: Arc<Overlay>, ttl: Timeouts, io: Arc<Passthrough>) -> Self {
        Self {
            overlay,
            nodes: Arc::new(Mutex::new(Nodes::new())),
            links: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            ttl,
            io,
            listed: Mutex::new(HashMap::new()),
        }
    }

    /// The node table, for a [`KernelView`] made once the session exists.
    pub fn node_table(&self) -> Arc<Mutex<Nodes>> {
        self.nodes.clone()
    }

    fn listed(&self) -> MutexGuard<'_, HashMap<u64, Listed>> {
        self.listed.locked()
    }

    /// The merged listing of directory `ino` at `path`, with `.` and `..`, each entry
    /// with its node (made for names not seen before, uncounted).
    fn list(&self, ino: INodeNo, path: &Path) -> Result<Vec<DirListEntry>, Errno> {
        let listing = self
            .overlay
            .readdir(path)
            .map_err(|e| reply_err("readdir", path, &e))?;
        let mut entries = Vec::with_capacity(listing.len() + 2);
        entries.push((ino.0, FileType::Directory, ".".into()));
        entries.push((ino.0, FileType::Directory, "..".into()));
        let mut nodes = self.nodes();
        for e in listing {
            let id = nodes.child(ino.0, &e.name, e.file_type, false);
            entries.push((id, file_type(e.file_type), e.name));
        }
        Ok(entries)
    }

    /// The listing a directory handle serves from `offset`: made at the first read or
    /// a rewind (the directory as it is now), then kept for the handle's later reads.
    fn listing<'h>(
        &self,
        ino: INodeNo,
        h: &'h Handle,
        offset: u64,
    ) -> Result<MutexGuard<'h, Option<Vec<DirListEntry>>>, Errno> {
        let Handle::Dir { listing, sig } = h else {
            return Err(Errno::ENOTDIR);
        };
        let mut g = listing.locked();
        if g.is_none() || offset == 0 {
            let path = self.path(ino)?;
            *g = Some(self.list(ino, &path)?);
            match sig {
                Some(sig) => self.listed().insert(ino.0, Listed::new(*sig)),
                None => self.listed().remove(&ino.0),
            };
        }
        Ok(g)
    }

    /// How long the kernel may keep an answer that came from `layer`.
    fn ttl(&self, layer: Layer) -> Duration {
        match layer {
            Layer::Upper => self.ttl.cache,
            Layer::Lower | Layer::Share => self.ttl.share,
        }
    }

    /// The I/O mode of a new handle on `node`, counted as open (see [`crate::backing`]).
    fn io_mode(&self, node: u64, file: &File, deferred: bool) -> std::io::Result<IoMode> {
        let meta = crate::sys::fstat(file)?;
        let kind = OpenKind {
            through_daemon: deferred,
            keep_for: self.ttl.share,
        };
        self.io.choose(node, file, &meta, kind)
    }

    fn nodes(&self) -> MutexGuard<'_, Nodes> {
        self.nodes.locked()
    }

    fn handles(&self) -> MutexGuard<'_, HashMap<u64, Arc<Handle>>> {
        self.handles.locked()
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.nodes().path(ino.0).ok_or(Errno::ESTALE)
    }

    /// Counts a request on node `ino` (and `name` in it, for a request on a name).
    fn count(&self, r: Req, ino: INodeNo, name: Option<&OsStr>) {
        let requests = &self.overlay.requests;
        if !requests.by_path_wanted() {
            requests.count(r);
            return;
        }
        match (self.nodes().path(ino.0), name) {
            (Some(p), Some(n)) => requests.count_at(r, &p.join(n)),
            (Some(p), None) => requests.count_at(r, &p),
            // A node no longer named (a file removed while open): counted all the same.
            (None, _) => requests.count_at(r, Path::new(crate::counters::UNNAMED)),
        }
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.path(parent)?.join(name))
    }

    fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        self.handles().get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn add_handle(&self, h: Handle) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles().insert(fh, Arc::new(h));
        FileHandle(fh)
    }

    /// An entry reply for `name` in `parent`: counts the lookup on its node. A file with
    /// several links joins the node of another of its names, when one is known and a name
    /// of that node still holds the same object (a freed and reused backing inode number
    /// never joins two files). A name of a node with several names that no longer holds
    /// that node's object (another workstation replaced or renamed one of the links) gets
    /// a node of its own: requests on a node go to the object behind its first name. Names
    /// of a cached file still on the share are not joined: a change through one name is
    /// copied up to that name alone, so each name shows what the share will hold after
    /// sync.
    fn entry(&self, parent: INodeNo, name: &OsStr, found: &crate::overlay::Found) -> FileAttr {
        let m = &found.meta;
        let key = (m.dev(), m.ino());
        let joined = self.nodes().named(parent.0, name);
        if let Some(id) = joined.filter(|&id| self.nodes().name_count(id) > 1) {
            if !self.holds(id, key) {
                self.nodes().detach(parent.0, name);
            }
        }
        if !m.is_dir() && m.nlink() > 1 && found.layer != Layer::Lower {
            let known = self.links().get(&key).copied();
            if let Some(id) = known {
                if self.holds(id, key) && self.nodes().add_name(id, parent.0, name) {
                    return attr(id, m);
                }
            }
            let id = self.nodes().child(parent.0, name, m.file_type(), true);
            self.links().insert(key, id);
            return attr(id, m);
        }
        let id = self.nodes().child(parent.0, name, m.file_type(), true);
        attr(id, m)
    }

    /// Whether the object behind the first name of node `id` is `key` (device, inode).
    fn holds(&self, id: u64, key: (u64, u64)) -> bool {
        let witness = self.nodes().path(id);
        witness.is_some_and(|w| {
            self.overlay
                .resolve(&w)
                .is_ok_and(|f| (f.meta.dev(), f.meta.ino()) == key)
        })
    }

    fn links(&self) -> MutexGuard<'_, HashMap<(u64, u64), u64>> {
        self.links.locked()
    }

    /// unlink (`dir` false) or rmdir (`dir` true). The name's node is detached first, so
    /// that nothing made meanwhile at that name can get it, and put back if the change fails.
    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool, reply: ReplyEmpty) {
        let parent_path = try_reply!(reply, self.path(parent));
        let path = parent_path.join(name);
        let detached = self.nodes().detach(parent.0, name);
        let result = if dir {
            self.overlay.rmdir(&parent_path, name)
        } else {
            self.overlay.unlink(&parent_path, name)
        };
        match result {
            Ok(()) => reply.ok(),
            Err(e) => {
                if let Some(id) = detached {
                    self.nodes().reattach(parent.0, name, id);
                }
                reply.error(reply_err(if dir { "rmdir" } else { "unlink" }, &path, &e))
            }
        }
    }

    /// The attributes of `node` from one of its open handles. The handle table is not
    /// held while a handle's descriptor is looked at: a handle being copied up holds its
    /// `io` for the whole copy, and every request needs the table.
    fn open_node_stat(&self, node: u64) -> Option<Stat> {
        let open: Vec<Arc<Handle>> = self
            .handles()
            .values()
            .filter(|h| matches!(&***h, Handle::File { node: n, .. } if *n == node))
            .cloned()
            .collect();
        open.iter().find_map(|h| match &**h {
            Handle::File { file, .. } => crate::sys::fstat(file.current().file()).ok(),
            _ => None,
        })
    }

    fn file_of(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        let h = self.handle(fh)?;
        match &*h {
            Handle::File { .. } => Ok(h),
            Handle::Dir { .. } => Err(Errno::EISDIR),
        }
    }

    /// The file of a handle, ready for writing: a deferred handle is made writable now
    /// (see [`Overlay::file_to_write`]).
    fn writable<'a>(
        &self,
        req: &Request,
        h: &'a Handle,
    ) -> Result<RwLockReadGuard<'a, FileIo>, Errno> {
        let Handle::File { file, node, .. } = h else {
            return Err(Errno::EISDIR);
        };
        self.overlay
            .file_to_write(&ctx(req, 0), file, || self.path(INodeNo(*node)).ok())
            .map_err(|f| reply_err(f.op, &f.path, &f.error))
    }

    /// The file of a handle for reading (see [`Overlay::file_to_read`]).
    fn readable<'a>(
        &self,
        req: &Request,
        h: &'a Handle,
    ) -> Result<RwLockReadGuard<'a, FileIo>, Errno> {
        let Handle::File { file, node, .. } = h else {
            return Err(Errno::EISDIR);
        };
        self.overlay
            .file_to_read(&ctx(req, 0), file, || self.path(INodeNo(*node)).ok())
            .map_err(|f| reply_err(f.op, &f.path, &f.error))
    }
}

impl CcfsFs {
    /// What closing `h` undoes: its share of the cache file's writers, its I/O mode (the
    /// last passthrough handle of a node gives the backing file back to the kernel).
    fn let_go(&self, h: &Handle) {
        if let Handle::File { file, node, mode } = h {
            self.overlay.close_file(file);
            self.io.released(*node, *mode);
        }
    }
}

impl Filesystem for CcfsFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        use fuser::InitFlags as F;
        // Lookups and listings of one directory may run at once; symlink targets are
        // kept by the kernel (a target never changes in place). Not FUSE_ATOMIC_O_TRUNC:
        // with it the daemon truncates at OPEN, before the kernel checks that the file is
        // not a running program (ETXTBSY), which then comes too late.
        let mut wanted = F::FUSE_PARALLEL_DIROPS | F::FUSE_CACHE_SYMLINKS;
        if self.ttl.readdirplus {
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

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.count(Req::Lookup, parent, Some(name));
        let path = try_reply!(reply, self.child(parent, name));
        match self.overlay.resolve(&path) {
            Ok(found) => reply.entry(
                &self.ttl(found.layer),
                &self.entry(parent, name, &found),
                Generation(0),
            ),
            // A name that is nowhere: the kernel may remember that as long as what the
            // share holds (node 0: a negative entry). Names made through this mount
            // replace it at once.
            Err(e) if e.errno() == libc::ENOENT && !self.ttl.share.is_zero() => {
                let none = negative_attr();
                reply.entry_with_ttls(&Duration::ZERO, &self.ttl.share, &none, Generation(0))
            }
            Err(e) => reply.error(reply_err("lookup", &path, &e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.nodes().forget(ino.0, nlookup);
        // The kernel dropped the inode, and its pages and listing with it.
        self.io.forget(ino.0);
        self.listed().remove(&ino.0);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.count(Req::Getattr, ino, None);
        if let Some(fh) = fh {
            if let Ok(h) = self.handle(fh) {
                if let Handle::File { file, .. } = &*h {
                    if let Ok(m) = crate::sys::fstat(file.current().file()) {
                        reply.attr(&self.ttl.share, &attr(ino.0, &m));
                        return;
                    }
                }
            }
        }
        // fstat of a file unlinked while open comes without a handle: use any handle
        // still open on the node.
        let fallback = |e: Errno, reply: ReplyAttr| match self.open_node_stat(ino.0) {
            Some(m) => reply.attr(&self.ttl.share, &attr(ino.0, &m)),
            None => reply.error(e),
        };
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return fallback(e, reply),
        };
        match self.overlay.resolve(&path) {
            Ok(found) => reply.attr(&self.ttl(found.layer), &attr(ino.0, &found.meta)),
            Err(e) => fallback(reply_err("getattr", &path, &e), reply),
        }
    }

    fn setattr(
        &self,
        req: &Request,
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
        reply: ReplyAttr,
    ) {
        self.count(Req::Setattr, ino, None);
        let path = try_reply!(reply, self.path(ino));
        let handle = fh.and_then(|fh| self.handle(fh).ok());
        let guard = match handle.as_deref() {
            Some(h @ Handle::File { .. }) => Some(try_reply!(reply, self.writable(req, h))),
            _ => None,
        };
        let file = guard.as_ref().map(|g| g.file());
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
        };
        match self.overlay.setattr(&ctx(req, 0), &path, change, file) {
            Ok(meta) => reply.attr(&self.ttl.share, &attr(ino.0, &meta)),
            Err(e) => reply.error(reply_err("setattr", &path, &e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.count(Req::Readlink, ino, None);
        let path = try_reply!(reply, self.path(ino));
        match self.overlay.readlink(&path) {
            Ok(target) => reply.data(target.as_os_str().as_bytes()),
            Err(e) => reply.error(reply_err("readlink", &path, &e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.count(Req::Mknod, parent, Some(name));
        let dir = try_reply!(reply, self.path(parent));
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
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.count(Req::Mkdir, parent, Some(name));
        let dir = try_reply!(reply, self.path(parent));
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

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.count(Req::Unlink, parent, Some(name));
        self.remove(parent, name, false, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.count(Req::Rmdir, parent, Some(name));
        self.remove(parent, name, true, reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.count(Req::Symlink, parent, Some(link_name));
        let dir = try_reply!(reply, self.path(parent));
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
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.count(Req::Rename, parent, Some(name));
        let from_dir = try_reply!(reply, self.path(parent));
        let to_dir = try_reply!(reply, self.path(newparent));
        let from = from_dir.join(name);
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
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.count(Req::Link, newparent, Some(newname));
        let src = try_reply!(reply, self.path(ino));
        let dir = try_reply!(reply, self.path(newparent));
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

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.count(Req::Open, ino, None);
        let path = try_reply!(reply, self.path(ino));
        match self.overlay.open_file(&ctx(req, 0), &path, flags.0) {
            Ok(file) => {
                let mode = match self.io_mode(ino.0, file.current().file(), file.is_deferred()) {
                    Ok(mode) => mode,
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
                        sys::reply_opened_passthrough(reply, fh, fopen_flags(mode), id)
                    }
                    _ => reply.opened(fh, fopen_flags(mode)),
                }
            }
            Err(e) => reply.error(reply_err("open", &path, &e)),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.count(Req::Read, ino, None);
        let h = try_reply!(reply, self.file_of(fh));
        let g = try_reply!(reply, self.readable(req, &h));
        let file = g.file();
        let mut buf = vec![0u8; size as usize];
        let mut got = 0;
        while got < buf.len() {
            match file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    reply.error(Errno::from(e));
                    return;
                }
            }
        }
        self.overlay.requests.read(got);
        reply.data(&buf[..got]);
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.count(Req::Write, ino, None);
        let h = try_reply!(reply, self.file_of(fh));
        let g = try_reply!(reply, self.writable(req, &h));
        let file = g.file();
        match file.write_all_at(data, offset) {
            Ok(()) => {
                self.overlay.requests.wrote(data.len());
                reply.written(data.len() as u32)
            }
            Err(e) => reply.error(Errno::from(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.count(Req::Flush, ino, None);
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
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
    fn destroy(&mut self) {
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
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
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
        let file = g.file();
        let r = if datasync {
            file.sync_data()
        } else {
            file.sync_all()
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(Errno::from(e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.count(Req::Opendir, ino, None);
        let path = try_reply!(reply, self.path(ino));
        // The kernel keeps the listing it reads through this handle (FOPEN_CACHE_DIR),
        // and keeps the one it has when the directory is as it was when that was listed.
        let mut flags = FopenFlags::FOPEN_CACHE_DIR;
        let (listing, sig) = match self.overlay.dir_signature(&path) {
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
            Err(_) => (Some(try_reply!(reply, self.list(ino, &path))), None),
        };
        let fh = self.add_handle(Handle::Dir {
            listing: Mutex::new(listing),
            sig,
        });
        reply.opened(fh, flags);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
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
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.count(Req::Readdir, ino, None);
        let h = try_reply!(reply, self.handle(fh));
        let dir = try_reply!(reply, self.path(ino));
        let g = try_reply!(reply, self.listing(ino, &h, offset));
        let entries = g.as_deref().unwrap_or_default();
        // `.` and `..` are never looked up by the kernel: any attributes of a directory.
        let mut dots: Option<FileAttr> = None;
        for (i, (id, _, name)) in entries.iter().enumerate().skip(offset as usize) {
            let next = (i + 1) as u64;
            if name == "." || name == ".." {
                if dots.is_none() {
                    match self.overlay.resolve(&dir) {
                        Ok(found) => dots = Some(attr(ino.0, &found.meta)),
                        Err(e) => {
                            reply.error(reply_err("readdirplus", &dir, &e));
                            return;
                        }
                    }
                }
                let Some(a) = dots.as_ref() else { break };
                if reply.add(INodeNo(*id), next, name, &Duration::ZERO, a, Generation(0)) {
                    break;
                }
                continue;
            }
            let Ok(found) = self.overlay.resolve(&dir.join(name)) else {
                continue;
            };
            let a = self.entry(ino, name, &found);
            if reply.add(a.ino, next, name, &self.ttl(found.layer), &a, Generation(0)) {
                // Not sent: the kernel does not count it.
                self.nodes().forget(a.ino.0, 1);
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.count(Req::Releasedir, ino, None);
        self.handles().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.count(Req::Fsyncdir, ino, None);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
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
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.count(Req::Setxattr, ino, None);
        let path = try_reply!(reply, self.path(ino));
        match self
            .overlay
            .setxattr(&ctx(req, 0), &path, name, value, flags)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(reply_err("setxattr", &path, &e)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.count(Req::Getxattr, ino, None);
        let path = try_reply!(reply, self.path(ino));
        let value = self
            .overlay
            .getxattr(&path, name)
            .map_err(|e| reply_err("getxattr", &path, &e));
        match value {
            Ok(v) => reply_xattr(reply, size, &v),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.count(Req::Listxattr, ino, None);
        let path = try_reply!(reply, self.path(ino));
        match self.overlay.listxattr(&path) {
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

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.count(Req::Removexattr, ino, None);
        let path = try_reply!(reply, self.path(ino));
        match self.overlay.removexattr(&ctx(req, 0), &path, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(reply_err("removexattr", &path, &e)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        self.count(Req::Access, ino, None);
        // Permission bits are checked by the kernel (default_permissions); this only
        // answers whether the object still exists.
        let path = try_reply!(reply, self.path(ino));
        match self.overlay.resolve(&path) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(reply_err("access", &path, &e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.count(Req::Create, parent, Some(name));
        let dir = try_reply!(reply, self.path(parent));
        let path = dir.join(name);
        match self
            .overlay
            .create(&ctx(req, umask), &dir, name, mode, flags)
        {
            Ok((found, file, writer)) => {
                let a = self.entry(parent, name, &found);
                // An existing dotfile still on the share, opened by a create without
                // O_EXCL: its copy-up is still to come, which the daemon must see.
                let lower = found.layer == Layer::Lower;
                let mode = match self.io_mode(a.ino.0, &file, lower) {
                    Ok(mode) => mode,
                    Err(e) => {
                        self.overlay.close_file(&OpenFile::opened(file, writer));
                        let e = FsError::from(e);
                        reply.error(reply_err("create", &path, &e));
                        return;
                    }
                };
                let fh =
                    self.add_handle(Handle::file(a.ino.0, OpenFile::opened(file, writer), mode));
                let ttl = self.ttl(found.layer);
                match mode {
                    IoMode::Passthrough(id) => {
                        sys::reply_created_passthrough(reply, (&ttl, &a), fh, fopen_flags(mode), id)
                    }
                    _ => reply.created(&ttl, &a, Generation(0), fh, fopen_flags(mode)),
                }
            }
            Err(e) => reply.error(reply_err("create", &path, &e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.count(Req::Fallocate, ino, None);
        let h = try_reply!(reply, self.file_of(fh));
        let g = try_reply!(reply, self.writable(req, &h));
        let file = g.file();
        match crate::sys::fallocate(file, mode, offset, length) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(Errno::from(e)),
        }
    }
}
