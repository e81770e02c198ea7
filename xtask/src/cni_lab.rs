//! `cargo xtask cni-lab`: pkeyfw as a CNI plugin, in the soft-RoCE guest
//! with Debian's CNI plugins and podman besides the RDMA userland. On
//! Linux 7.3 (whose rdma_rxe moves into a network namespace): the plugin
//! run by a runtime written to the specification for pods that are plain
//! namespaces (`plain.sh`), then by podman's own CNI code for pods that
//! are containers (`podman.sh`); on Linux 6.12, its refusals (`refused.sh`).
//! Each `check NAME` of a script is a test (`cni-lab::NAME`); one a script
//! never reports fails as not run. `measure` lines are printed.

use std::{fs, path::PathBuf, time::Duration};

use anyhow::{Context as _, Result};

use crate::{
    guest::{Guest, Init, Kernel},
    rxe_lab::{self, Outcome},
};

/// What the guest holds besides the RDMA userland: the bridge and
/// host-local plugins, podman (CNI network backend, crun, conmon), jq for
/// the scripts' runtime and curl for a scrape of `pkeyfw metrics`.
pub const PACKAGES: &[&str] = &["containernetworking-plugins", "podman", "jq", "curl"];

/// The scripts' shared part: a runtime, networks, pods, checks.
const LIB: &str = include_str!("cni_lab/lib.sh");

/// A guest and what it runs.
struct Run {
    kernel: &'static str,
    scripts: &'static [(&'static str, &'static str)],
}

const RUNS: [Run; 2] = [
    Run {
        kernel: "7.3",
        scripts: &[
            ("plain.sh", include_str!("cni_lab/plain.sh")),
            ("podman.sh", include_str!("cni_lab/podman.sh")),
        ],
    },
    Run {
        kernel: "6.12",
        scripts: &[("refused.sh", include_str!("cni_lab/refused.sh"))],
    },
];

/// Boot, every check and the ten pods at once under TCG.
const TIMEOUT: Duration = Duration::from_secs(40 * 60);

pub fn run() -> Result<Outcome> {
    let mut guests = Vec::new();
    for run in &RUNS {
        let kernel = Kernel::named(run.kernel)?;
        guests.push((run, Guest::ensure_with(kernel, PACKAGES)?, share(run)?));
    }
    let codes: Vec<Result<i32>> = std::thread::scope(|s| {
        let runs: Vec<_> = guests
            .iter()
            .map(|(_, guest, share)| s.spawn(move || guest.run(share, TIMEOUT, Init::Shell)))
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("a guest's thread panicked"))
            .collect()
    });
    let (mut passed, mut failed) = (0, 0);
    for ((run, _, share), code) in guests.iter().zip(codes) {
        let results = code
            .and_then(|_| {
                fs::read_to_string(share.join("results"))
                    .context("the guest wrote no results (see its output above)")
            })
            .unwrap_or_else(|e| {
                println!("test cni-lab::linux-{} ... FAILED: {e:#}", run.kernel);
                failed += 1;
                String::new()
            });
        for line in results.lines().filter(|l| l.starts_with("measure ")) {
            println!("cni-lab (Linux {}): {line}", run.kernel);
        }
        for (_, text) in run.scripts {
            for name in checks(text) {
                let ok = format!("ok {name}");
                let refused = format!("FAILED {name}:");
                match results
                    .lines()
                    .find(|l| *l == ok || l.starts_with(&refused))
                {
                    Some(line) if line == ok => {
                        println!("test cni-lab::{name} ... ok");
                        passed += 1;
                    }
                    Some(line) => {
                        println!("test cni-lab::{name} ... {line}");
                        failed += 1;
                    }
                    None => {
                        println!("test cni-lab::{name} ... FAILED: not run");
                        failed += 1;
                    }
                }
            }
        }
    }
    println!("\ncni-lab: {passed} passed, {failed} failed");
    Ok(Outcome { passed, failed })
}

/// The share of one guest: the release CLI, the library and the run's
/// scripts, one after the other as guest.sh.
fn share(run: &Run) -> Result<PathBuf> {
    let guest_sh: String = run
        .scripts
        .iter()
        .map(|(name, _)| format!("sh /share/{name} 2>&1\n"))
        .collect();
    let share = rxe_lab::share_in(&format!("cni-lab-{}", run.kernel), &guest_sh)?;
    fs::write(share.join("lib.sh"), LIB)?;
    for (name, text) in run.scripts {
        fs::write(share.join(name), text)?;
    }
    Ok(share)
}

/// The checks a script makes: the NAME of each line `check NAME …`.
fn checks(script: &str) -> Vec<&str> {
    script
        .lines()
        .filter_map(|l| l.strip_prefix("check "))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect()
}

/// `cargo xtask guest --containers`: the guest this lab boots.
pub fn guest(kernel: Kernel) -> Result<Guest> {
    Guest::ensure_with(kernel, PACKAGES)
}
