//! Changes to names: create, mkdir, mknod, symlink, link, unlink, rmdir and rename, with the
//! whiteouts that hide the share's objects a cached path deleted.

use super::session::share_id_of;
use super::*;
use crate::locks::Locked;

impl Overlay {
    /// The name of the sync's holding directory ([`crate::rsync::PARTIAL_DIR`]) is ccfs's
    /// where the sync sends files: rsync keeps the files it is sending in a directory of
    /// that name beside their place and empties it, so a user's own files under that name
    /// in a synced directory would be lost at logout. No such entry is made there through
    /// the mount (EPERM). On a passthrough path it is a plain name: a ccfs mount that is
    /// itself the share of another (a share meter, a test server) takes that one's rsync.
    pub(super) fn refuse_reserved(&self, parent: &Path, name: &OsStr) -> FsResult<()> {
        if name == OsStr::new(crate::rsync::PARTIAL_DIR)
            && self.policy.classify(&parent.join(name)) != PathClass::Passthrough
        {
            tracing::info!(
                name = crate::rsync::PARTIAL_DIR,
                "refused: the name of the sync's holding directory is reserved"
            );
            return Err(errno(libc::EPERM));
        }
        Ok(())
    }
}

impl Overlay {
    /// A new cached object was marked dirty but could not be made: drop the mark and put
    /// back the whiteout it cleared, so a deleted share copy stays hidden.
    pub(super) fn undo_new(
        &self,
        inner: &mut Inner,
        rel: &Path,
        was_whiteout: bool,
        e: io::Error,
    ) -> FsError {
        let undo = Record::Delete {
            path: rel.to_path_buf(),
            whiteout: was_whiteout,
        };
        match self.record(inner, &[undo]) {
            Ok(()) => e.into(),
            Err(journal) => journal,
        }
    }

    /// What the share holds at the cached path `rel`, asked before the overlay's lock is
    /// taken (a slow share then holds up only the change that asks it). Not asked where the
    /// cache hides the share's name (a deletion made here), or while a sync of this mount
    /// runs (it may change the share there).
    pub(super) fn look_before_lock(&self, rel: &Path) -> ShareLook {
        self.look_before_lock_unless(rel, |_| false)
    }

    /// [`Overlay::look_before_lock`], not asked either where `needless` says (under the
    /// lock) that the change will not need the answer.
    pub(super) fn look_before_lock_unless(
        &self,
        rel: &Path,
        needless: impl FnOnce(&OverlayState) -> bool,
    ) -> ShareLook {
        self.look_before_lock_with(rel, needless, true)
    }

    /// [`Overlay::look_before_lock`], always asking the share: for an open with O_CREAT
    /// and without O_EXCL, which the kernel sends without a lookup while it remembers
    /// the name missing (a file another workstation made there meanwhile is then opened,
    /// not replaced by a new one). Its answer is kept all the same.
    pub(super) fn look_before_lock_fresh(&self, rel: &Path) -> ShareLook {
        self.look_before_lock_with(rel, |_| false, false)
    }

    /// [`Overlay::look_before_lock_unless`]; `kept`: a recent answer that the share had
    /// nothing there may stand for the look (see [`Overlay::remember_look`]).
    fn look_before_lock_with(
        &self,
        rel: &Path,
        needless: impl FnOnce(&OverlayState) -> bool,
        kept: bool,
    ) -> ShareLook {
        let syncs = self.syncs_started.load(Ordering::SeqCst);
        let skip = self.sync_running.load(Ordering::SeqCst) || {
            let inner = self.lock_for(&[rel]);
            inner.state.hidden(rel) || needless(&inner.state)
        };
        let look = if skip {
            ShareLook { syncs, seen: None }
        } else if let Some(recent) = self.recent_look(rel).filter(|l| kept && l.syncs == syncs) {
            // (One kept from before a sync started no longer stands: the share is asked
            // again, and that answer kept.)
            recent
        } else {
            let at = std::time::Instant::now();
            let seen = self.share.stat(rel).ok();
            if let Some(seen) = &seen {
                self.remember_look(rel, at, syncs, seen);
            }
            ShareLook { syncs, seen }
        };
        #[cfg(test)]
        super::interleave_tests::after_share_look(self);
        look
    }

