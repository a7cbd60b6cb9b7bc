//! The overlay logic without FUSE, over temporary directories, with the real rsync.
//! Includes a reference model: random operations on ccfs and on a plain in-memory tree,
//! then logout sync (and crash + recovery); the share must equal the model.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use ccfs::overlay::{Ctx, Layer, Overlay, SetAttr};
use ccfs::policy::Policy;
use ccfs::sync::{run_rsync, run_sync, RsyncOptions, SyncMode};
use proptest::prelude::*;

struct Env {
    _tmp: tempfile::TempDir,
    share: PathBuf,
    cache: PathBuf,
}

impl Drop for Env {
    fn drop(&mut self) {
        if !self.share.starts_with(self._tmp.path()) {
            let _ = fs::remove_dir_all(&self.share);
        }
    }
}

impl Env {
    /// A share and a cache in a fresh temporary directory; the share below
    /// $CCFS_MODEL_SHARE_ROOT when set (a loop-mounted ext4, which reuses inode numbers).
    fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let share = match std::env::var_os("CCFS_MODEL_SHARE_ROOT") {
            Some(root) => tempfile::tempdir_in(root).expect("share dir").keep(),
            None => tmp.path().join("share"),
        };
        let cache = tmp.path().join("cache");
        fs::create_dir_all(&share).expect("share");
        fs::create_dir(&cache).expect("cache");
        Env {
            share,
            cache,
            _tmp: tmp,
        }
    }

    fn overlay(&self) -> Overlay {
        Overlay::new(&self.share, &self.cache, Policy::default_policy()).expect("overlay")
    }

    fn rsync(&self) -> RsyncOptions {
        RsyncOptions {
            binary: ccfs::sync::find_program("rsync").expect("rsync is installed"),
            extra_args: vec![],
            timeout: Duration::from_secs(60),
            caps: ccfs::sync::probe_share(&self.share),
            fsync: ccfs::sync::FsyncProbe::answered(false),
            hold_fd: None,
            launcher: None,
            implied_dirs: false,
        }
    }

    fn sync(&self, o: &Overlay, mode: SyncMode) {
        let r = run_sync(o, &self.rsync(), mode).expect("sync");
        assert!(r.ok, "{r:?}");
        assert_eq!(r.remaining_dirty, 0, "{r:?}");
        assert_eq!(r.remaining_deletions, 0, "{r:?}");
    }
}

fn ctx() -> Ctx {
    Ctx {
        uid: ccfs::sys::geteuid(),
        gid: 0,
        umask: 0o022,
    }
}

fn write_file(o: &Overlay, rel: &str, data: &[u8]) {
    let rel = Path::new(rel);
    let (mut f, writer) = match o.resolve(rel) {
        Ok(_) => o
            .open(&ctx(), rel, libc::O_WRONLY | libc::O_TRUNC)
            .expect("open for write"),
        Err(_) => {
            let parent = rel.parent().unwrap_or(Path::new(""));
            let name = rel.file_name().expect("name");
            let (_, f, w) = o
                .create(&ctx(), parent, name, 0o644, libc::O_WRONLY)
                .expect("create");
            (f, w)
        }
    };
    f.write_all(data).expect("write");
    drop(f);
    if let Some(w) = writer {
        o.release_writer(w);
    }
}

fn read_file(o: &Overlay, rel: &str) -> Vec<u8> {
    let (mut f, _) = o
        .open(&ctx(), Path::new(rel), libc::O_RDONLY)
        .expect("open");
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut f, &mut out).expect("read");
    out
}

#[test]
fn reads_come_from_the_share_until_the_first_change_copies_up_one_file() {
    let env = Env::new();
    fs::create_dir_all(env.share.join(".mozilla/firefox/p")).expect("mkdir");
    fs::write(
        env.share.join(".mozilla/firefox/p/prefs.js"),
        "user_pref(1);",
    )
    .expect("w");
    fs::write(env.share.join(".mozilla/firefox/p/other.js"), "x").expect("w");
    let t = env.share.join(".mozilla/firefox/p/prefs.js");
    fs::set_permissions(&t, fs::Permissions::from_mode(0o640)).expect("chmod");
    ccfs::sys::lsetxattr(&t, OsStr::new("user.tag"), b"v", 0).expect("xattr");
    ccfs::sys::utimens(
        &t,
        ccfs::sys::SetTime::At {
            secs: 1_000_000,
            nsecs: 5,
        },
        ccfs::sys::SetTime::At {
            secs: 2_000_000,
            nsecs: 7,
        },
    )
    .expect("times");
    let o = env.overlay();
    let rel = Path::new(".mozilla/firefox/p/prefs.js");
    let before = o.resolve(rel).expect("resolve");
    assert_eq!(before.layer, Layer::Lower);
    // A metadata-only change copies up with data, mode, times and xattrs.
    o.setxattr(&ctx(), rel, OsStr::new("user.other"), b"w", 0)
        .expect("setxattr");
    let after = o.resolve(rel).expect("resolve");
    assert_eq!(after.layer, Layer::Upper);
    assert_eq!(
        read_file(&o, ".mozilla/firefox/p/prefs.js"),
        b"user_pref(1);"
    );
    assert_eq!(after.meta.mode() & 0o7777, 0o640);
    // The share's mtime, as it keeps it (a share with whole seconds drops the 7 ns).
    let theirs = fs::metadata(&t).expect("stat");
    assert_eq!(after.meta.mtime(), (2_000_000, theirs.mtime_nsec()));
    assert_eq!(
        o.getxattr(rel, OsStr::new("user.tag"))
            .expect("copied xattr"),
        b"v"
    );
    // Only that one file was copied, not its siblings; the parents exist as directories.
    assert!(!env.cache.join("upper/.mozilla/firefox/p/other.js").exists());
    assert!(env.cache.join("upper/.mozilla/firefox/p").is_dir());
    assert_eq!(
        o.resolve(Path::new(".mozilla/firefox/p/other.js"))
            .expect("r")
            .layer,
        Layer::Lower
    );
    // The share is untouched until sync.
    assert!(ccfs::sys::lgetxattr(&t, OsStr::new("user.other")).is_err());
    env.sync(&o, SyncMode::Session);
    assert_eq!(
        ccfs::sys::lgetxattr(&t, OsStr::new("user.other")).expect("synced"),
        b"w"
    );
}

#[test]
fn whiteouts_hide_share_files_until_sync_deletes_them() {
    let env = Env::new();
    fs::create_dir(env.share.join(".d")).expect("mkdir");
    fs::write(env.share.join(".d/x"), "x").expect("w");
    fs::write(env.share.join(".d/y"), "y").expect("w");
    let o = env.overlay();
    o.unlink(Path::new(".d"), OsStr::new("x")).expect("unlink");
    assert!(o.resolve(Path::new(".d/x")).is_err());
    let names: Vec<_> = o
        .readdir(Path::new(".d"))
        .expect("ls")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("y")]);
    assert!(env.share.join(".d/x").exists());
    let err = o
        .rmdir(Path::new(""), OsStr::new(".d"))
        .expect_err("not empty");
    assert_eq!(err.errno(), libc::ENOTEMPTY);
    o.unlink(Path::new(".d"), OsStr::new("y")).expect("unlink");
    o.rmdir(Path::new(""), OsStr::new(".d")).expect("rmdir");
    // Recreating the directory does not bring back the deleted share files.
    o.mkdir(&ctx(), Path::new(""), OsStr::new(".d"), 0o755)
        .expect("mkdir");
    assert!(o.readdir(Path::new(".d")).expect("ls").is_empty());
    env.sync(&o, SyncMode::Session);
    assert!(env.share.join(".d").is_dir());
    assert_eq!(fs::read_dir(env.share.join(".d")).expect("ls").count(), 0);
}

/// A create of a dotfile while the share does not answer (a program's open with O_CREAT
/// after the kernel remembered the name as missing): the cache may not make an empty file
/// over what the share may hold. A recorded base for the name (here the database's, taken
/// with its journal) does not tell that the name is free; only a base of nothing does.
#[test]
fn a_create_while_the_share_does_not_answer_never_replaces_the_shares_file() {
    let env = Env::new();
    fs::write(env.share.join(".x.db"), "precious").expect("w");
    let o = env.overlay();
    // The database's journal: its base and the database's are recorded.
    write_file(&o, ".x.db-journal", b"j");
    // A name taken over when the share had nothing there, then removed.
    write_file(&o, ".new", b"first");
    o.unlink(Path::new(""), OsStr::new(".new")).expect("unlink");
    o.share_gate().set_closed(true);
    let err = o
        .create(
            &ctx(),
            Path::new(""),
            OsStr::new(".x.db"),
            0o644,
            libc::O_RDWR,
        )
        .map(|_| ())
        .expect_err("the share may hold .x.db: no empty file made over it");
    assert!(
        matches!(err.errno(), libc::ENOTCONN | libc::EIO),
        "errno {}",
        err.errno()
    );
    let (_, f, w) = o
        .create(
            &ctx(),
            Path::new(""),
            OsStr::new(".new"),
            0o644,
            libc::O_RDWR,
        )
        .expect("a name whose base is 'nothing there' can be made while the share is down");
    drop(f);
    if let Some(w) = w {
        o.release_writer(w);
    }
    o.link(
        &ctx(),
        Path::new(".new"),
        Path::new(""),
        OsStr::new(".x.db"),
    )
    .expect_err("no hard link made over what the share may hold either");
    o.share_gate().set_closed(false);
    assert_eq!(read_file(&o, ".x.db"), b"precious");
    env.sync(&o, SyncMode::Session);
    assert_eq!(fs::read(env.share.join(".x.db")).expect("r"), b"precious");
    assert_eq!(fs::read(env.share.join(".new")).expect("r"), b"");
}

