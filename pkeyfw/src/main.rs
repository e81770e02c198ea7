//! The `pkeyfw` command line.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Result;
use clap::{Parser, Subcommand};
use pkeyfw::{
    cmd::{self, attach, detach, lab, qps, reload, replay, stats},
    policy::Policy,
};

/// InfiniBand partition isolation (P_Keys, Q_Keys) for RoCE, enforced in XDP.
///
/// Exit status: 0 on success, 1 on any error (the message says what and
/// where), 2 on a usage error.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Enforce a policy on an interface.
    ///
    /// Loads the XDP program, fills its maps from the policy and attaches it.
    /// In the foreground it prints a line per refused frame (at most
    /// --log-rate a second, then how many more) and, on Ctrl-C or SIGTERM,
    /// detaches and prints the final counters. With --pin it pins the
    /// program, its maps and the link under /sys/fs/bpf/pkeyfw/IFACE/ and
    /// exits; the filter runs on without any process. Needs root.
    Attach {
        /// The interface, in this network namespace.
        iface: String,
        /// Partition policy (TOML).
        #[arg(long, value_name = "FILE")]
        policy: PathBuf,
        /// XDP mode: native (in the driver) or skb (generic); auto tries
        /// native first.
        #[arg(long, value_enum, default_value = "auto")]
        mode: attach::Mode,
        /// Pin and exit instead of staying in the foreground.
        #[arg(long)]
        pin: bool,
        /// Violation lines printed per second, at most.
        #[arg(long, value_name = "N", default_value_t = 10)]
        log_rate: u64,
    },
    /// Switch a running attachment to a new policy, without a gap.
    ///
    /// The policy is validated in full first; an invalid one changes
    /// nothing. Every frame is judged by the old policy or the new one, never
    /// a mix. A foreground attach also reloads its policy file on SIGHUP.
    Reload {
        iface: String,
        /// The new policy (default: the file the attachment runs).
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
    },
    /// Remove a pinned attachment (`attach --pin`) and its pins.
    Detach { iface: String },
    /// Counters per reason and per QP of running attachments.
    ///
    /// Reads the maps of foreground and pinned attachments alike.
    Stats {
        /// Only this interface (default: every attachment).
        iface: Option<String>,
        /// One JSON object per interface.
        #[arg(long)]
        json: bool,
        /// Print again every SECONDS, until interrupted.
        #[arg(long, value_name = "SECONDS")]
        watch: Option<f64>,
    },
    /// The QPs of the RDMA devices bound to an interface, and what binds
    /// each.
    ///
    /// Lists what the kernel's RDMA netlink reports (as `rdma resource show
    /// qp`): device, port, QPN, type, state, peer QPN, owner (PID and
    /// command, or the kernel module) and, for rdma_cm QPs, both addresses.
    /// With a policy (--policy, else the one the interface's attachment
    /// runs) it shows what binds each QP — a [[qp]] entry, a [[bind]] rule,
    /// or the unknown-QP rule — and, when the interface is attached, the
    /// filter's per-QP counters.
    Qps {
        iface: String,
        /// Partition policy (TOML).
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Run the self-contained RoCE partition lab.
    ///
    /// Two network namespaces joined by a veth pair, pkeyfw attached on one
    /// end with the seeds' example policy, real RoCE v2 frames sent from the
    /// other: a table of each case, expected and observed. Everything it
    /// creates is removed at the end. Needs root.
    Lab {
        #[command(subcommand)]
        lab: Option<LabCommand>,
    },
    /// Check a policy file.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Run a capture through the XDP program in the kernel (BPF_PROG_TEST_RUN)
    /// and print each frame's verdict and reason, then totals per reason.
    ///
    /// Nothing is attached to any interface. Needs root.
    Replay {
        /// Partition policy (TOML).
        #[arg(long, value_name = "FILE")]
        policy: PathBuf,
        /// A pcap or pcapng capture (Ethernet or Linux cooked link type).
        capture: PathBuf,
        /// One JSON object per frame, then one with the totals.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        port: PortArgs,
    },
}

#[derive(Subcommand)]
enum LabCommand {
    /// Real RDMA programs over soft-RoCE, with pkeyfw enforcing.
    ///
    /// Two rdma_rxe devices on the ends of a veth pair (in this namespace;
    /// policy routing sends their traffic over the veth); per scenario a
    /// foreground attach binds the programs' QPs by `[[bind]]` rules, and
    /// ibv_ud_pingpong, ibv_rc_pingpong, ib_send_bw, rping or udaddy run
    /// across. The table says whether they completed and which counters
    /// moved. Needs root, rdma_rxe, rdma-core, perftest and rdmacm-utils;
    /// `cargo xtask rxe-lab` runs it in a guest that has them.
    Rxe {
        /// Capture each scenario (the client's end) into DIR/NAME.pcap.
        #[arg(long, value_name = "DIR")]
        captures: Option<PathBuf>,
        /// Write the results as JSON.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Only the scenarios whose name contains this.
        #[arg(long, value_name = "TEXT")]
        only: Option<String>,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Validate a policy and print what it gives this port: the port GUID,
    /// the P_Key table (index, value, membership, partition name), the bound
    /// QPs, the multicast groups and every warning. Exit status 1 on any
    /// error.
    Check {
        /// Partition policy (TOML).
        #[arg(long, value_name = "FILE")]
        policy: PathBuf,
        /// One JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        port: PortArgs,
    },
}

/// This port's identity, for policies whose table comes from partitions.conf
/// (unless the policy sets [port].guid).
#[derive(clap::Args)]
#[group(multiple = false)]
struct PortArgs {
    /// This port's GUID, e.g. 0x0002c90300a1b2c3.
    #[arg(long, value_name = "GUID")]
    port_guid: Option<String>,
    /// Derive the GUID from this interface's MAC (EUI-64, as RoCE does).
    #[arg(long, value_name = "IFACE")]
    iface: Option<String>,
}

impl PortArgs {
    fn guid(&self) -> Result<Option<u64>> {
        cmd::port_guid(self.port_guid.as_deref(), self.iface.as_deref())
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pkeyfw: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Attach {
            iface,
            policy,
            mode,
            pin,
            log_rate,
        } => attach::run(&attach::Options {
            iface: &iface,
            policy_path: &policy,
            mode,
            pin,
            log_rate,
        }),
        Command::Detach { iface } => detach::run(&iface),
        Command::Reload { iface, policy } => reload::run(&iface, policy.as_deref()),
        Command::Lab { lab: None } => match lab::run()? {
            true => Ok(()),
            false => anyhow::bail!("some lab cases did not go as the partition rules say"),
        },
        Command::Lab {
            lab:
                Some(LabCommand::Rxe {
                    captures,
                    json,
                    only,
                }),
        } => match lab::rxe::run(&lab::rxe::Options {
            captures,
            json,
            only,
        })? {
            true => Ok(()),
            false => anyhow::bail!("some scenarios did not go as the partition rules say"),
        },
        Command::Stats { iface, json, watch } => stats::run(iface.as_deref(), json, watch),
        Command::Qps {
            iface,
            policy,
            json,
        } => qps::run(&iface, policy.as_deref(), json),
        Command::Policy(PolicyCommand::Check { policy, json, port }) => {
            cmd::policy::check(&policy, port.guid()?, json)
        }
        Command::Replay {
            policy,
            capture,
            json,
            port,
        } => {
            let policy = Policy::load_for(&policy, port.guid()?)?;
            replay::run(&policy, &capture, json, &mut std::io::stdout().lock())?;
            Ok(())
        }
    }
}
