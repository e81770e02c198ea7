//! The programs of the filter object (pkeyfw-ebpf's `pkeyfw`), by name:
//! how the loader finds them in the object, and the attachment's pins name
//! them.

/// The XDP program's name in the object, and its pin's.
pub const PROGRAM: &str = "pkeyfw";
/// The same program without multi-buffer support, for kernels before 5.18
/// (pinned as [`PROGRAM`]).
pub const LINEAR_PROGRAM: &str = "pkeyfw_linear";
/// The TC egress program that stamps outgoing frames' P_Key.
pub const STAMP_PROGRAM: &str = "pkeyfw_stamp";
/// The TC ingress filter: `--mode skb`, in the network stack, where it sees
/// GSO/GRO super-packets whole (generic XDP would judge their first segment).
pub const INGRESS_PROGRAM: &str = "pkeyfw_ingress";
