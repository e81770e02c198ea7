//! `pkeyfw policy check`: what a policy gives this port — the GUID used, the
//! P_Key table, the bound QPs and groups, and every warning.

use std::{io::Write, path::Path};

use anyhow::Result;
use serde_json::json;

use crate::{describe, policy::Policy};

pub fn check(path: &Path, guid: Option<u64>, json: bool) -> Result<()> {
    let policy = Policy::load_for(path, guid)?;
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", to_json(&policy))?;
    } else {
        text(&policy, &mut out)?;
    }
    Ok(())
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
    json!({
        "guid": guid_text(policy),
        "pkeys": policy.pkeys,
        "qps": qps,
        "groups": groups,
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
        "enforcement: {}, unknown QPs: {}",
        if policy.monitor { "monitor" } else { "enforce" },
        policy.unknown_qp.name()
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
    writeln!(out, "warnings: {}", policy.warnings.len())?;
    for w in &policy.warnings {
        writeln!(out, "  {w}")?;
    }
    Ok(())
}
