//! Files held by block (`blocks.rs`, `send_blocks.rs`) through the overlay: what a handle
//! reads and writes, what the journal keeps, what the sync sends.

use std::os::unix::fs::MetadataExt;

use super::test_support::{ctx, fresh, rsync, Fresh};
use super::*;
use crate::extents::BLOCK;
use crate::sync::{run_sync, SyncMode};

const LEN: usize = 64 * BLOCK as usize;

/// The share's file: every block a different byte pattern.
pub(super) fn base() -> Vec<u8> {
    (0..LEN).map(|i| (i / 4096 * 7 + i % 251) as u8).collect()
}

/// A share with `.db` (the pattern above), held by block from 64 KiB on.
pub(super) fn held() -> Fresh {
    let t = fresh(&[]);
    std::fs::write(t.share.join(".db"), base()).expect("share file");
    t.o.set_by_block_from(16 * BLOCK);
    t
}

pub(super) fn open_rw(t: &Fresh) -> OpenFile {
    t.o.open_file(&ctx(), Path::new(".db"), libc::O_RDWR)
        .expect("open")
}

pub(super) fn write(t: &Fresh, f: &OpenFile, data: &[u8], at: u64) {
    let g =
        t.o.file_to_write(&ctx(), f, || Some(PathBuf::from(".db")))
            .expect("writable");
    t.o.write_at(&g, data, at).expect("write");
}

fn read_all(t: &Fresh, f: &OpenFile) -> Vec<u8> {
    let g =
        t.o.file_to_read(&ctx(), f, || Some(PathBuf::from(".db")))
            .expect("readable");
    let len = sys::fstat(g.file()).expect("fstat").len() as usize;
    let mut buf = vec![0u8; len + 100];
    let n = t.o.read_at(&g, &mut buf, 0).expect("read");
    buf.truncate(n);
    buf
}

/// A handle closed, as the kernel's RELEASE does (the descriptor goes too).
pub(super) fn close(t: &Fresh, f: OpenFile) {
    t.o.close_file(&f);
    drop(f);
}

/// A clean logout (the cache keeps its clean copies), then the next login on this
/// workstation: the kept temporary directory, the share, the cache and the new overlay.
fn log_out_and_in(t: Fresh) -> (tempfile::TempDir, PathBuf, PathBuf, Overlay) {
    let r = run_sync(&t.o, &rsync(&t.share), SyncMode::Logout).expect("logout");
    assert!(r.ok && r.cache_dropped, "{r:?}");
    reopen(t, |_| {})
}

/// The daemon ends (after a logout, or killed), `between` runs on the share, and the cache
/// is opened again: the kept temporary directory, the share, the cache and the overlay.
pub(super) fn reopen(
    t: Fresh,
    between: impl FnOnce(&Path),
) -> (tempfile::TempDir, PathBuf, PathBuf, Overlay) {
    let Fresh {
        _tmp,
        share,
        cache,
        o,
    } = t;
    drop(o);
    between(&share);
    let o = Overlay::new(&share, &cache, Policy::default_policy()).expect("reopen");
    o.set_by_block_from(16 * BLOCK);
    (_tmp, share, cache, o)
}

/// Another workstation saves `.db` on the share: a new file renamed over it.
pub(super) fn save_elsewhere(share: &Path, data: &[u8]) {
    std::fs::write(share.join(".db.new"), data).expect("theirs");
    std::fs::rename(share.join(".db.new"), share.join(".db")).expect("rename");
}

pub(super) fn sync(t: &Fresh) -> crate::sync::SyncReport {
    sync_of(&t.o, &t.share)
}

/// A session's sync; again while it leaves a file dirty that nothing here writes (other
/// tests of this process fork children that hold a copy of every descriptor for a
/// moment: a file open for writing then may still be written, for all a sync can tell).
pub(super) fn sync_of(o: &Overlay, share: &Path) -> crate::sync::SyncReport {
    let mut report = run_sync(o, &rsync(share), SyncMode::Session).expect("sync");
    for _ in 0..50 {
        if report.remaining_dirty == 0 || !report.conflicts.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        report = run_sync(o, &rsync(share), SyncMode::Session).expect("sync");
    }
    report
}

