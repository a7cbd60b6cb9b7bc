//! Writes through a shared mapping of a cached dotfile. Under kernel passthrough (the
//! default) a mapping holds the cache's file itself, not the FUSE file: the kernel sends
//! RELEASE when the descriptor is closed, and every later write through the mapping goes
//! to the cache file without the daemon. None of them may be lost: not by a sync that
//! calls the file clean meanwhile, not at logout, not after a crash and `ccfs recover`,
//! on a cache that updates a mapped file's times (ext4) and on one that does not (tmpfs).

use e2e::*;
use std::fs;

const LEN: usize = 8192;

/// The expected bytes: `LEN` bytes of `b'.'` with each `(offset, bytes)` written over them.
fn expected(writes: &[(usize, &[u8])]) -> Vec<u8> {
    let mut v = vec![b'.'; LEN];
    for (o, b) in writes {
        v[*o..*o + b.len()].copy_from_slice(b);
    }
    v
}

/// A fixture whose share has the file of the test, `.x` (a dotfile, `LEN` bytes), and
/// whose cache is on a small tmpfs (which does not change a file's times for a write
/// through a mapping) or on the test's own directory.
fn fixture_with_x(tmpfs: bool) -> (Fixture, Option<SmallTmpfs>) {
    let fx = Fixture::new();
    fs::write(fx.s(".x"), vec![b'.'; LEN]).expect("share file");
    let cache = tmpfs.then(|| SmallTmpfs::mount(&fx.cache, "64m"));
    (fx, cache)
}

/// A request count of the mount's daemon (`ccfs status`).
fn count(m: &Mount<'_>, key: &str) -> u64 {
    let st = m.status();
    st["requests"][key]
        .as_u64()
        .or_else(|| st["requests"]["by_op"][key].as_u64())
        .unwrap_or(0)
}

/// Maps `.x` as a program does that opens it read-write, maps it shared and closes the
/// descriptor, once `.x` is in the cache and the open goes to the kernel's passthrough:
/// the cache's copy is made first (a write through the mount), and an open that still
/// went through the daemon (the kernel's release of an earlier open not yet answered:
/// its pages would reach the daemon at `msync`) is let go of and made again.
fn passthrough_mapping(fx: &Fixture, m: &Mount<'_>) -> SharedMap {
    if !fx.cache.join("upper/.x").exists() {
        fs::write(fx.m(".x"), vec![b'.'; LEN]).expect("copy up");
    }
    for _ in 0..100 {
        wait_until(
            "every open released",
            std::time::Duration::from_secs(10),
            || count(m, "open") + count(m, "create") == count(m, "release"),
        );
        let before = count(m, "write_bytes");
        let map = SharedMap::of(&fx.m(".x"), LEN);
        map.write(LEN - 1, b".");
        map.sync();
        if count(m, "write_bytes") == before {
            return map;
        }
        drop(map);
    }
    panic!("no open of .x went to the kernel's passthrough (is kernel_passthrough on?)");
}

/// Panics naming the first byte where `got` and `want` differ, and both around it.
fn same_bytes(got: &[u8], want: &[u8], what: &str) {
    if got == want {
        return;
    }
    let at = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let around = |v: &[u8]| {
        String::from_utf8_lossy(&v[at.min(v.len())..(at + 24).min(v.len())]).into_owned()
    };
    panic!(
        "{what}: {} bytes, {} expected; first difference at {at}: {:?} where {:?} was expected",
        got.len(),
        want.len(),
        around(got),
        around(want)
    );
}

/// `ccfs sync`: it sends the file, and leaves it unsynced while a mapping can still
/// write it (an exit status of 1 says so).
fn sync(fx: &Fixture) {
    let out = ccfs(&["sync".as_ref(), fx.mnt.as_os_str()]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("sent 1 paths"),
        "{}",
        text(&out)
    );
}

