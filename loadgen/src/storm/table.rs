//! The comparison table of a storm's runs: a heading, one row a measure ([`ROWS`]: its
//! label, where its value comes from, its unit), where the login's share requests went,
//! the operations' latencies, and the runs that stopped.

use std::collections::BTreeMap;

use super::{ShareCounts, StormReport, Summary, UserResult};
use crate::report::LatencyReport;

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

/// The median of `v` (the mean of the middle two for an even count) and its spread.
pub fn median_spread(v: &[f64]) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    let median = if s.len().is_multiple_of(2) {
        (s[m - 1] + s[m]) / 2.0
    } else {
        s[m]
    };
    Some((median, s[0], s[s.len() - 1]))
}

/// The mean over the users of `f`.
fn per_user(r: &StormReport, f: fn(&UserResult) -> u64) -> Option<f64> {
    let n = r.per_user.len().max(1) as f64;
    Some(r.per_user.iter().map(f).sum::<u64>() as f64 / n)
}

/// Where a table row takes its value from.
#[derive(Clone, Copy)]
enum From {
    /// The runs without the meter: median and spread.
    Timed(fn(&StormReport) -> Option<f64>),
    /// The metered run.
    Metered(fn(&StormReport) -> Option<f64>),
}

/// How a row's values are written.
#[derive(Clone, Copy)]
enum Unit {
    /// Seconds, three significant digits.
    Seconds,
    /// Milliseconds, three significant digits.
    Millis,
    /// A whole number.
    Count,
    /// Bytes, as megabytes with one decimal.
    Bytes,
}

impl Unit {
    fn show(self, v: f64) -> String {
        match self {
            Unit::Seconds | Unit::Millis => sig3(v),
            Unit::Count => format!("{v:.0}"),
            Unit::Bytes => mb(v as u64),
        }
    }

    /// A value of a spread, whose unit the median beside it already says.
    fn bare(self, v: f64) -> String {
        match self {
            Unit::Bytes => format!("{:.1}", v / 1e6),
            _ => self.show(v),
        }
    }
}

/// One row of the comparison: its label, where its value comes from, its unit.
struct Row {
    label: &'static str,
    from: From,
    unit: Unit,
}

/// A row of the timed runs.
const fn timed(label: &'static str, get: fn(&StormReport) -> Option<f64>, unit: Unit) -> Row {
    Row {
        label,
        from: From::Timed(get),
        unit,
    }
}

/// A row of the metered run.
const fn metered(label: &'static str, get: fn(&StormReport) -> Option<f64>, unit: Unit) -> Row {
    Row {
        label,
        from: From::Metered(get),
        unit,
    }
}

/// What reached the share during the logins, the sessions, the logouts, the whole run.
fn login(r: &StormReport) -> Option<&ShareCounts> {
    r.share_login.as_ref()
}
fn session(r: &StormReport) -> Option<&ShareCounts> {
    r.share_session.as_ref()
}
fn logout(r: &StormReport) -> Option<&ShareCounts> {
    r.share_logout.as_ref()
}

