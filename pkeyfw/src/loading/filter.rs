//! The programs loaded into the kernel: the XDP filter and the TC egress
//! stamper. Loading (optionally pinned), attaching, and running frames
//! through them with BPF_PROG_TEST_RUN.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    programs::{
        SchedClassifier, TcAttach, TcAttachType, TestRun, TestRunOptions, TestRunResult, Xdp,
        XdpMode,
        links::{FdLink, Link as _, LinkOrder, PinnedLink},
        tc::{self, NlOptions, SchedClassifierLink, SchedClassifierLinkId, TcError},
        xdp::XdpLink,
    },
};
use aya_log::EbpfLogger;
use pkeyfw_common::{
    Reason, Verdict,
    abi::{Capacity, MAPS, MIN_QPNS, SenderLayout, Setup, role},
};

use crate::{
    host::netlink::{self, BpfFilter},
    loading::{
        cost::Cost,
        features::Features,
        maps::Maps,
        programs::{INGRESS_PROGRAM, LINEAR_PROGRAM, PROGRAM, STAMP_PROGRAM},
    },
    policy::Policy,
};

/// The XDP object built from pkeyfw-ebpf.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pkeyfw"));

/// XDP actions the program returns.
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
/// What the TC programs return: no opinion on the frame (the ingress
/// program's pass), or drop it.
const TC_ACT_UNSPEC: i32 = -1;
const TC_ACT_SHOT: i32 = 2;

/// How a TC program (the egress stamper, the ingress filter) is hooked in.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Egress {
    /// tcx where the kernel has it (6.6 and later), else `Clsact`.
    Auto,
    /// A bpf_link on the tcx hook.
    Tcx,
    /// A direct-action filter under a clsact qdisc (added if missing), as
    /// kernels before 6.6 need. It is no link: it stays until removed by name.
    Clsact,
}

/// The programs loaded into the kernel, with their maps.
///
/// Stamping is switched on by attaching the egress program, when the policy
/// first applied stamps (`attach_egress`), and gated by the active policy's
/// `Config::stamp` in both programs: a reload can turn stamping off (the
/// egress program then only passes frames on), but turning it on needs the
/// egress program attached, so a new attachment.
pub struct Filter {
    ebpf: Ebpf,
    /// The XDP program loaded: [`PROGRAM`] or [`LINEAR_PROGRAM`].
    xdp: &'static str,
    /// How long each program's load took.
    timings: Vec<(&'static str, Duration)>,
    maps: Maps,
    link: Option<aya::programs::xdp::XdpLinkId>,
    egress: Option<SchedClassifierLinkId>,
    ingress: Option<SchedClassifierLinkId>,
    replaced: Replaced,
}

/// The clsact filters of an attachment this one replaces: no link holds
/// them (kernels before 6.6), so none can be switched over in place. The
/// new filters run after them until [`Filter::remove_replaced`] deletes
/// them; left alone, an old stamping program would go on rewriting frames
/// from maps nobody updates.
#[derive(Default)]
struct Replaced {
    index: u32,
    egress: Vec<BpfFilter>,
    ingress: Vec<BpfFilter>,
}

impl Replaced {
    fn on(&self, hook: TcAttachType) -> &[BpfFilter] {
        match hook {
            TcAttachType::Egress => &self.egress,
            _ => &self.ingress,
        }
    }

    /// The priority that runs a new filter after the old ones (the kernel's
    /// own choice, 0, puts it first).
    fn after(&self, hook: TcAttachType) -> u16 {
        self.on(hook)
            .iter()
            .map(|f| f.priority.saturating_add(1))
            .max()
            .unwrap_or(0)
    }
}

/// How a filter is loaded (see [`Filter::load_with`]).
#[derive(Clone, Debug)]
pub struct Load<'a> {
    /// Room in the maps: a host port's QP table covers at least
    /// [`MIN_QPNS`] QPNs; a switch port's holds none (it reads no QP).
    pub capacity: Capacity,
    /// A switch's port, not a host's: fixed for the filter's life (a
    /// reload cannot change it), so that the verifier removes the other
    /// role's code.
    pub switch: bool,
    /// Pins the programs and maps under this directory, so that other
    /// pkeyfw processes reach them.
    pub pin: Option<&'a Path>,
    /// The programs log every judged frame (`attach --trace`, read with
    /// [`Filter::kernel_log`]). Without it the verifier removes the logging
    /// code: the programs run as if it were not there.
    pub trace: bool,
    /// Where the egress program learns from rdma_rxe which QP sent a frame.
    pub sender: SenderLayout,
}

