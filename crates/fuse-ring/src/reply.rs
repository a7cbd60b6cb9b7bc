//! Reply traits shared by fuser's reply types and [`RingReply`], so one handler body
//! can answer on either transport.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo};

use crate::abi::{self, Put};

/// Answering with an error.
pub trait Error {
    fn error(self, err: Errno);
}

/// LOOKUP, MKNOD, MKDIR, SYMLINK, LINK.
pub trait Entry: Error {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation);
    fn entry_with_ttls(
        self,
        attr_ttl: &Duration,
        entry_ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    );
}

/// GETATTR, SETATTR.
pub trait Attr: Error {
    fn attr(self, ttl: &Duration, attr: &FileAttr);
}

/// OPEN, OPENDIR.
pub trait Open: Error {
    fn opened(self, fh: FileHandle, flags: FopenFlags);
    /// FOPEN_PASSTHROUGH with a backing id the caller registered (FUSE_DEV_IOC_BACKING_OPEN) and keeps alive.
    fn opened_passthrough_raw(self, fh: FileHandle, flags: FopenFlags, backing_id: u32);
}

/// CREATE.
pub trait Create: Error {
    fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
    );
    /// FOPEN_PASSTHROUGH with a backing id the caller registered and keeps alive.
    #[allow(clippy::too_many_arguments)]
    fn created_passthrough_raw(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
        backing_id: u32,
    );
}

/// READ, READLINK.
pub trait Data: Error {
    fn data(self, data: &[u8]);
}

/// WRITE, COPY_FILE_RANGE.
pub trait Write: Error {
    fn written(self, size: u32);
}

/// Operations answered with no data.
pub trait Empty: Error {
    fn ok(self);
}

/// STATFS.
pub trait Statfs: Error {
    #[allow(clippy::too_many_arguments)]
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
    );
}

/// GETXATTR, LISTXATTR.
pub trait Xattr: Error {
    fn size(self, size: u32);
    fn data(self, data: &[u8]);
}

/// READDIR.
pub trait Directory: Error {
    /// Adds an entry; returns true if the buffer is full (the entry was not added).
    fn add<T: AsRef<OsStr>>(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: T) -> bool;
    fn ok(self);
}

/// READDIRPLUS.
pub trait DirectoryPlus: Error {
    /// Adds an entry; returns true if the buffer is full (the entry was not added).
    #[allow(clippy::too_many_arguments)]
    fn add<T: AsRef<OsStr>>(
        &mut self,
        ino: INodeNo,
        offset: u64,
        name: T,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool;
    fn ok(self);
}

/// LSEEK.
pub trait Lseek: Error {
    fn offset(self, offset: i64);
}

#[path = "reply_fuser.rs"]
mod fuser_impls;

/// What a [`RingReply`] produced, read by the serving thread after the handler returned.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    /// Negative errno, or 0 with `out` as the payload.
    pub error: i32,
    pub out: Vec<u8>,
    pub answered: bool,
}

impl Slot {
    pub fn reset(&mut self) {
        self.error = 0;
        self.out.clear();
        self.answered = false;
    }
}

/// The reply object of the ring transport. It writes into a buffer owned by the serving
/// thread, which sends it after the handler returns; it is neither `Send` nor `Sync`.
/// Dropped without an answer, it answers EIO.
#[derive(Debug)]
pub struct RingReply {
    slot: Rc<RefCell<Slot>>,
    /// The most bytes of data or directory entries the request asked for.
    limit: usize,
    /// The size of the ring payload buffer: no reply is ever longer.
    max: usize,
    answered: bool,
}

impl RingReply {
    pub(crate) fn new(slot: Rc<RefCell<Slot>>, limit: usize, max: usize) -> Self {
        Self {
            slot,
            limit: limit.min(max),
            max,
            answered: false,
        }
    }

    fn finish(&mut self, error: i32, body: impl FnOnce(&mut Vec<u8>)) {
        if self.answered {
            return;
        }
        self.answered = true;
        let mut slot = self.slot.borrow_mut();
        if error != 0 {
            slot.out.clear();
            slot.error = -error;
        } else {
            body(&mut slot.out);
            if slot.out.len() > self.max {
                slot.out.clear();
                slot.error = -libc::EIO;
            }
        }
        slot.answered = true;
    }

    fn send(mut self, body: impl FnOnce(&mut Vec<u8>)) {
        self.finish(0, body);
    }

    fn send_bytes(mut self, data: &[u8], too_big: i32) {
        if data.len() > self.limit {
            self.finish(too_big, |_| {});
        } else {
            self.finish(0, |out| out.extend_from_slice(data));
        }
    }

    /// Appends one directory entry unless it would pass the limit; true means full.
    fn push_entry(&mut self, head: impl FnOnce(&mut Vec<u8>), name: &[u8]) -> bool {
        if self.answered {
            return true;
        }
        let mut slot = self.slot.borrow_mut();
        let start = slot.out.len();
        head(&mut slot.out);
        let unpadded = slot.out.len() - start + name.len();
        let end = start + abi::align8(unpadded);
        if end > self.limit {
            slot.out.truncate(start);
            return true;
        }
        slot.out.extend_from_slice(name);
        slot.out.resize(end, 0);
        false
    }
}

impl Drop for RingReply {
    fn drop(&mut self) {
        self.finish(libc::EIO, |_| {});
    }
}

fn time_parts(t: &SystemTime) -> (u64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs().min(i64::MAX as u64), d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            let secs = d.as_secs().min(i64::MAX as u64) as i64;
            if d.subsec_nanos() == 0 {
                ((-secs) as u64, 0)
            } else {
                ((-secs - 1) as u64, 1_000_000_000 - d.subsec_nanos())
            }
        }
    }
}

