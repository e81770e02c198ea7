//! `pkeyfw policy check`: what a policy gives this port — the GUID used, the
//! P_Key table, the bound QPs and groups, the rules that bind discovered QPs,
//! and every warning.

use std::{io::Write, path::PathBuf};

use anyhow::Result;
use serde_json::json;

use super::PortArgs;
use crate::{
    control::{limits, tenancy},
    host::{netlink, rdma},
    policy::{Policy, SwitchPolicy},
    reporting::{
        describe,
        reach::{self, Reach},
    },
};

/// Check a policy file.
#[derive(clap::Subcommand)]
pub enum PolicyCommand {
    Check(CheckArgs),
}

/// Validate a policy and print what it gives this port: the port GUID,
/// the P_Key table (index, value, membership, partition name), the bound
/// QPs, the multicast groups and every warning. Exit status 1 on any
/// error.
#[derive(clap::Args)]
pub struct CheckArgs {
    /// Partition policy (TOML).
    #[arg(long, value_name = "FILE")]
    pub policy: PathBuf,
    /// One JSON object.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub port: PortArgs,
}

pub fn run(command: &PolicyCommand) -> Result<()> {
    match command {
        PolicyCommand::Check(args) => check(args),
    }
}

fn check(args: &CheckArgs) -> Result<()> {
    let json = args.json;
    let mut out = std::io::stdout().lock();
    if let Some(switch) = SwitchPolicy::read(&args.policy)? {
        if json {
            writeln!(out, "{}", switch_json(&switch))?;
        } else {
            switch_text(&switch, &mut out)?;
        }
        return Ok(());
    }
    let mut policy = Policy::load_for(&args.policy, args.port.guid()?)?;
    // What bounds each cgroup rule's tenants, as the kernel has it now.
    let (bounds, warnings) = limits::tenant_bounds(&policy, &[], None);
    policy.warnings.extend(warnings);
    // The interface's RDMA devices, and where the policy would do nothing.
    let devices = args.port.iface.as_deref().map(|iface| {
        let index = netlink::if_index(iface);
        let devices = index
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{e:#}"))
            .and_then(|&i| rdma::devices_on(i));
        let reach = Reach::of(iface, devices.as_deref());
        policy.warnings.extend(reach.warnings);
        // The uplink of tenants' own devices: what attach would refuse.
        if policy.gives_devices()
            && let Ok(index) = index
            && let Err(e) = tenancy::check_uplink(iface, index)
        {
            policy
                .warnings
                .push(format!("attach would refuse {iface}: {e:#}"));
        }
        (devices.unwrap_or_default(), reach.line)
    });
    if json {
        let mut v = to_json(&policy);
        v["rdma_limits"] = json!(bounds);
        if let Some((devices, _)) = &devices {
            v["rdma_devices"] = devices.iter().map(reach::device_json).collect();
        }
        writeln!(out, "{v}")?;
    } else {
        if let Some((_, Some(line))) = &devices {
            writeln!(out, "{line}")?;
        }
        text(&policy, &mut out)?;
        if !bounds.is_empty() {
            writeln!(out, "tenants' QP limits (rdma cgroup):")?;
            for b in &bounds {
                writeln!(out, "  {b}")?;
            }
        }
    }
    Ok(())
}

fn switch_text(switch: &SwitchPolicy, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(out, "switch ports: {}", switch.ports.len())?;
    for (iface, policy) in &switch.ports {
        let role = policy.switch.expect("a switch port has a role");
        writeln!(
            out,
            "  {iface}: {}{}",
            describe::switch_role(&role),
            if policy.monitor { " (monitor)" } else { "" }
        )?;
        if let Some(g) = guid_text(policy) {
            writeln!(out, "    table of GUID {g}")?;
        }
        for (i, &p) in policy.pkeys.iter().enumerate() {
            let name = policy.names.get(i).map_or("", String::as_str);
            writeln!(out, "    [{i}] {:<36} {name}", describe::pkey(p))?;
        }
        for w in &policy.warnings {
            writeln!(out, "    warning: {w}")?;
        }
    }
    Ok(())
}

fn switch_json(switch: &SwitchPolicy) -> serde_json::Value {
    let ports: Vec<_> = switch
        .ports
        .iter()
        .map(|(iface, policy)| {
            let role = policy.switch.expect("a switch port has a role");
            json!({
                "interface": iface,
                "guid": guid_text(policy),
                "pkeys": policy.pkeys,
                "inbound": role.inbound,
                "outbound": role.outbound,
                "violation": if role.corrupt { "corrupt" } else { "drop" },
                "stamp": role.access,
                "mode": if policy.monitor { "monitor" } else { "enforce" },
                "warnings": policy.warnings,
            })
        })
        .collect();
    json!({"switch": {"ports": ports}})
}

fn guid_text(policy: &Policy) -> Option<String> {
    policy.guid.map(|g| format!("{g:#018x}"))
}

fn to_json(policy: &Policy) -> serde_json::Value {
    let qps: Vec<_> = policy
        .qps
        .iter()
        .map(|(qpn, r)| {
            json!({"qpn": qpn, "type": r.qp_type.name(), "pkey": r.pkey, "qkey": r.qkey})
        })
        .collect();
    let groups: Vec<_> = policy
        .groups
        .values()
        .map(|g| json!({"addr": g.addr.to_string(), "pkey": g.pkey, "qkey": g.qkey}))
        .collect();
    let binds: Vec<_> = policy
        .binds
        .iter()
        .map(|b| {
            json!({
                "line": b.line,
                "cgroup": b.cgroup.as_ref().map(|c| c.path.display().to_string()),
                "uid": b.uid,
                "gid": b.gid,
                "netns": b.netns.as_ref().map(|n| n.path.display().to_string()),
                "kernel": b.kernel,
                "comm": b.comm,
                "pid": b.pid,
                "qpn": b.qpns.as_ref().map(|r| [r.start(), r.end()]),
                "type": b.qp_type.map(|t| t.name()),
                "pkey": b.pkey,
                "qkey": b.qkey,
                "own_device": b.own.as_ref().map(|o| json!({
                    "name": o.name,
                    "interface": o.iface,
                    "addresses": o.addrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    "gateways": o.gateways,
                })),
            })
        })
        .collect();
    json!({
        "guid": guid_text(policy),
        "pkeys": policy.pkeys,
        "qps": qps,
        "groups": groups,
        "binds": binds,
        "warnings": policy.warnings,
    })
}

fn text(policy: &Policy, out: &mut impl Write) -> std::io::Result<()> {
    match guid_text(policy) {
        Some(g) => writeln!(out, "port GUID {g}")?,
        None => writeln!(out, "port GUID not given (not needed with `pkeys`)")?,
    }
    writeln!(out, "P_Key table:")?;
    for (i, &p) in policy.pkeys.iter().enumerate() {
        let name = policy.names.get(i).map_or("", String::as_str);
        writeln!(out, "  [{i}] {:<36} {name}", describe::pkey(p))?;
    }
    writeln!(
        out,
        "enforcement: {}, unknown QPs: {}, foreign multicast joins: {}",
        if policy.monitor { "monitor" } else { "enforce" },
        policy.unknown_qp.name(),
        policy.foreign_join.name()
    )?;
    writeln!(out, "QPs: {}", policy.qps.len())?;
    for (qpn, r) in &policy.qps {
        write!(
            out,
            "  {qpn:#08x} {:<3} P_Key {:#06x}",
            r.qp_type.name(),
            r.pkey
        )?;
        match r.qkey {
            Some(q) => writeln!(out, " Q_Key {q:#010x}")?,
            None => writeln!(out)?,
        }
    }
    writeln!(out, "groups: {}", policy.groups.len())?;
    for g in policy.groups.values() {
        writeln!(
            out,
            "  {:<39} P_Key {:#06x} Q_Key {:#010x}",
            g.addr, g.pkey, g.qkey
        )?;
    }
    writeln!(
        out,
        "bind rules: {} (first match wins; [[qp]] entries win over comm, pid, qpn and type rules)",
        policy.binds.len()
    )?;
    for (i, b) in policy.binds.iter().enumerate() {
        writeln!(
            out,
            "  bind[{i}] (line {}): {}",
            b.line,
            describe::bind_rule(b)
        )?;
    }
    writeln!(out, "warnings: {}", policy.warnings.len())?;
    for w in &policy.warnings {
        writeln!(out, "  {w}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use crate::policy::Policy;

    const BINDS: &str = "[port]\npkeys = [0xffff, 0x8001]\n\
        [[bind]]\ncomm = \"ibv_ud_pingpong\"\ntype = \"ud\"\npkey = 0x8001\nqkey = 0x11111111\n\
        [[bind]]\npid = 42\nqpn = [0x100, 0x1ff]\npkey_index = 0\n";

    #[test]
    fn bind_rules_in_text_and_json() {
        let policy = Policy::parse(Path::new("p.toml"), BINDS).unwrap();
        let mut text = Vec::new();
        super::text(&policy, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains("bind rules: 2")
                && text.contains(
                    "  bind[0] (line 3): comm ibv_ud_pingpong, type ud → P_Key 0x8001, Q_Key 0x11111111 (isolates nothing: any process can match it)\n"
                )
                && text.contains("  bind[1] (line 8): pid 42, QPNs 0x100..=0x1ff → P_Key 0xffff, UD QPs their own Q_Key (isolates nothing: any process can match it)\n"),
            "{text}"
        );
        assert_eq!(
            super::to_json(&policy)["binds"],
            json!([
                {"line": 3, "cgroup": null, "uid": null, "gid": null, "netns": null,
                 "kernel": false, "comm": "ibv_ud_pingpong", "pid": null, "qpn": null, "type": "ud",
                 "pkey": 0x8001, "qkey": 0x11111111, "own_device": null},
                {"line": 8, "cgroup": null, "uid": null, "gid": null, "netns": null,
                 "kernel": false, "comm": null, "pid": 42, "qpn": [0x100, 0x1ff], "type": null,
                 "pkey": 0xffff, "qkey": null, "own_device": null},
            ])
        );
    }
}