#[test]
fn a_large_file_written_copies_nothing_and_reads_the_share_where_the_cache_lacks_blocks() {
    let t = held();
    let f = open_rw(&t);
    write(&t, &f, &[0xaa; 2 * BLOCK as usize], 8 * BLOCK);
    let mut want = base();
    want[8 * BLOCK as usize..10 * BLOCK as usize].fill(0xaa);
    assert_eq!(
        read_all(&t, &f),
        want,
        "the written blocks, the share's elsewhere"
    );
    let g = f.current();
    assert!(g.is_held_by_block(), "its I/O goes through the daemon");
    let cache = std::fs::metadata(t.cache.join("upper/.db")).expect("cache file");
    assert_eq!(cache.len(), LEN as u64, "the share's length");
    assert!(
        cache.blocks() * 512 < 4 * BLOCK,
        "only the written blocks take room: {} bytes",
        cache.blocks() * 512
    );
    drop(g);
    assert_eq!(std::fs::read(t.share.join(".db")).expect("share"), base());
    close(&t, f);
}

#[test]
fn a_write_into_part_of_a_missing_block_copies_the_rest_of_that_block_first() {
    let t = held();
    let f = open_rw(&t);
    write(&t, &f, b"xyz", 3 * BLOCK + 100);
    let mut want = base();
    want[3 * BLOCK as usize + 100..3 * BLOCK as usize + 103].copy_from_slice(b"xyz");
    assert_eq!(read_all(&t, &f), want);
    // The block is whole in the cache file itself.
    let cache = std::fs::read(t.cache.join("upper/.db")).expect("cache");
    assert_eq!(
        &cache[3 * BLOCK as usize..4 * BLOCK as usize],
        &want[3 * BLOCK as usize..4 * BLOCK as usize]
    );
    close(&t, f);
}

#[test]
fn the_sync_sends_the_changed_blocks_over_the_base_and_the_file_stays_held_by_block() {
    let t = held();
    let f = open_rw(&t);
    write(&t, &f, &[1; BLOCK as usize], 0);
    write(&t, &f, &[2; 10], 40 * BLOCK + 5);
    close(&t, f);
    let report = sync(&t);
    assert!(report.ok && report.remaining_dirty == 0, "{report:?}");
    let mut want = base();
    want[..BLOCK as usize].fill(1);
    want[40 * BLOCK as usize + 5..40 * BLOCK as usize + 15].fill(2);
    assert_eq!(std::fs::read(t.share.join(".db")).expect("share"), want);
    let cache_mtime = std::fs::metadata(t.cache.join("upper/.db"))
        .expect("c")
        .mtime();
    assert_eq!(
        std::fs::metadata(t.share.join(".db")).expect("s").mtime(),
        cache_mtime,
        "the share's copy has the cache's mtime"
    );
    // Still held by block, clean, reading the new share version where it lacks blocks.
    let inner = t.o.lock();
    let part = inner
        .state()
        .partial(Path::new(".db"))
        .expect("held by block");
    assert!(part.changed.is_empty(), "sent: nothing left to send");
    assert!(!inner.state().is_dirty(Path::new(".db")));
    drop(inner);
    let f = open_rw(&t);
    assert_eq!(read_all(&t, &f), want);
    close(&t, f);
}

#[test]
fn a_cut_below_the_share_length_reads_zeros_past_it_once_grown_again_and_is_sent_so() {
    let t = held();
    let f = open_rw(&t);
    write(&t, &f, &[3; 4], 2 * BLOCK);
    {
        let g =
            t.o.file_to_write(&ctx(), &f, || Some(PathBuf::from(".db")))
                .expect("w");
        let attr = SetAttr {
            size: Some(10 * BLOCK + 17),
            ..SetAttr::default()
        };
        t.o.setattr(&ctx(), Path::new(".db"), attr, Some(g.file()))
            .expect("cut");
        let attr = SetAttr {
            size: Some(20 * BLOCK),
            ..SetAttr::default()
        };
        t.o.setattr(&ctx(), Path::new(".db"), attr, Some(g.file()))
            .expect("grow");
    }
    let mut want = base();
    want[2 * BLOCK as usize..2 * BLOCK as usize + 4].fill(3);
    want.truncate(10 * BLOCK as usize + 17);
    want.resize(20 * BLOCK as usize, 0);
    assert_eq!(read_all(&t, &f), want);
    close(&t, f);
    let r = sync(&t);
    assert!(r.ok && r.remaining_dirty == 0, "{r:?}");
    assert_eq!(std::fs::read(t.share.join(".db")).expect("share"), want);
}

