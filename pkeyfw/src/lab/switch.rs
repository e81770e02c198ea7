//! `pkeyfw lab switch`: the seeds' four hosts on a Linux bridge with pkeyfw
//! on the bridge ports (seed 001). A is a full member of partition 0x0001
//! (0x8001), B and C limited members (0x0001), D in 0x0002 (0x8002); each
//! host is a network namespace whose veth's other end is a port of a bridge
//! in a fifth. Real RoCE v2 frames go between every ordered pair, over IPv4,
//! IPv6 and a VLAN tag, and are looked for at the receiving host, in three
//! rounds, each a `pkeyfw switch reload` of the one before:
//! - drop: each host sends its own key; refused frames never arrive;
//! - corrupt: refused frames arrive with a broken ICRC;
//! - access: every port stamps, the hosts send 0xFFFF (as an unmodified
//!   rdma_rxe does) and receive 0xFFFF. Each port's table also holds the
//!   default partition, as one from a partitions.conf with
//!   `Default=0x7fff : ALL=full` does.
//!
//! Two forgeries ride along in each round: B posing as a full member, B
//! claiming D's partition. Three more in the access round, where the port
//! is the host's HCA with one key: B sending 0x7FFF (the default partition
//! its port's table holds), D sending A's 0x8001, and B sending RoCE v1.
//!
//! A fifth tenant, E, is on a port of the bridge that the policy does not
//! list: `switch attach` must refuse the bridge, naming the port. Taken out
//! of the bridge, E's port joins it again after the attach (a new VM's tap,
//! say). In every round E sends each host a frame with that host's
//! partition as a full member, over IPv4, IPv6, a VLAN, QinQ and RoCE v1:
//! none may arrive.
//! Everything is removed at the end, also on failure.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Context as _, Result, bail};
use pkeyfw_common::{parse, pkey};
use pkeyfw_testkit::{
    netns::{self, ip},
    wire::{Packet, icrc_holds},
};

use crate::reporting::describe;

/// The hosts: name and own P_Key.
const HOSTS: [(char, u16); 4] = [('A', 0x8001), ('B', 0x0001), ('C', 0x0001), ('D', 0x8002)];
/// The tenant on the port no policy lists, numbered after the hosts.
const E: usize = HOSTS.len();

/// One round of the lab: how the switch treats violations and what the
/// hosts send.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Round {
    Drop,
    Corrupt,
    Access,
}

impl Round {
    fn name(self) -> &'static str {
        match self {
            Round::Drop => "drop",
            Round::Corrupt => "corrupt",
            Round::Access => "access",
        }
    }

    /// The switch policy of the round.
    fn policy(self) -> String {
        let violation = if self == Round::Corrupt {
            "corrupt"
        } else {
            "drop"
        };
        let mut text = format!("[switch]\nviolation = \"{violation}\"\n");
        for (i, (_, key)) in HOSTS.iter().enumerate() {
            let (pkeys, stamp) = match self {
                Round::Access => (
                    format!("0xffff, {key:#06x}"),
                    format!("stamp = {key:#06x}\n"),
                ),
                _ => (format!("{key:#06x}"), String::new()),
            };
            text += &format!(
                "\n[[switch.port]]\ninterface = \"{}\"\npkeys = [{pkeys}]\n{stamp}",
                port(i)
            );
        }
        text
    }
}

/// The access round's switch policy: every port an access port for its
/// host's key. The README's bridge quick start shows this fabric
/// (tests/it/quickstart.rs holds the two equal).
pub fn access_policy() -> String {
    Round::Access.policy()
}

/// One frame of the lab.
struct Case {
    round: Round,
    from: usize,
    to: usize,
    net: &'static str,
    /// The P_Key the sender writes.
    sent: u16,
    /// The P_Key it travels the bridge with (an access port's, or `sent`).
    wire: u16,
    packet: Packet,
}

