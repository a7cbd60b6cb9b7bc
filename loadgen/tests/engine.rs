//! The engine on a real directory: what each phase leaves on disk, the start barrier,
//! histogram merging, and that only loadgen's own files are ever deleted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use loadgen::engine::{self, Config, Latencies, Op, Progress};
use loadgen::workload::{self, Datasets, Phase, Sets, TreeState};

fn sets(scale: f64) -> Arc<Sets> {
    Arc::new(Sets::derive(&Datasets::embedded()).scaled(scale))
}

fn config(dir: &Path, clients: usize, phases: &[Phase], sets: Arc<Sets>) -> Config {
    Config {
        target: loadgen::store::Target::Local(dir.to_path_buf()),
        run_dir: dir.to_path_buf(),
        clients,
        phases: phases.to_vec(),
        sets,
        write_size: 256 * 1024,
        fsync: false,
        sync: false,
        drop_caches: false,
        read_other: false,
        cleanup: false,
    }
}

fn run(cfg: &Config) -> Vec<engine::PhaseResult> {
    engine::run(cfg, &Progress::default(), &AtomicBool::new(false), |_| {})
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

fn expected(sets: &Sets, state: TreeState) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    if state.exists && state.patched {
        // A patched tree: the source, with the patch set's files at their new sizes.
        for f in sets.source.files.iter().chain(&sets.patch.files) {
            out.insert(f.path.clone(), f.size);
        }
        if state.compiled {
            for f in &sets.compile_patched.files {
                out.insert(f.path.clone(), f.size);
            }
        }
        return out;
    }
    for set in workload::tree_files(sets, state) {
        for f in &set.files {
            out.insert(f.path.clone(), f.size);
        }
    }
    out
}

#[test]
fn each_phase_leaves_exactly_the_expected_files() {
    let s = sets(0.03);
    let cases: Vec<(Vec<Phase>, TreeState)> = vec![
        (
            vec![Phase::Create],
            TreeState {
                exists: true,
                ..Default::default()
            },
        ),
        (
            vec![Phase::Create, Phase::Compile],
            TreeState {
                exists: true,
                compiled: true,
                patched: false,
            },
        ),
        (
            vec![Phase::Compile, Phase::Clean],
            TreeState {
                exists: true,
                ..Default::default()
            },
        ),
        (
            vec![Phase::Patch],
            TreeState {
                exists: true,
                patched: true,
                compiled: false,
            },
        ),
        (
            vec![Phase::Patch, Phase::Compile],
            TreeState {
                exists: true,
                patched: true,
                compiled: true,
            },
        ),
        (vec![Phase::Patch, Phase::DeleteTree], TreeState::default()),
        (
            vec![Phase::ReadCompiled, Phase::StatCompiled],
            TreeState {
                exists: true,
                compiled: true,
                patched: false,
            },
        ),
        (
            vec![Phase::ReadTree, Phase::StatTree],
            TreeState {
                exists: true,
                ..Default::default()
            },
        ),
        (vec![Phase::Create, Phase::DeleteTree], TreeState::default()),
        (
            vec![Phase::Compile, Phase::DeleteCompiled],
            TreeState::default(),
        ),
    ];
    for (phases, state) in cases {
        let tmp = tempfile::tempdir().expect("tmp");
        let results = run(&config(tmp.path(), 1, &phases, s.clone()));
        assert_eq!(results.len(), phases.len());
        for r in &results {
            assert!(r.error().is_none(), "{phases:?}: {:?}", r.error());
        }
        let trees: Vec<_> = std::fs::read_dir(tmp.path().join("client-0"))
            .map(|d| d.map(|e| e.expect("e").path()).collect())
            .unwrap_or_default();
        let found = trees
            .iter()
            .map(|t| walk(t))
            .fold(BTreeMap::new(), |mut a, b| {
                a.extend(b);
                a
            });
        assert_eq!(found, expected(&s, state), "after {phases:?}");
        // The phase reports what it did.
        let last = results.last().expect("phase");
        let files: u64 = last.clients.iter().map(|c| c.files).sum();
        assert!(files > 0, "{phases:?}: the timed phase did work");
    }
}

#[test]
fn create_writes_and_read_reads_every_byte() {
    let s = sets(0.02);
    let tmp = tempfile::tempdir().expect("tmp");
    let r = run(&config(
        tmp.path(),
        2,
        &[Phase::Create, Phase::ReadTree],
        s.clone(),
    ));
    for c in &r[0].clients {
        assert_eq!(c.bytes, s.source.bytes());
        assert_eq!(c.files, s.source.len() as u64);
    }
    for c in &r[1].clients {
        assert_eq!(c.bytes, s.source.bytes(), "read must read the whole tree");
    }
    let writes = r[0].latencies.count(Op::Write);
    let expected_writes: u64 = s
        .source
        .files
        .iter()
        .map(|f| f.size.div_ceil(256 * 1024))
        .sum::<u64>()
        * 2;
    assert_eq!(writes, expected_writes, "256 KiB writes, as compilebench");
    assert_eq!(r[0].latencies.count(Op::Open), 2 * s.source.len() as u64);
}

/// The start barrier, seen on disk: when every client has prepared a phase and none has
/// started it (the moment `run_with_gate` calls the gate), every client's preparation is
/// complete and no client's timed work has begun.
#[test]
fn clients_start_each_phase_together() {
    let s = sets(0.01);
    let tmp = tempfile::tempdir().expect("tmp");
    let clients = 6;
    // Create (nothing to prepare), DeleteTree (nothing to prepare), StatTree (prepared by
    // creating a new tree, untimed).
    let phases = [Phase::Create, Phase::DeleteTree, Phase::StatTree];
    let cfg = config(tmp.path(), clients, &phases, s.clone());
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
    );
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
        let one = expected(
            &s,
            TreeState {
                exists: true,
                ..Default::default()
            },
        );
        (0..clients)
            .flat_map(|c| {
                one.iter()
                    .map(move |(p, n)| (format!("client-{c}/tree-{t}/{p}"), *n))
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
    assert_eq!(at_gate.len(), phases.len(), "one gate a phase");
    assert!(
        at(0).is_empty(),
        "no client began creating before the others"
    );
    assert_eq!(
        *at(1),
        trees(1),
        "no client began deleting before the others"
    );
    assert_eq!(
        *at(2),
        trees(2),
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
        let (x, y) = (m.get(op), all.get(op));
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

#[test]
fn delete_leaves_files_loadgen_did_not_create() {
    let s = sets(0.01);
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = config(tmp.path(), 1, &[Phase::Create], s.clone());
    run(&cfg);
    let tree = tmp.path().join("client-0/tree-1");
    let foreign_dir = tree.join(&s.source.dirs[0]);
    std::fs::write(foreign_dir.join("precious.txt"), "not loadgen's").expect("foreign");
    // Same run dir, a new run that deletes its tree: our files go, the foreign one stays.
    let mut cfg = config(tmp.path(), 1, &[Phase::Create, Phase::DeleteTree], s);
    cfg.run_dir = tmp.path().to_path_buf();
    let r = engine::run(&cfg, &Progress::default(), &AtomicBool::new(false), |_| {});
    assert!(r.iter().all(|p| p.error().is_none()));
    // tree-1 of this run is the same directory: its own files were deleted first.
    assert_eq!(
        std::fs::read_to_string(foreign_dir.join("precious.txt")).expect("kept"),
        "not loadgen's"
    );
    assert!(
        r[1].clients[0]
            .warnings
            .iter()
            .any(|w| w.contains("did not create")),
        "{:?}",
        r[1].clients[0].warnings
    );
}
