//! Real ccfs mounts over a temporary share, driven through the `ccfs` binary.

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use e2e::*;

/// A dotfile saved with the bytes it had (a program that writes back what it read), and
/// one only touched, are not sent at logout: the share keeps its file (same inode), with
/// the mtime the session gave it. One saved with other bytes of the same size is sent.
#[test]
fn a_dotfile_saved_unchanged_is_not_sent_but_keeps_its_new_mtime() {
    use std::os::unix::fs::MetadataExt;
    let fx = Fixture::new();
    fs::create_dir(fx.s(".config")).expect("mkdir");
    for f in ["same.conf", "touched.stamp", "other.conf"] {
        fs::write(fx.s(&format!(".config/{f}")), "setting = 1\n").expect("seed");
    }
    let ino = |f: &str| {
        fs::metadata(fx.s(&format!(".config/{f}")))
            .expect("stat")
            .ino()
    };
    let before: Vec<u64> = ["same.conf", "touched.stamp", "other.conf"]
        .iter()
        .map(|f| ino(f))
        .collect();
    let m = fx.mount();
    write(&fx.m(".config/same.conf"), "setting = 1\n");
    write(&fx.m(".config/other.conf"), "setting = 2\n");
    let t = Command::new("touch")
        .args(["-d", "2031-05-06 07:08:09"])
        .arg(fx.m(".config/touched.stamp"))
        .output()
        .expect("touch");
    assert!(t.status.success(), "{}", text(&t));
    let mtime_here = |f: &str| {
        fs::metadata(fx.m(&format!(".config/{f}")))
            .expect("stat")
            .mtime()
    };
    let wanted = [mtime_here("same.conf"), mtime_here("touched.stamp")];
    assert!(
        fx.cache.join("upper/.config/same.conf").exists(),
        "the save went to the cache"
    );
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("2 changed files were on the share as they are: not sent"),
        "{said}"
    );
    assert_eq!(ino("same.conf"), before[0], "the share's file stays");
    assert_eq!(ino("touched.stamp"), before[1], "the share's file stays");
    assert_ne!(
        ino("other.conf"),
        before[2],
        "a changed file is sent (a new file)"
    );
    assert_eq!(read(&fx.s(".config/other.conf")), "setting = 2\n");
    assert_eq!(read(&fx.s(".config/same.conf")), "setting = 1\n");
    let mtime_there = |f: &str| {
        fs::metadata(fx.s(&format!(".config/{f}")))
            .expect("stat")
            .mtime()
    };
    assert_eq!(
        [mtime_there("same.conf"), mtime_there("touched.stamp")],
        wanted,
        "the mtimes of the session stand on the share"
    );
}

#[test]
fn dotfile_write_stays_local_until_logout_document_goes_through_at_once() {
    let fx = Fixture::new();
    write(&fx.s(".bashrc"), "old\n");
    fs::create_dir(fx.s("Documents")).expect("mkdir");
    let m = fx.mount();
    write(&fx.m(".bashrc"), "new\n");
    write(&fx.m("Documents/report.txt"), "draft\n");
    assert_eq!(read(&fx.m(".bashrc")), "new\n");
    assert_eq!(
        read(&fx.s(".bashrc")),
        "old\n",
        "the share must not see the dotfile yet"
    );
    assert_eq!(
        read(&fx.s("Documents/report.txt")),
        "draft\n",
        "documents go straight through"
    );
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert!(!is_mounted(&fx.mnt));
    assert_eq!(read(&fx.s(".bashrc")), "new\n");
}

#[test]
fn dotfile_delete_and_rename_reach_the_share_at_logout() {
    let fx = Fixture::new();
    fs::create_dir_all(fx.s(".config/app")).expect("mkdir");
    write(&fx.s(".config/app/old.conf"), "A");
    write(&fx.s(".config/app/gone.conf"), "B");
    write(&fx.s(".profile"), "C");
    let m = fx.mount();
    fs::rename(fx.m(".config/app/old.conf"), fx.m(".config/app/new.conf")).expect("rename");
    fs::remove_file(fx.m(".config/app/gone.conf")).expect("unlink");
    fs::remove_file(fx.m(".profile")).expect("unlink");
    let names: Vec<_> = fs::read_dir(fx.m(".config/app"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
        .collect();
    assert_eq!(names, vec!["new.conf".to_string()]);
    assert!(!fx.m(".profile").exists());
    // Not yet on the share.
    assert!(fx.s(".config/app/old.conf").exists());
    assert!(fx.s(".profile").exists());
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".config/app/new.conf")), "A");
    assert!(!fx.s(".config/app/old.conf").exists());
    assert!(!fx.s(".config/app/gone.conf").exists());
    assert!(!fx.s(".profile").exists());
}

#[test]
fn local_only_cache_content_never_reaches_the_share() {
    let fx = Fixture::new();
    let m = fx.mount();
    fs::create_dir_all(fx.m(".cache/mozilla/firefox")).expect("mkdir");
    write(&fx.m(".cache/mozilla/firefox/blob"), "cache entry");
    write(&fx.m(".keep"), "synced");
    assert_eq!(read(&fx.m(".cache/mozilla/firefox/blob")), "cache entry");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !fx.s(".cache").exists(),
        "local-only paths must never be synced"
    );
    assert_eq!(read(&fx.s(".keep")), "synced");
    // The cache survives for the next session on this workstation.
    let m = fx.mount();
    assert_eq!(read(&fx.m(".cache/mozilla/firefox/blob")), "cache entry");
    drop(m);
}

/// Databases passed through (the variant's list): every commit is on the share during the
/// session, and the cache holds none of it.
#[test]
fn sqlite_database_in_a_dot_directory_with_a_second_reader() {
    sqlite_with_a_second_reader(false);
}

/// Databases cached (the default): the database stays in the cache during the session and
/// reaches the share at logout.
#[test]
fn a_cached_sqlite_database_with_a_second_reader() {
    sqlite_with_a_second_reader(true);
}

fn sqlite_with_a_second_reader(cached: bool) {
    let fx = Fixture::new();
    let m = if cached {
        fx.mount()
    } else {
        let cfg = fx.databases_passed_through();
        fx.mount_with(&["--config", &cfg])
    };
    let dir = fx.m(".mozilla/firefox/test.default");
    fs::create_dir_all(&dir).expect("mkdir");
    let db = dir.join("places.sqlite");
    let sql = |q: &str| {
        let out = Command::new("sqlite3")
            .arg(&db)
            .arg(q)
            .output()
            .expect("sqlite3 installed");
        assert!(out.status.success(), "sqlite3 {q}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    sql("PRAGMA journal_mode=WAL; CREATE TABLE visits(id INTEGER PRIMARY KEY, url TEXT);");
    let mut inserts = String::from("BEGIN;");
    for i in 0..500 {
        inserts.push_str(&format!(
            "INSERT INTO visits(url) VALUES('https://example.org/{i}');"
        ));
    }
    inserts.push_str("COMMIT;");
    sql(&inserts);
    // A second process keeps the database open for reading while the first one writes.
    let mut reader = Command::new("sqlite3")
        .arg(&db)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("reader");
    sql("INSERT INTO visits(url) VALUES('late');");
    {
        let stdin = reader.stdin.as_mut().expect("stdin");
        stdin
            .write_all(b"SELECT count(*) FROM visits;\nPRAGMA integrity_check;\n.quit\n")
            .expect("query");
    }
    let out = reader.wait_with_output().expect("reader output");
    let answer = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        answer.lines().collect::<Vec<_>>(),
        vec!["501", "ok"],
        "{answer}"
    );
    let on_share = fx.s(".mozilla/firefox/test.default/places.sqlite");
    if cached {
        assert!(
            !fx.s(".mozilla").exists(),
            "the database stays in the cache during the session"
        );
    } else {
        let out = Command::new("sqlite3")
            .arg(&on_share)
            .arg("SELECT count(*) FROM visits;")
            .output()
            .expect("sqlite3");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "501",
            "every commit is on the share during the session: {}",
            text(&out)
        );
        assert!(
            !fx.cache
                .join("upper/.mozilla/firefox/test.default/places.sqlite")
                .exists(),
            "the cache holds no copy"
        );
    }
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    let out = Command::new("sqlite3")
        .arg(&on_share)
        .arg("SELECT count(*) FROM visits; PRAGMA integrity_check;")
        .output()
        .expect("sqlite3");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "501\nok");
}

