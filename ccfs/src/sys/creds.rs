//! Users and credentials: accounts, dropping root, and work done as a user in a child.

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;

use super::*;

pub fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}
// ---- users and credentials -------------------------------------------------------------

/// A local user account: the identity a mount runs as when root starts it for a user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

fn passwd_account(pw: &libc::passwd) -> io::Result<Account> {
    // SAFETY: pw_name points to a NUL-terminated string owned by the caller's buffer.
    let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) }
        .to_string_lossy()
        .into_owned();
    let cname =
        CString::new(name.clone()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut n = groups.len() as libc::c_int;
        // SAFETY: `groups` is writable for `n` entries; getgrouplist updates `n`.
        let rc =
            unsafe { libc::getgrouplist(cname.as_ptr(), pw.pw_gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n as usize);
            break;
        }
        groups.resize((n as usize).max(groups.len() * 2), 0);
    }
    Ok(Account {
        name,
        uid: pw.pw_uid,
        gid: pw.pw_gid,
        groups,
    })
}

fn lookup_passwd(
    f: impl Fn(*mut libc::passwd, *mut libc::c_char, usize, *mut *mut libc::passwd) -> libc::c_int,
) -> io::Result<Option<Account>> {
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: zeroed passwd is a valid out-parameter; it is only read after success.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    let rc = f(&mut pw, buf.as_mut_ptr(), buf.len(), &mut result);
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    if result.is_null() {
        return Ok(None);
    }
    passwd_account(&pw).map(Some)
}

/// Looks a user up by name.
pub fn user_by_name(name: &str) -> io::Result<Option<Account>> {
    let c = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: all pointers are valid for the call; getpwnam_r fills `pw` from `buf`.
    lookup_passwd(|pw, buf, len, out| unsafe { libc::getpwnam_r(c.as_ptr(), pw, buf, len, out) })
}

/// Looks a user up by uid.
pub fn user_by_uid(uid: u32) -> io::Result<Option<Account>> {
    // SAFETY: all pointers are valid for the call; getpwuid_r fills `pw` from `buf`.
    lookup_passwd(|pw, buf, len, out| unsafe { libc::getpwuid_r(uid, pw, buf, len, out) })
}

/// The real, effective and saved user ids of the calling thread.
pub fn getresuid() -> (u32, u32, u32) {
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: three valid out-parameters; getresuid only writes them.
    unsafe { libc::getresuid(&mut r, &mut e, &mut s) };
    (r, e, s)
}

/// The real, effective and saved group ids of the calling thread.
pub fn getresgid() -> (u32, u32, u32) {
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: three valid out-parameters; getresgid only writes them.
    unsafe { libc::getresgid(&mut r, &mut e, &mut s) };
    (r, e, s)
}

/// Becomes `acct` for good: its supplementary groups, then the real, effective and saved
/// group ids, then the user ids (the group calls need root, so they come first). glibc
/// applies each call to every thread of the process. Checked afterwards: every id is the
/// user's, and neither root's user id nor root's group id can be taken back.
pub fn drop_privileges(acct: &Account) -> io::Result<()> {
    // SAFETY: plain credential calls with valid arguments (`groups` is readable for its
    // length).
    unsafe {
        check(libc::setgroups(acct.groups.len(), acct.groups.as_ptr()))?;
        check(libc::setresgid(acct.gid, acct.gid, acct.gid))?;
        check(libc::setresuid(acct.uid, acct.uid, acct.uid))?;
    }
    if getresuid() != (acct.uid, acct.uid, acct.uid)
        || getresgid() != (acct.gid, acct.gid, acct.gid)
    {
        return Err(io::Error::other(format!(
            "the ids did not all change to {}'s",
            acct.name
        )));
    }
    // -1 keeps an id as it is; only the effective id is asked back.
    let keep = u32::MAX;
    // SAFETY: credential calls that must fail; a success is reported below.
    let regained_uid = acct.uid != 0 && unsafe { libc::setresuid(keep, 0, keep) } == 0;
    // SAFETY: as above.
    let regained_gid = acct.gid != 0 && unsafe { libc::setresgid(keep, 0, keep) } == 0;
    if regained_uid || regained_gid {
        return Err(io::Error::other(format!(
            "root could be regained after becoming {}",
            acct.name
        )));
    }
    Ok(())
}

/// Forbids this process and everything it starts to gain privileges through exec
/// (setuid programs, file capabilities), for good.
pub fn set_no_new_privs() -> io::Result<()> {
    let (on, unused): (libc::c_ulong, libc::c_ulong) = (1, 0);
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes plain integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, on, unused, unused, unused) })
}

/// How many threads this process runs (from /proc).
pub(super) fn thread_count() -> Option<usize> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
}

/// Kills the process group `group` (a child started in a group of its own) with SIGKILL;
/// a group that is gone already is fine. Group 0 (the caller's own) and 1 (kill(-1):
/// every process) are never killed.
pub fn kill_group(group: u32) {
    let Ok(pgid) = libc::pid_t::try_from(group) else {
        return;
    };
    if pgid <= 1 {
        tracing::error!(group, "refusing to kill process group {group}");
        return;
    }
    // SAFETY: kill(2) takes plain integers; a negative pid names the group.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
}

/// The most of a child's answer [`run_as_user_within`] reads.
pub const CHILD_ANSWER_MAX: usize = 16 << 20;

