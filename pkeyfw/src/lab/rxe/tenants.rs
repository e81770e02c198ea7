//! The lab's tenants: cgroups `a` to `d` and `app` under `pkeyfw-lab` in the
//! cgroup v2 hierarchy (mounted at /sys/fs/cgroup first where nothing
//! provides it, as in the guest), and a network namespace no program runs
//! in. A scenario's policy names them through placeholders; its processes
//! are put in a cgroup, or run as a user, as the scenario says. Removed on
//! drop.

use std::{
    ffi::CString,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::host::identity::cgroup2_mount;

/// The lab's cgroups' parent, below the cgroup v2 root.
const PARENT: &str = "pkeyfw-lab";
/// The lab's cgroups: the roles' and the one a scenario without roles
/// runs its programs in.
const CGROUPS: [&str; 5] = ["a", "b", "c", "d", "app"];
/// A network namespace no program of the lab runs in.
pub const OTHER_NETNS: &str = "pkeyfw-lab-other";

/// Where a role's process runs.
#[derive(Copy, Clone, Debug, Default)]
pub struct Tenant {
    /// One of the lab's cgroups.
    pub cgroup: Option<&'static str>,
    /// A user (and group of the same id) to run as.
    pub uid: Option<u32>,
}

impl Tenant {
    pub const ANY: Tenant = Tenant {
        cgroup: None,
        uid: None,
    };

    /// Makes `cmd` start as this tenant.
    pub fn place(self, cmd: &mut Command) -> Result<()> {
        if let Some(uid) = self.uid {
            cmd.uid(uid).gid(uid);
        }
        if let Some(c) = self.cgroup {
            let procs = CString::new(
                cgroup_root()
                    .join(PARENT)
                    .join(c)
                    .join("cgroup.procs")
                    .into_os_string()
                    .into_encoded_bytes(),
            )?;
            // SAFETY: between fork and exec only async-signal-safe calls
            // (open, write, close) on memory prepared before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                    // "0": the writing process itself.
                    if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::close(fd);
                    Ok(())
                })
            };
        }
        Ok(())
    }
}

/// Where the cgroup v2 hierarchy is, once [`Tenants::create`] made sure.
fn cgroup_root() -> PathBuf {
    cgroup2_mount().unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"))
}

/// A policy's text with the lab's paths in place of `@CGROUPS@` (the
/// lab cgroups' parent) and `@OTHER_NETNS@`.
pub fn fill(text: &str) -> String {
    text.replace(
        "@CGROUPS@",
        &cgroup_root().join(PARENT).display().to_string(),
    )
    .replace("@OTHER_NETNS@", &format!("/run/netns/{OTHER_NETNS}"))
}

/// The lab's cgroups and namespace, while it lives.
pub struct Tenants {
    mounted: Option<PathBuf>,
}

impl Tenants {
    pub fn create() -> Result<Tenants> {
        let mut t = Tenants { mounted: None };
        if cgroup2_mount().is_none() {
            let at = Path::new("/sys/fs/cgroup");
            std::fs::create_dir_all(at)?;
            run(&["mount", "-t", "cgroup2", "cgroup2", "/sys/fs/cgroup"])?;
            t.mounted = Some(at.to_path_buf());
        }
        let parent = cgroup_root().join(PARENT);
        for c in CGROUPS {
            std::fs::create_dir_all(parent.join(c))
                .with_context(|| format!("creating cgroup {}", parent.join(c).display()))?;
        }
        let _ = run(&["ip", "netns", "del", OTHER_NETNS]);
        run(&["ip", "netns", "add", OTHER_NETNS])?;
        Ok(t)
    }
}

impl Drop for Tenants {
    fn drop(&mut self) {
        let parent = cgroup_root().join(PARENT);
        for c in CGROUPS {
            let _ = std::fs::remove_dir(parent.join(c));
        }
        let _ = std::fs::remove_dir(parent);
        let _ = run(&["ip", "netns", "del", OTHER_NETNS]);
        if let Some(at) = &self.mounted {
            let _ = run(&["umount", &at.display().to_string()]);
        }
    }
}

fn run(args: &[&str]) -> Result<()> {
    let status = Command::new(args[0])
        .args(&args[1..])
        .status()
        .with_context(|| format!("running {}", args.join(" ")))?;
    if !status.success() {
        bail!("{} failed: {status}", args.join(" "));
    }
    Ok(())
}