/// The file is mapped and its descriptor closed; a sync runs; the program writes through
/// the mapping after the sync and unmaps; the logout sends what it wrote, and the next
/// login shows it.
fn a_write_after_a_sync(tmpfs: bool) {
    let (fx, _cache) = fixture_with_x(tmpfs);
    let m = fx.mount();
    let map = passthrough_mapping(&fx, &m);
    map.write(0, b"first");
    sync(&fx);
    map.write(100, b"after the sync");
    drop(map);
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    let want = expected(&[(0, b"first"), (100, b"after the sync")]);
    same_bytes(
        &fs::read(fx.s(".x")).expect("share"),
        &want,
        "the share's copy",
    );
    let m = fx.mount();
    same_bytes(
        &fs::read(fx.m(".x")).expect("next login"),
        &want,
        "the next login",
    );
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn a_write_through_a_mapping_after_a_sync_reaches_the_share_with_the_cache_on_a_disk() {
    a_write_after_a_sync(false);
}

#[test]
fn a_write_through_a_mapping_after_a_sync_reaches_the_share_with_the_cache_on_tmpfs() {
    a_write_after_a_sync(true);
}

/// Several syncs while the mapping lives, each after a write through it: every sync
/// sends what was there, and none takes the file for clean while the mapping can still
/// write it (the logout, after the unmap, sends the last write).
#[test]
fn every_sync_while_a_mapping_lives_sends_and_the_last_write_is_not_lost() {
    for tmpfs in [false, true] {
        let (fx, _cache) = fixture_with_x(tmpfs);
        let m = fx.mount();
        let map = passthrough_mapping(&fx, &m);
        let mut writes: Vec<(usize, &[u8])> = Vec::new();
        let words: [&[u8]; 4] = [b"one", b"two", b"three", b"four"];
        for (i, w) in words.iter().enumerate() {
            map.write(i * 1000, w);
            writes.push((i * 1000, w));
            sync(&fx);
            same_bytes(
                &fs::read(fx.s(".x")).expect("share"),
                &expected(&writes),
                &format!("the share after sync {i} (cache on tmpfs: {tmpfs})"),
            );
            let st = m.status();
            assert_eq!(
                st["dirty_files"].as_u64(),
                Some(1),
                "a file a mapping still writes was taken for clean: {st}"
            );
        }
        map.write(5000, b"last");
        writes.push((5000, b"last"));
        drop(map);
        let out = m.umount();
        assert!(out.status.success(), "{}", text(&out));
        same_bytes(
            &fs::read(fx.s(".x")).expect("share"),
            &expected(&writes),
            &format!("the share after logout (cache on tmpfs: {tmpfs})"),
        );
    }
}

/// The daemon is killed while a program holds a mapping; the program goes on writing
/// through it (the cache's file, without any daemon) and unmaps; `ccfs recover` sends
/// every write.
#[test]
fn writes_through_a_mapping_before_and_after_a_crash_are_recovered() {
    for tmpfs in [false, true] {
        let (fx, _cache) = fixture_with_x(tmpfs);
        let m = fx.mount();
        let map = passthrough_mapping(&fx, &m);
        map.write(0, b"before");
        sync(&fx);
        map.write(200, b"after the sync");
        m.crash();
        map.write(400, b"after the crash");
        drop(map);
        let out = ccfs(&[
            "recover".as_ref(),
            "--cache-dir".as_ref(),
            fx.cache.as_os_str(),
        ]);
        assert!(out.status.success(), "{}", text(&out));
        same_bytes(
            &fs::read(fx.s(".x")).expect("share"),
            &expected(&[
                (0, b"before"),
                (200, b"after the sync"),
                (400, b"after the crash"),
            ]),
            &format!("the share after recovery (cache on tmpfs: {tmpfs})"),
        );
    }
}

/// A mapping that outlives the logout (a program left running): the logout sends what
/// was there, keeps the file as unsynced work and says so; what the program writes
/// afterwards is shown and sent by the next session.
#[test]
fn a_mapping_that_outlives_the_logout_loses_nothing() {
    for tmpfs in [false, true] {
        let (fx, _cache) = fixture_with_x(tmpfs);
        let m = fx.mount();
        let map = passthrough_mapping(&fx, &m);
        map.write(0, b"in the session");
        // The mapping keeps the mount busy: the logout syncs, waits a second and
        // detaches it; the daemon ends once the mapping is gone.
        let pid = m.daemon_pid();
        let out = ccfs(&[
            "umount".as_ref(),
            "--busy-timeout".as_ref(),
            "1".as_ref(),
            fx.mnt.as_os_str(),
        ]);
        m.abandon();
        assert!(
            alive(pid),
            "the daemon ended while a mapping holds its mount: {}",
            text(&out)
        );
        same_bytes(
            &fs::read(fx.s(".x")).expect("share"),
            &expected(&[(0, b"in the session")]),
            "the share after logout",
        );
        map.write(300, b"after the logout");
        drop(map);
        wait_until(
            "the daemon's end",
            std::time::Duration::from_secs(30),
            || !alive(pid),
        );
        let m = fx.mount();
        let want = expected(&[(0, b"in the session"), (300, b"after the logout")]);
        same_bytes(
            &fs::read(fx.m(".x")).expect("next login"),
            &want,
            "the next login",
        );
        let out = m.umount();
        assert!(out.status.success(), "{}", text(&out));
        same_bytes(
            &fs::read(fx.s(".x")).expect("share"),
            &want,
            &format!("the share after the next logout (cache on tmpfs: {tmpfs})"),
        );
    }
}
