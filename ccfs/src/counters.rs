//! Counts of the FUSE requests a mount served, by kind, and the bytes read and written.
//!
//! Shown by `ccfs status`. A mount that passes everything through (no cached paths) in
//! front of a share counts exactly what reached that share: `loadgen login-storm` uses one
//! as its share-side meter.

use crate::locks::Locked;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// The kinds of FUSE requests counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Req {
    Lookup,
    Getattr,
    Setattr,
    Readlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Symlink,
    Rename,
    Link,
    Open,
    Read,
    Write,
    Flush,
    Release,
    Fsync,
    Opendir,
    Readdir,
    Releasedir,
    Fsyncdir,
    Statfs,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Access,
    Create,
    Fallocate,
}

const ALL: [Req; 29] = [
    Req::Lookup,
    Req::Getattr,
    Req::Setattr,
    Req::Readlink,
    Req::Mknod,
    Req::Mkdir,
    Req::Unlink,
    Req::Rmdir,
    Req::Symlink,
    Req::Rename,
    Req::Link,
    Req::Open,
    Req::Read,
    Req::Write,
    Req::Flush,
    Req::Release,
    Req::Fsync,
    Req::Opendir,
    Req::Readdir,
    Req::Releasedir,
    Req::Fsyncdir,
    Req::Statfs,
    Req::Setxattr,
    Req::Getxattr,
    Req::Listxattr,
    Req::Removexattr,
    Req::Access,
    Req::Create,
    Req::Fallocate,
];

impl Req {
    pub fn name(self) -> &'static str {
        match self {
            Req::Lookup => "lookup",
            Req::Getattr => "getattr",
            Req::Setattr => "setattr",
            Req::Readlink => "readlink",
            Req::Mknod => "mknod",
            Req::Mkdir => "mkdir",
            Req::Unlink => "unlink",
            Req::Rmdir => "rmdir",
            Req::Symlink => "symlink",
            Req::Rename => "rename",
            Req::Link => "link",
            Req::Open => "open",
            Req::Read => "read",
            Req::Write => "write",
            Req::Flush => "flush",
            Req::Release => "release",
            Req::Fsync => "fsync",
            Req::Opendir => "opendir",
            Req::Readdir => "readdir",
            Req::Releasedir => "releasedir",
            Req::Fsyncdir => "fsyncdir",
            Req::Statfs => "statfs",
            Req::Setxattr => "setxattr",
            Req::Getxattr => "getxattr",
            Req::Listxattr => "listxattr",
            Req::Removexattr => "removexattr",
            Req::Access => "access",
            Req::Create => "create",
            Req::Fallocate => "fallocate",
        }
    }

    /// Whether the request changes what is stored (data or metadata).
    pub fn mutates(self) -> bool {
        matches!(
            self,
            Req::Setattr
                | Req::Mknod
                | Req::Mkdir
                | Req::Unlink
                | Req::Rmdir
                | Req::Symlink
                | Req::Rename
                | Req::Link
                | Req::Write
                | Req::Fsync
                | Req::Fsyncdir
                | Req::Setxattr
                | Req::Removexattr
                | Req::Create
                | Req::Fallocate
        )
    }
}

/// The path key of requests on a node that no longer has a name (a file removed while
/// open), so that the counts by path add up to the total.
pub const UNNAMED: &str = "(unnamed)";

/// Live counters (lock-free by kind; one increment a request), and by path when asked.
#[derive(Debug, Default)]
pub struct Requests {
    counts: [AtomicU64; ALL.len()],
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    /// Count by the first this many path components too (0: not).
    path_depth: AtomicUsize,
    /// Lock order: 19 (ARCHITECTURE.md, Locks), a leaf.
    by_path: Mutex<HashMap<String, u64>>,
}

