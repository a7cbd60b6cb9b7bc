//! Real FUSE mounts served over the ring (root, /dev/fuse, Linux 6.14+).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use fuse_ring::reply as r;
use fuse_ring::{Caller, RingFilesystem, RingOptions, RingReply};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, OpenFlags,
};

const TTL: Duration = Duration::ZERO;

#[derive(Default)]
struct Node {
    name: OsString,
    data: Vec<u8>,
    xattrs: BTreeMap<OsString, Vec<u8>>,
}

/// A flat in-memory directory: root (1) and files (2..).
#[derive(Default)]
struct Mem {
    files: Mutex<BTreeMap<u64, Node>>,
    next: AtomicU64,
    classic: AtomicU64,
    ring: AtomicU64,
}

fn attr(ino: u64, size: u64) -> FileAttr {
    let dir = ino == 1;
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: if dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: if dir { 0o755 } else { 0o644 },
        nlink: if dir { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Mem {
    fn find(&self, name: &OsStr) -> Option<(u64, u64)> {
        let f = self.files.lock().expect("lock");
        f.iter()
            .find(|(_, n)| n.name == name)
            .map(|(i, n)| (*i, n.data.len() as u64))
    }
    fn lookup(&self, parent: INodeNo, name: &OsStr, reply: impl r::Entry) {
        match (parent.0, self.find(name)) {
            (1, Some((ino, size))) => reply.entry(&TTL, &attr(ino, size), Generation(0)),
            _ => reply.error(Errno::ENOENT),
        }
    }
    fn getattr(&self, ino: INodeNo, reply: impl r::Attr) {
        if ino.0 == 1 {
            return reply.attr(&TTL, &attr(1, 0));
        }
        match self.files.lock().expect("lock").get(&ino.0) {
            Some(n) => reply.attr(&TTL, &attr(ino.0, n.data.len() as u64)),
            None => reply.error(Errno::ENOENT),
        }
    }
    fn setattr(&self, ino: INodeNo, size: Option<u64>, reply: impl r::Attr) {
        if let (Some(size), Some(n)) = (size, self.files.lock().expect("lock").get_mut(&ino.0)) {
            n.data.resize(size as usize, 0);
        }
        self.getattr(ino, reply)
    }
    fn create(&self, name: &OsStr, reply: impl r::Create) {
        let ino = self.next.fetch_add(1, Ordering::Relaxed) + 2;
        self.files.lock().expect("lock").insert(
            ino,
            Node {
                name: name.into(),
                ..Node::default()
            },
        );
        reply.created(
            &TTL,
            &attr(ino, 0),
            Generation(0),
            FileHandle(ino),
            FopenFlags::empty(),
        );
    }
    fn open(&self, ino: INodeNo, reply: impl r::Open) {
        reply.opened(FileHandle(ino.0), FopenFlags::empty())
    }
    fn read(&self, ino: INodeNo, offset: u64, size: u32, reply: impl r::Data) {
        let f = self.files.lock().expect("lock");
        let d = f.get(&ino.0).map(|n| n.data.as_slice()).unwrap_or_default();
        let start = (offset as usize).min(d.len());
        let end = (start + size as usize).min(d.len());
        reply.data(&d[start..end]);
    }
    fn write(&self, ino: INodeNo, offset: u64, data: &[u8], reply: impl r::Write) {
        let mut f = self.files.lock().expect("lock");
        let Some(n) = f.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let end = offset as usize + data.len();
        if n.data.len() < end {
            n.data.resize(end, 0);
        }
        n.data[offset as usize..end].copy_from_slice(data);
        reply.written(data.len() as u32);
    }
    fn empty(&self, reply: impl r::Empty) {
        reply.ok()
    }
    fn unlink(&self, name: &OsStr, reply: impl r::Empty) {
        match self.find(name) {
            Some((ino, _)) => {
                self.files.lock().expect("lock").remove(&ino);
                reply.ok()
            }
            None => reply.error(Errno::ENOENT),
        }
    }
    fn rename(&self, name: &OsStr, newname: &OsStr, reply: impl r::Empty) {
        if let Some((old, _)) = self.find(newname) {
            self.files.lock().expect("lock").remove(&old);
        }
        match self.find(name) {
            Some((ino, _)) => {
                if let Some(n) = self.files.lock().expect("lock").get_mut(&ino) {
                    n.name = newname.into();
                }
                reply.ok()
            }
            None => reply.error(Errno::ENOENT),
        }
    }
    fn readdir<R: r::Directory>(&self, offset: u64, mut reply: R) {
        let f = self.files.lock().expect("lock");
        let mut all = vec![
            (1u64, FileType::Directory, OsString::from(".")),
            (1, FileType::Directory, "..".into()),
        ];
        all.extend(
            f.iter()
                .map(|(i, n)| (*i, FileType::RegularFile, n.name.clone())),
        );
        for (k, (ino, kind, name)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), k as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok()
    }
    fn statfs(&self, reply: impl r::Statfs) {
        reply.statfs(100, 50, 40, 10, 5, 4096, 255, 4096)
    }
    fn setxattr(&self, ino: INodeNo, name: &OsStr, value: &[u8], reply: impl r::Empty) {
        match self.files.lock().expect("lock").get_mut(&ino.0) {
            Some(n) => {
                n.xattrs.insert(name.into(), value.to_vec());
                reply.ok()
            }
            None => reply.error(Errno::ENOTSUP),
        }
    }
    fn getxattr(&self, ino: INodeNo, name: &OsStr, size: u32, reply: impl r::Xattr) {
        let f = self.files.lock().expect("lock");
        match f.get(&ino.0).and_then(|n| n.xattrs.get(name)) {
            Some(v) if size == 0 => reply.size(v.len() as u32),
            Some(v) if v.len() <= size as usize => reply.data(v),
            Some(_) => reply.error(Errno::ERANGE),
            None => reply.error(Errno::ENODATA),
        }
    }
    fn listxattr(&self, ino: INodeNo, size: u32, reply: impl r::Xattr) {
        let f = self.files.lock().expect("lock");
        let mut list = Vec::new();
        for k in f
            .get(&ino.0)
            .map(|n| n.xattrs.keys().collect::<Vec<_>>())
            .unwrap_or_default()
        {
            list.extend_from_slice(k.as_encoded_bytes());
            list.push(0);
        }
        if size == 0 {
            reply.size(list.len() as u32)
        } else if list.len() <= size as usize {
            reply.data(&list)
        } else {
            reply.error(Errno::ERANGE)
        }
    }
}

#[path = "support/glue.rs"]
mod glue;
