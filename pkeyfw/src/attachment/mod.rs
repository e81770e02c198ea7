//! An attachment: pkeyfw's programs on one interface, its maps and pins,
//! the RDMA-core probes and the binder that keeps its QPs bound, through
//! its whole life in one place: started ([`start`]: checked, loaded, filled,
//! attached and pinned, replacing one whose process is gone with what its
//! probes knew), then followed in the foreground ([`foreground`]: reloads,
//! QPs bound as they come, refused frames printed) or left pinned, and
//! detached. `pkeyfw attach` is its command, `pkeyfw switch attach` starts
//! one per port; [`cost`] loads its programs to see what they cost.
//!
//! Either way the links are pinned from the start (see
//! [`pins`](crate::loading::pins)): enforcement never vanishes with a
//! process. A foreground attach removes its pins, detaching, on Ctrl-C or
//! SIGTERM; on SIGQUIT (a restart, an upgrade) or if it dies otherwise
//! (SIGKILL, a crash, the OOM killer) the filter enforces on, `stats` shows
//! its process gone, and `detach` or a new `attach` (which replaces it)
//! takes over.

pub mod cost;
mod foreground;
mod start;
mod target;
pub mod tenants;

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::{
    control::{binder::Binder, listeners},
    host::netlink::{self, XdpMode},
    loading::{
        filter::Filter,
        maps::Maps,
        pins::{self, Pins, PolicyEvent},
    },
    policy::Policy,
    reporting::{
        describe::{self, cli_iface},
        kernel_log::KernelLog,
        snapshot::Snapshot,
    },
};
use foreground::{Exit, Signals, follow_or_warn, foreground, start_probes};
use start::{attach, refuse_if_taken};
pub use target::Target;

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

/// An attachment this process runs: its programs and maps, the binder that
/// keeps its QPs bound, its pins. [`run`] starts it; in the foreground it
/// reloads and keeps its QPs bound ([`foreground`]) until detached or left
/// enforcing.
struct Attachment {
    filter: Filter,
    binder: Binder,
    pins: Pins,
}

/// How an attachment is made: `pkeyfw attach`'s options.
pub struct Options {
    /// The interface, in this process's network namespace.
    pub iface: String,
    /// The namespace as the command line named it, for messages.
    pub netns: Option<String>,
    /// The policy file.
    pub policy: PathBuf,
    pub mode: Mode,
    /// Pin and exit instead of staying in the foreground.
    pub pin: bool,
    /// Follow the policy file, re-applying it when it changes.
    pub watch: bool,
    /// Violation lines printed per second, at most.
    pub log_rate: u64,
    /// The programs log every frame they judge.
    pub trace: bool,
}

/// Attaches as `opts` says, in the current network namespace: pinned (and
/// returns), or in the foreground until a signal ends it.
pub fn run(opts: &Options) -> Result<()> {
    require_root()?;
    // Before anything is loaded: pins in a private bpffs would not outlive
    // this process.
    pins::host_bpffs("attach")?;
    let index = netlink::if_index(&opts.iface)?;
    let guid = crate::host::iface::guid(&opts.iface)?;
    let policy = Policy::load_port(&opts.policy, &opts.iface, Some(guid))?;
    for w in policy.warnings.iter().chain(&blind_spots(&opts.iface)) {
        eprintln!("pkeyfw: warning: {w}");
    }
    if policy.gives_devices() {
        return tenants::run(opts, policy);
    }
    let mut binder = Binder::new(index, policy);
    let pins = Pins::of(&opts.iface);
    let gone = refuse_if_taken(&pins, index, opts)?;

    // Signals are caught from before the attachment exists.
    let (runtime, signals) = Signals::caught()?;
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
    // Every program is loaded; from here on the maps are read and written
    // as tenants make QPs.
    crate::loading::priority::ahead_of_tenants();
    start::replaced(&mut filter, &mut binder, old.as_ref(), probes.is_some())?;
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
        eprintln!("pkeyfw: warning: cannot read the QPs as the probes start ({e:#})");
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
            cli_iface(&opts.iface, opts.netns.as_deref())
        );
        return Ok(());
    }
    let mut attachment = Attachment {
        filter,
        binder,
        pins,
    };
    let result = runtime.block_on(foreground(
        &mut attachment,
        opts,
        signals,
        probes,
        &kernel_log,
    ));
    let Attachment {
        mut filter, pins, ..
    } = attachment;
    // Only an explicit request (Ctrl-C, SIGTERM, `detach`) removes
    // enforcement: after an error the filter stays, held by its pinned
    // links, as after a crash, and so it does after SIGQUIT.
    let stays = format!(
        "the filter stays attached to {} and enforcing (pinned under {}); `pkeyfw detach {}` removes it",
        opts.iface,
        pins.dir.display(),
        cli_iface(&opts.iface, opts.netns.as_deref())
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
