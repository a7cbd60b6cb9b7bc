//! The one lock idiom. A lock whose holder panicked is taken all the same: what loadgen
//! guards (a worker's histograms, a client's cursor, the pool's queue, the agent's channel)
//! stays usable after a panic, and a run that stopped every other client because one
//! panicked would report nothing of the clients that were fine.

pub use locks::{wait, wait_timeout, Locked};