impl Load<'_> {
    /// A host's port whose QP table covers QPNs below `qpns`, unpinned,
    /// untraced, that takes no outgoing frame for a QP's.
    pub fn host(qpns: u32) -> Load<'static> {
        Load {
            capacity: Capacity::of(qpns),
            switch: false,
            pin: None,
            trace: false,
            sender: SenderLayout::NONE,
        }
    }

    /// As [`host`](Self::host), in the role and with the room `policy` needs.
    pub fn of(policy: &Policy) -> Load<'static> {
        Load {
            switch: policy.switch.is_some(),
            ..Load::host(policy.qpns())
        }
    }
}

impl Filter {
    /// Loads a host port's programs into the kernel with a QP table for
    /// QPNs below `qpns` (at least [`MIN_QPNS`]). Nothing is attached; the
    /// policy is empty until [`apply`](Self::apply).
    pub fn load(qpns: u32) -> Result<Filter> {
        Filter::load_with(&Load::host(qpns))
    }

    /// Loads the programs for `policy`'s role, with room for its QPs; the
    /// policy is not applied.
    pub fn load_for(policy: &Policy) -> Result<Filter> {
        Filter::load_with(&Load::of(policy))
    }

    /// [`load`](Self::load), pinning the program and its maps under `dir`
    /// so that other pkeyfw processes reach them.
    pub fn load_pinned(qpns: u32, dir: &Path) -> Result<Filter> {
        Filter::load_with(&Load {
            pin: Some(dir),
            ..Load::host(qpns)
        })
    }

    /// Loads the programs as `how` says, in the form the running kernel
    /// takes (see [`Features`]).
    pub fn load_with(how: &Load) -> Result<Filter> {
        let capacity = Capacity {
            qpns: if how.switch {
                1
            } else {
                how.capacity.qpns.max(MIN_QPNS)
            },
            probed: how.capacity.probed.max(1),
            cpus: aya::util::nr_cpus()
                .map_err(|(_, e)| e)
                .context("counting the possible CPUs")?
                .get(),
        };
        raise_memlock();
        let features = Features::probe();
        let setup = Setup {
            role: if how.switch { role::SWITCH } else { role::HOST },
            frags: features.xdp_frags.into(),
            coarse_clock: features.coarse_clock.into(),
            _pad: 0,
        };
        // Without multi-buffer XDP the same program is loaded without
        // `xdp.frags`, which such a kernel refuses.
        let xdp = if features.xdp_frags {
            PROGRAM
        } else {
            LINEAR_PROGRAM
        };
        let trace = u8::from(how.trace);
        let mut loader = EbpfLoader::new();
        loader.override_global("TRACE", &trace, true);
        loader.override_global("SENDER", &how.sender, true);
        loader.override_global("SETUP", &setup, true);
        for spec in &MAPS {
            if let Some(n) = capacity.entries(spec.size) {
                loader.map_max_entries(spec.name, n);
            }
        }
        let mut ebpf = loader
            .load(OBJECT)
            .map_err(|e| privileged("loading the XDP object", e.into()))?;
        let program: &mut Xdp = ebpf
            .program_mut(xdp)
            .ok_or_else(|| anyhow!("the XDP object has no program {xdp}"))?
            .try_into()?;
        let started = Instant::now();
        program
            .load()
            .map_err(|e| privileged("loading the XDP program (verifier)", e.into()))?;
        let mut timings = vec![(xdp, started.elapsed())];
        if let Some(dir) = how.pin {
            program
                .pin(dir.join(PROGRAM))
                .with_context(|| format!("pinning the program under {}", dir.display()))?;
        }
        let stamp: &mut SchedClassifier = ebpf
            .program_mut(STAMP_PROGRAM)
            .ok_or_else(|| anyhow!("the object has no program {STAMP_PROGRAM}"))?
            .try_into()?;
        let started = Instant::now();
        stamp
            .load()
            .map_err(|e| privileged("loading the TC egress program (verifier)", e.into()))?;
        timings.push((STAMP_PROGRAM, started.elapsed()));
        let ingress: &mut SchedClassifier = ebpf
            .program_mut(INGRESS_PROGRAM)
            .ok_or_else(|| anyhow!("the object has no program {INGRESS_PROGRAM}"))?
            .try_into()?;
        let started = Instant::now();
        ingress
            .load()
            .map_err(|e| privileged("loading the TC ingress program (verifier)", e.into()))?;
        timings.push((INGRESS_PROGRAM, started.elapsed()));
        if let Some(dir) = how.pin {
            ingress
                .pin(dir.join(INGRESS_PROGRAM))
                .with_context(|| format!("pinning the program under {}", dir.display()))?;
        }
        let maps = Maps::take(&mut ebpf, how.pin)?;
        Ok(Filter {
            ebpf,
            xdp,
            timings,
            maps,
            link: None,
            egress: None,
            ingress: None,
            replaced: Replaced::default(),
        })
    }