#[test]
fn renaming_a_share_directory_under_a_cached_path_asks_for_a_copy() {
    let env = Env::new();
    fs::create_dir_all(env.share.join(".a/sub")).expect("mkdir");
    let o = env.overlay();
    let e = o
        .rename(
            &ctx(),
            Path::new(".a"),
            OsStr::new("sub"),
            Path::new(".a"),
            OsStr::new("moved"),
            0,
        )
        .expect_err("exdev");
    assert_eq!(e.errno(), libc::EXDEV);
    // A directory made in this session renames freely.
    o.mkdir(&ctx(), Path::new(".a"), OsStr::new("new"), 0o755)
        .expect("mkdir");
    write_file(&o, ".a/new/f", b"f");
    o.rename(
        &ctx(),
        Path::new(".a"),
        OsStr::new("new"),
        Path::new(".a"),
        OsStr::new("renamed"),
        0,
    )
    .expect("rename");
    assert_eq!(read_file(&o, ".a/renamed/f"), b"f");
    env.sync(&o, SyncMode::Session);
    assert_eq!(
        fs::read(env.share.join(".a/renamed/f")).expect("synced"),
        b"f"
    );
    assert!(!env.share.join(".a/new").exists());
}

#[test]
fn classes_cross_with_exdev_and_local_only_ignores_the_share() {
    let env = Env::new();
    fs::create_dir_all(env.share.join(".cache/old")).expect("mkdir");
    fs::write(env.share.join("doc"), "d").expect("w");
    let o = env.overlay();
    assert!(
        o.resolve(Path::new(".cache")).is_err(),
        "the share's .cache is not used"
    );
    let names: Vec<_> = o
        .readdir(Path::new(""))
        .expect("ls")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("doc")]);
    let e = o
        .rename(
            &ctx(),
            Path::new(""),
            OsStr::new("doc"),
            Path::new(""),
            OsStr::new(".doc"),
            0,
        )
        .expect_err("cross-class");
    assert_eq!(e.errno(), libc::EXDEV);
    write_file(&o, "doc", b"changed");
    assert_eq!(
        fs::read(env.share.join("doc")).expect("r"),
        b"changed",
        "passthrough"
    );
}

#[test]
fn sync_snapshot_lists_dirty_files_and_deepest_deletions_first() {
    let env = Env::new();
    fs::create_dir_all(env.share.join(".x/y")).expect("mkdir");
    fs::write(env.share.join(".x/y/z"), "z").expect("w");
    let o = env.overlay();
    write_file(&o, ".b", b"b");
    write_file(&o, ".a", b"a");
    o.unlink(Path::new(".x/y"), OsStr::new("z")).expect("rm");
    o.rmdir(Path::new(".x"), OsStr::new("y")).expect("rmdir");
    let snap = o.begin_sync("h", "s").expect("snap");
    assert_eq!(snap.files, vec![PathBuf::from(".a"), PathBuf::from(".b")]);
    assert_eq!(
        snap.deletions,
        vec![PathBuf::from(".x/y/z"), PathBuf::from(".x/y")]
    );
    drop(snap);
    assert!(
        o.lock().state().sending().next().is_none(),
        "an unfinished session settles when dropped"
    );
}

#[test]
fn a_write_during_sync_keeps_the_file_dirty() {
    let env = Env::new();
    let o = env.overlay();
    write_file(&o, ".f", b"one");
    let snap = o.begin_sync("h", "s").expect("snap");
    let (t, _) = run_rsync(&env.rsync(), o.upper(), o.share(), &snap.files).expect("rsync");
    // The file changes after rsync read it but before the sync finishes.
    write_file(&o, ".f", b"two");
    snap.finish(t).expect("finish");
    assert!(
        o.lock().state().is_dirty(Path::new(".f")),
        "must stay dirty"
    );
    // Same for a handle that stays open across the sync.
    env.sync(&o, SyncMode::Session);
    let (mut f, w) = o
        .open(&ctx(), Path::new(".f"), libc::O_WRONLY)
        .expect("open");
    let snap = o.begin_sync("h", "s").expect("snap");
    let (t, _) = run_rsync(&env.rsync(), o.upper(), o.share(), &snap.files).expect("rsync");
    f.write_all(b"three").expect("write");
    snap.finish(t).expect("finish");
    assert!(o.lock().state().is_dirty(Path::new(".f")));
    drop(f);
    o.release_writer(w.expect("writer"));
}

/// After a crash, a program may still write a cached file through kernel passthrough (the
/// kernel writes the cache's file itself, without the daemon): emptying the cache keeps a
/// file still open for writing, and one written after the sync handed it to rsync, as
/// unsynced work; the next recovery sends what was written and empties the cache.
#[test]
fn a_recovery_keeps_files_written_without_the_daemon() {
    let env = Env::new();
    let o = env.overlay();
    write_file(&o, ".held", b"one");
    write_file(&o, ".late", b"one");
    write_file(&o, ".done", b"done");
    drop(o); // kill -9: gone without a sync
    let upper = env.cache.join("upper");
    // A descriptor open for writing on the cache's file, as a passthrough open keeps it.
    let mut holder = fs::OpenOptions::new()
        .append(true)
        .open(upper.join(".held"))
        .expect("hold");
    // A program that writes `.late` once rsync has read it, and then lets go of it.
    let flag = env.cache.parent().expect("tmp").join("wrote-late");
    let wrapper = env.cache.parent().expect("tmp").join("rsync-then-write");
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n'{}' \"$@\"; rc=$?\nif [ ! -e '{f}' ]; then : > '{f}'; printf ' two' >> '{}'; fi\nexit $rc\n",
            env.rsync().binary.display(),
            upper.join(".late").display(),
            f = flag.display(),
        ),
    )
    .expect("wrapper");
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut opts = env.rsync();
    opts.binary = wrapper;

    let o = env.overlay();
    let out = ccfs::daemon::recover_overlay(&o, &opts).expect("work to recover");
    let r = out.report.expect("report");
    assert_eq!(
        r.kept_open,
        vec![PathBuf::from(".held"), PathBuf::from(".late")],
        "{r:?}"
    );
    assert!(!r.cache_dropped && !out.ok, "{r:?}");
    assert_eq!(r.remaining_dirty, 2, "{r:?}");
    assert_eq!(fs::read(env.share.join(".held")).expect("r"), b"one");
    // `.held`, open for writing, goes as a snapshot in an rsync of its own, before the
    // one that sends `.late`: the wrapper's write may come before `.late` is read.
    let late = fs::read(env.share.join(".late")).expect("r");
    assert!(late == b"one" || late == b"one two", "{late:?}");
    assert_eq!(fs::read(env.share.join(".done")).expect("r"), b"done");
    assert_eq!(
        fs::read(upper.join(".done")).expect("a clean copy"),
        b"done",
        "what is on the share stays as a clean copy"
    );
    assert!(!o.lock().state().is_dirty(Path::new(".done")));
    assert!(o.lock().state().is_dirty(Path::new(".held")));
    assert!(o.lock().state().is_dirty(Path::new(".late")));
    holder
        .write_all(b" more")
        .expect("a write after the recovery");
    drop(holder);
    drop(o);

    // The next session (its recovery) sends both and empties the cache.
    let o = env.overlay();
    let out = ccfs::daemon::recover_overlay(&o, &opts).expect("kept work to recover");
    assert!(out.ok, "{out:?}");
    let r = out.report.expect("report");
    assert!(r.kept_open.is_empty() && r.cache_dropped, "{r:?}");
    assert_eq!(fs::read(env.share.join(".held")).expect("r"), b"one more");
    assert_eq!(fs::read(env.share.join(".late")).expect("r"), b"one two");
    // Only clean copies stay, each as the share has it.
    for name in [".held", ".late", ".done"] {
        assert_eq!(
            fs::read(upper.join(name)).expect("clean copy"),
            fs::read(env.share.join(name)).expect("share"),
            "{name}"
        );
    }
    assert!(!o.has_unsynced_work());
}

#[test]
fn a_failed_rsync_clears_nothing() {
    let env = Env::new();
    let o = env.overlay();
    write_file(&o, ".f", b"data");
    let mut opts = env.rsync();
    opts.extra_args = vec!["--no-such-rsync-option".into()];
    let r = run_sync(&o, &opts, SyncMode::Session).expect("the sync runs");
    assert!(!r.ok, "{r:?}");
    assert!(r.errors.iter().any(|e| e.contains("rsync exit")), "{r:?}");
    assert_eq!(r.not_sent, vec![PathBuf::from(".f")]);
    assert!(o.lock().state().is_dirty(Path::new(".f")));
    assert!(!env.share.join(".f").exists());
    env.sync(&o, SyncMode::Session);
    assert_eq!(fs::read(env.share.join(".f")).expect("r"), b"data");
}

