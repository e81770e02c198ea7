//! pkeyfw's integration tests, one binary of modules (as aya's
//! integration-test is): the crate is linked once, and cargo runs every
//! test on the threads of one process. Most kernel tests load their own
//! programs under names of their own; those that share something of the
//! machine take it from [`common`]: the pins' root (`pins_root`), the CPUs
//! (`cpus_alone`).

mod common;

mod attach;
mod connection_setup;
mod deploy;
mod events;
mod fast_path;
mod gso;
mod icrc_patch;
#[cfg(feature = "lab")]
mod lab;
mod layers;
mod metrics;
mod parallel_attach;
mod persist;
mod policy_check;
mod property;
mod quarantine;
#[cfg(feature = "lab")]
mod quickstart;
mod reload;
mod replay;
mod stamp_kernel;
mod switch_kernel;
mod switch_ports;
mod tear;
mod trace;
mod verdict_host;
mod verdict_kernel;
mod verifier;
