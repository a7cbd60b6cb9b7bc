//! The plain files a sync sends itself (`send_files.rs`) while programs and other
//! workstations change things between its steps, at chosen points.

use std::cell::RefCell;
use std::time::Duration;

use super::interleave_tests::{make_file, share_contents};
use super::test_support::{ctx, fresh, rsync, Fresh};
use super::*;
use crate::sync::{run_sync, SyncMode};

type Hook = Box<dyn FnMut(&Overlay)>;

thread_local! {
    static AFTER_OWN_COPY: RefCell<Option<Hook>> = const { RefCell::new(None) };
    static AFTER_OWN_PUTS: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

/// Called once the sync copied a plain file it sends itself into its holding directory,
/// before it checks the cache's file again: the test's write, if one is set (taken, so
/// it runs once).
pub(super) fn after_own_copy(o: &Overlay) {
    if let Some(mut between) = AFTER_OWN_COPY.with(|h| h.borrow_mut().take()) {
        between(o);
    }
}

/// Called once the sync renamed the plain files it sends itself into place, before it
/// settles: the test's change of the share, if one is set (taken, so it runs once).
pub(super) fn after_own_puts(o: &Overlay) {
    if let Some(mut between) = AFTER_OWN_PUTS.with(|h| h.borrow_mut().take()) {
        between(o);
    }
}

/// A plain file the sync sends itself, rewritten by a program (cut, then written shorter)
/// while the sync copies it: the copy is not put in place (the share keeps the old file
/// whole, never the copy padded with zeros to the old length), the file stays unsynced
/// work, and the next sync sends the new version.
#[test]
fn a_file_rewritten_while_the_sync_copies_it_is_not_put_in_place() {
    let Fresh { _tmp, share, o, .. } = fresh(&[(".rc", "old\n")]);
    let long = "export SAVED=1\n".repeat(40);
    make_file(&o, ".rc", libc::O_WRONLY | libc::O_TRUNC, long.as_bytes());
    AFTER_OWN_COPY.with(|h| {
        *h.borrow_mut() = Some(Box::new(|o: &Overlay| {
            make_file(
                o,
                ".rc",
                libc::O_WRONLY | libc::O_TRUNC,
                b"export SAVED=2\n",
            );
        }))
    });
    let r = run_sync(&o, &rsync(&share), SyncMode::Session).expect("sync");
    AFTER_OWN_COPY.with(|h| *h.borrow_mut() = None);
    assert_eq!(r.sent_directly, [PathBuf::from(".rc")], "{r:?}");
    assert_eq!(
        std::fs::read_to_string(share.join(".rc")).expect("share"),
        "old\n",
        "the share keeps its file: {r:?}"
    );
    assert_eq!(r.remaining_dirty, 1, "{r:?}");
    assert!(!r.ok, "{r:?}");
    let r = run_sync(&o, &rsync(&share), SyncMode::Session).expect("sync");
    assert!(r.ok, "{r:?}");
    assert_eq!(
        std::fs::read_to_string(share.join(".rc")).expect("share"),
        "export SAVED=2\n"
    );
}

/// Another workstation's save renamed over a file the sync just put in place, before the
/// sync settles, with an mtime of another second: the sync does not take it for its own
/// (it settles its own sends by what each rename put there), so our version stays
/// unsynced work, and the next sync keeps both.
#[test]
fn a_save_elsewhere_over_a_file_just_sent_is_not_taken_for_ours() {
    let Fresh { _tmp, share, o, .. } = fresh(&[(".a", "old\n")]);
    make_file(&o, ".a", libc::O_WRONLY | libc::O_TRUNC, b"ours\n");
    let there = share.clone();
    AFTER_OWN_PUTS.with(|h| {
        *h.borrow_mut() = Some(Box::new(move |_: &Overlay| {
            let tmp = there.join(".a.elsewhere");
            std::fs::write(&tmp, "theirs\n").expect("write");
            let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
            std::fs::File::options()
                .write(true)
                .open(&tmp)
                .and_then(|f| f.set_modified(an_hour_ago))
                .expect("mtime");
            std::fs::rename(&tmp, there.join(".a")).expect("rename");
        }))
    });
    let r = run_sync(&o, &rsync(&share), SyncMode::Session).expect("sync");
    AFTER_OWN_PUTS.with(|h| *h.borrow_mut() = None);
    assert_eq!(r.sent_directly, [PathBuf::from(".a")], "{r:?}");
    assert_eq!(r.remaining_dirty, 1, "ours is still to be sent: {r:?}");
    let r = run_sync(&o, &rsync(&share), SyncMode::Session).expect("sync");
    assert_eq!(r.conflicts.len(), 1, "{r:?}");
    assert_eq!(
        std::fs::read_to_string(share.join(".a")).expect("share"),
        "theirs\n"
    );
    let ours: Vec<String> = share_contents(&share)
        .into_iter()
        .filter(|c| c.contains("ours"))
        .collect();
    assert_eq!(
        ours.len(),
        1,
        "ours in a conflict copy: {:?}",
        share_contents(&share)
    );
}

/// An rsync that fails having sent nothing (exit 23, no file named) leaves the plain files
/// the sync sent itself settled by what their own sends put there. A file whose copy
/// failed (the program rewrote it meanwhile) while another workstation saved it on the
/// share is not taken for ours by its mtime (which falls between the hand-over and our
/// new version's): the next sync keeps both. (Settled by size and mtime, as when rsync's
/// failure decided for every file, theirs became the base and our next sync wrote over
/// it.)
#[test]
fn a_failed_rsync_leaves_the_plain_files_settled_by_their_own_sends() {
    let Fresh { _tmp, share, o, .. } = fresh(&[(".a", "old\n")]);
    make_file(&o, ".a", libc::O_WRONLY | libc::O_TRUNC, b"ours, first\n");
    // A directory made here: rsync's part.
    o.mkdir(&ctx(), Path::new(""), OsStr::new(".d"), 0o755)
        .expect("mkdir");
    let failing = _tmp.path().join("rsync-fails");
    std::fs::write(&failing, "#!/bin/sh\ncat > /dev/null\nexit 23\n").expect("script");
    std::fs::set_permissions(
        &failing,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let mut opts = rsync(&share);
    opts.binary = failing;
    let there = share.clone();
    AFTER_OWN_COPY.with(|h| {
        *h.borrow_mut() = Some(Box::new(move |o: &Overlay| {
            let tmp = there.join(".a.elsewhere");
            std::fs::write(&tmp, "theirs\n").expect("write");
            std::fs::rename(&tmp, there.join(".a")).expect("rename");
            make_file(o, ".a", libc::O_WRONLY | libc::O_TRUNC, b"ours, second\n");
        }))
    });
    let r = run_sync(&o, &opts, SyncMode::Session).expect("sync");
    AFTER_OWN_COPY.with(|h| *h.borrow_mut() = None);
    assert!(!r.ok, "{r:?}");
    let r = run_sync(&o, &rsync(&share), SyncMode::Session).expect("sync");
    assert_eq!(
        std::fs::read_to_string(share.join(".a")).expect("share"),
        "theirs\n",
        "their save stays: {r:?}"
    );
    let ours: Vec<String> = share_contents(&share)
        .into_iter()
        .filter(|c| c.starts_with("ours"))
        .collect();
    assert_eq!(ours, ["ours, second\n"], "ours in a conflict copy: {r:?}");
}
