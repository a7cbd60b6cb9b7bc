//! rsync, below the overlay: the command line (pure), what the share supports, and the
//! runner that hands rsync a list of paths and reads its report of what it put in place.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sys::launcher::{self, Launcher, Program};

/// What rsync reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transfer {
    /// Exit 0: every listed path was sent.
    Complete,
    /// Anything else, with rsync's own list of the regular files it sent: each path with
    /// the mtime (whole seconds) rsync listed for it, which is the mtime it gives the
    /// share's copy (see [`parse_sent_line`]).
    Reported(HashMap<PathBuf, Put>),
    /// Anything else without that list (a crash, rsync not run, or no file named): each
    /// path is compared with what was handed over.
    Incomplete,
    /// Some paths settled by a report of their own, whatever became of the others: the
    /// files the sync sent itself, each with what its rename put there (None: it put
    /// nothing). The other paths go by `rest`.
    Partly {
        exact: HashMap<PathBuf, Option<Put>>,
        rest: Box<Transfer>,
    },
}

/// What the share supports, probed once per mount.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ShareCaps {
    pub xattrs: bool,
    pub acls: bool,
}

/// Probes the share root without writing to it: an absent attribute answers ENODATA where
/// the filesystem supports attributes, ENOTSUP where it does not.
pub fn probe_share(share: &Path) -> ShareCaps {
    let supported = |name: &str| match crate::sys::lgetxattr(share, std::ffi::OsStr::new(name)) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() == Some(libc::ENODATA),
    };
    ShareCaps {
        xattrs: supported("user.ccfs.probe"),
        acls: supported("system.posix_acl_access") || supported("system.posix_acl_default"),
    }
}

/// The holding directory rsync's `--delay-updates` uses in each directory it writes to.
/// Not rsync's default (`.~tmp~`), which may be a user's own: after an interrupted sync,
/// ccfs removes from this directory only the names it was sending (see
/// [`crate::overlay::SyncSession`]).
pub const PARTIAL_DIR: &str = ".ccfs-sync-partial~";

/// What rsync prints on its standard output for each item it sends (`--out-format`): a tag
/// that starts no other line of its output, the itemized change (`>f...` for a regular file
/// sent, `hf...` for a hard link to one), the mtime it listed for the file and sets on the
/// share's copy (`%M`: whole seconds, in the time zone rsync runs with, `TZ=UTC0`), and the
/// name last, since it may hold `|` (rsync writes its non-printable bytes, and a `\` that
/// would read as such an escape, as `\#ooo`, so a name never spans lines). The lines are
/// read by [`read_sent_report`]; a name only ever selects the record of that path.
pub const OUT_FORMAT: &str = "ccfs-sent|%i|%M|%n";

/// The longest line of rsync's report that is read: a path of PATH_MAX bytes, each written
/// as a 4-byte escape, and the fields before it. A longer line names no path ccfs sends.
const MAX_REPORT_LINE: usize = 4 * 4096 + 256;

/// How to run rsync.
#[derive(Debug, Clone)]
pub struct RsyncOptions {
    pub binary: PathBuf,
    pub extra_args: Vec<String>,
    pub timeout: Duration,
    pub caps: ShareCaps,
    /// rsync 3.2.4+ knows `--fsync`.
    pub fsync: FsyncProbe,
    /// A descriptor rsync (and every process it forks) inherits and keeps open while it
    /// runs: the cache's lock, so that `ccfs recover` cannot start while an rsync of a dead
    /// daemon still writes to the share.
    pub hold_fd: Option<std::os::fd::RawFd>,
    /// What starts rsync: the daemon's launcher (see [`crate::sys::launcher`]), or this
    /// process itself without one.
    pub launcher: Option<Arc<Launcher>>,
    /// Send the directories above the listed paths (rsync's default): only when one is
    /// missing on the share (see [`crate::overlay::SyncSession`]'s `carries`).
    pub implied_dirs: bool,
}

