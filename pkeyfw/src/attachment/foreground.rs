//! A foreground attachment's life: signals (detach, leave enforcing,
//! reload), the policy file followed, QPs bound as the probes or RDMA
//! netlink show them, refused frames and verbs' events printed within a
//! rate, the probes' and `--trace`'s kernel logs read.

use std::{
    os::fd::{AsRawFd, RawFd},
    path::Path,
    time::Duration,
};

use anyhow::Result;
use aya_log::EbpfLogger;
use pkeyfw_common::abi::OnForeignJoin;
use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::{SignalKind, signal},
};

use super::{Attachment, Job, Say, summary};
use crate::{
    control::{
        binder::{self, Binder},
        listeners,
        probes::Probes,
    },
    loading::pins::{Pins, PolicyEvent},
    policy::Policy,
    reporting::{
        events,
        kernel_log::{self, KernelLog},
    },
};

impl Attachment {
    /// Frames refused so far, both ways (a switch port refuses outbound too).
    fn refused_so_far(&self) -> Result<u64> {
        let maps = self.filter.maps();
        Ok(maps.reasons()?.refused() + maps.xmit_reasons()?.refused())
    }

    /// Re-reads the policy file the attachment runs (which `pkeyfw reload
    /// --policy` may have changed) and applies it with the QPs that exist.
    fn reload(&mut self) -> Result<(std::path::PathBuf, Vec<String>)> {
        let Attachment {
            filter,
            binder,
            pins,
            ..
        } = self;
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

    /// `--watch`: applies the policy file if what it says differs from the
    /// policy in force; a file that does not load is reported once per
    /// error (`refused`), and the running policy stays.
    fn follow_file(&mut self, refused: &mut Option<String>) {
        let Attachment {
            filter,
            binder,
            pins,
            say,
        } = self;
        let (iface, say) = (&pins.iface, *say);
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
                out!(
                    say,
                    "pkeyfw: {} changed, reloaded {iface}: {}",
                    path.display(),
                    summary(binder.policy(), &path)
                );
                bound.iter().for_each(|line| out!(say, "{line}"));
            }
            Err(e) => {
                let e = format!("{e:#}");
                if refused.as_ref() != Some(&e) {
                    // Counted once, as it is said once.
                    pins.note_policy(PolicyEvent::Refused);
                    out!(
                        say,
                        "pkeyfw: the policy file changed but is refused, the running policy stays: {e}"
                    );
                    *refused = Some(e);
                }
            }
        }
    }

    /// Records the rdma_cm listeners no probe recorded, while some listener
    /// is known to lack a record (see `control::listeners`); says each
    /// thing once (`said`).
    fn record_listeners(&mut self, said: &mut std::collections::HashSet<String>) {
        let maps = self.filter.maps_mut();
        if maps.unrecorded_listeners().unwrap_or(0) == 0 {
            return;
        }
        let lines = listeners::reconcile(maps, self.binder.ifindex()).unwrap_or_else(|e| {
            vec![format!(
                "pkeyfw: cannot read the rdma_cm listeners, retrying: {e:#}"
            )]
        });
        for line in lines {
            if said.insert(line.clone()) {
                out!(self.say, "{line}");
            }
        }
    }

    /// Brings the QP bindings up to date, printing what changed; a failed
    /// read is reported once and retried at the next poll.
    fn resync(&mut self, last_error: &mut Option<String>) {
        let say = self.say;
        match self.binder.sync(self.filter.maps_mut()) {
            Ok(bound) => {
                *last_error = None;
                bound.iter().for_each(|line| out!(say, "{line}"));
            }
            Err(e) => {
                let e = format!("{e:#}");
                if last_error.as_ref() != Some(&e) {
                    out!(say, "pkeyfw: cannot read the QPs, retrying: {e}");
                    *last_error = Some(e);
                }
            }
        }
    }
}

/// The policy file the attachment runs, loaded for its port, and its path.
fn remembered(pins: &Pins) -> Result<(Policy, std::path::PathBuf)> {
    let path = pins.remembered_policy()?;
    let policy = Policy::load_port(
        &path,
        &pins.iface,
        Some(crate::host::iface::guid(&pins.iface)?),
    )?;
    Ok((policy, path))
}

