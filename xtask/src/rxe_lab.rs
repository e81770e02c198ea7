//! `cargo xtask rxe-lab`: real ibverbs programs over soft-RoCE, in the guest,
//! with pkeyfw enforcing. The guest runs `pkeyfw lab rxe` (the scenarios
//! live with the rest of the CLI); the host then decodes every capture with
//! tshark and checks that the P_Keys and Q_Keys on the wire are the ones the
//! scenario is about.

use std::{fs, path::Path, path::PathBuf, time::Duration};

use anyhow::{Context as _, Result, bail};

use crate::{cmd, guest::Guest};

/// Boot, both scenarios and the guest's own slowness under TCG included.
const TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// A fresh share with the release CLI and `script` as guest.sh.
fn share(script: &str) -> Result<PathBuf> {
    let share = cmd::root().join("target/rxe-lab");
    let _ = fs::remove_dir_all(&share);
    fs::create_dir_all(&share)?;
    fs::copy(
        cmd::root().join("target/release/pkeyfw"),
        share.join("pkeyfw"),
    )
    .context("copying target/release/pkeyfw into the guest's share")?;
    fs::write(share.join("guest.sh"), script)?;
    Ok(share)
}

/// `cargo xtask guest SCRIPT`.
pub fn explore(script: &Path) -> Result<()> {
    let text = fs::read_to_string(script)
        .with_context(|| format!("reading {}", script.display()))?;
    let guest = Guest::ensure()?;
    let share = share(&text)?;
    let code = guest.run(&share, TIMEOUT)?;
    println!("xtask: the script exited {code}; its folder is {}", share.display());
    if code != 0 {
        bail!("the guest script failed");
    }
    Ok(())
}
