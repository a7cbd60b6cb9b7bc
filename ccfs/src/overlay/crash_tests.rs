//! Power cuts at every point where a change waits for its journal records (see
//! [`Overlay::durable`]): the cache as the change left it (every change to it reached the
//! disk, the worst case for a write-ahead order), the journal only up to what an
//! `fdatasync` made durable. The recovery that follows puts on the share each file as it
//! was before the change or after it: never a third version, and nothing answered before
//! the change is lost.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::Command;
use std::rc::Rc;

use super::test_support::{ctx, rsync};
use super::*;
use crate::sync::{run_sync, SyncMode};

type CutHook = Box<dyn FnMut(&Overlay)>;

thread_local! {
    static CUT: RefCell<Option<CutHook>> = const { RefCell::new(None) };
}

/// Called where a change waits for its records: the test's power cut, if one is set.
pub(super) fn at_crash_point(o: &Overlay) {
    CUT.with(|c| {
        if let Some(cut) = c.borrow_mut().as_mut() {
            cut(o)
        }
    });
}

/// What a power cut leaves of the cache: a copy, with the journal cut where its durable
/// records end. (The share is not copied: a copy would have other inode numbers and
/// times, and the recovery would take it for another workstation's change.)
pub(super) fn power_cut(o: &Overlay, to: &Path) {
    let cache = o.upper().parent().expect("cache dir");
    let st = Command::new("cp")
        .arg("-a")
        .arg(cache)
        .arg(to)
        .status()
        .expect("cp");
    assert!(st.success(), "copy of {}", cache.display());
    let journal = std::fs::OpenOptions::new()
        .write(true)
        .open(to.join("journal"))
        .expect("journal copy");
    journal
        .set_len(o.durability.durable_end())
        .expect("cut the journal");
}

const NAMES: [&str; 11] = [
    ".a", ".t", ".s", ".k", ".m", ".l", ".h", ".hl", ".g", ".gl", ".x",
];

type Files = BTreeMap<&'static str, Option<Vec<u8>>>;

/// The files as the user sees them through the overlay.
fn view(o: &Overlay) -> Files {
    NAMES
        .iter()
        .map(|n| {
            let content = o
                .open(&ctx(), Path::new(n), libc::O_RDONLY)
                .ok()
                .map(|(mut f, _)| {
                    let mut v = Vec::new();
                    f.read_to_end(&mut v).expect("read");
                    v
                });
            (*n, content)
        })
        .collect()
}

/// The files on `share` after the recovery of the cache `cut` left.
fn recovered(share: &Path, cut: &Path) -> Files {
    let o = Overlay::new(share, cut, Policy::default_policy())
        .expect("the overlay opens after the cut");
    let report = run_sync(&o, &rsync(share), SyncMode::Recover).expect("recovery");
    assert!(report.ok, "{}: {report:?}", cut.display());
    assert!(report.conflicts.is_empty(), "{report:?}");
    NAMES
        .iter()
        .map(|n| (*n, std::fs::read(share.join(n)).ok()))
        .collect()
}

fn shown(f: &Files) -> String {
    f.iter()
        .map(|(n, c)| match c {
            Some(c) => format!("{n}={:?} ", String::from_utf8_lossy(c)),
            None => format!("{n}=none "),
        })
        .collect()
}

