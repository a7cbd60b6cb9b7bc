//! `loadgen login-storm`: a class logging in at once, with and without ccfs.

use crate::*;

/// Checks the login-storm arguments and builds its configuration.
pub(crate) fn storm_config(a: &StormArgs) -> Result<loadgen::storm::StormConfig, Error> {
    check_numbers(a)?;
    if !a.hosts.is_empty() {
        return across_config(a);
    }
    let share = checked_share(a)?;
    // Checked before anything is made, and again once the path is resolved.
    check_work(&a.work, &share)?;
    let (profile, profile_name) = profile(a)?;
    let ccfs = ccfs(a)?;
    let ccfs_config = ccfs_config(a, &ccfs)?;
    let (pids, client_pids_file) = measured_processes(a)?;
    let cpu_window = match a.cpu_window {
        Some(w) => Some(Duration::from_secs(w)),
        None if !pids.is_empty() || client_pids_file.is_some() => {
            Some(Duration::from_secs(a.session + 60))
        }
        None => None,
    };
    check_json(a)?;
    if let Some(cmd) = &a.server_counts {
        loadgen::storm::read_server_counts(cmd).map_err(user)?;
    }
    // Made last: bad input changes nothing.
    let work = made_work(a, &share)?;
    Ok(loadgen::storm::StormConfig {
        share,
        users: a.users.first().copied().unwrap_or(1),
        session: Duration::from_secs(a.session),
        profile: Arc::new(profile),
        profile_name,
        ccfs,
        work,
        meter: !a.no_meter,
        ccfs_config,
        returning_users: a.returning_users,
        baseline: baseline(a.baseline),
        repeat: a.repeat,
        remount: a.remount.clone(),
        server_counts: a.server_counts.clone(),
        client_pids_file,
        cpu_window,
        server_pids: pids,
        keep: a.keep,
        label: a.label.clone(),
        user_base: 0,
    })
}

/// The configuration of a class across hosts: `--share`, `--work`, ccfs and its
/// configuration are the hosts' (each agent checks its own); the class fits the hosts,
/// which are asked first whether loadgen runs there.
fn across_config(a: &StormArgs) -> Result<loadgen::storm::StormConfig, Error> {
    check_host_names(&a.hosts)?;
    let hosts = a.hosts.len();
    if class_sizes(a).iter().any(|&c| c < hosts) {
        return Err(user(format!(
            "--users: a class across {hosts} hosts needs at least {hosts} users (one a host)"
        )));
    }
    let (profile, profile_name) = profile(a)?;
    // The client's pid file is each host's (`{host}` in it), checked by its agent.
    let pids = server_processes(a)?;
    check_json(a)?;
    if let Some(cmd) = &a.server_counts {
        loadgen::storm::read_server_counts(cmd).map_err(user)?;
    }
    let check = loadgen::remote::Hosts {
        names: a.hosts.clone(),
        ssh: a
            .ssh_command
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        remote_loadgen: storm_hosts(a).map(|h| h.remote_loadgen).unwrap_or_default(),
        clients_per_host: 1,
    };
    loadgen::remote::check_hosts(&check).map_err(|e| {
        user(format!(
            "--hosts: loadgen does not run on {e}; check the host names, --ssh-command and \
             --remote-loadgen"
        ))
    })?;
    Ok(loadgen::storm::StormConfig {
        share: a.share.clone(),
        users: class_sizes(a).first().copied().unwrap_or(hosts),
        session: Duration::from_secs(a.session),
        profile: Arc::new(profile),
        profile_name,
        ccfs: ccfs_at(a.ccfs.as_deref()),
        work: a.work.clone(),
        meter: !a.no_meter,
        ccfs_config: a.ccfs_config.clone(),
        returning_users: a.returning_users,
        baseline: baseline(a.baseline),
        repeat: a.repeat,
        remount: a.remount.clone(),
        server_counts: a.server_counts.clone(),
        client_pids_file: a.client_pids_file.clone(),
        cpu_window: a
            .cpu_window
            .map(Duration::from_secs)
            .or_else(|| (!pids.is_empty()).then(|| Duration::from_secs(a.session + 60))),
        server_pids: pids,
        keep: a.keep,
        label: a.label.clone(),
        user_base: 0,
    })
}

