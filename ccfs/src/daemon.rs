//! Mounting: input checks (before anything changes), the daemon's life cycle, recovery.

use std::collections::{HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, Settings};
use crate::control::{self, Daemon, SyncOutcome};
use crate::fuse::CcfsFs;
use crate::locks::Locked;
use crate::overlay::Overlay;
use crate::sync::{self, RsyncOptions};
use crate::sys::{self, Account, DirFd};

pub use crate::control::{ccfs_mounts, is_ccfs_mount};
pub use crate::error::{user_error, LogPath, LogText, UserError};

/// The cache root of the config this command read (`[homes].cache_root`).
static CONFIGURED_CACHE_ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Where caches live unless `--cache-dir` says otherwise: `$CCFS_CACHE_ROOT`, else the
/// config's `[homes].cache_root` (default `/var/tmp/ccfs`).
pub fn cache_root() -> PathBuf {
    std::env::var_os("CCFS_CACHE_ROOT")
        .map(PathBuf::from)
        .or_else(|| CONFIGURED_CACHE_ROOT.get().cloned())
        .unwrap_or_else(|| PathBuf::from("/var/tmp/ccfs"))
}

/// The configuration a command works with: the file given, else
/// [`crate::config::SYSTEM_CONFIG`] when it exists, else the built-in defaults (no path).
/// Root reads only a file only root can change. Sets the cache root for this process.
pub fn effective_config(given: Option<&Path>) -> Result<(Option<PathBuf>, Settings), UserError> {
    let path = match given {
        Some(p) => Some(absolute(p)),
        None => {
            let system = Path::new(crate::config::SYSTEM_CONFIG);
            fs::symlink_metadata(system)
                .is_ok()
                .then(|| system.to_path_buf())
        }
    };
    let settings = match &path {
        Some(p) => load_config(p)?,
        None => Settings::default(),
    };
    let _ = CONFIGURED_CACHE_ROOT.set(settings.homes.cache_root.clone());
    Ok((path, settings))
}

/// True for a login name ccfs may turn into a path component: letters, digits, `.`, `_`,
/// `@` and `-`, not starting with `.` or `-`, at most 64 bytes.
pub fn valid_user_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['.', '-'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '@' | '-'))
}

/// A user's home on the share and where it is mounted, from `[homes]`.
pub fn home_paths(settings: &Settings, name: &str) -> Result<(PathBuf, PathBuf), UserError> {
    if !valid_user_name(name) {
        return Err(user_error(
            format!(
                "user name {:?} cannot name a home directory",
                LogText(name).to_string()
            ),
            "give a login name of letters, digits, '.', '_', '@' and '-'",
        ));
    }
    Ok((
        settings.homes.share_root.join(name),
        settings.homes.home_root.join(name),
    ))
}

/// Makes the mount point `home_root/NAME` for a mount root makes for a user, if it is
/// missing: root's, 0755, in a home root that must be root's and writable by nobody else
/// (or another user could put a symlink or their own mount there). An existing mount
/// point must be a directory, not a symlink.
pub fn make_mount_point(home_root: &Path, name: &str) -> Result<(), UserError> {
    let fix = "make the home root a directory of root's, not writable by others \
               (chown root: HOME_ROOT; chmod 755 HOME_ROOT), or set [homes].home_root";
    let root = DirFd::open(home_root).map_err(|e| {
        user_error(
            format!("home root {}: {e}", LogPath(home_root)),
            "create it, or set [homes].home_root in the config",
        )
    })?;
    let st = root
        .stat()
        .map_err(|e| user_error(format!("home root {}: {e}", LogPath(home_root)), fix))?;
    if st.uid() != 0 || st.mode() & 0o022 != 0 {
        return Err(user_error(
            format!(
                "home root {} belongs to uid {} with mode {:o}",
                LogPath(home_root),
                st.uid(),
                st.mode() & 0o7777
            ),
            fix,
        ));
    }
    let name = OsStr::new(name);
    let here = home_root.join(name);
    match root.entry(name) {
        Ok(Some(e)) if e.is_dir() => Ok(()),
        Ok(Some(_)) => Err(user_error(
            format!("{} is not a directory", LogPath(&here)),
            "remove it, so the home can be mounted there",
        )),
        Ok(None) => match root.mkdir(name, 0o755) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(user_error(
                format!("cannot create the mount point {}: {e}", LogPath(&here)),
                "check the home root",
            )),
        },
        Err(e) => Err(user_error(format!("{}: {e}", LogPath(&here)), fix)),
    }
}

/// The default cache directory of a mount point: `ROOT/UID/home-alice` for `/home/alice`.
/// ROOT is `/var/tmp/ccfs` (root-owned) when root mounts, `/var/tmp/ccfs-UID` for a user
/// mounting by themselves (so no user ever owns the shared root), or `$CCFS_CACHE_ROOT`.
pub fn default_cache_dir(mountpoint: &Path, uid: u32) -> PathBuf {
    let name: String = mountpoint
        .to_string_lossy()
        .trim_matches('/')
        .replace('/', "-");
    let name = if name.is_empty() {
        "root".to_string()
    } else {
        name
    };
    let root = if std::env::var_os("CCFS_CACHE_ROOT").is_none() && crate::sys::geteuid() != 0 {
        user_cache_root(Path::new("/var/tmp"), uid)
    } else {
        cache_root()
    };
    root.join(uid.to_string()).join(name)
}

/// The cache root of a user who mounts by themselves, in `base` (/var/tmp, which anyone
/// may write): `ccfs-UID` when it is free or theirs. Another user may have made that name
/// first (and it would be refused for good): then the first `ccfs-UID-*` that is theirs,
/// else a new name with a random part nobody can make before them.
pub fn user_cache_root(base: &Path, uid: u32) -> PathBuf {
    let usable = |p: &Path| match fs::symlink_metadata(p) {
        Err(e) => e.kind() == io::ErrorKind::NotFound,
        Ok(m) => m.is_dir() && m.uid() == uid && m.mode() & 0o022 == 0,
    };
    let plain = base.join(format!("ccfs-{uid}"));
    if usable(&plain) {
        return plain;
    }
    let prefix = format!("ccfs-{uid}-");
    let mut theirs: Vec<PathBuf> = fs::read_dir(base)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| e.path())
                .filter(|p| fs::symlink_metadata(p).is_ok() && usable(p))
                .collect()
        })
        .unwrap_or_default();
    theirs.sort();
    if let Some(p) = theirs.into_iter().next() {
        return p;
    }
    let mut bytes = [0u8; 8];
    let random = fs::File::open("/dev/urandom")
        .and_then(|mut f| io::Read::read_exact(&mut f, &mut bytes))
        .is_ok();
    let tag: String = if random {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    } else {
        format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        )
    };
    base.join(format!("{prefix}{tag}"))
}

