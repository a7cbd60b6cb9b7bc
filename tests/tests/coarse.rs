//! A share that keeps whole-second times (ext4 with 128-byte inodes here; MooseFS, many
//! NAS and NFS exports in labs): another workstation's write in place, at the same size,
//! in the second of ccfs's own look at a file, leaves the file's look (inode, size,
//! mtime, ctime) as ccfs saw it. Nothing of such a write may be hidden or overwritten: a
//! clean copy shows it once the kernel's timeout passed, an edit made here from the
//! older version meets it as a conflict, and a deletion made here keeps it.
//!
//! Each scenario needs the two writes in one second of the share's clock; a try that
//! crossed a second is made again (the test checks the looks, not the clock).

use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::Duration;

use e2e::*;

fn sync(fx: &Fixture) -> String {
    let out = ccfs(&["sync".as_ref(), fx.mnt.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out));
    text(&out)
}

/// (inode, size, mtime, ctime) in whole seconds, as the share keeps them.
fn look(p: &Path) -> (u64, u64, i64, i64, i64, i64) {
    let m = fs::metadata(p).expect("stat");
    (
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    )
}

/// Another workstation's save in place (a program that rewrites its file where it is).
fn write_in_place(p: &Path, bytes: &[u8]) {
    let f = fs::OpenOptions::new().write(true).open(p).expect("open");
    f.write_all_at(bytes, 0).expect("write");
}

/// Runs `attempt` (with a fresh name each time) until one made its two writes within
/// one second (it says so), at most 8 times.
fn in_one_second(mut attempt: impl FnMut(usize) -> bool) -> usize {
    for i in 0..8 {
        start_of_a_second();
        if attempt(i) {
            return i;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    panic!("could not make two writes within one second of the share's clock in 8 tries");
}

/// Everything the share holds under `name` (at it and at its conflict names).
fn versions(fx: &Fixture, name: &str) -> Vec<String> {
    let mut v: Vec<String> = conflict_copies(&fx.share, name)
        .iter()
        .map(|p| read(p))
        .collect();
    if fx.s(name).exists() {
        v.push(read(&fx.s(name)));
    }
    v.sort();
    v
}

#[test]
fn a_clean_copy_shows_a_write_made_on_the_share_in_the_second_of_its_sync() {
    let fx = Fixture::new();
    let _share = CoarseShare::mount(&fx);
    let conf = fx.config("[mount]\nattr_timeout_ms = 300\n");
    let _m = fx.mount_with(&["--config", conf.to_str().expect("utf-8")]);
    let i = in_one_second(|i| {
        let name = format!(".c{i}");
        write(&fx.m(&name), "AAAA\n");
        sync(&fx);
        let ours = look(&fx.s(&name));
        write_in_place(&fx.s(&name), b"BBBB\n");
        look(&fx.s(&name)) == ours
    });
    let name = format!(".c{i}");
    assert_eq!(read(&fx.s(&name)), "BBBB\n");
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        read(&fx.m(&name)),
        "BBBB\n",
        "the clean copy hid the share's newer bytes"
    );
    // An edit made now starts from what the share has, and reaches it.
    fs::OpenOptions::new()
        .append(true)
        .open(fx.m(&name))
        .expect("open")
        .write_all(b"more\n")
        .expect("append");
    sync(&fx);
    assert_eq!(versions(&fx, &name), ["BBBB\nmore\n"]);
}

#[test]
fn an_edit_from_the_version_before_a_same_second_write_there_is_a_conflict() {
    let fx = Fixture::new();
    let _share = CoarseShare::mount(&fx);
    let m = fx.mount();
    let i = in_one_second(|i| {
        let name = format!(".e{i}");
        write(&fx.s(&name), "AAAA\n");
        let theirs = look(&fx.s(&name));
        // Here: a program writes into the file (the cache takes it over from AAAA).
        write_in_place(&fx.m(&name), b"XX");
        write_in_place(&fx.s(&name), b"BBBB\n");
        look(&fx.s(&name)) == theirs
    });
    let name = format!(".e{i}");
    sync(&fx);
    assert_eq!(
        versions(&fx, &name),
        ["BBBB\n", "XXAA\n"],
        "both versions kept, one at a conflict name"
    );
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(versions(&fx, &name), ["BBBB\n", "XXAA\n"]);
}

#[test]
fn a_deletion_here_keeps_a_file_written_there_in_the_same_second() {
    let fx = Fixture::new();
    let _share = CoarseShare::mount(&fx);
    let m = fx.mount();
    let i = in_one_second(|i| {
        let name = format!(".d{i}");
        write(&fx.s(&name), "AAAA\n");
        let theirs = look(&fx.s(&name));
        fs::remove_file(fx.m(&name)).expect("rm here");
        write_in_place(&fx.s(&name), b"BBBB\n");
        look(&fx.s(&name)) == theirs
    });
    let name = format!(".d{i}");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        versions(&fx, &name),
        ["BBBB\n"],
        "the share's newer version is kept"
    );
}

