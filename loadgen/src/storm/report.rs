//! A storm's results as data: what reached the share, each user's times, the summaries,
//! and the report of one run (JSON schema `loadgen-login-storm/2`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::Baseline;
use crate::report::{Environment, LatencyReport};

/// Requests that reached the share (from the meter).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareCounts {
    pub total: u64,
    pub mutating: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub by_op: BTreeMap<String, u64>,
    /// Requests by where in the home they went: the first [`PATH_DEPTH`] components of
    /// their path below the user's home ("." for the home itself), summed over the users.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_path: BTreeMap<String, u64>,
}

/// How many components of a path below a home the meter's counts by path keep
/// (`.mozilla/firefox/PROFILE`).
pub const PATH_DEPTH: usize = 3;

/// What `by` has more than `before` in each key (keys without a change left out).
fn map_minus(by: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    by.iter()
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

impl ShareCounts {
    pub fn add(&mut self, other: &ShareCounts) {
        self.total += other.total;
        self.mutating += other.mutating;
        self.read_bytes += other.read_bytes;
        self.write_bytes += other.write_bytes;
        for (k, v) in &other.by_op {
            *self.by_op.entry(k.clone()).or_insert(0) += v;
        }
        for (k, v) in &other.by_path {
            *self.by_path.entry(k.clone()).or_insert(0) += v;
        }
    }

    pub(super) fn minus(&self, before: &ShareCounts) -> ShareCounts {
        ShareCounts {
            total: self.total.saturating_sub(before.total),
            mutating: self.mutating.saturating_sub(before.mutating),
            read_bytes: self.read_bytes.saturating_sub(before.read_bytes),
            write_bytes: self.write_bytes.saturating_sub(before.write_bytes),
            by_op: map_minus(&self.by_op, &before.by_op),
            by_path: map_minus(&self.by_path, &before.by_path),
        }
    }

    /// The meter counts paths from the share's root: keeps those below `homes` (the
    /// run's homes, relative to the share's root, then a user's directory), each without
    /// those components, summed over the users; the rest (the run's own directories above
    /// the homes) under "(above the homes)".
    pub(super) fn by_path_in_homes(mut self, homes: &str) -> ShareCounts {
        let skip = Path::new(homes).components().count();
        let mut by_home = BTreeMap::new();
        for (k, v) in std::mem::take(&mut self.by_path) {
            let parts: Vec<&str> = k.split('/').collect();
            let key = if k.starts_with('(') {
                k
            } else if parts.len() > skip && parts[..skip].join("/") == homes {
                match parts.get(skip + 1..) {
                    Some(rest) if !rest.is_empty() => rest.join("/"),
                    _ => ".".to_string(),
                }
            } else {
                "(above the homes)".to_string()
            };
            *by_home.entry(key).or_insert(0) += v;
        }
        self.by_path = by_home;
        self
    }
}

/// What the server itself served, as its own counters tell (`--server-counts`; on the
/// GlusterFS testbed the bricks' profile, summed over the bricks): calls and their total
/// latency by operation, and the data read and written. A server that does not tell its
/// latencies (MooseFS's master) or its bytes leaves them out: they are unknown, not zero.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerCounts {
    pub fops: BTreeMap<String, FopCount>,
    #[serde(default)]
    pub bytes_read: Option<u64>,
    #[serde(default)]
    pub bytes_written: Option<u64>,
}

/// One operation's calls and their summed latency in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct FopCount {
    pub calls: u64,
    #[serde(default)]
    pub latency_us: f64,
}

/// The operations that change what the server stores (GlusterFS's names).
const SERVER_WRITES: &[&str] = &[
    "WRITE",
    "FSYNC",
    "FSYNCDIR",
    "CREATE",
    "MKDIR",
    "MKNOD",
    "SYMLINK",
    "LINK",
    "UNLINK",
    "RMDIR",
    "RENAME",
    "SETATTR",
    "FSETATTR",
    "TRUNCATE",
    "FTRUNCATE",
    "SETXATTR",
    "FSETXATTR",
    "REMOVEXATTR",
    "FREMOVEXATTR",
    "FALLOCATE",
    "DISCARD",
    "ZEROFILL",
    "COPY_FILE_RANGE",
];

