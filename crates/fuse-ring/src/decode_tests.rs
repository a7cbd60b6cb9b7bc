use super::*;
use crate::abi::*;

fn hdr(opcode: u32, op_len: usize, payload_len: usize) -> InHeader {
    InHeader {
        len: (IN_HEADER_LEN + op_len + payload_len) as u32,
        opcode,
        unique: 42,
        nodeid: 7,
        uid: 1,
        gid: 2,
        pid: 3,
        total_extlen: 0,
    }
}

fn le(parts: &[u64], widths: &[usize]) -> Vec<u8> {
    let mut v = Vec::new();
    for (x, w) in parts.iter().zip(widths) {
        v.extend_from_slice(&x.to_le_bytes()[..*w]);
    }
    v
}

fn dec<'a>(opcode: u32, op_in: &'a [u8], payload: &'a [u8]) -> Result<Op<'a>, Errno> {
    decode(hdr(opcode, op_in.len(), payload.len()), op_in, payload).map(|r| r.op)
}

#[test]
fn header_roundtrip_and_op_len() {
    let mut raw = le(
        &[100, FUSE_LOOKUP as u64, 42, 7, 1, 2, 3, 0],
        &[4, 4, 8, 8, 4, 4, 4, 2],
    );
    raw.resize(128, 0);
    let h = InHeader::parse(&raw).expect("header");
    assert_eq!(
        (h.opcode, h.unique, h.nodeid, h.uid, h.gid, h.pid),
        (FUSE_LOOKUP, 42, 7, 1, 2, 3)
    );
    assert_eq!(op_in_len(&h, 50), Some(10));
    assert_eq!(op_in_len(&h, 61), None, "payload larger than len");
    let big = InHeader { len: 40 + 200, ..h };
    assert_eq!(op_in_len(&big, 0), None, "op header larger than op_in");
    assert!(InHeader::parse(&raw[..39]).is_none());
}

#[test]
fn names_from_payload() {
    assert_eq!(
        dec(FUSE_LOOKUP, &[], b"abc\0"),
        Ok(Op::Lookup {
            name: OsStr::new("abc")
        })
    );
    assert_eq!(dec(FUSE_LOOKUP, &[], b"abc"), Err(Errno::EINVAL), "no NUL");
    assert_eq!(
        dec(FUSE_UNLINK, &[], b"x\0"),
        Ok(Op::Unlink {
            name: OsStr::new("x")
        })
    );
    assert_eq!(
        dec(FUSE_RMDIR, &[], b"d\0"),
        Ok(Op::RmDir {
            name: OsStr::new("d")
        })
    );
    assert_eq!(
        dec(FUSE_SYMLINK, &[], b"l\0/t/u\0"),
        Ok(Op::SymLink {
            name: OsStr::new("l"),
            target: Path::new("/t/u")
        })
    );
    assert_eq!(dec(FUSE_SYMLINK, &[], b"l\0/t"), Err(Errno::EINVAL));
    assert_eq!(
        dec(FUSE_REMOVEXATTR, &[], b"user.a\0"),
        Ok(Op::RemoveXAttr {
            name: OsStr::new("user.a")
        })
    );
}

#[test]
fn create_mkdir_mknod() {
    let op = le(&[0o2 | 0o100, 0o644, 0o22, 0], &[4, 4, 4, 4]);
    assert_eq!(
        dec(FUSE_CREATE, &op, b"f\0"),
        Ok(Op::Create {
            name: OsStr::new("f"),
            mode: 0o644,
            umask: 0o22,
            flags: 0o102
        })
    );
    assert_eq!(
        dec(FUSE_CREATE, &op[..8], b"f\0"),
        Err(Errno::EINVAL),
        "truncated fuse_create_in"
    );
    let op = le(&[0o755, 0o22], &[4, 4]);
    assert_eq!(
        dec(FUSE_MKDIR, &op, b"d\0"),
        Ok(Op::MkDir {
            name: OsStr::new("d"),
            mode: 0o755,
            umask: 0o22
        })
    );
    assert_eq!(dec(FUSE_MKDIR, &op[..4], b"d\0"), Err(Errno::EINVAL));
    let op = le(&[0o10644, 5, 0o22, 0], &[4, 4, 4, 4]);
    assert_eq!(
        dec(FUSE_MKNOD, &op, b"n\0"),
        Ok(Op::MkNod {
            name: OsStr::new("n"),
            mode: 0o10644,
            umask: 0o22,
            rdev: 5
        })
    );
}

