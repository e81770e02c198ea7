//! An attachment: pkeyfw's programs on one interface, its maps and pins,
//! the RDMA-core probes and the binder that keeps its QPs bound, through
//! its whole life in one place: started ([`start`]: checked, loaded, filled,
//! attached and pinned, replacing one whose process is gone with what its
//! probes knew), then followed in the foreground ([`foreground`]: reloads,
//! QPs bound as they come, refused frames printed) or left pinned, and
//! detached ([`detach()`]); a switch's ports together ([`switch`]); a
//! running one found for a reload ([`target()`]); [`cost`] loads its
//! programs to see what they cost.
//!
//! Its callers (`pkeyfw attach`, `detach`, `switch`, the CNI plugin) give
//! it plain values: the interface and the namespace it is in, which it
//! enters itself and leaves again ([`enter`]), the policy file, the
//! [`Options`]; what it says goes to the sink they give ([`Say`]), and
//! what they print of the outcome is theirs.
//!
//! Either way the links are pinned from the start (see
//! [`pins`](crate::loading::pins)): enforcement never vanishes with a
//! process. A foreground attach removes its pins, detaching, on Ctrl-C or
//! SIGTERM; on SIGQUIT (a restart, an upgrade) or if it dies otherwise
//! (SIGKILL, a crash, the OOM killer) the filter enforces on, `stats` shows
//! its process gone, and `detach` or a new `attach` (which replaces it)
//! takes over.

#[macro_use]
mod say;

pub mod cost;
mod detach;
mod foreground;
mod start;
pub mod switch;
mod target;
pub mod tenants;

use std::path::Path;

use anyhow::{Result, bail};

pub use crate::host::iface::Iface;
use crate::{
    control::{binder::Binder, listeners, probes::Probes},
    host::{
        netlink::{self, XdpMode},
        netns::Netns,
    },
    loading::{
        filter::Filter,
        maps::Maps,
        pins::{self, Aside, Pins, PolicyEvent},
    },
    policy::Policy,
    reporting::{
        describe::{self, cli_iface},
        kernel_log::KernelLog,
        snapshot::Snapshot,
    },
};
pub use detach::{Detached, detach};
use foreground::{Exit, Signals, follow_or_warn, foreground, start_probes};
pub use say::Say;
use start::{attach_filter, refuse_if_taken};
pub use target::{Target, target};

/// `--mode`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Native if the driver supports it, else skb.
    Auto,
    /// XDP in the driver.
    Native,
    /// A TC ingress program in the network stack (reported as "tc"): any
    /// device; judges GSO/GRO super-packets whole.
    Skb,
}

/// How an attachment is made.
#[derive(Clone, Copy)]
pub struct Options {
    pub mode: Mode,
    /// Pin and return instead of staying in the foreground.
    pub pin: bool,
    /// Follow the policy file, re-applying it when it changes.
    pub watch: bool,
    /// Violation lines printed per second, at most.
    pub log_rate: u64,
    /// The programs log every frame they judge.
    pub trace: bool,
}

impl Options {
    /// Pinned, as a switch's ports, a tenant's and a pod's guard are.
    pub fn pinned(mode: Mode) -> Options {
        Options {
            mode,
            pin: true,
            watch: false,
            log_rate: 0,
            trace: false,
        }
    }
}

/// An interface as the command line names it (with `--netns`), for
/// messages.
trait Named {
    fn cli(&self) -> String;
}

impl Named for Iface {
    fn cli(&self) -> String {
        cli_iface(&self.name, self.netns.as_deref())
    }
}

/// This thread in another network namespace until dropped, when it is back
/// in the one it was in.
pub struct Entered {
    back: Option<Netns>,
}

/// Moves this thread into `netns` (a name or a path, as `ip -n` takes it;
/// None: stay), for as long as the result lives; threads it starts
/// meanwhile start there.
pub fn enter(netns: Option<&str>) -> Result<Entered> {
    let Some(spec) = netns else {
        return Ok(Entered { back: None });
    };
    let back = Netns::at(Path::new("/proc/thread-self/ns/net"))?;
    Netns::open(spec)?.enter()?;
    Ok(Entered { back: Some(back) })
}

