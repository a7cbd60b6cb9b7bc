//! The NFSv3 client: one connection (through [`Guarded`], which fails instead of hanging)
//! and one tokio runtime a client, the server's status codes as Linux errno values.

use std::collections::HashMap;
use std::io;
use std::path::{Component, Path, PathBuf};

use nfs3_client::nfs3_types::nfs3::{
    self, createhow3, diropargs3, fattr3, filename3, ftype3, nfs_fh3, nfsstat3, sattr3, Nfs3Option,
    Nfs3Result,
};
use nfs3_client::nfs3_types::rpc::{auth_unix, opaque_auth};
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use nfs3_client::{Nfs3Connection, Nfs3ConnectionBuilder};

use super::{Handle, Kind, NfsUrl};

/// A TCP connection to the NFS server that fails instead of hanging: a closed
/// connection is an error (the RPC layer would read its 0 bytes again and again, forever),
/// and so is a server that does not take or answer a call within the timeout.
pub struct Guarded {
    stream: tokio::net::TcpStream,
    timeout: std::time::Duration,
    server: String,
}

impl Guarded {
    pub(super) fn timed_out(&self, what: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the NFS server {} did not {what} within {} s",
                self.server,
                self.timeout.as_secs()
            ),
        )
    }

    /// A connection the server reset or closed (whether the kernel saw a FIN or, with our
    /// call still unread there, a reset) is said so; other errors as they are.
    fn closed(&self, e: io::Error) -> io::Error {
        match e.kind() {
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => io::Error::new(
                e.kind(),
                format!("the NFS server {} closed the connection ({e})", self.server),
            ),
            _ => e,
        }
    }
}

impl nfs3_client::io::AsyncRead for Guarded {
    async fn async_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = tokio::io::AsyncReadExt::read(&mut self.stream, buf);
        let n = tokio::time::timeout(self.timeout, read)
            .await
            .map_err(|_| self.timed_out("answer"))?
            .map_err(|e| self.closed(e))?;
        if n == 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("the NFS server {} closed the connection", self.server),
            ));
        }
        Ok(n)
    }
}

impl nfs3_client::io::AsyncWrite for Guarded {
    async fn async_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let write = tokio::io::AsyncWriteExt::write(&mut self.stream, buf);
        let n = tokio::time::timeout(self.timeout, write)
            .await
            .map_err(|_| self.timed_out("take a call"))?
            .map_err(|e| self.closed(e))?;
        if n == 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("the NFS server {} closed the connection", self.server),
            ));
        }
        Ok(n)
    }
}

/// Makes [`Guarded`] connections (from a reserved port when asked, as the kernel client).
struct GuardedConnector {
    timeout: std::time::Duration,
}

impl GuardedConnector {
    async fn open(
        &self,
        addr: std::net::SocketAddr,
        local_port: Option<u16>,
    ) -> io::Result<Guarded> {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        if let Some(port) = local_port {
            let any: std::net::IpAddr = if addr.is_ipv4() {
                std::net::Ipv4Addr::UNSPECIFIED.into()
            } else {
                std::net::Ipv6Addr::UNSPECIFIED.into()
            };
            socket.bind(std::net::SocketAddr::new(any, port))?;
        }
        let stream = tokio::time::timeout(self.timeout, socket.connect(addr))
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no connection to {addr} within {} s",
                        self.timeout.as_secs()
                    ),
                )
            })??;
        Ok(Guarded {
            stream,
            timeout: self.timeout,
            server: addr.to_string(),
        })
    }
}

impl nfs3_client::net::Connector for GuardedConnector {
    type Connection = Guarded;

    async fn connect(&self, addr: std::net::SocketAddr) -> io::Result<Guarded> {
        self.open(addr, None).await
    }

    async fn connect_with_port(
        &self,
        addr: std::net::SocketAddr,
        local_port: u16,
    ) -> io::Result<Guarded> {
        self.open(addr, Some(local_port)).await
    }
}

