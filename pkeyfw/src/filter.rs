//! The XDP program loaded into the kernel: loading (optionally pinned),
//! attaching, and running frames through it with BPF_PROG_TEST_RUN.

use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    programs::{TestRun, TestRunOptions, Xdp, XdpMode, links::FdLink},
};
use pkeyfw_common::{
    Reason,
    maps::{DEFAULT_QP_CAPACITY, GENERATIONS, name},
};

use crate::{maps::Maps, policy::Policy};

/// The program's name in the object.
pub const PROGRAM: &str = "pkeyfw";
/// The empty XDP_PASS program the benchmark compares against.
pub const EMPTY_PROGRAM: &str = "pkeyfw_empty";

/// The XDP object built from pkeyfw-ebpf.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pkeyfw"));

/// XDP actions the program returns.
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

/// The XDP program loaded into the kernel, with its maps.
pub struct Filter {
    ebpf: Ebpf,
    maps: Maps,
    link: Option<aya::programs::xdp::XdpLinkId>,
}

impl Filter {
    /// Loads the program into the kernel with room for `qp_capacity` QPs per
    /// policy. Nothing is attached; the policy is empty until [`apply`](Self::apply).
    pub fn load(qp_capacity: u32) -> Result<Filter> {
        Filter::load_with(qp_capacity, None)
    }

    /// [`load`](Self::load), pinning the program and its maps under `dir`
    /// so that other pkeyfw processes reach them.
    pub fn load_pinned(qp_capacity: u32, dir: &Path) -> Result<Filter> {
        Filter::load_with(qp_capacity, Some(dir))
    }

    fn load_with(qp_capacity: u32, pin: Option<&Path>) -> Result<Filter> {
        let capacity = qp_capacity.max(DEFAULT_QP_CAPACITY).next_power_of_two();
        raise_memlock();
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(name::QPS, capacity * GENERATIONS)
            .map_max_entries(name::QP_STATS, capacity)
            .load(OBJECT)
            .map_err(|e| privileged("loading the XDP object", e.into()))?;
        let program: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| anyhow!("the XDP object has no program {PROGRAM}"))?
            .try_into()?;
        program
            .load()
            .map_err(|e| privileged("loading the XDP program (verifier)", e.into()))?;
        if let Some(dir) = pin {
            program
                .pin(dir.join(PROGRAM))
                .with_context(|| format!("pinning the program under {}", dir.display()))?;
        }
        let maps = Maps::take(&mut ebpf, pin)?;
        Ok(Filter {
            ebpf,
            maps,
            link: None,
        })
    }

    fn program_mut(&mut self) -> &mut Xdp {
        self.ebpf
            .program_mut(PROGRAM)
            .and_then(|p| p.try_into().ok())
            .expect("loaded at construction")
    }

    /// The kernel's id of the loaded program.
    pub fn program_id(&self) -> Result<u32> {
        Ok(self.program().info()?.id())
    }

    /// Attaches the program to interface `iface` of this network namespace.
    /// The attachment lives as long as this `Filter`, unless
    /// [`pin_link`](Self::pin_link) hands it to bpffs.
    pub fn attach(&mut self, iface: &str, mode: XdpMode) -> Result<()> {
        let name = std::ffi::CString::new(iface)?;
        let id = self.program_mut().attach(name.as_c_str(), mode)?;
        self.link = Some(id);
        Ok(())
    }

    /// Pins the attachment at `path`: it outlives this process until the pin
    /// is removed.
    pub fn pin_link(&mut self, path: &Path) -> Result<()> {
        let id = self.link.take().context("not attached")?;
        let link = self.program_mut().take_link(id)?;
        let link: FdLink = link
            .try_into()
            .context("this kernel attached XDP without a bpf_link, which cannot be pinned")?;
        link.pin(path)
            .with_context(|| format!("pinning the link at {}", path.display()))?;
        Ok(())
    }

    /// Detaches the program, if this `Filter` holds its attachment.
    pub fn detach(&mut self) -> Result<()> {
        if let Some(id) = self.link.take() {
            self.program_mut().detach(id)?;
        }
        Ok(())
    }

    fn program(&self) -> &Xdp {
        self.ebpf
            .program(PROGRAM)
            .and_then(|p| p.try_into().ok())
            .expect("loaded at construction")
    }

    pub fn maps(&self) -> &Maps {
        &self.maps
    }

    pub fn maps_mut(&mut self) -> &mut Maps {
        &mut self.maps
    }

    /// Switches the program to `policy` (see [`Maps::apply`]).
    pub fn apply(&mut self, policy: &Policy) -> Result<()> {
        self.maps.apply(policy)
    }

    /// Runs one frame through the program in the kernel (BPF_PROG_TEST_RUN)
    /// and returns whether it passed.
    pub fn run(&self, frame: &[u8]) -> Result<bool> {
        let result = self
            .program()
            .test_run(TestRunOptions {
                data_in: Some(frame),
                repeat: 1,
                ..Default::default()
            })
            .map_err(|e| privileged("BPF_PROG_TEST_RUN", e.into()))?;
        match result.return_value {
            XDP_PASS => Ok(true),
            XDP_DROP => Ok(false),
            other => bail!("the XDP program returned {other}, expected XDP_PASS or XDP_DROP"),
        }
    }

    /// Runs one frame and returns whether it passed and the reason the kernel
    /// counted for it (read from the change of the per-reason counters).
    pub fn judge(&self, frame: &[u8]) -> Result<(bool, Reason)> {
        let before = self.maps.reasons()?;
        let pass = self.run(frame)?;
        let after = self.maps.reasons()?;
        let counted: Vec<Reason> = Reason::ALL
            .into_iter()
            .filter(|r| after[r.index() as usize] != before[r.index() as usize])
            .collect();
        match counted[..] {
            [reason] if after[reason.index() as usize] == before[reason.index() as usize] + 1 => {
                Ok((pass, reason))
            }
            _ => bail!("the per-reason counters did not change by exactly one frame: {counted:?}"),
        }
    }

    /// Mean run time per repetition (the kernel's own figure) of `repeat`
    /// kernel-side repetitions of `frame`, through the filter or (`empty`)
    /// through the empty XDP_PASS program.
    pub fn time(&mut self, empty: bool, frame: &[u8], repeat: u32) -> Result<Duration> {
        let name = if empty { EMPTY_PROGRAM } else { PROGRAM };
        let program: &mut Xdp = self
            .ebpf
            .program_mut(name)
            .ok_or_else(|| anyhow!("the XDP object has no program {name}"))?
            .try_into()?;
        if program.fd().is_err() {
            program.load()?;
        }
        let result = program
            .test_run(TestRunOptions {
                data_in: Some(frame),
                repeat,
                ..Default::default()
            })
            .map_err(|e| privileged("BPF_PROG_TEST_RUN", e.into()))?;
        Ok(result.duration)
    }
}

/// Adds the likely cause to errors of privileged BPF operations.
fn privileged(what: &str, err: anyhow::Error) -> anyhow::Error {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        err.context(format!(
            "{what} failed: pkeyfw needs root (CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON); run it with sudo"
        ))
    } else {
        err.context(format!("{what} failed"))
    }
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK.
fn raise_memlock() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a valid rlimit; failure only matters on old kernels, where the
    // load then reports it.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
}
