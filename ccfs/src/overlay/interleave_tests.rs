//! Changes of the same mount that come in between the steps of another, at chosen points.

use std::cell::RefCell;
use std::time::Duration;

use super::test_support::{ctx, fresh, rsync, Fresh};
use super::*;
use crate::sync::{run_sync, SyncMode};

type Hook = Box<dyn FnMut(&Overlay)>;

thread_local! {
    static AFTER_LOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
    static AFTER_SYNC_LOOKS: RefCell<Option<Hook>> = const { RefCell::new(None) };
    pub(super) static AT_DURABLE: RefCell<Option<Hook>> = const { RefCell::new(None) };
    static AFTER_CONFLICT_MOVE: RefCell<Option<Hook>> = const { RefCell::new(None) };
    static AFTER_UNCHANGED_STAMP: RefCell<Option<Hook>> = const { RefCell::new(None) };
    static AFTER_BLOCK_SNAPSHOT: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

/// Called once a sync copied a file held by block that is open for writing, before it
/// looks at the blocks written again (the overlay's lock held): the test's write, if one
/// is set (taken, so it runs once).
pub(super) fn after_block_snapshot(o: &Overlay) {
    if let Some(mut between) = AFTER_BLOCK_SNAPSHOT.with(|h| h.borrow_mut().take()) {
        between(o);
    }
}

/// Called once a sync that found a changed file's bytes on the share stamped the share's
/// file with its mtime, before it looks again: the test's change of the share's file, if
/// one is set (taken, so it runs once).
pub(super) fn after_unchanged_stamp(o: &Overlay) {
    if let Some(mut between) = AFTER_UNCHANGED_STAMP.with(|h| h.borrow_mut().take()) {
        between(o);
    }
}

/// Called once a sync moved our version of a conflict to its conflict name in the cache,
/// before its last records: the test's power cut, if one is set (taken, so it runs once).
pub(super) fn after_conflict_move(o: &Overlay) {
    if let Some(mut cut) = AFTER_CONFLICT_MOVE.with(|h| h.borrow_mut().take()) {
        cut(o);
    }
}

/// Called where a change waits for its journal records, without the overlay's lock: the
/// test's wait there, if one is set (taken, so it runs once).
pub(super) fn at_durable(o: &Overlay) {
    if let Some(mut waiting) = AT_DURABLE.with(|h| h.borrow_mut().take()) {
        waiting(o);
    }
}

/// Called once a sync looked at the files it hands over (the overlay's lock held: the
/// test's change must not take it), if a change is set (taken, so it runs once).
pub(super) fn after_sync_looks(o: &Overlay) {
    if let Some(mut between) = AFTER_SYNC_LOOKS.with(|h| h.borrow_mut().take()) {
        between(o);
    }
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
    let Fresh { _tmp, share, o, .. } = fresh(&[(".x", "the share's\n")]);
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

/// A sync cut short (rsync failed or the daemon died) settles by what rsync sent. A version
/// written through an open file just after the sync looked at it (kernel passthrough
/// writes without the daemon), which rsync then sent, then a later version in the cache:
/// the share's copy is our own transfer, not another workstation's change. The next sync
/// sends the later version, with no conflict.
#[test]
fn a_version_written_after_the_syncs_look_and_sent_by_a_sync_cut_short_is_ours() {
    let Fresh {
        _tmp,
        share,
        cache,
        o,
    } = fresh(&[]);
    let root = Path::new("");
    let write = |o: &Overlay, data: &[u8]| {
        let (mut f, writer) = o
            .open(&ctx(), Path::new(".f"), libc::O_WRONLY | libc::O_TRUNC)
            .expect("open");
        std::io::Write::write_all(&mut f, data).expect("write");
        drop(f);
        if let Some(ino) = writer {
            o.release_writer(ino);
        }
    };
    let (_, f, writer) = o
        .create(&ctx(), root, OsStr::new(".f"), 0o644, libc::O_WRONLY)
        .expect("create");
    drop(f);
    if let Some(ino) = writer {
        o.release_writer(ino);
    }
    write(&o, b"v1");
    let upper = cache.join("upper/.f");
    AFTER_SYNC_LOOKS.with(|h| {
        *h.borrow_mut() = Some(Box::new(move |_: &Overlay| {
            // A program's write through its open file, then the rest of the hand-over
            // takes a while (many files): longer than the clock's lag.
            std::fs::write(&upper, b"v2, written after the look").expect("write v2");
            std::thread::sleep(Duration::from_millis(60));
        }))
    });
    let session = o.begin_sync("here", "20261124T000000Z").expect("begin");
    AFTER_SYNC_LOOKS.with(|h| *h.borrow_mut() = None);
    let (transfer, _) =
        crate::sync::run_rsync(&rsync(&share), o.upper(), o.share(), &session.files)
            .expect("rsync");
    assert!(matches!(transfer, Transfer::Complete));
    // The program writes again, and the sync ends as if rsync had failed.
    std::thread::sleep(Duration::from_millis(30));
    write(&o, b"v3");
    let settled = session.finish(Transfer::Incomplete).expect("finish");
    assert!(settled.conflicts.is_empty(), "{settled:?}");
    let r = run_sync(&o, &rsync(&share), SyncMode::Logout).expect("logout");
    assert!(
        r.ok && r.conflicts.is_empty(),
        "our own transfer taken for another's: {r:?}"
    );
    assert_eq!(
        std::fs::read(share.join(".f")).expect("on the share"),
        b"v3"
    );
}

/// A rename asks the share about its source before it takes the lock, or takes the answer
/// the source's create got a moment before (kept, see [`Overlay::remember_look`]). A sync
/// that runs after that answer, between the create and the rename or between the
/// rename's look and its lock, and sends the source (a file made here) must not leave
/// the rename with the share's old answer (nothing there): the source's name is hidden
/// after the rename, and the next sync deletes the copy the first one sent.
#[test]
fn a_sync_between_a_renames_share_look_and_its_lock_does_not_make_the_look_stand() {
    for in_between in [true, false] {
        let Fresh { _tmp, share, o, .. } = fresh(&[]);
        o.set_recent_look(Duration::from_secs(600));
        let root = Path::new("");
        make_file(&o, ".t", libc::O_WRONLY, b"saved\n");
        let opts = rsync(&share);
        let sync = {
            let opts = opts.clone();
            move |o: &Overlay| {
                let r = run_sync(o, &opts, SyncMode::Session).expect("sync");
                assert!(r.ok && r.sent == 1, "{r:?}");
            }
        };
        if in_between {
            AFTER_LOOK.with(|h| *h.borrow_mut() = Some(Box::new(sync)));
        } else {
            sync(&o);
        }
        let renamed = o.rename(&ctx(), root, OsStr::new(".t"), root, OsStr::new(".s"), 0);
        AFTER_LOOK.with(|h| *h.borrow_mut() = None);
        renamed.expect("rename");
        assert!(
            share.join(".t").exists(),
            "the sync in between sent the source"
        );
        assert!(
            o.resolve(Path::new(".t")).is_err(),
            "the source's name shows nothing"
        );
        let r = run_sync(&o, &opts, SyncMode::Logout).expect("logout");
        assert!(r.ok && r.conflicts.is_empty(), "{r:?}");
        assert!(!share.join(".t").exists(), "the sent source is deleted");
        assert_eq!(std::fs::read(share.join(".s")).expect(".s"), b"saved\n");
    }
}

/// A save by rename whose write-ahead record waits for the disk holds up only what
/// concerns its two names: a create in another directory goes on meanwhile, while a look
/// at the target and a sync wait for the rename to end, and then see the new file there
/// (never the state and the cache disagreeing on the name).
#[test]
fn a_rename_waiting_for_its_records_holds_up_its_names_only() {
    let Fresh { _tmp, share, o, .. } = fresh(&[(".d1/", ""), (".d2/", ""), (".d1/.s", "old\n")]);
    let d1 = Path::new(".d1");
    let (_, mut f, _) = o
        .create(&ctx(), d1, OsStr::new(".t"), 0o644, libc::O_WRONLY)
        .expect("create");
    std::io::Write::write_all(&mut f, b"new\n").expect("write");
    drop(f);
    let new_ino = o.resolve(&d1.join(".t")).expect("the new file").meta.ino();
    let opts = rsync(&share);
    let (reached_tx, reached) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let o = &o;
        let renaming = s.spawn(move || {
            AT_DURABLE.with(|h| {
                *h.borrow_mut() = Some(Box::new(move |_: &Overlay| {
                    reached_tx.send(()).expect("reached");
                    release_rx.recv().expect("released");
                }))
            });
            o.rename(&ctx(), d1, OsStr::new(".t"), d1, OsStr::new(".s"), 0)
        });
        reached
            .recv_timeout(Duration::from_secs(60))
            .expect("the rename waits for its record");
        // Meanwhile: a create elsewhere is answered.
        let (made_tx, made) = std::sync::mpsc::channel();
        s.spawn(move || {
            let r = o.create(
                &ctx(),
                Path::new(".d2"),
                OsStr::new(".x"),
                0o644,
                libc::O_WRONLY,
            );
            made_tx.send(r.map(|_| ())).expect("made");
        });
        let created = made.recv_timeout(Duration::from_secs(60));
        // A look at the target, and a sync, started now.
        let looking = s.spawn(move || o.resolve(&d1.join(".s")).map(|f| f.meta.ino()));
        let syncing = s.spawn(|| run_sync(o, &opts, SyncMode::Session));
        std::thread::sleep(Duration::from_millis(200));
        let held_up = (!looking.is_finished(), !syncing.is_finished());
        release.send(()).expect("release");
        renaming.join().expect("rename thread").expect("rename");
        assert!(
            matches!(created, Ok(Ok(()))),
            "a create in another directory waited for the rename: {created:?}"
        );
        assert_eq!(held_up, (true, true), "(look, sync) held up by the rename");
        let seen = looking.join().expect("look thread").expect("look");
        assert_eq!(seen, new_ino, "the look saw the target before the rename");
        let r = syncing.join().expect("sync thread").expect("sync");
        assert!(r.ok && r.conflicts.is_empty(), "{r:?}");
    });
    assert_eq!(
        std::fs::read_to_string(share.join(".d1/.s")).expect("on the share"),
        "new\n"
    );
    assert!(!share.join(".d1/.t").exists());
}

