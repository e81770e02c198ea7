//! Switch mode over soft-RoCE: four unmodified hosts on a bridge whose
//! ports `pkeyfw switch attach` enforces, with nothing of pkeyfw on the
//! hosts. Every port is an access port that gives its host's frames the
//! host's key (A a full member of partition 0x0001, B and C limited
//! members, D a full member of 0x0002) and takes it off again on the way
//! out, so the hosts' rxe sends and sees only 0xFFFF while the switch
//! judges the keys the subnet manager would have given them.
//!
//! Each port's table also holds the default partition, as one derived from
//! a partitions.conf with `Default=0x7fff : ALL=full` does: the key a
//! port stamps is still the only one its host may send or be sent. In
//! `switch-forge-*`, B's host forges what an unmodified rxe never sends —
//! that default partition, a full member's key of its own partition,
//! another partition's key, RoCE v1 — to C's UD QP: its port refuses each
//! on the way in, and C's rxe takes in none.
//!
//! Per scenario: the bridge's side of the two hosts' ports is captured as
//! it forwards (their ingress, after stamping), the hosts' ends as their
//! rxe devices send and take in; the ports' counters (`pkeyfw stats`) and
//! the rxe devices' are read before and after.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};
use pkeyfw_common::parse::{self, proto};
use pkeyfw_testkit::{
    netns,
    wire::{Net, Packet},
};
use serde_json::json;

use super::{
    fabric::{Fabric, Host, NETNS},
    run::{self, Exit},
    scenario::Program,
    topology::End,
};
use crate::host::netlink;

/// The key each host's port stamps, its table's only entry: A, B, C, D.
const KEYS: [u16; 4] = [0x8001, 0x0001, 0x0001, 0x8002];
const NAMES: [&str; 4] = ["A", "B", "C", "D"];
const A: usize = 0;
const B: usize = 1;
const C: usize = 2;
const D: usize = 3;

/// ibv_ud_pingpong's Q_Key.
const PP_QKEY: u32 = 0x1111_1111;

/// What B's host forges, as (P_Key, RoCE v1): the default partition its
/// port's table holds, a full member's key of its own partition, D's
/// partition, and RoCE v1 with the default key (a port cannot stamp it).
/// Each goes out `FORGE_ROUNDS` times.
const FORGED: [(u16, bool); 4] = [
    (0x7fff, false),
    (0x8001, false),
    (0x8002, false),
    (0xffff, true),
];
const FORGE_ROUNDS: usize = 3;
/// The DETH source QP of every forged frame: how the captures tell them
/// from rxe's.
const FORGED_SRC_QP: u32 = 0x00f0_4ced;

/// rdma_rxe's counters of trouble (Linux 6.1's names): requests out of
/// order, sequence NAKs, receivers not ready, retries run out, sends
/// failed. Not its retransmissions (`duplicate_request`,
/// `completer_retry_err`): a guest under emulation runs slower than its
/// retransmit timer, which then fires with nothing lost (the ports' counts
/// show every frame arrived). It drops a frame with a foreign P_Key or a
/// wrong ICRC uncounted: `rcvd_pkts` not moving says that.
const RXE_ERRORS: [&str; 7] = [
    "out_of_seq_request",
    "rcvd_rnr_err",
    "send_rnr_err",
    "rcvd_seq_err",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "send_err",
];

/// One scenario: a program between two hosts.
pub struct Scenario {
    pub name: &'static str,
    pub program: Program,
    /// Hosts (A, B, C, D: 0..4).
    pub server: usize,
    pub client: usize,
    /// Whether the programs complete.
    pub completes: bool,
    /// Whether the client's host also forges frames to the server's QP.
    pub forges: bool,
    /// Which rule decides it.
    pub why: &'static str,
}

impl Scenario {
    /// The P_Keys the bridge forwards: the client's, and the server's when
    /// it answers (a stalled server never sends).
    fn wire_pkeys(&self) -> BTreeSet<u16> {
        let mut keys = BTreeSet::from([KEYS[self.client]]);
        if self.completes {
            keys.insert(KEYS[self.server]);
        }
        keys
    }

    fn wire_qkeys(&self) -> Vec<u32> {
        match self.program {
            Program::UdPingpong => vec![PP_QKEY],
            _ => Vec::new(),
        }
    }

