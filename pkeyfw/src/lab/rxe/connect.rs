//! Connection setup inside partitions: rdma_cm programs whose listener is
//! a tenant's, and clients of other partitions and of its own, in turn.
//! A client of another partition (or a limited member calling a limited
//! member) must get nowhere — its request never reaches the listener's
//! ib_cm (the server device's received-REQ counters stay still), the
//! listening program prints no connection and allocates nothing — and the
//! listener must still serve its own partition afterwards. Both ends
//! stamp, so every CM MAD carries its connection's key on the wire.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use pkeyfw_common::{Reason, Stamp};
use serde_json::json;

use super::{
    run::{self, Attach, Captures, Exit, Proc},
    scenario::{PORT, Program},
    tenants::{self, Tenant},
    topology::{End, Topology},
};
use crate::{
    loading::{
        maps::{Maps, ReasonCounts},
        pins::Pins,
    },
    policy::Policy,
};

/// One scenario: who listens, who calls whom, and what must come of it.
pub struct Scenario {
    pub name: &'static str,
    pub program: Program,
    /// The policy's `[enforcement]` and `[[bind]]` part (the port table is
    /// the lab's); both ends stamp.
    pub rules: &'static str,
    /// A server per listener, each on a port of its own from
    /// [`FIRST_PORT`] (programs that take none listen on their own).
    pub listeners: &'static [Tenant],
    /// In turn: who connects, to which listener, and whether the rules let
    /// it, with the rules both ends reload first where it says.
    pub clients: &'static [Client],
    /// Before the clients, an unprivileged tenant of another partition (D)
    /// sends the first listener REQs of its own making, from a UD QP to QP1
    /// (they leave with D's key) and from a UDP socket with the listener's
    /// partition's key (they do not leave).
    pub forged: bool,
    /// The listeners start before pkeyfw attaches: no probe sees them
    /// listen, the attach records them from RDMA netlink and `/proc`.
    pub listen_first: bool,
    /// P_Keys and Q_Keys on the wire.
    pub wire_pkeys: &'static [u16],
    pub wire_qkeys: &'static [u32],
    pub why: &'static str,
}

/// A client's turn.
pub struct Client {
    pub tenant: Tenant,
    /// The listener (an index of [`Scenario::listeners`]).
    pub to: usize,
    pub completes: bool,
    /// The rules to reload both ends with first (a kernel user is bound by
    /// rule, not by where it runs).
    pub rules: Option<&'static str>,
}

/// The first listener's port.
const FIRST_PORT: u16 = 7200;
/// How long a client that must complete may run: longer than a refused
/// one is given ([`run::STALL`]), which it must use up. Under emulation
/// beside other guests, `ib_send_bw`'s 200 messages of 64 KiB once took
/// longer than that after the listener had taken its REQ; a healthy run
/// returns early, so this costs a run nothing.
const COMPLETES_WITHIN: Duration = Duration::from_secs(30);
/// REQs of each kind the forger sends.
const FORGED: u32 = 3;
/// Q_Keys: the GSI's, udaddy's.
const GSI_QKEY: u32 = 0x8001_0000;
const UDADDY_QKEY: u32 = 0x0123_4567;

const fn in_cgroup(c: &'static str) -> Tenant {
    Tenant {
        cgroup: Some(c),
        uid: None,
    }
}
const A: Tenant = in_cgroup("a");
const B: Tenant = in_cgroup("b");
const C: Tenant = in_cgroup("c");
const D: Tenant = in_cgroup("d");

const fn client(tenant: Tenant, to: usize, completes: bool) -> Client {
    Client {
        tenant,
        to,
        completes,
        rules: None,
    }
}

/// The four-QP partition example's roles, each a cgroup, stamped: A a full
/// member of 0x0001, B and C limited members, D a full member of 0x0002.
const ROLES: &str = "[enforcement]\nstamp = true\n\
    [[bind]]\ncgroup = \"@CGROUPS@/a\"\npkey = 0x8001\n\
    [[bind]]\ncgroup = \"@CGROUPS@/b\"\npkey = 0x0001\n\
    [[bind]]\ncgroup = \"@CGROUPS@/c\"\npkey = 0x0001\n\
    [[bind]]\ncgroup = \"@CGROUPS@/d\"\npkey = 0x8002\n";

