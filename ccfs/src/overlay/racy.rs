//! Bases on a share that keeps whole-second times (ext4 with 128-byte inodes, MooseFS,
//! many NAS and NFS exports).
//!
//! A base is the share's look at a file (inode, size, mtime, ctime) when the cache took it
//! over or a sync left it there; the path is taken for unchanged on the share while the
//! share shows that look. With whole seconds, another workstation's write in place at the
//! same size, in the second the look was taken, leaves the same look. Such a base is
//! *racy* (the word is git's, for its index): it was taken while its ctime's second may
//! still have been running on the share. A racy base carries the content it stands for
//! ([`Record::Racy`]), and while it is racy it stands only if the share's file still has
//! that content. The first check that finds it so, made once that second is over, settles
//! it: any later write gives the share's file a later ctime.
//!
//! Whether a second is over is a question for the share's clock, not this machine's (the
//! two may disagree by any amount). The share tells its clock through the ctime of a
//! change: every file a sync of ccfs writes tells it (ccfs changes nothing on the share
//! to ask it: a login writes nothing there). Until a sync did, the clock is not known and
//! every whole-second base is racy. From such a look the share's second is known to be
//! at least that much later as time passes here (less a thousandth, for clocks that run
//! at slightly different rates). A share clock set back while ccfs runs is not noticed:
//! see doc/SEMANTICS.md "Sessions".

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;

use sha2::{Digest as _, Sha256};

use super::session::share_id_of;
use super::*;
use crate::locks::Locked;
use crate::state::{Content, ShareId};

/// The share's clock as last told: its second was at least `secs` at `at`.
#[derive(Debug, Clone, Copy)]
pub(super) struct ShareClock {
    secs: i64,
    at: std::time::Instant,
}

impl ShareClock {
    /// The second the share's clock has certainly reached by now: the one it told, and
    /// every whole second since as this machine counts them, less a thousandth (two
    /// clocks that keep time within 0.1% of each other: NTP keeps them within 0.05%).
    fn now(&self) -> i64 {
        let passed = self.at.elapsed().as_secs_f64() * 0.999;
        self.secs.saturating_add(passed as i64)
    }
}

/// The content of the file `f` (read from its start with positioned reads, so a
/// descriptor shared with another reader is not moved).
pub(super) fn content_of(f: &std::fs::File) -> io::Result<Content> {
    const CHUNK: usize = 256 * 1024;
    let mut h = Sha256::new();
    // Aligned to a page, for a descriptor opened with O_DIRECT.
    let mut raw = vec![0u8; CHUNK + 4096];
    let off = raw.as_ptr().align_offset(4096).min(4096);
    let buf = &mut raw[off..off + CHUNK];
    let mut at = 0u64;
    loop {
        let n = match f.read_at(buf, at) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
        at += n as u64;
    }
    Ok(Content::Sha256(h.finalize().into()))
}

/// The content of the file at `rel` below `root`, opened with `flags` (unknown when it
/// cannot be read).
pub(super) fn content_at(root: &Root, rel: &Path, flags: i32) -> Content {
    root.open_file(rel, flags, 0)
        .and_then(|f| content_of(&f))
        .unwrap_or(Content::Unknown)
}

/// The content of `bytes` (see [`content_of`]).
pub(super) fn content_of_bytes(bytes: &[u8]) -> Content {
    Content::Sha256(Sha256::digest(bytes).into())
}

/// The content of the cache's `rel` as the view shows it (a file held by block lacks
/// blocks in its cache file), read in chunks.
pub(super) fn content_of_view(o: &super::Overlay, rel: &Path) -> io::Result<Content> {
    let mut h = Sha256::new();
    o.view_reads(rel, |chunk, _| {
        h.update(chunk);
        true
    })?;
    Ok(Content::Sha256(h.finalize().into()))
}

/// What a racy mark stands for besides the bytes: the permission bits, owner and
/// extended attributes (ACLs among them) of the open file `f`. A chmod, chown or
/// setfattr on a whole-second share in the second of a look leaves the look as it was,
/// as a write in place does. A share without extended attributes has none.
pub(super) fn attributes_of(f: &std::fs::File) -> io::Result<Vec<u8>> {
    let st = sys::fstat(f)?;
    let mut out = format!("{:o} {} {}\0", st.mode() & 0o7777, st.uid(), st.gid()).into_bytes();
    out.extend(xattrs_of(f)?);
    Ok(out)
}

