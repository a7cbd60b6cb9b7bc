//! `ccfs mount`: checks, the daemon spawned, its READY answer.

use crate::*;

/// The user a command without paths is about: `--user`, else whoever runs it.
pub(crate) fn named_user(user: Option<&str>) -> Result<String, Error> {
    match user {
        Some(u) => Ok(u.to_string()),
        None => ccfs::sys::user_by_uid(ccfs::sys::geteuid())
            .ok()
            .flatten()
            .map(|a| a.name)
            .ok_or_else(|| fail("cannot find your user name in the user database")),
    }
}

pub(crate) fn mount(args: MountArgs) -> Result<(), Error> {
    // --timeout counts from here: the checks below look at the share too.
    let start = Instant::now();
    let (share, mountpoint) = mount_paths(&args)?;
    let plan = daemon::plan_mount(
        &share,
        &mountpoint,
        args.cache_dir.as_deref(),
        args.config.as_deref(),
        args.user.as_deref(),
    )?;
    if args.foreground {
        if args.daemon {
            daemon::started_by_mount();
        }
        init_logging("info,fuser=error");
        return match daemon::run_foreground(&plan) {
            Ok(true) => Ok(()),
            Ok(false) => Err(fail(format!(
                "the logout sync did not finish; changes are kept in {} (run `ccfs recover --cache-dir {}`)",
                shown(&plan.cache_dir),
                shown(&plan.cache_dir)
            ))),
            Err(e) => Err(from_anyhow(e)),
        };
    }
    // Background: start the daemon as a child and return once it says the mount is live.
    // The daemon makes its cache directory and opens its own log (as the user, for a
    // mount made for one); until it is live its output comes here, through a pipe.
    let (mut child, output) = spawn_daemon(&plan)?;
    wait_until_live(&plan, &mut child, output, start, args.timeout)
}

/// The share and mount point: both given, or neither (the config's `[homes]` for the
/// user; the mount point made for root's `--user` mount the checks would not refuse).
fn mount_paths(args: &MountArgs) -> Result<(PathBuf, PathBuf), Error> {
    Ok(match (&args.share, &args.mountpoint) {
        (Some(s), Some(m)) => (s.clone(), m.clone()),
        (Some(_), None) => {
            return Err(user_error(
                "a share was given without a mount point",
                "give both SHARE and MOUNTPOINT, or neither to use the config's [homes]",
            )
            .into())
        }
        _ => {
            let (_, settings) = daemon::effective_config(args.config.as_deref())?;
            let name = named_user(args.user.as_deref())?;
            let (share, home) = daemon::home_paths(&settings, &name)?;
            // The mount point is made only for a request the checks below would not
            // refuse for a missing user or share.
            let user_exists = ccfs::sys::user_by_name(&name).ok().flatten().is_some();
            if args.user.is_some() && ccfs::sys::geteuid() == 0 && user_exists && share.is_dir() {
                daemon::make_mount_point(&settings.homes.home_root, &name)?;
            }
            (share, home)
        }
    })
}

/// Starts the daemon (`ccfs mount --foreground --daemon`) in a process group of its
/// own, its standard output and error a pipe whose reading end is returned.
fn spawn_daemon(
    plan: &daemon::MountPlan,
) -> Result<(std::process::Child, std::io::PipeReader), Error> {
    let exe = std::env::current_exe().map_err(|e| fail(format!("cannot find own binary: {e}")))?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg("--foreground")
        .arg("--daemon")
        .arg("--cache-dir")
        .arg(&plan.cache_dir);
    if let Some(c) = &plan.config {
        cmd.arg("--config").arg(c);
    }
    if let Some(u) = &plan.user {
        cmd.arg("--user").arg(&u.name);
    }
    cmd.arg(&plan.share).arg(&plan.mountpoint);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let (output, output_end) =
        std::io::pipe().map_err(|e| fail(format!("cannot make a pipe: {e}")))?;
    let output_end2 = output_end
        .try_clone()
        .map_err(|e| fail(format!("cannot make a pipe: {e}")))?;
    cmd.stdin(Stdio::null())
        .stdout(output_end)
        .stderr(output_end2);
    let child = cmd
        .spawn()
        .map_err(|e| fail(format!("cannot start the ccfs daemon: {e}")))?;
    // Our copies of the pipe's writing end go with `cmd`: the daemon holds the only ones.
    drop(cmd);
    Ok((child, output))
}

/// Waits for the daemon's READY line (within `timeout` seconds of `start`), showing
/// the mount when it comes; the daemon's last words when it exits first; a daemon that
/// is not live in time is stopped (and its mount, if any, lazily unmounted).
fn wait_until_live(
    plan: &daemon::MountPlan,
    child: &mut std::process::Child,
    output: std::io::PipeReader,
    start: Instant,
    timeout: u64,
) -> Result<(), Error> {
    let (lines_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(output)) {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut said: Vec<String> = Vec::new();
    let mut exited = None;
    loop {
        match lines.recv_timeout(Duration::from_millis(100)) {
            Ok(line) if line == daemon::READY_LINE => {
                say!(
                    "ccfs: mounted {} at {} (cache {}, pid {})",
                    shown(&plan.share),
                    shown(&plan.mountpoint),
                    shown(&plan.cache_dir),
                    child.id()
                );
                return Ok(());
            }
            Ok(line) => said.push(line),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if exited.is_none() {
                    exited = child.try_wait().ok().flatten().map(|s| (s, Instant::now()));
                }
                if exited.is_none() && start.elapsed() > Duration::from_secs(timeout) {
                    // Stopped, so that it cannot mount later over whatever comes instead.
                    let _ = child.kill();
                    let _ = child.wait();
                    if daemon::ccfs_mounts().is_ok_and(|m| m.contains(&plan.mountpoint)) {
                        let _ = fusermount(&plan.mountpoint, &["-u", "-z"]);
                    }
                    return Err(fail(format!(
                        "the mount did not come up within {} s (the share may hang); the daemon was stopped; see {}/ccfs.log",
                        timeout,
                        shown(&plan.cache_dir)
                    )));
                }
                // A process the daemon started may still hold the pipe: give it a moment.
                if exited.is_some_and(|(_, at)| at.elapsed() > Duration::from_secs(2)) {
                    break;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let status = match exited {
        Some((s, _)) => s,
        None => child
            .wait()
            .map_err(|e| fail(format!("cannot wait for the ccfs daemon: {e}")))?,
    };
    let last = said
        .iter()
        .rev()
        .find(|l| l.starts_with("ccfs:"))
        .or_else(|| said.last())
        .map(String::as_str)
        .unwrap_or("");
    let last = last.trim_start_matches("ccfs: error: ");
    // The daemon refused the input (exit 2, its line what and what to do): so does the
    // command, in the same words.
    if status.code() == Some(2) {
        if let Some((problem, fix)) = last.split_once("; ") {
            return Err(daemon::user_error(problem, fix).into());
        }
    }
    let why = if last.is_empty() {
        format!("it said nothing; see {}/ccfs.log", shown(&plan.cache_dir))
    } else {
        last.to_string()
    };
    Err(fail(format!(
        "the ccfs daemon exited ({status}) before the mount was live: {why}"
    )))
}