type Conn = Nfs3Connection<Guarded>;

/// One NFSv3 client: its own runtime (one thread: the caller's) and connections.
pub struct NfsStore {
    rt: tokio::runtime::Runtime,
    conn: Conn,
    /// Directory handles by path (`/` is the export root), as the kernel's dentry cache.
    dirs: HashMap<PathBuf, nfs_fh3>,
    rtmax: usize,
    wtmax: usize,
}

/// nfsstat3 as errno (most are the same numbers; a few differ on Linux).
fn nfs_error(stat: nfsstat3) -> io::Error {
    let errno = match stat {
        nfsstat3::NFS3ERR_NAMETOOLONG => libc::ENAMETOOLONG,
        nfsstat3::NFS3ERR_NOTEMPTY => libc::ENOTEMPTY,
        nfsstat3::NFS3ERR_DQUOT => libc::EDQUOT,
        nfsstat3::NFS3ERR_STALE | nfsstat3::NFS3ERR_BADHANDLE => libc::ESTALE,
        nfsstat3::NFS3ERR_NOTSUPP => libc::EOPNOTSUPP,
        nfsstat3::NFS3ERR_JUKEBOX => libc::EAGAIN,
        s if (s as u32) < 100 => s as i32,
        _ => libc::EIO,
    };
    io::Error::from_raw_os_error(errno)
}

fn rpc_error(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("NFS RPC failed: {e}"))
}

fn name_of(p: &Path) -> io::Result<&[u8]> {
    use std::os::unix::ffi::OsStrExt;
    p.file_name()
        .map(|n| n.as_bytes())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))
}

fn attrs(a: Nfs3Option<fattr3>) -> Option<fattr3> {
    match a {
        Nfs3Option::Some(a) => Some(a),
        Nfs3Option::None => None,
    }
}

