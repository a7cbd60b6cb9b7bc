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

/// The largest file a sync takes a snapshot of (the copy is made under the overlay's
/// lock, and takes room in the cache).
pub const SNAPSHOT_MAX_LEN: u64 = 64 << 20;

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

    /// Whether the cache's `rel` holds the same bytes as its snapshot of this sync.
    pub(super) fn same_as_snapshot(&self, rel: &Path) -> bool {
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
        let (Ok(a), Ok(b)) = (
            self.cache.open_file(&up(rel), flags, 0),
            self.cache
                .open_file(&Path::new(SNAPSHOT_DIR).join(rel), flags, 0),
        ) else {
            return false;
        };
        let (mut a, mut b) = (io::BufReader::new(a), io::BufReader::new(b));
        loop {
            let (x, y) = match (io::BufRead::fill_buf(&mut a), io::BufRead::fill_buf(&mut b)) {
                (Ok(x), Ok(y)) => (x.to_vec(), y.to_vec()),
                _ => return false,
            };
            if x.is_empty() || y.is_empty() {
                return x.is_empty() && y.is_empty();
            }
            let n = x.len().min(y.len());
            if x[..n] != y[..n] {
                return false;
            }
            io::BufRead::consume(&mut a, n);
            io::BufRead::consume(&mut b, n);
        }
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
        let (dst, _) = self.fresh_copy(rel, &self.cache, &base.join(rel), true)?;
        sys::fstat(&dst)
    }
}
