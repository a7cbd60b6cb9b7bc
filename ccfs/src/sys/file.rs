//! Files: times, extended attributes, space, copies, locks and leases.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

use super::*;

/// A time to set with [`utimens`].
#[derive(Debug, Clone, Copy)]
pub enum SetTime {
    Omit,
    Now,
    At { secs: i64, nsecs: i64 },
}

pub(super) fn timespec(t: SetTime) -> libc::timespec {
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
    check(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// Sets the times of an open file.
pub fn futimens(file: &File, atime: SetTime, mtime: SetTime) -> io::Result<()> {
    let ts = [timespec(atime), timespec(mtime)];
    // SAFETY: the fd is open and `ts` holds two valid timespec values.
    check(unsafe { libc::futimens(file.as_raw_fd(), ts.as_ptr()) })
}

/// Calls a size-then-fill xattr call (`f(buf, len)`, NULL/0 asks for the size) until the
/// value fits (it may grow between the two calls).
pub(super) fn xattr_buffer(
    mut f: impl FnMut(*mut libc::c_void, usize) -> libc::ssize_t,
) -> io::Result<Vec<u8>> {
    loop {
        let size = check_size(f(std::ptr::null_mut(), 0))?;
        let mut buf = vec![0u8; size];
        match check_size(f(buf.as_mut_ptr().cast(), buf.len())) {
            Ok(len) => {
                buf.truncate(len);
                return Ok(buf);
            }
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
}

pub(super) fn split_names(buf: &[u8]) -> Vec<OsString> {
    buf.split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| OsString::from_vec(s.to_vec()))
        .collect()
}

pub fn lgetxattr(path: &Path, name: &OsStr) -> io::Result<Vec<u8>> {
    let c = cstr(path)?;
    let n = cname(name)?;
    // SAFETY: `buf` is NULL with len 0, or writable for `len` bytes; strings are valid.
    xattr_buffer(|buf, len| unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf, len) })
}

pub fn llistxattr(path: &Path) -> io::Result<Vec<OsString>> {
    let c = cstr(path)?;
    // SAFETY: `buf` is NULL with len 0, or writable for `len` bytes.
    xattr_buffer(|buf, len| unsafe { libc::llistxattr(c.as_ptr(), buf.cast(), len) })
        .map(|b| split_names(&b))
}

/// The names of the extended attributes of the open file `f`.
pub fn flistxattr(f: &impl AsRawFd) -> io::Result<Vec<OsString>> {
    let fd = f.as_raw_fd();
    // SAFETY: `buf` is NULL with len 0, or writable for `len` bytes; the fd is open.
    xattr_buffer(|buf, len| unsafe { libc::flistxattr(fd, buf.cast(), len) })
        .map(|b| split_names(&b))
}

/// The value of the extended attribute `name` of the open file `f`.
pub fn fgetxattr(f: &impl AsRawFd, name: &OsStr) -> io::Result<Vec<u8>> {
    let fd = f.as_raw_fd();
    let n = cname(name)?;
    // SAFETY: `buf` is NULL with len 0, or writable for `len` bytes; the name is valid.
    xattr_buffer(|buf, len| unsafe { libc::fgetxattr(fd, n.as_ptr(), buf, len) })
}

pub fn lsetxattr(path: &Path, name: &OsStr, value: &[u8], flags: i32) -> io::Result<()> {
    let c = cstr(path)?;
    let n = cname(name)?;
    // SAFETY: `value` is readable for `value.len()` bytes; strings are NUL-terminated.
    check(unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
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
        libc::fallocate(
            file.as_raw_fd(),
            mode,
            offset as libc::off_t,
            len as libc::off_t,
        )
    })
}

/// Clears `O_APPEND` on the open file description of `file`: writes at an offset land at
/// that offset (on an `O_APPEND` descriptor Linux's `pwrite` appends whatever the offset).
pub fn clear_append(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl F_GETFL / F_SETFL with an integer argument on a descriptor `file` owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    if flags & libc::O_APPEND != 0 {
        // SAFETY: as above.
        check(unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_APPEND) })?;
    }
    Ok(())
}

/// The data extents of `src` within `[from, to)` (SEEK_DATA / SEEK_HOLE; the whole range
/// where the filesystem cannot tell), in order.
pub fn data_extents(src: &File, from: u64, to: u64) -> io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut pos = from;
    while pos < to {
        let data = match seek(src, pos, libc::SEEK_DATA) {
            Ok(Some(d)) => d,
            Ok(None) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                out.push((pos, to));
                break;
            }
            Err(e) => return Err(e),
        };
        if data >= to {
            break;
        }
        let hole = match seek(src, data, libc::SEEK_HOLE) {
            Ok(Some(h)) => h.min(to),
            Ok(None) => to,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => to,
            Err(e) => return Err(e),
        };
        out.push((data, hole));
        pos = hole;
    }
    Ok(out)
}

