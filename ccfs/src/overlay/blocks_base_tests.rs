//! Files held by block whose base the share no longer has as it was: written in place
//! (also with the mtime put back), gone while the daemon was down, a share that does not
//! answer at the sync.

use std::os::unix::fs::MetadataExt;

use super::blocks_tests::{base, close, held, open_rw, reopen, save_elsewhere, sync, write};
use super::test_support::{ctx, fresh, rsync, Fresh};
use super::*;
use crate::extents::BLOCK;
use crate::sync::{run_sync, SyncMode};

#[test]
fn a_file_whose_base_went_while_the_daemon_was_down_is_kept_aside_in_the_cache() {
    let t = held();
    let f = open_rw(&t);
    write(&t, &f, &[3; BLOCK as usize], 5 * BLOCK);
    {
        let g = f.current();
        t.o.sync_file(&g, true).expect("fsync");
    }
    // The daemon dies (nothing it held stays open); another workstation saves the file.
    drop(f);
    let Fresh {
        _tmp,
        share,
        cache,
        o,
    } = t;
    drop(o);
    let theirs = vec![0x55u8; 3000];
    save_elsewhere(&share, &theirs);
    let o = Overlay::new(&share, &cache, Policy::default_policy()).expect("reopen");
    let report = run_sync(&o, &rsync(&share), SyncMode::Recover).expect("recover");
    // Ours did not reach the share: the recovery says so.
    assert!(!report.ok, "{report:?}");
    assert_eq!(report.conflicts.len(), 1, "{report:?}");
    let c = &report.conflicts[0];
    assert_eq!(c.kind, super::ConflictKind::BlocksKeptHere);
    assert_eq!(std::fs::read(share.join(".db")).expect("share"), theirs);
    // Ours, as its blocks, with their list, out of the view.
    let kept = cache.join(&c.kept);
    let data = std::fs::read(&kept).expect("kept");
    assert_eq!(
        &data[5 * BLOCK as usize..6 * BLOCK as usize],
        &[3; BLOCK as usize][..]
    );
    let dir = Path::new(&c.kept).strip_prefix("kept").expect("in kept/");
    let mut parts = dir.components();
    let first = parts
        .next()
        .expect("HOST-STAMP")
        .as_os_str()
        .to_string_lossy();
    let list_at = cache
        .join("kept")
        .join(format!("{first}.blocks"))
        .join(parts.as_path());
    let list = std::fs::read_to_string(list_at).expect("list");
    assert!(list.contains("written here 5-6"), "{list}");
    let f = o
        .open_file(&ctx(), Path::new(".db"), libc::O_RDONLY)
        .expect("open");
    let g = f.current();
    let mut buf = vec![0u8; 4000];
    let n = o.read_at(&g, &mut buf, 0).expect("read");
    assert_eq!(&buf[..n], &theirs[..], "the share's version shows");
}

#[test]
fn a_write_in_place_on_the_share_is_never_read_as_the_base() {
    // Also one that puts the mtime back (`rsync --inplace -t`, `touch -r`): only the
    // ctime tells.
    for mtime_put_back in [false, true] {
        in_place_on_the_share(mtime_put_back);
    }
}

/// Another program writes `theirs` into block 9 of the share's `.db` in place (the same
/// inode), putting its mtime back if asked (`rsync --inplace -t`, `touch -r`).
pub(super) fn write_there_in_place(share: &Path, mtime_put_back: bool) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(share.join(".db"))
        .expect("share");
    let was = f.metadata().expect("stat").modified().expect("mtime");
    f.write_all_at(b"theirs", 9 * BLOCK).expect("write");
    if mtime_put_back {
        f.set_modified(was).expect("mtime back");
    }
}