#[test]
fn blocks_written_and_synced_survive_a_restart_of_the_daemon_and_unsynced_ones_are_not_invented() {
    let t = held();
    let f = open_rw(&t);
    write(&t, &f, &[5; BLOCK as usize], 4 * BLOCK);
    {
        let g = f.current();
        t.o.sync_file(&g, true).expect("fsync");
    }
    // Written after the fsync, never synced: as after a crash, the journal does not list
    // it (its data may or may not be in the cache file; the base is what shows).
    write(&t, &f, &[6; BLOCK as usize], 6 * BLOCK);
    let journal = std::fs::read(t.cache.join("journal")).expect("journal");
    drop(f);
    let cut = tempfile::tempdir().expect("cut");
    let cache = cut.path().join("cache");
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(&t.cache)
        .arg(&cache)
        .status()
        .expect("cp");
    assert!(st.success());
    std::fs::write(cache.join("journal"), journal).expect("journal as it was");
    let o = Overlay::new(&t.share, &cache, Policy::default_policy()).expect("reopen");
    let f = o
        .open_file(&ctx(), Path::new(".db"), libc::O_RDONLY)
        .expect("open");
    let io = f.current();
    assert!(io.is_held_by_block());
    let mut buf = vec![0u8; LEN];
    let n = o.read_at(&io, &mut buf, 0).expect("read");
    assert_eq!(n, LEN);
    let mut want = base();
    want[4 * BLOCK as usize..5 * BLOCK as usize].fill(5);
    assert_eq!(
        buf, want,
        "the fsynced block, and the base where nothing is on record"
    );
}

#[test]
fn a_rename_makes_the_file_whole_first() {
    let t = held();
    let f = open_rw(&t);
    write(&t, &f, &[9; 3], 0);
    close(&t, f);
    // An old mtime (`touch -d`): the blocks copied in at the rename are no change.
    let old = crate::sys::SetTime::At {
        secs: 1_000_000_000,
        nsecs: 0,
    };
    let set = SetAttr {
        mtime: Some(old),
        ..Default::default()
    };
    t.o.setattr(&ctx(), Path::new(".db"), set, None)
        .expect("backdate");
    t.o.rename(
        &ctx(),
        Path::new(""),
        std::ffi::OsStr::new(".db"),
        Path::new(""),
        std::ffi::OsStr::new(".db2"),
        0,
    )
    .expect("rename");
    let mut want = base();
    want[..3].fill(9);
    assert_eq!(
        std::fs::read(t.cache.join("upper/.db2")).expect("cache"),
        want,
        "whole in the cache"
    );
    assert!(t.o.lock().state().partials().next().is_none());
    let m = std::fs::metadata(t.cache.join("upper/.db2")).expect("cache");
    assert_eq!(
        (m.mtime(), m.mtime_nsec()),
        (1_000_000_000, 0),
        "its mtime kept"
    );
    let r = sync(&t);
    assert!(r.ok && r.remaining_dirty == 0, "{r:?}");
    assert_eq!(std::fs::read(t.share.join(".db2")).expect("share"), want);
}

