//! One sync of the cache to the share, as a guard value: [`Overlay::begin_sync`] checks
//! every path against the share (conflicts), takes the list of what to send and journals it
//! as being sent; the caller runs rsync; [`SyncSession::finish`] settles what rsync did.
//! A session dropped unfinished (rsync could not run, or a panic) settles as an incomplete
//! transfer. A crash leaves the `Sending` records, which the next session settles first.
//!
//! Settling a path compares the share with what was sent: a share file that rsync reported
//! sending (with the mtime it gave it), or, without rsync's report, one with the size and
//! mtime the cache copy had when it was handed to rsync, is our own transfer, and becomes
//! the path's base; anything else is someone else's, and the base stays, so the next sync
//! sees the conflict (see doc/SEMANTICS.md, "Sessions").

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::{remove_tree_keeping, up, Overlay};
use crate::error::{FsError, FsResult};
use crate::locks::Locked;
use crate::policy::{PathClass, Policy};
use crate::rsync::Put;
use crate::state::{Content, Record, Sent, ShareId};
use crate::sys::{self, Root, Stat, Version};

/// How the share and the cache disagreed at sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConflictKind {
    /// Changed here and, since we took it, on the share (another workstation logged out).
    ModifiedOnBoth,
    /// Created here and, meanwhile, on the share.
    CreatedOnBoth,
    /// Deleted here, changed on the share: the share's version is kept.
    DeletedHereModifiedThere,
    /// Changed here, deleted on the share: ours is written back.
    ModifiedHereDeletedThere,
    /// A journal or WAL of a database changed here, and the database changed on the share
    /// since we took it over: ours is kept beside the share's database, under the name of
    /// our copy of the database (moved aside with it when the cache has one).
    DatabaseChangedThere,
}

/// One conflict found at sync; nothing is overwritten, both versions are kept.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Conflict {
    pub path: PathBuf,
    pub kind: ConflictKind,
    /// Where our version went (the conflict copy), or what was kept.
    pub kept: String,
}

pub use crate::rsync::Transfer;

/// The outcome of a finished session.
#[derive(Debug, Clone, Default)]
pub struct Settled {
    /// Paths whose dirty mark was cleared.
    pub cleaned: usize,
    /// Deletions applied on the share.
    pub deleted: usize,
    /// Paths rsync was given that did not reach the share.
    pub not_sent: Vec<PathBuf>,
    /// Deletions found to conflict when applied (the share's version is kept).
    pub conflicts: Vec<Conflict>,
    pub errors: Vec<String>,
    /// Paths sent but left unsynced because something could write them meanwhile: open
    /// for writing (a program, a shared mapping whose descriptor was closed), or written
    /// after they were handed over. The next sync sends them again.
    pub still_written: Vec<PathBuf>,
}

/// A sync in progress (see the module documentation).
#[derive(Debug)]
pub struct SyncSession<'a> {
    overlay: &'a Overlay,
    /// Paths to hand to rsync, sorted: dirty, in the cache, checked against the share.
    pub files: Vec<PathBuf>,
    /// Paths to delete on the share once the files are there, deepest first.
    pub deletions: Vec<PathBuf>,
    /// Marked dirty but not in the cache (an operation failed after the mark).
    stale: Vec<PathBuf>,
    /// What each file was when handed over (same order as `files`).
    sent: Vec<Option<Sent>>,
    /// Each file's [`Stat::version`] when handed over (same order as `files`).
    versions: Vec<Version>,
    /// Whether each file was open for writing nowhere when handed over (same order as
    /// `files`; see [`written_elsewhere`]): only such a file can be as rsync read it once
    /// the sync ends.
    quiet: Vec<bool>,
    /// Files handed over as a snapshot (see `overlay/snapshot.rs`): rsync sends them from
    /// [`Overlay::snapshot_root`].
    pub snapshots: Vec<PathBuf>,
    /// Files that are mostly holes, which the sync sends itself (see `overlay/sparse.rs`).
    pub sparse: Vec<PathBuf>,
    /// Conflicts found before sending (both versions kept).
    pub conflicts: Vec<Conflict>,
    /// Paths held back from this sync, with why (their check against the share failed).
    pub errors: Vec<String>,
    /// Whether the handed files carry ACLs and other extended attributes that rsync must
    /// carry over (see [`Overlay::carried_attributes`]).
    pub carries: Carries,
    /// Dirty files the share already had as they are (see [`Overlay::settle_unchanged`]):
    /// clean now, not handed to rsync.
    pub unchanged: usize,
    finished: bool,
}

/// What a sync must carry to the share besides the listed paths' contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Carries {
    /// ACLs and other extended attributes.
    pub acls: bool,
    pub xattrs: bool,
    /// The directories above the listed paths, with their attributes: only when one of
    /// them is missing on the share (another workstation removed it), so that rsync makes
    /// it as ours is, not with its defaults (as root: root's); or when one is read-only
    /// for its owner, which rsync makes writable only while it sends that directory.
    pub implied_dirs: bool,
}

/// A path for a log line: printable ASCII only (a name cannot start a line of its own).
pub fn shown(p: &Path) -> String {
    crate::journal::escape(p)
}

fn io_err(op: &str, p: &Path, e: &io::Error) -> String {
    format!("{op} {}: {e}", shown(p))
}

/// What the share holds at `rel`, as a base: a directory is known by its inode alone (its
/// times change whenever entries do).
pub(super) fn share_id_of(m: &Stat) -> ShareId {
    if m.is_dir() {
        ShareId {
            ino: m.ino(),
            size: u64::MAX,
            mtime: (0, 0),
            ctime: (0, 0),
        }
    } else {
        ShareId {
            ino: m.ino(),
            size: m.len(),
            mtime: m.mtime(),
            ctime: m.ctime(),
        }
    }
}

/// What [`Overlay::unchanged_on_share`] found.
enum Unchanged {
    /// The share has it as it is: clean, not sent.
    Settled,
    /// Changed, or not to be compared: rsync sends it.
    Send,
    /// The share's file changed during the look (another workstation's save): not sent
    /// by this sync, which says so; the next one meets the change as a conflict.
    Hold,
}

/// The largest dirty file a sync compares with the share's copy before sending it (see
/// [`Overlay::settle_unchanged`]): configuration files are small; a larger file is sent.
const SAME_BYTES_LIMIT: u64 = 1 << 20;

/// Is the share file `now` the save `base` was taken of, its ctime aside (a change of
/// mode, owner or link count alone is no new save)?
fn same_save(now: Option<ShareId>, base: Option<ShareId>) -> bool {
    match (now, base) {
        (Some(n), Some(b)) => (n.ino, n.size, n.mtime) == (b.ino, b.size, b.mtime),
        _ => false,
    }
}

/// Whether a file with mtime `ours` here is, as the share keeps it, one with mtime
/// `theirs` there: the same, or cut to its second by a share that keeps whole seconds.
fn same_mtime_on_share(ours: (i64, i64), theirs: (i64, i64)) -> bool {
    ours == theirs || (theirs.1 == 0 && ours.0 == theirs.0)
}

/// Without rsync's report of what it sent (a sync cut short by a crash, settled by the next
/// one; an rsync that named no file): is the share object `theirs` our own transfer of the
/// cache object `ours`, handed to rsync as `sent`? Yes when it has exactly the size and
/// mtime we handed over or those the cache copy has now (rsync keeps the cache's mtimes),
/// or an mtime from the moment we handed the file over up to the cache copy's now: a
/// version the user wrote here while rsync was reading (a program saving again and again
/// during a periodic sync), which this machine's clock stamped. A share file with an mtime
/// in that window that another workstation wrote during our sync (a logout there at the
/// same moment, its file's mtime from that window) would be taken for ours: see
/// doc/SEMANTICS.md "Sessions" (limit). Permission bits are not compared (some shares
/// give a copy other bits than the cache's), so a chmod alone, which changes neither size
/// nor mtime, passes for sent here: a known limit of a sync settled without rsync's report.
fn is_our_transfer(theirs: &Stat, ours: Option<&Stat>, sent: Option<Sent>) -> bool {
    if !theirs.is_file() {
        return ours.is_some_and(|o| o.file_type() == theirs.file_type());
    }
    let t = (theirs.len(), theirs.mtime());
    let now = ours.filter(|o| o.is_file()).map(|o| (o.len(), o.mtime()));
    let then = sent.map(|s| (s.size, s.mtime));
    // A share that keeps whole seconds has our mtime cut to its second (rsync's own
    // listing names whole seconds too: see [`is_reported_transfer`]); another
    // workstation's file of that size with an mtime in that second passes for ours
    // there (see doc/SEMANTICS.md, "Shares that keep whole seconds": limit).
    let kept_as = |ours: Option<(u64, (i64, i64))>| {
        ours.is_some_and(|(size, m)| size == t.0 && same_mtime_on_share(m, t.1))
    };
    if kept_as(then) || kept_as(now) {
        return true;
    }
    // Only when the cache copy was written after the hand-over (else a file from just
    // before it, e.g. the share's old version, could fall in the window). The kernel
    // stamps files with a coarse clock that may lag the one read at hand-over by a tick.
    let lag = (0, 20_000_000);
    let earliest = |since: (i64, i64)| {
        if since.1 >= lag.1 {
            (since.0, since.1 - lag.1)
        } else {
            (since.0 - 1, since.1 + 1_000_000_000 - lag.1)
        }
    };
    // Written after the hand-over is what the cache copy's ctime says: its mtime may have
    // been set to any time (`touch -d`, `cp -p`, a file from a machine whose clock is ahead),
    // and a future one opened the window to every later file.
    match (sent.and_then(|s| s.since), ours.filter(|o| o.is_file())) {
        (Some(since), Some(o)) => {
            o.ctime() > since && earliest(since) <= t.1 && t.1 <= o.mtime().min(o.ctime())
        }
        _ => false,
    }
}

/// With rsync's report of what it sent: is the share object `theirs` at a path this sync's
/// rsync put there? A regular file is when rsync reported sending that path (`listed`:
/// the mtime, in whole seconds, it listed for the cache copy and set on the share's copy),
/// the share's file has that mtime, and it is no longer the object the conflict check
/// found there (`base`: rsync's `--delay-updates` puts a new file in place, so a file that
/// rsync named but never renamed into place, the share's old one, is not ours). Neither
/// the cache copy's state now (replaced since by a file with any mtime) nor the size rsync
/// listed (it sends the size it finds when it opens the file) enters. Another
/// workstation's file that replaced ours on the share between rsync's rename and this
/// check with an mtime in the same second would be taken for ours: see doc/SEMANTICS.md
/// "Sessions" (limit).
fn is_reported_transfer(
    theirs: &Stat,
    ours: Option<&Stat>,
    base: Option<ShareId>,
    listed: Option<Put>,
) -> bool {
    match listed {
        Some(Put::File(mtime)) if theirs.is_file() => {
            mtime == theirs.mtime().0 && base != Some(share_id_of(theirs))
        }
        // A directory or symbolic link rsync made there: ours, even when the cache has
        // another object at the name by now (a directory renamed away and a file written
        // in its place while rsync ran). rsync makes a directory only where it found none,
        // so one it made is ours even with the number of the one the check saw there: a
        // directory is known by its inode number alone, and a share that freed the number
        // (the directory removed elsewhere) gives it to the next one made (ext4 does).
        Some(Put::Made(kind)) if theirs.file_type() == kind => {
            theirs.is_dir() || base != Some(share_id_of(theirs))
        }
        _ if !theirs.is_file() => ours.is_some_and(|o| o.file_type() == theirs.file_type()),
        _ => false,
    }
}

