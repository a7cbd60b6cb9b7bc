//! The TOML configuration file, lowered into typed settings before anything runs.
//!
//! Every key, its default and its meaning: `deploy/etc/ccfs.toml`, installed as
//! [`SYSTEM_CONFIG`] (a test checks that file against the defaults here).

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::policy::{Policy, PolicyError};

/// The machine's configuration, read when no `--config` is given (if it exists).
pub const SYSTEM_CONFIG: &str = "/etc/ccfs/ccfs.toml";

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PathsSection {
    pub dotfiles_cached: bool,
    pub cached: Vec<String>,
    pub passthrough: Vec<String>,
    pub local_only: Vec<String>,
    pub by_block_from_kib: u64,
    pub by_block_fill_after_secs: u64,
    pub by_block_fill_kib_per_sec: u64,
}

impl Default for PathsSection {
    fn default() -> Self {
        Self {
            dotfiles_cached: true,
            cached: Vec::new(),
            passthrough: Vec::new(),
            local_only: crate::policy::LOCAL_ONLY
                .iter()
                .map(|g| g.to_string())
                .collect(),
            by_block_from_kib: 1024,
            by_block_fill_after_secs: 10,
            by_block_fill_kib_per_sec: 4096,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SyncSection {
    pub rsync: String,
    pub extra_args: Vec<String>,
    pub timeout_secs: u64,
    pub interval_secs: u64,
    pub keep_copies_mib: u64,
}

impl Default for SyncSection {
    fn default() -> Self {
        Self {
            rsync: "rsync".to_string(),
            extra_args: Vec::new(),
            timeout_secs: 600,
            interval_secs: 600,
            keep_copies_mib: 256,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MountSection {
    pub threads: usize,
    pub attr_timeout_ms: u64,
    pub cache_timeout_ms: u64,
    pub kernel_passthrough: bool,
    pub readdirplus: Readdirplus,
    pub allow_other: bool,
    pub count_paths: usize,
    pub transport: Transport,
}

/// Whether listings carry their entries' attributes (READDIRPLUS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", try_from = "ReaddirplusWord")]
pub enum Readdirplus {
    /// The first read of a directory carries them while the mount's programs look at the
    /// entries of what they list (`ls -l`, a file manager), and not while they want the
    /// names alone (`find`, a plain `ls`); see `fuse/habit.rs`.
    Adapt,
    /// Whenever the kernel asks (`true`).
    Always,
    /// Never: each entry a program looks at is a lookup of its own (`false`).
    Never,
}

/// `readdirplus` as written: a word, or true (always) or false (never).
#[derive(Deserialize)]
#[serde(untagged)]
enum ReaddirplusWord {
    Flag(bool),
    Word(String),
}

impl TryFrom<ReaddirplusWord> for Readdirplus {
    type Error = String;
    fn try_from(w: ReaddirplusWord) -> Result<Self, String> {
        match w {
            ReaddirplusWord::Flag(true) => Ok(Readdirplus::Always),
            ReaddirplusWord::Flag(false) => Ok(Readdirplus::Never),
            ReaddirplusWord::Word(w) => match w.as_str() {
                "adapt" => Ok(Readdirplus::Adapt),
                "always" => Ok(Readdirplus::Always),
                "never" => Ok(Readdirplus::Never),
                other => Err(format!(
                    "readdirplus = {other:?}: say \"adapt\", \"always\" or \"never\" (or true or false)"
                )),
            },
        }
    }
}

/// How requests travel between the kernel and the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// A read and a write of /dev/fuse per request.
    DevFuse,
    /// FUSE over io_uring (Linux 6.14 or later, the fuse module's `enable_uring` on): one
    /// ring entry per serving thread; /dev/fuse when the kernel refuses.
    IoUring,
}

impl Default for Transport {
    /// /dev/fuse; a build with the `ring-default` feature (the test suite's second run)
    /// takes FUSE over io_uring instead.
    fn default() -> Self {
        if cfg!(feature = "ring-default") {
            Transport::IoUring
        } else {
            Transport::DevFuse
        }
    }
}

impl Default for MountSection {
    fn default() -> Self {
        Self {
            threads: 4,
            attr_timeout_ms: 10_000,
            cache_timeout_ms: 10_000,
            kernel_passthrough: true,
            readdirplus: Readdirplus::Adapt,
            allow_other: false,
            count_paths: 0,
            transport: Transport::default(),
        }
    }
}

/// Where the homes are: on the share, mounted, and where their caches go.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HomesSection {
    pub share_root: PathBuf,
    pub home_root: PathBuf,
    pub cache_root: PathBuf,
}

impl Default for HomesSection {
    fn default() -> Self {
        Self {
            share_root: PathBuf::from("/netshare/users"),
            home_root: PathBuf::from("/home"),
            cache_root: PathBuf::from("/var/tmp/ccfs"),
        }
    }
}

/// What a login does when ccfs cannot mount the home.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    /// The home on the share, bind-mounted at the home (no cache).
    Share,
    /// Nothing: the home stays what it was (usually an empty directory).
    None,
}

/// The PAM session hook (`ccfs pam-session`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionSection {
    pub min_uid: u32,
    pub fallback: Fallback,
    pub login_timeout_secs: u64,
    pub wait_previous_secs: u64,
    pub logout_timeout_secs: u64,
    pub busy_timeout_secs: u64,
    pub systemd_scope: bool,
}

impl Default for SessionSection {
    fn default() -> Self {
        Self {
            min_uid: 1000,
            fallback: Fallback::Share,
            login_timeout_secs: 60,
            wait_previous_secs: 20,
            logout_timeout_secs: 300,
            busy_timeout_secs: 5,
            systemd_scope: true,
        }
    }
}

/// Root's recovery of every cache (`ccfs recover` without a cache or user: the boot's,
/// before logins).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecoverySection {
    /// The longest the recovery of all caches takes; caches not reached by then are left
    /// for their users' next logins.
    pub all_caches_secs: u64,
    /// The longest one cache's recovery takes in it; one not done by then is stopped
    /// (as a crash would stop it: nothing is lost) and left for its user's next login.
    pub per_cache_secs: u64,
}

impl Default for RecoverySection {
    fn default() -> Self {
        Self {
            all_caches_secs: 120,
            per_cache_secs: 30,
        }
    }
}

/// The raw file, as written by the admin.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConfigFile {
    pub homes: HomesSection,
    pub paths: PathsSection,
    pub sync: SyncSection,
    pub mount: MountSection,
    pub session: SessionSection,
    pub recovery: RecoverySection,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config file {path}: {source}")]
    Policy { path: PathBuf, source: PolicyError },
    #[error("invalid config file {path}: {message}")]
    Value { path: PathBuf, message: String },
    /// Root was asked to read a config file someone else could change.
    #[error(
        "config file {path} {problem}, and root only reads a config that only root can change"
    )]
    NotRootOnly { path: PathBuf, problem: String },
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub policy: Policy,
    pub rsync: String,
    pub rsync_extra_args: Vec<String>,
    pub rsync_timeout: Duration,
    /// Periodic sync while mounted; None: only at logout.
    pub sync_interval: Option<Duration>,
    /// Bytes of clean copies a logout keeps for the next login.
    pub keep_copies: u64,
    /// A cached file at least this long is cached by block (0: none is).
    pub by_block_from: u64,
    /// A changed file held by block gets the blocks it lacks from its base once the daemon
    /// has served it this long, at `by_block_fill_rate` bytes a second (None: never).
    pub by_block_fill_after: Duration,
    pub by_block_fill_rate: Option<u64>,
    pub threads: usize,
    /// How long the kernel may keep what the share holds.
    pub attr_timeout: Duration,
    /// How long the kernel may keep what the cache holds.
    pub cache_timeout: Duration,
    /// Kernel passthrough of open files (see [`crate::backing`]).
    pub kernel_passthrough: bool,
    /// Whether listings carry each entry's attributes (READDIRPLUS).
    pub readdirplus: Readdirplus,
    /// A mount root makes for a user lets other local users in (see the file's doc).
    pub allow_other: bool,
    /// Requests are counted by the first N components of their path too (0: not).
    pub count_paths: usize,
    /// How requests travel (`[mount] transport`).
    pub transport: Transport,
    /// Where homes are (`[homes]`), for commands given a user instead of paths.
    pub homes: HomesSection,
    /// The PAM session hook's choices (`[session]`).
    pub session: SessionSection,
    /// The time limits of root's recovery of every cache (`[recovery]`).
    pub recovery: RecoverySection,
    /// The effective file: every key with its value (`ccfs config check` prints it).
    pub file: ConfigFile,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            policy: Policy::default_policy(),
            rsync: "rsync".to_string(),
            rsync_extra_args: Vec::new(),
            rsync_timeout: Duration::from_secs(600),
            sync_interval: Some(Duration::from_secs(600)),
            keep_copies: 256 << 20,
            by_block_from: 1 << 20,
            by_block_fill_after: Duration::from_secs(10),
            by_block_fill_rate: Some(4096 << 10),
            threads: 4,
            attr_timeout: Duration::from_millis(10_000),
            cache_timeout: Duration::from_millis(10_000),
            kernel_passthrough: true,
            readdirplus: Readdirplus::Adapt,
            allow_other: false,
            count_paths: 0,
            transport: Transport::default(),
            homes: HomesSection::default(),
            session: SessionSection::default(),
            recovery: RecoverySection::default(),
            file: ConfigFile::default(),
        }
    }
}

