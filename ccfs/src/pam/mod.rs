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
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::Settings;
use crate::daemon::{self, LogPath, LogText};
use crate::sys::{self, Account};

mod child;
mod login;
mod state;

use child::*;
use login::*;
use state::*;

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
    let ctx = Login {
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
    let store = StateFile::open(ctx.account.uid)?;
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

fn last_line(output: &str) -> String {
    let line = output
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("(no output)");
    line.trim_start_matches("ccfs: error: ").to_string()
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
