//! The I/O engine: clients, a start barrier per round, per-operation latency histograms.
//!
//! A client is a sequence of small units of work (one file written, read or removed, one
//! directory listed), not a thread: a fixed pool of worker threads takes the clients in
//! turn, one unit at a time, so a thousand clients start a round within milliseconds of
//! each other and cost a few kilobytes each. At most `threads` calls are in flight at once
//! (by default one thread a client up to 64).
//!
//! Every round: each client prepares its tree (untimed), the caches are flushed and dropped
//! if asked, then all clients are released together; a client's time runs from its first
//! unit to its last (the sync included when the round syncs).

use std::collections::VecDeque;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

mod pool;
mod task;

use pool::{no_answer, Pool};
use task::{exists, Cursor, Task, WalkKind};

use crate::store::{Kind, Store, Target};
use crate::workload::{Lists, Phase, Round, Workload};

/// The operations that are timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Mkdir,
    Open,
    Write,
    Read,
    Close,
    Stat,
    Unlink,
    Rmdir,
    Truncate,
    Fsync,
    Sync,
    Rename,
    Readdir,
    /// The read that finds the end of a file (returns 0 bytes).
    ReadEof,
    /// A call that failed as the workload expects: mkdir of a directory that exists, stat
    /// or unlink of a name that does not (compilebench makes these and ignores the error).
    Failed,
}

pub const OPS: [Op; 15] = [
    Op::Mkdir,
    Op::Open,
    Op::Write,
    Op::Read,
    Op::Close,
    Op::Stat,
    Op::Unlink,
    Op::Rmdir,
    Op::Truncate,
    Op::Fsync,
    Op::Sync,
    Op::Rename,
    Op::Readdir,
    Op::ReadEof,
    Op::Failed,
];

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Mkdir => "mkdir",
            Op::Open => "open",
            Op::Write => "write",
            Op::Read => "read",
            Op::Close => "close",
            Op::Stat => "stat",
            Op::Unlink => "unlink",
            Op::Rmdir => "rmdir",
            Op::Truncate => "truncate",
            Op::Fsync => "fsync",
            Op::Sync => "sync",
            Op::Rename => "rename",
            Op::Readdir => "readdir",
            Op::ReadEof => "read-eof",
            Op::Failed => "failed",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The largest latency a histogram holds (one hour, in nanoseconds).
const MAX_NS: u64 = 3_600_000_000_000;

/// One operation's histogram: 32-bit counts (a bucket would need four billion calls to
/// fill), two significant digits: every value within 1%, at 18 KB a histogram.
pub type Hist = Histogram<u32>;

/// Latency histograms in nanoseconds, one per operation, made on first use.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    hists: Vec<Option<Hist>>,
}

impl Latencies {
    pub fn new() -> Self {
        Self {
            hists: vec![None; OPS.len()],
        }
    }

    fn hist(&mut self, op: Op) -> Option<&mut Hist> {
        if self.hists.len() < OPS.len() {
            self.hists.resize(OPS.len(), None);
        }
        let slot = &mut self.hists[op.index()];
        if slot.is_none() {
            *slot = Histogram::new_with_bounds(1, MAX_NS, 2).ok();
        }
        slot.as_mut()
    }

    pub fn record(&mut self, op: Op, d: Duration) {
        let ns = (d.as_nanos() as u64).clamp(1, MAX_NS);
        if let Some(h) = self.hist(op) {
            h.saturating_record(ns);
        }
    }

    /// Adds another set of histograms (exact: counts per bucket add up).
    pub fn merge(&mut self, other: &Latencies) {
        for (i, b) in other.hists.iter().enumerate() {
            if let Some(b) = b {
                if let Some(a) = self.hist(OPS[i]) {
                    // Same bounds on both sides, so add cannot fail.
                    let _ = a.add(b);
                }
            }
        }
    }

    /// The histogram of `op`; None when nothing was recorded.
    pub fn get(&self, op: Op) -> Option<&Hist> {
        self.hists
            .get(op.index())
            .and_then(Option::as_ref)
            .filter(|h| !h.is_empty())
    }

