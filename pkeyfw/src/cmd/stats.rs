//! `pkeyfw stats`: counters per reason and per QP of running attachments,
//! read from their pinned maps (foreground and pinned alike).

use std::{io::Write, time::Duration};

use anyhow::Result;
use serde_json::json;

use super::NetnsArg;
use crate::reporting::describe::cli_iface;
use crate::{
    host::netns::NetnsId,
    loading::pins::{self, Pins, record as tenants},
    reporting::live::attachments,
};

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