/// The rows of the comparison, in order; a row no column has a value for is left out.
const ROWS: &[Row] = &[
    timed(
        "time to login p50 (s)",
        |r| Some(r.time_to_login.p50_s),
        Unit::Seconds,
    ),
    timed(
        "time to login p95 (s)",
        |r| Some(r.time_to_login.p95_s),
        Unit::Seconds,
    ),
    timed(
        "time to login max (s)",
        |r| Some(r.time_to_login.max_s),
        Unit::Seconds,
    ),
    timed("  of which ccfs mount p50 (s)", mount_p50, Unit::Seconds),
    timed("logout p50 (s)", |r| Some(r.logout.p50_s), Unit::Seconds),
    timed("logout max (s)", |r| Some(r.logout.max_s), Unit::Seconds),
    timed(
        "login + logout p50 (s)",
        |r| Some(r.login_plus_logout.p50_s),
        Unit::Seconds,
    ),
    timed("users' start spread (ms)", start_spread_ms, Unit::Millis),
    timed(
        "server CPU, whole run (s)",
        |r| r.server_cpu_s,
        Unit::Seconds,
    ),
    timed(
        "client CPU: share client (s)",
        |r| r.client_cpu_s,
        Unit::Seconds,
    ),
    timed(
        "client CPU: ccfs, mount to exit (s)",
        |r| r.ccfs_cpu_s,
        Unit::Seconds,
    ),
    timed("  CPU window (s)", |r| r.cpu_window_s, Unit::Seconds),
    metered(
        "share requests, login",
        |r| Some(login(r)?.total as f64),
        Unit::Count,
    ),
    metered(
        "share requests, session",
        |r| Some(session(r)?.total as f64),
        Unit::Count,
    ),
    metered(
        "share requests, logout",
        |r| Some(logout(r)?.total as f64),
        Unit::Count,
    ),
    metered(
        "share writes, login",
        |r| Some(login(r)?.mutating as f64),
        Unit::Count,
    ),
    metered(
        "share writes, session",
        |r| Some(session(r)?.mutating as f64),
        Unit::Count,
    ),
    metered(
        "share writes, logout",
        |r| Some(logout(r)?.mutating as f64),
        Unit::Count,
    ),
    metered(
        "share bytes written, login",
        |r| Some(login(r)?.write_bytes as f64),
        Unit::Bytes,
    ),
    metered(
        "share bytes written, session",
        |r| Some(session(r)?.write_bytes as f64),
        Unit::Bytes,
    ),
    metered(
        "share bytes written, logout",
        |r| Some(logout(r)?.write_bytes as f64),
        Unit::Bytes,
    ),
    metered(
        "share requests, whole run",
        |r| Some(r.share_whole()?.total as f64),
        Unit::Count,
    ),
    metered(
        "share writes, whole run",
        |r| Some(r.share_whole()?.mutating as f64),
        Unit::Count,
    ),
    metered(
        "share bytes written, whole run",
        |r| Some(r.share_whole()?.write_bytes as f64),
        Unit::Bytes,
    ),
    metered(
        "share bytes read, whole run",
        |r| Some(r.share_whole()?.read_bytes as f64),
        Unit::Bytes,
    ),
    timed(
        "server calls, login + session",
        |r| Some(r.server_login_session.as_ref()?.calls() as f64),
        Unit::Count,
    ),
    timed(
        "server calls, logout",
        |r| Some(r.server_logout.as_ref()?.calls() as f64),
        Unit::Count,
    ),
    timed(
        "server writes, login + session",
        |r| Some(r.server_login_session.as_ref()?.writes() as f64),
        Unit::Count,
    ),
    timed(
        "server writes, whole run",
        |r| Some(r.server_whole()?.writes() as f64),
        Unit::Count,
    ),
    timed(
        "server fsyncs, whole run",
        |r| Some(r.server_whole()?.calls_of(&["FSYNC", "FSYNCDIR"]) as f64),
        Unit::Count,
    ),
    timed(
        "server bytes written, whole run",
        |r| Some(r.server_whole()?.bytes_written? as f64),
        Unit::Bytes,
    ),
    timed(
        "server bytes read, whole run",
        |r| Some(r.server_whole()?.bytes_read? as f64),
        Unit::Bytes,
    ),
    timed(
        "server time in calls, whole run (s)",
        |r| r.server_whole()?.busy_s(),
        Unit::Seconds,
    ),
    timed(
        "files missed, a user",
        |r| per_user(r, |u| u.missing_files),
        Unit::Count,
    ),
    timed(
        "files rebuilt for them, a user",
        |r| per_user(r, |u| u.rebuilt_files),
        Unit::Count,
    ),
];

