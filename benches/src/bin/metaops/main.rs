//! The measured loops of `scripts/bench-ccfs`, and its report.
//!
//! Every loop runs in one thread and makes plain system calls through std, one call per
//! operation, timed as a whole with a monotonic clock. Each measurement is printed as one
//! JSON line `{"target", "repeat", "op", "value", "unit"}` (higher is better for every
//! unit); `report` folds such lines into the medians, the ratios and the tables.
//!
//! ```text
//! metaops files DIR --files N --target T --repeat R    create, stat, readdir (twice), unlink
//! metaops write FILE --bytes B --target T --repeat R   sequential write, fsync at the end
//! metaops read FILE --target T --repeat R              sequential read (drop caches first)
//! metaops loadgen JSON --target T --repeat R           loadgen's create and read-compiled
//! metaops saves DIR --threads T --files N [--same yes] --target T --repeat R
//!                                                      saves by rename from T threads
//! metaops dirs DIR --dirs D --per-dir N [--cold no] --target T --repeat R
//!                                                      many small directories listed (cold,
//!                                                      warm; cold with each entry looked
//!                                                      at), renames within and across
//! metaops walk DIR --files N [--cold no] --target T --repeat R
//!                                                      find and git status over a home tree
//! metaops report RAW --out DIR [--bare T] [--peers T,T] [--subject PREFIX] [--meta K=V]...
//! ```

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use serde_json::{json, Value};

mod report;
mod tree;

/// Bytes each created file gets.
const FILE_SIZE: usize = 4096;
/// Bytes per call of the sequential write and read.
const BLOCK: usize = 1 << 20;

/// A failure of a loop or of the report: one line for the caller, exit 1.
#[derive(Debug)]
struct Failure(String);

/// Adds what was being done to an I/O error.
fn at<T, E: std::fmt::Display>(
    r: Result<T, E>,
    what: impl FnOnce() -> String,
) -> Result<T, Failure> {
    r.map_err(|e| Failure(format!("{}: {e}", what())))
}

/// Command-line flags after the subcommand and its path.
struct Flags {
    values: BTreeMap<String, Vec<String>>,
}

impl Flags {
    fn parse(args: &[String]) -> Result<Self, Failure> {
        let mut values: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let Some(name) = flag.strip_prefix("--") else {
                return Err(Failure(format!("unexpected argument {flag}")));
            };
            let Some(v) = it.next() else {
                return Err(Failure(format!("{flag} needs a value")));
            };
            values.entry(name.to_string()).or_default().push(v.clone());
        }
        Ok(Flags { values })
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.values
            .get(name)
            .and_then(|v| v.last())
            .map(String::as_str)
    }

    fn all(&self, name: &str) -> &[String] {
        self.values.get(name).map_or(&[], Vec::as_slice)
    }

    fn required(&self, name: &str) -> Result<&str, Failure> {
        self.get(name)
            .ok_or_else(|| Failure(format!("--{name} is required")))
    }

    fn number(&self, name: &str) -> Result<u64, Failure> {
        let v = self.required(name)?;
        match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(Failure(format!(
                "--{name} {v}: expected a positive whole number"
            ))),
        }
    }
}

/// Where a measurement comes from.
struct Tag {
    target: String,
    repeat: u64,
}

impl Tag {
    fn from(flags: &Flags) -> Result<Self, Failure> {
        Ok(Tag {
            target: flags.required("target")?.to_string(),
            repeat: flags.number("repeat")?,
        })
    }

    fn line(&self, op: &str, value: f64, unit: &str) -> String {
        json!({
            "target": self.target,
            "repeat": self.repeat,
            "op": op,
            "value": value,
            "unit": unit,
        })
        .to_string()
    }
}

fn rate(count: usize, secs: f64) -> f64 {
    count as f64 / secs.max(1e-9)
}

fn file_name(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("f{i:07}"))
}