/// Two share files of one size with one mtime (written in one tick of the kernel's coarse
/// clock, or copied with their times), one renamed over the other here, then a sync whose
/// rsync fails before it sends anything or reports: the share's old file there is not
/// taken for the transfer (it would be marked sent and the source deleted on the share,
/// and the renamed file's content lost).
#[test]
fn a_failed_sync_takes_no_same_size_same_mtime_file_for_its_transfer() {
    let env = Env::new();
    fs::create_dir(env.share.join(".c")).expect("mkdir");
    let t = fs::FileTimes::new()
        .set_accessed(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        .set_modified(UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    for (name, data) in [(".c/b", b"old"), (".c/e", b"new")] {
        fs::write(env.share.join(name), data).expect("write");
        let f = fs::File::options()
            .write(true)
            .open(env.share.join(name))
            .expect("open");
        f.set_times(t).expect("times");
    }
    let o = env.overlay();
    rename_path(&o, Path::new(".c/e"), Path::new(".c/b")).expect("rename");
    let mut opts = env.rsync();
    opts.extra_args = vec!["--no-such-rsync-option".into()];
    let r = run_sync(&o, &opts, SyncMode::Session).expect("the sync runs");
    assert!(!r.ok, "{r:?}");
    assert_eq!(r.not_sent, vec![PathBuf::from(".c/b")], "{r:?}");
    assert_eq!(r.remaining_deletions, 1, "{r:?}");
    assert_eq!(fs::read(env.share.join(".c/e")).expect("r"), b"new");
    assert_eq!(read_file(&o, ".c/b"), b"new");
    env.sync(&o, SyncMode::Session);
    assert_eq!(fs::read(env.share.join(".c/b")).expect("r"), b"new");
    assert!(!env.share.join(".c/e").exists());
}

#[test]
fn setattr_truncate_and_chmod_copy_up() {
    let env = Env::new();
    fs::write(env.share.join(".t"), "0123456789").expect("w");
    let o = env.overlay();
    let m = o
        .setattr(
            &ctx(),
            Path::new(".t"),
            SetAttr {
                size: Some(4),
                mode: Some(0o600),
                ..Default::default()
            },
            None,
        )
        .expect("setattr");
    assert_eq!(o.resolve(Path::new(".t")).expect("r").layer, Layer::Upper);
    assert_eq!(m.len(), 4);
    assert_eq!(m.mode() & 0o777, 0o600);
    assert_eq!(fs::read(env.share.join(".t")).expect("r"), b"0123456789");
    env.sync(&o, SyncMode::Session);
    assert_eq!(fs::read(env.share.join(".t")).expect("r"), b"0123");
    assert_eq!(
        fs::metadata(env.share.join(".t")).expect("m").mode() & 0o777,
        0o600
    );
}

// ---- reference model -------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    File(Vec<u8>, u32),
    Dir,
}

type Tree = BTreeMap<PathBuf, Node>;

const NAMES: &[&str] = &[
    ".c/a", ".c/b", ".c/d", ".c/d/a", ".c/d/b", ".c/e", ".c/e/a", ".c/e/f", ".c/e/f/a",
];

thread_local! {
    /// The directory this thread's operations work in: the model's names are below `.c`,
    /// which the concurrent test replaces with a directory of each thread's own.
    static ROOT: std::cell::Cell<&'static str> = const { std::cell::Cell::new(".c") };
}

/// The path of the model's name `i`, below this thread's [`ROOT`].
fn name_at(i: usize) -> PathBuf {
    let root = ROOT.with(|r| r.get());
    PathBuf::from(NAMES[i].replacen(".c", root, 1))
}

#[derive(Debug, Clone)]
enum Op {
    Write(usize, u8, usize),
    Append(usize, u8),
    Unlink(usize),
    Mkdir(usize),
    Rmdir(usize),
    Rename(usize, usize),
    Chmod(usize, u32),
    Link(usize, usize),
    /// Sets an old mtime (`cp -p`, `touch -d`, a workstation clock behind the server).
    Backdate(usize),
    Sync,
    Crash,
    /// The daemon dies while rsync has sent the first k (mod n+1) of its n files.
    CrashInSync(usize),
    /// A clean logout, then the next login on the same workstation.
    Logout,
}

fn arb_op() -> impl Strategy<Value = Op> {
    let n = NAMES.len();
    prop_oneof![
        4 => (0..n, any::<u8>(), 0..3000usize).prop_map(|(p, b, l)| Op::Write(p, b, l)),
        2 => (0..n, any::<u8>()).prop_map(|(p, b)| Op::Append(p, b)),
        2 => (0..n).prop_map(Op::Unlink),
        3 => (0..n).prop_map(Op::Mkdir),
        1 => (0..n).prop_map(Op::Rmdir),
        3 => (0..n, 0..n).prop_map(|(a, b)| Op::Rename(a, b)),
        1 => (0..n, prop::sample::select(vec![0o600u32, 0o644, 0o755])).prop_map(|(p, m)| Op::Chmod(p, m)),
        1 => (0..n, 0..n).prop_map(|(a, b)| Op::Link(a, b)),
        1 => (0..n).prop_map(Op::Backdate),
        1 => Just(Op::Sync),
        1 => Just(Op::Crash),
        1 => (0..8usize).prop_map(Op::CrashInSync),
        1 => Just(Op::Logout),
    ]
}

fn share_tree(root: &Path) -> Tree {
    share_tree_at(root, ".c")
}

fn share_tree_at(root: &Path, top: &str) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![PathBuf::from(top)];
    while let Some(rel) = stack.pop() {
        let p = root.join(&rel);
        let Ok(meta) = fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            out.insert(rel.clone(), Node::Dir);
            for e in fs::read_dir(&p).expect("ls") {
                stack.push(rel.join(e.expect("entry").file_name()));
            }
        } else {
            out.insert(
                rel,
                Node::File(fs::read(&p).expect("read"), meta.mode() & 0o7777),
            );
        }
    }
    out
}

fn parent_is_dir(t: &Tree, p: &Path) -> bool {
    matches!(p.parent().and_then(|q| t.get(q)), Some(Node::Dir))
}

fn has_children(t: &Tree, p: &Path) -> bool {
    t.keys().any(|k| k != p && k.starts_with(p))
}

/// Applies an op to the model; returns whether POSIX says it succeeds.
fn model_apply(t: &mut Tree, op: &Op, links: &mut Vec<(PathBuf, PathBuf)>) -> bool {
    let p = |i: &usize| name_at(*i);
    match op {
        Op::Write(i, b, len) => {
            let path = p(i);
            if !parent_is_dir(t, &path) || matches!(t.get(&path), Some(Node::Dir)) {
                return false;
            }
            let mode = match t.get(&path) {
                Some(Node::File(_, m)) => *m,
                _ => 0o644,
            };
            set_file(t, links, &path, vec![*b; *len], mode);
            true
        }
        Op::Append(i, b) => match t.get(&p(i)).cloned() {
            Some(Node::File(mut d, m)) => {
                d.push(*b);
                set_file(t, links, &p(i), d, m);
                true
            }
            _ => false,
        },
        Op::Unlink(i) => match t.get(&p(i)) {
            Some(Node::File(..)) => {
                t.remove(&p(i));
                links.retain(|(a, b)| a != &p(i) && b != &p(i));
                true
            }
            _ => false,
        },
        Op::Mkdir(i) => {
            if !parent_is_dir(t, &p(i)) || t.contains_key(&p(i)) {
                return false;
            }
            t.insert(p(i), Node::Dir);
            true
        }
        Op::Rmdir(i) => {
            if !matches!(t.get(&p(i)), Some(Node::Dir)) || has_children(t, &p(i)) {
                return false;
            }
            t.remove(&p(i));
            true
        }
        Op::Chmod(i, m) => match t.get_mut(&p(i)) {
            Some(Node::File(d, mode)) => {
                *mode = *m;
                let d = d.clone();
                set_file(t, links, &p(i), d, *m);
                true
            }
            _ => false,
        },
        Op::Backdate(i) => matches!(t.get(&p(i)), Some(Node::File(..))),
        Op::Rename(..) | Op::Link(..) | Op::Sync | Op::Crash | Op::CrashInSync(_) | Op::Logout => {
            unreachable!("handled by the caller")
        }
    }
}

/// Writes a file's content in the model and in every name hard-linked to it.
fn set_file(t: &mut Tree, links: &[(PathBuf, PathBuf)], path: &Path, data: Vec<u8>, mode: u32) {
    let mut names = vec![path.to_path_buf()];
    let mut changed = true;
    while changed {
        changed = false;
        for (a, b) in links {
            for (x, y) in [(a, b), (b, a)] {
                if names.contains(x) && !names.contains(y) {
                    names.push(y.clone());
                    changed = true;
                }
            }
        }
    }
    for n in names {
        t.insert(n, Node::File(data.clone(), mode));
    }
}

fn run_model(initial: Vec<(usize, u8)>, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let env = Env::new();
    fs::create_dir(env.share.join(".c")).expect("mkdir");
    let mut model = Tree::new();
    model.insert(PathBuf::from(".c"), Node::Dir);
    for (i, b) in initial {
        let path = PathBuf::from(NAMES[i]);
        if parent_is_dir(&model, &path) && !model.contains_key(&path) {
            if b % 3 == 0 {
                fs::create_dir(env.share.join(&path)).expect("mkdir");
                model.insert(path, Node::Dir);
            } else {
                fs::write(env.share.join(&path), vec![b; 10]).expect("w");
                fs::set_permissions(env.share.join(&path), fs::Permissions::from_mode(0o644))
                    .expect("chmod");
                model.insert(path, Node::File(vec![b; 10], 0o644));
            }
        }
    }
    let mut o = env.overlay();
    let mut links: Vec<(PathBuf, PathBuf)> = Vec::new();
    for op in &ops {
        match op {
            Op::Sync => {
                env.sync(&o, SyncMode::Session);
                prop_assert_eq!(&share_tree(&env.share), &model, "after sync");
            }
            Op::Crash => {
                // The daemon dies without syncing; the next start recovers from the journal.
                drop(o);
                o = env.overlay();
                env.sync(&o, SyncMode::Recover);
                prop_assert_eq!(&share_tree(&env.share), &model, "after crash + recovery");
                // The cache is emptied: the links are the share's now, which a change
                // through one name breaks (a known limit).
                links.clear();
            }
            Op::CrashInSync(k) => {
                {
                    let session = o.begin_sync("h", "s").expect("begin");
                    let n = session.files.len();
                    let part = &session.files[..k % (n + 1)];
                    if !part.is_empty() {
                        run_rsync(&env.rsync(), o.upper(), o.share(), part).expect("rsync");
                    }
                    // The daemon is killed: nothing settles.
                    std::mem::forget(session);
                }
                drop(o);
                o = env.overlay();
                env.sync(&o, SyncMode::Recover);
                prop_assert_eq!(&share_tree(&env.share), &model, "after a crash in a sync");
                links.clear();
            }
            Op::Logout => {
                env.sync(&o, SyncMode::Logout);
                prop_assert_eq!(&share_tree(&env.share), &model, "after logout");
                drop(o);
                // A clean logout leaves only clean copies: files as the share has them.
                let upper = share_tree_at(&env.cache.join("upper"), ".c");
                for (p, n) in &upper {
                    if let Node::File(..) = n {
                        prop_assert_eq!(
                            Some(n),
                            model.get(p),
                            "a clean logout leaves only clean copies in the cache: {:?}",
                            p
                        );
                    }
                }
                o = env.overlay();
                prop_assert!(!o.has_unsynced_work(), "and nothing to recover");
                links.clear();
            }
            Op::Rename(a, b) => {
                let (from, to) = (PathBuf::from(NAMES[*a]), PathBuf::from(NAMES[*b]));
                // Two names of one file on the share (hard links sent by an earlier sync,
                // which the model forgets at a crash): one object behind both names.
                let one_object = match (o.resolve(&from), o.resolve(&to)) {
                    (Ok(f), Ok(t)) => {
                        !f.meta.is_dir()
                            && f.layer == t.layer
                            && (f.meta.dev(), f.meta.ino()) == (t.meta.dev(), t.meta.ino())
                    }
                    _ => false,
                };
                let r = rename_path(&o, &from, &to);
                let same_file = (from == to && model.contains_key(&from))
                    || one_object
                    || links
                        .iter()
                        .any(|(x, y)| (x == &from && y == &to) || (x == &to && y == &from));
                let expect = if same_file {
                    Some(model.clone()) // two names of one file: rename does nothing
                } else {
                    model_rename(&model, &from, &to)
                };
                match (&r, expect) {
                    (Ok(()), Some(_)) if same_file => {}
                    (Ok(()), Some(new_model)) => {
                        model = new_model;
                        let (f, t2) = (from.clone(), to.clone());
                        links.retain(|(x, y)| x != &t2 && y != &t2);
                        for l in links.iter_mut() {
                            for side in [&mut l.0, &mut l.1] {
                                if let Ok(rest) = side.strip_prefix(&f) {
                                    *side = if rest.as_os_str().is_empty() {
                                        t2.clone()
                                    } else {
                                        t2.join(rest)
                                    };
                                }
                            }
                        }
                    }
                    (Err(e), Some(_)) if e.errno() == libc::EXDEV => {
                        prop_assert!(
                            matches!(model.get(&from), Some(Node::Dir)),
                            "EXDEV only for directories"
                        );
                    }
                    (Err(_), None) => {}
                    (r, e) => prop_assert!(
                        false,
                        "rename {:?} -> {:?}: ccfs {:?}, model {:?}",
                        from,
                        to,
                        r.is_ok(),
                        e.is_some()
                    ),
                }
            }
            Op::Link(a, b) => {
                let (from, to) = (PathBuf::from(NAMES[*a]), PathBuf::from(NAMES[*b]));
                let r = o.link(
                    &ctx(),
                    &from,
                    to.parent().expect("p"),
                    to.file_name().expect("n"),
                );
                let ok = matches!(model.get(&from), Some(Node::File(..)))
                    && parent_is_dir(&model, &to)
                    && !model.contains_key(&to);
                prop_assert_eq!(r.is_ok(), ok, "link {:?} -> {:?}", from, to);
                if ok {
                    let node = model.get(&from).cloned().expect("file");
                    model.insert(to.clone(), node);
                    links.push((from, to));
                }
            }
            other => {
                let ok = model_apply(&mut model.clone(), other, &mut links.clone());
                let r = apply_ccfs(&o, other);
                prop_assert_eq!(r, ok, "{:?}", other);
                if ok {
                    model_apply(&mut model, other, &mut links);
                }
            }
        }
    }
    env.sync(&o, SyncMode::Session);
    prop_assert_eq!(
        &share_tree(&env.share),
        &model,
        "after the final logout sync"
    );
    Ok(())
}

