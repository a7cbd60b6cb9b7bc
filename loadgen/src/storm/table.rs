//! The comparison table of a storm's runs.

use std::collections::BTreeMap;

use super::{StormReport, Summary, UserResult};

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
enum From {
    /// The runs without the meter: median and spread.
    Timed(fn(&StormReport) -> Option<f64>),
    /// The metered run.
    Metered(fn(&StormReport) -> Option<f64>),
}

/// The comparison: one column a mode (median and spread of the timed runs; counts from
/// the metered run), and the ratio with/without when both ran.
pub fn table(runs: &[StormReport]) -> String {
    let mut out = String::new();
    let Some(first) = runs.first() else {
        return out;
    };
    let modes: Vec<bool> = [false, true]
        .into_iter()
        .filter(|m| runs.iter().any(|r| r.with_ccfs == *m))
        .collect();
    let timed = |m: bool| runs.iter().filter(move |r| r.with_ccfs == m && !r.metered);
    let metered = |m: bool| runs.iter().find(|r| r.with_ccfs == m && r.metered);
    let order: String = runs
        .iter()
        .filter(|r| !r.metered)
        .map(|r| if r.with_ccfs { 'B' } else { 'A' })
        .collect();
    out.push_str(&format!(
        "loadgen login-storm: {} users on {} ({}), session {} s, profile {}\n\
         baseline: {}; {}\n\
         times: median (min-max) of {} timed run(s) a mode, order {} (A without ccfs, B with); \
         counts: {}\n\n",
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
        timed(modes[0]).count(),
        if order.is_empty() { "-" } else { &order },
        if runs.iter().any(|r| r.metered) {
            "one more run a mode through the share meter"
        } else {
            "none (--no-meter)"
        }
    ));
    out.push_str(&format!("{:<38}", ""));
    for m in &modes {
        out.push_str(&format!(
            "{:>22}",
            if *m { "with ccfs" } else { "without ccfs" }
        ));
    }
    if modes.len() == 2 {
        out.push_str(&format!("{:>9}", "ratio"));
    }
    out.push('\n');
    type Row = (&'static str, From, fn(f64) -> String);
    let secs = |v: f64| format!("{v:.2}");
    let count = |v: f64| format!("{v:.0}");
    let bytes = |v: f64| mb(v as u64);
    let rows: Vec<Row> = vec![
        (
            "time to login p50 (s)",
            From::Timed(|r| Some(r.time_to_login.p50_s)),
            secs,
        ),
        (
            "time to login p95 (s)",
            From::Timed(|r| Some(r.time_to_login.p95_s)),
            secs,
        ),
        (
            "time to login max (s)",
            From::Timed(|r| Some(r.time_to_login.max_s)),
            secs,
        ),
        (
            "  of which ccfs mount p50 (s)",
            From::Timed(|r| {
                r.with_ccfs.then(|| {
                    Summary::of(&r.per_user.iter().map(|u| u.mount_s).collect::<Vec<_>>()).p50_s
                })
            }),
            secs,
        ),
        (
            "logout p50 (s)",
            From::Timed(|r| Some(r.logout.p50_s)),
            secs,
        ),
        (
            "logout max (s)",
            From::Timed(|r| Some(r.logout.max_s)),
            secs,
        ),
        (
            "login + logout p50 (s)",
            From::Timed(|r| Some(r.login_plus_logout.p50_s)),
            secs,
        ),
        (
            "users' start spread (ms)",
            From::Timed(|r| {
                let starts = r.per_user.iter().map(|u| u.start_s);
                Some(starts.fold(0.0, f64::max) * 1000.0)
            }),
            |v: f64| format!("{v:.1}"),
        ),
        (
            "server CPU, whole run (s)",
            From::Timed(|r| r.server_cpu_s),
            secs,
        ),
        (
            "client CPU: share client (s)",
            From::Timed(|r| r.client_cpu_s),
            secs,
        ),
        (
            "client CPU: ccfs daemons (s)",
            From::Timed(|r| r.ccfs_cpu_s),
            secs,
        ),
        ("  CPU window (s)", From::Timed(|r| r.cpu_window_s), secs),
        (
            "share requests, login",
            From::Metered(|r| r.share_login.as_ref().map(|c| c.total as f64)),
            count,
        ),
        (
            "share requests, session",
            From::Metered(|r| r.share_session.as_ref().map(|c| c.total as f64)),
            count,
        ),
        (
            "share requests, logout",
            From::Metered(|r| r.share_logout.as_ref().map(|c| c.total as f64)),
            count,
        ),
        (
            "share writes, login",
            From::Metered(|r| r.share_login.as_ref().map(|c| c.mutating as f64)),
            count,
        ),
        (
            "share writes, session",
            From::Metered(|r| r.share_session.as_ref().map(|c| c.mutating as f64)),
            count,
        ),
        (
            "share writes, logout",
            From::Metered(|r| r.share_logout.as_ref().map(|c| c.mutating as f64)),
            count,
        ),
        (
            "share bytes written, login",
            From::Metered(|r| r.share_login.as_ref().map(|c| c.write_bytes as f64)),
            bytes,
        ),
        (
            "share bytes written, session",
            From::Metered(|r| r.share_session.as_ref().map(|c| c.write_bytes as f64)),
            bytes,
        ),
        (
            "share bytes written, logout",
            From::Metered(|r| r.share_logout.as_ref().map(|c| c.write_bytes as f64)),
            bytes,
        ),
        (
            "share requests, whole run",
            From::Metered(|r| r.share_whole().map(|c| c.total as f64)),
            count,
        ),
        (
            "share writes, whole run",
            From::Metered(|r| r.share_whole().map(|c| c.mutating as f64)),
            count,
        ),
        (
            "share bytes written, whole run",
            From::Metered(|r| r.share_whole().map(|c| c.write_bytes as f64)),
            bytes,
        ),
        (
            "share bytes read, whole run",
            From::Metered(|r| r.share_whole().map(|c| c.read_bytes as f64)),
            bytes,
        ),
        (
            "files not found (per user)",
            From::Timed(|r| per_user(r, |u| u.missing_files)),
            count,
        ),
        (
            "  of which rebuilt (per user)",
            From::Timed(|r| per_user(r, |u| u.rebuilt_files)),
            count,
        ),
    ];
    for (name, from, fmt) in rows {
        let cells: Vec<Option<(f64, f64, f64)>> = modes
            .iter()
            .map(|&m| match &from {
                From::Timed(get) => median_spread(&timed(m).filter_map(get).collect::<Vec<_>>()),
                From::Metered(get) => metered(m).and_then(get).map(|v| (v, v, v)),
            })
            .collect();
        if cells.iter().all(Option::is_none) {
            continue;
        }
        out.push_str(&format!("{name:<38}"));
        for c in &cells {
            let cell = match c {
                None => "-".to_string(),
                Some((m, lo, hi)) if lo < hi => {
                    format!("{} ({}-{})", fmt(*m), fmt(*lo), fmt(*hi))
                }
                Some((m, _, _)) => fmt(*m),
            };
            out.push_str(&format!("{cell:>22}"));
        }
        if let [Some((a, ..)), Some((b, ..))] = cells[..] {
            if a > 0.0 && !name.contains("window") {
                out.push_str(&format!("{:>9.3}", b / a));
            }
        }
        out.push('\n');
    }
    // Where the login's share requests went, from the metered runs.
    for m in &modes {
        let Some(c) = metered(*m).and_then(|r| r.share_login.as_ref()) else {
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
    for (title, pick) in [
        (
            "login",
            (|r: &StormReport| &r.latency_login) as fn(&StormReport) -> &BTreeMap<_, _>,
        ),
        ("session", |r: &StormReport| &r.latency_session),
    ] {
        // The first timed run of each mode.
        let shown: Vec<&StormReport> = modes.iter().filter_map(|&m| timed(m).next()).collect();
        if shown.iter().all(|r| pick(r).is_empty()) {
            continue;
        }
        out.push_str(&format!(
            "\n{:<30}{:<8}{:>7}{:>8}{:>8}{:>8}\n",
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
                    "  {:<28}{op:<8}{:>7}{:>8.2}{:>8.2}{:>8.1}\n",
                    format!("{} #{}", r.mode(), r.run_index + 1),
                    l.count,
                    l.p50_us / 1000.0,
                    l.p99_us / 1000.0,
                    l.max_us / 1000.0
                ));
            }
        }
    }
    for r in runs {
        if let Some(e) = &r.error {
            out.push_str(&format!("\n{}: stopped: {e}\n", r.name()));
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
        let run = |with_ccfs: bool, metered: bool, run_index: usize, k: f64| {
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
                server_cpu_s: (!metered).then_some(1.5 * k),
                client_cpu_s: (!metered && !with_ccfs).then_some(0.75 * k),
                ccfs_cpu_s: (with_ccfs && !metered).then_some(0.5),
                cpu_window_s: (!metered).then_some(10.0),
                complete: true,
                error: None,
                per_user,
            }
        };
        let mut runs = vec![
            run(false, false, 0, 1.0),
            run(true, false, 1, 0.5),
            run(true, false, 2, 0.6),
            run(false, false, 3, 1.2),
            run(false, true, 4, 1.0),
            run(true, true, 5, 0.5),
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

                                                without ccfs             with ccfs    ratio
time to login p50 (s)                       1.10 (1.00-1.20)      0.55 (0.50-0.60)    0.500
time to login p95 (s)                       2.20 (2.00-2.40)      1.10 (1.00-1.20)    0.500
time to login max (s)                       2.20 (2.00-2.40)      1.10 (1.00-1.20)    0.500
  of which ccfs mount p50 (s)                              -                  0.10
logout p50 (s)                              0.55 (0.50-0.60)      0.28 (0.25-0.30)    0.500
logout max (s)                              1.10 (1.00-1.20)      0.55 (0.50-0.60)    0.500
login + logout p50 (s)                      1.65 (1.50-1.80)      0.82 (0.75-0.90)    0.500
users' start spread (ms)                                 1.0                   1.0    1.000
server CPU, whole run (s)                   1.65 (1.50-1.80)      0.82 (0.75-0.90)    0.500
client CPU: share client (s)                0.82 (0.75-0.90)                     -
client CPU: ccfs daemons (s)                               -                  0.50
  CPU window (s)                                       10.00                 10.00
share requests, login                                    100                   200    2.000
share requests, session                                  200                   300    1.500
share requests, logout                                   300                   400    1.333
share writes, login                                       10                    20    2.000
share writes, session                                     20                    30    1.500
share writes, logout                                      30                    40    1.333
share bytes written, login                            1.5 MB                3.0 MB    2.000
share bytes written, session                          3.0 MB                4.5 MB    1.500
share bytes written, logout                           4.5 MB                6.0 MB    1.333
share requests, whole run                                600                   900    1.500
share writes, whole run                                   60                    90    1.500
share bytes written, whole run                        9.0 MB               13.5 MB    1.500
share bytes read, whole run                          18.0 MB               27.0 MB    1.500
files not found (per user)                                 4                     4    1.000
  of which rebuilt (per user)                              0                     0    1.000

share requests of the logins without ccfs, by path in the home (all users; the 3 most of 3):
         40  .config
         40  .mozilla/firefox/p
          7  .

share requests of the logins with ccfs, by path in the home (all users; the 3 most of 3):
         80  .config
         80  .mozilla/firefox/p
         14  .

login latency (ms)            op        count     p50     p99     max
  without ccfs #1             open         10    1.50    4.50    15.0
  with ccfs #2                open         10    0.75    2.25     7.5

session latency (ms)          op        count     p50     p99     max
  with ccfs #2                stat          4    0.25    0.75     2.5

lab, with ccfs, metered: stopped: user001: logout: no space
"#;

    /// The table of [`table_fixture`]'s timed runs without ccfs.
    const ONE_MODE: &str = r#"loadgen login-storm: 2 users on /mnt/share (fuse.glusterfs), session 30 s, profile desktop
baseline: fair (without ccfs, .cache on the workstation's disk); first logins (workstations never used)
times: median (min-max) of 2 timed run(s) a mode, order AA (A without ccfs, B with); counts: none (--no-meter)

                                                without ccfs
time to login p50 (s)                       1.10 (1.00-1.20)
time to login p95 (s)                       2.20 (2.00-2.40)
time to login max (s)                       2.20 (2.00-2.40)
logout p50 (s)                              0.55 (0.50-0.60)
logout max (s)                              1.10 (1.00-1.20)
login + logout p50 (s)                      1.65 (1.50-1.80)
users' start spread (ms)                                 1.0
server CPU, whole run (s)                   1.65 (1.50-1.80)
client CPU: share client (s)                0.82 (0.75-0.90)
  CPU window (s)                                       10.00
files not found (per user)                                 4
  of which rebuilt (per user)                              0

login latency (ms)            op        count     p50     p99     max
  without ccfs #1             open         10    1.50    4.50    15.0
"#;
}
