//! Finding a mount's daemon through the mount table: the mount's source names its cache
//! dir.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{user_error, UserError};

/// The prefix of a ccfs mount's source in the mount table; the cache directory follows.
pub(super) const SOURCE_PREFIX: &str = "ccfs:";

/// The mount source (FUSE `fsname`) that records `cache_dir` in the mount table:
/// `ccfs:/var/tmp/ccfs/1000/home-alice`. Refuses a path the mount table cannot carry
/// back unchanged: not absolute or not UTF-8, or with a comma (it separates mount
/// options), a backslash (fusermount3 takes it as an escape) or a control character.
pub fn mount_source(cache_dir: &Path) -> Result<String, UserError> {
    let refuse = |why: &str| {
        user_error(
            format!(
                "cache dir {} {why}, which the mount table cannot record",
                cache_dir.display()
            ),
            "choose a --cache-dir without commas, backslashes or control characters",
        )
    };
    let Some(text) = cache_dir.to_str() else {
        return Err(refuse("is not valid UTF-8"));
    };
    if !cache_dir.is_absolute() {
        return Err(refuse("is not absolute"));
    }
    if text.contains(',') {
        return Err(refuse("contains a comma"));
    }
    if text.contains('\\') {
        return Err(refuse("contains a backslash"));
    }
    if text.chars().any(char::is_control) {
        return Err(refuse("contains a control character"));
    }
    Ok(format!("{SOURCE_PREFIX}{text}"))
}

/// The cache directory a ccfs mount's source records (None for a source without one).
pub fn cache_dir_of_source(source: &str) -> Option<PathBuf> {
    let path = Path::new(source.strip_prefix(SOURCE_PREFIX)?);
    path.is_absolute().then(|| path.to_path_buf())
}

/// A ccfs mount from the mount table and where its daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountRef {
    pub mountpoint: PathBuf,
    pub cache_dir: PathBuf,
    pub socket: PathBuf,
    /// The mount's owner in the mount table (`user_id=`): who mounted; 0 when root
    /// mounted, also for a user (`--user`).
    pub mount_uid: u32,
    /// The owner of the cache directory: whom the daemon runs as.
    pub cache_uid: u32,
}

/// Every ccfs mount in this mount namespace, from the mount table (the mounts are not
/// touched). A mount point mounted over twice is listed once, for the top mount.
pub fn ccfs_mount_table() -> std::io::Result<Vec<fsinfo::MountEntry>> {
    let all = fsinfo::mounts()?;
    let mut out: Vec<fsinfo::MountEntry> = Vec::new();
    for m in all {
        if let Some(i) = out.iter().position(|o| o.mount_point == m.mount_point) {
            out.remove(i);
        }
        out.push(m);
    }
    out.retain(is_ccfs_mount);
    Ok(out)
}

pub(super) fn user_id_option(options: &str) -> Option<u32> {
    options
        .split(',')
        .find_map(|o| o.strip_prefix("user_id="))
        .and_then(|v| v.parse().ok())
}

/// Where the daemon of a mount-table entry listens, checked: the cache directory the
/// source names must be a real directory (not a symlink) that belongs to the mount's
/// owner (or, for a mount root made for a user, to anyone: the daemon runs as them).
/// Reads nothing through the mount.
pub fn mount_ref(entry: &fsinfo::MountEntry) -> Result<MountRef, String> {
    let mp = entry.mount_point.display();
    let cache_dir = cache_dir_of_source(&entry.source).ok_or_else(|| {
        format!(
            "{mp} is a ccfs mount whose mount table entry names no cache dir (source {:?}: made by an older ccfs)",
            entry.source
        )
    })?;
    let mount_uid = user_id_option(&entry.options)
        .ok_or_else(|| format!("{mp}: the mount table gives no owner (user_id) for it"))?;
    let meta = std::fs::symlink_metadata(&cache_dir)
        .map_err(|e| format!("{mp}: its cache dir {}: {e}", cache_dir.display()))?;
    if !meta.is_dir() {
        return Err(format!(
            "{mp}: its cache dir {} is not a directory",
            cache_dir.display()
        ));
    }
    if mount_uid != 0 && meta.uid() != mount_uid {
        return Err(format!(
            "{mp}: its cache dir {} belongs to uid {}, not to the mount's owner (uid {mount_uid})",
            cache_dir.display(),
            meta.uid()
        ));
    }
    let socket = cache_dir.join("control.sock");
    Ok(MountRef {
        mountpoint: entry.mount_point.clone(),
        cache_uid: meta.uid(),
        socket,
        cache_dir,
        mount_uid,
    })
}

/// The path the mount table uses for the mount point `p`, found without touching what is
/// mounted there: the parent is resolved, the last component only read as a link (a stat
/// of a mount point asks its filesystem, which hangs with a hung share behind it).
pub fn mount_point_path(p: &Path) -> std::io::Result<PathBuf> {
    let mut p = std::path::absolute(p)?;
    for _ in 0..40 {
        let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
            // "/" or a path ending in "..": nothing to guard, resolve it.
            return p.canonicalize();
        };
        let here = parent.canonicalize()?.join(name);
        match std::fs::read_link(&here) {
            Ok(target) => p = here.parent().unwrap_or(Path::new("/")).join(target),
            Err(_) => return Ok(here),
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::ELOOP))
}

/// The mount-table entry of the ccfs mount at `p` (None if there is none).
pub fn find_mount(p: &Path) -> std::io::Result<Option<fsinfo::MountEntry>> {
    let mp = mount_point_path(p)?;
    Ok(ccfs_mount_table()?
        .into_iter()
        .find(|m| m.mount_point == mp))
}

