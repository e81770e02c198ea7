//! pkeyfw: InfiniBand partition (P_Key / Q_Key) enforcement for RoCE, in XDP.
//!
//! The library behind the `pkeyfw` command, by floor, bottom-up; a module
//! imports the floors beneath it, never one above nor one beside it
//! (`tests/it/layers.rs` checks it):
//! - [`host`]: the host's facts: interfaces, bridges, namespaces, cgroups,
//!   RDMA devices, QPs and listeners;
//! - [`policy`]: the policy file and OpenSM's partitions.conf, validated;
//!   [`capture`]: frames read from pcap and pcapng captures;
//! - [`loading`]: the programs and maps in the kernel, and their pins;
//! - [`reporting`]: how frames, counters and violations read to a person;
//! - [`control`]: what keeps a running filter in step with the host's QPs;
//! - [`attachment`]: an attachment's life, from start to detach, on them;
//!   `lab`: the labs `pkeyfw lab` runs (veth, switch, soft-RoCE), behind
//!   the default `lab` feature;
//! - [`cni`]: pkeyfw as a CNI plugin, on attachments: the CNI protocol
//!   and what each of its commands does on a node;
//! - [`cmd`]: the commands built on them, each with its arguments, and
//!   the one a container runtime runs (`cmd::cni`, the CNI plugin's);
//! - [`cli`]: the command line that names them.
//!
//! Test and bench equipment (frame builder, namespaces, case table,
//! fixtures, the soft-RoCE lab's attacker) is the pkeyfw-testkit crate;
//! `lab` uses it.

pub mod attachment;
pub mod capture;
pub mod cli;
pub mod cmd;
pub mod cni;
pub mod control;
pub mod host;
// The frames and namespaces it uses are test equipment (pkeyfw-testkit).
#[cfg(feature = "lab")]
pub mod lab;
pub mod loading;
pub mod policy;
pub mod reporting;
