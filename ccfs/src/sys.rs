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

/// Makes a command's process die with the thread that starts it (PR_SET_PDEATHSIG: a killed
/// daemon leaves no rsync writing to the share), and keep `hold` open across exec (its
/// children inherit it too; see [`crate::sync::RsyncOptions::hold_fd`]).
pub fn die_with_parent(cmd: &mut std::process::Command, hold: Option<RawFd>) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid is async-signal-safe and has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (prctl, getppid, fcntl) on values copied into it.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before the prctl: then it is too late to learn of it.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            if let Some(fd) = hold {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
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

/// The fields of /proc/PID/stat after the command name ("PID (comm) S ..."; the name may
/// hold anything, so they start after the last ") "), the state first; None when the
/// process is gone.
fn stat_fields(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(
        stat.rsplit_once(") ")
            .map_or("", |(_, rest)| rest)
            .to_string(),
    )
}

/// True when `pid` names a live process (a zombie counts as gone).
pub fn process_alive(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// A process's start time (clock ticks since boot, field 22 of /proc/PID/stat): with the
/// pid, it names one process, whatever later reuses the pid. None when it is gone.
pub fn process_start(pid: u32) -> Option<u64> {
    stat_fields(pid)?.split_whitespace().nth(19)?.parse().ok()
}

// ---- confined access below a root directory -------------------------------------------

use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};

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

/// What tells one version of an object from another: the object (device, inode), its
/// size, and its modification and change times (see [`Stat::version`]).
pub type Version = ((u64, u64), u64, (i64, i64), (i64, i64));

#[allow(clippy::unnecessary_cast)]
impl Stat {
    /// See [`Version`].
    pub fn version(&self) -> Version {
        (
            (self.dev(), self.ino()),
            self.len(),
            self.mtime(),
            self.ctime(),
        )
    }

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
    /// For the share: every access passes it ([`crate::gate`]).
    gate: Option<std::sync::Arc<crate::gate::ShareGate>>,
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
            gate: None,
        })
    }

    /// [`Root::open`] for a share: every access below passes `gate`.
    pub fn open_gated(
        path: &Path,
        gate: std::sync::Arc<crate::gate::ShareGate>,
    ) -> io::Result<Self> {
        let _in_flight = gate.enter()?;
        let mut root = Self::open(path)?;
        root.gate = Some(gate.clone());
        Ok(root)
    }

    /// Runs one access below the root, through the gate when it has one.
    fn gated<T>(&self, access: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        match self.gate.as_deref() {
            Some(g) => g.enter()?.passed(access()),
            None => access(),
        }
    }

    /// The absolute path of the root (for messages and external programs).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// openat2 below the root. `flags` are open(2) flags; O_NOFOLLOW is always added.
    pub fn open_fd(&self, rel: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
        self.gated(|| -> io::Result<OwnedFd> {
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
        })
    }

    pub fn open_file(&self, rel: &Path, flags: i32, mode: u32) -> io::Result<File> {
        self.gated(|| -> io::Result<File> { Ok(File::from(self.open_fd(rel, flags, mode)?)) })
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
        match self.stat_through(rel) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Ok(None),
            r => r,
        }
    }

    /// Like [`Root::stat`], but a path through a non-directory is an error (ENOTDIR), not
    /// missing: the object on the way hides whatever another layer has below that name.
    pub fn stat_through(&self, rel: &Path) -> io::Result<Option<Stat>> {
        self.gated(|| -> io::Result<Option<Stat>> {
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
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    pub fn mkdir(&self, rel: &Path, mode: u32) -> io::Result<()> {
        self.gated(|| -> io::Result<()> {
            let (dir, name) = self.parent(rel)?;
            // SAFETY: valid fd and NUL-terminated name.
            check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) })
        })
    }

    pub fn unlink(&self, rel: &Path) -> io::Result<()> {
        self.gated(|| -> io::Result<()> {
            let (dir, name) = self.parent(rel)?;
            // SAFETY: valid fd and NUL-terminated name.
            check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) })
        })
    }

    pub fn rmdir(&self, rel: &Path) -> io::Result<()> {
        self.gated(|| -> io::Result<()> {
            let (dir, name) = self.parent(rel)?;
            // SAFETY: valid fd and NUL-terminated name.
            check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) })
        })
    }

    /// renameat2 of two paths below this root.
    pub fn rename(&self, from: &Path, to: &Path, flags: u32) -> io::Result<()> {
        self.gated(|| -> io::Result<()> {
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
        })
    }

    pub fn symlink(&self, target: &Path, rel: &Path) -> io::Result<()> {
        self.gated(|| -> io::Result<()> {
            let t = cstr(target)?;
            let (dir, name) = self.parent(rel)?;
            // SAFETY: valid fd and NUL-terminated strings.
            check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })
        })
    }

    /// A hard link `to` of `from`, both below this root.
    pub fn link(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.gated(|| -> io::Result<()> {
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
        })
    }

    pub fn mknod(&self, rel: &Path, mode: u32, rdev: u64) -> io::Result<()> {
        self.gated(|| -> io::Result<()> {
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
        })
    }

    pub fn readlink(&self, rel: &Path) -> io::Result<std::path::PathBuf> {
        self.gated(|| -> io::Result<std::path::PathBuf> {
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
        })
    }

    /// chmod without following a final symlink (fchmodat2; symlinks keep their mode).
    pub fn chmod(&self, rel: &Path, mode: u32) -> io::Result<()> {
        self.gated(|| -> io::Result<()> {
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
        })
    }

    pub fn chown(&self, rel: &Path, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
        self.gated(|| -> io::Result<()> {
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
        })
    }

    /// fchown of a file opened below this root (no path walked).
    pub fn fchown(&self, file: &File, uid: u32, gid: u32) -> io::Result<()> {
        // SAFETY: a valid open descriptor.
        self.gated(|| check(unsafe { libc::fchown(file.as_raw_fd(), uid, gid) }))
    }

    pub fn utimens(&self, rel: &Path, atime: SetTime, mtime: SetTime) -> io::Result<()> {
        self.gated(|| -> io::Result<()> {
            let ts = [timespec(atime), timespec(mtime)];
            if rel.as_os_str().is_empty() {
                let c = proc_fd(self.fd.as_raw_fd());
                // SAFETY: valid path and timespec array.
                return check(unsafe {
                    libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0)
                });
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
        })
    }

    /// The entries of a directory: name, inode number, file type (S_IFMT bits, 0 if the
    /// filesystem does not say).
    pub fn read_dir(&self, rel: &Path) -> io::Result<Vec<(OsString, u64, u32)>> {
        self.gated(|| -> io::Result<Vec<(OsString, u64, u32)>> {
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
        })
    }

    fn xattr_path(&self, rel: &Path) -> io::Result<(OwnedFd, CString)> {
        let fd = self.path_fd(rel)?;
        let p = proc_fd(fd.as_raw_fd());
        Ok((fd, p))
    }

    pub fn getxattr(&self, rel: &Path, name: &OsStr) -> io::Result<Vec<u8>> {
        self.gated(|| -> io::Result<Vec<u8>> {
            let (_fd, p) = self.xattr_path(rel)?;
            let n = cname(name)?;
            // SAFETY: `buf` is NULL with len 0, or writable for `len` bytes; strings are valid.
            xattr_buffer(|buf, len| unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf, len) })
        })
    }

    pub fn listxattr(&self, rel: &Path) -> io::Result<Vec<OsString>> {
        self.gated(|| -> io::Result<Vec<OsString>> {
            let (_fd, p) = self.xattr_path(rel)?;
            // SAFETY: `buf` is NULL with len 0, or writable for `len` bytes.
            xattr_buffer(|buf, len| unsafe { libc::listxattr(p.as_ptr(), buf.cast(), len) })
                .map(|b| split_names(&b))
        })
    }

    pub fn setxattr(&self, rel: &Path, name: &OsStr, value: &[u8], flags: i32) -> io::Result<()> {
        self.gated(|| -> io::Result<()> {
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
        })
    }

    pub fn removexattr(&self, rel: &Path, name: &OsStr) -> io::Result<()> {
        self.gated(|| -> io::Result<()> {
            let (_fd, p) = self.xattr_path(rel)?;
            let n = cname(name)?;
            // SAFETY: valid strings.
            check(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) })
        })
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

