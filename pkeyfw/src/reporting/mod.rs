//! How frames, P_Keys, counters and violation events read to a person:
//! display only, every verdict comes from the kernel; which attachments
//! are there to read ([`live`]).

pub mod describe;
pub mod events;
pub mod kernel_log;
pub mod live;
pub mod progress;
pub mod reach;
pub mod snapshot;
