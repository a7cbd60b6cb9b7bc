//! `ccfs umount` and a daemon that ends while the command asks it for its status.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::time::Duration;

use e2e::*;

/// A logout sync that lasts longer than `ccfs umount`'s wait slice (5 s) makes the command
/// ask the daemon for its status between slices. A daemon that answers the logout and
/// exits before it read that question leaves the kernel to reset the connection
/// (ECONNRESET): the logout went well, and the command must say so (it read the answer on
/// its other connection), not fail with "cannot ask its ccfs daemon: Connection reset by
/// peer" (which loadgen login-storm, seeing the daemon gone, reported as a daemon that
/// "had died").
///
/// The daemon's side is played by the test at the control socket's name: the real daemon
/// serves the mount and syncs at the unmount; the test answers the status and the wait,
/// holds the answer past a slice, then answers and closes its socket with the status
/// question unread, as an exiting daemon does.
#[test]
fn a_daemon_that_ends_with_a_status_question_unread_is_a_logout_that_went_well() {
    let fx = Fixture::new();
    write(&fx.s(".bashrc"), "one\n");
    let m = fx.mount();
    write(&fx.m(".bashrc"), "two\n");
    let status = m.status();
    let pid = status["pid"].as_u64().expect("pid") as u32;
    let socket = fx.cache.join("control.sock");
    std::fs::remove_file(&socket).expect("remove the daemon's socket name");
    let first = UnixListener::bind(&socket).expect("bind");
    let mnt = m.mnt.clone();
    // The command below unmounts it.
    std::mem::forget(m);
    let umount = std::thread::spawn(move || ccfs(&["umount".as_ref(), mnt.as_os_str()]));
    // The command's status question, then its wait (acknowledged).
    let (s, _) = first.accept().expect("status connection");
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).expect("question");
    (&s).write_all(format!("{status}\n").as_bytes())
        .expect("status");
    let (wait, _) = first.accept().expect("wait connection");
    line.clear();
    BufReader::new(&wait)
        .read_line(&mut line)
        .expect("question");
    assert!(line.contains("wait"), "{line}");
    (&wait).write_all(b"{\"waiting\":true}\n").expect("ack");
    // The command unmounts; the real daemon syncs, answers nobody, removes the socket's
    // name and exits.
    wait_until("the daemon's exit", Duration::from_secs(30), || !alive(pid));
    let outcome = read_json(&fx.cache.join("last-sync.json"));
    assert_eq!(outcome["ok"], true, "{outcome}");
    drop(first);
    let _ = std::fs::remove_file(&socket);
    let second = UnixListener::bind(&socket).expect("bind again");
    // Past the command's slice: it asks for the status on a new connection, which waits
    // in the listener's queue.
    std::thread::sleep(Duration::from_secs(7));
    (&wait)
        .write_all(format!("{outcome}\n").as_bytes())
        .expect("answer");
    // Ends with the question unread: the kernel resets the command's connection.
    drop(second);
    drop(wait);
    let out = umount.join().expect("umount thread");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("all changes are on the share"),
        "{}",
        text(&out)
    );
    assert_eq!(read(&fx.s(".bashrc")), "two\n");
}
