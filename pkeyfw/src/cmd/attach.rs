//! `pkeyfw attach`: enforce a policy on a live interface, in the foreground
//! or pinned in bpffs.

use std::{
    os::fd::{AsRawFd, RawFd},
    path::Path,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use aya::programs::XdpMode as AyaMode;
use pkeyfw_common::{Reason, maps::UnknownQp};
use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::{SignalKind, signal},
};

use crate::{
    cmd::stats::Snapshot,
    describe, events,
    filter::Filter,
    maps::ReasonCounts,
    netlink::{self, XdpMode},
    pins::{Pins, State},
    policy::Policy,
};

/// `--mode`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Native if the driver supports it, else skb.
    Auto,
    Native,
    Skb,
}

pub struct Options<'a> {
    pub iface: &'a str,
    pub policy_path: &'a Path,
    pub mode: Mode,
    pub pin: bool,
    pub log_rate: u64,
}

pub fn run(opts: &Options) -> Result<()> {
    require_root()?;
    let index = netlink::if_index(opts.iface)?;
    let guid = super::iface_guid(opts.iface)?;
    let policy = Policy::load_for(opts.policy_path, Some(guid))?;
    for w in &policy.warnings {
        eprintln!("pkeyfw: warning: {w}");
    }
    let pins = Pins::of(opts.iface);
    refuse_if_taken(&pins, index)?;

    // Signals are caught from before the attachment exists, so that one sent
    // as soon as "attached" is printed is never lost.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let signals = {
        let _entered = runtime.enter();
        Signals::new()?
    };
    pins.create()?;
    let attached = pins
        .remember_policy(opts.policy_path)
        .and_then(|()| attach(&pins, &policy, opts));
    let (mut filter, mode) = match attached {
        Ok(done) => done,
        Err(e) => {
            let _ = pins.remove();
            return Err(e);
        }
    };
    let how = if opts.pin { "pinned" } else { "foreground" };
    println!(
        "pkeyfw: attached to {} ({} mode, {how}): {}",
        opts.iface,
        mode.name(),
        summary(&policy, opts.policy_path)
    );
    if opts.pin {
        println!(
            "pkeyfw: pinned under {}; `pkeyfw detach {}` removes it",
            pins.dir.display(),
            opts.iface
        );
        return Ok(());
    }
    let result = runtime.block_on(foreground(&mut filter, policy, opts, signals));
    let last = Snapshot::read(opts.iface, mode, false, filter.maps());
    filter.detach()?;
    pins.remove()?;
    result?;
    println!("pkeyfw: detached from {}", opts.iface);
    last?.text(&mut std::io::stdout().lock())?;
    Ok(())
}

fn require_root() -> Result<()> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("attaching XDP needs root (CAP_BPF, CAP_NET_ADMIN); run pkeyfw with sudo");
    }
    Ok(())
}

