//! Keeping a running filter in step with the host: the RDMA devices and QPs
//! the kernel reports ([`rdma`]), the interface facts from rtnetlink
//! ([`netlink`]) and the bridges switch ports are in ([`bridge`]), the network namespaces they are in ([`netns`]), the kernel probes that see QPs appear and connect
//! ([`probes`]) and what bounds their tables ([`limits`]), the binder that turns them into QP-table entries
//! ([`binder`]), the rdma_cm listeners no probe saw start ([`listeners`]),
//! and the devices a host makes for its tenants ([`tenancy`]).

pub mod binder;
pub mod bridge;
pub mod limits;
pub mod listeners;
pub mod netlink;
pub mod netns;
pub mod probes;
pub mod rdma;
pub mod tenancy;
