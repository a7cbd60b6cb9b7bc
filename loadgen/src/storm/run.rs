//! One storm: the homes prepared, the meter mounted (metered runs), then every user at
//! once behind the barriers, login, session and logout, and the run's report.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Instant;

use super::mount::CcfsMount;
use super::prepare::{actor, prepare_user, settle, Workstation};
use super::procs::{cpu_seconds, read_pids_file, read_server_counts};
use super::progress::{Phase, PROGRESS};
use super::{
    interrupted, now_unix, relay_config, sleep_until, RunSpec, ServerCounts, Settled, ShareCounts,
    StormConfig, StormReport, Summary, UserResult, PATH_DEPTH, SCHEMA,
};
use crate::engine::Latencies;
use crate::login::Actor;
use crate::report::{latency_report, Environment};

/// A gate of a run where the users wait for every machine of the class: a host of a
/// multi-host storm tells its coordinator and waits for the word to go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// The users prepared, before the meter and the CPU are read and they go.
    Start,
    /// Every session over, before any logout.
    SessionsDone,
    /// Every user logged out.
    LogoutsDone,
}

/// What a run does at each [`Gate`] besides its own users' barriers.
pub trait Hook: Sync {
    /// Returns once the class may go on; false: stop (the run ends as interrupted).
    fn at(&self, gate: Gate) -> bool;
}

/// A class on one machine: nothing to wait for.
pub(super) struct NoHook;

impl Hook for NoHook {
    fn at(&self, _: Gate) -> bool {
        true
    }
}

/// One run of the class on homes of its own (`homes`, below the share's root), its
/// scratch space in `work`; `hook` at each gate.
pub fn one_run(
    cfg: &StormConfig,
    spec: RunSpec,
    index: usize,
    homes: &str,
    work: &Path,
    hook: &dyn Hook,
) -> Result<StormReport, String> {
    let homes_on_share = cfg.share.join(homes);
    std::fs::create_dir(&homes_on_share)
        .map_err(|e| format!("cannot create {}: {e}", homes_on_share.display()))?;
    // The meter in front of the share, mounted before the homes are prepared through it:
    // a ccfs mount numbers the inodes it shows itself, and a returning user's cache must
    // have met the share's files under the numbers the run shows (as a real share's
    // client keeps them). The share's client is mounted afresh before the meter, not
    // under it.
    let relay = if spec.metered {
        Some(mount_meter(cfg, homes, work)?)
    } else {
        None
    };
    let share_view = match &relay {
        Some(r) => r.mnt.join(homes),
        None => homes_on_share.clone(),
    };
    prepare_users(cfg, spec, &share_view, work)?;
    PROGRESS.set_phase(Phase::Settling);
    let settled = settle(cfg, relay.is_none())?;
    let client_pids = match &cfg.client_pids_file {
        Some(f) => read_pids_file(f)?,
        None => Vec::new(),
    };
    let any_pids = !cfg.server_pids.is_empty() || !client_pids.is_empty();
    let measure_cpu = !spec.metered && any_pids;
    let played = play(
        cfg,
        spec,
        &share_view,
        work,
        &Meter {
            relay: relay.as_ref(),
            client_pids: &client_pids,
            measure_cpu,
        },
        hook,
    );
    // The meter's unmount failing (a process kept it busy) is the run's error: its
    // scratch space then stays, and nothing removes it through the mount.
    let meter_left = relay.map(|mut r| r.umount()).transpose().err();
    let mut r = report(cfg, spec, index, homes, settled, played);
    if let Some(e) = meter_left {
        let e = format!("the share meter could not be unmounted: {e}");
        r.error = Some(match r.error.take() {
            Some(first) => format!("{first}; {e}"),
            None => e,
        });
    }
    Ok(r)
}

/// Settles the machine (the share's client mounted afresh) and mounts the meter in front
/// of the share, counting by path down to the homes' kept components.
fn mount_meter(cfg: &StormConfig, homes: &str, work: &Path) -> Result<CcfsMount, String> {
    settle(cfg, true)?;
    let conf = work.join("meter.toml");
    // The meter's paths: the homes' components, the user's directory, then those kept.
    let depth = Path::new(homes).components().count() + 1 + PATH_DEPTH;
    std::fs::write(&conf, relay_config(cfg.users, depth)).map_err(|e| e.to_string())?;
    CcfsMount::mount(
        &cfg.ccfs,
        &cfg.share,
        &work.join("meter"),
        &work.join("meter-cache"),
        Some(&conf),
    )
}

