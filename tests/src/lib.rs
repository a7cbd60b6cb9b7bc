//! The end-to-end tests' harness (the tests live in tests/): a throwaway share, a real ccfs
//! mount over it (RAII), and helpers; [`skip`] for a test that cannot run where it is.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The built `ccfs` binary (next to the test executable's directory), or $CCFS_BIN.
pub fn ccfs_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("CCFS_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("ccfs");
    assert!(
        bin.is_file(),
        "{} not found: build the binaries first (cargo build --workspace --bins)",
        bin.display()
    );
    bin
}

pub fn ccfs(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(ccfs_bin())
        .args(args)
        .output()
        .expect("run ccfs")
}

/// A JSON file a command wrote.
pub fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("json written")).expect("whole JSON")
}

pub fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A tmpfs of `size` mounted at `at` (made if missing), with `options` (`ro`, ...);
/// unmounted when dropped. Tests run as root.
pub struct Tmpfs {
    pub at: PathBuf,
}

impl Tmpfs {
    pub fn mount(at: &Path, size: &str, options: &str) -> Self {
        std::fs::create_dir_all(at).expect("mount point");
        let opts = if options.is_empty() {
            format!("size={size}")
        } else {
            format!("{options},size={size}")
        };
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &opts, "tmpfs"])
            .arg(at)
            .status()
            .expect("mount");
        assert!(
            st.success(),
            "mount a tmpfs at {} (root needed)",
            at.display()
        );
        Self {
            at: at.to_path_buf(),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.at).status();
    }
}

/// `line` run as a shell command on a terminal of its own (a pty, through script(1)):
/// what it wrote there, its exit status.
pub fn on_a_terminal(line: &str) -> Output {
    Command::new("script")
        .args(["-qefc", line, "/dev/null"])
        .env("TERM", "xterm")
        .output()
        .expect("script(1)")
}

/// Where the share lives for this run: a local temp dir, or below $CCFS_TEST_SHARE_ROOT
/// (for example a GlusterFS client mount) when set.
pub fn share_root() -> Option<PathBuf> {
    std::env::var_os("CCFS_TEST_SHARE_ROOT").map(PathBuf::from)
}

/// A temporary directory for a share: below $CCFS_TEST_SHARE_ROOT when set, else local.
pub fn share_dir() -> tempfile::TempDir {
    match share_root() {
        Some(root) => tempfile::tempdir_in(root).expect("share dir on the test share"),
        None => tempfile::tempdir().expect("share dir"),
    }
}

/// A temporary share, mount point and cache.
pub struct Fixture {
    pub tmp: tempfile::TempDir,
    pub share: PathBuf,
    pub mnt: PathBuf,
    pub cache: PathBuf,
    _share_holder: Option<tempfile::TempDir>,
}

impl Default for Fixture {
    fn default() -> Self {
        Self::new()
    }
}

