//! Every `unsafe` operation of this crate, each with the reason it is sound.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use fuser::{FileAttr, FileHandle, FopenFlags, Generation, ReplyCreate, ReplyOpen};
use io_uring::{opcode, squeue::Entry128, types, IoUring};

use crate::abi;

/// The ring type: 128-byte SQEs (room for `struct fuse_uring_cmd_req`), 16-byte CQEs.
pub(crate) type Uring = IoUring<Entry128, io_uring::cqueue::Entry>;

/// Offset of `len` in `struct io_uring_sqe`.
const SQE_LEN_OFFSET: usize = 24;

const _: () = assert!(std::mem::size_of::<Entry128>() == 128);

fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    // flags (u64) stay 0; commit_id (u64) at 8; qid (u16) at 16.
    cmd[8..16].copy_from_slice(&commit_id.to_le_bytes());
    cmd[16..18].copy_from_slice(&qid.to_le_bytes());
    cmd
}

/// FUSE_IO_URING_CMD_REGISTER for one entry whose two iovecs (header, payload) are `iov`.
pub(crate) fn register_sqe(
    fd: RawFd,
    qid: u16,
    iov: *const libc::iovec,
    user_data: u64,
) -> Entry128 {
    let sqe = opcode::UringCmd80::new(types::Fd(fd), abi::CMD_REGISTER)
        .cmd(cmd_req(0, qid))
        .addr(Some(iov as u64))
        .build()
        .user_data(user_data);
    // The kernel wants `len` = 2 (the number of iovecs); the builder has no setter for it.
    // SAFETY: `Entry128` is `repr(C)` over the kernel's 128-byte SQE (size asserted above)
    // and any bit pattern of it is a valid value, so it may be viewed as bytes and back.
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    bytes[SQE_LEN_OFFSET..SQE_LEN_OFFSET + 4].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: as above; only the `len` field changed.
    unsafe { std::mem::transmute::<[u8; 128], Entry128>(bytes) }
}

/// FUSE_IO_URING_CMD_COMMIT_AND_FETCH for the request `commit_id` of queue `qid`.
pub(crate) fn commit_sqe(fd: RawFd, qid: u16, commit_id: u64, user_data: u64) -> Entry128 {
    opcode::UringCmd80::new(types::Fd(fd), abi::CMD_COMMIT_AND_FETCH)
        .cmd(cmd_req(commit_id, qid))
        .build()
        .user_data(user_data)
}

/// A poll for readability of `fd` (the stop signal).
pub(crate) fn poll_sqe(fd: RawFd, user_data: u64) -> Entry128 {
    Entry128::from(
        opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .build()
            .user_data(user_data),
    )
}

/// Queues one SQE.
///
/// The caller guarantees what the SQE points at (the entry's iovecs and buffers) stays
/// allocated and unmoved until the kernel is done with the command: the serving thread owns
/// them and frees them only after the command completed or after the ring was closed with
/// the queue never made ready (see `ring.rs`).
pub(crate) fn push(ring: &mut Uring, sqe: &Entry128) -> io::Result<()> {
    // SAFETY: see the contract above; the SQE itself is copied into the ring.
    unsafe { ring.submission().push(sqe) }.map_err(|_| io::Error::other("submission queue full"))
}

/// Submits queued SQEs and waits up to `timeout` for one completion.
pub(crate) fn submit_wait_timeout(ring: &Uring, timeout: Duration) -> io::Result<usize> {
    let ts = types::Timespec::from(timeout);
    let args = types::SubmitArgs::new().timespec(&ts);
    ring.submitter().submit_with_args(1, &args)
}

/// A new eventfd.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall without pointers.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
/// Runs the calling thread on CPU `cpu` only: the kernel hands queue `cpu` the requests
/// made on that CPU, so the server runs where the caller sleeps (no wake-up of another
/// CPU). Fails when the CPU is not one the thread may use.
pub(crate) fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET only writes inside it (it
    // ignores numbers past CPU_SETSIZE), and sched_setaffinity reads `size_of` bytes of it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(v).ok().filter(|&v| v > 0).unwrap_or(4096)
}

/// `ReplyOpen::opened_passthrough` with a raw backing id the caller keeps open.
pub(crate) fn opened_passthrough_raw(
    reply: ReplyOpen,
    fh: FileHandle,
    flags: FopenFlags,
    backing_id: u32,
) {
    // SAFETY: the caller registered `backing_id` on this session and keeps it open;
    // `into_raw` takes it back from the wrapper so it is never closed here.
    let backing = unsafe { reply.wrap_backing(backing_id) };
    reply.opened_passthrough(fh, flags, &backing);
    let _ = backing.into_raw();
}

/// `ReplyCreate::created_passthrough` with a raw backing id the caller keeps open.
pub(crate) fn created_passthrough_raw(
    reply: ReplyCreate,
    ttl: &Duration,
    attr: &FileAttr,
    generation: Generation,
    fh: FileHandle,
    flags: FopenFlags,
    backing_id: u32,
) {
    // SAFETY: the caller registered `backing_id` on this session and keeps it open;
    // `into_raw` takes it back from the wrapper so it is never closed here.
    let backing = unsafe { reply.wrap_backing(backing_id) };
    reply.created_passthrough(ttl, attr, generation, fh, flags, &backing);
    let _ = backing.into_raw();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_sqe_carries_len_qid_and_addr() {
        let sqe = register_sqe(7, 3, 0x1000 as *const libc::iovec, 9);
        // SAFETY: test-only byte view of a 128-byte repr(C) value.
        let b: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(b[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(i32::from_ne_bytes([b[4], b[5], b[6], b[7]]), 7);
        assert_eq!(u64::from_ne_bytes(b[16..24].try_into().expect("8")), 0x1000);
        assert_eq!(u32::from_ne_bytes(b[24..28].try_into().expect("4")), 2);
        assert_eq!(
            u32::from_ne_bytes(b[8..12].try_into().expect("4")),
            abi::CMD_REGISTER
        );
        // cmd area starts at 48: flags, commit_id, qid
        assert_eq!(u16::from_le_bytes([b[64], b[65]]), 3);
    }
}
