//! The compilebench workload, pure: the kernel-tree file lists, the file set of each phase,
//! and which tree state each phase needs and leaves.
//!
//! The lists ship in `data/compilebench/` (see SOURCE.txt there for their origin and how each
//! phase's set is derived, which this module follows).

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One file of a tree: path relative to the tree root, size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    pub size: u64,
}

/// A set of files and the directories they imply (parents first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileSet {
    pub files: Vec<Entry>,
    pub dirs: Vec<String>,
}

impl FileSet {
    /// A set from a list of files (sorted; directories derived).
    pub fn from_files(files: Vec<Entry>) -> Self {
        Self::new(files)
    }

    fn new(mut files: Vec<Entry>) -> Self {
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let mut dirs = BTreeSet::new();
        for f in &files {
            let mut p = f.path.as_str();
            while let Some((parent, _)) = p.rsplit_once('/') {
                if !dirs.insert(parent.to_string()) {
                    break;
                }
                p = parent;
            }
        }
        // Parents sort before their children (a prefix sorts first).
        Self {
            files,
            dirs: dirs.into_iter().collect(),
        }
    }

    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Keeps a deterministic fraction of the files (by a hash of the path, so the same file
    /// is kept or dropped in every set).
    pub fn scaled(&self, scale: f64) -> Self {
        if scale >= 1.0 {
            return self.clone();
        }
        FileSet::new(
            self.files
                .iter()
                .filter(|f| keep(&f.path, scale))
                .cloned()
                .collect(),
        )
    }
}

fn keep(path: &str, scale: f64) -> bool {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % 1_000_000) as f64 / 1_000_000.0 < scale
}

/// Parses a dataset file: one `path size` a line.
pub fn parse(text: &str) -> Result<Vec<Entry>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let (path, size) = line
            .rsplit_once(char::is_whitespace)
            .ok_or_else(|| format!("line {}: expected `path size`", n + 1))?;
        let size = size
            .trim()
            .parse()
            .map_err(|_| format!("line {}: bad size {size:?}", n + 1))?;
        let path = path.trim();
        if path.starts_with('/') || path.split('/').any(|c| c == ".." || c.is_empty()) {
            return Err(format!("line {}: unsafe path {path:?}", n + 1));
        }
        out.push(Entry {
            path: path.to_string(),
            size,
        });
    }
    Ok(out)
}

/// The four compilebench lists.
#[derive(Debug, Clone)]
pub struct Datasets {
    pub unpatched: Vec<Entry>,
    pub unpatched_compiled: Vec<Entry>,
    pub patched: Vec<Entry>,
    pub patched_compiled: Vec<Entry>,
}

impl Datasets {
    /// The lists shipped inside loadgen.
    pub fn embedded() -> Self {
        let p = |t: &str| parse(t).unwrap_or_default();
        Self {
            unpatched: p(include_str!("../data/compilebench/dataset-unpatched")),
            unpatched_compiled: p(include_str!(
                "../data/compilebench/dataset-unpatched-compiled"
            )),
            patched: p(include_str!("../data/compilebench/dataset-patched")),
            patched_compiled: p(include_str!(
                "../data/compilebench/dataset-patched-compiled"
            )),
        }
    }
}

fn minus_names(set: &[Entry], names: &[Entry]) -> Vec<Entry> {
    let names: BTreeSet<&str> = names.iter().map(|e| e.path.as_str()).collect();
    set.iter()
        .filter(|e| !names.contains(e.path.as_str()))
        .cloned()
        .collect()
}

/// Every file set the phases use, derived as compilebench does.
#[derive(Debug, Clone)]
pub struct Sets {
    /// A clean unpatched tree (create, read, delete, stat).
    pub source: FileSet,
    /// A clean patched tree.
    pub patched_source: FileSet,
    /// What a patched tree holds: the unpatched tree with the patch written over it
    /// (patching writes new and changed files; it removes nothing).
    pub patched_tree: FileSet,
    /// What compiling an unpatched tree adds (and clean removes).
    pub compile: FileSet,
    /// What patching an unpatched tree writes.
    pub patch: FileSet,
    /// What compiling a patched tree adds.
    pub compile_patched: FileSet,
}

impl Sets {
    pub fn derive(d: &Datasets) -> Self {
        let compile_only = minus_names(&d.unpatched_compiled, &d.unpatched);
        let unpatched_size: HashMap<&str, u64> = d
            .unpatched
            .iter()
            .map(|e| (e.path.as_str(), e.size))
            .collect();
        let patch: Vec<Entry> = d
            .patched
            .iter()
            .filter(|e| unpatched_size.get(e.path.as_str()) != Some(&e.size))
            .cloned()
            .collect();
        let compile_only_size: BTreeSet<(&str, u64)> = compile_only
            .iter()
            .map(|e| (e.path.as_str(), e.size))
            .collect();
        let compile_patched: Vec<Entry> = minus_names(&d.patched_compiled, &d.patched)
            .into_iter()
            .filter(|e| !compile_only_size.contains(&(e.path.as_str(), e.size)))
            .collect();
        let mut patched_tree: BTreeMap<&str, u64> = d
            .unpatched
            .iter()
            .map(|e| (e.path.as_str(), e.size))
            .collect();
        for e in &patch {
            patched_tree.insert(e.path.as_str(), e.size);
        }
        let patched_tree = patched_tree
            .into_iter()
            .map(|(path, size)| Entry {
                path: path.to_string(),
                size,
            })
            .collect();
        Self {
            source: FileSet::new(d.unpatched.clone()),
            patched_source: FileSet::new(d.patched.clone()),
            patched_tree: FileSet::new(patched_tree),
            compile: FileSet::new(compile_only),
            patch: FileSet::new(patch),
            compile_patched: FileSet::new(compile_patched),
        }
    }

