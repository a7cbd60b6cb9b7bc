//! The I/O engine: client threads, a barrier per phase, per-operation latency histograms.
//!
//! Each client keeps its own histograms (no shared lock on the hot path); the coordinator
//! merges them when a phase ends. Phases start together: every client prepares its tree
//! (untimed), waits at a barrier, and takes its own start time right after it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::store::{Store, Target};
use crate::workload::{self, FileSet, Phase, Sets, TreeState};

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
}

pub const OPS: [Op; 13] = [
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
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Latency histograms in nanoseconds, one per operation.
#[derive(Debug, Clone)]
pub struct Latencies {
    hists: Vec<Histogram<u64>>,
}

impl Default for Latencies {
    fn default() -> Self {
        Self::new()
    }
}

impl Latencies {
    pub fn new() -> Self {
        // 1 ns .. 1 hour at 3 significant digits: constant, valid bounds.
        let h =
            || Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds");
        Self {
            hists: OPS.iter().map(|_| h()).collect(),
        }
    }

    pub fn record(&mut self, op: Op, d: Duration) {
        let ns = (d.as_nanos() as u64).clamp(1, 3_600_000_000_000);
        // saturating_record never fails for in-range values.
        self.hists[op.index()].saturating_record(ns);
    }

    /// Adds another client's histograms (exact: counts per bucket add up).
    pub fn merge(&mut self, other: &Latencies) {
        for (a, b) in self.hists.iter_mut().zip(&other.hists) {
            // Same bounds on both sides, so add cannot fail.
            let _ = a.add(b);
        }
    }

    pub fn get(&self, op: Op) -> &Histogram<u64> {
        &self.hists[op.index()]
    }

    /// The recorded values per operation, as (op name, [(value ns, count)]): exact, so
    /// histograms sent between hosts merge as if recorded in one place.
    pub fn to_wire(&self) -> Vec<(String, Vec<(u64, u64)>)> {
        OPS.iter()
            .filter(|op| !self.get(**op).is_empty())
            .map(|op| {
                let h = self.get(*op);
                let values = h
                    .iter_recorded()
                    .map(|v| (v.value_iterated_to(), v.count_at_value()))
                    .collect();
                (op.name().to_string(), values)
            })
            .collect()
    }

    pub fn from_wire(wire: &[(String, Vec<(u64, u64)>)]) -> Self {
        let mut l = Latencies::new();
        for (name, values) in wire {
            if let Some(op) = OPS.iter().find(|o| o.name() == name) {
                for (v, c) in values {
                    let _ = l.hists[op.index()].record_n(*v, *c);
                }
            }
        }
        l
    }

    pub fn count(&self, op: Op) -> u64 {
        self.hists[op.index()].len()
    }
}

/// What one client did in one phase.
#[derive(Debug, Clone)]
pub struct ClientResult {
    pub client: usize,
    pub bytes: u64,
    pub files: u64,
    /// From the barrier release to this client's start and end.
    pub start: Duration,
    pub end: Duration,
    pub latencies: Latencies,
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

/// One phase across all clients.
#[derive(Debug, Clone)]
pub struct PhaseResult {
    pub phase: Phase,
    pub clients: Vec<ClientResult>,
    pub latencies: Latencies,
}

impl PhaseResult {
    /// A phase from its clients' results, their histograms merged.
    pub fn from_clients(phase: Phase, clients: Vec<ClientResult>) -> Self {
        let mut latencies = Latencies::new();
        for c in &clients {
            latencies.merge(&c.latencies);
        }
        Self {
            phase,
            clients,
            latencies,
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
        let min = self
            .clients
            .iter()
            .map(|c| c.start)
            .min()
            .unwrap_or_default();
        let max = self
            .clients
            .iter()
            .map(|c| c.start)
            .max()
            .unwrap_or_default();
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
    pub phases: Vec<Phase>,
    pub sets: Arc<Sets>,
    pub write_size: usize,
    pub fsync: bool,
    pub sync: bool,
    pub drop_caches: bool,
    pub read_other: bool,
    /// Delete every tree the run made when it ends (untimed).
    pub cleanup: bool,
}

/// Data written by every create: pseudo-random, so no filesystem can compress or dedupe it.
fn data_buffer(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

struct Client<'a> {
    id: usize,
    cfg: &'a Config,
    store: Store,
    buf: Vec<u8>,
    lat: Latencies,
    bytes: u64,
    files: u64,
    warnings: Vec<String>,
    progress: &'a AtomicU64,
}

fn timed<T>(lat: &mut Latencies, op: Op, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let t = Instant::now();
    let r = f();
    lat.record(op, t.elapsed());
    r
}

impl Client<'_> {
    fn tree(&self, owner: usize, tree: u32) -> PathBuf {
        self.cfg
            .run_dir
            .join(format!("client-{owner}"))
            .join(format!("tree-{tree}"))
    }

    fn mkdirs(&mut self, root: &Path, set: &FileSet) -> io::Result<()> {
        for d in std::iter::once("").chain(set.dirs.iter().map(String::as_str)) {
            let p = if d.is_empty() {
                root.to_path_buf()
            } else {
                root.join(d)
            };
            match timed(&mut self.lat, Op::Mkdir, || self.store.mkdir(&p)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn write_file(&mut self, path: &Path, size: u64, append: bool) -> io::Result<()> {
        let store = &mut self.store;
        let mut f = timed(&mut self.lat, Op::Open, || store.open_write(path, append))?;
        let mut left = size;
        while left > 0 {
            let n = left.min(self.buf.len() as u64) as usize;
            let buf = &self.buf[..n];
            timed(&mut self.lat, Op::Write, || store.write(&mut f, buf))?;
            left -= n as u64;
        }
        if self.cfg.fsync {
            timed(&mut self.lat, Op::Fsync, || store.fsync(&mut f))?;
        }
        timed(&mut self.lat, Op::Close, || store.close(f))?;
        self.bytes += size;
        self.files += 1;
        self.progress.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn read_file(&mut self, path: &Path) -> io::Result<u64> {
        let store = &mut self.store;
        let mut f = timed(&mut self.lat, Op::Open, || store.open_read(path))?;
        let mut total = 0u64;
        loop {
            let buf = &mut self.buf;
            let n = timed(&mut self.lat, Op::Read, || store.read(&mut f, buf))?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        timed(&mut self.lat, Op::Close, || store.close(f))?;
        Ok(total)
    }

    fn create(&mut self, root: &Path, set: &FileSet) -> io::Result<()> {
        self.mkdirs(root, set)?;
        for f in &set.files {
            self.write_file(&root.join(&f.path), f.size, true)?;
        }
        Ok(())
    }

    fn read(&mut self, root: &Path, sets: &[&FileSet]) -> io::Result<()> {
        for set in sets {
            for f in &set.files {
                let n = self.read_file(&root.join(&f.path))?;
                self.bytes += n;
                self.files += 1;
                self.progress.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn stat(&mut self, root: &Path, sets: &[&FileSet]) -> io::Result<()> {
        for set in sets {
            for f in &set.files {
                let p = root.join(&f.path);
                timed(&mut self.lat, Op::Stat, || self.store.stat(&p))?;
                self.bytes += f.size;
                self.files += 1;
                self.progress.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Deletes the files of `sets` (only those names), then their directories deepest
    /// first. A directory that still holds something not ours is left, with a warning.
    fn delete(&mut self, root: &Path, sets: &[&FileSet], dirs_too: bool) -> io::Result<()> {
        let mut dirs: Vec<&str> = Vec::new();
        for set in sets {
            for f in &set.files {
                let p = root.join(&f.path);
                timed(&mut self.lat, Op::Unlink, || self.store.unlink(&p))?;
                self.bytes += f.size;
                self.files += 1;
                self.progress.fetch_add(1, Ordering::Relaxed);
            }
            dirs.extend(set.dirs.iter().map(String::as_str));
        }
        if !dirs_too {
            return Ok(());
        }
        dirs.sort_unstable();
        dirs.dedup();
        for d in dirs.iter().rev().copied().chain(std::iter::once("")) {
            let p = if d.is_empty() {
                root.to_path_buf()
            } else {
                root.join(d)
            };
            match timed(&mut self.lat, Op::Rmdir, || self.store.rmdir(&p)) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {
                    self.warnings.push(format!(
                        "{} holds files loadgen did not create; left in place",
                        p.display()
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Patch: read the old file (compilebench's python3 port skips this), write the new.
    fn patch(&mut self, root: &Path, set: &FileSet) -> io::Result<()> {
        self.mkdirs(root, set)?;
        for f in &set.files {
            let p = root.join(&f.path);
            match self.read_file(&p) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            self.write_file(&p, f.size, false)?;
        }
        Ok(())
    }

    fn sync_fs(&mut self) -> io::Result<()> {
        let store = &mut self.store;
        let dir = &self.cfg.run_dir;
        timed(&mut self.lat, Op::Sync, || store.syncfs(dir))
    }

    /// Runs one phase on this client's tree (or, for reads with --read-other, on the next
    /// client's tree, which is in the same state).
    fn run(&mut self, phase: Phase, state: &mut TreeState, tree: &mut u32) -> io::Result<()> {
        let sets = self.cfg.sets.clone();
        let own = self.tree(self.id, *tree);
        match phase {
            Phase::InitialCreate | Phase::Create => {
                *tree += 1;
                let root = self.tree(self.id, *tree);
                if let Some(parent) = root.parent() {
                    match self.store.mkdir(parent) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(e),
                    }
                }
                self.create(&root, &sets.source)?;
            }
            Phase::Compile => {
                let set = if state.patched {
                    &sets.compile_patched
                } else {
                    &sets.compile
                };
                self.mkdirs(&own, set)?;
                for f in &set.files {
                    self.write_file(&own.join(&f.path), f.size, true)?;
                }
            }
            Phase::Patch => self.patch(&own, &sets.patch)?,
            Phase::Clean => {
                let (set, tree) = if state.patched {
                    (&sets.compile_patched, &sets.patched_tree)
                } else {
                    (&sets.compile, &sets.source)
                };
                self.delete(&own, &[set], false)?;
                // Directories only the build made go too (deepest first).
                for d in set.dirs.iter().rev() {
                    if tree.dirs.binary_search(d).is_err() {
                        let p = own.join(d);
                        match timed(&mut self.lat, Op::Rmdir, || self.store.rmdir(&p)) {
                            Ok(()) => {}
                            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
            }
            Phase::ReadTree | Phase::ReadCompiled | Phase::StatTree | Phase::StatCompiled => {
                let owner = if self.cfg.read_other {
                    (self.id + 1) % self.cfg.clients
                } else {
                    self.id
                };
                let root = self.tree(owner, *tree);
                let files = workload::tree_files(&sets, *state);
                let files: Vec<&FileSet> = if matches!(phase, Phase::ReadTree | Phase::StatTree) {
                    files.into_iter().take(1).collect()
                } else {
                    files
                };
                if phase.reads() && matches!(phase, Phase::ReadTree | Phase::ReadCompiled) {
                    self.read(&root, &files)?;
                } else {
                    self.stat(&root, &files)?;
                }
            }
            Phase::DeleteTree | Phase::DeleteCompiled => {
                let files = workload::tree_files(&sets, *state);
                self.delete(&own, &files, true)?;
            }
        }
        *state = workload::after(*state, phase);
        Ok(())
    }

    fn reset_counters(&mut self) {
        self.lat = Latencies::new();
        self.bytes = 0;
        self.files = 0;
        self.warnings.clear();
    }
}

fn remember(trees: &mut Vec<(u32, TreeState)>, tree: u32, state: TreeState) {
    if tree == 0 {
        return;
    }
    match trees.iter_mut().find(|(t, _)| *t == tree) {
        Some(entry) => entry.1 = state,
        None => trees.push((tree, state)),
    }
}

/// Drops the page cache (root only); returns whether it could.
pub fn drop_caches() -> bool {
    // SAFETY: sync() has no preconditions.
    unsafe { libc::sync() };
    fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// Live counters for a progress display.
#[derive(Debug, Default)]
pub struct Progress {
    pub phase: AtomicU64,
    pub files_done: AtomicU64,
}

/// Runs every phase with all clients; `on_phase` gets each phase's result as soon as it is
/// done (to write results out). Stops after the first phase in which a client failed.
pub fn run(
    cfg: &Config,
    progress: &Progress,
    stop: &AtomicBool,
    on_phase: impl FnMut(&PhaseResult),
) -> Vec<PhaseResult> {
    run_with_gate(cfg, progress, stop, &|_| true, on_phase)
}

/// [`run`], with `gate(phase index)` called once every client has prepared the phase and
/// before any starts it: a multi-host run waits there for every host (false cancels).
pub fn run_with_gate(
    cfg: &Config,
    progress: &Progress,
    stop: &AtomicBool,
    gate: &(dyn Fn(usize) -> bool + Sync),
    mut on_phase: impl FnMut(&PhaseResult),
) -> Vec<PhaseResult> {
    let n = cfg.clients;
    let prepared = Arc::new(Barrier::new(n + 1));
    let cancelled = AtomicBool::new(false);
    let start_gate = Arc::new(Barrier::new(n + 1));
    let end_gate = Arc::new(Barrier::new(n + 1));
    let go_on = Arc::new(Barrier::new(n + 1));
    let abort = AtomicBool::new(false);
    let epoch = Instant::now();
    let (tx, rx) = mpsc::channel::<ClientResult>();
    let mut results = Vec::new();
    std::thread::scope(|scope| {
        for id in 0..n {
            let prepared = prepared.clone();
            let cancelled = &cancelled;
            let (start_gate, end_gate, go_on, tx) = (
                start_gate.clone(),
                end_gate.clone(),
                go_on.clone(),
                tx.clone(),
            );
            let abort = &abort;
            scope.spawn(move || {
                let mut c = Client {
                    id,
                    cfg,
                    store: Store::connect(&cfg.target),
                    buf: data_buffer(cfg.write_size),
                    lat: Latencies::new(),
                    bytes: 0,
                    files: 0,
                    warnings: Vec::new(),
                    progress: &progress.files_done,
                };
                let mut state = TreeState::default();
                let mut tree = 0u32;
                // Every tree this client made and its state (a create starts a new one).
                let mut trees: Vec<(u32, TreeState)> = Vec::new();
                for &phase in &cfg.phases {
                    // Untimed preparation, then the start barrier.
                    let mut prep_err = None;
                    for step in workload::plan(state, phase) {
                        let r = c.run(step, &mut state, &mut tree);
                        remember(&mut trees, tree, state);
                        if let Err(e) = r {
                            prep_err = Some(format!("preparing {}: {e}", phase.name()));
                            break;
                        }
                    }
                    c.reset_counters();
                    prepared.wait();
                    start_gate.wait();
                    let started = epoch.elapsed();
                    let prep_err = if cancelled.load(Ordering::Acquire) {
                        Some("cancelled: another host could not start the phase".to_string())
                    } else {
                        prep_err
                    };
                    let result = match prep_err {
                        Some(e) => Err(e),
                        None => c
                            .run(phase, &mut state, &mut tree)
                            .and_then(|()| if cfg.sync { c.sync_fs() } else { Ok(()) })
                            .map_err(|e| format!("{}: {e}", phase.name())),
                    };
                    let ended = epoch.elapsed();
                    remember(&mut trees, tree, state);
                    let _ = tx.send(ClientResult {
                        client: id,
                        bytes: c.bytes,
                        files: c.files,
                        start: started,
                        end: ended,
                        latencies: std::mem::take(&mut c.lat),
                        error: result.err(),
                        warnings: std::mem::take(&mut c.warnings),
                    });
                    end_gate.wait();
                    go_on.wait();
                    if abort.load(Ordering::Acquire) {
                        break;
                    }
                }
                if cfg.cleanup {
                    for (t, st) in trees {
                        if st.exists {
                            let root = c.tree(id, t);
                            let files = workload::tree_files(&cfg.sets, st);
                            let _ = c.delete(&root, &files, true);
                        }
                    }
                    let _ = c.store.rmdir(&cfg.run_dir.join(format!("client-{id}")));
                }
            });
        }
        drop(tx);
        for (i, &phase) in cfg.phases.iter().enumerate() {
            progress.phase.store(i as u64, Ordering::Relaxed);
            progress.files_done.store(0, Ordering::Relaxed);
            prepared.wait();
            if cfg.drop_caches {
                drop_caches();
            }
            if !gate(i) {
                cancelled.store(true, Ordering::Release);
            }
            // Times are taken on one clock and reported from the barrier's release, so the
            // start offsets show how closely the clients really started together.
            start_gate.wait();
            let released = epoch.elapsed();
            end_gate.wait();
            let mut clients: Vec<ClientResult> = rx.try_iter().take(n).collect();
            clients.sort_by_key(|c| c.client);
            let origin = clients
                .iter()
                .map(|c| c.start)
                .min()
                .unwrap_or(released)
                .min(released);
            for c in clients.iter_mut() {
                c.start = c.start.saturating_sub(origin);
                c.end = c.end.saturating_sub(origin);
            }
            let pr = PhaseResult::from_clients(phase, clients);
            on_phase(&pr);
            let failed = pr.error().is_some() || stop.load(Ordering::Acquire);
            results.push(pr);
            if failed || i + 1 == cfg.phases.len() {
                abort.store(true, Ordering::Release);
            }
            go_on.wait();
            if failed {
                break;
            }
        }
    });
    results
}
