//! `ccfs demo`: a class logs in on a throwaway share, without then with ccfs.

use crate::*;

pub(crate) fn run_self(args: &[&std::ffi::OsStr]) -> Result<String, Error> {
    let exe = std::env::current_exe().map_err(|e| fail(format!("cannot find own binary: {e}")))?;
    let out = Command::new(exe)
        .args(args)
        .output()
        .map_err(|e| fail(format!("cannot run ccfs: {e}")))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(fail(format!(
            "`ccfs {}` failed: {text}",
            args.join(std::ffi::OsStr::new(" ")).to_string_lossy()
        )));
    }
    Ok(text)
}

pub(crate) fn show(label: &str, path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(t) => format!("{label:<44} {:?}", t.trim_end()),
        Err(_) => format!("{label:<44} (absent)"),
    }
}

pub(crate) fn demo(keep: bool) -> Result<(), Error> {
    let base = std::env::temp_dir().join(format!("ccfs-demo-{}", std::process::id()));
    let share = base.join("netshare/users/alice");
    let home = base.join("home/alice");
    let cache = base.join("cache");
    for d in [&share, &home] {
        std::fs::create_dir_all(d)
            .map_err(|e| fail(format!("cannot create {}: {e}", d.display())))?;
    }
    let io = |e: std::io::Error| fail(format!("demo: {e}"));
    std::fs::create_dir_all(share.join(".mozilla/firefox/demo.default")).map_err(io)?;
    std::fs::write(
        share.join(".mozilla/firefox/demo.default/prefs.js"),
        "user_pref(\"browser.startup.page\", 1);\n",
    )
    .map_err(io)?;
    std::fs::create_dir_all(share.join("Documents")).map_err(io)?;
    say!("== ccfs demo in {}", base.display());
    say!("share (the file server):  {}", share.display());
    say!("home  (the ccfs mount):   {}\n", home.display());
    say_raw!(
        "{}",
        run_self(&[
            "mount".as_ref(),
            "--cache-dir".as_ref(),
            cache.as_os_str(),
            share.as_os_str(),
            home.as_os_str()
        ])?
    );
    let prefs = ".mozilla/firefox/demo.default/prefs.js";
    let result = (|| -> Result<(), Error> {
        std::fs::write(
            home.join(prefs),
            "user_pref(\"browser.startup.page\", 3);\n",
        )
        .map_err(io)?;
        std::fs::write(home.join(".bashrc"), "alias ll='ls -l'\n").map_err(io)?;
        std::fs::create_dir_all(home.join(".cache/thumbnails")).map_err(io)?;
        std::fs::write(home.join(".cache/thumbnails/1.png"), "not really a png").map_err(io)?;
        std::fs::write(home.join("Documents/essay.txt"), "My essay, first draft.\n").map_err(io)?;
        say!(
            "\n-- during the session (the user wrote four files through {}):",
            home.display()
        );
        say!("{}", show("  home  prefs.js", &home.join(prefs)));
        say!(
            "{}",
            show("  share prefs.js  (still the old one)", &share.join(prefs))
        );
        say!(
            "{}",
            show("  share .bashrc   (not there yet)", &share.join(".bashrc"))
        );
        say!(
            "{}",
            show(
                "  share Documents/essay.txt (written at once)",
                &share.join("Documents/essay.txt")
            )
        );
        say!("\n-- ccfs status:");
        say_raw!("{}", run_self(&["status".as_ref(), home.as_os_str()])?);
        say!("\n-- logout (ccfs umount):");
        say_raw!("{}", run_self(&["umount".as_ref(), home.as_os_str()])?);
        say!("\n-- after logout, on the share:");
        say!("{}", show("  share prefs.js", &share.join(prefs)));
        say!("{}", show("  share .bashrc", &share.join(".bashrc")));
        say!(
            "{}",
            show(
                "  share .cache/thumbnails/1.png (local only)",
                &share.join(".cache/thumbnails/1.png")
            )
        );
        let synced = std::fs::read_to_string(share.join(prefs))
            .map_err(io)?
            .contains(", 3)")
            && share.join(".bashrc").is_file()
            && !share.join(".cache").exists();
        if !synced {
            return Err(fail("the share does not hold what the session wrote"));
        }
        say!("\nccfs demo: ok");
        Ok(())
    })();
    if daemon::ccfs_mounts()
        .map(|m| m.contains(&home))
        .unwrap_or(false)
    {
        let _ = Command::new("fusermount3").arg("-u").arg(&home).status();
    }
    if keep {
        say!("\nkept {}", base.display());
    } else {
        let _ = std::fs::remove_dir_all(&base);
    }
    result
}
