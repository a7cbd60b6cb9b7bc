//! A class-size sweep (`--users 1,5,10,20,30,60`): each size's time to login (p50, p95)
//! and the server's CPU, without and with ccfs, and the knee of each column: the size past
//! which the login time grows faster than the class.

use super::{median_spread, sig3, StormReport};

/// What the timed runs of one size and mode give: the medians of their login p50 and p95,
/// and of the server's CPU when measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub users: usize,
    pub login_p50_s: f64,
    pub login_p95_s: f64,
    pub server_cpu_s: Option<f64>,
}

/// The points of mode `with_ccfs` (timed runs), by class size.
pub fn points(runs: &[StormReport], with_ccfs: bool) -> Vec<Point> {
    let mut sizes: Vec<usize> = runs.iter().map(|r| r.users).collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
        .into_iter()
        .filter_map(|users| {
            let mine: Vec<&StormReport> = runs
                .iter()
                .filter(|r| r.users == users && r.with_ccfs == with_ccfs && !r.metered)
                .collect();
            let med = |f: &dyn Fn(&StormReport) -> Option<f64>| {
                median_spread(&mine.iter().filter_map(|r| f(r)).collect::<Vec<_>>()).map(|m| m.0)
            };
            Some(Point {
                users,
                login_p50_s: med(&|r| Some(r.time_to_login.p50_s))?,
                login_p95_s: med(&|r| Some(r.time_to_login.p95_s))?,
                server_cpu_s: med(&|r| r.server_cpu_s),
            })
        })
        .collect()
}

/// How much faster than the class the login time must grow to make a knee: a shared
/// machine's run-to-run noise (a few percent) is no knee.
pub const KNEE_MARGIN: f64 = 1.1;

/// The knee: the first size past which the login time (p50) grows faster than the class
/// (from it to the next size, the time's ratio above the users' by more than
/// [`KNEE_MARGIN`]), with those two ratios.
pub fn knee(points: &[Point]) -> Option<(usize, usize, f64, f64)> {
    points.windows(2).find_map(|w| {
        let (a, b) = (w[0], w[1]);
        let users = b.users as f64 / a.users as f64;
        let time = b.login_p50_s / a.login_p50_s.max(1e-9);
        (time > users * KNEE_MARGIN).then_some((a.users, b.users, users, time))
    })
}

/// The knee of a column in words.
fn knee_line(mode: &str, points: &[Point]) -> String {
    match (knee(points), points.last()) {
        (Some((a, b, users, time)), _) => format!(
            "knee {mode}: past {a} users the login time grows faster than the class \
             ({a} -> {b} users: {:.1}x the users, {:.1}x the time to login p50)\n",
            users, time
        ),
        (None, Some(last)) => format!(
            "knee {mode}: none up to {} users (the login time grows no more than 10% faster than the class)\n",
            last.users
        ),
        (None, None) => String::new(),
    }
}

/// The sweep's table: a line a class size, both columns side by side, then each column's
/// knee; empty for runs of one size.
pub fn sweep_table(runs: &[StormReport]) -> String {
    let without = points(runs, false);
    let with = points(runs, true);
    let sizes = without.len().max(with.len());
    if sizes < 2 {
        return String::new();
    }
    let mut out = String::from(
        "\nclass-size sweep (medians of the timed runs)\n\
         users   login p50 (s)         login p95 (s)         server CPU (s)\n\
         \x20       without     with      without     with      without     with\n",
    );
    let mut all: Vec<usize> = without.iter().chain(&with).map(|p| p.users).collect();
    all.sort_unstable();
    all.dedup();
    let cell = |v: Option<f64>| v.map(sig3).unwrap_or_else(|| "-".into());
    for u in all {
        let a = without.iter().find(|p| p.users == u);
        let b = with.iter().find(|p| p.users == u);
        out.push_str(&format!(
            "{u:>5}  {:>9} {:>8}    {:>9} {:>8}    {:>9} {:>8}\n",
            cell(a.map(|p| p.login_p50_s)),
            cell(b.map(|p| p.login_p50_s)),
            cell(a.map(|p| p.login_p95_s)),
            cell(b.map(|p| p.login_p95_s)),
            cell(a.and_then(|p| p.server_cpu_s)),
            cell(b.and_then(|p| p.server_cpu_s)),
        ));
    }
    out.push_str(&knee_line("without ccfs", &without));
    out.push_str(&knee_line("with ccfs", &with));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(users: usize, t: f64) -> Point {
        Point {
            users,
            login_p50_s: t,
            login_p95_s: t,
            server_cpu_s: None,
        }
    }

    #[test]
    fn the_knee_is_where_the_time_grows_faster_than_the_class() {
        // 1 -> 5 users: 5x the users, 1.5x the time; 5 -> 10: 2x, 1.6x; 10 -> 20: 2x, 3x.
        let pts = [p(1, 2.0), p(5, 3.0), p(10, 4.8), p(20, 14.4)];
        let (a, b, users, time) = knee(&pts).expect("a knee");
        assert_eq!((a, b), (10, 20));
        assert!((users - 2.0).abs() < 1e-9 && (time - 3.0).abs() < 1e-9);
        // Growing as fast as the class is no knee, nor 10% faster (noise).
        assert_eq!(knee(&[p(10, 1.0), p(20, 2.0), p(40, 4.0)]), None);
        assert_eq!(knee(&[p(3, 1.0), p(6, 2.1), p(12, 4.6)]), None);
        assert_eq!(knee(&[p(3, 1.0), p(6, 2.3)]).map(|k| k.0), Some(3));
        assert!(knee_line("with ccfs", &[p(10, 1.0), p(20, 2.0)]).contains("none up to 20"));
    }
}
