//! Nothing lost: crashes (kill -9) at seeded random points, syncs killed midway, two
//! workstations changing the same dotfile, a full cache filesystem, periodic sync.
//! `CCFS_FAULT_POINTS=N` runs more fault points (the long mode).

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use e2e::*;

// ---- two workstations ---------------------------------------------------------------

fn two_workstations_change_one_dotfile(first: &str, second: &str) {
    let fx = Fixture::new();
    fs::create_dir(fx.s(".config")).expect("mkdir");
    write(&fx.s(".config/app.conf"), "original\n");
    let (mnt_a, cache_a) = fx.workstation("a");
    let (mnt_b, cache_b) = fx.workstation("b");
    let a = fx.mount_at(&mnt_a, &cache_a, &[]);
    let b = fx.mount_at(&mnt_b, &cache_b, &[]);
    write(&mnt_a.join(".config/app.conf"), "from a\n");
    write(&mnt_b.join(".config/app.conf"), "from b\n");
    let mut mounts = HashMap::from([("a", a), ("b", b)]);
    let out1 = mounts.remove(first).expect("first").umount();
    assert!(out1.status.success(), "{}", text(&out1));
    assert!(
        !String::from_utf8_lossy(&out1.stdout).contains("conflict"),
        "{}",
        text(&out1)
    );
    let out2 = mounts.remove(second).expect("second").umount();
    let says = String::from_utf8_lossy(&out2.stdout).into_owned();
    assert!(
        out2.status.success(),
        "both versions are kept, so logout succeeds: {}",
        text(&out2)
    );
    assert!(
        says.contains("conflict: .config/app.conf was changed on the share"),
        "{says}"
    );
    // The share keeps the first logout's version; the second's is beside it.
    assert_eq!(read(&fx.s(".config/app.conf")), format!("from {first}\n"));
    let copies = conflict_copies(&fx.s(".config"), "app.conf");
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_eq!(read(&copies[0]), format!("from {second}\n"));
    assert!(
        says.contains(
            &copies[0]
                .file_name()
                .expect("n")
                .to_string_lossy()
                .into_owned()
        ),
        "{says}"
    );
    let cache_second = if second == "a" { &cache_a } else { &cache_b };
    let log = read(&cache_second.join("conflicts.log"));
    assert!(log.contains("\"kind\":\"modified-on-both\""), "{log}");
}

#[test]
fn two_workstations_a_then_b_keep_both_versions() {
    two_workstations_change_one_dotfile("a", "b");
}

#[test]
fn two_workstations_b_then_a_keep_both_versions() {
    two_workstations_change_one_dotfile("b", "a");
}

#[test]
fn deleted_here_modified_there_keeps_the_changed_file() {
    let fx = Fixture::new();
    write(&fx.s(".notes"), "v1\n");
    let (mnt_a, cache_a) = fx.workstation("a");
    let (mnt_b, cache_b) = fx.workstation("b");
    let a = fx.mount_at(&mnt_a, &cache_a, &[]);
    let b = fx.mount_at(&mnt_b, &cache_b, &[]);
    fs::remove_file(mnt_a.join(".notes")).expect("rm on a");
    write(&mnt_b.join(".notes"), "v2 from b\n");
    let out = b.umount();
    assert!(out.status.success(), "{}", text(&out));
    let out = a.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("deleted here but changed on the share"),
        "{}",
        text(&out)
    );
    assert_eq!(
        read(&fx.s(".notes")),
        "v2 from b\n",
        "the changed file must survive"
    );
}