impl NfsStore {
    pub fn connect(url: &NfsUrl) -> Result<Self, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| format!("cannot start the NFS client: {e}"))?;
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&(url.host.as_str(), url.port))
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| format!("cannot resolve NFS server {:?}", url.host))?;
        let (uid, gid) = (crate::sys::geteuid(), crate::sys::getegid());
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "loadgen".into());
        let cred = opaque_auth::auth_unix(&auth_unix {
            stamp: std::process::id(),
            machinename: Opaque::owned(host.into_bytes()),
            uid,
            gid,
            gids: vec![],
        });
        let conn = rt
            .block_on(
                Nfs3ConnectionBuilder::new(
                    GuardedConnector {
                        timeout: url.timeout,
                    },
                    addr.ip().to_string(),
                    &url.export,
                )
                .portmapper_port(url.port)
                // As the kernel client: a reserved port when root may bind one.
                .connect_from_privileged_port(uid == 0)
                .credential(cred)
                .mount(),
            )
            .map_err(|e| {
                format!(
                    "cannot mount {} over NFSv3: {e}; check that the server exports it \
                     and that rpcbind answers on port {}",
                    url.to_url(),
                    url.port
                )
            })?;
        let mut s = Self {
            rt,
            dirs: HashMap::new(),
            rtmax: 64 * 1024,
            wtmax: 64 * 1024,
            conn,
        };
        let root = s.conn.root_nfs_fh3();
        let info =
            s.rt.block_on(s.conn.fsinfo(&nfs3::FSINFO3args {
                fsroot: root.clone(),
            }))
            .map_err(|e| format!("FSINFO on {} failed: {e}", url.to_url()))?;
        if let Nfs3Result::Ok(ok) = info {
            let pick = |pref: u32, max: u32| {
                let v = if pref > 0 { pref } else { max };
                (v as usize).clamp(4096, 1 << 20)
            };
            s.rtmax = pick(ok.rtpref, ok.rtmax);
            s.wtmax = pick(ok.wtpref, ok.wtmax);
        }
        s.dirs.insert(PathBuf::from("/"), root);
        Ok(s)
    }

    pub(super) fn lookup(
        &mut self,
        dir: &nfs_fh3,
        name: &[u8],
    ) -> io::Result<(nfs_fh3, Option<fattr3>)> {
        let args = nfs3::LOOKUP3args {
            what: diropargs3 {
                dir: dir.clone(),
                name: filename3(Opaque::borrowed(name)),
            },
        };
        match self
            .rt
            .block_on(self.conn.lookup(&args))
            .map_err(rpc_error)?
        {
            Nfs3Result::Ok(ok) => Ok((ok.object, attrs(ok.obj_attributes))),
            Nfs3Result::Err((stat, _)) => Err(nfs_error(stat)),
        }
    }

    /// The handle of directory `p`, from the cache or looked up component by component.
    pub(super) fn dir(&mut self, p: &Path) -> io::Result<nfs_fh3> {
        if let Some(fh) = self.dirs.get(p) {
            return Ok(fh.clone());
        }
        let mut cur = PathBuf::from("/");
        let mut fh = self.dirs.get(&cur).cloned().unwrap_or_default();
        for c in p.components() {
            let Component::Normal(name) = c else {
                continue;
            };
            cur.push(name);
            if let Some(known) = self.dirs.get(&cur) {
                fh = known.clone();
                continue;
            }
            use std::os::unix::ffi::OsStrExt;
            let (next, attr) = self.lookup(&fh, name.as_bytes())?;
            if attr.is_some_and(|a| a.type_ != ftype3::NF3DIR) {
                return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
            }
            self.dirs.insert(cur.clone(), next.clone());
            fh = next;
        }
        Ok(fh)
    }

    pub(super) fn parent(&mut self, p: &Path) -> io::Result<nfs_fh3> {
        self.dir(p.parent().unwrap_or(Path::new("/")))
    }

    pub(super) fn lookup_path(&mut self, p: &Path) -> io::Result<(nfs_fh3, Option<fattr3>)> {
        if p.file_name().is_none() {
            // The export root.
            let fh = self.dir(p)?;
            let attr = self.getattr(&fh)?;
            return Ok((fh, Some(attr)));
        }
        let dir = self.parent(p)?;
        self.lookup(&dir, name_of(p)?)
    }

    pub(super) fn mkdir(&mut self, p: &Path) -> io::Result<()> {
        let dir = self.parent(p)?;
        let args = nfs3::MKDIR3args {
            where_: diropargs3 {
                dir,
                name: filename3(Opaque::borrowed(name_of(p)?)),
            },
            attributes: sattr3 {
                mode: Nfs3Option::Some(0o755),
                ..Default::default()
            },
        };
        match self
            .rt
            .block_on(self.conn.mkdir(&args))
            .map_err(rpc_error)?
        {
            Nfs3Result::Ok(ok) => {
                if let Nfs3Option::Some(fh) = ok.obj {
                    self.dirs.insert(p.to_path_buf(), fh);
                }
                Ok(())
            }
            Nfs3Result::Err((stat, _)) => Err(nfs_error(stat)),
        }
    }

    pub(super) fn open_write(&mut self, p: &Path, append: bool) -> io::Result<Handle> {
        let dir = self.parent(p)?;
        let args = nfs3::CREATE3args {
            where_: diropargs3 {
                dir,
                name: filename3(Opaque::borrowed(name_of(p)?)),
            },
            how: createhow3::UNCHECKED(sattr3 {
                mode: Nfs3Option::Some(0o644),
                size: if append {
                    Nfs3Option::None
                } else {
                    Nfs3Option::Some(0)
                },
                ..Default::default()
            }),
        };
        let (fh, attr) = match self
            .rt
            .block_on(self.conn.create(&args))
            .map_err(rpc_error)?
        {
            Nfs3Result::Ok(ok) => match ok.obj {
                Nfs3Option::Some(fh) => (fh, attrs(ok.obj_attributes)),
                Nfs3Option::None => self.lookup_path(p)?,
            },
            Nfs3Result::Err((stat, _)) => return Err(nfs_error(stat)),
        };
        let offset = if append {
            match attr {
                Some(a) => a.size,
                None => self.getattr(&fh)?.size,
            }
        } else {
            0
        };
        Ok(Handle::Nfs {
            fh,
            offset,
            unstable: false,
            eof: false,
        })
    }

    pub(super) fn getattr(&mut self, fh: &nfs_fh3) -> io::Result<fattr3> {
        let args = nfs3::GETATTR3args { object: fh.clone() };
        match self
            .rt
            .block_on(self.conn.getattr(&args))
            .map_err(rpc_error)?
        {
            Nfs3Result::Ok(ok) => Ok(ok.obj_attributes),
            Nfs3Result::Err((stat, _)) => Err(nfs_error(stat)),
        }
    }

    pub(super) fn write(
        &mut self,
        fh: &nfs_fh3,
        mut offset: u64,
        mut buf: &[u8],
    ) -> io::Result<()> {
        while !buf.is_empty() {
            let n = buf.len().min(self.wtmax);
            let args = nfs3::WRITE3args {
                file: fh.clone(),
                offset,
                count: n as u32,
                stable: nfs3::stable_how::UNSTABLE,
                data: Opaque::borrowed(&buf[..n]),
            };
            let done = match self
                .rt
                .block_on(self.conn.write(&args))
                .map_err(rpc_error)?
            {
                Nfs3Result::Ok(ok) => ok.count as usize,
                Nfs3Result::Err((stat, _)) => return Err(nfs_error(stat)),
            };
            if done == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "the NFS server wrote nothing",
                ));
            }
            offset += done as u64;
            buf = &buf[done.min(n)..];
        }
        Ok(())
    }

    pub(super) fn commit(&mut self, fh: &nfs_fh3) -> io::Result<()> {
        let args = nfs3::COMMIT3args {
            file: fh.clone(),
            offset: 0,
            count: 0,
        };
        match self
            .rt
            .block_on(self.conn.commit(&args))
            .map_err(rpc_error)?
        {
            Nfs3Result::Ok(_) => Ok(()),
            Nfs3Result::Err((stat, _)) => Err(nfs_error(stat)),
        }
    }

    /// Reads at `offset`; the bytes read and whether they reach the end of the file.
    pub(super) fn read(
        &mut self,
        fh: &nfs_fh3,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<(usize, bool)> {
        let want = buf.len().min(self.rtmax);
        let args = nfs3::READ3args {
            file: fh.clone(),
            offset,
            count: want as u32,
        };
        match self.rt.block_on(self.conn.read(&args)).map_err(rpc_error)? {
            Nfs3Result::Ok(ok) => {
                let data = ok.data.as_ref();
                let n = data.len().min(want);
                buf[..n].copy_from_slice(&data[..n]);
                Ok((n, ok.eof || n == 0))
            }
            Nfs3Result::Err((stat, _)) => Err(nfs_error(stat)),
        }
    }

    pub(super) fn remove(&mut self, p: &Path, dir: bool) -> io::Result<()> {
        let parent = self.parent(p)?;
        let object = diropargs3 {
            dir: parent,
            name: filename3(Opaque::borrowed(name_of(p)?)),
        };
        let stat = if dir {
            match self
                .rt
                .block_on(self.conn.rmdir(&nfs3::RMDIR3args { object }))
                .map_err(rpc_error)?
            {
                Nfs3Result::Ok(_) => None,
                Nfs3Result::Err((stat, _)) => Some(stat),
            }
        } else {
            match self
                .rt
                .block_on(self.conn.remove(&nfs3::REMOVE3args { object }))
                .map_err(rpc_error)?
            {
                Nfs3Result::Ok(_) => None,
                Nfs3Result::Err((stat, _)) => Some(stat),
            }
        };
        match stat {
            None => {
                if dir {
                    self.dirs.retain(|k, _| !k.starts_with(p));
                }
                Ok(())
            }
            Some(s) => Err(nfs_error(s)),
        }
    }

    pub(super) fn set_size(&mut self, fh: &nfs_fh3, size: u64) -> io::Result<()> {
        let args = nfs3::SETATTR3args {
            object: fh.clone(),
            new_attributes: sattr3 {
                size: Nfs3Option::Some(size),
                ..Default::default()
            },
            guard: Nfs3Option::None,
        };
        match self
            .rt
            .block_on(self.conn.setattr(&args))
            .map_err(rpc_error)?
        {
            Nfs3Result::Ok(_) => Ok(()),
            Nfs3Result::Err((stat, _)) => Err(nfs_error(stat)),
        }
    }

    /// READDIRPLUS to the end (the types come with the names, as a kernel client's
    /// readdir gets them).
    pub(super) fn readdir(&mut self, p: &Path) -> io::Result<Vec<(String, Kind)>> {
        let fh = self.dir(p)?;
        let mut out = Vec::new();
        let mut cookie = 0;
        let mut verf = nfs3::cookieverf3::default();
        loop {
            let args = nfs3::READDIRPLUS3args {
                dir: fh.clone(),
                cookie,
                cookieverf: verf,
                dircount: 16 * 1024,
                maxcount: 64 * 1024,
            };
            let ok = match self
                .rt
                .block_on(self.conn.readdirplus(&args))
                .map_err(rpc_error)?
            {
                Nfs3Result::Ok(ok) => ok,
                Nfs3Result::Err((stat, _)) => return Err(nfs_error(stat)),
            };
            verf = ok.cookieverf;
            let entries = &ok.reply.entries.0;
            for e in entries {
                cookie = e.cookie;
                let name = e.name.0.as_ref();
                if matches!(name, b"." | b"..") {
                    continue;
                }
                let kind = match &e.name_attributes {
                    Nfs3Option::Some(a) => match a.type_ {
                        ftype3::NF3DIR => Kind::Dir,
                        ftype3::NF3REG => Kind::File,
                        _ => Kind::Other,
                    },
                    Nfs3Option::None => Kind::Other,
                };
                let name = String::from_utf8_lossy(name).into_owned();
                if kind == Kind::Dir {
                    if let Nfs3Option::Some(h) = &e.name_handle {
                        self.dirs.insert(p.join(&name), h.clone());
                    }
                }
                out.push((name, kind));
            }
            if ok.reply.eof || entries.is_empty() {
                return Ok(out);
            }
        }
    }

    pub(super) fn is_empty_dir(&mut self, p: &Path) -> io::Result<bool> {
        let fh = self.dir(p)?;
        let args = nfs3::READDIR3args {
            dir: fh,
            cookie: 0,
            cookieverf: nfs3::cookieverf3::default(),
            count: 4096,
        };
        match self
            .rt
            .block_on(self.conn.readdir(&args))
            .map_err(rpc_error)?
        {
            Nfs3Result::Ok(ok) => Ok(ok
                .reply
                .entries
                .0
                .iter()
                .all(|e| matches!(e.name.0.as_ref(), b"." | b".."))),
            Nfs3Result::Err((stat, _)) => Err(nfs_error(stat)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nfs_status_codes_map_to_linux_errno() {
        assert_eq!(
            nfs_error(nfsstat3::NFS3ERR_NOTEMPTY).raw_os_error(),
            Some(libc::ENOTEMPTY)
        );
        assert_eq!(
            nfs_error(nfsstat3::NFS3ERR_EXIST).kind(),
            io::ErrorKind::AlreadyExists
        );
        assert_eq!(
            nfs_error(nfsstat3::NFS3ERR_NOENT).kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            nfs_error(nfsstat3::NFS3ERR_NAMETOOLONG).raw_os_error(),
            Some(libc::ENAMETOOLONG)
        );
    }
}