/// `rename(from, to)` on the overlay.
fn rename_path(o: &Overlay, from: &Path, to: &Path) -> ccfs::error::FsResult<()> {
    o.rename(
        &ctx(),
        from.parent().expect("p"),
        from.file_name().expect("n"),
        to.parent().expect("p"),
        to.file_name().expect("n"),
        0,
    )
}

fn model_rename(t: &Tree, from: &Path, to: &Path) -> Option<Tree> {
    let src = t.get(from)?.clone();
    if !parent_is_dir(t, to) || to.starts_with(from) && to != from {
        return None;
    }
    if from == to {
        return Some(t.clone());
    }
    match (&src, t.get(to)) {
        (Node::Dir, Some(Node::File(..))) | (Node::File(..), Some(Node::Dir)) => return None,
        (Node::Dir, Some(Node::Dir)) if has_children(t, to) => return None,
        _ => {}
    }
    let mut out = t.clone();
    out.retain(|k, _| !k.starts_with(to));
    let moved: Vec<(PathBuf, Node)> = t
        .iter()
        .filter(|(k, _)| k.starts_with(from))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, _) in &moved {
        out.remove(k);
    }
    for (k, v) in moved {
        let rest = k.strip_prefix(from).expect("prefix");
        let nk = if rest.as_os_str().is_empty() {
            to.to_path_buf()
        } else {
            to.join(rest)
        };
        out.insert(nk, v);
    }
    Some(out)
}

fn apply_ccfs(o: &Overlay, op: &Op) -> bool {
    let p = |i: &usize| name_at(*i);
    let split = |path: &Path| {
        (
            path.parent().expect("p").to_path_buf(),
            path.file_name().expect("n").to_os_string(),
        )
    };
    match op {
        Op::Write(i, b, len) => {
            let path = p(i);
            let (parent, name) = split(&path);
            let file = match o.resolve(&path) {
                Ok(f) if f.meta.is_dir() => return false,
                Ok(_) => o.open(&ctx(), &path, libc::O_WRONLY | libc::O_TRUNC),
                Err(_) => o
                    .create(&ctx(), &parent, &name, 0o644, libc::O_WRONLY)
                    .map(|(_, f, w)| (f, w)),
            };
            match file {
                Ok((mut f, w)) => {
                    f.write_all(&vec![*b; *len]).expect("write");
                    drop(f);
                    if let Some(w) = w {
                        o.release_writer(w);
                    }
                    true
                }
                Err(_) => false,
            }
        }
        Op::Append(i, b) => match o.resolve(&p(i)) {
            Ok(f) if f.meta.is_file() => {
                let (mut f, w) = o
                    .open(&ctx(), &p(i), libc::O_WRONLY | libc::O_APPEND)
                    .expect("open");
                f.write_all(&[*b]).expect("append");
                drop(f);
                if let Some(w) = w {
                    o.release_writer(w);
                }
                true
            }
            _ => false,
        },
        Op::Unlink(i) => {
            let (parent, name) = split(&p(i));
            o.unlink(&parent, &name).is_ok()
        }
        Op::Mkdir(i) => {
            let (parent, name) = split(&p(i));
            o.mkdir(&Ctx { umask: 0, ..ctx() }, &parent, &name, 0o755)
                .is_ok()
        }
        Op::Rmdir(i) => {
            let (parent, name) = split(&p(i));
            o.rmdir(&parent, &name).is_ok()
        }
        Op::Chmod(i, m) => match o.resolve(&p(i)) {
            Ok(f) if f.meta.is_file() => o
                .setattr(
                    &ctx(),
                    &p(i),
                    SetAttr {
                        mode: Some(*m),
                        ..Default::default()
                    },
                    None,
                )
                .is_ok(),
            _ => false,
        },
        Op::Backdate(i) => match o.resolve(&p(i)) {
            Ok(f) if f.meta.is_file() => {
                let old = ccfs::sys::SetTime::At {
                    secs: 1_000_000_000,
                    nsecs: 0,
                };
                o.setattr(
                    &ctx(),
                    &p(i),
                    SetAttr {
                        atime: Some(old),
                        mtime: Some(old),
                        ..Default::default()
                    },
                    None,
                )
                .is_ok()
            }
            _ => false,
        },
        Op::Rename(..) | Op::Link(..) | Op::Sync | Op::Crash | Op::CrashInSync(_) | Op::Logout => {
            unreachable!()
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: model::cases(std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48)),
        max_shrink_iters: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn share_equals_the_model_after_logout(
        initial in prop::collection::vec((0..NAMES.len(), any::<u8>()), 0..8),
        ops in prop::collection::vec(arb_op(), 1..40),
    ) {
        run_model(initial, ops)?;
    }
}

/// Regression (from the model): a file copied up for a hard link, then changed through the
/// first name; both names reach the share with the new content.
#[test]
fn model_regression_link_then_append() {
    run_model(
        vec![(0, 28)],
        vec![Op::Link(0, 1), Op::Rename(1, 1), Op::Append(0, 0)],
    )
    .expect("model");
}

/// Regression (from the model): a directory on the share removed and replaced by a file is
/// no conflict (the base remembers the directory).
#[test]
fn model_regression_directory_replaced_by_a_file() {
    run_model(vec![(0, 45)], vec![Op::Rmdir(0), Op::Write(0, 0, 0)]).expect("model");
}

/// Regression (from the model): a synced directory removed, then a new file renamed onto
/// its name.
#[test]
fn model_regression_rename_onto_a_removed_synced_directory() {
    run_model(
        vec![],
        vec![
            Op::Mkdir(5),
            Op::Sync,
            Op::Rmdir(5),
            Op::Write(2, 0, 0),
            Op::Rename(2, 5),
        ],
    )
    .expect("model");
}

/// Regression (from the model): rename of one name of a hard-linked file onto the other.
#[test]
fn model_regression_rename_between_two_names_of_one_file() {
    run_model(
        vec![],
        vec![Op::Write(5, 0, 0), Op::Link(5, 2), Op::Rename(2, 5)],
    )
    .expect("model");
}

/// Regression (from the model): after a crash and its recovery the cache is emptied, so two
/// names linked on the share are copied up one at a time (the link breaks, a known limit).
#[test]
fn model_regression_hard_links_after_a_recovery_are_the_shares() {
    run_model(
        vec![(5, 1)],
        vec![
            Op::Link(5, 0),
            Op::Mkdir(2),
            Op::Rename(5, 3),
            Op::Crash,
            Op::Write(3, 0, 0),
        ],
    )
    .expect("model");
}

// ---- sessions on two workstations ------------------------------------------------

mod model;

/// The sessions model's cases: `cases` of them, a failure shrunk for up to five minutes.
fn sessions_config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        max_shrink_iters: 2000,
        max_shrink_time: 300_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// One user on two workstations: the share and both views equal the model after every
/// step; every sync reports what the model predicts; see `model`. (Every file taken over
/// from the share is held by block, unless `CCFS_MODEL_BY_BLOCK=0`.) The cases must have
/// played files whose cache files lack blocks, and writes into such blocks (but on a share
/// that keeps whole seconds, where a file changed in the second of its take-over, as
/// nearly every file of the model is, is copied whole: its base stands by its content).
#[test]
fn two_workstations_share_equals_the_model() {
    let mut runner = proptest::test_runner::TestRunner::new(sessions_config(model::cases(128)));
    let cases = (
        model::arb_initial(),
        model::arb_skew(),
        model::arb_ops(1..40),
    );
    let (held_before, writes_before) = model::reference::coverage();
    let result = runner.run(&cases, |(initial, skew, ops)| {
        model::run_sessions(initial, skew, ops)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (held, writes) = model::reference::coverage();
    let by_block = std::env::var_os("CCFS_MODEL_BY_BLOCK").is_none_or(|v| v != "0");
    if by_block && model::cases(128) >= 16 && !model::share_keeps_whole_seconds() {
        assert!(
            held > held_before && writes > writes_before,
            "the cases played no file held by block that lacked blocks ({} learnings) or no write into one ({})",
            held - held_before,
            writes - writes_before
        );
    }
}

proptest! {
    #![proptest_config(sessions_config(model::cases(128) / 2))]

    /// The same with every file copied whole at its take-over (no file held by block:
    /// ccfs's default, `by_block_from_kib = 0`).
    #[test]
    fn two_workstations_copying_whole_files_share_equals_the_model(
        initial in model::arb_initial(),
        skew in model::arb_skew(),
        ops in model::arb_ops(1..40),
    ) {
        model::run_sessions_as(false, initial, skew, ops)?;
    }
}

/// Regression (from the sessions model): a file chmod-ed after it was synced has the size
/// and mtime the share already has; a sync whose rsync then fails before sending it must
/// not take the share's copy for its own transfer and mark the chmod clean: the share's
/// copy is still the object the sync took as the base.
#[test]
fn model_regression_a_chmod_alone_is_not_marked_sent_by_a_failed_sync() {
    use model::Op::*;
    model::run_sessions(
        vec![(2, 204), (4, 1)],
        [-model::SKEW, -model::SKEW],
        vec![
            Write(0, 3, 0, 0),
            Sync(0),
            Chmod(0, 3, 0o600),
            FailSync(0, 0, false),
        ],
    )
    .expect("model");
}

/// Regression (from the sessions model): workstation 1 removes the directory .c/d and
/// writes a file .c/d in its place; meanwhile workstation 0 makes a directory in the old
/// .c/d and logs out first. Sending the file over the share's directory (rsync --force)
/// removed workstation 0's directory in silence; now it is a conflict: the share keeps the
/// directory, our file goes beside it.
#[test]
fn model_regression_a_file_sent_over_a_directory_keeps_what_others_put_in_it() {
    use model::Op::*;
    model::run_sessions(
        vec![(2, 3)],
        [-model::SKEW, -model::SKEW],
        vec![Rmdir(1, 2), Mkdir(0, 6), Write(1, 2, 0, 0)],
    )
    .expect("model");
}

/// Regression (from the sessions model): workstation 1 makes the directory .c/d (synced by
/// a recovery) and a file in it; workstation 0 removes the then empty .c/d and writes a file
/// .c/d in its place, and logs out first. rsync made the missing parent directory in place
/// of workstation 0's file and removed it in silence; now workstation 1's directory goes to
/// a conflict name with what it holds.
#[test]
fn model_regression_a_file_whose_parent_became_a_file_elsewhere_goes_aside_with_it() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [-model::SKEW, -model::SKEW],
        vec![
            Mkdir(1, 2),
            Crash(1),
            Write(1, 3, 0, 0),
            Rmdir(0, 2),
            Write(0, 2, 0, 0),
        ],
    )
    .expect("model");
}

/// Regression (from the sessions model): workstation 1 makes the directory .c/d with a
/// file in it; workstation 0 writes a file .c/d and logs out first. rsync put workstation
/// 1's directory in place of that file and removed it in silence; now it is a conflict:
/// the share keeps the file, our directory (with what it holds) goes beside it.
#[test]
fn model_regression_a_directory_sent_over_a_file_keeps_the_file() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [-model::SKEW, -model::SKEW],
        vec![
            Mkdir(1, 2),
            Write(1, 4, 0, 0),
            Write(0, 2, 0, 0),
            FailSync(0, 0, false),
        ],
    )
    .expect("model");
}