/// The content of `rel` through the overlay, if it opens.
pub(super) fn view_of(o: &Overlay, rel: &str) -> Option<Vec<u8>> {
    o.open(&ctx(), Path::new(rel), libc::O_RDONLY)
        .ok()
        .map(|(mut f, _)| {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut f, &mut v).expect("read");
            v
        })
}

/// rsync writes each file it sends into a temporary `.NAME.XXXXXX` (mode 0600 until it is
/// whole) beside it first: while the sync runs, a cached directory's listing does not show
/// the temporary files of the files this sync handed over (an `rm -rf` of the directory
/// found it not empty). The same name for a file not handed over, of another mode (a
/// user's `.x.backup` beside `x`), or after the sync, is an ordinary name; and a lookup by
/// name always finds what the share has (a program that found the user's file missing
/// would write it anew, and the sync's share copy would take its place).
#[test]
fn rsyncs_temporary_files_are_not_shown_while_it_sends() {
    let Fresh { _tmp, share, o, .. } = fresh(&[(".d/", "")]);
    let d = Path::new(".d");
    let (_, f, w) = o
        .create(&ctx(), d, OsStr::new("x"), 0o644, libc::O_WRONLY)
        .expect("create");
    drop(f);
    if let Some(ino) = w {
        o.release_writer(ino);
    }
    let names = |o: &Overlay| -> Vec<String> {
        let mut v: Vec<String> = o
            .readdir(d)
            .expect("list")
            .into_iter()
            .map(|e| e.name.to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let session = o.begin_sync("host", "20261125T000000Z").expect("sync");
    assert_eq!(session.files, vec![d.join("x")]);
    // What rsync makes while it sends .d/x; a user's file of the same shape beside
    // another file; and a user's backup of x (not of mode 0600).
    use std::os::unix::fs::PermissionsExt;
    let mode = |name: &str, m: u32| {
        std::fs::set_permissions(
            share.join(".d").join(name),
            std::fs::Permissions::from_mode(m),
        )
        .expect("chmod")
    };
    std::fs::write(share.join(".d/.x.Ab3dE9"), "half").expect("temp");
    mode(".x.Ab3dE9", 0o600);
    std::fs::write(share.join(".d/.y.Ab3dE9"), "mine").expect("other");
    mode(".y.Ab3dE9", 0o600);
    std::fs::write(share.join(".d/.x.backup"), "precious").expect("backup");
    mode(".x.backup", 0o644);
    assert_eq!(names(&o), vec![".x.backup", ".y.Ab3dE9", "x"]);
    for name in [".x.Ab3dE9", ".y.Ab3dE9", ".x.backup"] {
        assert!(o.resolve(&d.join(name)).is_ok(), "{name}");
    }
    drop(session);
    assert_eq!(names(&o), vec![".x.Ab3dE9", ".x.backup", ".y.Ab3dE9", "x"]);
    assert!(o.resolve(&d.join(".x.Ab3dE9")).is_ok());
}

#[test]
fn rsync_temporary_names_are_told_by_shape() {
    let of = |p: &str| rsync_temp_of(Path::new(p)).map(|p| p.display().to_string());
    assert_eq!(of(".d/.x.Ab3dE9").as_deref(), Some(".d/x"));
    assert_eq!(of("..bashrc.q1W2e3").as_deref(), Some(".bashrc"));
    assert_eq!(of(".d/.x.Ab3d-9"), None);
    assert_eq!(of(".d/x.Ab3dE9"), None);
    assert_eq!(of(".d/..Ab3dE9"), None);
    assert_eq!(of(".d/.x.Ab3dE"), None);
    assert_eq!(of(".Ab3dE9"), None);
}

/// Writes `data` over the cached file `rel` through the overlay.
pub(super) fn write_over(o: &Overlay, rel: &str, data: &[u8]) {
    let (mut f, writer) = o
        .open(&ctx(), Path::new(rel), libc::O_WRONLY | libc::O_TRUNC)
        .expect("open");
    std::io::Write::write_all(&mut f, data).expect("write");
    drop(f);
    if let Some(ino) = writer {
        o.release_writer(ino);
    }
}

/// A database's journal removed here waits for its records (which hold the database's
/// base, the share's version then); meanwhile another workstation saves the database and
/// a program here writes it. The write waits for the removal to end, so the database's
/// base is the one taken first, in the state and in the journal alike: the sync finds the
/// other workstation's save (a conflict, never an overwrite), also after a crash.
#[test]
fn a_database_written_while_its_journals_removal_waits_keeps_the_first_base() {
    for crash in [false, true] {
        let Fresh {
            _tmp,
            share,
            cache,
            o,
        } = fresh(&[(".m/", ""), (".m/db", "db v1\n"), (".m/db-journal", "j\n")]);
        let m = Path::new(".m");
        let (reached_tx, reached) = std::sync::mpsc::channel::<()>();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            let o = &o;
            let removing = s.spawn(move || {
                AT_DURABLE.with(|h| {
                    *h.borrow_mut() = Some(Box::new(move |_: &Overlay| {
                        reached_tx.send(()).expect("reached");
                        release_rx.recv().expect("released");
                    }))
                });
                o.unlink(m, OsStr::new("db-journal"))
            });
            reached.recv().expect("the removal waits for its records");
            std::fs::write(share.join(".m/db.tmp"), "db v2 from elsewhere\n").expect("save");
            std::fs::rename(share.join(".m/db.tmp"), share.join(".m/db")).expect("save");
            let writing = s.spawn(move || write_over(o, ".m/db", b"db ours\n"));
            std::thread::sleep(Duration::from_millis(200));
            let held_up = !writing.is_finished();
            release.send(()).expect("release");
            removing.join().expect("removal").expect("unlink");
            writing.join().expect("write");
            assert!(held_up, "the database's write waits for the removal");
        });
        let o = if crash {
            drop(o);
            Overlay::new(&share, &cache, Policy::default_policy()).expect("reopen")
        } else {
            o
        };
        let mode = if crash {
            SyncMode::Recover
        } else {
            SyncMode::Logout
        };
        let r = run_sync(&o, &rsync(&share), mode).expect("sync");
        assert!(!r.conflicts.is_empty(), "crash {crash}: {r:?}");
        assert_eq!(
            std::fs::read_to_string(share.join(".m/db")).expect("db"),
            "db v2 from elsewhere\n",
            "crash {crash}: the other workstation's database was overwritten"
        );
    }
}

