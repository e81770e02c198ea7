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

use crate::{
    cmd::{cargo, cargo_cmd, output},
    guest::pool::{self, Plan},
};

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
    // Tests run the real tools users have (tests/it/metrics.rs: Prometheus,
    // tests/it/deploy.rs: systemd-analyze).
    crate::guest::ensure_tools(TEST_TOOLS)?;
    let (mut passed, mut failed) = cargo_test(&["test", "--release", "--no-fail-fast"])?;
    // The Debian package, built and checked as Debian and an operator would.
    let package = crate::package::run()?;
    let (p, f) = crate::package::check::run(&package)?;
    passed += p;
    failed += f;
    crate::build()?;
    // Every lab's guests, two at a time; a lab that cannot be prepared
    // fails the run, with the reason.
    let mut plans = crate::rxe_lab::plans(&[]).unwrap_or_else(|e| vec![Plan::failed("rxe-lab", e)]);
    plans.push(
        crate::kernels::plan(&crate::guest::KERNELS, None)
            .unwrap_or_else(|e| Plan::failed("kernels", e)),
    );
    plans.push(crate::cni_lab::plan().unwrap_or_else(|e| Plan::failed("cni-lab", e)));
    let guests = pool::run(plans);
    passed += guests.passed;
    failed += guests.failed;
    // One closing line for the whole run: the last test binary cargo reports
    // (a crate's doc tests) usually has none of its own.
    crate::results::print_failures();
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
