//! An open file as a handle holds it: its descriptor, the cache file's writer count it
//! holds, and, while its copy-up is deferred ([`Overlay::open_deferred`]), what it stands
//! for. The deferred copy-up's state machine lives here: a handle is made writable at its
//! first write, follows its file to the cache when another handle wrote it there, and is
//! detached when its name holds another file now. A handle on the share's file passes
//! the share's gate for its I/O, and its close is passed on where the share's filesystem
//! acts at a close.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::locks::RwLocked;

use super::*;

/// An open regular file of the overlay.
#[derive(Debug)]
pub struct OpenFile {
    /// Lock order: 3 (ARCHITECTURE.md, Locks): written for a deferred copy-up.
    io: RwLock<FileIo>,
}

/// What an [`OpenFile`] reads and writes now.
#[derive(Debug)]
pub struct FileIo {
    file: File,
    writer: Option<u64>,
    deferred: Option<Deferred>,
    /// The file is held by block (see `blocks.rs`): reads and writes go through it.
    blocks: Option<Arc<BlockFile>>,
    /// `file` is the share's (see [`Overlay::is_on_share`]): its I/O passes the share's
    /// gate.
    on_share: ShareOpen,
}

/// Whether a handle's file is the share's, counted in [`Overlay::share_files_open`] while
/// the handle holds it.
#[derive(Debug)]
struct ShareOpen(Option<Arc<AtomicUsize>>);

impl ShareOpen {
    fn is(&self) -> bool {
        self.0.is_some()
    }
}

impl Drop for ShareOpen {
    fn drop(&mut self) {
        if let Some(count) = &self.0 {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl FileIo {
    /// The descriptor reads and writes go to (of a file held by block, its cache file:
    /// see [`Overlay::read_at`]).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether the handle still reads the share's file in place of a copy-up to come.
    pub fn is_deferred(&self) -> bool {
        self.deferred.is_some()
    }

    /// Whether the file is held by block: its I/O must go through the daemon.
    pub fn is_held_by_block(&self) -> bool {
        self.blocks.as_ref().is_some_and(|b| b.is_partial())
    }
}

#[derive(Debug, Clone, Copy)]
struct Deferred {
    /// The flags of the writable open this handle stands for.
    flags: i32,
    /// The overlay's copy-up count when last checked.
    seen: u64,
    /// The share object the handle has open, and what the cache held of its path then.
    what: Deferral,
}

/// Why a handle's file could not be made ready: what was being done, where, and the
/// error (for the adapter's log line and errno).
#[derive(Debug)]
pub struct FileFailed {
    pub op: &'static str,
    pub path: PathBuf,
    pub error: FsError,
}

impl FileFailed {
    fn new(op: &'static str, path: &Path, error: FsError) -> Self {
        Self {
            op,
            path: path.to_path_buf(),
            error,
        }
    }
}

/// How many times a deferred copy-up looks at a name that keeps changing between its
/// look and its copy-up before it fails the request (rather than let a write go where no
/// sync finds it).
const PROMOTE_TRIES: usize = 3;

impl OpenFile {
    /// A file opened for real (no deferred copy-up): `writer` is the cache inode it is
    /// counted as a writer of.
    fn opened(file: File, writer: Option<u64>, on_share: ShareOpen) -> Self {
        Self::with(file, writer, None, on_share)
    }

    fn with(
        file: File,
        writer: Option<u64>,
        deferred: Option<Deferred>,
        on_share: ShareOpen,
    ) -> Self {
        Self {
            io: RwLock::new(FileIo {
                file,
                writer,
                deferred,
                blocks: None,
                on_share,
            }),
        }
    }

    /// What the handle reads and writes now, as it is (no deferred copy-up is made).
    pub fn current(&self) -> RwLockReadGuard<'_, FileIo> {
        self.io.reading()
    }

    /// Whether the handle still reads the share's file in place of a copy-up to come.
    pub fn is_deferred(&self) -> bool {
        self.current().is_deferred()
    }

    fn writing(&self) -> RwLockWriteGuard<'_, FileIo> {
        self.io.writing()
    }
}

impl Overlay {
    /// Whether `file` (whose attributes are `meta`) is the share's: not on the cache's
    /// device.
    pub fn is_on_share(&self, meta: &sys::Stat) -> bool {
        meta.dev() != self.cache_dev
    }