/// The rsync command line (without the program name) for one sync. Recovery runs the
/// same command as a logout: no `--update`, every listed path is sent, after the same
/// conflict checks. The file list is read from standard input (`--files-from=-`), so a
/// sync needs no space in a full cache.
pub fn rsync_args(opts: &RsyncOptions, upper: &Path, share: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "--archive".into(),
        // Every listed path changed: never let the size+mtime quick check skip one.
        "--ignore-times".into(),
        "--hard-links".into(),
        "--sparse".into(),
        "--delay-updates".into(),
        format!("--partial-dir={PARTIAL_DIR}").into(),
        "--force".into(),
        "--from0".into(),
        format!("--timeout={}", opts.timeout.as_secs().max(1)).into(),
    ];
    args.push("--files-from=-".into());
    if opts.caps.acls {
        args.push("--acls".into());
    }
    if opts.caps.xattrs {
        args.push("--xattrs".into());
    }
    if !opts.implied_dirs {
        // The directories above a listed path are the share's own: their attributes are
        // not ours to send (a directory of ours that changed is listed itself), and rsync
        // would otherwise look at each and set its times and ACLs.
        args.push("--no-implied-dirs".into());
    }
    if opts.fsync.known() {
        args.push("--fsync".into());
    }
    args.extend(opts.extra_args.iter().map(OsString::from));
    // After the extra arguments: a `--out-format`, `-i`, `-v` or `--info=name0` among them
    // does not replace or silence the report the settle reads (rsync keeps the last one
    // given). `-q` silences it for good: the settle then compares sizes and mtimes.
    args.push(format!("--out-format={OUT_FORMAT}").into());
    args.push("--info=name1".into());
    let mut src = upper.as_os_str().to_os_string();
    src.push("/");
    let mut dst = share.as_os_str().to_os_string();
    dst.push("/");
    args.push(src);
    args.push(dst);
    args
}

/// Finds a program on PATH (or checks an explicit path).
pub fn find_program(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let is_exec = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        let p = PathBuf::from(name);
        return is_exec(&p).then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_exec(p))
}

/// Whether rsync knows `--fsync`. Finding out runs `rsync --help`, which a mount would
/// otherwise wait for (a third of its time on an idle machine, more when a class mounts at
/// once): [`FsyncProbe::start`] runs it on a thread of its own, and the first sync waits
/// for its answer (or finds out itself).
#[derive(Debug, Clone)]
pub struct FsyncProbe(Arc<(PathBuf, Option<Arc<Launcher>>, std::sync::OnceLock<bool>)>);

impl FsyncProbe {
    /// Starts finding out for `binary` (run by `launcher`, if any), in the background.
    pub fn start(binary: &Path, launcher: Option<Arc<Launcher>>) -> Self {
        let probe = Self(Arc::new((
            binary.to_path_buf(),
            launcher,
            std::sync::OnceLock::new(),
        )));
        let bg = probe.clone();
        // Without a thread (none could be made), the first sync finds out itself.
        let _detached = std::thread::Builder::new()
            .name("rsync-probe".into())
            .spawn(move || bg.known());
        probe
    }

    /// An answer already known (the tests' rsync).
    pub fn answered(fsync: bool) -> Self {
        let lock = std::sync::OnceLock::new();
        let _ = lock.set(fsync);
        Self(Arc::new((PathBuf::new(), None, lock)))
    }

    /// The answer; waits for a probe under way, or runs it.
    pub fn known(&self) -> bool {
        *self
            .0
             .2
            .get_or_init(|| rsync_has_fsync(&self.0 .0, self.0 .1.as_deref()))
    }
}

/// True when this rsync knows `--fsync`.
pub fn rsync_has_fsync(binary: &Path, launcher: Option<&Launcher>) -> bool {
    let help = Program::new(binary).args(["--help"]).piped_output();
    launcher::spawn(launcher, &help)
        .and_then(|c| c.wait_with_output())
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("--fsync"))
        .unwrap_or(false)
}

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("rsync failed (exit {code}): {stderr}")]
    Rsync { code: i32, stderr: String },
    #[error("cannot start rsync {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Fs(#[from] crate::error::FsError),
    #[error("cannot pass the file list to rsync: {0}")]
    List(std::io::Error),
}

fn tail(text: &[u8], lines: usize) -> String {
    let s = String::from_utf8_lossy(text);
    let v: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    v[v.len().saturating_sub(lines)..].join(" | ")
}

