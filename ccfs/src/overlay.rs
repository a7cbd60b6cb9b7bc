//! The filesystem logic: a merged view of the cache (upper) and the share (lower), by path.
//!
//! No FUSE types here. Every operation takes a path relative to the mount root and returns
//! plain values or an [`FsError`]; the FUSE adapter maps those to replies. Tests drive this
//! module directly over two temporary directories.
//!
//! Rules (see doc/SEMANTICS.md):
//! - passthrough paths go to the share directly;
//! - local-only paths live in the cache only;
//! - cached paths read from the cache if it has them, else from the share unless a
//!   whiteout hides them; the first change copies the one file up (temp + fsync + rename).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{DirEntryExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::error::{errno, FsError, FsResult};
use crate::journal::Journal;
use crate::policy::{PathClass, Policy};
use crate::state::{Origin, OverlayState, Record};
use crate::sys::{self, SetTime};

/// Who is asking: new files belong to this user when ccfs runs as root.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    pub uid: u32,
    pub gid: u32,
    pub umask: u32,
}

/// Where a path was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// In the cache.
    Upper,
    /// On the share, seen through a cached path (not copied up yet).
    Lower,
    /// On the share, a passthrough path.
    Share,
}

/// A stable identity for an object: the share's (dev, ino) for anything that came from the
/// share (kept across copy-up), else the cache's (dev, ino).
pub type Identity = (u64, u64);

#[derive(Debug, Clone)]
pub struct Found {
    pub layer: Layer,
    pub real: PathBuf,
    pub meta: Metadata,
    pub identity: Identity,
}

#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: OsString,
    pub file_type: fs::FileType,
    pub identity: Identity,
}

/// Attribute changes for [`Overlay::setattr`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

/// What a sync has to send, taken under the lock.
#[derive(Debug, Clone, Default)]
pub struct SyncSnapshot {
    /// Dirty paths that exist in the cache, sorted.
    pub files: Vec<PathBuf>,
    /// Paths to delete on the share, deepest first.
    pub deletions: Vec<PathBuf>,
    /// Paths marked dirty that the cache does not have (an operation failed after the
    /// mark): nothing to send, the mark is cleared with the others.
    pub stale: Vec<PathBuf>,
}

/// Mutable state behind the lock.
#[derive(Debug)]
pub struct Inner {
    state: OverlayState,
    journal: Journal,
    /// Paths changed since the last sync snapshot.
    touched: HashSet<PathBuf>,
    /// Open writable handles per cache inode.
    writers: HashMap<u64, usize>,
    /// Cache inodes whose writable handle was closed since the last sync snapshot.
    released: HashSet<u64>,
}

impl Inner {
    pub fn state(&self) -> &OverlayState {
        &self.state
    }
}

#[derive(Debug)]
pub struct Overlay {
    share: PathBuf,
    upper: PathBuf,
    work: PathBuf,
    share_dev: u64,
    policy: Policy,
    inner: Mutex<Inner>,
    tmp_seq: AtomicU64,
    as_root: bool,
    sync_running: AtomicBool,
}

fn lstat(p: &Path) -> io::Result<Option<Metadata>> {
    match fs::symlink_metadata(p) {
        Ok(m) => Ok(Some(m)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn is_not_supported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOTSUP) | Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::ENODATA)
    )
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn join(root: &Path, rel: &Path) -> PathBuf {
    if rel.as_os_str().is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    }
}

/// Open flags kept when opening the real file.
fn open_flags(flags: i32) -> i32 {
    let keep = libc::O_APPEND | libc::O_NONBLOCK | libc::O_DSYNC | libc::O_SYNC | libc::O_DIRECT;
    (flags & keep) | libc::O_NOFOLLOW | libc::O_CLOEXEC
}

fn wants_write(flags: i32) -> bool {
    let acc = flags & libc::O_ACCMODE;
    acc == libc::O_WRONLY || acc == libc::O_RDWR || flags & libc::O_TRUNC != 0
}

fn options_for(flags: i32) -> OpenOptions {
    let mut o = OpenOptions::new();
    match flags & libc::O_ACCMODE {
        libc::O_WRONLY => o.write(true),
        libc::O_RDWR => o.read(true).write(true),
        _ => o.read(true),
    };
    o.custom_flags(open_flags(flags));
    if flags & libc::O_TRUNC != 0 {
        o.truncate(true);
    }
    o
}

