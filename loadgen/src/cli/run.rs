//! `loadgen compilebench`, `sweep`, `access` and the agent of a multi-host run.

use crate::*;

/// `loadgen compilebench`: one run, its report written and summed up.
pub(crate) fn compilebench(dir: &Path, opts: &RunOpts, clients: usize) -> Result<(), Error> {
    if !opts.net.hosts.is_empty() && clients != 1 {
        return Err(user(
            "--clients counts clients on this machine; with --hosts use --clients-per-host",
        ));
    }
    check_common(clients, opts)?;
    let schedule = parse_schedule(opts, COMPILEBENCH_DEFAULT)?;
    check_outputs(&opts.out)?;
    let w = make_workload(opts, &schedule)?;
    let r = run_workload("compilebench", dir, w, &schedule, clients, opts, true)?;
    finish(&r)
}

/// `loadgen sweep`: one run for each number of clients, until one fails or a signal
/// stops it, then the sweep's table.
pub(crate) fn sweep(dir: &Path, opts: &RunOpts, clients: &[usize]) -> Result<(), Error> {
    for &c in clients {
        check_common(c, opts)?;
    }
    let schedule = parse_schedule(opts, sweep_default())?;
    check_outputs(&opts.out)?;
    let w = make_workload(opts, &schedule)?;
    let mut runs = Vec::new();
    for &c in clients {
        eprintln!("loadgen sweep: {c} clients");
        let r = run_workload("sweep", dir, w.clone(), &schedule, c, opts, false)?;
        let failed = r.error.clone();
        runs.push(r);
        if loadgen::stop::INTERRUPTED.load(Ordering::Relaxed) {
            break;
        }
        if let Some(e) = failed {
            eprintln!("loadgen sweep: stopped at {c} clients: {e}");
            break;
        }
    }
    print!("{}", report::sweep_table(&runs));
    finish_runs(&runs, &opts.out, true, "--scale")
}

/// `loadgen access`: `files` files created and removed by each client.
pub(crate) fn access(
    dir: &Path,
    files: usize,
    clients: usize,
    out: OutputOpts,
) -> Result<(), Error> {
    if files == 0 {
        return Err(user("--files must be at least 1"));
    }
    let opts = RunOpts::plain(4096, out);
    check_common(clients, &opts)?;
    check_outputs(&opts.out)?;
    let schedule = Schedule::Phases(vec![Phase::Create, Phase::DeleteTree]);
    let r = run_workload(
        "access",
        dir,
        access_workload(files),
        &schedule,
        clients,
        &opts,
        true,
    )?;
    finish(&r)
}

