//! The bench's equipment from pkeyfw-ebpf's `pkeyfw-baseline` object: the
//! empty XDP_PASS program, which the filter's per-packet cost is reported
//! beside, and the live bench's traffic generator. pkeyfw's build script
//! writes the object into pkeyfw's OUT_DIR, which only pkeyfw's own targets
//! see: the bench includes the bytes and hands them to [`Baseline::load`]
//! and [`Generator::load`].

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf, EbpfLoader,
    programs::{TestRun as _, TestRunAttrs, TestRunOptions, Xdp, XdpMode},
};

/// The empty program's name in the object.
pub const PROGRAM: &str = "pkeyfw_empty";
/// The generator's name in the object, and the global it sends to.
const GENERATOR: &str = "pkeyfw_generator";
const TARGET_IFINDEX: &str = "TARGET_IFINDEX";

/// Loads program `name` of `ebpf`.
fn load_program(ebpf: &mut Ebpf, name: &str) -> Result<()> {
    let program: &mut Xdp = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow!("the baseline object has no program {name}"))?
        .try_into()?;
    program
        .load()
        .with_context(|| format!("loading the XDP program {name}"))
}

fn program<'a>(ebpf: &'a Ebpf, name: &str) -> Result<&'a Xdp> {
    Ok(ebpf
        .program(name)
        .expect("loaded at construction")
        .try_into()?)
}

/// The baseline program, loaded into the kernel.
pub struct Baseline(Ebpf);

impl Baseline {
    /// Loads the program from `object`, the `pkeyfw-baseline` object's bytes.
    pub fn load(object: &[u8]) -> Result<Baseline> {
        let mut ebpf = Ebpf::load(object).context("loading the baseline object")?;
        load_program(&mut ebpf, PROGRAM)?;
        Ok(Baseline(ebpf))
    }

    /// Attaches the program to `iface` of this thread's network namespace,
    /// in native mode, until the baseline is dropped.
    pub fn attach(&mut self, iface: &str) -> Result<()> {
        let program: &mut Xdp = self
            .0
            .program_mut(PROGRAM)
            .expect("loaded at construction")
            .try_into()?;
        let name = std::ffi::CString::new(iface)?;
        program
            .attach(name.as_c_str(), XdpMode::Driver)
            .with_context(|| format!("attaching the empty program to {iface}"))?;
        Ok(())
    }

    /// Mean run time per repetition (the kernel's own figure) of `repeat`
    /// kernel-side repetitions of `frame`.
    pub fn time(&self, frame: &[u8], repeat: u32) -> Result<Duration> {
        let result = program(&self.0, PROGRAM)?
            .test_run(TestRunOptions {
                data_in: Some(frame),
                repeat,
                ..Default::default()
            })
            .context("BPF_PROG_TEST_RUN of the baseline program")?;
        Ok(result.duration)
    }
}

/// Frames made in the kernel: BPF_PROG_TEST_RUN in live-frames mode runs
/// the generator on copies of a template frame, and the generator redirects
/// each out of one interface (how xdp-trafficgen sends).
pub struct Generator(Ebpf);

impl Generator {
    /// Loads the generator from `object` (the `pkeyfw-baseline` object's
    /// bytes) to send out of interface `ifindex`, which must be in the
    /// network namespace of the thread that calls [`Generator::send`].
    pub fn load(object: &[u8], ifindex: u32) -> Result<Generator> {
        let mut ebpf = EbpfLoader::new()
            .override_global(TARGET_IFINDEX, &ifindex, true)
            .load(object)
            .context("loading the baseline object")?;
        load_program(&mut ebpf, GENERATOR)?;
        Ok(Generator(ebpf))
    }

    /// Sends `count` copies of `frame`, redirected in batches of `batch`;
    /// returns the wall-clock time of the whole run, which includes the
    /// receiver's work where it runs on this CPU (veth's NAPI, scheduled by
    /// each batch's flush, runs when the batch re-enables softirqs).
    pub fn send(&self, frame: &[u8], count: u32, batch: u32) -> Result<Duration> {
        let start = Instant::now();
        program(&self.0, GENERATOR)?
            .test_run(TestRunOptions {
                data_in: Some(frame),
                repeat: count,
                attrs: TestRunAttrs::new().xdp_live_frames(batch),
                ..Default::default()
            })
            .context("BPF_PROG_TEST_RUN (live frames) of the generator")?;
        Ok(start.elapsed())
    }
}
