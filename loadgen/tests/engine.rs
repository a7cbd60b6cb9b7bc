//! The engine on a real directory: what each round leaves on disk (against a model of the
//! schedule), the start barrier, histogram merging, and that a delete stays inside the tree.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use loadgen::engine::{self, Config, Latencies, Op, Progress};
use loadgen::workload::{Action, Datasets, Lists, Phase, Schedule, Workload};

fn workload(scale: f64, phases: &[Phase]) -> Arc<Workload> {
    Arc::new(Workload::compilebench(
        &Datasets::embedded(),
        scale,
        555,
        &Schedule::Phases(phases.to_vec()),
        false,
    ))
}

fn config(dir: &Path, clients: usize, w: Arc<Workload>) -> Config {
    Config {
        target: loadgen::store::Target::Local(dir.to_path_buf()),
        run_dir: dir.to_path_buf(),
        clients,
        client_base: 0,
        workload: w,
        write_size: 256 * 1024,
        fsync: false,
        drop_caches: false,
        read_other: false,
        native_order: true,
        cleanup: false,
        threads: Config::default_threads(clients),
        phase_timeout: None,
        direct: false,
    }
}

fn run(cfg: &Config) -> Vec<engine::PhaseResult> {
    engine::run(cfg, &Progress::default(), &AtomicBool::new(false), |_| {}).phases
}

/// Every regular file below `root`: relative path -> size.
fn walk(root: &Path) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(dir) = std::fs::read_dir(root.join(&rel)) else {
            continue;
        };
        for e in dir {
            let e = e.expect("entry");
            let r = rel.join(e.file_name());
            let m = e.metadata().expect("meta");
            if m.is_dir() {
                stack.push(r);
            } else {
                out.insert(r.to_string_lossy().into_owned(), m.len());
            }
        }
    }
    out
}

/// What the schedule's steps leave, played on a plain model: a write appends to a file
/// (after truncating it when the step reads it first), clean unlinks its list, a delete
/// empties the tree.
fn model(w: &Workload) -> BTreeMap<String, u64> {
    let mut files: BTreeMap<String, u64> = BTreeMap::new();
    for r in &w.rounds {
        for s in r.prepare.iter().chain(std::iter::once(&r.timed)) {
            let prefix = format!("kernel-{}/", s.tree);
            match s.action {
                Action::Write {
                    list, read_first, ..
                } => {
                    for e in w.lists.get(list) {
                        let size = files.entry(format!("{prefix}{}", e.path)).or_insert(0);
                        *size = if read_first { e.size } else { *size + e.size };
                    }
                }
                Action::Unlink { list } => {
                    for e in w.lists.get(list) {
                        assert!(
                            files.remove(&format!("{prefix}{}", e.path)).is_some(),
                            "clean of a file not there"
                        );
                    }
                }
                Action::Overwrite { list } => {
                    for e in w.lists.get(list) {
                        let size = files.entry(format!("{prefix}{}", e.path)).or_insert(0);
                        *size = (*size).max(e.size);
                    }
                }
                Action::Delete => files.retain(|k, _| !k.starts_with(&prefix)),
                Action::Read | Action::Stat => {}
            }
        }
    }
    files
}

#[test]
fn every_phase_sequence_leaves_the_files_its_schedule_says() {
    use Phase::*;
    let cases: Vec<Vec<Phase>> = vec![
        vec![Create],
        vec![Create, Compile],
        vec![Compile, Clean],
        vec![Patch],
        vec![Patch, Compile],
        vec![Patch, Compile, Clean, ReadTree],
        // Patching a compiled tree, then reading it (it stopped with ENOENT once).
        vec![Create, Compile, Patch, ReadCompiled],
        vec![Compile, Patch, Clean, StatTree, DeleteTree],
        vec![Patch, Patch, DeleteTree],
        vec![Compile, DeleteCompiled, StatCompiled],
        vec![InitialCreate, Create, ReadTree],
    ];
    for phases in cases {
        let w = workload(0.03, &phases);
        let tmp = tempfile::tempdir().expect("tmp");
        let results = run(&config(tmp.path(), 1, w.clone()));
        assert_eq!(results.len(), phases.len());
        for (r, p) in results.iter().zip(&phases) {
            assert_eq!(r.phase, *p);
            assert!(r.error().is_none(), "{phases:?}: {:?}", r.error());
            let c = &r.clients[0];
            assert!(c.files + c.dirs > 0, "{phases:?}: {} did no work", p.name());
        }
        assert_eq!(
            walk(&tmp.path().join("client-0")),
            model(&w),
            "after {phases:?}"
        );
    }
}

