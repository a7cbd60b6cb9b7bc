//! `loadgen report`: charts and a page from result files.

use crate::*;

/// `loadgen report`: reads the result files (a run, a list of runs, login-storm runs) and
/// writes the charts and their page to `out`.
pub(crate) fn report_command(results: &[PathBuf], out: &Path, font: &Path) -> Result<(), Error> {
    let (runs, storms) = read_results(results)?;
    if runs.is_empty() && storms.is_empty() {
        return Err(user("no runs in the given files"));
    }
    let written =
        loadgen::charts::write_report(&runs, &storms, out, font).map_err(|e| match e {
            loadgen::charts::ChartError::Font { .. } | loadgen::charts::ChartError::BadFont(_) => {
                user(e.to_string())
            }
            other => Error::Failed(other.to_string()),
        })?;
    println!(
        "loadgen report: {} runs, {} files in {}",
        runs.len() + storms.len(),
        written.len(),
        out.display()
    );
    Ok(())
}

/// The runs and the login-storm runs in the files written by `--json`.
fn read_results(
    results: &[PathBuf],
) -> Result<(Vec<RunReport>, Vec<loadgen::storm::StormReport>), Error> {
    let mut runs: Vec<RunReport> = Vec::new();
    let mut storms: Vec<loadgen::storm::StormReport> = Vec::new();
    for f in results {
        let bytes =
            std::fs::read(f).map_err(|e| user(format!("cannot read {}: {e}", f.display())))?;
        let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
            user(format!(
                "{} is not JSON ({e}); give files written by --json",
                f.display()
            ))
        })?;
        let items = match value {
            serde_json::Value::Array(a) => a,
            v => vec![v],
        };
        let first_storm = storms.len();
        for item in items {
            let bad = |e: serde_json::Error| {
                user(format!(
                    "{} is not a loadgen result ({e}); give files written by --json",
                    f.display()
                ))
            };
            if item["schema"] == loadgen::storm::SCHEMA {
                storms.push(serde_json::from_value(item).map_err(bad)?);
            } else {
                runs.push(serde_json::from_value(item).map_err(bad)?);
            }
        }
        number_within_modes(&mut storms[first_storm..]);
    }
    Ok((runs, storms))
}

/// Numbers the timed runs of a file within their mode, as the storm does, where the file
/// was written before the number was recorded.
fn number_within_modes(storms: &mut [loadgen::storm::StormReport]) {
    let mut seen = [0usize; 2];
    for s in storms.iter_mut().filter(|s| !s.metered) {
        let n = &mut seen[usize::from(s.with_ccfs)];
        *n += 1;
        if s.mode_run == 0 {
            s.mode_run = *n;
        }
    }
}
