//! Conflict names and the files that belong to a database.

use super::*;

#[test]
pub(super) fn conflict_names_fit_in_name_max_and_keep_whole_characters() {
    let long = "é".repeat(127); // 254 bytes
    let n = conflict_file_name(long.as_bytes(), "host", "20261123T101010Z", 1, 255);
    assert!(n.len() <= 255, "{}", n.len());
    let text = n.to_str().expect("still UTF-8");
    assert!(text.ends_with(".ccfs-conflict-host-20261123T101010Z"));
    assert!(text.starts_with("éé"));
    let short = conflict_file_name(b".bashrc", "h", "s", 3, 255);
    assert_eq!(short, OsString::from(".bashrc.ccfs-conflict-h-s-3"));
}

/// `X-wal`, `X-shm` and `X-journal` belong to database `X`; a name that is only an
/// ending belongs to none; a conflict name leaves room for the longest ending.
#[test]
pub(super) fn journals_and_wals_belong_to_their_database() {
    let of = |p: &str| database_of(Path::new(p)).map(|(db, end)| (db, end.to_string()));
    assert_eq!(
        of(".m/places.sqlite-wal"),
        Some((PathBuf::from(".m/places.sqlite"), "-wal".into()))
    );
    assert_eq!(
        of(".x-journal"),
        Some((PathBuf::from(".x"), "-journal".into()))
    );
    assert_eq!(of(".m/-shm"), None);
    assert_eq!(of(".m/places.sqlite"), None);
    let long = "d".repeat(250);
    let n = conflict_file_name(long.as_bytes(), "host", "20261123T101010Z", 1, 255 - 8);
    assert!(n.len() + "-journal".len() <= 255, "{}", n.len());
}
