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

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::error::{FsError, FsResult};
use crate::locks::Locked;
use crate::policy::PathClass;
use crate::state::{Content, Record, Sent, ShareId};
use crate::sys::{self, Stat, Version};

use super::{up, Overlay};

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
    /// Held by block and changed here, and changed on the share while the daemon did not
    /// hold the share's old version open (a crash of this workstation in between): the
    /// blocks it lacks cannot be read any more, so it cannot be made whole. The share's
    /// version shows; ours is kept in the cache as it is (its blocks, and the list of
    /// them), where `kept` says.
    BlocksKeptHere,
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
    /// Regular files the sync sends itself rather than through rsync (see
    /// `overlay/send_files.rs`).
    pub direct: Vec<PathBuf>,
    /// The paths the conflict checks found a directory at on the share.
    dirs_there: HashSet<PathBuf>,
    /// Files held by block, which the sync sends by their changed blocks (see
    /// `overlay/send_blocks.rs`).
    pub by_blocks: Vec<PathBuf>,
    /// Of those, the ones open for writing when the sync took them: sent from their
    /// snapshot, with the blocks changed then.
    pub block_snapshots: HashMap<PathBuf, (crate::extents::Extents, u64)>,
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

/// The endings of the files that belong to a database `X` (SQLite's `X-wal`, `X-shm` and
/// `X-journal`): their content only means something with the version of `X` it was
/// written against.
pub const DATABASE_COMPANIONS: [&str; 3] = ["-wal", "-shm", "-journal"];

mod conflicts;
mod logout;
mod settle;

