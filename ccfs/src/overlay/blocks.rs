//! Files held by block: a large cached file taken over from the share copies nothing. Its
//! cache file is made sparse at the share's length, and the blocks ([`BLOCK`]) written here
//! land in it; a block it lacks is read from the share's version the take-over recorded as
//! the path's base (a `Base` record, so another workstation's change is still a conflict).
//! `Record::Partial` and `Record::Blocks` say which blocks the cache file has, and which
//! of them were written here: those are what the sync sends (`overlay/send_blocks.rs`).
//!
//! Crash safety: a block's record is written only after its data is on disk (the cache
//! file's `fdatasync`), and on disk itself before an `fsync` is answered: a block the
//! journal does not list is read from the base, so a crash loses only writes no `fsync`
//! covered, as on any filesystem. A write that covers part of a block the cache lacks
//! first copies the block's other bytes from the base (a block in the cache is always
//! whole).
//!
//! The I/O of such a file goes through the daemon (no kernel passthrough: the kernel would
//! read its holes as zeros). One [`BlockFile`] a path serves every handle of it. A file
//! held by block stays so for its life in the cache, across syncs and logouts (after a
//! sync the share's new version is its base, and it has the same bytes where the cache
//! file lacks blocks), unless something needs it whole ([`Overlay::make_whole`]: a rename,
//! a link, a conflict), which copies the blocks it lacks from its base.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::session::SyncSession;
use super::*;
use crate::extents::{blocks_of, Extents, BLOCK};
use crate::state::{Partial, ShareId};

/// The I/O of one file held by block, shared by every handle of it.
#[derive(Debug)]
pub struct BlockFile {
    /// The path it is held at: it does not change while the file is held by block (a
    /// rename makes the file whole first).
    path: PathBuf,
    /// Lock order: 4 (ARCHITECTURE.md, Locks): held across one read or write of the file
    /// (the share's reads of the blocks the cache lacks included) and across the journal
    /// write of a truncation.
    io: Mutex<BlockIo>,
    /// The share's version the missing blocks are read from, as its base records it, and
    /// the share's file once opened and found to be that version. Lock order: 15, a
    /// leaf (a sync's new base is set under the overlay's lock; the share is opened
    /// without it).
    base: Mutex<BaseSlot>,
    /// The blocks of `here` not in the journal yet: copied from the base, and written
    /// here. Copied (not taken) by the journal write and removed once the state has them,
    /// so that a block is always in one of the two (a sync's snapshot looks at both). Lock
    /// order: 15, a leaf (as `base`; taken under `io` and under the overlay's lock).
    pending: Mutex<Unrecorded>,
    /// The limit as `io` has it, for a look without `io` (a sync's snapshot).
    limit_now: std::sync::atomic::AtomicU64,
    /// When the daemon first served the file this session (see `overlay/fill.rs`).
    pub(super) since: std::time::Instant,
    /// The background fill gave up on it (the cache's disk was full).
    pub(super) fill_stopped: std::sync::atomic::AtomicBool,
}

#[derive(Debug, Default)]
struct BaseSlot {
    id: Option<ShareId>,
    file: Option<Arc<File>>,
    /// The file held open was found changed in place: it stays so (a save renamed over
    /// its name later leaves it with no name, not with its old bytes), until a new base.
    changed: bool,
}

#[derive(Debug)]
struct BlockIo {
    /// Held by block no longer: the cache file is the file.
    whole: bool,
    /// Below it, a block the cache lacks is the base's (see [`Partial::limit`]).
    limit: u64,
    /// The blocks the cache file has.
    here: Extents,
}

/// What a [`BlockFile`] has not journaled yet (see [`BlockFile::pending`]).
#[derive(Debug, Default, Clone)]
pub struct Unrecorded {
    filled: Extents,
    written: Extents,
}

impl Unrecorded {
    fn is_empty(&self) -> bool {
        self.filled.is_empty() && self.written.is_empty()
    }

    fn records(&self, path: &Path) -> Vec<Record> {
        let mut out = Vec::new();
        for (changed, blocks) in [(false, &self.filled), (true, &self.written)] {
            if !blocks.is_empty() {
                out.push(Record::Blocks {
                    path: path.to_path_buf(),
                    changed,
                    blocks: blocks.clone(),
                });
            }
        }
        out
    }
}