/// Closes a duplicate of `file`'s descriptor: what a program's close(2) of it would make
/// the filesystem below do (a network client writes out what it holds and answers with
/// the error it kept, as NFS's close-to-open and sshfs's and GlusterFS's write-behind do).
/// The descriptor itself stays open.
pub fn flush(file: &File) -> io::Result<()> {
    // SAFETY: dup of an open descriptor; the new one is ours alone and closed once below.
    let fd = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    check(fd)?;
    // SAFETY: `fd` is the duplicate made above, closed once.
    check(unsafe { libc::close(fd) })
}

/// fchmod(2).
pub fn fchmod(file: &File, mode: u32) -> io::Result<()> {
    // SAFETY: the fd is owned by `file`.
    check(unsafe { libc::fchmod(file.as_raw_fd(), mode as libc::mode_t) })
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
    copy_extents(src, dst, len)?;
    dst.set_len(len)
}

/// [`copy_data`] into a new, empty `dst`: its length is set only where the data does not
/// reach `len` (a hole at the end), one call less to a network share.
pub fn copy_into_new(src: &File, dst: &File, len: u64) -> io::Result<()> {
    if copy_extents(src, dst, len)? < len {
        dst.set_len(len)?;
    }
    Ok(())
}

/// Copies the data extents of the first `len` bytes of `src` to the same offsets of
/// `dst`; returns the end of the last byte copied.
fn copy_extents(src: &File, dst: &File, len: u64) -> io::Result<u64> {
    let mut end = 0u64;
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
                    Some(libc::EXDEV)
                    | Some(libc::ENOSYS)
                    | Some(libc::EOPNOTSUPP)
                    | Some(libc::EINVAL) => {
                        end = end.max(copy_slow(src, dst, off_in as u64, left)?);
                        break;
                    }
                    _ => return Err(e),
                }
            }
            if n == 0 {
                break; // source shrank under us
            }
            left -= n as usize;
            end = end.max(off_out as u64);
        }
        pos = hole;
    }
    Ok(end)
}

/// Copies `left` bytes at `off` by reads and writes; returns the end of what it copied.
fn copy_slow(src: &File, dst: &File, mut off: u64, mut left: usize) -> io::Result<u64> {
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
    Ok(off)
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

/// `F_SETSIG` (asm-generic, as on x86, arm and riscv): the signal a lease break sends.
const F_SETSIG: libc::c_int = 10;

/// Whether the regular file `file` (open read-only here) is open for writing anywhere:
/// by any process, or by the kernel itself (the backing file of a FUSE passthrough open
/// lives on in the kernel after its daemon died, and takes writes without it). The kernel
/// refuses a read lease (EAGAIN) while any descriptor of the inode is open for writing;
/// one granted is given back at once. A lease needs the file to be the caller's (or
/// CAP_LEASE), and leases enabled (`fs.leases-enable`): otherwise the error says why.
pub fn open_for_writing(file: &File) -> io::Result<bool> {
    lease_refused(file, libc::F_RDLCK)
}

/// Whether the regular file `file` (open read-only here) is open anywhere else, for
/// reading or writing: by any process, or by the kernel (the backing file of a FUSE
/// passthrough open). The kernel refuses a write lease (EAGAIN) while any other descriptor
/// of the inode is open; one granted is given back at once. A kernel that does not count
/// an inode's readers grants it despite them: then only writers are seen. Errors as for
/// [`open_for_writing`].
pub fn open_elsewhere(file: &File) -> io::Result<bool> {
    lease_refused(file, libc::F_WRLCK)
}

/// Whether the kernel refuses a lease of `kind` on `file` (EAGAIN: another descriptor
/// is open in the way); a lease granted is given back at once.
fn lease_refused(file: &File, kind: libc::c_int) -> io::Result<bool> {
    let fd = file.as_raw_fd();
    // Should an opener come in the moment the lease is held, the break is signalled with
    // SIGURG (ignored unless handled) instead of SIGIO (which would end this process).
    // SAFETY: fcntl with integer arguments on a descriptor `file` owns.
    check(unsafe { libc::fcntl(fd, F_SETSIG, libc::SIGURG) })?;
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETLEASE, kind) } < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) => Ok(true),
            _ => Err(e),
        };
    }
    // SAFETY: as above. Closing `file` would give the lease back too.
    check(unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) })?;
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_open_for_writing_while_any_descriptor_writes_it() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("f");
        std::fs::write(&p, b"x").expect("write");
        let look = File::open(&p).expect("open");
        assert!(!open_for_writing(&look).expect("lease"));
        let reader = File::open(&p).expect("open");
        assert!(
            !open_for_writing(&look).expect("lease"),
            "readers do not count"
        );
        let writer = std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .expect("open");
        assert!(open_for_writing(&look).expect("lease"));
        drop(writer);
        assert!(
            !open_for_writing(&look).expect("lease"),
            "the lease was given back"
        );
        drop(reader);
    }
}
