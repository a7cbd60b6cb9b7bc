//! The daemon's launcher: a process forked when the daemon starts, before it opens any
//! file on the share, that starts the programs the daemon runs (rsync, `fusermount3`).
//!
//! A process that forks gives its child a copy of every open file, and each copy is closed
//! when the child execs or ends: on a share whose client acts at a close (sshfs, NFS, a
//! FUSE client), every such close is a flush, and its answer carries a failed write behind
//! of a document the daemon holds open (the client tells it once, to that close, and the
//! user's own close later finds nothing wrong). The launcher holds no file of the share, so
//! what it starts holds none either.
//!
//! The protocol, over a socket pair of sequenced packets: a request is one packet with the
//! program, its arguments and added environment, and with it (SCM_RIGHTS) a socket for the
//! answer, the pipes for the program's standard input, output and error where the caller
//! reads or writes them, and a descriptor the program is to inherit (the cache's lock). The
//! answer socket gets the pid (or minus the errno of a failed start), then the program's
//! wait status once it has ended.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use super::check;

/// The largest request: a program's arguments are short (rsync reads its file list from
/// its standard input; the config's `extra_args` are held to [`MAX_EXTRA_ARGS`]). A
/// packet this size fits a socket's default send buffer.
const MAX_REQUEST: usize = 128 << 10;
/// The most bytes of rsync arguments a config may add (`[sync] extra_args`).
pub const MAX_EXTRA_ARGS: usize = 64 << 10;
/// How long the launcher has to take a request and say it started the program: one
/// stopped by its user is let go after that (it is killed, and the daemon starts its
/// programs itself from then on).
const ANSWER_WITHIN: libc::time_t = 10;
/// The most descriptors a request carries: the answer socket, three pipes, one to hold.
const MAX_FDS: usize = 5;

const STDIN: u8 = 1;
const STDOUT: u8 = 2;
const STDERR: u8 = 4;
const HOLD: u8 = 8;

/// A program to start, as std's `Command` would take it.
#[derive(Debug, Clone, Default)]
pub struct Program {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Added to (or replacing in) the environment the daemon started with.
    pub env: Vec<(OsString, OsString)>,
    /// A descriptor the program (and what it forks) inherits; see
    /// [`crate::sync::RsyncOptions::hold_fd`].
    pub hold: Option<RawFd>,
    /// Which of standard input, output and error are pipes to the caller (the others are
    /// /dev/null).
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

impl Program {
    pub fn new(program: impl AsRef<Path>) -> Self {
        Self {
            program: program.as_ref().to_path_buf(),
            ..Self::default()
        }
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, args: I) -> Self {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// The program's output and error are read by the caller.
    pub fn piped_output(mut self) -> Self {
        self.stdout = true;
        self.stderr = true;
        self
    }
}

/// The launcher process of a daemon (see the module's documentation).
pub struct Launcher {
    sock: OwnedFd,
    pid: libc::pid_t,
    /// The launcher is gone (its user may kill or stop it: it is theirs): programs are
    /// started by the caller itself from then on, when [`Launcher::fallback_when`] lets.
    gone: std::sync::atomic::AtomicBool,
    /// Whether a program may be started by the caller itself once the launcher is gone.
    fallback: std::sync::OnceLock<Fallback>,
}

type Fallback = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

impl std::fmt::Debug for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launcher")
            .field("pid", &self.pid)
            .field("gone", &self.gone)
            .finish_non_exhaustive()
    }
}

/// A program started by [`Launcher::spawn`] or [`spawn`]: its pipes, and its end.
#[derive(Debug)]
pub struct Launched {
    pub stdin: Option<std::fs::File>,
    pub stdout: Option<std::fs::File>,
    pub stderr: Option<std::fs::File>,
    end: End,
}

#[derive(Debug)]
enum End {
    /// The launcher's answer socket (the wait status comes on it), and the launcher.
    Answer(OwnedFd, libc::pid_t),
    /// A child of this process (no launcher).
    Child(std::process::Child),
}

