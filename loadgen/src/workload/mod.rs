//! The compilebench workload, pure: the kernel-tree file lists, derived and ordered as
//! compilebench 0.6 derives them, and the schedule of a run (which operation on which tree,
//! after which untimed preparation) for compilebench's random mode and for a given phase
//! sequence.
//!
//! The lists ship in `data/compilebench/` (see SOURCE.txt there for their origin); how
//! compilebench uses them, and where loadgen differs, is in doc/COMPILEBENCH.md.

use std::collections::{BTreeSet, HashMap};

use crate::pyrandom::PyRandom;

/// One file of a tree: path relative to the tree root, size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    pub size: u64,
}

/// Where `path` falls in [0, 1): a file is kept at a scale above it.
fn place(path: &str) -> f64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % 1_000_000) as f64 / 1_000_000.0
}

fn keep(path: &str, scale: f64) -> bool {
    place(path) < scale
}

/// The smallest `--scale` that keeps at least one file of the initial tree.
pub fn smallest_scale(d: &Datasets) -> f64 {
    d.unpatched
        .iter()
        .map(|e| place(&e.path) + 1e-6)
        .fold(1.0, f64::min)
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
            unpatched: p(include_str!("../../data/compilebench/dataset-unpatched")),
            unpatched_compiled: p(include_str!(
                "../../data/compilebench/dataset-unpatched-compiled"
            )),
            patched: p(include_str!("../../data/compilebench/dataset-patched")),
            patched_compiled: p(include_str!(
                "../../data/compilebench/dataset-patched-compiled"
            )),
        }
    }
}

/// compilebench's four lists, as it uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListId {
    /// A clean tree: what create writes.
    Unpatched,
    /// What patching a clean unpatched tree writes: the patched tree's files whose size
    /// differs from (or is absent in) the unpatched tree.
    Patch,
    /// What compiling an unpatched tree writes (and clean removes): the unpatched compiled
    /// tree minus the source; in a seeded random order.
    Compile,
    /// What compiling a patched tree, patching a compiled tree and cleaning a patched
    /// compiled tree write or remove: the patched compiled tree minus the patched source,
    /// minus the entries of the same size in `Compile`.
    CompilePatched,
}

pub const LISTS: [ListId; 4] = [
    ListId::Unpatched,
    ListId::Patch,
    ListId::Compile,
    ListId::CompilePatched,
];

/// The four lists, each in the order the run writes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lists {
    pub unpatched: Vec<Entry>,
    pub patch: Vec<Entry>,
    pub compile: Vec<Entry>,
    pub compile_patched: Vec<Entry>,
}

impl Lists {
    /// The lists as compilebench derives them: each dataset in its file's order, minus what
    /// compilebench strips; `scale` keeps a deterministic fraction of the files (by a hash
    /// of the path, so a file is kept or dropped in every list alike); then the compile list
    /// is shuffled with `rng`, compilebench's first draw. The unpatched, patch and
    /// patched-compile lists come out sorted (parents first); a run writes them in the
    /// target's own readdir order (`native`), as compilebench does.
    pub fn derive(d: &Datasets, scale: f64, rng: &mut PyRandom) -> Self {
        let names =
            |l: &[Entry]| -> BTreeSet<String> { l.iter().map(|e| e.path.clone()).collect() };
        let sized = |l: &[Entry]| -> HashMap<String, u64> {
            l.iter().map(|e| (e.path.clone(), e.size)).collect()
        };
        let unpatched_names = names(&d.unpatched);
        let patched_names = names(&d.patched);
        let unpatched_size = sized(&d.unpatched);
        let compile: Vec<Entry> = d
            .unpatched_compiled
            .iter()
            .filter(|e| !unpatched_names.contains(&e.path))
            .cloned()
            .collect();
        let compile_size = sized(&compile);
        let patch: Vec<Entry> = d
            .patched
            .iter()
            .filter(|e| unpatched_size.get(&e.path) != Some(&e.size))
            .cloned()
            .collect();
        let compile_patched: Vec<Entry> = d
            .patched_compiled
            .iter()
            .filter(|e| !patched_names.contains(&e.path))
            .filter(|e| compile_size.get(&e.path) != Some(&e.size))
            .cloned()
            .collect();
        let scaled = |l: Vec<Entry>| -> Vec<Entry> {
            if scale >= 1.0 {
                l
            } else {
                l.into_iter().filter(|e| keep(&e.path, scale)).collect()
            }
        };
        let sorted = |mut l: Vec<Entry>| {
            l.sort_by(|a, b| a.path.cmp(&b.path));
            l
        };
        let mut compile = scaled(compile);
        rng.shuffle(&mut compile);
        Self {
            unpatched: sorted(scaled(d.unpatched.clone())),
            patch: sorted(scaled(patch)),
            compile,
            compile_patched: sorted(scaled(compile_patched)),
        }
    }

