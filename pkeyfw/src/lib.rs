//! pkeyfw: InfiniBand partition (P_Key / Q_Key) enforcement for RoCE, in XDP.
//!
//! The library behind the `pkeyfw` command: policy parsing, the loader of the
//! XDP program, and the commands built on them.

pub mod capture;
pub mod describe;
pub mod filter;
pub mod policy;
pub mod replay;
pub mod wire;