fn in_place_on_the_share(mtime_put_back: bool) {
    let t = held();
    let f = open_rw(&t);
    write(&t, &f, &[6; BLOCK as usize], 0);
    // Another program writes the share's file in place (same inode).
    write_there_in_place(&t.share, mtime_put_back);
    let g =
        t.o.file_to_read(&ctx(), &f, || Some(PathBuf::from(".db")))
            .expect("readable");
    let mut buf = vec![0u8; BLOCK as usize];
    let err =
        t.o.read_at(&g, &mut buf, 9 * BLOCK)
            .expect_err("not the base any more");
    assert!(err.to_string().contains("written in place"), "{err}");
    // What the cache has still reads.
    assert_eq!(t.o.read_at(&g, &mut buf, 0).expect("read"), BLOCK as usize);
    assert_eq!(buf, vec![6; BLOCK as usize]);
    drop(g);
    close(&t, f);
    // The sync cannot make ours whole: it is kept in the cache, and the share's shows;
    // ours did not reach the share, and the sync says so.
    let r = sync(&t);
    assert!(!r.ok, "{r:?}");
    assert_eq!(r.conflicts.len(), 1, "{r:?}");
    assert_eq!(r.conflicts[0].kind, super::ConflictKind::BlocksKeptHere);
    let on_share = std::fs::read(t.share.join(".db")).expect("share");
    assert_eq!(
        &on_share[9 * BLOCK as usize..9 * BLOCK as usize + 6],
        b"theirs"
    );
}

#[test]
fn a_share_that_does_not_answer_at_a_sync_keeps_a_file_held_by_block_as_it_is() {
    // A chmod takes `.d/db` over by block (no block written), then the daemon dies.
    let t = fresh(&[]);
    std::fs::create_dir(t.share.join(".d")).expect("dir");
    std::fs::write(t.share.join(".d/db"), base()).expect("share file");
    t.o.set_by_block_from(16 * BLOCK);
    let db = Path::new(".d/db");
    let set = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    t.o.setattr(&ctx(), db, set, None).expect("chmod");
    // The share's directory is away while the cache is opened again (the base cannot be
    // held open), then back: the file itself is as it was, still the base.
    let (_tmp, share, _cache, o) = reopen(t, |share| {
        std::fs::rename(share.join(".d"), share.join("away")).expect("away")
    });
    std::fs::rename(share.join("away"), share.join(".d")).expect("back");
    // The share stops answering: the sync can tell nothing of the file.
    o.share_gate().set_closed(true);
    let r = run_sync(&o, &rsync(&share), SyncMode::Session).expect("sync");
    assert!(
        r.conflicts.is_empty(),
        "no conflict from a share that does not answer: {r:?}"
    );
    assert_eq!(r.remaining_dirty, 1, "{r:?}");
    assert!(o.lock().state().partial(db).is_some());
    // Back: sent as it is, the share's bytes with our mode.
    o.share_gate().set_closed(false);
    let r = run_sync(&o, &rsync(&share), SyncMode::Session).expect("sync");
    assert!(
        r.ok && r.conflicts.is_empty() && r.remaining_dirty == 0,
        "{r:?}"
    );
    let m = std::fs::metadata(share.join(".d/db")).expect("share");
    assert_eq!(m.mode() & 0o777, 0o600);
    assert_eq!(std::fs::read(share.join(".d/db")).expect("share"), base());
}

#[test]
fn a_base_written_in_place_then_replaced_by_a_save_elsewhere_stays_unreadable() {
    let t = held();
    let f = open_rw(&t);
    write(&t, &f, &[6; BLOCK as usize], 0);
    // Another program writes the share's file in place and puts its mtime back ...
    write_there_in_place(&t.share, true);
    let g =
        t.o.file_to_read(&ctx(), &f, || Some(PathBuf::from(".db")))
            .expect("readable");
    let mut buf = vec![0u8; BLOCK as usize];
    t.o.read_at(&g, &mut buf, 9 * BLOCK)
        .expect_err("written in place");
    // ... then another workstation saves (a file renamed over it): the file held open has
    // no name now, but its bytes are still not the base's.
    save_elsewhere(&t.share, &[1u8; 100]);
    t.o.read_at(&g, &mut buf, 9 * BLOCK)
        .expect_err("still not the base");
    drop(g);
    close(&t, f);
    let r = sync(&t);
    assert_eq!(r.conflicts.len(), 1, "{r:?}");
    assert_eq!(r.conflicts[0].kind, super::ConflictKind::BlocksKeptHere);
    assert_eq!(
        std::fs::read(t.share.join(".db")).expect("share"),
        vec![1u8; 100]
    );
}