    /// Lists for another workload: `files` is what create writes; the others are empty.
    pub fn only(files: Vec<Entry>) -> Self {
        Self {
            unpatched: files,
            ..Self::default()
        }
    }

    pub fn get(&self, id: ListId) -> &[Entry] {
        match id {
            ListId::Unpatched => &self.unpatched,
            ListId::Patch => &self.patch,
            ListId::Compile => &self.compile,
            ListId::CompilePatched => &self.compile_patched,
        }
    }

    pub fn get_mut(&mut self, id: ListId) -> &mut Vec<Entry> {
        match id {
            ListId::Unpatched => &mut self.unpatched,
            ListId::Patch => &mut self.patch,
            ListId::Compile => &mut self.compile,
            ListId::CompilePatched => &mut self.compile_patched,
        }
    }

    /// The lists a run writes in the target's readdir order (compilebench's "native"
    /// order); the compile list keeps its shuffle.
    pub fn native(&self) -> [ListId; 3] {
        [ListId::Unpatched, ListId::Patch, ListId::CompilePatched]
    }

    /// Puts `list` in `order` (paths as a walk of a tree made from it found them); paths
    /// missing from `order` keep their place at the end.
    pub fn reorder(&mut self, list: ListId, order: &[String]) {
        let rank: HashMap<&str, usize> = order
            .iter()
            .enumerate()
            .map(|(i, p)| (p.as_str(), i))
            .collect();
        let l = self.get_mut(list);
        l.sort_by_key(|e| rank.get(e.path.as_str()).copied().unwrap_or(usize::MAX));
    }

    /// Every directory the list's files imply, parents first.
    pub fn dirs(entries: &[Entry]) -> Vec<String> {
        let mut dirs = BTreeSet::new();
        for f in entries {
            let mut p = f.path.as_str();
            while let Some((parent, _)) = p.rsplit_once('/') {
                if !dirs.insert(parent.to_string()) {
                    break;
                }
                p = parent;
            }
        }
        dirs.into_iter().collect()
    }

    pub fn bytes(entries: &[Entry]) -> u64 {
        entries.iter().map(|e| e.size).sum()
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
    /// `loadgen stream`: one large file a client, written, written over, read, read again.
    StreamWrite,
    StreamRewrite,
    StreamRead,
    StreamReread,
}

/// The phases of `loadgen stream`, in order.
pub const STREAM_PHASES: [Phase; 4] = [
    Phase::StreamWrite,
    Phase::StreamRewrite,
    Phase::StreamRead,
    Phase::StreamReread,
];

/// compilebench's phases (what `--phases` takes).
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

/// What a phase's rate means, as compilebench reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// MB/s of the bytes written or read (clean: of the files it removed, by their size).
    MbPerS,
    /// Seconds (delete and stat, which move no data).
    Seconds,
}

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
            Phase::StreamWrite => "write",
            Phase::StreamRewrite => "rewrite",
            Phase::StreamRead => "read",
            Phase::StreamReread => "reread",
        }
    }

    pub fn parse(name: &str) -> Option<Phase> {
        ALL_PHASES.iter().copied().find(|p| p.name() == name)
    }

    pub fn unit(self) -> Unit {
        match self {
            Phase::DeleteTree | Phase::DeleteCompiled | Phase::StatTree | Phase::StatCompiled => {
                Unit::Seconds
            }
            _ => Unit::MbPerS,
        }
    }

    /// Phases that only look at a tree (and may look at another client's with
    /// --read-other).
    pub fn reads(self) -> bool {
        matches!(
            self,
            Phase::ReadTree | Phase::ReadCompiled | Phase::StatTree | Phase::StatCompiled
        )
    }
}

