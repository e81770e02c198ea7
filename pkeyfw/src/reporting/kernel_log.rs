//! Log lines from the kernel programs (aya-log), as a foreground attachment
//! (and so a service's journal) prints them: the probes' rare failures (a
//! table full, a structure unreadable), and `attach --trace`'s line per
//! judged frame.
//!
//! A tenant can make a probe fail on purpose (by creating QPs until a table
//! is full), so warnings are budgeted per place in the kernel code, as
//! OpenSM ages repeated traps: at most [`BURST`] lines per [`WINDOW`], then
//! one line saying how many more there were. Trace lines are not budgeted:
//! tracing is asked for, and its ring buffer bounds it.

use std::{
    collections::BTreeMap,
    os::fd::AsRawFd as _,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya_log::EbpfLogger;
use log::{Level, Log, Metadata, Record};
use pkeyfw_common::{Reason, Stamp, Verdict};

/// Warning lines per place in the code per window.
pub const BURST: u32 = 5;
pub const WINDOW: Duration = Duration::from_secs(60);

/// Prints the kernel's log records for one interface. Clones share their
/// budget, so that [`tick`](Self::tick) can summarise what the logger held
/// back.
#[derive(Clone)]
pub struct KernelLog {
    iface: Arc<str>,
    budget: Arc<Mutex<Budget>>,
}

/// Per place (file, line): lines printed and held back in this window.
struct Budget {
    since: Instant,
    places: BTreeMap<(String, u32), (u32, u64, String)>,
}

impl KernelLog {
    pub fn new(iface: &str) -> KernelLog {
        KernelLog {
            iface: iface.into(),
            budget: Arc::new(Mutex::new(Budget {
                since: Instant::now(),
                places: BTreeMap::new(),
            })),
        }
    }

    /// Ends the window once it is over: a line per place that was held
    /// back, with how many lines were.
    pub fn tick(&self) {
        self.expire(Instant::now(), false)
            .iter()
            .for_each(|line| eprintln!("{line}"));
    }

    /// Says what was held back, window over or not: the last word.
    pub fn finish(&self) {
        self.expire(Instant::now(), true)
            .iter()
            .for_each(|line| eprintln!("{line}"));
    }

    fn expire(&self, now: Instant, early: bool) -> Vec<String> {
        let mut budget = self.budget.lock().unwrap_or_else(|e| e.into_inner());
        if !early && now.duration_since(budget.since) < WINDOW {
            return Vec::new();
        }
        let since = std::mem::replace(&mut budget.since, now);
        std::mem::take(&mut budget.places)
            .into_values()
            .filter(|&(_, held, _)| held > 0)
            .map(|(_, held, last)| {
                format!(
                    "pkeyfw: warning: kernel, {}: … and {held} more like \"{last}\" in the last {} s",
                    self.iface,
                    now.duration_since(since).as_secs().clamp(1, WINDOW.as_secs())
                )
            })
            .collect()
    }

    /// The line to print for a record, if its budget allows.
    fn line(&self, record: &Record) -> Option<String> {
        let message = record.args().to_string();
        if record.level() > Level::Warn {
            return Some(format!("pkeyfw: trace {}: {}", self.iface, named(&message)));
        }
        let place = (
            record.file().unwrap_or_default().to_string(),
            record.line().unwrap_or_default(),
        );
        let mut budget = self.budget.lock().unwrap_or_else(|e| e.into_inner());
        let (printed, held, last) = budget.places.entry(place).or_default();
        if *printed >= BURST {
            *held += 1;
            *last = message;
            return None;
        }
        *printed += 1;
        let level = match record.level() {
            Level::Error => "error",
            _ => "warning",
        };
        Some(format!(
            "pkeyfw: {level}: kernel, {}: {message}",
            self.iface
        ))
    }
}

/// Prints a kernel log ring's lines from a thread of its own, until the
/// process ends: however fast the kernel writes (a traced flood), the
/// attachment's loop (signals, QP binding, violation lines) never waits on
/// it.
pub fn follow(mut logger: EbpfLogger<KernelLog>) -> Result<()> {
    std::thread::Builder::new()
        .name("pkeyfw-klog".into())
        .spawn(move || {
            loop {
                let mut ready = libc::pollfd {
                    fd: logger.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd, of a descriptor the logger holds open.
                unsafe { libc::poll(&mut ready, 1, 1000) };
                logger.flush();
            }
        })
        .context("starting the kernel log's reader")?;
    Ok(())
}

/// A trace line with its numbers named: the programs log `frame AT VERDICT
/// REASON[: fields]` and `stamp OUTCOME` (see pkeyfw-ebpf's trace.rs);
/// anything else is shown as it came.
fn named(message: &str) -> String {
    let (head, rest) = match message.split_once(':') {
        Some((head, rest)) => (head, Some(rest)),
        None => (message, None),
    };
    let numbers: Vec<u32> = head
        .split_whitespace()
        .skip(1)
        .map_while(|n| n.parse().ok())
        .collect();
    let named = match (head.split_whitespace().next(), &numbers[..]) {
        (Some("frame"), &[at, verdict, reason]) => (|| {
            let at = match at {
                0 => "in",
                1 => "switch in",
                2 => "switch out",
                _ => return None,
            };
            let verdict = Verdict::from_repr(verdict)?.name();
            let reason = Reason::from_repr(reason)?.name();
            Some(format!("{at}: {verdict} {reason}"))
        })(),
        (Some("stamp"), &[outcome]) => {
            Stamp::from_repr(outcome).map(|s| format!("egress: {}", s.name()))
        }
        _ => None,
    };
    match (named, rest) {
        (Some(named), Some(rest)) => format!("{named}:{rest}"),
        (Some(named), None) => named,
        (None, _) => message.to_string(),
    }
}

impl Log for KernelLog {
    fn enabled(&self, _: &Metadata) -> bool {
        true
    }

    fn log(&self, record: &Record) {
        match self.line(record) {
            Some(line) if record.level() > Level::Warn => println!("{line}"),
            Some(line) => eprintln!("{line}"),
            None => {}
        }
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warn(log: &KernelLog, line: u32, text: &str) -> Option<String> {
        log.line(
            &Record::builder()
                .level(Level::Warn)
                .file(Some("probes.rs"))
                .line(Some(line))
                .args(format_args!("{text}"))
                .build(),
        )
    }

    #[test]
    fn warnings_are_budgeted_per_place_and_summarised() {
        let log = KernelLog::new("eth0");
        for i in 0..BURST {
            assert!(warn(&log, 10, &format!("full {i}")).is_some());
        }
        assert_eq!(warn(&log, 10, "full again"), None);
        assert_eq!(warn(&log, 10, "full at last"), None);
        // Another place has its own budget.
        assert_eq!(
            warn(&log, 20, "socket table full").as_deref(),
            Some("pkeyfw: warning: kernel, eth0: socket table full")
        );
        let start = log.budget.lock().unwrap().since;
        assert!(log.expire(start + WINDOW / 2, false).is_empty());
        assert_eq!(
            log.expire(start + WINDOW, false),
            ["pkeyfw: warning: kernel, eth0: … and 2 more like \"full at last\" in the last 60 s"]
        );
        assert!(warn(&log, 10, "full in a new window").is_some());
    }

    #[test]
    fn trace_lines_are_named() {
        assert_eq!(
            named("frame 0 1 4: P_Key 0x8002 Q_Key 0x0 QP 0 -> 16"),
            "in: drop pkey_violation: P_Key 0x8002 Q_Key 0x0 QP 0 -> 16"
        );
        assert_eq!(named("frame 2 3 4"), "switch out: corrupt pkey_violation");
        assert_eq!(
            named("stamp 0"),
            format!("egress: {}", Stamp::ALL[0].name())
        );
        // Unknown numbers or shapes are shown as they came.
        assert_eq!(named("frame 7 1 4: x"), "frame 7 1 4: x");
        assert_eq!(named("something else"), "something else");
    }

    #[test]
    fn trace_lines_are_not_budgeted() {
        let log = KernelLog::new("eth0");
        for _ in 0..3 * BURST {
            let line = log.line(
                &Record::builder()
                    .level(Level::Trace)
                    .args(format_args!("frame 0 1 4"))
                    .build(),
            );
            assert_eq!(
                line.as_deref(),
                Some("pkeyfw: trace eth0: in: drop pkey_violation")
            );
        }
    }
}
