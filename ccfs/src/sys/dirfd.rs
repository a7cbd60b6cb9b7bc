//! Walking a path one directory at a time, as its owner and through no symlink.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use super::*;

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
pub(super) fn component(name: &OsStr) -> io::Result<CString> {
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
