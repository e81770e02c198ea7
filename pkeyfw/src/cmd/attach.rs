//! `pkeyfw attach`: enforce a policy on a live interface, in the foreground
//! or pinned in bpffs.
//!
//! Either way the links are pinned from the start (see
//! [`pins`](crate::loading::pins)): enforcement never vanishes with a
//! process. A foreground attach removes its pins, detaching, on Ctrl-C or
//! SIGTERM; on SIGQUIT (a restart, an upgrade) or if it dies otherwise
//! (SIGKILL, a crash, the OOM killer) the filter enforces on, `stats` shows
//! its process gone, and `detach` or a new `attach` (which replaces it)
//! takes over.

use std::{
    os::fd::{AsRawFd, RawFd},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use aya::programs::XdpMode as AyaMode;
use aya_log::EbpfLogger;
use pkeyfw_common::abi::{Capacity, EventKind, OnForeignJoin, SenderLayout};
use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::{SignalKind, signal},
};

use super::{NetnsArg, cli_iface};
use crate::{
    control::binder::{self, Binder},
    control::limits,
    control::netlink::{self, XdpMode},
    control::probes::{self, Probes},
    control::rdma,
    loading::filter::{Egress, Filter, Load},
    loading::maps::Maps,
    loading::pins::{self, Aside, Holder, Pins, PolicyEvent, State},
    policy::Policy,
    reporting::describe,
    reporting::events,
    reporting::kernel_log::{self, KernelLog},
    reporting::reach::Reach,
    reporting::snapshot::Snapshot,
};

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

/// Enforce a policy on an interface.
///
/// Loads the XDP program, fills its maps from the policy and attaches it.
/// In the foreground it prints a line per refused frame (at most
/// --log-rate a second, then how many more) and, on Ctrl-C or SIGTERM,
/// detaches and prints the final counters; on SIGQUIT it exits and leaves
/// the filter enforcing, for a restart or an upgrade to take over. With
/// --pin it exits after attaching; the filter runs on without any process.
///
/// Either way the program, its maps and its links are pinned under
/// /sys/fs/bpf/pkeyfw/NETNS/IFACE/ (NETNS: the network namespace's
/// inode), so enforcement never ends with a process: if a foreground
/// attach is killed (SIGKILL, OOM, a crash) the filter enforces on,
/// `stats` shows its process gone, and `detach` or a new `attach`
/// (which replaces it) takes over. Refused under `ip netns exec`, whose
/// private bpffs would vanish with the process: use --netns. Needs root.
#[derive(clap::Args)]
pub struct AttachArgs {
    /// The interface, in this network namespace (or --netns's).
    pub iface: String,
    #[command(flatten)]
    pub netns: NetnsArg,
    /// Partition policy (TOML).
    #[arg(long, value_name = "FILE")]
    pub policy: PathBuf,
    /// XDP mode: native (in the driver) or skb (generic); auto tries
    /// native first.
    #[arg(long, value_enum, default_value = "auto")]
    pub mode: Mode,
    /// Pin and exit instead of staying in the foreground.
    #[arg(long, conflicts_with = "watch")]
    pub pin: bool,
    /// Follow the policy file: re-apply it (as SIGHUP does) when what it
    /// says changes, its partitions.conf and a symlink swap of its
    /// directory included (as Kubernetes updates a mounted ConfigMap). A
    /// file that does not load is refused once, and the policy stays.
    #[arg(long)]
    pub watch: bool,
    /// Violation lines printed per second, at most.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub log_rate: u64,
    /// For debugging: the programs log every RoCE frame they judge (where,
    /// verdict, reason, P_Key, Q_Key, QPs, opcode, addresses: every
    /// tenant's, into this output and so the service's journal) and every
    /// stamping outcome, printed from the kernel's log (aya-log). Each line
    /// costs its frame a ring-buffer write. Without it the verifier removes
    /// the logging code at load: the packet path is as if it were not there.
    #[arg(long, conflicts_with = "pin")]
    pub trace: bool,
}