    /// The recorded values per operation, as (op name, [(value ns, count)]): exact, so
    /// histograms sent between hosts merge as if recorded in one place.
    pub fn to_wire(&self) -> Vec<(String, Vec<(u64, u64)>)> {
        OPS.iter()
            .filter_map(|op| self.get(*op).map(|h| (op, h)))
            .map(|(op, h)| {
                let values = h
                    .iter_recorded()
                    .map(|v| (v.value_iterated_to(), u64::from(v.count_at_value())))
                    .collect();
                (op.name().to_string(), values)
            })
            .collect()
    }

    pub fn from_wire(wire: &[(String, Vec<(u64, u64)>)]) -> Self {
        let mut l = Latencies::new();
        for (name, values) in wire {
            if let Some(op) = OPS.iter().find(|o| o.name() == name) {
                if let Some(h) = l.hist(*op) {
                    for (v, c) in values {
                        let c = u32::try_from(*c).unwrap_or(u32::MAX);
                        let _ = h.record_n((*v).clamp(1, MAX_NS), c);
                    }
                }
            }
        }
        l
    }

    pub fn count(&self, op: Op) -> u64 {
        self.get(op).map(Hist::len).unwrap_or(0)
    }
}

/// What one client did in one round.
#[derive(Debug, Clone, Default)]
pub struct ClientResult {
    pub client: usize,
    /// The bytes the phase counts: written (create, compile, patch), read (read), the
    /// removed files' sizes (clean); 0 for delete and stat.
    pub bytes: u64,
    /// Regular files written, read, stated or removed.
    pub files: u64,
    /// Directories made, listed, stated or removed.
    pub dirs: u64,
    /// From the barrier's release to this client's first unit and to its end.
    pub start: Duration,
    pub end: Duration,
    pub error: Option<String>,
    pub warnings: Vec<String>,
}

impl ClientResult {
    pub fn seconds(&self) -> f64 {
        (self.end.saturating_sub(self.start)).as_secs_f64()
    }

    pub fn mb_per_s(&self) -> f64 {
        let s = self.seconds();
        if s > 0.0 {
            self.bytes as f64 / (1024.0 * 1024.0) / s
        } else {
            0.0
        }
    }
}

/// One round across all clients.
#[derive(Debug, Clone)]
pub struct PhaseResult {
    pub phase: Phase,
    /// The tree (kernel-N) the round worked on, in every client's directory.
    pub tree: u32,
    pub clients: Vec<ClientResult>,
    pub latencies: Latencies,
    /// When the clients were released (their start and end count from it); None when
    /// they never were.
    pub released: Option<Instant>,
    /// The hosts (of a multi-host run) whose agents could not drop their caches before
    /// this round, as they were asked to.
    pub caches_not_dropped: Vec<String>,
}

impl PhaseResult {
    pub fn new(phase: Phase, tree: u32, clients: Vec<ClientResult>, latencies: Latencies) -> Self {
        Self {
            phase,
            tree,
            clients,
            latencies,
            released: None,
            caches_not_dropped: Vec::new(),
        }
    }

    /// The sum of the clients' MB/s, as compilebench's blog reports it.
    pub fn aggregate_mb_per_s(&self) -> f64 {
        self.clients.iter().map(ClientResult::mb_per_s).sum()
    }
    pub fn first_done(&self) -> Duration {
        self.clients.iter().map(|c| c.end).min().unwrap_or_default()
    }
    pub fn last_done(&self) -> Duration {
        self.clients.iter().map(|c| c.end).max().unwrap_or_default()
    }
    /// The spread of the clients' start times after the barrier.
    pub fn start_skew(&self) -> Duration {
        let starts = self.clients.iter().map(|c| c.start);
        let min = starts.clone().min().unwrap_or_default();
        let max = starts.max().unwrap_or_default();
        max - min
    }
    pub fn error(&self) -> Option<String> {
        self.clients.iter().find_map(|c| c.error.clone())
    }
}

