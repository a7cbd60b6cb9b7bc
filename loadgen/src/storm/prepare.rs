//! Before a run's users start: each user's home on the share (and what an earlier session
//! left on the workstation), then the machine settled.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::mount::CcfsMount;
use super::{Baseline, Settled, StormConfig, LOCAL_CACHE};
use crate::login::Actor;

/// A user's workstation: its ccfs mount point and cache, and its local `.cache` directory
/// (XDG_CACHE_HOME) for the runs without ccfs.
pub(super) struct Workstation {
    pub(super) mnt: PathBuf,
    pub(super) cache: PathBuf,
    local: PathBuf,
}

impl Workstation {
    pub(super) fn of(work: &Path, u: usize) -> Self {
        Self {
            mnt: work.join(format!("home/user{u:03}")),
            cache: work.join(format!("cache/user{u:03}")),
            local: work.join(format!("local-cache/user{u:03}")),
        }
    }
}

/// An actor on `home` with the run's view of `.cache`: on the workstation's disk in the
/// fair baseline without ccfs.
pub(super) fn actor(
    cfg: &StormConfig,
    with_ccfs: bool,
    home: PathBuf,
    ws: &Workstation,
    seed: u64,
) -> Actor {
    let a = Actor::new(home, seed).rebuilding(Arc::new(cfg.profile.home_files()));
    if !with_ccfs && cfg.baseline == Baseline::Fair {
        a.keep_local(LOCAL_CACHE, ws.local.clone())
    } else {
        a
    }
}

/// A user's home on the share, and (returning users) what an earlier session of the user
/// on the workstation left: its login and logout played there (with ccfs through a mount
/// of the workstation's cache). Untimed, not metered.
pub(super) fn prepare_user(
    cfg: &StormConfig,
    with_ccfs: bool,
    u: usize,
    home: &Path,
    ws: &Workstation,
) -> Result<(), String> {
    std::fs::create_dir(home).map_err(|e| format!("mkdir {}: {e}", home.display()))?;
    // Where `.cache` is not on the share (the fair baseline, and ccfs's local-only class),
    // the share has none: an admin's XDG_CACHE_HOME, or ccfs, never put it there.
    let mut a = Actor::new(home.to_path_buf(), u as u64 + 1);
    let on_share = cfg.baseline == Baseline::ShareCache;
    if on_share {
        a.prepare(&cfg.profile)
    } else {
        a.prepare_except(&cfg.profile, LOCAL_CACHE)
    }
    .map_err(|e| format!("preparing user{u:03}: {e}"))?;
    if !cfg.returning_users {
        return Ok(());
    }
    // The earlier session on this workstation: the `.cache` it filled, and what its login
    // and logout wrote (on the share in both modes; with ccfs, the clean copies its logout
    // left in the cache too).
    let seed = 5000 + u as u64;
    let earlier = |a: &mut Actor| -> std::io::Result<()> {
        a.prepare_missing(&cfg.profile)?;
        a.play(&cfg.profile.login, 0)?;
        a.play(&cfg.profile.logout, 0)
    };
    if !with_ccfs {
        let mut a = if on_share {
            Actor::new(home.to_path_buf(), seed)
        } else {
            actor(cfg, false, home.to_path_buf(), ws, seed)
        };
        return earlier(&mut a).map_err(|e| format!("user{u:03}'s earlier session: {e}"));
    }
    let mut m = CcfsMount::mount(
        &cfg.ccfs,
        home,
        &ws.mnt,
        &ws.cache,
        cfg.ccfs_config.as_deref(),
    )?;
    let made = earlier(&mut Actor::new(ws.mnt.clone(), seed))
        .map_err(|e| format!("user{u:03}'s earlier session: {e}"));
    // A real session lasts until the daemon's background copy of the blocks its files
    // held by block lack is done; its logout then keeps them whole.
    if made.is_ok() {
        match m.wait_filled(Duration::from_secs(120)) {
            Ok(0) => {}
            Ok(left) => eprintln!(
                "loadgen login-storm: user{u:03}'s earlier session ended before ccfs had copied {left} bytes its databases lack (after 120 s)"
            ),
            Err(e) => eprintln!("loadgen login-storm: user{u:03}'s earlier session: {e}"),
        }
    }
    let unmounted = m.umount();
    made?;
    unmounted
}

/// Syncs until (almost) no dirty data is left, drops the page cache, and mounts the
/// share's client afresh when asked.
pub(super) fn settle(cfg: &StormConfig, remount: bool) -> Result<Settled, String> {
    let t = Instant::now();
    let dirty_left_bytes = loop {
        crate::sys::sync_all();
        let left = dirty_bytes();
        if left < 1 << 20 || t.elapsed() > Duration::from_secs(60) {
            break left;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let caches_dropped = std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok();
    let remounted = match cfg.remount.as_ref().filter(|_| remount) {
        None => false,
        Some(cmd) => {
            super::procs::run_given("--remount", cmd)?;
            true
        }
    };
    Ok(Settled {
        dirty_left_bytes,
        caches_dropped,
        remounted,
    })
}

/// Dirty and writeback bytes of the whole machine (/proc/meminfo).
fn dirty_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("Dirty:") || l.starts_with("Writeback:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum::<u64>()
        * 1024
}