    /// Forged frames the client's host sends.
    fn forged(&self) -> usize {
        if self.forges {
            FORGED.len() * FORGE_ROUNDS
        } else {
            0
        }
    }

    /// "A 0x8001 ⟵ B 0x0001".
    fn pair(&self) -> String {
        let host = |h: usize| format!("{} {:#06x}", NAMES[h], KEYS[h]);
        format!("{} ⟵ {}", host(self.server), host(self.client))
    }
}

const fn sc(
    name: &'static str,
    program: Program,
    [server, client]: [usize; 2],
    completes: bool,
    why: &'static str,
) -> Scenario {
    Scenario {
        name,
        program,
        server,
        client,
        completes,
        forges: false,
        why,
    }
}

pub fn all() -> Vec<Scenario> {
    use Program::{RcPingpong as Rc, UdPingpong as Ud};
    const FULL_LIMITED: &str = "full and limited member of 0x0001";
    const LIMITED: &str = "two limited members never match";
    const OTHER: &str = "partition 0x0002 is not 0x0001";
    vec![
        sc("switch-ud-a-b", Ud, [A, B], true, FULL_LIMITED),
        sc("switch-rc-a-b", Rc, [A, B], true, FULL_LIMITED),
        sc("switch-ud-a-c", Ud, [A, C], true, FULL_LIMITED),
        sc("switch-rc-a-c", Rc, [A, C], true, FULL_LIMITED),
        sc("switch-ud-b-c", Ud, [B, C], false, LIMITED),
        sc("switch-rc-b-c", Rc, [B, C], false, LIMITED),
        sc("switch-ud-d-b", Ud, [B, D], false, OTHER),
        sc("switch-rc-d-b", Rc, [B, D], false, OTHER),
        Scenario {
            forges: true,
            ..sc(
                "switch-forge-ud-c-b",
                Ud,
                [C, B],
                false,
                "an access port's host has one key",
            )
        },
    ]
}

/// The switch policy for the hosts' `ports`: every port an access port for
/// its host's key, its table that key and the default partition.
fn policy(ports: [&str; 4]) -> String {
    let mut text = "[switch]\nviolation = \"drop\"\n".to_string();
    for (port, key) in ports.into_iter().zip(KEYS) {
        text += &format!(
            "\n[[switch.port]]\ninterface = \"{port}\"\npkeys = [{key:#06x}, 0xffff]\nstamp = {key:#06x}\n"
        );
    }
    text
}

/// A switch port's counters.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Port {
    pub stamped: u64,
    pub restored: u64,
    pub rcv_errors: u64,
    pub xmit_errors: u64,
}

impl Port {
    fn since(self, before: Port) -> Port {
        Port {
            stamped: self.stamped.saturating_sub(before.stamped),
            restored: self.restored.saturating_sub(before.restored),
            rcv_errors: self.rcv_errors.saturating_sub(before.rcv_errors),
            xmit_errors: self.xmit_errors.saturating_sub(before.xmit_errors),
        }
    }
}

/// A host's rxe counters (`hw_counters`) by name; over a scenario, those
/// that moved.
pub type Rxe = BTreeMap<String, u64>;

pub struct Observed {
    pub server: Exit,
    pub client: Exit,
    /// Over the scenario, per host (A, B, C, D): its port's counters and
    /// its rxe device's.
    pub ports: [Port; 4],
    pub rxe: [Rxe; 4],
    /// The P_Keys of the RoCE frames the bridge forwarded, and of those
    /// the two hosts' ends carried (forged ones aside).
    pub wire_pkeys: BTreeSet<u16>,
    pub host_pkeys: BTreeSet<u16>,
    /// Forged frames seen at the server's end (arrived) and the client's
    /// (sent).
    pub forged: [usize; 2],
    /// RoCE v2 frames captured (both sides), and those with a wrong ICRC.
    pub frames: usize,
    pub bad_icrc: usize,
    /// The bridge's side first, then the hosts'.
    pub captures: Vec<PathBuf>,
    pub host_captures: Vec<PathBuf>,
    /// The programs' last words, for a scenario that did not go as expected.
    pub output: String,
}

