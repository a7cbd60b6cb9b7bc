//! Decoding of one ring request: the `fuse_in_header` from `in_out`, the per-opcode
//! header from `op_in`, and names and data from the payload.
//!
//! Every length comes from the kernel and is checked; a malformed request decodes to an
//! errno for the reply, never to a panic or an out-of-bounds read.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileHandle, INodeNo, LockOwner, OpenFlags, RenameFlags,
    TimeOrNow, WriteFlags,
};

use crate::abi::{self, Reader};

/// The fields of `struct fuse_in_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub total_extlen: u16,
}

impl InHeader {
    /// Reads the header from the start of `in_out`.
    pub fn parse(in_out: &[u8]) -> Option<InHeader> {
        let mut r = Reader::new(in_out);
        Some(InHeader {
            len: r.u32()?,
            opcode: r.u32()?,
            unique: r.u64()?,
            nodeid: r.u64()?,
            uid: r.u32()?,
            gid: r.u32()?,
            pid: r.u32()?,
            total_extlen: {
                let ext = r.u16()?;
                r.u16()?;
                ext
            },
        })
    }
}

/// The optional fields of a SETATTR, decoded from `valid` the way fuser decodes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
    pub ctime: Option<SystemTime>,
    pub fh: Option<FileHandle>,
}

/// One decoded operation, with the parameters fuser passes for it.
#[derive(Debug, PartialEq, Eq)]
pub enum Op<'a> {
    Lookup {
        name: &'a OsStr,
    },
    GetAttr {
        fh: Option<FileHandle>,
    },
    SetAttr(SetAttr),
    ReadLink,
    SymLink {
        name: &'a OsStr,
        target: &'a Path,
    },
    MkNod {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    },
    MkDir {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
    },
    Unlink {
        name: &'a OsStr,
    },
    RmDir {
        name: &'a OsStr,
    },
    Rename {
        name: &'a OsStr,
        newparent: INodeNo,
        newname: &'a OsStr,
        flags: RenameFlags,
    },
    Link {
        ino: INodeNo,
        newname: &'a OsStr,
    },
    Open {
        flags: OpenFlags,
    },
    Read {
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
    },
    Write {
        fh: FileHandle,
        offset: u64,
        data: &'a [u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
    },
    StatFs,
    Release {
        fh: FileHandle,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        flush: bool,
    },
    FSync {
        fh: FileHandle,
        datasync: bool,
    },
    SetXAttr {
        name: &'a OsStr,
        value: &'a [u8],
        flags: i32,
        position: u32,
    },
    GetXAttr {
        name: &'a OsStr,
        size: u32,
    },
    ListXAttr {
        size: u32,
    },
    RemoveXAttr {
        name: &'a OsStr,
    },
    Flush {
        fh: FileHandle,
        lock_owner: LockOwner,
    },
    OpenDir {
        flags: OpenFlags,
    },
    ReadDir {
        fh: FileHandle,
        offset: u64,
        size: u32,
    },
    ReadDirPlus {
        fh: FileHandle,
        offset: u64,
        size: u32,
    },
    ReleaseDir {
        fh: FileHandle,
        flags: OpenFlags,
    },
    FSyncDir {
        fh: FileHandle,
        datasync: bool,
    },
    Access {
        mask: AccessFlags,
    },
    Create {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    },
    FAllocate {
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
    },
    Lseek {
        fh: FileHandle,
        offset: i64,
        whence: i32,
    },
    CopyFileRange {
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
    },
    Destroy,
    /// An opcode this crate does not serve; it is answered with ENOSYS.
    Unsupported(u32),
}

/// A decoded request.
#[derive(Debug, PartialEq, Eq)]
pub struct Request<'a> {
    pub header: InHeader,
    pub op: Op<'a>,
}

