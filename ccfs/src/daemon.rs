//! Mounting: input checks (before anything changes), the daemon's life cycle, recovery.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::Settings;
use crate::control::{self, Daemon, SyncOutcome};
use crate::fuse::CcfsFs;
use crate::overlay::Overlay;
use crate::sync::{self, RsyncOptions};

/// A problem with what the user asked for: one line naming it and the fix. Exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{problem}; {fix}")]
pub struct UserError {
    pub problem: String,
    pub fix: String,
}

pub fn user_error(problem: impl Into<String>, fix: impl Into<String>) -> UserError {
    UserError {
        problem: problem.into(),
        fix: fix.into(),
    }
}

/// True for a mount-table entry made by ccfs (`fuse.ccfs`, or `fuse` with source `ccfs` or
/// `ccfs:CACHE_DIR` where the mount helper drops the subtype).
pub fn is_ccfs_mount(m: &fsinfo::MountEntry) -> bool {
    m.fs_type == "fuse.ccfs"
        || (m.fs_type.starts_with("fuse")
            && (m.source == "ccfs" || control::cache_dir_of_source(&m.source).is_some()))
}

/// The mount points of every ccfs mount in this mount namespace.
pub fn ccfs_mounts() -> std::io::Result<Vec<PathBuf>> {
    Ok(fsinfo::mounts()?
        .into_iter()
        .filter(is_ccfs_mount)
        .map(|m| m.mount_point)
        .collect())
}

/// Where caches live unless `--cache-dir` says otherwise.
pub fn cache_root() -> PathBuf {
    std::env::var_os("CCFS_CACHE_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/ccfs"))
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
        PathBuf::from(format!("/var/tmp/ccfs-{uid}"))
    } else {
        cache_root()
    };
    root.join(uid.to_string()).join(name)
}

