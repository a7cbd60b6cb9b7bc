//! The home-directory profile model of `login-storm`: what a desktop session and a browser
//! read and write in a user's home at login, during the session and at logout.
//!
//! The model is a text file (the shipped one: `data/login-profile/gnome-firefox.txt`, its
//! sources in `SOURCE.md` beside it); [`Actor`] plays its actions on one home with
//! per-operation latencies.

use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::{Latencies, Op};

/// The users of a storm released by its start barrier that have not started yet.
pub static NOT_STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn check_interrupted() -> io::Result<()> {
    if crate::stop::interrupted() {
        Err(io::Error::new(
            io::ErrorKind::Interrupted,
            "interrupted by a signal",
        ))
    } else {
        Ok(())
    }
}

/// The shipped model: a GNOME session and Firefox.
pub const EMBEDDED: &str = include_str!("../data/login-profile/gnome-firefox.txt");

/// SQLite page size used by the model (mozStorage's default).
pub const PAGE: u64 = 32 * 1024;

/// Home files above this size that no timed action reads are prepared sparse.
const SPARSE_ABOVE: u64 = 256 * 1024;

/// One step of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A file of this size (in `[home]`: prepared before the login).
    File {
        path: String,
        size: u64,
    },
    /// N new files, sizes spread between min and max; `{i}` and `{r}` in the pattern.
    Many {
        pattern: String,
        n: u32,
        min: u64,
        max: u64,
    },
    Mkdir(String),
    /// Open, read to the end, close.
    Read(String),
    /// List a directory tree and stat every entry.
    Scan(String),
    /// Create or truncate, write, close.
    Write {
        path: String,
        size: u64,
    },
    /// Write a temporary file, fsync, rename it over the path.
    Replace {
        path: String,
        size: u64,
    },
    Append {
        path: String,
        size: u64,
    },
    /// Write a temporary file and rename it over the path, `times` times, without fsync
    /// (a store that keeps a file safe by renaming, as Firefox's Glean database does).
    Resave {
        path: String,
        size: u64,
        times: u32,
    },
    Unlink(String),
    /// Read the header, then transactions: append pages to `DB-wal`, fdatasync each.
    Sqlite {
        db: String,
        txns: u32,
        pages: u32,
    },
    /// Copy the write-ahead log back into the database, fsync, truncate the log.
    Checkpoint(String),
}

/// A parsed model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub home: Vec<Action>,
    pub login: Vec<Action>,
    pub session: Vec<Action>,
    pub session_every: Duration,
    pub logout: Vec<Action>,
}

impl Profile {
    pub fn embedded() -> Self {
        // The shipped model is checked by a unit test; an error here is a build defect.
        Self::parse(EMBEDDED).unwrap_or_else(|e| panic!("embedded login profile: {e}"))
    }

