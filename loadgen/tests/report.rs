//! `loadgen report` draws every run it is given: latencies at every client count, phases
//! without data in files a second, each phase against the client count, the storms'
//! logouts; it keeps the storms' metered runs out of the times, and leaves no chart of an
//! earlier report behind.

mod common;

use std::path::{Path, PathBuf};

use common::{loadgen, text};

/// A compilebench run of `clients` clients named `label`, its JSON in `out`.
fn run(dir: &Path, out: &Path, label: &str, clients: &str) -> PathBuf {
    let json = out.join(format!("{label}-{clients}.json"));
    let o = loadgen(&[
        "compilebench",
        dir.to_str().expect("utf8"),
        "--scale",
        "0.01",
        "--phases",
        "create,delete-tree",
        "--clients",
        clients,
        "--label",
        label,
        "--json",
        json.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    json
}

fn report(files: &[PathBuf], out: &Path) {
    let mut args = vec!["report".to_string()];
    args.extend(files.iter().map(|f| f.display().to_string()));
    args.extend(["-o".to_string(), out.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = loadgen(&args);
    assert!(o.status.success(), "{}", text(&o));
}

fn svg(dir: &Path, stem: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{stem}.svg"))).unwrap_or_default()
}

#[test]
fn every_run_is_drawn_at_its_own_client_count_and_old_charts_go() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = tempfile::tempdir().expect("out");
    let files = vec![
        run(dir.path(), out.path(), "alpha", "1"),
        run(dir.path(), out.path(), "alpha", "2"),
        // beta ran at one client only: drawn there, not dropped.
        run(dir.path(), out.path(), "beta", "1"),
    ];
    let charts = out.path().join("charts");
    std::fs::create_dir(&charts).expect("mkdir");
    // What an earlier report drew (its page shows it), and files of the user's, one named
    // as a chart could be.
    std::fs::write(charts.join("throughput-9-clients.svg"), "<svg/>").expect("w");
    std::fs::write(charts.join("throughput-9-clients.png"), "png").expect("w");
    std::fs::write(
        charts.join("index.html"),
        "<html><head><title>loadgen report</title></head><body>\
         <p><img src=\"throughput-9-clients.svg\" alt=\"x\"></p></body></html>",
    )
    .expect("w");
    std::fs::write(charts.join("notes.txt"), "mine").expect("w");
    std::fs::write(charts.join("class-photo.png"), "mine").expect("w");
    report(&files, &charts);
    let one = svg(&charts, "latency-create-1-clients");
    assert!(one.contains("alpha") && one.contains("beta"), "{one}");
    let two = svg(&charts, "latency-create-2-clients");
    assert!(two.contains("alpha") && !two.contains("beta"), "{two}");
    let scaling = svg(&charts, "scaling-create");
    assert!(
        scaling.contains("1 clients") && scaling.contains("2 clients"),
        "the sweep's chart: {scaling}"
    );
    assert!(
        !charts.join("throughput-9-clients.svg").exists(),
        "the old chart removed"
    );
    assert!(
        !charts.join("throughput-9-clients.png").exists(),
        "its PNG too"
    );
    assert!(charts.join("notes.txt").exists(), "the user's file kept");
    assert!(
        charts.join("class-photo.png").exists(),
        "a file no report drew is kept, whatever its name"
    );
}

#[test]
fn a_phase_without_data_is_drawn_in_files_a_second() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = tempfile::tempdir().expect("out");
    let json = out.path().join("access.json");
    let o = loadgen(&[
        "access",
        dir.path().to_str().expect("utf8"),
        "--files",
        "200",
        "--json",
        json.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let charts = out.path().join("charts");
    report(&[json], &charts);
    assert!(
        !charts.join("throughput-1-clients.svg").exists(),
        "no MB/s chart of zeros"
    );
    let files = svg(&charts, "files-1-clients");
    assert!(
        files.contains("files/s") && files.contains("create"),
        "{files}"
    );
}

#[test]
fn a_storm_report_draws_the_logout_and_keeps_metered_runs_out_of_the_times() {
    let storm = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../doc/results/2026-11-29-login-storm/ssd/storm.json");
    let out = tempfile::tempdir().expect("out");
    report(&[storm], out.path());
    for stem in [
        "logout-percentiles",
        "login-plus-logout",
        "login-percentiles",
    ] {
        assert!(svg(out.path(), stem).contains("with ccfs"), "{stem}");
    }
    let html = std::fs::read_to_string(out.path().join("index.html")).expect("html");
    let timed = html
        .split("<h2>Login storms: timed runs</h2>")
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .expect("the timed runs' table");
    assert!(timed.contains("with ccfs #1"), "{timed}");
    assert!(
        !timed.contains("metered"),
        "no metered run among the times: {timed}"
    );
    assert!(
        html.contains("what reached the share (metered runs)"),
        "{html}"
    );
}
