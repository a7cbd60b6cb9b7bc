//! The PAM session hook through the real PAM stack: `pamtester` opens and closes sessions
//! of a PAM service whose session line is the shipped one (`deploy/pam/ccfs`; with
//! `CCFS_PAM_INSTALLED=1`, the installed `/usr/share/pam-configs/ccfs` and `/usr/bin/ccfs`),
//! made `required` so that a hook that failed would fail the login, with `--config` naming
//! this test's homes. A second module in the stack holds each session open until the test
//! lets it close (pamtester itself opens and closes at once).
//!
//! Needs pamtester and the user ccfs-alice (scripts/setup installs and creates them).

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use e2e::*;

/// The hook keeps its state per user in /run/ccfs/sessions: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const USER: &str = "ccfs-alice";

/// A throwaway machine: share root, home root, cache root, a config, a PAM service.
struct Lab {
    dir: PathBuf,
    service: String,
    config: PathBuf,
}

/// An open session: a pamtester process held in its open_session.
struct Session {
    child: Child,
    go: PathBuf,
}

/// The hook's static launcher: the installed one, or the one `scripts/test` builds for the
/// musl target.
fn clean_exec_bin() -> PathBuf {
    if installed() {
        return PathBuf::from("/usr/libexec/ccfs/ccfs-clean-exec");
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/x86_64-unknown-linux-musl/debug/ccfs-clean-exec");
    assert!(
        p.is_file(),
        "{} not found: build it with `cargo build -p cleanexec --target x86_64-unknown-linux-musl` (scripts/test does)",
        p.display()
    );
    p
}

fn installed() -> bool {
    std::env::var_os("CCFS_PAM_INSTALLED").is_some_and(|v| v == "1")
}

impl Lab {
    fn new(extra_config: &str) -> Self {
        Self::new_with(extra_config, "")
    }

    /// A lab whose PAM service has `before_hook` (session lines) before the hook.
    fn new_with(extra_config: &str, before_hook: &str) -> Self {
        Self::new_wrapped(extra_config, before_hook, None)
    }

    /// [`Lab::new_with`], the hook's launcher starting the program `wrapper` (its
    /// arguments: ccfs and the hook's own) instead of ccfs itself.
    fn new_wrapped(extra_config: &str, before_hook: &str, wrapper: Option<&Path>) -> Self {
        let n = {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        };
        let dir = PathBuf::from(format!("/var/tmp/ccfs-pam-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for d in ["", "share", "home"] {
            fs::create_dir_all(dir.join(d)).expect("mkdir");
            fs::set_permissions(dir.join(d), fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let config = dir.join("ccfs.toml");
        fs::write(
            &config,
            format!(
                "[homes]\nshare_root = \"{d}/share\"\nhome_root = \"{d}/home\"\ncache_root = \"{d}/cache\"\n\
                 [session]\nmin_uid = 100\nsystemd_scope = false\n{extra_config}",
                d = dir.display()
            ),
        )
        .expect("config");
        let pause = dir.join("hold");
        fs::write(
            &pause,
            format!(
                "#!/bin/sh\nPATH=/usr/sbin:/usr/bin:/sbin:/bin\n[ \"$PAM_TYPE\" = open_session ] || exit 0\n\
                 t=$(printf %s \"$PAM_TTY\" | tr -cd a-z0-9)\n\
                 touch {d}/opened-$t\n\
                 i=0; while [ ! -e {d}/go-$t ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done\n",
                d = dir.display()
            ),
        )
        .expect("hold script");
        fs::set_permissions(&pause, fs::Permissions::from_mode(0o755)).expect("chmod");
        let service = format!("ccfs-test-{}-{n}", std::process::id());
        let pam = format!(
            "auth required pam_permit.so\naccount required pam_permit.so\n{before_hook}\n{}\nsession required pam_exec.so {}\n",
            Self::hook_line(&dir, &config, wrapper),
            pause.display()
        );
        fs::write(Path::new("/etc/pam.d").join(&service), pam).expect("PAM service");
        Self {
            dir,
            service,
            config,
        }
    }

    /// The shipped session line, `required`, logging to the lab, with the lab's config.
    fn hook_line(dir: &Path, config: &Path, wrapper: Option<&Path>) -> String {
        let shipped = if installed() {
            PathBuf::from("/usr/share/pam-configs/ccfs")
        } else {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/pam/ccfs")
        };
        let text = fs::read_to_string(&shipped).expect("the shipped pam-configs file");
        let line = text
            .lines()
            .skip_while(|l| *l != "Session:")
            .nth(1)
            .expect("a Session: line");
        let mut words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        assert_eq!(words[0], "optional", "a login never fails for ccfs: {line}");
        assert_eq!(words[1], "pam_exec.so", "{line}");
        assert_eq!(words[2], "seteuid", "the hook runs as root alone: {line}");
        assert_eq!(
            words[3], "/usr/libexec/ccfs/ccfs-clean-exec",
            "the hook starts through its static launcher: {line}"
        );
        assert_eq!(words[4], "/usr/bin/ccfs", "{line}");
        words[0] = "required".into();
        words.insert(2, format!("log={}/hook.log", dir.display()));
        if !installed() {
            words[4] = clean_exec_bin().display().to_string();
            words[5] = ccfs_bin().display().to_string();
        }
        if let Some(w) = wrapper {
            // A program the launcher starts in front of ccfs: see
            // `no_loader_variable_of_the_pam_environment_reaches_the_hook`.
            words.insert(5, w.display().to_string());
        }
        format!("session {} --config {}", words.join(" "), config.display())
    }

    fn share(&self) -> PathBuf {
        self.dir.join("share").join(USER)
    }

    /// Makes `user`'s home on the share (theirs, 0700).
    fn share_of(&self, user: &str) -> PathBuf {
        let a = account(user);
        let p = self.dir.join("share").join(user);
        fs::create_dir(&p).expect("mkdir");
        std::os::unix::fs::chown(&p, Some(a.uid), Some(a.gid)).expect("chown");
        p
    }

    fn home(&self) -> PathBuf {
        self.dir.join("home").join(USER)
    }

    /// Makes the user's home on the share (theirs, 0700) with a document in it.
    fn with_user_share(self) -> Self {
        let a = account(USER);
        fs::create_dir(self.share()).expect("mkdir");
        write(&self.share().join("doc.txt"), "doc\n");
        for p in [self.share(), self.share().join("doc.txt")] {
            std::os::unix::fs::chown(&p, Some(a.uid), Some(a.gid)).expect("chown");
        }
        fs::set_permissions(self.share(), fs::Permissions::from_mode(0o700)).expect("chmod");
        self
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("hook.log")).unwrap_or_default()
    }

    /// Opens a session of `user` on `tty` and waits until it is open (the hook done).
    fn open_as(&self, user: &str, tty: &str, limit: Duration) -> Session {
        let child = Command::new("pamtester")
            .args(["-I", &format!("tty={tty}"), &self.service, user])
            .args(["open_session", "close_session"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("pamtester (scripts/setup installs it)");
        let opened = self.dir.join(format!("opened-{tty}"));
        let start = Instant::now();
        let mut s = Session {
            child,
            go: self.dir.join(format!("go-{tty}")),
        };
        while !opened.exists() {
            if let Ok(Some(st)) = s.child.try_wait() {
                panic!(
                    "pamtester ended ({st}) before the session was open: {}",
                    self.log()
                );
            }
            assert!(
                start.elapsed() < limit,
                "the login did not finish within {limit:?}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    fn open(&self, tty: &str) -> Session {
        self.open_as(USER, tty, Duration::from_secs(120))
    }

    fn mounted(&self) -> Option<fsinfo::MountEntry> {
        fsinfo::mounts()
            .expect("mount table")
            .into_iter()
            .rev()
            .find(|m| m.mount_point == self.home())
    }

    fn state(&self, uid: u32) -> Option<serde_json::Value> {
        let text = fs::read_to_string(format!("/run/ccfs/sessions/{uid}.json")).ok()?;
        Some(serde_json::from_str(&text).expect("state json"))
    }
}

impl Session {
    /// Lets the session close and waits for pamtester (bounded).
    fn close(mut self) -> Output {
        fs::write(&self.go, "").expect("go");
        let start = Instant::now();
        while self.child.try_wait().expect("wait").is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(180),
                "the logout did not end within 3 minutes"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = std::mem::replace(&mut self.child, Command::new("true").spawn().expect("true"))
            .wait_with_output()
            .expect("pamtester output");
        assert!(
            out.status.success(),
            "pamtester failed: a login or logout failed because of ccfs: {}",
            text(&out)
        );
        out
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = fs::remove_file(Path::new("/etc/pam.d").join(&self.service));
        for m in fsinfo::mounts().unwrap_or_default().iter().rev() {
            if m.mount_point.starts_with(&self.dir) {
                let _ = Command::new("umount")
                    .arg("-l")
                    .arg(&m.mount_point)
                    .output();
            }
        }
        let _ = fs::remove_file(format!("/run/ccfs/sessions/{}.json", account(USER).uid));
        // A daemon that just let go of a mount in here may still be ending: try again a
        // moment later, so no lab is left behind.
        for _ in 0..50 {
            if fs::remove_dir_all(&self.dir).is_ok() || !self.dir.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn as_alice(script: &str) -> Output {
    let out = as_user(USER, script);
    assert!(out.status.success(), "{script}: {}", text(&out));
    out
}

fn daemon_uid(home: &Path) -> u32 {
    let st = ccfs(&["status".as_ref(), "--json".as_ref(), home.as_os_str()]);
    assert!(st.status.success(), "{}", text(&st));
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).expect("json");
    let pid = v["pid"].as_u64().expect("pid");
    fs::metadata(format!("/proc/{pid}")).expect("daemon").uid()
}

/// A login mounts the home through ccfs as the user; a second session (GUI + SSH) shares
/// that mount; the first logout leaves it for the other session; the last one syncs the
/// dotfiles written during the sessions to the share and unmounts.
#[test]
fn two_sessions_share_one_mount_and_the_last_logout_syncs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::new("").with_user_share();
    let alice = account(USER);
    let home = lab.home();
    assert!(!home.exists(), "the hook makes the mount point");

    let gui = lab.open("gui");
    let m = lab.mounted().expect("the login mounted the home");
    assert_eq!(m.fs_type, "fuse.ccfs", "{m:?}");
    assert_eq!(daemon_uid(&home), alice.uid, "the daemon works as the user");
    as_alice(&format!(
        "cat {h}/doc.txt && echo 'alias ll=ls' > {h}/.bashrc && echo report > {h}/report.txt",
        h = home.display()
    ));
    assert_eq!(
        read(&lab.share().join("report.txt")),
        "report\n",
        "documents go straight through"
    );
    assert!(
        !lab.share().join(".bashrc").exists(),
        "a dotfile stays local until the logout"
    );

    let ssh = lab.open("ssh");
    let state = lab.state(alice.uid).expect("sessions recorded");
    assert_eq!(
        state["sessions"].as_array().map(Vec::len),
        Some(2),
        "{state}"
    );
    assert_eq!(lab.mounted().map(|m| m.fs_type), Some("fuse.ccfs".into()));
    assert_eq!(
        fsinfo::mounts()
            .expect("mounts")
            .iter()
            .filter(|m| m.mount_point == home)
            .count(),
        1,
        "the second session mounted nothing more"
    );
    as_alice(&format!("echo second >> {}/.bashrc", home.display()));

    ssh.close();
    assert!(
        lab.mounted().is_some(),
        "the first logout leaves the home of the other session"
    );
    assert!(
        !lab.share().join(".bashrc").exists(),
        "and syncs nothing yet"
    );
    as_alice(&format!("cat {}/.bashrc", home.display()));

    gui.close();
    assert!(
        lab.mounted().is_none(),
        "the last logout unmounted the home: {}",
        lab.log()
    );
    assert_eq!(read(&lab.share().join(".bashrc")), "alias ll=ls\nsecond\n");
    assert_eq!(
        fs::metadata(lab.share().join(".bashrc")).expect("rc").uid(),
        alice.uid
    );
    assert!(lab.state(alice.uid).is_none(), "no session left recorded");
    let log = lab.log();
    assert!(log.contains("mounted through ccfs"), "{log}");
    assert!(log.contains("1 other session(s) still open"), "{log}");
    assert!(log.contains("all changes are on the share"), "{log}");
}

/// Programs still using the home at the last logout: the sync runs, the wait for them is
/// bounded, the home is detached lazily and the daemon syncs what they write later once
/// they end. A login meanwhile waits for that daemon (bounded) and mounts afresh.
#[test]
fn a_home_still_in_use_at_logout_is_synced_detached_and_synced_again() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::new("busy_timeout_secs = 1\nwait_previous_secs = 120\n").with_user_share();
    let home = lab.home();
    let s = lab.open("one");
    as_alice(&format!("echo v1 > {}/.profile", home.display()));
    // A program of the session that outlives it, its working directory in the home.
    let mut lingering = Command::new("setpriv")
        .args([
            "--reuid",
            USER,
            "--regid",
            USER,
            "--init-groups",
            "sh",
            "-c",
        ])
        .arg(format!(
            "cd {} && read line; echo late > .late; read line",
            home.display()
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("lingering program");
    wait_until("the program in the home", Duration::from_secs(10), || {
        fs::read_link(format!("/proc/{}/cwd", lingering.id())).is_ok_and(|c| c == home)
    });
    s.close();
    assert!(lab.mounted().is_none(), "detached: {}", lab.log());
    assert_eq!(
        read(&lab.share().join(".profile")),
        "v1\n",
        "synced before detaching"
    );
    let log = lab.log();
    assert!(
        log.contains("detached lazily") && log.contains("(pid "),
        "{log}"
    );

    // A new login while the program still holds the old mount: it waits for the old
    // daemon, which ends (and syncs) once the program writes and ends.
    let opening = std::thread::spawn({
        let dir = lab.dir.clone();
        let service = lab.service.clone();
        move || {
            Command::new("pamtester")
                .args([
                    "-I",
                    "tty=two",
                    &service,
                    USER,
                    "open_session",
                    "close_session",
                ])
                .stdin(Stdio::null())
                .output()
                .map(|o| (o, dir))
        }
    });
    wait_until(
        "the login to wait for the old daemon",
        Duration::from_secs(60),
        || lab.log().contains("still serves programs of it"),
    );
    {
        use std::io::Write;
        let mut stdin = lingering.stdin.take().expect("stdin");
        stdin.write_all(b"1\n").expect("write");
        // Dropped: its second read ends, and so does the program.
    }
    let _ = lingering.wait();
    wait_until("the new login's mount", Duration::from_secs(60), || {
        lab.dir.join("opened-two").exists()
    });
    assert_eq!(
        read(&lab.share().join(".late")),
        "late\n",
        "the old daemon synced the late write"
    );
    assert_eq!(lab.mounted().map(|m| m.fs_type), Some("fuse.ccfs".into()));
    fs::write(lab.dir.join("go-two"), "").expect("go");
    let (out, _) = opening.join().expect("thread").expect("pamtester");
    assert!(out.status.success(), "{}", text(&out));
    assert!(lab.mounted().is_none(), "{}", lab.log());
}

/// A login whose home ccfs cannot mount (here the config names an rsync that does not
/// exist) goes on: with fallback "share" the home on the share is bind-mounted there and
/// works without the cache; with "none" nothing is mounted. Either way the reason is
/// logged and the logout cleans up.
#[test]
fn a_login_ccfs_cannot_mount_falls_back_to_what_the_admin_chose() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let broken = "[sync]\nrsync = \"/nonexistent/rsync\"\n";
    let lab = Lab::new(&format!("fallback = \"share\"\n{broken}")).with_user_share();
    let s = lab.open("one");
    let m = lab.mounted().expect("the share's home is bind-mounted");
    assert_ne!(m.fs_type, "fuse.ccfs", "{m:?}");
    as_alice(&format!("echo direct > {}/.direct", lab.home().display()));
    assert_eq!(
        read(&lab.share().join(".direct")),
        "direct\n",
        "no cache: straight to the share"
    );
    let log = lab.log();
    assert!(
        log.contains("rsync") && log.contains("fallback \"share\""),
        "{log}"
    );
    s.close();
    assert!(
        lab.mounted().is_none(),
        "the logout unmounted the bind: {}",
        lab.log()
    );
    drop(lab);

    let lab = Lab::new(&format!("fallback = \"none\"\n{broken}")).with_user_share();
    let s = lab.open("one");
    assert!(lab.mounted().is_none(), "fallback none mounts nothing");
    assert!(lab.log().contains("fallback \"none\""), "{}", lab.log());
    s.close();
    assert!(lab.log().contains("nothing was mounted"), "{}", lab.log());
}

/// A share that hangs (its server stopped) delays a login by the configured time only:
/// the mount and the fallback are given up on, the login goes on, the log says why.
#[test]
fn a_hung_share_delays_a_login_by_the_configured_time_only() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::new("login_timeout_secs = 3\nwait_previous_secs = 0\n");
    // The share root: a ccfs of root's passing a plain directory through, frozen below.
    let backing = lab.dir.join("backing");
    fs::create_dir(&backing).expect("mkdir");
    let alice = account(USER);
    fs::create_dir(backing.join(USER)).expect("mkdir");
    std::os::unix::fs::chown(backing.join(USER), Some(alice.uid), Some(alice.gid)).expect("chown");
    let out = ccfs(&[
        "mount".as_ref(),
        "--cache-dir".as_ref(),
        lab.dir.join("server-cache").as_os_str(),
        backing.as_os_str(),
        lab.dir.join("share").as_os_str(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let share_mount = lab.dir.join("share");
    let st = ccfs(&[
        "status".as_ref(),
        "--json".as_ref(),
        share_mount.as_os_str(),
    ]);
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).expect("json");
    let server = v["pid"].as_u64().expect("pid") as u32;
    stop(server);
    let start = Instant::now();
    let s = lab.open_as(USER, "one", Duration::from_secs(90));
    let took = start.elapsed();
    kill(server, libc::SIGCONT);
    let log = lab.log();
    assert!(log.contains("did not come up within"), "{log}");
    assert!(log.contains("fallback \"share\" failed too"), "{log}");
    assert!(
        lab.mounted().is_none(),
        "nothing mounted over the home: {log}"
    );
    s.close();
    let _ = Command::new("fusermount3")
        .arg("-u")
        .arg(&share_mount)
        .output();
    eprintln!("login with a hung share took {took:?}");
}

/// Root and system accounts (below min_uid) are left alone; the hook run outside PAM
/// refuses with a clear message.
#[test]
fn system_accounts_are_left_alone_and_the_hook_needs_pam() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::new("");
    let s = lab.open_as("root", "root", Duration::from_secs(60));
    assert!(fsinfo::mounts()
        .expect("mounts")
        .iter()
        .all(|m| !m.mount_point.starts_with(&lab.dir)));
    assert!(lab.state(0).is_none(), "no state for root");
    s.close();
    assert!(
        !lab.log().contains("ccfs-session:"),
        "nothing to say about root: {}",
        lab.log()
    );

    let out = ccfs(&[
        "pam-session".as_ref(),
        "--config".as_ref(),
        lab.config.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("PAM_TYPE is not set"), "{}", text(&out));
}

/// A PAM_USER or PAM_TYPE set in the PAM environment (pam_env, perhaps from a user's own
/// file) comes before pam_exec's own items: the hook trusts none of them and does nothing,
/// so nobody's home is mounted for another user's login.
#[test]
fn pam_items_set_in_the_pam_environment_are_not_trusted() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let conf = format!("/var/tmp/ccfs-pam-env-{}.conf", std::process::id());
    fs::write(&conf, "PAM_USER DEFAULT=ccfs-bob\n").expect("pam_env conf");
    let lab = Lab::new_with(
        "",
        &format!("session required pam_env.so readenv=0 user_readenv=0 conffile={conf}"),
    )
    .with_user_share();
    lab.share_of("ccfs-bob");
    let s = lab.open("one");
    assert!(
        fsinfo::mounts()
            .expect("mounts")
            .iter()
            .all(|m| !m.mount_point.starts_with(&lab.dir)),
        "nothing mounted, for alice or bob: {}",
        lab.log()
    );
    assert!(
        lab.log().contains("PAM_USER appears twice"),
        "{}",
        lab.log()
    );
    assert!(lab.state(account("ccfs-bob").uid).is_none());
    s.close();
    let _ = fs::remove_file(&conf);
}

/// The share's own mount restrictions (noexec, nosymfollow) hold for the home too, through
/// ccfs and through the fallback bind, which is also nosuid and nodev: the home is no way
/// around them.
#[test]
fn the_home_keeps_the_shares_mount_restrictions() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let opts = |m: &fsinfo::MountEntry| -> Vec<String> {
        m.options.split(',').map(str::to_string).collect()
    };
    for broken in [false, true] {
        let extra = if broken {
            "[sync]\nrsync = \"/nonexistent/rsync\"\n"
        } else {
            ""
        };
        let lab = Lab::new(extra);
        let share_root = lab.dir.join("share");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "noexec,nosymfollow,mode=755", "share"])
            .arg(&share_root)
            .output()
            .expect("mount");
        assert!(out.status.success(), "{}", text(&out));
        let lab = lab.with_user_share();
        let s = lab.open("one");
        let m = lab.mounted().expect("the home is mounted");
        assert_eq!(m.fs_type == "fuse.ccfs", !broken, "{m:?}: {}", lab.log());
        let o = opts(&m);
        for want in ["noexec", "nosymfollow", "nosuid", "nodev"] {
            assert!(o.iter().any(|x| x == want), "{want} missing on {m:?}");
        }
        s.close();
        assert!(lab.mounted().is_none(), "{}", lab.log());
        let _ = Command::new("umount").arg(&share_root).output();
    }
}

/// A mount stacked on the home during the session (a user may mount a FUSE filesystem on
/// a directory of theirs): the logout detaches it, then syncs and unmounts the login's own
/// mount, through ccfs and through the fallback bind; nothing is left at the home.
#[test]
fn a_mount_stacked_on_the_home_is_detached_and_the_logout_still_syncs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for broken in [false, true] {
        let extra = if broken {
            "[sync]\nrsync = \"/nonexistent/rsync\"\n"
        } else {
            ""
        };
        let lab = Lab::new(extra).with_user_share();
        let s = lab.open("one");
        as_alice(&format!("echo kept > {}/.kept", lab.home().display()));
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "mode=777", "stacked"])
            .arg(lab.home())
            .output()
            .expect("mount");
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(lab.mounted().map(|m| m.fs_type), Some("tmpfs".into()));
        s.close();
        let log = lab.log();
        assert!(
            fsinfo::mounts()
                .expect("mounts")
                .iter()
                .all(|m| m.mount_point != lab.home()),
            "nothing left at the home: {log}"
        );
        assert!(log.contains("detached 1 mount(s) stacked"), "{log}");
        assert_eq!(read(&lab.share().join(".kept")), "kept\n", "{log}");
    }
}

/// A library that marks where it was loaded: by the loader as a preload (its
/// constructor), as an audit library (`la_version`), or in place of libgcc_s (found
/// through LD_LIBRARY_PATH). Each mark is a line `WHAT EXE` appended to `marks`.
fn planted_library(dir: &Path, out: &Path, what: &str, soname: Option<&str>, marks: &Path) {
    let src = dir.join(format!("{what}.c"));
    fs::write(
        &src,
        format!(
            r#"#include <fcntl.h>
#include <string.h>
#include <unistd.h>
static void mark(const char *what) {{
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n < 0) n = 0;
    exe[n] = 0;
    int fd = open("{marks}", O_WRONLY | O_CREAT | O_APPEND, 0666);
    if (fd < 0) return;
    write(fd, what, strlen(what));
    write(fd, " ", 1);
    write(fd, exe, (size_t)n);
    write(fd, "\n", 1);
    close(fd);
}}
__attribute__((constructor)) static void on_load(void) {{ mark("{what}"); }}
unsigned int la_version(unsigned int v) {{ mark("{what}-audit"); return v; }}
"#,
            marks = marks.display()
        ),
    )
    .expect("library source");
    let mut cc = Command::new("gcc");
    cc.args(["-shared", "-fPIC", "-o"]).arg(out).arg(&src);
    if let Some(s) = soname {
        cc.arg(format!("-Wl,-soname,{s}"));
    }
    let built = cc.output().expect("gcc (scripts/setup installs it)");
    assert!(built.status.success(), "{}", text(&built));
}

/// pam_exec runs the hook as root with the PAM environment, which `pam_env user_readenv=1`
/// fills from the user's own file. A student who plants `LD_PRELOAD`, `LD_AUDIT`,
/// `LD_LIBRARY_PATH` and `GLIBC_TUNABLES` there reaches the loader of every dynamically
/// linked program that PAM starts (a shell started the same way just before the hook
/// loads her libraries: the test's proof that the plant works), but not the hook's: its
/// launcher is static, passes PAM's items and a fixed PATH alone, and ccfs then mounts
/// and syncs the home as usual.
#[test]
fn no_loader_variable_of_the_pam_environment_reaches_the_hook() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tools = PathBuf::from(format!("/var/tmp/ccfs-loader-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tools);
    fs::create_dir_all(tools.join("lib")).expect("mkdir");
    fs::set_permissions(&tools, fs::Permissions::from_mode(0o755)).expect("chmod");
    let marks = tools.join("marks");
    planted_library(&tools, &tools.join("preload.so"), "preload", None, &marks);
    planted_library(&tools, &tools.join("audit.so"), "audit", None, &marks);
    planted_library(
        &tools,
        &tools.join("lib/libgcc_s.so.1"),
        "libpath",
        Some("libgcc_s.so.1"),
        &marks,
    );
    // A recorder of the PAM environment, started by pam_exec as the hook is, but with
    // bash (dynamically linked), so that its marks are told apart from any other's.
    let recorder = tools.join("record-pam-env");
    fs::write(
        &recorder,
        format!(
            "#!/bin/bash\n/usr/bin/env > {}/pam-env-$PAM_TYPE\n",
            tools.display()
        ),
    )
    .expect("recorder");
    fs::set_permissions(&recorder, fs::Permissions::from_mode(0o755)).expect("chmod");
    // In front of ccfs, started by the launcher: a program that writes down its
    // environment in order (a shell would reorder it) and runs ccfs with it.
    let recorder_of_the_hook = tools.join("record-env");
    fs::write(
        tools.join("record-env.c"),
        format!(
            r#"#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
extern char **environ;
int main(int argc, char **argv) {{
    const char *type = getenv("PAM_TYPE");
    char path[4096];
    snprintf(path, sizeof path, "{t}/hook-env-%s", type ? type : "none");
    FILE *f = fopen(path, "w");
    if (f) {{
        for (char **e = environ; *e; e++) fprintf(f, "%s\n", *e);
        fclose(f);
    }}
    if (argc < 2) return 2;
    execv(argv[1], argv + 1);
    return 127;
}}
"#,
            t = tools.display()
        ),
    )
    .expect("recorder source");
    let built = Command::new("gcc")
        .arg("-o")
        .arg(&recorder_of_the_hook)
        .arg(tools.join("record-env.c"))
        .output()
        .expect("gcc");
    assert!(built.status.success(), "{}", text(&built));
    // The student's own file, where pam_env reads it: in her home (passwd's).
    let alice = account(USER);
    let pw_home = PathBuf::from(format!("/home/{USER}"));
    let made_home = !pw_home.exists();
    if made_home {
        fs::create_dir_all(&pw_home).expect("mkdir home");
        std::os::unix::fs::chown(&pw_home, Some(alice.uid), Some(alice.gid)).expect("chown");
    }
    let envfile = format!(".pam_environment-ccfs-test-{}", std::process::id());
    fs::write(
        pw_home.join(&envfile),
        format!(
            "LD_PRELOAD DEFAULT={t}/preload.so\nLD_AUDIT DEFAULT={t}/audit.so\n\
             LD_LIBRARY_PATH DEFAULT={t}/lib\nGLIBC_TUNABLES DEFAULT=glibc.malloc.check=3:glibc.malloc.perturb=165\n\
             PATH DEFAULT={t}/lib\n",
            t = tools.display()
        ),
    )
    .expect("plant");
    std::os::unix::fs::chown(pw_home.join(&envfile), Some(alice.uid), Some(alice.gid))
        .expect("chown");
    let lab = Lab::new_wrapped(
        "",
        &format!(
            "session required pam_env.so readenv=0 user_readenv=1 user_envfile={envfile}\n\
             session required pam_exec.so {}",
            recorder.display()
        ),
        Some(&recorder_of_the_hook),
    )
    .with_user_share();
    let s = lab.open("one");
    let mounted = lab.mounted().map(|m| m.fs_type);
    as_alice(&format!("echo planted > {}/.bashrc", lab.home().display()));
    s.close();
    let log = lab.log();
    let _ = fs::remove_file(pw_home.join(&envfile));
    if made_home {
        let _ = fs::remove_dir(&pw_home);
    }
    let read_or_empty = |p: PathBuf| fs::read_to_string(p).unwrap_or_default();
    let pam_env = read_or_empty(tools.join("pam-env-open_session"));
    let marks_seen = read_or_empty(marks.clone());
    let hook_env = [
        read_or_empty(tools.join("hook-env-open_session")),
        read_or_empty(tools.join("hook-env-close_session")),
    ];
    let _ = fs::remove_dir_all(&tools);

    for v in [
        "LD_PRELOAD=",
        "LD_AUDIT=",
        "LD_LIBRARY_PATH=",
        "GLIBC_TUNABLES=",
    ] {
        assert!(
            pam_env.lines().any(|l| l.starts_with(v)),
            "pam_env did not plant {v} (the test proves nothing): {pam_env}"
        );
    }
    assert!(
        marks_seen.lines().any(|l| l.starts_with("preload ") && l.ends_with("bash")),
        "the loader of a dynamically linked program started by pam_exec did not load the planted preload (the test proves nothing): {marks_seen:?}"
    );
    // The programs pam_exec starts around the hook (the recorder, the test's own session
    // holder, and what they run) load them; ccfs never does. (The shell in front of ccfs
    // is started by the launcher: its environment is checked below.)
    let foreign: Vec<&str> = marks_seen
        .lines()
        .filter(|l| {
            l.ends_with("/ccfs") || l.ends_with("/ccfs-clean-exec") || l.ends_with("/record-env")
        })
        .collect();
    assert!(
        foreign.is_empty(),
        "a planted library was loaded into the hook: {foreign:?}"
    );
    for (when, env) in ["login", "logout"].iter().zip(&hook_env) {
        assert!(!env.is_empty(), "the hook did not run at {when}: {log}");
        let names: Vec<&str> = env.lines().filter_map(|l| l.split('=').next()).collect();
        for n in &names {
            assert!(
                n.starts_with("PAM_") || *n == "PATH",
                "the hook's environment at {when} holds {n}: {env}"
            );
        }
        assert!(
            env.lines()
                .any(|l| l == "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
            "the hook's PATH at {when} is not root's own: {env}"
        );
    }
    assert_eq!(mounted.as_deref(), Some("fuse.ccfs"), "{log}");
    assert_eq!(read(&lab.share().join(".bashrc")), "planted\n", "{log}");
}

/// The launcher the PAM profile names is statically linked: no program interpreter (the
/// dynamic loader) is named in its program headers, so no loader runs before it.
#[test]
fn the_hooks_launcher_has_no_dynamic_loader() {
    let bin = fs::read(clean_exec_bin()).expect("launcher");
    assert_eq!(&bin[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(bin[4], 2, "not a 64-bit ELF file");
    let u16_at = |o: usize| u16::from_le_bytes([bin[o], bin[o + 1]]) as usize;
    let u32_at = |o: usize| u32::from_le_bytes([bin[o], bin[o + 1], bin[o + 2], bin[o + 3]]);
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bin[o..o + 8]);
        u64::from_le_bytes(b) as usize
    };
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    assert!(phnum > 0, "no program headers");
    const PT_INTERP: u32 = 3;
    let types: Vec<u32> = (0..phnum).map(|i| u32_at(phoff + i * phentsize)).collect();
    assert!(
        !types.contains(&PT_INTERP),
        "{} names a program interpreter: it is dynamically linked",
        clean_exec_bin().display()
    );
}

impl Session {
    /// The machine goes down with the session open (power loss, reset): pamtester is
    /// killed before its logout, the daemon of `home` too, its mount detached, and /run
    /// (the session counts) forgotten, as at the next boot.
    fn power_loss(mut self, lab: &Lab) {
        let st = ccfs(&["status".as_ref(), "--json".as_ref(), lab.home().as_os_str()]);
        assert!(st.status.success(), "{}", text(&st));
        let v: serde_json::Value = serde_json::from_slice(&st.stdout).expect("json");
        let pid = v["pid"].as_u64().expect("pid") as u32;
        kill(pid, libc::SIGKILL);
        wait_until("the daemon's death", Duration::from_secs(10), || {
            !alive(pid)
        });
        let _ = self.child.kill();
        let _ = self.child.wait();
        fs::write(&self.go, "").expect("go");
        let _ = Command::new("umount").arg("-l").arg(lab.home()).output();
        let _ = fs::remove_file(format!("/run/ccfs/sessions/{}.json", account(USER).uid));
    }
}

/// `count` caches of `user` planted under the lab's cache root (ROOT/UID/NAME, with a
/// meta.json): what a student who made tens of thousands leaves for root's recovery.
fn plant_caches(lab: &Lab, user: &str, count: usize) {
    let a = account(user);
    let root = lab.dir.join("cache").join(a.uid.to_string());
    fs::create_dir_all(&root).expect("mkdir");
    std::os::unix::fs::chown(&root, Some(a.uid), Some(a.gid)).expect("chown");
    for i in 0..count {
        let c = root.join(format!("planted-{i:05}"));
        fs::create_dir(&c).expect("mkdir");
        fs::write(c.join("meta.json"), "{}").expect("meta");
        std::os::unix::fs::chown(&c, Some(a.uid), Some(a.gid)).expect("chown");
        std::os::unix::fs::chown(c.join("meta.json"), Some(a.uid), Some(a.gid)).expect("chown");
    }
}

/// Runs root's recovery of every cache (what ccfs-recover.service runs at boot) with the
/// config `config`, in the background, its output to a file of the lab (a journal reads
/// it as it comes; a pipe nobody reads would hold it up).
fn boot_recovery(lab: &Lab, config: &Path) -> (Child, PathBuf) {
    let log = lab.dir.join(format!(
        "boot-{}.log",
        config
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let out = fs::File::create(&log).expect("log");
    let err = out.try_clone().expect("log");
    let child = Command::new(ccfs_bin())
        .arg("recover")
        .arg("--config")
        .arg(config)
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("ccfs recover");
    (child, log)
}

/// Waits for `child` at most `limit` (a guard against a hang, not a speed target): its
/// exit status and what it wrote to `log`, or None when it had not ended (it is killed).
fn ended_within(
    (mut child, log): (Child, PathBuf),
    limit: Duration,
) -> Option<(std::process::ExitStatus, String)> {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return Some((st, fs::read_to_string(&log).unwrap_or_default()));
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A student makes a 15 TiB dotfile of holes and 20,000 caches of her own, and the
/// machine goes down with her logged in. Root's recovery at boot (which logins wait for)
/// keeps to its limits: it sends her file at the cost of its data, takes caches in
/// turns (one of each user's first), stops at [recovery] all_caches_secs naming what it
/// did not reach, and a login goes through while it runs.
#[test]
fn the_boots_recovery_keeps_to_its_limits_whatever_a_student_plants() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::new("[recovery]\nall_caches_secs = 8\nper_cache_secs = 4\n").with_user_share();
    let s = lab.open("one");
    let big = lab.home().join(".big");
    as_alice(&format!(
        "truncate -s 15T {b} && printf end | dd of={b} bs=1 seek=$((15 * 1024 * 1024 * 1024 * 1024 - 3)) conv=notrunc status=none && echo crashed > {h}/.bashrc",
        b = big.display(),
        h = lab.home().display()
    ));
    s.power_loss(&lab);
    lab.share_of("ccfs-bob");
    plant_caches(&lab, "ccfs-bob", 20_000);

    let boot = boot_recovery(&lab, &lab.config);
    // A login meanwhile (hers: it recovers what the boot's recovery has not).
    std::thread::sleep(Duration::from_millis(500));
    let s = lab.open_as(USER, "two", Duration::from_secs(90));
    assert_eq!(
        lab.mounted().map(|m| m.fs_type).as_deref(),
        Some("fuse.ccfs"),
        "{}",
        lab.log()
    );
    let seen = as_alice(&format!("cat {}/.bashrc", lab.home().display()));
    assert_eq!(String::from_utf8_lossy(&seen.stdout), "crashed\n");
    let (status, said) = ended_within(boot, Duration::from_secs(8 + 60))
        .expect("the boot's recovery did not keep to its limit of 8 s (a minute's grace)");
    let said = said
        .lines()
        .filter(|l| !l.contains("planted-"))
        .collect::<Vec<_>>()
        .join("\n")
        + &said
            .lines()
            .filter(|l| l.contains("not reached"))
            .collect::<Vec<_>>()
            .join("\n");
    assert!(!status.success(), "{said}");
    assert!(
        said.contains("reached its limit") && said.contains("not reached"),
        "the caches left were not named: {said}"
    );
    // Sent by the boot's recovery, or (when the login took her cache first) by the login's
    // recovery or its mount, in the background.
    wait_until(
        "the 15 TiB file on the share",
        Duration::from_secs(60),
        || fs::metadata(lab.share().join(".big")).is_ok_and(|m| m.len() == 15 << 40),
    );
    let share_big = fs::metadata(lab.share().join(".big")).expect("the 15 TiB file was sent");
    assert_eq!(share_big.len(), 15 << 40);
    assert!(
        share_big.blocks() * 512 < 64 << 20,
        "the share's copy is not sparse: {} blocks",
        share_big.blocks()
    );
    let tail = Command::new("tail")
        .args(["-c", "3"])
        .arg(lab.share().join(".big"))
        .output()
        .expect("tail");
    assert_eq!(tail.stdout, b"end");
    wait_until("her .bashrc on the share", Duration::from_secs(60), || {
        fs::read_to_string(lab.share().join(".bashrc")).is_ok_and(|t| t == "crashed\n")
    });
    s.close();
}

/// One cache whose recovery takes longer than [recovery] per_cache_secs (here rsync
/// itself is slow: root's config names a wrapper that waits) is stopped as a crash would
/// stop it and named; nothing of it is lost: a recovery without the limit sends it all.
/// (The unsent change is a symbolic link: rsync sends those, where ccfs sends plain
/// files itself.)
#[test]
fn a_cache_over_its_time_is_stopped_named_and_loses_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::new("").with_user_share();
    let s = lab.open("one");
    as_alice(&format!("ln -s unsent {}/.profile", lab.home().display()));
    s.power_loss(&lab);
    let slow = lab.dir.join("slow-rsync");
    fs::write(&slow, "#!/bin/sh\nsleep 30\nexec rsync \"$@\"\n").expect("wrapper");
    fs::set_permissions(&slow, fs::Permissions::from_mode(0o755)).expect("chmod");
    let limited = lab.dir.join("limited.toml");
    let base = fs::read_to_string(&lab.config).expect("config");
    fs::write(
        &limited,
        format!(
            "{base}[recovery]\nall_caches_secs = 10\nper_cache_secs = 2\n[sync]\nrsync = \"{}\"\n",
            slow.display()
        ),
    )
    .expect("config");
    let boot = boot_recovery(&lab, &limited);
    let (status, said) =
        ended_within(boot, Duration::from_secs(10 + 60)).expect("it kept to its limit");
    assert!(!status.success(), "{said}");
    assert!(said.contains("not done within 2 s"), "{said}");
    assert!(
        fs::symlink_metadata(lab.share().join(".profile")).is_err(),
        "{said}"
    );
    // What a crash leaves, the next recovery finishes.
    let out = ccfs(&[
        "recover".as_ref(),
        "--config".as_ref(),
        lab.config.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        fs::read_link(lab.share().join(".profile")).expect("the link on the share"),
        Path::new("unsent")
    );
}

/// A student plants a cache whose share is a FUSE filesystem of her own that takes every
/// request and never answers it. The recovery of that cache (a child working as her) is
/// stopped at its limit, and so is waiting for that child's end (a request it made
/// cannot be interrupted); the boot's recovery goes on to the next cache and keeps to its
/// limit in all: the other user's unsent work reaches the share.
#[test]
fn a_cache_whose_share_never_answers_holds_up_no_other_cache() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A cache's time longer than the recovery's own look at a share that does not answer
    // (10 s): the child gives its answer, then cannot end.
    let lab = Lab::new("[recovery]\nall_caches_secs = 40\nper_cache_secs = 15\n").with_user_share();
    let s = lab.open("one");
    as_alice(&format!("echo unsent > {}/.profile", lab.home().display()));
    s.power_loss(&lab);
    let bob = account("ccfs-bob");
    let hang_at = lab.share_of("ccfs-bob").join("hang");
    fs::create_dir(&hang_at).expect("mkdir");
    std::os::unix::fs::chown(&hang_at, Some(bob.uid), Some(bob.gid)).expect("chown");
    let hang = HangingFs::mount(&hang_at, bob.uid, bob.gid);
    let root = lab.dir.join("cache").join(bob.uid.to_string());
    let planted = root.join("hanging");
    fs::create_dir_all(&planted).expect("mkdir");
    fs::write(
        planted.join("meta.json"),
        format!(
            "{{\"share\":\"{}\",\"mountpoint\":\"/home/ccfs-bob\",\"config\":null}}",
            hang_at.display()
        ),
    )
    .expect("meta");
    for p in [&root, &planted, &planted.join("meta.json")] {
        std::os::unix::fs::chown(p, Some(bob.uid), Some(bob.gid)).expect("chown");
    }

    let (status, said) = ended_within(
        boot_recovery(&lab, &lab.config),
        Duration::from_secs(40 + 40),
    )
    .expect("the boot's recovery did not keep to its limit of 40 s (40 s of grace)");
    drop(hang);
    assert!(!status.success(), "{said}");
    assert!(
        said.contains("hanging"),
        "the cache not done is named: {said}"
    );
    assert_eq!(read(&lab.share().join(".profile")), "unsent\n", "{said}");
}

/// A session whose logout could not send a large change (the machine went down) leaves it
/// to the next boot and login, whose recoveries keep to their limits: the next login is
/// not held up by it and does not fall back to the share. It mounts through ccfs at once,
/// shows the unsent changes (large and small), and sends them in the background.
#[test]
fn a_large_unsent_cache_is_shown_at_the_next_login_and_sent_meanwhile() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // rsync at 4 MB/s: the 48 MiB change takes about 12 s to send, more than a cache's
    // recovery may take, and a third of the login's time.
    let lab = Lab::new(
        "login_timeout_secs = 20\n[recovery]\nall_caches_secs = 20\nper_cache_secs = 3\n\
         [sync]\nextra_args = [\"--bwlimit=4000\"]\n",
    )
    .with_user_share();
    let s = lab.open("one");
    as_alice(&format!(
        "head -c 50331648 /dev/urandom > {h}/.big && echo important > {h}/.small",
        h = lab.home().display()
    ));
    s.power_loss(&lab);
    let (status, said) = ended_within(boot_recovery(&lab, &lab.config), Duration::from_secs(80))
        .expect("the boot's recovery kept to its limit");
    assert!(
        !status.success() && said.contains("not done within"),
        "{said}"
    );

    let s = lab.open_as(USER, "two", Duration::from_secs(60));
    assert_eq!(
        lab.mounted().map(|m| m.fs_type).as_deref(),
        Some("fuse.ccfs"),
        "the login fell back: {}",
        lab.log()
    );
    let seen = as_alice(&format!(
        "cat {h}/.small && stat -c %s {h}/.big",
        h = lab.home().display()
    ));
    assert_eq!(
        String::from_utf8_lossy(&seen.stdout),
        "important\n50331648\n"
    );
    wait_until(
        "the earlier session's changes on the share",
        Duration::from_secs(120),
        || {
            fs::read_to_string(lab.share().join(".small")).is_ok_and(|t| t == "important\n")
                && fs::metadata(lab.share().join(".big")).is_ok_and(|m| m.len() == 50331648)
        },
    );
    s.close();
}
