//! `cargo xtask test`: formatting, lints, every test of the workspace, the
//! kernel ones included (they load the real XDP program, hence root), the
//! Debian package's checks, the soft-RoCE scenarios in the guest (the
//! package's unit under systemd among them), the kernel matrix (each
//! kernel the guest boots) and the CNI lab (the plugin under a runtime
//! and podman), each counted as a test.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use anyhow::{Result, bail};

use crate::cmd::{cargo, cargo_cmd, output};

/// Programs the tests run, and their Debian packages.
const TEST_TOOLS: &[(&str, &str)] = &[
    ("prometheus", "prometheus"),
    ("promtool", "prometheus"),
    ("systemd-analyze", "systemd"),
];

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
    // Tests run the real tools users have (tests/metrics.rs: Prometheus,
    // tests/service.rs: systemd-analyze).
    crate::guest::ensure_tools(TEST_TOOLS)?;
    let (mut passed, mut failed) = cargo_test(&["test", "--release", "--no-fail-fast"])?;
    // The Debian package, built and checked as Debian and an operator would.
    let package = crate::package::run()?;
    let (p, f) = crate::package::check::run(&package)?;
    passed += p;
    failed += f;
    crate::build()?;
    // A guest that cannot start fails the run, with the reason.
    let guests = [
        ("rxe-lab", crate::rxe_lab::run(&[])),
        ("kernels", crate::kernels::run(&crate::guest::KERNELS, None)),
        ("cni-lab", crate::cni_lab::run()),
    ];
    for (name, outcome) in guests {
        match outcome {
            Ok(o) => {
                passed += o.passed;
                failed += o.failed;
            }
            Err(e) => {
                println!("test {name} ... FAILED: {e:#}");
                failed += 1;
            }
        }
    }
    // One closing line for the whole run: the last test binary cargo reports
    // (a crate's doc tests) usually has none of its own.
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        bail!("{failed} tests failed");
    }
    Ok(())
}

/// Runs `cargo test`, passing its output through, and adds up its
/// `test result:` lines.
fn cargo_test(args: &[&str]) -> Result<(u64, u64)> {
    let mut cmd = cargo_cmd(args)?;
    eprintln!("+ cargo {}", args.join(" "));
    let mut child = cmd
        .current_dir(crate::cmd::root())
        .stdout(Stdio::piped())
        .spawn()?;
    let (mut passed, mut failed) = (0, 0);
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            passed += count(rest, " passed");
            failed += count(rest, " failed");
        }
    }
    let status = child.wait()?;
    if !status.success() && failed == 0 {
        bail!("cargo test failed ({status}) before running its tests");
    }
    Ok((passed, failed))
}

/// The number in front of `what` in `ok. 9 passed; 0 failed; ...`.
fn count(summary: &str, what: &str) -> u64 {
    summary
        .split([';', '.'])
        .find_map(|part| part.trim().strip_suffix(what.trim_start()))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}
