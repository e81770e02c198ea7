//! `pkeyfw stats`: counters per reason and per QP of running attachments,
//! read from their pinned maps (foreground and pinned alike).

use std::{io::Write, time::Duration};

use anyhow::{Result, bail};
use pkeyfw_common::{Stamp, abi::QpStats};
use serde_json::json;

use crate::{
    control::netlink::XdpMode,
    loading::maps::{Maps, ReasonCounts, StampCounts},
    loading::pins::{Pins, State},
    reporting::describe,
};

/// One attachment's counters at one moment.
pub struct Snapshot {
    pub iface: String,
    pub mode: XdpMode,
    pub pinned: bool,
    pub reasons: ReasonCounts,
    pub qps: Vec<(u32, QpStats)>,
    /// Whether the active policy stamps.
    pub stamping: bool,
    pub stamps: StampCounts,
}

impl Snapshot {
    pub fn read(iface: &str, mode: XdpMode, pinned: bool, maps: &Maps) -> Result<Snapshot> {
        Ok(Snapshot {
            iface: iface.to_string(),
            mode,
            pinned,
            reasons: maps.reasons()?,
            qps: maps.qp_counters()?,
            stamping: maps.stamping()?,
            stamps: maps.stamps()?,
        })
    }

    /// Stamping is shown while on, or while its counters say it was.
    fn shows_stamps(&self) -> bool {
        self.stamping || self.stamps.iter().any(|&n| n != 0)
    }

    /// The documented JSON object.
    pub fn json(&self) -> serde_json::Value {
        let reasons = describe::reasons_json(&self.reasons);
        let qps: Vec<_> = self
            .qps
            .iter()
            .map(|(qpn, s)| json!({"qpn": qpn, "passed": s.passed, "dropped": s.dropped}))
            .collect();
        let mut out = json!({"interface": self.iface, "mode": self.mode.name(), "reasons": reasons, "qps": qps});
        if self.shows_stamps() {
            let counts: serde_json::Map<_, _> = Stamp::ALL
                .iter()
                .map(|s| (s.name().to_string(), json!(self.stamps[s.index() as usize])))
                .collect();
            out["stamping"] = json!({"on": self.stamping, "frames": counts});
        }
        out
    }

    pub fn text(&self, out: &mut impl Write) -> std::io::Result<()> {
        let how = if self.pinned { "pinned" } else { "foreground" };
        let total: u64 = self.reasons.iter().sum();
        writeln!(
            out,
            "{}  {} mode, {how}: {total} frames",
            self.iface,
            self.mode.name()
        )?;
        describe::reasons_text(&self.reasons, out)?;
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
        if !self.qps.is_empty() {
            writeln!(out, "  {:<10} {:>12} {:>12}", "QP", "passed", "dropped")?;
            for (qpn, s) in &self.qps {
                writeln!(out, "  {:<#10x} {:>12} {:>12}", qpn, s.passed, s.dropped)?;
            }
        }
        Ok(())
    }
}

/// The live attachments named (or all), with their maps.
fn attachments(iface: Option<&str>) -> Result<Vec<(Pins, XdpMode, bool, Maps)>> {
    let all = match iface {
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
        None => Pins::list()?,
    };
    let mut live = Vec::new();
    for pins in all {
        match pins.state()? {
            State::Live { mode, pinned } => {
                let maps = Maps::from_pins(&pins.dir)?;
                live.push((pins, mode, pinned, maps));
            }
            State::Stale if iface.is_some() => bail!(
                "{} is not attached any more (its foreground pkeyfw exited without cleaning up); `pkeyfw detach {}` removes what it left",
                pins.iface,
                pins.iface
            ),
            State::Stale => eprintln!(
                "pkeyfw: {}: stale pins of an exited attachment (`pkeyfw detach {}` removes them)",
                pins.iface, pins.iface
            ),
        }
    }
    Ok(live)
}

/// Counters per reason and per QP of running attachments.
///
/// Reads the maps of foreground and pinned attachments alike.
#[derive(clap::Args)]
pub struct StatsArgs {
    /// Only this interface (default: every attachment).
    pub iface: Option<String>,
    /// One JSON object per interface.
    #[arg(long)]
    pub json: bool,
    /// Print again every SECONDS, until interrupted.
    #[arg(long, value_name = "SECONDS")]
    pub watch: Option<f64>,
}

pub fn run(args: &StatsArgs) -> Result<()> {
    let (iface, json, watch) = (args.iface.as_deref(), args.json, args.watch);
    let mut out = std::io::stdout().lock();
    loop {
        let live = attachments(iface)?;
        if live.is_empty() && !json {
            writeln!(out, "no pkeyfw attachments")?;
        }
        for (pins, mode, pinned, maps) in &live {
            let snap = Snapshot::read(&pins.iface, *mode, *pinned, maps)?;
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
