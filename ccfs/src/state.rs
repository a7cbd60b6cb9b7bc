//! What the cache holds that the share does not have yet, as a pure state machine.
//!
//! Every change is a [`Record`]; the state is the fold of the records in order. The
//! journal ([`crate::journal`]) stores the records, so the running daemon's state and the
//! state rebuilt after a crash are the same by construction.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::extents::Extents;

/// The identity of a file on the share when it was copied up (device and inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Origin {
    pub dev: u64,
    pub ino: u64,
}

/// What the share had at a path when the cache took it over: compared at sync to see
/// whether another workstation changed the share's copy meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShareId {
    pub ino: u64,
    pub size: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

/// What a whole-second base stands for (see [`Record::Racy`]): the content the share's
/// file had (its bytes sealed with its attributes), or unknown (then the base is taken
/// for changed whenever it is racy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Content {
    Unknown,
    Sha256([u8; 32]),
    /// A mark of the bytes alone, as a journal of an earlier version holds it: it is
    /// checked by the bytes alone.
    Bytes([u8; 32]),
}

/// What a sync handed to rsync for one path: the cache copy's size and mtime at that moment,
/// and when (this machine's clock). After a sync that failed or was cut short, a share file
/// with that size and mtime is our own transfer, and so is one with an mtime from `since`
/// on (a version written here while rsync was reading; see `overlay::session`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sent {
    pub size: u64,
    pub mtime: (i64, i64),
    /// When the sync handed it over; None in journals of older versions.
    pub since: Option<(i64, i64)>,
}

/// One change to the overlay's record. Paths are relative to the mount root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// `path` now exists in the cache with content the share lacks. Clears a whiteout.
    Dirty(PathBuf),
    /// `path` in the cache was copied up from this share object.
    Origin(PathBuf, Origin),
    /// The cache took `path` over: what the share held there then (None: nothing). It stands
    /// until one of our own syncs settles the path (renames and deletes leave it alone).
    Base(PathBuf, Option<ShareId>),
    /// `path` (and all below it) was removed from the cache; with `whiteout` the share's
    /// copy must be deleted at sync and is hidden until then.
    Delete { path: PathBuf, whiteout: bool },
    /// Everything the cache holds at or below `from` now lives at or below `to` (the bases
    /// stay: they describe share paths, not objects).
    Rename { from: PathBuf, to: PathBuf },
    /// The share has `path` as the cache has it (its hand-over, if marked, is settled).
    Clean(PathBuf),
    /// The share no longer has `path`: its whiteout is done.
    Deleted(PathBuf),
    /// A sync is about to send `path` as it is now (None: unknown). Until
    /// [`Record::SyncEnd`], a share file that matches is our own transfer.
    Sending(PathBuf, Option<Sent>),
    /// The sync that recorded `Sending` is over and its outcome settled in the bases.
    SyncEnd,
    /// The cache let go of its clean copy of `path` and all below it (the share's changed
    /// since): what the session took over there is forgotten, and the next change there
    /// takes the share's object over afresh.
    Forget(PathBuf),
    /// The base of `path` was taken on a share that keeps whole seconds while its second
    /// may still have been running there: another write in that second leaves the same
    /// look, so the base stands only while the share's file has this content. Follows
    /// the `Base` it qualifies; the next `Base` of the path (or a `Forget`) ends it.
    Racy(PathBuf, Content),
    /// The cache file of `path` is held by block (`overlay/blocks.rs`): below `limit`
    /// bytes, a block it lacks is its base's (the share's version `Base` records); from
    /// `limit` on the cache file alone is the file. Recorded at the take-over, and again
    /// when a truncation lowers the limit (before the cache file is cut).
    Partial(PathBuf, u64),
    /// The cache file of `path`, held by block, has `blocks` on disk: `changed`, written
    /// here (the sync sends them); else copied from its base.
    Blocks {
        path: PathBuf,
        changed: bool,
        blocks: Extents,
    },
    /// The cache file of `path` is whole: no longer held by block.
    Whole(PathBuf),
}

/// A file held by block: where its bytes are (see [`Record::Partial`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Partial {
    /// Below it, a block the cache lacks is the base's.
    pub limit: u64,
    /// The blocks the cache file has.
    pub here: Extents,
    /// Of those, the ones written here since the share last had the file as the cache
    /// has it (what a sync sends).
    pub changed: Extents,
}

