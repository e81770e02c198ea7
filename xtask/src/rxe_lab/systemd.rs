//! The `systemd` scenario: the guest booted with systemd as PID 1, the
//! Debian package installed with dpkg, and pkeyfw@IFACE run as an operator
//! runs it, with tenants in slices (systemd.sh says what it checks). Each
//! `check NAME` of the script is a test: `rxe-lab::systemd::NAME`.

use std::{fs, time::Duration};

use anyhow::{Context as _, Result, bail};

use crate::{
    guest::{
        Guest, Init,
        pool::{Boot, Plan},
    },
    results,
};

/// The scenario's name, for `--only`.
pub const NAME: &str = "systemd";

/// Boot under TCG (systemd's takes longer than /init), two attaches at once
/// and three more, some pingpongs.
const TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The scenario's script; each of its `check NAME` lines is a test.
const SCRIPT: &str = include_str!("systemd.sh");

/// The scenario's boot: the package built, the guest booted with systemd.
pub fn plan() -> Result<Plan> {
    let package = crate::package::run()?;
    let guest = Guest::ensure(crate::guest::PRIMARY)?;
    let share = super::share_in("rxe-lab-systemd", SCRIPT)?;
    fs::copy(&package.deb, share.join("pkeyfw.deb")).context("copying the package")?;
    Ok(Plan {
        boots: vec![Boot {
            label: "systemd".to_string(),
            guest,
            share: share.clone(),
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
                    results::read(&share)
                });
            results::judge(read, &prefix, &prefix, &[SCRIPT])
        }),
    })
}
