//! The filesystem trait of the ring transport and the dispatch of decoded requests to it.

use std::ffi::OsStr;
use std::path::Path;
use std::time::SystemTime;

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, INodeNo, LockOwner,
    OpenFlags, RenameFlags, TimeOrNow, WriteFlags,
};

use crate::decode::{Op, Request};
use crate::reply::Error as _;
use crate::{Caller, RingReply};

/// A filesystem served over the ring. The methods have fuser 0.18's parameter lists, with
/// [`Caller`] for `&fuser::Request` and [`RingReply`] for the reply; each defaults to ENOSYS.
///
/// FORGET, BATCH_FORGET and INTERRUPT never travel over the ring: the kernel sends them on
/// `/dev/fuse`, where fuser's session delivers them to its `Filesystem`.
#[allow(unused_variables, clippy::too_many_arguments)]
pub trait RingFilesystem: Send + Sync + 'static {
    fn lookup(&self, req: &Caller, parent: INodeNo, name: &OsStr, reply: RingReply) {
        reply.error(Errno::ENOSYS);
    }
    fn getattr(&self, req: &Caller, ino: INodeNo, fh: Option<FileHandle>, reply: RingReply) {
        reply.error(Errno::ENOSYS);
    }
    fn setattr(
        &self,
        req: &Caller,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        crtime: Option<SystemTime>,
        chgtime: Option<SystemTime>,
        bkuptime: Option<SystemTime>,
        flags: Option<BsdFileFlags>,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn readlink(&self, req: &Caller, ino: INodeNo, reply: RingReply) {
        reply.error(Errno::ENOSYS);
    }
    fn mknod(
        &self,
        req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn mkdir(
        &self,
        req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn unlink(&self, req: &Caller, parent: INodeNo, name: &OsStr, reply: RingReply) {
        reply.error(Errno::ENOSYS);
    }
    fn rmdir(&self, req: &Caller, parent: INodeNo, name: &OsStr, reply: RingReply) {
        reply.error(Errno::ENOSYS);
    }
    fn symlink(
        &self,
        req: &Caller,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn rename(
        &self,
        req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn link(
        &self,
        req: &Caller,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn open(&self, req: &Caller, ino: INodeNo, flags: OpenFlags, reply: RingReply) {
        reply.error(Errno::ENOSYS);
    }
    fn read(
        &self,
        req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn write(
        &self,
        req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn flush(
        &self,
        req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn release(
        &self,
        req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        flush: bool,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn fsync(&self, req: &Caller, ino: INodeNo, fh: FileHandle, datasync: bool, reply: RingReply) {
        reply.error(Errno::ENOSYS);
    }
    fn opendir(&self, req: &Caller, ino: INodeNo, flags: OpenFlags, reply: RingReply) {
        reply.error(Errno::ENOSYS);
    }
    fn readdir(&self, req: &Caller, ino: INodeNo, fh: FileHandle, offset: u64, reply: RingReply) {
        reply.error(Errno::ENOSYS);
    }
    fn readdirplus(
        &self,
        req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn releasedir(
        &self,
        req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        flags: OpenFlags,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn fsyncdir(
        &self,
        req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn statfs(&self, req: &Caller, ino: INodeNo, reply: RingReply) {
        reply.error(Errno::ENOSYS);
    }
    fn setxattr(
        &self,
        req: &Caller,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn getxattr(&self, req: &Caller, ino: INodeNo, name: &OsStr, size: u32, reply: RingReply) {
        reply.error(Errno::ENOSYS);
    }
    fn listxattr(&self, req: &Caller, ino: INodeNo, size: u32, reply: RingReply) {
        reply.error(Errno::ENOSYS);
    }
    fn removexattr(&self, req: &Caller, ino: INodeNo, name: &OsStr, reply: RingReply) {
        reply.error(Errno::ENOSYS);
    }
    fn access(&self, req: &Caller, ino: INodeNo, mask: AccessFlags, reply: RingReply) {
        reply.error(Errno::ENOSYS);
    }
    fn create(
        &self,
        req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn fallocate(
        &self,
        req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn lseek(
        &self,
        req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
    fn copy_file_range(
        &self,
        req: &Caller,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: RingReply,
    ) {
        reply.error(Errno::ENOSYS);
    }
}

/// Calls the method of `fs` for one decoded request.
pub(crate) fn dispatch<FS: RingFilesystem + ?Sized>(fs: &FS, req: Request<'_>, reply: RingReply) {
    let h = req.header;
    let c = Caller {
        unique: h.unique,
        uid: h.uid,
        gid: h.gid,
        pid: h.pid,
    };
    let c = &c;
    let ino = INodeNo(h.nodeid);
    match req.op {
        Op::Lookup { name } => fs.lookup(c, ino, name, reply),
        Op::GetAttr { fh } => fs.getattr(c, ino, fh, reply),
        Op::SetAttr(s) => fs.setattr(
            c, ino, s.mode, s.uid, s.gid, s.size, s.atime, s.mtime, s.ctime, s.fh, None, None,
            None, None, reply,
        ),
        Op::ReadLink => fs.readlink(c, ino, reply),
        Op::SymLink { name, target } => fs.symlink(c, ino, name, target, reply),
        Op::MkNod {
            name,
            mode,
            umask,
            rdev,
        } => fs.mknod(c, ino, name, mode, umask, rdev, reply),
        Op::MkDir { name, mode, umask } => fs.mkdir(c, ino, name, mode, umask, reply),
        Op::Unlink { name } => fs.unlink(c, ino, name, reply),
        Op::RmDir { name } => fs.rmdir(c, ino, name, reply),
        Op::Rename {
            name,
            newparent,
            newname,
            flags,
        } => fs.rename(c, ino, name, newparent, newname, flags, reply),
        Op::Link { ino: old, newname } => fs.link(c, old, ino, newname, reply),
        Op::Open { flags } => fs.open(c, ino, flags, reply),
        Op::Read {
            fh,
            offset,
            size,
            flags,
            lock_owner,
        } => fs.read(c, ino, fh, offset, size, flags, lock_owner, reply),
        Op::Write {
            fh,
            offset,
            data,
            write_flags,
            flags,
            lock_owner,
        } => fs.write(
            c,
            ino,
            fh,
            offset,
            data,
            write_flags,
            flags,
            lock_owner,
            reply,
        ),
        Op::StatFs => fs.statfs(c, ino, reply),
        Op::Release {
            fh,
            flags,
            lock_owner,
            flush,
        } => fs.release(c, ino, fh, flags, lock_owner, flush, reply),
        Op::FSync { fh, datasync } => fs.fsync(c, ino, fh, datasync, reply),
        Op::SetXAttr {
            name,
            value,
            flags,
            position,
        } => fs.setxattr(c, ino, name, value, flags, position, reply),
        Op::GetXAttr { name, size } => fs.getxattr(c, ino, name, size, reply),
        Op::ListXAttr { size } => fs.listxattr(c, ino, size, reply),
        Op::RemoveXAttr { name } => fs.removexattr(c, ino, name, reply),
        Op::Flush { fh, lock_owner } => fs.flush(c, ino, fh, lock_owner, reply),
        Op::OpenDir { flags } => fs.opendir(c, ino, flags, reply),
        Op::ReadDir { fh, offset, .. } => fs.readdir(c, ino, fh, offset, reply),
        Op::ReadDirPlus { fh, offset, .. } => fs.readdirplus(c, ino, fh, offset, reply),
        Op::ReleaseDir { fh, flags } => fs.releasedir(c, ino, fh, flags, reply),
        Op::FSyncDir { fh, datasync } => fs.fsyncdir(c, ino, fh, datasync, reply),
        Op::Access { mask } => fs.access(c, ino, mask, reply),
        Op::Create {
            name,
            mode,
            umask,
            flags,
        } => fs.create(c, ino, name, mode, umask, flags, reply),
        Op::FAllocate {
            fh,
            offset,
            length,
            mode,
        } => fs.fallocate(c, ino, fh, offset, length, mode, reply),
        Op::Lseek { fh, offset, whence } => fs.lseek(c, ino, fh, offset, whence, reply),
        Op::CopyFileRange {
            fh_in,
            offset_in,
            ino_out,
            fh_out,
            offset_out,
            len,
            flags,
        } => fs.copy_file_range(
            c, ino, fh_in, offset_in, ino_out, fh_out, offset_out, len, flags, reply,
        ),
        Op::Destroy => crate::reply::Empty::ok(reply),
        Op::Unsupported(_) => reply.error(Errno::ENOSYS),
    }
}

/// The most data bytes a reply to `op` may carry (READ and READDIR sizes, xattr buffers).
pub(crate) fn reply_limit(op: &Op<'_>, max: usize) -> usize {
    let asked = match op {
        Op::Read { size, .. } | Op::ReadDir { size, .. } | Op::ReadDirPlus { size, .. } => *size,
        Op::GetXAttr { size, .. } | Op::ListXAttr { size } if *size > 0 => *size,
        _ => return max,
    };
    usize::try_from(asked).map_or(max, |a| a.min(max))
}
