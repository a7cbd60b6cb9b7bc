//! The `ccfs` command.

#![deny(unsafe_code)]

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

mod cli;
use cli::*;

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
        /// Also list the unsynced paths and pending deletions, and the cache's size on
        /// its disk.
        #[arg(long, short = 'v')]
        verbose: bool,
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
    /// TOML config file (path classes, rsync, threads): its keys are in ccfs(1), FILES.
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
            clidocs::generate(Cli::command(), &dir, &cli::manual::sections())
                .map_err(|e| fail(format!("cannot write to {}: {e}", dir.display())))
        }
        Cmd::Sync { mountpoint } => sync_cmd(&mountpoint),
        Cmd::Status {
            mountpoint,
            json,
            verbose,
        } => status_cmd(mountpoint.as_deref(), json, verbose),
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