/// Refuses a cache path another user could tamper with: the cache directory must not be a
/// symlink, must belong to `owner` and must not be writable by others; every existing
/// directory above it must belong to root or `owner` and not be writable by others
/// (unless sticky and root's, like /var/tmp), and a symlink above it is accepted only in
/// a directory nobody but root or `owner` can write (in /var/tmp anyone could have
/// planted it).
/// This is the early, friendly check; [`create_cache_dir`] enforces the same while it
/// walks the path.
pub fn check_cache_path(cache_dir: &Path, owner: u32) -> Result<(), UserError> {
    let shown = LogPath(cache_dir);
    if let Ok(m) = fs::symlink_metadata(cache_dir) {
        if m.file_type().is_symlink() {
            return Err(user_error(
                format!("cache dir {shown} is a symlink"),
                "remove it; ccfs creates its cache directory itself",
            ));
        }
        if !m.is_dir() {
            return Err(user_error(
                format!("cache dir {shown} is not a directory"),
                "remove it or choose another --cache-dir",
            ));
        }
        if m.uid() != owner {
            return Err(user_error(
                format!(
                    "cache dir {shown} belongs to uid {}, not to uid {owner}",
                    m.uid()
                ),
                "remove it (someone else may have planted it) or choose another --cache-dir",
            ));
        }
        if m.mode() & 0o022 != 0 {
            return Err(user_error(
                format!(
                    "cache dir {shown} is writable by other users (mode {:o})",
                    m.mode() & 0o7777
                ),
                "remove it or make it private (chmod 700)",
            ));
        }
    }
    let mut dir = cache_dir.parent();
    while let Some(d) = dir {
        let parent = d.parent();
        let is_symlink = fs::symlink_metadata(d).is_ok_and(|m| m.file_type().is_symlink());
        if is_symlink {
            let planted = parent
                .map(|p| {
                    fs::metadata(p).map_or(true, |m| {
                        (m.uid() != 0 && m.uid() != owner) || m.mode() & 0o022 != 0
                    })
                })
                .unwrap_or(false);
            if planted {
                return Err(user_error(
                    format!(
                        "{} above the cache dir is a symlink in a directory others can write",
                        LogPath(d)
                    ),
                    "remove it (someone may have planted it) or give the real path",
                ));
            }
        }
        if let Ok(m) = fs::metadata(d) {
            let shared_sticky = m.mode() & 0o1000 != 0 && m.uid() == 0;
            if m.mode() & 0o022 != 0 && !shared_sticky {
                return Err(user_error(
                    format!(
                        "{} above the cache dir is writable by other users",
                        LogPath(d)
                    ),
                    "put the cache below a directory only root or the user can write",
                ));
            }
            if m.uid() != 0 && m.uid() != owner {
                return Err(user_error(
                    format!(
                        "{} above the cache dir belongs to another user (uid {})",
                        LogPath(d),
                        m.uid()
                    ),
                    "put the cache below a directory of root or of the user",
                ));
            }
        }
        dir = parent;
    }
    Ok(())
}

/// What the cache directory remembers about its mount (for recovery).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheMeta {
    pub share: PathBuf,
    pub mountpoint: PathBuf,
    pub config: Option<PathBuf>,
}

/// A checked mount request.
#[derive(Debug, Clone)]
pub struct MountPlan {
    pub share: PathBuf,
    pub mountpoint: PathBuf,
    pub cache_dir: PathBuf,
    pub cache_exists: bool,
    pub config: Option<PathBuf>,
    pub settings: Settings,
    pub rsync: PathBuf,
    /// The user the mount runs as, when root starts it for someone (`--user`).
    pub user: Option<crate::sys::Account>,
    /// Who owns the cache: the user, or whoever runs ccfs.
    pub owner: u32,
}

pub use crate::journal::write_atomic;