    /// Whether a program's close of `file` (whose attributes are `meta`) must reach the
    /// file itself: a file of the share whose filesystem has something to do at a close
    /// ([`fsinfo::nothing_at_close`]; asked once per device, so that a network
    /// filesystem mounted below a share on a local disk counts as what it is). Such a
    /// file is read and written through the daemon, which passes each close on: the
    /// kernel's own backing file of a passthrough open would be closed without one (the
    /// share's client would never be asked to write out, nor answer with what it failed
    /// to).
    pub fn close_reaches_share(&self, file: &File, meta: &sys::Stat) -> bool {
        if !self.is_on_share(meta) {
            return false;
        }
        let dev = meta.dev();
        if let Some(acts) = self.acts_at_close.locked().get(&dev) {
            return *acts;
        }
        // Asked without the lock (a share's client answers statfs itself); a filesystem
        // that does not answer counts as one that acts at a close.
        let acts = self
            .gate
            .enter()
            .and_then(|g| g.passed(fsinfo::fstatfs(file)))
            .map_or(true, |s| !fsinfo::nothing_at_close(s.fs_type));
        self.acts_at_close.locked().insert(dev, acts);
        acts
    }

    /// Runs `io` on a descriptor of the share's file (`on_share`) through the share's
    /// gate: refused at once while the share does not answer, as every access of the
    /// daemon to the share is, so that no request for a document holds one of the FUSE
    /// threads through an outage. Other files' I/O runs as it is.
    pub(crate) fn share_io<T>(
        &self,
        on_share: bool,
        io: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        if on_share {
            self.gate.enter()?.passed(io())
        } else {
            io()
        }
    }

    /// Opens `rel` for a handle, with [`Overlay::open_deferred`]: a writable open of a
    /// cached file still on the share copies nothing yet.
    pub fn open_file(&self, ctx: &Ctx, rel: &Path, flags: i32) -> FsResult<OpenFile> {
        // A kept copy held by block is looked at against the share at every open, not
        // only once the kernel's timeout ran out: the share's version changed since is
        // not the base its missing blocks can be read from (the copy is let go of then).
        // (Only a cached path can be held by block: other opens take no lock here.)
        let cached = self.policy.classify(rel) == PathClass::Cached;
        let kept_by_block = cached && {
            let mut inner = self.lock_for(&[rel]);
            let kept = inner.state.partial(rel).is_some() && !inner.state.is_dirty(rel);
            if kept {
                inner.validated.remove(rel);
            }
            kept
        };
        if kept_by_block {
            let _ = self.resolve(rel);
        }
        // The copy-up count is read before the open: a copy-up meanwhile is looked at.
        let seen = self.copy_up_count();
        let (file, writer, what) = self.open_deferred(ctx, rel, flags)?;
        let deferred = what.map(|what| Deferred { flags, seen, what });
        let on_share = self.share_open(&file);
        let f = OpenFile::with(file, writer, deferred, on_share);
        if what.is_none() {
            self.attach_blocks(&mut f.writing(), rel)?;
        }
        Ok(f)
    }

    /// A handle for a file opened by a create that found it there (`Overlay::create`):
    /// held by block, it reads and writes through its blocks like any open.
    pub fn created_file(&self, rel: &Path, file: File, writer: Option<u64>) -> FsResult<OpenFile> {
        let on_share = self.share_open(&file);
        let f = OpenFile::opened(file, writer, on_share);
        self.attach_blocks(&mut f.writing(), rel)?;
        Ok(f)
    }

