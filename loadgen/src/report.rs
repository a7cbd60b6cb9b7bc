//! Results as data (serializable, with a versioned schema in `schema/`) and the pure
//! exporters: a readable table, JSON and CSV.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::engine::{Latencies, PhaseResult, OPS};
use crate::workload::{Unit, ALL_PHASES, STREAM_PHASES};

/// The schema name of [`RunReport`]; `schema/result-v2.schema.json` describes it.
/// `loadgen report` reads version 1 files too.
pub const SCHEMA: &str = "loadgen-result/2";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Environment {
    pub fs_type: String,
    pub fs_magic: String,
    pub mount_point: String,
    pub mount_source: String,
    pub mount_options: String,
    pub kernel: String,
    pub cpus: usize,
    pub hostname: String,
}

impl Environment {
    /// What the target is and what it runs on.
    /// The environment of a run on `target`.
    pub fn probe(target: &crate::store::Target) -> Self {
        match target {
            crate::store::Target::Local(p) => Self::probe_dir(p),
            crate::store::Target::Nfs(url) => Self {
                fs_type: "nfs3".into(),
                // NFS_SUPER_MAGIC, what statfs reports on a kernel NFS mount.
                fs_magic: "0x6969".into(),
                mount_point: String::new(),
                mount_source: url.to_url(),
                mount_options: "loadgen NFSv3 client: no data cache, close commits".into(),
                ..Self::probe_dir(std::path::Path::new("/"))
            },
        }
    }