    /// Notes the stamping and ingress clsact filters on interface `index`
    /// before this filter replaces them; see [`Replaced`].
    pub fn replacing(&mut self, index: u32) -> Result<()> {
        let list = |hook: TcAttachType, program: &str| {
            netlink::bpf_filters(index, tc::TcHandle::from(hook).into(), program)
                .with_context(|| format!("listing the {hook:?} clsact filters"))
        };
        self.replaced = Replaced {
            index,
            egress: list(TcAttachType::Egress, STAMP_PROGRAM)?,
            ingress: list(TcAttachType::Ingress, INGRESS_PROGRAM)?,
        };
        Ok(())
    }

    /// Deletes the replaced attachment's clsact filters (see
    /// [`replacing`](Self::replacing)), once this filter's own run.
    pub fn remove_replaced(&mut self) -> Result<()> {
        let replaced = std::mem::take(&mut self.replaced);
        for hook in [TcAttachType::Egress, TcAttachType::Ingress] {
            for old in replaced.on(hook) {
                SchedClassifierLink::attached(
                    replaced.index,
                    hook.into(),
                    old.priority,
                    old.handle.into(),
                    None,
                )?
                .detach()
                .with_context(|| {
                    format!(
                        "deleting the replaced {hook:?} filter (prio {}, program {})",
                        old.priority, old.prog_id
                    )
                })?;
            }
        }
        Ok(())
    }

