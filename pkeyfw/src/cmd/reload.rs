//! `pkeyfw reload`: switch a running attachment to a new policy, validated in
//! full first; an invalid one changes nothing.
//!
//! A pinned attachment is switched from here. A foreground one is asked to
//! switch itself (SIGHUP), since it alone keeps the `[[bind]]` rules applied
//! to the QPs that come and go; this waits until it has.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};

use super::NetnsArg;
use crate::{
    attachment::{self, Say, Target, target, tenants},
    loading::{
        maps::Maps,
        pins::{self, Holder, record},
    },
};

/// How long a foreground attachment may take to switch.
const ANSWER: Duration = Duration::from_secs(5);

/// Switch a running attachment to a new policy, without a gap.
///
/// The policy is validated in full first; an invalid one changes
/// nothing. Every frame is judged by the old policy or the new one, never
/// a mix. A foreground attach also reloads its policy file on SIGHUP.
#[derive(clap::Args)]
pub struct ReloadArgs {
    pub iface: String,
    #[command(flatten)]
    pub netns: NetnsArg,
    /// The new policy (default: the file the attachment runs).
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
}

pub fn run(args: &ReloadArgs) -> Result<()> {
    let netns = args.netns.enter()?;
    if record::host(&args.iface).is_some() {
        pins::host_bpffs("reload")?;
        return tenants::reload(&args.iface, args.policy.as_deref(), Say::TERMINAL);
    }
    let Target {
        pins,
        holder,
        mut maps,
        policy,
        path,
    } = target(&args.iface, args.policy.as_deref(), netns)?;
    let iface = args.iface.as_str();
    pins.remember_policy(&path)?;
    match holder {
        // It notes the outcome itself.
        Holder::Foreground(pid) => ask(pid, &maps)?,
        Holder::Pinned | Holder::Gone(_) => {
            for line in attachment::reload(&pins, &mut maps, &policy)? {
                println!("{line}");
            }
        }
    }
    println!(
        "pkeyfw: {iface} now runs {} ({} QPs, {} bind rules, {} groups)",
        path.display(),
        policy.qps.len(),
        policy.binds.len(),
        policy.groups.len()
    );
    Ok(())
}

/// SIGHUPs the foreground attachment and waits for its generation switch.
fn ask(pid: u32, maps: &Maps) -> Result<()> {
    let before = maps.active_generation()?;
    // SAFETY: sending a signal has no memory-safety preconditions.
    if unsafe { libc::kill(pid as libc::pid_t, libc::SIGHUP) } != 0 {
        bail!(
            "cannot signal the foreground pkeyfw attach (pid {pid}): {}",
            std::io::Error::last_os_error()
        );
    }
    let deadline = Instant::now() + ANSWER;
    while maps.active_generation()? == before {
        if Instant::now() > deadline {
            bail!(
                "the foreground pkeyfw attach (pid {pid}) did not switch within {} s; its output says why",
                ANSWER.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}
