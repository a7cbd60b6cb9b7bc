//! The crash-safe record of unsynced work, kept in the cache directory.
//!
//! An append-only text file, one [`Record`] a line, each line carrying a checksum. A
//! record is durable (`fdatasync`) before the change it describes is made in the cache
//! (write-ahead), or, where a crash in between loses nothing (see [`Journal::write`]),
//! before the change is answered. A torn or corrupt tail ends the replay. Compaction
//! writes the current state to a new file and renames it over the old one.
//!
//! Group commit ([`Durability`]): a change waiting for its records to be durable waits
//! without the overlay's lock, and one `fdatasync` serves every record written before it
//! began, so changes of several programs share it instead of queueing for one each.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::locks::Locked;
use crate::state::{Content, Origin, OverlayState, Record, Sent, ShareId};

fn fnv1a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// Escapes a path so it holds no space, newline or backslash: `\xHH` for those bytes and
/// for anything outside printable ASCII.
pub fn escape(path: &Path) -> String {
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_graphic() && b != b'\\' {
            out.push(b as char);
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

pub fn unescape(text: &str) -> Option<PathBuf> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            let hex = bytes.get(i + 2..i + 4)?;
            if bytes.get(i + 1) != Some(&b'x') {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(PathBuf::from(
        <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out),
    ))
}

/// One record as a line body (without checksum and newline).
fn body(record: &Record) -> String {
    match record {
        Record::Dirty(p) => format!("D {}", escape(p)),
        Record::Origin(p, o) => format!("O {} {} {}", escape(p), o.dev, o.ino),
        Record::Base(p, Some(b)) => format!(
            "B {} {} {} {} {} {} {}",
            escape(p),
            b.ino,
            b.size,
            b.mtime.0,
            b.mtime.1,
            b.ctime.0,
            b.ctime.1
        ),
        Record::Base(p, None) => format!("N {}", escape(p)),
        Record::Delete { path, whiteout } => {
            format!("{} {}", if *whiteout { "X" } else { "R" }, escape(path))
        }
        Record::Rename { from, to } => format!("M {} {}", escape(from), escape(to)),
        Record::Clean(p) => format!("C {}", escape(p)),
        Record::Deleted(p) => format!("W {}", escape(p)),
        Record::Sending(p, Some(t)) => match t.since {
            Some(since) => format!(
                "S {} {} {} {} {} {}",
                escape(p),
                t.size,
                t.mtime.0,
                t.mtime.1,
                since.0,
                since.1
            ),
            None => format!("S {} {} {} {}", escape(p), t.size, t.mtime.0, t.mtime.1),
        },
        Record::Sending(p, None) => format!("S {}", escape(p)),
        Record::SyncEnd => "E .".to_string(),
        Record::Forget(p) => format!("F {}", escape(p)),
        // (`H`: a mark of the bytes alone, as earlier versions wrote them.)
        Record::Racy(p, Content::Unknown) => format!("A {} -", escape(p)),
        Record::Racy(p, Content::Sha256(d)) => format!("A {} {}", escape(p), hex(d)),
        Record::Racy(p, Content::Bytes(d)) => format!("H {} {}", escape(p), hex(d)),
        Record::Partial(p, limit) => format!("P {} {limit}", escape(p)),
        Record::Blocks {
            path,
            changed,
            blocks,
        } => format!(
            "K {} {} {}",
            escape(path),
            if *changed { "w" } else { "f" },
            blocks.encode()
        ),
        Record::Whole(p) => format!("Z {}", escape(p)),
    }
}

fn hex(d: &[u8; 32]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn encode(record: &Record) -> String {
    let b = body(record);
    format!("{:08x} {}\n", fnv1a(b.as_bytes()), b)
}

fn parse_body(b: &str) -> Option<Record> {
    let mut it = b.split(' ');
    let op = it.next()?;
    let path = unescape(it.next()?)?;
    let rec = match op {
        "D" => Record::Dirty(path),
        "O" => Record::Origin(
            path,
            Origin {
                dev: it.next()?.parse().ok()?,
                ino: it.next()?.parse().ok()?,
            },
        ),
        "B" => {
            let ino: u64 = it.next()?.parse().ok()?;
            let size: u64 = it.next()?.parse().ok()?;
            let mut num = || it.next().and_then(|v| v.parse::<i64>().ok());
            let (ms, mn, cs, cn) = (num()?, num()?, num()?, num()?);
            Record::Base(
                path,
                Some(ShareId {
                    ino,
                    size,
                    mtime: (ms, mn),
                    ctime: (cs, cn),
                }),
            )
        }
        "N" => Record::Base(path, None),
        "X" => Record::Delete {
            path,
            whiteout: true,
        },
        "R" => Record::Delete {
            path,
            whiteout: false,
        },
        "M" => Record::Rename {
            from: path,
            to: unescape(it.next()?)?,
        },
        "C" => Record::Clean(path),
        "W" => Record::Deleted(path),
        "S" => match it.next() {
            None => Record::Sending(path, None),
            Some(size) => Record::Sending(
                path,
                Some(Sent {
                    size: size.parse().ok()?,
                    mtime: (it.next()?.parse().ok()?, it.next()?.parse().ok()?),
                    since: match it.next() {
                        None => None,
                        Some(secs) => Some((secs.parse().ok()?, it.next()?.parse().ok()?)),
                    },
                }),
            ),
        },
        "E" => Record::SyncEnd,
        "F" => Record::Forget(path),
        "A" => Record::Racy(path, parse_content(it.next()?)?),
        "H" => Record::Racy(
            path,
            match parse_content(it.next()?)? {
                Content::Sha256(d) => Content::Bytes(d),
                other => other,
            },
        ),
        "P" => Record::Partial(path, it.next()?.parse().ok()?),
        "K" => Record::Blocks {
            path,
            changed: match it.next()? {
                "w" => true,
                "f" => false,
                _ => return None,
            },
            blocks: crate::extents::Extents::decode(it.next()?)?,
        },
        "Z" => Record::Whole(path),
        _ => return None,
    };
    if it.next().is_some() {
        return None;
    }
    Some(rec)
}

/// A [`Content`] as [`body`] writes it: `-` or 64 hex digits.
fn parse_content(s: &str) -> Option<Content> {
    if s == "-" {
        return Some(Content::Unknown);
    }
    if s.len() != 64 {
        return None;
    }
    let mut d = [0u8; 32];
    for (i, b) in d.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Content::Sha256(d))
}

/// Decodes journal text; stops at the first torn, corrupt or unknown line.
/// Returns the records and the number of bytes that were valid.
pub fn decode(text: &[u8]) -> (Vec<Record>, usize) {
    let mut records = Vec::new();
    let mut valid = 0;
    let mut rest = text;
    while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
        let line = &rest[..nl];
        let Ok(line) = std::str::from_utf8(line) else {
            break;
        };
        let Some((sum, b)) = line.split_once(' ') else {
            break;
        };
        if u32::from_str_radix(sum, 16).ok() != Some(fnv1a(b.as_bytes())) {
            break;
        }
        let Some(rec) = parse_body(b) else {
            break;
        };
        records.push(rec);
        valid += nl + 1;
        rest = &rest[nl + 1..];
    }
    (records, valid)
}

