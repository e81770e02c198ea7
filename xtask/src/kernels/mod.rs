//! The kernel matrix: pkeyfw on every kernel the guest boots
//! ([`KERNELS`]). On each, what the kernel offers and what each program
//! costs it (`pkeyfw kernel --programs --json`: every program within the
//! verifier's budget where the kernel says what it processed), the
//! README's lab (`pkeyfw lab`), and the soft-RoCE scenarios that define
//! the product ([`CORE`]); the primary kernel runs every scenario besides,
//! in `rxe_lab`, and the QP table's tear test (`pkeyfw/tests/it/tear.rs`,
//! the integration tests' binary filtered to it) instead. What each kernel
//! offered and cost is kept as JSON, from which docs/kernels.md's tables
//! are rendered.

use std::{
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::{
    cmd,
    guest::{
        Guest, Init, KERNELS, Kernel, PRIMARY,
        pool::{self, Boot, Plan},
    },
    results::Outcome,
    rxe_lab,
};

mod page;

/// The scenarios that define the product: a stamped pair across
/// partitions (UD and RC), binding at creation by cgroup, a pinned
/// attachment replaced across a restart, quarantine, connection setup
/// inside partitions (rping's REQs across partitions and between limited
/// members refused unseen, the listeners then serving their own), and
/// tenants on one host with devices of their own (UD, rdma_cm, a stall
/// between partitions, and between limited members with the device guard
/// tried).
pub const CORE: &str = "stamp-ud-a-b,stamp-rc-b-c,tenant-cgroup-a-b,stamp-rc-restart,fill-table,\
    cm-rping,own-device-ud-a-b,own-device-rping-a-b,own-device-ud-a-d,own-device-rc-b-c";

/// What a kernel without the RDMA-core probes and rdma_rxe's BTF can do
/// (5.10): judge unstamped pairs by partition and Q_Key (the policy's:
/// the Q_Key a program sets is not captured), their QPs bound by cgroup as
/// a foreground attach finds them.
pub const UNSTAMPED: &str = "rc-default-partition,rc-other-partition,ud-qkey-match,ud-qkey-other";

/// The scenarios for `kernel`.
fn scenarios(kernel: Kernel) -> &'static str {
    if kernel.name == "5.10" {
        UNSTAMPED
    } else {
        CORE
    }
}

/// What `attach` must say where the kernel (its `pkeyfw kernel --json`
/// features) lacks what a scenario would use: the feature, and the line.
const SAYS: [(&str, &str); 3] = [
    (
        "RDMA-core probes (Linux 6.1)",
        "QP creation is not probed (the probes need Linux 6.1 or later",
    ),
    (
        "RDMA-core probes (Linux 6.1)",
        "connection setup is not partitioned (the probes need Linux 6.1 or later",
    ),
    (
        "rdma_rxe's BTF (CONFIG_DEBUG_INFO_BTF_MODULES)",
        "rdma_rxe's QPs cannot be told apart (the kernel has no BTF for module rdma_rxe",
    ),
];

/// Instructions the verifier may process for one program (as
/// `pkeyfw::loading::cost::VERIFIER_BUDGET`).
const VERIFIER_BUDGET: u64 = 100_000;

/// A guest's whole run, boot and emulation included.
const TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// What a guest's script runs: the kernel's features and the programs'
/// costs, the README's lab, and (but on the primary kernel, which runs
/// them all elsewhere, and the tear test instead) the core scenarios.
fn script(kernel: Kernel) -> String {
    let run = if kernel == PRIMARY {
        format!(
            "./{TESTS} {TEAR} --test-threads 1 --nocapture > tear.txt 2>&1\n\
             echo $? > tear.status\n\
             tail -4 tear.txt\n"
        )
    } else {
        format!(
            "./pkeyfw lab rxe --captures captures --json results.json --only {} 2>&1 | tee rxe.txt\n\
             echo \"pkeyfw lab rxe exited $?\"\n",
            scenarios(kernel)
        )
    };
    // A stamped pair run for what attach says alone, where the kernel
    // cannot stamp (its outcome is not the scenario's, which stamps).
    let says = if scenarios(kernel) == UNSTAMPED {
        "./pkeyfw lab rxe --only stamp-rc-b-c > says.txt 2>&1\n"
    } else {
        ""
    };
    format!(
        "uname -r\n\
         {says}\
         ./pkeyfw kernel --programs --json > kernel.json 2> kernel.err\n\
         echo $? > kernel.status\n\
         ./pkeyfw lab > lab.txt 2>&1\n\
         echo $? > lab.status\n\
         tail -3 lab.txt\n\
         {run}"
    )
}

