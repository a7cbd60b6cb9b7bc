//! The `loadgen` command.

#![deny(unsafe_code)]

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand};

use loadgen::engine::{self, Progress};
use loadgen::remote;
use loadgen::report::{self, Environment, RunConfig, RunReport};
use loadgen::safety::unsafe_for_root;
use loadgen::store::{Kind, Store, Target};
use loadgen::workload::{self, Datasets, Entry, Phase, Schedule, Workload};

mod cli;
use cli::*;

/// A compilebench-like small-file workload generator: builds, compiles, reads and deletes
/// kernel-like source trees on a mounted directory, with per-operation latencies.
#[derive(Debug, Parser)]
#[command(name = "loadgen", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// The compilebench workload on the real kernel-tree file lists.
    Compilebench {
        /// The directory to run in (on the filesystem under test), or an NFS export as
        /// nfs://HOST[:PORT]/EXPORT, spoken to over NFSv3 without a kernel mount.
        dir: PathBuf,
        #[command(flatten)]
        opts: RunOpts,
        /// Concurrent clients, each on its own tree.
        #[arg(long, default_value_t = 1)]
        clients: usize,
    },
    /// The same work at several client counts; prints the clients x phase table.
    Sweep {
        dir: PathBuf,
        #[command(flatten)]
        opts: RunOpts,
        /// Client counts, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 6, 13, 40])]
        clients: Vec<usize>,
    },
    /// Charts (SVG and PNG) and an HTML page from result files (compilebench, sweep, access).
    Report {
        /// JSON result files.
        #[arg(required = true)]
        results: Vec<PathBuf>,
        /// Output directory.
        #[arg(short = 'o', long = "out")]
        out: PathBuf,
        /// TrueType font for the charts.
        #[arg(long, default_value = loadgen::charts::DEFAULT_FONT)]
        font: PathBuf,
    },
    /// One host's part of a multi-host run (started by --hosts; speaks a line protocol on
    /// stdin/stdout).
    #[command(hide = true)]
    Agent {
        dir: PathBuf,
        #[command(flatten)]
        opts: RunOpts,
        #[arg(long, default_value_t = 1)]
        clients: usize,
        /// The coordinated run this agent is part of: the run directories of the other
        /// agents of that run (hosts sharing DIR) are no leftovers to mention.
        #[arg(long)]
        run_group: Option<String>,
    },
    /// Sequential streaming per client: one large file each, written, written over, read and
    /// read again (iozone's write/rewrite/read/reread), at one or more client counts.
    Stream(StreamArgs),
    /// A class logging in at once: N homes on the share, every user's login burst, session
    /// and logout together, straight on the share or through ccfs (or both, --compare).
    LoginStorm(StormArgs),
    /// A host's part of a class across hosts (started by `login-storm --hosts` over SSH).
    #[command(hide = true)]
    StormAgent(StormAgentArgs),
    /// Write man pages and shell completions into DIR (for packaging).
    #[command(hide = true)]
    GenerateDocs { dir: PathBuf },
    /// The CNES access-time test: create N empty files, then remove them.
    Access {
        dir: PathBuf,
        /// How many files each client creates and removes.
        #[arg(long, default_value_t = 10_000)]
        files: usize,
        #[arg(long, default_value_t = 1)]
        clients: usize,
        #[command(flatten)]
        out: OutputOpts,
    },
}

#[derive(Debug, Args, Clone)]
struct StreamArgs {
    /// The directory to run in, or an NFS export as nfs://HOST[:PORT]/EXPORT.
    dir: PathBuf,
    /// Client counts, comma-separated: one run at each (e.g. 1,6,13,40).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize])]
    clients: Vec<usize>,
    /// Bytes each client writes and reads: a number with K, M, G or T (powers of 1024).
    #[arg(long, default_value = "1G")]
    size: String,
    /// Bytes per write and read call (K, M: powers of 1024).
    #[arg(long, default_value = "1M")]
    block: String,
    /// fsync the file at the end of the write and the rewrite (counted in them).
    #[arg(long)]
    fsync: bool,
    /// O_DIRECT: no page cache (the block must be a multiple of 4 KiB). An NFS target has
    /// no client cache either way.
    #[arg(long)]
    direct: bool,
    #[command(flatten)]
    limits: Limits,
    #[command(flatten)]
    out: OutputOpts,
    #[command(flatten)]
    net: HostOpts,
}

