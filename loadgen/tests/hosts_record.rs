//! A multi-host run records what each host did, not what was asked: a host whose agent
//! could not drop its caches (not root there) is named, and the run's configuration says
//! the caches were not dropped.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::{loadgen, read_json, text};

#[test]
fn a_host_that_could_not_drop_its_caches_is_recorded_as_such() {
    if Command::new("id")
        .args(["-u", "nobody"])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        panic!("the test needs the user nobody");
    }
    let dir = tempfile::tempdir().expect("dir");
    // Both agents make their run directories here, one of them as nobody.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let scratch = tempfile::tempdir().expect("scratch");
    let launcher = scratch.path().join("ssh");
    // Stands in for ssh: h2's agent runs as nobody, as on a host where loadgen is not root.
    std::fs::write(
        &launcher,
        "#!/bin/sh\nhost=$1\nshift\n[ \"$host\" = h2 ] && exec runuser -u nobody -- sh -c \"$*\"\nexec sh -c \"$*\"\n",
    )
    .expect("launcher");
    std::fs::set_permissions(&launcher, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let json = scratch.path().join("r.json");
    let o = loadgen(&[
        "compilebench",
        dir.path().to_str().expect("utf8"),
        "--hosts",
        "h1,h2",
        "--ssh-command",
        launcher.to_str().expect("utf8"),
        "--scale",
        "0.01",
        "--phases",
        "create",
        "--json",
        json.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v = read_json(&json);
    assert_eq!(v["caches_not_dropped_on"], serde_json::json!(["h2"]), "{v}");
    assert_eq!(
        v["config"]["drop_caches"], false,
        "what happened, not what was asked"
    );
    assert!(
        v["warnings"].as_array().expect("warnings").iter().any(|w| w
            .as_str()
            .is_some_and(|w| w.starts_with("h2: caches were not dropped"))),
        "{v}"
    );
    common::validate(&v);
}

/// A class across hosts writes JSON that follows the schema, each host's part in it.
#[test]
fn a_storm_across_hosts_records_each_host_s_part_as_the_schema_says() {
    let share = tempfile::tempdir().expect("share");
    let work = tempfile::tempdir().expect("work");
    let out = tempfile::tempdir().expect("out");
    let json = out.path().join("s.json");
    let fake = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-ssh");
    let o = loadgen(&[
        "login-storm",
        "--share",
        share.path().to_str().expect("utf8"),
        "--work",
        work.path().to_str().expect("utf8"),
        "--hosts",
        "h1,h2,h3",
        "--users",
        "4",
        "--ssh-command",
        fake.to_str().expect("utf8"),
        "--session",
        "0",
        "--no-meter",
        "--json",
        json.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let all = read_json(&json);
    common::validate_against("login-storm-v2.schema.json", &all);
    let hosts: Vec<(String, u64)> = all[0]["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .map(|h| {
            (
                h["host"].as_str().unwrap_or("").to_string(),
                h["users"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        hosts,
        [
            ("h1".to_string(), 2),
            ("h2".to_string(), 1),
            ("h3".to_string(), 1)
        ],
        "four users over three hosts"
    );
}

/// `{host}` in `--share`: each host's users on that host's own mount of the share.
#[test]
fn each_host_plays_on_its_own_mount_of_the_share() {
    let shares = tempfile::tempdir().expect("shares");
    for h in ["h1", "h2"] {
        std::fs::create_dir(shares.path().join(h)).expect("mkdir");
    }
    let work = tempfile::tempdir().expect("work");
    let fake = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-ssh");
    let template = format!("{}/{{host}}", shares.path().display());
    let o = loadgen(&[
        "login-storm",
        "--share",
        &template,
        "--work",
        work.path().to_str().expect("utf8"),
        "--hosts",
        "h1,h2",
        "--users-per-host",
        "1",
        "--ssh-command",
        fake.to_str().expect("utf8"),
        "--session",
        "0",
        "--no-meter",
        "--keep",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    // Kept: user000's home is on h1's share, user001's on h2's.
    let homes = |h: &str| -> Vec<String> {
        let mut out = Vec::new();
        let mut todo = vec![shares.path().join(h)];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("user") {
                    out.push(name);
                } else if e.path().is_dir() {
                    todo.push(e.path());
                }
            }
        }
        out
    };
    assert_eq!(homes("h1"), ["user000"]);
    assert_eq!(homes("h2"), ["user001"]);
}
