//! Making and locking a cache directory, as its owner and without following planted links.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use crate::sys::{self, Account, DirFd};

use super::*;

/// How many symlinks a path may pass through (as the kernel's own limit).
const MAX_SYMLINKS: usize = 40;

pub(super) fn io_other(msg: String) -> io::Error {
    io::Error::other(msg)
}

/// Creates the cache directory (0700, owned by `owner`) and any missing parents: the
/// shared cache root and the directories above it root's and 0755, the others the
/// owner's and 0700.
///
/// The path is walked one directory at a time from `/`, each step opened relative to the
/// last without following a symlink, and every directory made is set up through its open
/// descriptor (mkdirat, openat `O_NOFOLLOW`, fstat, fchown, fchmod), so nobody can swap
/// a symlink in between. A symlink on the way is followed only where nobody but root can
/// write. Run by root, the walk does nothing itself below a directory that belongs to the
/// user: what lies there is made by the user, in a child process that has become the
/// user for good.
pub fn create_cache_dir(dir: &Path, owner: u32) -> io::Result<()> {
    let me = sys::geteuid();
    let shared_root = cache_root();
    let mut queue: VecDeque<OsString> = VecDeque::new();
    push_components(&mut queue, &absolute(dir))?;
    let mut cur = DirFd::open(Path::new("/"))?;
    let mut at = PathBuf::from("/");
    let mut symlinks = 0;
    while let Some(name) = queue.pop_front() {
        let here = cur.stat()?;
        if me == 0 && here.uid() != 0 {
            // A directory of the user: the rest is the user's to make.
            if here.uid() != owner {
                return Err(io_other(format!(
                    "{} belongs to uid {}, not to root or uid {owner}",
                    LogPath(&at),
                    here.uid()
                )));
            }
            queue.push_front(name);
            let rest: Vec<OsString> = queue.into_iter().collect();
            return make_as_user(&cur, &rest, owner);
        }
        let shared_sticky = here.mode() & 0o1000 != 0 && here.uid() == 0;
        if here.mode() & 0o022 != 0 && !shared_sticky {
            return Err(io_other(format!(
                "{} is writable by other users",
                LogPath(&at)
            )));
        }
        match cur.entry(&name)? {
            None => {
                match cur.mkdir(&name, 0o700) {
                    Ok(()) => {}
                    // Made meanwhile (two logins at once): checked below like any other.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
                let next = cur.open_dir(&name)?;
                at.push(&name);
                let st = next.stat()?;
                if st.uid() == me {
                    if me == 0 && shared_root.starts_with(&at) {
                        next.chmod(0o755)?;
                    } else {
                        if me == 0 && owner != 0 {
                            next.chown(owner, None)?;
                        }
                        next.chmod(0o700)?;
                    }
                }
                cur = next;
            }
            Some(st) if st.is_symlink() => {
                // Only a symlink nobody but root (or we ourselves) could have made is
                // followed; root never gets here in a user's directory (see above).
                if (here.uid() != 0 && here.uid() != me) || here.mode() & 0o022 != 0 {
                    return Err(io_other(format!(
                        "{} is a symlink in a directory others can write",
                        LogPath(&at.join(&name))
                    )));
                }
                symlinks += 1;
                if symlinks > MAX_SYMLINKS {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                let target = cur.readlink(&name)?;
                if target.is_absolute() {
                    cur = DirFd::open(Path::new("/"))?;
                    at = PathBuf::from("/");
                }
                let mut ahead = VecDeque::new();
                push_components(&mut ahead, &target)?;
                while let Some(c) = ahead.pop_back() {
                    queue.push_front(c);
                }
            }
            Some(st) if st.is_dir() => {
                cur = cur.open_dir(&name)?;
                at.push(&name);
            }
            Some(_) => return Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
        }
    }
    let st = cur.stat()?;
    if st.uid() != owner {
        return Err(io_other(format!(
            "cache dir {} belongs to uid {}, not to uid {owner}",
            LogPath(dir),
            st.uid()
        )));
    }
    // Through the descriptor of the very directory checked: no path is followed.
    cur.chmod(0o700)
}

/// Appends the components of `p` to `queue`; `..` is refused (a cache path has none).
fn push_components(queue: &mut VecDeque<OsString>, p: &Path) -> io::Result<()> {
    for c in p.components() {
        match c {
            Component::Normal(n) => queue.push_back(n.to_os_string()),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(io_other(format!(
                    "{} has a `..` component; give the path without it",
                    LogPath(p)
                )))
            }
        }
    }
    Ok(())
}

/// Makes `rest` below the user's directory `from` as the user (in a child process that
/// has become the user for good when root runs this): each directory 0700, never through
/// a symlink, and each must be the user's.
fn make_as_user(from: &DirFd, rest: &[OsString], owner: u32) -> io::Result<()> {
    let make = || -> Result<(), String> {
        let mut opened = None;
        for name in rest {
            let cur = opened.as_ref().unwrap_or(from);
            match cur.mkdir(name, 0o700) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("cannot create {}: {e}", LogPath(Path::new(name)))),
            }
            let next = cur
                .open_dir(name)
                .map_err(|e| format!("cannot open {}: {e}", LogPath(Path::new(name))))?;
            let st = next.stat().map_err(|e| e.to_string())?;
            if st.uid() != owner {
                return Err(format!(
                    "{} belongs to uid {}, not to uid {owner}",
                    LogPath(Path::new(name)),
                    st.uid()
                ));
            }
            opened = Some(next);
        }
        opened
            .as_ref()
            .unwrap_or(from)
            .chmod(0o700)
            .map_err(|e| e.to_string())
    };
    if sys::geteuid() != 0 || owner == 0 {
        return make().map_err(io_other);
    }
    let account = account_of(owner)?;
    let answer = sys::run_as_user(&account, || serde_json::to_vec(&make()).unwrap_or_default())?;
    let made: Result<(), String> = serde_json::from_slice(&answer).map_err(io::Error::other)?;
    made.map_err(io_other)
}

