//! The premise of running the mount tests on scripts/ext4-share's journaled ext4: that
//! filesystem gives a deleted file's inode number to the next file it makes. A FUSE node
//! bound to a share inode number the share has freed and handed on only shows there; on a
//! filesystem that does not reuse numbers soon (tmpfs counts up) the tests meant to catch it
//! pass without trying anything.
//!
//! Runs when $CCFS_TEST_SHARE_ROOT is on ext4 (scripts/test sets it to the mount point
//! `scripts/ext4-share up` prints); elsewhere it says why it is skipped.

use std::fs;
use std::os::unix::fs::MetadataExt;

/// Delete-then-create rounds; any one of them reusing the number proves the premise (a
/// test running at the same time may take the freed number first now and then).
const TRIES: usize = 50;

#[test]
fn the_ext4_share_gives_a_freed_inode_number_to_the_next_new_file() {
    let Some(root) = e2e::share_root() else {
        e2e::skip(
            "CCFS_TEST_SHARE_ROOT is not set (scripts/test sets it to scripts/ext4-share's mount)",
        );
        return;
    };
    let canonical = root
        .canonicalize()
        .unwrap_or_else(|e| panic!("CCFS_TEST_SHARE_ROOT {}: {e}", root.display()));
    let fs_type = fsinfo::mount_of(&canonical)
        .expect("mount table")
        .map(|m| m.fs_type)
        .unwrap_or_default();
    if fs_type != "ext4" {
        e2e::skip(&format!(
            "CCFS_TEST_SHARE_ROOT {} is {fs_type}, not ext4",
            root.display()
        ));
        return;
    }
    let dir = e2e::share_dir();
    let sync_dir = || {
        fs::File::open(dir.path())
            .and_then(|d| d.sync_all())
            .expect("fsync the directory")
    };
    let mut reused = 0;
    let mut seen = Vec::new();
    for i in 0..TRIES {
        let old = dir.path().join(format!("old-{i}"));
        fs::write(&old, "deleted next").expect("create");
        let freed = fs::metadata(&old).expect("stat").ino();
        fs::remove_file(&old).expect("unlink");
        sync_dir();
        let new = dir.path().join(format!("new-{i}"));
        fs::write(&new, "made right after").expect("create");
        let got = fs::metadata(&new).expect("stat").ino();
        if got == freed {
            reused += 1;
        }
        seen.push((freed, got));
        fs::remove_file(&new).expect("unlink");
        sync_dir();
    }
    assert!(
        reused > 0,
        "the share at {} never gave a deleted file's inode number to the next new file \
         in {TRIES} tries (freed, then given: {:?} ...): the mount tests run on it cannot \
         catch a node bound to a reused inode number. Use the journaled ext4 of \
         scripts/ext4-share up.",
        root.display(),
        &seen[..5]
    );
}
