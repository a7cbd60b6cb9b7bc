//! Serves a FUSE connection over FUSE-over-io_uring (Linux 6.14+), with fuser's types as
//! the vocabulary.
//!
//! The daemon mounts with `fuser::Session` as usual and negotiates
//! `InitFlags::FUSE_OVER_IO_URING` in `init`. INIT, FORGET, BATCH_FORGET and INTERRUPT
//! always travel over `/dev/fuse` and reach fuser's `Filesystem`; once [`start`] has
//! registered a ring entry on every queue, the kernel sends every other request over the
//! ring, where the [`RingFilesystem`] implementation answers it with a [`RingReply`].
//!
//! Each serving thread owns one io_uring with one ring entry, so a request that blocks holds
//! up only its own thread. Per request the thread makes one `io_uring_enter` that commits
//! the reply and waits for the next request.
//!
//! If [`start`] returns [`Refused`], the kernel has been told to stop waiting for the ring
//! (entries registered before the failure stay with their threads' closed rings, their
//! buffers never reused) and the session's `/dev/fuse` reads serve everything; unless the
//! refusal is [`Refused::stranded`]: the kernel could not be told, and still holds the
//! connection's requests, so the caller must end the session.

mod abi;
mod decode;
mod fs;
mod refused;
pub mod reply;
mod sys;
mod worker;

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use fs::RingFilesystem;
pub use refused::Refused;
pub use reply::RingReply;

/// The caller of a request, as fuser's `Request` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub unique: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl From<&fuser::Request> for Caller {
    fn from(r: &fuser::Request) -> Self {
        Caller {
            unique: r.unique().0,
            uid: r.uid(),
            gid: r.gid(),
            pid: r.pid(),
        }
    }
}

/// How [`start`] sets up the ring.
#[derive(Debug, Clone)]
pub struct RingOptions {
    /// Serving threads (each with one ring entry) per queue; the kernel has one queue per
    /// possible CPU.
    pub threads_per_queue: usize,
    /// The `max_write` the INIT reply negotiated.
    pub max_write: u32,
    /// The `max_pages` the INIT reply negotiated (0: the kernel default of 32).
    pub max_pages: u32,
    /// How long REGISTER is retried while the INIT reply has not been processed (EAGAIN).
    pub register_timeout: Duration,
}

impl Default for RingOptions {
    fn default() -> Self {
        RingOptions {
            threads_per_queue: 2,
            max_write: 1 << 20,
            max_pages: 256,
            register_timeout: Duration::from_secs(5),
        }
    }
}

impl RingOptions {
    /// The payload buffer size of each entry: the kernel's ring max payload,
    /// max(FUSE_MIN_READ_BUFFER, max_write, max_pages * page size).
    pub fn payload_len(&self) -> usize {
        let pages = if self.max_pages == 0 {
            32
        } else {
            self.max_pages as usize
        };
        abi::MIN_READ_BUFFER
            .max(self.max_write as usize)
            .max(pages.saturating_mul(sys::page_size()))
    }
}

/// The serving threads of a started ring. Dropping it (or [`Ring::join`]) waits for them;
/// they end when the connection is unmounted or aborted.
#[derive(Debug)]
pub struct Ring {
    threads: Vec<JoinHandle<()>>,
    queues: usize,
    served: Arc<AtomicU64>,
}

impl Ring {
    /// Number of kernel queues served.
    pub fn queues(&self) -> usize {
        self.queues
    }
    /// Number of serving threads (one ring entry each).
    pub fn threads(&self) -> usize {
        self.threads.len()
    }
    /// Requests answered over the ring so far.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }
    /// A shared handle on the served-requests counter.
    pub fn served_counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.served)
    }
    /// Waits for every serving thread to end (after unmount or abort).
    pub fn join(mut self) {
        self.join_all();
    }
    fn join_all(&mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.join_all();
    }
}

