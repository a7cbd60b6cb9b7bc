//! The reference: the share and each workstation's cache as doc/SEMANTICS.md describes
//! them ("Sessions: the states of a path", "Conflicts"), as plain maps, without ccfs's code.
//!
//! The share holds objects with an identity (a new one for every file version it receives;
//! a directory is known by its inode number, which the harness reads, since ext4 reuses
//! them). A workstation's cache holds its copies (`upper`), the paths it must send
//! (`dirty`), the share paths it must delete (`whiteouts`), and per path the share's
//! identity when this session first took the path over (`bases`). A sync compares the
//! share with the bases: where the share changed since, both versions are kept.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ccfs::extents::{Extents, BLOCK};
use ccfs::overlay::ConflictKind;

/// Every path of the model lives below this directory (on the share from the start).
pub const ROOT: &str = ".c";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Obj {
    /// Content, permission bits, a stamp standing for the mtime (each write gives a new
    /// one; a copy (copy-up, rsync) keeps it, and so do chmod and setxattr), and the value
    /// of one extended attribute (`user.x`), if set.
    File {
        data: Vec<u8>,
        mode: u32,
        stamp: u64,
        xattr: Option<u8>,
    },
    Dir,
    /// A symbolic link to `t<n>` (nothing there: the target is never followed).
    Link(u8),
}

impl Obj {
    pub fn is_dir(&self) -> bool {
        matches!(self, Obj::Dir)
    }

    /// Size and mtime: what a sync hands over and later recognises as its own transfer.
    fn tag(&self) -> Option<(usize, u64)> {
        match self {
            Obj::File { data, stamp, .. } => Some((data.len(), *stamp)),
            Obj::Dir | Obj::Link(_) => None,
        }
    }

    fn same_type(&self, other: &Obj) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }

    fn is_file(&self) -> bool {
        matches!(self, Obj::File { .. })
    }
}

fn below_or_at(k: &Path, d: &Path) -> bool {
    k == d || below(k, d)
}

/// The identity of a share object, as a base records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ver {
    /// One per file version the share received.
    File(u64),
    /// A directory by inode number (0 until the harness has read it).
    Dir(u64),
}

#[derive(Debug, Clone)]
pub struct ShareEntry {
    pub obj: Obj,
    pub ver: Ver,
}

/// One workstation: its session's cache and journal.
#[derive(Debug, Clone, Default)]
pub struct Ws {
    /// A session runs (the overlay exists); after a logout or a crash, the next operation
    /// on this workstation logs in again (and recovers what the journal holds).
    pub mounted: bool,
    pub upper: BTreeMap<PathBuf, Obj>,
    pub dirty: BTreeSet<PathBuf>,
    pub whiteouts: BTreeSet<PathBuf>,
    /// What the share held at a path when the session took it over (None: nothing).
    pub bases: BTreeMap<PathBuf, Option<Ver>>,
    /// What a sync cut short by a crash was sending (size and mtime), until the next sync
    /// settles it.
    pub sending: BTreeMap<PathBuf, Option<(usize, u64)>>,
    /// The share does not answer this workstation (its gate is closed): only what the
    /// cache holds can be used.
    pub share_down: bool,
    /// Names whose last look at the share found nothing there, kept for a change of the
    /// name (mkdir, a removal, a rename) until a sync of this workstation starts, as
    /// ccfs keeps them (the harness keeps them for the whole case). Such a change takes
    /// the name for free even when the share no longer answers, or has something there
    /// by now (the sync then meets it as a change after the look).
    pub kept_absent: BTreeSet<PathBuf>,
    /// Files a program holds a shared writable mapping of, its descriptor closed (under
    /// kernel passthrough the mapping writes the cache's file without ccfs). A sync sends
    /// such a file as it is and leaves it unsynced work; it outlives logouts and crashes.
    pub held: BTreeSet<PathBuf>,
    /// Of `held`, the files held by block: the kernel does not pass their I/O through,
    /// so a mapping of one writes through the daemon (a handle open for writing, as any
    /// program's), and ends with the session (a logout or a crash).
    pub held_through_ccfs: BTreeSet<PathBuf>,
    /// Files held by block (see `ccfs/src/overlay/blocks.rs`), learned from ccfs as
    /// inode numbers are: which take-overs hold a file by block, whether its cache file
    /// has every block, and whether the daemon holds its base's file open.
    pub partial: BTreeMap<PathBuf, Part>,
}

thread_local! {
    /// What the cases this thread played did with files held by block (see [`coverage`]).
    static COVERAGE: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// What the cases played on this thread (a test's) did with files held by block:
/// learnings of a file whose cache file lacks blocks, and writes that read a block the
/// cache lacked from the base.
pub fn coverage() -> (usize, usize) {
    COVERAGE.with(|c| c.get())
}

fn count(held: usize, writes: usize) {
    COVERAGE.with(|c| {
        let (h, w) = c.get();
        c.set((h + held, w + writes));
    });
}

/// A file held by block, as the model knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Part {
    /// The cache file has every block: the base is no longer read.
    pub complete: bool,
    /// Below it, a block the cache file lacks is the base's.
    pub limit: u64,
    /// The blocks the cache file has.
    pub here: Extents,
    /// The daemon holds the base's file open: it stays readable when another file is
    /// renamed over its name on the share, not when it is written in place there.
    pub held: bool,
    /// The base's file the daemon holds was written in place on the share since.
    pub edited: bool,
}

impl Ws {
    /// A logout or recovery that left nothing unsynced: the cache keeps its clean copies
    /// (files with a base, as a sync left them on the share) and the directories above
    /// them, and forgets every other base.
    fn keep_clean_copies_only(&mut self) {
        let copies: Vec<PathBuf> = self
            .upper
            .iter()
            .filter(|(p, o)| {
                o.is_file()
                    && !self.dirty.contains(*p)
                    && self.bases.get(*p).copied().flatten().is_some()
            })
            .map(|(p, _)| p.clone())
            .collect();
        self.upper.retain(|p, o| {
            copies.contains(p) || (o.is_dir() && copies.iter().any(|c| below(c, p)))
        });
        self.bases.retain(|p, _| copies.contains(p));
        self.partial.retain(|p, _| copies.contains(p));
    }

    /// The session ends (a logout or a crash): the mappings of files held by block end
    /// with it, and the daemon holds no base open any more.
    fn session_ends(&mut self) {
        let through: Vec<PathBuf> = std::mem::take(&mut self.held_through_ccfs)
            .into_iter()
            .collect();
        for p in through {
            self.held.remove(&p);
        }
        for part in self.partial.values_mut() {
            part.held = false;
            part.edited = false;
        }
    }

    fn has_work(&self) -> bool {
        !self.dirty.is_empty() || !self.whiteouts.is_empty() || !self.sending.is_empty()
    }
}

/// How a sync's rsync ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    /// Exit 0: every listed file sent.
    All,
    /// The first k listed files sent, then exit 23.
    FailAfter(usize),
    /// The first k listed files sent, then the daemon dies: nothing settles.
    CrashAfter(usize),
}

/// What a sync must report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// (path, kind), sorted.
    pub conflicts: Vec<(PathBuf, String)>,
    pub not_sent: Vec<PathBuf>,
    pub ok: bool,
    pub remaining_dirty: usize,
    pub remaining_deletions: usize,
    pub cache_dropped: bool,
}

pub fn kind_name(k: ConflictKind) -> String {
    format!("{k:?}")
}

/// `p` is `root` or below it.
fn below(p: &Path, root: &Path) -> bool {
    p.starts_with(root)
}

/// `p` with its prefix `from` replaced by `to`.
pub fn reroot(p: &Path, from: &Path, to: &Path) -> PathBuf {
    match p.strip_prefix(from) {
        Ok(rest) if rest.as_os_str().is_empty() => to.to_path_buf(),
        Ok(rest) => to.join(rest),
        Err(_) => p.to_path_buf(),
    }
}

