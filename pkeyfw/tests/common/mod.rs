//! Shared by the integration tests: policies, the case table, root checks.
#![allow(dead_code)] // each test binary uses a part

pub mod cases;
pub mod stamping;

use std::{
    path::Path,
    process::{Command, Output},
};

use pkeyfw::{
    control::netns::NetnsId, lab::netns::VethPair, loading::filter::Filter, loading::pins::Pins,
    policy::Policy,
};

/// Parses a policy given inline.
pub fn policy(toml: &str) -> Policy {
    Policy::parse(Path::new("test.toml"), toml).unwrap_or_else(|e| panic!("{e}"))
}

/// Kernel tests need root: fail loudly, never skip.
pub fn require_root() {
    // SAFETY: no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "this test loads the XDP program with BPF_PROG_TEST_RUN and needs root; run `sudo -E cargo xtask test`"
    );
}

/// A loaded filter with `policy` applied.
pub fn filter(policy: &Policy) -> Filter {
    require_root();
    let mut f = Filter::load(policy.qps.len() as u32).expect("load the XDP program");
    f.apply(policy).expect("apply the policy");
    f
}

/// The repository's shared captures.
pub fn shared_capture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/captures")
        .join(name)
}

/// `pkeyfw` run in network namespace `ns` (the network only: bpffs stays
/// shared, so pins are seen from everywhere).
pub fn pkeyfw_in(ns: &str) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={}", VethPair::netns_path(ns)))
        .arg(env!("CARGO_BIN_EXE_pkeyfw"));
    cmd
}

/// The pins of interface `iface` of network namespace `ns` (pins are keyed
/// by namespace).
pub fn pins(ns: &str, iface: &str) -> Pins {
    let id = NetnsId::of_path(Path::new(&VethPair::netns_path(ns))).expect("the namespace");
    Pins::at(iface, id)
}

/// Runs `cmd`, which must succeed.
pub fn succeed(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{:?}: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Removes an interface's pins when dropped, whatever the test did.
pub struct Unpin(pub Pins);

impl Drop for Unpin {
    fn drop(&mut self) {
        let _ = self.0.remove();
    }
}
