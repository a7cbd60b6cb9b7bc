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

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::engine::Latencies;
use crate::login::{Actor, Profile};
use crate::report::{latency_report, Environment, LatencyReport};

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

/// Requests that reached the share (from the meter).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareCounts {
    pub total: u64,
    pub mutating: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub by_op: BTreeMap<String, u64>,
    /// Requests by where in the home they went: the first [`PATH_DEPTH`] components of
    /// their path below the user's home ("." for the home itself), summed over the users.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_path: BTreeMap<String, u64>,
}

/// How many components of a path below a home the meter's counts by path keep
/// (`.mozilla/firefox/PROFILE`).
pub const PATH_DEPTH: usize = 3;

/// What `by` has more than `before` in each key (keys without a change left out).
fn map_minus(by: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    by.iter()
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

impl ShareCounts {
    fn add(&mut self, other: &ShareCounts) {
        self.total += other.total;
        self.mutating += other.mutating;
        self.read_bytes += other.read_bytes;
        self.write_bytes += other.write_bytes;
        for (k, v) in &other.by_op {
            *self.by_op.entry(k.clone()).or_insert(0) += v;
        }
        for (k, v) in &other.by_path {
            *self.by_path.entry(k.clone()).or_insert(0) += v;
        }
    }

    fn minus(&self, before: &ShareCounts) -> ShareCounts {
        ShareCounts {
            total: self.total.saturating_sub(before.total),
            mutating: self.mutating.saturating_sub(before.mutating),
            read_bytes: self.read_bytes.saturating_sub(before.read_bytes),
            write_bytes: self.write_bytes.saturating_sub(before.write_bytes),
            by_op: map_minus(&self.by_op, &before.by_op),
            by_path: map_minus(&self.by_path, &before.by_path),
        }
    }

    /// The meter counts paths from the share's root: keeps those below `homes` (the
    /// run's homes, relative to the share's root, then a user's directory), each without
    /// those components, summed over the users; the rest (the run's own directories above
    /// the homes) under "(above the homes)".
    fn by_path_in_homes(mut self, homes: &str) -> ShareCounts {
        let skip = Path::new(homes).components().count();
        let mut by_home = BTreeMap::new();
        for (k, v) in std::mem::take(&mut self.by_path) {
            let parts: Vec<&str> = k.split('/').collect();
            let key = if k.starts_with('(') {
                k
            } else if parts.len() > skip && parts[..skip].join("/") == homes {
                match parts.get(skip + 1..) {
                    Some(rest) if !rest.is_empty() => rest.join("/"),
                    _ => ".".to_string(),
                }
            } else {
                "(above the homes)".to_string()
            };
            *by_home.entry(key).or_insert(0) += v;
        }
        self.by_path = by_home;
        self
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UserResult {
    pub user: usize,
    /// ccfs mount time (part of the time to login); 0 without ccfs.
    pub mount_s: f64,
    /// From the barrier to the end of the login burst.
    pub login_s: f64,
    pub session_ticks: u32,
    /// The logout actions and, with ccfs, `ccfs umount` (the sync back).
    pub logout_s: f64,
    pub bytes_written: u64,
    /// Profile files the user's programs looked for and did not find.
    pub missing_files: u64,
    /// Of those, home files rebuilt (written at their home size during the login).
    pub rebuilt_files: u64,
    /// CPU seconds of this user's ccfs daemon (and the rsync it ran), mount to exit.
    pub ccfs_cpu_s: Option<f64>,
    /// This user's operation latencies during the session.
    pub session_latency: BTreeMap<String, LatencyReport>,
    pub error: Option<String>,
    /// When this user started after the start barrier released the class, from the
    /// first user's start.
    #[serde(default)]
    pub start_s: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub p50_s: f64,
    pub p95_s: f64,
    pub max_s: f64,
    pub mean_s: f64,
}

impl Summary {
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        // Nearest rank.
        let q = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Self {
            p50_s: q(0.50),
            p95_s: q(0.95),
            max_s: v[v.len() - 1],
            mean_s: v.iter().sum::<f64>() / v.len() as f64,
        }
    }
}

/// How the machine was left before a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Settled {
    /// Dirty and writeback bytes left after syncing (the sync stops at 1 MiB or 60 s).
    pub dirty_left_bytes: u64,
    /// The page cache was dropped (root only).
    pub caches_dropped: bool,
    /// The share's client was mounted afresh (`--remount`).
    pub remounted: bool,
}

/// One storm's results (JSON schema `loadgen-login-storm/2`; `--json` writes a list of
/// every run).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StormReport {
    pub schema: String,
    pub tool: String,
    pub version: String,
    pub started_at_unix: u64,
    pub label: Option<String>,
    pub share: String,
    pub environment: Environment,
    pub users: usize,
    pub with_ccfs: bool,
    /// Through the meter: counts kept, times not compared.
    pub metered: bool,
    /// This run's place in the schedule (0 first).
    pub run_index: usize,
    pub baseline: Baseline,
    pub session_s: f64,
    pub profile: String,
    /// The workstations held what an earlier session of their users left.
    pub returning_users: bool,
    pub settled: Settled,
    pub time_to_login: Summary,
    pub logout: Summary,
    /// Each user's login plus logout time.
    pub login_plus_logout: Summary,
    pub per_user: Vec<UserResult>,
    pub latency_login: BTreeMap<String, LatencyReport>,
    pub latency_session: BTreeMap<String, LatencyReport>,
    /// What reached the share from the start to the end of the logins (metered runs).
    pub share_login: Option<ShareCounts>,
    /// ... from the end of the logins to the end of the sessions.
    pub share_session: Option<ShareCounts>,
    /// ... during the logouts.
    pub share_logout: Option<ShareCounts>,
    /// CPU seconds of the given server processes over `cpu_window_s`.
    pub server_cpu_s: Option<f64>,
    /// CPU seconds of the client side's given processes (the share's FUSE client) over
    /// `cpu_window_s`.
    pub client_cpu_s: Option<f64>,
    /// CPU seconds of the users' ccfs daemons, mount to exit (with ccfs).
    pub ccfs_cpu_s: Option<f64>,
    pub cpu_window_s: Option<f64>,
    pub complete: bool,
    pub error: Option<String>,
}

