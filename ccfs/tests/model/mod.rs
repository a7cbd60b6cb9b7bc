//! The reference model of sessions: one user on two workstations, each with its own cache
//! and journal over one share, with logins, logouts, crashes (also in the middle of a
//! sync), syncs whose rsync fails part-way, clocks far ahead or behind, and names near
//! NAME_MAX. Every operation runs on the real [`Overlay`] (no FUSE) with the real rsync and
//! on the [`reference::Model`]; after each one the share and every logged-in workstation's
//! view must equal the model's, including conflict copies (matched by name pattern), and
//! each sync must report what the model predicts (conflicts, files not sent, what is left).
//! Independently of the model, each sync must keep the design's promises: nothing it was
//! not asked to change on the share changes, and every version the session holds to send
//! ends on the share (at its path or in a conflict copy) or stays in the cache.

pub mod reference;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ccfs::overlay::{Ctx, OpenFile, Overlay, SetAttr};
use ccfs::policy::Policy;
use ccfs::sync::{run_rsync, run_sync, RsyncOptions, SyncMode, SyncReport};
use ccfs::sys::SetTime;
use proptest::prelude::*;

use reference::{is_set_aside, kind_name, Model, Obj, Outcome, Run, ROOT};

/// Workstations in the model.
pub const WORKSTATIONS: usize = 2;

/// Ten years: how far a workstation's clock may be ahead of or behind the other's.
pub const SKEW: i64 = 10 * 365 * 86_400;

/// The paths operations pick from: two files, a directory that may become a file, two
/// files in it, and two names near NAME_MAX (250 and 255 bytes), whose conflict copies
/// must be shortened.
pub fn names() -> &'static [PathBuf] {
    static NAMES: OnceLock<Vec<PathBuf>> = OnceLock::new();
    NAMES.get_or_init(|| {
        vec![
            PathBuf::from(".c/a"),
            PathBuf::from(".c/b"),
            PathBuf::from(".c/d"),
            PathBuf::from(".c/d/a"),
            PathBuf::from(".c/d/b"),
            PathBuf::from(format!(".c/{}", "l".repeat(250))),
            PathBuf::from(format!(".c/d/{}", "m".repeat(255))),
        ]
    })
}

fn name(i: usize) -> &'static Path {
    &names()[i % names().len()]
}

/// Where the harness's write lands.
#[derive(Debug, Clone, Copy)]
enum At {
    /// At the start of the file, cut to nothing first (or a new file).
    Start,
    /// At its end (`O_APPEND`).
    End,
    /// At this offset of an existing file, not cut.
    Offset(u64),
}

/// The lengths [`Op::Truncate`] cuts or extends a file to: within the first block, just
/// past it, and into the third.
pub const CUTS: [u64; 4] = [0, 2, 4097, 9000];

/// Where [`Op::PWrite`] k writes: within the first block (at its second byte), or across
/// the end of the first or second block into the next.
pub fn pwrite_at(k: u8) -> u64 {
    [1, 4094, 8190][usize::from(k) % 3]
}

/// One step on one workstation (the first field). A step on a workstation that is logged
/// out logs it in first (recovering what its journal holds).
#[derive(Debug, Clone)]
pub enum Op {
    /// Create or truncate, then write `len` bytes of `byte`.
    Write(usize, usize, u8, usize),
    Append(usize, usize, u8),
    /// Writes three bytes of this value at [`pwrite_at`] k of an existing file, without
    /// truncating it: files of several blocks, written in part.
    PWrite(usize, usize, u8, u8),
    /// Cuts or extends an existing file to one of [`CUTS`] (`truncate -s`).
    Truncate(usize, usize, u8),
    Unlink(usize, usize),
    Mkdir(usize, usize),
    Rmdir(usize, usize),
    Rename(usize, usize, usize),
    Chmod(usize, usize, u32),
    /// Sets an old mtime (`cp -p`, `touch -d`), a different one each time.
    Backdate(usize, usize),
    /// Sets the file's `user.x` attribute to this value, or removes it (None).
    Xattr(usize, usize, Option<u8>),
    /// Makes a symbolic link there (to `t<n>`).
    Symlink(usize, usize, u8),
    /// `ccfs sync`.
    Sync(usize),
    /// A sync (a logout with `true`) whose rsync sends the first k files, then fails
    /// (exit 23).
    FailSync(usize, usize, bool),
    Logout(usize),
    /// kill -9 of the daemon: no sync.
    Crash(usize),
    /// The share stops answering this workstation (ENOTCONN, its gate closed) ...
    ShareDown(usize),
    /// ... and answers again.
    ShareUp(usize),
    /// The daemon dies while rsync has sent the first k files.
    CrashInSync(usize, usize),
    /// A program opens the file read-write, maps it shared, closes the descriptor (ccfs
    /// sees the release) and writes this byte at its start through the mapping, which it
    /// keeps: under kernel passthrough its writes reach the cache's file without ccfs.
    Map(usize, usize, u8),
    /// Every kept mapping of the workstation writes this byte at its start, whether a
    /// session runs there or not (after a logout or a crash too).
    MapWrite(usize, u8),
    /// The programs holding the workstation's mappings end.
    Unmap(usize),
    /// The daemon's background copy of the blocks its changed files held by block lack
    /// (`overlay/fill.rs`), all of them now. The model learns which files it completed.
    Fill(usize),
    /// An edit on the share itself (over SSH, on the server), in place and at the same
    /// size: the file at the path gets this first byte (another than it has). No session
    /// is involved; on a share that keeps whole seconds, one in the second of a look
    /// leaves the look as it was.
    EditThere(usize, u8),
    /// A change of attributes on the share itself (`setfattr` over SSH): the file at the
    /// path gets `user.x` set to this value (another than it has). It changes neither
    /// size nor mtime; on a share that keeps whole seconds, one in the second of a look
    /// leaves the look as it was.
    AttrThere(usize, u8),
}

impl Op {
    fn ws(&self) -> usize {
        let w = match self {
            Op::Write(w, ..)
            | Op::Append(w, ..)
            | Op::PWrite(w, ..)
            | Op::Truncate(w, ..)
            | Op::Unlink(w, _)
            | Op::Mkdir(w, _)
            | Op::Rmdir(w, _)
            | Op::Rename(w, ..)
            | Op::Chmod(w, ..)
            | Op::Backdate(w, _)
            | Op::Xattr(w, ..)
            | Op::Symlink(w, ..)
            | Op::Sync(w)
            | Op::FailSync(w, ..)
            | Op::Logout(w)
            | Op::Crash(w)
            | Op::ShareDown(w)
            | Op::ShareUp(w)
            | Op::CrashInSync(w, _)
            | Op::Map(w, ..)
            | Op::MapWrite(w, _)
            | Op::Unmap(w)
            | Op::Fill(w) => *w,
            Op::EditThere(..) | Op::AttrThere(..) => 0,
        };
        w % WORKSTATIONS
    }
}

/// One operation on the paths `hot` (indices into [`names`]).
pub fn arb_op(hot: Vec<usize>) -> impl Strategy<Value = Op> {
    let p = prop::sample::select(hot);
    let w = 0..WORKSTATIONS;
    prop_oneof![
        // (Bytes from 1: a zero would read as a hole of a file held by block.)
        6 => (w.clone(), p.clone(), 1..4u8, 0..4usize).prop_map(|(w, p, b, l)| Op::Write(w, p, b, l)),
        2 => (w.clone(), p.clone(), 1..4u8).prop_map(|(w, p, b)| Op::Append(w, p, b)),
        3 => (w.clone(), p.clone(), 0..3u8, 1..4u8).prop_map(|(w, p, k, b)| Op::PWrite(w, p, k, b)),
        1 => (w.clone(), p.clone(), 0..CUTS.len() as u8).prop_map(|(w, p, c)| Op::Truncate(w, p, c)),
        3 => (w.clone(), p.clone()).prop_map(|(w, p)| Op::Unlink(w, p)),
        2 => (w.clone(), p.clone()).prop_map(|(w, p)| Op::Mkdir(w, p)),
        2 => (w.clone(), p.clone()).prop_map(|(w, p)| Op::Rmdir(w, p)),
        4 => (w.clone(), p.clone(), p.clone()).prop_map(|(w, a, b)| Op::Rename(w, a, b)),
        1 => (w.clone(), p.clone(), prop::sample::select(vec![0o600u32, 0o644, 0o755]))
            .prop_map(|(w, p, m)| Op::Chmod(w, p, m)),
        1 => (w.clone(), p.clone()).prop_map(|(w, p)| Op::Backdate(w, p)),
        1 => (w.clone(), p.clone(), prop::option::of(0..2u8)).prop_map(|(w, p, v)| Op::Xattr(w, p, v)),
        1 => (w.clone(), p.clone(), 0..2u8).prop_map(|(w, p, t)| Op::Symlink(w, p, t)),
        3 => w.clone().prop_map(Op::Sync),
        1 => (w.clone(), 0..4usize, any::<bool>()).prop_map(|(w, k, l)| Op::FailSync(w, k, l)),
        3 => w.clone().prop_map(Op::Logout),
        1 => w.clone().prop_map(Op::Crash),
        1 => (w.clone(), 0..4usize).prop_map(|(w, k)| Op::CrashInSync(w, k)),
        1 => w.clone().prop_map(Op::ShareDown),
        1 => w.clone().prop_map(Op::ShareUp),
        1 => (w.clone(), p.clone(), 1..4u8).prop_map(|(w, p, b)| Op::Map(w, p, b)),
        2 => (w.clone(), 3..6u8).prop_map(|(w, b)| Op::MapWrite(w, b)),
        1 => w.clone().prop_map(Op::Unmap),
        2 => w.prop_map(Op::Fill),
        2 => (p.clone(), 100..103u8).prop_map(|(p, b)| Op::EditThere(p, b)),
        1 => (p.clone(), 110..113u8).prop_map(|(p, b)| Op::AttrThere(p, b)),
    ]
}

