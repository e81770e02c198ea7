//! `pkeyfw` as a CNI plugin (`type: "pkeyfw"`), chained after the bridge
//! plugin: each pod gets a soft-RoCE device of its own, which only its
//! network namespace sees, behind a bridge port that is an access port of
//! the pod's partition in the node's switch attachment of that bridge. So
//! pods on one node are isolated as pods on different hosts are: their
//! QPs never share an rdma_rxe device, and every frame between them
//! crosses a port that judges its partition.
//!
//! The runtime runs the plugin as the CNI specification says: the command
//! and the attachment in `CNI_*` variables, the network's configuration on
//! stdin, the result or an error object on stdout. The binary is pkeyfw's
//! own, installed (or linked) as `pkeyfw` in the runtime's plugin
//! directory; `cmd::cni` tells a runtime's invocation (no argument, and
//! `CNI_COMMAND` set) from a person's and writes the reply.
//!
//! - [`protocol`]: commands, versions, `CNI_ARGS`, error objects;
//! - [`config`]: the network configuration and a pod's own key;
//! - [`prev`]: the previous plugin's result, and this plugin's;
//! - [`node`]: the node's record of each bridge's ports and the switch
//!   policy written from it, and the lock;
//! - [`device`]: the pod's RDMA device;
//! - [`port`]: the pod's bridge port in the bridge's switch attachment;
//! - [`guard`]: the pod's Q_Key, pinned by an attachment on its interface;
//! - [`plugin`]: what each command does with them.

pub mod config;
pub mod device;
pub mod guard;
pub mod node;
pub mod plugin;
pub mod port;
pub mod prev;
pub mod protocol;

use std::io::Read as _;

use serde_json::Value;

use self::{
    config::NetConf,
    protocol::{CniError, Command, Invocation, code},
};

/// The invocation's reply, or its error and the version to say it in.
pub fn run() -> Result<Option<Value>, (CniError, &'static str)> {
    let newest = |e| (e, protocol::NEWEST);
    let inv = Invocation::from_env(|k| std::env::var(k).ok()).map_err(newest)?;
    let mut stdin = Vec::new();
    std::io::stdin().read_to_end(&mut stdin).map_err(|e| {
        newest(CniError::new(
            code::IO,
            "cannot read the network configuration",
            format!("stdin: {e}"),
        ))
    })?;
    if inv.command == Command::Version {
        let asked = serde_json::from_slice::<Value>(&stdin).ok();
        let asked = asked
            .as_ref()
            .and_then(|v| v.get("cniVersion"))
            .and_then(Value::as_str);
        return Ok(Some(protocol::version_reply(asked)));
    }
    let conf = NetConf::parse(&stdin, &inv)?;
    let said = |e| (e, conf.version);
    match inv.command {
        Command::Add => plugin::add(&inv, &conf).map(Some).map_err(said),
        Command::Del => plugin::del(&inv).map(|()| None).map_err(said),
        Command::Check => plugin::check(&inv, &conf).map(|()| None).map_err(said),
        Command::Status => plugin::status().map(|()| None).map_err(said),
        Command::Gc => plugin::gc(&conf).map(|()| None).map_err(said),
        Command::Version => unreachable!("answered above"),
    }
}
