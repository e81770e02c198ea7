//! The host's facts, the ground floor: the interfaces and links rtnetlink
//! reports ([`netlink`]) and an interface's identity ([`iface`]), the
//! bridges switch ports are in ([`bridge`]), network namespaces
//! ([`netns`]), the cgroups and namespaces a rule names by path
//! ([`identity`]), and the RDMA devices, QPs and rdma_cm listeners the
//! kernel reports, soft-RoCE devices made and moved ([`rdma`]). It imports
//! nothing of pkeyfw above it.

pub mod bridge;
pub mod identity;
pub mod iface;
pub mod netlink;
pub mod netns;
pub mod rdma;
