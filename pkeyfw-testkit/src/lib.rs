//! pkeyfw's test and bench equipment, out of the product: one fixture set
//! for the host tests, the kernel tests, the bench and the lab.
//!
//! - [`wire`]: RoCE frames built byte by byte, and the full ICRC;
//! - [`cm`]: the CM MADs rdma_cm exchanges on QP1, built likewise;
//! - [`cni`]: a CNI runtime, as libcni runs a network configuration list
//!   (the CNI lab's, `pkeyfw-lab-cni`);
//! - [`netns`]: two network namespaces joined by a veth pair, frames sent
//!   and captured in them;
//! - [`rxe`]: two soft-RoCE devices joined by a veth pair (the soft-RoCE
//!   lab's, and the systemd scenario's by `pkeyfw-lab-rxe`);
//! - [`cases`]: the verdict case table, as data (policies are TOML text);
//! - [`stamping`]: the stamping fixtures and the checks of rewritten frames;
//! - [`fixtures`]: the fixture files (a real capture, partitions.conf files);
//! - [`baseline`]: the empty XDP program the bench times the filter beside,
//!   and the live bench's traffic generator;
//! - [`cpus`]: which CPUs a thread runs on.

pub mod baseline;
pub mod cases;
pub mod cm;
pub mod cni;
pub mod cpus;
pub mod fixtures;
pub mod netns;
pub mod rxe;
pub mod stamping;
pub mod wire;
