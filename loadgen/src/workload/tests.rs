//! Tests of the lists, the tree model and the schedules.

use super::*;

const MIB: f64 = 1024.0 * 1024.0;

fn lists() -> Lists {
    Lists::derive(&Datasets::embedded(), 1.0, &mut PyRandom::new(555))
}

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
    let l = lists();
    assert_eq!(Lists::dirs(&l.unpatched).len(), 1_263);
    assert_eq!(l.compile.len(), 3_263);
    assert_eq!(
        format!("{:.1}", Lists::bytes(&l.compile) as f64 / MIB),
        "680.6"
    );
    assert_eq!(l.patch.len(), 6_136);
    assert_eq!(
        format!("{:.1}", Lists::bytes(&l.patch) as f64 / MIB),
        "109.7"
    );
    assert_eq!(l.compile_patched.len(), 2_573);
    assert_eq!(
        format!("{:.1}", Lists::bytes(&l.compile_patched) as f64 / MIB),
        "691.6"
    );
}

#[test]
fn the_compile_list_is_shuffled_by_the_seed_and_the_others_sorted() {
    let a = lists();
    let b = Lists::derive(&Datasets::embedded(), 1.0, &mut PyRandom::new(7));
    assert_ne!(a.compile, b.compile);
    let mut sa = a.compile.clone();
    sa.sort_by(|x, y| x.path.cmp(&y.path));
    let mut sb = b.compile.clone();
    sb.sort_by(|x, y| x.path.cmp(&y.path));
    assert_eq!(sa, sb, "the same files, in another order");
    assert!(a.unpatched.windows(2).all(|w| w[0].path < w[1].path));
}

#[test]
fn scaling_is_deterministic_and_consistent() {
    let full = lists();
    let small = Lists::derive(&Datasets::embedded(), 0.05, &mut PyRandom::new(555));
    let ratio = small.unpatched.len() as f64 / full.unpatched.len() as f64;
    assert!((0.03..0.07).contains(&ratio), "{ratio}");
    // A file kept in one list is kept in every list it appears in.
    let kept: BTreeSet<&str> = small.unpatched.iter().map(|f| f.path.as_str()).collect();
    let small_patch: BTreeSet<&str> = small.patch.iter().map(|f| f.path.as_str()).collect();
    for f in &full.patch {
        if full.unpatched.iter().any(|g| g.path == f.path) {
            assert_eq!(
                small_patch.contains(f.path.as_str()),
                kept.contains(f.path.as_str())
            );
        }
    }
}