/// compilebench's four states of a tree (its four directory hashes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Unpatched,
    Patched,
    UnpatchedCompiled,
    PatchedCompiled,
}

impl Kind {
    fn index(self) -> usize {
        self as usize
    }

    pub fn compiled(self) -> bool {
        matches!(self, Kind::UnpatchedCompiled | Kind::PatchedCompiled)
    }

    /// compilebench's patch of a tree not patched yet (unpatched, or compiled unpatched):
    /// the list it writes and the state it leaves.
    fn patching(self) -> (ListId, Kind) {
        if self == Kind::Unpatched {
            (ListId::Patch, Kind::Patched)
        } else {
            (ListId::CompilePatched, Kind::PatchedCompiled)
        }
    }

    /// compilebench's compile of a tree not compiled (unpatched or patched): the list it
    /// writes and the state it leaves.
    fn compiling(self) -> (ListId, Kind) {
        if self == Kind::Unpatched {
            (ListId::Compile, Kind::UnpatchedCompiled)
        } else {
            (ListId::CompilePatched, Kind::PatchedCompiled)
        }
    }

    /// compilebench's clean of a compiled tree: the list it unlinks and the state it
    /// leaves.
    fn cleaning(self) -> (ListId, Kind) {
        if self == Kind::UnpatchedCompiled {
            (ListId::Compile, Kind::Unpatched)
        } else {
            (ListId::CompilePatched, Kind::Patched)
        }
    }
}

/// What a step does to its tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// compilebench's run_directory: make the tree's directory, then for each file of the
    /// list, in order: make its directory the first time it is seen (os.makedirs), unlink
    /// it first if `unlink`, open it for appending (created if missing), read it whole and
    /// truncate it if `read_first`, write it.
    Write {
        list: ListId,
        unlink: bool,
        read_first: bool,
    },
    /// clean: unlink every file of the list.
    Unlink { list: ListId },
    /// A top-down walk (os.walk) reading every file.
    Read,
    /// A bottom-up walk stating every file, then every subdirectory, of each directory.
    Stat,
    /// A bottom-up walk unlinking every file and removing every subdirectory (the tree's
    /// own directory stays, as compilebench's rmrf leaves it).
    Delete,
    /// Writes every file of the list over from its start, without truncating it (a
    /// stream's rewrite).
    Overwrite { list: ListId },
}

/// One operation on one tree of a client (`kernel-N`, N = `tree`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub phase: Phase,
    pub tree: u32,
    pub action: Action,
}

/// One timed operation, after the untimed steps that bring a tree into the state it needs;
/// every client runs the same rounds (on trees of its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    pub prepare: Vec<Step>,
    pub timed: Step,
    /// Whether the timed operation ends with a sync (compilebench syncs every random-mode
    /// operation, not the initial creates).
    pub sync: bool,
}

/// compilebench's directory hashes: which trees are in which state, each in insertion
/// order (Python dicts), and every name ever used (a deleted tree's directory stays).
#[derive(Debug, Clone, Default)]
struct Pool {
    dirs: [Vec<u32>; 4],
    used: BTreeSet<u32>,
}

impl Pool {
    fn of(&self, k: Kind) -> &Vec<u32> {
        &self.dirs[k.index()]
    }
    fn add(&mut self, k: Kind, tree: u32) {
        self.used.insert(tree);
        self.dirs[k.index()].push(tree);
    }
    fn take(&mut self, k: Kind, i: usize) -> u32 {
        self.dirs[k.index()].remove(i)
    }
}

fn write(list: ListId) -> Action {
    Action::Write {
        list,
        unlink: false,
        read_first: false,
    }
}

