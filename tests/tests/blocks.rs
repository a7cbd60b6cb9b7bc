//! SQLite databases cached by block through real mounts (`[paths] by_block_from_kib`):
//! the first change copies nothing, the logout sends the changed blocks, and every
//! database on the share passes SQLite's own integrity check after every logout, after a
//! crash of the daemon and `ccfs recover`, after a crash inside the send of the blocks,
//! when another workstation saved the database meanwhile, and when the database is larger
//! than the cache's free space.

use e2e::{alive, kill, recover, sqlite, stop, text, wait_until, Fixture, SmallTmpfs};

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const DB: &str = ".mozilla/p/places.sqlite";

/// Databases cached like any dotfile, by block from 256 KiB on.
fn config(fx: &Fixture) -> String {
    fx.config("[paths]\npassthrough = []\nby_block_from_kib = 256\n")
        .display()
        .to_string()
}

/// [`config`], the blocks a changed database lacks copied in the background at once, at
/// `kib_per_sec`.
fn filling_at_once(fx: &Fixture, kib_per_sec: u32) -> String {
    fx.config(&format!(
        "[paths]\npassthrough = []\nby_block_from_kib = 256\n\
         by_block_fill_after_secs = 0\nby_block_fill_kib_per_sec = {kib_per_sec}\n"
    ))
    .display()
    .to_string()
}

/// A database of about `mb` MiB at `path` (pages of 32 KiB, as Firefox's), in rollback
/// journal mode: a commit writes its pages into the database itself and syncs it.
fn make_db(path: &Path, mb: usize) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    sqlite(
        path,
        &format!(
            "pragma page_size=32768; pragma journal_mode=delete;
             create table t(id integer primary key, v blob);
             with recursive n(i) as (select 1 union all select i + 1 from n where i < {})
             insert into t(v) select randomblob(1000) from n;
             create table notes(x text);",
            mb * 1000
        ),
    );
    // On a share that keeps whole seconds, a file changed in the current second is taken
    // over whole (its base stands by its content, which is the whole file's): the tests
    // take it over once that second is over, as a profile last saved at a logout is.
    std::thread::sleep(Duration::from_millis(1100));
}

fn intact(db: &Path) {
    assert_eq!(
        sqlite(db, "pragma integrity_check"),
        "ok",
        "{}",
        db.display()
    );
}

fn notes(db: &Path) -> Vec<String> {
    let out = sqlite(db, "select x from notes order by rowid");
    out.lines().map(str::to_string).collect()
}

/// Bytes the file takes on its disk.
fn allocated(p: &Path) -> u64 {
    std::fs::metadata(p).expect("stat").blocks() * 512
}

#[test]
fn a_database_changed_through_the_mount_copies_nothing_and_is_sent_by_its_blocks() {
    let fx = Fixture::new();
    make_db(&fx.s(DB), 8);
    let len = std::fs::metadata(fx.s(DB)).expect("db").len();
    let cfg = config(&fx);
    let m = fx.mount_with(&["--config", &cfg]);
    sqlite(
        &fx.m(DB),
        "insert into notes values('one'); update t set v = zeroblob(1000) where id = 4000;",
    );
    let cached = fx.cache.join("upper").join(DB);
    assert_eq!(std::fs::metadata(&cached).expect("cache").len(), len);
    assert!(
        allocated(&cached) < len / 8,
        "the cache holds the changed blocks, not the database: {} of {len} bytes",
        allocated(&cached)
    );
    assert_eq!(
        notes(&fx.s(DB)),
        Vec::<String>::new(),
        "nothing on the share yet"
    );
    let before = std::fs::metadata(fx.s(DB)).expect("db").ino();
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    intact(&fx.s(DB));
    assert_eq!(notes(&fx.s(DB)), ["one"]);
    assert_ne!(
        std::fs::metadata(fx.s(DB)).expect("db").ino(),
        before,
        "put in place whole, by a rename"
    );
    // The returning user: what the cache kept, the rest from the share's new version.
    let m = fx.mount_with(&["--config", &cfg]);
    assert_eq!(notes(&fx.m(DB)), ["one"]);
    intact(&fx.m(DB));
    sqlite(&fx.m(DB), "insert into notes values('two');");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    intact(&fx.s(DB));
    assert_eq!(notes(&fx.s(DB)), ["one", "two"]);
}

