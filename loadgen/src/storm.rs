//! `loadgen login-storm`: a class logs in at once, with or without ccfs.
//!
//! N homes are prepared on the share (untimed). Every user then starts together behind a
//! barrier: with ccfs, the home is first mounted through its own ccfs (own cache and mount
//! point, as on separate workstations); then the login burst, the session (the model's
//! periodic actions), and the logout (with ccfs: `ccfs umount`, which syncs the cache
//! back). What reaches the share is counted at the share side by a meter: a ccfs mount in
//! front of the share that caches nothing and counts every request it serves.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::engine::Latencies;
use crate::login::{Actor, Profile};
use crate::report::{latency_report, Environment, LatencyReport};

pub const SCHEMA: &str = "loadgen-login-storm/1";

/// How to run one storm.
#[derive(Debug, Clone)]
pub struct StormConfig {
    pub share: PathBuf,
    pub users: usize,
    pub with_ccfs: bool,
    pub session: Duration,
    pub profile: Arc<Profile>,
    pub profile_name: String,
    /// The ccfs binary.
    pub ccfs: PathBuf,
    /// Scratch space for mount points and the workstations' caches (local disk).
    pub work: PathBuf,
    /// Count at the share side through a metering ccfs mount.
    pub meter: bool,
    /// A ccfs configuration file for the users' mounts (default: ccfs's defaults).
    pub ccfs_config: Option<PathBuf>,
    /// With ccfs: each workstation's cache already holds the user's local-only files from
    /// an earlier session (else: a first login on every workstation).
    pub returning_users: bool,
    /// Server processes whose CPU time is measured.
    pub server_pids: Vec<u32>,
    pub keep: bool,
    pub label: Option<String>,
}

/// Requests that reached the share (from the meter).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareCounts {
    pub total: u64,
    pub mutating: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub by_op: BTreeMap<String, u64>,
}

