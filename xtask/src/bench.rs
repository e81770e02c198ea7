//! `cargo xtask bench`: the kernel benchmark (pkeyfw/benches/kernel.rs).
//! It loads the XDP program, so it needs root, like the tests.

use anyhow::Result;

use crate::cmd;

/// Runs the benchmark; its tables go to standard output.
pub fn run() -> Result<()> {
    cmd::cargo(&["bench", "--package", "pkeyfw", "--bench", "kernel"])
}
