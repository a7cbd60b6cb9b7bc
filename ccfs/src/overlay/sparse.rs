//! Sparse files sent by the sync itself. rsync reads every byte of a file it sends, holes
//! included (`--sparse` only keeps them holes on the share): a 15 TiB file of holes (`truncate
//! -s 15T ~/.big`) costs a read of 15 TiB, at every sync and at root's recovery of every
//! cache at boot. A file whose holes are most of it is sent here instead, as rsync would
//! put it (a new file beside the old, renamed over it, with the cache copy's mode, owner
//! and mtime), copying its data extents alone: it costs what its data costs.

use super::*;
use crate::rsync::{Put, PARTIAL_DIR};

/// Below this length a file goes to rsync whatever its holes.
pub const SPARSE_MIN_LEN: u64 = 64 << 20;

impl Overlay {
    /// Whether the sync sends the cache's `rel` itself (see the module documentation): a
    /// regular file of one name, at least [`SPARSE_MIN_LEN`] long, with less than an
    /// eighth of its length in blocks, and no extended attributes (ACLs included), which
    /// rsync carries.
    /// `m`: the cache file's attributes, as the sync took them.
    pub(super) fn sent_as_sparse(&self, rel: &Path, m: &Stat) -> bool {
        m.is_file()
            && m.nlink() == 1
            && m.len() >= SPARSE_MIN_LEN
            && m.blocks().saturating_mul(512).saturating_mul(8) < m.len()
            && self
                .cache
                .listxattr(&up(rel))
                .is_ok_and(|names| names.is_empty())
    }

    /// Sends the cache's `rel` to the share (see the module documentation): its data
    /// extents are copied into the holding directory of its directory on the share (the
    /// one rsync uses, so an interrupted send is cleaned up as rsync's are), given the
    /// copy's mode, owner (when root) and mtime, written to disk, and renamed over the
    /// share's file. Returns what was put there, as rsync's report would say it.
    pub fn send_sparse(&self, rel: &Path) -> io::Result<Put> {
        let name = rel
            .file_name()
            .ok_or_else(|| io::Error::other("no file name"))?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        let holding = self.holding_dir(parent)?;
        let tmp = holding.join(name);
        let sent = (|| -> io::Result<Stat> {
            let (dst, meta) = self.fresh_copy(rel, &self.share, &tmp, false)?;
            dst.sync_all()?;
            self.share.rename(&tmp, rel, 0)?;
            Ok(meta)
        })();
        if sent.is_err() {
            let _ = self.share.unlink(&tmp);
        }
        let _ = self.share.rmdir(&holding);
        Ok(Put::File(sent?.mtime().0))
    }

    /// The holding directory rsync uses in `parent` on the share, made if missing: a file
    /// the sync sends itself is made there and renamed into place.
    pub(super) fn holding_dir(&self, parent: &Path) -> io::Result<PathBuf> {
        let holding = parent.join(PARTIAL_DIR);
        match self.share.mkdir(&holding, 0o700) {
            Ok(()) => Ok(holding),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(holding),
            Err(e) => Err(e),
        }
    }

    /// The cache's regular file `rel`, opened for reading to be sent (a link is not
    /// followed, a FIFO does not block), with its attributes.
    pub(super) fn cache_file_to_send(&self, rel: &Path) -> io::Result<(File, Stat)> {
        let src = self.cache.open_file(
            &up(rel),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            0,
        )?;
        let meta = sys::fstat(&src)?;
        if !meta.is_file() {
            return Err(io::Error::other("no longer a regular file"));
        }
        Ok((src, meta))
    }

    /// A new file at `dst_rel` in `root` (whatever was at that name goes) with the data
    /// (holes kept), extended attributes (`xattrs`; those the owner may set), mode, owner
    /// (when root) and mtime of the cache's regular file `rel`, opened without following
    /// a link and without blocking. Returns the copy, open for writing, and the attributes
    /// of the cache's file it was made from.
    pub(super) fn fresh_copy(
        &self,
        rel: &Path,
        root: &Root,
        dst_rel: &Path,
        xattrs: bool,
    ) -> io::Result<(File, Stat)> {
        let (src, meta) = self.cache_file_to_send(rel)?;
        match root.unlink(dst_rel) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let dst = root.open_file(
            dst_rel,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            0o600,
        )?;
        sys::copy_data(&src, &dst, meta.len())?;
        if xattrs {
            for name in self.cache.listxattr(&up(rel)).unwrap_or_default() {
                if let Ok(value) = self.cache.getxattr(&up(rel), &name) {
                    // One the filesystem takes from the owner (user.*, ACLs); others
                    // (security.*) stay behind as rsync would leave them.
                    let _ = root.setxattr(dst_rel, &name, &value, 0);
                }
            }
        }
        if self.as_root {
            root.fchown(&dst, meta.uid(), meta.gid())?;
        }
        root.chmod(dst_rel, meta.mode() & 0o7777)?;
        let (secs, nsecs) = meta.mtime();
        sys::futimens(&dst, sys::SetTime::Omit, sys::SetTime::At { secs, nsecs })?;
        Ok((dst, meta))
    }
}
