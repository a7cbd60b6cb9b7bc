use super::*;
use fuser::{FileAttr, FileType};
use std::time::Duration;

fn attr(ino: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 5,
        blocks: 1,
        atime: UNIX_EPOCH + Duration::new(10, 1),
        mtime: UNIX_EPOCH + Duration::new(20, 2),
        ctime: UNIX_EPOCH - Duration::new(1, 500),
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0o644,
        nlink: 1,
        uid: 3,
        gid: 4,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn reply(limit: usize, max: usize) -> (Rc<RefCell<Slot>>, RingReply) {
    let slot = Rc::new(RefCell::new(Slot::default()));
    let r = RingReply::new(Rc::clone(&slot), limit, max);
    (slot, r)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8"))
}

#[test]
fn entry_attr_open_sizes() {
    let (s, r) = reply(1 << 20, 1 << 20);
    r.entry(&Duration::new(1, 5), &attr(9), Generation(3));
    let out = s.borrow().out.clone();
    assert_eq!(out.len(), abi::ENTRY_OUT_LEN);
    assert_eq!(
        (u64_at(&out, 0), u64_at(&out, 8), u64_at(&out, 16)),
        (9, 3, 1)
    );
    assert_eq!(u32_at(&out, 32), 5);
    // attr.mode at 40 + 48 + 12
    assert_eq!(u32_at(&out, 40 + 60), libc::S_IFREG | 0o644);
    // ctime before the epoch: -2 s + 999_999_500 ns
    assert_eq!(u64_at(&out, 40 + 40) as i64, -2);
    assert_eq!(u32_at(&out, 40 + 56), 999_999_500);

    let (s, r) = reply(1 << 20, 1 << 20);
    r.attr(&Duration::ZERO, &attr(9));
    assert_eq!(s.borrow().out.len(), abi::ATTR_OUT_LEN);

    let (s, r) = reply(1 << 20, 1 << 20);
    r.opened_passthrough_raw(FileHandle(7), FopenFlags::empty(), 12);
    let out = s.borrow().out.clone();
    assert_eq!(out.len(), abi::OPEN_OUT_LEN);
    assert_eq!(
        (
            u64_at(&out, 0),
            u32_at(&out, 8) & FopenFlags::FOPEN_PASSTHROUGH.bits(),
            u32_at(&out, 12)
        ),
        (7, FopenFlags::FOPEN_PASSTHROUGH.bits(), 12)
    );

    let (s, r) = reply(1 << 20, 1 << 20);
    r.created(
        &Duration::ZERO,
        &attr(9),
        Generation(0),
        FileHandle(1),
        FopenFlags::empty(),
    );
    assert_eq!(s.borrow().out.len(), abi::ENTRY_OUT_LEN + abi::OPEN_OUT_LEN);

    let (s, r) = reply(1 << 20, 1 << 20);
    r.statfs(1, 2, 3, 4, 5, 6, 7, 8);
    assert_eq!(s.borrow().out.len(), abi::STATFS_OUT_LEN);
    assert_eq!(
        (u32_at(&s.borrow().out, 44), u32_at(&s.borrow().out, 48)),
        (7, 8)
    );
}

#[test]
fn error_drop_and_double_answers() {
    let (s, r) = reply(10, 10);
    r.error(Errno::ENOENT);
    assert_eq!(
        (s.borrow().error, s.borrow().answered),
        (-libc::ENOENT, true)
    );
    let (s, r) = reply(10, 10);
    drop(r);
    assert_eq!(
        s.borrow().error,
        -libc::EIO,
        "dropped without reply answers EIO"
    );
    let (s, r) = reply(4, 100);
    Data::data(r, b"12345");
    assert_eq!(
        s.borrow().error,
        -libc::EIO,
        "more data than READ asked for"
    );
    let (s, r) = reply(4, 100);
    Xattr::data(r, b"12345");
    assert_eq!(s.borrow().error, -libc::ERANGE);
    let (s, r) = reply(0, 100);
    Xattr::size(r, 77);
    assert_eq!(u32_at(&s.borrow().out, 0), 77);
}

#[test]
fn dirents_are_aligned_and_add_reports_full() {
    let (s, mut r) = reply(64, 1 << 20);
    assert!(!Directory::add(
        &mut r,
        INodeNo(2),
        1,
        FileType::Directory,
        "a"
    ));
    assert_eq!(s.borrow().out.len(), 32, "24 + 1 rounded up to 8");
    assert!(!Directory::add(
        &mut r,
        INodeNo(3),
        2,
        FileType::RegularFile,
        "bbbbbbbb"
    ));
    assert_eq!(s.borrow().out.len(), 64);
    assert!(
        Directory::add(&mut r, INodeNo(4), 3, FileType::RegularFile, "c"),
        "full"
    );
    assert_eq!(
        s.borrow().out.len(),
        64,
        "a refused entry leaves nothing behind"
    );
    Directory::ok(r);
    let out = s.borrow().out.clone();
    assert_eq!(
        (
            u64_at(&out, 0),
            u64_at(&out, 8),
            u32_at(&out, 16),
            u32_at(&out, 20)
        ),
        (2, 1, 1, libc::DT_DIR as u32)
    );
    assert_eq!(out[24], b'a');
    assert_eq!(&out[25..32], &[0; 7]);

    let (s, mut r) = reply(200, 1 << 20);
    assert!(!DirectoryPlus::add(
        &mut r,
        INodeNo(5),
        1,
        "xy",
        &Duration::ZERO,
        &attr(5),
        Generation(0)
    ));
    assert_eq!(s.borrow().out.len(), abi::align8(abi::DIRENTPLUS_LEN + 2));
    assert!(DirectoryPlus::add(
        &mut r,
        INodeNo(6),
        2,
        "xy",
        &Duration::ZERO,
        &attr(6),
        Generation(0)
    ));
    DirectoryPlus::ok(r);
    assert_eq!(s.borrow().out.len(), 160);
}
