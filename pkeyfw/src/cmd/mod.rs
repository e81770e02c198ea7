//! The CLI's commands, one module each: its arguments (clap) and its `run`
//! (and `cni`, the CNI plugin, whose arguments a runtime passes in its
//! environment);
//! here, beneath them, what several share (`--netns`, the port's GUID, how an
//! interface is named), so that no command imports another's internals back.

pub mod attach;
pub mod cni;
pub mod detach;
pub mod events;
pub mod kernel;
pub mod metrics;
// The frames and namespaces it uses are test equipment (pkeyfw-testkit).
#[cfg(feature = "lab")]
pub mod lab;
pub mod policy;
pub mod qps;
pub mod reload;
pub mod replay;
pub mod stats;
pub mod switch;

use anyhow::{Context as _, Result};

use crate::{host::netns::Netns, policy::parse_guid};

/// `--netns`: the network namespace a command does its interface work in.
#[derive(clap::Args)]
pub struct NetnsArg {
    /// The interface's network namespace, as `ip -n` takes it: NAME is
    /// /run/netns/NAME, else a path to a namespace file (/proc/PID/ns/net).
    /// The interface work happens there; the pins stay in the host's bpffs.
    #[arg(long, value_name = "NAME|PATH")]
    pub netns: Option<String>,
}

impl NetnsArg {
    /// Moves this process into the namespace, if one was given (before any
    /// thread starts: setns moves only the calling thread); its name, for
    /// messages.
    pub fn enter(&self) -> Result<Option<&str>> {
        if let Some(spec) = &self.netns {
            Netns::open(spec)?.enter()?;
        }
        Ok(self.name())
    }

    /// The namespace as given, for messages.
    pub fn name(&self) -> Option<&str> {
        self.netns.as_deref()
    }
}

/// This port's identity, for policies whose table comes from partitions.conf
/// (unless the policy sets [port].guid).
#[derive(clap::Args)]
#[group(multiple = false)]
pub struct PortArgs {
    /// This port's GUID, e.g. 0x0002c90300a1b2c3.
    #[arg(long, value_name = "GUID")]
    pub port_guid: Option<String>,
    /// Derive the GUID from this interface's MAC (EUI-64, as RoCE does).
    #[arg(long, value_name = "IFACE")]
    pub iface: Option<String>,
}

impl PortArgs {
    pub fn guid(&self) -> Result<Option<u64>> {
        port_guid(self.port_guid.as_deref(), self.iface.as_deref())
    }
}

/// This port's GUID: `--port-guid` if given, else the EUI-64 of `iface`'s MAC
/// (as RoCE derives its GID), else unknown.
pub fn port_guid(guid: Option<&str>, iface: Option<&str>) -> Result<Option<u64>> {
    if let Some(g) = guid {
        return parse_guid(g).map(Some).with_context(|| {
            format!("--port-guid {g}: expected 64 bits such as 0x0002c90300a1b2c3")
        });
    }
    iface.map(crate::host::iface::guid).transpose()
}