/// What a program wrote and how it ended.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Launcher {
    /// Forks the launcher. The calling process must run a single thread, and should hold
    /// no file of the share yet (the launcher keeps none of the caller's descriptors).
    pub fn start() -> io::Result<Self> {
        if super::creds::thread_count() != Some(1) {
            return Err(io::Error::other(
                "cannot start the launcher: this process runs several threads",
            ));
        }
        let (ours, theirs) = seqpacket_pair()?;
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the process runs a single thread, so the child may run any code (no lock
        // is held by a thread that does not exist in it); it leaves through `_exit`.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            let code = launcher_main(theirs.as_raw_fd(), parent);
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(code) }
        }
        drop(theirs);
        set_timeout(ours.as_fd(), libc::SO_SNDTIMEO, ANSWER_WITHIN)?;
        Ok(Self {
            sock: ours,
            pid,
            gone: false.into(),
            fallback: std::sync::OnceLock::new(),
        })
    }

    /// Once the launcher is gone, a program is started by the caller itself only when
    /// `may` says so (Err: why not, which the start's error says).
    pub fn fallback_when(&self, may: impl Fn() -> Result<(), String> + Send + Sync + 'static) {
        let _ = self.fallback.set(Box::new(may));
    }

    /// The launcher is gone: killed (it may be stopped) and reaped, once.
    fn let_go(&self) {
        if !self.gone.swap(true, std::sync::atomic::Ordering::AcqRel) {
            tracing::warn!(
                "the launcher is gone (killed or stopped); the daemon starts its programs \
                 itself from now on, while it holds no file of the share open"
            );
            let mut status = 0;
            // SAFETY: signals and reaps our own child, writing its status into a local.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, &mut status, 0);
            }
        }
    }

    /// Starts `p` through the launcher; Ok(None) when the launcher is gone.
    fn spawn(&self, p: &Program) -> io::Result<Option<Launched>> {
        let (answer, answer_theirs) = seqpacket_pair()?;
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut flags = 0u8;
        let mut ours: [Option<std::fs::File>; 3] = [None, None, None];
        for (i, (want, bit)) in [(p.stdin, STDIN), (p.stdout, STDOUT), (p.stderr, STDERR)]
            .into_iter()
            .enumerate()
        {
            if !want {
                continue;
            }
            let (r, w) = std::io::pipe()?;
            let (mine, theirs): (OwnedFd, OwnedFd) = if i == 0 {
                (w.into(), r.into())
            } else {
                (r.into(), w.into())
            };
            ours[i] = Some(mine.into());
            fds.push(theirs);
            flags |= bit;
        }
        let mut sent: Vec<BorrowedFd<'_>> = vec![answer_theirs.as_fd()];
        sent.extend(fds.iter().map(|f| f.as_fd()));
        if let Some(h) = p.hold {
            flags |= HOLD;
            // SAFETY: the caller keeps `hold` open for the call (it names it to us).
            sent.push(unsafe { BorrowedFd::borrow_raw(h) });
        }
        let request = encode(p, flags)?;
        let gone = |e: &io::Error| {
            matches!(
                e.raw_os_error(),
                Some(libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN | libc::EAGAIN)
            )
        };
        if let Err(e) = send_with_fds(self.sock.as_fd(), &request, &sent) {
            return if gone(&e) { Ok(None) } else { Err(e) };
        }
        drop(sent);
        drop(fds);
        drop(answer_theirs);
        set_timeout(answer.as_fd(), libc::SO_RCVTIMEO, ANSWER_WITHIN)?;
        // The program's pid (unused: the launcher waits for it), or minus an errno.
        match read_answer(answer.as_fd()) {
            Ok(Some(pid)) => value_or_errno(pid)?,
            Ok(None) => return Ok(None),
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let [stdin, stdout, stderr] = ours;
        Ok(Some(Launched {
            stdin,
            stdout,
            stderr,
            end: End::Answer(answer, self.pid),
        }))
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        // The launcher ends when its socket closes (a program it started is killed with it).
        // SAFETY: shutdown on a descriptor we own.
        unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_RDWR) };
        let mut status = 0;
        // SAFETY: waits for our own child, writing its status into a local.
        unsafe { libc::waitpid(self.pid, &mut status, 0) };
    }
}

/// Starts `p` through `launcher`, or as a child of this process without one (a process
/// that holds no file of a share: the command line's own syncs, the tests) or once the
/// launcher is gone (killed by its user; the log says so once: a program started so may
/// take a failed write's error from a document's close, as it did without a launcher).
pub fn spawn(launcher: Option<&Launcher>, p: &Program) -> io::Result<Launched> {
    if let Some(l) = launcher {
        if !l.gone.load(std::sync::atomic::Ordering::Acquire) {
            if let Some(launched) = l.spawn(p)? {
                return Ok(launched);
            }
            l.let_go();
        }
        if let Some(Err(why)) = l.fallback.get().map(|may| may()) {
            return Err(io::Error::other(format!(
                "the daemon's launcher is gone, and {why}: a program the daemon started \
                 itself would take their closes' errors (it starts once they are closed)"
            )));
        }
    }
    let mut cmd = command(p);
    let mut child = cmd.spawn()?;
    Ok(Launched {
        stdin: child.stdin.take().map(|s| OwnedFd::from(s).into()),
        stdout: child.stdout.take().map(|s| OwnedFd::from(s).into()),
        stderr: child.stderr.take().map(|s| OwnedFd::from(s).into()),
        end: End::Child(child),
    })
}

