//! A sync's conflict checks: each path against the share's file (its base), directories,
//! databases with their journals, hard links' other names; what is set aside and under
//! which name.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::error::{FsError, FsResult};
use crate::locks::Locked;
use crate::overlay::{up, Overlay};
use crate::policy::PathClass;
use crate::state::{Content, Record, ShareId};
use crate::sys::{self, Stat};

use super::*;

/// The database a journal or WAL `rel` belongs to, and the ending that names it so.
pub(in crate::overlay) fn database_of(rel: &Path) -> Option<(PathBuf, &'static str)> {
    let name = rel.file_name()?.as_bytes();
    DATABASE_COMPANIONS.iter().find_map(|end| {
        let stem = name.strip_suffix(end.as_bytes())?;
        (!stem.is_empty()).then(|| (rel.with_file_name(OsStr::from_bytes(stem)), *end))
    })
}

/// `p` with `end` appended to its last component.
pub(super) fn with_ending(p: &Path, end: &str) -> PathBuf {
    let mut name = p.file_name().unwrap_or_default().to_os_string();
    name.push(end);
    p.with_file_name(name)
}

/// The longest prefix of `name` of at most `max` bytes that ends on a character boundary
/// (when `name` is UTF-8).
pub(super) fn truncate_name(name: &[u8], max: usize) -> &[u8] {
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

/// How a conflict set aside is told: its kind, what the log line says of it, and the
/// problem named when it cannot be set aside ("PATH {problem} could not be set aside").
struct Aside<'a> {
    kind: ConflictKind,
    said: &'a str,
    problem: &'a str,
}