/// `YYYY/MM/DD-HH:MM:SS` (rsync's `%M`, in UTC) as seconds since the epoch.
fn parse_listed_time(s: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(s).ok()?;
    let (date, time) = s.rsplit_once('-')?;
    let mut date = date.split('/');
    let (y, m, d) = (date.next()?, date.next()?, date.next()?);
    if date.next().is_some() {
        return None;
    }
    let mut time = time.split(':');
    let (hh, mm, ss) = (time.next()?, time.next()?, time.next()?);
    if time.next().is_some() {
        return None;
    }
    let num = |t: &str, max: i64| {
        (!t.is_empty() && t.len() <= 2 && t.bytes().all(|b| b.is_ascii_digit()))
            .then(|| t.parse::<i64>().ok())
            .flatten()
            .filter(|v| *v <= max)
    };
    let (m, d) = (
        num(m, 12).filter(|v| *v >= 1)?,
        num(d, 31).filter(|v| *v >= 1)?,
    );
    let (hh, mm, ss) = (num(hh, 23)?, num(mm, 59)?, num(ss, 60)?);
    let digits = y.strip_prefix('-').unwrap_or(y);
    if digits.is_empty() || digits.len() > 9 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let y: i64 = y.parse().ok()?;
    // Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// A name as rsync printed it, with its `\#ooo` escapes (three octal digits, one byte)
/// undone. rsync escapes a `\` that a `#` and three digits follow, so any such sequence is
/// an escape; one that is not octal is not rsync's, and the line is not read.
fn unescape_name(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let digits = s.get(i + 2..i + 5);
        if s[i] == b'\\'
            && s.get(i + 1) == Some(&b'#')
            && digits.is_some_and(|d| d.iter().all(u8::is_ascii_digit))
        {
            let d = digits?;
            if !d.iter().all(|b| (b'0'..=b'7').contains(b)) {
                return None;
            }
            let v = d.iter().fold(0u32, |v, b| v * 8 + u32::from(b - b'0'));
            out.push(u8::try_from(v).ok()?);
            i += 5;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    Some(out)
}

/// What rsync's report says it put at a path of the share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// A regular file sent (or hard-linked to one sent), with the mtime, in whole seconds,
    /// rsync listed for it and set on the share's copy.
    File(i64),
    /// A directory or symbolic link rsync made there (`S_IFDIR` or `S_IFLNK`).
    Made(u32),
}

/// One line of rsync's report ([`OUT_FORMAT`], without its newline): the path rsync put
/// something at, and what (see [`Put`]). Any other line (another item, an attribute change
/// of an existing directory, rsync's own messages, a line cut short) is None.
pub fn parse_sent_line(line: &[u8]) -> Option<(PathBuf, Put)> {
    let rest = line.strip_prefix(b"ccfs-sent|")?;
    let mut fields = rest.splitn(3, |b| *b == b'|');
    let (item, mtime, name) = (fields.next()?, fields.next()?, fields.next()?);
    // `%i`: the update (`>` sent here, `<` sent away, `h` a hard link, `c` made here),
    // then the type; a directory's name ends with `/`.
    let (put, name) = match (item.first()?, item.get(1)?) {
        (b'>' | b'<' | b'h', b'f') => (Put::File(parse_listed_time(mtime)?), name),
        (b'c', b'd') if item.get(2) == Some(&b'+') => {
            (Put::Made(libc::S_IFDIR), name.strip_suffix(b"/")?)
        }
        (b'c', b'L') if item.get(2) == Some(&b'+') => (Put::Made(libc::S_IFLNK), name),
        _ => return None,
    };
    let name = unescape_name(name)?;
    let bad = name.is_empty()
        || name.contains(&0)
        || name.starts_with(b"/")
        || name.ends_with(b"/")
        || name
            .split(|b| *b == b'/')
            .any(|c| c == b".." || c == b"." || c.is_empty());
    if bad {
        return None;
    }
    Some((PathBuf::from(OsString::from_vec(name)), put))
}

/// Reads rsync's report to its end: each path it put something at, and what. Lines that are not the report's, too long, or cut short (no newline: rsync was
/// killed while writing it) name nothing.
pub fn read_sent_report(out: impl Read) -> std::io::Result<HashMap<PathBuf, Put>> {
    let mut r = BufReader::new(out);
    let sent = read_report_lines(&mut r);
    if sent.is_err() {
        // rsync must never wait on a full pipe: what is left is read and dropped.
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    }
    sent
}

fn read_report_lines(r: &mut impl BufRead) -> std::io::Result<HashMap<PathBuf, Put>> {
    let mut sent = HashMap::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        let limit = (MAX_REPORT_LINE + 1) as u64;
        if r.take(limit).read_until(b'\n', &mut line)? == 0 {
            return Ok(sent);
        }
        match line.strip_suffix(b"\n") {
            Some(l) => {
                // What follows a carriage return (a `--progress` line ends with one; rsync
                // escapes it in names).
                let l = l.rsplit(|b| *b == b'\r').next().unwrap_or(l);
                if let Some((p, put)) = parse_sent_line(l) {
                    sent.insert(p, put);
                }
            }
            None if line.len() > MAX_REPORT_LINE => {
                r.skip_until(b'\n')?;
            }
            None => {}
        }
    }
}