pub fn run(opts: &AttachArgs) -> Result<()> {
    require_root()?;
    opts.netns.enter()?;
    // Before anything is loaded: pins in a private bpffs would not outlive
    // this process.
    pins::host_bpffs("attach")?;
    let index = netlink::if_index(&opts.iface)?;
    let guid = super::iface_guid(&opts.iface)?;
    let policy = Policy::load_port(&opts.policy, &opts.iface, Some(guid))?;
    for w in policy.warnings.iter().chain(&blind_spots(&opts.iface)) {
        eprintln!("pkeyfw: warning: {w}");
    }
    let mut binder = Binder::new(index, policy);
    let pins = Pins::of(&opts.iface);
    let gone = refuse_if_taken(&pins, index, opts)?;

    // Signals are caught from before the attachment exists, so that one sent
    // as soon as "attached" is printed is never lost.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let signals = {
        let _entered = runtime.enter();
        Signals::new()?
    };
    let old = match gone {
        Some(mode) => {
            let aside = pins.set_aside()?;
            // What the old attachment's probes knew is not lost with it,
            // even when it must go first. (One of another map layout, an
            // upgrade's, is replaced without.)
            let maps = Maps::from_pins(&aside.dir);
            let fits = match opts.mode {
                Mode::Auto => true,
                Mode::Native => mode == XdpMode::Native,
                Mode::Skb => mode == XdpMode::Tc,
            };
            if !fits {
                eprintln!(
                    "pkeyfw: the old attachment runs in {} mode, which a link keeps: detaching it first",
                    mode.name()
                );
                aside.remove()?;
            }
            Some((aside, maps))
        }
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
        .remember_policy(&opts.policy)
        .and_then(|()| pins.remember_owner())
        .and_then(|()| attach(&pins, &mut binder, opts, old.as_ref()));
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
    let kernel_log = KernelLog::new(&opts.iface);
    let (mut probes, unprobed) = {
        let _entered = runtime.enter();
        start_probes(&binder, &pins, &kernel_log)
    };
    // QPs made between the snapshot the attach bound and the probes' start
    // are bound now.
    let mut caught = Vec::new();
    if probes.is_some() && binder.active() {
        caught = binder.sync(filter.maps_mut())?;
    }
    // Enforcement is on: the logs' readers are extras, whose failure is
    // said, not fatal. A pinned attachment has no reader.
    if !opts.pin {
        if let Some(log) = probes.as_mut().and_then(|p| p.get_mut().log.take()) {
            follow_or_warn(log, "the probes' kernel log");
        }
        if opts.trace {
            follow_or_warn(
                filter.kernel_log(kernel_log.clone()),
                "--trace's kernel log",
            );
        }
    }
    println!(
        "pkeyfw: attached to {} ({} mode, {how}): {}",
        opts.iface,
        mode.name(),
        summary(binder.policy(), &opts.policy)
    );
    for line in bound.iter().chain(&unprobed).chain(&caught) {
        println!("{line}");
    }
    if opts.pin {
        if binder.active() && probes.is_none() {
            eprintln!(
                "pkeyfw: warning: [[bind]] rules bound the QPs that exist now; without the QP-creation probes nothing binds new ones"
            );
        }
        println!(
            "pkeyfw: pinned under {}; `pkeyfw detach {}` removes it",
            pins.dir.display(),
            cli_iface(&opts.iface, opts.netns.name())
        );
        return Ok(());
    }
    let result = runtime.block_on(foreground(
        &mut filter,
        &mut binder,
        &pins,
        opts,
        signals,
        probes,
        &kernel_log,
    ));
    // Only an explicit request (Ctrl-C, SIGTERM, `detach`) removes
    // enforcement: after an error the filter stays, held by its pinned
    // links, as after a crash, and so it does after SIGQUIT.
    let stays = format!(
        "the filter stays attached to {} and enforcing (pinned under {}); `pkeyfw detach {}` removes it",
        opts.iface,
        pins.dir.display(),
        cli_iface(&opts.iface, opts.netns.name())
    );
    match result {
        Err(e) => return Err(e.context(stays)),
        Ok(Exit::KeepEnforcing) => {
            println!("pkeyfw: exiting on SIGQUIT; {stays}");
            if opts.trace {
                eprintln!(
                    "pkeyfw: warning: it keeps tracing, into a ring no process reads, until an attach replaces it"
                );
            }
            return Ok(());
        }
        Ok(Exit::Detach) => {}
    }
    let last = Snapshot::read(&opts.iface, mode, false, filter.maps());
    // Removing the pinned links detaches.
    filter.detach()?;
    pins.remove()?;
    println!("pkeyfw: detached from {}", opts.iface);
    last?.text(&mut std::io::stdout().lock())?;
    Ok(())
}

