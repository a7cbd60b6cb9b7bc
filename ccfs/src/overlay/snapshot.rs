//! Snapshots of files that are being written while a sync sends them. rsync reads a file
//! twice (for its checksums, then to send it) and discards a transfer whose bytes changed
//! in between ("failed verification -- update discarded"): a file a program keeps writing
//! (a database, a log, a file mapped shared) was never sent by a periodic sync, and the
//! session's work on it waited for the logout. A file open for writing when the sync takes
//! it is copied first, in the cache (`work/sync-snapshot/`, the same filesystem, where
//! `copy_file_range` shares the blocks if the filesystem can), and rsync sends the copy:
//! a version the file had, which lands whole. The file stays dirty (it is still being
//! written), and the next sync sends what came after.

use super::*;

/// Where the snapshots of one sync live, below the cache directory.
pub(super) const SNAPSHOT_DIR: &str = "work/sync-snapshot";

impl Overlay {
    /// The directory rsync sends the snapshots from (absolute; paths below it are the
    /// mount's).
    pub fn snapshot_root(&self) -> PathBuf {
        self.upper_abs
            .parent()
            .map(|c| c.join(SNAPSHOT_DIR))
            .unwrap_or_else(|| PathBuf::from(SNAPSHOT_DIR))
    }

    /// Removes the snapshots of the last sync (what a crash left too).
    pub fn drop_snapshots(&self) {
        let _ = remove_tree(&self.cache, Path::new(SNAPSHOT_DIR));
    }

    /// Copies the cache's `rel` to the snapshot tree with its mode, owner (when root),
    /// mtime and extended attributes, and returns the copy's attributes. The directories
    /// above it are made with the modes of the cache's (and made writable by their owner
    /// while the sync lasts: rsync only reads them).
    pub(super) fn snapshot(&self, rel: &Path) -> io::Result<Stat> {
        let base = Path::new(SNAPSHOT_DIR);
        match self.cache.mkdir(base, 0o700) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let mut dir = base.to_path_buf();
        if let Some(parent) = rel.parent() {
            let mut up_dir = PathBuf::new();
            for c in parent.components() {
                dir.push(c);
                up_dir.push(c);
                let mode = self
                    .upper_stat(&up_dir)?
                    .map_or(0o700, |m| m.mode() & 0o7777)
                    | 0o700;
                match self.cache.mkdir(&dir, mode) {
                    Ok(()) => self.cache.chmod(&dir, mode)?,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let dst_rel = base.join(rel);
        let src = self.cache.open_file(
            &up(rel),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            0,
        )?;
        let meta = sys::fstat(&src)?;
        if !meta.is_file() {
            return Err(io::Error::other("no longer a regular file"));
        }
        match self.cache.unlink(&dst_rel) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let dst = self.cache.open_file(
            &dst_rel,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            0o600,
        )?;
        sys::copy_data(&src, &dst, meta.len())?;
        for name in self.cache.listxattr(&up(rel)).unwrap_or_default() {
            if let Ok(value) = self.cache.getxattr(&up(rel), &name) {
                // One the cache's filesystem takes from the owner (user.*, ACLs); others
                // (security.*) stay behind as rsync would leave them.
                let _ = self.cache.setxattr(&dst_rel, &name, &value, 0);
            }
        }
        if self.as_root {
            self.cache.fchown(&dst, meta.uid(), meta.gid())?;
        }
        self.cache.chmod(&dst_rel, meta.mode() & 0o7777)?;
        let (secs, nsecs) = meta.mtime();
        sys::futimens(&dst, sys::SetTime::Omit, sys::SetTime::At { secs, nsecs })?;
        sys::fstat(&dst)
    }
}