impl Settings {
    /// Parses and validates config text; `path` is only used in messages.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let raw: ConfigFile = toml::from_str(text).map_err(|e| {
            // The line the error is on, so the message names the key.
            let place = e.span().map(|span| {
                let line = text[..span.start.min(text.len())].matches('\n').count();
                let shown: String = text
                    .lines()
                    .nth(line)
                    .unwrap_or("")
                    .trim()
                    .chars()
                    .take(80)
                    .collect();
                format!("line {} ({shown}): ", line + 1)
            });
            ConfigError::Parse {
                path: path.to_path_buf(),
                message: format!("{}{}", place.unwrap_or_default(), e.message()),
            }
        })?;
        Self::lower(raw, path)
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text, path)
    }

    /// Loads a config file for root, who must not read what anyone else could change: the
    /// file (symlinks resolved) and every directory above it must belong to root and not
    /// be writable by group or others. A sticky directory of root's (like /tmp) may hold
    /// it, since nobody else can replace root's file there. The file read is the one
    /// checked (opened without following a symlink, checked again through the open file).
    pub fn load_root_only(path: &Path) -> Result<Self, ConfigError> {
        use std::io::Read;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let read_err = |source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        };
        let not_root_only = |problem: String| ConfigError::NotRootOnly {
            path: path.to_path_buf(),
            problem,
        };
        let real = path.canonicalize().map_err(read_err)?;
        let mut dir = real.parent();
        while let Some(d) = dir {
            let m = std::fs::symlink_metadata(d).map_err(read_err)?;
            if m.uid() != 0 {
                return Err(not_root_only(format!(
                    "lies in {} of uid {}",
                    d.display(),
                    m.uid()
                )));
            }
            let sticky = m.mode() & 0o1000 != 0;
            if m.mode() & 0o022 != 0 && !sticky {
                return Err(not_root_only(format!(
                    "lies in {}, writable by group or others (mode {:o})",
                    d.display(),
                    m.mode() & 0o7777
                )));
            }
            dir = d.parent();
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&real)
            .map_err(read_err)?;
        let m = file.metadata().map_err(read_err)?;
        if !m.is_file() {
            return Err(not_root_only("is not a regular file".to_string()));
        }
        if m.uid() != 0 {
            return Err(not_root_only(format!("belongs to uid {}", m.uid())));
        }
        if m.mode() & 0o022 != 0 {
            return Err(not_root_only(format!(
                "is writable by group or others (mode {:o})",
                m.mode() & 0o7777
            )));
        }
        let mut text = String::new();
        file.take(1 << 20)
            .read_to_string(&mut text)
            .map_err(read_err)?;
        Self::from_toml(&text, path)
    }

    fn lower(raw: ConfigFile, path: &Path) -> Result<Self, ConfigError> {
        let value_err = |message: &str| ConfigError::Value {
            path: path.to_path_buf(),
            message: message.to_string(),
        };
        if raw.mount.count_paths > 16 {
            return Err(value_err(
                "[mount].count_paths must be between 0 (off) and 16 path components",
            ));
        }
        if raw.mount.threads == 0 || raw.mount.threads > 256 {
            return Err(value_err("[mount].threads must be between 1 and 256"));
        }
        // A day at most: the kernel would keep a stale name of the share that long.
        for (key, ms) in [
            ("attr_timeout_ms", raw.mount.attr_timeout_ms),
            ("cache_timeout_ms", raw.mount.cache_timeout_ms),
        ] {
            if ms > 86_400_000 {
                return Err(value_err(&format!(
                    "[mount].{key} must be at most 86400000 (a day)"
                )));
            }
        }
        if raw.sync.rsync.trim().is_empty() {
            return Err(value_err("[sync].rsync must name the rsync binary"));
        }
        if raw.sync.timeout_secs == 0 {
            return Err(value_err("[sync].timeout_secs must be at least 1"));
        }
        // (Each argument costs its length and 4 bytes on the way to rsync.)
        let extra: usize = raw.sync.extra_args.iter().map(|a| a.len() + 4).sum();
        if extra > crate::sys::launcher::MAX_EXTRA_ARGS {
            return Err(value_err(&format!(
                "[sync].extra_args take {extra} bytes; at most {} are passed to rsync",
                crate::sys::launcher::MAX_EXTRA_ARGS
            )));
        }
        if raw.sync.extra_args.iter().any(|a| a.contains('\0')) {
            return Err(value_err(
                "[sync].extra_args: an argument holds a NUL character, which no program argument can",
            ));
        }
        check_homes(&raw.homes).map_err(|m| value_err(&m))?;
        let s = &raw.session;
        for (key, v, min, max) in [
            ("login_timeout_secs", s.login_timeout_secs, 1, 3600),
            ("wait_previous_secs", s.wait_previous_secs, 0, 600),
            ("logout_timeout_secs", s.logout_timeout_secs, 1, 86_400),
            ("busy_timeout_secs", s.busy_timeout_secs, 0, 600),
        ] {
            if v < min || v > max {
                return Err(value_err(&format!(
                    "[session].{key} must be between {min} and {max} seconds"
                )));
            }
        }
        let r = &raw.recovery;
        for (key, v) in [
            ("all_caches_secs", r.all_caches_secs),
            ("per_cache_secs", r.per_cache_secs),
        ] {
            if !(1..=3600).contains(&v) {
                return Err(value_err(&format!(
                    "[recovery].{key} must be between 1 and 3600 seconds"
                )));
            }
        }
        if r.per_cache_secs > r.all_caches_secs {
            return Err(value_err(
                "[recovery].per_cache_secs must be at most all_caches_secs",
            ));
        }
        let policy = Policy::new(
            raw.paths.dotfiles_cached,
            &raw.paths.cached,
            &raw.paths.passthrough,
            &raw.paths.local_only,
        )
        .map_err(|source| ConfigError::Policy {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            policy,
            file: raw.clone(),
            homes: raw.homes,
            session: raw.session,
            recovery: raw.recovery,
            rsync: raw.sync.rsync,
            rsync_extra_args: raw.sync.extra_args,
            rsync_timeout: Duration::from_secs(raw.sync.timeout_secs),
            sync_interval: (raw.sync.interval_secs > 0)
                .then(|| Duration::from_secs(raw.sync.interval_secs)),
            keep_copies: raw.sync.keep_copies_mib.saturating_mul(1 << 20),
            by_block_from: raw.paths.by_block_from_kib.saturating_mul(1 << 10),
            by_block_fill_after: Duration::from_secs(raw.paths.by_block_fill_after_secs),
            by_block_fill_rate: (raw.paths.by_block_fill_kib_per_sec > 0)
                .then(|| raw.paths.by_block_fill_kib_per_sec.saturating_mul(1 << 10)),
            threads: raw.mount.threads,
            attr_timeout: Duration::from_millis(raw.mount.attr_timeout_ms),
            cache_timeout: Duration::from_millis(raw.mount.cache_timeout_ms),
            kernel_passthrough: raw.mount.kernel_passthrough,
            readdirplus: raw.mount.readdirplus,
            allow_other: raw.mount.allow_other,
            count_paths: raw.mount.count_paths,
            transport: raw.mount.transport,
        })
    }
}

