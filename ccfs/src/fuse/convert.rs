//! Conversions between the overlay's values and fuser's: attributes, times, errors (every
//! one through [`reply_err`]), the caller, open flags.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuse_ring::reply as rep;
use fuse_ring::Caller;
use fuser::{Errno, FileAttr, FileType, FopenFlags, INodeNo, TimeOrNow};

use crate::backing::IoMode;
use crate::error::FsError;
use crate::overlay::Ctx;
use crate::sys::{SetTime, Stat};

/// The open flags that tell the kernel how to do a handle's I/O. `flush`: the kernel
/// tells the daemon of every close (FLUSH), which hands it to the share (a file of the
/// share opened for writing); otherwise ccfs has nothing to do at close.
pub(super) fn fopen_flags(mode: IoMode, flush: bool) -> FopenFlags {
    let mut f = if flush {
        FopenFlags::empty()
    } else {
        FopenFlags::FOPEN_NOFLUSH
    };
    match mode {
        IoMode::Passthrough(_) => {}
        IoMode::Cached { keep_cache: true } => f |= FopenFlags::FOPEN_KEEP_CACHE,
        IoMode::Cached { keep_cache: false } => {}
    }
    f
}

/// Whether an open's flags let it write.
pub(super) fn writable(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY
}

pub(super) fn reply_err(op: &'static str, path: &Path, e: &FsError) -> Errno {
    let n = e.errno();
    let path = crate::journal::escape(path);
    if matches!(
        n,
        libc::ENOENT
            | libc::EEXIST
            | libc::ENOTEMPTY
            | libc::ENODATA
            | libc::EXDEV
            | libc::ENAMETOOLONG
    ) {
        tracing::trace!(op, path, "{e}");
    } else {
        tracing::warn!(op, path, errno = n, "{e}");
    }
    Errno::from_i32(n)
}

/// An xattr value or list: its size when asked with size 0, ERANGE when it does not fit.
pub(super) fn reply_xattr(reply: impl rep::Xattr, size: u32, data: &[u8]) {
    if size == 0 {
        reply.size(data.len() as u32);
    } else if data.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(data);
    }
}

pub(super) fn file_type(kind: u32) -> FileType {
    match kind {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

pub(super) fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nsecs as u64)
    }
}

pub(super) fn attr(ino: u64, m: &Stat) -> FileAttr {
    let t = |(s, n): (i64, i64)| time(s, n);
    FileAttr {
        ino: INodeNo(ino),
        size: m.len(),
        blocks: m.blocks(),
        atime: t(m.atime()),
        mtime: t(m.mtime()),
        ctime: t(m.ctime()),
        crtime: t(m.ctime()),
        kind: file_type(m.file_type()),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: m.blksize() as u32,
        flags: 0,
    }
}

/// The attributes of a negative entry (node 0): the kernel reads none of them.
pub(super) fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

pub(super) fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(st) => match st.duration_since(UNIX_EPOCH) {
            Ok(d) => SetTime::At {
                secs: d.as_secs() as i64,
                nsecs: i64::from(d.subsec_nanos()),
            },
            Err(e) => {
                let d = e.duration();
                let mut secs = -(d.as_secs() as i64);
                let mut nsecs = i64::from(d.subsec_nanos());
                if nsecs > 0 {
                    secs -= 1;
                    nsecs = 1_000_000_000 - nsecs;
                }
                SetTime::At { secs, nsecs }
            }
        },
    }
}

pub(super) fn ctx(req: &Caller, umask: u32) -> Ctx {
    Ctx {
        uid: req.uid,
        gid: req.gid,
        umask,
    }
}