#[test]
fn a_committed_transaction_survives_a_crash_of_the_daemon_and_the_recovery_sends_it() {
    let fx = Fixture::new();
    make_db(&fx.s(DB), 4);
    let cfg = config(&fx);
    let m = fx.mount_with(&["--config", &cfg]);
    sqlite(&fx.m(DB), "insert into notes values('committed');");
    m.crash();
    let out = recover(&fx.cache);
    assert!(out.status.success(), "{}", text(&out));
    intact(&fx.s(DB));
    assert_eq!(notes(&fx.s(DB)), ["committed"]);
}

/// The file rsync's holding directory would hold for `rel` while the sync sends it.
fn holding(fx: &Fixture, rel: &str) -> PathBuf {
    let p = fx.s(rel);
    p.parent()
        .expect("parent")
        .join(ccfs::rsync::PARTIAL_DIR)
        .join(p.file_name().expect("name"))
}

#[test]
fn a_crash_inside_the_send_of_the_blocks_leaves_the_old_database_and_the_recovery_the_new() {
    // The daemon is stopped the moment its copy shows in the holding directory; a machine
    // fast enough to rename it first gives no stop inside the send: played again.
    let stopped_in_send = (0..5).any(|_| crash_inside_the_send());
    assert!(
        stopped_in_send,
        "in five tries the daemon was never stopped inside the send of the blocks"
    );
}

/// One try of the test above; whether the daemon was stopped inside the send. Either way
/// the recovery must leave the new database, whole, and no holding directory.
fn crash_inside_the_send() -> bool {
    let fx = Fixture::new();
    // Large enough that its copy on the share takes a while.
    make_db(&fx.s(DB), 96);
    let cfg = config(&fx);
    let m = fx.mount_with(&["--config", &cfg]);
    sqlite(&fx.m(DB), "insert into notes values('sent');");
    let pid = m.daemon_pid();
    let tmp = holding(&fx, DB);
    let mut logout = Command::new(e2e::ccfs_bin())
        .arg("umount")
        .arg(&fx.mnt)
        .spawn()
        .expect("umount");
    let start = Instant::now();
    while !tmp.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the send never began"
        );
        std::hint::spin_loop();
    }
    stop(pid);
    let stopped_in_send = tmp.exists();
    if stopped_in_send {
        // The share still has the old database, whole.
        intact(&fx.s(DB));
        assert_eq!(notes(&fx.s(DB)), Vec::<String>::new());
    }
    kill(pid, libc::SIGKILL);
    wait_until("daemon death", Duration::from_secs(10), || !alive(pid));
    let _ = logout.wait();
    m.abandon();
    let out = recover(&fx.cache);
    assert!(out.status.success(), "{}", text(&out));
    intact(&fx.s(DB));
    assert_eq!(notes(&fx.s(DB)), ["sent"]);
    assert!(!tmp.exists(), "the holding directory is cleaned up");
    stopped_in_send
}