/// A case's operations: they pick from a few of the paths (two to five), so that both
/// workstations meet at the same paths often.
pub fn arb_ops(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Op>> {
    let all: Vec<usize> = (0..names().len()).collect();
    prop::sample::subsequence(all, 2..=5)
        .prop_flat_map(move |hot| prop::collection::vec(arb_op(hot), len.clone()))
}

/// What the share holds at the start (see [`run_sessions`]): files of several blocks as
/// often as the others.
pub fn arb_initial() -> impl Strategy<Value = Vec<(usize, u8)>> {
    let byte = prop_oneof![any::<u8>(), 200..=255u8];
    prop::collection::vec((0..names().len(), byte), 0..6)
}

/// Each workstation's clock: behind, right, or ahead.
pub fn arb_skew() -> impl Strategy<Value = [i64; 2]> {
    let one = prop::sample::select(vec![-SKEW, 0, SKEW]);
    (one.clone(), one).prop_map(|(a, b)| [a, b])
}

/// The number of random cases: `CCFS_MODEL_CASES`, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("CCFS_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ctx() -> Ctx {
    Ctx {
        uid: ccfs::sys::geteuid(),
        gid: 0,
        umask: 0o022,
    }
}

/// What a tree holds at a path, as compared: files by content, permission bits and mtime.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    /// Content, permission bits, mtime, and the `user.x` attribute.
    File(Vec<u8>, u32, When, Option<Vec<u8>>),
    Dir,
    /// A symbolic link and its target.
    Link(PathBuf),
    /// A file held by block whose missing blocks cannot be read (its base's file was
    /// written in place on the share, or is gone from it): reads fail (EIO).
    Unreadable,
}

/// The `user.x` attribute of a file (None: not set).
fn xattr_of(get: impl FnOnce(&std::ffi::OsStr) -> std::io::Result<Vec<u8>>) -> Option<Vec<u8>> {
    get(std::ffi::OsStr::new(XATTR)).ok()
}

const XATTR: &str = "user.x";

/// What [`Op::Symlink`]'s link `t` points to.
fn link_target(t: u8) -> PathBuf {
    PathBuf::from(format!("t{t}"))
}

/// A file's mtime as compared: the same, or the same second where one side keeps whole
/// seconds (a share that does); unknown on the model's side only for a version the
/// harness did not write (none: [`World::node`] says so).
#[derive(Debug, Clone, Copy)]
struct When(Option<(i64, i64)>);

impl PartialEq for When {
    fn eq(&self, other: &Self) -> bool {
        match (self.0, other.0) {
            (Some(a), Some(b)) => a == b || ((a.1 == 0 || b.1 == 0) && a.0 == b.0),
            _ => true,
        }
    }
}

impl Eq for When {}

type Tree = BTreeMap<PathBuf, Node>;

fn short(p: &Path) -> String {
    let s = p.to_string_lossy();
    if s.len() > 60 {
        format!("{}…({} bytes)", &s[..40], s.len())
    } else {
        s.into_owned()
    }
}

/// The differences between two trees, one line each.
fn diff(want: &Tree, got: &Tree) -> String {
    let keys: BTreeSet<&PathBuf> = want.keys().chain(got.keys()).collect();
    let mut out = Vec::new();
    for k in keys {
        let (a, b) = (want.get(k), got.get(k));
        if a != b {
            out.push(format!(
                "  {}: model {:?}, real {:?}",
                short(k),
                a.map(brief),
                b.map(brief)
            ));
        }
    }
    out.join("\n")
}

fn brief(n: &Node) -> String {
    match n {
        Node::Dir => "dir".into(),
        Node::File(d, m, t, x) => {
            format!("file {} {m:o} mtime {:?} xattr {x:?}", bytes_brief(d), t.0)
        }
        Node::Link(t) => format!("symlink to {}", t.display()),
        Node::Unreadable => "a file that cannot be read".into(),
    }
}

/// A file's bytes, as runs of one value (`3 x4096`): files of several blocks in one line.
fn bytes_brief(d: &[u8]) -> String {
    let mut runs: Vec<(u8, usize)> = Vec::new();
    for &b in d {
        match runs.last_mut() {
            Some((v, n)) if *v == b => *n += 1,
            _ => runs.push((b, 1)),
        }
    }
    let shown: Vec<String> = runs
        .iter()
        .map(|(v, n)| match n {
            1 => format!("{v}"),
            n => format!("{v} x{n}"),
        })
        .collect();
    format!("[{}] ({} bytes)", shown.join(", "), d.len())
}

/// Whether `p` is (in) a sync's holding directory on the share.
fn in_holding_dir(p: &Path) -> bool {
    let holding = std::ffi::OsStr::new(ccfs::sync::PARTIAL_DIR);
    p.components().any(|c| c.as_os_str() == holding)
}

/// The share below the root, read directly.
fn share_tree(share: &Path) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![PathBuf::from(ROOT)];
    while let Some(rel) = stack.pop() {
        let p = share.join(&rel);
        let Ok(meta) = fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            out.insert(rel.clone(), Node::Dir);
            for e in fs::read_dir(&p).expect("ls share") {
                stack.push(rel.join(e.expect("entry").file_name()));
            }
        } else if meta.is_symlink() {
            out.insert(rel, Node::Link(fs::read_link(&p).expect("readlink share")));
        } else {
            let data = fs::read(&p).expect("read share");
            let t = When(Some((meta.mtime(), meta.mtime_nsec())));
            let x = xattr_of(|n| ccfs::sys::lgetxattr(&p, n));
            out.insert(rel, Node::File(data, meta.mode() & 0o7777, t, x));
        }
    }
    out
}

/// The data of the file `rel` as a program reads it through the mount: an open handle
/// read to its end (a file held by block reads through its blocks).
fn read_through(o: &Overlay, rel: &Path) -> Result<Vec<u8>, String> {
    let ctx = Ctx {
        uid: 0,
        gid: 0,
        umask: 0,
    };
    let f = o
        .open_file(&ctx, rel, libc::O_RDONLY)
        .map_err(|e| format!("open {}: {e}", short(rel)))?;
    let read = (|| {
        let g = o
            .file_to_read(&ctx, &f, || Some(rel.to_path_buf()))
            .map_err(|e| format!("open {}: {:?}", short(rel), e.error))?;
        let mut data = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = o
                .read_at(&g, &mut buf, data.len() as u64)
                .map_err(|e| format!("read {}: {e}", short(rel)))?;
            if n == 0 {
                return Ok(data);
            }
            data.extend_from_slice(&buf[..n]);
        }
    })();
    o.close_file(&f);
    read
}

/// What a logged-in workstation shows below the root, through the overlay.
fn overlay_view(o: &Overlay) -> Result<Tree, String> {
    let mut out = Tree::new();
    let mut stack = vec![PathBuf::from(ROOT)];
    while let Some(rel) = stack.pop() {
        let found = o
            .resolve(&rel)
            .map_err(|e| format!("{} is listed but cannot be resolved: {e}", short(&rel)))?;
        if found.meta.is_dir() {
            out.insert(rel.clone(), Node::Dir);
            let entries = o
                .readdir(&rel)
                .map_err(|e| format!("readdir {}: {e}", short(&rel)))?;
            stack.extend(entries.into_iter().map(|e| rel.join(e.name)));
        } else if found.meta.is_symlink() {
            let t = o
                .readlink(&rel)
                .map_err(|e| format!("readlink {}: {e}", short(&rel)))?;
            out.insert(rel, Node::Link(t));
        } else {
            let Ok(data) = read_through(o, &rel) else {
                out.insert(rel, Node::Unreadable);
                continue;
            };
            let t = When(Some(found.meta.mtime()));
            let x = xattr_of(|n| {
                o.getxattr(&rel, n)
                    .map_err(|e| std::io::Error::other(e.to_string()))
            });
            out.insert(rel, Node::File(data, found.meta.mode() & 0o7777, t, x));
        }
    }
    Ok(out)
}

/// Every file in the cache's upper layer, relative to it.
fn upper_files(upper: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(entries) = fs::read_dir(upper.join(&rel)) else {
            continue;
        };
        for e in entries.flatten() {
            let c = rel.join(e.file_name());
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(c),
                Ok(_) => out.push(c),
                Err(_) => {}
            }
        }
    }
    out
}