/// The journal file of one cache directory.
///
/// Records are written at `good_len`, the end of the last record known to be whole and
/// durable, never with `O_APPEND`: a write that fails half way (a full cache) leaves a
/// fragment that the next append overwrites, so no record ever sits behind a torn one.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: Arc<File>,
    good_len: u64,
    /// A failed append could not cut its fragment off: cut it before the next write.
    needs_trim: bool,
    durability: Arc<Durability>,
    /// Where the space allocated for the journal ends ([`RESERVE`] past `good_len` once
    /// [`Journal::reserve`] got it).
    reserved_to: u64,
}

/// The room kept allocated past the journal's end, for the records a full cache still
/// needs (a few thousand).
const RESERVE: u64 = 512 << 10;

/// Where a change's records stand in the journal: the count of bytes written to it over
/// its life (not an offset: a compaction does not reset it). Durable once
/// [`Durability::wait`] for it returned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
#[must_use = "a change answers only once its records are durable: wait for the ticket"]
pub struct Ticket(u64);

/// Which written records are on disk, and the one `fdatasync` at a time that makes more of
/// them so (group commit). Shared by the journal (which writes under the overlay's lock)
/// and the changes waiting for their records (which wait without it).
#[derive(Debug)]
pub struct Durability {
    /// Lock order: 8 (ARCHITECTURE.md, Locks), a leaf: the `fdatasync` runs without it.
    state: Mutex<Durable>,
    done: Condvar,
}

