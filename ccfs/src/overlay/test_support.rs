//! What the overlay's own tests share.

use std::time::Duration;

use super::*;
use crate::sync::RsyncOptions;

/// The caller of a test's changes: this process's user.
pub(super) fn ctx() -> Ctx {
    Ctx {
        uid: sys::geteuid(),
        gid: 0,
        umask: 0o022,
    }
}

/// The system's rsync to `share`, as a mount would run it (without `--fsync`).
pub(super) fn rsync(share: &Path) -> RsyncOptions {
    RsyncOptions {
        binary: crate::sync::find_program("rsync").expect("rsync is installed"),
        extra_args: vec![],
        timeout: Duration::from_secs(60),
        caps: crate::sync::probe_share(share),
        fsync: false,
        hold_fd: None,
    }
}