/// Prepares every user's home (and workstation) at once, a thread a user; the first
/// user's error, if any.
fn prepare_users(
    cfg: &StormConfig,
    spec: RunSpec,
    share_view: &Path,
    work: &Path,
) -> Result<(), String> {
    let prep: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (cfg.user_base..cfg.user_base + cfg.users)
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
    match prep.into_iter().find_map(Result::err) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// What the run reads besides the users: the meter's counts, and the CPU of the given
/// processes.
struct Meter<'a> {
    relay: Option<&'a CcfsMount>,
    client_pids: &'a [u32],
    measure_cpu: bool,
}

/// A user's result and latencies (login, session), with when it started.
type UserPlayed = ((UserResult, Latencies, Latencies), Option<Instant>);

/// What a run of the class gave.
struct Played {
    users: Vec<UserPlayed>,
    /// The meter's counts before the start, after the logins (metered runs), after the
    /// sessions and after the logouts.
    snaps: [Option<ShareCounts>; 4],
    /// The server's own counters before the start, after the sessions and after the
    /// logouts (`--server-counts`).
    server: [Option<ServerCounts>; 3],
    /// CPU seconds of the server's and the client's processes over the window, when
    /// measured.
    server_cpu_s: Option<f64>,
    client_cpu_s: Option<f64>,
    /// The CPU window's length, when measured.
    window: Option<f64>,
    meter_err: Option<String>,
}

/// Every gate of a run, owned.
struct Barriers {
    start: Barrier,
    at_gate: AtomicUsize,
    go: AtomicBool,
    logins_done: Barrier,
    sessions_done: Barrier,
    logout_go: Barrier,
    logouts_done: Barrier,
}

impl Barriers {
    /// Gates for `n` users and the thread that conducts them.
    fn new(n: usize) -> Self {
        Self {
            start: Barrier::new(n + 1),
            at_gate: AtomicUsize::new(0),
            go: AtomicBool::new(false),
            logins_done: Barrier::new(n + 1),
            sessions_done: Barrier::new(n + 1),
            logout_go: Barrier::new(n + 1),
            logouts_done: Barrier::new(n + 1),
        }
    }

    /// A user's view of them (the logins' barrier in metered runs only).
    fn gates(&self, metered: bool) -> Gates<'_> {
        Gates {
            start: &self.start,
            at_gate: &self.at_gate,
            go: &self.go,
            logins_done: metered.then_some(&self.logins_done),
            sessions_done: &self.sessions_done,
            logout_go: &self.logout_go,
            logouts_done: &self.logouts_done,
        }
    }
}

