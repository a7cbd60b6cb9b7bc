//! FUSE over io_uring (`[mount] transport = "io-uring"`): a session served over the ring
//! from login to logout, and a ring the kernel refuses leaving the mount on /dev/fuse.
//! Every other mount test runs over the ring too in the suite's second run (a ccfs built
//! with `ring-default`, `CCFS_TEST_TRANSPORT=io-uring`).

use std::fs;
use std::path::Path;
use std::sync::Mutex;

use e2e::*;

const SWITCH: &str = "/sys/module/fuse/parameters/enable_uring";

/// The tests here set the fuse module's switch: one at a time.
static SWITCHING: Mutex<()> = Mutex::new(());

/// Sets the module's switch for the life of the guard, and puts back what was there.
struct Switch {
    before: Option<String>,
}

impl Switch {
    /// None when this kernel has no FUSE over io_uring (the test is then skipped).
    fn set(on: bool) -> Option<Switch> {
        let before = fs::read_to_string(SWITCH).ok()?;
        let want = if on { "1" } else { "0" };
        fs::write(SWITCH, want).expect("set enable_uring (root)");
        Some(Switch {
            before: Some(before.trim().to_string()),
        })
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        if let Some(b) = self.before.take() {
            let v = if b == "Y" || b == "1" { "1" } else { "0" };
            let _ = fs::write(SWITCH, v);
        }
    }
}

fn write(p: &Path, s: &str) {
    fs::write(p, s).expect("write");
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).expect("read")
}

fn ring_config(fx: &Fixture) -> String {
    fx.config("[mount]\ntransport = \"io-uring\"\n")
        .display()
        .to_string()
}

#[test]
fn a_session_over_the_ring_from_login_to_a_second_login() {
    let _one = SWITCHING.lock().unwrap_or_else(|e| e.into_inner());
    let Some(_switch) = Switch::set(true) else {
        return skip("this kernel has no FUSE over io_uring (no enable_uring switch)");
    };
    let fx = Fixture::new();
    write(&fx.s(".profile"), "old\n");
    let config = ring_config(&fx);
    let m = fx.mount_with(&["--config", &config]);
    let before = m.status()["transport"].clone();
    assert_eq!(before["serving"], "io-uring", "{before}");
    fs::create_dir(fx.m("Documents")).expect("mkdir");
    write(&fx.m("Documents/a.txt"), "document\n");
    write(&fx.m(".profile"), "new\n");
    fs::create_dir_all(fx.m(".config/app")).expect("mkdir");
    for i in 0..50 {
        write(&fx.m(&format!(".config/app/s{i}")), &format!("{i}\n"));
    }
    fs::rename(fx.m(".config/app/s0"), fx.m(".config/app/renamed")).expect("rename");
    fs::remove_file(fx.m(".config/app/s1")).expect("unlink");
    assert_eq!(read(&fx.m(".profile")), "new\n");
    assert_eq!(fs::read_dir(fx.m(".config/app")).expect("list").count(), 49);
    assert_eq!(
        read(&fx.s("Documents/a.txt")),
        "document\n",
        "documents go through"
    );
    assert_eq!(
        read(&fx.s(".profile")),
        "old\n",
        "the dotfile waits for the logout"
    );
    let after = m.status()["transport"].clone();
    let served = |t: &serde_json::Value| t["ring_requests"].as_u64().expect("ring_requests");
    assert!(
        served(&after) >= served(&before) + 100,
        "the requests above went over the ring: {before} then {after}"
    );
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".profile")), "new\n");
    assert_eq!(read(&fx.s(".config/app/renamed")), "0\n");
    assert!(!fx.s(".config/app/s1").exists());

    // The second login of the same user finds the session's work, over the ring again.
    let m = fx.mount_with(&["--config", &config]);
    assert_eq!(m.status()["transport"]["serving"], "io-uring");
    assert_eq!(read(&fx.m(".profile")), "new\n");
    assert_eq!(read(&fx.m(".config/app/s49")), "49\n");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn a_ring_the_kernel_refuses_leaves_the_mount_on_dev_fuse_and_says_why() {
    if ring_expected() {
        // The switch is on for the whole run: turning it off would take the ring from
        // the tests running beside this one.
        return skip("the run serves every mount over the ring");
    }
    let _one = SWITCHING.lock().unwrap_or_else(|e| e.into_inner());
    let Some(_switch) = Switch::set(false) else {
        return skip("this kernel has no FUSE over io_uring (no enable_uring switch)");
    };
    let fx = Fixture::new();
    let config = ring_config(&fx);
    let m = fx.mount_with(&["--config", &config]);
    let t = m.status()["transport"].clone();
    assert_eq!(t["serving"], "dev-fuse", "{t}");
    let why = t["refused"].as_str().unwrap_or_default();
    assert!(
        why.contains("enable_uring") && why.contains("echo 1 >"),
        "the reason names the switch and what to do: {t}"
    );
    write(&fx.m(".bashrc"), "kept\n");
    assert_eq!(read(&fx.m(".bashrc")), "kept\n");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(&fx.s(".bashrc")), "kept\n");
}