/// The median ccfs mount time of a run's users (runs with ccfs).
fn mount_p50(r: &StormReport) -> Option<f64> {
    r.with_ccfs
        .then(|| Summary::of(&r.per_user.iter().map(|u| u.mount_s).collect::<Vec<_>>()).p50_s)
}

/// How long after the first user the last one started, in milliseconds.
fn start_spread_ms(r: &StormReport) -> Option<f64> {
    let starts = r.per_user.iter().map(|u| u.start_s);
    Some(starts.fold(0.0, f64::max) * 1000.0)
}

/// The table's columns: one a mode that ran (without ccfs first).
struct Columns<'a> {
    runs: &'a [StormReport],
    modes: Vec<bool>,
}

impl<'a> Columns<'a> {
    fn of(runs: &'a [StormReport]) -> Self {
        let modes = [false, true]
            .into_iter()
            .filter(|m| runs.iter().any(|r| r.with_ccfs == *m))
            .collect();
        Self { runs, modes }
    }

    /// The timed runs of mode `m`.
    fn timed(&self, m: bool) -> impl Iterator<Item = &'a StormReport> {
        self.runs
            .iter()
            .filter(move |r| r.with_ccfs == m && !r.metered)
    }

    /// The metered run of mode `m`.
    fn metered(&self, m: bool) -> Option<&'a StormReport> {
        self.runs.iter().find(|r| r.with_ccfs == m && r.metered)
    }

    /// A row's value in each column: the median and spread of the timed runs, or the
    /// metered run's value three times.
    fn cells(&self, from: From) -> Vec<Option<(f64, f64, f64)>> {
        self.modes
            .iter()
            .map(|&m| match from {
                From::Timed(get) => {
                    median_spread(&self.timed(m).filter_map(get).collect::<Vec<_>>())
                }
                From::Metered(get) => self.metered(m).and_then(get).map(|v| (v, v, v)),
            })
            .collect()
    }
}

/// The comparison: one column a mode (median and spread of the timed runs; counts from
/// the metered run), and the ratio with/without when both ran.
pub fn table(runs: &[StormReport]) -> String {
    let mut out = String::new();
    let Some(first) = runs.first() else {
        return out;
    };
    let cols = Columns::of(runs);
    out.push_str(&heading(first, &cols));
    out.push_str(&column_heads(&cols.modes));
    for row in ROWS {
        out.push_str(&render_row(row, &cols.cells(row.from)));
    }
    out.push_str(&login_requests_by_path(&cols));
    out.push_str(&latencies(&cols));
    out.push_str(&host_parts(&cols));
    for r in runs {
        if let Some(e) = &r.error {
            out.push_str(&format!("\n{}: stopped: {e}\n", r.name()));
        }
    }
    out
}

/// What ran, on what, and how the values were taken.
fn heading(first: &StormReport, cols: &Columns) -> String {
    let runs = cols.runs;
    let order: String = runs
        .iter()
        .filter(|r| !r.metered)
        .map(|r| if r.with_ccfs { 'B' } else { 'A' })
        .collect();
    format!(
        "loadgen login-storm: {} users on {} ({}), session {} s, profile {}\n\
         baseline: {}; {}\n\
         times: median (min-max) of {} timed run(s) a mode, order {} (A without ccfs, B with); \
         counts: {}\n{}{}\n",
        first.users,
        first.share,
        first.environment.fs_type,
        first.session_s,
        first.profile,
        first.baseline.describe(),
        if first.returning_users {
            "returning users (each workstation as an earlier session left it)"
        } else {
            "first logins (workstations never used)"
        },
        cols.timed(cols.modes[0]).count(),
        if order.is_empty() { "-" } else { &order },
        if runs.iter().any(|r| r.metered) {
            "one more run a mode through the share meter"
        } else {
            "none (--no-meter)"
        },
        if runs.iter().any(|r| r.server_login_session.is_some()) {
            "server rows: the server's own counters (--server-counts), timed runs\n"
        } else {
            ""
        },
        local_share_caveat(&first.environment.fs_type)
    )
}

