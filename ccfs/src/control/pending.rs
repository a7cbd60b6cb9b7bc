//! Pending changes, counted on a helper thread without blocking the control socket.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::overlay::Overlay;

use super::*;

/// (dirty paths, dirty bytes, pending deletions) and the unix time they were counted.
pub(super) type Counts = ((usize, u64, usize), u64);

/// Counts pending changes with `Overlay::pending` on a helper thread: it takes the
/// filesystem's lock, which a request waiting on a hung share may hold. When the count
/// does not come in time, the last one is used (and said to be old).
#[derive(Debug)]
pub(super) struct PendingCounter {
    overlay: Arc<Overlay>,
    /// Lock order: 18 (ARCHITECTURE.md, Locks), a leaf.
    last: Arc<Mutex<Counts>>,
    counting: Arc<AtomicBool>,
}

impl PendingCounter {
    pub(super) fn new(overlay: Arc<Overlay>) -> Self {
        let first = (overlay.pending(), unix_now());
        Self {
            overlay,
            last: Arc::new(Mutex::new(first)),
            counting: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The counts, and the unix time they are from when they are not fresh.
    pub(super) fn get(&self) -> ((usize, u64, usize), Option<u64>) {
        let (tx, rx) = std::sync::mpsc::channel();
        if !self.counting.swap(true, Ordering::AcqRel) {
            let (overlay, last, counting) = (
                self.overlay.clone(),
                self.last.clone(),
                self.counting.clone(),
            );
            let spawned = std::thread::Builder::new()
                .name("ccfs-count".into())
                .spawn(move || {
                    let counts = overlay.pending();
                    *last.locked() = (counts, unix_now());
                    counting.store(false, Ordering::Release);
                    let _ = tx.send(counts);
                });
            if spawned.is_err() {
                self.counting.store(false, Ordering::Release);
            }
        }
        if let Ok(counts) = rx.recv_timeout(COUNT_TIMEOUT) {
            return (counts, None);
        }
        let (counts, at) = *self.last.locked();
        let old = unix_now().saturating_sub(at) > COUNT_TIMEOUT.as_secs();
        (counts, old.then_some(at))
    }
}
