//! Open files: opens of each class, deferred copy-up of files opened for writing, where an
//! open handle's file is now, and writers' accounting for the sync.

use super::*;

impl Overlay {
    /// Opens an existing file. Writable opens of cached paths copy the file up first.
    /// Returns the file and, for a writable cache file, its cache inode (see
    /// [`Overlay::release_writer`]).
    pub fn open(&self, ctx: &Ctx, rel: &Path, flags: i32) -> FsResult<(File, Option<u64>)> {
        let class = self.policy.classify(rel);
        let flags = open_flags(flags) & !(libc::O_CREAT | libc::O_EXCL);
        if wants_write(flags) && class == PathClass::Cached {
            let truncating = flags & libc::O_TRUNC != 0;
            let prepared = if truncating {
                None
            } else {
                self.prepare_copy_up(rel)
            };
            // A file held by block is cut through its blocks (its limit follows).
            if let Some(bf) = self.block_file(rel).filter(|_| truncating) {
                self.set_len_by_block(&bf, rel, 0, None)?;
            }
            let inner = self.lock_for(&[rel]);
            let (inner, _) = self.copy_up_of(
                inner,
                &[rel],
                rel,
                Data::kept_unless(truncating),
                ctx,
                None,
                prepared,
            )?;
            return self.open_upper(inner, rel, flags);
        }
        if class == PathClass::Passthrough {
            // The kernel has just looked it up: one round trip to the share, not two.
            return Ok((self.share.open_file(rel, flags, 0)?, None));
        }
        let found = self.resolve(rel)?;
        let (root, at) = self.place(found.layer, rel);
        Ok((root.open_file(&at, flags, 0)?, None))
    }

    /// Opens the cache's file at the cached path `rel` for writing (`flags` as kept by
    /// [`open_flags`]): marked dirty, and counted as a writer.
    ///
    /// Takes the lock's guard: the open is answered after it is let go of and the mark is
    /// on disk (group commit, see [`Overlay::durable`]). A crash before that loses only
    /// what this open changed (`O_TRUNC`) of a copy the share has too.
    pub(super) fn open_upper(
        &self,
        mut inner: MutexGuard<'_, Inner>,
        rel: &Path,
        flags: i32,
    ) -> FsResult<(File, Option<u64>)> {
        let marked = self.mark_dirty(&mut inner, rel)?;
        let file = self.cache.open_file(&up(rel), flags, 0)?;
        let ino = sys::fstat(&file)?.ino();
        *inner.writers.entry(ino).or_insert(0) += 1;
        drop(inner);
        if let Err(e) = self.durable(marked) {
            self.release_writer(ino);
            return Err(e);
        }
        Ok((file, Some(ino)))
    }

    /// [`Overlay::open`] of what a deferred handle `d` stands for, when [`Overlay::binding`]
    /// found it still on the share or copied up from it: a copy-up is made only from the
    /// object the handle has open. None when the name holds another object by now (the
    /// caller looks again).
    pub fn open_bound(
        &self,
        ctx: &Ctx,
        rel: &Path,
        flags: i32,
        d: Deferral,
    ) -> FsResult<Option<(File, Option<u64>)>> {
        let kept = open_flags(flags) & !(libc::O_CREAT | libc::O_EXCL);
        if !wants_write(kept) || self.policy.classify(rel) != PathClass::Cached {
            return self.open(ctx, rel, flags).map(Some);
        }
        let truncating = kept & libc::O_TRUNC != 0;
        let prepared = if truncating {
            None
        } else {
            self.prepare_copy_up(rel)
        };
        let mut inner = self.lock_for(&[rel]);
        let bound = if self.upper_stat(rel)?.is_some() {
            inner
                .state
                .origin(rel)
                .is_some_and(|o| (o.dev, o.ino) == d.object)
        } else {
            let copied = self.copy_up_of(
                inner,
                &[rel],
                rel,
                Data::kept_unless(truncating),
                ctx,
                Some(d.object),
                prepared,
            )?;
            inner = copied.0;
            copied.1
        };
        if !bound {
            return Ok(None);
        }
        self.open_upper(inner, rel, kept).map(Some)
    }

