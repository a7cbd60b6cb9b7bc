//! The login storm's charts and table: the time to login (every user, percentiles), the
//! logout and the login + logout, in the timed runs; the changing requests that reached
//! the share, in the metered ones.

use std::fmt::Write as _;

use super::{esc, Bars};
use crate::storm::StormReport;

/// login-storm charts: every user's time to login (sorted, the distribution) and its
/// percentiles, the logout's and the login + logout's, in the timed runs; the writes
/// that reached the share in the metered.
pub fn storm_charts(all: &[StormReport]) -> Vec<(String, Bars)> {
    let storms: Vec<&StormReport> = all.iter().filter(|s| !s.metered).collect();
    let metered: Vec<&StormReport> = all.iter().filter(|s| s.metered).collect();
    if all.is_empty() {
        return Vec::new();
    }
    let users = storms.iter().map(|s| s.per_user.len()).max().unwrap_or(0);
    let sorted = |s: &StormReport| {
        let mut v: Vec<f64> = s.per_user.iter().map(|u| u.login_s).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let distribution = Bars {
        title: "Time to login, every user (sorted)".into(),
        y_label: "seconds".into(),
        groups: (1..=users).map(|i| i.to_string()).collect(),
        series: storms
            .iter()
            .map(|s| (s.name(), sorted(s).into_iter().map(Some).collect()))
            .collect(),
        log_y: false,
    };
    let percentiles = Bars {
        title: "Time to login".into(),
        y_label: "seconds".into(),
        groups: vec!["p50".into(), "p95".into(), "max".into()],
        series: storms
            .iter()
            .map(|s| {
                let t = &s.time_to_login;
                (s.name(), vec![Some(t.p50_s), Some(t.p95_s), Some(t.max_s)])
            })
            .collect(),
        log_y: false,
    };
    let summary = |title: &str, pick: fn(&StormReport) -> &crate::storm::Summary| Bars {
        title: title.into(),
        y_label: "seconds".into(),
        groups: vec!["p50".into(), "p95".into(), "max".into()],
        series: storms
            .iter()
            .map(|s| {
                let t = pick(s);
                (s.name(), vec![Some(t.p50_s), Some(t.p95_s), Some(t.max_s)])
            })
            .collect(),
        log_y: false,
    };
    let logout = summary("Logout (with ccfs: the sync back)", |s| &s.logout);
    let login_logout = summary("Login + logout", |s| &s.login_plus_logout);
    let writes = Bars {
        title: "Changing requests that reached the share".into(),
        y_label: "requests (log; 0 drawn at 0.5)".into(),
        groups: vec!["login".into(), "session".into(), "logout".into()],
        series: metered
            .iter()
            .map(|s| {
                let m = |c: &Option<crate::storm::ShareCounts>| {
                    c.as_ref().map(|c| (c.mutating as f64).max(0.5))
                };
                (
                    s.name(),
                    vec![m(&s.share_login), m(&s.share_session), m(&s.share_logout)],
                )
            })
            .collect(),
        log_y: true,
    };
    let mut out = vec![
        ("login-distribution".into(), distribution),
        ("login-percentiles".into(), percentiles),
        ("logout-percentiles".into(), logout),
        ("login-plus-logout".into(), login_logout),
        ("share-writes".into(), writes),
    ];
    out.extend(class_charts(all));
    out
}

/// With more than one class size (a sweep): the time to login (p50, p95) and the
/// server's CPU against the size, a bar a mode (and label).
fn class_charts(all: &[StormReport]) -> Vec<(String, Bars)> {
    let mut sizes: Vec<usize> = all.iter().map(|s| s.users).collect();
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.len() < 2 {
        return Vec::new();
    }
    // A series a label and mode, in the order first seen.
    let mut keys: Vec<(Option<String>, bool)> = Vec::new();
    for s in all.iter().filter(|s| !s.metered) {
        let k = (s.label.clone(), s.with_ccfs);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let chart = |title: &str, y: &str, get: fn(&crate::storm::Point) -> Option<f64>| Bars {
        title: title.into(),
        y_label: y.into(),
        groups: sizes.iter().map(|u| format!("{u} users")).collect(),
        series: keys
            .iter()
            .map(|(label, with_ccfs)| {
                let mine: Vec<StormReport> =
                    all.iter().filter(|s| s.label == *label).cloned().collect();
                let pts = crate::storm::points(&mine, *with_ccfs);
                let mode = if *with_ccfs {
                    "with ccfs"
                } else {
                    "without ccfs"
                };
                let name = match label {
                    Some(l) => format!("{l}, {mode}"),
                    None => mode.to_string(),
                };
                let at = |u: usize| pts.iter().find(|p| p.users == u).and_then(get);
                (name, sizes.iter().map(|&u| at(u)).collect())
            })
            .collect(),
        log_y: false,
    };
    vec![
        (
            "class-login-p50".into(),
            chart("Time to login p50 against the class size", "seconds", |p| {
                Some(p.login_p50_s)
            }),
        ),
        (
            "class-login-p95".into(),
            chart("Time to login p95 against the class size", "seconds", |p| {
                Some(p.login_p95_s)
            }),
        ),
        (
            "class-server-cpu".into(),
            chart("Server CPU against the class size", "CPU seconds", |p| {
                p.server_cpu_s
            }),
        ),
    ]
}

/// The storms' tables: the timed runs with their times (and the server's CPU); the
/// metered runs apart, with their counts only (the meter's mount slows what it counts:
/// its times are not compared).
pub(super) fn storm_table_html(storms: &[StormReport]) -> String {
    let mut h = String::from(
        "<h2>Login storms: timed runs</h2><table><tr><th>run</th><th>share</th><th>users</th>\
         <th>session s</th><th>login p50 s</th><th>p95 s</th><th>max s</th><th>logout p50 s</th>\
         <th>login + logout p50 s</th><th>server CPU s</th><th>complete</th></tr>",
    );
    for s in storms.iter().filter(|s| !s.metered) {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{} ({})</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{:.2}</td>\
             <td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{}</td><td>{}</td></tr>",
            esc(&s.name()),
            esc(&s.share),
            esc(&s.environment.fs_type),
            s.users,
            s.session_s,
            s.time_to_login.p50_s,
            s.time_to_login.p95_s,
            s.time_to_login.max_s,
            s.logout.p50_s,
            s.login_plus_logout.p50_s,
            s.server_cpu_s
                .map(|c| format!("{c:.1}"))
                .unwrap_or_else(|| "-".into()),
            if s.complete { "yes" } else { "no" }
        );
    }
    h.push_str("</table>");
    if !storms.iter().any(|s| s.metered) {
        return h;
    }
    h.push_str(
        "<h2>Login storms: what reached the share (metered runs)</h2><table><tr><th>run</th>\
         <th>share requests (whole run)</th><th>share writes (whole run)</th>\
         <th>share bytes written (whole run)</th><th>share writes (logout)</th>\
         <th>complete</th></tr>",
    );
    let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    for s in storms.iter().filter(|s| s.metered) {
        let whole = s.share_whole();
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&s.name()),
            opt(whole.as_ref().map(|c| c.total)),
            opt(whole.as_ref().map(|c| c.mutating)),
            opt(whole.as_ref().map(|c| c.write_bytes)),
            opt(s.share_logout.as_ref().map(|c| c.mutating)),
            if s.complete { "yes" } else { "no" }
        );
    }
    h.push_str("</table>");
    h
}