/// NVMe over Fabrics: the target (the server's device) a full member of
/// 0x0001, the initiator (the client's) of the partition given.
macro_rules! nvmeof {
    ($initiator:literal) => {
        concat!(
            "[enforcement]\nstamp = true\nunknown_qp = \"drop\"\n",
            "[[bind]]\nkernel = true\ncomm = \"rdma_cm\"\nport = 4420\ndevice = \"pkfw_rxe1\"\npkey = 0x8001\n",
            "[[bind]]\nkernel = true\ncomm = \"rdma_cm\"\nport = 4420\ndevice = \"pkfw_rxe0\"\npkey = ",
            $initiator,
            "\n"
        )
    };
}

pub fn all() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "cm-rping",
            program: Program::Rping,
            rules: ROLES,
            listeners: &[A, B],
            clients: const {
                &[
                    client(D, 0, false),
                    client(C, 1, false),
                    client(B, 0, true),
                    client(A, 1, true),
                ]
            },
            forged: false,
            listen_first: false,
            wire_pkeys: &[0x0001, 0x8001, 0x8002],
            wire_qkeys: &[GSI_QKEY],
            why: "D to A and C to B refused unseen; A and B then serve their own",
        },
        Scenario {
            name: "cm-udaddy",
            program: Program::Udaddy,
            rules: concat!(
                "[enforcement]\nstamp = true\n",
                "[[bind]]\ncgroup = \"@CGROUPS@/a\"\npkey = 0x8001\nqkey = 0x01234567\n",
                "[[bind]]\ncgroup = \"@CGROUPS@/c\"\npkey = 0x0001\nqkey = 0x01234567\n",
                "[[bind]]\ncgroup = \"@CGROUPS@/d\"\npkey = 0x8002\nqkey = 0x01234567\n"
            ),
            listeners: &[A],
            clients: const { &[client(D, 0, false), client(C, 0, true)] },
            forged: false,
            listen_first: false,
            wire_pkeys: &[0x0001, 0x8001, 0x8002],
            wire_qkeys: &[UDADDY_QKEY, GSI_QKEY],
            why: "D's SIDR_REQ refused unseen; C's answered",
        },
        Scenario {
            name: "cm-send-bw",
            program: Program::SendBw,
            rules: ROLES,
            listeners: &[A],
            clients: const { &[client(D, 0, false), client(B, 0, true)] },
            forged: false,
            listen_first: true,
            wire_pkeys: &[0x0001, 0x8001, 0x8002],
            wire_qkeys: &[GSI_QKEY],
            why: "perftest over rdma_cm, listening before the attach: D refused unseen, B completes",
        },
        Scenario {
            name: "cm-nvmeof",
            program: Program::NvmeOf,
            rules: nvmeof!("0x8002"),
            listeners: &[Tenant::ANY],
            clients: const {
                &[
                    client(Tenant::ANY, 0, false),
                    Client {
                        rules: Some(nvmeof!("0x0001")),
                        ..client(Tenant::ANY, 0, true)
                    },
                ]
            },
            forged: false,
            listen_first: true,
            wire_pkeys: &[0x0001, 0x8001, 0x8002],
            wire_qkeys: &[GSI_QKEY],
            why: "a target set up before the attach: an initiator of 0x0002 refused unseen, of 0x0001 reads",
        },
        Scenario {
            name: "cm-forged-req",
            program: Program::Rping,
            rules: ROLES,
            listeners: &[A],
            clients: const { &[client(B, 0, true)] },
            forged: true,
            listen_first: false,
            wire_pkeys: &[0x0001, 0x8001, 0x8002],
            wire_qkeys: &[GSI_QKEY],
            why: "D's own REQs: from its UD QP with its key, refused unseen; from a UDP socket, held; B completes",
        },
    ]
}

impl Scenario {
    fn policy_text(&self, rules: &str) -> String {
        tenants::fill(&format!("{PORT}{rules}"))
    }
}

/// What one client's turn came to.
#[derive(Clone, Debug)]
pub struct Turn {
    pub exit: Exit,
    /// CM requests (REQ, SIDR_REQ) the server device's ib_cm took in
    /// meanwhile.
    pub requests: u64,
}

pub struct Observed {
    pub turns: Vec<Turn>,
    /// CM requests the server's ib_cm took in while the forger sent its own.
    pub forged_seen: u64,
    /// Connection requests each listening program printed (rping's).
    pub announced: Vec<Option<usize>>,
    /// Listeners the server end's attach recorded as listening before its
    /// probes ran.
    pub recorded_late: usize,
    /// The server end's and the client end's filter counters.
    pub reasons: ReasonCounts,
    pub client_reasons: ReasonCounts,
    /// CM MADs both ends stamped with their connection's key, and frames
    /// the client's end refused to send as forged.
    pub cm_stamped: u64,
    pub forged: u64,
    pub captures: Vec<PathBuf>,
    pub frames: usize,
    pub bad_icrc: usize,
    pub output: String,
}