/// Whether an event reports a refused frame (rate-limited), not a verb.
fn is_frame(kind: u8) -> bool {
    kind == EventKind::Frame as u8 || kind == EventKind::SwitchPort as u8
}

/// Frames refused so far, both ways (a switch port refuses outbound too).
fn refused_so_far(filter: &Filter) -> Result<u64> {
    let maps = filter.maps();
    Ok(maps.reasons()?.refused() + maps.xmit_reasons()?.refused())
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

fn require_root() -> Result<()> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("attaching XDP needs root (CAP_BPF, CAP_NET_ADMIN); run pkeyfw with sudo");
    }
    Ok(())
}

/// Refuses an interface that pkeyfw or another XDP program already holds;
/// clears pins that an exited attachment left behind. An attachment whose
/// foreground process is gone is to be replaced: its mode is returned.
fn refuse_if_taken(pins: &Pins, index: u32, opts: &AttachArgs) -> Result<Option<XdpMode>> {
    if pins.exists() {
        match pins.state() {
            Ok(State::Live {
                holder: Holder::Gone(pid),
                mode,
            }) => {
                eprintln!(
                    "pkeyfw: replacing the attachment on {} whose foreground process {pid} is gone",
                    pins.iface
                );
                return Ok(Some(mode));
            }
            Ok(State::Live { holder, .. }) => {
                let how = match holder {
                    Holder::Pinned => format!(
                        "pinned; `pkeyfw detach {}` first",
                        cli_iface(&pins.iface, opts.netns.name())
                    ),
                    _ => format!(
                        "held by a foreground `pkeyfw attach`, {}",
                        holder.describe()
                    ),
                };
                bail!("{} is already managed by pkeyfw ({how})", pins.iface);
            }
            Ok(State::SettingUp(pid)) => bail!(
                "{} is being set up by another `pkeyfw attach` (process {pid})",
                pins.iface
            ),
            Ok(State::Stale) | Err(_) => {
                eprintln!(
                    "pkeyfw: removing stale pins of an exited attachment under {}",
                    pins.dir.display()
                );
                pins.remove()?;
            }
        }
    }
    if let Some(other) = netlink::xdp_attached(index)? {
        bail!(
            "{} already has an XDP program (id {}, {} mode); pkeyfw will not replace it",
            pins.iface,
            other.prog_id,
            other.mode.name()
        );
    }
    Ok(None)
}