/// Runs the matrix on `kernels`; with `json`, writes what each kernel
/// offered and cost there.
pub fn run(kernels: &[Kernel], json: Option<PathBuf>) -> Result<Outcome> {
    Ok(pool::run(vec![plan(kernels, json)?]))
}

/// A boot per kernel of `kernels`, and their test lines (see [`run`]).
pub fn plan(kernels: &[Kernel], json: Option<PathBuf>) -> Result<Plan> {
    let boots = kernels
        .iter()
        .map(|&k| {
            let label = format!("kernel-{}", k.name);
            let share = rxe_lab::share_in(&label, &script(k))?;
            if k == PRIMARY {
                fs::copy(tests()?, share.join(TESTS))
                    .context("copying the integration tests into the guest's share")?;
            }
            Ok(Boot {
                guest: Guest::ensure(k)?,
                share,
                label,
                init: Init::Shell,
                timeout: TIMEOUT,
                minutes: 2,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let ran: Vec<(Kernel, PathBuf)> = kernels
        .iter()
        .copied()
        .zip(boots.iter().map(|b| b.share.clone()))
        .collect();
    Ok(Plan {
        boots,
        judge: Box::new(move |codes| {
            let mut outcome = Outcome::default();
            let mut rows = Vec::new();
            for ((kernel, share), code) in ran.into_iter().zip(codes) {
                let prefix = format!("kernel-{}", kernel.name);
                match code.and_then(|code| check(kernel, &share, code, &prefix)) {
                    Ok((o, row)) => {
                        outcome.add(o);
                        rows.push(row);
                    }
                    Err(e) => outcome.add(Outcome::failed(&prefix, &e)),
                }
            }
            if let Some(path) = json
                && let Err(e) = page::write(&path, rows)
            {
                outcome.add(Outcome::failed("kernels::json", &e));
            }
            println!(
                "\nkernels: {} passed, {} failed",
                outcome.passed, outcome.failed
            );
            outcome
        }),
    })
}

/// The test lines of one kernel's run (its guest script exited `code`),
/// and its row of the document.
fn check(kernel: Kernel, share: &Path, code: i32, prefix: &str) -> Result<(Outcome, Value)> {
    if code != 0 {
        bail!("the guest script failed ({code})");
    }
    let report = read_report(share);
    let lab = lab(share);
    let lab_ok = lab.is_ok();
    let mut checks = vec![
        (
            "verifier",
            report
                .as_ref()
                .map_err(|e| anyhow::anyhow!("{e:#}"))
                .and_then(within_budget),
        ),
        ("lab", lab),
    ];
    let mut outcome = Outcome {
        passed: 0,
        failed: 0,
    };
    let mut scenarios = Vec::new();
    if kernel == PRIMARY {
        checks.push(("tear", tear(share)));
    } else {
        let results = rxe_lab::results(share)?;
        outcome = rxe_lab::judge(&results, prefix);
        scenarios = results
            .iter()
            .map(|(_, s)| json!({ "name": s["name"], "ok": s["ok"] }))
            .collect();
        if let Ok(report) = &report {
            checks.push(("says-what-it-will-not-do", says(report, share)));
        }
    }
    for (name, result) in checks {
        match result {
            Ok(()) => {
                println!("test {prefix}::{name} ... ok");
                outcome.passed += 1;
            }
            Err(e) => {
                crate::results::fail(&format!("{prefix}::{name}"), &format!("{e:#}"));
                outcome.failed += 1;
            }
        }
    }
    let mut row = report.unwrap_or_else(|_| json!({}));
    row["name"] = kernel.name.into();
    row["lab"] = lab_ok.into();
    row["scenarios"] = scenarios.into();
    Ok((outcome, row))
}

/// What `pkeyfw kernel --programs --json` said in the guest.
fn read_report(share: &Path) -> Result<Value> {
    let status = fs::read_to_string(share.join("kernel.status")).unwrap_or_default();
    if status.trim() != "0" {
        let err = fs::read_to_string(share.join("kernel.err")).unwrap_or_default();
        let tail: Vec<&str> = err.lines().rev().take(12).collect();
        bail!(
            "pkeyfw kernel --programs exited {}: {}",
            status.trim(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let text = fs::read_to_string(share.join("kernel.json")).context("no kernel.json")?;
    Ok(serde_json::from_str(&text)?)
}

/// The integration tests' binary (`pkeyfw/tests/it/`), as the guest runs it.
const TESTS: &str = "it";

/// The filter that runs only the tear test's module of [`TESTS`].
const TEAR: &str = "tear::";

/// Builds the integration tests and says where their binary is.
fn tests() -> Result<PathBuf> {
    let mut cmd = cmd::cargo_cmd(&[
        "test",
        "--release",
        "--package",
        "pkeyfw",
        "--test",
        TESTS,
        "--no-run",
        "--message-format=json",
    ])?;
    let out = cmd
        .current_dir(cmd::root())
        .output()
        .context("building the integration tests")?;
    if !out.status.success() {
        bail!(
            "building the integration tests failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["target"]["name"] == TESTS)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .context("cargo named no executable for the integration tests")
}

/// The QP table's tear test passed in the guest: every verdict of ten
/// million frames one of the two states' while a writer flipped the entry,
/// and a writer in halves caught.
fn tear(share: &Path) -> Result<()> {
    succeeded(
        share,
        "tear",
        "test result: ok. 2 passed",
        20,
        "the tear test",
    )
}

/// Every program the kernel verified within the budget, where it says.
fn within_budget(report: &Value) -> Result<()> {
    let programs = report["programs"]
        .as_array()
        .context("kernel.json lists no programs")?;
    if programs.is_empty() {
        bail!("no program was loaded");
    }
    for p in programs {
        if let Some(verified) = p["verified"].as_u64()
            && verified > VERIFIER_BUDGET
        {
            bail!(
                "{} ({}) took {verified} processed instructions, over {VERIFIER_BUDGET}",
                p["program"],
                p["role"]
            );
        }
    }
    Ok(())
}

/// Where the kernel lacks a feature a scenario would use, attach said so,
/// in its one line.
fn says(report: &Value, share: &Path) -> Result<()> {
    let output = ["rxe.txt", "says.txt"]
        .map(|f| fs::read_to_string(share.join(f)).unwrap_or_default())
        .concat();
    for (feature, line) in SAYS {
        if report["features"][feature] == false && !output.contains(line) {
            bail!("{feature} is missing, and no attach said \"{line}…\"");
        }
    }
    Ok(())
}

/// The README's lab went as the partition rules say.
fn lab(share: &Path) -> Result<()> {
    succeeded(
        share,
        "lab",
        "cases as the partition rules say",
        12,
        "pkeyfw lab",
    )
}

/// A command the guest ran into `name.txt`, its exit status in
/// `name.status`: exited 0 and said `done`; else its last `tail` lines.
fn succeeded(share: &Path, name: &str, done: &str, tail: usize, what: &str) -> Result<()> {
    let text = fs::read_to_string(share.join(format!("{name}.txt"))).unwrap_or_default();
    let status = fs::read_to_string(share.join(format!("{name}.status"))).unwrap_or_default();
    if status.trim() == "0" && text.contains(done) {
        return Ok(());
    }
    let last: Vec<&str> = text.lines().rev().take(tail).collect();
    bail!(
        "{what} exited {}: {}",
        status.trim(),
        last.into_iter().rev().collect::<Vec<_>>().join("\n")
    )
}

/// `cargo xtask kernels`: the matrix on every kernel, or those named.
pub fn task(names: &[String], json: Option<PathBuf>) -> Result<()> {
    let kernels = if names.is_empty() {
        KERNELS.to_vec()
    } else {
        names
            .iter()
            .map(|n| Kernel::named(n))
            .collect::<Result<_>>()?
    };
    crate::build()?;
    run(&kernels, json)?.ok()
}
