//! `cargo xtask rxe-lab`: real ibverbs programs over soft-RoCE, in the guest,
//! with pkeyfw enforcing. The guest runs `pkeyfw lab rxe` (the scenarios
//! live with the rest of the CLI); the host then decodes every capture with
//! tshark and checks that the P_Keys and Q_Keys on the wire (stamped ones
//! included) are the ones the scenario is about.

use std::{fs, path::Path, path::PathBuf, time::Duration};

use anyhow::{Context as _, Result, bail};

use crate::{
    cmd,
    guest::{
        Guest, Init, Kernel,
        pool::{self, Boot, Plan},
    },
    results::Outcome,
};

mod systemd;
mod wire;

/// Boot, a guest's share of the scenarios and the guest's own slowness
/// under TCG included (all of them took some 13 minutes in one guest on
/// one machine, and did not finish in 25 on a 3 to 4 times slower one,
/// where two guests side by side do about 100 an hour).
const TIMEOUT: Duration = Duration::from_secs(55 * 60);

/// Guests that share the scenarios out, booted side by side with the
/// other labs' (see [`pool`]).
const SHARDS: usize = 2;

/// The test kit's binaries (no part of the product): the ibverbs attacker,
/// which the attack scenarios run beside pkeyfw, the CNI lab's runtime,
/// and the systemd scenario's soft-RoCE setup.
const TESTKIT: [&str; 3] = ["pkeyfw-lab-verbs", "pkeyfw-lab-cni", "pkeyfw-lab-rxe"];

/// A fresh share with the release CLI, the test kit's binaries, the
/// results protocol's shell half (`results.sh`) and `script` as guest.sh.
pub fn share(script: &str) -> Result<PathBuf> {
    share_in("rxe-lab", script)
}

/// [`share`], in target/`name`.
pub fn share_in(name: &str, script: &str) -> Result<PathBuf> {
    cmd::cargo(&[
        "build",
        "--release",
        "--package",
        "pkeyfw-testkit",
        "--bins",
    ])?;
    let share = cmd::root().join("target").join(name);
    let _ = fs::remove_dir_all(&share);
    fs::create_dir_all(&share)?;
    for bin in std::iter::once("pkeyfw").chain(TESTKIT) {
        fs::copy(
            cmd::root().join("target/release").join(bin),
            share.join(bin),
        )
        .with_context(|| format!("copying target/release/{bin} into the guest's share"))?;
    }
    fs::write(share.join("results.sh"), crate::results::SHELL)?;
    fs::write(share.join("guest.sh"), script)?;
    Ok(share)
}

/// `cargo xtask guest SCRIPT`: runs it in `guest`.
pub fn explore(script: &Path, guest: &Guest) -> Result<()> {
    let text =
        fs::read_to_string(script).with_context(|| format!("reading {}", script.display()))?;
    run_in(&text, guest)
}

/// Runs `text` as the guest's script on `kernel`, with the release CLI and
/// the test kit's binaries beside it.
pub fn script(text: &str, kernel: Kernel) -> Result<()> {
    run_in(text, &Guest::ensure(kernel)?)
}

/// Runs `text` as the script of `guest`, with the release CLI and the
/// test kit's binaries beside it.
fn run_in(text: &str, guest: &Guest) -> Result<()> {
    let share = share(text)?;
    let code = guest.run(&share, TIMEOUT, Init::Shell, "guest")?;
    println!(
        "xtask: the script exited {code}; its folder is {}",
        share.display()
    );
    if code != 0 {
        bail!("the guest script failed");
    }
    Ok(())
}

/// `cargo xtask rxe-lab`: the lab's scenarios in the guest, every capture
/// decoded with tshark; then the `systemd` scenario, in the guest booted
/// with systemd. `--only systemd` runs that one alone; any other `--only`
/// goes to the lab.
pub fn run(args: &[String]) -> Result<Outcome> {
    Ok(pool::run(plans(args)?))
}

/// The lab's boots and the systemd scenario's (see [`run`]).
pub fn plans(args: &[String]) -> Result<Vec<Plan>> {
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1));
    if only.is_some_and(|o| o == systemd::NAME) {
        return Ok(vec![systemd::plan()?]);
    }
    let mut plans = vec![lab(args)?];
    if only.is_none() {
        // A package or guest that cannot be made fails the scenario, with
        // the reason.
        let name = format!("rxe-lab::{}", systemd::NAME);
        plans.push(systemd::plan().unwrap_or_else(|e| Plan::failed(&name, e)));
    }
    Ok(plans)
}

