//! Directory listings: the merged listing of a directory and what tells that it changed.

use super::*;

impl Overlay {
    /// The merged listing of a directory (without `.` and `..`). The share is listed
    /// without the overlay's lock held (a slow or hung share holds up this request only).
    /// A cached directory lists what the cache holds while the share does not answer; a
    /// passthrough one fails as the share does.
    pub fn readdir(&self, rel: &Path) -> FsResult<Vec<DirEntry>> {
        let class = self.policy.classify(rel);
        let dir = self.resolve(rel)?;
        if !dir.meta.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        let share_visible = match class {
            PathClass::LocalOnly => false,
            PathClass::Passthrough => true,
            PathClass::Cached => !self.lock_for(&[rel]).state.hidden(rel),
        };
        // Whether the share's listing was read (not while it does not answer).
        let mut share_listed = share_visible;
        let share_names = if share_visible {
            match self.list_share(rel) {
                Ok(names) => names,
                Err(e) if class == PathClass::Cached && gate::is_outage(&e) => {
                    share_listed = false;
                    Vec::new()
                }
                Err(e) => return Err(e.into()),
            }
        } else {
            Vec::new()
        };
        let merge_cache = class != PathClass::Passthrough || rel.as_os_str().is_empty();
        let on_share: HashSet<OsString> = if share_listed && merge_cache {
            share_names.iter().map(|(n, _)| n.clone()).collect()
        } else {
            HashSet::new()
        };
        // Names that may be rsync's temporary files of files a running sync handed it
        // (`.NAME.XXXXXX`, a regular file of mode 0600 on the share): looked at on the share
        // before the lock is taken to list; none when no sync runs.
        let rsync_temps: HashSet<OsString> = if class == PathClass::Cached {
            self.rsync_temps_in(rel, &share_names)
        } else {
            HashSet::new()
        };
        let above = self.policy.ancestry(rel);
        let inner = self.lock_for(&[rel]);
        let visible = share_names.into_iter().filter(|(name, _)| {
            let child = rel.join(name);
            match self.policy.classify_child(&above, &child) {
                PathClass::LocalOnly => false,
                PathClass::Cached => {
                    !(inner.state.hidden(&child)
                        || sync_holds(&inner, &child, rsync_temps.contains(name)))
                }
                PathClass::Passthrough => true,
            }
        });
        if !merge_cache {
            // The share's listing alone: its names are unique already.
            return Ok(visible
                .map(|(name, file_type)| DirEntry { name, file_type })
                .collect());
        }
        let mut names: BTreeMap<OsString, DirEntry> = visible
            .map(|(name, file_type)| (name.clone(), DirEntry { name, file_type }))
            .collect();
        // Clean copies of files the share no longer lists (another workstation removed
        // or renamed them): looked at once the lock is let go, which lets them go.
        let mut gone_there = Vec::new();
        if self.upper_stat(rel)?.is_some_and(|m| m.is_dir()) {
            for (name, _, kind) in self.cache.read_dir(&up(rel))? {
                let child = rel.join(&name);
                if self.policy.classify(&child) == PathClass::Passthrough {
                    continue; // the share is authoritative for passthrough names
                }
                if share_listed
                    && self.policy.classify(&child) == PathClass::Cached
                    && !on_share.contains(&name)
                    && !inner.state.has_work_below(&child)
                {
                    gone_there.push(name.clone());
                }
                let kind = if kind == 0 {
                    match self.upper_stat(&child)? {
                        Some(meta) => meta.file_type(),
                        None => continue,
                    }
                } else {
                    kind
                };
                names.insert(
                    name.clone(),
                    DirEntry {
                        name,
                        file_type: kind,
                    },
                );
            }
        }
        drop(inner);
        for name in gone_there {
            if self
                .recheck(&rel.join(&name))
                .is_err_and(|e| e.errno() == libc::ENOENT)
            {
                names.remove(&name);
            }
        }
        Ok(names.into_values().collect())
    }

    /// The names of `share_names` (the share's listing of `rel`) that are rsync's
    /// temporary files of files a running sync handed it: `.NAME.XXXXXX`, a regular
    /// file of mode 0600 on the share, looked at there without the lock.
    fn rsync_temps_in(&self, rel: &Path, share_names: &[(OsString, u32)]) -> HashSet<OsString> {
        let candidates: Vec<&OsString> = {
            let inner = self.lock_any();
            share_names
                .iter()
                .filter(|(name, kind)| {
                    *kind == libc::S_IFREG
                        && !inner.handed.is_empty()
                        && rsync_temp_of(&rel.join(name))
                            .is_some_and(|of| inner.handed.contains(&of))
                })
                .map(|(name, _)| name)
                .collect()
        };
        candidates
            .into_iter()
            .filter(|name| {
                matches!(self.share.stat(&rel.join(name)),
                    Ok(Some(m)) if m.is_file() && m.mode() & 0o7777 == 0o600)
            })
            .cloned()
            .collect()
    }

    /// What tells whether directory `rel`'s listing changed: the attributes of its cache
    /// copy and of the share's directory that [`Overlay::readdir`] would list (object,
    /// size, modification and change times). Equal signatures, same listing, unless
    /// the change came through this mount (which the kernel sees for itself).
    pub fn dir_signature(&self, rel: &Path) -> FsResult<DirSignature> {
        let class = self.policy.classify(rel);
        let upper = match class {
            PathClass::Passthrough if !rel.as_os_str().is_empty() => None,
            _ => self.upper_stat(rel)?.map(|m| m.version()),
        };
        let share_visible = match class {
            PathClass::LocalOnly => false,
            PathClass::Passthrough => true,
            PathClass::Cached => !self.lock_for(&[rel]).state.hidden(rel),
        };
        let share = if share_visible {
            self.share.stat(rel)?.map(|m| m.version())
        } else {
            None
        };
        Ok(DirSignature { upper, share })
    }

    /// The share's entries of directory `rel` with their file types; none when it has no
    /// directory there.
    pub(super) fn list_share(&self, rel: &Path) -> io::Result<Vec<(OsString, u32)>> {
        let entries = match self.share.read_dir(rel) {
            Ok(e) => e,
            // (ELOOP: a symbolic link on the way, which ccfs never follows.)
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
                ) =>
            {
                return Ok(Vec::new())
            }
            Err(e) => return Err(e),
        };
        let mut out = Vec::with_capacity(entries.len());
        for (name, _, kind) in entries {
            let kind = if kind == 0 {
                self.share
                    .stat(&rel.join(&name))?
                    .map(|m| m.file_type())
                    .unwrap_or(libc::S_IFREG)
            } else {
                kind
            };
            out.push((name, kind));
        }
        Ok(out)
    }
}
