//! The testbed's server counters for MooseFS (`deploy/testbed/mfs-counts.py`, behind
//! `moosefs.sh counts`): the master tells each client mount's operations of the current
//! hour only, by rows that name no session, so the script keeps a running total across
//! calls. Played here with a stand-in `mfscli` that prints given counters: a remount (a new
//! session from zero, listed beside the old one at the same place) and the turn of an hour
//! must neither lose nor count twice what was served.

use std::path::{Path, PathBuf};
use std::process::Command;

const OPS: usize = 16;

struct Master {
    dir: tempfile::TempDir,
}

impl Master {
    fn new() -> Master {
        let dir = tempfile::tempdir().expect("dir");
        let fake = dir.path().join("mfscli");
        // mfscli -H HOST -SMO -m MODE: prints the file of that mode (0 last hour, 1 current).
        std::fs::write(&fake, "#!/bin/sh\ncat \"$(dirname \"$0\")/mode$5\"\n").expect("fake");
        let mut p = std::fs::metadata(&fake).expect("meta").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o755);
        std::fs::set_permissions(&fake, p).expect("chmod");
        Master { dir }
    }

    /// Sets the counters each mount shows: (mount, lookups) for the last and current hour.
    fn show(&self, last: &[(&str, u64)], current: &[(&str, u64)]) {
        for (mode, rows) in [(0, last), (1, current)] {
            let text: String = rows
                .iter()
                .map(|(m, lookups)| {
                    let mut f = [0u64; OPS];
                    f[3] = *lookups;
                    let total: u64 = f.iter().sum();
                    let cols: Vec<String> = f.iter().map(u64::to_string).collect();
                    format!(
                        "active mounts, operations:\t10.0.0.2\t/mnt/{m}\t{}\t{total}\n",
                        cols.join("\t")
                    )
                })
                .collect();
            std::fs::write(self.dir.path().join(format!("mode{mode}")), text).expect("mode");
        }
    }

    /// The lookups the script totals at hour `hour`.
    fn lookups(&self, hour: u64) -> u64 {
        let script: PathBuf =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/testbed/mfs-counts.py");
        let path = format!(
            "{}:{}",
            self.dir.path().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let o = Command::new("python3")
            .arg(script)
            .arg("10.0.0.1")
            .arg(self.dir.path().join("state.json"))
            .arg(hour.to_string())
            .env("PATH", path)
            .output()
            .expect("python3");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        v["fops"]["LOOKUP"]["calls"].as_u64().unwrap_or(0)
    }
}

#[test]
fn moosefs_counts_run_on_across_a_remount_and_the_turn_of_an_hour() {
    let m = Master::new();
    m.show(&[], &[("a", 10)]);
    let start = m.lookups(100);
    m.show(&[], &[("a", 25)]);
    assert_eq!(m.lookups(100) - start, 15, "the same mount, the same hour");
    // Remounted: a new session at the same place, its counters from zero, listed beside
    // the old one for a while.
    m.show(&[], &[("a", 25), ("a", 4)]);
    assert_eq!(m.lookups(100) - start, 19, "a remount's calls all count");
    // The new session passes the old one's frozen counts.
    m.show(&[], &[("a", 25), ("a", 30)]);
    assert_eq!(m.lookups(100) - start, 45);
    // The old session goes.
    m.show(&[], &[("a", 33)]);
    assert_eq!(m.lookups(100) - start, 48);
    // The hour turns: the 33 became 40 before it ended, then 2 in the new hour.
    m.show(&[("a", 40)], &[("a", 2)]);
    assert_eq!(
        m.lookups(101) - start,
        48 + 7 + 2,
        "the rest of the hour that ended"
    );
    // A second mount (a test host's client) adds its own.
    m.show(&[("a", 40)], &[("a", 3), ("b", 7)]);
    assert_eq!(m.lookups(101) - start, 57 + 1 + 7);
}
