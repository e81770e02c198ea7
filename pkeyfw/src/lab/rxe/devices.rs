//! Tenants on one host, each with a device of its own: the four roles of the
//! partition example (A a full member of 0x0001, B and C limited members,
//! D a full member of 0x0002) are cgroups whose rules give each an
//! `own_device`, and one `pkeyfw attach --pin` of the uplink makes their
//! devices, their ports and the device guard. Unmodified programs run in
//! the tenants' cgroups, each on its own device: A and B complete, A and D
//! and B and C stall, every frame between them crossing the network stack,
//! stamped at the sender's port and judged at the receiver's (none meets
//! another inside rdma_rxe). Beside the programs: B cannot open A's, C's
//! or D's device, nor a process outside every tenant A's; a QP made on A's
//! device by B's tenant (root, with the device opened before it joined B's
//! cgroup) is quarantined; the host's other routes stay as they were; a
//! reload without D's rule removes D's device alone (and its metrics
//! series); once the host is detached its routes are as they were and no
//! device is left.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::json;

use super::{
    run::{self, Exit, Proc},
    scenario::Program,
    tenants::{self, Tenant},
    topology::{self, End},
};

/// The roles: their cgroups, keys and names.
const ROLES: [(&str, u16); 4] = [("a", 0x8001), ("b", 0x0001), ("c", 0x0001), ("d", 0x8002)];
const NAMES: [&str; 4] = ["A", "B", "C", "D"];
const A: usize = 0;
const B: usize = 1;
const C: usize = 2;
const D: usize = 3;

/// The uplink, its peer (in a namespace of its own: the rest of the
/// network), and the host's own address on it.
const UPLINK: &str = "pkfw-up";
const PEER: &str = "pkfw-up-peer";
const NETNS: &str = "pkfw-own";
const HOST: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 20);
/// Where the host's routes are asked about before, during and after: its
/// own address, a host on the tenants' subnet, one beyond, loopback.
const ASKED: [&str; 4] = ["192.0.2.20", "192.0.2.50", "198.51.100.1", "127.0.0.1"];

/// ibv_ud_pingpong's Q_Key and the GSI's.
const PP_QKEY: u32 = 0x1111_1111;
const GSI_QKEY: u32 = 0x8001_0000;

/// What runs beside a scenario's programs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Beside {
    Nothing,
    /// Root opens the server's device outside every tenant, then joins the
    /// client's cgroup and makes a QP there: quarantined at its creation.
    ForeignQp,
    /// The server's tenant opens the other tenants' devices (the attacker,
    /// `ibv_devinfo -d`, `ibv_rc_pingpong -d`), and its own; `nobody`,
    /// outside every tenant, A's.
    Opens,
}

/// One scenario: a program between two tenants' own devices.
pub struct Scenario {
    pub name: &'static str,
    pub program: Program,
    pub server: usize,
    pub client: usize,
    pub completes: bool,
    pub beside: Beside,
    pub why: &'static str,
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
        beside: Beside::Nothing,
        why,
    }
}

pub fn all() -> Vec<Scenario> {
    use Program::{RcPingpong as Rc, Rping, UdPingpong as Ud};
    const FULL_LIMITED: &str = "full and limited member of 0x0001";
    const LIMITED: &str = "two limited members never match";
    const OTHER: &str = "partition 0x0002 is not 0x0001";
    vec![
        Scenario {
            beside: Beside::ForeignQp,
            ..sc("own-device-ud-a-b", Ud, [A, B], true, FULL_LIMITED)
        },
        sc("own-device-rc-a-b", Rc, [A, B], true, FULL_LIMITED),
        sc("own-device-rping-a-b", Rping, [A, B], true, FULL_LIMITED),
        sc("own-device-ud-a-d", Ud, [A, D], false, OTHER),
        sc("own-device-rc-a-d", Rc, [A, D], false, OTHER),
        // D's connection request refused at A's port: A's rping sees none.
        sc("own-device-rping-a-d", Rping, [A, D], false, OTHER),
        sc("own-device-ud-b-c", Ud, [B, C], false, LIMITED),
        Scenario {
            beside: Beside::Opens,
            ..sc("own-device-rc-b-c", Rc, [B, C], false, LIMITED)
        },
    ]
}