/// A file on the share opened read-write is copied to the cache at its first write, not
/// at open: opened and closed unwritten it stays where it is; written, the change stays
/// local until logout and the rest of the file is intact.
#[test]
fn opening_a_share_dotfile_read_write_copies_it_only_when_written() {
    use std::os::unix::fs::FileExt;
    let fx = Fixture::new();
    fs::create_dir_all(fx.s(".app")).expect("mkdir");
    let big: Vec<u8> = (0..4_000_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(fx.s(".app/data.db"), &big).expect("seed");
    let m = fx.mount();
    let status = || -> serde_json::Value {
        let out = ccfs(&["status".as_ref(), "--json".as_ref(), fx.mnt.as_os_str()]);
        serde_json::from_slice(&out.stdout).expect("json")
    };
    {
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(fx.m(".app/data.db"))
            .expect("open rw");
        let mut head = [0u8; 16];
        f.read_exact_at(&mut head, 0).expect("read");
        assert_eq!(&head[..], &big[..16]);
        f.sync_all().expect("fsync with nothing written");
    }
    assert_eq!(
        status()["dirty_files"],
        0,
        "opened, not written: nothing to sync"
    );
    assert!(
        !fx.cache.join("upper/.app/data.db").exists(),
        "no copy made for an unwritten open"
    );
    {
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(fx.m(".app/data.db"))
            .expect("open rw");
        f.write_all_at(b"XY", 2_000_000).expect("write");
        let mut back = [0u8; 4];
        f.read_exact_at(&mut back, 1_999_999).expect("read back");
        assert_eq!(back, [big[1_999_999], b'X', b'Y', big[2_000_002]]);
    }
    assert_eq!(status()["dirty_files"], 1);
    assert_eq!(
        fs::read(fx.s(".app/data.db")).expect("share"),
        big,
        "share untouched"
    );
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    let mut want = big.clone();
    want[2_000_000..2_000_002].copy_from_slice(b"XY");
    assert!(
        fs::read(fx.s(".app/data.db")).expect("share") == want,
        "synced whole"
    );
}

/// Two processes hold a share database open read-write; one writes and checkpoints it
/// (which copies it to the cache), the other, still unwritten, must read the new pages.
#[test]
fn a_reader_of_a_share_database_sees_another_process_write_it() {
    let fx = Fixture::new();
    fs::create_dir_all(fx.s(".mozilla")).expect("mkdir");
    // A reader may meet the writer's checkpoint: wait for locks as applications do.
    let sql_at = |db: &Path, q: &str| {
        let out = Command::new("sqlite3")
            .args(["-cmd", ".timeout 10000"])
            .arg(db)
            .arg(q)
            .output()
            .expect("sqlite3 installed");
        assert!(out.status.success(), "sqlite3 {q}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let mut seed = String::from(
        "PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT); BEGIN;",
    );
    for i in 0..300 {
        seed.push_str(&format!("INSERT INTO t(v) VALUES('{i}');"));
    }
    seed.push_str("COMMIT; PRAGMA wal_checkpoint(TRUNCATE);");
    sql_at(&fx.s(".mozilla/p.sqlite"), &seed);
    // Databases cached: the checkpoint copies the database up (the default passes it
    // through).
    let cfg = fx.cached_databases();
    let m = fx.mount_with(&["--config", &cfg]);
    let db = fx.m(".mozilla/p.sqlite");
    // The readers open first (read-write, as sqlite3 does; and read-only), and read.
    let open_reader = |args: &[&str]| {
        let mut child = Command::new("sqlite3")
            .args(["-cmd", ".timeout 10000"])
            .args(args)
            .arg(&db)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sqlite3 reader");
        let stdin = child.stdin.as_mut().expect("stdin");
        stdin
            .write_all(b"SELECT count(*) FROM t;\n")
            .expect("query");
        stdin.flush().expect("flush");
        child
    };
    let mut ro_reader = open_reader(&["-readonly"]);
    let mut reader = open_reader(&[]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    // The writer adds rows and checkpoints them into the database file.
    sql_at(
        &db,
        "INSERT INTO t(v) VALUES('a'); INSERT INTO t(v) VALUES('b'); PRAGMA wal_checkpoint(TRUNCATE);",
    );
    // Without the kernel's page cache (which both handles share), the reader's own handle
    // must serve the new pages.
    let _ = fs::write("/proc/sys/vm/drop_caches", "3\n");
    for r in [&mut reader, &mut ro_reader] {
        r.stdin
            .as_mut()
            .expect("stdin")
            .write_all(b"SELECT count(*) FROM t;\n.quit\n")
            .expect("query");
    }
    for r in [reader, ro_reader] {
        let out = r.wait_with_output().expect("reader output");
        let answer = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = answer.lines().collect();
        assert_eq!(&lines[..2], ["300", "302"], "{answer}");
    }
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        sql_at(
            &fx.s(".mozilla/p.sqlite"),
            "SELECT count(*) FROM t; PRAGMA integrity_check;"
        ),
        "302\nok"
    );
}

/// Workstation A holds `.db` open read-write, unwritten (the copy-up deferred); B changes
/// it (`replace`: writes a new version; else deletes it) and logs out. A's later writes
/// through the open handle are kept: copied up with the file A had open as their base, so
/// A's logout finds the conflict and keeps both versions. Returns A's logout output.
fn write_after_another_workstation_logged_out(fx: &Fixture, replace: bool) -> String {
    use std::os::unix::fs::FileExt;
    let (mnt_a, cache_a) = fx.workstation("a");
    let (mnt_b, cache_b) = fx.workstation("b");
    let a = fx.mount_at(&mnt_a, &cache_a, &[]);
    let b = fx.mount_at(&mnt_b, &cache_b, &[]);
    let open_rw = || {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(mnt_a.join(".db"))
            .expect("open read-write on a")
    };
    let (f, other) = (open_rw(), open_rw());
    let mut head = [0u8; 7];
    f.read_exact_at(&mut head, 0).expect("read on a");
    other.read_exact_at(&mut head, 0).expect("read on a");
    if replace {
        write(&mnt_b.join(".db"), "b's version of the database\n");
    } else {
        fs::remove_file(mnt_b.join(".db")).expect("rm on b");
    }
    let out = b.umount();
    assert!(out.status.success(), "{}", text(&out));
    f.write_all_at(b"A WROTE THIS", 0).expect("write on a");
    f.sync_all().expect("fsync on a");
    let mut back = String::new();
    (&other).read_to_string(&mut back).expect("read on a");
    assert_eq!(
        back, "A WROTE THIS the database\n",
        "another handle on the same file sees the write"
    );
    drop((f, other));
    let out = a.umount();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_write_after_another_workstation_replaced_the_file_is_kept_as_a_conflict() {
    let fx = Fixture::new();
    write(&fx.s(".db"), "version 0 of the database\n");
    let says = write_after_another_workstation_logged_out(&fx, true);
    assert!(
        says.contains("conflict: .db was changed on the share"),
        "{says}"
    );
    assert_eq!(
        read(&fx.s(".db")),
        "b's version of the database\n",
        "the version that reached the share first stays at the name"
    );
    let copies = conflict_copies(&fx.share, ".db");
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_eq!(read(&copies[0]), "A WROTE THIS the database\n");
}

#[test]
fn a_write_after_another_workstation_deleted_the_file_is_written_back() {
    let fx = Fixture::new();
    write(&fx.s(".db"), "version 0 of the database\n");
    let says = write_after_another_workstation_logged_out(&fx, false);
    assert!(
        says.contains("conflict: .db was deleted on the share but changed here"),
        "{says}"
    );
    assert_eq!(read(&fx.s(".db")), "A WROTE THIS the database\n");
}

#[test]
fn two_processes_append_to_one_cached_file_at_once() {
    let fx = Fixture::new();
    let m = fx.mount();
    let log = fx.m(".local/share/app.log");
    fs::create_dir_all(log.parent().expect("parent")).expect("mkdir");
    let script =
        "for i in $(seq 1 400); do echo \"$0-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\" >> \"$1\"; done";
    let a = Command::new("sh")
        .args(["-c", script, "A"])
        .arg(&log)
        .spawn()
        .expect("a");
    let b = Command::new("sh")
        .args(["-c", script, "B"])
        .arg(&log)
        .spawn()
        .expect("b");
    for mut c in [a, b] {
        assert!(c.wait().expect("wait").success());
    }
    let check = |content: &str| {
        let lines: Vec<&str> = content.lines().collect();
        assert_eq!(lines.len(), 800, "every append must land");
        for who in ["A", "B"] {
            let mine: Vec<&str> = lines
                .iter()
                .copied()
                .filter(|l| l.starts_with(who))
                .collect();
            assert_eq!(mine.len(), 400);
            for (i, l) in mine.iter().enumerate() {
                assert_eq!(
                    *l,
                    format!("{who}-{}-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", i + 1),
                    "torn or reordered line"
                );
            }
        }
    };
    check(&read(&log));
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    check(&read(&fx.s(".local/share/app.log")));
}

#[test]
fn inode_numbers_stay_stable_across_copy_up_and_rename() {
    let fx = Fixture::new();
    write(&fx.s(".gitconfig"), "[user]\n");
    let m = fx.mount();
    let before = fs::metadata(fx.m(".gitconfig")).expect("stat").ino();
    let mut f = OpenOptions::new()
        .append(true)
        .open(fx.m(".gitconfig"))
        .expect("open");
    f.write_all(b"\tname = x\n").expect("append");
    drop(f);
    let after = fs::metadata(fx.m(".gitconfig")).expect("stat").ino();
    assert_eq!(before, after, "copy-up must not change the inode number");
    fs::rename(fx.m(".gitconfig"), fx.m(".gitconfig.bak")).expect("rename");
    assert_eq!(
        fs::metadata(fx.m(".gitconfig.bak")).expect("stat").ino(),
        before
    );
    // The number listed by readdir matches stat.
    let listed = fs::read_dir(&fx.mnt)
        .expect("readdir")
        .map(|e| e.expect("entry"))
        .find(|e| e.file_name() == ".gitconfig.bak")
        .expect("listed");
    assert_eq!(std::os::unix::fs::DirEntryExt::ino(&listed), before);
    drop(m);
}

#[test]
fn sync_command_pushes_while_mounted_and_status_counts() {
    let fx = Fixture::new();
    let m = fx.mount();
    write(&fx.m(".a"), "12345");
    write(&fx.m(".b"), "678");
    let out = ccfs(&["status".as_ref(), "--json".as_ref(), fx.mnt.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out));
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(st["dirty_files"], 2);
    assert_eq!(st["dirty_bytes"], 8);
    assert_eq!(st["pending_deletions"], 0);
    assert!(st["last_sync"].is_null());
    // Without a mount point, status lists every ccfs mount, this one among them.
    let out = ccfs(&["status".as_ref(), "--json".as_ref()]);
    assert!(out.status.success(), "{}", text(&out));
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let ours = fx.mnt.canonicalize().expect("mnt").display().to_string();
    assert!(
        all.as_array()
            .expect("list")
            .iter()
            .any(|m| m["mountpoint"] == ours.as_str()),
        "{all}"
    );
    let out = ccfs(&["sync".as_ref(), fx.mnt.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(is_mounted(&fx.mnt), "sync must stay mounted");
    assert_eq!(read(&fx.s(".a")), "12345");
    fs::remove_file(fx.m(".b")).expect("rm");
    let out = ccfs(&["status".as_ref(), "--json".as_ref(), fx.mnt.as_os_str()]);
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(st["dirty_files"], 0);
    assert_eq!(st["pending_deletions"], 1);
    assert_eq!(st["last_sync"]["ok"], true);
    // Human output names the numbers too.
    let out = ccfs(&["status".as_ref(), fx.mnt.as_os_str()]);
    let human = String::from_utf8_lossy(&out.stdout);
    assert!(human.contains("pending deletions: 1"), "{human}");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert!(!fx.s(".b").exists());
}

#[test]
fn status_counts_the_requests_served_and_the_bytes_written() {
    let fx = Fixture::new();
    // Data that the kernel reads and writes itself never reaches the daemon's counters:
    // counted through the daemon, as the login-storm's share meter does.
    let conf = fx.config("[mount]\nkernel_passthrough = false\n");
    let m = fx.mount_with(&["--config", conf.to_str().expect("utf-8")]);
    let status = || -> serde_json::Value {
        let out = ccfs(&["status".as_ref(), "--json".as_ref(), fx.mnt.as_os_str()]);
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).expect("json")
    };
    let before = status()["requests"].clone();
    for i in 0..3 {
        write(&fx.m(&format!("doc{i}.txt")), &"x".repeat(1000));
    }
    fs::rename(fx.m("doc0.txt"), fx.m("renamed.txt")).expect("rename");
    assert_eq!(read(&fx.m("doc1.txt")).len(), 1000);
    let after = status()["requests"].clone();
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or(0);
    let op = |v: &serde_json::Value, k: &str| v["by_op"][k].as_u64().unwrap_or(0);
    assert_eq!(n(&after, "write_bytes") - n(&before, "write_bytes"), 3000);
    assert_eq!(op(&after, "create") - op(&before, "create"), 3);
    assert_eq!(op(&after, "rename") - op(&before, "rename"), 1);
    assert!(n(&after, "read_bytes") - n(&before, "read_bytes") >= 1000);
    assert!(
        n(&after, "mutating") - n(&before, "mutating") >= 7,
        "{after}"
    );
    assert!(n(&after, "total") > n(&after, "mutating"));
    let human =
        String::from_utf8_lossy(&ccfs(&["status".as_ref(), fx.mnt.as_os_str()]).stdout).to_string();
    assert!(human.contains("requests served: "), "{human}");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
}

/// `[mount] count_paths = N` counts each request by the first N components of its path
/// too (what a share-side meter needs to tell where a login's requests go); without it
/// there is no count by path at all.
#[test]
fn status_counts_requests_by_path_when_asked() {
    let fx = Fixture::new();
    fs::create_dir_all(fx.s(".mozilla/firefox/p")).expect("mkdir");
    fs::create_dir_all(fx.s("Documents")).expect("mkdir");
    let status = || -> serde_json::Value {
        let out = ccfs(&["status".as_ref(), "--json".as_ref(), fx.mnt.as_os_str()]);
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).expect("json")
    };
    let conf = fx.config("[mount]\ncount_paths = 2\n");
    let m = fx.mount_with(&["--config", conf.to_str().expect("utf-8")]);
    for i in 0..5 {
        write(&fx.m(&format!(".mozilla/firefox/p/f{i}")), "x");
    }
    write(&fx.m("Documents/a.txt"), "y");
    let by_path = status()["requests"]["by_path"].clone();
    let n = |k: &str| by_path[k].as_u64().unwrap_or(0);
    // Each new file: at least its LOOKUP and its CREATE, all below ".mozilla/firefox".
    assert!(n(".mozilla/firefox") >= 10, "{by_path}");
    assert!(n("Documents/a.txt") >= 2, "{by_path}");
    assert!(
        by_path
            .as_object()
            .is_some_and(|o| o.keys().all(|k| k.split('/').count() <= 2)),
        "keys of at most two components: {by_path}"
    );
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    // Off by default: no paths kept.
    let m = fx.mount();
    write(&fx.m("Documents/b.txt"), "z");
    assert!(status()["requests"]["by_path"].is_null(), "{}", status());
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
}

/// With kernel passthrough (the default), the data of an open file goes between the
/// program and the backing file (the cache's dotfile; the share's document on a share
/// that has nothing to do at a close, a local disk) without the daemon: the bytes are all
/// there, and the daemon saw none of them. On a share whose client acts at a close (a
/// network or FUSE client: the testbeds' servers) a document goes through the daemon,
/// which passes each close on (FLUSH). An append lands at the end, also right after a
/// write through another descriptor (a share whose client keeps a file's length per
/// descriptor, MooseFS, lost the first write when the append went through the daemon's
/// own descriptor instead).
#[test]
fn open_files_are_read_and_written_by_the_kernel_itself() {
    let fx = Fixture::new();
    fs::create_dir_all(fx.s("Documents")).expect("mkdir");
    write(&fx.s(".bashrc"), "old\n");
    let share_type = fsinfo::statfs(&fx.share).expect("statfs").fs_type;
    let kernel_writes_documents = fsinfo::nothing_at_close(share_type);
    let m = fx.mount();
    let status = || -> serde_json::Value {
        let out = ccfs(&["status".as_ref(), "--json".as_ref(), fx.mnt.as_os_str()]);
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).expect("json")
    };
    let bytes = |k: &str| -> u64 { status()["requests"][k].as_u64().unwrap_or(0) };
    let flushes = || -> u64 { status()["requests"]["by_op"]["flush"].as_u64().unwrap_or(0) };
    let block: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    fs::write(fx.m(".newrc"), &block).expect("write new dotfile");
    assert_eq!(fs::read(fx.m(".newrc")).expect("read"), block);
    assert_eq!(bytes("write_bytes"), 0, "the daemon wrote a dotfile's data");
    assert_eq!(bytes("read_bytes"), 0, "the daemon read a dotfile's data");
    assert_eq!(flushes(), 0, "a close of a cache file was passed on");
    fs::write(fx.m("Documents/data.bin"), &block).expect("write doc");
    assert_eq!(fs::read(fx.m("Documents/data.bin")).expect("read"), block);
    assert_eq!(fs::read(fx.s("Documents/data.bin")).expect("share"), block);
    if kernel_writes_documents {
        assert_eq!(
            bytes("write_bytes"),
            0,
            "the daemon wrote a document's data"
        );
        assert_eq!(bytes("read_bytes"), 0, "the daemon read a document's data");
        assert_eq!(flushes(), 0, "a close on a local share was passed on");
    } else {
        let share = fsinfo::fs_type_name(share_type);
        assert_eq!(
            bytes("write_bytes"),
            block.len() as u64,
            "a document on a share that acts at a close ({share}) is written by the daemon"
        );
        assert_eq!(flushes(), 1, "the document's close was passed on ({share})");
    }
    // A dotfile still on the share, rewritten: the kernel truncates it after the open
    // (SETATTR), so that open was one the daemon must see (its copy-up), and the next
    // open of the copy is the kernel's again.
    // (An open while the kernel's release of an earlier one is still on its way to the
    // daemon may go through the daemon too: tried until one does not.)
    fs::write(fx.m(".bashrc"), &block).expect("rewrite dotfile");
    assert_eq!(fs::read(fx.m(".bashrc")).expect("read"), block);
    let by_kernel = (0..50).any(|_| {
        let before = bytes("write_bytes");
        fs::write(fx.m(".bashrc"), &block).expect("rewrite the copy");
        bytes("write_bytes") == before
    });
    assert!(by_kernel, "every write of the copy went through the daemon");
    for _ in 0..20 {
        fs::write(fx.m("Documents/log.txt"), "first\n").expect("write");
        let mut log = fs::OpenOptions::new()
            .append(true)
            .open(fx.m("Documents/log.txt"))
            .expect("append");
        std::io::Write::write_all(&mut log, b"one line\n").expect("append");
        std::io::Write::write_all(&mut log, b"two\n").expect("append");
        drop(log);
        assert_eq!(read(&fx.m("Documents/log.txt")), "first\none line\ntwo\n");
    }
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::read(fx.s(".bashrc")).expect("synced"), block);
    assert_eq!(read(&fx.s("Documents/log.txt")), "first\none line\ntwo\n");
}

/// The kernel keeps a directory's listing while the directory is unchanged (a second
/// listing asks the daemon for nothing), and the listing is made again once the share's
/// directory changed under the mount (as another workstation changes it): for a document
/// directory, and for a dot directory whose cache copy did not change.
#[test]
fn a_listing_is_kept_while_the_directory_is_unchanged_and_made_again_after_a_change() {
    let fx = Fixture::new();
    fs::create_dir_all(fx.s("Documents")).expect("mkdir");
    fs::create_dir_all(fx.s(".config")).expect("mkdir");
    write(&fx.s("Documents/a"), "a");
    write(&fx.s(".config/x"), "x");
    let m = fx.mount();
    let names = |rel: &str| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(fx.m(rel))
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let readdirs = || -> u64 {
        let out = ccfs(&["status".as_ref(), "--json".as_ref(), fx.mnt.as_os_str()]);
        assert!(out.status.success(), "{}", text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        v["requests"]["by_op"]["readdir"].as_u64().unwrap_or(0)
    };
    write(&fx.m(".config/y"), "y");
    assert_eq!(names("Documents"), ["a"]);
    assert_eq!(names(".config"), ["x", "y"]);
    let before = readdirs();
    assert_eq!(names("Documents"), ["a"]);
    assert_eq!(names(".config"), ["x", "y"]);
    assert_eq!(
        readdirs(),
        before,
        "an unchanged directory was listed again"
    );

    write(&fx.s("Documents/b"), "b");
    write(&fx.s(".config/z"), "z");
    assert_eq!(names("Documents"), ["a", "b"]);
    assert_eq!(names(".config"), ["x", "y", "z"]);
    // Changes through the mount show at once too.
    fs::remove_file(fx.m("Documents/a")).expect("rm");
    fs::remove_file(fx.m(".config/x")).expect("rm");
    assert_eq!(names("Documents"), ["b"]);
    assert_eq!(names(".config"), ["y", "z"]);
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
}

/// Whether the share itself keeps a running program's file whole when a truncating open of
/// it is refused (MooseFS truncates before the refusal, with or without ccfs).
fn share_keeps_running_programs(fx: &Fixture, sleep: &[u8]) -> bool {
    let p = fx.s("probe-nap");
    fs::write(&p, sleep).expect("copy");
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut child = Command::new(&p).arg("30").spawn().expect("run");
    let _ = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_TRUNC)
        .open(&p);
    let whole = fs::metadata(&p).expect("stat").len() == sleep.len() as u64;
    child.kill().expect("kill");
    child.wait().expect("wait");
    fs::remove_file(&p).expect("rm");
    whole
}

/// A running program's file cannot be opened for writing or truncated (ETXTBSY), and a
/// refused truncating open leaves the file whole: in the cache, and on the share's path
/// when the share itself does (the kernel hands a passthrough open to the share's file).
#[test]
fn a_running_programs_file_is_neither_written_nor_truncated() {
    let fx = Fixture::new();
    fs::create_dir_all(fx.s(".local/bin")).expect("mkdir");
    fs::create_dir_all(fx.s("bin")).expect("mkdir");
    let sleep = fs::read("/bin/sleep").expect("sleep");
    let mut paths = vec![".local/bin/nap"];
    if share_keeps_running_programs(&fx, &sleep) {
        paths.push("bin/nap");
    } else {
        eprintln!("the share truncates a running program itself: its path is not checked");
    }
    let m = fx.mount();
    for rel in paths {
        let p = fx.m(rel);
        fs::write(&p, &sleep).expect("copy");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut child = Command::new(&p).arg("30").spawn().expect("run");
        for _ in 0..10 {
            for flags in [libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY | libc::O_TRUNC] {
                let r = fs::OpenOptions::new()
                    .read(flags & libc::O_ACCMODE != libc::O_WRONLY)
                    .write(flags & libc::O_ACCMODE != libc::O_RDONLY)
                    .custom_flags(flags & libc::O_TRUNC)
                    .open(&p);
                let e = r.expect_err("a running program opened for writing");
                assert_eq!(e.raw_os_error(), Some(libc::ETXTBSY), "{rel}: {e}");
            }
        }
        assert_eq!(
            fs::metadata(&p).expect("stat").len(),
            sleep.len() as u64,
            "{rel}"
        );
        child.kill().expect("kill");
        child.wait().expect("wait");
    }
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::read(fx.s(".local/bin/nap")).expect("synced"), sleep);
}

