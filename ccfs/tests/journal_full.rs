//! The journal on a cache filesystem that fills up: a failed append leaves nothing that
//! later records sit behind (a real, small tmpfs; needs root for the mount).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use ccfs::journal::Journal;
use ccfs::state::Record;

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop.
struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    fn new(size: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount")
            .success();
        assert!(ok, "mounting a tmpfs needs root");
        SmallFs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// Fills the filesystem until a write fails; returns the filler's path.
fn fill(dir: &Path) -> PathBuf {
    let filler = dir.join("filler");
    let mut f = fs::File::create(&filler).expect("filler");
    let chunk = vec![7u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.write_all(&[7u8]);
    filler
}

fn dirty(name: String) -> Record {
    Record::Dirty(PathBuf::from(name))
}

#[test]
fn a_failed_append_on_a_full_cache_loses_no_later_record() {
    let small = SmallFs::new("256k");
    let path = small.path().join("journal");
    let (mut j, _) = Journal::open(&path).expect("open");
    j.append(&[dirty(".before".into())]).expect("first append");
    let filler = fill(small.path());
    // Records long enough to need a new page: the write stops part way (or fails outright).
    let long: Vec<Record> = (0..200)
        .map(|i| dirty(format!(".failed-{i}-{}", "x".repeat(40))))
        .collect();
    assert!(
        j.append(&long).is_err(),
        "a full filesystem refuses the records"
    );
    fs::remove_file(&filler).expect("free space");
    j.append(&[dirty(".after-1".into())])
        .expect("append after space came back");
    j.append(&[dirty(".after-2".into())]).expect("another");
    drop(j);
    let (_, state) = Journal::open(&path).expect("replay");
    for p in [".before", ".after-1", ".after-2"] {
        assert!(state.is_dirty(Path::new(p)), "{p} survived the replay");
    }
    assert!(
        !state.is_dirty(Path::new(&format!(".failed-0-{}", "x".repeat(40)))),
        "nothing of the failed append counts"
    );
    let text = fs::read(&path).expect("journal");
    assert_eq!(
        ccfs::journal::decode(&text).1,
        text.len(),
        "the journal holds whole records only"
    );
}