/// Regression (a sequence written for the sessions model): workstation 0 makes .c/d with a
/// file in it and syncs; workstation 1 deletes both and logs out; workstation 0, which
/// still shows them (clean copies), renames .c/d to .c/b. Only the directory was marked
/// changed, so .c/b/a never reached the share and was gone after the logout; everything
/// that moves is now sent under its new name.
#[test]
fn model_regression_a_renamed_directory_takes_its_synced_files_along() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [0, 0],
        vec![
            Mkdir(0, 2),
            Write(0, 3, 1, 1),
            Sync(0),
            Unlink(1, 3),
            Rmdir(1, 2),
            Logout(1),
            Rename(0, 2, 1),
            Logout(0),
        ],
    )
    .expect("model");
}

/// Regression (from the sessions model): on a workstation whose files carry mtimes ten
/// years ahead, a synced file is written again and the next sync's rsync fails before
/// sending anything. The share's older copy has an mtime between the hand-over and the
/// cache copy's future mtime, and was taken for a version written during the sync: the new
/// write was marked sent and lost at the logout.
#[test]
fn model_regression_a_future_mtime_makes_no_older_share_copy_ours() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [0, model::SKEW],
        vec![
            Write(1, 0, 1, 1),
            Sync(1),
            Write(1, 0, 2, 2),
            FailSync(1, 0, false),
        ],
    )
    .expect("model");
}

/// Regression (from the model): a file linked under a second name, a crash, then the second
/// name renamed over the first (two names of one file: rename does nothing, POSIX).
#[test]
fn model_regression_link_crash_rename_over_own_link() {
    run_model(
        vec![],
        vec![
            Op::Write(1, 0, 0),
            Op::Link(1, 5),
            Op::Crash,
            Op::Rename(5, 1),
        ],
    )
    .expect("model");
}