impl Observed {
    pub fn completes(&self) -> bool {
        self.client == Exit::Ok && self.server == Exit::Ok
    }
}

/// `pkeyfw switch` on the fabric's ports while it lives; detached on drop.
struct Switch<'a> {
    policy: &'a Path,
}

impl<'a> Switch<'a> {
    fn attach(policy: &'a Path) -> Result<Switch<'a>> {
        run::pkeyfw(&[
            "switch",
            "attach",
            "--mode",
            "native",
            "--netns",
            NETNS,
            "--policy",
            &policy.display().to_string(),
        ])?;
        Ok(Switch { policy })
    }

    /// Each port's counters (A, B, C, D), as `pkeyfw stats --json` has them.
    fn ports(&self, fabric: &Fabric) -> Result<[Port; 4]> {
        let out = run::pkeyfw(&["stats", "--netns", NETNS, "--json"])?;
        let objects: Vec<serde_json::Value> = out
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()
            .context("pkeyfw stats --json printed something else than JSON lines")?;
        let port = |h: &Host| -> Result<Port> {
            let o = objects
                .iter()
                .find(|o| o["interface"] == h.port.as_str())
                .with_context(|| format!("pkeyfw stats shows no port {}", h.port))?;
            let n = |v: &serde_json::Value| {
                v.as_u64()
                    .with_context(|| format!("pkeyfw stats --json: no count for {} in {o}", h.port))
            };
            let (frames, switch) = (&o["stamping"]["frames"], &o["switch"]);
            Ok(Port {
                stamped: n(&frames["stamped"])?,
                restored: n(&frames["restored"])?,
                rcv_errors: n(&switch["port_rcv_constraint_errors"])?,
                xmit_errors: n(&switch["port_xmit_constraint_errors"])?,
            })
        };
        let [a, b, c, d] = &fabric.hosts;
        Ok([port(a)?, port(b)?, port(c)?, port(d)?])
    }
}

impl Drop for Switch<'_> {
    fn drop(&mut self) {
        let policy = self.policy.display().to_string();
        let _ = run::pkeyfw(&["switch", "detach", "--netns", NETNS, "--policy", &policy]);
    }
}

/// Builds the fabric, attaches the switch and runs the scenarios; what came
/// of each. Captures go to `capture_dir`, else `work`.
pub fn run(
    scenarios: &[Scenario],
    work: &Path,
    capture_dir: Option<&Path>,
) -> Result<Vec<Observed>> {
    let fabric = Fabric::create()?;
    let path = work.join("switch.toml");
    fs::write(
        &path,
        policy(fabric.hosts.each_ref().map(|h| h.port.as_str())),
    )?;
    let switch = Switch::attach(&path)?;
    let hosts: Vec<String> = fabric
        .hosts
        .iter()
        .zip(NAMES.iter().zip(KEYS))
        .map(|(h, (name, key))| {
            format!(
                "{name} {} ({}, {}) {key:#06x}",
                h.end.iface, h.end.device, h.port
            )
        })
        .collect();
    println!(
        "pkeyfw lab rxe, switch mode: hosts {} on a bridge in namespace {NETNS}; \
         pkeyfw on the bridge's ports only, each stamping its host's key",
        hosts.join(", ")
    );
    let dir = capture_dir.unwrap_or(work);
    let mut rows = Vec::new();
    for sc in scenarios {
        let observed = scenario(&fabric, &switch, sc, dir)?;
        if judge(sc, &observed) {
            println!("  {:<22} as expected", sc.name);
        } else {
            println!("  {:<22} NOT as expected\n{}", sc.name, observed.output);
        }
        rows.push(observed);
    }
    Ok(rows)
}

