//! loadgen makes compilebench's calls in compilebench's order, seen with strace on the real
//! binary (doc/COMPILEBENCH.md describes the order): a tree is written in the target's own
//! readdir order, each directory made just before the first file in it; compile writes its
//! list in the seeded shuffle; read walks top-down and stat and delete bottom-up, in the
//! order the directories list their entries.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Command;

use loadgen::workload::{Datasets, Lists, Phase, Schedule, Workload};

/// One traced call on a path inside kernel-0: (syscall, path relative to the tree).
type Call = (String, String);

/// Runs loadgen under strace; returns the calls on kernel-0 of client 0, in order.
fn traced(dir: &Path, phases: &str, scale: &str) -> Vec<Call> {
    let log = dir.join("strace.log");
    let target = dir.join("target");
    std::fs::create_dir(&target).expect("mkdir");
    let st = Command::new("strace")
        .args(["-f", "-qq", "-o"])
        .arg(&log)
        .args([
            "-e",
            "trace=openat,mkdir,mkdirat,unlink,unlinkat,rmdir,newfstatat,statx",
        ])
        .arg(env!("CARGO_BIN_EXE_loadgen"))
        .arg("compilebench")
        .arg(&target)
        .args(["--phases", phases, "--scale", scale, "--no-sync", "--keep"])
        .output()
        .expect("strace not found: scripts/setup installs it");
    assert!(
        st.status.success(),
        "{}{}",
        String::from_utf8_lossy(&st.stdout),
        String::from_utf8_lossy(&st.stderr)
    );
    let text = std::fs::read_to_string(&log).expect("log");
    let mut calls = Vec::new();
    for line in text.lines() {
        if line.contains("resumed>") {
            continue;
        }
        let Some(call) = line.split_whitespace().nth(1) else {
            continue;
        };
        let Some(name) = call.split('(').next() else {
            continue;
        };
        let Some(q) = line.find('"') else { continue };
        let Some(end) = line[q + 1..].find('"') else {
            continue;
        };
        let path = &line[q + 1..q + 1 + end];
        let Some(i) = path.find("/client-0/kernel-0") else {
            continue;
        };
        let rel = path[i + "/client-0/kernel-0".len()..].trim_start_matches('/');
        let kind = match name {
            "openat" if line.contains("O_CREAT") => "create",
            "openat" if line.contains("O_DIRECTORY") => "opendir",
            "openat" => "open",
            "newfstatat" | "statx" => "stat",
            "unlinkat" if line.contains("AT_REMOVEDIR") => "rmdir",
            "unlinkat" => "unlink",
            "mkdirat" => "mkdir",
            other => other,
        };
        calls.push((kind.to_string(), rel.to_string()));
    }
    calls
}

/// A directory's files and subdirectories (paths relative to `root`), in listing order.
fn list(root: &Path, rel: &str) -> (Vec<String>, Vec<String>) {
    let (mut files, mut subs) = (Vec::new(), Vec::new());
    for e in std::fs::read_dir(root.join(rel)).expect("ls") {
        let e = e.expect("entry");
        let name = e.file_name().to_string_lossy().into_owned();
        let p = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        if e.file_type().expect("type").is_dir() {
            subs.push(p);
        } else {
            files.push(p);
        }
    }
    (files, subs)
}

/// The files below `root` as os.walk top-down gives them: a directory's files in its
/// listing order, then its subdirectories, each in turn.
fn walk_top_down(root: &Path, rel: &str, out: &mut Vec<String>, dirs: &mut Vec<String>) {
    let (files, subs) = list(root, rel);
    out.extend(files);
    for s in subs {
        dirs.push(s.clone());
        walk_top_down(root, &s, out, dirs);
    }
}

/// The same, bottom-up: each directory after its subdirectories, its files then its
/// subdirectories named in its listing order.
fn walk_bottom_up(root: &Path, rel: &str, out: &mut Vec<String>) {
    let (files, subs) = list(root, rel);
    for s in &subs {
        walk_bottom_up(root, s, out);
    }
    out.extend(files);
    out.extend(subs);
}

fn of<'a>(calls: &'a [Call], kind: &str) -> Vec<&'a str> {
    calls
        .iter()
        .filter(|(k, _)| k == kind)
        .map(|(_, p)| p.as_str())
        .collect()
}

