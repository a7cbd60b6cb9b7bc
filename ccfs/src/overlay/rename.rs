//! Renames: within one class; a cached rename takes over its target and what moves below
//! it, writes its records ahead, and hides the old name where the share has it.

use super::*;

impl Overlay {
    /// Renames within one class. Directories that exist on the share cannot be renamed
    /// under a cached path (EXDEV: `mv` then copies), as in overlayfs without redirects.
    pub fn rename(
        &self,
        ctx: &Ctx,
        from_parent: &Path,
        from_name: &OsStr,
        to_parent: &Path,
        to_name: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        self.refuse_reserved(to_parent, to_name)?;
        let from = from_parent.join(from_name);
        // A file held by block moves whole (its missing blocks are its base's, at this
        // name on the share): made whole first, and so is each one below a directory.
        self.make_whole_below(&from)?;
        if flags & libc::RENAME_EXCHANGE != 0 {
            self.make_whole_below(&to_parent.join(to_name))?;
        }
        // Before any look at the share this rename makes (see [`super::racy`]).
        let second = self.share_second();
        let to = to_parent.join(to_name);
        let class = self.policy.classify(&from);
        if class != self.policy.classify(&to) {
            return Err(errno(libc::EXDEV));
        }
        if flags & !(libc::RENAME_NOREPLACE) != 0 {
            return Err(errno(libc::EINVAL));
        }
        match class {
            PathClass::Passthrough => self.rename_on_share(ctx, &from, &to, to_parent, flags),
            PathClass::LocalOnly => {
                let mut inner = self.lock_for(&[&from, &to]);
                self.ensure_upper_dir(&inner, to_parent, ctx)?;
                self.cache.rename(&up(&from), &up(&to), flags)?;
                inner.touched.insert(to);
                Ok(())
            }
            PathClass::Cached => self.rename_cached(ctx, from, to, to_parent, flags, second),
        }
    }