/// The deepest existing ancestor of `p`, canonical, plus the rest.
fn canonical_prefix(p: &Path) -> PathBuf {
    let mut missing = Vec::new();
    let mut cur = p.to_path_buf();
    loop {
        if let Ok(c) = cur.canonicalize() {
            let mut out = c;
            for m in missing.iter().rev() {
                out.push(m);
            }
            return out;
        }
        match (cur.file_name().map(|n| n.to_os_string()), cur.parent()) {
            (Some(name), Some(parent)) => {
                missing.push(name);
                cur = parent.to_path_buf();
            }
            _ => return p.to_path_buf(),
        }
    }
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

/// The pid of the daemon holding a cache's lock (0 if it cannot be read), if one does.
/// The lock file is opened without following a symlink and only read if it is a regular
/// file: run it as the cache's owner when the cache is a user's (see
/// [`cache_in_use_as`]).
pub fn cache_owner(cache_dir: &Path) -> Option<u32> {
    let dir = DirFd::open(cache_dir).ok()?;
    let f = dir
        .open_file(OsStr::new("lock"), libc::O_RDONLY | libc::O_NONBLOCK, 0)
        .ok()?;
    if !sys::fstat(&f).is_ok_and(|st| st.is_file()) {
        return Some(0);
    }
    match sys::try_lock_exclusive(&f) {
        Ok(true) => None,
        _ => {
            let mut text = String::new();
            let _ = io::Read::read_to_string(&mut io::Read::take(&f, 64), &mut text);
            text.trim().parse().ok().or(Some(0))
        }
    }
}

/// [`cache_owner`], done by `user` in a child process when root asks about a user's
/// cache: root opens nothing in a directory the user controls. The child gets
/// [`sys::USER_CHILD_LIMIT`] to answer.
pub fn cache_in_use_as(cache_dir: &Path, user: Option<&Account>) -> io::Result<Option<u32>> {
    cache_in_use_within(cache_dir, user, Some(sys::USER_CHILD_LIMIT))
}

/// [`cache_in_use_as`], with the user's child given at most `limit` to answer.
pub fn cache_in_use_within(
    cache_dir: &Path,
    user: Option<&Account>,
    limit: Option<Duration>,
) -> io::Result<Option<u32>> {
    match user {
        Some(u) if sys::geteuid() == 0 && u.uid != 0 => {
            let answer = sys::run_as_user_within(u, limit, || {
                serde_json::to_vec(&cache_owner(cache_dir)).unwrap_or_default()
            })?;
            serde_json::from_slice(&answer).map_err(io::Error::other)
        }
        _ => Ok(cache_owner(cache_dir)),
    }
}

/// Loads a config file. Root reads only a file that only root can change (see
/// [`Settings::load_root_only`]), since it names the program every sync runs.
pub fn load_config(path: &Path) -> Result<Settings, UserError> {
    let loaded = if sys::geteuid() == 0 {
        Settings::load_root_only(path)
    } else {
        Settings::load(path)
    };
    loaded.map_err(|e| match e {
        ConfigError::NotRootOnly { .. } => user_error(
            LogText(&e.to_string()).to_string(),
            "make the file and every directory above it root's and not writable by others \
             (chown root, chmod go-w), or leave --config out",
        ),
        _ => user_error(
            LogText(&e.to_string()).to_string(),
            "fix the file (see `ccfs mount --help` for the format)",
        ),
    })
}

/// Checks a mount request. Changes nothing.
pub fn plan_mount(
    share: &Path,
    mountpoint: &Path,
    cache_dir: Option<&Path>,
    config: Option<&Path>,
    user: Option<&str>,
) -> Result<MountPlan, UserError> {
    let user = match user {
        None => None,
        Some(_) if crate::sys::geteuid() != 0 => {
            return Err(user_error(
                "--user needs root",
                "run the mount as root (as a PAM session hook does), or leave --user out",
            ))
        }
        Some(name) => Some(
            crate::sys::user_by_name(name)
                .ok()
                .flatten()
                .ok_or_else(|| {
                    user_error(
                        format!("no such user: {}", LogText(name)),
                        "give an existing login name",
                    )
                })?,
        ),
    };
    let owner = user
        .as_ref()
        .map(|u| u.uid)
        .unwrap_or_else(crate::sys::geteuid);
    let (config, settings) = effective_config(config)?;
    let share_meta = fs::metadata(share).map_err(|e| {
        user_error(
            format!("share {} is not reachable: {e}", LogPath(share)),
            "mount the network share first, or give the right path",
        )
    })?;
    if !share_meta.is_dir() {
        return Err(user_error(
            format!("share {} is not a directory", LogPath(share)),
            "give the directory of the user's home on the share",
        ));
    }
    let share = share
        .canonicalize()
        .map_err(|e| user_error(format!("share {}: {e}", LogPath(share)), "check the path"))?;
    let mp_meta = fs::metadata(mountpoint).map_err(|_| {
        user_error(
            format!("mountpoint {} does not exist", LogPath(mountpoint)),
            "create it first (mkdir)",
        )
    })?;
    if !mp_meta.is_dir() {
        return Err(user_error(
            format!("mountpoint {} is not a directory", LogPath(mountpoint)),
            "give an empty directory",
        ));
    }
    let mountpoint = mountpoint.canonicalize().map_err(|e| {
        user_error(
            format!("mountpoint {}: {e}", LogPath(mountpoint)),
            "check the path",
        )
    })?;
    if fsinfo::is_mount_point(&mountpoint).unwrap_or(false) {
        return Err(user_error(
            format!("{} is already mounted", LogPath(&mountpoint)),
            "unmount it first (`ccfs umount` or `fusermount3 -u`)",
        ));
    }
    let non_empty = fs::read_dir(&mountpoint)
        .map(|mut d| d.next().is_some())
        .unwrap_or(true);
    if non_empty {
        return Err(user_error(
            format!("mountpoint {} is not empty", LogPath(&mountpoint)),
            "use an empty directory, so no local files are hidden by the mount",
        ));
    }
    if mountpoint.starts_with(&share) || share.starts_with(&mountpoint) {
        return Err(user_error(
            format!(
                "mountpoint {} and share {} overlap",
                LogPath(&mountpoint),
                LogPath(&share)
            ),
            "mount somewhere outside the share (the share must stay reachable underneath)",
        ));
    }
    let cache_dir = cache_dir
        .map(absolute)
        .unwrap_or_else(|| default_cache_dir(&mountpoint, owner));
    let cache_canon = canonical_prefix(&cache_dir);
    if cache_canon.starts_with(&share) {
        return Err(user_error(
            format!(
                "cache dir {} is inside the share {}",
                LogPath(&cache_dir),
                LogPath(&share)
            ),
            "put the cache on a local disk (default /var/tmp/ccfs)",
        ));
    }
    if share.starts_with(&cache_canon) || cache_canon.starts_with(&mountpoint) {
        return Err(user_error(
            format!(
                "cache dir {} overlaps the share or the mountpoint",
                LogPath(&cache_dir)
            ),
            "use a separate local directory for the cache",
        ));
    }
    check_cache_path(&cache_dir, owner)?;
    // The mount table records the cache dir, so commands find the daemon without the mount.
    control::mount_source(&cache_dir)?;
    let cache_exists = fs::symlink_metadata(&cache_dir).is_ok();
    let probe = if cache_exists {
        cache_dir.clone()
    } else {
        let mut p = cache_dir.clone();
        while !p.exists() {
            match p.parent() {
                Some(parent) => p = parent.to_path_buf(),
                None => break,
            }
        }
        p
    };
    if !sys::may_write(&probe) {
        return Err(user_error(
            format!("cache dir {} is not writable", LogPath(&probe)),
            "choose a --cache-dir this user can write, on a local disk",
        ));
    }
    if cache_exists {
        let ask = || {
            cache_in_use_as(&cache_dir, user.as_ref()).map_err(|e| {
                user_error(
                    format!(
                        "cannot tell whether cache dir {} is in use: {e}",
                        LogPath(&cache_dir)
                    ),
                    "check the cache dir, or give another --cache-dir",
                )
            })
        };
        let mut in_use = ask()?;
        // A daemon that died (killed, crashed) holds its lock until its last thread has
        // ended, a moment after its process shows as gone: a login right after the crash
        // waits for that (10 s at most), not for a daemon that still runs.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while let Some(pid) = in_use {
            if pid == 0 || sys::process_alive(pid) || std::time::Instant::now() >= until {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
            in_use = ask()?;
        }
        if let Some(pid) = in_use {
            return Err(user_error(
                format!(
                    "cache dir {} is in use by another ccfs mount (pid {pid})",
                    LogPath(&cache_dir)
                ),
                "unmount that first, or give another --cache-dir",
            ));
        }
    }
    let rsync = sync::find_program(&settings.rsync).ok_or_else(|| {
        user_error(
            format!("rsync ({}) is not installed", settings.rsync),
            "install it (apt-get install rsync) or set [sync].rsync in the config",
        )
    })?;
    if !Path::new("/dev/fuse").exists() {
        return Err(user_error(
            "/dev/fuse is missing",
            "load the fuse module (modprobe fuse) or install fuse3",
        ));
    }
    // A user's mount is unmounted by fusermount3, also when root made it for them.
    let needs_fusermount = crate::sys::geteuid() != 0 || user.is_some();
    if needs_fusermount && sync::find_program("fusermount3").is_none() {
        return Err(user_error(
            "fusermount3 is not installed",
            "install fuse3 (apt-get install fuse3)",
        ));
    }
    Ok(MountPlan {
        share,
        mountpoint,
        cache_dir,
        cache_exists,
        config,
        settings,
        rsync,
        user,
        owner,
    })
}

/// How many symlinks a path may pass through (as the kernel's own limit).
const MAX_SYMLINKS: usize = 40;

fn io_other(msg: String) -> io::Error {
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

pub fn rsync_options(settings: &Settings, binary: &Path, share: &Path) -> RsyncOptions {
    RsyncOptions {
        binary: binary.to_path_buf(),
        extra_args: settings.rsync_extra_args.clone(),
        timeout: settings.rsync_timeout,
        caps: sync::probe_share(share),
        fsync: sync::rsync_has_fsync(binary),
        hold_fd: None,
        implied_dirs: false,
    }
}

/// Brings a cache up to date with the share after an earlier session ended without its
/// logout sync: sends exactly the work its journal records (with the same conflict checks as
/// a logout), and empties the cache once all of it is on the share. What the cache holds
/// beyond the journal is a clean copy and is never sent. Returns the outcome, or None when
/// the journal had no work.
///
/// A file still open for writing (a program of the crashed session may write it through
/// kernel passthrough, without a daemon) is not removed: it stays as unsynced work, and the
/// outcome names it (also when the journal had no work).
pub fn recover_overlay(overlay: &Overlay, rsync: &RsyncOptions) -> Option<SyncOutcome> {
    if !overlay.has_unsynced_work() {
        match overlay.drop_clean_cache(&Default::default()) {
            Ok(e) if !e.kept_open.is_empty() => {
                let (dirty, _, deletions) = overlay.pending();
                let report = sync::SyncReport {
                    kept_open: e.kept_open,
                    remaining_dirty: dirty,
                    remaining_deletions: deletions,
                    ok: true,
                    finished_at: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0),
                    ..Default::default()
                };
                return Some(SyncOutcome::from(Ok(report)));
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("cannot empty the clean cache: {e}"),
        }
        return None;
    }
    Some(SyncOutcome::from(sync::run_sync(
        overlay,
        rsync,
        sync::SyncMode::Recover,
    )))
}

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
/// the user), written at its head then.
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
fn open_daemon_log(cache_dir: &Path) {
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
fn report_ready() {
    notify_systemd("READY=1\nSTATUS=the mount is live");
    let stage = STAGE.load(Ordering::Acquire);
    if stage != STAGE_STARTING && stage != STAGE_LOG_OPEN {
        return;
    }
    sys::write_fd_lossy(1, format!("{READY_LINE}\n").as_bytes());
    let _ = sys::dup_onto(&io::stderr(), 1);
    STAGE.store(STAGE_READY, Ordering::Release);
}

// ---- the mount's life cycle ---------------------------------------------------------------

/// fuser's mount options in the kernel's terms, for a mount root makes itself (the same
/// defaults as fuser: nodev and nosuid unless asked otherwise; allow_other when the
/// session lets other users in).
fn kernel_mount(config: &fuser::Config) -> anyhow::Result<sys::FuseMount> {
    use fuser::MountOption as O;
    let (mut fsname, mut subtype) = (None, None);
    let (mut nodev, mut nosuid) = (true, true);
    let mut flags: u64 = 0;
    let mut options: Vec<String> = Vec::new();
    for o in &config.mount_options {
        match o {
            O::FSName(n) => fsname = Some(n.clone()),
            O::Subtype(s) => subtype = Some(s.clone()),
            O::CUSTOM(c) => options.push(c.clone()),
            O::DefaultPermissions => options.push("default_permissions".into()),
            O::AutoUnmount => {
                anyhow::bail!("auto_unmount needs fusermount3 to mount, not root itself")
            }
            O::Dev => nodev = false,
            O::NoDev => nodev = true,
            O::Suid => nosuid = false,
            O::NoSuid => nosuid = true,
            O::RO => flags |= libc::MS_RDONLY,
            O::RW => flags &= !libc::MS_RDONLY,
            O::Exec => flags &= !libc::MS_NOEXEC,
            O::NoExec => flags |= libc::MS_NOEXEC,
            O::Atime => flags &= !libc::MS_NOATIME,
            O::NoAtime => flags |= libc::MS_NOATIME,
            O::Sync => flags |= libc::MS_SYNCHRONOUS,
            O::Async => flags &= !libc::MS_SYNCHRONOUS,
            O::DirSync => flags |= libc::MS_DIRSYNC,
        }
    }
    if nodev {
        flags |= libc::MS_NODEV;
    }
    if nosuid {
        flags |= libc::MS_NOSUID;
    }
    if matches!(
        config.acl,
        fuser::SessionACL::All | fuser::SessionACL::RootAndOwner
    ) {
        options.push("allow_other".into());
    }
    let source = fsname
        .or_else(|| subtype.clone())
        .unwrap_or_else(|| "/dev/fuse".into());
    let fstype = subtype.map_or_else(|| "fuse".to_string(), |s| format!("fuse.{s}"));
    Ok(sys::FuseMount {
        source,
        fstype,
        flags,
        options: options.join(","),
    })
}

/// A mount root made for a user: the kernel records it as the user's (`user_id`), so the
/// user (the daemon, once it has dropped root) may unmount it with `fusermount3 -u`. Its
/// channel goes to the FUSE session; until the session has run to its end, dropping this
/// detaches the mount again (`fusermount3 -u -z`), so a failed start leaves no dead mount.
struct UserMount {
    channel: Option<std::os::fd::OwnedFd>,
    mountpoint: PathBuf,
    fusermount: PathBuf,
    attached: bool,
}

impl UserMount {
    fn mount(plan: &MountPlan, config: &fuser::Config, user: &Account) -> anyhow::Result<Self> {
        let fusermount = sync::find_program("fusermount3")
            .ok_or_else(|| user_error("fusermount3 is not installed", "install fuse3"))?;
        let mut m = kernel_mount(config)?;
        m.flags |= sys::restrictions_of(&plan.share).unwrap_or(0) & libc::MS_NOSYMFOLLOW;
        let channel = sys::mount_fuse(&plan.mountpoint, &m, user.uid, user.gid)
            .map_err(|e| anyhow::anyhow!("cannot mount {}: {e}", LogPath(&plan.mountpoint)))?;
        Ok(Self {
            channel: Some(channel),
            mountpoint: plan.mountpoint.clone(),
            fusermount,
            attached: true,
        })
    }

    /// Starts the broker that registers backing files for kernel passthrough (see
    /// [`sys::spawn_backing_broker`]) with a copy of this mount's FUSE channel.
    fn spawn_broker(&self, user: &Account) -> anyhow::Result<std::os::fd::OwnedFd> {
        let channel = self
            .channel
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("the FUSE channel was already taken"))?;
        Ok(sys::spawn_backing_broker(
            std::os::fd::AsFd::as_fd(channel),
            user,
        )?)
    }

    fn take_channel(&mut self) -> anyhow::Result<std::os::fd::OwnedFd> {
        self.channel
            .take()
            .ok_or_else(|| anyhow::anyhow!("the FUSE channel was already taken"))
    }

    /// `fusermount3 -u` (not lazy: a busy mount stays, as a root unmount would), run by
    /// the daemon as the user.
    fn unmount_command(&self) -> (PathBuf, PathBuf) {
        (self.fusermount.clone(), self.mountpoint.clone())
    }
}

impl Drop for UserMount {
    fn drop(&mut self) {
        drop(self.channel.take());
        if self.attached {
            let _ = std::process::Command::new(&self.fusermount)
                .args(["-u", "-z", "-q", "--"])
                .arg(&self.mountpoint)
                .output();
        }
    }
}

/// Unmounts a user's mount as the user (`fusermount3 -u`).
fn unmount_as_user(fusermount: &Path, mountpoint: &Path) -> io::Result<()> {
    let out = std::process::Command::new(fusermount)
        .args(["-u", "--"])
        .arg(mountpoint)
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(io_other(
        LogText(String::from_utf8_lossy(&out.stderr).trim()).to_string(),
    ))
}

/// Runs the mount in this process until it is unmounted; returns whether the final sync
/// put everything on the share. A cache directory this mount made is removed again if
/// the mount fails before it is live.
pub fn run_foreground(plan: &MountPlan) -> anyhow::Result<bool> {
    let mut live = false;
    let result = serve(plan, &mut live);
    if result.is_err() && !live && !plan.cache_exists {
        remove_new_cache(plan);
    }
    result
}

/// Removes a cache directory this mount made, as its owner (root asks the user to, in a
/// child process: the directory is the user's).
fn remove_new_cache(plan: &MountPlan) {
    let remove = || fs::remove_dir_all(&plan.cache_dir).map_err(|e| e.to_string());
    let removed = match &plan.user {
        Some(u) if sys::geteuid() == 0 => {
            sys::run_as_user(u, || serde_json::to_vec(&remove()).unwrap_or_default())
                .map_err(|e| e.to_string())
                .and_then(|answer| {
                    serde_json::from_slice::<Result<(), String>>(&answer)
                        .map_err(|e| e.to_string())?
                })
        }
        _ => remove(),
    };
    if let Err(e) = removed {
        tracing::warn!(
            "cannot remove the cache dir {} made for the failed mount: {}",
            LogPath(&plan.cache_dir),
            LogText(&e)
        );
    }
}

fn serve(plan: &MountPlan, live: &mut bool) -> anyhow::Result<bool> {
    let started_as_root = sys::geteuid() == 0;
    create_cache_dir(&plan.cache_dir, plan.owner).map_err(|e| {
        anyhow::anyhow!("cannot create cache dir {}: {e}", LogPath(&plan.cache_dir))
    })?;
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        // `ccfs:CACHE_DIR`: `ccfs status`, `sync` and `umount` find the control socket in
        // the mount table, without asking the mount (which may wait on a dead share).
        fuser::MountOption::FSName(control::mount_source(&plan.cache_dir)?),
        fuser::MountOption::Subtype("ccfs".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoDev,
        fuser::MountOption::NoSuid,
    ];
    // The share's own restrictions hold for the home too (else the home would be a way
    // around a noexec or read-only share); nosymfollow, which fuser cannot pass, is added
    // to a mount root makes itself (`UserMount`).
    let restrictions = sys::restrictions_of(&plan.share).unwrap_or(0);
    if restrictions & libc::MS_NOEXEC != 0 {
        config.mount_options.push(fuser::MountOption::NoExec);
    }
    if restrictions & libc::MS_RDONLY != 0 {
        config.mount_options.push(fuser::MountOption::RO);
    }
    if started_as_root && (plan.user.is_none() || plan.settings.allow_other) {
        // Root's own daemon (no --user: nobody else can stop it), or asked for ([mount]
        // allow_other): other local users get through to the kernel's permission checks
        // (default_permissions), which keep them out of what is not theirs; their programs
        // then wait on this daemon too.
        config.acl = fuser::SessionACL::All;
    }
    // A mount for a user lets only that user in (user_id=): the kernel refuses everyone
    // else, root included, before asking the daemon, so a daemon the user stops (it is
    // theirs) holds up none of their programs.
    config.n_threads = Some(plan.settings.threads);
    // A cloned channel opens /dev/fuse again, which a user may not (it is often 0600):
    // a mount that drops to a user shares one channel between its threads.
    config.clone_fd = plan.user.is_none();

    // Started by root for a user: root mounts first (for the user, who may then unmount
    // it), then drops root for good, before anything in the cache (the user's) is opened.
    // Everything after runs as the user, with the user's groups, and cannot become root
    // again: the share sees the user (NFS root_squash works) and the cache is theirs.
    let io = Arc::new(crate::backing::Passthrough::new(
        plan.settings.kernel_passthrough,
    ));
    let mut user_mount = match &plan.user {
        Some(u) if started_as_root => {
            let m = UserMount::mount(plan, &config, u)?;
            // Kernel passthrough needs CAP_SYS_ADMIN to register a backing file, which
            // the daemon gives up below: a broker keeps it, and nothing else.
            if plan.settings.kernel_passthrough {
                match m.spawn_broker(u) {
                    Ok(sock) => io.set_registrar(crate::backing::Registrar::Broker(
                        std::sync::Mutex::new(sock),
                    )),
                    Err(e) => io.disable(&format!("cannot start its broker: {e}")),
                }
            }
            sys::drop_privileges(u)
                .map_err(|e| anyhow::anyhow!("cannot become user {}: {e}", LogText(&u.name)))?;
            Some(m)
        }
        _ => None,
    };
    open_daemon_log(&plan.cache_dir);
    let _lock = lock_cache(&plan.cache_dir)?;
    let meta = CacheMeta {
        share: plan.share.clone(),
        mountpoint: plan.mountpoint.clone(),
        config: plan.config.clone(),
    };
    write_atomic(
        &plan.cache_dir.join("meta.json"),
        &serde_json::to_vec_pretty(&meta)?,
    )?;
    // Modes passed by the kernel are final: our own umask must not mask them again.
    sys::set_umask(0);

    let overlay = Arc::new(Overlay::new(
        &plan.share,
        &plan.cache_dir,
        plan.settings.policy.clone(),
    )?);
    overlay.requests.count_paths(plan.settings.count_paths);
    // A clean copy is checked against the share as often as the kernel asks about what
    // the cache holds.
    overlay.set_revalidate_after(plan.settings.cache_timeout);
    overlay.set_keep_copies(plan.settings.keep_copies);
    let mut rsync = rsync_options(&plan.settings, &plan.rsync, &plan.share);
    rsync.hold_fd = Some(std::os::fd::AsRawFd::as_raw_fd(&_lock));
    // What an earlier session left unsent is shown at once and sent once the mount is
    // live, in the background (a sync of this session): a login waits for no transfer,
    // however large (a mount that sent it first could not come up within a login's time,
    // and every login then fell back to the share without the user's changes). A cache
    // with nothing unsent is emptied of what it need not keep, as a recovery does.
    let earlier_work = overlay.has_unsynced_work();
    if !earlier_work {
        if let Some(kept) = recover_overlay(&overlay, &rsync).and_then(|o| o.report) {
            tracing::warn!(
                files = kept.kept_open.len(),
                "files of an earlier session are still open for writing; they stay in the cache as unsynced work"
            );
        }
    }

    let socket = plan.cache_dir.join("control.sock");
    if socket.as_os_str().len() >= 100 {
        anyhow::bail!(
            "cache dir path {} is too long for its control socket; use a shorter --cache-dir",
            LogPath(&plan.cache_dir)
        );
    }
    let daemon = Arc::new(Daemon::new(
        overlay.clone(),
        rsync,
        plan.share.clone(),
        plan.mountpoint.clone(),
        plan.cache_dir.clone(),
    )?);
    control::serve(daemon.clone(), &socket)?;
    let stop_periodic = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Some(every) = plan.settings.sync_interval {
        spawn_periodic_sync(daemon.clone(), every, stop_periodic.clone())?;
    }

    let timeouts = crate::fuse::Timeouts {
        share: plan.settings.attr_timeout,
        cache: plan.settings.cache_timeout,
        readdirplus: plan.settings.readdirplus,
    };
    let fs = CcfsFs::new(overlay.clone(), timeouts, io.clone());
    let node_table = fs.node_table();
    let mut session = match user_mount.as_mut() {
        Some(m) => fuser::Session::from_fd(fs, m.take_channel()?, config.acl, config.clone())?,
        None => fuser::Session::new(fs, &plan.mountpoint, &config)?,
    };
    daemon.set_kernel_view(crate::fuse::KernelView::new(node_table, session.notifier()));
    if user_mount.is_none() && plan.settings.kernel_passthrough {
        if sys::geteuid() == 0 {
            let dev = std::os::fd::AsFd::as_fd(&session).try_clone_to_owned()?;
            io.set_registrar(crate::backing::Registrar::Direct(dev));
        } else {
            io.disable("it needs a mount started by root");
        }
    }
    let mut unmounter = session.unmount_callable();
    let user_unmount = user_mount.as_ref().map(UserMount::unmount_command);
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])?;
    std::thread::Builder::new()
        .name("ccfs-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                tracing::info!(signal = sig, "unmounting on signal");
                let unmounted = match &user_unmount {
                    Some((fusermount, mountpoint)) => unmount_as_user(fusermount, mountpoint),
                    None => unmounter.unmount(),
                };
                if let Err(e) = unmounted {
                    tracing::warn!("unmount on signal failed: {e}");
                }
            }
        })?;
    tracing::info!(
        share = %LogPath(&plan.share),
        mountpoint = %LogPath(&plan.mountpoint),
        cache = %LogPath(&plan.cache_dir),
        "ccfs is mounted"
    );
    *live = true;
    report_ready();
    if earlier_work {
        let daemon = daemon.clone();
        std::thread::Builder::new()
            .name("ccfs-earlier-work".into())
            .spawn(move || {
                let outcome = daemon.sync_now(crate::sync::SyncMode::Session);
                if outcome.ok {
                    tracing::info!("sent the unsynced changes of an earlier session");
                } else {
                    tracing::warn!(
                        error = %LogText(outcome.error.as_deref().unwrap_or("changes left")),
                        "could not send all of an earlier session's changes; they stay in the cache and are shown"
                    );
                }
            })?;
    }
    // A session that ended with an error (a request the FUSE library could not read, a
    // failed read of the device) ends the mount all the same: what the cache holds is
    // synced as at any logout, not left for the next login's recovery.
    match session.run() {
        Ok(()) => {
            if let Some(m) = user_mount.as_mut() {
                // The session ended with the unmount: nothing is left to detach.
                m.attached = false;
            }
        }
        Err(e) => tracing::error!("the FUSE session ended with an error: {e}"),
    }
    stop_periodic.store(true, std::sync::atomic::Ordering::Release);
    tracing::info!("unmounted; syncing the cache to the share");
    // Does not start rsync when the share does not answer: the cache keeps everything.
    let outcome = daemon.sync_now(crate::sync::SyncMode::Logout);
    let ok = outcome.ok;
    daemon.set_final(outcome);
    daemon.drain_waiters(Duration::from_secs(5));
    let _ = fs::remove_file(&socket);
    Ok(ok)
}

