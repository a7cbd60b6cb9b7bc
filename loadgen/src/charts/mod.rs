//! `loadgen report`: charts (SVG and PNG) and an HTML page from result files.
//!
//! - throughput per phase, one bar per system, for each client count (the blog's figures;
//!   files a second for phases that move no data, seconds for delete and stat);
//! - latency percentiles (p50 .. p99.9) of each phase's main operation, per system, for
//!   each client count;
//! - with more than one client count, each phase against the count (a sweep's scaling),
//!   and the clients x phase table per system (the NERSC study's table);
//! - the login storms' charts and tables (`storm`).
//!
//! Charts an earlier report drew in the directory (those its page shows) and this one does
//! not draw are removed; no other file is touched.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::report::{self, LatencyReport, RunReport, SummaryRow};
use crate::storm::StormReport;

mod storm;

pub use storm::storm_charts;
use storm::storm_table_html;

/// Where a TrueType font is looked for (Debian's fonts-dejavu-core), unless given.
pub const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error("cannot read font {path}: {source}; install fonts-dejavu-core or pass --font")]
    Font {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} is not a TrueType font")]
    BadFont(PathBuf),
    #[error("drawing {file}: {message}")]
    Draw { file: String, message: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("-o: {0}")]
    Unsafe(String),
}

/// Registers the font every chart uses (once per process).
pub fn load_font(path: &Path) -> Result<(), ChartError> {
    let bytes = std::fs::read(path).map_err(|source| ChartError::Font {
        path: path.to_path_buf(),
        source,
    })?;
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| ChartError::BadFont(path.to_path_buf()))
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// One bar chart: groups along x, one bar per series in each group.
#[derive(Debug, Clone)]
pub struct Bars {
    pub title: String,
    pub y_label: String,
    pub groups: Vec<String>,
    /// (series name, one value per group; None: no bar)
    pub series: Vec<(String, Vec<Option<f64>>)>,
    pub log_y: bool,
}

macro_rules! draw_legend {
    ($chart:expr) => {
        $chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(|e| e.to_string())?
    };
}

fn draw_bars<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    b: &Bars,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let max = b
        .series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().copied())
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let min_pos = b
        .series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().copied())
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let n_groups = b.groups.len().max(1);
    let n_series = b.series.len().max(1);
    let x_range = 0f64..n_groups as f64;
    let bar_w = 0.8 / n_series as f64;
    let groups = b.groups.clone();
    let label_of = move |x: &f64| {
        let i = x.floor() as usize;
        if (x - x.floor() - 0.5).abs() < 1e-6 {
            groups.get(i).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    // One body for both y scales (their coordinate types differ): the bars start at `floor`.
    macro_rules! plot {
        ($y_range:expr, $floor:expr) => {{
            let floor: f64 = $floor;
            let mut chart = ChartBuilder::on(&root)
                .caption(&b.title, ("sans-serif", 22))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(x_range, $y_range)
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(n_groups * 2 + 1)
                .x_label_formatter(&label_of)
                .y_desc(&b.y_label)
                .label_style(("sans-serif", 13))
                .draw()
                .map_err(|e| e.to_string())?;
            for (si, (name, vals)) in b.series.iter().enumerate() {
                let color = PALETTE[si % PALETTE.len()];
                chart
                    .draw_series(vals.iter().enumerate().filter_map(|(gi, v)| {
                        v.map(|v| {
                            let x0 = gi as f64 + 0.1 + si as f64 * bar_w;
                            Rectangle::new(
                                [(x0, floor), (x0 + bar_w * 0.95, v.max(floor))],
                                color.filled(),
                            )
                        })
                    }))
                    .map_err(|e| e.to_string())?
                    .label(name.clone())
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                    });
            }
            draw_legend!(chart);
        }};
    }
    if b.log_y {
        let lo = if min_pos.is_finite() {
            min_pos / 2.0
        } else {
            0.1
        };
        plot!((lo..max * 40.0).log_scale(), lo);
    } else {
        plot!(0f64..max * 1.4, 0.0);
    }
    root.present().map_err(|e| e.to_string())
}

/// The chart as SVG text (pure).
pub fn bars_svg(b: &Bars, size: (u32, u32)) -> Result<String, ChartError> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        draw_bars(root, b).map_err(|message| ChartError::Draw {
            file: format!("{}.svg", b.title),
            message,
        })?;
    }
    Ok(out)
}

/// The chart as a PNG file.
pub fn bars_png(b: &Bars, size: (u32, u32), path: &Path) -> Result<(), ChartError> {
    let root = BitMapBackend::new(path, size).into_drawing_area();
    draw_bars(root, b).map_err(|message| ChartError::Draw {
        file: path.display().to_string(),
        message,
    })
}