#[test]
fn plain_fusermount_unmount_also_syncs() {
    let fx = Fixture::new();
    let m = fx.mount();
    let pid = m.daemon_pid();
    write(&fx.m(".vimrc"), "set nu\n");
    let out = Command::new("fusermount3")
        .arg("-u")
        .arg(&fx.mnt)
        .output()
        .expect("fusermount3");
    assert!(out.status.success(), "{}", text(&out));
    m.abandon();
    wait_until("daemon exit", Duration::from_secs(30), || {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
    assert_eq!(read(&fx.s(".vimrc")), "set nu\n");
}

#[test]
fn after_kill_9_recover_sends_the_unsynced_changes() {
    let fx = Fixture::new();
    write(&fx.s(".bashrc"), "old");
    let m = fx.mount();
    write(&fx.m(".bashrc"), "new");
    write(&fx.m(".newfile"), "fresh");
    fs::create_dir(fx.m(".dir")).expect("mkdir");
    write(&fx.m(".dir/inner"), "deep");
    m.crash();
    assert_eq!(read(&fx.s(".bashrc")), "old");
    let out = ccfs(&[
        "recover".as_ref(),
        "--cache-dir".as_ref(),
        fx.cache.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".bashrc")), "new");
    assert_eq!(read(&fx.s(".newfile")), "fresh");
    assert_eq!(read(&fx.s(".dir/inner")), "deep");
    let out = ccfs(&[
        "recover".as_ref(),
        "--cache-dir".as_ref(),
        fx.cache.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("nothing to recover"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_mount_after_a_crash_shows_the_unsynced_changes_at_once_and_sends_them() {
    let fx = Fixture::new();
    write(&fx.s(".bashrc"), "old");
    let m = fx.mount();
    write(&fx.m(".bashrc"), "new");
    fs::remove_file(fx.m(".bashrc")).expect("rm");
    write(&fx.m(".bashrc"), "newest");
    m.crash();
    let m = fx.mount();
    assert_eq!(
        read(&fx.m(".bashrc")),
        "newest",
        "never the stale share copy"
    );
    // Sent in the background once the mount is live.
    wait_until(
        "the earlier session's change on the share",
        std::time::Duration::from_secs(30),
        || fs::read_to_string(fx.s(".bashrc")).is_ok_and(|s| s == "newest"),
    );
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".bashrc")), "newest");
}

#[test]
fn readdir_merges_cache_and_share_without_whiteouts() {
    let fx = Fixture::new();
    fs::create_dir(fx.s(".config")).expect("mkdir");
    for n in ["a", "b", "c"] {
        write(&fx.s(&format!(".config/{n}")), n);
    }
    write(&fx.s("doc.txt"), "d");
    let m = fx.mount();
    fs::remove_file(fx.m(".config/b")).expect("rm");
    write(&fx.m(".config/d"), "d");
    write(&fx.m(".config/a"), "A2");
    let mut names: Vec<String> = fs::read_dir(fx.m(".config"))
        .expect("readdir")
        .map(|e| e.expect("e").file_name().into_string().expect("utf8"))
        .collect();
    names.sort();
    assert_eq!(names, ["a", "c", "d"]);
    let mut root: Vec<String> = fs::read_dir(&fx.mnt)
        .expect("readdir")
        .map(|e| e.expect("e").file_name().into_string().expect("utf8"))
        .collect();
    root.sort();
    assert_eq!(root, [".config", "doc.txt"]);
    // rmdir of a non-empty merged directory fails; after emptying it, it works.
    assert_eq!(
        fs::remove_dir(fx.m(".config"))
            .expect_err("not empty")
            .raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    for n in ["a", "c", "d"] {
        fs::remove_file(fx.m(&format!(".config/{n}"))).expect("rm");
    }
    fs::remove_dir(fx.m(".config")).expect("rmdir");
    assert!(!fx.m(".config").exists());
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert!(!fx.s(".config").exists());
    assert!(fx.s("doc.txt").exists());
}

#[test]
fn many_threads_write_and_read_their_own_files_concurrently() {
    let fx = Fixture::new();
    let m = fx.mount();
    fs::create_dir(fx.m(".stress")).expect("mkdir");
    fs::create_dir(fx.m("docs")).expect("mkdir");
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let base = fx.mnt.clone();
            std::thread::spawn(move || {
                for i in 0..60u64 {
                    let dir = if i % 2 == 0 { ".stress" } else { "docs" };
                    let p = base.join(dir).join(format!("t{t}-{i}"));
                    let data = pattern(1000 + (i as usize * 37) % 5000, t * 1000 + i);
                    fs::write(&p, &data).expect("write");
                    assert_eq!(fs::read(&p).expect("read"), data, "{}", p.display());
                    if i % 5 == 0 {
                        let q = p.with_extension("renamed");
                        fs::rename(&p, &q).expect("rename");
                        fs::remove_file(&q).expect("unlink");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    for t in 0..8u64 {
        for i in 0..60u64 {
            let dir = if i % 2 == 0 { ".stress" } else { "docs" };
            let p = fx.share.join(dir).join(format!("t{t}-{i}"));
            if i % 5 == 0 {
                assert!(!p.exists() && !p.with_extension("renamed").exists());
            } else {
                let data = pattern(1000 + (i as usize * 37) % 5000, t * 1000 + i);
                assert_eq!(fs::read(&p).expect("on share"), data);
            }
        }
    }
}

/// Whether the share's own filesystem stores holes without space (MooseFS, for one, does
/// not report them so): the sparse check on ccfs only holds where the share's does.
fn share_keeps_holes(share: &Path) -> bool {
    let probe = share.join(".hole-probe");
    let kept = (|| -> std::io::Result<bool> {
        let mut f = fs::File::create(&probe)?;
        f.seek(SeekFrom::Start(64 << 20))?;
        f.write_all(b"x")?;
        f.sync_all()?;
        Ok(fs::metadata(&probe)?.blocks() * 512 < 8 << 20)
    })()
    .unwrap_or(false);
    let _ = fs::remove_file(&probe);
    kept
}

/// What programs in a home directory rely on, run once per path class.
fn posix_semantics(fx: &Fixture, dir: &str) {
    let d = fx.m(dir);
    fs::create_dir_all(&d).expect("mkdir");

    // rename over an existing file
    write(&d.join("a"), "AAA");
    write(&d.join("b"), "BBB");
    fs::rename(d.join("a"), d.join("b")).expect("rename over");
    assert_eq!(read(&d.join("b")), "AAA");
    assert!(!d.join("a").exists());

    // hard links
    fs::hard_link(d.join("b"), d.join("c")).expect("link");
    write(&d.join("c"), "CCC");
    assert_eq!(read(&d.join("b")), "CCC");
    let (mb, mc) = (
        fs::metadata(d.join("b")).expect("b"),
        fs::metadata(d.join("c")).expect("c"),
    );
    assert_eq!(mb.nlink(), 2);
    assert_eq!(mb.ino(), mc.ino());

    // symlinks
    std::os::unix::fs::symlink("b", d.join("l")).expect("symlink");
    assert_eq!(
        fs::read_link(d.join("l")).expect("readlink"),
        Path::new("b")
    );
    assert_eq!(read(&d.join("l")), "CCC");
    assert!(fs::symlink_metadata(d.join("l"))
        .expect("lstat")
        .file_type()
        .is_symlink());

    // xattrs
    let f = d.join("b");
    ccfs::sys::lsetxattr(&f, "user.test".as_ref(), b"value", 0).expect("setxattr");
    assert_eq!(
        ccfs::sys::lgetxattr(&f, "user.test".as_ref()).expect("getxattr"),
        b"value"
    );
    assert!(ccfs::sys::llistxattr(&f)
        .expect("list")
        .iter()
        .any(|n| n == "user.test"));
    ccfs::sys::lremovexattr(&f, "user.test".as_ref()).expect("removexattr");
    assert_eq!(
        ccfs::sys::lgetxattr(&f, "user.test".as_ref())
            .expect_err("gone")
            .raw_os_error(),
        Some(libc::ENODATA)
    );

    // fsync, flock and open-file-description (POSIX) locks
    let f1 = OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.join("b"))
        .expect("open");
    f1.sync_all().expect("fsync");
    let f2 = OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.join("b"))
        .expect("open");
    // SAFETY: plain flock calls on open descriptors.
    unsafe {
        assert_eq!(
            libc::flock(f1.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB),
            0
        );
        assert_eq!(
            libc::flock(f2.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB),
            -1
        );
        assert_eq!(libc::flock(f1.as_raw_fd(), libc::LOCK_UN), 0);
        assert_eq!(
            libc::flock(f2.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB),
            0
        );
    }
    let lock = |f: &fs::File, kind: i16| {
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind;
        fl.l_whence = libc::SEEK_SET as i16;
        fl.l_len = 10;
        // SAFETY: `fl` is a valid flock structure for F_OFD_SETLK.
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &fl) }
    };
    assert_eq!(lock(&f1, libc::F_WRLCK as i16), 0);
    assert_eq!(
        lock(&f2, libc::F_WRLCK as i16),
        -1,
        "conflicting POSIX lock must fail"
    );
    drop(f1);
    drop(f2);

    // shared writable mmap
    let mm = d.join("mapped");
    fs::write(&mm, vec![b'.'; 8192]).expect("write");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&mm)
        .expect("open");
    // A share may show a file written and closed a moment ago shorter than it is, for a
    // moment (MooseFS's client does, seen on its own mount without ccfs when other
    // processes look at the file): a mapping beyond the length the kernel was told
    // faults (SIGBUS). The mapping is made once the open file shows its length.
    wait_until(
        "the file to map shows its length",
        Duration::from_secs(10),
        || f.metadata().is_ok_and(|m| m.len() == 8192),
    );
    // SAFETY: a fresh mapping of an 8 KiB file we opened read-write, which shows its
    // 8 KiB; unmapped below.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        std::ptr::copy_nonoverlapping(b"mmap!".as_ptr(), (p as *mut u8).add(4096), 5);
        assert_eq!(libc::msync(p, 8192, libc::MS_SYNC), 0);
        assert_eq!(libc::munmap(p, 8192), 0);
    }
    drop(f);
    let back = fs::read(&mm).expect("read");
    assert_eq!(&back[4096..4101], b"mmap!");

    // O_APPEND
    write(&d.join("app"), "1");
    let mut f = OpenOptions::new()
        .append(true)
        .open(d.join("app"))
        .expect("open");
    f.write_all(b"2").expect("append");
    f.write_all(b"3").expect("append");
    drop(f);
    assert_eq!(read(&d.join("app")), "123");

    // sparse and large files
    let sp = d.join("sparse");
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&sp)
        .expect("create");
    f.seek(SeekFrom::Start(64 << 20)).expect("seek");
    f.write_all(b"end").expect("write");
    drop(f);
    let meta = fs::metadata(&sp).expect("stat");
    assert_eq!(meta.len(), (64 << 20) + 3);
    if share_keeps_holes(&fx.share) {
        assert!(meta.blocks() * 512 < 8 << 20, "a hole must not take space");
    }
    let mut f = fs::File::open(&sp).expect("open");
    let mut head = [1u8; 4096];
    f.read_exact(&mut head).expect("read");
    assert!(head.iter().all(|b| *b == 0));
    let big = d.join("big");
    let data = pattern(24 << 20, 7);
    fs::write(&big, &data).expect("write big");
    assert!(
        fs::read(&big).expect("read big") == data,
        "large file must read back intact"
    );

    // O_EXCL, truncate, chmod
    let e = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(d.join("app"));
    assert_eq!(
        e.expect_err("exists").kind(),
        std::io::ErrorKind::AlreadyExists
    );
    let f = OpenOptions::new()
        .write(true)
        .open(d.join("app"))
        .expect("open");
    f.set_len(1).expect("ftruncate");
    drop(f);
    assert_eq!(read(&d.join("app")), "1");
    fs::set_permissions(
        d.join("app"),
        std::os::unix::fs::PermissionsExt::from_mode(0o640),
    )
    .expect("chmod");
    assert_eq!(
        fs::metadata(d.join("app")).expect("stat").mode() & 0o777,
        0o640
    );

    // statfs
    let c = std::ffi::CString::new(d.as_os_str().as_encoded_bytes()).expect("cstr");
    // SAFETY: `st` is a valid out-parameter; `c` is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    assert!(st.f_blocks > 0 && st.f_bsize > 0);
}

