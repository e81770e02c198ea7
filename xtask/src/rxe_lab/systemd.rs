//! The `systemd` scenario: the guest booted with systemd as PID 1, the
//! Debian package installed with dpkg, and pkeyfw@IFACE run as an operator
//! runs it, with tenants in slices (systemd.sh says what it checks). Each
//! check is a test: `rxe-lab::systemd::NAME`.

use std::{fs, time::Duration};

use anyhow::{Context as _, Result, bail};

use super::Outcome;
use crate::guest::{Guest, Init};

/// The scenario's name, for `--only`.
pub const NAME: &str = "systemd";

/// Boot under TCG (systemd's takes longer than /init), two attaches at once
/// and three more, some pingpongs.
const TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The checks systemd.sh makes, each once.
const CHECKS: &[&str] = &[
    "dpkg-install",
    "both-instances-attach",
    "unit-reads-max-qp",
    "one-tenant-completes",
    "tenants-apart-stall",
    "restart-takes-over",
    "stop-leaves-the-filter",
    "enforcement-never-lapses",
    "reload-applies",
    "bad-reload-refused",
    "exposure",
    "hardening-denies-nothing",
];

pub fn run() -> Result<Outcome> {
    let package = crate::package::run()?;
    let guest = Guest::ensure(crate::guest::PRIMARY)?;
    let share = super::share(include_str!("systemd.sh"))?;
    fs::copy(&package.deb, share.join("pkeyfw.deb")).context("copying the package")?;
    let code = guest.run(&share, TIMEOUT, Init::Systemd)?;
    if code != 0 {
        bail!("the systemd scenario's script failed ({code})");
    }
    let results = fs::read_to_string(share.join("results"))
        .context("the systemd scenario wrote no results (see its output above)")?;
    let (mut passed, mut failed) = (0, 0);
    for check in CHECKS {
        let ok = format!("ok {check}");
        let failed_line = format!("FAILED {check}:");
        match results
            .lines()
            .find(|l| *l == ok || l.starts_with(&failed_line))
        {
            Some(line) if line == ok => {
                println!("test rxe-lab::{NAME}::{check} ... ok");
                passed += 1;
            }
            Some(line) => {
                println!("test rxe-lab::{NAME}::{check} ... {line}");
                failed += 1;
            }
            None => {
                println!("test rxe-lab::{NAME}::{check} ... FAILED: not run");
                failed += 1;
            }
        }
    }
    Ok(Outcome { passed, failed })
}
