//! After a logout's sync: the cache emptied of what it need not keep (clean copies that
//! must stay, kept copies within their room).

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::error::{FsError, FsResult};
use crate::overlay::{remove_tree_keeping, up, Overlay};
use crate::policy::{PathClass, Policy};
use crate::state::{Record, ShareId};
use crate::sys::{Root, Version};

use super::*;
use crate::locks::Locked;

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
pub(super) fn must_stay(root: &Root, rel: &Path, handed: &HashMap<PathBuf, Version>) -> bool {
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
pub(super) fn written_elsewhere(root: &Root, rel: &Path) -> bool {
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
pub(super) fn find_kept(
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

/// A clean copy kept: its path, its base, the cache copy's mtime.
type KeptCopy = (PathBuf, ShareId, (i64, i64));

/// The records that keep `p` held by block as it is when the session is forgotten around
/// it (none for a file not held by block); `changed`: its changed blocks too (unsynced
/// work kept).
fn held_by_block(state: &crate::state::OverlayState, p: &Path, changed: bool) -> Vec<Record> {
    let Some(part) = state.partial(p) else {
        return Vec::new();
    };
    let mut out = vec![
        Record::Partial(p.to_path_buf(), part.limit),
        Record::Blocks {
            path: p.to_path_buf(),
            changed: false,
            blocks: part.here.clone(),
        },
    ];
    if changed {
        out.push(Record::Blocks {
            path: p.to_path_buf(),
            changed: true,
            blocks: part.changed.clone(),
        });
    }
    out
}

impl Overlay {
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
        let (mut copies, settled) = self.clean_copies_to_keep(&inner, &kept);
        // What the kept files become, journaled before anything beside them is removed:
        // a failure here leaves the whole cache in place. A cache too full for that
        // record keeps no clean copy (each is on the share as it is): removing them is
        // what a crash after their record allows anyway, and frees the room.
        let mut keep = self.records_of_kept(&inner, &copies, &settled, &kept)?;
        if !keep.is_empty() {
            if let Err(e) = inner.journal.append(&keep) {
                let full = matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT));
                if !full || copies.is_empty() {
                    return Err(FsError::Journal(e));
                }
                tracing::warn!(
                    copies = copies.len(),
                    "the cache is full: no clean copy is kept for the next login ({e})"
                );
                copies.clear();
                keep = self.records_of_kept(&inner, &copies, &settled, &kept)?;
                if !keep.is_empty() {
                    inner.journal.append(&keep).map_err(FsError::Journal)?;
                }
            }
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
        self.block_files
            .locked()
            .retain(|p, _| inner.state.partial(p).is_some());
        self.rewrite(&mut inner)?;
        Ok(Emptied {
            dropped: kept.is_empty(),
            kept_open: kept,
        })
    }

    /// The records of what stays in the cache after a logout: the clean `copies` (with
    /// the racy marks not `settled`) and the files `kept` as unsynced work.
    fn records_of_kept(
        &self,
        inner: &crate::overlay::Inner,
        copies: &[KeptCopy],
        settled: &HashSet<PathBuf>,
        kept: &[PathBuf],
    ) -> FsResult<Vec<Record>> {
        let mut keep: Vec<Record> = copies
            .iter()
            .flat_map(|(p, b, _)| {
                let racy = inner
                    .state
                    .racy(p)
                    .filter(|_| !settled.contains(p))
                    .map(|c| Record::Racy(p.clone(), c));
                std::iter::once(Record::Base(p.clone(), Some(*b)))
                    .chain(racy)
                    .chain(held_by_block(&inner.state, p, false))
            })
            .collect();
        for p in kept {
            keep.extend(self.carried_base(inner, p)?);
            keep.extend(held_by_block(&inner.state, p, true));
            if let Some((db, _)) = database_of(p) {
                if self.policy.classify(&db) == PathClass::Cached && !kept.contains(&db) {
                    keep.extend(self.carried_base(inner, &db)?);
                }
            }
            keep.push(Record::Dirty(p.clone()));
        }
        Ok(keep)
    }

    /// The clean copies that stay for the next login on this workstation, with the racy
    /// ones whose mark is settled now (their share file checked once its second is over).
    fn clean_copies_to_keep(
        &self,
        inner: &crate::overlay::Inner,
        kept: &[PathBuf],
    ) -> (Vec<KeptCopy>, HashSet<PathBuf>) {
        // Clean copies stay for the next login on this workstation (a returning user's
        // profile costs the share a look a file, not a read): each file a sync left on the
        // share as it is (the size and mtime of its base), single-name. A lookup checks
        // each against the share before it serves (see `Overlay::revalidate`).
        // At most [`Overlay::set_keep_copies`] bytes of them, the newest first.
        // Newest first by the cache copy's mtime (a share's may be cut to whole seconds).
        let mut copies: Vec<KeptCopy> = inner
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
        // A file held by block takes the room of the blocks it has.
        let size_of = |p: &Path, b: &ShareId| match inner.state.partial(p) {
            Some(part) => part.here.count() * crate::extents::BLOCK,
            None => b.size,
        };
        // At most half of the room the cache's disk has once the session's files are gone:
        // the next session's own writes come first.
        let mut room = self.keep_copies.load(Ordering::Relaxed);
        if let Ok((free, _)) = self.cache.space() {
            let taken: u64 = copies.iter().map(|(p, b, _)| size_of(p, b)).sum();
            room = room.min(free.saturating_add(taken) / 2);
        }
        copies.retain(|(p, b, _)| {
            let size = size_of(p, b);
            let fits = size <= room;
            if fits {
                room -= size;
            }
            fits
        });
        // Racy bases (see [`crate::overlay::racy`]; the files this logout sent) are settled now,
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
        (copies, settled)
    }

    /// The base `p` keeps when the session is forgotten around it: the one recorded (what
    /// the share held after our last sync of it), else what the share holds there now; a
    /// racy base with its mark (see [`crate::overlay::racy`]).
    pub(super) fn carried_base(
        &self,
        inner: &crate::overlay::Inner,
        p: &Path,
    ) -> FsResult<Vec<Record>> {
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
}
