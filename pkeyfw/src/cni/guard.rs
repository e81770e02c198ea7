//! The pod's Q_Key (`qkey`): a host attachment on the pod's own interface,
//! in its namespace, whose one rule binds every UD QP a process of that
//! namespace makes with the network's Q_Key pinned (`[[bind]] netns …
//! qkey`). A datagram arriving for one of the pod's UD QPs with another
//! Q_Key is dropped there (`qkey_violation`), whatever Q_Key the pod's
//! program set, as an HCA checks a UD QP's datagrams against its own; RC
//! and the other QPs are left to the bridge port (their frames arrive with
//! the default key the port restored, which `unknown_qp = "default-pkey"`
//! passes). A bridge port judges partitions, not receivers, so the Q_Key
//! is checked here, past it.
//!
//! Its policy is written beside the bridge's record (`pods/DEVICE.toml`)
//! and its pins are those of any attachment in a namespace
//! (`/sys/fs/bpf/pkeyfw/NETNS/IFACE`), found again by the namespace's
//! inode, which the record keeps for when the namespace is gone.

use std::{fs, path::PathBuf};

use anyhow::{Context as _, Result};

use super::node::{self, write_atomic};
use crate::{
    attachment::{self, Mode, Options, Say},
    host::netns::NetnsId,
    loading::pins::{Pins, State},
};

/// The policy of the guard of pod device `device`.
fn policy_path(device: &str) -> PathBuf {
    node::records().join("pods").join(format!("{device}.toml"))
}

/// The guard's policy: every UD QP made in namespace `netns` (a path)
/// bound with `qkey` pinned.
pub fn policy(netns: &str, qkey: u32) -> String {
    // The path as a TOML string, quoted and escaped whatever it holds.
    let path = toml::Value::String(netns.to_string());
    format!(
        "# The Q_Key of a pod, written by the pkeyfw CNI plugin.\n\
         [port]\npkeys = [0xffff]\n\n\
         [enforcement]\nunknown_qp = \"default-pkey\"\n\n\
         [[bind]]\nnetns = {path}\ntype = \"ud\"\npkey = 0xffff\nqkey = {qkey:#010x}\n"
    )
}

/// Attaches the guard of device `device` to the pod's `ifname` in
/// `netns`, pinned.
pub fn attach(device: &str, ifname: &str, netns: &str, qkey: u32) -> Result<()> {
    let path = policy_path(device);
    write_atomic(&path, &policy(netns, qkey))?;
    let attached = attachment::attach(
        ifname,
        Some(netns),
        &path,
        &Options::pinned(Mode::Auto),
        Say::STDERR,
    );
    if attached.is_err() {
        let _ = fs::remove_file(&path);
    }
    attached.with_context(|| format!("pinning the pod's Q_Key {qkey:#010x} on its {ifname}"))
}

/// Removes the guard of device `device` on `ifname` in the namespace of
/// inode `netns`, if there is one (also once the namespace is gone).
pub fn detach(device: &str, ifname: &str, netns: u64) -> Result<()> {
    let pins = Pins::at(ifname, NetnsId(netns));
    if pins.exists() {
        pins.remove()
            .with_context(|| format!("removing the pod's Q_Key guard on its {ifname}"))?;
    }
    match fs::remove_file(policy_path(device)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

/// Whether the guard on `ifname` in the namespace of inode `netns` is in
/// place: pinned and live.
pub fn attached(ifname: &str, netns: u64) -> bool {
    let pins = Pins::at(ifname, NetnsId(netns));
    pins.exists() && matches!(pins.state(), Ok(State::Live { .. }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guard's policy is one `pkeyfw attach` takes: its rule binds UD
    /// QPs of the namespace with the Q_Key pinned.
    #[test]
    fn the_policy_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pod.toml");
        fs::write(&path, policy("/proc/self/ns/net", 0x2222_2222)).unwrap();
        let odd: toml::Table = policy("/a\"b\nc", 1).parse().unwrap();
        assert_eq!(odd["bind"][0]["netns"].as_str(), Some("/a\"b\nc"));
        let p = crate::policy::Policy::load(&path).unwrap();
        assert_eq!(p.pkeys, [0xffff]);
        assert_eq!(p.binds.len(), 1);
        assert_eq!(p.binds[0].qkey, Some(0x2222_2222));
    }
}
