//! Results as data (serializable, with a versioned schema in `schema/`) and the pure
//! exporters: a readable table, JSON and CSV.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::engine::{Latencies, PhaseResult, OPS};

/// The schema name of [`RunReport`]; `schema/result-v1.schema.json` describes it.
pub const SCHEMA: &str = "loadgen-result/1";

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
    pub phases: Vec<String>,
    pub scale: f64,
    pub write_size: usize,
    pub fsync: bool,
    pub sync: bool,
    pub drop_caches: bool,
    pub read_other: bool,
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
    pub mb_s: f64,
    pub files: u64,
    pub bytes: u64,
    pub start_s: f64,
    pub end_s: f64,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PhaseReport {
    pub name: String,
    /// Sum of the clients' MB/s (as compilebench's blog reports it).
    pub aggregate_mb_s: f64,
    /// All clients' bytes over the time until the last one finished: what the system
    /// really delivered (the sum above overstates when clients do not overlap).
    #[serde(default)]
    pub wall_mb_s: f64,
    pub files: u64,
    pub bytes: u64,
    /// Files per second over the slowest client's time.
    pub files_per_s: f64,
    pub first_done_s: f64,
    pub last_done_s: f64,
    pub start_skew_s: f64,
    pub clients: Vec<ClientReport>,
    /// Per operation, in microseconds.
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
    /// False while running and when the run stopped early.
    pub complete: bool,
    pub error: Option<String>,
    pub warnings: Vec<String>,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

pub fn latency_report(l: &Latencies) -> BTreeMap<String, LatencyReport> {
    let mut out = BTreeMap::new();
    for op in OPS {
        let h = l.get(op);
        if h.is_empty() {
            continue;
        }
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

pub fn phase_report(p: &PhaseResult) -> PhaseReport {
    let files: u64 = p.clients.iter().map(|c| c.files).sum();
    let last = p.last_done().as_secs_f64();
    PhaseReport {
        name: p.phase.name().to_string(),
        aggregate_mb_s: p.aggregate_mb_per_s(),
        wall_mb_s: if last > 0.0 {
            p.clients.iter().map(|c| c.bytes).sum::<u64>() as f64 / 1048576.0 / last
        } else {
            0.0
        },
        files,
        bytes: p.clients.iter().map(|c| c.bytes).sum(),
        files_per_s: if last > 0.0 { files as f64 / last } else { 0.0 },
        first_done_s: p.first_done().as_secs_f64(),
        last_done_s: last,
        start_skew_s: p.start_skew().as_secs_f64(),
        clients: p
            .clients
            .iter()
            .map(|c| ClientReport {
                client: c.client,
                mb_s: c.mb_per_s(),
                files: c.files,
                bytes: c.bytes,
                start_s: c.start.as_secs_f64(),
                end_s: c.end.as_secs_f64(),
                error: c.error.clone(),
            })
            .collect(),
        latency: latency_report(&p.latencies),
    }
}

pub fn to_json(r: &RunReport) -> Vec<u8> {
    let mut v = serde_json::to_vec_pretty(r).unwrap_or_default();
    v.push(b'\n');
    v
}

/// One row per phase and client, plus an `all` row per phase.
pub fn to_csv(r: &RunReport) -> Vec<u8> {
    let mut out = String::from(
        "phase,client,mb_s,files,bytes,start_s,end_s,files_per_s,p50_us,p99_us,error\n",
    );
    for p in &r.phases {
        let main = main_op(p);
        let (p50, p99) = main
            .and_then(|op| p.latency.get(op))
            .map(|l| (l.p50_us, l.p99_us))
            .unwrap_or((0.0, 0.0));
        out.push_str(&format!(
            "{},all,{:.3},{},{},0,{:.6},{:.1},{:.1},{:.1},\n",
            p.name, p.aggregate_mb_s, p.files, p.bytes, p.last_done_s, p.files_per_s, p50, p99
        ));
        for c in &p.clients {
            out.push_str(&format!(
                "{},{},{:.3},{},{},{:.6},{:.6},,,,{}\n",
                p.name,
                c.client,
                c.mb_s,
                c.files,
                c.bytes,
                c.start_s,
                c.end_s,
                c.error.as_deref().unwrap_or("").replace(',', ";")
            ));
        }
    }
    out.into_bytes()
}

/// The operation that dominates a phase, for the summary columns.
fn main_op(p: &PhaseReport) -> Option<&'static str> {
    let name = p.name.as_str();
    let op = if name.contains("read") {
        "read"
    } else if name.contains("stat") {
        "stat"
    } else if name.contains("delete") || name == "clean" {
        "unlink"
    } else {
        "write"
    };
    if p.latency.contains_key(op) {
        Some(op)
    } else {
        ["open", "unlink", "stat"]
            .into_iter()
            .find(|o| p.latency.contains_key(*o))
    }
}

/// The readable summary: one line per phase, then the latency percentiles.
pub fn table(r: &RunReport) -> String {
    let mut out = format!(
        "loadgen {} on {} ({}, {} clients)\n\n",
        r.command, r.target, r.environment.fs_type, r.config.clients
    );
    out.push_str(&format!(
        "{:<16} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>10} {:>10}\n",
        "phase",
        "MB/s",
        "wall MB/s",
        "min MB/s",
        "max MB/s",
        "files/s",
        "first s",
        "last s",
        "skew ms"
    ));
    for p in &r.phases {
        let min = p
            .clients
            .iter()
            .map(|c| c.mb_s)
            .fold(f64::INFINITY, f64::min);
        let max = p.clients.iter().map(|c| c.mb_s).fold(0.0, f64::max);
        out.push_str(&format!(
            "{:<16} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>9.0} {:>9.3} {:>10.3} {:>10.2}\n",
            p.name,
            p.aggregate_mb_s,
            p.wall_mb_s,
            if min.is_finite() { min } else { 0.0 },
            max,
            p.files_per_s,
            p.first_done_s,
            p.last_done_s,
            p.start_skew_s * 1000.0
        ));
    }
    out.push_str(&format!(
        "\n{:<16} {:<9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>10}\n",
        "phase", "op", "count", "p50 us", "p90 us", "p99 us", "p99.9 us", "max us"
    ));
    for p in &r.phases {
        for (op, l) in &p.latency {
            out.push_str(&format!(
                "{:<16} {:<9} {:>10} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>10.1}\n",
                p.name, op, l.count, l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us
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

/// The clients x phase table of a sweep (aggregate MB/s), as the NERSC study shows it.
pub fn sweep_table(runs: &[RunReport]) -> String {
    let mut phases: Vec<String> = Vec::new();
    for r in runs {
        for p in &r.phases {
            if !phases.contains(&p.name) {
                phases.push(p.name.clone());
            }
        }
    }
    let mut out = format!("{:>8}", "clients");
    for p in &phases {
        out.push_str(&format!(" {:>16}", p));
    }
    out.push('\n');
    for r in runs {
        out.push_str(&format!("{:>8}", r.config.clients));
        for name in &phases {
            match r.phases.iter().find(|p| &p.name == name) {
                Some(p) => out.push_str(&format!(" {:>16.2}", p.aggregate_mb_s)),
                None => out.push_str(&format!(" {:>16}", "-")),
            }
        }
        out.push('\n');
    }
    out.push_str("(aggregate MB/s: the sum of the clients' MB/s)\n");
    out
}