#[derive(Debug, Args, Clone)]
struct StormArgs {
    /// The directory on the share where the homes are made (a local directory works too).
    #[arg(long)]
    share: PathBuf,
    /// Users logging in at once; several sizes (1,5,10,20,30,60) run a class-size sweep:
    /// each size on fresh homes, and a table of the login time and the server's CPU
    /// against the class size, with the knee of each column.
    #[arg(long, value_delimiter = ',', default_values_t = vec![6usize])]
    users: Vec<usize>,
    /// Mount every home through its own ccfs (cache and mount point of its own).
    #[arg(long)]
    with_ccfs: bool,
    /// Without and with ccfs, each on homes of its own, and print both with their ratio.
    #[arg(long, conflicts_with = "with_ccfs")]
    compare: bool,
    /// Timed runs a mode; with --compare the order alternates (ABBA...). The table shows
    /// the median and the spread.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Without ccfs, where `.cache` is: `fair` puts it on the workstation's local disk
    /// (XDG_CACHE_HOME), as ccfs keeps it local-only; `share-cache` leaves it on the share.
    #[arg(long, value_enum)]
    baseline: Option<BaselineArg>,
    /// A shell command that mounts the share's client afresh, run before every run (after
    /// the sync and the dropped caches); e.g. `deploy/testbed/gluster.sh remount`. With
    /// --hosts each host runs it, `{host}` in it standing for the host's name.
    #[arg(long)]
    remount: Option<String>,
    /// A shell command that prints the file server's own counters as one JSON object
    /// ({"fops": {"OP": {"calls": N, "latency_us": T}}, "bytes_read": N, "bytes_written": N}),
    /// run at the start, at the end of the sessions and at the end of the logouts of every
    /// run; the table shows what the server served beside the meter's counts. A server
    /// that does not tell latencies or bytes leaves them out. E.g.
    /// `deploy/testbed/gluster.sh counts` (the bricks' profile), `moosefs.sh counts`,
    /// `ceph.sh counts`.
    #[arg(long)]
    server_counts: Option<String>,
    /// Seconds of session after the login (the profile's periodic actions run meanwhile).
    #[arg(long, default_value_t = 30)]
    session: u64,
    /// A home profile model (default: the shipped GNOME + Firefox one).
    #[arg(long)]
    profile: Option<PathBuf>,
    /// The ccfs binary (default: next to this loadgen, else on PATH).
    #[arg(long)]
    ccfs: Option<PathBuf>,
    /// A ccfs configuration file for the users' mounts (which paths are cached, kept
    /// local or passed through; see ccfs's README).
    #[arg(long)]
    ccfs_config: Option<PathBuf>,
    /// Users return to their workstations: each holds what an earlier session left (the
    /// local `.cache`; with ccfs, its cache, once ccfs's background copy of the blocks its
    /// files lack was done, as after a real session) (default: a first login).
    #[arg(long)]
    returning_users: bool,
    /// Local scratch space for mount points and the workstations' caches.
    #[arg(long, default_value = "/var/tmp/loadgen-storm")]
    work: PathBuf,
    /// Do not count at the share side (no metering ccfs mount in front of the share).
    #[arg(long)]
    no_meter: bool,
    /// Server process ids whose CPU time to measure (comma-separated).
    #[arg(long, value_delimiter = ',')]
    server_pids: Vec<u32>,
    /// A file listing server process ids, one a line (first word), as deploy/testbed keeps.
    #[arg(long)]
    server_pids_file: Option<PathBuf>,
    /// A file listing the client side's process ids (the share's FUSE client), read again
    /// before every run (a remount starts a new client). With --hosts each host reads its
    /// own, `{host}` in the path standing for the host's name.
    #[arg(long)]
    client_pids_file: Option<PathBuf>,
    /// Seconds from the start of each timed run over which server and client CPU are
    /// measured, the same for every run (longer for a run that lasts longer; default: the
    /// session plus 60 s when process ids are given).
    #[arg(long)]
    cpu_window: Option<u64>,
    /// Write the results as JSON (a list of every run, schema loadgen-login-storm/2).
    #[arg(long)]
    json: Option<PathBuf>,
    /// A name for the share under test (charts and tables).
    #[arg(long)]
    label: Option<String>,
    /// Keep the homes on the share at the end, and the workstations' mount points and caches
    /// (with the ccfs daemons' logs) in --work.
    #[arg(long)]
    keep: bool,
    /// No progress display (on a terminal, a status line; otherwise a line on stderr at
    /// each phase of each run).
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Run the class across these hosts (comma-separated), one `loadgen storm-agent` each
    /// over SSH, each with its own share client (--share is the path on the hosts) and,
    /// with ccfs, its own ccfs mounts; every host held at the login, the logout and the
    /// end together. --users is then the whole class, shared out over the hosts; `{host}`
    /// in --share is each host's name (hosts whose share clients are mounted at paths of
    /// their own).
    #[arg(long, value_delimiter = ',')]
    hosts: Vec<String>,
    /// Users on each host (with --hosts): a class of this many times the hosts.
    #[arg(long, requires = "hosts", conflicts_with = "users")]
    users_per_host: Option<usize>,
    /// How to reach a host (with --hosts): the command and its options; the host name and
    /// the agent's command follow.
    #[arg(long, default_value = "ssh -o BatchMode=yes", requires = "hosts")]
    ssh_command: String,
    /// loadgen's path on the hosts (default: this binary's path).
    #[arg(long, requires = "hosts")]
    remote_loadgen: Option<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum BaselineArg {
    Fair,
    ShareCache,
}

#[derive(Debug, Args, Clone)]
struct RunOpts {
    /// Phases to run, in order, each on a tree in the state it needs (prepared untimed).
    /// Names: initial-create, create, patch, compile, clean, read-tree, read-compiled,
    /// delete-tree, delete-compiled, stat-tree, stat-compiled. Without --phases and
    /// --runs, compilebench runs its random mode (and sweep the four phases
    /// create,compile,read-compiled,delete-compiled).
    #[arg(long, value_delimiter = ',')]
    phases: Option<Vec<String>>,
    /// compilebench's random mode: --initial-dirs trees, then N operations picked at
    /// random (compilebench: -r, default 100).
    #[arg(long)]
    runs: Option<usize>,
    /// Trees created before the random operations (compilebench: -i, default 30).
    #[arg(long)]
    initial_dirs: Option<usize>,
    /// Seed of the random choices (compilebench's is 555; the same seed gives the same
    /// operations as compilebench 0.6).
    #[arg(long, default_value_t = 555)]
    seed: u64,
    /// Use this fraction of the tree (0 < F <= 1), for quick runs.
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Bytes per write and read call, with K or M (compilebench: -b, 256 KiB).
    #[arg(long, default_value = "256K", value_parser = size_value)]
    write_size: usize,
    /// fsync every file written.
    #[arg(long)]
    fsync: bool,
    /// Do not sync at the end of each operation and do not drop caches between them
    /// (compilebench: -n, --no-sync).
    #[arg(long)]
    no_sync: bool,
    /// Sync, but keep the page cache between operations.
    #[arg(long)]
    no_drop_caches: bool,
    /// Each client reads and stats the tree of the next client (defeats a client-side
    /// cache); with --hosts, the next client on the same host.
    #[arg(long)]
    read_other: bool,
    #[command(flatten)]
    limits: Limits,
    #[command(flatten)]
    out: OutputOpts,
    #[command(flatten)]
    net: HostOpts,
    /// The number of this host's first client (set by the coordinator for its agents).
    #[arg(long, default_value_t = 0, hide = true)]
    client_base: usize,
    /// Run `loadgen stream`'s workload of this many bytes a client (set by the
    /// coordinator of a stream for its agents).
    #[arg(long, hide = true)]
    stream: Option<u64>,
    /// Open files with O_DIRECT (stream).
    #[arg(long, hide = true)]
    direct: bool,
}

/// How many calls at once, and how long a run waits on its target.
#[derive(Debug, Args, Clone)]
struct Limits {
    /// Worker threads, at most this many calls in flight (default: one a client, up to 64).
    #[arg(long)]
    threads: Option<usize>,
    /// Seconds a round (and the cleanup) may take before the run stops as hung, naming the
    /// target or host that did not answer.
    #[arg(long, default_value_t = 3600)]
    phase_timeout: u64,
    /// Seconds an NFS call (nfs:// targets) may wait for the server before it fails.
    #[arg(long, default_value_t = 60)]
    io_timeout: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            threads: None,
            phase_timeout: 3600,
            io_timeout: 60,
        }
    }
}

