//! Where a path is in the merged view: the cache, the share under a cached path, or the
//! share itself; the mount root answered while the share does not.

use super::*;

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
        match self.policy.classify(rel) {
            // No overlay state is involved: no lock held while the share answers.
            PathClass::Passthrough => self.resolve_share(rel),
            PathClass::LocalOnly => {
                let inner = self.lock_for(&[rel]);
                self.resolve_locked(&inner, rel)
            }
            PathClass::Cached => {
                // The cache's say: its object, or a deletion (then nothing).
                let said = |inner: &Inner| -> FsResult<Option<Found>> {
                    if let Some(meta) = self.upper_lookup(rel)? {
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
                        return Ok(found);
                    }
                    self.holds_now()
                };
                // Only on the share so far: ask it without holding the lock (other users
                // of the mount go on meanwhile), then check that the cache still has no
                // say (a copy-up or a delete may have happened meanwhile), unless nobody
                // took the lock since the look.
                let meta = self.share.stat(rel)?;
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