/// A sync that finds a conflict moves our version to a conflict name in the cache; a
/// power cut just after the cache's rename, before the move's last records: the recovery
/// still puts our version on the share, beside the other workstation's.
#[test]
fn a_power_cut_inside_a_conflict_move_keeps_our_version() {
    let Fresh { _tmp, share, o, .. } = fresh(&[(".c", "old\n")]);
    write_over(&o, ".c", b"our edit\n");
    std::fs::write(share.join(".c.tmp"), "theirs, longer\n").expect("theirs");
    std::fs::rename(share.join(".c.tmp"), share.join(".c")).expect("theirs");
    let cut = _tmp.path().join("cut");
    {
        let cut = cut.clone();
        AFTER_CONFLICT_MOVE.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |o: &Overlay| {
                super::crash_tests::power_cut(o, &cut);
            }))
        });
    }
    let r = run_sync(&o, &rsync(&share), SyncMode::Logout).expect("logout");
    AFTER_CONFLICT_MOVE.with(|h| *h.borrow_mut() = None);
    assert_eq!(r.conflicts.len(), 1, "{r:?}");
    drop(o);
    // The share as before that logout: theirs at .c only.
    for e in std::fs::read_dir(&share).expect("ls").flatten() {
        if e.file_name() != ".c" {
            std::fs::remove_file(e.path()).expect("undo the logout's copy");
        }
    }
    let o = Overlay::new(&share, &cut, Policy::default_policy()).expect("the cut's cache");
    let r = run_sync(&o, &rsync(&share), SyncMode::Recover).expect("recover");
    assert!(r.ok, "{r:?}");
    let contents: Vec<String> = std::fs::read_dir(&share)
        .expect("ls")
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    assert!(contents.iter().any(|c| c == "our edit\n"), "{contents:?}");
    assert!(
        contents.iter().any(|c| c == "theirs, longer\n"),
        "{contents:?}"
    );
}