/// The real, effective and saved user ids of the calling thread.
pub fn getresuid() -> (u32, u32, u32) {
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: three valid out-parameters; getresuid only writes them.
    unsafe { libc::getresuid(&mut r, &mut e, &mut s) };
    (r, e, s)
}

/// The real, effective and saved group ids of the calling thread.
pub fn getresgid() -> (u32, u32, u32) {
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: three valid out-parameters; getresgid only writes them.
    unsafe { libc::getresgid(&mut r, &mut e, &mut s) };
    (r, e, s)
}

/// Becomes `acct` for good: its supplementary groups, then the real, effective and saved
/// group ids, then the user ids (the group calls need root, so they come first). glibc
/// applies each call to every thread of the process. Checked afterwards: every id is the
/// user's, and neither root's user id nor root's group id can be taken back.
pub fn drop_privileges(acct: &Account) -> io::Result<()> {
    // SAFETY: plain credential calls with valid arguments (`groups` is readable for its
    // length).
    unsafe {
        check(libc::setgroups(acct.groups.len(), acct.groups.as_ptr()))?;
        check(libc::setresgid(acct.gid, acct.gid, acct.gid))?;
        check(libc::setresuid(acct.uid, acct.uid, acct.uid))?;
    }
    if getresuid() != (acct.uid, acct.uid, acct.uid)
        || getresgid() != (acct.gid, acct.gid, acct.gid)
    {
        return Err(io::Error::other(format!(
            "the ids did not all change to {}'s",
            acct.name
        )));
    }
    // -1 keeps an id as it is; only the effective id is asked back.
    let keep = u32::MAX;
    // SAFETY: credential calls that must fail; a success is reported below.
    let regained_uid = acct.uid != 0 && unsafe { libc::setresuid(keep, 0, keep) } == 0;
    // SAFETY: as above.
    let regained_gid = acct.gid != 0 && unsafe { libc::setresgid(keep, 0, keep) } == 0;
    if regained_uid || regained_gid {
        return Err(io::Error::other(format!(
            "root could be regained after becoming {}",
            acct.name
        )));
    }
    Ok(())
}

