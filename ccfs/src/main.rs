//! The `ccfs` command.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};

use ccfs::control::{self, Request, Status, SyncOutcome};

/// A line on standard output that never panics: a reader that went away (`ccfs status |
/// head -1`) costs the rest of the output, not the command (println! would panic).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// [`say!`] without the line break.
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}
use ccfs::daemon::{self, user_error, Recovered, UserError};

/// ccfs keeps writes to configuration files (dotfiles) of a home directory mounted from a
/// network share in a local cache, and syncs them back to the share at logout.
#[derive(Debug, Parser)]
#[command(name = "ccfs", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Mount SHARE at MOUNTPOINT; returns once the mount is live (unless --foreground).
    Mount(MountArgs),
    /// Log out: unmount, sync the cache back; exit 0 only if everything reached the share.
    Umount {
        /// The ccfs mount point (or --user).
        #[arg(required_unless_present = "user", conflicts_with = "user")]
        mountpoint: Option<PathBuf>,
        /// The home of this user: HOME_ROOT/NAME from the config's [homes].
        #[arg(long)]
        user: Option<String>,
        /// The config file that gives [homes] (default /etc/ccfs/ccfs.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// How long to wait, once unmounted, for the daemon to say how its logout sync
        /// went (it goes on in the background past that; `ccfs recover` sends what it
        /// leaves).
        #[arg(long, value_name = "SECS", default_value_t = 600)]
        wait: u64,
        /// When programs still use the mount: sync now, wait up to SECS for them to let
        /// go, then detach the mount lazily (the daemon syncs again and exits once the
        /// last of them ends). Without it a busy mount is refused.
        #[arg(long, value_name = "SECS")]
        busy_timeout: Option<u64>,
    },
    /// Sync the cache to the share now and stay mounted.
    Sync {
        /// The ccfs mount point.
        mountpoint: PathBuf,
    },
    /// Show dirty files and bytes, pending deletions and the last sync.
    Status {
        /// A ccfs mount point (default: every ccfs mount).
        mountpoint: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show what ccfs does on a throwaway share: a dotfile write stays local, a document
    /// goes straight through, logout syncs the dotfile.
    Demo {
        /// Keep the temporary directory (its path is printed).
        #[arg(long)]
        keep: bool,
    },
    /// Check the configuration and print the one in effect.
    Config {
        #[command(subcommand)]
        action: ConfigCmd,
    },
    /// The PAM session hook, run by pam_exec at open_session and close_session (root):
    /// the first login of a user on this host recovers and mounts their home, the last
    /// logout syncs and unmounts it; a login never fails because of ccfs.
    PamSession {
        /// The config file (default /etc/ccfs/ccfs.toml); only root may be able to change it.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Write man pages and shell completions into DIR (for packaging).
    #[command(hide = true)]
    GenerateDocs { dir: PathBuf },
    /// The PAM hook's fallback: bind-mount the user's home on the share at their home.
    #[command(hide = true)]
    BindHome {
        #[arg(long)]
        user: String,
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Finish what an earlier session left unsynced (safe at boot and before every mount).
    /// Root works on each cache as its owner.
    Recover {
        /// One cache directory (default: every cache under /var/tmp/ccfs or $CCFS_CACHE_ROOT).
        #[arg(long)]
        cache_dir: Option<PathBuf>,
        /// Only this user's caches (root only, as from a PAM session hook).
        #[arg(long, conflicts_with = "cache_dir")]
        user: Option<String>,
        /// The config file (default: /etc/ccfs/ccfs.toml when it exists; else, for a user,
        /// the one their mount used, and for root the built-in defaults). Root reads only
        /// a file only root can change. Root's recovery of every cache keeps to the
        /// file's [recovery] time limits.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigCmd {
    /// Validate the config file and print every key with the value in effect.
    Check {
        /// The file (default /etc/ccfs/ccfs.toml, else the built-in defaults).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
struct MountArgs {
    /// Local cache directory (default /var/tmp/ccfs/UID/NAME-OF-MOUNTPOINT).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// TOML config file (path classes, rsync, threads); see README.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Stay in the foreground and log to stderr.
    #[arg(long)]
    foreground: bool,
    /// Run as this user (root only, as from a PAM session hook): the share is accessed with
    /// the user's uid and groups and the cache belongs to the user.
    #[arg(long)]
    user: Option<String>,
    /// Give up when the mount is not live within SECS: the daemon is stopped and the
    /// command fails (as the PAM hook does, so a login never waits on a hung share).
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 600,
        conflicts_with = "foreground"
    )]
    timeout: u64,
    /// Started by `ccfs mount` in the background: report on standard output when the mount
    /// is live, log to CACHE/ccfs.log.
    #[arg(long, hide = true, requires = "foreground")]
    daemon: bool,
    /// The user's home directory on the network share (default SHARE_ROOT/NAME from the
    /// config's [homes], NAME the --user or you).
    #[arg(requires = "mountpoint")]
    share: Option<PathBuf>,
    /// Where to mount it, an empty directory (default HOME_ROOT/NAME, made if missing
    /// when root mounts for a user).
    mountpoint: Option<PathBuf>,
}

/// Logging that never takes the process down: a writer that swallows its errors (a full
/// disk under the daemon's log costs lines, not the mount) and a panic hook that only
/// formats and writes, ignoring failure (a hook that panicked would abort the process).
fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CCFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(daemon::LogWriter::new(ansi))
        .log_internal_errors(false)
        .with_ansi(ansi)
        .try_init();
    std::panic::set_hook(Box::new(|info| {
        let where_ = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        daemon::report_fatal(&format!(
            "ccfs: internal error{where_}: {}",
            daemon::LogText(&what)
        ));
    }));
}

/// A failure that is not the user's input: exit code 1.
struct Failure(String);

enum Error {
    User(UserError),
    Failure(Failure),
}

impl From<UserError> for Error {
    fn from(e: UserError) -> Self {
        Error::User(e)
    }
}

fn fail(msg: impl Into<String>) -> Error {
    Error::Failure(Failure(msg.into()))
}

fn from_anyhow(e: anyhow::Error) -> Error {
    match e.downcast::<UserError>() {
        Ok(u) => Error::User(u),
        Err(e) => fail(format!("{e:#}")),
    }
}

/// The user a command without paths is about: `--user`, else whoever runs it.
fn named_user(user: Option<&str>) -> Result<String, Error> {
    match user {
        Some(u) => Ok(u.to_string()),
        None => ccfs::sys::user_by_uid(ccfs::sys::geteuid())
            .ok()
            .flatten()
            .map(|a| a.name)
            .ok_or_else(|| fail("cannot find your user name in the user database")),
    }
}

fn mount(args: MountArgs) -> Result<(), Error> {
    // --timeout counts from here: the checks below look at the share too.
    let start = Instant::now();
    let (share, mountpoint) = match (args.share, args.mountpoint) {
        (Some(s), Some(m)) => (s, m),
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
    };
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
    let mut child = cmd
        .spawn()
        .map_err(|e| fail(format!("cannot start the ccfs daemon: {e}")))?;
    // Our copies of the pipe's writing end go with `cmd`: the daemon holds the only ones.
    drop(cmd);
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
                if exited.is_none() && start.elapsed() > Duration::from_secs(args.timeout) {
                    // Stopped, so that it cannot mount later over whatever comes instead.
                    let _ = child.kill();
                    let _ = child.wait();
                    if daemon::ccfs_mounts().is_ok_and(|m| m.contains(&plan.mountpoint)) {
                        let _ = fusermount(&plan.mountpoint, &["-u", "-z"]);
                    }
                    return Err(fail(format!(
                        "the mount did not come up within {} s (the share may hang); the daemon was stopped; see {}/ccfs.log",
                        args.timeout,
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
    Err(fail(format!(
        "the ccfs daemon exited ({status}) before the mount was live: {}",
        last.trim_start_matches("ccfs: error: ")
    )))
}

/// A path as ccfs prints it: printable ASCII only (see [`daemon::LogPath`]).
fn shown(p: &Path) -> String {
    daemon::LogPath(p).to_string()
}

/// How long `ccfs status` and `ccfs umount` wait for a daemon's status (the daemon looks
/// at the share for at most `control::PROBE_TIMEOUT` of it).
const STATUS_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `ccfs umount` waits for the logout sync's answer between two looks at whether
/// the share still answers.
const WAIT_SLICE: Duration = Duration::from_secs(5);

/// The ccfs mount at `mountpoint` and where its daemon listens, found in the mount table:
/// nothing asks the mount itself, which may be waiting on a dead or hung share.
fn control_socket(mountpoint: &Path) -> Result<control::MountRef, Error> {
    let entry = control::find_mount(mountpoint).map_err(|e| {
        user_error(
            format!("mountpoint {}: {e}", mountpoint.display()),
            "give the directory where ccfs is mounted",
        )
    })?;
    let Some(entry) = entry else {
        // Not a mount point of ccfs: looking at the path cannot hang on a share.
        if std::fs::symlink_metadata(mountpoint).is_err() {
            return Err(user_error(
                format!("mountpoint {} does not exist", mountpoint.display()),
                "give the directory where ccfs is mounted",
            )
            .into());
        }
        return Err(user_error(
            format!("{} is not a ccfs mount", mountpoint.display()),
            "see `ccfs status` for the ccfs mounts of this machine",
        )
        .into());
    };
    control::mount_ref(&entry).map_err(fail)
}

/// Why a mount's daemon could not be asked, in one line with what to do.
fn daemon_error(m: &control::MountRef, e: &std::io::Error) -> Error {
    let mp = m.mountpoint.display();
    if control::daemon_gone(e) {
        fail(format!(
            "{mp}: its ccfs daemon is gone ({e}): `fusermount3 -u -z {mp}`, then `ccfs recover --cache-dir {}`",
            m.cache_dir.display()
        ))
    } else if control::timed_out(e) {
        fail(format!(
            "{mp}: its ccfs daemon did not answer in time (stopped or stuck?); its log is {}",
            m.cache_dir.join("ccfs.log").display()
        ))
    } else {
        fail(format!("{mp}: cannot ask its ccfs daemon: {e}"))
    }
}

fn bad_answer(e: impl std::fmt::Display) -> Error {
    fail(format!("the ccfs daemon answered badly: {e}"))
}

fn print_outcome(what: &str, o: &SyncOutcome) {
    match (&o.report, &o.error) {
        (Some(r), _) => {
            say!(
                "ccfs: {what}: sent {} paths, deleted {} on the share in {:.2}s; left unsynced: {} paths, {} deletions",
                r.sent, r.deleted, r.seconds, r.remaining_dirty, r.remaining_deletions
            );
            match r.unchanged {
                0 => {}
                1 => say!("ccfs: {what}: 1 changed file was on the share as it is: not sent"),
                n => {
                    say!("ccfs: {what}: {n} changed files were on the share as they are: not sent")
                }
            }
            for e in &r.errors {
                say!("ccfs: {what}: {}", daemon::LogText(e));
            }
            for c in &r.conflicts {
                say!("ccfs: {what}: {}", describe_conflict(c));
            }
            for p in &r.kept_open {
                say!(
                    "ccfs: {what}: {} was sent as it was, and is kept as unsynced work: a program may still write it (it is open for writing, or mapped); the next sync, logout or recovery sends what it writes",
                    shown(p)
                );
            }
        }
        (None, Some(e)) if o.share_unreachable.is_some() => {
            say!("ccfs: {what} not started: {}", daemon::LogText(e))
        }
        (None, Some(e)) => say!("ccfs: {what} failed: {}", daemon::LogText(e)),
        (None, None) => {}
    }
}

fn describe_conflict(c: &ccfs::overlay::Conflict) -> String {
    use ccfs::overlay::ConflictKind as K;
    // Names from the cache and the share are the user's: printed escaped, one line each.
    let p = shown(&c.path);
    let kept = daemon::LogText(&c.kept);
    match c.kind {
        K::ModifiedOnBoth => format!(
            "conflict: {p} was changed on the share (another login?) and here; the share keeps the other version, ours is saved as {kept}"
        ),
        K::CreatedOnBoth => format!(
            "conflict: {p} was created on the share and here; the share keeps the other version, ours is saved as {kept}"
        ),
        K::DeletedHereModifiedThere => {
            format!("conflict: {p} was deleted here but changed on the share; the share's version is kept")
        }
        K::ModifiedHereDeletedThere => {
            format!("conflict: {p} was deleted on the share but changed here; ours is written back")
        }
        K::DatabaseChangedThere => format!(
            "conflict: the database {p} belongs to was changed on the share (another login?) since this journal or WAL was written here; the share keeps its database, ours is saved as {kept}"
        ),
    }
}

/// How an unmount went.
enum Unmounted {
    Done,
    /// Detached lazily: programs still use it.
    Lazily,
    /// Programs use it (fusermount3's words).
    Busy(String),
}

fn fusermount(mp: &Path, args: &[&str]) -> Result<Result<(), String>, Error> {
    let out = Command::new("fusermount3")
        .args(args)
        .arg(mp)
        .output()
        .map_err(|e| fail(format!("cannot run fusermount3: {e} (install fuse3)")))?;
    Ok(if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    })
}

/// Unmounts `mp`. While the share is unreachable a busy mount is detached lazily (the
/// programs holding it may be stuck on the share for good).
fn unmount_mount(mp: &Path, share_unreachable: bool) -> Result<Unmounted, Error> {
    let err = match fusermount(mp, &["-u"])? {
        Ok(()) => return Ok(Unmounted::Done),
        Err(err) => err,
    };
    if !err.contains("busy") {
        return Err(fail(format!("cannot unmount {}: {err}", mp.display())));
    }
    if !share_unreachable {
        return Ok(Unmounted::Busy(err));
    }
    match fusermount(mp, &["-u", "-z"])? {
        Ok(()) => Ok(Unmounted::Lazily),
        Err(err) => Err(fail(format!("cannot unmount {}: {err}", mp.display()))),
    }
}

/// The processes that use something below `mp` (working or root directory, program, open
/// file), as "name (pid N)", at most `max`. Only /proc is read, never the mount itself.
fn processes_using(mp: &Path, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    let below = |link: PathBuf| std::fs::read_link(link).is_ok_and(|t| t.starts_with(mp));
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let dir = p.path();
        let uses = ["cwd", "root", "exe"].iter().any(|l| below(dir.join(l)))
            || std::fs::read_dir(dir.join("fd"))
                .map(|fds| fds.flatten().any(|fd| below(fd.path())))
                .unwrap_or(false);
        if uses {
            let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            out.push(format!("{} (pid {pid})", daemon::LogText(name.trim())));
            if out.len() >= max {
                break;
            }
        }
    }
    out
}

/// Waits for the answer to `Wait` (the logout sync's outcome). Between slices it asks the
/// daemon whether the share still answers: when it does not, a sync under way may be stuck
/// on it for good, and the wait ends with None and that status.
/// How a wait for the logout sync's answer ended.
enum LogoutAnswer {
    Done(Box<SyncOutcome>),
    /// The share stopped answering during the sync.
    Unreachable(Box<Status>),
    /// No answer within the time given (a daemon still sending much data, or a control
    /// socket that answers but never finishes).
    Late,
}

fn wait_logout_answer(
    m: &control::MountRef,
    stream: &UnixStream,
    reader: &mut impl std::io::BufRead,
    limit: Duration,
) -> Result<LogoutAnswer, Error> {
    let ended = |e: &dyn std::fmt::Display| {
        fail(format!(
            "the ccfs daemon ended without finishing the logout sync ({e}); the changes are kept in {}: run `ccfs recover --cache-dir {}`",
            m.cache_dir.display(),
            m.cache_dir.display()
        ))
    };
    stream
        .set_read_timeout(Some(WAIT_SLICE))
        .map_err(|e| fail(format!("daemon: {e}")))?;
    let mut line = Vec::new();
    // The whole wait, however the answer trickles in, ends at the limit.
    let deadline = Instant::now() + limit;
    loop {
        match control::read_line_until(reader, &mut line, Some(deadline)) {
            Ok(control::LineRead::Closed) => return Err(ended(&"it closed the connection")),
            Ok(control::LineRead::Line) => {
                let outcome = serde_json::from_slice(&line).map_err(bad_answer)?;
                return Ok(LogoutAnswer::Done(Box::new(outcome)));
            }
            Ok(control::LineRead::Partial) => return Ok(LogoutAnswer::Late),
            Err(e) if control::timed_out(&e) => match control::status(m, STATUS_TIMEOUT) {
                Ok(st) if st.share_health.as_ref().is_some_and(|h| !h.is_reachable()) => {
                    return Ok(LogoutAnswer::Unreachable(Box::new(st)))
                }
                Ok(_) => {}
                // Between its answer on the other connection and its exit (it may take
                // this connection and end before answering it, or end before it read the
                // question: the kernel then resets this connection): that connection has
                // the answer, or ends without one.
                Err(e) if control::daemon_ending(&e) => {}
                Err(e) => return Err(daemon_error(m, &e)),
            },
            Err(e) => return Err(ended(&e)),
        }
    }
}

fn changes(n: usize) -> String {
    format!("{n} change{}", if n == 1 { "" } else { "s" })
}

fn umount(mountpoint: &Path, wait: Duration, busy_timeout: Option<Duration>) -> Result<(), Error> {
    let m = control_socket(mountpoint)?;
    let mp = m.mountpoint.clone();
    let status = control::status(&m, STATUS_TIMEOUT).map_err(|e| daemon_error(&m, &e))?;
    if status.mountpoint != mp {
        return Err(fail(format!(
            "the mount table names the cache of the mount at {} for {}; unmount that one",
            status.mountpoint.display(),
            mp.display()
        )));
    }
    let outage = status.share_health.clone().filter(|h| !h.is_reachable());
    let stream = control::connect(&m).map_err(|e| daemon_error(&m, &e))?;
    stream
        .set_read_timeout(Some(STATUS_TIMEOUT))
        .map_err(|e| fail(format!("daemon: {e}")))?;
    control::send(&stream, &Request::Wait).map_err(|e| daemon_error(&m, &e))?;
    let mut reader = std::io::BufReader::new(&stream);
    let ack = control::read_line_value(&mut reader, Some(Instant::now() + STATUS_TIMEOUT))
        .map_err(|e| daemon_error(&m, &e))?;
    if ack["waiting"] != true {
        return Err(bad_answer(ack));
    }
    let unmounted = match unmount_mount(&mp, outage.is_some())? {
        Unmounted::Busy(err) => match busy_timeout {
            None => {
                return Err(fail(format!(
                    "cannot unmount {}: {err}; close the programs using it (`fuser -vm {}`) and try again, or give --busy-timeout",
                    mp.display(),
                    mp.display()
                )))
            }
            Some(limit) => match busy_logout(&m, &mp, wait, limit)? {
                BusyEnd::Detached(result) => return result,
                // Unmounted after all: the logout sync runs, as at any unmount.
                BusyEnd::Unmounted => Unmounted::Done,
            },
        },
        u => u,
    };
    if matches!(unmounted, Unmounted::Lazily) {
        // The session, and with it the logout sync, ends only once the last program lets
        // go of the mount: nothing to wait for here.
        let health = outage.map(|h| h.describe()).unwrap_or_default();
        return Err(fail(format!(
            "unmounted {} lazily (programs still use it); share unreachable: {health}; {} kept in {}; the daemon (pid {}) sends them once those programs end if the share is back by then, else `ccfs recover` does once it is back",
            mp.display(),
            changes(status.changes()),
            m.cache_dir.display(),
            status.pid
        )));
    }
    let outcome = match wait_logout_answer(&m, &stream, &mut reader, wait)? {
        LogoutAnswer::Done(outcome) => *outcome,
        LogoutAnswer::Late => {
            return Err(fail(format!(
                "unmounted {}, but the daemon (pid {}) has not said within {} s how its logout sync went; it goes on in the background, and what it leaves in {} is sent by `ccfs recover`",
                mp.display(),
                status.pid,
                wait.as_secs(),
                m.cache_dir.display()
            )));
        }
        LogoutAnswer::Unreachable(st) => {
            let health = st
                .share_health
                .as_ref()
                .map(|h| h.describe())
                .unwrap_or_default();
            return Err(fail(format!(
                "unmounted {}, but the share stopped answering during the logout sync: {health}; {} kept in {}; the daemon (pid {}) finishes the sync if the share comes back, else `ccfs recover` sends them once it is back",
                mp.display(),
                changes(st.changes()),
                m.cache_dir.display(),
                st.pid
            )));
        }
    };
    // The daemon exits right after answering; wait so the cache is free for the next mount.
    let start = Instant::now();
    while ccfs::sys::process_alive(status.pid) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    if outcome.share_unreachable.is_some() {
        return Err(fail(format!(
            "unmounted {}; logout sync not started: {}",
            mp.display(),
            outcome.error.as_deref().unwrap_or("share unreachable")
        )));
    }
    print_outcome("logout sync", &outcome);
    if outcome.ok {
        say!(
            "ccfs: unmounted {}; all changes are on the share",
            mp.display()
        );
        Ok(())
    } else {
        Err(fail(format!(
            "unmounted {}, but not everything reached the share; the rest is kept in {} (run `ccfs recover --cache-dir {}`)",
            mp.display(),
            m.cache_dir.display(),
            m.cache_dir.display()
        )))
    }
}

/// A logout while programs still use the mount: what the session wrote is synced now,
/// then the programs get `limit` to let go; past that the mount is detached lazily and the
/// daemon, still serving them, syncs again and exits once the last one ends.
fn busy_logout(
    m: &control::MountRef,
    mp: &Path,
    wait: Duration,
    limit: Duration,
) -> Result<BusyEnd, Error> {
    let answer =
        control::request(m, &Request::Sync, Some(wait)).map_err(|e| daemon_error(m, &e))?;
    let outcome: SyncOutcome = serde_json::from_value(answer).map_err(bad_answer)?;
    if outcome.share_unreachable.is_none() {
        print_outcome("sync", &outcome);
    }
    let until = Instant::now() + limit;
    loop {
        match fusermount(mp, &["-u"])? {
            Ok(()) => return Ok(BusyEnd::Unmounted),
            Err(err) if !err.contains("busy") => {
                return Err(fail(format!("cannot unmount {}: {err}", mp.display())))
            }
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(200)),
            Err(_) => break,
        }
    }
    let users = processes_using(mp, 10);
    let pid = control::status(m, STATUS_TIMEOUT)
        .map(|s| s.pid.to_string())
        .unwrap_or_else(|_| "?".into());
    if let Err(err) = fusermount(mp, &["-u", "-z"])? {
        return Err(fail(format!("cannot detach {}: {err}", mp.display())));
    }
    let who = if users.is_empty() {
        "programs".to_string()
    } else {
        users.join(", ")
    };
    let detached = format!(
        "{} still in use after {} s by {who}; detached lazily: the daemon (pid {pid}) serves them and syncs again once the last one lets go",
        mp.display(),
        limit.as_secs()
    );
    Ok(BusyEnd::Detached(if outcome.ok {
        say!("ccfs: everything written so far is on the share; {detached}");
        Ok(())
    } else {
        Err(fail(format!(
            "the sync before detaching did not finish ({}); {detached}; what is left is kept in {}",
            outcome.error.as_deref().unwrap_or("incomplete"),
            m.cache_dir.display()
        )))
    }))
}

/// How a logout with a busy mount ended.
enum BusyEnd {
    /// The programs let go in time: unmounted the usual way.
    Unmounted,
    /// Detached lazily; the command's result.
    Detached(Result<(), Error>),
}

fn sync_cmd(mountpoint: &Path) -> Result<(), Error> {
    let m = control_socket(mountpoint)?;
    // No time limit: sending much data takes long, and the daemon does not start a sync
    // the share would hold up (it looks at the share first, for a bounded time).
    let answer = control::request(&m, &Request::Sync, None).map_err(|e| daemon_error(&m, &e))?;
    let outcome: SyncOutcome = serde_json::from_value(answer).map_err(bad_answer)?;
    if outcome.share_unreachable.is_some() {
        return Err(fail(format!(
            "sync not started: {}",
            outcome.error.as_deref().unwrap_or("share unreachable")
        )));
    }
    print_outcome("sync", &outcome);
    if outcome.ok {
        Ok(())
    } else {
        Err(fail(
            "the sync did not finish; the changes stay in the cache",
        ))
    }
}

fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

fn status_cmd(mountpoint: Option<&Path>, json: bool) -> Result<(), Error> {
    let mounts: Vec<Result<control::MountRef, Error>> = match mountpoint {
        Some(m) => vec![Ok(control_socket(m)?)],
        None => control::ccfs_mount_table()
            .map_err(|e| fail(format!("cannot read the mount table: {e}")))?
            .iter()
            .map(|e| control::mount_ref(e).map_err(fail))
            .collect(),
    };
    let listed = mounts.len();
    let mut all: Vec<Status> = Vec::new();
    for m in mounts {
        let one =
            m.and_then(|m| control::status(&m, STATUS_TIMEOUT).map_err(|e| daemon_error(&m, &e)));
        match one {
            // The same daemon seen through a second mount point (a bind mount).
            Ok(st) if all.iter().any(|s| s.cache_dir == st.cache_dir) => {}
            Ok(st) => all.push(st),
            // Listing every mount: one that cannot be asked is reported, not fatal.
            Err(Error::Failure(Failure(msg))) if mountpoint.is_none() => {
                daemon::report_fatal(&format!("ccfs: {msg}"))
            }
            Err(e) => return Err(e),
        }
    }
    if json {
        let text = match (mountpoint, all.first()) {
            (Some(_), Some(st)) => serde_json::to_string_pretty(st),
            _ => serde_json::to_string_pretty(&all),
        };
        say!("{}", text.map_err(|e| fail(e.to_string()))?);
        return Ok(());
    }
    if listed == 0 {
        say!("no ccfs mounts");
    }
    for st in all {
        say!(
            "{}  share {}  cache {}  pid {}",
            st.mountpoint.display(),
            st.share.display(),
            st.cache_dir.display(),
            st.pid
        );
        match &st.share_health {
            Some(h) if h.is_reachable() => say!("  share: reachable"),
            Some(h) => say!(
                "  share: unreachable: {}; syncs are not started, the cache keeps the changes",
                h.describe()
            ),
            None => say!("  share: not known (an older daemon)"),
        }
        say!(
            "  dirty: {} paths, {}   pending deletions: {}{}",
            st.dirty_files,
            human_bytes(st.dirty_bytes),
            st.pending_deletions,
            match st.counts_as_of {
                Some(t) => format!(
                    "   (counted at {}: the filesystem is busy waiting on the share)",
                    ccfs::sync::stamp(std::time::UNIX_EPOCH + Duration::from_secs(t))
                ),
                None => String::new(),
            }
        );
        let r = &st.requests;
        say!(
            "  requests served: {} ({} changing), read {}, written {}",
            r.total,
            r.mutating,
            human_bytes(r.read_bytes),
            human_bytes(r.write_bytes)
        );
        for c in &st.conflicts {
            say!("  {}", describe_conflict(c));
        }
        match &st.last_sync {
            None => say!("  last sync: none yet"),
            Some(o) => match (&o.report, &o.error) {
                (Some(r), _) => say!(
                    "  last sync: {} ({} sent, {} deleted, {:.2}s, unix time {})",
                    if o.ok { "ok" } else { "incomplete" },
                    r.sent,
                    r.deleted,
                    r.seconds,
                    r.finished_at
                ),
                (None, Some(_)) if o.share_unreachable.is_some() => {
                    say!("  last sync: not started (share unreachable)")
                }
                (None, Some(e)) => say!("  last sync: failed: {e}"),
                (None, None) => {}
            },
        }
    }
    Ok(())
}

fn recover(
    cache_dir: Option<&Path>,
    user: Option<&str>,
    config: Option<&Path>,
) -> Result<(), Error> {
    // Root reads only a config only root can change, and never one a cache names. Without
    // --config, the machine's /etc/ccfs/ccfs.toml when there is one.
    let (path, settings) = daemon::effective_config(config)?;
    let settings = path.is_some().then_some(settings);
    let dirs = match (cache_dir, user) {
        (Some(d), _) => {
            let meta = std::fs::symlink_metadata(d.join("meta.json"));
            if !meta.is_ok_and(|m| m.is_file()) {
                return Err(user_error(
                    format!("{} is not a ccfs cache directory", shown(d)),
                    "give the --cache-dir of an earlier mount",
                )
                .into());
            }
            vec![d.to_path_buf()]
        }
        (None, Some(name)) => {
            if ccfs::sys::geteuid() != 0 {
                return Err(user_error(
                    "--user needs root",
                    "run it as root (as a PAM session hook does), or leave --user out",
                )
                .into());
            }
            let account = ccfs::sys::user_by_name(name)
                .ok()
                .flatten()
                .ok_or_else(|| {
                    user_error(
                        format!("no such user: {}", daemon::LogText(name)),
                        "give an existing login name",
                    )
                })?;
            daemon::user_caches(account.uid)
        }
        (None, None) => daemon::in_turns(daemon::all_caches()),
    };
    // A cache whose lock processes of a dead daemon still hold (its rsync finishing) is
    // waited for, a minute at most, when one cache or one user's are recovered. Recovering
    // every cache (at boot, before logins) waits for none: no process of a daemon from
    // before the boot is left, and a lock some user's process holds must not hold up the
    // boot; such a cache is left for its user's next login.
    let patience = if cache_dir.is_none() && user.is_none() {
        Duration::ZERO
    } else {
        Duration::from_secs(60)
    };
    // Every cache (the boot's recovery, which logins wait for), and every cache of a user
    // (a login's, ccfs@.service's before logins), is bounded in all and per cache
    // ([recovery]); a cache not done in time is left for its user's next login, which
    // recovers that user's caches before it mounts.
    let every = cache_dir.is_none();
    let limits = settings
        .as_ref()
        .map(|s| s.recovery.clone())
        .unwrap_or_default();
    let started = Instant::now();
    let budget = Duration::from_secs(limits.all_caches_secs);
    let per_cache = Duration::from_secs(limits.per_cache_secs);
    let mut failed = 0;
    let mut held = 0;
    for (i, d) in dirs.iter().enumerate() {
        let name = shown(d);
        let limit = if every {
            let left = budget.saturating_sub(started.elapsed());
            if left < Duration::from_millis(200) {
                let rest = &dirs[i..];
                let named: Vec<String> = rest.iter().take(20).map(|d| shown(d)).collect();
                say!(
                    "ccfs: the recovery of {} reached its limit ([recovery] all_caches_secs = {}): {} cache(s) not reached, left for their users' next logins: {}{}",
                    if user.is_some() { "the user's caches" } else { "every cache" },
                    limits.all_caches_secs,
                    rest.len(),
                    named.join(", "),
                    if rest.len() > named.len() { ", ..." } else { "" }
                );
                failed += rest.len();
                break;
            }
            Some(left.min(per_cache))
        } else {
            None
        };
        match daemon::recover_cache(d, settings.as_ref(), patience, limit) {
            Ok(Recovered::Nothing) => say!("ccfs: {name}: nothing to recover"),
            Ok(Recovered::InUse(pid)) => {
                say!("ccfs: {name}: in use by a running mount (pid {pid}); skipped")
            }
            Ok(Recovered::Synced(o)) => {
                print_outcome(&format!("{name}: recover"), &o);
                let only_kept_open = o.report.as_ref().is_some_and(|r| {
                    r.ok && !r.kept_open.is_empty()
                        && r.remaining_dirty == r.kept_open.len()
                        && r.remaining_deletions == 0
                });
                if only_kept_open {
                    held += 1;
                } else if !o.ok {
                    failed += 1;
                }
            }
            Err(e)
                if e.downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::TimedOut) =>
            {
                say!(
                    "ccfs: {name}: not done within {} s ([recovery] per_cache_secs, or what was left of all_caches_secs; {e}): stopped as a crash would stop it, nothing lost; left for its user's next login",
                    limit.unwrap_or_default().as_secs()
                );
                failed += 1;
            }
            Err(e) => match from_anyhow(e) {
                Error::User(u) if cache_dir.is_some() => return Err(Error::User(u)),
                Error::User(u) => {
                    say!("ccfs: {name}: {u}");
                    failed += 1;
                }
                Error::Failure(Failure(m)) => {
                    say!("ccfs: {name}: recover failed: {m}");
                    failed += 1;
                }
            },
        }
    }
    if failed > 0 {
        return Err(fail(format!("{failed} cache(s) could not be recovered")));
    }
    if held > 0 {
        // Everything else is on the share; what a program may still write is not yet.
        return Err(fail(format!(
            "{held} cache(s) keep files still open for writing; the next sync or logout sends them"
        )));
    }
    Ok(())
}

fn umount_cmd(
    mountpoint: Option<PathBuf>,
    user: Option<String>,
    config: Option<PathBuf>,
    wait: u64,
    busy_timeout: Option<u64>,
) -> Result<(), Error> {
    let mountpoint = match (mountpoint, user) {
        (Some(m), _) => m,
        (None, user) => {
            let (_, settings) = daemon::effective_config(config.as_deref())?;
            let name = named_user(user.as_deref())?;
            daemon::home_paths(&settings, &name)?.1
        }
    };
    umount(
        &mountpoint,
        Duration::from_secs(wait),
        busy_timeout.map(Duration::from_secs),
    )
}

fn config_check(config: Option<&Path>) -> Result<(), Error> {
    let (path, settings) = daemon::effective_config(config)?;
    let text = toml::to_string_pretty(&settings.file)
        .map_err(|e| fail(format!("cannot print the configuration: {e}")))?;
    match &path {
        Some(p) => say!("# ccfs configuration from {} (valid)", shown(p)),
        None => say!(
            "# ccfs configuration: the built-in defaults ({} does not exist)",
            ccfs::config::SYSTEM_CONFIG
        ),
    }
    say_raw!("{text}");
    // The places [homes] names, as the PAM hook and `ccfs mount --user` will find them.
    let mut problems = Vec::new();
    let h = &settings.homes;
    for (key, dir, missing) in [
        (
            "cache_root",
            &h.cache_root,
            "made at the first mount; better now, before any user can make it: mkdir -m 755",
        ),
        (
            "home_root",
            &h.home_root,
            "mount points are made in it: mkdir -m 755",
        ),
    ] {
        match std::fs::symlink_metadata(dir) {
            Err(_) => say!(
                "# note: [homes].{key} {} does not exist ({missing} {})",
                shown(dir),
                shown(dir)
            ),
            Ok(m) => {
                use std::os::unix::fs::MetadataExt;
                if !m.is_dir() || m.uid() != 0 || m.mode() & 0o022 != 0 {
                    problems.push(format!(
                        "[homes].{key} {} must be a directory of root's that nobody else can write (it is uid {}, mode {:o}{}): another user could take what is made in it",
                        shown(dir),
                        m.uid(),
                        m.mode() & 0o7777,
                        if m.is_dir() { "" } else { ", not a directory" }
                    ));
                }
            }
        }
    }
    // Each ROOT/UID must be a directory of that uid (root makes it, then hands it over):
    // anything else there was made by someone else, in a cache root that was not root's.
    if problems.is_empty() {
        for e in std::fs::read_dir(&h.cache_root)
            .into_iter()
            .flatten()
            .flatten()
        {
            use std::os::unix::fs::MetadataExt;
            let name = e.file_name().to_string_lossy().into_owned();
            let ok = std::fs::symlink_metadata(e.path())
                .is_ok_and(|m| m.is_dir() && name.parse::<u32>().is_ok_and(|uid| uid == m.uid()));
            if !ok {
                problems.push(format!(
                    "{} is not a directory of the uid it is named for; remove it (ccfs makes each user's)",
                    shown(&e.path())
                ));
            }
        }
    }
    if std::fs::symlink_metadata(&h.share_root).is_err() {
        say!(
            "# note: [homes].share_root {} is not there (is the share mounted?)",
            shown(&h.share_root)
        );
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(fail(problems.join("; ")))
    }
}

/// `ccfs pam-session`: the hook reads only what pam_exec sets (PAM_TYPE, PAM_USER,
/// PAM_SERVICE, PAM_TTY); it always exits 0 under PAM, so a login never fails for it.
fn pam_session(config: Option<PathBuf>) -> Result<(), Error> {
    // Root alone: pam_exec without `seteuid` keeps the calling user's real ids (`su` run
    // by a user), which would let that user signal the hook and its daemon and make
    // umount(8) and access checks judge the user, not root.
    if ccfs::sys::geteuid() == 0 {
        ccfs::sys::become_root_alone();
    }
    let env: Vec<(std::ffi::OsString, std::ffi::OsString)> = std::env::vars_os().collect();
    // Started without its launcher (ccfs-clean-exec), the loader has already acted on
    // whatever of these the PAM environment held: say so, loudly.
    let loader: Vec<String> = env
        .iter()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .filter(|k| k.starts_with("LD_") || k == "GLIBC_TUNABLES")
        .collect();
    if !loader.is_empty() {
        ccfs::pam::warn_unlaunched(&loader);
    }
    // Of the environment pam_exec passes (which may hold what a user put in the PAM
    // environment), only PAM's own items are used; the rest goes before anything runs.
    for (k, _) in &env {
        if !k.to_string_lossy().starts_with("PAM_") {
            std::env::remove_var(k);
        }
    }
    std::env::set_var(
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    );
    if !env.iter().any(|(k, _)| k == "PAM_TYPE") {
        return Err(user_error(
            "PAM_TYPE is not set: this is the PAM session hook",
            "put `session optional pam_exec.so seteuid /usr/libexec/ccfs/ccfs-clean-exec /usr/bin/ccfs pam-session` in a PAM service (see ADMIN.md)",
        )
        .into());
    }
    ccfs::pam::run_from_env(&env, config);
    Ok(())
}

fn bind_home(user: &str, config: Option<&Path>) -> Result<(), Error> {
    if ccfs::sys::geteuid() != 0 {
        return Err(user_error("bind-home needs root", "run it as root").into());
    }
    let (_, settings) = daemon::effective_config(config)?;
    let account = ccfs::sys::user_by_name(user)
        .ok()
        .flatten()
        .ok_or_else(|| {
            user_error(
                format!("no such user: {}", daemon::LogText(user)),
                "give an existing login name",
            )
        })?;
    ccfs::pam::bind_home(&settings, &account)?;
    Ok(())
}

fn run_self(args: &[&std::ffi::OsStr]) -> Result<String, Error> {
    let exe = std::env::current_exe().map_err(|e| fail(format!("cannot find own binary: {e}")))?;
    let out = Command::new(exe)
        .args(args)
        .output()
        .map_err(|e| fail(format!("cannot run ccfs: {e}")))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(fail(format!(
            "`ccfs {}` failed: {text}",
            args.join(std::ffi::OsStr::new(" ")).to_string_lossy()
        )));
    }
    Ok(text)
}

fn show(label: &str, path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(t) => format!("{label:<44} {:?}", t.trim_end()),
        Err(_) => format!("{label:<44} (absent)"),
    }
}