/// The rsync wrapper: records the lists it is handed, one call after another (`list`; a
/// sync runs rsync twice when it sends snapshots of files being written first), runs the
/// real rsync over them (K from the file `k`; `all`: every file, with rsync's own exit
/// code), and when K is a number sends the first K files of all the calls together and
/// fails every call with exit 23 (a sync that went wrong part-way; `sent` counts).
fn write_wrapper(dir: &Path) -> PathBuf {
    let real = ccfs::sync::find_program("rsync").expect("rsync is installed");
    let script = format!(
        "#!/bin/sh\nhere=$(dirname \"$0\")\ncat > \"$here/call\"\ncat \"$here/call\" >> \"$here/list\"\n\
         k=$(cat \"$here/k\")\n\
         if [ \"$k\" = all ]; then exec '{real}' \"$@\" < \"$here/call\"; fi\n\
         sent=$(cat \"$here/sent\" 2>/dev/null || echo 0)\nleft=$((k - sent))\n\
         [ \"$left\" -lt 0 ] && left=0\n\
         n=$(tr -cd '\\000' < \"$here/call\" | wc -c)\n\
         [ \"$n\" -lt \"$left\" ] && left=$n\n\
         echo $((sent + left)) > \"$here/sent\"\n\
         head -z -n \"$left\" \"$here/call\" | '{real}' \"$@\"\nexit 23\n",
        real = real.display()
    );
    let path = dir.join("rsync");
    fs::write(&path, script).expect("wrapper");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod wrapper");
    path
}

/// The share, the workstations' caches and their logged-in overlays.
struct World {
    overlays: Vec<Option<Overlay>>,
    share: PathBuf,
    caches: Vec<PathBuf>,
    wrapper: PathBuf,
    skew: [i64; 2],
    host: String,
    /// A different old mtime for each backdated file.
    backdates: i64,
    /// Every mtime a write gave a file so far. The model tells versions apart by a stamp
    /// of its own, and ccfs (like rsync) by size and mtime: two writes within one tick of
    /// the kernel's coarse clock would share an mtime that the model's stamps tell apart,
    /// so a write that gets an mtime already given has it moved on by a microsecond.
    mtimes: std::cell::RefCell<BTreeSet<(i64, i64)>>,
    /// The mtime each version (the model's stamp) got when the harness wrote it.
    stamp_mtimes: std::cell::RefCell<BTreeMap<u64, (i64, i64)>>,
    /// The share keeps whole seconds.
    whole_seconds: bool,
    /// Files are held by block from their first byte on (see `Overlay::set_by_block_from`).
    by_block: bool,
    /// Each workstation's programs' shared writable mappings of cache files.
    maps: Vec<Vec<Mapping>>,
    /// Each workstation's programs' mappings of files held by block: the kernel writes
    /// them through a handle the daemon serves (known by the cache file's inode number).
    handle_maps: Vec<Vec<(u64, OpenFile)>>,
    tmp: tempfile::TempDir,
}

/// A program's shared writable mapping of a cache file, its descriptor closed: known by
/// the file's inode number (the file may move: to a conflict name).
struct Mapping {
    ino: u64,
    at: *mut u8,
    len: usize,
}

impl Mapping {
    fn of(f: &fs::File, len: usize) -> std::io::Result<Mapping> {
        use std::os::fd::AsRawFd;
        // SAFETY: a new shared mapping of an open file, of its length; checked below.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping {
            ino: f.metadata()?.ino(),
            at: at.cast(),
            len,
        })
    }

    /// Writes `b` at the start and has it written back (as a program's msync).
    fn write(&self, b: u8) {
        // SAFETY: the mapping is `len` > 0 bytes long and alive while `self` is.
        unsafe {
            *self.at = b;
            libc::msync(self.at.cast(), self.len, libc::MS_SYNC);
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `of`, unmapped once.
        unsafe { libc::munmap(self.at.cast(), self.len) };
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.maps.clear();
        self.handle_maps.clear();
        self.overlays.clear();
        if !self.share.starts_with(self.tmp.path()) {
            let _ = fs::remove_dir_all(&self.share);
        }
    }
}

type Checked = Result<(), String>;

/// Whether the share the cases run on ($CCFS_MODEL_SHARE_ROOT, else a temporary
/// directory) keeps whole seconds: a directory made there has no nanoseconds.
pub fn share_keeps_whole_seconds() -> bool {
    let root = std::env::var_os("CCFS_MODEL_SHARE_ROOT").map(PathBuf::from);
    let dir = match root {
        Some(r) => tempfile::tempdir_in(r),
        None => tempfile::tempdir(),
    };
    dir.is_ok_and(|d| {
        fs::metadata(d.path()).is_ok_and(|m| m.mtime_nsec() == 0 && m.ctime_nsec() == 0)
    })
}