#[test]
fn a_clean_copy_kept_over_a_logout_is_checked_by_content_at_the_next_login() {
    // The same race, the clean copy kept in the cache over a logout for the next login
    // (as a logout keeps them): the next login must not trust the look alone either.
    let fx = Fixture::new();
    let _share = CoarseShare::mount(&fx);
    let conf = fx.config("[mount]\nattr_timeout_ms = 300\n");
    let args = ["--config", conf.to_str().expect("utf-8")];
    let m = fx.mount_with(&args);
    let mut name = String::new();
    in_one_second(|i| {
        name = format!(".k{i}");
        write(&fx.m(&name), "AAAA\n");
        sync(&fx);
        let ours = look(&fx.s(&name));
        write_in_place(&fx.s(&name), b"BBBB\n");
        look(&fx.s(&name)) == ours
    });
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    let _m = fx.mount_with(&args);
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(read(&fx.m(&name)), "BBBB\n");
}

/// Another workstation's logout: a new file renamed over the share's.
fn replace_on_share(p: &Path, bytes: &[u8]) {
    let tmp = p.with_extension("elsewhere-tmp");
    fs::write(&tmp, bytes).expect("write");
    fs::rename(&tmp, p).expect("rename");
}

/// A conflict sets our version aside and takes the share's as the base; that base may be
/// racy too. Here: the share's version arrives (another logout) at the start of a second,
/// the sync sets ours aside, a program here appends to what it now sees, and an edit in
/// place there at the same size lands in the same second. Both must survive.
#[test]
fn the_base_a_conflict_takes_is_checked_by_content_like_any_other() {
    let fx = Fixture::new();
    let _share = CoarseShare::mount(&fx);
    let conf = fx.config("[mount]\nattr_timeout_ms = 0\n");
    let _m = fx.mount_with(&["--config", conf.to_str().expect("utf-8")]);
    let i = in_one_second(|i| {
        let name = format!(".f{i}");
        write(&fx.s(&name), "AAAA\n");
        std::thread::sleep(Duration::from_millis(1100));
        write(&fx.m(&name), "XXXX\n");
        start_of_a_second();
        replace_on_share(&fx.s(&name), b"BBBB\n");
        let theirs = look(&fx.s(&name));
        assert!(sync(&fx).contains("conflict"), "ours is set aside");
        fs::OpenOptions::new()
            .append(true)
            .open(fx.m(&name))
            .expect("open")
            .write_all(b"more\n")
            .expect("append");
        write_in_place(&fx.s(&name), b"CCCC\n");
        look(&fx.s(&name)) == theirs
    });
    let name = format!(".f{i}");
    sync(&fx);
    let v = versions(&fx, &name);
    assert!(
        v.contains(&"CCCC\n".to_string()),
        "the edit there is kept: {v:?}"
    );
    assert!(v.contains(&"BBBB\nmore\n".to_string()), "{v:?}");
    assert!(v.contains(&"XXXX\n".to_string()), "{v:?}");
}

/// The same for a deletion made again after a "deleted here, changed there" conflict.
#[test]
fn a_deletion_made_again_after_a_conflict_keeps_a_same_second_write_there() {
    let fx = Fixture::new();
    let _share = CoarseShare::mount(&fx);
    let conf = fx.config("[mount]\nattr_timeout_ms = 0\n");
    let _m = fx.mount_with(&["--config", conf.to_str().expect("utf-8")]);
    let i = in_one_second(|i| {
        let name = format!(".g{i}");
        write(&fx.s(&name), "AAAA\n");
        std::thread::sleep(Duration::from_millis(1100));
        fs::remove_file(fx.m(&name)).expect("rm here");
        start_of_a_second();
        replace_on_share(&fx.s(&name), b"BBBB\n");
        let theirs = look(&fx.s(&name));
        assert!(sync(&fx).contains("conflict"), "the change there is kept");
        fs::remove_file(fx.m(&name)).expect("rm here again");
        write_in_place(&fx.s(&name), b"CCCC\n");
        look(&fx.s(&name)) == theirs
    });
    let name = format!(".g{i}");
    sync(&fx);
    assert_eq!(versions(&fx, &name), ["CCCC\n"], "the edit there is kept");
}