fn expect_on_share(fx: &Fixture, dir: &str, present: bool) {
    let s = fx.s(dir);
    if !present {
        assert!(!s.exists(), "{dir} must not reach the share");
        return;
    }
    assert_eq!(read(&s.join("b")), "CCC");
    let (mb, mc) = (
        fs::metadata(s.join("b")).expect("b"),
        fs::metadata(s.join("c")).expect("c"),
    );
    assert_eq!(mb.ino(), mc.ino(), "hard link kept on the share");
    assert_eq!(fs::read_link(s.join("l")).expect("symlink"), Path::new("b"));
    assert_eq!(
        &fs::read(s.join("mapped")).expect("mapped")[4096..4101],
        b"mmap!"
    );
    assert_eq!(read(&s.join("app")), "1");
    assert_eq!(
        fs::metadata(s.join("app")).expect("stat").mode() & 0o777,
        0o640
    );
    assert_eq!(
        fs::metadata(s.join("sparse")).expect("sparse").len(),
        (64 << 20) + 3
    );
    assert!(fs::read(s.join("big")).expect("big") == pattern(24 << 20, 7));
}

macro_rules! class_test {
    ($name:ident, $dir:expr, $on_share:expr) => {
        #[test]
        fn $name() {
            let fx = Fixture::new();
            let m = fx.mount();
            posix_semantics(&fx, $dir);
            let out = m.umount();
            assert!(out.status.success(), "{}", text(&out));
            expect_on_share(&fx, $dir, $on_share);
        }
    };
}

