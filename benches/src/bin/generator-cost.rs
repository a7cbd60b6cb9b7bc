//! The generator's own cost: loadgen's create and read phases against a minimal replay loop
//! that makes exactly the same system calls on the same tree, in one process, on the same
//! filesystem (use tmpfs), interleaved and repeated; prints medians, ratios and user CPU per
//! file. compilebench's python3 port is not in any registry this project can use (PyPI,
//! crates.io, Debian), so it is reported as skipped.
//!
//! Usage: generator-cost DIR [--scale F] [--rounds N]

use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use loadgen::engine::{self, Config, Progress};
use loadgen::workload::{Datasets, Entry, Lists, Phase, Schedule, Workload};

fn user_cpu() -> Duration {
    // SAFETY: getrusage fills a zeroed rusage for this process.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    Duration::from_secs(ru.ru_utime.tv_sec as u64)
        + Duration::from_micros(ru.ru_utime.tv_usec as u64)
}

/// The replay loop, the calls compilebench makes: mkdir the tree, then for each file make
/// its directory the first time it is seen (stat the parent, mkdir), open it for appending
/// (created), write it in 256 KiB pieces, close. No timing, no bookkeeping.
fn replay_create(root: &Path, list: &[Entry], buf: &[u8]) {
    fs::create_dir(root).expect("mkdir");
    let mut seen = HashSet::new();
    for f in list {
        if let Some((d, _)) = f.path.rsplit_once('/') {
            if seen.insert(d.to_string()) {
                makedirs(&root.join(d));
                let mut p = d;
                while let Some((parent, _)) = p.rsplit_once('/') {
                    seen.insert(parent.to_string());
                    p = parent;
                }
            }
        }
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(root.join(&f.path))
            .expect("create");
        let mut left = f.size as usize;
        while left > 0 {
            let n = left.min(buf.len());
            file.write_all(&buf[..n]).expect("write");
            left -= n;
        }
    }
}

fn makedirs(d: &Path) {
    if let Some(parent) = d.parent() {
        if fs::metadata(parent).is_err() {
            makedirs(parent);
        }
    }
    let _ = fs::create_dir(d);
}

