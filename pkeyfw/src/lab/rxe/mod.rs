//! `pkeyfw lab rxe`: unmodified RDMA programs over soft-RoCE with pkeyfw
//! enforcing. Two rdma_rxe devices on the two ends of a veth pair; for each
//! scenario a foreground `pkeyfw attach` on the server's end (on both ends
//! when the policy stamps) with a policy whose `[[bind]]` rules bind the
//! programs' QPs as they appear, the server, then the client; the table
//! shows whether the programs completed and which counters moved, against
//! what the partition rules say. Then switch mode ([`switch`]): four hosts
//! on a bridge, pkeyfw on its ports only; then tenants on one host with
//! devices of their own ([`devices`]). Needs root, the
//! rdma_rxe module and the RDMA userland (rdma-core, perftest,
//! rdmacm-utils); `cargo xtask rxe-lab` runs it in a guest that has them.

mod connect;
mod devices;
mod fabric;
mod run;
pub mod scenario;
mod switch;
mod tenants;

use std::{fs, path::Path};

use anyhow::{Result, bail};
use pkeyfw_common::{Capture, Reason, abi::OnForeignJoin};

use crate::loading::maps::ReasonCounts;
use serde_json::json;

use run::{Exit, Observed};
use scenario::{Attack, Program, Scenario};
// The two ends the scenarios run over, test equipment the systemd
// scenario sets up too.
use pkeyfw_testkit::rxe as topology;
use topology::Topology;

/// One of `of` parts of the scenarios (`--shard INDEX/OF`): every `of`-th
/// one, from the `index`-th (0-based), counting the pair's scenarios, then
/// connection setup's, then the switch's; so that several guests can share the scenarios out. The
/// scenarios of devices of their own go together (they share one host's
/// setup), as the next one counted.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub of: usize,
}

impl std::str::FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Shard, String> {
        let parsed = s
            .split_once('/')
            .and_then(|(i, n)| Some((i.parse().ok()?, n.parse().ok()?)));
        match parsed {
            Some((index, of)) if index < of => Ok(Shard { index, of }),
            _ => Err(format!(
                "`{s}` is not a shard; expected INDEX/OF with INDEX below OF, e.g. 0/2"
            )),
        }
    }
}

/// Runs the scenarios whose name contains `only`, or one of its
/// comma-separated parts (all without), of
/// `shard` if given, capturing each into `captures`/NAME.*.pcap and writing
/// the results as JSON to `json` if given; `Ok(true)` when every one went
/// as the rules say.
pub fn run(
    only: Option<&str>,
    shard: Option<Shard>,
    captures: Option<&Path>,
    json: Option<&Path>,
) -> Result<bool> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the soft-RoCE lab creates devices and attaches XDP; run it as root");
    }
    let all = scenario::all();
    let pairs = all.len();
    let chosen = |i: usize, name: &str| {
        only.is_none_or(|o| o.split(',').any(|part| name.contains(part)))
            && shard.is_none_or(|s| i % s.of == s.index)
    };
    let scenarios: Vec<Scenario> = all
        .into_iter()
        .enumerate()
        .filter(|(i, s)| chosen(*i, s.name))
        .map(|(_, s)| s)
        .collect();
    let connecting = connect::all();
    let pairs_and_cm = pairs + connecting.len();
    let connecting: Vec<connect::Scenario> = connecting
        .into_iter()
        .enumerate()
        .filter(|(i, s)| chosen(pairs + i, s.name))
        .map(|(_, s)| s)
        .collect();
    let switches = switch::all().len();
    let switched: Vec<switch::Scenario> = switch::all()
        .into_iter()
        .enumerate()
        .filter(|(i, s)| chosen(pairs_and_cm + i, s.name))
        .map(|(_, s)| s)
        .collect();
    let owning: Vec<devices::Scenario> = devices::all()
        .into_iter()
        .filter(|s| chosen(pairs_and_cm + switches, s.name))
        .collect();
    if scenarios.is_empty() && connecting.is_empty() && switched.is_empty() && owning.is_empty() {
        bail!("no scenario matches {only:?}");
    }
    // Until the table is judged: the policies name the tenants' cgroups.
    let _tenants = tenants::Tenants::create()?;
    let work = std::env::temp_dir().join(format!("pkeyfw-rxe-lab-{}", std::process::id()));
    fs::create_dir_all(&work)?;
    if let Some(dir) = captures {
        fs::create_dir_all(dir)?;
    }
    let result = (|| {
        let (rows, cm_rows) = if scenarios.is_empty() && connecting.is_empty() {
            Default::default()
        } else {
            on_pair(&scenarios, &connecting, &work, captures)?
        };
        // The pair is gone by now: the fabric moves the local rule anew.
        let switch_rows = if switched.is_empty() {
            Vec::new()
        } else {
            switch::run(&switched, &work, captures)?
        };
        let owned = if owning.is_empty() {
            None
        } else {
            Some(devices::run(&owning, &work, captures)?)
        };
        Ok::<_, anyhow::Error>((rows, cm_rows, switch_rows, owned))
    })();
    let _ = fs::remove_dir_all(&work);
    let (rows, cm_rows, switch_rows, owned) = result?;
    let pair_ok = scenarios.is_empty() || table(&scenarios, &rows);
    let cm_ok = connecting.is_empty() || connect::table(&connecting, &cm_rows);
    let switch_ok = switched.is_empty() || switch::table(&switched, &switch_rows);
    let owned_ok = owned
        .as_ref()
        .is_none_or(|ran| devices::table(&owning, ran));
    if let Some(path) = json {
        let mut list = results(&scenarios, &rows);
        list.extend(connect::results(&connecting, &cm_rows));
        list.extend(switch::results(&switched, &switch_rows));
        if let Some(ran) = &owned {
            list.extend(devices::results(&owning, ran));
        }
        fs::write(
            path,
            serde_json::to_string_pretty(&json!({ "scenarios": list }))?,
        )?;
    }
    Ok(pair_ok && cm_ok && switch_ok && owned_ok)
}

