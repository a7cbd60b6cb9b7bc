//! Copy-up: the first change to a cached path copies the share's object into the cache
//! (made in `work/`, then renamed into `upper/`), journaled before the cache changes.

use super::*;
use crate::locks::Locked;
use crate::state::Content;

/// What a copy-up takes of the share's file: nothing (it is cut to nothing), all of it,
/// or all of it unless the file is held by block (`blocks.rs`), which copies nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Data {
    Empty,
    Whole,
    Blocks,
}

impl Data {
    /// [`Data::Blocks`], or [`Data::Empty`] for a copy-up that cuts the file to nothing.
    pub(super) fn kept_unless(cut: bool) -> Self {
        if cut {
            Data::Empty
        } else {
            Data::Blocks
        }
    }
}

/// A copy made ahead of a copy-up (see [`Overlay::prepare_copy_up`]): in `work/`, and the
/// share file's attributes when it was read.
/// Dropped unused, its copy is removed.
#[derive(Debug)]
pub(super) struct Prepared<'a> {
    cache: &'a Root,
    tmp: PathBuf,
    meta: Stat,
    /// Syncs of this mount started before the share's file was opened: its attributes
    /// serve as the copy-up's look at the share if none started since (see
    /// [`Overlay::look_before_lock`]).
    syncs: u64,
    /// [`Overlay::share_second`] before the share's file was opened (see [`super::racy`]).
    second: i64,
}