#[test]
fn create_writes_and_read_reads_every_byte() {
    let w = workload(0.02, &[Phase::Create, Phase::ReadTree]);
    let tree = &w.lists.unpatched;
    let tmp = tempfile::tempdir().expect("tmp");
    let r = run(&config(tmp.path(), 2, w.clone()));
    for c in &r[0].clients {
        assert_eq!(c.bytes, Lists::bytes(tree));
        assert_eq!(c.files, tree.len() as u64);
        assert_eq!(c.dirs, Lists::dirs(tree).len() as u64 + 1, "the root too");
    }
    for c in &r[1].clients {
        assert_eq!(c.bytes, Lists::bytes(tree), "read must read the whole tree");
        assert_eq!(c.files, tree.len() as u64);
    }
    let writes = r[0].latencies.count(Op::Write);
    let expected_writes: u64 = tree
        .iter()
        .map(|f| f.size.div_ceil(256 * 1024))
        .sum::<u64>()
        * 2;
    assert_eq!(writes, expected_writes, "256 KiB writes, as compilebench");
    assert_eq!(r[0].latencies.count(Op::Open), 2 * tree.len() as u64);
    // Every file read ends with one read that finds the end, counted apart.
    assert_eq!(r[1].latencies.count(Op::ReadEof), 2 * tree.len() as u64);
    let data_reads: u64 = tree
        .iter()
        .map(|f| f.size.div_ceil(256 * 1024))
        .sum::<u64>()
        * 2;
    assert_eq!(r[1].latencies.count(Op::Read), data_reads);
    // A fresh tree's directories are all made: no mkdir failed.
    assert_eq!(
        r[0].latencies.count(Op::Mkdir),
        2 * (Lists::dirs(tree).len() as u64 + 1)
    );
}

/// The start barrier, seen on disk: when every client has prepared a round and none has
/// started it (the moment `run_with_gate` calls the gate), every client's preparation is
/// complete and no client's timed work has begun.
#[test]
fn clients_start_each_round_together() {
    let tmp = tempfile::tempdir().expect("tmp");
    let clients = 6;
    // Create (nothing to prepare), DeleteTree (nothing to prepare), StatTree (prepared by
    // creating a new tree, untimed).
    let phases = [Phase::Create, Phase::DeleteTree, Phase::StatTree];
    let w = workload(0.01, &phases);
    let cfg = config(tmp.path(), clients, w.clone());
    let at_gate: std::sync::Mutex<Vec<(usize, BTreeMap<String, u64>)>> = Default::default();
    let gate = |i: usize| {
        let seen = walk(tmp.path());
        at_gate.lock().expect("lock").push((i, seen));
        true
    };
    let r = engine::run_with_gate(
        &cfg,
        &Progress::default(),
        &AtomicBool::new(false),
        &gate,
        |_| {},
    )
    .phases;
    assert_eq!(r.len(), phases.len());
    for p in &r {
        assert!(p.error().is_none(), "{}: {:?}", p.phase.name(), p.error());
        assert_eq!(p.clients.len(), clients);
        for c in &p.clients {
            assert!(c.end >= c.start);
        }
        assert!(p.first_done() <= p.last_done());
    }
    // Every client's tree `t`, complete, as paths below the run directory.
    let trees = |t: u32| -> BTreeMap<String, u64> {
        (0..clients)
            .flat_map(|c| {
                w.lists
                    .unpatched
                    .iter()
                    .map(move |e| (format!("client-{c}/kernel-{t}/{}", e.path), e.size))
            })
            .collect()
    };
    let at_gate = at_gate.into_inner().expect("lock");
    let at = |i: usize| {
        &at_gate
            .iter()
            .find(|(g, _)| *g == i)
            .expect("gate called")
            .1
    };
    assert_eq!(at_gate.len(), phases.len(), "one gate a round");
    assert!(
        at(0).is_empty(),
        "no client began creating before the others"
    );
    assert_eq!(
        *at(1),
        trees(0),
        "no client began deleting before the others"
    );
    assert_eq!(
        *at(2),
        trees(1),
        "every client had prepared its new tree before any began"
    );
}