/// Plays the class: a thread a user, while this one reads the meter and the CPU at each
/// gate.
fn play(
    cfg: &StormConfig,
    spec: RunSpec,
    share_view: &Path,
    work: &Path,
    meter: &Meter,
    hook: &dyn Hook,
) -> Played {
    let n = cfg.users;
    let barriers = Barriers::new(n);
    let results: Mutex<Vec<UserPlayed>> = Mutex::new(Vec::new());
    crate::login::NOT_STARTED.store(n, Ordering::Relaxed);
    let mut played = std::thread::scope(|s| {
        for u in cfg.user_base..cfg.user_base + n {
            let gates = barriers.gates(spec.metered);
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
        conduct(cfg, spec, &barriers, meter, hook)
    });
    played.users = results.into_inner().unwrap_or_default();
    played
}

/// The conducting thread's part: the meter's counts and the CPU before the start, every
/// user released at once, the counts at each later gate, and the CPU at the end of the
/// window.
fn conduct(
    cfg: &StormConfig,
    spec: RunSpec,
    b: &Barriers,
    meter: &Meter,
    hook: &dyn Hook,
) -> Played {
    let n = cfg.users;
    let mut played = Played {
        users: Vec::new(),
        snaps: Default::default(),
        server: Default::default(),
        server_cpu_s: None,
        client_cpu_s: None,
        window: None,
        meter_err: None,
    };
    let cpu_now = || {
        (
            cpu_seconds(&cfg.server_pids),
            cpu_seconds(meter.client_pids),
        )
    };
    let snap = |p: &mut Played, i: usize| match meter.relay.map(CcfsMount::counts).transpose() {
        Ok(c) => p.snaps[i] = c,
        Err(e) => p.meter_err = Some(e),
    };
    let server_snap = |p: &mut Played, i: usize| {
        if let Some(cmd) = &cfg.server_counts {
            match read_server_counts(cmd) {
                Ok(c) => p.server[i] = Some(c),
                Err(e) => p.meter_err = Some(e),
            }
        }
    };
    let stopped = |go_on: bool| {
        if !go_on {
            crate::stop::INTERRUPTED.store(true, Ordering::Relaxed);
        }
    };
    // Every machine of the class ready (the users wait at the start barrier meanwhile).
    stopped(hook.at(Gate::Start));
    let mut cpu = [(0.0, 0.0); 2];
    snap(&mut played, 0);
    server_snap(&mut played, 0);
    cpu[0] = cpu_now();
    b.start.wait();
    // Every user past the barrier (each now only yields), then all go at once.
    while b.at_gate.load(Ordering::SeqCst) < n {
        std::thread::yield_now();
    }
    PROGRESS.set_phase(Phase::Login);
    b.go.store(true, Ordering::Release);
    let t0 = Instant::now();
    if spec.metered {
        b.logins_done.wait();
        snap(&mut played, 1);
    }
    b.sessions_done.wait();
    // The counts of the sessions' end read before any logout starts.
    snap(&mut played, 2);
    server_snap(&mut played, 1);
    stopped(hook.at(Gate::SessionsDone));
    PROGRESS.set_phase(Phase::Logout);
    b.logout_go.wait();
    b.logouts_done.wait();
    snap(&mut played, 3);
    server_snap(&mut played, 2);
    stopped(hook.at(Gate::LogoutsDone));
    if meter.measure_cpu {
        if let Some(w) = cfg.cpu_window {
            PROGRESS.set_phase(Phase::CpuWindow);
            sleep_until(t0 + w);
        }
        cpu[1] = cpu_now();
        played.window = Some(t0.elapsed().as_secs_f64());
    }
    let measured = |pids: &[u32]| meter.measure_cpu && !pids.is_empty();
    played.server_cpu_s = measured(&cfg.server_pids).then_some(cpu[1].0 - cpu[0].0);
    played.client_cpu_s = measured(meter.client_pids).then_some(cpu[1].1 - cpu[0].1);
    played
}

/// The users' results in order, each with its start from the first user's (how closely
/// the class really started), and the login's and the session's latencies merged.
fn merge_users(users: Vec<UserPlayed>) -> (Vec<UserResult>, Latencies, Latencies) {
    let first = users.iter().filter_map(|p| p.1).min();
    let mut rs: Vec<(UserResult, Latencies, Latencies)> = users
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
    (
        rs.into_iter().map(|r| r.0).collect(),
        lat_login,
        lat_session,
    )
}

/// The first user's error that says more than the interrupt, else the first one's.
fn users_error(per_user: &[UserResult]) -> Option<String> {
    let user_error = |skip_interrupt: bool| {
        per_user.iter().find_map(|u| {
            u.error
                .as_ref()
                .filter(|e| !(skip_interrupt && e.contains("interrupted")))
                .map(|e| format!("user{:03}: {e}", u.user))
        })
    };
    user_error(true).or_else(|| user_error(false))
}

/// The run's report.
fn report(
    cfg: &StormConfig,
    spec: RunSpec,
    index: usize,
    homes: &str,
    settled: Settled,
    played: Played,
) -> StormReport {
    let n = cfg.users;
    let Played {
        users,
        snaps,
        server,
        server_cpu_s,
        client_cpu_s,
        window,
        meter_err,
    } = played;
    let server_delta = |a: &Option<ServerCounts>, b: &Option<ServerCounts>| match (a, b) {
        (Some(a), Some(b)) => Some(b.minus(a)),
        _ => None,
    };
    let (per_user, lat_login, lat_session) = merge_users(users);
    let error = users_error(&per_user).or(meter_err);
    let of = |f: fn(&UserResult) -> f64| Summary::of(&per_user.iter().map(f).collect::<Vec<_>>());
    let delta = |a: &Option<ShareCounts>, b: &Option<ShareCounts>| match (a, b) {
        (Some(a), Some(b)) => Some(b.minus(a).by_path_in_homes(homes)),
        _ => None,
    };
    let ccfs_cpu: Vec<f64> = per_user.iter().filter_map(|u| u.ccfs_cpu_s).collect();
    StormReport {
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
        mode_run: 0,
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
        latencies_raw: Some((lat_login, lat_session)),
        hosts: Vec::new(),
        share_login: delta(&snaps[0], &snaps[1]),
        share_session: delta(&snaps[1], &snaps[2]),
        share_logout: delta(&snaps[2], &snaps[3]),
        server_login_session: server_delta(&server[0], &server[1]),
        server_logout: server_delta(&server[1], &server[2]),
        server_cpu_s,
        client_cpu_s,
        ccfs_cpu_s: (spec.with_ccfs && ccfs_cpu.len() == per_user.len() && !per_user.is_empty())
            .then(|| ccfs_cpu.iter().sum()),
        cpu_window_s: window,
        per_user,
    }
}

thread_local! {
    /// When this thread's user started after the start barrier.
    static START: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// The barriers every user passes, in this order.
struct Gates<'a> {
    start: &'a Barrier,
    /// Users past the start barrier, waiting for `go`.
    at_gate: &'a AtomicUsize,
    /// Set once every user waits for it: they all see it within one turn of the CPU
    /// each (a barrier hands its lock from one woken thread to the next, which on a few
    /// cores spreads the start of hundreds of users over half a second).
    go: &'a AtomicBool,
    /// Metered runs only: the counts are read between the logins and the sessions.
    logins_done: Option<&'a Barrier>,
    sessions_done: &'a Barrier,
    /// Passed once the counts of the sessions' end are read.
    logout_go: &'a Barrier,
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
    let mut r = nothing_yet(u);
    let ws = Workstation::of(work, u);
    // Made before the start (its data and its list of the home's files): the login's
    // time is the login's.
    let home = if with_ccfs {
        ws.mnt.clone()
    } else {
        share_home.to_path_buf()
    };
    let mut actor = actor(cfg, with_ccfs, home, &ws, 1000 + u as u64);
    let t0 = start(gates);
    let mut mount = None;
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
                return pass_the_rest(gates, r);
            }
        }
    }
    let login_lat = log_in(cfg, &mut actor, &mut r, t0);
    PROGRESS.logged_in();
    if let Some(b) = gates.logins_done {
        b.wait();
    }
    let session_lat = session(cfg, &mut actor, &mut r);
    gates.sessions_done.wait();
    gates.logout_go.wait();
    log_out(cfg, &mut actor, mount, &mut r);
    gates.logouts_done.wait();
    (r, login_lat, session_lat)
}

