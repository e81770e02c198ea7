//! The bench's baseline: the empty XDP_PASS program of pkeyfw-ebpf's
//! `pkeyfw-baseline` object, which the filter's per-packet cost is reported
//! beside. pkeyfw's build script writes the object into pkeyfw's OUT_DIR,
//! which only pkeyfw's own targets see: the bench includes the bytes and
//! hands them to [`Baseline::load`].

use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf,
    programs::{TestRun as _, TestRunOptions, Xdp},
};

/// The program's name in the object.
pub const PROGRAM: &str = "pkeyfw_empty";

/// The baseline program, loaded into the kernel (not attached).
pub struct Baseline(Ebpf);

impl Baseline {
    /// Loads the program from `object`, the `pkeyfw-baseline` object's bytes.
    pub fn load(object: &[u8]) -> Result<Baseline> {
        let mut ebpf = Ebpf::load(object).context("loading the baseline object")?;
        let program: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| anyhow!("the baseline object has no program {PROGRAM}"))?
            .try_into()?;
        program.load().context("loading the baseline XDP program")?;
        Ok(Baseline(ebpf))
    }

    /// Mean run time per repetition (the kernel's own figure) of `repeat`
    /// kernel-side repetitions of `frame`.
    pub fn time(&self, frame: &[u8], repeat: u32) -> Result<Duration> {
        let program: &Xdp = self
            .0
            .program(PROGRAM)
            .expect("loaded at construction")
            .try_into()?;
        let result = program
            .test_run(TestRunOptions {
                data_in: Some(frame),
                repeat,
                ..Default::default()
            })
            .context("BPF_PROG_TEST_RUN of the baseline program")?;
        Ok(result.duration)
    }
}
