//! The RoCE partition lab: namespaces, veths and real frames.

pub mod netns;
