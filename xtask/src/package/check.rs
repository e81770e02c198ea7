//! The package checked as Debian and an operator would: lintian finds no
//! error; it holds what it must; `dpkg -i` installs it into a throwaway
//! root, whose pkeyfw runs, answers a runtime's VERSION as the CNI plugin
//! /usr/lib/cni/pkeyfw, and loads every example policy with `pkeyfw
//! policy check`; `dpkg --purge` leaves nothing of it. Each is a test of
//! `cargo xtask test`. (Under real systemd it is installed in the soft-RoCE
//! guest: the `systemd` scenario.)

use std::{fs, path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

use super::{CNI_PLUGIN, Package, UNIT};

/// What the check needs beyond the build's tools.
const TOOLS: &[(&str, &str)] = &[("lintian", "lintian"), ("unshare", "util-linux")];

/// Every command of the CLI has its man page (section 8).
const PAGES: &[&str] = &[
    "pkeyfw",
    "attach",
    "reload",
    "detach",
    "stats",
    "metrics",
    "events",
    "qps",
    "policy",
    "policy-check",
    "replay",
    "switch",
    "switch-attach",
    "switch-reload",
    "switch-detach",
];

type Check = fn(&Package) -> Result<()>;

/// Runs the checks; (passed, failed).
pub fn run(package: &Package) -> Result<(u64, u64)> {
    crate::guest::ensure_tools(TOOLS)?;
    let (mut passed, mut failed) = (0, 0);
    let checks: [(&str, Check); 3] = [
        ("lintian", lintian),
        ("contents", contents),
        ("install", install),
    ];
    for (name, check) in checks {
        match check(package) {
            Ok(()) => {
                println!("test package::{name} ... ok");
                passed += 1;
            }
            Err(e) => {
                crate::results::fail(&format!("package::{name}"), &format!("{e:#}"));
                failed += 1;
            }
        }
    }
    Ok((passed, failed))
}

/// lintian, failing on errors; its warnings are shown.
fn lintian(package: &Package) -> Result<()> {
    let out = Command::new("lintian")
        .args(["--fail-on", "error", "--tag-display-limit", "0"])
        .arg(&package.deb)
        .output()
        .context("cannot run lintian")?;
    let said = String::from_utf8_lossy(&out.stdout);
    print!("{said}");
    if !out.status.success() {
        bail!(
            "lintian failed ({}): {}{}",
            out.status,
            said.lines()
                .filter(|l| l.starts_with("E:"))
                .collect::<Vec<_>>()
                .join("\n"),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn contents(package: &Package) -> Result<()> {
    let listed = crate::cmd::output(Command::new("dpkg-deb").arg("--contents").arg(&package.deb))
        .context("dpkg-deb --contents")?;
    let paths: Vec<&str> = listed
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| p.trim_start_matches('.'))
        .collect();
    let mut want: Vec<String> = [
        "/usr/bin/pkeyfw",
        "/usr/share/bash-completion/completions/pkeyfw",
        "/usr/share/zsh/vendor-completions/_pkeyfw",
        "/usr/share/fish/vendor_completions.d/pkeyfw.fish",
        "/usr/share/doc/pkeyfw/copyright",
        "/usr/share/doc/pkeyfw/changelog.gz",
        "/usr/share/doc/pkeyfw/README.md",
        "/usr/share/doc/pkeyfw/docs/operations.md",
        "/usr/share/doc/pkeyfw/examples/host.toml",
        "/usr/share/doc/pkeyfw/examples/tenants.toml",
        "/usr/share/doc/pkeyfw/examples/fabric.toml",
        "/usr/share/doc/pkeyfw/examples/switch.toml",
        "/usr/share/doc/pkeyfw/examples/partitions.conf",
    ]
    .map(String::from)
    .into();
    want.push(format!("/{UNIT}"));
    want.push(format!("/{CNI_PLUGIN}"));
    for page in PAGES {
        let name = match *page {
            "pkeyfw" => "pkeyfw".to_string(),
            command => format!("pkeyfw-{command}"),
        };
        want.push(format!("/usr/share/man/man8/{name}.8.gz"));
    }
    let missing: Vec<&String> = want
        .iter()
        .filter(|w| !paths.contains(&w.as_str()))
        .collect();
    if !missing.is_empty() {
        bail!("the package lacks {missing:?}; it holds:\n{listed}");
    }
    // The maintainer scripts that tell systemd of the unit.
    let info = crate::cmd::output(Command::new("dpkg-deb").arg("--info").arg(&package.deb))
        .context("dpkg-deb --info")?;
    for script in ["postinst", "prerm", "postrm"] {
        if !info
            .lines()
            .any(|l| l.split_whitespace().any(|w| w == script))
        {
            bail!("the package has no {script} script; dpkg-deb --info:\n{info}");
        }
    }
    // The production build: no lab, whose page would say it is there.
    if paths.iter().any(|p| p.contains("pkeyfw-lab")) {
        bail!("the package documents `pkeyfw lab`, which its build leaves out");
    }
    Ok(())
}

/// `dpkg -i` into a throwaway root (its libc is the host's, hence
/// --force-depends), then what the installed files do, then `dpkg --purge`.
fn install(package: &Package) -> Result<()> {
    let root = crate::cmd::root().join("target/debian/root");
    let _ = fs::remove_dir_all(&root);
    for dir in ["var/lib/dpkg/info", "var/lib/dpkg/updates"] {
        fs::create_dir_all(root.join(dir))?;
    }
    fs::write(root.join("var/lib/dpkg/status"), "")?;
    let dpkg = |args: &[&str]| {
        crate::cmd::run(
            Command::new("dpkg")
                .arg(format!("--root={}", root.display()))
                .args(["--force-depends", "--force-script-chrootless"])
                .args(args),
        )
    };
    dpkg(&["-i", package.deb.to_str().context("a UTF-8 path")?])?;
    let result = installed(&root, package);
    dpkg(&["--purge", "pkeyfw"])?;
    if root.join("usr/bin/pkeyfw").exists() || root.join(UNIT).exists() {
        bail!(
            "dpkg --purge left the package's files in {}",
            root.display()
        );
    }
    let _ = fs::remove_dir_all(&root);
    result
}

/// The installed binary says the package's version; the unit runs it; every
/// example policy loads.
fn installed(root: &Path, package: &Package) -> Result<()> {
    let bin = root.join("usr/bin/pkeyfw");
    let said = crate::cmd::output(Command::new(&bin).arg("--version")).unwrap_or_default();
    if said.trim() != format!("pkeyfw {}", package.version) {
        bail!("the installed pkeyfw --version says {said:?}");
    }
    let unit = fs::read_to_string(root.join(UNIT))?;
    if !unit.contains("ExecStart=/usr/bin/pkeyfw attach %i") {
        bail!("the installed unit does not run /usr/bin/pkeyfw:\n{unit}");
    }
    cni_version(&root.join(CNI_PLUGIN))?;
    let examples = root.join("usr/share/doc/pkeyfw/examples");
    let mut checked = 0;
    for e in fs::read_dir(&examples)? {
        let path = e?.path();
        if path.extension().is_some_and(|x| x == "toml") {
            policy_check(&bin, &path)?;
            checked += 1;
        }
    }
    if checked < 4 {
        bail!("only {checked} example policies in {}", examples.display());
    }
    Ok(())
}

/// The installed CNI plugin answers VERSION as a runtime asks it:
/// `CNI_COMMAND` set, no argument, the version on stdin.
fn cni_version(plugin: &Path) -> Result<()> {
    use std::io::Write as _;
    let mut child = Command::new(plugin)
        .env("CNI_COMMAND", "VERSION")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", plugin.display()))?;
    child
        .stdin
        .take()
        .context("a piped stdin")?
        .write_all(br#"{"cniVersion": "1.0.0"}"#)?;
    let out = child.wait_with_output()?;
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "{} answered VERSION with {:?}",
            plugin.display(),
            out.stdout
        )
    })?;
    if !out.status.success()
        || said["cniVersion"] != "1.0.0"
        || said["supportedVersions"].as_array().is_none()
    {
        bail!("{} answered VERSION with {said}", plugin.display());
    }
    Ok(())
}

/// `pkeyfw policy check` of one example, for a port of partitions.conf.
/// The cgroups it binds exist for the check: in a mount namespace of its
/// own, cgroup v2 mounted at /sys/fs/cgroup (this host may have another
/// layout there) with the missing ones made, and removed after (innermost
/// first).
fn policy_check(bin: &Path, policy: &Path) -> Result<()> {
    let text = fs::read_to_string(policy)?;
    let cgroups: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("cgroup = \""))
        .filter_map(|rest| rest.split('"').next())
        .collect();
    let script = format!(
        "set -e\n\
         mount -t cgroup2 cgroup2 /sys/fs/cgroup\n\
         made=''\n\
         for c in {cgroups}; do\n\
           d=/sys/fs/cgroup\n\
           for part in $(echo \"${{c#/sys/fs/cgroup/}}\" | tr / ' '); do\n\
             d=\"$d/$part\"; [ -d \"$d\" ] || {{ mkdir \"$d\"; made=\"$d $made\"; }}\n\
           done\n\
         done\n\
         status=0\n\
         '{bin}' policy check --policy '{policy}' --port-guid 0x0002c90300a1b2c3 || status=$?\n\
         for c in $made; do rmdir \"$c\"; done\n\
         exit $status\n",
        cgroups = cgroups.join(" "),
        bin = bin.display(),
        policy = policy.display(),
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .context("cannot run unshare")?;
    if !out.status.success() {
        bail!(
            "pkeyfw policy check --policy {}: {}",
            policy.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
