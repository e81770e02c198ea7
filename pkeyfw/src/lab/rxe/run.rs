//! Running one scenario: attach, capture, server, client, and what came of
//! it. Every process it starts is stopped before it returns.
//!
//! Each end's outgoing frames are captured (after the TC egress program, so
//! stamped as they cross the veth, and before the far end's XDP judges
//! them), and every captured frame's ICRC is recomputed.

use std::{
    ffi::OsStr,
    fs,
    io::{BufRead as _, BufReader},
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use pkeyfw_common::{Capture, Reason, Stamp, abi::EventKind};
use pkeyfw_testkit::wire;
use serde_json::{Value, json};

use super::{
    scenario::{Attack, Program, Ready, Scenario},
    topology::{End, Topology},
};
use crate::{
    capture,
    loading::maps::{CaptureCounts, Maps, ReasonCounts},
    loading::pins::Pins,
    policy::Policy,
};

/// How long a client may run before it counts as stalled (soft-RoCE under
/// emulation is slow; a healthy run takes well under a second).
pub const STALL: Duration = Duration::from_secs(8);
/// How long the server may take to finish after its client.
pub const LINGER: Duration = Duration::from_secs(3);
/// How long to wait for a process to get ready (an attach under emulation
/// takes some 12 s to load and verify its programs on one machine, some 40
/// on a slower one; more while another guest shares the host's CPUs).
const READY: Duration = Duration::from_secs(180);

/// How a program ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Exit {
    Ok,
    Failed(i32),
    /// Still running at its deadline.
    Killed,
}

pub struct Observed {
    /// The scenario's policy, as read while its devices existed (a rule
    /// may name one).
    pub policy: Policy,
    pub server: Exit,
    pub client: Exit,
    /// The server end's filter counters for the whole scenario.
    pub reasons: ReasonCounts,
    /// The client end's, when it is filtered too (stamping scenarios).
    pub client_reasons: Option<ReasonCounts>,
    /// Frames the two ends' egress programs stamped, and those they left
    /// unattributed (the port's default P_Key).
    pub stamped: u64,
    pub unbound: u64,
    /// What each end's RDMA probes counted: [server, client].
    pub probes: [CaptureCounts; 2],
    /// QPs the probe bound and still binds once every program is gone
    /// (their destruction must have unbound them): both ends.
    pub leftover: u64,
    /// Whether an attachment printed a foreign-join violation.
    pub join_reported: bool,
    /// Refused frames' events the server end's kernel budget held back.
    pub suppressed: u64,
    /// Once a table's filler is gone: whether a new QP a rule binds was
    /// bound at its creation, not quarantined.
    pub rebound: Option<bool>,
    /// Whether the server's QP holds the QPN the policy's `[[qp]]` entry
    /// names, which its tenant made come next.
    pub taken: Option<bool>,
    /// The signal that ended the attacker while the programs ran, if one
    /// did (a foreign joiner under `foreign_join = "kill"`).
    pub attacker_signal: Option<i32>,
    /// Frames each end's rxe device took in (`rcvd_pkts`, counted once a
    /// frame passed rxe's header and ICRC checks), and frames each end's
    /// filter passed to it: [server, client].
    pub rxe_rcvd: [u64; 2],
    pub passed: [u64; 2],
    /// The captures, server's outgoing frames first.
    pub captures: Vec<PathBuf>,
    /// RoCE v2 frames captured, and those among them whose ICRC is wrong.
    pub frames: usize,
    pub bad_icrc: usize,
    /// What `attach`, `qps` or `policy check` got wrong of the server's rxe
    /// device (named with rdma_rxe, no device out of reach), if anything.
    pub misnamed: Option<String>,
    /// The last words of the programs and pkeyfw's output, for a scenario
    /// that did not go as expected.
    pub output: String,
}

impl Observed {
    pub fn completes(&self) -> bool {
        self.client == Exit::Ok && self.server == Exit::Ok
    }

    pub fn summary(&self) -> String {
        summary(self.client, self.server)
    }
}

/// How a client and its server ended: "completes", "client stalled,
/// server exit 1", ….
pub fn summary(client: Exit, server: Exit) -> String {
    let show = |e: Exit| match e {
        Exit::Ok => "ok".to_string(),
        Exit::Failed(c) => format!("exit {c}"),
        Exit::Killed => "stalled".to_string(),
    };
    if client == Exit::Ok && server == Exit::Ok {
        "completes".to_string()
    } else {
        format!("client {}, server {}", show(client), show(server))
    }
}

