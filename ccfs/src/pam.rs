//! The PAM session hook (`ccfs pam-session`, run by `pam_exec` at open_session and
//! close_session): recovers and mounts a user's home at the first login, counts the
//! sessions of each user on this host so that the last logout syncs and unmounts, and
//! falls back to what the admin chose when ccfs cannot mount. A login never fails or
//! hangs because of it: every step that touches the share runs in a child process with
//! a time limit, and every outcome is logged (syslog, `ccfs-session`, facility authpriv).
//!
//! What root reads here comes from PAM (the user name, the session's process), from
//! root's config and from root's own state directory (`/run/ccfs/sessions`, root's,
//! 0700); nothing in the user's home, share or cache steers what root does.

use std::ffi::OsStr;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::{Fallback, Settings};
use crate::daemon::{self, LogPath, LogText};
use crate::sys::{self, Account, DirFd};

/// Root's directory of session state (on tmpfs: a reboot ends every session).
pub const STATE_DIR: &str = "/run/ccfs/sessions";

/// How the home of a user's sessions is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// A ccfs mount the hook made; the last logout unmounts it.
    Ccfs,
    /// The fallback: the share's home bind-mounted; the last logout unmounts it.
    Bind,
    /// A ccfs mount that was there before the first session (made by `ccfs@.service` or by
    /// hand): used, never unmounted by the hook.
    Foreign,
    /// Nothing mounted (fallback "none", or the mount failed and so did the fallback).
    Nothing,
}

/// One open session: the process that opened it (the PAM application: sshd, gdm's
/// session worker, login), known by pid and start time so a reused pid is not taken for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub pid: u32,
    pub start: u64,
    pub service: String,
    pub tty: String,
}

/// The sessions of one user on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserState {
    pub mode: Mode,
    /// The cache of the ccfs mount (`Ccfs`, `Foreign`): the mount at the home is taken for
    /// this one only if the mount table names this cache.
    pub cache_dir: Option<PathBuf>,
    /// How many mounts were at the home once the login's own was made (its own the top):
    /// what a user stacks on it later is detached before the logout unmounts it.
    #[serde(default)]
    pub layer: usize,
    pub sessions: Vec<Entry>,
}

/// Whether the session's process still runs (the same process: same pid, same start).
fn alive(e: &Entry) -> bool {
    sys::process_start(e.pid) == Some(e.start)
}

impl UserState {
    /// Drops the sessions whose process is gone without a close_session (a killed sshd,
    /// a crashed display manager); returns how many.
    pub fn prune(&mut self, alive: impl Fn(&Entry) -> bool) -> usize {
        let before = self.sessions.len();
        self.sessions.retain(|e| alive(e));
        before - self.sessions.len()
    }

    /// Removes the session `me` opened; false when it was not recorded.
    pub fn close(&mut self, me: &Entry) -> bool {
        match self
            .sessions
            .iter()
            .position(|e| e.pid == me.pid && e.start == me.start)
        {
            Some(i) => {
                self.sessions.remove(i);
                true
            }
            None => false,
        }
    }
}

// ---- logging ------------------------------------------------------------------------------

/// Logs one line: syslog (authpriv, tag `ccfs-session`) and standard error (which
/// `pam_exec log=FILE` keeps).
fn log(priority: libc::c_int, msg: &str) {
    let line = LogText(msg).to_string();
    sys::write_fd_lossy(2, format!("ccfs-session: {line}\n").as_bytes());
    sys::syslog(priority, &line);
}

fn info(msg: &str) {
    log(libc::LOG_NOTICE, msg);
}

fn error(msg: &str) {
    log(libc::LOG_ERR, msg);
}

// ---- child processes with a time limit ----------------------------------------------------

/// What a child said and how it ended.
struct ChildRun {
    /// None: it did not end in time (it was killed, or abandoned if it cannot die: a
    /// process stuck on a hung share).
    ok: Option<bool>,
    output: String,
}