/// The run without ccfs's `.cache`: `--baseline`, fair when not given.
pub(crate) fn baseline(b: Option<BaselineArg>) -> loadgen::storm::Baseline {
    match b {
        None | Some(BaselineArg::Fair) => loadgen::storm::Baseline::Fair,
        Some(BaselineArg::ShareCache) => loadgen::storm::Baseline::ShareCache,
    }
}

/// The class sizes to run: `--users`, or `--users-per-host` times the hosts.
pub(crate) fn class_sizes(a: &StormArgs) -> Vec<usize> {
    match a.users_per_host {
        Some(n) => vec![n * a.hosts.len()],
        None => a.users.clone(),
    }
}

/// Checks the numbers and the `--remount` command against their limits.
fn check_numbers(a: &StormArgs) -> Result<(), Error> {
    if a.users.iter().any(|&u| u == 0 || u > 1000) {
        return Err(user("--users must be between 1 and 1000"));
    }
    if a.users.windows(2).any(|w| w[0] >= w[1]) {
        return Err(user(
            "--users: give the class sizes of a sweep in increasing order, each once \
             (e.g. 1,5,10,20,30,60)",
        ));
    }
    if a.session > 86_400 {
        return Err(user("--session is in seconds, at most 86400 (one day)"));
    }
    if a.repeat == 0 || a.repeat > 50 {
        return Err(user("--repeat must be between 1 and 50"));
    }
    if a.cpu_window.is_some_and(|w| w == 0 || w > 86_400 * 2) {
        return Err(user(
            "--cpu-window is in seconds, between 1 and 172800 (two days)",
        ));
    }
    if a.baseline.is_some() && a.with_ccfs {
        return Err(user(
            "--baseline sets where the run without ccfs keeps .cache, and --with-ccfs runs \
             none: use --compare, or leave --baseline out",
        ));
    }
    let pids_given =
        !a.server_pids.is_empty() || a.server_pids_file.is_some() || a.client_pids_file.is_some();
    if a.cpu_window.is_some() && !pids_given {
        return Err(user(
            "--cpu-window is the window the CPU of --server-pids, --server-pids-file or \
             --client-pids-file is measured over: give one of them, or leave it out",
        ));
    }
    if a.remount.as_deref().is_some_and(|c| c.trim().is_empty()) {
        return Err(user(
            "--remount is empty; give the command that mounts the share's client again",
        ));
    }
    if a.server_counts
        .as_deref()
        .is_some_and(|c| c.trim().is_empty())
    {
        return Err(user(
            "--server-counts is empty; give the command that prints the server's counters",
        ));
    }
    Ok(())
}

/// The share, resolved: an existing directory that no other user can swap.
fn checked_share(a: &StormArgs) -> Result<PathBuf, Error> {
    share_for_root(&a.share)
}

/// `given` as a storm's share, resolved: an existing directory that no other user can
/// swap and that this user can write in (a host's agent checks its own the same way).
pub(crate) fn share_for_root(given: &Path) -> Result<PathBuf, Error> {
    let share = given.canonicalize().map_err(|e| {
        user(format!(
            "--share {} is not usable: {e}; give an existing directory on the share",
            given.display()
        ))
    })?;
    if !share.is_dir() {
        return Err(user(format!(
            "--share {} is not a directory",
            share.display()
        )));
    }
    // Root makes the homes and the mount points there (fusermount3 mounts where a path
    // leads): no other user may be able to swap them.
    if let Some(why) = unsafe_for_root(given).or_else(|| unsafe_for_root(&share)) {
        return Err(user(format!("--share: {why}")));
    }
    if !loadgen::sys::may_write(&share) {
        let why = std::io::Error::last_os_error();
        return Err(user(format!(
            "--share {} is not writable ({why}): the users' homes are made there; give a \
             directory on the share that this user can write in",
            share.display()
        )));
    }
    Ok(share)
}

