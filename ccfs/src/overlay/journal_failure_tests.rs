//! A journal whose `fdatasync` fails: the change that waited for it fails and changes
//! nothing, the journal is rewritten whole, and what each change answered holds after a
//! crash.

use std::time::Duration;

use super::interleave_tests::{view_of, write_over, AT_DURABLE};
use super::test_support::{ctx, fresh, rsync, Fresh};
use super::*;
use crate::sync::{run_sync, SyncMode};

/// After a failed fdatasync of the journal, the next change rewrites the journal whole
/// and goes on: also one that writes no record (an open for writing of a file already
/// marked changed), which otherwise failed until another change wrote one.
#[test]
fn after_a_failed_journal_fdatasync_an_open_of_a_changed_file_rewrites_it_and_succeeds() {
    let Fresh {
        _tmp,
        share,
        cache,
        o,
    } = fresh(&[]);
    let (_, f, writer) = o
        .create(
            &ctx(),
            Path::new(""),
            OsStr::new(".x"),
            0o644,
            libc::O_WRONLY,
        )
        .expect("create");
    drop(f);
    if let Some(ino) = writer {
        o.release_writer(ino);
    }
    // A record written and not yet durable (another change's, waiting for its fdatasync),
    // which then fails.
    let pending = o
        .lock()
        .journal
        .write(&[Record::Dirty(PathBuf::from(".x"))])
        .expect("write");
    o.durability.fail_for_test(libc::EIO);
    assert!(o.durability.wait(pending).is_err());
    let (f, writer) = o
        .open(&ctx(), Path::new(".x"), libc::O_WRONLY)
        .expect("the open rewrites the journal and succeeds");
    drop(f);
    if let Some(ino) = writer {
        o.release_writer(ino);
    }
    assert!(!o.lock().journal.needs_rewrite());
    drop(o);
    let reopened = Overlay::new(&share, &cache, Policy::default_policy()).expect("reopen");
    assert!(reopened.lock().state.is_dirty(Path::new(".x")));
}

/// Runs `change` with the journal's next `fdatasync` failing (EIO) on this thread.
fn with_failing_fdatasync<T>(change: impl FnOnce() -> T) -> T {
    AT_DURABLE.with(|h| {
        *h.borrow_mut() = Some(Box::new(|o: &Overlay| {
            o.durability.fail_for_test(libc::EIO);
        }))
    });
    let out = change();
    AT_DURABLE.with(|h| *h.borrow_mut() = None);
    out
}

/// A share file edited here, then an unlink whose write-ahead record cannot be made
/// durable (the journal's fdatasync fails): the unlink fails and changes nothing. The
/// file keeps the edit in the view, at logout on the share, and at the next login; and
/// after a crash (another change rewrote the journal meanwhile) the recovery sends it.
#[test]
fn an_unlink_whose_record_fails_to_reach_the_disk_changes_nothing() {
    for crash in [false, true] {
        let Fresh {
            _tmp,
            share,
            cache,
            o,
        } = fresh(&[(".x", "old\n")]);
        let root = Path::new("");
        let (mut f, writer) = o
            .open(&ctx(), Path::new(".x"), libc::O_WRONLY | libc::O_TRUNC)
            .expect("open");
        std::io::Write::write_all(&mut f, b"edit\n").expect("write");
        drop(f);
        if let Some(ino) = writer {
            o.release_writer(ino);
        }
        let r = with_failing_fdatasync(|| o.unlink(root, OsStr::new(".x")));
        assert!(r.is_err(), "crash {crash}: the unlink fails");
        assert_eq!(view_of(&o, ".x").as_deref(), Some(&b"edit\n"[..]));
        {
            let inner = o.lock();
            assert!(!inner.state.is_whiteout(Path::new(".x")), "crash {crash}");
            assert!(inner.state.is_dirty(Path::new(".x")), "crash {crash}");
        }
        let mode = if crash {
            // A later change rewrites the journal; then the daemon dies.
            let (_, f, w) = o
                .create(&ctx(), root, OsStr::new(".other"), 0o644, libc::O_WRONLY)
                .expect("a create after the failure");
            drop(f);
            if let Some(ino) = w {
                o.release_writer(ino);
            }
            drop(o);
            SyncMode::Recover
        } else {
            let r = run_sync(&o, &rsync(&share), SyncMode::Logout).expect("logout");
            assert!(r.ok && r.deleted == 0, "{r:?}");
            drop(o);
            SyncMode::Logout
        };
        let o = Overlay::new(&share, &cache, Policy::default_policy()).expect("reopen");
        assert_eq!(
            view_of(&o, ".x").as_deref(),
            Some(&b"edit\n"[..]),
            "{mode:?}"
        );
        let r = run_sync(&o, &rsync(&share), mode).expect("sync");
        assert!(r.ok, "{r:?}");
        assert_eq!(
            std::fs::read(share.join(".x")).expect("on the share"),
            b"edit\n"
        );
    }
}

