//! The soft-RoCE lab's setup for a script that goes on with it (the
//! systemd scenario, `cargo xtask rxe-lab --only systemd`): `pair` sets up
//! the two ends `pkeyfw lab rxe` runs over ([`pkeyfw_testkit::rxe`]) and
//! leaves them, printing each as `IFACE ADDRESS DEVICE GID_INDEX`;
//! `gid-index DEVICE ADDRESS` prints the index of a device's RoCE v2 GID
//! for an IPv4 address. Test equipment, never part of pkeyfw.

use std::{net::Ipv4Addr, process::ExitCode};

use anyhow::Result;
use clap::Parser;
use pkeyfw_testkit::rxe::{self, Topology};

#[derive(Parser)]
enum Args {
    /// Set up the lab's two ends and leave them; print each.
    Pair,
    /// The index of DEVICE's RoCE v2 GID for ADDRESS.
    GidIndex { device: String, address: Ipv4Addr },
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pkeyfw-lab-rxe: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    match args {
        Args::Pair => {
            let pair = Topology::create()?;
            for end in &pair.ends {
                println!(
                    "{} {} {} {}",
                    end.iface, end.addr, end.device, end.gid_index
                );
            }
            pair.keep();
        }
        Args::GidIndex { device, address } => println!("{}", rxe::gid_index(&device, address)?),
    }
    Ok(())
}
