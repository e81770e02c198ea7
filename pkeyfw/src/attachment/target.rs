//! A running attachment found by its interface, and the policy to switch
//! it to, validated in full: what `pkeyfw reload` and a switch's reload
//! of its ports start from.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::{
    loading::{
        maps::Maps,
        pins::{self, Holder, Pins, PolicyEvent, State},
    },
    policy::Policy,
    reporting::describe::cli_iface,
};

/// A running attachment and the policy to switch it to, validated.
pub struct Target {
    pub pins: Pins,
    pub holder: Holder,
    pub maps: Maps,
    pub policy: Policy,
    /// The policy's file.
    pub path: PathBuf,
}

/// The attachment on `iface` (in this network namespace, `netns` as the
/// user gave it) and `policy` for it (default: the file it runs), validated
/// in full; a policy refused is noted against it.
pub fn target(iface: &str, policy: Option<&Path>, netns: Option<&str>) -> Result<Target> {
    pins::host_bpffs("reload")?;
    let pins = Pins::of(iface);
    if !pins.exists() {
        bail!(
            "{iface} is not managed by pkeyfw (nothing under {})",
            pins.dir.display()
        );
    }
    let State::Live { holder, .. } = pins.state()? else {
        bail!(
            "{iface} is not attached any more; `pkeyfw detach {}` removes what is left",
            cli_iface(iface, netns)
        );
    };
    let path: PathBuf = match policy {
        Some(p) => p.to_path_buf(),
        None => pins.remembered_policy()?,
    };
    let policy = match Policy::load_port(&path, iface, Some(crate::host::iface::guid(iface)?)) {
        Ok(p) => p,
        Err(e) => {
            pins.note_policy(PolicyEvent::Refused);
            return Err(e.into());
        }
    };
    let maps = Maps::from_pins(&pins.dir)?;
    if let Err(e) = maps.same_role(&policy) {
        pins.note_policy(PolicyEvent::Refused);
        return Err(e);
    }
    Ok(Target {
        pins,
        holder,
        maps,
        policy,
        path,
    })
}