class_test!(posix_semantics_on_passthrough_paths, "Documents/work", true);
class_test!(posix_semantics_on_cached_paths, ".config/app", true);
class_test!(posix_semantics_on_local_only_paths, ".cache/app", false);

#[test]
fn posix_semantics_on_cached_files_copied_up_from_the_share() {
    let fx = Fixture::new();
    fs::create_dir_all(fx.s(".local/app")).expect("mkdir");
    for n in ["a", "b", "app", "mapped"] {
        write(&fx.s(&format!(".local/app/{n}")), "from share");
    }
    let m = fx.mount();
    posix_semantics(&fx, ".local/app");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    expect_on_share(&fx, ".local/app", true);
}

#[test]
fn the_demo_shows_a_dotfile_kept_local_and_synced_at_logout() {
    let out = ccfs(&["demo".as_ref()]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("share prefs.js  (still the old one)        \"user_pref(\\\"browser.startup.page\\\", 1);\""), "{stdout}");
    assert!(
        stdout.contains("written at once) \"My essay, first draft.\""),
        "{stdout}"
    );
    assert!(stdout.contains("all changes are on the share"), "{stdout}");
    assert!(stdout.trim_end().ends_with("ccfs demo: ok"), "{stdout}");
}

#[test]
fn recover_without_arguments_finds_every_cache_under_the_root() {
    let fx = Fixture::new();
    let root = fx.tmp.path().join("cache-root");
    let run = |args: &[&std::ffi::OsStr]| {
        Command::new(ccfs_bin())
            .env("CCFS_CACHE_ROOT", &root)
            .args(args)
            .output()
            .expect("ccfs")
    };
    let out = run(&["mount".as_ref(), fx.share.as_os_str(), fx.mnt.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out));
    // The default layout: ROOT/UID/NAME-OF-MOUNTPOINT, private.
    let uid = ccfs::sys::geteuid().to_string();
    let name = fx
        .mnt
        .canonicalize()
        .expect("mnt")
        .to_string_lossy()
        .trim_matches('/')
        .replace('/', "-");
    let cache = root.join(&uid).join(&name);
    assert!(
        cache.join("journal").is_file(),
        "cache at {}",
        cache.display()
    );
    assert_eq!(fs::metadata(&cache).expect("cache").mode() & 0o777, 0o700);
    write(&fx.m(".inputrc"), "set bell-style none\n");
    let pid = {
        let out = run(&["status".as_ref(), "--json".as_ref(), fx.mnt.as_os_str()]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        v["pid"].as_u64().expect("pid") as u32
    };
    kill(pid, libc::SIGKILL);
    wait_until("daemon death", Duration::from_secs(10), || !alive(pid));
    let _ = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(&fx.mnt)
        .output();
    let out = run(&["recover".as_ref()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".inputrc")), "set bell-style none\n");
    let out = run(&["recover".as_ref()]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("nothing to recover"),
        "{}",
        text(&out)
    );
}

