//! One serving thread: its own io_uring with one ring entry, one `io_uring_enter` per
//! request (commit the reply and fetch the next request).

use std::cell::RefCell;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::abi::{self, Reader};
use crate::decode::{self, InHeader};
use crate::fs::{self, RingFilesystem};
use crate::reply::{RingReply, Slot};
use crate::sys::{self, Uring};
use crate::Refused;

const CMD: u64 = 1;
const STOP: u64 = 2;
const ENT_IN_OUT: usize = abi::RING_IN_OUT_LEN + abi::RING_OP_IN_LEN;

/// What a worker needs; shared parts are reference counted.
pub(crate) struct Worker<FS> {
    pub fs: Arc<FS>,
    pub dev: Arc<OwnedFd>,
    pub stop: Arc<OwnedFd>,
    pub qid: u16,
    pub payload_len: usize,
    pub served: Arc<AtomicU64>,
}

/// The memory the kernel reads and writes for the entry.
struct Buffers {
    header: Box<[u8]>,
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
}

impl Buffers {
    fn new(payload_len: usize) -> Buffers {
        let mut header = vec![0u8; abi::RING_HEADER_LEN].into_boxed_slice();
        let mut payload = vec![0u8; payload_len].into_boxed_slice();
        let iov = Box::new([
            libc::iovec {
                iov_base: header.as_mut_ptr().cast(),
                iov_len: header.len(),
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: payload.len(),
            },
        ]);
        Buffers {
            header,
            payload,
            iov,
        }
    }
}

/// How serving ended.
enum End {
    /// The kernel completed the command with an error (unmount, abort).
    Kernel,
    /// The stop signal fired while the entry may still be registered.
    Stopped,
}

fn new_ring() -> Result<Uring, Refused> {
    let mut b = Uring::builder();
    b.setup_single_issuer().setup_defer_taskrun();
    match b.build(4) {
        Ok(r) => Ok(r),
        Err(_) => Uring::builder().build(4).map_err(Refused::from_setup),
    }
}

impl<FS: RingFilesystem> Worker<FS> {
    /// Registers the entry (once `go` delivers the deadline), reports, then serves until the
    /// kernel ends the command.
    pub fn run(
        self,
        go: std::sync::mpsc::Receiver<Instant>,
        report: std::sync::mpsc::Sender<Result<(), Refused>>,
    ) {
        let Ok(deadline) = go.recv() else { return };
        // Best effort: a CPU this thread may not use only costs a wake-up elsewhere.
        let _ = sys::pin_to_cpu(usize::from(self.qid));
        let mut bufs = Buffers::new(self.payload_len);
        let mut ring = match new_ring() {
            Ok(r) => r,
            Err(e) => {
                let _ = report.send(Err(e));
                return;
            }
        };
        let first = match self.register(&mut ring, &bufs, deadline) {
            Ok(first) => first,
            Err(e) => {
                let _ = report.send(Err(e));
                return;
            }
        };
        let _ = report.send(Ok(()));
        drop(report);
        if let End::Stopped = self.serve(&mut ring, &mut bufs, first) {
            // The command may still be registered: the kernel keeps the buffer addresses
            // until it cancels the command, so they must never be reused.
            drop(ring);
            std::mem::forget(bufs);
        }
    }

    fn dev_fd(&self) -> RawFd {
        self.dev.as_raw_fd()
    }

    /// Sends REGISTER, retrying EAGAIN (INIT not answered yet) until `deadline`.
    /// `Ok(true)` means a request already arrived.
    fn register(
        &self,
        ring: &mut Uring,
        bufs: &Buffers,
        deadline: Instant,
    ) -> Result<bool, Refused> {
        let started = Instant::now();
        let plen = bufs.payload.len();
        let res = |e: std::io::Error| Refused::Resources(e);
        sys::push(ring, &sys::poll_sqe(self.stop.as_raw_fd(), STOP)).map_err(res)?;
        loop {
            let sqe = sys::register_sqe(self.dev_fd(), self.qid, bufs.iov.as_ptr(), CMD);
            sys::push(ring, &sqe).map_err(res)?;
            if let Err(e) = sys::submit_wait_timeout(ring, Duration::from_millis(20)) {
                if !matches!(e.raw_os_error(), Some(libc::ETIME) | Some(libc::EINTR)) {
                    return Err(Refused::IoUringSetup(e));
                }
            }
            let mut outcome = None;
            for cqe in ring.completion() {
                match cqe.user_data() {
                    CMD => outcome = Some(cqe.result()),
                    _ => {
                        return Err(Refused::NotConnected {
                            errno: libc::ECANCELED,
                        })
                    }
                }
            }
            match outcome {
                None => return Ok(false),
                Some(r) if r >= 0 => return Ok(true),
                Some(r) if -r == libc::EAGAIN && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Some(r) if -r == libc::EAGAIN => {
                    return Err(Refused::NotInitialized {
                        waited: started.elapsed(),
                    })
                }
                Some(r) => return Err(Refused::from_register(-r, plen)),
            }
        }
    }

