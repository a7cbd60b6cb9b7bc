//! Kernel passthrough: the FUSE device's backing-file ioctls, the broker that keeps
//! CAP_SYS_ADMIN for them, and the one reply that hands a backing id to the kernel.

use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};

use super::*;

/// `struct fuse_backing_map` of `<linux/fuse.h>`.
#[repr(C)]
struct FuseBackingMap {
    fd: i32,
    flags: u32,
    padding: u64,
}

/// `_IOW(229, nr, size)`: the FUSE device's ioctls.
const fn fuse_dev_iow(nr: u64, size: usize) -> u64 {
    (1 << 30) | ((size as u64) << 16) | (229 << 8) | nr
}
const FUSE_DEV_IOC_BACKING_OPEN: u64 = fuse_dev_iow(1, std::mem::size_of::<FuseBackingMap>());
const FUSE_DEV_IOC_BACKING_CLOSE: u64 = fuse_dev_iow(2, std::mem::size_of::<u32>());

/// Registers `file` with the FUSE connection `dev` as a backing file for kernel passthrough
/// (FUSE_DEV_IOC_BACKING_OPEN; needs CAP_SYS_ADMIN). Returns the backing id.
pub fn fuse_backing_open(dev: BorrowedFd<'_>, file: BorrowedFd<'_>) -> io::Result<u32> {
    let map = FuseBackingMap {
        fd: file.as_raw_fd(),
        flags: 0,
        padding: 0,
    };
    // SAFETY: the ioctl reads a `fuse_backing_map` from a valid pointer to one.
    let id = unsafe { libc::ioctl(dev.as_raw_fd(), FUSE_DEV_IOC_BACKING_OPEN as _, &map) };
    if id < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(id as u32)
}

/// Ends a registration of [`fuse_backing_open`] (FUSE_DEV_IOC_BACKING_CLOSE).
pub fn fuse_backing_close(dev: BorrowedFd<'_>, id: u32) -> io::Result<()> {
    // SAFETY: the ioctl reads a u32 from a valid pointer to one.
    check(unsafe { libc::ioctl(dev.as_raw_fd(), FUSE_DEV_IOC_BACKING_CLOSE as _, &id) })
}

/// Capabilities (`<linux/capability.h>`, version 3: two 32-bit words per set).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const CAP_SYS_ADMIN: u32 = 21;

/// A request to the backing broker: an op byte, then a backing id (little endian).
pub const BROKER_OPEN: u8 = 1;
pub const BROKER_CLOSE: u8 = 2;

/// Starts the backing broker of a user's mount: a child process that becomes `acct` for
/// good but keeps one capability, CAP_SYS_ADMIN, which registering a backing file for
/// kernel passthrough needs (the daemon itself keeps none). It holds a copy of the FUSE
/// device `dev` and does only this: for each request on its socket, register the file sent
/// with it (answer: the id, or minus the errno) or end a registration (no answer). Anything
/// else on the socket ends it; it dies with the calling thread (PR_SET_PDEATHSIG) and when
/// the socket closes. Returns the daemon's end of the socket.
///
/// The calling process must run a single thread (as for [`run_as_user`]).
pub fn spawn_backing_broker(dev: BorrowedFd<'_>, acct: &Account) -> io::Result<OwnedFd> {
    if thread_count() != Some(1) {
        return Err(io::Error::other(
            "cannot start the backing broker: this process runs several threads",
        ));
    }
    let (ours, theirs) = super::launcher::seqpacket_pair()?;
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the process has a single thread; the child calls only system calls on
    // values it owns (no allocation, no locks) and leaves through `_exit`.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        let code = broker_main(dev.as_raw_fd(), theirs.as_raw_fd(), acct, parent);
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) }
    }
    drop(theirs);
    // A broker that stops answering (a user may stop it: it is theirs) fails the
    // registration after a second instead of holding up every open.
    super::launcher::set_timeout(std::os::fd::AsFd::as_fd(&ours), libc::SO_RCVTIMEO, 1)?;
    Ok(ours)
}

