//! Mounting: input checks (before anything changes), the daemon's life cycle, recovery.

pub use crate::control::{ccfs_mounts, is_ccfs_mount};
pub use crate::error::{user_error, LogPath, LogText, UserError};
pub use crate::journal::write_atomic;

mod cache;
mod log;
mod plan;
mod recover;
mod serve;

pub use cache::*;
pub use log::*;
pub use plan::*;
pub use recover::*;
pub use serve::*;
