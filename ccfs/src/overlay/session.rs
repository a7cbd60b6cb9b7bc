//! One sync of the cache to the share, as a guard value: [`Overlay::begin_sync`] checks
//! every path against the share (conflicts), takes the list of what to send and journals it
//! as being sent; the caller runs rsync; [`SyncSession::finish`] settles what rsync did.
//! A session dropped unfinished (rsync could not run, or a panic) settles as an incomplete
//! transfer. A crash leaves the `Sending` records, which the next session settles first.
//!
//! Settling a path compares the share with what was sent: a share file with the size and
//! mtime the cache copy had when it was handed to rsync is our own transfer, and becomes the
//! path's base; anything else is someone else's, and the base stays, so the next sync sees
//! the conflict (see doc/SEMANTICS.md, "Sessions").

use std::collections::{BTreeSet, HashSet};
use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::{remove_tree, up, Overlay};
use crate::error::{FsError, FsResult};
use crate::policy::PathClass;
use crate::state::{Record, Sent, ShareId};
use crate::sys::{Root, Stat};

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
}

/// One conflict found at sync; nothing is overwritten, both versions are kept.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Conflict {
    pub path: PathBuf,
    pub kind: ConflictKind,
    /// Where our version went (the conflict copy), or what was kept.
    pub kept: String,
}

/// What rsync reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    /// Exit 0: every listed path was sent.
    Complete,
    /// Anything else (a partial transfer, a kill, a crash): each path is checked.
    Incomplete,
}

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
    /// Conflicts found before sending (both versions kept).
    pub conflicts: Vec<Conflict>,
    /// Paths held back from this sync, with why (their check against the share failed).
    pub errors: Vec<String>,
    finished: bool,
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

