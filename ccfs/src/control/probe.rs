//! The share probe: whether the share answers, looked at on a thread of its own so that a
//! hung share holds up no caller.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::gate::ShareGate;

use super::*;

/// Looks at the share (stat and statfs of its root) on a thread of its own, so a share
/// that hangs holds up that thread only; callers wait at most [`PROBE_TIMEOUT`] for an
/// answer. One look runs at a time: while one hangs, callers learn "not answering since"
/// at once, without starting more.
#[derive(Debug)]
pub struct ShareProbe {
    share: PathBuf,
    timeout: Duration,
    /// Closed while the share does not answer, opened when it does again.
    gate: Arc<ShareGate>,
    /// Lock order: 17 (ARCHITECTURE.md, Locks), a leaf: the look runs without it.
    state: Mutex<ProbeState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
pub(super) struct ProbeState {
    /// The number of the newest look asked for; `started`/`finished`: of the newest look
    /// begun and ended.
    wanted: u64,
    started: u64,
    finished: u64,
    /// When the look in flight began (monotonic, and unix time for reports).
    running_since: Option<(Instant, u64)>,
    /// When the last look ended.
    finished_at: Option<Instant>,
    /// The outcome of look `finished`.
    last: Option<ShareHealth>,
}

impl ShareProbe {
    /// Starts the probe thread for `share`.
    /// Starts the probe thread for `share`, and a watch that asks it to look while
    /// `gate` is closed (to open it again) or while accesses to the share make no progress
    /// (to close it when the share hangs).
    pub fn start(
        share: &Path,
        timeout: Duration,
        gate: Arc<ShareGate>,
    ) -> std::io::Result<Arc<Self>> {
        let probe = Arc::new(ShareProbe {
            share: share.to_path_buf(),
            timeout,
            gate,
            state: Mutex::new(ProbeState::default()),
            cv: Condvar::new(),
        });
        let p = probe.clone();
        std::thread::Builder::new()
            .name("ccfs-share-probe".into())
            .spawn(move || p.run())?;
        let watched = Arc::downgrade(&probe);
        std::thread::Builder::new()
            .name("ccfs-share-watch".into())
            .spawn(move || {
                while let Some(p) = watched.upgrade() {
                    if p.gate.is_closed() || p.gate.stalled(STALL) {
                        p.peek();
                    }
                    drop(p);
                    std::thread::sleep(Duration::from_millis(500));
                }
            })?;
        Ok(probe)
    }

    fn run(&self) {
        loop {
            let number = {
                let mut st = self.state.locked();
                while st.wanted == st.started {
                    st = crate::locks::wait(&self.cv, st);
                }
                st.started = st.wanted;
                st.running_since = Some((Instant::now(), unix_now()));
                st.started
            };
            let result = look_at(&self.share);
            let mut st = self.state.locked();
            let since = st.running_since.map(|(_, t)| t).unwrap_or_else(unix_now);
            st.running_since = None;
            st.finished = number;
            st.finished_at = Some(Instant::now());
            self.gate.set_closed(result.is_err());
            st.last = Some(match result {
                Ok(()) => ShareHealth::Reachable,
                Err(error) => {
                    let since = match &st.last {
                        Some(ShareHealth::Error { since, .. }) => *since,
                        _ => since,
                    };
                    ShareHealth::Error { error, since }
                }
            });
            self.cv.notify_all();
        }
    }

    /// Asks for a new look without waiting for it; returns the number it will have.
    fn ask(&self, st: &mut ProbeState) -> u64 {
        let number = st.started + 1;
        st.wanted = st.wanted.max(number);
        self.cv.notify_all();
        number
    }

    fn hung(&self, st: &ProbeState) -> Option<ShareHealth> {
        match st.running_since {
            // An access that got an answer meanwhile shows the share is back: the look
            // ends too (a check waits for it, bounded); the gate stays as that answer
            // left it.
            Some((t, _)) if t.elapsed() >= self.timeout && self.gate.answered_since(t) => None,
            Some((t, since)) if t.elapsed() >= self.timeout => {
                self.gate.set_closed(true);
                Some(ShareHealth::NotAnswering { since })
            }
            _ => None,
        }
    }

    /// Looks at the share now and waits (bounded) for the answer.
    pub fn check(&self) -> ShareHealth {
        let begun = Instant::now();
        let since = unix_now();
        let mut st = self.state.locked();
        if let Some(h) = self.hung(&st) {
            return h;
        }
        let number = self.ask(&mut st);
        loop {
            if st.finished >= number {
                if let Some(h) = &st.last {
                    return h.clone();
                }
            }
            if let Some(h) = self.hung(&st) {
                return h;
            }
            // Only if the probe thread itself is gone: nothing would ever answer.
            if begun.elapsed() >= self.timeout * 2 {
                return ShareHealth::NotAnswering { since };
            }
            st = self
                .cv
                .wait_timeout(st, Duration::from_millis(100))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// What is known now, without waiting: "not answering" when the look in flight is
    /// overdue, else the last outcome. Asks for a new look for next time (at most one a
    /// second).
    pub(super) fn peek(&self) -> Option<ShareHealth> {
        let mut st = self.state.locked();
        if let Some(h) = self.hung(&st) {
            return Some(h);
        }
        let stale = st
            .finished_at
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        if st.running_since.is_none() && stale {
            self.ask(&mut st);
        }
        st.last.clone()
    }
}

/// One look at the share on a thread of its own, waited for at most `timeout`: a share
/// that hangs holds up that thread only. `Err` names what is wrong, or that it did not
/// answer in time.
pub fn look_within(share: &Path, timeout: Duration) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let path = share.to_path_buf();
    std::thread::Builder::new()
        .name("ccfs-share-look".into())
        .spawn(move || {
            let _ = tx.send(look_at(&path));
        })
        .map_err(|e| e.to_string())?;
    rx.recv_timeout(timeout)
        .unwrap_or_else(|_| Err(format!("no answer within {} s", timeout.as_secs())))
}

/// One look at the share: its root must be a directory and statfs must answer.
pub(super) fn look_at(share: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(share).map_err(|e| e.to_string())?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", share.display()));
    }
    fsinfo::statfs(share).map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_tells_a_reachable_share_from_one_that_fails() {
        let tmp = tempfile::tempdir().expect("tmp");
        let share = tmp.path().join("share");
        std::fs::create_dir(&share).expect("mkdir");
        let gate = Arc::new(ShareGate::default());
        let probe = ShareProbe::start(&share, PROBE_TIMEOUT, gate.clone()).expect("probe");
        assert_eq!(probe.check(), ShareHealth::Reachable);
        std::fs::remove_dir(&share).expect("rmdir");
        let first = probe.check();
        let ShareHealth::Error { error, since } = &first else {
            panic!("an error: {first:?}");
        };
        assert!(error.contains("No such file"), "{error}");
        assert!(gate.is_closed(), "a failed look closes the gate");
        assert!(
            first.describe().starts_with("error: "),
            "{}",
            first.describe()
        );
        // The outage started with the first failed look, not the latest.
        std::thread::sleep(Duration::from_millis(1100));
        assert!(matches!(probe.check(), ShareHealth::Error { since: s, .. } if s == *since));
        std::fs::create_dir(&share).expect("mkdir");
        assert_eq!(probe.check(), ShareHealth::Reachable);
        assert!(!gate.is_closed(), "an answer opens it again");
    }
}
