//! A file that is mostly holes costs the sync what its data costs: `truncate -s 15T
//! ~/.big` (rsync would read 15 TiB of holes) reaches the share at logout and through
//! `ccfs recover` after a crash as a file of the same length, holes kept, data in place.

use e2e::*;
use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::Command;

const LEN: u64 = 15 << 40;

/// Makes `p` a 15 TiB file of holes with a few bytes of data at its start and end.
fn make_big(p: &Path) {
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(p)
        .expect("create");
    f.set_len(LEN).expect("15 TiB");
    f.write_all_at(b"head", 0).expect("head");
    f.write_all_at(b"tail", LEN - 4).expect("tail");
}

/// The share's copy has the length, the data and the holes.
fn check_big(p: &Path) {
    let m = fs::metadata(p).expect("sent");
    assert_eq!(m.len(), LEN);
    assert!(
        m.blocks() * 512 < 64 << 20,
        "the share's copy is not sparse: {} blocks",
        m.blocks()
    );
    let f = fs::File::open(p).expect("open");
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b, 0).expect("head");
    assert_eq!(&b, b"head");
    f.read_exact_at(&mut b, LEN - 4).expect("tail");
    assert_eq!(&b, b"tail");
    f.read_exact_at(&mut b, LEN / 2).expect("middle");
    assert_eq!(&b, &[0; 4]);
}

/// `ccfs umount` with a bound (a guard against a hang, not a speed target).
fn umount_bounded(fx: &Fixture) {
    let out = run_bounded(Command::new(ccfs_bin()).arg("umount").arg(&fx.mnt))
        .expect("the logout ended within a minute");
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn a_15_tib_file_of_holes_reaches_the_share_at_logout() {
    let fx = Fixture::new();
    let m = fx.mount();
    make_big(&fx.m(".big"));
    umount_bounded(&fx);
    m.forget();
    check_big(&fx.s(".big"));
}

#[test]
fn a_15_tib_file_of_holes_reaches_the_share_through_a_recovery() {
    let fx = Fixture::new();
    let m = fx.mount();
    make_big(&fx.m(".big"));
    m.crash();
    let out = run_bounded(
        Command::new(ccfs_bin())
            .arg("recover")
            .arg("--cache-dir")
            .arg(&fx.cache),
    )
    .expect("the recovery ended within a minute");
    assert!(out.status.success(), "{}", text(&out));
    check_big(&fx.s(".big"));
}
