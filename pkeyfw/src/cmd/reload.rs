//! `pkeyfw reload`: switch a running attachment to a new policy, validated in
//! full first; an invalid one changes nothing.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::{
    maps::Maps,
    pins::{Pins, State},
    policy::Policy,
};

pub fn run(iface: &str, policy: Option<&Path>) -> Result<()> {
    let pins = Pins::of(iface);
    if !pins.exists() {
        bail!(
            "{iface} is not managed by pkeyfw (nothing under {})",
            pins.dir.display()
        );
    }
    if pins.state()? == State::Stale {
        bail!("{iface} is not attached any more; `pkeyfw detach {iface}` removes what is left");
    }
    let path: PathBuf = match policy {
        Some(p) => p.to_path_buf(),
        None => pins.remembered_policy()?,
    };
    let policy = Policy::load_for(&path, Some(super::iface_guid(iface)?))?;
    let mut maps = Maps::from_pins(&pins.dir)?;
    maps.apply(&policy)?;
    pins.remember_policy(&path)?;
    println!(
        "pkeyfw: {iface} now runs {} ({} QPs, {} groups)",
        path.display(),
        policy.qps.len(),
        policy.groups.len()
    );
    Ok(())
}