impl Case {
    /// Whether the rules let it reach the receiver: the sender's port admits
    /// its key (partition and membership of its table), the receiver's
    /// port matches it (Table 16-2). Access ports are HCAs with one key:
    /// only 0xFFFF over RoCE v2 goes in, and what comes out must match the
    /// receiver's key.
    fn allowed(&self) -> bool {
        if self.from == E {
            return false;
        }
        if self.round == Round::Access {
            return self.sent == pkey::DEFAULT
                && self.net != "v1"
                && pkey::matches(self.wire, HOSTS[self.to].1);
        }
        let flags = |host: usize, key: u16| {
            let own = HOSTS[host].1;
            if pkey::key(own) == pkey::key(key) {
                pkey::port::flag_of(own)
            } else {
                0
            }
        };
        pkey::port::admits(self.wire, flags(self.from, self.wire))
            && pkey::port::matches(self.wire, flags(self.to, self.wire))
    }

    /// What the receiver should see: nothing, a good frame with this P_Key,
    /// or (corrupt) a frame whose ICRC fails.
    fn expected(&self) -> Seen {
        match (self.allowed(), self.round) {
            // No port judged it on the way in: dropped, never corrupted.
            _ if self.from == E => Seen::Nothing,
            (true, Round::Access) => Seen::Good(pkey::DEFAULT),
            (true, _) => Seen::Good(self.wire),
            (false, Round::Corrupt) => Seen::BadIcrc,
            (false, _) => Seen::Nothing,
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Seen {
    Nothing,
    Good(u16),
    BadIcrc,
}

impl Seen {
    fn text(self) -> String {
        match self {
            Seen::Nothing => "nothing".to_string(),
            Seen::Good(key) => format!("arrives {key:#06x}"),
            Seen::BadIcrc => "arrives, bad ICRC".to_string(),
        }
    }
}

/// Host `i`'s name: A to D, then E.
fn name(i: usize) -> char {
    HOSTS.get(i).map_or('E', |h| h.0)
}

fn host_ns(tag: &str, i: usize) -> String {
    format!("{tag}-h{}", name(i).to_ascii_lowercase())
}

fn port(i: usize) -> String {
    format!("sw{}", name(i).to_ascii_lowercase())
}

fn mac(i: usize) -> [u8; 6] {
    [0x02, 0x00, 0x00, 0x00, 0x13, 0xa0 + i as u8]
}

fn mac_text(i: usize) -> String {
    mac(i).map(|b| format!("{b:02x}")).join(":")
}

/// The bridge, the hosts and their veths; removed on drop.
struct Fabric {
    tag: String,
    switch: String,
    /// The policy file, for the detach on drop.
    policy: std::path::PathBuf,
}

impl Fabric {
    fn create(dir: &Path) -> Result<Fabric> {
        let tag = format!("pkfw-sw{}", std::process::id() % 10000);
        let fabric = Fabric {
            switch: format!("{tag}-s"),
            policy: dir.join("switch.toml"),
            tag,
        };
        fabric.remove();
        fabric.build().inspect_err(|_| fabric.remove())?;
        Ok(fabric)
    }

    fn build(&self) -> Result<()> {
        let s = self.switch.as_str();
        ip(&["netns", "add", s])?;
        ip(&["-n", s, "link", "add", "br0", "type", "bridge"])?;
        quiet(s, "br0")?;
        ip(&["-n", s, "link", "set", "br0", "up"])?;
        for i in 0..=E {
            let h = host_ns(&self.tag, i);
            ip(&["netns", "add", &h])?;
            ip(&[
                "link",
                "add",
                &port(i),
                "netns",
                s,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "address",
                &mac_text(i),
                "netns",
                &h,
            ])?;
            quiet(&h, "eth0")?;
            quiet(s, &port(i))?;
            ip(&["-n", &h, "link", "set", "eth0", "up"])?;
            ip(&["-n", s, "link", "set", &port(i), "master", "br0", "up"])?;
        }
        Ok(())
    }

    /// Makes host `i`'s port a port of the bridge (`join`) or not.
    fn member(&self, i: usize, join: bool) -> Result<()> {
        let how: &[&str] = if join {
            &["master", "br0"]
        } else {
            &["nomaster"]
        };
        ip(&[&["-n", &self.switch, "link", "set", &port(i)], how].concat())
    }

    fn remove(&self) {
        if self.policy.exists() {
            let _ = pkeyfw(
                &["switch", "detach", "--netns", &self.switch, "--policy"],
                &self.policy,
            );
        }
        for ns in (0..=E)
            .map(|i| host_ns(&self.tag, i))
            .chain([self.switch.clone()])
        {
            let _ = ip(&["netns", "delete", &ns]);
        }
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        self.remove();
    }
}

/// No IPv6 on a device: nothing but the lab's frames crosses the bridge.
fn quiet(ns: &str, dev: &str) -> Result<()> {
    let dev = dev.to_string();
    netns::in_netns(ns, move || {
        std::fs::write(format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"), "1")
            .context("disabling IPv6")
    })?
}

/// Runs this pkeyfw with `args` and the policy file; its output on failure.
fn pkeyfw(args: &[&str], policy: &Path) -> Result<()> {
    let out = Command::new(std::env::current_exe()?)
        .args(args)
        .arg(policy)
        .output()
        .context("running pkeyfw")?;
    if !out.status.success() {
        bail!(
            "pkeyfw {} {}: {}",
            args.join(" "),
            policy.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The round's frames: every ordered pair, over IPv4, IPv6 and a VLAN, the
/// forgeries, and E's frames to every host. Each has its own destination
/// QPN, by which the receiver finds it.
fn cases(round: Round, first_qpn: u32) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |from: usize, to: usize, net: &'static str, sent: u16| {
        let qpn = first_qpn + cases.len() as u32;
        let mut packet = match net {
            "ipv6" => Packet::ud(sent, qpn, 0x11).over_v6(Vec::new()),
            "v1" => Packet::rc(sent, qpn).as_v1(),
            _ => Packet::rc(sent, qpn),
        };
        packet.vlans = match net {
            "vlan" => vec![0x8100],
            "qinq" => vec![0x88a8, 0x8100],
            _ => Vec::new(),
        };
        let wire = match round {
            Round::Access if from != E && sent == pkey::DEFAULT && net != "v1" => HOSTS[from].1,
            _ => sent,
        };
        cases.push(Case {
            round,
            from,
            to,
            net,
            sent,
            wire,
            packet,
        });
    };
    for (from, &(_, own)) in HOSTS.iter().enumerate() {
        let sent = match round {
            Round::Access => pkey::DEFAULT,
            _ => own,
        };
        for to in (0..HOSTS.len()).filter(|&to| to != from) {
            for net in ["ipv4", "ipv6", "vlan"] {
                add(from, to, net, sent);
            }
        }
    }
    // In every round, B poses as a full member to C and claims D's
    // partition.
    add(1, 2, "ipv4", 0x8001);
    add(1, 3, "ipv4", 0x8002);
    if round == Round::Access {
        add(1, 2, "ipv4", 0x7fff);
        add(3, 0, "ipv4", 0x8001);
        add(1, 0, "v1", pkey::DEFAULT);
    }
    // E, as a full member of each host's partition: every port would let
    // it through, had a port judged it on the way in.
    for (to, &(_, key)) in HOSTS.iter().enumerate() {
        for net in ["ipv4", "ipv6", "vlan", "qinq", "v1"] {
            add(E, to, net, key | 0x8000);
        }
    }
    cases
}

/// Sends every case to its receiver and returns what each receiver saw of
/// it, in case order.
fn observe(fabric: &Fabric, cases: &[Case]) -> Result<Vec<Seen>> {
    let mut seen = vec![Seen::Nothing; cases.len()];
    for to in 0..HOSTS.len() {
        let mine: Vec<usize> = (0..cases.len()).filter(|&i| cases[i].to == to).collect();
        let (sent, got) = netns::capture_during(
            &host_ns(&fabric.tag, to),
            "eth0",
            Duration::from_millis(200),
            || -> Result<()> {
                for &i in &mine {
                    let c = &cases[i];
                    let mut frame = c.packet.bytes();
                    frame[..6].copy_from_slice(&mac(c.to));
                    frame[6..12].copy_from_slice(&mac(c.from));
                    netns::send(&host_ns(&fabric.tag, c.from), "eth0", &[frame])?;
                }
                Ok(())
            },
        )?;
        sent?;
        for frame in got {
            let Some(roce) = parse::classify(&frame[..]).roce() else {
                continue;
            };
            let Some(&i) = mine
                .iter()
                .find(|&&i| cases[i].packet.dest_qp == roce.dest_qp())
            else {
                continue;
            };
            seen[i] = match icrc_holds(&frame) {
                Some(true) => Seen::Good(roce.pkey()),
                _ => Seen::BadIcrc,
            };
        }
    }
    Ok(seen)
}

/// Runs the lab; `Ok(true)` when every frame went as the rules say.
pub fn run() -> Result<bool> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the switch lab creates network namespaces and attaches XDP; run it as root");
    }
    let dir = std::env::temp_dir().join(format!("pkeyfw-switch-lab-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = Fabric::create(&dir).and_then(|fabric| rounds(&fabric));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn rounds(fabric: &Fabric) -> Result<bool> {
    println!(
        "pkeyfw lab switch: hosts {} on bridge br0 of namespace {} (ports {})",
        HOSTS
            .iter()
            .map(|(name, key)| format!("{name} {}", describe::pkey(*key)))
            .collect::<Vec<_>>()
            .join(", "),
        fabric.switch,
        (0..HOSTS.len()).map(port).collect::<Vec<_>>().join(", ")
    );
    std::fs::write(&fabric.policy, Round::Drop.policy())?;
    let attach = ["switch", "attach", "--netns", &fabric.switch, "--policy"];
    match pkeyfw(&attach, &fabric.policy) {
        Ok(()) => bail!(
            "`pkeyfw switch attach` took bridge br0 with port {}, which its policy does not list",
            port(E)
        ),
        Err(e) => println!(
            "\n{} is a port of br0 that the policy does not list: `pkeyfw switch attach` refuses:\n  {e:#}",
            port(E)
        ),
    }
    fabric.member(E, false)?;
    let mut all_ok = true;
    let (mut total, mut matched) = (0, 0);
    for (n, round) in [Round::Drop, Round::Corrupt, Round::Access]
        .into_iter()
        .enumerate()
    {
        std::fs::write(&fabric.policy, round.policy())?;
        let verb = if n == 0 { "attach" } else { "reload" };
        pkeyfw(
            &["switch", verb, "--netns", &fabric.switch, "--policy"],
            &fabric.policy,
        )?;
        if n == 0 {
            fabric.member(E, true)?;
            println!(
                "\n{} is taken out of br0 for the attach, and joins it again after",
                port(E)
            );
        }
        let cases = cases(round, 0x100 + 0x100 * n as u32);
        let seen = observe(fabric, &cases)?;
        println!("\nround {} (`pkeyfw switch {verb}`):", round.name());
        println!(
            " {:<8} {:<5} {:<8} {:<8} {:<20} {:<20}",
            "pair", "net", "sends", "wire", "expected", "observed"
        );
        for (c, s) in cases.iter().zip(&seen) {
            let ok = c.expected() == *s;
            all_ok &= ok;
            total += 1;
            matched += usize::from(ok);
            println!(
                " {} → {}    {:<5} {:#06x}   {:#06x}   {:<20} {:<20} {}",
                name(c.from),
                name(c.to),
                c.net,
                c.sent,
                c.wire,
                c.expected().text(),
                s.text(),
                if ok { "✓" } else { "✗" }
            );
        }
    }
    println!("\n{matched} of {total} frames as the partition rules say at the switch ports.");
    Ok(all_ok)
}