fn eio(why: &str) -> io::Error {
    io::Error::other(why.to_string())
}

impl BlockFile {
    fn new(path: &Path, partial: &Partial, base_id: Option<ShareId>) -> Self {
        Self {
            path: path.to_path_buf(),
            io: Mutex::new(BlockIo {
                whole: false,
                limit: partial.limit,
                here: partial.here.clone(),
            }),
            pending: Mutex::new(Unrecorded::default()),
            limit_now: std::sync::atomic::AtomicU64::new(partial.limit),
            since: std::time::Instant::now(),
            fill_stopped: std::sync::atomic::AtomicBool::new(false),
            base: Mutex::new(BaseSlot {
                id: base_id,
                file: None,
                changed: false,
            }),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file is still held by block (its reads and writes must come here).
    pub fn is_partial(&self) -> bool {
        !self.io.locked().whole
    }

    /// Reads `buf.len()` bytes at `offset` (fewer at the end of the file) of the file as
    /// it is: the cache file's blocks, and the base's where the cache lacks them.
    pub fn read_at(
        &self,
        share: &Root,
        cache: &File,
        buf: &mut [u8],
        offset: u64,
    ) -> io::Result<usize> {
        let io = self.io.locked();
        let len = sys::fstat(cache)?.len();
        if offset >= len || buf.is_empty() {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(len - offset) as usize;
        let buf = &mut buf[..n];
        if io.whole {
            read_full(cache, buf, offset)?;
            return Ok(n);
        }
        let end = offset + n as u64;
        // Runs of blocks: those the cache has (or that lie past the limit) from the cache
        // file, the others from the base up to the limit and from the cache file after.
        let (first, last) = blocks_of(offset, n as u64);
        let mut at = offset;
        let gaps = io.here.gaps(first, last);
        for (s, e) in gaps {
            let (gs, ge) = ((s * BLOCK).max(offset), (e * BLOCK).min(end));
            if gs >= io.limit {
                break;
            }
            // The cache's part before the gap.
            if gs > at {
                read_full(
                    cache,
                    &mut buf[(at - offset) as usize..(gs - offset) as usize],
                    at,
                )?;
            }
            let from_base_end = ge.min(io.limit);
            let base = self.base(share)?;
            read_full(
                &base,
                &mut buf[(gs - offset) as usize..(from_base_end - offset) as usize],
                gs,
            )?;
            at = from_base_end;
        }
        if at < end {
            read_full(cache, &mut buf[(at - offset) as usize..], at)?;
        }
        Ok(n)
    }

    /// Writes `data` at `offset`: a block it covers in part that the cache lacks is first
    /// copied from the base.
    pub fn write_at(&self, share: &Root, cache: &File, data: &[u8], offset: u64) -> io::Result<()> {
        let mut io = self.io.locked();
        if io.whole || data.is_empty() {
            return cache.write_all_at(data, offset);
        }
        let (first, last) = blocks_of(offset, data.len() as u64);
        let end = offset + data.len() as u64;
        if !offset.is_multiple_of(BLOCK) {
            self.fill(&mut io, share, cache, first, first + 1)?;
        }
        if !end.is_multiple_of(BLOCK) {
            self.fill(&mut io, share, cache, last - 1, last)?;
        }
        cache.write_all_at(data, offset)?;
        io.here.insert(first, last);
        self.pending.locked().written.insert(first, last);
        Ok(())
    }

    /// Sets the length of the file to `len`. Cut below the limit, the limit follows: the
    /// cache file is cut first, then the limit recorded (`record`, on disk before this
    /// returns); a crash in between leaves a cache file shorter than its limit, which
    /// the next opening of the cache takes as the limit ([`Overlay::blocks_after_a_crash`]).
    /// The block the new end falls in is copied from the base first when the cache lacks
    /// it (the bytes of it below the end are the base's either way).
    pub fn set_len(
        &self,
        share: &Root,
        cache: &File,
        len: u64,
        record: impl FnOnce(Record) -> FsResult<()>,
    ) -> FsResult<()> {
        let mut io = self.io.locked();
        if io.whole || len >= io.limit {
            cache.set_len(len)?;
            return Ok(());
        }
        if !len.is_multiple_of(BLOCK) {
            let b = len / BLOCK;
            self.fill(&mut io, share, cache, b, b + 1)?;
            // The cut changes that block: it is sent.
            self.pending.locked().written.insert(b, b + 1);
        }
        cache.set_len(len)?;
        io.limit = len;
        self.limit_now
            .store(len, std::sync::atomic::Ordering::SeqCst);
        record(Record::Partial(self.path.clone(), len))?;
        Ok(())
    }

    /// Copies the blocks of `[b0, b1)` the cache lacks from the base (up to the limit).
    fn fill(
        &self,
        io: &mut BlockIo,
        share: &Root,
        cache: &File,
        b0: u64,
        b1: u64,
    ) -> io::Result<()> {
        let limit_block = io.limit.div_ceil(BLOCK);
        let gaps = io.here.gaps(b0, b1.min(limit_block));
        if gaps.is_empty() {
            return Ok(());
        }
        let mut buf = vec![0u8; BLOCK as usize];
        for (s, e) in gaps {
            for b in s..e {
                let from = b * BLOCK;
                let n = (BLOCK.min(io.limit - from)) as usize;
                let base = self.base(share)?;
                read_full(&base, &mut buf[..n], from)?;
                cache.write_all_at(&buf[..n], from)?;
            }
            io.here.insert(s, e);
            self.pending.locked().filled.insert(s, e);
        }
        Ok(())
    }

    /// Bytes of the blocks the cache file lacks below the limit, and whether blocks were
    /// written here that the journal does not have yet.
    pub(super) fn missing(&self) -> (u64, bool) {
        let io = self.io.locked();
        let lacking: u64 = if io.whole {
            0
        } else {
            io.here
                .gaps(0, io.limit.div_ceil(BLOCK))
                .iter()
                .map(|(s, e)| e - s)
                .sum()
        };
        let written = !self.pending.locked().written.is_empty();
        (lacking * BLOCK, written)
    }

    /// One step of the background fill (`overlay/fill.rs`): the first run of blocks the
    /// cache lacks below the limit, at most `max` of them, read from the base without the
    /// file's lock, then written where the cache still lacks them under it and `hold`'s
    /// guard (the overlay's lock: no change of attributes meanwhile), the cache file's
    /// mtime kept (the blocks copied in are no change of the file). The number of blocks
    /// it copied; None when the file lacks none (or is whole).
    pub(super) fn fill_step<G>(
        &self,
        share: &Root,
        cache: &File,
        max: u64,
        hold: impl FnOnce() -> G,
    ) -> io::Result<Option<u64>> {
        let (s, e, limit) = {
            let io = self.io.locked();
            if io.whole {
                return Ok(None);
            }
            let limit_block = io.limit.div_ceil(BLOCK);
            let Some((s, e)) = io.here.gaps(0, limit_block).first().copied() else {
                return Ok(None);
            };
            (s, e.min(s + max.max(1)), io.limit)
        };
        let from = s * BLOCK;
        let mut buf = vec![0u8; ((e * BLOCK).min(limit) - from) as usize];
        read_full(&*self.base(share)?, &mut buf, from)?;
        // Still the base after the read (a write in place meanwhile would mix versions).
        let _ = self.base(share)?;
        let mut io = self.io.locked();
        if io.whole || io.limit != limit {
            return Ok(Some(0));
        }
        let _held = hold();
        let gaps = io.here.gaps(s, e);
        if gaps.is_empty() {
            return Ok(Some(0));
        }
        let (secs, nsecs) = sys::fstat(cache)?.mtime();
        let mut copied = 0;
        for (gs, ge) in gaps {
            let a = ((gs - s) * BLOCK) as usize;
            let b = (((ge - s) * BLOCK) as usize).min(buf.len());
            // Blocks of zeros (a sparse file's holes) are what the cache file's hole reads
            // already: on record, not written (they would take room the share's file does
            // not take). The others in runs.
            let data = &buf[a..b];
            let mut run: Option<usize> = None;
            for (i, block) in data.chunks(BLOCK as usize).enumerate() {
                let zeros = block.iter().all(|&x| x == 0);
                match (run, zeros) {
                    (None, false) => run = Some(i),
                    (Some(r), true) => {
                        let at = r * BLOCK as usize;
                        cache
                            .write_all_at(&data[at..i * BLOCK as usize], gs * BLOCK + at as u64)?;
                        run = None;
                    }
                    _ => {}
                }
            }
            if let Some(r) = run {
                let at = r * BLOCK as usize;
                cache.write_all_at(&data[at..], gs * BLOCK + at as u64)?;
            }
            io.here.insert(gs, ge);
            self.pending.locked().filled.insert(gs, ge);
            copied += ge - gs;
        }
        sys::futimens(cache, SetTime::Omit, SetTime::At { secs, nsecs })?;
        Ok(Some(copied))
    }

    /// Copies every block the cache lacks from the base: the cache file is the whole file
    /// (recorded by [`Overlay::make_whole`]).
    fn fill_all(&self, io: &mut BlockIo, share: &Root, cache: &File) -> io::Result<()> {
        let limit_block = io.limit.div_ceil(BLOCK);
        self.fill(io, share, cache, 0, limit_block)
    }

    /// The base's file: opened at the first need, and checked to be the version the base
    /// records (a share whose file changed since has not the bytes the cache lacks).
    fn base(&self, share: &Root) -> io::Result<Arc<File>> {
        let want = {
            let mut slot = self.base.locked();
            if let (Some(f), Some(id)) = (&slot.file, slot.id) {
                // The file held open is the base while its bytes are: a write in place on
                // the share (another program there) changes its ctime, whatever it does
                // with its size and mtime (`rsync --inplace -t`, `touch -r` put the mtime
                // back). A save elsewhere that renames another file over its name changes
                // its ctime too, but leaves it with no name and its bytes as they were.
                // (A chmod or an attribute set there also counts as a change: ours is then
                // kept aside whole or as its blocks, never mixed with another version.)
                let now = sys::fstat(f)?;
                let look = (now.len(), now.mtime());
                if slot.changed
                    || look != (id.size, id.mtime)
                    || (now.ctime() != id.ctime && now.nlink() > 0)
                {
                    slot.changed = true;
                    tracing::error!(
                        path = %session::shown(&self.path),
                        "the share's file this file's missing blocks come from was written in place: they cannot be read"
                    );
                    return Err(eio(
                        "the share's version of a file held by block was written in place",
                    ));
                }
                return Ok(f.clone());
            }
            slot.id
        };
        let Some(want) = want else {
            return Err(eio("a file held by block has no base on the share"));
        };
        let f = share.open_file(&self.path, libc::O_RDONLY | libc::O_NOFOLLOW, 0)?;
        if session::share_id_of(&sys::fstat(&f)?) != want {
            tracing::error!(
                path = %session::shown(&self.path),
                "the share's file this file's missing blocks come from changed: they cannot be read"
            );
            return Err(eio("the share's version of a file held by block changed"));
        }
        let f = Arc::new(f);
        let mut slot = self.base.locked();
        // Kept only if the base is still the one it was opened for.
        if slot.id == Some(want) {
            slot.file = Some(f.clone());
        }
        Ok(f)
    }

    /// Whether the daemon holds the base's file open (its missing blocks stay readable
    /// if another file is renamed over its name on the share).
    pub fn base_is_held(&self) -> bool {
        self.base.locked().file.is_some()
    }

    /// Opens the base now if it is not open yet (and it is still the base): from then on
    /// a save elsewhere that renames another file over its name leaves its bytes readable
    /// here. A base that cannot be opened is left for the first read that needs it.
    pub fn hold_base(&self, share: &Root) {
        let _ = self.base(share);
    }

    /// What is not journaled yet, copied (see [`BlockFile::pending`]).
    fn unrecorded(&self) -> Unrecorded {
        self.pending.locked().clone()
    }

    /// Those of `u` are in the state now.
    fn recorded(&self, u: &Unrecorded) {
        let mut p = self.pending.locked();
        for (s, e) in u.filled.iter() {
            p.filled.remove(s, e);
        }
        for (s, e) in u.written.iter() {
            p.written.remove(s, e);
        }
    }

    /// The blocks written here and not journaled yet, and the limit now: with the state's
    /// changed blocks, what a snapshot taken just before holds of this file's changes.
    pub(super) fn written_now(&self) -> (Extents, u64) {
        (
            self.pending.locked().written.clone(),
            self.limit_now.load(std::sync::atomic::Ordering::SeqCst),
        )
    }

    /// The share's file now holds this file as the cache does (a sync sent it): that
    /// version is the base from now on.
    pub fn rebase(&self, base: Option<ShareId>) {
        let mut slot = self.base.locked();
        if slot.id != base {
            slot.id = base;
            slot.file = None;
            slot.changed = false;
        }
    }
}

/// Reads exactly `buf.len()` bytes at `offset`; a file that ends before is an error (the
/// file's length says the bytes are there).
fn read_full(f: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => {
                // Past the end of the file it reads from: holes (the cache file was cut
                // and grown again, or the base is shorter than the limit says).
                buf[got..].fill(0);
                return Ok(());
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Overlay {
    /// The [`BlockFile`] of `rel` when its cache file is held by block. `inner`: the lock,
    /// taken for `rel`.
    pub(super) fn block_file_locked(&self, inner: &Inner, rel: &Path) -> Option<Arc<BlockFile>> {
        let partial = inner.state.partial(rel)?;
        let mut files = self.block_files.locked();
        Some(
            files
                .entry(rel.to_path_buf())
                .or_insert_with(|| Arc::new(BlockFile::new(rel, partial, inner.state.base(rel))))
                .clone(),
        )
    }

    /// The share's file at `rel`, opened and checked to be the version `meta` saw (for
    /// [`Overlay::keep_base`]).
    pub(super) fn open_base(&self, rel: &Path, meta: &Stat) -> io::Result<File> {
        let f =
            self.share
                .open_file(rel, libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK, 0)?;
        if session::share_id_of(&sys::fstat(&f)?) != session::share_id_of(meta) {
            return Err(eio("the share's file changed"));
        }
        Ok(f)
    }

    /// Keeps `file`, the share's version a take-over of `rel` held by block recorded as its
    /// base, with its block file.
    pub(super) fn keep_base(&self, inner: &Inner, rel: &Path, file: File) {
        if let Some(bf) = self.block_file_locked(inner, rel) {
            let mut slot = bf.base.locked();
            if slot.id == inner.state.base(rel) {
                slot.file = Some(Arc::new(file));
            }
        }
    }

    /// Reads the cache's `rel` as the view shows it (see [`Overlay::view_bytes`]) a chunk
    /// at a time, in order, into `each` (the chunk, its offset), until its end or until
    /// `each` says stop (false): in bounded memory, whatever the file's size.
    pub(super) fn view_reads(
        &self,
        rel: &Path,
        mut each: impl FnMut(&[u8], u64) -> bool,
    ) -> io::Result<()> {
        const CHUNK: usize = 256 * 1024;
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
        let cache = self.cache.open_file(&up(rel), flags, 0)?;
        let bf = self.block_file(rel);
        let mut buf = vec![0u8; CHUNK];
        let mut at = 0u64;
        loop {
            let n = match &bf {
                Some(bf) => bf.read_at(&self.share, &cache, &mut buf, at)?,
                None => loop {
                    match cache.read_at(&mut buf, at) {
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        other => break other?,
                    }
                },
            };
            if n == 0 || !each(&buf[..n], at) {
                return Ok(());
            }
            at += n as u64;
        }
    }

    /// Whether the cache's `rel` as the view shows it is `len` bytes, those of `other`
    /// (read a chunk at a time; either longer or shorter than the other: not the same).
    pub(super) fn view_equals(&self, rel: &Path, other: &File, len: u64) -> io::Result<bool> {
        let mut same = true;
        let mut theirs = Vec::new();
        let mut failed = None;
        let mut seen = 0u64;
        self.view_reads(rel, |mine, at| {
            seen = at + mine.len() as u64;
            theirs.resize(mine.len(), 0);
            match other.read_exact_at(&mut theirs, at) {
                Ok(()) => same = theirs == mine,
                // (Ours is longer by now.)
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => same = false,
                Err(e) => {
                    failed = Some(e);
                    same = false;
                }
            }
            same
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        Ok(same && seen == len)
    }

    /// The bytes the cache's `rel` holds as the view shows them: of a file held by block,
    /// the blocks its cache file has and the base's elsewhere; of another, the cache file's.
    /// (Whole in memory: for tests; the sync reads with [`Overlay::view_reads`].)
    #[cfg(test)]
    pub(super) fn view_bytes(&self, rel: &Path) -> io::Result<Vec<u8>> {
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
        let cache = self.cache.open_file(&up(rel), flags, 0)?;
        let len = sys::fstat(&cache)?.len() as usize;
        let mut buf = vec![0u8; len];
        let n = match self.block_file(rel) {
            Some(bf) => bf.read_at(&self.share, &cache, &mut buf, 0)?,
            None => {
                read_full(&cache, &mut buf, 0)?;
                len
            }
        };
        buf.truncate(n);
        Ok(buf)
    }

    /// The [`BlockFile`] of `rel` if one serves it now (none is made).
    pub fn open_block_file(&self, rel: &Path) -> Option<Arc<BlockFile>> {
        self.block_files.locked().get(rel).cloned()
    }

    /// The [`BlockFile`] of `rel` when its cache file is held by block.
    pub fn block_file(&self, rel: &Path) -> Option<Arc<BlockFile>> {
        let inner = self.lock_for(&[rel]);
        self.block_file_locked(&inner, rel)
    }

    /// Journals what `bf` has not journaled yet, its data on disk first (`cache`: its cache
    /// file), and waits until the records are on disk: the blocks written so far survive a
    /// crash. For `fsync`, the release of a handle, and the sync.
    pub fn record_blocks(&self, bf: &BlockFile, cache: &File) -> FsResult<()> {
        let u = bf.unrecorded();
        if u.is_empty() {
            return Ok(());
        }
        // Their data on disk before their record can be.
        cache.sync_data()?;
        let t = {
            let mut inner = self.lock_any();
            // A file no longer held by block, or another file at its path now (ours was
            // removed or set aside), records nothing.
            let current = self
                .block_files
                .locked()
                .get(&bf.path)
                .is_some_and(|b| std::ptr::eq(Arc::as_ptr(b), bf));
            if inner.state.partial(&bf.path).is_none() || !current {
                return Ok(());
            }
            let t = self.record_deferred(&mut inner, &u.records(&bf.path))?;
            bf.recorded(&u);
            t
        };
        self.durable(t)
    }

    /// Before a sync: every block written so far on record (the sync sends what the
    /// journal lists), and each changed file held by block whose base the share no longer
    /// has made whole (the conflict check then keeps it aside as any file). One that
    /// cannot be made whole (its base gone from the share while the daemon did not hold
    /// it open) is kept in the cache out of the view (see [`Overlay::keep_blocks_here`]):
    /// a conflict of its own kind.
    pub(super) fn blocks_before_sync(
        &self,
        host: &str,
        stamp: &str,
        session: &mut SyncSession<'_>,
    ) -> FsResult<()> {
        let files: Vec<Arc<BlockFile>> = self.block_files.locked().values().cloned().collect();
        for bf in files {
            let recorded = self
                .cache
                .open_file(
                    &up(&bf.path),
                    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
                    0,
                )
                .map_err(FsError::from)
                .and_then(|cache| self.record_blocks(&bf, &cache));
            if let Err(e) = recorded {
                session.errors.push(format!(
                    "the blocks written to {} could not be journaled: {e}",
                    session::shown(&bf.path)
                ));
            }
        }
        let changed: Vec<(PathBuf, Option<ShareId>)> = {
            let inner = self.lock();
            inner
                .state
                .partials()
                .filter(|(p, _)| inner.state.is_dirty(p))
                .map(|(p, _)| (p.clone(), inner.state.base(p)))
                .collect()
        };
        for (p, base) in changed {
            // A share that does not answer tells nothing: the conflict check holds the
            // path back with its error.
            let now = match self.share.stat(&p) {
                Ok(m) => m.map(|m| session::share_id_of(&m)),
                Err(_) => continue,
            };
            if now == base {
                continue;
            }
            match self.make_whole(&p) {
                Ok(()) => {}
                Err(FsError::Journal(e)) => return Err(FsError::Journal(e)),
                Err(e) => {
                    tracing::warn!(path = %session::shown(&p), "cannot be made whole: {e}");
                    // One that cannot be kept aside either stays as it is: the conflict
                    // check holds it back (it never moves a file held by block).
                    let kept = match self.keep_blocks_here(&p, host, stamp) {
                        Ok(kept) => kept,
                        Err(FsError::Journal(e)) => return Err(FsError::Journal(e)),
                        Err(e) => {
                            session.errors.push(format!(
                                "{} could not be kept aside in the cache: {e}",
                                session::shown(&p)
                            ));
                            continue;
                        }
                    };
                    tracing::warn!(
                        path = %session::shown(&p),
                        kept = %session::shown(&kept),
                        "conflict: changed here by block and on the share while this workstation did not hold the share's old version; the share's shows, ours is kept in the cache"
                    );
                    session.conflicts.push(session::Conflict {
                        path: p.clone(),
                        kind: session::ConflictKind::BlocksKeptHere,
                        kept: kept.to_string_lossy().into_owned(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Moves the cache file of `p`, held by block and whose base is gone, out of the view
    /// to `kept/HOST-STAMP/p` in the cache directory (`HOST-STAMP-N` when that is taken),
    /// with the list of the blocks it has and of those written here at the same path
    /// under `kept/HOST-STAMP.blocks/` (a name of the path's own length: a name at the
    /// limit fits); the session forgets `p`, whose share's version shows from now on.
    /// Returns where it went (relative to the cache directory).
    fn keep_blocks_here(&self, p: &Path, host: &str, stamp: &str) -> FsResult<PathBuf> {
        let mut inner = self.lock_for(&[p]);
        let Some(part) = inner.state.partial(p).cloned() else {
            return Ok(PathBuf::new());
        };
        let kept = Path::new("kept");
        let (to, list_at) = (1..=1000)
            .map(|n: u32| match n {
                1 => format!("{host}-{stamp}"),
                n => format!("{host}-{stamp}-{n}"),
            })
            .map(|d| {
                (
                    kept.join(&d).join(p),
                    kept.join(format!("{d}.blocks")).join(p),
                )
            })
            .find(|(to, list)| {
                !matches!(self.cache.stat(to), Ok(Some(_)))
                    && !matches!(self.cache.stat(list), Ok(Some(_)))
            })
            .ok_or(FsError::Errno(libc::EEXIST))?;
        for dir in [&to, &list_at].map(|f| f.parent().unwrap_or(Path::new(""))) {
            self.cache_dirs(dir)?;
        }
        let list = format!(
            "blocks of {} bytes; the cache file has {}; written here {}; below {} bytes the others are the share's version it was taken from\n",
            BLOCK,
            part.here.encode(),
            part.changed.encode(),
            part.limit
        );
        {
            use std::io::Write;
            let mut f = self.cache.open_file(
                &list_at,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                0o600,
            )?;
            f.write_all(list.as_bytes())?;
            f.sync_all()?;
        }
        self.cache.rename(&up(p), &to, libc::RENAME_NOREPLACE)?;
        self.record(
            &mut inner,
            &[
                Record::Delete {
                    path: p.to_path_buf(),
                    whiteout: false,
                },
                Record::Forget(p.to_path_buf()),
            ],
        )?;
        Ok(to)
    }

    /// Makes `dir` and the directories above it in the cache directory (mode 700).
    fn cache_dirs(&self, dir: &Path) -> io::Result<()> {
        let mut at = PathBuf::new();
        for c in dir.components() {
            at.push(c);
            match self.cache.mkdir(&at, 0o700) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Opening a cache: a file held by block whose cache file is shorter than its limit
    /// was cut by a truncation whose record a crash took (its length is the limit now);
    /// and in a file that was being written (dirty), a block the cache file has may hold
    /// a write the crash cut off from its record (a block written again after a sync had
    /// sent it shows the new bytes, as the cache file has them): every block the cache
    /// file has counts as changed, so that the share gets what the view shows. (A block
    /// the cache file lacks shows and sends the base, whatever a write put there.)
    pub(super) fn blocks_after_a_crash(&self) -> io::Result<()> {
        let mut inner = self.lock();
        let mut records = Vec::new();
        for (p, part) in inner.state.partials() {
            // A cut whose record the crash took: the cache file's length is the limit.
            if let Some(m) = self.upper_stat(p)? {
                if m.len() < part.limit {
                    records.push(Record::Partial(p.clone(), m.len()));
                }
            }
            if inner.state.is_dirty(p) && part.here != part.changed {
                records.push(Record::Blocks {
                    path: p.clone(),
                    changed: true,
                    blocks: part.here.clone(),
                });
            }
        }
        if !records.is_empty() {
            self.record(&mut inner, &records)
                .map_err(|e| io::Error::other(e.to_string()))?;
        }
        // The bases of the files with work to send, held from now on (not under the lock:
        // the share is asked).
        let dirty: Vec<PathBuf> = inner
            .state
            .partials()
            .filter(|(p, _)| inner.state.is_dirty(p))
            .map(|(p, _)| p.clone())
            .collect();
        drop(inner);
        for p in dirty {
            if let Some(bf) = self.block_file(&p) {
                bf.hold_base(&self.share);
            }
        }
        Ok(())
    }

    /// Sets the length of the file held by block `bf` at `rel` (see [`BlockFile::set_len`]);
    /// `file`: an open handle's cache file, if the caller has one.
    pub(super) fn set_len_by_block(
        &self,
        bf: &BlockFile,
        rel: &Path,
        len: u64,
        file: Option<&File>,
    ) -> FsResult<()> {
        let opened;
        let cache = match file {
            Some(f) => f,
            None => {
                opened = self.cache.open_file(
                    &up(rel),
                    libc::O_RDWR | libc::O_NOFOLLOW | libc::O_NONBLOCK,
                    0,
                )?;
                &opened
            }
        };
        bf.set_len(&self.share, cache, len, |r| {
            let t = {
                let mut inner = self.lock_any();
                self.record_deferred(&mut inner, &[r])?
            };
            self.durable(t)
        })?;
        // The blocks the cut filled and changed, on record.
        self.record_blocks(bf, cache)
    }

    /// Makes the file held by block at `rel` whole (every block it lacks copied from its
    /// base, then `Record::Whole`): before it is renamed, linked, or kept aside for a
    /// conflict. Nothing to do for a file not held by block.
    pub fn make_whole(&self, rel: &Path) -> FsResult<()> {
        let Some(bf) = self.block_file(rel) else {
            return Ok(());
        };
        let cache = self.cache.open_file(
            &up(rel),
            libc::O_RDWR | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            0,
        )?;
        let mut io = bf.io.locked();
        if io.whole {
            return Ok(());
        }
        // The blocks copied in are no change of the file: its mtime stays.
        let (secs, nsecs) = sys::fstat(&cache)?.mtime();
        bf.fill_all(&mut io, &self.share, &cache)?;
        sys::futimens(&cache, SetTime::Omit, SetTime::At { secs, nsecs })?;
        cache.sync_all()?;
        let u = bf.unrecorded();
        let mut records = u.records(rel);
        records.push(Record::Whole(rel.to_path_buf()));
        let t = {
            let mut inner = self.lock_any();
            self.record_deferred(&mut inner, &records)?
        };
        self.durable(t)?;
        io.whole = true;
        drop(io);
        self.block_files.locked().remove(rel);
        tracing::debug!(path = %session::shown(rel), "made whole");
        Ok(())
    }

    /// Makes whole every file held by block at or below `rel` (see [`Overlay::make_whole`]).
    pub fn make_whole_below(&self, rel: &Path) -> FsResult<()> {
        let paths = self.lock_for(&[rel]).state.partial_below(rel);
        for p in paths {
            self.make_whole(&p)?;
        }
        Ok(())
    }

    /// Keeps the block files in step with records just applied to the state: those of
    /// a path removed, renamed, replaced, forgotten or made whole are let go of (the next
    /// use starts from the state), and a new base is the base of the blocks a file lacks.
    pub(super) fn applied(&self, records: &[Record]) {
        let mut files = self.block_files.locked();
        if files.is_empty() {
            return;
        }
        for r in records {
            match r {
                Record::Delete { path, .. } | Record::Forget(path) => {
                    files.retain(|p, _| !p.starts_with(path))
                }
                Record::Rename { from, to } => {
                    files.retain(|p, _| !p.starts_with(from) && !p.starts_with(to))
                }
                Record::Whole(path) => {
                    files.remove(path);
                }
                Record::Base(path, base) => {
                    if let Some(bf) = files.get(path) {
                        bf.rebase(*base);
                    }
                }
                _ => {}
            }
        }
    }

    /// Cached files at least `len` bytes long are held by block from their take-over on
    /// (0: none is).
    pub fn set_by_block_from(&self, len: u64) {
        self.by_block_from.store(len, Ordering::Relaxed);
    }

    /// Whether a take-over of the share's file `meta` holds it by block.
    pub(super) fn held_by_block(&self, meta: &Stat) -> bool {
        let from = self.by_block_from.load(Ordering::Relaxed);
        from > 0 && meta.is_file() && meta.len() >= from
    }
}