impl Partial {
    /// Whether the cache file has every block below the limit (the base is no longer
    /// needed to read it).
    pub fn is_complete(&self) -> bool {
        self.lacking() == 0
    }

    /// How many blocks below the limit the cache file lacks.
    pub fn lacking(&self) -> u64 {
        let blocks = self.limit.div_ceil(crate::extents::BLOCK);
        self.here.gaps(0, blocks).iter().map(|(s, e)| e - s).sum()
    }
}

/// The record of unsynced work.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverlayState {
    dirty: BTreeSet<PathBuf>,
    whiteouts: BTreeSet<PathBuf>,
    origins: BTreeMap<PathBuf, Origin>,
    bases: BTreeMap<PathBuf, Option<ShareId>>,
    sending: BTreeMap<PathBuf, Option<Sent>>,
    racy: BTreeMap<PathBuf, Content>,
    partial: BTreeMap<PathBuf, Partial>,
}

/// Keys of `set` equal to `root` or below it.
fn subtree<'a, V>(map: &'a BTreeMap<PathBuf, V>, root: &'a Path) -> Vec<PathBuf> {
    map.range(root.to_path_buf()..)
        .take_while(|(k, _)| k.starts_with(root))
        .map(|(k, _)| k.clone())
        .collect()
}

fn subtree_set(set: &BTreeSet<PathBuf>, root: &Path) -> Vec<PathBuf> {
    set.range(root.to_path_buf()..)
        .take_while(|k| k.starts_with(root))
        .cloned()
        .collect()
}

/// `path` with its prefix `from` replaced by `to`.
pub fn reroot(path: &Path, from: &Path, to: &Path) -> PathBuf {
    match path.strip_prefix(from) {
        Ok(rest) if rest.as_os_str().is_empty() => to.to_path_buf(),
        Ok(rest) => to.join(rest),
        Err(_) => path.to_path_buf(),
    }
}

impl OverlayState {
    pub fn apply(&mut self, record: &Record) {
        match record {
            Record::Dirty(p) => {
                self.whiteouts.remove(p);
                self.dirty.insert(p.clone());
            }
            Record::Origin(p, o) => {
                self.origins.insert(p.clone(), *o);
            }
            Record::Base(p, b) => {
                self.bases.insert(p.clone(), *b);
                self.racy.remove(p);
            }
            Record::Racy(p, c) => {
                // Only of a file's base (a record out of order qualifies nothing).
                if self.base(p).is_some() {
                    self.racy.insert(p.clone(), *c);
                }
            }
            Record::Delete { path, whiteout } => {
                for k in subtree_set(&self.dirty, path) {
                    self.dirty.remove(&k);
                }
                for k in subtree(&self.origins, path) {
                    self.origins.remove(&k);
                }
                for k in subtree(&self.partial, path) {
                    self.partial.remove(&k);
                }
                if *whiteout {
                    self.whiteouts.insert(path.clone());
                }
            }
            Record::Rename { from, to } => {
                // Whatever the cache held at the target is replaced.
                for k in subtree_set(&self.dirty, to) {
                    self.dirty.remove(&k);
                }
                for k in subtree(&self.origins, to) {
                    self.origins.remove(&k);
                }
                for k in subtree(&self.partial, to) {
                    self.partial.remove(&k);
                }
                for k in subtree(&self.partial, from) {
                    if let Some(v) = self.partial.remove(&k) {
                        self.partial.insert(reroot(&k, from, to), v);
                    }
                }
                for k in subtree_set(&self.dirty, from) {
                    self.dirty.remove(&k);
                    let moved = reroot(&k, from, to);
                    // Like Dirty: a path that exists in the cache is no whiteout.
                    self.whiteouts.remove(&moved);
                    self.dirty.insert(moved);
                }
                for k in subtree(&self.origins, from) {
                    if let Some(o) = self.origins.remove(&k) {
                        self.origins.insert(reroot(&k, from, to), o);
                    }
                }
                self.whiteouts.remove(to);
            }
            Record::Clean(p) => {
                self.dirty.remove(p);
                if let Some(part) = self.partial.get_mut(p) {
                    part.changed = Extents::new();
                }
                // Settled: a mark of its hand-over (the stamp of a file found unchanged
                // on the share) has nothing left to settle.
                self.sending.remove(p);
            }
            Record::Deleted(p) => {
                self.whiteouts.remove(p);
            }
            Record::Sending(p, sent) => {
                self.sending.insert(p.clone(), *sent);
            }
            Record::SyncEnd => self.sending.clear(),
            Record::Forget(p) => {
                for k in subtree(&self.bases, p) {
                    self.bases.remove(&k);
                }
                for k in subtree(&self.racy, p) {
                    self.racy.remove(&k);
                }
                for k in subtree(&self.origins, p) {
                    self.origins.remove(&k);
                }
                for k in subtree(&self.partial, p) {
                    self.partial.remove(&k);
                }
            }
            Record::Partial(p, limit) => {
                self.partial.entry(p.clone()).or_default().limit = *limit;
            }
            Record::Blocks {
                path,
                changed,
                blocks,
            } => {
                // Only of a file held by block (a record out of order adds nothing).
                if let Some(part) = self.partial.get_mut(path) {
                    part.here.insert_all(blocks);
                    if *changed {
                        part.changed.insert_all(blocks);
                    }
                }
            }
            Record::Whole(p) => {
                self.partial.remove(p);
            }
        }
    }

