//! The CNI lab's runtime (`cargo xtask cni-lab`, `plain.sh`): networks of
//! the configuration directory run on pods that are plain network
//! namespaces, as libcni runs them ([`pkeyfw_testkit::cni`]). A plugin's
//! reply goes to stdout, and a failed one makes the exit status 1, as a
//! runtime reports it. Test equipment, never part of pkeyfw.

use std::{io::Read as _, path::PathBuf, process::ExitCode};

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use pkeyfw_testkit::cni::{self, Attachment, Runtime};
use serde_json::Value;

#[derive(Parser)]
struct Args {
    /// Network configuration lists, NAME.conflist.
    #[arg(long, default_value = "/etc/cni/net.d")]
    conf_dir: PathBuf,
    /// The plugins (CNI_PATH).
    #[arg(long, default_value = "/usr/lib/cni")]
    bin_dir: PathBuf,
    /// ADD's results, kept for CHECK and DEL.
    #[arg(long, default_value = "/var/lib/cni-lab")]
    cache_dir: PathBuf,
    /// CNI_ARGS of the attachment.
    #[arg(long, default_value = "")]
    args: String,
    #[command(subcommand)]
    command: Cmd,
}

/// Where a pod's interface is: container ID, network namespace, name.
#[derive(clap::Args)]
struct Pod {
    id: String,
    netns: String,
    #[arg(default_value = "eth0")]
    ifname: String,
}

impl Pod {
    fn at<'a>(&'a self, args: &'a str) -> Attachment<'a> {
        Attachment {
            container_id: &self.id,
            netns: &self.netns,
            ifname: &self.ifname,
            args,
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// The network's plugins in turn, each given the one before's result;
    /// the last result printed and cached; DEL after a failure.
    #[command(name = "ADD")]
    Add {
        net: String,
        #[command(flatten)]
        pod: Pod,
    },
    /// The network's plugins in turn, given ADD's cached result.
    #[command(name = "CHECK")]
    Check {
        net: String,
        #[command(flatten)]
        pod: Pod,
    },
    /// The network's plugins in reverse, given ADD's cached result if any.
    #[command(name = "DEL")]
    Del {
        net: String,
        #[command(flatten)]
        pod: Pod,
    },
    /// GC (CNI 1.1.0) of one plugin of the network: every attachment but
    /// the valid ones goes.
    #[command(name = "GC")]
    Gc {
        net: String,
        index: usize,
        /// The request's cniVersion instead of the list's.
        #[arg(long, default_value = "1.1.0")]
        cni_version: String,
        /// An attachment that stays, CONTAINERID/IFNAME (once each).
        #[arg(long, value_name = "CONTAINERID/IFNAME")]
        valid: Vec<String>,
    },
    /// VERSION of a plugin: its cniVersion, then its supported versions.
    #[command(name = "VERSION")]
    Version {
        plugin: String,
        #[arg(default_value = "1.0.0")]
        cni_version: String,
    },
    /// COMMAND (ADD, CHECK, DEL) of plugin INDEX of the network alone.
    Plugin {
        command: String,
        net: String,
        index: usize,
        #[command(flatten)]
        pod: Pod,
        /// Its prevResult (JSON).
        #[arg(long)]
        prev: Option<String>,
    },
    /// ADD's cached result of a pod on a network, or one field of it.
    Result {
        net: String,
        id: String,
        /// device, port, sandboxed, address, ip-interface, cni-version.
        field: Option<String>,
        #[arg(long, default_value = "eth0")]
        ifname: String,
    },
    /// One field of the result or error object on stdin (`code`, or one of
    /// `result`'s).
    Field { name: String },
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("pkeyfw-lab-cni: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the command; `Ok(false)` when a plugin failed.
fn run(args: Args) -> Result<bool> {
    let rt = Runtime {
        conf_dir: args.conf_dir,
        bin_dir: args.bin_dir,
        cache_dir: args.cache_dir,
    };
    let at = |pod| Pod::at(pod, &args.args);
    let reply = match &args.command {
        Cmd::Add { net, pod } => rt.add(&rt.network(net)?, &at(pod))?,
        Cmd::Check { net, pod } => rt.check(&rt.network(net)?, &at(pod))?,
        Cmd::Del { net, pod } => rt.del(&rt.network(net)?, &at(pod))?,
        Cmd::Gc {
            net,
            index,
            cni_version,
            valid,
        } => {
            let valid = valid
                .iter()
                .map(|v| v.split_once('/').context("--valid CONTAINERID/IFNAME"))
                .collect::<Result<Vec<_>>>()?;
            rt.gc(&rt.network(net)?, *index, cni_version, &valid)?
        }
        Cmd::Version {
            plugin,
            cni_version,
        } => {
            let reply = rt.version(plugin, cni_version)?;
            if reply.ok {
                let answer: Value = serde_json::from_str(&reply.stdout)?;
                println!("{}", cni::field(&answer, "cni-version")?);
                println!("{}", cni::field(&answer, "supported-versions")?);
                return Ok(true);
            }
            reply
        }
        Cmd::Plugin {
            command,
            net,
            index,
            pod,
            prev,
        } => {
            let prev: Option<Value> = prev.as_deref().map(serde_json::from_str).transpose()?;
            rt.invoke(command, &rt.network(net)?, *index, prev.as_ref(), &at(pod))?
        }
        Cmd::Result {
            net,
            id,
            field,
            ifname,
        } => {
            let pod = Pod {
                id: id.clone(),
                netns: String::new(),
                ifname: ifname.clone(),
            };
            let net = rt.network(net)?;
            let result = rt
                .cached(&net, &at(&pod))?
                .with_context(|| format!("no cached result of {id} on {}", net.name))?;
            match field {
                Some(name) => println!("{}", cni::field(&result, name)?),
                None => println!("{result}"),
            }
            return Ok(true);
        }
        Cmd::Field { name } => {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text)?;
            let value: Value = serde_json::from_str(&text).context("stdin is no JSON")?;
            println!("{}", cni::field(&value, name)?);
            return Ok(true);
        }
    };
    if !reply.stdout.is_empty() {
        println!("{}", reply.stdout);
    }
    Ok(reply.ok)
}