/// The extended attributes of the open file `f` (ACLs among them), names and values in
/// the order of their names; none where the filesystem has none.
pub(super) fn xattrs_of(f: &std::fs::File) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut names = match sys::flistxattr(f) {
        Ok(names) => names,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => Vec::new(),
        Err(e) => return Err(e),
    };
    names.sort();
    for name in names {
        let value = match sys::fgetxattr(f, &name) {
            Ok(v) => v,
            // Removed since it was listed: as if never listed.
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => continue,
            Err(e) => return Err(e),
        };
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(&(value.len() as u64).to_le_bytes());
        out.extend_from_slice(&value);
    }
    Ok(out)
}

/// Whether a file whose bytes are `data` (see [`content_of`]) and whose attributes are
/// `attributes` still is what racy mark `mark` stands for: a mark of an earlier version
/// ([`Content::Bytes`]) by the bytes alone. An unknown mark or content never is.
pub(super) fn mark_holds(mark: Content, data: Content, attributes: &[u8]) -> bool {
    match (mark, data) {
        (Content::Unknown, _) | (_, Content::Unknown) => false,
        (Content::Bytes(m), Content::Sha256(d) | Content::Bytes(d)) => m == d,
        (Content::Sha256(_), _) => sealed(data, attributes) == mark,
    }
}

/// Extended attributes: names and values, in the order of their names.
pub(super) type Xattrs = Vec<(OsString, Vec<u8>)>;