fn name(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

fn off_t(v: u64) -> Result<u64, Errno> {
    if v > i64::MAX as u64 {
        Err(Errno::EINVAL)
    } else {
        Ok(v)
    }
}

fn time(secs: u64, nsecs: u32) -> SystemTime {
    let secs = secs as i64;
    let nsecs = nsecs.min(999_999_999);
    if secs >= 0 {
        UNIX_EPOCH
            .checked_add(Duration::new(secs as u64, nsecs))
            .unwrap_or(UNIX_EPOCH)
    } else {
        let back = Duration::new(secs.unsigned_abs(), 0);
        UNIX_EPOCH
            .checked_sub(back)
            .and_then(|t| t.checked_add(Duration::new(0, nsecs)))
            .unwrap_or(UNIX_EPOCH)
    }
}

/// Decodes one request. `op_in` holds exactly the per-opcode header the kernel copied,
/// `payload` exactly the `payload_sz` bytes after it.
pub fn decode<'a>(
    header: InHeader,
    op_in: &'a [u8],
    payload: &'a [u8],
) -> Result<Request<'a>, Errno> {
    let op = decode_op(header, op_in, payload).ok_or(Errno::EINVAL)??;
    Ok(Request { header, op })
}

/// Splits the kernel's `len` into the per-opcode header length, given the payload size.
pub fn op_in_len(header: &InHeader, payload_sz: usize) -> Option<usize> {
    let total = usize::try_from(header.len).ok()?;
    let rest = total
        .checked_sub(abi::IN_HEADER_LEN)?
        .checked_sub(payload_sz)?;
    (rest <= abi::RING_OP_IN_LEN).then_some(rest)
}

fn decode_op<'a>(h: InHeader, op_in: &'a [u8], payload: &'a [u8]) -> Option<Result<Op<'a>, Errno>> {
    use abi::*;
    let mut a = Reader::new(op_in);
    let mut p = Reader::new(payload);
    let op = match h.opcode {
        FUSE_LOOKUP => Op::Lookup {
            name: name(p.cstr()?),
        },
        FUSE_GETATTR => {
            let flags = a.u32()?;
            a.u32()?;
            let fh = a.u64()?;
            Op::GetAttr {
                fh: (flags & GETATTR_FH != 0).then_some(FileHandle(fh)),
            }
        }
        FUSE_SETATTR => Op::SetAttr(setattr(&mut a)?),
        FUSE_READLINK => Op::ReadLink,
        FUSE_SYMLINK => {
            let n = name(p.cstr()?);
            Op::SymLink {
                name: n,
                target: Path::new(name(p.cstr()?)),
            }
        }
        FUSE_MKNOD => {
            let (mode, rdev, umask) = (a.u32()?, a.u32()?, a.u32()?);
            Op::MkNod {
                name: name(p.cstr()?),
                mode,
                umask,
                rdev,
            }
        }
        FUSE_MKDIR => {
            let (mode, umask) = (a.u32()?, a.u32()?);
            Op::MkDir {
                name: name(p.cstr()?),
                mode,
                umask,
            }
        }
        FUSE_UNLINK => Op::Unlink {
            name: name(p.cstr()?),
        },
        FUSE_RMDIR => Op::RmDir {
            name: name(p.cstr()?),
        },
        FUSE_RENAME | FUSE_RENAME2 => {
            let newparent = INodeNo(a.u64()?);
            let flags = if h.opcode == FUSE_RENAME2 {
                a.u32()?
            } else {
                0
            };
            let (old, new) = (name(p.cstr()?), name(p.cstr()?));
            let flags = RenameFlags::from_bits_retain(flags);
            Op::Rename {
                name: old,
                newparent,
                newname: new,
                flags,
            }
        }
        FUSE_LINK => Op::Link {
            ino: INodeNo(a.u64()?),
            newname: name(p.cstr()?),
        },
        FUSE_OPEN | FUSE_OPENDIR => {
            let flags = OpenFlags(a.i32()?);
            if h.opcode == FUSE_OPEN {
                Op::Open { flags }
            } else {
                Op::OpenDir { flags }
            }
        }
        FUSE_READ | FUSE_READDIR | FUSE_READDIRPLUS => return read_like(h.opcode, &mut a),
        FUSE_WRITE => return write(&mut a, payload),
        _ => return decode_file_op(h, &mut a, &mut p),
    };
    Some(Ok(op))
}