impl ServerCounts {
    /// Parses what a `--server-counts` command printed: one JSON object.
    pub fn parse(text: &str) -> Result<Self, String> {
        serde_json::from_str(text.trim()).map_err(|e| {
            format!(
                "its output is not the JSON object expected ({{\"fops\": {{\"OP\": {{\"calls\": N, \"latency_us\": T}}}}, \"bytes_read\": N, \"bytes_written\": N}}): {e}"
            )
        })
    }

    /// What `self` has more than `before` (counters that went back, as after a server's
    /// restart, count from zero).
    pub fn minus(&self, before: &ServerCounts) -> ServerCounts {
        let fops = self
            .fops
            .iter()
            .filter_map(|(k, v)| {
                let b = before.fops.get(k).copied().unwrap_or_default();
                let (calls, latency_us) = if v.calls >= b.calls {
                    (v.calls - b.calls, (v.latency_us - b.latency_us).max(0.0))
                } else {
                    (v.calls, v.latency_us)
                };
                (calls > 0).then(|| (k.clone(), FopCount { calls, latency_us }))
            })
            .collect();
        let sub = |a: Option<u64>, b: Option<u64>| {
            let (a, b) = (a?, b.unwrap_or(0));
            Some(if a >= b { a - b } else { a })
        };
        ServerCounts {
            fops,
            bytes_read: sub(self.bytes_read, before.bytes_read),
            bytes_written: sub(self.bytes_written, before.bytes_written),
        }
    }

    pub fn add(&mut self, other: &ServerCounts) {
        for (k, v) in &other.fops {
            let e = self.fops.entry(k.clone()).or_default();
            e.calls += v.calls;
            e.latency_us += v.latency_us;
        }
        let add = |a: Option<u64>, b: Option<u64>| Some(a.unwrap_or(0) + b?);
        self.bytes_read = add(self.bytes_read, other.bytes_read);
        self.bytes_written = add(self.bytes_written, other.bytes_written);
    }

    /// Every call the server served.
    pub fn calls(&self) -> u64 {
        self.fops.values().map(|f| f.calls).sum()
    }

    /// The calls that change what the server stores.
    pub fn writes(&self) -> u64 {
        self.calls_of(SERVER_WRITES)
    }

    /// The calls of the named operations.
    pub fn calls_of(&self, ops: &[&str]) -> u64 {
        ops.iter()
            .filter_map(|op| self.fops.get(*op))
            .map(|f| f.calls)
            .sum()
    }

    /// The server's time in every call, in seconds; None from a server that does not tell
    /// its latencies.
    pub fn busy_s(&self) -> Option<f64> {
        let us = self.fops.values().map(|f| f.latency_us).sum::<f64>();
        (us > 0.0 || self.calls() == 0).then_some(us / 1e6)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UserResult {
    pub user: usize,
    /// ccfs mount time (part of the time to login); 0 without ccfs.
    pub mount_s: f64,
    /// From the barrier to the end of the login burst.
    pub login_s: f64,
    pub session_ticks: u32,
    /// The logout actions and, with ccfs, `ccfs umount` (the sync back).
    pub logout_s: f64,
    pub bytes_written: u64,
    /// Profile files the user's programs looked for and did not find.
    pub missing_files: u64,
    /// Of those, home files rebuilt (written at their home size during the login).
    pub rebuilt_files: u64,
    /// CPU seconds of this user's ccfs daemon (and the rsync it ran), mount to exit.
    pub ccfs_cpu_s: Option<f64>,
    /// This user's operation latencies during the session.
    pub session_latency: BTreeMap<String, LatencyReport>,
    pub error: Option<String>,
    /// When this user started after the start barrier released the class, from the
    /// first user's start.
    #[serde(default)]
    pub start_s: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub p50_s: f64,
    pub p95_s: f64,
    pub max_s: f64,
    pub mean_s: f64,
}

impl Summary {
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        // Nearest rank.
        let q = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Self {
            p50_s: q(0.50),
            p95_s: q(0.95),
            max_s: v[v.len() - 1],
            mean_s: v.iter().sum::<f64>() / v.len() as f64,
        }
    }
}

/// How the machine was left before a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Settled {
    /// Dirty and writeback bytes left after syncing (the sync stops at 1 MiB or 60 s).
    pub dirty_left_bytes: u64,
    /// The page cache was dropped (root only).
    pub caches_dropped: bool,
    /// The share's client was mounted afresh (`--remount`).
    pub remounted: bool,
}