impl Scenario {
    /// The P_Keys on the wire: the client's, and the server's where it
    /// answers (rdma_cm's connection management among them: each side's
    /// MADs carry its connection's key).
    fn wire_pkeys(&self) -> BTreeSet<u16> {
        let mut keys = BTreeSet::from([ROLES[self.client].1]);
        if self.completes {
            keys.insert(ROLES[self.server].1);
        }
        keys
    }

    fn wire_qkeys(&self) -> Vec<u32> {
        match self.program {
            Program::UdPingpong => vec![PP_QKEY],
            Program::Rping => vec![GSI_QKEY],
            _ => Vec::new(),
        }
    }

    /// "A 0x8001 ⟵ B 0x0001".
    fn pair(&self) -> String {
        let role = |r: usize| format!("{} {:#06x}", NAMES[r], ROLES[r].1);
        format!("{} ⟵ {}", role(self.server), role(self.client))
    }
}

/// The policy: each of `roles`' cgroups a tenant with a device of its own.
fn policy(roles: usize) -> String {
    let mut text = "[port]\npkeys = [0xffff, 0x8001, 0x0001, 0x8002]\n\
        [enforcement]\nstamp = true\nunknown_qp = \"drop\"\n"
        .to_string();
    for (i, (cgroup, key)) in ROLES.iter().enumerate().take(roles) {
        text += &format!(
            "\n[[bind]]\ncgroup = \"@CGROUPS@/{cgroup}\"\npkey = {key:#06x}\nown_device = {{ name = \"{}\", address = \"{}/24\" }}\n",
            device(i),
            address(i)
        );
    }
    tenants::fill(&text)
}

fn device(role: usize) -> String {
    format!("pkfw_own_{}", ROLES[role].0)
}

fn address(role: usize) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, 21 + role as u8)
}

/// A port's counters over a scenario, as `pkeyfw stats --json` has them.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Port {
    pub ok: u64,
    pub refused: u64,
    pub pkey_violations: u64,
    /// Refused as meant for no QP: a stalled client's last retries, in
    /// flight as the server exits.
    pub unknown_qp: u64,
    pub stamped: u64,
    pub restored: u64,
    pub foreign: u64,
}

impl Port {
    fn since(self, b: Port) -> Port {
        Port {
            ok: self.ok.saturating_sub(b.ok),
            refused: self.refused.saturating_sub(b.refused),
            pkey_violations: self.pkey_violations.saturating_sub(b.pkey_violations),
            unknown_qp: self.unknown_qp.saturating_sub(b.unknown_qp),
            stamped: self.stamped.saturating_sub(b.stamped),
            restored: self.restored.saturating_sub(b.restored),
            foreign: self.foreign.saturating_sub(b.foreign),
        }
    }
}

pub struct Observed {
    pub server: Exit,
    pub client: Exit,
    /// Per role: its port's counters and its rxe device's `rcvd_pkts` over
    /// the scenario.
    pub ports: [Port; 4],
    pub rcvd: [u64; 4],
    /// The P_Keys of the RoCE frames the two tenants' interfaces carried.
    pub wire_pkeys: BTreeSet<u16>,
    pub frames: usize,
    pub bad_icrc: usize,
    /// What [`Beside`] found wrong, if anything.
    pub beside: Option<String>,
    /// Whether the host's routes were as before the attach, during it.
    pub routes_kept: bool,
    pub captures: Vec<PathBuf>,
    pub output: String,
}

impl Observed {
    pub fn completes(&self) -> bool {
        self.client == Exit::Ok && self.server == Exit::Ok
    }
}

/// The host: its uplink, attached as a tenant host while it lives.
struct Host {
    /// The roles' devices, as the programs name them.
    ends: [End; 4],
    /// `ip route get` of [`ASKED`], `ip rule` and the uplink's
    /// `arp_ignore` before the attach.
    routes: Vec<String>,
    rules: String,
    arp_ignore: String,
    /// How long the attach took.
    attach: Duration,
}

