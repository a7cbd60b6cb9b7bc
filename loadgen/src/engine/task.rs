//! A client as resumable units of work: its cursors (write a list, unlink a list, walk a
//! tree, sync), the worker's buffers and histograms, and the timed calls to the store.

use std::collections::{HashSet, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::{ClientResult, Config, Latencies, Op, DIRECT_ALIGN};
use crate::store::{Handle, Kind, Store};
use crate::workload::{Action, Entry, ListId, Lists, Step};

/// A directory a walk is in.
#[derive(Debug)]
pub(super) struct Frame {
    pub(super) dir: PathBuf,
    pub(super) files: Vec<String>,
    pub(super) subdirs: Vec<String>,
    /// The next subdirectory to go into.
    pub(super) next: usize,
    /// Bottom-up walks: the next file, then subdirectory, to stat or remove.
    pub(super) post: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WalkKind {
    Read,
    Stat,
    Delete,
}

/// What a client is doing, resumable one unit at a time.
#[derive(Debug)]
pub(super) enum Cursor {
    Write {
        root: PathBuf,
        list: ListId,
        unlink: bool,
        read_first: bool,
        /// Write over each file from its start (no append, no truncation).
        overwrite: bool,
        next: usize,
        made_root: bool,
        seen: HashSet<String>,
    },
    Unlink {
        root: PathBuf,
        list: ListId,
        next: usize,
    },
    Walk {
        kind: WalkKind,
        root: PathBuf,
        started: bool,
        /// Top-down reads: the files of the directory just listed, still to read.
        pending: VecDeque<PathBuf>,
        frames: Vec<Frame>,
        /// Remove the root too (cleanup).
        remove_root: bool,
    },
    /// A sync of the run directory's filesystem; true once done.
    Sync(bool),
}

/// One client.
pub(super) struct Task {
    /// Its number among this host's clients.
    pub(super) id: usize,
    pub(super) store: Option<Store>,
    pub(super) jobs: VecDeque<Cursor>,
    pub(super) cur: Option<Cursor>,
    pub(super) result: ClientResult,
    pub(super) started: bool,
    pub(super) done: bool,
}

/// A worker's own buffer and histograms.
pub(super) struct Worker {
    /// What writes send: the run's data, never written into (reads go to `rbuf`), so a
    /// file's bytes do not depend on what the worker read before.
    pub(super) buf: Aligned,
    pub(super) rbuf: Aligned,
    pub(super) lat: Latencies,
}

/// A buffer that starts on a [`DIRECT_ALIGN`] boundary (O_DIRECT needs it).
pub(super) struct Aligned {
    pub(super) raw: Vec<u8>,
    pub(super) start: usize,
    pub(super) len: usize,
}

impl Aligned {
    pub(super) fn new(data: &[u8]) -> Self {
        let mut raw = vec![0u8; data.len() + DIRECT_ALIGN];
        let start = raw.as_ptr().align_offset(DIRECT_ALIGN).min(DIRECT_ALIGN);
        raw[start..start + data.len()].copy_from_slice(data);
        Self {
            raw,
            start,
            len: data.len(),
        }
    }
}

impl std::ops::Deref for Aligned {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for Aligned {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

/// What a unit of work needs.
pub(super) struct Ctx<'a> {
    pub(super) cfg: &'a Config,
    pub(super) lists: &'a Lists,
    pub(super) worker: &'a mut Worker,
    pub(super) progress: &'a AtomicU64,
}

pub(super) fn timed<T>(
    lat: &mut Latencies,
    op: Op,
    f: impl FnOnce() -> io::Result<T>,
) -> io::Result<T> {
    let t = Instant::now();
    let r = f();
    lat.record(op, t.elapsed());
    r
}

/// Times a call that may fail as expected (`ok_if`): a success goes to `op`, the expected
/// failure to [`Op::Failed`]; returns whether it succeeded.
pub(super) fn tolerant(
    lat: &mut Latencies,
    op: Op,
    ok_if: impl Fn(&io::Error) -> bool,
    f: impl FnOnce() -> io::Result<()>,
) -> io::Result<bool> {
    let t = Instant::now();
    let r = f();
    let d = t.elapsed();
    match r {
        Ok(()) => {
            lat.record(op, d);
            Ok(true)
        }
        Err(e) if ok_if(&e) => {
            lat.record(Op::Failed, d);
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

pub(super) fn exists(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::AlreadyExists
}

pub(super) fn missing(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
}

pub(super) fn with_path(e: io::Error, p: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", p.display()))
}

impl Task {
    pub(super) fn client_dir(cfg: &Config, id: usize) -> PathBuf {
        cfg.run_dir.join(format!("client-{}", cfg.client_base + id))
    }

    pub(super) fn tree(cfg: &Config, id: usize, tree: u32) -> PathBuf {
        Self::client_dir(cfg, id).join(format!("kernel-{tree}"))
    }

    pub(super) fn cursor(cfg: &Config, id: usize, clients: usize, step: &Step) -> Cursor {
        let own = Self::tree(cfg, id, step.tree);
        let walk = |kind, root| Cursor::Walk {
            kind,
            root,
            started: false,
            pending: VecDeque::new(),
            frames: Vec::new(),
            remove_root: false,
        };
        match step.action {
            Action::Write {
                list,
                unlink,
                read_first,
            } => Cursor::Write {
                root: own,
                list,
                unlink,
                read_first,
                overwrite: false,
                next: 0,
                made_root: false,
                seen: HashSet::new(),
            },
            Action::Overwrite { list } => Cursor::Write {
                root: own,
                list,
                unlink: false,
                read_first: false,
                overwrite: true,
                next: 0,
                // The tree is there.
                made_root: true,
                seen: HashSet::new(),
            },
            Action::Unlink { list } => Cursor::Unlink {
                root: own,
                list,
                next: 0,
            },
            Action::Read | Action::Stat => {
                let root = if cfg.read_other && clients > 1 {
                    Self::tree(cfg, (id + 1) % clients, step.tree)
                } else {
                    own
                };
                let kind = if step.action == Action::Read {
                    WalkKind::Read
                } else {
                    WalkKind::Stat
                };
                walk(kind, root)
            }
            Action::Delete => walk(WalkKind::Delete, own),
        }
    }

    /// Does one unit of work; false when the job list is done.
    pub(super) fn unit(&mut self, ctx: &mut Ctx) -> io::Result<bool> {
        loop {
            if self.cur.is_none() {
                self.cur = self.jobs.pop_front();
            }
            let Some(mut cur) = self.cur.take() else {
                return Ok(false);
            };
            let more = self.step(&mut cur, ctx)?;
            if more {
                self.cur = Some(cur);
                return Ok(true);
            }
            // This job is done; a unit of the next one runs now (a job that had nothing
            // left to do did no work).
            if self.jobs.is_empty() {
                return Ok(false);
            }
        }
    }

    /// One unit of `cur`; false when `cur` had nothing left (and did nothing).
    pub(super) fn step(&mut self, cur: &mut Cursor, ctx: &mut Ctx) -> io::Result<bool> {
        let cfg = ctx.cfg;
        // Connected on first use, by a worker: a thousand clients do not connect in a row.
        let store = self
            .store
            .get_or_insert_with(|| Store::connect(&cfg.target));
        let r = &mut self.result;
        let lat = &mut ctx.worker.lat;
        match cur {
            Cursor::Sync(done) => {
                if *done {
                    return Ok(false);
                }
                *done = true;
                let dir = &cfg.run_dir;
                timed(lat, Op::Sync, || store.syncfs(dir)).map_err(|e| with_path(e, dir))?;
                Ok(true)
            }
            Cursor::Write {
                root,
                list,
                unlink,
                read_first,
                overwrite,
                next,
                made_root,
                seen,
            } => {
                let w = WriteAt {
                    root,
                    list: *list,
                    unlink: *unlink,
                    read_first: *read_first,
                    overwrite: *overwrite,
                    next,
                    made_root,
                    seen,
                };
                write_step(store, r, ctx, w)
            }
            Cursor::Unlink { root, list, next } => {
                let Some(entry) = ctx.lists.get(*list).get(*next) else {
                    return Ok(false);
                };
                *next += 1;
                let p = root.join(&entry.path);
                timed(lat, Op::Unlink, || store.unlink(&p)).map_err(|e| with_path(e, &p))?;
                r.bytes += entry.size;
                r.files += 1;
                ctx.progress.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Cursor::Walk {
                kind,
                root,
                started,
                pending,
                frames,
                remove_root,
            } => {
                let w = WalkAt {
                    kind: *kind,
                    root,
                    started,
                    pending,
                    frames,
                    remove_root,
                };
                walk_step(store, r, ctx, w)
            }
        }
    }
}

/// A write cursor's state, for [`write_step`].
struct WriteAt<'a> {
    root: &'a PathBuf,
    list: ListId,
    unlink: bool,
    read_first: bool,
    overwrite: bool,
    next: &'a mut usize,
    made_root: &'a mut bool,
    seen: &'a mut HashSet<String>,
}

/// One unit of a write cursor: its root made, or the next file of its list written (its
/// directories made first, compilebench's way); false when the list is done.
fn write_step(
    store: &mut Store,
    r: &mut ClientResult,
    ctx: &mut Ctx,
    w: WriteAt<'_>,
) -> io::Result<bool> {
    let (cfg, lat) = (ctx.cfg, &mut ctx.worker.lat);
    if !*w.made_root {
        *w.made_root = true;
        let p = w.root.clone();
        tolerant(lat, Op::Mkdir, exists, || store.mkdir(&p)).map_err(|e| with_path(e, &p))?;
        r.dirs += 1;
        return Ok(true);
    }
    let Some(entry) = ctx.lists.get(w.list).get(*w.next) else {
        return Ok(false);
    };
    *w.next += 1;
    let path = w.root.join(&entry.path);
    if let Some((dname, _)) = entry.path.rsplit_once('/') {
        if !w.seen.contains(dname) {
            let dir = w.root.join(dname);
            r.dirs += makedirs(store, lat, &dir).map_err(|e| with_path(e, &dir))?;
            let mut d = dname;
            loop {
                w.seen.insert(d.to_string());
                match d.rsplit_once('/') {
                    Some((parent, _)) => d = parent,
                    None => break,
                }
            }
        }
    }
    if w.unlink {
        tolerant(lat, Op::Unlink, missing, || store.unlink(&path))
            .map_err(|e| with_path(e, &path))?;
    }
    let how = if w.overwrite {
        Open::Over
    } else if w.read_first {
        Open::ReadFirst
    } else {
        Open::Append
    };
    write_file(store, ctx.worker, cfg, &path, entry, how).map_err(|e| with_path(e, &path))?;
    r.bytes += entry.size;
    r.files += 1;
    ctx.progress.fetch_add(1, Ordering::Relaxed);
    Ok(true)
}

/// A walk cursor's state, for [`walk_step`].
struct WalkAt<'a> {
    kind: WalkKind,
    root: &'a PathBuf,
    started: &'a mut bool,
    pending: &'a mut VecDeque<PathBuf>,
    frames: &'a mut Vec<Frame>,
    remove_root: &'a mut bool,
}

/// One unit of a walk: the root listed, a file read (top-down reads), a directory gone
/// into, a file or directory looked at or removed (bottom-up), the root removed; false
/// when the walk is done.
fn walk_step(
    store: &mut Store,
    r: &mut ClientResult,
    ctx: &mut Ctx,
    w: WalkAt<'_>,
) -> io::Result<bool> {
    let cfg = ctx.cfg;
    let lat = &mut ctx.worker.lat;
    if !*w.started {
        *w.started = true;
        let f = list_dir(store, lat, w.root)?;
        r.dirs += 1;
        if w.kind == WalkKind::Read {
            w.pending.extend(f.files.iter().map(|n| f.dir.join(n)));
        }
        w.frames.push(f);
        return Ok(true);
    }
    let worker = &mut *ctx.worker;
    if w.kind == WalkKind::Read {
        if let Some(p) = w.pending.pop_front() {
            let n = read_file(store, worker, &p, cfg.direct).map_err(|e| with_path(e, &p))?;
            r.bytes += n;
            r.files += 1;
            ctx.progress.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
    }
    let lat = &mut worker.lat;
    while let Some(top) = w.frames.last_mut() {
        if top.next < top.subdirs.len() {
            let sub = top.dir.join(&top.subdirs[top.next]);
            top.next += 1;
            if w.kind == WalkKind::Read {
                // os.walk checks that a subdirectory is no symlink before
                // going in (top-down only).
                let k =
                    timed(lat, Op::Stat, || store.stat(&sub)).map_err(|e| with_path(e, &sub))?;
                r.dirs += 1;
                if k != Kind::Dir {
                    return Ok(true);
                }
            }
            let f = list_dir(store, lat, &sub)?;
            r.dirs += 1;
            if w.kind == WalkKind::Read {
                w.pending.extend(f.files.iter().map(|n| f.dir.join(n)));
            }
            w.frames.push(f);
            return Ok(true);
        }
        if w.kind != WalkKind::Read && top.post < top.files.len() + top.subdirs.len() {
            let i = top.post;
            top.post += 1;
            let (name, is_dir) = if i < top.files.len() {
                (&top.files[i], false)
            } else {
                (&top.subdirs[i - top.files.len()], true)
            };
            let p = top.dir.join(name);
            match (w.kind, is_dir) {
                (WalkKind::Stat, _) => timed(lat, Op::Stat, || store.stat(&p).map(|_| ())),
                (_, false) => timed(lat, Op::Unlink, || store.unlink(&p)),
                (_, true) => timed(lat, Op::Rmdir, || store.rmdir(&p)),
            }
            .map_err(|e| with_path(e, &p))?;
            if is_dir {
                r.dirs += 1;
            } else {
                r.files += 1;
                ctx.progress.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(true);
        }
        w.frames.pop();
    }
    if *w.remove_root {
        *w.remove_root = false;
        let p = w.root.clone();
        timed(lat, Op::Rmdir, || store.rmdir(&p)).map_err(|e| with_path(e, &p))?;
        return Ok(true);
    }
    Ok(false)
}

/// os.makedirs as compilebench calls it: if the parent is missing, make it first (the
/// same way), then mkdir (an existing directory is an expected failure). Returns the
/// directories made.
pub(super) fn makedirs(store: &mut Store, lat: &mut Latencies, dir: &Path) -> io::Result<u64> {
    let mut made = 0;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        let there = tolerant(lat, Op::Stat, missing, || store.stat(parent).map(|_| ()))?;
        if !there {
            made += makedirs(store, lat, parent)?;
        }
    }
    if tolerant(lat, Op::Mkdir, exists, || store.mkdir(dir))? {
        made += 1;
    }
    Ok(made)
}

/// How a file is opened for writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Open {
    /// For appending, created if missing (compilebench's create and compile).
    Append,
    /// For appending, read whole and truncated first (compilebench's patch).
    ReadFirst,
    /// Written over from its start (a stream's rewrite).
    Over,
}

/// compilebench's file write: open for appending (created if missing); with `ReadFirst`
/// read it whole and truncate it; write its size in write-size pieces; close.
pub(super) fn write_file(
    store: &mut Store,
    w: &mut Worker,
    cfg: &Config,
    path: &Path,
    entry: &Entry,
    how: Open,
) -> io::Result<()> {
    let lat = &mut w.lat;
    let read_first = how == Open::ReadFirst;
    let mut h = timed(lat, Op::Open, || match how {
        Open::Over => store.open_over(path, cfg.direct),
        _ => store.open_append(path, read_first, cfg.direct),
    })?;
    if read_first {
        read_to_end(store, w, &mut h)?;
        timed(&mut w.lat, Op::Truncate, || store.truncate(&mut h))?;
    }
    let lat = &mut w.lat;
    let piece = (w.buf.len() / 2).max(1);
    // Direct I/O takes its pieces at block-aligned places of the (aligned) buffer.
    let align = if cfg.direct { DIRECT_ALIGN } else { 1 };
    let mut at = entry.path.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }) as usize
        % piece;
    at -= at % align;
    let mut left = entry.size;
    while left > 0 {
        let n = left.min(piece as u64) as usize;
        let data = &w.buf[at..at + n];
        at = (at + 4099) % piece;
        at -= at % align;
        timed(lat, Op::Write, || store.write(&mut h, data))?;
        left -= n as u64;
    }
    if cfg.fsync {
        timed(lat, Op::Fsync, || store.fsync(&mut h))?;
    }
    timed(lat, Op::Close, || store.close(h))
}

/// Reads an open file to its end in write-size pieces, the read that finds the end timed
/// apart; returns the bytes read.
pub(super) fn read_to_end(store: &mut Store, w: &mut Worker, h: &mut Handle) -> io::Result<u64> {
    let half = w.buf.len() / 2;
    let mut total = 0u64;
    loop {
        let buf = &mut w.rbuf[..half];
        let t = Instant::now();
        let n = store.read(h, buf)?;
        w.lat
            .record(if n == 0 { Op::ReadEof } else { Op::Read }, t.elapsed());
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
    }
}

/// Reads a file whole; returns its bytes.
pub(super) fn read_file(
    store: &mut Store,
    w: &mut Worker,
    path: &Path,
    direct: bool,
) -> io::Result<u64> {
    let mut h = timed(&mut w.lat, Op::Open, || store.open_read(path, direct))?;
    let total = read_to_end(store, w, &mut h)?;
    timed(&mut w.lat, Op::Close, || store.close(h))?;
    Ok(total)
}

pub(super) fn list_dir(store: &mut Store, lat: &mut Latencies, dir: &Path) -> io::Result<Frame> {
    let entries = timed(lat, Op::Readdir, || store.readdir(dir)).map_err(|e| with_path(e, dir))?;
    let mut files = Vec::new();
    let mut subdirs = Vec::new();
    for (name, kind) in entries {
        if kind == Kind::Dir {
            subdirs.push(name);
        } else {
            files.push(name);
        }
    }
    Ok(Frame {
        dir: dir.to_path_buf(),
        files,
        subdirs,
        next: 0,
        post: 0,
    })
}