/// Asserts two sequences are equal, naming the first place they differ (not whole lists).
fn same_order<A: AsRef<str>, B: AsRef<str>>(got: &[A], want: &[B], what: &str) {
    let first = got
        .iter()
        .zip(want)
        .position(|(a, b)| a.as_ref() != b.as_ref());
    if let Some(i) = first {
        panic!(
            "{what}: at {i} of {} got {:?}, expected {:?}",
            want.len(),
            got[i].as_ref(),
            want[i].as_ref()
        );
    }
    assert_eq!(got.len(), want.len(), "{what}: lengths");
}

fn parent(p: &str) -> &str {
    p.rsplit_once('/').map(|(d, _)| d).unwrap_or("")
}

#[test]
fn a_tree_is_written_in_readdir_order_each_directory_just_before_its_files() {
    let tmp = tempfile::tempdir().expect("tmp");
    let calls = traced(tmp.path(), "create,stat-tree,read-tree", "0.05");
    let w = Workload::compilebench(
        &Datasets::embedded(),
        0.05,
        555,
        &Schedule::Phases(vec![Phase::Create]),
        false,
    );
    // The native order, found here independently: the list made as a tree of empty files
    // in sorted order on the same filesystem, walked top-down.
    let probe = tmp.path().join("probe");
    for e in &w.lists.unpatched {
        let p = probe.join(&e.path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    }
    let mut sorted: Vec<&str> = w.lists.unpatched.iter().map(|e| e.path.as_str()).collect();
    sorted.sort();
    for p in &sorted {
        std::fs::write(probe.join(p), b"").expect("write");
    }
    let mut native = Vec::new();
    walk_top_down(&probe, "", &mut native, &mut Vec::new());
    let creates = of(&calls, "create");
    assert_eq!(creates.len(), w.lists.unpatched.len());
    same_order(
        &creates,
        &native,
        "files written in the target's readdir order",
    );

    // Directory timing: each directory is made (its parent stated first) right before the
    // first file in it or below it, and no file comes before its directory.
    let create_calls: Vec<&Call> = calls
        .iter()
        .take_while(|(k, p)| !(k == "opendir" && p.is_empty()))
        .collect();
    let mut made: BTreeSet<&str> = BTreeSet::new();
    made.insert("");
    let mut pending_mkdirs: Vec<&str> = Vec::new();
    for (k, p) in &create_calls {
        match k.as_str() {
            "mkdir" => {
                assert!(made.contains(parent(p)), "{p} made before its parent");
                made.insert(p);
                pending_mkdirs.push(p);
            }
            "create" => {
                assert!(made.contains(parent(p)), "{p} written before its directory");
                for d in pending_mkdirs.drain(..) {
                    assert!(
                        parent(p) == d || parent(p).starts_with(&format!("{d}/")),
                        "{d} was made before another directory's files ({p})"
                    );
                }
            }
            _ => {}
        }
    }
    assert_eq!(
        made.len() - 1,
        Lists::dirs(&w.lists.unpatched).len(),
        "every directory made once"
    );

    // The walks, against the tree as the run left it (kept, unchanged since).
    let tree = std::fs::read_dir(tmp.path().join("target"))
        .expect("ls")
        .map(|e| e.expect("e").path())
        .find(|p| p.to_string_lossy().contains("loadgen-run-"))
        .expect("run dir")
        .join("client-0/kernel-0");
    let mut top_down = Vec::new();
    let mut dirs = Vec::new();
    walk_top_down(&tree, "", &mut top_down, &mut dirs);
    let reads = of(&calls, "open");
    same_order(&reads, &top_down, "read walks top-down in listing order");
    // Top-down, every subdirectory is looked at (os.walk's symlink check) then listed,
    // just before it is gone into.
    let listed: Vec<&str> = of(&calls, "opendir");
    let n = listed.len();
    assert_eq!(
        n,
        2 * (dirs.len() + 1),
        "stat and read each list every directory"
    );
    let mut bottom_up = Vec::new();
    walk_bottom_up(&tree, "", &mut bottom_up);
    let stat_at = calls
        .iter()
        .position(|(k, p)| k == "opendir" && p.is_empty())
        .expect("stat walk");
    let read_at = calls
        .iter()
        .rposition(|(k, p)| k == "opendir" && p.is_empty())
        .expect("read walk");
    let stats: Vec<&str> = calls[stat_at..read_at]
        .iter()
        .filter(|(k, _)| k == "stat")
        .map(|(_, p)| p.as_str())
        .collect();
    same_order(
        &stats,
        &bottom_up,
        "stat walks bottom-up: a directory's files, then its subdirectories",
    );
}

#[test]
fn compile_follows_the_shuffle_and_delete_goes_bottom_up() {
    let tmp = tempfile::tempdir().expect("tmp");
    let calls = traced(tmp.path(), "create,compile,delete-compiled", "0.03");
    let w = Workload::compilebench(
        &Datasets::embedded(),
        0.03,
        555,
        &Schedule::Phases(vec![Phase::Create]),
        false,
    );
    let creates = of(&calls, "create");
    let n = w.lists.unpatched.len();
    let compile: Vec<&str> = w.lists.compile.iter().map(|e| e.path.as_str()).collect();
    same_order(&creates[n..], &compile, "compile in the seeded shuffle");
    // Delete: every file and directory goes, each directory after everything in it, and
    // a directory's files one after another.
    let unlinks = of(&calls, "unlink");
    let rmdirs = of(&calls, "rmdir");
    assert_eq!(unlinks.len(), n + compile.len());
    let when: HashMap<(&str, &str), usize> = calls
        .iter()
        .enumerate()
        .map(|(i, (k, p))| ((k.as_str(), p.as_str()), i))
        .collect();
    for d in &rmdirs {
        let at = when[&("rmdir", *d)];
        for f in &unlinks {
            if f.starts_with(&format!("{d}/")) {
                assert!(when[&("unlink", *f)] < at, "{d} removed before {f}");
            }
        }
    }
    let mut seen_dirs: Vec<&str> = Vec::new();
    for f in &unlinks {
        let d = parent(f);
        if seen_dirs.last() != Some(&d) {
            assert!(
                !seen_dirs.contains(&d),
                "{d}'s files are not removed one after another"
            );
            seen_dirs.push(d);
        }
    }
    let all: Vec<_> = w
        .lists
        .unpatched
        .iter()
        .chain(&w.lists.compile)
        .cloned()
        .collect();
    assert_eq!(
        rmdirs.len(),
        Lists::dirs(&all).len(),
        "every directory, the tree's own kept"
    );
}

/// The random mode picks the operations and trees compilebench 0.6 picks, checked against
/// the script itself when $LOADGEN_COMPILEBENCH names it (its directory must hold its
/// dataset files). The script carries no license statement, so it is not shipped and this
/// comparison is opt-in: `LOADGEN_COMPILEBENCH=/path/to/compilebench cargo test -p loadgen
/// --test order` (doc/COMPILEBENCH.md).
#[test]
fn random_mode_matches_the_compilebench_script() {
    let Some(script) = std::env::var_os("LOADGEN_COMPILEBENCH") else {
        e2e::skip("LOADGEN_COMPILEBENCH is not set (the comparison with compilebench's own script is opt-in: doc/COMPILEBENCH.md)");
        return;
    };
    let script = Path::new(&script);
    let data = script.parent().expect("its directory");
    let tmp = tempfile::tempdir().expect("tmp");
    let (initial, runs) = ("2", "14");
    let o = Command::new("python3")
        .arg(script)
        .arg("-D")
        .arg(tmp.path().join("cb"))
        .arg("-s")
        .arg(data)
        .args(["-i", initial, "-r", runs, "-n"])
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Its log: "create dir kernel-0 ...", "patch dir kernel-5 ...", "clean kernel-5 ...",
    // "delete kernel-5 in ...", "read dir ...", "stat dir ...".
    let theirs: Vec<(String, String)> = String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let op = match (w.first()?, w.get(1)) {
                (&"create", Some(&"dir")) => "create",
                (&"patch", Some(&"dir")) => "patch",
                (&"compile", Some(&"dir")) => "compile",
                (&"read", Some(&"dir")) => "read",
                (&"stat", Some(&"dir")) => "stat",
                (&"clean", _) => "clean",
                (&"delete", _) => "delete",
                _ => return None,
            };
            let tree = w.iter().find(|x| x.starts_with("kernel-"))?;
            Some((op.to_string(), tree.to_string()))
        })
        .collect();
    let target = tmp.path().join("lg");
    std::fs::create_dir(&target).expect("mkdir");
    let json = tmp.path().join("r.json");
    let o = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .arg("compilebench")
        .arg(&target)
        .args([
            "--initial-dirs",
            initial,
            "--runs",
            runs,
            "--no-sync",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("loadgen");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json")).expect("parse");
    let ours: Vec<(String, String)> = v["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .map(|p| {
            let name = p["name"].as_str().expect("name");
            let op = name
                .trim_start_matches("initial-")
                .split('-')
                .next()
                .expect("op");
            (op.to_string(), format!("kernel-{}", p["tree"]))
        })
        .collect();
    assert_eq!(ours, theirs, "the same operations on the same trees");
}