/// The rounds' schedule from the options; `default` when neither --phases nor --runs.
pub(crate) fn parse_schedule(opts: &RunOpts, default: Schedule) -> Result<Schedule, Error> {
    if opts.phases.is_some() && (opts.runs.is_some() || opts.initial_dirs.is_some()) {
        return Err(user(
            "--phases excludes --runs and --initial-dirs (the random mode); give one or the other",
        ));
    }
    if let Some(names) = &opts.phases {
        let phases = names
            .iter()
            .map(|n| {
                Phase::parse(n.trim()).ok_or_else(|| {
                    user(format!(
                        "unknown phase {n:?}; choose from {}",
                        workload::ALL_PHASES.map(|p| p.name()).join(", ")
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if phases.is_empty() {
            return Err(user("--phases is empty; name at least one phase"));
        }
        return Ok(Schedule::Phases(phases));
    }
    let (initial, runs) = match (&default, opts.runs, opts.initial_dirs) {
        (_, None, None) => return Ok(default),
        (Schedule::Random { initial, runs }, r, i) => (i.unwrap_or(*initial), r.unwrap_or(*runs)),
        (Schedule::Phases(_), r, i) => (i.unwrap_or(30), r.unwrap_or(100)),
    };
    if runs > 100_000 || initial > 10_000 {
        return Err(user(
            "--runs is at most 100000 and --initial-dirs at most 10000",
        ));
    }
    if initial + runs == 0 {
        return Err(user(
            "--runs 0 with --initial-dirs 0 does nothing; give at least one",
        ));
    }
    Ok(Schedule::Random { initial, runs })
}

/// compilebench's own defaults: 30 trees, 100 random operations.
pub(crate) const COMPILEBENCH_DEFAULT: Schedule = Schedule::Random {
    initial: 30,
    runs: 100,
};

/// The four phases of the compilebench blog, the default of a sweep.
pub(crate) fn sweep_default() -> Schedule {
    Schedule::Phases(vec![
        Phase::Create,
        Phase::Compile,
        Phase::ReadCompiled,
        Phase::DeleteCompiled,
    ])
}

pub(crate) fn check_common(clients: usize, opts: &RunOpts) -> Result<(), Error> {
    if clients == 0 || clients > 4096 {
        return Err(user("--clients must be between 1 and 4096"));
    }
    if !(opts.scale > 0.0 && opts.scale <= 1.0) {
        return Err(user(
            "--scale must be a fraction in (0, 1]; 1 is the whole tree",
        ));
    }
    if opts.write_size == 0 || opts.write_size > 64 << 20 {
        return Err(user("--write-size must be between 1 byte and 64 MiB"));
    }
    if opts.limits.threads.is_some_and(|t| t == 0 || t > 4096) {
        return Err(user("--threads must be between 1 and 4096"));
    }
    if opts.limits.phase_timeout == 0 || opts.limits.phase_timeout > 7 * 86_400 {
        return Err(user(
            "--phase-timeout is in seconds, between 1 and 604800 (a week)",
        ));
    }
    if opts.limits.io_timeout == 0 || opts.limits.io_timeout > 86_400 {
        return Err(user("--io-timeout is in seconds, between 1 and 86400"));
    }
    check_host_names(&opts.net.hosts)?;
    if let Some(h) = hosts(opts) {
        remote::check_hosts(&h).map_err(|e| {
            user(format!(
                "--hosts: loadgen does not run on {e}; check the host names, \
                 --ssh-command and --remote-loadgen"
            ))
        })?;
    }
    Ok(())
}

/// Refuses host names that are no host's: empty, `.` or `..`, with a `/` or a space, or
/// starting with `-` (ssh would take it for an option).
pub(crate) fn check_host_names(hosts: &[String]) -> Result<(), Error> {
    for h in hosts {
        let bad = h.is_empty()
            || h == "."
            || h == ".."
            || h.starts_with('-')
            || h.contains(|c: char| c == '/' || c.is_whitespace() || c.is_control());
        if bad {
            return Err(user(format!(
                "--hosts: {h:?} is not a host name; give the names ssh reaches, comma-separated"
            )));
        }
    }
    Ok(())
}

/// Refuses, before anything runs, a result file that could not be written at the end.
pub(crate) fn check_outputs(out: &OutputOpts) -> Result<(), Error> {
    for (flag, path) in [("--json", &out.json), ("--csv", &out.csv)] {
        let Some(path) = path else { continue };
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        if !parent.is_dir() {
            return Err(user(format!(
                "{flag} {}: the directory {} does not exist; make it or give another path",
                path.display(),
                parent.display()
            )));
        }
        if path.is_dir() {
            return Err(user(format!(
                "{flag} {} is a directory; give a file name",
                path.display()
            )));
        }
        // Root writes the file there: a directory another user can change would let that
        // user say where (and over whose file).
        if let Some(why) = unsafe_for_root(parent) {
            return Err(user(format!("{flag} {}: {why}", path.display())));
        }
        if !loadgen::sys::may_write(parent) {
            return Err(user(format!(
                "{flag} {}: cannot write in {}; give a path in a writable directory",
                path.display(),
                parent.display()
            )));
        }
    }
    Ok(())
}

pub(crate) fn write_out(path: &Path, data: &[u8]) -> std::io::Result<()> {
    loadgen::safety::write_atomic(path, data)
}

/// The workload a command line asks for; refused when `--scale` keeps no file of the
/// tree (every phase would time nothing).
pub(crate) fn make_workload(opts: &RunOpts, schedule: &Schedule) -> Result<Workload, Error> {
    let d = Datasets::embedded();
    let w = Workload::compilebench(&d, opts.scale, opts.seed, schedule, !opts.no_sync);
    if w.lists.unpatched.is_empty() {
        return Err(user(format!(
            "--scale {} keeps no file of the kernel tree; use at least {:.6}",
            opts.scale,
            workload::smallest_scale(&d)
        )));
    }
    Ok(w)
}

/// Runs one workload and writes its report; returns the report.
pub(crate) fn run_workload(
    command: &str,
    dir: &Path,
    workload: Workload,
    schedule: &Schedule,
    clients: usize,
    opts: &RunOpts,
    // A sweep writes its runs itself, as one list.
    to_files: bool,
) -> Result<RunReport, Error> {
    let json = opts.out.json.as_deref().filter(|_| to_files);
    let csv = opts.out.csv.as_deref().filter(|_| to_files);
    let mut warnings = Vec::new();
    let hosts = hosts(opts);
    let dropped = drop_caches_here(opts, hosts.is_some(), &mut warnings);
    let clients = match &hosts {
        Some(h) => h.names.len() * h.clients_per_host,
        None => clients,
    };
    let per_host = hosts
        .as_ref()
        .map(|h| h.clients_per_host)
        .unwrap_or(clients);
    if opts.read_other && per_host < 2 {
        warnings.push(
            "--read-other needs two clients on a host (each reads its neighbour's tree): \
             every client read its own"
                .to_string(),
        );
    }
    let target = parse_target(dir, opts.limits.io_timeout)?;
    // With --hosts every agent makes its own run directory on its host.
    let run_dir = match &hosts {
        None => prepare_run_dir(&target, opts.out.allow_nonempty, None)?,
        Some(_) => dir.to_path_buf(),
    };
    let names: Vec<&'static str> = workload
        .rounds
        .iter()
        .map(|r| r.timed.phase.name())
        .collect();
    let rounds = workload.rounds.clone();
    let workload_totals = workload.files_per_round();
    let cfg = engine_config(&target, &run_dir, clients, workload, opts, dropped);
    let mut report = new_report(
        command,
        schedule,
        opts,
        &target,
        &cfg,
        &names,
        hosts.is_some(),
    );
    report.warnings = warnings;
    let progress = Arc::new(Progress::default());
    let done = Arc::new(AtomicBool::new(false));
    let totals = workload_totals.iter().map(|n| n * clients as u64).collect();
    let display = spawn_progress(
        progress.clone(),
        names,
        totals,
        opts.out.quiet,
        done.clone(),
    );
    let mut write_error = None;
    let mut lat = report::PhaseLatencies::default();
    let on_phase = |p: &engine::PhaseResult| {
        report.phases.push(report::phase_report(p));
        lat.add(p);
        report.summary = report::summarize(&report.phases, Some(&lat));
        for c in &p.clients {
            report.warnings.extend(c.warnings.iter().cloned());
        }
        note_caches_not_dropped(&mut report, &p.caches_not_dropped);
        if let Some(e) = p.error() {
            report.error = Some(e);
        }
        // Results are written after every round: an interrupted run keeps what it measured.
        if let Some(j) = json {
            if let Err(e) = write_out(j, &report::to_json(&report)) {
                write_error = Some(format!("cannot write {}: {e}", j.display()));
            }
        }
    };
    let ran = run_clients(
        &cfg,
        hosts.as_ref(),
        dir,
        schedule,
        opts,
        &rounds,
        &progress,
        on_phase,
    );
    finish_progress(&done, display);
    let hung = ran.hung;
    settle_report(&mut report, ran, rounds.len(), dir, &target);
    let multi_host = hosts.is_some();
    leave_run_dir(
        &mut report,
        &target,
        &run_dir,
        hung,
        opts.out.keep,
        multi_host,
    );
    if let Some(j) = json {
        write_out(j, &report::to_json(&report))
            .map_err(|e| Error::Failed(format!("cannot write {}: {e}", j.display())))?;
    }
    if let Some(c) = csv {
        write_out(c, &report::to_csv(&report))
            .map_err(|e| Error::Failed(format!("cannot write {}: {e}", c.display())))?;
    }
    if let Some(e) = write_error {
        report.warnings.push(e);
    }
    Ok(report)
}

/// The hosts of a multi-host run (`--hosts`), and how to reach them.
fn hosts(opts: &RunOpts) -> Option<remote::Hosts> {
    (!opts.net.hosts.is_empty()).then(|| remote::Hosts {
        names: opts.net.hosts.clone(),
        ssh: opts
            .net
            .ssh_command
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        remote_loadgen: opts.net.remote_loadgen.clone().unwrap_or_else(|| {
            std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| "loadgen".into())
        }),
        clients_per_host: opts.net.clients_per_host,
    })
}

/// Records the hosts that could not drop their caches as asked: the run's configuration
/// then says caches were not dropped, the hosts are named, and a warning says so once.
fn note_caches_not_dropped(report: &mut RunReport, hosts: &[String]) {
    for h in hosts {
        if report.caches_not_dropped_on.contains(h) {
            continue;
        }
        report.caches_not_dropped_on.push(h.clone());
        report.config.drop_caches = false;
        report.warnings.push(format!(
            "{h}: caches were not dropped between operations there (its agent is not root): \
             its clients ran with what the page cache kept"
        ));
    }
}

/// Whether caches are dropped between operations. They are dropped where the clients
/// run: here for a local run (root only; tried now, with a warning when it cannot), by
/// the agents on their hosts.
fn drop_caches_here(opts: &RunOpts, multi_host: bool, warnings: &mut Vec<String>) -> bool {
    let drop_caches = !opts.no_sync && !opts.no_drop_caches;
    if drop_caches && !multi_host {
        let ok = engine::drop_caches();
        if !ok {
            warnings.push(
                "caches were not dropped between operations: that needs root (run as root, \
                 or pass --no-drop-caches to say so)"
                    .to_string(),
            );
            eprintln!("loadgen: note: dropping caches needs root; running without");
        }
        ok
    } else {
        drop_caches
    }
}

/// The report of a run about to start: what runs where, with which settings; no phases
/// yet.
fn new_report(
    command: &str,
    schedule: &Schedule,
    opts: &RunOpts,
    target: &Target,
    cfg: &engine::Config,
    names: &[&'static str],
    multi_host: bool,
) -> RunReport {
    let (mode, initial_dirs, runs) = match schedule {
        _ if opts.stream.is_some() => ("stream", 0, names.len()),
        Schedule::Random { initial, runs } => ("random", *initial, *runs),
        Schedule::Phases(p) => ("phases", 0, p.len()),
    };
    RunReport {
        schema: report::SCHEMA.to_string(),
        tool: "loadgen".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        command: command.into(),
        args: std::env::args().collect(),
        seed: opts.seed,
        started_at_unix: now_unix(),
        target: target.describe(),
        label: opts.out.label.clone(),
        environment: Environment::probe(target),
        config: RunConfig {
            clients: cfg.clients,
            mode: mode.into(),
            phases: match schedule {
                Schedule::Phases(p) => p.iter().map(|p| p.name().to_string()).collect(),
                Schedule::Random { .. } => names.iter().map(|n| n.to_string()).collect(),
            },
            initial_dirs,
            runs,
            scale: opts.scale,
            write_size: opts.write_size,
            fsync: opts.fsync,
            sync: !opts.no_sync,
            drop_caches: cfg.drop_caches,
            read_other: cfg.read_other,
            read_other_means: if cfg.read_other {
                if multi_host {
                    "the tree of the next client on the same host".into()
                } else {
                    "the tree of the next client".into()
                }
            } else {
                String::new()
            },
            native_order: cfg.native_order,
            threads: cfg.threads,
            direct: cfg.direct,
        },
        phases: Vec::new(),
        summary: Vec::new(),
        complete: false,
        error: None,
        warnings: Vec::new(),
        caches_not_dropped_on: Vec::new(),
    }
}

/// How the clients' run ended.
struct Ran {
    /// Rounds with a result.
    results: usize,
    /// What the cleanup could not remove.
    left: Vec<String>,
    /// A round passed its deadline with calls in flight.
    hung: bool,
    /// Why a multi-host run ended early.
    host_error: Option<String>,
}

/// Runs the clients: here with the engine, or on the hosts through their agents (each
/// told this run's group, so that agents on a shared directory know each other's run
/// directories).
#[allow(clippy::too_many_arguments)]
fn run_clients(
    cfg: &engine::Config,
    hosts: Option<&remote::Hosts>,
    dir: &Path,
    schedule: &Schedule,
    opts: &RunOpts,
    rounds: &[workload::Round],
    progress: &Progress,
    on_phase: impl FnMut(&engine::PhaseResult),
) -> Ran {
    let stop = &loadgen::stop::INTERRUPTED;
    match hosts {
        None => {
            let o = engine::run(cfg, progress, stop, on_phase);
            Ran {
                results: o.phases.len(),
                left: o.left,
                hung: o.hung,
                host_error: None,
            }
        }
        Some(h) => {
            let mut args = agent_args(dir, schedule, opts);
            // The agents' run directories name this run: on a directory the hosts share,
            // each sees the others' and knows them for its siblings.
            let group = format!("{}-{}-{}", hostname(), std::process::id(), now_unix());
            args.extend(["--run-group".to_string(), group]);
            let (results, host_error) = match remote::run(
                h,
                rounds,
                &args,
                Duration::from_secs(opts.limits.phase_timeout),
                stop,
                on_phase,
            ) {
                Ok(r) => (r.len(), None),
                Err(e) => (0, Some(e)),
            };
            Ran {
                results,
                left: Vec::new(),
                hung: false,
                host_error,
            }
        }
    }
}

/// The report's end: why the run stopped (a host, a signal, a target that did not
/// answer), whether it is complete, and what the cleanup left.
fn settle_report(report: &mut RunReport, ran: Ran, rounds: usize, dir: &Path, target: &Target) {
    if let Some(e) = ran.host_error {
        report.error = Some(format!("multi-host run: {e}"));
        report.warnings.push(format!(
            "a host that stopped may have left its run directory (loadgen-run-* in {}); \
             look there on that host and remove it",
            dir.display()
        ));
    }
    if loadgen::stop::INTERRUPTED.load(Ordering::Relaxed) {
        report.error = Some("interrupted by a signal".into());
    }
    report.complete = report.error.is_none() && ran.results == rounds;
    report
        .warnings
        .extend(ran.left.into_iter().map(|l| format!("cleanup left: {l}")));
    if ran.hung {
        report.error = Some(format!(
            "{} did not answer: {}",
            target.describe(),
            report.error.clone().unwrap_or_default()
        ));
    }
}

/// The run directory after the run: left in place when the target did not answer,
/// removed unless kept, marked as kept otherwise (a local run's; the agents see to
/// theirs).
fn leave_run_dir(
    report: &mut RunReport,
    target: &Target,
    run_dir: &Path,
    hung: bool,
    keep: bool,
    multi_host: bool,
) {
    if hung {
        report.warnings.push(format!(
            "{} is left in place (the target did not answer, so nothing could be removed); \
             remove it with `rm -r {}` once the target answers again",
            run_dir.display(),
            run_dir.display()
        ));
    } else if !keep && !multi_host {
        if let Some(w) = finish_run_dir(target, run_dir) {
            report.warnings.push(w);
        }
    } else if !multi_host {
        mark_kept(target, run_dir);
    }
}

/// The engine's settings for this host's clients, from the command line.
pub(crate) fn engine_config(
    target: &Target,
    run_dir: &Path,
    clients: usize,
    workload: Workload,
    opts: &RunOpts,
    drop_caches: bool,
) -> engine::Config {
    engine::Config {
        target: target.clone(),
        run_dir: run_dir.to_path_buf(),
        clients,
        client_base: opts.client_base,
        workload: Arc::new(workload),
        write_size: opts.write_size,
        fsync: opts.fsync,
        drop_caches,
        read_other: opts.read_other
            && clients > 1
            && (opts.net.hosts.is_empty() || opts.net.clients_per_host > 1),
        // A stream is one file: there is no directory order to follow.
        native_order: opts.stream.is_none(),
        cleanup: !opts.out.keep,
        threads: opts
            .limits
            .threads
            .unwrap_or_else(|| engine::Config::default_threads(clients)),
        phase_timeout: Some(Duration::from_secs(opts.limits.phase_timeout)),
        direct: opts.direct,
    }
}

/// The workload options an agent needs to make the same rounds.
pub(crate) fn agent_args(dir: &Path, schedule: &Schedule, opts: &RunOpts) -> Vec<String> {
    let mut a = vec![dir.display().to_string()];
    match schedule {
        _ if opts.stream.is_some() => {
            a.extend(["--stream".into(), opts.stream.unwrap_or(0).to_string()]);
        }
        Schedule::Phases(p) => {
            a.push("--phases".into());
            a.push(p.iter().map(|p| p.name()).collect::<Vec<_>>().join(","));
        }
        Schedule::Random { initial, runs } => {
            a.extend(["--initial-dirs".into(), initial.to_string()]);
            a.extend(["--runs".into(), runs.to_string()]);
        }
    }
    a.extend([
        "--scale".into(),
        opts.scale.to_string(),
        "--seed".into(),
        opts.seed.to_string(),
        "--write-size".into(),
        opts.write_size.to_string(),
    ]);
    if let Some(t) = opts.limits.threads {
        a.extend(["--threads".into(), t.to_string()]);
    }
    for (on, flag) in [
        (opts.fsync, "--fsync"),
        (opts.no_sync, "--no-sync"),
        (opts.no_drop_caches, "--no-drop-caches"),
        (opts.read_other, "--read-other"),
        (opts.direct, "--direct"),
        (opts.out.allow_nonempty, "--allow-nonempty"),
        (opts.out.keep, "--keep"),
    ] {
        if on {
            a.push(flag.into());
        }
    }
    a
}

/// One host's part of a multi-host run.
pub(crate) fn agent(
    dir: &Path,
    opts: &RunOpts,
    clients: usize,
    group: Option<&str>,
) -> Result<(), Error> {
    check_common(clients, opts)?;
    let workload = match opts.stream {
        Some(size) => Workload::stream(size),
        None => make_workload(opts, &parse_schedule(opts, COMPILEBENCH_DEFAULT)?)?,
    };
    // Several agents may share DIR (one filesystem, several hosts): allow it.
    let target = parse_target(dir, opts.limits.io_timeout)?;
    let run_dir = prepare_run_dir(&target, true, group)?;
    let drop = !opts.no_sync && !opts.no_drop_caches;
    let dropped = drop && engine::drop_caches();
    if drop {
        // Said to the coordinator with every round's result: its record says so.
        remote::agent_caches_dropped(dropped);
    }
    if drop && !dropped {
        eprintln!("loadgen agent: dropping caches needs root; running without");
    }
    let cfg = engine_config(&target, &run_dir, clients, workload, opts, dropped);
    // The coordinator's `stop`, or its going away, stops this host's clients too.
    let stop = &loadgen::stop::INTERRUPTED;
    remote::agent_listen(stop);
    loadgen::stop::stop_on_signals();
    let o = engine::run_with_gate(
        &cfg,
        &Progress::default(),
        stop,
        &remote::agent_gate,
        remote::agent_report,
    );
    if o.hung {
        eprintln!(
            "loadgen agent: {} did not answer; {} is left in place",
            target.describe(),
            run_dir.display()
        );
        return Err(Error::Failed("the target did not answer".into()));
    }
    for l in o.left {
        eprintln!("loadgen agent: cleanup left: {l}");
    }
    if !opts.out.keep {
        if let Some(w) = finish_run_dir(&target, &run_dir) {
            eprintln!("loadgen agent: {w}");
        }
    } else {
        mark_kept(&target, &run_dir);
    }
    Ok(())
}

pub(crate) fn finish(report: &RunReport) -> Result<(), Error> {
    print!("{}", report::table(report));
    match &report.error {
        None => Ok(()),
        Some(e) if e.starts_with("interrupted") => Err(Error::Interrupted(format!(
            "interrupted by a signal: stopped cleanly; results so far are kept{}",
            if report.warnings.iter().any(|w| w.contains("left")) {
                " (see the warnings for what is left)"
            } else {
                "; everything it made is removed"
            }
        ))),
        Some(e) if e.contains("No space left") => Err(Error::Failed(format!(
            "the target filled up ({e}); results so far are kept; free space or use --scale"
        ))),
        Some(e) => Err(Error::Failed(format!(
            "stopped: {e}; results so far are kept"
        ))),
    }
}

/// The access test: N empty files in one directory, created then removed.
pub(crate) fn access_workload(files: usize) -> Workload {
    let entries = (0..files)
        .map(|i| Entry {
            path: format!("f{i:07}"),
            size: 0,
        })
        .collect();
    let mut w = Workload {
        lists: workload::Lists::only(entries),
        rounds: workload::phase_rounds(
            &mut loadgen::pyrandom::PyRandom::new(1),
            &[Phase::Create, Phase::DeleteTree],
            false,
        ),
    };
    // The files are its own, not a kernel tree: no patch or compile lists.
    w.lists.compile.clear();
    w
}

pub(crate) const WORK_OUTSIDE: &str =
    "--work must be local scratch space outside --share (the workstations' caches go there)";
