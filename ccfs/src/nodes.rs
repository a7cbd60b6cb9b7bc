//! The inode layer: the node ids the kernel knows, each bound to a parent node and a name,
//! with its lookup count. No FUSE types here.
//!
//! Node ids come from a counter and are never reused; they never rest on an inode number
//! of the share or the cache, which those filesystems free and give to new files (a share
//! on ext4 gives a deleted dotfile's number to the next document: a node keyed by it would
//! cross the two files). A node keeps its id across copy-up and rename (a rename moves the
//! node, and its children with it); an unlink or a rename over it detaches it from its
//! name, so a new file at that name gets a node of its own while the kernel may still
//! hold the old one. A hard-linked file is one node with several names (the kernel keeps
//! one inode, so its cached attributes stay right for every name); each lookup of one of
//! its names checks it against the object behind the first name (`CcfsFs::entry`).

use std::collections::HashMap;

/// The node table's maps: a seeded hasher (foldhash) instead of std's SipHash, a tenth of
/// the daemon's time on a first listing (doc/PERFORMANCE.md).
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// The root directory's node id (FUSE's).
pub const ROOT: u64 = 1;

#[derive(Debug)]
struct Node {
    /// Its names (parent node, name); the first is the one used to reach it. Empty once
    /// every name was unlinked or renamed over.
    names: Vec<(u64, OsString)>,
    /// `S_IFMT` bits of what the node was last found to be.
    kind: u32,
    /// Lookups the kernel holds (replies it got) and has not forgotten yet.
    lookups: u64,
    /// Requests under way whose path goes through this node (see [`Nodes::pin`]).
    pins: u32,
    /// Requests under way that move or remove this node (see [`Nodes::mark`]).
    marks: u32,
    /// Of those, the ones whose move is under way (see [`Nodes::begin_move`]).
    moving: u32,
    /// The move count ([`Nodes::moves`]) when this node last moved or lost a name.
    moved_at: u64,
}

/// Why [`Nodes::pin`] or [`Nodes::path_clear`] gave no path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unclear {
    /// A node on the way has no name any more, or the table does not know it.
    Gone,
    /// A node on the way is being moved or removed: ask again once it is unmarked.
    Moving,
}

/// The names in each directory node: parent -> name -> node. Hashed, and looked up by a
/// borrowed name (a directory listing of 20,000 names costs one lookup each, no copy).
#[derive(Debug, Default)]
struct Children(Map<u64, Map<OsString, u64>>);

impl Children {
    fn get(&self, parent: u64, name: &OsStr) -> Option<u64> {
        self.0
            .get(&parent)
            .and_then(|names| names.get(name))
            .copied()
    }

    fn insert(&mut self, parent: u64, name: OsString, id: u64) {
        self.0.entry(parent).or_default().insert(name, id);
    }

    fn remove(&mut self, parent: u64, name: &OsStr) -> Option<u64> {
        let names = self.0.get_mut(&parent)?;
        let id = names.remove(name);
        if names.is_empty() {
            self.0.remove(&parent);
        }
        id
    }

    /// The nodes named in directory `parent`.
    fn of(&self, parent: u64) -> Vec<u64> {
        self.0
            .get(&parent)
            .map(|names| names.values().copied().collect())
            .unwrap_or_default()
    }

    fn has_any(&self, parent: u64) -> bool {
        self.0.contains_key(&parent)
    }
}

/// The node table (see the module documentation).
#[derive(Debug)]
pub struct Nodes {
    by_id: Map<u64, Node>,
    children: Children,
    next: u64,
    /// Moves, removals and new names through this mount so far: see [`Nodes::moves`].
    moves: u64,
    /// Marks held (see [`Nodes::mark`]).
    marked: u32,
}

impl Default for Nodes {
    fn default() -> Self {
        Self::new()
    }
}

impl Nodes {
    pub fn new() -> Self {
        let mut by_id = Map::default();
        by_id.insert(
            ROOT,
            Node {
                names: vec![(ROOT, OsString::new())],
                kind: libc::S_IFDIR,
                lookups: 1,
                pins: 0,
                marks: 0,
                moving: 0,
                moved_at: 0,
            },
        );
        Self {
            by_id,
            children: Children::default(),
            next: ROOT,
            moves: 0,
            marked: 0,
        }
    }