pub(super) use conflicts::database_of;
pub use logout::Emptied;
use logout::*;
use settle::*;

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
        *self.sync_host.locked() = host.to_string();
        let mut session = SyncSession::new(self);
        self.settle_leftover(&mut session.errors)?;
        // The blocks written so far on record; a file held by block whose base the share
        // no longer has is made whole first, for the conflict to keep it aside.
        self.blocks_before_sync(host, stamp, &mut session)?;
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
        self.take_snapshots(&inner, &present, &mut session, handed_over);
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
        // (Asked of the share without the lock.)
        session.direct = self
            .share_takes_directly(std::mem::take(&mut session.direct), &session.dirs_there)
            .0;
        let files = session.files.clone();
        self.clean_partial_transfers(&files, &mut session.errors);
        Ok(session)
    }

    /// Settles the Sending marks a crash (or a failed settle) left, before anything
    /// compares the share with the bases.
    fn settle_leftover(&self, errors: &mut Vec<String>) -> FsResult<()> {
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
            self.settle(&files, &sent, &Transfer::Incomplete, errors)?;
            self.record(&mut self.lock(), &[Record::SyncEnd])?;
            self.clean_partial_transfers(&files, errors);
        }
        Ok(())
    }

    /// Copies taken now of the files of `present` open for writing, handed over in their
    /// place (see [`super::snapshot`]); a file mostly holes is sent by the sync itself, as
    /// is one held by block (`by_blocks`).
    fn take_snapshots(
        &self,
        inner: &crate::overlay::Inner,
        present: &[(PathBuf, Stat)],
        session: &mut SyncSession<'_>,
        handed_over: (i64, i64),
    ) {
        // A file that is mostly holes is sent by the sync itself; one open for writing
        // as a copy taken now (a file that changes while rsync reads it is discarded by
        // rsync's check): what is handed over is the copy.
        self.drop_snapshots();
        for (i, (p, m)) in present.iter().enumerate() {
            if inner.state().partial(p).is_some() {
                session.by_blocks.push(p.clone());
                if !session.quiet[i] {
                    self.snapshot_by_block(inner, p, i, session, handed_over);
                }
                continue;
            }
            if self.sent_as_sparse(p, m) {
                session.sparse.push(p.clone());
                continue;
            }
            if self.may_send_directly(p, m, session.quiet[i]) {
                session.direct.push(p.clone());
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
            if self.snapshot_handed(p, i, session, handed_over) {
                session.snapshots.push(p.clone());
            }
        }
    }

    /// A file held by block open for writing: sent from a copy taken now (holes where the
    /// cache file has them), with its limit then and every block written before the copy
    /// (the state's changed blocks, which cannot change while the overlay's lock is
    /// held, and those not journaled yet). A cut or a block written during the copy (the
    /// limit or the blocks not journaled changed) sends no snapshot.
    fn snapshot_by_block(
        &self,
        inner: &crate::overlay::Inner,
        p: &Path,
        i: usize,
        session: &mut SyncSession<'_>,
        handed_over: (i64, i64),
    ) {
        let Some(part) = inner.state().partial(p) else {
            return;
        };
        let bf = self.block_files.locked().get(p).cloned();
        let limit = |bf: &Option<std::sync::Arc<crate::overlay::BlockFile>>| match bf {
            Some(b) => b.written_now(),
            None => (crate::extents::Extents::new(), part.limit),
        };
        // The blocks written so far are in the cache file before the copy starts: the
        // copy has their bytes (or later ones). A block written for the first time while
        // the copy runs may be a hole in it: then no snapshot is sent (the file is sent
        // as it is and stays dirty), never a hole for a block that has data.
        let (written, before) = limit(&bf);
        if !self.snapshot_handed(p, i, session, handed_over) {
            return;
        }
        #[cfg(test)]
        super::interleave_tests::after_block_snapshot(self);
        let (written_after, after) = limit(&bf);
        if after != before || written_after != written {
            return;
        }
        let mut changed = part.changed.clone();
        changed.insert_all(&written);
        session
            .block_snapshots
            .insert(p.to_path_buf(), (changed, before));
    }

    /// Takes the snapshot of `p` (the `i`th file handed over): what is handed over is the
    /// copy. False when it could not be taken (the file is sent as it is, as before:
    /// rsync may discard it, and it stays dirty).
    fn snapshot_handed(
        &self,
        p: &Path,
        i: usize,
        session: &mut SyncSession<'_>,
        handed_over: (i64, i64),
    ) -> bool {
        match self.snapshot(p) {
            Ok(copy) => {
                session.sent[i] = Some(Sent {
                    size: copy.len(),
                    mtime: copy.mtime(),
                    since: Some(handed_over),
                });
                true
            }
            Err(e) => {
                tracing::warn!(path = %shown(p), "cannot take a snapshot of a file being written: {e}");
                false
            }
        }
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
                // A file held by block is sent by its blocks (a stamp of the share's
                // file would change the base its missing blocks are read from).
                .filter(|p| inner.state.partial(p).is_none())
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
        // A racy base (see [`super::racy`]) whose content the share's file no longer has:
        // written there in the second of the look, a change rsync would overwrite.
        if let Some(c) = racy {
            let theirs_attributes = super::racy::attributes_of(&theirs_file)?;
            let theirs_data = super::racy::content_of(&theirs_file)?;
            if !super::racy::mark_holds(c, theirs_data, &theirs_attributes) {
                return Ok(Unchanged::Hold);
            }
        }
        // Ours as the view has it (a file held by block lacks blocks in its cache file)
        // against the share's, a chunk at a time.
        if theirs.len() != ours.len() {
            return Ok(Unchanged::Send);
        }
        if !self.view_equals(p, &theirs_file, ours.len())? {
            return Ok(Unchanged::Send);
        }
        let mine = super::racy::content_of_view(self, p)?;
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
        if super::racy::content_of(&theirs_file)? != mine
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
                super::racy::sealed(mine, &attributes),
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

impl<'a> SyncSession<'a> {
    /// An empty session of `overlay`, nothing checked or handed over yet.
    fn new(overlay: &'a Overlay) -> Self {
        SyncSession {
            overlay,
            files: Vec::new(),
            deletions: Vec::new(),
            stale: Vec::new(),
            sent: Vec::new(),
            versions: Vec::new(),
            quiet: Vec::new(),
            snapshots: Vec::new(),
            sparse: Vec::new(),
            direct: Vec::new(),
            dirs_there: HashSet::new(),
            by_blocks: Vec::new(),
            block_snapshots: HashMap::new(),
            conflicts: Vec::new(),
            errors: Vec::new(),
            carries: Carries {
                acls: true,
                xattrs: true,
                implied_dirs: false,
            },
            unchanged: 0,
            finished: false,
        }
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
        // that exited 0 put every file in place, as did the sync's own sends that all
        // renamed theirs.
        let all_put = |t: &Transfer| match t {
            Transfer::Complete => true,
            Transfer::Partly { exact, rest } => {
                exact.values().all(Option::is_some) && **rest == Transfer::Complete
            }
            _ => false,
        };
        if !all_put(&transfer) {
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
                    (self.snapshots.contains(p) || self.block_snapshots.contains_key(p))
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