/// Forbids this process and everything it starts to gain privileges through exec
/// (setuid programs, file capabilities), for good.
pub fn set_no_new_privs() -> io::Result<()> {
    let (on, unused): (libc::c_ulong, libc::c_ulong) = (1, 0);
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes plain integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, on, unused, unused, unused) })
}

/// How many threads this process runs (from /proc).
fn thread_count() -> Option<usize> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
}

/// Kills the process group `group` (a child started in a group of its own) with SIGKILL;
/// a group that is gone already is fine.
pub fn kill_group(group: u32) {
    let Ok(pgid) = libc::pid_t::try_from(group) else {
        return;
    };
    // SAFETY: kill(2) takes plain integers; a negative pid names the group.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
}

/// The most of a child's answer [`run_as_user_within`] reads.
pub const CHILD_ANSWER_MAX: usize = 16 << 20;

/// Runs `f` in a child process that first becomes `acct` for good ([`drop_privileges`])
/// and sets no_new_privs, and returns the bytes `f` returned. The caller keeps its own
/// credentials; whatever `f` opens, runs or writes, it does as the user.
///
/// The calling process must run a single thread (a lock held by another thread at the
/// fork would stay locked in the child for ever); otherwise an error is returned.
///
/// The child gets [`USER_CHILD_LIMIT`] to answer (it works on the user's local cache
/// directory: a child the user stops, which runs as them, holds root no longer).
pub fn run_as_user(acct: &Account, f: impl FnOnce() -> Vec<u8>) -> io::Result<Vec<u8>> {
    run_as_user_within(acct, Some(USER_CHILD_LIMIT), f)
}

