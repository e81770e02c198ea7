//! The soft-RoCE scenarios: unmodified ibverbs and rdma_cm programs, a
//! policy that binds (or does not bind) their QPs, and what the partition
//! rules say must happen. The receiving end (the server) is filtered; in a
//! stamping scenario both ends are, each stamping what it sends.

use std::{net::Ipv4Addr, path::Path};

use pkeyfw_common::Reason;

use super::{
    tenants::{self, Tenant},
    topology::End,
};
use crate::policy::Policy;

/// A client/server program pair.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Program {
    UdPingpong,
    RcPingpong,
    SendBw,
    Rping,
    Udaddy,
    /// The kernel's NVMe over Fabrics: nvmet-rdma exporting a null block
    /// device on the server's address, port 4420, and nvme-rdma connecting
    /// to it and reading it (shell scripts over configfs and
    /// /dev/nvme-fabrics: the QPs are the kernel's, rdma_cm's).
    NvmeOf,
    /// perftest's clients one after another ([`PERFTEST`]), each run
    /// through a link that names it for its role (`-l` the server's, `-f`
    /// the client's), all on CPU 0: every QP is made on one CPU, after
    /// others whose makers had longer names.
    Perftest,
}

/// The perftest runs of [`Program::Perftest`], in order: bandwidth and
/// latency over RC, UC and UD, with WRITE, READ, atomics and SEND. Each
/// name, with its role's suffix, fits the kernel's 15 bytes of `comm`;
/// ib_atomic_bw's comes before the shorter ib_send_bw's on purpose.
pub const PERFTEST: &[(&str, &str)] = &[
    ("ib_write_bw", "-n 100"),
    ("ib_read_bw", "-n 100"),
    ("ib_atomic_bw", "-n 100"),
    ("ib_send_bw", "-n 100"),
    ("ib_send_bw", "-n 100 -c UD"),
    ("ib_write_bw", "-n 100 -c UC"),
    ("ib_send_bw", "-n 100 -c UC"),
    ("ib_write_lat", "-n 100"),
    ("ib_read_lat", "-n 100"),
    ("ib_atomic_lat", "-n 100"),
    ("ib_send_lat", "-n 100"),
    ("ib_send_lat", "-n 100 -c UD"),
];

/// The TCP port perftest's first run exchanges QPNs on; each later run
/// takes the next, so that a client never meets the last run's server.
const PERFTEST_PORT: u16 = 18515;
/// How long one perftest run may take under emulation (a healthy one takes
/// a few seconds).
const PERFTEST_STEP: u64 = 30;

/// The NVMe over Fabrics subsystem the lab exports.
const NQN: &str = "pkeyfw-lab";

/// When a server is ready for its client.
pub enum Ready {
    /// Listening on this TCP port (its QP exists by then, or is made per
    /// connection).
    Tcp(u16),
    /// rdma_cm listeners leave no TCP trace: give them this long.
    Millis(u64),
}

impl Program {
    /// The file the lab runs (for the kernel's NVMe over Fabrics and
    /// perftest's suite, a shell script).
    pub fn name(self) -> &'static str {
        match self {
            Program::UdPingpong => "ibv_ud_pingpong",
            Program::RcPingpong => "ibv_rc_pingpong",
            Program::SendBw => "ib_send_bw",
            Program::Rping => "rping",
            Program::Udaddy => "udaddy",
            Program::NvmeOf | Program::Perftest => "sh",
        }
    }

    /// How the lab's table names it.
    pub fn label(self) -> &'static str {
        match self {
            Program::NvmeOf => "nvme-rdma",
            Program::Perftest => "perftest",
            other => other.name(),
        }
    }

    /// Arguments of the server on `end`.
    pub fn server(self, end: &End) -> Vec<String> {
        let (dev, gid, me) = (&end.device, end.gid_index.to_string(), end.addr.to_string());
        match self {
            Program::UdPingpong | Program::RcPingpong => {
                strings(&["-d", dev, "-g", &gid, "-n", "50"])
            }
            Program::SendBw => strings(&["-d", dev, "-x", &gid, "-n", "200"]),
            Program::Rping => strings(&["-s", "-a", &me, "-C", "10"]),
            // Its default message count: its QP is bound as it is created.
            Program::Udaddy => strings(&["-b", &me]),
            Program::NvmeOf => strings(&["-ec", &nvmet_script(&me, dev)]),
            Program::Perftest => strings(&["-ec", &perftest_script(dev, &gid, None)]),
        }
    }

    /// Arguments of the client on `end`, talking to `server`.
    pub fn client(self, end: &End, server: &End) -> Vec<String> {
        let mut a = self.server(end);
        let (me, peer) = (end.addr.to_string(), server.addr.to_string());
        let gid = end.gid_index.to_string();
        match self {
            Program::UdPingpong | Program::RcPingpong | Program::SendBw => a.push(peer),
            Program::Rping => a = strings(&["-c", "-I", &me, "-a", &peer, "-C", "10"]),
            Program::Udaddy => a = strings(&["-b", &me, "-s", &peer]),
            Program::NvmeOf => a = strings(&["-ec", &nvme_script(&me, &peer)]),
            Program::Perftest => {
                a = strings(&["-ec", &perftest_script(&end.device, &gid, Some(&peer))]);
            }
        }
        a
    }

    pub fn ready(self) -> Ready {
        match self {
            Program::UdPingpong | Program::RcPingpong | Program::SendBw => Ready::Tcp(18515),
            Program::Perftest => Ready::Tcp(PERFTEST_PORT),
            Program::Rping | Program::Udaddy => Ready::Millis(500),
            // Modules loaded, configfs written.
            Program::NvmeOf => Ready::Millis(3000),
        }
    }

    /// Whether a run that exited with `code` and printed `stderr` moved all
    /// its data. perftest fails only its report when it cannot calibrate
    /// the CPU clock (as under emulation, "Correlation coefficient r^2 <
    /// 0.9"), which it computes after the last completion: a transfer that
    /// failed never gets there.
    pub fn transferred(self, code: i32, stderr: &str) -> bool {
        code == 0 || (self == Program::SendBw && code == 1 && stderr.contains(NO_REPORT))
    }

    /// How long a client may run before it counts as stalled.
    pub fn stall(self) -> std::time::Duration {
        match self {
            Program::Perftest => {
                std::time::Duration::from_secs(PERFTEST_STEP * PERFTEST.len() as u64)
            }
            _ => super::run::STALL,
        }
    }

    /// Whether the server's QP exists before any frame can reach it (so the
    /// lab can wait until it is bound).
    pub fn qp_before_exchange(self) -> bool {
        matches!(self, Program::UdPingpong | Program::RcPingpong)
    }
}

