//! What loading costs: each program's instructions, the instructions the
//! verifier processed to accept it and the time it took, for a host's
//! port and a switch's; and the wall-clock time of a whole `pkeyfw attach
//! --pin` (every program loaded, the policy applied, the links pinned) on
//! a veth, as an operator or a service starts one.

use std::{process::Command, time::Instant};

use anyhow::{Context as _, Result, ensure};
use pkeyfw::{attachment::cost, loading::cost::VERIFIER_BUDGET};
use pkeyfw_testkit::netns::VethPair;
use serde_json::{Value, json};

/// `pkeyfw attach --pin` runs timed, the median kept.
const ATTACH_RUNS: usize = 7;

/// A stamping host port's policy: every program of a host attachment.
const POLICY: &str = "[port]\npkeys = [0xffff, 0x8001]\n\n[enforcement]\nstamp = true\n\n\
                      [[bind]]\nuid = 65534\npkey = 0x8001\n";

pub fn verifier() -> Result<Value> {
    let mut programs = Vec::new();
    for (role, switch) in [("host", false), ("switch", true)] {
        for c in cost::measure(switch)? {
            programs.push(json!({
                "program": c.program,
                "role": role,
                "insns": c.insns,
                "verified": c.verified,
                "load_ms": c.load.as_secs_f64() * 1e3,
            }));
        }
    }
    Ok(json!({ "budget": VERIFIER_BUDGET, "programs": programs }))
}

pub fn attach() -> Result<Value> {
    let pair = VethPair::create("pkfw-att")?;
    let dir = tempfile::tempdir()?;
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, POLICY)?;
    let pkeyfw = env!("CARGO_BIN_EXE_pkeyfw");
    let in_ns = |args: &[&str]| {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", VethPair::netns_path(&pair.ns_b)))
            .arg(pkeyfw)
            .args(args);
        c
    };
    let mut runs = Vec::new();
    for _ in 0..ATTACH_RUNS {
        let started = Instant::now();
        let out = in_ns(&["attach", &pair.b, "--pin", "--policy"])
            .arg(&policy)
            .output()
            .context("running pkeyfw attach")?;
        let took = started.elapsed();
        ensure!(
            out.status.success(),
            "pkeyfw attach --pin failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = in_ns(&["detach", &pair.b]).output()?;
        ensure!(out.status.success(), "pkeyfw detach failed");
        runs.push(took.as_secs_f64() * 1e3);
    }
    runs.sort_by(f64::total_cmp);
    Ok(json!({ "runs": ATTACH_RUNS, "median_ms": runs[ATTACH_RUNS / 2] }))
}