#[test]
fn created_on_both_keeps_both_and_identical_content_is_no_conflict() {
    let fx = Fixture::new();
    let (mnt_a, cache_a) = fx.workstation("a");
    let (mnt_b, cache_b) = fx.workstation("b");
    let a = fx.mount_at(&mnt_a, &cache_a, &[]);
    let b = fx.mount_at(&mnt_b, &cache_b, &[]);
    write(&mnt_a.join(".new"), "made on a\n");
    write(&mnt_b.join(".new"), "made on b\n");
    write(&mnt_a.join(".same"), "default\n");
    write(&mnt_b.join(".same"), "default\n");
    assert!(a.umount().status.success());
    let out = b.umount();
    assert!(out.status.success(), "{}", text(&out));
    let says = String::from_utf8_lossy(&out.stdout);
    assert!(
        says.contains("conflict: .new was created on the share and here"),
        "{says}"
    );
    assert!(
        !says.contains(".same"),
        "identical files are no conflict: {says}"
    );
    assert_eq!(read(&fx.s(".new")), "made on a\n");
    let copies = conflict_copies(&fx.share, ".new");
    assert_eq!(copies.len(), 1);
    assert_eq!(read(&copies[0]), "made on b\n");
    assert_eq!(read(&fx.s(".same")), "default\n");
}

#[test]
fn status_shows_conflicts_found_by_a_sync_while_mounted() {
    let fx = Fixture::new();
    write(&fx.s(".rc"), "0\n");
    let m = fx.mount();
    write(&fx.m(".rc"), "ours\n");
    write(&fx.s(".rc"), "theirs, written on the share meanwhile\n");
    let out = ccfs(&["sync".as_ref(), fx.mnt.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out));
    let st = m.status();
    assert_eq!(st["conflicts"][0]["path"], ".rc", "{st}");
    assert_eq!(st["conflicts"][0]["kind"], "modified-on-both", "{st}");
    let human = String::from_utf8_lossy(&ccfs(&["status".as_ref(), fx.mnt.as_os_str()]).stdout)
        .into_owned();
    assert!(human.contains("conflict: .rc"), "{human}");
    assert_eq!(
        read(&fx.m(".rc")),
        "theirs, written on the share meanwhile\n"
    );
    drop(m);
    assert_eq!(read(&conflict_copies(&fx.share, ".rc")[0]), "ours\n");
}

// ---- periodic sync ----------------------------------------------------------------------

#[test]
fn periodic_sync_sends_changes_while_mounted() {
    let fx = Fixture::new();
    let cfg = fx.config("[sync]\ninterval_secs = 1\n");
    let m = fx.mount_with(&["--config", cfg.to_str().expect("utf8")]);
    write(&fx.m(".profile"), "export A=1\n");
    wait_until("periodic sync", Duration::from_secs(20), || {
        fs::read_to_string(fx.s(".profile")).is_ok_and(|t| t == "export A=1\n")
    });
    assert!(is_mounted(&fx.mnt));
    wait_until("status records it", Duration::from_secs(10), || {
        m.status()["last_sync"]["ok"] == true
    });
    drop(m);
}

// ---- kill -9 of the daemon during a write-heavy dotfile session ----------------------------

fn version_content(file: usize, v: u64) -> Vec<u8> {
    let len = 200 + ((file as u64 * 7919 + v * 104_729) % 20_000) as usize;
    let mut out = format!("f{file} v{v} len{len}\n").into_bytes();
    out.extend(pattern(len, file as u64 * 1_000_000 + v));
    out
}

/// The version a file holds, if it is exactly one complete version.
fn parse_version(file: usize, bytes: &[u8]) -> Option<u64> {
    let nl = bytes.iter().position(|b| *b == b'\n')?;
    let head = std::str::from_utf8(&bytes[..nl]).ok()?;
    let v: u64 = head.split(' ').nth(1)?.strip_prefix('v')?.parse().ok()?;
    (version_content(file, v) == bytes).then_some(v)
}

const FILES: usize = 4;

#[derive(Default)]
struct Durable {
    files: [u64; FILES],
    log: u64,
    record: u64,
}