impl World {
    /// The share below $CCFS_MODEL_SHARE_ROOT when set (a loop-mounted ext4, which reuses
    /// inode numbers), else in a temporary directory with the caches.
    fn new(skew: [i64; 2], by_block: bool) -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let share = match std::env::var_os("CCFS_MODEL_SHARE_ROOT") {
            Some(root) => tempfile::tempdir_in(root).expect("share dir").keep(),
            None => tmp.path().join("share"),
        };
        fs::create_dir_all(share.join(ROOT)).expect("share");
        let whole_seconds = fs::metadata(share.join(ROOT))
            .is_ok_and(|m| m.mtime_nsec() == 0 && m.ctime_nsec() == 0);
        let caches: Vec<PathBuf> = (0..WORKSTATIONS)
            .map(|w| tmp.path().join(format!("cache-{w}")))
            .collect();
        for c in &caches {
            fs::create_dir(c).expect("cache");
        }
        let rsync_dir = tmp.path().join("rsync");
        fs::create_dir(&rsync_dir).expect("rsync dir");
        World {
            overlays: (0..WORKSTATIONS).map(|_| None).collect(),
            wrapper: write_wrapper(&rsync_dir),
            share,
            caches,
            skew,
            host: ccfs::sync::hostname(),
            backdates: 0,
            mtimes: Default::default(),
            stamp_mtimes: Default::default(),
            whole_seconds,
            by_block,
            maps: (0..WORKSTATIONS).map(|_| Vec::new()).collect(),
            handle_maps: (0..WORKSTATIONS).map(|_| Vec::new()).collect(),
            tmp,
        }
    }

    fn overlay(&self, w: usize) -> &Overlay {
        self.overlays[w].as_ref().expect("logged in")
    }

    /// rsync options through the wrapper, which sends the first `k` files (all: None).
    fn rsync(&self, k: Option<usize>) -> RsyncOptions {
        let dir = self.wrapper.parent().expect("dir");
        let k = k.map_or_else(|| "all".to_string(), |k| k.to_string());
        fs::write(dir.join("k"), k).expect("k");
        let _ = fs::remove_file(dir.join("list"));
        let _ = fs::remove_file(dir.join("sent"));
        RsyncOptions {
            binary: self.wrapper.clone(),
            extra_args: vec![],
            timeout: Duration::from_secs(60),
            caps: ccfs::sync::probe_share(&self.share),
            fsync: ccfs::sync::FsyncProbe::answered(false),
            hold_fd: None,
            launcher: None,
            implied_dirs: false,
        }
    }

    /// What the last rsync run was handed (empty when none ran).
    fn listed(&self) -> Vec<PathBuf> {
        let dir = self.wrapper.parent().expect("dir");
        match fs::read(dir.join("list")) {
            Ok(bytes) => bytes
                .split(|b| *b == 0)
                .filter(|s| !s.is_empty())
                .map(|s| PathBuf::from(std::ffi::OsStr::from_bytes(s)))
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The inode number of a directory on the share.
    fn dir_ino(&self, p: &Path) -> Option<u64> {
        fs::symlink_metadata(self.share.join(p))
            .ok()
            .filter(|m| m.is_dir())
            .map(|m| m.ino())
    }

    /// Every share file's look (inode, size, mtime, ctime), by path.
    fn share_looks(&self) -> BTreeMap<PathBuf, [i64; 6]> {
        let mut out = BTreeMap::new();
        let mut stack = vec![PathBuf::from(ROOT)];
        while let Some(rel) = stack.pop() {
            let Ok(meta) = fs::symlink_metadata(self.share.join(&rel)) else {
                continue;
            };
            if meta.is_dir() {
                if let Ok(entries) = fs::read_dir(self.share.join(&rel)) {
                    stack.extend(entries.flatten().map(|e| rel.join(e.file_name())));
                }
            } else {
                out.insert(
                    rel,
                    [
                        meta.ino() as i64,
                        meta.size() as i64,
                        meta.mtime(),
                        meta.mtime_nsec(),
                        meta.ctime(),
                        meta.ctime_nsec(),
                    ],
                );
            }
        }
        out
    }

    /// Tells the model which share files the real sync just made kept their look
    /// (`before`: [`World::share_looks`] before it).
    fn tell_looks_kept(&self, model: &mut Model, before: &BTreeMap<PathBuf, [i64; 6]>) {
        let after = self.share_looks();
        model.look_kept = after
            .iter()
            .filter(|(p, l)| before.get(*p) == Some(l))
            .map(|(p, _)| p.clone())
            .collect();
    }

    /// The model learns what each logged-in workstation holds by block (see
    /// [`Model::learn_partial`]).
    fn learn_blocks(&self, model: &mut Model) -> Checked {
        for (w, o) in self.overlays.iter().enumerate() {
            let Some(o) = o else { continue };
            let parts: Vec<(PathBuf, ccfs::state::Partial)> = {
                let inner = o.lock();
                inner
                    .state()
                    .partials()
                    .map(|(p, part)| (p.clone(), part.clone()))
                    .collect()
            };
            let now = parts
                .into_iter()
                .map(|(p, part)| {
                    // (Looked at without making one: a path with none holds no base.)
                    let held = o.open_block_file(&p).is_some_and(|bf| bf.base_is_held());
                    (p, (part, held))
                })
                .collect();
            model.learn_partial(w, now)?;
        }
        Ok(())
    }

    /// The session of `w` ended (a logout or a crash): the mappings served by its daemon
    /// end with it.
    fn session_ended(&mut self, w: usize) {
        self.handle_maps[w].clear();
    }

    fn learn_dirs(&self, model: &mut Model) -> Checked {
        self.note_looks(model);
        model.learn_dir_inodes(|p| self.dir_ino(p))
    }

    /// On a share that keeps whole seconds, the model learns each share file's look (see
    /// [`Model::same_looks`]).
    fn note_looks(&self, model: &mut Model) {
        if self.whole_seconds {
            model.same_looks(&self.share_looks());
        }
    }

    /// Logs workstation `w` in: the overlay, and the recovery a mount runs when the
    /// journal holds work (else the cache is emptied).
    fn login(&mut self, model: &mut Model, w: usize) -> Checked {
        let o = Overlay::new(&self.share, &self.caches[w], Policy::default_policy())
            .map_err(|e| format!("mount: {e}"))?;
        // The share looks kept for the next change of a name ("nothing there") are on,
        // as in a mount, and kept for the whole case (a mount keeps them a second: the
        // model's steps take no time that it could count), so that each stands as long
        // as ccfs lets one stand (until a sync of the workstation starts). Every step
        // ends with a look at each view, as a user's `ls -l` makes: a name another
        // workstation put on the share shows, and its kept look goes. The reference
        // plays each look (reference::Model::look).
        o.set_recent_look(std::time::Duration::from_secs(3600));
        if self.by_block {
            o.set_by_block_from(1);
        }
        let promises = Promises::before(self, &o);
        let looks = self.share_looks();
        let outcome = ccfs::daemon::recover_overlay(&o, &self.rsync(None));
        self.tell_looks_kept(model, &looks);
        let recovers = model.login_needs_recovery(w);
        match (outcome, recovers) {
            (None, false) => {}
            (Some(out), true) => {
                let report = out
                    .report
                    .ok_or_else(|| format!("recovery failed: {:?}", out.error))?;
                let want = model.sync(
                    w,
                    true,
                    Run::All,
                    (&self.listed(), &report.sent_directly),
                    &self.host,
                    &|p| self.dir_ino(p),
                )?;
                same_report("recovery at login", &report, &want)?;
                promises.kept(self, &o)?;
            }
            (out, _) => {
                return Err(format!(
                    "at login the model expects {} recovery, ccfs {}",
                    if recovers { "a" } else { "no" },
                    if out.is_some() { "ran one" } else { "ran none" }
                ))
            }
        }
        self.overlays[w] = Some(o);
        self.learn_dirs(model)?;
        // What the user sees at login: every clean copy kept from an earlier session is
        // looked at (and let go of where the share changed).
        model.look_at_clean_copies();
        self.compare(model)
    }

    /// A sync of `w`; `fail_after`: rsync sends that many files, then fails.
    fn sync(
        &mut self,
        model: &mut Model,
        w: usize,
        mode: SyncMode,
        fail_after: Option<usize>,
    ) -> Checked {
        let o = self.overlay(w);
        let promises = Promises::before(self, o);
        let opts = self.rsync(fail_after);
        let looks = self.share_looks();
        let report = run_sync(o, &opts, mode).map_err(|e| format!("sync: {e}"))?;
        self.tell_looks_kept(model, &looks);
        let run = fail_after.map_or(Run::All, Run::FailAfter);
        let want = model.sync(
            w,
            mode != SyncMode::Session,
            run,
            (&self.listed(), &report.sent_directly),
            &self.host,
            &|p| self.dir_ino(p),
        )?;
        same_report(&format!("{mode:?} sync"), &report, &want)?;
        promises.kept(self, o)?;
        if mode == SyncMode::Logout {
            self.overlays[w] = None;
            self.session_ended(w);
            model.logged_out(w);
            if want.cache_dropped {
                // Only clean copies stay: the files the model keeps, as a sync left them
                // (another workstation may have changed the share since: the next
                // lookup finds that out).
                let upper = self.caches[w].join("upper");
                for p in upper_files(&upper) {
                    let mut ours = fs::read(upper.join(&p)).map_err(|e| format!("{e}"))?;
                    let kept = model.ws[w].upper.get(&p);
                    if let (true, Some(Obj::File { data, .. })) =
                        (model.ws[w].partial.contains_key(&p), kept)
                    {
                        // (Its holes are the share's bytes while the share has its base;
                        // else only its blocks can be checked.)
                        let holes = match model.share_has_base(w, &p) {
                            true => None,
                            false => Some(data.as_slice()),
                        };
                        ours = self.by_block_as_kept(&upper.join(&p), &p, holes)?;
                    }
                    if !matches!(kept, Some(Obj::File { data, .. }) if *data == ours) {
                        return Err(format!(
                            "a clean logout left {} in the cache of workstation {w}, the model {kept:?}",
                            p.display()
                        ));
                    }
                }
            }
        }
        self.learn_dirs(model)
    }

    /// The bytes of a clean copy held by block as the next session reads them: the cache
    /// file's blocks, and the share's bytes (its base, as the logout left it) where it
    /// has holes, or `holes` there (the share changed since: they cannot be checked).
    fn by_block_as_kept(
        &self,
        cached: &Path,
        p: &Path,
        holes: Option<&[u8]>,
    ) -> Result<Vec<u8>, String> {
        let f = fs::File::open(cached).map_err(|e| format!("{}: {e}", short(p)))?;
        let len = f.metadata().map_err(|e| format!("{e}"))?.len();
        let mut view = match holes {
            Some(h) => h.to_vec(),
            None => fs::read(self.share.join(p)).unwrap_or_default(),
        };
        view.resize(len as usize, 0);
        let ours = fs::read(cached).map_err(|e| format!("{}: {e}", short(p)))?;
        let data = ccfs::sys::data_extents(&f, 0, len).map_err(|e| format!("{e}"))?;
        for (s, e) in data {
            let (s, e) = (s as usize, (e as usize).min(ours.len()));
            view[s..e].copy_from_slice(&ours[s..e]);
        }
        Ok(view)
    }

    /// The daemon dies while rsync has sent the first `k` files of its list.
    fn crash_in_sync(&mut self, model: &mut Model, w: usize, k: usize) -> Checked {
        let o = self.overlays[w].take().expect("logged in");
        let stamp = ccfs::sync::stamp(SystemTime::now());
        let looks = self.share_looks();
        let session = o
            .begin_sync(&self.host, &stamp)
            .map_err(|e| format!("begin_sync: {e}"))?;
        // As the sync hands them to rsync: the snapshots of files being written first;
        // then the files it sends itself: the regular files (all copied into place, then
        // renamed one after another), then those held by block.
        let by_block = &session.by_blocks.clone();
        let direct = &session.direct.clone();
        let files: Vec<PathBuf> = session
            .snapshots
            .iter()
            .chain(session.files.iter().filter(|p| {
                !session.snapshots.contains(p) && !by_block.contains(p) && !direct.contains(p)
            }))
            .chain(direct.iter())
            .chain(by_block.iter())
            .cloned()
            .collect();
        let mut conflicts: Vec<(PathBuf, String)> = session
            .conflicts
            .iter()
            .map(|c| (c.path.clone(), kind_name(c.kind)))
            .collect();
        conflicts.sort();
        let part = &files[..k.min(files.len())];
        let (ours, theirs): (Vec<PathBuf>, Vec<PathBuf>) =
            part.iter().cloned().partition(|p| by_block.contains(p));
        let (renamed, theirs): (Vec<PathBuf>, Vec<PathBuf>) =
            theirs.into_iter().partition(|p| direct.contains(p));
        if !theirs.is_empty() {
            let mut opts = self.rsync(None);
            opts.binary = ccfs::sync::find_program("rsync").expect("rsync");
            run_rsync(&opts, o.upper(), o.share(), &theirs).map_err(|e| format!("rsync: {e}"))?;
        }
        // Killed in the renames: every regular file is in its holding directory, the
        // first ones renamed into place.
        if k > files.len() - direct.len() - by_block.len() {
            let mut errors = Vec::new();
            let mut staged = o.stage_files(direct, &mut errors);
            if !errors.is_empty() {
                return Err(format!("stage: {errors:?}"));
            }
            staged.files.truncate(renamed.len());
            let mut sent = ccfs::overlay::FilesSent::default();
            o.put_staged(staged, &mut sent);
            if !sent.errors.is_empty() {
                return Err(format!("put: {:?}", sent.errors));
            }
        }
        for p in &ours {
            o.send_blocks(p, session.block_snapshots.get(p))
                .map_err(|e| format!("send {} by block: {e}", short(p)))?;
        }
        // Killed: nothing settles, nothing is journaled after this point.
        std::mem::forget(session);
        drop(o);
        self.session_ended(w);
        self.tell_looks_kept(model, &looks);
        let rsync_list = &files[..files.len() - direct.len() - by_block.len()];
        let want = model.sync(
            w,
            false,
            Run::CrashAfter(k),
            (rsync_list, direct),
            &self.host,
            &|p| self.dir_ino(p),
        )?;
        if conflicts != want.conflicts {
            return Err(format!(
                "conflicts before the crash: model {:?}, ccfs {conflicts:?}",
                want.conflicts
            ));
        }
        self.learn_dirs(model)
    }

    /// Runs one operation within a session on both sides; they must agree on its success.
    fn apply(&mut self, model: &mut Model, op: &Op) -> Checked {
        let w = op.ws();
        // A program that maps a file ends before another changes its name, or replaces
        // or truncates it (a mapping's write beyond the end would fault).
        match op {
            Op::Write(_, p, ..)
            | Op::Append(_, p, _)
            | Op::Truncate(_, p, _)
            | Op::Unlink(_, p)
            | Op::Rmdir(_, p)
            | Op::Mkdir(_, p)
            | Op::Symlink(_, p, _) => self.unmap(model, w, Some(name(*p)))?,
            Op::Rename(_, a, b) => {
                self.unmap(model, w, Some(name(*a)))?;
                self.unmap(model, w, Some(name(*b)))?;
            }
            _ => {}
        }
        // The looks at the share the harness's calls make (see `World::reachable`, and
        // each change's own look), played on the model first.
        match op {
            Op::Write(_, p, ..)
            | Op::Append(_, p, _)
            | Op::PWrite(_, p, ..)
            | Op::Truncate(_, p, _)
            | Op::Chmod(_, p, _)
            | Op::Backdate(_, p)
            | Op::Xattr(_, p, _)
            | Op::Map(_, p, _) => {
                let reached = model.look_on_the_way(w, name(*p));
                if reached {
                    model.look(w, name(*p));
                }
            }
            Op::Unlink(_, p) | Op::Rmdir(_, p) | Op::Mkdir(_, p) | Op::Symlink(_, p, _) => {
                let reached = model.look_on_the_way(w, name(*p));
                if reached {
                    model.look_unless_kept(w, name(*p));
                }
            }
            Op::Rename(_, a, b) => {
                let reached =
                    model.look_on_the_way(w, name(*a)) && model.look_on_the_way(w, name(*b));
                if reached {
                    model.look_unless_kept(w, name(*a));
                    if !model.ws[w].bases.contains_key(name(*b)) {
                        model.look_unless_kept(w, name(*b));
                    }
                }
            }
            _ => {}
        }
        let (want, got) = match op {
            Op::Write(_, p, b, len) => {
                let data = vec![*b; *len];
                (
                    model.write(w, name(*p), data.clone()),
                    self.write(w, name(*p), &data, At::Start),
                )
            }
            Op::Append(_, p, b) => (
                model.append(w, name(*p), *b),
                self.write(w, name(*p), &[*b], At::End),
            ),
            Op::PWrite(_, p, k, b) => (
                model.pwrite(w, name(*p), pwrite_at(*k), &[*b; 3]),
                self.write(w, name(*p), &[*b; 3], At::Offset(pwrite_at(*k))),
            ),
            Op::Truncate(_, p, c) => {
                let len = CUTS[usize::from(*c) % CUTS.len()];
                let want = model.truncate(w, name(*p), len);
                let got = self.setattr(
                    w,
                    name(*p),
                    SetAttr {
                        size: Some(len),
                        ..Default::default()
                    },
                );
                if got {
                    self.stamp_through(w, name(*p));
                }
                (want, got)
            }
            Op::Map(_, p, b) => {
                let before = self.handle_maps[w].len();
                let got = self.map(w, name(*p), *b);
                let want = model.map(w, name(*p), *b);
                if want && got && self.handle_maps[w].len() > before {
                    model.held_through_ccfs(w, name(*p));
                }
                (want, got)
            }
            Op::Xattr(_, p, v) => (
                model.set_xattr(w, name(*p), *v),
                self.set_xattr(w, name(*p), *v),
            ),
            Op::Unlink(_, p) => (model.unlink(w, name(*p)), self.remove(w, name(*p), false)),
            Op::Mkdir(_, p) => (model.mkdir(w, name(*p)), self.mkdir(w, name(*p))),
            Op::Symlink(_, p, t) => (
                model.symlink(w, name(*p), *t),
                self.symlink(w, name(*p), *t),
            ),
            Op::Rmdir(_, p) => (model.rmdir(w, name(*p)), self.remove(w, name(*p), true)),
            Op::Rename(_, a, b) => (
                model.rename(w, name(*a), name(*b)),
                self.rename(w, name(*a), name(*b)),
            ),
            Op::Chmod(_, p, m) => (
                model.chmod(w, name(*p), *m),
                self.setattr(
                    w,
                    name(*p),
                    SetAttr {
                        mode: Some(*m),
                        ..Default::default()
                    },
                ),
            ),
            Op::Backdate(_, p) => {
                self.backdates += 1;
                let old = SetTime::At {
                    secs: 1_000_000_000 + self.backdates * 1000,
                    nsecs: 0,
                };
                (
                    model.touch(w, name(*p)),
                    self.setattr(
                        w,
                        name(*p),
                        SetAttr {
                            atime: Some(old),
                            mtime: Some(old),
                            ..Default::default()
                        },
                    ),
                )
            }
            _ => unreachable!("sessions are handled by the caller"),
        };
        if want != got {
            return Err(format!(
                "{op:?} on workstation {w}: the model says {}, ccfs {}",
                if want { "it succeeds" } else { "it fails" },
                if got { "succeeded" } else { "failed" }
            ));
        }
        // A racy base of unknown content (see `base_unknown`), learned from ccfs's record.
        let taken = match op {
            Op::Unlink(_, p) => Some(name(*p)),
            Op::Rename(_, _, b) => Some(name(*b)),
            _ => None,
        };
        if let Some(q) = taken.filter(|_| want) {
            let unknown =
                self.overlay(w).lock().state().racy(q) == Some(ccfs::state::Content::Unknown);
            if unknown {
                model.base_unknown(w, q);
            }
        }
        match op {
            Op::Write(_, p, ..)
            | Op::Append(_, p, _)
            | Op::PWrite(_, p, ..)
            | Op::Truncate(_, p, _)
            | Op::Backdate(_, p)
            | Op::Map(_, p, _)
                if want =>
            {
                self.note_mtime(model, w, name(*p))
            }
            _ => Ok(()),
        }
    }

    /// The kernel reaches a path through its parents: each must be a directory.
    fn reachable(&self, w: usize, p: &Path) -> bool {
        let o = self.overlay(w);
        p.ancestors()
            .skip(1)
            .filter(|a| !a.as_os_str().is_empty())
            .all(|a| o.resolve(a).is_ok_and(|f| f.meta.is_dir()))
    }

    fn write(&self, w: usize, p: &Path, data: &[u8], at: At) -> bool {
        if !self.reachable(w, p) {
            return false;
        }
        let o = self.overlay(w);
        let (parent, file) = (p.parent().expect("parent"), p.file_name().expect("name"));
        // As a FUSE request would: an open handle, made ready for writing, written at the
        // end (append), the start (truncated first) or an offset, closed (a file held by
        // block goes through its blocks).
        let opened = match (o.resolve(p), at) {
            (Ok(f), _) if !f.meta.is_file() => return false,
            (Ok(_), At::End) => o.open_file(&ctx(), p, libc::O_WRONLY | libc::O_APPEND),
            (Ok(_), At::Start) => o.open_file(&ctx(), p, libc::O_WRONLY | libc::O_TRUNC),
            (Ok(_), At::Offset(_)) => o.open_file(&ctx(), p, libc::O_WRONLY),
            (Err(_), At::End | At::Offset(_)) => return false,
            (Err(_), At::Start) => o
                .create(&ctx(), parent, file, 0o644, libc::O_WRONLY)
                .and_then(|(_, f, wr)| o.created_file(p, f, wr)),
        };
        let f = match opened {
            Ok(o) => o,
            Err(e) => {
                if std::env::var_os("CCFS_MODEL_DEBUG").is_some() {
                    eprintln!(
                        "write {} on {w}: {e:?} (resolve: {:?})",
                        p.display(),
                        o.resolve(p).map(|f| f.layer)
                    );
                }
                return false;
            }
        };
        {
            let g = match o.file_to_write(&ctx(), &f, || Some(p.to_path_buf())) {
                Ok(g) => g,
                Err(e) => {
                    if std::env::var_os("CCFS_MODEL_DEBUG").is_some() {
                        eprintln!("write {} on {w}: {:?}", p.display(), e.error);
                    }
                    o.close_file(&f);
                    return false;
                }
            };
            let at = match at {
                At::End => g.file().metadata().expect("fstat").len(),
                At::Start => 0,
                At::Offset(o) => o,
            };
            // (A write into a block of a file held by block whose base cannot be read
            // fails: EIO.)
            if o.write_at(&g, data, at).is_err() {
                drop(g);
                o.close_file(&f);
                return false;
            }
        }
        o.close_file(&f);
        drop(f);
        self.stamp_through(w, p);
        true
    }

    /// Gives the file at `p`, just written through workstation `w`'s overlay, this
    /// workstation's clock and an mtime no write gave yet.
    fn stamp_through(&self, w: usize, p: &Path) {
        let o = self.overlay(w);
        if self.skew[w] != 0 {
            // This workstation's clock: every write carries its time.
            let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
            let t = SetTime::At {
                secs: now.as_secs() as i64 + self.skew[w],
                nsecs: i64::from(now.subsec_nanos()),
            };
            let set = SetAttr {
                atime: Some(t),
                mtime: Some(t),
                ..Default::default()
            };
            o.setattr(&ctx(), p, set, None)
                .expect("set this clock's mtime");
        }
        let meta = o.resolve(p).expect("the file just written").meta;
        if let Some((secs, nsecs)) = self.unused_mtime(meta.mtime()) {
            let t = SetTime::At { secs, nsecs };
            let set = SetAttr {
                mtime: Some(t),
                ..Default::default()
            };
            o.setattr(&ctx(), p, set, None)
                .expect("set an unused mtime");
        }
    }

    /// Gives the cache's file at `abs` this workstation's clock and an mtime no write gave
    /// yet, as [`World::write`] does, without ccfs (the kernel stamps a mapping's writes).
    fn stamp_directly(&self, w: usize, abs: &Path) -> Checked {
        let f = fs::File::options()
            .write(true)
            .open(abs)
            .map_err(|e| format!("open {}: {e}", abs.display()))?;
        if self.skew[w] != 0 {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
            let t = Duration::new(
                (now.as_secs() as i64 + self.skew[w]) as u64,
                now.subsec_nanos(),
            );
            f.set_modified(UNIX_EPOCH + t).map_err(|e| format!("{e}"))?;
        }
        let m = f.metadata().map_err(|e| format!("{e}"))?;
        if let Some(t) = self.unused_mtime((m.mtime(), m.mtime_nsec())) {
            f.set_modified(UNIX_EPOCH + Duration::new(t.0 as u64, t.1 as u32))
                .map_err(|e| format!("{e}"))?;
        }
        Ok(())
    }

    /// [`Op::Xattr`], on a file.
    fn set_xattr(&self, w: usize, p: &Path, v: Option<u8>) -> bool {
        if !self.reachable(w, p) {
            return false;
        }
        let o = self.overlay(w);
        if !o.resolve(p).is_ok_and(|f| f.meta.is_file()) {
            return false;
        }
        let n = std::ffi::OsStr::new(XATTR);
        match v {
            Some(v) => o.setxattr(&ctx(), p, n, &[v], 0).is_ok(),
            None => o.removexattr(&ctx(), p, n).is_ok(),
        }
    }

    /// [`Op::Map`].
    fn map(&mut self, w: usize, p: &Path, b: u8) -> bool {
        if !self.reachable(w, p) {
            return false;
        }
        let o = self.overlay(w);
        let len = match o.resolve(p) {
            Ok(f) if f.meta.is_file() && !f.meta.is_empty() => f.meta.len() as usize,
            _ => return false,
        };
        let Ok((f, writer)) = o.open(&ctx(), p, libc::O_RDWR) else {
            return false;
        };
        if o.block_file(p).is_some() {
            // Held by block: no passthrough, the kernel writes the mapping through a
            // handle the daemon serves (msync: an fsync of it).
            drop(f);
            if let Some(wr) = writer {
                o.release_writer(wr);
            }
            return self.map_through_ccfs(w, p, b);
        }
        let mapping = Mapping::of(&f, len).expect("mmap the cache's file");
        drop(f);
        if let Some(wr) = writer {
            o.release_writer(wr);
        }
        mapping.write(b);
        let abs = o.upper().join(p);
        self.stamp_directly(w, &abs).expect("stamp");
        self.maps[w].push(mapping);
        true
    }

    /// A mapping of `p`, held by block, on workstation `w`: its first write.
    fn map_through_ccfs(&mut self, w: usize, p: &Path, b: u8) -> bool {
        let o = self.overlay(w);
        let Ok(f) = o.open_file(&ctx(), p, libc::O_RDWR) else {
            return false;
        };
        let ino = match self.write_through_handle(w, p, &f, b) {
            Some(ino) => ino,
            None => {
                o.close_file(&f);
                return false;
            }
        };
        self.handle_maps[w].push((ino, f));
        true
    }

    /// Writes `b` at the start of the file a handle of `w` has open (at `p`), as a
    /// mapping's page written back and synced; the cache file's inode number.
    fn write_through_handle(&self, w: usize, p: &Path, f: &OpenFile, b: u8) -> Option<u64> {
        let o = self.overlay(w);
        let ino = {
            let g = o.file_to_write(&ctx(), f, || Some(p.to_path_buf())).ok()?;
            o.write_at(&g, &[b], 0).ok()?;
            o.sync_file(&g, false).ok()?;
            g.file().metadata().ok()?.ino()
        };
        self.stamp_through(w, p);
        Some(ino)
    }

    /// The cache file of workstation `w` with inode number `ino`, if any.
    fn cache_file_of(&self, w: usize, ino: u64) -> Option<PathBuf> {
        let upper = self.caches[w].join("upper");
        upper_files(&upper)
            .into_iter()
            .map(|p| upper.join(p))
            .find(|p| fs::symlink_metadata(p).is_ok_and(|m| m.ino() == ino))
    }

    /// [`Op::EditThere`].
    fn edit_there(&mut self, model: &mut Model, p: &Path, b: u8) -> Checked {
        let before = model.share.get(p).map(|e| e.obj.clone());
        let Some(stamp) = model.edit_there(p, b) else {
            return Ok(());
        };
        let Some(Obj::File { data, .. }) = model.share.get(p).map(|e| e.obj.clone()) else {
            return Err("the model's edit left no file".into());
        };
        let at = self.share.join(p);
        let f = fs::OpenOptions::new()
            .write(true)
            .open(&at)
            .map_err(|e| format!("open {} on the share ({before:?}): {e}", short(p)))?;
        std::os::unix::fs::FileExt::write_all_at(&f, &data[..1], 0)
            .map_err(|e| format!("write {} on the share: {e}", short(p)))?;
        drop(f);
        self.stamp_directly_share(&at)?;
        let m = fs::symlink_metadata(&at).map_err(|e| format!("{e}"))?;
        self.record_stamp(model, stamp, (m.mtime(), m.mtime_nsec()));
        Ok(())
    }

    /// [`Op::AttrThere`].
    fn attr_there(&mut self, model: &mut Model, p: &Path, b: u8) -> Checked {
        let Some(v) = model.attr_there(p, b) else {
            return Ok(());
        };
        let at = self.share.join(p);
        ccfs::sys::lsetxattr(&at, std::ffi::OsStr::new(XATTR), &[v], 0)
            .map_err(|e| format!("setfattr {} on the share: {e}", short(p)))
    }

    /// Gives the share's file at `abs` an mtime no write gave yet (the server's clock
    /// stamps an edit there; two in one tick would share one).
    fn stamp_directly_share(&self, abs: &Path) -> Checked {
        let f = fs::File::options()
            .write(true)
            .open(abs)
            .map_err(|e| format!("open {}: {e}", abs.display()))?;
        let m = f.metadata().map_err(|e| format!("{e}"))?;
        if let Some(t) = self.unused_mtime((m.mtime(), m.mtime_nsec())) {
            f.set_modified(UNIX_EPOCH + Duration::new(t.0 as u64, t.1 as u32))
                .map_err(|e| format!("{e}"))?;
        }
        Ok(())
    }

    /// [`Op::MapWrite`].
    fn map_write(&mut self, model: &mut Model, w: usize, b: u8) -> Checked {
        let upper = self.caches[w].join("upper");
        for (ino, f) in &self.handle_maps[w] {
            let abs = self
                .cache_file_of(w, *ino)
                .ok_or("a file mapped through the daemon is gone from the cache")?;
            let p = abs.strip_prefix(&upper).map_err(|e| format!("{e}"))?;
            if self.write_through_handle(w, p, f, b).is_none() {
                return Err(format!("a mapping's write to {} failed", short(p)));
            }
        }
        for m in &self.maps[w] {
            m.write(b);
            let abs = self
                .cache_file_of(w, m.ino)
                .ok_or("a mapped file is gone from the cache")?;
            self.stamp_directly(w, &abs)?;
        }
        model.map_write(w, b);
        let held: Vec<PathBuf> = model.ws[w].held.iter().cloned().collect();
        for h in held {
            self.note_mtime(model, w, &h)?;
        }
        Ok(())
    }

    /// The programs holding mappings of `w`'s files at or below `p` end (all: None),
    /// in the harness and the model.
    fn unmap(&mut self, model: &mut Model, w: usize, p: Option<&Path>) -> Checked {
        let inos: Vec<u64> = match p {
            None => self.maps[w]
                .iter()
                .map(|m| m.ino)
                .chain(self.handle_maps[w].iter().map(|(ino, _)| *ino))
                .collect(),
            Some(p) => {
                let mut inos = Vec::new();
                for h in model.ws[w].held.iter().filter(|h| h.starts_with(p)) {
                    let at = self.caches[w].join("upper").join(h);
                    let m = fs::symlink_metadata(&at).map_err(|e| {
                        format!(
                            "the model holds a mapping of {}, the cache has no file there: {e}",
                            short(h)
                        )
                    })?;
                    inos.push(m.ino());
                }
                inos
            }
        };
        self.maps[w].retain(|m| !inos.contains(&m.ino));
        let (ended, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.handle_maps[w])
            .into_iter()
            .partition(|(ino, _)| inos.contains(ino));
        self.handle_maps[w] = kept;
        if let Some(o) = &self.overlays[w] {
            for (_, f) in &ended {
                o.close_file(f);
            }
        }
        model.unmap(w, p);
        Ok(())
    }

    /// None when no write gave `t` yet (it is taken now), else the first mtime after it
    /// that none did (taken now).
    fn unused_mtime(&self, t: (i64, i64)) -> Option<(i64, i64)> {
        let mut used = self.mtimes.borrow_mut();
        if used.insert(t) {
            return None;
        }
        let mut next = t;
        while used.contains(&next) {
            next.1 += 1000;
            if next.1 >= 1_000_000_000 {
                next = (next.0 + 1, next.1 - 1_000_000_000);
            }
        }
        used.insert(next);
        Some(next)
    }

    fn remove(&self, w: usize, p: &Path, dir: bool) -> bool {
        if !self.reachable(w, p) {
            return false;
        }
        let (parent, file) = (p.parent().expect("parent"), p.file_name().expect("name"));
        let o = self.overlay(w);
        if dir {
            o.rmdir(parent, file).is_ok()
        } else {
            o.unlink(parent, file).is_ok()
        }
    }

    fn mkdir(&self, w: usize, p: &Path) -> bool {
        if !self.reachable(w, p) {
            return false;
        }
        let (parent, file) = (p.parent().expect("parent"), p.file_name().expect("name"));
        let c = Ctx { umask: 0, ..ctx() };
        self.overlay(w).mkdir(&c, parent, file, 0o755).is_ok()
    }

    fn symlink(&self, w: usize, p: &Path, t: u8) -> bool {
        if !self.reachable(w, p) {
            return false;
        }
        let (parent, file) = (p.parent().expect("parent"), p.file_name().expect("name"));
        self.overlay(w)
            .symlink(&ctx(), parent, file, &link_target(t))
            .is_ok()
    }

    fn rename(&self, w: usize, from: &Path, to: &Path) -> bool {
        if !self.reachable(w, from) || !self.reachable(w, to) {
            return false;
        }
        self.overlay(w)
            .rename(
                &ctx(),
                from.parent().expect("parent"),
                from.file_name().expect("name"),
                to.parent().expect("parent"),
                to.file_name().expect("name"),
                0,
            )
            .is_ok()
    }

    /// chmod or utimens of a file (the model's operations change files only).
    fn setattr(&self, w: usize, p: &Path, attr: SetAttr) -> bool {
        if !self.reachable(w, p) {
            return false;
        }
        let o = self.overlay(w);
        match o.resolve(p) {
            Ok(f) if f.meta.is_file() => o.setattr(&ctx(), p, attr, None).is_ok(),
            _ => false,
        }
    }

    /// The share and every logged-in workstation's view equal the model's.
    fn compare(&self, model: &mut Model) -> Checked {
        self.compare_views(model)?;
        model.views_looked();
        // (Its reads held the bases of files held by block open.)
        self.learn_blocks(model)
    }

    /// The model's object as compared, with the mtime the harness gave its version.
    fn node(&self, o: &Obj) -> Result<Node, String> {
        match o {
            Obj::File {
                data,
                mode,
                stamp,
                xattr,
            } => {
                let t = self.stamp_mtimes.borrow().get(stamp).copied();
                if t.is_none() {
                    return Err(format!("the harness gave version {stamp} no mtime"));
                }
                Ok(Node::File(
                    data.clone(),
                    *mode,
                    When(t),
                    xattr.map(|v| vec![v]),
                ))
            }
            Obj::Dir => Ok(Node::Dir),
            Obj::Link(t) => Ok(Node::Link(link_target(*t))),
        }
    }

    /// Notes the mtime the version `w`'s cache holds at `p` has (just written there).
    fn note_mtime(&self, model: &mut Model, w: usize, p: &Path) -> Checked {
        let Some(Obj::File { stamp, .. }) = model.ws[w].upper.get(p) else {
            return Ok(());
        };
        let stamp = *stamp;
        let m = fs::symlink_metadata(self.caches[w].join("upper").join(p))
            .map_err(|e| format!("the cache's {} after a write: {e}", short(p)))?;
        self.record_stamp(model, stamp, (m.mtime(), m.mtime_nsec()));
        Ok(())
    }

    /// The mtime version `stamp` got; the model learns whether the share keeps it exactly.
    fn record_stamp(&self, model: &mut Model, stamp: u64, t: (i64, i64)) {
        self.stamp_mtimes.borrow_mut().insert(stamp, t);
        if self.whole_seconds {
            model
                .stamp_seconds
                .get_or_insert_with(Default::default)
                .insert(stamp, t.0);
        }
    }

    fn compare_views(&self, model: &Model) -> Checked {
        let want: Tree = model
            .share
            .iter()
            .map(|(p, e)| Ok((p.clone(), self.node(&e.obj)?)))
            .collect::<Result<_, String>>()?;
        let mut got = share_tree(&self.share);
        // A sync killed while it renamed the files it sends itself leaves the others in
        // their holding directories until that workstation's next sync cleans them up.
        if model.ws.iter().any(|ws| !ws.sending.is_empty()) {
            got.retain(|p, _| !in_holding_dir(p));
        }
        if want != got {
            return Err(format!(
                "the share differs from the model:\n{}",
                diff(&want, &got)
            ));
        }
        for (w, o) in self.overlays.iter().enumerate() {
            let Some(o) = o else { continue };
            let want = if model.share_down(w) {
                match model.view_while_down(w) {
                    Some(v) => v,
                    None if overlay_view(o).is_err() => continue,
                    None => {
                        return Err(format!(
                            "workstation {w} shows its root while the share is down and the cache lacks it"
                        ))
                    }
                }
            } else {
                model.view(w)
            };
            let unreadable = model.unreadable(w);
            let want: Tree = want
                .iter()
                .map(|(p, o)| match unreadable.contains(p) {
                    true => Ok((p.clone(), Node::Unreadable)),
                    false => Ok((p.clone(), self.node(o)?)),
                })
                .collect::<Result<_, String>>()?;
            let got = overlay_view(o)?;
            if want != got {
                return Err(format!(
                    "workstation {w} shows other than the model:\n{}",
                    diff(&want, &got)
                ));
            }
        }
        Ok(())
    }
}

/// A version the session holds to send: path, content, mode, `user.x`.
type Version = (PathBuf, Vec<u8>, u32, Option<Vec<u8>>);

/// The design's promises around one sync, checked from what ccfs itself records (its
/// journal's dirty paths and deletions, the cache's files), not from the model.
struct Promises {
    before: Tree,
    /// Paths the sync may change on the share: dirty or deleted in the session.
    ours: BTreeSet<PathBuf>,
    /// The session's versions to send.
    versions: Vec<Version>,
}

impl Promises {
    fn before(world: &World, o: &Overlay) -> Self {
        let (ours, dirty) = {
            let inner = o.lock();
            let state = inner.state();
            let ours: BTreeSet<PathBuf> = state.dirty().chain(state.whiteouts()).cloned().collect();
            let dirty: Vec<PathBuf> = state.dirty().cloned().collect();
            (ours, dirty)
        };
        let mut versions = Vec::new();
        for p in dirty {
            let at = o.upper().join(&p);
            if let Ok(m) = fs::symlink_metadata(&at) {
                // (A file held by block whose missing blocks cannot be read has no
                // version of its own to keep but its blocks: see `kept`.)
                if let (true, Ok(data)) = (m.is_file(), read_through(o, &p)) {
                    let x = xattr_of(|n| ccfs::sys::lgetxattr(&at, n));
                    versions.push((p, data, m.mode() & 0o7777, x));
                }
            }
        }
        Promises {
            before: share_tree(&world.share),
            ours,
            versions,
        }
    }

    /// Nothing the sync was not asked to change changed on the share, and every version
    /// the session held is on the share (at its path or in a conflict copy of it) or
    /// still in the cache, to be sent.
    fn kept(&self, world: &World, o: &Overlay) -> Checked {
        let after = share_tree(&world.share);
        for (p, n) in &self.before {
            // (What a sync killed earlier left in a holding directory is the sync's own.)
            if !self.ours.contains(p) && after.get(p) != Some(n) && !in_holding_dir(p) {
                return Err(format!(
                    "the sync changed {} on the share, which the session neither changed nor deleted: {} -> {:?}",
                    short(p),
                    brief(n),
                    after.get(p).map(brief)
                ));
            }
        }
        // Read as the view reads it (a file held by block has holes where its base's
        // bytes are); one whose base cannot be read now (the share does not answer) is
        // its blocks, which the cache keeps.
        let cache_has = |p: &Path, data: &[u8]| {
            let (dirty, partial) = {
                let inner = o.lock();
                (
                    inner.state().is_dirty(p),
                    inner.state().partial(p).is_some(),
                )
            };
            dirty
                && match read_through(o, p) {
                    Ok(d) => d == data,
                    Err(_) => partial,
                }
        };
        let cached = upper_files(o.upper());
        for (p, data, mode, x) in &self.versions {
            let want = Node::File(data.clone(), *mode, When(None), x.clone());
            let on_share = after.get(p) == Some(&want)
                || after
                    .iter()
                    .any(|(c, n)| n == &want && is_set_aside(p, c, &world.host));
            let in_cache = cache_has(p, data)
                || cached
                    .iter()
                    .any(|c| is_set_aside(p, c, &world.host) && cache_has(c, data))
                || kept_by_block(o, p);
            if !on_share && !in_cache {
                return Err(format!(
                    "lost: the session's version of {} ({data:?}) is neither on the share nor in a conflict copy nor in the cache",
                    short(p)
                ));
            }
        }
        Ok(())
    }
}

/// Whether the cache keeps `p`, held by block, out of the view (`kept/HOST-STAMP/p`,
/// a conflict whose missing blocks could not be read any more).
fn kept_by_block(o: &Overlay, p: &Path) -> bool {
    let Some(cache) = o.upper().parent() else {
        return false;
    };
    fs::read_dir(cache.join("kept")).is_ok_and(|dirs| {
        dirs.flatten()
            .any(|d| fs::symlink_metadata(d.path().join(p)).is_ok_and(|m| m.is_file()))
    })
}

fn same_report(what: &str, r: &SyncReport, want: &Outcome) -> Checked {
    let mut conflicts: Vec<(PathBuf, String)> = r
        .conflicts
        .iter()
        .map(|c| (c.path.clone(), kind_name(c.kind)))
        .collect();
    conflicts.sort();
    let got = Outcome {
        conflicts,
        not_sent: r.not_sent.clone(),
        ok: r.ok,
        remaining_dirty: r.remaining_dirty,
        remaining_deletions: r.remaining_deletions,
        cache_dropped: r.cache_dropped,
    };
    if &got != want {
        return Err(format!(
            "{what} reported other than the model predicts:\n  model {want:?}\n  ccfs  {got:?}\n  errors {:?}",
            r.errors
        ));
    }
    Ok(())
}

static CASES: AtomicUsize = AtomicUsize::new(0);
static FAILED: AtomicBool = AtomicBool::new(false);

/// Plays `ops` on two workstations over a share holding `initial` (path index, byte: a
/// directory when the byte is a multiple of 3, else a file of `byte % 4` bytes, of two or
/// three blocks from 200 on), with these clock offsets;
/// at the end every workstation logs out and the share must equal the model.
///
/// Files are held by block from their first byte on, as large files are where ccfs holds
/// them by block, unless `CCFS_MODEL_BY_BLOCK=0` (then every file is copied whole).
pub fn run_sessions(
    initial: Vec<(usize, u8)>,
    skew: [i64; 2],
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let by_block = std::env::var_os("CCFS_MODEL_BY_BLOCK").is_none_or(|v| v != "0");
    run_sessions_as(by_block, initial, skew, ops)
}

/// [`run_sessions`], files held by block or not as `by_block` says.
pub fn run_sessions_as(
    by_block: bool,
    initial: Vec<(usize, u8)>,
    skew: [i64; 2],
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let case = CASES.fetch_add(1, Ordering::Relaxed) + 1;
    let result = play(initial, skew, by_block, &ops);
    if let Err(e) = &result {
        if !FAILED.swap(true, Ordering::Relaxed) {
            eprintln!("sessions model: case {case} is the first to fail: {e}");
        }
    }
    result.map_err(TestCaseError::fail)
}

fn play(
    initial: Vec<(usize, u8)>,
    skew: [i64; 2],
    by_block: bool,
    ops: &[Op],
) -> Result<(), String> {
    let mut world = World::new(skew, by_block);
    let mut model = Model::new(WORKSTATIONS);
    for (i, b) in initial {
        let p = name(i);
        let parent_dir = model
            .share
            .get(p.parent().expect("parent"))
            .is_some_and(|e| e.obj.is_dir());
        if !parent_dir || model.share.contains_key(p) {
            continue;
        }
        let at = world.share.join(p);
        if b % 3 == 0 {
            fs::create_dir(&at).expect("mkdir on the share");
            model.put_on_share(p, Obj::Dir);
        } else {
            // (From 200: a file of two or three blocks.)
            let len = match b {
                200.. => [5000, 9000][usize::from(b % 2)],
                _ => usize::from(b % 4),
            };
            let data = vec![b % 3 + 1; len];
            fs::write(&at, &data).expect("write on the share");
            fs::set_permissions(&at, fs::Permissions::from_mode(0o644)).expect("chmod");
            let m = fs::symlink_metadata(&at).expect("stat on the share");
            if let Some(t) = world.unused_mtime((m.mtime(), m.mtime_nsec())) {
                let f = fs::File::options().write(true).open(&at).expect("open");
                f.set_modified(UNIX_EPOCH + Duration::new(t.0 as u64, t.1 as u32))
                    .expect("set the mtime");
            }
            let stamp = model.stamp();
            let m = fs::symlink_metadata(&at).expect("stat on the share");
            world.record_stamp(&mut model, stamp, (m.mtime(), m.mtime_nsec()));
            model.put_on_share(
                p,
                Obj::File {
                    data,
                    mode: 0o644,
                    stamp,
                    xattr: None,
                },
            );
        }
    }
    world.learn_dirs(&mut model)?;
    for (step, op) in ops.iter().enumerate() {
        let at = |e: String| format!("step {step} ({op:?}): {e}");
        let w = op.ws();
        // A mapping's program writes and ends whether a session runs or not.
        let outside = matches!(
            op,
            Op::MapWrite(..) | Op::Unmap(_) | Op::EditThere(..) | Op::AttrThere(..)
        );
        if !model.mounted(w) && !outside {
            world.login(&mut model, w).map_err(at)?;
        }
        match op {
            Op::MapWrite(_, b) => world.map_write(&mut model, w, *b),
            Op::EditThere(p, b) => world.edit_there(&mut model, name(*p), *b),
            Op::AttrThere(p, b) => world.attr_there(&mut model, name(*p), *b),
            Op::Unmap(_) => world.unmap(&mut model, w, None),
            Op::Fill(_) => {
                world.overlay(w).fill_blocks(u64::MAX, Duration::ZERO);
                Ok(())
            }
            Op::Sync(_) => world.sync(&mut model, w, SyncMode::Session, None),
            Op::FailSync(_, k, logout) => {
                let mode = if *logout {
                    SyncMode::Logout
                } else {
                    SyncMode::Session
                };
                world.sync(&mut model, w, mode, Some(*k))
            }
            Op::Logout(_) => world.sync(&mut model, w, SyncMode::Logout, None),
            Op::Crash(_) => {
                world.overlays[w] = None;
                world.session_ended(w);
                model.crash(w);
                Ok(())
            }
            Op::CrashInSync(_, k) => world.crash_in_sync(&mut model, w, *k),
            Op::ShareDown(_) | Op::ShareUp(_) => {
                let down = matches!(op, Op::ShareDown(_));
                world.overlay(w).share_gate().set_closed(down);
                model.set_share_down(w, down);
                Ok(())
            }
            other => world.apply(&mut model, other),
        }
        .map_err(at)?;
        world.note_looks(&mut model);
        model.look_at_clean_copies();
        world.compare(&mut model).map_err(at)?;
    }
    for w in 0..WORKSTATIONS {
        let at = |e: String| format!("final logout of workstation {w}: {e}");
        // The programs end first: the last logout sends everything.
        world.unmap(&mut model, w, None).map_err(at)?;
        if !model.mounted(w) {
            world.login(&mut model, w).map_err(at)?;
        }
        world
            .sync(&mut model, w, SyncMode::Logout, None)
            .map_err(at)?;
        model.look_at_clean_copies();
        world.compare(&mut model).map_err(at)?;
    }
    Ok(())
}