/// Loads, fills (binding the QPs that exist), attaches and pins the links.
/// Replacing an attachment (`old`, set aside, with its maps), it carries the
/// probes' state over, switches the old links to the new programs (no
/// moment without a filter) and removes the old pins and filters.
fn attach(
    pins: &Pins,
    binder: &mut Binder,
    opts: &AttachArgs,
    old: Option<&(Aside, Result<Maps>)>,
) -> Result<(Filter, XdpMode, Vec<String>)> {
    let (policy, bound) = binder.effective().unwrap_or_else(|e| {
        eprintln!("pkeyfw: warning: cannot read the QPs ({e:#}); [[bind]] rules bind none yet");
        (binder.policy().clone(), Vec::new())
    });
    // The interface's RDMA devices, read once for what follows from them.
    let devices = rdma::devices_on(binder.ifindex());
    let reach = Reach::of(&opts.iface, devices.as_deref());
    if let Some(line) = reach.line {
        println!("pkeyfw: {line}");
    }
    for w in reach.warnings {
        eprintln!("pkeyfw: warning: {w}");
    }
    let sender = sender(devices.as_deref(), &policy);
    let capacity = Capacity {
        qps: policy.qps.len() as u32,
        probed: probe_capacity(devices.as_deref().unwrap_or_default(), &policy),
    };
    let mut filter = Filter::load_with(&Load {
        capacity,
        switch: policy.switch.is_some(),
        pin: Some(&pins.dir),
        trace: opts.trace,
        sender,
    })?;
    if let Some((_, maps)) = old {
        match maps {
            Ok(maps) => filter.maps_mut().inherit(maps)?,
            Err(e) => eprintln!(
                "pkeyfw: warning: what the replaced attachment's probes knew is lost ({e:#}): its QPs are bound again from /proc, without the Q_Keys they set"
            ),
        }
        filter.replacing(binder.ifindex())?;
    }
    let old = old.map(|(aside, _)| aside);
    filter.apply(&policy)?;
    let took_over = match old.filter(|old| old.link().exists()) {
        Some(old) => {
            let egress = old.egress_link();
            match filter.take_over(&old.link(), egress.exists().then_some(egress.as_path())) {
                Ok(()) => true,
                Err(e) => {
                    eprintln!(
                        "pkeyfw: cannot switch the old attachment in place ({e:#}): detaching it first"
                    );
                    old.remove()?;
                    false
                }
            }
        }
        None => false,
    };
    // Skb mode is the TC ingress program, not generic XDP: it sees a GSO/GRO
    // super-packet whole (see docs/security.md), and runs on 6.1 (clsact) too.
    let skb = |filter: &mut Filter| {
        filter
            .attach_ingress(&opts.iface, Egress::Auto)
            .context("attaching the TC ingress program")
    };
    let tried = match opts.mode {
        _ if took_over => Ok(()),
        Mode::Native => filter.attach(&opts.iface, AyaMode::Driver),
        Mode::Skb => skb(&mut filter),
        Mode::Auto => filter
            .attach(&opts.iface, AyaMode::Driver)
            .or_else(|native| {
                skb(&mut filter).with_context(|| format!("native mode failed too: {native:#}"))
            }),
    };
    tried.with_context(|| format!("attaching to {}", opts.iface))?;
    // A switch port's outbound check and restore are the egress program's
    // too; attached whatever the role, so that a reload may change it.
    if (policy.stamp || policy.switch.is_some()) && !filter.has_egress() {
        filter
            .attach_egress(&opts.iface, Egress::Auto)
            .with_context(|| format!("attaching the egress program to {}", opts.iface))?;
    }
    let mode = if filter.is_tc() {
        XdpMode::Tc
    } else {
        let index = netlink::if_index(&opts.iface)?;
        netlink::xdp_attached(index)?
            .filter(|a| Ok(a.prog_id) == filter.program_id().as_ref().map_err(|_| ()).copied())
            .context("the kernel does not report the program as attached")?
            .mode
    };
    filter.pin_link(pins)?;
    // The new filter is in place: one old filter left (gone meanwhile, or
    // not deletable) is said, not a reason to undo the attachment.
    if let Err(e) = filter.remove_replaced() {
        eprintln!("pkeyfw: warning: {e:#}");
    }
    if let Some(old) = old.filter(|old| old.dir.exists()) {
        old.remove()?;
    }
    Ok((filter, mode, bound))
}

