//! Writes the man pages and shell completions the Debian package ships
//! (`cargo xtask package` runs it with the package's features), generated
//! from the command line the binary parses, so that they cannot drift:
//!
//! `package_docs OUT` writes OUT/man/pkeyfw.8 and one page per command
//! (pkeyfw-attach.8, pkeyfw-policy-check.8, …), and OUT/completions/
//! pkeyfw.bash, _pkeyfw (zsh) and pkeyfw.fish.

use std::{fs, io, path::Path};

use clap::CommandFactory as _;
use clap_complete::{Shell, generate_to};
use clap_mangen::Man;
use pkeyfw::cli::Cli;

fn main() -> io::Result<()> {
    let out = std::env::args_os()
        .nth(1)
        .ok_or_else(|| io::Error::other("usage: package_docs OUT"))?;
    let out = Path::new(&out);
    let man = out.join("man");
    fs::create_dir_all(&man)?;
    // Built, so that each command knows its full name (pkeyfw-attach) and
    // how it is invoked (pkeyfw attach).
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    pages(&cmd, &man)?;

    let completions = out.join("completions");
    fs::create_dir_all(&completions)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        generate_to(shell, &mut Cli::command(), "pkeyfw", &completions)?;
    }
    Ok(())
}

/// A page for `cmd` in section 8 (system administration: it needs root),
/// and one for each of its visible commands, depth first.
fn pages(cmd: &clap::Command, dir: &Path) -> io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages(sub, dir)?;
    }
    let man = Man::new(cmd.clone())
        .section("8")
        .source(format!("pkeyfw {}", env!("CARGO_PKG_VERSION")))
        .manual("System Administration");
    let mut page = Vec::new();
    man.render(&mut page)?;
    fs::write(dir.join(man.get_filename()), page)
}