/// True for a mount-table entry made by ccfs (`fuse.ccfs`, or `fuse` with source `ccfs` or
/// `ccfs:CACHE_DIR` where the mount helper drops the subtype).
pub fn is_ccfs_mount(m: &fsinfo::MountEntry) -> bool {
    m.fs_type == "fuse.ccfs"
        || (m.fs_type.starts_with("fuse")
            && (m.source == "ccfs" || cache_dir_of_source(&m.source).is_some()))
}

/// The mount points of every ccfs mount in this mount namespace.
pub fn ccfs_mounts() -> std::io::Result<Vec<PathBuf>> {
    Ok(fsinfo::mounts()?
        .into_iter()
        .filter(is_ccfs_mount)
        .map(|m| m.mount_point)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache dir goes into the mount table as the mount's source and comes back
    /// unchanged through the kernel's octal escapes (a space is `\040` there).
    #[test]
    fn the_cache_dir_survives_the_mount_table() {
        let dir = Path::new("/var/tmp/ccfs/1000/home alice#1");
        let source = mount_source(dir).expect("carriable");
        assert_eq!(source, "ccfs:/var/tmp/ccfs/1000/home alice#1");
        let escaped = source.replace(' ', "\\040").replace('#', "\\043");
        let line = format!(
            "50 27 0:45 / /home/alice rw,nosuid,nodev,relatime - fuse {escaped} rw,user_id=0,group_id=0,default_permissions,allow_other\n"
        );
        let entries = fsinfo::parse_mountinfo(&line);
        assert_eq!(entries.len(), 1);
        assert!(is_ccfs_mount(&entries[0]));
        assert_eq!(
            cache_dir_of_source(&entries[0].source).as_deref(),
            Some(dir)
        );
        assert_eq!(user_id_option(&entries[0].options), Some(0));
    }

    #[test]
    fn cache_dirs_the_mount_table_cannot_carry_are_refused_with_the_fix() {
        use std::os::unix::ffi::OsStrExt;
        let bad: [(&Path, &str); 5] = [
            (Path::new("/var/tmp/a,b"), "comma"),
            (Path::new("/var/tmp/a\\b"), "backslash"),
            (Path::new("/var/tmp/a\nb"), "control character"),
            (Path::new("relative/cache"), "not absolute"),
            (
                Path::new(std::ffi::OsStr::from_bytes(b"/var/tmp/\xff")),
                "UTF-8",
            ),
        ];
        for (dir, why) in bad {
            let e = mount_source(dir).expect_err("refused");
            assert!(e.problem.contains(why), "{dir:?}: {e}");
            assert!(e.fix.contains("--cache-dir"), "{e}");
        }
        // Sources that name no cache dir: the plain "ccfs" of older mounts, a relative path.
        assert_eq!(cache_dir_of_source("ccfs"), None);
        assert_eq!(cache_dir_of_source("ccfs:relative"), None);
        assert_eq!(cache_dir_of_source("/dev/sda1"), None);
    }

    fn entry(source: &str, options: &str) -> fsinfo::MountEntry {
        fsinfo::MountEntry {
            mount_point: PathBuf::from("/home/alice"),
            fs_type: "fuse.ccfs".into(),
            source: source.into(),
            options: options.into(),
        }
    }

    /// A mount made by a user must name a cache dir of that user; a mount root made (for
    /// a user, with --user) may name anyone's, since the daemon runs as them.
    #[test]
    fn a_mount_naming_someone_elses_cache_is_refused() {
        let tmp = tempfile::tempdir().expect("tmp");
        let owner = std::fs::metadata(tmp.path()).expect("meta").uid();
        let source = mount_source(tmp.path()).expect("source");
        let by_owner = mount_ref(&entry(&source, &format!("rw,user_id={owner}"))).expect("ok");
        assert_eq!(by_owner.socket, tmp.path().join("control.sock"));
        assert_eq!((by_owner.mount_uid, by_owner.cache_uid), (owner, owner));
        assert!(mount_ref(&entry(&source, "rw,user_id=0")).is_ok());
        let other = owner.wrapping_add(4242).max(1);
        let e = mount_ref(&entry(&source, &format!("rw,user_id={other}"))).expect_err("refused");
        assert!(e.contains("not to the mount's owner"), "{e}");
        let e = mount_ref(&entry("ccfs", "rw,user_id=0")).expect_err("no cache dir");
        assert!(e.contains("names no cache dir"), "{e}");
        let e = mount_ref(&entry(&source, "rw")).expect_err("no owner");
        assert!(e.contains("user_id"), "{e}");
    }

    /// The last component of a mount point is only read as a link, never stat-ed; a
    /// symlink to the mount point leads to it.
    #[test]
    fn mount_point_paths_follow_links_and_parents() {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path().canonicalize().expect("canonical");
        let real = root.join("real");
        std::fs::create_dir(&real).expect("mkdir");
        std::os::unix::fs::symlink(&real, root.join("abs-link")).expect("symlink");
        std::os::unix::fs::symlink("real", root.join("rel-link")).expect("symlink");
        std::fs::create_dir(root.join("sub")).expect("mkdir");
        for p in [
            root.join("real"),
            root.join("real/"),
            root.join("real/."),
            root.join("abs-link"),
            root.join("rel-link"),
            root.join("sub/../real"),
        ] {
            assert_eq!(mount_point_path(&p).expect("resolved"), real, "{p:?}");
        }
        // A path that does not exist resolves lexically below its parent.
        assert_eq!(
            mount_point_path(&root.join("missing")).expect("resolved"),
            root.join("missing")
        );
    }
}