/// The `user.*` extended attributes of the open file `f`; None where its filesystem
/// keeps no extended attributes.
pub(super) fn user_xattrs_of(f: &std::fs::File) -> io::Result<Option<Xattrs>> {
    let mut names = match sys::flistxattr(f) {
        Ok(names) => names,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(None),
        Err(e) => return Err(e),
    };
    names.retain(|n| n.as_bytes().starts_with(b"user."));
    names.sort();
    let mut out = Vec::new();
    for name in names {
        match sys::fgetxattr(f, &name) {
            Ok(v) => out.push((name, v)),
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Some(out))
}

/// A racy mark: the file's bytes (`data`, see [`content_of`]) with its attributes (see
/// [`attributes_of`]). An unknown content stays unknown.
pub(super) fn sealed(data: Content, attributes: &[u8]) -> Content {
    match data {
        Content::Unknown => Content::Unknown,
        Content::Sha256(d) | Content::Bytes(d) => {
            let mut h = Sha256::new();
            h.update(b"ccfs racy mark 2\0");
            h.update(d);
            h.update(attributes);
            Content::Sha256(h.finalize().into())
        }
    }
}

/// A file's look with whole-second times: what a whole-second share gives (a share
/// with finer times gives a zero fraction once in a billion, which costs one check).
pub(super) fn whole_seconds(id: &ShareId) -> bool {
    id.size != u64::MAX && id.ctime.1 == 0 && id.mtime.1 == 0
}

impl Overlay {
    /// How the share's file is opened to read its content: on NFS past the client's
    /// cached pages (O_DIRECT), which a write in place that left the attributes as they
    /// were (whole seconds, the same size) would not make it drop.
    pub(super) fn content_flags(&self) -> i32 {
        let direct = if self.share_is_nfs.load(std::sync::atomic::Ordering::Relaxed) {
            libc::O_DIRECT
        } else {
            0
        };
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | direct
    }

    /// A second the share's clock has certainly reached by now (`i64::MIN`: not known).
    /// Read before the look it qualifies: a look taken after it may have been taken in
    /// any later second.
    pub(super) fn share_second(&self) -> i64 {
        let clock = *self.share_clock.locked();
        clock.map_or(i64::MIN, |c| c.now())
    }

    /// The share has just shown a ctime of `secs` (a change it stamped): its clock has
    /// reached that second.
    pub(super) fn saw_share_time(&self, secs: i64) {
        let mut clock = self.share_clock.locked();
        if secs > clock.map_or(i64::MIN, |c| c.now()) {
            *clock = Some(ShareClock {
                secs,
                at: std::time::Instant::now(),
            });
        }
    }

    /// Waits (at most `limit`) until the share's clock is known to be past second `secs`;
    /// at once when its clock is not known (then it never is).
    pub(super) fn wait_for_share_second(&self, secs: i64, limit: std::time::Duration) {
        let start = std::time::Instant::now();
        while self.share_second() != i64::MIN
            && self.share_second() <= secs
            && start.elapsed() < limit
        {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Whether a file's base `id`, looked at after [`Overlay::share_second`] gave `second`,
    /// is racy: whole seconds, and its ctime's second maybe not over then.
    pub(super) fn is_racy(id: &ShareId, second: i64) -> bool {
        whole_seconds(id) && id.ctime.0 >= second
    }

    /// The racy mark of the share's file at `rel`, looked at as `base`: what it holds if
    /// it is still that object and look (a regular file), as a racy mark (its bytes and
    /// attributes, see [`sealed`]), read through one descriptor (on NFS the open also
    /// revalidates the client's cached attributes); unknown otherwise, when it cannot be
    /// read, or when it was written while it was read. None when this user may not read it (a file of root's
    /// in the home, mode 600, or the user's own of mode 000). Such a base stands by its
    /// look alone, as on a share with finer times: a mark that could never be checked
    /// would make every removal or replacement of the file a conflict, at every login
    /// (see doc/SEMANTICS.md, limit).
    pub(super) fn share_mark(&self, rel: &Path, base: ShareId) -> Option<Content> {
        match self.share_read(rel, base) {
            Ok(Some((data, attributes))) => Some(sealed(data, &attributes)),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => None,
            _ => Some(Content::Unknown),
        }
    }

    /// [`Overlay::share_mark`], its bytes only (see [`content_of`]).
    pub(super) fn share_data(&self, rel: &Path, base: ShareId) -> Content {
        match self.share_read(rel, base) {
            Ok(Some((data, _))) => data,
            _ => Content::Unknown,
        }
    }

    /// The attributes (see [`attributes_of`]) of the share's file at `rel` if it is still
    /// the object with inode number `ino` (an attribute change may have changed the rest
    /// of its look); None otherwise or when they cannot be read.
    pub(super) fn share_attributes(&self, rel: &Path, ino: u64) -> Option<Vec<u8>> {
        let f = self.share.open_file(rel, self.content_flags(), 0).ok()?;
        let st = sys::fstat(&f).ok()?;
        if !st.is_file() || st.ino() != ino {
            return None;
        }
        attributes_of(&f).ok()
    }

    /// The bytes and attributes of the share's file at `rel` while it is the object and
    /// look `base`; None when it is not, or was written while read; the share's errors (a
    /// missing file, a share that does not answer) given.
    fn share_read(&self, rel: &Path, base: ShareId) -> io::Result<Option<(Content, Vec<u8>)>> {
        let f = self.share.open_file(rel, self.content_flags(), 0)?;
        let before = sys::fstat(&f)?;
        if !before.is_file() || share_id_of(&before) != base {
            return Ok(None);
        }
        let data = content_of(&f)?;
        let attributes = attributes_of(&f)?;
        if sys::fstat(&f)?.version() != before.version() {
            return Ok(None);
        }
        Ok(Some((data, attributes)))
    }

    /// The records of `rel`'s base `id`, looked at after [`Overlay::share_second`] gave
    /// `second`: the base, and when it is a racy file's, its mark (see
    /// [`Overlay::share_mark`]; unknown if the share has another object there by then).
    /// Only a regular file is racy: a symbolic link, a FIFO or a device has no bytes to
    /// change in place.
    pub(super) fn base_records(&self, rel: &Path, id: Option<ShareId>, second: i64) -> Vec<Record> {
        let mut out = vec![Record::Base(rel.to_path_buf(), id)];
        if let Some(b) = id.filter(|b| Self::is_racy(b, second)) {
            let content = match self.share.stat(rel) {
                Ok(Some(m)) if m.is_file() => self.share_mark(rel, b),
                Ok(Some(_)) => None,
                _ => Some(Content::Unknown),
            };
            out.extend(content.map(|c| Record::Racy(rel.to_path_buf(), c)));
        }
        out
    }

    /// Whether the share's file at `rel`, whatever its look, is what racy mark `mark`
    /// stands for (see [`mark_holds`]); no when it cannot be read. The error of a share
    /// that does not answer (see [`gate::is_outage`]) is given: nothing can be told.
    pub(super) fn share_file_holds(&self, rel: &Path, mark: Content) -> io::Result<bool> {
        let read = || -> io::Result<bool> {
            let f = self.share.open_file(rel, self.content_flags(), 0)?;
            Ok(mark_holds(mark, content_of(&f)?, &attributes_of(&f)?))
        };
        match read() {
            Err(e) if gate::is_outage(&e) => Err(e),
            r => Ok(r.unwrap_or(false)),
        }
    }

    /// Whether the share's file at `rel` still is the racy base `base` that stands for
    /// `content` (see [`Overlay::share_mark`]). An unknown content never is. None when
    /// the share does not answer (see [`gate::is_outage`]): nothing can be told.
    pub(super) fn share_still_holds(
        &self,
        rel: &Path,
        base: ShareId,
        content: Content,
    ) -> Option<bool> {
        if content == Content::Unknown {
            return Some(false);
        }
        match self.share_read(rel, base) {
            Ok(Some((data, attributes))) => Some(mark_holds(content, data, &attributes)),
            Ok(None) => Some(false),
            Err(e) if gate::is_outage(&e) => None,
            // Gone, replaced, unreadable: not the base.
            Err(_) => Some(false),
        }
    }

    /// The check of a racy base at `rel` for a sync or a look: whether the share's file
    /// still holds it (see [`Overlay::share_still_holds`]; None while the share does not
    /// answer). When the check began after the base's second was over on the share
    /// (`second`, from [`Overlay::share_second`] before it), the base is settled for
    /// good: recorded again without the mark.
    pub(super) fn racy_base_holds(
        &self,
        rel: &Path,
        base: ShareId,
        content: Content,
        second: i64,
    ) -> FsResult<Option<bool>> {
        let holds = self.share_still_holds(rel, base, content);
        if holds == Some(true) && base.ctime.0 < second {
            let mut inner = self.lock_for(&[rel]);
            if inner.state.base(rel) == Some(base) && inner.state.racy(rel) == Some(content) {
                self.record(&mut inner, &[Record::Base(rel.to_path_buf(), Some(base))])?;
            }
        }
        Ok(holds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ctime: (i64, i64), mtime: (i64, i64)) -> ShareId {
        ShareId {
            ino: 7,
            size: 3,
            mtime,
            ctime,
        }
    }

    #[test]
    fn only_a_whole_second_look_in_a_second_not_known_over_is_racy() {
        assert!(Overlay::is_racy(&id((100, 0), (100, 0)), 100));
        assert!(Overlay::is_racy(&id((100, 0), (90, 0)), i64::MIN));
        // The share's second had moved on when the look was taken.
        assert!(!Overlay::is_racy(&id((100, 0), (100, 0)), 101));
        // Finer times: a write in the same second changes the look.
        assert!(!Overlay::is_racy(&id((100, 5), (100, 0)), i64::MIN));
        assert!(!Overlay::is_racy(&id((100, 0), (100, 7)), i64::MIN));
    }

    #[test]
    fn the_share_clock_moves_on_by_whole_seconds_counted_here() {
        let ago = |ms: u64| {
            std::time::Instant::now()
                .checked_sub(std::time::Duration::from_millis(ms))
                .expect("an instant in the past")
        };
        let told = |ms| ShareClock {
            secs: 100,
            at: ago(ms),
        };
        assert_eq!(told(0).now(), 100);
        assert_eq!(told(900).now(), 100, "its second may still run");
        assert_eq!(told(1_500).now(), 101);
        // Ten seconds later the 0.1% margin takes 10 ms: the tenth second is not sure.
        assert_eq!(told(10_005).now(), 109);
    }

    #[test]
    fn a_mark_holds_for_its_bytes_and_attributes_and_an_earlier_versions_for_its_bytes() {
        let data = content_of_bytes(b"abc");
        let Content::Sha256(d) = data else {
            panic!("a digest")
        };
        let mark = sealed(data, b"600 1000 1000\0");
        assert!(mark_holds(mark, data, b"600 1000 1000\0"));
        assert!(!mark_holds(mark, data, b"644 1000 1000\0"), "a chmod there");
        assert!(!mark_holds(
            mark,
            content_of_bytes(b"abd"),
            b"600 1000 1000\0"
        ));
        // A mark of the bytes alone (a journal of an earlier version): by the bytes.
        assert!(mark_holds(Content::Bytes(d), data, b"644 1000 1000\0"));
        assert!(!mark_holds(
            Content::Bytes(d),
            content_of_bytes(b"abd"),
            b""
        ));
        assert!(!mark_holds(Content::Unknown, data, b""));
        assert!(!mark_holds(mark, Content::Unknown, b""));
    }

    #[test]
    fn user_attributes_are_compared_and_labels_are_not() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("f");
        std::fs::write(&p, b"abc").expect("write");
        let f = std::fs::File::open(&p).expect("open");
        let Some(none) = user_xattrs_of(&f).expect("list") else {
            return; // no extended attributes where the tests run
        };
        assert!(none.is_empty());
        if sys::lsetxattr(&p, "user.tag".as_ref(), b"v", 0).is_err() {
            return;
        }
        assert_eq!(
            user_xattrs_of(&f).expect("list"),
            Some(vec![("user.tag".into(), b"v".to_vec())])
        );
    }

    #[test]
    fn contents_differ_with_one_byte_and_agree_between_file_and_bytes() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("f");
        std::fs::write(&p, b"abc").expect("write");
        let f = std::fs::File::open(&p).expect("open");
        assert_eq!(content_of(&f).expect("read"), content_of_bytes(b"abc"));
        assert_ne!(content_of_bytes(b"abc"), content_of_bytes(b"abd"));
        assert_ne!(content_of_bytes(b"abc"), Content::Unknown);
    }
}