/// Syncs started and ended in the concurrent test (odd while one runs), for its op logs.
static SYNCS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn brief_tree(t: &Tree) -> String {
    t.iter()
        .map(|(p, n)| match n {
            Node::Dir => format!("{}/", p.display()),
            Node::File(d, m) => format!(
                "{}={}x{}:{:o}",
                p.display(),
                d.first().copied().unwrap_or(0),
                d.len(),
                m
            ),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A small deterministic generator for the concurrent test's operations.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

fn random_op(rng: &mut Rng) -> Op {
    let n = NAMES.len();
    let b = rng.below(256) as u8;
    match rng.below(17) {
        0..=3 => Op::Write(rng.below(n), b, rng.below(3000)),
        4..=5 => Op::Append(rng.below(n), b),
        6..=7 => Op::Unlink(rng.below(n)),
        8..=10 => Op::Mkdir(rng.below(n)),
        11 => Op::Rmdir(rng.below(n)),
        12..=14 => Op::Rename(rng.below(n), rng.below(n)),
        15 => Op::Chmod(rng.below(n), [0o600, 0o644, 0o755][rng.below(3)]),
        _ => Op::Backdate(rng.below(n)),
    }
}

/// One program's operations in its own directory (this thread's [`ROOT`]), each checked
/// against the model as it runs (a mismatch panics with the last operations); returns the
/// model and the log of every operation (with the syncs running meanwhile).
fn play_alone(o: &Overlay, root: &'static str, seed: u64, ops: usize) -> (Tree, Vec<String>) {
    use std::sync::atomic::Ordering::SeqCst;
    ROOT.with(|r| r.set(root));
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut model = Tree::new();
    model.insert(PathBuf::from(root), Node::Dir);
    let mut log: Vec<String> = Vec::new();
    for step in 0..ops {
        let op = random_op(&mut rng);
        let before = SYNCS.load(SeqCst);
        let (got, want, next) = if let Op::Rename(a, b) = op {
            let (from, to) = (name_at(a), name_at(b));
            let r = rename_path(o, &from, &to);
            let expect = if from == to && model.contains_key(&from) {
                Some(model.clone())
            } else {
                model_rename(&model, &from, &to)
            };
            match (&r, expect) {
                (Ok(()), Some(new_model)) => (true, true, Some(new_model)),
                // A directory on the share is not moved here (EXDEV), as the model allows.
                (Err(e), Some(_))
                    if e.errno() == libc::EXDEV && matches!(model.get(&from), Some(Node::Dir)) =>
                {
                    (false, false, None)
                }
                (r, e) => (r.is_ok(), e.is_some(), None),
            }
        } else {
            let want = model_apply(&mut model.clone(), &op, &mut Vec::new());
            let got = apply_ccfs(o, &op);
            let mut next = model.clone();
            if want {
                model_apply(&mut next, &op, &mut Vec::new());
            }
            (got, want, Some(next))
        };
        log.push(format!(
            "{step}: {op:?} -> {got} (syncs {before}..{}) {}",
            SYNCS.load(SeqCst),
            brief_tree(&model)
        ));
        if got != want {
            if let Some(at) = std::env::var_os("CCFS_CONCURRENCY_LOG") {
                let mut seen = log.join("\n");
                for p in (0..NAMES.len()).map(name_at) {
                    let r = o.resolve(&p).map(|f| (f.layer, f.meta.is_dir()));
                    let up = o
                        .upper()
                        .join(&p)
                        .symlink_metadata()
                        .map(|m| m.is_dir())
                        .ok();
                    let sh = o
                        .share()
                        .join(&p)
                        .symlink_metadata()
                        .map(|m| m.is_dir())
                        .ok();
                    let ls = o.readdir(&p).map(|l| l.len()).ok();
                    seen.push_str(&format!(
                        "\n{p:?}: ccfs {r:?} upper {up:?} share {sh:?} ls {ls:?}"
                    ));
                }
                let _ = fs::write(at, seen);
            }
        }
        assert!(
            got == want,
            "seed {seed}, {root}, step {step}: {op:?}: ccfs {got}, model {want}; model before: {}\nlast operations:\n{}",
            brief_tree(&model),
            log[log.len().saturating_sub(15)..].join("\n")
        );
        if let Some(next) = next.filter(|_| want) {
            model = next;
        }
    }
    (model, log)
}

/// Several programs at once on one overlay, each in a directory of its own (two in the
/// cached class, two in the share's), while syncs run one after another as the periodic
/// sync does: every operation's outcome is the model's, and after the logout the share
/// holds exactly what each program's model says (no file resurrected, no conflict with
/// ourselves). Copy-ups happen outside the overlay's lock and are published after a check;
/// a sync takes its snapshot while files change and rsync reads them while they do.
/// `CCFS_CONCURRENCY_ROUNDS` sets the rounds (default 6); `CCFS_CONCURRENCY_LOG=FILE`
/// writes a failing program's operations and the merged view then to FILE.
#[test]
fn programs_at_once_and_syncs_meanwhile_agree_with_the_model() {
    const ROOTS: [&str; 4] = [".c0", ".c1", "c2", "c3"];
    let rounds: u64 = std::env::var("CCFS_CONCURRENCY_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    for round in 0..rounds {
        let env = Env::new();
        for root in ROOTS {
            fs::create_dir(env.share.join(root)).expect("mkdir");
        }
        let o = env.overlay();
        let mut syncs = Vec::new();
        let programs: Vec<(Tree, Vec<String>)> = std::thread::scope(|s| {
            let programs: Vec<_> = ROOTS
                .iter()
                .enumerate()
                .map(|(k, root)| {
                    let o = &o;
                    s.spawn(move || play_alone(o, root, round * 16 + k as u64 + 1, 300))
                })
                .collect();
            while programs.iter().any(|p| !p.is_finished()) {
                // A sync may be partial (a file renamed away while rsync reads it): what
                // it leaves is sent by the next one.
                SYNCS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let r = run_sync(&o, &env.rsync(), SyncMode::Session);
                SYNCS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                syncs.push(match r {
                    Ok(r) => format!("conflicts {:?}, errors {:?}", r.conflicts, r.errors),
                    Err(e) => format!("failed: {e}"),
                });
            }
            programs
                .into_iter()
                .map(|p| p.join().expect("a program found ccfs and the model apart"))
                .collect()
        });
        env.sync(&o, SyncMode::Logout);
        for (root, (model, log)) in ROOTS.iter().zip(&programs) {
            let got = share_tree_at(&env.share, root);
            assert!(
                &got == model,
                "round {round}, {root}, after the logout:\nshare {}\nmodel {}\nsyncs:\n{}\noperations:\n{}",
                brief_tree(&got),
                brief_tree(model),
                syncs.join("\n"),
                log.join("\n")
            );
        }
    }
}

/// A crash between an unlink's journal record and the removal in the cache (the record of
/// a name the share holds is written first): the next session finishes the removal. The
/// share's older copy does not come back, as it did when the cache's newer copy kept the
/// sync from deleting it and was then dropped unsent.
#[test]
fn an_unlink_cut_short_by_a_crash_is_finished_and_the_shares_older_copy_goes() {
    let env = Env::new();
    fs::write(env.share.join(".x"), "v1\n").expect("share file");
    {
        let o = env.overlay();
        let (mut f, writer) = o
            .open(&ctx(), Path::new(".x"), libc::O_WRONLY | libc::O_TRUNC)
            .expect("open");
        f.write_all(b"v2\n").expect("write");
        drop(f);
        if let Some(ino) = writer {
            o.release_writer(ino);
        }
        o.unlink(Path::new(""), OsStr::new(".x")).expect("unlink");
    }
    // What the crash left: the deletion journaled, the cache's file not removed yet.
    fs::write(env.cache.join("upper/.x"), "v2\n").expect("the cache's file");
    let o = env.overlay();
    assert!(
        o.resolve(Path::new(".x")).is_err(),
        "the deleted name shows nothing in the next session"
    );
    env.sync(&o, SyncMode::Recover);
    assert!(
        !env.share.join(".x").exists(),
        "the unlink is finished on the share: {:?}",
        fs::read_to_string(env.share.join(".x"))
    );
}

/// Regression (from the sessions model): a file in a directory another workstation made,
/// written again on this one while the share does not answer (the cache has the file from
/// the first write, which the sync sent).
#[test]
fn sessions_regression_a_write_during_an_outage_after_a_sync() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [-315360000, -315360000],
        vec![
            Mkdir(1, 2),
            Write(0, 2, 0, 0),
            Logout(1),
            Sync(0),
            ShareDown(0),
            Write(0, 2, 0, 0),
        ],
    )
    .expect("model");
}

/// Regression (from the model): a synced directory removed, then a hard link made at its
/// name. rsync 3.5, making the second name of a hard link where the share has a directory
/// while the first name is on the share already, asks for the default ACL of what is now
/// a file and exits 23 after the transfer (reproduced with rsync alone): the sync takes
/// that error for what it is (a file has no default ACL) and settles by rsync's report.
#[test]
fn model_regression_a_hard_link_at_a_removed_synced_directory() {
    run_model(
        vec![],
        vec![
            Op::Write(1, 0, 0),
            Op::Mkdir(5),
            Op::Sync,
            Op::Rmdir(5),
            Op::Link(1, 5),
        ],
    )
    .expect("model");
}

/// Regression (from the model, in a clean CI run): two names of one file sent by a sync,
/// one renamed, the other rewritten. The final sync's rsync replaced the share's second
/// name, which dropped the link count, and so the ctime, of the first name's file there:
/// the deletion of the first name took that for another workstation's save and kept it.
#[test]
fn model_regression_a_deleted_hard_link_whose_twin_rsync_replaced() {
    run_model(
        vec![],
        vec![
            Op::Write(1, 0, 0),
            Op::Link(1, 0),
            Op::Sync,
            Op::Rename(0, 2),
            Op::Write(1, 0, 0),
        ],
    )
    .expect("model");
}

/// Regression (from the sessions model): a rename over a share's file, then a sync whose
/// rsync sends nothing and fails. The two share files were written within one tick of the
/// kernel's coarse clock, so the share's old file had the size and mtime of the renamed
/// one, and a sync settled without rsync's report took it for its transfer (as rsync's
/// own quick check would) where the model's stamps told them apart: the model's world now
/// gives every write an mtime of its own.
#[test]
fn sessions_regression_a_rename_over_a_shares_file_then_a_failed_sync() {
    use model::Op::*;
    model::run_sessions(
        vec![(1, 181), (5, 37)],
        [-315360000, -315360000],
        vec![Rename(1, 5, 1), FailSync(1, 0, false)],
    )
    .expect("model");
}

/// The directories above a file sent at logout are the share's: rsync does not send them
/// (another workstation's change of one stays), unless one is gone from the share, which
/// is then made again as ours is (not with rsync's defaults, which as root are root's).
#[test]
fn a_sync_leaves_the_share_s_directories_alone_and_remakes_a_lost_one_as_ours() {
    let env = Env::new();
    let dir = env.share.join(".config/app");
    fs::create_dir_all(&dir).expect("mkdir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o750)).expect("chmod");
    fs::write(dir.join("f"), "old").expect("write");
    let mode = |p: &Path| fs::metadata(p).expect("stat").mode() & 0o7777;
    // A save copies the directory's attributes into the cache (0750); meanwhile another
    // workstation closes the directory (0700).
    let o = env.overlay();
    write_file(&o, ".config/app/f", b"new");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).expect("chmod");
    env.sync(&o, SyncMode::Logout);
    assert_eq!(fs::read(dir.join("f")).expect("sent"), b"new");
    assert_eq!(mode(&dir), 0o700, "the other workstation's change stays");
    // The next session saves again, and another workstation removes the directory with
    // the file (ours is written back, as a change here and a deletion there always is).
    let o = env.overlay();
    write_file(&o, ".config/app/f", b"newer");
    fs::remove_dir_all(&dir).expect("rm");
    let r = run_sync(&o, &env.rsync(), SyncMode::Logout).expect("sync");
    assert!(r.ok, "{r:?}");
    assert_eq!(fs::read(dir.join("f")).expect("written back"), b"newer");
    assert_eq!(
        mode(&dir),
        0o700,
        "made again as our copy of it is (the share's attributes when we copied it)"
    );
}

/// Regression (from the sessions model, with clean copies kept at logout): a workstation
/// whose clean copy another workstation's recovery met as a conflict.
#[test]
fn sessions_regression_a_kept_copy_after_a_conflict_elsewhere() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [-315360000, -315360000],
        vec![
            Write(1, 2, 0, 0),
            CrashInSync(1, 0),
            ShareUp(1),
            Write(0, 2, 0, 0),
            Crash(0),
            Logout(1),
            Append(0, 3, 0),
            Write(1, 2, 0, 0),
        ],
    )
    .expect("model");
}

/// A logout keeps at most `keep_copies_mib` of clean copies, the newest first; zero keeps
/// none.
#[test]
fn a_logout_keeps_clean_copies_within_the_budget_newest_first() {
    for (budget, want) in [(35u64, vec![".c3"]), (0, vec![])] {
        let env = Env::new();
        let o = env.overlay();
        o.set_keep_copies(budget);
        for (name, len) in [(".c1", 10usize), (".c2", 20), (".c3", 30)] {
            write_file(&o, name, &vec![b'x'; len]);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let r = run_sync(&o, &env.rsync(), SyncMode::Logout).expect("logout");
        assert!(r.ok && r.cache_dropped, "{r:?}");
        let mut kept: Vec<String> = fs::read_dir(env.cache.join("upper"))
            .expect("ls")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        kept.sort();
        assert_eq!(kept, want, "budget {budget}");
    }
}

/// Regression (from the sessions model): a file found unchanged at a sync, stamped on the
/// share, then the daemon killed during that sync's rsync: the stamp's hand-over mark was
/// left in the journal (a recovery nothing needed at the next login).
#[test]
fn sessions_regression_a_crash_after_an_unchanged_files_stamp() {
    use model::Op::*;
    model::run_sessions(
        vec![(1, 45)],
        [-315360000, -315360000],
        vec![
            Write(0, 0, 0, 0),
            Sync(0),
            Write(0, 0, 0, 0),
            CrashInSync(0, 0),
        ],
    )
    .expect("model");
}

/// Regression (from the sessions model, in a clean CI run): a file backdated after a crash
/// cut its sync short, found unchanged by the recovery's sync (stamped), then a crash in
/// that sync.
#[test]
fn sessions_regression_a_backdate_then_a_crash_after_the_stamp() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [-315360000, -315360000],
        vec![
            Write(1, 5, 0, 0),
            CrashInSync(1, 0),
            Backdate(1, 5),
            CrashInSync(1, 0),
        ],
    )
    .expect("model");
}

