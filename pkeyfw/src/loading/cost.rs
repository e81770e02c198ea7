//! What loading each program costs the kernel: its size, the instructions
//! the verifier processed to accept it, and the wall-clock time of the
//! load. `pkeyfw kernel --programs`, the bench and the verifier-budget test
//! read the same figures.

use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result};
use aya::programs::ProgramInfo;

use crate::{
    control::probes,
    loading::{
        filter::{Filter, Load},
        pins,
    },
};

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

/// Loads every program an attachment loads, for a host's port or a
/// switch's (`switch`), pinned in a scratch directory of bpffs (the probes
/// reach the filter's maps through pins), and returns what each cost;
/// nothing is attached, and everything is gone when it returns. The probes
/// are a host port's only.
pub fn measure(switch: bool) -> Result<Vec<Cost>> {
    pins::ensure_bpffs()?;
    let dir = Path::new(pins::BPFFS).join(format!("pkeyfw-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let measured = (|| {
        let filter = Filter::load_with(&Load {
            switch,
            pin: Some(&dir),
            ..Load::host(0)
        })?;
        let mut costs = filter.costs()?;
        if !switch {
            costs.extend(probes::costs(&dir)?);
        }
        Ok(costs)
    })();
    // Unpinned, the programs and maps go with the last file descriptor.
    let _ = std::fs::remove_dir_all(&dir);
    measured
}
