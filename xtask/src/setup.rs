//! `cargo xtask setup`: the pinned toolchains (rust-toolchain.toml's, which
//! rustup may have installed already to run this, and the eBPF crate's
//! nightly with rust-src) and bpf-linker built against that nightly's own
//! libLLVM. Each step checks first, so a set-up machine is done in well
//! under a second.

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::cmd::{self, output, pinned};

pub fn run() -> Result<()> {
    let stable = cmd::toolchain(".")?;
    let nightly = cmd::toolchain("pkeyfw-ebpf")?;
    let linker = pinned("PKEYFW_BPF_LINKER")?;

    ensure_toolchain(&stable, &["clippy", "rustfmt"])?;
    ensure_toolchain(&nightly, &["rust-src"])?;
    ensure_bpf_linker(&nightly, &linker)
}

fn ensure_toolchain(name: &str, components: &[&str]) -> Result<()> {
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        name,
    ]));
    let missing: Vec<&str> = match &installed {
        Some(list) => components
            .iter()
            .copied()
            .filter(|c| {
                !list
                    .lines()
                    .any(|l| l.starts_with(&format!("{c}-")) || l == *c)
            })
            .collect(),
        None => components.to_vec(),
    };
    if installed.is_some() && missing.is_empty() {
        return Ok(());
    }
    let mut cmd = Command::new("rustup");
    cmd.args(["toolchain", "install", name, "--profile", "minimal"]);
    for c in components {
        cmd.args(["--component", c]);
    }
    cmd::run(&mut cmd).with_context(|| format!("installing toolchain {name}"))
}

fn ensure_bpf_linker(nightly: &str, version: &str) -> Result<()> {
    let have = output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if have.split_whitespace().any(|w| w == version) {
        return Ok(());
    }
    // bpf-linker links the LLVM it is built against; use the nightly's own, so
    // that the bitcode rustc emits and the LLVM that links it agree.
    let sysroot = output(
        Command::new("rustc")
            .arg(format!("+{nightly}"))
            .args(["--print", "sysroot"]),
    )
    .context("rustc of the eBPF nightly")?;
    let libdir = PathBuf::from(sysroot.trim()).join("lib");
    let soname = fs::read_dir(&libdir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libLLVM.so."))
        .with_context(|| format!("no libLLVM.so.* in {}", libdir.display()))?;
    let major = soname
        .trim_start_matches("libLLVM.so.")
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok())
        .with_context(|| format!("cannot read the LLVM major version from {soname}"))?;

    let prefix = llvm_prefix(major)?;
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib)?;
    // The soname file must really be there: bpf-linker's RUNPATH points at it.
    fs::copy(libdir.join(&soname), lib.join(&soname))
        .with_context(|| format!("copying {soname}"))?;
    let link = lib.join("libLLVM.so");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(&soname, &link)?;

    let mut cmd = Command::new("cargo");
    cmd.arg(format!("+{}", cmd::toolchain(".")?))
        .args([
            "install",
            "bpf-linker",
            "--version",
            version,
            "--locked",
            "--force",
        ])
        .args([
            "--no-default-features",
            "--features",
            &format!("llvm-{major}"),
        ])
        .env("LLVM_PREFIX", &prefix)
        .env_remove("RUSTUP_TOOLCHAIN");
    cmd::run(&mut cmd)?;
    let have = output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if !have.contains(version) {
        bail!(
            "bpf-linker {version} was installed but `bpf-linker --version` says {have:?}; is ~/.cargo/bin on PATH?"
        );
    }
    Ok(())
}

/// Where the copy of the nightly's libLLVM lives (outside the work tree, so a
/// fresh clone reuses it).
fn llvm_prefix(major: u32) -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(format!(".local/share/pkeyfw/llvm-{major}")))
}