/// Regression (from the model, 800 cases): a name of a file hard-linked on the share,
/// renamed over its other name after a crash, then a crash while rsync sent the renamed
/// file: the transfer took a link from the share's old file, which changed its ctime, and
/// the deletion of the old name was kept as another workstation's change.
#[test]
fn model_regression_a_rename_over_a_hard_links_other_name_then_a_crash_in_the_sync() {
    run_model(
        vec![(5, 124)],
        vec![
            Op::Link(5, 1),
            Op::Crash,
            Op::Append(5, 0),
            Op::Rename(5, 1),
            Op::CrashInSync(5),
        ],
    )
    .expect("model");
}

/// Regression (from the sessions model, on the ext4 share): both workstations remove the
/// directory .c/d, workstation 0 makes it again, workstation 1 logs out (the share's .c/d
/// goes), and workstation 0's sync fails after rsync made the directory. ext4 gave the new
/// directory the inode number of the removed one, the base workstation 0 had: the directory
/// rsync reported making was taken for the one the check saw and named "not sent".
#[test]
fn model_regression_a_directory_rsync_made_with_the_number_of_the_removed_one() {
    use model::Op::*;
    model::run_sessions(
        vec![(2, 81)],
        [-model::SKEW, -model::SKEW],
        vec![
            Rmdir(0, 2),
            Rmdir(1, 2),
            Mkdir(0, 2),
            Logout(1),
            FailSync(0, 1, false),
        ],
    )
    .expect("model");
}

/// Regression (from the model): one name of a hard-linked file, both names synced, is
/// truncated and then removed (or replaced by a rename) before the next sync. The sync
/// sends the other names of a changed file it is handed, but the changed name was gone:
/// the other name kept the old content on the share. Now the other names are marked
/// changed when the changed name goes.
#[test]
fn model_regression_a_change_through_a_hard_link_whose_name_then_goes() {
    for last in [Op::Unlink(0), Op::Rename(2, 0)] {
        run_model(
            vec![(0, 1)],
            vec![
                Op::Link(0, 1),
                Op::Sync,
                Op::Write(0, 0, 0),
                Op::Write(2, 7, 3),
                last,
            ],
        )
        .expect("model");
    }
}

/// A save that links its temporary file to the final name and unlinks the temporary one
/// (git's objects): the change stays under the final name, when that name is one the
/// session made, one a sync made clean since, or one written again after it; and after a
/// crash and a logout in between.
#[test]
fn model_regression_a_save_by_link_then_unlink_of_the_temporary_name() {
    let plays = [
        vec![Op::Write(0, 1, 10), Op::Link(0, 1), Op::Unlink(0), Op::Sync],
        vec![
            Op::Write(0, 1, 10),
            Op::Link(0, 1),
            Op::Sync,
            Op::Write(0, 2, 20),
            Op::Unlink(0),
            Op::Sync,
        ],
        vec![
            Op::Write(0, 1, 10),
            Op::Link(0, 1),
            Op::Link(1, 2),
            Op::Sync,
            Op::Append(1, 3),
            Op::Unlink(0),
            Op::Crash,
            Op::Unlink(2),
            Op::Logout,
        ],
    ];
    for ops in plays {
        run_model(vec![], ops).expect("model");
    }
}

/// Regression (from the sessions model with the kept looks on): a failed unlink's own look
/// keeps "nothing there" for the next change of the name, a rename over it meanwhile.
#[test]
fn sessions_regression_kept_looks_a_rename_over_a_name_then_its_unlink() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [-315360000, -315360000],
        vec![
            Write(0, 2, 0, 0),
            Unlink(0, 5),
            Sync(0),
            Write(1, 5, 0, 0),
            Rename(0, 2, 5),
            Sync(1),
            Unlink(0, 5),
        ],
    )
    .expect("model");
}

/// Regression (from the sessions model with mappings): a failed sync names what it did
/// not send in the order of the paths, a mapped file's snapshot among them.
#[test]
fn sessions_regression_a_mapped_file_not_sent_is_named_in_path_order() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [-315360000, -315360000],
        vec![
            Write(0, 2, 0, 1),
            Rename(0, 2, 5),
            Map(0, 5, 0),
            Write(0, 0, 0, 0),
            FailSync(0, 0, false),
        ],
    )
    .expect("model");
}

/// The sessions model with extended attributes: one set on a share file (copied up,
/// sent with it, kept with a conflict copy), one removed, and a removal of one the file
/// lacks (ENODATA), which changes nothing.
#[test]
fn sessions_xattrs_are_carried_and_a_failed_removal_changes_nothing() {
    use model::Op::*;
    model::run_sessions(
        vec![(0, 1)],
        [0, 0],
        vec![
            Xattr(0, 0, None),
            Sync(0),
            Xattr(0, 0, Some(1)),
            Sync(0),
            Logout(0),
            Xattr(1, 0, Some(0)),
            Write(0, 0, 2, 2),
            Sync(1),
            Sync(0),
            Xattr(1, 0, None),
            Logout(1),
        ],
    )
    .expect("model");
}

/// The sessions model with symbolic links: made on both workstations at one name (a
/// conflict), renamed, removed, and compared with their targets on the share and in
/// every view.
#[test]
fn sessions_symlinks_reach_the_share_and_meet_as_conflicts() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [0, 0],
        vec![
            Symlink(0, 0, 0),
            Symlink(1, 0, 1),
            Sync(0),
            Sync(1),
            Rename(0, 0, 1),
            Logout(0),
            Unlink(1, 0),
            Symlink(1, 1, 1),
            Logout(1),
        ],
    )
    .expect("model");
}

/// The names of the files opened in `dir` since `fd` watched it (inotify IN_OPEN).
fn opened_since(fd: i32) -> Vec<String> {
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: `buf` is valid for its length; `fd` is a non-blocking inotify descriptor.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    let mut names = Vec::new();
    let mut at = 0usize;
    while n > 0 && at < n as usize {
        // struct inotify_event: wd, mask, cookie, len, then the name.
        let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().expect("len")) as usize;
        let name = String::from_utf8_lossy(&buf[at + 16..at + 16 + len])
            .trim_end_matches('\0')
            .to_string();
        names.push(name);
        at += 16 + len;
    }
    names
}

/// On NFS a look at a clean copy opens the share's file (an open revalidates the client's
/// cached attributes, close-to-open; a lookup may be answered from them for a minute):
/// played here on any share with the switch the NFS check sets.
#[test]
fn a_clean_copys_look_opens_the_shares_file_where_looks_open() {
    let env = Env::new();
    let o = env.overlay();
    write_file(&o, ".x", b"v1");
    env.sync(&o, SyncMode::Session);
    let dir = std::ffi::CString::new(env.share.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: plain inotify calls on a descriptor this test owns; `dir` is a C string.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: as above.
    assert!(unsafe { libc::inotify_add_watch(fd, dir.as_ptr(), libc::IN_OPEN) } >= 0);
    let fine_times = fs::metadata(env.share.join(".x"))
        .expect("stat")
        .ctime_nsec()
        != 0;
    o.resolve(Path::new(".x")).expect("resolve");
    let plain = opened_since(fd);
    if fine_times {
        assert!(
            !plain.contains(&".x".to_string()),
            "a plain look: {plain:?}"
        );
    }
    o.set_looks_open(true);
    o.resolve(Path::new(".x")).expect("resolve");
    let opened = opened_since(fd);
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(fd) };
    assert!(opened.contains(&".x".to_string()), "{opened:?}");
    assert_eq!(read_file(&o, ".x"), b"v1");
}

/// Regression (from the sessions model with symbolic links): a link a crash in a sync
/// left on the share, sent again by the recovery: rsync leaves a link that already points
/// where ours does (the same object), so the other workstation's deletion of it is no
/// conflict.
#[test]
fn sessions_regression_a_link_sent_again_is_the_same_object() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [-315360000, -315360000],
        vec![
            Symlink(0, 2, 0),
            CrashInSync(0, 1),
            Unlink(1, 2),
            Write(0, 2, 0, 0),
        ],
    )
    .expect("model");
}

/// Regression (from the sessions model with the kept looks on, in CI): a name removed
/// here while the share does not answer, its kept look saying the share has nothing
/// there: a second removal finds nothing (the share is not asked).
#[test]
fn sessions_regression_kept_looks_a_removal_again_while_the_share_is_down() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [-315360000, -315360000],
        vec![
            Write(1, 1, 0, 0),
            Write(0, 1, 0, 0),
            ShareDown(1),
            Sync(0),
            Unlink(1, 1),
            Unlink(1, 1),
        ],
    )
    .expect("model");
}

/// Regression (from the sessions model on the whole-second share): a sync cut short by a
/// crash while a mapped file waited to go; the other workstation's logout sent the same
/// file at the same size in the same second, which the recovery takes for its own
/// transfer there (the bytes were the same; see doc/SEMANTICS.md, the limit).
#[test]
fn sessions_regression_a_crash_in_a_sync_and_a_same_second_save_elsewhere() {
    use model::Op::*;
    model::run_sessions(
        vec![(0, 4)],
        [-315360000, -315360000],
        vec![
            Sync(0),
            Write(0, 1, 0, 1),
            Sync(0),
            Map(1, 1, 0),
            CrashInSync(1, 0),
            Map(0, 1, 0),
            Logout(0),
        ],
    )
    .expect("model");
}

/// Regression (from the two-workstation model on the whole-second share): a logout while
/// the share does not answer keeps the clean copies a sync left there, racy ones (sent
/// in the second of the logout) with their mark, checked at their next look; none is let
/// go of because its content could not be read.
#[test]
fn sessions_regression_a_logout_while_the_share_is_down_keeps_racy_copies() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [-315360000, -315360000],
        vec![
            Write(0, 1, 0, 3),
            Sync(0),
            ShareDown(0),
            Logout(0),
            ShareDown(0),
        ],
    )
    .expect("model");
}

/// Regression (from the two-workstation model on the whole-second share): a sync cut
/// short by a crash after rsync sent a file; the other workstation maps the file and
/// writes it through the mapping at the same size, and its logout sends it first.
#[test]
fn sessions_regression_a_crash_in_a_sync_then_a_mapped_write_elsewhere() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [315360000, 315360000],
        vec![Write(1, 0, 1, 1), CrashInSync(1, 1), Map(0, 0, 0)],
    )
    .expect("model");
}