#[test]
fn a_rename_or_link_of_a_file_still_on_the_share_copies_it_whole() {
    // (Found by the sessions model: the rename's own copy-up held the file by block, and
    // its missing blocks were then looked for at the new name on the share.)
    for link in [false, true] {
        let t = held();
        let new = std::ffi::OsStr::new(".db2");
        if link {
            t.o.link(&ctx(), Path::new(".db"), Path::new(""), new)
                .expect("link");
        } else {
            t.o.rename(
                &ctx(),
                Path::new(""),
                std::ffi::OsStr::new(".db"),
                Path::new(""),
                new,
                0,
            )
            .expect("rename");
        }
        assert!(
            t.o.lock().state().partials().next().is_none(),
            "link {link}"
        );
        assert_eq!(
            std::fs::read(t.cache.join("upper/.db2")).expect("cache"),
            base(),
            "whole in the cache (link {link})"
        );
        let f =
            t.o.open_file(&ctx(), Path::new(".db2"), libc::O_RDONLY)
                .expect("open");
        let g =
            t.o.file_to_read(&ctx(), &f, || Some(PathBuf::from(".db2")))
                .expect("readable");
        let mut buf = vec![0u8; LEN + 1];
        let n = t.o.read_at(&g, &mut buf, 0).expect("read");
        assert_eq!(&buf[..n], &base()[..], "link {link}");
        drop(g);
        close(&t, f);
        let r = sync(&t);
        assert!(r.ok && r.remaining_dirty == 0, "{r:?}");
        assert_eq!(std::fs::read(t.share.join(".db2")).expect("share"), base());
    }
}

#[test]
fn another_workstations_save_during_the_session_keeps_both_versions_whole() {
    let t = held();
    let f = open_rw(&t);
    write(&t, &f, &[7; BLOCK as usize], BLOCK);
    // (No block the cache lacks was read: the base was kept at the take-over.)
    close(&t, f);
    // Another workstation saves its own version (a new file renamed over the old).
    let theirs = vec![0x42u8; 1000];
    save_elsewhere(&t.share, &theirs);
    let report = sync(&t);
    assert_eq!(report.conflicts.len(), 1, "{report:?}");
    assert_eq!(std::fs::read(t.share.join(".db")).expect("share"), theirs);
    let kept = t.share.join(&report.conflicts[0].kept);
    let mut ours = base();
    ours[BLOCK as usize..2 * BLOCK as usize].fill(7);
    assert_eq!(
        std::fs::read(&kept).expect("ours kept"),
        ours,
        "ours, whole"
    );
}

#[test]
fn a_file_held_open_for_writing_is_sent_as_its_blocks_were_when_the_sync_took_it() {
    let t = held();
    let f = open_rw(&t);
    write(&t, &f, &[4; BLOCK as usize], 2 * BLOCK);
    // Not fsynced: the sync puts the blocks on record itself.
    let r = run_sync(&t.o, &rsync(&t.share), SyncMode::Session).expect("sync");
    assert!(r.ok, "{r:?}");
    assert_eq!(
        r.kept_open,
        [PathBuf::from(".db")],
        "still open: stays dirty"
    );
    let mut want = base();
    want[2 * BLOCK as usize..3 * BLOCK as usize].fill(4);
    assert_eq!(std::fs::read(t.share.join(".db")).expect("share"), want);
    // Written after the sync took it: the next sync, once the file is closed.
    write(&t, &f, &[8; 5], 30 * BLOCK);
    close(&t, f);
    let r = sync(&t);
    assert!(r.ok && r.remaining_dirty == 0, "{r:?}");
    want[30 * BLOCK as usize..30 * BLOCK as usize + 5].fill(8);
    assert_eq!(std::fs::read(t.share.join(".db")).expect("share"), want);
}

/// Where two versions of the file differ, in a few words.
fn differ(got: &[u8], want: &[u8]) -> String {
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    format!(
        "{} bytes, {} expected; first difference at {:?} ({:?} against {:?})",
        got.len(),
        want.len(),
        first,
        first.map(|i| got[i]),
        first.map(|i| want[i])
    )
}

/// One step of [`blocks_as_a_file_would_have_them`].
#[derive(Debug, Clone)]
enum Step {
    Write {
        at: u64,
        len: usize,
        b: u8,
    },
    Fsync,
    Cut(u64),
    /// A new handle opened with O_TRUNC (the one open before is closed first).
    Truncate,
    Close,
    Sync,
    Crash,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    let end = (LEN as u64) + 3 * BLOCK;
    prop_oneof![
        6 => (0..end, 1..3 * BLOCK as usize, any::<u8>())
            .prop_map(|(at, len, b)| Step::Write { at, len, b }),
        2 => Just(Step::Fsync),
        1 => (0..end).prop_map(Step::Cut),
        1 => Just(Step::Truncate),
        1 => Just(Step::Close),
        2 => Just(Step::Sync),
        1 => Just(Step::Crash),
    ]
}

