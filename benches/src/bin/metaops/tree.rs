//! Operations on many directories: listing many small ones, renames within and across
//! them, and a walk (`find`, `git status`) over a home-like tree.
//!
//! "Cold" runs after the kernel's caches are dropped (`sync`, `drop_caches`: the dentries
//! and inodes a FUSE filesystem's kernel side keeps are forgotten, the daemon's own state
//! is not); "warm" repeats the same at once.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use super::{at, rate, Failure, Tag};

/// Drops the kernel's page, dentry and inode caches (root only).
pub fn drop_caches() -> Result<(), Failure> {
    let synced = at(Command::new("sync").status(), || "run sync".to_string())?;
    if !synced.success() {
        return Err(Failure(format!("sync: {synced}")));
    }
    at(fs::write("/proc/sys/vm/drop_caches", "3"), || {
        "drop caches (/proc/sys/vm/drop_caches; needs root)".to_string()
    })
}

/// Lists every directory once; returns the entries seen. With `stat_each`, each
/// directory is listed whole and then each of its entries looked at (lstat), as `ls -l`
/// and file managers do.
fn list_all(dirs: &[PathBuf], stat_each: bool) -> Result<usize, Failure> {
    let mut seen = 0;
    for d in dirs {
        let mut names = Vec::new();
        for e in at(fs::read_dir(d), || format!("list {}", d.display()))? {
            let e = at(e, || format!("list {}", d.display()))?;
            if stat_each {
                names.push(e.path());
            }
            seen += 1;
        }
        for p in &names {
            at(fs::symlink_metadata(p), || format!("lstat {}", p.display()))?;
        }
    }
    Ok(seen)
}

/// `ndirs` directories of `per_dir` files of 4 KiB below `dir` (which must be empty):
/// each listed once cold and once warm, then listed cold with each entry looked at, each
/// file renamed within its directory, then
/// moved to the next directory; all removed at the end. With `cold` false the cold
/// listing is left out (no caches dropped).
pub fn dirs(
    dir: &Path,
    ndirs: usize,
    per_dir: usize,
    cold: bool,
    tag: &Tag,
) -> Result<(), Failure> {
    if at(fs::read_dir(dir), || format!("list {}", dir.display()))?
        .next()
        .is_some()
    {
        return Err(Failure(format!("{} is not empty", dir.display())));
    }
    let data = vec![0x3cu8; super::FILE_SIZE];
    let dirs: Vec<PathBuf> = (0..ndirs).map(|d| dir.join(format!("d{d:04}"))).collect();
    for d in &dirs {
        at(fs::create_dir(d), || format!("mkdir {}", d.display()))?;
        for i in 0..per_dir {
            let f = d.join(format!("f{i:05}"));
            at(fs::write(&f, &data), || format!("create {}", f.display()))?;
        }
    }
    let total = ndirs * per_dir;
    // Names alone (cold, then warm), then each entry looked at too (cold).
    let mut passes = vec![("list-dirs-warm", false, false)];
    if cold {
        passes.insert(0, ("list-dirs-cold", true, false));
        passes.push(("list-stat-dirs-cold", true, true));
    }
    for (op, drop_first, stat_each) in passes {
        if drop_first {
            drop_caches()?;
        }
        let t = Instant::now();
        let seen = list_all(&dirs, stat_each)?;
        let secs = t.elapsed().as_secs_f64();
        if seen != total {
            return Err(Failure(format!("{op}: {seen} entries, made {total}")));
        }
        println!("{}", tag.line(op, rate(total, secs), "entries/s"));
    }

    let t = Instant::now();
    for d in &dirs {
        for i in 0..per_dir {
            let (from, to) = (d.join(format!("f{i:05}")), d.join(format!("r{i:05}")));
            at(fs::rename(&from, &to), || {
                format!("rename {}", from.display())
            })?;
        }
    }
    println!(
        "{}",
        tag.line(
            "rename-within",
            rate(total, t.elapsed().as_secs_f64()),
            "ops/s"
        )
    );
    let t = Instant::now();
    for (k, d) in dirs.iter().enumerate() {
        let next = &dirs[(k + 1) % ndirs];
        for i in 0..per_dir {
            let from = d.join(format!("r{i:05}"));
            let to = next.join(format!("m{k:04}-{i:05}"));
            at(fs::rename(&from, &to), || {
                format!("rename {}", from.display())
            })?;
        }
    }
    println!(
        "{}",
        tag.line(
            "rename-across",
            rate(total, t.elapsed().as_secs_f64()),
            "ops/s"
        )
    );
    let left = list_all(&dirs, false)?;
    if left != total {
        return Err(Failure(format!(
            "after the renames: {left} files, made {total}"
        )));
    }
    for d in &dirs {
        at(fs::remove_dir_all(d), || format!("remove {}", d.display()))?;
    }
    Ok(())
}

/// A home-like tree of `files` files below `root`: directories of 20 files each, three
/// subdirectories to a directory (depth grows as a home's does), file sizes from 100
/// bytes to 8 KiB. Returns how many files it made.
pub fn home_tree(root: &Path, files: usize) -> Result<usize, Failure> {
    let per_dir = 20;
    let ndirs = files.div_ceil(per_dir);
    let mut paths: Vec<PathBuf> = Vec::with_capacity(ndirs);
    let mut made = 0;
    for k in 0..ndirs {
        let dir = if k == 0 {
            root.to_path_buf()
        } else {
            paths[(k - 1) / 3].join(format!("dir{k}"))
        };
        if k > 0 {
            at(fs::create_dir(&dir), || format!("mkdir {}", dir.display()))?;
        }
        for j in 0..per_dir.min(files - made) {
            let size = 100 + (k * 7919 + j * 104_729) % 8092;
            let line = format!("{k}/{j}\n");
            let body = line.repeat(size / line.len() + 1);
            let f = dir.join(format!("file{j}.txt"));
            at(fs::write(&f, &body.as_bytes()[..size]), || {
                format!("create {}", f.display())
            })?;
            made += 1;
        }
        paths.push(dir);
    }
    Ok(made)
}

