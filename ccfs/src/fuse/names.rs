//! Node ids and names: the path of a node, the node of a name (one node for the names of a
//! file with several links), counting requests by path.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use fuse_ring::reply as rep;
use fuser::{Errno, FileAttr, INodeNo};

use crate::counters::Req;
use crate::locks::Locked;
use crate::nodes::{Nodes, Unclear};
use crate::overlay::Layer;

use super::*;

impl CcfsFs {
    /// How long the kernel may keep an answer that came from `layer`.
    pub(super) fn ttl(&self, layer: Layer) -> Duration {
        match layer {
            Layer::Upper => self.ttl.cache,
            Layer::Lower | Layer::Share => self.ttl.share,
        }
    }

    pub(super) fn nodes(&self) -> MutexGuard<'_, Nodes> {
        self.nodes.locked()
    }

    pub(super) fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.nodes().path(ino.0).ok_or(Errno::ESTALE)
    }

    /// The path of `ino`, and the count of moves it holds for (see
    /// [`crate::nodes::Nodes::moves`]). Waits for a move under way on the path (see
    /// [`Self::begin_moves`]).
    pub(super) fn path_seen(&self, ino: INodeNo) -> Result<(PathBuf, u64), Errno> {
        self.when_clear(|nodes| nodes.path_clear(ino.0).map(|p| (p, nodes.moves())))
    }

    /// What `take` takes from the table, once no move or removal under way is in its way
    /// ([`Unclear::Moving`]: waited for, EAGAIN past [`MOVED_WAIT`]); ESTALE for
    /// [`Unclear::Gone`].
    fn when_clear<T>(
        &self,
        mut take: impl FnMut(&mut Nodes) -> Result<T, Unclear>,
    ) -> Result<T, Errno> {
        let mut nodes = self.nodes();
        let deadline = Instant::now() + MOVED_WAIT;
        loop {
            match take(&mut nodes) {
                Ok(v) => return Ok(v),
                Err(Unclear::Gone) => return Err(Errno::ESTALE),
                Err(Unclear::Moving) => nodes = self.wait_moved(nodes, deadline, Errno::EAGAIN)?,
            }
        }
    }

    /// Waits until a move or removal under way ends (or `deadline` passes: `late` then).
    fn wait_moved<'a>(
        &self,
        nodes: MutexGuard<'a, Nodes>,
        deadline: Instant,
        late: Errno,
    ) -> Result<MutexGuard<'a, Nodes>, Errno> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(late);
        }
        let (nodes, _) = self
            .moved
            .wait_timeout(nodes, left)
            .unwrap_or_else(PoisonError::into_inner);
        Ok(nodes)
    }

    /// The path of `ino`, pinned for a request that changes something there: the path
    /// names the same object until the returned [`Pins`] are dropped, whatever moves
    /// through the mount meanwhile (see [`Nodes::pin`]). Waits for a move or removal under
    /// way on the path, EAGAIN when it lasts past [`MOVED_WAIT`]; ESTALE for a node that
    /// has no name.
    pub(super) fn pin(&self, ino: INodeNo) -> Result<(PathBuf, Pins<'_>), Errno> {
        let (mut paths, pins) = self.pin_all(&[ino.0])?;
        Ok((paths.pop().unwrap_or_default(), pins))
    }

    /// [`Self::pin`] for a request on two nodes (rename, link).
    pub(super) fn pin_two(
        &self,
        a: INodeNo,
        b: INodeNo,
    ) -> Result<(PathBuf, PathBuf, Pins<'_>), Errno> {
        let (mut paths, pins) = self.pin_all(&[a.0, b.0])?;
        let second = paths.pop().unwrap_or_default();
        Ok((paths.pop().unwrap_or_default(), second, pins))
    }

    fn pin_all(&self, ids: &[u64]) -> Result<(Vec<PathBuf>, Pins<'_>), Errno> {
        let mut pinned = Vec::new();
        let paths = self.when_clear(|nodes| nodes.pin(ids, &mut pinned))?;
        let pins = Pins {
            fs: self,
            pinned,
            marked: Vec::new(),
        };
        Ok((paths, pins))
    }

    /// Marks the nodes named `names` (each a parent and a name) as about to be moved or
    /// removed by the request that holds `pins`, and waits until no other request has a
    /// way through them pinned: a change under way below a directory, or on a file,
    /// finishes at the path it took before the directory or file leaves it. EBUSY when
    /// that lasts past [`MOVE_WAIT`] (a share that hangs). The marks go with `pins`.
    pub(super) fn settle(
        &self,
        pins: &mut Pins<'_>,
        names: &[(INodeNo, &OsStr)],
    ) -> Result<(), Errno> {
        let mut nodes = self.nodes();
        for (parent, name) in names {
            let Some(id) = nodes.named(parent.0, name) else {
                continue;
            };
            if pins.marked.iter().any(|(m, _)| *m == id) {
                continue;
            }
            if nodes.mark(id) {
                pins.marked.push((id, false));
            }
        }
        let deadline = Instant::now() + MOVE_WAIT;
        loop {
            let busy = pins.marked.iter().any(|(id, _)| {
                let own = pins.pinned.iter().filter(|p| *p == id).count();
                nodes.pins(*id) as usize > own
            });
            if !busy {
                return Ok(());
            }
            nodes = self.wait_moved(nodes, deadline, Errno::EBUSY)?;
        }
    }

    /// The moves of the nodes [`Self::settle`] marked start: lookups, listings and
    /// getattrs on a way through them wait until they are done (see
    /// [`Nodes::begin_move`]).
    pub(super) fn begin_moves(&self, pins: &mut Pins<'_>) {
        let mut nodes = self.nodes();
        for (id, moving) in pins.marked.iter_mut() {
            nodes.begin_move(*id);
            *moving = true;
        }
    }

    /// `look` at the path of `ino`, looked at again when a node on its way moved during the
    /// look (see [`Self::path_seen`]): the path and what `look` found there. EAGAIN when
    /// they kept moving.
    pub(super) fn at_path<T>(
        &self,
        ino: INodeNo,
        look: impl Fn(&Path) -> T,
    ) -> Result<(PathBuf, T), Errno> {
        for _ in 0..MOVED_TRIES {
            let (path, seen) = self.path_seen(ino)?;
            let found = look(&path);
            if !self.moved_since(ino, seen) {
                return Ok((path, found));
            }
        }
        Err(Errno::EAGAIN)
    }

    /// Whether a node on the way of `ino` moved through this mount since `seen` (see
    /// [`Nodes::moved_since`]).
    pub(super) fn moved_since(&self, ino: INodeNo, seen: u64) -> bool {
        self.nodes().moved_since(ino.0, seen)
    }

    /// Counts a request on node `ino` (and `name` in it, for a request on a name).
    pub(super) fn count(&self, r: Req, ino: INodeNo, name: Option<&OsStr>) {
        let requests = &self.overlay.requests;
        if !requests.by_path_wanted() {
            requests.count(r);
            return;
        }
        match (self.nodes().path(ino.0), name) {
            (Some(p), Some(n)) => requests.count_at(r, &p.join(n)),
            (Some(p), None) => requests.count_at(r, &p),
            // A node no longer named (a file removed while open): counted all the same.
            (None, _) => requests.count_at(r, Path::new(crate::counters::UNNAMED)),
        }
    }

    /// An entry reply for `name` in `parent`: counts the lookup on its node. A file with
    /// several links joins the node of another of its names, when one is known and a name
    /// of that node still holds the same object (a freed and reused backing inode number
    /// never joins two files). A name of a node with several names that no longer holds
    /// that node's object (another workstation replaced or renamed one of the links) gets
    /// a node of its own: requests on a node go to the object behind its first name. Names
    /// of a cached file still on the share are not joined: a change through one name is
    /// copied up to that name alone, so each name shows what the share will hold after
    /// sync.
    pub(super) fn entry(
        &self,
        parent: INodeNo,
        name: &OsStr,
        found: &crate::overlay::Found,
    ) -> FileAttr {
        let attached = self.entry_seen(parent, name, found, None);
        // Without a count to check, the entry is always attached. Its node is new at the
        // name to a look taken before (see `Nodes::touch`).
        if let Some(a) = &attached {
            self.nodes().touch(a.ino.0);
        }
        attached.unwrap_or_else(|| attr(0, &found.meta))
    }

    /// [`Self::entry`] for what was found at a path taken when directory moves were at
    /// `seen` (see [`crate::nodes::Nodes::moves`]): None, and nothing named, when a
    /// directory moved since. The path may then have named another directory, and its
    /// entry must not take this parent's name: a node of another type there would
    /// detach the one the kernel holds, and the files open on it with it.
    pub(super) fn entry_seen(
        &self,
        parent: INodeNo,
        name: &OsStr,
        found: &crate::overlay::Found,
        seen: Option<u64>,
    ) -> Option<FileAttr> {
        let m = &found.meta;
        let key = (m.dev(), m.ino());
        if seen.is_some_and(|s| self.moved_since(parent, s)) {
            return None;
        }
        let joined = self.nodes().named(parent.0, name);
        if let Some(id) = joined.filter(|&id| self.nodes().name_count(id) > 1) {
            if !self.holds(id, key) {
                self.nodes().detach(parent.0, name);
            }
        }
        if !m.is_dir() && m.nlink() > 1 && found.layer != Layer::Lower {
            let known = self.links().get(&key).copied();
            if let Some(id) = known {
                if self.holds(id, key) && self.nodes().add_name(id, parent.0, name) {
                    return Some(attr(id, m));
                }
            }
            let id = self
                .nodes()
                .child_seen(parent.0, name, m.file_type(), true, seen)?;
            self.links().insert(key, id);
            return Some(attr(id, m));
        }
        let id = self
            .nodes()
            .child_seen(parent.0, name, m.file_type(), true, seen)?;
        Some(attr(id, m))
    }

    /// Whether the object behind the first name of node `id` is `key` (device, inode).
    pub(super) fn holds(&self, id: u64, key: (u64, u64)) -> bool {
        let witness = self.nodes().path(id);
        witness.is_some_and(|w| {
            self.overlay
                .resolve(&w)
                .is_ok_and(|f| (f.meta.dev(), f.meta.ino()) == key)
        })
    }

    pub(super) fn links(&self) -> MutexGuard<'_, HashMap<(u64, u64), u64>> {
        self.links.locked()
    }

    /// unlink (`dir` false) or rmdir (`dir` true). The name's node is detached first, so
    /// that nothing made meanwhile at that name can get it, and put back if the change fails.
    pub(super) fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool, reply: impl rep::Empty) {
        let (parent_path, mut pins) = try_reply!(reply, self.pin(parent));
        try_reply!(reply, self.settle(&mut pins, &[(parent, name)]));
        let path = parent_path.join(name);
        let detached = self.nodes().detach(parent.0, name);
        let result = if dir {
            self.overlay.rmdir(&parent_path, name)
        } else {
            self.overlay.unlink(&parent_path, name)
        };
        match result {
            Ok(()) => reply.ok(),
            Err(e) => {
                if let Some(id) = detached {
                    self.nodes().reattach(parent.0, name, id);
                }
                reply.error(reply_err(if dir { "rmdir" } else { "unlink" }, &path, &e))
            }
        }
    }
}