impl Fixture {
    pub fn new() -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("ccfs-test-")
            .tempdir()
            .expect("tempdir");
        let (share, holder) = match share_root() {
            Some(root) => {
                let d = tempfile::Builder::new()
                    .prefix("share-")
                    .tempdir_in(root)
                    .expect("share dir on the test share root");
                (d.path().to_path_buf(), Some(d))
            }
            None => (tmp.path().join("share"), None),
        };
        std::fs::create_dir_all(&share).expect("share");
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mnt");
        let cache = tmp.path().join("cache");
        Fixture {
            share,
            mnt,
            cache,
            tmp,
            _share_holder: holder,
        }
    }

    pub fn s(&self, rel: &str) -> PathBuf {
        self.share.join(rel)
    }

    pub fn m(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    pub fn mount(&self) -> Mount<'_> {
        self.mount_with(&[])
    }

    pub fn mount_with(&self, extra: &[&str]) -> Mount<'_> {
        self.mount_at(&self.mnt, &self.cache, extra)
    }

    /// A second workstation: another mount point and cache over the same share.
    pub fn workstation(&self, name: &str) -> (PathBuf, PathBuf) {
        let mnt = self.tmp.path().join(format!("mnt-{name}"));
        std::fs::create_dir_all(&mnt).expect("mnt");
        (mnt, self.tmp.path().join(format!("cache-{name}")))
    }

    /// A config that caches SQLite databases like any dotfile (as the default does; said
    /// here so that the test stays what it is): for tests of how the cache treats a
    /// database.
    pub fn cached_databases(&self) -> String {
        let p = self.tmp.path().join("ccfs-cached-databases.toml");
        std::fs::write(&p, "[paths]\npassthrough = []\n").expect("config");
        p.display().to_string()
    }

    /// A config that passes SQLite databases straight to the share (the variant, and the
    /// default before databases were held by block).
    pub fn databases_passed_through(&self) -> String {
        let p = self.tmp.path().join("ccfs-databases-passed-through.toml");
        let list: Vec<String> = ccfs::policy::SQLITE_DATABASES
            .iter()
            .map(|g| format!("{g:?}"))
            .collect();
        let text = format!("[paths]\npassthrough = [{}]\n", list.join(", "));
        std::fs::write(&p, text).expect("config");
        p.display().to_string()
    }

    /// Writes a config file and returns its path.
    pub fn config(&self, text: &str) -> PathBuf {
        let p = self.tmp.path().join("ccfs.toml");
        std::fs::write(&p, text).expect("config");
        p
    }

    pub fn mount_at(&self, mnt: &Path, cache: &Path, extra: &[&str]) -> Mount<'_> {
        let mut args: Vec<&std::ffi::OsStr> =
            vec!["mount".as_ref(), "--cache-dir".as_ref(), cache.as_os_str()];
        for e in extra {
            args.push(e.as_ref());
        }
        args.push(self.share.as_os_str());
        args.push(mnt.as_os_str());
        let out = ccfs(&args);
        assert!(out.status.success(), "mount failed: {}", text(&out));
        let m = Mount {
            _fx: self,
            mnt: mnt.to_path_buf(),
            active: true,
        };
        if ring_expected() {
            // Every mount but one for a user (which keeps to /dev/fuse by design).
            let t = &m.status()["transport"];
            let declined = t["refused"]
                .as_str()
                .is_some_and(|why| why.contains("a mount for a user"));
            assert!(
                t["serving"] == "io-uring" || declined,
                "this run's mounts must be served over FUSE over io_uring: {t}"
            );
            if !declined {
                // And a request made now goes over it: a lookup of a name nobody has
                // (the kernel knows nothing of it, so it asks the daemon).
                let probe = mnt.join(format!(
                    "ccfs-test-ring-probe-{}-{}",
                    std::process::id(),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_nanos())
                        .unwrap_or(0)
                ));
                assert!(
                    std::fs::symlink_metadata(&probe).is_err(),
                    "{} exists",
                    probe.display()
                );
                let t = &m.status()["transport"];
                assert!(
                    t["ring_requests"].as_u64().unwrap_or(0) > 0,
                    "a lookup after the mount did not go over the ring: {t}"
                );
            }
        }
        m
    }
}

/// Whether this run's mounts must be served over FUSE over io_uring
/// (`CCFS_TEST_TRANSPORT=io-uring`: the suite's run with a ccfs built to take it by
/// default).
pub fn ring_expected() -> bool {
    std::env::var_os("CCFS_TEST_TRANSPORT").is_some_and(|v| v == "io-uring")
}

/// A live mount; dropping it unmounts (lazily if a test failed mid-way).
pub struct Mount<'a> {
    _fx: &'a Fixture,
    pub mnt: PathBuf,
    active: bool,
}

impl Mount<'_> {
    /// Logs out with `ccfs umount` and returns its output. If that left the mount in place
    /// (the test then fails on the output), it is detached lazily, so that the daemon
    /// finishes and no longer holds the share (a loop-mounted test share could not go).
    pub fn umount(mut self) -> Output {
        self.active = false;
        let out = ccfs(&["umount".as_ref(), self.mnt.as_os_str()]);
        if !out.status.success() && listed_as_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(&self.mnt)
                .output();
        }
        out
    }

    pub fn status(&self) -> serde_json::Value {
        let out = ccfs(&["status".as_ref(), "--json".as_ref(), self.mnt.as_os_str()]);
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).expect("json")
    }

    pub fn daemon_pid(&self) -> u32 {
        self.status()["pid"].as_u64().expect("pid") as u32
    }

    /// kill -9 of the daemon (a crash); the stale mount is then detached.
    pub fn crash(self) {
        let pid = self.daemon_pid();
        kill(pid, libc::SIGKILL);
        wait_until("daemon death", Duration::from_secs(10), || !alive(pid));
        self.abandon();
    }

    /// Forgets the mount: the test unmounted it itself.
    pub fn forget(mut self) {
        self.active = false;
    }

    /// Forgets the mount without unmounting (after the test killed the daemon).
    pub fn abandon(mut self) {
        self.active = false;
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(&self.mnt)
            .output();
    }
}

