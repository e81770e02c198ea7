//! One attachment's counters at one moment, read from its maps, as
//! `stats` prints them, `attach` prints them on exit, the metrics serve them
//! and the lab shows them.

use std::io::Write;

use anyhow::{Context as _, Result};
use pkeyfw_common::{
    Capture, Reason, Stamp,
    abi::{EventKind, OTHER_PARTITION, QpStats},
};
use serde_json::json;

use crate::{
    host::{
        bridge::{self, Bridge},
        netlink::XdpMode,
        netns::NetnsId,
    },
    loading::maps::{CaptureCounts, Maps, ReasonCounts, StampCounts, SuppressedCounts},
    loading::pins::{
        Holder, Pins, PolicyRecord,
        record::{self as tenants, Tenant},
    },
    reporting::describe,
};

/// One attachment's counters at one moment.
pub struct Snapshot {
    pub iface: String,
    pub mode: XdpMode,
    pub pinned: bool,
    pub reasons: ReasonCounts,
    /// A switch port's outbound counters (its inbound ones are `reasons`).
    pub switch: Option<ReasonCounts>,
    /// A switch port's bridge, with the ports of it that its policy does
    /// not list (None: a router's port, or not known).
    pub bridge: Option<Bridge>,
    pub qps: Vec<(u32, QpStats)>,
    /// Whether the active policy stamps.
    pub stamping: bool,
    pub stamps: StampCounts,
    /// What the RDMA-core probes saw (bindings, Q_Keys, joins).
    pub captures: CaptureCounts,
    /// Events the kernel's per-kind budgets held back.
    pub suppressed: SuppressedCounts,
    /// Events per kind the budget let through that found their ring full.
    pub lost: SuppressedCounts,
    /// P_Key and Q_Key violations per partition: (reason, partition, frames).
    pub violations: Vec<(Reason, u16, u64)>,
    /// Who holds it, when known (else `pinned` says).
    pub holder: Option<Holder>,
    /// The network namespace to show, when not the host's.
    pub netns: Option<String>,
    /// QPs the live policy binds by what binds them: `[[qp]]` entries,
    /// rules applied by pkeyfw, rules applied by the QP-creation probe.
    pub bound_by: [(&'static str, u64); 3],
    /// QPs in quarantine: a rule would bind them, the QP-creation probe had
    /// no room (their frames are refused).
    pub quarantined: Vec<u32>,
    /// `netns` rules (index, cookie) whose namespace is gone.
    pub gone_netns: Vec<(usize, u64)>,
    /// The live generation, the policy file and its history, when known.
    pub generation: u32,
    pub policy_file: Option<std::path::PathBuf>,
    pub record: PolicyRecord,
    /// A tenant's own device's port: its uplink and device.
    pub tenant: Option<(String, Tenant)>,
}

impl Snapshot {
    pub fn read(iface: &str, mode: XdpMode, pinned: bool, maps: &Maps) -> Result<Snapshot> {
        Ok(Snapshot {
            qps: maps.qp_counters()?,
            ..Snapshot::summary(iface, mode, pinned, maps)?
        })
    }

    /// Without the per-QP counters, whose reading grows with the QPs: what
    /// a scrape needs.
    pub fn summary(iface: &str, mode: XdpMode, pinned: bool, maps: &Maps) -> Result<Snapshot> {
        Ok(Snapshot {
            iface: iface.to_string(),
            mode,
            pinned,
            reasons: maps.reasons()?,
            switch: match maps.switch_port()? {
                true => Some(maps.xmit_reasons()?),
                false => None,
            },
            bridge: None,
            qps: Vec::new(),
            stamping: maps.stamping()?,
            stamps: maps.stamps()?,
            captures: maps.captures()?,
            suppressed: maps.suppressed()?,
            lost: maps.lost()?,
            violations: maps.violations()?,
            holder: None,
            netns: None,
            bound_by: maps.bound_by()?,
            quarantined: maps.quarantined()?,
            gone_netns: maps.gone_netns_rules()?,
            generation: maps.active_generation()?,
            policy_file: None,
            record: PolicyRecord::default(),
            tenant: None,
        })
    }

    /// With the policy file and history its pins' notes keep.
    pub fn noted(mut self, pins: &Pins) -> Snapshot {
        self.policy_file = pins.remembered_policy().ok();
        self.record = pins.record();
        self.tenant = tenants::port_of(&pins.iface, pins.netns);
        self
    }

    /// With the bridge a switch port is in, looked up in its namespace.
    pub fn bridged(mut self, iface: &str, netns: NetnsId, maps: &Maps) -> Snapshot {
        if self.switch.is_some() {
            let found = maps.listed().and_then(|listed| {
                let ns = netns.find().context("its network namespace")?;
                ns.run(|| bridge::of_port(iface, &listed))?
            });
            self.bridge = found.unwrap_or_else(|e| {
                eprintln!("pkeyfw: {iface}: cannot tell its bridge: {e:#}");
                None
            });
        }
        self
    }

    /// With who holds it and, unless the host's, its network namespace.
    pub fn placed(mut self, holder: Holder, netns: NetnsId) -> Snapshot {
        self.holder = Some(holder);
        self.pinned = holder == Holder::Pinned;
        self.netns = netns.unless_host();
        self
    }

    /// Who holds it: "pinned", "foreground (pid N)", ….
    pub fn held(&self) -> String {
        match self.holder {
            Some(h) => h.describe(),
            None if self.pinned => "pinned".to_string(),
            None => "foreground".to_string(),
        }
    }

    /// Stamping is shown while on, or while its counters say it was.
    fn shows_stamps(&self) -> bool {
        self.stamping || self.stamps.iter().any(|&n| n != 0)
    }

    /// The RDMA probes' counters are shown once they counted anything.
    fn shows_captures(&self) -> bool {
        self.captures.iter().any(|&n| n != 0)
    }

    /// The documented JSON object.
    pub fn json(&self) -> serde_json::Value {
        let reasons = describe::reasons_json(&self.reasons);
        let qps: Vec<_> = self
            .qps
            .iter()
            .map(|(qpn, s)| json!({"qpn": qpn, "passed": s.passed, "dropped": s.dropped}))
            .collect();
        let verdicts = describe::verdicts_json(&self.reasons);
        let mut out = json!({"interface": self.iface, "mode": self.mode.name(), "reasons": reasons, "verdicts": &verdicts, "qps": qps});
        out["netns"] = json!(self.netns);
        out["held"] = json!(self.held());
        if let Some(xmit) = &self.switch {
            // InfiniBand's names: frames a port refused, per direction.
            out["switch"] = json!({
                "port_rcv_constraint_errors": self.reasons.refused(),
                "port_xmit_constraint_errors": xmit.refused(),
                "inbound": verdicts,
                "outbound": describe::verdicts_json(xmit),
                "bridge": self.bridge.as_ref().map(|b| &b.name),
                "unlisted_ports": self.bridge.as_ref().map_or(&[][..], |b| &b.unlisted),
            });
        }
        if let Some(Holder::Foreground(pid) | Holder::Gone(pid)) = self.holder {
            out["process"] =
                json!({"pid": pid, "running": matches!(self.holder, Some(Holder::Foreground(_)))});
        }
        if self.shows_stamps() {
            let counts: serde_json::Map<_, _> = Stamp::ALL
                .iter()
                .map(|s| (s.name().to_string(), json!(self.stamps[s.index() as usize])))
                .collect();
            out["stamping"] = json!({"on": self.stamping, "frames": counts});
        }
        let violations: Vec<_> = self
            .violations
            .iter()
            .map(|&(r, p, n)| {
                // null: keys the port's table does not hold.
                let partition = (p != OTHER_PARTITION).then_some(p);
                json!({"reason": r.name(), "partition": partition, "frames": n})
            })
            .collect();
        out["violations"] = violations.into();
        if self.shows_captures() {
            let counts: serde_json::Map<_, _> = Capture::ALL
                .iter()
                .map(|c| {
                    (
                        c.name().to_string(),
                        json!(self.captures[c.index() as usize]),
                    )
                })
                .collect();
            out["probes"] = counts.into();
        }
        out["bound_by"] = self
            .bound_by
            .iter()
            .map(|&(by, n)| (by.to_string(), json!(n)))
            .collect::<serde_json::Map<_, _>>()
            .into();
        out["events_suppressed"] = EventKind::ALL
            .iter()
            .map(|k| {
                (
                    k.name().to_string(),
                    json!(self.suppressed[k.index() as usize]),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into();
        out["events_lost"] = EventKind::ALL
            .iter()
            .map(|k| (k.name().to_string(), json!(self.lost[k.index() as usize])))
            .collect::<serde_json::Map<_, _>>()
            .into();
        out["quarantined"] = json!(self.quarantined);
        out["gone_netns_rules"] = self
            .gone_netns
            .iter()
            .map(|(i, cookie)| json!({"rule": i + 1, "cookie": cookie}))
            .collect();
        out["policy"] = json!({
            "file": self.policy_file,
            "generation": self.generation,
            "applied_at": (self.record.applied_at > 0).then_some(self.record.applied_at),
            "reloads": {"applied": self.record.reloaded, "refused": self.record.refused},
        });
        if let Some((uplink, t)) = &self.tenant {
            out["tenant_device"] = json!({
                "uplink": uplink,
                "device": t.made.device,
                "addresses": t.made.addrs,
                "pkey": t.pkey,
                "rule_line": t.line,
            });
        }
        out
    }

    pub fn text(&self, out: &mut impl Write) -> std::io::Result<()> {
        let how = self.held();
        let total: u64 = Reason::ALL.iter().map(|&r| self.reasons.total(r)).sum();
        let netns = match &self.netns {
            Some(ns) => format!(" (netns {ns})"),
            None => String::new(),
        };
        match &self.switch {
            None => {
                writeln!(
                    out,
                    "{}{netns}  {} mode, {how}: {total} frames",
                    self.iface,
                    self.mode.name()
                )?;
                if let Some((uplink, t)) = &self.tenant {
                    writeln!(
                        out,
                        "  the port of {}, the own device of the rule at line {} (P_Key {:#06x}) on uplink {uplink}",
                        t.made.device, t.line, t.pkey
                    )?;
                }
                describe::reasons_text(&self.reasons, out)?;
            }
            Some(xmit) => {
                let sent: u64 = Reason::ALL.iter().map(|&r| xmit.total(r)).sum();
                writeln!(
                    out,
                    "{}{netns}  switch port, {} mode, {how}: {total} frames in, {sent} out",
                    self.iface,
                    self.mode.name()
                )?;
                writeln!(
                    out,
                    "  PortRcvConstraintErrors {}, PortXmitConstraintErrors {}",
                    self.reasons.refused(),
                    xmit.refused()
                )?;
                match &self.bridge {
                    Some(b) if !b.unlisted.is_empty() => writeln!(
                        out,
                        "  {b} (their RoCE reaches none of the switch's ports until listed)"
                    )?,
                    Some(b) => writeln!(out, "  bridge {}: every port listed", b.name)?,
                    None => {}
                }
                writeln!(out, "  inbound (received on the port):")?;
                describe::reasons_text(&self.reasons, out)?;
                writeln!(out, "  outbound (forwarded out of it):")?;
                describe::reasons_text(xmit, out)?;
            }
        }
        if self.shows_stamps() {
            let on = if self.stamping { "on" } else { "off" };
            writeln!(out, "  stamping ({on}):")?;
            for s in Stamp::ALL {
                writeln!(
                    out,
                    "    {:<14} {:>12}",
                    s.name(),
                    self.stamps[s.index() as usize]
                )?;
            }
        }
        if self.shows_captures() {
            writeln!(out, "  RDMA probes (verbs):")?;
            for c in Capture::ALL {
                writeln!(
                    out,
                    "    {:<14} {:>12}",
                    c.name(),
                    self.captures[c.index() as usize]
                )?;
            }
        }
        if !self.violations.is_empty() {
            writeln!(out, "  violations by partition:")?;
            for (r, p, n) in &self.violations {
                writeln!(
                    out,
                    "    {:<14} {:<6} {:>12}",
                    r.name(),
                    describe::violation_partition(*p),
                    n
                )?;
            }
        }
        for (counts, what) in [
            (
                &self.suppressed,
                "events over the kernel's budget (counted, not sent)",
            ),
            (
                &self.lost,
                "events lost, their ring full (counted, not sent; is a reader keeping up?)",
            ),
        ] {
            let held: Vec<String> = EventKind::ALL
                .iter()
                .filter(|k| counts[k.index() as usize] != 0)
                .map(|k| format!("{} {}", k.name(), counts[k.index() as usize]))
                .collect();
            if !held.is_empty() {
                writeln!(out, "  {what}: {}", held.join(", "))?;
            }
        }
        if !self.quarantined.is_empty() {
            let qps: Vec<String> = self.quarantined.iter().map(|q| format!("{q:#x}")).collect();
            writeln!(
                out,
                "  quarantined QPs ({}; no room at creation, their frames refused): {}",
                qps.len(),
                qps.join(" ")
            )?;
        }
        for (i, cookie) in &self.gone_netns {
            writeln!(
                out,
                "  [[bind]] rule {}: its network namespace (cookie {cookie}) is gone; it matches nothing",
                i + 1
            )?;
        }
        if !self.qps.is_empty() {
            writeln!(out, "  {:<10} {:>12} {:>12}", "QP", "passed", "dropped")?;
            for (qpn, s) in &self.qps {
                writeln!(out, "  {:<#10x} {:>12} {:>12}", qpn, s.passed, s.dropped)?;
            }
        }
        Ok(())
    }
}