/// A file saved here with the bytes the share has is not sent. Another workstation's save
/// made while the sync looks at the share's file (replaced by a rename, as rsync and most
/// programs save, or written in place) is neither stamped with our mtime, nor taken for
/// the base, nor overwritten: the sync holds the file back and says so, and the next sync
/// meets the save as a conflict and keeps both versions.
#[test]
fn a_save_elsewhere_while_a_sync_finds_a_file_unchanged_is_kept() {
    for in_place in [false, true] {
        let Fresh { _tmp, share, o, .. } = fresh(&[(".f", "same\n")]);
        let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        std::fs::File::options()
            .write(true)
            .open(share.join(".f"))
            .and_then(|f| f.set_modified(old))
            .expect("an old mtime on the share");
        let (mut f, writer) = o
            .open(&ctx(), Path::new(".f"), libc::O_WRONLY | libc::O_TRUNC)
            .expect("open");
        std::io::Write::write_all(&mut f, b"same\n").expect("write");
        drop(f);
        if let Some(ino) = writer {
            o.release_writer(ino);
        }
        let theirs = share.join(".f");
        AFTER_UNCHANGED_STAMP.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |_: &Overlay| {
                if in_place {
                    std::fs::write(&theirs, b"else\n").expect("a write in place");
                } else {
                    let tmp = theirs.with_file_name(".f.tmp");
                    std::fs::write(&tmp, b"theirs\n").expect("a save");
                    std::fs::rename(&tmp, &theirs).expect("renamed into place");
                }
            }))
        });
        let r = run_sync(&o, &rsync(&share), SyncMode::Session).expect("sync");
        AFTER_UNCHANGED_STAMP.with(|h| *h.borrow_mut() = None);
        let want = if in_place { "else\n" } else { "theirs\n" };
        assert!(
            !r.ok && r.unchanged == 0 && r.errors.iter().any(|e| e.contains("held back")),
            "in place {in_place}: {r:?}"
        );
        assert_eq!(std::fs::read_to_string(share.join(".f")).expect("r"), want);
        assert!(o.lock().state().is_dirty(Path::new(".f")));
        let r = run_sync(&o, &rsync(&share), SyncMode::Logout).expect("logout");
        assert_eq!(r.conflicts.len(), 1, "in place {in_place}: {r:?}");
        assert_eq!(std::fs::read_to_string(share.join(".f")).expect("r"), want);
        let kept: Vec<String> = std::fs::read_dir(&share)
            .expect("ls")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".f.ccfs-conflict-"))
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(
            std::fs::read_to_string(share.join(&kept[0])).expect("r"),
            "same\n",
            "ours is kept too"
        );
    }
}