/// The endings of the files that belong to a database `X` (SQLite's `X-wal`, `X-shm` and
/// `X-journal`): their content only means something with the version of `X` it was
/// written against.
pub const DATABASE_COMPANIONS: [&str; 3] = ["-wal", "-shm", "-journal"];

/// The database a journal or WAL `rel` belongs to, and the ending that names it so.
pub(super) fn database_of(rel: &Path) -> Option<(PathBuf, &'static str)> {
    let name = rel.file_name()?.as_bytes();
    DATABASE_COMPANIONS.iter().find_map(|end| {
        let stem = name.strip_suffix(end.as_bytes())?;
        (!stem.is_empty()).then(|| (rel.with_file_name(OsStr::from_bytes(stem)), *end))
    })
}

/// `p` with `end` appended to its last component.
fn with_ending(p: &Path, end: &str) -> PathBuf {
    let mut name = p.file_name().unwrap_or_default().to_os_string();
    name.push(end);
    p.with_file_name(name)
}

/// The longest prefix of `name` of at most `max` bytes that ends on a character boundary
/// (when `name` is UTF-8).
fn truncate_name(name: &[u8], max: usize) -> &[u8] {
    if name.len() <= max {
        return name;
    }
    let mut end = max;
    if let Ok(text) = std::str::from_utf8(name) {
        while end > 0 && !text.is_char_boundary(end) {
            end -= 1;
        }
    }
    &name[..end]
}

/// `NAME.ccfs-conflict-HOST-STAMP[-N]`, shortened at the front part so the whole name fits
/// in `max` bytes (NAME_MAX, 255, less the room a database's companion needs for its
/// ending).
pub fn conflict_file_name(name: &[u8], host: &str, stamp: &str, n: u32, max: usize) -> OsString {
    let suffix = if n <= 1 {
        format!(".ccfs-conflict-{host}-{stamp}")
    } else {
        format!(".ccfs-conflict-{host}-{stamp}-{n}")
    };
    let suffix = truncate_name(suffix.as_bytes(), 200);
    let mut out = truncate_name(name, max.saturating_sub(suffix.len())).to_vec();
    out.extend_from_slice(suffix);
    OsString::from_vec(out)
}