/// A save by rename and a copy-up whose write-ahead records cannot be made durable fail
/// and change nothing: the names show what they showed, and the logout sends that.
#[test]
fn a_rename_or_copy_up_whose_records_fail_to_reach_the_disk_changes_nothing() {
    let Fresh { _tmp, share, o, .. } = fresh(&[(".s", "saved\n"), (".k", "kept\n")]);
    let root = Path::new("");
    let (_, mut f, w) = o
        .create(&ctx(), root, OsStr::new(".t"), 0o644, libc::O_WRONLY)
        .expect("create");
    std::io::Write::write_all(&mut f, b"new\n").expect("write");
    drop(f);
    if let Some(ino) = w {
        o.release_writer(ino);
    }
    let r = with_failing_fdatasync(|| {
        o.rename(&ctx(), root, OsStr::new(".t"), root, OsStr::new(".s"), 0)
    });
    assert!(r.is_err(), "the rename fails");
    assert_eq!(view_of(&o, ".t").as_deref(), Some(&b"new\n"[..]));
    assert_eq!(view_of(&o, ".s").as_deref(), Some(&b"saved\n"[..]));
    let r = with_failing_fdatasync(|| o.open(&ctx(), Path::new(".k"), libc::O_WRONLY));
    assert!(r.is_err(), "the open that copies up fails");
    {
        let inner = o.lock();
        assert!(!inner.state.taken_over(Path::new(".s")));
        assert!(!inner.state.is_dirty(Path::new(".k")));
        assert!(!inner.state.taken_over(Path::new(".k")));
    }
    assert!(o.upper_stat(Path::new(".k")).expect("stat").is_none());
    let r = run_sync(&o, &rsync(&share), SyncMode::Logout).expect("logout");
    assert!(r.ok && r.conflicts.is_empty(), "{r:?}");
    for (name, data) in [(".t", "new\n"), (".s", "saved\n"), (".k", "kept\n")] {
        assert_eq!(
            std::fs::read_to_string(share.join(name)).expect("on the share"),
            data
        );
    }
}

/// Two unlinks of share files edited here wait for one `fdatasync`, which fails. Whatever
/// each answered holds after a crash: a file whose unlink failed keeps its edit, in the
/// view and on the share after the recovery; one whose unlink succeeded stays deleted.
/// (The journal is rewritten after the failure; a change whose records that rewrite
/// wrote goes on, one whose records it left out fails.)
#[test]
fn two_changes_that_share_a_failed_fdatasync_each_hold_what_they_answered() {
    let Fresh {
        _tmp,
        share,
        cache,
        o,
    } = fresh(&[(".x", "old x\n"), (".y", "old y\n")]);
    let root = Path::new("");
    write_over(&o, ".x", b"edit x\n");
    write_over(&o, ".y", b"edit y\n");
    let (reached_tx, reached) = std::sync::mpsc::channel::<()>();
    let (go_x, go_x_rx) = std::sync::mpsc::channel::<()>();
    let (go_y, go_y_rx) = std::sync::mpsc::channel::<()>();
    let answers = std::thread::scope(|s| {
        let o = &o;
        let unlink = |name: &'static str, go: std::sync::mpsc::Receiver<()>| {
            let reached = reached_tx.clone();
            s.spawn(move || {
                AT_DURABLE.with(|h| {
                    *h.borrow_mut() = Some(Box::new(move |_: &Overlay| {
                        reached.send(()).expect("reached");
                        go.recv().expect("go");
                    }))
                });
                o.unlink(root, OsStr::new(name)).is_ok()
            })
        };
        let x = unlink(".x", go_x_rx);
        let y = unlink(".y", go_y_rx);
        reached.recv().expect("x or y");
        reached.recv().expect("y or x");
        // The fdatasync that serves both fails; both see it before either goes on.
        let held = o.lock_any();
        o.durability.fail_for_test(libc::EIO);
        go_x.send(()).expect("go x");
        go_y.send(()).expect("go y");
        std::thread::sleep(Duration::from_millis(200));
        drop(held);
        [
            (".x", x.join().expect("x"), "edit x\n"),
            (".y", y.join().expect("y"), "edit y\n"),
        ]
    });
    drop(o); // the daemon dies
    let o = Overlay::new(&share, &cache, Policy::default_policy()).expect("reopen");
    let seen: Vec<Option<Vec<u8>>> = answers.iter().map(|(n, _, _)| view_of(&o, n)).collect();
    let r = run_sync(&o, &rsync(&share), SyncMode::Recover).expect("recover");
    assert!(r.ok, "{r:?}");
    for ((name, removed, edit), seen) in answers.iter().zip(seen) {
        let on_share = std::fs::read_to_string(share.join(name)).ok();
        if *removed {
            assert_eq!((seen, on_share), (None, None), "{name} was removed");
        } else {
            assert_eq!(
                seen.as_deref(),
                Some(edit.as_bytes()),
                "{name}: its unlink failed"
            );
            assert_eq!(
                on_share.as_deref(),
                Some(*edit),
                "{name}: its unlink failed"
            );
        }
    }
}