/// QPs the QP-creation probe may bind at once: what the interface's RDMA
/// devices hold (lowered by the policy); with what bounds each tenant's
/// share, said.
fn probe_capacity(devices: &[rdma::Device], policy: &Policy) -> u32 {
    let capacity = limits::probe_capacity(devices, policy);
    let names: Vec<String> = devices.iter().map(|d| d.name.clone()).collect();
    if policy.binds.is_empty() || names.is_empty() {
        return capacity.qps;
    }
    let (lines, warnings) = limits::tenant_bounds(policy, &names, Some(capacity.qps));
    println!(
        "pkeyfw: the QP-creation probe binds up to {} QPs at once ({})",
        capacity.qps, capacity.from
    );
    for line in lines {
        println!("pkeyfw: {line}");
    }
    for w in capacity.notes.iter().chain(&warnings) {
        eprintln!("pkeyfw: warning: {w}");
    }
    capacity.qps
}

/// Where the egress program learns which rdma_rxe QP sent a frame; where
/// it cannot, every frame is a process's, which a stamping policy is warned
/// of.
fn sender(devices: Result<&[rdma::Device], &anyhow::Error>, policy: &Policy) -> SenderLayout {
    let layout = devices
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .and_then(probes::sender_layout);
    if policy.stamp {
        match &layout {
            Ok(l) if !l.knows_qps() => eprintln!(
                "pkeyfw: warning: the interface has no rdma_rxe device: every outgoing RoCE frame leaves with the default P_Key"
            ),
            Ok(_) => {}
            Err(e) => eprintln!(
                "pkeyfw: warning: rdma_rxe's QPs cannot be told apart ({e:#}): every outgoing RoCE frame leaves with the default P_Key"
            ),
        }
    }
    layout.unwrap_or(SenderLayout::NONE)
}

