//! The client's side: connecting to a mount's daemon, one JSON line each way, with time
//! limits.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use super::*;

/// Connects to a mount's daemon and makes sure it is that mount's: the peer must run as
/// root, the mount's owner or the cache directory's owner (whom the daemon runs as).
pub fn connect(m: &MountRef) -> std::io::Result<UnixStream> {
    // The socket lies in a directory its user controls: it is opened without following any
    // symlink on the way (a name swapped for one after a check could lead root's client to
    // any socket), checked, and connected to through that very descriptor.
    let rel = m
        .socket
        .strip_prefix("/")
        .map_err(|_| std::io::Error::other(format!("{} is not absolute", m.socket.display())))?;
    let fd = crate::sys::Root::open(Path::new("/"))?
        .open_fd(rel, libc::O_PATH, 0)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", m.socket.display())))?;
    if crate::sys::fstat(&fd)?.file_type() != libc::S_IFSOCK {
        return Err(std::io::Error::other(format!(
            "{} is not a socket",
            m.socket.display()
        )));
    }
    let stream = UnixStream::connect(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    ))?;
    let peer = crate::sys::peer_credentials(&stream)?;
    if peer.uid != 0 && peer.uid != m.mount_uid && peer.uid != m.cache_uid {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is served by uid {} (pid {}), neither root nor the owner of the mount or its cache",
                m.socket.display(),
                peer.uid,
                peer.pid
            ),
        ));
    }
    Ok(stream)
}

/// Sends one request and reads the answer (client side), waiting at most `timeout` for it
/// when one is given.
pub fn request(
    m: &MountRef,
    req: &Request,
    timeout: Option<Duration>,
) -> std::io::Result<serde_json::Value> {
    let stream = connect(m)?;
    stream.set_read_timeout(timeout)?;
    send(&stream, req)?;
    let deadline = timeout.map(|t| Instant::now() + t);
    read_line_value(&mut BufReader::new(&stream), deadline)
}

/// Asks a mount's daemon for its status, waiting at most `timeout`.
pub fn status(m: &MountRef, timeout: Duration) -> std::io::Result<Status> {
    let v = request(m, &Request::Status, Some(timeout))?;
    serde_json::from_value(v).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("the daemon answered badly: {e}"),
        )
    })
}

/// The daemon's unsynced paths and pending deletions (`ccfs status --verbose`).
pub fn pending(m: &MountRef, timeout: Duration) -> std::io::Result<super::Pending> {
    let v = request(m, &Request::Pending, Some(timeout))?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        return Err(std::io::Error::other(e.to_string()));
    }
    serde_json::from_value(v).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("the daemon answered badly: {e}"),
        )
    })
}

pub fn send(stream: &UnixStream, req: &Request) -> std::io::Result<()> {
    let mut w = stream;
    let text = serde_json::to_string(req).map_err(std::io::Error::other)?;
    w.write_all(text.as_bytes())?;
    w.write_all(b"\n")
}

/// Reads one JSON line from a buffered connection (several answers may follow), all of
/// it by `deadline` when one is given (the stream's read timeout bounds each read; the
/// deadline bounds the whole answer, which a peer sending a byte now and then would
/// otherwise stretch for ever).
pub fn read_line_value(
    reader: &mut impl BufRead,
    deadline: Option<Instant>,
) -> std::io::Result<serde_json::Value> {
    let mut line = Vec::new();
    match read_line_until(reader, &mut line, deadline)? {
        LineRead::Line | LineRead::Closed => {}
        LineRead::Partial => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the daemon did not finish its answer in time",
            ))
        }
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the daemon closed the connection without an answer",
        ));
    }
    serde_json::from_slice(&line).map_err(std::io::Error::other)
}

/// How [`read_line_until`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineRead {
    /// A whole line, its newline included.
    Line,
    /// The peer closed the connection (what came before is in the buffer).
    Closed,
    /// The deadline passed with the line unfinished.
    Partial,
}

/// Appends to `line` what the peer sends, up to its first newline, until `deadline`. A
/// read that times out (the stream's read timeout) is an error of kind `WouldBlock` or
/// `TimedOut` unless the deadline has passed; a line longer than [`MAX_ANSWER`] is an
/// error: no peer makes the reader wait or grow without bound.
pub fn read_line_until(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    deadline: Option<Instant>,
) -> std::io::Result<LineRead> {
    let past = |d: Option<Instant>| d.is_some_and(|d| Instant::now() >= d);
    loop {
        // One read at a time (`read_until` would go on reading until the newline, which a
        // peer sending a byte now and then never sends).
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if timed_out(&e) && past(deadline) => return Ok(LineRead::Partial),
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(LineRead::Closed);
        }
        let (take, whole) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        line.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if whole {
            return Ok(LineRead::Line);
        }
        if line.len() as u64 > MAX_ANSWER {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the daemon's answer is longer than {MAX_ANSWER} bytes"),
            ));
        }
        if past(deadline) {
            return Ok(LineRead::Partial);
        }
    }
}

/// True for an error that means nobody listens on the socket (the daemon is gone), as
/// opposed to one that does not answer in time or may not be asked.
pub fn daemon_gone(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
    )
}

/// True for an error that means the daemon went away during a request: gone already
/// ([`daemon_gone`]), or ending as it was asked: it closed the connection without an
/// answer (end of file), or ended before it even read the question, which makes the
/// kernel reset the connection (ECONNRESET; EPIPE when the question is written after).
pub fn daemon_ending(e: &std::io::Error) -> bool {
    daemon_gone(e)
        || matches!(
            e.kind(),
            std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe
        )
}

/// True for an error that means the daemon did not answer in time.
pub fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}
