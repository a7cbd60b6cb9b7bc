//! `login-storm --hosts`: the coordinator's runs across the hosts, and `loadgen
//! storm-agent`, a host's part of one run (started by the coordinator over SSH; see
//! `loadgen::storm::hosts` for the protocol).

use std::io::{BufRead, Write};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use crate::*;

use loadgen::storm::{AgentLine, AgentResult, Gate, Hook, RunSpec, StormConfig, StormReport};

/// A host's part of one run of a class across hosts (hidden: the coordinator starts it).
#[derive(Debug, Args, Clone)]
pub(crate) struct StormAgentArgs {
    /// The share as this host mounts it.
    #[arg(long)]
    share: PathBuf,
    /// This host's homes, below the share (made by the agent).
    #[arg(long)]
    homes: String,
    #[arg(long)]
    users: usize,
    #[arg(long)]
    user_base: usize,
    #[arg(long)]
    host_name: String,
    #[arg(long)]
    session: u64,
    #[arg(long)]
    profile: Option<PathBuf>,
    #[arg(long)]
    ccfs: Option<PathBuf>,
    #[arg(long)]
    ccfs_config: Option<PathBuf>,
    #[arg(long)]
    with_ccfs: bool,
    #[arg(long)]
    metered: bool,
    #[arg(long)]
    returning_users: bool,
    #[arg(long, value_enum)]
    baseline: Option<BaselineArg>,
    #[arg(long)]
    work: PathBuf,
    #[arg(long)]
    remount: Option<String>,
    #[arg(long)]
    client_pids_file: Option<PathBuf>,
    #[arg(long)]
    cpu_window: Option<u64>,
    #[arg(long)]
    run_index: usize,
    /// The storm's last run: its directory on the share goes too once its runs' are gone.
    #[arg(long)]
    last_run: bool,
    #[arg(long)]
    keep: bool,
}

/// The agent's clock: nanoseconds since it started.
fn agent_ns(origin: std::time::Instant) -> u64 {
    origin.elapsed().as_nanos() as u64
}

/// One protocol line to the coordinator.
fn say(line: &AgentLine) {
    if let Ok(text) = serde_json::to_string(line) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}").and_then(|()| out.flush());
    }
}

/// The agent's gates: each said to the coordinator, then its word awaited (`go`).
struct StdioHook {
    /// The coordinator's words at the gates, from [`listen_to_coordinator`].
    words: Mutex<std::sync::mpsc::Receiver<bool>>,
    origin: std::time::Instant,
    go_ns: AtomicU64,
}

/// Reads the coordinator's words once the run starts, on a thread of its own: `go` is
/// passed to the next gate; `stop`, anything else or the coordinator going away stops the
/// run at once (the users' sessions end, they log out).
fn listen_to_coordinator(
    mut stdin: std::io::BufReader<std::io::Stdin>,
) -> std::sync::mpsc::Receiver<bool> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || loop {
        let mut line = String::new();
        let go = matches!(stdin.read_line(&mut line), Ok(n) if n > 0) && line.trim() == "go";
        if !go {
            loadgen::stop::INTERRUPTED.store(true, Ordering::Relaxed);
        }
        if tx.send(go).is_err() || !go {
            return;
        }
    });
    rx
}

impl Hook for StdioHook {
    fn at(&self, gate: Gate) -> bool {
        say(&AgentLine::Gate(
            loadgen::storm::gate_word(gate).to_string(),
        ));
        // Stopping: the coordinator answers no more gates.
        if loadgen::stop::INTERRUPTED.load(Ordering::Relaxed) {
            return false;
        }
        let go = self
            .words
            .lock()
            .map(|w| w.recv().unwrap_or(false))
            .unwrap_or(false);
        if go && gate == Gate::Start {
            self.go_ns.store(agent_ns(self.origin), Ordering::Relaxed);
        }
        go
    }
}