/// How long a move or removal waits for the changes under way on or below what it moves
/// or removes ([`CcfsFs::settle`]), then fails with EBUSY. Meanwhile the kernel holds the
/// directories of the names it changes, and a request that would pin a way through what
/// it moves waits: only a share that hangs, or the first write to a large dotfile (its
/// copy to the cache), keeps a change under way that long.
pub(super) const MOVE_WAIT: Duration = Duration::from_secs(5);

/// How long a request waits for a move or removal under way on its way (at most
/// [`MOVE_WAIT`] and the move's own I/O), then fails with EAGAIN: only a share that hangs
/// makes it wait that long.
pub(super) const MOVED_WAIT: Duration = Duration::from_secs(60);

/// The nodes one request pinned ([`CcfsFs::pin`]) and marked ([`CcfsFs::settle`]); let go
/// when dropped, waking the requests that wait for them.
pub(super) struct Pins<'a> {
    fs: &'a CcfsFs,
    pinned: Vec<u64>,
    /// Each marked node, and whether its move began ([`CcfsFs::begin_moves`]).
    marked: Vec<(u64, bool)>,
}

impl Drop for Pins<'_> {
    fn drop(&mut self) {
        let mut nodes = self.fs.nodes();
        let mut wake = !self.marked.is_empty();
        for (id, moved) in self.marked.drain(..) {
            nodes.unmark(id, moved);
        }
        wake |= nodes.unpin(&self.pinned);
        drop(nodes);
        if wake {
            self.fs.moved.notify_all();
        }
    }
}
