//! The programs and maps in the kernel: loading and attaching them
//! ([`filter`]), their typed maps ([`maps`]), where they are pinned
//! ([`pins`]), and the kernel structure layouts the probes read ([`btf`]).

pub mod btf;
pub mod filter;
pub mod maps;
pub mod pins;