/// Syncs every `every` while mounted, when there is something to send, so a crash loses
/// at most that much.
fn spawn_periodic_sync(
    daemon: Arc<Daemon>,
    every: Duration,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> io::Result<()> {
    std::thread::Builder::new()
        .name("ccfs-periodic-sync".into())
        .spawn(move || {
            let tick = Duration::from_millis(50).min(every);
            let mut waited = Duration::ZERO;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                std::thread::sleep(tick);
                waited += tick;
                if waited < every {
                    continue;
                }
                waited = Duration::ZERO;
                let clean = daemon.overlay.lock().state().is_clean();
                if !clean {
                    // Not started while the share does not answer (logged by the daemon).
                    let outcome = daemon.sync_now(crate::sync::SyncMode::Session);
                    tracing::info!(
                        ok = outcome.ok,
                        share_unreachable = outcome.share_unreachable.is_some(),
                        "periodic sync"
                    );
                }
            }
        })?;
    Ok(())
}

/// What recovering one cache came to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Recovered {
    /// Nothing was left unsynced.
    Nothing,
    /// What an earlier session left was synced (see the outcome).
    Synced(Box<SyncOutcome>),
    /// A running mount holds the cache (its pid, 0 if unknown): left alone.
    InUse(u32),
}

/// An error of work done in a child process as a user, carried back to root.
#[derive(Debug, Serialize, Deserialize)]
enum ChildError {
    User { problem: String, fix: String },
    Failure(String),
}