/// Refuses an interface that pkeyfw or another XDP program already holds;
/// clears pins that an exited foreground attachment left behind.
fn refuse_if_taken(pins: &Pins, index: u32) -> Result<()> {
    if pins.exists() {
        match pins.state() {
            Ok(State::Live { pinned, .. }) => {
                let how = if pinned {
                    format!("pinned; `pkeyfw detach {}` first", pins.iface)
                } else {
                    "held by a foreground `pkeyfw attach`".to_string()
                };
                bail!("{} is already managed by pkeyfw ({how})", pins.iface);
            }
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
    Ok(())
}

/// Loads, fills and attaches; pins the link for `--pin`.
fn attach(pins: &Pins, policy: &Policy, opts: &Options) -> Result<(Filter, XdpMode)> {
    let mut filter = Filter::load_pinned(policy.qps.len() as u32, &pins.dir)?;
    filter.apply(policy)?;
    let tried = match opts.mode {
        Mode::Native => filter.attach(opts.iface, AyaMode::Driver),
        Mode::Skb => filter.attach(opts.iface, AyaMode::Skb),
        Mode::Auto => filter
            .attach(opts.iface, AyaMode::Driver)
            .or_else(|native| {
                filter
                    .attach(opts.iface, AyaMode::Skb)
                    .with_context(|| format!("native mode failed too: {native:#}"))
            }),
    };
    tried.with_context(|| format!("attaching XDP to {}", opts.iface))?;
    let index = netlink::if_index(opts.iface)?;
    let mode = netlink::xdp_attached(index)?
        .filter(|a| Ok(a.prog_id) == filter.program_id().as_ref().map_err(|_| ()).copied())
        .context("the kernel does not report the program as attached")?
        .mode;
    if opts.pin {
        filter.pin_link(&pins.link())?;
    }
    Ok((filter, mode))
}

fn summary(policy: &Policy, path: &Path) -> String {
    let table: Vec<String> = policy.pkeys.iter().map(|&p| describe::pkey(p)).collect();
    format!(
        "policy {} ({}, unknown QPs: {}), P_Key table [{}], {} QPs, {} groups",
        path.display(),
        if policy.monitor { "monitor" } else { "enforce" },
        policy.unknown_qp.name(),
        table.join(", "),
        policy.qps.len(),
        policy.groups.len()
    )
}

/// The frames the counters say were refused.
fn violations(counts: &ReasonCounts, policy: &Policy) -> u64 {
    let c = |r: Reason| counts[r.index() as usize];
    c(Reason::PkeyViolation)
        + c(Reason::QkeyViolation)
        + c(Reason::OpcodeMismatch)
        + c(Reason::Malformed)
        + if policy.unknown_qp == UnknownQp::Drop {
            c(Reason::UnknownQp)
        } else {
            0
        }
}

/// Re-reads and applies the policy file.
fn reload(filter: &mut Filter, opts: &Options) -> Result<Policy> {
    let policy = Policy::load_for(opts.policy_path, Some(super::iface_guid(opts.iface)?))?;
    filter.apply(&policy)?;
    Ok(policy)
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
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }
}

/// Prints violations (rate-limited) until SIGINT or SIGTERM; SIGHUP reloads
/// the policy file.
async fn foreground(
    filter: &mut Filter,
    mut policy: Policy,
    opts: &Options<'_>,
    mut signals: Signals,
) -> Result<()> {
    let fd = Fd(filter.maps_mut().events().as_raw_fd());
    // SAFETY: the ring buffer's fd stays open, owned by `filter`, until
    // after this future (and `ready` with it) is gone.
    let ready = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
        .map_err(|e| e.into_parts().1)?;
    let mut second = tokio::time::interval(Duration::from_secs(1));
    let mut limiter = events::Limiter::new(opts.log_rate);
    let mut last = violations(&filter.maps().reasons()?, &policy);
    loop {
        tokio::select! {
            guard = ready.readable() => {
                let mut guard = guard?;
                while let Some(item) = filter.maps_mut().events().next() {
                    if let Some(e) = events::decode(&item)
                        && limiter.allow()
                    {
                        println!("{}", events::line(&e));
                    }
                }
                guard.clear_ready();
            }
            _ = second.tick() => {
                let now = violations(&filter.maps().reasons()?, &policy);
                if let Some(hidden) = limiter.tick(now - last) {
                    println!("… and {hidden} more refused frames in the last second");
                }
                last = now;
            }
            _ = signals.hangup.recv() => match reload(filter, opts) {
                Ok(new) => {
                    println!("pkeyfw: reloaded {}: {}", opts.iface, summary(&new, opts.policy_path));
                    policy = new;
                }
                Err(e) => println!("pkeyfw: reload refused, the running policy stays: {e:#}"),
            },
            _ = signals.interrupt.recv() => return Ok(()),
            _ = signals.terminate.recv() => return Ok(()),
        }
    }
}