#[test]
fn another_workstations_save_meanwhile_keeps_both_databases_whole() {
    let fx = Fixture::new();
    make_db(&fx.s(DB), 4);
    let cfg = config(&fx);
    let m = fx.mount_with(&["--config", &cfg]);
    sqlite(&fx.m(DB), "insert into notes values('here');");
    // The same user on another workstation, which saves and logs out first.
    let (mnt_b, cache_b) = fx.workstation("b");
    let b = fx.mount_at(&mnt_b, &cache_b, &["--config", &cfg]);
    sqlite(&mnt_b.join(DB), "insert into notes values('there');");
    let out = b.umount();
    assert!(out.status.success(), "{}", text(&out));
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    intact(&fx.s(DB));
    assert_eq!(
        notes(&fx.s(DB)),
        ["there"],
        "the share keeps the other save"
    );
    let dir = fx.s(DB).parent().expect("dir").to_path_buf();
    let kept: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("ls")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("places.sqlite") && *p != fx.s(DB))
        })
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
        .collect();
    let ours: Vec<&PathBuf> = kept
        .iter()
        .filter(|p| p.to_string_lossy().contains("conflict"))
        .collect();
    assert_eq!(ours.len(), 1, "our version kept aside: {kept:?}");
    intact(ours[0]);
    assert_eq!(notes(ours[0]), ["here"]);
}

/// Another program (a login on a workstation without ccfs, a session over SSH) writes the
/// share's database in place while this workstation holds it by block, before the daemon
/// copied the blocks it lacks: those are gone, so ours cannot be made whole. The logout says so and fails;
/// the share keeps the other program's database, whole, and the cache keeps the blocks
/// written here.
#[test]
fn a_database_rewritten_in_place_on_the_share_meanwhile_fails_the_logout_and_keeps_ours() {
    let fx = Fixture::new();
    make_db(&fx.s(DB), 4);
    // (Before the background copy of the blocks it lacks, here never.)
    let cfg = fx
        .config(
            "[paths]\npassthrough = []\nby_block_from_kib = 256\nby_block_fill_kib_per_sec = 0\n",
        )
        .display()
        .to_string();
    let m = fx.mount_with(&["--config", &cfg]);
    sqlite(&fx.m(DB), "insert into notes values('here');");
    // Rollback journal mode: the other program's commit writes the share's file in place.
    sqlite(&fx.s(DB), "insert into notes values('there');");
    let out = m.umount();
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("not on the share"), "{said}");
    assert!(!said.contains("all changes are on the share"), "{said}");
    intact(&fx.s(DB));
    assert_eq!(
        notes(&fx.s(DB)),
        ["there"],
        "the share keeps the other program's"
    );
    let kept = std::fs::read_dir(fx.cache.join("kept"))
        .expect("kept/")
        .flatten()
        .map(|d| d.path().join(DB))
        .find(|p| p.is_file());
    assert!(kept.is_some(), "the blocks written here are kept: {said}");
}

/// The same rewrite in place, once the daemon has copied the blocks the changed database
/// lacked in the background: ours needs the share's old version no more, so both reach
/// the share whole, as with a save elsewhere, and the logout ends well.
#[test]
fn a_database_completed_in_the_background_meets_a_rewrite_in_place_as_an_ordinary_conflict() {
    let fx = Fixture::new();
    make_db(&fx.s(DB), 4);
    let cfg = filling_at_once(&fx, 65536);
    let m = fx.mount_with(&["--config", &cfg]);
    sqlite(&fx.m(DB), "insert into notes values('here');");
    wait_until(
        "the database's missing blocks copied",
        Duration::from_secs(30),
        || {
            let st = m.status();
            st["held_by_block"]["files"].as_u64() == Some(1)
                && st["held_by_block"]["lacking_bytes"].as_u64() == Some(0)
        },
    );
    sqlite(&fx.s(DB), "insert into notes values('there');");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    intact(&fx.s(DB));
    assert_eq!(notes(&fx.s(DB)), ["there"]);
    let dir = fx.s(DB).parent().expect("dir").to_path_buf();
    let ours: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("ls")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with("places.sqlite") && n.contains("conflict")
            })
        })
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
        .collect();
    assert_eq!(
        ours.len(),
        1,
        "our version kept aside on the share: {ours:?}"
    );
    intact(&ours[0]);
    assert_eq!(notes(&ours[0]), ["here"]);
}