/// Writes like a browser profile: temp + fsync + rename for whole files, an fsync'd
/// append-only log, and an in-place record rewritten with pwrite + fsync. Stops at the
/// first error (the daemon is gone).
fn writer(mnt: PathBuf, durable: Arc<Mutex<Durable>>, stop: Arc<AtomicBool>) {
    let dir = mnt.join(".mozilla/firefox/p");
    let go = || -> std::io::Result<()> {
        fs::create_dir_all(&dir)?;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("events.log"))?;
        let record = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("state.bin"))?;
        for v in 1u64.. {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            for f in 0..FILES {
                let name = dir.join(format!("f{f}.json"));
                let tmp = dir.join(format!("f{f}.json.tmp"));
                let mut t = OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .write(true)
                    .open(&tmp)?;
                t.write_all(&version_content(f, v))?;
                t.sync_all()?;
                drop(t);
                fs::rename(&tmp, &name)?;
                durable.lock().expect("lock").files[f] = v;
            }
            log.write_all(format!("v{v}\n").as_bytes())?;
            log.sync_all()?;
            durable.lock().expect("lock").log = v;
            let rec = format!("{v:020}");
            record.write_all_at(rec.as_bytes(), 0)?;
            record.sync_all()?;
            durable.lock().expect("lock").record = v;
        }
        Ok(())
    };
    let _ = go();
}

fn check_after_recovery(share: &Path, d: &Durable) {
    let dir = share.join(".mozilla/firefox/p");
    for f in 0..FILES {
        let p = dir.join(format!("f{f}.json"));
        match fs::read(&p) {
            Ok(bytes) => {
                let v = parse_version(f, &bytes)
                    .unwrap_or_else(|| panic!("{} is not one complete version", p.display()));
                assert!(
                    v >= d.files[f],
                    "{}: v{v} on the share, v{} was fsync'd",
                    p.display(),
                    d.files[f]
                );
            }
            Err(_) => assert_eq!(d.files[f], 0, "{} lost", p.display()),
        }
    }
    let log = fs::read_to_string(dir.join("events.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    assert!(
        lines.len() as u64 >= d.log,
        "log has {} lines, {} were fsync'd",
        lines.len(),
        d.log
    );
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(*l, format!("v{}", i + 1), "log line {i}");
    }
    assert!(log.is_empty() || log.ends_with('\n'), "torn log line");
    if d.record > 0 {
        let rec = fs::read_to_string(dir.join("state.bin")).expect("record");
        let v: u64 = rec
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("bad record {rec:?}"));
        assert!(v >= d.record);
    }
    // No leftovers of an interrupted rsync.
    assert!(!dir.join(ccfs::sync::PARTIAL_DIR).exists());
}

