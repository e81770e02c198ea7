//! `pkeyfw stats`: counters per reason and per QP of running attachments,
//! read from their pinned maps (foreground and pinned alike).

use std::{io::Write, time::Duration};

use anyhow::{Result, bail};
use serde_json::json;

use super::NetnsArg;
use crate::reporting::describe::cli_iface;
use crate::{
    host::netlink::XdpMode,
    host::netns::{self, NetnsId},
    loading::maps::Maps,
    loading::pins::{self, Holder, Pins, State, record as tenants},
    reporting::snapshot::Snapshot,
};

/// One live attachment.
pub(crate) struct Live {
    pub pins: Pins,
    pub mode: XdpMode,
    pub holder: Holder,
    pub maps: Maps,
}

impl Live {
    /// Its counters, per QP too if `per_qp`.
    fn snapshot(&self, per_qp: bool) -> Result<Snapshot> {
        let read = match per_qp {
            true => Snapshot::read,
            false => Snapshot::summary,
        };
        Ok(read(
            &self.pins.iface,
            self.mode,
            self.holder == Holder::Pinned,
            &self.maps,
        )?
        .placed(self.holder, self.pins.netns)
        .bridged(&self.pins.iface, self.pins.netns, &self.maps)
        .noted(&self.pins))
    }
}

/// An attachment a `pkeyfw attach` is still loading.
pub struct SettingUp {
    pub iface: String,
    /// As the CLI names it (with its namespace).
    pub named: String,
    pub netns: NetnsId,
    pub pid: u32,
}

impl SettingUp {
    /// What `stats` and `events` say of it.
    pub fn text(&self) -> String {
        format!(
            "{}: being set up by `pkeyfw attach` (process {}); nothing to read until it is attached",
            self.named, self.pid
        )
    }

    pub fn json(&self) -> serde_json::Value {
        json!({"interface": self.iface, "state": "setting_up", "pid": self.pid})
    }
}

/// The attachments found: those that can be read, and those being set up.
#[derive(Default)]
pub(crate) struct Found {
    pub live: Vec<Live>,
    pub setting_up: Vec<SettingUp>,
}

/// Every live attachment's counters but those per QP, of every network
/// namespace (those that cannot be read are reported on stderr and left
/// out), and those being set up.
pub fn summaries() -> Result<(Vec<Snapshot>, Vec<SettingUp>)> {
    let found = attachments(None, None)?;
    let snaps = found
        .live
        .iter()
        .map(|a| a.snapshot(false))
        .collect::<Result<_>>()?;
    Ok((snaps, found.setting_up))
}

/// The live attachments named (in this process's network namespace), or
/// all (of every namespace, or of `--netns`'s), with their maps, and those
/// being set up.
pub(crate) fn attachments(iface: Option<&str>, netns: Option<&str>) -> Result<Found> {
    let all = match iface {
        // A tenant host: its tenants' ports.
        Some(i) if tenants::host(i).is_some() => tenants::host(i)
            .map(|(_, r)| r.devices.iter().map(|t| Pins::of(&t.made.iface)).collect())
            .unwrap_or_default(),
        Some(i) => {
            let pins = Pins::of(i);
            if !pins.exists() {
                bail!(
                    "{i} is not managed by pkeyfw (nothing under {})",
                    pins.dir.display()
                );
            }
            vec![pins]
        }
        None => Pins::list(match netns {
            Some(_) => Some(NetnsId::current()?),
            None => None,
        })?,
    };
    let mut found = Found::default();
    for pins in all {
        let ns = match NetnsId::current().ok() == Some(pins.netns) {
            true => netns.map(str::to_string),
            false if NetnsId::host().ok() == Some(pins.netns) => {
                Some(format!("/proc/{}/ns/net", netns::host_pid()))
            }
            false => Some(pins.netns.label()),
        };
        let named = cli_iface(&pins.iface, ns.as_deref());
        // Listing all, one attachment that cannot be read (being made or
        // removed by another process, or of another layout) is only named.
        let state = match pins.state() {
            Err(e) if iface.is_none() => {
                eprintln!("pkeyfw: {named}: {e:#}");
                continue;
            }
            other => other?,
        };
        match state {
            State::Live { mode, holder } => {
                let maps = match Maps::from_pins(&pins.dir) {
                    Err(e) if iface.is_none() => {
                        eprintln!("pkeyfw: {named}: {e:#}");
                        continue;
                    }
                    other => other?,
                };
                found.live.push(Live {
                    pins,
                    mode,
                    holder,
                    maps,
                });
            }
            State::SettingUp(pid) => found.setting_up.push(SettingUp {
                iface: pins.iface.clone(),
                named,
                netns: pins.netns,
                pid,
            }),
            State::Stale if iface.is_some() => bail!(
                "{} is not attached any more (its interface or namespace went away, or its links were removed); `pkeyfw detach {named}` removes what it left",
                pins.iface,
            ),
            State::Stale => eprintln!(
                "pkeyfw: {}: stale pins of an attachment that is gone (`pkeyfw detach {named}` removes them)",
                pins.iface
            ),
        }
    }
    Ok(found)
}