fn scenario(fabric: &Fabric, switch: &Switch, sc: &Scenario, dir: &Path) -> Result<Observed> {
    let (server, client) = (&fabric.hosts[sc.server], &fabric.hosts[sc.client]);
    let pcap = |iface: &str| dir.join(format!("{}.{iface}.pcap", sc.name));
    let captures: Vec<PathBuf> = [server, client].map(|h| pcap(&h.port)).to_vec();
    let host_captures: Vec<PathBuf> = [server, client].map(|h| pcap(&h.end.iface)).to_vec();
    let mut dumps = Vec::new();
    for (h, (wire, end)) in [server, client]
        .into_iter()
        .zip(captures.iter().zip(&host_captures))
    {
        dumps.push(run::tcpdump(Some(NETNS), &h.port, "in", wire)?);
        dumps.push(run::tcpdump(None, &h.end.iface, "inout", end)?);
    }
    let ports_before = switch.ports(fabric)?;
    let rxe_before = rxe_counters(fabric)?;

    let program = sc.program;
    let server_proc = run::start(
        Command::new(program.name()).args(program.server(&server.end)),
        dir,
        sc.name,
        "server",
    )?;
    run::wait_ready(program)?;
    if sc.forges {
        let qpn = run::ud_qpn(&server.end, server_proc.0.id())?;
        netns::send_here(
            &client.end.iface,
            &forgeries(&client.end, &server.end, qpn)?,
        )?;
    }
    let client_proc = run::start(
        Command::new(program.name()).args(program.client(&client.end, &server.end)),
        dir,
        sc.name,
        "client",
    )?;
    let (client_exit, server_exit) = run::finish(client_proc, server_proc)?;
    run::drain_captures(&[&captures[..], &host_captures[..]].concat());
    for d in dumps {
        run::stop(d);
    }

    let ports_after = switch.ports(fabric)?;
    let rxe_after = rxe_counters(fabric)?;
    let (wire_frames, wire_bad) = run::icrc_check(&captures)?;
    let (host_frames, host_bad) = run::icrc_check(&host_captures)?;
    let wire = [
        run::roce_frames(&captures[0])?,
        run::roce_frames(&captures[1])?,
    ]
    .concat();
    // The server's end, then the client's.
    let ends = [
        run::roce_frames(&host_captures[0])?,
        run::roce_frames(&host_captures[1])?,
    ];
    let tail = |role: &str| run::tail(dir, sc.name, role);
    Ok(Observed {
        server: server_exit,
        client: client_exit,
        ports: [0, 1, 2, 3].map(|i| ports_after[i].since(ports_before[i])),
        rxe: [0, 1, 2, 3].map(|i| {
            let before = |name: &String| rxe_before[i].get(name).copied().unwrap_or(0);
            rxe_after[i]
                .iter()
                .map(|(name, &n)| (name.clone(), n.saturating_sub(before(name))))
                .filter(|&(_, n)| n > 0)
                .collect()
        }),
        wire_pkeys: pkeys(&wire),
        host_pkeys: pkeys(ends.iter().flatten()),
        forged: ends
            .each_ref()
            .map(|f| f.iter().filter(|r| is_forged(r)).count()),
        frames: wire_frames + host_frames,
        bad_icrc: wire_bad + host_bad,
        captures,
        host_captures,
        output: format!(
            "client: {}\nclient stderr: {}\nserver: {}\nserver stderr: {}",
            tail("client"),
            tail("client.err"),
            tail("server"),
            tail("server.err"),
        ),
    })
}

/// Each host's rxe counters so far (A, B, C, D).
fn rxe_counters(fabric: &Fabric) -> Result<[Rxe; 4]> {
    let read = |h: &Host| -> Result<Rxe> {
        let dir = format!("/sys/class/infiniband/{}/ports/1/hw_counters", h.end.device);
        fs::read_dir(&dir)
            .with_context(|| format!("reading {dir}"))?
            .map(|entry| {
                let path = entry?.path();
                let text = fs::read_to_string(&path)?;
                let n = text
                    .trim()
                    .parse()
                    .with_context(|| format!("{}: not a count", path.display()))?;
                let name = path
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned();
                Ok((name, n))
            })
            .collect()
    };
    let [a, b, c, d] = &fabric.hosts;
    Ok([read(a)?, read(b)?, read(c)?, read(d)?])
}

/// What a host's rxe counted over a scenario under `name`.
fn moved(rxe: &Rxe, name: &str) -> u64 {
    rxe.get(name).copied().unwrap_or(0)
}