/// Reads `enable_uring` of the fuse module: `Some(false)` when it is off.
fn module_enabled() -> Option<bool> {
    let s = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").ok()?;
    Some(matches!(s.trim(), "Y" | "y" | "1"))
}

/// The number of possible CPUs, which is the kernel's number of ring queues.
pub fn possible_cpus() -> Result<usize, Refused> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .map_err(|e| Refused::Queues(e.to_string()))?;
    parse_cpu_list(s.trim()).ok_or_else(|| Refused::Queues(format!("cannot parse {s:?}")))
}

fn parse_cpu_list(s: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = part.parse::<usize>().ok()?;
                (a, a)
            }
        };
        n += b.checked_sub(a)? + 1;
    }
    (n > 0).then_some(n)
}

/// Checks, without touching any connection, whether the module and io_uring allow the ring.
/// A daemon should offer `FUSE_OVER_IO_URING` in INIT only when this succeeds: once negotiated,
/// the kernel holds new requests until the ring is ready or a REGISTER has failed.
pub fn probe() -> Result<(), Refused> {
    if module_enabled() == Some(false) {
        return Err(Refused::ModuleDisabled);
    }
    sys::Uring::builder()
        .build(2)
        .map(drop)
        .map_err(Refused::from_setup)
}

struct Pending {
    go: mpsc::Sender<Instant>,
    report: mpsc::Receiver<Result<(), Refused>>,
    handle: JoinHandle<()>,
}

/// Registers ring entries on every queue of the connection behind `dev` (a dup of the
/// session's `/dev/fuse` fd) and serves them with `fs` on threads of its own.
pub fn start<FS: RingFilesystem>(
    dev: OwnedFd,
    fs: Arc<FS>,
    opts: RingOptions,
) -> Result<Ring, Refused> {
    // Failures before any thread registers: the kernel is told to stop waiting.
    let early = |e: Refused| released(&dev, e);
    if module_enabled() == Some(false) {
        return Err(early(Refused::ModuleDisabled));
    }
    let queues = possible_cpus().map_err(early)?;
    let qmax =
        u16::try_from(queues).map_err(|_| early(Refused::Queues(format!("{queues} queues"))))?;
    let per_queue = opts.threads_per_queue.max(1);
    let stop = Arc::new(sys::eventfd().map_err(|e| early(Refused::Resources(e)))?);
    let dev = Arc::new(dev);
    let served = Arc::new(AtomicU64::new(0));
    let mut pending: Vec<(u16, Pending)> = Vec::new();
    for qid in 0..qmax {
        for t in 0..per_queue {
            let (go_tx, go_rx) = mpsc::channel();
            let (rep_tx, rep_rx) = mpsc::channel();
            let worker = worker::Worker {
                fs: Arc::clone(&fs),
                dev: Arc::clone(&dev),
                stop: Arc::clone(&stop),
                qid,
                payload_len: opts.payload_len(),
                served: Arc::clone(&served),
            };
            let spawned = std::thread::Builder::new()
                .name(format!("fuse-ring-{qid}.{t}"))
                .spawn(move || worker.run(go_rx, rep_tx));
            match spawned {
                Ok(handle) => pending.push((
                    qid,
                    Pending {
                        go: go_tx,
                        report: rep_rx,
                        handle,
                    },
                )),
                Err(e) => return Err(abort(pending, &stop, &dev, Refused::Resources(e))),
            }
        }
    }
    let deadline = Instant::now() + opts.register_timeout;
    // The ring turns ready when the last queue gets its first entry. Register every other
    // queue first, then one entry of the last queue, so any failure before that point
    // leaves the ring not ready and the connection on /dev/fuse.
    let last = qmax - 1;
    let keystone = pending
        .iter()
        .position(|(q, _)| *q == last)
        .unwrap_or(pending.len());
    let mut serving = Vec::new();
    let mut rest = pending.split_off(keystone);
    let tail = rest.split_off(rest.len().min(1));
    for phase in [pending, rest] {
        match run_phase(phase, deadline) {
            Ok(mut ok) => serving.append(&mut ok),
            Err((err, ok, failed)) => {
                let mut all: Vec<_> = ok;
                all.extend(failed);
                all.extend(tail);
                return Err(abort_started(serving, all, &stop, &dev, err));
            }
        }
    }
    // The ring is ready; entries of the last queue that fail now only mean fewer threads
    // (those registered serve on; the failed ones have ended).
    match run_phase(tail, deadline) {
        Ok(mut ok) => serving.append(&mut ok),
        Err((_, ok, failed)) => {
            serving.extend(ok.into_iter().map(|(_, p)| p.handle));
            for (_, p) in failed {
                drop(p.go);
                let _ = p.handle.join();
            }
        }
    }
    Ok(Ring {
        threads: serving,
        queues,
        served,
    })
}

