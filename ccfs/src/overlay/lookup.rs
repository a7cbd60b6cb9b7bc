//! Where a path is in the merged view: the cache, the share under a cached path, or the
//! share itself; the mount root answered while the share does not.

use super::session::{share_id_of, shown};
use super::*;
use crate::state::{Content, ShareId};

/// How long a request waits for the share's root attributes before the cache's
/// stand-in answers instead (see [`Overlay::share_root`]).
const ROOT_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// A request for the share root's attributes: where to send them (an errno on failure).
pub(super) type RootAsk = std::sync::mpsc::SyncSender<Result<Option<Stat>, i32>>;

/// The thread that looks at the share's root for [`Overlay::share_root`]: one look
/// answers every request waiting meanwhile; it ends with the overlay (its sender dropped).
pub(super) fn spawn_root_look(share: Root) -> io::Result<std::sync::mpsc::Sender<RootAsk>> {
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
    pub(super) fn resolve_locked(&self, inner: &Inner, rel: &Path) -> FsResult<Found> {
        match self.policy.classify(rel) {
            PathClass::Passthrough => self.resolve_share(rel),
            PathClass::LocalOnly => {
                let meta = self.upper_stat(rel)?.ok_or_else(FsError::enoent)?;
                Ok(self.found(rel, Layer::Upper, meta))
            }
            PathClass::Cached => self.resolve_looked(inner, rel, ShareLook::none()),
        }
    }

    /// [`Overlay::resolve_locked`], with what the share held at `rel` when asked before
    /// the lock (see [`Overlay::look_before_lock`]): used for a cached path that only the
    /// share has, if it still stands.
    pub(super) fn resolve_looked(
        &self,
        inner: &Inner,
        rel: &Path,
        look: ShareLook,
    ) -> FsResult<Found> {
        if self.policy.classify(rel) != PathClass::Cached {
            return self.resolve_locked(inner, rel);
        }
        if let Some(meta) = self.upper_lookup(rel)? {
            return Ok(self.found(rel, Layer::Upper, meta));
        }
        if inner.state.hidden(rel) || is_sync_holding(rel) {
            return Err(FsError::enoent());
        }
        let meta = self.share_stat_looked(rel, look)?;
        Ok(self.found(rel, Layer::Lower, meta.ok_or_else(FsError::enoent)?))
    }

    /// Sets how long a clean copy found to match the share is trusted before the share
    /// is asked again (see [`Overlay::revalidate`]); zero: at every look.
    pub fn set_revalidate_after(&self, after: std::time::Duration) {
        let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        self.revalidate_after_ms.store(ms, Ordering::Relaxed);
    }

    /// The share object the cache's `meta` at `rel` is a clean copy of: a single-name
    /// file that a sync left on the share as it is (its base) and that nothing here
    /// changed since (not dirty, no handle writes it, no change of it or sync under way).
    fn clean_copy_of(&self, inner: &Inner, rel: &Path, meta: &Stat) -> Option<ShareId> {
        if !meta.is_file()
            || meta.nlink() != 1
            || inner.state.is_dirty(rel)
            || inner.writers.contains_key(&meta.ino())
            || inner.in_flight.iter().any(|n| n == rel)
        {
            return None;
        }
        inner.state.base(rel)
    }

    /// [`Overlay::clean_copy_of`], when the copy is due for a look at the share: not
    /// found to match it within the last [`Overlay::set_revalidate_after`].
    fn clean_copy_due(&self, inner: &Inner, rel: &Path, found: &Found) -> Option<ShareId> {
        let base = self.clean_copy_of(inner, rel, &found.meta)?;
        let after =
            std::time::Duration::from_millis(self.revalidate_after_ms.load(Ordering::Relaxed));
        match inner.validated.get(rel) {
            Some(t) if t.elapsed() < after => None,
            _ => Some(base),
        }
    }

    /// Whether the cache's directory `found` at `rel` holds nothing of this session's
    /// (nothing at or below it dirty, deleted or being sent, no change under way) and is
    /// due for a look at the share (see [`Overlay::revalidate_dir`]).
    fn clean_dir_due(&self, inner: &Inner, rel: &Path, found: &Found) -> bool {
        if !found.meta.is_dir()
            || rel.as_os_str().is_empty()
            || inner.state.has_work_below(rel)
            || inner.in_flight.iter().any(|n| n.starts_with(rel))
        {
            return false;
        }
        let after =
            std::time::Duration::from_millis(self.revalidate_after_ms.load(Ordering::Relaxed));
        inner
            .validated
            .get(rel)
            .is_none_or(|t| t.elapsed() >= after)
    }

    /// Looks at the share for a directory of the cache that holds nothing of this
    /// session's (see [`Overlay::clean_dir_due`]), without the lock. The share has no
    /// directory there any more (another workstation removed it, or put a file there):
    /// when all the cache holds below is clean copies (and directories of them), the
    /// cache lets go of the whole directory and the path shows what the share has.
    /// Anything else below (a local-only path) keeps it.
    fn revalidate_dir(&self, rel: &Path, found: Found) -> FsResult<Found> {
        let now = match self.share.stat(rel) {
            Ok(now) => now,
            Err(e) if gate::is_outage(&e) => return Ok(found),
            Err(e) => return Err(e.into()),
        };
        let mut inner = self.lock_for(&[rel]);
        // A directory its owner may not read or search on the share (`chmod 300`) is let
        // go of like one the share lost (the cache's copy could not be emptied with that
        // mode): the share's answers stand.
        let usable = |m: &Stat| m.is_dir() && m.mode() & 0o500 == 0o500;
        if let Some(m) = now.as_ref().filter(|m| usable(m)) {
            inner
                .validated
                .insert(rel.to_path_buf(), std::time::Instant::now());
            // Its mode as the share has it (another workstation's `chmod 700 ~/.ssh`
            // while this copy waited in the cache): the kernel checks access by it.
            if m.mode() & 0o7777 != found.meta.mode() & 0o7777 {
                drop(inner);
                self.take_shares_dir_mode(rel, m.mode())?;
                return self.resolve_after_mode(rel);
            }
            return Ok(found);
        }
        let still = self.upper_stat(rel)?;
        if !still.is_some_and(|m| m.is_dir()) || inner.state.has_work_below(rel) {
            drop(inner);
            return self.resolve(rel);
        }
        if !self.only_clean_copies_below(&inner, rel)? {
            return Ok(found);
        }
        self.record(&mut inner, &[Record::Forget(rel.to_path_buf())])?;
        inner.validated.retain(|k, _| !k.starts_with(rel));
        remove_tree_keeping(&self.cache, &up(rel), &HashSet::new())?;
        tracing::info!(path = %shown(rel), "gone from the share: the cache's clean directory is let go");
        drop(inner);
        self.resolve(rel)
    }

    /// The cache's directory at `rel` once it took the share's mode.
    fn resolve_after_mode(&self, rel: &Path) -> FsResult<Found> {
        let meta = self.upper_stat(rel)?.ok_or_else(FsError::enoent)?;
        Ok(self.found(rel, Layer::Upper, meta))
    }

    /// True when everything the cache holds below directory `rel` is a clean copy (see
    /// [`Overlay::clean_copy_of`]) or a directory of them.
    fn only_clean_copies_below(&self, inner: &Inner, rel: &Path) -> FsResult<bool> {
        for (name, _, _) in self.cache.read_dir(&up(rel))? {
            let child = rel.join(&name);
            if self.policy.classify(&child) != PathClass::Cached {
                return Ok(false);
            }
            let clean = match self.upper_stat(&child)? {
                Some(m) if m.is_dir() => self.only_clean_copies_below(inner, &child)?,
                Some(m) => {
                    self.clean_copy_of(inner, &child, &m).is_some()
                        && !self.copy_open_elsewhere(&child)
                }
                None => true,
            };
            if !clean {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether the cache's file at `rel` is open anywhere (see [`sys::open_elsewhere`]);
    /// yes when that cannot be told.
    fn copy_open_elsewhere(&self, rel: &Path) -> bool {
        self.cache
            .open_file(
                &up(rel),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
                0,
            )
            .and_then(|f| sys::open_elsewhere(&f))
            .unwrap_or(true)
    }

    /// Looks at the share for the clean copy (or clean directory) at `rel` now, however
    /// recently it was found to match (a listing of the share lacks its name); anything
    /// else is resolved as it is.
    pub(super) fn recheck(&self, rel: &Path) -> FsResult<Found> {
        let inner = self.lock_for(&[rel]);
        let Some(meta) = self.upper_lookup(rel)? else {
            drop(inner);
            return self.resolve(rel);
        };
        let found = self.found(rel, Layer::Upper, meta);
        if found.meta.is_dir() {
            if inner.state.has_work_below(rel) || rel.as_os_str().is_empty() {
                return Ok(found);
            }
            drop(inner);
            return self.revalidate_dir(rel, found);
        }
        match self.clean_copy_of(&inner, rel, &found.meta) {
            Some(base) => {
                let racy = inner.state.racy(rel);
                drop(inner);
                self.revalidate(rel, found, base, racy)
            }
            None => Ok(found),
        }
    }

    /// Looks at the share for a clean copy (see [`Overlay::clean_copy_due`]), without the
    /// lock. The share still holds the object the copy was taken of: the copy serves, and
    /// is trusted for a while. The share's file changed, was replaced or is gone (another
    /// workstation's logout, an edit over SSH): the cache lets go of its copy, which
    /// holds nothing of this session's, and the path shows what the share has, as for a
    /// path the cache never held (the next change takes it over afresh). A share that
    /// does not answer leaves the copy serving. `racy`: what a racy base stands for (see
    /// [`super::racy`]), which the share's file must still hold.
    fn revalidate(
        &self,
        rel: &Path,
        found: Found,
        base: ShareId,
        racy: Option<Content>,
    ) -> FsResult<Found> {
        let second = self.share_second();
        let now = match self.share_look(rel) {
            Ok(now) => now,
            Err(e) if gate::is_outage(&e) => return Ok(found),
            // The share's answer (EACCES, ELOOP, ...) stands, as for any path.
            Err(e) => return Err(e.into()),
        };
        // A racy base (see [`super::racy`]) stands only while the share's file has the
        // content it stands for: read without the lock.
        let mut holds = now.as_ref().map(share_id_of) == Some(base);
        if let Some(content) = racy.filter(|_| holds) {
            match self.racy_base_holds(rel, base, content, second)? {
                Some(yes) => holds = yes,
                // The share stopped answering meanwhile: as above.
                None => return Ok(found),
            }
        }
        let mut inner = self.lock_for(&[rel]);
        let still = self.upper_stat(rel)?;
        // Something changed the cache's say meanwhile: look again.
        let Some(meta) = still.filter(|m| m.version() == found.meta.version()) else {
            drop(inner);
            return self.resolve(rel);
        };
        if self.clean_copy_of(&inner, rel, &meta) != Some(base) {
            return Ok(self.found(rel, Layer::Upper, meta));
        }
        if holds {
            inner
                .validated
                .insert(rel.to_path_buf(), std::time::Instant::now());
            return Ok(found);
        }
        // A program holds the copy open (`tail -f`, an editor, a daemon): it serves, as
        // before, until nothing does (a file replaced under an open handle answers ESTALE).
        if self.copy_open_elsewhere(rel) {
            return Ok(found);
        }
        // Forgotten first: a crash before the copy goes leaves a clean copy without a
        // base, which the next login's recovery empties from the cache.
        self.record(&mut inner, &[Record::Forget(rel.to_path_buf())])?;
        inner.validated.remove(rel);
        if let Err(e) = self.cache.unlink(&up(rel)) {
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e.into());
            }
        }
        tracing::info!(path = %shown(rel), "changed on the share: the cache's clean copy is let go");
        drop(inner);
        self.resolve(rel)
    }

    /// Looks at clean copies as on NFS (see [`Overlay::share_look`]), whatever the share
    /// is: for tests.
    pub fn set_looks_open(&self, yes: bool) {
        self.share_is_nfs.store(yes, Ordering::Relaxed);
    }

    /// The share's object at `rel` for a look at a clean copy or a sync's check of a base.
    /// On NFS the file is opened and its open descriptor asked: an open revalidates the
    /// client's cached attributes (close-to-open), which a plain lookup may answer from
    /// its cache for a minute.
    pub(super) fn share_look(&self, rel: &Path) -> io::Result<Option<Stat>> {
        if !self.share_is_nfs.load(Ordering::Relaxed) {
            return self.share.stat(rel);
        }
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
        match self.share.open_file(rel, flags, 0) {
            Ok(f) => sys::fstat(&f).map(Some),
            // Not a file it may open (a symbolic link, a mode without read access): as
            // looked at.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ELOOP | libc::EACCES | libc::EPERM | libc::ENXIO)
                ) =>
            {
                self.share.stat(rel)
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Checks that `parent` is a directory in the merged view (a stale node may not be).
    /// Gives what it found (its attributes serve a new object's group, its layer whether
    /// the cache has a copy of it).
    pub(super) fn check_parent(&self, inner: &Inner, parent: &Path) -> FsResult<Found> {
        let found = self.resolve_locked(inner, parent)?;
        if found.meta.is_dir() {
            Ok(found)
        } else {
            Err(errno(libc::ENOTDIR))
        }
    }

    /// Finds `rel` in the merged view.
    pub fn resolve(&self, rel: &Path) -> FsResult<Found> {
        if rel.as_os_str().is_empty() {
            return self.share_root();
        }
        self.resolve_as(
            rel,
            self.policy.classify(rel),
            || self.upper_lookup(rel),
            || self.share.stat(rel),
        )
    }

    /// Finds the entries of one directory, as [`Overlay::resolve`] finds each: for a
    /// listing that gives each entry's attributes. The directory is opened once on each
    /// side and each entry looked at within it (one call, not a walk from the root).
    pub fn entries_of(&self, dir: &Path) -> EntryLook<'_> {
        EntryLook {
            overlay: self,
            ancestry: self.policy.ancestry(dir),
            dir: dir.to_path_buf(),
            share: std::cell::OnceCell::new(),
            upper: std::cell::OnceCell::new(),
        }
    }

    /// [`Overlay::resolve`] of `rel` (not the root), of class `class`, with `upper` and
    /// `share` looking at it in the cache (`stat_through` of its upper path) and on the
    /// share (`stat`).
    fn resolve_as(
        &self,
        rel: &Path,
        class: PathClass,
        upper: impl Fn() -> io::Result<Option<Stat>>,
        share: impl FnOnce() -> io::Result<Option<Stat>>,
    ) -> FsResult<Found> {
        match class {
            // No overlay state is involved: no lock held while the share answers.
            PathClass::Passthrough => Ok(Found {
                layer: Layer::Share,
                meta: share()?.ok_or_else(FsError::enoent)?,
            }),
            PathClass::LocalOnly => {
                let inner = self.lock_for(&[rel]);
                self.resolve_locked(&inner, rel)
            }
            PathClass::Cached => {
                // The cache's say: its object, or a deletion (then nothing).
                let said = |inner: &Inner| -> FsResult<Option<Found>> {
                    if let Some(meta) = upper()? {
                        return Ok(Some(self.found(rel, Layer::Upper, meta)));
                    }
                    if inner.state.hidden(rel) || is_sync_holding(rel) {
                        return Err(FsError::enoent());
                    }
                    Ok(None)
                };
                let looked = {
                    let inner = self.lock_for(&[rel]);
                    if let Some(found) = said(&inner)? {
                        if let Some(base) = self.clean_copy_due(&inner, rel, &found) {
                            let racy = inner.state.racy(rel);
                            drop(inner);
                            return self.revalidate(rel, found, base, racy);
                        }
                        if self.clean_dir_due(&inner, rel, &found) {
                            drop(inner);
                            return self.revalidate_dir(rel, found);
                        }
                        return Ok(found);
                    }
                    self.holds_now()
                };
                // Only on the share so far: ask it without holding the lock (other users
                // of the mount go on meanwhile), then check that the cache still has no
                // say (a copy-up or a delete may have happened meanwhile), unless nobody
                // took the lock since the look.
                // Kept for a change that follows (not while a sync runs: rsync may change
                // the share under the look).
                let syncs = self.syncs_started.load(Ordering::SeqCst);
                let keep = !self.sync_running.load(Ordering::SeqCst);
                let at = std::time::Instant::now();
                let meta = share()?;
                if keep {
                    self.remember_look(rel, at, syncs, &meta);
                }
                if self.holds_now() != looked {
                    if let Some(found) = said(&self.lock_for(&[rel]))? {
                        return Ok(found);
                    }
                }
                let meta = meta.ok_or_else(FsError::enoent)?;
                Ok(self.found(rel, Layer::Lower, meta))
            }
        }
    }

    /// A passthrough path, straight from the share.
    pub(super) fn resolve_share(&self, rel: &Path) -> FsResult<Found> {
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
    pub(super) fn share_root(&self) -> FsResult<Found> {
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
    pub(super) fn lower_meta(&self, inner: &Inner, rel: &Path) -> io::Result<Option<Stat>> {
        match self.policy.classify(rel) {
            PathClass::LocalOnly => Ok(None),
            PathClass::Cached if inner.state.hidden(rel) => Ok(None),
            _ => self.share.stat(rel),
        }
    }
}

/// The entries of one directory, looked at as [`Overlay::resolve`] would
/// ([`Overlay::entries_of`]): the directory is opened on the share and in the cache at
/// the first look that needs it, and kept for the others.
pub struct EntryLook<'a> {
    overlay: &'a Overlay,
    dir: PathBuf,
    ancestry: crate::policy::Ancestry,
    share: std::cell::OnceCell<DirAt>,
    upper: std::cell::OnceCell<DirAt>,
}

impl EntryLook<'_> {
    /// [`Overlay::resolve`] of the entry `name`.
    pub fn resolve(&self, name: &OsStr) -> FsResult<Found> {
        let o = self.overlay;
        let rel = self.dir.join(name);
        let class = o.policy.classify_child(&self.ancestry, &rel);
        o.resolve_as(
            &rel,
            class,
            || {
                let dir = self.upper.get_or_init(|| o.cache.dir_at(&up(&self.dir)));
                o.cache.stat_entry_through(dir, name)
            },
            || {
                let dir = self.share.get_or_init(|| o.share.dir_at(&self.dir));
                o.share.stat_entry(dir, name)
            },
        )
    }
}