/// Regression (from the two-workstation model on a fine-grained share): a directory made
/// in this session inside another made in it, removed while the share does not answer.
#[test]
fn sessions_regression_a_new_directory_removed_while_the_share_is_down() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [-315360000, -315360000],
        vec![Mkdir(0, 2), Mkdir(0, 3), ShareDown(0), Rmdir(0, 3)],
    )
    .expect("model");
}

/// Regression (from the two-workstation model in CI): a look kept from a removal that
/// found nothing, then the other workstation makes the directory there and sends it:
/// while the share does not answer, the directory is not in this workstation's view, and
/// a removal of it fails.
#[test]
fn sessions_regression_a_kept_look_of_nothing_and_a_directory_made_elsewhere_meanwhile() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [-315360000, -315360000],
        vec![
            Write(1, 5, 0, 0),
            Rmdir(1, 2),
            ShareDown(1),
            Mkdir(0, 2),
            Sync(0),
            Rmdir(1, 2),
        ],
    )
    .expect("model");
}

/// Regression (from the model, in CI): two names of one new file sent by a sync, a write
/// through one name, then a crash while rsync had sent only that name: the recovery must
/// send the other name's change too.
#[test]
fn model_regression_a_write_through_one_of_two_sent_links_then_a_crash_in_the_sync() {
    run_model(
        vec![],
        vec![
            Op::Write(5, 0, 0),
            Op::Link(5, 0),
            Op::Sync,
            Op::Write(0, 0, 1),
            Op::CrashInSync(1),
        ],
    )
    .expect("model");
}

/// Regression (from the two-workstation model on a whole-second share, in CI): both
/// workstations remove .c/b, one sends the removal, makes .c/b anew and logs out; the
/// other, its clock years behind, makes .c/b empty twice: its logout must set its file
/// aside as a conflict beside the other's.
#[test]
fn sessions_regression_a_file_made_again_on_both_after_both_removed_it() {
    use model::Op::*;
    model::run_sessions(
        vec![(1, 1)],
        [-315360000, 0],
        vec![
            Unlink(1, 1),
            Unlink(0, 1),
            Sync(1),
            Write(1, 1, 1, 1),
            Logout(1),
            Write(0, 1, 0, 0),
            Write(0, 1, 0, 0),
        ],
    )
    .expect("model");
}

/// Regression (from the two-workstation model with files held by block): a backdated
/// file held by block, written in place on the share meanwhile, kept aside in the cache
/// at a name of 255 bytes (its list of blocks beside it made the name too long, and the
/// whole logout failed).
#[test]
fn sessions_regression_blocks_kept_here_at_a_name_at_the_limit() {
    use model::Op::*;
    model::run_sessions_as(
        true,
        vec![(2, 81)],
        [-315360000, -315360000],
        vec![
            Write(0, 6, 0, 1),
            Sync(0),
            Backdate(1, 6),
            EditThere(6, 100),
        ],
    )
    .expect("model");
}

/// Regression (from the two-workstation model with files held by block): a rename of a
/// file held by block makes it whole, and the blocks copied in keep its mtime.
#[test]
fn sessions_regression_a_backdated_file_held_by_block_renamed() {
    use model::Op::*;
    model::run_sessions_as(
        true,
        vec![],
        [-315360000, -315360000],
        vec![
            Write(0, 1, 0, 1),
            Rename(0, 1, 2),
            Sync(0),
            Backdate(1, 2),
            Rename(1, 2, 1),
        ],
    )
    .expect("model");
}

/// Regression (from the two-workstation model with files held by block): a rename of a
/// file still on the share copies it whole (its own copy-up held it by block, and its
/// missing blocks were looked for at the new name).
#[test]
fn sessions_regression_a_rename_of_a_file_still_on_the_share() {
    use model::Op::*;
    model::run_sessions_as(
        true,
        vec![(2, 141), (4, 1)],
        [-315360000, -315360000],
        vec![Rename(0, 4, 5)],
    )
    .expect("model");
}

/// Regression (from the two-workstation model): a clean copy let go of because the share
/// has nothing there any more (deleted by the other workstation) leaves the look that found
/// nothing kept, as any: a mkdir there while the share does not answer succeeds.
#[test]
fn sessions_regression_a_clean_copy_let_go_of_keeps_its_look_of_nothing() {
    use model::Op::*;
    model::run_sessions_as(
        false,
        vec![(5, 17)],
        [-315360000, -315360000],
        vec![
            Write(1, 5, 0, 0),
            Sync(1),
            Unlink(0, 5),
            Logout(0),
            ShareDown(1),
            Mkdir(1, 5),
        ],
    )
    .expect("model");
}

/// Regression (from the two-workstation model with files held by block): a kept copy held
/// by block, read at the next login, holds its base open: it stays readable while the
/// share does not answer.
#[test]
fn sessions_regression_a_kept_copy_held_by_block_read_at_login_then_the_share_down() {
    use model::Op::*;
    model::run_sessions_as(
        true,
        vec![(1, 17)],
        [-315360000, -315360000],
        vec![Backdate(1, 1), Logout(1), ShareDown(1)],
    )
    .expect("model");
}

/// Regression (from the two-workstation model with files held by block): a symbolic link
/// renamed over a file held by block whose base was written in place on the share
/// replaces it (the model took the link for the file that cannot be read).
#[test]
fn sessions_regression_a_link_renamed_over_a_file_held_by_block_that_cannot_be_read() {
    use model::Op::*;
    model::run_sessions_as(
        true,
        vec![],
        [-315360000, -315360000],
        vec![
            Symlink(0, 1, 0),
            Write(0, 5, 0, 1),
            Logout(0),
            AttrThere(5, 110),
            Xattr(0, 5, None),
            EditThere(5, 100),
            Rename(0, 1, 5),
        ],
    )
    .expect("model");
}

/// Regression (from the two-workstation model on a whole-second share): a file renamed
/// away and a directory made at its name, while another program writes the share's file
/// in place in the second of the take-over: the directory sent over it must not hide that
/// write (the take-over's racy base stands for the content, not only the look).
#[test]
fn sessions_regression_a_directory_made_over_a_file_written_there_in_the_same_second() {
    use model::Op::*;
    model::run_sessions_as(
        false,
        vec![(5, 1)],
        [315360000, 315360000],
        vec![
            Rename(0, 5, 1),
            Sync(0),
            Rename(1, 1, 5),
            EditThere(1, 102),
            Mkdir(1, 1),
        ],
    )
    .expect("model");
}

/// Regression (from the two-workstation model with files held by block): a base held open
/// whose attributes were set on the share (its ctime changed in place), then replaced by
/// the other workstation's send, stays unreadable: being left without a name does not
/// make it the base again.
#[test]
fn sessions_regression_a_held_base_changed_in_place_then_replaced_stays_unreadable() {
    use model::Op::*;
    model::run_sessions_as(
        true,
        vec![(5, 70)],
        [-315360000, -315360000],
        vec![
            Write(0, 0, 1, 0),
            Chmod(0, 0, 384),
            Backdate(1, 5),
            AttrThere(5, 110),
            Backdate(0, 5),
            Write(0, 0, 1, 0),
        ],
    )
    .expect("model");
}

/// Regression (from the model): a directory made here, with one inside it, while another
/// workstation puts a symbolic link at its name on the share. The inner directory lists
/// as ours (ccfs never follows a link on the share, and the look through it said "too
/// many levels of symbolic links").
#[test]
fn sessions_regression_a_link_on_the_share_at_a_directory_made_here() {
    use model::Op::*;
    model::run_sessions(
        vec![],
        [-315360000, -315360000],
        vec![Mkdir(1, 2), Mkdir(1, 4), Symlink(0, 2, 0), Logout(0)],
    )
    .expect("model");
}

/// Two workstations send the same file at the same moment (both changed it; each checked
/// the share before the other sent): each makes its copy under a name of its own and
/// renames that one into place, never the other's, so what the share holds after each
/// rename is what that workstation sent, and the later rename stands. (With one name for
/// both, the second to stage replaced the first's copy, and the first put the second's
/// version in place while reporting its own.) Nothing is left in the holding directory.
#[test]
fn two_workstations_sending_one_file_at_once_each_rename_their_own_copy() {
    let env = Env::new();
    fs::create_dir(env.share.join(".c")).expect("mkdir");
    fs::write(env.share.join(".c/a"), "base\n").expect("seed");
    let cache2 = env._tmp.path().join("cache2");
    fs::create_dir(&cache2).expect("cache2");
    let one = env.overlay();
    let two = Overlay::new(&env.share, &cache2, Policy::default_policy()).expect("overlay");
    write_file(&one, ".c/a", b"from one\n");
    write_file(&two, ".c/a", b"from two, longer\n");
    let s1 = one
        .begin_sync("one", "20261129T000000Z")
        .expect("begin one");
    let s2 = two
        .begin_sync("two", "20261129T000000Z")
        .expect("begin two");
    assert_eq!(
        s1.direct,
        [PathBuf::from(".c/a")],
        "sent by the sync itself"
    );
    assert_eq!(s2.direct, [PathBuf::from(".c/a")]);
    let (mut e1, mut e2) = (Vec::new(), Vec::new());
    let staged1 = one.stage_files(&s1.direct, &mut e1);
    let staged2 = two.stage_files(&s2.direct, &mut e2);
    assert!(e1.is_empty() && e2.is_empty(), "{e1:?} {e2:?}");
    let mut put1 = ccfs::overlay::FilesSent::default();
    one.put_staged(staged1, &mut put1);
    assert!(put1.errors.is_empty(), "{:?}", put1.errors);
    assert_eq!(
        fs::read_to_string(env.share.join(".c/a")).expect("read"),
        "from one\n",
        "the first rename puts the first workstation's copy"
    );
    let mut put2 = ccfs::overlay::FilesSent::default();
    two.put_staged(staged2, &mut put2);
    assert!(put2.errors.is_empty(), "{:?}", put2.errors);
    assert_eq!(
        fs::read_to_string(env.share.join(".c/a")).expect("read"),
        "from two, longer\n"
    );
    let (t1, t2) = (
        ccfs::overlay::Transfer::Reported(put1.put),
        ccfs::overlay::Transfer::Reported(put2.put),
    );
    s1.finish(t1).expect("finish one");
    s2.finish(t2).expect("finish two");
    let left: Vec<_> = fs::read_dir(env.share.join(".c"))
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(left, [std::ffi::OsString::from("a")], "nothing else stays");
}