/// How long [`run_as_user`] waits for its child's answer.
pub const USER_CHILD_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// [`run_as_user`], waiting for the answer at most `limit`: a child that has not answered
/// by then (stuck on a filesystem the user made hang) is killed and left, and the answer
/// is a timeout error.
pub fn run_as_user_within(
    acct: &Account,
    limit: Option<std::time::Duration>,
    f: impl FnOnce() -> Vec<u8>,
) -> io::Result<Vec<u8>> {
    use std::io::Read;
    if thread_count() != Some(1) {
        return Err(io::Error::other(
            "cannot work as another user in a child process: this process runs several threads",
        ));
    }
    let (mut reader, writer) = std::io::pipe()?;
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the process has a single thread, so the child starts with every lock free
    // and may run any code; it leaves through `_exit` only.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        drop(reader);
        let code = child_as_user(acct, parent, writer, f);
        // SAFETY: ends the child at once, without the parent's exit handlers and
        // destructors running a second time.
        unsafe { libc::_exit(code) }
    }
    drop(writer);
    // The answer is read to its end (the child's exit closes the pipe) within `limit`
    // in all, and at most CHILD_ANSWER_MAX bytes of it: the child runs as the user, who
    // may stop it (SIGSTOP) or make it write more than any answer holds.
    let deadline = limit.map(|l| std::time::Instant::now() + l);
    let mut out = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    let read: io::Result<()> = loop {
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let mut pfd = libc::pollfd {
                fd: reader.as_raw_fd(),
                events: libc::POLLIN | libc::POLLHUP,
                revents: 0,
            };
            let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd for the call.
            let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
            if ready < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if ready <= 0 {
                // SAFETY: kill(2) of our own child; it is not waited for (it may not die
                // before what holds it lets go), so a stuck child costs nothing here.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the child process working as {} did not answer within {} s",
                        acct.name,
                        limit.unwrap_or_default().as_secs()
                    ),
                ));
            }
        }
        match reader.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) if out.len() + n > CHILD_ANSWER_MAX => {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                break Err(io::Error::other(format!(
                    "the child process working as {} answered more than {} MiB",
                    acct.name,
                    CHILD_ANSWER_MAX >> 20
                )));
            }
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    // Its end is waited for within the same limit (and a moment more for a child that
    // answered at the last moment), never longer: a child can answer, close the pipe and
    // still not end, when one of its threads waits in a request to a filesystem that
    // never answers it (a FUSE server the user runs, a share client that holds a request
    // for its own minutes). Such a child is killed and left; SIGKILL ends it once the
    // request comes back.
    let until = deadline
        .unwrap_or_else(|| std::time::Instant::now() + CHILD_END_WAIT)
        .max(std::time::Instant::now() + std::time::Duration::from_secs(1));
    let Some(status) = wait_child_until(pid, until)? else {
        // SAFETY: kill(2) of our own child, not waited for (see above).
        unsafe { libc::kill(pid, libc::SIGKILL) };
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the child process working as {} did not end within {} s (a request to a filesystem it used does not come back); left behind",
                acct.name,
                limit.unwrap_or(CHILD_END_WAIT).as_secs()
            ),
        ));
    };
    read?;
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        return Ok(out);
    }
    let how = if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("exit code {}", libc::WEXITSTATUS(status))
    };
    Err(io::Error::other(format!(
        "the child process working as {} ended without an answer ({how})",
        acct.name
    )))
}

fn child_as_user(
    acct: &Account,
    parent: libc::pid_t,
    mut out: std::io::PipeWriter,
    f: impl FnOnce() -> Vec<u8>,
) -> i32 {
    use std::io::Write;
    if let Err(e) = drop_privileges(acct).and_then(|()| set_no_new_privs()) {
        write_fd_lossy(
            2,
            format!("ccfs: cannot become {} for good: {e}\n", acct.name).as_bytes(),
        );
        return 125;
    }
    // The work dies with the process that asked for it (a killed `ccfs recover` leaves no
    // recovery running on): set after the change of ids, which clears it.
    // SAFETY: prctl and getppid have no memory preconditions.
    let dies_with_parent = unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) == 0
            && libc::getppid() == parent
    };
    if !dies_with_parent {
        return 123;
    }
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(bytes) => match out.write_all(&bytes) {
            Ok(()) => 0,
            Err(_) => 124,
        },
        Err(_) => 126,
    }
}

