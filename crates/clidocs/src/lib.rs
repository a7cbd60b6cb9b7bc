//! Man pages and shell completions generated from a binary's clap command (for the Debian
//! package: `ccfs generate-docs DIR`, `loadgen generate-docs DIR`).

use std::io;
use std::path::Path;

use clap_complete::Shell;

/// Writes `DIR/man/NAME.1` and one page per visible subcommand (`NAME-SUB.1`), and
/// `DIR/completions/` for bash (`NAME`), zsh (`_NAME`) and fish (`NAME.fish`).
pub fn generate(mut cmd: clap::Command, dir: &Path) -> io::Result<()> {
    let man = dir.join("man");
    let completions = dir.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    cmd.build();
    let name = cmd.get_name().to_string();
    render(&cmd, &name, &man)?;
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        let page = format!("{name}-{}", sub.get_name());
        render(&sub.clone().name(page.clone()), &page, &man)?;
    }
    for (shell, file) in [
        (Shell::Bash, name.clone()),
        (Shell::Zsh, format!("_{name}")),
        (Shell::Fish, format!("{name}.fish")),
    ] {
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut cmd, &name, &mut out);
        std::fs::write(completions.join(file), out)?;
    }
    Ok(())
}

fn render(cmd: &clap::Command, page: &str, dir: &Path) -> io::Result<()> {
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut out)?;
    std::fs::write(dir.join(format!("{page}.1")), out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_completions_name_every_visible_subcommand() {
        let cmd = clap::Command::new("tool")
            .about("a tool")
            .subcommand(
                clap::Command::new("run")
                    .about("runs it")
                    .arg(clap::arg!(--fast "quickly")),
            )
            .subcommand(clap::Command::new("secret").hide(true));
        let dir = std::env::temp_dir().join(format!("clidocs-{}", std::process::id()));
        generate(cmd, &dir).expect("generate");
        let page = std::fs::read_to_string(dir.join("man/tool-run.1")).expect("tool-run.1");
        assert!(page.contains("runs it") && page.contains("fast"), "{page}");
        assert!(std::fs::read_to_string(dir.join("man/tool.1"))
            .expect("tool.1")
            .contains("a tool"));
        assert!(
            !dir.join("man/tool-secret.1").exists(),
            "hidden commands get no page"
        );
        let bash = std::fs::read_to_string(dir.join("completions/tool")).expect("bash");
        assert!(bash.contains("run") && bash.contains("--fast"), "{bash}");
        assert!(
            dir.join("completions/_tool").is_file() && dir.join("completions/tool.fish").is_file()
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