impl Host {
    fn create(work: &Path) -> Result<Host> {
        let _ = topology::ip(&["netns", "del", NETNS]);
        let _ = topology::ip(&["link", "del", UPLINK]);
        topology::ip(&["netns", "add", NETNS])?;
        topology::ip(&[
            "link", "add", UPLINK, "type", "veth", "peer", "name", PEER, "netns", NETNS,
        ])?;
        topology::ip(&["addr", "add", &format!("{HOST}/24"), "dev", UPLINK])?;
        topology::ip(&["link", "set", UPLINK, "up"])?;
        topology::ip(&["-n", NETNS, "link", "set", PEER, "up"])?;
        let routes = routes()?;
        let (rules, arp_ignore) = (rules()?, uplink_arp_ignore()?);
        let policy = work.join("own-devices.toml");
        fs::write(&policy, self::policy(ROLES.len()))?;
        let started = Instant::now();
        run::pkeyfw(&[
            "attach",
            UPLINK,
            "--pin",
            "--policy",
            &policy.display().to_string(),
        ])?;
        let attach = started.elapsed();
        let mut ends = [0, 1, 2, 3].map(|i| End {
            iface: device(i),
            addr: address(i),
            device: device(i),
            gid_index: 0,
        });
        for end in &mut ends {
            end.gid_index = topology::gid_index(&end.device, end.addr)?;
        }
        Ok(Host {
            ends,
            routes,
            rules,
            arp_ignore,
            attach,
        })
    }

    /// Each role's port's counters so far.
    fn ports(&self) -> Result<[Port; 4]> {
        let out = run::pkeyfw(&["stats", "--json", UPLINK])?;
        let objects: Vec<serde_json::Value> = out
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()
            .context("pkeyfw stats --json printed something else than JSON lines")?;
        let port = |end: &End| -> Result<Port> {
            let o = objects
                .iter()
                .find(|o| o["interface"] == end.iface.as_str())
                .with_context(|| format!("pkeyfw stats shows no port {}", end.iface))?;
            let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
            let refused: u64 = o["verdicts"]
                .as_object()
                .map(|r| r.values().map(|v| n(&v["drop"])).sum())
                .unwrap_or(0);
            Ok(Port {
                ok: n(&o["reasons"]["ok"]),
                refused,
                pkey_violations: n(&o["reasons"]["pkey_violation"]),
                unknown_qp: n(&o["reasons"]["unknown_qp"]),
                // Data frames, and CM MADs stamped with their
                // connection's key.
                stamped: n(&o["stamping"]["frames"]["stamped"]) + n(&o["stamping"]["frames"]["cm"]),
                restored: n(&o["stamping"]["frames"]["restored"]),
                foreign: n(&o["probes"]["foreign_device"]),
            })
        };
        let [a, b, c, d] = &self.ends;
        Ok([port(a)?, port(b)?, port(c)?, port(d)?])
    }
}

impl Host {
    /// Reloads a policy without D's rule: whether D's device and interface
    /// went, and the others' stayed as they were (their QPs with them);
    /// the metrics showed every tenant's device before, and D's no more.
    fn reload_without_d(&self, work: &Path) -> Result<bool> {
        let index = |d: &str| fs::read_to_string(format!("/sys/class/net/{d}/ifindex")).ok();
        let before: Vec<Option<String>> = (0..D).map(|i| index(&device(i))).collect();
        let series_before = tenant_series()?;
        let path = work.join("own-devices-without-d.toml");
        fs::write(&path, policy(D))?;
        // `nobody` tries D's device all through the reload: a device on its
        // way out is no one's to open (an fd got then would outlive the
        // reload, and meet D's QPs inside rdma_rxe until D's device goes).
        let opener = racing_opener(&uverbs_node(&device(D))?, work)?;
        run::pkeyfw(&["reload", UPLINK, "--policy", &path.display().to_string()])?;
        let opened = opener.stop()?;
        if opened > 0 {
            println!(
                "  nobody opened {}'s device {opened} times during the reload that removed it",
                NAMES[D]
            );
        }
        let kept: Vec<Option<String>> = (0..D).map(|i| index(&device(i))).collect();
        let gone = !Path::new(&format!("/sys/class/infiniband/{}", device(D))).exists()
            && index(&device(D)).is_none();
        let series_after = tenant_series()?;
        let series = |n: usize| -> BTreeSet<String> {
            (0..n)
                .map(|i| format!("{0} {0} {1:#06x} {UPLINK}", device(i), ROLES[i].1))
                .collect()
        };
        let shown = series_before == series(4) && series_after == series(D);
        if !shown {
            println!(
                "  pkeyfw_tenant_device_info: {series_before:?} before the reload, {series_after:?} after"
            );
        }
        Ok(gone && kept == before && kept.iter().all(Option::is_some) && shown && opened == 0)
    }

