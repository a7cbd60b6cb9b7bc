//! What a storm is doing now, for a progress display: which run of how many, its phase,
//! and how many users are through each step. The storm's threads note it here; a display
//! reads [`Progress::now`] as often as it likes and takes every phase change, in order,
//! from [`Progress::changes`] (so that a log misses none, however short).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;

/// A run's phases, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The homes (and the returning users' workstations) being made, untimed.
    Preparing,
    /// The machine settling: a sync, dropped caches, the share's client mounted afresh.
    Settling,
    /// The users logging in (with ccfs: mounting first).
    Login,
    /// Every user logged in; the session's periodic actions.
    Session,
    /// The logout actions and, with ccfs, the sync back (`ccfs umount`).
    Logout,
    /// Every user logged out; the CPU window running to its end.
    CpuWindow,
}

impl Phase {
    const ALL: [Phase; 6] = [
        Phase::Preparing,
        Phase::Settling,
        Phase::Login,
        Phase::Session,
        Phase::Logout,
        Phase::CpuWindow,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Preparing => "preparing the homes",
            Phase::Settling => "settling (sync, caches dropped)",
            Phase::Login => "login",
            Phase::Session => "session",
            Phase::Logout => "logout",
            Phase::CpuWindow => "waiting for the end of the CPU window",
        }
    }
}

/// A phase change: the class's size, the run (1 first), the runs, the mode, the phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    pub users: usize,
    pub run: usize,
    pub runs: usize,
    pub with_ccfs: bool,
    pub metered: bool,
    pub phase: Phase,
}

/// Where a run is now: its last change, and the users through each step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub change: Option<Change>,
    pub users: usize,
    pub logged_in: usize,
    pub logged_out: usize,
    /// With ccfs: the users whose `ccfs umount` (the sync back) returned.
    pub synced: usize,
}

/// The storm's progress (one storm a process: see [`PROGRESS`]).
pub struct Progress {
    run: AtomicUsize,
    runs: AtomicUsize,
    with_ccfs: AtomicBool,
    metered: AtomicBool,
    phase: AtomicU8,
    users: AtomicUsize,
    logged_in: AtomicUsize,
    logged_out: AtomicUsize,
    synced: AtomicUsize,
    changes: Mutex<VecDeque<Change>>,
}

/// Phase changes kept for a display that has not taken them (none may be listening).
const KEPT_CHANGES: usize = 64;

/// The progress of this process's storm.
pub static PROGRESS: Progress = Progress::new();

impl Progress {
    const fn new() -> Self {
        Self {
            run: AtomicUsize::new(0),
            runs: AtomicUsize::new(0),
            with_ccfs: AtomicBool::new(false),
            metered: AtomicBool::new(false),
            phase: AtomicU8::new(u8::MAX),
            users: AtomicUsize::new(0),
            logged_in: AtomicUsize::new(0),
            logged_out: AtomicUsize::new(0),
            synced: AtomicUsize::new(0),
            changes: Mutex::new(VecDeque::new()),
        }
    }

    /// Run `run` (1 first) of `runs` starts, with `users` users.
    pub(super) fn start_run(&self, run: usize, runs: usize, spec: super::RunSpec, users: usize) {
        self.run.store(run, Ordering::Relaxed);
        self.runs.store(runs, Ordering::Relaxed);
        self.with_ccfs.store(spec.with_ccfs, Ordering::Relaxed);
        self.metered.store(spec.metered, Ordering::Relaxed);
        self.users.store(users, Ordering::Relaxed);
        for c in [&self.logged_in, &self.logged_out, &self.synced] {
            c.store(0, Ordering::Relaxed);
        }
        self.set_phase(Phase::Preparing);
    }

