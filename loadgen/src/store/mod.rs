//! Where the engine's file operations go: a mounted directory (system calls), or an NFS
//! export spoken to directly over NFSv3 (for machines without a kernel NFS client).
//!
//! Both give the engine the same operations (mkdir, open for writing or reading, write,
//! read, fsync, close, stat, unlink, rmdir), so every phase and metric is the same on both.
//! The NFS client behaves like the kernel's in the ways that count for the workload: an
//! open looks the name up (CREATE for writing), writes go out UNSTABLE and a close
//! commits them (close-to-open consistency), and it keeps no data cache, so every read
//! reaches the server.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nfs3_client::nfs3_types::nfs3::{ftype3, nfs_fh3};

mod nfs;
pub use nfs::{Guarded, NfsStore};

/// An NFS export given as `nfs://HOST[:PORT]/EXPORT` (PORT: the portmapper's, default 111).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsUrl {
    pub host: String,
    pub port: u16,
    pub export: String,
    /// How long a call waits for the server (connect, send, each read of its answer).
    pub timeout: std::time::Duration,
}

impl NfsUrl {
    /// Parses a target; `None` when it is not an `nfs://` URL at all.
    pub fn parse(s: &str) -> Option<Result<Self, String>> {
        let rest = s.strip_prefix("nfs://")?;
        Some(Self::parse_rest(s, rest))
    }

    fn parse_rest(s: &str, rest: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!("{s:?} is not a usable NFS URL: {why}; write nfs://HOST[:PORT]/EXPORT")
        };
        if rest.contains(['?', '#']) {
            return Err(bad("query strings and fragments are not supported"));
        }
        let (authority, export) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => return Err(bad("the export path is missing")),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                let port = p
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| bad(&format!("port {p:?} is not a number in 1..65535")))?;
                (h, port)
            }
            _ => (authority, 111),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad("the host is missing"));
        }
        let export = export.trim_end_matches('/');
        Ok(Self {
            host: host.to_string(),
            port,
            export: if export.is_empty() { "/" } else { export }.to_string(),
            timeout: std::time::Duration::from_secs(60),
        })
    }

    pub fn to_url(&self) -> String {
        if self.port == 111 {
            format!("nfs://{}{}", self.host, self.export)
        } else {
            format!("nfs://{}:{}{}", self.host, self.port, self.export)
        }
    }
}

/// Where a run's files live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A directory on a mounted filesystem.
    Local(PathBuf),
    /// The root of an NFS export; paths inside it are written from `/`.
    Nfs(NfsUrl),
}

impl Target {
    /// A command-line target: an `nfs://` URL or a directory.
    pub fn parse(s: &str) -> Result<Self, String> {
        match NfsUrl::parse(s) {
            Some(url) => url.map(Target::Nfs),
            None => Ok(Target::Local(PathBuf::from(s))),
        }
    }

    /// The directory runs are made in, as the store names it.
    pub fn base(&self) -> PathBuf {
        match self {
            Target::Local(p) => p.clone(),
            Target::Nfs(_) => PathBuf::from("/"),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Target::Local(p) => p.display().to_string(),
            Target::Nfs(u) => u.to_url(),
        }
    }
}

/// What a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Other,
}

/// An open file.
pub enum Handle {
    Local(File),
    Nfs {
        fh: nfs_fh3,
        offset: u64,
        /// Written since the last COMMIT.
        unstable: bool,
        /// The server said the last read reached the end (no extra READ for the 0).
        eof: bool,
    },
}

/// One client's connection to the target.
pub enum Store {
    Local,
    Nfs(Box<NfsStore>),
    /// The connection could not be made: every operation fails with this message.
    Failed(String),
}

impl Store {
    /// Opens a store for one client (for NFS: its own TCP connections, like one host).
    pub fn connect(target: &Target) -> Self {
        match target {
            Target::Local(_) => Store::Local,
            Target::Nfs(url) => match NfsStore::connect(url) {
                Ok(s) => Store::Nfs(Box::new(s)),
                Err(e) => Store::Failed(e),
            },
        }
    }

    fn failed(msg: &str) -> io::Error {
        io::Error::new(io::ErrorKind::NotConnected, msg.to_string())
    }

    pub fn mkdir(&mut self, p: &Path) -> io::Result<()> {
        match self {
            Store::Local => fs::create_dir(p),
            Store::Nfs(s) => s.mkdir(p),
            Store::Failed(m) => Err(Self::failed(m)),
        }
    }

    /// Opens for writing, creating the file; `append` keeps its content, otherwise it is
    /// truncated.
    pub fn open_write(&mut self, p: &Path, append: bool) -> io::Result<Handle> {
        match self {
            Store::Local => {
                let mut opts = OpenOptions::new();
                opts.create(true);
                if append {
                    opts.append(true);
                } else {
                    opts.write(true).truncate(true);
                }
                opts.open(p).map(Handle::Local)
            }
            Store::Nfs(s) => s.open_write(p, append),
            Store::Failed(m) => Err(Self::failed(m)),
        }
    }