/// What perftest prints when it cannot calibrate the CPU clock, once every
/// transfer is done (see [`Program::transferred`]).
const NO_REPORT: &str = "Can't produce a report";

/// The runs of [`PERFTEST`] on `device` (RoCE v2 GID `gid`): the servers
/// (`peer` None), or the clients of the servers at `peer`, each waiting for
/// its server to listen. Each run through a link named for its role, on
/// CPU 0, within [`PERFTEST_STEP`]; a run that fails (but for the report
/// emulation spoils) fails the script, naming it.
fn perftest_script(device: &str, gid: &str, peer: Option<&str>) -> String {
    let (role, peer) = match peer {
        Some(p) => ("f", p),
        None => ("l", ""),
    };
    let runs: String = PERFTEST
        .iter()
        .map(|(tool, args)| format!("run {tool} {args}\n"))
        .collect();
    format!(
        "d=$(mktemp -d); trap 'rm -rf \"$d\"' EXIT
port={PERFTEST_PORT}
run() {{
    tool=$1; shift
    ln -sf \"$(command -v $tool)\" \"$d/$tool-{role}\"
    if [ -n '{peer}' ]; then
        i=0; until ss -Hltn \"sport = :$port\" | grep -q .; do
            i=$((i + 1)); [ $i -lt 300 ] || {{ echo \"$tool $*: no server\" >&2; exit 1; }}; sleep 0.1
        done
    fi
    if ! timeout {PERFTEST_STEP} taskset -c 0 \"$d/$tool-{role}\" -d {device} -x {gid} -p $port \"$@\" {peer} > \"$d/out\" 2> \"$d/err\" &&
        ! grep -q \"{NO_REPORT}\" \"$d/err\"; then
        echo \"$tool $* failed:\" >&2; tail -3 \"$d/err\" >&2; exit 1
    fi
    echo \"$tool $*: done\"
    port=$((port + 1))
}}
{runs}"
    )
}

/// The target: a null block device exported over RDMA at `addr`:4420 on
/// `device`, until an initiator has come (within a minute) and gone.
fn nvmet_script(addr: &str, device: &str) -> String {
    format!(
        "modprobe null_blk nr_devices=1; modprobe nvmet_rdma
mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
cd /sys/kernel/config/nvmet
mkdir -p subsystems/{NQN}/namespaces/1 ports/1
echo 1 > subsystems/{NQN}/attr_allow_any_host
echo -n /dev/nullb0 > subsystems/{NQN}/namespaces/1/device_path
echo 1 > subsystems/{NQN}/namespaces/1/enable
echo rdma > ports/1/addr_trtype; echo ipv4 > ports/1/addr_adrfam
echo {addr} > ports/1/addr_traddr; echo 4420 > ports/1/addr_trsvcid
[ -e ports/1/subsystems/{NQN} ] || ln -s \"$PWD/subsystems/{NQN}\" ports/1/subsystems/{NQN}
qps() {{ rdma resource show qp link {device}/1 | grep -c rdma_cm || true; }}
i=0; while [ \"$(qps)\" -eq 0 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
while [ \"$(qps)\" -gt 0 ]; do sleep 0.1; done
rm ports/1/subsystems/{NQN}
rmdir ports/1 subsystems/{NQN}/namespaces/1 subsystems/{NQN}"
    )
}

/// The initiator: connect from `me` to the target at `peer`:4420, read 1 MiB
/// straight from the namespace, disconnect.
fn nvme_script(me: &str, peer: &str) -> String {
    format!(
        "modprobe nvme_rdma
echo transport=rdma,traddr={peer},trsvcid=4420,host_traddr={me},nqn={NQN} > /dev/nvme-fabrics
ctrl=$(grep -l '^{NQN}$' /sys/class/nvme/nvme*/subsysnqn | head -1 | xargs dirname)
dev=/dev/$(ls \"$ctrl\" | grep -m1 '^nvme[0-9]*n1$' || basename \"$ctrl\")n1
i=0; while [ ! -b \"$dev\" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
dd if=\"$dev\" of=/dev/null bs=4096 count=256 iflag=direct
echo 1 > \"$ctrl/delete_controller\""
    )
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// One scenario.
pub struct Scenario {
    pub name: &'static str,
    pub program: Program,
    /// The command name the client runs under, where it takes one a rule
    /// binds (the lab runs the program through a link of that name; the
    /// kernel takes a task's comm from it); `None`: the program's own.
    pub client_comm: Option<&'static str>,
    /// The policy's `[[bind]]` and `[enforcement]` part (the port table is
    /// common).
    pub rules: &'static str,
    /// What binds the server's QP, for the table.
    pub binding: &'static str,
    /// Whether the programs complete.
    pub completes: bool,
    /// The counter that must move (the verdict for the server's QP); every
    /// other drop reason must stay at zero.
    pub reason: Reason,
    /// P_Keys and Q_Keys the client's frames carry on the wire.
    pub wire_pkeys: &'static [u16],
    pub wire_qkeys: &'static [u32],
    /// Which rule decides it.
    pub why: &'static str,
    /// What an unprivileged local tenant does meanwhile.
    pub attack: Option<Attack>,
    /// Where the server and the client run: the cgroups or user the
    /// policy's rules bind, as the README recommends.
    pub tenants: [Tenant; 2],
    /// `attach --pin`: no pkeyfw process while the programs run.
    pub pinned: bool,
}

/// A local tenant's move during a scenario: the test kit's attacker
/// ([`ATTACKER`](super::run::ATTACKER)) as an
/// unprivileged user, with a QP no rule binds, from before the server
/// starts until the programs are done.
#[derive(Copy, Clone, Debug)]
pub enum Attack {
    /// On the client's device, modifies to RTR in a loop, naming every
    /// QPN the server's QP may get at the server's address: without the
    /// probes' rules, each would take the client's connection from it.
    ModifyFlood,
    /// As D (a rule binds it to 0x8002), on the server's device, joins a
    /// group of its own partition, then one of another (0x8001's), then
    /// holds them: the second is reported, and its process killed where
    /// the policy says so.
    Join { own: Ipv4Addr, foreign: Ipv4Addr },
    /// As a process a rule binds (another partition's, `D`), connects QPs
    /// on the client's device to the server's next QPNs before the server
    /// makes its QP: stamping by destination would give the client's
    /// frames to that QP the attacker's key.
    Squat,
    /// Once the server's UD QP is up, a UDP socket on the client's end
    /// sends it a datagram with this Q_Key (not the one its program set).
    ForeignQkey(u32),
    /// As a process a rule binds (uid 65534, another partition's), holds
    /// this many QPs on the server's device, as many as the probe's table
    /// (`probe_capacity`) has room for: the server's QP, created next, is
    /// quarantined, not left to the unknown-QP rule. Once they are gone a
    /// new QP is bound again.
    Fill(u32),
    /// Not a tenant's: once the server's QP is up (and has set its Q_Key),
    /// every attachment is SIGKILLed and a new attach replaces it, as a
    /// crash and systemd's `Restart=` would.
    Restart,
    /// Both programs run through links whose names are not UTF-8 (the
    /// kernel does not escape them in `/proc/PID/status`). Once the
    /// server's QP is up, every attachment reloads a policy that adds a
    /// rule for another tenant, then is SIGKILLed and replaced by a new
    /// attach of that policy: each re-match must read who made the QPs as
    /// the probe saw it, not `/proc`.
    Rebind,
    /// As an unprivileged user, this many processes loop modifies to RTR
    /// on the server's device naming a peer address that never answers
    /// ARP ([`UNANSWERED`]): each call sleeps up to a second resolving it,
    /// holding a return probe's instance (at most max(10, 2·CPUs) exist)
    /// while the server's UD QP sets its Q_Key.
    Starve(u32),
    /// As the server's tenant (`D`, whose rule binds another partition),
    /// makes and destroys QPs on the server's device until the QPN the
    /// policy's `[[qp]]` entry names ([`ENTRY_QPN`]) comes next: the
    /// server's QP, made next, gets it.
    TakeQpn,
}

/// Where a policy names the QPN its `[[qp]]` entry binds: learned from the
/// server's device as the scenario starts (rxe hands QPNs out in
/// sequence, so a fixed number may be long past).
pub const ENTRY_QPN: &str = "@ENTRY_QPN@";
/// What [`Attack::Rebind`] adds to a scenario's policy: a rule for another
/// tenant, after the scenario's own.
pub const ANOTHER_TENANT: &str = "[[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0x8002\n";

/// An address on the lab's link that no host has: ARP for it never
/// resolves.
pub const UNANSWERED: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 250);

/// The first QPN rxe hands out: the entry's apart from a run.
const FIRST_QPN: u32 = 0x11;

impl Scenario {
    /// The policy file's text, the lab's cgroups and namespace in place,
    /// and `entry` as the QPN its `[[qp]]` entry names, if it has one
    /// (rxe's first QPN without).
    pub fn policy_text(&self, entry: Option<u32>) -> String {
        let entry = format!("{:#x}", entry.unwrap_or(FIRST_QPN));
        tenants::fill(&format!("{PORT}{}", self.rules)).replace(ENTRY_QPN, &entry)
    }

    /// The policy [`Attack::Rebind`] reloads: another tenant's rule added.
    pub fn grown_policy_text(&self) -> String {
        self.policy_text(None) + &tenants::fill(ANOTHER_TENANT)
    }

    /// The policy, as pkeyfw reads it.
    pub fn policy(&self) -> Policy {
        Policy::parse(Path::new(self.name), &self.policy_text(None))
            .unwrap_or_else(|e| panic!("scenario {} has an invalid policy: {e}", self.name))
    }

    /// The command names of the server and the client.
    pub fn comms(&self) -> (&'static str, &'static str) {
        let program = self.program.name();
        (program, self.client_comm.unwrap_or(program))
    }
}

/// The port's P_Key table in every scenario: the default partition, and the
/// memberships the roles below take. The two rxe devices stand for the
/// hosts of several ports, so one table holds all of them.
pub const PORT: &str = "[port]\npkeys = [0xffff, 0x8001, 0x0001, 0x8002]\n";

/// The roles of the four-QP partition example, plus one in another
/// partition, each a cgroup: A is a full member of partition 0x0001, B and
/// C limited members, D a full member of 0x0002. All four use
/// ibv_ud_pingpong's Q_Key.
macro_rules! roles {
    () => {
        "[[bind]]\ncgroup = \"@CGROUPS@/a\"\npkey = 0x8001\nqkey = 0x11111111\n\
         [[bind]]\ncgroup = \"@CGROUPS@/b\"\npkey = 0x0001\nqkey = 0x11111111\n\
         [[bind]]\ncgroup = \"@CGROUPS@/c\"\npkey = 0x0001\nqkey = 0x11111111\n\
         [[bind]]\ncgroup = \"@CGROUPS@/d\"\npkey = 0x8002\nqkey = 0x11111111\n"
    };
}

/// Each perftest program of the `app` tenant bound by the name it runs under
/// ([`PERFTEST`]): as the server (`-l`), a limited member of 0x0001, as the
/// client (`-f`), a full one; nothing else passes.
macro_rules! by_name {
    ($($tool:literal),*) => {
        concat!(
            "[enforcement]\nstamp = true\nunknown_qp = \"drop\"\n",
            $("[[bind]]\ncgroup = \"@CGROUPS@/app\"\ncomm = \"", $tool, "-l\"\npkey = 0x0001\n",
              "[[bind]]\ncgroup = \"@CGROUPS@/app\"\ncomm = \"", $tool, "-f\"\npkey = 0x8001\n",)*
        )
    };
}
const PERFTEST_BY_NAME: &str = by_name!(
    "ib_write_bw",
    "ib_read_bw",
    "ib_atomic_bw",
    "ib_send_bw",
    "ib_write_lat",
    "ib_read_lat",
    "ib_atomic_lat",
    "ib_send_lat"
);

const STAMPING: &str = concat!("[enforcement]\nstamp = true\n", roles!());

/// D joining its own group, then A's: the groups of [`groups!`].
const D_JOINS: Attack = Attack::Join {
    own: Ipv4Addr::new(239, 1, 1, 2),
    foreign: Ipv4Addr::new(239, 1, 1, 1),
};

/// D's rule, and a group of its partition and one of A's: a join to the
/// second is D's foreign join.
macro_rules! groups {
    () => {
        "[[bind]]\ncgroup = \"@CGROUPS@/d\"\npkey = 0x8002\n\
         [[group]]\naddr = \"239.1.1.2\"\npkey = 0x8002\nqkey = 0x11111111\n\
         [[group]]\naddr = \"239.1.1.1\"\npkey = 0x8001\nqkey = 0x11111111\n"
    };
}

/// The roles, as the rules above bind them.
const A: Tenant = in_cgroup("a");
const B: Tenant = in_cgroup("b");
const C: Tenant = in_cgroup("c");
const D: Tenant = in_cgroup("d");
/// The squatter runs as D: bound, to another partition.
pub const SQUATTER: Tenant = D;
/// Where the programs of a scenario without roles run, which its rule
/// binds.
const APP: Tenant = in_cgroup("app");

/// Q_Keys: ibv_ud_pingpong's, rdma_cm's UD port space's, and the GSI's.
const PP_QKEY: u32 = 0x1111_1111;
const UDADDY_QKEY: u32 = 0x0123_4567;
const GSI_QKEY: u32 = 0x8001_0000;
/// perftest's UD Q_Key.
const PERFTEST_QKEY: u32 = 0x1111_1111;
/// What a sender that is not the program uses.
const FOREIGN_QKEY: u32 = 0x2222_2222;

/// Tenants told apart by cgroup, whatever their processes call themselves:
/// `a` full member of 0x0001, `b` and `c` limited members; a process in
/// none of them is bound by its name, the weaker rule, after them (the
/// lab's one rule that `policy check` warns about, on purpose).
const BY_CGROUP: &str = "[enforcement]\nstamp = true\n\
    [[bind]]\ncgroup = \"@CGROUPS@/a\"\npkey = 0x8001\n\
    [[bind]]\ncgroup = \"@CGROUPS@/b\"\npkey = 0x0001\n\
    [[bind]]\ncgroup = \"@CGROUPS@/c\"\npkey = 0x0001\n\
    [[bind]]\ncomm = \"pp-a-full\"\npkey = 0x8001\n";
/// The name BY_CGROUP's last rule binds.
const FULL_BY_NAME: &str = "pp-a-full";

const fn in_cgroup(cgroup: &'static str) -> Tenant {
    Tenant {
        cgroup: Some(cgroup),
        uid: None,
    }
}

/// The user the uid scenarios run their programs as.
const TENANT_UID: u32 = 1001;
const AS_TENANT: Tenant = Tenant {
    cgroup: None,
    uid: Some(TENANT_UID),
};

pub fn all() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "ud-qkey-match",
            client_comm: None,
            program: Program::UdPingpong,
            rules: "[[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0xffff\nqkey = 0x11111111\n",
            binding: "UD, P_Key 0xffff, Q_Key 0x11111111",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[PP_QKEY],
            attack: None,
            tenants: [APP; 2],
            pinned: false,
            why: "DETH Q_Key equals the QP's",
        },
        Scenario {
            name: "ud-qkey-other",
            client_comm: None,
            program: Program::UdPingpong,
            rules: "[[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0xffff\nqkey = 0x22222222\n",
            binding: "UD, P_Key 0xffff, Q_Key 0x22222222",
            completes: false,
            reason: Reason::QkeyViolation,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[PP_QKEY],
            attack: None,
            tenants: [APP; 2],
            pinned: false,
            why: "DETH Q_Key differs from the QP's",
        },
        Scenario {
            name: "rc-default-partition",
            client_comm: None,
            program: Program::RcPingpong,
            rules: "[[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0xffff\n",
            binding: "RC, P_Key 0xffff",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[],
            attack: None,
            tenants: [APP; 2],
            pinned: false,
            why: "0xffff matches 0xffff",
        },
        Scenario {
            name: "rc-other-partition",
            client_comm: None,
            program: Program::RcPingpong,
            rules: "[[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0x8001\n",
            binding: "RC, P_Key 0x8001",
            completes: false,
            reason: Reason::PkeyViolation,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[],
            attack: None,
            tenants: [APP; 2],
            pinned: false,
            why: "partition 0x7fff is not 0x0001",
        },
        Scenario {
            name: "send-bw-default",
            client_comm: None,
            program: Program::SendBw,
            rules: "[[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0xffff\n",
            binding: "RC, P_Key 0xffff",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[],
            attack: None,
            tenants: [APP; 2],
            pinned: false,
            why: "0xffff matches 0xffff",
        },
        Scenario {
            name: "send-bw-other",
            client_comm: None,
            program: Program::SendBw,
            rules: "[[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0x8001\n",
            binding: "RC, P_Key 0x8001",
            completes: false,
            reason: Reason::PkeyViolation,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[],
            attack: None,
            tenants: [APP; 2],
            pinned: false,
            why: "partition 0x7fff is not 0x0001",
        },
        Scenario {
            name: "rping",
            client_comm: None,
            program: Program::Rping,
            rules: "[[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0xffff\n",
            binding: "RC, P_Key 0xffff",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[GSI_QKEY],
            attack: None,
            tenants: [APP; 2],
            pinned: false,
            why: "CM to QP1 (Q_Key 0x80010000), RC data 0xffff",
        },
        Scenario {
            name: "udaddy-match",
            client_comm: None,
            program: Program::Udaddy,
            rules: "[[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0xffff\nqkey = 0x01234567\n",
            binding: "UD, P_Key 0xffff, Q_Key 0x01234567",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[GSI_QKEY, UDADDY_QKEY],
            attack: None,
            tenants: [APP; 2],
            pinned: false,
            why: "CM to QP1, data Q_Key matches",
        },
        Scenario {
            name: "udaddy-other",
            client_comm: None,
            program: Program::Udaddy,
            rules: "[[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0xffff\nqkey = 0x76543210\n",
            binding: "UD, P_Key 0xffff, Q_Key 0x76543210",
            completes: false,
            reason: Reason::QkeyViolation,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[GSI_QKEY, UDADDY_QKEY],
            attack: None,
            tenants: [APP; 2],
            pinned: false,
            why: "CM passes; data Q_Key differs",
        },
        Scenario {
            name: "unknown-drop-ud",
            client_comm: None,
            program: Program::UdPingpong,
            rules: "[enforcement]\nunknown_qp = \"drop\"\n",
            binding: "none (unknown_qp = drop)",
            completes: false,
            reason: Reason::UnknownQp,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[PP_QKEY],
            attack: None,
            tenants: [Tenant::ANY; 2],
            pinned: false,
            why: "no rule binds the QP",
        },
        Scenario {
            name: "unknown-drop-rping",
            client_comm: None,
            program: Program::Rping,
            rules: "[enforcement]\nunknown_qp = \"drop\"\n",
            binding: "none (unknown_qp = drop)",
            completes: false,
            reason: Reason::UnknownQp,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[GSI_QKEY],
            attack: None,
            tenants: [Tenant::ANY; 2],
            pinned: false,
            why: "no rule binds the listener: its REQ is refused",
        },
        Scenario {
            name: "stamp-ud-a-b",
            client_comm: None,
            program: Program::UdPingpong,
            rules: STAMPING,
            binding: "A 0x8001 ⟵ B 0x0001, stamped",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0x0001, 0x8001],
            wire_qkeys: &[PP_QKEY],
            attack: None,
            tenants: [A, B],
            pinned: false,
            why: "full and limited member of 0x0001",
        },
        Scenario {
            name: "stamp-rc-a-c",
            client_comm: None,
            program: Program::RcPingpong,
            rules: STAMPING,
            binding: "A 0x8001 ⟵ C 0x0001, stamped",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0x0001, 0x8001],
            wire_qkeys: &[],
            attack: None,
            tenants: [A, C],
            pinned: false,
            why: "full and limited member of 0x0001",
        },
        Scenario {
            name: "stamp-ud-b-c",
            client_comm: None,
            program: Program::UdPingpong,
            rules: STAMPING,
            binding: "B 0x0001 ⟵ C 0x0001, stamped",
            completes: false,
            reason: Reason::PkeyViolation,
            wire_pkeys: &[0x0001],
            wire_qkeys: &[PP_QKEY],
            attack: None,
            tenants: [B, C],
            pinned: false,
            why: "two limited members never match",
        },
        Scenario {
            name: "stamp-rc-b-c",
            client_comm: None,
            program: Program::RcPingpong,
            rules: STAMPING,
            binding: "B 0x0001 ⟵ C 0x0001, stamped",
            completes: false,
            reason: Reason::PkeyViolation,
            wire_pkeys: &[0x0001],
            wire_qkeys: &[],
            attack: None,
            tenants: [B, C],
            pinned: false,
            why: "two limited members never match",
        },
        Scenario {
            name: "stamp-ud-b-d",
            client_comm: None,
            program: Program::UdPingpong,
            rules: STAMPING,
            binding: "B 0x0001 ⟵ D 0x8002, stamped",
            completes: false,
            reason: Reason::PkeyViolation,
            wire_pkeys: &[0x8002],
            wire_qkeys: &[PP_QKEY],
            attack: None,
            tenants: [B, D],
            pinned: false,
            why: "partition 0x0002 is not 0x0001",
        },
        Scenario {
            name: "unstamped-ud-a-b",
            client_comm: None,
            program: Program::UdPingpong,
            rules: roles!(),
            binding: "A 0x8001 ⟵ B 0x0001, not stamped",
            completes: false,
            reason: Reason::PkeyViolation,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[PP_QKEY],
            attack: None,
            tenants: [A, B],
            pinned: false,
            why: "rxe sends 0xffff, which 0x8001 refuses",
        },
        Scenario {
            name: "stamp-rc-flood",
            client_comm: None,
            program: Program::RcPingpong,
            rules: STAMPING,
            binding: "A 0x8001 ⟵ C 0x0001, stamped",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0x0001, 0x8001],
            wire_qkeys: &[],
            attack: Some(Attack::ModifyFlood),
            tenants: [A, C],
            pinned: false,
            why: "a tenant's modify flood records nothing",
        },
        Scenario {
            name: "stamp-rc-squat",
            client_comm: None,
            program: Program::RcPingpong,
            rules: STAMPING,
            binding: "A 0x8001 ⟵ C 0x0001, stamped",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0x0001, 0x8001],
            wire_qkeys: &[],
            attack: Some(Attack::Squat),
            tenants: [A, C],
            pinned: false,
            why: "frames are the sending QP's, not the peer's",
        },
        // Not stamped, so that nothing but the join is at stake: the
        // server's QP is bound before its client starts, the client's
        // frames carry 0xffff.
        Scenario {
            name: "mcast-foreign-join",
            client_comm: None,
            program: Program::UdPingpong,
            rules: concat!(
                "[[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0xffff\nqkey = 0x11111111\n",
                groups!()
            ),
            binding: "UD, P_Key 0xffff, Q_Key 0x11111111",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[PP_QKEY],
            attack: Some(D_JOINS),
            tenants: [APP; 2],
            pinned: false,
            why: "D's join to 0x0001's group is reported under a junk flood",
        },
        Scenario {
            name: "mcast-foreign-join-kill",
            client_comm: None,
            program: Program::UdPingpong,
            rules: concat!(
                "[enforcement]\nforeign_join = \"kill\"\n",
                "[[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0xffff\nqkey = 0x11111111\n",
                groups!()
            ),
            binding: "UD, P_Key 0xffff, Q_Key 0x11111111; foreign joins killed",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[PP_QKEY],
            attack: Some(D_JOINS),
            tenants: [APP; 2],
            pinned: false,
            why: "D, joining 0x0001's group after its own, is SIGKILLed",
        },
        Scenario {
            name: "tenant-cgroup-a-b",
            client_comm: None,
            program: Program::UdPingpong,
            rules: BY_CGROUP,
            binding: "cgroup a 0x8001 ⟵ cgroup b 0x0001, stamped",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0x0001, 0x8001],
            wire_qkeys: &[PP_QKEY],
            attack: None,
            tenants: [in_cgroup("a"), in_cgroup("b")],
            pinned: false,
            why: "same program, each its cgroup's partition",
        },
        Scenario {
            name: "tenant-cgroup-renamed",
            client_comm: Some(FULL_BY_NAME),
            program: Program::UdPingpong,
            rules: BY_CGROUP,
            binding: "cgroup b 0x0001 ⟵ cgroup c as pp-a-full",
            completes: false,
            reason: Reason::PkeyViolation,
            wire_pkeys: &[0x0001],
            wire_qkeys: &[PP_QKEY],
            attack: None,
            tenants: [in_cgroup("b"), in_cgroup("c")],
            pinned: false,
            why: "a name is no way out of a cgroup",
        },
        Scenario {
            name: "pinned-a-b",
            client_comm: None,
            program: Program::UdPingpong,
            rules: STAMPING,
            binding: "A 0x8001 ⟵ B 0x0001, pinned",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0x0001, 0x8001],
            wire_qkeys: &[PP_QKEY],
            attack: None,
            tenants: [A, B],
            pinned: true,
            why: "bound and stamped with no pkeyfw process",
        },
        Scenario {
            name: "pinned-b-c",
            client_comm: None,
            program: Program::RcPingpong,
            rules: STAMPING,
            binding: "B 0x0001 ⟵ C 0x0001, pinned",
            completes: false,
            reason: Reason::PkeyViolation,
            wire_pkeys: &[0x0001],
            wire_qkeys: &[],
            attack: None,
            tenants: [B, C],
            pinned: true,
            why: "two limited members never match",
        },
        Scenario {
            name: "pinned-d-b",
            client_comm: None,
            program: Program::UdPingpong,
            rules: STAMPING,
            binding: "B 0x0001 ⟵ D 0x8002, pinned",
            completes: false,
            reason: Reason::PkeyViolation,
            wire_pkeys: &[0x8002],
            wire_qkeys: &[PP_QKEY],
            attack: None,
            tenants: [B, D],
            pinned: true,
            why: "partition 0x0002 is not 0x0001",
        },
        Scenario {
            name: "drop-bound-udaddy",
            client_comm: None,
            program: Program::Udaddy,
            rules: "[enforcement]\nunknown_qp = \"drop\"\n\
                    [[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0xffff\nqkey = 0x01234567\n",
            binding: "UD, P_Key 0xffff; unknown: drop",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[GSI_QKEY, UDADDY_QKEY],
            attack: None,
            tenants: [APP; 2],
            pinned: false,
            why: "bound as created: no frame is unknown",
        },
        Scenario {
            name: "stamp-perftest",
            client_comm: None,
            program: Program::Perftest,
            rules: PERFTEST_BY_NAME,
            binding: "every perftest run by its name: servers 0x0001, clients 0x8001, stamped",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0x0001, 0x8001],
            wire_qkeys: &[PERFTEST_QKEY],
            attack: None,
            tenants: [APP; 2],
            pinned: true,
            why: "every QP bound at creation, whatever names came before on its CPU",
        },
        Scenario {
            name: "nvmeof-by-port",
            client_comm: None,
            program: Program::NvmeOf,
            rules: "[enforcement]\nstamp = true\nunknown_qp = \"drop\"\n\
                    [[bind]]\nkernel = true\ncomm = \"rdma_cm\"\nport = 4420\ndevice = \"pkfw_rxe1\"\npkey = 0x8001\n\
                    [[bind]]\nkernel = true\ncomm = \"rdma_cm\"\nport = 4420\ndevice = \"pkfw_rxe0\"\npkey = 0x0001\n",
            binding: "nvmet 0x8001 ⟵ nvme-rdma 0x0001, by port 4420 and device, stamped",
            completes: true,
            reason: Reason::Ok,
            // The CM MADs too: each carries its connection's key.
            wire_pkeys: &[0x0001, 0x8001],
            wire_qkeys: &[GSI_QKEY],
            attack: None,
            tenants: [Tenant::ANY; 2],
            pinned: false,
            why: "kernel users by the rdma_cm port they serve or connect to",
        },
        Scenario {
            name: "drop-bound-rping",
            client_comm: None,
            program: Program::Rping,
            rules: "[enforcement]\nunknown_qp = \"drop\"\n\
                    [[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0xffff\n",
            binding: "RC, P_Key 0xffff; unknown: drop",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[GSI_QKEY],
            attack: None,
            tenants: [APP; 2],
            pinned: false,
            why: "bound as created: no frame is unknown",
        },
        Scenario {
            name: "ud-own-qkey-restart",
            client_comm: None,
            program: Program::UdPingpong,
            rules: "[[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0xffff\n",
            binding: "UD, P_Key 0xffff, its own Q_Key",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[PP_QKEY],
            attack: Some(Attack::Restart),
            tenants: [APP; 2],
            pinned: false,
            why: "the replacing attach keeps the Q_Key the probe saw",
        },
        Scenario {
            name: "stamp-unreadable-rebind",
            client_comm: None,
            program: Program::UdPingpong,
            rules: concat!(
                "[enforcement]\nstamp = true\nunknown_qp = \"default-pkey\"\n",
                roles!()
            ),
            binding: "A 0x8001 ⟵ B 0x0001, named \\xff, stamped, reloaded, restarted",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0x0001, 0x8001],
            wire_qkeys: &[PP_QKEY],
            attack: Some(Attack::Rebind),
            tenants: [A, B],
            pinned: false,
            why: "re-matches read the creation the probe recorded, never /proc",
        },
        Scenario {
            name: "stamp-rc-restart",
            client_comm: None,
            program: Program::RcPingpong,
            rules: STAMPING,
            binding: "A 0x8001 ⟵ C 0x0001, stamped",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0x0001, 0x8001],
            wire_qkeys: &[],
            attack: Some(Attack::Restart),
            tenants: [A, C],
            pinned: false,
            why: "the replacing attach keeps the tags and deletes the old stamper",
        },
        Scenario {
            name: "fill-table",
            client_comm: None,
            program: Program::UdPingpong,
            rules: "[enforcement]\nprobe_capacity = 8\n\
                    [[bind]]\nuid = 65534\npkey = 0x8002\nqkey = 0x11111111\n\
                    [[bind]]\nuid = 1001\npkey = 0xffff\nqkey = 0x11111111\n",
            binding: "quarantined: uid 65534 holds the 8 records",
            completes: false,
            reason: Reason::UnknownQp,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[PP_QKEY],
            attack: Some(Attack::Fill(8)),
            tenants: [AS_TENANT; 2],
            pinned: true,
            why: "a full table quarantines; unknown_qp = default-pkey would pass it",
        },
        Scenario {
            name: "take-entry-qpn",
            client_comm: None,
            program: Program::UdPingpong,
            rules: concat!(
                "[enforcement]\nstamp = true\nunknown_qp = \"drop\"\n",
                roles!(),
                "[[qp]]\nqpn = @ENTRY_QPN@\ntype = \"ud\"\npkey = 0x8001\nqkey = 0x11111111\n"
            ),
            binding: "D 0x8002 (a [[qp]] entry: 0x8001) ⟵ A 0x8001, stamped",
            completes: false,
            reason: Reason::PkeyViolation,
            wire_pkeys: &[0x8001],
            wire_qkeys: &[PP_QKEY],
            attack: Some(Attack::TakeQpn),
            tenants: [D, A],
            pinned: false,
            why: "a QPN taken in sequence does not beat D's cgroup",
        },
        Scenario {
            name: "ud-own-qkey-starved",
            client_comm: None,
            program: Program::UdPingpong,
            rules: "[[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0xffff\n",
            binding: "UD, P_Key 0xffff, its own Q_Key, set while 24 modifies sleep",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[PP_QKEY],
            attack: Some(Attack::Starve(24)),
            tenants: [APP; 2],
            pinned: false,
            why: "the Q_Key is taken at the modify's entry, which no one can starve",
        },
        Scenario {
            name: "ud-own-qkey",
            client_comm: None,
            program: Program::UdPingpong,
            rules: "[[bind]]\ncgroup = \"@CGROUPS@/app\"\npkey = 0xffff\n",
            binding: "UD, P_Key 0xffff, its own Q_Key",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[PP_QKEY, FOREIGN_QKEY],
            attack: Some(Attack::ForeignQkey(FOREIGN_QKEY)),
            tenants: [APP; 2],
            pinned: false,
            why: "Q_Key 0x11111111 set by the program; 0x22222222 refused",
        },
        Scenario {
            name: "uid-match",
            client_comm: None,
            program: Program::UdPingpong,
            rules: "[enforcement]\nunknown_qp = \"drop\"\n\
                    [[bind]]\nuid = 1001\npkey = 0xffff\n",
            binding: "uid 1001: UD, P_Key 0xffff",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[PP_QKEY],
            attack: None,
            tenants: [AS_TENANT; 2],
            pinned: false,
            why: "the creator's effective uid is 1001",
        },
        Scenario {
            name: "uid-other",
            client_comm: None,
            program: Program::UdPingpong,
            rules: "[enforcement]\nunknown_qp = \"drop\"\n\
                    [[bind]]\nuid = 1002\npkey = 0xffff\n",
            binding: "none: uid 1002, program runs as 1001",
            completes: false,
            reason: Reason::UnknownQp,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[PP_QKEY],
            attack: None,
            tenants: [AS_TENANT; 2],
            pinned: false,
            why: "no rule binds uid 1001",
        },
        Scenario {
            name: "netns-match",
            client_comm: None,
            program: Program::UdPingpong,
            rules: "[enforcement]\nunknown_qp = \"drop\"\n\
                    [[bind]]\nnetns = \"/proc/self/ns/net\"\npkey = 0xffff\n",
            binding: "netns (pkeyfw's own): UD, 0xffff",
            completes: true,
            reason: Reason::Ok,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[PP_QKEY],
            attack: None,
            tenants: [Tenant::ANY; 2],
            pinned: false,
            why: "the creator's network namespace",
        },
        Scenario {
            name: "netns-other",
            client_comm: None,
            program: Program::UdPingpong,
            rules: "[enforcement]\nunknown_qp = \"drop\"\n\
                    [[bind]]\nnetns = \"@OTHER_NETNS@\"\npkey = 0xffff\n",
            binding: "none: another netns",
            completes: false,
            reason: Reason::UnknownQp,
            wire_pkeys: &[0xffff],
            wire_qkeys: &[PP_QKEY],
            attack: None,
            tenants: [Tenant::ANY; 2],
            pinned: false,
            why: "no rule binds the programs' namespace",
        },
    ]
}