/// The lab's scenarios (`pkeyfw lab rxe`), with the host's reading of
/// their captures: all of them shared out among [`SHARDS`] guests, or
/// those `--only` names in one.
fn lab(args: &[String]) -> Result<Plan> {
    let guest = Guest::ensure(crate::guest::PRIMARY)?;
    let extra: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let shards = if args.iter().any(|a| a == "--only") {
        1
    } else {
        SHARDS
    };
    let boots = (0..shards)
        .map(|i| {
            let shard = if shards > 1 {
                format!("--shard {i}/{shards}")
            } else {
                String::new()
            };
            let label = format!("rxe-lab-{i}");
            let share = share_in(
                &label,
                &format!(
                    "./pkeyfw lab rxe --captures captures --json results.json {shard} {}\n\
                     echo \"pkeyfw lab rxe exited $?\"\n",
                    extra.join(" ")
                ),
            )?;
            Ok(Boot {
                label,
                guest: guest.clone(),
                share,
                init: Init::Shell,
                timeout: TIMEOUT,
                minutes: 10,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let shares: Vec<PathBuf> = boots.iter().map(|b| b.share.clone()).collect();
    Ok(Plan {
        boots,
        judge: Box::new(move |codes| {
            let mut scenarios = Vec::new();
            for (share, code) in shares.iter().zip(codes) {
                let read = code.and_then(|code| {
                    if code != 0 {
                        bail!("the guest script in {} failed ({code})", share.display());
                    }
                    results(share)
                });
                match read {
                    Ok(mut r) => scenarios.append(&mut r),
                    Err(e) => return Outcome::failed("rxe-lab", &e),
                }
            }
            judge(&scenarios, "rxe-lab")
        }),
    })
}

/// The scenarios `pkeyfw lab rxe` ran in the guest whose share is `share`
/// (its results.json), each with that share.
pub fn results(share: &Path) -> Result<Vec<(PathBuf, serde_json::Value)>> {
    let text = fs::read_to_string(share.join("results.json"))
        .context("a guest wrote no results.json (see its output above)")?;
    let results: serde_json::Value = serde_json::from_str(&text)?;
    let list = results["scenarios"]
        .as_array()
        .context("results.json has no scenarios")?;
    Ok(list
        .iter()
        .map(|s| (share.to_path_buf(), s.clone()))
        .collect())
}

/// Each scenario's outcome in the guest and the host's reading of its
/// captures, a test line each (`test PREFIX::NAME`).
pub fn judge(scenarios: &[(PathBuf, serde_json::Value)], prefix: &str) -> Outcome {
    println!(
        "\nOn the wire (tshark: both ends' outgoing frames; in switch-*, the bridge's as it \
         forwards them): P_Keys and Q_Keys of every RoCE frame"
    );
    let (mut passed, mut failed) = (0, 0);
    for (share, s) in scenarios {
        let name = s["name"].as_str().unwrap_or("?");
        let captures: Vec<PathBuf> = s["captures"]
            .as_array()
            .map(|c| {
                c.iter()
                    .filter_map(|c| c.as_str().map(|c| share.join(c)))
                    .collect()
            })
            .unwrap_or_default();
        let wire = match wire::decode(&captures) {
            Ok(wire) => wire,
            Err(e) => {
                crate::results::fail(
                    &format!("{prefix}::{name}"),
                    &format!("the captures: {e:#}"),
                );
                failed += 1;
                continue;
            }
        };
        let want_pkeys = numbers(&s["wire"]["pkeys"]);
        let want_qkeys = numbers(&s["wire"]["qkeys"]);
        let wire_ok = wire.pkeys == want_pkeys && wire.qkeys == want_qkeys && wire.frames > 0;
        let ok = wire_ok && s["ok"].as_bool() == Some(true);
        let verdict = if wire_ok {
            "✓".to_string()
        } else {
            format!(
                "✗ expected P_Keys {} Q_Keys {}",
                hex(&want_pkeys, 4),
                hex(&want_qkeys, 8)
            )
        };
        println!(
            "  {name:<22} {:>6} frames  P_Keys {:<16} Q_Keys {:<26} {verdict}",
            wire.frames,
            hex(&wire.pkeys, 4),
            hex(&wire.qkeys, 8),
        );
        if ok {
            passed += 1;
        } else {
            let why = if wire_ok {
                format!("in the guest: observed {}", s["observed"])
            } else {
                format!("on the wire: {} frames, {verdict}", wire.frames)
            };
            crate::results::fail(&format!("{prefix}::{name}"), &why);
            failed += 1;
        }
    }
    println!("\n{prefix}: {passed} passed, {failed} failed");
    Outcome { passed, failed }
}

fn numbers(v: &serde_json::Value) -> Vec<u64> {
    let mut n: Vec<u64> = v
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
        .unwrap_or_default();
    n.sort_unstable();
    n
}

fn hex(values: &[u64], digits: usize) -> String {
    let v: Vec<String> = values
        .iter()
        .map(|x| format!("{x:#0w$x}", w = digits + 2))
        .collect();
    format!("[{}]", v.join(", "))
}
