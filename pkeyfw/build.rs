//! Builds the XDP program (pkeyfw-ebpf) for the BPF target with the pinned
//! nightly and bpf-linker, so that the CLI can embed the object.
use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    // Pinned in .cargo/config.toml; `cargo xtask setup` installs it.
    println!("cargo::rerun-if-env-changed=PKEYFW_EBPF_TOOLCHAIN");
    let toolchain = std::env::var("PKEYFW_EBPF_TOOLCHAIN")
        .context("PKEYFW_EBPF_TOOLCHAIN is not set (see .cargo/config.toml)")?;
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
        aya_build::Toolchain::Custom(&toolchain),
    )
}
