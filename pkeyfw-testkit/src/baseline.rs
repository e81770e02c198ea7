//! The bench's equipment from pkeyfw-ebpf's `pkeyfw-baseline` object: the
//! programs the filter's per-packet cost is reported beside (the empty
//! XDP_PASS program and the minimal partition check) and the live bench's
//! traffic generator. pkeyfw's build script writes the object into pkeyfw's
//! OUT_DIR, which only pkeyfw's own targets see: the bench includes the
//! bytes and hands them to [`Baseline::empty`], [`Baseline::minimal`] and
//! [`Generator::load`].

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::Array,
    programs::{TestRun as _, TestRunAttrs, TestRunOptions, Xdp, XdpMode},
};

/// The empty program's name in the object.
pub const EMPTY: &str = "pkeyfw_empty";
/// The minimal partition check's name in the object, and its QP table.
pub const MINIMAL: &str = "pkeyfw_minimal";
const MINIMAL_QPS: &str = "MINIMAL_QPS";
/// The generator's name in the object, and the global it sends to.
const GENERATOR: &str = "pkeyfw_generator";
const TARGET_IFINDEX: &str = "TARGET_IFINDEX";
/// XDP's verdicts, as a test run returns them.
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

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

/// A baseline program, loaded into the kernel: the empty program or the
/// minimal partition check.
pub struct Baseline {
    ebpf: Ebpf,
    name: &'static str,
}

impl Baseline {
    /// Loads the empty program from `object`, the `pkeyfw-baseline`
    /// object's bytes.
    pub fn empty(object: &[u8]) -> Result<Baseline> {
        Baseline::load(object, EMPTY)
    }

    /// Loads the minimal partition check from `object` with its table
    /// holding `qps`, (QPN, P_Key) pairs.
    pub fn minimal(object: &[u8], qps: impl IntoIterator<Item = (u32, u16)>) -> Result<Baseline> {
        let mut baseline = Baseline::load(object, MINIMAL)?;
        let mut table: Array<_, u16> = baseline
            .ebpf
            .map_mut(MINIMAL_QPS)
            .with_context(|| format!("the baseline object has no map {MINIMAL_QPS}"))?
            .try_into()?;
        for (qpn, pkey) in qps {
            table
                .set(qpn, &pkey, 0)
                .with_context(|| format!("QP {qpn} into {MINIMAL_QPS}"))?;
        }
        Ok(baseline)
    }

    /// The program's name in the object ([`EMPTY`] or [`MINIMAL`]).
    pub fn name(&self) -> &'static str {
        self.name
    }

    fn load(object: &[u8], name: &'static str) -> Result<Baseline> {
        let mut ebpf = Ebpf::load(object).context("loading the baseline object")?;
        load_program(&mut ebpf, name)?;
        Ok(Baseline { ebpf, name })
    }

    /// Attaches the program to `iface` of this thread's network namespace,
    /// in native mode, until the baseline is dropped.
    pub fn attach(&mut self, iface: &str) -> Result<()> {
        let program: &mut Xdp = self
            .ebpf
            .program_mut(self.name)
            .expect("loaded at construction")
            .try_into()?;
        let name = std::ffi::CString::new(iface)?;
        program
            .attach(name.as_c_str(), XdpMode::Driver)
            .with_context(|| format!("attaching {} to {iface}", self.name))?;
        Ok(())
    }

    /// Runs one frame through the program (BPF_PROG_TEST_RUN) and returns
    /// whether it passed.
    pub fn run(&self, frame: &[u8]) -> Result<bool> {
        let result = program(&self.ebpf, self.name)?
            .test_run(TestRunOptions {
                data_in: Some(frame),
                ..Default::default()
            })
            .with_context(|| format!("BPF_PROG_TEST_RUN of {}", self.name))?;
        match result.return_value {
            XDP_PASS => Ok(true),
            XDP_DROP => Ok(false),
            other => bail!(
                "{} returned {other}, expected XDP_PASS or XDP_DROP",
                self.name
            ),
        }
    }

    /// Mean run time per repetition (the kernel's own figure) of `repeat`
    /// kernel-side repetitions of `frame`.
    pub fn time(&self, frame: &[u8], repeat: u32) -> Result<Duration> {
        let result = program(&self.ebpf, self.name)?
            .test_run(TestRunOptions {
                data_in: Some(frame),
                repeat,
                ..Default::default()
            })
            .with_context(|| format!("BPF_PROG_TEST_RUN of {}", self.name))?;
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
