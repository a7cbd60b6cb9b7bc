//! The one lock idiom. A lock whose holder panicked is taken all the same: every guarded
//! value here stays consistent between its statements (a panic leaves no half-made
//! change behind a lock: the journal is written first), and a daemon that refused every
//! later request because one request panicked would hold up the user's programs for good.
//! The order in which locks may be taken is written beside each one and in
//! doc/ARCHITECTURE.md.

pub use locks::{wait, Locked, RwLocked};