/// Runs rsync over `files` (relative to `upper`); returns how the transfer ended and, when
/// it did not complete, why.
pub fn run_rsync(
    opts: &RsyncOptions,
    upper: &Path,
    share: &Path,
    files: &[PathBuf],
) -> Result<(Transfer, Option<String>), SyncError> {
    rsync_reported(opts, upper, share, files).map(|(t, why, _)| (t, why))
}

/// rsync's report of what it put at each path.
pub(crate) type Listed = HashMap<PathBuf, Put>;

/// [`run_rsync`], with rsync's report of what it put where besides (None when it could
/// not be read to its end): the report says what landed of a transfer that completed too,
/// which is what a sync of several transfers needs (see [`both`]).
pub(crate) fn rsync_reported(
    opts: &RsyncOptions,
    upper: &Path,
    share: &Path,
    files: &[PathBuf],
) -> Result<(Transfer, Option<String>, Option<Listed>), SyncError> {
    let args = rsync_args(opts, upper, share);
    tracing::info!(files = files.len(), "rsync to share");
    let mut program = Program::new(&opts.binary)
        .args(&args)
        // rsync's `%M` is local time: UTC, with no time zone file needed.
        .env("TZ", "UTC0")
        .piped_output();
    program.stdin = true;
    program.hold = opts.hold_fd;
    let mut child =
        launcher::spawn(opts.launcher.as_deref(), &program).map_err(|source| SyncError::Spawn {
            binary: opts.binary.clone(),
            source,
        })?;
    let mut list = Vec::new();
    for p in files {
        list.extend_from_slice(p.as_os_str().as_bytes());
        list.push(0);
    }
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| SyncError::List(std::io::Error::other("no stdin")))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| SyncError::List(std::io::Error::other("no stdout")))?;
    let feeder = std::thread::spawn(move || stdin.write_all(&list));
    let reader = std::thread::spawn(move || read_sent_report(stdout));
    let out = child.wait_with_output().map_err(SyncError::List)?;
    let fed = feeder
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("list writer panicked")));
    let report = reader
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("report reader panicked")));
    // What rsync said it sent settles a transfer that did not complete; without a
    // report read to its end, or one that names no file, each path is compared with
    // what was handed over.
    let listed = match report {
        Ok(sent) => Some(sent),
        Err(e) => {
            tracing::warn!("cannot read rsync's report of what it sent: {e}");
            None
        }
    };
    let partial = match &listed {
        Some(sent) if !sent.is_empty() => Transfer::Reported(sent.clone()),
        _ => Transfer::Incomplete,
    };
    if let Some(sig) = std::os::unix::process::ExitStatusExt::signal(&out.status) {
        return Ok((
            partial,
            Some(format!("rsync was killed by signal {sig}")),
            listed,
        ));
    }
    let code = out.status.code().unwrap_or(-1);
    if code == 23 && fed.is_ok() {
        if let Some(names) = default_acl_misses(&out.stderr) {
            if names
                .iter()
                .all(|n| files.contains(n) && source_is_not_a_directory(upper, n))
            {
                // rsync 3.5 asks for the default ACL of a directory it found on the share
                // after it replaced it by a hard link to a file it sent: only directories
                // have one, and a file sent in its place has none to lose. The settle
                // still checks every file against rsync's report.
                tracing::warn!(
                    "rsync exit 23 for the default ACL of what is no longer a directory: {}",
                    tail(&out.stderr, 4)
                );
                return Ok((partial, None, listed));
            }
        }
    }
    if code != 0 {
        return Ok((
            partial,
            Some(format!("rsync exit {code}: {}", tail(&out.stderr, 4))),
            listed,
        ));
    }
    if let Err(e) = fed {
        return Ok((
            partial,
            Some(format!("cannot pass the file list to rsync: {e}")),
            listed,
        ));
    }
    Ok((Transfer::Complete, None, listed))
}

