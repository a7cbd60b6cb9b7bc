//! What the overlay's own tests share.

use std::time::Duration;

use super::*;
use crate::rsync::RsyncOptions;

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
        binary: crate::rsync::find_program("rsync").expect("rsync is installed"),
        extra_args: vec![],
        timeout: Duration::from_secs(60),
        caps: crate::rsync::probe_share(share),
        fsync: crate::rsync::FsyncProbe::answered(false),
        hold_fd: None,
        launcher: None,
        implied_dirs: false,
    }
}

/// A share holding `files` (path and content; a path ending in `/` is a directory) and an
/// empty cache, in a temporary directory kept as long as this is; and their overlay.
pub(super) struct Fresh {
    pub _tmp: tempfile::TempDir,
    pub share: PathBuf,
    pub cache: PathBuf,
    pub o: Overlay,
}

pub(super) fn fresh(files: &[(&str, &str)]) -> Fresh {
    let tmp = tempfile::tempdir().expect("tmp");
    let (share, cache) = (tmp.path().join("share"), tmp.path().join("cache"));
    std::fs::create_dir_all(&share).expect("share");
    std::fs::create_dir_all(&cache).expect("cache");
    for (path, content) in files {
        match path.strip_suffix('/') {
            Some(dir) => std::fs::create_dir_all(share.join(dir)).expect("share directory"),
            None => std::fs::write(share.join(path), content).expect("share file"),
        }
    }
    let o = Overlay::new(&share, &cache, Policy::default_policy()).expect("overlay");
    Fresh {
        _tmp: tmp,
        share,
        cache,
        o,
    }
}