impl Drop for Entered {
    fn drop(&mut self) {
        if let Some(back) = &self.back
            && let Err(e) = back.enter()
        {
            // This thread would go on in the wrong namespace.
            panic!("cannot return to the network namespace this thread was in: {e:#}");
        }
    }
}

/// One attachment asked for: where, by which policy, how, and to whom it
/// reports.
struct Job<'a> {
    iface: Iface,
    policy: &'a Path,
    opts: &'a Options,
    say: Say,
}

/// An attachment this process runs: its programs and maps, the binder that
/// keeps its QPs bound, its pins, where it reports. [`start`] makes it; in
/// the foreground it reloads and keeps its QPs bound ([`follow`]) until
/// detached or left enforcing.
struct Attachment {
    filter: Filter,
    binder: Binder,
    pins: Pins,
    say: Say,
}

/// Attaches `policy` to `iface` of network namespace `netns` (None: this
/// thread's) as `opts` say: pinned (and returns), or in the foreground
/// until a signal ends it. A policy that gives tenants devices makes a
/// tenant host ([`tenants`]).
pub fn attach(
    iface: &str,
    netns: Option<&str>,
    policy: &Path,
    opts: &Options,
    say: Say,
) -> Result<()> {
    let _entered = enter(netns)?;
    require_root()?;
    // Before anything is loaded: pins in a private bpffs would not outlive
    // this process.
    pins::host_bpffs("attach")?;
    let job = Job {
        iface: Iface::resolve(iface, netns)?,
        policy,
        opts,
        say,
    };
    let loaded = load(&job)?;
    if loaded.gives_devices() {
        return tenants::run(&job, loaded);
    }
    let started = start(&job, loaded)?;
    if opts.pin {
        return Ok(());
    }
    follow(&job, started)
}

/// The interface's part of the job's policy file, its warnings said.
fn load(job: &Job) -> Result<Policy> {
    let policy = Policy::load_port(job.policy, &job.iface.name, Some(job.iface.guid))?;
    for w in policy.warnings.iter().chain(&blind_spots(&job.iface.name)) {
        err!(job.say, "pkeyfw: warning: {w}");
    }
    Ok(policy)
}

/// An attachment started, with what follows it.
/// (Dropped in this order, a pinned one as soon as it is started: the
/// probes' registration before the runtime it is registered with.)
struct Started {
    probes: Option<tokio::io::unix::AsyncFd<Probes>>,
    kernel_log: KernelLog,
    attachment: Attachment,
    mode: XdpMode,
    signals: Signals,
    runtime: tokio::runtime::Runtime,
}

