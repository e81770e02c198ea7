#![no_std]
// The library target only lets pkeyfw name this crate as a build dependency.
