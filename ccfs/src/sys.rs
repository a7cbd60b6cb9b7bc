//! The few system calls std does not wrap. Every `unsafe` block in ccfs lives here.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
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
fn xattr_buffer(
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

fn split_names(buf: &[u8]) -> Vec<OsString> {
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
                    Some(libc::EXDEV)
                    | Some(libc::ENOSYS)
                    | Some(libc::EOPNOTSUPP)
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

// ---- confined access below a root directory -------------------------------------------

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// The attributes of a file (from `fstatat`), without following a final symlink.
#[derive(Clone, Copy)]
pub struct Stat(libc::stat);

impl std::fmt::Debug for Stat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stat")
            .field("dev", &self.dev())
            .field("ino", &self.ino())
            .field("mode", &format_args!("{:o}", self.mode()))
            .field("size", &self.len())
            .finish()
    }
}

#[allow(clippy::unnecessary_cast)]
impl Stat {
    pub fn file_type(&self) -> u32 {
        self.0.st_mode as u32 & libc::S_IFMT
    }
    pub fn is_dir(&self) -> bool {
        self.file_type() == libc::S_IFDIR
    }
    pub fn is_file(&self) -> bool {
        self.file_type() == libc::S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.file_type() == libc::S_IFLNK
    }
    pub fn len(&self) -> u64 {
        self.0.st_size as u64
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn mode(&self) -> u32 {
        self.0.st_mode as u32
    }
    pub fn dev(&self) -> u64 {
        self.0.st_dev as u64
    }
    pub fn ino(&self) -> u64 {
        self.0.st_ino as u64
    }
    pub fn nlink(&self) -> u64 {
        self.0.st_nlink as u64
    }
    pub fn uid(&self) -> u32 {
        self.0.st_uid
    }
    pub fn gid(&self) -> u32 {
        self.0.st_gid
    }
    pub fn rdev(&self) -> u64 {
        self.0.st_rdev as u64
    }
    pub fn blocks(&self) -> u64 {
        self.0.st_blocks as u64
    }
    pub fn blksize(&self) -> u64 {
        self.0.st_blksize as u64
    }
    pub fn atime(&self) -> (i64, i64) {
        (self.0.st_atime as i64, self.0.st_atime_nsec as i64)
    }
    pub fn mtime(&self) -> (i64, i64) {
        (self.0.st_mtime as i64, self.0.st_mtime_nsec as i64)
    }
    pub fn ctime(&self) -> (i64, i64) {
        (self.0.st_ctime as i64, self.0.st_ctime_nsec as i64)
    }
}

/// `fstat` of an open file.
pub fn fstat(file: &impl AsRawFd) -> io::Result<Stat> {
    // SAFETY: `st` is a valid out-parameter for fstat; the fd is open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    check(unsafe { libc::fstat(file.as_raw_fd(), &mut st) })?;
    Ok(Stat(st))
}

fn rel_cstr(rel: &Path) -> io::Result<CString> {
    if rel.as_os_str().is_empty() {
        Ok(CString::from(c"."))
    } else if rel.is_absolute() {
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    } else {
        cstr(rel)
    }
}

/// `struct open_how` of openat2(2).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

fn proc_fd(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).unwrap_or_default()
}

/// A directory that every access stays below: paths are resolved with `openat2`
/// (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), so neither `..` nor a symlink planted in the
/// tree can lead outside it, and relative paths never hit PATH_MAX on the way in.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    path: std::path::PathBuf,
}

impl Root {
    pub fn open(path: &Path) -> io::Result<Self> {
        let c = cstr(path)?;
        // SAFETY: `c` is a valid path; the returned fd is owned below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        check(fd)?;
        Ok(Self {
            // SAFETY: `fd` is a fresh descriptor that nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: path.to_path_buf(),
        })
    }