/// How to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the files go (a directory, or an NFS export).
    pub target: Target,
    /// The run directory (created by the caller, with its marker), as the store names it.
    pub run_dir: PathBuf,
    pub clients: usize,
    /// The first client's number (a multi-host run numbers clients across hosts).
    pub client_base: usize,
    pub workload: Arc<Workload>,
    pub write_size: usize,
    pub fsync: bool,
    pub drop_caches: bool,
    pub read_other: bool,
    /// Write the unpatched, patch and patched-compile lists in the target's readdir order
    /// (compilebench's native order), found with a tree of empty files before the run.
    pub native_order: bool,
    /// Delete every tree the run made when it ends (untimed).
    pub cleanup: bool,
    /// Worker threads (at most this many calls in flight).
    pub threads: usize,
    /// Open files with O_DIRECT (no page cache); the write size must be a multiple of
    /// [`DIRECT_ALIGN`].
    pub direct: bool,
    /// The longest a round (its preparation, its timed part, the cleanup) may take; past
    /// it the run stops, naming the target that did not answer.
    pub phase_timeout: Option<Duration>,
}

impl Config {
    /// One worker a client up to 64, unless set.
    pub fn default_threads(clients: usize) -> usize {
        clients.clamp(1, 64)
    }
}

/// Data every create writes: pseudo-random, so no filesystem can compress it; a buffer
/// twice the write size, each write taking its piece at an offset drawn from the file's
/// name and the write's number, so that files and the writes of one file do not repeat
/// each other block for block (no dedupe), and a file's content is the same in every run.
fn data_buffer(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    (0..len * 2)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

/// The alignment O_DIRECT needs of buffers, offsets and sizes.
pub const DIRECT_ALIGN: usize = 4096;

/// Drops the page cache (root only); returns whether it could.
pub fn drop_caches() -> bool {
    crate::sys::sync_all();
    fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// Live counters for a progress display: the round, what of it is being done
/// ([`Step`]), and the files done in that, in one word so that a display always reads
/// the three together (a round's count never shown against the next round).
#[derive(Debug, Default)]
pub struct Progress {
    /// The round (16 bits), the step (8 bits), the files (40 bits).
    state: AtomicU64,
}

/// What a run is doing, as [`Progress`] holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A round's untimed preparation (and the flush and dropped caches after it).
    Preparing = 0,
    /// A round's timed part.
    Timed = 1,
    /// The trees removed at the end (after the last round).
    CleaningUp = 2,
}

const FILES_BITS: u32 = 40;
const FILES_MASK: u64 = (1 << FILES_BITS) - 1;

impl Progress {
    /// Round `round` enters `step`, no file done yet.
    pub fn set_round(&self, round: usize, step: Step) {
        let r = (round as u64).min(0xffff) << (FILES_BITS + 8);
        self.state
            .store(r | (step as u64) << FILES_BITS, Ordering::Relaxed);
    }

    /// The files done in the current step.
    pub fn set_files(&self, files: u64) {
        let _ = self
            .state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                Some(s & !FILES_MASK | files.min(FILES_MASK))
            });
    }

    /// The round, its step and the files done, read together.
    pub fn now(&self) -> (usize, Step, u64) {
        let s = self.state.load(Ordering::Relaxed);
        let step = match (s >> FILES_BITS) & 0xff {
            1 => Step::Timed,
            2 => Step::CleaningUp,
            _ => Step::Preparing,
        };
        ((s >> (FILES_BITS + 8)) as usize, step, s & FILES_MASK)
    }
}

/// Finds the target's readdir order for each native list: writes the list as a tree of
/// empty files (sorted, as compilebench's pathcomp orders it), walks it top-down as
/// os.walk does, and removes it. Returns the lists reordered.
pub fn native_order(cfg: &Config, lists: &Lists) -> Result<Lists, String> {
    let mut out = lists.clone();
    let mut store = Store::connect(&cfg.target);
    let probe = cfg.run_dir.join("native-order");
    for id in out.native() {
        let list = lists.get(id);
        if list.len() < 2 {
            continue;
        }
        let fail =
            |e: io::Error| format!("finding the directory order in {}: {e}", probe.display());
        store.mkdir(&probe).map_err(fail)?;
        for d in Lists::dirs(list) {
            store.mkdir(&probe.join(d)).map_err(fail)?;
        }
        for e in list {
            store.put(&probe.join(&e.path), b"").map_err(fail)?;
        }
        let mut order = Vec::with_capacity(list.len());
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let entries = store.readdir(&probe.join(&rel)).map_err(fail)?;
            let mut subs = Vec::new();
            for (name, kind) in entries {
                let p = rel.join(&name);
                if kind == Kind::Dir {
                    subs.push(p);
                } else {
                    order.push(p.to_string_lossy().into_owned());
                }
            }
            stack.extend(subs.into_iter().rev());
        }
        out.reorder(id, &order);
        remove_tree(&mut store, &probe).map_err(fail)?;
    }
    Ok(out)
}

