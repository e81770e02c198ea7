//! The previous plugin's result (`prevResult`): where the pod's interface
//! and its host side are, and this plugin's result, which is that one with
//! the pod's RDMA device added.
//!
//! A CNI result has no type for an RDMA device, so the device is listed as
//! an interface of the pod (`name`, `sandbox`, and as `mac` the pod
//! interface's, its RoCE port's link-layer address: podman reads a MAC of
//! every interface with a sandbox), placed before the pod's network
//! interface: runtimes and Multus take the last interface with a sandbox
//! for the pod's interface (its name and MAC in the network status), which
//! stays the network interface. The `ips` that point into the list are
//! renumbered to match.

use serde_json::{Value, json};

use super::protocol::CniError;

/// What `prevResult.interfaces` says of the attachment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The pod's interface, by position.
    pub pod: usize,
    /// The interfaces on the host (no sandbox): the bridge, the pod's
    /// bridge port among them.
    pub host: Vec<String>,
}

/// Finds the pod's interface `ifname` (in `netns`) and the host's
/// interfaces in `prev`.
pub fn interfaces(prev: &Value, ifname: &str, netns: &str) -> Result<Listed, CniError> {
    let Some(list) = prev.get("interfaces").and_then(Value::as_array) else {
        return Err(CniError::config(
            "prevResult.interfaces",
            "missing",
            "expected the interfaces the plugin before pkeyfw made (list pkeyfw after `bridge` in the conflist)",
        ));
    };
    fn name(i: &Value) -> &str {
        i.get("name").and_then(Value::as_str).unwrap_or("")
    }
    fn sandbox(i: &Value) -> &str {
        i.get("sandbox").and_then(Value::as_str).unwrap_or("")
    }
    let candidates: Vec<usize> = (0..list.len())
        .filter(|&i| name(&list[i]) == ifname && !sandbox(&list[i]).is_empty())
        .collect();
    let pod = candidates
        .iter()
        .copied()
        .find(|&i| sandbox(&list[i]) == netns)
        .or_else(|| (candidates.len() == 1).then(|| candidates[0]))
        .ok_or_else(|| {
            CniError::config(
                "prevResult.interfaces",
                format!("no interface {ifname} in the pod's namespace {netns}"),
                "expected the pod's interface (CNI_IFNAME, with CNI_NETNS as its sandbox) from the plugin before pkeyfw, such as bridge",
            )
        })?;
    let host = list
        .iter()
        .filter(|i| sandbox(i).is_empty() && !name(i).is_empty())
        .map(|i| name(i).to_string())
        .collect();
    Ok(Listed { pod, host })
}

/// `prev` as this plugin's result, in `version`: the pod's RDMA device
/// `device` listed in `netns`, before the pod's interface (at `pod`).
pub fn with_device(prev: &Value, version: &str, pod: usize, device: &str, netns: &str) -> Value {
    let mut result = prev.clone();
    result["cniVersion"] = json!(version);
    if let Some(list) = result.get_mut("interfaces").and_then(Value::as_array_mut) {
        let mut entry = json!({ "name": device, "sandbox": netns });
        if let Some(mac) = list.get(pod).and_then(|i| i.get("mac")) {
            entry["mac"] = mac.clone();
        }
        list.insert(pod, entry);
    }
    if let Some(ips) = result.get_mut("ips").and_then(Value::as_array_mut) {
        for ip in ips {
            if let Some(at) = ip.get("interface").and_then(Value::as_u64)
                && at >= pod as u64
            {
                ip["interface"] = json!(at + 1);
            }
        }
    }
    result
}

/// The RDMA device a result of this plugin lists for the pod: the entry
/// right before the pod's interface that [`with_device`] put there.
pub fn device(result: &Value, ifname: &str, netns: &str) -> Option<String> {
    let listed = interfaces(result, ifname, netns).ok()?;
    let list = result.get("interfaces")?.as_array()?;
    let entry = list.get(listed.pod.checked_sub(1)?)?;
    (entry.get("sandbox").and_then(Value::as_str) == Some(netns))
        .then(|| entry.get("name")?.as_str().map(str::to_string))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the bridge plugin returns (0.4.0 carries `version` in `ips`).
    fn bridge() -> Value {
        json!({
            "cniVersion": "0.4.0",
            "interfaces": [
                {"name": "roce0", "mac": "aa:00:00:00:00:01"},
                {"name": "veth1a2b3c4d", "mac": "aa:00:00:00:00:02"},
                {"name": "eth0", "mac": "aa:00:00:00:00:03", "sandbox": "/run/netns/a"},
            ],
            "ips": [{"version": "4", "address": "10.77.0.2/24", "gateway": "10.77.0.1", "interface": 2}],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {},
        })
    }

    #[test]
    fn the_pods_interface_and_the_hosts() {
        let listed = interfaces(&bridge(), "eth0", "/run/netns/a").unwrap();
        assert_eq!(listed.pod, 2);
        assert_eq!(listed.host, ["roce0", "veth1a2b3c4d"]);
        // Another spelling of the namespace's path, one candidate: taken.
        assert_eq!(
            interfaces(&bridge(), "eth0", "/var/run/netns/a")
                .unwrap()
                .pod,
            2
        );
        for (prev, msg) in [
            (json!({}), "prevResult.interfaces: missing"),
            (bridge(), "prevResult.interfaces: no interface net1"),
        ] {
            let e = interfaces(&prev, "net1", "/run/netns/a").unwrap_err();
            assert!(e.msg.starts_with(msg), "{e}");
        }
    }

    /// The device goes before the pod's interface, which stays the last
    /// one with a sandbox; its IP still points at it.
    #[test]
    fn the_result_lists_the_device() {
        let r = with_device(&bridge(), "1.0.0", 2, "pkfw0123456789", "/run/netns/a");
        assert_eq!(r["cniVersion"], "1.0.0");
        let list = r["interfaces"].as_array().unwrap();
        assert_eq!(
            list[2],
            json!({"name": "pkfw0123456789", "sandbox": "/run/netns/a", "mac": "aa:00:00:00:00:03"})
        );
        assert_eq!(list[3]["name"], "eth0");
        assert_eq!(r["ips"][0]["interface"], 3);
        assert_eq!(r["ips"][0]["version"], "4");
        assert_eq!(r["routes"], bridge()["routes"]);
        assert_eq!(
            device(&r, "eth0", "/run/netns/a").as_deref(),
            Some("pkfw0123456789")
        );
        assert_eq!(device(&bridge(), "eth0", "/run/netns/a"), None);
    }
}