/// Runs `program args` with a clean environment (PATH only), waiting at most `limit`.
fn run_limited(program: &Path, args: &[&OsStr], limit: Duration) -> ChildRun {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return ChildRun {
                ok: Some(false),
                output: format!("cannot run {}: {e}", program.display()),
            }
        }
    };
    let (tx, rx) = std::sync::mpsc::channel();
    for pipe in [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.take(64 << 10).read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
    }
    drop(tx);
    let deadline = Instant::now() + limit;
    let ok = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status.success()),
            Ok(None) if Instant::now() >= deadline => {
                // The child's own process group (made above).
                sys::kill_group(child.id());
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break Some(false),
        }
    };
    // What it wrote: a process it left behind may hold the pipe, so wait only a moment.
    let mut output = Vec::new();
    let until = Instant::now() + Duration::from_secs(1);
    while let Ok(part) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
        output.extend(part);
    }
    ChildRun {
        ok,
        output: String::from_utf8_lossy(&output).trim().to_string(),
    }
}

// ---- the hook -----------------------------------------------------------------------------

/// The hook's inputs: what PAM gave (pam_exec's environment) and root's config.
pub struct Hook {
    pub kind: String,
    pub user: String,
    pub service: String,
    pub tty: String,
    pub config: Option<PathBuf>,
}

/// The PAM items pam_exec passes in the environment. pam_exec puts the PAM environment
/// (`pam_getenvlist`: what pam_env set, possibly from a user's file) first and its own
/// items after, in one order: PAM_SERVICE (always set), PAM_USER, PAM_TTY, PAM_RHOST and
/// PAM_RUSER where PAM has them, and PAM_TYPE last. Only that block is pam_exec's: an item
/// found only before it (a PAM_TTY the user set where PAM has none) is taken as unset,
/// and an item that appears with two values was set by someone else too: the hook then
/// trusts none of them.
pub fn hook_from_env(
    env: &[(std::ffi::OsString, std::ffi::OsString)],
    config: Option<PathBuf>,
) -> Result<Hook, String> {
    // Only the PAM_ entries, in their order (the launcher puts its PATH after them).
    let pam: Vec<&(std::ffi::OsString, std::ffi::OsString)> = env
        .iter()
        .filter(|(k, _)| k.as_encoded_bytes().starts_with(b"PAM_"))
        .collect();
    let ours = match pam.iter().rposition(|(k, _)| k == "PAM_SERVICE") {
        Some(i) if pam.last().is_some_and(|(k, _)| k == "PAM_TYPE") => &pam[i..],
        _ => {
            return Err(
                "the environment does not end with pam_exec's items (PAM_SERVICE ... PAM_TYPE); the hook does nothing for this session (start it with pam_exec, see ADMIN.md)"
                    .into(),
            )
        }
    };
    let item = |key: &str| -> Result<String, String> {
        let mut values = env.iter().filter(|(k, _)| k == key).map(|(_, v)| v);
        let first = values.next();
        if values.any(|v| Some(v) != first) {
            return Err(format!(
                "{key} appears twice with different values in the environment (set in the PAM environment, by pam_env or a user's file?); the hook does nothing for this session"
            ));
        }
        Ok(ours
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.to_string_lossy().into_owned())
            .unwrap_or_default())
    };
    Ok(Hook {
        kind: item("PAM_TYPE")?,
        user: item("PAM_USER")?,
        service: item("PAM_SERVICE")?,
        tty: item("PAM_TTY")?,
        config,
    })
}

/// systemd-run's options for the scope of `user`'s daemon (uid `uid`): a unit of its own,
/// so that it outlives the session that started it and is stopped in order at shutdown,
/// in the user's own slice, so that the limits set for the user's processes (tasks,
/// memory, CPU) hold for the daemon and its rsync too.
fn scope_args(user: &str, uid: u32) -> Vec<String> {
    vec![
        "--scope".into(),
        "--quiet".into(),
        "--collect".into(),
        format!("--slice=user-{uid}.slice"),
        format!(
            "--unit=ccfs-home-{}-{}",
            user.replace(|c: char| !c.is_ascii_alphanumeric(), "_"),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        ),
        format!("--description=ccfs home of {user}"),
    ]
}