/// Removes a directory tree (depth first, never following a symlink), untimed.
pub fn remove_tree(store: &mut Store, dir: &Path) -> io::Result<()> {
    for (name, kind) in store.readdir(dir)? {
        let p = dir.join(name);
        if kind == Kind::Dir {
            remove_tree(store, &p)?;
        } else {
            store.unlink(&p)?;
        }
    }
    store.rmdir(dir)
}

/// What a run did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub phases: Vec<PhaseResult>,
    /// What the cleanup could not remove, and why.
    pub left: Vec<String>,
    /// A round passed its deadline with calls to the target still in flight: worker
    /// threads are stuck in them (the process should report and exit) and nothing was
    /// cleaned up.
    pub hung: bool,
}

/// Runs every round with all clients; `on_phase` gets each round's result as soon as it
/// is done (to write results out). Stops after the first round in which a client failed,
/// or once `stop` is set (every client stops at its next unit; the round is partial).
pub fn run(
    cfg: &Config,
    progress: &Progress,
    stop: &AtomicBool,
    on_phase: impl FnMut(&PhaseResult),
) -> Outcome {
    run_with_gate(cfg, progress, stop, &|_| true, on_phase)
}

/// [`run`], with `gate(round index)` called once every client has prepared the round and
/// before any starts it: a multi-host run waits there for every host (false cancels).
pub fn run_with_gate(
    cfg: &Config,
    progress: &Progress,
    stop: &AtomicBool,
    gate: &(dyn Fn(usize) -> bool + Sync),
    mut on_phase: impl FnMut(&PhaseResult),
) -> Outcome {
    let mut out = Outcome::default();
    let rounds: &[Round] = &cfg.workload.rounds;
    let fail_all = |phase: Phase, tree: u32, e: String| failed_round(cfg, phase, tree, e);
    let first = rounds.first().map(|r| (r.timed.phase, r.timed.tree));
    let mut setup = Store::connect(&cfg.target);
    let lists = match (set_up_clients(cfg, &mut setup), first) {
        (Ok(lists), _) => lists,
        (Err(e), Some((phase, tree))) => {
            let pr = fail_all(phase, tree, e);
            on_phase(&pr);
            out.phases.push(pr);
            return out;
        }
        // No round to fail: on to the cleanup.
        (Err(_), None) => cfg.workload.lists.clone(),
    };
    let threads = cfg.threads.clamp(1, cfg.clients.max(1));
    let pool = Arc::new(Pool::new(cfg, lists, threads));
    let handles: Vec<_> = (0..threads)
        .map(|w| {
            let pool = pool.clone();
            std::thread::spawn(move || pool.worker(w))
        })
        .collect();
    let n = cfg.clients;
    let deadline = cfg.phase_timeout;
    for (i, round) in rounds.iter().enumerate() {
        progress.set_round(i, Step::Preparing);
        // Untimed preparation (not in the progress shown: that counts the timed part).
        let prep = pool.pass(
            |id| {
                round
                    .prepare
                    .iter()
                    .map(|s| Task::cursor(cfg, id, n, s))
                    .collect()
            },
            deadline,
            stop,
            &Progress::default(),
        );
        if prep.hung {
            let pr = fail_all(
                round.timed.phase,
                round.timed.tree,
                format!(
                    "preparing {}: {}",
                    round.timed.phase.name(),
                    no_answer(deadline)
                ),
            );
            on_phase(&pr);
            out.phases.push(pr);
            out.hung = true;
            return out;
        }
        let prep_err = prep.clients.iter().find_map(|c| c.error.clone());
        // What the preparation wrote is flushed before the timed part, not in it.
        if round.sync && prep_err.is_none() {
            let _ = setup.syncfs(&cfg.run_dir);
        }
        if cfg.drop_caches {
            drop_caches();
        }
        let go = gate(i);
        let mut hung = false;
        let pr = match (prep_err, go) {
            (Some(e), _) => fail_all(
                round.timed.phase,
                round.timed.tree,
                format!("preparing {}: {e}", round.timed.phase.name()),
            ),
            (None, false) => fail_all(
                round.timed.phase,
                round.timed.tree,
                "cancelled: another host could not start the phase".to_string(),
            ),
            (None, true) => {
                progress.set_round(i, Step::Timed);
                let (pr, stuck) = timed_pass(&pool, cfg, round, stop, progress);
                hung = stuck;
                pr
            }
        };
        on_phase(&pr);
        let failed = pr.error().is_some() || stop.load(Ordering::Acquire);
        out.phases.push(pr);
        if hung {
            // Workers are stuck in calls that have not returned: leave them.
            out.hung = true;
            return out;
        }
        if failed {
            break;
        }
    }
    if cfg.cleanup {
        progress.set_round(rounds.len().saturating_sub(1), Step::CleaningUp);
        clean_up(&pool, cfg, progress, &mut out);
        if out.hung {
            return out;
        }
    }
    pool.shutdown();
    for h in handles {
        let _ = h.join();
    }
    out
}