/// The paths named when every error line rsync wrote (beside its exit-23 summary) is its
/// failure to read the default ACL of a path on the share that is no longer a directory
/// (`sys_acl_get_file` answers EACCES for a non-directory); None when any other line is.
fn default_acl_misses(stderr: &[u8]) -> Option<Vec<PathBuf>> {
    const MISS: (&[u8], &[u8]) = (
        b"rsync: [generator] get_acl: sys_acl_get_file(",
        b", ACL_TYPE_DEFAULT): Permission denied (13)",
    );
    const SUMMARY: &[u8] = b"rsync error: some files/attrs were not transferred ";
    let mut names = Vec::new();
    for line in stderr.split(|b| *b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) || line.starts_with(SUMMARY) {
            continue;
        }
        let name = line.strip_prefix(MISS.0)?.strip_suffix(MISS.1)?;
        names.push(PathBuf::from(OsStr::from_bytes(name)));
    }
    (!names.is_empty()).then_some(names)
}

/// Is the cache's `rel`, which rsync read as its source, something other than a directory
/// (so rsync had no default ACL to set there)? No when it cannot be told.
fn source_is_not_a_directory(upper: &Path, rel: &Path) -> bool {
    // A type check only: nothing is opened or changed, whatever the user made the path.
    std::fs::symlink_metadata(upper.join(rel)).is_ok_and(|m| !m.is_dir())
}

