//! `cargo xtask cni-lab`: pkeyfw as a CNI plugin, in the soft-RoCE guest
//! with Debian's CNI plugins and podman besides the RDMA userland. On
//! Linux 7.3 (whose rdma_rxe moves into a network namespace): the plugin
//! run by the test kit's runtime (`pkeyfw-lab-cni`, as libcni runs a
//! conflist) for pods that are plain namespaces (`plain.sh`), then by
//! podman's own CNI code for pods that are containers (`podman.sh`); on
//! Linux 6.12, its refusals (`refused.sh`).
//! Each `check NAME` of a script is a test (`cni-lab::NAME`, see
//! [`results`]); `measure` lines are printed.

use std::{fs, path::PathBuf, time::Duration};

use anyhow::Result;

use crate::{
    guest::{
        Guest, Init, Kernel,
        pool::{self, Boot, Plan},
    },
    results::{self, Outcome},
    rxe_lab,
};

/// What the guest holds besides the RDMA userland: the bridge and
/// host-local plugins, podman (CNI network backend, crun, conmon), jq for
/// reading the plugin's port records and curl for a scrape of `pkeyfw
/// metrics`. (The pods' runtime is the test kit's `pkeyfw-lab-cni`, which
/// every share holds.)
pub const PACKAGES: &[&str] = &["containernetworking-plugins", "podman", "jq", "curl"];

/// The scripts' shared part: networks, pods, what the checks read.
const LIB: &str = include_str!("cni_lab/lib.sh");

/// A guest and what it runs.
struct Run {
    kernel: &'static str,
    scripts: &'static [(&'static str, &'static str)],
    /// About how long it takes (see `pool::Boot::minutes`).
    minutes: u32,
}

const RUNS: [Run; 2] = [
    Run {
        kernel: "7.3",
        scripts: &[
            ("plain.sh", include_str!("cni_lab/plain.sh")),
            ("podman.sh", include_str!("cni_lab/podman.sh")),
        ],
        minutes: 18,
    },
    Run {
        kernel: "6.12",
        scripts: &[("refused.sh", include_str!("cni_lab/refused.sh"))],
        minutes: 2,
    },
];

/// Boot, every check and the ten pods at once under TCG.
const TIMEOUT: Duration = Duration::from_secs(40 * 60);

pub fn run() -> Result<Outcome> {
    Ok(pool::run(vec![plan()?]))
}

/// A boot per run, and their test lines (see the module's).
pub fn plan() -> Result<Plan> {
    let boots = RUNS
        .iter()
        .map(|run| {
            Ok(Boot {
                label: format!("cni-lab-{}", run.kernel),
                guest: Guest::ensure_with(Kernel::named(run.kernel)?, PACKAGES)?,
                share: share(run)?,
                init: Init::Shell,
                timeout: TIMEOUT,
                minutes: run.minutes,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let shares: Vec<PathBuf> = boots.iter().map(|b| b.share.clone()).collect();
    Ok(Plan {
        boots,
        judge: Box::new(move |codes| {
            let mut outcome = Outcome::default();
            for ((run, share), code) in RUNS.iter().zip(shares).zip(codes) {
                let scripts: Vec<&str> = run.scripts.iter().map(|(_, text)| *text).collect();
                outcome.add(results::judge(
                    code.and_then(|_| results::read(&share)),
                    &format!("cni-lab::linux-{}", run.kernel),
                    "cni-lab",
                    &scripts,
                ));
            }
            println!(
                "\ncni-lab: {} passed, {} failed",
                outcome.passed, outcome.failed
            );
            outcome
        }),
    })
}

/// The share of one guest: the release CLI, the test kit's binaries, the
/// library and the run's scripts, one after the other as guest.sh.
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

/// `cargo xtask guest --containers`: the guest this lab boots.
pub fn guest(kernel: Kernel) -> Result<Guest> {
    Guest::ensure_with(kernel, PACKAGES)
}