impl RunOpts {
    /// The options of a workload that is not compilebench's (access, stream): no phases or
    /// random mode, no sync or cache drop, one machine, nothing else asked.
    fn plain(write_size: usize, out: OutputOpts) -> Self {
        Self {
            phases: None,
            runs: None,
            initial_dirs: None,
            seed: 1,
            scale: 1.0,
            write_size,
            fsync: false,
            no_sync: true,
            no_drop_caches: true,
            read_other: false,
            limits: Limits::default(),
            out,
            net: HostOpts::default(),
            client_base: 0,
            stream: None,
            direct: false,
        }
    }
}

/// Where the clients run: this machine, or hosts reached over SSH.
#[derive(Debug, Args, Clone)]
struct HostOpts {
    /// Run the clients on these hosts (comma-separated), one `loadgen agent` each, started
    /// over SSH; every phase starts on all hosts together. DIR is the path on the hosts.
    #[arg(long, value_delimiter = ',')]
    hosts: Vec<String>,
    /// Clients on each host (with --hosts).
    #[arg(long, default_value_t = 1, requires = "hosts")]
    clients_per_host: usize,
    /// How to reach a host: the command and its options; the host name and the agent
    /// command follow.
    #[arg(long, default_value = "ssh -o BatchMode=yes", requires = "hosts")]
    ssh_command: String,
    /// loadgen's path on the hosts (default: this binary's path).
    #[arg(long, requires = "hosts")]
    remote_loadgen: Option<String>,
}

