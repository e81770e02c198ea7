//! `cargo xtask bench`: the kernel benchmark (pkeyfw/benches/kernel/main.rs),
//! which loads the XDP program and so needs root, like the tests; then what
//! the QP-creation probe adds to creating a QP, in the soft-RoCE guest.

use anyhow::Result;

use crate::{cmd, guest, rxe_lab};

/// What the live bench runs beside the filter: nftables for the rule a user
/// would write by hand, ethtool for veth's own counters and its GRO switch.
const TOOLS: [(&str, &str); 2] = [("nft", "nftables"), ("ethtool", "ethtool")];

/// Runs the benchmarks; their tables go to standard output.
pub fn run() -> Result<()> {
    guest::ensure_tools(&TOOLS)?;
    cmd::cargo(&["bench", "--package", "pkeyfw", "--bench", "kernel"])?;
    println!(
        "\nQP creation in the soft-RoCE guest (Linux 6.1, qemu): median of 3 runs of 300 ibv_create_qp"
    );
    cmd::cargo(&["build", "--release", "--package", "pkeyfw"])?;
    rxe_lab::script(include_str!("qp_create.sh"))
}