    /// Detaches the host: whether the host's routes, rules and uplink are
    /// then as before the attach and no tenant's interface or device is
    /// left.
    fn detach(&self) -> Result<bool> {
        run::pkeyfw(&["detach", UPLINK])?;
        self.as_before("once detached")
    }

    /// Whether the host is as before the attach, saying what is not.
    fn as_before(&self, when: &str) -> Result<bool> {
        let left: Vec<String> = (0..4)
            .map(device)
            .filter(|d| {
                Path::new(&format!("/sys/class/net/{d}")).exists()
                    || Path::new(&format!("/sys/class/infiniband/{d}")).exists()
            })
            .collect();
        let (now, rules, arp_ignore) = (routes()?, rules()?, uplink_arp_ignore()?);
        if now != self.routes
            || rules != self.rules
            || arp_ignore != self.arp_ignore
            || !left.is_empty()
        {
            println!(
                "  {when}: routes {now:?} (before the attach {:?}), rules {rules:?} (before {:?}), {UPLINK}'s arp_ignore {arp_ignore} (before {}), left {left:?}",
                self.routes, self.rules, self.arp_ignore
            );
            return Ok(false);
        }
        Ok(true)
    }

    /// An attach of the four tenants SIGKILLed once it made their devices
    /// (before it attached their ports and noted what it made), an attach
    /// without D's rule replacing it, then a detach: whether the host is
    /// then as before (D's device, made by the killed attach alone, gone;
    /// the uplink's `arp_ignore` back).
    fn killed_attach(&self, work: &Path) -> Result<bool> {
        let all = work.join("own-devices.toml");
        let mut killed = Proc(
            Command::new(std::env::current_exe()?)
                .args(["attach", UPLINK, "--pin", "--policy"])
                .arg(&all)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .context("starting the attach to kill")?,
        );
        let made = Path::new("/sys/class/infiniband").join(device(D));
        let deadline = Instant::now() + Duration::from_secs(120);
        while !made.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        killed.0.kill()?;
        killed.0.wait()?;
        if !made.exists() {
            bail!("the attach to kill made no device {} in 120 s", device(D));
        }
        let without_d = work.join("own-devices-without-d.toml");
        run::pkeyfw(&[
            "attach",
            UPLINK,
            "--pin",
            "--policy",
            &without_d.display().to_string(),
        ])?;
        run::pkeyfw(&["detach", UPLINK])?;
        self.as_before("after a SIGKILLed attach, a replacing one without D and a detach")
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // Whatever an interrupted run left.
        let _ = run::pkeyfw(&["detach", UPLINK]);
        let _ = topology::ip(&["link", "del", UPLINK]);
        let _ = topology::ip(&["netns", "del", NETNS]);
    }
}

/// The `pkeyfw_tenant_device_info` series a scrape shows now, each as
/// "interface device pkey uplink".
fn tenant_series() -> Result<BTreeSet<String>> {
    let text = scrape()?;
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("pkeyfw_tenant_device_info{"))
        .map(|l| {
            let label = |name: &str| {
                l.split(&format!("{name}=\""))
                    .nth(1)
                    .and_then(|v| v.split('"').next())
                    .unwrap_or_default()
                    .to_string()
            };
            ["interface", "device", "pkey", "uplink"]
                .map(label)
                .join(" ")
        })
        .collect())
}

/// Where the lab's `pkeyfw metrics` listens (the guest's loopback).
const METRICS: &str = "127.0.0.1:9436";

/// One scrape of a `pkeyfw metrics` the lab starts for it, as Prometheus
/// makes it: the body of `GET /metrics`.
fn scrape() -> Result<String> {
    use std::io::{Read as _, Write as _};
    let _server = Proc(
        Command::new(std::env::current_exe()?)
            .args(["metrics", "--listen", METRICS])
            .stdout(std::process::Stdio::null())
            .spawn()
            .context("starting pkeyfw metrics")?,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut stream = loop {
        match std::net::TcpStream::connect(METRICS) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(e).context("pkeyfw metrics never listened"),
        }
    };
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    match answer.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
        _ => bail!(
            "pkeyfw metrics answered: {}",
            answer.lines().next().unwrap_or("nothing")
        ),
    }
}

/// `ip rule` of both families.
fn rules() -> Result<String> {
    let mut text = String::new();
    for family in ["-4", "-6"] {
        let out = Command::new("ip").args([family, "rule"]).output()?;
        text += &String::from_utf8_lossy(&out.stdout);
    }
    Ok(text)
}