/// The frames `from`'s host forges to UD QP `qpn` of `to`'s, each
/// `FORGE_ROUNDS` times: right in every field, the ICRC too, but the key.
fn forgeries(from: &End, to: &End, qpn: u32) -> Result<Vec<Vec<u8>>> {
    let mac = |e: &End| netlink::mac_address(netlink::if_index(&e.iface)?);
    let (src_mac, dst_mac) = (mac(from)?, mac(to)?);
    let one = |(pkey, v1): (u16, bool)| {
        let mut p = Packet::ud(pkey, qpn, PP_QKEY);
        p.src_qp = FORGED_SRC_QP;
        p.net = if v1 {
            Net::V1 {
                sgid: from.addr.to_ipv6_mapped(),
                dgid: to.addr.to_ipv6_mapped(),
                next_header: proto::IBA_BTH,
            }
        } else {
            Net::V4 {
                src: from.addr,
                dst: to.addr,
                options: 0,
                frag_offset: 0,
                more_fragments: false,
            }
        };
        let mut frame = p.bytes();
        frame[..6].copy_from_slice(&dst_mac);
        frame[6..12].copy_from_slice(&src_mac);
        frame
    };
    Ok((0..FORGE_ROUNDS)
        .flat_map(|_| FORGED.into_iter().map(one))
        .collect())
}

/// The BTH P_Keys of `frames`, forged ones aside.
fn pkeys<'a>(frames: impl IntoIterator<Item = &'a parse::Roce>) -> BTreeSet<u16> {
    frames
        .into_iter()
        .filter(|r| !is_forged(r))
        .map(|r| r.pkey())
        .collect()
}

fn is_forged(r: &parse::Roce) -> bool {
    r.src_qp() == FORGED_SRC_QP
}

/// Whether a scenario went as the rules say: the programs completed or
/// stalled; every frame a host sent was stamped at its port and, between
/// partners, restored at the other's (none lost, none refused), while in a
/// stall every one was refused on its way out of the server's port
/// (inbound refuses only forgeries: every frame rxe sends enters with its
/// port's own key); no other port saw a thing; the bridge carried the
/// stamped keys, the hosts' ends only 0xFFFF, every ICRC right; each
/// host's rxe took in every frame its port delivered, counting no trouble
/// where frames were to arrive; and every forged frame left the client's
/// host and none reached the server's.
fn judge(sc: &Scenario, o: &Observed) -> bool {
    let (s, c) = (sc.server, sc.client);
    let [server, client] = [o.ports[s], o.ports[c]];
    let (delivered, receivers): (bool, &[usize]) = if sc.completes {
        let both = server.stamped > 0
            && client.stamped == server.restored
            && server.stamped == client.restored;
        (both, &[s, c])
    } else {
        let refused = server.restored == 0 && client.stamped == server.xmit_errors;
        (refused, &[s])
    };
    // Only a stall's server port refuses, and only on the way out.
    let may_refuse = |i: usize| !sc.completes && i == s;
    o.completes() == sc.completes
        && client.stamped > 0
        && delivered
        && (0..4).all(|i| o.ports[i].rcv_errors == if i == c { sc.forged() as u64 } else { 0 })
        && o.forged == [0, sc.forged()]
        && (0..4).all(|i| may_refuse(i) || o.ports[i].xmit_errors == 0)
        && (0..4).all(|i| i == s || i == c || o.ports[i] == Port::default())
        && [s, c]
            .iter()
            .all(|&i| moved(&o.rxe[i], "rcvd_pkts") == o.ports[i].restored)
        && receivers
            .iter()
            .all(|&i| RXE_ERRORS.iter().all(|e| moved(&o.rxe[i], e) == 0))
        && o.wire_pkeys == sc.wire_pkeys()
        && o.host_pkeys == BTreeSet::from([0xffff])
        && o.bad_icrc == 0
}

