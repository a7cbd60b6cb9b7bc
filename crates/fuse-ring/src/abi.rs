//! Byte-level layout of the FUSE kernel protocol as far as this crate needs it:
//! opcodes, flag bits, struct sizes, and little helpers to read and write them.

/// Size of `struct fuse_in_header`.
pub const IN_HEADER_LEN: usize = 40;
/// Size of `struct fuse_out_header`.
pub const OUT_HEADER_LEN: usize = 16;
/// Size of `in_out` in `struct fuse_uring_req_header`.
pub const RING_IN_OUT_LEN: usize = 128;
/// Size of `op_in` in `struct fuse_uring_req_header`.
pub const RING_OP_IN_LEN: usize = 128;
/// Size of `struct fuse_uring_ent_in_out`.
pub const RING_ENT_IN_OUT_LEN: usize = 32;
/// Size of `struct fuse_uring_req_header`.
pub const RING_HEADER_LEN: usize = RING_IN_OUT_LEN + RING_OP_IN_LEN + RING_ENT_IN_OUT_LEN;
/// `FUSE_MIN_READ_BUFFER`: the smallest payload the kernel ever uses.
pub const MIN_READ_BUFFER: usize = 8192;

/// `FUSE_IO_URING_CMD_REGISTER`.
pub const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
pub const CMD_COMMIT_AND_FETCH: u32 = 2;

pub const FUSE_LOOKUP: u32 = 1;
pub const FUSE_GETATTR: u32 = 3;
pub const FUSE_SETATTR: u32 = 4;
pub const FUSE_READLINK: u32 = 5;
pub const FUSE_SYMLINK: u32 = 6;
pub const FUSE_MKNOD: u32 = 8;
pub const FUSE_MKDIR: u32 = 9;
pub const FUSE_UNLINK: u32 = 10;
pub const FUSE_RMDIR: u32 = 11;
pub const FUSE_RENAME: u32 = 12;
pub const FUSE_LINK: u32 = 13;
pub const FUSE_OPEN: u32 = 14;
pub const FUSE_READ: u32 = 15;
pub const FUSE_WRITE: u32 = 16;
pub const FUSE_STATFS: u32 = 17;
pub const FUSE_RELEASE: u32 = 18;
pub const FUSE_FSYNC: u32 = 20;
pub const FUSE_SETXATTR: u32 = 21;
pub const FUSE_GETXATTR: u32 = 22;
pub const FUSE_LISTXATTR: u32 = 23;
pub const FUSE_REMOVEXATTR: u32 = 24;
pub const FUSE_FLUSH: u32 = 25;
pub const FUSE_OPENDIR: u32 = 27;
pub const FUSE_READDIR: u32 = 28;
pub const FUSE_RELEASEDIR: u32 = 29;
pub const FUSE_FSYNCDIR: u32 = 30;
pub const FUSE_ACCESS: u32 = 34;
pub const FUSE_CREATE: u32 = 35;
pub const FUSE_DESTROY: u32 = 38;
pub const FUSE_FALLOCATE: u32 = 43;
pub const FUSE_READDIRPLUS: u32 = 44;
pub const FUSE_RENAME2: u32 = 45;
pub const FUSE_LSEEK: u32 = 46;
pub const FUSE_COPY_FILE_RANGE: u32 = 47;

pub const FATTR_MODE: u32 = 1 << 0;
pub const FATTR_UID: u32 = 1 << 1;
pub const FATTR_GID: u32 = 1 << 2;
pub const FATTR_SIZE: u32 = 1 << 3;
pub const FATTR_ATIME: u32 = 1 << 4;
pub const FATTR_MTIME: u32 = 1 << 5;
pub const FATTR_FH: u32 = 1 << 6;
pub const FATTR_ATIME_NOW: u32 = 1 << 7;
pub const FATTR_MTIME_NOW: u32 = 1 << 8;
pub const FATTR_CTIME: u32 = 1 << 10;

pub const GETATTR_FH: u32 = 1;
pub const READ_LOCKOWNER: u32 = 1 << 1;
pub const WRITE_LOCKOWNER: u32 = 1 << 1;
pub const RELEASE_FLUSH: u32 = 1 << 0;
pub const RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;
pub const FSYNC_FDATASYNC: u32 = 1 << 0;

/// `struct fuse_attr`.
#[cfg(test)]
pub const ATTR_LEN: usize = 88;
/// `struct fuse_entry_out`.
#[cfg(test)]
pub const ENTRY_OUT_LEN: usize = 40 + ATTR_LEN;
/// `struct fuse_attr_out`.
#[cfg(test)]
pub const ATTR_OUT_LEN: usize = 16 + ATTR_LEN;
/// `struct fuse_open_out`.
#[cfg(test)]
pub const OPEN_OUT_LEN: usize = 16;
/// `struct fuse_dirent` without its name.
#[cfg(test)]
pub const DIRENT_LEN: usize = 24;
/// `struct fuse_direntplus` without its name.
#[cfg(test)]
pub const DIRENTPLUS_LEN: usize = ENTRY_OUT_LEN + DIRENT_LEN;
/// `struct fuse_statfs_out`.
#[cfg(test)]
pub const STATFS_OUT_LEN: usize = 80;

/// A bounds-checked little-endian reader over a byte slice.
#[derive(Debug, Clone, Copy)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    /// Takes the next `n` bytes, or `None` if fewer remain.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.buf.len() {
            return None;
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Some(head)
    }

    pub fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_le_bytes([b[0], b[1]]))
    }

    pub fn u32(&mut self) -> Option<u32> {
        let b = self.take(4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn i32(&mut self) -> Option<i32> {
        self.u32().map(|v| v as i32)
    }

    pub fn u64(&mut self) -> Option<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Some(u64::from_le_bytes(a))
    }

    /// Takes a NUL-terminated string (without its NUL), or `None` if there is no NUL.
    pub fn cstr(&mut self) -> Option<&'a [u8]> {
        let end = self.buf.iter().position(|&c| c == 0)?;
        let s = self.take(end)?;
        self.take(1)?;
        Some(s)
    }
}

/// Little-endian appends to a byte vector.
pub trait Put {
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
}

impl Put for Vec<u8> {
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
}

/// Rounds `n` up to the next multiple of 8 (dirent alignment).
pub fn align8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_stops_at_the_end() {
        let mut r = Reader::new(&[1, 0, 0, 0, 2]);
        assert_eq!(r.u32(), Some(1));
        assert_eq!(r.u32(), None);
        assert_eq!(r.take(1), Some(&[2u8][..]));
        assert_eq!(r.u16(), None);
    }

    #[test]
    fn cstr_needs_a_nul() {
        let mut r = Reader::new(b"ab\0cd");
        assert_eq!(r.cstr(), Some(&b"ab"[..]));
        assert_eq!(r.cstr(), None);
    }

    #[test]
    fn header_sizes_match_the_kernel() {
        assert_eq!(RING_HEADER_LEN, 288);
        assert_eq!(ENTRY_OUT_LEN, 128);
        assert_eq!(ATTR_OUT_LEN, 104);
        assert_eq!(DIRENTPLUS_LEN, 152);
        assert_eq!(align8(25), 32);
        assert_eq!(align8(24), 24);
    }
}