/// The uplink's `arp_ignore`.
fn uplink_arp_ignore() -> Result<String> {
    Ok(
        fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{UPLINK}/arp_ignore"))?
            .trim()
            .to_string(),
    )
}

/// `ip route get` of every address of [`ASKED`], one line each, as a
/// route reads whatever table the kernel found it in (with custom rules
/// the local table answers by name, where it answered as main before).
fn routes() -> Result<Vec<String>> {
    ASKED
        .iter()
        .map(|a| {
            let out = Command::new("ip").args(["route", "get", a]).output()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            Ok(text
                .lines()
                .next()
                .unwrap_or_default()
                .replace(" table local", "")
                .trim()
                .to_string())
        })
        .collect()
}

/// What the scenarios came to, and whether the routes were as before once
/// the host was detached.
pub struct Ran {
    pub rows: Vec<Observed>,
    /// A reload without D's rule removed D's device alone, and once
    /// detached the host's routes were as before and no device was left;
    /// so too after a SIGKILLed attach, a replacing one and a detach.
    pub restored: bool,
    pub attach: Duration,
    /// The whole group's time: setup, scenarios, reload, detach.
    pub took: Duration,
}

/// Makes the host, runs the scenarios, detaches it; captures go to
/// `capture_dir`, else `work`.
pub fn run(scenarios: &[Scenario], work: &Path, capture_dir: Option<&Path>) -> Result<Ran> {
    let started = Instant::now();
    let host = Host::create(work)?;
    println!(
        "pkeyfw lab rxe, devices of their own: tenants {} on one host, each a cgroup with its own device on uplink {UPLINK} (attached in {:.1} s)",
        (0..4)
            .map(|i| format!(
                "{} {:#06x} ({}, {})",
                NAMES[i],
                ROLES[i].1,
                device(i),
                address(i)
            ))
            .collect::<Vec<_>>()
            .join(", "),
        host.attach.as_secs_f64()
    );
    let dir = capture_dir.unwrap_or(work);
    let mut rows = Vec::new();
    for sc in scenarios {
        let observed = scenario(&host, sc, dir)?;
        if judge(sc, &observed) {
            println!("  {:<22} as expected", sc.name);
        } else {
            println!(
                "  {:<22} NOT as expected: {}\n{}",
                sc.name,
                unmet(sc, &observed).join("; "),
                observed.output
            );
        }
        rows.push(observed);
    }
    let attach = host.attach;
    let reloaded = host.reload_without_d(work)?;
    if !reloaded {
        println!("  a reload without D's rule did not remove D's device alone");
    }
    let restored = reloaded && host.detach()? && host.killed_attach(work)?;
    Ok(Ran {
        rows,
        restored,
        attach,
        took: started.elapsed(),
    })
}

