//! A run's scratch space goes without reaching through a mount: whatever is still mounted
//! below it (kept busy by someone, as a student holding a directory of it) is detached
//! first, so that what the mount shows (the share) is never removed with it.

use std::process::Command;

#[test]
fn a_run_directory_is_removed_without_reaching_into_a_busy_mount_below_it() {
    let share = tempfile::tempdir().expect("share");
    std::fs::write(share.path().join("thesis.txt"), "four years\n").expect("file");
    let scratch = tempfile::tempdir().expect("scratch");
    let run = scratch.path().join("storm-1-2-0");
    let mnt = run.join("meter");
    std::fs::create_dir_all(&mnt).expect("mount point");
    std::fs::write(run.join("cache.log"), "x\n").expect("log");
    let bind = Command::new("mount")
        .arg("--bind")
        .arg(share.path())
        .arg(&mnt)
        .status()
        .expect("mount");
    assert!(bind.success(), "mount --bind (run as root)");
    // Kept busy: a process whose working directory is in the mount.
    let mut holder = Command::new("sleep")
        .arg("60")
        .current_dir(&mnt)
        .spawn()
        .expect("holder");
    let removed = loadgen::storm::remove_run_dir(&run);
    let _ = holder.kill();
    let _ = holder.wait();
    removed.expect("removed");
    assert!(!run.exists(), "the run directory is gone");
    assert_eq!(
        std::fs::read_to_string(share.path().join("thesis.txt")).expect("the share's file"),
        "four years\n"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(&mnt.display().to_string()),
        "nothing left mounted"
    );
}
