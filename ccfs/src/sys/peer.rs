//! The control socket's peers, and descriptors handed over by a client.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::{FromRawFd, OwnedFd};

use super::*;

// ---- control socket peers --------------------------------------------------------------

/// Who is at the other end of a connected Unix socket (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

/// The credentials of the peer of `stream`: of the process that connected, or, seen from
/// the connecting side, of the process that called `listen` (with its ids at that time).
pub fn peer_credentials(stream: &std::os::unix::net::UnixStream) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable ucred and `len` holds its size; the kernel writes at
    // most `len` bytes into it and stores the length it wrote back into `len`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast::<libc::c_void>(),
            &mut len,
        )
    };
    check(rc)?;
    Ok(PeerCred {
        pid: cred.pid as u32,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// Whether `file` is open for reading and writing with none of `bits` in its status flags.
pub fn is_plain_read_write(file: &impl AsRawFd, bits: i32) -> bool {
    // SAFETY: fcntl F_GETFL takes no argument on a descriptor we hold.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    flags >= 0 && flags & libc::O_ACCMODE == libc::O_RDWR && flags & bits == 0
}

/// A new descriptor of the object `file` has open, for reading and writing, with no other
/// status flags (through /proc/self/fd: the permission is checked as for an open by path,
/// so a file the caller may not both read and write gives EACCES).
pub fn reopen_read_write(file: &impl AsRawFd) -> io::Result<File> {
    let path = proc_fd(file.as_raw_fd());
    // SAFETY: a NUL-terminated path; the result is owned below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    check(fd)?;
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}
