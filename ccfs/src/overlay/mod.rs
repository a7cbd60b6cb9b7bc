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
//!
//! All access goes through [`Root`] handles (openat2 with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS`): a symlink planted in the cache or the share is never followed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::error::{errno, FsError, FsResult};
use crate::gate;
use crate::journal::Journal;
use crate::policy::{PathClass, Policy};
use crate::state::{Origin, OverlayState, Record};
use crate::sys::{self, Root, SetTime, Stat};

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

/// Where the file an open handle stands for is now (see [`Overlay::binding`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// Still the share's copy, under its name.
    Share,
    /// Copied to the cache from that very share object, under its name.
    Cache,
    /// The cache took the name over since the handle was opened (a rename over it, an
    /// unlink, a copy-up of what another workstation put there): the handle's file is as
    /// an unlinked one.
    Replaced,
    /// The cache has no say on the name, and the share holds another object there, or
    /// nothing: another workstation changed it (see [`Overlay::keep_version`]).
    Changed,
}

/// What a deferred handle (see [`Overlay::open_deferred`]) stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deferral {
    /// The share object the handle has open (device, inode): it stays bound to it.
    pub object: (u64, u64),
    /// Whether the cache had taken the path over in this session when the handle was
    /// opened (then only a say of the cache on the name now tells a change made here).
    pub taken_at_open: bool,
}

#[derive(Debug, Clone)]
pub struct Found {
    pub layer: Layer,
    pub meta: Stat,
}

/// See [`Overlay::dir_signature`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirSignature {
    upper: Option<sys::Version>,
    share: Option<sys::Version>,
}

impl DirSignature {
    /// Neither layer has the directory.
    pub fn is_none(&self) -> bool {
        self.upper.is_none() && self.share.is_none()
    }

    /// The modification time of the share's directory, if the share has it.
    pub fn share_mtime(&self) -> Option<(i64, i64)> {
        self.share.map(|s| s.2)
    }
}

#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: OsString,
    /// `S_IFMT` bits of the entry's type.
    pub file_type: u32,
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

pub use session::{Conflict, ConflictKind, Emptied, SyncSession, Transfer};

mod session;

/// A copy made ahead of a copy-up (see [`Overlay::prepare_copy_up`]): in `work/`, and the
/// share file's attributes when it was read.
/// Dropped unused, its copy is removed.
#[derive(Debug)]
struct Prepared<'a> {
    cache: &'a Root,
    tmp: PathBuf,
    meta: Stat,
}

impl Prepared<'_> {
    /// Puts the copy at `dst` (see [`Overlay::install_synced`]).
    fn install(mut self, overlay: &Overlay, dst: &Path) -> io::Result<()> {
        let tmp = std::mem::take(&mut self.tmp);
        let done = overlay.install_synced(&tmp, dst);
        if done.is_err() {
            let _ = remove_tree(self.cache, &tmp);
        }
        done
    }
}

impl Drop for Prepared<'_> {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = remove_tree(self.cache, &self.tmp);
        }
    }
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
    share: Root,
    /// Every access to the share passes it: closed while the share does not answer.
    gate: std::sync::Arc<crate::gate::ShareGate>,
    /// The cache directory; the upper layer is its `upper/` subdirectory.
    cache: Root,
    upper_abs: PathBuf,
    policy: Policy,
    inner: Mutex<Inner>,
    tmp_seq: AtomicU64,
    /// Asks the share for its root's attributes on a thread of its own (see
    /// [`Overlay::share_root`]).
    root_look: std::sync::mpsc::Sender<RootAsk>,
    as_root: bool,
    sync_running: AtomicBool,
    /// The FUSE requests this mount served (see [`crate::counters`]).
    pub requests: crate::counters::Requests,
    /// Copy-ups so far: a deferred handle (see [`Overlay::open_deferred`]) that sees it
    /// change checks whether its file moved to the cache.
    copy_ups: AtomicU64,
}

fn is_not_supported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOTSUP) | Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::ENODATA)
    )
}

/// Whether `rel` names the directory a running sync's rsync holds its files in on the share
/// until it puts them in place ([`crate::sync::PARTIAL_DIR`]): it is never part of the
/// merged view of a cached directory (a listing during a sync would show it, and an rmdir
/// of a directory that is empty here would fail).
fn is_sync_holding(rel: &Path) -> bool {
    rel.file_name()
        .is_some_and(|n| n == OsStr::new(crate::sync::PARTIAL_DIR))
}

/// `rel` inside the cache's upper layer, relative to the cache root.
fn up(rel: &Path) -> PathBuf {
    if rel.as_os_str().is_empty() {
        PathBuf::from("upper")
    } else {
        Path::new("upper").join(rel)
    }
}

/// Open flags kept when opening the real file (the access mode included).
fn open_flags(flags: i32) -> i32 {
    let keep = libc::O_ACCMODE
        | libc::O_APPEND
        | libc::O_NONBLOCK
        | libc::O_DSYNC
        | libc::O_SYNC
        | libc::O_DIRECT
        | libc::O_TRUNC
        | libc::O_CREAT
        | libc::O_EXCL;
    flags & keep
}

/// The flags the real file of a create is made with: as asked, and open for reading too
/// (a new file needs no permission to be opened; the kernel keeps the program to what it
/// asked for), so that the kernel may read and write it through this descriptor (see
/// [`crate::backing`]).
fn creation_flags(flags: i32) -> i32 {
    let f = open_flags(flags) | libc::O_CREAT | libc::O_EXCL;
    if f & libc::O_ACCMODE == libc::O_WRONLY {
        (f & !libc::O_ACCMODE) | libc::O_RDWR
    } else {
        f
    }
}

fn wants_write(flags: i32) -> bool {
    let acc = flags & libc::O_ACCMODE;
    acc == libc::O_WRONLY || acc == libc::O_RDWR || flags & libc::O_TRUNC != 0
}

fn at(t: (i64, i64)) -> SetTime {
    SetTime::At {
        secs: t.0,
        nsecs: t.1,
    }
}

/// Removes a tree below `root` without following symlinks. A directory without the owner's
/// write bit (a read-only directory's copy) gets it to be emptied; it is put back when the
/// directory cannot be removed.
fn remove_tree(root: &Root, rel: &Path) -> io::Result<()> {
    remove_tree_keeping(root, rel, &std::collections::HashSet::new())
}

/// [`remove_tree`], but for the paths in `keep` and the directories that lead to them
/// (which keep their modes).
fn remove_tree_keeping(
    root: &Root,
    rel: &Path,
    keep: &std::collections::HashSet<PathBuf>,
) -> io::Result<()> {
    if keep.contains(rel) {
        return Ok(());
    }
    let Some(meta) = root.stat(rel)? else {
        return Ok(());
    };
    if !meta.is_dir() {
        return root.unlink(rel);
    }
    let mode = meta.mode() & 0o7777;
    let locked = mode & libc::S_IWUSR == 0;
    if locked {
        root.chmod(rel, mode | libc::S_IWUSR)?;
    }
    let emptied = root.read_dir(rel).and_then(|names| {
        names
            .into_iter()
            .try_for_each(|(name, _, _)| remove_tree_keeping(root, &rel.join(name), keep))
    });
    let leads_to_kept = keep.iter().any(|k| k.starts_with(rel));
    let removed = if leads_to_kept {
        emptied
    } else {
        emptied.and_then(|()| root.rmdir(rel))
    };
    if locked && (leads_to_kept || removed.is_err()) {
        let _ = root.chmod(rel, mode);
    }
    removed
}