/// What the transfers of one sync (of different files, each with the report of what it
/// put where, when it was read) came to together: complete when each is (or there are
/// none); else what the reports say (a transfer that completed reported every file it was
/// given); else, with a report missing, each path is compared with what was handed over.
pub(crate) fn all_of(parts: Vec<(Transfer, Option<Listed>)>) -> Transfer {
    if parts.iter().all(|(t, _)| *t == Transfer::Complete) {
        return Transfer::Complete;
    }
    let mut all = Listed::new();
    for (t, listed) in parts {
        match (t, listed) {
            (Transfer::Reported(m), _) | (Transfer::Complete, Some(m)) => all.extend(m),
            _ => return Transfer::Incomplete,
        }
    }
    Transfer::Reported(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn the_transfers_of_one_sync_settle_together() {
        let one = |p: &str, t: i64| Listed::from([(PathBuf::from(p), Put::File(t))]);
        assert_eq!(all_of(Vec::new()), Transfer::Complete);
        assert_eq!(
            all_of(vec![
                (Transfer::Complete, Some(one(".a", 1))),
                (Transfer::Complete, None)
            ]),
            Transfer::Complete
        );
        // One complete, one cut short: what each reported.
        let mut both = one(".a", 1);
        both.extend(one(".b", 2));
        assert_eq!(
            all_of(vec![
                (Transfer::Complete, Some(one(".a", 1))),
                (Transfer::Reported(one(".b", 2)), Some(one(".b", 2)))
            ]),
            Transfer::Reported(both)
        );
        // A complete one whose report was not read: nothing to go by but the hand-over.
        assert_eq!(
            all_of(vec![
                (Transfer::Complete, None),
                (Transfer::Reported(one(".b", 2)), None)
            ]),
            Transfer::Incomplete
        );
        assert_eq!(
            all_of(vec![
                (Transfer::Incomplete, None),
                (Transfer::Complete, None)
            ]),
            Transfer::Incomplete
        );
    }

    fn opts(caps: ShareCaps) -> RsyncOptions {
        RsyncOptions {
            binary: PathBuf::from("rsync"),
            extra_args: vec!["--bwlimit=100".into()],
            timeout: Duration::from_secs(30),
            caps,
            fsync: FsyncProbe::answered(true),
            hold_fd: None,
            launcher: None,
            implied_dirs: false,
        }
    }

    #[test]
    fn argv_has_delay_updates_list_and_trailing_slashes() {
        let a = rsync_args(
            &opts(ShareCaps {
                xattrs: true,
                acls: false,
            }),
            Path::new("/c/upper"),
            Path::new("/share/alice"),
        );
        let a: Vec<String> = a.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        for want in [
            "--archive",
            "--ignore-times",
            "--delay-updates",
            "--hard-links",
            "--from0",
            "--xattrs",
            "--fsync",
            "--sparse",
            "--partial-dir=.ccfs-sync-partial~",
            "--no-implied-dirs",
        ] {
            assert!(a.contains(&want.to_string()), "{want} missing from {a:?}");
        }
        assert!(!a.contains(&"--acls".to_string()));
        assert!(!a.contains(&"--update".to_string()));
        assert!(a.contains(&"--files-from=-".to_string()));
        assert!(a.contains(&"--timeout=30".to_string()));
        assert_eq!(
            &a[a.len() - 5..],
            [
                "--bwlimit=100",
                "--out-format=ccfs-sent|%i|%M|%n",
                "--info=name1",
                "/c/upper/",
                "/share/alice/"
            ]
        );
    }

    #[test]
    fn implied_directories_are_sent_only_when_asked() {
        let has = |o: &RsyncOptions| {
            rsync_args(o, Path::new("/c/upper"), Path::new("/s"))
                .iter()
                .any(|a| a == "--no-implied-dirs")
        };
        let mut o = opts(ShareCaps::default());
        assert!(has(&o), "the share's directories are left alone");
        o.implied_dirs = true;
        assert!(
            !has(&o),
            "a directory missing on the share is made as ours is"
        );
    }

    #[test]
    fn the_report_format_comes_after_the_extra_arguments() {
        let mut o = opts(ShareCaps::default());
        o.extra_args = vec!["--out-format=%n".into(), "-i".into(), "--info=name0".into()];
        let a = rsync_args(&o, Path::new("/c/upper"), Path::new("/s/"));
        let a: Vec<String> = a.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        assert_eq!(
            &a[a.len() - 5..],
            [
                "--info=name0",
                "--out-format=ccfs-sent|%i|%M|%n",
                "--info=name1",
                "/c/upper/",
                "/s//"
            ]
        );
    }

    /// rsync's `%M` (UTC) read as seconds since the epoch; anything else is refused.
    #[test]
    fn listed_times_are_utc_seconds() {
        let t = |s: &str| parse_listed_time(s.as_bytes());
        assert_eq!(t("1970/01/01-00:00:00"), Some(0));
        assert_eq!(t("2000/02/29-01:02:03"), Some(951_782_400 + 3_723));
        assert_eq!(t("2026/11/21-21:58:54"), Some(1_795_298_334));
        assert_eq!(t("1969/12/31-23:59:59"), Some(-1));
        assert_eq!(t("12026/01/01-00:00:00").map(|s| s > 0), Some(true));
        for bad in [
            "",
            "2026/11/21 21:58:54",
            "2026/13/01-00:00:00",
            "2026/00/01-00:00:00",
            "2026/11/21-24:00:00",
            "2026/11/+1-00:00:00",
            "2026/11/21-00:00",
            "2026/11/21/1-00:00:00",
            "99999999999/01/01-00:00:00",
            "x026/11/21-21:58:54",
        ] {
            assert_eq!(t(bad), None, "{bad}");
        }
    }

    /// The report's lines: regular files (and hard links to them) sent, directories and
    /// symbolic links made, with the name last and its escapes undone; everything else
    /// names nothing.
    #[test]
    fn report_lines_name_what_rsync_put_in_place() {
        let line = |s: &[u8]| parse_sent_line(s);
        let p = |b: &[u8]| PathBuf::from(std::ffi::OsStr::from_bytes(b));
        assert_eq!(
            line(b"ccfs-sent|>f+++++++++|1970/01/01-00:00:10|.bashrc"),
            Some((p(b".bashrc"), Put::File(10)))
        );
        assert_eq!(
            line(b"ccfs-sent|hf+++++++++|1970/01/01-00:00:10|.a/b"),
            Some((p(b".a/b"), Put::File(10)))
        );
        // `|` and tabs stay in the name; a newline, a high byte and a `\` before `#101`
        // come as escapes.
        assert_eq!(
            line(b"ccfs-sent|>f.st......|1970/01/01-00:00:10|.x|y\tz\\#012w\\#377\\#134#101"),
            Some((p(b".x|y\tz\nw\xff\\#101"), Put::File(10)))
        );
        // A backslash and `#` not followed by three digits are themselves.
        assert_eq!(
            line(b"ccfs-sent|>f+++++++++|1970/01/01-00:00:10|.a\\#1x"),
            Some((p(b".a\\#1x"), Put::File(10)))
        );
        // A directory or symbolic link made: its type; one that was there already only had
        // attributes changed, which names nothing.
        assert_eq!(
            line(b"ccfs-sent|cd+++++++++|1970/01/01-00:00:10|.config/"),
            Some((p(b".config"), Put::Made(libc::S_IFDIR)))
        );
        assert_eq!(
            line(b"ccfs-sent|cL+++++++++|1970/01/01-00:00:10|.link"),
            Some((p(b".link"), Put::Made(libc::S_IFLNK)))
        );
        for bad in [
            &b"ccfs-sent|.d..t......|1970/01/01-00:00:10|.config/"[..],
            b"ccfs-sent|cd+++++++++|1970/01/01-00:00:10|./",
            b"ccfs-sent|.L..t......|1970/01/01-00:00:10|.link",
            b"ccfs-sent|.f..t......|1970/01/01-00:00:10|.same",
            b"ccfs-sent|*deleting  |1970/01/01-00:00:10|.gone",
            b"ccfs-sent|>f+++++++++|1970/01/01-00:00:10|",
            b"ccfs-sent|>f+++++++++|1970/01/01-00:00:10|/etc/passwd",
            b"ccfs-sent|>f+++++++++|1970/01/01-00:00:10|.a/../../x",
            b"ccfs-sent|>f+++++++++|1970/01/01-00:00:10|.a//b",
            b"ccfs-sent|>f+++++++++|1970/01/01-00:00:10|.a\\#000",
            b"ccfs-sent|>f+++++++++|1970/01/01-00:00:10|.a\\#089",
            b"ccfs-sent|>f+++++++++|1970/01/01-00:00:10|.a\\#400",
            b"ccfs-sent|>f+++++++++|yesterday|.a",
            b"ccfs-sent|>f+++++++++|1970/01/01-00:00:10",
            b"sending incremental file list",
            b".bashrc",
            b"xccfs-sent|>f+++++++++|1970/01/01-00:00:10|.a",
        ] {
            assert_eq!(line(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    /// A whole report through a pipe: lines that are not the report's, one too long, and a
    /// last line cut short name nothing, and do not hide the lines after them.
    #[test]
    fn a_report_is_read_to_its_end_line_by_line() {
        let mut text = Vec::new();
        text.extend_from_slice(b"sending incremental file list\n");
        text.extend_from_slice(b"ccfs-sent|>f+++++++++|1970/01/01-00:00:01|.one\n");
        text.extend_from_slice(b"ccfs-sent|>f+++++++++|1970/01/01-00:00:02|.");
        text.extend(std::iter::repeat_n(b'x', MAX_REPORT_LINE));
        text.extend_from_slice(b"\nccfs-sent|>f+++++++++|1970/01/01-00:00:03|.two\n");
        text.extend_from_slice(
            b"\r  12 100% (xfr#1)\rccfs-sent|>f+++++++++|1970/01/01-00:00:04|.one\n",
        );
        text.extend_from_slice(b"ccfs-sent|>f+++++++++|1970/01/01-00:00:05|.cut");
        let got = read_sent_report(&text[..]).expect("read");
        let want: HashMap<PathBuf, Put> = [(".one", 4), (".two", 3)]
            .into_iter()
            .map(|(p, t)| (PathBuf::from(p), Put::File(t)))
            .collect();
        assert_eq!(got, want);
    }

    /// The real rsync, with ccfs's command line, over names with every kind of byte rsync
    /// escapes or not: the report names each file sent, by its own name, with its mtime.
    #[test]
    fn the_real_rsyncs_report_names_every_file_it_sent() {
        let Some(binary) = find_program("rsync") else {
            eprintln!("no rsync: skipped");
            return;
        };
        let tmp = tempfile::tempdir().expect("tmp");
        let (upper, share) = (tmp.path().join("upper"), tmp.path().join("share"));
        std::fs::create_dir_all(upper.join(".d")).expect("mkdir");
        std::fs::create_dir(&share).expect("mkdir");
        let names: Vec<&[u8]> = vec![
            b".plain",
            b".with space|and\tbar",
            b".new\nline",
            b".\xffhigh\x7fdel",
            b".esc\\#101",
            b".d/inner",
        ];
        let mut files = Vec::new();
        let mut want = HashMap::new();
        for (i, n) in names.iter().enumerate() {
            let rel = PathBuf::from(std::ffi::OsStr::from_bytes(n));
            let at = upper.join(&rel);
            std::fs::write(&at, n).expect("write");
            let secs = 1_000_000_000 + 1000 * i as u64;
            let t = std::fs::FileTimes::new()
                .set_modified(UNIX_EPOCH + Duration::from_nanos(secs * 1_000_000_000 + 7));
            std::fs::File::options()
                .write(true)
                .open(&at)
                .and_then(|f| f.set_times(t))
                .expect("times");
            want.insert(rel.clone(), Put::File(secs as i64));
            files.push(rel);
        }
        std::os::unix::fs::symlink("target", upper.join(".link")).expect("symlink");
        files.push(PathBuf::from(".link"));
        files.push(PathBuf::from(".d"));

        files.sort();
        let mut o = opts(ShareCaps::default());
        o.binary = binary;
        o.extra_args = vec!["-v".into(), "--info=name0".into(), "--progress".into()];
        o.fsync = FsyncProbe::answered(false);
        let (t, why) = run_rsync(&o, &upper, &share, &files).expect("rsync");
        assert_eq!(t, Transfer::Complete, "{why:?}");
        // A file that vanished: rsync fails (exit 23) and its report settles the rest.
        files.push(PathBuf::from(".vanished"));
        let (t, why) = run_rsync(&o, &upper, &share, &files).expect("rsync");
        assert!(why.is_some_and(|w| w.contains("exit 23")));
        assert_eq!(t, Transfer::Reported(want));
    }

    #[test]
    fn only_default_acl_misses_on_their_own_pass() {
        let miss = |n: &str| {
            format!("rsync: [generator] get_acl: sys_acl_get_file({n}, ACL_TYPE_DEFAULT): Permission denied (13)\n")
        };
        let summary = "rsync error: some files/attrs were not transferred (see previous errors) (code 23) at main.c(1394) [sender=3.5.0]\n";
        let both = format!("{}{}{summary}", miss(".c/e"), miss(".d/x y"));
        assert_eq!(
            default_acl_misses(both.as_bytes()),
            Some(vec![PathBuf::from(".c/e"), PathBuf::from(".d/x y")])
        );
        // Any other error, or an access ACL, or another errno: not this case.
        let other = format!(
            "{}rsync: [receiver] mkstemp \".c/f\" failed: No space left on device (28)\n{summary}",
            miss(".c/e")
        );
        assert_eq!(default_acl_misses(other.as_bytes()), None);
        let access = miss(".c/e").replace("DEFAULT", "ACCESS");
        assert_eq!(default_acl_misses(access.as_bytes()), None);
        let errno = miss(".c/e").replace("Permission denied (13)", "Input/output error (5)");
        assert_eq!(default_acl_misses(errno.as_bytes()), None);
        assert_eq!(default_acl_misses(summary.as_bytes()), None);
    }

    #[test]
    fn find_program_checks_path_and_explicit_paths() {
        assert!(find_program("sh").is_some());
        assert!(find_program("/bin/sh").is_some());
        assert!(find_program("/nonexistent/rsync").is_none());
        assert!(find_program("no-such-program-ccfs").is_none());
    }
}