#[test]
fn merged_histograms_equal_one_histogram_of_all_values() {
    let mut a = Latencies::new();
    let mut b = Latencies::new();
    let mut all = Latencies::new();
    for i in 1..=5000u64 {
        let d = Duration::from_nanos(i * 37 % 100_000 + 1);
        if i % 3 == 0 {
            a.record(Op::Write, d);
        } else {
            b.record(Op::Write, d);
        }
        all.record(Op::Write, d);
    }
    b.record(Op::Read, Duration::from_micros(5));
    all.record(Op::Read, Duration::from_micros(5));
    let mut m = Latencies::new();
    m.merge(&a);
    m.merge(&b);
    for op in [Op::Write, Op::Read] {
        let (x, y) = (m.get(op).expect("merged"), all.get(op).expect("all"));
        assert_eq!(x.len(), y.len());
        assert_eq!(x.max(), y.max());
        for q in [0.5, 0.9, 0.99, 0.999] {
            assert_eq!(
                x.value_at_quantile(q),
                y.value_at_quantile(q),
                "{op:?} q{q}"
            );
        }
    }
}

/// A delete walks the tree without following symlinks: a link to a directory outside
/// goes, what it points at stays.
#[test]
fn delete_stays_inside_the_tree() {
    let w = workload(0.01, &[Phase::Create, Phase::DeleteTree]);
    let tmp = tempfile::tempdir().expect("tmp");
    let outside = tempfile::tempdir().expect("outside");
    std::fs::write(outside.path().join("precious.txt"), "not loadgen's").expect("write");
    let run_dir = tmp.path().join("run");
    std::fs::create_dir(&run_dir).expect("mkdir");
    let mut cfg = config(&run_dir, 1, w.clone());
    cfg.run_dir = run_dir.clone();
    // The create runs, then, at the gate of the delete, a link appears in the tree.
    let gate = |i: usize| {
        if i == 1 {
            std::os::unix::fs::symlink(
                outside.path(),
                run_dir
                    .join("client-0/kernel-0")
                    .join(&Lists::dirs(&w.lists.unpatched)[0])
                    .join("link"),
            )
            .expect("symlink");
        }
        true
    };
    let r = engine::run_with_gate(
        &cfg,
        &Progress::default(),
        &AtomicBool::new(false),
        &gate,
        |_| {},
    )
    .phases;
    assert!(
        r.iter().all(|p| p.error().is_none()),
        "{:?}",
        r.last().and_then(|p| p.error())
    );
    assert_eq!(
        std::fs::read_to_string(outside.path().join("precious.txt")).expect("kept"),
        "not loadgen's"
    );
    assert!(
        walk(&run_dir.join("client-0")).is_empty(),
        "the tree is gone"
    );
}

/// The data cannot be deduplicated: two files of one size differ, and so do the pieces of
/// one file; and a file's content is the same in every run (the NFS target is compared
/// with a local run byte for byte).
#[test]
fn written_data_does_not_repeat_and_is_the_same_every_run() {
    let w = workload(0.05, &[Phase::Compile]);
    let trees: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("tmp")).collect();
    for t in &trees {
        let r = run(&config(t.path(), 1, w.clone()));
        assert!(r[0].error().is_none());
    }
    let read = |t: &tempfile::TempDir, p: &str| {
        std::fs::read(t.path().join("client-0/kernel-0").join(p)).expect("read")
    };
    let big: Vec<&str> = w
        .lists
        .compile
        .iter()
        .filter(|e| e.size > 512 * 1024)
        .map(|e| e.path.as_str())
        .take(2)
        .collect();
    assert_eq!(big.len(), 2, "two files of more than two pieces");
    let (a, b) = (read(&trees[0], big[0]), read(&trees[0], big[1]));
    let piece = 256 * 1024;
    assert_ne!(a[..piece], b[..piece], "two files begin alike");
    assert_ne!(a[..piece], a[piece..2 * piece], "a file's pieces repeat");
    assert_eq!(
        a,
        read(&trees[1], big[0]),
        "the same content in another run"
    );
}
