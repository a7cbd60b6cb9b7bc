//! Mounts: the kernel FUSE mount made for a user, and the restrictions of the mount a path
//! is on.

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use super::*;

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
