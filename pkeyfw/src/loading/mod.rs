//! The programs and maps in the kernel: loading and attaching them
//! ([`filter`], the object's [`programs`]), their typed maps ([`maps`],
//! written in batches: `batch`; the QP table through its memory:
//! [`qp_table`]), where they are pinned ([`pins`]), the
//! kernel structure layouts the probes read ([`btf`]), what the kernel
//! offers ([`features`]) and what loading costs it ([`cost`]); the
//! priority of whoever holds the maps ([`priority`]); bpf(2)
//! itself where aya has no call for a command ([`syscall`]).

mod batch;
pub mod btf;
pub mod cost;
pub mod features;
pub mod filter;
pub mod maps;
pub mod pins;
pub mod priority;
pub mod programs;
pub mod qp_table;
pub mod syscall;
