//! The `systemd` scenario: the guest booted with systemd as PID 1, the
//! Debian package installed with dpkg, and pkeyfw@IFACE run as an operator
//! runs it, with tenants in slices (systemd.sh says what it checks). Each
//! check is a test: `rxe-lab::systemd::NAME`.

use std::{fs, time::Duration};

use anyhow::{Context as _, Result, bail};

use crate::{
    guest::{
        Guest, Init,
        pool::{Boot, Plan},
    },
    results::{self, Outcome},
};

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
    "runs-ahead-of-tenants",
    "unit-makes-tenant-devices",
    "device-allow-and-the-guard",
    "own-devices-complete",
    "restart-keeps-tenant-devices",
    "detach-removes-tenant-devices",
];

/// The scenario's boot: the package built, the guest booted with systemd.
pub fn plan() -> Result<Plan> {
    let package = crate::package::run()?;
    let guest = Guest::ensure(crate::guest::PRIMARY)?;
    let share = super::share_in("rxe-lab-systemd", include_str!("systemd.sh"))?;
    fs::copy(&package.deb, share.join("pkeyfw.deb")).context("copying the package")?;
    let results = share.join("results");
    Ok(Plan {
        boots: vec![Boot {
            label: "systemd".to_string(),
            guest,
            share,
            init: Init::Systemd,
            timeout: TIMEOUT,
            minutes: 6,
        }],
        judge: Box::new(move |codes| {
            let prefix = format!("rxe-lab::{NAME}");
            let read = codes
                .into_iter()
                .next()
                .expect("one boot")
                .and_then(|code| {
                    if code != 0 {
                        bail!("the systemd scenario's script failed ({code})");
                    }
                    fs::read_to_string(&results)
                        .context("the systemd scenario wrote no results (see its output above)")
                });
            match read {
                Ok(text) => results::checks(&text, &prefix, CHECKS.iter().copied()),
                Err(e) => Outcome::failed(&prefix, &e),
            }
        }),
    })
}