/// Is the share object `theirs` our own transfer of the cache object `ours`, handed to rsync
/// as `sent`? Only when it has exactly the size and mtime we handed over, or those the cache
/// copy has now (rsync keeps the cache's mtimes, to the nanosecond where the share keeps
/// them). A version the user wrote while rsync was reading and then wrote again is not
/// recognised: it is taken for another workstation's, and the next sync keeps both (a
/// needless conflict copy, never a lost file).
fn is_our_transfer(theirs: &Stat, ours: Option<&Stat>, sent: Option<Sent>) -> bool {
    if !theirs.is_file() {
        return ours.is_some_and(|o| o.file_type() == theirs.file_type());
    }
    let t = (theirs.len(), theirs.mtime());
    let now = ours.filter(|o| o.is_file()).map(|o| (o.len(), o.mtime()));
    let then = sent.map(|s| (s.size, s.mtime));
    then == Some(t) || now == Some(t)
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
/// in NAME_MAX (255 bytes).
pub fn conflict_file_name(name: &[u8], host: &str, stamp: &str, n: u32) -> OsString {
    let suffix = if n <= 1 {
        format!(".ccfs-conflict-{host}-{stamp}")
    } else {
        format!(".ccfs-conflict-{host}-{stamp}-{n}")
    };
    let suffix = truncate_name(suffix.as_bytes(), 200);
    let mut out = truncate_name(name, 255 - suffix.len()).to_vec();
    out.extend_from_slice(suffix);
    OsString::from_vec(out)
}

impl Overlay {
    /// Starts a sync: settles what an interrupted one left, checks every dirty and deleted
    /// path against the share (moving our version aside where another workstation changed
    /// the share's), and journals what is about to be sent. A path whose check fails is held
    /// back and reported; the others go on.
    pub fn begin_sync(&self, host: &str, stamp: &str) -> FsResult<SyncSession<'_>> {
        self.sync_running.store(true, Ordering::Release);
        let mut session = SyncSession {
            overlay: self,
            files: Vec::new(),
            deletions: Vec::new(),
            stale: Vec::new(),
            sent: Vec::new(),
            conflicts: Vec::new(),
            errors: Vec::new(),
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
            self.settle(&files, &sent, Transfer::Incomplete, &mut session.errors)?;
            self.record(&mut self.lock(), &[Record::SyncEnd])?;
            self.clean_partial_transfers(&files, &mut session.errors);
        }
        let held = self.check_conflicts(host, stamp, &mut session)?;
        let mut inner = self.lock();
        let mut files: Vec<PathBuf> = inner
            .state
            .dirty()
            .filter(|p| self.policy.classify(p) != PathClass::LocalOnly && !held.contains(*p))
            .cloned()
            .collect();
        files.sort();
        let mut present = Vec::new();
        for p in files {
            match self.upper_stat(&p) {
                Ok(Some(m)) => present.push((p, m)),
                Ok(None) => session.stale.push(p),
                Err(e) => session.errors.push(io_err("cannot look at", &p, &e)),
            }
        }
        self.add_hard_link_names(&mut present)?;
        session.sent = present
            .iter()
            .map(|(_, m)| {
                m.is_file().then(|| Sent {
                    size: m.len(),
                    mtime: m.mtime(),
                })
            })
            .collect();
        session.files = present.into_iter().map(|(p, _)| p).collect();
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

    /// Compares what the share holds at each dirty or deleted path with its base. Where
    /// another workstation changed it, nothing is overwritten: our version moves to a
    /// conflict copy (sent beside the share's), and a deletion of a file changed there is
    /// dropped. Returns the paths held back because the share could not be asked.
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
        for p in dirty {
            // The share is asked without the lock held; the answer is compared under it.
            let Some(cur) = self.share_now(&p, session, &mut held) else {
                continue;
            };
            let mut inner = self.lock();
            let base = inner.state.base(&p);
            if cur == base || !inner.state.is_dirty(&p) {
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
            match (base, cur) {
                (Some(_), None) => {
                    self.record(&mut inner, &[Record::Base(p.clone(), None)])?;
                    session.conflicts.push(Conflict {
                        path: p.clone(),
                        kind: ConflictKind::ModifiedHereDeletedThere,
                        kept: "ours, written back".into(),
                    });
                }
                (None, Some(c)) if self.same_content(&p, &ours, &c).unwrap_or(false) => {
                    self.record(&mut inner, &[Record::Base(p.clone(), Some(c))])?;
                }
                _ => match self.move_aside(&mut inner, &p, cur, host, stamp) {
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
            let Some(cur) = self.share_now(&w, session, &mut held) else {
                continue;
            };
            let mut inner = self.lock();
            if !inner.state.is_whiteout(&w)
                || cur.is_none()
                || cur == inner.state.base(&w)
                || self.upper_stat(&w)?.is_some()
            {
                continue;
            }
            self.record(
                &mut inner,
                &[Record::Deleted(w.clone()), Record::Base(w.clone(), cur)],
            )?;
            tracing::warn!(path = %shown(&w), "conflict: deleted here, changed on the share; kept");
            session.conflicts.push(Conflict {
                path: w,
                kind: ConflictKind::DeletedHereModifiedThere,
                kept: "the share's version".into(),
            });
        }
        Ok(held)
    }

    /// What the share holds at `p` now, asked without the lock; when it cannot say, `p` is
    /// held back from this sync and the reason recorded.
    fn share_now(
        &self,
        p: &Path,
        session: &mut SyncSession<'_>,
        held: &mut HashSet<PathBuf>,
    ) -> Option<Option<ShareId>> {
        match self.share.stat(p) {
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

    /// Moves our version of `p` to a conflict name; the share's version at `p` becomes the
    /// base (it is what the user now sees there).
    fn move_aside(
        &self,
        inner: &mut super::Inner,
        p: &Path,
        cur: Option<ShareId>,
        host: &str,
        stamp: &str,
    ) -> FsResult<PathBuf> {
        let name = self.conflict_name(inner, p, host, stamp)?;
        let base_there = self.share.stat(&name)?.as_ref().map(share_id_of);
        // The directory may be a read-only one's copy (see `with_write_access`).
        let dir = up(p.parent().unwrap_or(Path::new("")));
        self.with_write_access(&dir, || {
            self.cache
                .rename(&up(p), &up(&name), libc::RENAME_NOREPLACE)
        })?;
        self.record(
            inner,
            &[
                Record::Rename {
                    from: p.to_path_buf(),
                    to: name.clone(),
                },
                Record::Dirty(name.clone()),
                Record::Base(name.clone(), base_there),
                Record::Base(p.to_path_buf(), cur),
            ],
        )?;
        Ok(name)
    }

    /// Same bytes in our copy and the share's (small files only)?
    fn same_content(&self, rel: &Path, ours: &Stat, theirs: &ShareId) -> io::Result<bool> {
        if ours.len() != theirs.size || ours.len() > 1 << 20 || !ours.is_file() {
            return Ok(false);
        }
        let read = |root: &Root, at: &Path| -> io::Result<Vec<u8>> {
            let mut v = Vec::new();
            io::Read::read_to_end(&mut root.open_file(at, libc::O_RDONLY, 0)?, &mut v)?;
            Ok(v)
        };
        Ok(read(&self.cache, &up(rel))? == read(&self.share, rel)?)
    }

    fn conflict_name(
        &self,
        inner: &super::Inner,
        rel: &Path,
        host: &str,
        stamp: &str,
    ) -> io::Result<PathBuf> {
        let base = rel.file_name().unwrap_or_default().as_bytes();
        for n in 1..1000 {
            let name = rel.with_file_name(conflict_file_name(base, host, stamp, n));
            if self.upper_stat(&name)?.is_none()
                && self.share.stat(&name)?.is_none()
                && !inner.state.is_dirty(&name)
            {
                return Ok(name);
            }
        }
        Err(io::Error::from_raw_os_error(libc::EEXIST))
    }

    /// A changed file with several names changed under all of them: rsync must see every
    /// name to keep the link group whole on the share (`--hard-links`).
    fn add_hard_link_names(&self, files: &mut Vec<(PathBuf, Stat)>) -> io::Result<()> {
        let inodes: HashSet<u64> = files
            .iter()
            .filter(|(_, m)| !m.is_dir() && m.nlink() > 1)
            .map(|(_, m)| m.ino())
            .collect();
        if inodes.is_empty() {
            return Ok(());
        }
        let mut have: BTreeSet<PathBuf> = files.iter().map(|(p, _)| p.clone()).collect();
        self.walk_upper(|rel, ino, kind| {
            if kind != libc::S_IFDIR && inodes.contains(&ino) && have.insert(rel.to_path_buf()) {
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
    /// ([`crate::sync::PARTIAL_DIR`]), then that directory if it is empty. Nothing else is
    /// ever removed there.
    fn clean_partial_transfers(&self, files: &[PathBuf], errors: &mut Vec<String>) {
        let mut dirs: BTreeSet<PathBuf> = BTreeSet::new();
        for p in files {
            let (Some(name), parent) = (p.file_name(), p.parent().unwrap_or(Path::new(""))) else {
                continue;
            };
            let holding = parent.join(crate::sync::PARTIAL_DIR);
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
        transfer: Transfer,
        errors: &mut Vec<String>,
    ) -> FsResult<Vec<bool>> {
        let mut landed = Vec::with_capacity(files.len());
        let mut records = Vec::new();
        for (p, s) in files.iter().zip(sent) {
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
                Transfer::Incomplete => is_our_transfer(t, ours.as_ref(), *s),
            });
            if ok {
                records.push(Record::Base(p.clone(), theirs.as_ref().map(share_id_of)));
            }
            landed.push(ok);
        }
        self.record(&mut self.lock(), &records)?;
        Ok(landed)
    }

    /// Deletes `rel` on the share if it is still a whiteout and the cache has nothing
    /// there, then records the whiteout done. A directory someone filled meanwhile is kept
    /// (a conflict).
    fn apply_deletion(&self, rel: &Path) -> FsResult<Option<Conflict>> {
        let mut inner = self.lock();
        if !inner.state.is_whiteout(rel) {
            return Ok(None);
        }
        let mut conflict = None;
        if self.upper_stat(rel)?.is_none() {
            if let Some(meta) = self.share.stat(rel)? {
                let r = if meta.is_dir() {
                    self.share.rmdir(rel)
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
        let now = self.share.stat(rel)?.as_ref().map(share_id_of);
        self.record(
            &mut inner,
            &[
                Record::Deleted(rel.to_path_buf()),
                Record::Base(rel.to_path_buf(), now),
            ],
        )?;
        Ok(conflict)
    }

    /// Empties the cache of everything but local-only paths and forgets the session. Only
    /// when nothing is unsynced and no sync is half done.
    pub fn drop_clean_cache(&self) -> FsResult<bool> {
        let mut inner = self.lock();
        if !inner.state.is_clean() || inner.state.sending().next().is_some() {
            return Ok(false);
        }
        for (name, _, _) in self.cache.read_dir(Path::new("upper"))? {
            let rel = PathBuf::from(&name);
            if self.policy.classify(&rel) == PathClass::LocalOnly {
                continue;
            }
            remove_tree(&self.cache, &up(&rel))?;
        }
        inner.state.reset();
        let super::Inner { state, journal, .. } = &mut *inner;
        journal.compact(state).map_err(FsError::Journal)?;
        Ok(true)
    }

    /// Rewrites the journal as a snapshot of the current state.
    pub fn compact(&self) -> FsResult<()> {
        let mut inner = self.lock();
        let super::Inner { state, journal, .. } = &mut *inner;
        journal.compact(state).map_err(FsError::Journal)
    }

    /// True when the journal holds work a sync must finish (dirty paths, deletions, or a
    /// sync cut short).
    pub fn has_unsynced_work(&self) -> bool {
        let inner = self.lock();
        !inner.state.is_clean() || inner.state.sending().next().is_some()
    }
}

impl SyncSession<'_> {
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
        let landed = o.settle(&self.files, &self.sent, transfer, &mut out.errors)?;
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
            for (p, ok) in self.files.iter().zip(&landed) {
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
                if inner.writers.contains_key(&ino) || inner.released.contains(&ino) {
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
                .settle(&self.files, &self.sent, Transfer::Incomplete, &mut errors)
                .and_then(|_| {
                    self.overlay
                        .record(&mut self.overlay.lock(), &[Record::SyncEnd])
                });
            if let Err(e) = settled {
                // The Sending marks stay; the next sync settles them.
                tracing::warn!("cannot settle an unfinished sync: {e}");
            }
        }
        self.overlay.sync_running.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_names_fit_in_name_max_and_keep_whole_characters() {
        let long = "é".repeat(127); // 254 bytes
        let n = conflict_file_name(long.as_bytes(), "host", "20261123T101010Z", 1);
        assert!(n.len() <= 255, "{}", n.len());
        let text = n.to_str().expect("still UTF-8");
        assert!(text.ends_with(".ccfs-conflict-host-20261123T101010Z"));
        assert!(text.starts_with("éé"));
        let short = conflict_file_name(b".bashrc", "h", "s", 3);
        assert_eq!(short, OsString::from(".bashrc.ccfs-conflict-h-s-3"));
    }

    /// Only the exact size and mtime we handed over, or the cache copy's now, make a share
    /// file ours; anything between (another workstation writing meanwhile) is theirs.
    #[test]
    fn only_what_we_handed_over_or_hold_now_is_our_transfer() {
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
        let sent_stat = stat_of("sent", b"v1", 1000);
        let sent = Some(Sent {
            size: sent_stat.len(),
            mtime: sent_stat.mtime(),
        });
        let ours = stat_of("ours", b"v3-now", 3000);
        assert!(is_our_transfer(
            &stat_of("a", b"v1", 1000),
            Some(&ours),
            sent
        ));
        assert!(is_our_transfer(
            &stat_of("b", b"v3-now", 3000),
            Some(&ours),
            sent
        ));
        assert!(!is_our_transfer(
            &stat_of("c", b"v2!", 2000),
            Some(&ours),
            sent
        ));
        assert!(!is_our_transfer(
            &stat_of("d", b"v1", 1001),
            Some(&ours),
            sent
        ));
        assert!(!is_our_transfer(&stat_of("e", b"v1", 1000), None, None));
    }
}