#[derive(Debug)]
struct Durable {
    /// The journal's file now (a compaction replaces it).
    file: Arc<File>,
    written: u64,
    /// Everything written up to here is on disk.
    durable: u64,
    /// Where in the file the records written so far end, and the durable ones (what a
    /// power cut would leave of the journal: see the crash tests).
    #[cfg_attr(not(test), allow(dead_code))]
    end: (u64, u64),
    /// An `fdatasync` is under way (by one of the waiters, for all of them).
    syncing: bool,
    /// An `fdatasync` failed (its errno): what was written cannot be known on disk, and
    /// the journal is rewritten whole before the next record (see
    /// [`Journal::needs_rewrite`]).
    failed: Option<i32>,
    /// Counts the files the journal was rewritten to: an `fdatasync` of an older one
    /// says nothing of the file now.
    generation: u64,
}

fn lock_durable(m: &Mutex<Durable>) -> MutexGuard<'_, Durable> {
    m.locked()
}

impl Durability {
    fn new(file: Arc<File>, written: u64) -> Self {
        Durability {
            state: Mutex::new(Durable {
                file,
                written,
                durable: written,
                end: (written, written),
                syncing: false,
                failed: None,
                generation: 0,
            }),
            done: Condvar::new(),
        }
    }

    /// Returns once everything written up to `t` is on disk: at once if it is; else after
    /// the `fdatasync` under way, or one this caller runs for every waiter. An error when
    /// an `fdatasync` failed since the journal was last written whole.
    pub fn wait(&self, t: Ticket) -> io::Result<()> {
        let mut d = lock_durable(&self.state);
        loop {
            if d.durable >= t.0 {
                return Ok(());
            }
            // Not on disk, and after a failed fdatasync not to be trusted to it until the
            // journal is rewritten (a later fdatasync may not report the lost pages again,
            // and a record behind a lost one is cut off at replay).
            if let Some(errno) = d.failed {
                return Err(io::Error::from_raw_os_error(errno));
            }
            if d.syncing {
                d = crate::locks::wait(&self.done, d);
                continue;
            }
            d = self.sync_locked(d);
        }
    }

    /// One `fdatasync` covering everything written so far, after the one under way if any
    /// (never two at once: the kernel reports a failed write-back to one `fdatasync` of a
    /// file only, and a second one at the same time could then count that write-back as
    /// done). For a writer that must have its record on disk before it goes on.
    fn sync_now(&self) -> io::Result<()> {
        let mut d = lock_durable(&self.state);
        while d.syncing {
            d = crate::locks::wait(&self.done, d);
        }
        d = self.sync_locked(d);
        match d.failed {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => Ok(()),
        }
    }

    /// Runs the `fdatasync` (no other under way) without holding the lock, and records what
    /// it came to: more on disk, or a failure that stands until the journal is rewritten.
    /// A result for a file a compaction replaced meanwhile counts for nothing.
    fn sync_locked<'a>(&'a self, mut d: MutexGuard<'a, Durable>) -> MutexGuard<'a, Durable> {
        d.syncing = true;
        let (target, end, generation) = (d.written, d.end.0, d.generation);
        let file = d.file.clone();
        drop(d);
        let synced = file.sync_data();
        let mut d = lock_durable(&self.state);
        d.syncing = false;
        if d.generation == generation {
            match synced {
                Ok(()) if d.failed.is_none() && target > d.durable => {
                    d.durable = target;
                    d.end.1 = end;
                }
                Ok(()) => {}
                Err(e) => {
                    tracing::error!("the journal's fdatasync failed: {e}");
                    d.failed = Some(e.raw_os_error().unwrap_or(libc::EIO));
                }
            }
        }
        self.done.notify_all();
        d
    }

    /// Whether everything written up to `t` is on disk now (without waiting or syncing).
    pub fn is_durable(&self, t: Ticket) -> bool {
        lock_durable(&self.state).durable >= t.0
    }

    /// Plays an `fdatasync` that failed (what [`Durability::wait`] records then).
    #[cfg(test)]
    pub fn fail_for_test(&self, errno: i32) {
        lock_durable(&self.state).failed = Some(errno);
    }