#[test]
fn a_database_larger_than_the_caches_free_space_is_changed_and_sent() {
    let fx = Fixture::new();
    make_db(&fx.s(DB), 48);
    let small = SmallTmpfs::mount(&fx.tmp.path().join("small"), "16m");
    let cache = small.0.join("cache");
    let cfg = config(&fx);
    let m = fx.mount_at(&fx.mnt, &cache, &["--config", &cfg]);
    sqlite(
        &fx.m(DB),
        "insert into notes values('fits'); update t set v = zeroblob(1000) where id = 30000;",
    );
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    intact(&fx.s(DB));
    assert_eq!(notes(&fx.s(DB)), ["fits"]);
}

/// The background copy of the blocks a database lacks on a cache too small for them: it
/// does not start (the user's own writes come first), another dotfile still fits, and the
/// database is sent by its blocks.
#[test]
fn the_background_copy_leaves_a_small_cache_its_room() {
    let fx = Fixture::new();
    make_db(&fx.s(DB), 48);
    let small = SmallTmpfs::mount(&fx.tmp.path().join("small"), "16m");
    let cache = small.0.join("cache");
    let cfg = filling_at_once(&fx, 65536);
    let m = fx.mount_at(&fx.mnt, &cache, &["--config", &cfg]);
    sqlite(&fx.m(DB), "insert into notes values('fits');");
    // Ticks of the fill (four a second) that would have copied the whole database.
    std::thread::sleep(Duration::from_secs(2));
    std::fs::write(fx.m(".config-big"), vec![7u8; 4 << 20]).expect("room for the user's own file");
    sqlite(&fx.m(DB), "insert into notes values('still');");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    intact(&fx.s(DB));
    assert_eq!(notes(&fx.s(DB)), ["fits", "still"]);
}

/// Syncs while the daemon copies the blocks a database lacks: the copy never runs during a
/// sync (its descriptor open for writing and its mtime put back would make the file look
/// written after it was handed over), so every sync ends with nothing left, and so does
/// the logout.
#[test]
fn syncs_while_the_blocks_are_copied_in_the_background_leave_nothing_unsent() {
    let fx = Fixture::new();
    make_db(&fx.s(DB), 48);
    let cfg = filling_at_once(&fx, 16384);
    let m = fx.mount_with(&["--config", &cfg]);
    sqlite(&fx.m(DB), "insert into notes values('here');");
    for _ in 0..8 {
        let out = e2e::ccfs(&["sync".as_ref(), fx.mnt.as_os_str()]);
        let said = text(&out);
        assert!(out.status.success(), "{said}");
        assert!(!said.contains("kept as unsynced work"), "{said}");
        std::thread::sleep(Duration::from_millis(150));
    }
    let out = m.umount();
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("all changes are on the share"), "{said}");
    intact(&fx.s(DB));
    assert_eq!(notes(&fx.s(DB)), ["here"]);
}

#[test]
fn punching_a_hole_or_zeroing_a_range_reaches_the_share() {
    let fx = Fixture::new();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8 + 1).collect();
    std::fs::write(fx.s(".big"), &data).expect("share file");
    std::thread::sleep(Duration::from_millis(1100));
    let cfg = config(&fx);
    let m = fx.mount_with(&["--config", &cfg]);
    let mut want = data.clone();
    for (args, from, to) in [
        (["-p", "-o", "8192", "-l", "8192"], 8192, 16384),
        (["-z", "-o", "20480", "-l", "4096"], 20480, 24576),
    ] {
        let o = Command::new("fallocate")
            .args(args)
            .arg(fx.m(".big"))
            .output()
            .expect("fallocate");
        assert!(o.status.success(), "{}", text(&o));
        want[from..to].fill(0);
    }
    assert_eq!(std::fs::read(fx.m(".big")).expect("view"), want);
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read(fx.s(".big")).expect("share"), want);
}