impl ShareCounts {
    fn minus(&self, before: &ShareCounts) -> ShareCounts {
        let mut by_op = BTreeMap::new();
        for (k, v) in &self.by_op {
            let d = v.saturating_sub(before.by_op.get(k).copied().unwrap_or(0));
            if d > 0 {
                by_op.insert(k.clone(), d);
            }
        }
        ShareCounts {
            total: self.total.saturating_sub(before.total),
            mutating: self.mutating.saturating_sub(before.mutating),
            read_bytes: self.read_bytes.saturating_sub(before.read_bytes),
            write_bytes: self.write_bytes.saturating_sub(before.write_bytes),
            by_op,
        }
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
    /// This user's operation latencies during the session.
    #[serde(default)]
    pub session_latency: BTreeMap<String, LatencyReport>,
    pub error: Option<String>,
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

/// One storm's results (JSON schema `loadgen-login-storm/1`).
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
    pub session_s: f64,
    pub profile: String,
    /// With ccfs: the workstations' caches held the users' local-only files already.
    #[serde(default)]
    pub returning_users: bool,
    pub time_to_login: Summary,
    pub logout: Summary,
    pub per_user: Vec<UserResult>,
    pub latency_login: BTreeMap<String, LatencyReport>,
    pub latency_session: BTreeMap<String, LatencyReport>,
    /// What reached the share from the barrier to the end of the sessions.
    pub share_login_session: Option<ShareCounts>,
    /// What reached the share during the logouts.
    pub share_logout: Option<ShareCounts>,
    /// CPU seconds of the given server processes, login to end of logout.
    pub server_cpu_s: Option<f64>,
    pub complete: bool,
    pub error: Option<String>,
}

impl StormReport {
    pub fn name(&self) -> String {
        let mode = if self.with_ccfs {
            "with ccfs"
        } else {
            "without ccfs"
        };
        match &self.label {
            Some(l) => format!("{l}, {mode}"),
            None => mode.to_string(),
        }
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
    mounted: bool,
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
            mounted: true,
        })
    }

    /// `ccfs umount` (which syncs). The other users' threads start processes all the time,
    /// and a child between fork and exec briefly holds this user's open files: a busy
    /// mount is tried again. The mount counts as gone only once it is.
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
            if !err.contains("busy") || tries == 20 {
                return Err(format!(
                    "ccfs umount {} failed: {}",
                    self.mnt.display(),
                    err.trim()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
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

/// CPU seconds (user + system) of the processes, those still alive.
pub fn cpu_seconds(pids: &[u32]) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
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

/// The meter's configuration: nothing cached, one FUSE thread a user (so that it never
/// queues the users' requests behind each other).
fn relay_config(users: usize) -> String {
    format!(
        "# loadgen login-storm's share meter: caches nothing, counts every request and\n\
         # every byte (no kernel passthrough: the data goes through the daemon).\n\
         [paths]\ndotfiles_cached = false\nlocal_only = []\n[sync]\ninterval_secs = 0\n\
         [mount]\nthreads = {}\nkernel_passthrough = false\n",
        users.clamp(4, 256)
    )
}

/// Runs one storm per entry of `modes` (with ccfs or not), in order, on homes prepared
/// once: a later storm finds the homes as the earlier one's logout left them (the class
/// logging in again the next day). `on_run` gets the reports so far after each storm.
/// Errors before the users start are returned; a user's failure is in its result and in
/// the report's `error`.
pub fn run(
    cfg: &StormConfig,
    modes: &[bool],
    mut on_run: impl FnMut(&[StormReport]),
) -> Result<Vec<StormReport>, String> {
    let stamp = format!("{}-{}", now_unix(), std::process::id());
    let run_name = format!("loadgen-storm-{stamp}");
    let run_on_share = cfg.share.join(&run_name);
    std::fs::create_dir(&run_on_share)
        .map_err(|e| format!("cannot create {}: {e}", run_on_share.display()))?;
    std::fs::write(
        run_on_share.join(".loadgen-run"),
        "{\"tool\":\"loadgen\"}\n",
    )
    .map_err(|e| format!("cannot write in {}: {e}", run_on_share.display()))?;
    let mut reports = Vec::new();
    let mut result = prepare(cfg, &run_on_share);
    if result.is_ok() {
        for (i, &with_ccfs) in modes.iter().enumerate() {
            if interrupted() {
                break;
            }
            let work = cfg.work.join(format!("storm-{stamp}-{i}"));
            if let Err(e) = std::fs::create_dir_all(&work) {
                result = Err(format!("mkdir {}: {e}", work.display()));
                break;
            }
            let c = StormConfig {
                with_ccfs,
                ..cfg.clone()
            };
            match run_in(&c, &run_on_share, &run_name, &work) {
                Ok(mut r) => {
                    match r.error.as_mut() {
                        // A user's failed logout leaves its unsynced changes in its cache,
                        // and the caches hold the daemons' logs: they stay (but after
                        // Ctrl-C, which asks for everything to go).
                        Some(e) if !interrupted() => e.push_str(&format!(
                            " (the run's mount points and caches are kept in {})",
                            work.display()
                        )),
                        _ => {
                            let _ = std::fs::remove_dir_all(&work);
                        }
                    }
                    reports.push(r);
                    on_run(&reports);
                }
                Err(e) => {
                    // What a failed logout left unsynced (and the caches' logs) stays
                    // where the error says.
                    result = Err(format!(
                        "{e} (the run's mount points and caches are kept in {})",
                        work.display()
                    ));
                    break;
                }
            }
        }
    }
    if !cfg.keep {
        let _ = std::fs::remove_dir_all(&run_on_share);
    }
    result.map(|()| reports)
}

/// The homes, straight on the share (untimed, not metered).
fn prepare(cfg: &StormConfig, run_on_share: &Path) -> Result<(), String> {
    let prep: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..cfg.users)
            .map(|u| {
                s.spawn(move || {
                    let home = run_on_share.join(format!("user{u:03}"));
                    std::fs::create_dir(&home).map_err(|e| e.to_string())?;
                    Actor::new(home, u as u64 + 1)
                        .prepare(&cfg.profile)
                        .map_err(|e| format!("preparing user{u:03}: {e}"))
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
    sync_path(run_on_share);
    Ok(())
}

fn run_in(
    cfg: &StormConfig,
    run_on_share: &Path,
    run_name: &str,
    work: &Path,
) -> Result<StormReport, String> {
    // The meter in front of the share.
    let relay = if cfg.meter {
        let conf = work.join("meter.toml");
        std::fs::write(&conf, relay_config(cfg.users)).map_err(|e| e.to_string())?;
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
        Some(r) => r.mnt.join(run_name),
        None => run_on_share.to_path_buf(),
    };
    let n = cfg.users;
    let ready = Barrier::new(n + 1);
    let start = Barrier::new(n + 1);
    let sessions_done = Barrier::new(n + 1);
    let logouts_done = Barrier::new(n + 1);
    let results: Mutex<Vec<(UserResult, Latencies, Latencies)>> = Mutex::new(Vec::new());
    let counts = |r: &Option<CcfsMount>| r.as_ref().map(CcfsMount::counts).transpose();
    let mut c0 = None;
    let mut c1 = None;
    let mut c2 = None;
    let mut cpu = (0.0, 0.0);
    let mut meter_err = None;
    std::thread::scope(|s| {
        for u in 0..n {
            let gates = Gates {
                ready: &ready,
                start: &start,
                sessions_done: &sessions_done,
                logouts_done: &logouts_done,
            };
            let results = &results;
            let share_home = share_view.join(format!("user{u:03}"));
            s.spawn(move || {
                let r = user(cfg, u, &share_home, work, &gates);
                if let Ok(mut g) = results.lock() {
                    g.push(r);
                }
            });
        }
        let mut snap = |slot: &mut Option<ShareCounts>| match counts(&relay) {
            Ok(c) => *slot = c,
            Err(e) => meter_err = Some(e),
        };
        ready.wait();
        snap(&mut c0);
        cpu.0 = cpu_seconds(&cfg.server_pids);
        start.wait();
        sessions_done.wait();
        snap(&mut c1);
        logouts_done.wait();
        snap(&mut c2);
        cpu.1 = cpu_seconds(&cfg.server_pids);
    });
    drop(relay);
    let mut rs = results.into_inner().unwrap_or_default();
    rs.sort_by_key(|r| r.0.user);
    let mut lat_login = Latencies::new();
    let mut lat_session = Latencies::new();
    for (_, l, s) in &rs {
        lat_login.merge(l);
        lat_session.merge(s);
    }
    let per_user: Vec<UserResult> = rs.into_iter().map(|r| r.0).collect();
    let error = per_user
        .iter()
        .find_map(|u| u.error.as_ref().map(|e| format!("user{:03}: {e}", u.user)))
        .or(meter_err);
    let logins: Vec<f64> = per_user.iter().map(|u| u.login_s).collect();
    let logouts: Vec<f64> = per_user.iter().map(|u| u.logout_s).collect();
    let delta = |a: &Option<ShareCounts>, b: &Option<ShareCounts>| match (a, b) {
        (Some(a), Some(b)) => Some(b.minus(a)),
        _ => None,
    };
    Ok(StormReport {
        schema: SCHEMA.into(),
        tool: "loadgen".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        started_at_unix: now_unix(),
        label: cfg.label.clone(),
        share: cfg.share.display().to_string(),
        environment: Environment::probe(&crate::store::Target::Local(cfg.share.clone())),
        users: n,
        with_ccfs: cfg.with_ccfs,
        session_s: cfg.session.as_secs_f64(),
        profile: cfg.profile_name.clone(),
        returning_users: cfg.with_ccfs && cfg.returning_users,
        time_to_login: Summary::of(&logins),
        logout: Summary::of(&logouts),
        complete: error.is_none() && per_user.len() == n,
        error,
        per_user,
        latency_login: latency_report(&lat_login),
        latency_session: latency_report(&lat_session),
        share_login_session: delta(&c0, &c1),
        share_logout: delta(&c1, &c2),
        server_cpu_s: (!cfg.server_pids.is_empty()).then_some(cpu.1 - cpu.0),
    })
}

fn sync_path(p: &Path) {
    use std::os::fd::AsRawFd;
    if let Ok(d) = std::fs::File::open(p) {
        // SAFETY: syncfs on an open descriptor.
        unsafe { libc::syncfs(d.as_raw_fd()) };
    }
}

/// The barriers every user passes, in this order.
struct Gates<'a> {
    /// Untimed preparation done (the share counters are read after it).
    ready: &'a Barrier,
    start: &'a Barrier,
    sessions_done: &'a Barrier,
    logouts_done: &'a Barrier,
}

/// A returning user: the local-only files of an earlier session on this workstation are
/// made through a ccfs mount with this user's cache, which keeps them after unmounting.
fn warm_up(
    cfg: &StormConfig,
    u: usize,
    share_home: &Path,
    mnt: &Path,
    cache: &Path,
) -> Result<(), String> {
    let mut m = CcfsMount::mount(
        &cfg.ccfs,
        share_home,
        mnt,
        cache,
        cfg.ccfs_config.as_deref(),
    )?;
    let made = Actor::new(mnt.to_path_buf(), 5000 + u as u64)
        .prepare_missing(&cfg.profile)
        .map_err(|e| format!("warming the cache: {e}"));
    let unmounted = m.umount();
    made?;
    unmounted
}

/// One user's login, session and logout. Always passes every barrier.
fn user(
    cfg: &StormConfig,
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
        session_latency: BTreeMap::new(),
        error: None,
    };
    let mut session_lat = Latencies::new();
    let mnt = work.join(format!("home/user{u:03}"));
    let cache = work.join(format!("cache/user{u:03}"));
    if cfg.with_ccfs && cfg.returning_users {
        if let Err(e) = warm_up(cfg, u, share_home, &mnt, &cache) {
            r.error = Some(e);
        }
    }
    gates.ready.wait();
    gates.start.wait();
    let t0 = Instant::now();
    let mut mount = None;
    let failed = |r: UserResult, session_lat| {
        gates.sessions_done.wait();
        gates.logouts_done.wait();
        (r, Latencies::new(), session_lat)
    };
    if r.error.is_some() {
        return failed(r, session_lat);
    }
    let home = if cfg.with_ccfs {
        match CcfsMount::mount(
            &cfg.ccfs,
            share_home,
            &mnt,
            &cache,
            cfg.ccfs_config.as_deref(),
        ) {
            Ok(m) => {
                mount = Some(m);
                mnt
            }
            Err(e) => {
                r.error = Some(e);
                return failed(r, session_lat);
            }
        }
    } else {
        share_home.to_path_buf()
    };
    if cfg.with_ccfs {
        r.mount_s = t0.elapsed().as_secs_f64();
    }
    let mut actor = Actor::new(home, 1000 + u as u64);
    let login = actor.play(&cfg.profile.login, 0);
    r.login_s = t0.elapsed().as_secs_f64();
    let login_lat = std::mem::take(&mut actor.lat);
    if let Err(e) = login {
        r.error = Some(format!("login: {e}"));
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
    }
    r.logout_s = t1.elapsed().as_secs_f64();
    r.bytes_written = actor.tally.bytes_written;
    r.missing_files = actor.tally.missing;
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
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installing a handler that only stores to an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

/// The comparison table (one column per storm, a ratio column for two).
pub fn table(runs: &[StormReport]) -> String {
    let mut out = String::new();
    if let Some(r) = runs.first() {
        out.push_str(&format!(
            "loadgen login-storm: {} users on {} ({}), session {} s, profile {}\n\n",
            r.users, r.share, r.environment.fs_type, r.session_s, r.profile
        ));
    }
    let names: Vec<String> = runs
        .iter()
        .map(|r| {
            if r.with_ccfs {
                "with ccfs"
            } else {
                "without ccfs"
            }
            .to_string()
        })
        .collect();
    out.push_str(&format!("{:<34}", ""));
    for n in &names {
        out.push_str(&format!("{n:>14}"));
    }
    if runs.len() == 2 {
        out.push_str(&format!("{:>10}", "ratio"));
    }
    out.push('\n');
    type Row = (
        &'static str,
        fn(&StormReport) -> Option<f64>,
        fn(f64) -> String,
    );
    let secs = |v: f64| format!("{v:.2}");
    let count = |v: f64| format!("{v:.0}");
    let bytes = |v: f64| mb(v as u64);
    let rows: [Row; 13] = [
        (
            "time to login p50 (s)",
            |r| Some(r.time_to_login.p50_s),
            secs,
        ),
        (
            "time to login p95 (s)",
            |r| Some(r.time_to_login.p95_s),
            secs,
        ),
        (
            "time to login max (s)",
            |r| Some(r.time_to_login.max_s),
            secs,
        ),
        (
            "  of which ccfs mount p50 (s)",
            |r| Some(Summary::of(&r.per_user.iter().map(|u| u.mount_s).collect::<Vec<_>>()).p50_s),
            secs,
        ),
        ("logout p50 (s)", |r| Some(r.logout.p50_s), secs),
        ("logout max (s)", |r| Some(r.logout.max_s), secs),
        (
            "share requests, login+session",
            |r| r.share_login_session.as_ref().map(|c| c.total as f64),
            count,
        ),
        (
            "share writes, login+session",
            |r| r.share_login_session.as_ref().map(|c| c.mutating as f64),
            count,
        ),
        (
            "share bytes written, login+session",
            |r| r.share_login_session.as_ref().map(|c| c.write_bytes as f64),
            bytes,
        ),
        (
            "share writes, logout",
            |r| r.share_logout.as_ref().map(|c| c.mutating as f64),
            count,
        ),
        (
            "share bytes written, logout",
            |r| r.share_logout.as_ref().map(|c| c.write_bytes as f64),
            bytes,
        ),
        ("server CPU (s)", |r| r.server_cpu_s, secs),
        (
            "files not found (per user)",
            |r| {
                let n = r.per_user.len().max(1) as f64;
                Some(r.per_user.iter().map(|u| u.missing_files).sum::<u64>() as f64 / n)
            },
            count,
        ),
    ];
    for (name, get, fmt) in rows {
        let vals: Vec<Option<f64>> = runs.iter().map(get).collect();
        if vals.iter().all(Option::is_none) {
            continue;
        }
        out.push_str(&format!("{name:<34}"));
        for v in &vals {
            out.push_str(&format!("{:>14}", v.map(fmt).unwrap_or_else(|| "-".into())));
        }
        if let [Some(a), Some(b)] = vals[..] {
            if a > 0.0 {
                out.push_str(&format!("{:>10.3}", b / a));
            }
        }
        out.push('\n');
    }
    for (title, pick) in [
        (
            "login",
            (|r: &StormReport| &r.latency_login) as fn(&StormReport) -> &BTreeMap<_, _>,
        ),
        ("session", |r: &StormReport| &r.latency_session),
    ] {
        if runs.iter().all(|r| pick(r).is_empty()) {
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
        for (name, r) in names.iter().zip(runs) {
            for (op, l) in pick(r) {
                out.push_str(&format!(
                    "  {name:<28}{op:<8}{:>7}{:>8.2}{:>8.2}{:>8.1}\n",
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
}
