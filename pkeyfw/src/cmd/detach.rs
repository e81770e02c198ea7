//! `pkeyfw detach`: removes an attachment and everything it pinned: a pinned
//! one (`attach --pin`), one whose foreground process is gone, or what an
//! exited one left; of a tenant host, every tenant's device and port too.
//! A running foreground attach is stopped with Ctrl-C or SIGTERM instead.
//! The detach is [`crate::attachment`]'s.

use anyhow::Result;

use super::NetnsArg;
use crate::{attachment, reporting::describe::cli_iface};

/// Remove an attachment and its pins: a pinned one (`attach --pin`) or
/// one whose foreground process is gone.
#[derive(clap::Args)]
pub struct DetachArgs {
    pub iface: String,
    #[command(flatten)]
    pub netns: NetnsArg,
}

/// Detaches `iface` of the network namespace `--netns` names (or this one).
pub fn run(args: &DetachArgs) -> Result<()> {
    let netns = args.netns.name();
    let detached = attachment::detach(&args.iface, netns)?;
    println!("{}", detached.line(&cli_iface(&args.iface, netns)));
    Ok(())
}
