//! `pkeyfw attach`: enforce a policy on a live interface, in the foreground
//! or pinned in bpffs. The attachment's life is [`crate::attachment`]'s.

use std::path::PathBuf;

use anyhow::Result;

use super::NetnsArg;
use crate::attachment::{self, Mode, Options, Say};

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

pub fn run(args: &AttachArgs) -> Result<()> {
    attachment::attach(
        &args.iface,
        args.netns.name(),
        &args.policy,
        &Options {
            mode: args.mode,
            pin: args.pin,
            watch: args.watch,
            log_rate: args.log_rate,
            trace: args.trace,
        },
        Say::TERMINAL,
    )
}
