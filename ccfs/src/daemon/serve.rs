//! The mount's life cycle: the kernel mount, serving FUSE, the periodic sync and the
//! logout.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::control::{self, Daemon};
use crate::fuse::CcfsFs;
use crate::overlay::Overlay;
use crate::sync;
use crate::sys::{self, Account};

use super::*;

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
    fn unmount_command(&self) -> (PathBuf, PathBuf, bool) {
        (self.fusermount.clone(), self.mountpoint.clone(), false)
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

/// Unmounts a user's mount as the user (`fusermount3 -u`, with `-z -q` when `lazy`),
/// started by `launcher` (a signal comes while the user's documents are open).
fn unmount_as_user(
    (fusermount, mountpoint, lazy): &(PathBuf, PathBuf, bool),
    launcher: Option<&sys::launcher::Launcher>,
) -> io::Result<()> {
    let how: &[&str] = if *lazy { &["-u", "-z", "-q"] } else { &["-u"] };
    let unmount = sys::launcher::Program::new(fusermount)
        .args(how)
        .args(["--".as_ref(), mountpoint.as_os_str()])
        .piped_output();
    let out = sys::launcher::spawn(launcher, &unmount)?.wait_with_output()?;
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
    let config = fuse_config(plan, started_as_root)?;

    // Started by root for a user: root mounts first (for the user, who may then unmount
    // it), then drops root for good, before anything in the cache (the user's) is opened.
    // Everything after runs as the user, with the user's groups, and cannot become root
    // again: the share sees the user (NFS root_squash works) and the cache is theirs.
    let io = Arc::new(crate::backing::Passthrough::new(
        plan.settings.kernel_passthrough,
    ));
    let mut user_mount = match &plan.user {
        Some(u) if started_as_root => Some(mount_for_user(plan, &config, u, &io)?),
        _ => None,
    };
    cache_on_a_local_disk(&plan.cache_dir)?;
    open_daemon_log(&plan.cache_dir);
    let _lock = take_cache(plan)?;
    // What the daemon runs (rsync, fusermount3) is started by a process forked now, before
    // any file of the share is open (see [`sys::launcher`]).
    let launcher = start_launcher()?;
    let (overlay, rsync, earlier_work) = open_overlay(plan, &_lock, &launcher)?;

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
    if let Some(rate) = plan.settings.by_block_fill_rate {
        spawn_block_fill(
            daemon.clone(),
            rate,
            plan.settings.by_block_fill_after,
            stop_periodic.clone(),
        )?;
    }

    let timeouts = crate::fuse::Timeouts {
        share: plan.settings.attr_timeout,
        cache: plan.settings.cache_timeout,
        readdirplus: plan.settings.readdirplus,
    };
    let fs = Arc::new(CcfsFs::new(overlay.clone(), timeouts, io.clone()));
    let node_table = fs.node_table();
    want_ring(plan, &fs, config.acl);
    let served = crate::fuse::Served(fs.clone());
    let mut session = match user_mount.as_mut() {
        Some(m) => fuser::Session::from_fd(served, m.take_channel()?, config.acl, config.clone())?,
        None => fuser::Session::new(served, &plan.mountpoint, &config)?,
    };
    daemon.set_kernel_view(crate::fuse::KernelView::new(node_table, session.notifier()));
    daemon.set_transport(fs.ring.clone());
    hand_device(
        plan,
        user_mount.is_none(),
        &io,
        &fs,
        std::os::fd::AsFd::as_fd(&session),
    )?;
    let unmounter = session.unmount_callable();
    let user_unmount = match user_mount.as_ref() {
        Some(m) => Some(m.unmount_command()),
        // A user's own mount: fusermount3 (lazily, as fuser would), started by the
        // launcher, not by fuser from the daemon itself.
        None if !started_as_root => {
            sync::find_program("fusermount3").map(|f| (f, plan.mountpoint.clone(), true))
        }
        None => None,
    };
    spawn_unmount_on_signal(unmounter, user_unmount, launcher)?;
    let (share, mountpoint) = (LogPath(&plan.share), LogPath(&plan.mountpoint));
    let cache = LogPath(&plan.cache_dir);
    tracing::info!(%share, %mountpoint, %cache, "ccfs is mounted");
    *live = true;
    report_ready();
    if earlier_work {
        spawn_earlier_work(daemon.clone())?;
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
    // Once every transport is done: handles whose RELEASE never came are let go.
    fs.end();
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

/// Takes the cache for this mount: its lock (returned), its record of the share and mount
/// point; and the umask the kernel's modes need.
fn take_cache(plan: &MountPlan) -> anyhow::Result<fs::File> {
    let lock = lock_cache(&plan.cache_dir)?;
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
    Ok(lock)
}

/// The daemon's launcher (see [`sys::launcher`]).
fn start_launcher() -> anyhow::Result<Arc<sys::launcher::Launcher>> {
    sys::launcher::Launcher::start()
        .map(Arc::new)
        .map_err(|e| anyhow::anyhow!("cannot start the daemon's launcher: {e}"))
}

/// Refuses a cache on a network or FUSE filesystem (the share's own among them): the
/// cache's files would count as the share's for no check, and a close the share's client
/// failed would go untold (see [`crate::overlay::Overlay::close_reaches_share`]). Any
/// other filesystem is a local disk (ext4, XFS, Btrfs, ZFS, F2FS, tmpfs, a container's
/// overlayfs). Asked before anything is written there (the directory is removed again: a
/// mount that made it).
fn cache_on_a_local_disk(cache_dir: &std::path::Path) -> anyhow::Result<()> {
    let dir = sys::DirFd::open(cache_dir)
        .map_err(|e| anyhow::anyhow!("cannot open the cache dir {}: {e}", LogPath(cache_dir)))?;
    let kind = fsinfo::fstatfs(&dir)
        .map_err(|e| anyhow::anyhow!("cannot ask what holds {}: {e}", LogPath(cache_dir)))?
        .fs_type;
    if !fsinfo::is_remote_or_fuse(kind) {
        return Ok(());
    }
    Err(user_error(
        format!(
            "cache dir {} is on a {} filesystem, not a local disk",
            LogPath(cache_dir),
            fsinfo::fs_type_name(kind)
        ),
        "put the cache on a local disk (default /var/tmp/ccfs)",
    )
    .into())
}

/// Hands the session's device to what needs its own: kernel passthrough's registrar (a
/// mount the daemon made itself, not one made for a user) and the ring (when INIT
/// offered it).
fn hand_device(
    plan: &MountPlan,
    mounted_itself: bool,
    io: &crate::backing::Passthrough,
    fs: &Arc<CcfsFs>,
    dev: std::os::fd::BorrowedFd<'_>,
) -> anyhow::Result<()> {
    if mounted_itself && plan.settings.kernel_passthrough {
        if sys::geteuid() == 0 {
            io.set_registrar(crate::backing::Registrar::Direct(dev.try_clone_to_owned()?));
        } else {
            io.disable("it needs a mount started by root");
        }
    }
    // The ring starts now that INIT is answered (fuser answers it before the session
    // is returned); requests wait for it meanwhile.
    if plan.settings.transport == crate::config::Transport::IoUring {
        fs.ring.start(fs, dev.try_clone_to_owned()?)?;
    }
    Ok(())
}

/// Asks for FUSE over io_uring when the plan's `[mount] transport` does, before the
/// session's INIT (see [`crate::fuse::RingSlot`]).
fn want_ring(plan: &MountPlan, fs: &CcfsFs, acl: fuser::SessionACL) {
    // The ring lets in whom fuser's session lets in: its owner (the uid it runs as now)
    // alone, unless the mount lets others in.
    fs.ring
        .admit_only((acl == fuser::SessionACL::Owner).then(sys::geteuid));
    if plan.settings.transport == crate::config::Transport::IoUring {
        // The kernel hands a request to the queue of the CPU it was made on, and a
        // queue's requests wait for that queue's threads only: each queue gets as many
        // threads as the mount has (two at least), so requests waiting on a slow share
        // hold up no more of a CPU's requests than they would hold up through /dev/fuse.
        if plan.user.is_some() {
            // The user may stop her own daemon, and a stopped daemon's ring entries are
            // still handed requests, which then wait unkillably (over /dev/fuse they wait
            // killably); such a request at the unmount holds root's unmount the same way.
            fs.ring.decline(
                "a mount for a user: her daemon, stopped, would hold root's unmount and \
                 others' programs unkillably; the ring serves mounts whose daemon runs as \
                 root"
                    .into(),
            );
        } else {
            fs.ring.want(plan.settings.threads.max(2));
        }
    }
}

/// Mounts for user `u` as root, starts the passthrough broker where it is used, then
/// drops root for good.
fn mount_for_user(
    plan: &MountPlan,
    config: &fuser::Config,
    u: &Account,
    io: &crate::backing::Passthrough,
) -> anyhow::Result<UserMount> {
    let m = UserMount::mount(plan, config, u)?;
    // Kernel passthrough needs CAP_SYS_ADMIN to register a backing file, which
    // the daemon gives up below: a broker keeps it, and nothing else.
    if plan.settings.kernel_passthrough {
        match m.spawn_broker(u) {
            Ok(sock) => io.set_registrar(crate::backing::Registrar::Broker(std::sync::Mutex::new(
                sock,
            ))),
            Err(e) => io.disable(&format!("cannot start its broker: {e}")),
        }
    }
    sys::drop_privileges(u)
        .map_err(|e| anyhow::anyhow!("cannot become user {}: {e}", LogText(&u.name)))?;
    Ok(m)
}

/// fuser's configuration for this plan's mount: its source names the cache dir, the
/// share's own restrictions hold for the home too, who may come in, the threads.
fn fuse_config(plan: &MountPlan, started_as_root: bool) -> anyhow::Result<fuser::Config> {
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
    Ok(config)
}

/// The overlay on the plan's share and cache, with the rsync options its syncs use
/// (holding the cache's `lock`), and whether an earlier session left work unsent.
fn open_overlay(
    plan: &MountPlan,
    lock: &fs::File,
    launcher: &Arc<sys::launcher::Launcher>,
) -> anyhow::Result<(Arc<Overlay>, crate::sync::RsyncOptions, bool)> {
    let overlay = Arc::new(Overlay::new(
        &plan.share,
        &plan.cache_dir,
        plan.settings.policy.clone(),
    )?);
    // Without the launcher, a program is started by the daemon itself only while it holds
    // no file of the share open (at the logout, every one is closed).
    let held = Arc::downgrade(&overlay);
    launcher.fallback_when(move || match held.upgrade().map(|o| o.share_files_open()) {
        Some(n) if n > 0 => Err(format!("{n} file(s) of the share are open")),
        _ => Ok(()),
    });
    overlay.requests.count_paths(plan.settings.count_paths);
    // A clean copy is checked against the share as often as the kernel asks about what
    // the cache holds.
    overlay.set_revalidate_after(plan.settings.cache_timeout);
    overlay.set_keep_copies(plan.settings.keep_copies);
    overlay.set_by_block_from(plan.settings.by_block_from);
    let mut rsync = rsync_options(
        &plan.settings,
        &plan.rsync,
        &plan.share,
        Some(launcher.clone()),
    );
    rsync.hold_fd = Some(std::os::fd::AsRawFd::as_raw_fd(lock));
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
    Ok((overlay, rsync, earlier_work))
}

/// Unmounts on SIGTERM, SIGINT and SIGHUP (as the user, through fusermount3, for a
/// mount root made for a user and a user's own): the session then ends and the logout
/// sync runs.
fn spawn_unmount_on_signal(
    mut unmounter: fuser::SessionUnmounter,
    user_unmount: Option<(PathBuf, PathBuf, bool)>,
    launcher: Arc<sys::launcher::Launcher>,
) -> anyhow::Result<()> {
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
                    Some(how) => unmount_as_user(how, Some(&launcher)),
                    None => unmounter.unmount(),
                };
                if let Err(e) = unmounted {
                    tracing::warn!("unmount on signal failed: {e}");
                }
            }
        })?;
    Ok(())
}

/// Sends what an earlier session left unsent, in the background once the mount is live.
fn spawn_earlier_work(daemon: Arc<Daemon>) -> anyhow::Result<()> {
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
    Ok(())
}

/// Gives the changed files held by block the blocks they lack, from their bases, at
/// `rate` bytes a second, once the daemon has served each for `after` (see
/// `overlay/fill.rs`), while mounted and never while a sync runs (the logout's included:
/// it waits for a tick under way, and the thread stops before the next).
fn spawn_block_fill(
    daemon: Arc<Daemon>,
    rate: u64,
    after: Duration,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> io::Result<()> {
    const TICK: Duration = Duration::from_millis(250);
    let per_tick = (rate / crate::extents::BLOCK / 4).max(1);
    let stopped = move || stop.load(std::sync::atomic::Ordering::Acquire);
    std::thread::Builder::new()
        .name("ccfs-block-fill".into())
        .spawn(move || {
            while !stopped() {
                std::thread::sleep(TICK);
                daemon.unless_syncing(|| {
                    if !stopped() {
                        daemon.overlay.fill_blocks(per_tick, after);
                    }
                });
            }
        })?;
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