/// Runs each scenario on the pair.
pub fn run(
    topo: &Topology,
    scenarios: &[Scenario],
    work: &Path,
    captures: Option<&Path>,
) -> Result<Vec<Observed>> {
    scenarios
        .iter()
        .map(|sc| {
            let o = scenario(topo, sc, work, captures)?;
            if judge(sc, &o) {
                println!("  {:<22} as expected", sc.name);
            } else {
                println!("  {:<22} NOT as expected\n{}", sc.name, o.output);
            }
            Ok(o)
        })
        .collect()
}

/// Runs one scenario: its listeners, then its clients in turn.
fn scenario(
    topo: &Topology,
    sc: &Scenario,
    work: &Path,
    capture_dir: Option<&Path>,
) -> Result<Observed> {
    let (server_end, client_end) = (topo.server(), topo.client());
    let policy = work.join(format!("{}.toml", sc.name));
    fs::write(&policy, sc.policy_text(sc.rules))?;
    Policy::parse(&policy, &fs::read_to_string(&policy)?)
        .with_context(|| format!("scenario {}'s policy", sc.name))?;
    let logs = capture_dir.unwrap_or(work);
    let log = |role: String| fs::File::create(logs.join(format!("{}.{role}.log", sc.name)));
    let listen = || -> Result<Vec<Proc>> {
        let mut servers = Vec::new();
        for (i, tenant) in sc.listeners.iter().enumerate() {
            let mut cmd = Command::new(sc.program.name());
            tenant.place(&mut cmd)?;
            let mut args = sc.program.server(server_end);
            args.extend(on_port(sc.program, FIRST_PORT + i as u16));
            if sc.program == Program::Rping {
                // Its debug lines name every rdma_cm event it gets.
                args.push("-d".into());
            }
            servers.push(Proc(
                cmd.args(args)
                    .stdout(log(format!("server{i}"))?)
                    .stderr(log(format!("server{i}.err"))?)
                    .spawn()
                    .with_context(|| format!("starting {}", sc.program.name()))?,
            ));
        }
        wait_listening(server_end, sc.listeners.len())?;
        Ok(servers)
    };
    let early = if sc.listen_first {
        listen()?
    } else {
        Vec::new()
    };
    let server_attach = Attach::start(&server_end.iface, &policy, false)?;
    let client_attach = Attach::start(&client_end.iface, &policy, false)?;
    let servers = if sc.listen_first { early } else { listen()? };
    let capturing = Captures::start(capture_dir, sc.name, server_end, client_end)?;
    let forged_seen = if sc.forged {
        let before = requests(server_end);
        forge(client_end, server_end, FIRST_PORT)?;
        // What crosses the veth is judged at once: a moment for the
        // server's ib_cm to take in what got through.
        std::thread::sleep(Duration::from_millis(500));
        requests(server_end) - before
    } else {
        0
    };
    let mut turns = Vec::new();
    for (n, c) in sc.clients.iter().enumerate() {
        if let Some(rules) = c.rules {
            let next = work.join(format!("{}.{n}.toml", sc.name));
            fs::write(&next, sc.policy_text(rules))?;
            for end in [server_end, client_end] {
                run::reload(&end.iface, &next)?;
            }
        }
        let before = requests(server_end);
        let mut cmd = Command::new(sc.program.name());
        c.tenant.place(&mut cmd)?;
        let mut args = sc.program.client(client_end, server_end);
        args.extend(on_port(sc.program, FIRST_PORT + c.to as u16));
        let mut proc = Proc(
            cmd.args(args)
                .stdout(log(format!("client{n}"))?)
                .stderr(log(format!("client{n}.err"))?)
                .spawn()
                .with_context(|| format!("starting {}", sc.program.name()))?,
        );
        let exit = proc.wait(if c.completes {
            COMPLETES_WITHIN
        } else {
            run::STALL
        })?;
        drop(proc);
        turns.push(Turn {
            exit,
            requests: requests(server_end) - before,
        });
    }
    for mut s in servers {
        let _ = s.wait(run::LINGER);
    }
    let captures = capturing.finish();
    let counted = |end: &End| -> Result<(ReasonCounts, [u64; 2])> {
        let maps = Maps::from_pins(&Pins::of(&end.iface).dir)?;
        let stamps = maps.stamps()?;
        Ok((
            maps.reasons()?,
            [Stamp::Cm, Stamp::Forged].map(|s| stamps[s.index() as usize]),
        ))
    };
    let (reasons, [server_cm, _]) = counted(server_end)?;
    let (client_reasons, [client_cm, forged]) = counted(client_end)?;
    let mut lines = server_attach.lines.lock().expect("not poisoned").clone();
    let recorded_late = lines
        .iter()
        .filter(|l| l.contains("listening before the probes ran"))
        .count();
    lines.push("pkeyfw attach (client's end):".into());
    lines.extend(
        client_attach
            .lines
            .lock()
            .expect("not poisoned")
            .iter()
            .cloned(),
    );
    server_attach.stop();
    client_attach.stop();
    let announced = (0..sc.listeners.len())
        .map(|i| {
            (sc.program == Program::Rping).then(|| {
                fs::read_to_string(logs.join(format!("{}.server{i}.log", sc.name)))
                    .unwrap_or_default()
                    .matches("RDMA_CM_EVENT_CONNECT_REQUEST")
                    .count()
            })
        })
        .collect();
    let (frames, bad_icrc) = run::icrc_check(&captures)?;
    let tails: Vec<String> = fs::read_dir(logs)?
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{}.", sc.name))
        })
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| {
            let text = fs::read_to_string(e.path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            format!(
                "{}:\n{}",
                e.file_name().to_string_lossy(),
                lines[lines.len().saturating_sub(4)..].join("\n")
            )
        })
        .collect();
    Ok(Observed {
        output: format!(
            "turns: {turns:?}\n{}\npkeyfw attach:\n{}",
            tails.join("\n"),
            lines.join("\n")
        ),
        turns,
        forged_seen,
        announced,
        recorded_late,
        reasons,
        client_reasons,
        cm_stamped: server_cm + client_cm,
        forged,
        captures,
        frames,
        bad_icrc,
    })
}