/// One phase of a run for the charts: its summary row, with the latencies of its first
/// run when the file (version 1) kept no merged ones.
fn phase_of(r: &RunReport, name: &str) -> Option<(SummaryRow, BTreeMap<String, LatencyReport>)> {
    let row = report::summary_of(r).into_iter().find(|s| s.name == name)?;
    let lat = if row.latency.is_empty() {
        r.phases
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.latency.clone())
            .unwrap_or_default()
    } else {
        row.latency.clone()
    };
    Some((row, lat))
}

/// How a phase is charted: wall MB/s when it moves bytes, files a second when it makes
/// or removes files without data (as `access` does), seconds for delete and stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Metric {
    MbPerS,
    FilesPerS,
    Seconds,
}

impl Metric {
    fn value(self, row: &SummaryRow) -> f64 {
        match self {
            Metric::MbPerS => row.avg_mb_s.unwrap_or(0.0),
            Metric::FilesPerS => row.avg_files_per_s,
            Metric::Seconds => row.avg_seconds,
        }
    }

    /// The stem's word, the title's, the axis's.
    fn words(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Metric::MbPerS => ("throughput", "Throughput per phase", "wall MB/s"),
            Metric::FilesPerS => ("files", "Files per second per phase", "files/s"),
            Metric::Seconds => ("seconds", "Delete and stat (lower is better)", "seconds"),
        }
    }
}

/// The phases of the runs, in the order first seen, each with how it is charted.
fn phases_of(runs: &[RunReport]) -> Vec<(String, Metric)> {
    let mut phases: Vec<(String, Metric)> = Vec::new();
    for r in runs {
        for s in report::summary_of(r) {
            let m = match s.avg_mb_s {
                None => Metric::Seconds,
                Some(v) if v > 0.0 => Metric::MbPerS,
                Some(_) => Metric::FilesPerS,
            };
            match phases.iter_mut().find(|(n, _)| *n == s.name) {
                // A phase that moved bytes in any run is charted in MB/s.
                Some((_, seen)) if m == Metric::MbPerS => *seen = m,
                Some(_) => {}
                None => phases.push((s.name.clone(), m)),
            }
        }
    }
    phases
}

/// The charts a set of runs gives, with file stems: for each client count the phases'
/// values and each phase's latencies; with more than one count, each phase against the
/// client count.
pub fn charts(runs: &[RunReport]) -> Vec<(String, Bars)> {
    let mut out = Vec::new();
    let names: Vec<String> = {
        let mut seen = Vec::new();
        for r in runs {
            if !seen.contains(&r.name()) {
                seen.push(r.name());
            }
        }
        seen
    };
    let clients: BTreeSet<usize> = runs.iter().map(|r| r.config.clients).collect();
    let phases = phases_of(runs);
    for &c in &clients {
        for metric in [Metric::MbPerS, Metric::FilesPerS, Metric::Seconds] {
            let groups: Vec<String> = phases
                .iter()
                .filter(|(_, m)| *m == metric)
                .map(|(n, _)| n.clone())
                .collect();
            if groups.is_empty() {
                continue;
            }
            out.push(phase_bars(runs, &names, c, metric, groups));
        }
        for (ph, _) in &phases {
            out.extend(latency_bars(runs, &names, c, ph));
        }
    }
    if clients.len() > 1 {
        for (ph, metric) in &phases {
            out.push(scaling_bars(runs, &names, &clients, ph, *metric));
        }
    }
    out
}

/// The last run named `name` with `c` clients.
fn latest<'a>(runs: &'a [RunReport], name: &str, c: usize) -> Option<&'a RunReport> {
    runs.iter()
        .rev()
        .find(|r| r.name() == name && r.config.clients == c)
}

/// Whether values this far apart need a log scale to keep the small ones visible
/// (local and network filesystems differ by orders of magnitude).
fn needs_log(series: &[(String, Vec<Option<f64>>)]) -> bool {
    let values: Vec<f64> = series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().copied())
        .filter(|v| *v > 0.0)
        .collect();
    let spread = values.iter().copied().fold(0.0f64, f64::max)
        / values.iter().copied().fold(f64::INFINITY, f64::min);
    spread.is_finite() && spread > 100.0
}

/// The chart of the phases `groups` with `c` clients, a bar a run name, in `metric`.
fn phase_bars(
    runs: &[RunReport],
    names: &[String],
    c: usize,
    metric: Metric,
    groups: Vec<String>,
) -> (String, Bars) {
    let series: Vec<(String, Vec<Option<f64>>)> = names
        .iter()
        .filter_map(|n| {
            let r = latest(runs, n, c)?;
            Some((
                n.clone(),
                groups
                    .iter()
                    .map(|ph| phase_of(r, ph).map(|(s, _)| metric.value(&s)))
                    .collect(),
            ))
        })
        .collect();
    let log_y = needs_log(&series);
    let plural = if c == 1 { "" } else { "s" };
    let (word, title, y) = metric.words();
    (
        format!("{word}-{c}-clients"),
        Bars {
            title: format!("{title}, {c} client{plural}"),
            y_label: if log_y {
                format!("{y} (log)")
            } else {
                y.into()
            },
            groups,
            series,
            log_y,
        },
    )
}