/// The rest of [`decode_op`]: statfs, handles, extended attributes, access, create and
/// the ranges of open files.
fn decode_file_op<'a>(
    h: InHeader,
    a: &mut Reader<'a>,
    p: &mut Reader<'a>,
) -> Option<Result<Op<'a>, Errno>> {
    use abi::*;
    let op = match h.opcode {
        FUSE_STATFS => Op::StatFs,
        FUSE_RELEASE | FUSE_RELEASEDIR => {
            let (fh, flags, rflags, owner) = (
                FileHandle(a.u64()?),
                OpenFlags(a.i32()?),
                a.u32()?,
                a.u64()?,
            );
            if h.opcode == FUSE_RELEASEDIR {
                Op::ReleaseDir { fh, flags }
            } else {
                let lock_owner = (rflags & RELEASE_FLOCK_UNLOCK != 0).then_some(LockOwner(owner));
                Op::Release {
                    fh,
                    flags,
                    lock_owner,
                    flush: rflags & RELEASE_FLUSH != 0,
                }
            }
        }
        FUSE_FSYNC | FUSE_FSYNCDIR => {
            let (fh, datasync) = (FileHandle(a.u64()?), a.u32()? & FSYNC_FDATASYNC != 0);
            if h.opcode == FUSE_FSYNC {
                Op::FSync { fh, datasync }
            } else {
                Op::FSyncDir { fh, datasync }
            }
        }
        FUSE_SETXATTR => {
            // 8 bytes (size, flags) or, with FUSE_SETXATTR_EXT, 16.
            let (size, flags) = (a.u32()?, a.i32()?);
            let n = name(p.cstr()?);
            let value = p.take(usize::try_from(size).ok()?)?;
            Op::SetXAttr {
                name: n,
                value,
                flags,
                position: 0,
            }
        }
        FUSE_GETXATTR => {
            let size = a.u32()?;
            Op::GetXAttr {
                name: name(p.cstr()?),
                size,
            }
        }
        FUSE_LISTXATTR => Op::ListXAttr { size: a.u32()? },
        FUSE_REMOVEXATTR => Op::RemoveXAttr {
            name: name(p.cstr()?),
        },
        FUSE_FLUSH => {
            let fh = FileHandle(a.u64()?);
            a.u64()?;
            Op::Flush {
                fh,
                lock_owner: LockOwner(a.u64()?),
            }
        }
        FUSE_ACCESS => Op::Access {
            mask: AccessFlags::from_bits_retain(a.i32()?),
        },
        FUSE_CREATE => {
            let (flags, mode, umask) = (a.i32()?, a.u32()?, a.u32()?);
            Op::Create {
                name: name(p.cstr()?),
                mode,
                umask,
                flags,
            }
        }
        FUSE_FALLOCATE => {
            let fh = FileHandle(a.u64()?);
            let (offset, length, mode) = (a.u64()?, a.u64()?, a.i32()?);
            return Some(match (off_t(offset), off_t(length)) {
                (Ok(offset), Ok(length)) => Ok(Op::FAllocate {
                    fh,
                    offset,
                    length,
                    mode,
                }),
                _ => Err(Errno::EINVAL),
            });
        }
        FUSE_LSEEK => {
            let (fh, offset, whence) = (FileHandle(a.u64()?), a.u64()? as i64, a.i32()?);
            Op::Lseek { fh, offset, whence }
        }
        FUSE_COPY_FILE_RANGE => return copy_file_range(a),
        FUSE_DESTROY => Op::Destroy,
        other => Op::Unsupported(other),
    };
    Some(Ok(op))
}

