//! The progress bar of a compilebench-like run on a terminal: the round and its phase,
//! what of it is being done (preparing, the timed part, its sync, the cleanup at the
//! end), the files done of the round's, the rate, and the time left of the round and of
//! the whole run.

use crate::*;

use loadgen::engine::Step;

/// A rate of files a second as a person reads it: `830/s`, `66.7k/s`, `1.2M/s`.
pub(crate) fn rate(per_sec: f64) -> String {
    if !per_sec.is_finite() || per_sec < 0.0 {
        return "-".to_string();
    }
    if per_sec < 1000.0 {
        format!("{per_sec:.0}/s")
    } else if per_sec < 1e6 {
        format!("{:.1}k/s", per_sec / 1e3)
    } else {
        format!("{:.1}M/s", per_sec / 1e6)
    }
}

/// A duration in whole units: `45s`, `3m05s`, `1h02m`.
pub(crate) fn left(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The time left of the run: what is done so far of all the rounds' files (the rounds
/// before `round` whole, `files` of it), at the pace the run has kept since `started`.
pub(crate) fn run_left(totals: &[u64], round: usize, files: u64, elapsed: f64) -> Option<u64> {
    let all: u64 = totals.iter().sum();
    let before: u64 = totals.iter().take(round).sum();
    let current = totals.get(round).copied().unwrap_or(0);
    let done = before + files.min(current);
    if all == 0 || done == 0 || elapsed <= 0.0 {
        return None;
    }
    let f = done as f64 / all as f64;
    Some((elapsed * (1.0 - f) / f).round() as u64)
}

/// A progress bar on the terminal (indicatif) for a run, until `done` (join the thread
/// returned before printing more); nothing when stderr is not a terminal or with --quiet.
pub(crate) fn spawn_progress(
    progress: Arc<Progress>,
    names: Vec<&'static str>,
    totals: Vec<u64>,
    quiet: bool,
    done: Arc<AtomicBool>,
) -> Option<std::thread::JoinHandle<()>> {
    if quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    Some(std::thread::spawn(move || {
        show(&progress, &names, &totals, &done)
    }))
}

/// Ends the bar of [`spawn_progress`] and waits until it is cleared (before anything
/// else is printed).
pub(crate) fn finish_progress(done: &AtomicBool, display: Option<std::thread::JoinHandle<()>>) {
    done.store(true, Ordering::Relaxed);
    if let Some(d) = display {
        let _ = d.join();
    }
}

/// The bar's styles: a round (its files of the round's and the time left) and the
/// cleanup (files removed so far).
fn styles(
    run_eta: Arc<std::sync::Mutex<String>>,
) -> (indicatif::ProgressStyle, indicatif::ProgressStyle) {
    let rate_key = |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
        let _ = w.write_str(&rate(s.per_sec()));
    };
    let round = indicatif::ProgressStyle::with_template(
        "{prefix:>12} {msg:<15} [{bar:25}] {pos}/{len} files {rate} ETA {eta} (run: {run_eta})",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .with_key("rate", rate_key)
    .with_key(
        "run_eta",
        move |_: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = w.write_str(
                run_eta
                    .lock()
                    .map(|s| s.clone())
                    .unwrap_or_default()
                    .as_str(),
            );
        },
    )
    .progress_chars("=> ");
    let cleanup = indicatif::ProgressStyle::with_template(
        "{prefix:>12} {msg:<15} {pos} files removed {rate}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .with_key("rate", rate_key);
    (round, cleanup)
}

/// The bar's loop, ten times a second until `done`.
fn show(progress: &Progress, names: &[&'static str], totals: &[u64], done: &AtomicBool) {
    let started = std::time::Instant::now();
    let run_eta = Arc::new(std::sync::Mutex::new("-".to_string()));
    let (round_style, cleanup_style) = styles(run_eta.clone());
    let mut bar = indicatif::ProgressBar::hidden();
    let mut shown = None;
    while !done.load(Ordering::Relaxed) {
        let (i, step, files) = progress.now();
        let total = totals.get(i).copied().unwrap_or(0);
        let what = match step {
            Step::Preparing => "preparing",
            Step::Timed if total > 0 && files >= total => "syncing",
            Step::Timed => names.get(i).copied().unwrap_or(""),
            Step::CleaningUp => "removing trees",
        };
        if shown != Some((i, step)) {
            // A bar of its own for each round and step, drawn once it is set up.
            shown = Some((i, step));
            bar.finish_and_clear();
            bar = indicatif::ProgressBar::with_draw_target(
                Some(total),
                indicatif::ProgressDrawTarget::hidden(),
            );
            if step == Step::CleaningUp {
                bar.set_style(cleanup_style.clone());
                bar.set_prefix("cleanup");
            } else {
                bar.set_style(round_style.clone());
                bar.set_prefix(format!("round {}/{}", i + 1, names.len()));
            }
            bar.set_message(what);
            bar.set_position(files);
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
        bar.set_message(what);
        if let Ok(mut e) = run_eta.lock() {
            *e = match run_left(totals, i, files, started.elapsed().as_secs_f64()) {
                Some(s) if step != Step::CleaningUp => left(s),
                _ => "-".to_string(),
            };
        }
        bar.set_position(files);
        std::thread::sleep(Duration::from_millis(100));
    }
    bar.finish_and_clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_times_read_as_a_person_reads_them() {
        assert_eq!(rate(66_688.871_1), "66.7k/s");
        assert_eq!(rate(830.2), "830/s");
        assert_eq!(rate(1_234_567.0), "1.2M/s");
        assert_eq!(left(45), "45s");
        assert_eq!(left(185), "3m05s");
        assert_eq!(left(3720), "1h02m");
    }

    #[test]
    fn a_round_its_step_and_its_files_are_read_together() {
        let p = Progress::default();
        p.set_round(3, Step::Timed);
        p.set_files(10);
        assert_eq!(p.now(), (3, Step::Timed, 10));
        p.set_round(4, Step::Preparing);
        assert_eq!(
            p.now(),
            (4, Step::Preparing, 0),
            "a new round starts at none"
        );
        p.set_round(4, Step::CleaningUp);
        p.set_files(7);
        assert_eq!(p.now(), (4, Step::CleaningUp, 7));
    }

    #[test]
    fn the_run_s_time_left_counts_every_round_s_files() {
        // Half of all the files done in 10 s: 10 s left.
        assert_eq!(run_left(&[100, 100], 1, 0, 10.0), Some(10));
        // A round's count past its total (its sync) counts as the round.
        assert_eq!(run_left(&[100, 100], 1, 500, 10.0), Some(0));
        assert_eq!(run_left(&[100, 100], 0, 0, 10.0), None);
    }
}
