//! One run of the hook for a user: the first login recovers and mounts, later ones count
//! the session, the last logout syncs and unmounts; the fallback binds the share home.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::config::{Fallback, Settings};
use crate::daemon::{self, LogPath};
use crate::sys::{self, Account};

use super::*;

pub(super) struct Login<'a> {
    pub(super) hook: &'a Hook,
    pub(super) config: Option<PathBuf>,
    pub(super) settings: Settings,
    pub(super) account: Account,
    pub(super) home: PathBuf,
}

/// The mounts at a path, the lowest first.
pub(super) fn layers(p: &Path) -> Vec<fsinfo::MountEntry> {
    fsinfo::mounts()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.mount_point == p)
        .collect()
}

impl Login<'_> {
    pub(super) fn user(&self) -> &str {
        &self.hook.user
    }

    pub(super) fn ccfs_exe(&self) -> Result<PathBuf, String> {
        std::env::current_exe().map_err(|e| format!("cannot find the ccfs binary: {e}"))
    }

    /// `ccfs ARGS [--config C]`, in a child, within `limit`.
    pub(super) fn ccfs(&self, args: &[&str], limit: Duration) -> ChildRun {
        let exe = match self.ccfs_exe() {
            Ok(e) => e,
            Err(output) => {
                return ChildRun {
                    ok: Some(false),
                    output,
                }
            }
        };
        let all: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        run_limited(&exe, &self.with_config(all), limit)
    }

    /// `args` and, when the hook was given one, `--config FILE`: every ccfs the hook
    /// starts reads the same config.
    pub(super) fn with_config<'a>(&'a self, mut args: Vec<&'a OsStr>) -> Vec<&'a OsStr> {
        if let Some(c) = &self.config {
            args.push(OsStr::new("--config"));
            args.push(c.as_os_str());
        }
        args
    }

    /// The ccfs mount at the home, if it is one and names `cache` (any cache if None).
    /// The ccfs mount at the home (at any layer: a user may have stacked a mount on it)
    /// that names `cache`, or any ccfs mount there if None; the cache it names.
    pub(super) fn ccfs_mount_here(&self, cache: Option<&Path>) -> Option<PathBuf> {
        layers(&self.home)
            .iter()
            .rev()
            .filter(|m| daemon::is_ccfs_mount(m))
            .filter_map(|m| crate::control::cache_dir_of_source(&m.source))
            .find(|dir| cache.is_none_or(|c| c == dir))
    }

    /// Whether the bind mount of the login (layer `layer`) is still at the home.
    pub(super) fn bind_here(&self, layer: usize) -> bool {
        layer > 0
            && layers(&self.home)
                .get(layer - 1)
                .is_some_and(|m| !daemon::is_ccfs_mount(m))
    }

    /// Detaches what was mounted on the home above the login's own mount (layer `layer`),
    /// so the logout unmounts the login's mount and not something a user put on it.
    pub(super) fn detach_stacked(&self, layer: usize) {
        let mut detached = 0;
        for _ in 0..16 {
            if layer == 0 || layers(&self.home).len() <= layer {
                break;
            }
            let r = run_limited(
                Path::new("umount"),
                &[OsStr::new("-l"), self.home.as_os_str()],
                Duration::from_secs(10),
            );
            if r.ok != Some(true) {
                error(&format!(
                    "logout of {}: cannot detach a mount stacked on {}: {}",
                    self.user(),
                    LogPath(&self.home),
                    last_line(&r.output)
                ));
                break;
            }
            detached += 1;
        }
        if detached > 0 {
            info(&format!(
                "logout of {}: detached {detached} mount(s) stacked on {} after the login",
                self.user(),
                LogPath(&self.home)
            ));
        }
    }

    pub(super) fn open(&self, state: Option<UserState>, me: Entry) -> Option<UserState> {
        let user = self.user();
        if let Some(mut st) = state {
            st.prune(alive);
            let still = match st.mode {
                Mode::Ccfs | Mode::Foreign => {
                    self.ccfs_mount_here(st.cache_dir.as_deref()).is_some()
                }
                Mode::Bind => self.bind_here(st.layer),
                Mode::Nothing => false,
            };
            // What an earlier login mounted is still there (its sessions may all have
            // ended without a logout): this session uses it too.
            if still {
                st.sessions
                    .retain(|e| e.pid != me.pid || e.start != me.start);
                st.sessions.push(me);
                info(&format!(
                    "login of {user}: joins the {} open session(s); {} is already served",
                    st.sessions.len() - 1,
                    LogPath(&self.home)
                ));
                return Some(st);
            }
            if !st.sessions.is_empty() {
                info(&format!(
                    "login of {user}: {} open session(s), but their home {} is no longer mounted; mounting again",
                    st.sessions.len(),
                    LogPath(&self.home)
                ));
            }
            let mut fresh = self.first_open();
            fresh.sessions = st.sessions;
            fresh.sessions.push(me);
            return Some(fresh);
        }
        let mut fresh = self.first_open();
        fresh.sessions.push(me);
        Some(fresh)
    }

    /// The first session of the user on this host: recover, mount, or fall back.
    pub(super) fn first_open(&self) -> UserState {
        let user = self.user();
        let s = &self.settings.session;
        let started = Instant::now();
        let budget = Duration::from_secs(s.login_timeout_secs);
        let left = || budget.saturating_sub(started.elapsed());
        if let Some(dir) = self.ccfs_mount_here(None) {
            info(&format!(
                "login of {user}: {} is already a ccfs mount (cache {}): used as it is, not unmounted at logout",
                LogPath(&self.home),
                LogPath(&dir)
            ));
            return UserState {
                mode: Mode::Foreign,
                cache_dir: Some(dir),
                layer: 0,
                sessions: Vec::new(),
            };
        }
        self.wait_for_previous(Duration::from_secs(s.wait_previous_secs).min(left()));
        // A third of the login's time at most: the mount shows what is left unsent at
        // once and sends it in the background, so a large transfer need not hold the
        // login (it would then fall back to the share, without the user's changes).
        let r = self.ccfs(&["recover", "--user", user], left().min(budget / 3));
        match r.ok {
            Some(true) => {}
            Some(false) => error(&format!(
                "login of {user}: recovery of an earlier session did not finish: {}",
                last_line(&r.output)
            )),
            None => error(&format!(
                "login of {user}: recovery of an earlier session did not end within {} s; the login goes on",
                s.login_timeout_secs
            )),
        }
        let why = match self.mount(left()) {
            Ok(dir) => {
                info(&format!(
                    "login of {user}: {} mounted through ccfs (cache {})",
                    LogPath(&self.home),
                    LogPath(&dir)
                ));
                return UserState {
                    mode: Mode::Ccfs,
                    cache_dir: Some(dir),
                    layer: layers(&self.home).len(),
                    sessions: Vec::new(),
                };
            }
            Err(why) => why,
        };
        let mode = match s.fallback {
            Fallback::None => {
                error(&format!(
                    "login of {user}: ccfs could not mount {}: {why}; fallback \"none\": the home is left as it is",
                    LogPath(&self.home)
                ));
                Mode::Nothing
            }
            Fallback::Share => {
                let r = self.ccfs(&["bind-home", "--user", user], Duration::from_secs(20));
                if r.ok == Some(true) {
                    error(&format!(
                        "login of {user}: ccfs could not mount {}: {why}; fallback \"share\": the home on the share is bind-mounted there (no cache)",
                        LogPath(&self.home)
                    ));
                    Mode::Bind
                } else {
                    error(&format!(
                        "login of {user}: ccfs could not mount {}: {why}; fallback \"share\" failed too: {}",
                        LogPath(&self.home),
                        if r.ok.is_none() { "it did not end within 20 s".to_string() } else { last_line(&r.output) }
                    ));
                    Mode::Nothing
                }
            }
        };
        UserState {
            mode,
            cache_dir: None,
            layer: if mode == Mode::Bind {
                layers(&self.home).len()
            } else {
                0
            },
            sessions: Vec::new(),
        }
    }

    /// A daemon of the user's last session may still serve programs that had not let go
    /// of the home at logout (it was detached lazily): its cache is locked until they end.
    /// Waits for it (a user manager stopping after logout ends its programs), at most
    /// `limit`.
    pub(super) fn wait_for_previous(&self, limit: Duration) {
        let cache = daemon::default_cache_dir(&self.home, self.account.uid);
        // Asked as the user, in a child given a few seconds: the cache is the user's, and
        // what they put there (a mount that hangs) must not hold up the login.
        let held = || {
            daemon::cache_in_use_within(&cache, Some(&self.account), Some(Duration::from_secs(5)))
                .ok()
                .flatten()
                .filter(|&pid| pid != 0 && sys::process_alive(pid))
        };
        let Some(pid) = held() else { return };
        info(&format!(
            "login of {}: the daemon of their last session (pid {pid}) still serves programs of it; waiting up to {} s for them to end",
            self.user(),
            limit.as_secs()
        ));
        let until = Instant::now() + limit;
        while held().is_some() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `ccfs mount --user NAME` (in a scope of its own under systemd); the cache it uses.
    pub(super) fn mount(&self, limit: Duration) -> Result<PathBuf, String> {
        let user = self.user();
        if limit.is_zero() {
            return Err("no time left of [session].login_timeout_secs".into());
        }
        let exe = self.ccfs_exe()?;
        // ccfs mount gives up (and stops its daemon) a moment before this hook gives up on
        // it; the hook's own limit is for a mount stuck before it started one.
        let ready = limit
            .saturating_sub(Duration::from_secs(2))
            .max(Duration::from_secs(1));
        let ready = ready.as_secs().to_string();
        let args = self.with_config(vec![
            OsStr::new("mount"),
            OsStr::new("--timeout"),
            OsStr::new(&ready),
            OsStr::new("--user"),
            OsStr::new(user),
        ]);
        let scope = self.settings.session.systemd_scope
            && std::fs::symlink_metadata("/run/systemd/system").is_ok_and(|m| m.is_dir());
        let r = if scope {
            let scope_args = scope_args(user, self.account.uid);
            let mut all: Vec<&OsStr> = scope_args.iter().map(OsStr::new).collect();
            all.push(OsStr::new("--"));
            all.push(exe.as_os_str());
            all.extend(&args);
            let r = run_limited(Path::new("systemd-run"), &all, limit);
            if r.ok == Some(false) && r.output.contains("transient") {
                error(&format!(
                    "login of {user}: systemd-run could not make a scope ({}); mounting without one",
                    last_line(&r.output)
                ));
                run_limited(&exe, &args, limit)
            } else {
                r
            }
        } else {
            run_limited(&exe, &args, limit)
        };
        match r.ok {
            Some(true) => self
                .ccfs_mount_here(None)
                .ok_or_else(|| "ccfs mount said it mounted, but no ccfs mount is there".into()),
            Some(false) => Err(last_line(&r.output)),
            None => {
                if self.ccfs_mount_here(None).is_some() {
                    let _ = run_limited(
                        Path::new("fusermount3"),
                        &[OsStr::new("-u"), OsStr::new("-z"), self.home.as_os_str()],
                        Duration::from_secs(10),
                    );
                }
                Err(format!(
                    "the mount did not come up within {} s",
                    limit.as_secs()
                ))
            }
        }
    }

    /// The user's last session on this host ended: sync and unmount what the first one
    /// mounted.
    pub(super) fn last_close(&self, st: &UserState) {
        let user = self.user();
        let s = &self.settings.session;
        match st.mode {
            Mode::Nothing => info(&format!("logout of {user}: nothing was mounted")),
            Mode::Foreign => info(&format!(
                "logout of {user}: {} was mounted before their first session; left mounted",
                LogPath(&self.home)
            )),
            Mode::Ccfs => {
                if self.ccfs_mount_here(st.cache_dir.as_deref()).is_none() {
                    error(&format!(
                        "logout of {user}: {} is no longer the ccfs mount of their login; nothing unmounted (`ccfs recover` sends what a lost mount kept)",
                        LogPath(&self.home)
                    ));
                    return;
                }
                self.detach_stacked(st.layer);
                let home = self.home.to_string_lossy().to_string();
                let wait = s.logout_timeout_secs.to_string();
                let busy = s.busy_timeout_secs.to_string();
                // ccfs umount's own bounds (status and answers, the busy wait) and a margin.
                let limit = Duration::from_secs(s.logout_timeout_secs + s.busy_timeout_secs + 120);
                let r = self.ccfs(
                    &["umount", "--wait", &wait, "--busy-timeout", &busy, &home],
                    limit,
                );
                let said = r.output.replace('\n', "; ");
                match r.ok {
                    Some(true) => info(&format!("logout of {user}: {said}")),
                    Some(false) => error(&format!("logout of {user}: {said}")),
                    None => error(&format!(
                        "logout of {user}: the logout sync did not end within {} s; the daemon goes on in the background, and `ccfs recover` sends what it leaves",
                        limit.as_secs()
                    )),
                }
            }
            Mode::Bind => {
                if !self.bind_here(st.layer) {
                    error(&format!(
                        "logout of {user}: the bind mount at {} is gone; nothing unmounted",
                        LogPath(&self.home)
                    ));
                    return;
                }
                self.detach_stacked(st.layer);
                let home = self.home.as_os_str();
                let until = Instant::now() + Duration::from_secs(s.busy_timeout_secs);
                loop {
                    let r = run_limited(Path::new("umount"), &[home], Duration::from_secs(30));
                    if r.ok == Some(true) {
                        info(&format!(
                            "logout of {user}: unmounted the share's home at {}",
                            LogPath(&self.home)
                        ));
                        break;
                    }
                    if Instant::now() >= until {
                        let r = run_limited(
                            Path::new("umount"),
                            &[OsStr::new("-l"), home],
                            Duration::from_secs(30),
                        );
                        info(&format!(
                            "logout of {user}: {} still in use; detached lazily ({})",
                            LogPath(&self.home),
                            if r.ok == Some(true) {
                                "done".to_string()
                            } else {
                                last_line(&r.output)
                            }
                        ));
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }
}