/// `--ccfs-config`, resolved and checked with `ccfs config check` before anything runs;
/// refused without a mode that mounts the users' homes through ccfs.
fn ccfs_config(a: &StormArgs, ccfs: &Path) -> Result<Option<PathBuf>, Error> {
    let Some(c) = &a.ccfs_config else {
        return Ok(None);
    };
    if !a.with_ccfs && !a.compare {
        return Err(user(
            "--ccfs-config configures the users' ccfs mounts, and this storm has none: \
             add --with-ccfs or --compare, or leave --ccfs-config out",
        ));
    }
    let c = c
        .canonicalize()
        .map_err(|e| user(format!("--ccfs-config {} is not usable: {e}", c.display())))?;
    let out = Command::new(ccfs)
        .args(["config", "check", "--config"])
        .arg(&c)
        .output()
        .map_err(|e| user(format!("cannot run {} config check: {e}", ccfs.display())))?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        let why = why.trim().trim_start_matches("ccfs: error: ");
        return Err(user(format!("--ccfs-config {}: {why}", c.display())));
    }
    Ok(Some(c))
}

/// The home profile, and the name it is reported under: the shipped one, or
/// `--profile`'s.
fn profile(a: &StormArgs) -> Result<(loadgen::login::Profile, String), Error> {
    profile_at(a.profile.as_deref())
}

/// The profile at `p` (the shipped one without), and the name it is reported under.
pub(crate) fn profile_at(p: Option<&Path>) -> Result<(loadgen::login::Profile, String), Error> {
    use loadgen::login::Profile;
    Ok(match p {
        None => (Profile::embedded(), "gnome-firefox (shipped)".to_string()),
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| user(format!("cannot read --profile {}: {e}", p.display())))?;
            let prof = Profile::parse(&text)
                .map_err(|e| user(format!("--profile {}: {e}", p.display())))?;
            (prof, p.display().to_string())
        }
    })
}

/// The ccfs binary: `given`, else the one beside loadgen, else from PATH.
pub(crate) fn ccfs_at(given: Option<&Path>) -> PathBuf {
    match given {
        Some(c) => c.to_path_buf(),
        None => std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|d| d.join("ccfs")))
            .filter(|c| c.is_file())
            .unwrap_or_else(|| PathBuf::from("ccfs")),
    }
}

/// The ccfs binary (`--ccfs`, else the one beside loadgen, else from PATH), checked to
/// run when the storm needs it.
fn ccfs(a: &StormArgs) -> Result<PathBuf, Error> {
    let ccfs = ccfs_at(a.ccfs.as_deref());
    let needs_ccfs = a.with_ccfs || a.compare || !a.no_meter;
    if needs_ccfs
        && Command::new(&ccfs)
            .arg("--version")
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
    {
        return Err(user(format!(
            "cannot run ccfs ({}); build it (cargo build --release) or pass --ccfs PATH",
            ccfs.display()
        )));
    }
    Ok(ccfs)
}

/// The server processes whose CPU is measured, and the file listing the client's
/// (checked readable now, read again before every run).
fn measured_processes(a: &StormArgs) -> Result<(Vec<u32>, Option<PathBuf>), Error> {
    let pids = server_processes(a)?;
    let client_pids_file = match &a.client_pids_file {
        None => None,
        Some(f) => {
            loadgen::storm::read_pids_file(f)
                .map_err(|e| user(format!("--client-pids-file: {e}")))?;
            Some(
                f.canonicalize()
                    .map_err(|e| user(format!("--client-pids-file: {e}")))?,
            )
        }
    };
    Ok((pids, client_pids_file))
}

/// The server processes whose CPU is measured, each running now.
fn server_processes(a: &StormArgs) -> Result<Vec<u32>, Error> {
    let mut pids = a.server_pids.clone();
    if let Some(f) = &a.server_pids_file {
        pids.extend(
            loadgen::storm::read_pids_file(f)
                .map_err(|e| user(format!("--server-pids-file: {e}")))?,
        );
    }
    // A process that is not running would count as no CPU at all.
    if let Some(gone) = pids
        .iter()
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
    {
        return Err(user(format!(
            "--server-pids{}: no process {gone} is running; give the file server's \
             running processes (for instance pgrep -d, glusterfsd)",
            if a.server_pids.contains(gone) {
                ""
            } else {
                "-file"
            }
        )));
    }
    Ok(pids)
}

/// Checks that `--json`'s directory is safe for root to write in.
fn check_json(a: &StormArgs) -> Result<(), Error> {
    if let Some(j) = &a.json {
        let parent = match j.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        if let Some(why) = unsafe_for_root(parent) {
            return Err(user(format!("--json {}: {why}", j.display())));
        }
    }
    Ok(())
}