/// compilebench's random mode: `initial` trees created (kernel-0..), then operations picked
/// as compilebench 0.6 picks them with `rng` (seeded as compilebench's, after the shuffle
/// of the compile list) until `runs` of them could run; an operation that finds no tree
/// to work on is skipped and not counted, as in compilebench. Every timed operation ends
/// with a sync when `sync`, the initial creates excepted.
pub fn random_rounds(rng: &mut PyRandom, initial: usize, runs: usize, sync: bool) -> Vec<Round> {
    let mut pool = Pool::default();
    let mut rounds = Vec::new();
    let round = |phase, tree, action, sync| Round {
        prepare: Vec::new(),
        timed: Step {
            phase,
            tree,
            action,
        },
        sync,
    };
    for t in 0..initial as u32 {
        rounds.push(round(
            Phase::InitialCreate,
            t,
            write(ListId::Unpatched),
            false,
        ));
        pool.add(Kind::Unpatched, t);
    }
    let mut done = 0;
    while done < runs {
        if let Some((phase, tree, action)) = random_step(rng, &mut pool) {
            rounds.push(round(phase, tree, action, sync));
            done += 1;
        }
    }
    rounds
}

/// Picks one of the non-empty sources, and a tree of it; None when all are empty.
fn pick(rng: &mut PyRandom, pool: &Pool, from: &[Kind]) -> Option<(Kind, usize)> {
    let good: Vec<Kind> = from
        .iter()
        .copied()
        .filter(|k| !pool.of(*k).is_empty())
        .collect();
    if good.is_empty() {
        return None;
    }
    let k = good[rng.below(good.len())];
    let i = rng.below(pool.of(k).len());
    Some((k, i))
}

/// One operation of the random mode, drawn as compilebench draws it, with the tree it
/// works on (the pool updated); None when it finds no tree to work on.
fn random_step(rng: &mut PyRandom, pool: &mut Pool) -> Option<(Phase, u32, Action)> {
    use Kind::*;
    let any = [Patched, Unpatched, UnpatchedCompiled, PatchedCompiled];
    match rng.below(7) {
        // patch_one_dir
        0 => pick(rng, pool, &[Unpatched, UnpatchedCompiled]).map(|(k, i)| {
            let tree = pool.take(k, i);
            let unlink = rng.randint(0, 3) == 1;
            let (list, to) = k.patching();
            pool.add(to, tree);
            let action = Action::Write {
                list,
                unlink,
                read_first: true,
            };
            (Phase::Patch, tree, action)
        }),
        // compile_one_dir
        1 => pick(rng, pool, &[Unpatched, Patched]).map(|(k, i)| {
            let tree = pool.take(k, i);
            let (list, to) = k.compiling();
            pool.add(to, tree);
            (Phase::Compile, tree, write(list))
        }),
        // clean_one_dir
        2 => pick(rng, pool, &[PatchedCompiled, UnpatchedCompiled]).map(|(k, i)| {
            let tree = pool.take(k, i);
            let (list, to) = k.cleaning();
            pool.add(to, tree);
            (Phase::Clean, tree, Action::Unlink { list })
        }),
        // delete_one_dir
        3 => pick(rng, pool, &any).map(|(k, i)| {
            let tree = pool.take(k, i);
            let phase = if k.compiled() {
                Phase::DeleteCompiled
            } else {
                Phase::DeleteTree
            };
            (phase, tree, Action::Delete)
        }),
        // create_one_dir
        4 => {
            let mut tree = rng.randint(100, 100_000) as u32;
            while pool.used.contains(&tree) {
                tree = rng.randint(100, 100_000) as u32;
            }
            pool.add(Unpatched, tree);
            Some((Phase::Create, tree, write(ListId::Unpatched)))
        }
        // read_one_dir, stat_one_dir
        n => pick(rng, pool, &any).map(|(k, i)| {
            let tree = pool.of(k)[i];
            let (phase, action) = match (n == 5, k.compiled()) {
                (true, false) => (Phase::ReadTree, Action::Read),
                (true, true) => (Phase::ReadCompiled, Action::Read),
                (false, false) => (Phase::StatTree, Action::Stat),
                (false, true) => (Phase::StatCompiled, Action::Stat),
            };
            (phase, tree, action)
        }),
    }
}

