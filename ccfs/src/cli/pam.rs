//! `ccfs pam-session` and `ccfs bind-home`: the PAM hook's commands.

use crate::*;

/// `ccfs pam-session`: the hook reads only what pam_exec sets (PAM_TYPE, PAM_USER,
/// PAM_SERVICE, PAM_TTY); it always exits 0 under PAM, so a login never fails for it.
pub(crate) fn pam_session(config: Option<PathBuf>) -> Result<(), Error> {
    // Root alone: pam_exec without `seteuid` keeps the calling user's real ids (`su` run
    // by a user), which would let that user signal the hook and its daemon and make
    // umount(8) and access checks judge the user, not root.
    if ccfs::sys::geteuid() == 0 {
        ccfs::sys::become_root_alone();
    }
    let env: Vec<(std::ffi::OsString, std::ffi::OsString)> = std::env::vars_os().collect();
    // Started without its launcher (ccfs-clean-exec), the loader has already acted on
    // whatever of these the PAM environment held: say so, loudly.
    let loader: Vec<String> = env
        .iter()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .filter(|k| k.starts_with("LD_") || k == "GLIBC_TUNABLES")
        .collect();
    if !loader.is_empty() {
        ccfs::pam::warn_unlaunched(&loader);
    }
    // Of the environment pam_exec passes (which may hold what a user put in the PAM
    // environment), only PAM's own items are used; the rest goes before anything runs.
    for (k, _) in &env {
        if !k.to_string_lossy().starts_with("PAM_") {
            std::env::remove_var(k);
        }
    }
    std::env::set_var(
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    );
    if !env.iter().any(|(k, _)| k == "PAM_TYPE") {
        return Err(user_error(
            "PAM_TYPE is not set: this is the PAM session hook",
            "put `session optional pam_exec.so seteuid /usr/libexec/ccfs/ccfs-clean-exec /usr/bin/ccfs pam-session` in a PAM service (see ADMIN.md)",
        )
        .into());
    }
    ccfs::pam::run_from_env(&env, config);
    Ok(())
}

pub(crate) fn bind_home(user: &str, config: Option<&Path>) -> Result<(), Error> {
    if ccfs::sys::geteuid() != 0 {
        return Err(user_error("bind-home needs root", "run it as root").into());
    }
    let (_, settings) = daemon::effective_config(config)?;
    let account = ccfs::sys::user_by_name(user)
        .ok()
        .flatten()
        .ok_or_else(|| {
            user_error(
                format!("no such user: {}", daemon::LogText(user)),
                "give an existing login name",
            )
        })?;
    ccfs::pam::bind_home(&settings, &account)?;
    Ok(())
}
