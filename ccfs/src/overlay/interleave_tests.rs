//! Changes of the same mount that come in between the steps of another, at chosen points.

use std::cell::RefCell;

use super::test_support::{ctx, rsync};
use super::*;
use crate::sync::{run_sync, SyncMode};

type Hook = Box<dyn FnMut(&Overlay)>;

thread_local! {
    static AFTER_LOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

/// Called once a change asked the share without the overlay's lock, before it takes the
/// lock: the test's change in between, if one is set (taken, so it runs once).
pub(super) fn after_share_look(o: &Overlay) {
    if let Some(mut between) = AFTER_LOOK.with(|h| h.borrow_mut().take()) {
        between(o);
    }
}

/// A create asks the share whether the name is free before it takes the lock. A sync that
/// runs in between and deletes the share's file there (the user deleted the name, and a
/// name not hidden any longer is what the create then sees) must not leave the create
/// with the share's old answer: the name is free, the create succeeds and its file is
/// sent, no conflict.
#[test]
fn a_sync_between_a_creates_share_look_and_its_lock_does_not_make_the_look_stand() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (share, cache) = (tmp.path().join("share"), tmp.path().join("cache"));
    std::fs::create_dir_all(&share).expect("share");
    std::fs::create_dir_all(&cache).expect("cache");
    std::fs::write(share.join(".x"), "the share's\n").expect("share file");
    let o = Overlay::new(&share, &cache, Policy::default_policy()).expect("overlay");
    let root = Path::new("");
    let opts = rsync(&share);
    {
        let opts = opts.clone();
        AFTER_LOOK.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |o: &Overlay| {
                // In between: the user deletes .x, and a sync applies the deletion.
                o.unlink(root, OsStr::new(".x")).expect("unlink");
                let r = run_sync(o, &opts, SyncMode::Session).expect("sync");
                assert!(r.ok && r.deleted == 1, "{r:?}");
            }))
        });
    }
    let made = o.create(&ctx(), root, OsStr::new(".x"), 0o644, libc::O_WRONLY);
    AFTER_LOOK.with(|h| *h.borrow_mut() = None);
    let (_, mut f, _) = made.expect("the name is free once the sync deleted the share's file");
    std::io::Write::write_all(&mut f, b"new\n").expect("write");
    drop(f);
    let r = run_sync(&o, &opts, SyncMode::Logout).expect("logout");
    assert!(r.ok && r.conflicts.is_empty(), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(share.join(".x")).expect("on the share"),
        "new\n"
    );
}