/// Runs the scenarios of the veth pair, those of one client and server,
/// then those of connection setup; what came of each.
fn on_pair(
    scenarios: &[Scenario],
    connecting: &[connect::Scenario],
    work: &Path,
    captures: Option<&Path>,
) -> Result<(Vec<Observed>, Vec<connect::Observed>)> {
    let topo = Topology::create()?;
    let (c, s) = (topo.client(), topo.server());
    println!(
        "pkeyfw lab rxe: client {} ({}, {}) ⟶ server {} ({}, {}), pkeyfw on {} \
         (on both ends when stamping)",
        c.device, c.iface, c.addr, s.device, s.iface, s.addr, s.iface
    );
    let mut rows = Vec::new();
    for sc in scenarios {
        let observed = run::scenario(&topo, sc, work, captures)?;
        if judge(sc, &observed) {
            println!("  {:<22} as expected", sc.name);
        } else {
            println!("  {:<22} NOT as expected\n{}", sc.name, observed.output);
        }
        rows.push(observed);
    }
    let cm_rows = connect::run(&topo, connecting, work, captures)?;
    Ok((rows, cm_rows))
}

/// Whether a scenario went as the rules say: the programs completed or not,
/// its verdict's counter moved at the server's end, and nothing else its
/// policy refuses did, at either end; no captured frame carries a wrong
/// ICRC; a stamping scenario stamped, and each end's rxe took in exactly
/// the frames its filter passed (restored to 0xffff, ICRC patched: rxe drops
/// a frame with either wrong before counting it); pkeyfw named the rxe
/// device as in its reach.
fn judge(sc: &Scenario, o: &Observed) -> bool {
    let policy = &o.policy;
    let refused_only = |counts: &ReasonCounts, allowed: Option<Reason>| {
        Reason::ALL
            .into_iter()
            .all(|r| Some(r) == allowed || counts.refused_by(r) == 0)
    };
    // A foreign Q_Key's datagrams are refused besides the verdict.
    let foreign = matches!(sc.attack, Some(Attack::ForeignQkey(_)));
    // A join is made under a flood of malformed frames.
    let flooded = matches!(sc.attack, Some(Attack::Join { .. }));
    let refused_at_server = |counts: &ReasonCounts| {
        Reason::ALL.into_iter().all(|r| {
            r == sc.reason
                || (foreign && r == Reason::QkeyViolation)
                || (flooded && r == Reason::Malformed)
                || counts.refused_by(r) == 0
        })
    };
    o.completes() == sc.completes
        && o.reasons.total(sc.reason) > 0
        && refused_at_server(&o.reasons)
        && o.client_reasons.is_none_or(|c| refused_only(&c, None))
        && o.bad_icrc <= if foreign { run::FOREIGN_DATAGRAMS } else { 0 }
        && o.leftover == 0
        && (!policy.stamp || (o.stamped > 0 && o.rxe_rcvd == o.passed))
        && attack_failed(sc, o)
        && o.misnamed.is_none()
}

