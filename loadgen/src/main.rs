//! The `loadgen` command.

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

/// A size: digits with an optional K, M, G or T (powers of 1024; KiB etc. too).
fn parse_size(flag: &str, v: &str) -> Result<u64, Error> {
    let bad = || {
        user(format!(
            "{flag} {v:?} is not a size; write a number with K, M, G or T (e.g. 1G, 512M)"
        ))
    };
    let t = v.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, mult) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        Some('T' | 't') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n: u64 = num.trim().parse().map_err(|_| bad())?;
    n.checked_mul(mult).filter(|b| *b > 0).ok_or_else(bad)
}

/// `loadgen stream`: checks its arguments, then one run a client count.
fn stream(a: &StreamArgs) -> Result<(), Error> {
    let size = parse_size("--size", &a.size)?;
    let block = parse_size("--block", &a.block)?;
    if block > 64 << 20 {
        return Err(user("--block must be at most 64M"));
    }
    if a.direct && block % engine::DIRECT_ALIGN as u64 != 0 {
        return Err(user(
            "--direct needs a --block that is a multiple of 4K (O_DIRECT's alignment)",
        ));
    }
    if a.direct && size % engine::DIRECT_ALIGN as u64 != 0 {
        return Err(user("--direct needs a --size that is a multiple of 4K"));
    }
    let opts = RunOpts {
        fsync: a.fsync,
        limits: a.limits.clone(),
        net: a.net.clone(),
        stream: Some(size),
        direct: a.direct,
        ..RunOpts::plain(block as usize, a.out.clone())
    };
    if !opts.net.hosts.is_empty() && a.clients != [1] {
        return Err(user(
            "--clients counts clients on this machine; with --hosts use --clients-per-host",
        ));
    }
    for &c in &a.clients {
        check_common(c, &opts)?;
    }
    check_outputs(&opts.out)?;
    let schedule = Schedule::Phases(workload::STREAM_PHASES.to_vec());
    let mut runs = Vec::new();
    for &c in &a.clients {
        if a.clients.len() > 1 {
            eprintln!("loadgen stream: {c} clients");
        }
        let r = run_workload(
            "stream",
            &a.dir,
            Workload::stream(size),
            &schedule,
            c,
            &opts,
            false,
        )?;
        let stop = r.error.is_some() || loadgen::login::INTERRUPTED.load(Ordering::Relaxed);
        runs.push(r);
        if stop {
            break;
        }
    }
    let one = runs.len() == 1;
    for r in &runs {
        if one {
            print!("{}", report::table(r));
        }
    }
    if !one {
        print!("{}", report::sweep_table(&runs));
    }
    finish_runs(&runs, &opts.out, !one, "a smaller --size")
}

/// Writes the runs of a sweep or a stream (JSON: a list, or the one run when `list` is
/// false; CSV: every run's rows) and says how they ended; `smaller` is what to try when
/// the target filled up.
fn finish_runs(
    runs: &[RunReport],
    out: &OutputOpts,
    list: bool,
    smaller: &str,
) -> Result<(), Error> {
    if let Some(j) = &out.json {
        let v = match runs {
            [one] if !list => report::to_json(one),
            _ => serde_json::to_vec_pretty(runs).unwrap_or_default(),
        };
        write_out(j, &v)
            .map_err(|e| Error::Failed(format!("cannot write {}: {e}", j.display())))?;
    }
    if let Some(c) = &out.csv {
        write_out(c, &report::sweep_csv(runs))
            .map_err(|e| Error::Failed(format!("cannot write {}: {e}", c.display())))?;
    }
    match runs.iter().find_map(|r| r.error.clone()) {
        Some(e) if e.starts_with("interrupted") => Err(Error::Interrupted(
            "interrupted by a signal: stopped cleanly; results so far are kept".into(),
        )),
        Some(e) if e.contains("No space left") => Err(Error::Failed(format!(
            "the target filled up ({e}); results so far are kept; free space or use {smaller}"
        ))),
        Some(e) => Err(Error::Failed(format!(
            "stopped: {e}; results so far are kept"
        ))),
        None => Ok(()),
    }
}