/// Makes the file `rel` with `flags` (O_CREAT implied) and writes `data` into it through
/// the overlay.
pub(super) fn make_file(o: &Overlay, rel: &str, flags: i32, data: &[u8]) {
    let rel = Path::new(rel);
    let (parent, name) = (
        rel.parent().unwrap_or(Path::new("")),
        rel.file_name().expect("a name"),
    );
    let (_, mut f, writer) = o
        .create(&ctx(), parent, name, 0o644, flags)
        .expect("create");
    std::io::Write::write_all(&mut f, data).expect("write");
    drop(f);
    if let Some(ino) = writer {
        o.release_writer(ino);
    }
}

/// The share's contents, every file read (in every directory).
pub(super) fn share_contents(share: &Path) -> Vec<String> {
    let mut all = Vec::new();
    let mut dirs = vec![share.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).expect("ls").flatten() {
            let path = e.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.is_file() {
                all.push(std::fs::read_to_string(path).unwrap_or_default());
            }
        }
    }
    all.sort();
    all
}

/// An O_EXCL create right after the kernel's lookup of the same name takes the lookup's
/// share look for its own (one question to the share instead of two). Another
/// workstation's file made at the name in between is then found by the sync, as a change
/// made after the look: both versions are kept, theirs at the name and ours beside it
/// (the conflict rule). A create without O_EXCL asks the share itself and opens theirs.
#[test]
fn a_file_made_elsewhere_between_a_lookup_and_a_create_is_kept() {
    let Fresh { _tmp, share, o, .. } = fresh(&[]);
    // However slow the machine, the create comes within the kept look's life.
    o.set_recent_look(Duration::from_secs(600));
    let root = Path::new("");
    for name in [".x", ".y"] {
        assert!(o.resolve(Path::new(name)).is_err(), "nothing there yet");
        std::fs::write(share.join(name), "theirs\n").expect("another workstation");
    }
    let (_, f, writer) = o
        .create(&ctx(), root, OsStr::new(".y"), 0o644, libc::O_RDONLY)
        .expect("create without O_EXCL");
    assert_eq!(std::io::read_to_string(f).expect("read"), "theirs\n");
    if let Some(ino) = writer {
        o.release_writer(ino);
    }
    make_file(&o, ".x", libc::O_WRONLY | libc::O_EXCL, b"ours\n");
    let r = run_sync(&o, &rsync(&share), SyncMode::Logout).expect("logout");
    assert_eq!(r.conflicts.len(), 1, "{r:?}");
    assert_eq!(
        std::fs::read_to_string(share.join(".x")).expect(".x"),
        "theirs\n"
    );
    assert_eq!(share_contents(&share), ["ours\n", "theirs\n", "theirs\n"]);
}