/// How often `--watch` reads the policy: a parse of a small file, and
/// simpler than inotify across the symlink swaps ConfigMaps make.
const WATCH: Duration = Duration::from_secs(1);

/// The ring buffer's descriptor, for readiness only.
struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// The signals a foreground attachment answers.
pub(super) struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    /// SIGQUIT: exit and leave the filter enforcing, for a restart or an
    /// upgrade (the next attach takes it over).
    quit: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    /// A runtime for a foreground attachment, and its signals caught from
    /// now on, so that one sent as soon as the attachment is said to be
    /// there is never lost.
    pub(super) fn caught() -> Result<(tokio::runtime::Runtime, Signals)> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let signals = {
            let _entered = runtime.enter();
            Signals::new()?
        };
        Ok((runtime, signals))
    }

    fn new() -> Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            quit: signal(SignalKind::quit())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }
}

/// What a signal asks of a foreground attachment.
pub(super) enum Signal {
    /// SIGINT, SIGTERM: remove it.
    Detach,
    /// SIGQUIT: exit, leaving it enforcing.
    Leave,
    /// SIGHUP: reload the policy file.
    Reload,
}

impl Signals {
    /// The next signal.
    pub(super) async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupt.recv() => Signal::Detach,
            _ = self.terminate.recv() => Signal::Detach,
            _ = self.quit.recv() => Signal::Leave,
            _ = self.hangup.recv() => Signal::Reload,
        }
    }
}

/// How a foreground attachment ends.
pub(super) enum Exit {
    /// SIGINT, SIGTERM: remove the filter.
    Detach,
    /// SIGQUIT: leave it enforcing.
    KeepEnforcing,
}

