//! Builds the XDP program (pkeyfw-ebpf) for the BPF target with the pinned
//! nightly and bpf-linker, so that the CLI can embed the object.
use anyhow::{Context as _, anyhow};

/// The nightly that builds the eBPF crate; `cargo xtask setup` installs it.
/// Keep in step with xtask/src/toolchain.rs.
const EBPF_TOOLCHAIN: &str = "nightly-2026-10-30";

fn main() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == "pkeyfw-ebpf")
        .ok_or_else(|| anyhow!("pkeyfw-ebpf package not found"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: ebpf.name.as_str(),
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(EBPF_TOOLCHAIN),
    )
}