#[test]
fn an_append_and_a_create_that_finds_the_file_go_through_its_blocks() {
    let fx = Fixture::new();
    let history: String = (1..20000).map(|i| format!("{i}\n")).collect();
    std::fs::write(fx.s(".bash_history"), &history).expect("share file");
    std::thread::sleep(Duration::from_millis(1100));
    let cfg = config(&fx);
    let m = fx.mount_with(&["--config", &cfg]);
    // The kernel remembers `.big` as missing; another workstation puts it there.
    assert!(std::fs::metadata(fx.m(".big")).is_err());
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8 + 1).collect();
    std::fs::write(fx.s(".big"), &big).expect("share file");
    std::thread::sleep(Duration::from_millis(1100));
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo 'ls -la' >> '{h}' && python3 -c \"import os; fd = os.open('{b}', os.O_RDWR | os.O_CREAT); print(os.pread(fd, 4, 0).hex()); os.pwrite(fd, b'WORLD', 5000); os.close(fd)\"",
            h = fx.m(".bash_history").display(),
            b = fx.m(".big").display()
        ))
        .output()
        .expect("sh");
    assert!(o.status.success(), "{}", text(&o));
    let head: String = big[..4].iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        head,
        "the share's bytes, not holes"
    );
    let want_history = format!("{history}ls -la\n");
    let mut want_big = big.clone();
    want_big[5000..5005].copy_from_slice(b"WORLD");
    assert_eq!(
        std::fs::read_to_string(fx.m(".bash_history")).expect("view"),
        want_history
    );
    assert_eq!(std::fs::read(fx.m(".big")).expect("view"), want_big);
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(fx.s(".bash_history")).expect("share"),
        want_history
    );
    assert_eq!(std::fs::read(fx.s(".big")).expect("share"), want_big);
}

/// `ccfs status` says what the background copy has left to do: nothing for a database
/// whose attributes alone changed (its blocks stay on the share), the blocks a changed one
/// lacks until they are copied. A logout after that keeps the database whole, and the user's next login on
/// this workstation finds it lacking nothing: the copy is not made again.
#[test]
fn the_status_tells_what_the_background_copy_has_left_and_a_whole_copy_is_kept() {
    let fx = Fixture::new();
    make_db(&fx.s(DB), 4);
    let chmodded = ".mozilla/p/favicons.sqlite";
    make_db(&fx.s(chmodded), 2);
    let to_fill = |st: &serde_json::Value| st["held_by_block"]["to_fill_bytes"].as_u64();
    // Slow enough to see it at work.
    let cfg = filling_at_once(&fx, 512);
    let m = fx.mount_with(&["--config", &cfg]);
    std::fs::set_permissions(
        fx.m(chmodded),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod");
    let st = m.status();
    // (On a share that keeps whole seconds, a change of mode there in the second of the
    // take-over has it copied whole: then it lacks nothing.)
    if st["held_by_block"]["files"].as_u64() == Some(1) {
        assert!(
            st["held_by_block"]["lacking_bytes"].as_u64() > Some(1 << 20),
            "a database whose mode changed lacks its blocks: {st}"
        );
    }
    assert_eq!(to_fill(&st), Some(0), "and the copy leaves it so: {st}");
    sqlite(&fx.m(DB), "insert into notes values('here');");
    let st = m.status();
    assert!(
        to_fill(&st) > Some(1 << 20),
        "a changed one is to be copied: {st}"
    );
    wait_until("the copy done", Duration::from_secs(60), || {
        to_fill(&m.status()) == Some(0)
    });
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    let m = fx.mount_with(&["--config", &cfg]);
    sqlite(&fx.m(DB), "insert into notes values('again');");
    let st = m.status();
    assert_eq!(
        to_fill(&st),
        Some(0),
        "the next login's database lacks no block of those it changed: {st}"
    );
    assert_eq!(notes(&fx.m(DB)), ["here", "again"]);
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    intact(&fx.s(DB));
    assert_eq!(notes(&fx.s(DB)), ["here", "again"]);
}