    /// The absolute path of the root (for messages and external programs).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// openat2 below the root. `flags` are open(2) flags; O_NOFOLLOW is always added.
    pub fn open_fd(&self, rel: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
        let c = rel_cstr(rel)?;
        let how = OpenHow {
            flags: (flags | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64,
            mode: if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
                u64::from(mode)
            } else {
                0
            },
            resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
        };
        loop {
            // SAFETY: `how` is a valid open_how of the size passed; `c` is NUL-terminated.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_openat2,
                    self.fd.as_raw_fd(),
                    c.as_ptr(),
                    &how as *const OpenHow,
                    std::mem::size_of::<OpenHow>(),
                )
            };
            if r >= 0 {
                // SAFETY: a fresh descriptor that nothing else owns.
                return Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) });
            }
            let e = io::Error::last_os_error();
            // EAGAIN: a concurrent rename raced the lookup; ELOOP is what a symlink
            // component gives and is reported as such.
            if e.raw_os_error() != Some(libc::EAGAIN) {
                return Err(e);
            }
        }
    }

    pub fn open_file(&self, rel: &Path, flags: i32, mode: u32) -> io::Result<File> {
        Ok(File::from(self.open_fd(rel, flags, mode)?))
    }

    /// An O_PATH descriptor of `rel` itself (a symlink is not followed).
    fn path_fd(&self, rel: &Path) -> io::Result<OwnedFd> {
        self.open_fd(rel, libc::O_PATH, 0)
    }

    /// The parent directory of `rel` (opened below the root) and the last component.
    fn parent(&self, rel: &Path) -> io::Result<(OwnedFd, CString)> {
        let name = rel
            .file_name()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        let fd = self.open_fd(parent, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        Ok((fd, cname(name)?))
    }

    /// lstat below the root; `Ok(None)` when it does not exist.
    pub fn stat(&self, rel: &Path) -> io::Result<Option<Stat>> {
        let st = if rel.as_os_str().is_empty() {
            fstat(&self.fd)
        } else {
            self.parent(rel).and_then(|(dir, name)| {
                // SAFETY: `st` is a valid out-parameter; `dir` and `name` are valid.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                check(unsafe {
                    libc::fstatat(
                        dir.as_raw_fd(),
                        name.as_ptr(),
                        &mut st,
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                })?;
                Ok(Stat(st))
            })
        };
        match st {
            Ok(s) => Ok(Some(s)),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    pub fn mkdir(&self, rel: &Path, mode: u32) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        // SAFETY: valid fd and NUL-terminated name.
        check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) })
    }

    pub fn unlink(&self, rel: &Path) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        // SAFETY: valid fd and NUL-terminated name.
        check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) })
    }

    pub fn rmdir(&self, rel: &Path) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        // SAFETY: valid fd and NUL-terminated name.
        check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) })
    }

    /// renameat2 of two paths below this root.
    pub fn rename(&self, from: &Path, to: &Path, flags: u32) -> io::Result<()> {
        let (fd1, n1) = self.parent(from)?;
        let (fd2, n2) = self.parent(to)?;
        // SAFETY: valid fds and NUL-terminated names.
        check(unsafe {
            libc::renameat2(
                fd1.as_raw_fd(),
                n1.as_ptr(),
                fd2.as_raw_fd(),
                n2.as_ptr(),
                flags,
            )
        })
    }

    pub fn symlink(&self, target: &Path, rel: &Path) -> io::Result<()> {
        let t = cstr(target)?;
        let (dir, name) = self.parent(rel)?;
        // SAFETY: valid fd and NUL-terminated strings.
        check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })
    }

    /// A hard link `to` of `from`, both below this root.
    pub fn link(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (fd1, n1) = self.parent(from)?;
        let (fd2, n2) = self.parent(to)?;
        // SAFETY: valid fds and NUL-terminated names; flags 0 never follow a symlink.
        check(unsafe {
            libc::linkat(
                fd1.as_raw_fd(),
                n1.as_ptr(),
                fd2.as_raw_fd(),
                n2.as_ptr(),
                0,
            )
        })
    }

    pub fn mknod(&self, rel: &Path, mode: u32, rdev: u64) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        // SAFETY: valid fd and NUL-terminated name.
        check(unsafe {
            libc::mknodat(
                dir.as_raw_fd(),
                name.as_ptr(),
                mode as libc::mode_t,
                rdev as libc::dev_t,
            )
        })
    }

    pub fn readlink(&self, rel: &Path) -> io::Result<std::path::PathBuf> {
        let (dir, name) = self.parent(rel)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: `buf` is writable for its length; fd and name are valid.
        let n = check_size(unsafe {
            libc::readlinkat(
                dir.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        })?;
        buf.truncate(n);
        Ok(std::path::PathBuf::from(OsString::from_vec(buf)))
    }

    /// chmod without following a final symlink (fchmodat2; symlinks keep their mode).
    pub fn chmod(&self, rel: &Path, mode: u32) -> io::Result<()> {
        if rel.as_os_str().is_empty() {
            let c = proc_fd(self.fd.as_raw_fd());
            // SAFETY: the magic link names our own root directory.
            return check(unsafe { libc::chmod(c.as_ptr(), mode as libc::mode_t) });
        }
        let (dir, name) = self.parent(rel)?;
        // SAFETY: valid fd and name; fchmodat2 takes (dirfd, path, mode, flags).
        let r = unsafe {
            libc::syscall(
                libc::SYS_fchmodat2,
                dir.as_raw_fd(),
                name.as_ptr(),
                mode as libc::mode_t,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        check(r as libc::c_int)
    }

    pub fn chown(&self, rel: &Path, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
        let fd = self.path_fd(rel)?;
        let empty = CString::default();
        // SAFETY: AT_EMPTY_PATH makes fchownat act on the O_PATH descriptor itself.
        check(unsafe {
            libc::fchownat(
                fd.as_raw_fd(),
                empty.as_ptr(),
                uid.unwrap_or(u32::MAX),
                gid.unwrap_or(u32::MAX),
                libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            )
        })
    }

    pub fn utimens(&self, rel: &Path, atime: SetTime, mtime: SetTime) -> io::Result<()> {
        let ts = [timespec(atime), timespec(mtime)];
        if rel.as_os_str().is_empty() {
            let c = proc_fd(self.fd.as_raw_fd());
            // SAFETY: valid path and timespec array.
            return check(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) });
        }
        let (dir, name) = self.parent(rel)?;
        // SAFETY: valid fd, name and timespec array.
        check(unsafe {
            libc::utimensat(
                dir.as_raw_fd(),
                name.as_ptr(),
                ts.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })
    }

    /// The entries of a directory: name, inode number, file type (S_IFMT bits, 0 if the
    /// filesystem does not say).
    pub fn read_dir(&self, rel: &Path) -> io::Result<Vec<(OsString, u64, u32)>> {
        let fd = self.open_fd(rel, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            // SAFETY: `buf` is writable for its length; the fd is an open directory.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_getdents64,
                    fd.as_raw_fd(),
                    buf.as_mut_ptr(),
                    buf.len(),
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                break;
            }
            let mut off = 0usize;
            while off < n as usize {
                // linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, name...
                let rec = &buf[off..n as usize];
                if rec.len() < 19 {
                    break;
                }
                let ino = u64::from_ne_bytes(rec[0..8].try_into().unwrap_or([0; 8]));
                let reclen = u16::from_ne_bytes([rec[16], rec[17]]) as usize;
                let dtype = rec[18];
                if reclen == 0 || reclen > rec.len() {
                    break;
                }
                let name_bytes = &rec[19..reclen];
                let end = name_bytes
                    .iter()
                    .position(|b| *b == 0)
                    .unwrap_or(name_bytes.len());
                let name = &name_bytes[..end];
                if name != b"." && name != b".." {
                    let kind = match dtype {
                        libc::DT_DIR => libc::S_IFDIR,
                        libc::DT_REG => libc::S_IFREG,
                        libc::DT_LNK => libc::S_IFLNK,
                        libc::DT_FIFO => libc::S_IFIFO,
                        libc::DT_SOCK => libc::S_IFSOCK,
                        libc::DT_CHR => libc::S_IFCHR,
                        libc::DT_BLK => libc::S_IFBLK,
                        _ => 0,
                    };
                    out.push((OsString::from_vec(name.to_vec()), ino, kind));
                }
                off += reclen;
            }
        }
        Ok(out)
    }

    fn xattr_path(&self, rel: &Path) -> io::Result<(OwnedFd, CString)> {
        let fd = self.path_fd(rel)?;
        let p = proc_fd(fd.as_raw_fd());
        Ok((fd, p))
    }

    pub fn getxattr(&self, rel: &Path, name: &OsStr) -> io::Result<Vec<u8>> {
        let (_fd, p) = self.xattr_path(rel)?;
        let n = cname(name)?;
        // SAFETY: `buf` is NULL with len 0, or writable for `len` bytes; strings are valid.
        xattr_buffer(|buf, len| unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf, len) })
    }

    pub fn listxattr(&self, rel: &Path) -> io::Result<Vec<OsString>> {
        let (_fd, p) = self.xattr_path(rel)?;
        // SAFETY: `buf` is NULL with len 0, or writable for `len` bytes.
        xattr_buffer(|buf, len| unsafe { libc::listxattr(p.as_ptr(), buf.cast(), len) })
            .map(|b| split_names(&b))
    }

    pub fn setxattr(&self, rel: &Path, name: &OsStr, value: &[u8], flags: i32) -> io::Result<()> {
        let (_fd, p) = self.xattr_path(rel)?;
        let n = cname(name)?;
        // SAFETY: `value` is readable for its length; strings are valid.
        check(unsafe {
            libc::setxattr(
                p.as_ptr(),
                n.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            )
        })
    }

    pub fn removexattr(&self, rel: &Path, name: &OsStr) -> io::Result<()> {
        let (_fd, p) = self.xattr_path(rel)?;
        let n = cname(name)?;
        // SAFETY: valid strings.
        check(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) })
    }
}

