//! `pkeyfw` started by a container runtime: the CNI plugin ([`crate::cni`]),
//! its arguments in the environment and its network's configuration on
//! stdin, its result or error object on stdout. (What the attachments
//! underneath report goes to stderr.)

use std::{io::Write as _, process::ExitCode};

use crate::cni;

/// Whether this process was started by a CNI runtime: with no argument
/// and `CNI_COMMAND` set (a person's `pkeyfw` always has a command).
pub fn invoked() -> bool {
    std::env::args_os().len() == 1 && std::env::var_os("CNI_COMMAND").is_some()
}

/// Runs the invocation: the result (ADD, VERSION) or the error object on
/// stdout.
pub fn main() -> ExitCode {
    let (reply, ok) = match cni::run() {
        Ok(reply) => (reply, true),
        Err((e, version)) => {
            eprintln!("pkeyfw: CNI: {e}");
            (Some(e.to_json(version)), false)
        }
    };
    if let Some(reply) = reply {
        let mut out = std::io::stdout().lock();
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
