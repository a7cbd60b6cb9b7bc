//! Man pages and shell completions generated from a binary's clap command (for the Debian
//! package: `ccfs generate-docs DIR`, `loadgen generate-docs DIR`): a page for the
//! command and for every visible subcommand at any depth, each with the sections of its
//! own the binary gives (EXAMPLES, FILES, ENVIRONMENT, EXIT STATUS), and no reference to
//! a page that is not made (no `help` subcommand pages).

use std::io;
use std::path::Path;

use clap_complete::Shell;

/// A section of a man page beyond what clap knows: the page (`ccfs`, `ccfs-mount`), its
/// title (`EXAMPLES`) and its text. The text is paragraphs split by blank lines; a
/// paragraph between lines of three backquotes is shown as it is written; a paragraph
/// whose lines after the first are indented by four spaces is a term and its description.
pub struct Section {
    pub page: &'static str,
    pub title: &'static str,
    pub text: String,
}

/// Writes `DIR/man/NAME.1` and one page per visible subcommand at any depth
/// (`NAME-SUB.1`, `NAME-SUB-SUBSUB.1`), and `DIR/completions/` for bash (`NAME`), zsh
/// (`_NAME`) and fish (`NAME.fish`).
pub fn generate(cmd: clap::Command, dir: &Path, sections: &[Section]) -> io::Result<()> {
    let man = dir.join("man");
    let completions = dir.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    let mut cmd = without_help_subcommands(cmd);
    cmd.build();
    let name = cmd.get_name().to_string();
    render_tree(&cmd, &name, &man, sections)?;
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

/// `cmd` and its subcommands without the `help` subcommand clap adds (it has no page:
/// `NAME help SUB` is `NAME SUB --help`).
fn without_help_subcommands(cmd: clap::Command) -> clap::Command {
    cmd.disable_help_subcommand(true)
        .mut_subcommands(without_help_subcommands)
}

/// The page of `cmd` (named `page`) and, below it, those of its visible subcommands.
fn render_tree(
    cmd: &clap::Command,
    page: &str,
    dir: &Path,
    sections: &[Section],
) -> io::Result<()> {
    render(&cmd.clone().name(page.to_string()), page, dir, sections)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        render_tree(sub, &format!("{page}-{}", sub.get_name()), dir, sections)?;
    }
    Ok(())
}

fn render(cmd: &clap::Command, page: &str, dir: &Path, sections: &[Section]) -> io::Result<()> {
    let man = clap_mangen::Man::new(cmd.clone());
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut out)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(&mut out)?;
    }
    if cmd.get_after_long_help().is_some() || cmd.get_after_help().is_some() {
        man.render_extra_section(&mut out)?;
    }
    for s in sections.iter().filter(|s| s.page == page) {
        out.extend(roff_section(s.title, &s.text).into_bytes());
    }
    if cmd.get_version().is_some() {
        man.render_version_section(&mut out)?;
    }
    std::fs::write(dir.join(format!("{page}.1")), out)
}

/// Text as roff shows it: backslashes escaped, a line starting with a dot or a quote
/// kept from being read as a request.
fn escape(line: &str) -> String {
    let s = line.replace('\\', "\\e");
    if s.starts_with(['.', '\'']) {
        format!("\\&{s}")
    } else {
        s
    }
}

/// A section in roff (see [`Section`] for the text's form).
fn roff_section(title: &str, text: &str) -> String {
    let mut out = format!(".SH \"{title}\"\n");
    let normal = text.replace("\r\n", "\n");
    let mut lines = normal.lines().peekable();
    let mut para: Vec<&str> = Vec::new();
    while let Some(line) = lines.next() {
        if line.trim() == "```" {
            out.push_str(&paragraph(&std::mem::take(&mut para)));
            // Shown as written, blank lines and all, up to the closing fence.
            out.push_str(".PP\n.RS 4\n.nf\n");
            for l in lines.by_ref().take_while(|l| l.trim() != "```") {
                out.push_str(&escape(l));
                out.push('\n');
            }
            out.push_str(".fi\n.RE\n");
        } else if line.trim().is_empty() {
            out.push_str(&paragraph(&std::mem::take(&mut para)));
        } else {
            para.push(line);
        }
    }
    out.push_str(&paragraph(&para));
    out
}

/// A paragraph's roff: a term and its description when the lines after the first are
/// indented by four spaces, else running text.
fn paragraph(lines: &[&str]) -> String {
    let Some(first) = lines.first() else {
        return String::new();
    };
    let joined = |ls: &[&str]| ls.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
    if lines.len() > 1 && lines[1..].iter().all(|l| l.starts_with("    ")) {
        format!(
            ".TP\n{}\n{}\n",
            escape(first.trim()),
            escape(&joined(&lines[1..]))
        )
    } else {
        format!(".PP\n{}\n", escape(&joined(lines)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_completions_name_every_visible_subcommand() {
        let cmd = clap::Command::new("tool")
            .about("a tool")
            .version("1.0")
            .subcommand(
                clap::Command::new("run")
                    .about("runs it")
                    .arg(clap::arg!(--fast "quickly")),
            )
            .subcommand(
                clap::Command::new("config")
                    .about("the config")
                    .subcommand(clap::Command::new("check").about("checks it")),
            )
            .subcommand(clap::Command::new("secret").hide(true));
        let dir = std::env::temp_dir().join(format!("clidocs-{}", std::process::id()));
        let sections = [Section {
            page: "tool",
            title: "EXAMPLES",
            text: "Run it:\n\n```\n  tool run --fast\n\n.dot \\ back\n```\n\nTOOL_LOG\n    how much it says"
                .into(),
        }];
        generate(cmd, &dir, &sections).expect("generate");
        let page = std::fs::read_to_string(dir.join("man/tool-run.1")).expect("tool-run.1");
        assert!(page.contains("runs it") && page.contains("fast"), "{page}");
        let top = std::fs::read_to_string(dir.join("man/tool.1")).expect("tool.1");
        assert!(top.contains("a tool"));
        let examples =
            ".SH \"EXAMPLES\"\n.PP\nRun it:\n.PP\n.RS 4\n.nf\n  tool run --fast\n\n\\&.dot \\e back\n.fi";
        assert!(top.contains(examples), "{top}");
        assert!(top.contains("\\&.dot \\e back"), "escaped: {top}");
        assert!(top.contains(".TP\nTOOL_LOG\nhow much it says"), "{top}");
        assert!(
            dir.join("man/tool-config-check.1").is_file(),
            "a nested subcommand has its page"
        );
        assert!(!dir.join("man/tool-help.1").exists());
        // Every page another refers to is there, and no page refers to `help`.
        for e in std::fs::read_dir(dir.join("man")).expect("ls").flatten() {
            let text = std::fs::read_to_string(e.path()).expect("page");
            assert!(!text.contains("help(1)"), "{}: {text}", e.path().display());
            for (i, _) in text.match_indices("(1)") {
                let name: String = text[..i]
                    .chars()
                    .rev()
                    .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '\\')
                    .collect::<String>()
                    .chars()
                    .rev()
                    .collect::<String>()
                    .replace("\\-", "-");
                assert!(
                    dir.join(format!("man/{name}.1")).is_file(),
                    "{} refers to {name}(1)",
                    e.path().display()
                );
            }
        }
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
