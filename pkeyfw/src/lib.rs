//! pkeyfw: InfiniBand partition (P_Key / Q_Key) enforcement for RoCE, in XDP.
//!
//! The library behind the `pkeyfw` command: policy parsing, the loader of the
//! XDP program, and the commands built on them.

pub mod binder;
pub mod btf;
pub mod capture;
pub mod cmd;
pub mod describe;
pub mod events;
pub mod filter;
pub mod lab;
pub mod maps;
pub mod netlink;
pub mod pins;
pub mod policy;
pub mod rdma;
pub mod watch;
pub mod wire;
