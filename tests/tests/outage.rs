//! A file server that dies or hangs mid-session. `ccfs status`, `ccfs sync` and
//! `ccfs umount` keep answering and say the share is unreachable; the logout keeps every
//! change in the cache and leaves no mount; `ccfs recover` sends the changes once the share
//! is back.
//!
//! The server is a real FUSE mount that can be killed or frozen: a second ccfs passing
//! everything straight through to a plain directory (kill -9 of its daemon: every request
//! gets ENOTCONN, as when a server dies; SIGSTOP: every request waits, as with a hung
//! server). With `CCFS_TEST_GLUSTER_STATE` (the state dir of `deploy/testbed/up gluster`),
//! the same session runs on the GlusterFS testbed with its three bricks killed or stopped.
//!
//! Every command runs under a guard that fails the test if it has not answered within
//! [`GUARD`]: it only keeps a broken build from hanging the suite; it is no speed target.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use e2e::*;

/// The longest any command may take before the test gives up on it (see the module doc).
const GUARD: Duration = Duration::from_secs(180);

/// Waits until process `pid` sleeps in the kernel in one of `places` (its wchan); on
/// timeout the failure says where it was instead, with its kernel stack.
fn wait_in_kernel(what: &str, pid: u32, places: &[&str]) {
    let start = Instant::now();
    loop {
        let last = match std::fs::read_to_string(format!("/proc/{pid}/wchan")) {
            Ok(w) if places.contains(&w.as_str()) => return,
            Ok(w) => w,
            Err(e) => format!("(no wchan: {e})"),
        };
        if start.elapsed() > GUARD {
            let stack = std::fs::read_to_string(format!("/proc/{pid}/stack")).unwrap_or_default();
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            panic!(
                "timed out waiting for {what}: process {pid} is in {last:?}, not {places:?}\n\
                 stat: {state}\nstack:\n{stack}"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a command; kills it and fails the test if it has not ended within [`GUARD`].
fn within(cmd: &mut Command, what: &str) -> Output {
    within_for(cmd, what, GUARD)
}

/// [`within`], with another limit.
fn within_for(cmd: &mut Command, what: &str, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            // A process waiting on a FUSE request its daemon has taken cannot even be
            // killed until the daemon answers: do not wait for it for ever either.
            let gone = Instant::now();
            while gone.elapsed() < Duration::from_secs(5) {
                if child.try_wait().expect("wait").is_some() {
                    let out = child.wait_with_output().expect("output");
                    panic!("{what} did not answer within {limit:?}: {}", text(&out));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            panic!("{what} did not answer within {limit:?} and cannot be killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ccfs ARGS` under the guard.
fn ccfs_within(args: &[&OsStr]) -> Output {
    let what = format!(
        "`ccfs {}`",
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    within(Command::new(ccfs_bin()).args(args), &what)
}

/// True when `mnt` (canonical) is in the mount table; looks at nothing else, so it is safe
/// while what is mounted there hangs.
fn in_mount_table(mnt: &Path) -> bool {
    fsinfo::mounts()
        .expect("mountinfo")
        .iter()
        .any(|m| m.mount_point == mnt)
}

fn status_pid(mnt: &Path) -> u32 {
    let out = ccfs_within(&["status".as_ref(), "--json".as_ref(), mnt.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    v["pid"].as_u64().expect("pid") as u32
}

/// Lazily unmounts `mnt` if it is still in the mount table (cleanup after a failure).
fn detach(mnt: &Path) {
    if in_mount_table(mnt) {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(mnt)
            .output();
    }
}

/// Ends a daemon this test started, if it is still there (cleanup after a failure).
fn end_daemon(pid: Option<u32>) {
    if let Some(pid) = pid.filter(|p| alive(*p)) {
        kill(pid, libc::SIGKILL);
        let start = Instant::now();
        while alive(pid) && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outage {
    /// The server dies: requests fail (ENOTCONN).
    Died,
    /// The server hangs: requests wait.
    Hangs,
}

/// A file server the test can break and bring back.
trait FileServer {
    /// Where the share is mounted on this machine.
    fn root(&self) -> &Path;
    fn fail(&mut self, how: Outage);
    /// Brings the server back and waits until the share answers again.
    fn restore(&mut self);
    /// Whether files keep their inode numbers across the outage and [`FileServer::restore`]
    /// (ccfs tells another workstation's change by them). A restarted pass-through ccfs
    /// numbers its inodes anew, so a session over it changes only files it made.
    fn keeps_identities(&self, how: Outage) -> bool;
}

/// Waits until `dir` answers again (listed, and a file made and removed in it); the
/// last failed look if it does not within [`GUARD`].
fn answers_again(dir: &Path) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let out = within(
            Command::new("sh")
                .args([
                    "-c",
                    "ls \"$1\" >/dev/null && : > \"$1/.ccfs-outage-alive\" && rm \"$1/.ccfs-outage-alive\"",
                    "sh",
                ])
                .arg(dir),
            "a look at the share",
        );
        if out.status.success() {
            return Ok(());
        }
        if start.elapsed() > GUARD {
            return Err(text(&out));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn wait_until_answers(dir: &Path) {
    if let Err(e) = answers_again(dir) {
        panic!("the share at {} did not come back: {e}", dir.display());
    }
}

// ---- a pass-through ccfs as the file server ------------------------------------------------

/// A pass-through ccfs mount over a plain directory.
struct CcfsServer {
    base: PathBuf,
    mnt: PathBuf,
    cache: PathBuf,
    config: PathBuf,
    pid: Option<u32>,
    frozen: bool,
    _tmp: tempfile::TempDir,
}

impl CcfsServer {
    fn start() -> Self {
        Self::start_with("")
    }

    /// A server whose configuration has `more` too.
    fn start_with(more: &str) -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("ccfs-server-")
            .tempdir()
            .expect("tmp");
        let base = tmp.path().join("base");
        let mnt = tmp.path().join("share");
        std::fs::create_dir(&base).expect("base");
        std::fs::create_dir(&mnt).expect("mnt");
        let config = tmp.path().join("passthrough.toml");
        // It stands for a network share, whose hung requests a kill ends: it serves
        // through /dev/fuse (a stopped daemon's ring entries would still be handed
        // requests, which then wait unkillably) in every run, the ring's too.
        let transport = "transport = \"dev-fuse\"\n";
        let more = if more.contains("[mount]\n") {
            more.replacen("[mount]\n", &format!("[mount]\n{transport}"), 1)
        } else {
            format!("{more}[mount]\n{transport}")
        };
        write(
            &config,
            &format!("[paths]\ndotfiles_cached = false\nlocal_only = []\n{more}"),
        );
        let mut s = CcfsServer {
            base,
            mnt,
            cache: tmp.path().join("cache"),
            config,
            pid: None,
            frozen: false,
            _tmp: tmp,
        };
        s.mount();
        s
    }

    fn mount(&mut self) {
        let out = ccfs_within(&[
            "mount".as_ref(),
            "--cache-dir".as_ref(),
            self.cache.as_os_str(),
            "--config".as_ref(),
            self.config.as_os_str(),
            self.base.as_os_str(),
            self.mnt.as_os_str(),
        ]);
        assert!(out.status.success(), "server mount: {}", text(&out));
        self.pid = Some(status_pid(&self.mnt));
    }
}

impl FileServer for CcfsServer {
    fn root(&self) -> &Path {
        &self.mnt
    }

    fn fail(&mut self, how: Outage) {
        let pid = self.pid.expect("server running");
        match how {
            Outage::Died => {
                kill(pid, libc::SIGKILL);
                wait_until("the server's death", GUARD, || !alive(pid));
                self.pid = None;
            }
            Outage::Hangs => {
                stop(pid);
                self.frozen = true;
            }
        }
    }

    fn restore(&mut self) {
        if self.frozen {
            if let Some(pid) = self.pid {
                kill(pid, libc::SIGCONT);
            }
            self.frozen = false;
        }
        if self.pid.is_none() {
            // A dead server's mount stays until detached; then it is mounted anew.
            detach(&self.mnt);
            self.mount();
        }
        wait_until_answers(&self.mnt);
    }

    fn keeps_identities(&self, how: Outage) -> bool {
        how == Outage::Hangs
    }
}

impl Drop for CcfsServer {
    fn drop(&mut self) {
        // Never leave a frozen server behind: every request to it would wait for ever.
        if let Some(pid) = self.pid.filter(|_| self.frozen) {
            kill(pid, libc::SIGCONT);
        }
        detach(&self.mnt);
        if let Some(pid) = self.pid.filter(|p| alive(*p)) {
            // Detached and unused, the server ends by itself; make sure of it.
            let start = Instant::now();
            while alive(pid) && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
            end_daemon(Some(pid));
        }
    }
}

// ---- the GlusterFS testbed as the file server ----------------------------------------------

/// One GlusterFS outage at a time: the tests share the testbed's one volume.
static GLUSTER: Mutex<()> = Mutex::new(());

/// The volume of `deploy/testbed/up gluster`, whose three brick processes are killed or
/// stopped.
struct GlusterServer {
    state: PathBuf,
    mnt: PathBuf,
    stopped: Vec<u32>,
    killed: bool,
}

impl GlusterServer {
    /// The testbed named by `CCFS_TEST_GLUSTER_STATE`, or None (the test is skipped).
    fn from_env() -> Option<Self> {
        let state = PathBuf::from(std::env::var_os("CCFS_TEST_GLUSTER_STATE")?);
        let mnt = state.join("mnt");
        assert!(
            in_mount_table(&mnt),
            "CCFS_TEST_GLUSTER_STATE={}: no GlusterFS client at {} (deploy/testbed/up gluster)",
            state.display(),
            mnt.display()
        );
        Some(GlusterServer {
            state,
            mnt,
            stopped: Vec::new(),
            killed: false,
        })
    }

    /// The live brick processes, from the pid files glusterd keeps.
    fn live_bricks(&self) -> Vec<u32> {
        let dir = self.state.join("run/vols/ccfsvol");
        let mut pids: Vec<u32> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .filter(|e| e.path().extension() == Some(OsStr::new("pid")))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|t| t.trim().parse().ok())
            .filter(|p| alive(*p))
            .collect();
        pids.sort_unstable();
        pids
    }

    fn brick_pids(&self) -> Vec<u32> {
        let pids = self.live_bricks();
        assert_eq!(pids.len(), 3, "three live bricks: {pids:?}");
        pids
    }

    /// Starts the killed bricks again; the last `volume start` output if they do not run.
    /// glusterd takes a moment to notice they died (until then `volume start force` finds
    /// them "already running"), so it is asked until all three run.
    fn restart_bricks(&self) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let out = self.start_volume();
            let begun = Instant::now();
            while begun.elapsed() < Duration::from_secs(5) {
                if self.live_bricks().len() == 3 {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if start.elapsed() > GUARD {
                return Err(text(&out));
            }
        }
    }

    fn start_volume(&self) -> Output {
        within(
            Command::new("gluster").args([
                "--glusterd-sock=/var/run/glusterd.socket",
                "--mode=script",
                "volume",
                "start",
                "ccfsvol",
                "force",
            ]),
            "gluster volume start",
        )
    }
}

impl FileServer for GlusterServer {
    fn root(&self) -> &Path {
        &self.mnt
    }

    fn fail(&mut self, how: Outage) {
        let bricks = self.brick_pids();
        for &pid in &bricks {
            match how {
                Outage::Died => kill(pid, libc::SIGKILL),
                Outage::Hangs => stop(pid),
            }
        }
        match how {
            Outage::Died => {
                wait_until("the bricks' death", GUARD, || {
                    bricks.iter().all(|p| !alive(*p))
                });
                self.killed = true;
            }
            Outage::Hangs => self.stopped = bricks,
        }
    }

    fn restore(&mut self) {
        for pid in self.stopped.drain(..) {
            kill(pid, libc::SIGCONT);
        }
        if self.killed {
            if let Err(e) = self.restart_bricks() {
                panic!("the bricks did not start again: {e}");
            }
            self.killed = false;
        }
        wait_until_answers(&self.mnt);
    }

    fn keeps_identities(&self, _how: Outage) -> bool {
        true
    }
}

impl Drop for GlusterServer {
    fn drop(&mut self) {
        for pid in self.stopped.drain(..) {
            kill(pid, libc::SIGCONT);
        }
        if self.killed {
            if let Err(e) = self.restart_bricks() {
                eprintln!("the bricks did not start again: {e}");
            }
        }
        // What runs next on the testbed needs the volume back.
        if let Err(e) = answers_again(&self.mnt) {
            eprintln!("the volume did not come back: {e}");
        }
    }
}

// ---- one session through an outage, written once for every server --------------------------

/// A ccfs mount (the session under test) over a home on the server.
struct Session {
    home: PathBuf,
    mnt: PathBuf,
    cache: PathBuf,
    pid: Option<u32>,
    _home_holder: Option<tempfile::TempDir>,
    _tmp: tempfile::TempDir,
}

impl Session {
    fn start(server: &dyn FileServer) -> Self {
        // The kernel keeps what the share answered for a second (not the default ten):
        // the tests wait that long for their requests to reach the daemon again.
        Self::start_with(server, "[mount]\nattr_timeout_ms = 1000\n")
    }

    /// A session whose ccfs configuration is `config`.
    fn start_with(server: &dyn FileServer, config_text: &str) -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("ccfs-outage-")
            .tempdir()
            .expect("tmp");
        let home_holder = tempfile::Builder::new()
            .prefix("home-")
            .tempdir_in(server.root())
            .expect("home on the share");
        let home = home_holder.path().to_path_buf();
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mnt");
        // The user's home as the server has it before the session.
        write(&home.join(".bashrc"), "old bashrc\n");
        write(&home.join(".profile"), "old profile\n");
        std::fs::create_dir(home.join("Documents")).expect("Documents");
        write(&home.join("Documents/essay.txt"), "draft 1\n");
        write(&home.join("Documents/unread.txt"), "never read\n");
        let cache = tmp.path().join("cache");
        let config = tmp.path().join("ccfs.toml");
        write(&config, config_text);
        let out = ccfs_within(&[
            "mount".as_ref(),
            "--cache-dir".as_ref(),
            cache.as_os_str(),
            "--config".as_ref(),
            config.as_os_str(),
            home.as_os_str(),
            mnt.as_os_str(),
        ]);
        assert!(out.status.success(), "mount: {}", text(&out));
        let pid = Some(status_pid(&mnt));
        Session {
            home,
            mnt,
            cache,
            pid,
            _home_holder: Some(home_holder),
            _tmp: tmp,
        }
    }

    fn m(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        detach(&self.mnt);
        end_daemon(self.pid);
        // Only while the share answers (a failed test may leave it down): a home left on
        // a dead share is not worth a hang.
        if let Some(h) = self._home_holder.take() {
            if std::thread::panicking() {
                std::mem::forget(h);
            }
        }
    }
}

/// `ccfs status MP`, `ccfs status`, `ccfs sync MP` during the outage: each answers and
/// names the share as unreachable.
fn commands_answer_and_name_the_outage(s: &Session) {
    let mnt = s.mnt.as_os_str();
    let out = ccfs_within(&["status".as_ref(), mnt]);
    assert!(out.status.success(), "status MP: {}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("share: unreachable"), "{}", text(&out));

    let out = ccfs_within(&["status".as_ref(), "--json".as_ref(), mnt]);
    assert!(out.status.success(), "status --json MP: {}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let state = v["share_health"]["state"].as_str().expect("share_health");
    assert!(
        state == "not_answering" || state == "error",
        "share_health: {}",
        v["share_health"]
    );
    let count = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
    let changes = count("dirty_files") + count("pending_deletions");
    assert!(changes >= 3, "the session's changes are pending: {v}");

    // Every mount of this machine: the one under test is listed and said to be cut off
    // (the server's own ccfs mount, when the server is one, is reported on stderr).
    let out = ccfs_within(&["status".as_ref()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let ours = stdout
        .split(&format!("{}  share", s.mnt.display()))
        .nth(1)
        .unwrap_or_else(|| panic!("the session is listed: {}", text(&out)));
    assert!(
        ours.lines()
            .nth(1)
            .is_some_and(|l| l.contains("share: unreachable")),
        "{}",
        text(&out)
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains(&format!("{}:", s.mnt.display())),
        "the session's daemon is alive and answers: {}",
        text(&out)
    );

    let out = ccfs_within(&["sync".as_ref(), mnt]);
    assert_eq!(out.status.code(), Some(1), "sync: {}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("share unreachable")
            && stderr.contains(&s.cache.display().to_string())
            && stderr.contains(&format!("{changes} changes kept")),
        "{}",
        text(&out)
    );
}

/// The whole session: changes, outage, the commands, logout, the share back, recover.
/// With `cached_io`, a dotfile already in the cache is also read and written during the
/// outage (the overlay must serve it without the share).
fn session_through_an_outage(server: &mut dyn FileServer, how: Outage, cached_io: bool) {
    let s = Session::start(server);
    let stable = server.keeps_identities(how);
    // The session: new dotfiles, a document (straight to the share), and, where the server
    // keeps inode numbers across the outage, a changed and a deleted dotfile of the share.
    write(&s.m(".newrc"), "made in the session\n");
    std::fs::create_dir_all(s.m(".config/app")).expect("mkdir");
    write(&s.m(".config/app/settings.ini"), "[ui]\ntheme=dark\n");
    write(&s.m("Documents/essay.txt"), "draft 2\n");
    let cached = if stable {
        write(&s.m(".bashrc"), "new bashrc\n");
        std::fs::remove_file(s.m(".profile")).expect("rm .profile");
        ".bashrc"
    } else {
        // Counted like the changed and the deleted file of the other branch.
        write(&s.m(".newrc2"), "also made here\n");
        write(&s.m(".newrc3"), "and this\n");
        ".newrc"
    };
    let mut expected = read(&s.m(cached));
    assert_eq!(read(&s.home.join("Documents/essay.txt")), "draft 2\n");
    assert!(
        !s.home.join(".newrc").exists(),
        "dotfiles stay in the cache until logout"
    );

    server.fail(how);
    commands_answer_and_name_the_outage(&s);

    if cached_io {
        let path = s.m(cached);
        let out = within(Command::new("cat").arg(&path), "reading a cached dotfile");
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
        let out = within(
            Command::new("sh")
                .args(["-c", "printf 'written offline\\n' >> \"$1\"", "sh"])
                .arg(&path),
            "writing a cached dotfile",
        );
        assert!(out.status.success(), "{}", text(&out));
        expected.push_str("written offline\n");
        let out = within(Command::new("cat").arg(&path), "reading it again");
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
    }

    // Logout during the outage: no mount left, a non-zero exit saying where the changes
    // are and how they get to the share.
    let out = ccfs_within(&["umount".as_ref(), s.mnt.as_os_str()]);
    assert!(!out.status.success(), "umount: {}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("share unreachable")
            && stderr.contains(&s.cache.display().to_string())
            && stderr.contains("ccfs recover"),
        "{}",
        text(&out)
    );
    assert!(!in_mount_table(&s.mnt), "no mount left: {}", text(&out));

    server.restore();
    let pid = s.pid.expect("daemon");
    wait_until("the session's daemon to end", GUARD, || !alive(pid));
    let out = ccfs_within(&[
        "recover".as_ref(),
        "--cache-dir".as_ref(),
        s.cache.as_os_str(),
    ]);
    assert!(out.status.success(), "recover: {}", text(&out));

    // Every change of the session is on the share (`cached` with what was written offline).
    if cached != ".newrc" {
        assert_eq!(read(&s.home.join(".newrc")), "made in the session\n");
    }
    assert_eq!(
        read(&s.home.join(".config/app/settings.ini")),
        "[ui]\ntheme=dark\n"
    );
    assert_eq!(read(&s.home.join(cached)), expected);
    assert_eq!(read(&s.home.join("Documents/essay.txt")), "draft 2\n");
    if stable {
        assert!(!s.home.join(".profile").exists(), "the deletion was sent");
    } else {
        assert_eq!(read(&s.home.join(".newrc2")), "also made here\n");
        assert_eq!(read(&s.home.join(".newrc3")), "and this\n");
    }
    let leftovers: Vec<_> = std::fs::read_dir(&s.home)
        .expect("home")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("ccfs-conflict"))
        .collect();
    assert!(leftovers.is_empty(), "no conflict copies: {leftovers:?}");
}

#[test]
fn a_server_that_dies_mid_session_is_reported_and_recover_sends_everything() {
    let mut server = CcfsServer::start();
    session_through_an_outage(&mut server, Outage::Died, false);
}

#[test]
fn a_server_that_hangs_mid_session_blocks_no_command_and_recover_sends_everything() {
    let mut server = CcfsServer::start();
    session_through_an_outage(&mut server, Outage::Hangs, false);
}

#[test]
fn cached_dotfiles_stay_readable_and_writable_when_the_server_dies() {
    let mut server = CcfsServer::start();
    session_through_an_outage(&mut server, Outage::Died, true);
}

#[test]
fn cached_dotfiles_stay_readable_and_writable_when_the_server_hangs() {
    let mut server = CcfsServer::start();
    session_through_an_outage(&mut server, Outage::Hangs, true);
}

/// A program stuck reading a document on the hung share keeps the mount busy: the logout
/// detaches it lazily and says so; once the server is back the program ends, and the daemon
/// sends the changes itself.
#[test]
fn a_busy_mount_on_a_hung_server_is_detached_lazily() {
    let mut server = CcfsServer::start();
    let s = Session::start(&server);
    write(&s.m(".newrc"), "made in the session\n");
    server.fail(Outage::Hangs);
    // Nothing has looked this document up yet: its lookup waits on the frozen server.
    let reader = Command::new("cat")
        .arg(s.m("Documents/unread.txt"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("cat");
    let reader_pid = reader.id();
    wait_in_kernel(
        "the reader to wait on the share",
        reader_pid,
        &["request_wait_answer"],
    );
    let out = ccfs_within(&["status".as_ref(), s.mnt.as_os_str()]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("unreachable"),
        "status answers while a request waits on the share: {}",
        text(&out)
    );
    let out = ccfs_within(&["umount".as_ref(), s.mnt.as_os_str()]);
    assert!(!out.status.success(), "umount: {}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("lazily")
            && stderr.contains("share unreachable")
            && stderr.contains(&s.cache.display().to_string()),
        "{}",
        text(&out)
    );
    assert!(!in_mount_table(&s.mnt), "no mount left: {}", text(&out));

    server.restore();
    let done = reader.wait_with_output().expect("reader");
    assert_eq!(String::from_utf8_lossy(&done.stdout), "never read\n");
    // The last user gone, the session ends and its logout sync finds the share back.
    let pid = s.pid.expect("daemon");
    wait_until("the session's daemon to end", GUARD, || !alive(pid));
    assert_eq!(read(&s.home.join(".newrc")), "made in the session\n");
    let last = read_json(&s.cache.join("last-sync.json"));
    assert_eq!(last["ok"], true, "the daemon's own logout sync: {last}");
    assert!(last["share_unreachable"].is_null(), "{last}");
}

/// A daemon killed before its mount is live (here while its start waits on a hung share):
/// `ccfs mount` fails, names how the daemon ended and where its log is, and leaves no
/// mount.
#[test]
fn a_daemon_killed_before_its_mount_is_live_is_reported_with_its_log() {
    // The server's kernel keeps the home's attributes a minute: `ccfs mount`'s own look
    // at it is answered, and the daemon's start is what waits on the hung share.
    let mut server = CcfsServer::start_with("[mount]\nattr_timeout_ms = 60000\n");
    let home = server.root().join("home");
    std::fs::create_dir(&home).expect("home");
    write(&home.join(".bashrc"), "bashrc\n");
    assert!(home.join(".bashrc").is_file() && home.is_dir());
    let tmp = tempfile::tempdir().expect("tmp");
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mnt");
    let cache = tmp.path().join("cache");
    server.fail(Outage::Hangs);
    let mount = Command::new(ccfs_bin())
        .arg("mount")
        .arg("--cache-dir")
        .arg(&cache)
        .arg(&home)
        .arg(&mnt)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ccfs mount");
    let mut daemon = None;
    wait_until("the daemon to wait on the share", GUARD, || {
        daemon = descendants(mount.id()).into_iter().find(|d| {
            std::fs::read_to_string(format!("/proc/{d}/wchan"))
                .is_ok_and(|w| w == "request_wait_answer")
        });
        daemon.is_some()
    });
    let daemon = daemon.expect("daemon");
    kill(daemon, libc::SIGKILL);
    let out = mount.wait_with_output().expect("ccfs mount");
    server.restore();
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("before the mount was live")
            && stderr.contains("SIGKILL")
            && stderr.contains(&format!("{}/ccfs.log", cache.display())),
        "{}",
        text(&out)
    );
    assert!(!in_mount_table(&mnt), "{}", text(&out));
}

/// A hung server holds up only the requests that wait on it: with a reader stuck on a
/// document and nobody asking `ccfs status`, a cached dotfile is read and written (the
/// mount root answers from the cache's stand-in); once the daemon has noticed the hang,
/// a new request for a document fails at once (ENOTCONN) instead of joining the wait.
#[test]
fn a_hung_server_holds_up_only_the_requests_waiting_on_it() {
    let mut server = CcfsServer::start();
    let s = Session::start(&server);
    write(&s.m(".newrc"), "made in the session\n");
    assert_eq!(read(&s.m("Documents/essay.txt")), "draft 1\n");
    server.fail(Outage::Hangs);
    // What the kernel remembers of the root and the names (attr_timeout_ms, 1 s) runs
    // out, so the requests below reach the daemon.
    std::thread::sleep(Duration::from_millis(1500));
    let reader = Command::new("cat")
        .arg(s.m("Documents/unread.txt"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("cat");
    let reader_pid = reader.id();
    wait_in_kernel(
        "the reader to wait on the share",
        reader_pid,
        &["request_wait_answer"],
    );

    let out = within(
        Command::new("cat").arg(s.m(".newrc")),
        "reading a cached dotfile",
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "made in the session\n"
    );
    let out = within(
        Command::new("sh")
            .args(["-c", "printf 'during the hang\\n' >> \"$1\"", "sh"])
            .arg(s.m(".newrc")),
        "writing a cached dotfile",
    );
    assert!(out.status.success(), "{}", text(&out));

    // The daemon notices the hang by itself (the reader's request makes no progress);
    // from then on a document fails at once.
    wait_until("the daemon to notice the hang", GUARD, || {
        let out = ccfs_within(&["status".as_ref(), s.mnt.as_os_str()]);
        String::from_utf8_lossy(&out.stdout).contains("share: unreachable")
    });
    let out = within(
        Command::new("stat").arg(s.m("Documents/essay.txt")),
        "a document during the hang",
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not connected"),
        "{}",
        text(&out)
    );

    server.restore();
    // The reader, which waited through the hang, goes on: the share's answer to its
    // request opened the gate for its next one.
    let done = reader.wait_with_output().expect("reader");
    assert_eq!(
        String::from_utf8_lossy(&done.stdout),
        "never read\n",
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    wait_until("the share to answer through the mount again", GUARD, || {
        std::fs::read_to_string(s.m("Documents/essay.txt")).is_ok_and(|t| t == "draft 1\n")
    });
    let out = ccfs_within(&["umount".as_ref(), s.mnt.as_os_str()]);
    assert!(out.status.success(), "umount: {}", text(&out));
    assert_eq!(
        read(&s.home.join(".newrc")),
        "made in the session\nduring the hang\n"
    );
}

/// Documents open for writing when the server hangs, as many as the daemon has threads:
/// once the daemon has noticed the hang, each program's look at its file's size, next
/// write and close fail at once (ENOTCONN) instead of each holding one of the daemon's
/// threads until the server answers, and a cached dotfile is read meanwhile; the mount's
/// free space (the share's) fails at once too. (A document's I/O and its close go
/// through the daemon on a share that acts at a close, as this FUSE server does.)
#[test]
fn documents_written_and_closed_during_a_hang_hold_up_no_thread_of_the_daemon() {
    let mut server = CcfsServer::start();
    let s = Session::start(&server);
    write(&s.m(".newrc"), "made in the session\n");
    // Each program opens its document, writes, and waits for a line; then it writes
    // again, closes, and says how each went.
    let script = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, b"before\n")
print("open", flush=True)
sys.stdin.readline()
def tried(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return os.strerror(e.errno)
s = tried(lambda: os.lseek(fd, 0, os.SEEK_END))
w = tried(lambda: os.write(fd, b"during\n"))
c = tried(lambda: os.close(fd))
print(s + "|" + w + "|" + c, flush=True)
"#;
    let threads = 4; // the daemon's default
    let mut writers = Vec::new();
    for i in 0..threads {
        let mut child = Command::new("python3")
            .args(["-c", script])
            .arg(s.m(&format!("Documents/open{i}.txt")))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).expect("read");
        assert_eq!(line, "open\n");
        writers.push((child, out));
    }
    server.fail(Outage::Hangs);
    std::thread::sleep(Duration::from_millis(1500));
    wait_until("the daemon to notice the hang", GUARD, || {
        let out = ccfs_within(&["status".as_ref(), s.mnt.as_os_str()]);
        String::from_utf8_lossy(&out.stdout).contains("share: unreachable")
    });
    for (child, _) in &mut writers {
        let stdin = child.stdin.as_mut().expect("stdin");
        std::io::Write::write_all(stdin, b"go\n").expect("go");
    }
    let out = within(
        Command::new("cat").arg(s.m(".newrc")),
        "reading a cached dotfile while documents are written and closed",
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "made in the session\n"
    );
    // The share's free space (df, a file manager) is the share's too.
    let out = within(
        Command::new("stat").arg("-f").arg(&s.mnt),
        "the mount's free space during the hang",
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not connected"),
        "{}",
        text(&out)
    );
    for (i, (mut child, mut out)) in writers.into_iter().enumerate() {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).expect("read");
        let answers: Vec<&str> = line.trim_end().split('|').collect();
        let [seek, w, c] = answers[..] else {
            panic!("three answers: {line:?}");
        };
        // The seek to the end asks for the file's size (the kernel's has run out).
        assert!(
            seek == "ok" || seek.contains("not connected"),
            "document {i} during the hang: seek {seek:?}"
        );
        assert!(
            w.contains("not connected") && c.contains("not connected"),
            "document {i} during the hang: write {w:?}, close {c:?}"
        );
        child.wait().expect("wait");
    }
    server.restore();
    wait_until("the share to answer through the mount again", GUARD, || {
        std::fs::read_to_string(s.m("Documents/essay.txt")).is_ok_and(|t| t == "draft 1\n")
    });
    let out = ccfs_within(&["umount".as_ref(), s.mnt.as_os_str()]);
    assert!(out.status.success(), "umount: {}", text(&out));
    assert_eq!(read(&s.home.join(".newrc")), "made in the session\n");
}

/// A copy-up waits on the share without holding up the rest of the cache: a program
/// changes the mode of a large dotfile while the server hangs (the copy-up reads the
/// share's file and waits), and meanwhile another dotfile in the cache is read and written.
/// When the server answers again, the copy-up and the change finish, and the logout sends
/// both dotfiles whole.
#[test]
fn a_copy_up_waiting_on_a_hung_share_holds_up_no_other_dotfile() {
    // The server's kernel keeps names and attributes (a look answers), its daemon alone
    // reads data (no passthrough): a hung server then stops the copy, not the look.
    let mut server =
        CcfsServer::start_with("[mount]\nattr_timeout_ms = 60000\nkernel_passthrough = false\n");
    let s = Session::start(&server);
    let big: Vec<u8> = (0..4 << 20).map(|i| (i % 253) as u8).collect();
    std::fs::write(s.home.join(".places.db"), &big).expect("big dotfile");
    write(&s.m(".newrc"), "made in the session\n");
    assert_eq!(
        std::fs::metadata(s.m(".places.db")).expect("stat").len(),
        big.len() as u64
    );
    server.fail(Outage::Hangs);
    let chmod = Command::new("chmod")
        .arg("0600")
        .arg(s.m(".places.db"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chmod");
    let chmod_pid = chmod.id();
    wait_in_kernel(
        "the chmod to wait on the copy-up",
        chmod_pid,
        &["request_wait_answer"],
    );

    let out = within_for(
        Command::new("sh")
            .args([
                "-c",
                "printf 'during the copy-up\\n' >> \"$1\" && cat \"$1\"",
                "sh",
            ])
            .arg(s.m(".newrc")),
        "another dotfile while a copy-up waits",
        Duration::from_secs(20),
    );
    server.restore();
    let done = chmod.wait_with_output().expect("chmod");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "made in the session\nduring the copy-up\n"
    );
    assert!(done.status.success(), "{}", text(&done));
    let out = ccfs_within(&["umount".as_ref(), s.mnt.as_os_str()]);
    assert!(out.status.success(), "umount: {}", text(&out));
    let sent = s.home.join(".places.db");
    assert!(std::fs::read(&sent).expect("share") == big);
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&sent).expect("stat").permissions()
        ) & 0o777,
        0o600
    );
    assert_eq!(
        read(&s.home.join(".newrc")),
        "made in the session\nduring the copy-up\n"
    );
}

/// A directory moves only once the changes under way below it are done, so that each lands
/// where it was asked; when one waits on a hung share, the move gives up (EBUSY) after a
/// few seconds rather than hang, and the change lands in the directory it was asked of once
/// the share answers again.
#[test]
fn a_directory_move_waits_for_a_change_below_it_and_gives_up_when_that_hangs() {
    let mut server =
        CcfsServer::start_with("[mount]\nattr_timeout_ms = 60000\nkernel_passthrough = false\n");
    // The session's kernel keeps names a minute: the move and the new file's name are
    // known without asking the hung share.
    let s = Session::start_with(&server, "[mount]\nattr_timeout_ms = 60000\n");
    std::fs::create_dir(s.home.join("docs")).expect("docs");
    assert!(s.m("docs").is_dir());
    assert!(!s.m("moved").exists());
    assert!(!s.m("docs/report.txt").exists());
    server.fail(Outage::Hangs);
    let writer = Command::new("sh")
        .args(["-c", "printf 'saved\\n' > \"$1\"", "sh"])
        .arg(s.m("docs/report.txt"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("writer");
    wait_in_kernel(
        "the new file to wait on the share",
        writer.id(),
        &["request_wait_answer"],
    );
    // What the move said (the error's text, or "moved"), and the whole output.
    let rename = |what: &str| {
        let out = within_for(
            Command::new("/usr/bin/python3")
                .args([
                    "-c",
                    "import os,sys\n\
                     try:\n\
                     \x20   os.rename(sys.argv[1], sys.argv[2])\n\
                     \x20   print('moved')\n\
                     except OSError as e:\n\
                     \x20   print(os.strerror(e.errno))\n",
                ])
                .arg(s.m("docs"))
                .arg(s.m("moved")),
            what,
            Duration::from_secs(60),
        );
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            text(&out),
        )
    };
    let (said, out) = rename("the move while a change below waits on the share");
    assert_eq!(said, "Device or resource busy\n", "{out}");
    server.restore();
    let done = writer.wait_with_output().expect("writer");
    assert!(done.status.success(), "{}", text(&done));
    assert_eq!(read(&s.home.join("docs/report.txt")), "saved\n");
    let (said, out) = rename("the move once nothing waits");
    assert_eq!(said, "moved\n", "{out}");
    assert_eq!(read(&s.home.join("moved/report.txt")), "saved\n");
    assert!(!s.home.join("docs").exists());
}

/// A handle stuck on a hung share freezes no other open: a program writes for the first
/// time to a dotfile it opened read-write (the handle then looks the file up on the share,
/// which hangs, holding the handle; written through a shared mapping), another asks for that file's attributes, which the
/// share cannot give (the daemon then answers from the file's open handles and waits on
/// the stuck one), and meanwhile a third opens and reads a cached dotfile. The table of
/// open handles is let go before a handle is waited on: with it held, every open, read
/// and close of the mount waited for the share.
#[test]
fn a_handle_stuck_on_a_hung_share_holds_up_no_other_open() {
    let mut server =
        CcfsServer::start_with("[mount]\nattr_timeout_ms = 60000\nkernel_passthrough = false\n");
    let s = Session::start(&server);
    std::fs::write(s.home.join(".places.db"), "the share's version\n").expect("dotfile");
    write(&s.m(".newrc"), "made in the session\n");
    assert_eq!(read(&s.m(".places.db")), "the share's version\n");
    let mut writer = Command::new("/usr/bin/python3")
        .args([
            "-c",
            // Written through a shared mapping: the kernel's own check of a write
            // (`security.capability`, which would wait on the share first) is not made,
            // and the page written back reaches the handle.
            "import mmap,os,sys\n\
             fd = os.open(sys.argv[1], os.O_RDWR)\n\
             m = mmap.mmap(fd, 0)\n\
             assert m[:1] == b't'\n\
             print('open', flush=True)\n\
             sys.stdin.readline()\n\
             m[:1] = b'T'\n\
             m.flush()\n\
             m.close()\n\
             os.close(fd)\n",
        ])
        .arg(s.m(".places.db"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("writer");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(writer.stdout.as_mut().expect("stdout")),
        &mut line,
    )
    .expect("writer's line");
    assert_eq!(line, "open\n");
    // Holds the name without a handle of its own (O_PATH), to ask for its attributes later.
    let mut asker = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import os,sys\n\
             fd = os.open(sys.argv[1], os.O_PATH)\n\
             sys.stdin.readline()\n\
             print(os.stat(f'/proc/self/fd/{fd}').st_size)\n",
        ])
        .arg(s.m(".places.db"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("asker");
    server.fail(Outage::Hangs);
    std::io::Write::write_all(writer.stdin.as_mut().expect("stdin"), b"go\n").expect("go");
    let writer_pid = writer.id();
    // msync waits for the page's write-back, which the daemon answers once the handle
    // has looked the file up on the share.
    wait_in_kernel(
        "the first write to wait on the share",
        writer_pid,
        &["folio_wait_bit", "request_wait_answer"],
    );
    wait_until("the daemon to notice the hang", GUARD, || {
        let out = ccfs_within(&["status".as_ref(), s.mnt.as_os_str()]);
        String::from_utf8_lossy(&out.stdout).contains("share: unreachable")
    });
    // Past the kernel's kept attributes (a second): the daemon is asked for the node's
    // attributes (the name is not looked up: the path is the descriptor's), the share
    // cannot answer (the gate is closed), and the answer must come from the stuck handle.
    std::io::Write::write_all(asker.stdin.as_mut().expect("stdin"), b"go\n").expect("go");
    let asker_pid = asker.id();
    wait_in_kernel(
        "the attribute request to wait on the stuck handle",
        asker_pid,
        &["request_wait_answer"],
    );

    let out = within_for(
        Command::new("sh")
            .args([
                "-c",
                "printf 'during the hang\\n' >> \"$1\" && cat \"$1\"",
                "sh",
            ])
            .arg(s.m(".newrc")),
        "another dotfile opened while a handle is stuck",
        Duration::from_secs(20),
    );
    server.restore();
    let asked = asker.wait_with_output().expect("stat");
    let wrote = writer.wait_with_output().expect("writer");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "made in the session\nduring the hang\n"
    );
    assert!(asked.status.success(), "{}", text(&asked));
    assert_eq!(String::from_utf8_lossy(&asked.stdout), "20\n");
    // The stuck write either goes on once the share answers, or, when one of its share
    // accesses came after the probe had closed the gate (the write-back and the msync's
    // FSYNC reach the daemon at the kernel's pace), fails at once with ENOTCONN: the
    // program is told. Never a hang, never a write answered and then dropped.
    let written = wrote.status.success();
    assert!(
        written || text(&wrote).contains("Errno 107"),
        "the write either went on or was told of the outage: {}",
        text(&wrote)
    );
    let out = ccfs_within(&["umount".as_ref(), s.mnt.as_os_str()]);
    assert!(out.status.success(), "umount: {}", text(&out));
    // Written: the new version. Told of the outage: the page may have gone before the
    // msync's FSYNC failed, so either whole version.
    let on_share = read(&s.home.join(".places.db"));
    assert!(
        on_share == "The share's version\n" || (!written && on_share == "the share's version\n"),
        "{on_share:?}: {}",
        text(&wrote)
    );
    assert_eq!(
        read(&s.home.join(".newrc")),
        "made in the session\nduring the hang\n"
    );
}

fn on_gluster(how: Outage, cached_io: bool) {
    let Some(mut server) = GlusterServer::from_env() else {
        e2e::skip("CCFS_TEST_GLUSTER_STATE is not set (scripts/test starts the GlusterFS testbed and sets it)");
        return;
    };
    let _one_outage_at_a_time = GLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    session_through_an_outage(&mut server, how, cached_io);
}

#[test]
fn on_glusterfs_bricks_killed_mid_session() {
    on_gluster(Outage::Died, false);
}

#[test]
fn on_glusterfs_bricks_stopped_mid_session() {
    on_gluster(Outage::Hangs, false);
}

#[test]
fn on_glusterfs_cached_dotfiles_stay_usable_with_the_bricks_killed() {
    on_gluster(Outage::Died, true);
}

#[test]
fn on_glusterfs_cached_dotfiles_stay_usable_with_the_bricks_stopped() {
    on_gluster(Outage::Hangs, true);
}

// ---- finding the daemon ------------------------------------------------------------------------

/// The mount table records the cache dir, carried back exactly even with a space in it;
/// one with a comma (a mount option separator) is refused before anything is made.
#[test]
fn the_mount_table_names_the_cache_and_uncarriable_cache_dirs_are_refused() {
    let fx = Fixture::new();
    let cache = fx.tmp.path().join("cache with space");
    let m = fx.mount_at(&fx.mnt, &cache, &[]);
    let mnt = fx.mnt.canonicalize().expect("mnt");
    let entry = ccfs::control::find_mount(&fx.mnt)
        .expect("mount table")
        .expect("listed");
    assert_eq!(
        ccfs::control::cache_dir_of_source(&entry.source),
        Some(cache.clone()),
        "{entry:?}"
    );
    assert_eq!(entry.mount_point, mnt);
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));

    let bad = fx.tmp.path().join("cache,with,commas");
    let out = ccfs(&[
        "mount".as_ref(),
        "--cache-dir".as_ref(),
        bad.as_os_str(),
        fx.share.as_os_str(),
        fx.mnt.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("comma") && stderr.contains("choose a --cache-dir"),
        "{stderr}"
    );
    assert!(!bad.exists(), "nothing made");
    assert!(!in_mount_table(&mnt), "nothing mounted");
}

/// Whoever answers on a mount's control socket must be root or the owner of the mount or
/// its cache: a socket another user put there is not believed.
#[test]
fn a_control_socket_served_by_another_user_is_not_trusted() {
    let Some(bob) = ccfs::sys::user_by_name("ccfs-bob").expect("passwd") else {
        e2e::skip("the user ccfs-bob is missing (./scripts/setup makes it)");
        return;
    };
    let fx = Fixture::new();
    let m = fx.mount();
    let sock = fx.cache.join("control.sock");
    let real = fx.cache.join("control.sock.real");
    std::fs::rename(&sock, &real).expect("move the socket away");
    // The cache dir opened up for a moment, as a careless admin might.
    let mode = |m: u32| {
        std::fs::set_permissions(&fx.cache, std::os::unix::fs::PermissionsExt::from_mode(m))
    };
    mode(0o777).expect("chmod");
    // ... and the way to it: the test's temporary directory is private.
    std::fs::set_permissions(
        fx.tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .expect("chmod tmp");
    let mut impostor = Command::new("setpriv")
        .args([
            &format!("--reuid={}", bob.uid),
            &format!("--regid={}", bob.gid),
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])\ns.listen()\nprint('ready',flush=True)\nc,_=s.accept()\nc.sendall(b'{\"pid\":1}\\n')\nimport time\ntime.sleep(30)",
        ])
        .arg(&sock)
        .stdout(Stdio::piped())
        .spawn()
        .expect("impostor");
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(impostor.stdout.as_mut().expect("stdout")),
        &mut ready,
    )
    .expect("ready");
    assert_eq!(ready.trim(), "ready");
    let out = ccfs_within(&["status".as_ref(), fx.mnt.as_os_str()]);
    let _ = impostor.kill();
    let _ = impostor.wait();
    std::fs::remove_file(&sock).expect("rm impostor socket");
    std::fs::rename(&real, &sock).expect("socket back");
    mode(0o700).expect("chmod back");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("uid {}", bob.uid))
            && stderr.contains("neither root nor the owner"),
        "{stderr}"
    );
    let out = m.umount();
    assert!(
        out.status.success(),
        "the real daemon still answers: {}",
        text(&out)
    );
}

/// A symlink put at the control socket's name (the cache is its user's) never leads
/// root's `ccfs status` to another socket: nothing connects to the one it points at.
#[test]
fn a_symlink_at_the_control_socket_leads_nowhere() {
    let fx = Fixture::new();
    let m = fx.mount();
    let sock = fx.cache.join("control.sock");
    let real = fx.cache.join("control.sock.real");
    std::fs::rename(&sock, &real).expect("move the socket away");
    let elsewhere = fx.tmp.path().join("roots.sock");
    let listener = std::os::unix::net::UnixListener::bind(&elsewhere).expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    std::os::unix::fs::symlink(&elsewhere, &sock).expect("symlink");
    let out = ccfs_within(&["status".as_ref(), fx.mnt.as_os_str()]);
    let reached = listener.accept().is_ok();
    std::fs::remove_file(&sock).expect("rm symlink");
    std::fs::rename(&real, &sock).expect("socket back");
    assert!(!reached, "root's status connected through the symlink");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
}

/// Root's `ccfs recover` of every cache (as at boot) with one cache on a share that hangs:
/// that cache is reported as unreachable after one bounded look, and the next cache is
/// still recovered.
#[test]
fn a_hung_share_holds_up_the_recovery_of_no_other_cache() {
    let mut server = CcfsServer::start();
    let tmp = tempfile::Builder::new()
        .prefix("ccfs-recover-all-")
        .tempdir()
        .expect("tmp");
    let root = tmp.path().join("caches");
    let uid_dir = root.join("0");
    std::fs::create_dir_all(&uid_dir).expect("cache root");
    // Two crashed sessions: "a" over a home on the server, "b" over a plain directory.
    let homes = [
        tempfile::Builder::new()
            .prefix("home-")
            .tempdir_in(server.root())
            .expect("home on the server"),
        tempfile::Builder::new()
            .prefix("home-")
            .tempdir()
            .expect("plain home"),
    ];
    for (name, home) in ["a", "b"].iter().zip(&homes) {
        let mnt = tmp.path().join(format!("mnt-{name}"));
        std::fs::create_dir(&mnt).expect("mnt");
        let cache = uid_dir.join(name);
        let out = ccfs_within(&[
            "mount".as_ref(),
            "--cache-dir".as_ref(),
            cache.as_os_str(),
            home.path().as_os_str(),
            mnt.as_os_str(),
        ]);
        assert!(out.status.success(), "mount: {}", text(&out));
        write(&mnt.join(".rc"), &format!("made in session {name}\n"));
        let pid = status_pid(&mnt);
        kill(pid, libc::SIGKILL);
        wait_until("the daemon's death", GUARD, || !alive(pid));
        detach(&mnt);
    }
    server.fail(Outage::Hangs);
    let out = within(
        Command::new(ccfs_bin())
            .arg("recover")
            .env("CCFS_CACHE_ROOT", &root),
        "root's recover of every cache",
    );
    server.restore();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        stdout.contains("not reachable")
            && stdout.contains(&uid_dir.join("a").display().to_string()),
        "{}",
        text(&out)
    );
    assert_eq!(read(&homes[1].path().join(".rc")), "made in session b\n");
    // Once the server answers, the first cache is recovered too.
    let out = ccfs_within(&[
        "recover".as_ref(),
        "--cache-dir".as_ref(),
        uid_dir.join("a").as_os_str(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&homes[0].path().join(".rc")), "made in session a\n");
}
