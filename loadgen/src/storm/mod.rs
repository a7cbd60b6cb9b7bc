//! `loadgen login-storm`: a class logs in at once, with or without ccfs.
//!
//! Every run gets homes of its own, prepared on the share (untimed); with
//! `--returning-users` each workstation then gets what an earlier session left on it. Then
//! the machine settles (a sync until no dirty data is left, dropped caches, the share's
//! client mounted afresh when a command for it is given) and every user starts together
//! behind a barrier: with ccfs, the home is first mounted through its own ccfs (own cache
//! and mount point, as on separate workstations); then the login burst, the session (the
//! model's periodic actions), and the logout (with ccfs: `ccfs umount`, which syncs the
//! cache back).
//!
//! The baseline is fair by default: without ccfs, `.cache` is on the workstation's local
//! disk (XDG_CACHE_HOME), as an admin can set it without ccfs; with ccfs it is local-only.
//! Either way a workstation never used starts with it empty, and a program that misses a
//! file rebuilds it (charged to the login). `--baseline share-cache` keeps `.cache` on the
//! share without ccfs.
//!
//! Times come from runs without the meter, `--repeat N` of them a mode in ABBA order; the
//! counts of what reached the share from one more run a mode with the meter in front of
//! the share (a ccfs mount that caches nothing and counts every request it serves).

mod hosts;
mod leftovers;
mod mount;
mod prepare;
mod procs;
mod progress;
mod report;
mod run;
mod sweep;
mod table;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::login::Profile;

pub use hosts::{gate_word, run_across, share_of_class, AgentLine, AgentResult, Hosts};
pub use leftovers::{
    clear_leftovers, clear_work_leftovers, keep_evidence, remove_run_dir, KEPT_MARK,
};
pub use procs::{cpu_seconds, read_pids_file, read_server_counts};
pub use progress::{Change, Now, Phase, PROGRESS};
pub use report::{
    FopCount, HostPart, ServerCounts, Settled, ShareCounts, StormReport, Summary, UserResult,
    PATH_DEPTH,
};
pub use run::{one_run, Gate, Hook};
pub use sweep::{knee, points, sweep_table, Point};
pub use table::{median_spread, ratio, sig3, table};

use procs::become_subreaper;

pub const SCHEMA: &str = "loadgen-login-storm/2";

/// The first path component a workstation keeps local: XDG_CACHE_HOME's default place,
/// and ccfs's default local-only class.
pub const LOCAL_CACHE: &str = ".cache";

/// What the run without ccfs does with `.cache`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Baseline {
    /// `.cache` on the workstation's local disk (XDG_CACHE_HOME), as with ccfs.
    Fair,
    /// `.cache` on the share, as a home without any tuning has it.
    ShareCache,
}

impl Baseline {
    pub fn describe(self) -> &'static str {
        match self {
            Baseline::Fair => "fair (without ccfs, .cache on the workstation's disk)",
            Baseline::ShareCache => "share-cache (without ccfs, .cache on the share)",
        }
    }
}

/// How to run the storms.
#[derive(Debug, Clone)]
pub struct StormConfig {
    pub share: PathBuf,
    pub users: usize,
    pub session: Duration,
    pub profile: Arc<Profile>,
    pub profile_name: String,
    /// The ccfs binary.
    pub ccfs: PathBuf,
    /// Scratch space for mount points and the workstations' caches (local disk).
    pub work: PathBuf,
    /// One more run a mode through the metering mount, for the counts.
    pub meter: bool,
    /// A ccfs configuration file for the users' mounts (default: ccfs's defaults).
    pub ccfs_config: Option<PathBuf>,
    /// Each workstation holds what an earlier session of its user left (else: a first
    /// login on every workstation).
    pub returning_users: bool,
    pub baseline: Baseline,
    /// Timed runs a mode.
    pub repeat: usize,
    /// A shell command that mounts the share's client afresh, run before every run.
    pub remount: Option<String>,
    /// A shell command that prints the server's own counters as JSON ([`ServerCounts`]),
    /// run at the start, at the end of the sessions and at the end of the logouts.
    pub server_counts: Option<String>,
    /// Server processes whose CPU time is measured.
    pub server_pids: Vec<u32>,
    /// A file listing the client side's processes (the FUSE client of the share), read
    /// again before every run (a remount starts a new one).
    pub client_pids_file: Option<PathBuf>,
    /// CPU is measured over this window from the start of a timed run (the same for every
    /// run; longer when a run is); none: from the start to the end of the logouts.
    pub cpu_window: Option<Duration>,
    pub keep: bool,
    pub label: Option<String>,
    /// The number of this machine's first user (users `user_base..user_base + users`): a
    /// host of a multi-host storm plays its part of the class.
    pub user_base: usize,
}