/// Makes the scratch space `--work` and checks it again once it exists (someone may have
/// made it first); returns it resolved.
fn made_work(a: &StormArgs, share: &Path) -> Result<PathBuf, Error> {
    let made = work_made(&a.work)?;
    check_work(&made, share)?;
    Ok(made)
}

/// `work` made (when missing) and checked again once it exists, resolved.
fn work_made(work: &Path) -> Result<PathBuf, Error> {
    let existed = work.exists();
    let work_abs = std::env::current_dir()
        .map(|d| d.join(work))
        .unwrap_or_else(|_| work.to_path_buf());
    // The names missing below the nearest one there, made one at a time and never
    // through a link someone put there meanwhile.
    let base = work_abs
        .ancestors()
        .find(|p| std::fs::symlink_metadata(p).is_ok())
        .unwrap_or(Path::new("/"))
        .to_path_buf();
    if let Ok(rel) = work_abs.strip_prefix(&base) {
        if rel.components().next().is_some() {
            loadgen::safety::make_dirs_below(&base, rel)
                .map_err(|e| user(format!("--work {} cannot be made: {e}", work.display())))?;
        }
    }
    // Again now that it exists: someone may have made it first.
    if let Some(why) = unsafe_for_root(work) {
        if !existed {
            let _ = std::fs::remove_dir(work);
        }
        return Err(user(format!("--work: {why}")));
    }
    work.canonicalize()
        .map_err(|e| user(format!("--work: {e}")))
}

/// `work` as a storm's scratch space beside `share` (resolved): outside the share, and no
/// other user able to swap it or a directory above it.
fn check_work(work: &Path, share: &Path) -> Result<(), Error> {
    let work_abs = std::env::current_dir()
        .map(|d| d.join(work))
        .unwrap_or_else(|_| work.to_path_buf());
    if work_abs.starts_with(share) || share.starts_with(&work_abs) {
        return Err(user(WORK_OUTSIDE));
    }
    if let Some(why) = work_abs
        .ancestors()
        .find(|p| p.exists())
        .and_then(unsafe_for_root)
    {
        return Err(user(format!("--work: {why}")));
    }
    Ok(())
}

/// [`check_work`], then `work` made and checked again, resolved (a host's agent).
pub(crate) fn work_for_root(work: &Path, share: &Path) -> Result<PathBuf, Error> {
    check_work(work, share)?;
    let made = work_made(work)?;
    check_work(&made, share)?;
    Ok(made)
}

pub(crate) fn login_storm(a: &StormArgs) -> Result<(), Error> {
    let cfg = storm_config(a)?;
    let hosts = storm_hosts(a);
    if hosts.is_none() {
        for line in loadgen::storm::clear_leftovers(&cfg) {
            eprintln!("loadgen login-storm: {line}");
        }
    }
    let sizes = class_sizes(a);
    loadgen::stop::stop_on_signals();
    let modes: Vec<bool> = if a.compare {
        vec![false, true]
    } else {
        vec![a.with_ccfs]
    };
    let schedule = loadgen::storm::schedule(&modes, cfg.repeat, cfg.meter);
    let display = StormDisplay::start(a.quiet);
    display.line(&format!(
        "{} run(s) of {} users: {} timed a mode{}{}",
        schedule.len() * sizes.len(),
        sizes
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        cfg.repeat,
        if a.compare {
            ", without and with ccfs in turn"
        } else if a.with_ccfs {
            ", through ccfs"
        } else {
            ", straight on the share"
        },
        if cfg.meter {
            ", then one a mode through the share meter for the counts"
        } else {
            ""
        }
    ));
    let mut write_error = None;
    let mut all: Vec<loadgen::storm::StormReport> = Vec::new();
    let mut failed = None;
    for &users in &sizes {
        let cfg = loadgen::storm::StormConfig {
            users,
            ..cfg.clone()
        };
        let on_run = |runs: &[loadgen::storm::StormReport]| {
            if let Some(r) = runs.last() {
                display.line(&run_done(r, runs.len(), schedule.len()));
            }
            if let Some(j) = &a.json {
                let v = serde_json::to_vec_pretty(&all.iter().chain(runs).collect::<Vec<_>>());
                if let Err(e) = write_out(j, &v.unwrap_or_default()) {
                    write_error = Some(format!("cannot write {}: {e}", j.display()));
                }
            }
        };
        let ran = match &hosts {
            Some(h) => runs_across(&cfg, h, &schedule, on_run),
            None => loadgen::storm::run(&cfg, &schedule, on_run),
        };
        match ran {
            Ok(runs) => all.extend(runs),
            Err(e) => failed = Some(e),
        }
        let stop = failed.is_some()
            || all.iter().any(|r| r.error.is_some())
            || loadgen::stop::INTERRUPTED.load(Ordering::Relaxed);
        if stop {
            break;
        }
    }
    display.stop();
    if all.is_empty() {
        if let Some(e) = failed {
            if loadgen::stop::INTERRUPTED.load(Ordering::Relaxed) {
                return Err(Error::Interrupted(format!(
                    "interrupted by a signal before a run ended: {e}"
                )));
            }
            return Err(Error::Failed(e));
        }
    }
    for &users in &sizes {
        let of_size: Vec<_> = all.iter().filter(|r| r.users == users).cloned().collect();
        print!("{}", loadgen::storm::table(&of_size));
    }
    print!("{}", loadgen::storm::sweep_table(&all));
    if loadgen::stop::INTERRUPTED.load(Ordering::Relaxed) {
        return Err(Error::Interrupted(
            "interrupted by a signal: stopped cleanly, homes and mounts removed".into(),
        ));
    }
    if let Some(e) = write_error.or(failed) {
        return Err(Error::Failed(e));
    }
    match all.iter().find_map(|r| r.error.clone()) {
        Some(e) => Err(Error::Failed(format!("stopped: {e}"))),
        None => Ok(()),
    }
}