/// The line naming the columns (and the ratio's, with both modes).
fn column_heads(modes: &[bool]) -> String {
    let mut out = format!("{:<38}", "");
    for m in modes {
        out.push_str(&format!(
            "{:>22}",
            if *m { "with ccfs" } else { "without ccfs" }
        ));
    }
    if modes.len() == 2 {
        out.push_str(&format!("{:>14}", "with/without"));
    }
    out.push('\n');
    out
}

/// One row's line: its label, a cell a column ("-" for none, the spread when the runs
/// differ), and the ratio with/without when both have a value (not for the CPU window);
/// nothing when no column has a value.
fn render_row(row: &Row, cells: &[Option<(f64, f64, f64)>]) -> String {
    if cells.iter().all(Option::is_none) {
        return String::new();
    }
    let name = row.label;
    let fmt = |v: f64| row.unit.show(v);
    let mut out = format!("{name:<38}");
    for c in cells {
        let cell = match c {
            None => "-".to_string(),
            Some((m, lo, hi)) if lo < hi => {
                let bare = |v: f64| row.unit.bare(v);
                format!("{} ({}-{})", fmt(*m), bare(*lo), bare(*hi))
            }
            Some((m, _, _)) => fmt(*m),
        };
        // Never run into the cell before it.
        out.push_str(&format!("{cell:>w$}", w = 22.max(cell.chars().count() + 2)));
    }
    if let [Some((a, ..)), Some((b, ..))] = cells[..] {
        if a > 0.0 && !name.contains("window") {
            out.push_str(&format!("{:>14}", ratio(b / a)));
        }
    }
    out.push('\n');
    out
}

/// A ratio with two significant digits and the `x` that says it multiplies the
/// baseline: `0.32x`, `9.4x`, `0.0031x`; exactly nothing is `0x`.
pub fn ratio(r: f64) -> String {
    if r == 0.0 {
        return "0x".to_string();
    }
    // Decimals for two significant digits, at least one below 10 and none from 100.
    let digits = 1 - r.abs().log10().floor() as i32;
    format!("{r:.*}x", digits.clamp(0, 9) as usize)
}

/// A time with three significant digits (at most four decimals): `0.0042`, `0.731`,
/// `12.4`, `238`.
pub fn sig3(v: f64) -> String {
    if v <= 0.0 {
        return "0".to_string();
    }
    if v < 0.000_05 {
        return "<0.0001".to_string();
    }
    let digits = 2 - v.log10().floor() as i32;
    format!("{v:.*}", digits.clamp(0, 4) as usize)
}

/// The local filesystems a share may be tried on: no file server behind them.
const LOCAL_FS: &[&str] = &[
    "tmpfs", "ramfs", "ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "vfat", "exfat", "jfs",
    "reiserfs", "zfs", "bcachefs", "overlay",
];

/// The caveat of a storm on a local filesystem, if it was one.
fn local_share_caveat(fs_type: &str) -> String {
    if !LOCAL_FS.contains(&fs_type) {
        return String::new();
    }
    format!(
        "note: the share is a local filesystem ({fs_type}), not a file server: there is no \
         server load for ccfs to take away,\n      so ccfs's own work (its mounts, its \
         sync at logout) shows as cost only; run on a network share to see what it buys\n"
    )
}

/// Where the login's share requests went, from the metered runs: the ten paths most
/// asked for, a list a mode.
fn login_requests_by_path(cols: &Columns) -> String {
    let mut out = String::new();
    for m in &cols.modes {
        let Some(c) = cols.metered(*m).and_then(|r| r.share_login.as_ref()) else {
            continue;
        };
        if c.by_path.is_empty() {
            continue;
        }
        let mut top: Vec<(&String, &u64)> = c.by_path.iter().collect();
        top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        out.push_str(&format!(
            "\nshare requests of the logins {}, by path in the home (all users; the {} most of {}):\n",
            if *m { "with ccfs" } else { "without ccfs" },
            top.len().min(10),
            top.len()
        ));
        for (k, v) in top.into_iter().take(10) {
            out.push_str(&format!("  {v:>9}  {k}\n"));
        }
    }
    out
}