    pub fn write(&mut self, h: &mut Handle, buf: &[u8]) -> io::Result<()> {
        match (self, h) {
            (Store::Local, Handle::Local(f)) => f.write_all(buf),
            (
                Store::Nfs(s),
                Handle::Nfs {
                    fh,
                    offset,
                    unstable,
                    ..
                },
            ) => {
                s.write(fh, *offset, buf)?;
                *offset += buf.len() as u64;
                *unstable = true;
                Ok(())
            }
            (Store::Failed(m), _) => Err(Self::failed(m)),
            _ => Err(mismatch()),
        }
    }

    pub fn fsync(&mut self, h: &mut Handle) -> io::Result<()> {
        match (self, h) {
            (Store::Local, Handle::Local(f)) => f.sync_all(),
            (Store::Nfs(s), Handle::Nfs { fh, unstable, .. }) => {
                s.commit(fh)?;
                *unstable = false;
                Ok(())
            }
            (Store::Failed(m), _) => Err(Self::failed(m)),
            _ => Err(mismatch()),
        }
    }

    pub fn close(&mut self, h: Handle) -> io::Result<()> {
        match (self, h) {
            (Store::Local, Handle::Local(f)) => {
                drop(f);
                Ok(())
            }
            (Store::Nfs(s), Handle::Nfs { fh, unstable, .. }) => {
                if unstable {
                    s.commit(&fh)?;
                }
                Ok(())
            }
            (Store::Failed(m), _) => Err(Self::failed(m)),
            _ => Err(mismatch()),
        }
    }

    /// Opens for reading and appending, creating the file (Python's `open(name, 'a+')`, as
    /// compilebench opens every file it writes). `from_start`: reads start at the
    /// beginning (compilebench's patch reads the file, truncates it, then writes);
    /// otherwise the file is only appended to.
    pub fn open_append(&mut self, p: &Path, from_start: bool, direct: bool) -> io::Result<Handle> {
        match self {
            Store::Local => OpenOptions::new()
                .read(true)
                .append(true)
                .create(true)
                .custom_flags(if direct { libc::O_DIRECT } else { 0 })
                .open(p)
                .map(Handle::Local),
            Store::Nfs(s) => {
                let h = s.open_write(p, true)?;
                match h {
                    Handle::Nfs {
                        fh,
                        offset,
                        unstable,
                        eof,
                    } => Ok(Handle::Nfs {
                        fh,
                        offset: if from_start { 0 } else { offset },
                        unstable,
                        eof,
                    }),
                    other => Ok(other),
                }
            }
            Store::Failed(m) => Err(Self::failed(m)),
        }
    }

    /// Opens an existing file to write it over from its start (no truncation).
    pub fn open_over(&mut self, p: &Path, direct: bool) -> io::Result<Handle> {
        match self {
            Store::Local => OpenOptions::new()
                .write(true)
                .custom_flags(if direct { libc::O_DIRECT } else { 0 })
                .open(p)
                .map(Handle::Local),
            Store::Nfs(s) => {
                let (fh, _) = s.lookup_path(p)?;
                Ok(Handle::Nfs {
                    fh,
                    offset: 0,
                    unstable: false,
                    eof: false,
                })
            }
            Store::Failed(m) => Err(Self::failed(m)),
        }
    }

    /// Truncates an open file to nothing; writes go on at its (new) end.
    pub fn truncate(&mut self, h: &mut Handle) -> io::Result<()> {
        match (self, h) {
            (Store::Local, Handle::Local(f)) => f.set_len(0),
            (
                Store::Nfs(s),
                Handle::Nfs {
                    fh, offset, eof, ..
                },
            ) => {
                s.set_size(fh, 0)?;
                *offset = 0;
                *eof = false;
                Ok(())
            }
            (Store::Failed(m), _) => Err(Self::failed(m)),
            _ => Err(mismatch()),
        }
    }

    /// The names in a directory, in the order the filesystem gives them, with what each
    /// is (from the directory entry when it says; `.` and `..` left out).
    pub fn readdir(&mut self, p: &Path) -> io::Result<Vec<(String, Kind)>> {
        match self {
            Store::Local => {
                let mut out = Vec::new();
                for e in fs::read_dir(p)? {
                    let e = e?;
                    let t = e.file_type()?;
                    let kind = if t.is_dir() {
                        Kind::Dir
                    } else if t.is_file() {
                        Kind::File
                    } else {
                        Kind::Other
                    };
                    out.push((e.file_name().to_string_lossy().into_owned(), kind));
                }
                Ok(out)
            }
            Store::Nfs(s) => s.readdir(p),
            Store::Failed(m) => Err(Self::failed(m)),
        }
    }