/// std's command for `p` (standard streams piped as asked, else /dev/null), dying with
/// the thread that starts it and holding `p.hold` open.
fn command(p: &Program) -> std::process::Command {
    use std::process::Stdio;
    let pipe = |on: bool| if on { Stdio::piped() } else { Stdio::null() };
    let mut cmd = std::process::Command::new(&p.program);
    cmd.args(&p.args)
        .envs(p.env.iter().map(|(k, v)| (k, v)))
        .stdin(pipe(p.stdin))
        .stdout(pipe(p.stdout))
        .stderr(pipe(p.stderr));
    super::die_with_parent(&mut cmd, p.hold);
    cmd
}

impl Launched {
    /// Waits for the program to end.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        drop(self.stdin.take());
        match &mut self.end {
            End::Child(c) => c.wait(),
            // The program's end is waited for as long as it runs, and the launcher's
            // while it is not stopped: one its user stopped is killed (and with it the
            // program), and the next start finds it gone.
            End::Answer(sock, launcher) => loop {
                match read_answer(sock.as_fd()) {
                    Ok(Some(raw)) => return Ok(ExitStatus::from_raw(raw as i32)),
                    Ok(None) => {
                        return Err(io::Error::other(
                            "the launcher ended before the program did",
                        ))
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                        if super::process_stopped(*launcher as u32) {
                            // SAFETY: kill has no memory preconditions; the launcher is
                            // our child, not reaped yet (`Launcher::let_go` reaps it).
                            unsafe { libc::kill(*launcher, libc::SIGKILL) };
                        }
                    }
                    Err(e) => return Err(e),
                }
            },
        }
    }

    /// Reads what is left of the program's output and error to their ends, then waits.
    pub fn wait_with_output(mut self) -> io::Result<Output> {
        drop(self.stdin.take());
        let err = self.stderr.take().map(|mut e| {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                e.read_to_end(&mut v).map(|_| v)
            })
        });
        let mut stdout = Vec::new();
        if let Some(mut o) = self.stdout.take() {
            o.read_to_end(&mut stdout)?;
        }
        let stderr = match err {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the error reader panicked")))?,
            None => Vec::new(),
        };
        let status = self.wait()?;
        Ok(Output {
            status,
            stdout,
            stderr,
        })
    }
}

/// A pair of connected sockets of sequenced packets (close-on-exec).
pub(super) fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut pair = [0; 2];
    // SAFETY: socketpair writes two descriptors into a valid array of two.
    check(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            pair.as_mut_ptr(),
        )
    })?;
    // SAFETY: socketpair succeeded: both descriptors are open and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) })
}

/// A request: flags, the counts of arguments and of environment entries, then the program,
/// each argument and each `KEY` and `VALUE`, each as a length and its bytes.
fn encode(p: &Program, flags: u8) -> io::Result<Vec<u8>> {
    let mut v = vec![flags];
    v.extend_from_slice(&(p.args.len() as u32).to_le_bytes());
    v.extend_from_slice(&(p.env.len() as u32).to_le_bytes());
    let fields = std::iter::once(p.program.as_os_str())
        .chain(p.args.iter().map(|a| a.as_os_str()))
        .chain(
            p.env
                .iter()
                .flat_map(|(k, v)| [k.as_os_str(), v.as_os_str()]),
        );
    for f in fields {
        v.extend_from_slice(&(f.len() as u32).to_le_bytes());
        v.extend_from_slice(f.as_bytes());
    }
    if v.len() > MAX_REQUEST {
        return Err(io::Error::from_raw_os_error(libc::E2BIG));
    }
    Ok(v)
}