/// A lookup's share look answers only a change that follows it closely: a create a while
/// later asks the share again and finds another workstation's file made meanwhile (then
/// opens it, as any program would, with no conflict).
#[test]
fn a_lookups_share_look_does_not_answer_a_create_long_after() {
    let Fresh { _tmp, share, o, .. } = fresh(&[]);
    let root = Path::new("");
    assert!(o.resolve(Path::new(".x")).is_err(), "nothing there yet");
    std::fs::write(share.join(".x"), "theirs\n").expect("another workstation");
    std::thread::sleep(RECENT_LOOK + Duration::from_millis(100));
    let made = o.create(
        &ctx(),
        root,
        OsStr::new(".x"),
        0o644,
        libc::O_WRONLY | libc::O_EXCL,
    );
    assert_eq!(made.err().map(|e| e.errno()), Some(libc::EEXIST));
}

/// A hard link made at a name the share held nothing at when asked, and another
/// workstation's file put there before the lock: the link's base is that answer (nothing),
/// so the sync finds their file and keeps both. Before, the base was asked again under
/// the lock and took their file for it: the sync overwrote it without a conflict.
#[test]
fn a_file_made_elsewhere_between_a_links_look_and_its_lock_is_kept() {
    let Fresh { _tmp, share, o, .. } = fresh(&[(".a", "src\n")]);
    let root = Path::new("");
    {
        let share = share.clone();
        AFTER_LOOK.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |_: &Overlay| {
                std::fs::write(share.join(".b"), "theirs\n").expect("another workstation");
            }))
        });
    }
    let linked = o.link(&ctx(), Path::new(".a"), root, OsStr::new(".b"));
    AFTER_LOOK.with(|h| *h.borrow_mut() = None);
    linked.expect("link");
    let r = run_sync(&o, &rsync(&share), SyncMode::Logout).expect("logout");
    assert_eq!(r.conflicts.len(), 1, "{r:?}");
    assert_eq!(
        std::fs::read_to_string(share.join(".b")).expect(".b"),
        "theirs\n"
    );
    assert!(
        share_contents(&share)
            .iter()
            .filter(|c| *c == "src\n")
            .count()
            >= 2,
        "ours beside theirs: {:?}",
        share_contents(&share)
    );
}

