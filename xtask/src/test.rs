//! `cargo xtask test`: formatting, lints, and every test of the workspace,
//! the kernel ones included (they load the real XDP program, hence root).

use std::process::Command;

use anyhow::{Result, bail};

use crate::cmd::{cargo, output};

pub fn run() -> Result<()> {
    let uid = output(Command::new("id").arg("-u")).unwrap_or_default();
    if uid.trim() != "0" {
        bail!(
            "the tests load the XDP program into the kernel and need root (CAP_BPF, CAP_NET_ADMIN); run `sudo -E cargo xtask test`"
        );
    }
    cargo(&["fmt", "--all", "--check"])?;
    cargo(&[
        "clippy",
        "--release",
        "--all-targets",
        "--",
        "--deny",
        "warnings",
    ])?;
    cargo(&["test", "--release", "--no-fail-fast"])
}