    /// Keeps that the share held nothing at the cached name `rel` when asked at `at` (with
    /// `syncs` syncs started then), for a change of the name that follows within
    /// [`RECENT_LOOK`]: a create, or the rename of a temporary file just made, then asks
    /// the share once instead of twice (the kernel's lookup just before, the create).
    /// The answer stands as one asked before the lock does ([`Overlay::still_stands`]):
    /// not once a sync started since; something another workstation makes there after
    /// it is found by the sync as a change after the look (both versions kept). What the
    /// share holds (a file, a directory) is not kept: a change checks its type and copies
    /// it from one look, made now.
    pub(super) fn remember_look(
        &self,
        rel: &Path,
        at: std::time::Instant,
        syncs: u64,
        seen: &Option<Stat>,
    ) {
        let mut looks = self.recent_looks.locked();
        if seen.is_some() {
            // The share has something there now: an older answer says no more.
            looks.remove(rel);
            return;
        }
        if looks.len() >= RECENT_LOOKS_MAX {
            let within =
                std::time::Duration::from_millis(self.recent_look_ms.load(Ordering::Relaxed));
            looks.retain(|_, l| l.at.elapsed() < within);
            if looks.len() >= RECENT_LOOKS_MAX {
                looks.clear();
            }
        }
        looks.insert(rel.to_path_buf(), RecentLook { at, syncs });
    }

    /// How long a look kept by [`Overlay::remember_look`] answers a change of its name
    /// ([`RECENT_LOOK`] unless set); zero: every change asks the share itself. A test
    /// that plays two workstations' steps back to back, each expected to see the other's
    /// changes at once, sets zero.
    pub fn set_recent_look(&self, within: std::time::Duration) {
        let ms = u64::try_from(within.as_millis()).unwrap_or(u64::MAX);
        self.recent_look_ms.store(ms, Ordering::Relaxed);
    }

    /// The share's answer at `rel` kept by [`Overlay::remember_look`], if it is recent.
    fn recent_look(&self, rel: &Path) -> Option<ShareLook> {
        let within = std::time::Duration::from_millis(self.recent_look_ms.load(Ordering::Relaxed));
        let looks = self.recent_looks.locked();
        let l = looks.get(rel).filter(|l| l.at.elapsed() < within)?;
        Some(ShareLook {
            syncs: l.syncs,
            seen: Some(None),
        })
    }

    /// This mount changed the share at cached names outside a sync (the directories a
    /// database passed through below a cached directory needs): no look asked before
    /// stands, kept or made before a lock (counted as a sync is), and the kept ones go.
    pub(super) fn forget_looks(&self) {
        self.syncs_started.fetch_add(1, Ordering::SeqCst);
        self.recent_looks.locked().clear();
    }

    /// [`ShareLook`]'s answer, if it still stands (under the lock): no sync of this mount
    /// started since it was asked, and none runs. Another workstation's change meanwhile
    /// is a change after the look, as it would be after a look under the lock: the sync
    /// finds the share changed from the base it recorded.
    pub(super) fn still_stands(&self, look: ShareLook) -> Option<Option<Stat>> {
        let unchanged = !self.sync_running.load(Ordering::SeqCst)
            && self.syncs_started.load(Ordering::SeqCst) == look.syncs;
        look.seen.filter(|_| unchanged)
    }

    /// What the share holds at `rel`: `look`'s answer if it still stands, else the
    /// share's now.
    pub(super) fn share_stat_looked(
        &self,
        rel: &Path,
        look: ShareLook,
    ) -> io::Result<Option<Stat>> {
        match self.still_stands(look) {
            Some(seen) => Ok(seen),
            None => self.share.stat(rel),
        }
    }

    /// What the share holds at the cached path `rel` for the merged view (nothing where a
    /// deletion made here hides it): `look`'s answer if it still stands, else the share's
    /// now (see [`Overlay::lower_meta`]).
    pub(super) fn lower_meta_looked(
        &self,
        inner: &Inner,
        rel: &Path,
        look: ShareLook,
    ) -> io::Result<Option<Stat>> {
        if inner.state.hidden(rel) {
            return Ok(None);
        }
        self.share_stat_looked(rel, look)
    }

