//! Run directories: made, marked, finished, and the leftovers of runs that died.

use crate::*;

pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The target named on the command line: a directory, or an `nfs://` URL (whose calls
/// wait at most `io_timeout` seconds for the server).
pub(crate) fn parse_target(dir: &Path, io_timeout: u64) -> Result<Target, Error> {
    let mut t = Target::parse(&dir.to_string_lossy()).map_err(user)?;
    if let Target::Nfs(url) = &mut t {
        url.timeout = Duration::from_secs(io_timeout);
    }
    Ok(t)
}

/// Checks the target and makes the run directory with its marker.
pub(crate) fn prepare_run_dir(
    target: &Target,
    allow_nonempty: bool,
    group: Option<&str>,
) -> Result<PathBuf, Error> {
    let mut store = Store::connect(target);
    if let Store::Failed(e) = &store {
        return Err(user(e.clone()));
    }
    let name = target.describe();
    let base = target.base();
    let kind = store.stat(&base).map_err(|e| {
        user(format!(
            "{name} is not usable: {e}; give an existing directory on the filesystem to test"
        ))
    })?;
    if kind != Kind::Dir {
        return Err(user(format!("{name} is not a directory; give a directory")));
    }
    let base = match target {
        Target::Local(_) => {
            if let Some(why) = unsafe_for_root(&base) {
                return Err(user(why));
            }
            // From here on the resolved path: no link in it left to swap.
            loadgen::safety::resolved(&base)
                .map_err(|e| user(format!("cannot resolve {name}: {e}")))?
        }
        _ => base,
    };
    clear_leftovers(&mut store, &base, group);
    let empty = store
        .is_empty_dir(&base)
        .map_err(|e| user(format!("cannot list {name}: {e}")))?;
    if !empty && !allow_nonempty {
        return Err(user(format!(
            "{name} is not empty; use an empty directory, or --allow-nonempty (loadgen deletes only what it creates)"
        )));
    }
    let run = base.join(format!("loadgen-run-{}-{}", now_unix(), std::process::id()));
    store.mkdir(&run).map_err(|e| {
        let msg = format!(
            "cannot create {} in {name}: {e}; give a directory this user can write in",
            run.display()
        );
        // A directory one cannot write in is the caller's to fix (exit 2); anything
        // else is the target failing (exit 1).
        match e.kind() {
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
                user(msg)
            }
            _ => Error::Failed(msg),
        }
    })?;
    store
        .put(&run.join(".loadgen-run"), &marker(false, group))
        .map_err(|e| Error::Failed(format!("cannot write in {}: {e}", run.display())))?;
    Ok(run)
}