impl Drop for Mount<'_> {
    fn drop(&mut self) {
        if self.active {
            let out = ccfs(&["umount".as_ref(), self.mnt.as_os_str()]);
            if !out.status.success() {
                let _ = Command::new("fusermount3")
                    .arg("-u")
                    .arg("-z")
                    .arg(&self.mnt)
                    .output();
            }
        }
    }
}

pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the mount table lists `p` (canonical but for its last part), without a request
/// to the filesystem mounted there.
fn listed_as_mounted(p: &Path) -> bool {
    let p = match (
        p.parent().and_then(|d| d.canonicalize().ok()),
        p.file_name(),
    ) {
        (Some(dir), Some(name)) => dir.join(name),
        _ => p.to_path_buf(),
    };
    fsinfo::mounts()
        .map(|m| m.iter().any(|e| e.mount_point == p))
        .unwrap_or(false)
}

pub fn is_mounted(p: &Path) -> bool {
    let p = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    fsinfo::mounts()
        .map(|m| m.iter().any(|e| e.mount_point == p))
        .unwrap_or(false)
}

pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

pub fn write(p: &Path, s: &str) {
    std::fs::write(p, s).unwrap_or_else(|e| panic!("write {}: {e}", p.display()))
}

/// A small deterministic pseudo-random byte stream (no rand dependency).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn kill(pid: u32, sig: i32) {
    // SAFETY: sending a signal has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Stops process `pid` (SIGSTOP) and waits until every thread of it has stopped. The
/// signal wakes one thread, which then stops the others; until it has, they go on (the
/// idle threads of a FUSE daemon still take the next request), so a test that freezes a
/// server or a daemon waits for the whole of it before it counts on it.
pub fn stop(pid: u32) {
    kill(pid, libc::SIGSTOP);
    wait_until(
        &format!("every thread of process {pid} to stop"),
        Duration::from_secs(60),
        || {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                return true;
            };
            tasks.flatten().all(|t| {
                // io_uring's workers take no stop; they run nothing of the process's own.
                let worker = std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.starts_with("iou-"));
                // Gone, a zombie or stopped (by the signal, or traced).
                worker
                    || std::fs::read_to_string(t.path().join("stat")).map_or(true, |stat| {
                        stat.rsplit_once(") ").is_none_or(|(_, rest)| {
                            ["T", "t", "Z", "X"].iter().any(|s| rest.starts_with(s))
                        })
                    })
            })
        },
    );
}

/// Whether any thread of process `pid` still runs. A killed process's leader is a zombie
/// as soon as it exits, while a thread of it stuck in a call to a slow share (a FUSE
/// client's) may take a while to follow, holding every descriptor, the cache's lock
/// included: a test that goes on after a kill waits for that thread too.
pub fn alive(pid: u32) -> bool {
    if ccfs::sys::process_alive(pid) {
        return true;
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
        })
    })
}

/// The descendants of `pid` whose command name (/proc/PID/comm) is `comm`.
pub fn descendants_named(pid: u32, comm: &str) -> Vec<u32> {
    descendants(pid)
        .into_iter()
        .filter(|d| {
            std::fs::read_to_string(format!("/proc/{d}/comm")).is_ok_and(|c| c.trim() == comm)
        })
        .collect()
}