/// create, stat, readdir (twice) and unlink of `n` files in `dir` (which must be empty).
fn files(dir: &Path, n: usize, tag: &Tag) -> Result<(), Failure> {
    let listed = at(fs::read_dir(dir), || format!("list {}", dir.display()))?.count();
    if listed != 0 {
        return Err(Failure(format!(
            "{} is not empty ({listed} entries)",
            dir.display()
        )));
    }
    let data = vec![0xa5u8; FILE_SIZE];

    let t = Instant::now();
    for i in 0..n {
        let path = file_name(dir, i);
        let mut f = at(
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path),
            || format!("create {}", path.display()),
        )?;
        at(f.write_all(&data), || format!("write {}", path.display()))?;
    }
    println!(
        "{}",
        tag.line("create", rate(n, t.elapsed().as_secs_f64()), "ops/s")
    );

    let t = Instant::now();
    for i in 0..n {
        let path = file_name(dir, i);
        let m = at(fs::metadata(&path), || format!("stat {}", path.display()))?;
        if m.len() != FILE_SIZE as u64 {
            return Err(Failure(format!(
                "stat {}: size {}, wrote {FILE_SIZE}",
                path.display(),
                m.len()
            )));
        }
    }
    println!(
        "{}",
        tag.line("stat", rate(n, t.elapsed().as_secs_f64()), "ops/s")
    );

    // The first listing is the filesystem's own; a FUSE server may let the kernel keep
    // the listing (FOPEN_CACHE_DIR), which only the second one shows.
    for op in ["readdir", "readdir-again"] {
        let t = Instant::now();
        let mut seen = 0;
        for e in at(fs::read_dir(dir), || format!("list {}", dir.display()))? {
            at(e, || format!("list {}", dir.display()))?;
            seen += 1;
        }
        let secs = t.elapsed().as_secs_f64();
        if seen != n {
            return Err(Failure(format!(
                "list {}: {seen} entries, created {n}",
                dir.display()
            )));
        }
        println!("{}", tag.line(op, rate(n, secs), "entries/s"));
    }

    let t = Instant::now();
    for i in 0..n {
        let path = file_name(dir, i);
        at(fs::remove_file(&path), || {
            format!("unlink {}", path.display())
        })?;
    }
    println!(
        "{}",
        tag.line("unlink", rate(n, t.elapsed().as_secs_f64()), "ops/s")
    );
    Ok(())
}

fn mb_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1e6 / secs.max(1e-9)
}

/// Writes `bytes` to a new `path` in 1 MiB calls; fsync and close are in the time.
fn write(path: &Path, bytes: u64, tag: &Tag) -> Result<(), Failure> {
    let data = vec![0x5au8; BLOCK];
    let t = Instant::now();
    let mut f = at(
        OpenOptions::new().write(true).create_new(true).open(path),
        || format!("create {}", path.display()),
    )?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(BLOCK as u64) as usize;
        at(f.write_all(&data[..n]), || {
            format!("write {}", path.display())
        })?;
        left -= n as u64;
    }
    at(f.sync_all(), || format!("fsync {}", path.display()))?;
    drop(f);
    let secs = t.elapsed().as_secs_f64();
    println!("{}", tag.line("seq-write", mb_per_s(bytes, secs), "MB/s"));
    Ok(())
}

