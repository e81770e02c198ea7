//! Running commands, loudly.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result, bail};

/// A pinned setting from .cargo/config.toml's [env].
pub fn pinned(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set; run through `cargo xtask`"))
}

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Runs a command to completion, failing on a non-zero exit.
pub fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {}", show(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {}", show(cmd)))?;
    if !status.success() {
        bail!("{} failed ({status})", show(cmd));
    }
    Ok(())
}

/// Runs a command and returns its standard output, or `None` if it failed.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `cargo +<pinned stable> ARGS` in the workspace root.
pub fn cargo(args: &[&str]) -> Result<()> {
    run(cargo_cmd(args)?.current_dir(root()))
}

pub fn cargo_cmd(args: &[&str]) -> Result<Command> {
    let mut cmd = Command::new("cargo");
    cmd.arg(format!("+{}", pinned("PKEYFW_TOOLCHAIN")?))
        .args(args);
    // The outer `cargo xtask` may have chosen another toolchain for us.
    cmd.env_remove("RUSTUP_TOOLCHAIN");
    Ok(cmd)
}

fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}