/// What the share holds at a name is never taken from a kept look: a file another
/// workstation replaced by a directory just after a lookup here is seen as the directory
/// by a rename (EXDEV: a directory the share has is not moved here) and by an unlink
/// (EISDIR), which hide nothing of it.
#[test]
fn a_file_replaced_by_a_directory_elsewhere_just_after_a_lookup_is_seen_as_one() {
    let Fresh { _tmp, share, o, .. } = fresh(&[(".a", "file\n"), (".u", "file\n")]);
    let root = Path::new("");
    for name in [".a", ".u"] {
        assert!(o.resolve(Path::new(name)).is_ok(), "{name} is a file");
        std::fs::remove_file(share.join(name)).expect("another workstation");
        std::fs::create_dir(share.join(name)).expect("makes a directory");
        std::fs::write(share.join(name).join("f"), "theirs\n").expect("with a file");
    }
    let renamed = o.rename(&ctx(), root, OsStr::new(".a"), root, OsStr::new(".b"), 0);
    assert_eq!(renamed.err().map(|e| e.errno()), Some(libc::EXDEV));
    let removed = o.unlink(root, OsStr::new(".u"));
    assert_eq!(removed.err().map(|e| e.errno()), Some(libc::EISDIR));
    for name in [".a", ".u"] {
        assert!(o.resolve(Path::new(name)).is_ok_and(|f| f.meta.is_dir()));
        assert_eq!(
            view_of(&o, &format!("{name}/f")).as_deref(),
            Some(&b"theirs\n"[..])
        );
    }
}

/// A create without O_EXCL at a name whose file another workstation deleted just after
/// a lookup here makes the file (the kept look says only where the share had nothing).
#[test]
fn a_create_after_a_file_was_deleted_elsewhere_just_after_a_lookup_makes_it() {
    let Fresh { _tmp, share, o, .. } = fresh(&[(".x", "theirs\n")]);
    assert!(o.resolve(Path::new(".x")).is_ok(), "a file");
    std::fs::remove_file(share.join(".x")).expect("another workstation deletes it");
    make_file(&o, ".x", libc::O_WRONLY | libc::O_TRUNC, b"ours\n");
    let r = run_sync(&o, &rsync(&share), SyncMode::Logout).expect("logout");
    assert!(r.ok && r.conflicts.is_empty(), "{r:?}");
    assert_eq!(std::fs::read(share.join(".x")).expect(".x"), b"ours\n");
}

/// A directory made here is renamed onto a name the share had nothing at when asked;
/// another workstation made a directory there meanwhile, with a file of the same name as
/// one in ours: just after the kernel's lookup (the kept look answers the rename), or
/// between the rename's own look and its lock. What moves below the new name was never
/// seen there on the share: its base is nothing, so the sync keeps both files. Before,
/// the moved file took theirs for its base under the lock, and the sync overwrote it.
#[test]
fn a_directory_renamed_onto_a_name_filled_elsewhere_keeps_what_was_put_there() {
    for kept in [true, false] {
        let Fresh { _tmp, share, o, .. } = fresh(&[]);
        let root = Path::new("");
        o.mkdir(&ctx(), root, OsStr::new(".nd"), 0o755)
            .expect("mkdir");
        make_file(&o, ".nd/g", libc::O_WRONLY | libc::O_EXCL, b"ours\n");
        let fill = {
            let share = share.clone();
            move |_: &Overlay| {
                std::fs::create_dir(share.join(".x")).expect("another workstation");
                std::fs::write(share.join(".x/g"), "theirs\n").expect("another workstation");
            }
        };
        if kept {
            o.set_recent_look(Duration::from_secs(600));
            assert!(o.resolve(Path::new(".x")).is_err(), "nothing there yet");
            fill(&o);
        } else {
            // The rename looks at its source first, then at its target: the change comes
            // after the second look.
            o.set_recent_look(Duration::ZERO);
            AFTER_LOOK.with(|h| {
                *h.borrow_mut() = Some(Box::new(move |_: &Overlay| {
                    let fill = fill.clone();
                    AFTER_LOOK.with(|h| *h.borrow_mut() = Some(Box::new(fill)));
                }))
            });
        }
        let renamed = o.rename(&ctx(), root, OsStr::new(".nd"), root, OsStr::new(".x"), 0);
        AFTER_LOOK.with(|h| *h.borrow_mut() = None);
        renamed.expect("rename");
        let r = run_sync(&o, &rsync(&share), SyncMode::Logout).expect("logout");
        assert_eq!(r.conflicts.len(), 1, "kept look {kept}: {r:?}");
        assert_eq!(
            std::fs::read_to_string(share.join(".x/g")).expect(".x/g"),
            "theirs\n",
            "kept look {kept}"
        );
        assert_eq!(
            share_contents(&share),
            ["ours\n", "theirs\n"],
            "kept look {kept}"
        );
    }
}