/// The account of a uid, or an error naming it.
fn account_of(uid: u32) -> io::Result<Account> {
    sys::user_by_uid(uid)?.ok_or_else(|| io_other(format!("uid {uid} has no account")))
}

/// Takes the cache's lock for the life of this process and writes our pid in it. The
/// lock file is opened without following a symlink and must be a regular file of ours.
pub fn lock_cache(dir: &Path) -> Result<File, UserError> {
    lock_cache_or_held(dir).map_err(|(e, _)| e)
}

/// [`lock_cache`], telling apart a lock another process holds (true) from a lock file that
/// cannot be used at all (false: nothing to wait for).
fn lock_cache_or_held(dir: &Path) -> Result<File, (UserError, bool)> {
    let path = dir.join("lock");
    let cannot = |why: String| {
        user_error(
            format!("cannot use {}: {why}", LogPath(&path)),
            "check the cache dir (remove what is there; ccfs makes its lock itself)",
        )
    };
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| (cannot(e.to_string()), false))?;
    let st = sys::fstat(&f).map_err(|e| (cannot(e.to_string()), false))?;
    if !st.is_file() || st.uid() != sys::geteuid() {
        return Err((
            cannot(format!(
                "not a regular file of uid {} (a file of uid {}, mode {:o})",
                sys::geteuid(),
                st.uid(),
                st.mode()
            )),
            false,
        ));
    }
    match sys::try_lock_exclusive(&f) {
        Ok(true) => {}
        held => {
            return Err((
                user_error(
                    format!(
                        "cache dir {} is in use by another ccfs process",
                        LogPath(dir)
                    ),
                    "wait for it to finish, or unmount the mount that uses it",
                ),
                held.is_ok(),
            ))
        }
    }
    let _ = f.set_len(0);
    let _ = writeln!(f, "{}", std::process::id());
    Ok(f)
}

/// The cache's lock for a recovery: when the daemon that held it is gone but processes it
/// started still hold it (an rsync of a killed daemon finishing its write), waits for them
/// (up to `patience`) rather than racing them on the share. A lock file that cannot be
/// used (a symlink, a directory: what a user may plant) is no reason to wait.
pub fn lock_for_recovery(dir: &Path, patience: Duration) -> Result<File, UserError> {
    let start = std::time::Instant::now();
    loop {
        match lock_cache_or_held(dir) {
            Ok(f) => return Ok(f),
            Err((e, held)) => {
                let daemon_alive =
                    cache_owner(dir).is_some_and(|pid| pid != 0 && crate::sys::process_alive(pid));
                if !held || daemon_alive || start.elapsed() >= patience {
                    return Err(e);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    /// A symlink planted in a directory anyone can write (like /var/tmp) is never
    /// followed when the cache directory is made: nothing appears where it points.
    #[test]
    fn a_lock_file_that_cannot_be_used_is_not_waited_for() {
        // With an hour of patience: a wait would hold the test up, not a second.
        for plant in ["symlink", "dir"] {
            let tmp = tempfile::tempdir().expect("tmp");
            let lock = tmp.path().join("lock");
            if plant == "symlink" {
                std::os::unix::fs::symlink("/nonexistent", &lock).expect("symlink");
            } else {
                fs::create_dir(&lock).expect("mkdir");
            }
            let e = lock_for_recovery(tmp.path(), Duration::from_secs(3600)).expect_err("refused");
            assert!(e.to_string().contains("cannot use"), "{plant}: {e}");
        }
    }

    #[test]
    fn cache_dir_creation_follows_no_planted_symlink() {
        let tmp = tempfile::tempdir().expect("tmp");
        let open = tmp.path().join("open");
        fs::create_dir(&open).expect("mkdir");
        fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).expect("chmod");
        let victim = tmp.path().join("victim");
        fs::create_dir(&victim).expect("mkdir");
        std::os::unix::fs::symlink(&victim, open.join("ccfs")).expect("symlink");
        let e = create_cache_dir(&open.join("ccfs/1000/name"), 1000).expect_err("planted");
        assert!(e.to_string().contains("symlink"), "{e}");
        assert_eq!(fs::read_dir(&victim).expect("ls").count(), 0);
        // A symlink in a directory only root can write is the admin's and is followed.
        let trusted = tmp.path().join("trusted");
        std::os::unix::fs::symlink(&victim, &trusted).expect("symlink");
        create_cache_dir(&trusted.join("c"), 0).expect("through root's symlink");
        let m = fs::symlink_metadata(victim.join("c")).expect("made");
        assert!(m.is_dir());
        assert_eq!(m.permissions().mode() & 0o777, 0o700);
    }

    /// Logins at once whose caches share a parent that does not exist yet: all are made,
    /// each private.
    #[test]
    fn caches_with_a_missing_common_parent_are_made_concurrently() {
        let tmp = tempfile::tempdir().expect("tmp");
        for round in 0..20 {
            let parent = tmp.path().join(format!("r{round}/cache"));
            let results: Vec<io::Result<()>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..4)
                    .map(|i| {
                        let d = parent.join(format!("user{i}"));
                        s.spawn(move || create_cache_dir(&d, crate::sys::geteuid()))
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err(io::Error::other("panic"))))
                    .collect()
            });
            for r in results {
                r.expect("every cache made");
            }
        }
        for i in 0..4 {
            let m = fs::metadata(tmp.path().join(format!("r0/cache/user{i}"))).expect("made");
            assert_eq!(m.permissions().mode() & 0o777, 0o700);
        }
    }
}
