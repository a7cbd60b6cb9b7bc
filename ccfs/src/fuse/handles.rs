//! The handle table: open files (an [`crate::overlay::OpenFile`] each) and directories,
//! with each directory's listing and whether the kernel may keep it.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, RwLockReadGuard};
use std::time::Duration;

use fuse_ring::Caller;
use fuser::{Errno, FileHandle, FileType, INodeNo};

use crate::backing::{IoMode, OpenKind};
use crate::locks::Locked;
use crate::overlay::{DirSignature, FileIo, OpenFile};
use crate::sys::Stat;

use super::*;

#[derive(Debug)]
pub(super) enum Handle {
    File {
        file: OpenFile,
        node: u64,
        /// How the kernel does this handle's I/O (see [`crate::backing`]).
        mode: IoMode,
    },
    Dir {
        /// Listed at the first READDIR (and again at a rewind), not at OPENDIR: when the
        /// kernel keeps the directory's listing, it asks for none. Lock order: 2
        /// (ARCHITECTURE.md, Locks), held while the listing is made.
        listing: Mutex<Option<Vec<DirListEntry>>>,
        /// What the directory was at OPENDIR; None when that could not be told.
        sig: Option<DirSignature>,
    },
}

pub(super) type DirListEntry = (u64, FileType, std::ffi::OsString);

/// How adding a listing's entries with their attributes ended.
pub(super) enum Plus {
    /// Entries added (none when the reply had no room, or none was left).
    Added,
    /// A directory moved through this mount before anything was added: the path the
    /// entries were looked at may have named another directory.
    Moved,
}

impl Handle {
    pub(super) fn file(node: u64, file: OpenFile, mode: IoMode) -> Self {
        Handle::File { file, node, mode }
    }
}

/// A directory's signature when it was last listed, and when that was.
#[derive(Debug, Clone, Copy)]
pub(super) struct Listed {
    sig: DirSignature,
    at: std::time::Instant,
    /// Whether an unchanged signature means an unchanged listing for good: only for a
    /// directory the cache alone holds (this mount alone changes it). A share's times may
    /// show two changes as one (a share that keeps them to the second, two changes in one
    /// clock tick, times set back by `tar`, `cp -a` or a server clock behind ours), so a
    /// listing of a share directory is kept no longer than the share's names are
    /// ([`Timeouts::share`]).
    lasting: bool,
}

impl Listed {
    pub(super) fn new(sig: DirSignature) -> Self {
        Self {
            sig,
            at: std::time::Instant::now(),
            lasting: sig.share_mtime().is_none(),
        }
    }

    /// Whether the kernel may keep this listing of a directory whose signature is `now`.
    pub(super) fn still(&self, now: &DirSignature, ttl: Duration) -> bool {
        self.sig == *now && (self.lasting || self.at.elapsed() < ttl)
    }
}

