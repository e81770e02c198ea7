//! `pkeyfw detach`: removes an attachment and everything it pinned: a pinned
//! one (`attach --pin`), one whose foreground process is gone, or what an
//! exited one left; of a tenant host, every tenant's device and port too.
//! A running foreground attach is stopped with Ctrl-C or SIGTERM instead.

use anyhow::{Result, bail};

use super::NetnsArg;
use crate::attachment::tenants;
use crate::loading::pins::{self, Holder, Pins, State, record};
use crate::reporting::describe::cli_iface;

/// Remove an attachment and its pins: a pinned one (`attach --pin`) or
/// one whose foreground process is gone.
#[derive(clap::Args)]
pub struct DetachArgs {
    pub iface: String,
    #[command(flatten)]
    pub netns: NetnsArg,
}

/// Detaches `iface` of the network namespace `--netns` names (or this one).
pub fn run(args: &DetachArgs) -> Result<()> {
    let netns = args.netns.enter()?;
    let iface = args.iface.as_str();
    pins::host_bpffs("detach")?;
    if record::host(iface).is_some() {
        tenants::detach(iface)?;
        println!(
            "detached from {}: the tenants' devices, their ports and the device guard are gone",
            cli_iface(iface, netns)
        );
        return Ok(());
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
    println!("detached from {}", cli_iface(iface, netns));
    Ok(())
}