impl StormReport {
    pub fn mode(&self) -> &'static str {
        if self.with_ccfs {
            "with ccfs"
        } else {
            "without ccfs"
        }
    }

    pub fn name(&self) -> String {
        let run = if self.metered {
            format!("{}, metered", self.mode())
        } else {
            format!("{} #{}", self.mode(), self.run_index + 1)
        };
        match &self.label {
            Some(l) => format!("{l}, {run}"),
            None => run,
        }
    }

    /// What reached the share over the whole run (login + session + logout).
    pub fn share_whole(&self) -> Option<ShareCounts> {
        let mut all = ShareCounts::default();
        for c in [&self.share_login, &self.share_session, &self.share_logout] {
            all.add(c.as_ref()?);
        }
        Some(all)
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A mounted ccfs, unmounted (and synced) on drop if still there.
struct CcfsMount {
    ccfs: PathBuf,
    mnt: PathBuf,
    /// The cache directory (its `ccfs.log` is the daemon's log).
    cache: PathBuf,
    mounted: bool,
    /// The daemon's process id, as `ccfs mount` printed it.
    pid: Option<u32>,
    /// The daemon's CPU seconds, once it exited and was reaped.
    cpu_s: Option<f64>,
}

impl CcfsMount {
    fn mount(
        ccfs: &Path,
        share: &Path,
        mnt: &Path,
        cache: &Path,
        config: Option<&Path>,
    ) -> Result<Self, String> {
        std::fs::create_dir_all(mnt).map_err(|e| format!("mkdir {}: {e}", mnt.display()))?;
        let mut c = Command::new(ccfs);
        c.arg("mount")
            .arg(share)
            .arg(mnt)
            .arg("--cache-dir")
            .arg(cache);
        if let Some(cfg) = config {
            c.arg("--config").arg(cfg);
        }
        let out = c.output().map_err(|e| {
            format!(
                "cannot run {}: {e}; build ccfs or pass --ccfs",
                ccfs.display()
            )
        })?;
        if !out.status.success() {
            return Err(format!(
                "ccfs mount {} failed: {}",
                mnt.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Self {
            ccfs: ccfs.to_path_buf(),
            mnt: mnt.to_path_buf(),
            cache: cache.to_path_buf(),
            mounted: true,
            pid: daemon_pid(&String::from_utf8_lossy(&out.stdout)),
            cpu_s: None,
        })
    }

    /// `ccfs umount` (which syncs). The other users' threads start processes all the time,
    /// and a child between fork and exec briefly holds this user's open files: a busy
    /// mount is tried again. The mount counts as gone only once it is. The daemon, ours
    /// once `ccfs mount` exited (this process is a subreaper), is then reaped for its CPU.
    fn umount(&mut self) -> Result<(), String> {
        let mut tries = 0;
        while self.mounted {
            let out = Command::new(&self.ccfs)
                .arg("umount")
                .arg(&self.mnt)
                .output()
                .map_err(|e| format!("cannot run ccfs umount: {e}"))?;
            if out.status.success() {
                self.mounted = false;
                break;
            }
            let err = String::from_utf8_lossy(&out.stderr);
            tries += 1;
            let dead_mount = mount_dead(&self.mnt);
            if dead_mount || self.pid.is_some_and(gone) {
                // Its daemon has ended. Unmounted (the mount table no longer has it) and
                // exited 0, it ended as every logout ends, with everything on the share:
                // only `ccfs umount`'s report of it failed. Else it died mid-storm: its
                // mount is detached so that nothing is left mounted (its cache stays).
                let ended = self
                    .pid
                    .take()
                    .and_then(|pid| reap(pid, Duration::from_secs(5)));
                let unmounted = !dead_mount && !is_mounted(&self.mnt);
                if unmounted && ended.is_some_and(|(status, _)| status == 0) {
                    self.mounted = false;
                    self.cpu_s = ended.map(|(_, cpu)| cpu);
                    eprintln!(
                        "loadgen login-storm: ccfs umount {} failed ({}), but its daemon unmounted, synced everything and exited 0",
                        self.mnt.display(),
                        err.trim()
                    );
                    return Ok(());
                }
                detach(&self.mnt);
                self.mounted = false;
                return Err(format!(
                    "the ccfs daemon of {} had died ({}); its mount was detached; its log: {}; ccfs umount said: {}",
                    self.mnt.display(),
                    match ended {
                        Some((st, _)) if libc::WIFSIGNALED(st) =>
                            format!("killed by signal {}", libc::WTERMSIG(st)),
                        Some((st, _)) => format!("exit status {}", libc::WEXITSTATUS(st)),
                        None => "its exit status unknown: not this process's child".to_string(),
                    },
                    self.cache.join("ccfs.log").display(),
                    err.trim()
                ));
            }
            if !err.contains("busy") || tries == 20 {
                return Err(format!(
                    "ccfs umount {} failed: {}",
                    self.mnt.display(),
                    err.trim()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(pid) = self.pid.take() {
            self.cpu_s = reap_cpu(pid, Duration::from_secs(30));
        }
        Ok(())
    }

    fn counts(&self) -> Result<ShareCounts, String> {
        let out = Command::new(&self.ccfs)
            .arg("status")
            .arg("--json")
            .arg(&self.mnt)
            .output()
            .map_err(|e| format!("cannot run ccfs status: {e}"))?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("ccfs status answered badly: {e}"))?;
        serde_json::from_value(v["requests"].clone())
            .map_err(|e| format!("ccfs status has no request counts: {e}"))
    }
}

impl Drop for CcfsMount {
    fn drop(&mut self) {
        let _ = self.umount();
    }
}

/// Whether process `pid` has ended (gone, or a zombie not reaped yet: this process is a
/// subreaper, so a killed daemon stays one until reaped).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // "PID (COMM) STATE ...": the state follows the last ')'.
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// Whether a FUSE mount's daemon is gone (the kernel answers ENOTCONN).
fn mount_dead(mnt: &Path) -> bool {
    std::fs::metadata(mnt).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN))
}

/// Detaches a FUSE mount lazily (its daemon is gone, or is to be let go).
fn detach(mnt: &Path) {
    let _ = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(mnt)
        .output();
}

/// Pids of the live processes with an argument naming `dir` or a path below it.
fn processes_naming(dir: &Path) -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && !gone(pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|&b| b == 0)
                    .any(|a| Path::new(std::ffi::OsStr::from_bytes(a)).starts_with(dir))
            })
        })
        .collect()
}

