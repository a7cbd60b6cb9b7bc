//! What the kernel keeps of names, attributes, pages and listings through a real mount,
//! checked against the share: it never shows a file that is not at its name any more
//! beyond the timeouts, never clips a file to an old size, and never serves one name's
//! requests from another name's file.

use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use e2e::*;

fn sync(fx: &Fixture) -> String {
    let out = ccfs(&["sync".as_ref(), fx.mnt.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out));
    text(&out)
}

/// A mount whose share names and attributes are kept `ms` milliseconds.
fn mount_with_timeout(fx: &Fixture, ms: u64) -> Mount<'_> {
    let conf = fx.config(&format!("[mount]\nattr_timeout_ms = {ms}\n"));
    fx.mount_with(&["--config", conf.to_str().expect("utf-8")])
}

#[test]
fn a_sync_that_keeps_the_share_version_at_a_conflict_shows_all_of_it_at_once() {
    let fx = Fixture::new();
    let _m = fx.mount();
    write(&fx.m(".c6"), "v1\n");
    sync(&fx);
    write(&fx.m(".c6"), "ours\n");
    assert_eq!(fs::metadata(fx.m(".c6")).expect("stat").len(), 5);
    // Another workstation's logout puts its longer version on the share.
    let theirs = "theirs line one\ntheirs line two\ntheirs line three\n";
    write(&fx.s(".c6"), theirs);
    sync(&fx);
    let copies = conflict_copies(&fx.mnt, ".c6");
    assert_eq!(copies.len(), 1, "one conflict copy: {copies:?}");
    assert_eq!(read(&copies[0]), "ours\n");
    // At once, not after a timeout: a program reading the file to its end and writing it
    // back would otherwise send a clipped copy of theirs over it.
    assert_eq!(
        fs::metadata(fx.m(".c6")).expect("stat").len(),
        theirs.len() as u64
    );
    assert_eq!(read(&fx.m(".c6")), theirs);
}

/// open(2) with `flags` (O_CREAT among them, mode 0644) through libc: std's OpenOptions
/// refuses a create without write access, which flock(1) and others use.
fn open_raw(p: &Path, flags: i32) -> std::fs::File {
    use std::os::fd::FromRawFd;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).expect("path");
    // SAFETY: a valid C string; the descriptor returned is owned by the File.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, 0o644) };
    assert!(fd >= 0, "open {p:?}: {}", std::io::Error::last_os_error());
    // SAFETY: fd is a fresh descriptor owned by nobody else.
    unsafe { std::fs::File::from_raw_fd(fd) }
}

#[test]
fn a_dotfile_on_the_share_opened_by_a_create_leaves_other_opens_working() {
    let fx = Fixture::new();
    let _m = fx.mount();
    // The kernel keeps the missing name; another workstation makes the file meanwhile.
    assert!(!fx.m(".lk").exists());
    write(&fx.s(".lk"), "share-content\n");
    // flock(1) opens its lock file O_RDONLY|O_CREAT: a FUSE CREATE of an existing file.
    let holder = open_raw(&fx.m(".lk"), libc::O_RDONLY | libc::O_CREAT);
    let mut a = fs::OpenOptions::new()
        .append(true)
        .open(fx.m(".lk"))
        .expect("an append beside the lock holder");
    a.write_all(b"appended\n").expect("append");
    drop(a);
    assert_eq!(read(&fx.m(".lk")), "share-content\nappended\n");
    drop(holder);
    assert_eq!(read(&fx.m(".lk")), "share-content\nappended\n");
}