/// Every descendant of `pid`, found through /proc.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.split(' ').nth(1))
                .and_then(|v| v.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parent_of.push((p, ppid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(q) = frontier.pop() {
        for (child, parent) in &parent_of {
            if *parent == q {
                out.push(*child);
                frontier.push(*child);
            }
        }
    }
    out
}

/// A tiny seeded generator for fault points.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// How many fault points a fault-injection test runs: $CCFS_FAULT_POINTS or `default`.
pub fn fault_points(default: u64) -> u64 {
    std::env::var("CCFS_FAULT_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The account of a test user (made by `scripts/setup`).
pub fn account(name: &str) -> ccfs::sys::Account {
    ccfs::sys::user_by_name(name)
        .expect("passwd")
        .unwrap_or_else(|| panic!("user {name} missing: run scripts/setup"))
}

/// Runs `sh -c script` as user `name` (ids and groups, for good).
pub fn as_user(name: &str, script: &str) -> Output {
    user_command(name, "sh")
        .args(["-c", script])
        .output()
        .expect("setpriv")
}

/// `setpriv` running `program` as user `name` (ids and groups, for good).
pub fn user_command(name: &str, program: &str) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid", name, "--regid", name, "--init-groups", program]);
    cmd
}

/// A program (python3) that saves a document in one write and closes it when told, as an
/// editor does: what it was told at the write and at the close. It starts nothing itself
/// meanwhile (a child of its own would close a copy of the document).
pub struct HeldSave {
    child: std::process::Child,
    said: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl HeldSave {
    /// Writes `len` bytes to `doc` (as `user`, when given), with `also` opened for writing
    /// beside it (a line written, kept open) when given. Returns once the write has been
    /// answered, with what it was told: `written N` or `write ERRNO`.
    pub fn start(
        user: Option<&str>,
        doc: &Path,
        len: usize,
        also: Option<&Path>,
    ) -> (Self, String) {
        const SCRIPT: &str = r#"
import os, sys
doc = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
if sys.argv[3]:
    rc = os.open(sys.argv[3], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(rc, b"export B=2\n")
try:
    print("written", os.write(doc, os.urandom(int(sys.argv[2]))), flush=True)
except OSError as e:
    print("write", e.errno, flush=True)
sys.stdin.readline()
try:
    os.close(doc)
    print("closed", flush=True)
except OSError as e:
    print("close", e.errno, flush=True)
"#;
        let mut cmd = match user {
            Some(u) => user_command(u, "/usr/bin/python3"),
            None => Command::new("/usr/bin/python3"),
        };
        let mut child = cmd
            .args(["-c", SCRIPT])
            .arg(doc)
            .arg(len.to_string())
            .arg(also.map(|p| p.as_os_str()).unwrap_or_default())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let out = child.stdout.take().expect("stdout");
        let mut save = Self {
            child,
            said: std::io::BufRead::lines(std::io::BufReader::new(out)),
        };
        let wrote = save.next();
        (save, wrote)
    }

    fn next(&mut self) -> String {
        self.said.next().and_then(Result::ok).unwrap_or_default()
    }

    /// Tells it to close the document: what the close was told, `closed` or `close ERRNO`.
    pub fn close(mut self) -> String {
        use std::io::Write;
        let mut stdin = self.child.stdin.take().expect("stdin");
        let _ = writeln!(stdin);
        let closed = self.next();
        let _ = self.child.wait();
        closed
    }
}

/// Whether a close told of a save the server failed (EIO, or ENOSPC as the server said).
pub fn told_the_save_failed(closed: &str) -> bool {
    closed == format!("close {}", libc::EIO) || closed == format!("close {}", libc::ENOSPC)
}

/// Every conflict copy of `name` in `dir`, sorted.
pub fn conflict_copies(dir: &Path, name: &str) -> Vec<PathBuf> {
    let prefix = format!("{name}.ccfs-conflict-");
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("ls")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// A small tmpfs (root only), unmounted (lazily) when dropped: a cache that fills up.
pub struct SmallTmpfs(pub PathBuf);

impl SmallTmpfs {
    pub fn mount(at: &Path, size: &str) -> Self {
        std::fs::create_dir_all(at).expect("mkdir");
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .expect("mount tmpfs");
        assert!(st.success(), "needs root to mount a small tmpfs");
        SmallTmpfs(at.to_path_buf())
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A share reached through sshfs, a FUSE client that writes behind: it answers a write
/// before the server has it, and a write the server failed at the next write or at the
/// close. The server is OpenSSH's sftp-server, started by sshfs over a pipe (no network),
/// serving a tmpfs of the given size; the client is mounted at the fixture's share. Both
/// go when dropped.
pub struct SftpShare {
    client: PathBuf,
    server: SmallTmpfs,
}

impl SftpShare {
    pub fn mount(fx: &Fixture, size: &str) -> Self {
        Self::mount_at(fx, &fx.share, size)
    }

    /// [`SftpShare::mount`], the server's directory `owner`'s and the client open to every
    /// user (`allow_other`), as a share of users' homes is.
    pub fn mount_for(fx: &Fixture, size: &str, owner: &ccfs::sys::Account) -> Self {
        Self::mount_with(fx, &fx.share, size, Some(owner))
    }

    /// [`SftpShare::mount`], with the client mounted at `at` (a directory of the share,
    /// as a network filesystem automounted below a home).
    pub fn mount_at(fx: &Fixture, at: &Path, size: &str) -> Self {
        Self::mount_with(fx, at, size, None)
    }

    fn mount_with(fx: &Fixture, at: &Path, size: &str, owner: Option<&ccfs::sys::Account>) -> Self {
        let sftp_server = Path::new("/usr/lib/openssh/sftp-server");
        assert!(
            sftp_server.exists() && which("sshfs"),
            "sshfs and OpenSSH's sftp-server are needed: run scripts/setup"
        );
        let server = SmallTmpfs::mount(&fx.tmp.path().join("sftp-server"), size);
        if let Some(a) = owner {
            std::os::unix::fs::chown(&server.0, Some(a.uid), Some(a.gid)).expect("chown");
        }
        std::fs::create_dir_all(at).expect("client's mount point");
        // sshfs runs this in place of ssh (with ssh's arguments, which it drops).
        let ssh = fx.tmp.path().join("sftp-over-a-pipe");
        std::fs::write(&ssh, format!("#!/bin/sh\nexec {}\n", sftp_server.display()))
            .expect("script");
        std::fs::set_permissions(&ssh, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let st = Command::new("sshfs")
            .arg("-o")
            .arg(format!(
                "ssh_command={}{}",
                ssh.display(),
                if owner.is_some() { ",allow_other" } else { "" }
            ))
            .arg(format!("localhost:{}", server.0.display()))
            .arg(at)
            .status()
            .expect("sshfs");
        assert!(st.success(), "sshfs did not mount");
        SftpShare {
            client: at.to_path_buf(),
            server,
        }
    }

    /// The server's own directory (what the server has, not what the client shows).
    pub fn server(&self) -> &Path {
        &self.server.0
    }

    /// Fills the server's disk but for about `room` bytes.
    pub fn fill_leaving(&self, room: u64) {
        let st = fsinfo::statfs(self.server()).expect("statfs");
        let free = st.blocks_free * st.block_size;
        let f = std::fs::File::create(self.server().join(".filler")).expect("filler");
        use std::io::Write;
        let mut w = std::io::BufWriter::new(f);
        let chunk = vec![0u8; 4096];
        let mut left = free.saturating_sub(room);
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            w.write_all(&chunk[..n]).expect("fill");
            left -= n as u64;
        }
        w.flush().expect("fill");
    }

    /// Gives the room [`SftpShare::fill_leaving`] took back.
    pub fn empty(&self) {
        std::fs::remove_file(self.server().join(".filler")).expect("filler");
    }
}

impl Drop for SftpShare {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.client).status();
    }
}

/// Whether `prog` is on PATH.
pub fn which(prog: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(prog).is_file()))
}

/// Closes `f` and answers with the close's result (dropping a File drops it).
pub fn close_checked(f: std::fs::File) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    // SAFETY: the descriptor is ours alone, closed once.
    if unsafe { libc::close(f.into_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Runs a command with its output captured; None when it has not ended within a minute (it
/// is killed): a guard against a hang, not a speed target.
pub fn run_bounded(cmd: &mut Command) -> Option<Output> {
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        if child.try_wait().expect("wait").is_some() {
            return Some(child.wait_with_output().expect("output"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Starts `cmd` with its output piped and waits for the first line it prints (a helper
/// script saying it is ready); returns the child and that line.
pub fn spawn_and_read_line(cmd: &mut Command) -> (std::process::Child, String) {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("helper process");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().expect("stdout")),
        &mut line,
    )
    .expect("the helper's first line");
    (child, line)
}

/// What the cache's upper layer holds at or below `rel` (a path from the mount root; ""
/// for all) that is not a clean copy: each file whose bytes the share does not have at
/// the same path. What is local-only by default is left out (`.cache`, SQLite's `-shm`
/// files). After a clean logout or recovery the cache keeps clean copies for the next
/// login (checked against the share before they serve), and nothing else.
pub fn not_clean_copies(cache: &Path, share: &Path, rel: &str) -> Vec<String> {
    let upper = cache.join("upper");
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::from(rel)];
    let local = ccfs::policy::Policy::default_policy();
    while let Some(p) = stack.pop() {
        if !p.as_os_str().is_empty() && local.classify(&p) == ccfs::policy::PathClass::LocalOnly {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(upper.join(&p)) else {
            continue;
        };
        if meta.is_dir() {
            for e in std::fs::read_dir(upper.join(&p)).expect("ls").flatten() {
                stack.push(p.join(e.file_name()));
            }
        } else if std::fs::read(upper.join(&p)).ok() != std::fs::read(share.join(&p)).ok() {
            out.push(p.display().to_string());
        }
    }
    out.sort();
    out
}

/// The content of the one conflict copy of `name` in `dir` (there must be exactly one).
pub fn the_conflict_copy(dir: &Path, name: &str) -> String {
    let copies = conflict_copies(dir, name);
    assert_eq!(copies.len(), 1, "one conflict copy of {name}: {copies:?}");
    read(&copies[0])
}

/// A `MAP_SHARED` mapping of the first `len` bytes of a file (at least one byte); the
/// descriptor it was made from may be closed at once, as mmap users do. Unmapped when
/// dropped.
pub struct SharedMap {
    at: *mut u8,
    len: usize,
}

impl SharedMap {
    /// Maps `f`, read-write when `write`.
    pub fn of_file(f: &std::fs::File, len: usize, write: bool) -> SharedMap {
        use std::os::fd::AsRawFd;
        let len = len.max(1);
        let prot = libc::PROT_READ | if write { libc::PROT_WRITE } else { 0 };
        // SAFETY: a new shared mapping of an open file; the pointer is used within `len`
        // bytes (callers keep them within the file) until `Drop` unmaps it.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(
            at,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        SharedMap { at: at.cast(), len }
    }

    /// Opens `p` read-write, maps its first `len` bytes shared, and closes the descriptor.
    pub fn of(p: &Path, len: usize) -> SharedMap {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .expect("open read-write");
        SharedMap::of_file(&f, len, true)
    }

    /// `len` bytes at `off`, read through the mapping.
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.len);
        let mut v = vec![0u8; len];
        // SAFETY: within the mapping (checked above).
        unsafe { std::ptr::copy_nonoverlapping(self.at.add(off), v.as_mut_ptr(), len) };
        v
    }

    /// Writes `bytes` at `off` through the (writable) mapping.
    pub fn write(&self, off: usize, bytes: &[u8]) {
        assert!(off + bytes.len() <= self.len);
        // SAFETY: within the mapping (checked above); nothing else in this process holds
        // a reference to these bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.at.add(off), bytes.len()) };
    }

    /// Writes the mapping's dirty pages out and waits for them (msync `MS_SYNC`).
    pub fn sync(&self) {
        // SAFETY: the mapping made in `of_file`, still mapped.
        let rc = unsafe { libc::msync(self.at.cast(), self.len, libc::MS_SYNC) };
        assert_eq!(rc, 0, "msync: {}", std::io::Error::last_os_error());
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `of_file`, unmapped once.
        unsafe { libc::munmap(self.at.cast(), self.len) };
    }
}

/// A share whose timestamps are whole seconds (ext4 with 128-byte inodes, as MooseFS keeps
/// them), loop-mounted at the fixture's share; unmounted when dropped.
pub struct CoarseShare(pub PathBuf);

impl CoarseShare {
    pub fn mount(fx: &Fixture) -> Self {
        let img = fx.tmp.path().join("coarse.img");
        let f = std::fs::File::create(&img).expect("image");
        f.set_len(64 << 20).expect("size");
        let ok = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-I", "128"])
            .arg(&img)
            .status()
            .expect("mkfs.ext4");
        assert!(ok.success(), "mkfs.ext4");
        let ok = Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&fx.share)
            .status()
            .expect("mount");
        assert!(ok.success(), "loop mount (needs root)");
        CoarseShare(fx.share.clone())
    }
}

impl Drop for CoarseShare {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Waits for the start of a second of the clock that stamps the share's files.
pub fn start_of_a_second() {
    loop {
        let ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .subsec_nanos();
        if ns < 100_000_000 {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A FUSE filesystem a user runs that answers the kernel's INIT and then takes every
/// request and never answers it: whoever asks waits, and a request the server has taken
/// cannot be interrupted (SIGKILL included) until the server lets go. What a student's
/// own FUSE server can do, and what a share client that holds requests for its own
/// timeout does for that long. Mounted at `at` for `user` (as `fusermount3` mounts one
/// for her); dropping it aborts the connection, which lets every request go.
pub struct HangingFs {
    at: PathBuf,
    dev: Option<std::fs::File>,
}

impl HangingFs {
    pub fn mount(at: &Path, uid: u32, gid: u32) -> Self {
        use std::io::{Read, Write};
        use std::os::fd::AsRawFd;
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .expect("/dev/fuse");
        let opts = format!(
            "fd={},rootmode=40000,user_id={uid},group_id={gid}",
            dev.as_raw_fd()
        );
        let c = |s: &str| std::ffi::CString::new(s).expect("c string");
        let at_c = std::ffi::CString::new(at.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: valid C strings for the call.
        let r = unsafe {
            libc::mount(
                c("hangfs").as_ptr(),
                at_c.as_ptr(),
                c("fuse.hangfs").as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c(&opts).as_ptr().cast(),
            )
        };
        assert_eq!(r, 0, "mount: {}", std::io::Error::last_os_error());
        let mut server = dev.try_clone().expect("dup");
        std::thread::spawn(move || {
            let mut buf = vec![0u8; (1 << 20) + 4096];
            while let Ok(n) = server.read(&mut buf) {
                // struct fuse_in_header: len, opcode, unique, ...
                if n < 40 || u32::from_ne_bytes(buf[4..8].try_into().expect("op")) != 26 {
                    continue;
                }
                let unique = &buf[8..16];
                let readahead = &buf[48..52];
                // fuse_out_header, then fuse_init_out (protocol 7.31, 64 bytes).
                let mut out = Vec::with_capacity(80);
                out.extend_from_slice(&80u32.to_ne_bytes());
                out.extend_from_slice(&0i32.to_ne_bytes());
                out.extend_from_slice(unique);
                out.extend_from_slice(&7u32.to_ne_bytes());
                out.extend_from_slice(&31u32.to_ne_bytes());
                out.extend_from_slice(readahead);
                out.extend_from_slice(&0u32.to_ne_bytes());
                out.extend_from_slice(&16u16.to_ne_bytes());
                out.extend_from_slice(&12u16.to_ne_bytes());
                out.extend_from_slice(&4096u32.to_ne_bytes());
                out.extend_from_slice(&1u32.to_ne_bytes());
                out.extend_from_slice(&32u16.to_ne_bytes());
                out.resize(80, 0);
                if server.write_all(&out).is_err() {
                    break;
                }
            }
        });
        HangingFs {
            at: at.to_path_buf(),
            dev: Some(dev),
        }
    }
}

impl Drop for HangingFs {
    fn drop(&mut self) {
        // The connection's number (the mount's device minor), from the mount table: a
        // look at the mount itself would wait for ever.
        let want = self.at.to_string_lossy().into_owned();
        if let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") {
            for line in table.lines() {
                let f: Vec<&str> = line.split(' ').collect();
                if f.len() > 4 && f[4] == want {
                    if let Some((_, minor)) = f[2].split_once(':') {
                        let _ =
                            std::fs::write(format!("/sys/fs/fuse/connections/{minor}/abort"), "1");
                    }
                }
            }
        }
        self.dev = None;
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

/// Says that the calling test cannot run where it is (`reason`: what is missing and how to
/// provide it) and returns, for the caller to return too. libtest has no skip at run time:
/// the test counts as passed there, so the line goes to the file `$TEST_SKIPS` names when
/// it is set (scripts/test sets it), and the suite's summary counts it as skipped.
pub fn skip(reason: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    eprintln!("skipped: {test}: {reason}");
    if let Some(path) = std::env::var_os("TEST_SKIPS") {
        use std::io::Write;
        let line = format!("{test}: {}\n", reason.replace('\n', " "));
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = appended {
            eprintln!("cannot record the skip in $TEST_SKIPS: {e}");
        }
    }
}

/// `ccfs recover --cache-dir CACHE` (a crashed session's cache sent to its share).
pub fn recover(cache: &Path) -> Output {
    ccfs(&[
        "recover".as_ref(),
        "--cache-dir".as_ref(),
        cache.as_os_str(),
    ])
}

/// `sqlite3 DB SQL`, which must succeed; its output, trimmed.
pub fn sqlite(db: &Path, sql: &str) -> String {
    let o = Command::new("sqlite3")
        .arg(db)
        .arg(sql)
        .output()
        .expect("sqlite3 (scripts/setup installs it)");
    assert!(o.status.success(), "{} {sql}: {}", db.display(), text(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}
