//! The few system calls std does not wrap. Every `unsafe` block in ccfs lives here.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn cname(n: &OsStr) -> io::Result<CString> {
    CString::new(n.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn check_size(rc: libc::ssize_t) -> io::Result<usize> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

/// Writes all of `buf` to a raw descriptor and gives up silently at the first error:
/// for log output, which must never fail (or panic) its caller.
pub fn write_fd_lossy(fd: RawFd, buf: &[u8]) {
    let mut rest = buf;
    while !rest.is_empty() {
        // SAFETY: `rest` is readable for its length; a bad descriptor only gives an error.
        let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if n == 0 {
            return;
        }
        rest = &rest[n as usize..];
    }
}

/// Makes descriptor `to` a copy of `from` (dup2), e.g. to send standard error to a file.
pub fn dup_onto(from: &impl AsRawFd, to: RawFd) -> io::Result<()> {
    // SAFETY: dup2 on a descriptor we hold open; `to` is replaced atomically.
    check(unsafe { libc::dup2(from.as_raw_fd(), to) })
}

/// True when the real user may write and search the directory `dir` (access(2)).
pub fn may_write(dir: &Path) -> bool {
    let Ok(c) = cstr(dir) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path; access only reads it.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// Sets the process's file mode creation mask; returns the one before.
pub fn set_umask(mask: u32) -> u32 {
    // SAFETY: umask has no preconditions and cannot fail.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

mod backing;
mod creds;
mod dirfd;
mod file;
pub mod launcher;
mod mount;
mod pam;
mod peer;
mod proc;
mod root;

pub use backing::*;
pub use creds::*;
pub use dirfd::*;
pub use file::*;
pub use mount::*;
pub use pam::*;
pub use peer::*;
pub use proc::*;
pub use root::*;