/// A chmod or setfattr there (an admin over SSH: `chmod 600 ~/.netrc`) in the second of
/// ccfs's look changes neither size nor times on such a share: the look is as it was.
fn restrict_there(p: &Path) {
    fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod there");
    ccfs::sys::lsetxattr(p, "user.tag".as_ref(), b"there", 0).expect("setfattr there");
}

fn mode_of(p: &Path) -> u32 {
    fs::metadata(p).expect("stat").mode() & 0o7777
}

#[test]
fn a_clean_copy_shows_a_mode_and_attribute_set_there_in_the_second_of_its_sync() {
    let fx = Fixture::new();
    let _share = CoarseShare::mount(&fx);
    let conf = fx.config("[mount]\nattr_timeout_ms = 300\n");
    let args = ["--config", conf.to_str().expect("utf-8")];
    let m = fx.mount_with(&args);
    let mut name = String::new();
    in_one_second(|i| {
        name = format!(".n{i}");
        write(&fx.m(&name), "secret\n");
        fs::set_permissions(
            fx.m(&name),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )
        .expect("chmod here");
        sync(&fx);
        let ours = look(&fx.s(&name));
        restrict_there(&fx.s(&name));
        look(&fx.s(&name)) == ours
    });
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        mode_of(&fx.m(&name)),
        0o600,
        "the clean copy hid the chmod there"
    );
    assert_eq!(
        ccfs::sys::lgetxattr(&fx.m(&name), "user.tag".as_ref()).ok(),
        Some(b"there".to_vec())
    );
    // Kept over a logout, it is checked at the next login too, and an edit made now
    // starts from the share's mode and attribute.
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    let _m = fx.mount_with(&args);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(mode_of(&fx.m(&name)), 0o600);
    fs::OpenOptions::new()
        .append(true)
        .open(fx.m(&name))
        .expect("open")
        .write_all(b"more\n")
        .expect("append");
    sync(&fx);
    assert_eq!(versions(&fx, &name), ["secret\nmore\n"]);
    assert_eq!(
        mode_of(&fx.s(&name)),
        0o600,
        "the share's mode was overwritten"
    );
    assert_eq!(
        ccfs::sys::lgetxattr(&fx.s(&name), "user.tag".as_ref()).ok(),
        Some(b"there".to_vec()),
        "the share's attribute was lost"
    );
}

#[test]
fn an_edit_from_before_a_same_second_chmod_there_is_a_conflict() {
    let fx = Fixture::new();
    let _share = CoarseShare::mount(&fx);
    let m = fx.mount();
    let i = in_one_second(|i| {
        let name = format!(".p{i}");
        write(&fx.s(&name), "AAAA\n");
        fs::set_permissions(
            fx.s(&name),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )
        .expect("chmod");
        let theirs = look(&fx.s(&name));
        // Here: a program writes into the file (the cache takes it over with mode 644).
        write_in_place(&fx.m(&name), b"XX");
        restrict_there(&fx.s(&name));
        look(&fx.s(&name)) == theirs
    });
    let name = format!(".p{i}");
    assert!(sync(&fx).contains("conflict"), "the change there is met");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        versions(&fx, &name),
        ["AAAA\n", "XXAA\n"],
        "both versions kept, one at a conflict name"
    );
    assert_eq!(
        mode_of(&fx.s(&name)),
        0o600,
        "the share's mode was overwritten"
    );
    assert_eq!(
        ccfs::sys::lgetxattr(&fx.s(&name), "user.tag".as_ref()).ok(),
        Some(b"there".to_vec())
    );
}