/// A round every client failed with `e` (nothing of it was run).
fn failed_round(cfg: &Config, phase: Phase, tree: u32, e: String) -> PhaseResult {
    let clients = (0..cfg.clients)
        .map(|i| ClientResult {
            client: cfg.client_base + i,
            error: Some(e.clone()),
            ..ClientResult::default()
        })
        .collect();
    PhaseResult::new(phase, tree, clients, Latencies::new())
}

/// Every client's directory, then the native order (untimed): the lists the clients work
/// through.
fn set_up_clients(cfg: &Config, setup: &mut Store) -> Result<Lists, String> {
    for i in 0..cfg.clients {
        let d = Task::client_dir(cfg, i);
        if let Err(e) = setup.mkdir(&d) {
            if !exists(&e) {
                return Err(format!("cannot make {}: {e}", d.display()));
            }
        }
    }
    if cfg.native_order {
        native_order(cfg, &cfg.workload.lists)
    } else {
        Ok(cfg.workload.lists.clone())
    }
}

/// The timed part of `round` by every client (and its sync): the round's result, and
/// whether calls were still in flight at its deadline.
fn timed_pass(
    pool: &Pool,
    cfg: &Config,
    round: &Round,
    stop: &AtomicBool,
    progress: &Progress,
) -> (PhaseResult, bool) {
    let n = cfg.clients;
    let p = pool.pass(
        |id| {
            let mut jobs = vec![Task::cursor(cfg, id, n, &round.timed)];
            if round.sync {
                jobs.push(Cursor::Sync(false));
            }
            jobs
        },
        cfg.phase_timeout,
        stop,
        progress,
    );
    let phase = round.timed.phase;
    let clients = p
        .clients
        .into_iter()
        .map(|mut c| {
            c.error = c.error.map(|e| format!("{}: {e}", phase.name()));
            c
        })
        .collect();
    let mut pr = PhaseResult::new(phase, round.timed.tree, clients, p.latencies);
    pr.released = Some(p.released);
    (pr, p.hung)
}

/// Every client's directory removed, after an interrupt too (clients go on to the end of
/// the cleanup): what could not be removed is named in `out.left`.
fn clean_up(pool: &Pool, cfg: &Config, progress: &Progress, out: &mut Outcome) {
    pool.halt.store(false, Ordering::Relaxed);
    let never = AtomicBool::new(false);
    let cleaned = pool.pass(
        |id| {
            vec![Cursor::Walk {
                kind: WalkKind::Delete,
                root: Task::client_dir(cfg, id),
                started: false,
                pending: VecDeque::new(),
                frames: Vec::new(),
                remove_root: true,
            }]
        },
        cfg.phase_timeout,
        &never,
        progress,
    );
    out.hung = cleaned.hung;
    out.left
        .extend(cleaned.clients.into_iter().filter_map(|c| c.error));
}