impl ChildError {
    fn from_anyhow(e: anyhow::Error) -> Self {
        match e.downcast::<UserError>() {
            Ok(u) => ChildError::User {
                problem: u.problem,
                fix: u.fix,
            },
            Err(e) => ChildError::Failure(format!("{e:#}")),
        }
    }

    fn into_anyhow(self) -> anyhow::Error {
        match self {
            ChildError::User { problem, fix } => user_error(problem, fix).into(),
            ChildError::Failure(m) => anyhow::anyhow!(m),
        }
    }
}

/// Recovers one cache directory (left alone if a mount holds it).
///
/// `settings` come from the `--config` of the command line. Root recovers a user's cache
/// in a child process that has become the cache's owner for good (and may not gain
/// privileges again) before anything in the cache is opened: root itself only looks at
/// who owns the directory. Root uses `settings` or the defaults, never the config a
/// cache's meta.json names (the user can write that file); a user recovering their own
/// cache may use the config their mount used.
///
/// `limit`: how long root waits for the child (None: as long as it takes); one that has
/// not answered by then is killed, as a crash would stop it (the journal keeps what is
/// left for the next recovery), and the error is an [`io::ErrorKind::TimedOut`].
pub fn recover_cache(
    cache_dir: &Path,
    settings: Option<&Settings>,
    patience: Duration,
    limit: Option<Duration>,
) -> anyhow::Result<Recovered> {
    let not_a_cache = || {
        user_error(
            format!("{} is not a ccfs cache directory", LogPath(cache_dir)),
            "give the --cache-dir of an earlier mount",
        )
    };
    let md = fs::symlink_metadata(cache_dir).map_err(|_| not_a_cache())?;
    if !md.is_dir() {
        return Err(not_a_cache().into());
    }
    let euid = sys::geteuid();
    // Root recovers every user's cache, as that user; a user only their own.
    let owner = if euid == 0 { md.uid() } else { euid };
    check_cache_path(cache_dir, owner)?;
    if euid != 0 {
        return recover_as_owner(cache_dir, settings, true, patience);
    }
    // Root works on each cache in a child process, its own caches too: whatever a cache
    // leads to (a share that hangs holds a thread for good) stays in that child, and the
    // next cache starts from a clean process.
    let account = sys::user_by_uid(owner)?.ok_or_else(|| {
        user_error(
            format!(
                "cache dir {} belongs to uid {owner}, which has no account",
                LogPath(cache_dir)
            ),
            "remove the cache or restore the account",
        )
    })?;
    let answer = sys::run_as_user_within(&account, limit, || {
        let r =
            recover_as_owner(cache_dir, settings, false, patience).map_err(ChildError::from_anyhow);
        serde_json::to_vec(&r).unwrap_or_default()
    })?;
    let r: Result<Recovered, ChildError> = serde_json::from_slice(&answer).map_err(|e| {
        anyhow::anyhow!(
            "the recovery as {} gave no readable answer: {e}",
            LogText(&account.name)
        )
    })?;
    r.map_err(ChildError::into_anyhow)
}

