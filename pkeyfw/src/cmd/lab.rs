//! `pkeyfw lab`: its arguments; the labs themselves are [`crate::lab`].

use std::path::PathBuf;

use anyhow::{Result, bail};

use crate::lab;

/// Run the self-contained RoCE partition lab.
///
/// Two network namespaces joined by a veth pair, pkeyfw attached on one
/// end with the four-QP partition example policy, real RoCE v2 frames sent from the
/// other: a table of each case, expected and observed. Everything it
/// creates is removed at the end. Needs root.
#[derive(clap::Args)]
pub struct LabArgs {
    #[command(subcommand)]
    pub lab: Option<LabCommand>,
}

#[derive(clap::Subcommand)]
pub enum LabCommand {
    Rxe(RxeArgs),
    /// The seeds' four hosts on a Linux bridge, with pkeyfw on the bridge
    /// ports (switch mode): every ordered pair over IPv4, IPv6 and a VLAN,
    /// with violations dropped, then corrupted, then access-port stamping.
    Switch,
}

pub fn run(args: &LabArgs) -> Result<()> {
    match &args.lab {
        None => match lab::veth()? {
            true => Ok(()),
            false => bail!("some lab cases did not go as the partition rules say"),
        },
        Some(LabCommand::Rxe(rxe)) => match lab::rxe::run(
            rxe.only.as_deref(),
            rxe.shard,
            rxe.captures.as_deref(),
            rxe.json.as_deref(),
        )? {
            true => Ok(()),
            false => bail!("some scenarios did not go as the partition rules say"),
        },
        Some(LabCommand::Switch) => match lab::switch::run()? {
            true => Ok(()),
            false => bail!("some frames did not go as the partition rules say"),
        },
    }
}

/// Real RDMA programs over soft-RoCE, with pkeyfw enforcing.
///
/// Two rdma_rxe devices on the ends of a veth pair (in this namespace;
/// policy routing sends their traffic over the veth); per scenario a
/// foreground attach binds the programs' QPs by `[[bind]]` rules, and
/// ibv_ud_pingpong, ibv_rc_pingpong, ib_send_bw, rping or udaddy run
/// across. The table says whether they completed and which counters
/// moved. Then switch mode (the `switch-*` scenarios): four rdma_rxe
/// hosts on a bridge, `pkeyfw switch` on its ports stamping each host's
/// key, nothing on the hosts. Needs root, rdma_rxe, rdma-core, perftest
/// and rdmacm-utils; `cargo xtask rxe-lab` runs it in a guest that has
/// them.
#[derive(clap::Args)]
pub struct RxeArgs {
    /// Capture each scenario into DIR/NAME.*.pcap (the pair's outgoing
    /// frames; the switch's ports and its hosts' ends).
    #[arg(long, value_name = "DIR")]
    pub captures: Option<PathBuf>,
    /// Write the results as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Only the scenarios whose name contains this, or one of its
    /// comma-separated parts.
    #[arg(long, value_name = "TEXT")]
    pub only: Option<String>,
    /// Only every OF-th scenario, from the INDEX-th (0-based): one part of
    /// them, for one of several machines running the rest.
    #[arg(long, value_name = "INDEX/OF")]
    pub shard: Option<lab::rxe::Shard>,
}