// ---- users and credentials -------------------------------------------------------------

/// A local user account: the identity a mount runs as when root starts it for a user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

fn passwd_account(pw: &libc::passwd) -> io::Result<Account> {
    // SAFETY: pw_name points to a NUL-terminated string owned by the caller's buffer.
    let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) }
        .to_string_lossy()
        .into_owned();
    let cname =
        CString::new(name.clone()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut n = groups.len() as libc::c_int;
        // SAFETY: `groups` is writable for `n` entries; getgrouplist updates `n`.
        let rc =
            unsafe { libc::getgrouplist(cname.as_ptr(), pw.pw_gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n as usize);
            break;
        }
        groups.resize((n as usize).max(groups.len() * 2), 0);
    }
    Ok(Account {
        name,
        uid: pw.pw_uid,
        gid: pw.pw_gid,
        groups,
    })
}

fn lookup_passwd(
    f: impl Fn(*mut libc::passwd, *mut libc::c_char, usize, *mut *mut libc::passwd) -> libc::c_int,
) -> io::Result<Option<Account>> {
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: zeroed passwd is a valid out-parameter; it is only read after success.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    let rc = f(&mut pw, buf.as_mut_ptr(), buf.len(), &mut result);
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    if result.is_null() {
        return Ok(None);
    }
    passwd_account(&pw).map(Some)
}