#[test]
fn rename_and_rename2_and_link() {
    let op = le(&[9], &[8]);
    assert_eq!(
        dec(FUSE_RENAME, &op, b"a\0b\0"),
        Ok(Op::Rename {
            name: OsStr::new("a"),
            newparent: INodeNo(9),
            newname: OsStr::new("b"),
            flags: RenameFlags::empty()
        })
    );
    assert_eq!(dec(FUSE_RENAME, &op, b"a\0b"), Err(Errno::EINVAL));
    let op2 = le(&[9, 1, 0], &[8, 4, 4]);
    match dec(FUSE_RENAME2, &op2, b"a\0b\0") {
        Ok(Op::Rename {
            flags, newparent, ..
        }) => {
            assert_eq!(flags.bits(), 1);
            assert_eq!(newparent, INodeNo(9));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(dec(FUSE_RENAME2, &op2[..8], b"a\0b\0"), Err(Errno::EINVAL));
    assert_eq!(
        dec(FUSE_LINK, &op, b"n\0"),
        Ok(Op::Link {
            ino: INodeNo(9),
            newname: OsStr::new("n")
        })
    );
}

#[test]
fn read_write_and_offsets() {
    let op = le(
        &[5, 100, 4096, READ_LOCKOWNER as u64, 77, 2, 0],
        &[8, 8, 4, 4, 8, 4, 4],
    );
    assert_eq!(
        dec(FUSE_READ, &op, &[]),
        Ok(Op::Read {
            fh: FileHandle(5),
            offset: 100,
            size: 4096,
            flags: OpenFlags(2),
            lock_owner: Some(LockOwner(77))
        })
    );
    let neg = le(&[5, u64::MAX, 4096, 0, 0, 0, 0], &[8, 8, 4, 4, 8, 4, 4]);
    assert_eq!(
        dec(FUSE_READ, &neg, &[]),
        Err(Errno::EINVAL),
        "negative offset"
    );
    assert_eq!(dec(FUSE_READ, &op[..35], &[]), Err(Errno::EINVAL));
    assert_eq!(
        dec(FUSE_READDIR, &op, &[]),
        Ok(Op::ReadDir {
            fh: FileHandle(5),
            offset: 100,
            size: 4096
        })
    );
    let w = le(&[5, 10, 3, 0, 0, 1, 0], &[8, 8, 4, 4, 8, 4, 4]);
    match dec(FUSE_WRITE, &w, b"xyz") {
        Ok(Op::Write {
            data,
            offset,
            lock_owner,
            flags,
            ..
        }) => {
            assert_eq!(
                (data, offset, lock_owner, flags),
                (&b"xyz"[..], 10, None, OpenFlags(1))
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        dec(FUSE_WRITE, &w, b"xy"),
        Err(Errno::EINVAL),
        "data shorter than size"
    );
}

#[test]
fn setattr_fields_follow_valid() {
    let valid = FATTR_MODE | FATTR_SIZE | FATTR_MTIME | FATTR_MTIME_NOW | FATTR_ATIME | FATTR_FH;
    let op = le(
        &[
            valid as u64,
            0,
            8,
            1234,
            0,
            1_000,
            0,
            0,
            5,
            0,
            0,
            0o600,
            0,
            11,
            12,
            0,
        ],
        &[4, 4, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 4],
    );
    assert_eq!(op.len(), 88);
    match dec(FUSE_SETATTR, &op, &[]) {
        Ok(Op::SetAttr(s)) => {
            assert_eq!(s.mode, Some(0o600));
            assert_eq!(s.size, Some(1234));
            assert_eq!(s.uid, None);
            assert_eq!(s.gid, None);
            assert_eq!(s.fh, Some(FileHandle(8)));
            assert_eq!(s.mtime, Some(TimeOrNow::Now));
            assert_eq!(
                s.atime,
                Some(TimeOrNow::SpecificTime(UNIX_EPOCH + Duration::new(1000, 5)))
            );
            assert_eq!(s.ctime, None);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(dec(FUSE_SETATTR, &op[..80], &[]), Err(Errno::EINVAL));
}

#[test]
fn xattrs() {
    let op = le(&[3, 1], &[4, 4]);
    assert_eq!(
        dec(FUSE_SETXATTR, &op, b"user.k\0abc"),
        Ok(Op::SetXAttr {
            name: OsStr::new("user.k"),
            value: b"abc",
            flags: 1,
            position: 0
        })
    );
    let ext = le(&[3, 1, 0, 0], &[4, 4, 4, 4]);
    assert!(
        dec(FUSE_SETXATTR, &ext, b"user.k\0abc").is_ok(),
        "FUSE_SETXATTR_EXT header"
    );
    assert_eq!(
        dec(FUSE_SETXATTR, &op, b"user.k\0ab"),
        Err(Errno::EINVAL),
        "value shorter than size"
    );
    let g = le(&[64, 0], &[4, 4]);
    assert_eq!(
        dec(FUSE_GETXATTR, &g, b"user.k\0"),
        Ok(Op::GetXAttr {
            name: OsStr::new("user.k"),
            size: 64
        })
    );
    assert_eq!(dec(FUSE_LISTXATTR, &g, &[]), Ok(Op::ListXAttr { size: 64 }));
    assert_eq!(dec(FUSE_LISTXATTR, &g[..2], &[]), Err(Errno::EINVAL));
}

#[test]
fn file_handles_ops() {
    let g = le(&[GETATTR_FH as u64, 0, 9], &[4, 4, 8]);
    assert_eq!(
        dec(FUSE_GETATTR, &g, &[]),
        Ok(Op::GetAttr {
            fh: Some(FileHandle(9))
        })
    );
    let g0 = le(&[0, 0, 9], &[4, 4, 8]);
    assert_eq!(dec(FUSE_GETATTR, &g0, &[]), Ok(Op::GetAttr { fh: None }));
    let r = le(
        &[4, 2, (RELEASE_FLUSH | RELEASE_FLOCK_UNLOCK) as u64, 66],
        &[8, 4, 4, 8],
    );
    assert_eq!(
        dec(FUSE_RELEASE, &r, &[]),
        Ok(Op::Release {
            fh: FileHandle(4),
            flags: OpenFlags(2),
            lock_owner: Some(LockOwner(66)),
            flush: true
        })
    );
    assert_eq!(
        dec(FUSE_RELEASEDIR, &r, &[]),
        Ok(Op::ReleaseDir {
            fh: FileHandle(4),
            flags: OpenFlags(2)
        })
    );
    let f = le(&[4, 0, 55], &[8, 8, 8]);
    assert_eq!(
        dec(FUSE_FLUSH, &f, &[]),
        Ok(Op::Flush {
            fh: FileHandle(4),
            lock_owner: LockOwner(55)
        })
    );
    let s = le(&[4, 1, 0], &[8, 4, 4]);
    assert_eq!(
        dec(FUSE_FSYNC, &s, &[]),
        Ok(Op::FSync {
            fh: FileHandle(4),
            datasync: true
        })
    );
    assert_eq!(
        dec(FUSE_FSYNCDIR, &s, &[]),
        Ok(Op::FSyncDir {
            fh: FileHandle(4),
            datasync: true
        })
    );
    let o = le(&[0o2, 0], &[4, 4]);
    assert_eq!(
        dec(FUSE_OPEN, &o, &[]),
        Ok(Op::Open {
            flags: OpenFlags(2)
        })
    );
    assert_eq!(
        dec(FUSE_OPENDIR, &o, &[]),
        Ok(Op::OpenDir {
            flags: OpenFlags(2)
        })
    );
    let a = le(&[4, 0], &[4, 4]);
    assert_eq!(
        dec(FUSE_ACCESS, &a, &[]),
        Ok(Op::Access {
            mask: AccessFlags::from_bits_retain(4)
        })
    );
    let fa = le(&[4, 0, 100, 1, 0], &[8, 8, 8, 4, 4]);
    assert_eq!(
        dec(FUSE_FALLOCATE, &fa, &[]),
        Ok(Op::FAllocate {
            fh: FileHandle(4),
            offset: 0,
            length: 100,
            mode: 1
        })
    );
    let ls = le(&[4, 10, 3, 0], &[8, 8, 4, 4]);
    assert_eq!(
        dec(FUSE_LSEEK, &ls, &[]),
        Ok(Op::Lseek {
            fh: FileHandle(4),
            offset: 10,
            whence: 3
        })
    );
    let c = le(&[1, 2, 3, 4, 5, 6, 0], &[8; 7]);
    assert!(matches!(
        dec(FUSE_COPY_FILE_RANGE, &c, &[]),
        Ok(Op::CopyFileRange {
            ino_out: INodeNo(3),
            len: 6,
            offset_out: 5,
            ..
        })
    ));
    assert_eq!(dec(FUSE_COPY_FILE_RANGE, &c[..48], &[]), Err(Errno::EINVAL));
    assert_eq!(dec(FUSE_STATFS, &[], &[]), Ok(Op::StatFs));
    assert_eq!(dec(FUSE_READLINK, &[], &[]), Ok(Op::ReadLink));
    assert_eq!(dec(999, &[], &[]), Ok(Op::Unsupported(999)));
}

#[test]
fn every_truncation_of_every_opcode_is_an_error_not_a_panic() {
    let full = [0xffu8; 128];
    let payload = b"a\0b\0cdefgh";
    for opcode in 0..60u32 {
        for n in 0..=128 {
            for p in 0..=payload.len() {
                let _ = dec(opcode, &full[..n], &payload[..p]);
            }
        }
    }
}