#[test]
fn kill_9_of_the_daemon_at_random_points_loses_no_fsynced_write() {
    let points = fault_points(20);
    let mut rng = Rng::new(0xCCF5);
    let mut killed_with_work = 0;
    for point in 0..points {
        let fx = Fixture::new();
        // Some points sync often, so kills also land inside a periodic sync.
        let cfg = fx.config(if point % 3 == 0 {
            "[sync]\ninterval_secs = 1\n"
        } else {
            ""
        });
        let m = fx.mount_with(&["--config", cfg.to_str().expect("utf8")]);
        let durable = Arc::new(Mutex::new(Durable::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let w = {
            let (mnt, d, s) = (fx.mnt.clone(), durable.clone(), stop.clone());
            std::thread::spawn(move || writer(mnt, d, s))
        };
        let delay = 30 + rng.below(if point % 3 == 0 { 1500 } else { 400 });
        std::thread::sleep(Duration::from_millis(delay));
        m.crash();
        stop.store(true, Ordering::Relaxed);
        w.join().expect("writer");
        let d = std::mem::take(&mut *durable.lock().expect("lock"));
        if d.log > 0 {
            killed_with_work += 1;
        }
        let out = ccfs(&[
            "recover".as_ref(),
            "--cache-dir".as_ref(),
            fx.cache.as_os_str(),
        ]);
        assert!(out.status.success(), "point {point}: {}", text(&out));
        check_after_recovery(&fx.share, &d);
        println!(
            "point {point}: killed after {delay} ms, {} rounds fsync'd: ok",
            d.log
        );
    }
    assert!(
        killed_with_work * 2 >= points,
        "most kills must land mid-session"
    );
}

// ---- kill of the sync midway --------------------------------------------------------------

fn old(i: usize) -> Vec<u8> {
    pattern(48 * 1024, i as u64)
}

fn new(i: usize) -> Vec<u8> {
    pattern(48 * 1024, 1000 + i as u64)
}

fn every_share_file_is_old_or_new(share: &Path, n: usize) -> (usize, usize) {
    let (mut olds, mut news) = (0, 0);
    for i in 0..n {
        let got = fs::read(share.join(format!(".data/f{i}"))).expect("share file");
        if got == old(i) {
            olds += 1;
        } else if got == new(i) {
            news += 1;
        } else {
            panic!(".data/f{i} on the share is neither the old nor the new version (a mix)");
        }
    }
    (olds, news)
}

fn sync_killed_midway(kill_daemon: bool, points: u64, seed: u64) {
    const N: usize = 24;
    let mut rng = Rng::new(seed);
    for point in 0..points {
        let fx = Fixture::new();
        fs::create_dir(fx.s(".data")).expect("mkdir");
        for i in 0..N {
            fs::write(fx.s(&format!(".data/f{i}")), old(i)).expect("old");
        }
        // Slow the transfer down so the kill lands inside it (about a second).
        let cfg = fx.config("[sync]\ninterval_secs = 0\nextra_args = [\"--bwlimit=1200\"]\n");
        let m = fx.mount_with(&["--config", cfg.to_str().expect("utf8")]);
        for i in 0..N {
            fs::write(fx.m(&format!(".data/f{i}")), new(i)).expect("new");
        }
        let pid = m.daemon_pid();
        let mut sync = Command::new(ccfs_bin())
            .arg("sync")
            .arg(&fx.mnt)
            .spawn()
            .expect("sync");
        // (The daemon's launcher, which starts rsync, is one of its descendants throughout.)
        let rsyncs = || descendants_named(pid, "rsync");
        wait_until("rsync to start", Duration::from_secs(10), || {
            !rsyncs().is_empty()
        });
        std::thread::sleep(Duration::from_millis(rng.below(900)));
        if kill_daemon {
            let kids = descendants(pid);
            kill(pid, libc::SIGKILL);
            for k in kids {
                kill(k, libc::SIGKILL);
            }
        } else {
            for k in rsyncs() {
                kill(k, libc::SIGKILL);
            }
        }
        let _ = sync.wait();
        let (olds, news) = every_share_file_is_old_or_new(&fx.share, N);
        if kill_daemon {
            wait_until("daemon death", Duration::from_secs(10), || !alive(pid));
            m.abandon();
            let out = ccfs(&[
                "recover".as_ref(),
                "--cache-dir".as_ref(),
                fx.cache.as_os_str(),
            ]);
            assert!(out.status.success(), "{}", text(&out));
        } else {
            assert!(alive(pid), "killing rsync must not take the daemon down");
            let out = m.umount();
            assert!(out.status.success(), "{}", text(&out));
        }
        let (_, all_new) = every_share_file_is_old_or_new(&fx.share, N);
        assert_eq!(all_new, N, "after recovery every file is the new version");
        assert!(
            !fx.s(&format!(".data/{}", ccfs::sync::PARTIAL_DIR)).exists(),
            "partial transfers must be cleaned up"
        );
        println!("point {point}: at the kill {olds} old + {news} new, after recovery all new");
    }
}

#[test]
fn killing_rsync_midway_leaves_old_or_new_files_and_logout_finishes() {
    sync_killed_midway(false, fault_points(4).min(50), 0x5EED_0001);
}

#[test]
fn killing_the_daemon_midway_through_a_sync_is_finished_by_recover() {
    sync_killed_midway(true, fault_points(4).min(50), 0x5EED_0002);
}

// ---- a full cache filesystem ------------------------------------------------------------

#[test]
fn a_full_cache_filesystem_gives_enospc_and_loses_nothing() {
    let fx = Fixture::new();
    fs::create_dir(fx.s(".config")).expect("mkdir");
    let big_old = pattern(3 << 20, 1);
    fs::write(fx.s(".config/big"), &big_old).expect("big");
    let small = fx.tmp.path().join("small");
    let _guard = SmallTmpfs::mount(&small, "2m");
    let cache = small.join("cache");
    // Files copied whole at their first write (held by block, the 3 MiB file's append
    // would need one block: `blocks.rs` has a database larger than the cache's room).
    let cfg = fx
        .config("[paths]\nby_block_from_kib = 0\n")
        .display()
        .to_string();
    let m = fx.mount_at(&fx.mnt, &cache, &["--config", &cfg]);
    fs::create_dir(fx.m(".data")).expect("mkdir");
    let mut written = Vec::new();
    let mut saw_enospc = false;
    for i in 0..40 {
        let p = fx.m(&format!(".data/f{i}"));
        let data = pattern(128 * 1024, 100 + i);
        let r = (|| -> std::io::Result<()> {
            let mut f = fs::File::create(&p)?;
            f.write_all(&data)?;
            f.sync_all()
        })();
        match r {
            Ok(()) => written.push((p, data)),
            Err(e) => {
                assert!(
                    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)),
                    "a full cache must answer ENOSPC, not {e}"
                );
                saw_enospc = true;
                let _ = fs::remove_file(&p);
                break;
            }
        }
    }
    assert!(saw_enospc, "the 2 MiB cache must fill up");
    // Copying up a 3 MiB file cannot fit: the first write, which copies it up (the open
    // defers it), fails cleanly and the old content stays.
    let mut f = OpenOptions::new()
        .append(true)
        .open(fx.m(".config/big"))
        .expect("the open defers the copy-up");
    let e = f.write_all(b"more").expect_err("copy-up cannot fit");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    drop(f);
    assert!(
        fs::read(fx.m(".config/big")).expect("read") == big_old,
        "no half copy is shown"
    );
    let out = m.umount();
    assert!(
        out.status.success(),
        "the logout sync needs no cache space: {}",
        text(&out)
    );
    for (p, data) in &written {
        let rel = p.strip_prefix(&fx.mnt).expect("rel");
        assert!(
            fs::read(fx.share.join(rel)).expect("on share") == *data,
            "{}",
            rel.display()
        );
    }
    assert!(fs::read(fx.s(".config/big")).expect("big") == big_old);
    assert!(!written.is_empty());
}