    /// Parses a model; errors name the line and what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut vars: Vec<(String, String)> = Vec::new();
        let mut p = Profile {
            home: Vec::new(),
            login: Vec::new(),
            session: Vec::new(),
            session_every: Duration::from_secs(15),
            logout: Vec::new(),
        };
        let mut section: Option<&str> = None;
        for (no, raw) in text.lines().enumerate() {
            let no = no + 1;
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let err = |m: &str| format!("line {no}: {m}: {line:?}");
            if let Some(h) = line.strip_prefix('[') {
                let h = h.strip_suffix(']').ok_or_else(|| err("unclosed section"))?;
                let mut w = h.split_whitespace();
                section = match (w.next(), w.next(), w.next()) {
                    (Some("home"), None, _) => Some("home"),
                    (Some("login"), None, _) => Some("login"),
                    (Some("logout"), None, _) => Some("logout"),
                    (Some("session"), Some(secs), None) => {
                        let s: u64 = secs
                            .parse()
                            .ok()
                            .filter(|s| *s > 0)
                            .ok_or_else(|| err("session period must be whole seconds > 0"))?;
                        p.session_every = Duration::from_secs(s);
                        Some("session")
                    }
                    _ => return Err(err("unknown section (home, login, session SECS, logout)")),
                };
                continue;
            }
            let mut words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
            if words[0] == "set" {
                if words.len() != 3 {
                    return Err(err("set takes a name and a value"));
                }
                vars.push((format!("${}", words[1]), words[2].clone()));
                vars.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
                continue;
            }
            for w in words.iter_mut().skip(1) {
                for (k, v) in &vars {
                    if w.contains(k.as_str()) {
                        *w = w.replace(k.as_str(), v);
                    }
                }
            }
            let action = parse_action(&words).map_err(|m| err(&m))?;
            let target = match section {
                Some("home") => &mut p.home,
                Some("login") => &mut p.login,
                Some("session") => &mut p.session,
                Some("logout") => &mut p.logout,
                _ => return Err(err("action before any section")),
            };
            if section == Some("home")
                && !matches!(
                    action,
                    Action::File { .. } | Action::Many { .. } | Action::Mkdir(_)
                )
            {
                return Err(err("[home] holds only file, many and mkdir"));
            }
            target.push(action);
        }
        if p.login.is_empty() {
            return Err("the profile has no [login] actions".into());
        }
        Ok(p)
    }

    /// Paths the timed sections read whole: prepared with real data (others, when large,
    /// are prepared sparse, which no filesystem tells apart until read).
    fn read_paths(&self) -> HashSet<&str> {
        self.login
            .iter()
            .chain(&self.session)
            .chain(&self.logout)
            .filter_map(|a| match a {
                Action::Read(p) => Some(p.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Every file the `[home]` section makes, with its size (a `many` file's is the middle
    /// of its range): what a program rebuilds when it finds its file missing.
    pub fn home_files(&self) -> BTreeMap<String, u64> {
        let mut files = BTreeMap::new();
        for a in &self.home {
            match a {
                Action::File { path, size } => {
                    files.insert(path.clone(), *size);
                }
                Action::Many {
                    pattern,
                    n,
                    min,
                    max,
                } => {
                    for i in 0..*n {
                        let rel = pattern.replace("{i}", &i.to_string()).replace("{r}", "0");
                        files.insert(rel, (min + max) / 2);
                    }
                }
                _ => {}
            }
        }
        files
    }

    /// Files and bytes the `[home]` section makes.
    pub fn home_size(&self) -> (u64, u64) {
        self.home.iter().fold((0, 0), |(f, b), a| match a {
            Action::File { size, .. } => (f + 1, b + size),
            Action::Many { n, min, max, .. } => (f + *n as u64, b + *n as u64 * (min + max) / 2),
            _ => (f, b),
        })
    }
}

fn parse_action(w: &[String]) -> Result<Action, String> {
    let num = |i: usize| -> Result<u64, String> {
        w.get(i)
            .ok_or_else(|| format!("{} needs more arguments", w[0]))?
            .parse::<u64>()
            .map_err(|_| format!("argument {i} of {} is not a whole number", w[0]))
    };
    let path = |i: usize| -> Result<String, String> {
        let p = w
            .get(i)
            .ok_or_else(|| format!("{} needs a path", w[0]))?
            .clone();
        if p.starts_with('/') || p.split('/').any(|c| c == "..") || p.contains('$') {
            return Err(format!(
                "{p:?} must be relative to the home, without .. or unknown $variables"
            ));
        }
        Ok(p)
    };
    let arity = |n: usize| {
        if w.len() == n {
            Ok(())
        } else {
            Err(format!("{} takes {} arguments", w[0], n - 1))
        }
    };
    let a = match w[0].as_str() {
        "file" => {
            arity(3)?;
            Action::File {
                path: path(1)?,
                size: num(2)?,
            }
        }
        "many" => {
            arity(5)?;
            let (min, max) = (num(3)?, num(4)?);
            if min > max {
                return Err("many: MIN is above MAX".into());
            }
            Action::Many {
                pattern: path(1)?,
                n: num(2)? as u32,
                min,
                max,
            }
        }
        "mkdir" => {
            arity(2)?;
            Action::Mkdir(path(1)?)
        }
        "read" => {
            arity(2)?;
            Action::Read(path(1)?)
        }
        "scan" => {
            arity(2)?;
            Action::Scan(path(1)?)
        }
        "write" => {
            arity(3)?;
            Action::Write {
                path: path(1)?,
                size: num(2)?,
            }
        }
        "replace" => {
            arity(3)?;
            Action::Replace {
                path: path(1)?,
                size: num(2)?,
            }
        }
        "append" => {
            arity(3)?;
            Action::Append {
                path: path(1)?,
                size: num(2)?,
            }
        }
        "resave" => {
            arity(4)?;
            Action::Resave {
                path: path(1)?,
                size: num(2)?,
                times: num(3)? as u32,
            }
        }
        "unlink" => {
            arity(2)?;
            Action::Unlink(path(1)?)
        }
        "sqlite" => {
            arity(4)?;
            Action::Sqlite {
                db: path(1)?,
                txns: num(2)? as u32,
                pages: num(3)? as u32,
            }
        }
        "checkpoint" => {
            arity(2)?;
            Action::Checkpoint(path(1)?)
        }
        other => return Err(format!("unknown action {other:?}")),
    };
    Ok(a)
}

/// What one actor did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub files_written: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// Reads and scans of paths that were not there (`.cache` on a workstation's local
    /// disk, or local-only with ccfs, starts empty on a workstation never used).
    pub missing: u64,
    /// Home files rebuilt because they were missing (a program regenerates its cache):
    /// each written at its home size, timed with the action that missed it.
    pub rebuilt: u64,
}

/// Plays actions on one home.
pub struct Actor {
    pub home: PathBuf,
    pub lat: Latencies,
    pub tally: Tally,
    rng: u64,
    buf: Vec<u8>,
    /// Where reads land (kept: no allocation a file).
    rbuf: Vec<u8>,
    /// Paths under this first component live in this local directory instead of the home
    /// (`.cache` with XDG_CACHE_HOME on the workstation's disk).
    local: Option<(String, PathBuf)>,
    /// The home's files and sizes, rebuilt when a read or a scan misses them.
    rebuild: Arc<BTreeMap<String, u64>>,
}

fn timed<T>(lat: &mut Latencies, op: Op, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let t = Instant::now();
    let r = f();
    lat.record(op, t.elapsed());
    r
}

impl Actor {
    pub fn new(home: PathBuf, seed: u64) -> Self {
        let mut a = Self {
            home,
            lat: Latencies::new(),
            tally: Tally::default(),
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            buf: Vec::new(),
            rbuf: vec![0; 128 * 1024],
            local: None,
            rebuild: Arc::default(),
        };
        a.buf = (0..256 * 1024).map(|_| a.next() as u8).collect();
        a
    }

    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn size_between(&mut self, min: u64, max: u64) -> u64 {
        min + self.next() % (max - min + 1)
    }

    /// Paths whose first component is `first` (e.g. `.cache`) are in `dir` instead: a
    /// cache directory on the workstation's local disk (XDG_CACHE_HOME).
    pub fn keep_local(mut self, first: &str, dir: PathBuf) -> Self {
        self.local = Some((first.to_string(), dir));
        self
    }

    /// A read or a scan that misses a file of the home rebuilds it (programs regenerate
    /// their caches): `files` from [`Profile::home_files`].
    pub fn rebuilding(mut self, files: Arc<BTreeMap<String, u64>>) -> Self {
        self.rebuild = files;
        self
    }

    fn at(&self, rel: &str) -> PathBuf {
        if let Some((first, dir)) = &self.local {
            let rest = rel.strip_prefix(first.as_str());
            match rest {
                Some("") => return dir.clone(),
                Some(r) if r.starts_with('/') => return dir.join(&r[1..]),
                _ => {}
            }
        }
        self.home.join(rel)
    }

    /// Rebuilds the home's files at `rel` (a file) or below it (a directory); how many.
    fn rebuild_missing(&mut self, rel: &str) -> io::Result<u64> {
        let files = Arc::clone(&self.rebuild);
        let below = format!("{rel}/");
        let mut made = 0;
        for (path, size) in files.range(rel.to_string()..) {
            if path != rel && !path.starts_with(&below) {
                if path.as_str() > below.as_str() {
                    break;
                }
                continue;
            }
            self.write_file(&self.at(path), *size, false)?;
            made += 1;
        }
        self.tally.rebuilt += made;
        Ok(made)
    }

    /// Opens `p` with `o` (which creates it); a missing parent directory is made then, as
    /// programs do, instead of looking for it before every open.
    fn open_creating(&mut self, p: &Path, o: &OpenOptions) -> io::Result<File> {
        match timed(&mut self.lat, Op::Open, || o.open(p)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(d) = p.parent() {
                    timed(&mut self.lat, Op::Mkdir, || fs::create_dir_all(d))?;
                }
                timed(&mut self.lat, Op::Open, || o.open(p))
            }
            other => other,
        }
    }

    fn put(&mut self, f: &mut File, size: u64) -> io::Result<()> {
        // Every write says something new (its first bytes differ): a file saved again with
        // the bytes it had is a case of its own, which ccfs does not send, and a model
        // whose every save repeated the last one would flatter it.
        let stamp = self.next().to_le_bytes();
        self.buf[..stamp.len()].copy_from_slice(&stamp);
        let mut left = size;
        while left > 0 {
            let n = left.min(self.buf.len() as u64) as usize;
            let buf = &self.buf[..n];
            timed(&mut self.lat, Op::Write, || f.write_all(buf))?;
            left -= n as u64;
        }
        self.tally.bytes_written += size;
        self.tally.files_written += 1;
        Ok(())
    }

    fn write_file(&mut self, p: &Path, size: u64, append: bool) -> io::Result<()> {
        let mut o = OpenOptions::new();
        o.create(true);
        if append {
            o.append(true);
        } else {
            o.write(true).truncate(true);
        }
        let mut f = self.open_creating(p, &o)?;
        self.put(&mut f, size)?;
        timed(&mut self.lat, Op::Close, || {
            drop(f);
            Ok(())
        })
    }

    fn read_file(&mut self, p: &Path) -> io::Result<()> {
        let mut f = timed(&mut self.lat, Op::Open, || File::open(p))?;
        let buf = &mut self.rbuf;
        loop {
            let n = timed(&mut self.lat, Op::Read, || f.read(buf))?;
            if n == 0 {
                break;
            }
            self.tally.bytes_read += n as u64;
        }
        timed(&mut self.lat, Op::Close, || {
            drop(f);
            Ok(())
        })
    }

    fn scan(&mut self, dir: &Path) -> io::Result<()> {
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            let entries: Vec<PathBuf> = timed(&mut self.lat, Op::Readdir, || {
                fs::read_dir(&d)?
                    .map(|e| e.map(|e| e.path()))
                    .collect::<io::Result<Vec<_>>>()
            })?;
            for p in entries {
                let m = timed(&mut self.lat, Op::Stat, || fs::symlink_metadata(&p))?;
                if m.is_dir() {
                    stack.push(p);
                }
            }
        }
        Ok(())
    }

    fn sqlite(&mut self, db: &Path, txns: u32, pages: u32) -> io::Result<()> {
        // A missing database is created, as SQLite does (counted as missing).
        let mut f = self.open_creating(
            db,
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false),
        )?;
        if f.metadata()?.len() == 0 {
            self.tally.missing += 1;
        }
        let mut header = [0u8; 4096];
        let n = timed(&mut self.lat, Op::Read, || f.read(&mut header))?;
        self.tally.bytes_read += n as u64;
        let wal_path = PathBuf::from(format!("{}-wal", db.display()));
        let mut wal = timed(&mut self.lat, Op::Open, || {
            OpenOptions::new().create(true).append(true).open(&wal_path)
        })?;
        for _ in 0..txns {
            for _ in 0..pages {
                let page = &self.buf[..PAGE as usize];
                timed(&mut self.lat, Op::Write, || wal.write_all(page))?;
            }
            timed(&mut self.lat, Op::Fsync, || wal.sync_data())?;
            self.tally.bytes_written += pages as u64 * PAGE;
        }
        self.tally.files_written += 1;
        timed(&mut self.lat, Op::Close, || {
            drop(wal);
            drop(f);
            Ok(())
        })
    }

    fn checkpoint(&mut self, db: &Path) -> io::Result<()> {
        let wal_path = PathBuf::from(format!("{}-wal", db.display()));
        let wal_len = match timed(&mut self.lat, Op::Stat, || fs::metadata(&wal_path)) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        if wal_len == 0 {
            return Ok(());
        }
        let mut f = timed(&mut self.lat, Op::Open, || {
            OpenOptions::new().read(true).write(true).open(db)
        })?;
        let db_pages = (f.metadata()?.len() / PAGE).max(1);
        for _ in 0..wal_len.div_ceil(PAGE) {
            let at = (self.next() % db_pages) * PAGE;
            let page = &self.buf[..PAGE as usize];
            timed(&mut self.lat, Op::Write, || {
                f.seek(SeekFrom::Start(at))?;
                f.write_all(page)
            })?;
        }
        timed(&mut self.lat, Op::Fsync, || f.sync_all())?;
        let wal = timed(&mut self.lat, Op::Open, || {
            OpenOptions::new().write(true).open(&wal_path)
        })?;
        timed(&mut self.lat, Op::Truncate, || wal.set_len(0))?;
        timed(&mut self.lat, Op::Fsync, || wal.sync_all())?;
        self.tally.bytes_written += wal_len;
        self.tally.files_written += 1;
        timed(&mut self.lat, Op::Close, || {
            drop(wal);
            drop(f);
            Ok(())
        })
    }

    /// Plays `actions`; `rep` fills `{r}` in `many` patterns.
    pub fn play(&mut self, actions: &[Action], rep: u32) -> io::Result<()> {
        for a in actions {
            check_interrupted()?;
            // Until every user of a storm has started, a started one gives up the CPU
            // after each action: on a few cores, hundreds of simulated workstations then
            // start within milliseconds of each other, not seconds.
            if NOT_STARTED.load(Ordering::Relaxed) > 0 {
                std::thread::yield_now();
            }
            self.play_one(a, rep)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", describe(a))))?;
        }
        Ok(())
    }

    fn play_one(&mut self, a: &Action, rep: u32) -> io::Result<()> {
        match a {
            Action::File { path, size } => self.write_file(&self.at(path), *size, false),
            Action::Many {
                pattern,
                n,
                min,
                max,
            } => {
                for i in 0..*n {
                    let rel = pattern
                        .replace("{i}", &i.to_string())
                        .replace("{r}", &rep.to_string());
                    let size = self.size_between(*min, *max);
                    self.write_file(&self.at(&rel), size, false)?;
                }
                Ok(())
            }
            Action::Mkdir(p) => {
                let p = self.at(p);
                timed(&mut self.lat, Op::Mkdir, || fs::create_dir_all(&p))
            }
            Action::Read(p) | Action::Scan(p) => {
                let path = self.at(p);
                let r = if matches!(a, Action::Read(_)) {
                    self.read_file(&path)
                } else {
                    self.scan(&path)
                };
                match r {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        self.tally.missing += 1;
                        self.rebuild_missing(p).map(|_| ())
                    }
                    other => other,
                }
            }
            Action::Write { path, size } => self.write_file(&self.at(path), *size, false),
            Action::Append { path, size } => self.write_file(&self.at(path), *size, true),
            Action::Replace { path, size } => {
                let target = self.at(path);
                let tmp = PathBuf::from(format!("{}.tmp-{}", target.display(), rep));
                let mut f = self.open_creating(
                    &tmp,
                    OpenOptions::new().write(true).create(true).truncate(true),
                )?;
                self.put(&mut f, *size)?;
                timed(&mut self.lat, Op::Fsync, || f.sync_all())?;
                timed(&mut self.lat, Op::Close, || {
                    drop(f);
                    Ok(())
                })?;
                timed(&mut self.lat, Op::Rename, || fs::rename(&tmp, &target))
            }
            Action::Resave { path, size, times } => {
                let target = self.at(path);
                let tmp = PathBuf::from(format!("{}.tmp", target.display()));
                for _ in 0..*times {
                    let mut f = self.open_creating(
                        &tmp,
                        OpenOptions::new().write(true).create(true).truncate(true),
                    )?;
                    self.put(&mut f, *size)?;
                    timed(&mut self.lat, Op::Close, || {
                        drop(f);
                        Ok(())
                    })?;
                    timed(&mut self.lat, Op::Rename, || fs::rename(&tmp, &target))?;
                }
                Ok(())
            }
            Action::Unlink(p) => {
                let p = self.at(p);
                match timed(&mut self.lat, Op::Unlink, || fs::remove_file(&p)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                }
            }
            Action::Sqlite { db, txns, pages } => self.sqlite(&self.at(db), *txns, *pages),
            Action::Checkpoint(db) => self.checkpoint(&self.at(db)),
        }
    }

    /// A file of `size` bytes with real data only in its first page (SQLite reads its
    /// header); the rest is a hole.
    fn sparse(&mut self, p: &Path, size: u64) -> io::Result<()> {
        let f = self.open_creating(
            p,
            OpenOptions::new().write(true).create(true).truncate(true),
        )?;
        f.set_len(size)?;
        f.write_all_at(&self.buf[..4096.min(size as usize)], 0)
    }

    /// Makes the `[home]` files: real data where a timed section reads them or they are
    /// small, sparse (same size) otherwise.
    pub fn prepare(&mut self, profile: &Profile) -> io::Result<()> {
        self.prepare_files(profile, false, None).map(|_| ())
    }

    /// As [`Actor::prepare`], without the files whose first path component is `first`
    /// (`.cache` where the share never holds it).
    pub fn prepare_except(&mut self, profile: &Profile, first: &str) -> io::Result<()> {
        self.prepare_files(profile, false, Some(first)).map(|_| ())
    }

    /// Makes the `[home]` files this home does not show; returns how many. Through ccfs
    /// these are the local-only ones (`.cache` by default), which then stay in the
    /// workstation's cache: a returning user's.
    pub fn prepare_missing(&mut self, profile: &Profile) -> io::Result<u64> {
        self.prepare_files(profile, true, None)
    }

    fn prepare_files(
        &mut self,
        profile: &Profile,
        only_missing: bool,
        except: Option<&str>,
    ) -> io::Result<u64> {
        let read = profile.read_paths();
        let mut made = 0;
        for a in &profile.home {
            check_interrupted()?;
            let files: Vec<(String, u64)> = match a {
                Action::File { path, size } => vec![(path.clone(), *size)],
                Action::Many {
                    pattern,
                    n,
                    min,
                    max,
                } => (0..*n)
                    .map(|i| {
                        let rel = pattern.replace("{i}", &i.to_string()).replace("{r}", "0");
                        (rel, self.size_between(*min, *max))
                    })
                    .collect(),
                other => {
                    self.play_one(other, 0)?;
                    continue;
                }
            };
            for (rel, size) in files {
                if except.is_some_and(|first| rel.split('/').next() == Some(first)) {
                    continue;
                }
                let p = self.at(&rel);
                if only_missing && fs::symlink_metadata(&p).is_ok() {
                    continue;
                }
                if size > SPARSE_ABOVE && !read.contains(rel.as_str()) {
                    self.sparse(&p, size)?;
                } else {
                    self.write_file(&p, size, false)?;
                }
                made += 1;
            }
        }
        Ok(made)
    }
}