/// What a file written, cut, synced and crashed should hold, byte for byte.
struct Reference {
    now: Vec<u8>,
    /// Every value each byte had since the last point the file was made durable (fsync,
    /// close, sync), and the lengths it had: what a crash may leave.
    since: Vec<std::collections::BTreeSet<u8>>,
    lens: std::collections::BTreeSet<usize>,
}

impl Reference {
    fn new(data: Vec<u8>) -> Self {
        let mut r = Reference {
            now: data,
            since: Vec::new(),
            lens: Default::default(),
        };
        r.durable();
        r
    }

    fn durable(&mut self) {
        self.since = self.now.iter().map(|b| [*b].into()).collect();
        self.lens = [self.now.len()].into();
    }

    fn changed(&mut self) {
        if self.since.len() < self.now.len() {
            self.since.resize(self.now.len(), Default::default());
        }
        for (i, b) in self.now.iter().enumerate() {
            self.since[i].insert(*b);
        }
        self.lens.insert(self.now.len());
    }

    fn write(&mut self, at: usize, data: &[u8]) {
        if self.now.len() < at + data.len() {
            // A hole before the write reads as zeros.
            self.now.resize(at + data.len(), 0);
        }
        self.now[at..at + data.len()].copy_from_slice(data);
        self.changed();
    }

    fn cut(&mut self, len: usize) {
        self.now.resize(len, 0);
        self.changed();
    }

    /// Whether `got` is a state a crash may leave.
    fn may_be(&self, got: &[u8]) -> Result<(), String> {
        if !self.lens.contains(&got.len()) {
            return Err(format!("length {} not in {:?}", got.len(), self.lens));
        }
        for (i, b) in got.iter().enumerate() {
            // A byte past every length the file had since: zeros of a later growth.
            let ok = self.since.get(i).map_or(*b == 0, |s| {
                s.contains(b) || (*b == 0 && i >= self.now.len().min(i))
            });
            if !ok {
                return Err(format!(
                    "byte {i} is {b}, it was one of {:?}",
                    self.since.get(i)
                ));
            }
        }
        Ok(())
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: std::env::var("CCFS_BLOCK_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
        ..Default::default()
    })]

    /// Writes at any offset and length, cuts, fsyncs, closes, syncs and power cuts of a
    /// file held by block: the view always shows what was written; a power cut leaves,
    /// byte for byte, a value the byte had since it was last made durable; and every sync
    /// (a recovery's included) puts on the share exactly what the view shows.
    #[test]
    fn blocks_as_a_file_would_have_them(steps in proptest::collection::vec(step(), 1..24)) {
        let t = held();
        let mut o = t.o;
        let mut cuts = Vec::new();
        let mut cache = t.cache.clone();
        let mut r = Reference::new(base());
        let mut f: Option<OpenFile> = None;
        let name = || Some(PathBuf::from(".db"));
        let view = |o: &Overlay| -> Vec<u8> {
            let f = o.open_file(&ctx(), Path::new(".db"), libc::O_RDONLY).expect("open");
            let g = f.current();
            let len = sys::fstat(g.file()).expect("fstat").len() as usize;
            let mut buf = vec![0u8; len];
            let n = o.read_at(&g, &mut buf, 0).expect("read");
            buf.truncate(n);
            buf
        };
        for s in &steps {
            match s {
                Step::Write { at, len, b } => {
                    let h = f.get_or_insert_with(|| o.open_file(&ctx(), Path::new(".db"), libc::O_RDWR).expect("open"));
                    let g = o.file_to_write(&ctx(), h, name).expect("writable");
                    let data = vec![*b; *len];
                    o.write_at(&g, &data, *at).expect("write");
                    r.write(*at as usize, &data);
                }
                Step::Fsync => {
                    if let Some(h) = &f {
                        let g = o.file_to_write(&ctx(), h, name).expect("writable");
                        o.sync_file(&g, true).expect("fsync");
                        r.durable();
                    }
                }
                Step::Cut(len) => {
                    let h = f.get_or_insert_with(|| o.open_file(&ctx(), Path::new(".db"), libc::O_RDWR).expect("open"));
                    let g = o.file_to_write(&ctx(), h, name).expect("writable");
                    let attr = SetAttr { size: Some(*len), ..SetAttr::default() };
                    o.setattr(&ctx(), Path::new(".db"), attr, Some(g.file())).expect("cut");
                    r.cut(*len as usize);
                }
                Step::Truncate => {
                    if let Some(h) = f.take() {
                        o.close_file(&h);
                    }
                    f = Some(o.open_file(&ctx(), Path::new(".db"), libc::O_RDWR | libc::O_TRUNC).expect("open"));
                    r.cut(0);
                    r.durable();
                }
                Step::Close => {
                    if let Some(h) = f.take() {
                        o.close_file(&h);
                        r.durable();
                    }
                }
                Step::Sync => {
                    let report = run_sync(&o, &rsync(&t.share), SyncMode::Session).expect("sync");
                    proptest::prop_assert!(report.ok, "{:?}", report);
                    let on_share = std::fs::read(t.share.join(".db")).expect("share");
                    proptest::prop_assert!(on_share == r.now, "the share after a sync: {}", differ(&on_share, &r.now));
                    r.durable();
                }
                Step::Crash => {
                    let cut = tempfile::tempdir().expect("cut");
                    let to = cut.path().join("cache");
                    super::crash_tests::power_cut(&o, &to);
                    if let Some(h) = f.take() {
                        drop(h);
                    }
                    drop(o);
                    o = Overlay::new(&t.share, &to, Policy::default_policy()).expect("reopen");
                    o.set_by_block_from(16 * BLOCK);
                    let report = run_sync(&o, &rsync(&t.share), SyncMode::Recover).expect("recover");
                    proptest::prop_assert!(report.ok, "{:?}", report);
                    let got = std::fs::read(t.share.join(".db")).expect("share");
                    if let Err(e) = r.may_be(&got) {
                        return Err(proptest::test_runner::TestCaseError::fail(format!("after a power cut: {e}")));
                    }
                    r.now = got;
                    r.durable();
                    cuts.push(cut);
                    cache = to;
                }
            }
            let seen = view(&o);
            proptest::prop_assert!(seen == r.now, "the view after {:?}: {}", s, differ(&seen, &r.now));
        }
        let _ = cache;
    }
}