/// One run of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSpec {
    pub with_ccfs: bool,
    /// Through the meter: its counts are kept, its times are not compared.
    pub metered: bool,
}

/// The runs for `modes` (false: without ccfs): `repeat` timed runs a mode, the order
/// alternating (AB, BA, AB, ...: ABBA for two), then one metered run a mode.
pub fn schedule(modes: &[bool], repeat: usize, meter: bool) -> Vec<RunSpec> {
    let mut runs = Vec::new();
    for i in 0..repeat {
        let mut order = modes.to_vec();
        if !i.is_multiple_of(2) {
            order.reverse();
        }
        runs.extend(order.into_iter().map(|with_ccfs| RunSpec {
            with_ccfs,
            metered: false,
        }));
    }
    if meter {
        runs.extend(modes.iter().map(|&with_ccfs| RunSpec {
            with_ccfs,
            metered: true,
        }));
    }
    runs
}

/// The time in a storm's names (`loadgen-storm-TIME-PID`): now, or one past the last one
/// this process used, so that the storms of a sweep started in the same second have
/// names of their own.
pub fn unique_time() -> u64 {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = now_unix();
    let prev = LAST
        .fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |last| Some(now.max(last + 1)),
        )
        .unwrap_or(0);
    now.max(prev + 1)
}

pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The meter's configuration: nothing cached, one FUSE thread a user (so that it never
/// queues the users' requests behind each other).
fn relay_config(users: usize, count_paths: usize) -> String {
    format!(
        "# loadgen login-storm's share meter: caches nothing, counts every request and\n\
         # every byte (no kernel passthrough: the data goes through the daemon), and\n\
         # every request by its path too.\n\
         [paths]\ndotfiles_cached = false\nlocal_only = []\n[sync]\ninterval_secs = 0\n\
         [mount]\nthreads = {}\nkernel_passthrough = false\ncount_paths = {count_paths}\n",
        users.clamp(4, 256)
    )
}

