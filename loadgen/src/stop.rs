//! Stopping a run cleanly: SIGINT and SIGTERM set one flag, which every command's clients,
//! users and workers look at between their actions (a compilebench run, a sweep, a
//! login storm, a stream).

use std::sync::atomic::{AtomicBool, Ordering};

/// Set when the run is to stop (SIGINT, SIGTERM): clients and actors stop between actions.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Whether the run is to stop.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

extern "C" fn on_stop_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// SIGINT and SIGTERM stop the run cleanly: the clients or users stop between actions
/// (a storm's users log out, ccfs unmounts and syncs), and what the run made is removed.
pub fn stop_on_signals() {
    crate::sys::on_stop_signals(on_stop_signal);
}
