//! Attributes and extended attributes of the merged view.

use super::*;

impl Overlay {
    /// Changes attributes (chmod, chown, truncate, utimens). `file` is the open handle's
    /// file when the kernel gave one; it is used when the path is gone (unlinked while open).
    pub fn setattr(
        &self,
        ctx: &Ctx,
        rel: &Path,
        attr: SetAttr,
        file: Option<&File>,
    ) -> FsResult<Stat> {
        let keep_data = attr.size != Some(0);
        let prepared = if keep_data && file.is_none() {
            self.prepare_copy_up(rel)
        } else {
            None
        };
        let mut inner = self.lock_for(&[rel]);
        let mut found = match (self.resolve_locked(&inner, rel), file) {
            (Ok(f), _) => f,
            (Err(e), Some(f)) if e.errno() == libc::ENOENT => {
                drop(inner);
                return Self::setattr_fd(f, attr);
            }
            (Err(e), _) => return Err(e),
        };
        let mut marked = None;
        if self.policy.classify(rel) == PathClass::Cached {
            inner = self
                .copy_up_of(
                    inner,
                    &[rel],
                    rel,
                    Data::kept_unless(!keep_data),
                    ctx,
                    None,
                    prepared,
                )?
                .0;
            marked = Some(self.mark_dirty(&mut inner, rel)?);
            found = self.resolve_locked(&inner, rel)?;
        }
        let mut attr = attr;
        if let (Some(size), Some(bf)) = (attr.size, self.block_file_locked(&inner, rel)) {
            // A file held by block is cut through its blocks, without the lock (its
            // record goes to disk first).
            drop(inner);
            self.set_len_by_block(&bf, rel, size, file)?;
            attr.size = None;
            inner = self.lock_for(&[rel]);
            found = self.resolve_locked(&inner, rel)?;
        }
        let changed = self.change_attrs(&inner, rel, &found, attr, file);
        drop(inner);
        if let Some(t) = marked {
            self.durable(t)?;
        }
        changed
    }

    /// The attribute changes of [`Overlay::setattr`] on what `found` is, under the lock;
    /// the attributes after them.
    fn change_attrs(
        &self,
        inner: &Inner,
        rel: &Path,
        found: &Found,
        attr: SetAttr,
        file: Option<&File>,
    ) -> FsResult<Stat> {
        let (root, at) = self.place(found.layer, rel);
        if attr.uid.is_some() || attr.gid.is_some() {
            root.chown(&at, attr.uid, attr.gid)?;
        }
        if let Some(mode) = attr.mode {
            if !found.meta.is_symlink() {
                root.chmod(&at, mode & 0o7777)?;
            }
        }
        if let Some(size) = attr.size {
            // A writable handle of a cached file always points into the cache.
            match file {
                Some(f) => f.set_len(size)?,
                None => root.open_file(&at, libc::O_WRONLY, 0)?.set_len(size)?,
            }
        }
        if attr.atime.is_some() || attr.mtime.is_some() {
            root.utimens(
                &at,
                attr.atime.unwrap_or(SetTime::Omit),
                attr.mtime.unwrap_or(SetTime::Omit),
            )?;
        }
        Ok(self.resolve_locked(inner, rel)?.meta)
    }

    /// setattr through an open file whose name is gone.
    pub(super) fn setattr_fd(f: &File, attr: SetAttr) -> FsResult<Stat> {
        use std::os::unix::fs::PermissionsExt;
        if attr.uid.is_some() || attr.gid.is_some() {
            std::os::unix::fs::fchown(f, attr.uid, attr.gid)?;
        }
        if let Some(mode) = attr.mode {
            f.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))?;
        }
        if let Some(size) = attr.size {
            f.set_len(size)?;
        }
        if attr.atime.is_some() || attr.mtime.is_some() {
            sys::futimens(
                f,
                attr.atime.unwrap_or(SetTime::Omit),
                attr.mtime.unwrap_or(SetTime::Omit),
            )?;
        }
        Ok(sys::fstat(f)?)
    }

    pub fn readlink(&self, rel: &Path) -> FsResult<PathBuf> {
        let found = self.resolve(rel)?;
        let (root, at) = self.place(found.layer, rel);
        Ok(root.readlink(&at)?)
    }

    pub fn getxattr(&self, rel: &Path, name: &OsStr) -> FsResult<Vec<u8>> {
        let found = self.resolve(rel)?;
        let (root, at) = self.place(found.layer, rel);
        Ok(root.getxattr(&at, name)?)
    }

    pub fn listxattr(&self, rel: &Path) -> FsResult<Vec<OsString>> {
        let found = self.resolve(rel)?;
        let (root, at) = self.place(found.layer, rel);
        Ok(root.listxattr(&at)?)
    }

    /// Where a metadata write on `rel` lands (copied up first if cached).
    pub(super) fn writable_place(&self, ctx: &Ctx, rel: &Path) -> FsResult<(&Root, PathBuf)> {
        if self.policy.classify(rel) == PathClass::Passthrough {
            self.resolve_share(rel)?;
            return Ok(self.place(Layer::Share, rel));
        }
        let prepared = self.prepare_copy_up(rel);
        let inner = self.lock_for(&[rel]);
        let found = self.resolve_locked(&inner, rel)?;
        if self.policy.classify(rel) == PathClass::Cached {
            let (mut inner, _) =
                self.copy_up_of(inner, &[rel], rel, Data::Blocks, ctx, None, prepared)?;
            let marked = self.mark_dirty(&mut inner, rel)?;
            drop(inner);
            // Marked on disk before the attribute changes (a crash between loses only
            // that change, of a copy the share has too).
            self.durable(marked)?;
            return Ok((&self.cache, up(rel)));
        }
        Ok(self.place(found.layer, rel))
    }

    pub fn setxattr(
        &self,
        ctx: &Ctx,
        rel: &Path,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> FsResult<()> {
        let (root, at) = self.writable_place(ctx, rel)?;
        Ok(root.setxattr(&at, name, value, flags)?)
    }

    pub fn removexattr(&self, ctx: &Ctx, rel: &Path, name: &OsStr) -> FsResult<()> {
        // Look first, so a missing attribute does not copy the file up.
        self.getxattr(rel, name)?;
        let (root, at) = self.writable_place(ctx, rel)?;
        Ok(root.removexattr(&at, name)?)
    }
}
