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
//! directory; `main` tells a runtime's invocation (no argument, and
//! `CNI_COMMAND` set) from a person's.
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

use std::{
    fs::File,
    io::{Read as _, Write as _},
    os::fd::{FromRawFd as _, OwnedFd},
    process::ExitCode,
};

use serde_json::Value;

use self::{
    config::NetConf,
    protocol::{CniError, Command, Invocation, code},
};

/// Whether this process was started by a CNI runtime: with no argument
/// and `CNI_COMMAND` set (a person's `pkeyfw` always has a command).
pub fn invoked() -> bool {
    std::env::args_os().len() == 1 && std::env::var_os("CNI_COMMAND").is_some()
}

/// Runs the invocation: the result (ADD, VERSION) or the error object on
/// stdout, everything else (what the switch attachment reports) on stderr.
pub fn main() -> ExitCode {
    let Some(stdout) = reserve_stdout() else {
        eprintln!("pkeyfw: cannot set stdout aside for the CNI result");
        return ExitCode::FAILURE;
    };
    let (reply, ok) = match run() {
        Ok(reply) => (reply, true),
        Err((e, version)) => {
            eprintln!("pkeyfw: CNI: {e}");
            (Some(e.to_json(version)), false)
        }
    };
    if let Some(reply) = reply {
        let mut out = File::from(stdout);
        if writeln!(out, "{reply}").and_then(|()| out.flush()).is_err() {
            return ExitCode::FAILURE;
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The invocation's reply, or its error and the version to say it in.
fn run() -> Result<Option<Value>, (CniError, &'static str)> {
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

/// Keeps stdout for the reply and points fd 1 at stderr, so that nothing
/// the commands underneath print reaches the runtime's JSON.
fn reserve_stdout() -> Option<OwnedFd> {
    // SAFETY: dup and dup2 of the standard descriptors; the duplicate is
    // owned by the OwnedFd from here on.
    unsafe {
        let saved = libc::dup(1);
        if saved < 0 || libc::dup2(2, 1) < 0 {
            return None;
        }
        Some(OwnedFd::from_raw_fd(saved))
    }
}
