//! compilebench's progress bar on a real terminal (a pty, through script(1)): each
//! round's count stays within the round's files, the cleanup is counted apart, rates
//! read as numbers, and the bar is gone before the results are printed.

mod common;

use common::text;

/// The screen's text as a terminal would have been sent it, escapes removed, each
/// redraw a line of its own.
fn screen_lines(raw: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in raw.split(['\r', '\n']) {
        let mut s = String::new();
        let mut chars = part.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                // CSI: ESC [ parameters, then one final letter.
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for d in chars.by_ref() {
                        if d.is_ascii_alphabetic() {
                            break;
                        }
                    }
                }
                continue;
            }
            s.push(c);
        }
        if !s.trim().is_empty() {
            out.push(s);
        }
    }
    out
}

/// "N/M files" of a bar's line.
fn counts(line: &str) -> Option<(u64, u64)> {
    let at = line.find(" files")?;
    let word = line[..at].rsplit(' ').next()?;
    let (n, m) = word.split_once('/')?;
    Some((n.parse().ok()?, m.parse().ok()?))
}

#[test]
fn the_progress_bar_counts_each_round_within_its_files_and_the_cleanup_apart() {
    let dir = tempfile::tempdir().expect("dir");
    let line = format!(
        "'{}' compilebench '{}' --clients 4 --scale 0.3 --phases create,compile,read-compiled",
        env!("CARGO_BIN_EXE_loadgen"),
        dir.path().display()
    );
    let o = e2e::on_a_terminal(&line);
    assert!(o.status.success(), "{}", text(&o));
    let raw = String::from_utf8_lossy(&o.stdout);
    let lines = screen_lines(&raw);
    let bars: Vec<&String> = lines.iter().filter(|l| l.contains(" files")).collect();
    assert!(
        lines.iter().any(|l| l.contains("round 1/3")),
        "the bar was drawn: {lines:#?}"
    );
    for l in &bars {
        if let Some((n, m)) = counts(l) {
            assert!(n <= m, "a round's count past its files: {l}");
            assert!(m > 0, "a bar with no files: {l}");
        }
        assert!(
            !l.contains(',') && !l.contains("0/0 files"),
            "a rate with grouped digits, or an empty bar: {l}"
        );
    }
    // The results come after the bar, each on a line of its own.
    let table = lines
        .iter()
        .position(|l| l.starts_with("loadgen compilebench on"));
    assert!(table.is_some(), "{lines:#?}");
    assert!(
        !lines
            .iter()
            .any(|l| l.contains(" files") && l.contains("loadgen compilebench on")),
        "the bar cleared before the results: {lines:#?}"
    );
}