/// Before the cuts: two files of two names each, sent to the share by a sync (a sync
/// after a cut would change the share the cut's recovery is compared on).
fn prepare(o: &Overlay, share: &Path) {
    let root = Path::new("");
    for (name, link, data) in [(".h", ".hl", b"h1"), (".g", ".gl", b"g1")] {
        let (_, mut f, writer) = o
            .create(&ctx(), root, OsStr::new(name), 0o644, libc::O_WRONLY)
            .expect("create");
        f.write_all(data).expect("write");
        drop(f);
        if let Some(ino) = writer {
            o.release_writer(ino);
        }
        o.link(&ctx(), Path::new(name), root, OsStr::new(link))
            .expect("link");
    }
    // Other tests of this process fork children that hold a copy of every descriptor
    // for a while: a file open for writing then is left dirty by a sync (it may still be
    // written), and the next sync finds it clean.
    let mut report = run_sync(o, &rsync(share), SyncMode::Session).expect("sync");
    for _ in 0..50 {
        if report.remaining_dirty == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        report = run_sync(o, &rsync(share), SyncMode::Session).expect("sync");
    }
    assert!(report.ok && report.remaining_dirty == 0, "{report:?}");
    // Not cut: a power cut between the cache's rename of a name the share holds and the
    // record of its old name's removal leaves both names (a known limit, see
    // `a_power_cut_in_the_rename_of_a_name_the_share_holds_leaves_one_name`).
    o.rename(&ctx(), root, OsStr::new(".gl"), root, OsStr::new(".x"), 0)
        .expect("rename");
}

/// One session's changes, each followed by `step` with what it was.
fn session(o: &Overlay, step: &mut dyn FnMut(&str, &Overlay)) {
    let open_w = |o: &Overlay, n: &str, flags: i32| {
        o.open(&ctx(), Path::new(n), libc::O_WRONLY | flags)
            .expect("open for writing")
            .0
    };
    // Writes through an open file reach no journal: a step of its own, with no cut in it.
    let write = |mut f: File, data: &[u8]| {
        f.write_all(data).expect("write");
    };
    let root = Path::new("");
    o.create(&ctx(), root, OsStr::new(".a"), 0o644, libc::O_WRONLY)
        .expect("create");
    step("a create", o);
    let f = open_w(o, ".a", 0);
    step("an open for writing of a new file", o);
    write(f, b"a1");
    step("a write", o);
    for (round, text) in ["new-s", "newer-s"].iter().enumerate() {
        let (_, f, _) = o
            .create(&ctx(), root, OsStr::new(".t"), 0o644, libc::O_WRONLY)
            .expect("create");
        step("a create of a temporary file", o);
        write(f, text.as_bytes());
        step("a write", o);
        o.rename(&ctx(), root, OsStr::new(".t"), root, OsStr::new(".s"), 0)
            .expect("rename");
        step(&format!("a save by rename ({})", round + 1), o);
    }
    o.unlink(root, OsStr::new(".a")).expect("unlink");
    step("an unlink of a file made here", o);
    let f = open_w(o, ".k", libc::O_TRUNC);
    step("an open that truncates a share's file", o);
    write(f, b"k2");
    step("a write", o);
    let size = SetAttr {
        size: Some(3),
        ..Default::default()
    };
    o.setattr(&ctx(), Path::new(".s"), size, None)
        .expect("truncate");
    step("a truncate", o);
    let f = open_w(o, ".m", 0);
    step("an open for writing of a share's file", o);
    write(f, b"M");
    step("a write", o);
    o.unlink(root, OsStr::new(".m")).expect("unlink");
    step("an unlink of a share's file changed here", o);
    o.link(&ctx(), Path::new(".s"), root, OsStr::new(".l"))
        .expect("link");
    step("a hard link", o);
    let f = open_w(o, ".h", libc::O_APPEND);
    step("an open for writing of a synced hard link", o);
    write(f, b"h2");
    step("a write", o);
    o.unlink(root, OsStr::new(".hl")).expect("unlink");
    step("an unlink of the other name of a file changed here", o);
    // A name the share has nothing at, given to a synced hard link by a rename (before
    // the cuts, see `prepare`), changed, then removed: the change goes on under the
    // link's other name.
    let f = open_w(o, ".x", libc::O_APPEND);
    step("an open for writing of it", o);
    write(f, b"g2");
    step("a write", o);
    o.unlink(root, OsStr::new(".x")).expect("unlink");
    step(
        "an unlink of a name the share has nothing at, of a file changed through it",
        o,
    );
}