/// A child killed (if still running) and reaped on drop.
pub struct Proc(pub Child);

impl Proc {
    fn signal(&self, sig: libc::c_int) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0.id() as libc::pid_t, sig) };
    }

    /// The signal that ended it, if one did by now.
    fn signal_that_ended(&mut self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt as _;
        self.0.try_wait().ok().flatten().and_then(|s| s.signal())
    }

    /// Waits up to `limit` for it to exit.
    pub fn wait(&mut self, limit: Duration) -> Result<Exit> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.0.try_wait()? {
                return Ok(match status.code() {
                    Some(0) => Exit::Ok,
                    Some(c) => Exit::Failed(c),
                    None => Exit::Failed(-1),
                });
            }
            if Instant::now() > deadline {
                return Ok(Exit::Killed);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Stopped as Ctrl-C would, also on an early return: a killed attach
/// leaves its filter enforcing; a pinned one is detached.
impl Drop for Attach {
    fn drop(&mut self) {
        self.proc.signal(libc::SIGTERM);
        let _ = self.proc.wait(Duration::from_secs(5));
        if let Some(iface) = &self.pinned {
            let _ = Command::new(std::env::current_exe().unwrap_or_default())
                .args(["detach", iface])
                .stdout(Stdio::null())
                .status();
        }
    }
}

/// A `pkeyfw attach`, its output collected as it comes: foreground, or
/// pinned (the process exits once attached).
pub(super) struct Attach {
    proc: Proc,
    pub(super) lines: Arc<Mutex<Vec<String>>>,
    /// The interface of a pinned attachment, to detach.
    pinned: Option<String>,
}

impl Attach {
    pub(super) fn start(iface: &str, policy: &Path, pinned: bool) -> Result<Attach> {
        let mut child = Command::new(std::env::current_exe()?)
            .args([
                "attach",
                iface,
                "--mode",
                "native",
                "--log-rate",
                "0",
                "--policy",
            ])
            .arg(policy)
            .args(pinned.then_some("--pin"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting pkeyfw attach")?;
        let out = child.stdout.take().expect("piped");
        let err = child.stderr.take().expect("piped");
        let attach = Attach {
            proc: Proc(child),
            lines: Arc::default(),
            pinned: pinned.then(|| iface.to_string()),
        };
        // Its warnings and errors among its lines, as a journal has them.
        let follow = |from: Box<dyn std::io::Read + Send>| {
            let lines = attach.lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(from).lines().map_while(Result::ok) {
                    lines.lock().expect("not poisoned").push(line);
                }
            });
        };
        follow(Box::new(out));
        follow(Box::new(err));
        attach.wait_for(|l| l.contains("attached to"), READY)?;
        Ok(attach)
    }

    /// Stops it as Ctrl-C would: it detaches and removes its pins.
    pub(super) fn stop(self) {
        drop(self);
    }

    /// SIGKILLs it, as a crash would (its filter enforces on), and starts
    /// the attach that replaces it; the old one's output comes first.
    fn replaced(self, iface: &str, policy: &Path) -> Result<Attach> {
        self.proc.signal(libc::SIGKILL);
        let old = std::mem::take(&mut *self.lines.lock().expect("not poisoned"));
        drop(self);
        let new = Attach::start(iface, policy, false)?;
        new.lines.lock().expect("not poisoned").splice(0..0, old);
        Ok(new)
    }

    /// Waits for a line of its output that `want` accepts.
    fn wait_for(&self, want: impl Fn(&str) -> bool, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if self
                .lines
                .lock()
                .expect("not poisoned")
                .iter()
                .any(|l| want(l))
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "pkeyfw attach did not say what was expected; it said:\n{}",
                    self.lines.lock().expect("not poisoned").join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Runs one scenario.
pub fn scenario(
    topo: &Topology,
    sc: &Scenario,
    work: &Path,
    capture_dir: Option<&Path>,
) -> Result<Observed> {
    let (server_end, client_end) = (topo.server(), topo.client());
    let policy = work.join(format!("{}.toml", sc.name));
    // The QPN a tenant is to take, some way ahead of the device's next.
    let entry = match sc.attack {
        Some(Attack::TakeQpn) => Some(next_qpn(server_end)? + TAKE_AHEAD),
        _ => None,
    };
    fs::write(&policy, sc.policy_text(entry))?;
    let rules = sc.policy();
    let mut attach = Attach::start(&server_end.iface, &policy, sc.pinned)?;
    // Stamping needs the sender's end too: its egress stamps, its XDP
    // restores the replies.
    let mut client_attach = rules
        .stamp
        .then(|| Attach::start(&client_end.iface, &policy, sc.pinned))
        .transpose()?;
    if sc.pinned {
        // Nothing of pkeyfw runs but the kernel's programs.
        attach.wait_for(|l| l.contains("pinned under"), READY)?;
    }
    let capturing = Captures::start(capture_dir, sc.name, server_end, client_end)?;
    let rcvd_before = [server_end, client_end].map(rxe_rcvd);
    let mut starvers = Vec::new();
    let attacker = sc
        .attack
        .map(|a| attack(a, server_end, client_end, entry, &mut starvers))
        .transpose()?
        .flatten();

    let logs = capture_dir.unwrap_or(work);
    let log = |role: &str| fs::File::create(logs.join(format!("{}.{role}.log", sc.name)));
    let program = sc.program;
    let (server_comm, client_comm) = sc.comms();
    // Names that are not UTF-8, for the rebinding attack.
    let (server_comm, client_comm): (&OsStr, &OsStr) = match sc.attack {
        Some(Attack::Rebind) => (
            OsStr::from_bytes(UNREADABLE_SERVER),
            OsStr::from_bytes(UNREADABLE_CLIENT),
        ),
        _ => (server_comm.as_ref(), client_comm.as_ref()),
    };
    let [server_tenant, client_tenant] = sc.tenants;
    // No waiting for pkeyfw to bind the server's QP: the probe binds it as
    // it is created, before any peer can learn its number.
    let mut server = Command::new(named(program.name(), server_comm, work)?);
    server_tenant.place(&mut server)?;
    let mut server = Proc(
        server
            .args(program.server(server_end))
            .stdout(log("server")?)
            .stderr(log("server.err")?)
            .spawn()
            .with_context(|| format!("starting {}", program.name()))?,
    );
    wait_ready(program)?;
    // The QPN the server's QP got is the one its tenant took.
    let taken = entry
        .map(|qpn| Ok::<_, anyhow::Error>(ud_qpn(server_end, server.0.id())? == qpn))
        .transpose()?;
    match sc.attack {
        Some(Attack::ForeignQkey(qkey)) => {
            foreign_qkey(server_end, client_end, server.0.id(), qkey)?
        }
        Some(Attack::Restart) => {
            attach = attach.replaced(&server_end.iface, &policy)?;
            client_attach = client_attach
                .map(|a| a.replaced(&client_end.iface, &policy))
                .transpose()?;
        }
        Some(Attack::Rebind) => {
            let grown = work.join(format!("{}.grown.toml", sc.name));
            fs::write(&grown, sc.grown_policy_text())?;
            for end in [server_end]
                .into_iter()
                .chain(client_attach.as_ref().map(|_| client_end))
            {
                reload(&end.iface, &grown)?;
            }
            attach = attach.replaced(&server_end.iface, &grown)?;
            client_attach = client_attach
                .map(|a| a.replaced(&client_end.iface, &grown))
                .transpose()?;
        }
        _ => {}
    }
    let mut client = Command::new(named(program.name(), client_comm, work)?);
    client_tenant.place(&mut client)?;
    let mut client = Proc(
        client
            .args(program.client(client_end, server_end))
            .stdout(log("client")?)
            .stderr(log("client.err")?)
            .spawn()
            .with_context(|| format!("starting {}", program.name()))?,
    );
    let client_exit = client.wait(program.stall())?;
    let server_exit = server.wait(if client_exit == Exit::Killed {
        Duration::ZERO
    } else {
        LINGER
    })?;
    let attacker_signal = attacker.and_then(|mut a| a.signal_that_ended());
    drop((client, server, starvers));
    let rebound = match sc.attack {
        Some(Attack::Fill(_)) => Some(rebinds(server_end)?),
        _ => None,
    };
    let captures = capturing.finish();
    let rcvd_after = [server_end, client_end].map(rxe_rcvd);
    // Every program is gone: the probe must have unbound every QP it bound.
    std::thread::sleep(Duration::from_millis(100));
    let leftover = [Some(server_end), client_attach.as_ref().map(|_| client_end)]
        .into_iter()
        .flatten()
        .map(|end| {
            let maps = Maps::from_pins(&Pins::of(&end.iface).dir)?;
            Ok(maps.bound_by()?[2].1)
        })
        .sum::<Result<u64>>()?;
    let counted = |end: &End| -> Result<(ReasonCounts, [u64; 2], CaptureCounts)> {
        let maps = Maps::from_pins(&Pins::of(&end.iface).dir)?;
        let stamps = maps.stamps()?;
        Ok((
            maps.reasons()?,
            [Stamp::Stamped, Stamp::Unbound].map(|s| stamps[s.index() as usize]),
            maps.captures()?,
        ))
    };
    let (reasons, [mut stamped, mut unbound], server_probes) = counted(server_end)?;
    let suppressed = Maps::from_pins(&Pins::of(&server_end.iface).dir)?.suppressed()?
        [EventKind::Frame.index() as usize];
    let mut probes = [server_probes, CaptureCounts::default()];
    let client_reasons = match &client_attach {
        Some(_) => {
            let (r, [s, u], p) = counted(client_end)?;
            stamped += s;
            unbound += u;
            probes[1] = p;
            Some(r)
        }
        None => None,
    };
    let mut attach_lines = attach.lines.lock().expect("not poisoned").clone();
    attach.stop();
    if let Some(a) = client_attach {
        attach_lines.push("pkeyfw attach (client's end):".to_string());
        attach_lines.extend(a.lines.lock().expect("not poisoned").iter().cloned());
        a.stop();
    }
    let misnamed = misnamed(server_end, &policy, &attach_lines)?;
    let (frames, bad_icrc) = icrc_check(&captures)?;
    let passed = |r: Option<&ReasonCounts>| {
        r.map_or(0, |r| {
            Reason::ALL
                .into_iter()
                .filter(|&x| x != Reason::NotRoce)
                .map(|x| r.passed_by(x))
                .sum()
        })
    };
    let tail = |role: &str| {
        let text =
            fs::read_to_string(logs.join(format!("{}.{role}.log", sc.name))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(4)..].join("\n")
    };
    let settle = |exit: Exit, role: &str| match exit {
        Exit::Failed(code) if program.transferred(code, &tail(&format!("{role}.err"))) => Exit::Ok,
        other => other,
    };
    Ok(Observed {
        policy: rules,
        server: settle(server_exit, "server"),
        client: settle(client_exit, "client"),
        reasons,
        client_reasons,
        stamped,
        unbound,
        probes,
        rebound,
        taken,
        attacker_signal,
        join_reported: attach_lines
            .iter()
            .any(|l| l.contains("violation foreign_join")),
        suppressed,
        leftover,
        rxe_rcvd: [0, 1].map(|i| rcvd_after[i].saturating_sub(rcvd_before[i])),
        passed: [passed(Some(&reasons)), passed(client_reasons.as_ref())],
        captures,
        frames,
        bad_icrc,
        output: format!(
            "client: {}\nclient stderr: {}\nserver: {}\nserver stderr: {}\nserver probes: {:?}, frame events held back: {suppressed}\n{}pkeyfw attach:\n{}",
            tail("client"),
            tail("client.err"),
            tail("server"),
            tail("server.err"),
            probes[0],
            misnamed
                .as_deref()
                .map_or(String::new(), |m| format!("{m}\n")),
            attach_lines.join("\n")
        ),
        misnamed,
    })
}

/// What pkeyfw got wrong of `end`'s rxe device, if anything: `attach`
/// (its output, `lines`), `qps` and `policy check --iface` must each name
/// it with rdma_rxe, and none may warn of a device out of the filter's
/// reach.
fn misnamed(end: &End, policy: &Path, lines: &[String]) -> Result<Option<String>> {
    let named = format!("RDMA devices on {}: {} (rdma_rxe)", end.iface, end.device);
    let unreached = |w: &str| w.contains("enforces nothing") || w.contains("no driver");
    if !lines.iter().any(|l| l.ends_with(&named)) || lines.iter().any(|l| unreached(l)) {
        return Ok(Some(format!("attach did not say only {named:?}")));
    }
    let policy = policy.to_str().context("a policy path that is not UTF-8")?;
    let qps = ["qps", &end.iface, "--json"];
    let check = [
        "policy", "check", "--policy", policy, "--iface", &end.iface, "--json",
    ];
    let rxe = json!([{"name": end.device, "driver": "rdma_rxe", "in_reach": true}]);
    for (args, devices) in [(&qps[..], "devices"), (&check[..], "rdma_devices")] {
        let out = Command::new(std::env::current_exe()?).args(args).output()?;
        let said = String::from_utf8_lossy(&out.stdout);
        let Ok(v) = serde_json::from_str::<Value>(&said) else {
            return Ok(Some(format!(
                "pkeyfw {}: {}: {said}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )));
        };
        let seen: Vec<Value> = v[devices]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| json!({"name": d["name"], "driver": d["driver"], "in_reach": d["in_reach"]}))
            .collect();
        let warned = v["warnings"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|w| w.as_str().is_some_and(unreached));
        if json!(seen) != rxe || warned {
            return Ok(Some(format!("pkeyfw {}: {said}", args.join(" "))));
        }
    }
    Ok(None)
}

/// Datagrams a foreign Q_Key's sender sends. Their ICRC covers an IP
/// header the kernel writes after them, so they count as bad ICRCs.
pub const FOREIGN_DATAGRAMS: usize = 3;

/// Sends the server's UD QP (of process `pid`) datagrams with Q_Key `qkey`
/// from a UDP socket on the client's end (policy routing takes them over
/// the veth).
fn foreign_qkey(server: &End, client: &End, pid: u32, qkey: u32) -> Result<()> {
    let frame = wire::Packet::ud(0xffff, ud_qpn(server, pid)?, qkey);
    let bytes = frame.bytes();
    let socket = std::net::UdpSocket::bind((client.addr, 0))?;
    for _ in 0..FOREIGN_DATAGRAMS {
        socket.send_to(&bytes[frame.bth_at()..], (server.addr, 4791))?;
    }
    Ok(())
}

/// The number of the UD QP process `pid` holds on `end`'s rxe device.
pub fn ud_qpn(end: &End, pid: u32) -> Result<u32> {
    use crate::host::{netlink, rdma};
    let devices = rdma::devices_on(netlink::if_index(&end.iface)?)?;
    rdma::qps_of(&devices)?
        .into_iter()
        .find(|q| q.pid == Some(pid) && q.qp_type == rdma::IbQpType::Ud)
        .map(|q| q.qpn)
        .with_context(|| format!("process {pid} has no UD QP on {}", end.device))
}

/// How far ahead of a device's next QPN the QPN a tenant takes lies.
const TAKE_AHEAD: u32 = 8;

/// The QPN `end`'s device hands out next.
fn next_qpn(end: &End) -> Result<u32> {
    let out = as_nobody()?
        .args(["--device", &end.device, "--next-qpn"])
        .output()?;
    let said = String::from_utf8_lossy(&out.stdout);
    said.trim()
        .strip_prefix("0x")
        .and_then(|hex| u32::from_str_radix(hex, 16).ok())
        .filter(|_| out.status.success())
        .with_context(|| {
            format!(
                "{ATTACKER} --next-qpn said {said:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// Starts `attack` as an unprivileged user (nobody): its QPs bound to
/// another partition (D's) or to none; it runs until dropped. (A foreign
/// Q_Key is sent from here; a QPN is taken, the `entry`'s, before this
/// returns.)
fn attack(
    attack: Attack,
    server: &End,
    client: &End,
    entry: Option<u32>,
    starvers: &mut Vec<Proc>,
) -> Result<Option<Proc>> {
    let mut cmd = as_nobody()?;
    if let Attack::Squat | Attack::TakeQpn | Attack::Join { .. } = attack {
        // In the cgroup a rule binds to another partition.
        super::scenario::SQUATTER.place(&mut cmd)?;
    }
    // How long until its QPs exist and its verbs are called (the squatter
    // waits a second for a rule to bind its QPs first).
    let ready = match attack {
        Attack::ModifyFlood => {
            cmd.args(["--device", &client.device, "--gid-index"])
                .arg(client.gid_index.to_string())
                .args(["--flood", &u64::MAX.to_string(), "--peer"])
                .arg(server.addr.to_string());
            500
        }
        Attack::Join { own, foreign } => {
            cmd.args(["--device", &server.device, "--join"])
                .arg(own.to_string())
                .arg("--join")
                .arg(foreign.to_string())
                .args(["--hold-ms", "600000"]);
            // Joined under a flood of junk on the joining CPU: the refused
            // frames spend their own budget, not the join's. The flood
            // lasts until the join is counted (however long the attacker
            // takes to start under emulation), and 3 s at least.
            let flood = JunkFlood::start(client, server)?;
            on_cpu_0(&mut cmd);
            let child = spawned(cmd)?;
            counted(
                server,
                &[(Capture::Joined, 1), (Capture::ForeignJoin, 1)],
                SETTLED,
            );
            flood.stop_after(Duration::from_secs(3));
            return Ok(Some(child));
        }
        Attack::Squat => {
            cmd.args(["--device", &client.device, "--gid-index"])
                .arg(client.gid_index.to_string())
                .args(["--squat", "4", "--squat-device", &server.device, "--peer"])
                .arg(server.addr.to_string())
                .args(["--hold-ms", "600000"]);
            2500
        }
        Attack::Fill(n) => {
            cmd.args(["--device", &server.device, "--create"])
                .arg(n.to_string())
                .args(["--hold-ms", "600000"]);
            // The table is full once the probe has bound every QP of the
            // filler's (however long it takes under emulation).
            let child = spawned(cmd)?;
            counted(server, &[(Capture::Bound, u64::from(n))], SETTLED);
            return Ok(Some(child));
        }
        Attack::TakeQpn => {
            let qpn = entry.context("no QPN to take")?;
            let out = cmd
                .args(["--device", &server.device, "--advance-to"])
                .arg(qpn.to_string())
                .output()?;
            if !out.status.success() {
                bail!(
                    "taking QPN {qpn:#x}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            return Ok(None);
        }
        Attack::Starve(n) => {
            // The others, each a process of its own.
            for _ in 1..n {
                starvers.push(Proc(starving(server)?.spawn()?));
            }
            cmd = starving(server)?;
            1500
        }
        Attack::ForeignQkey(_) | Attack::Restart | Attack::Rebind => return Ok(None),
    };
    let child = spawned(cmd)?;
    std::thread::sleep(Duration::from_millis(ready));
    Ok(Some(child))
}

/// The attacker `cmd` started, its output discarded.
fn spawned(mut cmd: Command) -> Result<Proc> {
    let child = cmd
        .stdout(Stdio::null())
        .spawn()
        .context("starting the attacker as nobody")?;
    Ok(Proc(child))
}

/// A process of [`Attack::Starve`]: modifies to RTR on `end`'s device, in a
/// loop, naming a peer whose ARP never resolves.
fn starving(end: &End) -> Result<Command> {
    let mut cmd = as_nobody()?;
    cmd.args(["--device", &end.device, "--gid-index"])
        .arg(end.gid_index.to_string())
        .args(["--flood", &u64::MAX.to_string(), "--peer"])
        .arg(super::scenario::UNANSWERED.to_string())
        .stdout(Stdio::null());
    Ok(cmd)
}

/// Malformed frames sent to port 4791 of `to` from `from`, 3,000 a second,
/// from CPU 0, where XDP judges them (veth runs its XDP on the sender's
/// CPU): far past the refused frames' event budget. They stop when this is
/// stopped or dropped.
struct JunkFlood {
    started: Instant,
    stop: Arc<AtomicBool>,
}

impl JunkFlood {
    fn start(from: &End, to: &End) -> Result<Self> {
        let socket = std::net::UdpSocket::bind((from.addr, 0))?;
        let to = std::net::SocketAddr::from((to.addr, 4791));
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            pin_to_cpu_0();
            while !stopped.load(Ordering::Relaxed) {
                for _ in 0..30 {
                    let _ = socket.send_to(&[0; 4], to);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Ok(Self {
            started: Instant::now(),
            stop,
        })
    }

    /// Stops it once it has lasted `at_least`.
    fn stop_after(self, at_least: Duration) {
        std::thread::sleep(at_least.saturating_sub(self.started.elapsed()));
    }
}

impl Drop for JunkFlood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// How long an attacker may take to make its QPs or join its groups under
/// emulation.
const SETTLED: Duration = Duration::from_secs(30);

/// Waits until `end`'s probes have counted at least as many of each kind as
/// `want` says, or `within` has passed (the scenario then fails on the
/// counts, which it prints).
fn counted(end: &End, want: &[(Capture, u64)], within: Duration) {
    let start = Instant::now();
    while start.elapsed() < within {
        let counts = Maps::from_pins(&Pins::of(&end.iface).dir).and_then(|m| m.captures());
        if counts.is_ok_and(|c| want.iter().all(|&(x, n)| c[x.index() as usize] >= n)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `cmd` on CPU 0.
fn on_cpu_0(cmd: &mut Command) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: sched_setaffinity is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            pin_to_cpu_0();
            Ok(())
        })
    };
}

fn pin_to_cpu_0() {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Whether a QP a rule binds (the attacker's), created on `end`'s device
/// once the table's filler is gone, is bound at its creation and not
/// quarantined.
fn rebinds(end: &End) -> Result<bool> {
    let counts = || -> Result<[u64; 2]> {
        let c = Maps::from_pins(&Pins::of(&end.iface).dir)?.captures()?;
        Ok([Capture::Bound, Capture::Quarantined].map(|x| c[x.index() as usize]))
    };
    let before = counts()?;
    let made = as_nobody()?
        .args(["--device", &end.device, "--create", "1"])
        .stdout(Stdio::null())
        .status()?
        .success();
    let after = counts()?;
    Ok(made && after[0] > before[0] && after[1] == before[1])
}

/// The attacker, to run as nobody with no groups. setpriv drops the
/// privileges once the command is started, so that what the lab does
/// before the exec (moving it into a cgroup, which nobody may not) is
/// still done as root.
pub(super) fn as_nobody() -> Result<Command> {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(attacker()?);
    Ok(cmd)
}

/// The local tenant's ibverbs moves: test equipment (pkeyfw-testkit), not
/// part of pkeyfw, which the guest carries beside it.
pub const ATTACKER: &str = "pkeyfw-lab-verbs";

/// The attacker beside this pkeyfw (where nobody, running it, reaches it
/// too).
pub fn attacker() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe.with_file_name(ATTACKER);
    if !path.is_file() {
        bail!(
            "{} is not there: the attack scenarios run the test kit's attacker beside pkeyfw (cargo build --release -p pkeyfw-testkit --bin {ATTACKER})",
            path.display()
        );
    }
    Ok(path)
}

/// A path that runs `program` under the command name `comm`: a link named
/// so in `work` (the kernel names a task after the file it executes).
fn named(program: &str, comm: &OsStr, work: &Path) -> Result<PathBuf> {
    if program == comm {
        return Ok(PathBuf::from(program));
    }
    let target = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .with_context(|| format!("{program} is not on PATH"))?;
    let link = work.join(comm);
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(&target, &link)
        .with_context(|| format!("linking {} to {}", link.display(), target.display()))?;
    Ok(link)
}

/// The command names [`Attack::Rebind`] runs the programs under: bytes that
/// are not UTF-8.
const UNREADABLE_SERVER: &[u8] = b"\xff\xfeserver";
const UNREADABLE_CLIENT: &[u8] = b"\xff\xfeclient";

/// `pkeyfw reload IFACE --policy POLICY`, as an operator would run it.
pub(super) fn reload(iface: &str, policy: &Path) -> Result<()> {
    let out = Command::new(std::env::current_exe()?)
        .args(["reload", iface, "--policy"])
        .arg(policy)
        .output()
        .context("running pkeyfw reload")?;
    if !out.status.success() {
        bail!(
            "pkeyfw reload {iface} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The frames `end`'s rxe device has taken in so far.
fn rxe_rcvd(end: &End) -> u64 {
    let path = format!(
        "/sys/class/infiniband/{}/ports/1/hw_counters/rcvd_pkts",
        end.device
    );
    fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// RoCE v2 frames in the captures, and how many carry a wrong ICRC.
pub fn icrc_check(captures: &[PathBuf]) -> Result<(usize, usize)> {
    let (mut frames, mut bad) = (0, 0);
    for path in captures {
        for f in capture::read(path)? {
            match wire::icrc_holds(&f.data) {
                Some(true) => frames += 1,
                Some(false) => (frames, bad) = (frames + 1, bad + 1),
                None => {}
            }
        }
    }
    Ok((frames, bad))
}

/// Captures the RoCE frames `iface` (of namespace `netns`, if given) sends,
/// takes in or both (`direction`: "out", "in", "inout"), whole, until
/// stopped.
pub fn tcpdump(netns: Option<&str>, iface: &str, direction: &str, path: &Path) -> Result<Proc> {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "tcpdump"]);
            c
        }
        None => Command::new("tcpdump"),
    };
    // A snap length of its own: on an interface with offloads (a veth)
    // libpcap sizes every ring slot to the default 256 KiB, and the ring
    // then holds 32 frames, too few for a program's burst under emulation.
    let mut child = cmd
        .args([
            "-Z",
            "root",
            "-U",
            "--immediate-mode",
            "-B",
            "8192",
            "-s",
            "8192",
            "-Q",
            direction,
        ])
        .args(["-i", iface, "-w"])
        .arg(path)
        // RoCE v2, and RoCE v1 (which only a forger sends here).
        .args(["udp", "port", "4791", "or", "ether", "proto", "0x8915"])
        .stderr(Stdio::piped())
        .spawn()
        .context("starting tcpdump")?;
    let mut err = BufReader::new(child.stderr.take().expect("piped"));
    let proc = Proc(child);
    let mut line = String::new();
    err.read_line(&mut line)?;
    if !line.contains("listening on") {
        bail!("tcpdump did not start: {}", line.trim());
    }
    Ok(proc)
}

/// Both ends' outgoing frames, as a scenario runs (none without a
/// directory to write them to).
pub struct Captures {
    /// The server's first.
    paths: Vec<PathBuf>,
    tcpdumps: Vec<Proc>,
}

impl Captures {
    /// Starts capturing scenario `name`'s frames into `dir`.
    pub fn start(dir: Option<&Path>, name: &str, server: &End, client: &End) -> Result<Captures> {
        let paths: Vec<PathBuf> = dir.map_or_else(Vec::new, |dir| {
            ["server", "client"]
                .map(|role| dir.join(format!("{name}.{role}.pcap")))
                .to_vec()
        });
        let tcpdumps = paths
            .iter()
            .zip([server, client])
            .map(|(path, end)| tcpdump(None, &end.iface, "out", path))
            .collect::<Result<Vec<_>>>()?;
        Ok(Captures { paths, tcpdumps })
    }

    /// Stops capturing once what was captured is written: the files.
    pub fn finish(self) -> Vec<PathBuf> {
        drain_captures(&self.paths);
        for t in self.tcpdumps {
            stop(t);
        }
        self.paths
    }
}

/// Waits (a few seconds at most) until the captures stop growing: under
/// emulation tcpdump lags behind its ring, and a stopped one writes only
/// what it has read.
pub fn drain_captures(captures: &[PathBuf]) {
    let size = || {
        captures
            .iter()
            .map(|p| fs::metadata(p).map_or(0, |m| m.len()))
            .sum::<u64>()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = size();
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        let now = size();
        if now == last {
            return;
        }
        last = now;
    }
}

/// Stops a capture so that it writes out what it holds.
pub fn stop(mut t: Proc) {
    t.signal(libc::SIGINT);
    let _ = t.wait(Duration::from_secs(2));
}

/// Waits until `program`'s server is ready for its client.
pub fn wait_ready(program: Program) -> Result<()> {
    match program.ready() {
        Ready::Tcp(port) => wait_listening(port),
        Ready::Millis(ms) => {
            std::thread::sleep(Duration::from_millis(ms));
            Ok(())
        }
    }
}

/// Waits until something listens on TCP `port`.
fn wait_listening(port: u16) -> Result<()> {
    let want = format!(":{port:04X} ");
    let deadline = Instant::now() + READY;
    while Instant::now() < deadline {
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let text = fs::read_to_string(table).unwrap_or_default();
            // sl, local address, remote address, state (0A: LISTEN).
            if text.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && format!("{} ", f[1]).ends_with(&want) && f[3] == "0A"
            }) {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    bail!(
        "nothing listened on TCP port {port} within {} s",
        READY.as_secs()
    )
}

/// Runs this very binary with `args`; its output.
pub fn pkeyfw(args: &[&str]) -> Result<String> {
    let out = Command::new(std::env::current_exe()?)
        .args(args)
        .output()
        .context("running pkeyfw")?;
    if !out.status.success() {
        bail!(
            "`pkeyfw {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The last lines of scenario `name`'s log of `role` (`client`,
/// `server.err`, ...) in `dir`, for one that did not go as expected.
pub fn tail(dir: &Path, name: &str, role: &str) -> String {
    let text = fs::read_to_string(dir.join(format!("{name}.{role}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(4)..].join("\n")
}

/// A capture's RoCE frames.
pub fn roce_frames(capture: &Path) -> Result<Vec<pkeyfw_common::parse::Roce>> {
    Ok(capture::read(capture)?
        .iter()
        .filter_map(|f| pkeyfw_common::parse::classify(&f.data[..]).roce())
        .collect())
}

/// Starts `cmd` as scenario `name`'s `role` (`server`, `client`), its
/// output and errors logged in `dir` (`NAME.ROLE.log`, `NAME.ROLE.err.log`).
pub fn start(cmd: &mut Command, dir: &Path, name: &str, role: &str) -> Result<Proc> {
    let log = |what: &str| fs::File::create(dir.join(format!("{name}.{what}.log")));
    let child = cmd
        .stdout(log(role)?)
        .stderr(log(&format!("{role}.err"))?)
        .spawn()
        .with_context(|| format!("starting the {role}"))?;
    Ok(Proc(child))
}

/// How a client and its server end: the client within [`STALL`], then the
/// server within [`LINGER`] (at once where the client stalled); both are
/// gone when it returns.
pub fn finish(mut client: Proc, mut server: Proc) -> Result<(Exit, Exit)> {
    let client_exit = client.wait(STALL)?;
    let server_exit = server.wait(if client_exit == Exit::Killed {
        Duration::ZERO
    } else {
        LINGER
    })?;
    Ok((client_exit, server_exit))
}
