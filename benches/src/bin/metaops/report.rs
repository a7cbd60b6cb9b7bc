//! The report: the medians of the repeats, their ratios, and the tables.
//!
//! Every subject row (ccfs) is compared with bare tmpfs (`x bare`) and, per operation, with
//! the best FUSE peer at equal settings, named in the cell. Peers at their defaults are
//! shown beside them and never serve as the baseline of a ratio.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::{at, Failure, Flags};

/// The operations in the order of the tables: name, unit, title.
pub const OPS: [(&str, &str, &str); 18] = [
    ("create", "ops/s", "create 4 KiB"),
    ("stat", "ops/s", "stat"),
    ("readdir", "entries/s", "list one big directory"),
    ("readdir-again", "entries/s", "list it again"),
    ("unlink", "ops/s", "unlink"),
    (
        "list-dirs-cold",
        "entries/s",
        "list many small directories, cold",
    ),
    (
        "list-dirs-warm",
        "entries/s",
        "list many small directories, warm",
    ),
    (
        "list-stat-dirs-cold",
        "entries/s",
        "list many small directories, stat each entry, cold",
    ),
    ("rename-within", "ops/s", "rename within a directory"),
    ("rename-across", "ops/s", "rename across directories"),
    ("find-cold", "files/s", "find -type f, cold"),
    ("find-warm", "files/s", "find -type f, warm"),
    ("git-status-cold", "files/s", "git status, cold"),
    ("git-status-warm", "files/s", "git status, warm"),
    ("seq-write", "MB/s", "sequential write"),
    ("seq-read", "MB/s", "sequential read"),
    ("lg-create", "MB/s", "loadgen create"),
    ("lg-read-compiled", "MB/s", "loadgen read-compiled"),
];

/// The median of the values (the mean of the middle two for an even count).
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Who is compared with whom.
pub struct Roles {
    pub bare: String,
    /// The FUSE peers at equal settings: the baseline of every `x peer` ratio.
    pub peers: Vec<String>,
    /// Targets whose name starts with this get the ratios to the peers.
    pub subject: String,
}

/// What one target gave: its measurements per operation, or why it has none.
#[derive(Default)]
pub struct Row {
    pub status: Option<String>,
    pub runs: BTreeMap<String, Vec<f64>>,
}

/// Folds the raw lines into rows, in the order the targets first appear.
pub fn collect(raw: &str) -> Result<Vec<(String, Row)>, Failure> {
    let mut rows: Vec<(String, Row)> = Vec::new();
    for (i, line) in raw.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = at(serde_json::from_str(line), || format!("raw line {}", i + 1))?;
        let Some(target) = v["target"].as_str() else {
            return Err(Failure(format!("raw line {}: no target", i + 1)));
        };
        let idx = match rows.iter().position(|(t, _)| t == target) {
            Some(idx) => idx,
            None => {
                rows.push((target.to_string(), Row::default()));
                rows.len() - 1
            }
        };
        let row = &mut rows[idx].1;
        if let Some(status) = v["status"].as_str() {
            // "not installed" stays; a failure is kept unless one was already noted.
            if row.status.is_none() {
                row.status = Some(status.to_string());
            }
            continue;
        }
        let (Some(op), Some(value)) = (v["op"].as_str(), v["value"].as_f64()) else {
            return Err(Failure(format!("raw line {}: no op or value", i + 1)));
        };
        row.runs.entry(op.to_string()).or_default().push(value);
    }
    Ok(rows)
}

/// One measured cell: the median and its ratios.
pub struct Cell {
    pub median: f64,
    pub runs: Vec<f64>,
    pub vs_bare: Option<f64>,
    /// The ratio to the best peer at equal settings, and that peer.
    pub vs_peer: Option<(f64, String)>,
}

/// The median of `op` on `target`, if it was measured.
fn med(rows: &[(String, Row)], target: &str, op: &str) -> Option<f64> {
    rows.iter()
        .find(|(t, _)| t == target)
        .and_then(|(_, r)| r.runs.get(op))
        .and_then(|v| median(v))
}

