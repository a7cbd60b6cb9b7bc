//! FUSE over io_uring for a mount whose `[mount] transport` asks for it: offered at INIT
//! when the kernel allows it, and served by fuse-ring's threads with the same handlers as
//! /dev/fuse. Whatever refuses it, the mount goes on through /dev/fuse and says why.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fuser::KernelConfig;
use serde::{Deserialize, Serialize};

use super::{CcfsFs, Served};
use crate::locks::Locked;

/// The largest write the kernel sends in one request when the ring is offered: each ring
/// entry has a buffer this big (and 256 pages, the kernel's default limit, are as much).
const RING_MAX_WRITE: u32 = 1 << 20;
/// Pages a request may carry (the kernel's default `max_pages_limit`).
const RING_MAX_PAGES: u32 = 256;

/// How requests travel now, for `ccfs status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportState {
    /// `dev-fuse` or `io-uring`: what serves the requests.
    pub serving: String,
    /// Requests served over the ring since the mount.
    #[serde(default)]
    pub ring_requests: u64,
    /// Why the ring was asked for and is not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

enum State {
    /// Not asked for (`transport = "dev-fuse"`).
    Off,
    /// Asked for, with this many threads on each of the kernel's queues, until INIT.
    Wanted(usize),
    /// Offered at INIT, to be started once the session is up.
    Offered(fuse_ring::RingOptions),
    Serving(fuse_ring::Ring),
    Refused(String),
}

/// The ring of one mount, from the ask to the end of the session.
pub struct RingSlot {
    state: Mutex<State>,
    /// The uid fuser's session lets in alone, when it lets in only its owner: the ring
    /// refuses the others as fuser does (root, where the fuse module lets CAP_SYS_ADMIN
    /// into every mount, would otherwise be served).
    owner_only: std::sync::OnceLock<Option<u32>>,
}

impl std::fmt::Debug for RingSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RingSlot({:?})", self.transport())
    }
}

impl RingSlot {
    pub fn off() -> Self {
        RingSlot {
            state: Mutex::new(State::Off),
            owner_only: std::sync::OnceLock::new(),
        }
    }

    /// Asks for the ring, served with `threads_per_queue` threads on each of the kernel's
    /// queues (one per CPU). Call before the session's INIT.
    pub fn want(&self, threads_per_queue: usize) {
        self.set(State::Wanted(threads_per_queue.max(1)));
    }

    /// Lets in only `owner` over the ring (fuser's session with `SessionACL::Owner`), or
    /// anyone the kernel lets in (None).
    pub fn admit_only(&self, owner: Option<u32>) {
        let _ = self.owner_only.set(owner);
    }

    /// Whether the ring serves request `op` (a handler's name) from `uid`: as fuser's
    /// session does, a session for its owner alone answers others only the requests the
    /// kernel makes on its own behalf (reads, writes, syncs and releases of open handles).
    pub(super) fn admits(&self, op: &str, uid: u32) -> bool {
        match self.owner_only.get() {
            Some(Some(owner)) if *owner != uid => matches!(
                op,
                "read"
                    | "readdir"
                    | "readdirplus"
                    | "write"
                    | "fsync"
                    | "fsyncdir"
                    | "release"
                    | "releasedir"
            ),
            // Not told who owns the session: nobody is served but through /dev/fuse.
            None => false,
            _ => true,
        }
    }

    /// Once the session is up (its INIT answered): registers the ring's entries on the
    /// connection behind `dev` (a duplicate of the session's /dev/fuse) when INIT offered
    /// it, and serves them with `fs`. The kernel holds requests from INIT until this ends
    /// either way (ready, or a refused registration that sends them to /dev/fuse).
    /// An error when the ring was refused and the kernel could not be told to stop
    /// waiting for it: the session must end (the mount would hang).
    pub fn start(&self, fs: &Arc<CcfsFs>, dev: OwnedFd) -> std::io::Result<()> {
        let state = std::mem::replace(&mut *self.state.locked(), State::Off);
        let State::Offered(opts) = state else {
            self.set(state);
            return Ok(());
        };
        match fuse_ring::start(dev, Arc::new(Served(fs.clone())), opts) {
            Ok(ring) => {
                tracing::info!(
                    queues = ring.queues(),
                    threads = ring.threads(),
                    "requests go through FUSE over io_uring"
                );
                self.set(State::Serving(ring));
            }
            Err(e) if e.stranded() => {
                self.refuse(e.to_string());
                return Err(std::io::Error::other(format!("FUSE over io_uring: {e}")));
            }
            Err(e) => self.refuse(e.to_string()),
        }
        Ok(())
    }

    fn set(&self, state: State) {
        *self.state.locked() = state;
    }

    /// Not to be used for this mount: said in the log and in `ccfs status`.
    pub fn decline(&self, why: String) {
        self.refuse(why);
    }

    fn refuse(&self, why: String) {
        tracing::warn!("FUSE over io_uring is not used: {why}; requests go through /dev/fuse");
        self.set(State::Refused(why));
    }

    /// How requests travel now.
    pub fn transport(&self) -> TransportState {
        let (serving, ring_requests, refused) = match &*self.state.locked() {
            State::Off | State::Wanted(_) | State::Offered(_) => ("dev-fuse", 0, None),
            State::Serving(ring) => ("io-uring", ring.served(), None),
            State::Refused(why) => ("dev-fuse", 0, Some(why.clone())),
        };
        TransportState {
            serving: serving.to_string(),
            ring_requests,
            refused,
        }
    }

    /// Waits for the ring's threads (they end with the session).
    pub fn finish(&self) {
        let state = std::mem::replace(&mut *self.state.locked(), State::Off);
        if let State::Serving(ring) = state {
            ring.join();
        }
    }
}

/// At INIT: offers FUSE_OVER_IO_URING when the ring was asked for and the kernel allows
/// it (the ring is started once the session is up, [`RingSlot::start`]). Nothing is offered
/// when anything is missing: once offered, the kernel holds requests until the ring is
/// ready or a registration was refused.
pub(super) fn offer(fs: &CcfsFs, config: &mut KernelConfig) {
    use fuser::InitFlags as F;
    let slot = &fs.ring;
    let state = std::mem::replace(&mut *slot.state.locked(), State::Off);
    let State::Wanted(per_queue) = state else {
        slot.set(state);
        return;
    };
    // The module's switch first: a kernel with it off does not offer the capability.
    if let Err(e) = fuse_ring::probe() {
        return slot.refuse(e.to_string());
    }
    if !config.capabilities().contains(F::FUSE_OVER_IO_URING) {
        return slot.refuse("the kernel does not offer it (Linux 6.14 or later has it)".into());
    }
    if config.set_max_write(RING_MAX_WRITE).is_err() {
        return slot.refuse("the session refused a 1 MiB max_write".into());
    }
    if config.add_capabilities(F::FUSE_OVER_IO_URING).is_err() {
        return slot.refuse("the session refused the capability".into());
    }
    slot.set(State::Offered(fuse_ring::RingOptions {
        threads_per_queue: per_queue,
        max_write: RING_MAX_WRITE,
        max_pages: RING_MAX_PAGES,
        register_timeout: Duration::from_secs(10),
    }));
}