/// A user's result before anything ran.
fn nothing_yet(u: usize) -> UserResult {
    UserResult {
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
    }
}

/// Waits at the start barrier, then for `go` (so that every user starts within a turn
/// of the CPU); returns the user's start, noted in [`START`].
fn start(gates: &Gates) -> Instant {
    gates.start.wait();
    gates.at_gate.fetch_add(1, Ordering::SeqCst);
    while !gates.go.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    let t0 = Instant::now();
    START.with(|t| t.set(Some(t0)));
    crate::login::NOT_STARTED.fetch_sub(1, Ordering::Relaxed);
    t0
}

/// A user that failed before its login: passes the barriers left, with no latencies.
fn pass_the_rest(gates: &Gates, r: UserResult) -> (UserResult, Latencies, Latencies) {
    PROGRESS.logged_in();
    if let Some(b) = gates.logins_done {
        b.wait();
    }
    gates.sessions_done.wait();
    gates.logout_go.wait();
    PROGRESS.logged_out();
    gates.logouts_done.wait();
    (r, Latencies::new(), Latencies::new())
}

/// The login burst, timed from `t0` (the mount included); returns its latencies.
fn log_in(cfg: &StormConfig, actor: &mut Actor, r: &mut UserResult, t0: Instant) -> Latencies {
    let login = actor.play(&cfg.profile.login, 0);
    r.login_s = t0.elapsed().as_secs_f64();
    let login_lat = std::mem::take(&mut actor.lat);
    if let Err(e) = login {
        r.error = Some(format!("login: {e}"));
    }
    login_lat
}

/// The session: the periodic actions, every period, until its end (or the first error,
/// or an interrupt); returns its latencies.
fn session(cfg: &StormConfig, actor: &mut Actor, r: &mut UserResult) -> Latencies {
    let mut session_lat = Latencies::new();
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
    session_lat
}

/// The logout actions (unless the user failed) and, with ccfs, `ccfs umount` (the sync
/// back), timed together; then what the user wrote, missed and rebuilt.
fn log_out(cfg: &StormConfig, actor: &mut Actor, mount: Option<CcfsMount>, r: &mut UserResult) {
    let t1 = Instant::now();
    if r.error.is_none() {
        if let Err(e) = actor.play(&cfg.profile.logout, 0) {
            r.error = Some(format!("logout: {e}"));
        }
    }
    PROGRESS.logged_out();
    if let Some(mut m) = mount {
        if let Err(e) = m.umount() {
            // An earlier error (a file op the dying mount failed) is kept, and the mount's
            // own end is said after it: that is what names the cause.
            r.error = Some(match r.error.take() {
                Some(first) => format!("{first}; then {e}"),
                None => e,
            });
        }
        r.ccfs_cpu_s = m.cpu_s;
        PROGRESS.synced();
    }
    r.logout_s = t1.elapsed().as_secs_f64();
    r.bytes_written = actor.tally.bytes_written;
    r.missing_files = actor.tally.missing;
    r.rebuilt_files = actor.tally.rebuilt;
}
