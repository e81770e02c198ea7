//! A tenant host: an interface whose policy gives every tenant a device of
//! its own (`own_device`). The interface is their uplink and carries no
//! filter: each tenant's device gets a macvlan of it and an rdma_rxe
//! device there (`control::tenancy`), and each such interface is an
//! ordinary attachment of its own (a tenant port, pinned, skb mode: a
//! macvlan has no native XDP), whose policy is its tenant's part of the
//! file (`Policy::for_tenant`). The device guard keeps each tenant to its
//! own device. What the host made is noted (`Record`), so that `detach`
//! removes it, `reload` adds and removes tenants, and an attach that
//! replaces one whose process is gone keeps every device, and the QPs on
//! it.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use aya::util::KernelVersion;

use super::{
    Job, Mode, Named as _, Options, Say,
    foreground::{Signal, Signals},
};
use crate::{
    control::tenancy::{self, guard::Guard},
    host::{netlink, netns::NetnsId},
    loading::{
        maps::Maps,
        pins::{
            Holder, Pins, PolicyEvent,
            record::{Made, Record, Tenant, host},
        },
    },
    policy::Policy,
};

/// `pkeyfw attach UPLINK` with `policy`, which gives its tenants devices:
/// the devices, their ports and the guard, pinned; then, in the
/// foreground, following signals and the policy file until told to go.
pub(super) fn run(job: &Job, policy: Policy) -> Result<()> {
    let (iface, say) = (&job.iface, job.say);
    // Signals are caught from before anything is made.
    let (runtime, signals) = Signals::caught()?;
    let kernel = KernelVersion::current().context("reading the kernel version")?;
    if kernel < KernelVersion::new(6, 1, 0) {
        bail!(
            "devices of their own for tenants need Linux 6.1 or later (the QP-creation probes that bind and quarantine each QP as it is made, and a device guard that reads who opens a device), this is {kernel}"
        );
    }
    if NetnsId::current()? != NetnsId::host()? {
        bail!(
            "{} is in another network namespace than the host's: the tenants' devices live in the initial one (rdma_rxe routes there, and a tenant bound by cgroup or ids runs there); attach an uplink of the host's namespace",
            iface.name
        );
    }
    let uplink = iface.index;
    let pins = Pins::tenant_host(&iface.name);
    let replacing = match host(&iface.name).map(|(p, _)| p.holder()) {
        Some(Holder::Gone(pid)) => {
            err!(
                say,
                "pkeyfw: replacing the tenant host on {} whose foreground process {pid} is gone; its devices stay",
                iface.name
            );
            true
        }
        Some(Holder::Pinned) => bail!(
            "{} is already a tenant host (pinned); `pkeyfw reload {}` applies another policy, `pkeyfw detach {}` removes it",
            iface.name,
            iface.cli(),
            iface.cli()
        ),
        Some(Holder::Foreground(pid)) => bail!(
            "{} is already a tenant host, held by a foreground `pkeyfw attach` (process {pid})",
            iface.name
        ),
        None => false,
    };
    if Pins::of(&iface.name).exists() {
        bail!(
            "{} carries a pkeyfw attachment of its own; `pkeyfw detach {}` first: as the tenants' uplink it carries none",
            iface.name,
            iface.cli()
        );
    }
    tenancy::check_uplink(&iface.name, uplink)?;
    pins.create()?;
    pins.remember_policy(job.policy)?;
    pins.remember_owner()?;
    let before = pins.tenants::<Record>().filter(|_| replacing);
    let record = match apply(&pins, &policy, job.policy, before.as_ref(), say) {
        Ok(record) => record,
        Err(e) => {
            if !replacing {
                let _ = pins.remove();
            }
            return Err(e);
        }
    };
    pins.note_policy(PolicyEvent::Attached);
    out!(
        say,
        "pkeyfw: {} is the uplink of {} tenants' own devices ({}): {}",
        iface.name,
        record.devices.len(),
        if job.opts.pin { "pinned" } else { "foreground" },
        devices_line(&record)
    );
    if job.opts.pin {
        pins.forget_owner();
        out!(
            say,
            "pkeyfw: pinned; `pkeyfw detach {}` removes the devices and their ports",
            iface.cli()
        );
        return Ok(());
    }
    out!(
        say,
        "pkeyfw: `pkeyfw events` streams the tenants' refused frames; `pkeyfw stats {}` counts them",
        iface.name
    );
    supervise(job, &runtime, signals)
}

