//! For the PAM session hook: syslog and bind mounts.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use super::*;

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
