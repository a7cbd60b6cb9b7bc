//! Small, dependency-free lookups about mounted filesystems: the mount table
//! (`/proc/self/mountinfo`) and the filesystem type of a path (`statfs`).

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
    pub options: String,
}

/// Decodes the octal escapes (`\040` for a space, ...) the kernel uses in mountinfo.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            if let Some(v) = std::str::from_utf8(&bytes[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses the text of a mountinfo file. Lines that do not parse are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    let mut entries = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        if left.len() < 6 || right.len() < 2 {
            continue;
        }
        entries.push(MountEntry {
            mount_point: PathBuf::from(unescape(left[4])),
            options: format!("{},{}", left[5], right.get(2).copied().unwrap_or("")),
            fs_type: right[0].to_string(),
            source: unescape(right[1]),
        });
    }
    entries
}

/// The current process's mount table.
pub fn mounts() -> io::Result<Vec<MountEntry>> {
    Ok(parse_mountinfo(&std::fs::read_to_string(
        "/proc/self/mountinfo",
    )?))
}

/// The mount entry that `path` lives on (the longest mount point that is a prefix of it).
/// `path` should be canonical.
pub fn mount_of(path: &Path) -> io::Result<Option<MountEntry>> {
    Ok(mounts()?
        .into_iter()
        .filter(|m| path.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.as_os_str().len()))
}

/// True when `path` (canonical) is itself a mount point.
pub fn is_mount_point(path: &Path) -> io::Result<bool> {
    Ok(mounts()?.iter().any(|m| m.mount_point == path))
}

/// The `statfs` of a path: type magic, block size, totals.
#[derive(Debug, Clone, Copy)]
pub struct FsStats {
    pub fs_type: i64,
    pub block_size: u64,
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_avail: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u64,
    pub fragment_size: u64,
}

pub fn statfs(path: &Path) -> io::Result<FsStats> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    // SAFETY: `c` is a valid NUL-terminated string and `buf` is a properly sized,
    // writable statfs structure that the kernel fills in.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut buf) };
    stats(rc, &buf)
}

/// [`statfs`] of the filesystem an open file is on.
pub fn fstatfs(file: &impl std::os::fd::AsRawFd) -> io::Result<FsStats> {
    // SAFETY: `buf` is a properly sized, writable statfs structure that the kernel fills
    // in; the descriptor is open.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut buf) };
    stats(rc, &buf)
}

fn stats(rc: libc::c_int, buf: &libc::statfs) -> io::Result<FsStats> {
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(FsStats {
        #[allow(clippy::unnecessary_cast)]
        fs_type: buf.f_type as i64,
        block_size: buf.f_bsize as u64,
        blocks: buf.f_blocks,
        blocks_free: buf.f_bfree,
        blocks_avail: buf.f_bavail,
        files: buf.f_files,
        files_free: buf.f_ffree,
        name_max: buf.f_namelen as u64,
        fragment_size: buf.f_frsize as u64,
    })
}

/// Whether a filesystem of this statfs type magic has nothing to do at a close(2) of a
/// file: a local disk or memory filesystem (ext2/3/4, XFS, Btrfs, tmpfs). A network
/// client (NFS writes out and commits what it holds at a close), a FUSE client (told of
/// every close; one that writes behind answers with a write that failed) or any other
/// has.
pub fn nothing_at_close(magic: i64) -> bool {
    matches!(magic, 0xEF53 | 0x0102_1994 | 0x5846_5342 | 0x9123_683E)
}

/// Whether a filesystem of this statfs type magic is a network filesystem or a FUSE one:
/// NFS, SMB/CIFS, CephFS's kernel client, 9P, AFS, Lustre, or any FUSE filesystem (sshfs,
/// GlusterFS's and MooseFS's clients, ccfs itself). Its files are a server's, and a close
/// may carry a server's error.
pub fn is_remote_or_fuse(magic: i64) -> bool {
    matches!(
        magic,
        0x6573_5546 // FUSE
            | 0x6969 // NFS
            | 0xFF53_4D42 // CIFS
            | 0xFE53_4D42 // SMB2
            | 0x517B // SMB
            | 0x00C3_6400 // Ceph
            | 0x0102_1997 // 9P
            | 0x5346_414F // AFS
            | 0x6B41_4653 // kAFS
            | 0x0BD0_0BD0 // Lustre
    )
}

/// A readable name for a statfs type magic.
pub fn fs_type_name(magic: i64) -> &'static str {
    match magic {
        0xEF53 => "ext4",
        0x0102_1994 => "tmpfs",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x6573_5546 => "fuse",
        0x6969 => "nfs",
        0x0000_00FF_534D_4242 => "cifs",
        0xFF53_4D42 => "cifs",
        0x00C3_6400 => "ceph",
        0x794C_7630 => "overlayfs",
        0x6165_6C6C => "gluster",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_lines_with_escapes_and_optional_fields() {
        let text = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n\
                    37 35 0:40 / /home/alice rw,nosuid,nodev - fuse.ccfs ccfs rw,user_id=0\n\
                    garbage line\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(m[0].fs_type, "ext3");
        assert_eq!(m[0].source, "/dev/root");
        assert!(m[0].options.contains("errors=continue"));
        assert_eq!(m[1].fs_type, "fuse.ccfs");
        assert_eq!(m[1].mount_point, PathBuf::from("/home/alice"));
    }

    #[test]
    fn network_and_fuse_filesystems_are_told_from_local_ones() {
        for remote in [0x6573_5546, 0x6969, 0xFF53_4D42, 0x00C3_6400] {
            assert!(is_remote_or_fuse(remote), "{remote:#x}");
            assert!(!nothing_at_close(remote), "{remote:#x}");
        }
        // ext4, tmpfs, XFS, Btrfs, ZFS, F2FS, bcachefs.
        for local in [
            0xEF53,
            0x0102_1994,
            0x5846_5342,
            0x9123_683E,
            0x2FC1_2FC1,
            0xF2F5_2010,
            0xCA45_1A4E,
        ] {
            assert!(!is_remote_or_fuse(local), "{local:#x}");
        }
        assert_eq!(fs_type_name(0x6573_5546), "fuse");
        let tmp = statfs(Path::new("/dev/shm")).expect("statfs /dev/shm");
        assert!(nothing_at_close(tmp.fs_type) && !is_remote_or_fuse(tmp.fs_type));
    }

    #[test]
    fn root_is_a_mount_point_and_statfs_answers() {
        assert!(is_mount_point(Path::new("/")).unwrap_or(false));
        let st = statfs(Path::new("/")).expect("statfs /");
        assert!(st.block_size > 0);
        assert!(mount_of(Path::new("/usr/bin"))
            .expect("mountinfo")
            .is_some());
    }
}