impl Overlay {
    /// Compares what the share holds at each dirty or deleted path with its base. Where
    /// another workstation changed it, nothing is overwritten: our version moves to a
    /// conflict copy (sent beside the share's), and a deletion of a file changed there is
    /// dropped. Before that, the share's object at every directory we send into (and its
    /// database, for a journal or WAL) is checked; after it, the share's directory where
    /// we send another kind of object (see [`Overlay::check_directories`],
    /// [`Overlay::check_databases`], [`Overlay::check_replaced_directories`]). Returns the
    /// paths held back because the share could not be asked.
    pub(super) fn check_conflicts(
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
            self.check_dirty_path(p.clone(), host, stamp, session, &mut held)?;
        }
        for w in whiteouts {
            self.check_whiteout(w, session, &mut held)?;
        }
        self.check_replaced_directories(&dirty, host, stamp, session, &mut held)?;
        Ok(held)
    }

    /// The share's object at `p` for a conflict check, asked without the lock held (the
    /// answer is compared under it): the share's second before the look, the object (none:
    /// nothing there), and whether a racy base still stands. None when the share could not
    /// be asked (`p` is held, with the error).
    fn look_to_check(
        &self,
        p: &Path,
        session: &mut SyncSession<'_>,
        held: &mut HashSet<PathBuf>,
    ) -> FsResult<Option<(i64, Option<ShareId>, bool)>> {
        let second = self.share_second();
        let Some(cur) = self.share_now(p, session, held) else {
            return Ok(None);
        };
        let Some(stands) = self.still_base(p, cur, second, session, held, &[])? else {
            return Ok(None);
        };
        Ok(Some((second, cur, stands)))
    }

    /// The conflict check of one dirty path `p`: the share's object against its base;
    /// another workstation's change sets ours aside (or, created on both with the same
    /// bytes, theirs becomes the base). A path the share cannot be asked about is held.
    fn check_dirty_path(
        &self,
        p: PathBuf,
        host: &str,
        stamp: &str,
        session: &mut SyncSession<'_>,
        held: &mut HashSet<PathBuf>,
    ) -> FsResult<()> {
        // Held, or moved aside with its directory above.
        if held.contains(&p) || !self.lock().state.is_dirty(&p) {
            return Ok(());
        }
        let Some((second, cur, stands)) = self.look_to_check(&p, session, held)? else {
            return Ok(());
        };
        let mut inner = self.lock();
        let base = inner.state.base(&p);
        if (cur == base && stands) || !inner.state.is_dirty(&p) {
            return Ok(());
        }
        let ours = match self.upper_stat(&p) {
            Ok(Some(m)) if !m.is_dir() => m,
            Ok(_) => return Ok(()),
            Err(e) => {
                session.errors.push(io_err("cannot look at", &p, &e));
                held.insert(p);
                return Ok(());
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
            _ => {
                let kind = if base.is_none() {
                    ConflictKind::CreatedOnBoth
                } else {
                    ConflictKind::ModifiedOnBoth
                };
                let aside = Aside {
                    kind,
                    said: &format!("{kind:?}"),
                    problem: "changed on the share and here, and our version",
                };
                let look = (cur, second);
                if !self.set_aside(&mut inner, &p, look, (host, stamp), aside, session)? {
                    held.insert(p);
                }
            }
        }
        Ok(())
    }

    /// The conflict check of one deletion `w`: the share's object changed since its base
    /// keeps the deletion from being sent (deleted here, changed there: theirs is kept).
    fn check_whiteout(
        &self,
        w: PathBuf,
        session: &mut SyncSession<'_>,
        held: &mut HashSet<PathBuf>,
    ) -> FsResult<()> {
        // Below a share object that is no directory (another workstation replaced one,
        // or our own directory went aside above), the share has nothing to delete.
        match self.share_ancestor_not_dir(&w) {
            Ok(true) => {
                let mut inner = self.lock();
                if inner.state.is_whiteout(&w) && self.upper_stat(&w)?.is_none() {
                    self.record(&mut inner, &[Record::Deleted(w.clone())])?;
                }
                return Ok(());
            }
            Ok(false) => {}
            Err(e) => {
                session
                    .errors
                    .push(io_err("cannot check on the share", &w, &e));
                held.insert(w);
                return Ok(());
            }
        }
        let Some((second, cur, stands)) = self.look_to_check(&w, session, held)? else {
            return Ok(());
        };
        let mut inner = self.lock();
        if !inner.state.is_whiteout(&w)
            || cur.is_none()
            || (cur == inner.state.base(&w) && stands)
            || self.upper_stat(&w)?.is_some()
        {
            return Ok(());
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
        Ok(())
    }

    /// A directory we send into must be a directory on the share, or nothing there: rsync
    /// would delete a file (or symlink, or anything else) in its way. For each dirty path,
    /// every directory of the cache on its way (top down, the path itself when it is a
    /// directory) is compared with the share: another kind of object there, unless it is
    /// what we took over and replaced ourselves, is a conflict. The share keeps its
    /// object; our directory, with all it holds, moves to a conflict name and is sent there.
    pub(super) fn check_directories(
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
                // Our own change: we took that object over and made a directory there
                // (the same look, and for a racy base the content it stands for: a write
                // in place in the second of our take-over leaves the look as it was).
                let taken = self.lock().state.taken_over(dir);
                if taken {
                    match self.still_base(dir, cur, second, session, held, &[])? {
                        Some(true) => {
                            fine.insert(dir.to_path_buf());
                            continue;
                        }
                        Some(false) => {}
                        None => {
                            self.hold_below(dir, held);
                            break;
                        }
                    }
                }
                let mut inner = self.lock();
                let kind = if inner.state.taken_over(dir) && inner.state.base(dir).is_none() {
                    ConflictKind::CreatedOnBoth
                } else {
                    ConflictKind::ModifiedOnBoth
                };
                let aside = Aside {
                    kind,
                    said: "another kind of object on the share where we send a directory",
                    problem: "is no directory on the share, and our directory",
                };
                let look = (cur, second);
                if !self.set_aside(&mut inner, dir, look, (host, stamp), aside, session)? {
                    drop(inner);
                    self.hold_below(dir, held);
                }
                break;
            }
        }
        Ok(())
    }

    /// Gives the cache's copy of directory `dir` the share's permission bits `share_mode`,
    /// unless we changed the directory ourselves (then ours are what the sync sends).
    pub(in crate::overlay) fn take_shares_dir_mode(
        &self,
        dir: &Path,
        share_mode: u32,
    ) -> io::Result<()> {
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
    pub(super) fn hold_below(&self, dir: &Path, held: &mut HashSet<PathBuf>) {
        held.extend(self.lock().state.dirty_below(dir));
        held.insert(dir.to_path_buf());
    }

    /// Whether some directory on the way to `rel` is, on the share, another kind of object
    /// (then the share has nothing at `rel`). Stops at the first one absent there.
    pub(super) fn share_ancestor_not_dir(&self, rel: &Path) -> io::Result<bool> {
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
    pub(super) fn check_databases(
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
    pub(super) fn set_database_aside(
        &self,
        inner: &mut crate::overlay::Inner,
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
    pub(in crate::overlay) fn database_base(
        &self,
        inner: &crate::overlay::Inner,
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
        // A racy base of the database (see [`crate::overlay::racy`]): the content it stands for is
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
    pub(super) fn check_replaced_directories(
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
            let aside = Aside {
                kind: ConflictKind::ModifiedOnBoth,
                said: "a directory on the share holds what we did not delete",
                problem: "is a directory on the share, and our version",
            };
            let look = (cur, i64::MAX);
            if !self.set_aside(&mut inner, p, look, (host, stamp), aside, session)? {
                held.insert(p.clone());
            }
        }
        Ok(())
    }

    /// Whether every entry below the share's directory `dir` (at any depth) is one we
    /// deleted (a whiteout).
    pub(super) fn all_deleted_below(
        &self,
        inner: &crate::overlay::Inner,
        dir: &Path,
    ) -> io::Result<bool> {
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
    pub(super) fn share_now(
        &self,
        p: &Path,
        session: &mut SyncSession<'_>,
        held: &mut HashSet<PathBuf>,
    ) -> Option<Option<ShareId>> {
        // (On NFS the file is opened: see `Overlay::share_look`.)
        match self.share_look(p) {
            Ok(m) => {
                if m.as_ref().is_some_and(Stat::is_dir) {
                    session.dirs_there.insert(p.to_path_buf());
                }
                Some(m.as_ref().map(share_id_of))
            }
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
    /// (see [`crate::overlay::racy`]) the content it stands for, read now without the lock. None
    /// when the share stopped answering before that content could be read: `p` is held
    /// back (with `also`) and the error named, as for a share that does not answer the
    /// look.
    pub(super) fn still_base(
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

    /// Sets our version of `p` aside as a conflict ([`Overlay::move_aside`], with the
    /// share's object and second of the look `(cur, second)`), logged and reported as
    /// `aside` says. False when it could not be moved (the error is the session's; the
    /// caller holds the path back); a journal that fails fails the sync.
    fn set_aside(
        &self,
        inner: &mut crate::overlay::Inner,
        p: &Path,
        (cur, second): (Option<ShareId>, i64),
        (host, stamp): (&str, &str),
        aside: Aside<'_>,
        session: &mut SyncSession<'_>,
    ) -> FsResult<bool> {
        match self.move_aside(inner, p, cur, second, host, stamp) {
            Ok(name) => {
                tracing::warn!(path = %shown(p), kept = %shown(&name), "conflict: {}", aside.said);
                session.conflicts.push(Conflict {
                    path: p.to_path_buf(),
                    kind: aside.kind,
                    kept: name.to_string_lossy().into_owned(),
                });
                Ok(true)
            }
            Err(FsError::Journal(e)) => Err(FsError::Journal(e)),
            Err(e) => {
                session.errors.push(format!(
                    "{} {} could not be set aside: {e}",
                    shown(p),
                    aside.problem
                ));
                Ok(false)
            }
        }
    }

    /// Moves our version of `p` to a conflict name; the share's version at `p` becomes the
    /// base (it is what the user now sees there).
    pub(super) fn move_aside(
        &self,
        inner: &mut crate::overlay::Inner,
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
    pub(super) fn move_to(
        &self,
        inner: &mut crate::overlay::Inner,
        p: &Path,
        name: &Path,
        cur: Option<ShareId>,
        second: i64,
    ) -> FsResult<()> {
        let name = name.to_path_buf();
        // A file held by block lacks blocks that only its base had: it moves whole or not
        // at all (see `blocks_before_sync`).
        if !inner.state.partial_below(p).is_empty() {
            return Err(FsError::Errno(libc::EIO));
        }
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
        crate::overlay::interleave_tests::after_conflict_move(self);
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
    pub(super) fn same_content(
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
        let user = crate::overlay::racy::user_xattrs_of;
        if mode(&mine_file)? != theirs_now.mode() & 0o7777 {
            return Ok(None);
        }
        if let Some(theirs) = user(&theirs_file)? {
            if user(&mine_file)?.unwrap_or_default() != theirs {
                return Ok(None);
            }
        }
        let mine = read(mine_file)?;
        let attributes = crate::overlay::racy::attributes_of(&theirs_file)?;
        Ok((mine == read(theirs_file)?).then(|| {
            crate::overlay::racy::sealed(crate::overlay::racy::content_of_bytes(&mine), &attributes)
        }))
    }

    /// A conflict name for `rel` free in the cache, on the share and in the record; with
    /// `ends`, the names with those endings (a database's companions) are free too.
    pub(super) fn conflict_name(
        &self,
        inner: &crate::overlay::Inner,
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
    pub(super) fn add_hard_link_names(
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
    pub(in crate::overlay) fn walk_upper(
        &self,
        mut visit: impl FnMut(&Path, u64, u32),
    ) -> io::Result<()> {
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
}

#[cfg(test)]
#[path = "conflicts_tests.rs"]
mod tests;