    /// A count of the moves and removals through this mount: each rename of a node, each
    /// move as it starts ([`Nodes::begin_move`]), each name a node loses, each node a
    /// change made ([`Nodes::touch`]), each node that leaves the table. Each node keeps
    /// the count of its last one. A path taken from the table before a move may name
    /// another object after it: a request that looks at a path takes this count with it,
    /// and takes the path again when a node on its way moved since
    /// ([`Nodes::moved_since`], [`Nodes::child_seen`]). (A request that changes something
    /// pins its way instead: [`Nodes::pin`].)
    pub fn moves(&self) -> u64 {
        self.moves
    }

    /// Whether a node on the way of `id` (`id` included) moved or lost its name since the
    /// move count was `seen`, or `id` has no way to the root any more.
    pub fn moved_since(&self, id: u64, seen: u64) -> bool {
        if seen == self.moves {
            return false;
        }
        let mut cur = id;
        for _ in 0..4096 {
            if cur == ROOT {
                return false;
            }
            let Some(n) = self.by_id.get(&cur) else {
                return true;
            };
            let Some((parent, _)) = n.names.first() else {
                return true;
            };
            if n.moved_at > seen {
                return true;
            }
            cur = *parent;
        }
        true
    }

    /// Stamps node `id`, just made by a change at its name (create, mkdir, link...), as
    /// moved: a look at the name taken before the change does not name it after.
    pub fn touch(&mut self, id: u64) {
        self.stamp(id);
    }

    /// A new move count, given to node `id` as its last move.
    fn stamp(&mut self, id: u64) {
        self.moves += 1;
        if let Some(n) = self.by_id.get_mut(&id) {
            n.moved_at = self.moves;
        }
    }

    /// Whether node `id` is of type `kind` (true for a node the table does not know).
    pub fn is_kind(&self, id: u64, kind: u32) -> bool {
        self.by_id.get(&id).is_none_or(|n| n.kind == kind)
    }

    /// [`Nodes::child`], unless a node on the parent's way, or the node at the name, moved
    /// since `seen` (a count of [`Nodes::moves`] taken with the path the caller looked
    /// at): None then.
    pub fn child_seen(
        &mut self,
        parent: u64,
        name: &OsStr,
        kind: u32,
        lookup: bool,
        seen: Option<u64>,
    ) -> Option<u64> {
        let moved = |s: u64| {
            self.moved_since(parent, s)
                || self
                    .children
                    .get(parent, name)
                    .and_then(|id| self.by_id.get(&id))
                    .is_some_and(|n| n.moved_at > s)
        };
        if seen.is_some_and(moved) {
            return None;
        }
        Some(self.child(parent, name, kind, lookup))
    }

    /// The path of a node below the mount root; None for a node that has no name any more
    /// (or whose parent lost its name) or that the table does not know.
    pub fn path(&self, id: u64) -> Option<PathBuf> {
        self.way(id, |_, _| true).ok()
    }

    /// [`Nodes::path`], or [`Unclear::Moving`] when a node on the way (`id` included) is
    /// being moved ([`Nodes::begin_move`]): the path may name another object already.
    pub fn path_clear(&self, id: u64) -> Result<PathBuf, Unclear> {
        self.way(id, |_, n| n.moving == 0)
    }

    /// Pins the way of each of `ids` (every node from the root's child down to the node)
    /// for a request that acts on their paths: a request that would move or remove a
    /// pinned node waits until it is unpinned ([`Nodes::pins`]), so the paths name the
    /// same objects until [`Nodes::unpin`]. The pinned nodes are added to `pinned`; on an
    /// error nothing is pinned.
    pub fn pin(&mut self, ids: &[u64], pinned: &mut Vec<u64>) -> Result<Vec<PathBuf>, Unclear> {
        let start = pinned.len();
        let mut paths = Vec::with_capacity(ids.len());
        for &id in ids {
            let found = self.way(id, |nid, n| {
                pinned.push(nid);
                n.marks == 0
            });
            match found {
                Ok(p) => paths.push(p),
                Err(e) => {
                    pinned.truncate(start);
                    return Err(e);
                }
            }
        }
        for id in &pinned[start..] {
            if let Some(n) = self.by_id.get_mut(id) {
                n.pins += 1;
            }
        }
        Ok(paths)
    }