#[test]
fn sigterm_to_the_daemon_unmounts_and_syncs() {
    let fx = Fixture::new();
    let m = fx.mount();
    let pid = m.daemon_pid();
    write(&fx.m(".xinitrc"), "exec twm\n");
    kill(pid, libc::SIGTERM);
    wait_until("daemon exit", Duration::from_secs(30), || !alive(pid));
    assert!(!is_mounted(&fx.mnt), "the daemon unmounts on SIGTERM");
    m.abandon();
    assert_eq!(read(&fx.s(".xinitrc")), "exec twm\n");
}

/// A program that still writes a dotfile when the mount is detached lazily, then closes
/// it: the kernel tears the connection down as the file closes, and the file's RELEASE may
/// never reach the daemon. The logout sync that follows still counts the file as let go:
/// all of it reaches the share, the sync says so, and nothing stays in the cache as
/// unsynced (it was held back as "still written", and the logout reported a failure).
#[test]
fn a_dotfile_closed_after_a_lazy_unmount_is_synced_and_the_logout_succeeds() {
    let fx = Fixture::new();
    for round in 0..3 {
        // This round's logout writes its own account (an earlier round's must not stand in).
        let _ = fs::remove_file(fx.cache.join("last-sync.json"));
        let m = fx.mount();
        let pid = m.daemon_pid();
        let name = format!(".held-at-logout-{round}");
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(fx.m(&name))
            .expect("open");
        f.write_all(b"before the unmount\n").expect("write");
        let out = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&fx.mnt)
            .output()
            .expect("fusermount3");
        assert!(out.status.success(), "{}", text(&out));
        f.write_all(b"after it\n")
            .expect("write after the lazy unmount");
        drop(f);
        wait_until("the daemon's exit", Duration::from_secs(60), || !alive(pid));
        m.abandon();
        let log = || fs::read_to_string(fx.cache.join("ccfs.log")).unwrap_or_default();
        // The logout's own account first: what it says is the failure's explanation.
        let report = fx.cache.join("last-sync.json");
        assert!(
            report.exists(),
            "round {round}: the daemon ended without a logout report; its log:\n{}",
            log()
        );
        let last = read_json(&report);
        let cached = fs::read_to_string(fx.cache.join("upper").join(&name)).ok();
        assert_eq!(
            fs::read_to_string(fx.s(&name)).ok().as_deref(),
            Some("before the unmount\nafter it\n"),
            "round {round}: the share's {name}; the cache holds {cached:?}; the logout said \
             {last}; the daemon's log:\n{}",
            log()
        );
        assert_eq!(last["ok"], true, "round {round}: {last}");
        assert_eq!(
            last["report"]["remaining_dirty"], 0,
            "round {round}: {last}"
        );
        assert_eq!(
            not_clean_copies(&fx.cache, &fx.share, &name),
            Vec::<String>::new(),
            "round {round}: a synced session leaves at most a clean copy of it in the cache"
        );
    }
}