/// Starts the attachment `job` asks for with `policy` (see [`start`](mod@start)):
/// checked, loaded, attached, pinned, its probes started and what it bound
/// said.
fn start(job: &Job, policy: Policy) -> Result<Started> {
    let (iface, opts, say) = (&job.iface, job.opts, job.say);
    let mut binder = Binder::new(iface.index, policy);
    let pins = Pins::of(&iface.name);
    let gone = refuse_if_taken(&pins, job)?;

    // Signals are caught from before the attachment exists.
    let (runtime, signals) = Signals::caught()?;
    let old = match gone {
        Some(mode) => Some(set_aside(&pins, mode, job)?),
        None => None,
    };
    if let Err(e) = pins.create() {
        if let Some((old, _)) = &old {
            let _ = old.restore(&pins);
        }
        return Err(e);
    }
    // The owner is noted before anything is pinned, so that `stats` says
    // who sets it up, and an attachment whose process dies at any point
    // shows as foreground. A pinned one forgets its owner once set up.
    if opts.pin {
        pins.forget_record();
    }
    let attached = pins
        .remember_policy(job.policy)
        .and_then(|()| pins.remember_owner())
        .and_then(|()| attach_filter(&pins, &mut binder, job, old.as_ref()));
    let (mut filter, mode, bound) = match attached {
        Ok(done) => {
            if opts.pin {
                pins.forget_owner();
            }
            pins.note_policy(PolicyEvent::Attached);
            done
        }
        Err(e) => {
            let _ = pins.remove();
            if let Some((old, _)) = &old {
                let _ = old.restore(&pins);
            }
            return Err(e);
        }
    };
    let how = if opts.pin { "pinned" } else { "foreground" };
    let kernel_log = KernelLog::new(&iface.name);
    let (mut probes, unprobed) = {
        let _entered = runtime.enter();
        start_probes(&binder, &pins, &kernel_log)
    };
    // Every program is loaded; from here on the maps are read and written
    // as tenants make QPs.
    crate::loading::priority::ahead_of_tenants();
    start::replaced(
        &mut filter,
        &mut binder,
        old.as_ref(),
        probes.is_some(),
        say,
    )?;
    // The filter judges connection setup by what the probes record, from
    // the moment they record it, with the listeners they did not see start.
    let records = probes.as_ref().map_or(0, |p| p.get_ref().cm_records());
    filter.maps_mut().set_cm_records(records)?;
    let mut caught = match records {
        0 => Vec::new(),
        _ => listeners::reconcile(filter.maps_mut(), binder.ifindex()).unwrap_or_else(|e| {
            vec![format!(
                "pkeyfw: warning: cannot read the rdma_cm listeners ({e:#}): requests to one listening before the probes ran meet the unknown-QP rule"
            )]
        }),
    };
    if probes.is_some()
        && let Err(e) = binder.probes_started()
    {
        err!(
            say,
            "pkeyfw: warning: cannot read the QPs as the probes start ({e:#})"
        );
    }
    // QPs made between the snapshot the attach bound and the probes' start
    // are bound now.
    if probes.is_some() && binder.active() {
        caught.extend(binder.sync(filter.maps_mut())?);
    }
    // Enforcement is on: the logs' readers are extras, whose failure is
    // said, not fatal. A pinned attachment has no reader.
    if !opts.pin {
        if let Some(log) = probes.as_mut().and_then(|p| p.get_mut().log.take()) {
            follow_or_warn(log, "the probes' kernel log", say);
        }
        if opts.trace {
            follow_or_warn(
                filter.kernel_log(kernel_log.clone()),
                "--trace's kernel log",
                say,
            );
        }
    }
    out!(
        say,
        "pkeyfw: attached to {} ({} mode, {how}): {}",
        iface.name,
        mode.name(),
        summary(binder.policy(), job.policy)
    );
    for line in bound.iter().chain(&unprobed).chain(&caught) {
        out!(say, "{line}");
    }
    if opts.pin {
        if binder.active() && probes.is_none() {
            err!(
                say,
                "pkeyfw: warning: [[bind]] rules bound the QPs that exist now; without the QP-creation probes nothing binds new ones"
            );
        }
        out!(
            say,
            "pkeyfw: pinned under {}; `pkeyfw detach {}` removes it",
            pins.dir.display(),
            iface.cli()
        );
    }
    Ok(Started {
        probes,
        kernel_log,
        attachment: Attachment {
            filter,
            binder,
            pins,
            say,
        },
        mode,
        signals,
        runtime,
    })
}

/// Sets the attachment whose foreground process is gone aside, with its
/// maps: what its probes knew is not lost with it, even when it must go
/// first. (One of another map layout, an upgrade's, is replaced without.)
fn set_aside(pins: &Pins, mode: XdpMode, job: &Job) -> Result<(Aside, Result<Maps>)> {
    let aside = pins.set_aside()?;
    let maps = Maps::from_pins(&aside.dir);
    let fits = match job.opts.mode {
        Mode::Auto => true,
        Mode::Native => mode == XdpMode::Native,
        Mode::Skb => mode == XdpMode::Tc,
    };
    if !fits {
        err!(
            job.say,
            "pkeyfw: the old attachment runs in {} mode, which a link keeps: detaching it first",
            mode.name()
        );
        aside.remove()?;
    }
    Ok((aside, maps))
}

