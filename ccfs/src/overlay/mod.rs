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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{errno, FsError, FsResult};
use crate::gate;
use crate::journal::{Durability, Journal, Ticket};
use crate::locks::Locked;
use crate::policy::{PathClass, Policy};
use crate::state::{Origin, OverlayState, Record};
use crate::sys::{self, DirAt, Root, SetTime, Stat};

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

/// What the share held at a name, asked without the overlay's lock (see
/// [`Overlay::look_before_lock`]), and how many syncs had started then.
#[derive(Debug, Clone)]
pub(super) struct ShareLook {
    syncs: u64,
    /// None: not asked, or the share did not answer.
    seen: Option<Option<Stat>>,
}

/// A share look, made by a lookup or a change at a cached name, that found nothing
/// there: kept for the change of the same name that follows within [`RECENT_LOOK`] (see
/// [`Overlay::recent_look`]).
#[derive(Debug, Clone)]
struct RecentLook {
    /// When it was asked (taken before the share answered).
    at: std::time::Instant,
    syncs: u64,
}

/// How long a share look answers a change of the same cached name that follows it (the
/// kernel looks a name up just before it creates, renames or removes it; a program
/// writes a temporary file and renames it over the old one right after), unless
/// [`Overlay::set_recent_look`] says otherwise.
const RECENT_LOOK: std::time::Duration = std::time::Duration::from_secs(1);

/// At most this many looks are kept (see [`Overlay::remember_look`]).
const RECENT_LOOKS_MAX: usize = 4096;

impl ShareLook {
    /// Nothing asked: the change asks the share under the lock.
    fn none() -> Self {
        ShareLook {
            syncs: 0,
            seen: None,
        }
    }
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

pub use blocks::BlockFile;
pub use open_file::{FileFailed, FileIo, OpenFile};
pub use send_files::{FilesSent, Staged, StagedFiles};
pub use session::{Conflict, ConflictKind, Emptied, SyncSession, Transfer};

mod attrs;
mod blocks;
mod copy_up;
mod fill;
use copy_up::Data;
mod handles;
mod listing;
mod lookup;
mod namespace;
mod open_file;
mod racy;
mod rename;
mod send_blocks;
mod send_files;
mod session;
mod snapshot;
mod sparse;

#[cfg(test)]
mod blocks_base_tests;
#[cfg(test)]
mod blocks_tests;
#[cfg(test)]
mod crash_tests;
#[cfg(test)]
mod fill_tests;
#[cfg(test)]
mod interleave_tests;
#[cfg(test)]
mod journal_failure_tests;
#[cfg(test)]
mod send_files_tests;
#[cfg(test)]
mod test_support;

use lookup::{spawn_root_look, RootAsk};

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
    /// Names whose change is under way without the lock (see [`InFlight`]).
    in_flight: Vec<PathBuf>,
    /// The write-ahead records of changes under way, written to the journal and not yet
    /// in the state (they join it once on disk), by change.
    ahead: HashMap<u64, Vec<Record>>,
    /// Numbers the changes under way.
    flights: u64,
    /// The files the running sync handed to rsync (see [`sync_holds`]).
    handed: HashSet<PathBuf>,
    /// Takers of [`Overlay::lock`] waiting for every change under way to end: no new
    /// change starts meanwhile (a sync is not starved by changes that overlap).
    draining: usize,
    /// When each clean copy was last found to be what the share still holds (see
    /// [`Overlay::revalidate`]).
    validated: HashMap<PathBuf, std::time::Instant>,
    /// The names this session gave cache files by `link`, by cache inode: when they are
    /// all of a file's other names, an unlink or a rename over one of its names need not
    /// look through the whole cache for them (see [`Overlay::other_names_changed`]).
    linked: HashMap<u64, Vec<PathBuf>>,
}