/// os.walk top-down: list a directory, read its files, then for each subdirectory check
/// it is no symlink and go in.
fn replay_read(dir: &Path, buf: &mut [u8]) {
    let mut subdirs = Vec::new();
    for e in fs::read_dir(dir).expect("readdir") {
        let e = e.expect("entry");
        if e.file_type().expect("type").is_dir() {
            subdirs.push(e.path());
        } else {
            let mut file = fs::File::open(e.path()).expect("open");
            while file.read(buf).expect("read") > 0 {}
        }
    }
    for d in subdirs {
        if !fs::symlink_metadata(&d).expect("lstat").is_symlink() {
            replay_read(&d, buf);
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).map(Path::new).unwrap_or_else(|| {
        eprintln!("usage: generator-cost DIR [--scale F] [--rounds N]   (DIR on tmpfs)");
        std::process::exit(2)
    });
    let get = |flag: &str, default: f64| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let scale = get("--scale", 1.0);
    let rounds = get("--rounds", 5.0) as usize;
    let phases = [Phase::Create, Phase::ReadTree, Phase::DeleteTree];
    let workload = Arc::new(Workload::compilebench(
        &Datasets::embedded(),
        scale,
        555,
        &Schedule::Phases(phases.to_vec()),
        false,
    ));
    let mut cfg = Config {
        target: loadgen::store::Target::Local(dir.to_path_buf()),
        run_dir: dir.to_path_buf(),
        clients: 1,
        client_base: 0,
        workload: workload.clone(),
        write_size: 256 * 1024,
        fsync: false,
        drop_caches: false,
        read_other: false,
        native_order: true,
        cleanup: true,
        threads: 1,
        phase_timeout: None,
        direct: false,
    };
    // The replay writes the tree in the order loadgen does (the target's readdir order).
    let lists = engine::native_order(&cfg, &workload.lists).expect("native order");
    let set = &lists.unpatched;
    let files = set.len() as f64;
    let buf = vec![0x5au8; 256 * 1024];
    let mut rbuf = vec![0u8; 256 * 1024];
    let fsinfo = fsinfo::statfs(dir)
        .map(|s| fsinfo::fs_type_name(s.fs_type))
        .unwrap_or("?");
    println!(
        "generator cost on {} ({fsinfo}): {} files, {:.1} MiB, {rounds} rounds, interleaved",
        dir.display(),
        set.len(),
        Lists::bytes(set) as f64 / 1048576.0
    );
    let (mut rc, mut rr, mut lc, mut lr) = (vec![], vec![], vec![], vec![]);
    let (mut rcpu, mut lcpu) = (vec![], vec![]);
    for round in 0..rounds {
        // Replay.
        let root = dir.join(format!("replay-{round}"));
        let cpu0 = user_cpu();
        let t = Instant::now();
        replay_create(&root, set, &buf);
        let create = t.elapsed().as_secs_f64();
        let t = Instant::now();
        replay_read(&root, &mut rbuf);
        let read = t.elapsed().as_secs_f64();
        rcpu.push((user_cpu() - cpu0).as_secs_f64());
        fs::remove_dir_all(&root).expect("rm -r");
        rc.push(create);
        rr.push(read);
        // loadgen's engine, same tree, one client.
        let run_dir = dir.join(format!("loadgen-{round}"));
        fs::create_dir(&run_dir).expect("mkdir");
        cfg.run_dir = run_dir.clone();
        let cpu0 = user_cpu();
        let r = engine::run(&cfg, &Progress::default(), &AtomicBool::new(false), |_| {}).phases;
        let cpu = (user_cpu() - cpu0).as_secs_f64();
        let secs = |i: usize| r[i].clients[0].seconds();
        lc.push(secs(0));
        lr.push(secs(1));
        // CPU of create + read only, scaled by their share of the run's wall time.
        let share = (secs(0) + secs(1)) / (secs(0) + secs(1) + secs(2)).max(1e-9);
        lcpu.push(cpu * share);
        let _ = fs::remove_dir(&run_dir);
    }
    let samples = Samples {
        rc,
        rr,
        lc,
        lr,
        rcpu,
        lcpu,
    };
    report(samples, files, rounds, scale);
}

/// Each round's times (replay create and read, loadgen create and read) and user CPU
/// (replay, loadgen).
struct Samples {
    rc: Vec<f64>,
    rr: Vec<f64>,
    lc: Vec<f64>,
    lr: Vec<f64>,
    rcpu: Vec<f64>,
    lcpu: Vec<f64>,
}

/// The medians, their ratios, and the 0.9x floor (judged on a full-size run only).
fn report(mut s: Samples, files: f64, rounds: usize, scale: f64) {
    let (rc, rr, lc, lr) = (
        median(&mut s.rc),
        median(&mut s.rr),
        median(&mut s.lc),
        median(&mut s.lr),
    );
    let (rcpu, lcpu) = (median(&mut s.rcpu), median(&mut s.lcpu));
    println!(
        "{:<10} {:>12} {:>12} {:>22}",
        "phase", "replay s", "loadgen s", "loadgen speed / replay"
    );
    println!(
        "{:<10} {:>12.4} {:>12.4} {:>22.3}",
        "create",
        rc,
        lc,
        rc / lc
    );
    println!("{:<10} {:>12.4} {:>12.4} {:>22.3}", "read", rr, lr, rr / lr);
    println!(
        "user CPU per file (create + read): replay {:.2} us, loadgen {:.2} us",
        rcpu / files * 1e6 / 2.0,
        lcpu / files * 1e6 / 2.0
    );
    println!("compilebench (python3 port): skipped, not in PyPI, crates.io or Debian");
    let worst = (rc / lc).min(rr / lr);
    if rounds < 3 || scale < 0.5 {
        println!("(a quick run: too small and too short to judge the 0.9x floor)");
        return;
    }
    println!(
        "floor loadgen >= 0.9x replay: {} (worst phase {:.3}x)",
        if worst >= 0.9 { "met" } else { "MISSED" },
        worst
    );
}
