//! What root must check before it works in a place: whether another user could steer it
//! there (swap a directory for a symbolic link, plant a link where a result is written).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Whether `p` carries a POSIX ACL (access or default): its group bits are then only a
/// mask, and named users or groups may write there, or in what is made there.
fn has_acl(p: &Path) -> bool {
    ["system.posix_acl_access", "system.posix_acl_default"]
        .iter()
        .any(|name| crate::sys::has_xattr(p, name))
}

/// Run as root, whether a user other than root could change `dir` or a directory above
/// it: rename what loadgen makes there and put a symbolic link in its place, and so steer
/// where root creates, writes, deletes or mounts. Says which directory and what to do;
/// None when safe (not root, or every directory up to / only root can change: owned by
/// root, writable by a group other than root's or by others only with the sticky bit, as
/// /tmp, and no ACL). The check is of the resolved path: use [`resolved`]'s path for the
/// work, never the one given (a symbolic link in it could be swapped after the check).
pub fn unsafe_for_root(dir: &Path) -> Option<String> {
    if crate::sys::geteuid() != 0 {
        return None;
    }
    let mounts = fsinfo::mounts().unwrap_or_default();
    check_path(dir, &mounts, 0)
}

/// [`unsafe_for_root`] for one path; a symbolic link's target is checked as a path of its
/// own (`depth` links deep).
fn check_path(dir: &Path, mounts: &[fsinfo::MountEntry], depth: usize) -> Option<String> {
    if depth > 40 {
        return Some(format!(
            "{}: too many levels of symbolic links",
            dir.display()
        ));
    }
    let real = match std::fs::canonicalize(dir) {
        Ok(p) => p,
        Err(e) => return Some(format!("cannot resolve {}: {e}", dir.display())),
    };
    // The path as given, step by step (each step looked at without following its last
    // component): a symbolic link on the way must be root's, in a directory only root can
    // change (checked at the step before), and lead through such directories only (its
    // target checked the same way); every directory passed through must be only root's
    // to change. Then the resolved path, all the way up, and the filesystems it is on.
    let given = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        match std::env::current_dir() {
            Ok(d) => d.join(dir),
            Err(e) => return Some(format!("cannot resolve {}: {e}", dir.display())),
        }
    };
    let mut steps = Vec::new();
    let mut at = PathBuf::new();
    for c in given.components() {
        at.push(c);
        steps.push(at.clone());
    }
    for p in steps.iter().map(PathBuf::as_path).chain(real.ancestors()) {
        let m = match std::fs::symlink_metadata(p) {
            Ok(m) => m,
            Err(e) => return Some(format!("cannot look at {}: {e}", p.display())),
        };
        if m.file_type().is_symlink() {
            if m.uid() != 0 {
                return Some(format!(
                    "{} is a symbolic link of uid {}: run as root, loadgen would work where \
                     that user points it; give the directory itself",
                    p.display(),
                    m.uid()
                ));
            }
            let target = match std::fs::read_link(p) {
                Ok(t) => t,
                Err(e) => return Some(format!("cannot read the link {}: {e}", p.display())),
            };
            let target = match p.parent() {
                Some(up) if target.is_relative() => up.join(target),
                _ => target,
            };
            if let Some(why) = check_path(&target, mounts, depth + 1) {
                return Some(why);
            }
            continue;
        }
        let mode = m.mode();
        let sticky = mode & 0o1000 != 0;
        let others = mode & 0o002 != 0 || (mode & 0o020 != 0 && m.gid() != 0);
        let acl = has_acl(p);
        if m.uid() != 0 || (others && !sticky) || acl {
            return Some(format!(
                "{} can be changed by a user other than root (owner uid {}, mode {:o}{}): \
                 run as root, loadgen would work in a place that user could swap for a \
                 symbolic link; give a directory that only root can change, all the way up \
                 (owned by root, not writable by others unless sticky, as /tmp, no ACL), or \
                 run loadgen as that user",
                p.display(),
                m.uid(),
                mode & 0o7777,
                if acl { ", with an ACL" } else { "" }
            ));
        }
    }
    // A FUSE filesystem another user mounted answers whatever owner and mode that user
    // likes, and its entries change under root at that user's will.
    for m in mounts.iter().filter(|m| real.starts_with(&m.mount_point)) {
        let by = m
            .options
            .split(',')
            .find_map(|o| o.strip_prefix("user_id="))
            .and_then(|u| u.parse::<u32>().ok());
        if m.fs_type.starts_with("fuse") && by.is_some_and(|u| u != 0) {
            return Some(format!(
                "{} is on a FUSE filesystem that uid {} mounted at {}: its owners and \
                 modes are that user's to say; run as root only where root mounted",
                real.display(),
                by.unwrap_or(0),
                m.mount_point.display()
            ));
        }
    }
    None
}