/// Until a sync of the session wrote a file, every whole-second base is racy and stands
/// only with the content it was taken with. A file the user may not read (root's, of
/// mode 600, left by `sudo vim`; the user's own of mode 000) has no content to take: its
/// base stands by its look, as on a share with finer times. Removing or replacing it is
/// no conflict, at the first sync of a login as at any other.
#[test]
fn a_file_the_user_may_not_read_is_removed_and_replaced_without_a_conflict() {
    let alice = account("ccfs-alice");
    let fx = Fixture::new();
    fs::set_permissions(
        fx.tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod tmp");
    let _share = CoarseShare::mount(&fx);
    std::os::unix::fs::chown(&fx.share, Some(alice.uid), Some(alice.gid)).expect("chown");
    let mode = |p: &Path, m: u32| {
        fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m)).expect("chmod")
    };
    write(&fx.s(".rootfile"), "root's\n");
    mode(&fx.s(".rootfile"), 0o600);
    write(&fx.s(".rootfile2"), "root's too\n");
    mode(&fx.s(".rootfile2"), 0o600);
    write(&fx.s(".locked"), "locked\n");
    std::os::unix::fs::chown(fx.s(".locked"), Some(alice.uid), Some(alice.gid)).expect("chown");
    mode(&fx.s(".locked"), 0o000);
    let m = fx.mount_with(&["--user", "ccfs-alice"]);
    let out = as_user(
        "ccfs-alice",
        &format!(
            "rm -f {mnt}/.rootfile {mnt}/.locked && echo new > {mnt}/.n && mv -f {mnt}/.n {mnt}/.rootfile2",
            mnt = fx.mnt.display()
        ),
    );
    assert!(out.status.success(), "{}", text(&out));
    let said = sync(&fx);
    assert!(!said.contains("conflict"), "{said}");
    assert!(!fx.s(".rootfile").exists(), "the removal was undone");
    assert!(!fx.s(".locked").exists(), "the removal was undone");
    assert_eq!(read(&fx.s(".rootfile2")), "new\n");
    for name in [".rootfile", ".locked", ".rootfile2"] {
        assert_eq!(
            conflict_copies(&fx.share, name),
            Vec::<std::path::PathBuf>::new()
        );
    }
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
}

/// A FIFO has no bytes to change in place: its base is never racy. One made here and
/// there at once is a conflict; removing it afterwards is none.
#[test]
fn a_fifo_removed_after_a_conflict_is_removed() {
    let fx = Fixture::new();
    let _share = CoarseShare::mount(&fx);
    let m = fx.mount();
    let fifo = |p: &Path| {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(
            unsafe { libc::mkfifo(c.as_ptr(), 0o644) },
            0,
            "mkfifo {}",
            p.display()
        );
    };
    fifo(&fx.m(".p"));
    fifo(&fx.s(".p"));
    assert!(sync(&fx).contains("conflict"), "made on both");
    fs::remove_file(fx.m(".p")).expect("rm here");
    let said = sync(&fx);
    assert!(!said.contains("conflict"), "{said}");
    assert!(
        fs::symlink_metadata(fx.s(".p")).is_err(),
        "the removal was undone"
    );
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
}

/// The same new file made here and there with the same bytes is no conflict; with other
/// permission bits or attributes it is one (a credentials file made 600 there, 644 here):
/// sending ours would have changed the share's without a word.
#[test]
fn a_file_made_on_both_with_the_same_bytes_and_other_modes_is_a_conflict() {
    let fx = Fixture::new();
    let _share = CoarseShare::mount(&fx);
    let m = fx.mount();
    let creds = "machine x login y password z\n";
    write(&fx.m(".same"), creds);
    write(&fx.s(".same"), creds);
    write(&fx.m(".netrc"), creds);
    fs::set_permissions(
        fx.m(".netrc"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .expect("chmod here");
    write(&fx.s(".netrc"), creds);
    fs::set_permissions(
        fx.s(".netrc"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod there");
    ccfs::sys::lsetxattr(&fx.s(".netrc"), "user.tag".as_ref(), b"there", 0).expect("setfattr");
    sync(&fx);
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        conflict_copies(&fx.share, ".same"),
        Vec::<std::path::PathBuf>::new()
    );
    assert_eq!(read(&fx.s(".netrc")), creds);
    assert_eq!(
        mode_of(&fx.s(".netrc")),
        0o600,
        "the share's mode was changed"
    );
    assert_eq!(
        ccfs::sys::lgetxattr(&fx.s(".netrc"), "user.tag".as_ref()).ok(),
        Some(b"there".to_vec()),
        "the share's attribute was lost"
    );
    let aside = conflict_copies(&fx.share, ".netrc");
    assert_eq!(aside.len(), 1, "ours is kept at a conflict name");
    assert_eq!(mode_of(&aside[0]), 0o644);
}