#[cfg(test)]
mod tests {
    use pkeyfw_common::abi::UnknownQp;

    use super::*;

    /// Every scenario's policy is valid and says what its table row
    /// claims; its tenants are told apart as the README recommends, by
    /// cgroup, uid or netns: nothing is warned to be no boundary but
    /// BY_CGROUP's name rule, there to be renamed around, and the `[[qp]]`
    /// entry a tenant takes the QPN of.
    #[test]
    fn scenario_policies_are_what_they_say() {
        // The lab's cgroups and namespace, which the policies name.
        let _tenants = super::tenants::Tenants::create().expect("the lab's tenants (run as root)");
        // (A rule naming a device is resolved against the guest's.)
        for sc in all()
            .into_iter()
            .filter(|sc| !sc.rules.contains("device ="))
        {
            let p = sc.policy();
            let unbound = sc.binding.starts_with("none");
            if unbound {
                assert_eq!(p.unknown_qp, UnknownQp::Drop, "{}", sc.name);
            }
            // A stalled program's frames are refused under its reason.
            let refused = match sc.reason {
                Reason::Ok | Reason::NotRoce | Reason::Smi => false,
                Reason::UnknownQp => {
                    p.unknown_qp == UnknownQp::Drop || sc.binding.starts_with("quarantined")
                }
                _ => true,
            };
            assert!(sc.completes || refused, "{}", sc.name);
            // Every tenant's cgroup is one a rule binds.
            for cgroup in sc.tenants.iter().filter_map(|t| t.cgroup) {
                let named = p
                    .binds
                    .iter()
                    .any(|b| b.cgroup.as_ref().is_some_and(|c| c.path.ends_with(cgroup)));
                assert!(named, "{}: no rule binds cgroup {cgroup}", sc.name);
            }
            let weak = p
                .warnings
                .iter()
                .filter(|w| w.contains("no boundary"))
                .count();
            let on_purpose = usize::from(sc.rules == BY_CGROUP) + p.qps.len();
            assert_eq!(weak, on_purpose, "{}: {:?}", sc.name, p.warnings);
            assert_eq!(
                sc.rules.contains(ENTRY_QPN),
                matches!(sc.attack, Some(Attack::TakeQpn)),
                "{}: an entry's QPN is learned only where a tenant takes it",
                sc.name
            );
        }
    }
}
