//! Processes: a child that dies with its parent, and what /proc tells of a process.

use std::io;
use std::os::fd::RawFd;

/// Makes a command's process die with the thread that starts it (PR_SET_PDEATHSIG: a killed
/// daemon leaves no rsync writing to the share), and keep `hold` open across exec (its
/// children inherit it too; see [`crate::sync::RsyncOptions::hold_fd`]).
pub fn die_with_parent(cmd: &mut std::process::Command, hold: Option<RawFd>) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid is async-signal-safe and has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (prctl, getppid, sigemptyset, pthread_sigmask, fcntl) on values copied
    // into it or on its own stack.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before the prctl: then it is too late to learn of it.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            // What the caller blocked (the launcher blocks every signal) is not the
            // program's: it starts with none blocked.
            let mut none: libc::sigset_t = std::mem::zeroed();
            if libc::sigemptyset(&mut none) != 0
                || libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if let Some(fd) = hold {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}
/// The fields of /proc/PID/stat after the command name ("PID (comm) S ..."; the name may
/// hold anything, so they start after the last ") "), the state first; None when the
/// process is gone.
fn stat_fields(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(
        stat.rsplit_once(") ")
            .map_or("", |(_, rest)| rest)
            .to_string(),
    )
}

/// True when `pid` names a live process (a zombie counts as gone).
pub fn process_alive(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// True when `pid` names a stopped (or traced) process.
pub fn process_stopped(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|rest| rest.starts_with('T') || rest.starts_with('t'))
}

/// A process's start time (clock ticks since boot, field 22 of /proc/PID/stat): with the
/// pid, it names one process, whatever later reuses the pid. None when it is gone.
pub fn process_start(pid: u32) -> Option<u64> {
    stat_fields(pid)?.split_whitespace().nth(19)?.parse().ok()
}
