//! The reply traits for fuser's own reply types, delegating to their inherent methods.

use std::ffi::OsStr;
use std::time::Duration;

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr,
};

use super::*;

macro_rules! error_impl {
    ($($t:ty),*) => {$(
        impl Error for $t {
            fn error(self, err: Errno) {
                <$t>::error(self, err);
            }
        }
    )*};
}

error_impl!(
    ReplyEntry,
    ReplyAttr,
    ReplyOpen,
    ReplyCreate,
    ReplyData,
    ReplyWrite,
    ReplyEmpty,
    ReplyStatfs,
    ReplyXattr,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyLseek
);

impl Entry for ReplyEntry {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        ReplyEntry::entry(self, ttl, attr, generation);
    }
    fn entry_with_ttls(
        self,
        attr_ttl: &Duration,
        entry_ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) {
        ReplyEntry::entry_with_ttls(self, attr_ttl, entry_ttl, attr, generation);
    }
}

impl Attr for ReplyAttr {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        ReplyAttr::attr(self, ttl, attr);
    }
}

impl Open for ReplyOpen {
    fn opened(self, fh: FileHandle, flags: FopenFlags) {
        ReplyOpen::opened(self, fh, flags);
    }
    fn opened_passthrough_raw(self, fh: FileHandle, flags: FopenFlags, backing_id: u32) {
        crate::sys::opened_passthrough_raw(self, fh, flags, backing_id);
    }
}

impl Create for ReplyCreate {
    fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
    ) {
        ReplyCreate::created(self, ttl, attr, generation, fh, flags);
    }
    fn created_passthrough_raw(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
        backing_id: u32,
    ) {
        crate::sys::created_passthrough_raw(self, ttl, attr, generation, fh, flags, backing_id);
    }
}

impl Data for ReplyData {
    fn data(self, data: &[u8]) {
        ReplyData::data(self, data);
    }
}

impl Write for ReplyWrite {
    fn written(self, size: u32) {
        ReplyWrite::written(self, size);
    }
}

impl Empty for ReplyEmpty {
    fn ok(self) {
        ReplyEmpty::ok(self);
    }
}

impl Statfs for ReplyStatfs {
    fn statfs(
        self,
        blocks: u64,
        bfree: u64,
        bavail: u64,
        files: u64,
        ffree: u64,
        bsize: u32,
        namelen: u32,
        frsize: u32,
    ) {
        ReplyStatfs::statfs(
            self, blocks, bfree, bavail, files, ffree, bsize, namelen, frsize,
        );
    }
}

impl Xattr for ReplyXattr {
    fn size(self, size: u32) {
        ReplyXattr::size(self, size);
    }
    fn data(self, data: &[u8]) {
        ReplyXattr::data(self, data);
    }
}

impl Directory for ReplyDirectory {
    fn add<T: AsRef<OsStr>>(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: T) -> bool {
        ReplyDirectory::add(self, ino, offset, kind, name)
    }
    fn ok(self) {
        ReplyDirectory::ok(self);
    }
}

impl DirectoryPlus for ReplyDirectoryPlus {
    fn add<T: AsRef<OsStr>>(
        &mut self,
        ino: INodeNo,
        offset: u64,
        name: T,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool {
        ReplyDirectoryPlus::add(self, ino, offset, name, ttl, attr, generation)
    }
    fn ok(self) {
        ReplyDirectoryPlus::ok(self);
    }
}

impl Lseek for ReplyLseek {
    fn offset(self, offset: i64) {
        ReplyLseek::offset(self, offset);
    }
}
