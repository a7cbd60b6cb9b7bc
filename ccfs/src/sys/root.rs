//! Confined access below a root directory: every path resolved with openat2, beneath the
//! root, through no symlink.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

use super::*;

// ---- confined access below a root directory -------------------------------------------

/// The attributes of a file (from `fstatat`), without following a final symlink.
#[derive(Clone, Copy)]
pub struct Stat(pub(super) libc::stat);

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
pub(super) struct OpenHow {
    pub(super) flags: u64,
    pub(super) mode: u64,
    pub(super) resolve: u64,
}

pub(super) fn proc_fd(fd: RawFd) -> CString {
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
    /// (bytes free to an unprivileged user, bytes in all) of the filesystem it is on.
    pub fn space(&self) -> io::Result<(u64, u64)> {
        // SAFETY: a zeroed statvfs is a valid out-parameter; the fd is ours and open.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        check(unsafe { libc::fstatvfs(self.fd.as_raw_fd(), &mut st) })?;
        let unit = st.f_frsize;
        Ok((
            st.f_bavail.saturating_mul(unit),
            st.f_blocks.saturating_mul(unit),
        ))
    }

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

    /// lstat below the root; `Ok(None)` when it does not exist (nor does a path through a
    /// file or a symbolic link, which is never followed).
    pub fn stat(&self, rel: &Path) -> io::Result<Option<Stat>> {
        match self.stat_through(rel) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR) | Some(libc::ELOOP)) => {
                Ok(None)
            }
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

    /// The directory `rel` held open for looks at its entries ([`Root::stat_entry`]).
    pub fn dir_at(&self, rel: &Path) -> DirAt {
        DirAt {
            fd: self.open_fd(rel, libc::O_PATH | libc::O_DIRECTORY, 0),
            rel: rel.to_path_buf(),
        }
    }

    /// [`Root::stat`] of the entry `name` of `dir`.
    pub fn stat_entry(&self, dir: &DirAt, name: &OsStr) -> io::Result<Option<Stat>> {
        match self.stat_entry_through(dir, name) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR) | Some(libc::ELOOP)) => {
                Ok(None)
            }
            r => r,
        }
    }

    /// [`Root::stat_through`] of the entry `name` of `dir`: one call within the directory
    /// held open. Where it could not be opened, the path is looked at as
    /// [`Root::stat_through`] does (and fails as it fails).
    pub fn stat_entry_through(&self, dir: &DirAt, name: &OsStr) -> io::Result<Option<Stat>> {
        let one_name =
            !matches!(name.as_bytes(), b"" | b"." | b"..") && !name.as_bytes().contains(&b'/');
        let (Ok(fd), true) = (&dir.fd, one_name) else {
            return self.stat_through(&dir.rel.join(name));
        };
        self.gated(|| -> io::Result<Option<Stat>> {
            let name = cname(name)?;
            // SAFETY: `st` is a valid out-parameter; `fd` and `name` are valid.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let rc = unsafe {
                libc::fstatat(
                    fd.as_raw_fd(),
                    name.as_ptr(),
                    &mut st,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            match check(rc) {
                Ok(()) => Ok(Some(Stat(st))),
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

/// A directory below a [`Root`] held open (`O_PATH`) for looks at its entries
/// ([`Root::dir_at`]), or why it could not be opened.
#[derive(Debug)]
pub struct DirAt {
    fd: io::Result<OwnedFd>,
    rel: std::path::PathBuf,
}