impl CcfsFs {
    pub(super) fn listed(&self) -> MutexGuard<'_, HashMap<u64, Listed>> {
        self.listed.locked()
    }

    /// The merged listing of directory `ino` at `path`, with `.` and `..`, each entry
    /// with its node (made for names not seen before, uncounted).
    ///
    /// `path` was taken when directory moves were at `seen`: None when a directory moved
    /// since (the path may have named another directory: take it again).
    pub(super) fn list(
        &self,
        ino: INodeNo,
        path: &Path,
        seen: u64,
    ) -> Result<Option<Vec<DirListEntry>>, Errno> {
        let listing = match self.overlay.readdir(path) {
            Ok(l) => l,
            Err(_) if self.moved_since(ino, seen) => return Ok(None),
            Err(e) => return Err(reply_err("readdir", path, &e)),
        };
        let mut entries = Vec::with_capacity(listing.len() + 2);
        entries.push((ino.0, FileType::Directory, ".".into()));
        entries.push((ino.0, FileType::Directory, "..".into()));
        let mut nodes = self.nodes();
        if nodes.moved_since(ino.0, seen) {
            return Ok(None);
        }
        for e in listing {
            let id = nodes.child(ino.0, &e.name, e.file_type, false);
            entries.push((id, file_type(e.file_type), e.name));
        }
        Ok(Some(entries))
    }

    /// The listing a directory handle serves from `offset`: made at the first read or
    /// a rewind (the directory as it is now), then kept for the handle's later reads.
    pub(super) fn listing<'h>(
        &self,
        ino: INodeNo,
        h: &'h Handle,
        offset: u64,
    ) -> Result<MutexGuard<'h, Option<Vec<DirListEntry>>>, Errno> {
        let Handle::Dir { listing, sig } = h else {
            return Err(Errno::ENOTDIR);
        };
        let mut g = listing.locked();
        if g.is_none() || offset == 0 {
            *g = None;
            for _ in 0..MOVED_TRIES {
                let (path, seen) = self.path_seen(ino)?;
                if let Some(entries) = self.list(ino, &path, seen)? {
                    *g = Some(entries);
                    break;
                }
            }
            if g.is_none() {
                // Directories kept moving under the listing: the caller may try again.
                return Err(Errno::EAGAIN);
            }
            match sig {
                Some(sig) => self.listed().insert(ino.0, Listed::new(*sig)),
                None => self.listed().remove(&ino.0),
            };
        }
        Ok(g)
    }

    /// Adds `part` of the listing of `ino` (at `dir`, a path that held while directory
    /// moves were at `seen`) to a READDIRPLUS reply, each entry with its attributes as a
    /// lookup would give them (and counted as one: the kernel takes every entry of the
    /// reply as looked up). An entry gone since the listing was made is left out. A
    /// directory moved midway ends the reply with what it holds (the kernel reads on
    /// from there, and the next read takes the path again).
    pub(super) fn plus_entries<'a, R: rep::DirectoryPlus>(
        &self,
        ino: INodeNo,
        dir: &Path,
        seen: u64,
        part: impl Iterator<Item = (usize, &'a DirListEntry)>,
        reply: &mut R,
    ) -> Result<Plus, Errno> {
        let mut added = false;
        let moved = |added: bool| Ok(if added { Plus::Added } else { Plus::Moved });
        // `.` and `..` are never looked up by the kernel: any attributes of a directory.
        let mut dots: Option<FileAttr> = None;
        let look = self.overlay.entries_of(dir);
        for (i, (id, _, name)) in part {
            let next = (i + 1) as u64;
            if name == "." || name == ".." {
                if dots.is_none() {
                    match self.overlay.resolve(dir) {
                        Ok(found) => dots = Some(attr(ino.0, &found.meta)),
                        Err(_) if self.moved_since(ino, seen) => return moved(added),
                        Err(e) => return Err(reply_err("readdirplus", dir, &e)),
                    }
                }
                let Some(a) = dots.as_ref() else { break };
                if reply.add(INodeNo(*id), next, name, &Duration::ZERO, a, Generation(0)) {
                    break;
                }
                added = true;
                continue;
            }
            let found = match look.resolve(name) {
                Ok(found) => found,
                Err(_) if self.moved_since(ino, seen) => return moved(added),
                Err(_) => continue,
            };
            let Some(a) = self.entry_seen(ino, name, &found, Some(seen)) else {
                return moved(added);
            };
            if reply.add(a.ino, next, name, &self.ttl(found.layer), &a, Generation(0)) {
                // Not sent: the kernel does not count it.
                self.nodes().forget(a.ino.0, 1);
                break;
            }
            added = true;
        }
        Ok(Plus::Added)
    }

    /// The I/O mode of a new handle on `node` (`through`: its writes must reach the
    /// daemon), counted as open (see [`crate::backing`]), and whether the kernel tells the
    /// daemon of its closes (FLUSH): a file of a share that acts at a close, opened for
    /// writing (`writable`), whose I/O goes through the daemon for that reason (see
    /// [`crate::overlay::Overlay::close_reaches_share`]).
    pub(super) fn io_mode(
        &self,
        node: u64,
        file: &File,
        through: bool,
        writable: bool,
    ) -> std::io::Result<(IoMode, bool)> {
        let meta = crate::sys::fstat(file)?;
        let to_share = self.overlay.close_reaches_share(file, &meta);
        let kind = OpenKind {
            through_daemon: through || to_share,
            keep_for: self.ttl.share,
        };
        let mode = self.io.choose(node, file, &meta, kind)?;
        Ok((mode, to_share && writable && !through))
    }

    pub(super) fn handles(&self) -> MutexGuard<'_, HashMap<u64, Arc<Handle>>> {
        self.handles.locked()
    }

    pub(super) fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        self.handles().get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    pub(super) fn add_handle(&self, h: Handle) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles().insert(fh, Arc::new(h));
        FileHandle(fh)
    }

    /// The attributes of `node` from one of its open handles. The handle table is not
    /// held while a handle's descriptor is looked at: a handle being copied up holds its
    /// `io` for the whole copy, and every request needs the table.
    pub(super) fn open_node_stat(&self, node: u64) -> Option<Stat> {
        let open: Vec<Arc<Handle>> = self
            .handles()
            .values()
            .filter(|h| matches!(&***h, Handle::File { node: n, .. } if *n == node))
            .cloned()
            .collect();
        open.iter().find_map(|h| match &**h {
            Handle::File { file, .. } => self.overlay.stat_open(&file.current()).ok(),
            _ => None,
        })
    }

    pub(super) fn file_of(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        let h = self.handle(fh)?;
        match &*h {
            Handle::File { .. } => Ok(h),
            Handle::Dir { .. } => Err(Errno::EISDIR),
        }
    }

    /// The file of a handle, ready for writing: a deferred handle is made writable now
    /// (see [`Overlay::file_to_write`]).
    pub(super) fn writable<'a>(
        &self,
        req: &Caller,
        h: &'a Handle,
    ) -> Result<RwLockReadGuard<'a, FileIo>, Errno> {
        self.file_ready(req, h, true, None)
    }

    /// [`Self::writable`] for a request that pinned the node's path already (`path`).
    pub(super) fn writable_at<'a>(
        &self,
        req: &Caller,
        h: &'a Handle,
        path: Option<&Path>,
    ) -> Result<RwLockReadGuard<'a, FileIo>, Errno> {
        self.file_ready(req, h, true, path)
    }

    /// The file of a handle for reading (see [`Overlay::file_to_read`]).
    pub(super) fn readable<'a>(
        &self,
        req: &Caller,
        h: &'a Handle,
    ) -> Result<RwLockReadGuard<'a, FileIo>, Errno> {
        self.file_ready(req, h, false, None)
    }

    /// The handle's file, made ready; `pinned`: the node's path, pinned by the request.
    fn file_ready<'a>(
        &self,
        req: &Caller,
        h: &'a Handle,
        write: bool,
        pinned: Option<&Path>,
    ) -> Result<RwLockReadGuard<'a, FileIo>, Errno> {
        let Handle::File { file, node, .. } = h else {
            return Err(Errno::EISDIR);
        };
        let ino = INodeNo(*node);
        // A deferred handle's copy-up acts at the node's path: pinned until it is done
        // (see `CcfsFs::pin`), so that a directory moved meanwhile cannot make it copy or
        // keep another file. Pinned before the handle's lock is taken, and only when the
        // handle needs its path (the common case asks for none).
        let (here, _pins) = match pinned {
            Some(p) => (Some(p.to_path_buf()), None),
            None => {
                if let Some(g) = self.overlay.ready_without_name(file, write) {
                    return Ok(g);
                }
                match self.pin(ino) {
                    Ok((path, pins)) => (Some(path), Some(pins)),
                    // No name left: the handle's file has none either.
                    Err(Errno::ESTALE) => (None, None),
                    Err(e) => return Err(e),
                }
            }
        };
        // Unpinned only when the handle came to need its path meanwhile (a reader told
        // that the file went to the cache): it is checked there by its identity.
        let name = || here.clone().or_else(|| self.path(ino).ok());
        let ctx = ctx(req, 0);
        let ready = if write {
            self.overlay.file_to_write(&ctx, file, name)
        } else {
            self.overlay.file_to_read(&ctx, file, name)
        };
        ready.map_err(|f| reply_err(f.op, &f.path, &f.error))
    }

    /// What closing `h` undoes: its share of the cache file's writers, its I/O mode (the
    /// last passthrough handle of a node gives the backing file back to the kernel).
    pub(super) fn let_go(&self, h: &Handle) {
        if let Handle::File { file, node, mode } = h {
            self.overlay.close_file(file);
            self.io.released(*node, *mode);
        }
    }
}
