//! Where an attachment says what it does, as it does it: a command's
//! report on stdout and its warnings on stderr; the CNI plugin's all on
//! stderr, its stdout being the result the runtime reads.

use std::fmt::Arguments;

/// The caller's sink for an attachment's lines: the report (`out!`) and
/// the warnings and notes (`err!`).
#[derive(Clone, Copy)]
pub struct Say {
    report: fn(Arguments),
    note: fn(Arguments),
}

impl Say {
    /// A command's: the report on stdout, warnings on stderr.
    pub const TERMINAL: Say = Say {
        report: |line| println!("{line}"),
        note: |line| eprintln!("{line}"),
    };
    /// Everything on stderr.
    pub const STDERR: Say = Say {
        report: |line| eprintln!("{line}"),
        note: |line| eprintln!("{line}"),
    };

    pub fn out(self, line: Arguments) {
        (self.report)(line)
    }

    pub fn err(self, line: Arguments) {
        (self.note)(line)
    }
}

/// `println!` through a [`Say`].
macro_rules! out {
    ($say:expr, $($line:tt)*) => { $say.out(format_args!($($line)*)) };
}

/// `eprintln!` through a [`Say`].
macro_rules! err {
    ($say:expr, $($line:tt)*) => { $say.err(format_args!($($line)*)) };
}
