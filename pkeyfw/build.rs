//! Builds the XDP program (pkeyfw-ebpf) for the BPF target with the pinned
//! nightly and bpf-linker, so that the CLI can embed the object.
use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    // Pinned in pkeyfw-ebpf/rust-toolchain.toml; `cargo xtask setup`
    // installs it.
    let pin = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../pkeyfw-ebpf/rust-toolchain.toml"
    );
    println!("cargo::rerun-if-changed={pin}");
    // The programs are built from pkeyfw-common's rules too, which
    // aya-build does not watch (it watches pkeyfw-ebpf alone).
    println!(
        "cargo::rerun-if-changed={}",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../pkeyfw-common")
    );
    let text = std::fs::read_to_string(pin).with_context(|| format!("reading {pin}"))?;
    let toolchain = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("channel = "))
        .map(|c| c.trim_matches('"').to_string())
        .with_context(|| format!("{pin} names no channel"))?;
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