/// A given phase sequence on one tree a client: each phase after the untimed steps that
/// bring the tree into the state it needs (a create starts a new tree, kernel-0, 1, ...;
/// a patch of a tree already patched starts a new one too). `rng` draws the patches'
/// unlinks as compilebench does (one time in four).
pub fn phase_rounds(rng: &mut PyRandom, phases: &[Phase], sync: bool) -> Vec<Round> {
    let mut rounds = Vec::new();
    let mut next = 0u32;
    let mut cur: Option<(u32, Kind)> = None;
    for &phase in phases {
        let prepare = prepare_for(phase, &mut cur, &mut next);
        let (tree, kind) = match cur {
            Some(c) => c,
            None => {
                // A create: a new tree.
                next += 1;
                (next - 1, Kind::Unpatched)
            }
        };
        let (action, after) = timed_action(rng, phase, kind);
        cur = after.map(|k| (tree, k));
        rounds.push(Round {
            prepare,
            timed: Step {
                phase,
                tree,
                action,
            },
            sync,
        });
    }
    rounds
}

/// The untimed steps that bring the current tree `cur` (none yet, or its number and
/// state) into the state `phase` needs, `cur` updated: a create, patch or compile
/// starts from a new tree (`next`, then counted) where the current one will not do; a
/// create itself drops the current tree (it makes its own).
fn prepare_for(phase: Phase, cur: &mut Option<(u32, Kind)>, next: &mut u32) -> Vec<Step> {
    use Kind::*;
    let mut prepare = Vec::new();
    let mut create = |prepare: &mut Vec<Step>, cur: &mut Option<(u32, Kind)>| {
        prepare.push(Step {
            phase: Phase::Create,
            tree: *next,
            action: write(ListId::Unpatched),
        });
        *cur = Some((*next, Unpatched));
        *next += 1;
    };
    let needs_compiled = matches!(
        phase,
        Phase::Clean | Phase::ReadCompiled | Phase::StatCompiled | Phase::DeleteCompiled
    );
    let needs_clean = matches!(
        phase,
        Phase::Compile | Phase::ReadTree | Phase::StatTree | Phase::DeleteTree
    );
    if matches!(phase, Phase::Create | Phase::InitialCreate) {
        *cur = None;
    } else if phase == Phase::Patch {
        if !matches!(cur, Some((_, Unpatched | UnpatchedCompiled))) {
            create(&mut prepare, cur);
        }
    } else {
        if cur.is_none() {
            create(&mut prepare, cur);
        }
        let compiled = cur.is_some_and(|(_, k)| k.compiled());
        if let (true, false, Some((t, k))) = (needs_compiled, compiled, *cur) {
            let (list, to) = k.compiling();
            prepare.push(Step {
                phase: Phase::Compile,
                tree: t,
                action: write(list),
            });
            *cur = Some((t, to));
        }
        if let (true, true, Some((t, k))) = (needs_clean, compiled, *cur) {
            let (list, to) = k.cleaning();
            prepare.push(Step {
                phase: Phase::Clean,
                tree: t,
                action: Action::Unlink { list },
            });
            *cur = Some((t, to));
        }
    }
    prepare
}

/// What `phase` does to a tree in state `kind`, and the state it leaves (none: the tree
/// is gone). A patch draws its unlinks from `rng`.
fn timed_action(rng: &mut PyRandom, phase: Phase, kind: Kind) -> (Action, Option<Kind>) {
    use Kind::*;
    match phase {
        Phase::InitialCreate | Phase::Create => (write(ListId::Unpatched), Some(Unpatched)),
        Phase::Patch => {
            let unlink = rng.randint(0, 3) == 1;
            let (list, to) = kind.patching();
            let a = Action::Write {
                list,
                unlink,
                read_first: true,
            };
            (a, Some(to))
        }
        Phase::Compile => {
            let (list, to) = kind.compiling();
            (write(list), Some(to))
        }
        Phase::Clean => {
            let (list, to) = kind.cleaning();
            (Action::Unlink { list }, Some(to))
        }
        Phase::ReadTree | Phase::ReadCompiled => (Action::Read, Some(kind)),
        Phase::StatTree | Phase::StatCompiled => (Action::Stat, Some(kind)),
        Phase::DeleteTree | Phase::DeleteCompiled => (Action::Delete, None),
        // The stream's phases (not given with --phases; Workload::stream makes them).
        Phase::StreamWrite => (write(ListId::Unpatched), Some(kind)),
        Phase::StreamRewrite => (
            Action::Overwrite {
                list: ListId::Unpatched,
            },
            Some(kind),
        ),
        Phase::StreamRead | Phase::StreamReread => (Action::Read, Some(kind)),
    }
}