/// This host's part of the storm's configuration, checked as on one machine, with its
/// scratch directory (made) as the work.
fn agent_config(a: &StormAgentArgs) -> Result<StormConfig, Error> {
    let (profile, profile_name) = profile_at(a.profile.as_deref())?;
    // Below the share, never above it.
    let homes_rel = Path::new(&a.homes);
    if homes_rel.is_absolute()
        || homes_rel
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(user(format!(
            "--homes {}: give a path below the share, without `..`",
            a.homes
        )));
    }
    // `{host}` in the share's path, the remount command and the client's pid file: each
    // host's own client mount of the share (in the command, quoted for its shell).
    let for_host =
        |p: &Path| PathBuf::from(p.display().to_string().replace("{host}", &a.host_name));
    let share_path = for_host(&a.share);
    let remount = a.remount.as_ref().map(|c| {
        c.replace(
            "{host}",
            &loadgen::remote::remote_command(&[a.host_name.as_str()]),
        )
    });
    let client_pids_file = a.client_pids_file.as_deref().map(for_host);
    if let Some(f) = &client_pids_file {
        loadgen::storm::read_pids_file(f)
            .map_err(|e| user(format!("--client-pids-file on {}: {e}", a.host_name)))?;
    }
    // Checked here as on one machine: root makes homes, mount points and caches there.
    let share = share_for_root(&share_path)?;
    let work_base = work_for_root(&a.work, &share)?;
    // What an agent killed earlier left here (its run directory and mounts) goes first.
    for line in loadgen::storm::clear_work_leftovers(&work_base) {
        eprintln!("loadgen storm-agent on {}: {line}", a.host_name);
    }
    // Private: no other user enters the mounts below it (see storm::run).
    let work = work_base.join(format!(
        "storm-{}-{}-0",
        loadgen::storm::unique_time(),
        std::process::id()
    ));
    loadgen::safety::make_private_dir(&work).map_err(|e| user(format!("--work: {e}")))?;
    Ok(StormConfig {
        share,
        users: a.users,
        session: Duration::from_secs(a.session),
        profile: Arc::new(profile),
        profile_name,
        ccfs: ccfs_at(a.ccfs.as_deref()),
        work: work.clone(),
        meter: a.metered,
        ccfs_config: a.ccfs_config.clone(),
        returning_users: a.returning_users,
        baseline: baseline(a.baseline),
        repeat: 1,
        remount,
        server_counts: None,
        server_pids: Vec::new(),
        client_pids_file,
        cpu_window: a.cpu_window.map(Duration::from_secs),
        keep: a.keep,
        label: None,
        user_base: a.user_base,
    })
}

/// `loadgen storm-agent`: answers the coordinator's pings, plays this host's users
/// through one run held at the coordinator's gates, and sends its results.
pub(crate) fn storm_agent(a: &StormAgentArgs) -> Result<(), Error> {
    let origin = std::time::Instant::now();
    let cfg = agent_config(a)?;
    let work = cfg.work.clone();
    let mut stdin = std::io::BufReader::new(std::io::stdin());
    // The clocks compared, then the word to run.
    loop {
        let mut line = String::new();
        let read = stdin.read_line(&mut line);
        match (read, line.trim()) {
            (Ok(n), "ping") if n > 0 => say(&AgentLine::Pong(agent_ns(origin))),
            (Ok(n), "run") if n > 0 => break,
            _ => {
                // The coordinator went away before the run: nothing of it is left.
                let _ = std::fs::remove_dir(&work);
                return Ok(());
            }
        }
    }
    // The users' ccfs daemons are reaped here, with the CPU they used.
    loadgen::sys::become_subreaper();
    let hook = StdioHook {
        words: Mutex::new(listen_to_coordinator(stdin)),
        origin,
        go_ns: AtomicU64::new(0),
    };
    // This host's homes: the coordinator's name with the host's in place of HOST.
    let host: String = a
        .host_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || ".-_".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let homes = a.homes.replace("HOST", &host);
    let homes_at = cfg.share.join(&homes);
    // The run's directories, shared by the hosts: made a name at a time, never through a
    // link (the share may be one other users can write in, if sticky).
    if let Some(parent) = Path::new(&homes).parent() {
        loadgen::safety::make_dirs_below(&cfg.share, parent)
            .map_err(|e| Error::Failed(format!("cannot make the run's directories: {e}")))?;
    }
    loadgen::stop::stop_on_signals();
    let spec = RunSpec {
        with_ccfs: a.with_ccfs,
        metered: a.metered,
    };
    let mut report = loadgen::storm::one_run(&cfg, spec, a.run_index, &homes, &work, &hook)
        .map_err(Error::Failed)?;
    // A failed run's mount points, caches and homes stay as its evidence, where its error
    // says; a run stopped (by the coordinator, or a signal) leaves nothing.
    let stopped = loadgen::stop::INTERRUPTED.load(Ordering::Relaxed);
    if let Some(e) = report.error.as_mut().filter(|_| !stopped) {
        e.push_str(&format!(
            " (kept on {}: its mount points and caches in {}, its homes in {})",
            a.host_name,
            work.display(),
            homes_at.display()
        ));
        // Kept as a failed storm's on one machine is: a later agent leaves it.
        loadgen::storm::keep_evidence(&work, e);
    }
    if !a.keep && (report.error.is_none() || stopped) {
        let _ = loadgen::storm::remove_run_dir(&work);
        let _ = std::fs::remove_dir_all(&homes_at);
        // The run's directory, once the last host's homes are gone; the storm's only after
        // its last run (made again for a next run, another host's client could still hold
        // the one removed, stale).
        for up in homes_at
            .ancestors()
            .skip(1)
            .take(1 + usize::from(a.last_run))
        {
            let _ = std::fs::remove_dir(up);
        }
    }
    let (login, session) = report.latencies_raw.take().unwrap_or_default();
    say(&AgentLine::Result(Box::new(AgentResult {
        report,
        go_ns: hook.go_ns.load(Ordering::Relaxed),
        login_latencies: login.to_wire(),
        session_latencies: session.to_wire(),
    })));
    Ok(())
}