impl Overlay {
    /// Starts a sync: settles what an interrupted one left, checks every dirty and deleted
    /// path against the share (moving our version aside where another workstation changed
    /// the share's), and journals what is about to be sent. A path whose check fails is held
    /// back and reported; the others go on.
    pub fn begin_sync(&self, host: &str, stamp: &str) -> FsResult<SyncSession<'_>> {
        // Counted before anything of the sync happens (a share look made without the
        // lock before this no longer stands), and marked running before it is counted:
        // a look that reads the new count then sees the sync running, or ended.
        self.sync_running.store(true, Ordering::SeqCst);
        self.syncs_started.fetch_add(1, Ordering::SeqCst);
        let mut session = SyncSession {
            overlay: self,
            files: Vec::new(),
            deletions: Vec::new(),
            stale: Vec::new(),
            sent: Vec::new(),
            versions: Vec::new(),
            quiet: Vec::new(),
            snapshots: Vec::new(),
            sparse: Vec::new(),
            conflicts: Vec::new(),
            errors: Vec::new(),
            carries: Carries {
                acls: true,
                xattrs: true,
                implied_dirs: false,
            },
            unchanged: 0,
            finished: false,
        };
        // A crash (or a failed settle) left Sending marks: settle them before anything
        // compares the share with the bases.
        let leftover: Vec<(PathBuf, Option<Sent>)> = {
            let mut inner = self.lock();
            inner.touched.clear();
            inner.released.clear();
            inner
                .state
                .sending()
                .map(|(p, s)| (p.clone(), *s))
                .collect()
        };
        if !leftover.is_empty() {
            let (files, sent): (Vec<_>, Vec<_>) = leftover.into_iter().unzip();
            self.settle(&files, &sent, &Transfer::Incomplete, &mut session.errors)?;
            self.record(&mut self.lock(), &[Record::SyncEnd])?;
            self.clean_partial_transfers(&files, &mut session.errors);
        }
        let mut held = self.check_conflicts(host, stamp, &mut session)?;
        session.unchanged = self.settle_unchanged(&mut held, &mut session.errors)?;
        let mut inner = self.lock();
        let mut files: Vec<PathBuf> = inner
            .state
            .dirty()
            .filter(|p| self.policy.classify(p) != PathClass::LocalOnly && !held.contains(*p))
            .cloned()
            .collect();
        files.sort();
        // The hand-over begins before any file is looked at: a version written through an
        // open file after its look (kernel passthrough writes without the daemon) is then
        // one written since the hand-over, which a sync cut short counts as its own
        // transfer. (Read after the looks, the hand-over time could come later than such
        // a version by more than the clock's lag, and our own transfer looked like another
        // workstation's: a conflict on one workstation.)
        let handed_over = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| (d.as_secs() as i64, i64::from(d.subsec_nanos())))
            .unwrap_or((0, 0));
        let mut present = Vec::new();
        for p in files {
            match self.upper_stat(&p) {
                Ok(Some(m)) => present.push((p, m)),
                Ok(None) => session.stale.push(p),
                Err(e) => session.errors.push(io_err("cannot look at", &p, &e)),
            }
        }
        #[cfg(test)]
        super::interleave_tests::after_sync_looks(self);
        self.add_hard_link_names(&inner.state, &mut present, &mut session.conflicts)?;
        session.sent = present
            .iter()
            .map(|(_, m)| {
                m.is_file().then(|| Sent {
                    size: m.len(),
                    mtime: m.mtime(),
                    since: Some(handed_over),
                })
            })
            .collect();
        session.versions = present.iter().map(|(_, m)| m.version()).collect();
        // Asked after the versions are taken: a writer seen by neither has closed the
        // file, and all it wrote is in what rsync reads.
        session.quiet = present
            .iter()
            .map(|(p, m)| {
                !m.is_file()
                    || (!inner.writers.contains_key(&m.ino())
                        && !written_elsewhere(&self.cache, &up(p)))
            })
            .collect();
        // A file that is mostly holes is sent by the sync itself; one open for writing
        // as a copy taken now (a file that changes while rsync reads it is discarded by
        // rsync's check): what is handed over is the copy.
        self.drop_snapshots();
        for (i, (p, m)) in present.iter().enumerate() {
            if self.sent_as_sparse(p, m) {
                session.sparse.push(p.clone());
                continue;
            }
            // (A file of several names goes as it is: rsync keeps its names one file. So
            // does one whose directory the share lacks: rsync would make it there from the
            // snapshot, where the cache's may be gone by the time it runs.)
            // A large file goes as it is too: its copy would take the lock (and the cache's
            // room) for long; what rsync discards of it stays dirty for the next sync.
            if session.quiet[i]
                || !m.is_file()
                || m.nlink() > 1
                || m.len() > super::snapshot::SNAPSHOT_MAX_LEN
            {
                continue;
            }
            let parent = p.parent().unwrap_or(Path::new(""));
            if !matches!(self.share.stat(parent), Ok(Some(d)) if d.is_dir()) {
                continue;
            }
            match self.snapshot(p) {
                Ok(copy) => {
                    session.sent[i] = Some(Sent {
                        size: copy.len(),
                        mtime: copy.mtime(),
                        since: Some(handed_over),
                    });
                    session.snapshots.push(p.clone());
                }
                // Sent as it is, as before (rsync may discard it; it stays dirty).
                Err(e) => {
                    tracing::warn!(path = %shown(p), "cannot take a snapshot of a file being written: {e}")
                }
            }
        }
        let (acls, xattrs) = self.carried_attributes(&inner.state, &present);
        session.carries.acls = acls;
        session.carries.xattrs = xattrs;
        session.files = present.into_iter().map(|(p, _)| p).collect();
        inner.handed = session.files.iter().cloned().collect();
        let mut deletions: Vec<PathBuf> = inner
            .state
            .whiteouts()
            .filter(|p| !held.contains(*p))
            .cloned()
            .collect();
        deletions.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        session.deletions = deletions;
        let records: Vec<Record> = session
            .files
            .iter()
            .zip(&session.sent)
            .map(|(p, s)| Record::Sending(p.clone(), *s))
            .collect();
        self.record(&mut inner, &records)?;
        drop(inner);
        let files = session.files.clone();
        self.clean_partial_transfers(&files, &mut session.errors);
        Ok(session)
    }

    /// Dirty files whose bytes, mode and owner the share already has at their path, as
    /// the cache took them over (a program that saved what it had read, a `touch`): none
    /// is sent. The share's copy gets the cache copy's mtime where they differ (a stamp
    /// file's time is what it says), and the path is clean with that as its base. Only
    /// small single-name files without extended attributes are compared (the share's
    /// copy is read whole: [`SAME_BYTES_LIMIT`]); everything else goes to rsync. No lock
    /// is held while either side is read; a file written meanwhile (its version changed,
    /// or a handle writes it) stays dirty and is sent. Returns how many were settled.
    fn settle_unchanged(
        &self,
        held: &mut HashSet<PathBuf>,
        errors: &mut Vec<String>,
    ) -> FsResult<usize> {
        let candidates: Vec<(PathBuf, ShareId, Option<Content>)> = {
            let inner = self.lock();
            inner
                .state
                .dirty()
                .filter(|p| self.policy.classify(p) == PathClass::Cached && !held.contains(*p))
                .filter_map(|p| Some((p.clone(), inner.state.base(p)?, inner.state.racy(p))))
                .filter(|(_, b, _)| b.size <= SAME_BYTES_LIMIT)
                .collect()
        };
        let mut settled = 0;
        for (p, base, racy) in candidates {
            match self.unchanged_on_share(&p, base, racy) {
                Ok(Unchanged::Settled) => settled += 1,
                Ok(Unchanged::Send) => {}
                Ok(Unchanged::Hold) => {
                    errors.push(format!(
                        "{} changed on the share during the sync: held back, the next sync compares again",
                        shown(&p)
                    ));
                    held.insert(p);
                }
                Err(FsError::Journal(e)) => return Err(FsError::Journal(e)),
                // Whatever failed, rsync sends the file (and says what is wrong).
                Err(_) => {}
            }
        }
        Ok(settled)
    }

    /// One file of [`Overlay::settle_unchanged`]: true when it is settled. The share's
    /// file is looked at, read, stamped and recorded through one descriptor, so that all
    /// of it concerns one object: one another workstation put there meanwhile is never
    /// stamped or taken for the base. The stamp is journaled first as a transfer of ours
    /// (a crash before the base is recorded leaves a share file the next sync takes for
    /// our own, not a conflict). After the stamp the bytes are read again: a write made
    /// there in place meanwhile leaves the path dirty with its old base, and the next
    /// sync meets it as a conflict.
    fn unchanged_on_share(
        &self,
        p: &Path,
        base: ShareId,
        racy: Option<Content>,
    ) -> FsResult<Unchanged> {
        let Some(ours) = self.upper_stat(p)? else {
            return Ok(Unchanged::Send);
        };
        if !ours.is_file() || ours.nlink() != 1 || ours.len() != base.size {
            return Ok(Unchanged::Send);
        }
        // A file open for writing anywhere (a shared mapping's, whose writes the daemon
        // never sees) may change after the comparison: rsync's part, and it stays dirty.
        if written_elsewhere(&self.cache, &up(p)) {
            return Ok(Unchanged::Send);
        }
        // Extended attributes (ACLs too) on either side: rsync's part (a removal here
        // must reach the share).
        let none = |names: io::Result<Vec<OsString>>| names.is_ok_and(|n| n.is_empty());
        if !none(self.cache.listxattr(&up(p))) || !none(self.share.listxattr(p)) {
            return Ok(Unchanged::Send);
        }
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
        // (On NFS past the client's cached pages: see `Overlay::content_flags`.)
        let theirs_file = self.share.open_file(p, self.content_flags(), 0)?;
        let theirs = sys::fstat(&theirs_file)?;
        if !theirs.is_file() || share_id_of(&theirs) != base {
            // Changed on the share since the conflict check: rsync would overwrite it.
            return Ok(Unchanged::Hold);
        }
        // Another name of the share's file (a hard link there) would take the stamp too:
        // rsync's part (it puts a file of its own at this name).
        if theirs.nlink() != 1 {
            return Ok(Unchanged::Send);
        }
        if (theirs.mode(), theirs.uid(), theirs.gid()) != (ours.mode(), ours.uid(), ours.gid()) {
            return Ok(Unchanged::Send);
        }
        let read_all = |f: &std::fs::File| -> io::Result<Vec<u8>> {
            let mut v = Vec::new();
            let mut r = f;
            io::Seek::seek(&mut r, io::SeekFrom::Start(0))?;
            io::Read::read_to_end(&mut r, &mut v)?;
            Ok(v)
        };
        let mine = read_all(&self.cache.open_file(&up(p), flags, 0)?)?;
        let theirs_bytes = read_all(&theirs_file)?;
        // A racy base (see [`super::racy`]) whose content the share's file no longer has:
        // written there in the second of the look, a change rsync would overwrite.
        let theirs_attributes = super::racy::attributes_of(&theirs_file)?;
        let theirs_data = super::racy::content_of_bytes(&theirs_bytes);
        if racy.is_some_and(|c| !super::racy::mark_holds(c, theirs_data, &theirs_attributes)) {
            return Ok(Unchanged::Hold);
        }
        if mine.len() as u64 != ours.len() || theirs_bytes != mine {
            return Ok(Unchanged::Send);
        }
        if !same_mtime_on_share(ours.mtime(), theirs.mtime()) {
            let sent = Sent {
                size: ours.len(),
                mtime: ours.mtime(),
                since: None,
            };
            self.record(
                &mut self.lock(),
                &[Record::Sending(p.to_path_buf(), Some(sent))],
            )?;
            let (secs, nsecs) = ours.mtime();
            sys::futimens(
                &theirs_file,
                sys::SetTime::Omit,
                sys::SetTime::At { secs, nsecs },
            )?;
        }
        #[cfg(test)]
        super::interleave_tests::after_unchanged_stamp(self);
        let second = self.share_second();
        let stamped = sys::fstat(&theirs_file)?;
        if read_all(&theirs_file)? != mine
            || sys::fstat(&theirs_file)?.version() != stamped.version()
            || self
                .share
                .stat(p)?
                .is_none_or(|m| (m.dev(), m.ino()) != (stamped.dev(), stamped.ino()))
        {
            return Ok(Unchanged::Hold);
        }
        let mut inner = self.lock();
        let still = self.upper_stat(p)?;
        if !inner.state.is_dirty(p)
            || inner.touched.contains(p)
            || inner.writers.contains_key(&ours.ino())
            || inner.released.contains(&ours.ino())
            || still.map(|m| m.version()) != Some(ours.version())
            || written_elsewhere(&self.cache, &up(p))
        {
            return Ok(Unchanged::Send);
        }
        let id = share_id_of(&stamped);
        let mut records = vec![Record::Base(p.to_path_buf(), Some(id))];
        if Self::is_racy(&id, second) {
            // Its attributes as the share has them now (the stamp changed none).
            let attributes = super::racy::attributes_of(&theirs_file)?;
            records.push(Record::Racy(
                p.to_path_buf(),
                super::racy::sealed(super::racy::content_of_bytes(&mine), &attributes),
            ));
        }
        records.push(Record::Clean(p.to_path_buf()));
        self.record(&mut inner, &records)?;
        Ok(Unchanged::Settled)
    }

    /// Whether any handed path carries ACLs, or other extended attributes, that the share
    /// must get. rsync writes every file anew (a temporary file renamed into place), so a
    /// file without them gives the share nothing to carry or to remove: the share's
    /// directory then gives the new file its default ACL, as it would to any file made
    /// there. A directory the share already has is changed in place: one of those
    /// carries both (what was removed here must be removed there). rsync asks the share
    /// for both on every path it sends when told to carry them (two requests a path).
    /// Returns (ACLs, other attributes).
    fn carried_attributes(
        &self,
        state: &crate::state::OverlayState,
        present: &[(PathBuf, Stat)],
    ) -> (bool, bool) {
        let (mut acls, mut xattrs) = (false, false);
        for (p, m) in present {
            if m.is_dir() && state.base(p).is_some() {
                return (true, true);
            }
            match self.cache.listxattr(&up(p)) {
                Ok(names) => {
                    for n in names {
                        if n.as_encoded_bytes().starts_with(b"system.posix_acl_") {
                            acls = true;
                        } else {
                            xattrs = true;
                        }
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => {}
                // Unknown: carry both, as rsync would be told without this look.
                Err(_) => return (true, true),
            }
        }
        (acls, xattrs)
    }

    /// Compares what the share holds at each dirty or deleted path with its base. Where
    /// another workstation changed it, nothing is overwritten: our version moves to a
    /// conflict copy (sent beside the share's), and a deletion of a file changed there is
    /// dropped. Before that, the share's object at every directory we send into (and its
    /// database, for a journal or WAL) is checked; after it, the share's directory where
    /// we send another kind of object (see [`Overlay::check_directories`],
    /// [`Overlay::check_databases`], [`Overlay::check_replaced_directories`]). Returns the
    /// paths held back because the share could not be asked.
    fn check_conflicts(
        &self,
        host: &str,
        stamp: &str,
        session: &mut SyncSession<'_>,
    ) -> FsResult<HashSet<PathBuf>> {
        let mut held = HashSet::new();
        let (dirty, whiteouts): (Vec<PathBuf>, Vec<PathBuf>) = {
            let inner = self.lock();
            (
                inner
                    .state
                    .dirty()
                    .filter(|p| self.policy.classify(p) == PathClass::Cached)
                    .cloned()
                    .collect(),
                inner.state.whiteouts().cloned().collect(),
            )
        };
        self.check_directories(&dirty, host, stamp, session, &mut held)?;
        self.check_databases(&dirty, host, stamp, session, &mut held)?;
        for p in &dirty {
            let p = p.clone();
            // Held, or moved aside with its directory above.
            if held.contains(&p) || !self.lock().state.is_dirty(&p) {
                continue;
            }
            // The share is asked without the lock held; the answer is compared under it.
            let second = self.share_second();
            let Some(cur) = self.share_now(&p, session, &mut held) else {
                continue;
            };
            let Some(stands) = self.still_base(&p, cur, second, session, &mut held, &[])? else {
                continue;
            };
            let mut inner = self.lock();
            let base = inner.state.base(&p);
            if (cur == base && stands) || !inner.state.is_dirty(&p) {
                continue;
            }
            let ours = match self.upper_stat(&p) {
                Ok(Some(m)) if !m.is_dir() => m,
                Ok(_) => continue,
                Err(e) => {
                    session.errors.push(io_err("cannot look at", &p, &e));
                    held.insert(p);
                    continue;
                }
            };
            let same = match (base, cur) {
                (None, Some(c)) => self.same_content(&p, &ours, &c).unwrap_or(None),
                _ => None,
            };
            match (base, cur) {
                (Some(_), None) => {
                    self.record(&mut inner, &[Record::Base(p.clone(), None)])?;
                    session.conflicts.push(Conflict {
                        path: p.clone(),
                        kind: ConflictKind::ModifiedHereDeletedThere,
                        kept: "ours, written back".into(),
                    });
                }
                // Created on both with the same bytes: theirs is the base, and a racy one
                // stands for those bytes (ours, as compared: a read of the share now could
                // take a write made there since for them).
                (None, Some(c)) if same.is_some() => {
                    let mut base = vec![Record::Base(p.clone(), Some(c))];
                    if Self::is_racy(&c, second) {
                        base.extend(same.map(|content| Record::Racy(p.clone(), content)));
                    }
                    self.record(&mut inner, &base)?;
                }
                _ => match self.move_aside(&mut inner, &p, cur, second, host, stamp) {
                    Ok(name) => {
                        let kind = if base.is_none() {
                            ConflictKind::CreatedOnBoth
                        } else {
                            ConflictKind::ModifiedOnBoth
                        };
                        tracing::warn!(path = %shown(&p), kept = %shown(&name), "conflict: {kind:?}");
                        session.conflicts.push(Conflict {
                            path: p.clone(),
                            kind,
                            kept: name.to_string_lossy().into_owned(),
                        });
                    }
                    Err(FsError::Journal(e)) => return Err(FsError::Journal(e)),
                    Err(e) => {
                        session.errors.push(format!(
                            "{} changed on the share and here, and our version could not be set aside: {e}",
                            shown(&p)
                        ));
                        held.insert(p);
                    }
                },
            }
        }
        for w in whiteouts {
            // Below a share object that is no directory (another workstation replaced one,
            // or our own directory went aside above), the share has nothing to delete.
            match self.share_ancestor_not_dir(&w) {
                Ok(true) => {
                    let mut inner = self.lock();
                    if inner.state.is_whiteout(&w) && self.upper_stat(&w)?.is_none() {
                        self.record(&mut inner, &[Record::Deleted(w.clone())])?;
                    }
                    continue;
                }
                Ok(false) => {}
                Err(e) => {
                    session
                        .errors
                        .push(io_err("cannot check on the share", &w, &e));
                    held.insert(w);
                    continue;
                }
            }
            let second = self.share_second();
            let Some(cur) = self.share_now(&w, session, &mut held) else {
                continue;
            };
            let Some(stands) = self.still_base(&w, cur, second, session, &mut held, &[])? else {
                continue;
            };
            let mut inner = self.lock();
            if !inner.state.is_whiteout(&w)
                || cur.is_none()
                || (cur == inner.state.base(&w) && stands)
                || self.upper_stat(&w)?.is_some()
            {
                continue;
            }
            let mut records = vec![Record::Deleted(w.clone())];
            records.extend(self.base_records(&w, cur, second));
            self.record(&mut inner, &records)?;
            tracing::warn!(path = %shown(&w), "conflict: deleted here, changed on the share; kept");
            session.conflicts.push(Conflict {
                path: w,
                kind: ConflictKind::DeletedHereModifiedThere,
                kept: "the share's version".into(),
            });
        }
        self.check_replaced_directories(&dirty, host, stamp, session, &mut held)?;
        Ok(held)
    }

    /// A directory we send into must be a directory on the share, or nothing there: rsync
    /// would delete a file (or symlink, or anything else) in its way. For each dirty path,
    /// every directory of the cache on its way (top down, the path itself when it is a
    /// directory) is compared with the share: another kind of object there, unless it is
    /// what we took over and replaced ourselves, is a conflict. The share keeps its
    /// object; our directory, with all it holds, moves to a conflict name and is sent there.
    fn check_directories(
        &self,
        dirty: &[PathBuf],
        host: &str,
        stamp: &str,
        session: &mut SyncSession<'_>,
        held: &mut HashSet<PathBuf>,
    ) -> FsResult<()> {
        // Directories found to be directories on the share too (or absent there).
        let mut fine: HashSet<PathBuf> = HashSet::new();
        for p in dirty {
            let mut way: Vec<&Path> = p
                .ancestors()
                .filter(|a| !a.as_os_str().is_empty())
                .collect();
            way.reverse();
            for dir in way {
                if fine.contains(dir) || held.contains(p) {
                    continue;
                }
                match self.upper_stat(dir) {
                    Ok(Some(m)) if m.is_dir() => {}
                    // Not a directory (the path itself), or moved aside meanwhile.
                    Ok(_) => break,
                    Err(e) => {
                        session.errors.push(io_err("cannot look at", dir, &e));
                        self.hold_below(dir, held);
                        break;
                    }
                }
                let second = self.share_second();
                let theirs = match self.share.stat(dir) {
                    Ok(m) => m,
                    Err(e) => {
                        session
                            .errors
                            .push(io_err("cannot check on the share", dir, &e));
                        self.hold_below(dir, held);
                        break;
                    }
                };
                let cur = match theirs {
                    Some(m) if !m.is_dir() => Some(share_id_of(&m)),
                    Some(m) => {
                        // A directory its owner may not write to (`chmod 555 ~/.ssh`): rsync
                        // opens it for its own writes only while it sends it.
                        if m.mode() & 0o200 == 0 {
                            session.carries.implied_dirs = true;
                        }
                        // When rsync sends the directories above the listed paths, it sets
                        // each one's mode to our copy's: a copy we did not change takes the
                        // share's mode first (another workstation's `chmod 700 ~/.gnupg`
                        // stands).
                        if let Err(e) = self.take_shares_dir_mode(dir, m.mode()) {
                            session
                                .errors
                                .push(io_err("cannot set the mode of", dir, &e));
                            self.hold_below(dir, held);
                            break;
                        }
                        fine.insert(dir.to_path_buf());
                        continue;
                    }
                    None => {
                        // rsync makes it: with our directory's attributes only if it
                        // sends the directories above a listed path (see `Carries`).
                        if !self.lock().state.is_dirty(dir) {
                            session.carries.implied_dirs = true;
                        }
                        fine.insert(dir.to_path_buf());
                        continue;
                    }
                };
                let mut inner = self.lock();
                if inner.state.taken_over(dir) && inner.state.base(dir) == cur {
                    // Our own change: we took that object over and made a directory there.
                    fine.insert(dir.to_path_buf());
                    continue;
                }
                let kind = if inner.state.taken_over(dir) && inner.state.base(dir).is_none() {
                    ConflictKind::CreatedOnBoth
                } else {
                    ConflictKind::ModifiedOnBoth
                };
                match self.move_aside(&mut inner, dir, cur, second, host, stamp) {
                    Ok(name) => {
                        tracing::warn!(path = %shown(dir), kept = %shown(&name),
                            "conflict: another kind of object on the share where we send a directory");
                        session.conflicts.push(Conflict {
                            path: dir.to_path_buf(),
                            kind,
                            kept: name.to_string_lossy().into_owned(),
                        });
                    }
                    Err(FsError::Journal(e)) => return Err(FsError::Journal(e)),
                    Err(e) => {
                        session.errors.push(format!(
                            "{} is no directory on the share, and our directory could not be set aside: {e}",
                            shown(dir)
                        ));
                        drop(inner);
                        self.hold_below(dir, held);
                    }
                }
                break;
            }
        }
        Ok(())
    }

    /// Gives the cache's copy of directory `dir` the share's permission bits `share_mode`,
    /// unless we changed the directory ourselves (then ours are what the sync sends).
    pub(super) fn take_shares_dir_mode(&self, dir: &Path, share_mode: u32) -> io::Result<()> {
        let inner = self.lock();
        if inner.state.is_dirty(dir) {
            return Ok(());
        }
        // Not in the middle of a copy-up's moment of write access to this directory (its
        // mode is the user's plus the owner's write bit then, and is put back after).
        let _moment = self.write_access.locked();
        match self.upper_stat(dir)? {
            Some(m) if m.is_dir() && m.mode() & 0o7777 != share_mode & 0o7777 => {
                self.cache.chmod(&up(dir), share_mode & 0o7777)
            }
            _ => Ok(()),
        }
    }

    /// Holds back `dir` and every dirty path below it.
    fn hold_below(&self, dir: &Path, held: &mut HashSet<PathBuf>) {
        held.extend(self.lock().state.dirty_below(dir));
        held.insert(dir.to_path_buf());
    }

    /// Whether some directory on the way to `rel` is, on the share, another kind of object
    /// (then the share has nothing at `rel`). Stops at the first one absent there.
    fn share_ancestor_not_dir(&self, rel: &Path) -> io::Result<bool> {
        let mut way: Vec<&Path> = rel
            .ancestors()
            .skip(1)
            .filter(|a| !a.as_os_str().is_empty())
            .collect();
        way.reverse();
        for dir in way {
            match self.share.stat(dir)? {
                Some(m) if m.is_dir() => {}
                Some(_) => return Ok(true),
                None => return Ok(false),
            }
        }
        Ok(false)
    }

    /// A journal or WAL (`X-wal`, `X-shm`, `X-journal`) holds changes to the version of
    /// database `X` it was written against: sent beside another version of `X`, it would
    /// be applied to that one at the next open and destroy it. When the cache takes a
    /// companion over, `X`'s base is recorded too ([`Overlay::database_base`]); here, when
    /// `X` on the share changed since, the companions we would send are a conflict: they
    /// move, with our copy of `X` when the cache has one, to `X`'s conflict name (`NAME`,
    /// `NAME-wal`, ..., a pair SQLite opens together). The share's `X` is left alone.
    fn check_databases(
        &self,
        dirty: &[PathBuf],
        host: &str,
        stamp: &str,
        session: &mut SyncSession<'_>,
        held: &mut HashSet<PathBuf>,
    ) -> FsResult<()> {
        let mut groups: std::collections::BTreeMap<PathBuf, Vec<(PathBuf, &'static str)>> =
            Default::default();
        for p in dirty {
            if let Some((db, end)) = database_of(p) {
                groups.entry(db).or_default().push((p.clone(), end));
            }
        }
        for (db, companions) in groups {
            if companions
                .iter()
                .all(|(c, _)| held.contains(c) || !self.lock().state.is_dirty(c))
            {
                continue;
            }
            let second = self.share_second();
            let cur = match self.share.stat(&db) {
                Ok(m) => m.as_ref().map(share_id_of),
                Err(e) => {
                    session
                        .errors
                        .push(io_err("cannot check on the share", &db, &e));
                    held.insert(db.clone());
                    held.extend(companions.into_iter().map(|(c, _)| c));
                    continue;
                }
            };
            let others: Vec<PathBuf> = companions.iter().map(|(c, _)| c.clone()).collect();
            let Some(stands) = self.still_base(&db, cur, second, session, held, &others)? else {
                continue;
            };
            let mut inner = self.lock();
            if !inner.state.taken_over(&db) || (inner.state.base(&db) == cur && stands) {
                continue;
            }
            let mut ours = Vec::new();
            for (c, end) in companions {
                if inner.state.is_dirty(&c) && self.upper_stat(&c)?.is_some_and(|m| !m.is_dir()) {
                    ours.push((c, end));
                }
            }
            if ours.is_empty() {
                continue;
            }
            match self.set_database_aside(&mut inner, &db, (cur, second), &ours, host, stamp) {
                Ok(moved) => {
                    for (from, to, kind) in moved {
                        tracing::warn!(path = %shown(&from), kept = %shown(&to),
                            "conflict: the database changed on the share: {kind:?}");
                        session.conflicts.push(Conflict {
                            path: from,
                            kind,
                            kept: to.to_string_lossy().into_owned(),
                        });
                    }
                }
                Err(FsError::Journal(e)) => return Err(FsError::Journal(e)),
                Err(e) => {
                    session.errors.push(format!(
                        "{} changed on the share, and our journal or WAL of it could not be set aside: {e}",
                        shown(&db)
                    ));
                    held.insert(db.clone());
                    held.extend(ours.into_iter().map(|(c, _)| c));
                }
            }
        }
        Ok(())
    }

    /// Moves our companions of `db` (and our copy of `db`, if the cache has one) to the
    /// conflict name of `db`; the share's `db` (looked at after [`Overlay::share_second`]
    /// gave the second beside it) becomes its base. Returns what moved where, and as what
    /// conflict.
    fn set_database_aside(
        &self,
        inner: &mut super::Inner,
        db: &Path,
        (cur, second): (Option<ShareId>, i64),
        companions: &[(PathBuf, &'static str)],
        host: &str,
        stamp: &str,
    ) -> FsResult<Vec<(PathBuf, PathBuf, ConflictKind)>> {
        let ends: Vec<&str> = companions.iter().map(|(_, end)| *end).collect();
        let name = self.conflict_name(inner, db, host, stamp, &ends)?;
        let mut moved = Vec::new();
        if self.upper_stat(db)?.is_some_and(|m| !m.is_dir()) {
            self.move_to(inner, db, &name, cur, second)?;
            moved.push((db.to_path_buf(), name.clone(), ConflictKind::ModifiedOnBoth));
        }
        for (c, end) in companions {
            let there = with_ending(&name, end);
            let second = self.share_second();
            let now = self.share.stat(c)?.as_ref().map(share_id_of);
            self.move_to(inner, c, &there, now, second)?;
            moved.push((c.clone(), there, ConflictKind::DatabaseChangedThere));
        }
        Ok(moved)
    }

    /// The base record of database `X` when the cache takes over its journal or WAL `rel`
    /// (`X-wal`, `X-shm`, `X-journal`) and has not taken `X` over yet: what the share held
    /// at `X` then is the version the companion's content belongs to (a later copy-up of
    /// `X` may copy another workstation's version and must not replace this base).
    pub(super) fn database_base(
        &self,
        inner: &super::Inner,
        rel: &Path,
    ) -> io::Result<Vec<Record>> {
        let Some((db, _)) = database_of(rel) else {
            return Ok(Vec::new());
        };
        if inner.state.taken_over(&db) || self.policy.classify(&db) != PathClass::Cached {
            return Ok(Vec::new());
        }
        let second = self.share_second();
        let now = self.share.stat(&db)?.as_ref().map(share_id_of);
        // A racy base of the database (see [`super::racy`]): the content it stands for is
        // read from the share now (unknown if the share's file is another by then).
        let racy = now
            .filter(|b| b.size != u64::MAX && Self::is_racy(b, second))
            .and_then(|b| self.share_mark(&db, b))
            .map(|c| Record::Racy(db.clone(), c));
        Ok(Some(Record::Base(db, now))
            .into_iter()
            .chain(racy)
            .collect())
    }

    /// A file (or symlink, or other non-directory) we send where the share has a directory:
    /// rsync (`--force`) deletes that directory with all it holds. Only when we deleted
    /// every entry it holds (each is a whiteout that stood its conflict check) is that our
    /// own change; anything else in it (added or changed by another workstation) makes our
    /// object a conflict: it moves to a conflict name and the share's directory stays.
    fn check_replaced_directories(
        &self,
        dirty: &[PathBuf],
        host: &str,
        stamp: &str,
        session: &mut SyncSession<'_>,
        held: &mut HashSet<PathBuf>,
    ) -> FsResult<()> {
        for p in dirty {
            if held.contains(p) || !self.lock().state.is_dirty(p) {
                continue;
            }
            let cur = match self.share.stat(p) {
                Ok(Some(m)) if m.is_dir() => Some(share_id_of(&m)),
                Ok(_) => continue,
                Err(e) => {
                    session
                        .errors
                        .push(io_err("cannot check on the share", p, &e));
                    held.insert(p.clone());
                    continue;
                }
            };
            let mut inner = self.lock();
            if !inner.state.is_dirty(p) || self.upper_stat(p)?.is_none_or(|m| m.is_dir()) {
                continue;
            }
            match self.all_deleted_below(&inner, p) {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    session
                        .errors
                        .push(io_err("cannot list on the share", p, &e));
                    held.insert(p.clone());
                    continue;
                }
            }
            // (`cur` is a directory's: no look at one is racy.)
            match self.move_aside(&mut inner, p, cur, i64::MAX, host, stamp) {
                Ok(name) => {
                    tracing::warn!(path = %shown(p), kept = %shown(&name),
                        "conflict: a directory on the share holds what we did not delete");
                    session.conflicts.push(Conflict {
                        path: p.clone(),
                        kind: ConflictKind::ModifiedOnBoth,
                        kept: name.to_string_lossy().into_owned(),
                    });
                }
                Err(FsError::Journal(e)) => return Err(FsError::Journal(e)),
                Err(e) => {
                    session.errors.push(format!(
                        "{} is a directory on the share, and our version could not be set aside: {e}",
                        shown(p)
                    ));
                    held.insert(p.clone());
                }
            }
        }
        Ok(())
    }

    /// Whether every entry below the share's directory `dir` (at any depth) is one we
    /// deleted (a whiteout).
    fn all_deleted_below(&self, inner: &super::Inner, dir: &Path) -> io::Result<bool> {
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for (name, _, kind) in self.share.read_dir(&d)? {
                let rel = d.join(name);
                if !inner.state.is_whiteout(&rel) {
                    return Ok(false);
                }
                let is_dir = match kind {
                    0 => self.share.stat(&rel)?.is_some_and(|m| m.is_dir()),
                    k => k == libc::S_IFDIR,
                };
                if is_dir {
                    stack.push(rel);
                }
            }
        }
        Ok(true)
    }

    /// What the share holds at `p` now, asked without the lock; when it cannot say, `p` is
    /// held back from this sync and the reason recorded.
    fn share_now(
        &self,
        p: &Path,
        session: &mut SyncSession<'_>,
        held: &mut HashSet<PathBuf>,
    ) -> Option<Option<ShareId>> {
        // (On NFS the file is opened: see `Overlay::share_look`.)
        match self.share_look(p) {
            Ok(m) => Some(m.as_ref().map(share_id_of)),
            Err(e) => {
                session
                    .errors
                    .push(io_err("cannot check on the share", p, &e));
                held.insert(p.to_path_buf());
                None
            }
        }
    }

    /// Whether the share's look `cur` at `p`, taken after [`Overlay::share_second`] gave
    /// `second`, still shows the base recorded for `p`: the same look, and for a racy base
    /// (see [`super::racy`]) the content it stands for, read now without the lock. None
    /// when the share stopped answering before that content could be read: `p` is held
    /// back (with `also`) and the error named, as for a share that does not answer the
    /// look.
    fn still_base(
        &self,
        p: &Path,
        cur: Option<ShareId>,
        second: i64,
        session: &mut SyncSession<'_>,
        held: &mut HashSet<PathBuf>,
        also: &[PathBuf],
    ) -> FsResult<Option<bool>> {
        let (base, racy) = {
            let inner = self.lock();
            (inner.state.base(p), inner.state.racy(p))
        };
        let holds = match (base, racy) {
            _ if cur != base => Some(false),
            (Some(b), Some(content)) => self.racy_base_holds(p, b, content, second)?,
            _ => Some(true),
        };
        if holds.is_none() {
            let e = io::Error::from_raw_os_error(libc::ENOTCONN);
            session
                .errors
                .push(io_err("cannot check on the share", p, &e));
            held.insert(p.to_path_buf());
            held.extend(also.iter().cloned());
        }
        Ok(holds)
    }

    /// Moves our version of `p` to a conflict name; the share's version at `p` becomes the
    /// base (it is what the user now sees there).
    fn move_aside(
        &self,
        inner: &mut super::Inner,
        p: &Path,
        cur: Option<ShareId>,
        second: i64,
        host: &str,
        stamp: &str,
    ) -> FsResult<PathBuf> {
        let name = self.conflict_name(inner, p, host, stamp, &[])?;
        self.move_to(inner, p, &name, cur, second)?;
        Ok(name)
    }

    /// Moves our version of `p` (with all it holds, for a directory) to `name` in the
    /// cache, to be sent there; `cur`, the share's object at `p` (looked at after
    /// [`Overlay::share_second`] gave `second`), becomes `p`'s base, racy or not (see
    /// [`Overlay::base_records`]).
    fn move_to(
        &self,
        inner: &mut super::Inner,
        p: &Path,
        name: &Path,
        cur: Option<ShareId>,
        second: i64,
    ) -> FsResult<()> {
        let name = name.to_path_buf();
        let base_there = self.share.stat(&name)?.as_ref().map(share_id_of);
        // A directory goes with all it holds: everything is new under the new name.
        let below = self.upper_below(p)?;
        let moved: Vec<Record> = below
            .iter()
            .map(|b| Record::Dirty(crate::state::reroot(b, p, &name)))
            .collect();
        // Write-ahead: the new name is marked before the cache's rename (a crash between
        // them leaves our version under one of the two names, each marked changed: never
        // under a name the journal does not send).
        let mut ahead = vec![
            Record::Dirty(name.clone()),
            Record::Base(name.clone(), base_there),
        ];
        ahead.extend(moved.iter().cloned());
        self.record(inner, &ahead)?;
        // The directory may be a read-only one's copy (see `with_write_access`).
        let dir = up(p.parent().unwrap_or(Path::new("")));
        self.with_write_access(&dir, || {
            self.cache
                .rename(&up(p), &up(&name), libc::RENAME_NOREPLACE)
        })?;
        #[cfg(test)]
        super::interleave_tests::after_conflict_move(self);
        let mut records = vec![
            Record::Rename {
                from: p.to_path_buf(),
                to: name.clone(),
            },
            Record::Dirty(name.clone()),
            Record::Base(name.clone(), base_there),
        ];
        records.extend(self.base_records(p, cur, second));
        records.extend(moved);
        self.record(inner, &records)?;
        Ok(())
    }

    /// Same bytes, permission bits and user attributes in our copy and the share's file
    /// (small files only)? If so, the share's file as a racy mark stands for it: those
    /// bytes, with its attributes. Other bits or user attributes (a credentials file one
    /// workstation made 600, the other 644) are a conflict: sending ours would change
    /// the share's without a word. Only what a sync sends is compared: no user attributes
    /// where the share keeps none, no `security.*` labels (each filesystem its own).
    fn same_content(
        &self,
        rel: &Path,
        ours: &Stat,
        theirs: &ShareId,
    ) -> io::Result<Option<Content>> {
        if ours.len() != theirs.size || ours.len() > 1 << 20 || !ours.is_file() {
            return Ok(None);
        }
        let read = |f: std::fs::File| -> io::Result<Vec<u8>> {
            let mut v = Vec::new();
            io::Read::read_to_end(&mut &f, &mut v)?;
            Ok(v)
        };
        let mine_file = self.cache.open_file(&up(rel), libc::O_RDONLY, 0)?;
        // (Not a FIFO's open that waits for a writer, nor a symbolic link's target.)
        let theirs_file = self.share.open_file(rel, self.content_flags(), 0)?;
        let theirs_now = sys::fstat(&theirs_file)?;
        if !theirs_now.is_file() {
            return Ok(None);
        }
        let mode = |f: &std::fs::File| sys::fstat(f).map(|m| m.mode() & 0o7777);
        let user = super::racy::user_xattrs_of;
        if mode(&mine_file)? != theirs_now.mode() & 0o7777 {
            return Ok(None);
        }
        if let Some(theirs) = user(&theirs_file)? {
            if user(&mine_file)?.unwrap_or_default() != theirs {
                return Ok(None);
            }
        }
        let mine = read(mine_file)?;
        let attributes = super::racy::attributes_of(&theirs_file)?;
        Ok((mine == read(theirs_file)?)
            .then(|| super::racy::sealed(super::racy::content_of_bytes(&mine), &attributes)))
    }

    /// A conflict name for `rel` free in the cache, on the share and in the record; with
    /// `ends`, the names with those endings (a database's companions) are free too.
    fn conflict_name(
        &self,
        inner: &super::Inner,
        rel: &Path,
        host: &str,
        stamp: &str,
        ends: &[&str],
    ) -> io::Result<PathBuf> {
        let base = rel.file_name().unwrap_or_default().as_bytes();
        let room = 255 - ends.iter().map(|e| e.len()).max().unwrap_or(0);
        let free = |p: &Path| -> io::Result<bool> {
            Ok(self.upper_stat(p)?.is_none()
                && self.share.stat(p)?.is_none()
                && !inner.state.is_dirty(p))
        };
        for n in 1..1000 {
            let name = rel.with_file_name(conflict_file_name(base, host, stamp, n, room));
            let mut all_free = free(&name)?;
            for end in ends {
                all_free = all_free && free(&with_ending(&name, end))?;
            }
            if all_free {
                return Ok(name);
            }
        }
        Err(io::Error::from_raw_os_error(libc::EEXIST))
    }

    /// A changed file with several names changed under all of them: rsync must see every
    /// name to keep the link group whole on the share (`--hard-links`).
    ///
    /// A name added so is not one of this session's changes: it is sent only while the
    /// share still holds at it what our last sync of it left there (its base). Another
    /// workstation that put something else at that name since broke the link there, and
    /// its file stays (ours is at the names we changed, or beside them as a conflict copy):
    /// a conflict at that name.
    fn add_hard_link_names(
        &self,
        state: &crate::state::OverlayState,
        files: &mut Vec<(PathBuf, Stat)>,
        conflicts: &mut Vec<Conflict>,
    ) -> io::Result<()> {
        let inodes: HashSet<u64> = files
            .iter()
            .filter(|(_, m)| !m.is_dir() && m.nlink() > 1)
            .map(|(_, m)| m.ino())
            .collect();
        if inodes.is_empty() {
            return Ok(());
        }
        let mut have: BTreeSet<PathBuf> = files.iter().map(|(p, _)| p.clone()).collect();
        let mut sent_as: HashMap<u64, PathBuf> = HashMap::new();
        for (p, m) in files.iter() {
            sent_as.entry(m.ino()).or_insert_with(|| p.clone());
        }
        self.walk_upper(|rel, ino, kind| {
            if kind != libc::S_IFDIR && inodes.contains(&ino) && have.insert(rel.to_path_buf()) {
                let unchanged = match self.share.stat(rel) {
                    Ok(cur) => cur.as_ref().map(share_id_of) == state.base(rel),
                    Err(_) => false,
                };
                if !unchanged {
                    tracing::warn!(
                        path = %shown(rel),
                        "a hard link's other name changed on the share (another login?): \
                         the share keeps its file there"
                    );
                    let ours = sent_as.get(&ino).map(|p| shown(p).to_string());
                    conflicts.push(Conflict {
                        path: rel.to_path_buf(),
                        kind: ConflictKind::ModifiedOnBoth,
                        kept: ours.unwrap_or_default(),
                    });
                    return;
                }
                if let Ok(Some(m)) = self.upper_stat(rel) {
                    files.push((rel.to_path_buf(), m));
                }
            }
        })?;
        files.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(())
    }

    /// Every non-local-only object in the cache, depth first.
    pub(super) fn walk_upper(&self, mut visit: impl FnMut(&Path, u64, u32)) -> io::Result<()> {
        let mut stack = vec![PathBuf::new()];
        while let Some(dir) = stack.pop() {
            for (name, ino, kind) in self.cache.read_dir(&up(&dir))? {
                let rel = dir.join(name);
                if self.policy.classify(&rel) == PathClass::LocalOnly {
                    continue;
                }
                let kind = if kind == 0 {
                    self.upper_stat(&rel)?.map(|m| m.file_type()).unwrap_or(0)
                } else {
                    kind
                };
                if kind == libc::S_IFDIR {
                    stack.push(rel.clone());
                }
                visit(&rel, ino, kind);
            }
        }
        Ok(())
    }

    /// Removes what an interrupted rsync `--delay-updates` left on the share: in the
    /// directories of `files`, the files of those names in ccfs's own holding directory
    /// ([`crate::rsync::PARTIAL_DIR`]), then that directory if it is empty. Nothing else is
    /// ever removed there.
    fn clean_partial_transfers(&self, files: &[PathBuf], errors: &mut Vec<String>) {
        let mut dirs: BTreeSet<PathBuf> = BTreeSet::new();
        // The share is asked once a directory whether it has a holding directory at all
        // (mostly not: rsync removes it when it is done), then once a file in those that do.
        let mut holding_dirs: HashMap<PathBuf, bool> = HashMap::new();
        for p in files {
            let (Some(name), parent) = (p.file_name(), p.parent().unwrap_or(Path::new(""))) else {
                continue;
            };
            let holding = parent.join(crate::rsync::PARTIAL_DIR);
            let is_dir = *holding_dirs.entry(holding.clone()).or_insert_with(|| {
                match self.share.stat(&holding) {
                    Ok(Some(m)) => m.is_dir(),
                    Ok(None) => false,
                    Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => false,
                    // Asked again below, where the error is reported.
                    Err(_) => true,
                }
            });
            if !is_dir {
                continue;
            }
            let partial = holding.join(name);
            match self.share.stat(&partial) {
                Ok(Some(m)) if !m.is_dir() => {
                    if let Err(e) = self.share.unlink(&partial) {
                        errors.push(io_err("cannot remove the partial transfer", &partial, &e));
                    }
                    dirs.insert(holding);
                }
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {}
                Err(e) => errors.push(io_err("cannot look at", &partial, &e)),
            }
        }
        for d in dirs {
            // Not empty: something else lives there; it stays.
            let _ = self.share.rmdir(&d);
        }
    }

    /// Settles paths handed to rsync: a path whose share copy is our transfer gets it as
    /// its base (with a complete transfer, whatever the share now holds is ours). Returns
    /// which paths landed.
    fn settle(
        &self,
        files: &[PathBuf],
        sent: &[Option<Sent>],
        transfer: &Transfer,
        errors: &mut Vec<String>,
    ) -> FsResult<Vec<bool>> {
        let mut landed = Vec::with_capacity(files.len());
        let mut records = Vec::new();
        // What the conflict check found at each path (the base: no sync or conflict of
        // this path can have set another since).
        let bases: Vec<Option<ShareId>> = {
            let inner = self.lock();
            files.iter().map(|p| inner.state.base(p)).collect()
        };
        // The share objects our transfers replaced: another name of one (a hard link on
        // the share) lost a link, which changed its ctime, not its content.
        let mut replaced: HashSet<u64> = HashSet::new();
        for ((p, s), base) in files.iter().zip(sent).zip(bases) {
            let second = self.share_second();
            let theirs = match self.share.stat(p) {
                Ok(m) => m,
                Err(e) => {
                    errors.push(io_err("cannot check on the share", p, &e));
                    landed.push(false);
                    continue;
                }
            };
            let ours = self.upper_stat(p).ok().flatten();
            let ok = theirs.as_ref().is_some_and(|t| match transfer {
                Transfer::Complete => true,
                Transfer::Reported(listed) => {
                    is_reported_transfer(t, ours.as_ref(), base, listed.get(p).copied())
                }
                // The share's file still the very object the conflict check found there
                // (rsync puts a new file in place; a directory it changes in place): not
                // ours, whatever its size and mtime (a file of the same size written in
                // the same tick as the one renamed over it here).
                Transfer::Incomplete => {
                    !(t.is_file() && base == Some(share_id_of(t)))
                        && is_our_transfer(t, ours.as_ref(), *s)
                        && !self.other_bytes_in_our_second(p, t, ours.as_ref(), *s)
                }
            });
            if let Some(t) = &theirs {
                self.saw_share_time(t.ctime().0);
            }
            if ok {
                records.push(Record::Base(p.clone(), theirs.as_ref().map(share_id_of)));
                if let Some(t) = theirs.as_ref().filter(|t| t.is_file()) {
                    let id = share_id_of(t);
                    if Self::is_racy(&id, second) {
                        records.extend(
                            self.sent_content(p, ours.as_ref(), *s, id)
                                .map(|c| Record::Racy(p.clone(), c)),
                        );
                    }
                }
                if let Some(b) = base.filter(|b| theirs.as_ref().is_some_and(|t| t.ino() != b.ino))
                {
                    replaced.insert(b.ino);
                }
            }
            landed.push(ok);
        }
        let settled: Vec<&PathBuf> = files
            .iter()
            .zip(&landed)
            .filter(|(_, l)| **l)
            .map(|(p, _)| p)
            .collect();
        records.extend(self.rebase_other_names(&settled, &replaced));
        self.record(&mut self.lock(), &records)?;
        Ok(landed)
    }

    /// The racy mark of the share's file at `p` that our transfer just put there, as the
    /// look `id`: the cache copy's bytes when it is as it was handed over (`sent`; the
    /// share's then has the same bytes), else the share's own, read now (another
    /// workstation's write in place in the same second as ours and before this read
    /// would be taken for ours: see doc/SEMANTICS.md "Sessions", limit); with the share's
    /// file's attributes. None: no mark (see [`Overlay::share_mark`]).
    fn sent_content(
        &self,
        p: &Path,
        ours: Option<&Stat>,
        sent: Option<Sent>,
        id: ShareId,
    ) -> Option<Content> {
        Some(match self.content_as_handed(p, ours, sent, id.size) {
            Content::Unknown => return self.share_mark(p, id),
            // The attributes as the share's file has them now (another workstation's
            // change of them in the second of ours and before this read would be taken
            // for ours).
            c => match self.share_attributes(p, id.ino) {
                Some(attributes) => super::racy::sealed(c, &attributes),
                None => Content::Unknown,
            },
        })
    }

    /// The content of the cache's file at `p` when it is as it was handed over (`sent`:
    /// its size and mtime then; `size`: the share's file's), nothing writing it; unknown
    /// otherwise.
    fn content_as_handed(
        &self,
        p: &Path,
        ours: Option<&Stat>,
        sent: Option<Sent>,
        size: u64,
    ) -> Content {
        let as_handed = match (ours, sent) {
            (Some(o), Some(s)) => {
                o.is_file() && (o.len(), o.mtime()) == (s.size, s.mtime) && o.len() == size
            }
            _ => false,
        };
        if as_handed && !written_elsewhere(&self.cache, &up(p)) {
            return self.content_in_cache(&up(p));
        }
        Content::Unknown
    }

    /// On a share that keeps whole seconds, a file of our size with an mtime in the
    /// second of ours passes for the transfer a crash cut short (see [`is_our_transfer`]):
    /// while the cache's file is as it was handed over, the bytes tell. Another
    /// workstation's save of other bytes in that second is theirs (a conflict), not ours.
    /// A share's file that cannot be read is taken for theirs.
    fn other_bytes_in_our_second(
        &self,
        p: &Path,
        theirs: &Stat,
        ours: Option<&Stat>,
        sent: Option<Sent>,
    ) -> bool {
        let id = share_id_of(theirs);
        if !theirs.is_file() || !super::racy::whole_seconds(&id) {
            return false;
        }
        match self.content_as_handed(p, ours, sent, id.size) {
            Content::Unknown => false,
            mine => self.share_data(p, id) != mine,
        }
    }

    /// The other names whose base is a share object a transfer just replaced at one of
    /// `landed` (names of one hard-linked file on the share): each still that object with
    /// its size and mtime gets its ctime now as its base, so that the link our own
    /// transfer took from it is not taken for another workstation's change (a deletion
    /// of that name kept as a conflict, a change of it set aside). A name handed to the
    /// same transfer that did not land (rsync cut short after the first name) is one of
    /// them: the next sync sends it over its own old file.
    fn rebase_other_names(&self, landed: &[&PathBuf], replaced: &HashSet<u64>) -> Vec<Record> {
        if replaced.is_empty() {
            return Vec::new();
        }
        let others: Vec<(PathBuf, ShareId)> = {
            let inner = self.lock();
            inner
                .state
                .bases()
                .filter_map(|(p, b)| Some((p.clone(), b?)))
                .filter(|(p, b)| replaced.contains(&b.ino) && !landed.contains(&p))
                .collect()
        };
        others
            .into_iter()
            .filter_map(|(p, b)| {
                let second = self.share_second();
                let now = share_id_of(&self.share.stat(&p).ok()??);
                if now == b || !same_save(Some(now), Some(b)) {
                    return None;
                }
                // The same object with a link less: a racy base keeps the content it
                // stood for (what the share has now may be a write made there since).
                let kept = self.lock().state.racy(&p);
                Some(match kept {
                    Some(c) => vec![Record::Base(p.clone(), Some(now)), Record::Racy(p, c)],
                    None => self.base_records(&p, Some(now), second),
                })
            })
            .flatten()
            .collect()
    }

    /// Deletes `rel` on the share if it is still a whiteout and the cache has nothing
    /// there, then records the whiteout done. A directory someone filled meanwhile, or a
    /// file someone saved there since the conflict check (not its base), is kept (a
    /// conflict).
    fn apply_deletion(&self, rel: &Path) -> FsResult<Option<Conflict>> {
        let mut inner = self.lock();
        if !inner.state.is_whiteout(rel) {
            return Ok(None);
        }
        let mut conflict = None;
        if self.upper_stat(rel)?.is_none() {
            if let Some(meta) = self.share.stat(rel)? {
                // The check was made before rsync ran, which may take minutes: a file
                // another workstation saved there since is not ours to delete. Its ctime
                // is no sign of that here: rsync replacing another name of the same file
                // (a hard link we sent) changes the link count, and so the ctime.
                // A racy base (see [`super::racy`]) stands only with its content (read
                // under the lock, as the deletion is made).
                // (A share that stops answering: the deletion waits for the next sync.)
                let written_in_its_second = match inner.state.racy(rel) {
                    Some(c) => !self.share_file_holds(rel, c)?,
                    None => false,
                };
                let r = if meta.is_dir() {
                    self.share.rmdir(rel)
                } else if !same_save(Some(share_id_of(&meta)), inner.state.base(rel))
                    || written_in_its_second
                {
                    tracing::warn!(path = %shown(rel), "conflict: deleted here, changed on the share during the sync; kept");
                    conflict = Some(Conflict {
                        path: rel.to_path_buf(),
                        kind: ConflictKind::DeletedHereModifiedThere,
                        kept: "the share's version".into(),
                    });
                    Ok(())
                } else {
                    self.share.unlink(rel)
                };
                match r {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {
                        conflict = Some(Conflict {
                            path: rel.to_path_buf(),
                            kind: ConflictKind::DeletedHereModifiedThere,
                            kept: "the share's directory, with what was added to it".into(),
                        });
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let second = self.share_second();
        let now = self.share.stat(rel)?.as_ref().map(share_id_of);
        let mut records = vec![Record::Deleted(rel.to_path_buf())];
        records.extend(self.base_records(rel, now, second));
        self.record(&mut inner, &records)?;
        Ok(conflict)
    }

    /// Empties the cache of everything but local-only paths and forgets the session. Only
    /// when nothing is unsynced and no sync is half done.
    ///
    /// A file still open for writing somewhere, or not as it was when the sync that just
    /// ran handed it to rsync (`handed`: path from the mount root, and [`Stat::version`]
    /// then), is kept (see [`must_stay`]): a program that had it open through a mount whose
    /// daemon died writes it through kernel passthrough, without any daemon, and a removed
    /// file would take those writes with it. Such a file stays in the cache as unsynced
    /// work (dirty, with the base its path has now), so the next session shows it and its
    /// next sync sends what was written.
    pub fn drop_clean_cache(&self, handed: &HashMap<PathBuf, Version>) -> FsResult<Emptied> {
        let mut inner = self.lock();
        if !inner.state.is_clean() || inner.state.sending().next().is_some() {
            return Ok(Emptied::default());
        }
        let mut tops = Vec::new();
        for (name, _, _) in self.cache.read_dir(Path::new("upper"))? {
            let rel = PathBuf::from(&name);
            if self.policy.classify(&rel) != PathClass::LocalOnly {
                tops.push(rel);
            }
        }
        let mut held = Vec::new();
        let mut local = Vec::new();
        for rel in &tops {
            find_kept(
                &self.cache,
                &self.policy,
                &up(rel),
                handed,
                &mut held,
                &mut local,
            )?;
        }
        let kept: Vec<PathBuf> = held
            .iter()
            .filter_map(|p| p.strip_prefix("upper").ok().map(Path::to_path_buf))
            .collect();
        for p in &kept {
            tracing::warn!(
                path = %shown(p),
                "a program of a session whose daemon ended writes it, or wrote it after it \
                 was sent: kept in the cache as unsynced work, sent by the next sync"
            );
        }
        // Clean copies stay for the next login on this workstation (a returning user's
        // profile costs the share a look a file, not a read): each file a sync left on the
        // share as it is (the size and mtime of its base), single-name. A lookup checks
        // each against the share before it serves (see `Overlay::revalidate`).
        // At most [`Overlay::set_keep_copies`] bytes of them, the newest first.
        // Newest first by the cache copy's mtime (a share's may be cut to whole seconds).
        let mut copies: Vec<(PathBuf, ShareId, (i64, i64))> = inner
            .state
            .bases()
            .filter_map(|(p, b)| Some((p.clone(), b?)))
            .filter(|(p, _)| self.policy.classify(p) == PathClass::Cached && !kept.contains(p))
            .filter_map(|(p, b)| match self.upper_stat(&p) {
                Ok(Some(m))
                    if m.is_file()
                        && m.nlink() == 1
                        && m.len() == b.size
                        && same_mtime_on_share(m.mtime(), b.mtime) =>
                {
                    Some((p, b, m.mtime()))
                }
                _ => None,
            })
            .collect();
        copies.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
        let mut room = self.keep_copies.load(Ordering::Relaxed);
        copies.retain(|(_, b, _)| {
            let fits = b.size <= room;
            if fits {
                room -= b.size;
            }
            fits
        });
        // Racy bases (see [`super::racy`]; the files this logout sent) are settled now,
        // once their second is over on the share, rather than by a read at the next
        // login: a copy whose share file no longer holds what was sent is not kept (the
        // next login shows the share's). One the share's clock cannot settle yet keeps
        // its mark.
        if let Some(last) = copies
            .iter()
            .filter(|(p, _, _)| inner.state.racy(p).is_some())
            .map(|(_, b, _)| b.ctime.0)
            .max()
        {
            self.wait_for_share_second(last, std::time::Duration::from_secs(3));
        }
        let second = self.share_second();
        let mut settled = HashSet::new();
        copies.retain(|(p, b, _)| match inner.state.racy(p) {
            Some(content) if b.ctime.0 < second => match self.share_still_holds(p, *b, content) {
                Some(true) => {
                    settled.insert(p.clone());
                    true
                }
                Some(false) => false,
                // The share does not answer: the copy keeps its mark, checked at its
                // next look like any racy base.
                None => true,
            },
            _ => true,
        });
        // What the kept files become, journaled before anything beside them is removed:
        // a failure here leaves the whole cache in place.
        let mut keep: Vec<Record> = copies
            .iter()
            .flat_map(|(p, b, _)| {
                let racy = inner
                    .state
                    .racy(p)
                    .filter(|_| !settled.contains(p))
                    .map(|c| Record::Racy(p.clone(), c));
                std::iter::once(Record::Base(p.clone(), Some(*b))).chain(racy)
            })
            .collect();
        for p in &kept {
            keep.extend(self.carried_base(&inner, p)?);
            if let Some((db, _)) = database_of(p) {
                if self.policy.classify(&db) == PathClass::Cached && !kept.contains(&db) {
                    keep.extend(self.carried_base(&inner, &db)?);
                }
            }
            keep.push(Record::Dirty(p.clone()));
        }
        if !keep.is_empty() {
            inner.journal.append(&keep).map_err(FsError::Journal)?;
        }
        let mut held: HashSet<PathBuf> = held.into_iter().collect();
        held.extend(copies.iter().map(|(p, _, _)| up(p)));
        held.extend(local);
        for rel in &tops {
            remove_tree_keeping(&self.cache, &up(rel), &held)?;
        }
        inner.state.reset();
        for r in &keep {
            inner.state.apply(r);
        }
        self.rewrite(&mut inner)?;
        Ok(Emptied {
            dropped: kept.is_empty(),
            kept_open: kept,
        })
    }

    /// The base `p` keeps when the session is forgotten around it: the one recorded (what
    /// the share held after our last sync of it), else what the share holds there now; a
    /// racy base with its mark (see [`super::racy`]).
    fn carried_base(&self, inner: &super::Inner, p: &Path) -> FsResult<Vec<Record>> {
        let (base, racy) = match inner.state.base_entry(p) {
            Some(b) => (b, inner.state.racy(p)),
            None => {
                let second = self.share_second();
                let now = self.share.stat(p)?;
                let id = now.as_ref().map(share_id_of);
                let racy = id
                    .filter(|b| {
                        now.as_ref().is_some_and(|m| m.is_file()) && Self::is_racy(b, second)
                    })
                    .and_then(|b| self.share_mark(p, b));
                (id, racy)
            }
        };
        let mark = racy.map(|c| Record::Racy(p.to_path_buf(), c));
        Ok(std::iter::once(Record::Base(p.to_path_buf(), base))
            .chain(mark)
            .collect())
    }

    /// Sets how many bytes of clean copies a logout keeps for the next login (see
    /// [`Overlay::drop_clean_cache`]); zero: none.
    pub fn set_keep_copies(&self, bytes: u64) {
        self.keep_copies.store(bytes, Ordering::Relaxed);
    }

    /// Rewrites the journal as a snapshot of the current state.
    pub fn compact(&self) -> FsResult<()> {
        let mut inner = self.lock();
        self.rewrite(&mut inner)
    }

    /// True when the journal holds work a sync must finish (dirty paths, deletions, or a
    /// sync cut short).
    pub fn has_unsynced_work(&self) -> bool {
        let inner = self.lock();
        !inner.state.is_clean() || inner.state.sending().next().is_some()
    }
}

impl SyncSession<'_> {
    /// Each file handed over, with its [`Stat::version`] then: one that is not so
    /// afterwards was written meanwhile (see [`Overlay::drop_clean_cache`]).
    pub fn handed(&self) -> HashMap<PathBuf, Version> {
        self.files
            .iter()
            .cloned()
            .zip(self.versions.iter().copied())
            .collect()
    }

    /// Settles what rsync did: paths that reached the share are marked clean (unless they
    /// changed meanwhile) and get their new base; the others stay dirty and are named. The
    /// deletions are applied only when every file is on the share (a renamed file's old
    /// name is never deleted before its new name arrived).
    pub fn finish(mut self, transfer: Transfer) -> FsResult<Settled> {
        self.finished = true;
        let o = self.overlay;
        let mut out = Settled {
            errors: std::mem::take(&mut self.errors),
            ..Default::default()
        };
        let landed = o.settle(&self.files, &self.sent, &transfer, &mut out.errors)?;
        // What a failed rsync left in its holding directories (a file that changed under it
        // and failed its check, or turned into a directory): resent whole next time. One
        // that exited 0 put every file in place.
        if transfer != Transfer::Complete {
            o.clean_partial_transfers(&self.files, &mut out.errors);
        }
        {
            let mut inner = o.lock();
            let mut clean = Vec::new();
            for p in &self.stale {
                if inner.state.is_dirty(p)
                    && !inner.touched.contains(p)
                    && o.upper_stat(p)?.is_none()
                {
                    clean.push(Record::Clean(p.clone()));
                }
            }
            for ((((p, ok), handed), quiet), sent) in self
                .files
                .iter()
                .zip(&landed)
                .zip(&self.versions)
                .zip(&self.quiet)
                .zip(&self.sent)
            {
                if !ok {
                    out.not_sent.push(p.clone());
                    continue;
                }
                if !inner.state.is_dirty(p) || inner.touched.contains(p) {
                    continue;
                }
                let Some(meta) = o.upper_stat(p)? else {
                    continue;
                };
                let ino = meta.ino();
                // Clean only when nothing could write it from the hand-over to now: no
                // writable descriptor anywhere then (a program's, the daemon's, or the
                // one a shared mapping holds after its descriptor was closed: under
                // kernel passthrough the kernel sends RELEASE at the close, and the
                // mapping writes the cache's file without the daemon), none opened
                // through the mount since (a new one is counted, or let go of during
                // the sync), and none now. A write through a mapping may change neither
                // the size nor the times (tmpfs), so the version alone cannot tell.
                // A file open for writing when the sync took it was sent as a snapshot: it
                // is clean if nothing can write it now and it is, byte for byte and to
                // the mtime, the snapshot the share got (a handle closed during the sync
                // without a write: the kernel's RELEASE of a handle closed just before a
                // sync often arrives during it).
                let writable_now = inner.writers.contains_key(&ino)
                    || (meta.is_file() && written_elsewhere(&o.cache, &up(p)));
                let unchanged = if *quiet {
                    !inner.released.contains(&ino) && meta.version() == *handed
                } else {
                    self.snapshots.contains(p)
                        && sent.is_some_and(|s| (s.size, s.mtime) == (meta.len(), meta.mtime()))
                        && o.same_as_snapshot(p)
                };
                if writable_now || !unchanged {
                    out.still_written.push(p.clone());
                    continue;
                }
                clean.push(Record::Clean(p.clone()));
            }
            out.cleaned = clean.len();
            clean.push(Record::SyncEnd);
            o.record(&mut inner, &clean)?;
        }
        if out.not_sent.is_empty() {
            for d in &self.deletions {
                match o.apply_deletion(d) {
                    Ok(Some(c)) => out.conflicts.push(c),
                    Ok(None) => out.deleted += 1,
                    Err(FsError::Journal(e)) => return Err(FsError::Journal(e)),
                    Err(e) => out
                        .errors
                        .push(format!("cannot delete {} on the share: {e}", shown(d))),
                }
            }
        } else {
            for p in &out.not_sent {
                out.errors
                    .push(format!("not sent to the share: {}", shown(p)));
            }
            if !self.deletions.is_empty() {
                out.errors.push(format!(
                    "{} deletions wait until every file reached the share",
                    self.deletions.len()
                ));
            }
        }
        Ok(out)
    }
}

impl Drop for SyncSession<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let mut errors = Vec::new();
            let settled = self
                .overlay
                .settle(&self.files, &self.sent, &Transfer::Incomplete, &mut errors)
                .and_then(|_| {
                    self.overlay
                        .record(&mut self.overlay.lock(), &[Record::SyncEnd])
                });
            if let Err(e) = settled {
                // The Sending marks stay; the next sync settles them.
                tracing::warn!("cannot settle an unfinished sync: {e}");
            }
        }
        self.overlay.lock_any().handed.clear();
        self.overlay.sync_running.store(false, Ordering::Release);
    }
}

/// What emptying the cache came to (see [`Overlay::drop_clean_cache`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Emptied {
    /// Nothing unsynced is left: the cache holds local-only paths and clean copies (each
    /// checked against the share before it serves), and the next session starts from
    /// the share.
    pub dropped: bool,
    /// Files kept because they were still open for writing, or written after they were
    /// handed to rsync (paths from the mount root): unsynced work now.
    pub kept_open: Vec<PathBuf>,
}

/// Whether the regular file at `rel` (below `root`) must stay: it is still open for
/// writing somewhere (or that cannot be told: the reason is logged), or it is not as it
/// was when a sync handed it to rsync just before (`handed`, by path from the mount root):
/// a program wrote it without the daemon in the meantime. The lease is asked first
/// ([`written_elsewhere`]), the file looked at after: a writer the lease does not see has
/// closed the file, and its writes are all in what the look sees. Both run as the cache's
/// owner (the daemon after dropping root, or the recovery child), never as root for a
/// user.
fn must_stay(root: &Root, rel: &Path, handed: &HashMap<PathBuf, Version>) -> bool {
    let path = rel.strip_prefix("upper").unwrap_or(rel);
    if written_elsewhere(root, rel) {
        tracing::warn!(path = %shown(path), "still open for writing");
        return true;
    }
    let now = match root.stat(rel) {
        Ok(Some(st)) if st.is_file() => st.version(),
        // Gone, or something else than a file now: nothing of a writer's to keep.
        Ok(_) => return false,
        Err(e) => {
            tracing::warn!(
                path = %shown(path),
                "cannot tell whether a cache file was written since it was sent ({e}); it is kept"
            );
            return true;
        }
    };
    match handed.get(path) {
        Some(then) if *then != now => {
            tracing::warn!(path = %shown(path), "written since it was handed to rsync");
            true
        }
        _ => false,
    }
}

/// Whether the regular file at `rel` (below `root`) is open for writing anywhere: by a
/// program, by the daemon, or by the kernel for a shared mapping whose descriptor was
/// closed (a lease tells, see [`crate::sys::open_for_writing`]). True when it cannot be
/// told. Opened as in [`must_stay`]: read-only, without following a symlink, blocking on
/// nothing.
fn written_elsewhere(root: &Root, rel: &Path) -> bool {
    let unknown = |e: &io::Error| {
        tracing::warn!(
            path = %shown(rel.strip_prefix("upper").unwrap_or(rel)),
            "cannot tell whether a cache file is open for writing ({e}); taken as written"
        );
        true
    };
    let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
    match root.open_file(rel, flags, 0) {
        Ok(file) => match crate::sys::fstat(&file) {
            Ok(st) if !st.is_file() => false,
            // Asked a few times: a process forking (a program starting another) holds a
            // copy of its descriptors for a moment.
            Ok(_) => (0..3).all(|i| {
                if i > 0 {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                crate::sys::open_for_writing(&file).unwrap_or_else(|e| unknown(&e))
            }),
            Err(e) => unknown(&e),
        },
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ELOOP)) => false,
        // Its owner may not read it (mode 0200, 0000): nor could a passthrough open or a
        // mapping have been made of it, which both need it open for reading and writing.
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => false,
        // Someone holds a write lease on it: open, for writing as far as we know.
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => true,
        Err(e) => unknown(&e),
    }
}

