//! Files held by block made complete in the background: the blocks a cache file lacks are
//! copied from the share's version it was taken from, a few at a time, once the daemon has
//! served the file for a while (the login's own reads come first). A complete file needs
//! its base no more: a save elsewhere, or a write in place on the share, after that is an
//! ordinary conflict (both versions whole on the share), not blocks kept in the cache. It
//! stays held by block: its changed blocks are what a sync sends.
//!
//! Only files with blocks written here (a change of attributes alone reads nothing from
//! the share), and only where the cache's disk has room to spare: a file is filled when
//! what it lacks takes at most half of the free room and leaves a tenth of the disk free
//! (the user's own writes come first); a disk found full stops the fill of that file.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::*;

/// The most blocks one call copies for a file while it holds the file's I/O (a program's
/// reads and writes of it wait that long).
const CHUNK: u64 = 64;

impl Overlay {
    /// Copies up to `budget` blocks in all that files held by block lack, of the files
    /// with blocks written here (those at risk if the share's version changes) that the
    /// daemon has served for at least `after`; the number copied. A file whose base cannot
    /// be read (changed on the share, or the share does not answer) is passed over, and
    /// one the cache's disk has no room for is not started.
    pub fn fill_blocks(&self, budget: u64, after: Duration) -> u64 {
        let files: Vec<Arc<BlockFile>> = self
            .block_files
            .locked()
            .values()
            .filter(|bf| {
                bf.since.elapsed() >= after
                    && bf.is_partial()
                    && !bf.fill_stopped.load(Ordering::Relaxed)
            })
            .cloned()
            .collect();
        let mut done = 0;
        for bf in files {
            if done >= budget {
                break;
            }
            let (lacking, written_now) = bf.missing();
            if lacking == 0 || !self.room_for(lacking) {
                continue;
            }
            // The cache file opened while the path is still this file's (not removed,
            // renamed or replaced since): the blocks go into its own inode.
            let cache = {
                let inner = self.lock_for(&[bf.path()]);
                let written = written_now
                    || inner
                        .state
                        .partial(bf.path())
                        .is_some_and(|p| !p.changed.is_empty());
                if !written {
                    continue;
                }
                let current = self
                    .block_files
                    .locked()
                    .get(bf.path())
                    .is_some_and(|b| Arc::ptr_eq(b, &bf));
                if !current {
                    continue;
                }
                match self.cache.open_file(
                    &up(bf.path()),
                    libc::O_RDWR | libc::O_NOFOLLOW | libc::O_NONBLOCK,
                    0,
                ) {
                    Ok(f) => f,
                    Err(_) => continue,
                }
            };
            // (A step that copied nothing still counts: the budget bounds the work.)
            while done < budget {
                let step = bf.fill_step(&self.share, &cache, (budget - done).min(CHUNK), || {
                    self.lock_any()
                });
                match step {
                    Ok(None) => break,
                    Ok(Some(n)) => done += n.max(1),
                    Err(e) => {
                        if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
                            bf.fill_stopped.store(true, Ordering::Relaxed);
                        }
                        tracing::debug!(
                            path = %session::shown(bf.path()),
                            "its missing blocks cannot be copied now: {e}"
                        );
                        break;
                    }
                }
            }
            if let Err(e) = self.record_blocks(&bf, &cache) {
                tracing::warn!(
                    path = %session::shown(bf.path()),
                    "the blocks copied from its base could not be journaled: {e}"
                );
            }
        }
        done
    }

    /// How many files are held by block, the bytes of the blocks they lack below their
    /// limits, as the journal has them, and of those the bytes the background fill is to
    /// copy (files it serves with blocks written here, not stopped by a full disk, where
    /// the cache's disk has room for them).
    pub fn held_by_block_now(&self) -> (usize, u64, u64) {
        let parts: Vec<(PathBuf, u64, bool)> = {
            let inner = self.lock_any();
            inner
                .state
                .partials()
                .map(|(p, part)| (p.clone(), part.lacking(), !part.changed.is_empty()))
                .collect()
        };
        // The files the fill works on: those the daemon serves, not stopped.
        let filled: HashSet<PathBuf> = self
            .block_files
            .locked()
            .values()
            .filter(|bf| !bf.fill_stopped.load(Ordering::Relaxed))
            .map(|bf| bf.path().to_path_buf())
            .collect();
        let lacking: u64 = parts.iter().map(|(_, l, _)| l).sum();
        let to_fill: u64 = parts
            .iter()
            .filter(|(p, l, written)| {
                *written && *l > 0 && filled.contains(p) && self.room_for(l * crate::extents::BLOCK)
            })
            .map(|(_, l, _)| l)
            .sum();
        let block = crate::extents::BLOCK;
        (parts.len(), lacking * block, to_fill * block)
    }

    /// Whether the cache's disk has room to spare for `bytes` more: at most half of its
    /// free room, leaving a tenth of the disk free.
    fn room_for(&self, bytes: u64) -> bool {
        match self.cache.space() {
            Ok((free, total)) => bytes <= free / 2 && free - bytes >= total / 10,
            Err(_) => false,
        }
    }
}