/// Runs the storms of `runs` in order, each on homes of its own. `on_run` gets the
/// reports so far after each storm. Errors before a run's users start are returned; a
/// user's failure is in its result and in the report's `error`.
pub fn run(
    cfg: &StormConfig,
    runs: &[RunSpec],
    mut on_run: impl FnMut(&[StormReport]),
) -> Result<Vec<StormReport>, String> {
    become_subreaper();
    let stamp = format!("{}-{}", unique_time(), std::process::id());
    let run_name = format!("loadgen-storm-{stamp}");
    let run_on_share = cfg.share.join(&run_name);
    std::fs::create_dir(&run_on_share)
        .map_err(|e| format!("cannot create {}: {e}", run_on_share.display()))?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mark = |kept: bool| {
        crate::safety::write_atomic(
            &run_on_share.join(".loadgen-run"),
            format!(
                "{}\n",
                serde_json::json!({"tool": "loadgen", "pid": std::process::id(),
                    "host": host.trim(), "kept": kept})
            )
            .as_bytes(),
        )
    };
    mark(false).map_err(|e| format!("cannot write in {}: {e}", run_on_share.display()))?;
    let mut reports = Vec::new();
    let mut result = Ok(());
    let mut failed_kept = false;
    for (i, &spec) in runs.iter().enumerate() {
        if interrupted() {
            break;
        }
        let work = cfg.work.join(format!("storm-{stamp}-{i}"));
        let homes = format!("{run_name}/run-{i}");
        PROGRESS.start_run(i + 1, runs.len(), spec, cfg.users);
        // Made afresh, never through a name someone else left (--work may be sticky), and
        // private: no other user enters the mounts below it (root's are `allow_other`),
        // where one could keep a mount busy under the run's cleanup.
        let made = crate::safety::make_private_dir(&work)
            .map_err(|e| format!("mkdir {}: {e}", work.display()));
        let outcome = made
            .clone()
            .and_then(|()| one_run(cfg, spec, i, &homes, &work, &run::NoHook));
        match outcome {
            Ok(mut r) => {
                if !spec.metered {
                    r.mode_run = 1 + runs[..i]
                        .iter()
                        .filter(|s| s.with_ccfs == spec.with_ccfs && !s.metered)
                        .count();
                }
                match r.error.as_mut() {
                    // A user's failed logout leaves its unsynced changes in its cache,
                    // and the caches hold the daemons' logs: they stay (but after
                    // Ctrl-C, which asks for everything to go), and no later storm
                    // takes them for a killed storm's leftovers.
                    Some(e) if !interrupted() => {
                        e.push_str(&format!(
                            " (the run's mount points and caches are kept in {}, its homes in {})",
                            work.display(),
                            run_on_share.display()
                        ));
                        keep_evidence(&work, e);
                        failed_kept = true;
                    }
                    // `--keep` keeps the caches too: the daemons' logs say where each
                    // sync's time went.
                    _ if cfg.keep && !interrupted() => {}
                    _ => {
                        let _ = leftovers::remove_run_dir(&work);
                    }
                }
                let failed = r.error.is_some();
                reports.push(r);
                on_run(&reports);
                if failed {
                    break;
                }
            }
            Err(e) => {
                // What a failed logout left unsynced (and the caches' logs) stays
                // where the error says.
                // (A run that failed before it made anything, a --remount that failed
                // say, leaves nothing to keep.)
                // (Only a directory this run made: a name someone else left is not read.)
                let filled =
                    made.is_ok() && std::fs::read_dir(&work).is_ok_and(|mut d| d.next().is_some());
                let e = if filled {
                    let e = format!(
                        "{e} (the run's mount points and caches are kept in {}, its homes in {})",
                        work.display(),
                        run_on_share.display()
                    );
                    keep_evidence(&work, &e);
                    failed_kept = true;
                    e
                } else {
                    if made.is_ok() {
                        let _ = std::fs::remove_dir(&work);
                    }
                    e
                };
                result = Err(e);
                break;
            }
        }
        if !cfg.keep {
            let _ = std::fs::remove_dir_all(cfg.share.join(&homes));
        }
    }
    if cfg.keep || failed_kept {
        // Kept on purpose, or as a failed run's evidence: the next storm leaves it (and
        // says so).
        let _ = mark(true);
    } else {
        let _ = std::fs::remove_dir_all(&run_on_share);
    }
    result.map(|()| reports)
}

use crate::stop::interrupted;

/// Sleeps until `t`, waking early when interrupted.
fn sleep_until(t: Instant) {
    while !interrupted() {
        match t.checked_duration_since(Instant::now()) {
            Some(left) => std::thread::sleep(left.min(Duration::from_millis(100))),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storms_of_one_process_never_share_a_name() {
        let a = unique_time();
        let b = unique_time();
        assert!(b > a, "{a} then {b}");
    }

    #[test]
    fn the_schedule_alternates_the_order_and_meters_last() {
        let spec = |with_ccfs, metered| RunSpec { with_ccfs, metered };
        assert_eq!(
            schedule(&[false, true], 2, true),
            vec![
                spec(false, false),
                spec(true, false),
                spec(true, false),
                spec(false, false),
                spec(false, true),
                spec(true, true),
            ]
        );
        assert_eq!(
            schedule(&[true], 3, false),
            vec![spec(true, false); 3],
            "one mode: its runs, no meter"
        );
    }
}
