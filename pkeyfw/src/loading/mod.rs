//! The programs and maps in the kernel: loading and attaching them
//! ([`filter`]), their typed maps ([`maps`], written in batches: `batch`), where they are pinned
//! ([`pins`]), and the kernel structure layouts the probes read ([`btf`]).

mod batch;
pub mod btf;
pub mod cost;
pub mod features;
pub mod filter;
pub mod maps;
pub mod pins;
