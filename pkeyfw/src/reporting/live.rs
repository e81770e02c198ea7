//! The attachments live on this host, found from their pins (of every
//! network namespace, or of one), with their maps, and those still being
//! set up: what `stats`, `events` and the metrics read.

use anyhow::{Result, bail};
use serde_json::json;

use crate::{
    host::{
        netlink::XdpMode,
        netns::{self, NetnsId},
    },
    loading::{
        maps::Maps,
        pins::{Holder, Pins, State, record as tenants},
    },
    reporting::{describe::cli_iface, snapshot::Snapshot},
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
    pub fn snapshot(&self, per_qp: bool) -> Result<Snapshot> {
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