/// A run's end, as the display says it: its times, or why it stopped.
fn run_done(r: &loadgen::storm::StormReport, n: usize, of: usize) -> String {
    let what = match &r.error {
        Some(e) => format!("stopped: {e}"),
        None if r.metered => "done (counts taken)".to_string(),
        None => format!(
            "done: login p50 {} s, logout p50 {} s",
            loadgen::storm::sig3(r.time_to_login.p50_s),
            loadgen::storm::sig3(r.logout.p50_s)
        ),
    };
    format!("run {n}/{of}, {}: {what}", r.run_name())
}

/// The storm's progress on stderr: on a terminal a status line (the run, its phase, the
/// users through it, the time in it), elsewhere a line at each phase change; nothing with
/// `--quiet`.
struct StormDisplay {
    bar: Option<indicatif::ProgressBar>,
    quiet: bool,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StormDisplay {
    fn start(quiet: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tty = std::io::stderr().is_terminal();
        let bar = (!quiet && tty).then(|| {
            let style =
                indicatif::ProgressStyle::with_template("{spinner} {prefix} {msg} [{elapsed}]")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner());
            indicatif::ProgressBar::new_spinner().with_style(style)
        });
        let thread = (!quiet).then(|| {
            let bar = bar.clone();
            let stop = stop.clone();
            std::thread::spawn(move || show(bar, &stop))
        });
        Self {
            bar,
            quiet,
            stop,
            thread,
        }
    }

    /// A line of its own, above the status line on a terminal, after the phase changes
    /// before it.
    fn line(&self, s: &str) {
        let _order = SAID.lock();
        if !self.quiet {
            say_changes(self.bar.as_ref());
        }
        match &self.bar {
            Some(b) => b.println(format!("loadgen login-storm: {s}")),
            None if !self.quiet => eprintln!("loadgen login-storm: {s}"),
            None => {}
        }
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// Held while the phase changes taken are said, so that the lines keep their order.
static SAID: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The phase changes not yet said: the status line's run and phase on a terminal, a
/// line each elsewhere.
fn say_changes(bar: Option<&indicatif::ProgressBar>) {
    for c in loadgen::storm::PROGRESS.changes() {
        match bar {
            Some(b) => {
                b.set_prefix(c.describe());
                b.reset_elapsed();
            }
            None => eprintln!("loadgen login-storm: {}", c.describe()),
        }
    }
}

/// The display's loop: every phase change (a line each off a terminal), and the status
/// line redrawn ten times a second on one.
fn show(bar: Option<indicatif::ProgressBar>, stop: &AtomicBool) {
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        {
            let _order = SAID.lock();
            say_changes(bar.as_ref());
        }
        if let Some(b) = &bar {
            b.set_message(loadgen::storm::PROGRESS.now().counts());
            b.tick();
        }
        if stopping {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