/// The chart of phase `ph` against the client count, a bar a run name (a sweep's
/// scaling: where adding clients stops adding throughput).
fn scaling_bars(
    runs: &[RunReport],
    names: &[String],
    clients: &BTreeSet<usize>,
    ph: &str,
    metric: Metric,
) -> (String, Bars) {
    let series: Vec<(String, Vec<Option<f64>>)> = names
        .iter()
        .map(|n| {
            let at = |c: usize| {
                let r = latest(runs, n, c)?;
                phase_of(r, ph).map(|(s, _)| metric.value(&s))
            };
            (n.clone(), clients.iter().map(|&c| at(c)).collect())
        })
        .collect();
    let log_y = needs_log(&series);
    let y = metric.words().2;
    (
        format!("scaling-{ph}"),
        Bars {
            title: format!("{ph} against the number of clients"),
            y_label: if log_y {
                format!("{y} (log)")
            } else {
                y.into()
            },
            groups: clients.iter().map(|c| format!("{c} clients")).collect(),
            series,
            log_y,
        },
    )
}

/// The chart of phase `ph`'s main operation's latency percentiles with `top` clients, a
/// bar a run name that has a run at that count; none when no run has it.
fn latency_bars(
    runs: &[RunReport],
    names: &[String],
    top: usize,
    ph: &str,
) -> Option<(String, Bars)> {
    let mut series = Vec::new();
    let mut op_name = String::new();
    for n in names {
        let Some(r) = latest(runs, n, top) else {
            continue;
        };
        let Some((_, lat)) = phase_of(r, ph) else {
            continue;
        };
        let Some(op) = report::main_op(ph, &lat) else {
            continue;
        };
        op_name = op.to_string();
        let l = &lat[op];
        series.push((
            n.clone(),
            vec![
                Some(l.p50_us),
                Some(l.p90_us),
                Some(l.p99_us),
                Some(l.p999_us),
            ],
        ));
    }
    if series.is_empty() {
        return None;
    }
    Some((
        format!("latency-{ph}-{top}-clients"),
        Bars {
            title: format!(
                "{ph}: {op_name} latency, {top} client{}",
                if top == 1 { "" } else { "s" }
            ),
            y_label: "microseconds (log)".into(),
            groups: vec!["p50".into(), "p90".into(), "p99".into(), "p99.9".into()],
            series,
            log_y: true,
        },
    ))
}