    pub fn scaled(&self, scale: f64) -> Self {
        Self {
            source: self.source.scaled(scale),
            patched_source: self.patched_source.scaled(scale),
            patched_tree: self.patched_tree.scaled(scale),
            compile: self.compile.scaled(scale),
            patch: self.patch.scaled(scale),
            compile_patched: self.compile_patched.scaled(scale),
        }
    }
}

/// The phases, named as compilebench reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    InitialCreate,
    Create,
    Patch,
    Compile,
    Clean,
    ReadTree,
    ReadCompiled,
    DeleteTree,
    DeleteCompiled,
    StatTree,
    StatCompiled,
}

pub const ALL_PHASES: [Phase; 11] = [
    Phase::InitialCreate,
    Phase::Create,
    Phase::Patch,
    Phase::Compile,
    Phase::Clean,
    Phase::ReadTree,
    Phase::ReadCompiled,
    Phase::DeleteTree,
    Phase::DeleteCompiled,
    Phase::StatTree,
    Phase::StatCompiled,
];

/// The blog's four headline phases, run in this order by default.
pub const DEFAULT_PHASES: [Phase; 4] = [
    Phase::Create,
    Phase::Compile,
    Phase::ReadCompiled,
    Phase::DeleteCompiled,
];

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::InitialCreate => "initial-create",
            Phase::Create => "create",
            Phase::Patch => "patch",
            Phase::Compile => "compile",
            Phase::Clean => "clean",
            Phase::ReadTree => "read-tree",
            Phase::ReadCompiled => "read-compiled",
            Phase::DeleteTree => "delete-tree",
            Phase::DeleteCompiled => "delete-compiled",
            Phase::StatTree => "stat-tree",
            Phase::StatCompiled => "stat-compiled",
        }
    }

    pub fn parse(name: &str) -> Option<Phase> {
        ALL_PHASES.iter().copied().find(|p| p.name() == name)
    }

    /// Phases that read a tree (and may read another client's with --read-other).
    pub fn reads(self) -> bool {
        matches!(
            self,
            Phase::ReadTree | Phase::ReadCompiled | Phase::StatTree | Phase::StatCompiled
        )
    }
}

/// What a client's current tree looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TreeState {
    pub exists: bool,
    pub patched: bool,
    pub compiled: bool,
}

/// The untimed steps that bring a tree into the state a phase needs, then the phase.
/// E.g. `read-compiled` on a fresh client: [create, compile] untimed, then the timed read.
pub fn plan(state: TreeState, phase: Phase) -> Vec<Phase> {
    let mut steps = Vec::new();
    let mut s = state;
    let need_tree = !matches!(phase, Phase::Create | Phase::InitialCreate);
    if need_tree && !s.exists {
        steps.push(Phase::Create);
        s = TreeState {
            exists: true,
            ..TreeState::default()
        };
    }
    let need_compiled = matches!(
        phase,
        Phase::Clean | Phase::ReadCompiled | Phase::DeleteCompiled | Phase::StatCompiled
    );
    let need_clean = matches!(
        phase,
        Phase::Compile | Phase::DeleteTree | Phase::StatTree | Phase::ReadTree
    );
    if need_compiled && !s.compiled {
        steps.push(Phase::Compile);
    }
    if need_clean && s.compiled {
        steps.push(Phase::Clean);
    }
    if phase == Phase::Patch && s.patched {
        // compilebench patches clean, unpatched trees: start a fresh one.
        steps.push(Phase::DeleteTree);
        steps.push(Phase::Create);
    }
    steps
}

/// The state a phase leaves.
pub fn after(state: TreeState, phase: Phase) -> TreeState {
    match phase {
        Phase::InitialCreate | Phase::Create => TreeState {
            exists: true,
            ..TreeState::default()
        },
        Phase::Patch => TreeState {
            patched: true,
            ..state
        },
        Phase::Compile => TreeState {
            compiled: true,
            ..state
        },
        Phase::Clean => TreeState {
            compiled: false,
            ..state
        },
        Phase::DeleteTree | Phase::DeleteCompiled => TreeState::default(),
        _ => state,
    }
}