    /// Where the durable records end in the journal's file.
    #[cfg(test)]
    pub fn durable_end(&self) -> u64 {
        lock_durable(&self.state).end.1
    }

    /// The journal was written whole to `file` (on disk, `end` bytes): everything written
    /// so far is durable, and a failure before no longer stands.
    fn rewritten(&self, file: Arc<File>, end: u64) {
        let mut d = lock_durable(&self.state);
        d.file = file;
        d.generation += 1;
        d.durable = d.written;
        d.end = (end, end);
        d.failed = None;
        self.done.notify_all();
    }
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Journal {
    /// Opens (creating if needed) the journal and replays it. A corrupt tail is cut off.
    pub fn open(path: &Path) -> io::Result<(Self, OverlayState)> {
        // Never through a symlink, never waiting on a FIFO: only a regular file is a
        // journal (a recovery of a cache a user planted must not hang on it).
        let text = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
        {
            Ok(f) => {
                if !f.metadata()?.is_file() {
                    return Err(io::Error::other(format!(
                        "{} is not a regular file",
                        path.display()
                    )));
                }
                let mut t = Vec::new();
                io::Read::read_to_end(&mut &f, &mut t)?;
                t
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let (records, valid) = decode(&text);
        let state = OverlayState::replay(&records);
        let file = open_rw(path, true)?;
        if valid < text.len() {
            tracing::warn!(
                journal = %path.display(),
                dropped_bytes = text.len() - valid,
                "journal had a torn or corrupt tail; it was cut off"
            );
            file.set_len(valid as u64)?;
            file.sync_all()?;
        }
        let file = Arc::new(file);
        let mut journal = Self {
            path: path.to_path_buf(),
            durability: Arc::new(Durability::new(file.clone(), valid as u64)),
            file,
            good_len: valid as u64,
            needs_trim: false,
            reserved_to: 0,
        };
        journal.reserve();
        Ok((journal, state))
    }

    /// Keeps [`RESERVE`] bytes allocated past the journal's end (not part of it), so that
    /// a cache whose disk fills up still takes the records of a sync and a logout (best
    /// effort: a filesystem without `fallocate`, or a disk already full, gets none).
    fn reserve(&mut self) {
        let reserved = crate::sys::fallocate(
            &self.file,
            libc::FALLOC_FL_KEEP_SIZE,
            self.good_len,
            RESERVE,
        );
        self.reserved_to = match reserved {
            Ok(()) => self.good_len + RESERVE,
            Err(_) => self.good_len,
        };
    }

    /// The group commit of this journal, for changes that wait for their records without
    /// the overlay's lock.
    pub fn durability(&self) -> Arc<Durability> {
        self.durability.clone()
    }

    /// Where the records written so far end: a change that looked at the state they make
    /// (a path already dirty) waits for them as for its own.
    pub fn written(&self) -> Ticket {
        Ticket(lock_durable(&self.durability.state).written)
    }

    /// An `fdatasync` failed since the journal was last written whole: what it covered may
    /// be lost, so the next record goes after a rewrite ([`Journal::compact`]).
    pub fn needs_rewrite(&self) -> bool {
        lock_durable(&self.durability.state).failed.is_some()
    }

    /// Appends records durably (one write at the end of the last whole record, one
    /// fdatasync, which also covers what [`Journal::write`] wrote before). On failure
    /// nothing of them counts: the fragment is cut off now, or overwritten by the next
    /// append.
    pub fn append(&mut self, records: &[Record]) -> io::Result<()> {
        let at = self.good_len;
        self.write_at_end(records)?;
        // A failure stands until the journal is rewritten whole (what earlier writes put
        // there may not be on disk either): these records do not count.
        self.durability.sync_now().inspect_err(|_| {
            self.cut(at);
            self.good_len = at;
            lock_durable(&self.durability.state).end.0 = at;
        })
    }

    /// Writes records at the end without waiting for the disk: they count in the state
    /// at once, and are durable once [`Durability::wait`] for the returned ticket
    /// returned. For changes where a crash before that loses nothing the user was told
    /// is done: the change is answered only after the wait, and a cache left ahead of the
    /// journal by a crash holds nothing the journal had not already sent for (a new
    /// name, or a name's second journal entry after its write-ahead one).
    pub fn write(&mut self, records: &[Record]) -> io::Result<Ticket> {
        self.write_at_end(records)?;
        Ok(self.written())
    }

    fn write_at_end(&mut self, records: &[Record]) -> io::Result<()> {
        let mut buf = String::new();
        for r in records {
            buf.push_str(&encode(r));
        }
        if self.needs_trim {
            self.file.set_len(self.good_len)?;
            self.needs_trim = false;
        }
        match self.file.write_all_at(buf.as_bytes(), self.good_len) {
            Ok(()) => {
                self.good_len += buf.len() as u64;
                if self.good_len + RESERVE / 2 > self.reserved_to {
                    self.reserve();
                }
                let mut d = lock_durable(&self.durability.state);
                d.written += buf.len() as u64;
                d.end.0 = self.good_len;
                Ok(())
            }
            Err(e) => {
                self.cut(self.good_len);
                Err(e)
            }
        }
    }

    /// Cuts a failed append's fragment off at `len`. Cutting a file shorter needs no
    /// space; if even that fails, the next append cuts first (and overwrites the fragment
    /// anyway).
    fn cut(&mut self, len: u64) {
        if self.file.set_len(len).is_err() {
            self.needs_trim = true;
        }
        // (A cut lets go of what was allocated past the end.)
        self.reserve();
    }

    /// Replaces the journal with a snapshot of `state` (atomic: temp file + rename). The
    /// new file is opened before it is renamed into place: once the rename is done it is
    /// the journal this writes to, whatever fails after (a journal reopened after the
    /// rename could fail to open, and records would go on into the old file, which no name
    /// leads to any longer).
    pub fn compact(&mut self, state: &OverlayState) -> io::Result<()> {
        let text: String = state.snapshot().iter().map(encode).collect();
        let made = match self.write_snapshot(&text) {
            // A full disk: the old journal's reserve makes the room.
            Err(e)
                if e.raw_os_error() == Some(libc::ENOSPC) && self.reserved_to > self.good_len =>
            {
                let _ = crate::sys::fallocate(
                    &self.file,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    self.good_len,
                    self.reserved_to - self.good_len,
                );
                self.reserved_to = self.good_len;
                self.write_snapshot(&text)
            }
            other => other,
        };
        let file = match made {
            Ok(f) => Arc::new(f),
            Err(e) => return Err(e),
        };
        self.file = file.clone();
        self.good_len = text.len() as u64;
        self.needs_trim = false;
        self.reserve();
        self.durability.rewritten(file, self.good_len);
        // Until the directory is synced the rename may not survive a power cut: a failure
        // stands as a failed fdatasync does (the next record rewrites the journal again).
        let synced = self.path.parent().map_or(Ok(()), fsync_dir);
        if let Err(e) = &synced {
            lock_durable(&self.durability.state).failed =
                Some(e.raw_os_error().unwrap_or(libc::EIO));
        }
        synced
    }

    /// Writes `text` to a temp file beside the journal and renames it over the journal;
    /// the new file. On failure the old journal is still the journal, unchanged.
    fn write_snapshot(&self, text: &str) -> io::Result<File> {
        let tmp = self.path.with_extension("tmp");
        let made = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(text.as_bytes())?;
                f.sync_all()?;
                Ok(f)
            })
            .and_then(|f| std::fs::rename(&tmp, &self.path).map(|()| f));
        if made.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        made
    }
}

/// The journal file, for reading and writing at chosen offsets; never through a symlink.
fn open_rw(path: &Path, create: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Writes a file atomically and durably: a private temp file beside it, fsync, rename,
/// fsync of the directory. Never follows a symlink planted at either name.
pub fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        fsync_dir(dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn escape_roundtrip_for_awkward_names() {
        for name in [
            ".a b",
            "x\\y",
            "new\nline",
            "caf\u{e9}",
            ".mozilla/firefox/x y/prefs.js",
        ] {
            let p = PathBuf::from(name);
            let e = escape(&p);
            assert!(!e.contains(' ') && !e.contains('\n'), "{e}");
            assert_eq!(unescape(&e), Some(p));
        }
    }

    #[test]
    fn torn_and_corrupt_tails_end_the_replay() {
        let a = encode(&Record::Dirty(PathBuf::from(".a")));
        let b = encode(&Record::Clean(PathBuf::from(".a")));
        let mut text = format!("{a}{b}").into_bytes();
        let (r, n) = decode(&text);
        assert_eq!(r.len(), 2);
        assert_eq!(n, text.len());
        text.truncate(text.len() - 1); // torn: no newline
        assert_eq!(decode(&text).0.len(), 1);
        let mut bad = format!("{a}{b}").into_bytes();
        let last = bad.len() - 2;
        bad[last] = b'b'; // body no longer matches checksum
        assert_eq!(decode(&bad).0.len(), 1);
        assert_eq!(decode(b"\0\0\0\0\n").0.len(), 0);
    }

    #[test]
    fn records_written_and_waited_for_by_many_threads_are_each_whole_in_the_journal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("journal");
        let (j, _) = Journal::open(&path).expect("open");
        let durability = j.durability();
        let j = Mutex::new(j);
        std::thread::scope(|scope| {
            for t in 0..8 {
                let (j, durability, path) = (&j, &durability, &path);
                scope.spawn(move || {
                    for i in 0..40 {
                        let ticket = lock_journal(j)
                            .write(&[Record::Dirty(PathBuf::from(format!(".t{t}/f{i}")))])
                            .expect("write");
                        durability.wait(ticket).expect("durable");
                        // What a waiter was told is durable is in the file.
                        let text = std::fs::read(path).expect("read");
                        let (records, _) = decode(&text);
                        let mine = Record::Dirty(PathBuf::from(format!(".t{t}/f{i}")));
                        assert!(records.contains(&mine), "{mine:?} missing");
                    }
                });
            }
        });
        let (_, state) = Journal::open(&path).expect("reopen");
        assert_eq!(state.dirty().count(), 8 * 40);
    }

    fn lock_journal(j: &Mutex<Journal>) -> MutexGuard<'_, Journal> {
        j.locked()
    }