impl Default for HostOpts {
    fn default() -> Self {
        Self {
            hosts: Vec::new(),
            clients_per_host: 1,
            ssh_command: "ssh -o BatchMode=yes".into(),
            remote_loadgen: None,
        }
    }
}

/// Where results go and what loadgen may leave or touch; shared by every workload.
#[derive(Debug, Args, Clone, Default)]
struct OutputOpts {
    /// Write results as JSON (schema loadgen-result/2), after every phase.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write results as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Run even if DIR is not empty (loadgen only ever deletes what it created).
    #[arg(long)]
    allow_nonempty: bool,
    /// Keep the trees at the end.
    #[arg(long)]
    keep: bool,
    /// A name for the system under test, used by `loadgen report` (default: the fs type).
    #[arg(long)]
    label: Option<String>,
    /// No progress bar (there is none either when stderr is not a terminal).
    #[arg(long, short = 'q')]
    quiet: bool,
}

enum Error {
    /// Bad input: exit 2.
    User(String),
    /// The run failed: exit 1.
    Failed(String),
    /// Stopped by SIGINT or SIGTERM, cleanly: exit 130.
    Interrupted(String),
}

fn user(msg: impl Into<String>) -> Error {
    Error::User(msg.into())
}

fn main() -> ExitCode {
    // What loadgen makes is its own to change: never writable by others, whatever the
    // umask it was started with (root's 000 let a student swap a run directory).
    loadgen::sys::set_umask(0o022);
    let cli = match parse_command_line() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    if matches!(
        cli.command,
        Cmd::Compilebench { .. } | Cmd::Sweep { .. } | Cmd::Access { .. } | Cmd::Stream(_)
    ) {
        // Ctrl-C or SIGTERM: the clients stop at their next call, the results so far are
        // written, and what the run made is removed.
        loadgen::stop::stop_on_signals();
    }
    exit_code(dispatch(cli.command))
}

/// The command line as clap builds it, with negative numbers taken as values (then
/// refused by the option's own check, not as unknown flags).
fn command() -> clap::Command {
    fn negatives(c: clap::Command) -> clap::Command {
        c.mut_args(|a| {
            if a.get_action().takes_values() {
                a.allow_negative_numbers(true)
            } else {
                a
            }
        })
        .mut_subcommands(negatives)
    }
    use clap::CommandFactory;
    negatives(Cli::command())
}

/// The parsed command line; help and version printed (exit 0), a mistake said in one
/// line as every other input error is (exit 2).
fn parse_command_line() -> Result<Cli, ExitCode> {
    use clap::FromArgMatches;
    let parsed = command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m));
    parsed.map_err(|e| {
        use clap::error::ErrorKind;
        if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        // The command named, for where its help is when clap's message shows no usage.
        let named = std::env::args()
            .nth(1)
            .filter(|a| command().get_subcommands().any(|c| c.get_name() == a));
        let usage = match named {
            Some(c) => format!("loadgen {c}"),
            None => "loadgen".to_string(),
        };
        eprintln!(
            "loadgen: error: {}",
            one_line(&e.render().to_string(), &usage)
        );
        ExitCode::from(2)
    })
}