fn describe(a: &Action) -> String {
    match a {
        Action::File { path, .. }
        | Action::Write { path, .. }
        | Action::Replace { path, .. }
        | Action::Resave { path, .. }
        | Action::Append { path, .. } => path.clone(),
        Action::Many { pattern, .. } => pattern.clone(),
        Action::Mkdir(p) | Action::Read(p) | Action::Scan(p) | Action::Unlink(p) => p.clone(),
        Action::Sqlite { db, .. } | Action::Checkpoint(db) => db.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_profile_parses_and_has_the_documented_shape() {
        let p = Profile::parse(EMBEDDED).expect("parses");
        let (files, bytes) = p.home_size();
        assert!((1000..3000).contains(&files), "{files} files in the home");
        assert!(bytes > 30 << 20, "{bytes} bytes");
        assert!(p.login.len() > 80, "{} login actions", p.login.len());
        assert_eq!(p.session_every, Duration::from_secs(15));
        assert!(!p.session.is_empty() && !p.logout.is_empty());
        let has = |v: &[Action], f: fn(&Action) -> bool| v.iter().any(f);
        assert!(has(&p.login, |a| matches!(a, Action::Sqlite { .. })));
        assert!(has(
            &p.login,
            |a| matches!(a, Action::Replace { path, .. } if path.ends_with("prefs.js"))
        ));
        assert!(has(&p.logout, |a| matches!(a, Action::Checkpoint(_))));
        // Variables are resolved.
        assert!(p.login.iter().all(|a| !describe(a).contains('$')));
    }

    #[test]
    fn bad_profiles_name_the_line_and_the_problem() {
        for (text, want) in [
            ("read x\n", "line 1: action before any section"),
            (
                "[login]\nread /etc/passwd\n",
                "line 2: \"/etc/passwd\" must be relative",
            ),
            ("[login]\nread ../x\n", "without .."),
            ("[login]\nfrobnicate x\n", "unknown action"),
            ("[login]\nwrite x big\n", "not a whole number"),
            ("[session 0]\n", "session period"),
            ("[home]\nread x\n", "[home] holds only"),
            ("[home]\nfile x 1\n", "no [login] actions"),
            ("[login]\nmany x 3 9 1\n", "MIN is above MAX"),
            ("[login]\nread $NOPE/x\n", "unknown $variables"),
        ] {
            let e = Profile::parse(text).expect_err(text);
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_local_cache_is_kept_apart_and_what_is_missed_is_rebuilt() {
        let home = tempfile::tempdir().expect("home");
        let local = tempfile::tempdir().expect("local");
        let text = "[home]\nfile .cache/f/a 10\nmany .cache/t/{i} 3 20 40\nfile .cachex 5\n\
                    file .config/c 7\n\
                    [login]\nread .cache/f/a\nscan .cache/t\nread .config/c\nread .cachex\n";
        let p = Profile::parse(text).expect("parse");
        // The home as the share holds it where `.cache` is kept local: no `.cache`.
        Actor::new(home.path().to_path_buf(), 1)
            .prepare_except(&p, ".cache")
            .expect("prepare");
        assert!(!home.path().join(".cache").exists());
        assert!(
            home.path().join(".cachex").is_file(),
            "only the component itself"
        );
        let mut a = Actor::new(home.path().to_path_buf(), 2)
            .keep_local(".cache", local.path().to_path_buf())
            .rebuilding(Arc::new(p.home_files()));
        a.play(&p.login, 0).expect("login");
        // The two misses (a file, a directory) rebuilt the four files, locally.
        assert_eq!((a.tally.missing, a.tally.rebuilt), (2, 4));
        let len = |p: &Path| fs::metadata(p).map(|m| m.len()).ok();
        assert_eq!(len(&local.path().join("f/a")), Some(10));
        for i in 0..3 {
            assert_eq!(
                len(&local.path().join(format!("t/{i}"))),
                Some(30),
                "middle size"
            );
        }
        assert!(!home.path().join(".cache").exists(), "nothing on the share");
        // Found now: nothing more is rebuilt.
        a.play(&p.login, 0).expect("again");
        assert_eq!((a.tally.missing, a.tally.rebuilt), (2, 4));
    }

    #[test]
    fn actions_do_what_they_say_on_disk() {
        let dir = tempfile::tempdir().expect("tmp");
        let text = "[home]\nfile a.db 65536\nmany c/{i} 3 10 10\nfile big 2000000\n\
                    [login]\nread c/0\nreplace p.js 100\nsqlite a.db 2 3\nscan c\nresave g/s.bin 9 4\n\
                    [session 5]\nmany n/{r}-{i} 2 1 1\nappend h 7\n\
                    [logout]\ncheckpoint a.db\nunlink p.js\nunlink missing\n";
        let p = Profile::parse(text).expect("parse");
        let mut a = Actor::new(dir.path().to_path_buf(), 7);
        a.prepare(&p).expect("prepare");
        let len = |r: &str| fs::metadata(dir.path().join(r)).map(|m| m.len()).ok();
        assert_eq!(len("c/2"), Some(10));
        assert_eq!(len("big"), Some(2_000_000));
        a.play(&p.login, 0).expect("login");
        assert_eq!(len("p.js"), Some(100));
        assert_eq!(len("a.db-wal"), Some(2 * 3 * PAGE));
        assert_eq!(len("g/s.bin"), Some(9));
        assert!(!dir.path().join("g/s.bin.tmp").exists());
        assert!(a.lat.count(Op::Rename) == 1 + 4 && a.lat.count(Op::Fsync) >= 3);
        assert!(a.lat.count(Op::Readdir) >= 1 && a.lat.count(Op::Stat) >= 3);
        a.play(&p.session, 4).expect("session");
        assert_eq!(len("n/4-1"), Some(1));
        assert_eq!(len("h"), Some(7));
        a.play(&p.logout, 0).expect("logout");
        assert_eq!(len("a.db-wal"), Some(0), "checkpoint empties the log");
        assert_eq!(len("a.db"), Some(65536), "pages written in place");
        assert_eq!(len("p.js"), None);
        // Only what is missing is made again.
        fs::remove_file(dir.path().join("c/1")).expect("rm");
        let mut b = Actor::new(dir.path().to_path_buf(), 7);
        assert_eq!(b.prepare_missing(&p).expect("missing"), 1);
        assert_eq!(len("c/1"), Some(10));
        // A missing file is counted (programs rebuild their caches), not fatal.
        a.play(
            &[Action::Read("nope".into()), Action::Scan("gone".into())],
            0,
        )
        .expect("missing is no error");
        assert_eq!(a.tally.missing, 2);
        // A missing database is created, as SQLite does.
        let new_db = Action::Sqlite {
            db: "new/n.db".into(),
            txns: 1,
            pages: 1,
        };
        a.play(&[new_db], 0).expect("created");
        assert_eq!(a.tally.missing, 3);
        assert_eq!(len("new/n.db-wal"), Some(PAGE));
        let e = a
            .play(
                &[Action::Write {
                    path: "c/0/x".into(),
                    size: 1,
                }],
                0,
            )
            .expect_err("c/0 is a file");
        assert!(e.to_string().contains("c/0/x"), "{e}");
    }
}