fn summary(policy: &Policy, path: &Path) -> String {
    let table: Vec<String> = policy.pkeys.iter().map(|&p| describe::pkey(p)).collect();
    if let Some(role) = &policy.switch {
        return format!(
            "switch policy {} ({}), port P_Key table [{}], {}",
            path.display(),
            if policy.monitor { "monitor" } else { "enforce" },
            table.join(", "),
            crate::cmd::policy::role_text(role)
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

/// Re-reads the policy file the attachment runs (which `pkeyfw reload
/// --policy` may have changed) and applies it with the QPs that exist.
fn reload(
    filter: &mut Filter,
    binder: &mut Binder,
    pins: &Pins,
) -> Result<(std::path::PathBuf, Vec<String>)> {
    let result = remembered(pins).and_then(|(policy, path)| {
        filter.maps().same_role(&policy)?;
        let bound = binder.replace(policy, filter.maps_mut())?;
        Ok((path, bound))
    });
    pins.note_policy(match result {
        Ok(_) => PolicyEvent::Reloaded,
        Err(_) => PolicyEvent::Refused,
    });
    result
}

/// The policy file the attachment runs, loaded for its port, and its path.
fn remembered(pins: &Pins) -> Result<(Policy, std::path::PathBuf)> {
    let path = pins.remembered_policy()?;
    let policy = Policy::load_port(&path, &pins.iface, Some(super::iface_guid(&pins.iface)?))?;
    Ok((policy, path))
}

/// How often `--watch` reads the policy: a parse of a small file, and
/// simpler than inotify across the symlink swaps ConfigMaps make.
const WATCH: Duration = Duration::from_secs(1);

/// `--watch`: applies the policy file if what it says differs from the
/// policy in force; a file that does not load is reported once per error
/// (`refused`), and the running policy stays.
fn follow_file(
    filter: &mut Filter,
    binder: &mut Binder,
    pins: &Pins,
    iface: &str,
    refused: &mut Option<String>,
) {
    let result = match remembered(pins) {
        Ok((policy, _)) if &policy == binder.policy() => {
            *refused = None;
            return;
        }
        Ok((policy, path)) => binder
            .replace(policy, filter.maps_mut())
            .map(|bound| (path, bound)),
        Err(e) => Err(e),
    };
    match result {
        Ok((path, bound)) => {
            pins.note_policy(PolicyEvent::Reloaded);
            *refused = None;
            println!(
                "pkeyfw: {} changed, reloaded {iface}: {}",
                path.display(),
                summary(binder.policy(), &path)
            );
            bound.iter().for_each(|line| println!("{line}"));
        }
        Err(e) => {
            let e = format!("{e:#}");
            if refused.as_ref() != Some(&e) {
                // Counted once, as it is said once.
                pins.note_policy(PolicyEvent::Refused);
                println!(
                    "pkeyfw: the policy file changed but is refused, the running policy stays: {e}"
                );
                *refused = Some(e);
            }
        }
    }
}

/// The ring buffer's descriptor, for readiness only.
struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// The signals a foreground attachment answers.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    /// SIGQUIT: exit and leave the filter enforcing, for a restart or an
    /// upgrade (the next attach takes it over).
    quit: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            quit: signal(SignalKind::quit())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }
}

/// How a foreground attachment ends.
enum Exit {
    /// SIGINT, SIGTERM: remove the filter.
    Detach,
    /// SIGQUIT: leave it enforcing.
    KeepEnforcing,
}

/// Prints violations (rate-limited) and keeps the QP bindings in step until
/// SIGINT or SIGTERM (detach) or SIGQUIT (exit, enforcing on); SIGHUP
/// reloads the policy file.
async fn foreground(
    filter: &mut Filter,
    binder: &mut Binder,
    pins: &Pins,
    opts: &AttachArgs,
    mut signals: Signals,
    mut probes: Option<AsyncFd<Probes>>,
    kernel_log: &KernelLog,
) -> Result<Exit> {
    // The event ring has one reader: this process, unless `pkeyfw events`
    // reads it already.
    let reader = pins.events_reader()?;
    if reader.is_none() {
        println!(
            "pkeyfw: `pkeyfw events` reads this attachment's violations; they are not printed here"
        );
    }
    let fd = Fd(filter.maps_mut().events().as_raw_fd());
    // SAFETY: the ring buffer's fd stays open, owned by `filter`, until
    // after this future (and `ready` with it) is gone.
    let ready = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
        .map_err(|e| e.into_parts().1)?;
    let mut second = tokio::time::interval(Duration::from_secs(1));
    let mut limiter = events::Limiter::new(opts.log_rate);
    let mut poll = tokio::time::interval(binder::POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut poll_error = None;
    let mut last = refused_so_far(filter)?;
    let mut follow = tokio::time::interval(WATCH);
    follow.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut refused = None;
    let exit = loop {
        tokio::select! {
            guard = ready.readable(), if reader.is_some() => {
                let mut guard = guard?;
                while let Some(item) = filter.maps_mut().events().next() {
                    // A verb's event (a join, a Q_Key) is one call, rare,
                    // and budgeted in the kernel: always shown; refused
                    // frames by the limiter.
                    if let Some(e) = events::decode(&item)
                        && (!is_frame(e.kind) || limiter.allow())
                    {
                        println!("{}", events::line(&e));
                    }
                }
                guard.clear_ready();
            }
            _ = second.tick() => {
                kernel_log.tick();
                let now = refused_so_far(filter)?;
                if let Some(hidden) = limiter.tick(now - last) {
                    println!("… and {hidden} more refused frames in the last second");
                }
                last = now;
            }
            created = qp_created(&mut probes) => {
                created?;
                resync(binder, filter, &mut poll_error);
            }
            _ = poll.tick(), if binder.active() => resync(binder, filter, &mut poll_error),
            _ = follow.tick(), if opts.watch => {
                follow_file(filter, binder, pins, &opts.iface, &mut refused);
            }
            _ = signals.hangup.recv() => match reload(filter, binder, pins) {
                Ok((path, bound)) => {
                    println!("pkeyfw: reloaded {}: {}", opts.iface, summary(binder.policy(), &path));
                    bound.iter().for_each(|line| println!("{line}"));
                }
                Err(e) => println!("pkeyfw: reload refused, the running policy stays: {e:#}"),
            },
            _ = signals.interrupt.recv() => break Exit::Detach,
            _ = signals.terminate.recv() => break Exit::Detach,
            _ = signals.quit.recv() => break Exit::KeepEnforcing,
        }
    };
    kernel_log.finish();
    Ok(exit)
}

/// The RDMA probes, pinned with the filter: wherever ib_core is loaded (a
/// later reload may bring rules), and where the policy needs them (it
/// binds, stamps, or lists groups whose joins are watched) with a word on
/// what could not start. Started before "attached" is said, so that
/// nothing the verbs do from then on is missed. Needs the runtime's context.
fn start_probes(
    binder: &Binder,
    pins: &Pins,
    log: &KernelLog,
) -> (Option<AsyncFd<Probes>>, Option<String>) {
    // A switch port sees other hosts' frames: its own QPs are not its
    // business.
    if binder.policy().switch.is_some() {
        return (None, None);
    }
    let needed = binder.active() || !binder.policy().groups.is_empty();
    if !needed && !Path::new("/sys/module/ib_core").exists() {
        return (None, None);
    }
    // What goes unenforced with the join probe.
    let kill = match binder.policy().join_action() {
        OnForeignJoin::Kill => {
            ", and no joiner is killed (foreign_join = \"kill\" is not in force)"
        }
        OnForeignJoin::Report => "",
    };
    let mut said = None;
    let registered = Probes::start(&pins.dir, binder.ifindex(), log.clone()).and_then(|w| {
        if let Err(why) = &w.readers {
            said = Some(format!(
                "pkeyfw: the Q_Keys programs set and multicast joins are not probed ({why}): a UD QP a rule binds with its own Q_Key refuses every frame, joins go unreported{kill}"
            ));
        }
        // SAFETY: the ring buffer's fd is owned by the probes, which the
        // AsyncFd owns; it closes only when the AsyncFd is dropped.
        unsafe { AsyncFd::register_with_interest(w, Interest::READABLE) }
            .map_err(|e| e.into_parts().1.into())
    });
    match registered {
        Ok(w) => (Some(w), said.filter(|_| needed)),
        Err(e) => (
            None,
            needed.then(|| {
                format!(
                    "pkeyfw: QP creation is not probed ({e:#}); a foreground attach finds new QPs every {} ms; joins go unreported{kill}",
                    binder::POLL.as_millis()
                )
            }),
        ),
    }
}

/// Waits for the QP-creation probe's wake-up (forever without a probe).
async fn qp_created(probes: &mut Option<AsyncFd<Probes>>) -> Result<()> {
    let Some(probes) = probes else {
        return std::future::pending().await;
    };
    let mut guard = probes.readable_mut().await?;
    guard.get_inner_mut().drain();
    guard.clear_ready();
    Ok(())
}

/// Starts printing a kernel log ring, or says why it cannot.
fn follow_or_warn(log: Result<EbpfLogger<KernelLog>>, what: &str) {
    if let Err(e) = log.and_then(kernel_log::follow) {
        eprintln!("pkeyfw: warning: {what} is not read: {e:#}");
    }
}

/// Brings the QP bindings up to date, printing what changed; a failed read
/// is reported once and retried at the next poll.
fn resync(binder: &mut Binder, filter: &mut Filter, last_error: &mut Option<String>) {
    match binder.sync(filter.maps_mut()) {
        Ok(bound) => {
            *last_error = None;
            bound.iter().for_each(|line| println!("{line}"));
        }
        Err(e) => {
            let e = format!("{e:#}");
            if last_error.as_ref() != Some(&e) {
                println!("pkeyfw: cannot read the QPs, retrying: {e}");
                *last_error = Some(e);
            }
        }
    }
}
