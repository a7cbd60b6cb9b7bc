//! The sections of ccfs's man pages that clap does not make: examples, the files it
//! reads and writes (the configuration's whole format, as shipped), its environment and
//! its exit codes.

use clidocs::Section;

/// The shipped configuration: every key with its default and what it does.
const SHIPPED_CONFIG: &str = include_str!("../../../deploy/etc/ccfs.toml");

const EXAMPLES: &str = "\
Mount alice's home through ccfs as her PAM session does (as root), see what waits for \
the share, and log out (unmount, then send everything back):

```
ccfs mount --user alice
ccfs status /home/alice
ccfs umount /home/alice
```

The same with the paths given, as a user for themselves:

```
ccfs mount /netshare/users/alice /home/alice
```

After a crash or a power cut, send what the interrupted sessions kept (the boot and the \
next login do it too):

```
ccfs recover --user alice
```

Check a configuration before installing it:

```
ccfs config check --config ./ccfs.toml
```";

const ENVIRONMENT: &str = "\
CCFS_LOG
    How much the daemon writes to CACHE/ccfs.log: error, warn, info (the default), debug \
    or trace (a tracing filter, e.g. ccfs=debug).

CCFS_CACHE_ROOT
    Where caches are made when --cache-dir is not given, instead of [homes].cache_root.

The PAM session hook (ccfs pam-session) clears its environment before it runs anything: \
neither of these reaches a mount it makes.";

const EXIT_STATUS: &str = "\
0
    Done. For ccfs umount and ccfs sync: everything reached the share.

1
    The command failed: a mount that did not come up, a sync that left changes in the \
    cache (named, kept for the next sync or ccfs recover), a share that did not answer.

2
    Bad input: a missing share, a mount point that is not empty or already mounted, an \
    invalid configuration, a cache that is unsafe. One line names the problem and the \
    fix; nothing was changed.";

const UMOUNT_EXIT: &str = "\
0
    Unmounted, and everything the session changed reached the share.

1
    Something did not reach the share (a conflict copy, a full share, rsync failing, no \
    answer within --wait): it stays in the cache, named on stderr, and is sent by the \
    next sync, the next login or ccfs recover.

2
    Bad input (not a ccfs mount, an unknown user); nothing was changed.";

/// The sections, each on its page.
pub(crate) fn sections() -> Vec<Section> {
    let files = format!(
        "/etc/ccfs/ccfs.toml\n    The configuration (TOML) that root's commands and the \
         PAM session hook read when no --config is given. Only root may be able to change \
         it and the directories above it. ccfs config check validates a file and prints \
         the configuration in effect.\n\n\
         /var/tmp/ccfs/UID/NAME\n    The cache of a mount root makes for a user (NAME from \
         the mount point, home-alice for /home/alice); /var/tmp/ccfs-UID/NAME when a user \
         mounts for themselves. It must survive a reboot. CACHE/ccfs.log is the daemon's \
         log.\n\n\
         The shipped /etc/ccfs/ccfs.toml, every key with its default and what it does:\n\n\
         ```\n{}\n```",
        SHIPPED_CONFIG.trim_end()
    );
    let on = |page, title, text: &str| Section {
        page,
        title,
        text: text.to_string(),
    };
    vec![
        on("ccfs", "EXAMPLES", EXAMPLES),
        on("ccfs", "FILES", &files),
        on("ccfs", "ENVIRONMENT", ENVIRONMENT),
        on("ccfs", "EXIT STATUS", EXIT_STATUS),
        on("ccfs-config-check", "FILES", &files),
        on("ccfs-umount", "EXIT STATUS", UMOUNT_EXIT),
        on("ccfs-mount", "ENVIRONMENT", ENVIRONMENT),
    ]
}