/// Reads `path` to its end in 1 MiB calls.
fn read(path: &Path, tag: &Tag) -> Result<(), Failure> {
    let mut buf = vec![0u8; BLOCK];
    let t = Instant::now();
    let mut f = at(fs::File::open(path), || format!("open {}", path.display()))?;
    let mut total = 0u64;
    loop {
        let n = at(f.read(&mut buf), || format!("read {}", path.display()))?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    drop(f);
    let secs = t.elapsed().as_secs_f64();
    let size = at(fs::metadata(path), || format!("stat {}", path.display()))?.len();
    if total != size || total == 0 {
        return Err(Failure(format!(
            "read {}: {total} bytes of {size}",
            path.display()
        )));
    }
    println!("{}", tag.line("seq-read", mb_per_s(total, secs), "MB/s"));
    Ok(())
}

/// The MB/s of loadgen's create and read-compiled phases from its JSON result.
fn loadgen_lines(result: &Value, tag: &Tag) -> Result<Vec<String>, Failure> {
    let phases = result["phases"]
        .as_array()
        .ok_or_else(|| Failure("loadgen result: no phases".into()))?;
    let mut lines = Vec::new();
    for (phase, op) in [
        ("create", "lg-create"),
        ("read-compiled", "lg-read-compiled"),
    ] {
        let p = phases
            .iter()
            .find(|p| p["name"] == phase)
            .ok_or_else(|| Failure(format!("loadgen result: no {phase} phase")))?;
        let errors: Vec<&str> = p["clients"]
            .as_array()
            .map(|c| c.iter().filter_map(|c| c["error"].as_str()).collect())
            .unwrap_or_default();
        if let Some(e) = errors.first() {
            return Err(Failure(format!("loadgen {phase}: {e}")));
        }
        let mb_s = p["aggregate_mb_s"]
            .as_f64()
            .filter(|v| *v > 0.0)
            .ok_or_else(|| Failure(format!("loadgen result: {phase} has no MB/s")))?;
        lines.push(tag.line(op, mb_s, "MB/s"));
    }
    Ok(lines)
}

/// Saves by rename from `threads` threads at once, each in a directory of its own below
/// `dir`: `files` times a temporary file of 4 KiB made and renamed over its name (a new
/// name each time, or with `same` always the same one, as a program saving its settings
/// again), then the names unlinked. One line: saves per second, all threads together.
fn saves(dir: &Path, threads: usize, files: usize, same: bool, tag: &Tag) -> Result<(), Failure> {
    let data = vec![0x5au8; FILE_SIZE];
    let mut dirs = Vec::new();
    for t in 0..threads {
        let d = dir.join(format!("t{t}"));
        at(fs::create_dir(&d), || format!("mkdir {}", d.display()))?;
        dirs.push(d);
    }
    let start = Instant::now();
    let outcomes: Vec<Result<(), Failure>> = std::thread::scope(|scope| {
        let workers: Vec<_> = dirs
            .iter()
            .map(|d| {
                let data = &data;
                scope.spawn(move || -> Result<(), Failure> {
                    let tmp = d.join("save.tmp");
                    for i in 0..files {
                        let name = file_name(d, if same { 0 } else { i });
                        let mut f = at(fs::File::create(&tmp), || {
                            format!("create {}", tmp.display())
                        })?;
                        at(f.write_all(data), || format!("write {}", tmp.display()))?;
                        drop(f);
                        at(fs::rename(&tmp, &name), || {
                            format!("rename {} over {}", tmp.display(), name.display())
                        })?;
                    }
                    for i in 0..if same { 1 } else { files } {
                        let name = file_name(d, i);
                        at(fs::remove_file(&name), || {
                            format!("unlink {}", name.display())
                        })?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(Failure("a saving thread panicked".into())))
            })
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    outcomes.into_iter().collect::<Result<Vec<()>, Failure>>()?;
    for d in &dirs {
        at(fs::remove_dir(d), || format!("rmdir {}", d.display()))?;
    }
    let op = format!("saves-{threads}t{}", if same { "-same" } else { "" });
    println!("{}", tag.line(&op, rate(threads * files, secs), "saves/s"));
    Ok(())
}

/// `--cold yes|no` (default yes): whether the cold passes run (they drop the caches).
fn cold(flags: &Flags) -> Result<bool, Failure> {
    match flags.get("cold") {
        None | Some("yes") => Ok(true),
        Some("no") => Ok(false),
        Some(other) => Err(Failure(format!("--cold {other}: say yes or no"))),
    }
}

fn run(args: &[String]) -> Result<(), Failure> {
    let (Some(cmd), Some(path)) = (args.first(), args.get(1)) else {
        return Err(Failure(
            "usage: metaops files|write|read|loadgen|saves|dirs|walk|report PATH [--flag value]..."
                .into(),
        ));
    };
    let path = Path::new(path);
    let flags = Flags::parse(&args[2..])?;
    match cmd.as_str() {
        "files" => {
            let n = flags.number("files")? as usize;
            files(path, n, &Tag::from(&flags)?)
        }
        "write" => write(path, flags.number("bytes")?, &Tag::from(&flags)?),
        "read" => read(path, &Tag::from(&flags)?),
        "loadgen" => {
            let text = at(fs::read_to_string(path), || {
                format!("read {}", path.display())
            })?;
            let v: Value = at(serde_json::from_str(&text), || {
                format!("parse {}", path.display())
            })?;
            for line in loadgen_lines(&v, &Tag::from(&flags)?)? {
                println!("{line}");
            }
            Ok(())
        }
        "report" => report::report(path, &flags),
        "dirs" => tree::dirs(
            path,
            flags.number("dirs")? as usize,
            flags.number("per-dir")? as usize,
            cold(&flags)?,
            &Tag::from(&flags)?,
        ),
        "walk" => tree::walk(
            path,
            flags.number("files")? as usize,
            cold(&flags)?,
            &Tag::from(&flags)?,
        ),
        "saves" => {
            let same = match flags.get("same") {
                None | Some("no") => false,
                Some("yes") => true,
                Some(other) => {
                    return Err(Failure(format!("--same {other}: say yes or no")));
                }
            };
            saves(
                path,
                flags.number("threads")? as usize,
                flags.number("files")? as usize,
                same,
                &Tag::from(&flags)?,
            )
        }
        other => Err(Failure(format!(
            "unknown command {other} (files, write, read, loadgen, saves, dirs, walk, report)"
        ))),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(msg)) => {
            let _ = std::io::stdout().flush();
            eprintln!("metaops: {msg}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loadgen_phases_become_lines_and_errors_fail() {
        let tag = Tag {
            target: "tmpfs".into(),
            repeat: 2,
        };
        let ok = json!({"phases": [
            {"name": "create", "aggregate_mb_s": 120.5, "clients": [{"error": null}]},
            {"name": "compile", "aggregate_mb_s": 1.0, "clients": [{"error": null}]},
            {"name": "read-compiled", "aggregate_mb_s": 300.0, "clients": [{"error": null}]},
        ]});
        let lines = loadgen_lines(&ok, &tag).expect("lines");
        let parsed: Vec<Value> = lines
            .iter()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(parsed[0]["op"], "lg-create");
        assert_eq!(parsed[0]["value"], 120.5);
        assert_eq!(parsed[1]["op"], "lg-read-compiled");
        assert_eq!(parsed[1]["repeat"], 2);
        let failed = json!({"phases": [
            {"name": "create", "aggregate_mb_s": 0.0, "clients": [{"error": "ENOSPC"}]},
        ]});
        let err = loadgen_lines(&failed, &tag).expect_err("an error");
        assert!(err.0.contains("ENOSPC"), "{}", err.0);
    }

    #[test]
    fn the_loops_count_what_they_did() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tag = Tag {
            target: "here".into(),
            repeat: 1,
        };
        files(dir.path(), 50, &tag).expect("files");
        assert_eq!(fs::read_dir(dir.path()).expect("list").count(), 0);
        let f = dir.path().join("seq");
        write(&f, 3 * BLOCK as u64 + 5, &tag)
            .map_err(|f| f.0)
            .expect("write");
        assert_eq!(fs::metadata(&f).expect("stat").len(), 3 * BLOCK as u64 + 5);
        read(&f, &tag).expect("read");
        fs::write(dir.path().join("stray"), b"x").expect("stray");
        let err = files(dir.path(), 5, &tag).expect_err("refused");
        assert!(err.0.contains("not empty"), "{}", err.0);
    }
}