    #[test]
    fn after_a_failed_fdatasync_no_wait_succeeds_until_the_journal_is_rewritten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("journal");
        let (mut j, mut state) = Journal::open(&path).expect("open");
        let durability = j.durability();
        let before = j
            .write(&[Record::Dirty(PathBuf::from(".a"))])
            .expect("write");
        durability.fail_for_test(libc::EIO);
        let after = j
            .write(&[Record::Dirty(PathBuf::from(".b"))])
            .expect("write");
        // A durable append after the failure (its own fdatasync may report nothing: the
        // kernel told the failed one) is refused, and clears nothing.
        let appended = j.append(&[Record::Dirty(PathBuf::from(".c"))]);
        assert_eq!(appended.map_err(|e| e.raw_os_error()), Err(Some(libc::EIO)));
        for t in [before, after] {
            let e = durability.wait(t).expect_err("not known on disk");
            assert_eq!(e.raw_os_error(), Some(libc::EIO));
        }
        assert!(j.needs_rewrite());
        state.apply(&Record::Dirty(PathBuf::from(".a")));
        state.apply(&Record::Dirty(PathBuf::from(".b")));
        j.compact(&state).expect("rewrite");
        assert!(!j.needs_rewrite());
        durability.wait(after).expect("durable after the rewrite");
        let (_, replayed) = Journal::open(&path).expect("reopen");
        assert!(replayed.is_dirty(Path::new(".a")) && replayed.is_dirty(Path::new(".b")));
    }

    #[test]
    fn journal_survives_reopen_and_compaction() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("journal");
        let (mut j, s) = Journal::open(&path).expect("open");
        assert!(s.is_clean());
        j.append(&[
            Record::Dirty(PathBuf::from(".a")),
            Record::Delete {
                path: PathBuf::from(".b"),
                whiteout: true,
            },
        ])
        .expect("append");
        drop(j);
        // A torn line written by a crash mid-append.
        {
            let mut f = OpenOptions::new().append(true).open(&path).expect("reopen");
            f.write_all(b"1234abcd D .tor").expect("write");
        }
        let (mut j, s) = Journal::open(&path).expect("open again");
        assert!(s.is_dirty(Path::new(".a")));
        assert!(s.is_whiteout(Path::new(".b")));
        j.append(&[Record::Clean(PathBuf::from(".a"))])
            .expect("append after cut");
        let (_, s2) = Journal::open(&path).expect("third open");
        assert!(!s2.is_dirty(Path::new(".a")));
        let (mut j, s3) = Journal::open(&path).expect("open");
        j.compact(&s3).expect("compact");
        let (_, s4) = Journal::open(&path).expect("after compaction");
        assert_eq!(s3, s4);
    }

    fn arb_path() -> impl Strategy<Value = PathBuf> {
        prop::collection::vec(
            prop::sample::select(vec![".a", ".b", "c", "d e", "\u{e9}"]),
            1..4,
        )
        .prop_map(|v| v.iter().collect())
    }

    fn arb_record() -> impl Strategy<Value = Record> {
        prop_oneof![
            arb_path().prop_map(Record::Dirty),
            (arb_path(), any::<u64>(), any::<u64>())
                .prop_map(|(p, dev, ino)| Record::Origin(p, Origin { dev, ino })),
            (arb_path(), any::<bool>())
                .prop_map(|(path, whiteout)| Record::Delete { path, whiteout }),
            (arb_path(), arb_path()).prop_map(|(from, to)| Record::Rename { from, to }),
            arb_path().prop_map(Record::Clean),
            (arb_path(), any::<Option<(u64, u64, i32, u32)>>()).prop_map(|(p, b)| Record::Base(
                p,
                b.map(|(ino, size, t, n)| ShareId {
                    ino,
                    size,
                    mtime: (i64::from(t), i64::from(n)),
                    ctime: (i64::from(t) + 1, 0),
                })
            )),
            arb_path().prop_map(Record::Deleted),
            (
                arb_path(),
                any::<Option<(u64, i32, u32)>>(),
                any::<Option<(i32, u32)>>()
            )
                .prop_map(|(p, t, since)| Record::Sending(
                    p,
                    t.map(|(size, s, n)| Sent {
                        size,
                        mtime: (i64::from(s), i64::from(n)),
                        since: since.map(|(a, b)| (i64::from(a), i64::from(b))),
                    })
                )),
            Just(Record::SyncEnd),
            (arb_path(), any::<u64>()).prop_map(|(p, l)| Record::Partial(p, l)),
            (
                arb_path(),
                any::<bool>(),
                prop::collection::vec((0u64..100, 1u64..20), 0..4)
            )
                .prop_map(|(path, changed, r)| Record::Blocks {
                    path,
                    changed,
                    blocks: crate::extents::Extents::of(
                        &r.iter().map(|&(s, n)| (s, s + n)).collect::<Vec<_>>()
                    ),
                }),
            arb_path().prop_map(Record::Whole),
            (arb_path(), any::<Option<[u8; 32]>>(), any::<bool>()).prop_map(|(p, d, old)| {
                let c = match d {
                    None => Content::Unknown,
                    Some(d) if old => Content::Bytes(d),
                    Some(d) => Content::Sha256(d),
                };
                Record::Racy(p, c)
            }),
        ]
    }

    #[test]
    fn a_racy_mark_of_an_earlier_version_is_read_as_a_mark_of_the_bytes() {
        let hex = "ab".repeat(32);
        let (r, _) = decode(encode_body(&format!("H .f {hex}")).as_bytes());
        assert_eq!(r, [Record::Racy(".f".into(), Content::Bytes([0xab; 32]))]);
        let (r, _) = decode(encode_body(&format!("A .f {hex}")).as_bytes());
        assert_eq!(r, [Record::Racy(".f".into(), Content::Sha256([0xab; 32]))]);
    }

    fn encode_body(b: &str) -> String {
        format!("{:08x} {}\n", fnv1a(b.as_bytes()), b)
    }

    proptest! {
        #[test]
        fn encode_decode_roundtrip(records in prop::collection::vec(arb_record(), 0..30)) {
            let text: String = records.iter().map(encode).collect();
            let (back, n) = decode(text.as_bytes());
            prop_assert_eq!(n, text.len());
            prop_assert_eq!(back, records);
        }

        #[test]
        fn compaction_preserves_state(records in prop::collection::vec(arb_record(), 0..40)) {
            let s = OverlayState::replay(&records);
            prop_assert_eq!(OverlayState::replay(&s.snapshot()), s);
        }
    }
}
