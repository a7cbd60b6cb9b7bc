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
    pub(super) fn list(&self, ino: INodeNo, path: &Path) -> Result<Vec<DirListEntry>, Errno> {
        let listing = self
            .overlay
            .readdir(path)
            .map_err(|e| reply_err("readdir", path, &e))?;
        let mut entries = Vec::with_capacity(listing.len() + 2);
        entries.push((ino.0, FileType::Directory, ".".into()));
        entries.push((ino.0, FileType::Directory, "..".into()));
        let mut nodes = self.nodes();
        for e in listing {
            let id = nodes.child(ino.0, &e.name, e.file_type, false);
            entries.push((id, file_type(e.file_type), e.name));
        }
        Ok(entries)
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
            let path = self.path(ino)?;
            *g = Some(self.list(ino, &path)?);
            match sig {
                Some(sig) => self.listed().insert(ino.0, Listed::new(*sig)),
                None => self.listed().remove(&ino.0),
            };
        }
        Ok(g)
    }

    /// The I/O mode of a new handle on `node`, counted as open (see [`crate::backing`]).
    pub(super) fn io_mode(
        &self,
        node: u64,
        file: &File,
        deferred: bool,
    ) -> std::io::Result<IoMode> {
        let meta = crate::sys::fstat(file)?;
        let kind = OpenKind {
            through_daemon: deferred,
            keep_for: self.ttl.share,
        };
        self.io.choose(node, file, &meta, kind)
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
            Handle::File { file, .. } => crate::sys::fstat(file.current().file()).ok(),
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
        self.file_ready(req, h, true)
    }

    /// The file of a handle for reading (see [`Overlay::file_to_read`]).
    pub(super) fn readable<'a>(
        &self,
        req: &Caller,
        h: &'a Handle,
    ) -> Result<RwLockReadGuard<'a, FileIo>, Errno> {
        self.file_ready(req, h, false)
    }

    fn file_ready<'a>(
        &self,
        req: &Caller,
        h: &'a Handle,
        write: bool,
    ) -> Result<RwLockReadGuard<'a, FileIo>, Errno> {
        let Handle::File { file, node, .. } = h else {
            return Err(Errno::EISDIR);
        };
        let (ctx, name) = (ctx(req, 0), || self.path(INodeNo(*node)).ok());
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