/// Collects every regular file at or below `rel` that must stay (see [`must_stay`]).
fn find_kept(
    root: &Root,
    policy: &Policy,
    rel: &Path,
    handed: &HashMap<PathBuf, Version>,
    held: &mut Vec<PathBuf>,
    local: &mut Vec<PathBuf>,
) -> io::Result<()> {
    let Some(meta) = root.stat(rel)? else {
        return Ok(());
    };
    // Local-only content below a cached directory (`local_only` globs such as a browser's
    // cache inside its profile) stays, as at the top.
    if rel
        .strip_prefix("upper")
        .is_ok_and(|m| policy.classify(m) == PathClass::LocalOnly)
    {
        local.push(rel.to_path_buf());
        return Ok(());
    }
    if meta.is_file() {
        if must_stay(root, rel, handed) {
            held.push(rel.to_path_buf());
        }
        return Ok(());
    }
    if !meta.is_dir() {
        return Ok(());
    }
    for (name, _, _) in root.read_dir(rel)? {
        find_kept(root, policy, &rel.join(name), handed, held, local)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_names_fit_in_name_max_and_keep_whole_characters() {
        let long = "é".repeat(127); // 254 bytes
        let n = conflict_file_name(long.as_bytes(), "host", "20261123T101010Z", 1, 255);
        assert!(n.len() <= 255, "{}", n.len());
        let text = n.to_str().expect("still UTF-8");
        assert!(text.ends_with(".ccfs-conflict-host-20261123T101010Z"));
        assert!(text.starts_with("éé"));
        let short = conflict_file_name(b".bashrc", "h", "s", 3, 255);
        assert_eq!(short, OsString::from(".bashrc.ccfs-conflict-h-s-3"));
    }

    /// `X-wal`, `X-shm` and `X-journal` belong to database `X`; a name that is only an
    /// ending belongs to none; a conflict name leaves room for the longest ending.
    #[test]
    fn journals_and_wals_belong_to_their_database() {
        let of = |p: &str| database_of(Path::new(p)).map(|(db, end)| (db, end.to_string()));
        assert_eq!(
            of(".m/places.sqlite-wal"),
            Some((PathBuf::from(".m/places.sqlite"), "-wal".into()))
        );
        assert_eq!(
            of(".x-journal"),
            Some((PathBuf::from(".x"), "-journal".into()))
        );
        assert_eq!(of(".m/-shm"), None);
        assert_eq!(of(".m/places.sqlite"), None);
        let long = "d".repeat(250);
        let n = conflict_file_name(long.as_bytes(), "host", "20261123T101010Z", 1, 255 - 8);
        assert!(n.len() + "-journal".len() <= 255, "{}", n.len());
    }

    /// The size and mtime we handed over, the cache copy's now, or an mtime written here
    /// after the hand-over make a share file ours; an older mtime between the two (another
    /// workstation's version from before our sync) is theirs.
    #[test]
    fn what_we_handed_over_hold_now_or_wrote_since_is_our_transfer() {
        let dir = tempfile::tempdir().expect("tmp");
        let stat_of = |name: &str, data: &[u8], mtime: i64| {
            let p = dir.path().join(name);
            std::fs::write(&p, data).expect("write");
            let t = std::fs::FileTimes::new()
                .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime as u64));
            std::fs::File::options()
                .write(true)
                .open(&p)
                .and_then(|f| f.set_times(t))
                .expect("times");
            let root = crate::sys::Root::open(dir.path()).expect("root");
            root.stat(Path::new(name)).expect("stat").expect("exists")
        };
        // Written at 1000, handed over at 5000, rewritten until 5010.
        let sent_stat = stat_of("sent", b"v1", 1000);
        let handed = Sent {
            size: sent_stat.len(),
            mtime: sent_stat.mtime(),
            since: Some((5000, 0)),
        };
        let sent = Some(handed);
        let ours = stat_of("ours", b"v3-now", 5010);
        let theirs = |name, data: &[u8], mtime| {
            is_our_transfer(&stat_of(name, data, mtime), Some(&ours), sent)
        };
        assert!(theirs("a", b"v1", 1000), "what we handed over");
        assert!(theirs("b", b"v3-now", 5010), "what the cache holds now");
        assert!(
            theirs("c", b"v2!", 5004),
            "a version written here during the sync"
        );
        assert!(
            !theirs("d", b"v2!", 3000),
            "another workstation's, from before our sync"
        );
        assert!(!theirs("e", b"v1", 1001), "the size we sent, another mtime");
        assert!(!theirs("f", b"v4", 5011), "after the cache's last write");
        // Not rewritten since the hand-over: no window (the share's old version, written
        // just before, is not ours).
        let unchanged = stat_of("unchanged", b"v1", 1000);
        let just_before = Sent {
            since: Some((1000, 5_000_000)),
            ..handed
        };
        assert!(!is_our_transfer(
            &stat_of("i", b"v0", 999),
            Some(&unchanged),
            Some(just_before)
        ));
        // A cache copy with an mtime in the future, not changed since the hand-over: the
        // share's older version, whose mtime lies between the two, is not ours.
        let real_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs() as i64;
        let future = stat_of("future", b"v1", real_now + 10_000_000);
        let handed_later = Sent {
            size: future.len(),
            mtime: future.mtime(),
            since: Some((real_now + 1000, 0)),
        };
        assert!(!is_our_transfer(
            &stat_of("j", b"v0", real_now + 2000),
            Some(&future),
            Some(handed_later)
        ));
        let old_journal = Some(Sent {
            since: None,
            ..handed
        });
        assert!(!is_our_transfer(
            &stat_of("g", b"v2!", 5004),
            Some(&ours),
            old_journal
        ));
        assert!(!is_our_transfer(&stat_of("h", b"v1", 1000), None, None));
    }

    /// With rsync's report: the share's file is ours when rsync named the path, the file
    /// has the mtime rsync listed (whole seconds), and it is not the file the conflict
    /// check saw there; what the cache holds now does not matter.
    #[test]
    fn what_rsync_reported_and_put_in_place_is_our_transfer() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = crate::sys::Root::open(dir.path()).expect("root");
        let stat_of = |name: &str, data: &[u8], mtime: (u64, u32)| {
            let p = dir.path().join(name);
            std::fs::write(&p, data).expect("write");
            let t = std::fs::FileTimes::new()
                .set_modified(std::time::UNIX_EPOCH + std::time::Duration::new(mtime.0, mtime.1));
            std::fs::File::options()
                .write(true)
                .open(&p)
                .and_then(|f| f.set_times(t))
                .expect("times");
            root.stat(Path::new(name)).expect("stat").expect("exists")
        };
        let old_share = stat_of("old", b"v0", (3000, 0));
        let base = Some(share_id_of(&old_share));
        let put = stat_of("put", b"v2, rewritten in place", (5004, 250_000_000));
        // The cache copy was replaced since by a file written long before.
        let replaced = stat_of("replaced", b"v3", (1000, 0));
        assert!(is_reported_transfer(
            &put,
            Some(&replaced),
            base,
            Some(Put::File(5004))
        ));
        assert!(is_reported_transfer(
            &put,
            None,
            base,
            Some(Put::File(5004))
        ));
        assert!(is_reported_transfer(
            &put,
            Some(&replaced),
            None,
            Some(Put::File(5004))
        ));
        assert!(
            !is_reported_transfer(&put, Some(&replaced), base, None),
            "rsync did not name it"
        );
        assert!(
            !is_reported_transfer(&put, Some(&replaced), base, Some(Put::File(5005))),
            "another mtime than rsync listed"
        );
        assert!(
            !is_reported_transfer(&old_share, Some(&replaced), base, Some(Put::File(3000))),
            "named by rsync, never put in place: the file the check saw"
        );
        // Not a regular file: the same kind as the cache's is ours, as without a report.
        std::fs::create_dir(dir.path().join("d")).expect("mkdir");
        std::fs::create_dir(dir.path().join("e")).expect("mkdir");
        let (d, e) = (
            root.stat(Path::new("d")).expect("stat").expect("d"),
            root.stat(Path::new("e")).expect("stat").expect("e"),
        );
        assert!(is_reported_transfer(&d, Some(&e), None, None));
        assert!(!is_reported_transfer(&d, Some(&put), None, None));
        // A directory rsync made is ours even when the cache has a file at the name now,
        // and even with the inode number of the one the check saw (a share reusing the
        // number of a directory removed elsewhere); another kind than it made is not.
        let made = Some(Put::Made(libc::S_IFDIR));
        assert!(is_reported_transfer(&d, Some(&put), None, made));
        assert!(is_reported_transfer(
            &d,
            Some(&put),
            Some(share_id_of(&d)),
            made
        ));
        assert!(!is_reported_transfer(
            &d,
            Some(&put),
            None,
            Some(Put::Made(libc::S_IFLNK))
        ));
    }
}
