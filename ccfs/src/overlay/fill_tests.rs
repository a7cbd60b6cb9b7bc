//! Files held by block made complete in the background (`fill.rs`).

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use super::blocks_base_tests::write_there_in_place;
use super::blocks_tests::{base, close, held, open_rw, sync, write};
use super::test_support::ctx;
use super::*;
use crate::extents::BLOCK;

fn complete(t: &super::test_support::Fresh) -> bool {
    let inner = t.o.lock();
    inner
        .state
        .partial(Path::new(".db"))
        .is_some_and(|p| p.is_complete())
}

#[test]
fn a_changed_file_gets_its_missing_blocks_and_a_write_in_place_after_is_an_ordinary_conflict() {
    let t = held();
    let f = open_rw(&t);
    write(&t, &f, &[9; BLOCK as usize], 3 * BLOCK);
    close(&t, f);
    assert!(!complete(&t), "the take-over copied nothing");
    let mtime = || {
        let m = std::fs::metadata(t.cache.join("upper/.db")).expect("cache file");
        (m.mtime(), m.mtime_nsec())
    };
    let before = mtime();
    // Not before the daemon has served it that long.
    assert_eq!(t.o.fill_blocks(u64::MAX, Duration::from_secs(3600)), 0);
    // At most the budget a call, then every block.
    assert_eq!(t.o.fill_blocks(5, Duration::ZERO), 5);
    assert!(!complete(&t));
    let blocks = base().len() as u64 / BLOCK;
    assert_eq!(t.o.fill_blocks(u64::MAX, Duration::ZERO), blocks - 6);
    assert!(complete(&t), "every block is on record");
    assert_eq!(
        mtime(),
        before,
        "the blocks copied in are no change of the file"
    );
    assert_eq!(t.o.fill_blocks(u64::MAX, Duration::ZERO), 0);
    let mut ours = base();
    ours[3 * BLOCK as usize..4 * BLOCK as usize].fill(9);
    assert_eq!(t.o.view_bytes(Path::new(".db")).expect("view"), ours);
    // Another program writes the share's file in place: ours needs its base no more, so
    // both versions reach the share whole.
    write_there_in_place(&t.share, false);
    let r = sync(&t);
    assert!(r.ok, "{r:?}");
    assert_eq!(r.conflicts.len(), 1, "{r:?}");
    assert_eq!(r.conflicts[0].kind, super::ConflictKind::ModifiedOnBoth);
    let copy = t.share.join(&r.conflicts[0].kept);
    assert_eq!(std::fs::read(copy).expect("our copy"), ours);
    let theirs = std::fs::read(t.share.join(".db")).expect("share");
    assert_eq!(
        &theirs[9 * BLOCK as usize..9 * BLOCK as usize + 6],
        b"theirs"
    );
}

#[test]
fn a_file_only_read_gets_no_blocks_from_the_share() {
    let t = held();
    // A write takes it over by block; a sync sends it: clean.
    let f = open_rw(&t);
    write(&t, &f, &[9; BLOCK as usize], 0);
    close(&t, f);
    let r = sync(&t);
    assert!(r.ok && r.remaining_dirty == 0, "{r:?}");
    let g =
        t.o.open_file(&ctx(), Path::new(".db"), libc::O_RDONLY)
            .expect("open");
    assert_eq!(t.o.fill_blocks(u64::MAX, Duration::ZERO), 0);
    close(&t, g);
    assert!(!complete(&t));
}

#[test]
fn a_change_of_attributes_alone_gets_no_blocks_from_the_share() {
    let t = held();
    let attr = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    t.o.setattr(&ctx(), Path::new(".db"), attr, None)
        .expect("chmod");
    assert!(t.o.lock().state.is_dirty(Path::new(".db")));
    let f = open_rw(&t);
    assert_eq!(t.o.fill_blocks(u64::MAX, Duration::ZERO), 0);
    close(&t, f);
    assert!(!complete(&t));
}

/// A sparse file's holes are on record once filled, not written: the cache file takes the
/// room of the share's data, not of its length.
#[test]
fn holes_of_the_base_take_no_room_in_the_cache() {
    let t = super::test_support::fresh(&[]);
    let len = 256 * BLOCK;
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(t.share.join(".db")).expect("share file");
        f.set_len(len).expect("sparse");
        f.write_all_at(&[5; BLOCK as usize], 100 * BLOCK)
            .expect("data");
    }
    t.o.set_by_block_from(16 * BLOCK);
    let f = open_rw(&t);
    write(&t, &f, &[9; BLOCK as usize], 0);
    close(&t, f);
    let f = open_rw(&t);
    assert_eq!(t.o.fill_blocks(u64::MAX, Duration::ZERO), 255);
    close(&t, f);
    assert!(complete(&t));
    let cached = std::fs::metadata(t.cache.join("upper/.db")).expect("cache file");
    assert!(
        cached.blocks() * 512 <= 4 * BLOCK,
        "two blocks of data, not {} bytes",
        cached.blocks() * 512
    );
    let mut want = vec![0u8; len as usize];
    want[..BLOCK as usize].fill(9);
    want[100 * BLOCK as usize..101 * BLOCK as usize].fill(5);
    assert_eq!(t.o.view_bytes(Path::new(".db")).expect("view"), want);
}