    /// Whether the cache has no say on `rel` (not in the upper layer, not deleted); when
    /// it has none, whether the cache took `rel` over in this session.
    pub(super) fn share_only(&self, rel: &Path) -> FsResult<Option<bool>> {
        let inner = self.lock_for(&[rel]);
        let say = self.upper_stat(rel)?.is_some() || inner.state.hidden(rel);
        Ok((!say).then(|| inner.state.taken_over(rel)))
    }

    /// [`Overlay::open`], except that opening (without O_TRUNC) a cached file that is
    /// still only on the share copies nothing yet, even for writing: the handle reads the
    /// share's copy, and [`Overlay::open`] with the same flags makes it writable at its
    /// first write (or follows the file to the cache when another handle wrote it). A program that opens a large file read-write and writes it rarely (SQLite
    /// opens its database so, and in WAL mode writes it only at checkpoints) then costs
    /// no copy at open. Returns the file, its writer registration, and what a deferred
    /// handle stands for.
    pub fn open_deferred(
        &self,
        ctx: &Ctx,
        rel: &Path,
        flags: i32,
    ) -> FsResult<(File, Option<u64>, Option<Deferral>)> {
        let f = open_flags(flags) & !(libc::O_CREAT | libc::O_EXCL);
        if f & libc::O_TRUNC == 0
            && self.policy.classify(rel) == PathClass::Cached
            && self.share_only(rel)?.is_some()
        {
            // The kernel has checked the access asked for (default_permissions). A
            // read-only open is deferred too: it follows the file to the cache once
            // another handle has written it there. One round trip to the share: the open,
            // then fstat on what it gave.
            let read_only = (f & !libc::O_ACCMODE & !libc::O_APPEND) | libc::O_RDONLY;
            match self.share.open_file(rel, read_only, 0) {
                // Still the share's, and a regular file: else the usual way below.
                Ok(file) => {
                    let meta = sys::fstat(&file)?;
                    if let (true, Some(taken_at_open)) = (meta.is_file(), self.share_only(rel)?) {
                        let d = Deferral {
                            object: (meta.dev(), meta.ino()),
                            taken_at_open,
                        };
                        return Ok((file, None, Some(d)));
                    }
                }
                // A write-only file: no reading it before it is written; the usual way.
                Err(e) if e.raw_os_error() == Some(libc::EACCES) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let (file, writer) = self.open(ctx, rel, flags)?;
        Ok((file, writer, None))
    }

    /// Where the share object a deferred handle has open is now under `rel`: still on the
    /// share, copied up from it, replaced here, or changed on the share by someone else.
    /// An error of the share other than "no such file" is returned (the name cannot be
    /// told).
    pub fn binding(&self, rel: &Path, d: Deferral) -> FsResult<Binding> {
        let found = match self.resolve(rel) {
            Ok(found) => Some(found),
            Err(e) if matches!(e.errno(), libc::ENOENT | libc::ENOTDIR) => None,
            Err(e) => return Err(e),
        };
        let inner = self.lock_for(&[rel]);
        let same = |f: &Found| (f.meta.dev(), f.meta.ino()) == d.object;
        Ok(match found {
            Some(f) if f.layer == Layer::Lower && same(&f) => Binding::Share,
            Some(f)
                if f.layer == Layer::Upper
                    && inner
                        .state
                        .origin(rel)
                        .is_some_and(|o| (o.dev, o.ino) == d.object) =>
            {
                Binding::Cache
            }
            _ if self.replaced_here(&inner, rel, d)? => Binding::Replaced,
            _ => Binding::Changed,
        })
    }

    /// Whether the cache took `rel` over since a handle `d` was opened (a rename over it,
    /// an unlink, a copy-up): its take-over is recorded now and was not then, or, taken
    /// over already then, the cache has a say on the name now.
    pub(super) fn replaced_here(&self, inner: &Inner, rel: &Path, d: Deferral) -> io::Result<bool> {
        if !inner.state.taken_over(rel) {
            return Ok(false);
        }
        Ok(!d.taken_at_open || self.upper_stat(rel)?.is_some() || inner.state.hidden(rel))
    }

    /// Keeps the version a deferred handle `d` (flags `flags`) is about to write when
    /// another workstation changed the file under its name (see [`Binding::Changed`]):
    /// the handle's file is copied up to `rel` from `src` (its open file), with the object
    /// it had open as the base, so the next sync finds the conflict and keeps both versions.
    /// Returns the cache file opened with `flags` and its writer registration, or None when
    /// the cache took the name meanwhile (the caller looks again).
    pub fn keep_version(
        &self,
        ctx: &Ctx,
        rel: &Path,
        src: &File,
        d: Deferral,
        flags: i32,
    ) -> FsResult<Option<(File, Option<u64>)>> {
        let mut inner = self.lock_for(&[rel]);
        if self.upper_stat(rel)?.is_some()
            || inner.state.hidden(rel)
            || self.replaced_here(&inner, rel, d)?
        {
            return Ok(None);
        }
        let meta = sys::fstat(src)?;
        if (meta.dev(), meta.ino()) != d.object {
            return Err(errno(libc::EIO));
        }
        if let Some(parent) = rel.parent() {
            self.ensure_upper_dir(&inner, parent, ctx)?;
        }
        self.journal_copy_up(&mut inner, rel, &meta)?;
        let tmp = self.tmp_rel();
        let copied = self
            .copy_open_file(src, &meta, &tmp)
            .and_then(|()| self.install_synced(&tmp, &up(rel)));
        if let Err(e) = copied {
            let _ = remove_tree(&self.cache, &tmp);
            return Err(e.into());
        }
        tracing::warn!(
            path = %session::shown(rel),
            "the share's file changed under an open handle (another workstation?): its version is kept in the cache"
        );
        let flags = open_flags(flags) & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
        self.open_upper(inner, rel, flags).map(Some)
    }

    /// A copy of the open file `src` (whose attributes are `meta`) at `dst` in the cache:
    /// data, mode, times, and the owner when we are root. Extended attributes stay behind
    /// (they are read by path, and the path holds another file now).
    pub(super) fn copy_open_file(&self, src: &File, meta: &Stat, dst: &Path) -> io::Result<()> {
        let out =
            self.cache
                .open_file(dst, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600)?;
        sys::copy_data(src, &out, meta.len())?;
        if self.as_root {
            self.cache.chown(dst, Some(meta.uid()), Some(meta.gid()))?;
        }
        self.cache.chmod(dst, meta.mode() & 0o7777)?;
        self.cache
            .utimens(dst, at(meta.atime()), at(meta.mtime()))?;
        out.sync_all()
    }

    /// A private copy of an open file that no name shows (the handle of a file whose name
    /// now holds another): writes go there and are never synced, as to an unlinked file.
    pub fn detached_copy(&self, src: &File) -> FsResult<File> {
        let copy =
            self.cache
                .open_file(Path::new("work"), libc::O_TMPFILE | libc::O_RDWR, 0o600)?;
        sys::copy_data(src, &copy, sys::fstat(src)?.len())?;
        Ok(copy)
    }

    /// A writable handle on a cache file was closed.
    pub fn release_writer(&self, ino: u64) {
        // Counts per inode, no name: nothing under way needs to end first.
        let mut inner = self.lock_any();
        if let Some(n) = inner.writers.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                inner.writers.remove(&ino);
            }
        }
        inner.released.insert(ino);
    }
}