/// Prints the table; whether every scenario matched.
pub fn table(scenarios: &[Scenario], rows: &[Observed]) -> bool {
    println!(
        "\n {:>2}  {:<22} {:<16} {:<22} {:<13} {:<58} rule",
        "#", "scenario", "program", "server ⟵ client", "expected", "observed"
    );
    let mut matched = 0;
    for (i, (sc, o)) in scenarios.iter().zip(rows).enumerate() {
        let ok = judge(sc, o);
        matched += usize::from(ok);
        let sum = |f: fn(&Port) -> u64| o.ports.iter().map(f).sum::<u64>();
        let observed = format!(
            "{}; stamped {}, restored {}, refused in/out {}/{}",
            run::summary(o.client, o.server),
            sum(|p| p.stamped),
            sum(|p| p.restored),
            sum(|p| p.rcv_errors),
            sum(|p| p.xmit_errors),
        );
        println!(
            " {:>2}  {:<22} {:<16} {:<22} {:<13} {:<58} {} {}",
            i + 1,
            sc.name,
            sc.program.name(),
            sc.pair(),
            super::outcome(sc.completes),
            observed,
            if ok { "✓" } else { "✗" },
            sc.why
        );
    }
    println!(
        "\n{matched} of {} switch scenarios as the partition rules say.",
        scenarios.len()
    );
    matched == scenarios.len()
}

fn paths(p: &[PathBuf]) -> Vec<String> {
    p.iter().map(|p| p.display().to_string()).collect()
}

/// The scenarios' JSON objects, shaped as the host end's ones for what
/// `cargo xtask rxe-lab` reads (`name`, `ok`, `captures`, `wire`).
pub fn results(scenarios: &[Scenario], rows: &[Observed]) -> Vec<serde_json::Value> {
    scenarios
        .iter()
        .zip(rows)
        .map(|(sc, o)| {
            let per_host = |f: &dyn Fn(usize) -> serde_json::Value| -> serde_json::Value {
                (0..4)
                    .map(|i| (NAMES[i].to_string(), f(i)))
                    .collect::<serde_json::Map<_, _>>()
                    .into()
            };
            json!({
                "name": sc.name,
                "program": sc.program.name(),
                "binding": sc.pair(),
                "expected": { "completes": sc.completes },
                "observed": {
                    "completes": o.completes(),
                    "server": super::exit_json(o.server),
                    "client": super::exit_json(o.client),
                },
                "ok": judge(sc, o),
                "ports": per_host(&|i| {
                    let p = o.ports[i];
                    json!({
                        "stamped": p.stamped,
                        "restored": p.restored,
                        "port_rcv_constraint_errors": p.rcv_errors,
                        "port_xmit_constraint_errors": p.xmit_errors,
                    })
                }),
                "rxe": per_host(&|i| json!(o.rxe[i])),
                "host_pkeys": o.host_pkeys,
                "forged": { "sent": sc.forged(), "seen_at_server": o.forged[0], "seen_at_client": o.forged[1] },
                "icrc": { "frames": o.frames, "bad": o.bad_icrc },
                "captures": paths(&o.captures),
                "host_captures": paths(&o.host_captures),
                "wire": { "pkeys": sc.wire_pkeys(), "qkeys": sc.wire_qkeys() },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{SwitchPolicy, SwitchRole};

    /// The switch policy is valid: each port an access port stamping its
    /// host's key, its table that key alone, checking both ways.
    #[test]
    fn switch_policy_is_what_the_hosts_need() {
        let file = tempfile::NamedTempFile::new().unwrap();
        fs::write(file.path(), policy(["sw-a", "sw-b", "sw-c", "sw-d"])).unwrap();
        let switch = SwitchPolicy::load(file.path()).unwrap();
        assert_eq!(switch.ports.len(), 4);
        for ((iface, port), (want, key)) in switch
            .ports
            .iter()
            .zip(["sw-a", "sw-b", "sw-c", "sw-d"].into_iter().zip(KEYS))
        {
            assert_eq!(iface, want);
            assert_eq!(port.pkeys, [key, 0xffff]);
            assert_eq!(
                port.switch,
                Some(SwitchRole {
                    inbound: true,
                    outbound: true,
                    corrupt: false,
                    access: Some(key),
                })
            );
        }
    }

    /// Every scenario is between two distinct hosts, and a stall is one the
    /// Table 16-2 rule refuses.
    #[test]
    fn scenarios_follow_the_rules() {
        for sc in all() {
            assert_ne!(sc.server, sc.client, "{}", sc.name);
            let (s, c) = (KEYS[sc.server], KEYS[sc.client]);
            let matches = s & 0x7fff == c & 0x7fff && (s | c) & 0x8000 != 0;
            assert_eq!(matches, sc.completes, "{}", sc.name);
        }
    }
}
