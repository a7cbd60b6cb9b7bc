//! fuser's side of ccfs: its `Filesystem` over /dev/fuse, each request handed to the
//! handler of the same name on the shared [`CcfsFs`], which other transports serve too.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use fuse_ring::{Caller, RingFilesystem, RingReply};
use fuser::{
    AccessFlags, FileHandle, Filesystem, INodeNo, KernelConfig, LockOwner, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::CcfsFs;

/// Every request ccfs serves besides INIT, DESTROY and FORGET: its handler's name, its
/// arguments and fuser's reply type; `$m` makes the methods of one transport.
macro_rules! handlers {
    ($m:ident) => {
        $m! {
            lookup(parent: INodeNo, name: &OsStr) -> ReplyEntry;
            getattr(ino: INodeNo, fh: Option<FileHandle>) -> ReplyAttr;
            setattr(ino: INodeNo, mode: Option<u32>, uid: Option<u32>, gid: Option<u32>, size: Option<u64>, atime: Option<TimeOrNow>, mtime: Option<TimeOrNow>, ctime: Option<SystemTime>, fh: Option<FileHandle>, crtime: Option<SystemTime>, chgtime: Option<SystemTime>, bkuptime: Option<SystemTime>, flags: Option<fuser::BsdFileFlags>) -> ReplyAttr;
            readlink(ino: INodeNo) -> ReplyData;
            mknod(parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32) -> ReplyEntry;
            mkdir(parent: INodeNo, name: &OsStr, mode: u32, umask: u32) -> ReplyEntry;
            unlink(parent: INodeNo, name: &OsStr) -> ReplyEmpty;
            rmdir(parent: INodeNo, name: &OsStr) -> ReplyEmpty;
            symlink(parent: INodeNo, link_name: &OsStr, target: &Path) -> ReplyEntry;
            rename(parent: INodeNo, name: &OsStr, newparent: INodeNo, newname: &OsStr, flags: RenameFlags) -> ReplyEmpty;
            link(ino: INodeNo, newparent: INodeNo, newname: &OsStr) -> ReplyEntry;
            open(ino: INodeNo, flags: OpenFlags) -> ReplyOpen;
            read(ino: INodeNo, fh: FileHandle, offset: u64, size: u32, flags: OpenFlags, lock_owner: Option<LockOwner>) -> ReplyData;
            write(ino: INodeNo, fh: FileHandle, offset: u64, data: &[u8], write_flags: WriteFlags, flags: OpenFlags, lock_owner: Option<LockOwner>) -> ReplyWrite;
            flush(ino: INodeNo, fh: FileHandle, lock_owner: LockOwner) -> ReplyEmpty;
            release(ino: INodeNo, fh: FileHandle, flags: OpenFlags, lock_owner: Option<LockOwner>, flush: bool) -> ReplyEmpty;
            fsync(ino: INodeNo, fh: FileHandle, datasync: bool) -> ReplyEmpty;
            opendir(ino: INodeNo, flags: OpenFlags) -> ReplyOpen;
            readdir(ino: INodeNo, fh: FileHandle, offset: u64) -> ReplyDirectory;
            readdirplus(ino: INodeNo, fh: FileHandle, offset: u64) -> ReplyDirectoryPlus;
            releasedir(ino: INodeNo, fh: FileHandle, flags: OpenFlags) -> ReplyEmpty;
            fsyncdir(ino: INodeNo, fh: FileHandle, datasync: bool) -> ReplyEmpty;
            statfs(ino: INodeNo) -> ReplyStatfs;
            setxattr(ino: INodeNo, name: &OsStr, value: &[u8], flags: i32, position: u32) -> ReplyEmpty;
            getxattr(ino: INodeNo, name: &OsStr, size: u32) -> ReplyXattr;
            listxattr(ino: INodeNo, size: u32) -> ReplyXattr;
            removexattr(ino: INodeNo, name: &OsStr) -> ReplyEmpty;
            access(ino: INodeNo, mask: AccessFlags) -> ReplyEmpty;
            create(parent: INodeNo, name: &OsStr, mode: u32, umask: u32, flags: i32) -> ReplyCreate;
            fallocate(ino: INodeNo, fh: FileHandle, offset: u64, length: u64, mode: i32) -> ReplyEmpty;
        }
    };
}

/// The filesystem as a fuser session serves it; the same [`CcfsFs`] may be served over
/// other transports at once.
#[derive(Debug, Clone)]
pub struct Served(pub Arc<CcfsFs>);

/// Methods that call the handler of the same name with the caller and the reply.
macro_rules! fuser_methods {
    ($( $name:ident ( $($arg:ident : $ty:ty),* ) -> $reply:ty; )*) => {
        $(
            fn $name(&self, req: &Request, $($arg: $ty,)* reply: $reply) {
                self.0.$name(&Caller::from(req), $($arg,)* reply)
            }
        )*
    };
}

/// The same methods for the ring, whose one reply type answers every kind.
macro_rules! ring_methods {
    ($( $name:ident ( $($arg:ident : $ty:ty),* ) -> $reply:ty; )*) => {
        $(
            fn $name(&self, req: &Caller, $($arg: $ty,)* reply: RingReply) {
                if !self.0.ring.admits(stringify!($name), req.uid) {
                    return fuse_ring::reply::Error::error(reply, fuser::Errno::EACCES);
                }
                self.0.$name(req, $($arg,)* reply)
            }
        )*
    };
}

impl Filesystem for Served {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.0.init(config)?;
        super::ring::offer(&self.0, config);
        Ok(())
    }

    /// Nothing here: the ring's threads may still be serving when fuser's session ends, so
    /// the handles are let go once they are done ([`CcfsFs::end`]).
    fn destroy(&mut self) {}

    fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64) {
        self.0.forget(&Caller::from(req), ino, nlookup)
    }

    handlers!(fuser_methods);
}

impl RingFilesystem for Served {
    handlers!(ring_methods);
}