/// Cache inodes [`Inner::linked`] remembers at most (past that it starts again: the walk
/// through the cache finds what it forgot).
const LINKED_MAX: usize = 65_536;

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
    /// Lock order: 6 (ARCHITECTURE.md, Locks): what runs under it and what does not is
    /// written there.
    inner: Mutex<Inner>,
    /// Signalled when a change under way lets go of its names (see [`InFlight`]).
    settled: std::sync::Condvar,
    /// See [`Overlay::with_write_access`]. Lock order: 7, held for the cache's chmod
    /// and rename of one moment.
    write_access: Mutex<()>,
    tmp_seq: AtomicU64,
    /// Asks the share for its root's attributes on a thread of its own (see
    /// [`Overlay::share_root`]).
    root_look: std::sync::mpsc::Sender<RootAsk>,
    as_root: bool,
    sync_running: AtomicBool,
    /// Syncs started so far, and changes this mount made to the share at cached names
    /// outside a sync ([`Overlay::forget_looks`]): a share look made without the lock
    /// stands only if none started since (see [`Overlay::look_before_lock`]).
    syncs_started: AtomicU64,
    /// The FUSE requests this mount served (see [`crate::counters`]).
    pub requests: crate::counters::Requests,
    /// Copy-ups so far: a deferred handle (see [`Overlay::open_deferred`]) that sees it
    /// change checks whether its file moved to the cache.
    copy_ups: AtomicU64,
    /// The journal's group commit (see [`Overlay::durable`]).
    durability: std::sync::Arc<Durability>,
    /// How many times [`Overlay::inner`] was taken: every change to the cache's say on a
    /// path (its objects, whiteouts) happens under it, so a reader that sees this count
    /// unchanged since its look knows that nothing changed meanwhile.
    holds: AtomicU64,
    /// How long a clean copy found to match the share is trusted before the share is
    /// asked again, in milliseconds (see [`Overlay::revalidate`]); 0: at every look.
    revalidate_after_ms: AtomicU64,
    /// Bytes of clean copies a logout keeps for the next login (see
    /// [`Overlay::drop_clean_cache`]).
    keep_copies: AtomicU64,
    /// Share looks at cached names of the last [`RECENT_LOOK`], by name (see
    /// [`Overlay::recent_look`]). Lock order: 12, a leaf.
    recent_looks: Mutex<HashMap<PathBuf, RecentLook>>,
    /// How long a kept look answers, in milliseconds (see [`Overlay::set_recent_look`]).
    recent_look_ms: AtomicU64,
    /// The share is an NFS mount: a clean copy's look at it opens the file (see
    /// [`Overlay::share_look`]).
    share_is_nfs: AtomicBool,
    /// Whether the filesystem of each device the share's files were found on has
    /// something to do at a close (see [`Overlay::close_reaches_share`]): the share's
    /// root's, and any mounted below it. Lock order: 19c, a leaf.
    acts_at_close: Mutex<HashMap<u64, bool>>,
    /// How many files of the share the handles hold open (see [`Overlay::share_files_open`]).
    share_files: Arc<AtomicUsize>,
    /// The cache's device: a file on another one is the share's.
    cache_dev: u64,
    /// The share's clock as last told (see [`racy`]). Lock order: 13, a leaf.
    share_clock: Mutex<Option<racy::ShareClock>>,
    /// The name of this workstation as the last sync was given it (see
    /// `send_files::copy_name`); empty before any. A leaf lock.
    sync_host: Mutex<String>,
    /// The files held by block that a handle has used, by path (see [`blocks`]). Lock
    /// order: 14, a leaf.
    block_files: Mutex<HashMap<PathBuf, std::sync::Arc<BlockFile>>>,
    /// A cached file at least this long taken over from the share is held by block (see
    /// [`blocks`]); 0: none is.
    by_block_from: AtomicU64,
}

/// A change whose write-ahead records wait for the disk, and whose change to the cache
/// follows, without the overlay's lock: other changes go on meanwhile (one `fdatasync`
/// serves them all, see [`Overlay::durable`]). Its records are in the journal, not yet in
/// the state (they join it once on disk: a change whose records did not reach the disk
/// did not happen), and its names are reserved until it ends: whoever needs the state
/// and the cache to agree on one of the names, a directory above them or a name below
/// them waits ([`Overlay::lock_for`]); a sync, a listing of the root, and every other use
/// of [`Overlay::lock`] wait for all. Lock order: a change reserves its names under the
/// lock and waits for nothing else while it holds them.
pub(super) struct InFlight<'a> {
    overlay: &'a Overlay,
    names: Vec<PathBuf>,
    /// Its records waiting for the disk (in [`Inner::ahead`]), and the journal's ticket.
    id: u64,
    ticket: Ticket,
    /// Ended, or given up.
    done: bool,
}