/// Marks a run directory kept on purpose (--keep): a later run leaves it alone.
pub(crate) fn mark_kept(target: &Target, run: &Path) {
    let _ = Store::connect(target).put(&run.join(".loadgen-run"), &marker(true, None));
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// A run directory's marker: whose it is (this process on this host, part of the
/// coordinated run `group` if any), and whether the run ended and kept it on purpose
/// (--keep).
pub(crate) fn marker(kept: bool, group: Option<&str>) -> Vec<u8> {
    let v = serde_json::json!({
        "tool": "loadgen",
        "pid": std::process::id(),
        "host": hostname(),
        "group": group,
        "kept": kept,
    });
    let mut b = v.to_string().into_bytes();
    b.push(b'\n');
    b
}

/// Whether a process `pid` runs on this host (any process: one that took the number over
/// keeps a directory from being taken for a leftover, never the other way round).
pub(crate) fn process_exists(pid: u64) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The run directories earlier runs left in `base`: one a run killed on this host left
/// (its process gone, not kept on purpose) is removed, saying so; any other is named with
/// how to remove it once its run is over.
pub(crate) fn clear_leftovers(store: &mut Store, base: &Path, group: Option<&str>) {
    let Ok(entries) = store.readdir(base) else {
        return;
    };
    for (name, kind) in entries {
        if kind != Kind::Dir || !name.starts_with("loadgen-run-") {
            continue;
        }
        let dir = base.join(&name);
        let m: Option<serde_json::Value> = store
            .open_read(&dir.join(".loadgen-run"), false)
            .ok()
            .and_then(|mut h| {
                let mut buf = vec![0u8; 4096];
                let n = store.read(&mut h, &mut buf).ok()?;
                let _ = store.close(h);
                serde_json::from_slice(&buf[..n]).ok()
            });
        let Some(m) = m.filter(|m| m["tool"] == "loadgen") else {
            eprintln!(
                "loadgen: note: {} has no loadgen marker; left alone",
                dir.display()
            );
            continue;
        };
        let pid = m["pid"].as_u64().unwrap_or(0);
        let host = m["host"].as_str().unwrap_or("").to_string();
        if group.is_some() && m["group"].as_str() == group {
            // Another agent of this very run, on a host sharing the directory.
            continue;
        }
        if m["kept"] == true {
            eprintln!(
                "loadgen: note: {} was kept by an earlier run (--keep); remove it with `rm -r {}` when done with it",
                dir.display(),
                dir.display()
            );
        } else if host == hostname()
            && pid > 0
            && !process_exists(pid)
            && !ours_to_remove(store, &dir)
        {
            eprintln!(
                "loadgen: note: {} looks left by a run that was killed, but is not this user's \
                 own directory; left alone (remove it by hand if it is a leftover)",
                dir.display()
            );
        } else if host == hostname() && pid > 0 && !process_exists(pid) {
            let removed = match store {
                // Without following a symbolic link put anywhere in it meanwhile.
                Store::Local => std::fs::remove_dir_all(&dir),
                _ => loadgen::engine::remove_tree(store, &dir),
            };
            match removed {
                Ok(()) => eprintln!(
                    "loadgen: removed {}, left by a run that was killed (pid {pid})",
                    dir.display()
                ),
                Err(e) => eprintln!(
                    "loadgen: note: {} was left by a run that was killed (pid {pid}) and cannot be removed ({e}); remove it with `rm -r {}`",
                    dir.display(),
                    dir.display()
                ),
            }
        } else {
            eprintln!(
                "loadgen: note: {} is another run's ({}pid {pid}); if that run is over, remove it with `rm -r {}`",
                dir.display(),
                if host.is_empty() { String::new() } else { format!("host {host}, ") },
                dir.display()
            );
        }
    }
}

/// Whether a leftover run directory is this user's to remove: on a local target, a real
/// directory (not a symbolic link) owned by this user, as the run directory loadgen made
/// is; anyone can write a marker. (Over NFS, loadgen's own client follows no symbolic
/// link, and the server checks every removal.)
pub(crate) fn ours_to_remove(store: &Store, dir: &Path) -> bool {
    match store {
        Store::Local => loadgen::safety::owned_by_me(dir),
        _ => true,
    }
}

/// Removes the run directory if it holds only what loadgen left (its marker); otherwise
/// says what is left and how to remove it.
pub(crate) fn finish_run_dir(target: &Target, run: &Path) -> Option<String> {
    let mut store = Store::connect(target);
    let marker = run.join(".loadgen-run");
    let left = |why: String| {
        Some(format!(
            "{why}; {} is left in place: it holds only what loadgen made, remove it with \
             `rm -r {}` (on the target) once it answers again",
            run.display(),
            run.display()
        ))
    };
    match store.stat(&marker) {
        Ok(Kind::File) => {}
        Ok(_) => return left(format!("{} is not loadgen's marker", marker.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Some(format!(
                "{} lost its marker (something removed it); left in place",
                run.display()
            ))
        }
        Err(e) => return left(format!("the run directory could not be checked ({e})")),
    }
    if let Err(e) = store.unlink(&marker) {
        return left(format!("its marker could not be removed ({e})"));
    }
    match store.rmdir(run) {
        Ok(()) => None,
        Err(e) => {
            // Put the marker back so a later look can tell whose directory this is.
            let _ = store.put(&marker, b"{\"tool\":\"loadgen\"}\n");
            left(format!("it was not empty at the end ({e})"))
        }
    }
}
