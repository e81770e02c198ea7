//! The CLI's commands, one module each.

pub mod attach;
pub mod detach;
pub mod reload;
pub mod replay;
pub mod stats;