    /// Whether an open descriptor is the share's file (one whose device cannot be told
    /// counts as the share's: its I/O then passes the gate), counted while it is held.
    fn share_open(&self, file: &File) -> ShareOpen {
        if !sys::fstat(file).map_or(true, |m| self.is_on_share(&m)) {
            return ShareOpen(None);
        }
        self.share_files.fetch_add(1, Ordering::AcqRel);
        ShareOpen(Some(self.share_files.clone()))
    }

    /// How many files of the share the handles (and a sync sending files itself) hold
    /// open: a process forked now would close a copy of each (see
    /// [`crate::sys::launcher`]).
    pub fn share_files_open(&self) -> usize {
        self.share_files.load(Ordering::Acquire)
    }

    /// Runs `send` (a sync sending files itself: it writes files of the share, and checks
    /// their fsync) counted as a file of the share open.
    pub fn while_sending<T>(&self, send: impl FnOnce() -> T) -> T {
        self.share_files.fetch_add(1, Ordering::AcqRel);
        let _sending = ShareOpen(Some(self.share_files.clone()));
        send()
    }

    /// Attaches the block file of `rel` to a handle's I/O when the file is held by block:
    /// its base held from now on, and its descriptor without `O_APPEND` (the daemon writes
    /// at the offsets the kernel gives, a block copied from the base included).
    fn attach_blocks(&self, g: &mut FileIo, rel: &Path) -> FsResult<()> {
        if self.policy.classify(rel) != PathClass::Cached {
            return Ok(());
        }
        g.blocks = self.block_file(rel);
        if let Some(bf) = &g.blocks {
            sys::clear_append(&g.file)?;
            bf.hold_base(&self.share);
        }
        Ok(())
    }

    /// [`Overlay::setattr`] through an open handle's file `g`. A file held by block whose
    /// name is gone (unlinked while open) is cut through its blocks (with no name, nothing
    /// to journal), so that its blocks past the cut read as zeros once it grows again.
    pub fn setattr_handle(
        &self,
        ctx: &Ctx,
        rel: &Path,
        attr: SetAttr,
        g: &FileIo,
    ) -> FsResult<Stat> {
        if let (Some(size), Some(bf)) = (attr.size, g.blocks.as_ref()) {
            let gone = matches!(self.resolve(rel), Err(e) if e.errno() == libc::ENOENT);
            if gone {
                bf.set_len(&self.share, &g.file, size, |_| Ok(()))?;
                return Self::setattr_fd(&g.file, SetAttr { size: None, ..attr });
            }
        }
        self.setattr(ctx, rel, attr, Some(&g.file))
    }

    /// The attributes of a handle's file, from its descriptor (through the share's gate
    /// when it is the share's).
    pub fn stat_open(&self, g: &FileIo) -> io::Result<sys::Stat> {
        self.share_io(g.on_share.is(), || sys::fstat(&g.file))
    }

    /// A program closed a descriptor of a handle (FLUSH): a handle still on the share's
    /// file, not deferred, passes the close on to the share (see [`sys::flush`]) and
    /// answers with the share's answer; any other has nothing to do. ENOSYS is answered
    /// as EIO: the kernel would take it for a daemon without FLUSH and stop telling it
    /// of closes.
    pub fn flush_file(&self, g: &FileIo) -> io::Result<()> {
        if !g.on_share.is() || g.deferred.is_some() {
            return Ok(());
        }
        match self.share_io(true, || sys::flush(&g.file)) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
            r => r,
        }
    }

    /// Closes a handle: the blocks of a file held by block written through it are
    /// journaled, and its share of the cache file's writers is let go of.
    pub fn close_file(&self, f: &OpenFile) {
        let g = f.current();
        if let (Some(bf), Some(_)) = (&g.blocks, g.writer) {
            if let Err(e) = self.record_blocks(bf, &g.file) {
                tracing::error!(
                    path = %session::shown(bf.path()),
                    "the blocks written to a file held by block could not be journaled at its close: {e}"
                );
            }
        }
        if let Some(ino) = g.writer {
            self.release_writer(ino);
        }
    }