    /// Whether the cached path `rel` is free for a new object: the cache has nothing there
    /// and the share's object, if any, is hidden by a deletion made here. EEXIST if not.
    /// True when the share was seen to hold nothing there (the take-over record needs no
    /// second look); false when it was not asked (a hidden name) or did not answer. The
    /// share is asked now unless `look` (see [`Overlay::look_before_lock`]) still stands.
    pub(super) fn free_cached_name(
        &self,
        inner: &Inner,
        rel: &Path,
        look: ShareLook,
    ) -> FsResult<bool> {
        if self.upper_lookup(rel)?.is_some() {
            return Err(errno(libc::EEXIST));
        }
        if inner.state.hidden(rel) {
            return Ok(false);
        }
        match self.share_stat_looked(rel, look) {
            Ok(Some(_)) => Err(errno(libc::EEXIST)),
            Ok(None) => Ok(true),
            // The share does not answer: the name is free only where this session took
            // it over when the share had nothing there (were something put there since,
            // the sync finds the share changed from that base: a conflict, nothing
            // overwritten). A recorded file there may still be there: the change fails
            // as the share does.
            Err(_) if inner.state.base_entry(rel) == Some(None) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Creates a new object `name` in `parent` with `make`, which gets the root and the
    /// path below it, and gives back the new file's descriptor when it opened one (its
    /// attributes are then read from it, not from the path again).
    pub(super) fn make_node(
        &self,
        ctx: &Ctx,
        parent: &Path,
        name: &OsStr,
        kept: bool,
        make: impl FnOnce(&Root, &Path) -> io::Result<Option<File>>,
    ) -> FsResult<(Found, Option<File>)> {
        self.refuse_reserved(parent, name)?;
        let rel = parent.join(name);
        if self.policy.classify(&rel) == PathClass::Passthrough {
            // Straight to the share, no lock held while it answers (the share refuses an
            // existing name itself: O_EXCL, mkdir, symlink, mknod).
            let dir = self.resolve(parent)?;
            if !dir.meta.is_dir() {
                return Err(errno(libc::ENOTDIR));
            }
            if dir.layer == Layer::Upper {
                self.share_dirs_for(ctx, parent)?;
            }
            let file = make(&self.share, &rel)?;
            self.chown_made(&self.share, &rel, ctx, Some(&dir.meta), file.as_ref())?;
            return self.made(Layer::Share, &rel, file);
        }
        let look = match self.policy.classify(&rel) {
            PathClass::Cached if kept => self.look_before_lock(&rel),
            PathClass::Cached => self.look_before_lock_fresh(&rel),
            _ => ShareLook::none(),
        };
        let mut inner = self.lock_for(&[&rel]);
        let dir = self.check_parent(&inner, parent)?;
        // The parent's cache copy, made if it has none yet (with the share's attributes).
        let ensure_dir = |inner: &Inner| match dir.layer {
            Layer::Upper => Ok(()),
            _ => self.ensure_upper_dir(inner, parent, ctx),
        };
        match self.policy.classify(&rel) {
            // Handled above, without the lock.
            PathClass::Passthrough => Err(errno(libc::EXDEV)),
            PathClass::LocalOnly => {
                if self.upper_stat(&rel)?.is_some() {
                    return Err(errno(libc::EEXIST));
                }
                ensure_dir(&inner)?;
                let file = make(&self.cache, &up(&rel))?;
                self.chown_made(&self.cache, &up(&rel), ctx, Some(&dir.meta), file.as_ref())?;
                self.made(Layer::Upper, &rel, file)
            }
            PathClass::Cached => {
                let seen = self.free_cached_name(&inner, &rel, look)?.then_some(None);
                ensure_dir(&inner)?;
                let was_whiteout = inner.state.is_whiteout(&rel);
                // The take-over and the mark, in one journal append. On disk before the
                // answer, not before the cache's new name: a crash between loses an
                // unanswered create, whose name the journal then does not send.
                // Nothing was there (a file there is no base of a name found free).
                let mut records = self.take_over_seen(&inner, &rel, seen, i64::MIN)?;
                if !inner.state.is_dirty(&rel) {
                    records.push(Record::Dirty(rel.clone()));
                }
                let marked = if records.is_empty() {
                    self.written(&mut inner)?
                } else {
                    self.record_deferred(&mut inner, &records)?
                };
                inner.touched.insert(rel.clone());
                let file = match make(&self.cache, &up(&rel)) {
                    Ok(file) => file,
                    Err(e) => return Err(self.undo_new(&mut inner, &rel, was_whiteout, e)),
                };
                self.chown_made(&self.cache, &up(&rel), ctx, Some(&dir.meta), file.as_ref())?;
                let made = self.made(Layer::Upper, &rel, file);
                drop(inner);
                self.durable(marked)?;
                made
            }
        }
    }

    /// What [`Overlay::make_node`] made: the attributes from its descriptor, else from
    /// its path in `layer`.
    fn made(
        &self,
        layer: Layer,
        rel: &Path,
        file: Option<File>,
    ) -> FsResult<(Found, Option<File>)> {
        let meta = match &file {
            Some(f) => sys::fstat(f)?,
            None => {
                let (root, at) = self.place(layer, rel);
                root.stat(&at)?.ok_or_else(FsError::enoent)?
            }
        };
        Ok((self.found(rel, layer, meta), file))
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
            self.refuse_reserved(parent, name)?;
            // Straight to the share: made, or found there (the share tells which); its
            // attributes from the open file. No lock held while the share answers.
            let made = creation_flags(flags);
            let mut opened = self.share.open_file(&rel, made, perm);
            if opened.as_ref().is_err_and(|e| {
                matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR))
            }) && self.resolve(parent)?.layer == Layer::Upper
            {
                self.share_dirs_for(ctx, parent)?;
                opened = self.share.open_file(&rel, made, perm);
            }
            let (file, writer) = match opened {
                Ok(file) => {
                    self.chown_made(&self.share, &rel, ctx, None, Some(&file))?;
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
        // Made, or (without O_EXCL) the existing file opened. Only O_EXCL takes a kept
        // look: the kernel always looks the name up just before one (without, it may
        // send the create on a name it remembers missing).
        let excl = flags & libc::O_EXCL != 0;
        let made = self.make_node(ctx, parent, name, excl, |root, at| {
            root.open_file(at, creation_flags(flags), perm).map(Some)
        });
        let (found, file) = match made {
            Ok((found, Some(file))) => (found, file),
            Ok((_, None)) => return Err(errno(libc::EIO)),
            Err(e) if e.errno() == libc::EEXIST && flags & libc::O_EXCL == 0 => {
                let (file, writer) = self.open(ctx, &rel, flags)?;
                return Ok((self.resolve(&rel)?, file, writer));
            }
            Err(e) => return Err(e),
        };
        let writer =
            if found.layer == Layer::Upper && self.policy.classify(&rel) == PathClass::Cached {
                let ino = found.meta.ino();
                *self.lock_any().writers.entry(ino).or_insert(0) += 1;
                Some(ino)
            } else {
                None
            };
        Ok((found, file, writer))
    }

    /// The share's copies of the directories above a name passed through to the share,
    /// where only the cache has them (a program made a new dot directory, then a database
    /// in it: Firefox's first start makes its profile so). Each is made owner-only, then
    /// given the cache copy's mode once all are made (a read-only directory on the way
    /// takes its children, as the cache's did). Each is recorded as the share's object
    /// at its path, so that the sync takes it for ours: removed here, it is removed there
    /// without a conflict. A file the session deleted and replaced by one of these
    /// directories is deleted on the share first, if it is still what the session took
    /// over (else ENOTDIR: another workstation's save stands). One another workstation
    /// made meanwhile is taken as it is. The cache's copies stay dirty: the sync finds the
    /// share's directories there and sends only their attributes.
    pub(super) fn share_dirs_for(&self, ctx: &Ctx, parent: &Path) -> FsResult<()> {
        let made = self.make_share_dirs_for(ctx, parent);
        self.forget_looks();
        made
    }

    /// [`Overlay::share_dirs_for`]'s work.
    fn make_share_dirs_for(&self, ctx: &Ctx, parent: &Path) -> FsResult<()> {
        let mut missing = Vec::new();
        for dir in parent.ancestors().filter(|a| !a.as_os_str().is_empty()) {
            match self.share.stat(dir)? {
                Some(m) if m.is_dir() => break,
                Some(m) => {
                    self.delete_replaced_on_share(dir, &m)?;
                    missing.push(dir);
                    break;
                }
                None => missing.push(dir),
            }
        }
        let mut made = Vec::new();
        for dir in missing.into_iter().rev() {
            let ours = match self.upper_stat(dir)? {
                Some(m) if m.is_dir() => m,
                Some(_) => return Err(errno(libc::ENOTDIR)),
                None => return Err(errno(libc::ENOENT)),
            };
            match self.share.mkdir(dir, 0o700) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
                Err(e) => return Err(e.into()),
            }
            self.chown_made(&self.share, dir, ctx, None, None)?;
            let Some(theirs) = self.share.stat(dir)? else {
                return Err(errno(libc::ENOENT));
            };
            {
                let mut inner = self.lock();
                if inner.state.taken_over(dir) && inner.state.base(dir).is_none() {
                    self.record(
                        &mut inner,
                        &[Record::Base(dir.to_path_buf(), Some(share_id_of(&theirs)))],
                    )?;
                }
            }
            made.push((
                dir,
                (ours.mode() & 0o7777) | (theirs.mode() & libc::S_ISGID),
            ));
        }
        for (dir, mode) in made.into_iter().rev() {
            self.share.chmod(dir, mode)?;
        }
        Ok(())
    }

    /// The share's non-directory `m` at `dir`, where the cache holds a directory: deleted
    /// on the share when the session took it over as it is (the user deleted it and made
    /// a directory there, which the sync would send over it); else ENOTDIR.
    fn delete_replaced_on_share(&self, dir: &Path, m: &Stat) -> FsResult<()> {
        let ours = {
            let inner = self.lock();
            inner.state.taken_over(dir) && inner.state.base(dir) == Some(share_id_of(m))
        };
        if !ours || !self.upper_stat(dir)?.is_some_and(|u| u.is_dir()) {
            return Err(errno(libc::ENOTDIR));
        }
        match self.share.unlink(dir) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e.into()),
        }
        let mut inner = self.lock();
        self.record(&mut inner, &[Record::Base(dir.to_path_buf(), None)])?;
        Ok(())
    }

    pub fn mkdir(&self, ctx: &Ctx, parent: &Path, name: &OsStr, mode: u32) -> FsResult<Found> {
        let perm = mode & 0o7777 & !ctx.umask;
        let made = self.make_node(ctx, parent, name, true, |root, at| {
            root.mkdir(at, perm)?;
            // mkdir masks with our umask (0) only; set the exact bits (sticky, setgid).
            root.chmod(
                at,
                perm | (root
                    .stat(at)?
                    .map(|m| m.mode() & libc::S_ISGID)
                    .unwrap_or(0)),
            )?;
            Ok(None)
        });
        made.map(|(found, _)| found)
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
        self.make_node(ctx, parent, name, true, |root, at| {
            root.mknod(at, mode, rdev).map(|()| None)
        })
        .map(|(found, _)| found)
    }

    pub fn symlink(
        &self,
        ctx: &Ctx,
        parent: &Path,
        name: &OsStr,
        target: &Path,
    ) -> FsResult<Found> {
        self.make_node(ctx, parent, name, true, |root, at| {
            root.symlink(target, at).map(|()| None)
        })
        .map(|(found, _)| found)
    }

    /// Hard link `src` as `parent/name`. Both must be of the same class.
    pub fn link(&self, ctx: &Ctx, src: &Path, parent: &Path, name: &OsStr) -> FsResult<Found> {
        self.refuse_reserved(parent, name)?;
        // A file held by block gets a second name whole (see `blocks.rs`).
        self.make_whole(src)?;
        let rel = parent.join(name);
        let class = self.policy.classify(src);
        if class != self.policy.classify(&rel) {
            return Err(errno(libc::EXDEV));
        }
        let look = match class {
            PathClass::Cached => self.look_before_lock(&rel),
            _ => ShareLook::none(),
        };
        if class == PathClass::Passthrough
            && !self.share.stat(parent)?.is_some_and(|m| m.is_dir())
            && self.resolve(parent)?.layer == Layer::Upper
        {
            self.share_dirs_for(ctx, parent)?;
        }
        let mut inner = self.lock_for(&[src, &rel]);
        self.check_parent(&inner, parent)?;
        // The answer the name was found free by is the one its base records (asked again,
        // another workstation's file made in between would be taken for the base, and
        // overwritten by the sync without a conflict).
        let mut seen = None;
        match class {
            PathClass::Cached => {
                seen = self.free_cached_name(&inner, &rel, look)?.then_some(None);
            }
            _ => {
                if self.resolve_locked(&inner, &rel).is_ok() {
                    return Err(errno(libc::EEXIST));
                }
            }
        }
        let mut marked = None;
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
                inner = self.copy_up(inner, &[src, &rel], src, ctx)?;
                self.ensure_upper_dir(&inner, parent, ctx)?;
                let _ = self.mark_dirty(&mut inner, src)?;
                let was_whiteout = inner.state.is_whiteout(&rel);
                let bases = self.take_over_seen(&inner, &rel, seen, i64::MIN)?;
                if !bases.is_empty() {
                    self.record(&mut inner, &bases)?;
                }
                // Covers the source's mark too (written before it).
                marked = Some(self.mark_dirty(&mut inner, &rel)?);
                if let Err(e) = self.cache.link(&up(src), &up(&rel)) {
                    return Err(self.undo_new(&mut inner, &rel, was_whiteout, e));
                }
                if let Some(m) = self.upper_stat(&rel)? {
                    remember_link(&mut inner, m.ino(), &[src, &rel]);
                }
                // Both names share the source's share identity.
                if let Some(o) = inner.state.origin(src) {
                    self.record(&mut inner, &[Record::Origin(rel.clone(), o)])?;
                }
            }
        }
        let found = self.resolve_locked(&inner, &rel);
        drop(inner);
        if let Some(t) = marked {
            self.durable(t)?;
        }
        found
    }

    pub fn unlink(&self, parent: &Path, name: &OsStr) -> FsResult<()> {
        self.remove(parent, name, false)
    }

    pub fn rmdir(&self, parent: &Path, name: &OsStr) -> FsResult<()> {
        self.remove(parent, name, true)
    }

    pub(super) fn remove(&self, parent: &Path, name: &OsStr, dir: bool) -> FsResult<()> {
        // Before any look at the share this removal makes (see [`super::racy`]).
        let second = self.share_second();
        let rel = parent.join(name);
        if self.policy.classify(&rel) == PathClass::Passthrough {
            // The share tells a directory from a file itself (unlink: EISDIR, rmdir:
            // ENOTDIR), as for any program.
            if dir {
                self.share.rmdir(&rel)?;
            } else {
                self.share.unlink(&rel)?;
            }
            return Ok(());
        }
        // What the share holds there, asked before the lock (a cached path only).
        let look = match self.policy.classify(&rel) {
            PathClass::Cached => self.look_before_lock(&rel),
            _ => ShareLook::none(),
        };
        let mut inner = self.lock_for(&[&rel]);
        let found = self.resolve_looked(&inner, &rel, look.clone())?;
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
            inner = self.lock_for(&[&rel]);
        }
        // What the share holds there: seen already when the name was found only there.
        let share_now = match found.layer {
            Layer::Lower if !dir => Some(found.meta),
            _ => self.lower_meta_looked(&inner, &rel, look)?,
        };
        let whiteout = share_now.is_some()
            || (self.sync_running.load(Ordering::Acquire) && inner.state.is_dirty(&rel));
        let mut records = vec![Record::Delete {
            path: rel.clone(),
            whiteout,
        }];
        if whiteout {
            // What we mean to delete on the share (unless an earlier take-over recorded
            // what the user started from): a later change there is a conflict.
            let seen = share_now.as_ref().map(Some);
            records.extend(self.take_over_seen(&inner, &rel, seen, second)?);
        }
        let others = if !dir && found.layer == Layer::Upper {
            self.other_names_changed(&inner, &rel, &found.meta)?
        } else {
            Vec::new()
        };
        // Write-ahead where the share holds the name: a crash between the cache's removal
        // and the record would show the share's copy again, which may be older than the
        // cache's (a change made here, also through another name of a hard link). And
        // where other names of the file take over its change: a crash after the removal
        // would leave them clean, the change sent nowhere. Else it is enough that the
        // record is on disk before the answer: the crash then leaves the name as it was,
        // or gone.
        let write_ahead = whiteout || !others.is_empty();
        records.extend(others);
        let in_cache = match found.layer {
            Layer::Upper if !dir => true,
            _ => self.upper_stat(&rel)?.is_some(),
        };
        let remove_cached = || -> FsResult<()> {
            if in_cache {
                if dir {
                    self.cache.rmdir(&up(&rel))?;
                } else {
                    self.cache.unlink(&up(&rel))?;
                }
            }
            Ok(())
        };
        if !write_ahead {
            let removed = self.record_deferred(&mut inner, &records)?;
            remove_cached()?;
            drop(inner);
            return self.durable(removed);
        }
        // The records reach the disk, and the cache changes, without the lock.
        let flight = self.in_flight(&mut inner, vec![rel.clone()], records)?;
        drop(inner);
        let flight = flight.durable()?;
        remove_cached()?;
        flight.end(&mut self.lock_any());
        Ok(())
    }

    /// The other names of the cache's file `meta` at `rel` (a hard link), when a change
    /// made through `rel` this session (it is dirty) goes with the name (an unlink, a
    /// rename over it): each is taken over and made dirty, so that the change reaches the
    /// share under them. A sync sends the other names of a changed file it is handed
    /// (`--hard-links`); a name gone before the sync cannot hand them over, and the
    /// change was lost at the names that stayed.
    pub(super) fn other_names_changed(
        &self,
        inner: &Inner,
        rel: &Path,
        meta: &Stat,
    ) -> FsResult<Vec<Record>> {
        if !meta.is_file() || meta.nlink() < 2 || !inner.state.is_dirty(rel) {
            return Ok(Vec::new());
        }
        let ino = meta.ino();
        if self.links_all_changed(inner, rel, meta)? {
            return Ok(Vec::new());
        }
        let mut names = Vec::new();
        self.walk_upper(|p, i, kind| {
            if kind != libc::S_IFDIR && i == ino && p != rel {
                names.push(p.to_path_buf());
            }
        })?;
        let mut out = Vec::new();
        for name in names {
            if !inner.state.is_dirty(&name) {
                out.extend(self.take_over(inner, &name)?);
                out.push(Record::Dirty(name));
            }
        }
        Ok(out)
    }

    /// Whether the names this session linked to the cache's file `meta` (other than
    /// `rel`) are all of its other names, each still that file, and every one a sync sends
    /// already changed: then none needs taking over. A save that links its temporary file
    /// to the final name and unlinks it (git's objects) costs no walk through the cache.
    fn links_all_changed(&self, inner: &Inner, rel: &Path, meta: &Stat) -> FsResult<bool> {
        let Some(known) = inner.linked.get(&meta.ino()) else {
            return Ok(false);
        };
        let mut others = 0;
        for name in known.iter().filter(|n| n.as_path() != rel) {
            let Some(m) = self.upper_stat(name)? else {
                continue;
            };
            if m.ino() != meta.ino() || m.dev() != meta.dev() || !m.is_file() {
                continue;
            }
            if self.policy.classify(name) != PathClass::LocalOnly && !inner.state.is_dirty(name) {
                return Ok(false);
            }
            others += 1;
        }
        Ok(others + 1 == meta.nlink())
    }

    /// Every path the cache holds strictly below `rel` (nothing for a file).
    pub(super) fn upper_below(&self, rel: &Path) -> io::Result<Vec<PathBuf>> {
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
}

/// Remembers that `names` are names of cache inode `ino` (see [`Inner::linked`]).
fn remember_link(inner: &mut Inner, ino: u64, names: &[&Path]) {
    if inner.linked.len() >= super::LINKED_MAX && !inner.linked.contains_key(&ino) {
        inner.linked.clear();
    }
    let known = inner.linked.entry(ino).or_default();
    for n in names {
        if !known.iter().any(|k| k == n) {
            known.push(n.to_path_buf());
        }
    }
}
