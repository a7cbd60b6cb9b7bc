//! Files held by block made complete in the background: the blocks a cache file lacks are
//! copied from the share's version it was taken from, a few at a time, once the daemon has
//! served the file for a while (the login's own reads come first). A complete file needs
//! its base no more: a save elsewhere, or a write in place on the share, after that is an
//! ordinary conflict (both versions whole on the share), not blocks kept in the cache. It
//! stays held by block: its changed blocks are what a sync sends.

use std::sync::Arc;
use std::time::Duration;

use super::*;

/// The most blocks one call copies for a file while it holds the file's I/O (a program's
/// reads and writes of it wait that long).
const CHUNK: u64 = 64;

impl Overlay {
    /// Copies up to `budget` blocks in all that files held by block lack, of the changed
    /// files (those at risk if the share's version changes) the daemon has served for at
    /// least `after`; the number copied. A file whose base cannot be read (changed on the
    /// share, or the share does not answer) is passed over.
    pub fn fill_blocks(&self, budget: u64, after: Duration) -> u64 {
        let files: Vec<Arc<BlockFile>> = self
            .block_files
            .locked()
            .values()
            .filter(|bf| bf.since.elapsed() >= after && bf.is_partial())
            .cloned()
            .collect();
        let mut done = 0;
        for bf in files {
            if done >= budget {
                break;
            }
            // The cache file opened while the path is still this file's (not removed,
            // renamed or replaced since): the blocks go into its own inode.
            let cache = {
                let inner = self.lock_for(&[bf.path()]);
                if !inner.state.is_dirty(bf.path()) {
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
}