fn scenario(host: &Host, sc: &Scenario, dir: &Path) -> Result<Observed> {
    let (server, client) = (&host.ends[sc.server], &host.ends[sc.client]);
    let pcap = |end: &End| dir.join(format!("{}.{}.pcap", sc.name, end.iface));
    let captures = vec![pcap(server), pcap(client)];
    let dumps = [server, client]
        .iter()
        .zip(&captures)
        .map(|(end, path)| run::tcpdump(None, &end.iface, "inout", path))
        .collect::<Result<Vec<_>>>()?;
    let ports_before = host.ports()?;
    let rcvd_before = rcvd(&host.ends);
    let program = sc.program;
    let in_role = |role: usize| Tenant {
        cgroup: Some(ROLES[role].0),
        uid: None,
    };
    let mut cmd = Command::new(program.name());
    cmd.args(program.server(server));
    in_role(sc.server).place(&mut cmd)?;
    let server_proc = run::start(&mut cmd, dir, sc.name, "server")?;
    run::wait_ready(program)?;
    let beside = match sc.beside {
        Beside::ForeignQp => Some(foreign_qp(server, sc.client)?),
        _ => None,
    };
    let mut cmd = Command::new(program.name());
    cmd.args(program.client(client, server));
    in_role(sc.client).place(&mut cmd)?;
    let client_proc = run::start(&mut cmd, dir, sc.name, "client")?;
    let (client_exit, server_exit) = run::finish(client_proc, server_proc)?;
    let mut problems = Vec::new();
    if let Some(mut foreigner) = beside
        && foreigner.wait(run::STALL)? != Exit::Ok
    {
        problems.push("the foreign QP's maker failed".to_string());
    }
    if sc.beside == Beside::Opens {
        problems.extend(opens(host, sc)?);
    }
    run::drain_captures(&captures);
    for d in dumps {
        run::stop(d);
    }
    let ports_after = host.ports()?;
    let rcvd_after = rcvd(&host.ends);
    let (frames, bad_icrc) = run::icrc_check(&captures)?;
    let mut wire_pkeys = BTreeSet::new();
    for path in &captures {
        wire_pkeys.extend(run::roce_frames(path)?.iter().map(|r| r.pkey()));
    }
    let ports = [0, 1, 2, 3].map(|i| ports_after[i].since(ports_before[i]));
    if sc.beside == Beside::ForeignQp && ports[sc.server].foreign != 1 {
        problems.push(format!(
            "{} quarantined {} foreign QPs, not 1",
            server.device, ports[sc.server].foreign
        ));
    }
    let tail = |role: &str| run::tail(dir, sc.name, role);
    Ok(Observed {
        server: server_exit,
        client: client_exit,
        ports,
        rcvd: [0, 1, 2, 3].map(|i| rcvd_after[i].saturating_sub(rcvd_before[i])),
        wire_pkeys,
        frames,
        bad_icrc,
        beside: (!problems.is_empty()).then(|| problems.join("; ")),
        routes_kept: routes()? == host.routes,
        captures,
        output: format!(
            "client: {}\nclient stderr: {}\nserver: {}\nserver stderr: {}",
            tail("client"),
            tail("client.err"),
            tail("server"),
            tail("server.err"),
        ),
    })
}

/// Each role's rxe `rcvd_pkts` so far.
fn rcvd(ends: &[End; 4]) -> [u64; 4] {
    ends.each_ref().map(|e| {
        fs::read_to_string(format!(
            "/sys/class/infiniband/{}/ports/1/hw_counters/rcvd_pkts",
            e.device
        ))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
    })
}