fn listing(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(p)
        .expect("ls")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn on_a_share_with_whole_second_times_a_change_shows_after_the_share_timeout() {
    let fx = Fixture::new();
    let _share = CoarseShare::mount(&fx);
    let _m = mount_with_timeout(&fx, 500);
    let wait_past_timeout = || std::thread::sleep(Duration::from_millis(1500));

    // A file's pages: a program keeps the file open (the kernel keeps its inode), the
    // share gets two same-size versions within one second.
    write(&fx.s(".conf"), "AAAA\n");
    let _holder = fs::File::open(fx.m(".conf")).expect("open");
    let mut tries = 0;
    loop {
        start_of_a_second();
        write(&fx.s(".conf"), "BBBB\n");
        let seen = read(&fx.m(".conf"));
        let first = fs::metadata(fx.s(".conf")).expect("stat");
        write(&fx.s(".conf"), "CCCC\n");
        let second = fs::metadata(fx.s(".conf")).expect("stat");
        if seen == "BBBB\n" && (first.mtime(), first.ctime()) == (second.mtime(), second.ctime()) {
            break;
        }
        tries += 1;
        assert!(tries < 5, "could not write twice within one second");
        wait_past_timeout();
    }
    wait_past_timeout();
    assert_eq!(read(&fx.m(".conf")), "CCCC\n");

    // A directory's listing: a name added in the second of the one before, the
    // directory's time set back as tar or cp -a do (or a server clock behind ours).
    fs::create_dir(fx.s(".d")).expect("mkdir");
    let _cwd = fs::File::open(fx.m(".d")).expect("hold the directory");
    let back = |p: &Path| {
        let ok = Command::new("touch")
            .args(["-d", "@1700000000"])
            .arg(p)
            .status()
            .expect("touch");
        assert!(ok.success());
    };
    let mut tries = 0;
    loop {
        start_of_a_second();
        let _ = fs::remove_file(fx.s(".d/b"));
        write(&fx.s(".d/a"), "a");
        back(&fx.s(".d"));
        let seen = listing(&fx.m(".d"));
        let first = fs::metadata(fx.s(".d")).expect("stat");
        write(&fx.s(".d/b"), "b");
        back(&fx.s(".d"));
        let second = fs::metadata(fx.s(".d")).expect("stat");
        if seen == ["a"] && (first.mtime(), first.ctime()) == (second.mtime(), second.ctime()) {
            break;
        }
        tries += 1;
        assert!(
            tries < 5,
            "could not change the directory twice within one second"
        );
        wait_past_timeout();
    }
    wait_past_timeout();
    assert_eq!(listing(&fx.m(".d")), ["a", "b"]);
}

#[test]
fn a_name_of_a_share_hard_link_replaced_elsewhere_reads_and_writes_its_own_file() {
    let fx = Fixture::new();
    write(&fx.s("a"), "original-shared-content\n");
    fs::hard_link(fx.s("a"), fx.s("b")).expect("link");
    write(&fx.s("ra"), "linked\n");
    fs::hard_link(fx.s("ra"), fx.s("rb")).expect("link");
    let _m = mount_with_timeout(&fx, 500);
    let ino = |p: &Path| fs::metadata(p).expect("stat").ino();
    assert_eq!(ino(&fx.m("a")), ino(&fx.m("b")), "one inode for both names");
    assert_eq!(read(&fx.m("b")), "original-shared-content\n");
    assert_eq!(read(&fx.m("rb")), "linked\n");

    // Another workstation replaces `a` and renames `ra`.
    fs::remove_file(fx.s("a")).expect("rm");
    write(&fx.s("a"), "new-a-from-elsewhere\n");
    fs::rename(fx.s("ra"), fx.s("rc")).expect("mv");
    std::thread::sleep(Duration::from_millis(1500));

    assert_eq!(read(&fx.m("b")), "original-shared-content\n");
    assert_eq!(read(&fx.m("a")), "new-a-from-elsewhere\n");
    fs::OpenOptions::new()
        .append(true)
        .open(fx.m("b"))
        .expect("open b")
        .write_all(b"appended-to-b\n")
        .expect("append");
    assert_eq!(read(&fx.s("a")), "new-a-from-elsewhere\n");
    assert_eq!(read(&fx.s("b")), "original-shared-content\nappended-to-b\n");
    assert_eq!(read(&fx.m("rb")), "linked\n");
    assert_eq!(read(&fx.m("rc")), "linked\n");
}

#[test]
fn a_dotfile_hard_linked_on_the_share_and_edited_through_one_name_keeps_the_edit_there() {
    let fx = Fixture::new();
    write(&fx.s(".la"), "linked-orig\n");
    fs::hard_link(fx.s(".la"), fx.s(".lb")).expect("link");
    let m = fx.mount();
    assert_eq!(read(&fx.m(".la")), "linked-orig\n");
    assert_eq!(read(&fx.m(".lb")), "linked-orig\n");
    write(&fx.m(".lb"), "edited-through-lb\n");
    // What the mount shows is what the share holds after the logout: the edited name
    // has the edit; the other name keeps the share's file (the link is broken).
    assert_eq!(read(&fx.m(".lb")), "edited-through-lb\n");
    assert_eq!(read(&fx.m(".la")), "linked-orig\n");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".lb")), "edited-through-lb\n");
    assert_eq!(read(&fx.s(".la")), "linked-orig\n");
}