    /// Starts reading the programs' log lines (`--trace`) into `log` (the
    /// attachment's `reporting::kernel_log`).
    pub fn kernel_log<L: log::Log + 'static>(&mut self, log: L) -> Result<EbpfLogger<L>> {
        EbpfLogger::init_with_logger(&mut self.ebpf, log)
            .context("reading the filter's kernel log (aya-log)")
    }

    fn stamp_program_mut(&mut self) -> &mut SchedClassifier {
        self.tc_program_mut(STAMP_PROGRAM)
    }

    fn tc_program_mut(&mut self, name: &str) -> &mut SchedClassifier {
        self.ebpf
            .program_mut(name)
            .and_then(|p| p.try_into().ok())
            .expect("loaded at construction")
    }

    fn ingress_program(&self) -> &SchedClassifier {
        self.ebpf
            .program(INGRESS_PROGRAM)
            .and_then(|p| p.try_into().ok())
            .expect("loaded at construction")
    }

    fn stamp_program(&self) -> &SchedClassifier {
        self.ebpf
            .program(STAMP_PROGRAM)
            .and_then(|p| p.try_into().ok())
            .expect("loaded at construction")
    }

    /// Attaches the egress (stamping) program to `iface`; see [`Egress`].
    pub fn attach_egress(&mut self, iface: &str, how: Egress) -> Result<()> {
        let id = self.attach_tc(STAMP_PROGRAM, TcAttachType::Egress, iface, how)?;
        self.egress = Some(id);
        Ok(())
    }

    /// Attaches the filter as a TC ingress program (`--mode skb`) to
    /// `iface`: tcx on 6.6 and later, else a clsact filter; see [`Egress`].
    pub fn attach_ingress(&mut self, iface: &str, how: Egress) -> Result<()> {
        let id = self.attach_tc(INGRESS_PROGRAM, TcAttachType::Ingress, iface, how)?;
        self.ingress = Some(id);
        Ok(())
    }

    fn attach_tc(
        &mut self,
        program: &str,
        hook: TcAttachType,
        iface: &str,
        how: Egress,
    ) -> Result<SchedClassifierLinkId> {
        let name = std::ffi::CString::new(iface)?;
        let tcx = |f: &mut Filter| {
            f.tc_program_mut(program)
                .attach(
                    name.as_c_str(),
                    TcAttach::Tcx {
                        attach_type: hook,
                        order: LinkOrder::default(),
                    },
                )
                .with_context(|| format!("attaching to the tcx {hook:?} hook"))
        };
        let clsact = |f: &mut Filter| -> Result<SchedClassifierLinkId> {
            match tc::qdisc_add_clsact(name.as_c_str()) {
                Err(TcError::AlreadyAttached) => {}
                Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
                other => other.context("adding the clsact qdisc")?,
            }
            let priority = f.replaced.after(hook);
            f.tc_program_mut(program)
                .attach(
                    name.as_c_str(),
                    TcAttach::Netlink {
                        parent: hook.into(),
                        options: NlOptions {
                            priority,
                            ..NlOptions::default()
                        },
                    },
                )
                .context("attaching under the clsact qdisc")
        };
        Ok(match how {
            Egress::Tcx => tcx(self)?,
            Egress::Clsact => clsact(self)?,
            Egress::Auto => match tcx(self) {
                Ok(id) => id,
                Err(no_tcx) => {
                    clsact(self).with_context(|| format!("after tcx failed: {no_tcx:#}"))?
                }
            },
        })
    }

    /// What loading each program cost.
    pub fn costs(&self) -> Result<Vec<Cost>> {
        self.timings
            .iter()
            .map(|&(name, load)| {
                let info = match self.ebpf.program(name) {
                    Some(aya::programs::Program::Xdp(p)) => p.info()?,
                    Some(aya::programs::Program::SchedClassifier(p)) => p.info()?,
                    _ => bail!("the object has no program {name}"),
                };
                Ok(Cost::of(&info, name, load))
            })
            .collect()
    }

    /// Whether the filter runs as the TC ingress program (`--mode skb`).
    pub fn is_tc(&self) -> bool {
        self.ingress.is_some()
    }

    /// The kernel's id of the loaded TC ingress program.
    pub fn ingress_program_id(&self) -> Result<u32> {
        Ok(self.ingress_program().info()?.id())
    }

    fn program_mut(&mut self) -> &mut Xdp {
        self.ebpf
            .program_mut(self.xdp)
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

    /// Pins the attachments (the XDP link at `pins.link()`, a tcx egress
    /// link at `pins.egress_link()`): they outlive this process until the
    /// pins are removed. A clsact egress filter needs no pin; it stays until
    /// [`Pins::remove`](crate::loading::pins::Pins::remove) deletes it by name.
    pub fn pin_link(&mut self, pins: &crate::loading::pins::Pins) -> Result<()> {
        if let Some(id) = self.link.take() {
            let link = self.program_mut().take_link(id)?;
            let link: FdLink = link
                .try_into()
                .context("this kernel attached XDP without a bpf_link, which cannot be pinned")?;
            link.pin(pins.link())
                .with_context(|| format!("pinning the link at {}", pins.link().display()))?;
        } else if self.ingress.is_none() {
            bail!("not attached");
        }
        for (program, id, at) in [
            (INGRESS_PROGRAM, self.ingress.take(), pins.ingress_link()),
            (STAMP_PROGRAM, self.egress.take(), pins.egress_link()),
        ] {
            let Some(id) = id else { continue };
            let link = self.tc_program_mut(program).take_link(id)?;
            if <&FdLink>::try_from(&link).is_ok() {
                FdLink::try_from(link)?
                    .pin(&at)
                    .with_context(|| format!("pinning the link at {}", at.display()))?;
            } else {
                // A clsact filter: dropping the link would delete it.
                std::mem::forget(link);
            }
        }
        Ok(())
    }

    /// Takes over the attachments of a filter this one replaces, pinned at
    /// `link` (XDP) and `egress` (tcx, if any): switches each link to this
    /// filter's program atomically (bpf_link_update), so the interface is
    /// never without a filter. The links keep their mode. As after
    /// [`attach`](Self::attach), [`pin_link`](Self::pin_link) pins them
    /// here.
    pub fn take_over(&mut self, link: &Path, egress: Option<&Path>) -> Result<()> {
        let open = |path: &Path| -> Result<FdLink> {
            Ok(PinnedLink::from_pin(path)
                .with_context(|| format!("opening the link pinned at {}", path.display()))?
                .into())
        };
        let xdp = XdpLink::try_from(open(link)?).context("the pinned link is no XDP link")?;
        let egress = egress
            .map(|path| -> Result<SchedClassifierLink> {
                SchedClassifierLink::try_from(open(path)?)
                    .context("the pinned egress link is no tcx link")
            })
            .transpose()?;
        self.link = Some(
            self.program_mut()
                .attach_to_link(xdp)
                .context("switching the XDP link to the new program")?,
        );
        if let Some(egress) = egress {
            self.egress = Some(
                self.stamp_program_mut()
                    .attach_to_link(egress)
                    .context("switching the egress link to the new program")?,
            );
        }
        Ok(())
    }

    /// Whether the egress (stamping) program is attached by this `Filter`.
    pub fn has_egress(&self) -> bool {
        self.egress.is_some()
    }

    /// Detaches the programs, if this `Filter` holds their attachments.
    pub fn detach(&mut self) -> Result<()> {
        if let Some(id) = self.link.take() {
            self.program_mut().detach(id)?;
        }
        if let Some(id) = self.ingress.take() {
            self.tc_program_mut(INGRESS_PROGRAM).detach(id)?;
        }
        if let Some(id) = self.egress.take() {
            self.stamp_program_mut().detach(id)?;
        }
        Ok(())
    }

    fn program(&self) -> &Xdp {
        self.ebpf
            .program(self.xdp)
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
        self.run_out(frame).map(|(pass, _)| pass)
    }

    /// Runs one frame through the XDP program and returns whether it passed
    /// and the frame as the program left it.
    pub fn run_out(&self, frame: &[u8]) -> Result<(bool, Vec<u8>)> {
        let (verdict, out) = run_once(self.program(), frame)?;
        let pass = match verdict {
            XDP_PASS => true,
            XDP_DROP => false,
            other => bail!("the XDP program returned {other}, expected XDP_PASS or XDP_DROP"),
        };
        Ok((pass, out))
    }

    /// Runs one frame through the TC ingress program (`--mode skb`) and
    /// returns whether it passed and the frame as the program left it.
    pub fn run_ingress(&self, frame: &[u8]) -> Result<(bool, Vec<u8>)> {
        let (verdict, out) = run_once(self.ingress_program(), frame)?;
        let pass = match verdict as i32 {
            TC_ACT_UNSPEC => true,
            TC_ACT_SHOT => false,
            other => bail!(
                "the TC ingress program returned {other}, expected TC_ACT_UNSPEC or TC_ACT_SHOT"
            ),
        };
        Ok((pass, out))
    }

    /// Runs one outgoing frame through the egress program and returns the
    /// frame as it leaves, or `None` if the program dropped it.
    pub fn run_egress(&self, frame: &[u8]) -> Result<Option<Vec<u8>>> {
        let (verdict, out) = run_once(self.stamp_program(), frame)?;
        match verdict as i32 {
            TC_ACT_UNSPEC => Ok(Some(out)),
            TC_ACT_SHOT => Ok(None),
            other => {
                bail!("the egress program returned {other}, expected TC_ACT_UNSPEC or TC_ACT_SHOT")
            }
        }
    }

    /// Mean run time per repetition of `repeat` kernel-side repetitions of
    /// `frame` through the egress program.
    pub fn time_egress(&self, frame: &[u8], repeat: u32) -> Result<Duration> {
        timed(self.stamp_program(), frame, repeat)
    }

    /// Runs one frame and returns whether it passed and the reason the kernel
    /// counted for it (see [`run_verdict`](Self::run_verdict)).
    pub fn run_counted(&self, frame: &[u8]) -> Result<(bool, Reason)> {
        let (verdict, reason) = self.run_verdict(frame)?;
        Ok((verdict != Verdict::Drop, reason))
    }

    /// Runs one frame and returns what the kernel counted for it: the change
    /// of the frame counters, which must be this one frame and agree with
    /// what the program returned.
    pub fn run_verdict(&self, frame: &[u8]) -> Result<(Verdict, Reason)> {
        let before = self.maps.reasons()?;
        let pass = self.run(frame)?;
        let after = self.maps.reasons()?;
        let counted: Vec<(Reason, Verdict)> = Reason::ALL
            .into_iter()
            .flat_map(|r| Verdict::ALL.map(|v| (r, v)))
            .filter(|&(r, v)| after.get(r, v) != before.get(r, v))
            .collect();
        match counted[..] {
            [(reason, verdict)]
                if after.get(reason, verdict) == before.get(reason, verdict) + 1
                    && (verdict != Verdict::Drop) == pass =>
            {
                Ok((verdict, reason))
            }
            _ => bail!(
                "the frame counters did not count exactly this one frame (passed: {pass}): {counted:?}"
            ),
        }
    }

    /// Mean run time per repetition (the kernel's own figure) of `repeat`
    /// kernel-side repetitions of `frame` through the XDP program.
    pub fn time(&self, frame: &[u8], repeat: u32) -> Result<Duration> {
        timed(self.program(), frame, repeat)
    }
}