impl Requests {
    pub fn count(&self, r: Req) {
        self.counts[r as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts requests by the first `depth` components of their path as well (0: not).
    pub fn count_paths(&self, depth: usize) {
        self.path_depth.store(depth, Ordering::Relaxed);
    }

    /// Whether requests are counted by path (the caller then finds the path).
    pub fn by_path_wanted(&self) -> bool {
        self.path_depth.load(Ordering::Relaxed) > 0
    }

    /// Counts one request of kind `r` at `path` (relative to the mount root), by its kind
    /// and by the first components of its path. Both counts change under the paths' lock,
    /// which a snapshot takes too: the counts by path always add up to the total.
    pub fn count_at(&self, r: Req, path: &Path) {
        let depth = self.path_depth.load(Ordering::Relaxed);
        if depth == 0 {
            self.count(r);
            return;
        }
        let key = path_key(path, depth);
        let mut m = self.by_path.locked();
        self.count(r);
        *m.entry(key).or_insert(0) += 1;
    }

    pub fn read(&self, bytes: usize) {
        self.read_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn wrote(&self, bytes: usize) {
        self.write_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> RequestCounts {
        // Held while the kinds are read: no request counted by path is half counted.
        let paths = self.by_path.locked();
        let mut by_op = BTreeMap::new();
        let (mut total, mut mutating) = (0, 0);
        for r in ALL {
            let n = self.counts[r as usize].load(Ordering::Relaxed);
            if n > 0 {
                by_op.insert(r.name().to_string(), n);
            }
            total += n;
            if r.mutates() {
                mutating += n;
            }
        }
        let by_path = paths.iter().map(|(k, v)| (k.clone(), *v)).collect();
        RequestCounts {
            total,
            mutating,
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            by_op,
            by_path,
        }
    }
}

/// The first `depth` components of `path` ("." for the mount root), `/`-separated, each
/// lossily UTF-8.
fn path_key(path: &Path, depth: usize) -> String {
    let parts: Vec<String> = path
        .components()
        .take(depth)
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.is_empty() {
        ".".to_string()
    } else {
        parts.join("/")
    }
}

/// A snapshot of [`Requests`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCounts {
    /// Every request served.
    pub total: u64,
    /// Requests that change what is stored (writes, creates, renames, unlinks, fsyncs...).
    pub mutating: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Requests by kind (kinds never seen are left out).
    pub by_op: BTreeMap<String, u64>,
    /// Requests by the first components of their path, when the mount counts them
    /// (`[mount] count_paths`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_path: BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_add_up_and_separate_mutating_requests() {
        let r = Requests::default();
        r.count(Req::Lookup);
        r.count(Req::Lookup);
        r.count(Req::Write);
        r.wrote(4096);
        r.count(Req::Rename);
        r.count(Req::Read);
        r.read(10);
        let s = r.snapshot();
        assert_eq!(s.total, 5);
        assert_eq!(s.mutating, 2);
        assert_eq!(s.write_bytes, 4096);
        assert_eq!(s.read_bytes, 10);
        assert_eq!(s.by_op.get("lookup"), Some(&2));
        assert!(!s.by_op.contains_key("mkdir"));
        // Every kind has its own slot and name.
        let names: std::collections::BTreeSet<_> = ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names.len(), ALL.len());
        assert!(ALL.iter().enumerate().all(|(i, r)| *r as usize == i));
    }

    /// Snapshots taken while requests are counted by path on other threads: the counts by
    /// path add up to the total in every one, and keys keep the first two components.
    #[test]
    fn counts_by_path_add_up_to_the_total_while_counting() {
        let r = Requests::default();
        r.count_paths(2);
        std::thread::scope(|s| {
            for t in 0..3 {
                let r = &r;
                s.spawn(move || {
                    for i in 0..20_000 {
                        let p = format!(".mozilla/firefox/p{t}/f{i}");
                        r.count_at(Req::Lookup, Path::new(&p));
                    }
                });
            }
            for _ in 0..200 {
                let snap = r.snapshot();
                assert_eq!(snap.by_path.values().sum::<u64>(), snap.total);
            }
        });
        let snap = r.snapshot();
        assert_eq!(snap.total, 60_000);
        assert_eq!(snap.by_path.get(".mozilla/firefox"), Some(&60_000));
    }
}