/// Reads CACHE/meta.json: never through a symlink, only a regular file, at most 1 MiB.
fn read_meta(cache_dir: &Path) -> Result<CacheMeta, UserError> {
    let not_a_cache = |why: String| {
        user_error(
            format!(
                "{} is not a ccfs cache (meta.json: {why})",
                LogPath(cache_dir)
            ),
            "give the --cache-dir of an earlier mount",
        )
    };
    let dir = DirFd::open(cache_dir).map_err(|e| not_a_cache(e.to_string()))?;
    let f = dir
        .open_file(
            OsStr::new("meta.json"),
            libc::O_RDONLY | libc::O_NONBLOCK,
            0,
        )
        .map_err(|e| not_a_cache(e.to_string()))?;
    if !sys::fstat(&f).is_ok_and(|st| st.is_file()) {
        return Err(not_a_cache("not a regular file".to_string()));
    }
    let mut text = Vec::new();
    io::Read::read_to_end(&mut io::Read::take(&f, 1 << 20), &mut text)
        .map_err(|e| not_a_cache(e.to_string()))?;
    serde_json::from_slice(&text).map_err(|e| not_a_cache(e.to_string()))
}

fn recover_as_owner(
    cache_dir: &Path,
    settings: Option<&Settings>,
    use_cache_config: bool,
    patience: Duration,
) -> anyhow::Result<Recovered> {
    // A lock held by processes of a dead daemon (its rsync finishing) is waited for below;
    // only a live owner (or a lock that names none) means a running mount.
    if let Some(pid) = cache_owner(cache_dir).filter(|&p| p == 0 || sys::process_alive(p)) {
        return Ok(Recovered::InUse(pid));
    }
    let meta = read_meta(cache_dir)?;
    let settings = match (settings, &meta.config) {
        (Some(s), _) => s.clone(),
        (None, Some(c)) if use_cache_config => Settings::load(c).map_err(|e| {
            user_error(
                LogText(&e.to_string()).to_string(),
                "fix the config file, or give one with --config",
            )
        })?,
        // The machine's config (as the cache's owner here), else the defaults.
        _ => effective_config(None)?.1,
    };
    let _lock = lock_for_recovery(cache_dir, patience)?;
    // A share that hangs (its server stopped, or one the cache's owner made hang) must not
    // hold up the recovery of every later cache: one look, waited for a bounded time.
    if let Err(why) = control::look_within(&meta.share, control::PROBE_TIMEOUT) {
        anyhow::bail!(user_error(
            format!(
                "share {} is not reachable: {}",
                LogPath(&meta.share),
                LogText(&why)
            ),
            "run `ccfs recover` again once the share is mounted and answers"
        ));
    }
    let rsync = sync::find_program(&settings.rsync).ok_or_else(|| {
        user_error(
            format!("rsync ({}) is not installed", LogText(&settings.rsync)),
            "install it (apt-get install rsync)",
        )
    })?;
    sys::set_umask(0);
    let overlay = Overlay::new(&meta.share, cache_dir, settings.policy.clone())?;
    overlay.set_keep_copies(settings.keep_copies);
    let mut opts = rsync_options(&settings, &rsync, &meta.share);
    opts.hold_fd = Some(std::os::fd::AsRawFd::as_raw_fd(&_lock));
    let outcome = recover_overlay(&overlay, &opts);
    if let Some(report) = outcome.as_ref().and_then(|o| o.report.as_ref()) {
        control::log_conflicts(cache_dir, &report.conflicts);
    }
    Ok(match outcome {
        None => Recovered::Nothing,
        Some(o) => Recovered::Synced(Box::new(o)),
    })
}