fn setattr(a: &mut Reader<'_>) -> Option<SetAttr> {
    use abi::*;
    let valid = a.u32()?;
    a.u32()?;
    let fh = a.u64()?;
    let size = a.u64()?;
    let _lock_owner = a.u64()?;
    let (atime, mtime, ctime) = (a.u64()?, a.u64()?, a.u64()?);
    let (atimensec, mtimensec, ctimensec) = (a.u32()?, a.u32()?, a.u32()?);
    let mode = a.u32()?;
    a.u32()?;
    let (uid, gid) = (a.u32()?, a.u32()?);
    let has = |bit: u32| valid & bit != 0;
    let time_or_now = |set: u32, now: u32, secs: u64, nsecs: u32| {
        has(set).then(|| {
            if has(now) {
                TimeOrNow::Now
            } else {
                TimeOrNow::SpecificTime(time(secs, nsecs))
            }
        })
    };
    Some(SetAttr {
        mode: has(FATTR_MODE).then_some(mode),
        uid: has(FATTR_UID).then_some(uid),
        gid: has(FATTR_GID).then_some(gid),
        size: has(FATTR_SIZE).then_some(size),
        atime: time_or_now(FATTR_ATIME, FATTR_ATIME_NOW, atime, atimensec),
        mtime: time_or_now(FATTR_MTIME, FATTR_MTIME_NOW, mtime, mtimensec),
        ctime: has(FATTR_CTIME).then(|| time(ctime, ctimensec)),
        fh: has(FATTR_FH).then_some(FileHandle(fh)),
    })
}

fn read_like<'a>(opcode: u32, a: &mut Reader<'_>) -> Option<Result<Op<'a>, Errno>> {
    let fh = FileHandle(a.u64()?);
    let offset = a.u64()?;
    let size = a.u32()?;
    let read_flags = a.u32()?;
    let owner = a.u64()?;
    let flags = OpenFlags(a.i32()?);
    Some(match opcode {
        abi::FUSE_READDIR => Ok(Op::ReadDir { fh, offset, size }),
        abi::FUSE_READDIRPLUS => Ok(Op::ReadDirPlus { fh, offset, size }),
        _ => off_t(offset).map(|offset| {
            let lock_owner = (read_flags & abi::READ_LOCKOWNER != 0).then_some(LockOwner(owner));
            Op::Read {
                fh,
                offset,
                size,
                flags,
                lock_owner,
            }
        }),
    })
}

fn write<'a>(a: &mut Reader<'_>, payload: &'a [u8]) -> Option<Result<Op<'a>, Errno>> {
    let fh = FileHandle(a.u64()?);
    let offset = a.u64()?;
    let size = usize::try_from(a.u32()?).ok()?;
    let wflags = a.u32()?;
    let owner = a.u64()?;
    let flags = OpenFlags(a.i32()?);
    let data = payload.get(..size)?;
    Some(off_t(offset).map(|offset| Op::Write {
        fh,
        offset,
        data,
        write_flags: WriteFlags::from_bits_retain(wflags),
        flags,
        lock_owner: (wflags & abi::WRITE_LOCKOWNER != 0).then_some(LockOwner(owner)),
    }))
}

fn copy_file_range<'a>(a: &mut Reader<'_>) -> Option<Result<Op<'a>, Errno>> {
    let fh_in = FileHandle(a.u64()?);
    let off_in = a.u64()?;
    let ino_out = INodeNo(a.u64()?);
    let fh_out = FileHandle(a.u64()?);
    let off_out = a.u64()?;
    let len = a.u64()?;
    let flags = CopyFileRangeFlags::from_bits_retain(a.u64()?);
    Some(match (off_t(off_in), off_t(off_out)) {
        (Ok(offset_in), Ok(offset_out)) => Ok(Op::CopyFileRange {
            fh_in,
            offset_in,
            ino_out,
            fh_out,
            offset_out,
            len,
            flags,
        }),
        _ => Err(Errno::EINVAL),
    })
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
