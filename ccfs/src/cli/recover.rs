//! `ccfs recover`: what a crashed session left unsynced.

use crate::*;

pub(crate) fn recover(
    cache_dir: Option<&Path>,
    user: Option<&str>,
    config: Option<&Path>,
) -> Result<(), Error> {
    // Root reads only a config only root can change, and never one a cache names. Without
    // --config, the machine's /etc/ccfs/ccfs.toml when there is one.
    let (path, settings) = daemon::effective_config(config)?;
    let settings = path.is_some().then_some(settings);
    let dirs = caches_to_recover(cache_dir, user)?;
    // A cache whose lock processes of a dead daemon still hold (its rsync finishing) is
    // waited for, a minute at most, when one cache or one user's are recovered. Recovering
    // every cache (at boot, before logins) waits for none: no process of a daemon from
    // before the boot is left, and a lock some user's process holds must not hold up the
    // boot; such a cache is left for its user's next login.
    let patience = if cache_dir.is_none() && user.is_none() {
        Duration::ZERO
    } else {
        Duration::from_secs(60)
    };
    // Every cache (the boot's recovery, which logins wait for), and every cache of a user
    // (a login's, ccfs@.service's before logins), is bounded in all and per cache
    // ([recovery]); a cache not done in time is left for its user's next login, which
    // recovers that user's caches before it mounts.
    let every = cache_dir.is_none();
    let limits = settings
        .as_ref()
        .map(|s| s.recovery.clone())
        .unwrap_or_default();
    let started = Instant::now();
    let budget = Duration::from_secs(limits.all_caches_secs);
    let per_cache = Duration::from_secs(limits.per_cache_secs);
    let mut failed = 0;
    let mut held = 0;
    for (i, d) in dirs.iter().enumerate() {
        let name = shown(d);
        let limit = if every {
            let left = budget.saturating_sub(started.elapsed());
            if left < Duration::from_millis(200) {
                let rest = &dirs[i..];
                let named: Vec<String> = rest.iter().take(20).map(|d| shown(d)).collect();
                say!(
                    "ccfs: the recovery of {} reached its limit ([recovery] all_caches_secs = {}): {} cache(s) not reached, left for their users' next logins: {}{}",
                    if user.is_some() { "the user's caches" } else { "every cache" },
                    limits.all_caches_secs,
                    rest.len(),
                    named.join(", "),
                    if rest.len() > named.len() { ", ..." } else { "" }
                );
                failed += rest.len();
                break;
            }
            Some(left.min(per_cache))
        } else {
            None
        };
        let outcome = daemon::recover_cache(d, settings.as_ref(), patience, limit);
        match shown_outcome(&name, outcome, limit, cache_dir.is_some())? {
            Tally::Done => {}
            Tally::Held => held += 1,
            Tally::Failed => failed += 1,
        }
    }
    if failed > 0 {
        return Err(fail(format!("{failed} cache(s) could not be recovered")));
    }
    if held > 0 {
        // Everything else is on the share; what a program may still write is not yet.
        return Err(fail(format!(
            "{held} cache(s) keep files still open for writing; the next sync or logout sends them"
        )));
    }
    Ok(())
}

/// What recovering one cache came to, for the command's exit.
enum Tally {
    Done,
    /// Everything is on the share but files still open for writing.
    Held,
    Failed,
}

/// The caches to recover: the one given, a user's (root only), or every cache in turns
/// (one of each owner a turn).
fn caches_to_recover(cache_dir: Option<&Path>, user: Option<&str>) -> Result<Vec<PathBuf>, Error> {
    Ok(match (cache_dir, user) {
        (Some(d), _) => {
            let meta = std::fs::symlink_metadata(d.join("meta.json"));
            if !meta.is_ok_and(|m| m.is_file()) {
                return Err(user_error(
                    format!("{} is not a ccfs cache directory", shown(d)),
                    "give the --cache-dir of an earlier mount",
                )
                .into());
            }
            vec![d.to_path_buf()]
        }
        (None, Some(name)) => {
            if ccfs::sys::geteuid() != 0 {
                return Err(user_error(
                    "--user needs root",
                    "run it as root (as a PAM session hook does), or leave --user out",
                )
                .into());
            }
            let account = ccfs::sys::user_by_name(name)
                .ok()
                .flatten()
                .ok_or_else(|| {
                    user_error(
                        format!("no such user: {}", daemon::LogText(name)),
                        "give an existing login name",
                    )
                })?;
            daemon::user_caches(account.uid)
        }
        (None, None) => daemon::in_turns(daemon::all_caches()),
    })
}

/// Shows what recovering cache `name` came to (`limit`: its time limit, if any). A
/// refusal of the one cache asked for (`one_cache`) is the command's error.
fn shown_outcome(
    name: &str,
    outcome: anyhow::Result<Recovered>,
    limit: Option<Duration>,
    one_cache: bool,
) -> Result<Tally, Error> {
    Ok(match outcome {
        Ok(Recovered::Nothing) => {
            say!("ccfs: {name}: nothing to recover");
            Tally::Done
        }
        Ok(Recovered::InUse(pid)) => {
            say!("ccfs: {name}: in use by a running mount (pid {pid}); skipped");
            Tally::Done
        }
        Ok(Recovered::Synced(o)) => {
            print_outcome(&format!("{name}: recover"), &o);
            let only_kept_open = o.report.as_ref().is_some_and(|r| {
                r.ok && !r.kept_open.is_empty()
                    && r.remaining_dirty == r.kept_open.len()
                    && r.remaining_deletions == 0
            });
            if only_kept_open {
                Tally::Held
            } else if !o.ok {
                Tally::Failed
            } else {
                Tally::Done
            }
        }
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::TimedOut) =>
        {
            say!(
                "ccfs: {name}: not done within {} s ([recovery] per_cache_secs, or what was left of all_caches_secs; {e}): stopped as a crash would stop it, nothing lost; left for its user's next login",
                limit.unwrap_or_default().as_secs()
            );
            Tally::Failed
        }
        Err(e) => match from_anyhow(e) {
            Error::User(u) if one_cache => return Err(Error::User(u)),
            Error::User(u) => {
                say!("ccfs: {name}: {u}");
                Tally::Failed
            }
            Error::Failure(Failure(m)) => {
                say!("ccfs: {name}: recover failed: {m}");
                Tally::Failed
            }
        },
    })
}