/// Prints violations (rate-limited) and keeps the QP bindings in step until
/// SIGINT or SIGTERM (detach) or SIGQUIT (exit, enforcing on); SIGHUP
/// reloads the policy file.
pub(super) async fn foreground(
    att: &mut Attachment,
    job: &Job<'_>,
    mut signals: Signals,
    mut probes: Option<AsyncFd<Probes>>,
    kernel_log: &KernelLog,
) -> Result<Exit> {
    let say = job.say;
    // The event ring has one reader: this process, unless `pkeyfw events`
    // reads it already.
    let reader = att.pins.events_reader()?;
    if reader.is_none() {
        out!(
            say,
            "pkeyfw: `pkeyfw events` reads this attachment's violations; they are not printed here"
        );
    }
    // Refused frames, and the probes' reports on a ring of their own.
    let maps = att.filter.maps_mut();
    let fds = [maps.events().as_raw_fd(), maps.reports().as_raw_fd()];
    // SAFETY: the ring buffers' fds stay open, owned by `filter`, until
    // after this future (and `ready` with it) is gone.
    let [ready, reports_ready] = fds.map(|fd| {
        unsafe { AsyncFd::register_with_interest(Fd(fd), Interest::READABLE) }
            .map_err(|e| e.into_parts().1)
    });
    let (ready, reports_ready) = (ready?, reports_ready?);
    let mut second = tokio::time::interval(Duration::from_secs(1));
    let mut limiter = events::Limiter::new(job.opts.log_rate);
    let mut poll = tokio::time::interval(binder::POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut poll_error = None;
    let mut last = att.refused_so_far()?;
    let mut follow = tokio::time::interval(WATCH);
    follow.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut refused = None;
    // Listeners the probe found no room for, or did not see start, looked
    // for again while some are.
    let mut second_listeners = tokio::time::interval(Duration::from_secs(1));
    let mut said_listeners = std::collections::HashSet::new();
    second_listeners.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let exit = loop {
        tokio::select! {
            // The rings first: a re-read of the QPs waits for them, never
            // they for it.
            biased;
            guard = reports_ready.readable(), if reader.is_some() => {
                let mut guard = guard?;
                while let Some(item) = att.filter.maps_mut().reports().next() {
                    // A verb's report is one call, rare, and budgeted in the
                    // kernel: always shown.
                    if let Some(e) = events::decode(&item) {
                        out!(say, "{}", events::line(&e));
                    }
                }
                guard.clear_ready();
            }
            guard = ready.readable(), if reader.is_some() => {
                let mut guard = guard?;
                while let Some(item) = att.filter.maps_mut().events().next() {
                    // Refused frames, as the limiter lets them.
                    if let Some(e) = events::decode(&item)
                        && limiter.allow()
                    {
                        out!(say, "{}", events::line(&e));
                    }
                }
                guard.clear_ready();
            }
            // Then the signals and the policy file, ahead of the QPs' re-reads:
            // a tenant making QPs in a loop keeps those ready, and must not
            // hold off a reload or a stop.
            _ = signals.interrupt.recv() => break Exit::Detach,
            _ = signals.terminate.recv() => break Exit::Detach,
            _ = signals.quit.recv() => break Exit::KeepEnforcing,
            _ = signals.hangup.recv() => match att.reload() {
                Ok((path, bound)) => {
                    out!(say, "pkeyfw: reloaded {}: {}", job.iface.name, summary(att.binder.policy(), &path));
                    bound.iter().for_each(|line| out!(say, "{line}"));
                }
                Err(e) => out!(say, "pkeyfw: reload refused, the running policy stays: {e:#}"),
            },
            _ = follow.tick(), if job.opts.watch => att.follow_file(&mut refused),
            _ = second.tick() => {
                kernel_log.tick();
                let now = att.refused_so_far()?;
                if let Some(hidden) = limiter.tick(now - last) {
                    out!(say, "… and {hidden} more refused frames in the last second");
                }
                last = now;
            }
            created = qp_created(&mut probes) => {
                created?;
                att.resync(&mut poll_error);
            }
            _ = poll.tick(), if att.binder.active() => att.resync(&mut poll_error),
            _ = second_listeners.tick() => att.record_listeners(&mut said_listeners),
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
pub(super) fn start_probes(
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
    let mut said_cm = None;
    let mut said_setup = None;
    let registered = Probes::start(&pins.dir, binder.ifindex(), log.clone()).and_then(|w| {
        if let Err(why) = &w.cm_ports
            && binder.policy().binds.iter().any(|r| r.port.is_some())
        {
            said_cm = Some(format!(
                "pkeyfw: the rdma_cm ports of kernel users' QPs are not read as they are made ({why}): a QP a `port` rule binds is bound at the next re-read of the QPs (rdma_cm must be loaded when pkeyfw attaches)"
            ));
        }
        if let Err(why) = &w.connections {
            said_setup = Some(not_partitioned(why));
        }
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
        Ok(w) => {
            let lines: Vec<String> = said
                .filter(|_| needed)
                .into_iter()
                .chain(said_cm)
                .chain(said_setup)
                .collect();
            (Some(w), (!lines.is_empty()).then(|| lines.join("\n")))
        }
        Err(e) => {
            let qps = needed.then(|| {
                format!(
                    "pkeyfw: QP creation is not probed ({e:#}): a foreground attach finds new QPs every {} ms; the Q_Keys programs set are not captured (a UD QP bound without the policy's qkey refuses every datagram); joins go unreported{kill}",
                    binder::POLL.as_millis()
                )
            });
            let lines: Vec<String> = qps
                .into_iter()
                .chain([not_partitioned(&format!("{e:#}"))])
                .collect();
            (None, Some(lines.join("\n")))
        }
    }
}

/// The line that says connection setup goes unpartitioned, and `why`.
fn not_partitioned(why: &str) -> String {
    format!(
        "pkeyfw: connection setup is not partitioned ({why}): a CM request reaches any listener QP1 takes it for, whatever the listener's partition, and CM MADs leave with the key they carry"
    )
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
pub(super) fn follow_or_warn(log: Result<EbpfLogger<KernelLog>>, what: &str, say: Say) {
    if let Err(e) = log.and_then(kernel_log::follow) {
        err!(say, "pkeyfw: warning: {what} is not read: {e:#}");
    }
}