/// How long a request waits for the share's root attributes before the cache's
/// stand-in answers instead (see [`Overlay::share_root`]).
const ROOT_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// A request for the share root's attributes: where to send them (an errno on failure).
type RootAsk = std::sync::mpsc::SyncSender<Result<Option<Stat>, i32>>;

/// The thread that looks at the share's root for [`Overlay::share_root`]: one look
/// answers every request waiting meanwhile; it ends with the overlay (its sender dropped).
fn spawn_root_look(share: Root) -> io::Result<std::sync::mpsc::Sender<RootAsk>> {
    let (tx, rx) = std::sync::mpsc::channel::<RootAsk>();
    std::thread::Builder::new()
        .name("ccfs-share-root".into())
        .spawn(move || {
            while let Ok(first) = rx.recv() {
                let waiting: Vec<RootAsk> = std::iter::once(first).chain(rx.try_iter()).collect();
                let answer = share
                    .stat(Path::new(""))
                    .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO));
                for w in waiting {
                    // A request that stopped waiting has dropped its receiver: fine.
                    let _ = w.try_send(answer);
                }
            }
        })?;
    Ok(tx)
}

impl Overlay {
    /// Opens the overlay of `share` (canonical) with its cache in `cache_dir`
    /// (`upper/`, `work/` and `journal` are created inside).
    pub fn new(share: &Path, cache_dir: &Path, policy: Policy) -> io::Result<Self> {
        let cache = Root::open(cache_dir)?;
        for d in ["upper", "work"] {
            match cache.mkdir(Path::new(d), 0o700) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        // Leftover temp files of an interrupted copy-up are never referenced: drop them.
        for (name, _, _) in cache.read_dir(Path::new("work"))? {
            let _ = remove_tree(&cache, &Path::new("work").join(name));
        }
        let (journal, state) = Journal::open(&cache_dir.join("journal"))?;
        let gate = std::sync::Arc::new(crate::gate::ShareGate::default());
        let share = Root::open_gated(share, gate.clone())?;
        let share_meta = share
            .stat(Path::new(""))?
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let root_look = spawn_root_look(Root::open_gated(share.path(), gate.clone())?)?;
        let overlay = Self {
            share,
            gate,
            cache,
            upper_abs: cache_dir.join("upper"),
            policy,
            inner: Mutex::new(Inner {
                state,
                journal,
                touched: HashSet::new(),
                writers: HashMap::new(),
                released: HashSet::new(),
            }),
            tmp_seq: AtomicU64::new(0),
            root_look,
            as_root: sys::geteuid() == 0,
            sync_running: AtomicBool::new(false),
            requests: crate::counters::Requests::default(),
            copy_ups: AtomicU64::new(0),
        };
        // The cache's root stands for the share's root (rsync may copy its attributes);
        // the cache directory around it stays private.
        overlay.copy_meta(
            &overlay.share,
            Path::new(""),
            &share_meta,
            Path::new("upper"),
        )?;
        Ok(overlay)
    }

    pub fn share(&self) -> &Path {
        self.share.path()
    }

    /// The gate every access to the share passes ([`crate::gate`]).
    pub fn share_gate(&self) -> &std::sync::Arc<crate::gate::ShareGate> {
        &self.gate
    }

    pub fn upper(&self) -> &Path {
        &self.upper_abs
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tmp_rel(&self) -> PathBuf {
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        PathBuf::from(format!("work/tmp-{}-{n}", std::process::id()))
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

    fn upper_stat(&self, rel: &Path) -> io::Result<Option<Stat>> {
        self.cache.stat(&up(rel))
    }

    /// The cache's object at `rel` for the merged view: ENOTDIR when the cache has a
    /// non-directory on the way, which hides what the share has below that name (a
    /// directory a running sync put on the share after it was replaced here by a file).
    fn upper_lookup(&self, rel: &Path) -> io::Result<Option<Stat>> {
        self.cache.stat_through(&up(rel))
    }

    /// What the cache's regular file at `rel` is now ([`Stat::version`]), if it has one.
    pub fn upper_version(&self, rel: &Path) -> Option<sys::Version> {
        self.upper_stat(rel)
            .ok()
            .flatten()
            .filter(Stat::is_file)
            .map(|m| m.version())
    }

    /// The records of the cache taking `rel` over: what the share holds there now (none
    /// when the cache took it over before in this session: the first base stands until
    /// our own sync settles the path), and for a database's journal or WAL, the
    /// database's base too (see [`Overlay::database_base`]).
    fn take_over(&self, inner: &Inner, rel: &Path) -> io::Result<Vec<Record>> {
        let mut out = Vec::new();
        if !inner.state.taken_over(rel) {
            let now = self.share.stat(rel)?.as_ref().map(session::share_id_of);
            out.push(Record::Base(rel.to_path_buf(), now));
        }
        out.extend(self.database_base(inner, rel)?);
        Ok(out)
    }

    /// The root and path of an object found in `layer`.
    fn place(&self, layer: Layer, rel: &Path) -> (&Root, PathBuf) {
        match layer {
            Layer::Upper => (&self.cache, up(rel)),
            Layer::Lower | Layer::Share => (&self.share, rel.to_path_buf()),
        }
    }

    fn found(&self, _rel: &Path, layer: Layer, meta: Stat) -> Found {
        Found { layer, meta }
    }

    fn resolve_locked(&self, inner: &Inner, rel: &Path) -> FsResult<Found> {
        match self.policy.classify(rel) {
            PathClass::Passthrough => self.resolve_share(rel),
            PathClass::LocalOnly => {
                let meta = self.upper_stat(rel)?.ok_or_else(FsError::enoent)?;
                Ok(self.found(rel, Layer::Upper, meta))
            }
            PathClass::Cached => {
                if let Some(meta) = self.upper_lookup(rel)? {
                    return Ok(self.found(rel, Layer::Upper, meta));
                }
                if inner.state.hidden(rel) || is_sync_holding(rel) {
                    return Err(FsError::enoent());
                }
                let meta = self.share.stat(rel)?.ok_or_else(FsError::enoent)?;
                Ok(self.found(rel, Layer::Lower, meta))
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
        match self.policy.classify(rel) {
            // No overlay state is involved: no lock held while the share answers.
            PathClass::Passthrough => self.resolve_share(rel),
            PathClass::LocalOnly => {
                let inner = self.lock();
                self.resolve_locked(&inner, rel)
            }
            PathClass::Cached => {
                {
                    let inner = self.lock();
                    if self.upper_lookup(rel)?.is_some()
                        || inner.state.hidden(rel)
                        || is_sync_holding(rel)
                    {
                        return self.resolve_locked(&inner, rel);
                    }
                }
                // Only on the share so far: ask it without holding the lock (other users
                // of the mount go on meanwhile), then check that the cache still has no
                // say (a copy-up or a delete may have happened meanwhile).
                let meta = self.share.stat(rel)?;
                let inner = self.lock();
                if self.upper_lookup(rel)?.is_some() || inner.state.hidden(rel) {
                    return self.resolve_locked(&inner, rel);
                }
                let meta = meta.ok_or_else(FsError::enoent)?;
                Ok(self.found(rel, Layer::Lower, meta))
            }
        }
    }

    /// A passthrough path, straight from the share.
    fn resolve_share(&self, rel: &Path) -> FsResult<Found> {
        if rel.as_os_str().is_empty() {
            return self.share_root();
        }
        let meta = self.share.stat(rel)?.ok_or_else(FsError::enoent)?;
        Ok(Found {
            layer: Layer::Share,
            meta,
        })
    }

    /// The mount root: the share's root as its own thread sees it within [`ROOT_WAIT`],
    /// else the cache's stand-in for it (the share root's attributes, copied at mount).
    /// Every path goes through the root, so it answers while the share does not (its
    /// server died or hangs) and paths to cached files still resolve; the rest of the
    /// share fails as the share does.
    fn share_root(&self) -> FsResult<Found> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let answer = match self.root_look.send(tx) {
            Ok(()) => rx.recv_timeout(ROOT_WAIT).ok(),
            Err(_) => None,
        };
        match answer {
            Some(Ok(Some(meta))) => Ok(self.found(Path::new(""), Layer::Share, meta)),
            Some(Ok(None)) => Err(FsError::enoent()),
            not_now => match self.upper_stat(Path::new(""))? {
                Some(meta) => Ok(self.found(Path::new(""), Layer::Upper, meta)),
                None => Err(errno(match not_now {
                    Some(Err(e)) => e,
                    _ => gate::SHARE_DOWN,
                })),
            },
        }
    }

    /// The share's object under a cached path, if it is visible (not whited out).
    fn lower_meta(&self, inner: &Inner, rel: &Path) -> io::Result<Option<Stat>> {
        match self.policy.classify(rel) {
            PathClass::LocalOnly => Ok(None),
            PathClass::Cached if inner.state.hidden(rel) => Ok(None),
            _ => self.share.stat(rel),
        }
    }

    /// The merged listing of a directory (without `.` and `..`). The share is listed
    /// without the overlay's lock held (a slow or hung share holds up this request only).
    /// A cached directory lists what the cache holds while the share does not answer; a
    /// passthrough one fails as the share does.
    pub fn readdir(&self, rel: &Path) -> FsResult<Vec<DirEntry>> {
        let class = self.policy.classify(rel);
        let dir = self.resolve(rel)?;
        if !dir.meta.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        let share_visible = match class {
            PathClass::LocalOnly => false,
            PathClass::Passthrough => true,
            PathClass::Cached => !self.lock().state.hidden(rel),
        };
        let share_names = if share_visible {
            match self.list_share(rel) {
                Ok(names) => names,
                Err(e) if class == PathClass::Cached && gate::is_outage(&e) => Vec::new(),
                Err(e) => return Err(e.into()),
            }
        } else {
            Vec::new()
        };
        let mut names: BTreeMap<OsString, DirEntry> = BTreeMap::new();
        let inner = self.lock();
        for (name, file_type) in share_names {
            let child = rel.join(&name);
            match self.policy.classify(&child) {
                PathClass::LocalOnly => continue,
                PathClass::Cached if inner.state.hidden(&child) || is_sync_holding(&child) => {
                    continue
                }
                _ => {}
            }
            names.insert(name.clone(), DirEntry { name, file_type });
        }
        let merge_cache = class != PathClass::Passthrough || rel.as_os_str().is_empty();
        if merge_cache && self.upper_stat(rel)?.is_some_and(|m| m.is_dir()) {
            for (name, _, kind) in self.cache.read_dir(&up(rel))? {
                let child = rel.join(&name);
                if self.policy.classify(&child) == PathClass::Passthrough {
                    continue; // the share is authoritative for passthrough names
                }
                let kind = if kind == 0 {
                    match self.upper_stat(&child)? {
                        Some(meta) => meta.file_type(),
                        None => continue,
                    }
                } else {
                    kind
                };
                names.insert(
                    name.clone(),
                    DirEntry {
                        name,
                        file_type: kind,
                    },
                );
            }
        }
        Ok(names.into_values().collect())
    }

    /// What tells whether directory `rel`'s listing changed: the attributes of its cache
    /// copy and of the share's directory that [`Overlay::readdir`] would list (object,
    /// size, modification and change times). Equal signatures, same listing, unless
    /// the change came through this mount (which the kernel sees for itself).
    pub fn dir_signature(&self, rel: &Path) -> FsResult<DirSignature> {
        let class = self.policy.classify(rel);
        let upper = match class {
            PathClass::Passthrough if !rel.as_os_str().is_empty() => None,
            _ => self.upper_stat(rel)?.map(|m| m.version()),
        };
        let share_visible = match class {
            PathClass::LocalOnly => false,
            PathClass::Passthrough => true,
            PathClass::Cached => !self.lock().state.hidden(rel),
        };
        let share = if share_visible {
            self.share.stat(rel)?.map(|m| m.version())
        } else {
            None
        };
        Ok(DirSignature { upper, share })
    }

    /// The share's entries of directory `rel` with their file types; none when it has no
    /// directory there.
    fn list_share(&self, rel: &Path) -> io::Result<Vec<(OsString, u32)>> {
        let entries = match self.share.read_dir(rel) {
            Ok(e) => e,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {
                return Ok(Vec::new())
            }
            Err(e) => return Err(e),
        };
        let mut out = Vec::with_capacity(entries.len());
        for (name, _, kind) in entries {
            let kind = if kind == 0 {
                self.share
                    .stat(&rel.join(&name))?
                    .map(|m| m.file_type())
                    .unwrap_or(libc::S_IFREG)
            } else {
                kind
            };
            out.push((name, kind));
        }
        Ok(out)
    }

    /// New objects belong to the caller (when we are root), with the group of a setgid
    /// parent directory.
    fn chown_new(&self, root: &Root, at: &Path, ctx: &Ctx) -> io::Result<()> {
        if !self.as_root {
            return Ok(());
        }
        let parent = at.parent().unwrap_or(Path::new(""));
        let gid = match root.stat(parent)? {
            Some(p) if p.mode() & libc::S_ISGID != 0 => p.gid(),
            _ => ctx.gid,
        };
        root.chown(at, Some(ctx.uid), Some(gid))
    }

    /// Copies ownership, mode, xattrs and times of a share object onto a cache object.
    fn copy_meta(&self, src_root: &Root, src: &Path, meta: &Stat, dst: &Path) -> io::Result<()> {
        if self.as_root {
            self.cache.chown(dst, Some(meta.uid()), Some(meta.gid()))?;
        }
        if !meta.is_symlink() {
            self.cache.chmod(dst, meta.mode() & 0o7777)?;
        }
        match src_root.listxattr(src) {
            Ok(names) => {
                for name in names {
                    let copied = src_root
                        .getxattr(src, &name)
                        .and_then(|v| self.cache.setxattr(dst, &name, &v, 0));
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
        self.cache.utimens(dst, at(meta.atime()), at(meta.mtime()))
    }

    /// Makes sure the cache has directory `rel` (and its parents), copying each missing
    /// one's metadata from the share. Directories made here are not dirty: the share has them.
    fn ensure_upper_dir(&self, inner: &Inner, rel: &Path, ctx: &Ctx) -> FsResult<()> {
        if self.upper_stat(rel)?.is_some_and(|m| m.is_dir()) {
            return Ok(());
        }
        if let Some(parent) = rel.parent() {
            self.ensure_upper_dir(inner, parent, ctx)?;
        }
        let tmp = self.tmp_rel();
        self.cache.mkdir(&tmp, 0o700)?;
        let lower = self.lower_meta(inner, rel)?.filter(|m| m.is_dir());
        let meta_result = match lower {
            Some(m) => self.copy_meta(&self.share, rel, &m, &tmp),
            None => self.cache.chmod(&tmp, 0o755 & !ctx.umask).and_then(|()| {
                if self.as_root {
                    self.cache.chown(&tmp, Some(ctx.uid), Some(ctx.gid))
                } else {
                    Ok(())
                }
            }),
        };
        if let Err(e) = meta_result.and_then(|()| self.install(&tmp, &up(rel))) {
            let _ = self.cache.rmdir(&tmp);
            return Err(e.into());
        }
        Ok(())
    }

    /// Runs `f`, which writes into the cache directory `dir` (relative to the cache root) for
    /// an operation the kernel has already allowed (a copy-up, a directory made for one).
    /// The cache copy of a read-only directory has the mode the user gave it (it is what the
    /// sync sends), and the daemon, which is the user without privileges, may not write
    /// there: the owner's write bit is added for the moment of `f` and the mode put back.
    /// Nobody else can use the moment: the cache is the user's, 0700.
    pub(super) fn with_write_access<T>(
        &self,
        dir: &Path,
        f: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        let locked = match self.cache.stat(dir)? {
            Some(m) if !self.as_root && m.is_dir() && m.mode() & libc::S_IWUSR == 0 => {
                Some(m.mode() & 0o7777)
            }
            _ => None,
        };
        let Some(mode) = locked else {
            return f();
        };
        self.cache.chmod(dir, mode | libc::S_IWUSR)?;
        let result = f();
        let restored = self.cache.chmod(dir, mode);
        let value = result?;
        restored?;
        Ok(value)
    }

    /// Moves an object made in `work/` (`tmp`) to its place `dst` in the upper layer. The
    /// parent may be a read-only directory's copy (see [`Overlay::with_write_access`]); a
    /// directory that moves needs write access to itself too (its `..` changes), so a
    /// read-only one gets the owner's write bit for the moment of the move.
    fn install(&self, tmp: &Path, dst: &Path) -> io::Result<()> {
        let parent = dst.parent().unwrap_or(Path::new("upper"));
        self.with_write_access(parent, || {
            let locked = match self.cache.stat(tmp)? {
                Some(m) if !self.as_root && m.is_dir() && m.mode() & libc::S_IWUSR == 0 => {
                    Some(m.mode() & 0o7777)
                }
                _ => None,
            };
            if let Some(mode) = locked {
                self.cache.chmod(tmp, mode | libc::S_IWUSR)?;
            }
            self.cache.rename(tmp, dst, 0)?;
            match locked {
                Some(mode) => self.cache.chmod(dst, mode),
                None => Ok(()),
            }
        })
    }

    /// Journals a copy-up of `rel` from the share object `meta`, before the cache changes:
    /// where it came from, its base if the cache had not taken it over (the version the
    /// user's changes start from), a database's base for its WAL or journal, and dirty.
    fn journal_copy_up(&self, inner: &mut Inner, rel: &Path, meta: &Stat) -> FsResult<()> {
        let mut records = vec![Record::Origin(
            rel.to_path_buf(),
            Origin {
                dev: meta.dev(),
                ino: meta.ino(),
            },
        )];
        if !inner.state.taken_over(rel) {
            records.push(Record::Base(
                rel.to_path_buf(),
                Some(session::share_id_of(meta)),
            ));
        }
        records.extend(self.database_base(inner, rel)?);
        records.push(Record::Dirty(rel.to_path_buf()));
        self.record(inner, &records)?;
        inner.touched.insert(rel.to_path_buf());
        self.copy_ups.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Copies one cached path up from the share, if it is not in the cache yet.
    fn copy_up(&self, inner: &mut Inner, rel: &Path, with_data: bool, ctx: &Ctx) -> FsResult<()> {
        self.copy_up_of(inner, rel, with_data, ctx, None, None)
            .map(|_| ())
    }

    /// The copy of the share's regular file at cached path `rel`, with its data, made in
    /// `work/` without the overlay's lock (a large database from a slow share holds up no
    /// other request), for [`Overlay::copy_up_of`] to put in place if the share still
    /// has that version by then. None when no copy-up is due (the cache has the path or
    /// deleted it) or the copy could not be made whole (the file changed while it was
    /// read, or the share failed): the copy-up is then made under the lock as before.
    fn prepare_copy_up(&self, rel: &Path) -> Option<Prepared<'_>> {
        if self.policy.classify(rel) != PathClass::Cached {
            return None;
        }
        {
            let inner = self.lock();
            if inner.state.hidden(rel) || !matches!(self.upper_stat(rel), Ok(None)) {
                return None;
            }
        }
        let input = self.share.open_file(rel, libc::O_RDONLY, 0).ok()?;
        let meta = sys::fstat(&input).ok()?;
        if !meta.is_file() {
            return None;
        }
        let tmp = self.tmp_rel();
        let made = (|| -> io::Result<bool> {
            let out =
                self.cache
                    .open_file(&tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600)?;
            sys::copy_data(&input, &out, meta.len())?;
            self.copy_meta(&self.share, rel, &meta, &tmp)?;
            out.sync_all()?;
            Ok(sys::fstat(&input)?.version() == meta.version())
        })();
        let prepared = Prepared {
            cache: &self.cache,
            tmp,
            meta,
        };
        // Not whole: dropped (and removed).
        matches!(made, Ok(true)).then_some(prepared)
    }

    /// [`Overlay::copy_up`]; with `object` (device, inode), only when the share still has
    /// that object at `rel`: false when it has another or none (nothing is copied then).
    ///
    /// With `prepared` (see [`Overlay::prepare_copy_up`]): that copy is put in place when
    /// the share still has the version it was made from, and dropped otherwise.
    fn copy_up_of(
        &self,
        inner: &mut Inner,
        rel: &Path,
        with_data: bool,
        ctx: &Ctx,
        object: Option<(u64, u64)>,
        prepared: Option<Prepared<'_>>,
    ) -> FsResult<bool> {
        if self.upper_stat(rel)?.is_some() {
            return Ok(true);
        }
        let meta = match (self.lower_meta(inner, rel)?, object) {
            (Some(m), Some(o)) if o != (m.dev(), m.ino()) => return Ok(false),
            (Some(m), _) => m,
            (None, Some(_)) => return Ok(false),
            (None, None) => return Err(FsError::enoent()),
        };
        if let Some(parent) = rel.parent() {
            self.ensure_upper_dir(inner, parent, ctx)?;
        }
        let ready = prepared.filter(|p| with_data && p.meta.version() == meta.version());
        self.journal_copy_up(inner, rel, &meta)?;
        let dst = up(rel);
        if let Some(p) = ready {
            p.install(self, &dst)?;
            tracing::debug!(path = %rel.display(), "copied up (prepared)");
            return Ok(true);
        }
        let tmp = self.tmp_rel();
        let result = self
            .copy_object(rel, &meta, &tmp, with_data)
            .and_then(|()| self.install_synced(&tmp, &dst));
        if let Err(e) = result {
            let _ = remove_tree(&self.cache, &tmp);
            return Err(e.into());
        }
        tracing::debug!(path = %rel.display(), "copied up");
        Ok(true)
    }

    /// [`Overlay::install`], then the parent directory synced: the copy is in place for good.
    fn install_synced(&self, tmp: &Path, dst: &Path) -> io::Result<()> {
        self.install(tmp, dst)?;
        let parent = dst.parent().unwrap_or(Path::new("upper"));
        self.cache
            .open_file(parent, libc::O_RDONLY | libc::O_DIRECTORY, 0)?
            .sync_all()
    }

    fn copy_object(&self, src: &Path, meta: &Stat, dst: &Path, with_data: bool) -> io::Result<()> {
        if meta.is_file() {
            let input = self.share.open_file(src, libc::O_RDONLY, 0)?;
            let out =
                self.cache
                    .open_file(dst, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600)?;
            if with_data {
                sys::copy_data(&input, &out, meta.len())?;
            }
            self.copy_meta(&self.share, src, meta, dst)?;
            out.sync_all()?;
        } else if meta.is_dir() {
            self.cache.mkdir(dst, 0o700)?;
            self.copy_meta(&self.share, src, meta, dst)?;
        } else if meta.is_symlink() {
            self.cache.symlink(&self.share.readlink(src)?, dst)?;
            self.copy_meta(&self.share, src, meta, dst)?;
        } else {
            self.cache.mknod(dst, meta.mode(), meta.rdev())?;
            self.copy_meta(&self.share, src, meta, dst)?;
        }
        Ok(())
    }

    /// Opens an existing file. Writable opens of cached paths copy the file up first.
    /// Returns the file and, for a writable cache file, its cache inode (see
    /// [`Overlay::release_writer`]).
    pub fn open(&self, ctx: &Ctx, rel: &Path, flags: i32) -> FsResult<(File, Option<u64>)> {
        let class = self.policy.classify(rel);
        let flags = open_flags(flags) & !(libc::O_CREAT | libc::O_EXCL);
        if wants_write(flags) && class == PathClass::Cached {
            let truncating = flags & libc::O_TRUNC != 0;
            let prepared = if truncating {
                None
            } else {
                self.prepare_copy_up(rel)
            };
            let mut inner = self.lock();
            self.copy_up_of(&mut inner, rel, !truncating, ctx, None, prepared)?;
            return self.open_upper(&mut inner, rel, flags);
        }
        if class == PathClass::Passthrough {
            // The kernel has just looked it up: one round trip to the share, not two.
            return Ok((self.share.open_file(rel, flags, 0)?, None));
        }
        let found = self.resolve(rel)?;
        let (root, at) = self.place(found.layer, rel);
        Ok((root.open_file(&at, flags, 0)?, None))
    }

    /// Opens the cache's file at the cached path `rel` for writing (`flags` as kept by
    /// [`open_flags`]): marked dirty, and counted as a writer.
    fn open_upper(
        &self,
        inner: &mut Inner,
        rel: &Path,
        flags: i32,
    ) -> FsResult<(File, Option<u64>)> {
        self.mark_dirty(inner, rel)?;
        let file = self.cache.open_file(&up(rel), flags, 0)?;
        let ino = sys::fstat(&file)?.ino();
        *inner.writers.entry(ino).or_insert(0) += 1;
        Ok((file, Some(ino)))
    }

    /// [`Overlay::open`] of what a deferred handle `d` stands for, when [`Overlay::binding`]
    /// found it still on the share or copied up from it: a copy-up is made only from the
    /// object the handle has open. None when the name holds another object by now (the
    /// caller looks again).
    pub fn open_bound(
        &self,
        ctx: &Ctx,
        rel: &Path,
        flags: i32,
        d: Deferral,
    ) -> FsResult<Option<(File, Option<u64>)>> {
        let kept = open_flags(flags) & !(libc::O_CREAT | libc::O_EXCL);
        if !wants_write(kept) || self.policy.classify(rel) != PathClass::Cached {
            return self.open(ctx, rel, flags).map(Some);
        }
        let truncating = kept & libc::O_TRUNC != 0;
        let prepared = if truncating {
            None
        } else {
            self.prepare_copy_up(rel)
        };
        let mut inner = self.lock();
        let bound = if self.upper_stat(rel)?.is_some() {
            inner
                .state
                .origin(rel)
                .is_some_and(|o| (o.dev, o.ino) == d.object)
        } else {
            self.copy_up_of(&mut inner, rel, !truncating, ctx, Some(d.object), prepared)?
        };
        if !bound {
            return Ok(None);
        }
        self.open_upper(&mut inner, rel, kept).map(Some)
    }

    /// Whether the cache has no say on `rel` (not in the upper layer, not deleted); when
    /// it has none, whether the cache took `rel` over in this session.
    fn share_only(&self, rel: &Path) -> FsResult<Option<bool>> {
        let inner = self.lock();
        let say = self.upper_stat(rel)?.is_some() || inner.state.hidden(rel);
        Ok((!say).then(|| inner.state.taken_over(rel)))
    }

    /// [`Overlay::open`], except that opening (without O_TRUNC) a cached file that is
    /// still only on the share copies nothing yet, even for writing: the handle reads the
    /// share's copy, and [`Overlay::open`] with the same flags makes it writable at its
    /// first write (or follows the file to the cache when another handle wrote it). A program that opens a large file read-write and writes it rarely (SQLite
    /// opens its database so, and in WAL mode writes it only at checkpoints) then costs
    /// no copy at open. Returns the file, its writer registration, and what a deferred
    /// handle stands for.
    pub fn open_deferred(
        &self,
        ctx: &Ctx,
        rel: &Path,
        flags: i32,
    ) -> FsResult<(File, Option<u64>, Option<Deferral>)> {
        let f = open_flags(flags) & !(libc::O_CREAT | libc::O_EXCL);
        if f & libc::O_TRUNC == 0
            && self.policy.classify(rel) == PathClass::Cached
            && self.share_only(rel)?.is_some()
        {
            // The kernel has checked the access asked for (default_permissions). A
            // read-only open is deferred too: it follows the file to the cache once
            // another handle has written it there. One round trip to the share: the open,
            // then fstat on what it gave.
            let read_only = (f & !libc::O_ACCMODE & !libc::O_APPEND) | libc::O_RDONLY;
            match self.share.open_file(rel, read_only, 0) {
                // Still the share's, and a regular file: else the usual way below.
                Ok(file) => {
                    let meta = sys::fstat(&file)?;
                    if let (true, Some(taken_at_open)) = (meta.is_file(), self.share_only(rel)?) {
                        let d = Deferral {
                            object: (meta.dev(), meta.ino()),
                            taken_at_open,
                        };
                        return Ok((file, None, Some(d)));
                    }
                }
                // A write-only file: no reading it before it is written; the usual way.
                Err(e) if e.raw_os_error() == Some(libc::EACCES) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let (file, writer) = self.open(ctx, rel, flags)?;
        Ok((file, writer, None))
    }

    /// Where the share object a deferred handle has open is now under `rel`: still on the
    /// share, copied up from it, replaced here, or changed on the share by someone else.
    /// An error of the share other than "no such file" is returned (the name cannot be
    /// told).
    pub fn binding(&self, rel: &Path, d: Deferral) -> FsResult<Binding> {
        let found = match self.resolve(rel) {
            Ok(found) => Some(found),
            Err(e) if matches!(e.errno(), libc::ENOENT | libc::ENOTDIR) => None,
            Err(e) => return Err(e),
        };
        let inner = self.lock();
        let same = |f: &Found| (f.meta.dev(), f.meta.ino()) == d.object;
        Ok(match found {
            Some(f) if f.layer == Layer::Lower && same(&f) => Binding::Share,
            Some(f)
                if f.layer == Layer::Upper
                    && inner
                        .state
                        .origin(rel)
                        .is_some_and(|o| (o.dev, o.ino) == d.object) =>
            {
                Binding::Cache
            }
            _ if self.replaced_here(&inner, rel, d)? => Binding::Replaced,
            _ => Binding::Changed,
        })
    }

    /// Whether the cache took `rel` over since a handle `d` was opened (a rename over it,
    /// an unlink, a copy-up): its take-over is recorded now and was not then, or, taken
    /// over already then, the cache has a say on the name now.
    fn replaced_here(&self, inner: &Inner, rel: &Path, d: Deferral) -> io::Result<bool> {
        if !inner.state.taken_over(rel) {
            return Ok(false);
        }
        Ok(!d.taken_at_open || self.upper_stat(rel)?.is_some() || inner.state.hidden(rel))
    }

    /// Keeps the version a deferred handle `d` (flags `flags`) is about to write when
    /// another workstation changed the file under its name (see [`Binding::Changed`]):
    /// the handle's file is copied up to `rel` from `src` (its open file), with the object
    /// it had open as the base, so the next sync finds the conflict and keeps both versions.
    /// Returns the cache file opened with `flags` and its writer registration, or None when
    /// the cache took the name meanwhile (the caller looks again).
    pub fn keep_version(
        &self,
        ctx: &Ctx,
        rel: &Path,
        src: &File,
        d: Deferral,
        flags: i32,
    ) -> FsResult<Option<(File, Option<u64>)>> {
        let mut inner = self.lock();
        if self.upper_stat(rel)?.is_some()
            || inner.state.hidden(rel)
            || self.replaced_here(&inner, rel, d)?
        {
            return Ok(None);
        }
        let meta = sys::fstat(src)?;
        if (meta.dev(), meta.ino()) != d.object {
            return Err(errno(libc::EIO));
        }
        if let Some(parent) = rel.parent() {
            self.ensure_upper_dir(&inner, parent, ctx)?;
        }
        self.journal_copy_up(&mut inner, rel, &meta)?;
        let tmp = self.tmp_rel();
        let copied = self
            .copy_open_file(src, &meta, &tmp)
            .and_then(|()| self.install_synced(&tmp, &up(rel)));
        if let Err(e) = copied {
            let _ = remove_tree(&self.cache, &tmp);
            return Err(e.into());
        }
        tracing::warn!(
            path = %session::shown(rel),
            "the share's file changed under an open handle (another workstation?): its version is kept in the cache"
        );
        let flags = open_flags(flags) & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
        self.open_upper(&mut inner, rel, flags).map(Some)
    }

    /// A copy of the open file `src` (whose attributes are `meta`) at `dst` in the cache:
    /// data, mode, times, and the owner when we are root. Extended attributes stay behind
    /// (they are read by path, and the path holds another file now).
    fn copy_open_file(&self, src: &File, meta: &Stat, dst: &Path) -> io::Result<()> {
        let out =
            self.cache
                .open_file(dst, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600)?;
        sys::copy_data(src, &out, meta.len())?;
        if self.as_root {
            self.cache.chown(dst, Some(meta.uid()), Some(meta.gid()))?;
        }
        self.cache.chmod(dst, meta.mode() & 0o7777)?;
        self.cache
            .utimens(dst, at(meta.atime()), at(meta.mtime()))?;
        out.sync_all()
    }

    /// A private copy of an open file that no name shows (the handle of a file whose name
    /// now holds another): writes go there and are never synced, as to an unlinked file.
    pub fn detached_copy(&self, src: &File) -> FsResult<File> {
        let copy =
            self.cache
                .open_file(Path::new("work"), libc::O_TMPFILE | libc::O_RDWR, 0o600)?;
        sys::copy_data(src, &copy, sys::fstat(src)?.len())?;
        Ok(copy)
    }

    /// How many copy-ups this mount has made (see [`Overlay::open_deferred`]).
    pub fn copy_up_count(&self) -> u64 {
        self.copy_ups.load(Ordering::Acquire)
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

    /// A new cached object was marked dirty but could not be made: drop the mark and put
    /// back the whiteout it cleared, so a deleted share copy stays hidden.
    fn undo_new(&self, inner: &mut Inner, rel: &Path, was_whiteout: bool, e: io::Error) -> FsError {
        let undo = Record::Delete {
            path: rel.to_path_buf(),
            whiteout: was_whiteout,
        };
        match self.record(inner, &[undo]) {
            Ok(()) => e.into(),
            Err(journal) => journal,
        }
    }

    /// Creates a new object `name` in `parent` with `make`, which gets the root and the
    /// path below it.
    fn make_node(
        &self,
        ctx: &Ctx,
        parent: &Path,
        name: &OsStr,
        make: impl FnOnce(&Root, &Path) -> io::Result<()>,
    ) -> FsResult<Found> {
        let rel = parent.join(name);
        if self.policy.classify(&rel) == PathClass::Passthrough {
            // Straight to the share, no lock held while it answers (the share refuses an
            // existing name itself: O_EXCL, mkdir, symlink, mknod).
            if !self.resolve(parent)?.meta.is_dir() {
                return Err(errno(libc::ENOTDIR));
            }
            make(&self.share, &rel)?;
            self.chown_new(&self.share, &rel, ctx)?;
            return self.resolve_share(&rel);
        }
        let mut inner = self.lock();
        self.check_parent(&inner, parent)?;
        if self.resolve_locked(&inner, &rel).is_ok() {
            return Err(errno(libc::EEXIST));
        }
        match self.policy.classify(&rel) {
            PathClass::Passthrough => {
                make(&self.share, &rel)?;
                self.chown_new(&self.share, &rel, ctx)?;
            }
            PathClass::LocalOnly => {
                self.ensure_upper_dir(&inner, parent, ctx)?;
                make(&self.cache, &up(&rel))?;
                self.chown_new(&self.cache, &up(&rel), ctx)?;
            }
            PathClass::Cached => {
                self.ensure_upper_dir(&inner, parent, ctx)?;
                let was_whiteout = inner.state.is_whiteout(&rel);
                // The take-over and the mark, in one journal append (one fdatasync).
                let mut records = self.take_over(&inner, &rel)?;
                if !inner.state.is_dirty(&rel) {
                    records.push(Record::Dirty(rel.clone()));
                }
                if !records.is_empty() {
                    self.record(&mut inner, &records)?;
                }
                inner.touched.insert(rel.clone());
                if let Err(e) = make(&self.cache, &up(&rel)) {
                    return Err(self.undo_new(&mut inner, &rel, was_whiteout, e));
                }
                self.chown_new(&self.cache, &up(&rel), ctx)?;
            }
        }
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
        let perm = mode & 0o7777 & !ctx.umask;
        if self.policy.classify(&rel) == PathClass::Passthrough {
            // Straight to the share: made, or found there (the share tells which); its
            // attributes from the open file. No lock held while the share answers.
            let made = creation_flags(flags);
            let (file, writer) = match self.share.open_file(&rel, made, perm) {
                Ok(file) => {
                    if self.as_root {
                        self.chown_new(&self.share, &rel, ctx)?;
                    }
                    (file, None)
                }
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) && flags & libc::O_EXCL == 0 => {
                    self.open(ctx, &rel, flags)?
                }
                Err(e) => return Err(e.into()),
            };
            let meta = sys::fstat(&file)?;
            let found = Found {
                layer: Layer::Share,
                meta,
            };
            return Ok((found, file, writer));
        }
        if self.resolve(&rel).is_ok() {
            if flags & libc::O_EXCL != 0 {
                return Err(errno(libc::EEXIST));
            }
            let (file, writer) = self.open(ctx, &rel, flags)?;
            return Ok((self.resolve(&rel)?, file, writer));
        }
        let mut file = None;
        let found = self.make_node(ctx, parent, name, |root, at| {
            file = Some(root.open_file(at, creation_flags(flags), perm)?);
            Ok(())
        })?;
        let file = file.ok_or_else(|| errno(libc::EIO))?;
        let writer =
            if found.layer == Layer::Upper && self.policy.classify(&rel) == PathClass::Cached {
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
        self.make_node(ctx, parent, name, |root, at| {
            root.mkdir(at, perm)?;
            // mkdir masks with our umask (0) only; set the exact bits (sticky, setgid).
            root.chmod(
                at,
                perm | (root
                    .stat(at)?
                    .map(|m| m.mode() & libc::S_ISGID)
                    .unwrap_or(0)),
            )
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
        self.make_node(ctx, parent, name, |root, at| root.mknod(at, mode, rdev))
    }

    pub fn symlink(
        &self,
        ctx: &Ctx,
        parent: &Path,
        name: &OsStr,
        target: &Path,
    ) -> FsResult<Found> {
        self.make_node(ctx, parent, name, |root, at| root.symlink(target, at))
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
        match class {
            PathClass::Passthrough => self.share.link(src, &rel)?,
            PathClass::LocalOnly => {
                self.ensure_upper_dir(&inner, parent, ctx)?;
                self.cache.link(&up(src), &up(&rel))?;
            }
            PathClass::Cached => {
                if self.resolve_locked(&inner, src)?.meta.is_dir() {
                    return Err(errno(libc::EPERM));
                }
                self.copy_up(&mut inner, src, true, ctx)?;
                self.ensure_upper_dir(&inner, parent, ctx)?;
                self.mark_dirty(&mut inner, src)?;
                let was_whiteout = inner.state.is_whiteout(&rel);
                let bases = self.take_over(&inner, &rel)?;
                if !bases.is_empty() {
                    self.record(&mut inner, &bases)?;
                }
                self.mark_dirty(&mut inner, &rel)?;
                if let Err(e) = self.cache.link(&up(src), &up(&rel)) {
                    return Err(self.undo_new(&mut inner, &rel, was_whiteout, e));
                }
                // Both names share the source's share identity.
                if let Some(o) = inner.state.origin(src) {
                    self.record(&mut inner, &[Record::Origin(rel.clone(), o)])?;
                }
            }
        }
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
        if self.policy.classify(&rel) == PathClass::Passthrough {
            let found = self.resolve_share(&rel)?;
            match (dir, found.meta.is_dir()) {
                (true, false) => return Err(errno(libc::ENOTDIR)),
                (false, true) => return Err(errno(libc::EISDIR)),
                (true, true) => self.share.rmdir(&rel)?,
                (false, false) => self.share.unlink(&rel)?,
            }
            return Ok(());
        }
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
            let (root, at) = self.place(found.layer, &rel);
            if dir {
                root.rmdir(&at)?;
            } else {
                root.unlink(&at)?;
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
        let mut records = vec![Record::Delete {
            path: rel.clone(),
            whiteout,
        }];
        if whiteout {
            // What we mean to delete on the share (unless an earlier take-over recorded
            // what the user started from): a later change there is a conflict.
            records.extend(self.take_over(&inner, &rel)?);
        }
        self.record(&mut inner, &records)?;
        if self.upper_stat(&rel)?.is_some() {
            if dir {
                self.cache.rmdir(&up(&rel))?;
            } else {
                self.cache.unlink(&up(&rel))?;
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
        if class == PathClass::Passthrough {
            // No overlay state: no lock held while the share answers.
            self.share.rename(&from, &to, flags)?;
            return Ok(());
        }
        if class == PathClass::LocalOnly {
            let mut inner = self.lock();
            self.ensure_upper_dir(&inner, to_parent, ctx)?;
            self.cache.rename(&up(&from), &up(&to), flags)?;
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
        // Two names of one file: POSIX rename does nothing.
        if let Some(d) = &dst {
            if d.layer == src.layer
                && d.meta.dev() == src.meta.dev()
                && d.meta.ino() == src.meta.ino()
            {
                return Ok(());
            }
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
        let below = self.upper_below(&from)?;
        // A directory moved while a sync runs may be on its way to the share, with what
        // was below it: the old names stay hidden each on its own, so that a directory
        // made at the old name later does not show what the sync put below it (and the
        // next sync deletes them on the share). Without a sync running, a directory that
        // may move has nothing on the share (one that has is not moved here: EXDEV).
        let hidden_below: Vec<PathBuf> = if self.sync_running.load(Ordering::Acquire) {
            below
                .iter()
                .filter(|p| inner.state.is_dirty(p))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        // Everything the cache holds below a moved directory is new at its new name, also
        // what an earlier sync sent under the old one (a clean copy).
        let moved: Vec<PathBuf> = below
            .iter()
            .map(|m| crate::state::reroot(m, &from, &to))
            .collect();
        // Take-overs first: the target (what the user replaces there), and every path that
        // moves below it.
        let mut records: Vec<Record> = Vec::new();
        records.extend(self.take_over(&inner, &to)?);
        for there in &moved {
            records.extend(self.take_over(&inner, there)?);
        }
        if whiteout_from {
            records.extend(self.take_over(&inner, &from)?);
        }
        for p in &hidden_below {
            records.extend(self.take_over(&inner, p)?);
        }
        // Write-ahead: the target and what moves below it are dirty before the cache
        // changes, so a crash in between leaves a journal that sends them.
        let dirty: Vec<Record> = std::iter::once(to.clone())
            .chain(moved)
            .map(Record::Dirty)
            .collect();
        records.extend(dirty.iter().cloned());
        self.record(&mut inner, &records)?;
        self.cache.rename(&up(&from), &up(&to), 0)?;
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
        records.extend(hidden_below.into_iter().map(|path| Record::Delete {
            path,
            whiteout: true,
        }));
        records.extend(dirty);
        self.record(&mut inner, &records)?;
        inner.touched.insert(to);
        Ok(())
    }

    /// Every path the cache holds strictly below `rel` (nothing for a file).
    fn upper_below(&self, rel: &Path) -> io::Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        let mut stack = vec![rel.to_path_buf()];
        while let Some(dir) = stack.pop() {
            if !self.upper_stat(&dir)?.is_some_and(|m| m.is_dir()) {
                continue;
            }
            for (name, _, _) in self.cache.read_dir(&up(&dir))? {
                let child = dir.join(name);
                stack.push(child.clone());
                out.push(child);
            }
        }
        Ok(out)
    }

    /// Changes attributes (chmod, chown, truncate, utimens). `file` is the open handle's
    /// file when the kernel gave one; it is used when the path is gone (unlinked while open).
    pub fn setattr(
        &self,
        ctx: &Ctx,
        rel: &Path,
        attr: SetAttr,
        file: Option<&File>,
    ) -> FsResult<Stat> {
        let keep_data = attr.size != Some(0);
        let prepared = if keep_data && file.is_none() {
            self.prepare_copy_up(rel)
        } else {
            None
        };
        let mut inner = self.lock();
        let mut found = match (self.resolve_locked(&inner, rel), file) {
            (Ok(f), _) => f,
            (Err(e), Some(f)) if e.errno() == libc::ENOENT => {
                drop(inner);
                return Self::setattr_fd(f, attr);
            }
            (Err(e), _) => return Err(e),
        };
        if self.policy.classify(rel) == PathClass::Cached {
            self.copy_up_of(&mut inner, rel, keep_data, ctx, None, prepared)?;
            self.mark_dirty(&mut inner, rel)?;
            found = self.resolve_locked(&inner, rel)?;
        }
        let (root, at) = self.place(found.layer, rel);
        if attr.uid.is_some() || attr.gid.is_some() {
            root.chown(&at, attr.uid, attr.gid)?;
        }
        if let Some(mode) = attr.mode {
            if !found.meta.is_symlink() {
                root.chmod(&at, mode & 0o7777)?;
            }
        }
        if let Some(size) = attr.size {
            // A writable handle of a cached file always points into the cache.
            match file {
                Some(f) => f.set_len(size)?,
                None => root.open_file(&at, libc::O_WRONLY, 0)?.set_len(size)?,
            }
        }
        if attr.atime.is_some() || attr.mtime.is_some() {
            root.utimens(
                &at,
                attr.atime.unwrap_or(SetTime::Omit),
                attr.mtime.unwrap_or(SetTime::Omit),
            )?;
        }
        Ok(self.resolve_locked(&inner, rel)?.meta)
    }

    /// setattr through an open file whose name is gone.
    fn setattr_fd(f: &File, attr: SetAttr) -> FsResult<Stat> {
        use std::os::unix::fs::PermissionsExt;
        if attr.uid.is_some() || attr.gid.is_some() {
            std::os::unix::fs::fchown(f, attr.uid, attr.gid)?;
        }
        if let Some(mode) = attr.mode {
            f.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))?;
        }
        if let Some(size) = attr.size {
            f.set_len(size)?;
        }
        if attr.atime.is_some() || attr.mtime.is_some() {
            sys::futimens(
                f,
                attr.atime.unwrap_or(SetTime::Omit),
                attr.mtime.unwrap_or(SetTime::Omit),
            )?;
        }
        Ok(sys::fstat(f)?)
    }

    pub fn readlink(&self, rel: &Path) -> FsResult<PathBuf> {
        let found = self.resolve(rel)?;
        let (root, at) = self.place(found.layer, rel);
        Ok(root.readlink(&at)?)
    }

    pub fn getxattr(&self, rel: &Path, name: &OsStr) -> FsResult<Vec<u8>> {
        let found = self.resolve(rel)?;
        let (root, at) = self.place(found.layer, rel);
        Ok(root.getxattr(&at, name)?)
    }

    pub fn listxattr(&self, rel: &Path) -> FsResult<Vec<OsString>> {
        let found = self.resolve(rel)?;
        let (root, at) = self.place(found.layer, rel);
        Ok(root.listxattr(&at)?)
    }

    /// Where a metadata write on `rel` lands (copied up first if cached).
    fn writable_place(&self, ctx: &Ctx, rel: &Path) -> FsResult<(&Root, PathBuf)> {
        if self.policy.classify(rel) == PathClass::Passthrough {
            self.resolve_share(rel)?;
            return Ok(self.place(Layer::Share, rel));
        }
        let prepared = self.prepare_copy_up(rel);
        let mut inner = self.lock();
        let found = self.resolve_locked(&inner, rel)?;
        if self.policy.classify(rel) == PathClass::Cached {
            self.copy_up_of(&mut inner, rel, true, ctx, None, prepared)?;
            self.mark_dirty(&mut inner, rel)?;
            return Ok((&self.cache, up(rel)));
        }
        Ok(self.place(found.layer, rel))
    }

    pub fn setxattr(
        &self,
        ctx: &Ctx,
        rel: &Path,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> FsResult<()> {
        let (root, at) = self.writable_place(ctx, rel)?;
        Ok(root.setxattr(&at, name, value, flags)?)
    }

    pub fn removexattr(&self, ctx: &Ctx, rel: &Path, name: &OsStr) -> FsResult<()> {
        // Look first, so a missing attribute does not copy the file up.
        self.getxattr(rel, name)?;
        let (root, at) = self.writable_place(ctx, rel)?;
        Ok(root.removexattr(&at, name)?)
    }

    pub fn statfs(&self) -> FsResult<fsinfo::FsStats> {
        Ok(fsinfo::statfs(self.share.path())?)
    }

    /// Counts for `ccfs status`: dirty objects, their bytes, pending deletions.
    pub fn pending(&self) -> (usize, u64, usize) {
        let inner = self.lock();
        let mut bytes = 0;
        for p in inner.state.dirty() {
            if let Ok(Some(m)) = self.upper_stat(p) {
                if m.is_file() {
                    bytes += m.len();
                }
            }
        }
        (
            inner.state.dirty_count(),
            bytes,
            inner.state.whiteout_count(),
        )
    }
}