/// A class across hosts: each host's part of the first timed run of each mode.
fn host_parts(cols: &Columns) -> String {
    let mut out = String::new();
    for r in cols.modes.iter().filter_map(|&m| cols.timed(m).next()) {
        if r.hosts.is_empty() {
            continue;
        }
        out.push_str(&format!(
            "\n{:<30}{:<12}{:>6}{:>12}{:>13}{:>11}\n",
            format!("hosts, {}", r.run_name()),
            "host",
            "users",
            "login p50 s",
            "logout p50 s",
            "start ms"
        ));
        for h in &r.hosts {
            out.push_str(&format!(
                "  {:<28}{:<12}{:>6}{:>12}{:>13}{:>11}{}\n",
                "",
                h.host,
                h.users,
                sig3(h.time_to_login.p50_s),
                sig3(h.logout.p50_s),
                format!("{:.1}", h.start_offset_ms),
                h.error
                    .as_deref()
                    .map(|e| format!("  {e}"))
                    .unwrap_or_default()
            ));
        }
    }
    out
}

/// The login's and the session's operation latencies, from the first timed run of each
/// mode.
fn latencies(cols: &Columns) -> String {
    let mut out = String::new();
    type Pick = fn(&StormReport) -> &BTreeMap<String, LatencyReport>;
    let picks: [(&str, Pick); 2] = [
        ("login", |r| &r.latency_login),
        ("session", |r| &r.latency_session),
    ];
    for (title, pick) in picks {
        // The first timed run of each mode.
        let shown: Vec<&StormReport> = cols
            .modes
            .iter()
            .filter_map(|&m| cols.timed(m).next())
            .collect();
        if shown.iter().all(|r| pick(r).is_empty()) {
            continue;
        }
        out.push_str(&format!(
            "\n{:<30}{:<8}{:>7}{:>9}{:>9}{:>9}\n",
            format!("{title} latency (ms)"),
            "op",
            "count",
            "p50",
            "p99",
            "max"
        ));
        for r in shown {
            for (op, l) in pick(r) {
                out.push_str(&format!(
                    "  {:<28}{op:<8}{:>7}{:>9}{:>9}{:>9}\n",
                    r.run_name(),
                    l.count,
                    sig3(l.p50_us / 1000.0),
                    sig3(l.p99_us / 1000.0),
                    sig3(l.max_us / 1000.0)
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Environment, LatencyReport};
    use crate::storm::{Baseline, Settled, ShareCounts, SCHEMA};

    #[test]
    fn ratios_keep_two_significant_digits_and_say_they_multiply() {
        assert_eq!(ratio(0.317), "0.32x");
        assert_eq!(ratio(9.419), "9.4x");
        assert_eq!(ratio(0.00314), "0.0031x");
        assert_eq!(ratio(11.73), "12x");
        assert_eq!(ratio(1.0), "1.0x");
        assert_eq!(ratio(0.0), "0x");
    }

    #[test]
    fn small_times_keep_their_digits() {
        assert_eq!(sig3(0.0042), "0.0042");
        assert_eq!(sig3(0.000_01), "<0.0001");
        assert_eq!(sig3(0.731), "0.731");
        assert_eq!(sig3(12.44), "12.4");
        assert_eq!(sig3(238.2), "238");
        assert_eq!(sig3(0.0), "0");
    }

    #[test]
    fn a_storm_on_a_local_filesystem_says_what_its_ratios_cannot_show() {
        let mut runs = table_fixture();
        assert!(!table(&runs).contains("note: the share is a local filesystem"));
        for r in &mut runs {
            r.environment.fs_type = "tmpfs".into();
        }
        assert!(table(&runs).contains("note: the share is a local filesystem (tmpfs)"));
    }

    #[test]
    fn medians_and_spreads() {
        assert_eq!(median_spread(&[]), None);
        assert_eq!(median_spread(&[3.0, 1.0, 2.0]), Some((2.0, 1.0, 3.0)));
        assert_eq!(median_spread(&[4.0, 1.0, 2.0, 3.0]), Some((2.5, 1.0, 4.0)));
    }

    /// A storm of two timed runs a mode and a metered run a mode, with every row's value
    /// present somewhere, by-path counts, latencies and a stopped run.
    fn table_fixture() -> Vec<StormReport> {
        let lat = |count, p50: f64| LatencyReport {
            count,
            mean_us: p50,
            p50_us: p50,
            p90_us: p50 * 2.0,
            p99_us: p50 * 3.0,
            p999_us: p50 * 4.0,
            max_us: p50 * 10.0,
        };
        let counts = |k: u64| ShareCounts {
            total: 100 * k,
            mutating: 10 * k,
            read_bytes: 3_000_000 * k,
            write_bytes: 1_500_000 * k,
            by_op: BTreeMap::new(),
            by_path: [
                (".mozilla/firefox/p".to_string(), 40 * k),
                (".".to_string(), 7 * k),
                (".config".to_string(), 40 * k),
            ]
            .into(),
        };
        let user = |u: usize, login_s: f64, with_ccfs: bool| UserResult {
            user: u,
            mount_s: if with_ccfs { 0.1 * (u + 1) as f64 } else { 0.0 },
            login_s,
            session_ticks: 2,
            logout_s: login_s / 2.0,
            bytes_written: 1000,
            missing_files: 3 + u as u64,
            rebuilt_files: u as u64,
            ccfs_cpu_s: with_ccfs.then_some(0.25),
            session_latency: BTreeMap::new(),
            error: None,
            start_s: 0.001 * u as f64,
        };
        // The server's own counts: `writes` WRITE calls of 8 KiB and `fsyncs` FSYNCs.
        let server = |writes: f64, fsyncs: f64| crate::storm::ServerCounts {
            fops: [
                (
                    "WRITE".to_string(),
                    crate::storm::FopCount {
                        calls: writes as u64,
                        latency_us: writes * 100.0,
                    },
                ),
                (
                    "FSYNC".to_string(),
                    crate::storm::FopCount {
                        calls: fsyncs as u64,
                        latency_us: fsyncs * 8000.0,
                    },
                ),
                (
                    "LOOKUP".to_string(),
                    crate::storm::FopCount {
                        calls: 50,
                        latency_us: 500.0,
                    },
                ),
            ]
            .into(),
            bytes_read: Some(4096),
            bytes_written: Some(writes as u64 * 8192),
        };
        let run = |with_ccfs: bool, metered: bool, run_index: usize, mode_run: usize, k: f64| {
            let per_user = vec![user(0, 1.0 * k, with_ccfs), user(1, 2.0 * k, with_ccfs)];
            let of = |f: fn(&UserResult) -> f64| {
                Summary::of(&per_user.iter().map(f).collect::<Vec<_>>())
            };
            let c = |i: u64| metered.then(|| counts(i + u64::from(with_ccfs)));
            StormReport {
                schema: SCHEMA.into(),
                tool: "loadgen".into(),
                version: "0".into(),
                started_at_unix: 0,
                label: None,
                share: "/mnt/share".into(),
                environment: Environment {
                    fs_type: "fuse.glusterfs".into(),
                    fs_magic: "0x65735546".into(),
                    mount_point: "/mnt/share".into(),
                    mount_source: "h:/v".into(),
                    mount_options: "rw".into(),
                    kernel: "6.1".into(),
                    cpus: 2,
                    hostname: "h".into(),
                },
                users: 2,
                with_ccfs,
                metered,
                run_index,
                mode_run,
                baseline: Baseline::Fair,
                session_s: 30.0,
                profile: "desktop".into(),
                returning_users: with_ccfs,
                settled: Settled::default(),
                time_to_login: of(|u| u.login_s),
                logout: of(|u| u.logout_s),
                login_plus_logout: of(|u| u.login_s + u.logout_s),
                latency_login: [("open".to_string(), lat(10, 1500.0 * k))].into(),
                latency_session: if with_ccfs {
                    [("stat".to_string(), lat(4, 250.0))].into()
                } else {
                    BTreeMap::new()
                },
                share_login: c(1),
                share_session: c(2),
                share_logout: c(3),
                server_login_session: (!metered).then(|| server(100.0 * k, 2.0 * k)),
                server_logout: (!metered).then(|| server(20.0 * k, 1.0)),
                server_cpu_s: (!metered).then_some(1.5 * k),
                client_cpu_s: (!metered && !with_ccfs).then_some(0.75 * k),
                ccfs_cpu_s: (with_ccfs && !metered).then_some(0.5),
                cpu_window_s: (!metered).then_some(10.0),
                complete: true,
                error: None,
                per_user,
                hosts: Vec::new(),
                latencies_raw: None,
            }
        };
        let mut runs = vec![
            run(false, false, 0, 1, 1.0),
            run(true, false, 1, 1, 0.5),
            run(true, false, 2, 2, 0.6),
            run(false, false, 3, 2, 1.2),
            run(false, true, 4, 0, 1.0),
            run(true, true, 5, 0, 0.5),
        ];
        runs[5].error = Some("user001: logout: no space".into());
        runs[5].label = Some("lab".into());
        runs
    }

    #[test]
    fn the_table_compares_the_modes_row_by_row() {
        assert_eq!(table(&table_fixture()), TWO_MODES);
    }

    #[test]
    fn a_table_of_one_mode_has_no_ratio_and_leaves_out_rows_without_values() {
        let one: Vec<StormReport> = table_fixture()
            .into_iter()
            .filter(|r| !r.with_ccfs && !r.metered)
            .collect();
        assert_eq!(table(&one), ONE_MODE);
        assert_eq!(table(&[]), "");
    }

    /// The table of [`table_fixture`].
    const TWO_MODES: &str = r#"loadgen login-storm: 2 users on /mnt/share (fuse.glusterfs), session 30 s, profile desktop
baseline: fair (without ccfs, .cache on the workstation's disk); first logins (workstations never used)
times: median (min-max) of 2 timed run(s) a mode, order ABBA (A without ccfs, B with); counts: one more run a mode through the share meter
server rows: the server's own counters (--server-counts), timed runs

                                                without ccfs             with ccfs  with/without
time to login p50 (s)                       1.10 (1.00-1.20)   0.550 (0.500-0.600)         0.50x
time to login p95 (s)                       2.20 (2.00-2.40)      1.10 (1.00-1.20)         0.50x
time to login max (s)                       2.20 (2.00-2.40)      1.10 (1.00-1.20)         0.50x
  of which ccfs mount p50 (s)                              -                 0.100
logout p50 (s)                           0.550 (0.500-0.600)   0.275 (0.250-0.300)         0.50x
logout max (s)                              1.10 (1.00-1.20)   0.550 (0.500-0.600)         0.50x
login + logout p50 (s)                      1.65 (1.50-1.80)   0.825 (0.750-0.900)         0.50x
users' start spread (ms)                                1.00                  1.00          1.0x
server CPU, whole run (s)                   1.65 (1.50-1.80)   0.825 (0.750-0.900)         0.50x
client CPU: share client (s)             0.825 (0.750-0.900)                     -
client CPU: ccfs, mount to exit (s)                        -                 0.500
  CPU window (s)                                        10.0                  10.0
share requests, login                                    100                   200          2.0x
share requests, session                                  200                   300          1.5x
share requests, logout                                   300                   400          1.3x
share writes, login                                       10                    20          2.0x
share writes, session                                     20                    30          1.5x
share writes, logout                                      30                    40          1.3x
share bytes written, login                            1.5 MB                3.0 MB          2.0x
share bytes written, session                          3.0 MB                4.5 MB          1.5x
share bytes written, logout                           4.5 MB                6.0 MB          1.3x
share requests, whole run                                600                   900          1.5x
share writes, whole run                                   60                    90          1.5x
share bytes written, whole run                        9.0 MB               13.5 MB          1.5x
share bytes read, whole run                          18.0 MB               27.0 MB          1.5x
server calls, login + session                  162 (152-172)         106 (101-111)         0.65x
server calls, logout                              73 (71-75)            62 (61-63)         0.85x
server writes, login + session                 112 (102-122)            56 (51-61)         0.50x
server writes, whole run                       135 (123-147)            68 (62-74)         0.50x
server fsyncs, whole run                                   3                     2         0.67x
server bytes written, whole run             1.1 MB (1.0-1.2)      0.5 MB (0.5-0.6)         0.50x
server bytes read, whole run                          0.0 MB                0.0 MB          1.0x
server time in calls, whole run (s)     0.0398 (0.0370-0.0426)  0.0244 (0.0230-0.0258)         0.61x
files missed, a user                                       4                     4          1.0x
files rebuilt for them, a user                             0                     0          1.0x

share requests of the logins without ccfs, by path in the home (all users; the 3 most of 3):
         40  .config
         40  .mozilla/firefox/p
          7  .

share requests of the logins with ccfs, by path in the home (all users; the 3 most of 3):
         80  .config
         80  .mozilla/firefox/p
         14  .

login latency (ms)            op        count      p50      p99      max
  without ccfs #1             open         10     1.50     4.50     15.0
  with ccfs #1                open         10    0.750     2.25     7.50

session latency (ms)          op        count      p50      p99      max
  with ccfs #1                stat          4    0.250    0.750     2.50

lab, with ccfs, metered: stopped: user001: logout: no space
"#;

    /// The table of [`table_fixture`]'s timed runs without ccfs.
    const ONE_MODE: &str = r#"loadgen login-storm: 2 users on /mnt/share (fuse.glusterfs), session 30 s, profile desktop
baseline: fair (without ccfs, .cache on the workstation's disk); first logins (workstations never used)
times: median (min-max) of 2 timed run(s) a mode, order AA (A without ccfs, B with); counts: none (--no-meter)
server rows: the server's own counters (--server-counts), timed runs

                                                without ccfs
time to login p50 (s)                       1.10 (1.00-1.20)
time to login p95 (s)                       2.20 (2.00-2.40)
time to login max (s)                       2.20 (2.00-2.40)
logout p50 (s)                           0.550 (0.500-0.600)
logout max (s)                              1.10 (1.00-1.20)
login + logout p50 (s)                      1.65 (1.50-1.80)
users' start spread (ms)                                1.00
server CPU, whole run (s)                   1.65 (1.50-1.80)
client CPU: share client (s)             0.825 (0.750-0.900)
  CPU window (s)                                        10.0
server calls, login + session                  162 (152-172)
server calls, logout                              73 (71-75)
server writes, login + session                 112 (102-122)
server writes, whole run                       135 (123-147)
server fsyncs, whole run                                   3
server bytes written, whole run             1.1 MB (1.0-1.2)
server bytes read, whole run                          0.0 MB
server time in calls, whole run (s)     0.0398 (0.0370-0.0426)
files missed, a user                                       4
files rebuilt for them, a user                             0

login latency (ms)            op        count      p50      p99      max
  without ccfs #1             open         10     1.50     4.50     15.0
"#;
}
