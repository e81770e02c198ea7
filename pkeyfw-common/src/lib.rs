//! Types and rules shared by the pkeyfw XDP program and its userspace loader.
//!
//! Everything that decides a frame's fate lives here, once: [`parse`] classifies
//! a frame, [`verdict`] applies the InfiniBand partition rules to it. The XDP
//! program only supplies a [`Frame`] over packet memory and [`Tables`] over its
//! BPF maps; the host supplies the same traits over byte slices and in-memory
//! tables, so unit tests on the host exercise the very code the kernel runs.
//!
//! [`cm`] reads the connection-management MADs on QP1, which the verdict
//! and stamping judge by partition too.
//!
//! [`abi`], the maps' layout, is at the bottom: the rules import it, it
//! imports none of them.
#![no_std]
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

pub mod abi;
pub mod capture;
pub mod cm;
pub mod csum;
pub mod frame;
pub mod icrc;
pub mod named;
pub mod parse;
pub mod pkey;
pub mod stamp;
pub mod switch;
pub mod tenant;
pub mod verdict;

pub use abi::counters::{Capture, Direction, Reason, Stamp, Verdict};
pub use frame::{Copied, Frame, InPlace, Window};
pub use verdict::{Outcome, Tables, judge};
