//! Whether the share answers, as the daemon last learned it, shared by every access to it.
//!
//! A share whose server died answers ENOTCONN at once; one whose server hangs (stopped
//! bricks, a frozen NFS server) never answers, and every thread that asks waits in the
//! kernel. The daemon's share probe ([`crate::control::ShareProbe`]) closes the gate when
//! the share does not answer and opens it when it does again; while it is closed, an access
//! to the share fails at once with ENOTCONN instead of joining the wait, so the FUSE threads
//! stay free to serve what the cache holds. Each access also counts itself in flight, which
//! lets the daemon notice a hang without looking at the share on a timer.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The errno of an access refused while the share is known not to answer.
pub const SHARE_DOWN: i32 = libc::ENOTCONN;

#[derive(Debug, Default)]
pub struct ShareGate {
    closed: AtomicBool,
    in_flight: AtomicUsize,
    /// Milliseconds since [`epoch`] when an access last began or ended.
    last_progress: AtomicU64,
    /// One more than the milliseconds since [`epoch`] when an access last got an answer
    /// (not an outage error); 0: never.
    last_answer: AtomicU64,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// One access to the share in flight (see [`ShareGate::enter`]).
#[derive(Debug)]
pub struct InFlight<'a>(&'a ShareGate);

impl InFlight<'_> {
    /// The access ended with `result`: an answer (anything but an outage error) shows the
    /// share answers, and opens the gate at once (a request that waited through a hang
    /// goes on with its next access instead of finding the gate still closed).
    pub fn passed<T>(self, result: io::Result<T>) -> io::Result<T> {
        match &result {
            Err(e) if is_outage(e) => {}
            _ => {
                self.0
                    .last_answer
                    .store(now_ms().saturating_add(1), Ordering::Release);
                self.0.set_closed(false);
            }
        }
        result
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.last_progress.store(now_ms(), Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ShareGate {
    /// An access to the share begins: refused with [`SHARE_DOWN`] while the gate is
    /// closed, else counted until the guard is dropped.
    pub fn enter(&self) -> io::Result<InFlight<'_>> {
        if self.is_closed() {
            return Err(io::Error::from_raw_os_error(SHARE_DOWN));
        }
        if self.in_flight.fetch_add(1, Ordering::AcqRel) == 0 {
            self.last_progress.store(now_ms(), Ordering::Release);
        }
        Ok(InFlight(self))
    }

    /// Closes the gate (the share does not answer) or opens it again.
    pub fn set_closed(&self, closed: bool) {
        let was = self.closed.swap(closed, Ordering::AcqRel);
        if was != closed {
            if closed {
                tracing::warn!("the share does not answer: cached files are served, the rest fails with ENOTCONN");
            } else {
                tracing::info!("the share answers again");
            }
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// True when an access got an answer from the share at `t` or later.
    pub fn answered_since(&self, t: Instant) -> bool {
        let t = u64::try_from(t.saturating_duration_since(epoch()).as_millis()).unwrap_or(0);
        self.last_answer.load(Ordering::Acquire) > t
    }

    /// True when accesses are in flight and none began or ended for `quiet`: the share
    /// may hang (worth a look by the probe).
    pub fn stalled(&self, quiet: Duration) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
            && now_ms().saturating_sub(self.last_progress.load(Ordering::Acquire))
                >= u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX)
    }
}

/// True for an error that says the share (not the path asked for) is unavailable: its
/// server died, hangs up, or cannot be reached, or the gate is closed.
pub fn is_outage(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ENOTCONN
                | libc::EIO
                | libc::ETIMEDOUT
                | libc::EHOSTDOWN
                | libc::EHOSTUNREACH
                | libc::ENETDOWN
                | libc::ENETUNREACH
                | libc::ECONNREFUSED
                | libc::ECONNRESET
                | libc::ECONNABORTED
                | libc::ESHUTDOWN
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_gate_refuses_at_once_and_an_open_one_counts() {
        let g = ShareGate::default();
        let a = g.enter().expect("open");
        assert!(!g.stalled(Duration::from_secs(3600)));
        assert!(g.stalled(Duration::ZERO));
        drop(a);
        assert!(!g.stalled(Duration::ZERO), "nothing in flight");
        g.set_closed(true);
        let e = g.enter().expect_err("closed");
        assert_eq!(e.raw_os_error(), Some(SHARE_DOWN));
        assert!(is_outage(&e));
        g.set_closed(false);
        assert!(g.enter().is_ok());
        // An access that was in flight when the gate closed and then got an answer opens
        // it again; one that failed as the share does leaves it closed.
        let waiting = g.enter().expect("open");
        g.set_closed(true);
        let e = waiting.passed::<()>(Err(io::Error::from_raw_os_error(libc::EIO)));
        assert!(e.is_err() && g.is_closed());
        let waiting = {
            g.set_closed(false);
            let w = g.enter().expect("open");
            g.set_closed(true);
            w
        };
        let before = Instant::now();
        assert!(!g.answered_since(before));
        assert_eq!(waiting.passed(Ok(7)).ok(), Some(7));
        assert!(!g.is_closed());
        assert!(g.answered_since(before));
    }
}