/// A cache left full at a logout (here by the session's local-only files, as a browser's
/// cache fills a disk): the logout still ends well, keeping no clean copy it has no room
/// to record (each is on the share as it is), and the next login mounts, shows every
/// file, and works once there is room again.
#[test]
fn a_cache_left_full_at_logout_keeps_no_clean_copy_and_the_next_login_works() {
    let fx = Fixture::new();
    fs::create_dir(fx.s(".config")).expect("mkdir");
    for i in 0..20 {
        fs::write(fx.s(&format!(".config/s{i}")), pattern(1024, i)).expect("write");
    }
    let small = fx.tmp.path().join("small");
    let _guard = SmallTmpfs::mount(&small, "2m");
    let cache = small.join("cache");
    let m = fx.mount_at(&fx.mnt, &cache, &[]);
    let ours = |i: u64| pattern(1000, 500 + i);
    for i in 0..20 {
        fs::write(fx.m(&format!(".config/s{i}")), ours(i)).expect("write");
    }
    fs::create_dir_all(fx.m(".cache")).expect("mkdir");
    let filler = fx.m(".cache/filler");
    let mut f = fs::File::create(&filler).expect("filler");
    let chunk = vec![7u8; 64 * 1024];
    let full = loop {
        if let Err(e) = f.write_all(&chunk).and_then(|()| f.sync_all()) {
            break e;
        }
    };
    assert_eq!(full.raw_os_error(), Some(libc::ENOSPC), "{full}");
    // (Every last block: the journal has no room left either.)
    let mut byte = 0;
    while f.write_all(&[7]).and_then(|()| f.sync_all()).is_ok() && byte < 1 << 20 {
        byte += 1;
    }
    drop(f);
    let out = m.umount();
    assert!(
        out.status.success(),
        "a full cache must not fail the logout: {}",
        text(&out)
    );
    for i in 0..20 {
        assert!(fs::read(fx.s(&format!(".config/s{i}"))).expect("share") == ours(i));
    }
    let m = fx.mount_at(&fx.mnt, &cache, &[]);
    for i in 0..20 {
        assert!(fs::read(fx.m(&format!(".config/s{i}"))).expect("view") == ours(i));
    }
    fs::remove_file(&filler).expect("the user frees room");
    fs::write(fx.m(".config/s0"), b"later").expect("a write once there is room");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::read(fx.s(".config/s0")).expect("share"), b"later");
}

