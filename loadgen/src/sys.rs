//! The few system calls std does not wrap. Every `unsafe` block in loadgen lives here.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The effective user id.
pub fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The effective group id.
pub fn getegid() -> u32 {
    // SAFETY: getegid has no preconditions and cannot fail.
    unsafe { libc::getegid() }
}

/// Sets the process's file mode creation mask; returns the one before.
pub fn set_umask(mask: u32) -> u32 {
    // SAFETY: umask has no preconditions and cannot fail.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

/// Writes every filesystem's dirty data out (sync(2)).
pub fn sync_all() {
    // SAFETY: sync has no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// Writes out the filesystem `file` is on (syncfs(2)).
pub fn syncfs(file: &File) -> io::Result<()> {
    // SAFETY: syncfs on a descriptor `file` holds open.
    if unsafe { libc::syncfs(file.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether the real user may write in `p` (access(2)); false for a path with a NUL.
pub fn may_write(p: &Path) -> bool {
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access only reads the NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// Whether `p` (not followed if a symbolic link) has the extended attribute `name` with
/// a value; true when either cannot be passed to the kernel (a NUL in it), so that a
/// caller checking for what makes a path unsafe errs on the safe side.
pub fn has_xattr(p: &Path, name: &str) -> bool {
    let (Ok(c), Ok(n)) = (CString::new(p.as_os_str().as_bytes()), CString::new(name)) else {
        return true;
    };
    // SAFETY: both strings are NUL-terminated; a null buffer of size 0 asks for the size
    // only.
    unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) > 0 }
}

/// Reaps our child `pid` if it has exited, without waiting: its wait status and CPU
/// seconds (user and system, its reaped children's included). `Ok(None)` while it runs;
/// an error when it is not our child.
pub fn try_reap(pid: u32) -> io::Result<Option<(i32, f64)>> {
    let mut status = 0;
    // SAFETY: rusage is plain data, filled by the kernel.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on one pid with valid pointers to our own locals.
    let r = unsafe { libc::wait4(pid as libc::pid_t, &mut status, libc::WNOHANG, &mut ru) };
    match r {
        0 => Ok(None),
        r if r == pid as libc::pid_t => {
            let secs = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
            Ok(Some((status, secs(ru.ru_utime) + secs(ru.ru_stime))))
        }
        _ => Err(io::Error::last_os_error()),
    }
}

/// Makes this process the reaper of its orphaned descendants (PR_SET_CHILD_SUBREAPER).
pub fn become_subreaper() {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
}

/// The kernel's clock ticks a second (the unit of /proc/PID/stat's CPU times).
pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64
}

/// Runs `handler` on SIGINT and SIGTERM. It runs in signal context: it must be
/// async-signal-safe (an atomic store, nothing that allocates or locks).
pub fn on_stop_signals(handler: extern "C" fn(libc::c_int)) {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is valid plain data; the handler is a plain function
        // (the caller keeps it async-signal-safe).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Detaches the mount at `p` at once, busy or not (`umount2(MNT_DETACH)`: needs root);
/// whether it did.
pub fn detach_mount(p: &Path) -> bool {
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) == 0 }
}