/// The arguments that put `program`'s listener (and its clients) on
/// `port`, where it takes one: rping's, and perftest's over rdma_cm —
/// with `-F`, a report even where the CPU clock cannot be calibrated (under
/// emulation), not an exit that leaves the other end waiting for its
/// disconnect.
fn on_port(program: Program, port: u16) -> Vec<String> {
    let port = port.to_string();
    match program {
        Program::Rping => vec!["-p".into(), port],
        Program::SendBw => vec!["-R".into(), "-F".into(), "-p".into(), port],
        _ => Vec::new(),
    }
}

/// CM requests (REQ, SIDR_REQ) `end`'s device's ib_cm has taken in.
fn requests(end: &End) -> u64 {
    ["req", "sidr_req"]
        .iter()
        .map(|m| {
            fs::read_to_string(format!(
                "/sys/class/infiniband/{}/ports/1/cm_rx_msgs/{m}",
                end.device
            ))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
        })
        .sum()
}

/// Waits until `end`'s device has `n` rdma_cm listeners (or a minute, for
/// a kernel target's configfs set-up under emulation): bound to it
/// (`link DEV/1`), or a wildcard listener's own on it (`link DEV/-`).
fn wait_listening(end: &End, n: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let link = format!("link {}/", end.device);
    loop {
        let out = Command::new("rdma")
            .args(["resource", "show", "cm_id"])
            .stderr(Stdio::null())
            .output()?;
        let listening = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with(&link) && l.contains("state LISTEN"))
            .count();
        if listening >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{n} rdma_cm listeners did not appear on {}", end.device);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The forger: D, unprivileged, sends the listener on `port` at `server`
/// REQs of its own making from `client`'s device and address.
fn forge(client: &End, server: &End, port: u16) -> Result<()> {
    let mut cmd = run::as_nobody()?;
    D.place(&mut cmd)?;
    let out = cmd
        .args(["--device", &client.device, "--gid-index"])
        .arg(client.gid_index.to_string())
        .args(["--cm-req", &port.to_string(), "--peer"])
        .arg(server.addr.to_string())
        .arg("--me")
        .arg(client.addr.to_string())
        .args(["--count", &FORGED.to_string()])
        .output()?;
    if !out.status.success() {
        bail!(
            "the forger failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Whether a scenario went as the rules say: each client completed or got
/// nowhere as it should, a refused one's request never reaching the
/// server's ib_cm nor the listening program; listeners that listened
/// before the attach recorded by it; the forger's REQs neither reaching,
/// its socket's dropped at the client's egress; the server's end refused
/// nothing but by P_Key (and only if something was to be refused), the
/// client's end nothing; CM MADs stamped with their connections' keys;
/// every ICRC true.
fn judge(sc: &Scenario, o: &Observed) -> bool {
    let turns = sc
        .clients
        .iter()
        .zip(&o.turns)
        .all(|(c, t)| match c.completes {
            true => t.exit == Exit::Ok,
            false => t.exit != Exit::Ok && t.requests == 0,
        });
    let announced = o.announced.iter().enumerate().all(|(i, n)| {
        n.is_none_or(|n| {
            n == sc
                .clients
                .iter()
                .filter(|c| c.to == i && c.completes)
                .count()
        })
    });
    let refused_only = |r: &ReasonCounts, allowed: Option<Reason>| {
        Reason::ALL
            .into_iter()
            .all(|x| Some(x) == allowed || r.refused_by(x) == 0)
    };
    // The forger's REQs from its UD QP carry its own key (D's): refused
    // at the listener.
    let refusals = (o.reasons.refused_by(Reason::PkeyViolation) > 0)
        == (sc.forged || sc.clients.iter().any(|c| !c.completes));
    let late = o.recorded_late
        == if sc.listen_first {
            sc.listeners.len()
        } else {
            0
        };
    turns
        && announced
        && late
        && (!sc.forged || (o.forged_seen == 0 && o.forged >= u64::from(FORGED)))
        && refused_only(&o.reasons, Some(Reason::PkeyViolation))
        && refusals
        && refused_only(&o.client_reasons, None)
        && o.cm_stamped > 0
        && o.bad_icrc == 0
}

/// Prints the table; whether every scenario matched.
pub fn table(scenarios: &[Scenario], rows: &[Observed]) -> bool {
    println!(
        "\n {:>2}  {:<16} {:<16} {:<48} {:<28} rule",
        "#", "scenario", "program", "clients (to listener): expected / observed", "refused"
    );
    let mut matched = 0;
    for (i, (sc, o)) in scenarios.iter().zip(rows).enumerate() {
        let ok = judge(sc, o);
        matched += usize::from(ok);
        let turns: Vec<String> = sc
            .clients
            .iter()
            .zip(&o.turns)
            .map(|(c, t)| {
                format!(
                    "{}→{} {}/{}",
                    c.tenant.cgroup.unwrap_or("kernel"),
                    c.to,
                    if c.completes { "ok" } else { "no" },
                    match t.exit {
                        Exit::Ok => "ok".to_string(),
                        _ => format!("no, {} REQs seen", t.requests),
                    }
                )
            })
            .collect();
        println!(
            " {:>2}  {:<16} {:<16} {:<48} {:<28} {} {}",
            i + 1,
            sc.name,
            sc.program.name(),
            turns.join(", "),
            format!(
                "pkey_violation {}, forged {}",
                o.reasons.refused_by(Reason::PkeyViolation),
                o.forged
            ),
            if ok { "✓" } else { "✗" },
            sc.why
        );
    }
    println!(
        "\n{matched} of {} connection-setup scenarios as the partition rules say.",
        scenarios.len()
    );
    matched == scenarios.len()
}

pub fn results(scenarios: &[Scenario], rows: &[Observed]) -> Vec<serde_json::Value> {
    scenarios
        .iter()
        .zip(rows)
        .map(|(sc, o)| {
            json!({
                "name": sc.name,
                "program": sc.program.name(),
                "ok": judge(sc, o),
                "turns": sc.clients.iter().zip(&o.turns).map(|(c, t)| json!({
                    "client": c.tenant.cgroup.unwrap_or("kernel"),
                    "listener": sc.listeners[c.to].cgroup.unwrap_or("kernel"),
                    "expected": { "completes": c.completes },
                    "observed": { "client": super::exit_json(t.exit), "requests_at_listener": t.requests },
                })).collect::<Vec<_>>(),
                "forged": { "sent": if sc.forged { 2 * FORGED } else { 0 }, "socket_dropped_at_egress": o.forged, "requests_at_listener": o.forged_seen },
                "announced": o.announced,
                "recorded_at_attach": o.recorded_late,
                "reasons": crate::reporting::describe::reasons_json(&o.reasons),
                "client_reasons": crate::reporting::describe::reasons_json(&o.client_reasons),
                "cm_stamped": o.cm_stamped,
                "icrc": { "frames": o.frames, "bad": o.bad_icrc },
                "captures": o.captures.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
                "wire": { "pkeys": sc.wire_pkeys, "qkeys": sc.wire_qkeys },
            })
        })
        .collect()
}
