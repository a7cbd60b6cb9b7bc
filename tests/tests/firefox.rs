//! Real Firefox (Debian's firefox-esr, headless, in a network namespace of its own with no
//! route out) through a ccfs mount: a first start that makes the profile, a second start
//! that finds it, a logout; then every SQLite database on the share must pass SQLite's own
//! integrity check and hold what each start wrote.

use e2e::{read, sqlite, text, Fixture};

use std::path::{Path, PathBuf};
use std::process::Command;

/// Every regular file below `dir` that starts with SQLite's header.
fn databases(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("ls").flatten() {
            let p = e.path();
            let ft = e.file_type().expect("type");
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() {
                let mut head = [0u8; 16];
                let n = std::fs::File::open(&p)
                    .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
                    .unwrap_or(0);
                if n == 16 && &head == b"SQLite format 3\0" {
                    found.push(p);
                }
            }
        }
    }
    found.sort();
    found
}

/// Runs headless Firefox with HOME at `home`, in a network namespace of its own.
fn firefox(home: &Path, args: &[&str]) {
    let mut cmd = Command::new("unshare");
    cmd.args(["--net", "env"])
        .arg(format!("HOME={}", home.display()))
        .args(["firefox-esr", "--headless"])
        .args(args);
    let o = e2e::run_bounded(&mut cmd).expect("Firefox ended within a minute");
    assert!(o.status.success(), "firefox {args:?}: {}", text(&o));
}

#[test]
fn firefox_starts_twice_through_ccfs_then_again_by_block_and_every_database_on_the_share_is_intact()
{
    let fx = Fixture::new();
    let pages = fx.tmp.path().join("pages");
    std::fs::create_dir(&pages).expect("pages");
    for (name, key) in [
        ("first.html", "one"),
        ("second.html", "two"),
        ("third.html", "three"),
    ] {
        std::fs::write(
            pages.join(name),
            format!(
                "<html><title>{key}</title><body>{key}\
                 <script>localStorage.setItem('{key}', '{key}');</script></body></html>"
            ),
        )
        .expect("page");
    }
    let url = |name: &str| format!("file://{}", pages.join(name).display());
    let rel = ".mozilla/firefox/ccfs.default";
    let profile = fx.m(rel);
    let shot = fx.tmp.path().join("shot.png");
    let m = fx.mount();
    // A first start: the profile is made, then used; then a returning start.
    firefox(
        &fx.mnt,
        &["-CreateProfile", &format!("ccfs {}", profile.display())],
    );
    for page in ["first.html", "second.html"] {
        firefox(
            &fx.mnt,
            &[
                "--profile",
                profile.to_str().expect("utf8"),
                "--screenshot",
                shot.to_str().expect("utf8"),
                &url(page),
            ],
        );
        assert!(shot.is_file(), "Firefox rendered {page}");
        std::fs::remove_file(&shot).expect("rm");
    }
    let status = m.status();
    assert!(
        status["dirty_files"].as_u64().is_some_and(|n| n > 0),
        "the profile is cached until the logout: {status}"
    );
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    // On the share: the profile, its databases intact, with what both starts wrote.
    let on_share = fx.s(rel);
    let dbs = databases(&on_share);
    let names: Vec<String> = dbs
        .iter()
        .map(|p| {
            p.strip_prefix(&on_share)
                .expect("below")
                .display()
                .to_string()
        })
        .collect();
    for want in ["places.sqlite", "cookies.sqlite", "favicons.sqlite"] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    intact_with_history(&on_share, &["first.html", "second.html"].map(url));
    assert!(
        read(&on_share.join("prefs.js")).contains("user_pref("),
        "prefs.js reached the share"
    );
    // What is local-only stayed on the workstation.
    assert!(!fx.s(".cache").exists(), "no .cache on the share");
    // The user logs in on another workstation: the databases come from the share, and the
    // large ones are held by block (the default); a third page, a logout.
    let large: Vec<String> = dbs
        .iter()
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() >= 1 << 20))
        .map(|p| {
            p.strip_prefix(&on_share)
                .expect("below")
                .display()
                .to_string()
        })
        .collect();
    assert!(
        large.iter().any(|n| n == "places.sqlite"),
        "places.sqlite is large enough to be held by block: {large:?}"
    );
    // (The background copy of the blocks a database lacks after this session: the cache
    // file's holes tell that the take-over copied nothing.)
    let cfg = fx
        .config("[paths]\nby_block_fill_after_secs = 3600\n")
        .display()
        .to_string();
    let (mnt_b, cache_b) = fx.workstation("b");
    let m = fx.mount_at(&mnt_b, &cache_b, &["--config", &cfg]);
    let profile = mnt_b.join(rel);
    firefox(
        &mnt_b,
        &[
            "--profile",
            profile.to_str().expect("utf8"),
            "--screenshot",
            shot.to_str().expect("utf8"),
            &url("third.html"),
        ],
    );
    assert!(shot.is_file(), "Firefox rendered third.html");
    // Held by block: the cache file has only some of the database's blocks (the rest are
    // the share's, until the background copy or the logout).
    let cached = cache_b.join("upper").join(rel).join("places.sqlite");
    let len = std::fs::metadata(&cached).expect("cached places").len();
    let taken = std::fs::metadata(&cached).map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.blocks() * 512
    });
    assert!(
        taken.as_ref().is_ok_and(|t| *t < len),
        "places.sqlite held by block in the cache ({taken:?} of {len} bytes allocated)"
    );
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    intact_with_history(
        &on_share,
        &["first.html", "second.html", "third.html"].map(url),
    );
}

/// Every database of the profile on the share passes SQLite's integrity check, and its
/// history holds each of `urls`.
fn intact_with_history(on_share: &Path, urls: &[String]) {
    for db in &databases(on_share) {
        assert_eq!(
            sqlite(db, "pragma integrity_check"),
            "ok",
            "{}",
            db.display()
        );
    }
    let visited = sqlite(
        &on_share.join("places.sqlite"),
        "select url from moz_places",
    );
    for u in urls {
        assert!(
            visited.lines().any(|v| v == u),
            "{u} in the history: {visited}"
        );
    }
}