/// The broker child (see [`spawn_backing_broker`]). Returns its exit code.
fn broker_main(dev: RawFd, sock: RawFd, acct: &Account, parent: libc::pid_t) -> i32 {
    // SAFETY: every call below is a plain system call on integers or on pointers to
    // values that live on this stack for the call; nothing allocates.
    unsafe {
        // Only the FUSE device (3) and the socket (4) stay open (moved out of the way
        // first: either may be 3 or 4 now).
        let (d, s) = (
            libc::fcntl(dev, libc::F_DUPFD, 10),
            libc::fcntl(sock, libc::F_DUPFD, 10),
        );
        if d < 0 || s < 0 || libc::dup2(d, 3) < 0 || libc::dup2(s, 4) < 0 {
            return 120;
        }
        if libc::syscall(libc::SYS_close_range, 5u32, u32::MAX, 0u32) != 0 {
            return 120;
        }
        let groups_ok = libc::setgroups(acct.groups.len(), acct.groups.as_ptr()) == 0;
        if !groups_ok
            || libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0
            || libc::setresgid(acct.gid, acct.gid, acct.gid) != 0
            || libc::setresuid(acct.uid, acct.uid, acct.uid) != 0
        {
            return 121;
        }
        let header = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let bit = 1u32 << CAP_SYS_ADMIN;
        let data = [
            CapData {
                effective: bit,
                permitted: bit,
                inheritable: 0,
            },
            CapData::default(),
        ];
        if libc::syscall(libc::SYS_capset, &header, data.as_ptr()) != 0
            || libc::prctl(libc::PR_SET_KEEPCAPS, 0, 0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
            || libc::getppid() != parent
        {
            return 122;
        }
        libc::prctl(libc::PR_SET_NAME, c"ccfs-backing".as_ptr(), 0, 0, 0);
        loop {
            let mut msg = [0u8; 5];
            let mut iov = libc::iovec {
                iov_base: msg.as_mut_ptr().cast(),
                iov_len: msg.len(),
            };
            let mut control = [0u64; 4];
            let mut hdr: libc::msghdr = std::mem::zeroed();
            hdr.msg_iov = &mut iov;
            hdr.msg_iovlen = 1;
            hdr.msg_control = control.as_mut_ptr().cast();
            hdr.msg_controllen = std::mem::size_of_val(&control) as _;
            let n = libc::recvmsg(4, &mut hdr, libc::MSG_CMSG_CLOEXEC);
            if n == 0 {
                return 0;
            }
            if n < 0 {
                if *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                return 123;
            }
            // At most one descriptor, and only with an open request.
            let mut fd = -1;
            let cmsg = libc::CMSG_FIRSTHDR(&hdr);
            if !cmsg.is_null()
                && (*cmsg).cmsg_level == libc::SOL_SOCKET
                && (*cmsg).cmsg_type == libc::SCM_RIGHTS
                && (*cmsg).cmsg_len as usize == libc::CMSG_LEN(4) as usize
            {
                fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>());
            }
            let id = u32::from_le_bytes([msg[1], msg[2], msg[3], msg[4]]);
            match (n, msg[0]) {
                (5, BROKER_OPEN) if fd >= 0 => {
                    let map = FuseBackingMap {
                        fd,
                        flags: 0,
                        padding: 0,
                    };
                    let r = libc::ioctl(3, FUSE_DEV_IOC_BACKING_OPEN as _, &map);
                    let answer: i64 = if r < 0 {
                        -i64::from(*libc::__errno_location())
                    } else {
                        i64::from(r)
                    };
                    libc::close(fd);
                    let bytes = answer.to_le_bytes();
                    if libc::send(4, bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) != 8 {
                        return 124;
                    }
                }
                (5, BROKER_CLOSE) if fd < 0 => {
                    libc::ioctl(3, FUSE_DEV_IOC_BACKING_CLOSE as _, &id);
                }
                _ => return 125,
            }
        }
    }
}

/// Sends a broker request (see [`spawn_backing_broker`]): `op`, `id`, and `file` with it.
pub fn broker_send(
    sock: BorrowedFd<'_>,
    op: u8,
    id: u32,
    file: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut msg = [0u8; 5];
    msg[0] = op;
    msg[1..].copy_from_slice(&id.to_le_bytes());
    super::launcher::send_with_fds(sock, &msg, file.as_slice())
}

/// The broker's answer to an open request: the backing id.
pub fn broker_answer(sock: BorrowedFd<'_>) -> io::Result<u32> {
    let v = super::launcher::read_answer(sock)?
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EPIPE))?;
    u32::try_from(super::launcher::value_or_errno(v)?)
        .map_err(|_| io::Error::from_raw_os_error(libc::EIO))
}