/// The files a tree in `state` holds.
pub fn tree_files(sets: &Sets, state: TreeState) -> Vec<&FileSet> {
    let mut v = Vec::new();
    if !state.exists {
        return v;
    }
    v.push(if state.patched {
        &sets.patched_tree
    } else {
        &sets.source
    });
    if state.compiled {
        v.push(if state.patched {
            &sets.compile_patched
        } else {
            &sets.compile
        });
    }
    v
}

/// A seeded sequence of phases for compilebench's random mode (`--runs N`): after the
/// initial create, each run picks one of the other phases.
pub fn random_phases(seed: u64, runs: usize) -> Vec<Phase> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let choices = &ALL_PHASES[1..];
    let mut out = vec![Phase::InitialCreate];
    for _ in 0..runs {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(choices[(x % choices.len() as u64) as usize]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1024.0 * 1024.0;

    #[test]
    fn dataset_counts_and_bytes_match_source_txt() {
        let d = Datasets::embedded();
        assert_eq!(d.unpatched.len(), 21_280);
        assert_eq!(d.unpatched.iter().map(|e| e.size).sum::<u64>(), 233_176_153);
        assert_eq!(d.unpatched_compiled.len(), 24_543);
        assert_eq!(
            d.unpatched_compiled.iter().map(|e| e.size).sum::<u64>(),
            946_872_913
        );
        assert_eq!(d.patched.len(), 21_624);
        assert_eq!(d.patched.iter().map(|e| e.size).sum::<u64>(), 237_272_938);
        assert_eq!(d.patched_compiled.len(), 24_964);
        assert_eq!(
            d.patched_compiled.iter().map(|e| e.size).sum::<u64>(),
            965_056_765
        );
        let s = Sets::derive(&d);
        assert_eq!(s.source.dirs.len(), 1_263);
        assert_eq!(s.compile.len(), 3_263);
        assert_eq!(format!("{:.1}", s.compile.bytes() as f64 / MIB), "680.6");
        assert_eq!(s.patch.len(), 6_136);
        assert_eq!(format!("{:.1}", s.patch.bytes() as f64 / MIB), "109.7");
        assert_eq!(s.compile_patched.len(), 2_573);
        assert_eq!(
            format!("{:.1}", s.compile_patched.bytes() as f64 / MIB),
            "691.6"
        );
    }

    #[test]
    fn dirs_come_parents_first() {
        let s = FileSet::new(vec![
            Entry {
                path: "a/b/c.c".into(),
                size: 1,
            },
            Entry {
                path: "a/d.c".into(),
                size: 2,
            },
            Entry {
                path: "e.c".into(),
                size: 3,
            },
        ]);
        assert_eq!(s.dirs, vec!["a".to_string(), "a/b".to_string()]);
        assert_eq!(s.bytes(), 6);
    }

    #[test]
    fn scaling_is_deterministic_and_consistent() {
        let s = Sets::derive(&Datasets::embedded());
        let small = s.scaled(0.05);
        assert_eq!(small.source, s.scaled(0.05).source);
        let ratio = small.source.len() as f64 / s.source.len() as f64;
        assert!((0.03..0.07).contains(&ratio), "{ratio}");
        // A file kept in one set is kept in every set it appears in.
        let kept: BTreeSet<&str> = small.source.files.iter().map(|f| f.path.as_str()).collect();
        for f in &s.patched_source.files {
            let in_small = small.patched_source.files.iter().any(|g| g.path == f.path);
            if s.source.files.iter().any(|g| g.path == f.path) {
                assert_eq!(in_small, kept.contains(f.path.as_str()));
            }
        }
    }

    #[test]
    fn parse_refuses_unsafe_and_malformed_lines() {
        assert!(parse("../etc/passwd 10").is_err());
        assert!(parse("/abs 10").is_err());
        assert!(parse("a//b 10").is_err());
        assert!(parse("noSize").is_err());
        assert!(parse("a/b x").is_err());
        assert_eq!(parse("a b/c.c 5\n").expect("space in name").len(), 1);
    }

    #[test]
    fn plans_prepare_the_needed_tree_state() {
        let fresh = TreeState::default();
        assert_eq!(
            plan(fresh, Phase::ReadCompiled),
            vec![Phase::Create, Phase::Compile]
        );
        assert_eq!(plan(fresh, Phase::Create), vec![]);
        let compiled = after(after(fresh, Phase::Create), Phase::Compile);
        assert_eq!(plan(compiled, Phase::DeleteTree), vec![Phase::Clean]);
        assert_eq!(plan(compiled, Phase::DeleteCompiled), vec![]);
        let patched = after(after(fresh, Phase::Create), Phase::Patch);
        assert_eq!(
            plan(patched, Phase::Patch),
            vec![Phase::DeleteTree, Phase::Create]
        );
        assert_eq!(
            tree_files(&Sets::derive(&Datasets::embedded()), compiled).len(),
            2
        );
    }

    #[test]
    fn random_mode_is_seeded() {
        assert_eq!(random_phases(7, 30), random_phases(7, 30));
        assert_ne!(random_phases(7, 30), random_phases(8, 30));
        assert_eq!(random_phases(7, 30)[0], Phase::InitialCreate);
        assert_eq!(random_phases(7, 30).len(), 31);
    }
}