/// Runs `f` in a child process that first becomes `acct` for good ([`drop_privileges`])
/// and sets no_new_privs, and returns the bytes `f` returned. The caller keeps its own
/// credentials; whatever `f` opens, runs or writes, it does as the user.
///
/// The calling process must run a single thread (a lock held by another thread at the
/// fork would stay locked in the child for ever); otherwise an error is returned.
///
/// The child gets [`USER_CHILD_LIMIT`] to answer (it works on the user's local cache
/// directory: a child the user stops, which runs as them, holds root no longer).
pub fn run_as_user(acct: &Account, f: impl FnOnce() -> Vec<u8>) -> io::Result<Vec<u8>> {
    run_as_user_within(acct, Some(USER_CHILD_LIMIT), f)
}

/// How long [`run_as_user`] waits for its child's answer.
pub const USER_CHILD_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// [`run_as_user`], waiting for the answer at most `limit`: a child that has not answered
/// by then (stuck on a filesystem the user made hang) is killed and left, and the answer
/// is a timeout error.
pub fn run_as_user_within(
    acct: &Account,
    limit: Option<std::time::Duration>,
    f: impl FnOnce() -> Vec<u8>,
) -> io::Result<Vec<u8>> {
    use std::io::Read;
    if thread_count() != Some(1) {
        return Err(io::Error::other(
            "cannot work as another user in a child process: this process runs several threads",
        ));
    }
    let (mut reader, writer) = std::io::pipe()?;
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the process has a single thread, so the child starts with every lock free
    // and may run any code; it leaves through `_exit` only.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        drop(reader);
        let code = child_as_user(acct, parent, writer, f);
        // SAFETY: ends the child at once, without the parent's exit handlers and
        // destructors running a second time.
        unsafe { libc::_exit(code) }
    }
    drop(writer);
    // The answer is read to its end (the child's exit closes the pipe) within `limit`
    // in all, and at most CHILD_ANSWER_MAX bytes of it: the child runs as the user, who
    // may stop it (SIGSTOP) or make it write more than any answer holds.
    let deadline = limit.map(|l| std::time::Instant::now() + l);
    let mut out = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    let read: io::Result<()> = loop {
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let mut pfd = libc::pollfd {
                fd: reader.as_raw_fd(),
                events: libc::POLLIN | libc::POLLHUP,
                revents: 0,
            };
            let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd for the call.
            let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
            if ready < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if ready <= 0 {
                // SAFETY: kill(2) of our own child; it is not waited for (it may not die
                // before what holds it lets go), so a stuck child costs nothing here.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the child process working as {} did not answer within {} s",
                        acct.name,
                        limit.unwrap_or_default().as_secs()
                    ),
                ));
            }
        }
        match reader.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) if out.len() + n > CHILD_ANSWER_MAX => {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                break Err(io::Error::other(format!(
                    "the child process working as {} answered more than {} MiB",
                    acct.name,
                    CHILD_ANSWER_MAX >> 20
                )));
            }
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    // Its end is waited for within the same limit (and a moment more for a child that
    // answered at the last moment), never longer: a child can answer, close the pipe and
    // still not end, when one of its threads waits in a request to a filesystem that
    // never answers it (a FUSE server the user runs, a share client that holds a request
    // for its own minutes). Such a child is killed and left; SIGKILL ends it once the
    // request comes back.
    let until = deadline
        .unwrap_or_else(|| std::time::Instant::now() + CHILD_END_WAIT)
        .max(std::time::Instant::now() + std::time::Duration::from_secs(1));
    let Some(status) = wait_child_until(pid, until)? else {
        // SAFETY: kill(2) of our own child, not waited for (see above).
        unsafe { libc::kill(pid, libc::SIGKILL) };
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the child process working as {} did not end within {} s (a request to a filesystem it used does not come back); left behind",
                acct.name,
                limit.unwrap_or(CHILD_END_WAIT).as_secs()
            ),
        ));
    };
    read?;
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        return Ok(out);
    }
    let how = if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("exit code {}", libc::WEXITSTATUS(status))
    };
    Err(io::Error::other(format!(
        "the child process working as {} ended without an answer ({how})",
        acct.name
    )))
}

fn child_as_user(
    acct: &Account,
    parent: libc::pid_t,
    mut out: std::io::PipeWriter,
    f: impl FnOnce() -> Vec<u8>,
) -> i32 {
    use std::io::Write;
    if let Err(e) = drop_privileges(acct).and_then(|()| set_no_new_privs()) {
        write_fd_lossy(
            2,
            format!("ccfs: cannot become {} for good: {e}\n", acct.name).as_bytes(),
        );
        return 125;
    }
    // The work dies with the process that asked for it (a killed `ccfs recover` leaves no
    // recovery running on): set after the change of ids, which clears it.
    // SAFETY: prctl and getppid have no memory preconditions.
    let dies_with_parent = unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) == 0
            && libc::getppid() == parent
    };
    if !dies_with_parent {
        return 123;
    }
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(bytes) => match out.write_all(&bytes) {
            Ok(()) => 0,
            Err(_) => 124,
        },
        Err(_) => 126,
    }
}

/// How long [`run_as_user_within`] without a limit waits for its child to end after the
/// child closed its answer.
const CHILD_END_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits for child `pid` to end until `until`: its status, or None if it has not ended.
fn wait_child_until(
    pid: libc::pid_t,
    until: std::time::Instant,
) -> io::Result<Option<libc::c_int>> {
    loop {
        let mut status = 0;
        // SAFETY: looks at our own child; `status` is a valid out-parameter.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Ok(Some(status));
        }
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if std::time::Instant::now() >= until {
            return Ok(None);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