/// The lookups the daemon has answered so far.
fn lookups(m: &Mount<'_>) -> u64 {
    m.status()["requests"]["by_op"]["lookup"]
        .as_u64()
        .unwrap_or(0)
}

/// Lists `dir` through the mount and looks at each entry as `ls -l` does (the next part
/// of the listing read after the entries of the last are looked at); each file `fI` must
/// be I bytes long. Returns how many entries there were.
fn list_and_look(dir: &Path) -> usize {
    let mut seen = 0;
    for e in fs::read_dir(dir).expect("list") {
        let e = e.expect("entry");
        let name = e.file_name();
        let i: u64 = name.to_str().expect("utf-8")[1..].parse().expect("fI");
        let m = fs::symlink_metadata(e.path()).expect("lstat");
        assert_eq!(m.len(), i, "{}", e.path().display());
        seen += 1;
    }
    seen
}

/// A listing carries each entry's attributes (READDIRPLUS) once programs look at the
/// entries of what they list: after the first directory a program lists and looks at
/// entry by entry (ls -l, a file manager), the next cost no lookup per entry, on both
/// classes, and each entry shows its own file's size. Once the kernel has dropped what it
/// kept (it forgets the entries the listings gave it), every name still leads to its own
/// file: an entry counted wrongly would have its node dropped while the kernel still used
/// it (ESTALE), or another file's.
#[test]
fn a_listing_with_attributes_saves_the_lookups_and_every_name_keeps_its_file() {
    let fx = Fixture::new();
    let n = 300;
    for dir in ["first", "docs", ".conf"] {
        fs::create_dir(fx.s(dir)).expect("dir on the share");
        for i in 0..n {
            write(&fx.s(&format!("{dir}/f{i}")), &"x".repeat(i));
        }
    }
    let m = fx.mount();
    // The first shows the program's habit (its entries are looked up one by one).
    assert_eq!(list_and_look(&fx.m("first")), n);
    for dir in ["docs", ".conf"] {
        let before = lookups(&m);
        assert_eq!(list_and_look(&fx.m(dir)), n);
        let asked = lookups(&m) - before;
        assert!(
            asked < n as u64 / 2,
            "{dir}: {asked} lookups for {n} entries listed and looked at"
        );
    }
    fs::write("/proc/sys/vm/drop_caches", "2\n").expect("drop the kernel's entries");
    for dir in ["docs", ".conf"] {
        for i in (0..n).step_by(7) {
            assert_eq!(read(&fx.m(&format!("{dir}/f{i}"))), "x".repeat(i));
        }
        assert_eq!(list_and_look(&fx.m(dir)), n);
    }
}

/// A program that lists directories for their names alone (find, a plain ls) gets no
/// attributes it did not ask for: the entries of what it listed are unknown to the kernel
/// (a look at one is a lookup), where with `readdirplus = "always"` every entry came with
/// its attributes (no lookup). Both list every name.
#[test]
fn names_alone_are_listed_without_attributes_unless_always_is_set() {
    let fx = Fixture::new();
    let n = 50;
    for dir in ["a", "b", "c"] {
        fs::create_dir(fx.s(dir)).expect("dir on the share");
        for i in 0..n {
            write(&fx.s(&format!("{dir}/f{i}")), &"x".repeat(i));
        }
    }
    let names = |dir: &Path| fs::read_dir(dir).expect("list").count();
    let always = fx.config("[mount]\nreaddirplus = \"always\"\n");
    let always = always.to_str().expect("utf-8 path");
    for (extra, looked_up) in [(vec![], true), (vec!["--config", always], false)] {
        let m = fx.mount_with(&extra);
        for dir in ["a", "b", "c"] {
            assert_eq!(names(&fx.m(dir)), n, "{extra:?}");
        }
        let before = lookups(&m);
        assert_eq!(read(&fx.m("c/f7")), "x".repeat(7));
        let asked = lookups(&m) - before;
        assert_eq!(
            asked > 0,
            looked_up,
            "{extra:?}: {asked} lookups for an entry of a listing"
        );
        let out = m.umount();
        assert!(out.status.success(), "{}", text(&out));
    }
}