    /// The run enters `phase`.
    pub(super) fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Relaxed);
        if let Some(c) = self.change() {
            if let Ok(mut q) = self.changes.lock() {
                if q.len() == KEPT_CHANGES {
                    q.pop_front();
                }
                q.push_back(c);
            }
        }
    }

    /// A user logged in; the last one starts the session.
    pub(super) fn logged_in(&self) {
        if self.logged_in.fetch_add(1, Ordering::Relaxed) + 1 == self.users.load(Ordering::Relaxed)
        {
            self.set_phase(Phase::Session);
        }
    }

    /// A user's logout actions are done.
    pub(super) fn logged_out(&self) {
        self.logged_out.fetch_add(1, Ordering::Relaxed);
    }

    /// A user's ccfs synced and unmounted.
    pub(super) fn synced(&self) {
        self.synced.fetch_add(1, Ordering::Relaxed);
    }

    fn change(&self) -> Option<Change> {
        let phase = *Phase::ALL.get(usize::from(self.phase.load(Ordering::Relaxed)))?;
        Some(Change {
            users: self.users.load(Ordering::Relaxed),
            run: self.run.load(Ordering::Relaxed),
            runs: self.runs.load(Ordering::Relaxed),
            with_ccfs: self.with_ccfs.load(Ordering::Relaxed),
            metered: self.metered.load(Ordering::Relaxed),
            phase,
        })
    }

    /// Where the storm is now.
    pub fn now(&self) -> Now {
        Now {
            change: self.change(),
            users: self.users.load(Ordering::Relaxed),
            logged_in: self.logged_in.load(Ordering::Relaxed),
            logged_out: self.logged_out.load(Ordering::Relaxed),
            synced: self.synced.load(Ordering::Relaxed),
        }
    }

    /// The phase changes since the last call, in order.
    pub fn changes(&self) -> Vec<Change> {
        self.changes
            .lock()
            .map(|mut q| q.drain(..).collect())
            .unwrap_or_default()
    }
}

impl Change {
    /// `30 users, run 2/6, with ccfs: login`.
    pub fn describe(&self) -> String {
        format!(
            "{} users, run {}/{}, {}{}: {}",
            self.users,
            self.run,
            self.runs,
            if self.with_ccfs {
                "with ccfs"
            } else {
                "without ccfs"
            },
            if self.metered { ", metered" } else { "" },
            self.phase.name()
        )
    }
}

impl Now {
    /// The users through the current phase, when it has a count: `12/30 users logged in`;
    /// with ccfs, the logout says how many syncs are done too.
    pub fn counts(&self) -> String {
        let Some(c) = self.change else {
            return String::new();
        };
        match c.phase {
            Phase::Login => format!("{}/{} users logged in", self.logged_in, self.users),
            Phase::Logout if c.with_ccfs => format!(
                "{}/{} users logged out, {}/{} synced",
                self.logged_out, self.users, self.synced, self.users
            ),
            Phase::Logout => format!("{}/{} users logged out", self.logged_out, self.users),
            _ => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storm::RunSpec;

    #[test]
    fn every_phase_change_is_kept_in_order_and_the_counts_follow_the_users() {
        let p = Progress::new();
        let spec = RunSpec {
            with_ccfs: true,
            metered: false,
        };
        p.start_run(2, 6, spec, 2);
        p.set_phase(Phase::Settling);
        p.set_phase(Phase::Login);
        p.logged_in();
        assert_eq!(p.now().counts(), "1/2 users logged in");
        p.logged_in();
        p.set_phase(Phase::Logout);
        p.logged_out();
        p.logged_out();
        p.synced();
        assert_eq!(p.now().counts(), "2/2 users logged out, 1/2 synced");
        let phases: Vec<Phase> = p.changes().iter().map(|c| c.phase).collect();
        assert_eq!(
            phases,
            [
                Phase::Preparing,
                Phase::Settling,
                Phase::Login,
                Phase::Session,
                Phase::Logout
            ]
        );
        assert!(p.changes().is_empty(), "taken once");
        assert_eq!(
            p.now().change.map(|c| c.describe()).as_deref(),
            Some("2 users, run 2/6, with ccfs: logout")
        );
    }
}
