//! Settling what rsync did: which paths our transfer put on the share (their new bases),
//! partial transfers cleaned, deletions applied.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::error::FsResult;
use crate::overlay::{up, Overlay};
use crate::rsync::Put;
use crate::state::{Content, Record, Sent, ShareId};
use crate::sys::Stat;

use super::*;

/// Is the share file `now` the save `base` was taken of, its ctime aside (a change of
/// mode, owner or link count alone is no new save)?
pub(super) fn same_save(now: Option<ShareId>, base: Option<ShareId>) -> bool {
    match (now, base) {
        (Some(n), Some(b)) => (n.ino, n.size, n.mtime) == (b.ino, b.size, b.mtime),
        _ => false,
    }
}

/// Whether a file with mtime `ours` here is, as the share keeps it, one with mtime
/// `theirs` there: the same, or cut to its second by a share that keeps whole seconds.
pub(super) fn same_mtime_on_share(ours: (i64, i64), theirs: (i64, i64)) -> bool {
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
pub(super) fn is_our_transfer(theirs: &Stat, ours: Option<&Stat>, sent: Option<Sent>) -> bool {
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
pub(super) fn is_reported_transfer(
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

impl Overlay {
    /// Removes what an interrupted rsync `--delay-updates` left on the share: in the
    /// directories of `files`, the files of those names in ccfs's own holding directory
    /// ([`crate::rsync::PARTIAL_DIR`]), and the copies of them this workstation's sync
    /// makes itself there (see `overlay/send_files.rs`), then that directory if it is
    /// empty. Nothing else is ever removed there.
    pub(super) fn clean_partial_transfers(&self, files: &[PathBuf], errors: &mut Vec<String>) {
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
            // rsync's copy, and the one the sync makes itself (`overlay/send_files.rs`).
            let ours = self.copy_name(name);
            for partial in std::iter::once(holding.join(name)).chain(ours.map(|n| holding.join(n)))
            {
                match self.share.stat(&partial) {
                    Ok(Some(m)) if !m.is_dir() => {
                        if let Err(e) = self.share.unlink(&partial) {
                            errors.push(io_err("cannot remove the partial transfer", &partial, &e));
                        }
                        dirs.insert(holding.clone());
                    }
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {}
                    Err(e) => errors.push(io_err("cannot look at", &partial, &e)),
                }
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
    pub(super) fn settle(
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
            let mut by = transfer;
            let ok = theirs.as_ref().is_some_and(|t| loop {
                break match by {
                    Transfer::Complete => true,
                    Transfer::Reported(listed) => {
                        is_reported_transfer(t, ours.as_ref(), base, listed.get(p).copied())
                    }
                    // The share's file still the very object the conflict check found
                    // there (rsync puts a new file in place; a directory it changes in
                    // place): not ours, whatever its size and mtime (a file of the same
                    // size written in the same tick as the one renamed over it here).
                    Transfer::Incomplete => {
                        !(t.is_file() && base == Some(share_id_of(t)))
                            && is_our_transfer(t, ours.as_ref(), *s)
                            && !self.other_bytes_in_our_second(p, t, ours.as_ref(), *s)
                    }
                    Transfer::Partly { exact, rest } => match exact.get(p) {
                        Some(put) => is_reported_transfer(t, ours.as_ref(), base, *put),
                        None => {
                            by = rest;
                            continue;
                        }
                    },
                };
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
    pub(super) fn sent_content(
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
                Some(attributes) => crate::overlay::racy::sealed(c, &attributes),
                None => Content::Unknown,
            },
        })
    }

    /// The content of the cache's file at `p` when it is as it was handed over (`sent`:
    /// its size and mtime then; `size`: the share's file's), nothing writing it; unknown
    /// otherwise.
    pub(super) fn content_as_handed(
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
            // As the view has it (a file held by block lacks blocks in its cache file).
            return crate::overlay::racy::content_of_view(self, p).unwrap_or(Content::Unknown);
        }
        Content::Unknown
    }

    /// On a share that keeps whole seconds, a file of our size with an mtime in the
    /// second of ours passes for the transfer a crash cut short (see [`is_our_transfer`]):
    /// while the cache's file is as it was handed over, the bytes tell. Another
    /// workstation's save of other bytes in that second is theirs (a conflict), not ours.
    /// A share's file that cannot be read is taken for theirs.
    pub(super) fn other_bytes_in_our_second(
        &self,
        p: &Path,
        theirs: &Stat,
        ours: Option<&Stat>,
        sent: Option<Sent>,
    ) -> bool {
        let id = share_id_of(theirs);
        if !theirs.is_file() || !crate::overlay::racy::whole_seconds(&id) {
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
    pub(super) fn rebase_other_names(
        &self,
        landed: &[&PathBuf],
        replaced: &HashSet<u64>,
    ) -> Vec<Record> {
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
    pub(super) fn apply_deletion(&self, rel: &Path) -> FsResult<Option<Conflict>> {
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
                // A racy base (see [`crate::overlay::racy`]) stands only with its content (read
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size and mtime we handed over, the cache copy's now, or an mtime written here
    /// after the hand-over make a share file ours; an older mtime between the two (another
    /// workstation's version from before our sync) is theirs.
    #[test]
    pub(super) fn what_we_handed_over_hold_now_or_wrote_since_is_our_transfer() {
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
    pub(super) fn what_rsync_reported_and_put_in_place_is_our_transfer() {
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