/// Root opens `server`'s device outside every tenant, joins `client`'s
/// cgroup and makes a UD QP there, held while the programs run.
fn foreign_qp(server: &End, client: usize) -> Result<Proc> {
    let cgroup = PathBuf::from(tenants::fill(&format!("@CGROUPS@/{}", ROLES[client].0)));
    let child = Command::new(run::attacker()?)
        .args(["--device", &server.device, "--then-cgroup"])
        .arg(&cgroup)
        .args(["--create", "1", "--hold-ms", "2000"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("starting the foreign QP's maker")?;
    Ok(Proc(child))
}

/// What the server's tenant may open: its own device, not the others';
/// and what `nobody`, outside every tenant, may not. The problems found.
fn opens(host: &Host, sc: &Scenario) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let me = sc.server;
    let in_role = Tenant {
        cgroup: Some(ROLES[me].0),
        uid: None,
    };
    let attacker = run::attacker()?;
    let open = |device: &str, as_tenant: Tenant| -> Result<(bool, String)> {
        let mut cmd = Command::new(&attacker);
        cmd.args(["--device", device]);
        as_tenant.place(&mut cmd)?;
        let out = cmd.output()?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    };
    // libibverbs tries other paths after the kernel's EPERM and reports
    // the last one's error: the node itself says what the kernel said.
    let open_node = |device: &str, as_tenant: Tenant| -> Result<String> {
        let node = uverbs_node(device)?;
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &format!("exec 3<> {}", node.display())]);
        as_tenant.place(&mut cmd)?;
        let out = cmd.output()?;
        Ok(match out.status.success() {
            true => "opened".to_string(),
            false => String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    };
    const EPERM: &str = "Operation not permitted";
    for other in (0..4).filter(|&r| r != me) {
        let device = &host.ends[other].device;
        if open(device, in_role)?.0 {
            problems.push(format!("{} opened {device} with libibverbs", NAMES[me]));
        }
        let said = open_node(device, in_role)?;
        if !said.contains(EPERM) {
            problems.push(format!("{} opening {device}'s node: {said}", NAMES[me]));
        }
        for tool in [
            vec!["ibv_devinfo", "-d", device],
            vec!["ibv_rc_pingpong", "-d", device, "-g", "1", "-n", "1"],
        ] {
            let mut cmd = Command::new(tool[0]);
            cmd.args(&tool[1..]);
            in_role.place(&mut cmd)?;
            if cmd.output()?.status.success() {
                problems.push(format!("{} ran {} on {device}", NAMES[me], tool.join(" ")));
            }
        }
    }
    let (ok, said) = open(&host.ends[me].device, in_role)?;
    if !ok {
        problems.push(format!(
            "{} could not open its own device: {}",
            NAMES[me],
            said.trim()
        ));
    }
    let nobody = Tenant {
        cgroup: None,
        uid: Some(65534),
    };
    let device = &host.ends[A].device;
    let said = open_node(device, nobody)?;
    if open(device, nobody)?.0 || !said.contains(EPERM) {
        problems.push(format!("nobody opening {device}'s node: {said}"));
    }
    Ok(problems)
}

/// `nobody`, outside every tenant, opening `node` over and over until
/// stopped, noting each open that succeeded.
struct RacingOpener {
    proc: Proc,
    log: PathBuf,
}

fn racing_opener(node: &Path, work: &Path) -> Result<RacingOpener> {
    let log = work.join("racing-opener.log");
    let mut cmd = Command::new("sh");
    cmd.args([
        "-c",
        &format!(
            "while :; do (exec 3<> {}) 2>/dev/null && echo opened; done",
            node.display()
        ),
    ])
    .stdout(fs::File::create(&log)?);
    Tenant {
        cgroup: None,
        uid: Some(65534),
    }
    .place(&mut cmd)?;
    let proc = Proc(cmd.spawn().context("starting the racing opener")?);
    // Its first tries are made before what it races starts.
    std::thread::sleep(Duration::from_millis(300));
    Ok(RacingOpener { proc, log })
}

impl RacingOpener {
    /// Stops it; how many times it opened the node.
    fn stop(self) -> Result<usize> {
        drop(self.proc);
        Ok(fs::read_to_string(&self.log)?
            .lines()
            .filter(|l| *l == "opened")
            .count())
    }
}

/// The uverbs node of RDMA device `device`.
fn uverbs_node(device: &str) -> Result<PathBuf> {
    // (Beside the uverbsN directories: abi_version.)
    for entry in fs::read_dir("/sys/class/infiniband_verbs")?.flatten() {
        let ibdev = fs::read_to_string(entry.path().join("ibdev")).unwrap_or_default();
        if ibdev.trim() == device {
            return Ok(Path::new("/dev/infiniband").join(entry.file_name()));
        }
    }
    bail!("{device} has no uverbs node")
}

/// What did not go as the rules say, if anything: the programs completed
/// or stalled; every frame the client's port stamped crossed to the
/// server's port and was judged there — passed and restored, or refused
/// and taken in by none (as a P_Key violation; the last retries of a
/// stalled client, in flight as the server exits, meet no QP) — and back,
/// and each device's rxe took in exactly the frames its port passed
/// (rdma_cm's MADs, with their connection's key, among them); no other port moved; the
/// wire carried the tenants' keys, every ICRC right; what ran beside went
/// as it must; the host's routes were as before.
fn unmet(sc: &Scenario, o: &Observed) -> Vec<&'static str> {
    let (s, c) = (sc.server, sc.client);
    let [server, client] = [o.ports[s], o.ports[c]];
    let judged = if sc.completes {
        [
            (server.stamped > 0, "the server's port stamped nothing"),
            (
                server.refused + client.refused == 0,
                "a port refused frames",
            ),
            (
                client.stamped == server.restored && server.stamped == client.restored,
                "a port restored other than the other stamped",
            ),
            (
                o.rcvd[s] == server.ok && o.rcvd[c] == client.ok,
                "an rxe took in other than its port passed",
            ),
        ]
    } else {
        [
            (client.stamped > 0, "the client's port stamped nothing"),
            (server.restored == 0, "the server's port restored frames"),
            (
                server.refused == client.stamped
                    && server.pkey_violations > 0
                    && server.pkey_violations + server.unknown_qp == server.refused,
                "the server's port refused other than the client stamped, as P_Key violations",
            ),
            (o.rcvd[s] == 0, "the server's rxe took frames in"),
        ]
    };
    let others_still = (0..4)
        .filter(|&i| i != s && i != c)
        .all(|i| o.ports[i] == Port::default() && o.rcvd[i] == 0);
    let mut checks = judged.to_vec();
    checks.extend([
        (
            o.completes() == sc.completes,
            "the programs did not end as expected",
        ),
        (others_still, "another tenant's port or device moved"),
        (o.wire_pkeys == sc.wire_pkeys(), "other P_Keys on the wire"),
        (o.bad_icrc == 0, "frames with a bad ICRC"),
        (o.beside.is_none(), "what ran beside went wrong"),
        (o.routes_kept, "the host's routes changed"),
    ]);
    checks
        .into_iter()
        .filter_map(|(met, what)| (!met).then_some(what))
        .collect()
}