#[test]
fn a_truncating_open_of_a_file_held_by_block_leaves_nothing_of_the_base() {
    let t = held();
    let f = open_rw(&t);
    write(&t, &f, &[1; 10], 0);
    close(&t, f);
    let f =
        t.o.open_file(&ctx(), Path::new(".db"), libc::O_RDWR | libc::O_TRUNC)
            .expect("open");
    write(&t, &f, &[2; 10], 3 * BLOCK);
    let mut want = vec![0u8; 3 * BLOCK as usize];
    want.extend([2; 10]);
    assert_eq!(read_all(&t, &f), want, "zeros where the base was");
    close(&t, f);
    let r = sync(&t);
    assert!(r.ok && r.remaining_dirty == 0, "{r:?}");
    assert_eq!(std::fs::read(t.share.join(".db")).expect("share"), want);
}

#[test]
fn a_returning_users_kept_copy_holds_its_base_from_its_open_on() {
    let t = held();
    let f = open_rw(&t);
    write(&t, &f, &[1; BLOCK as usize], 0);
    close(&t, f);
    // The next login: the kept copy, still held by block.
    let (_tmp, share, _cache, o) = log_out_and_in(t);
    assert!(o.lock().state().partial(Path::new(".db")).is_some());
    let f = o
        .open_file(&ctx(), Path::new(".db"), libc::O_RDWR)
        .expect("open");
    {
        // A whole block: nothing of the base is read.
        let g = o
            .file_to_write(&ctx(), &f, || Some(PathBuf::from(".db")))
            .expect("w");
        o.write_at(&g, &[2; BLOCK as usize], 7 * BLOCK)
            .expect("write");
    }
    o.close_file(&f);
    drop(f);
    // Another workstation saves its version meanwhile.
    let theirs = vec![9u8; 100];
    save_elsewhere(&share, &theirs);
    let r = sync_of(&o, &share);
    assert_eq!(r.conflicts.len(), 1, "{r:?}");
    assert_eq!(r.conflicts[0].kind, super::ConflictKind::ModifiedOnBoth);
    let mut ours = base();
    ours[..BLOCK as usize].fill(1);
    ours[7 * BLOCK as usize..8 * BLOCK as usize].fill(2);
    assert_eq!(
        std::fs::read(share.join(&r.conflicts[0].kept)).expect("ours"),
        ours,
        "ours whole, from the base held since the open"
    );
}