/// Looks a user up by name.
pub fn user_by_name(name: &str) -> io::Result<Option<Account>> {
    let c = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: all pointers are valid for the call; getpwnam_r fills `pw` from `buf`.
    lookup_passwd(|pw, buf, len, out| unsafe { libc::getpwnam_r(c.as_ptr(), pw, buf, len, out) })
}

/// Looks a user up by uid.
pub fn user_by_uid(uid: u32) -> io::Result<Option<Account>> {
    // SAFETY: all pointers are valid for the call; getpwuid_r fills `pw` from `buf`.
    lookup_passwd(|pw, buf, len, out| unsafe { libc::getpwuid_r(uid, pw, buf, len, out) })
}

/// Switches the whole process's effective ids and groups to `acct` (real and saved ids
/// stay root, so [`restore_root`] can switch back). glibc applies it to every thread.
pub fn set_effective(acct: &Account) -> io::Result<()> {
    // SAFETY: plain credential calls with valid arguments.
    unsafe {
        check(libc::setgroups(acct.groups.len(), acct.groups.as_ptr()))?;
        check(libc::setegid(acct.gid))?;
        check(libc::seteuid(acct.uid))
    }
}

/// Back to root after [`set_effective`].
pub fn restore_root() -> io::Result<()> {
    let root_groups = [0 as libc::gid_t];
    // SAFETY: plain credential calls with valid arguments.
    unsafe {
        check(libc::seteuid(0))?;
        check(libc::setegid(0))?;
        check(libc::setgroups(1, root_groups.as_ptr()))
    }
}

/// Becomes `acct` for good in every thread, except that the saved user id stays root so
/// one thread can later unmount (see [`thread_regain_root`]).
pub fn become_user(acct: &Account) -> io::Result<()> {
    // SAFETY: plain credential calls with valid arguments.
    unsafe {
        check(libc::setgroups(acct.groups.len(), acct.groups.as_ptr()))?;
        check(libc::setresgid(acct.gid, acct.gid, acct.gid))?;
        check(libc::setresuid(acct.uid, acct.uid, 0))
    }
}

/// Root again in the calling thread only (a raw syscall: glibc would change every thread).
pub fn thread_regain_root() -> io::Result<()> {
    // SAFETY: setresuid/setresgid with -1 keep those ids; credentials are per thread in Linux.
    unsafe {
        check(libc::syscall(libc::SYS_setresuid, -1i32, 0i32, -1i32) as libc::c_int)?;
        check(libc::syscall(libc::SYS_setresgid, -1i32, 0i32, -1i32) as libc::c_int)
    }
}

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