/// `ls -l` over many directories (it looks at each part of a listing before it reads
/// on): after the first directory, listings carry the attributes, and the checks now and
/// then of whether entries are still looked at cost at most a quarter of a directory's
/// entries, and never turn the attributes off: fewer lookups over the 23 directories after
/// the first than entries in one.
#[test]
fn ls_l_over_many_directories_pays_the_lookups_of_the_first_alone() {
    let fx = Fixture::new();
    let (dirs, n) = (24, 300);
    for d in 0..dirs {
        fs::create_dir_all(fx.s(&format!("h/d{d}"))).expect("dir on the share");
        for i in 0..n {
            write(&fx.s(&format!("h/d{d}/f{i}")), "x");
        }
    }
    let m = fx.mount();
    let mut per_dir = Vec::new();
    for d in 0..dirs {
        let before = lookups(&m);
        let out = Command::new("ls")
            .arg("-l")
            .arg(fx.m(&format!("h/d{d}")))
            .output()
            .expect("run ls");
        assert!(out.status.success(), "{}", text(&out));
        let lines = String::from_utf8_lossy(&out.stdout).lines().count();
        assert_eq!(lines, n + 1, "ls -l d{d}: a line per entry and the total");
        per_dir.push(lookups(&m) - before);
    }
    let after_first: u64 = per_dir[1..].iter().sum();
    assert!(
        after_first < n as u64,
        "lookups per directory listed: {per_dir:?}"
    );
}