// ---- a share that answers a failed write at the close ------------------------------------

/// Saves `data` as `p` the way a program does (create, write, close) and answers with the
/// first error of the three: what the program is told of its save.
fn save(p: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = fs::File::create(p)?;
    let written = f.write_all(data);
    let closed = close_checked(f);
    written.and(closed)
}

/// A document saved on a share whose client writes behind (sshfs: a write is answered
/// before the server has it, and one the server failed is answered at the close), with
/// the server's disk full: the program is told its save failed, at the write or at the
/// close, as it is told on the share's own mount; a save that is answered well is whole
/// on the server by then. The same as the share's own client: a save with room, and a
/// document saved again once there is room.
#[test]
fn a_save_the_share_fails_behind_the_write_fails_at_the_close() {
    let fx = Fixture::new();
    let share = SftpShare::mount(&fx, "2m");
    fs::create_dir(fx.s("Documents")).expect("mkdir");
    let on_server = |name: &str| fs::read(share.server().join("Documents").join(name));
    // The share's own client, for the record of what it tells a program.
    share.fill_leaving(100 << 10);
    let direct = save(&fx.s("Documents/direct.odt"), &pattern(400 << 10, 1));
    assert!(direct.is_err(), "sshfs itself tells of the failed save");
    fs::remove_file(fx.s("Documents/direct.odt")).expect("rm");
    share.empty();

    let m = fx.mount();
    let notes = pattern(300 << 10, 2);
    save(&fx.m("Documents/notes.odt"), &notes).expect("a save with room");
    assert!(
        on_server("notes.odt").expect("on the server") == notes,
        "a save answered well is whole on the server when its close returns"
    );
    share.fill_leaving(100 << 10);
    let report = pattern(400 << 10, 3);
    let e = save(&fx.m("Documents/report.odt"), &report)
        .expect_err("a save the server could not take must not be answered as done");
    assert!(
        matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::ENOSPC)),
        "the share's own error, not {e}"
    );
    let kept = on_server("report.odt").unwrap_or_default();
    assert!(kept.len() < report.len(), "the server did run out of room");
    share.empty();
    save(&fx.m("Documents/report.odt"), &report).expect("saved again with room");
    assert!(on_server("report.odt").expect("on the server") == report);
    // A dotfile's write stays in the cache until the logout, which sends it.
    save(&fx.m(".profile"), b"export A=1\n").expect("dotfile");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        fs::read(share.server().join(".profile")).expect(".profile"),
        b"export A=1\n"
    );
    assert!(on_server("notes.odt").expect("notes") == notes);
}

/// A sync between a document's write and its close (a periodic sync, `ccfs sync`) that
/// starts rsync (a dotfile open for writing is sent by rsync): the document's save the
/// server failed is still told to the program at its close, not taken by what the daemon
/// starts (a process that starts holds a copy of every open file, and each copy closed is
/// a flush, which the share's client answers with the save's error, once). The program
/// holding the document starts nothing itself meanwhile (its own child would take the
/// error so: the share's client does the same without ccfs).
#[test]
fn a_sync_between_a_failed_write_and_its_close_leaves_the_error_to_the_close() {
    let fx = Fixture::new();
    let share = SftpShare::mount(&fx, "2m");
    fs::create_dir(fx.s("Documents")).expect("mkdir");
    let _m = fx.mount();
    share.fill_leaving(100 << 10);
    // One write of the document (answered before the server has it: sshfs writes behind)
    // and a dotfile kept open for writing; the close once told to.
    let (save, wrote) = HeldSave::start(
        None,
        &fx.m("Documents/report.odt"),
        300 << 10,
        Some(&fx.m(".profile")),
    );
    assert_eq!(
        wrote,
        format!("written {}", 300 << 10),
        "the write was answered"
    );
    // (The server is full: the dotfile stays in the cache; rsync did run.)
    let out = e2e::ccfs(&["sync".as_ref(), fx.mnt.as_os_str()]);
    assert!(
        text(&out).contains(".profile"),
        "the sync tried to send the dotfile: {}",
        text(&out)
    );
    let closed = save.close();
    let kept = fs::read(share.server().join("Documents/report.odt")).unwrap_or_default();
    assert!(kept.len() < 300 << 10, "the server did run out of room");
    assert!(
        told_the_save_failed(&closed),
        "a save the server could not take must not be answered as done at its close: {closed}"
    );
    share.empty();
}