/// The best peer at equal settings for `op`: its name and median.
pub fn best_peer(rows: &[(String, Row)], roles: &Roles, op: &str) -> Option<(String, f64)> {
    roles
        .peers
        .iter()
        .filter_map(|p| med(rows, p, op).map(|m| (p.clone(), m)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

pub fn cells(rows: &[(String, Row)], roles: &Roles) -> Vec<BTreeMap<&'static str, Cell>> {
    rows.iter()
        .map(|(target, row)| {
            let mut out = BTreeMap::new();
            for (op, _, _) in OPS {
                let Some(runs) = row.runs.get(op) else {
                    continue;
                };
                let Some(m) = median(runs) else { continue };
                let vs_bare = med(rows, &roles.bare, op).map(|b| m / b);
                let vs_peer = if target.starts_with(&roles.subject) {
                    best_peer(rows, roles, op).map(|(name, p)| (m / p, name))
                } else {
                    None
                };
                out.insert(
                    op,
                    Cell {
                        median: m,
                        runs: runs.clone(),
                        vs_bare,
                        vs_peer,
                    },
                );
            }
            out
        })
        .collect()
}

/// A number with three significant digits at least, thousands grouped.
pub fn human(v: f64) -> String {
    if v >= 100.0 {
        let s = format!("{:.0}", v);
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The first table: each operation on bare tmpfs, the best peer and every subject row.
fn summary_table(rows: &[(String, Row)], roles: &Roles, table: &[BTreeMap<&str, Cell>]) -> String {
    let subjects: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].0.starts_with(&roles.subject))
        .collect();
    let mut s = format!(
        "| operation | unit | {} | best peer at equal settings |",
        roles.bare
    );
    for &i in &subjects {
        let _ = write!(s, " {} |", rows[i].0);
    }
    s.push_str("\n|---|---|---:|---:|");
    s.push_str(&"---:|".repeat(subjects.len()));
    s.push('\n');
    for (op, unit, title) in OPS {
        let bare = med(rows, &roles.bare, op).map_or("-".to_string(), human);
        let peer = best_peer(rows, roles, op).map_or("-".to_string(), |(name, m)| {
            format!("{} ({name})", human(m))
        });
        let _ = write!(s, "| {title} | {unit} | {bare} | {peer} |");
        for &i in &subjects {
            match table[i].get(op) {
                None => s.push_str(" - |"),
                Some(c) => {
                    let _ = write!(s, " {}", human(c.median));
                    let mut ratios = Vec::new();
                    if let Some(r) = c.vs_bare {
                        ratios.push(format!("{r:.2}x bare"));
                    }
                    if let Some((r, name)) = &c.vs_peer {
                        ratios.push(format!("{r:.2}x {name}"));
                    }
                    if !ratios.is_empty() {
                        let _ = write!(s, " ({})", ratios.join(", "));
                    }
                    s.push_str(" |");
                }
            }
        }
        s.push('\n');
    }
    s
}

/// The second table: every target's median for each operation, with its ratio to bare.
fn full_table(rows: &[(String, Row)], roles: &Roles, table: &[BTreeMap<&str, Cell>]) -> String {
    let mut s = String::from("| operation | unit |");
    for (target, _) in rows {
        let _ = write!(s, " {target} |");
    }
    s.push_str("\n|---|---|");
    s.push_str(&"---:|".repeat(rows.len()));
    s.push('\n');
    for (op, unit, title) in OPS {
        let _ = write!(s, "| {title} | {unit} |");
        for ((target, row), cells) in rows.iter().zip(table) {
            match (cells.get(op), &row.status) {
                (Some(c), _) => {
                    let _ = write!(s, " {}", human(c.median));
                    if target != &roles.bare {
                        if let Some(r) = c.vs_bare {
                            let _ = write!(s, " ({r:.2}x)");
                        }
                    }
                    s.push_str(" |");
                }
                (None, Some(status)) if row.runs.is_empty() => {
                    let _ = write!(s, " {status} |");
                }
                (None, _) => s.push_str(" - |"),
            }
        }
        s.push('\n');
    }
    s
}

/// The targets measured over both transports: (over /dev/fuse, over io_uring), the latter
/// named as the former with `-uring` added.
pub fn transport_pairs(rows: &[(String, Row)]) -> Vec<(String, String)> {
    rows.iter()
        .filter_map(|(t, _)| {
            let classic = t.strip_suffix("-uring")?;
            let measured = |name: &str| rows.iter().any(|(c, r)| c == name && !r.runs.is_empty());
            (measured(classic) && measured(t)).then(|| (classic.to_string(), t.clone()))
        })
        .collect()
}

/// The third table: each pair's io_uring median over its /dev/fuse median, per operation.
fn transport_table(rows: &[(String, Row)]) -> Option<String> {
    let pairs = transport_pairs(rows);
    if pairs.is_empty() {
        return None;
    }
    let mut s = String::from("| operation |");
    for (classic, _) in &pairs {
        let _ = write!(s, " {classic} |");
    }
    s.push_str("\n|---|");
    s.push_str(&"---:|".repeat(pairs.len()));
    s.push('\n');
    for (op, _, title) in OPS {
        let _ = write!(s, "| {title} |");
        for (classic, ring) in &pairs {
            match (med(rows, classic, op), med(rows, ring, op)) {
                (Some(c), Some(r)) if c > 0.0 => {
                    let _ = write!(s, " {:.2}x |", r / c);
                }
                _ => s.push_str(" - |"),
            }
        }
        s.push('\n');
    }
    Some(s)
}

/// The Markdown report: what was measured where, and the tables.
pub fn markdown(meta: &[(String, String)], rows: &[(String, Row)], roles: &Roles) -> String {
    let table = cells(rows, roles);
    let mut s = String::from("# bench-ccfs results\n\n");
    for (k, v) in meta {
        let _ = writeln!(s, "- {k}: {v}");
    }
    let _ = writeln!(
        s,
        "\nMedians of the repeats; higher is better everywhere. `x bare` is the ratio to \
         {}; in the {}* columns, `x PEER` is the ratio to the best FUSE peer at equal \
         settings for that operation (the highest of {}), named in the cell. Peers at \
         their defaults are in the second table only. Only ratios from one run count.\n",
        roles.bare,
        roles.subject,
        roles.peers.join(", ")
    );
    s.push_str("## ccfs against bare and the best peer\n\n");
    s.push_str(&summary_table(rows, roles, &table));
    s.push_str("\n## Every target (ratio to bare in brackets)\n\n");
    s.push_str(&full_table(rows, roles, &table));
    if let Some(t) = transport_table(rows) {
        s.push_str(
            "\n## FUSE over io_uring against /dev/fuse (the io_uring rate over the /dev/fuse \
             rate of the same target; above 1: faster over the ring)\n\n",
        );
        s.push_str(&t);
    }
    let notes: Vec<String> = rows
        .iter()
        .filter_map(|(t, r)| r.status.as_ref().map(|st| format!("- {t}: {st}")))
        .collect();
    if !notes.is_empty() {
        s.push_str("\nTargets with problems:\n\n");
        s.push_str(&notes.join("\n"));
        s.push('\n');
    }
    s
}

/// The JSON report: the same numbers with every repeat.
pub fn report_json(meta: &[(String, String)], rows: &[(String, Row)], roles: &Roles) -> Value {
    let table = cells(rows, roles);
    let targets: Vec<Value> = rows
        .iter()
        .zip(&table)
        .map(|((target, row), cells)| {
            let ops: serde_json::Map<String, Value> = cells
                .iter()
                .map(|(op, c)| {
                    (
                        op.to_string(),
                        json!({
                            "median": c.median,
                            "runs": c.runs,
                            "ratio_to_bare": c.vs_bare,
                            "ratio_to_best_fuse_peer": c.vs_peer.as_ref().map(|p| p.0),
                            "best_fuse_peer": c.vs_peer.as_ref().map(|p| p.1.clone()),
                        }),
                    )
                })
                .collect();
            json!({ "name": target, "status": row.status, "ops": ops })
        })
        .collect();
    let meta: serde_json::Map<String, Value> = meta
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let transports: serde_json::Map<String, Value> = transport_pairs(rows)
        .into_iter()
        .map(|(classic, ring)| {
            let ratios: serde_json::Map<String, Value> = OPS
                .iter()
                .filter_map(|(op, _, _)| {
                    let (c, r) = (med(rows, &classic, op)?, med(rows, &ring, op)?);
                    (c > 0.0).then(|| (op.to_string(), json!(r / c)))
                })
                .collect();
            (classic, Value::Object(ratios))
        })
        .collect();
    json!({
        "schema": "bench-ccfs/2",
        "io_uring_over_dev_fuse": transports,
        "meta": meta,
        "bare": roles.bare,
        "fuse_peers_at_equal_settings": roles.peers,
        "ops": OPS.iter().map(|(op, unit, _)| json!({"name": op, "unit": unit})).collect::<Vec<_>>(),
        "targets": targets,
    })
}

pub fn report(raw_path: &Path, flags: &Flags) -> Result<(), Failure> {
    let out = PathBuf::from(flags.required("out")?);
    let roles = Roles {
        bare: flags.get("bare").unwrap_or("tmpfs").to_string(),
        peers: flags
            .get("peers")
            .unwrap_or("bindfs-equal,fuse-overlayfs-equal")
            .split(',')
            .map(str::to_string)
            .collect(),
        subject: flags.get("subject").unwrap_or("ccfs").to_string(),
    };
    let mut meta = Vec::new();
    for kv in flags.all("meta") {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(Failure(format!("--meta {kv}: expected KEY=VALUE")));
        };
        meta.push((k.to_string(), v.to_string()));
    }
    let raw = at(fs::read_to_string(raw_path), || {
        format!("read {}", raw_path.display())
    })?;
    let rows = collect(&raw)?;
    let md = markdown(&meta, &rows, &roles);
    let js = report_json(&meta, &rows, &roles);
    let md_path = out.join("results.md");
    at(fs::write(&md_path, &md), || {
        format!("write {}", md_path.display())
    })?;
    let js_path = out.join("results.json");
    let text = at(serde_json::to_string_pretty(&js), || {
        "encode JSON".to_string()
    })?;
    at(fs::write(&js_path, text + "\n"), || {
        format!("write {}", js_path.display())
    })?;
    print!("{md}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::Tag;
    use super::*;

    fn roles() -> Roles {
        Roles {
            bare: "tmpfs".into(),
            peers: vec!["bindfs-equal".into(), "fuse-overlayfs-equal".into()],
            subject: "ccfs".into(),
        }
    }

    fn line(target: &str, repeat: u64, op: &str, value: f64) -> String {
        Tag {
            target: target.into(),
            repeat,
        }
        .line(op, value, "ops/s")
    }

    #[test]
    fn median_takes_the_middle() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn ccfs_rows_compare_with_the_best_peer_at_equal_settings() {
        let raw = [
            line("tmpfs", 1, "create", 1000.0),
            line("bindfs-defaults", 1, "create", 900.0),
            line("bindfs-equal", 1, "create", 200.0),
            line("fuse-overlayfs-equal", 1, "create", 400.0),
            line("ccfs-cached", 1, "create", 100.0),
            line("ccfs-cached", 2, "create", 300.0),
            line("ccfs-cached", 3, "create", 200.0),
            line("tmpfs", 1, "stat", 1000.0),
            line("bindfs-equal", 1, "stat", 500.0),
            line("fuse-overlayfs-equal", 1, "stat", 250.0),
            line("ccfs-cached", 1, "stat", 250.0),
        ]
        .join("\n");
        let rows = collect(&raw).expect("collect");
        let table = cells(&rows, &roles());
        let ccfs = &table[4];
        assert_eq!(ccfs["create"].median, 200.0);
        assert_eq!(ccfs["create"].vs_bare, Some(0.2));
        assert_eq!(
            ccfs["create"].vs_peer,
            Some((0.5, "fuse-overlayfs-equal".to_string())),
            "a peer at its defaults is never the baseline"
        );
        assert_eq!(
            ccfs["stat"].vs_peer,
            Some((0.5, "bindfs-equal".to_string()))
        );
        assert!(
            table[2]["create"].vs_peer.is_none(),
            "peers get no peer ratio"
        );
        let md = markdown(&[], &rows, &roles());
        let create = md
            .lines()
            .find(|l| l.starts_with("| create 4 KiB |"))
            .expect("create row");
        assert!(
            create.contains("400 (fuse-overlayfs-equal)")
                && create.contains("200 (0.20x bare, 0.50x fuse-overlayfs-equal)"),
            "{create}"
        );
    }

    #[test]
    fn a_missing_tool_is_a_column_that_says_so() {
        let raw = [
            line("tmpfs", 1, "create", 1000.0),
            r#"{"target":"bindfs-equal","status":"not installed"}"#.to_string(),
            line("ccfs-cached", 1, "create", 500.0),
        ]
        .join("\n");
        let rows = collect(&raw).expect("collect");
        let md = markdown(&[], &rows, &roles());
        let every = md.split("## Every target").nth(1).expect("full table");
        assert_eq!(every.matches("| not installed |").count(), OPS.len());
        assert!(md.contains("| 500 (0.50x bare) |"), "{md}");
        let js = report_json(&[], &rows, &roles());
        assert_eq!(js["targets"][1]["status"], "not installed");
        assert_eq!(js["targets"][2]["ops"]["create"]["ratio_to_bare"], 0.5);
    }

    #[test]
    fn each_target_over_the_ring_is_compared_with_itself_over_dev_fuse() {
        let raw = [
            line("tmpfs", 1, "stat", 1000.0),
            line("ccfs-ttl0", 1, "stat", 100.0),
            line("ccfs-ttl0-uring", 1, "stat", 250.0),
            line("lonely-uring", 1, "stat", 5.0),
        ]
        .join("\n");
        let rows = collect(&raw).expect("collect");
        assert_eq!(
            transport_pairs(&rows),
            vec![("ccfs-ttl0".to_string(), "ccfs-ttl0-uring".to_string())]
        );
        let md = markdown(&[], &rows, &roles());
        let ring = md.split("## FUSE over io_uring").nth(1).expect("the table");
        assert!(ring.contains("| stat | 2.50x |"), "{ring}");
        let js = report_json(&[], &rows, &roles());
        assert_eq!(js["io_uring_over_dev_fuse"]["ccfs-ttl0"]["stat"], 2.5);
    }

    #[test]
    fn human_groups_thousands() {
        assert_eq!(human(1234567.4), "1,234,567");
        assert_eq!(human(123.4), "123");
        assert_eq!(human(12.34), "12.3");
        assert_eq!(human(1.234), "1.23");
    }
}