/// "rxe_a on rxe_a (192.0.2.11/24), …".
fn devices_line(record: &Record) -> String {
    record
        .devices
        .iter()
        .map(|t| {
            let d = &t.made;
            format!("{} on {} ({})", d.device, d.iface, d.addrs.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Makes the host run `policy` (from `path`): the guard; the devices the
/// policy gives and `before` (what the host had) lacks, and ports for
/// them; the ports of the devices kept switched to their new policies; the
/// devices it no longer gives removed. On a failure what this call made
/// goes again, and what it kept runs as before.
fn apply(
    host: &Pins,
    policy: &Policy,
    path: &Path,
    before: Option<&Record>,
    say: Say,
) -> Result<Record> {
    let uplink_name = &host.iface;
    let uplink = netlink::if_index(uplink_name)?;
    let had: Vec<Made> = before
        .map(|r| r.devices.iter().map(|t| t.made.clone()).collect())
        .unwrap_or_default();
    // Every device the new policy keeps must be as it was.
    for (_, own) in policy.own_devices() {
        if let Some(old) = had.iter().find(|m| m.device == own.name) {
            let addrs: Vec<String> = own.addrs.iter().map(ToString::to_string).collect();
            if old.iface != own.iface || old.addrs != addrs {
                bail!(
                    "{}'s interface or addresses changed ({} {} → {} {}); its QPs live on the device as made: detach and attach to make it anew",
                    own.name,
                    old.iface,
                    old.addrs.join(", "),
                    own.iface,
                    addrs.join(", ")
                );
            }
        }
    }
    let fresh_guard = !tenancy::guard::pinned(&host.dir);
    let mut guard = if fresh_guard {
        Guard::attach(&host.dir)?
    } else {
        Guard::open(&host.dir)?
    };
    let mut made_now: Vec<Made> = Vec::new();
    let mut ported: Vec<String> = Vec::new();
    let undo = |made_now: &[Made], ported: &[String]| {
        for iface in ported {
            let _ = Pins::of(iface).remove();
        }
        for m in made_now {
            let _ = tenancy::remove(&m.device, &m.iface);
        }
        if fresh_guard {
            let _ = tenancy::guard::remove(&host.dir);
        }
        let _ = tenancy::restore_routing();
    };
    let quieted = before.and_then(|r| r.arp_ignore.clone()).is_none();
    let arp_ignore = match before.and_then(|r| r.arp_ignore.clone()) {
        Some(old) => old,
        None => tenancy::uplink_arp_ignore(uplink_name)?,
    };
    // Noted before anything is changed: the uplink's setting as it was,
    // and every device this call may make. An attach killed on the way
    // (SIGKILL, a crash) leaves what the next one, or a detach, removes.
    let mut pending = before.map(|r| r.devices.clone()).unwrap_or_default();
    for (rule, own) in policy.own_devices() {
        if !pending.iter().any(|t| t.made.device == own.name) {
            pending.push(Tenant {
                made: Made::pending(own),
                pkey: policy.binds[rule].pkey,
                line: policy.binds[rule].line,
            });
        }
    }
    host.note_tenants(&Record {
        devices: pending,
        arp_ignore: Some(arp_ignore.clone()),
    })?;
    if quieted {
        tenancy::quiet_uplink(uplink_name, &arp_ignore)?;
    }
    let arp_ignore = Some(arp_ignore);
    let mut switched = false;
    let result = (|| {
        guard.seal(true)?;
        let mut devices = Vec::new();
        let mut owners = BTreeMap::new();
        for (rule, own) in policy.own_devices() {
            let m = match tenancy::existing(own, uplink)? {
                Some(m) => m,
                None => {
                    let m = tenancy::make(own, uplink).with_context(|| {
                        format!(
                            "making {}'s own device {}",
                            rule_name(policy, rule),
                            own.name
                        )
                    })?;
                    made_now.push(m.clone());
                    m
                }
            };
            owners.insert(m.device.clone(), rule as u32);
            devices.push(Tenant {
                made: m,
                pkey: policy.binds[rule].pkey,
                line: policy.binds[rule].line,
            });
        }
        // A device the policy drops is no one's from now until it is gone:
        // an fd opened in between would outlive it being dropped.
        let dropped = had
            .iter()
            .filter(|o| !owners.contains_key(&o.device))
            .map(|o| o.device.clone())
            .collect();
        guard.stage(&policy.specs(), &owners, &dropped)?;
        guard.switch()?;
        switched = true;
        guard.seal(false)?;
        for m in devices.iter().map(|t| &t.made) {
            if Pins::of(&m.iface).exists() {
                reload_port(&m.iface, path, say)?;
            } else {
                attach_port(&m.iface, path, say)?;
                ported.push(m.iface.clone());
            }
        }
        Ok::<_, anyhow::Error>(devices)
    })();
    let devices = match result {
        Ok(devices) => devices,
        Err(e) => {
            // The guard goes back to the policy the ports still run.
            if switched {
                let _ = guard.switch();
            }
            let _ = guard.seal(false);
            undo(&made_now, &ported);
            if let (true, Some(old)) = (quieted, &arp_ignore) {
                let _ = tenancy::restore_uplink(uplink_name, old);
            }
            if let Some(before) = before {
                let _ = host.note_tenants(before);
            }
            return Err(e);
        }
    };
    // The devices the policy no longer gives go, their ports first.
    for old in had
        .iter()
        .filter(|o| !devices.iter().any(|d| d.made.device == o.device))
    {
        let _ = Pins::of(&old.iface).remove();
        tenancy::remove(&old.device, &old.iface).with_context(|| {
            format!("removing {}, which the policy no longer gives", old.device)
        })?;
    }
    let _ = guard.forget_gone();
    tenancy::restore_routing()?;
    let record = Record {
        devices,
        arp_ignore,
    };
    host.note_tenants(&record)?;
    Ok(record)
}

/// "the rule at line N".
fn rule_name(policy: &Policy, rule: usize) -> String {
    format!("the rule at line {}", policy.binds[rule].line)
}

/// Attaches a tenant's port, pinned: its TC programs (a macvlan has no
/// native XDP), its probes, its tenant's policy.
fn attach_port(iface: &str, policy: &Path, say: Say) -> Result<()> {
    super::attach(iface, None, policy, &Options::pinned(Mode::Skb), say)
        .with_context(|| format!("attaching {iface}, a tenant's port"))
}

/// Switches a tenant's pinned port to its part of the policy at `path`.
fn reload_port(iface: &str, path: &Path, say: Say) -> Result<()> {
    let pins = Pins::of(iface);
    let policy = Policy::load_port(path, iface, Some(crate::host::iface::guid(iface)?))?;
    let mut maps = Maps::from_pins(&pins.dir)?;
    for line in super::reload(&pins, &mut maps, &policy)? {
        out!(say, "{line}");
    }
    pins.remember_policy(path)
}

/// `pkeyfw reload UPLINK`: the host switched to the policy at `path` (the
/// file it runs, unless given), validated whole first.
pub fn reload(uplink: &str, path: Option<&Path>, say: Say) -> Result<()> {
    let Some((pins, record)) = host(uplink) else {
        bail!("{uplink} is no tenant host");
    };
    let path: PathBuf = match path {
        Some(p) => p.to_path_buf(),
        None => pins.remembered_policy()?,
    };
    if let Holder::Foreground(pid) = pins.holder() {
        return ask(&pins, pid);
    }
    let applied = Policy::load_port(&path, uplink, None)
        .map_err(anyhow::Error::from)
        .and_then(|policy| {
            if !policy.gives_devices() {
                bail!(
                    "{} gives the tenants no devices of their own: detach {uplink} and attach it with that policy",
                    path.display()
                );
            }
            apply(&pins, &policy, &path, Some(&record), say)
        });
    pins.note_policy(match applied {
        Ok(_) => PolicyEvent::Reloaded,
        Err(_) => PolicyEvent::Refused,
    });
    let record = applied?;
    pins.remember_policy(&path)?;
    out!(
        say,
        "pkeyfw: {uplink} now runs {}: {}",
        path.display(),
        devices_line(&record)
    );
    Ok(())
}

/// SIGHUPs the foreground attach of the host and waits until it noted a
/// reload, or a refusal.
fn ask(pins: &Pins, pid: u32) -> Result<()> {
    let before = pins.record();
    // SAFETY: sending a signal has no memory-safety preconditions.
    if unsafe { libc::kill(pid as libc::pid_t, libc::SIGHUP) } != 0 {
        bail!(
            "cannot signal the foreground pkeyfw attach (pid {pid}): {}",
            std::io::Error::last_os_error()
        );
    }
    let deadline = std::time::Instant::now() + ANSWER;
    loop {
        let now = pins.record();
        if now.reloaded > before.reloaded {
            return Ok(());
        }
        if now.refused > before.refused {
            bail!(
                "the foreground pkeyfw attach (pid {pid}) refused the policy; its output says why"
            );
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "the foreground pkeyfw attach (pid {pid}) did not reload within {} s",
                ANSWER.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How long a foreground host may take to reload: it may make devices and
/// attach their ports.
const ANSWER: Duration = Duration::from_secs(60);

/// `pkeyfw detach UPLINK`: every tenant's port and device, the guard, and
/// what the host changed on the uplink.
pub fn detach(uplink: &str) -> Result<()> {
    let Some((pins, record)) = host(uplink) else {
        bail!("{uplink} is no tenant host");
    };
    if let Holder::Foreground(pid) = pins.holder() {
        bail!(
            "{uplink} is held by a foreground `pkeyfw attach` (process {pid}); stop that process (Ctrl-C or SIGTERM) to detach"
        );
    }
    remove(&pins, &record)
}

/// Removes everything the host made: the ports first, so that no frame of
/// a device goes unjudged while it exists.
fn remove(pins: &Pins, record: &Record) -> Result<()> {
    for d in record.devices.iter().map(|t| &t.made) {
        let port = Pins::of(&d.iface);
        if port.exists() {
            port.remove()
                .with_context(|| format!("detaching {}, a tenant's port", d.iface))?;
        }
        tenancy::remove(&d.device, &d.iface)?;
    }
    tenancy::guard::remove(&pins.dir)?;
    if let Some(old) = &record.arp_ignore {
        tenancy::restore_uplink(&pins.iface, old)?;
    }
    tenancy::restore_routing()?;
    pins.remove()
}

/// The foreground host: reloads on SIGHUP and, with --watch, when its
/// policy file changes; removes everything on SIGINT or SIGTERM; leaves it
/// all in place on SIGQUIT (a restart's next attach takes it over).
fn supervise(job: &Job, runtime: &tokio::runtime::Runtime, mut signals: Signals) -> Result<()> {
    let (uplink, say) = (&job.iface.name, job.say);
    let pins = Pins::tenant_host(uplink);
    let mut running = Policy::load_port(job.policy, uplink, None).ok();
    let mut refused: Option<String> = None;
    runtime.block_on(async {
        let mut watch = tokio::time::interval(Duration::from_secs(1));
        watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            let signal = tokio::select! {
                s = signals.next() => Some(s),
                _ = watch.tick(), if job.opts.watch => None,
            };
            match signal {
                Some(Signal::Detach) => {
                    let (pins, record) = host(uplink).context("the tenant host is gone")?;
                    remove(&pins, &record)?;
                    out!(say, "pkeyfw: removed the tenants' devices and their ports from {uplink}");
                    return Ok(());
                }
                Some(Signal::Leave) => {
                    out!(say,
                        "pkeyfw: exiting on SIGQUIT; the tenants' devices and ports stay, enforcing; the next attach takes them over"
                    );
                    return Ok(());
                }
                Some(Signal::Reload) => {
                    follow(uplink, &pins, &mut running, &mut refused, true, say);
                }
                None => follow(uplink, &pins, &mut running, &mut refused, false, say),
            }
        }
    })
}

/// Applies the policy file again: on SIGHUP (`asked`), or when it says
/// something else than the policy in force. A file that does not load is
/// said once per error, and the running policy stays.
fn follow(
    uplink: &str,
    pins: &Pins,
    running: &mut Option<Policy>,
    refused: &mut Option<String>,
    asked: bool,
    say: Say,
) {
    let result = pins.remembered_policy().and_then(|path| {
        let policy = Policy::load_port(&path, uplink, None)?;
        if !asked && running.as_ref() == Some(&policy) {
            return Ok(None);
        }
        if !policy.gives_devices() {
            bail!(
                "{} gives the tenants no devices of their own: detach {uplink} and attach it with that policy",
                path.display()
            );
        }
        let before = pins.tenants::<Record>();
        let record = apply(pins, &policy, &path, before.as_ref(), say)?;
        *running = Some(policy);
        Ok(Some((path, record)))
    });
    match result {
        Ok(None) => *refused = None,
        Ok(Some((path, record))) => {
            pins.note_policy(PolicyEvent::Reloaded);
            *refused = None;
            out!(
                say,
                "pkeyfw: reloaded {uplink} from {}: {}",
                path.display(),
                devices_line(&record)
            );
        }
        Err(e) => {
            let e = format!("{e:#}");
            if asked || refused.as_ref() != Some(&e) {
                pins.note_policy(PolicyEvent::Refused);
                out!(say, "pkeyfw: reload refused, the running policy stays: {e}");
                *refused = Some(e);
            }
        }
    }
}