/// Directories swapped through the mount (R to T, S to R, T to S, over and over) while a
/// program lists R and looks at its entries, and another holds a file of R open: a
/// listing or look made at R's path just as R moved must not give the open file's node
/// the attributes of S's directory of the same name. The kernel would take that node
/// for broken and fail every later use of the open file (EIO); a brief error during the
/// swaps is allowed, a lasting one is not.
#[test]
fn an_open_file_keeps_working_while_its_directory_is_swapped_and_listed() {
    use std::os::unix::fs::FileExt;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    let fx = Fixture::new();
    fs::create_dir_all(fx.s("race/R")).expect("R");
    fs::create_dir_all(fx.s("race/S")).expect("S");
    for i in 0..200 {
        write(&fx.s(&format!("race/R/f{i}")), "a");
        fs::create_dir(fx.s(&format!("race/S/f{i}"))).expect("a directory in S");
    }
    let _m = fx.mount();
    let (r, s, t) = (fx.m("race/R"), fx.m("race/S"), fx.m("race/T"));
    let editor = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(r.join("f5"))
        .expect("the editor's file");
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| swap_until(&stop, &r, &s, &t));
        let until = std::time::Instant::now() + Duration::from_secs(8);
        let mut round = 0;
        while std::time::Instant::now() < until {
            round += 1;
            if let Ok(names) = fs::read_dir(&r) {
                for e in names.flatten().take(50) {
                    let _ = fs::symlink_metadata(e.path());
                }
            }
            if round % 20 == 0 {
                let _ = editor.set_len(1);
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    editor
        .set_len(0)
        .expect("truncate the open file after the swaps");
    editor
        .set_permissions(fs::Permissions::from_mode(0o640))
        .expect("chmod the open file after the swaps");
    editor
        .write_all_at(b"saved", 0)
        .expect("write the open file");
    editor.sync_all().expect("fsync the open file");
    let mut back = [0u8; 5];
    editor
        .read_exact_at(&mut back, 0)
        .expect("read the open file");
    assert_eq!(&back, b"saved");
    // It is one of the two directories now, with what the editor saved.
    let on_share = ["race/R/f5", "race/S/f5"]
        .iter()
        .filter(|p| fs::read(fx.s(p)).is_ok_and(|b| b == b"saved"))
        .count();
    assert_eq!(on_share, 1, "the saved file on the share");
}

/// Swaps directories `r` and `s` by name through `t` (three renames), again and again
/// until `stop`.
fn swap_until(stop: &std::sync::atomic::AtomicBool, r: &Path, s: &Path, t: &Path) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let swapped = fs::rename(r, t)
            .and_then(|_| fs::rename(s, r))
            .and_then(|_| fs::rename(t, s));
        if swapped.is_err() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// `name` as a C string.
fn cname(name: &str) -> std::ffi::CString {
    std::ffi::CString::new(name).expect("a name without NUL")
}

#[test]
fn changes_made_in_a_directory_land_in_it_while_it_is_swapped_with_another() {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    const N: usize = 600;
    let fx = Fixture::new();
    for (dir, who) in [("race/R", "A"), ("race/S", "B")] {
        fs::create_dir_all(fx.s(dir)).expect("a directory of the pair");
        write(&fx.s(&format!("{dir}/whoami")), who);
        for i in 0..N {
            for kind in ["u", "o", "t", "m"] {
                write(&fx.s(&format!("{dir}/{kind}{i}")), who);
            }
        }
    }
    let _m = fx.mount();
    let (r, s, t) = (fx.m("race/R"), fx.m("race/S"), fx.m("race/T"));
    // A directory descriptor follows its directory: every change below is asked of A's
    // directory node, wherever A's name is at the time.
    let a = fs::File::open(&r).expect("open A");
    let fd = a.as_raw_fd();
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| swap_until(&stop, &r, &s, &t));
        for i in 0..N {
            // SAFETY: plain system calls on a descriptor this test holds open, with
            // NUL-terminated names.
            unsafe {
                libc::unlinkat(fd, cname(&format!("u{i}")).as_ptr(), 0);
                let o = libc::openat(
                    fd,
                    cname(&format!("o{i}")).as_ptr(),
                    libc::O_WRONLY | libc::O_TRUNC | libc::O_CLOEXEC,
                );
                if o >= 0 {
                    libc::close(o);
                }
                let proc_path = format!("/proc/self/fd/{fd}/t{i}");
                libc::truncate(cname(&proc_path).as_ptr(), 0);
                let c = libc::openat(
                    fd,
                    cname(&format!("c{i}")).as_ptr(),
                    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                    0o644,
                );
                if c >= 0 {
                    libc::write(c, b"A".as_ptr().cast(), 1);
                    libc::close(c);
                }
                libc::mkdirat(fd, cname(&format!("d{i}")).as_ptr(), 0o755);
                libc::renameat(
                    fd,
                    cname(&format!("m{i}")).as_ptr(),
                    fd,
                    cname(&format!("n{i}")).as_ptr(),
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    drop(a);
    let (mut dir_a, mut dir_b) = (None, None);
    for d in ["race/R", "race/S", "race/T"] {
        match fs::read_to_string(fx.s(&format!("{d}/whoami"))).as_deref() {
            Ok("A") => dir_a = Some(fx.s(d)),
            Ok("B") => dir_b = Some(fx.s(d)),
            _ => {}
        }
    }
    let (dir_a, dir_b) = (
        dir_a.expect("A on the share"),
        dir_b.expect("B on the share"),
    );
    let mut wrong = Vec::new();
    for i in 0..N {
        for kind in ["u", "o", "t", "m"] {
            // B was never asked for a change: all its files are there, as they were.
            let b = dir_b.join(format!("{kind}{i}"));
            if fs::read_to_string(&b).ok().as_deref() != Some("B") {
                wrong.push(format!("B's {kind}{i} changed or gone"));
            }
        }
        for kind in ["c", "d", "n"] {
            if dir_b.join(format!("{kind}{i}")).exists() {
                wrong.push(format!("{kind}{i} made in B"));
            }
        }
        // And A got every change asked of it.
        for (kind, want) in [
            ("o", Some("")),
            ("t", Some("")),
            ("c", Some("A")),
            ("n", Some("A")),
            ("u", None),
            ("m", None),
        ] {
            let got = fs::read_to_string(dir_a.join(format!("{kind}{i}"))).ok();
            if got.as_deref() != want {
                wrong.push(format!("A's {kind}{i} is {got:?}, not {want:?}"));
            }
        }
        if !dir_a.join(format!("d{i}")).is_dir() {
            wrong.push(format!("d{i} not made in A"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} changes went to the wrong directory, first: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(8)]
    );
}

/// An open file's attributes stay its own while an editor saves new versions over its
/// name (a new file renamed over it, again and again): a look at the name taken just
/// before a save never gives the open file the new version's size.
#[test]
fn an_open_file_keeps_its_own_size_while_saves_are_renamed_over_its_name() {
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let fx = Fixture::new();
    let _m = fx.mount();
    for dir in ["saved", ".saved"] {
        let d = fx.m(dir);
        fs::create_dir(&d).expect("a directory of saves");
        write(&d.join("x"), &"0".repeat(100));
        let stop = AtomicBool::new(false);
        let (wrong, looks) = (AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|sc| {
            sc.spawn(|| {
                let mut g = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    g += 1;
                    let tmp = d.join(format!("tmp{}", g % 4));
                    let body = (g % 10).to_string().repeat(100 + 100 * (g % 2));
                    fs::write(&tmp, body).expect("write a new version");
                    fs::rename(&tmp, d.join("x")).expect("save it over x");
                }
            });
            for _ in 0..2 {
                sc.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(f) = fs::File::open(d.join("x")) else {
                            continue;
                        };
                        let mut buf = [0u8; 1000];
                        let own = f.read_at(&mut buf, 0).expect("read the open file");
                        for _ in 0..50 {
                            let size = f.metadata().expect("fstat the open file").len();
                            if size != own as u64 {
                                wrong.fetch_add(1, Ordering::Relaxed);
                            }
                            looks.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
            std::thread::sleep(Duration::from_secs(5));
            stop.store(true, Ordering::Relaxed);
        });
        let looks = looks.load(Ordering::Relaxed);
        assert!(
            looks > 1000,
            "{dir}: the open files were looked at ({looks})"
        );
        assert_eq!(
            wrong.load(Ordering::Relaxed),
            0,
            "{dir}: sizes of another version out of {looks} looks"
        );
    }
}

/// Directories renamed again and again in one place hold up no listing elsewhere: a large
/// directory of the share, changed and listed over and over meanwhile, lists whole every
/// time, without an error.
#[test]
fn renames_in_one_directory_fail_no_listing_of_another() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let fx = Fixture::new();
    fs::create_dir_all(fx.s("big")).expect("big");
    for i in 0..20_000 {
        write(&fx.s(&format!("big/f{i}")), "");
    }
    let _m = fx.mount();
    let sw = fx.m(".cache/sw");
    for d in ["a", "b"] {
        fs::create_dir_all(sw.join(d)).expect("a directory to swap");
    }
    let stop = AtomicBool::new(false);
    let mut failures = Vec::new();
    let mut listed = 0;
    std::thread::scope(|sc| {
        sc.spawn(|| swap_until(&stop, &sw.join("a"), &sw.join("b"), &sw.join("t")));
        let until = std::time::Instant::now() + Duration::from_secs(6);
        while std::time::Instant::now() < until {
            // A change in the directory: the kernel cannot keep its last listing.
            write(&fx.m(&format!("big/new{listed}")), "");
            listed += 1;
            match fs::read_dir(fx.m("big")).and_then(|r| r.collect::<Result<Vec<_>, _>>()) {
                Ok(names) if names.len() == 20_000 + listed => {}
                Ok(names) => failures.push(format!("{} names", names.len())),
                Err(e) => failures.push(e.to_string()),
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        failures.is_empty(),
        "{} of {listed} listings failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}