/// The daemon answers `ccfs umount`'s wait and exits; a look at its status that `ccfs
/// umount` makes meanwhile (it looks every few seconds while it waits) is taken by the
/// exiting daemon and closed without an answer. The logout's answer is on the wait's own
/// connection: `ccfs umount` reads it and succeeds (it said "cannot ask its ccfs daemon"
/// and failed a logout whose sync had gone well; seen with 30 users logging out at once).
/// A stand-in socket plays the exiting daemon, so that the moment is not left to chance.
#[test]
fn a_status_left_unanswered_by_an_exiting_daemon_does_not_fail_the_logout() {
    let fx = Fixture::new();
    let m = fx.mount();
    let pid = m.daemon_pid();
    let mp = fx.mnt.canonicalize().expect("mnt");
    let cache = fx.cache.canonicalize().expect("cache");
    let fake = fx.tmp.path().join("exiting-daemon.py");
    fs::write(
        &fake,
        r#"import socket, os, sys, json, threading, time
cache, mp, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
path = os.path.join(cache, "control.sock")
os.rename(path, path + ".real")
s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen(16)
os.link(path, path + ".keep")
st = {"pid": pid, "share": "/x", "mountpoint": mp, "cache_dir": cache, "dirty_files": 0,
      "dirty_bytes": 0, "pending_deletions": 0, "last_sync": None}
waiting = threading.Event()
def keep_name():
    # The real daemon removes the socket's name as it exits: this one stays reachable.
    while True:
        if not os.path.lexists(path):
            os.link(path + ".keep", path)
        time.sleep(0.02)
threading.Thread(target=keep_name, daemon=True).start()
print("ready", flush=True)
def serve(c):
    line = c.makefile("rb").readline()
    if b"wait" in line.lower():
        c.sendall(b'{"waiting":true}\n')
        waiting.set()
        time.sleep(7)
        c.sendall(b'{"ok":true,"report":null,"error":null}\n')
    elif waiting.is_set():
        pass
    else:
        c.sendall((json.dumps(st) + "\n").encode())
    c.close()
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"#,
    )
    .expect("script");
    let (mut server, ready) = spawn_and_read_line(
        Command::new("/usr/bin/python3")
            .arg(&fake)
            .arg(&cache)
            .arg(&mp)
            .arg(pid.to_string()),
    );
    assert_eq!(ready.trim(), "ready", "the stand-in did not start");
    let out = run_bounded(Command::new(ccfs_bin()).arg("umount").arg(&fx.mnt));
    let _ = server.kill();
    let _ = server.wait();
    m.abandon();
    let out = out.expect("ccfs umount returned");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("all changes are on the share"),
        "{}",
        text(&out)
    );
    wait_until("the daemon to end", Duration::from_secs(60), || !alive(pid));
}

/// The FUSE connection aborted (`/sys/fs/fuse/connections/N/abort`) while a program holds
/// a dotfile open for writing: the session ends with that file's handle never released.
/// The daemon lets go of its own handles, but the logout sync still finds the program's
/// hold on the file and keeps it as unsynced work; whatever the program wrote, before the
/// abort and after it, reaches the share with the next recovery, and nothing else stays.
#[test]
fn a_dotfile_held_across_an_aborted_connection_loses_no_write() {
    let fx = Fixture::new();
    let m = fx.mount();
    let pid = m.daemon_pid();
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(fx.m(".held-at-abort"))
        .expect("open");
    f.write_all(b"before the abort\n").expect("write");
    let dev = fs::metadata(&fx.mnt).expect("mnt").dev();
    let minor = libc::minor(dev);
    let conns = Path::new("/sys/fs/fuse/connections");
    if !conns.join(minor.to_string()).exists() {
        // The FUSE control filesystem, where a fresh machine may not have it yet.
        let out = Command::new("mount")
            .args(["-t", "fusectl", "fusectl"])
            .arg(conns)
            .output()
            .expect("mount");
        assert!(out.status.success(), "mount fusectl: {}", text(&out));
    }
    fs::write(format!("/sys/fs/fuse/connections/{minor}/abort"), "1").expect("abort");
    wait_until("the daemon's exit", Duration::from_secs(60), || !alive(pid));
    let mut want = String::from("before the abort\n");
    if f.write_all(b"after it\n").is_ok() {
        want.push_str("after it\n");
    }
    drop(f);
    m.abandon();
    let out = ccfs(&[
        "recover".as_ref(),
        "--cache-dir".as_ref(),
        fx.cache.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".held-at-abort")), want);
    assert_eq!(
        not_clean_copies(&fx.cache, &fx.share, ".held-at-abort"),
        Vec::<String>::new(),
        "sent and let go: at most a clean copy of it stays in the cache"
    );
}

/// The name of the sync's holding directory is ccfs's: rsync stages the files it sends in
/// a directory of that name beside them and empties it, so files a user kept under that
/// name were lost at logout (found by the attack review). No entry of that name is made
/// through the mount in a synced directory, by any call (EPERM), and nothing changes.
#[test]
fn the_sync_holding_directorys_name_cannot_be_made_through_the_mount() {
    let fx = Fixture::new();
    fs::create_dir(fx.s(".config")).expect("share dir");
    let m = fx.mount();
    write(&fx.m(".bashrc"), "new\n");
    write(&fx.m("notes.txt"), "notes\n");
    let eperm = |r: std::io::Result<()>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{what}: {e}");
    };
    for dir in ["", ".config/"] {
        if !dir.is_empty() {
            fs::create_dir_all(fx.m(dir)).expect("dir");
        }
        let name = fx.m(&format!("{dir}.ccfs-sync-partial~"));
        eperm(fs::create_dir(&name), "mkdir");
        eperm(fs::write(&name, "x").map(|_| ()), "create");
        eperm(std::os::unix::fs::symlink("x", &name), "symlink");
        eperm(fs::hard_link(fx.m(".bashrc"), &name), "link");
        eperm(fs::rename(fx.m(".bashrc"), &name), "rename");
        assert!(fs::symlink_metadata(&name).is_err(), "{}", name.display());
    }
    // Where nothing is synced (a passthrough directory) it is a plain name: a ccfs mount
    // may be the share of another ccfs (loadgen's share meter), whose rsync makes it.
    fs::create_dir_all(fx.m("Documents")).expect("dir");
    fs::create_dir(fx.m("Documents/.ccfs-sync-partial~")).expect("mkdir under Documents");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".bashrc")), "new\n");
    assert!(fx.s("Documents/.ccfs-sync-partial~").is_dir());
    assert!(!fx.s(".ccfs-sync-partial~").exists());
    assert!(!fx.s(".config/.ccfs-sync-partial~").exists());
}