/// The agents' options that are the same in every run: what `a` asks of every host.
fn agent_args(a: &StormArgs) -> Vec<String> {
    let mut v = vec![
        "--share".to_string(),
        a.share.display().to_string(),
        "--work".into(),
        a.work.display().to_string(),
        "--session".into(),
        a.session.to_string(),
    ];
    let mut opt = |flag: &str, value: Option<String>| {
        if let Some(x) = value {
            v.push(flag.to_string());
            v.push(x);
        }
    };
    opt(
        "--profile",
        a.profile.as_ref().map(|p| p.display().to_string()),
    );
    opt("--ccfs", a.ccfs.as_ref().map(|p| p.display().to_string()));
    opt(
        "--ccfs-config",
        a.ccfs_config.as_ref().map(|p| p.display().to_string()),
    );
    opt("--remount", a.remount.clone());
    opt(
        "--client-pids-file",
        a.client_pids_file.as_ref().map(|p| p.display().to_string()),
    );
    opt("--cpu-window", a.cpu_window.map(|w| w.to_string()));
    if let Some(BaselineArg::ShareCache) = a.baseline {
        v.extend(["--baseline".into(), "share-cache".into()]);
    }
    if a.returning_users {
        v.push("--returning-users".into());
    }
    if a.keep {
        v.push("--keep".into());
    }
    v
}

/// The hosts of `a` and how to reach them.
pub(crate) fn storm_hosts(a: &StormArgs) -> Option<loadgen::storm::Hosts> {
    (!a.hosts.is_empty()).then(|| loadgen::storm::Hosts {
        names: a.hosts.clone(),
        ssh: a
            .ssh_command
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        remote_loadgen: a.remote_loadgen.clone().unwrap_or_else(|| {
            std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| "loadgen".into())
        }),
        agent_args: agent_args(a),
    })
}

/// The runs of `schedule` for a class of `cfg.users` across `hosts`, each on homes of its
/// own; `on_run` gets the reports so far after each.
pub(crate) fn runs_across(
    cfg: &StormConfig,
    hosts: &loadgen::storm::Hosts,
    schedule: &[RunSpec],
    mut on_run: impl FnMut(&[StormReport]),
) -> Result<Vec<StormReport>, String> {
    let stamp = format!("{}-{}", loadgen::storm::unique_time(), std::process::id());
    let mut reports: Vec<StormReport> = Vec::new();
    for (i, &spec) in schedule.iter().enumerate() {
        if loadgen::stop::INTERRUPTED.load(Ordering::Relaxed) {
            break;
        }
        let mut args = vec![
            "--run-index".to_string(),
            i.to_string(),
            "--homes".into(),
            format!("loadgen-storm-{stamp}/run-{i}/HOST"),
        ];
        if spec.with_ccfs {
            args.push("--with-ccfs".into());
        }
        if spec.metered {
            args.push("--metered".into());
        }
        if i + 1 == schedule.len() {
            args.push("--last-run".into());
        }
        let mut r = loadgen::storm::run_across(cfg, hosts, spec, i, &args)?;
        if !spec.metered {
            r.mode_run = 1 + schedule[..i]
                .iter()
                .filter(|s| s.with_ccfs == spec.with_ccfs && !s.metered)
                .count();
        }
        let failed = r.error.is_some();
        reports.push(r);
        on_run(&reports);
        if failed {
            break;
        }
    }
    Ok(reports)
}