    fn probe_dir(target: &std::path::Path) -> Self {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let canon = target
            .canonicalize()
            .unwrap_or_else(|_| target.to_path_buf());
        let mount = fsinfo::mount_of(&canon).ok().flatten();
        let magic = fsinfo::statfs(&canon).map(|s| s.fs_type).unwrap_or(0);
        Self {
            fs_type: mount
                .as_ref()
                .map(|m| m.fs_type.clone())
                .unwrap_or_else(|| fsinfo::fs_type_name(magic).to_string()),
            fs_magic: format!("{magic:#x}"),
            mount_point: mount
                .as_ref()
                .map(|m| m.mount_point.display().to_string())
                .unwrap_or_default(),
            mount_source: mount.as_ref().map(|m| m.source.clone()).unwrap_or_default(),
            mount_options: mount.map(|m| m.options).unwrap_or_default(),
            kernel: read("/proc/sys/kernel/osrelease"),
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            hostname: read("/proc/sys/kernel/hostname"),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunConfig {
    pub clients: usize,
    /// `random` (compilebench's random mode) or `phases` (a given sequence).
    #[serde(default)]
    pub mode: String,
    /// The phases asked for (phases mode), or each round's phase in order (random mode).
    pub phases: Vec<String>,
    /// Random mode: trees created first, and operations run after them.
    #[serde(default)]
    pub initial_dirs: usize,
    #[serde(default)]
    pub runs: usize,
    pub scale: f64,
    pub write_size: usize,
    pub fsync: bool,
    /// Whether each timed operation ended with a sync (as run, not as asked).
    pub sync: bool,
    /// Whether caches were dropped before each round (as run: false when not root).
    pub drop_caches: bool,
    /// Whether each client read another client's tree (as run).
    pub read_other: bool,
    /// Whose tree a client read with read_other.
    #[serde(default)]
    pub read_other_means: String,
    /// Whether the trees were written in the target's readdir order.
    #[serde(default)]
    pub native_order: bool,
    /// Worker threads (at most this many calls in flight).
    #[serde(default)]
    pub threads: usize,
    /// Files opened with O_DIRECT (stream).
    #[serde(default)]
    pub direct: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LatencyReport {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClientReport {
    pub client: usize,
    /// This client's bytes over its own time; null for delete and stat.
    pub mb_s: Option<f64>,
    pub files: u64,
    #[serde(default)]
    pub dirs: u64,
    pub bytes: u64,
    pub start_s: f64,
    pub end_s: f64,
    pub error: Option<String>,
}

/// One round: one timed operation on every client.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PhaseReport {
    pub name: String,
    /// The tree (kernel-N) it worked on.
    #[serde(default)]
    pub tree: Option<u32>,
    /// How compilebench reports the phase: `MB/s` or `seconds`.
    #[serde(default)]
    pub unit: String,
    /// Sum of the clients' MB/s (compilebench's blog convention); null for delete and
    /// stat, which move no data.
    pub aggregate_mb_s: Option<f64>,
    /// All clients' bytes over the time until the last one finished: what the system
    /// delivered (the sum above overstates when clients do not overlap).
    #[serde(default)]
    pub wall_mb_s: Option<f64>,
    /// From the release of the clients to the end of the last one.
    #[serde(default)]
    pub seconds: f64,
    /// Regular files written, read, stated or removed.
    pub files: u64,
    /// Directories made, listed, stated or removed.
    #[serde(default)]
    pub dirs: u64,
    pub bytes: u64,
    /// Files per second over the slowest client's time.
    pub files_per_s: f64,
    pub first_done_s: f64,
    pub last_done_s: f64,
    pub start_skew_s: f64,
    /// True when a client stopped before the end (an error, an interrupt): the figures
    /// cover only what was done.
    #[serde(default)]
    pub partial: bool,
    pub clients: Vec<ClientReport>,
    /// Per operation, in microseconds.
    pub latency: BTreeMap<String, LatencyReport>,
}

/// compilebench's report line for one phase: its average over the runs of that phase.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SummaryRow {
    pub name: String,
    pub runs: usize,
    pub unit: String,
    /// The mean of the runs' wall MB/s (MB/s phases).
    pub avg_mb_s: Option<f64>,
    /// The mean of the runs' summed client MB/s (MB/s phases).
    pub avg_aggregate_mb_s: Option<f64>,
    /// The mean of the runs' seconds.
    pub avg_seconds: f64,
    pub avg_files_per_s: f64,
    /// The largest start skew of its runs.
    pub max_start_skew_s: f64,
    /// Every call of every run of the phase, in microseconds (empty when read from a
    /// version 1 file).
    #[serde(default)]
    pub latency: BTreeMap<String, LatencyReport>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunReport {
    pub schema: String,
    pub tool: String,
    pub version: String,
    pub command: String,
    pub args: Vec<String>,
    pub seed: u64,
    pub started_at_unix: u64,
    pub target: String,
    /// A name for the system under test (`--label`); reports fall back to the fs type.
    #[serde(default)]
    pub label: Option<String>,
    pub environment: Environment,
    pub config: RunConfig,
    pub phases: Vec<PhaseReport>,
    /// Per phase, in compilebench's order.
    #[serde(default)]
    pub summary: Vec<SummaryRow>,
    /// False while running and when the run stopped early.
    pub complete: bool,
    pub error: Option<String>,
    pub warnings: Vec<String>,
    /// The hosts of a multi-host run whose agents could not drop their caches as asked
    /// (`config.drop_caches` is then false: what happened, not what was asked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caches_not_dropped_on: Vec<String>,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

pub fn latency_report(l: &Latencies) -> BTreeMap<String, LatencyReport> {
    let mut out = BTreeMap::new();
    for op in OPS {
        let Some(h) = l.get(op) else {
            continue;
        };
        out.insert(
            op.name().to_string(),
            LatencyReport {
                count: h.len(),
                mean_us: h.mean() / 1000.0,
                p50_us: us(h.value_at_quantile(0.50)),
                p90_us: us(h.value_at_quantile(0.90)),
                p99_us: us(h.value_at_quantile(0.99)),
                p999_us: us(h.value_at_quantile(0.999)),
                max_us: us(h.max()),
            },
        );
    }
    out
}

fn unit_name(u: Unit) -> &'static str {
    match u {
        Unit::MbPerS => "MB/s",
        Unit::Seconds => "seconds",
    }
}

pub fn phase_report(p: &PhaseResult) -> PhaseReport {
    let files: u64 = p.clients.iter().map(|c| c.files).sum();
    let bytes: u64 = p.clients.iter().map(|c| c.bytes).sum();
    let last = p.last_done().as_secs_f64();
    let rated = p.phase.unit() == Unit::MbPerS;
    PhaseReport {
        name: p.phase.name().to_string(),
        tree: Some(p.tree),
        unit: unit_name(p.phase.unit()).to_string(),
        aggregate_mb_s: rated.then(|| p.aggregate_mb_per_s()),
        wall_mb_s: rated.then(|| {
            if last > 0.0 {
                bytes as f64 / 1048576.0 / last
            } else {
                0.0
            }
        }),
        seconds: last,
        files,
        dirs: p.clients.iter().map(|c| c.dirs).sum(),
        bytes,
        files_per_s: if last > 0.0 { files as f64 / last } else { 0.0 },
        first_done_s: p.first_done().as_secs_f64(),
        last_done_s: last,
        start_skew_s: p.start_skew().as_secs_f64(),
        partial: p.error().is_some(),
        clients: p
            .clients
            .iter()
            .map(|c| ClientReport {
                client: c.client,
                mb_s: rated.then(|| c.mb_per_s()),
                files: c.files,
                dirs: c.dirs,
                bytes: c.bytes,
                start_s: c.start.as_secs_f64(),
                end_s: c.end.as_secs_f64(),
                error: c.error.clone(),
            })
            .collect(),
        latency: latency_report(&p.latencies),
    }
}

/// Each phase's histograms over all its rounds, kept while a run goes on.
#[derive(Debug, Default)]
pub struct PhaseLatencies(pub BTreeMap<String, Latencies>);

impl PhaseLatencies {
    pub fn add(&mut self, p: &PhaseResult) {
        self.0
            .entry(p.phase.name().to_string())
            .or_default()
            .merge(&p.latencies);
    }
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (n, sum) = v.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

/// compilebench's summary: per phase (in its order), the mean over the complete runs of
/// that phase (a partial run is left out); `latencies` gives the merged histograms.
pub fn summarize(phases: &[PhaseReport], latencies: Option<&PhaseLatencies>) -> Vec<SummaryRow> {
    let mut out = Vec::new();
    for ph in ALL_PHASES.into_iter().chain(STREAM_PHASES) {
        let runs: Vec<&PhaseReport> = phases
            .iter()
            .filter(|p| p.name == ph.name() && !p.partial)
            .collect();
        if runs.is_empty() {
            continue;
        }
        let rated = ph.unit() == Unit::MbPerS;
        out.push(SummaryRow {
            name: ph.name().to_string(),
            runs: runs.len(),
            unit: unit_name(ph.unit()).to_string(),
            avg_mb_s: rated.then(|| mean(runs.iter().map(|p| p.wall_mb_s.unwrap_or(0.0)))),
            avg_aggregate_mb_s: rated
                .then(|| mean(runs.iter().map(|p| p.aggregate_mb_s.unwrap_or(0.0)))),
            avg_seconds: mean(runs.iter().map(|p| p.last_done_s)),
            avg_files_per_s: mean(runs.iter().map(|p| p.files_per_s)),
            max_start_skew_s: runs.iter().map(|p| p.start_skew_s).fold(0.0, f64::max),
            latency: latencies
                .and_then(|l| l.0.get(ph.name()))
                .map(latency_report)
                .unwrap_or_default(),
        });
    }
    out
}

/// The summary of a run read from a file: the stored one, or (version 1) derived.
pub fn summary_of(r: &RunReport) -> Vec<SummaryRow> {
    if r.summary.is_empty() {
        summarize(&r.phases, None)
    } else {
        r.summary.clone()
    }
}

pub fn to_json(r: &RunReport) -> Vec<u8> {
    let mut v = serde_json::to_vec_pretty(r).unwrap_or_default();
    v.push(b'\n');
    v
}

fn opt(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.3}")).unwrap_or_default()
}

/// One row per round and client, plus an `all` row per round.
pub fn to_csv(r: &RunReport) -> Vec<u8> {
    let mut out = String::from(
        "round,phase,tree,client,wall_mb_s,mb_s,seconds,files,dirs,bytes,start_s,end_s,files_per_s,p50_us,p99_us,partial,error\n",
    );
    for (i, p) in r.phases.iter().enumerate() {
        let main = main_op(&p.name, &p.latency);
        let (p50, p99) = main
            .and_then(|op| p.latency.get(op))
            .map(|l| (format!("{:.1}", l.p50_us), format!("{:.1}", l.p99_us)))
            .unwrap_or_default();
        let tree = p.tree.map(|t| t.to_string()).unwrap_or_default();
        out.push_str(&format!(
            "{i},{},{tree},all,{},{},{:.6},{},{},{},0,{:.6},{:.1},{p50},{p99},{},\n",
            p.name,
            opt(p.wall_mb_s),
            opt(p.aggregate_mb_s),
            p.seconds,
            p.files,
            p.dirs,
            p.bytes,
            p.last_done_s,
            p.files_per_s,
            p.partial
        ));
        for c in &p.clients {
            out.push_str(&format!(
                "{i},{},{tree},{},,{},{:.6},{},{},{},{:.6},{:.6},,,,{},{}\n",
                p.name,
                c.client,
                opt(c.mb_s),
                c.end_s - c.start_s,
                c.files,
                c.dirs,
                c.bytes,
                c.start_s,
                c.end_s,
                c.error.is_some(),
                c.error.as_deref().unwrap_or("").replace([',', '\n'], ";")
            ));
        }
    }
    out.into_bytes()
}

/// The operation that dominates a phase, for the summary columns.
pub fn main_op<'a, V>(name: &str, latency: &'a BTreeMap<String, V>) -> Option<&'a str> {
    let op = if name.contains("read") {
        "read"
    } else if name.contains("stat") {
        "stat"
    } else if name.contains("delete") || name == "clean" {
        "unlink"
    } else {
        "write"
    };
    [op, "open", "unlink", "stat"]
        .into_iter()
        .find_map(|o| latency.get_key_value(o).map(|(k, _)| k.as_str()))
}

fn describe_config(r: &RunReport) -> String {
    let c = &r.config;
    let mut parts = vec![format!(
        "{} client{}",
        c.clients,
        if c.clients == 1 { "" } else { "s" }
    )];
    match c.mode.as_str() {
        "random" => parts.push(format!(
            "random mode: {} initial trees, {} runs, seed {}",
            c.initial_dirs, c.runs, r.seed
        )),
        "phases" => parts.push(format!("phases {}", c.phases.join(","))),
        "stream" => parts.push(format!(
            "one file a client, {} MiB in {} KiB calls{}",
            r.phases
                .first()
                .and_then(|p| p.clients.first())
                .map(|c| c.bytes / (1 << 20))
                .unwrap_or(0),
            c.write_size / 1024,
            if c.fsync { ", fsync" } else { "" }
        )),
        _ => {}
    }
    if c.scale < 1.0 {
        parts.push(format!("scale {}", c.scale));
    }
    parts.push(
        match (c.sync, c.drop_caches) {
            (true, true) => "sync and cache drop per operation",
            (true, false) => "sync per operation, caches kept",
            (false, true) => "no sync, caches dropped",
            (false, false) => "no sync, caches kept",
        }
        .to_string(),
    );
    if c.read_other {
        parts.push(format!("reads {}", c.read_other_means));
    }
    parts.join("; ")
}

/// The readable summary: compilebench's per-phase averages, then the latency percentiles.
pub fn table(r: &RunReport) -> String {
    let mut out = format!(
        "loadgen {} on {} ({}; {})\n\n",
        r.command,
        r.target,
        r.environment.fs_type,
        describe_config(r)
    );
    let summary = summary_of(r);
    out.push_str(&format!(
        "{:<16} {:>5} {:>10} {:>10} {:>9} {:>10} {:>9}\n",
        "phase", "runs", "MB/s", "sum MB/s", "seconds", "files/s", "skew ms"
    ));
    let dash = |v: Option<f64>| v.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into());
    for s in &summary {
        out.push_str(&format!(
            "{:<16} {:>5} {:>10} {:>10} {:>9.2} {:>10.0} {:>9.1}\n",
            s.name,
            s.runs,
            dash(s.avg_mb_s),
            dash(s.avg_aggregate_mb_s),
            s.avg_seconds,
            s.avg_files_per_s,
            s.max_start_skew_s * 1000.0
        ));
    }
    let partial = r.phases.iter().filter(|p| p.partial).count();
    if partial > 0 {
        out.push_str(&format!(
            "({partial} round{} stopped part way and {} left out of the averages)\n",
            if partial == 1 { "" } else { "s" },
            if partial == 1 { "is" } else { "are" }
        ));
    }
    out.push_str(
        "MB/s: all clients' bytes over the time until the last one finished (averaged over \
         the runs);\nsum MB/s: the sum of each client's own rate (compilebench's blog); \
         delete and stat are timed in seconds.\n",
    );
    if r.config.clients > 1
        && summary
            .iter()
            .any(|s| match (s.avg_mb_s, s.avg_aggregate_mb_s) {
                (Some(w), Some(a)) => a > 2.0 * w,
                _ => false,
            })
    {
        out.push_str(
            "note: the sum is more than twice the wall rate: the clients did not run at the \
             same time (see skew), so the sum overstates what the system delivered.\n",
        );
    }
    out.push_str(&format!(
        "\n{:<16} {:<9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>10}\n",
        "phase", "op", "count", "p50 us", "p90 us", "p99 us", "p99.9 us", "max us"
    ));
    for s in &summary {
        for (op, l) in &s.latency {
            out.push_str(&format!(
                "{:<16} {:<9} {:>10} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>10.1}\n",
                s.name, op, l.count, l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us
            ));
        }
    }
    if let Some(e) = &r.error {
        out.push_str(&format!("\nstopped early: {e}\n"));
    }
    for w in &r.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}

impl RunReport {
    /// The name this run goes by in reports.
    pub fn name(&self) -> String {
        self.label
            .clone()
            .unwrap_or_else(|| self.environment.fs_type.clone())
    }
}

/// The clients x phase table of a sweep, as the NERSC study shows it: each phase's wall
/// MB/s (seconds for delete and stat), then the same with the sum of the clients' rates.
pub fn sweep_table(runs: &[RunReport]) -> String {
    let mut names: Vec<String> = Vec::new();
    let summaries: Vec<Vec<SummaryRow>> = runs.iter().map(summary_of).collect();
    for s in summaries.iter().flatten() {
        if !names.contains(&s.name) {
            names.push(s.name.clone());
        }
    }
    let mut out = String::new();
    for (title, pick) in [
        (
            "wall MB/s (seconds for delete and stat)",
            (|s: &SummaryRow| s.avg_mb_s.unwrap_or(s.avg_seconds)) as fn(&SummaryRow) -> f64,
        ),
        ("sum of the clients' MB/s", |s: &SummaryRow| {
            s.avg_aggregate_mb_s.unwrap_or(s.avg_seconds)
        }),
    ] {
        out.push_str(&format!("{title}\n{:>8}", "clients"));
        for n in &names {
            out.push_str(&format!(" {n:>16}"));
        }
        out.push('\n');
        for (r, sum) in runs.iter().zip(&summaries) {
            out.push_str(&format!("{:>8}", r.config.clients));
            for n in &names {
                match sum.iter().find(|s| &s.name == n) {
                    Some(s) => out.push_str(&format!(" {:>16.2}", pick(s))),
                    None => out.push_str(&format!(" {:>16}", "-")),
                }
            }
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

/// Every run of a sweep as CSV: the runs' rows, each with its client count first.
pub fn sweep_csv(runs: &[RunReport]) -> Vec<u8> {
    let mut out = String::new();
    for (i, r) in runs.iter().enumerate() {
        let csv = String::from_utf8_lossy(&to_csv(r)).into_owned();
        for (n, line) in csv.lines().enumerate() {
            if n == 0 {
                if i == 0 {
                    out.push_str(&format!("clients,{line}\n"));
                }
            } else {
                out.push_str(&format!("{},{line}\n", r.config.clients));
            }
        }
    }
    out.into_bytes()
}