/// A network filesystem mounted below a share on a local disk (a project directory
/// automounted in the home): a save there is its client's as on the share itself, told to
/// the program when the server failed it, whole on the server once answered well.
#[test]
fn a_save_on_a_network_filesystem_mounted_in_the_share_fails_at_the_close_too() {
    let fx = Fixture::new();
    let share = SftpShare::mount_at(&fx, &fx.s("projects"), "2m");
    let m = fx.mount();
    share.fill_leaving(100 << 10);
    let report = pattern(400 << 10, 4);
    let e = save(&fx.m("projects/report.odt"), &report)
        .expect_err("a save the server could not take must not be answered as done");
    assert!(
        matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::ENOSPC)),
        "the share's own error, not {e}"
    );
    share.empty();
    save(&fx.m("projects/report.odt"), &report).expect("saved again with room");
    assert!(fs::read(share.server().join("report.odt")).expect("on the server") == report);
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
}

// ---- a program that keeps writing across a crash ------------------------------------------

/// A program of the user's that keeps a file open for appending: each line sent to it is
/// written through its one descriptor, and it answers whether the write succeeded.
struct Holder {
    child: std::process::Child,
    to: std::process::ChildStdin,
    from: std::io::BufReader<std::process::ChildStdout>,
}

impl Holder {
    fn open(user: &str, path: &Path) -> Self {
        use std::process::Stdio;
        let script = format!(
            "exec 3>>'{}' || exit 1; echo open; \
             while IFS= read -r line; do \
               if printf '%s\\n' \"$line\" >&3; then echo ok; else echo failed; fi; \
             done",
            path.display()
        );
        let mut child = Command::new("setpriv")
            .args([
                "--reuid",
                user,
                "--regid",
                user,
                "--init-groups",
                "sh",
                "-c",
                &script,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("setpriv");
        let to = child.stdin.take().expect("stdin");
        let from = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut h = Holder { child, to, from };
        assert_eq!(
            h.answer(),
            "open",
            "the holder could not open {}",
            path.display()
        );
        h
    }

    fn answer(&mut self) -> String {
        let mut s = String::new();
        std::io::BufRead::read_line(&mut self.from, &mut s).expect("holder answers");
        s.trim().to_string()
    }

    /// Writes one line; true when the write succeeded.
    fn write(&mut self, line: &str) -> bool {
        writeln!(self.to, "{line}").expect("to holder");
        self.to.flush().expect("flush");
        match self.answer().as_str() {
            "ok" => true,
            "failed" => false,
            other => panic!("holder: {other:?}"),
        }
    }

    /// Closes the descriptor (the program ends).
    fn close(self) {
        let Holder { mut child, to, .. } = self;
        drop(to);
        let st = child.wait().expect("wait holder");
        assert!(st.success(), "holder: {st:?}");
    }
}

/// Regression: with kernel passthrough, a descriptor a program holds on a dotfile keeps
/// writing the cache's file after the daemon is killed (the kernel does the writes). The
/// recovery used to send the cache and empty it: every later write "succeeded" into a
/// removed file and was lost. Now a write after the crash either fails, or is kept: the
/// recovery leaves a file still open for writing in the cache as unsynced work (and says
/// so), and the next session shows it and sends it at logout. A crash without a holder
/// still empties the cache.
#[test]
fn a_write_through_a_descriptor_held_across_a_crash_and_recovery_is_kept() {
    let alice = account("ccfs-alice");
    let fx = Fixture::new();
    fs::set_permissions(
        fx.tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod tmp");
    std::os::unix::fs::chown(&fx.share, Some(alice.uid), Some(alice.gid)).expect("chown");
    let m = fx.mount_with(&["--user", "ccfs-alice"]);
    let out = as_user(
        "ccfs-alice",
        &format!(
            "mkdir {mnt}/.config && echo done > {mnt}/.config/done && echo top > {mnt}/.top",
            mnt = fx.mnt.display()
        ),
    );
    assert!(out.status.success(), "{}", text(&out));
    let log = fx.m(".config/app.log");
    let mut h = Holder::open("ccfs-alice", &log);
    let mut kept = vec!["1 before the crash".to_string()];
    assert!(h.write(&kept[0]), "a write to a live mount");

    // Without kernel passthrough (a kernel before 6.9) the writes below fail at once.
    let passthrough =
        read(&fx.cache.join("ccfs.log")).contains("kernel passthrough of open files is on");

    m.crash(); // kill -9, then `fusermount3 -u -z` of the dead mount
    let line = "2 after the crash".to_string();
    let wrote = h.write(&line);
    assert_eq!(
        wrote, passthrough,
        "a write after the crash succeeds only through passthrough"
    );
    if wrote {
        kept.push(line);
    }
    let out = ccfs(&[
        "recover".as_ref(),
        "--cache-dir".as_ref(),
        fx.cache.as_os_str(),
    ]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    if passthrough {
        assert!(
            said.contains(".config/app.log was sent as it was, and is kept as unsynced work"),
            "the recovery names the file it keeps: {}",
            text(&out)
        );
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(fx.cache.join("upper/.config/app.log").exists());
        assert!(
            not_clean_copies(&fx.cache, &fx.share, "")
                .iter()
                .all(|p| p == ".config/app.log"),
            "besides clean copies, only the held file stays in the cache"
        );
    } else {
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(
            not_clean_copies(&fx.cache, &fx.share, ""),
            Vec::<String>::new()
        );
    }
    assert_eq!(read(&fx.s(".config/done")), "done\n", "{}", text(&out));
    assert_eq!(read(&fx.s(".top")), "top\n");
    assert_eq!(
        read(&fx.s(".config/app.log")),
        kept.iter().map(|l| format!("{l}\n")).collect::<String>(),
        "the recovery sends what the file held"
    );
    assert_eq!(
        not_clean_copies(&fx.cache, &fx.share, ".top"),
        Vec::<String>::new()
    );

    let line = "3 after the recovery".to_string();
    if h.write(&line) {
        kept.push(line);
    }
    h.close();
    let all: String = kept.iter().map(|l| format!("{l}\n")).collect();

    // The next session shows every line and its logout sends them.
    let m = fx.mount_with(&["--user", "ccfs-alice"]);
    let out = as_user("ccfs-alice", &format!("cat {}", log.display()));
    assert_eq!(String::from_utf8_lossy(&out.stdout), all, "{}", text(&out));
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        read(&fx.s(".config/app.log")),
        all,
        "every line written through the held descriptor reaches the share"
    );
    assert_eq!(
        not_clean_copies(&fx.cache, &fx.share, ""),
        Vec::<String>::new()
    );

    // Without a holder, a crash and its recovery empty the cache as before.
    let m = fx.mount_with(&["--user", "ccfs-alice"]);
    let out = as_user("ccfs-alice", &format!("echo later >> {}", log.display()));
    assert!(out.status.success(), "{}", text(&out));
    m.crash();
    let out = ccfs(&[
        "recover".as_ref(),
        "--cache-dir".as_ref(),
        fx.cache.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".config/app.log")), format!("{all}later\n"));
    assert_eq!(
        not_clean_copies(&fx.cache, &fx.share, ""),
        Vec::<String>::new()
    );
}
