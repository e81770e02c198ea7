//! `cargo xtask bench`: the kernel benchmark (pkeyfw/benches/kernel/main.rs),
//! which loads the XDP program and so needs root, like the tests; then what
//! the QP-creation probe adds to creating a QP, in the soft-RoCE guest.
//!
//! The kernel bench writes its figures as one JSON document; its tables,
//! here and in docs/benchmarks.md, are renderings of that document.

mod page;
mod render;

use std::path::Path;

use anyhow::{Context as _, Result};

use crate::{cmd, guest, rxe_lab};

pub use page::run as page;

/// What the live bench runs beside the filter: nftables for the rule a user
/// would write by hand, ethtool for veth's own counters and its GRO switch.
const TOOLS: [(&str, &str); 2] = [("nft", "nftables"), ("ethtool", "ethtool")];

/// Runs the benchmarks; their tables go to standard output, and the kernel
/// bench's document to `json` if given.
pub fn run(json: Option<&Path>) -> Result<()> {
    guest::ensure_tools(&TOOLS)?;
    let out = cmd::root().join("target/bench.json");
    cmd::cargo(&[
        "bench",
        "--package",
        "pkeyfw",
        "--bench",
        "kernel",
        "--",
        "--json",
        out.to_str().context("a UTF-8 target directory")?,
    ])?;
    let text = std::fs::read_to_string(&out)?;
    let doc: serde_json::Value = serde_json::from_str(&text)?;
    println!("{}\n", render::header(&doc)?);
    for table in render::tables(&doc)? {
        println!("{}\n", table.text());
    }
    if let Some(json) = json {
        std::fs::write(json, &text).with_context(|| format!("writing {}", json.display()))?;
        println!(
            "Wrote {}; to show it in docs/benchmarks.md, copy it to {} and run `cargo xtask bench-readme`.\n",
            json.display(),
            page::document_path().display()
        );
    }
    println!(
        "QP creation in the soft-RoCE guest (Linux 6.1, qemu): median of 3 runs of 300 ibv_create_qp"
    );
    cmd::cargo(&["build", "--release", "--package", "pkeyfw"])?;
    rxe_lab::script(include_str!("qp_create.sh"), crate::guest::PRIMARY)
}
