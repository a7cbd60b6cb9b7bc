//! The daemon's log: where it goes at each stage of a start, one line an event, and the
//! READY hand-over to `ccfs mount`.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

use crate::locks::Locked;
use crate::sys::{self, DirFd};

use super::*;

// ---- the daemon's log -------------------------------------------------------------------

/// Where this process's log goes: `FOREGROUND` standard error as given (a terminal, or
/// `ccfs recover` run by someone); the stages after it belong to the daemon `ccfs mount`
/// starts in the background: `STARTING` (standard output and error both go to the
/// waiting `ccfs mount`; lines are also kept for the log), `LOG_OPEN` (standard error is
/// CACHE/ccfs.log, standard output still reaches `ccfs mount`), `READY` (both are the
/// log).
static STAGE: AtomicU8 = AtomicU8::new(STAGE_FOREGROUND);
const STAGE_FOREGROUND: u8 = 0;
const STAGE_STARTING: u8 = 1;
const STAGE_LOG_OPEN: u8 = 2;
const STAGE_READY: u8 = 3;

/// Lines logged before the daemon could open its log (it opens it only once it runs as
/// the user), written at its head then. Lock order: 20 (ARCHITECTURE.md, Locks), last of
/// all: any thread may log while it holds any other lock.
static EARLY_LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());
const EARLY_LOG_MAX: usize = 1 << 20;

/// The line the background daemon prints on standard output once its mount is live;
/// `ccfs mount` waits for it.
pub const READY_LINE: &str = "ccfs: the mount is live";

/// The log writer of every ccfs command: standard error, which the background daemon
/// turns into CACHE/ccfs.log. It never fails: a full disk or a closed descriptor costs
/// the line, never the daemon. Each event arrives as one line; a line break or other
/// control character inside it (a file name with a newline, logged by any module) is
/// written as `\xHH`, so one event is one line of the log and cannot forge another.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogWriter {
    /// Colours are on (a terminal): escape sequences are kept.
    ansi: bool,
}

impl LogWriter {
    pub fn new(ansi: bool) -> Self {
        Self { ansi }
    }
}

/// `buf` with every control character but a tab, the final newline and (with `ansi`)
/// escape written as `\xHH`.
fn one_line(buf: &[u8], ansi: bool) -> std::borrow::Cow<'_, [u8]> {
    let last = buf.len().saturating_sub(1);
    let needs = |i: usize, b: u8| {
        (b < 0x20 || b == 0x7f) && b != b'\t' && !(b == b'\n' && i == last) && !(b == 0x1b && ansi)
    };
    if !buf.iter().enumerate().any(|(i, &b)| needs(i, b)) {
        return std::borrow::Cow::Borrowed(buf);
    }
    let mut out = Vec::with_capacity(buf.len() + 16);
    for (i, &b) in buf.iter().enumerate() {
        if needs(i, b) {
            out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
        } else {
            out.push(b);
        }
    }
    std::borrow::Cow::Owned(out)
}

impl io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let line = one_line(buf, self.ansi);
        if STAGE.load(Ordering::Acquire) == STAGE_STARTING {
            let mut early = EARLY_LOG.locked();
            // Checked again under the lock: the log may have been opened meanwhile.
            if STAGE.load(Ordering::Acquire) == STAGE_STARTING
                && early.len() + line.len() <= EARLY_LOG_MAX
            {
                early.extend_from_slice(&line);
            }
            sys::write_fd_lossy(2, &line);
            return Ok(buf.len());
        }
        sys::write_fd_lossy(2, &line);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}

/// Marks this process as the daemon `ccfs mount` started in the background (its standard
/// output and error lead to the waiting `ccfs mount`).
pub fn started_by_mount() {
    STAGE.store(STAGE_STARTING, Ordering::Release);
}

/// Writes a fatal error line: to standard error (the log, for the daemon) and, while the
/// background daemon is not live yet, also to the waiting `ccfs mount`, which shows it.
/// Never fails.
pub fn report_fatal(line: &str) {
    let text = format!("{line}\n");
    sys::write_fd_lossy(2, text.as_bytes());
    if STAGE.load(Ordering::Acquire) == STAGE_LOG_OPEN {
        sys::write_fd_lossy(1, text.as_bytes());
    }
}