/// Local-only content below a cached directory (a browser's cache inside its profile,
/// named by a `local_only` glob) survives the logout like `.cache`, and never reaches the
/// share.
#[test]
fn local_only_content_below_a_cached_directory_survives_the_logout() {
    let fx = Fixture::new();
    let cfg = fx.config("[paths]\nlocal_only = [\".cache/**\", \".mozilla/**/cache2/**\"]\n");
    let cfg = cfg.to_str().expect("utf-8");
    let m = fx.mount_with(&["--config", cfg]);
    fs::create_dir_all(fx.m(".mozilla/p/cache2/entries")).expect("mkdir");
    write(&fx.m(".mozilla/p/cache2/entries/e1"), "cached page\n");
    write(&fx.m(".mozilla/p/prefs.js"), "prefs\n");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".mozilla/p/prefs.js")), "prefs\n");
    assert!(!fx.s(".mozilla/p/cache2").exists(), "never on the share");
    let m = fx.mount_with(&["--config", cfg]);
    assert_eq!(
        read(&fx.m(".mozilla/p/cache2/entries/e1")),
        "cached page\n",
        "the next session on this workstation finds it"
    );
    drop(m);
}

/// A dotfile saved with the bytes it had, whose share file has another name (a hard link
/// made on the share), is sent as any change (a file of its own at this name): the other
/// name keeps its mtime, as everything the session did not change.
#[test]
fn a_dotfile_saved_unchanged_with_a_hard_link_on_the_share_leaves_the_other_name_alone() {
    use std::os::unix::fs::MetadataExt;
    let fx = Fixture::new();
    write(&fx.s(".l1"), "linked\n");
    fs::hard_link(fx.s(".l1"), fx.s(".l2")).expect("link");
    let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_500_000_000);
    fs::File::options()
        .write(true)
        .open(fx.s(".l1"))
        .and_then(|f| f.set_modified(old))
        .expect("old mtime");
    let before = fs::metadata(fx.s(".l2")).expect("stat").mtime();
    let m = fx.mount();
    write(&fx.m(".l1"), "linked\n");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        fs::metadata(fx.s(".l2")).expect("stat").mtime(),
        before,
        "the other name is not touched"
    );
    assert_eq!(read(&fx.s(".l1")), "linked\n");
    assert_eq!(read(&fx.s(".l2")), "linked\n");
}

/// The regular files a logout sends itself (not through rsync) arrive as rsync would put
/// them: every permission bit (set-id ones and those a umask takes included), the mtime to
/// the nanosecond, the bytes, the holes kept holes; and the holding directories they were
/// made in are gone from the share.
#[test]
fn files_the_logout_sends_itself_keep_their_bits_mtime_and_holes() {
    let fx = Fixture::new();
    fs::create_dir(fx.s(".config")).expect("mkdir");
    fs::write(fx.s(".config/old.conf"), "old\n").expect("seed");
    let m = fx.mount();
    let modes = [
        ("a.conf", 0o640),
        ("run.sh", 0o4755),
        ("open.conf", 0o666),
        ("old.conf", 0o600),
    ];
    for (f, mode) in modes {
        write(&fx.m(&format!(".config/{f}")), &format!("{f}\n"));
        fs::set_permissions(
            fx.m(&format!(".config/{f}")),
            fs::Permissions::from_mode(mode),
        )
        .expect("chmod");
    }
    // A file of 4 MiB with 4 KiB of data in the middle.
    let sparse = fx.m(".config/sparse.db");
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&sparse)
        .expect("create");
    f.set_len(4 << 20).expect("set_len");
    std::os::unix::fs::FileExt::write_all_at(&f, &[7u8; 4096], 2 << 20).expect("write");
    drop(f);
    let t = Command::new("touch")
        .args(["-m", "-d", "2031-05-06 07:08:09.123456789"])
        .arg(fx.m(".config/a.conf"))
        .output()
        .expect("touch");
    assert!(t.status.success(), "{}", text(&t));
    // (mode, mtime s, ns) of each file, through `at`.
    let looks = |at: &dyn Fn(&str) -> std::path::PathBuf| -> Vec<(u32, i64, i64)> {
        ["a.conf", "run.sh", "open.conf", "old.conf", "sparse.db"]
            .iter()
            .map(|f| {
                let m = fs::symlink_metadata(at(&format!(".config/{f}"))).expect("stat");
                (m.mode() & 0o7777, m.mtime(), m.mtime_nsec())
            })
            .collect()
    };
    let wanted = looks(&|p| fx.m(p));
    assert_eq!(wanted[1].0, 0o4755, "the set-id bit is set here");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    let there = |f: &str| fs::symlink_metadata(fx.s(&format!(".config/{f}"))).expect("stat");
    let got = looks(&|p| fx.s(p));
    // (A share that keeps whole seconds, as MooseFS does, cuts the nanoseconds.)
    let whole_seconds = got.iter().all(|g| g.2 == 0);
    let wanted: Vec<(u32, i64, i64)> = wanted
        .into_iter()
        .map(|(m, s, ns)| (m, s, if whole_seconds { 0 } else { ns }))
        .collect();
    assert_eq!(
        got, wanted,
        "(mode, mtime s, ns) on the share as in the session"
    );
    for (f, _) in modes {
        assert_eq!(read(&fx.s(&format!(".config/{f}"))), format!("{f}\n"));
    }
    let db = fs::read(fx.s(".config/sparse.db")).expect("read");
    assert_eq!(db.len(), 4 << 20);
    assert!(
        db[..2 << 20].iter().all(|b| *b == 0) && db[(2 << 20) + 4096..].iter().all(|b| *b == 0)
    );
    assert!(db[2 << 20..(2 << 20) + 4096].iter().all(|b| *b == 7));
    // Where the share shows holes at all (CephFS counts a file's blocks by its length):
    // a file of holes made there directly says.
    let probe = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(fx.s(".probe"))
        .expect("probe");
    probe.set_len(4 << 20).expect("set_len");
    std::os::unix::fs::FileExt::write_all_at(&probe, &[7u8; 4096], 2 << 20).expect("write");
    probe.sync_all().expect("fsync");
    drop(probe);
    if there("../.probe").blocks() * 512 < 1 << 20 {
        assert!(
            there("sparse.db").blocks() * 512 < 1 << 20,
            "its holes stay holes on the share ({} blocks)",
            there("sparse.db").blocks()
        );
    }
    for dir in ["", ".config"] {
        let names: Vec<String> = fs::read_dir(fx.s(dir))
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names.iter().any(|n| n.contains("ccfs-sync-partial")),
            "no holding directory stays in {dir:?}: {names:?}"
        );
    }
}

/// A directory the logout sends (its mode and times changed here) keeps the mtime given
/// here, although the files the sync sends itself go into it after rsync set that mtime
/// (their holding directory made and removed, their renames).
#[test]
fn a_directory_sent_keeps_its_mtime_when_files_go_into_it_after() {
    let fx = Fixture::new();
    fs::create_dir(fx.s(".d")).expect("mkdir");
    fs::write(fx.s(".d/f"), "old\n").expect("seed");
    let m = fx.mount();
    write(&fx.m(".d/f"), "new\n");
    fs::set_permissions(fx.m(".d"), fs::Permissions::from_mode(0o750)).expect("chmod");
    let t = Command::new("touch")
        .args(["-m", "-d", "2001-02-03 04:05:06"])
        .arg(fx.m(".d"))
        .output()
        .expect("touch");
    assert!(t.status.success(), "{}", text(&t));
    let want = fs::metadata(fx.m(".d")).expect("stat").mtime();
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".d/f")), "new\n");
    let there = fs::metadata(fx.s(".d")).expect("stat");
    assert_eq!(there.mode() & 0o7777, 0o750);
    assert_eq!(there.mtime(), want, "the directory's mtime as given here");
}
