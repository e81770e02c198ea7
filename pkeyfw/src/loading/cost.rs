//! What loading a program costs the kernel: its size, the instructions the
//! verifier processed to accept it, and the wall-clock time of the load
//! (the filter's programs and the probes each say theirs; `attachment::cost`
//! loads them all).

use std::time::Duration;

use aya::programs::ProgramInfo;

/// Instructions the verifier may process for any one program: a tenth of
/// its limit (1,000,000), so that the programs have room to grow and load
/// in milliseconds.
pub const VERIFIER_BUDGET: u32 = 100_000;

/// One program's load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cost {
    pub program: String,
    /// Its instructions as the kernel runs them (after the verifier's
    /// rewrites and dead-code removal).
    pub insns: u32,
    /// The instructions the verifier processed; `None` where the kernel
    /// does not say (before Linux 5.16).
    pub verified: Option<u32>,
    pub load: Duration,
}

impl Cost {
    /// A loaded program's cost, `load` the time its load took.
    pub fn of(info: &ProgramInfo, program: &str, load: Duration) -> Cost {
        Cost {
            program: program.to_string(),
            insns: info.size_translated().unwrap_or(0) / 8,
            verified: info.verified_instruction_count(),
            load,
        }
    }

    /// Whether the verifier processed more than [`VERIFIER_BUDGET`].
    pub fn over_budget(&self) -> bool {
        self.verified.is_some_and(|v| v > VERIFIER_BUDGET)
    }
}