fn demo(keep: bool) -> Result<(), Error> {
    let base = std::env::temp_dir().join(format!("ccfs-demo-{}", std::process::id()));
    let share = base.join("netshare/users/alice");
    let home = base.join("home/alice");
    let cache = base.join("cache");
    for d in [&share, &home] {
        std::fs::create_dir_all(d)
            .map_err(|e| fail(format!("cannot create {}: {e}", d.display())))?;
    }
    let io = |e: std::io::Error| fail(format!("demo: {e}"));
    std::fs::create_dir_all(share.join(".mozilla/firefox/demo.default")).map_err(io)?;
    std::fs::write(
        share.join(".mozilla/firefox/demo.default/prefs.js"),
        "user_pref(\"browser.startup.page\", 1);\n",
    )
    .map_err(io)?;
    std::fs::create_dir_all(share.join("Documents")).map_err(io)?;
    say!("== ccfs demo in {}", base.display());
    say!("share (the file server):  {}", share.display());
    say!("home  (the ccfs mount):   {}\n", home.display());
    say_raw!(
        "{}",
        run_self(&[
            "mount".as_ref(),
            "--cache-dir".as_ref(),
            cache.as_os_str(),
            share.as_os_str(),
            home.as_os_str()
        ])?
    );
    let prefs = ".mozilla/firefox/demo.default/prefs.js";
    let result = (|| -> Result<(), Error> {
        std::fs::write(
            home.join(prefs),
            "user_pref(\"browser.startup.page\", 3);\n",
        )
        .map_err(io)?;
        std::fs::write(home.join(".bashrc"), "alias ll='ls -l'\n").map_err(io)?;
        std::fs::create_dir_all(home.join(".cache/thumbnails")).map_err(io)?;
        std::fs::write(home.join(".cache/thumbnails/1.png"), "not really a png").map_err(io)?;
        std::fs::write(home.join("Documents/essay.txt"), "My essay, first draft.\n").map_err(io)?;
        say!(
            "\n-- during the session (the user wrote four files through {}):",
            home.display()
        );
        say!("{}", show("  home  prefs.js", &home.join(prefs)));
        say!(
            "{}",
            show("  share prefs.js  (still the old one)", &share.join(prefs))
        );
        say!(
            "{}",
            show("  share .bashrc   (not there yet)", &share.join(".bashrc"))
        );
        say!(
            "{}",
            show(
                "  share Documents/essay.txt (written at once)",
                &share.join("Documents/essay.txt")
            )
        );
        say!("\n-- ccfs status:");
        say_raw!("{}", run_self(&["status".as_ref(), home.as_os_str()])?);
        say!("\n-- logout (ccfs umount):");
        say_raw!("{}", run_self(&["umount".as_ref(), home.as_os_str()])?);
        say!("\n-- after logout, on the share:");
        say!("{}", show("  share prefs.js", &share.join(prefs)));
        say!("{}", show("  share .bashrc", &share.join(".bashrc")));
        say!(
            "{}",
            show(
                "  share .cache/thumbnails/1.png (local only)",
                &share.join(".cache/thumbnails/1.png")
            )
        );
        let synced = std::fs::read_to_string(share.join(prefs))
            .map_err(io)?
            .contains(", 3)")
            && share.join(".bashrc").is_file()
            && !share.join(".cache").exists();
        if !synced {
            return Err(fail("the share does not hold what the session wrote"));
        }
        say!("\nccfs demo: ok");
        Ok(())
    })();
    if daemon::ccfs_mounts()
        .map(|m| m.contains(&home))
        .unwrap_or(false)
    {
        let _ = Command::new("fusermount3").arg("-u").arg(&home).status();
    }
    if keep {
        say!("\nkept {}", base.display());
    } else {
        let _ = std::fs::remove_dir_all(&base);
    }
    result
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Mount(args) => mount(args),
        Cmd::Umount {
            mountpoint,
            user,
            config,
            wait,
            busy_timeout,
        } => umount_cmd(mountpoint, user, config, wait, busy_timeout),
        Cmd::Config {
            action: ConfigCmd::Check { config },
        } => config_check(config.as_deref()),
        Cmd::PamSession { config } => pam_session(config),
        Cmd::BindHome { user, config } => bind_home(&user, config.as_deref()),
        Cmd::GenerateDocs { dir } => {
            use clap::CommandFactory;
            clidocs::generate(Cli::command(), &dir)
                .map_err(|e| fail(format!("cannot write to {}: {e}", dir.display())))
        }
        Cmd::Sync { mountpoint } => sync_cmd(&mountpoint),
        Cmd::Status { mountpoint, json } => status_cmd(mountpoint.as_deref(), json),
        Cmd::Demo { keep } => demo(keep),
        Cmd::Recover {
            cache_dir,
            user,
            config,
        } => {
            init_logging("warn");
            recover(cache_dir.as_deref(), user.as_deref(), config.as_deref())
        }
    };
    // Written so that a closed or full standard error cannot panic (the daemon's is its
    // log, which may sit on a full disk).
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Error::User(e)) => {
            daemon::report_fatal(&format!("ccfs: error: {e}"));
            ExitCode::from(2)
        }
        Err(Error::Failure(Failure(m))) => {
            daemon::report_fatal(&format!("ccfs: error: {m}"));
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn contract_names_parse() {
        let c = Cli::try_parse_from([
            "ccfs",
            "mount",
            "--cache-dir",
            "/c",
            "--config",
            "/f.toml",
            "--foreground",
            "/s",
            "/m",
        ])
        .expect("mount parses");
        assert!(
            matches!(c.command, Cmd::Mount(ref a) if a.foreground && a.share.as_deref() == Some(Path::new("/s")))
        );
        assert!(Cli::try_parse_from(["ccfs", "umount", "/m"]).is_ok());
        assert!(Cli::try_parse_from(["ccfs", "sync", "/m"]).is_ok());
        assert!(Cli::try_parse_from(["ccfs", "status", "--json"]).is_ok());
        assert!(Cli::try_parse_from(["ccfs", "recover", "--cache-dir", "/c"]).is_ok());
        assert!(Cli::try_parse_from(["ccfs", "mount", "/only-one"]).is_err());
    }
}