    /// Reads what a handle's file has at `offset` into `buf`; the length read (less at
    /// the end of the file).
    pub fn read_at(&self, g: &FileIo, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if let Some(bf) = &g.blocks {
            return bf.read_at(&self.share, &g.file, buf, offset);
        }
        self.share_io(g.on_share.is(), || {
            let mut got = 0;
            while got < buf.len() {
                match g.file.read_at(&mut buf[got..], offset + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            }
            Ok(got)
        })
    }

    /// Writes `data` at `offset` of a handle's file (one made ready for writing).
    pub fn write_at(&self, g: &FileIo, data: &[u8], offset: u64) -> io::Result<()> {
        match &g.blocks {
            Some(bf) => bf.write_at(&self.share, &g.file, data, offset),
            None => self.share_io(g.on_share.is(), || g.file.write_all_at(data, offset)),
        }
    }

    /// `fsync` of a handle's file: its data on disk, and of a file held by block the
    /// record of the blocks written.
    pub fn sync_file(&self, g: &FileIo, datasync: bool) -> FsResult<()> {
        self.share_io(g.on_share.is(), || {
            if datasync {
                g.file.sync_data()
            } else {
                g.file.sync_all()
            }
        })?;
        match &g.blocks {
            Some(bf) => self.record_blocks(bf, &g.file),
            None => Ok(()),
        }
    }

    /// The file of a handle, ready for writing: a deferred handle is made writable now
    /// (the file is copied to the cache unless it is there already). `name` tells the
    /// handle's path now (None: the node has no name left).
    pub fn file_to_write<'a>(
        &self,
        ctx: &Ctx,
        f: &'a OpenFile,
        name: impl Fn() -> Option<PathBuf>,
    ) -> Result<RwLockReadGuard<'a, FileIo>, FileFailed> {
        self.file_for(ctx, f, true, name)
    }

    /// The file of a handle for reading: a deferred handle whose file has moved to the
    /// cache since (another handle wrote it) follows it there.
    pub fn file_to_read<'a>(
        &self,
        ctx: &Ctx,
        f: &'a OpenFile,
        name: impl Fn() -> Option<PathBuf>,
    ) -> Result<RwLockReadGuard<'a, FileIo>, FileFailed> {
        self.file_for(ctx, f, false, name)
    }

    /// The handle's file, when [`Overlay::file_to_write`] (`write`) or
    /// [`Overlay::file_to_read`] would give it without asking for the handle's path (the
    /// common case: one shared lock). None for a deferred handle to be written, or one
    /// that may have to follow its file to the cache.
    pub fn ready_without_name<'a>(
        &self,
        f: &'a OpenFile,
        write: bool,
    ) -> Option<RwLockReadGuard<'a, FileIo>> {
        let now = self.copy_up_count();
        let g = f.current();
        match g.deferred {
            Some(d) if write || d.seen != now => None,
            _ => Some(g),
        }
    }

    fn file_for<'a>(
        &self,
        ctx: &Ctx,
        f: &'a OpenFile,
        write: bool,
        name: impl Fn() -> Option<PathBuf>,
    ) -> Result<RwLockReadGuard<'a, FileIo>, FileFailed> {
        let now = self.copy_up_count();
        if let Some(g) = self.ready_without_name(f, write) {
            return Ok(g);
        }
        // A share that cannot tell where the file is now: it is read where it was.
        let moved = || {
            let what = f.current().deferred.map(|d| d.what);
            name()
                .zip(what)
                .is_some_and(|(p, w)| matches!(self.binding(&p, w), Ok(Binding::Cache)))
        };
        if write || moved() {
            self.promote(ctx, f, &name)?;
        } else if let Some(d) = f.writing().deferred.as_mut() {
            d.seen = now;
        }
        Ok(f.current())
    }

    /// Opens for real what a deferred handle stands for and puts it in the handle.
    fn promote(
        &self,
        ctx: &Ctx,
        f: &OpenFile,
        name: &impl Fn() -> Option<PathBuf>,
    ) -> Result<(), FileFailed> {
        let mut g = f.writing();
        let Some(d) = g.deferred else {
            return Ok(());
        };
        let writable = d.flags & libc::O_ACCMODE != libc::O_RDONLY;
        // A name the node no longer has was unlinked or renamed over here.
        let Some(path) = name() else {
            return self.detach(&mut g, writable);
        };
        // Looked at again when the name changes between the look and the copy-up (see
        // `Overlay::open_bound`, `Overlay::keep_version`).
        for _ in 0..PROMOTE_TRIES {
            let path = path.as_path();
            let failed = |op| move |e| FileFailed::new(op, path, e);
            let bound = self
                .binding(path, d.what)
                .map_err(failed("open (deferred copy-up)"))?;
            let opened = match bound {
                Binding::Share | Binding::Cache => self
                    .open_bound(ctx, path, d.flags, d.what)
                    .map_err(failed("open (deferred copy-up)"))?,
                // A descriptor stays bound to its file: the name holds another one, put
                // there here, as by `mv .y .x`.
                Binding::Replaced => return self.detach(&mut g, writable),
                // Another workstation changed the file: the handle's version is kept, and
                // the next sync finds the conflict.
                Binding::Changed if writable => self
                    .keep_version(ctx, path, &g.file, d.what, d.flags)
                    .map_err(failed("write (file changed on the share)"))?,
                // A reader reads on the file it has.
                Binding::Changed => {
                    g.deferred = None;
                    return Ok(());
                }
            };
            // None: the name changed meanwhile; looked at again.
            if let Some((file, writer)) = opened {
                g.on_share = self.share_open(&file);
                g.file = file;
                g.writer = writer;
                g.deferred = None;
                self.attach_blocks(&mut g, path)
                    .map_err(|e| FileFailed::new("open (deferred copy-up)", path, e))?;
                return Ok(());
            }
        }
        Err(FileFailed::new(
            "open (deferred copy-up: the name keeps changing)",
            &path,
            FsError::Errno(libc::EIO),
        ))
    }

    /// A deferred handle whose name holds another file now, put there here (or none): a
    /// writable one gets a private copy that no name shows, as an unlinked file, as POSIX
    /// has it; a reader goes on reading the file it has.
    fn detach(&self, g: &mut FileIo, writable: bool) -> Result<(), FileFailed> {
        if writable {
            g.file = self
                .detached_copy(&g.file)
                .map_err(|e| FileFailed::new("write (file without a name)", Path::new(""), e))?;
            g.on_share = self.share_open(&g.file);
            g.writer = None;
        }
        g.deferred = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{ctx, fresh};
    use super::*;
    use std::io::{Read, Seek, Write};

    fn read_all(g: &FileIo) -> String {
        let mut f = g.file();
        let mut s = String::new();
        f.rewind().expect("rewind");
        f.read_to_string(&mut s).expect("read");
        s
    }

    fn write_all(g: &FileIo, text: &str) {
        let mut f = g.file();
        f.write_all(text.as_bytes()).expect("write");
    }

    fn named(p: &str) -> impl Fn() -> Option<PathBuf> + '_ {
        move || Some(PathBuf::from(p))
    }

    #[test]
    fn a_writable_open_of_a_shares_dotfile_copies_nothing_until_its_first_write() {
        let t = fresh(&[(".x", "share")]);
        let f =
            t.o.open_file(&ctx(), Path::new(".x"), libc::O_RDWR)
                .expect("open");
        assert!(
            f.is_deferred(),
            "deferred: the share's file is read in place"
        );
        assert!(!t.cache.join("upper/.x").exists(), "nothing copied at open");
        assert_eq!(
            read_all(&t.o.file_to_read(&ctx(), &f, named(".x")).expect("read")),
            "share"
        );
        assert!(f.is_deferred(), "a read copies nothing either");
        let g = t.o.file_to_write(&ctx(), &f, named(".x")).expect("write");
        assert!(!f_deferred_held(&g));
        write_all(&g, "mine!");
        drop(g);
        assert!(!f.is_deferred(), "the first write made it the cache's");
        assert_eq!(
            std::fs::read_to_string(t.cache.join("upper/.x")).expect("cache"),
            "mine!"
        );
        assert_eq!(
            std::fs::read_to_string(t.share.join(".x")).expect("share"),
            "share"
        );
        t.o.close_file(&f);
    }

    fn f_deferred_held(g: &FileIo) -> bool {
        g.deferred.is_some()
    }

    #[test]
    fn a_reader_follows_its_file_to_the_cache_once_another_handle_wrote_it() {
        let t = fresh(&[(".x", "share")]);
        let reader =
            t.o.open_file(&ctx(), Path::new(".x"), libc::O_RDONLY)
                .expect("open");
        let writer =
            t.o.open_file(&ctx(), Path::new(".x"), libc::O_RDWR)
                .expect("open");
        {
            let g =
                t.o.file_to_write(&ctx(), &writer, named(".x"))
                    .expect("write");
            write_all(&g, "newer");
        }
        let g =
            t.o.file_to_read(&ctx(), &reader, named(".x"))
                .expect("read");
        assert_eq!(
            read_all(&g),
            "newer",
            "the reader sees the cache's copy now"
        );
        drop(g);
        assert!(!reader.is_deferred());
        t.o.close_file(&writer);
        t.o.close_file(&reader);
    }

    #[test]
    fn a_deferred_writer_whose_name_is_gone_writes_a_copy_no_name_shows() {
        let t = fresh(&[(".x", "share")]);
        let f =
            t.o.open_file(&ctx(), Path::new(".x"), libc::O_RDWR)
                .expect("open");
        let g = t.o.file_to_write(&ctx(), &f, || None).expect("write");
        write_all(&g, "lost?");
        drop(g);
        assert!(!f.is_deferred());
        assert!(
            !t.cache.join("upper/.x").exists(),
            "no name shows the detached copy"
        );
        assert_eq!(
            std::fs::read_to_string(t.share.join(".x")).expect("share"),
            "share"
        );
        assert_eq!(
            read_all(&f.current()),
            "lost?",
            "the handle reads what it wrote"
        );
        t.o.close_file(&f);
    }

    #[test]
    fn a_deferred_writer_keeps_its_version_when_another_workstation_replaced_the_file() {
        let t = fresh(&[(".x", "share")]);
        let f =
            t.o.open_file(&ctx(), Path::new(".x"), libc::O_RDWR)
                .expect("open");
        // Another workstation saves .x as a new file (rename over it).
        std::fs::write(t.share.join(".x.tmp"), "theirs").expect("write");
        std::fs::rename(t.share.join(".x.tmp"), t.share.join(".x")).expect("rename");
        let g = t.o.file_to_write(&ctx(), &f, named(".x")).expect("write");
        assert_eq!(read_all(&g), "share", "the handle's own version is kept");
        drop(g);
        assert_eq!(
            std::fs::read_to_string(t.cache.join("upper/.x")).expect("cache"),
            "share",
            "copied up from the file the handle has open, for the sync to find the conflict"
        );
        t.o.close_file(&f);
    }

    #[test]
    fn a_writer_is_counted_until_its_handle_is_closed() {
        let t = fresh(&[(".x", "share")]);
        let f =
            t.o.open_file(&ctx(), Path::new(".x"), libc::O_RDWR)
                .expect("open");
        drop(t.o.file_to_write(&ctx(), &f, named(".x")).expect("write"));
        let ino = f.current().writer.expect("a writer of the cache file");
        assert!(
            t.o.lock_any().writers.contains_key(&ino),
            "counted while open"
        );
        t.o.close_file(&f);
        assert!(
            !t.o.lock_any().writers.contains_key(&ino),
            "let go of at close"
        );
    }
}