    /// Undoes [`Nodes::pin`]. True when a request may be waiting for it (a node is marked).
    pub fn unpin(&mut self, pinned: &[u64]) -> bool {
        for id in pinned {
            if let Some(n) = self.by_id.get_mut(id) {
                n.pins = n.pins.saturating_sub(1);
            }
        }
        self.marked > 0
    }

    /// How many requests under way have node `id` on their pinned way.
    pub fn pins(&self, id: u64) -> u32 {
        self.by_id.get(&id).map_or(0, |n| n.pins)
    }

    /// Marks node `id` as about to be moved or removed: no request pins a way through it
    /// until [`Nodes::unmark`]. False for a node the table does not know.
    pub fn mark(&mut self, id: u64) -> bool {
        let Some(n) = self.by_id.get_mut(&id) else {
            return false;
        };
        n.marks += 1;
        self.marked += 1;
        true
    }

    /// The move of marked node `id` starts (its paths may name another object from now
    /// on): [`Nodes::path_clear`] gives no path through it until [`Nodes::unmark`], and
    /// it is stamped with a new move count, so that readers that took a path through it
    /// look again.
    pub fn begin_move(&mut self, id: u64) {
        if let Some(n) = self.by_id.get_mut(&id) {
            n.moving += 1;
        }
        self.stamp(id);
    }

    /// Undoes [`Nodes::mark`], and [`Nodes::begin_move`] when `moved`.
    pub fn unmark(&mut self, id: u64, moved: bool) {
        if let Some(n) = self.by_id.get_mut(&id) {
            n.marks = n.marks.saturating_sub(1);
            if moved {
                n.moving = n.moving.saturating_sub(1);
            }
        }
        self.marked = self.marked.saturating_sub(1);
    }

    /// Walks from node `id` up to the root, asking `clear` of each node on the way (the
    /// root left out), and returns the path: [`Unclear::Moving`] when `clear` said no.
    fn way(&self, id: u64, mut clear: impl FnMut(u64, &Node) -> bool) -> Result<PathBuf, Unclear> {
        let mut names = Vec::new();
        let mut cur = id;
        let mut moving = false;
        while cur != ROOT {
            let node = self.by_id.get(&cur).ok_or(Unclear::Gone)?;
            moving |= !clear(cur, node);
            let (parent, name) = node.names.first().ok_or(Unclear::Gone)?;
            names.push(name.as_os_str());
            cur = *parent;
            if names.len() > 4096 {
                return Err(Unclear::Gone); // a cycle would be a bug; never loop forever
            }
        }
        if moving {
            return Err(Unclear::Moving);
        }
        // Joined as bytes: collecting into a PathBuf parses each pushed component again.
        let len = names.iter().map(|n| n.len() + 1).sum::<usize>();
        let mut path = Vec::with_capacity(len);
        for (i, n) in names.iter().rev().enumerate() {
            if i > 0 {
                path.push(b'/');
            }
            path.extend_from_slice(n.as_encoded_bytes());
        }
        Ok(PathBuf::from(std::ffi::OsString::from_vec(path)))
    }

    /// The node for `name` in `parent` found to be of type `kind`; made on first sight, or
    /// anew when the name now holds an object of another type. With `lookup`, counts one
    /// lookup the kernel will later forget (a lookup, create or link reply); a directory
    /// listing names nodes without counting, and keeps a node of another type where it
    /// is (a listing taken without the directory's lock may be older than the node; the
    /// next lookup of the name settles it).
    pub fn child(&mut self, parent: u64, name: &OsStr, kind: u32, lookup: bool) -> u64 {
        if let Some(id) = self.children.get(parent, name) {
            if let Some(node) = self.by_id.get_mut(&id) {
                if node.kind == kind || !lookup {
                    if lookup {
                        node.lookups += 1;
                    }
                    return id;
                }
            }
            // Another object now: the kernel must not see it under the old inode.
            self.detach(parent, name);
        }
        self.next += 1;
        let id = self.next;
        self.by_id.insert(
            id,
            Node {
                names: vec![(parent, name.to_os_string())],
                kind,
                lookups: u64::from(lookup),
                pins: 0,
                marks: 0,
                moving: 0,
                moved_at: 0,
            },
        );
        self.children.insert(parent, name.to_os_string(), id);
        id
    }