/// A share with `.log` of `len` bytes (the pattern), held by block from 64 KiB on.
fn held_log(len: usize) -> (Fresh, Vec<u8>) {
    let t = fresh(&[]);
    let data: Vec<u8> = (0..len).map(|i| (i % 239) as u8).collect();
    std::fs::write(t.share.join(".log"), &data).expect("share file");
    t.o.set_by_block_from(16 * BLOCK);
    (t, data)
}

#[test]
fn an_append_to_a_file_held_by_block_lands_at_its_end() {
    let (t, mut want) = held_log(100_001);
    let f =
        t.o.open_file(&ctx(), Path::new(".log"), libc::O_WRONLY | libc::O_APPEND)
            .expect("open");
    {
        let g =
            t.o.file_to_write(&ctx(), &f, || Some(PathBuf::from(".log")))
                .expect("w");
        assert!(g.is_held_by_block());
        // The kernel gives an append its offset: the end of the file.
        t.o.write_at(&g, b"ls -la\n", 100_001).expect("append");
    }
    close(&t, f);
    want.extend(b"ls -la\n");
    let f =
        t.o.open_file(&ctx(), Path::new(".log"), libc::O_RDONLY)
            .expect("open");
    let g = f.current();
    let mut buf = vec![0u8; want.len() + 10];
    let n = t.o.read_at(&g, &mut buf, 0).expect("read");
    assert_eq!(
        &buf[..n],
        &want[..],
        "the last block copied where it belongs"
    );
    drop(g);
    drop(f);
    let r = sync(&t);
    assert!(r.ok && r.remaining_dirty == 0, "{r:?}");
    assert_eq!(std::fs::read(t.share.join(".log")).expect("share"), want);
}

#[test]
fn a_create_that_finds_the_file_reads_and_writes_it_through_its_blocks() {
    let (t, mut want) = held_log(200_000);
    let (_, file, writer) =
        t.o.create(
            &ctx(),
            Path::new(""),
            std::ffi::OsStr::new(".log"),
            0o644,
            libc::O_RDWR,
        )
        .expect("create finds it");
    let f =
        t.o.created_file(Path::new(".log"), file, writer)
            .expect("handle");
    {
        let g =
            t.o.file_to_write(&ctx(), &f, || Some(PathBuf::from(".log")))
                .expect("w");
        let mut head = [0u8; 16];
        t.o.read_at(&g, &mut head, 0).expect("read");
        assert_eq!(&head[..], &want[..16], "the share's bytes, not holes");
        t.o.write_at(&g, b"WORLD", 5000).expect("write");
    }
    close(&t, f);
    want[5000..5005].copy_from_slice(b"WORLD");
    let r = sync(&t);
    assert!(r.ok && r.remaining_dirty == 0, "{r:?}");
    assert_eq!(std::fs::read(t.share.join(".log")).expect("share"), want);
}

#[test]
fn a_file_grown_far_past_its_limit_is_sent_as_what_its_data_costs() {
    let t = held();
    let f = open_rw(&t);
    let far = 1u64 << 30;
    {
        let g =
            t.o.file_to_write(&ctx(), &f, || Some(PathBuf::from(".db")))
                .expect("w");
        t.o.write_at(&g, b"end", far).expect("write far");
    }
    close(&t, f);
    let r = sync(&t);
    assert!(r.ok && r.remaining_dirty == 0, "{r:?}");
    let m = std::fs::metadata(t.share.join(".db")).expect("share");
    assert_eq!(m.len(), far + 3);
    assert!(
        m.blocks() * 512 < 4 << 20,
        "holes stay holes on the share: {} bytes taken",
        m.blocks() * 512
    );
    let share = std::fs::File::open(t.share.join(".db")).expect("open");
    let mut tail = [0u8; 3];
    std::os::unix::fs::FileExt::read_exact_at(&share, &mut tail, far).expect("read");
    assert_eq!(&tail, b"end");
    let mut head = vec![0u8; LEN];
    std::os::unix::fs::FileExt::read_exact_at(&share, &mut head, 0).expect("read");
    assert_eq!(head, base());
}

