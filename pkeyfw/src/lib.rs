//! pkeyfw: InfiniBand partition (P_Key / Q_Key) enforcement for RoCE, in XDP.
//!
//! The library behind the `pkeyfw` command, by role:
//! - [`policy`]: the policy file and OpenSM's partitions.conf, validated;
//! - [`loading`]: the programs and maps in the kernel, and their pins;
//! - [`control`]: what keeps a running filter in step with the host's QPs;
//! - [`reporting`]: how frames, counters and violations read to a person;
//! - [`attachment`]: an attachment's life, from start to detach, on them;
//! - [`capture`]: frames read from pcap and pcapng captures;
//! - [`cni`]: pkeyfw as a CNI plugin, on attachments: the CNI protocol
//!   and what each of its commands does on a node;
//! - [`cmd`]: the commands built on them, each with its arguments, and
//!   the one a container runtime runs (`cmd::cni`, the CNI plugin's);
//! - [`cli`]: the command line that names them;
//! - `lab`: the labs `pkeyfw lab` runs (veth, switch, soft-RoCE), behind
//!   the default `lab` feature.
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
// The frames and namespaces it uses are test equipment (pkeyfw-testkit).
#[cfg(feature = "lab")]
pub mod lab;
pub mod loading;
pub mod policy;
pub mod reporting;