impl Overlay {
    /// Opens the overlay of `share` (canonical) with its cache in `cache_dir`
    /// (`upper/`, `work/` and `journal` are created inside).
    pub fn new(share: &Path, cache_dir: &Path, policy: Policy) -> io::Result<Self> {
        let upper = cache_dir.join("upper");
        let work = cache_dir.join("work");
        for d in [&upper, &work] {
            match fs::create_dir(d) {
                Ok(()) => fs::set_permissions(d, fs::Permissions::from_mode(0o700))?,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        // Leftover temp files of an interrupted copy-up are never referenced: drop them.
        for entry in fs::read_dir(&work)? {
            let entry = entry?;
            let p = entry.path();
            let _ = if entry.file_type()?.is_dir() {
                fs::remove_dir_all(&p)
            } else {
                fs::remove_file(&p)
            };
        }
        let (journal, state) = Journal::open(&cache_dir.join("journal"))?;
        let share_meta = fs::metadata(share)?;
        let share_dev = share_meta.dev();
        let overlay = Self {
            share: share.to_path_buf(),
            upper,
            work,
            share_dev,
            policy,
            inner: Mutex::new(Inner {
                state,
                journal,
                touched: HashSet::new(),
                writers: HashMap::new(),
                released: HashSet::new(),
            }),
            tmp_seq: AtomicU64::new(0),
            as_root: sys::geteuid() == 0,
            sync_running: AtomicBool::new(false),
        };
        // The cache's root stands for the share's root (rsync may copy its attributes);
        // the cache directory around it stays private.
        overlay.copy_meta(share, &share_meta, &overlay.upper)?;
        Ok(overlay)
    }

    pub fn share(&self) -> &Path {
        &self.share
    }

    pub fn upper(&self) -> &Path {
        &self.upper
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn upper_path(&self, rel: &Path) -> PathBuf {
        join(&self.upper, rel)
    }

    fn share_path(&self, rel: &Path) -> PathBuf {
        join(&self.share, rel)
    }

    fn tmp_path(&self) -> PathBuf {
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        self.work.join(format!("tmp-{}-{n}", std::process::id()))
    }

    fn record(&self, inner: &mut Inner, records: &[Record]) -> FsResult<()> {
        inner.journal.append(records).map_err(FsError::Journal)?;
        for r in records {
            inner.state.apply(r);
        }
        Ok(())
    }

    /// Marks a cached path changed: journaled if it was clean, and noted for the sync.
    fn mark_dirty(&self, inner: &mut Inner, rel: &Path) -> FsResult<()> {
        if !inner.state.is_dirty(rel) {
            self.record(inner, &[Record::Dirty(rel.to_path_buf())])?;
        }
        inner.touched.insert(rel.to_path_buf());
        Ok(())
    }

    fn found(&self, inner: &Inner, rel: &Path, layer: Layer, real: PathBuf, meta: Metadata) -> Found {
        let identity = match layer {
            Layer::Upper => inner
                .state
                .origin(rel)
                .map(|o| (o.dev, o.ino))
                .unwrap_or((meta.dev(), meta.ino())),
            Layer::Lower | Layer::Share => (meta.dev(), meta.ino()),
        };
        Found {
            layer,
            real,
            meta,
            identity,
        }
    }

    fn resolve_locked(&self, inner: &Inner, rel: &Path) -> FsResult<Found> {
        match self.policy.classify(rel) {
            PathClass::Passthrough => {
                let real = self.share_path(rel);
                let meta = lstat(&real)?.ok_or_else(FsError::enoent)?;
                Ok(self.found(inner, rel, Layer::Share, real, meta))
            }
            PathClass::LocalOnly => {
                let real = self.upper_path(rel);
                let meta = lstat(&real)?.ok_or_else(FsError::enoent)?;
                Ok(self.found(inner, rel, Layer::Upper, real, meta))
            }
            PathClass::Cached => {
                let up = self.upper_path(rel);
                if let Some(meta) = lstat(&up)? {
                    return Ok(self.found(inner, rel, Layer::Upper, up, meta));
                }
                if inner.state.hidden(rel) {
                    return Err(FsError::enoent());
                }
                let real = self.share_path(rel);
                let meta = lstat(&real)?.ok_or_else(FsError::enoent)?;
                Ok(self.found(inner, rel, Layer::Lower, real, meta))
            }
        }
    }

    /// Checks that `parent` is a directory in the merged view (a stale node may not be).
    fn check_parent(&self, inner: &Inner, parent: &Path) -> FsResult<()> {
        let found = self.resolve_locked(inner, parent)?;
        if found.meta.is_dir() {
            Ok(())
        } else {
            Err(errno(libc::ENOTDIR))
        }
    }

    /// Finds `rel` in the merged view.
    pub fn resolve(&self, rel: &Path) -> FsResult<Found> {
        let inner = self.lock();
        self.resolve_locked(&inner, rel)
    }

    /// The share's object under a cached path, if it is visible (not whited out).
    fn lower_meta(&self, inner: &Inner, rel: &Path) -> io::Result<Option<Metadata>> {
        match self.policy.classify(rel) {
            PathClass::LocalOnly => Ok(None),
            PathClass::Cached if inner.state.hidden(rel) => Ok(None),
            _ => lstat(&self.share_path(rel)),
        }
    }

    /// The merged listing of a directory (without `.` and `..`).
    pub fn readdir(&self, rel: &Path) -> FsResult<Vec<DirEntry>> {
        let inner = self.lock();
        let dir = self.resolve_locked(&inner, rel)?;
        if !dir.meta.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        let mut names: BTreeMap<OsString, DirEntry> = BTreeMap::new();
        let lower_dir = self
            .lower_meta(&inner, rel)?
            .filter(|m| m.is_dir())
            .map(|_| self.share_path(rel));
        if let Some(lower) = lower_dir {
            for entry in fs::read_dir(&lower)? {
                let entry = entry?;
                let name = entry.file_name();
                let child = rel.join(&name);
                match self.policy.classify(&child) {
                    PathClass::LocalOnly => continue,
                    PathClass::Cached if inner.state.hidden(&child) => continue,
                    _ => {}
                }
                names.insert(
                    name.clone(),
                    DirEntry {
                        name,
                        file_type: entry.file_type()?,
                        identity: (self.share_dev, entry.ino()),
                    },
                );
            }
        }
        let up = self.upper_path(rel);
        if lstat(&up)?.is_some_and(|m| m.is_dir()) {
            for entry in fs::read_dir(&up)? {
                let entry = entry?;
                let name = entry.file_name();
                let child = rel.join(&name);
                if self.policy.classify(&child) == PathClass::Passthrough {
                    continue; // the share is authoritative for passthrough names
                }
                let identity = inner
                    .state
                    .origin(&child)
                    .map(|o| (o.dev, o.ino))
                    .unwrap_or_else(|| (0, entry.ino()));
                let identity = if identity.0 == 0 {
                    (entry.metadata()?.dev(), identity.1)
                } else {
                    identity
                };
                names.insert(
                    name.clone(),
                    DirEntry {
                        name,
                        file_type: entry.file_type()?,
                        identity,
                    },
                );
            }
        }
        Ok(names.into_values().collect())
    }

    fn chown_new(&self, path: &Path, ctx: &Ctx) -> io::Result<()> {
        if self.as_root {
            std::os::unix::fs::lchown(path, Some(ctx.uid), Some(ctx.gid))?;
        }
        Ok(())
    }

    /// Copies ownership, mode, xattrs and times of `src` onto `dst`.
    fn copy_meta(&self, src: &Path, meta: &Metadata, dst: &Path) -> io::Result<()> {
        let symlink = meta.file_type().is_symlink();
        if self.as_root {
            std::os::unix::fs::lchown(dst, Some(meta.uid()), Some(meta.gid()))?;
        }
        if !symlink {
            sys::chmod(dst, meta.mode() & 0o7777)?;
        }
        match sys::llistxattr(src) {
            Ok(names) => {
                for name in names {
                    let copied = sys::lgetxattr(src, &name)
                        .and_then(|v| sys::lsetxattr(dst, &name, &v, 0));
                    if let Err(e) = copied {
                        if !is_not_supported(&e) {
                            return Err(e);
                        }
                        tracing::debug!(xattr = ?name, path = %src.display(), "xattr not copied: {e}");
                    }
                }
            }
            Err(e) if is_not_supported(&e) => {}
            Err(e) => return Err(e),
        }
        sys::utimens(
            dst,
            SetTime::At {
                secs: meta.atime(),
                nsecs: meta.atime_nsec(),
            },
            SetTime::At {
                secs: meta.mtime(),
                nsecs: meta.mtime_nsec(),
            },
        )
    }

    /// Makes sure the cache has directory `rel` (and its parents), copying each missing
    /// one's metadata from the share. Directories made here are not dirty: the share has them.
    fn ensure_upper_dir(&self, inner: &Inner, rel: &Path, ctx: &Ctx) -> FsResult<()> {
        let up = self.upper_path(rel);
        if lstat(&up)?.is_some_and(|m| m.is_dir()) {
            return Ok(());
        }
        if let Some(parent) = rel.parent() {
            self.ensure_upper_dir(inner, parent, ctx)?;
        }
        let tmp = self.tmp_path();
        fs::create_dir(&tmp)?;
        let lower = self.lower_meta(inner, rel)?.filter(|m| m.is_dir());
        let meta_result = match lower {
            Some(m) => self.copy_meta(&self.share_path(rel), &m, &tmp),
            None => sys::chmod(&tmp, 0o755 & !ctx.umask).and_then(|()| self.chown_new(&tmp, ctx)),
        };
        if let Err(e) = meta_result.and_then(|()| fs::rename(&tmp, &up)) {
            let _ = fs::remove_dir(&tmp);
            return Err(e.into());
        }
        Ok(())
    }

    /// Copies one cached path up from the share, if it is not in the cache yet.
    fn copy_up(&self, inner: &mut Inner, rel: &Path, with_data: bool, ctx: &Ctx) -> FsResult<()> {
        let up = self.upper_path(rel);
        if lstat(&up)?.is_some() {
            return Ok(());
        }
        let lower_path = self.share_path(rel);
        let meta = self.lower_meta(inner, rel)?.ok_or_else(FsError::enoent)?;
        if let Some(parent) = rel.parent() {
            self.ensure_upper_dir(inner, parent, ctx)?;
        }
        self.record(
            inner,
            &[
                Record::Origin(
                    rel.to_path_buf(),
                    Origin {
                        dev: meta.dev(),
                        ino: meta.ino(),
                    },
                ),
                Record::Dirty(rel.to_path_buf()),
            ],
        )?;
        inner.touched.insert(rel.to_path_buf());
        let tmp = self.tmp_path();
        let result = self.copy_object(&lower_path, &meta, &tmp, with_data).and_then(|()| {
            fs::rename(&tmp, &up)?;
            fsync_dir(up.parent().unwrap_or(&self.upper))
        });
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp).or_else(|_| fs::remove_dir(&tmp));
            return Err(e.into());
        }
        tracing::debug!(path = %rel.display(), "copied up");
        Ok(())
    }

    fn copy_object(&self, src: &Path, meta: &Metadata, dst: &Path, with_data: bool) -> io::Result<()> {
        let ft = meta.file_type();
        if ft.is_file() {
            let input = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(src)?;
            let out = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(dst)?;
            if with_data {
                sys::copy_data(&input, &out, meta.len())?;
            }
            self.copy_meta(src, meta, dst)?;
            out.sync_all()?;
        } else if ft.is_dir() {
            fs::create_dir(dst)?;
            self.copy_meta(src, meta, dst)?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(src)?, dst)?;
            self.copy_meta(src, meta, dst)?;
        } else {
            sys::mknod(dst, meta.mode(), meta.rdev())?;
            self.copy_meta(src, meta, dst)?;
        }
        Ok(())
    }