/// What a run does: the lists and the rounds.
#[derive(Debug, Clone)]
pub struct Workload {
    pub lists: Lists,
    pub rounds: Vec<Round>,
}

/// How the rounds are chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schedule {
    /// compilebench's random mode: initial trees, then runs.
    Random { initial: usize, runs: usize },
    /// These phases in this order.
    Phases(Vec<Phase>),
}

/// The name of the file `loadgen stream` writes in each client's tree.
pub const STREAM_FILE: &str = "stream.dat";

impl Workload {
    /// `loadgen stream`: one file of `size` bytes a client (in its tree kernel-0),
    /// written, written over, read, read again, each a timed round; no sync (the write
    /// rounds sync the file themselves with --fsync).
    pub fn stream(size: u64) -> Self {
        let step = |phase, action| Round {
            prepare: Vec::new(),
            timed: Step {
                phase,
                tree: 0,
                action,
            },
            sync: false,
        };
        Self {
            lists: Lists::only(vec![Entry {
                path: STREAM_FILE.to_string(),
                size,
            }]),
            rounds: vec![
                step(Phase::StreamWrite, write(ListId::Unpatched)),
                step(
                    Phase::StreamRewrite,
                    Action::Overwrite {
                        list: ListId::Unpatched,
                    },
                ),
                step(Phase::StreamRead, Action::Read),
                step(Phase::StreamReread, Action::Read),
            ],
        }
    }

    /// The compilebench workload: lists and rounds from one random stream seeded with
    /// `seed` (compilebench: 555), drawn in compilebench's order.
    pub fn compilebench(
        d: &Datasets,
        scale: f64,
        seed: u64,
        schedule: &Schedule,
        sync: bool,
    ) -> Self {
        let mut rng = PyRandom::new(seed);
        let lists = Lists::derive(d, scale, &mut rng);
        let rounds = match schedule {
            Schedule::Random { initial, runs } => random_rounds(&mut rng, *initial, *runs, sync),
            Schedule::Phases(p) => phase_rounds(&mut rng, p, sync),
        };
        Self { lists, rounds }
    }
}

impl Workload {
    /// The files each round's timed step handles on one client (written, removed, read
    /// or stated), from a model of its trees: for a progress display's total.
    pub fn files_per_round(&self) -> Vec<u64> {
        use std::collections::HashMap;
        let mut trees: HashMap<u32, BTreeSet<&str>> = HashMap::new();
        let mut out = Vec::with_capacity(self.rounds.len());
        for r in &self.rounds {
            let mut timed = 0;
            for (i, s) in r
                .prepare
                .iter()
                .chain(std::iter::once(&r.timed))
                .enumerate()
            {
                let t = trees.entry(s.tree).or_default();
                let n = match s.action {
                    Action::Write { list, .. } | Action::Overwrite { list } => {
                        let l = self.lists.get(list);
                        t.extend(l.iter().map(|e| e.path.as_str()));
                        l.len()
                    }
                    Action::Unlink { list } => {
                        let l = self.lists.get(list);
                        for e in l {
                            t.remove(e.path.as_str());
                        }
                        l.len()
                    }
                    Action::Read | Action::Stat => t.len(),
                    Action::Delete => {
                        let n = t.len();
                        t.clear();
                        n
                    }
                };
                if i == r.prepare.len() {
                    timed = n as u64;
                }
            }
            out.push(timed);
        }
        out
    }
}

#[cfg(test)]
mod tests;