/// One storm's results (JSON schema `loadgen-login-storm/2`; `--json` writes a list of
/// every run).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StormReport {
    pub schema: String,
    pub tool: String,
    pub version: String,
    pub started_at_unix: u64,
    pub label: Option<String>,
    pub share: String,
    pub environment: Environment,
    pub users: usize,
    pub with_ccfs: bool,
    /// Through the meter: counts kept, times not compared.
    pub metered: bool,
    /// This run's place in the schedule (0 first).
    pub run_index: usize,
    /// This run's number among the timed runs of its mode (1 first; 0 for a metered run
    /// and in results written before it was recorded).
    #[serde(default)]
    pub mode_run: usize,
    pub baseline: Baseline,
    pub session_s: f64,
    pub profile: String,
    /// The workstations held what an earlier session of their users left.
    pub returning_users: bool,
    pub settled: Settled,
    pub time_to_login: Summary,
    pub logout: Summary,
    /// Each user's login plus logout time.
    pub login_plus_logout: Summary,
    pub per_user: Vec<UserResult>,
    pub latency_login: BTreeMap<String, LatencyReport>,
    pub latency_session: BTreeMap<String, LatencyReport>,
    /// What reached the share from the start to the end of the logins (metered runs).
    pub share_login: Option<ShareCounts>,
    /// ... from the end of the logins to the end of the sessions.
    pub share_session: Option<ShareCounts>,
    /// ... during the logouts.
    pub share_logout: Option<ShareCounts>,
    /// What the server served by its own counters (`--server-counts`), from the start to
    /// the end of the sessions ...
    #[serde(default)]
    pub server_login_session: Option<ServerCounts>,
    /// ... and during the logouts.
    #[serde(default)]
    pub server_logout: Option<ServerCounts>,
    /// CPU seconds of the given server processes over `cpu_window_s`.
    pub server_cpu_s: Option<f64>,
    /// CPU seconds of the client side's given processes (the share's FUSE client) over
    /// `cpu_window_s`.
    pub client_cpu_s: Option<f64>,
    /// CPU seconds of the users' ccfs daemons, mount to exit (with ccfs).
    pub ccfs_cpu_s: Option<f64>,
    pub cpu_window_s: Option<f64>,
    pub complete: bool,
    pub error: Option<String>,
    /// A class across hosts (`--hosts`): each host's part, in the order given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostPart>,
    /// The login's and the session's latency histograms, whole (not written out: a
    /// multi-host storm merges its hosts' from them).
    #[serde(skip)]
    pub latencies_raw: Option<(crate::engine::Latencies, crate::engine::Latencies)>,
}

/// One host's part of a class across hosts: its users (numbered from `first_user`), their
/// times, what its meter counted and its share client's CPU.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostPart {
    pub host: String,
    pub first_user: usize,
    pub users: usize,
    pub time_to_login: Summary,
    pub logout: Summary,
    /// What reached the share from this host over the whole run (metered runs).
    pub share_whole: Option<ShareCounts>,
    /// CPU seconds of this host's share client over the window (`--client-pids-file`).
    pub client_cpu_s: Option<f64>,
    /// How far this host's start was from the first host's, in milliseconds (its clock
    /// put on the coordinator's).
    pub start_offset_ms: f64,
    pub error: Option<String>,
}