    /// Opens an existing file. Writable opens of cached paths copy the file up first.
    /// Returns the file and, for a writable cache file, its cache inode (see
    /// [`Overlay::release_writer`]).
    pub fn open(&self, ctx: &Ctx, rel: &Path, flags: i32) -> FsResult<(File, Option<u64>)> {
        let class = self.policy.classify(rel);
        if wants_write(flags) && class == PathClass::Cached {
            let mut inner = self.lock();
            let truncating = flags & libc::O_TRUNC != 0;
            self.copy_up(&mut inner, rel, !truncating, ctx)?;
            self.mark_dirty(&mut inner, rel)?;
            let file = options_for(flags).open(self.upper_path(rel))?;
            let ino = file.metadata()?.ino();
            *inner.writers.entry(ino).or_insert(0) += 1;
            return Ok((file, Some(ino)));
        }
        let found = self.resolve(rel)?;
        let file = options_for(flags).open(&found.real)?;
        Ok((file, None))
    }

    /// A writable handle on a cache file was closed.
    pub fn release_writer(&self, ino: u64) {
        let mut inner = self.lock();
        if let Some(n) = inner.writers.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                inner.writers.remove(&ino);
            }
        }
        inner.released.insert(ino);
    }

    /// Creates a new object `name` in `parent` with `make`, which gets the real path.
    fn make_node(
        &self,
        ctx: &Ctx,
        parent: &Path,
        name: &OsStr,
        make: impl FnOnce(&Path) -> io::Result<()>,
    ) -> FsResult<Found> {
        let rel = parent.join(name);
        let mut inner = self.lock();
        self.check_parent(&inner, parent)?;
        if self.resolve_locked(&inner, &rel).is_ok() {
            return Err(errno(libc::EEXIST));
        }
        let real = match self.policy.classify(&rel) {
            PathClass::Passthrough => self.share_path(&rel),
            PathClass::LocalOnly => {
                self.ensure_upper_dir(&inner, parent, ctx)?;
                self.upper_path(&rel)
            }
            PathClass::Cached => {
                self.ensure_upper_dir(&inner, parent, ctx)?;
                let was_whiteout = inner.state.is_whiteout(&rel);
                self.mark_dirty(&mut inner, &rel)?;
                let real = self.upper_path(&rel);
                if let Err(e) = make(&real) {
                    // Put the whiteout back so the share's deleted copy stays hidden.
                    self.record(
                        &mut inner,
                        &[Record::Delete {
                            path: rel.clone(),
                            whiteout: was_whiteout,
                        }],
                    )?;
                    return Err(e.into());
                }
                self.chown_new(&real, ctx)?;
                return self.resolve_locked(&inner, &rel);
            }
        };
        make(&real)?;
        self.chown_new(&real, ctx)?;
        self.resolve_locked(&inner, &rel)
    }

    /// Creates and opens a regular file.
    pub fn create(
        &self,
        ctx: &Ctx,
        parent: &Path,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> FsResult<(Found, File, Option<u64>)> {
        let rel = parent.join(name);
        if self.resolve(&rel).is_ok() {
            if flags & libc::O_EXCL != 0 {
                return Err(errno(libc::EEXIST));
            }
            let (file, writer) = self.open(ctx, &rel, flags)?;
            return Ok((self.resolve(&rel)?, file, writer));
        }
        let perm = mode & 0o7777 & !ctx.umask;
        let mut file = None;
        let found = self.make_node(ctx, parent, name, |real| {
            let f = options_for(flags | libc::O_CREAT)
                .create_new(true)
                .mode(perm)
                .open(real)?;
            file = Some(f);
            Ok(())
        })?;
        let file = file.ok_or_else(|| errno(libc::EIO))?;
        let writer = if found.layer == Layer::Upper && self.policy.classify(&rel) == PathClass::Cached {
            let ino = found.meta.ino();
            *self.lock().writers.entry(ino).or_insert(0) += 1;
            Some(ino)
        } else {
            None
        };
        Ok((found, file, writer))
    }

    pub fn mkdir(&self, ctx: &Ctx, parent: &Path, name: &OsStr, mode: u32) -> FsResult<Found> {
        let perm = mode & 0o7777 & !ctx.umask;
        self.make_node(ctx, parent, name, |real| {
            fs::create_dir(real)?;
            sys::chmod(real, perm)
        })
    }

    pub fn mknod(
        &self,
        ctx: &Ctx,
        parent: &Path,
        name: &OsStr,
        mode: u32,
        rdev: u64,
    ) -> FsResult<Found> {
        let mode = (mode & libc::S_IFMT) | (mode & 0o7777 & !ctx.umask);
        self.make_node(ctx, parent, name, |real| sys::mknod(real, mode, rdev))
    }

    pub fn symlink(&self, ctx: &Ctx, parent: &Path, name: &OsStr, target: &Path) -> FsResult<Found> {
        self.make_node(ctx, parent, name, |real| std::os::unix::fs::symlink(target, real))
    }

    /// Hard link `src` as `parent/name`. Both must be of the same class.
    pub fn link(&self, ctx: &Ctx, src: &Path, parent: &Path, name: &OsStr) -> FsResult<Found> {
        let rel = parent.join(name);
        let class = self.policy.classify(src);
        if class != self.policy.classify(&rel) {
            return Err(errno(libc::EXDEV));
        }
        let mut inner = self.lock();
        self.check_parent(&inner, parent)?;
        if self.resolve_locked(&inner, &rel).is_ok() {
            return Err(errno(libc::EEXIST));
        }
        let (from, to) = match class {
            PathClass::Passthrough => (self.share_path(src), self.share_path(&rel)),
            PathClass::LocalOnly => {
                self.ensure_upper_dir(&inner, parent, ctx)?;
                (self.upper_path(src), self.upper_path(&rel))
            }
            PathClass::Cached => {
                if self.resolve_locked(&inner, src)?.meta.is_dir() {
                    return Err(errno(libc::EPERM));
                }
                self.copy_up(&mut inner, src, true, ctx)?;
                self.ensure_upper_dir(&inner, parent, ctx)?;
                self.mark_dirty(&mut inner, src)?;
                let was_whiteout = inner.state.is_whiteout(&rel);
                self.mark_dirty(&mut inner, &rel)?;
                if let Err(e) = fs::hard_link(self.upper_path(src), self.upper_path(&rel)) {
                    self.record(
                        &mut inner,
                        &[Record::Delete {
                            path: rel.clone(),
                            whiteout: was_whiteout,
                        }],
                    )?;
                    return Err(e.into());
                }
                // Both names share the source's share identity.
                if let Some(o) = inner.state.origin(src) {
                    self.record(&mut inner, &[Record::Origin(rel.clone(), o)])?;
                }
                return self.resolve_locked(&inner, &rel);
            }
        };
        fs::hard_link(&from, &to)?;
        self.resolve_locked(&inner, &rel)
    }

    /// Whether a deleted cached path needs a whiteout: the share has it, or a sync running
    /// now may put it there.
    fn needs_whiteout(&self, inner: &Inner, rel: &Path) -> io::Result<bool> {
        Ok(self.lower_meta(inner, rel)?.is_some()
            || (self.sync_running.load(Ordering::Acquire) && inner.state.is_dirty(rel)))
    }

    pub fn unlink(&self, parent: &Path, name: &OsStr) -> FsResult<()> {
        self.remove(parent, name, false)
    }

    pub fn rmdir(&self, parent: &Path, name: &OsStr) -> FsResult<()> {
        self.remove(parent, name, true)
    }

    fn remove(&self, parent: &Path, name: &OsStr, dir: bool) -> FsResult<()> {
        let rel = parent.join(name);
        let mut inner = self.lock();
        let found = self.resolve_locked(&inner, &rel)?;
        if dir && !found.meta.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        if !dir && found.meta.is_dir() {
            return Err(errno(libc::EISDIR));
        }
        let class = self.policy.classify(&rel);
        if class != PathClass::Cached {
            if dir {
                fs::remove_dir(&found.real)?;
            } else {
                fs::remove_file(&found.real)?;
            }
            return Ok(());
        }
        if dir {
            drop(inner);
            if !self.readdir(&rel)?.is_empty() {
                return Err(errno(libc::ENOTEMPTY));
            }
            inner = self.lock();
        }
        let whiteout = self.needs_whiteout(&inner, &rel)?;
        self.record(
            &mut inner,
            &[Record::Delete {
                path: rel.clone(),
                whiteout,
            }],
        )?;
        let up = self.upper_path(&rel);
        if lstat(&up)?.is_some() {
            if dir {
                fs::remove_dir(&up)?;
            } else {
                fs::remove_file(&up)?;
            }
        }
        Ok(())
    }

    /// Renames within one class. Directories that exist on the share cannot be renamed
    /// under a cached path (EXDEV: `mv` then copies), as in overlayfs without redirects.
    pub fn rename(
        &self,
        ctx: &Ctx,
        from_parent: &Path,
        from_name: &OsStr,
        to_parent: &Path,
        to_name: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        let from = from_parent.join(from_name);
        let to = to_parent.join(to_name);
        let class = self.policy.classify(&from);
        if class != self.policy.classify(&to) {
            return Err(errno(libc::EXDEV));
        }
        if flags & !(libc::RENAME_NOREPLACE) != 0 {
            return Err(errno(libc::EINVAL));
        }
        if class != PathClass::Cached {
            let mut inner = self.lock();
            let root = if class == PathClass::Passthrough {
                &self.share
            } else {
                self.ensure_upper_dir(&inner, to_parent, ctx)?;
                &self.upper
            };
            sys::rename2(&join(root, &from), &join(root, &to), flags)?;
            inner.touched.insert(to);
            return Ok(());
        }
        let mut inner = self.lock();
        let src = self.resolve_locked(&inner, &from)?;
        self.check_parent(&inner, to_parent)?;
        let dst = self.resolve_locked(&inner, &to).ok();
        if from == to {
            return Ok(());
        }
        if to.starts_with(&from) {
            return Err(errno(libc::EINVAL));
        }
        if let Some(d) = &dst {
            if flags & libc::RENAME_NOREPLACE != 0 {
                return Err(errno(libc::EEXIST));
            }
            match (src.meta.is_dir(), d.meta.is_dir()) {
                (true, false) => return Err(errno(libc::ENOTDIR)),
                (false, true) => return Err(errno(libc::EISDIR)),
                (true, true) => {
                    drop(inner);
                    if !self.readdir(&to)?.is_empty() {
                        return Err(errno(libc::ENOTEMPTY));
                    }
                    inner = self.lock();
                }
                (false, false) => {}
            }
        }
        let src_on_share = self.lower_meta(&inner, &from)?;
        if src.meta.is_dir() && src_on_share.as_ref().is_some_and(|m| m.is_dir()) {
            return Err(errno(libc::EXDEV));
        }
        if src.layer == Layer::Lower {
            self.copy_up(&mut inner, &from, true, ctx)?;
        }
        self.ensure_upper_dir(&inner, to_parent, ctx)?;
        let whiteout_from = self.needs_whiteout(&inner, &from)?;
        // Write-ahead: the target is dirty before the cache changes, so a crash in between
        // leaves a journal that is not clean and recovery sends the whole cache.
        self.record(&mut inner, &[Record::Dirty(to.clone())])?;
        fs::rename(self.upper_path(&from), self.upper_path(&to))?;
        let mut records = vec![Record::Rename {
            from: from.clone(),
            to: to.clone(),
        }];
        if whiteout_from {
            records.push(Record::Delete {
                path: from.clone(),
                whiteout: true,
            });
        }
        records.push(Record::Dirty(to.clone()));
        self.record(&mut inner, &records)?;
        inner.touched.insert(to);
        Ok(())
    }

    /// Changes attributes (chmod, chown, truncate, utimens). `file` is the open handle's
    /// file when the kernel gave one (ftruncate).
    pub fn setattr(&self, ctx: &Ctx, rel: &Path, attr: SetAttr, file: Option<&File>) -> FsResult<Found> {
        let mut inner = self.lock();
        let mut found = self.resolve_locked(&inner, rel)?;
        if self.policy.classify(rel) == PathClass::Cached {
            let keep_data = attr.size != Some(0);
            self.copy_up(&mut inner, rel, keep_data, ctx)?;
            self.mark_dirty(&mut inner, rel)?;
            found = self.resolve_locked(&inner, rel)?;
        }
        let real = &found.real;
        if attr.uid.is_some() || attr.gid.is_some() {
            std::os::unix::fs::lchown(real, attr.uid, attr.gid)?;
        }
        if let Some(mode) = attr.mode {
            if !found.meta.file_type().is_symlink() {
                sys::chmod(real, mode & 0o7777)?;
            }
        }
        if let Some(size) = attr.size {
            // A writable handle of a cached file always points into the cache.
            match file {
                Some(f) => f.set_len(size)?,
                None => OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(real)?
                    .set_len(size)?,
            }
        }
        if attr.atime.is_some() || attr.mtime.is_some() {
            sys::utimens(
                real,
                attr.atime.unwrap_or(SetTime::Omit),
                attr.mtime.unwrap_or(SetTime::Omit),
            )?;
        }
        self.resolve_locked(&inner, rel)
    }

    pub fn readlink(&self, rel: &Path) -> FsResult<PathBuf> {
        let found = self.resolve(rel)?;
        Ok(fs::read_link(&found.real)?)
    }

    pub fn getxattr(&self, rel: &Path, name: &OsStr) -> FsResult<Vec<u8>> {
        let found = self.resolve(rel)?;
        Ok(sys::lgetxattr(&found.real, name)?)
    }

    pub fn listxattr(&self, rel: &Path) -> FsResult<Vec<OsString>> {
        let found = self.resolve(rel)?;
        Ok(sys::llistxattr(&found.real)?)
    }

    /// The real path to change for a metadata write on `rel` (copied up if cached).
    fn writable_real(&self, ctx: &Ctx, rel: &Path) -> FsResult<PathBuf> {
        let mut inner = self.lock();
        let found = self.resolve_locked(&inner, rel)?;
        if self.policy.classify(rel) == PathClass::Cached {
            self.copy_up(&mut inner, rel, true, ctx)?;
            self.mark_dirty(&mut inner, rel)?;
            return Ok(self.upper_path(rel));
        }
        Ok(found.real)
    }

    pub fn setxattr(&self, ctx: &Ctx, rel: &Path, name: &OsStr, value: &[u8], flags: i32) -> FsResult<()> {
        let real = self.writable_real(ctx, rel)?;
        Ok(sys::lsetxattr(&real, name, value, flags)?)
    }

    pub fn removexattr(&self, ctx: &Ctx, rel: &Path, name: &OsStr) -> FsResult<()> {
        // Look first, so a missing attribute does not copy the file up.
        let found = self.resolve(rel)?;
        sys::lgetxattr(&found.real, name)?;
        let real = self.writable_real(ctx, rel)?;
        Ok(sys::lremovexattr(&real, name)?)
    }

    pub fn statfs(&self) -> FsResult<fsinfo::FsStats> {
        Ok(fsinfo::statfs(&self.share)?)
    }

    // ---- sync support -------------------------------------------------------------

    /// Takes what a sync must send. With `everything`, every object in the cache is sent
    /// (crash recovery: the journal may lag the cache), not only the recorded dirty paths.
    pub fn begin_sync(&self, everything: bool) -> FsResult<SyncSnapshot> {
        let mut inner = self.lock();
        self.sync_running.store(true, Ordering::Release);
        inner.touched.clear();
        inner.released.clear();
        let mut files: Vec<PathBuf> = Vec::new();
        if everything {
            let mut stack = vec![PathBuf::new()];
            while let Some(dir) = stack.pop() {
                for entry in fs::read_dir(self.upper_path(&dir))? {
                    let entry = entry?;
                    let rel = dir.join(entry.file_name());
                    if self.policy.classify(&rel) == PathClass::LocalOnly {
                        continue;
                    }
                    if entry.file_type()?.is_dir() {
                        stack.push(rel.clone());
                    }
                    files.push(rel);
                }
            }
            // Recorded-dirty paths count too (they may need the dirty mark cleared).
            for p in inner.state.dirty() {
                files.push(p.clone());
            }
        } else {
            files.extend(inner.state.dirty().cloned());
        }
        files.retain(|p| self.policy.classify(p) != PathClass::LocalOnly);
        files.sort();
        files.dedup();
        let (mut files, stale): (Vec<PathBuf>, Vec<PathBuf>) = files
            .into_iter()
            .partition(|p| lstat(&self.upper_path(p)).ok().flatten().is_some());
        self.add_hard_link_names(&mut files)?;
        let mut deletions: Vec<PathBuf> = inner.state.whiteouts().cloned().collect();
        deletions.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        Ok(SyncSnapshot {
            files,
            deletions,
            stale,
        })
    }

    /// A changed file with several names changed under all of them: rsync must see every
    /// name to keep the link group whole on the share (`--hard-links`).
    fn add_hard_link_names(&self, files: &mut Vec<PathBuf>) -> io::Result<()> {
        let mut inodes = HashSet::new();
        for p in files.iter() {
            if let Some(m) = lstat(&self.upper_path(p))? {
                if !m.is_dir() && m.nlink() > 1 {
                    inodes.insert(m.ino());
                }
            }
        }
        if inodes.is_empty() {
            return Ok(());
        }
        let mut stack = vec![PathBuf::new()];
        while let Some(dir) = stack.pop() {
            for entry in fs::read_dir(self.upper_path(&dir))? {
                let entry = entry?;
                let rel = dir.join(entry.file_name());
                if entry.file_type()?.is_dir() {
                    stack.push(rel);
                } else if inodes.contains(&entry.ino())
                    && self.policy.classify(&rel) != PathClass::LocalOnly
                {
                    files.push(rel);
                }
            }
        }
        files.sort();
        files.dedup();
        Ok(())
    }

    /// After rsync succeeded: marks clean every sent path not changed since `begin_sync`.
    pub fn finish_sync(&self, snap: &SyncSnapshot) -> FsResult<usize> {
        let mut inner = self.lock();
        let mut clean = Vec::new();
        for p in &snap.stale {
            if inner.state.is_dirty(p) && !inner.touched.contains(p) && lstat(&self.upper_path(p))?.is_none() {
                clean.push(Record::Clean(p.clone()));
            }
        }
        for p in &snap.files {
            if !inner.state.is_dirty(p) || inner.touched.contains(p) {
                continue;
            }
            let Some(meta) = lstat(&self.upper_path(p))? else {
                continue;
            };
            let ino = meta.ino();
            if inner.writers.contains_key(&ino) || inner.released.contains(&ino) {
                continue;
            }
            clean.push(Record::Clean(p.clone()));
        }
        let n = clean.len();
        if !clean.is_empty() {
            self.record(&mut inner, &clean)?;
        }
        Ok(n)
    }

    /// Deletes `rel` on the share if it is still a whiteout and the cache has nothing
    /// there, then records the whiteout done. Never removes a non-empty directory.
    pub fn apply_deletion(&self, rel: &Path) -> FsResult<()> {
        let mut inner = self.lock();
        if !inner.state.is_whiteout(rel) {
            return Ok(());
        }
        if lstat(&self.upper_path(rel))?.is_none() {
            let real = self.share_path(rel);
            if let Some(meta) = lstat(&real)? {
                let r = if meta.is_dir() {
                    fs::remove_dir(&real)
                } else {
                    fs::remove_file(&real)
                };
                match r {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        self.record(&mut inner, &[Record::Deleted(rel.to_path_buf())])?;
        Ok(())
    }

    pub fn end_sync(&self) {
        self.sync_running.store(false, Ordering::Release);
    }

    /// Rewrites the journal as a snapshot of the current state.
    pub fn compact(&self) -> FsResult<()> {
        let mut inner = self.lock();
        let Inner { state, journal, .. } = &mut *inner;
        journal.compact(state).map_err(FsError::Journal)
    }

    /// Empties the cache of everything but local-only paths. Only when nothing is unsynced.
    pub fn drop_clean_cache(&self) -> FsResult<bool> {
        let mut inner = self.lock();
        if !inner.state.is_clean() {
            return Ok(false);
        }
        for entry in fs::read_dir(&self.upper)? {
            let entry = entry?;
            let rel = PathBuf::from(entry.file_name());
            if self.policy.classify(&rel) == PathClass::LocalOnly {
                continue;
            }
            let p = entry.path();
            if entry.file_type()?.is_dir() {
                fs::remove_dir_all(&p)?;
            } else {
                fs::remove_file(&p)?;
            }
        }
        inner.state.forget_origins();
        let Inner { state, journal, .. } = &mut *inner;
        journal.compact(state).map_err(FsError::Journal)?;
        Ok(true)
    }

    /// Counts for `ccfs status`: dirty objects, their bytes, pending deletions.
    pub fn pending(&self) -> (usize, u64, usize) {
        let inner = self.lock();
        let mut bytes = 0;
        for p in inner.state.dirty() {
            if let Ok(Some(m)) = lstat(&self.upper_path(p)) {
                if m.is_file() {
                    bytes += m.len();
                }
            }
        }
        (inner.state.dirty_count(), bytes, inner.state.whiteout_count())
    }
}
