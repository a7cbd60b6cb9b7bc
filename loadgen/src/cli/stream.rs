//! `loadgen stream`: large sequential files.

use crate::*;

/// A size: digits with an optional K, M, G or T (powers of 1024; KiB etc. too).
pub(crate) fn parse_size(flag: &str, v: &str) -> Result<u64, Error> {
    size_of(v).ok_or_else(|| {
        user(format!(
            "{flag} {v:?} is not a size; write a number with K, M, G or T (e.g. 1G, 512M)"
        ))
    })
}

/// A size option's value as clap checks it (`--write-size 256K`).
pub(crate) fn size_value(v: &str) -> Result<usize, String> {
    size_of(v)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| "not a size; write a number with K, M, G or T (e.g. 256K, 1M)".to_string())
}

/// [`parse_size`]'s number, if `v` is a size above zero.
fn size_of(v: &str) -> Option<u64> {
    let t = v.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, mult) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        Some('T' | 't') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n: u64 = num.trim().parse().ok()?;
    n.checked_mul(mult).filter(|b| *b > 0)
}

/// `loadgen stream`: checks its arguments, then one run a client count.
pub(crate) fn stream(a: &StreamArgs) -> Result<(), Error> {
    let size = parse_size("--size", &a.size)?;
    let block = parse_size("--block", &a.block)?;
    if block > 64 << 20 {
        return Err(user("--block must be at most 64M"));
    }
    if a.direct && block % engine::DIRECT_ALIGN as u64 != 0 {
        return Err(user(
            "--direct needs a --block that is a multiple of 4K (O_DIRECT's alignment)",
        ));
    }
    if a.direct && size % engine::DIRECT_ALIGN as u64 != 0 {
        return Err(user("--direct needs a --size that is a multiple of 4K"));
    }
    let opts = RunOpts {
        fsync: a.fsync,
        limits: a.limits.clone(),
        net: a.net.clone(),
        stream: Some(size),
        direct: a.direct,
        ..RunOpts::plain(block as usize, a.out.clone())
    };
    if !opts.net.hosts.is_empty() && a.clients != [1] {
        return Err(user(
            "--clients counts clients on this machine; with --hosts use --clients-per-host",
        ));
    }
    for &c in &a.clients {
        check_common(c, &opts)?;
    }
    check_outputs(&opts.out)?;
    let schedule = Schedule::Phases(workload::STREAM_PHASES.to_vec());
    let mut runs = Vec::new();
    for &c in &a.clients {
        if a.clients.len() > 1 {
            eprintln!("loadgen stream: {c} clients");
        }
        let r = run_workload(
            "stream",
            &a.dir,
            Workload::stream(size),
            &schedule,
            c,
            &opts,
            false,
        )?;
        let stop = r.error.is_some() || loadgen::stop::INTERRUPTED.load(Ordering::Relaxed);
        runs.push(r);
        if stop {
            break;
        }
    }
    let one = runs.len() == 1;
    for r in &runs {
        if one {
            print!("{}", report::table(r));
        }
    }
    if !one {
        print!("{}", report::sweep_table(&runs));
    }
    finish_runs(&runs, &opts.out, !one, "a smaller --size")
}

/// Writes the runs of a sweep or a stream (JSON: a list, or the one run when `list` is
/// false; CSV: every run's rows) and says how they ended; `smaller` is what to try when
/// the target filled up.
pub(crate) fn finish_runs(
    runs: &[RunReport],
    out: &OutputOpts,
    list: bool,
    smaller: &str,
) -> Result<(), Error> {
    if let Some(j) = &out.json {
        let v = match runs {
            [one] if !list => report::to_json(one),
            _ => serde_json::to_vec_pretty(runs).unwrap_or_default(),
        };
        write_out(j, &v)
            .map_err(|e| Error::Failed(format!("cannot write {}: {e}", j.display())))?;
    }
    if let Some(c) = &out.csv {
        write_out(c, &report::sweep_csv(runs))
            .map_err(|e| Error::Failed(format!("cannot write {}: {e}", c.display())))?;
    }
    match runs.iter().find_map(|r| r.error.clone()) {
        Some(e) if e.starts_with("interrupted") => Err(Error::Interrupted(
            "interrupted by a signal: stopped cleanly; results so far are kept".into(),
        )),
        Some(e) if e.contains("No space left") => Err(Error::Failed(format!(
            "the target filled up ({e}); results so far are kept; free space or use {smaller}"
        ))),
        Some(e) => Err(Error::Failed(format!(
            "stopped: {e}; results so far are kept"
        ))),
        None => Ok(()),
    }
}
