//! `pkeyfw detach`: removes a pinned attachment and everything it pinned.

use anyhow::{Result, bail};

use crate::loading::pins::{Pins, State};

/// Remove a pinned attachment (`attach --pin`) and its pins.
#[derive(clap::Args)]
pub struct DetachArgs {
    pub iface: String,
}

pub fn run(args: &DetachArgs) -> Result<()> {
    let iface = args.iface.as_str();
    let pins = Pins::of(iface);
    if !pins.exists() {
        bail!(
            "{iface} has no pinned pkeyfw attachment (nothing under {})",
            pins.dir.display()
        );
    }
    if let State::Live { pinned: false, .. } = pins.state()? {
        bail!(
            "{iface} is held by a foreground `pkeyfw attach`; stop that process (Ctrl-C or SIGTERM) to detach"
        );
    }
    pins.remove()?;
    println!("detached from {iface}");
    Ok(())
}