    /// Gives node `id` one more name, `name` in `parent` (a hard link made, or found to be
    /// one), counting a lookup; whatever node had that name loses it.
    pub fn add_name(&mut self, id: u64, parent: u64, name: &OsStr) -> bool {
        if self.children.get(parent, name) == Some(id) {
            if let Some(node) = self.by_id.get_mut(&id) {
                node.lookups += 1;
            }
            return true;
        }
        if !self.by_id.contains_key(&id) {
            return false;
        }
        self.detach(parent, name);
        if let Some(node) = self.by_id.get_mut(&id) {
            node.names.push((parent, name.to_os_string()));
            node.lookups += 1;
        }
        self.children.insert(parent, name.to_os_string(), id);
        true
    }

    /// The parent node, last name and node (if any) of `rel` below the mount root; None
    /// when a directory on the way has no node.
    pub fn walk(&self, rel: &Path) -> Option<(u64, OsString, Option<u64>)> {
        let mut names = rel.iter();
        let last = names.next_back()?;
        let mut parent = ROOT;
        for n in names {
            parent = self.named(parent, n)?;
        }
        Some((parent, last.to_os_string(), self.named(parent, last)))
    }

    /// The node named `name` in `parent`, if any.
    pub fn named(&self, parent: u64, name: &OsStr) -> Option<u64> {
        self.children.get(parent, name)
    }

    /// How many names node `id` has.
    pub fn name_count(&self, id: u64) -> usize {
        self.by_id.get(&id).map_or(0, |n| n.names.len())
    }

    /// Whether `id` still has a name.
    pub fn is_attached(&self, id: u64) -> bool {
        self.by_id.get(&id).is_some_and(|n| !n.names.is_empty())
    }

    /// `name` in `parent` is gone (unlinked, or about to be renamed over): its node loses
    /// the name but lives on while the kernel holds it. Returns the node.
    pub fn detach(&mut self, parent: u64, name: &OsStr) -> Option<u64> {
        let id = self.children.remove(parent, name)?;
        self.stamp(id);
        let drop_now = match self.by_id.get_mut(&id) {
            Some(node) => {
                node.names
                    .retain(|(p, n)| (*p, n.as_os_str()) != (parent, name));
                node.names.is_empty() && node.lookups == 0
            }
            None => false,
        };
        if drop_now {
            self.remove_if_unused(id);
        }
        Some(id)
    }

    /// Undoes [`Nodes::detach`] when the change failed, unless the name got another node
    /// meanwhile.
    pub fn reattach(&mut self, parent: u64, name: &OsStr, id: u64) {
        if self.children.get(parent, name).is_some() {
            return;
        }
        if let Some(node) = self.by_id.get_mut(&id) {
            node.names.push((parent, name.to_os_string()));
            self.children.insert(parent, name.to_os_string(), id);
        }
    }

    /// The node at `from` now lives at `to` (its children follow); whatever was at `to` was
    /// detached before.
    pub fn rename(&mut self, from: (u64, &OsStr), to: (u64, &OsStr)) {
        let old = self.children.get(from.0, from.1);
        if old.is_some() && old == self.children.get(to.0, to.1) {
            // Two names of one file: rename does nothing.
            return;
        }
        self.detach(to.0, to.1);
        let Some(id) = self.children.remove(from.0, from.1) else {
            return;
        };
        self.stamp(id);
        if let Some(node) = self.by_id.get_mut(&id) {
            for n in node.names.iter_mut() {
                if (n.0, n.1.as_os_str()) == from {
                    *n = (to.0, to.1.to_os_string());
                }
            }
        }
        self.children.insert(to.0, to.1.to_os_string(), id);
    }