/// How long [`run_as_user_within`] without a limit waits for its child to end after the
/// child closed its answer.
const CHILD_END_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits for child `pid` to end until `until`: its status, or None if it has not ended.
fn wait_child_until(
    pid: libc::pid_t,
    until: std::time::Instant,
) -> io::Result<Option<libc::c_int>> {
    loop {
        let mut status = 0;
        // SAFETY: looks at our own child; `status` is a valid out-parameter.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Ok(Some(status));
        }
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if std::time::Instant::now() >= until {
            return Ok(None);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
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

// ---- walking a path one directory at a time -----------------------------------------

/// An open directory, for walking a path one component at a time: each step is taken
/// relative to the directory before and never through a symlink, so what a step finds
/// is what the caller checked, whoever renames things meanwhile.
#[derive(Debug)]
pub struct DirFd(OwnedFd);

impl AsRawFd for DirFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A single path component as a C string (no `/`, not empty, not `.` or `..`).
fn component(name: &OsStr) -> io::Result<CString> {
    let b = name.as_bytes();
    if b.is_empty() || b.contains(&b'/') || b == b"." || b == b".." {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    cname(name)
}

impl DirFd {
    /// Opens a directory by path. Symlinks in `path` are followed: use it for `/` or for
    /// a path nobody but the caller can change.
    pub fn open(path: &Path) -> io::Result<Self> {
        let c = cstr(path)?;
        // SAFETY: `c` is a valid NUL-terminated path; the descriptor is owned below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        check(fd)?;
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub fn stat(&self) -> io::Result<Stat> {
        fstat(&self.0)
    }

    /// The entry `name` itself (a symlink is not followed); `Ok(None)` if there is none.
    pub fn entry(&self, name: &OsStr) -> io::Result<Option<Stat>> {
        let n = component(name)?;
        // SAFETY: `st` is a valid out-parameter; the descriptor and name are valid.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let r = check(unsafe {
            libc::fstatat(
                self.0.as_raw_fd(),
                n.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        });
        match r {
            Ok(()) => Ok(Some(Stat(st))),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens the subdirectory `name`; a symlink there fails (ELOOP or ENOTDIR) instead of
    /// being followed.
    pub fn open_dir(&self, name: &OsStr) -> io::Result<DirFd> {
        let n = component(name)?;
        // SAFETY: valid descriptor and NUL-terminated name; the result is owned below.
        let fd = unsafe {
            libc::openat(
                self.0.as_raw_fd(),
                n.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        check(fd)?;
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(DirFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub fn mkdir(&self, name: &OsStr, mode: u32) -> io::Result<()> {
        let n = component(name)?;
        // SAFETY: valid descriptor and NUL-terminated name.
        check(unsafe { libc::mkdirat(self.0.as_raw_fd(), n.as_ptr(), mode as libc::mode_t) })
    }

    /// Where the symlink `name` points.
    pub fn readlink(&self, name: &OsStr) -> io::Result<std::path::PathBuf> {
        let n = component(name)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: `buf` is writable for its length; descriptor and name are valid.
        let len = check_size(unsafe {
            libc::readlinkat(
                self.0.as_raw_fd(),
                n.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        })?;
        buf.truncate(len);
        Ok(std::path::PathBuf::from(OsString::from_vec(buf)))
    }

    /// Opens (with O_CREAT: creates) the file `name` in this directory; a symlink there
    /// fails with ELOOP instead of being followed. `flags` are open(2) flags.
    pub fn open_file(&self, name: &OsStr, flags: i32, mode: u32) -> io::Result<File> {
        let n = component(name)?;
        // SAFETY: valid descriptor and NUL-terminated name; the mode argument is read
        // only with O_CREAT; the result is owned below.
        let fd = unsafe {
            libc::openat(
                self.0.as_raw_fd(),
                n.as_ptr(),
                flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        check(fd)?;
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Removes the entry `name` (not a directory; a symlink itself, not what it points to).
    pub fn unlink(&self, name: &OsStr) -> io::Result<()> {
        let n = component(name)?;
        // SAFETY: valid descriptor and NUL-terminated name.
        check(unsafe { libc::unlinkat(self.0.as_raw_fd(), n.as_ptr(), 0) })
    }

    /// fchown of the directory itself (`None` keeps the group).
    pub fn chown(&self, uid: u32, gid: Option<u32>) -> io::Result<()> {
        // SAFETY: fchown on a descriptor we hold; u32::MAX (-1) keeps the group.
        check(unsafe { libc::fchown(self.0.as_raw_fd(), uid, gid.unwrap_or(u32::MAX)) })
    }

    /// fchmod of the directory itself.
    pub fn chmod(&self, mode: u32) -> io::Result<()> {
        // SAFETY: fchmod on a descriptor we hold.
        check(unsafe { libc::fchmod(self.0.as_raw_fd(), mode as libc::mode_t) })
    }
}

// ---- FUSE mount for a user -------------------------------------------------------------

/// A FUSE mount in the kernel's terms (what mount(2) takes besides `fd`, `rootmode`,
/// `user_id` and `group_id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuseMount {
    /// The source shown in the mount table (`fsname`).
    pub source: String,
    /// `fuse` or `fuse.SUBTYPE`.
    pub fstype: String,
    /// MS_* flags.
    pub flags: u64,
    /// Comma-separated kernel options (`default_permissions,allow_other`...).
    pub options: String,
}

/// Mounts a FUSE filesystem at `mountpoint` (absolute) that belongs to `uid`/`gid` (the
/// kernel's `user_id`/`group_id`: that user may unmount it with `fusermount3 -u`) and
/// returns its /dev/fuse channel, not yet initialised: requests wait until a session
/// answers the kernel's INIT. Needs CAP_SYS_ADMIN. The mount point is opened without
/// following any symlink and the mount is made on that very directory.
pub fn mount_fuse(mountpoint: &Path, m: &FuseMount, uid: u32, gid: u32) -> io::Result<OwnedFd> {
    if !mountpoint.is_absolute() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let dev_path = CString::from(c"/dev/fuse");
    // SAFETY: a valid NUL-terminated path; the descriptor is owned below.
    let dev = unsafe { libc::open(dev_path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    check(dev)?;
    // SAFETY: a fresh descriptor that nothing else owns.
    let dev = unsafe { OwnedFd::from_raw_fd(dev) };
    let c = cstr(mountpoint)?;
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_NO_SYMLINKS,
    };
    let at = loop {
        // SAFETY: `how` is a valid open_how of the size passed; `c` is NUL-terminated.
        let r = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                libc::AT_FDCWD as libc::c_long,
                c.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if r >= 0 {
            // SAFETY: a fresh descriptor that nothing else owns.
            break unsafe { OwnedFd::from_raw_fd(r as RawFd) };
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(e);
        }
    };
    let mode = fstat(&at)?.mode();
    let mut data = format!(
        "fd={},rootmode={mode:o},user_id={uid},group_id={gid}",
        dev.as_raw_fd()
    );
    if !m.options.is_empty() {
        data.push(',');
        data.push_str(&m.options);
    }
    let invalid = |_| io::Error::from_raw_os_error(libc::EINVAL);
    let source = CString::new(m.source.as_str()).map_err(invalid)?;
    let fstype = CString::new(m.fstype.as_str()).map_err(invalid)?;
    let data = CString::new(data).map_err(invalid)?;
    let target = proc_fd(at.as_raw_fd());
    // SAFETY: every string is NUL-terminated and lives across the call; `target` names
    // the directory we hold open.
    check(unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            m.flags as libc::c_ulong,
            data.as_ptr().cast(),
        )
    })?;
    Ok(dev)
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
    let mut pair = [0; 2];
    // SAFETY: socketpair writes two descriptors into a valid array of two.
    check(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            pair.as_mut_ptr(),
        )
    })?;
    // SAFETY: socketpair succeeded: both descriptors are open and ours.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
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
    let wait = libc::timeval {
        tv_sec: 1,
        tv_usec: 0,
    };
    // SAFETY: setsockopt reads a timeval from a valid pointer of the size given.
    check(unsafe {
        libc::setsockopt(
            ours.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&wait as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    })?;
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
    let mut iov = libc::iovec {
        iov_base: msg.as_mut_ptr().cast(),
        iov_len: msg.len(),
    };
    let mut control = [0u64; 4];
    // SAFETY: a zeroed msghdr is valid; every pointer set below points to a live local
    // for the duration of sendmsg, and the control buffer is large enough for one fd.
    unsafe {
        let mut hdr: libc::msghdr = std::mem::zeroed();
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        if let Some(f) = file {
            hdr.msg_control = control.as_mut_ptr().cast();
            hdr.msg_controllen = libc::CMSG_SPACE(4) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&hdr);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(4) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>(), f.as_raw_fd());
        }
        loop {
            let n = libc::sendmsg(sock.as_raw_fd(), &hdr, libc::MSG_NOSIGNAL);
            if n == msg.len() as isize {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if n < 0 && e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(if n < 0 {
                e
            } else {
                io::Error::from_raw_os_error(libc::EIO)
            });
        }
    }
}

/// The broker's answer to an open request: the backing id.
pub fn broker_answer(sock: BorrowedFd<'_>) -> io::Result<u32> {
    let mut buf = [0u8; 8];
    loop {
        // SAFETY: recv writes at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n == 8 {
            break;
        }
        let e = io::Error::last_os_error();
        if n < 0 && e.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return Err(if n < 0 {
            e
        } else {
            io::Error::from_raw_os_error(libc::EPIPE)
        });
    }
    let v = i64::from_le_bytes(buf);
    if v < 0 {
        Err(io::Error::from_raw_os_error((-v) as i32))
    } else {
        Ok(v as u32)
    }
}

/// The per-mount restrictions of the mount `path` is on, as mount(2) flags: read-only,
/// noexec, nosymfollow (what a mount over it must keep, so the home is no way around them).
pub fn restrictions_of(path: &Path) -> io::Result<u64> {
    let c = cstr(path)?;
    // SAFETY: a zeroed statvfs is a valid out-parameter; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    check(unsafe { libc::statvfs(c.as_ptr(), &mut st) })?;
    /// ST_NOSYMFOLLOW (Linux 5.10).
    const ST_NOSYMFOLLOW: u64 = 0x2000;
    let mut flags = 0;
    if st.f_flag & libc::ST_RDONLY != 0 {
        flags |= libc::MS_RDONLY;
    }
    if st.f_flag & libc::ST_NOEXEC != 0 {
        flags |= libc::MS_NOEXEC;
    }
    if st.f_flag & ST_NOSYMFOLLOW != 0 {
        flags |= libc::MS_NOSYMFOLLOW;
    }
    Ok(flags)
}

/// Sets every user and group id to root's (from an effective root with another real id).
/// Never fails: a process that cannot is root's already or not root at all.
pub fn become_root_alone() {
    // SAFETY: setresgid/setresuid with plain ids have no memory preconditions.
    unsafe {
        libc::setresgid(0, 0, 0);
        libc::setresuid(0, 0, 0);
    }
}

// ---- syslog and bind mounts (the PAM session hook) -----------------------------------

/// Logs one line to syslog as `ccfs-session` (facility authpriv). Never fails; without a
/// syslog daemon the line is lost (the hook writes it to standard error too).
pub fn syslog(priority: libc::c_int, line: &str) {
    static OPENED: std::sync::Once = std::sync::Once::new();
    OPENED.call_once(|| {
        // SAFETY: the ident is a static C string, as openlog(3) keeps the pointer.
        unsafe { libc::openlog(c"ccfs-session".as_ptr(), libc::LOG_PID, libc::LOG_AUTHPRIV) };
    });
    let Ok(text) = CString::new(line.replace('\0', " ")) else {
        return;
    };
    // SAFETY: a constant "%s" format with one valid C string argument.
    unsafe { libc::syslog(priority | libc::LOG_AUTHPRIV, c"%s".as_ptr(), text.as_ptr()) };
}

/// Opens `dir/name` as an O_PATH directory descriptor, never through a symlink at `name`.
fn open_path_dir(dir: &Path, name: &OsStr) -> io::Result<OwnedFd> {
    let d = cstr(dir)?;
    // SAFETY: a valid NUL-terminated path; the descriptor is owned below.
    let parent = unsafe {
        libc::open(
            d.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    check(parent)?;
    // SAFETY: a fresh descriptor that nothing else owns.
    let parent = unsafe { OwnedFd::from_raw_fd(parent) };
    let n = component(name)?;
    // SAFETY: valid descriptor and name; the result is owned below.
    let fd = unsafe {
        libc::openat(
            parent.as_raw_fd(),
            n.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    check(fd)?;
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Bind-mounts the directory `src_dir/name` at `dst_dir/name` (root), nosuid and nodev,
/// keeping the source mount's own restrictions (read-only, noexec, nosymfollow). Both are
/// opened first without following a symlink at `name`, the source is checked to belong to
/// `owner`, and the mount is made through the open descriptors: a name swapped after the
/// check cannot redirect it. The bind is a clone of the source's mount, given nosuid and
/// nodev before it is attached (open_tree, mount_setattr, move_mount), so it is never
/// visible without them.
pub fn bind_mount_dir(src_dir: &Path, dst_dir: &Path, name: &OsStr, owner: u32) -> io::Result<()> {
    let src = open_path_dir(src_dir, name)?;
    let dst = open_path_dir(dst_dir, name)?;
    let st = fstat(&src)?;
    if st.uid() != owner {
        return Err(io::Error::other(format!(
            "it belongs to uid {}, not {owner}",
            st.uid()
        )));
    }
    let empty = c"";
    // SAFETY: open_tree(2) on a valid descriptor with an empty path; the result is a new
    // descriptor owned below.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            src.as_raw_fd(),
            empty.as_ptr(),
            libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as libc::c_uint,
        )
    };
    if tree < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as RawFd) };
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr(2) on the detached tree, with a valid mount_attr and its size.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: move_mount(2) from the tree's descriptor onto the destination's, both valid,
    // empty paths.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            dst.as_raw_fd(),
            empty.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