#[test]
fn reorder_follows_a_walk_and_keeps_the_rest() {
    let mut l = Lists::only(vec![
        Entry {
            path: "a/x".into(),
            size: 1,
        },
        Entry {
            path: "b".into(),
            size: 2,
        },
        Entry {
            path: "c".into(),
            size: 3,
        },
    ]);
    l.reorder(ListId::Unpatched, &["c".into(), "a/x".into()]);
    let order: Vec<&str> = l.unpatched.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(order, ["c", "a/x", "b"]);
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

/// Plays rounds against a model of the trees' states and checks that every timed
/// step finds its tree in a state compilebench would run it on.
fn check_rounds(rounds: &[Round]) {
    use std::collections::HashMap;
    let mut state: HashMap<u32, Kind> = HashMap::new();
    let mut ever: BTreeSet<u32> = BTreeSet::new();
    for r in rounds {
        for s in r.prepare.iter().chain(std::iter::once(&r.timed)) {
            let k = state.get(&s.tree).copied();
            let next = match s.action {
                Action::Write {
                    list: ListId::Unpatched,
                    ..
                } => {
                    assert!(ever.insert(s.tree), "a create reuses kernel-{}", s.tree);
                    Some(Kind::Unpatched)
                }
                Action::Write {
                    list, read_first, ..
                } => match (k, list, read_first) {
                    (Some(Kind::Unpatched), ListId::Patch, true) => Some(Kind::Patched),
                    (Some(Kind::UnpatchedCompiled), ListId::CompilePatched, true) => {
                        Some(Kind::PatchedCompiled)
                    }
                    (Some(Kind::Unpatched), ListId::Compile, false) => {
                        Some(Kind::UnpatchedCompiled)
                    }
                    (Some(Kind::Patched), ListId::CompilePatched, false) => {
                        Some(Kind::PatchedCompiled)
                    }
                    other => panic!("{:?} on {other:?}", s.phase),
                },
                Action::Unlink { list } => match (k, list) {
                    (Some(Kind::UnpatchedCompiled), ListId::Compile) => Some(Kind::Unpatched),
                    (Some(Kind::PatchedCompiled), ListId::CompilePatched) => Some(Kind::Patched),
                    other => panic!("clean on {other:?}"),
                },
                Action::Overwrite { .. } => panic!("compilebench never writes a file over"),
                Action::Read | Action::Stat | Action::Delete => {
                    let k = k.unwrap_or_else(|| panic!("{:?} of no tree", s.phase));
                    let compiled_phase = matches!(
                        s.phase,
                        Phase::ReadCompiled | Phase::StatCompiled | Phase::DeleteCompiled
                    );
                    assert_eq!(k.compiled(), compiled_phase, "{:?} on {k:?}", s.phase);
                    (s.action != Action::Delete).then_some(k)
                }
            };
            match next {
                Some(n) => state.insert(s.tree, n),
                None => state.remove(&s.tree),
            };
        }
    }
}

#[test]
fn every_phase_sequence_runs_on_a_tree_in_the_state_it_needs() {
    // Every pair and triple of phases, from a fresh client.
    for a in ALL_PHASES {
        for b in ALL_PHASES {
            for c in ALL_PHASES {
                let rounds = phase_rounds(&mut PyRandom::new(1), &[a, b, c], true);
                assert_eq!(rounds.len(), 3);
                check_rounds(&rounds);
            }
        }
    }
    // The bug of the first version: patching a compiled tree, then reading it.
    let r = phase_rounds(
        &mut PyRandom::new(555),
        &[
            Phase::Create,
            Phase::Compile,
            Phase::Patch,
            Phase::ReadCompiled,
        ],
        true,
    );
    assert!(
        r[2].prepare.is_empty(),
        "a compiled tree is patched as it is"
    );
    assert_eq!(
        r[2].timed.action,
        Action::Write {
            list: ListId::CompilePatched,
            unlink: matches!(r[2].timed.action, Action::Write { unlink: true, .. }),
            read_first: true
        }
    );
    assert!(r[3].prepare.is_empty());
}

#[test]
fn the_files_a_round_handles_follow_its_trees() {
    let w = Workload::compilebench(
        &Datasets::embedded(),
        0.05,
        555,
        &Schedule::Phases(vec![
            Phase::Create,
            Phase::Compile,
            Phase::ReadCompiled,
            Phase::Clean,
            Phase::DeleteTree,
        ]),
        true,
    );
    let (u, c) = (w.lists.unpatched.len() as u64, w.lists.compile.len() as u64);
    assert_eq!(w.files_per_round(), vec![u, c, u + c, c, u]);
}

#[test]
fn random_mode_runs_on_every_seed_and_counts_only_what_ran() {
    for seed in 0..200 {
        let rounds = random_rounds(&mut PyRandom::new(seed), 3, 60, true);
        assert_eq!(rounds.len(), 63);
        check_rounds(&rounds);
        assert!(rounds[..3]
            .iter()
            .all(|r| !r.sync && r.timed.phase == Phase::InitialCreate));
        assert!(rounds[3..].iter().all(|r| r.sync && r.prepare.is_empty()));
    }
    // With no initial tree the first counted operation can only be a create.
    let r = random_rounds(&mut PyRandom::new(555), 0, 5, false);
    assert_eq!(r[0].timed.phase, Phase::Create);
    assert!((100..=100_000).contains(&r[0].timed.tree));
}