/// Whether `p` is a real directory (not a symbolic link) owned by this user, as the ones
/// loadgen makes are: anyone can name a directory like them, or write a marker in it.
pub fn owned_by_me(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir() && m.uid() == crate::sys::geteuid())
}

/// Makes directory `dir` afresh (an existing name, a link among them, is an error), mode
/// 0700: root's scratch space, whose mounts no other user may enter.
pub fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    // (The umask can only take bits away.)
    std::fs::DirBuilder::new().mode(0o700).create(dir)
}

/// Makes the directories of `rel` below `base` one at a time, never through a symbolic
/// link: a name already there must be a directory of this user's that nobody else may
/// write in (as several hosts' agents of one storm make the same run directory on a
/// shared share); anything else is refused. Returns `base/rel`.
pub fn make_dirs_below(base: &Path, rel: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let mut at = base.to_path_buf();
    for c in rel.components() {
        let std::path::Component::Normal(name) = c else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{}: not a plain path below {}",
                    rel.display(),
                    base.display()
                ),
            ));
        };
        at.push(name);
        match std::fs::create_dir(&at) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let m = std::fs::symlink_metadata(&at)?;
        let shared = m.permissions().mode() & 0o022 != 0;
        if !m.file_type().is_dir() || !owned_by_me(&at) || shared {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "{} is there already and is not a directory of this user's that only it \
                     can change (someone else made it first?)",
                    at.display()
                ),
            ));
        }
    }
    Ok(at)
}

/// `dir` resolved (no symbolic link left in it): the path to work with once
/// [`unsafe_for_root`] has passed it.
pub fn resolved(dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::canonicalize(dir)
}

/// Writes `data` to `path` whole or not at all: into a new file of its own (created
/// exclusively, never through a link someone put there), then renamed over `path` (a
/// symbolic link at `path` is replaced, not followed). No other file is touched: a
/// `path.tmp` someone keeps stays.
pub fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    for n in 0..100u32 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let tmp = dir.join(format!(
            ".{name}.loadgen-{}-{nanos}-{n}",
            std::process::id()
        ));
        let mut f = match OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o644)
            .open(&tmp)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        let written = f.write_all(data).and_then(|()| f.sync_all());
        drop(f);
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!("cannot make a temporary file beside {}", path.display()),
    ))
}

#[cfg(test)]
mod tests {

    #[test]
    fn directories_are_made_one_name_at_a_time_and_never_through_a_link() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().expect("base");
        let made = make_dirs_below(base.path(), Path::new("a/b")).expect("made");
        assert!(made.is_dir() && made == base.path().join("a/b"));
        // Again: the names there are this user's own directories.
        make_dirs_below(base.path(), Path::new("a/b/c")).expect("again");
        // A link planted on the way is refused, and nothing is made through it.
        let elsewhere = tempfile::tempdir().expect("elsewhere");
        std::os::unix::fs::symlink(elsewhere.path(), base.path().join("l")).expect("link");
        assert!(make_dirs_below(base.path(), Path::new("l/x")).is_err());
        assert!(!elsewhere.path().join("x").exists());
        // A directory others may write in is refused.
        std::fs::create_dir(base.path().join("open")).expect("mkdir");
        std::fs::set_permissions(
            base.path().join("open"),
            std::fs::Permissions::from_mode(0o777),
        )
        .expect("chmod");
        assert!(make_dirs_below(base.path(), Path::new("open/y")).is_err());
        assert!(make_dirs_below(base.path(), Path::new("../up")).is_err());
    }

    use super::*;

    /// A path on a FUSE filesystem another user mounted is refused, whatever owners and
    /// modes it shows; one root mounted is not.
    #[test]
    fn a_fuse_mount_of_another_user_is_refused() {
        if crate::sys::geteuid() != 0 {
            return;
        }
        let d = std::fs::canonicalize(std::env::temp_dir()).expect("tmp");
        let mount = |user: u32| fsinfo::MountEntry {
            mount_point: d.clone(),
            fs_type: "fuse.bindfs".into(),
            source: "bindfs".into(),
            options: format!("rw,nosuid,nodev,rw,user_id={user},group_id={user}"),
        };
        assert_eq!(check_path(&d, &[mount(0)], 0), None);
        let why = check_path(&d, &[mount(1000)], 0).expect("refused");
        assert!(
            why.contains("FUSE filesystem that uid 1000 mounted"),
            "{why}"
        );
    }
}