/// Waits up to `limit` for the processes naming `dir` to end; returns those still running.
fn await_processes_naming(dir: &Path, limit: Duration) -> Vec<u32> {
    let until = std::time::Instant::now() + limit;
    loop {
        let left = processes_naming(dir);
        if left.is_empty() || std::time::Instant::now() >= until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `remove_dir_all`, tried again a few times when an entry appeared while it ran (a
/// daemon's last log line, a lazily detached mount's last writer).
fn remove_dir_settled(dir: &Path) -> std::io::Result<()> {
    let mut tries = 0;
    loop {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) && tries < 5 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            r => return r,
        }
    }
}

/// What a storm killed earlier left, found and removed: in the scratch space, its run
/// directories (`storm-TIME-PID-I`, whose process is gone) with every mount below them
/// (detached, deepest first); on the share, its homes (`loadgen-storm-TIME-PID` with the
/// marker of this host). Returns what it did, a line each.
pub fn clear_leftovers(cfg: &StormConfig) -> Vec<String> {
    let mut said = Vec::new();
    let dead = |name: &str, prefix: &str, parts: usize| -> bool {
        let Some(rest) = name.strip_prefix(prefix) else {
            return false;
        };
        let fields: Vec<&str> = rest.split('-').collect();
        fields.len() == parts
            && fields.iter().all(|f| f.parse::<u64>().is_ok())
            && !Path::new(&format!("/proc/{}", fields[1])).exists()
    };
    let not_mine = |p: &Path| {
        format!(
            "{} looks left by a storm that was killed, but is not this user's own \
             directory; left alone (remove it by hand if it is a leftover)",
            p.display()
        )
    };
    let mounts = fsinfo::mounts().unwrap_or_default();
    for e in std::fs::read_dir(&cfg.work).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !dead(&name, "storm-", 3) {
            continue;
        }
        let dir = e.path();
        if std::fs::symlink_metadata(dir.join(KEPT_MARK)).is_ok() {
            said.push(format!(
                "{} was kept by an earlier storm that failed (its error is in {}); remove it when done with it",
                dir.display(),
                dir.join(KEPT_MARK).display()
            ));
            continue;
        }
        if !crate::safety::owned_by_me(&dir) {
            said.push(not_mine(&dir));
            continue;
        }
        let mut below: Vec<&Path> = mounts
            .iter()
            .map(|m| m.mount_point.as_path())
            .filter(|p| p.starts_with(&dir))
            .collect();
        below.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for m in &below {
            detach(m);
        }
        // A detached user's daemon still ends its session (its logout sync writes its
        // cache and the share's home): removing under it would race it.
        let left = await_processes_naming(&dir, Duration::from_secs(30));
        if !left.is_empty() {
            said.push(format!(
                "{} still has daemons running after 30 s (pids {left:?}); stop them, then remove it",
                dir.display()
            ));
            continue;
        }
        match remove_dir_settled(&dir) {
            Ok(()) => said.push(format!(
                "removed {} ({} mounts detached), left by a storm that was killed",
                dir.display(),
                below.len()
            )),
            Err(e) => said.push(format!(
                "{} was left by a storm that was killed and cannot be removed ({e}); \
                 detach what is mounted below it (fusermount3 -u -z) and remove it",
                dir.display()
            )),
        }
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    for e in std::fs::read_dir(&cfg.share)
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if !dead(&name, "loadgen-storm-", 2) {
            continue;
        }
        let marker = std::fs::read_to_string(e.path().join(".loadgen-run")).unwrap_or_default();
        let m = serde_json::from_str::<serde_json::Value>(&marker).unwrap_or_default();
        let ours = m["tool"] == "loadgen" && m["host"] == host.trim();
        if ours && m["kept"] == true {
            said.push(format!(
                "{} was kept by an earlier storm (--keep); remove it when done with it",
                e.path().display()
            ));
            continue;
        }
        if ours && !crate::safety::owned_by_me(&e.path()) {
            said.push(not_mine(&e.path()));
            continue;
        }
        if !ours {
            said.push(format!(
                "{} is another storm's (another host's, or an older loadgen's); if it is over, remove it",
                e.path().display()
            ));
            continue;
        }
        match remove_dir_settled(&e.path()) {
            Ok(()) => said.push(format!(
                "removed {}, the homes of a storm that was killed",
                e.path().display()
            )),
            Err(err) => said.push(format!(
                "{} holds the homes of a storm that was killed and cannot be removed ({err})",
                e.path().display()
            )),
        }
    }
    said
}

/// The name of the file that marks a storm's run directory as kept (a failed run's
/// evidence): [`clear_leftovers`] leaves it.
pub const KEPT_MARK: &str = ".loadgen-kept";

/// Marks the run directory `work` as kept, with the error that kept it.
fn keep_evidence(work: &Path, error: &str) {
    if let Err(e) =
        crate::safety::write_atomic(&work.join(KEPT_MARK), format!("{error}\n").as_bytes())
    {
        eprintln!(
            "loadgen login-storm: cannot mark {} as kept ({e}); a later storm may remove it",
            work.display()
        );
    }
}

/// The daemon's pid in `ccfs mount`'s line "ccfs: mounted ... (cache ..., pid N)".
fn daemon_pid(stdout: &str) -> Option<u32> {
    let line = stdout.lines().find(|l| l.starts_with("ccfs: mounted"))?;
    let at = line.rfind("pid ")?;
    line[at + 4..].trim_end_matches(')').trim().parse().ok()
}

/// Whether something is mounted at `mnt` (the mount table; the mount is not touched).
fn is_mounted(mnt: &Path) -> bool {
    fsinfo::mounts()
        .unwrap_or_default()
        .iter()
        .any(|m| m.mount_point == mnt)
}