/// Every cache directory under the cache root (ROOT/UID/NAME with a meta.json).
pub fn all_caches() -> Vec<PathBuf> {
    list_caches(None)
}

/// `caches` (paths ROOT/UID/NAME, sorted) in turns, one cache of each owner's directory a
/// turn: the first cache of every user comes before anyone's second, so that one user
/// with many caches cannot take the recovery's whole time from the others.
pub fn in_turns(caches: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut index: HashMap<PathBuf, usize> = HashMap::new();
    let mut by_owner: Vec<VecDeque<PathBuf>> = Vec::new();
    for c in caches {
        let owner = c.parent().map(Path::to_path_buf).unwrap_or_default();
        let i = *index.entry(owner).or_insert_with(|| {
            by_owner.push(VecDeque::new());
            by_owner.len() - 1
        });
        by_owner[i].push_back(c);
    }
    let mut out = Vec::new();
    loop {
        let mut any = false;
        for q in by_owner.iter_mut() {
            if let Some(c) = q.pop_front() {
                out.push(c);
                any = true;
            }
        }
        if !any {
            return out;
        }
    }
}

/// The caches of one user: ROOT/UID/NAME where ROOT/UID is named for them and theirs.
pub fn user_caches(uid: u32) -> Vec<PathBuf> {
    list_caches(Some(uid))
}