/// Proper ancestors of `p` below the mount root, outermost first.
fn ancestors(p: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = p
        .ancestors()
        .skip(1)
        .filter(|a| !a.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .collect();
    v.reverse();
    v
}

fn subtree<V>(m: &BTreeMap<PathBuf, V>, root: &Path) -> Vec<PathBuf> {
    m.keys().filter(|k| below(k, root)).cloned().collect()
}

/// Does `real` name a conflict copy of `orig` (`NAME.ccfs-conflict-HOST-STAMP[-N]`, the
/// name shortened at its front part so the whole fits in 255 bytes)?
pub fn is_conflict_copy_of(orig: &Path, real: &Path, host: &str) -> bool {
    use std::os::unix::ffi::OsStrExt;
    if orig.parent() != real.parent() {
        return false;
    }
    let (Some(o), Some(r)) = (orig.file_name(), real.file_name()) else {
        return false;
    };
    let (o, r) = (o.as_bytes(), r.as_bytes());
    let marker = format!(".ccfs-conflict-{host}-");
    let marker = marker.as_bytes();
    let Some(at) = r.windows(marker.len()).rposition(|w| w == marker) else {
        return false;
    };
    let (prefix, suffix) = (&r[..at], &r[at + marker.len()..]);
    // YYYYMMDDTHHMMSSZ, then -N for the second and later copies of the same second.
    let stamp_ok = suffix.len() >= 16
        && suffix[..8].iter().all(u8::is_ascii_digit)
        && suffix[8] == b'T'
        && suffix[9..15].iter().all(u8::is_ascii_digit)
        && suffix[15] == b'Z'
        && (suffix.len() == 16
            || (suffix[16] == b'-'
                && suffix.len() > 17
                && suffix[17..].iter().all(u8::is_ascii_digit)));
    let room = 255 - (r.len() - prefix.len());
    let want = &o[..o.len().min(room)];
    stamp_ok && r.len() <= 255 && prefix == want
}

/// Is `real` the path `orig` after a conflict moved it aside, itself or with one of its
/// directories (the same path but one component, a conflict copy of the original)?
pub fn is_set_aside(orig: &Path, real: &Path, host: &str) -> bool {
    let (a, b): (Vec<_>, Vec<_>) = (orig.components().collect(), real.components().collect());
    if a.len() != b.len() {
        return false;
    }
    let differ: Vec<usize> = (0..a.len()).filter(|i| a[*i] != b[*i]).collect();
    let [i] = differ[..] else {
        return false;
    };
    let at = |v: &[std::path::Component], n: usize| -> PathBuf { v[..=n].iter().collect() };
    is_conflict_copy_of(&at(&a, i), &at(&b, i), host)
}

#[derive(Debug, Clone)]
pub struct Model {
    pub share: BTreeMap<PathBuf, ShareEntry>,
    pub ws: Vec<Ws>,
    next_ver: u64,
    next_stamp: u64,
    /// Share files whose look (inode, size, mtime, ctime) the real sync being modelled
    /// left as it was: on a share that keeps whole seconds, a new mtime given within the
    /// second of the old one is no new version to anyone who looks (set by the harness
    /// before each [`Model::sync`]).
    pub look_kept: BTreeSet<PathBuf>,
    /// On a share that keeps whole seconds, the second of each version's mtime (set by
    /// the harness as it writes them): ccfs tells its own transfer by size and mtime,
    /// there cut to the second, so two versions of one size in one second are one to it.
    pub stamp_seconds: Option<BTreeMap<u64, i64>>,
    /// On a share that keeps whole seconds, each file version's last look (inode, size,
    /// mtime, ctime) and object, as the harness saw it (see [`Model::same_looks`]).
    pub looks_seen: BTreeMap<u64, ([i64; 6], Obj)>,
}

impl Model {
    pub fn new(workstations: usize) -> Self {
        let mut share = BTreeMap::new();
        share.insert(
            PathBuf::from(ROOT),
            ShareEntry {
                obj: Obj::Dir,
                ver: Ver::Dir(0),
            },
        );
        Model {
            share,
            ws: vec![Ws::default(); workstations],
            next_ver: 1,
            next_stamp: 1,
            look_kept: BTreeSet::new(),
            stamp_seconds: None,
            looks_seen: BTreeMap::new(),
        }
    }

    /// On a share that keeps whole seconds: a file version on the share (`looks`: every
    /// share file's look now) whose look and bytes, permission bits and attribute are
    /// those of an earlier version no longer on the share is that version to every look.
    /// ext4 gives a new file the inode number a removed one freed, and within the same
    /// second its times are the removed one's too: nothing, to ccfs or to a user, tells
    /// the two apart (a workstation whose base is the removed one finds it still there).
    pub fn same_looks(&mut self, looks: &BTreeMap<PathBuf, [i64; 6]>) {
        let same_object = |a: &Obj, b: &Obj| match (a, b) {
            (
                Obj::File {
                    data: d1,
                    mode: m1,
                    xattr: x1,
                    ..
                },
                Obj::File {
                    data: d2,
                    mode: m2,
                    xattr: x2,
                    ..
                },
            ) => d1 == d2 && m1 == m2 && x1 == x2,
            _ => false,
        };
        let on_share: BTreeSet<u64> = self
            .share
            .values()
            .filter_map(|e| match e.ver {
                Ver::File(v) => Some(v),
                Ver::Dir(_) => None,
            })
            .collect();
        for (p, look) in looks {
            let Some(e) = self.share.get(p) else { continue };
            let Ver::File(v) = e.ver else { continue };
            let earlier = self.looks_seen.iter().find(|(u, (l, o))| {
                **u != v && !on_share.contains(*u) && l == look && same_object(o, &e.obj)
            });
            let Some((&u, _)) = earlier else { continue };
            if let Some(e) = self.share.get_mut(p) {
                e.ver = Ver::File(u);
            }
            for ws in &mut self.ws {
                for b in ws.bases.values_mut() {
                    if *b == Some(Ver::File(v)) {
                        *b = Some(Ver::File(u));
                    }
                }
            }
        }
        for (p, look) in looks {
            if let Some(ShareEntry {
                obj,
                ver: Ver::File(v),
            }) = self.share.get(p)
            {
                self.looks_seen.insert(*v, (*look, obj.clone()));
            }
        }
    }

    pub fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    fn file_ver(&mut self) -> Ver {
        self.next_ver += 1;
        Ver::File(self.next_ver)
    }

    /// Puts an object on the share directly (the initial state).
    pub fn put_on_share(&mut self, p: &Path, obj: Obj) {
        let ver = match obj {
            Obj::Dir => Ver::Dir(0),
            Obj::File { .. } | Obj::Link(_) => self.file_ver(),
        };
        self.share.insert(p.to_path_buf(), ShareEntry { obj, ver });
    }

    /// Workstation `w` took `p` over from a look whose version it could not tell by
    /// content (ccfs marks such a racy base unknown: a look made before its lock, on a
    /// share that keeps whole seconds, in the second of a change there): any version the
    /// share has there is a change to it. Learned from ccfs, as inode numbers are.
    pub fn base_unknown(&mut self, w: usize, p: &Path) {
        if let Some(b) = self.ws[w].bases.get_mut(p) {
            if b.is_some() {
                *b = Some(Ver::File(u64::MAX));
            }
        }
    }

    /// An edit on the share itself (over SSH, on the server), in place: the share's file
    /// at `p` (one with data) gets the first byte `b` (another than it has), a new version
    /// of the same object. Returns its new stamp, or None when there is no such file.
    pub fn edit_there(&mut self, p: &Path, b: u8) -> Option<u64> {
        let Some(ShareEntry {
            obj: Obj::File { data, .. },
            ..
        }) = self.share.get(p)
        else {
            return None;
        };
        if data.is_empty() {
            return None;
        }
        let b = if data[0] == b { b.wrapping_add(1) } else { b };
        // A base's file a daemon holds open is this very object: its bytes change under it.
        let now = self.share[p].ver;
        for ws in &mut self.ws {
            if let Some(part) = ws.partial.get_mut(p) {
                if part.held && ws.bases.get(p).copied().flatten() == Some(now) {
                    part.edited = true;
                }
            }
        }
        let stamp = self.stamp();
        let ver = self.file_ver();
        let e = self.share.get_mut(p).expect("there");
        if let Obj::File { data, stamp: s, .. } = &mut e.obj {
            data[0] = b;
            *s = stamp;
        }
        e.ver = ver;
        Some(stamp)
    }

    /// A change of attributes on the share itself: the share's file at `p` gets `user.x`
    /// set to `b` (another than it has), a new version of the same object with the same
    /// bytes and mtime. Returns the value set, or None when there is no file there.
    pub fn attr_there(&mut self, p: &Path, b: u8) -> Option<u8> {
        // To a daemon holding this very file open as a base, a change of its ctime is a
        // change there (a write in place may put its mtime back).
        if let Some(ShareEntry {
            obj: Obj::File { .. },
            ver: now,
        }) = self.share.get(p).cloned()
        {
            for ws in &mut self.ws {
                if let Some(part) = ws.partial.get_mut(p) {
                    if part.held && ws.bases.get(p).copied().flatten() == Some(now) {
                        part.edited = true;
                    }
                }
            }
        }
        let ver = self.file_ver();
        let e = self.share.get_mut(p)?;
        let Obj::File { xattr, .. } = &mut e.obj else {
            return None;
        };
        let b = if *xattr == Some(b) {
            b.wrapping_add(1)
        } else {
            b
        };
        *xattr = Some(b);
        e.ver = ver;
        Some(b)
    }

    /// The share's directories with their inode numbers as the harness reads them; a
    /// directory that should have kept its inode but did not was replaced behind the model.
    pub fn learn_dir_inodes(
        &mut self,
        ino_of: impl Fn(&Path) -> Option<u64>,
    ) -> Result<(), String> {
        for (p, e) in self.share.iter_mut() {
            if let Ver::Dir(known) = &mut e.ver {
                let Some(ino) = ino_of(p) else { continue };
                if *known != 0 && *known != ino {
                    return Err(format!(
                        "directory {} was replaced on the share (inode {known} -> {ino})",
                        p.display()
                    ));
                }
                *known = ino;
            }
        }
        Ok(())
    }

    fn share_ver(&self, p: &Path) -> Option<Ver> {
        self.share.get(p).map(|e| e.ver)
    }

    fn share_has_children(&self, p: &Path) -> bool {
        self.share.keys().any(|k| k.parent() == Some(p))
    }

    // ---- files held by block ----------------------------------------------------------

    /// Whether workstation `w` can read its copy of `p` whole: not held by block, or its
    /// cache file has every block, or the base's bytes can still be read (from the file
    /// the daemon holds open, unless it was written in place since; else from the share,
    /// while it has the base there and answers).
    pub fn readable(&self, w: usize, p: &Path) -> bool {
        let ws = &self.ws[w];
        let Some(part) = ws.partial.get(p) else {
            return true;
        };
        if part.complete {
            return true;
        }
        if part.held {
            return !part.edited;
        }
        let base = ws.bases.get(p).copied().flatten();
        !ws.share_down && base.is_some() && self.share_ver(p) == base
    }

    /// Whether the share still has the version `w`'s copy of `p` was taken from.
    pub fn share_has_base(&self, w: usize, p: &Path) -> bool {
        let base = self.ws[w].bases.get(p).copied().flatten();
        base.is_some() && self.share_ver(p) == base
    }

    /// The files of `w`'s view it cannot read (see [`Model::readable`]).
    pub fn unreadable(&self, w: usize) -> BTreeSet<PathBuf> {
        self.ws[w]
            .partial
            .keys()
            .filter(|p| self.ws[w].upper.contains_key(*p) && !self.readable(w, p))
            .cloned()
            .collect()
    }

    /// What ccfs holds by block on workstation `w` now (path: the journal's record, and
    /// whether the daemon holds the base's file open); the model keeps what it knows of
    /// each base held before.
    ///
    /// A cache file keeps the blocks it had below its limit (a cut lowers the limit), and
    /// one that had every block (or that the model saw written whole) keeps them: ccfs
    /// saying otherwise is a block it forgot.
    pub fn learn_partial(
        &mut self,
        w: usize,
        now: BTreeMap<PathBuf, (ccfs::state::Partial, bool)>,
    ) -> Result<(), String> {
        for (p, (part, _)) in &now {
            let Some(had) = self.ws[w].partial.get(p) else {
                continue;
            };
            if had.complete && !part.is_complete() {
                return Err(format!(
                    "workstation {w}'s cache file of {} had every block; ccfs now says it lacks some",
                    p.display()
                ));
            }
            let below = had.limit.min(part.limit).div_ceil(BLOCK);
            for (s, e) in had.here.iter() {
                if let Some(b) = (s..e.min(below)).find(|b| !part.here.contains(*b)) {
                    return Err(format!(
                        "workstation {w}'s cache file of {} had block {b}; ccfs now says it lacks it",
                        p.display()
                    ));
                }
            }
        }
        let before = std::mem::take(&mut self.ws[w].partial);
        self.ws[w].partial = now
            .into_iter()
            .map(|(p, (part, held))| {
                let edited = held && before.get(&p).is_some_and(|b| b.held && b.edited);
                if !part.is_complete() {
                    count(1, 0);
                }
                let learned = Part {
                    complete: part.is_complete(),
                    limit: part.limit,
                    here: part.here,
                    held,
                    edited,
                };
                (p, learned)
            })
            .collect();
        Ok(())
    }

    /// Whether a write of `len` bytes at `offset` (`len` 0: a cut to `offset`) of `w`'s
    /// copy of `p` reads the base: a block it covers in part, below the limit, that the
    /// cache file lacks is copied from the base first.
    fn write_reads_base(&self, w: usize, p: &Path, offset: u64, len: u64) -> bool {
        let Some(part) = self.ws[w].partial.get(p) else {
            return false;
        };
        let end = offset + len;
        let mut ends = vec![];
        if !offset.is_multiple_of(BLOCK) {
            ends.push(offset / BLOCK);
        }
        if len > 0 && !end.is_multiple_of(BLOCK) {
            ends.push(end / BLOCK);
        }
        if len == 0 && offset >= part.limit {
            // (A cut at or past the limit reads nothing.)
            return false;
        }
        ends.into_iter()
            .any(|b| b * BLOCK < part.limit && !part.here.contains(b))
    }

    /// A mapping of `p` made on `w` goes through the daemon (the file is held by block).
    pub fn held_through_ccfs(&mut self, w: usize, p: &Path) {
        self.ws[w].held_through_ccfs.insert(p.to_path_buf());
    }

    // ---- a workstation's view ---------------------------------------------------------

    fn hidden(&self, w: usize, p: &Path) -> bool {
        let ws = &self.ws[w];
        p.ancestors()
            .filter(|a| !a.as_os_str().is_empty())
            .any(|a| ws.whiteouts.contains(a))
    }

    /// What workstation `w` shows at `p`: the cache's copy, else the share's unless a
    /// deletion hides it.
    pub fn lookup(&self, w: usize, p: &Path) -> Option<Obj> {
        if let Some(o) = self.ws[w].upper.get(p) {
            return Some(o.clone());
        }
        if self.hidden(w, p) {
            return None;
        }
        self.share.get(p).map(|e| e.obj.clone())
    }

    /// The names a listing of directory `d` shows: the cache's and the share's (when the
    /// share has `d` as a directory and it is not deleted here), without deleted ones.
    pub fn list(&self, w: usize, d: &Path) -> BTreeSet<PathBuf> {
        let ws = &self.ws[w];
        let mut out: BTreeSet<PathBuf> = BTreeSet::new();
        if ws.upper.get(d).is_some_and(Obj::is_dir) {
            out.extend(ws.upper.keys().filter(|k| k.parent() == Some(d)).cloned());
        }
        let share_dir = self.share.get(d).is_some_and(|e| e.obj.is_dir());
        if share_dir && !self.hidden(w, d) {
            out.extend(
                self.share
                    .keys()
                    .filter(|k| k.parent() == Some(d) && !self.hidden(w, k))
                    .cloned(),
            );
        }
        out
    }

    /// While the share does not answer: what the cache holds (None when it cannot even
    /// show the root, which is then only on the share).
    pub fn view_while_down(&self, w: usize) -> Option<BTreeMap<PathBuf, Obj>> {
        let upper = &self.ws[w].upper;
        upper.get(Path::new(ROOT))?;
        let mut out = BTreeMap::new();
        let mut stack = vec![PathBuf::from(ROOT)];
        while let Some(p) = stack.pop() {
            let Some(o) = upper.get(&p) else { continue };
            if o.is_dir() {
                stack.extend(upper.keys().filter(|k| k.parent() == Some(&p)).cloned());
            }
            out.insert(p, o.clone());
        }
        Some(out)
    }

    /// While the share does not answer, a path is reached only through the cache's
    /// directories.
    fn parents_in_cache(&self, w: usize, p: &Path) -> bool {
        ancestors(p)
            .iter()
            .all(|a| self.ws[w].upper.get(a).is_some_and(Obj::is_dir))
    }

    pub fn share_down(&self, w: usize) -> bool {
        self.ws[w].share_down
    }

    pub fn set_share_down(&mut self, w: usize, down: bool) {
        self.ws[w].share_down = down;
    }

    /// Everything workstation `w` shows below the root, reached by listing directories.
    pub fn view(&self, w: usize) -> BTreeMap<PathBuf, Obj> {
        let mut out = BTreeMap::new();
        let mut stack = vec![PathBuf::from(ROOT)];
        while let Some(p) = stack.pop() {
            let Some(o) = self.lookup(w, &p) else {
                continue;
            };
            if o.is_dir() {
                stack.extend(self.list(w, &p));
            }
            out.insert(p, o);
        }
        out
    }

    /// What looking at every clean copy does (ccfs checks each against the share when a
    /// lookup or a listing reaches it, and every step's comparison reaches them all): a
    /// file the cache holds as a sync left it on the share, not changed here since, whose
    /// share object changed, was replaced or is gone, is let go of, and its base
    /// forgotten. Not while the share does not answer that workstation.
    pub fn look_at_clean_copies(&mut self) {
        for w in 0..self.ws.len() {
            if !self.ws[w].mounted || self.ws[w].share_down {
                continue;
            }
            let ws = &self.ws[w];
            let stale: Vec<PathBuf> = ws
                .upper
                .iter()
                .filter(|(p, o)| o.is_file() && !ws.dirty.contains(*p))
                .filter_map(|(p, _)| {
                    let base = ws.bases.get(p).copied().flatten()?;
                    (self.share_ver(p) != Some(base)).then(|| p.clone())
                })
                .collect();
            let gone: Vec<bool> = stale.iter().map(|p| !self.share.contains_key(p)).collect();
            let ws = &mut self.ws[w];
            for (p, gone) in stale.into_iter().zip(gone) {
                ws.upper.remove(&p);
                ws.bases.remove(&p);
                // The look that let it go found nothing there: kept, as any such look.
                if gone {
                    ws.kept_absent.insert(p);
                }
            }
            // Directories the share no longer has, holding nothing of this session's:
            // let go of with all below (top down: one let go takes its own along).
            let dirs: Vec<PathBuf> = self.ws[w]
                .upper
                .iter()
                .filter(|(p, o)| o.is_dir() && p.as_path() != Path::new(ROOT))
                .map(|(p, _)| p.clone())
                .collect();
            for d in dirs {
                let ws = &self.ws[w];
                if !ws.upper.contains_key(&d)
                    || self.share.get(&d).is_some_and(|e| e.obj.is_dir())
                    || ws.dirty.iter().any(|k| below_or_at(k, &d))
                    || ws.whiteouts.iter().any(|k| below_or_at(k, &d))
                    || ws.sending.keys().any(|k| below_or_at(k, &d))
                {
                    continue;
                }
                let only_clean = ws
                    .upper
                    .iter()
                    .filter(|(k, _)| below(k, &d))
                    .all(|(k, o)| o.is_dir() || ws.bases.get(k).copied().flatten().is_some());
                if !only_clean {
                    continue;
                }
                let ws = &mut self.ws[w];
                ws.upper.retain(|k, _| !below_or_at(k, &d));
                ws.bases.retain(|k, _| !below_or_at(k, &d));
            }
        }
    }

    /// The kernel walks to a path through its parents: each must be a directory.
    /// (While the share does not answer, only through the cache's own directories.)
    fn parents_ok(&self, w: usize, p: &Path) -> bool {
        if self.ws[w].share_down {
            return self.parents_in_cache(w, p);
        }
        ancestors(p)
            .iter()
            .all(|a| self.lookup(w, a).is_some_and(|o| o.is_dir()))
    }

    // ---- changes within a session -----------------------------------------------------

    /// The first take-over of a path in a session records what the share holds there.
    fn take_over(&mut self, w: usize, p: &Path) {
        // A kept look that found nothing stands for the share's answer.
        let now = if self.ws[w].kept_absent.contains(p) {
            None
        } else {
            self.share_ver(p)
        };
        self.ws[w].bases.entry(p.to_path_buf()).or_insert(now);
    }

    fn mark_dirty(&mut self, w: usize, p: &Path) {
        let ws = &mut self.ws[w];
        ws.dirty.insert(p.to_path_buf());
        ws.whiteouts.remove(p);
    }

    /// The cache's directories above `p` (made as needed; they are not changes).
    fn ensure_parents(&mut self, w: usize, p: &Path) {
        for a in ancestors(p) {
            self.ws[w].upper.entry(a).or_insert(Obj::Dir);
        }
    }

    /// The first change to a share file copies that one file to the cache.
    fn copy_up(&mut self, w: usize, p: &Path) {
        if self.ws[w].upper.contains_key(p) {
            return;
        }
        let Some(obj) = self.lookup(w, p) else {
            return;
        };
        self.ensure_parents(w, p);
        self.take_over(w, p);
        self.ws[w].upper.insert(p.to_path_buf(), obj);
        self.mark_dirty(w, p);
    }

    /// Writes (create or truncate) `data` at `p`.
    pub fn write(&mut self, w: usize, p: &Path, data: Vec<u8>) -> bool {
        if !self.parents_ok(w, p) {
            return false;
        }
        let stamp = self.stamp();
        let found = if self.ws[w].share_down {
            // Without the share: the cache's file, or a new one where the cache can tell
            // the name is free.
            match self.ws[w].upper.get(p) {
                None if !self.free_without_share(w, p) => return false,
                other => other.cloned(),
            }
        } else {
            self.lookup(w, p)
        };
        match found {
            Some(Obj::Dir | Obj::Link(_)) => false,
            Some(Obj::File { .. }) => {
                self.copy_up(w, p);
                self.mark_dirty(w, p);
                if let Some(Obj::File {
                    data: d, stamp: s, ..
                }) = self.ws[w].upper.get_mut(p)
                {
                    *d = data;
                    *s = stamp;
                }
                self.written_whole(w, p);
                true
            }
            None => {
                self.ensure_parents(w, p);
                self.take_over(w, p);
                self.mark_dirty(w, p);
                self.ws[w].upper.insert(
                    p.to_path_buf(),
                    Obj::File {
                        data,
                        mode: 0o644,
                        stamp,
                        xattr: None,
                    },
                );
                true
            }
        }
    }

    /// Changes an existing file in the cache (copied up first) with `f`.
    fn change_file(
        &mut self,
        w: usize,
        p: &Path,
        f: impl FnOnce(&mut Vec<u8>, &mut u32, &mut u64),
    ) -> bool {
        let found = if self.ws[w].share_down {
            self.ws[w].upper.get(p).cloned()
        } else {
            self.lookup(w, p)
        };
        if !self.parents_ok(w, p) || !matches!(found, Some(Obj::File { .. })) {
            return false;
        }
        self.copy_up(w, p);
        self.mark_dirty(w, p);
        if let Some(Obj::File {
            data, mode, stamp, ..
        }) = self.ws[w].upper.get_mut(p)
        {
            f(data, mode, stamp);
        }
        true
    }

    pub fn append(&mut self, w: usize, p: &Path, b: u8) -> bool {
        let Some(len) = self.file_len(w, p) else {
            return false;
        };
        self.pwrite(w, p, len, &[b])
    }

    /// The length of `w`'s file at `p`, as a write finds it (the share does not answer:
    /// the cache's).
    fn file_len(&self, w: usize, p: &Path) -> Option<u64> {
        let found = if self.ws[w].share_down {
            self.ws[w].upper.get(p).cloned()
        } else {
            self.lookup(w, p)
        };
        match found {
            Some(Obj::File { data, .. }) => Some(data.len() as u64),
            _ => None,
        }
    }

    /// Writes `bytes` at `offset` of an existing file, without cutting it (past its end:
    /// the gap reads as zeros). A block of a file held by block that the write covers in
    /// part, and that the cache lacks, is read from the base first: where the base cannot
    /// be read, the write fails.
    pub fn pwrite(&mut self, w: usize, p: &Path, offset: u64, bytes: &[u8]) -> bool {
        let reads_base = self.write_reads_base(w, p, offset, bytes.len() as u64);
        if reads_base && !self.readable(w, p) {
            return false;
        }
        // (A file the cache lacks is taken over now: held by block, it lacks every block.)
        let taken_over_here = !self.ws[w].upper.contains_key(p)
            && self.file_len(w, p).is_some_and(|len| offset < len);
        if reads_base || taken_over_here {
            count(0, 1);
        }
        let s = self.stamp();
        let (at, end) = (offset as usize, offset as usize + bytes.len());
        self.change_file(w, p, |d, _, stamp| {
            if d.len() < end {
                d.resize(end, 0);
            }
            d[at..end].copy_from_slice(bytes);
            *stamp = s;
        })
    }

    /// Cuts or extends an existing file to `len` (`truncate -s`): a cut within a block of
    /// a file held by block that the cache lacks reads the block from the base first.
    pub fn truncate(&mut self, w: usize, p: &Path, len: u64) -> bool {
        if self.write_reads_base(w, p, len, 0) && !self.readable(w, p) {
            return false;
        }
        let s = self.stamp();
        let done = self.change_file(w, p, |d, _, stamp| {
            d.resize(len as usize, 0);
            *stamp = s;
        });
        // A cut below the limit lowers it: the blocks below it may all be here now.
        if let Some(part) = self.ws[w].partial.get_mut(p).filter(|_| done) {
            part.limit = part.limit.min(len);
            part.complete = part.here.gaps(0, part.limit.div_ceil(BLOCK)).is_empty();
        }
        done
    }

    /// A write of a new content (cut to nothing first) leaves the cache file of a file
    /// held by block with every block.
    fn written_whole(&mut self, w: usize, p: &Path) {
        if let Some(part) = self.ws[w].partial.get_mut(p) {
            part.complete = true;
        }
    }

    /// A program opens the file read-write, maps it shared, closes the descriptor and
    /// writes `b` at its start through the mapping, which it keeps. Only a file with data.
    pub fn map(&mut self, w: usize, p: &Path, b: u8) -> bool {
        let found = if self.ws[w].share_down {
            self.ws[w].upper.get(p).cloned()
        } else {
            self.lookup(w, p)
        };
        if !matches!(found, Some(Obj::File { ref data, .. }) if !data.is_empty())
            || (self.write_reads_base(w, p, 0, 1) && !self.readable(w, p))
        {
            return false;
        }
        let s = self.stamp();
        let done = self.change_file(w, p, |d, _, stamp| {
            d[0] = b;
            *stamp = s;
        });
        if done {
            self.ws[w].held.insert(p.to_path_buf());
        }
        done
    }

    /// Each mapping workstation `w`'s programs hold writes `b` at its file's start,
    /// whether a session runs there or not (the journal has the file as unsynced work).
    pub fn map_write(&mut self, w: usize, b: u8) {
        let held: Vec<PathBuf> = self.ws[w].held.iter().cloned().collect();
        for p in held {
            let s = self.stamp();
            if let Some(Obj::File { data, stamp, .. }) = self.ws[w].upper.get_mut(&p) {
                data[0] = b;
                *stamp = s;
            }
        }
    }

    /// The programs holding mappings of `w`'s files at or below `p` end (all: `None`).
    pub fn unmap(&mut self, w: usize, p: Option<&Path>) {
        self.ws[w]
            .held
            .retain(|h| p.is_some_and(|p| !below_or_at(h, p)));
    }

    /// Sets (a value) or removes (None) the file's `user.x` attribute: a change of the
    /// file (copied up), not of its content or mtime.
    pub fn set_xattr(&mut self, w: usize, p: &Path, v: Option<u8>) -> bool {
        let had = match if self.ws[w].share_down {
            self.ws[w].upper.get(p).cloned()
        } else {
            self.lookup(w, p)
        } {
            Some(Obj::File { xattr, .. }) => xattr,
            _ => return false,
        };
        // Removing an attribute the file lacks fails (ENODATA), and changes nothing.
        if v.is_none() && had.is_none() {
            return false;
        }
        if !self.change_file(w, p, |_, _, _| {}) {
            return false;
        }
        if let Some(Obj::File { xattr, .. }) = self.ws[w].upper.get_mut(p) {
            *xattr = v;
        }
        true
    }

    pub fn chmod(&mut self, w: usize, p: &Path, m: u32) -> bool {
        self.change_file(w, p, |_, mode, _| *mode = m)
    }

    /// Sets the mtime (`touch -d`, `cp -p`): a new stamp, same content.
    pub fn touch(&mut self, w: usize, p: &Path) -> bool {
        let s = self.stamp();
        self.change_file(w, p, |_, _, stamp| *stamp = s)
    }

    /// Removes `p` from the view; a share object there is deleted at the next sync.
    fn remove(&mut self, w: usize, p: &Path) {
        // The share's object to delete: the one shown (a share file the cache lacks),
        // else what the removal's look found there (a kept one: nothing).
        let shown_from_share =
            !self.ws[w].upper.contains_key(p) && !matches!(self.lookup(w, p), Some(Obj::Dir));
        let looked_there = shown_from_share || !self.ws[w].kept_absent.contains(p);
        let whiteout = looked_there && self.share.contains_key(p) && !self.hidden(w, p);
        let ws = &mut self.ws[w];
        ws.dirty.retain(|k| !below(k, p));
        ws.partial.retain(|k, _| !below(k, p));
        for k in subtree(&ws.upper, p) {
            ws.upper.remove(&k);
        }
        if whiteout {
            self.ws[w].whiteouts.insert(p.to_path_buf());
            self.take_over(w, p);
        }
    }

    /// Without the share a new object is made only where the cache can tell the name is
    /// free: a deletion made here hides the share's side, or the session took the name
    /// over when the share had nothing there (a base that is a file may still be there).
    fn free_without_share(&self, w: usize, p: &Path) -> bool {
        self.hidden(w, p) || matches!(self.ws[w].bases.get(p), Some(None))
    }

    /// Without the share a removal cannot tell whether there is something to delete
    /// there: it fails (unless a deletion above hides the share's side, or a kept look
    /// found nothing there).
    fn removal_needs_share(&self, w: usize, p: &Path) -> bool {
        self.ws[w].share_down && !self.hidden(w, p) && !self.ws[w].kept_absent.contains(p)
    }

    /// A look at the share for `p` by workstation `w` (a lookup, or a change's own look):
    /// one that finds nothing is kept, one that finds something drops the kept one. None
    /// where the cache answers (its object there, a deletion, a file of the cache on the
    /// way) or while the share does not answer.
    pub fn look(&mut self, w: usize, p: &Path) {
        let ws = &self.ws[w];
        if !ws.mounted
            || ws.share_down
            || ws.upper.contains_key(p)
            || self.hidden(w, p)
            || ancestors(p)
                .iter()
                .any(|a| ws.upper.get(a).is_some_and(|o| !o.is_dir()))
        {
            return;
        }
        self.keep_look(w, p);
    }

    /// What a look at the share for `p` finds: nothing there is kept, something there
    /// drops a kept look.
    fn keep_look(&mut self, w: usize, p: &Path) {
        let there = self.share.contains_key(p);
        let ws = &mut self.ws[w];
        if there {
            ws.kept_absent.remove(p);
        } else {
            ws.kept_absent.insert(p.to_path_buf());
        }
    }

    /// A change's own look at `p` (mkdir, a removal, a rename), made before it finds
    /// what the cache has there (so also where the cache has an object): it takes a kept
    /// one when there is one. None where a deletion here hides the name, or while the
    /// share does not answer.
    pub fn look_unless_kept(&mut self, w: usize, p: &Path) {
        let ws = &self.ws[w];
        if ws.kept_absent.contains(p) || !ws.mounted || ws.share_down || self.hidden(w, p) {
            return;
        }
        self.keep_look(w, p);
    }

    /// The kernel's walk to `p`: a look at each parent, nearest first, while each shows a
    /// directory (through the cache's alone while the share does not answer).
    /// Returns whether every parent showed a directory.
    pub fn look_on_the_way(&mut self, w: usize, p: &Path) -> bool {
        for a in p.ancestors().skip(1) {
            if a.as_os_str().is_empty() {
                break;
            }
            self.look(w, a);
            let dir = if self.ws[w].share_down {
                self.ws[w].upper.get(a).is_some_and(Obj::is_dir)
            } else {
                self.lookup(w, a).is_some_and(|o| o.is_dir())
            };
            if !dir {
                return false;
            }
        }
        true
    }

    /// Every view was looked at (each step's comparison): each name it shows from the
    /// share drops a kept look of it.
    pub fn views_looked(&mut self) {
        for w in 0..self.ws.len() {
            if !self.ws[w].mounted || self.ws[w].share_down {
                continue;
            }
            let shown: Vec<PathBuf> = self
                .view(w)
                .into_keys()
                .filter(|p| !self.ws[w].upper.contains_key(p))
                .collect();
            for p in shown {
                self.ws[w].kept_absent.remove(&p);
            }
        }
    }

    pub fn unlink(&mut self, w: usize, p: &Path) -> bool {
        // Without the share only the cache's object can be found (a kept look says the
        // share has nothing there; without one the share must answer).
        let found = if self.ws[w].share_down {
            self.ws[w].upper.get(p).cloned()
        } else {
            self.lookup(w, p)
        };
        if !self.parents_ok(w, p)
            || found.is_none_or(|o| o.is_dir())
            || self.removal_needs_share(w, p)
        {
            return false;
        }
        self.remove(w, p);
        true
    }

    pub fn mkdir(&mut self, w: usize, p: &Path) -> bool {
        self.make(w, p, Obj::Dir)
    }

    /// symlink(2) to `t<t>` at `p`, made like a directory (a name the view shows free).
    pub fn symlink(&mut self, w: usize, p: &Path, t: u8) -> bool {
        self.make(w, p, Obj::Link(t))
    }

    /// mkdir or symlink: `obj` at `p`, where the view shows the name free (without the
    /// share: where the cache can tell, or a kept look found nothing).
    fn make(&mut self, w: usize, p: &Path, obj: Obj) -> bool {
        let exists = if self.ws[w].share_down {
            self.ws[w].upper.contains_key(p)
                || !(self.free_without_share(w, p) || self.ws[w].kept_absent.contains(p))
        } else {
            self.lookup(w, p).is_some()
        };
        if !self.parents_ok(w, p) || exists {
            return false;
        }
        self.ensure_parents(w, p);
        self.take_over(w, p);
        self.mark_dirty(w, p);
        self.ws[w].upper.insert(p.to_path_buf(), obj);
        true
    }

    pub fn rmdir(&mut self, w: usize, p: &Path) -> bool {
        // (Its listing needs the share, unless a deletion here hides the share's side;
        // while the share does not answer, the cache's listing serves, and a kept look
        // that found nothing there tells what the share has.)
        let known = self.hidden(w, p) || self.ws[w].kept_absent.contains(p);
        let found = if self.ws[w].share_down {
            self.ws[w].upper.get(p).cloned()
        } else {
            self.lookup(w, p)
        };
        if !self.parents_ok(w, p)
            || !matches!(found, Some(Obj::Dir))
            || !self.list(w, p).is_empty()
            || (self.ws[w].share_down && !known)
        {
            return false;
        }
        self.remove(w, p);
        true
    }

    /// rename(2) within the cached class. A directory the share has cannot move (EXDEV).
    pub fn rename(&mut self, w: usize, from: &Path, to: &Path) -> bool {
        if !self.parents_ok(w, from) || !self.parents_ok(w, to) {
            return false;
        }
        let src = if self.ws[w].share_down {
            self.ws[w].upper.get(from).cloned()
        } else {
            self.lookup(w, from)
        };
        let Some(src) = src else {
            return false;
        };
        // A file held by block is made whole before it moves (even onto itself).
        if self.ws[w]
            .partial
            .keys()
            .any(|k| below_or_at(k, from) && !self.readable(w, k))
        {
            return false;
        }
        if from == to {
            return true;
        }
        let down = self.ws[w].share_down;
        if down {
            // It must know whether the share has `from` (a kept look that found nothing,
            // or a deletion here, tells), and what the share has at `to` unless the
            // session took `to` over already.
            let ws = &self.ws[w];
            let from_known = self.hidden(w, from) || ws.kept_absent.contains(from);
            let to_known = ws.kept_absent.contains(to) || ws.bases.contains_key(to);
            if !from_known || !to_known {
                return false;
            }
        }
        if below(to, from) {
            return false;
        }
        let dst = if down {
            self.ws[w].upper.get(to).cloned()
        } else {
            self.lookup(w, to)
        };
        match (&src, dst) {
            (src, Some(dst)) if src.is_dir() != dst.is_dir() => return false,
            (Obj::Dir, Some(Obj::Dir)) if !self.list(w, to).is_empty() => return false,
            _ => {}
        }
        // What the rename's look at `from` found there (a kept one: nothing).
        let from_on_share = !self.hidden(w, from)
            && self.share.contains_key(from)
            && !self.ws[w].kept_absent.contains(from);
        if src.is_dir() && from_on_share && self.share[from].obj.is_dir() {
            return false; // EXDEV
        }
        self.copy_up(w, from);
        self.ensure_parents(w, to);
        // Every path that now holds something the share lacks is taken over and sent.
        let moved: Vec<PathBuf> = subtree(&self.ws[w].upper, from);
        self.take_over(w, to);
        for m in &moved {
            self.take_over(w, &reroot(m, from, to));
        }
        if from_on_share {
            self.take_over(w, from);
        }
        let ws = &mut self.ws[w];
        // (What moves was made whole first; what the rename replaces is gone.)
        ws.partial.retain(|k, _| !below(k, to) && !below(k, from));
        for k in subtree(&ws.upper, to) {
            ws.upper.remove(&k);
        }
        ws.dirty.retain(|k| !below(k, to) && !below(k, from));
        for m in moved {
            let obj = ws.upper.remove(&m).expect("moved entry");
            let there = reroot(&m, from, to);
            ws.whiteouts.remove(&there);
            ws.dirty.insert(there.clone());
            ws.upper.insert(there, obj);
        }
        ws.whiteouts.remove(to);
        if from_on_share {
            ws.whiteouts.insert(from.to_path_buf());
        }
        self.mark_dirty(w, to);
        true
    }

    // ---- sessions ---------------------------------------------------------------------

    pub fn mounted(&self, w: usize) -> bool {
        self.ws[w].mounted
    }

    /// A crash: the session ends without a sync; the journal keeps everything.
    pub fn crash(&mut self, w: usize) {
        self.ws[w].mounted = false;
        self.ws[w].session_ends();
    }

    /// After a logout (whatever its sync left) the overlay is gone.
    pub fn logged_out(&mut self, w: usize) {
        self.ws[w].mounted = false;
        self.ws[w].session_ends();
    }

    /// A login: with work in the journal, a recovery (a logout sync of that journal);
    /// else the cache keeps only its clean copies. Returns whether a recovery must run.
    pub fn login_needs_recovery(&mut self, w: usize) -> bool {
        let ws = &mut self.ws[w];
        ws.mounted = true;
        ws.share_down = false;
        ws.kept_absent.clear();
        if ws.has_work() {
            return true;
        }
        ws.keep_clean_copies_only();
        false
    }

    /// Without rsync's report of what it sent: is the share's `theirs` our own transfer of
    /// `ours`, handed over as `sent`? Not while it is the very version taken as the base
    /// (rsync puts a new file in place: a chmod alone, which changes neither size nor
    /// mtime, is not taken for sent); else when it has the size and mtime handed over, or
    /// the cache copy's now.
    fn is_ours(
        &self,
        theirs: &ShareEntry,
        base: Option<Ver>,
        ours: Option<&Obj>,
        sent: Option<(usize, u64)>,
    ) -> bool {
        let Some(t) = theirs.obj.tag() else {
            return ours.is_some_and(|o| o.same_type(&theirs.obj));
        };
        // On a whole-second share, while the cache's file is as it was handed over, its
        // bytes tell ours from another workstation's save of that size in that second.
        let as_handed = sent.is_some() && ours.and_then(Obj::tag) == sent;
        let same_bytes = match (ours, &theirs.obj) {
            (Some(Obj::File { data: a, .. }), Obj::File { data: b, .. }) => a == b,
            _ => false,
        };
        let same = |o: Option<(usize, u64)>| {
            o.is_some_and(|o| {
                o == t
                    || (o.0 == t.0
                        && (!as_handed || same_bytes)
                        && self
                            .stamp_seconds
                            .as_ref()
                            .is_some_and(|s| s.get(&o.1).is_some() && s.get(&o.1) == s.get(&t.1)))
            })
        };
        base != Some(theirs.ver) && (same(sent) || same(ours.and_then(Obj::tag)))
    }

    /// Moves our `p` (with all it holds) out of the way for a conflict copy; the share's
    /// object there becomes the base. Returns `p` and what moved (relative to `p`).
    fn set_aside(
        &mut self,
        w: usize,
        p: &Path,
        cur: Option<Ver>,
    ) -> (PathBuf, Vec<(PathBuf, Obj)>) {
        let ws = &mut self.ws[w];
        let mut moved = Vec::new();
        ws.partial.retain(|k, _| !below(k, p));
        for k in subtree(&ws.upper, p) {
            let obj = ws.upper.remove(&k).expect("in the cache");
            ws.dirty.remove(&k);
            moved.push((k.strip_prefix(p).expect("below").to_path_buf(), obj));
        }
        ws.bases.insert(p.to_path_buf(), cur);
        (p.to_path_buf(), moved)
    }

    /// Is a directory on the way to `p` another kind of object on the share?
    fn share_ancestor_not_dir(&self, p: &Path) -> bool {
        for a in ancestors(p) {
            match self.share.get(&a) {
                Some(e) if e.obj.is_dir() => {}
                Some(_) => return true,
                None => return false,
            }
        }
        false
    }

    /// rsync puts `obj` at `p` (its parents made as needed; a file replaces a directory
    /// with everything below it, as `--force` does).
    fn transfer(&mut self, p: &Path, obj: &Obj, ino_of: &dyn Fn(&Path) -> Option<u64>) {
        for a in ancestors(p) {
            if !self.share.get(&a).is_some_and(|e| e.obj.is_dir()) {
                let gone = subtree(&self.share, &a);
                for k in gone {
                    self.share.remove(&k);
                }
                let ver = Ver::Dir(ino_of(&a).unwrap_or(0));
                self.share.insert(a, ShareEntry { obj: Obj::Dir, ver });
            }
        }
        if obj.is_dir() && self.share.get(p).is_some_and(|e| e.obj.is_dir()) {
            return; // attributes only
        }
        // rsync leaves a symbolic link that already points where ours does.
        if matches!(obj, Obj::Link(_)) && self.share.get(p).is_some_and(|e| e.obj == *obj) {
            return;
        }
        for k in subtree(&self.share, p) {
            self.share.remove(&k);
        }
        let ver = match obj {
            Obj::Dir => Ver::Dir(ino_of(p).unwrap_or(0)),
            Obj::File { .. } | Obj::Link(_) => self.file_ver(),
        };
        self.share.insert(
            p.to_path_buf(),
            ShareEntry {
                obj: obj.clone(),
                ver,
            },
        );
    }

    /// One sync of workstation `w` (session, logout or recovery: `drop_when_clean` for the
    /// last two). `listed` is what rsync was handed, in order (empty when it did not run),
    /// and `direct_listed` the regular files the sync sent itself: the model's lists must
    /// equal them, except that each conflict copy the model predicts takes its real name
    /// from them. `ino_of` reads a directory's inode number on the share.
    /// Returns what the sync must report.
    pub fn sync(
        &mut self,
        w: usize,
        drop_when_clean: bool,
        run: Run,
        (listed, direct_listed): (&[PathBuf], &[PathBuf]),
        host: &str,
        ino_of: &dyn Fn(&Path) -> Option<u64>,
    ) -> Result<Outcome, String> {
        let mut out = Outcome::default();
        // A sync starts: no look kept before it stands.
        self.ws[w].kept_absent.clear();
        if self.ws[w].share_down {
            // Nothing can be checked against the share: every change is held back and
            // named, nothing is sent, the cache keeps it all.
            if !listed.is_empty() || !direct_listed.is_empty() {
                return Err(format!(
                    "files were sent while the share was down: {listed:?} {direct_listed:?}"
                ));
            }
            let ws = &mut self.ws[w];
            if matches!(run, Run::CrashAfter(_)) {
                ws.mounted = false;
                ws.session_ends();
                return Ok(out);
            }
            out.ok = ws.dirty.is_empty() && ws.whiteouts.is_empty();
            if drop_when_clean && out.ok {
                ws.keep_clean_copies_only();
                out.cache_dropped = true;
            }
            out.remaining_dirty = ws.dirty.len();
            out.remaining_deletions = ws.whiteouts.len();
            return Ok(out);
        }
        let mut conflicts: Vec<(PathBuf, ConflictKind)> = Vec::new();
        // (1) What a crashed sync was sending: our own transfer becomes the base.
        let leftover = std::mem::take(&mut self.ws[w].sending);
        for (p, sent) in leftover {
            let theirs = self.share.get(&p).cloned();
            let ours = self.ws[w].upper.get(&p).cloned();
            if let Some(t) = theirs {
                let base = self.ws[w].bases.get(&p).copied().flatten();
                if self.is_ours(&t, base, ours.as_ref(), sent) {
                    self.ws[w].bases.insert(p, Some(t.ver));
                }
            }
        }
        // (1b) A changed file held by block whose base the share no longer has is made
        // whole (then kept aside as any file), from the base's file the daemon holds
        // unless it was written in place; one that cannot be is kept in the cache out of
        // the view, and the share's version shows.
        let partial: Vec<PathBuf> = self.ws[w]
            .partial
            .keys()
            .filter(|p| self.ws[w].dirty.contains(*p) && self.ws[w].upper.contains_key(*p))
            .cloned()
            .collect();
        for p in partial {
            let base = self.ws[w].bases.get(&p).copied().flatten();
            if self.share_ver(&p) == base {
                continue;
            }
            let part = self.ws[w].partial[&p].clone();
            let ws = &mut self.ws[w];
            ws.partial.remove(&p);
            if part.complete || (part.held && !part.edited) {
                continue;
            }
            ws.upper.remove(&p);
            ws.dirty.remove(&p);
            ws.bases.remove(&p);
            ws.held.remove(&p);
            ws.held_through_ccfs.remove(&p);
            conflicts.push((p, ConflictKind::BlocksKeptHere));
        }
        // (2) Conflicts: the share changed where we send = both versions kept.
        let mut aside: Vec<(PathBuf, Vec<(PathBuf, Obj)>)> = Vec::new();
        let dirty: Vec<PathBuf> = self.ws[w].dirty.iter().cloned().collect();
        // A directory we send into (the path itself, or one on its way in the cache) where
        // the share has another kind of object that we did not replace ourselves: ours
        // goes aside with all it holds.
        let mut fine: BTreeSet<PathBuf> = BTreeSet::new();
        for p in &dirty {
            let mut way = ancestors(p);
            way.push(p.clone());
            for dir in way {
                if fine.contains(&dir) {
                    continue;
                }
                if !self.ws[w].upper.get(&dir).is_some_and(Obj::is_dir) {
                    break;
                }
                let cur = match self.share.get(&dir) {
                    Some(e) if !e.obj.is_dir() => Some(e.ver),
                    _ => {
                        fine.insert(dir);
                        continue;
                    }
                };
                let taken = self.ws[w].bases.get(&dir).copied();
                if taken == Some(cur) {
                    fine.insert(dir);
                    continue;
                }
                let kind = if taken == Some(None) {
                    ConflictKind::CreatedOnBoth
                } else {
                    ConflictKind::ModifiedOnBoth
                };
                conflicts.push((dir.clone(), kind));
                aside.push(self.set_aside(w, &dir, cur));
                break;
            }
        }
        // Each dirty file against its base.
        for p in &dirty {
            if !self.ws[w].dirty.contains(p) {
                continue; // moved aside with its directory
            }
            let cur = self.share_ver(p);
            let base = self.ws[w].bases.get(p).copied().flatten();
            if cur == base {
                continue;
            }
            let ours = match self.ws[w].upper.get(p) {
                Some(o) if !o.is_dir() => o.clone(),
                _ => continue,
            };
            match (base, cur) {
                (Some(_), None) => {
                    self.ws[w].bases.insert(p.clone(), None);
                    conflicts.push((p.clone(), ConflictKind::ModifiedHereDeletedThere));
                }
                // Created on both with the same bytes, permission bits and attribute.
                (None, Some(c))
                    if matches!((&self.share[p].obj, &ours),
                        (Obj::File { data: a, mode: m, xattr: x, .. },
                         Obj::File { data: b, mode: n, xattr: y, .. })
                            if a == b && m == n && x == y) =>
                {
                    self.ws[w].bases.insert(p.clone(), Some(c));
                }
                _ => {
                    let kind = if base.is_none() {
                        ConflictKind::CreatedOnBoth
                    } else {
                        ConflictKind::ModifiedOnBoth
                    };
                    conflicts.push((p.clone(), kind));
                    aside.push(self.set_aside(w, p, cur));
                }
            }
        }
        // Deleted here, changed there: the share's version stays. Below something that is
        // no directory on the share, there is nothing to delete.
        let whiteouts: Vec<PathBuf> = self.ws[w].whiteouts.iter().cloned().collect();
        for d in whiteouts {
            if self.share_ancestor_not_dir(&d) {
                if !self.ws[w].upper.contains_key(&d) {
                    self.ws[w].whiteouts.remove(&d);
                }
                continue;
            }
            let cur = self.share_ver(&d);
            let base = self.ws[w].bases.get(&d).copied().flatten();
            if cur.is_none() || cur == base || self.ws[w].upper.contains_key(&d) {
                continue;
            }
            self.ws[w].whiteouts.remove(&d);
            self.ws[w].bases.insert(d.clone(), cur);
            conflicts.push((d, ConflictKind::DeletedHereModifiedThere));
        }
        // A file sent where the share has a directory removes all it holds: only when we
        // deleted all of it; else ours goes aside.
        for p in &dirty {
            if !self.ws[w].dirty.contains(p) {
                continue;
            }
            let Some(cur) = self.share.get(p).filter(|e| e.obj.is_dir()).map(|e| e.ver) else {
                continue;
            };
            if self.ws[w].upper.get(p).is_none_or(Obj::is_dir) {
                continue;
            }
            let ws = &self.ws[w];
            let all_ours = self
                .share
                .keys()
                .filter(|k| *k != p && below(k, p))
                .all(|k| ws.whiteouts.contains(k));
            if all_ours {
                continue;
            }
            conflicts.push((p.clone(), ConflictKind::ModifiedOnBoth));
            aside.push(self.set_aside(w, p, Some(cur)));
        }
        // Our versions moved aside take their real names from the list.
        let known: BTreeSet<PathBuf> = self.ws[w]
            .dirty
            .iter()
            .filter(|p| self.ws[w].upper.contains_key(*p))
            .cloned()
            .collect();
        let mut unknown: Vec<PathBuf> = listed
            .iter()
            .chain(direct_listed)
            .filter(|p| !known.contains(*p))
            .cloned()
            .collect();
        for (p, moved) in aside {
            let Some(i) = unknown
                .iter()
                .position(|c| is_conflict_copy_of(&p, c, host))
            else {
                return Err(format!(
                    "no conflict copy of {} was sent (rsync was handed {listed:?})",
                    p.display()
                ));
            };
            let name = unknown.remove(i);
            let base_there = self.share_ver(&name);
            let ws = &mut self.ws[w];
            for (rest, obj) in moved {
                let at = if rest.as_os_str().is_empty() {
                    name.clone()
                } else {
                    name.join(&rest)
                };
                // A mapping follows its file to the conflict name.
                if ws.held.remove(&p.join(&rest))
                    || (rest.as_os_str().is_empty() && ws.held.remove(&p))
                {
                    ws.held.insert(at.clone());
                }
                if ws.held_through_ccfs.remove(&p.join(&rest))
                    || (rest.as_os_str().is_empty() && ws.held_through_ccfs.remove(&p))
                {
                    ws.held_through_ccfs.insert(at.clone());
                }
                unknown.retain(|u| u != &at);
                ws.upper.insert(at.clone(), obj);
                ws.dirty.insert(at);
            }
            ws.bases.insert(name, base_there);
        }
        // (3) A dirty file the share holds as the session took it over, with the same
        // bytes and mode, is not sent: the share's copy takes its mtime, and it is clean.
        let dirty: Vec<PathBuf> = self.ws[w].dirty.iter().cloned().collect();
        for p in dirty {
            // A mapped file may change after any comparison: rsync's part. A file held
            // by block is sent by its blocks whatever they hold.
            if self.ws[w].held.contains(&p) || self.ws[w].partial.contains_key(&p) {
                continue;
            }
            let Some(Obj::File {
                data,
                mode,
                stamp,
                xattr,
            }) = self.ws[w].upper.get(&p).cloned()
            else {
                continue;
            };
            let Some(base) = self.ws[w].bases.get(&p).copied().flatten() else {
                continue;
            };
            // Only files without extended attributes on either side are compared.
            let same = xattr.is_none()
                && self.share.get(&p).is_some_and(|e| {
                    e.ver == base
                        && matches!(&e.obj, Obj::File { data: d, mode: m, xattr: None, .. }
                            if *d == data && *m == mode)
                });
            if !same {
                continue;
            }
            let restamped =
                matches!(&self.share[&p].obj, Obj::File { stamp: s, .. } if *s != stamp);
            if restamped && self.look_kept.contains(&p) {
                // The same version to every look (a share with whole seconds).
                if let Some(e) = self.share.get_mut(&p) {
                    e.obj = Obj::File {
                        data,
                        mode,
                        stamp,
                        xattr,
                    };
                }
            } else if restamped {
                // The share's file takes the mtime in place: to another workstation
                // holding it open as a base, a change of its look (its bytes cannot be
                // trusted any more).
                let old = self.share_ver(&p);
                for (v, ws) in self.ws.iter_mut().enumerate() {
                    if let Some(part) = ws.partial.get_mut(&p) {
                        if v != w && part.held && ws.bases.get(&p).copied().flatten() == old {
                            part.edited = true;
                        }
                    }
                }
                let ver = self.file_ver();
                self.share.insert(
                    p.clone(),
                    ShareEntry {
                        obj: Obj::File {
                            data,
                            mode,
                            stamp,
                            xattr,
                        },
                        ver,
                    },
                );
            }
            let now = self.share_ver(&p);
            let ws = &mut self.ws[w];
            ws.bases.insert(p.clone(), now);
            ws.dirty.remove(&p);
        }
        // The list: dirty paths the cache holds, sorted.
        let stale: Vec<PathBuf> = self.ws[w]
            .dirty
            .iter()
            .filter(|p| !self.ws[w].upper.contains_key(*p))
            .cloned()
            .collect();
        // Files being written (mapped) go first, each as a snapshot, where the share has
        // their directory; then the rest.
        // Files held by block are sent by the sync itself, after rsync's; so are the
        // regular files not being written, without an extended attribute, whose directory
        // the share has and whose name there is no directory, of names short enough for
        // their copy's (first, by name).
        let (by_block, all): (Vec<PathBuf>, Vec<PathBuf>) = self.ws[w]
            .dirty
            .iter()
            .filter(|p| self.ws[w].upper.contains_key(*p))
            .cloned()
            .partition(|p| self.ws[w].partial.contains_key(p));
        // (The name of its copy, `NAME~ccfs-HOST-CACHE`, must fit in a name.)
        let (mut direct, all): (Vec<PathBuf>, Vec<PathBuf>) = all.into_iter().partition(|p| {
            p.file_name()
                .is_some_and(|n| n.len() + "~ccfs-".len() + host.len() + "-12345678".len() <= 255)
                && !self.ws[w].held.contains(p)
                && matches!(self.ws[w].upper.get(p), Some(Obj::File { xattr: None, .. }))
                && p.parent().is_some_and(|d| {
                    d.as_os_str().is_empty() || self.share.get(d).is_some_and(|e| e.obj.is_dir())
                })
                && !self.share.get(p).is_some_and(|e| e.obj.is_dir())
        });
        let direct_count = direct.len();
        direct.extend(by_block);
        let by_block = direct;
        let (mut files, rest): (Vec<PathBuf>, Vec<PathBuf>) = all.into_iter().partition(|p| {
            self.ws[w].held.contains(p)
                && matches!(self.ws[w].upper.get(p), Some(Obj::File { .. }))
                && p.parent()
                    .and_then(|d| self.share.get(d))
                    .is_some_and(|e| e.obj.is_dir())
        });
        files.extend(rest);
        let crashed = matches!(run, Run::CrashAfter(_));
        let rsync_files = files.len();
        if files != listed {
            return Err(format!(
                "rsync was handed {listed:?}, the model lists {files:?}"
            ));
        }
        if by_block[..direct_count] != *direct_listed {
            return Err(format!(
                "the sync sent {direct_listed:?} itself, the model {:?}",
                &by_block[..direct_count]
            ));
        }
        files.extend(by_block.iter().cloned());
        let mut deletions: Vec<PathBuf> = self.ws[w].whiteouts.iter().cloned().collect();
        deletions.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        let sent: Vec<Option<(usize, u64)>> =
            files.iter().map(|p| self.ws[w].upper[p].tag()).collect();
        // rsync fails after k of its files; the files held by block are sent anyway.
        let run = if rsync_files == 0 && !crashed {
            Run::All
        } else {
            run
        };
        let n = match run {
            Run::All => files.len(),
            Run::FailAfter(k) => k.min(rsync_files),
            Run::CrashAfter(k) => k.min(files.len()),
        };
        let transferred: Vec<PathBuf> = match run {
            Run::FailAfter(_) => files[..n]
                .iter()
                .chain(&files[rsync_files..])
                .cloned()
                .collect(),
            _ => files[..n].to_vec(),
        };
        for p in &transferred {
            let obj = self.ws[w].upper[p].clone();
            self.transfer(p, &obj, ino_of);
        }
        out.conflicts = conflicts
            .into_iter()
            .map(|(p, k)| (p, kind_name(k)))
            .collect();
        if crashed {
            self.ws[w].sending = files.into_iter().zip(sent).collect();
            self.ws[w].mounted = false;
            self.ws[w].session_ends();
            out.conflicts.sort();
            return Ok(out);
        }
        // (4) Settle: a file arrived when rsync succeeded; after a failure, a regular file
        // is ours when rsync reported sending it (the first n, whose versions are on the
        // share); when rsync reported no file, the share holds our transfer when it has the
        // size and mtime handed over or the cache copy's.
        let reported: BTreeSet<&PathBuf> = files[..n]
            .iter()
            .filter(|p| self.ws[w].upper[*p].tag().is_some())
            .collect();
        for (i, (p, s)) in files.iter().zip(&sent).enumerate() {
            let theirs = self.share.get(p).cloned();
            let landed = match (&theirs, run) {
                (Some(_), Run::All) => true,
                (Some(_), _) if i >= rsync_files => true,
                (Some(t), _) if !reported.is_empty() && t.obj.tag().is_some() => {
                    reported.contains(p)
                }
                (Some(t), _) => {
                    let base = self.ws[w].bases.get(p).copied().flatten();
                    self.is_ours(t, base, self.ws[w].upper.get(p), *s)
                }
                (None, _) => false,
            };
            if landed {
                let ws = &mut self.ws[w];
                ws.bases.insert(p.clone(), theirs.map(|t| t.ver));
                // The share's new version is the base of the blocks the cache lacks.
                if let Some(part) = ws.partial.get_mut(p) {
                    part.held = false;
                    part.edited = false;
                }
                // A mapped file stays unsynced work: the next sync sends what came after.
                if !ws.held.contains(p) {
                    ws.dirty.remove(p);
                }
            } else {
                out.not_sent.push(p.clone());
            }
        }
        for p in stale {
            self.ws[w].dirty.remove(&p);
        }
        // (5) Deletions, once every file arrived.
        if out.not_sent.is_empty() {
            for d in deletions {
                if !self.ws[w].whiteouts.contains(&d) {
                    continue;
                }
                if !self.ws[w].upper.contains_key(&d) {
                    match self.share.get(&d).map(|e| e.obj.is_dir()) {
                        Some(true) if self.share_has_children(&d) => out
                            .conflicts
                            .push((d.clone(), kind_name(ConflictKind::DeletedHereModifiedThere))),
                        Some(_) => {
                            self.share.remove(&d);
                        }
                        None => {}
                    }
                }
                let now = self.share_ver(&d);
                let ws = &mut self.ws[w];
                ws.whiteouts.remove(&d);
                ws.bases.insert(d, now);
            }
        }
        out.conflicts.sort();
        // In the order of the paths (the sync names them so, whichever rsync run had them).
        out.not_sent.sort();
        let ws = &mut self.ws[w];
        if drop_when_clean && ws.dirty.is_empty() && ws.whiteouts.is_empty() {
            ws.keep_clean_copies_only();
            out.cache_dropped = true;
        }
        // (The blocks of a file kept in the cache did not reach the share: not a success.)
        let blocks_kept = kind_name(ConflictKind::BlocksKeptHere);
        out.ok = run == Run::All
            && out.not_sent.is_empty()
            && !out.conflicts.iter().any(|(_, k)| *k == blocks_kept);
        out.remaining_dirty = ws.dirty.len();
        out.remaining_deletions = ws.whiteouts.len();
        Ok(out)
    }
}