/// A phase's first failure, its threads that registered, and those that failed.
type PhaseErr = (Refused, Vec<(u16, Pending)>, Vec<(u16, Pending)>);

/// Lets the threads of one phase register; returns the handles of those serving.
fn run_phase(
    phase: Vec<(u16, Pending)>,
    deadline: Instant,
) -> Result<Vec<JoinHandle<()>>, PhaseErr> {
    for (_, p) in &phase {
        let _ = p.go.send(deadline);
    }
    let mut first_err = None;
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    for (q, p) in phase {
        match p.report.recv() {
            Ok(Ok(())) => ok.push((q, p)),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
                failed.push((q, p));
            }
            Err(_) => {
                first_err.get_or_insert(Refused::Resources(std::io::Error::other(
                    "serving thread ended",
                )));
                failed.push((q, p));
            }
        }
    }
    match first_err {
        None => Ok(ok.into_iter().map(|(_, p)| p.handle).collect()),
        Some(e) => Err((e, ok, failed)),
    }
}

fn abort_started(
    serving: Vec<JoinHandle<()>>,
    rest: Vec<(u16, Pending)>,
    stop: &OwnedFd,
    dev: &OwnedFd,
    err: Refused,
) -> Refused {
    let err = abort(rest, stop, dev, err);
    for h in serving {
        let _ = h.join();
    }
    err
}

/// Stops every thread and makes sure the kernel does not wait for the ring.
fn abort(rest: Vec<(u16, Pending)>, stop: &OwnedFd, dev: &OwnedFd, err: Refused) -> Refused {
    signal(stop);
    for (_, p) in rest {
        drop(p.go);
        let _ = p.handle.join();
    }
    match err {
        // The connection gone holds nothing. A rejected REGISTER may have been refused
        // before it reached FUSE (a security module), which leaves the kernel waiting: it
        // is told again, which a kernel that stopped waiting answers the same way.
        Refused::NotConnected { .. } => err,
        err => released(dev, err),
    }
}

/// `err`, once the kernel was told to stop waiting for the ring; [`Refused::Stranded`] when
/// it could not be.
fn released(dev: &OwnedFd, err: Refused) -> Refused {
    if worker::release_waiters(dev) {
        err
    } else {
        Refused::Stranded(Box::new(err))
    }
}

fn signal(stop: &OwnedFd) {
    use std::io::Write;
    let Ok(fd) = stop.try_clone() else { return };
    let mut f = std::fs::File::from(fd);
    let _ = f.write_all(&1u64.to_ne_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-3,5,7-8"), Some(7));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn payload_len_is_the_kernel_max() {
        let o = RingOptions {
            max_write: 4096,
            max_pages: 1,
            ..RingOptions::default()
        };
        assert_eq!(o.payload_len(), 8192);
        let o = RingOptions {
            max_write: 1 << 20,
            max_pages: 32,
            ..RingOptions::default()
        };
        assert_eq!(o.payload_len(), 1 << 20);
        let o = RingOptions {
            max_write: 4096,
            max_pages: 0,
            ..RingOptions::default()
        };
        assert_eq!(o.payload_len(), 32 * sys::page_size());
    }
}
