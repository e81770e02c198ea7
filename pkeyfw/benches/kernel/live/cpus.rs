//! Where the live bench's generator and receiver run: on one CPU (veth's
//! NAPI as a softirq of the generator's CPU, each batch's flush raising it)
//! or each on a CPU of its own (threaded NAPI, its kthread pinned away
//! from the generator's CPU), which leaves the receiver's own rate.

use anyhow::{Context as _, Result, bail, ensure};
use pkeyfw_testkit::{cpus, netns::VethPair};
use serde::Serialize;

use super::in_ns;

/// The generator's CPU in both arrangements; the receiver's, when isolated.
const GENERATOR_CPU: usize = 0;
const RECEIVER_CPU: usize = 1;

#[derive(Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Cpus {
    /// Generator and receiver on one CPU.
    Shared,
    /// The receiver on a CPU of its own.
    Isolated,
}

impl Cpus {
    pub const ALL: [Cpus; 2] = [Cpus::Shared, Cpus::Isolated];

    pub fn name(self) -> &'static str {
        match self {
            Cpus::Shared => "shared",
            Cpus::Isolated => "isolated",
        }
    }

    /// Puts the receiving veth's NAPI where this arrangement wants it:
    /// threaded and pinned to [`RECEIVER_CPU`] when isolated, a softirq of
    /// whichever CPU schedules it when shared. Again for every receiver:
    /// attaching a program may make veth's NAPI anew.
    pub fn arrange(self, pair: &VethPair) -> Result<()> {
        let threaded = self == Cpus::Isolated;
        let path = format!("/sys/class/net/{}/threaded", pair.b);
        // `ip netns exec` mounts the namespace's own sysfs.
        in_ns(
            &pair.ns_b,
            "sh",
            &["-c", &format!("echo {} > {path}", u8::from(threaded))],
            None,
        )
        .with_context(|| format!("threaded NAPI on {}", pair.b))?;
        if threaded {
            let threads = napi_threads(&pair.b)?;
            ensure!(
                !threads.is_empty(),
                "no NAPI thread of {} after setting {path}",
                pair.b
            );
            for pid in threads {
                pin(pid, RECEIVER_CPU).with_context(|| format!("pinning NAPI thread {pid}"))?;
            }
        }
        Ok(())
    }
}

/// Pins the calling thread to the generator's CPU.
pub fn pin_generator() -> Result<()> {
    pin(0, GENERATOR_CPU).context("pinning the generator")
}

/// The threads of `dev`'s threaded NAPI (named `napi/DEV-ID`).
fn napi_threads(dev: &str) -> Result<Vec<libc::pid_t>> {
    let prefix = format!("napi/{dev}-");
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").context("reading /proc")? {
        let entry = entry?;
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        // A thread may end between the listing and the read.
        if let Ok(comm) = std::fs::read_to_string(entry.path().join("comm"))
            && comm.starts_with(&prefix)
        {
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// Restricts thread `pid` (0: the caller) to `cpu`, which this machine
/// must have.
fn pin(pid: libc::pid_t, cpu: usize) -> Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpu >= cpus {
        bail!("the isolated arrangement needs CPU {cpu}; this machine has {cpus}");
    }
    cpus::pin(pid, cpu)
}