fn decode(buf: &[u8]) -> Option<(u8, Program)> {
    let (&flags, mut rest) = buf.split_first()?;
    let word = |rest: &mut &[u8]| -> Option<usize> {
        let (w, r) = rest.split_first_chunk::<4>()?;
        *rest = r;
        Some(u32::from_le_bytes(*w) as usize)
    };
    let nargs = word(&mut rest)?;
    let nenv = word(&mut rest)?;
    let mut fields = Vec::new();
    for _ in 0..(1 + nargs + 2 * nenv) {
        let n = word(&mut rest)?;
        if n > rest.len() {
            return None;
        }
        let (f, r) = rest.split_at(n);
        fields.push(OsString::from_vec(f.to_vec()));
        rest = r;
    }
    if !rest.is_empty() {
        return None;
    }
    let mut fields = fields.into_iter();
    let program = PathBuf::from(fields.next()?);
    let args: Vec<OsString> = fields.by_ref().take(nargs).collect();
    let rest: Vec<OsString> = fields.collect();
    let env = rest
        .chunks(2)
        .map(|kv| (kv[0].clone(), kv.get(1).cloned().unwrap_or_default()))
        .collect();
    Some((
        flags,
        Program {
            program,
            args,
            env,
            hold: None,
            stdin: flags & STDIN != 0,
            stdout: flags & STDOUT != 0,
            stderr: flags & STDERR != 0,
        },
    ))
}

/// Sends one packet with `fds` passed along.
pub(super) fn send_with_fds(
    sock: BorrowedFd<'_>,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid; every pointer set below points to a live local
    // for the duration of sendmsg, and the control buffer holds MAX_FDS descriptors.
    unsafe {
        let mut hdr: libc::msghdr = std::mem::zeroed();
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        if !raw.is_empty() {
            if raw.len() > MAX_FDS {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            let len = (raw.len() * std::mem::size_of::<RawFd>()) as u32;
            hdr.msg_control = control.as_mut_ptr().cast();
            hdr.msg_controllen = libc::CMSG_SPACE(len) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&hdr);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(len) as _;
            std::ptr::copy_nonoverlapping(
                raw.as_ptr(),
                libc::CMSG_DATA(cmsg).cast::<RawFd>(),
                raw.len(),
            );
        }
        loop {
            let n = libc::sendmsg(sock.as_raw_fd(), &hdr, libc::MSG_NOSIGNAL);
            if n == data.len() as isize {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if n < 0 && e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(if n < 0 {
                e
            } else {
                io::Error::from_raw_os_error(libc::EIO)
            });
        }
    }
}

/// Receives one packet into `buf` and the descriptors passed with it (close-on-exec).
/// Returns 0 bytes at the end of the stream.
fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: as in send_with_fds; recvmsg writes at most the lengths given, and each
    // descriptor read from the control message is a new one of ours.
    unsafe {
        let mut hdr: libc::msghdr = std::mem::zeroed();
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = control.as_mut_ptr().cast();
        hdr.msg_controllen = std::mem::size_of_val(&control) as _;
        let n = loop {
            let n = libc::recvmsg(sock, &mut hdr, libc::MSG_CMSG_CLOEXEC);
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        let mut fds = Vec::new();
        let mut cmsg = libc::CMSG_FIRSTHDR(&hdr);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&hdr, cmsg);
        }
        if hdr.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
            return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
        }
        Ok((n, fds))
    }
}

/// One answer (a pid, minus an errno, or a wait status); None at the end of the stream.
pub(super) fn read_answer(sock: BorrowedFd<'_>) -> io::Result<Option<i64>> {
    let mut buf = [0u8; 8];
    loop {
        // SAFETY: recv writes at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        match n {
            8 => return Ok(Some(i64::from_le_bytes(buf))),
            0 => return Ok(None),
            n if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            n if n < 0 => return Err(io::Error::last_os_error()),
            _ => return Err(io::Error::from_raw_os_error(libc::EIO)),
        }
    }
}

/// An answer that is a value or minus an errno: the value, or that error (EIO for a
/// number no errno can be).
pub(super) fn value_or_errno(v: i64) -> io::Result<u64> {
    u64::try_from(v).map_err(|_| {
        io::Error::from_raw_os_error(i32::try_from(v.unsigned_abs()).unwrap_or(libc::EIO))
    })
}

/// Sets a socket's send or receive timeout (`opt`) to `secs` (0: none).
pub(super) fn set_timeout(
    sock: BorrowedFd<'_>,
    opt: libc::c_int,
    secs: libc::time_t,
) -> io::Result<()> {
    let wait = libc::timeval {
        tv_sec: secs,
        tv_usec: 0,
    };
    // SAFETY: setsockopt reads a timeval from a valid pointer of the size given.
    check(unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&wait as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    })
}

fn answer(sock: BorrowedFd<'_>, v: i64) {
    let bytes = v.to_le_bytes();
    // SAFETY: send reads `bytes.len()` bytes from a live local. A caller gone is fine.
    unsafe {
        libc::send(
            sock.as_raw_fd(),
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_NOSIGNAL,
        )
    };
}