    /// Opens an existing regular file for reading (a symlink is refused, as O_NOFOLLOW).
    pub fn open_read(&mut self, p: &Path, direct: bool) -> io::Result<Handle> {
        match self {
            Store::Local => OpenOptions::new()
                .read(true)
                // O_NONBLOCK: a FIFO put in place of a file does not hang the open.
                .custom_flags(
                    libc::O_NOFOLLOW | libc::O_NONBLOCK | if direct { libc::O_DIRECT } else { 0 },
                )
                .open(p)
                .map(Handle::Local),
            Store::Nfs(s) => {
                let (fh, attr) = s.lookup_path(p)?;
                match attr.map(|a| a.type_) {
                    Some(ftype3::NF3LNK) => Err(io::Error::from_raw_os_error(libc::ELOOP)),
                    Some(ftype3::NF3DIR) => Err(io::Error::from_raw_os_error(libc::EISDIR)),
                    _ => Ok(Handle::Nfs {
                        fh,
                        offset: 0,
                        unstable: false,
                        eof: false,
                    }),
                }
            }
            Store::Failed(m) => Err(Self::failed(m)),
        }
    }

    /// Reads the next bytes; 0 at the end.
    pub fn read(&mut self, h: &mut Handle, buf: &mut [u8]) -> io::Result<usize> {
        match (self, h) {
            (Store::Local, Handle::Local(f)) => f.read(buf),
            (
                Store::Nfs(s),
                Handle::Nfs {
                    fh, offset, eof, ..
                },
            ) => {
                if *eof {
                    return Ok(0);
                }
                let (n, at_end) = s.read(fh, *offset, buf)?;
                *offset += n as u64;
                *eof = at_end;
                Ok(n)
            }
            (Store::Failed(m), _) => Err(Self::failed(m)),
            _ => Err(mismatch()),
        }
    }

    /// What `p` is, without following a final symlink.
    pub fn stat(&mut self, p: &Path) -> io::Result<Kind> {
        match self {
            Store::Local => {
                let t = fs::symlink_metadata(p)?.file_type();
                Ok(if t.is_dir() {
                    Kind::Dir
                } else if t.is_file() {
                    Kind::File
                } else {
                    Kind::Other
                })
            }
            Store::Nfs(s) => {
                let (_, attr) = s.lookup_path(p)?;
                Ok(match attr.map(|a| a.type_) {
                    Some(ftype3::NF3DIR) => Kind::Dir,
                    Some(ftype3::NF3REG) => Kind::File,
                    _ => Kind::Other,
                })
            }
            Store::Failed(m) => Err(Self::failed(m)),
        }
    }

    pub fn unlink(&mut self, p: &Path) -> io::Result<()> {
        match self {
            Store::Local => fs::remove_file(p),
            Store::Nfs(s) => s.remove(p, false),
            Store::Failed(m) => Err(Self::failed(m)),
        }
    }

    pub fn rmdir(&mut self, p: &Path) -> io::Result<()> {
        match self {
            Store::Local => fs::remove_dir(p),
            Store::Nfs(s) => s.remove(p, true),
            Store::Failed(m) => Err(Self::failed(m)),
        }
    }

    /// Whether a directory holds anything.
    pub fn is_empty_dir(&mut self, p: &Path) -> io::Result<bool> {
        match self {
            Store::Local => Ok(fs::read_dir(p)?.next().is_none()),
            Store::Nfs(s) => s.is_empty_dir(p),
            Store::Failed(m) => Err(Self::failed(m)),
        }
    }

    /// Flushes the filesystem `p` is on: syncfs locally; nothing over NFS (every close
    /// has committed already).
    pub fn syncfs(&mut self, p: &Path) -> io::Result<()> {
        match self {
            Store::Local => crate::sys::syncfs(&File::open(p)?),
            Store::Nfs(_) => Ok(()),
            Store::Failed(m) => Err(Self::failed(m)),
        }
    }

    /// Writes a small file whole (create or truncate).
    pub fn put(&mut self, p: &Path, data: &[u8]) -> io::Result<()> {
        let mut h = self.open_write(p, false)?;
        self.write(&mut h, data)?;
        self.close(h)
    }
}

fn mismatch() -> io::Error {
    io::Error::other("file handle used with another store")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nfs_urls_parse_and_bad_ones_say_why() {
        let u = |s: &str| NfsUrl::parse(s).map(|r| r.map(|u| (u.host, u.port, u.export)));
        assert_eq!(
            u("nfs://127.0.0.1/export"),
            Some(Ok(("127.0.0.1".into(), 111, "/export".into())))
        );
        assert_eq!(
            u("nfs://server:2049/home/"),
            Some(Ok(("server".into(), 2049, "/home".into())))
        );
        assert_eq!(u("nfs://h/"), Some(Ok(("h".into(), 111, "/".into()))));
        assert_eq!(u("/mnt/nfs"), None);
        for bad in [
            "nfs://",
            "nfs://host",
            "nfs://:111/x",
            "nfs://h:0/x",
            "nfs://h:x/e",
            "nfs://h/e?v=3",
        ] {
            let e = u(bad).and_then(Result::err).unwrap_or_default();
            assert!(e.contains("nfs://HOST[:PORT]/EXPORT"), "{bad}: {e}");
        }
        assert_eq!(
            Target::parse("nfs://10.0.0.1/a").map(|t| t.describe()),
            Ok("nfs://10.0.0.1/a".to_string())
        );
    }
}