impl InFlight<'_> {
    /// Waits without the lock until the change's records are on disk. When they cannot
    /// be, the change is given up: its records never join the state (the journal, which
    /// must be rewritten whole after a failed `fdatasync`, is rewritten now from the
    /// state without them) and its names are freed.
    pub(super) fn durable(mut self) -> FsResult<Self> {
        let t = self.ticket;
        match self.overlay.durable(t) {
            Ok(()) => Ok(self),
            Err(e) => {
                // Under the lock, which every rewrite of the journal holds: a rewrite made
                // since the failure (by another change it failed for too) wrote these
                // records with the rest, and they are on disk: the change goes on.
                let mut inner = self.overlay.lock_any();
                if self.overlay.durability.is_durable(t) {
                    return Ok(self);
                }
                inner.ahead.remove(&self.id);
                let _ = self.overlay.rewrite_if_needed(&mut inner);
                self.finish(&mut inner);
                Err(e)
            }
        }
    }

    /// The change is done (or failed after its records were on disk): the records join
    /// the state, and the names are free again (under the lock it finishes with).
    pub(super) fn end(mut self, inner: &mut Inner) {
        self.finish(inner);
    }

    fn finish(&mut self, inner: &mut Inner) {
        self.done = true;
        if let Some(records) = inner.ahead.remove(&self.id) {
            for r in &records {
                inner.state.apply(r);
            }
            self.overlay.applied(&records);
        }
        Self::free(inner, std::mem::take(&mut self.names));
        self.overlay.settled.notify_all();
    }

    fn free(inner: &mut Inner, names: Vec<PathBuf>) {
        for n in names {
            if let Some(i) = inner.in_flight.iter().position(|r| *r == n) {
                inner.in_flight.swap_remove(i);
            }
        }
    }
}

impl Drop for InFlight<'_> {
    /// A change that failed on its way after its records reached the disk: they join the
    /// state all the same (the cache may be behind them: as after a crash there).
    fn drop(&mut self) {
        if !self.done {
            let mut inner = self.overlay.lock_any();
            self.finish(&mut inner);
        }
    }
}

fn is_not_supported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOTSUP) | Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::ENODATA)
    )
}

/// Whether `rel` names the directory a running sync's rsync holds its files in on the share
/// until it puts them in place ([`crate::rsync::PARTIAL_DIR`]): it is never part of the
/// merged view of a cached directory (a listing during a sync would show it, and an rmdir
/// of a directory that is empty here would fail).
fn is_sync_holding(rel: &Path) -> bool {
    rel.file_name()
        .is_some_and(|n| n == OsStr::new(crate::rsync::PARTIAL_DIR))
}

/// Whether a listing of a cached directory leaves out `rel`: the running sync's holding
/// directory, or the temporary file rsync writes a file this sync handed it into
/// (`.NAME.XXXXXX` beside `NAME`, renamed into the holding directory once whole), which
/// `rsync_temp` says the share's object looks like (a regular file of mode 0600, as rsync
/// makes it until it is whole). Neither is the user's: a listing during a sync would show
/// a file half written, and an `rm -r` of a directory emptied here would fail. A lookup by
/// name shows whatever the share has: a name is never hidden by its look alone (a user's
/// own `.app.backup` beside `app` is no temporary file, and a program that found it
/// missing would write it anew).
fn sync_holds(inner: &Inner, rel: &Path, rsync_temp: bool) -> bool {
    is_sync_holding(rel)
        || (rsync_temp
            && !inner.handed.is_empty()
            && rsync_temp_of(rel).is_some_and(|of| inner.handed.contains(&of)))
}

/// The databases of those of `names` that are a database's journal or WAL: a change of
/// one may record the database's base, so the database's name goes with it (see
/// [`Overlay::lock_for`], [`Overlay::in_flight`]).
fn databases_of<'a>(names: impl Iterator<Item = &'a Path>) -> Vec<PathBuf> {
    names
        .filter_map(|n| session::database_of(n).map(|(db, _)| db))
        .collect()
}