    /// The kernel forgot `n` lookups of `id`. A node nobody refers to any more leaves the
    /// table, with the uncounted nodes a listing made below it. A node that still has a
    /// name in a directory the table knows stays, uncounted, as a listed one: the kernel
    /// may keep that directory's listing (see [`crate::fuse`]), whose entries carry the
    /// node ids, and the next lookup of the name must give the same id. It leaves with
    /// its directory.
    pub fn forget(&mut self, id: u64, n: u64) {
        if id == ROOT {
            return;
        }
        let Some(node) = self.by_id.get_mut(&id) else {
            return;
        };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups > 0 {
            return;
        }
        let parent = node.names.first().map(|(parent, _)| *parent);
        let listed = parent
            .is_some_and(|p| p == ROOT || self.by_id.get(&p).is_some_and(|d| !d.names.is_empty()));
        if !listed {
            self.remove_if_unused(id);
        }
    }

    /// Removes `id` if neither the kernel nor a child still refers to it.
    fn remove_if_unused(&mut self, id: u64) {
        for kid in self.children.of(id) {
            if self.by_id.get(&kid).is_some_and(|k| k.lookups == 0) {
                self.remove_if_unused(kid);
            }
        }
        if !self.children.has_any(id) && self.by_id.get(&id).is_some_and(|n| n.lookups == 0) {
            self.remove(id);
        }
    }

    fn remove(&mut self, id: u64) {
        // A way through it breaks: readers that took one look again.
        self.moves += 1;
        if let Some(node) = self.by_id.remove(&id) {
            for (parent, name) in node.names {
                self.children.remove(parent, &name);
            }
        }
    }

    /// How many nodes the table holds (for tests and status).
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const F: u32 = libc::S_IFREG;
    const D: u32 = libc::S_IFDIR;

    #[test]
    fn a_new_file_at_an_unlinked_name_gets_a_new_node() {
        let mut n = Nodes::new();
        let x = n.child(ROOT, OsStr::new(".x"), F, true);
        assert_eq!(n.path(x).as_deref(), Some(Path::new(".x")));
        n.detach(ROOT, OsStr::new(".x"));
        assert_eq!(n.path(x), None, "the old node has no name");
        let y = n.child(ROOT, OsStr::new(".x"), F, true);
        assert_ne!(x, y, "ids are never reused");
        n.forget(x, 1);
        assert_eq!(n.path(y).as_deref(), Some(Path::new(".x")));
    }

    #[test]
    fn rename_moves_the_node_and_its_children_and_detaches_the_target() {
        let mut n = Nodes::new();
        let d = n.child(ROOT, OsStr::new(".d"), D, true);
        let f = n.child(d, OsStr::new("f"), F, true);
        let t = n.child(ROOT, OsStr::new(".t"), D, true);
        n.rename((ROOT, OsStr::new(".d")), (ROOT, OsStr::new(".t")));
        assert_eq!(n.path(f).as_deref(), Some(Path::new(".t/f")));
        assert_eq!(n.path(d).as_deref(), Some(Path::new(".t")));
        assert_eq!(n.path(t), None);
        assert_eq!(n.child(ROOT, OsStr::new(".t"), D, false), d);
    }

    #[test]
    fn a_name_that_changes_type_gets_a_new_node() {
        let mut n = Nodes::new();
        let a = n.child(ROOT, OsStr::new("a"), F, true);
        // A listing (which may be older than the node) leaves it where it is.
        assert_eq!(n.child(ROOT, OsStr::new("a"), D, false), a);
        assert_eq!(n.path(a).as_deref(), Some(Path::new("a")));
        let b = n.child(ROOT, OsStr::new("a"), D, true);
        assert_ne!(a, b);
        assert_eq!(n.path(a), None);
    }

    #[test]
    fn a_look_taken_before_a_name_was_made_again_names_nothing() {
        let mut n = Nodes::new();
        let d = n.child(ROOT, OsStr::new("d"), D, true);
        let old = n.child(d, OsStr::new("x"), F, true);
        let seen = n.moves();
        // rm x; mkdir x: the look taken before must not name the new directory's node
        // as the file it found.
        n.detach(d, OsStr::new("x"));
        let new = n.child(d, OsStr::new("x"), D, true);
        n.touch(new);
        assert_eq!(n.child_seen(d, OsStr::new("x"), F, true, Some(seen)), None);
        assert_eq!(n.path(new).as_deref(), Some(Path::new("d/x")));
        assert!(n.moved_since(old, seen));
        assert!(!n.moved_since(d, seen));
    }

