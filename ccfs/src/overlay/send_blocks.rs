//! A file held by block (`blocks.rs`) sent by its changed blocks, as rsync `--delay-updates`
//! would put it: a copy of the share's version (its base) made in the holding directory
//! rsync uses (`copy_file_range`: on a share that copies on the server, no byte crosses the
//! network), the blocks written here over it, its length, owner, mode, extended attributes
//! and mtime as the cache file's, on disk, then renamed over the share's file. A send cut
//! short leaves the share's file as it was (the holding directory is cleaned up as rsync's
//! is); a share whose file is no longer the base is not written (the sync's conflict check
//! keeps both versions).

use std::os::unix::fs::FileExt;

use super::*;
use crate::extents::BLOCK;
use crate::rsync::Put;

/// How much of the changed blocks is copied in one read and write.
const CHUNK: u64 = 1 << 20;

impl Overlay {
    /// Sends the file held by block at `rel` (see the module documentation); from its
    /// snapshot of this sync when `snapshot` gives the blocks changed when it was taken.
    /// Returns what was put on the share, as rsync's report would say it.
    pub fn send_blocks(
        &self,
        rel: &Path,
        snapshot: Option<&(crate::extents::Extents, u64)>,
    ) -> io::Result<Put> {
        let (mut partial, base) = {
            let inner = self.lock_for(&[rel]);
            match (inner.state.partial(rel), inner.state.base(rel)) {
                (Some(p), Some(b)) => (p.clone(), b),
                _ => return Err(io::Error::other("not held by block, or without a base")),
            }
        };
        let from = match snapshot {
            Some((changed, limit)) => {
                partial.changed = changed.clone();
                partial.limit = *limit;
                Path::new(super::snapshot::SNAPSHOT_DIR).join(rel)
            }
            None => up(rel),
        };
        let name = rel
            .file_name()
            .ok_or_else(|| io::Error::other("no file name"))?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        let src = self.cache.open_file(
            &from,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            0,
        )?;
        let ours = sys::fstat(&src)?;
        if !ours.is_file() {
            return Err(io::Error::other("no longer a regular file"));
        }
        let theirs =
            self.share
                .open_file(rel, libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK, 0)?;
        let share_meta = sys::fstat(&theirs)?;
        if session::share_id_of(&share_meta) != base {
            return Err(io::Error::other(
                "the share's file is no longer the version its blocks were taken from",
            ));
        }
        let holding = self.holding_dir(parent)?;
        let tmp = holding.join(name);
        let sent = (|| -> io::Result<()> {
            match self.share.unlink(&tmp) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let dst = self.share.open_file(
                &tmp,
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                0o600,
            )?;
            // The base, copied on the share's side where it can.
            let kept = partial.limit.min(share_meta.len());
            sys::copy_data(&theirs, &dst, kept)?;
            // Past the limit, the file is the cache's: zeros where it wrote nothing.
            dst.set_len(kept)?;
            dst.set_len(ours.len())?;
            // Past the limit, every byte is the cache's (written or not: a crash may have
            // cut a write there from its record, and the file shows it).
            copy_blocks(&src, &dst, &partial.changed, ours.len())?;
            // (Its data only: `dst` reads zeros in its holes already, and a file grown
            // far past its limit is sent as what its data costs.)
            for (from, to) in sys::data_extents(&src, partial.limit, ours.len())? {
                copy_range(&src, &dst, from, to)?;
            }
            for name in self.cache.listxattr(&from).unwrap_or_default() {
                if let Ok(value) = self.cache.getxattr(&from, &name) {
                    // One the filesystem takes from the owner (user.*, ACLs); others
                    // stay behind as rsync would leave them.
                    let _ = self.share.setxattr(&tmp, &name, &value, 0);
                }
            }
            if self.as_root {
                self.share.fchown(&dst, ours.uid(), ours.gid())?;
            }
            self.share.chmod(&tmp, ours.mode() & 0o7777)?;
            let (secs, nsecs) = ours.mtime();
            sys::futimens(&dst, sys::SetTime::Omit, sys::SetTime::At { secs, nsecs })?;
            dst.sync_all()?;
            #[cfg(test)]
            crash_tests::at_crash_point(self);
            self.share.rename(&tmp, rel, 0)
        })();
        if sent.is_err() {
            let _ = self.share.unlink(&tmp);
        }
        let _ = self.share.rmdir(&holding);
        sent?;
        tracing::debug!(
            path = %session::shown(rel),
            changed_blocks = partial.changed.count(),
            "sent by its changed blocks"
        );
        Ok(Put::File(ours.mtime().0))
    }
}

/// Copies the blocks `changed` of `src` to `dst` (up to `len`).
fn copy_blocks(
    src: &File,
    dst: &File,
    changed: &crate::extents::Extents,
    len: u64,
) -> io::Result<()> {
    for (s, e) in changed.iter() {
        copy_range(src, dst, s * BLOCK, (e * BLOCK).min(len))?;
    }
    Ok(())
}

/// Copies the bytes `[from, end)` of `src` (zeros past its end) to `dst`.
fn copy_range(src: &File, dst: &File, from: u64, end: u64) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK as usize];
    let mut at = from;
    while at < end {
        let n = (end - at).min(CHUNK) as usize;
        let mut got = 0;
        while got < n {
            match src.read_at(&mut buf[got..n], at + got as u64)? {
                0 => {
                    buf[got..n].fill(0);
                    got = n;
                }
                k => got += k,
            }
        }
        dst.write_all_at(&buf[..n], at)?;
        at += n as u64;
    }
    Ok(())
}
