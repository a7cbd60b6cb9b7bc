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

use std::collections::{HashSet, VecDeque};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::locks::{self, Locked};
use crate::store::{Handle, Kind, Store, Target};
use crate::workload::{Action, Entry, ListId, Lists, Phase, Round, Step, Workload};

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
}

impl PhaseResult {
    pub fn new(phase: Phase, tree: u32, clients: Vec<ClientResult>, latencies: Latencies) -> Self {
        Self {
            phase,
            tree,
            clients,
            latencies,
            released: None,
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

/// A directory a walk is in.
#[derive(Debug)]
struct Frame {
    dir: PathBuf,
    files: Vec<String>,
    subdirs: Vec<String>,
    /// The next subdirectory to go into.
    next: usize,
    /// Bottom-up walks: the next file, then subdirectory, to stat or remove.
    post: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WalkKind {
    Read,
    Stat,
    Delete,
}

/// What a client is doing, resumable one unit at a time.
#[derive(Debug)]
enum Cursor {
    Write {
        root: PathBuf,
        list: ListId,
        unlink: bool,
        read_first: bool,
        /// Write over each file from its start (no append, no truncation).
        overwrite: bool,
        next: usize,
        made_root: bool,
        seen: HashSet<String>,
    },
    Unlink {
        root: PathBuf,
        list: ListId,
        next: usize,
    },
    Walk {
        kind: WalkKind,
        root: PathBuf,
        started: bool,
        /// Top-down reads: the files of the directory just listed, still to read.
        pending: VecDeque<PathBuf>,
        frames: Vec<Frame>,
        /// Remove the root too (cleanup).
        remove_root: bool,
    },
    /// A sync of the run directory's filesystem; true once done.
    Sync(bool),
}

/// One client.
struct Task {
    /// Its number among this host's clients.
    id: usize,
    store: Option<Store>,
    jobs: VecDeque<Cursor>,
    cur: Option<Cursor>,
    result: ClientResult,
    started: bool,
    done: bool,
}

/// A worker's own buffer and histograms.
struct Worker {
    /// What writes send: the run's data, never written into (reads go to `rbuf`), so a
    /// file's bytes do not depend on what the worker read before.
    buf: Aligned,
    rbuf: Aligned,
    lat: Latencies,
}

/// A buffer that starts on a [`DIRECT_ALIGN`] boundary (O_DIRECT needs it).
struct Aligned {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn new(data: &[u8]) -> Self {
        let mut raw = vec![0u8; data.len() + DIRECT_ALIGN];
        let start = raw.as_ptr().align_offset(DIRECT_ALIGN).min(DIRECT_ALIGN);
        raw[start..start + data.len()].copy_from_slice(data);
        Self {
            raw,
            start,
            len: data.len(),
        }
    }
}

impl std::ops::Deref for Aligned {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for Aligned {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

/// What a unit of work needs.
struct Ctx<'a> {
    cfg: &'a Config,
    lists: &'a Lists,
    worker: &'a mut Worker,
    progress: &'a AtomicU64,
}

fn timed<T>(lat: &mut Latencies, op: Op, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let t = Instant::now();
    let r = f();
    lat.record(op, t.elapsed());
    r
}

/// Times a call that may fail as expected (`ok_if`): a success goes to `op`, the expected
/// failure to [`Op::Failed`]; returns whether it succeeded.
fn tolerant(
    lat: &mut Latencies,
    op: Op,
    ok_if: impl Fn(&io::Error) -> bool,
    f: impl FnOnce() -> io::Result<()>,
) -> io::Result<bool> {
    let t = Instant::now();
    let r = f();
    let d = t.elapsed();
    match r {
        Ok(()) => {
            lat.record(op, d);
            Ok(true)
        }
        Err(e) if ok_if(&e) => {
            lat.record(Op::Failed, d);
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

fn exists(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::AlreadyExists
}

fn missing(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
}

fn with_path(e: io::Error, p: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", p.display()))
}

impl Task {
    fn client_dir(cfg: &Config, id: usize) -> PathBuf {
        cfg.run_dir.join(format!("client-{}", cfg.client_base + id))
    }

    fn tree(cfg: &Config, id: usize, tree: u32) -> PathBuf {
        Self::client_dir(cfg, id).join(format!("kernel-{tree}"))
    }

    fn cursor(cfg: &Config, id: usize, clients: usize, step: &Step) -> Cursor {
        let own = Self::tree(cfg, id, step.tree);
        let walk = |kind, root| Cursor::Walk {
            kind,
            root,
            started: false,
            pending: VecDeque::new(),
            frames: Vec::new(),
            remove_root: false,
        };
        match step.action {
            Action::Write {
                list,
                unlink,
                read_first,
            } => Cursor::Write {
                root: own,
                list,
                unlink,
                read_first,
                overwrite: false,
                next: 0,
                made_root: false,
                seen: HashSet::new(),
            },
            Action::Overwrite { list } => Cursor::Write {
                root: own,
                list,
                unlink: false,
                read_first: false,
                overwrite: true,
                next: 0,
                // The tree is there.
                made_root: true,
                seen: HashSet::new(),
            },
            Action::Unlink { list } => Cursor::Unlink {
                root: own,
                list,
                next: 0,
            },
            Action::Read | Action::Stat => {
                let root = if cfg.read_other && clients > 1 {
                    Self::tree(cfg, (id + 1) % clients, step.tree)
                } else {
                    own
                };
                let kind = if step.action == Action::Read {
                    WalkKind::Read
                } else {
                    WalkKind::Stat
                };
                walk(kind, root)
            }
            Action::Delete => walk(WalkKind::Delete, own),
        }
    }

    /// Does one unit of work; false when the job list is done.
    fn unit(&mut self, ctx: &mut Ctx) -> io::Result<bool> {
        loop {
            if self.cur.is_none() {
                self.cur = self.jobs.pop_front();
            }
            let Some(mut cur) = self.cur.take() else {
                return Ok(false);
            };
            let more = self.step(&mut cur, ctx)?;
            if more {
                self.cur = Some(cur);
                return Ok(true);
            }
            // This job is done; a unit of the next one runs now (a job that had nothing
            // left to do did no work).
            if self.jobs.is_empty() {
                return Ok(false);
            }
        }
    }

    /// One unit of `cur`; false when `cur` had nothing left (and did nothing).
    fn step(&mut self, cur: &mut Cursor, ctx: &mut Ctx) -> io::Result<bool> {
        let cfg = ctx.cfg;
        // Connected on first use, by a worker: a thousand clients do not connect in a row.
        let store = self
            .store
            .get_or_insert_with(|| Store::connect(&cfg.target));
        let r = &mut self.result;
        let lat = &mut ctx.worker.lat;
        match cur {
            Cursor::Sync(done) => {
                if *done {
                    return Ok(false);
                }
                *done = true;
                let dir = &cfg.run_dir;
                timed(lat, Op::Sync, || store.syncfs(dir)).map_err(|e| with_path(e, dir))?;
                Ok(true)
            }
            Cursor::Write {
                root,
                list,
                unlink,
                read_first,
                overwrite,
                next,
                made_root,
                seen,
            } => {
                if !*made_root {
                    *made_root = true;
                    let p = root.clone();
                    tolerant(lat, Op::Mkdir, exists, || store.mkdir(&p))
                        .map_err(|e| with_path(e, &p))?;
                    r.dirs += 1;
                    return Ok(true);
                }
                let Some(entry) = ctx.lists.get(*list).get(*next) else {
                    return Ok(false);
                };
                *next += 1;
                let path = root.join(&entry.path);
                if let Some((dname, _)) = entry.path.rsplit_once('/') {
                    if !seen.contains(dname) {
                        let dir = root.join(dname);
                        r.dirs += makedirs(store, lat, &dir).map_err(|e| with_path(e, &dir))?;
                        let mut d = dname;
                        loop {
                            seen.insert(d.to_string());
                            match d.rsplit_once('/') {
                                Some((parent, _)) => d = parent,
                                None => break,
                            }
                        }
                    }
                }
                if *unlink {
                    tolerant(lat, Op::Unlink, missing, || store.unlink(&path))
                        .map_err(|e| with_path(e, &path))?;
                }
                let how = if *overwrite {
                    Open::Over
                } else if *read_first {
                    Open::ReadFirst
                } else {
                    Open::Append
                };
                write_file(store, ctx.worker, cfg, &path, entry, how)
                    .map_err(|e| with_path(e, &path))?;
                r.bytes += entry.size;
                r.files += 1;
                ctx.progress.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Cursor::Unlink { root, list, next } => {
                let Some(entry) = ctx.lists.get(*list).get(*next) else {
                    return Ok(false);
                };
                *next += 1;
                let p = root.join(&entry.path);
                timed(lat, Op::Unlink, || store.unlink(&p)).map_err(|e| with_path(e, &p))?;
                r.bytes += entry.size;
                r.files += 1;
                ctx.progress.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Cursor::Walk {
                kind,
                root,
                started,
                pending,
                frames,
                remove_root,
            } => {
                if !*started {
                    *started = true;
                    let f = list_dir(store, lat, root)?;
                    r.dirs += 1;
                    if *kind == WalkKind::Read {
                        pending.extend(f.files.iter().map(|n| f.dir.join(n)));
                    }
                    frames.push(f);
                    return Ok(true);
                }
                let worker = &mut *ctx.worker;
                if *kind == WalkKind::Read {
                    if let Some(p) = pending.pop_front() {
                        let n = read_file(store, worker, &p, cfg.direct)
                            .map_err(|e| with_path(e, &p))?;
                        r.bytes += n;
                        r.files += 1;
                        ctx.progress.fetch_add(1, Ordering::Relaxed);
                        return Ok(true);
                    }
                }
                let lat = &mut worker.lat;
                while let Some(top) = frames.last_mut() {
                    if top.next < top.subdirs.len() {
                        let sub = top.dir.join(&top.subdirs[top.next]);
                        top.next += 1;
                        if *kind == WalkKind::Read {
                            // os.walk checks that a subdirectory is no symlink before
                            // going in (top-down only).
                            let k = timed(lat, Op::Stat, || store.stat(&sub))
                                .map_err(|e| with_path(e, &sub))?;
                            r.dirs += 1;
                            if k != Kind::Dir {
                                return Ok(true);
                            }
                        }
                        let f = list_dir(store, lat, &sub)?;
                        r.dirs += 1;
                        if *kind == WalkKind::Read {
                            pending.extend(f.files.iter().map(|n| f.dir.join(n)));
                        }
                        frames.push(f);
                        return Ok(true);
                    }
                    if *kind != WalkKind::Read && top.post < top.files.len() + top.subdirs.len() {
                        let i = top.post;
                        top.post += 1;
                        let (name, is_dir) = if i < top.files.len() {
                            (&top.files[i], false)
                        } else {
                            (&top.subdirs[i - top.files.len()], true)
                        };
                        let p = top.dir.join(name);
                        match (*kind, is_dir) {
                            (WalkKind::Stat, _) => {
                                timed(lat, Op::Stat, || store.stat(&p).map(|_| ()))
                            }
                            (_, false) => timed(lat, Op::Unlink, || store.unlink(&p)),
                            (_, true) => timed(lat, Op::Rmdir, || store.rmdir(&p)),
                        }
                        .map_err(|e| with_path(e, &p))?;
                        if is_dir {
                            r.dirs += 1;
                        } else {
                            r.files += 1;
                            ctx.progress.fetch_add(1, Ordering::Relaxed);
                        }
                        return Ok(true);
                    }
                    frames.pop();
                }
                if *remove_root {
                    *remove_root = false;
                    let p = root.clone();
                    timed(lat, Op::Rmdir, || store.rmdir(&p)).map_err(|e| with_path(e, &p))?;
                    return Ok(true);
                }
                Ok(false)
            }
        }
    }
}

/// os.makedirs as compilebench calls it: if the parent is missing, make it first (the
/// same way), then mkdir (an existing directory is an expected failure). Returns the
/// directories made.
fn makedirs(store: &mut Store, lat: &mut Latencies, dir: &Path) -> io::Result<u64> {
    let mut made = 0;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        let there = tolerant(lat, Op::Stat, missing, || store.stat(parent).map(|_| ()))?;
        if !there {
            made += makedirs(store, lat, parent)?;
        }
    }
    if tolerant(lat, Op::Mkdir, exists, || store.mkdir(dir))? {
        made += 1;
    }
    Ok(made)
}

/// How a file is opened for writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    /// For appending, created if missing (compilebench's create and compile).
    Append,
    /// For appending, read whole and truncated first (compilebench's patch).
    ReadFirst,
    /// Written over from its start (a stream's rewrite).
    Over,
}

/// compilebench's file write: open for appending (created if missing); with `ReadFirst`
/// read it whole and truncate it; write its size in write-size pieces; close.
fn write_file(
    store: &mut Store,
    w: &mut Worker,
    cfg: &Config,
    path: &Path,
    entry: &Entry,
    how: Open,
) -> io::Result<()> {
    let lat = &mut w.lat;
    let read_first = how == Open::ReadFirst;
    let mut h = timed(lat, Op::Open, || match how {
        Open::Over => store.open_over(path, cfg.direct),
        _ => store.open_append(path, read_first, cfg.direct),
    })?;
    if read_first {
        read_to_end(store, w, &mut h)?;
        timed(&mut w.lat, Op::Truncate, || store.truncate(&mut h))?;
    }
    let lat = &mut w.lat;
    let piece = (w.buf.len() / 2).max(1);
    // Direct I/O takes its pieces at block-aligned places of the (aligned) buffer.
    let align = if cfg.direct { DIRECT_ALIGN } else { 1 };
    let mut at = entry.path.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }) as usize
        % piece;
    at -= at % align;
    let mut left = entry.size;
    while left > 0 {
        let n = left.min(piece as u64) as usize;
        let data = &w.buf[at..at + n];
        at = (at + 4099) % piece;
        at -= at % align;
        timed(lat, Op::Write, || store.write(&mut h, data))?;
        left -= n as u64;
    }
    if cfg.fsync {
        timed(lat, Op::Fsync, || store.fsync(&mut h))?;
    }
    timed(lat, Op::Close, || store.close(h))
}

/// The alignment O_DIRECT needs of buffers, offsets and sizes.
pub const DIRECT_ALIGN: usize = 4096;

/// Reads an open file to its end in write-size pieces, the read that finds the end timed
/// apart; returns the bytes read.
fn read_to_end(store: &mut Store, w: &mut Worker, h: &mut Handle) -> io::Result<u64> {
    let half = w.buf.len() / 2;
    let mut total = 0u64;
    loop {
        let buf = &mut w.rbuf[..half];
        let t = Instant::now();
        let n = store.read(h, buf)?;
        w.lat
            .record(if n == 0 { Op::ReadEof } else { Op::Read }, t.elapsed());
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
    }
}

/// Reads a file whole; returns its bytes.
fn read_file(store: &mut Store, w: &mut Worker, path: &Path, direct: bool) -> io::Result<u64> {
    let mut h = timed(&mut w.lat, Op::Open, || store.open_read(path, direct))?;
    let total = read_to_end(store, w, &mut h)?;
    timed(&mut w.lat, Op::Close, || store.close(h))?;
    Ok(total)
}

fn list_dir(store: &mut Store, lat: &mut Latencies, dir: &Path) -> io::Result<Frame> {
    let entries = timed(lat, Op::Readdir, || store.readdir(dir)).map_err(|e| with_path(e, dir))?;
    let mut files = Vec::new();
    let mut subdirs = Vec::new();
    for (name, kind) in entries {
        if kind == Kind::Dir {
            subdirs.push(name);
        } else {
            files.push(name);
        }
    }
    Ok(Frame {
        dir: dir.to_path_buf(),
        files,
        subdirs,
        next: 0,
        post: 0,
    })
}

/// Drops the page cache (root only); returns whether it could.
pub fn drop_caches() -> bool {
    crate::sys::sync_all();
    fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// Live counters for a progress display.
#[derive(Debug, Default)]
pub struct Progress {
    pub phase: AtomicU64,
    pub files_done: AtomicU64,
}

/// The shared state of the workers.
#[derive(Default)]
struct Board {
    queue: VecDeque<usize>,
    /// Clients of the current pass not yet done.
    remaining: usize,
    shutdown: bool,
}

/// The workers' shared state: owned (not borrowed), so that workers stuck in a call that
/// never returns (a hung server) can be left behind when a round's deadline passes.
struct Pool {
    cfg: Config,
    lists: Lists,
    tasks: Vec<Mutex<Task>>,
    workers: Vec<Mutex<Worker>>,
    board: Mutex<Board>,
    work: Condvar,
    done: Condvar,
    /// The moment the current pass was released.
    epoch: Mutex<Instant>,
    /// Set to make every client stop at its next unit (an interrupt).
    halt: AtomicBool,
    files_done: AtomicU64,
}

/// How a pass ended.
struct Pass {
    clients: Vec<ClientResult>,
    latencies: Latencies,
    released: Instant,
    /// The deadline passed with calls still in flight: the pool cannot be used again.
    hung: bool,
}

impl Pool {
    fn worker(&self, w: usize) {
        loop {
            let id = {
                let mut b = self.board.locked();
                loop {
                    if b.shutdown {
                        return;
                    }
                    if let Some(id) = b.queue.pop_front() {
                        break id;
                    }
                    b = locks::wait(&self.work, b);
                }
            };
            let finished = {
                let mut task = self.tasks[id].locked();
                let mut worker = self.workers[w].locked();
                let epoch = *self.epoch.locked();
                if !task.started {
                    task.started = true;
                    task.result.start = epoch.elapsed();
                }
                let r = if self.halt.load(Ordering::Relaxed) {
                    Err(io::Error::new(io::ErrorKind::Interrupted, "interrupted"))
                } else {
                    let mut ctx = Ctx {
                        cfg: &self.cfg,
                        lists: &self.lists,
                        worker: &mut worker,
                        progress: &self.files_done,
                    };
                    task.unit(&mut ctx)
                };
                let finished = match r {
                    Ok(true) => false,
                    Ok(false) => true,
                    Err(e) => {
                        task.result.error = Some(e.to_string());
                        task.jobs.clear();
                        task.cur = None;
                        true
                    }
                };
                if finished {
                    task.done = true;
                    task.result.end = epoch.elapsed();
                }
                finished
            };
            let mut b = self.board.locked();
            if finished {
                b.remaining -= 1;
                if b.remaining == 0 {
                    self.done.notify_all();
                }
            } else {
                b.queue.push_back(id);
                self.work.notify_one();
            }
        }
    }

    /// Gives every client its jobs and runs them to the end, or until `deadline` (then
    /// the clients still at work are reported as not answering); `stop` makes every
    /// client stop at its next unit. Returns the clients' results and the workers'
    /// histograms (taken, so the next pass starts afresh).
    fn pass(
        &self,
        jobs: impl Fn(usize) -> Vec<Cursor>,
        deadline: Option<Duration>,
        stop: &AtomicBool,
        progress: &Progress,
    ) -> Pass {
        let n = self.tasks.len();
        for (id, t) in self.tasks.iter().enumerate() {
            let mut t = t.locked();
            t.jobs = jobs(id).into();
            t.cur = None;
            t.started = false;
            t.done = false;
            t.result = ClientResult {
                client: self.cfg.client_base + t.id,
                ..ClientResult::default()
            };
        }
        for w in &self.workers {
            w.locked().lat = Latencies::new();
        }
        self.files_done.store(0, Ordering::Relaxed);
        let released = Instant::now();
        *self.epoch.locked() = released;
        let mut hung = false;
        {
            let mut b = self.board.locked();
            b.queue = (0..n).collect();
            b.remaining = n;
            self.work.notify_all();
            while b.remaining > 0 {
                let (g, _) = locks::wait_timeout(&self.done, b, Duration::from_millis(100));
                b = g;
                progress
                    .files_done
                    .store(self.files_done.load(Ordering::Relaxed), Ordering::Relaxed);
                if stop.load(Ordering::Relaxed) {
                    self.halt.store(true, Ordering::Relaxed);
                }
                if deadline.is_some_and(|d| released.elapsed() > d) {
                    hung = true;
                    self.halt.store(true, Ordering::Relaxed);
                    b.queue.clear();
                    break;
                }
            }
        }
        let mut clients = Vec::with_capacity(n);
        for (id, t) in self.tasks.iter().enumerate() {
            // A task still held is in a call that has not returned.
            match t.try_lock() {
                Ok(mut t) if t.done || !hung => clients.push(std::mem::take(&mut t.result)),
                Ok(mut t) => {
                    let mut r = std::mem::take(&mut t.result);
                    r.end = released.elapsed();
                    r.error = Some(no_answer(deadline));
                    clients.push(r);
                }
                Err(_) => clients.push(ClientResult {
                    client: self.cfg.client_base + id,
                    end: released.elapsed(),
                    error: Some(no_answer(deadline)),
                    ..ClientResult::default()
                }),
            }
        }
        let mut latencies = Latencies::new();
        for w in &self.workers {
            if let Ok(mut w) = w.try_lock() {
                latencies.merge(&std::mem::take(&mut w.lat));
            }
        }
        Pass {
            clients,
            latencies,
            released,
            hung,
        }
    }

    fn shutdown(&self) {
        self.board.locked().shutdown = true;
        self.work.notify_all();
    }
}

fn no_answer(deadline: Option<Duration>) -> String {
    format!(
        "no answer within the phase timeout ({} s): a call to the target has not returned",
        deadline.map(|d| d.as_secs()).unwrap_or(0)
    )
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
    let fail_all = |phase: Phase, tree: u32, e: String| {
        let clients = (0..cfg.clients)
            .map(|i| ClientResult {
                client: cfg.client_base + i,
                error: Some(e.clone()),
                ..ClientResult::default()
            })
            .collect();
        PhaseResult::new(phase, tree, clients, Latencies::new())
    };
    let first = rounds.first().map(|r| (r.timed.phase, r.timed.tree));
    // Every client's directory, then the native order (untimed).
    let mut setup = Store::connect(&cfg.target);
    let mut lists = cfg.workload.lists.clone();
    let mut setup_err = None;
    for i in 0..cfg.clients {
        let d = Task::client_dir(cfg, i);
        if let Err(e) = setup.mkdir(&d) {
            if !exists(&e) {
                setup_err = Some(format!("cannot make {}: {e}", d.display()));
                break;
            }
        }
    }
    if setup_err.is_none() && cfg.native_order {
        match native_order(cfg, &lists) {
            Ok(l) => lists = l,
            Err(e) => setup_err = Some(e),
        }
    }
    if let (Some(e), Some((phase, tree))) = (setup_err, first) {
        let pr = fail_all(phase, tree, e);
        on_phase(&pr);
        out.phases.push(pr);
        return out;
    }
    let threads = cfg.threads.clamp(1, cfg.clients.max(1));
    let buf = data_buffer(cfg.write_size);
    let pool = Arc::new(Pool {
        cfg: cfg.clone(),
        lists,
        tasks: (0..cfg.clients)
            .map(|id| {
                Mutex::new(Task {
                    id,
                    store: None,
                    jobs: VecDeque::new(),
                    cur: None,
                    result: ClientResult::default(),
                    started: false,
                    done: false,
                })
            })
            .collect(),
        workers: (0..threads)
            .map(|_| {
                Mutex::new(Worker {
                    buf: Aligned::new(&buf),
                    rbuf: Aligned::new(&vec![0u8; buf.len() / 2]),
                    lat: Latencies::new(),
                })
            })
            .collect(),
        board: Mutex::new(Board::default()),
        work: Condvar::new(),
        done: Condvar::new(),
        epoch: Mutex::new(Instant::now()),
        halt: AtomicBool::new(false),
        files_done: AtomicU64::new(0),
    });
    let handles: Vec<_> = (0..threads)
        .map(|w| {
            let pool = pool.clone();
            std::thread::spawn(move || pool.worker(w))
        })
        .collect();
    let n = cfg.clients;
    let deadline = cfg.phase_timeout;
    for (i, round) in rounds.iter().enumerate() {
        progress.phase.store(i as u64, Ordering::Relaxed);
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
        progress.files_done.store(0, Ordering::Relaxed);
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
                let p = pool.pass(
                    |id| {
                        let mut jobs = vec![Task::cursor(cfg, id, n, &round.timed)];
                        if round.sync {
                            jobs.push(Cursor::Sync(false));
                        }
                        jobs
                    },
                    deadline,
                    stop,
                    progress,
                );
                hung = p.hung;
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
        // After an interrupt too: clients go on to the end of the cleanup.
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
            deadline,
            &never,
            progress,
        );
        out.hung = cleaned.hung;
        out.left
            .extend(cleaned.clients.into_iter().filter_map(|c| c.error));
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