fn judge(sc: &Scenario, o: &Observed) -> bool {
    unmet(sc, o).is_empty()
}

/// Prints the table; whether every scenario matched.
pub fn table(scenarios: &[Scenario], ran: &Ran) -> bool {
    println!(
        "\n {:>2}  {:<22} {:<16} {:<22} {:<13} {:<58} rule",
        "#", "scenario", "program", "server ⟵ client", "expected", "observed"
    );
    let mut matched = 0;
    for (i, (sc, o)) in scenarios.iter().zip(&ran.rows).enumerate() {
        let ok = judge(sc, o) && ran.restored;
        matched += usize::from(ok);
        let (s, c) = (o.ports[sc.server], o.ports[sc.client]);
        let observed = format!(
            "{}; stamped {}/{}, judged ok {}, refused {}",
            run::summary(o.client, o.server),
            c.stamped,
            s.stamped,
            s.ok + c.ok,
            s.refused + c.refused
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
        if let Some(b) = &o.beside {
            println!("      beside: {b}");
        }
    }
    println!(
        "\n{matched} of {} scenarios of devices of their own as the partition rules say (attach of four tenants: {:.1} s; the group: {:.0} s).",
        scenarios.len(),
        ran.attach.as_secs_f64(),
        ran.took.as_secs_f64()
    );
    matched == scenarios.len()
}

/// The scenarios' JSON objects, shaped as the pair's for what `cargo
/// xtask rxe-lab` reads (`name`, `ok`, `captures`, `wire`).
pub fn results(scenarios: &[Scenario], ran: &Ran) -> Vec<serde_json::Value> {
    scenarios
        .iter()
        .zip(&ran.rows)
        .map(|(sc, o)| {
            let per_role: BTreeMap<&str, serde_json::Value> = (0..4)
                .map(|i| {
                    let p = o.ports[i];
                    (
                        NAMES[i],
                        json!({
                            "ok": p.ok, "refused": p.refused, "pkey_violation": p.pkey_violations, "unknown_qp": p.unknown_qp,
                            "stamped": p.stamped, "restored": p.restored, "foreign_device": p.foreign,
                            "rxe_rcvd": o.rcvd[i],
                        }),
                    )
                })
                .collect();
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
                "ok": judge(sc, o) && ran.restored,
                "ports": per_role,
                "beside": o.beside,
                "routes_kept": o.routes_kept,
                "routes_restored": ran.restored,
                "attach_seconds": ran.attach.as_secs_f64(),
                "icrc": { "frames": o.frames, "bad": o.bad_icrc },
                "captures": o.captures.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
                "wire": { "pkeys": sc.wire_pkeys(), "qkeys": sc.wire_qkeys() },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    /// The lab's policy gives each role a device of its own, and the
    /// scenarios' outcomes are Table 16-2's.
    #[test]
    fn each_role_is_a_tenant_with_its_own_device_and_outcomes_follow_the_rules() {
        let text = policy(ROLES.len()).replace(&tenants::fill("@CGROUPS@"), "/sys/fs/cgroup");
        // The cgroups are the guest's: only the shape is checked here.
        let text = text.replace("cgroup = \"/sys/fs/cgroup/", "uid = 100 # ");
        let text = (0..4).fold(text, |t, i| {
            t.replacen("uid = 100 #", &format!("uid = {}0 #", i + 1), 1)
        });
        let p = Policy::parse(Path::new("own.toml"), &text).unwrap();
        assert_eq!(p.own_devices().count(), 4);
        for sc in all() {
            let (s, c) = (ROLES[sc.server].1, ROLES[sc.client].1);
            let matches = s & 0x7fff == c & 0x7fff && (s | c) & 0x8000 != 0;
            assert_eq!(matches, sc.completes, "{}", sc.name);
        }
    }
}