/// The hook was started with loader variables in its environment (`names`): not through
/// its static launcher, so the dynamic loader may have run what they name as root.
pub fn warn_unlaunched(names: &[String]) {
    error(&format!(
        "started with {} in its environment: the dynamic loader may have acted on them before the hook ran; start the hook through its launcher (`pam_exec.so seteuid /usr/libexec/ccfs/ccfs-clean-exec /usr/bin/ccfs pam-session`, see ADMIN.md)",
        names.join(", ")
    ));
}

/// Runs the hook from pam_exec's environment; never fails (a login must not).
pub fn run_from_env(env: &[(std::ffi::OsString, std::ffi::OsString)], config: Option<PathBuf>) {
    match hook_from_env(env, config) {
        Ok(hook) => run(&hook),
        Err(msg) => error(&msg),
    }
}

/// Runs the hook; never fails (a login must not).
pub fn run(hook: &Hook) {
    if let Err(msg) = run_inner(hook) {
        error(&msg);
    }
}

fn run_inner(hook: &Hook) -> Result<(), String> {
    if sys::geteuid() != 0 {
        return Err(
            "not run as root (it runs from pam_exec in a root PAM stack); nothing done".into(),
        );
    }
    let (config, settings) = daemon::effective_config(hook.config.as_deref())
        .map_err(|e| format!("{e}; ccfs not used for {}", LogText(&hook.user)))?;
    if !daemon::valid_user_name(&hook.user) {
        return Err(format!(
            "user name {:?} cannot name a home; ccfs not used",
            LogText(&hook.user).to_string()
        ));
    }
    let account = sys::user_by_name(&hook.user)
        .ok()
        .flatten()
        .ok_or_else(|| format!("no such user {}; ccfs not used", hook.user))?;
    // One name per account: a name service that also answers to another spelling (case,
    // an alias) would give the same uid other paths and confuse its session count.
    if account.name != hook.user {
        return Err(format!(
            "PAM_USER {} is an alias of {}; ccfs not used (give PAM the account's own name)",
            hook.user, account.name
        ));
    }
    if account.uid < settings.session.min_uid {
        // Root and system accounts (cron, display manager greeters): not ours.
        return Ok(());
    }
    let (_, home) = daemon::home_paths(&settings, &hook.user).map_err(|e| e.to_string())?;
    // As the mount table and `ccfs mount` name it: the home root resolved (root's), never
    // the home itself (whatever is mounted there may hang).
    let home = std::fs::canonicalize(&settings.homes.home_root)
        .map(|r| r.join(&hook.user))
        .unwrap_or(home);
    let ctx = Ctx {
        hook,
        config,
        settings,
        account,
        home,
    };
    let me = Entry {
        pid: std::os::unix::process::parent_id(),
        start: sys::process_start(std::os::unix::process::parent_id()).unwrap_or(0),
        service: hook.service.clone(),
        tty: hook.tty.clone(),
    };
    let store = Store::open(ctx.account.uid)?;
    let lock_wait = Duration::from_secs(ctx.settings.session.login_timeout_secs);
    let _lock = store.lock(lock_wait)?;
    let mut state = store.load();
    match hook.kind.as_str() {
        "open_session" => {
            let state = ctx.open(state, me);
            store.save(&state)
        }
        "close_session" => {
            let Some(mut st) = state.take() else {
                info(&format!(
                    "logout of {}: no session of theirs is recorded; nothing to do",
                    hook.user
                ));
                return Ok(());
            };
            let gone = st.prune(alive);
            if !st.close(&me) {
                info(&format!(
                    "logout of {}: this session (pid {}) was not recorded",
                    hook.user, me.pid
                ));
            }
            if gone > 0 {
                info(&format!(
                    "{gone} session(s) of {} ended without a logout (their process is gone)",
                    hook.user
                ));
            }
            if !st.sessions.is_empty() {
                info(&format!(
                    "logout of {}: {} other session(s) still open; {} stays mounted",
                    hook.user,
                    st.sessions.len(),
                    LogPath(&ctx.home)
                ));
                return store.save(&Some(st));
            }
            ctx.last_close(&st);
            store.save(&None)
        }
        other => Err(format!(
            "PAM_TYPE {:?}: only open_session and close_session are handled (use the hook on session lines)",
            LogText(other).to_string()
        )),
    }
}