/// Lists caches by name only (lstat; nothing in them is opened: a recovery does that, as
/// the owner).
fn list_caches(only: Option<u32>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(users) = fs::read_dir(cache_root()) else {
        return out;
    };
    for u in users.flatten() {
        let Ok(m) = fs::symlink_metadata(u.path()) else {
            continue;
        };
        if !m.is_dir() {
            continue;
        }
        if let Some(uid) = only {
            if m.uid() != uid || u.file_name() != OsStr::new(&uid.to_string()) {
                continue;
            }
        }
        if let Ok(caches) = fs::read_dir(u.path()) {
            for c in caches.flatten() {
                let is_cache = fs::symlink_metadata(c.path()).is_ok_and(|m| m.is_dir())
                    && fs::symlink_metadata(c.path().join("meta.json")).is_ok_and(|m| m.is_file());
                if is_cache {
                    out.push(c.path());
                }
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_users_cache_root_another_user_made_first_is_passed_over() {
        let base = tempfile::tempdir().expect("tmp");
        let (me, other) = (4242, 4343);
        let plain = base.path().join(format!("ccfs-{me}"));
        assert_eq!(
            user_cache_root(base.path(), me),
            plain,
            "free: the plain name"
        );
        fs::create_dir(&plain).expect("mkdir");
        std::os::unix::fs::chown(&plain, Some(me), Some(me)).expect("chown (root)");
        fs::set_permissions(&plain, fs::Permissions::from_mode(0o700)).expect("chmod");
        assert_eq!(
            user_cache_root(base.path(), me),
            plain,
            "ours: the plain name"
        );
        // Another user made it first, and a name of ours with a suffix too.
        std::os::unix::fs::chown(&plain, Some(other), Some(other)).expect("chown");
        let planted = base.path().join(format!("ccfs-{me}-0000"));
        fs::create_dir(&planted).expect("mkdir");
        std::os::unix::fs::chown(&planted, Some(other), Some(other)).expect("chown");
        let chosen = user_cache_root(base.path(), me);
        assert_ne!(chosen, plain);
        assert_ne!(chosen, planted);
        let name = chosen
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert!(name.starts_with(&format!("ccfs-{me}-")), "{name}");
        // Once made (by the mount), the same one is found again.
        fs::create_dir(&chosen).expect("mkdir");
        std::os::unix::fs::chown(&chosen, Some(me), Some(me)).expect("chown");
        fs::set_permissions(&chosen, fs::Permissions::from_mode(0o700)).expect("chmod");
        assert_eq!(user_cache_root(base.path(), me), chosen);
    }

    #[test]
    fn caches_are_taken_in_turns_one_of_each_owner_a_turn() {
        let p = |s: &str| PathBuf::from(s);
        let got = in_turns(vec![
            p("/c/1000/a"),
            p("/c/1000/b"),
            p("/c/1000/c"),
            p("/c/1001/a"),
            p("/c/1002/a"),
            p("/c/1002/b"),
        ]);
        assert_eq!(
            got,
            [
                "/c/1000/a",
                "/c/1001/a",
                "/c/1002/a",
                "/c/1000/b",
                "/c/1002/b",
                "/c/1000/c"
            ]
            .map(PathBuf::from)
        );
    }

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

    /// The mount root makes for a user carries the same options fuser would pass.
    #[test]
    fn kernel_mount_options_follow_fusers() {
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("ccfs".into()),
            fuser::MountOption::Subtype("ccfs".into()),
            fuser::MountOption::DefaultPermissions,
            fuser::MountOption::NoDev,
            fuser::MountOption::NoSuid,
        ];
        config.acl = fuser::SessionACL::All;
        let m = kernel_mount(&config).expect("valid");
        assert_eq!(m.source, "ccfs");
        assert_eq!(m.fstype, "fuse.ccfs");
        assert_eq!(m.flags, libc::MS_NODEV | libc::MS_NOSUID);
        assert_eq!(m.options, "default_permissions,allow_other");
        config.mount_options = vec![fuser::MountOption::Dev, fuser::MountOption::RO];
        config.acl = fuser::SessionACL::Owner;
        let m = kernel_mount(&config).expect("valid");
        assert_eq!(
            (m.source.as_str(), m.fstype.as_str()),
            ("/dev/fuse", "fuse")
        );
        assert_eq!(m.flags, libc::MS_NOSUID | libc::MS_RDONLY);
        assert_eq!(m.options, "");
        config.mount_options = vec![fuser::MountOption::AutoUnmount];
        assert!(kernel_mount(&config).is_err());
    }

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