#[derive(Debug, Args, Clone)]
struct StormArgs {
    /// The directory on the share where the homes are made (a local directory works too).
    #[arg(long)]
    share: PathBuf,
    /// Users logging in at once.
    #[arg(long, default_value_t = 6)]
    users: usize,
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
    #[arg(long, value_enum, default_value_t = BaselineArg::Fair)]
    baseline: BaselineArg,
    /// A shell command that mounts the share's client afresh, run before every run (after
    /// the sync and the dropped caches); e.g. `deploy/testbed/gluster.sh remount`.
    #[arg(long)]
    remount: Option<String>,
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
    /// local `.cache`; with ccfs, its cache) (default: a first login).
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
    /// before every run (a remount starts a new client).
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
    /// Keep the homes on the share at the end.
    #[arg(long)]
    keep: bool,
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
    /// Bytes per write and read call (compilebench: -b, 256 KiB).
    #[arg(long, default_value_t = 256 * 1024)]
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
    #[arg(long, default_value_t = 1)]
    clients_per_host: usize,
    /// How to reach a host: the command and its options; the host name and the agent
    /// command follow.
    #[arg(long, default_value = "ssh -o BatchMode=yes")]
    ssh_command: String,
    /// loadgen's path on the hosts (default: this binary's path).
    #[arg(long)]
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

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The target named on the command line: a directory, or an `nfs://` URL (whose calls
/// wait at most `io_timeout` seconds for the server).
fn parse_target(dir: &Path, io_timeout: u64) -> Result<Target, Error> {
    let mut t = Target::parse(&dir.to_string_lossy()).map_err(user)?;
    if let Target::Nfs(url) = &mut t {
        url.timeout = Duration::from_secs(io_timeout);
    }
    Ok(t)
}

/// Checks the target and makes the run directory with its marker.
fn prepare_run_dir(
    target: &Target,
    allow_nonempty: bool,
    group: Option<&str>,
) -> Result<PathBuf, Error> {
    let mut store = Store::connect(target);
    if let Store::Failed(e) = &store {
        return Err(user(e.clone()));
    }
    let name = target.describe();
    let base = target.base();
    let kind = store.stat(&base).map_err(|e| {
        user(format!(
            "{name} is not usable: {e}; give an existing directory on the filesystem to test"
        ))
    })?;
    if kind != Kind::Dir {
        return Err(user(format!("{name} is not a directory; give a directory")));
    }
    let base = match target {
        Target::Local(_) => {
            if let Some(why) = unsafe_for_root(&base) {
                return Err(user(why));
            }
            // From here on the resolved path: no link in it left to swap.
            loadgen::safety::resolved(&base)
                .map_err(|e| user(format!("cannot resolve {name}: {e}")))?
        }
        _ => base,
    };
    clear_leftovers(&mut store, &base, group);
    let empty = store
        .is_empty_dir(&base)
        .map_err(|e| user(format!("cannot list {name}: {e}")))?;
    if !empty && !allow_nonempty {
        return Err(user(format!(
            "{name} is not empty; use an empty directory, or --allow-nonempty (loadgen deletes only what it creates)"
        )));
    }
    let run = base.join(format!("loadgen-run-{}-{}", now_unix(), std::process::id()));
    store.mkdir(&run).map_err(|e| {
        Error::Failed(format!(
            "cannot create {} in {name}: {e}; check that it is writable",
            run.display()
        ))
    })?;
    store
        .put(&run.join(".loadgen-run"), &marker(false, group))
        .map_err(|e| Error::Failed(format!("cannot write in {}: {e}", run.display())))?;
    Ok(run)
}

/// Marks a run directory kept on purpose (--keep): a later run leaves it alone.
fn mark_kept(target: &Target, run: &Path) {
    let _ = Store::connect(target).put(&run.join(".loadgen-run"), &marker(true, None));
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// A run directory's marker: whose it is (this process on this host, part of the
/// coordinated run `group` if any), and whether the run ended and kept it on purpose
/// (--keep).
fn marker(kept: bool, group: Option<&str>) -> Vec<u8> {
    let v = serde_json::json!({
        "tool": "loadgen",
        "pid": std::process::id(),
        "host": hostname(),
        "group": group,
        "kept": kept,
    });
    let mut b = v.to_string().into_bytes();
    b.push(b'\n');
    b
}

/// Whether a process `pid` runs on this host (any process: one that took the number over
/// keeps a directory from being taken for a leftover, never the other way round).
fn process_exists(pid: u64) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The run directories earlier runs left in `base`: one a run killed on this host left
/// (its process gone, not kept on purpose) is removed, saying so; any other is named with
/// how to remove it once its run is over.
fn clear_leftovers(store: &mut Store, base: &Path, group: Option<&str>) {
    let Ok(entries) = store.readdir(base) else {
        return;
    };
    for (name, kind) in entries {
        if kind != Kind::Dir || !name.starts_with("loadgen-run-") {
            continue;
        }
        let dir = base.join(&name);
        let m: Option<serde_json::Value> = store
            .open_read(&dir.join(".loadgen-run"), false)
            .ok()
            .and_then(|mut h| {
                let mut buf = vec![0u8; 4096];
                let n = store.read(&mut h, &mut buf).ok()?;
                let _ = store.close(h);
                serde_json::from_slice(&buf[..n]).ok()
            });
        let Some(m) = m.filter(|m| m["tool"] == "loadgen") else {
            eprintln!(
                "loadgen: note: {} has no loadgen marker; left alone",
                dir.display()
            );
            continue;
        };
        let pid = m["pid"].as_u64().unwrap_or(0);
        let host = m["host"].as_str().unwrap_or("").to_string();
        if group.is_some() && m["group"].as_str() == group {
            // Another agent of this very run, on a host sharing the directory.
            continue;
        }
        if m["kept"] == true {
            eprintln!(
                "loadgen: note: {} was kept by an earlier run (--keep); remove it with `rm -r {}` when done with it",
                dir.display(),
                dir.display()
            );
        } else if host == hostname()
            && pid > 0
            && !process_exists(pid)
            && !ours_to_remove(store, &dir)
        {
            eprintln!(
                "loadgen: note: {} looks left by a run that was killed, but is not this user's \
                 own directory; left alone (remove it by hand if it is a leftover)",
                dir.display()
            );
        } else if host == hostname() && pid > 0 && !process_exists(pid) {
            let removed = match store {
                // Without following a symbolic link put anywhere in it meanwhile.
                Store::Local => std::fs::remove_dir_all(&dir),
                _ => loadgen::engine::remove_tree(store, &dir),
            };
            match removed {
                Ok(()) => eprintln!(
                    "loadgen: removed {}, left by a run that was killed (pid {pid})",
                    dir.display()
                ),
                Err(e) => eprintln!(
                    "loadgen: note: {} was left by a run that was killed (pid {pid}) and cannot be removed ({e}); remove it with `rm -r {}`",
                    dir.display(),
                    dir.display()
                ),
            }
        } else {
            eprintln!(
                "loadgen: note: {} is another run's ({}pid {pid}); if that run is over, remove it with `rm -r {}`",
                dir.display(),
                if host.is_empty() { String::new() } else { format!("host {host}, ") },
                dir.display()
            );
        }
    }
}

/// Whether a leftover run directory is this user's to remove: on a local target, a real
/// directory (not a symbolic link) owned by this user, as the run directory loadgen made
/// is; anyone can write a marker. (Over NFS, loadgen's own client follows no symbolic
/// link, and the server checks every removal.)
fn ours_to_remove(store: &Store, dir: &Path) -> bool {
    match store {
        Store::Local => loadgen::safety::owned_by_me(dir),
        _ => true,
    }
}

/// Removes the run directory if it holds only what loadgen left (its marker); otherwise
/// says what is left and how to remove it.
fn finish_run_dir(target: &Target, run: &Path) -> Option<String> {
    let mut store = Store::connect(target);
    let marker = run.join(".loadgen-run");
    let left = |why: String| {
        Some(format!(
            "{why}; {} is left in place: it holds only what loadgen made, remove it with \
             `rm -r {}` (on the target) once it answers again",
            run.display(),
            run.display()
        ))
    };
    match store.stat(&marker) {
        Ok(Kind::File) => {}
        Ok(_) => return left(format!("{} is not loadgen's marker", marker.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Some(format!(
                "{} lost its marker (something removed it); left in place",
                run.display()
            ))
        }
        Err(e) => return left(format!("the run directory could not be checked ({e})")),
    }
    if let Err(e) = store.unlink(&marker) {
        return left(format!("its marker could not be removed ({e})"));
    }
    match store.rmdir(run) {
        Ok(()) => None,
        Err(e) => {
            // Put the marker back so a later look can tell whose directory this is.
            let _ = store.put(&marker, b"{\"tool\":\"loadgen\"}\n");
            left(format!("it was not empty at the end ({e})"))
        }
    }
}

/// The rounds' schedule from the options; `default` when neither --phases nor --runs.
fn parse_schedule(opts: &RunOpts, default: Schedule) -> Result<Schedule, Error> {
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
const COMPILEBENCH_DEFAULT: Schedule = Schedule::Random {
    initial: 30,
    runs: 100,
};

/// The four phases of the compilebench blog, the default of a sweep.
fn sweep_default() -> Schedule {
    Schedule::Phases(vec![
        Phase::Create,
        Phase::Compile,
        Phase::ReadCompiled,
        Phase::DeleteCompiled,
    ])
}

fn check_common(clients: usize, opts: &RunOpts) -> Result<(), Error> {
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
    Ok(())
}

/// Refuses, before anything runs, a result file that could not be written at the end.
fn check_outputs(out: &OutputOpts) -> Result<(), Error> {
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
        // SAFETY: access() only reads the NUL-terminated path.
        let writable = std::ffi::CString::new(parent.as_os_str().as_encoded_bytes())
            .map(|c| unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0)
            .unwrap_or(false);
        if !writable {
            return Err(user(format!(
                "{flag} {}: cannot write in {}; give a path in a writable directory",
                path.display(),
                parent.display()
            )));
        }
    }
    Ok(())
}

fn write_out(path: &Path, data: &[u8]) -> std::io::Result<()> {
    loadgen::safety::write_atomic(path, data)
}

/// A progress bar on the terminal (indicatif) for a run: the round, its phase, files
/// done of the round's total, the rate and the time left; nothing when stderr is not a
/// terminal or with --quiet.
fn spawn_progress(
    progress: Arc<Progress>,
    names: Vec<&'static str>,
    totals: Vec<u64>,
    quiet: bool,
    done: Arc<AtomicBool>,
) {
    if quiet || !std::io::stderr().is_terminal() {
        return;
    }
    std::thread::spawn(move || {
        let style = indicatif::ProgressStyle::with_template(
            "{prefix:>12} {msg:<16} [{bar:30}] {pos}/{len} files {per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
        let bar = indicatif::ProgressBar::new(0).with_style(style);
        let mut shown = usize::MAX;
        while !done.load(Ordering::Relaxed) {
            let i = progress.phase.load(Ordering::Relaxed) as usize;
            if i != shown {
                shown = i;
                bar.reset();
                bar.set_length(totals.get(i).copied().unwrap_or(0));
                bar.set_prefix(format!("round {}/{}", i + 1, names.len()));
                bar.set_message(names.get(i).copied().unwrap_or(""));
            }
            bar.set_position(progress.files_done.load(Ordering::Relaxed));
            std::thread::sleep(Duration::from_millis(100));
        }
        bar.finish_and_clear();
    });
}

/// The workload a command line asks for.
fn make_workload(opts: &RunOpts, schedule: &Schedule) -> Workload {
    Workload::compilebench(
        &Datasets::embedded(),
        opts.scale,
        opts.seed,
        schedule,
        !opts.no_sync,
    )
}

/// Runs one workload and writes its report; returns the report.
fn run_workload(
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
    let hosts = (!opts.net.hosts.is_empty()).then(|| remote::Hosts {
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
    });
    // Caches are dropped where the clients run: here for a local run (root only), by the
    // agents on their hosts.
    let drop_caches = !opts.no_sync && !opts.no_drop_caches;
    let dropped = if drop_caches && hosts.is_none() {
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
    };
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
    let (mode, initial_dirs, runs) = match schedule {
        _ if opts.stream.is_some() => ("stream", 0, rounds.len()),
        Schedule::Random { initial, runs } => ("random", *initial, *runs),
        Schedule::Phases(p) => ("phases", 0, p.len()),
    };
    let mut report = RunReport {
        schema: report::SCHEMA.to_string(),
        tool: "loadgen".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        command: command.into(),
        args: std::env::args().collect(),
        seed: opts.seed,
        started_at_unix: now_unix(),
        target: target.describe(),
        label: opts.out.label.clone(),
        environment: Environment::probe(&target),
        config: RunConfig {
            clients,
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
            drop_caches: dropped,
            read_other: cfg.read_other,
            read_other_means: if cfg.read_other {
                if hosts.is_some() {
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
        warnings,
    };
    let progress = Arc::new(Progress::default());
    let done = Arc::new(AtomicBool::new(false));
    let totals = workload_totals.iter().map(|n| n * clients as u64).collect();
    spawn_progress(
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
    let stop = &loadgen::login::INTERRUPTED;
    let (results, left, hung, host_error) = match &hosts {
        None => {
            let o = engine::run(&cfg, &progress, stop, on_phase);
            (o.phases.len(), o.left, o.hung, None)
        }
        Some(h) => {
            let mut args = agent_args(dir, schedule, opts);
            // The agents' run directories name this run: on a directory the hosts share,
            // each sees the others' and knows them for its siblings.
            let group = format!("{}-{}-{}", hostname(), std::process::id(), now_unix());
            args.extend(["--run-group".to_string(), group]);
            match remote::run(
                h,
                &rounds,
                &args,
                Duration::from_secs(opts.limits.phase_timeout),
                stop,
                on_phase,
            ) {
                Ok(r) => (r.len(), Vec::new(), false, None),
                Err(e) => (0, Vec::new(), false, Some(e)),
            }
        }
    };
    done.store(true, Ordering::Relaxed);
    if let Some(e) = host_error {
        report.error = Some(format!("multi-host run: {e}"));
        report.warnings.push(format!(
            "a host that stopped may have left its run directory (loadgen-run-* in {}); \
             look there on that host and remove it",
            dir.display()
        ));
    }
    if stop.load(Ordering::Relaxed) {
        report.error = Some("interrupted by a signal".into());
    }
    report.complete = report.error.is_none() && results == rounds.len();
    report
        .warnings
        .extend(left.into_iter().map(|l| format!("cleanup left: {l}")));
    if hung {
        report.error = Some(format!(
            "{} did not answer: {}",
            target.describe(),
            report.error.clone().unwrap_or_default()
        ));
        report.warnings.push(format!(
            "{} is left in place (the target did not answer, so nothing could be removed); \
             remove it with `rm -r {}` once the target answers again",
            run_dir.display(),
            run_dir.display()
        ));
    } else if !opts.out.keep && hosts.is_none() {
        if let Some(w) = finish_run_dir(&target, &run_dir) {
            report.warnings.push(w);
        }
    } else if hosts.is_none() {
        mark_kept(&target, &run_dir);
    }
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

/// The engine's settings for this host's clients, from the command line.
fn engine_config(
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
fn agent_args(dir: &Path, schedule: &Schedule, opts: &RunOpts) -> Vec<String> {
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
fn agent(dir: &Path, opts: &RunOpts, clients: usize, group: Option<&str>) -> Result<(), Error> {
    check_common(clients, opts)?;
    let workload = match opts.stream {
        Some(size) => Workload::stream(size),
        None => make_workload(opts, &parse_schedule(opts, COMPILEBENCH_DEFAULT)?),
    };
    // Several agents may share DIR (one filesystem, several hosts): allow it.
    let target = parse_target(dir, opts.limits.io_timeout)?;
    let run_dir = prepare_run_dir(&target, true, group)?;
    let drop = !opts.no_sync && !opts.no_drop_caches;
    let dropped = drop && engine::drop_caches();
    if drop && !dropped {
        eprintln!("loadgen agent: dropping caches needs root; running without");
    }
    let cfg = engine_config(&target, &run_dir, clients, workload, opts, dropped);
    // The coordinator's `stop`, or its going away, stops this host's clients too.
    let stop = &loadgen::login::INTERRUPTED;
    remote::agent_listen(stop);
    loadgen::storm::stop_on_signals();
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

fn finish(report: &RunReport) -> Result<(), Error> {
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
fn access_workload(files: usize) -> Workload {
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

const WORK_OUTSIDE: &str =
    "--work must be local scratch space outside --share (the workstations' caches go there)";

/// Checks the login-storm arguments and builds its configuration.
fn storm_config(a: &StormArgs) -> Result<loadgen::storm::StormConfig, Error> {
    use loadgen::login::Profile;
    if a.users == 0 || a.users > 1000 {
        return Err(user("--users must be between 1 and 1000"));
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
    if a.remount.as_deref().is_some_and(|c| c.trim().is_empty()) {
        return Err(user(
            "--remount is empty; give the command that mounts the share's client again",
        ));
    }
    let share = a.share.canonicalize().map_err(|e| {
        user(format!(
            "--share {} is not usable: {e}; give an existing directory on the share",
            a.share.display()
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
    if let Some(why) = unsafe_for_root(&a.share) {
        return Err(user(format!("--share: {why}")));
    }
    let outside = |w: &Path| !(w.starts_with(&share) || share.starts_with(w));
    let work_abs = std::env::current_dir()
        .map(|d| d.join(&a.work))
        .unwrap_or_else(|_| a.work.clone());
    // Checked before anything is made, and again once the path is resolved.
    if !outside(&work_abs) {
        return Err(user(WORK_OUTSIDE));
    }
    if let Some(why) = work_abs
        .ancestors()
        .find(|p| p.exists())
        .and_then(unsafe_for_root)
    {
        return Err(user(format!("--work: {why}")));
    }
    let (profile, profile_name) = match &a.profile {
        None => (Profile::embedded(), "gnome-firefox (shipped)".to_string()),
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| user(format!("cannot read --profile {}: {e}", p.display())))?;
            let prof = Profile::parse(&text)
                .map_err(|e| user(format!("--profile {}: {e}", p.display())))?;
            (prof, p.display().to_string())
        }
    };
    let ccfs = match &a.ccfs {
        Some(c) => c.clone(),
        None => std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|d| d.join("ccfs")))
            .filter(|c| c.is_file())
            .unwrap_or_else(|| PathBuf::from("ccfs")),
    };
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
    let ccfs_config = match &a.ccfs_config {
        None => None,
        Some(c) => Some(
            c.canonicalize()
                .map_err(|e| user(format!("--ccfs-config {} is not usable: {e}", c.display())))?,
        ),
    };
    let mut pids = a.server_pids.clone();
    if let Some(f) = &a.server_pids_file {
        pids.extend(
            loadgen::storm::read_pids_file(f)
                .map_err(|e| user(format!("--server-pids-file: {e}")))?,
        );
    }
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
    let cpu_window = match a.cpu_window {
        Some(w) => Some(Duration::from_secs(w)),
        None if !pids.is_empty() || client_pids_file.is_some() => {
            Some(Duration::from_secs(a.session + 60))
        }
        None => None,
    };
    if let Some(j) = &a.json {
        let parent = match j.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        if let Some(why) = unsafe_for_root(parent) {
            return Err(user(format!("--json {}: {why}", j.display())));
        }
    }
    // Made last: bad input changes nothing.
    let existed = a.work.exists();
    std::fs::create_dir_all(&a.work)
        .map_err(|e| user(format!("--work {} cannot be made: {e}", a.work.display())))?;
    // Again now that it exists: someone may have made it first.
    if let Some(why) = unsafe_for_root(&a.work) {
        if !existed {
            let _ = std::fs::remove_dir(&a.work);
        }
        return Err(user(format!("--work: {why}")));
    }
    let work = a
        .work
        .canonicalize()
        .map_err(|e| user(format!("--work: {e}")))?;
    if !outside(&work) {
        return Err(user(WORK_OUTSIDE));
    }
    Ok(loadgen::storm::StormConfig {
        share,
        users: a.users,
        session: Duration::from_secs(a.session),
        profile: Arc::new(profile),
        profile_name,
        ccfs,
        work,
        meter: !a.no_meter,
        ccfs_config,
        returning_users: a.returning_users,
        baseline: match a.baseline {
            BaselineArg::Fair => loadgen::storm::Baseline::Fair,
            BaselineArg::ShareCache => loadgen::storm::Baseline::ShareCache,
        },
        repeat: a.repeat,
        remount: a.remount.clone(),
        client_pids_file,
        cpu_window,
        server_pids: pids,
        keep: a.keep,
        label: a.label.clone(),
    })
}

fn login_storm(a: &StormArgs) -> Result<(), Error> {
    let cfg = storm_config(a)?;
    for line in loadgen::storm::clear_leftovers(&cfg) {
        eprintln!("loadgen login-storm: {line}");
    }
    loadgen::storm::stop_on_signals();
    let modes: Vec<bool> = if a.compare {
        vec![false, true]
    } else {
        vec![a.with_ccfs]
    };
    eprintln!(
        "loadgen login-storm: {} users, {} timed run(s) {}{}; each run on homes of its own",
        cfg.users,
        cfg.repeat,
        if a.compare {
            "without and with ccfs"
        } else if a.with_ccfs {
            "through ccfs"
        } else {
            "straight on the share"
        },
        if cfg.meter {
            ", then a metered run for the counts"
        } else {
            ""
        }
    );
    let mut write_error = None;
    let schedule = loadgen::storm::schedule(&modes, cfg.repeat, cfg.meter);
    let runs = loadgen::storm::run(&cfg, &schedule, |runs| {
        if let Some(j) = &a.json {
            let v = serde_json::to_vec_pretty(runs);
            if let Err(e) = write_out(j, &v.unwrap_or_default()) {
                write_error = Some(format!("cannot write {}: {e}", j.display()));
            }
        }
    })
    .map_err(Error::Failed)?;
    print!("{}", loadgen::storm::table(&runs));
    if loadgen::login::INTERRUPTED.load(Ordering::Relaxed) {
        return Err(Error::Failed(
            "interrupted by a signal: stopped cleanly, homes and mounts removed".into(),
        ));
    }
    if let Some(e) = write_error {
        return Err(Error::Failed(e));
    }
    match runs.iter().find_map(|r| r.error.clone()) {
        Some(e) => Err(Error::Failed(format!("stopped: {e}"))),
        None => Ok(()),
    }
}

fn main() -> ExitCode {
    // What loadgen makes is its own to change: never writable by others, whatever the
    // umask it was started with (root's 000 let a student swap a run directory).
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0o022) };
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Cmd::Compilebench { .. } | Cmd::Sweep { .. } | Cmd::Access { .. } | Cmd::Stream(_)
    ) {
        // Ctrl-C or SIGTERM: the clients stop at their next call, the results so far are
        // written, and what the run made is removed.
        loadgen::storm::stop_on_signals();
    }
    let result = (|| -> Result<(), Error> {
        match cli.command {
            Cmd::Compilebench { dir, opts, clients } => {
                if !opts.net.hosts.is_empty() && clients != 1 {
                    return Err(user(
                        "--clients counts clients on this machine; with --hosts use --clients-per-host",
                    ));
                }
                check_common(clients, &opts)?;
                let schedule = parse_schedule(&opts, COMPILEBENCH_DEFAULT)?;
                check_outputs(&opts.out)?;
                let w = make_workload(&opts, &schedule);
                let r = run_workload("compilebench", &dir, w, &schedule, clients, &opts, true)?;
                finish(&r)
            }
            Cmd::Sweep { dir, opts, clients } => {
                for &c in &clients {
                    check_common(c, &opts)?;
                }
                let schedule = parse_schedule(&opts, sweep_default())?;
                check_outputs(&opts.out)?;
                let w = make_workload(&opts, &schedule);
                let mut runs = Vec::new();
                for &c in &clients {
                    eprintln!("loadgen sweep: {c} clients");
                    let r = run_workload("sweep", &dir, w.clone(), &schedule, c, &opts, false)?;
                    let failed = r.error.clone();
                    runs.push(r);
                    if loadgen::login::INTERRUPTED.load(Ordering::Relaxed) {
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
            Cmd::GenerateDocs { dir } => {
                use clap::CommandFactory;
                clidocs::generate(Cli::command(), &dir)
                    .map_err(|e| Error::Failed(format!("cannot write to {}: {e}", dir.display())))
            }
            Cmd::Report { results, out, font } => {
                let mut runs: Vec<RunReport> = Vec::new();
                let mut storms: Vec<loadgen::storm::StormReport> = Vec::new();
                for f in &results {
                    let bytes = std::fs::read(f)
                        .map_err(|e| user(format!("cannot read {}: {e}", f.display())))?;
                    let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
                        user(format!(
                            "{} is not JSON ({e}); give files written by --json",
                            f.display()
                        ))
                    })?;
                    let items = match value {
                        serde_json::Value::Array(a) => a,
                        v => vec![v],
                    };
                    for item in items {
                        let bad = |e: serde_json::Error| {
                            user(format!(
                                "{} is not a loadgen result ({e}); give files written by --json",
                                f.display()
                            ))
                        };
                        if item["schema"] == loadgen::storm::SCHEMA {
                            storms.push(serde_json::from_value(item).map_err(bad)?);
                        } else {
                            runs.push(serde_json::from_value(item).map_err(bad)?);
                        }
                    }
                }
                if runs.is_empty() && storms.is_empty() {
                    return Err(user("no runs in the given files"));
                }
                let written = loadgen::charts::write_report(&runs, &storms, &out, &font).map_err(
                    |e| match e {
                        loadgen::charts::ChartError::Font { .. }
                        | loadgen::charts::ChartError::BadFont(_) => user(e.to_string()),
                        other => Error::Failed(other.to_string()),
                    },
                )?;
                println!(
                    "loadgen report: {} runs, {} files in {}",
                    runs.len() + storms.len(),
                    written.len(),
                    out.display()
                );
                Ok(())
            }
            Cmd::Agent {
                dir,
                opts,
                clients,
                run_group,
            } => agent(&dir, &opts, clients, run_group.as_deref()),
            Cmd::LoginStorm(a) => login_storm(&a),
            Cmd::Stream(a) => stream(&a),
            Cmd::Access {
                dir,
                files,
                clients,
                out,
            } => {
                if files == 0 {
                    return Err(user("--files must be at least 1"));
                }
                let opts = RunOpts::plain(4096, out);
                check_common(clients, &opts)?;
                check_outputs(&opts.out)?;
                let schedule = Schedule::Phases(vec![Phase::Create, Phase::DeleteTree]);
                let r = run_workload(
                    "access",
                    &dir,
                    access_workload(files),
                    &schedule,
                    clients,
                    &opts,
                    true,
                )?;
                finish(&r)
            }
        }
    })();
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
    }
}