    /// A rename of passthrough paths: no overlay state, no lock held while the share
    /// answers; a target directory only the cache has is made on the share first.
    fn rename_on_share(
        &self,
        ctx: &Ctx,
        from: &Path,
        to: &Path,
        to_parent: &Path,
        flags: u32,
    ) -> FsResult<()> {
        match self.share.rename(from, to, flags) {
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR))
                    && !self.share.stat(to_parent)?.is_some_and(|m| m.is_dir())
                    && self.resolve(to_parent)?.layer == Layer::Upper =>
            {
                self.share_dirs_for(ctx, to_parent)?;
                self.share.rename(from, to, flags)?;
            }
            r => r?,
        }
        Ok(())
    }

    /// A rename of cached paths: the source copied up if the share has it, the target
    /// and what moves below it taken over and marked dirty before the cache changes
    /// (write-ahead), the old name hidden where the share (or a sync running) has it.
    fn rename_cached(
        &self,
        ctx: &Ctx,
        from: PathBuf,
        to: PathBuf,
        to_parent: &Path,
        flags: u32,
        second: i64,
    ) -> FsResult<()> {
        // What the share holds at both names, asked before the lock: the source (is there
        // a share copy to hide?), the target unless the cache took it over already.
        let look_from = self.look_before_lock(&from);
        let look_to = self.look_before_lock_unless(&to, |state| state.taken_over(&to));
        let names = [from.as_path(), to.as_path()];
        let mut inner = self.lock_for(&names);
        let src = self.resolve_looked(&inner, &from, look_from.clone())?;
        self.check_parent(&inner, to_parent)?;
        let dst = self.resolve_looked(&inner, &to, look_to.clone()).ok();
        if !Self::rename_changes_anything(&from, &to, &src, dst.as_ref(), flags)? {
            return Ok(());
        }
        // A directory replaces only an empty one (listed without the lock).
        if src.meta.is_dir() && dst.as_ref().is_some_and(|d| d.meta.is_dir()) {
            drop(inner);
            if !self.readdir(&to)?.is_empty() {
                return Err(errno(libc::ENOTEMPTY));
            }
            inner = self.lock_for(&names);
        }
        let src_on_share = self.lower_meta_looked(&inner, &from, look_from)?;
        if src.meta.is_dir() && src_on_share.as_ref().is_some_and(|m| m.is_dir()) {
            return Err(errno(libc::EXDEV));
        }
        if src.layer == Layer::Lower {
            inner = self.copy_up(inner, &names, &from, ctx)?;
        }
        self.ensure_upper_dir(&inner, to_parent, ctx)?;
        // A whiteout where the share has the source, or a sync running now may put it
        // there; from the look above (a copy-up changes neither the share nor what hides
        // it).
        let whiteout_from = src_on_share.is_some()
            || (self.sync_running.load(Ordering::Acquire) && inner.state.is_dirty(&from));
        let below = self.upper_below(&from)?;
        // A directory moved while a sync runs may be on its way to the share, with what
        // was below it: the old names stay hidden each on its own, so that a directory
        // made at the old name later does not show what the sync put below it (and the
        // next sync deletes them on the share). Without a sync running, a directory that
        // may move has nothing on the share (one that has is not moved here: EXDEV).
        let hidden_below: Vec<PathBuf> = if self.sync_running.load(Ordering::Acquire) {
            below
                .iter()
                .filter(|p| inner.state.is_dirty(p))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        // Everything the cache holds below a moved directory is new at its new name, also
        // what an earlier sync sent under the old one (a clean copy).
        let moved: Vec<PathBuf> = below
            .iter()
            .map(|m| crate::state::reroot(m, &from, &to))
            .collect();
        let (records, dirty) = self.rename_write_ahead(
            &inner,
            (&from, &to),
            dst.as_ref(),
            look_to,
            &moved,
            whiteout_from,
            &hidden_below,
            second,
        )?;
        // The records reach the disk, and the cache changes, without the lock.
        let flight = self.in_flight(&mut inner, vec![from.clone(), to.clone()], records)?;
        drop(inner);
        let flight = flight.durable()?;
        self.cache.rename(&up(&from), &up(&to), 0)?;
        let mut inner = self.lock_any();
        flight.end(&mut inner);
        let mut records = vec![Record::Rename {
            from: from.clone(),
            to: to.clone(),
        }];
        if whiteout_from {
            records.push(Record::Delete {
                path: from.clone(),
                whiteout: true,
            });
        }
        records.extend(hidden_below.into_iter().map(|path| Record::Delete {
            path,
            whiteout: true,
        }));
        records.extend(dirty);
        // On disk before the answer; the cache's rename may come first: a crash between
        // leaves the write-ahead records, which send the new name.
        let renamed = self.record_deferred(&mut inner, &records)?;
        inner.touched.insert(to);
        drop(inner);
        self.durable(renamed)
    }

    /// The checks of a rename from `from` (found as `src`) to `to` (found as `dst`) that
    /// need nothing but the two looks: false when it changes nothing (the same name, two
    /// names of one file: POSIX rename does nothing); an error for a directory moved
    /// below itself, a target that must not be replaced, or kinds that do not match.
    fn rename_changes_anything(
        from: &Path,
        to: &Path,
        src: &Found,
        dst: Option<&Found>,
        flags: u32,
    ) -> FsResult<bool> {
        if from == to {
            return Ok(false);
        }
        if let Some(d) = dst {
            if d.layer == src.layer
                && d.meta.dev() == src.meta.dev()
                && d.meta.ino() == src.meta.ino()
            {
                return Ok(false);
            }
        }
        if to.starts_with(from) {
            return Err(errno(libc::EINVAL));
        }
        if let Some(d) = dst {
            if flags & libc::RENAME_NOREPLACE != 0 {
                return Err(errno(libc::EEXIST));
            }
            match (src.meta.is_dir(), d.meta.is_dir()) {
                (true, false) => return Err(errno(libc::ENOTDIR)),
                (false, true) => return Err(errno(libc::EISDIR)),
                _ => {}
            }
        }
        Ok(true)
    }

    /// The records a cached rename writes ahead (take-overs of the target and of what
    /// moves below it, of the source where it is hidden; the dirty marks not yet on
    /// disk), and every dirty mark of the rename (for the records after it).
    #[allow(clippy::too_many_arguments)]
    fn rename_write_ahead(
        &self,
        inner: &Inner,
        (from, to): (&Path, &Path),
        dst: Option<&Found>,
        look_to: ShareLook,
        moved: &[PathBuf],
        whiteout_from: bool,
        hidden_below: &[PathBuf],
        second: i64,
    ) -> FsResult<(Vec<Record>, Vec<Record>)> {
        // Take-overs first: the target (what the user replaces there), and every path that
        // moves below it. The user saw nothing on the share below the target (it was
        // absent, or a directory shown empty): what the share holds there now another
        // workstation put there since, and the sync must find it a change (a conflict),
        // not the base our moved file replaces.
        let mut records: Vec<Record> = Vec::new();
        let seen_to = self.still_stands(look_to);
        records.extend(self.take_over_seen(
            inner,
            to,
            seen_to.as_ref().map(Option::as_ref),
            second,
        )?);
        if let Some(d) = dst.filter(|d| d.layer == Layer::Upper) {
            records.extend(self.other_names_changed(inner, to, &d.meta)?);
        }
        records.extend(self.take_over_moved(inner, moved));
        if whiteout_from {
            records.extend(self.take_over(inner, from)?);
        }
        for p in hidden_below {
            records.extend(self.take_over(inner, p)?);
        }
        // Write-ahead: the target and what moves below it are dirty before the cache
        // changes, so a crash in between leaves a journal that sends them. A target
        // already dirty (a config saved again) needs no new record, only the one that
        // made it so on disk.
        let dirty: Vec<Record> = std::iter::once(to.to_path_buf())
            .chain(moved.iter().cloned())
            .map(Record::Dirty)
            .collect();
        records.extend(
            dirty
                .iter()
                .filter(|r| !matches!(r, Record::Dirty(p) if inner.state.is_dirty(p)))
                .cloned(),
        );
        Ok((records, dirty))
    }

    /// The take-overs of the paths a directory renamed here moves below its new name
    /// (`moved`), where the user saw nothing on the share: the base of each is nothing,
    /// and so is that of the database a moved journal or WAL belongs to (beside it, so
    /// below the new name too; [`Overlay::database_base`] would ask the share now, and
    /// a later base record replaces an earlier one). Paths taken over already keep theirs.
    fn take_over_moved(&self, inner: &Inner, moved: &[PathBuf]) -> Vec<Record> {
        let mut named: HashSet<PathBuf> = HashSet::new();
        let mut out = Vec::new();
        for there in moved {
            let db = session::database_of(there)
                .map(|(db, _)| db)
                .filter(|db| self.policy.classify(db) == PathClass::Cached);
            for p in std::iter::once(there.clone()).chain(db) {
                if !inner.state.taken_over(&p) && named.insert(p.clone()) {
                    out.push(Record::Base(p, None));
                }
            }
        }
        out
    }
}