/// Follows a started attachment in the foreground until a signal ends it:
/// detached on Ctrl-C or SIGTERM, left enforcing on SIGQUIT or an error.
fn follow(job: &Job, started: Started) -> Result<()> {
    // Bound runtime first, so that it is dropped last.
    let Started {
        runtime,
        signals,
        mode,
        mut attachment,
        kernel_log,
        probes,
    } = started;
    let say = job.say;
    let result = runtime.block_on(foreground(
        &mut attachment,
        job,
        signals,
        probes,
        &kernel_log,
    ));
    // Only an explicit request (Ctrl-C, SIGTERM, `detach`) removes
    // enforcement: after an error the filter stays, held by its pinned
    // links, as after a crash, and so it does after SIGQUIT.
    let stays = format!(
        "the filter stays attached to {} and enforcing (pinned under {}); `pkeyfw detach {}` removes it",
        job.iface.name,
        attachment.pins.dir.display(),
        job.iface.cli()
    );
    match result {
        Err(e) => Err(e.context(stays)),
        Ok(Exit::KeepEnforcing) => {
            out!(say, "pkeyfw: exiting on SIGQUIT; {stays}");
            if job.opts.trace {
                err!(
                    say,
                    "pkeyfw: warning: it keeps tracing, into a ring no process reads, until an attach replaces it"
                );
            }
            Ok(())
        }
        Ok(Exit::Detach) => attachment.detach(&job.iface.name, mode),
    }
}

impl Attachment {
    /// Detaches this process's attachment and says its last counters.
    fn detach(self, iface: &str, mode: XdpMode) -> Result<()> {
        let Attachment {
            mut filter,
            pins,
            say,
            ..
        } = self;
        let last = Snapshot::read(iface, mode, false, filter.maps());
        // Removing the pinned links detaches.
        filter.detach()?;
        pins.remove()?;
        out!(say, "pkeyfw: detached from {iface}");
        let mut text = Vec::new();
        last?.text(&mut text)?;
        for line in String::from_utf8_lossy(&text).lines() {
            out!(say, "{line}");
        }
        Ok(())
    }
}

/// Paths by which RoCE reaches the host inside a packet XDP calls not RoCE:
/// SRv6 decapsulated after XDP. (IPsec and other tunnels ending on the host
/// are as blind; docs/security.md says so.)
fn blind_spots(iface: &str) -> Vec<String> {
    ["all", iface]
        .into_iter()
        .filter(|dev| {
            std::fs::read_to_string(format!("/proc/sys/net/ipv6/conf/{dev}/seg6_enabled"))
                .is_ok_and(|v| v.trim() != "0")
        })
        .map(|dev| {
            format!(
                "net.ipv6.conf.{dev}.seg6_enabled is on in this network namespace: RoCE inside SRv6 is decapsulated after XDP and never judged"
            )
        })
        .collect()
}

/// Switches the attachment pinned under `pins`, whose maps are `maps` and
/// which no process runs (pinned, or its foreground process gone), to
/// `policy`, with the QPs that exist; the lines saying what it bound. The
/// outcome is noted against it.
pub fn reload(pins: &Pins, maps: &mut Maps, policy: &Policy) -> Result<Vec<String>> {
    let mut binder = Binder::new(netlink::if_index(&pins.iface)?, policy.clone());
    let applied = maps
        .creations()
        .and_then(|records| binder.effective(&records))
        .and_then(|(effective, mut bound)| {
            maps.apply(&effective)?;
            bound.extend(binder.quarantine(maps, &[])?);
            Ok(bound)
        });
    pins.note_policy(match applied {
        Ok(_) => PolicyEvent::Reloaded,
        Err(_) => PolicyEvent::Refused,
    });
    let mut bound = applied?;
    // QPs the probe bound by the old rules while the new ones were
    // written are bound by the new ones now.
    bound.extend(binder.sync(maps)?);
    Ok(bound)
}

fn require_root() -> Result<()> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("attaching XDP needs root (CAP_BPF, CAP_NET_ADMIN); run pkeyfw with sudo");
    }
    Ok(())
}

fn summary(policy: &Policy, path: &Path) -> String {
    let table: Vec<String> = policy.pkeys.iter().map(|&p| describe::pkey(p)).collect();
    if let Some(role) = &policy.switch {
        return format!(
            "switch policy {} ({}), port P_Key table [{}], {}",
            path.display(),
            if policy.monitor { "monitor" } else { "enforce" },
            table.join(", "),
            describe::switch_role(role)
        );
    }
    format!(
        "policy {} ({}, unknown QPs: {}), P_Key table [{}], {} QPs, {} bind rules, {} groups",
        path.display(),
        if policy.monitor { "monitor" } else { "enforce" },
        policy.unknown_qp.name(),
        table.join(", "),
        policy.qps.len(),
        policy.binds.len(),
        policy.groups.len()
    )
}