/// The same rename, where the moved directory holds SQLite databases with their WALs: a
/// database's base is also taken when its WAL is taken over, and that must be "nothing"
/// too (it was asked of the share under the lock and, coming after the database's own
/// record, replaced it: their database was overwritten). Six pairs, as the cache lists
/// them in an order of its own.
#[test]
fn a_directory_of_databases_renamed_onto_a_name_filled_elsewhere_keeps_theirs() {
    let Fresh { _tmp, share, o, .. } = fresh(&[]);
    let root = Path::new("");
    o.mkdir(&ctx(), root, OsStr::new(".nd"), 0o755)
        .expect("mkdir");
    let names: Vec<String> = (0..6).map(|i| format!("p{i}.db")).collect();
    for n in &names {
        make_file(
            &o,
            &format!(".nd/{n}"),
            libc::O_WRONLY | libc::O_EXCL,
            b"ours\n",
        );
        make_file(
            &o,
            &format!(".nd/{n}-wal"),
            libc::O_WRONLY | libc::O_EXCL,
            b"wal\n",
        );
    }
    o.set_recent_look(Duration::from_secs(600));
    assert!(o.resolve(Path::new(".x")).is_err(), "nothing there yet");
    std::fs::create_dir(share.join(".x")).expect("another workstation");
    for n in &names {
        std::fs::write(share.join(".x").join(n), "theirs\n").expect("another workstation");
    }
    o.rename(&ctx(), root, OsStr::new(".nd"), root, OsStr::new(".x"), 0)
        .expect("rename");
    let r = run_sync(&o, &rsync(&share), SyncMode::Logout).expect("logout");
    for n in &names {
        assert_eq!(
            std::fs::read_to_string(share.join(".x").join(n)).expect("theirs"),
            "theirs\n",
            "{n}: {r:?}"
        );
    }
    let all = share_contents(&share);
    assert_eq!(all.iter().filter(|c| *c == "ours\n").count(), 6, "{all:?}");
}

/// A file held by block, open for writing, is copied by a sync (its snapshot), and a block
/// the cache file lacked is written for the first time right after the copy passed it: the
/// sync must not send that block as the copy's hole (zeros the file never had). It sends
/// the base's bytes there (no snapshot: the file as it is, and it stays dirty), and the
/// next sync sends the block written.
#[test]
fn a_block_first_written_after_a_syncs_copy_passed_it_is_never_sent_as_a_hole() {
    use crate::extents::BLOCK;
    let Fresh {
        _tmp,
        share,
        cache,
        o,
    } = fresh(&[]);
    let b = BLOCK as usize;
    let base: Vec<u8> = (0..64 * b).map(|i| (i % 251 + 1) as u8).collect();
    std::fs::write(share.join(".db"), &base).expect("share file");
    o.set_by_block_from(16 * BLOCK);
    let db = Path::new(".db");
    let f = o.open_file(&ctx(), db, libc::O_RDWR).expect("open");
    {
        let g = o
            .file_to_write(&ctx(), &f, || Some(db.to_path_buf()))
            .expect("writable");
        o.write_at(&g, &vec![7; b], 0).expect("write");
    }
    let bf = o.block_file(db).expect("held by block");
    let cache_file = std::fs::OpenOptions::new()
        .write(true)
        .open(cache.join("upper/.db"))
        .expect("cache file");
    AFTER_BLOCK_SNAPSHOT.with(|h| {
        *h.borrow_mut() = Some(Box::new(move |o: &Overlay| {
            bf.write_at(&o.share, &cache_file, &vec![9; b], 20 * BLOCK)
                .expect("a write during the sync");
        }))
    });
    let r = run_sync(&o, &rsync(&share), SyncMode::Session).expect("sync");
    AFTER_BLOCK_SNAPSHOT.with(|h| *h.borrow_mut() = None);
    let on_share = std::fs::read(share.join(".db")).expect("share");
    let block20 = &on_share[20 * b..21 * b];
    assert!(
        block20 == &base[20 * b..21 * b] || block20 == &vec![9; b][..],
        "block 20 on the share is neither the base's nor the write's: {:?}",
        &block20[..8]
    );
    assert!(r.remaining_dirty == 1, "{r:?}");
    o.close_file(&f);
    drop(f);
    let r = run_sync(&o, &rsync(&share), SyncMode::Session).expect("sync");
    assert!(r.ok && r.remaining_dirty == 0, "{r:?}");
    let mut want = base.clone();
    want[..b].fill(7);
    want[20 * b..21 * b].fill(9);
    assert!(
        std::fs::read(share.join(".db")).expect("share") == want,
        "the share after the file was closed and synced"
    );
}