impl StormReport {
    pub fn mode(&self) -> &'static str {
        if self.with_ccfs {
            "with ccfs"
        } else {
            "without ccfs"
        }
    }

    /// The run's mode and number within the mode (`with ccfs #2`, `without ccfs, metered`).
    pub fn run_name(&self) -> String {
        if self.metered {
            return format!("{}, metered", self.mode());
        }
        // Numbered within the mode; results without the number, by the schedule.
        let n = if self.mode_run > 0 {
            self.mode_run
        } else {
            self.run_index + 1
        };
        format!("{} #{n}", self.mode())
    }

    /// [`Self::run_name`], after the label when there is one.
    pub fn name(&self) -> String {
        match &self.label {
            Some(l) => format!("{l}, {}", self.run_name()),
            None => self.run_name(),
        }
    }

    /// What the server served over the whole run, by its own counters.
    pub fn server_whole(&self) -> Option<ServerCounts> {
        let mut all = self.server_login_session.clone()?;
        all.add(self.server_logout.as_ref()?);
        Some(all)
    }

    /// What reached the share over the whole run (login + session + logout).
    pub fn share_whole(&self) -> Option<ShareCounts> {
        let mut all = ShareCounts::default();
        for c in [&self.share_login, &self.share_session, &self.share_logout] {
            all.add(c.as_ref()?);
        }
        Some(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_uses_nearest_rank_percentiles() {
        let s = Summary::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!((s.p50_s, s.p95_s, s.max_s, s.mean_s), (3.0, 5.0, 5.0, 3.0));
        assert_eq!(Summary::of(&[]), Summary::default());
        let twenty: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(Summary::of(&twenty).p95_s, 19.0);
    }

    #[test]
    fn share_count_deltas_subtract_per_kind() {
        let a = ShareCounts {
            total: 10,
            mutating: 4,
            read_bytes: 100,
            write_bytes: 50,
            by_op: [("write".to_string(), 4), ("lookup".to_string(), 6)].into(),
            by_path: BTreeMap::new(),
        };
        let mut b = a.clone();
        b.total = 15;
        b.mutating = 6;
        b.write_bytes = 80;
        b.by_op.insert("write".into(), 6);
        let d = b.minus(&a);
        assert_eq!(
            (d.total, d.mutating, d.write_bytes, d.read_bytes),
            (5, 2, 30, 0)
        );
        assert_eq!(d.by_op, [("write".to_string(), 2)].into());
    }

    #[test]
    fn server_counts_parse_and_subtract_per_operation() {
        let text = r#"{"fops": {"WRITE": {"calls": 10, "latency_us": 500.0},
            "LOOKUP": {"calls": 7, "latency_us": 70.0}}, "bytes_read": 4096, "bytes_written": 9000}"#;
        let after = ServerCounts::parse(text).expect("after");
        let before = ServerCounts::parse(
            r#"{"fops": {"WRITE": {"calls": 4, "latency_us": 200.0}, "LOOKUP": {"calls": 7, "latency_us": 70.0}},
                "bytes_read": 0, "bytes_written": 1000}"#,
        )
        .expect("before");
        let d = after.minus(&before);
        assert_eq!((d.calls(), d.writes(), d.bytes_written), (6, 6, Some(8000)));
        assert!(
            !d.fops.contains_key("LOOKUP"),
            "an operation with no new call is left out"
        );
        assert!((d.busy_s().unwrap_or(0.0) - 300e-6).abs() < 1e-12);
        // A server restarted between the two counts from zero again.
        assert_eq!(before.minus(&after).calls_of(&["WRITE"]), 4);
        let err = ServerCounts::parse("calls: 5").expect_err("not JSON");
        assert!(err.contains("not the JSON object expected"), "{err}");
    }

    #[test]
    fn a_server_that_tells_no_bytes_or_latencies_has_them_unknown_not_zero() {
        let before = ServerCounts::parse(r#"{"fops": {"LOOKUP": {"calls": 3}}}"#).expect("before");
        let after =
            ServerCounts::parse(r#"{"fops": {"LOOKUP": {"calls": 9}, "WRITE": {"calls": 2}}}"#)
                .expect("after");
        let d = after.minus(&before);
        assert_eq!((d.calls(), d.writes()), (8, 2));
        assert_eq!(
            (d.bytes_read, d.bytes_written, d.busy_s()),
            (None, None, None)
        );
        let mut sum = d.clone();
        sum.add(&d);
        assert_eq!((sum.calls(), sum.bytes_written), (16, None));
    }

    #[test]
    fn counts_by_path_are_taken_relative_to_each_home_and_summed_over_users() {
        let c = |pairs: &[(&str, u64)]| ShareCounts {
            by_path: pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            ..ShareCounts::default()
        };
        let before = c(&[("s/run-1/user000/.mozilla/firefox/p", 5)]);
        let after = c(&[
            ("s/run-1/user000/.mozilla/firefox/p", 8),
            ("s/run-1/user001/.mozilla/firefox/p", 4),
            ("s/run-1/user001", 2),
            ("s/run-1", 1),
            (".", 1),
            ("(unnamed)", 2),
        ]);
        let d = after.minus(&before).by_path_in_homes("s/run-1");
        assert_eq!(
            d.by_path,
            [
                (".mozilla/firefox/p".to_string(), 7),
                (".".to_string(), 2),
                ("(above the homes)".to_string(), 2),
                ("(unnamed)".to_string(), 2),
            ]
            .into()
        );
    }
}
