//! What `ccfs-clean-exec` passes on of its environment (pure, tested here).
//!
//! pam_exec starts its command as root with the PAM environment, which may hold what a
//! user put there (`pam_env user_readenv=1` reads `~/.pam_environment`): `LD_PRELOAD`,
//! `LD_AUDIT`, `LD_LIBRARY_PATH`, `GLIBC_TUNABLES`, ... The dynamic loader of a program
//! honours those before its `main` runs, so no program started that way may be
//! dynamically linked. `ccfs-clean-exec` is statically linked (musl: no loader, and a C
//! library whose start reads no variable) and starts the hook with PAM's own items alone.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

/// The items pam_exec puts in its command's environment; nothing else is passed on.
pub const PAM_ITEMS: [&str; 6] = [
    "PAM_TYPE",
    "PAM_USER",
    "PAM_RUSER",
    "PAM_RHOST",
    "PAM_SERVICE",
    "PAM_TTY",
];

/// The PATH the program gets (root's usual one; nothing of the caller's).
pub const PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The environment to start the program with, from `environ`'s entries (`NAME=value`,
/// in order): every entry of a PAM item, each as often as it came and in its order (the
/// hook trusts no item given twice with two values, which tells that someone besides
/// pam_exec set it), then [`PATH`]. An entry without `=` is dropped.
pub fn kept_environment<'a>(environ: impl IntoIterator<Item = &'a OsStr>) -> Vec<OsString> {
    let mut kept: Vec<OsString> = environ
        .into_iter()
        .filter(|entry| {
            let bytes = entry.as_bytes();
            bytes
                .iter()
                .position(|&b| b == b'=')
                .is_some_and(|eq| PAM_ITEMS.iter().any(|item| item.as_bytes() == &bytes[..eq]))
        })
        .map(OsStr::to_os_string)
        .collect();
    kept.push(OsString::from(PATH));
    kept
}

/// Why the command line cannot be run: None when it names an absolute program.
pub fn check_args(args: &[OsString]) -> Option<String> {
    match args.get(1) {
        None => Some(
            "no program given: use `ccfs-clean-exec /usr/bin/ccfs pam-session` (see ADMIN.md)"
                .into(),
        ),
        Some(p) if !p.as_bytes().starts_with(b"/") => Some(format!(
            "{}: the program must be given by its absolute path (no PATH is searched)",
            p.to_string_lossy()
        )),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(entries: &[&str]) -> Vec<OsString> {
        kept_environment(entries.iter().map(OsStr::new))
    }

    #[test]
    fn only_pam_items_and_a_fixed_path_are_passed_on() {
        let got = env(&[
            "LD_PRELOAD=/home/eve/evil.so",
            "LD_AUDIT=/home/eve/audit.so",
            "LD_LIBRARY_PATH=/home/eve/lib",
            "GLIBC_TUNABLES=glibc.malloc.check=3",
            "PATH=/home/eve/bin",
            "PAM_TYPE=open_session",
            "PAM_USERX=no",
            "XPAM_USER=no",
            "PAM_USER=alice",
            "RUST_BACKTRACE=1",
            "PAM_TTY=/dev/pts/1",
        ]);
        assert_eq!(
            got,
            [
                "PAM_TYPE=open_session",
                "PAM_USER=alice",
                "PAM_TTY=/dev/pts/1",
                PATH
            ]
            .map(OsString::from)
        );
    }

    #[test]
    fn an_item_given_twice_is_passed_on_twice_in_its_order() {
        let got = env(&["PAM_USER=victim", "PAM_TYPE=close_session", "PAM_USER=eve"]);
        assert_eq!(
            got,
            [
                "PAM_USER=victim",
                "PAM_TYPE=close_session",
                "PAM_USER=eve",
                PATH
            ]
            .map(OsString::from)
        );
    }

    #[test]
    fn entries_without_a_value_separator_are_dropped() {
        assert_eq!(env(&["PAM_USER", "=PAM_USER"]), [OsString::from(PATH)]);
    }

    #[test]
    fn a_program_must_be_given_by_absolute_path() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(check_args(&args(&["x"])).is_some_and(|e| e.contains("no program")));
        assert!(check_args(&args(&["x", "ccfs", "pam-session"]))
            .is_some_and(|e| e.contains("absolute path")));
        assert_eq!(
            check_args(&args(&["x", "/usr/bin/ccfs", "pam-session"])),
            None
        );
    }
}