/// The mean run time per repetition of `repeat` kernel-side repetitions of
/// `frame` through `program`. A run a signal interrupts is run again: the
/// kernel stops a repeated run at a pending signal with EINTR, which no
/// restart covers, and a handled signal to this process (SIGCHLD, SIGHUP)
/// may land on the thread that makes it.
fn timed<P>(program: &P, frame: &[u8], repeat: u32) -> Result<Duration>
where
    P: for<'a> TestRun<Opts<'a> = TestRunOptions<'a>, Result = TestRunResult>,
{
    loop {
        let run = program.test_run(TestRunOptions {
            data_in: Some(frame),
            repeat,
            ..Default::default()
        });
        match run {
            Ok(result) => return Ok(result.duration),
            Err(e) if interrupted(&e) => continue,
            Err(e) => return Err(privileged("BPF_PROG_TEST_RUN", e.into())),
        }
    }
}

/// Whether `err` is, at its root, EINTR.
fn interrupted(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut at = Some(err);
    while let Some(e) = at {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::Interrupted)
        {
            return true;
        }
        at = e.source();
    }
    false
}

/// One BPF_PROG_TEST_RUN of `frame` through `program`: what it returned and
/// the frame as it left it.
fn run_once<P>(program: &P, frame: &[u8]) -> Result<(u32, Vec<u8>)>
where
    P: for<'a> TestRun<Opts<'a> = TestRunOptions<'a>, Result = TestRunResult>,
{
    let mut out = vec![0; frame.len()];
    let result = program
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ..Default::default()
        })
        .map_err(|e| privileged("BPF_PROG_TEST_RUN", e.into()))?;
    out.truncate(result.data_size_out as usize);
    Ok((result.return_value, out))
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
