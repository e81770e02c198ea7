//! Two soft-RoCE devices joined by a veth pair, in this network namespace:
//! what `pkeyfw lab rxe` runs over, and what the systemd scenario sets up
//! with `pkeyfw-lab-rxe pair`.
//!
//! rdma_rxe (Linux 6.1) lives in the initial namespace only, so both ends
//! stay here and policy routing forces their traffic over the veth instead
//! of the loopback shortcut: for locally sent packets (`iif lo`, and any
//! lookup bound to one of the veths, as rdma_cm's route checks are) each
//! peer address routes out of its veth, ahead of the local table, which
//! moves below those rules; the receiving end accepts a local source
//! (accept_local, no reverse-path filter) and the neighbours are static.
//! Everything is undone on drop, the local rule's place included, unless
//! kept ([`Topology::keep`]).

use std::{net::Ipv4Addr, process::Command};

use anyhow::{Context as _, Result, bail};

/// One side: its veth end, address and soft-RoCE device.
#[derive(Clone, Debug)]
pub struct End {
    pub iface: String,
    pub addr: Ipv4Addr,
    pub device: String,
    /// The GID index of the device's RoCE v2 IPv4-mapped GID.
    pub gid_index: u32,
}

pub struct Topology {
    pub ends: [End; 2],
    changes: Changes,
}

/// Rule preferences the lab uses; the local table moves to `LOCAL`.
pub const PREF: u32 = 100;
const LOCAL: u32 = 200;
/// Routing tables, one per sending end.
pub const TABLE: u32 = 4791;

impl Topology {
    pub fn create() -> Result<Topology> {
        let mut t = Topology {
            ends: [0, 1].map(|i| End {
                iface: format!("pkfw{i}"),
                addr: Ipv4Addr::new(192, 0, 2, 1 + i as u8),
                device: format!("pkfw_rxe{i}"),
                gid_index: 0,
            }),
            changes: Changes::default(),
        };
        t.build()?;
        Ok(t)
    }

    fn build(&mut self) -> Result<()> {
        let [a, b] = self.ends.clone();
        let c = &mut self.changes;
        c.ip(
            &[
                "link", "add", &a.iface, "type", "veth", "peer", "name", &b.iface,
            ],
            &["link", "del", &a.iface],
        )?;
        for (i, (me, peer)) in [(&a, &b), (&b, &a)].into_iter().enumerate() {
            ip(&["addr", "add", &format!("{}/32", me.addr), "dev", &me.iface])?;
            ip(&["link", "set", &me.iface, "up"])?;
            let table = TABLE + i as u32;
            c.route(me, peer, &peer.iface, table)?;
            for (k, selector) in [("iif", "lo"), ("oif", me.iface.as_str())]
                .into_iter()
                .enumerate()
            {
                let to = peer.addr.to_string();
                c.rule(
                    PREF + 2 * i as u32 + k as u32,
                    &[selector.0, selector.1, "to", &to],
                    table,
                )?;
            }
        }
        c.local_rule_below()?;
        c.accept_local(&[&a.iface, &b.iface])?;
        for end in &mut self.ends {
            c.rxe(end)?;
        }
        for end in &mut self.ends {
            end.gid_index = gid_index(&end.device, end.addr)?;
        }
        Ok(())
    }

    pub fn server(&self) -> &End {
        &self.ends[1]
    }

    pub fn client(&self) -> &End {
        &self.ends[0]
    }

    /// Leaves everything in place, for a script that goes on with it.
    pub fn keep(mut self) {
        self.changes.undo.clear();
        self.changes.sysctls.clear();
    }
}

/// Changes to this namespace's network setup, undone in reverse on drop.
#[derive(Default)]
pub struct Changes {
    /// Undo steps (`ip` and `rdma` command lines).
    undo: Vec<Vec<String>>,
    /// sysctl files and their old values.
    sysctls: Vec<(String, String)>,
}

impl Changes {
    /// Runs `ip ARGS`, and `ip UNDO` on drop.
    pub fn ip(&mut self, args: &[&str], undo: &[&str]) -> Result<()> {
        ip(args)?;
        self.undo.push(strings("ip", undo));
        Ok(())
    }