impl Prepared<'_> {
    /// Puts the copy at `dst` (see [`Overlay::install_synced`]).
    pub(super) fn install(mut self, overlay: &Overlay, dst: &Path) -> io::Result<()> {
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

impl Overlay {
    /// New objects belong to the caller (when we are root), with the group of a setgid
    /// parent directory. `parent`: its attributes when at hand (the merged view's parent:
    /// its cache copy has the share's mode and group); `file`: the new file's descriptor.
    /// Either saves a path walk.
    pub(super) fn chown_made(
        &self,
        root: &Root,
        at: &Path,
        ctx: &Ctx,
        parent: Option<&Stat>,
        file: Option<&File>,
    ) -> io::Result<()> {
        if !self.as_root {
            return Ok(());
        }
        let looked;
        let parent = match parent {
            Some(p) => Some(p),
            None => {
                looked = root.stat(at.parent().unwrap_or(Path::new("")))?;
                looked.as_ref()
            }
        };
        let gid = match parent {
            Some(p) if p.mode() & libc::S_ISGID != 0 => p.gid(),
            _ => ctx.gid,
        };
        match file {
            Some(f) => root.fchown(f, ctx.uid, gid),
            None => root.chown(at, Some(ctx.uid), Some(gid)),
        }
    }

    /// Copies ownership, mode, xattrs and times of a share object onto a cache object.
    pub(super) fn copy_meta(
        &self,
        src_root: &Root,
        src: &Path,
        meta: &Stat,
        dst: &Path,
    ) -> io::Result<()> {
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
    pub(super) fn ensure_upper_dir(&self, inner: &Inner, rel: &Path, ctx: &Ctx) -> FsResult<()> {
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
    /// Nobody else can use the moment: the cache is the user's, 0700. A copy-up puts its
    /// copy in place without the overlay's lock: the moments are taken one at a time (two
    /// in one directory would each put back the mode the other changed).
    pub(super) fn with_write_access<T>(
        &self,
        dir: &Path,
        f: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        if self.as_root {
            return f();
        }
        let _moment = self.write_access.locked();
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
    pub(super) fn install(&self, tmp: &Path, dst: &Path) -> io::Result<()> {
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
    pub(super) fn journal_copy_up(
        &self,
        inner: &mut Inner,
        rel: &Path,
        meta: &Stat,
    ) -> FsResult<()> {
        // The base is the object a handle had open, which the share no longer has at the
        // name: a conflict at the next sync, whatever its content.
        let records = self.copy_up_records(inner, rel, meta, i64::MIN)?;
        self.record(inner, &records)?;
        self.copied_up(inner, rel);
        Ok(())
    }

    /// The records of [`Overlay::journal_copy_up`]; `second` is [`Overlay::share_second`]
    /// before `meta` was looked at. A racy base is marked with its content unknown: the
    /// copy-up records it once the copy is made (see [`Overlay::copy_up_of`]).
    fn copy_up_records(
        &self,
        inner: &Inner,
        rel: &Path,
        meta: &Stat,
        second: i64,
    ) -> FsResult<Vec<Record>> {
        let mut records = vec![Record::Origin(
            rel.to_path_buf(),
            Origin {
                dev: meta.dev(),
                ino: meta.ino(),
            },
        )];
        if !inner.state.taken_over(rel) {
            let base = session::share_id_of(meta);
            records.push(Record::Base(rel.to_path_buf(), Some(base)));
            if meta.is_file() && Self::is_racy(&base, second) {
                records.push(Record::Racy(rel.to_path_buf(), Content::Unknown));
            }
        }
        records.extend(self.database_base(inner, rel)?);
        records.push(Record::Dirty(rel.to_path_buf()));
        Ok(records)
    }

    /// Noted once a copy-up's records are written: for the sync, and for deferred handles.
    fn copied_up(&self, inner: &mut Inner, rel: &Path) {
        inner.touched.insert(rel.to_path_buf());
        self.copy_ups.fetch_add(1, Ordering::AcqRel);
    }

    /// Copies one cached path up from the share, whole, if it is not in the cache yet
    /// (see [`Overlay::copy_up_of`]): for a rename or a link, which need the whole file.
    pub(super) fn copy_up<'a>(
        &'a self,
        inner: MutexGuard<'a, Inner>,
        held: &[&Path],
        rel: &Path,
        ctx: &Ctx,
    ) -> FsResult<MutexGuard<'a, Inner>> {
        self.copy_up_of(inner, held, rel, Data::Whole, ctx, None, None)
            .map(|(inner, _)| inner)
    }

    /// The copy of the share's regular file at cached path `rel`, with its data, made in
    /// `work/` without the overlay's lock (a large database from a slow share holds up no
    /// other request), for [`Overlay::copy_up_of`] to put in place if the share still
    /// has that version by then. None when no copy-up is due (the cache has the path or
    /// deleted it) or the copy could not be made whole (the file changed while it was
    /// read, or the share failed): the copy-up is then made under the lock as before.
    pub(super) fn prepare_copy_up(&self, rel: &Path) -> Option<Prepared<'_>> {
        if self.policy.classify(rel) != PathClass::Cached {
            return None;
        }
        {
            let inner = self.lock_for(&[rel]);
            if inner.state.hidden(rel) || !matches!(self.upper_stat(rel), Ok(None)) {
                return None;
            }
        }
        let syncs = self.syncs_started.load(Ordering::SeqCst);
        let second = self.share_second();
        let input = self.share.open_file(rel, libc::O_RDONLY, 0).ok()?;
        let meta = sys::fstat(&input).ok()?;
        // A file held by block copies nothing at its take-over.
        if !meta.is_file() || self.held_by_block(&meta) {
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
            syncs,
            second,
        };
        // Not whole: dropped (and removed).
        matches!(made, Ok(true)).then_some(prepared)
    }

    /// [`Overlay::copy_up`]; with `object` (device, inode), only when the share still has
    /// that object at `rel`: false when it has another or none (nothing is copied then).
    ///
    /// With `prepared` (see [`Overlay::prepare_copy_up`]): that copy is put in place when
    /// the share still has the version it was made from, and dropped otherwise.
    ///
    /// `inner` was taken with [`Overlay::lock_for`] on `held` (which includes `rel`): the
    /// records reach the disk and the copy is made and put in place without the lock, the
    /// names reserved meanwhile (see [`InFlight`]); the lock is given back taken again.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_up_of<'a>(
        &'a self,
        mut inner: MutexGuard<'a, Inner>,
        held: &[&Path],
        rel: &Path,
        data: Data,
        ctx: &Ctx,
        object: Option<(u64, u64)>,
        prepared: Option<Prepared<'_>>,
    ) -> FsResult<(MutexGuard<'a, Inner>, bool)> {
        let with_data = data != Data::Empty;
        if self.upper_stat(rel)?.is_some() {
            return Ok((inner, true));
        }
        // The share's version: the prepared copy's if that look still stands (no share
        // look under the lock), else asked now.
        let second_now = self.share_second();
        let looked = prepared
            .as_ref()
            .filter(|_| with_data && !inner.state.hidden(rel))
            .and_then(|p| {
                self.still_stands(ShareLook {
                    syncs: p.syncs,
                    seen: Some(Some(p.meta)),
                })
            })
            .flatten();
        let (share_now, second) = match looked {
            Some(m) => (Some(m), prepared.as_ref().map_or(i64::MIN, |p| p.second)),
            None => (self.lower_meta(&inner, rel)?, second_now),
        };
        let meta = match (share_now, object) {
            (Some(m), Some(o)) if o != (m.dev(), m.ino()) => return Ok((inner, false)),
            (Some(m), _) => m,
            (None, Some(_)) => return Ok((inner, false)),
            (None, None) => return Err(FsError::enoent()),
        };
        if let Some(parent) = rel.parent() {
            self.ensure_upper_dir(&inner, parent, ctx)?;
        }
        let ready = prepared.filter(|p| with_data && p.meta.version() == meta.version());
        // Write-ahead: the records on disk before the copy is in place.
        let mut records = self.copy_up_records(&inner, rel, &meta, second)?;
        let racy = records.iter().any(|r| matches!(r, Record::Racy(..)));
        // A large file is held by block (see `blocks.rs`): nothing is copied. Not on a
        // base whose look another write in its second could leave (it stands by its
        // content, which is the whole file's), nor on a path taken over before (its
        // base is not this file).
        let by_block = data == Data::Blocks
            && ready.is_none()
            && !racy
            && self.takes_over_by_block(&inner, rel, &meta, &records);
        if by_block {
            records.push(Record::Partial(rel.to_path_buf(), meta.len()));
        }
        let names = held.iter().map(|p| p.to_path_buf()).collect();
        let flight = self.in_flight(&mut inner, names, records)?;
        self.copied_up(&mut inner, rel);
        drop(inner);
        let flight = flight.durable()?;
        let dst = up(rel);
        // A racy base's content: the copy's (what the user's changes start from), or the
        // share's file's when no data is copied (a truncating open; none when this user
        // may not read it: see [`Overlay::share_mark`]).
        // With the attributes of the share's file (see [`racy::sealed`]), read after the
        // copy from the object the copy was made of.
        let mut content = Some(Content::Unknown);
        let mut base_file = None;
        let seal = |data: Content| match self.share_attributes(rel, meta.ino()) {
            Some(attributes) => racy::sealed(data, &attributes),
            None => Content::Unknown,
        };
        let placed = match ready {
            Some(p) => {
                if racy {
                    content = Some(seal(self.content_in_cache(&p.tmp)));
                }
                p.install(self, &dst)
            }
            None if by_block => {
                let (placed, base) = self.place_by_block(rel, &meta, &dst);
                base_file = base;
                placed
            }
            None => {
                let tmp = self.tmp_rel();
                let result = self
                    .copy_object(rel, &meta, &tmp, with_data)
                    .and_then(|()| {
                        if racy {
                            content = if with_data {
                                Some(seal(self.content_in_cache(&tmp)))
                            } else {
                                self.share_mark(rel, session::share_id_of(&meta))
                            };
                        }
                        self.install_synced(&tmp, &dst)
                    });
                if result.is_err() {
                    let _ = remove_tree(&self.cache, &tmp);
                }
                result
            }
        };
        let mut inner = self.lock_any();
        flight.end(&mut inner);
        placed?;
        if let Some(f) = base_file {
            self.keep_base(&inner, rel, f);
        }
        self.settle_racy_copy(&mut inner, rel, content)?;
        tracing::debug!(path = %rel.display(), "copied up");
        Ok((inner, true))
    }

    /// A copy-up's cache file held by block put at `dst` (see `blocks.rs`), and its base,
    /// opened now and kept: its bytes stay readable even once another workstation's save
    /// replaces it under its name (the conflict then keeps ours whole).
    fn place_by_block(
        &self,
        rel: &Path,
        meta: &Stat,
        dst: &Path,
    ) -> (io::Result<()>, Option<File>) {
        let tmp = self.tmp_rel();
        let mut base = None;
        let result = self.sparse_copy(rel, meta, &tmp).and_then(|()| {
            base = self.open_base(rel, meta).ok();
            self.install_synced(&tmp, dst)
        });
        if result.is_err() {
            let _ = remove_tree(&self.cache, &tmp);
        }
        (result, base)
    }

    /// A copy-up's racy base of unknown content gets the content the copy found
    /// (`content`; None: the base stands by its look alone, recorded again without a mark).
    fn settle_racy_copy(
        &self,
        inner: &mut Inner,
        rel: &Path,
        content: Option<Content>,
    ) -> FsResult<()> {
        if inner.state.racy(rel) == Some(Content::Unknown) {
            match (content, inner.state.base(rel)) {
                (Some(Content::Unknown), _) => {}
                (Some(c), _) => self.record(inner, &[Record::Racy(rel.to_path_buf(), c)])?,
                (None, base) => self.record(inner, &[Record::Base(rel.to_path_buf(), base)])?,
            }
        }
        Ok(())
    }

    /// The content of the cache's file at `rel` (unknown when it cannot be read).
    pub(super) fn content_in_cache(&self, rel: &Path) -> Content {
        racy::content_at(&self.cache, rel, libc::O_RDONLY | libc::O_NONBLOCK)
    }

    /// [`Overlay::install`], then the parent directory synced: the copy is in place for good.
    pub(super) fn install_synced(&self, tmp: &Path, dst: &Path) -> io::Result<()> {
        self.install(tmp, dst)?;
        let parent = dst.parent().unwrap_or(Path::new("upper"));
        self.cache
            .open_file(parent, libc::O_RDONLY | libc::O_DIRECTORY, 0)?
            .sync_all()
    }

    /// Whether a take-over of `meta` at `rel` (whose records are `records`) holds it by
    /// block: a file long enough whose base is that very file.
    fn takes_over_by_block(
        &self,
        inner: &Inner,
        rel: &Path,
        meta: &Stat,
        records: &[Record],
    ) -> bool {
        let base_after = records
            .iter()
            .find_map(|r| match r {
                Record::Base(p, b) if p == rel => Some(*b),
                _ => None,
            })
            .unwrap_or_else(|| inner.state.base(rel));
        self.held_by_block(meta) && base_after == Some(session::share_id_of(meta))
    }

    /// The cache file of a file held by block (see `blocks.rs`): the share's file's
    /// length, no data (holes), its metadata.
    fn sparse_copy(&self, src: &Path, meta: &Stat, dst: &Path) -> io::Result<()> {
        let out =
            self.cache
                .open_file(dst, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600)?;
        out.set_len(meta.len())?;
        self.copy_meta(&self.share, src, meta, dst)?;
        out.sync_all()
    }

    pub(super) fn copy_object(
        &self,
        src: &Path,
        meta: &Stat,
        dst: &Path,
        with_data: bool,
    ) -> io::Result<()> {
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
}