    /// Waits for the next completion; `Ok(true)` when a request is in the buffers.
    fn wait(&self, ring: &mut Uring) -> Result<bool, End> {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => return Ok(false),
            // Passing shortages: the commit stays queued and goes with the next try.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::EBUSY | libc::ENOMEM)
                ) =>
            {
                std::thread::sleep(Duration::from_millis(1));
                return Ok(false);
            }
            Err(_) => return Err(End::Kernel),
        }
        let mut got = false;
        for cqe in ring.completion() {
            match cqe.user_data() {
                STOP => return Err(End::Stopped),
                _ if cqe.result() < 0 => return Err(End::Kernel),
                _ => got = true,
            }
        }
        Ok(got)
    }

    fn serve(&self, ring: &mut Uring, bufs: &mut Buffers, mut ready: bool) -> End {
        let mut slot = Rc::new(RefCell::new(Slot {
            out: Vec::with_capacity(bufs.payload.len()),
            ..Slot::default()
        }));
        loop {
            if !ready {
                match self.wait(ring) {
                    Ok(got) => ready = got,
                    Err(end) => return end,
                }
                if !ready {
                    continue;
                }
            }
            ready = false;
            let commit_id = self.handle(bufs, &mut slot);
            self.served.fetch_add(1, Ordering::Relaxed);
            let sqe = sys::commit_sqe(self.dev_fd(), self.qid, commit_id, CMD);
            if sys::push(ring, &sqe).is_err() {
                return End::Kernel;
            }
        }
    }

    /// Decodes the request in `bufs`, runs the handler, and writes the reply into `bufs`.
    /// Returns the commit id.
    fn handle(&self, bufs: &mut Buffers, slot: &mut Rc<RefCell<Slot>>) -> u64 {
        let mut ent = Reader::new(bufs.header.get(ENT_IN_OUT..).unwrap_or_default());
        let _flags = ent.u64();
        let commit_id = ent.u64().unwrap_or(0);
        let payload_sz = ent
            .u32()
            .and_then(|v| usize::try_from(v).ok())
            .unwrap_or(usize::MAX);
        let header = InHeader::parse(&bufs.header).unwrap_or(InHeader {
            len: 0,
            opcode: 0,
            unique: commit_id,
            nodeid: 0,
            uid: 0,
            gid: 0,
            pid: 0,
            total_extlen: 0,
        });
        slot.borrow_mut().reset();
        let max = bufs.payload.len();
        let decoded = match (
            op_in_len_checked(&header, payload_sz, max),
            bufs.header.get(abi::RING_IN_OUT_LEN..),
        ) {
            (Some(op_len), Some(op_area)) => {
                match (op_area.get(..op_len), bufs.payload.get(..payload_sz)) {
                    (Some(op_in), Some(payload)) => decode::decode(header, op_in, payload),
                    _ => Err(fuser::Errno::EIO),
                }
            }
            _ => Err(fuser::Errno::EIO),
        };
        match decoded {
            Ok(req) => {
                let limit = fs::reply_limit(&req.op, max);
                let reply = RingReply::new(Rc::clone(slot), limit, max);
                let fs = &*self.fs;
                // A panicking handler drops its reply, which answers EIO.
                let _ = catch_unwind(AssertUnwindSafe(|| fs::dispatch(fs, req, reply)));
            }
            Err(errno) => {
                let mut s = slot.borrow_mut();
                s.error = -errno.code();
                s.answered = true;
            }
        }
        if Rc::strong_count(slot) > 1 {
            // The handler kept its reply: answer EIO now, let the late reply write elsewhere.
            *slot = Rc::new(RefCell::new(Slot {
                out: Vec::with_capacity(max),
                ..Slot::default()
            }));
            slot.borrow_mut().error = -libc::EIO;
        }
        write_reply(bufs, &slot.borrow(), header.unique);
        commit_id
    }
}

fn op_in_len_checked(header: &InHeader, payload_sz: usize, max: usize) -> Option<usize> {
    if payload_sz > max {
        return None;
    }
    decode::op_in_len(header, payload_sz)
}

/// Writes `fuse_out_header` into `in_out`, the payload, and `payload_sz`.
fn write_reply(bufs: &mut Buffers, slot: &Slot, unique: u64) {
    let (error, body): (i32, &[u8]) = if !slot.answered {
        (-libc::EIO, &[])
    } else if slot.error != 0 {
        (slot.error, &[])
    } else {
        (0, &slot.out)
    };
    let (error, body) = match bufs.payload.get_mut(..body.len()) {
        Some(dst) => {
            dst.copy_from_slice(body);
            (error, body)
        }
        None => (-libc::EIO, &[][..]),
    };
    let len = u32::try_from(abi::OUT_HEADER_LEN + body.len()).unwrap_or(u32::MAX);
    let mut head = Vec::with_capacity(abi::OUT_HEADER_LEN);
    abi::Put::put_u32(&mut head, len);
    abi::Put::put_u32(&mut head, error as u32);
    abi::Put::put_u64(&mut head, unique);
    if let Some(dst) = bufs.header.get_mut(..abi::OUT_HEADER_LEN) {
        dst.copy_from_slice(&head);
    }
    let psz = u32::try_from(body.len()).unwrap_or(0).to_le_bytes();
    if let Some(dst) = bufs.header.get_mut(ENT_IN_OUT + 16..ENT_IN_OUT + 20) {
        dst.copy_from_slice(&psz);
    }
}

/// After a failure that never reached the kernel as a failed REGISTER: sends a REGISTER the
/// kernel must reject (queue id out of range), which makes it stop waiting for the ring and
/// serve the held requests over /dev/fuse. True when the kernel said so (EINVAL from the
/// queue id's check) or the connection is gone; false when it cannot be known.
pub(crate) fn release_waiters(dev: &OwnedFd) -> bool {
    let Ok(mut ring) = new_ring() else {
        return false;
    };
    let sqe = sys::register_sqe(dev.as_raw_fd(), u16::MAX, std::ptr::null(), CMD);
    if sys::push(&mut ring, &sqe).is_err() {
        return false;
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let _ = sys::submit_wait_timeout(&ring, Duration::from_millis(100));
        if let Some(cqe) = ring.completion().next() {
            let errno = -cqe.result();
            return matches!(errno, libc::EINVAL | libc::ENOTCONN | libc::ECONNABORTED);
        }
    }
    false
}
