//! `cargo xtask bench`: the kernel benchmark (pkeyfw/benches/kernel.rs),
//! which loads the XDP program and so needs root, like the tests; then what
//! the QP-creation probe adds to creating a QP, in the soft-RoCE guest.

use anyhow::Result;

use crate::{cmd, rxe_lab};

/// Runs the benchmarks; their tables go to standard output.
pub fn run() -> Result<()> {
    cmd::cargo(&["bench", "--package", "pkeyfw", "--bench", "kernel"])?;
    println!(
        "\nQP creation in the soft-RoCE guest (Linux 6.1, qemu): median of 3 runs of 300 ibv_create_qp"
    );
    cmd::cargo(&["build", "--release", "--package", "pkeyfw"])?;
    rxe_lab::script(include_str!("qp_create.sh"))
}