/// The launcher child. Returns its exit code.
fn launcher_main(sock: RawFd, parent: libc::pid_t) -> i32 {
    // SAFETY: plain system calls on integers and on a C string literal.
    unsafe {
        // Only the socket (3) stays open, and standard streams on /dev/null: the daemon's
        // (a pipe to the command that started it) are not held open by the launcher.
        let s = libc::fcntl(sock, libc::F_DUPFD_CLOEXEC, 10);
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if s < 0 || null < 0 || libc::dup3(s, 3, libc::O_CLOEXEC) < 0 {
            return 120;
        }
        for fd in 0..3 {
            if libc::dup2(null, fd) < 0 {
                return 120;
            }
        }
        if libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32) != 0
            || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
            || libc::getppid() != parent
        {
            return 121;
        }
        libc::prctl(libc::PR_SET_NAME, c"ccfs-launcher".as_ptr(), 0, 0, 0);
        // A signal sent to the daemon's process group (a terminal's Ctrl-C or hang-up, a
        // session's end, `pkill`) is the daemon's to act on: the launcher, whose end would
        // leave the daemon to start programs itself, takes none (blocked here and in the
        // threads it makes; a program it starts gets an empty mask from std).
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
    }
    let mut buf = vec![0u8; MAX_REQUEST];
    loop {
        let (n, fds) = match recv_with_fds(3, &mut buf) {
            Ok((0, _)) => return 0,
            Ok(got) => got,
            Err(_) => return 123,
        };
        serve_request(&buf[..n], fds);
    }
}

/// Starts one request's program, answers its pid, and leaves a thread to answer its end.
fn serve_request(req: &[u8], fds: Vec<OwnedFd>) {
    let mut fds = fds.into_iter();
    let Some(answer_sock) = fds.next() else {
        return;
    };
    let Some((flags, mut p)) = decode(req) else {
        answer(answer_sock.as_fd(), -i64::from(libc::EINVAL));
        return;
    };
    let mut take = |bit: u8| {
        if flags & bit != 0 {
            fds.next().map(Some).ok_or(())
        } else {
            Ok(None)
        }
    };
    let (Ok(stdin), Ok(stdout), Ok(stderr), Ok(hold)) =
        (take(STDIN), take(STDOUT), take(STDERR), take(HOLD))
    else {
        answer(answer_sock.as_fd(), -i64::from(libc::EINVAL));
        return;
    };
    p.hold = hold.as_ref().map(|h| h.as_raw_fd());
    let mut cmd = command(&p);
    let stdio = |f: Option<OwnedFd>| f.map(std::process::Stdio::from);
    if let Some(s) = stdio(stdin) {
        cmd.stdin(s);
    }
    if let Some(s) = stdio(stdout) {
        cmd.stdout(s);
    }
    if let Some(s) = stdio(stderr) {
        cmd.stderr(s);
    }
    let spawned = cmd.spawn();
    // Our copies of the pipes and of the held descriptor go now: the program holds its own.
    drop(cmd);
    drop(hold);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            answer(
                answer_sock.as_fd(),
                -i64::from(e.raw_os_error().unwrap_or(libc::EIO)),
            );
            return;
        }
    };
    answer(answer_sock.as_fd(), i64::from(child.id()));
    let waiter = std::thread::Builder::new()
        .name("wait".into())
        .spawn(move || {
            if let Ok(status) = child.wait() {
                answer(answer_sock.as_fd(), i64::from(status.into_raw()));
            }
        });
    // Without a thread the answer socket closes: the caller learns the launcher lost track.
    drop(waiter);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_a_value_or_an_errno_and_never_a_panic() {
        assert_eq!(value_or_errno(4321).expect("value"), 4321);
        let errno = |v| value_or_errno(v).expect_err("error").raw_os_error();
        assert_eq!(errno(-i64::from(libc::ENOENT)), Some(libc::ENOENT));
        assert_eq!(errno(i64::MIN), Some(libc::EIO));
        assert_eq!(errno(-(1i64 << 40)), Some(libc::EIO));
    }

    #[test]
    fn a_request_reads_back_as_sent() {
        let p = Program::new("/usr/bin/rsync")
            .args(["-a", "", "--files-from=-"])
            .env("TZ", "UTC0")
            .piped_output();
        let (flags, back) = decode(&encode(&p, STDOUT | STDERR).expect("encode")).expect("decode");
        assert_eq!(flags, STDOUT | STDERR);
        assert_eq!(back.program, p.program);
        assert_eq!(back.args, p.args);
        assert_eq!(back.env, p.env);
        assert!(!back.stdin && back.stdout && back.stderr);
        let bytes = encode(&p, 0).expect("encode");
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_none(), "a request cut at {cut}");
        }
    }
}