/// Refuses a cache path another user could tamper with: the cache directory must not be a
/// symlink, must belong to `owner` and must not be writable by others; every existing
/// directory above it must belong to root or `owner` and not be writable by others
/// (unless sticky and root's, like /var/tmp).
pub fn check_cache_path(cache_dir: &Path, owner: u32) -> Result<(), UserError> {
    use std::os::unix::fs::MetadataExt;
    if let Ok(m) = fs::symlink_metadata(cache_dir) {
        if m.file_type().is_symlink() {
            return Err(user_error(
                format!("cache dir {} is a symlink", cache_dir.display()),
                "remove it; ccfs creates its cache directory itself",
            ));
        }
        if !m.is_dir() {
            return Err(user_error(
                format!("cache dir {} is not a directory", cache_dir.display()),
                "remove it or choose another --cache-dir",
            ));
        }
        if m.uid() != owner {
            return Err(user_error(
                format!(
                    "cache dir {} belongs to uid {}, not to uid {owner}",
                    cache_dir.display(),
                    m.uid()
                ),
                "remove it (someone else may have planted it) or choose another --cache-dir",
            ));
        }
        if m.mode() & 0o022 != 0 {
            return Err(user_error(
                format!(
                    "cache dir {} is writable by other users (mode {:o})",
                    cache_dir.display(),
                    m.mode() & 0o7777
                ),
                "remove it or make it private (chmod 700)",
            ));
        }
    }
    let mut dir = cache_dir.parent();
    while let Some(d) = dir {
        if let Ok(m) = fs::metadata(d) {
            let shared_sticky = m.mode() & 0o1000 != 0 && m.uid() == 0;
            if m.mode() & 0o022 != 0 && !shared_sticky {
                return Err(user_error(
                    format!(
                        "{} above the cache dir is writable by other users",
                        d.display()
                    ),
                    "put the cache below a directory only root or the user can write",
                ));
            }
            if m.uid() != 0 && m.uid() != owner {
                return Err(user_error(
                    format!(
                        "{} above the cache dir belongs to another user (uid {})",
                        d.display(),
                        m.uid()
                    ),
                    "put the cache below a directory of root or of the user",
                ));
            }
        }
        dir = d.parent();
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

fn writable(dir: &Path) -> bool {
    let c = match std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) {
        Ok(c) => c,
        Err(_) => return false,
    };
    // SAFETY: `c` is a valid NUL-terminated path; access only reads it.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// The pid of the daemon holding a cache's lock, if one does.
pub fn cache_owner(cache_dir: &Path) -> Option<u32> {
    let f = File::open(cache_dir.join("lock")).ok()?;
    match crate::sys::try_lock_exclusive(&f) {
        Ok(true) => None,
        _ => fs::read_to_string(cache_dir.join("lock"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .or(Some(0)),
    }
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
                        format!("no such user: {name}"),
                        "give an existing login name",
                    )
                })?,
        ),
    };
    let owner = user
        .as_ref()
        .map(|u| u.uid)
        .unwrap_or_else(crate::sys::geteuid);
    let settings = match config {
        Some(c) => Settings::load(c).map_err(|e| {
            user_error(
                e.to_string(),
                "fix the file (see `ccfs mount --help` for the format)",
            )
        })?,
        None => Settings::default(),
    };
    let share_meta = fs::metadata(share).map_err(|e| {
        user_error(
            format!("share {} is not reachable: {e}", share.display()),
            "mount the network share first, or give the right path",
        )
    })?;
    if !share_meta.is_dir() {
        return Err(user_error(
            format!("share {} is not a directory", share.display()),
            "give the directory of the user's home on the share",
        ));
    }
    let share = share
        .canonicalize()
        .map_err(|e| user_error(format!("share {}: {e}", share.display()), "check the path"))?;
    let mp_meta = fs::metadata(mountpoint).map_err(|_| {
        user_error(
            format!("mountpoint {} does not exist", mountpoint.display()),
            "create it first (mkdir)",
        )
    })?;
    if !mp_meta.is_dir() {
        return Err(user_error(
            format!("mountpoint {} is not a directory", mountpoint.display()),
            "give an empty directory",
        ));
    }
    let mountpoint = mountpoint.canonicalize().map_err(|e| {
        user_error(
            format!("mountpoint {}: {e}", mountpoint.display()),
            "check the path",
        )
    })?;
    if fsinfo::is_mount_point(&mountpoint).unwrap_or(false) {
        return Err(user_error(
            format!("{} is already mounted", mountpoint.display()),
            "unmount it first (`ccfs umount` or `fusermount3 -u`)",
        ));
    }
    let non_empty = fs::read_dir(&mountpoint)
        .map(|mut d| d.next().is_some())
        .unwrap_or(true);
    if non_empty {
        return Err(user_error(
            format!("mountpoint {} is not empty", mountpoint.display()),
            "use an empty directory, so no local files are hidden by the mount",
        ));
    }
    if mountpoint.starts_with(&share) || share.starts_with(&mountpoint) {
        return Err(user_error(
            format!(
                "mountpoint {} and share {} overlap",
                mountpoint.display(),
                share.display()
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
                cache_dir.display(),
                share.display()
            ),
            "put the cache on a local disk (default /var/tmp/ccfs)",
        ));
    }
    if share.starts_with(&cache_canon) || cache_canon.starts_with(&mountpoint) {
        return Err(user_error(
            format!(
                "cache dir {} overlaps the share or the mountpoint",
                cache_dir.display()
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
    if !writable(&probe) {
        return Err(user_error(
            format!("cache dir {} is not writable", probe.display()),
            "choose a --cache-dir this user can write, on a local disk",
        ));
    }
    if cache_exists {
        if let Some(pid) = cache_owner(&cache_dir) {
            return Err(user_error(
                format!(
                    "cache dir {} is in use by another ccfs mount (pid {pid})",
                    cache_dir.display()
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
    if crate::sys::geteuid() != 0 && sync::find_program("fusermount3").is_none() {
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
        config: config.map(absolute),
        settings,
        rsync,
        user,
        owner,
    })
}

/// Creates the cache directory (0700, owned by `owner`) and any missing parents: the shared
/// cache root root's and 0755, the others the owner's and 0700.
pub fn create_cache_dir(dir: &Path, owner: u32) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(d) = cur {
        if fs::symlink_metadata(d).is_ok() {
            break;
        }
        missing.push(d.to_path_buf());
        cur = d.parent();
    }
    let shared_root = cache_root();
    for d in missing.iter().rev() {
        match fs::create_dir(d) {
            Ok(()) => {}
            // A parent another mount made meanwhile (two logins at once): theirs to set up.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d != dir => continue,
            Err(e) => return Err(e),
        }
        let as_root = crate::sys::geteuid() == 0;
        if as_root && *d == shared_root {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755))?;
        } else {
            fs::set_permissions(d, fs::Permissions::from_mode(0o700))?;
            if as_root {
                std::os::unix::fs::chown(d, Some(owner), None)?;
            }
        }
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

/// Takes the cache's lock for the life of this process and writes our pid in it.
pub fn lock_cache(dir: &Path) -> Result<File, UserError> {
    let path = dir.join("lock");
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| {
            user_error(
                format!("cannot open {}: {e}", path.display()),
                "check the cache dir",
            )
        })?;
    match crate::sys::try_lock_exclusive(&f) {
        Ok(true) => {}
        _ => {
            return Err(user_error(
                format!(
                    "cache dir {} is in use by another ccfs process",
                    dir.display()
                ),
                "wait for it to finish, or unmount the mount that uses it",
            ))
        }
    }
    let _ = f.set_len(0);
    let _ = writeln!(f, "{}", std::process::id());
    Ok(f)
}

pub fn rsync_options(settings: &Settings, binary: &Path, share: &Path) -> RsyncOptions {
    RsyncOptions {
        binary: binary.to_path_buf(),
        extra_args: settings.rsync_extra_args.clone(),
        timeout: settings.rsync_timeout,
        caps: sync::probe_share(share),
        fsync: sync::rsync_has_fsync(binary),
    }
}

/// Brings a cache up to date with the share after an earlier session ended without its
/// logout sync. Returns the outcome, or None when there was nothing to do.
pub fn recover_overlay(overlay: &Overlay, rsync: &RsyncOptions) -> Option<SyncOutcome> {
    let needs = !overlay.lock().state().is_clean()
        || fs::read_dir(overlay.upper())
            .map(|d| {
                d.flatten().any(|e| {
                    overlay.policy().classify(Path::new(&e.file_name()))
                        != crate::policy::PathClass::LocalOnly
                })
            })
            .unwrap_or(false);
    if !needs {
        return None;
    }
    Some(SyncOutcome::from(sync::run_sync(overlay, rsync, true)))
}

/// Runs the mount in this process until it is unmounted; returns whether the final sync
/// put everything on the share.
pub fn run_foreground(plan: &MountPlan) -> anyhow::Result<bool> {
    let started_as_root = crate::sys::geteuid() == 0;
    create_cache_dir(&plan.cache_dir, plan.owner)?;
    // Started by root for a user: everything but the mount itself runs as that user, so
    // the share sees the user's uid and groups (NFS root_squash works) and the cache is
    // theirs.
    if let Some(u) = &plan.user {
        crate::sys::set_effective(u)
            .map_err(|e| anyhow::anyhow!("cannot switch to user {}: {e}", u.name))?;
    }
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
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0) };

    let overlay = Arc::new(Overlay::new(
        &plan.share,
        &plan.cache_dir,
        plan.settings.policy.clone(),
    )?);
    let rsync = rsync_options(&plan.settings, &plan.rsync, &plan.share);
    if let Some(outcome) = recover_overlay(&overlay, &rsync) {
        if outcome.ok {
            tracing::info!("recovered the unsynced changes of an earlier session");
        } else {
            tracing::warn!(
                error = outcome.error.as_deref().unwrap_or("deletions left"),
                "could not sync an earlier session's changes; they stay in the cache and are shown"
            );
        }
    }
    overlay.drop_clean_cache()?;

    let socket = plan.cache_dir.join("control.sock");
    if socket.as_os_str().len() >= 100 {
        anyhow::bail!(
            "cache dir path {} is too long for its control socket; use a shorter --cache-dir",
            plan.cache_dir.display()
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

    let fs = CcfsFs::new(overlay.clone(), plan.settings.attr_timeout)?;
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
    if started_as_root {
        // Other local users get through to the kernel's permission checks
        // (default_permissions), which then keep them out of what is not theirs.
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(plan.settings.threads);
    // A cloned channel opens /dev/fuse again, which a user may not (it is often 0600):
    // a mount that drops to a user shares one channel between its threads.
    config.clone_fd = plan.user.is_none();
    if plan.user.is_some() {
        crate::sys::restore_root()?;
    }
    let mut session = fuser::Session::new(fs, &plan.mountpoint, &config)?;
    if let Some(u) = &plan.user {
        crate::sys::become_user(u)?;
    }
    let mut unmounter = session.unmount_callable();
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
                // Only this thread needs root back, to unmount a mount root made.
                if crate::sys::geteuid() != 0 {
                    let _ = crate::sys::thread_regain_root();
                }
                if let Err(e) = unmounter.unmount() {
                    tracing::warn!("unmount on signal failed: {e}");
                }
            }
        })?;
    tracing::info!(
        share = %plan.share.display(),
        mountpoint = %plan.mountpoint.display(),
        cache = %plan.cache_dir.display(),
        "ccfs is mounted"
    );
    session.run()?;
    stop_periodic.store(true, std::sync::atomic::Ordering::Release);
    tracing::info!("unmounted; syncing the cache to the share");
    // Does not start rsync when the share does not answer: the cache keeps everything.
    let outcome = daemon.logout_sync();
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
                    let outcome = daemon.sync_now(false);
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

/// Recovers one cache directory (no daemon may hold it).
pub fn recover_cache(
    cache_dir: &Path,
    config: Option<&Path>,
) -> anyhow::Result<Option<SyncOutcome>> {
    let meta_path = cache_dir.join("meta.json");
    let meta: CacheMeta = serde_json::from_slice(&fs::read(&meta_path).map_err(|e| {
        user_error(
            format!(
                "{} is not a ccfs cache ({}: {e})",
                cache_dir.display(),
                meta_path.display()
            ),
            "give the --cache-dir of an earlier mount",
        )
    })?)?;
    let md = fs::symlink_metadata(cache_dir)?;
    let euid = crate::sys::geteuid();
    // Root recovers every user's cache, as that user; a user only their own.
    let owner = if euid == 0 { md.uid() } else { euid };
    check_cache_path(cache_dir, owner)?;
    let account = if euid == 0 && owner != 0 {
        let a = crate::sys::user_by_uid(owner)?.ok_or_else(|| {
            user_error(
                format!(
                    "cache dir {} belongs to uid {owner}, which has no account",
                    cache_dir.display()
                ),
                "remove the cache or restore the account",
            )
        })?;
        crate::sys::set_effective(&a)?;
        Some(a)
    } else {
        None
    };
    let result = recover_as_owner(cache_dir, config, &meta);
    if account.is_some() {
        crate::sys::restore_root()?;
    }
    result
}

fn recover_as_owner(
    cache_dir: &Path,
    config: Option<&Path>,
    meta: &CacheMeta,
) -> anyhow::Result<Option<SyncOutcome>> {
    let _lock = lock_cache(cache_dir)?;
    let config = config.map(Path::to_path_buf).or(meta.config.clone());
    let settings = match &config {
        Some(c) => {
            Settings::load(c).map_err(|e| user_error(e.to_string(), "fix the config file"))?
        }
        None => Settings::default(),
    };
    if !meta.share.is_dir() {
        anyhow::bail!(user_error(
            format!("share {} is not reachable", meta.share.display()),
            "run `ccfs recover` again once the share is mounted"
        ));
    }
    let rsync = sync::find_program(&settings.rsync).ok_or_else(|| {
        user_error(
            format!("rsync ({}) is not installed", settings.rsync),
            "install it (apt-get install rsync)",
        )
    })?;
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0) };
    let overlay = Overlay::new(&meta.share, cache_dir, settings.policy.clone())?;
    let opts = rsync_options(&settings, &rsync, &meta.share);
    let outcome = recover_overlay(&overlay, &opts);
    if let Some(report) = outcome.as_ref().and_then(|o| o.report.as_ref()) {
        control::log_conflicts(cache_dir, &report.conflicts);
    }
    if outcome.as_ref().is_none_or(|o| o.ok) {
        overlay.drop_clean_cache()?;
    }
    Ok(outcome)
}

/// Every cache directory under the cache root (ROOT/UID/NAME with a meta.json).
pub fn all_caches() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(users) = fs::read_dir(cache_root()) else {
        return out;
    };
    for u in users.flatten() {
        if let Ok(caches) = fs::read_dir(u.path()) {
            for c in caches.flatten() {
                if c.path().join("meta.json").is_file() {
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