/// The HTML page: where the numbers come from, the tables, the charts.
pub fn html(runs: &[RunReport], storms: &[StormReport], images: &[String]) -> String {
    let mut h = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>loadgen report</title>\
         <style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:1em 0}\
         td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}\
         td:first-child,th:first-child{text-align:left}img{max-width:100%;border:1px solid #eee;margin:1em 0}</style>\
         </head><body><h1>loadgen report</h1>",
    );
    if let Some(r) = runs.first() {
        let e = &r.environment;
        let _ = write!(
            h,
            "<p>Machine: {} CPUs, kernel {}, host {}; loadgen {}.</p>",
            e.cpus,
            esc(&e.kernel),
            esc(&e.hostname),
            esc(&r.version)
        );
    }
    if !storms.is_empty() {
        h.push_str(&storm_table_html(storms));
    }
    if runs.is_empty() {
        h.push_str("<h2>Charts</h2>");
        for img in images {
            let _ = write!(h, "<p><img src=\"{0}.svg\" alt=\"{0}\"></p>", esc(img));
        }
        h.push_str("</body></html>\n");
        return h;
    }
    h.push_str("<h2>Runs</h2><table><tr><th>system</th><th>filesystem</th><th>mount source</th><th>clients</th><th>scale</th><th>complete</th></tr>");
    for r in runs {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.name()),
            esc(&r.environment.fs_type),
            esc(&r.environment.mount_source),
            r.config.clients,
            r.config.scale,
            if r.complete { "yes" } else { "no" }
        );
    }
    h.push_str(
        "</table><h2>Clients x phase</h2><p>Each phase's average over its runs: wall MB/s \
         (all clients' bytes over the time until the last one finished), seconds for delete \
         and stat.</p>",
    );
    let mut names: Vec<String> = Vec::new();
    for r in runs {
        if !names.contains(&r.name()) {
            names.push(r.name());
        }
    }
    for n in &names {
        let mine: Vec<&RunReport> = runs.iter().filter(|r| &r.name() == n).collect();
        let mut phases: Vec<String> = Vec::new();
        for r in &mine {
            for s in report::summary_of(r) {
                if !phases.contains(&s.name) {
                    phases.push(s.name);
                }
            }
        }
        let _ = write!(h, "<h3>{}</h3><table><tr><th>clients</th>", esc(n));
        for p in &phases {
            let _ = write!(h, "<th>{}</th>", esc(p));
        }
        h.push_str("</tr>");
        let mut sorted = mine.clone();
        sorted.sort_by_key(|r| r.config.clients);
        for r in sorted {
            let _ = write!(h, "<tr><td>{}</td>", r.config.clients);
            for p in &phases {
                match report::summary_of(r).into_iter().find(|x| x.name == *p) {
                    Some(x) => {
                        let _ = match x.avg_mb_s {
                            Some(v) => write!(h, "<td>{v:.1} MB/s</td>"),
                            None => write!(h, "<td>{:.2} s</td>", x.avg_seconds),
                        };
                    }
                    None => h.push_str("<td>-</td>"),
                }
            }
            h.push_str("</tr>");
        }
        h.push_str("</table>");
    }
    h.push_str("<h2>Charts</h2>");
    for img in images {
        let _ = write!(h, "<p><img src=\"{0}.svg\" alt=\"{0}\"></p>", esc(img));
    }
    h.push_str("</body></html>\n");
    h
}

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The charts an earlier report drew in `dir`: the images its page (`index.html`, with
/// loadgen's title) shows.
fn charts_of_earlier_report(dir: &Path) -> Vec<String> {
    let Ok(page) = std::fs::read_to_string(dir.join("index.html")) else {
        return Vec::new();
    };
    if !page.contains("<title>loadgen report</title>") {
        return Vec::new();
    }
    page.split("<img src=\"")
        .skip(1)
        .filter_map(|rest| rest.split(".svg\"").next())
        .filter(|stem| !stem.contains(['/', '"', '<']) && !stem.is_empty())
        .map(str::to_string)
        .collect()
}

/// Removes the charts an earlier report drew in `dir` (those its page shows) that `now`
/// does not draw again, so that the page and the directory show the same runs; no other
/// file is touched.
fn remove_old_charts(dir: &Path, now: &[(String, Bars)]) {
    for stem in charts_of_earlier_report(dir) {
        if now.iter().any(|(s, _)| *s == stem) {
            continue;
        }
        for ext in ["svg", "png"] {
            let _ = std::fs::remove_file(dir.join(format!("{stem}.{ext}")));
        }
    }
}

/// Writes every chart as SVG and PNG, and index.html, into `dir`; returns the files written.
pub fn write_report(
    runs: &[RunReport],
    storms: &[StormReport],
    dir: &Path,
    font: &Path,
) -> Result<Vec<PathBuf>, ChartError> {
    load_font(font)?;
    // Where it is to be made, before anything is: then the directory itself.
    if let Some(why) = dir
        .ancestors()
        .find(|p| p.exists())
        .and_then(crate::safety::unsafe_for_root)
    {
        return Err(ChartError::Unsafe(why));
    }
    std::fs::create_dir_all(dir).map_err(|source| ChartError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    if let Some(why) = crate::safety::unsafe_for_root(dir) {
        return Err(ChartError::Unsafe(why));
    }
    let dir = &crate::safety::resolved(dir).map_err(|source| ChartError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Vec::new();
    let mut stems = Vec::new();
    let all: Vec<(String, Bars)> = charts(runs)
        .into_iter()
        .chain(storm_charts(storms))
        .collect();
    remove_old_charts(dir, &all);
    for (stem, bars) in all {
        let size = (1000, 560);
        let svg = bars_svg(&bars, size)?;
        let svg_path = dir.join(format!("{stem}.svg"));
        crate::safety::write_atomic(&svg_path, svg.as_bytes()).map_err(|source| {
            ChartError::Write {
                path: svg_path.clone(),
                source,
            }
        })?;
        let png_path = dir.join(format!("{stem}.png"));
        // The PNG encoder opens its file by name: a link left at the name is removed
        // first (the directory is one only this user can change).
        if std::fs::symlink_metadata(&png_path).is_ok_and(|m| m.file_type().is_symlink()) {
            let _ = std::fs::remove_file(&png_path);
        }
        bars_png(&bars, size, &png_path)?;
        written.push(svg_path);
        written.push(png_path);
        stems.push(stem);
    }
    let index = dir.join("index.html");
    crate::safety::write_atomic(&index, html(runs, storms, &stems).as_bytes()).map_err(
        |source| ChartError::Write {
            path: index.clone(),
            source,
        },
    )?;
    written.push(index);
    Ok(written)
}
