//! Detaching: an attachment and everything it pinned removed (a pinned
//! one, one whose foreground process is gone, or what an exited one
//! left); of a tenant host, every tenant's device and port too. A running
//! foreground attachment is stopped by its process instead.

use anyhow::{Result, bail};

use super::{Say, enter, tenants};
use crate::{
    loading::pins::record,
    loading::pins::{self, Holder, Pins, State},
    reporting::describe::cli_iface,
};

/// What a detach removed.
#[derive(Debug, PartialEq, Eq)]
pub enum Detached {
    Attachment,
    /// A tenant host: the tenants' devices, their ports and the guard.
    TenantHost,
}

impl Detached {
    /// What it says of `iface` (as the command line names it).
    pub fn line(&self, iface: &str) -> String {
        match self {
            Detached::Attachment => format!("detached from {iface}"),
            Detached::TenantHost => format!(
                "detached from {iface}: the tenants' devices, their ports and the device guard are gone"
            ),
        }
    }
}

/// Detaches `iface` of network namespace `netns` and says so.
pub(super) fn detach_saying(iface: &str, netns: Option<&str>, say: Say) -> Result<()> {
    let detached = detach(iface, netns)?;
    out!(say, "{}", detached.line(&cli_iface(iface, netns)));
    Ok(())
}

/// Detaches `iface` of network namespace `netns` (None: this thread's).
pub fn detach(iface: &str, netns: Option<&str>) -> Result<Detached> {
    let _entered = enter(netns)?;
    pins::host_bpffs("detach")?;
    if record::host(iface).is_some() {
        tenants::detach(iface)?;
        return Ok(Detached::TenantHost);
    }
    let pins = Pins::of(iface);
    // A tenant's port goes with its device, never alone: its device would
    // go on unjudged.
    if let Some((uplink, t)) = record::port_of(iface, pins.netns) {
        bail!(
            "{iface} is the port of {}, a tenant's own device on uplink {uplink}; `pkeyfw detach {}` removes the tenants' devices with their ports",
            t.made.device,
            cli_iface(&uplink, netns)
        );
    }
    if !pins.exists() {
        bail!(
            "{iface} has no pinned pkeyfw attachment (nothing under {})",
            pins.dir.display()
        );
    }
    match pins.state() {
        Ok(State::Live {
            holder: Holder::Foreground(pid),
            ..
        }) => bail!(
            "{iface} is held by a foreground `pkeyfw attach` (process {pid}); stop that process (Ctrl-C or SIGTERM) to detach"
        ),
        Ok(State::SettingUp(pid)) => bail!(
            "{iface} is being set up by `pkeyfw attach` (process {pid}); detach once it has attached, or stop that process"
        ),
        _ => {}
    }
    pins.remove()?;
    Ok(Detached::Attachment)
}
