//! One storm: the homes prepared, the meter mounted (metered runs), then every user at
//! once behind the barriers, login, session and logout, and the run's report.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Barrier, Mutex};
use std::time::Instant;

use super::mount::CcfsMount;
use super::prepare::{actor, prepare_user, settle, Workstation};
use super::procs::{cpu_seconds, read_pids_file};
use super::{
    interrupted, now_unix, relay_config, sleep_until, RunSpec, ShareCounts, StormConfig,
    StormReport, Summary, UserResult, PATH_DEPTH, SCHEMA,
};
use crate::engine::Latencies;
use crate::report::{latency_report, Environment};

pub(super) fn one_run(
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