/// Runs a program in `dir` and gives its standard output.
fn run(dir: &Path, program: &str, args: &[&str]) -> Result<String, Failure> {
    let out = at(
        Command::new(program).args(args).current_dir(dir).output(),
        || format!("run {program} (is it installed?)"),
    )?;
    if !out.status.success() {
        return Err(Failure(format!(
            "{program} {} in {}: {}: {}",
            args.join(" "),
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The walk: a home-like tree of `files` files below `dir` (empty), committed to git;
/// then `find -type f` (the repository's own files left out) and `git status`, each cold
/// and warm, timed as files walked per second. The tree is removed at the end.
pub fn walk(dir: &Path, files: usize, cold: bool, tag: &Tag) -> Result<(), Failure> {
    if at(fs::read_dir(dir), || format!("list {}", dir.display()))?
        .next()
        .is_some()
    {
        return Err(Failure(format!("{} is not empty", dir.display())));
    }
    let made = home_tree(dir, files)?;
    let git = ["-c", "user.name=bench", "-c", "user.email=bench@localhost"];
    run(dir, "git", &[&git[..], &["init", "-q"]].concat())?;
    run(dir, "git", &[&git[..], &["add", "-A"]].concat())?;
    run(
        dir,
        "git",
        &[&git[..], &["commit", "-q", "-m", "tree"]].concat(),
    )?;
    let mut passes = vec![(false, "warm")];
    if cold {
        passes.insert(0, (true, "cold"));
    }
    for (drop_first, when) in &passes {
        if *drop_first {
            drop_caches()?;
        }
        let t = Instant::now();
        let listed = run(
            dir,
            "find",
            &[
                ".", "-path", "./.git", "-prune", "-o", "-type", "f", "-print",
            ],
        )?;
        let secs = t.elapsed().as_secs_f64();
        let found = listed.lines().count();
        if found != made {
            return Err(Failure(format!("find found {found} files, made {made}")));
        }
        println!(
            "{}",
            tag.line(&format!("find-{when}"), rate(made, secs), "files/s")
        );
    }
    for (drop_first, when) in &passes {
        if *drop_first {
            drop_caches()?;
        }
        let t = Instant::now();
        let status = run(dir, "git", &["status", "--porcelain"])?;
        let secs = t.elapsed().as_secs_f64();
        if !status.trim().is_empty() {
            let first = status.lines().next().unwrap_or_default();
            return Err(Failure(format!("git status found changes: {first}")));
        }
        let op = format!("git-status-{when}");
        println!("{}", tag.line(&op, rate(made, secs), "files/s"));
    }
    empty(dir)
}

/// Removes what `dir` holds, trying again where a filesystem listed a directory being
/// emptied short (fuse-overlayfs does: "Directory not empty").
fn empty(dir: &Path) -> Result<(), Failure> {
    let mut last = None;
    for _ in 0..5 {
        last = None;
        for e in at(fs::read_dir(dir), || format!("list {}", dir.display()))? {
            let p = at(e, || format!("list {}", dir.display()))?.path();
            let r = if p.is_dir() {
                fs::remove_dir_all(&p)
            } else {
                fs::remove_file(&p)
            };
            if let Err(e) = r {
                last = Some(format!("remove {}: {e}", p.display()));
            }
        }
        if last.is_none() {
            return Ok(());
        }
    }
    Err(Failure(last.unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag() -> Tag {
        Tag {
            target: "here".into(),
            repeat: 1,
        }
    }

    #[test]
    fn the_home_tree_has_the_files_asked_for_in_nested_directories() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(home_tree(dir.path(), 205).expect("tree"), 205);
        let mut files = 0;
        let mut deepest = 0;
        let mut stack = vec![(dir.path().to_path_buf(), 0)];
        while let Some((d, depth)) = stack.pop() {
            deepest = deepest.max(depth);
            for e in fs::read_dir(&d).expect("list") {
                let e = e.expect("entry");
                if e.file_type().expect("type").is_dir() {
                    stack.push((e.path(), depth + 1));
                } else {
                    files += 1;
                    let len = e.metadata().expect("stat").len();
                    assert!((100..8192).contains(&len), "{len}");
                }
            }
        }
        assert_eq!(files, 205);
        assert!(deepest >= 2, "depth {deepest}");
    }

    #[test]
    fn dirs_and_walk_leave_nothing_and_refuse_a_full_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        dirs(dir.path(), 3, 7, false, &tag()).expect("dirs");
        assert_eq!(fs::read_dir(dir.path()).expect("list").count(), 0);
        walk(dir.path(), 45, false, &tag()).expect("walk");
        assert_eq!(fs::read_dir(dir.path()).expect("list").count(), 0);
        fs::write(dir.path().join("stray"), b"x").expect("stray");
        let err = dirs(dir.path(), 1, 1, false, &tag()).expect_err("refused");
        assert!(err.0.contains("not empty"), "{}", err.0);
        let err = walk(dir.path(), 1, false, &tag()).expect_err("refused");
        assert!(err.0.contains("not empty"), "{}", err.0);
    }
}