/// Counters per reason and per QP of running attachments.
///
/// Reads the maps of foreground and pinned attachments alike, and says
/// who holds each: pinned, a foreground process, or a foreground
/// process that is gone.
#[derive(clap::Args)]
pub struct StatsArgs {
    /// Only this interface (default: every attachment, of every network
    /// namespace unless --netns is given).
    pub iface: Option<String>,
    #[command(flatten)]
    pub netns: NetnsArg,
    /// One JSON object per interface.
    #[arg(long)]
    pub json: bool,
    /// Print again every SECONDS, until interrupted.
    #[arg(long, value_name = "SECONDS")]
    pub watch: Option<f64>,
}

pub fn run(args: &StatsArgs) -> Result<()> {
    let netns = args.netns.enter()?;
    let (iface, json, watch) = (args.iface.as_deref(), args.json, args.watch);
    pins::host_bpffs("stats")?;
    let mut out = std::io::stdout().lock();
    loop {
        let found = attachments(iface, netns)?;
        let hosts = hosts(iface);
        if found.live.is_empty() && found.setting_up.is_empty() && hosts.is_empty() && !json {
            writeln!(out, "no pkeyfw attachments")?;
        }
        for (pins, record) in &hosts {
            match json {
                true => writeln!(out, "{}", host_json(pins, record))?,
                false => host_text(&mut out, pins, record, netns)?,
            }
        }
        for s in &found.setting_up {
            match json {
                true => writeln!(out, "{}", s.json())?,
                false => writeln!(out, "{}", s.text())?,
            }
        }
        for a in &found.live {
            let snap = a.snapshot(true)?;
            if json {
                writeln!(out, "{}", snap.json())?;
            } else {
                snap.text(&mut out)?;
            }
        }
        out.flush()?;
        let Some(period) = watch else {
            return Ok(());
        };
        std::thread::sleep(Duration::from_secs_f64(period));
        if !json {
            writeln!(out)?;
        }
    }
}

/// The tenant hosts `stats` shows: `iface`'s, or all of this namespace's.
fn hosts(iface: Option<&str>) -> Vec<(Pins, tenants::Record)> {
    let current = NetnsId::current().ok();
    match iface {
        Some(i) => tenants::host(i).into_iter().collect(),
        None => tenants::everywhere()
            .into_iter()
            .filter(|(p, _)| Some(p.netns) == current)
            .collect(),
    }
}

/// A tenant host's lines: who holds it, and each tenant's device.
fn host_text(
    out: &mut impl Write,
    pins: &Pins,
    record: &tenants::Record,
    netns: Option<&str>,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{}: uplink of {} tenants' own devices ({}), no filter of its own",
        cli_iface(&pins.iface, netns),
        record.devices.len(),
        pins.holder().describe()
    )?;
    for t in &record.devices {
        let d = &t.made;
        writeln!(
            out,
            "  {} on {} ({}, MAC {}): the tenant of the rule at line {}, P_Key {:#06x}",
            d.device,
            d.iface,
            d.addrs.join(", "),
            d.mac,
            t.line,
            t.pkey
        )?;
    }
    writeln!(out)
}

fn host_json(pins: &Pins, record: &tenants::Record) -> serde_json::Value {
    json!({
        "interface": pins.iface,
        "tenant_host": {
            "holder": pins.holder().describe(),
            "devices": record.devices,
        },
    })
}
