//! Keeping a running filter in step with the host: the kernel probes that
//! see QPs appear and connect ([`probes`]) and what bounds their tables
//! ([`limits`]), the binder that turns them into QP-table entries
//! ([`binder`]), the rdma_cm listeners no probe saw start ([`listeners`]),
//! and the devices a host makes for its tenants ([`tenancy`]).

pub mod binder;
pub mod limits;
pub mod listeners;
pub mod probes;
pub mod tenancy;