/// Waits (at most `limit`) for our child `pid` to exit: its wait status and CPU seconds,
/// user and system, its reaped children's included; None when it is not ours or did not
/// exit.
fn reap(pid: u32, limit: Duration) -> Option<(i32, f64)> {
    let t = Instant::now();
    loop {
        match crate::sys::try_reap(pid) {
            Ok(Some(done)) => return Some(done),
            Ok(None) if t.elapsed() <= limit => {}
            _ => return None,
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits (at most `limit`) for our child `pid` to exit and returns its CPU seconds, user
/// and system, its reaped children's included; None when it is not ours or did not exit.
fn reap_cpu(pid: u32, limit: Duration) -> Option<f64> {
    reap(pid, limit).map(|(_, cpu)| cpu)
}

/// Makes this process the reaper of its orphaned descendants: the ccfs daemons, whose
/// `ccfs mount` exits once they are up, become its children, and their CPU time is read
/// when they are reaped.
fn become_subreaper() {
    crate::sys::become_subreaper();
}

/// CPU seconds (user + system) of the processes, those still alive.
pub fn cpu_seconds(pids: &[u32]) -> f64 {
    let hz = crate::sys::clock_ticks();
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|s| {
            // Fields after the command name (which may hold spaces) in parentheses.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ut: f64 = f.get(11)?.parse().ok()?;
            let st: f64 = f.get(12)?.parse().ok()?;
            Some((ut + st) / hz)
        })
        .sum()
}

/// Process ids from a file, one a line (its first word), as deploy/testbed keeps them.
pub fn read_pids_file(path: &Path) -> Result<Vec<u32>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            line.split_whitespace()
                .next()
                .and_then(|w| w.parse::<u32>().ok())
                .ok_or_else(|| {
                    format!(
                        "{}: {line:?} does not start with a process id",
                        path.display()
                    )
                })
        })
        .collect()
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
    let stamp = format!("{}-{}", now_unix(), std::process::id());
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
        let outcome = std::fs::create_dir_all(&work)
            .map_err(|e| format!("mkdir {}: {e}", work.display()))
            .and_then(|()| one_run(cfg, spec, i, &homes, &work));
        match outcome {
            Ok(mut r) => {
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
                    _ => {
                        let _ = std::fs::remove_dir_all(&work);
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
                let made = std::fs::read_dir(&work).is_ok_and(|mut d| d.next().is_some());
                let e = if made {
                    let e = format!(
                        "{e} (the run's mount points and caches are kept in {}, its homes in {})",
                        work.display(),
                        run_on_share.display()
                    );
                    keep_evidence(&work, &e);
                    failed_kept = true;
                    e
                } else {
                    let _ = std::fs::remove_dir(&work);
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

/// A user's workstation: its ccfs mount point and cache, and its local `.cache` directory
/// (XDG_CACHE_HOME) for the runs without ccfs.
struct Workstation {
    mnt: PathBuf,
    cache: PathBuf,
    local: PathBuf,
}

impl Workstation {
    fn of(work: &Path, u: usize) -> Self {
        Self {
            mnt: work.join(format!("home/user{u:03}")),
            cache: work.join(format!("cache/user{u:03}")),
            local: work.join(format!("local-cache/user{u:03}")),
        }
    }
}

/// An actor on `home` with the run's view of `.cache`: on the workstation's disk in the
/// fair baseline without ccfs.
fn actor(cfg: &StormConfig, with_ccfs: bool, home: PathBuf, ws: &Workstation, seed: u64) -> Actor {
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
fn prepare_user(
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
    let unmounted = m.umount();
    made?;
    unmounted
}

/// Syncs until (almost) no dirty data is left, drops the page cache, and mounts the
/// share's client afresh when asked.
fn settle(cfg: &StormConfig, remount: bool) -> Result<Settled, String> {
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
            let out = Command::new("sh")
                .arg("-c")
                .arg(cmd)
                .output()
                .map_err(|e| format!("cannot run --remount {cmd:?}: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "--remount {cmd:?} failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
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

fn one_run(
    cfg: &StormConfig,
    spec: RunSpec,
    index: usize,
    homes: &str,
    work: &Path,
) -> Result<StormReport, String> {
    let n = cfg.users;
    let homes_on_share = cfg.share.join(homes);
    std::fs::create_dir(&homes_on_share)
        .map_err(|e| format!("cannot create {}: {e}", homes_on_share.display()))?;
    // The meter in front of the share, mounted before the homes are prepared through it:
    // a ccfs mount numbers the inodes it shows itself, and a returning user's cache must
    // have met the share's files under the numbers the run shows (as a real share's
    // client keeps them). The share's client is mounted afresh before the meter, not
    // under it.
    let relay = if spec.metered {
        settle(cfg, true)?;
        let conf = work.join("meter.toml");
        // The meter's paths: the homes' components, the user's directory, then those kept.
        let depth = Path::new(homes).components().count() + 1 + PATH_DEPTH;
        std::fs::write(&conf, relay_config(n, depth)).map_err(|e| e.to_string())?;
        Some(CcfsMount::mount(
            &cfg.ccfs,
            &cfg.share,
            &work.join("meter"),
            &work.join("meter-cache"),
            Some(&conf),
        )?)
    } else {
        None
    };
    let share_view = match &relay {
        Some(r) => r.mnt.join(homes),
        None => homes_on_share.clone(),
    };
    let prep: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|u| {
                let home = share_view.join(format!("user{u:03}"));
                s.spawn(move || {
                    prepare_user(cfg, spec.with_ccfs, u, &home, &Workstation::of(work, u))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    if let Some(e) = prep.into_iter().find_map(Result::err) {
        return Err(e);
    }
    let settled = settle(cfg, relay.is_none())?;
    let client_pids = match &cfg.client_pids_file {
        Some(f) => read_pids_file(f)?,
        None => Vec::new(),
    };
    let start = Barrier::new(n + 1);
    let at_gate = std::sync::atomic::AtomicUsize::new(0);
    let go = std::sync::atomic::AtomicBool::new(false);
    let logins_done = Barrier::new(n + 1);
    let sessions_done = Barrier::new(n + 1);
    let logouts_done = Barrier::new(n + 1);
    type Played = ((UserResult, Latencies, Latencies), Option<Instant>);
    let results: Mutex<Vec<Played>> = Mutex::new(Vec::new());
    let counts = |r: &Option<CcfsMount>| r.as_ref().map(CcfsMount::counts).transpose();
    let mut snaps: [Option<ShareCounts>; 4] = Default::default();
    let mut cpu = [(0.0, 0.0); 2];
    let mut window = None;
    let mut meter_err = None;
    let any_pids = !cfg.server_pids.is_empty() || !client_pids.is_empty();
    let measure_cpu = !spec.metered && any_pids;
    crate::login::NOT_STARTED.store(n, std::sync::atomic::Ordering::Relaxed);
    std::thread::scope(|s| {
        for u in 0..n {
            let gates = Gates {
                start: &start,
                at_gate: &at_gate,
                go: &go,
                logins_done: spec.metered.then_some(&logins_done),
                sessions_done: &sessions_done,
                logouts_done: &logouts_done,
            };
            let results = &results;
            let share_home = share_view.join(format!("user{u:03}"));
            s.spawn(move || {
                let r = user(cfg, spec.with_ccfs, u, &share_home, work, &gates);
                let started = START.with(|t| t.get());
                if let Ok(mut g) = results.lock() {
                    g.push((r, started));
                }
            });
        }
        let mut snap = |i: usize| match counts(&relay) {
            Ok(c) => snaps[i] = c,
            Err(e) => meter_err = Some(e),
        };
        snap(0);
        cpu[0] = (cpu_seconds(&cfg.server_pids), cpu_seconds(&client_pids));
        start.wait();
        // Every user past the barrier (each now only yields), then all go at once.
        while at_gate.load(std::sync::atomic::Ordering::SeqCst) < n {
            std::thread::yield_now();
        }
        go.store(true, std::sync::atomic::Ordering::Release);
        let t0 = Instant::now();
        if spec.metered {
            logins_done.wait();
            snap(1);
        }
        sessions_done.wait();
        snap(2);
        logouts_done.wait();
        snap(3);
        if measure_cpu {
            if let Some(w) = cfg.cpu_window {
                sleep_until(t0 + w);
            }
            cpu[1] = (cpu_seconds(&cfg.server_pids), cpu_seconds(&client_pids));
            window = Some(t0.elapsed().as_secs_f64());
        }
    });
    drop(relay);
    let played = results.into_inner().unwrap_or_default();
    // Each user's start from the first one's: how closely the class really started.
    let first = played.iter().filter_map(|p| p.1).min();
    let mut rs: Vec<(UserResult, Latencies, Latencies)> = played
        .into_iter()
        .map(|(mut r, t)| {
            if let (Some(t), Some(first)) = (t, first) {
                r.0.start_s = t.duration_since(first).as_secs_f64();
            }
            r
        })
        .collect();
    rs.sort_by_key(|r| r.0.user);
    let mut lat_login = Latencies::new();
    let mut lat_session = Latencies::new();
    for (_, l, s) in &rs {
        lat_login.merge(l);
        lat_session.merge(s);
    }
    let per_user: Vec<UserResult> = rs.into_iter().map(|r| r.0).collect();
    // The first user's error that says more than the interrupt, if any.
    let user_error = |skip_interrupt: bool| {
        per_user.iter().find_map(|u| {
            u.error
                .as_ref()
                .filter(|e| !(skip_interrupt && e.contains("interrupted")))
                .map(|e| format!("user{:03}: {e}", u.user))
        })
    };
    let error = user_error(true).or_else(|| user_error(false)).or(meter_err);
    let of = |f: fn(&UserResult) -> f64| Summary::of(&per_user.iter().map(f).collect::<Vec<_>>());
    let delta = |a: &Option<ShareCounts>, b: &Option<ShareCounts>| match (a, b) {
        (Some(a), Some(b)) => Some(b.minus(a).by_path_in_homes(homes)),
        _ => None,
    };
    let ccfs_cpu: Vec<f64> = per_user.iter().filter_map(|u| u.ccfs_cpu_s).collect();
    Ok(StormReport {
        schema: SCHEMA.into(),
        tool: "loadgen".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        started_at_unix: now_unix(),
        label: cfg.label.clone(),
        share: cfg.share.display().to_string(),
        environment: Environment::probe(&crate::store::Target::Local(cfg.share.clone())),
        users: n,
        with_ccfs: spec.with_ccfs,
        metered: spec.metered,
        run_index: index,
        baseline: cfg.baseline,
        session_s: cfg.session.as_secs_f64(),
        profile: cfg.profile_name.clone(),
        returning_users: cfg.returning_users,
        settled,
        time_to_login: of(|u| u.login_s),
        logout: of(|u| u.logout_s),
        login_plus_logout: of(|u| u.login_s + u.logout_s),
        complete: error.is_none() && per_user.len() == n,
        error,
        latency_login: latency_report(&lat_login),
        latency_session: latency_report(&lat_session),
        share_login: delta(&snaps[0], &snaps[1]),
        share_session: delta(&snaps[1], &snaps[2]),
        share_logout: delta(&snaps[2], &snaps[3]),
        server_cpu_s: (measure_cpu && !cfg.server_pids.is_empty()).then_some(cpu[1].0 - cpu[0].0),
        client_cpu_s: (measure_cpu && !client_pids.is_empty()).then_some(cpu[1].1 - cpu[0].1),
        ccfs_cpu_s: (spec.with_ccfs && ccfs_cpu.len() == per_user.len() && !per_user.is_empty())
            .then(|| ccfs_cpu.iter().sum()),
        cpu_window_s: window,
        per_user,
    })
}

thread_local! {
    /// When this thread's user started after the start barrier.
    static START: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// The barriers every user passes, in this order.
struct Gates<'a> {
    start: &'a Barrier,
    /// Users past the start barrier, waiting for `go`.
    at_gate: &'a std::sync::atomic::AtomicUsize,
    /// Set once every user waits for it: they all see it within one turn of the CPU
    /// each (a barrier hands its lock from one woken thread to the next, which on a few
    /// cores spreads the start of hundreds of users over half a second).
    go: &'a std::sync::atomic::AtomicBool,
    /// Metered runs only: the counts are read between the logins and the sessions.
    logins_done: Option<&'a Barrier>,
    sessions_done: &'a Barrier,
    logouts_done: &'a Barrier,
}

/// One user's login, session and logout. Always passes every barrier.
fn user(
    cfg: &StormConfig,
    with_ccfs: bool,
    u: usize,
    share_home: &Path,
    work: &Path,
    gates: &Gates,
) -> (UserResult, Latencies, Latencies) {
    let mut r = UserResult {
        user: u,
        mount_s: 0.0,
        login_s: 0.0,
        session_ticks: 0,
        logout_s: 0.0,
        bytes_written: 0,
        missing_files: 0,
        rebuilt_files: 0,
        ccfs_cpu_s: None,
        session_latency: BTreeMap::new(),
        error: None,
        start_s: 0.0,
    };
    let mut session_lat = Latencies::new();
    let ws = Workstation::of(work, u);
    // Made before the start (its data and its list of the home's files): the login's
    // time is the login's.
    let mut actor = actor(
        cfg,
        with_ccfs,
        if with_ccfs {
            ws.mnt.clone()
        } else {
            share_home.to_path_buf()
        },
        &ws,
        1000 + u as u64,
    );
    gates.start.wait();
    gates
        .at_gate
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    while !gates.go.load(std::sync::atomic::Ordering::Acquire) {
        std::thread::yield_now();
    }
    let t0 = Instant::now();
    START.with(|t| t.set(Some(t0)));
    crate::login::NOT_STARTED.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    let mut mount = None;
    let failed = |r: UserResult, session_lat| {
        if let Some(b) = gates.logins_done {
            b.wait();
        }
        gates.sessions_done.wait();
        gates.logouts_done.wait();
        (r, Latencies::new(), session_lat)
    };
    if with_ccfs {
        match CcfsMount::mount(
            &cfg.ccfs,
            share_home,
            &ws.mnt,
            &ws.cache,
            cfg.ccfs_config.as_deref(),
        ) {
            Ok(m) => {
                mount = Some(m);
                r.mount_s = t0.elapsed().as_secs_f64();
            }
            Err(e) => {
                r.error = Some(e);
                return failed(r, session_lat);
            }
        }
    }
    let login = actor.play(&cfg.profile.login, 0);
    r.login_s = t0.elapsed().as_secs_f64();
    let login_lat = std::mem::take(&mut actor.lat);
    if let Err(e) = login {
        r.error = Some(format!("login: {e}"));
    }
    if let Some(b) = gates.logins_done {
        b.wait();
    }
    // The session: the periodic actions, every period, until its end.
    let every = cfg.profile.session_every;
    let session_start = Instant::now();
    let mut tick = 1u32;
    while r.error.is_none() && every * tick <= cfg.session {
        sleep_until(session_start + every * tick);
        if interrupted() {
            r.error = Some("interrupted by a signal".into());
            break;
        }
        if let Err(e) = actor.play(&cfg.profile.session, tick) {
            r.error = Some(format!("session: {e}"));
        }
        r.session_ticks = tick;
        tick += 1;
    }
    sleep_until(session_start + cfg.session);
    session_lat.merge(&std::mem::take(&mut actor.lat));
    r.session_latency = latency_report(&session_lat);
    gates.sessions_done.wait();
    let t1 = Instant::now();
    if r.error.is_none() {
        if let Err(e) = actor.play(&cfg.profile.logout, 0) {
            r.error = Some(format!("logout: {e}"));
        }
    }
    if let Some(mut m) = mount {
        if let Err(e) = m.umount() {
            r.error.get_or_insert(e);
        }
        r.ccfs_cpu_s = m.cpu_s;
    }
    r.logout_s = t1.elapsed().as_secs_f64();
    r.bytes_written = actor.tally.bytes_written;
    r.missing_files = actor.tally.missing;
    r.rebuilt_files = actor.tally.rebuilt;
    gates.logouts_done.wait();
    (r, login_lat, session_lat)
}

fn interrupted() -> bool {
    crate::login::INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sleeps until `t`, waking early when interrupted.
fn sleep_until(t: Instant) {
    while !interrupted() {
        match t.checked_duration_since(Instant::now()) {
            Some(left) => std::thread::sleep(left.min(Duration::from_millis(100))),
            None => return,
        }
    }
}

extern "C" fn on_stop_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    crate::login::INTERRUPTED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// SIGINT and SIGTERM stop the storm cleanly: the users stop between actions, log out
/// (ccfs unmounts and syncs), and the homes and scratch space are removed.
pub fn stop_on_signals() {
    crate::sys::on_stop_signals(on_stop_signal);
}

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

/// The median of `v` (the mean of the middle two for an even count) and its spread.
pub fn median_spread(v: &[f64]) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    let median = if s.len().is_multiple_of(2) {
        (s[m - 1] + s[m]) / 2.0
    } else {
        s[m]
    };
    Some((median, s[0], s[s.len() - 1]))
}

/// The mean over the users of `f`.
fn per_user(r: &StormReport, f: fn(&UserResult) -> u64) -> Option<f64> {
    let n = r.per_user.len().max(1) as f64;
    Some(r.per_user.iter().map(f).sum::<u64>() as f64 / n)
}

/// Where a table row takes its value from.
enum From {
    /// The runs without the meter: median and spread.
    Timed(fn(&StormReport) -> Option<f64>),
    /// The metered run.
    Metered(fn(&StormReport) -> Option<f64>),
}

/// The comparison: one column a mode (median and spread of the timed runs; counts from
/// the metered run), and the ratio with/without when both ran.
pub fn table(runs: &[StormReport]) -> String {
    let mut out = String::new();
    let Some(first) = runs.first() else {
        return out;
    };
    let modes: Vec<bool> = [false, true]
        .into_iter()
        .filter(|m| runs.iter().any(|r| r.with_ccfs == *m))
        .collect();
    let timed = |m: bool| runs.iter().filter(move |r| r.with_ccfs == m && !r.metered);
    let metered = |m: bool| runs.iter().find(|r| r.with_ccfs == m && r.metered);
    let order: String = runs
        .iter()
        .filter(|r| !r.metered)
        .map(|r| if r.with_ccfs { 'B' } else { 'A' })
        .collect();
    out.push_str(&format!(
        "loadgen login-storm: {} users on {} ({}), session {} s, profile {}\n\
         baseline: {}; {}\n\
         times: median (min-max) of {} timed run(s) a mode, order {} (A without ccfs, B with); \
         counts: {}\n\n",
        first.users,
        first.share,
        first.environment.fs_type,
        first.session_s,
        first.profile,
        first.baseline.describe(),
        if first.returning_users {
            "returning users (each workstation as an earlier session left it)"
        } else {
            "first logins (workstations never used)"
        },
        timed(modes[0]).count(),
        if order.is_empty() { "-" } else { &order },
        if runs.iter().any(|r| r.metered) {
            "one more run a mode through the share meter"
        } else {
            "none (--no-meter)"
        }
    ));
    out.push_str(&format!("{:<38}", ""));
    for m in &modes {
        out.push_str(&format!(
            "{:>22}",
            if *m { "with ccfs" } else { "without ccfs" }
        ));
    }
    if modes.len() == 2 {
        out.push_str(&format!("{:>9}", "ratio"));
    }
    out.push('\n');
    type Row = (&'static str, From, fn(f64) -> String);
    let secs = |v: f64| format!("{v:.2}");
    let count = |v: f64| format!("{v:.0}");
    let bytes = |v: f64| mb(v as u64);
    let rows: Vec<Row> = vec![
        (
            "time to login p50 (s)",
            From::Timed(|r| Some(r.time_to_login.p50_s)),
            secs,
        ),
        (
            "time to login p95 (s)",
            From::Timed(|r| Some(r.time_to_login.p95_s)),
            secs,
        ),
        (
            "time to login max (s)",
            From::Timed(|r| Some(r.time_to_login.max_s)),
            secs,
        ),
        (
            "  of which ccfs mount p50 (s)",
            From::Timed(|r| {
                r.with_ccfs.then(|| {
                    Summary::of(&r.per_user.iter().map(|u| u.mount_s).collect::<Vec<_>>()).p50_s
                })
            }),
            secs,
        ),
        (
            "logout p50 (s)",
            From::Timed(|r| Some(r.logout.p50_s)),
            secs,
        ),
        (
            "logout max (s)",
            From::Timed(|r| Some(r.logout.max_s)),
            secs,
        ),
        (
            "login + logout p50 (s)",
            From::Timed(|r| Some(r.login_plus_logout.p50_s)),
            secs,
        ),
        (
            "users' start spread (ms)",
            From::Timed(|r| {
                let starts = r.per_user.iter().map(|u| u.start_s);
                Some(starts.fold(0.0, f64::max) * 1000.0)
            }),
            |v: f64| format!("{v:.1}"),
        ),
        (
            "server CPU, whole run (s)",
            From::Timed(|r| r.server_cpu_s),
            secs,
        ),
        (
            "client CPU: share client (s)",
            From::Timed(|r| r.client_cpu_s),
            secs,
        ),
        (
            "client CPU: ccfs daemons (s)",
            From::Timed(|r| r.ccfs_cpu_s),
            secs,
        ),
        ("  CPU window (s)", From::Timed(|r| r.cpu_window_s), secs),
        (
            "share requests, login",
            From::Metered(|r| r.share_login.as_ref().map(|c| c.total as f64)),
            count,
        ),
        (
            "share requests, session",
            From::Metered(|r| r.share_session.as_ref().map(|c| c.total as f64)),
            count,
        ),
        (
            "share requests, logout",
            From::Metered(|r| r.share_logout.as_ref().map(|c| c.total as f64)),
            count,
        ),
        (
            "share writes, login",
            From::Metered(|r| r.share_login.as_ref().map(|c| c.mutating as f64)),
            count,
        ),
        (
            "share writes, session",
            From::Metered(|r| r.share_session.as_ref().map(|c| c.mutating as f64)),
            count,
        ),
        (
            "share writes, logout",
            From::Metered(|r| r.share_logout.as_ref().map(|c| c.mutating as f64)),
            count,
        ),
        (
            "share bytes written, login",
            From::Metered(|r| r.share_login.as_ref().map(|c| c.write_bytes as f64)),
            bytes,
        ),
        (
            "share bytes written, session",
            From::Metered(|r| r.share_session.as_ref().map(|c| c.write_bytes as f64)),
            bytes,
        ),
        (
            "share bytes written, logout",
            From::Metered(|r| r.share_logout.as_ref().map(|c| c.write_bytes as f64)),
            bytes,
        ),
        (
            "share requests, whole run",
            From::Metered(|r| r.share_whole().map(|c| c.total as f64)),
            count,
        ),
        (
            "share writes, whole run",
            From::Metered(|r| r.share_whole().map(|c| c.mutating as f64)),
            count,
        ),
        (
            "share bytes written, whole run",
            From::Metered(|r| r.share_whole().map(|c| c.write_bytes as f64)),
            bytes,
        ),
        (
            "share bytes read, whole run",
            From::Metered(|r| r.share_whole().map(|c| c.read_bytes as f64)),
            bytes,
        ),
        (
            "files not found (per user)",
            From::Timed(|r| per_user(r, |u| u.missing_files)),
            count,
        ),
        (
            "  of which rebuilt (per user)",
            From::Timed(|r| per_user(r, |u| u.rebuilt_files)),
            count,
        ),
    ];
    for (name, from, fmt) in rows {
        let cells: Vec<Option<(f64, f64, f64)>> = modes
            .iter()
            .map(|&m| match &from {
                From::Timed(get) => median_spread(&timed(m).filter_map(get).collect::<Vec<_>>()),
                From::Metered(get) => metered(m).and_then(get).map(|v| (v, v, v)),
            })
            .collect();
        if cells.iter().all(Option::is_none) {
            continue;
        }
        out.push_str(&format!("{name:<38}"));
        for c in &cells {
            let cell = match c {
                None => "-".to_string(),
                Some((m, lo, hi)) if lo < hi => {
                    format!("{} ({}-{})", fmt(*m), fmt(*lo), fmt(*hi))
                }
                Some((m, _, _)) => fmt(*m),
            };
            out.push_str(&format!("{cell:>22}"));
        }
        if let [Some((a, ..)), Some((b, ..))] = cells[..] {
            if a > 0.0 && !name.contains("window") {
                out.push_str(&format!("{:>9.3}", b / a));
            }
        }
        out.push('\n');
    }
    // Where the login's share requests went, from the metered runs.
    for m in &modes {
        let Some(c) = metered(*m).and_then(|r| r.share_login.as_ref()) else {
            continue;
        };
        if c.by_path.is_empty() {
            continue;
        }
        let mut top: Vec<(&String, &u64)> = c.by_path.iter().collect();
        top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        out.push_str(&format!(
            "\nshare requests of the logins {}, by path in the home (all users; the {} most of {}):\n",
            if *m { "with ccfs" } else { "without ccfs" },
            top.len().min(10),
            top.len()
        ));
        for (k, v) in top.into_iter().take(10) {
            out.push_str(&format!("  {v:>9}  {k}\n"));
        }
    }
    for (title, pick) in [
        (
            "login",
            (|r: &StormReport| &r.latency_login) as fn(&StormReport) -> &BTreeMap<_, _>,
        ),
        ("session", |r: &StormReport| &r.latency_session),
    ] {
        // The first timed run of each mode.
        let shown: Vec<&StormReport> = modes.iter().filter_map(|&m| timed(m).next()).collect();
        if shown.iter().all(|r| pick(r).is_empty()) {
            continue;
        }
        out.push_str(&format!(
            "\n{:<30}{:<8}{:>7}{:>8}{:>8}{:>8}\n",
            format!("{title} latency (ms)"),
            "op",
            "count",
            "p50",
            "p99",
            "max"
        ));
        for r in shown {
            for (op, l) in pick(r) {
                out.push_str(&format!(
                    "  {:<28}{op:<8}{:>7}{:>8.2}{:>8.2}{:>8.1}\n",
                    format!("{} #{}", r.mode(), r.run_index + 1),
                    l.count,
                    l.p50_us / 1000.0,
                    l.p99_us / 1000.0,
                    l.max_us / 1000.0
                ));
            }
        }
    }
    for r in runs {
        if let Some(e) = &r.error {
            out.push_str(&format!("\n{}: stopped: {e}\n", r.name()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_uses_nearest_rank_percentiles() {
        let s = Summary::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!((s.p50_s, s.p95_s, s.max_s, s.mean_s), (3.0, 5.0, 5.0, 3.0));
        assert_eq!(Summary::of(&[]), Summary::default());
        let twenty: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(Summary::of(&twenty).p95_s, 19.0);
    }

    #[test]
    fn share_count_deltas_subtract_per_kind() {
        let a = ShareCounts {
            total: 10,
            mutating: 4,
            read_bytes: 100,
            write_bytes: 50,
            by_op: [("write".to_string(), 4), ("lookup".to_string(), 6)].into(),
            by_path: BTreeMap::new(),
        };
        let mut b = a.clone();
        b.total = 15;
        b.mutating = 6;
        b.write_bytes = 80;
        b.by_op.insert("write".into(), 6);
        let d = b.minus(&a);
        assert_eq!(
            (d.total, d.mutating, d.write_bytes, d.read_bytes),
            (5, 2, 30, 0)
        );
        assert_eq!(d.by_op, [("write".to_string(), 2)].into());
    }

    #[test]
    fn counts_by_path_are_taken_relative_to_each_home_and_summed_over_users() {
        let c = |pairs: &[(&str, u64)]| ShareCounts {
            by_path: pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            ..ShareCounts::default()
        };
        let before = c(&[("s/run-1/user000/.mozilla/firefox/p", 5)]);
        let after = c(&[
            ("s/run-1/user000/.mozilla/firefox/p", 8),
            ("s/run-1/user001/.mozilla/firefox/p", 4),
            ("s/run-1/user001", 2),
            ("s/run-1", 1),
            (".", 1),
            ("(unnamed)", 2),
        ]);
        let d = after.minus(&before).by_path_in_homes("s/run-1");
        assert_eq!(
            d.by_path,
            [
                (".mozilla/firefox/p".to_string(), 7),
                (".".to_string(), 2),
                ("(above the homes)".to_string(), 2),
                ("(unnamed)".to_string(), 2),
            ]
            .into()
        );
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

    #[test]
    fn medians_and_spreads() {
        assert_eq!(median_spread(&[]), None);
        assert_eq!(median_spread(&[3.0, 1.0, 2.0]), Some((2.0, 1.0, 3.0)));
        assert_eq!(median_spread(&[4.0, 1.0, 2.0, 3.0]), Some((2.5, 1.0, 4.0)));
    }

    #[test]
    fn the_daemon_pid_comes_from_ccfs_mount_s_line() {
        assert_eq!(
            daemon_pid("ccfs: mounted /s at /m (cache /var/tmp/c (1), pid 4242)\n"),
            Some(4242)
        );
        assert_eq!(daemon_pid("something else\n"), None);
    }

    #[test]
    fn pid_files_are_read_or_refused_by_line() {
        let d = tempfile::tempdir().expect("tmp");
        let f = d.path().join("pids");
        std::fs::write(&f, "12 345 glusterd\n\n67\n").expect("write");
        assert_eq!(read_pids_file(&f), Ok(vec![12, 67]));
        std::fs::write(&f, "12\nglusterd 3\n").expect("write");
        let e = read_pids_file(&f).expect_err("refused");
        assert!(
            e.contains("\"glusterd 3\" does not start with a process id"),
            "{e}"
        );
    }

    #[test]
    fn cpu_seconds_reads_this_process() {
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_add(1);
        }
        assert!(x > 0);
        assert!(cpu_seconds(&[std::process::id()]) > 0.0);
        assert_eq!(cpu_seconds(&[u32::MAX]), 0.0);
    }

    /// A storm of two timed runs a mode and a metered run a mode, with every row's value
    /// present somewhere, by-path counts, latencies and a stopped run.
    fn table_fixture() -> Vec<StormReport> {
        let lat = |count, p50: f64| LatencyReport {
            count,
            mean_us: p50,
            p50_us: p50,
            p90_us: p50 * 2.0,
            p99_us: p50 * 3.0,
            p999_us: p50 * 4.0,
            max_us: p50 * 10.0,
        };
        let counts = |k: u64| ShareCounts {
            total: 100 * k,
            mutating: 10 * k,
            read_bytes: 3_000_000 * k,
            write_bytes: 1_500_000 * k,
            by_op: BTreeMap::new(),
            by_path: [
                (".mozilla/firefox/p".to_string(), 40 * k),
                (".".to_string(), 7 * k),
                (".config".to_string(), 40 * k),
            ]
            .into(),
        };
        let user = |u: usize, login_s: f64, with_ccfs: bool| UserResult {
            user: u,
            mount_s: if with_ccfs { 0.1 * (u + 1) as f64 } else { 0.0 },
            login_s,
            session_ticks: 2,
            logout_s: login_s / 2.0,
            bytes_written: 1000,
            missing_files: 3 + u as u64,
            rebuilt_files: u as u64,
            ccfs_cpu_s: with_ccfs.then_some(0.25),
            session_latency: BTreeMap::new(),
            error: None,
            start_s: 0.001 * u as f64,
        };
        let run = |with_ccfs: bool, metered: bool, run_index: usize, k: f64| {
            let per_user = vec![user(0, 1.0 * k, with_ccfs), user(1, 2.0 * k, with_ccfs)];
            let of = |f: fn(&UserResult) -> f64| {
                Summary::of(&per_user.iter().map(f).collect::<Vec<_>>())
            };
            let c = |i: u64| metered.then(|| counts(i + u64::from(with_ccfs)));
            StormReport {
                schema: SCHEMA.into(),
                tool: "loadgen".into(),
                version: "0".into(),
                started_at_unix: 0,
                label: None,
                share: "/mnt/share".into(),
                environment: Environment {
                    fs_type: "fuse.glusterfs".into(),
                    fs_magic: "0x65735546".into(),
                    mount_point: "/mnt/share".into(),
                    mount_source: "h:/v".into(),
                    mount_options: "rw".into(),
                    kernel: "6.1".into(),
                    cpus: 2,
                    hostname: "h".into(),
                },
                users: 2,
                with_ccfs,
                metered,
                run_index,
                baseline: Baseline::Fair,
                session_s: 30.0,
                profile: "desktop".into(),
                returning_users: with_ccfs,
                settled: Settled::default(),
                time_to_login: of(|u| u.login_s),
                logout: of(|u| u.logout_s),
                login_plus_logout: of(|u| u.login_s + u.logout_s),
                latency_login: [("open".to_string(), lat(10, 1500.0 * k))].into(),
                latency_session: if with_ccfs {
                    [("stat".to_string(), lat(4, 250.0))].into()
                } else {
                    BTreeMap::new()
                },
                share_login: c(1),
                share_session: c(2),
                share_logout: c(3),
                server_cpu_s: (!metered).then_some(1.5 * k),
                client_cpu_s: (!metered && !with_ccfs).then_some(0.75 * k),
                ccfs_cpu_s: (with_ccfs && !metered).then_some(0.5),
                cpu_window_s: (!metered).then_some(10.0),
                complete: true,
                error: None,
                per_user,
            }
        };
        let mut runs = vec![
            run(false, false, 0, 1.0),
            run(true, false, 1, 0.5),
            run(true, false, 2, 0.6),
            run(false, false, 3, 1.2),
            run(false, true, 4, 1.0),
            run(true, true, 5, 0.5),
        ];
        runs[5].error = Some("user001: logout: no space".into());
        runs[5].label = Some("lab".into());
        runs
    }

    #[test]
    fn the_table_compares_the_modes_row_by_row() {
        assert_eq!(table(&table_fixture()), TWO_MODES);
    }

    #[test]
    fn a_table_of_one_mode_has_no_ratio_and_leaves_out_rows_without_values() {
        let one: Vec<StormReport> = table_fixture()
            .into_iter()
            .filter(|r| !r.with_ccfs && !r.metered)
            .collect();
        assert_eq!(table(&one), ONE_MODE);
        assert_eq!(table(&[]), "");
    }

    /// The table of [`table_fixture`].
    const TWO_MODES: &str = r#"loadgen login-storm: 2 users on /mnt/share (fuse.glusterfs), session 30 s, profile desktop
baseline: fair (without ccfs, .cache on the workstation's disk); first logins (workstations never used)
times: median (min-max) of 2 timed run(s) a mode, order ABBA (A without ccfs, B with); counts: one more run a mode through the share meter

                                                without ccfs             with ccfs    ratio
time to login p50 (s)                       1.10 (1.00-1.20)      0.55 (0.50-0.60)    0.500
time to login p95 (s)                       2.20 (2.00-2.40)      1.10 (1.00-1.20)    0.500
time to login max (s)                       2.20 (2.00-2.40)      1.10 (1.00-1.20)    0.500
  of which ccfs mount p50 (s)                              -                  0.10
logout p50 (s)                              0.55 (0.50-0.60)      0.28 (0.25-0.30)    0.500
logout max (s)                              1.10 (1.00-1.20)      0.55 (0.50-0.60)    0.500
login + logout p50 (s)                      1.65 (1.50-1.80)      0.82 (0.75-0.90)    0.500
users' start spread (ms)                                 1.0                   1.0    1.000
server CPU, whole run (s)                   1.65 (1.50-1.80)      0.82 (0.75-0.90)    0.500
client CPU: share client (s)                0.82 (0.75-0.90)                     -
client CPU: ccfs daemons (s)                               -                  0.50
  CPU window (s)                                       10.00                 10.00
share requests, login                                    100                   200    2.000
share requests, session                                  200                   300    1.500
share requests, logout                                   300                   400    1.333
share writes, login                                       10                    20    2.000
share writes, session                                     20                    30    1.500
share writes, logout                                      30                    40    1.333
share bytes written, login                            1.5 MB                3.0 MB    2.000
share bytes written, session                          3.0 MB                4.5 MB    1.500
share bytes written, logout                           4.5 MB                6.0 MB    1.333
share requests, whole run                                600                   900    1.500
share writes, whole run                                   60                    90    1.500
share bytes written, whole run                        9.0 MB               13.5 MB    1.500
share bytes read, whole run                          18.0 MB               27.0 MB    1.500
files not found (per user)                                 4                     4    1.000
  of which rebuilt (per user)                              0                     0    1.000

share requests of the logins without ccfs, by path in the home (all users; the 3 most of 3):
         40  .config
         40  .mozilla/firefox/p
          7  .

share requests of the logins with ccfs, by path in the home (all users; the 3 most of 3):
         80  .config
         80  .mozilla/firefox/p
         14  .

login latency (ms)            op        count     p50     p99     max
  without ccfs #1             open         10    1.50    4.50    15.0
  with ccfs #2                open         10    0.75    2.25     7.5

session latency (ms)          op        count     p50     p99     max
  with ccfs #2                stat          4    0.25    0.75     2.5

lab, with ccfs, metered: stopped: user001: logout: no space
"#;

    /// The table of [`table_fixture`]'s timed runs without ccfs.
    const ONE_MODE: &str = r#"loadgen login-storm: 2 users on /mnt/share (fuse.glusterfs), session 30 s, profile desktop
baseline: fair (without ccfs, .cache on the workstation's disk); first logins (workstations never used)
times: median (min-max) of 2 timed run(s) a mode, order AA (A without ccfs, B with); counts: none (--no-meter)

                                                without ccfs
time to login p50 (s)                       1.10 (1.00-1.20)
time to login p95 (s)                       2.20 (2.00-2.40)
time to login max (s)                       2.20 (2.00-2.40)
logout p50 (s)                              0.55 (0.50-0.60)
logout max (s)                              1.10 (1.00-1.20)
login + logout p50 (s)                      1.65 (1.50-1.80)
users' start spread (ms)                                 1.0
server CPU, whole run (s)                   1.65 (1.50-1.80)
client CPU: share client (s)                0.82 (0.75-0.90)
  CPU window (s)                                       10.00
files not found (per user)                                 4
  of which rebuilt (per user)                              0

login latency (ms)            op        count     p50     p99     max
  without ccfs #1             open         10    1.50    4.50    15.0
"#;
}