struct Ctx<'a> {
    hook: &'a Hook,
    config: Option<PathBuf>,
    settings: Settings,
    account: Account,
    home: PathBuf,
}

/// The mounts at a path, the lowest first.
fn layers(p: &Path) -> Vec<fsinfo::MountEntry> {
    fsinfo::mounts()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.mount_point == p)
        .collect()
}

impl Ctx<'_> {
    fn user(&self) -> &str {
        &self.hook.user
    }

    fn ccfs_exe(&self) -> Result<PathBuf, String> {
        std::env::current_exe().map_err(|e| format!("cannot find the ccfs binary: {e}"))
    }

    /// `ccfs ARGS [--config C]`, in a child, within `limit`.
    fn ccfs(&self, args: &[&str], limit: Duration) -> ChildRun {
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
    fn with_config<'a>(&'a self, mut args: Vec<&'a OsStr>) -> Vec<&'a OsStr> {
        if let Some(c) = &self.config {
            args.push(OsStr::new("--config"));
            args.push(c.as_os_str());
        }
        args
    }

    /// The ccfs mount at the home, if it is one and names `cache` (any cache if None).
    /// The ccfs mount at the home (at any layer: a user may have stacked a mount on it)
    /// that names `cache`, or any ccfs mount there if None; the cache it names.
    fn ccfs_mount_here(&self, cache: Option<&Path>) -> Option<PathBuf> {
        layers(&self.home)
            .iter()
            .rev()
            .filter(|m| daemon::is_ccfs_mount(m))
            .filter_map(|m| crate::control::cache_dir_of_source(&m.source))
            .find(|dir| cache.is_none_or(|c| c == dir))
    }

    /// Whether the bind mount of the login (layer `layer`) is still at the home.
    fn bind_here(&self, layer: usize) -> bool {
        layer > 0
            && layers(&self.home)
                .get(layer - 1)
                .is_some_and(|m| !daemon::is_ccfs_mount(m))
    }

    /// Detaches what was mounted on the home above the login's own mount (layer `layer`),
    /// so the logout unmounts the login's mount and not something a user put on it.
    fn detach_stacked(&self, layer: usize) {
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

    fn open(&self, state: Option<UserState>, me: Entry) -> Option<UserState> {
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
    fn first_open(&self) -> UserState {
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
    fn wait_for_previous(&self, limit: Duration) {
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
    fn mount(&self, limit: Duration) -> Result<PathBuf, String> {
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
    fn last_close(&self, st: &UserState) {
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

fn last_line(output: &str) -> String {
    let line = output
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("(no output)");
    line.trim_start_matches("ccfs: error: ").to_string()
}

// ---- the state store ----------------------------------------------------------------------

/// Root's state of one user's sessions: `/run/ccfs/sessions/UID.json`, with `UID.lock`
/// serializing the hooks of that user.
struct Store {
    dir: DirFd,
    uid: u32,
}

impl Store {
    fn open(uid: u32) -> Result<Self, String> {
        let mut cur = DirFd::open(Path::new("/run")).map_err(|e| format!("/run: {e}"))?;
        for name in ["ccfs", "sessions"] {
            let n = OsStr::new(name);
            match cur.mkdir(n, 0o700) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("cannot create the session state {STATE_DIR}: {e}")),
            }
            cur = cur
                .open_dir(n)
                .map_err(|e| format!("session state {STATE_DIR}: {e}"))?;
            let st = cur.stat().map_err(|e| format!("{STATE_DIR}: {e}"))?;
            if st.uid() != 0 || st.mode() & 0o022 != 0 {
                return Err(format!(
                    "the session state {STATE_DIR} is not root's alone (uid {}, mode {:o}); remove it",
                    st.uid(),
                    st.mode() & 0o7777
                ));
            }
        }
        Ok(Self { dir: cur, uid })
    }

    fn lock(&self, limit: Duration) -> Result<std::fs::File, String> {
        let name = format!("{}.lock", self.uid);
        let f = self
            .dir
            .open_file(
                OsStr::new(&name),
                libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW,
                0o600,
            )
            .map_err(|e| format!("session lock {STATE_DIR}/{name}: {e}"))?;
        let until = Instant::now() + limit;
        loop {
            match sys::try_lock_exclusive(&f) {
                Ok(true) => return Ok(f),
                Ok(false) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Ok(false) => {
                    return Err(format!(
                        "another login or logout of uid {} held {STATE_DIR}/{name} for {} s; nothing done",
                        self.uid,
                        limit.as_secs()
                    ))
                }
                Err(e) => return Err(format!("session lock {STATE_DIR}/{name}: {e}")),
            }
        }
    }

    fn load(&self) -> Option<UserState> {
        let name = format!("{}.json", self.uid);
        let mut f = self
            .dir
            .open_file(OsStr::new(&name), libc::O_RDONLY | libc::O_NOFOLLOW, 0)
            .ok()?;
        let mut text = String::new();
        let _ = (&mut f).take(1 << 20).read_to_string(&mut text);
        match serde_json::from_str(&text) {
            Ok(st) => Some(st),
            Err(e) => {
                error(&format!(
                    "{STATE_DIR}/{name} is unreadable ({e}); the sessions it counted are forgotten"
                ));
                None
            }
        }
    }

    fn save(&self, st: &Option<UserState>) -> Result<(), String> {
        let name = format!("{}.json", self.uid);
        let path = Path::new(STATE_DIR).join(&name);
        match st {
            None => match std::fs::remove_file(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(format!("{}: {e}", path.display())),
            },
            Some(st) => {
                let text = serde_json::to_vec_pretty(st).map_err(|e| e.to_string())?;
                daemon::write_atomic(&path, &text).map_err(|e| format!("{}: {e}", path.display()))
            }
        }
    }
}

/// `ccfs bind-home --user NAME`: the fallback, the home on the share bind-mounted at the
/// home. Refuses a share home that is not a directory of the user's (a symlink there
/// would lead root's mount anywhere) and a mount point that is in use or not empty.
pub fn bind_home(settings: &Settings, account: &Account) -> Result<(), daemon::UserError> {
    let (share, home) = daemon::home_paths(settings, &account.name)?;
    daemon::make_mount_point(&settings.homes.home_root, &account.name)?;
    if fsinfo::is_mount_point(&home).unwrap_or(true) {
        return Err(daemon::user_error(
            format!("{} is already mounted", LogPath(&home)),
            "unmount it first",
        ));
    }
    let empty = std::fs::read_dir(&home)
        .map(|mut d| d.next().is_none())
        .unwrap_or(false);
    if !empty {
        return Err(daemon::user_error(
            format!("{} is not empty", LogPath(&home)),
            "empty the mount point, so no local files are hidden",
        ));
    }
    let name = OsStr::new(&account.name);
    sys::bind_mount_dir(
        &settings.homes.share_root,
        &settings.homes.home_root,
        name,
        account.uid,
    )
    .map_err(|e| {
        daemon::user_error(
            format!("cannot bind {} at {}: {e}", LogPath(&share), LogPath(&home)),
            "make the user's home on the share a directory they own (not a symlink)",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pid: u32, start: u64) -> Entry {
        Entry {
            pid,
            start,
            service: "sshd".into(),
            tty: String::new(),
        }
    }

    #[test]
    fn sessions_are_counted_by_process_and_start() {
        let mut st = UserState {
            mode: Mode::Ccfs,
            cache_dir: None,
            layer: 1,
            sessions: vec![entry(10, 1), entry(11, 5), entry(12, 7)],
        };
        // pid 11 now runs another process (started at 9): that session is gone.
        let gone = st.prune(|e| e.pid != 11);
        assert_eq!(gone, 1);
        assert!(
            !st.close(&entry(10, 2)),
            "same pid, other start: not that session"
        );
        assert!(st.close(&entry(10, 1)));
        assert_eq!(st.sessions, vec![entry(12, 7)]);
    }

    #[test]
    fn pam_items_set_twice_are_trusted_for_nothing() {
        let pair = |k: &str, v: &str| (std::ffi::OsString::from(k), std::ffi::OsString::from(v));
        let env = vec![
            pair("LANG", "C"),
            pair("PAM_SERVICE", "login"),
            pair("PAM_USER", "alice"),
            pair("PAM_TYPE", "open_session"),
            pair("PATH", "/usr/bin"),
        ];
        let h = hook_from_env(&env, None).expect("plain");
        assert_eq!(
            (h.kind.as_str(), h.user.as_str()),
            ("open_session", "alice")
        );
        // pam_env put its PAM_USER before pam_exec's own.
        let mut forged = vec![pair("PAM_USER", "victim")];
        forged.extend(env.clone());
        let e = hook_from_env(&forged, None).err().expect("refused");
        assert!(e.contains("PAM_USER appears twice"), "{e}");
        // The same value twice is no forgery.
        let mut same = vec![pair("PAM_TYPE", "open_session")];
        same.extend(env);
        assert!(hook_from_env(&same, None).is_ok());
    }

    #[test]
    fn the_daemons_scope_is_in_the_users_own_slice() {
        let a = scope_args("al.ice", 1234);
        assert!(a.contains(&"--slice=user-1234.slice".to_string()), "{a:?}");
        assert!(
            a.iter().any(|x| x.starts_with("--unit=ccfs-home-al_ice-")),
            "{a:?}"
        );
        assert!(a.contains(&"--scope".to_string()));
    }

    #[test]
    fn a_pam_item_only_the_pam_environment_holds_is_taken_as_unset() {
        let pair = |k: &str, v: &str| (std::ffi::OsString::from(k), std::ffi::OsString::from(v));
        // PAM has no TTY (an SSH command, a cron job): pam_exec passes none, and the
        // user's PAM_TTY sits before pam_exec's block.
        let env = vec![
            pair("PAM_TTY", "/dev/tty1"),
            pair("PAM_SERVICE", "sshd"),
            pair("PAM_USER", "alice"),
            pair("PAM_TYPE", "open_session"),
        ];
        let h = hook_from_env(&env, None).expect("hook");
        assert_eq!(h.tty, "", "a user-set PAM_TTY was taken");
        assert_eq!((h.user.as_str(), h.service.as_str()), ("alice", "sshd"));
        // pam_exec's own PAM_TTY is taken.
        let env = vec![
            pair("PAM_SERVICE", "login"),
            pair("PAM_USER", "alice"),
            pair("PAM_TTY", "/dev/tty2"),
            pair("PAM_TYPE", "close_session"),
        ];
        assert_eq!(hook_from_env(&env, None).expect("hook").tty, "/dev/tty2");
        // Not pam_exec's shape at all: nothing is trusted.
        let env = vec![pair("PAM_USER", "alice"), pair("PAM_TYPE", "open_session")];
        assert!(hook_from_env(&env, None).is_err());
    }

    #[test]
    fn own_process_start_is_read() {
        let me = std::process::id();
        let a = sys::process_start(me).expect("own start");
        assert_eq!(sys::process_start(me), Some(a), "stable");
        assert!(sys::process_start(u32::MAX - 1).is_none());
    }
}