    #[test]
    fn a_hard_linked_file_is_one_node_until_its_last_name_goes() {
        let mut n = Nodes::new();
        let a = n.child(ROOT, OsStr::new("a"), F, true);
        assert!(n.add_name(a, ROOT, OsStr::new("b")));
        assert_eq!(n.child(ROOT, OsStr::new("b"), F, true), a);
        n.detach(ROOT, OsStr::new("a"));
        assert_eq!(n.path(a).as_deref(), Some(Path::new("b")));
        n.rename((ROOT, OsStr::new("b")), (ROOT, OsStr::new("c")));
        assert_eq!(n.path(a).as_deref(), Some(Path::new("c")));
        n.detach(ROOT, OsStr::new("c"));
        assert!(!n.is_attached(a));
    }

    #[test]
    fn a_pinned_way_counts_on_each_node_of_it_and_a_mark_stops_new_pins_through_it() {
        let mut n = Nodes::new();
        let d = n.child(ROOT, OsStr::new("d"), D, true);
        let e = n.child(d, OsStr::new("e"), D, true);
        let f = n.child(e, OsStr::new("f"), F, true);
        let g = n.child(ROOT, OsStr::new("g"), F, true);
        let mut pinned = Vec::new();
        let paths = n.pin(&[f, g], &mut pinned).expect("pinned");
        assert_eq!(paths, [Path::new("d/e/f"), Path::new("g")]);
        assert_eq!((n.pins(d), n.pins(e), n.pins(f), n.pins(g)), (1, 1, 1, 1));
        // Marking e (a directory about to move): nothing is pinned through it until it is
        // unmarked; ways beside it are not held up, nor readers until its move starts.
        let before = n.moves();
        assert!(!n.moved_since(f, before));
        assert!(n.mark(e));
        let mut more = Vec::new();
        assert_eq!(n.pin(&[g, f], &mut more), Err(Unclear::Moving));
        assert!(more.is_empty(), "nothing pinned after a refusal");
        assert_eq!(n.pins(g), 1);
        assert_eq!(n.path_clear(f).as_deref(), Ok(Path::new("d/e/f")));
        assert_eq!(n.moves(), before);
        // Its move starts: readers wait too, and those below it that looked before look
        // again; those beside it need not.
        n.begin_move(e);
        assert!(n.moved_since(f, before));
        assert!(n.moved_since(e, before));
        assert!(!n.moved_since(d, before));
        assert!(!n.moved_since(g, before));
        assert_eq!(n.path_clear(f), Err(Unclear::Moving));
        assert_eq!(n.path_clear(d).as_deref(), Ok(Path::new("d")));
        assert_eq!(n.path(f).as_deref(), Some(Path::new("d/e/f")));
        assert!(n.unpin(&pinned), "a request may wait for these pins");
        assert_eq!((n.pins(d), n.pins(e), n.pins(f)), (0, 0, 0));
        n.unmark(e, true);
        assert!(n.path_clear(f).is_ok());
        assert!(n.pin(&[f], &mut more).is_ok());
        assert!(!n.unpin(&more), "nothing marked: nobody waits");
        n.detach(ROOT, OsStr::new("g"));
        assert_eq!(n.pin(&[g], &mut more), Err(Unclear::Gone));
    }

    #[test]
    fn forgotten_nodes_leave_the_table_with_their_listed_children() {
        let mut n = Nodes::new();
        let d = n.child(ROOT, OsStr::new("d"), D, true);
        for i in 0..10 {
            n.child(d, OsStr::new(&format!("{i}")), F, false);
        }
        assert_eq!(n.len(), 12);
        n.forget(d, 1);
        assert_eq!(n.len(), 12, "d is still listed in the root");
        n.detach(ROOT, OsStr::new("d"));
        n.forget(d, 0);
        assert_eq!(n.len(), 1, "only the root is left");
    }

    #[test]
    fn a_forgotten_name_in_a_known_directory_keeps_its_id() {
        let mut n = Nodes::new();
        let d = n.child(ROOT, OsStr::new("d"), D, true);
        let f = n.child(d, OsStr::new("f"), F, true);
        n.forget(f, 1);
        assert_eq!(n.child(d, OsStr::new("f"), F, true), f);
    }
}
