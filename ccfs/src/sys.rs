//! The few system calls std does not wrap. Every `unsafe` block in ccfs lives here.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
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

/// A time to set with [`utimens`].
#[derive(Debug, Clone, Copy)]
pub enum SetTime {
    Omit,
    Now,
    At { secs: i64, nsecs: i64 },
}

fn timespec(t: SetTime) -> libc::timespec {
    match t {
        SetTime::Omit => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        SetTime::Now => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        SetTime::At { secs, nsecs } => libc::timespec {
            tv_sec: secs,
            tv_nsec: nsecs,
        },
    }
}

/// Sets access and modification times without following a final symlink.
pub fn utimens(path: &Path, atime: SetTime, mtime: SetTime) -> io::Result<()> {
    let c = cstr(path)?;
    let ts = [timespec(atime), timespec(mtime)];
    // SAFETY: `c` is NUL-terminated and `ts` points to two valid timespec values.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) })
}

/// Sets a file's mode. Never follows a symlink (on Linux a symlink's mode cannot change).
pub fn chmod(path: &Path, mode: u32) -> io::Result<()> {
    let c = cstr(path)?;
    // SAFETY: `c` is a valid NUL-terminated path.
    check(unsafe { libc::fchmodat(libc::AT_FDCWD, c.as_ptr(), mode as libc::mode_t, 0) })
}

pub fn mknod(path: &Path, mode: u32, rdev: u64) -> io::Result<()> {
    let c = cstr(path)?;
    // SAFETY: `c` is a valid NUL-terminated path.
    check(unsafe { libc::mknod(c.as_ptr(), mode as libc::mode_t, rdev as libc::dev_t) })
}

/// renameat2 with flags (RENAME_NOREPLACE, RENAME_EXCHANGE).
pub fn rename2(from: &Path, to: &Path, flags: u32) -> io::Result<()> {
    let a = cstr(from)?;
    let b = cstr(to)?;
    // SAFETY: both are valid NUL-terminated paths.
    check(unsafe {
        libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), flags)
    })
}

pub fn lgetxattr(path: &Path, name: &OsStr) -> io::Result<Vec<u8>> {
    let c = cstr(path)?;
    let n = cname(name)?;
    loop {
        // SAFETY: a NULL buffer of size 0 asks for the value's size.
        let size = check_size(unsafe {
            libc::lgetxattr(c.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0)
        })?;
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` is writable for `buf.len()` bytes.
        let got = unsafe {
            libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        };
        match check_size(got) {
            Ok(len) => {
                buf.truncate(len);
                return Ok(buf);
            }
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
}

pub fn llistxattr(path: &Path) -> io::Result<Vec<OsString>> {
    let c = cstr(path)?;
    loop {
        // SAFETY: a NULL buffer of size 0 asks for the list's size.
        let size = check_size(unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) })?;
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` is writable for `buf.len()` bytes.
        let got = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        match check_size(got) {
            Ok(len) => {
                buf.truncate(len);
                return Ok(buf
                    .split(|b| *b == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| OsString::from_vec(s.to_vec()))
                    .collect());
            }
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
}

pub fn lsetxattr(path: &Path, name: &OsStr, value: &[u8], flags: i32) -> io::Result<()> {
    let c = cstr(path)?;
    let n = cname(name)?;
    // SAFETY: `value` is readable for `value.len()` bytes; strings are NUL-terminated.
    check(unsafe {
        libc::lsetxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags)
    })
}

pub fn lremovexattr(path: &Path, name: &OsStr) -> io::Result<()> {
    let c = cstr(path)?;
    let n = cname(name)?;
    // SAFETY: both strings are NUL-terminated.
    check(unsafe { libc::lremovexattr(c.as_ptr(), n.as_ptr()) })
}

pub fn fallocate(file: &File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: the fd is owned by `file` and stays open for the call.
    check(unsafe {
        libc::fallocate(file.as_raw_fd(), mode, offset as libc::off_t, len as libc::off_t)
    })
}

/// lseek with SEEK_DATA / SEEK_HOLE; `Ok(None)` at end of data (ENXIO).
fn seek(file: &File, offset: u64, whence: i32) -> io::Result<Option<u64>> {
    // SAFETY: the fd is owned by `file`.
    let r = unsafe { libc::lseek(file.as_raw_fd(), offset as libc::off_t, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(r as u64))
}

/// Copies file data, keeping holes (SEEK_DATA/SEEK_HOLE) and using copy_file_range.
/// `dst` must be empty; its size is set to `len` at the end.
pub fn copy_data(src: &File, dst: &File, len: u64) -> io::Result<()> {
    let mut pos = 0u64;
    while pos < len {
        let data = match seek(src, pos, libc::SEEK_DATA) {
            Ok(Some(d)) => d,
            Ok(None) => break,
            // Filesystems without SEEK_DATA: treat everything as data.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => pos,
            Err(e) => return Err(e),
        };
        let hole = match seek(src, data, libc::SEEK_HOLE) {
            Ok(Some(h)) => h.min(len),
            Ok(None) => len,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => len,
            Err(e) => return Err(e),
        };
        let mut off_in = data as libc::loff_t;
        let mut off_out = data as libc::loff_t;
        let mut left = (hole - data) as usize;
        while left > 0 {
            // SAFETY: both fds are open; the offsets are valid, writable loff_t values.
            let n = unsafe {
                libc::copy_file_range(
                    src.as_raw_fd(),
                    &mut off_in,
                    dst.as_raw_fd(),
                    &mut off_out,
                    left,
                    0,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EXDEV) | Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP)
                    | Some(libc::EINVAL) => {
                        copy_slow(src, dst, off_in as u64, left)?;
                        break;
                    }
                    _ => return Err(e),
                }
            }
            if n == 0 {
                break; // source shrank under us
            }
            left -= n as usize;
        }
        pos = hole;
    }
    dst.set_len(len)
}

fn copy_slow(src: &File, dst: &File, mut off: u64, mut left: usize) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 256 * 1024];
    while left > 0 {
        let want = left.min(buf.len());
        let n = src.read_at(&mut buf[..want], off)?;
        if n == 0 {
            break;
        }
        dst.write_all_at(&buf[..n], off)?;
        off += n as u64;
        left -= n;
    }
    Ok(())
}

pub fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

pub fn umask_of_process() -> u32 {
    // SAFETY: umask has no preconditions; we restore the old value at once.
    let old = unsafe { libc::umask(0o022) };
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    old as u32
}

/// Non-blocking exclusive flock; `Ok(false)` when another process holds it.
pub fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    // SAFETY: the fd is owned by `file`.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// True when `pid` names a live process (a zombie counts as gone).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses: "PID (comm) S ...".
        Ok(stat) => stat
            .rsplit_once(") ")
            .map(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
            .unwrap_or(true),
        Err(_) => false,
    }
}
