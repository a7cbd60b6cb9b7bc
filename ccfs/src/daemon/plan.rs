//! Planning a mount: the config, the home and cache paths, and the checks a cache directory
//! must pass.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, Settings};
use crate::control;
use crate::sync;
use crate::sys::{self, Account, DirFd};

use super::*;

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

pub(super) fn absolute(p: &Path) -> PathBuf {
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
            "fix the file: ccfs(1) (FILES) and the shipped /etc/ccfs/ccfs.toml describe every \
             key; `ccfs config check --config FILE` checks it",
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
    let user = user.map(account_to_mount_for).transpose()?;
    let owner = user
        .as_ref()
        .map(|u| u.uid)
        .unwrap_or_else(crate::sys::geteuid);
    let (config, settings) = effective_config(config)?;
    let share = checked_share(share)?;
    let mountpoint = checked_mountpoint(mountpoint, &share)?;
    let cache_dir = cache_dir
        .map(absolute)
        .unwrap_or_else(|| default_cache_dir(&mountpoint, owner));
    let cache_exists = checked_cache_dir(&cache_dir, &share, &mountpoint, owner)?;
    if cache_exists {
        cache_not_in_use(&cache_dir, user.as_ref())?;
    }
    let rsync = checked_tools(&settings, user.is_some())?;
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

/// The account `--user` names, for root only.
fn account_to_mount_for(name: &str) -> Result<Account, UserError> {
    if crate::sys::geteuid() != 0 {
        return Err(user_error(
            "--user needs root",
            "run the mount as root (as a PAM session hook does), or leave --user out",
        ));
    }
    crate::sys::user_by_name(name)
        .ok()
        .flatten()
        .ok_or_else(|| {
            user_error(
                format!("no such user: {}", LogText(name)),
                "give an existing login name",
            )
        })
}

/// The share directory, reachable, canonical.
fn checked_share(share: &Path) -> Result<PathBuf, UserError> {
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
    Ok(share)
}

/// The mountpoint: an empty directory, not mounted on, apart from the share.
fn checked_mountpoint(mountpoint: &Path, share: &Path) -> Result<PathBuf, UserError> {
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
    if mountpoint.starts_with(share) || share.starts_with(&mountpoint) {
        return Err(user_error(
            format!(
                "mountpoint {} and share {} overlap",
                LogPath(&mountpoint),
                LogPath(share)
            ),
            "mount somewhere outside the share (the share must stay reachable underneath)",
        ));
    }
    Ok(mountpoint)
}

/// Checks the cache directory's place (apart from the share and the mountpoint, on a
/// path its owner may use, writable); returns whether it exists already.
fn checked_cache_dir(
    cache_dir: &Path,
    share: &Path,
    mountpoint: &Path,
    owner: u32,
) -> Result<bool, UserError> {
    let cache_canon = canonical_prefix(cache_dir);
    if cache_canon.starts_with(share) {
        return Err(user_error(
            format!(
                "cache dir {} is inside the share {}",
                LogPath(cache_dir),
                LogPath(share)
            ),
            "put the cache on a local disk (default /var/tmp/ccfs)",
        ));
    }
    if share.starts_with(&cache_canon) || cache_canon.starts_with(mountpoint) {
        return Err(user_error(
            format!(
                "cache dir {} overlaps the share or the mountpoint",
                LogPath(cache_dir)
            ),
            "use a separate local directory for the cache",
        ));
    }
    check_cache_path(cache_dir, owner)?;
    // The mount table records the cache dir, so commands find the daemon without the mount.
    control::mount_source(cache_dir)?;
    let cache_exists = fs::symlink_metadata(cache_dir).is_ok();
    let mut probe = cache_dir;
    if !cache_exists {
        while !probe.exists() {
            match probe.parent() {
                Some(parent) => probe = parent,
                None => break,
            }
        }
    }
    if !sys::may_write(probe) {
        return Err(user_error(
            format!("cache dir {} is not writable", LogPath(probe)),
            "choose a --cache-dir this user can write, on a local disk",
        ));
    }
    Ok(cache_exists)
}

/// An existing cache directory no other ccfs mount holds. A daemon that died (killed,
/// crashed) holds its lock until its last thread has ended, a moment after its process
/// shows as gone: a login right after the crash waits for that (10 s at most), not for a
/// daemon that still runs.
fn cache_not_in_use(cache_dir: &Path, user: Option<&Account>) -> Result<(), UserError> {
    let ask = || {
        cache_in_use_as(cache_dir, user).map_err(|e| {
            user_error(
                format!(
                    "cannot tell whether cache dir {} is in use: {e}",
                    LogPath(cache_dir)
                ),
                "check the cache dir, or give another --cache-dir",
            )
        })
    };
    let mut in_use = ask()?;
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
                LogPath(cache_dir)
            ),
            "unmount that first, or give another --cache-dir",
        ));
    }
    Ok(())
}

/// rsync (its path), /dev/fuse and, where the mount is a user's, fusermount3.
fn checked_tools(settings: &Settings, for_a_user: bool) -> Result<PathBuf, UserError> {
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
    let needs_fusermount = crate::sys::geteuid() != 0 || for_a_user;
    if needs_fusermount && sync::find_program("fusermount3").is_none() {
        return Err(user_error(
            "fusermount3 is not installed",
            "install fuse3 (apt-get install fuse3)",
        ));
    }
    Ok(rsync)
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
}