fn kind_bits(kind: FileType) -> u32 {
    match kind {
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Socket => libc::S_IFSOCK,
    }
}

/// `struct fuse_attr`.
pub(crate) fn put_attr(out: &mut Vec<u8>, attr: &FileAttr) {
    let (at, atn) = time_parts(&attr.atime);
    let (mt, mtn) = time_parts(&attr.mtime);
    let (ct, ctn) = time_parts(&attr.ctime);
    for v in [attr.ino.0, attr.size, attr.blocks, at, mt, ct] {
        out.put_u64(v);
    }
    let mode = kind_bits(attr.kind) | u32::from(attr.perm);
    for v in [
        atn,
        mtn,
        ctn,
        mode,
        attr.nlink,
        attr.uid,
        attr.gid,
        attr.rdev,
        attr.blksize,
        0,
    ] {
        out.put_u32(v);
    }
}

/// `struct fuse_entry_out`.
pub(crate) fn put_entry(
    out: &mut Vec<u8>,
    attr_ttl: &Duration,
    entry_ttl: &Duration,
    attr: &FileAttr,
    generation: Generation,
) {
    out.put_u64(attr.ino.0);
    out.put_u64(generation.0);
    out.put_u64(entry_ttl.as_secs());
    out.put_u64(attr_ttl.as_secs());
    out.put_u32(entry_ttl.subsec_nanos());
    out.put_u32(attr_ttl.subsec_nanos());
    put_attr(out, attr);
}

fn put_open(out: &mut Vec<u8>, fh: FileHandle, flags: FopenFlags, backing_id: u32) {
    out.put_u64(fh.0);
    out.put_u32(flags.bits());
    out.put_u32(backing_id);
}

impl Error for RingReply {
    fn error(mut self, err: Errno) {
        self.finish(err.code(), |_| {});
    }
}

impl Entry for RingReply {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        self.send(|out| put_entry(out, ttl, ttl, attr, generation));
    }
    fn entry_with_ttls(
        self,
        attr_ttl: &Duration,
        entry_ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) {
        self.send(|out| put_entry(out, attr_ttl, entry_ttl, attr, generation));
    }
}

impl Attr for RingReply {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        self.send(|out| {
            out.put_u64(ttl.as_secs());
            out.put_u32(ttl.subsec_nanos());
            out.put_u32(0);
            put_attr(out, attr);
        });
    }
}

impl Open for RingReply {
    fn opened(self, fh: FileHandle, flags: FopenFlags) {
        self.send(|out| put_open(out, fh, flags, 0));
    }
    fn opened_passthrough_raw(self, fh: FileHandle, flags: FopenFlags, backing_id: u32) {
        self.send(|out| put_open(out, fh, flags | FopenFlags::FOPEN_PASSTHROUGH, backing_id));
    }
}

impl Create for RingReply {
    fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
    ) {
        self.send(|out| {
            put_entry(out, ttl, ttl, attr, generation);
            put_open(out, fh, flags, 0);
        });
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
        self.send(|out| {
            put_entry(out, ttl, ttl, attr, generation);
            put_open(out, fh, flags | FopenFlags::FOPEN_PASSTHROUGH, backing_id);
        });
    }
}

impl Data for RingReply {
    fn data(self, data: &[u8]) {
        self.send_bytes(data, libc::EIO);
    }
}

impl Write for RingReply {
    fn written(self, size: u32) {
        self.send(|out| {
            out.put_u32(size);
            out.put_u32(0);
        });
    }
}

impl Empty for RingReply {
    fn ok(self) {
        self.send(|_| {});
    }
}

impl Statfs for RingReply {
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
        self.send(|out| {
            for v in [blocks, bfree, bavail, files, ffree] {
                out.put_u64(v);
            }
            for v in [bsize, namelen, frsize, 0] {
                out.put_u32(v);
            }
            out.resize(out.len() + 6 * 4, 0);
        });
    }
}

impl Xattr for RingReply {
    fn size(self, size: u32) {
        self.send(|out| {
            out.put_u32(size);
            out.put_u32(0);
        });
    }
    fn data(self, data: &[u8]) {
        self.send_bytes(data, libc::ERANGE);
    }
}

impl Lseek for RingReply {
    fn offset(self, offset: i64) {
        self.send(|out| out.put_u64(offset as u64));
    }
}

fn dirent_head(out: &mut Vec<u8>, ino: u64, offset: u64, name: &[u8], typ: u32) {
    out.put_u64(ino);
    out.put_u64(offset);
    out.put_u32(u32::try_from(name.len()).unwrap_or(u32::MAX));
    out.put_u32(typ);
}

impl Directory for RingReply {
    fn add<T: AsRef<OsStr>>(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: T) -> bool {
        let name = name.as_ref().as_bytes();
        self.push_entry(
            |out| dirent_head(out, ino.0, offset, name, kind_bits(kind) >> 12),
            name,
        )
    }
    fn ok(self) {
        self.send(|_| {});
    }
}

impl DirectoryPlus for RingReply {
    fn add<T: AsRef<OsStr>>(
        &mut self,
        _ino: INodeNo,
        offset: u64,
        name: T,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool {
        let name = name.as_ref().as_bytes();
        self.push_entry(
            |out| {
                put_entry(out, ttl, ttl, attr, generation);
                dirent_head(out, attr.ino.0, offset, name, kind_bits(attr.kind) >> 12);
            },
            name,
        )
    }
    fn ok(self) {
        self.send(|_| {});
    }
}

#[cfg(test)]
#[path = "reply_tests.rs"]
mod tests;