/// `[homes]`: three absolute, distinct places, none inside another (a cache inside the
/// share, or homes mounted inside the share, would feed ccfs its own output).
fn check_homes(h: &HomesSection) -> Result<(), String> {
    let keys = [
        ("share_root", &h.share_root),
        ("home_root", &h.home_root),
        ("cache_root", &h.cache_root),
    ];
    for (key, p) in keys {
        let normal = p
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !p.is_absolute() || !normal || p == Path::new("/") {
            return Err(format!(
                "[homes].{key} must be an absolute path below / without . or .. (it is {:?})",
                p
            ));
        }
    }
    for (i, (a, pa)) in keys.iter().enumerate() {
        for (b, pb) in &keys[i + 1..] {
            if pa.starts_with(pb) || pb.starts_with(pa) {
                return Err(format!(
                    "[homes].{a} ({}) and [homes].{b} ({}) overlap: give each its own place",
                    pa.display(),
                    pb.display()
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PathClass;

    #[test]
    fn empty_file_gives_documented_defaults() {
        let s = Settings::from_toml("", Path::new("c.toml")).expect("defaults");
        assert_eq!(s.threads, 4);
        assert_eq!(
            s.policy.classify(Path::new(".cache/x")),
            PathClass::LocalOnly
        );
        assert_eq!(s.policy.classify(Path::new(".bashrc")), PathClass::Cached);
        // Databases are cached like any dotfile, held by block from 1 MiB on; the
        // shared-memory index of one in WAL mode stays on the workstation.
        for db in [
            ".mozilla/firefox/x.default/places.sqlite",
            ".mozilla/firefox/x.default/places.sqlite-wal",
            ".mozilla/firefox/x.default/storage/default/a/idb/1.sqlite",
            ".app.sqlite-journal",
        ] {
            assert_eq!(s.policy.classify(Path::new(db)), PathClass::Cached, "{db}");
        }
        assert_eq!(
            s.policy
                .classify(Path::new(".mozilla/firefox/x.default/places.sqlite-shm")),
            PathClass::LocalOnly
        );
        assert_eq!(s.by_block_from, 1 << 20);
        assert_eq!(
            s.policy.classify(Path::new(".cache/x/y.sqlite")),
            PathClass::LocalOnly
        );
        assert_eq!(
            Policy::default_policy().classify(Path::new(".mozilla/places.sqlite")),
            PathClass::Cached
        );
        // The databases-passed-through variant: its list given, they go to the share.
        let list: Vec<String> = crate::policy::SQLITE_DATABASES
            .iter()
            .map(|g| format!("{g:?}"))
            .collect();
        let variant = Settings::from_toml(
            &format!("[paths]\npassthrough = [{}]\n", list.join(", ")),
            Path::new("c.toml"),
        )
        .expect("valid");
        for db in [".mozilla/places.sqlite", ".mozilla/places.sqlite-wal"] {
            assert_eq!(
                variant.policy.classify(Path::new(db)),
                PathClass::Passthrough,
                "{db}"
            );
        }
        assert_eq!(
            variant
                .policy
                .classify(Path::new(".mozilla/firefox/x.default/places.sqlite.bak")),
            PathClass::Cached
        );
    }

    #[test]
    fn sections_are_read() {
        let s = Settings::from_toml(
            "[paths]\npassthrough = [\".thunderbird/**\"]\n[mount]\nthreads = 8\n[sync]\nextra_args=[\"--bwlimit=1000\"]\n",
            Path::new("c.toml"),
        )
        .expect("valid");
        assert_eq!(s.threads, 8);
        assert_eq!(s.sync_interval, Some(Duration::from_secs(600)));
        let off =
            Settings::from_toml("[sync]\ninterval_secs = 0\n", Path::new("c.toml")).expect("valid");
        assert_eq!(off.sync_interval, None);
        assert_eq!(off.keep_copies, 256 << 20, "the default");
        let none = Settings::from_toml("[sync]\nkeep_copies_mib = 0\n", Path::new("c.toml"))
            .expect("valid");
        assert_eq!(none.keep_copies, 0);
        assert_eq!(s.rsync_extra_args, vec!["--bwlimit=1000".to_string()]);
        assert_eq!(
            s.policy.classify(Path::new(".thunderbird/x")),
            PathClass::Passthrough
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        let e =
            Settings::from_toml("[paths]\ncahced = []\n", Path::new("c.toml")).expect_err("typo");
        assert!(e.to_string().contains("cahced"), "{e}");
        let e =
            Settings::from_toml("[mount]\nthreads = 0\n", Path::new("c.toml")).expect_err("zero");
        assert!(e.to_string().contains("threads"), "{e}");
        let e = Settings::from_toml("[mount]\ncount_paths = 17\n", Path::new("c.toml"))
            .expect_err("too deep");
        assert!(e.to_string().contains("count_paths"), "{e}");
        let e = Settings::from_toml("[paths]\nlocal_only = [\"[\"]\n", Path::new("c.toml"))
            .expect_err("glob");
        assert!(e.to_string().contains("local_only"), "{e}");
        let e = Settings::from_toml("not toml at all [", Path::new("c.toml")).expect_err("syntax");
        assert!(e.to_string().contains("c.toml"), "{e}");
        let long = format!("[sync]\nextra_args = [\"--{}\"]\n", "x".repeat(70_000));
        let e = Settings::from_toml(&long, Path::new("c.toml")).expect_err("too long");
        assert!(e.to_string().contains("extra_args"), "{e}");
        let many = format!(
            "[sync]\nextra_args = [{}]\n",
            vec!["\"-t\""; 21_800].join(",")
        );
        let e = Settings::from_toml(&many, Path::new("c.toml")).expect_err("too many");
        assert!(e.to_string().contains("extra_args"), "{e}");
        let nul = "[sync]\nextra_args = [\"--a\\u0000b\"]\n";
        let e = Settings::from_toml(nul, Path::new("c.toml")).expect_err("NUL");
        assert!(e.to_string().contains("NUL"), "{e}");
    }

    /// The shipped /etc/ccfs/ccfs.toml documents every key with its default: as shipped
    /// (all commented out) and with every key uncommented it gives the built-in defaults,
    /// and it names every key there is.
    #[test]
    fn shipped_config_documents_every_key_with_its_default() {
        let shipped = include_str!("../../deploy/etc/ccfs.toml");
        let path = Path::new(SYSTEM_CONFIG);
        let as_shipped = Settings::from_toml(shipped, path).expect("shipped file parses");
        assert_eq!(as_shipped.file, ConfigFile::default());
        let key = |l: &str| {
            let rest = l.strip_prefix('#')?;
            let (k, _) = rest.split_once(" = ")?;
            k.chars()
                .all(|c| c.is_ascii_lowercase() || c == '_')
                .then(|| k.to_string())
        };
        let uncommented: String = shipped
            .lines()
            .map(|l| match key(l) {
                Some(_) => format!("{}\n", &l[1..]),
                None => format!("{l}\n"),
            })
            .collect();
        let all = Settings::from_toml(&uncommented, path).expect("uncommented file parses");
        assert_eq!(
            all.file,
            ConfigFile::default(),
            "a documented default is wrong"
        );
        let mut documented: Vec<String> = shipped.lines().filter_map(key).collect();
        documented.sort();
        let defaults = toml::Value::try_from(ConfigFile::default()).expect("serializes");
        let mut known: Vec<String> = defaults
            .as_table()
            .expect("table")
            .values()
            .flat_map(|section| section.as_table().expect("section").keys().cloned())
            .collect();
        known.sort();
        assert_eq!(documented, known, "keys documented vs keys that exist");
    }

    #[test]
    fn homes_and_session_are_validated() {
        let bad = |text: &str, want: &str| {
            let e = Settings::from_toml(text, Path::new("c.toml")).expect_err(text);
            assert!(e.to_string().contains(want), "{text}: {e}");
        };
        bad(
            "[homes]\nshare_root = \"netshare\"\n",
            "share_root must be an absolute",
        );
        bad(
            "[homes]\nhome_root = \"/\"\n",
            "home_root must be an absolute",
        );
        bad(
            "[homes]\nhome_root = \"/home/../etc\"\n",
            "home_root must be an absolute",
        );
        bad("[homes]\ncache_root = \"/netshare/users/.c\"\n", "overlap");
        bad("[homes]\nshare_root = \"/home/share\"\n", "overlap");
        bad("[session]\nlogin_timeout_secs = 0\n", "login_timeout_secs");
        bad("[recovery]\nall_caches_secs = 0\n", "all_caches_secs");
        bad(
            "[recovery]\nall_caches_secs = 10\nper_cache_secs = 20\n",
            "per_cache_secs must be at most all_caches_secs",
        );
        bad("[session]\nfallback = \"tmpfs\"\n", "fallback");
        let s = Settings::from_toml(
            "[homes]\nshare_root = \"/srv/homes\"\n[session]\nfallback = \"none\"\nmin_uid = 500\n",
            Path::new("c.toml"),
        )
        .expect("valid");
        assert_eq!(s.homes.share_root, Path::new("/srv/homes"));
        assert_eq!(s.homes.home_root, Path::new("/home"), "the default");
        assert_eq!(s.session.fallback, Fallback::None);
        assert_eq!(s.session.min_uid, 500);
    }

    /// Root reads only a config that only root can change (these tests run as root).
    #[test]
    fn root_reads_only_a_config_only_root_can_change() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().expect("tmp");
        let ok = tmp.path().join("ok.toml");
        std::fs::write(&ok, "[mount]\nthreads = 2\n").expect("write");
        std::fs::set_permissions(&ok, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let s = Settings::load_root_only(&ok).expect("root's 0644 file in root's dir");
        assert_eq!(s.threads, 2);
        // Writable by others.
        std::fs::set_permissions(&ok, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let e = Settings::load_root_only(&ok).expect_err("0666");
        assert!(matches!(e, ConfigError::NotRootOnly { .. }), "{e}");
        assert!(e.to_string().contains("666"), "{e}");
        // Another owner.
        std::fs::set_permissions(&ok, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        std::os::unix::fs::chown(&ok, Some(65534), None).expect("chown");
        let e = Settings::load_root_only(&ok).expect_err("nobody's file");
        assert!(e.to_string().contains("uid 65534"), "{e}");
        // A root file in a directory others can write (and so swap the file).
        std::os::unix::fs::chown(&ok, Some(0), None).expect("chown");
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let inside = open.join("c.toml");
        std::fs::write(&inside, "").expect("write");
        let e = Settings::load_root_only(&inside).expect_err("open dir");
        assert!(e.to_string().contains("writable by group or others"), "{e}");
        // A symlink to a root-only file is read through.
        let link = tmp.path().join("link.toml");
        std::os::unix::fs::symlink(&ok, &link).expect("symlink");
        assert_eq!(Settings::load_root_only(&link).expect("link").threads, 2);
    }
}