/// Opens CACHE/ccfs.log for appending as whoever this process is now (for a mount root
/// made for a user: the user, after the drop): never through a symlink at its name, and
/// only a regular file of ours. Anything else at that name (a symlink, a log an older
/// ccfs made as root) is removed (the entry itself, never what it points to) and a fresh
/// log made: the cache directory is ours.
fn open_log_file(cache_dir: &Path) -> io::Result<File> {
    let dir = DirFd::open(cache_dir)?;
    let name = OsStr::new("ccfs.log");
    let flags = libc::O_WRONLY | libc::O_APPEND | libc::O_NONBLOCK;
    let ours = |f: &File| sys::fstat(f).is_ok_and(|st| st.is_file() && st.uid() == sys::geteuid());
    match dir.open_file(name, flags | libc::O_CREAT, 0o600) {
        Ok(f) if ours(&f) => return Ok(f),
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return Err(e),
        Err(_) => {}
    }
    match dir.entry(name)? {
        Some(st) if st.is_dir() => {
            return Err(io_other("it is a directory".to_string()));
        }
        Some(_) => {
            dir.unlink(name)?;
            tracing::warn!(
                "replaced {}/ccfs.log, which was not a regular file of uid {}",
                LogPath(cache_dir),
                sys::geteuid()
            );
        }
        None => {}
    }
    let f = dir.open_file(name, flags | libc::O_CREAT | libc::O_EXCL, 0o600)?;
    if !ours(&f) {
        return Err(io_other("it is not a regular file of ours".to_string()));
    }
    Ok(f)
}

/// The background daemon's log (its standard error) becomes CACHE/ccfs.log, with the
/// lines logged so far at its head. A log that cannot be used (a symlink, another
/// user's file, a full disk) is replaced by nothing: the daemon runs on.
pub(super) fn open_daemon_log(cache_dir: &Path) {
    if STAGE.load(Ordering::Acquire) != STAGE_STARTING {
        return;
    }
    let target = match open_log_file(cache_dir) {
        Ok(f) => Ok(f),
        Err(e) => {
            tracing::warn!(
                "cannot use the log {}/ccfs.log: {e}; this mount logs nothing",
                LogPath(cache_dir)
            );
            OpenOptions::new().write(true).open("/dev/null")
        }
    };
    let mut early = EARLY_LOG.locked();
    if let Ok(f) = &target {
        let _ = (&*f).write_all(&early);
        let _ = sys::dup_onto(f, 2);
    }
    *early = Vec::new();
    STAGE.store(STAGE_LOG_OPEN, Ordering::Release);
}

/// Tells systemd, when it started this daemon as a `Type=notify` service (`ccfs@.service`
/// runs `ccfs mount --foreground`), how it is: `$NOTIFY_SOCKET`, a datagram. Never fails.
fn notify_systemd(state: &str) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let addr = match path.as_bytes().strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name),
        None => SocketAddr::from_pathname(&path),
    };
    if let (Ok(addr), Ok(sock)) = (addr, UnixDatagram::unbound()) {
        if let Err(e) = sock.send_to_addr(state.as_bytes(), &addr) {
            tracing::warn!("cannot tell systemd the mount is live: {e}");
        }
    }
}

/// Tells the waiting `ccfs mount` that the mount is live, then sends standard output to
/// the log as well (so `ccfs mount` sees the end of it).
pub(super) fn report_ready() {
    notify_systemd("READY=1\nSTATUS=the mount is live");
    let stage = STAGE.load(Ordering::Acquire);
    if stage != STAGE_STARTING && stage != STAGE_LOG_OPEN {
        return;
    }
    sys::write_fd_lossy(1, format!("{READY_LINE}\n").as_bytes());
    let _ = sys::dup_onto(&io::stderr(), 1);
    STAGE.store(STAGE_READY, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_event_is_one_line() {
        let event = b"2026 DEBUG copied up path=.x\n* * * * * root touch /pwned\r\n";
        let line = one_line(event, false);
        assert_eq!(
            &*line,
            &b"2026 DEBUG copied up path=.x\\x0a* * * * * root touch /pwned\\x0d\n"[..]
        );
        assert_eq!(&*one_line(b"\x1b[1mok\tfine\n", true), b"\x1b[1mok\tfine\n");
        assert_eq!(&*one_line(b"\x1b[1m\n", false), b"\\x1b[1m\n");
    }

    #[test]
    fn log_paths_and_text_stay_on_one_printable_line() {
        let p = Path::new(".x\n* * * * * root touch /pwned");
        let shown = LogPath(p).to_string();
        assert!(!shown.contains('\n') && !shown.contains(' '), "{shown}");
        assert_eq!(crate::journal::unescape(&shown).as_deref(), Some(p));
        let t = LogText("rsync: \"a\nb\u{1b}[31m\" failed").to_string();
        assert_eq!(t, "rsync: \"a\\x0ab\\x1b[31m\" failed");
    }
}