/// clap's error in one line: what is wrong, its tip or the values it takes, and where
/// the usage is (`error: unexpected argument '--x' found; see 'loadgen compilebench
/// --help'`).
fn one_line(rendered: &str, usage: &str) -> String {
    let lines: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let aside = |l: &str| {
        [
            "Usage: ",
            "tip:",
            "[possible values",
            "For more information",
        ]
        .iter()
        .any(|p| l.starts_with(p))
    };
    let mut first = lines
        .first()
        .copied()
        .unwrap_or("bad command line")
        .trim_start_matches("error: ")
        .to_string();
    // A list under the first line (the arguments not given) joins it.
    let listed: Vec<&str> = lines
        .iter()
        .skip(1)
        .take_while(|l| !aside(l))
        .copied()
        .collect();
    if first.ends_with(':') && !listed.is_empty() {
        first = format!("{first} {}", listed.join(", "));
    }
    let mut parts = vec![first];
    let mut usage = usage.to_string();
    for l in &lines {
        if let Some(u) = l.strip_prefix("Usage: ") {
            usage = u
                .split_whitespace()
                .take_while(|w| !w.starts_with(['[', '<', '-']))
                .collect::<Vec<_>>()
                .join(" ");
        } else if l.starts_with("tip:") || l.starts_with("[possible values") {
            parts.push(l.to_string());
        }
    }
    parts.push(format!("see '{usage} --help'"));
    parts.join("; ")
}

/// Runs the command.
fn dispatch(command: Cmd) -> Result<(), Error> {
    match command {
        Cmd::Compilebench { dir, opts, clients } => compilebench(&dir, &opts, clients),
        Cmd::Sweep { dir, opts, clients } => sweep(&dir, &opts, &clients),
        Cmd::GenerateDocs { dir } => {
            use clap::CommandFactory;
            clidocs::generate(Cli::command(), &dir, &cli::manual::sections())
                .map_err(|e| Error::Failed(format!("cannot write to {}: {e}", dir.display())))
        }
        Cmd::Report { results, out, font } => report_command(&results, &out, &font),
        Cmd::Agent {
            dir,
            opts,
            clients,
            run_group,
        } => agent(&dir, &opts, clients, run_group.as_deref()),
        Cmd::LoginStorm(a) => login_storm(&a),
        Cmd::StormAgent(a) => storm_agent(&a),
        Cmd::Stream(a) => stream(&a),
        Cmd::Access {
            dir,
            files,
            clients,
            out,
        } => access(&dir, files, clients, out),
    }
}

/// The exit code of a command's result, its error said on stderr: 2 for the user's
/// mistake, 1 for a failed run, 130 for an interrupted one.
fn exit_code(result: Result<(), Error>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Error::User(m)) => {
            eprintln!("loadgen: error: {m}");
            ExitCode::from(2)
        }
        Err(Error::Failed(m)) => {
            eprintln!("loadgen: error: {m}");
            ExitCode::from(1)
        }
        Err(Error::Interrupted(m)) => {
            eprintln!("loadgen: {m}");
            ExitCode::from(130)
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
        command().debug_assert();
    }

    #[test]
    fn a_clap_error_is_one_line_with_its_tip_and_where_help_is() {
        let e = command()
            .try_get_matches_from(["loadgen", "compilebench", "/tmp", "--bogus"])
            .expect_err("refused");
        let line = one_line(&e.render().to_string(), "loadgen");
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.starts_with("unexpected argument '--bogus' found"),
            "{line}"
        );
        assert!(
            line.ends_with("see 'loadgen compilebench --help'"),
            "{line}"
        );
        let e = command()
            .try_get_matches_from(["loadgen", "login-storm", "--share", "/s", "--baseline", "x"])
            .expect_err("refused");
        let line = one_line(&e.render().to_string(), "loadgen");
        assert!(
            line.contains("possible values: fair, share-cache"),
            "{line}"
        );
    }

    #[test]
    fn negative_numbers_reach_the_options_own_checks() {
        let m = command()
            .try_get_matches_from(["loadgen", "compilebench", "/tmp", "--scale", "-1"])
            .expect("parsed");
        let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&m).expect("cli");
        assert!(matches!(cli.command, Cmd::Compilebench { opts, .. } if opts.scale == -1.0));
    }
}