/// Whether the scenario's attack, if any, failed as it must (a restart
/// lost nothing; a full table quarantined; a taken QPN bound by its
/// tenant's rule, not the entry naming it): the flood of
/// modifies and the squatted peers took no frame from its owner (every
/// frame of the bound QPs stamped with their own key, as rxe's socket says
/// who sends); the join was counted and reported under a junk flood (its
/// process killed where the policy says so).
fn attack_failed(sc: &Scenario, o: &Observed) -> bool {
    let [server, _] = o.probes.map(|p| move |c: Capture| p[c.index() as usize]);
    match sc.attack {
        // Every frame left with its QP's own key: none as an unbound QP's.
        None if sc.program == Program::Perftest => o.unbound == 0,
        None => true,
        Some(Attack::ModifyFlood | Attack::Squat) => o.unbound == 0,
        // Under a flood that exhausted the refused frames' budget: its own
        // group's join (first) passed, the foreign one's was reported; the
        // joiner SIGKILLed for it where the policy says so, and only there.
        Some(Attack::Join { .. }) => {
            let kill = o.policy.foreign_join == OnForeignJoin::Kill;
            let killed = o.attacker_signal == Some(libc::SIGKILL);
            server(Capture::Joined) > 0
                && server(Capture::ForeignJoin) > 0
                && o.join_reported
                && o.suppressed > 0
                && killed == kill
                && server(Capture::Killed) == u64::from(kill)
        }
        // The program's Q_Key was captured, the other one refused.
        // The table was full for the server's QP only while the filler held
        // it.
        Some(Attack::Fill(_)) => server(Capture::Quarantined) > 0 && o.rebound == Some(true),
        // The programs completing says it.
        Some(Attack::Restart) => true,
        // ... and no frame of theirs left unstamped, as an unbound QP's.
        Some(Attack::Rebind) => o.unbound == 0,
        // The victim's Q_Key was captured while the return probes starved.
        Some(Attack::Starve(_)) => {
            server(Capture::QkeyCaptured) > 0 && o.reasons.refused_by(Reason::QkeyViolation) == 0
        }
        // The server's QP holds the entry's QPN; the verdict (refused, and
        // `unknown_qp = "drop"` moving nothing) says its tenant's rule
        // bound it.
        Some(Attack::TakeQpn) => o.taken == Some(true),
        Some(Attack::ForeignQkey(_)) => {
            server(Capture::QkeyCaptured) > 0 && o.reasons.refused_by(Reason::QkeyViolation) > 0
        }
    }
}

fn outcome(completes: bool) -> &'static str {
    if completes {
        "completes"
    } else {
        "fails/stalls"
    }
}

/// Prints the table; whether every scenario matched.
fn table(scenarios: &[Scenario], rows: &[Observed]) -> bool {
    println!(
        "\n {:>2}  {:<22} {:<16} {:<36} {:<30} {:<44} rule",
        "#", "scenario", "program", "server QP bound to", "expected", "observed"
    );
    let mut matched = 0;
    for (i, (sc, o)) in scenarios.iter().zip(rows).enumerate() {
        let ok = judge(sc, o);
        matched += usize::from(ok);
        let expected = format!("{}, {}", outcome(sc.completes), sc.reason.name());
        let observed = format!("{}, {}", o.summary(), counts(o));
        println!(
            " {:>2}  {:<22} {:<16} {:<36} {:<30} {:<44} {} {}",
            i + 1,
            sc.name,
            sc.program.label(),
            sc.binding,
            expected,
            observed,
            if ok { "✓" } else { "✗" },
            sc.why
        );
    }
    println!(
        "\n{matched} of {} scenarios as the partition rules say.",
        scenarios.len()
    );
    matched == scenarios.len()
}

/// The counters that moved, e.g. `ok 40, qkey_violation 12`.
fn counts(o: &Observed) -> String {
    let moved: Vec<String> = Reason::ALL
        .iter()
        .filter(|r| **r != Reason::NotRoce && o.reasons.total(**r) > 0)
        .map(|r| format!("{} {}", r.name(), o.reasons.total(*r)))
        .collect();
    if moved.is_empty() {
        "no RoCE frames".to_string()
    } else {
        moved.join(", ")
    }
}

fn exit_json(e: Exit) -> serde_json::Value {
    match e {
        Exit::Ok => json!("ok"),
        Exit::Failed(code) => json!(format!("exit {code}")),
        Exit::Killed => json!("stalled"),
    }
}

fn probes_json(counts: &crate::loading::maps::CaptureCounts) -> serde_json::Value {
    Capture::ALL
        .iter()
        .map(|c| (c.name().to_string(), json!(counts[c.index() as usize])))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn results(scenarios: &[Scenario], rows: &[Observed]) -> Vec<serde_json::Value> {
    scenarios
        .iter()
        .zip(rows)
        .map(|(sc, o)| {
            json!({
                "name": sc.name,
                "program": sc.program.label(),
                "binding": sc.binding,
                "expected": { "completes": sc.completes, "reason": sc.reason.name() },
                "observed": {
                    "completes": o.completes(),
                    "server": exit_json(o.server),
                    "client": exit_json(o.client),
                    "reasons": crate::reporting::describe::reasons_json(&o.reasons),
                },
                "ok": judge(sc, o),
                "client_reasons": o.client_reasons.as_ref().map(crate::reporting::describe::reasons_json),
                "stamped": o.stamped,
                "unbound": o.unbound,
                "leftover_bindings": o.leftover,
                "probes": {
                    "server": probes_json(&o.probes[0]),
                    "client": probes_json(&o.probes[1]),
                },
                "rxe_rcvd": { "server": o.rxe_rcvd[0], "client": o.rxe_rcvd[1] },
                "passed": { "server": o.passed[0], "client": o.passed[1] },
                "icrc": { "frames": o.frames, "bad": o.bad_icrc },
                "misnamed": o.misnamed,
                "captures": o.captures.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
                "wire": {
                    "pkeys": sc.wire_pkeys,
                    "qkeys": sc.wire_qkeys,
                },
            })
        })
        .collect()
}
