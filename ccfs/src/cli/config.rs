//! `ccfs config check`.

use crate::*;

pub(crate) fn config_check(config: Option<&Path>) -> Result<(), Error> {
    let (path, settings) = daemon::effective_config(config)?;
    let text = toml::to_string_pretty(&settings.file)
        .map_err(|e| fail(format!("cannot print the configuration: {e}")))?;
    match &path {
        Some(p) => say!("# ccfs configuration from {} (valid)", shown(p)),
        None => say!(
            "# ccfs configuration: the built-in defaults ({} does not exist)",
            ccfs::config::SYSTEM_CONFIG
        ),
    }
    say_raw!("{text}");
    // The places [homes] names, as the PAM hook and `ccfs mount --user` will find them.
    let mut problems = Vec::new();
    let h = &settings.homes;
    for (key, dir, missing) in [
        (
            "cache_root",
            &h.cache_root,
            "made at the first mount; better now, before any user can make it: mkdir -m 755",
        ),
        (
            "home_root",
            &h.home_root,
            "mount points are made in it: mkdir -m 755",
        ),
    ] {
        match std::fs::symlink_metadata(dir) {
            Err(_) => say!(
                "# note: [homes].{key} {} does not exist ({missing} {})",
                shown(dir),
                shown(dir)
            ),
            Ok(m) => {
                use std::os::unix::fs::MetadataExt;
                if !m.is_dir() || m.uid() != 0 || m.mode() & 0o022 != 0 {
                    problems.push(format!(
                        "[homes].{key} {} must be a directory of root's that nobody else can write (it is uid {}, mode {:o}{}): another user could take what is made in it",
                        shown(dir),
                        m.uid(),
                        m.mode() & 0o7777,
                        if m.is_dir() { "" } else { ", not a directory" }
                    ));
                }
            }
        }
    }
    // Each ROOT/UID must be a directory of that uid (root makes it, then hands it over):
    // anything else there was made by someone else, in a cache root that was not root's.
    if problems.is_empty() {
        for e in std::fs::read_dir(&h.cache_root)
            .into_iter()
            .flatten()
            .flatten()
        {
            use std::os::unix::fs::MetadataExt;
            let name = e.file_name().to_string_lossy().into_owned();
            let ok = std::fs::symlink_metadata(e.path())
                .is_ok_and(|m| m.is_dir() && name.parse::<u32>().is_ok_and(|uid| uid == m.uid()));
            if !ok {
                problems.push(format!(
                    "{} is not a directory of the uid it is named for; remove it (ccfs makes each user's)",
                    shown(&e.path())
                ));
            }
        }
    }
    if std::fs::symlink_metadata(&h.share_root).is_err() {
        say!(
            "# note: [homes].share_root {} is not there (is the share mounted?)",
            shown(&h.share_root)
        );
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(fail(problems.join("; ")))
    }
}