    /// Routes `me`'s packets to `peer` out of `me`'s interface, in `table`,
    /// to the MAC of `peer_iface` (static: no ARP crosses).
    pub fn route(&mut self, me: &End, peer: &End, peer_iface: &str, table: u32) -> Result<()> {
        let to = peer.addr.to_string();
        ip(&[
            "route",
            "add",
            &to,
            "dev",
            &me.iface,
            "src",
            &me.addr.to_string(),
            "table",
            &table.to_string(),
        ])?;
        let mac = std::fs::read_to_string(format!("/sys/class/net/{peer_iface}/address"))?;
        ip(&[
            "neigh",
            "add",
            &to,
            "lladdr",
            mac.trim(),
            "dev",
            &me.iface,
            "nud",
            "permanent",
        ])
    }

    /// A rule at `pref`: what `selector` matches looks up `table`.
    pub fn rule(&mut self, pref: u32, selector: &[&str], table: u32) -> Result<()> {
        let pref = pref.to_string();
        let mut args = vec!["rule", "add", "pref", &pref];
        args.extend(selector);
        let table = table.to_string();
        args.extend(["lookup", &table]);
        self.ip(&args, &["rule", "del", "pref", &pref])
    }

    /// Puts the local table's rule below the lab's (it is consulted first,
    /// at preference 0, otherwise).
    pub fn local_rule_below(&mut self) -> Result<()> {
        let local = LOCAL.to_string();
        self.ip(
            &["rule", "add", "pref", &local, "lookup", "local"],
            &["rule", "del", "pref", &local],
        )?;
        self.ip(
            &["rule", "del", "pref", "0", "lookup", "local"],
            &["rule", "add", "pref", "0", "lookup", "local"],
        )
    }

    /// Lets `ifaces` take packets from local addresses (the other ends').
    pub fn accept_local(&mut self, ifaces: &[&str]) -> Result<()> {
        for conf in ["all", "default"].iter().chain(ifaces) {
            self.sysctl(&format!("net/ipv4/conf/{conf}/accept_local"), "1")?;
            self.sysctl(&format!("net/ipv4/conf/{conf}/rp_filter"), "0")?;
        }
        Ok(())
    }

    /// A soft-RoCE device on `end`'s interface.
    pub fn rxe(&mut self, end: &End) -> Result<()> {
        rdma(&[
            "link",
            "add",
            &end.device,
            "type",
            "rxe",
            "netdev",
            &end.iface,
        ])?;
        self.undo
            .push(strings("rdma", &["link", "delete", &end.device]));
        Ok(())
    }

    fn sysctl(&mut self, key: &str, value: &str) -> Result<()> {
        let path = format!("/proc/sys/{key}");
        let old = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        std::fs::write(&path, value).with_context(|| format!("writing {path}"))?;
        self.sysctls.push((path, old.trim().to_string()));
        Ok(())
    }
}

impl Drop for Changes {
    fn drop(&mut self) {
        for step in self.undo.iter().rev() {
            let _ = Command::new(&step[0]).args(&step[1..]).output();
        }
        for (path, old) in self.sysctls.iter().rev() {
            let _ = std::fs::write(path, old);
        }
    }
}

fn strings(program: &str, a: &[&str]) -> Vec<String> {
    std::iter::once(program)
        .chain(a.iter().copied())
        .map(str::to_string)
        .collect()
}

pub fn ip(a: &[&str]) -> Result<()> {
    run("ip", a)
}

fn rdma(a: &[&str]) -> Result<()> {
    run("rdma", a).context("is the rdma_rxe module loaded?")
}

pub fn run(program: &str, a: &[&str]) -> Result<()> {
    let out = Command::new(program)
        .args(a)
        .output()
        .with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed: {}",
            a.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The index of `device`'s RoCE v2 GID for `addr` (::ffff:a.b.c.d).
pub fn gid_index(device: &str, addr: Ipv4Addr) -> Result<u32> {
    let port = format!("/sys/class/infiniband/{device}/ports/1");
    let want = addr.to_ipv6_mapped().segments();
    // The GID table fills in shortly after the address and device exist.
    for _ in 0..100 {
        for i in 0..16 {
            let gid = std::fs::read_to_string(format!("{port}/gids/{i}")).unwrap_or_default();
            let kind =
                std::fs::read_to_string(format!("{port}/gid_attrs/types/{i}")).unwrap_or_default();
            let words: Vec<u16> = gid
                .trim()
                .split(':')
                .filter_map(|w| u16::from_str_radix(w, 16).ok())
                .collect();
            if words == want && kind.trim() == "RoCE v2" {
                return Ok(i);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    bail!("{device} has no RoCE v2 GID for {addr}")
}