/// The session played once per point where a change waits for its records, with a power
/// cut at that point; the cut's cache recovered to the session's share (which the session
/// never changed: its changes are all to cached paths).
#[test]
fn a_power_cut_while_a_change_waits_for_its_records_leaves_it_done_or_undone() {
    let mut point = 0;
    loop {
        let tmp = tempfile::tempdir().expect("tmp");
        let (share, cache) = (tmp.path().join("share"), tmp.path().join("cache"));
        std::fs::create_dir_all(&share).expect("share");
        std::fs::create_dir_all(&cache).expect("cache");
        for n in [".s", ".k", ".m"] {
            std::fs::write(share.join(n), format!("share{n}\n")).expect("share file");
        }
        let cut = tmp.path().join("cut");
        let o = Overlay::new(&share, &cache, Policy::default_policy()).expect("overlay");
        prepare(&o, &share);
        let reached = Rc::new(RefCell::new(0));
        {
            let (reached, cut) = (reached.clone(), cut.clone());
            CUT.with(|c| {
                *c.borrow_mut() = Some(Box::new(move |o: &Overlay| {
                    if *reached.borrow() == point {
                        power_cut(o, &cut);
                    }
                    *reached.borrow_mut() += 1;
                }))
            });
        }
        let mut before = view(&o);
        let mut during = None;
        session(&o, &mut |what, o| {
            let after = view(o);
            if during.is_none() && *reached.borrow() > point {
                during = Some((what.to_string(), before.clone(), after.clone()));
            }
            before = after;
        });
        CUT.with(|c| *c.borrow_mut() = None);
        drop(o);
        let Some((what, before, after)) = during else {
            break;
        };
        let got = recovered(&share, &cut);
        assert!(
            got == before || got == after,
            "a power cut during {what}: the share got {}; before it {}; after it {}",
            shown(&got),
            shown(&before),
            shown(&after)
        );
        point += 1;
    }
    // Every change above that waits for its records was cut at least once.
    assert!(point >= 10, "only {point} power cuts");
}

/// A known limit: the rename of a name the share holds records the new name as changed
/// before the cache's rename, and the removal of the old name after it (recorded first,
/// a cut before the cache's rename would leave the file at a name the journal calls
/// deleted). A power cut in between leaves both names on the share after the recovery,
/// each with the content: nothing is lost, but the old name comes back.
#[test]
#[ignore = "known limit: the old name comes back after a power cut inside the rename"]
fn a_power_cut_in_the_rename_of_a_name_the_share_holds_leaves_one_name() {
    for point in 0.. {
        let tmp = tempfile::tempdir().expect("tmp");
        let (share, cache) = (tmp.path().join("share"), tmp.path().join("cache"));
        std::fs::create_dir_all(&share).expect("share");
        std::fs::create_dir_all(&cache).expect("cache");
        std::fs::write(share.join(".s"), "share.s\n").expect("share file");
        let cut = tmp.path().join("cut");
        let o = Overlay::new(&share, &cache, Policy::default_policy()).expect("overlay");
        let before = view(&o);
        let waits = Rc::new(RefCell::new(0));
        {
            let (cut, waits) = (cut.clone(), waits.clone());
            CUT.with(|c| {
                *c.borrow_mut() = Some(Box::new(move |o: &Overlay| {
                    if *waits.borrow() == point {
                        power_cut(o, &cut);
                    }
                    *waits.borrow_mut() += 1;
                }))
            });
        }
        let root = Path::new("");
        o.rename(&ctx(), root, OsStr::new(".s"), root, OsStr::new(".t"), 0)
            .expect("rename");
        CUT.with(|c| *c.borrow_mut() = None);
        let after = view(&o);
        drop(o);
        if !cut.exists() {
            break;
        }
        let got = recovered(&share, &cut);
        assert!(
            got == before || got == after,
            "a cut at the rename's wait {point}: the share got {}; before {}; after {}",
            shown(&got),
            shown(&before),
            shown(&after)
        );
    }
}