/// The file `rel` would be rsync's temporary file of, by its name (`.NAME.XXXXXX`).
pub(super) fn rsync_temp_of(rel: &Path) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let name = rel.file_name()?.as_bytes();
    let (head, tail) = name.split_at(name.len().checked_sub(7)?);
    let of = head.strip_prefix(b".")?;
    let random = tail.strip_prefix(b".")?;
    if of.is_empty() || !random.iter().all(u8::is_ascii_alphanumeric) {
        return None;
    }
    Some(rel.with_file_name(OsStr::from_bytes(of)))
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
    // A directory its owner may not read, search or write (a cache copy that took such
    // a mode from the share) is opened up for the moment of the emptying.
    let locked = mode & libc::S_IRWXU != libc::S_IRWXU;
    if locked {
        root.chmod(rel, mode | libc::S_IRWXU)?;
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
        let durability = journal.durability();
        let gate = std::sync::Arc::new(crate::gate::ShareGate::default());
        let share = Root::open_gated(share, gate.clone())?;
        let share_meta = share
            .stat(Path::new(""))?
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let share_type = fsinfo::statfs(share.path()).map(|s| s.fs_type).ok();
        // NFS_SUPER_MAGIC
        let share_is_nfs = share_type == Some(0x6969);
        let acts_at_close = HashMap::from([(
            share_meta.dev(),
            !share_type.is_some_and(fsinfo::nothing_at_close),
        )]);
        let cache_dev = cache
            .stat(Path::new(""))?
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?
            .dev();
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
                in_flight: Vec::new(),
                ahead: HashMap::new(),
                flights: 0,
                handed: HashSet::new(),
                draining: 0,
                validated: HashMap::new(),
                linked: HashMap::new(),
            }),
            settled: std::sync::Condvar::new(),
            write_access: Mutex::new(()),
            tmp_seq: AtomicU64::new(0),
            root_look,
            as_root: sys::geteuid() == 0,
            sync_running: AtomicBool::new(false),
            syncs_started: AtomicU64::new(0),
            revalidate_after_ms: AtomicU64::new(0),
            keep_copies: AtomicU64::new(u64::MAX),
            requests: crate::counters::Requests::default(),
            copy_ups: AtomicU64::new(0),
            durability,
            holds: AtomicU64::new(0),
            recent_looks: Mutex::new(HashMap::new()),
            recent_look_ms: AtomicU64::new(RECENT_LOOK.as_millis() as u64),
            share_clock: Mutex::new(None),
            sync_host: Mutex::new(String::new()),
            share_is_nfs: AtomicBool::new(share_is_nfs),
            acts_at_close: Mutex::new(acts_at_close),
            share_files: Arc::new(AtomicUsize::new(0)),
            cache_dev,
            block_files: Mutex::new(HashMap::new()),
            by_block_from: AtomicU64::new(0),
        };
        // The cache's root stands for the share's root (rsync may copy its attributes);
        // the cache directory around it stays private.
        overlay.copy_meta(
            &overlay.share,
            Path::new(""),
            &share_meta,
            Path::new("upper"),
        )?;
        overlay.finish_interrupted_removals()?;
        overlay.blocks_after_a_crash()?;
        Ok(overlay)
    }

    /// A crash between a removal's journal record and the removal in the cache (see
    /// `namespace::remove`) leaves the cache's object under a name the journal deleted. The
    /// removal is finished now: the cache's copy is no longer marked changed, and left there
    /// it would keep the sync from deleting the share's copy, then be dropped unsent, so
    /// that the share's older version came back (neither the file as it was nor deleted).
    fn finish_interrupted_removals(&self) -> io::Result<()> {
        let inner = self.lock();
        let deleted: Vec<PathBuf> = inner
            .state
            .whiteouts()
            .filter(|p| !inner.state.is_dirty(p))
            .cloned()
            .collect();
        for p in deleted {
            let Some(meta) = self.upper_stat(&p)? else {
                continue;
            };
            tracing::info!(path = %session::shown(&p), "finishing a removal a crash interrupted");
            if !meta.is_dir() {
                self.cache.unlink(&up(&p))?;
                continue;
            }
            match self.cache.rmdir(&up(&p)) {
                Ok(()) => {}
                // Not what a removal leaves (an rmdir is of an empty directory): kept.
                Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {
                    tracing::warn!(path = %session::shown(&p), "a deleted directory still holds files in the cache; kept");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
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

    /// The lock, once no change is under way without it (see [`InFlight`]): the state and
    /// the cache then agree on every name.
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.lock_for(&[Path::new("")])
    }

    /// The lock, once no change under way without it (see [`InFlight`]) is of one of
    /// `names`, of a directory above one, or of a name below one: the state and the cache
    /// then agree on all of them, while changes to other names go on.
    pub(super) fn lock_for(&self, names: &[&Path]) -> MutexGuard<'_, Inner> {
        let all = names.iter().any(|n| n.as_os_str().is_empty());
        let databases = databases_of(names.iter().copied());
        let mut inner = self.inner.locked();
        let busy = |inner: &Inner| {
            inner.in_flight.iter().any(|r| {
                names
                    .iter()
                    .copied()
                    .chain(databases.iter().map(PathBuf::as_path))
                    .any(|n| r.starts_with(n) || n.starts_with(r))
            })
        };
        if all && busy(&inner) {
            inner.draining += 1;
            while busy(&inner) {
                inner = crate::locks::wait(&self.settled, inner);
            }
            inner.draining -= 1;
            // Those that waited for this one to get through may go on.
            self.settled.notify_all();
        } else {
            while busy(&inner) || (!all && inner.draining > 0) {
                inner = crate::locks::wait(&self.settled, inner);
            }
        }
        self.holds.fetch_add(1, Ordering::SeqCst);
        inner
    }

    /// The lock whatever is under way: for what concerns no name (writers' accounting),
    /// and for the change under way itself (see [`InFlight`]).
    pub(super) fn lock_any(&self) -> MutexGuard<'_, Inner> {
        let inner = self.inner.locked();
        self.holds.fetch_add(1, Ordering::SeqCst);
        inner
    }

    /// Writes `records` (write-ahead: not in the state until they are on disk) and
    /// reserves `names` for a change that goes on without the lock (see [`InFlight`]).
    /// The caller took the lock with [`Overlay::lock_for`] on the same names. With no
    /// records, the change waits for those written so far (a state it relied on).
    pub(super) fn in_flight(
        &self,
        inner: &mut Inner,
        mut names: Vec<PathBuf>,
        records: Vec<Record>,
    ) -> FsResult<InFlight<'_>> {
        // With a journal or WAL, its database ([`Overlay::lock_for`] waited for it too).
        names.extend(databases_of(names.iter().map(PathBuf::as_path)));
        self.rewrite_if_needed(inner)?;
        let ticket = if records.is_empty() {
            inner.journal.written()
        } else {
            inner.journal.write(&records).map_err(FsError::Journal)?
        };
        inner.flights += 1;
        let id = inner.flights;
        if !records.is_empty() {
            inner.ahead.insert(id, records);
        }
        inner.in_flight.extend(names.iter().cloned());
        Ok(InFlight {
            overlay: self,
            names,
            id,
            ticket,
            done: false,
        })
    }

    /// The count of holds of the lock so far (see [`Overlay::holds`]): read while holding
    /// it, it tells later whether anyone took the lock since.
    fn holds_now(&self) -> u64 {
        self.holds.load(Ordering::SeqCst)
    }

    fn tmp_rel(&self) -> PathBuf {
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        PathBuf::from(format!("work/tmp-{}-{n}", std::process::id()))
    }

    /// Journals `records` durably (write-ahead: on disk before the cache changes), then
    /// applies them to the state.
    fn record(&self, inner: &mut Inner, records: &[Record]) -> FsResult<()> {
        self.rewrite_if_needed(inner)?;
        inner.journal.append(records).map_err(FsError::Journal)?;
        for r in records {
            inner.state.apply(r);
        }
        self.applied(records);
        Ok(())
    }

    /// Journals `records` without waiting for the disk and applies them; the change that
    /// made them waits with [`Overlay::durable`] for the ticket after it let go of the
    /// lock, before it answers. Only where a crash before the records are on disk loses
    /// nothing (see [`Journal::write`]).
    fn record_deferred(&self, inner: &mut Inner, records: &[Record]) -> FsResult<Ticket> {
        self.rewrite_if_needed(inner)?;
        let t = inner.journal.write(records).map_err(FsError::Journal)?;
        for r in records {
            inner.state.apply(r);
        }
        self.applied(records);
        Ok(t)
    }

    /// Where the records written so far end, for a change that relies on them without
    /// writing one (a path already dirty). After a failed `fdatasync` the journal is
    /// rewritten first, so that such a change does not fail until another one writes.
    fn written(&self, inner: &mut Inner) -> FsResult<Ticket> {
        self.rewrite_if_needed(inner)?;
        Ok(inner.journal.written())
    }

    /// After a failed `fdatasync`: the journal written whole (the state holds every record
    /// written), before anything else is added.
    fn rewrite_if_needed(&self, inner: &mut Inner) -> FsResult<()> {
        if inner.journal.needs_rewrite() {
            self.rewrite(inner)?;
        }
        Ok(())
    }

    /// The journal written whole: the state, and the write-ahead records of the changes
    /// under way (written before, and counted on disk once the rewrite is).
    fn rewrite(&self, inner: &mut Inner) -> FsResult<()> {
        let Inner {
            state,
            journal,
            ahead,
            ..
        } = inner;
        let written = if ahead.is_empty() {
            journal.compact(state)
        } else {
            let mut whole = state.clone();
            let mut ids: Vec<&u64> = ahead.keys().collect();
            ids.sort();
            for r in ids.into_iter().flat_map(|id| &ahead[id]) {
                whole.apply(r);
            }
            journal.compact(&whole)
        };
        written.map_err(FsError::Journal)
    }

    /// Waits, without the overlay's lock, until the journal has everything up to `t` on
    /// disk: one `fdatasync` serves every change waiting (group commit).
    fn durable(&self, t: Ticket) -> FsResult<()> {
        #[cfg(test)]
        crash_tests::at_crash_point(self);
        #[cfg(test)]
        interleave_tests::at_durable(self);
        self.durability.wait(t).map_err(FsError::Journal)
    }

    /// Marks a cached path changed: journaled if it was clean, and noted for the sync.
    /// The ticket covers the mark (this change's, or the one another change wrote and may
    /// still wait for): the change waits for it before it answers.
    fn mark_dirty(&self, inner: &mut Inner, rel: &Path) -> FsResult<Ticket> {
        let t = if inner.state.is_dirty(rel) {
            self.written(inner)?
        } else {
            self.record_deferred(inner, &[Record::Dirty(rel.to_path_buf())])?
        };
        inner.touched.insert(rel.to_path_buf());
        Ok(t)
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

    /// The records of the cache taking `rel` over: what the share holds there now (none
    /// when the cache took it over before in this session: the first base stands until
    /// our own sync settles the path), and for a database's journal or WAL, the
    /// database's base too (see [`Overlay::database_base`]).
    fn take_over(&self, inner: &Inner, rel: &Path) -> io::Result<Vec<Record>> {
        self.take_over_seen(inner, rel, None, i64::MIN)
    }

    /// [`Overlay::take_over`], when the caller looked at the share's `rel` already
    /// (`seen`: what the share had there, looked at after [`Overlay::share_second`] gave
    /// `second`, maybe before the lock): no second look. A racy base (see [`racy`]) gets
    /// the content the share's file has now (the version the user replaces or deletes;
    /// unknown if the share has another object by then).
    fn take_over_seen(
        &self,
        inner: &Inner,
        rel: &Path,
        seen: Option<Option<&Stat>>,
        second: i64,
    ) -> io::Result<Vec<Record>> {
        let mut out = Vec::new();
        if !inner.state.taken_over(rel) {
            let (now, second) = match seen {
                Some(seen) => (seen.copied(), second),
                None => {
                    let second = self.share_second();
                    (self.share.stat(rel)?, second)
                }
            };
            let base = now.as_ref().map(session::share_id_of);
            out.push(Record::Base(rel.to_path_buf(), base));
            if let Some(b) = base
                .filter(|b| now.as_ref().is_some_and(|m| m.is_file()) && Self::is_racy(b, second))
            {
                // Read now, through a descriptor whose look must still be the base: a
                // write in place there in the same second between the caller's look
                // (maybe before the lock) and this read is taken for what the user
                // replaces or deletes (doc/SEMANTICS.md, limit).
                out.extend(
                    self.share_mark(rel, b)
                        .map(|c| Record::Racy(rel.to_path_buf(), c)),
                );
            }
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

    /// How many copy-ups this mount has made (see [`Overlay::open_deferred`]).
    pub fn copy_up_count(&self) -> u64 {
        self.copy_ups.load(Ordering::Acquire)
    }

    /// The share's filesystem's counts (through the share's gate).
    pub fn statfs(&self) -> FsResult<fsinfo::FsStats> {
        Ok(self
            .gate
            .enter()?
            .passed(fsinfo::statfs(self.share.path()))?)
    }

    /// Counts for `ccfs status`: dirty objects, their bytes, pending deletions.
    /// The unsynced paths and the pending deletions, in order, at most `limit` of each.
    pub fn pending_paths(&self, limit: usize) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let inner = self.lock();
        let mut dirty: Vec<PathBuf> = inner.state.dirty().cloned().collect();
        let mut gone: Vec<PathBuf> = inner.state.whiteouts().cloned().collect();
        drop(inner);
        dirty.sort();
        gone.sort();
        dirty.truncate(limit);
        gone.truncate(limit);
        (dirty, gone)
    }

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