#[test]
fn a_handle_of_a_file_set_aside_records_nothing_into_the_next_take_over() {
    let t = held();
    let old = open_rw(&t);
    write(&t, &old, &[1; BLOCK as usize], 0);
    {
        let g = old.current();
        t.o.sync_file(&g, true).expect("fsync");
    }
    // Another program writes the share's file in place: the sync sets ours aside.
    super::blocks_base_tests::write_there_in_place(&t.share, false);
    let r = sync(&t);
    assert_eq!(r.conflicts.len(), 1, "{r:?}");
    assert_eq!(r.conflicts[0].kind, super::ConflictKind::BlocksKeptHere);
    let theirs = std::fs::read(t.share.join(".db")).expect("share");
    // A new handle takes the share's file over afresh, by block.
    let new = open_rw(&t);
    write(&t, &new, &[2; BLOCK as usize], BLOCK);
    assert!(t.o.lock().state().partial(Path::new(".db")).is_some());
    // The old handle writes block 20 and closes: that was its file, not this one.
    {
        let g = old.current();
        t.o.write_at(&g, &[9; BLOCK as usize], 20 * BLOCK)
            .expect("write");
    }
    close(&t, old);
    close(&t, new);
    let part =
        t.o.lock()
            .state()
            .partial(Path::new(".db"))
            .cloned()
            .expect("held");
    assert!(
        !part.changed.contains(20),
        "block 20 of the old file is not the new one's: {:?}",
        part.changed
    );
    let r = sync(&t);
    assert!(r.ok && r.remaining_dirty == 0, "{r:?}");
    let mut want = theirs;
    want[BLOCK as usize..2 * BLOCK as usize].fill(2);
    assert_eq!(std::fs::read(t.share.join(".db")).expect("share"), want);
}

#[test]
fn a_kept_copy_is_looked_at_when_it_is_opened_and_let_go_of_when_the_share_changed() {
    let t = held();
    let f = open_rw(&t);
    write(&t, &f, &[1; BLOCK as usize], 0);
    close(&t, f);
    let (_tmp, share, _cache, o) = log_out_and_in(t);
    // Looked up (and found current) just before the share's file changes.
    o.set_revalidate_after(std::time::Duration::from_secs(3600));
    assert!(o.resolve(Path::new(".db")).is_ok());
    let theirs = vec![7u8; 5000];
    save_elsewhere(&share, &theirs);
    let f = o
        .open_file(&ctx(), Path::new(".db"), libc::O_RDONLY)
        .expect("open");
    let g = f.current();
    let mut buf = vec![0u8; 6000];
    let n = o.read_at(&g, &mut buf, 0).expect("read");
    assert_eq!(&buf[..n], &theirs[..], "the share's version, no read error");
}

/// A file unlinked while open, then cut and grown again through the handle, reads zeros
/// past the cut, as any file: not the base's bytes.
#[test]
fn a_file_unlinked_while_open_reads_zeros_past_a_cut_through_its_handle() {
    let t = held();
    let f = open_rw(&t);
    write(&t, &f, &[3; 4], 2 * BLOCK);
    t.o.unlink(Path::new(""), std::ffi::OsStr::new(".db"))
        .expect("unlink");
    {
        let g = t.o.file_to_write(&ctx(), &f, || None).expect("writable");
        for size in [BLOCK + 17, 20 * BLOCK] {
            let attr = SetAttr {
                size: Some(size),
                ..SetAttr::default()
            };
            t.o.setattr_handle(&ctx(), Path::new(".db"), attr, &g)
                .expect("cut or grow");
        }
    }
    let mut want = base();
    want.truncate(BLOCK as usize + 17);
    want.resize(20 * BLOCK as usize, 0);
    assert_eq!(read_all(&t, &f), want);
    close(&t, f);
}