    pub fn replay<'a>(records: impl IntoIterator<Item = &'a Record>) -> Self {
        let mut s = Self::default();
        for r in records {
            s.apply(r);
        }
        s
    }

    /// Records that rebuild this state from nothing (for journal compaction).
    pub fn snapshot(&self) -> Vec<Record> {
        // Deletions first: a later Delete would wipe what Dirty/Origin records put below it.
        let mut out = Vec::new();
        for p in &self.whiteouts {
            out.push(Record::Delete {
                path: p.clone(),
                whiteout: true,
            });
        }
        for (p, o) in &self.origins {
            out.push(Record::Origin(p.clone(), *o));
        }
        for (p, b) in &self.bases {
            out.push(Record::Base(p.clone(), *b));
            if let Some(c) = self.racy.get(p) {
                out.push(Record::Racy(p.clone(), *c));
            }
        }
        for p in &self.dirty {
            out.push(Record::Dirty(p.clone()));
        }
        for (p, sent) in &self.sending {
            out.push(Record::Sending(p.clone(), *sent));
        }
        for (p, part) in &self.partial {
            out.push(Record::Partial(p.clone(), part.limit));
            out.push(Record::Blocks {
                path: p.clone(),
                changed: false,
                blocks: part.here.clone(),
            });
            out.push(Record::Blocks {
                path: p.clone(),
                changed: true,
                blocks: part.changed.clone(),
            });
        }
        out
    }

    /// Where the bytes of `p` are when its cache file is held by block.
    pub fn partial(&self, p: &Path) -> Option<&Partial> {
        self.partial.get(p)
    }

    /// Every file held by block.
    pub fn partials(&self) -> impl Iterator<Item = (&PathBuf, &Partial)> {
        self.partial.iter()
    }

    /// Files held by block at or below `root`.
    pub fn partial_below(&self, root: &Path) -> Vec<PathBuf> {
        subtree(&self.partial, root)
    }

    pub fn is_dirty(&self, p: &Path) -> bool {
        self.dirty.contains(p)
    }

    /// Dirty paths at or below `root`.
    pub fn dirty_below(&self, root: &Path) -> Vec<PathBuf> {
        subtree_set(&self.dirty, root)
    }

    pub fn dirty(&self) -> impl Iterator<Item = &PathBuf> {
        self.dirty.iter()
    }

    pub fn whiteouts(&self) -> impl Iterator<Item = &PathBuf> {
        self.whiteouts.iter()
    }

    pub fn origin(&self, p: &Path) -> Option<Origin> {
        self.origins.get(p).copied()
    }

    /// What an unfinished sync was sending, by path.
    pub fn sending(&self) -> impl Iterator<Item = (&PathBuf, &Option<Sent>)> {
        self.sending.iter()
    }

    /// What the share held at `p` when the cache took it over, or after our last sync of it
    /// (None: nothing, or never taken over: then anything there now is someone else's).
    pub fn base(&self, p: &Path) -> Option<ShareId> {
        self.bases.get(p).copied().flatten()
    }

    /// What the base of `p` stands for when it is racy (see [`Record::Racy`]).
    pub fn racy(&self, p: &Path) -> Option<Content> {
        self.racy.get(p).copied()
    }

    /// True when anything at or below `root` is dirty, deleted or being sent.
    pub fn has_work_below(&self, root: &Path) -> bool {
        self.dirty
            .range(root.to_path_buf()..)
            .next()
            .is_some_and(|k| k.starts_with(root))
            || self
                .whiteouts
                .range(root.to_path_buf()..)
                .next()
                .is_some_and(|k| k.starts_with(root))
            || !subtree(&self.sending, root).is_empty()
    }

    /// Every path whose base is recorded, with the base (None: nothing was there).
    pub fn bases(&self) -> impl Iterator<Item = (&PathBuf, Option<ShareId>)> {
        self.bases.iter().map(|(p, b)| (p, *b))
    }

    /// The base recorded for `p` as it is (Some(None): the share had nothing there), or
    /// None when `p` was not taken over.
    pub fn base_entry(&self, p: &Path) -> Option<Option<ShareId>> {
        self.bases.get(p).copied()
    }

    /// True when the cache took `p` over in this session (its base is recorded).
    pub fn taken_over(&self, p: &Path) -> bool {
        self.bases.contains_key(p)
    }

    /// True when `p` or one of its ancestors is deleted: the share's copy is hidden.
    pub fn hidden(&self, p: &Path) -> bool {
        if self.whiteouts.is_empty() {
            return false;
        }
        p.ancestors()
            .filter(|a| !a.as_os_str().is_empty())
            .any(|a| self.whiteouts.contains(a))
    }

    pub fn is_whiteout(&self, p: &Path) -> bool {
        self.whiteouts.contains(p)
    }

    /// True when nothing is left to sync.
    pub fn is_clean(&self) -> bool {
        self.dirty.is_empty() && self.whiteouts.is_empty()
    }

    pub fn dirty_count(&self) -> usize {
        self.dirty.len()
    }

    pub fn whiteout_count(&self) -> usize {
        self.whiteouts.len()
    }

    /// Starts afresh once everything is on the share and the cache is emptied: nothing
    /// of this session's take-overs is kept.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn a_file_held_by_block_keeps_its_blocks_with_its_cache_file() {
        let p = |s: &str| PathBuf::from(s);
        let blocks = |path: &str, changed, r: &[(u64, u64)]| Record::Blocks {
            path: p(path),
            changed,
            blocks: Extents::of(r),
        };
        let mut s = OverlayState::replay(&[
            // Blocks of a file not held by block qualify nothing.
            blocks(".db", true, &[(0, 1)]),
            Record::Partial(p(".db"), 40960),
            blocks(".db", false, &[(0, 2)]),
            blocks(".db", true, &[(5, 6)]),
        ]);
        let part = s.partial(Path::new(".db")).expect("held by block");
        assert_eq!(part.limit, 40960);
        assert_eq!(part.here, Extents::of(&[(0, 2), (5, 6)]));
        assert_eq!(part.changed, Extents::of(&[(5, 6)]));
        // Sent: nothing is changed any more, the blocks stay.
        s.apply(&Record::Clean(p(".db")));
        let part = s.partial(Path::new(".db")).expect("held by block");
        assert!(part.changed.is_empty());
        assert_eq!(part.here.count(), 3);
        // A rename takes them along and replaces what the target had.
        s.apply(&Record::Partial(p(".d/old"), 1));
        s.apply(&Record::Rename {
            from: p(".db"),
            to: p(".d/old"),
        });
        assert!(s.partial(Path::new(".db")).is_none());
        assert_eq!(s.partial(Path::new(".d/old")).map(|x| x.limit), Some(40960));
        assert_eq!(s.partial_below(Path::new(".d")), [p(".d/old")]);
        // Whole, deleted, forgotten: no longer held by block.
        s.apply(&Record::Whole(p(".d/old")));
        assert!(s.partials().next().is_none());
        for end in [
            Record::Delete {
                path: p(".d"),
                whiteout: false,
            },
            Record::Forget(p(".d")),
        ] {
            let mut t = OverlayState::replay(&[Record::Partial(p(".d/x"), 5)]);
            t.apply(&end);
            assert!(t.partial(Path::new(".d/x")).is_none(), "{end:?}");
        }
    }

    #[test]
    fn dirty_then_clean() {
        let mut s = OverlayState::default();
        s.apply(&Record::Dirty(p(".a")));
        assert!(s.is_dirty(Path::new(".a")));
        s.apply(&Record::Clean(p(".a")));
        assert!(s.is_clean());
    }

    #[test]
    fn delete_with_whiteout_hides_subtree_and_dirty_clears_it() {
        let mut s = OverlayState::default();
        s.apply(&Record::Dirty(p(".d/x")));
        s.apply(&Record::Delete {
            path: p(".d"),
            whiteout: true,
        });
        assert!(!s.is_dirty(Path::new(".d/x")));
        assert!(s.hidden(Path::new(".d/y")));
        assert!(s.hidden(Path::new(".d")));
        assert!(!s.hidden(Path::new(".dd")));
        s.apply(&Record::Dirty(p(".d")));
        assert!(!s.hidden(Path::new(".d")));
    }

    #[test]
    fn rename_moves_subtree_and_replaces_target() {
        let mut s = OverlayState::default();
        s.apply(&Record::Dirty(p(".a/x")));
        s.apply(&Record::Origin(p(".a/x"), Origin { dev: 1, ino: 7 }));
        s.apply(&Record::Dirty(p(".b/old")));
        s.apply(&Record::Dirty(p(".ab")));
        s.apply(&Record::Rename {
            from: p(".a"),
            to: p(".b"),
        });
        assert!(s.is_dirty(Path::new(".b/x")));
        assert!(!s.is_dirty(Path::new(".b/old")));
        assert!(!s.is_dirty(Path::new(".a/x")));
        assert!(
            s.is_dirty(Path::new(".ab")),
            "a sibling sharing a name prefix is untouched"
        );
        assert_eq!(s.origin(Path::new(".b/x")), Some(Origin { dev: 1, ino: 7 }));
    }

    /// Regression (found by the journal proptest): a dirty entry moved by a rename onto a
    /// whited-out path must clear that whiteout, or compaction changes the state.
    #[test]
    fn rename_onto_a_whited_out_path_clears_the_whiteout() {
        let records = [
            Record::Delete {
                path: p(".b/d e/.a"),
                whiteout: true,
            },
            Record::Dirty(p("c/.a")),
            Record::Rename {
                from: p("c"),
                to: p(".b/d e"),
            },
        ];
        let s = OverlayState::replay(&records);
        assert!(s.is_dirty(Path::new(".b/d e/.a")));
        assert!(!s.is_whiteout(Path::new(".b/d e/.a")));
        assert_eq!(OverlayState::replay(&s.snapshot()), s);
    }

    /// The base of a share path is what the share held when the cache first took the path
    /// over; a save by temp + rename onto it, or a delete, must not replace it.
    #[test]
    fn bases_stay_with_their_share_path_across_renames_and_deletes() {
        let id = |ino| ShareId {
            ino,
            size: 1,
            mtime: (1, 0),
            ctime: (1, 0),
        };
        let records = [
            Record::Base(p(".a"), Some(id(1))),
            Record::Dirty(p(".a")),
            Record::Base(p(".a.tmp"), None),
            Record::Dirty(p(".a.tmp")),
            Record::Rename {
                from: p(".a.tmp"),
                to: p(".a"),
            },
            Record::Base(p(".b"), Some(id(2))),
            Record::Delete {
                path: p(".b"),
                whiteout: true,
            },
        ];
        let s = OverlayState::replay(&records);
        assert_eq!(s.base(Path::new(".a")), Some(id(1)));
        assert!(s.is_dirty(Path::new(".a")));
        assert_eq!(s.base(Path::new(".b")), Some(id(2)));
        assert!(s.taken_over(Path::new(".a.tmp")));
        assert_eq!(OverlayState::replay(&s.snapshot()), s);
    }

    #[test]
    fn snapshot_replays_to_the_same_state() {
        let mut s = OverlayState::default();
        s.apply(&Record::Dirty(p(".a")));
        s.apply(&Record::Origin(p(".a"), Origin { dev: 2, ino: 3 }));
        s.apply(&Record::Delete {
            path: p(".gone"),
            whiteout: true,
        });
        let again = OverlayState::replay(&s.snapshot());
        assert_eq!(again, s);
    }
}
