//! The fixture files, in the repository beside this crate, so that the
//! tests need nothing outside a fresh clone.

use std::path::PathBuf;

/// A packet capture under `fixtures/captures/`.
pub fn capture(name: &str) -> PathBuf {
    dir().join("captures").join(name)
}

/// An OpenSM partitions.conf under `fixtures/partitions/`.
pub fn partitions(name: &str) -> PathBuf {
    dir().join("partitions").join(name)
}

fn dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures"))
}
