//! `pkeyfw detach`: removes a pinned attachment and everything it pinned.

use anyhow::{Result, bail};

use crate::loading::pins::{Pins, State};

pub fn run(iface: &str) -> Result<()> {
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
