//! Building the guest from Debian's packages: the release the host runs (so
//! the host-built `pkeyfw` runs in it unchanged), one of Debian's stock
//! kernels (see [`Kernel`]) with only the modules soft-RoCE needs, and a
//! debootstrap minbase root with the RDMA userland and systemd, packed
//! whole as a zstd initramfs (no disk, no disk driver). The root is built
//! once and kept; each kernel adds its modules to a copy. It boots either
//! way: /init, a shell script, runs the host's script without an init
//! system; or systemd runs it from a unit (for the scenario that tests
//! pkeyfw's own unit).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::cmd::{self, output};

/// What the guest's userland needs beyond minbase.
pub const PACKAGES: &[&str] = &[
    "kmod",
    "rdma-core",
    "ibverbs-providers",
    "ibverbs-utils",
    "rdmacm-utils",
    "perftest",
    "iproute2",
    "tcpdump",
    // The systemd boot: systemd as PID 1; udev, without which no
    // interface's device unit (what pkeyfw@IFACE binds to) appears; D-Bus,
    // which `systemd-run --wait` talks to.
    "systemd",
    "udev",
    "dbus",
];

/// Modules /init loads, in order: the 9p share over virtio, veth, the
/// bridge (switch mode's switch), macvlan (tenants' own devices' network
/// devices), the clsact qdisc and the BPF classifier
/// (6.1 has no tcx, so the stamping program attaches through them), and
/// rdma_rxe with the CRC-32 implementations it asks for by name (kernels
/// from 6.14 have them in the kernel's CRC library instead), the rdma_cm
/// user interface, and NVMe over Fabrics' RDMA target and initiator with a
/// null block device to export (rdma_cm's kernel users). Their dependencies
/// come along (modprobe); one a kernel does not have is left out.
pub const MODULES: &[&str] = &[
    "virtio_pci",
    "9pnet_virtio",
    "9p",
    "veth",
    "bridge",
    "macvlan",
    "sch_ingress",
    "cls_bpf",
    "crc32_generic",
    "crc32_pclmul",
    "rdma_rxe",
    "ib_uverbs",
    "rdma_ucm",
    "nvmet_rdma",
    "nvme_rdma",
    "null_blk",
];

/// Host tools the build and the boot use, with their Debian packages.
const HOST_TOOLS: &[(&str, &str)] = &[
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("debootstrap", "debootstrap"),
    ("cpio", "cpio"),
    ("zstd", "zstd"),
    ("tshark", "tshark"),
];

/// The Debian release of the host, from /etc/os-release.
pub fn host_release() -> Result<String> {
    let text = fs::read_to_string("/etc/os-release").context("reading /etc/os-release")?;
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim_matches('"').to_string())
    };
    if field("ID=").as_deref() != Some("debian") {
        bail!(
            "the soft-RoCE guest is built from the host's Debian release; this host is not Debian"
        );
    }
    field("VERSION_CODENAME=").context("/etc/os-release has no VERSION_CODENAME")
}

/// Installs the host tools the guest needs that are missing.
pub fn ensure_host_tools() -> Result<()> {
    ensure_tools(HOST_TOOLS)
}

/// Installs the packages of the `(tool, package)` pairs whose tool is not
/// on PATH (apt, non-interactively).
pub fn ensure_tools(tools: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(tool, _)| {
            output(Command::new("sh").args(["-c", &format!("command -v {tool}")])).is_none()
        })
        .map(|&(_, package)| package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    apt(&["update", "-qq"])?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(&missing);
    apt(&args)
}

fn apt(args: &[&str]) -> Result<()> {
    cmd::run(
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// A Debian kernel the guest boots: the current one of a suite, as its
/// `linux-image-amd64` names it, from Debian's archive through a sources
/// list of the build's own (the machine's are never changed).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// Its Linux version, as the project names it ("6.1").
    pub name: &'static str,
    /// Its suites, as `deb` lines say them (archive, suite).
    suites: &'static [(&'static str, &'static str)],
}

const DEBIAN: &str = "http://deb.debian.org/debian";
const SECURITY: &str = "http://deb.debian.org/debian-security";

/// The kernels the guest boots: Debian 11's, 12's (the host's release, and
/// the one every scenario runs on), 13's, and trixie-backports' 7.x.
pub const KERNELS: [Kernel; 4] = [
    Kernel {
        name: "5.10",
        suites: &[(DEBIAN, "bullseye"), (SECURITY, "bullseye-security")],
    },
    PRIMARY,
    Kernel {
        name: "6.12",
        suites: &[(DEBIAN, "trixie"), (SECURITY, "trixie-security")],
    },
    Kernel {
        name: "7.3",
        suites: &[(DEBIAN, "trixie-backports")],
    },
];

/// The kernel of the host's release (Debian 12), on which every scenario
/// runs.
pub const PRIMARY: Kernel = Kernel {
    name: "6.1",
    suites: &[(DEBIAN, "bookworm"), (SECURITY, "bookworm-security")],
};

impl Kernel {
    /// The kernel named `name` ("5.10", "6.1", "6.12", "7.3").
    pub fn named(name: &str) -> Result<Kernel> {
        KERNELS
            .into_iter()
            .find(|k| k.name == name)
            .with_context(|| {
                let names: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
                format!("no guest kernel {name}; there are {}", names.join(", "))
            })
    }

    /// The sources list naming its suites (`PKEYFW_DEBIAN_MIRROR` for
    /// Debian's main archive).
    fn sources(&self) -> String {
        let mirror = mirror();
        self.suites
            .iter()
            .map(|(archive, suite)| {
                let archive: &str = if *archive == DEBIAN { &mirror } else { archive };
                format!("deb {archive} {suite} main\n")
            })
            .collect()
    }
}

/// Debian's main archive, or the mirror `PKEYFW_DEBIAN_MIRROR` names.
fn mirror() -> String {
    std::env::var("PKEYFW_DEBIAN_MIRROR").unwrap_or_else(|_| DEBIAN.to_string())
}

/// The steps [`build`] shows progress by.
const STEPS: u64 = 4;

/// Builds the guest with `kernel` into `out` (vmlinuz + initrd.zst), from
/// the root kept in `root` (built there first if missing, with the
/// packages `extra` besides [`PACKAGES`]); `work` is scratch.
pub fn build(
    release: &str,
    kernel: Kernel,
    extra: &[&str],
    root: &Path,
    work: &Path,
    out: &Path,
) -> Result<()> {
    let _ = fs::remove_dir_all(work);
    fs::create_dir_all(work)?;
    let progress = cmd::Progress::start(
        &format!("building the guest (Linux {})", kernel.name),
        STEPS,
        &work.with_file_name("build.log"),
    );
    progress.step("debootstrap: the Debian userland");
    if !root.join("init").exists() {
        userland(release, extra, root)?;
    }
    progress.step("the kernel packages");
    let (version, unpacked) = download(kernel, work)?;
    progress.step("the modules");
    let tree = work.join("root");
    cmd::run(Command::new("cp").arg("-a").arg(root).arg(&tree))?;
    install_modules(&unpacked, &tree, &version)?;

    progress.step("packing the initramfs");
    fs::create_dir_all(out)?;
    // In /boot, or (from Linux 7.0's packages) beside the modules.
    let vmlinuz = [
        unpacked.join(format!("boot/vmlinuz-{version}")),
        unpacked.join(format!("lib/modules/{version}/vmlinuz")),
    ]
    .into_iter()
    .find(|p| p.exists())
    .with_context(|| format!("no vmlinuz in Linux {version}'s packages"))?;
    fs::copy(vmlinuz, out.join("vmlinuz"))?;
    pack(&tree, &out.join("initrd.zst"))?;
    let _ = fs::remove_dir_all(work);
    Ok(())
}

/// Builds the userland every kernel's guest shares into `root`:
/// debootstrap (with `extra` packages too), the two boots, slimmed.
fn userland(release: &str, extra: &[&str], root: &Path) -> Result<()> {
    let _ = fs::remove_dir_all(root);
    cmd::run(
        Command::new("debootstrap")
            .args([
                "--variant=minbase",
                &format!("--include={}", [PACKAGES, extra].concat().join(",")),
            ])
            .arg(release)
            .arg(root)
            .arg(mirror()),
    )
    .context("debootstrap of the guest userland")?;
    systemd_boot(root)?;
    slim(root)?;
    // Written last: its presence says the root is whole.
    let init = include_str!("init.sh").replace("@MODULES@", &MODULES.join(" "));
    let init_path = root.join("init");
    fs::write(&init_path, init)?;
    chmod_x(&init_path)
}

/// Downloads `kernel`'s current packages from Debian's archive, with apt
/// reading the kernel's own sources list (and lists and cache under
/// `work`), and unpacks them: the image, and from Linux 7.0 the binary,
/// modules and base packages it depends on. Returns the kernel's version
/// and where it is unpacked.
fn download(kernel: Kernel, work: &Path) -> Result<(String, PathBuf)> {
    let apt_dir = work.join("apt");
    for dir in ["lists/partial", "cache/archives/partial"] {
        fs::create_dir_all(apt_dir.join(dir))?;
    }
    let sources = apt_dir.join("sources.list");
    fs::write(&sources, kernel.sources())?;
    let options = [
        format!("-oDir::Etc::sourcelist={}", sources.display()),
        "-oDir::Etc::sourceparts=-".to_string(),
        format!("-oDir::State::Lists={}", apt_dir.join("lists").display()),
        format!("-oDir::Cache={}", apt_dir.join("cache").display()),
        "-oAPT::Get::List-Cleanup=0".to_string(),
        "-oDebug::NoLocking=1".to_string(),
    ];
    let apt = |tool: &str| {
        let mut c = Command::new(tool);
        c.args(&options).current_dir(work);
        c
    };
    // The packages `package` depends on whose names start with `prefix`.
    let depends_on = |package: &str, prefix: &str| -> Result<Vec<String>> {
        let depends = output(apt("apt-cache").args(["depends", package]))
            .with_context(|| format!("apt-cache depends {package}"))?;
        Ok(depends
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Depends: "))
            .filter(|p| p.starts_with(prefix))
            .map(str::to_string)
            .collect())
    };
    cmd::run(apt("apt-get").args(["update", "-qq"]))
        .with_context(|| format!("apt-get update for Linux {}", kernel.name))?;
    let image = depends_on("linux-image-amd64", "linux-image-")?
        .into_iter()
        .next()
        .context("linux-image-amd64 depends on no linux-image package")?;
    let version = image.trim_start_matches("linux-image-").to_string();
    let mut packages = vec![image.clone()];
    for part in ["linux-binary-", "linux-modules-", "linux-base-"] {
        packages.extend(
            depends_on(&image, part)?
                .into_iter()
                .filter(|p| p.ends_with(&version)),
        );
    }
    cmd::run(apt("apt-get").arg("download").args(&packages))?;
    let dir = work.join("kernel");
    for deb in fs::read_dir(work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
    {
        cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&dir))?;
    }
    // Packages from usrmerge on put the modules under /usr.
    let usr = dir.join("usr/lib/modules");
    if usr.exists() && !dir.join("lib/modules").exists() {
        fs::create_dir_all(dir.join("lib"))?;
        fs::rename(&usr, dir.join("lib/modules"))?;
    }
    Ok((version, dir))
}

/// Copies the modules /init loads and their dependencies into the root. The
/// closure comes from the guest's own kmod: depmod over every module, ask
/// modprobe, keep only what it names, depmod again.
fn install_modules(kernel: &Path, root: &Path, version: &str) -> Result<()> {
    let modules = root.join("lib/modules");
    fs::create_dir_all(&modules)?;
    let all = modules.join(version);
    cmd::run(
        Command::new("cp")
            .arg("-a")
            .arg(kernel.join("lib/modules").join(version))
            .arg(&modules),
    )?;
    chroot(root, &["depmod", "-a", version])?;
    let mut keep = Vec::new();
    for m in MODULES {
        // One this kernel has built in, or not at all, is left out.
        let Some(shown) = output(Command::new("chroot").arg(root).args([
            "modprobe",
            "--set-version",
            version,
            "--show-depends",
            m,
        ])) else {
            eprintln!("xtask: Linux {version} has no module {m}");
            continue;
        };
        for line in shown.lines() {
            if let Some(path) = line.strip_prefix("insmod ") {
                keep.push(path.split_whitespace().next().unwrap_or("").to_string());
            }
        }
    }
    let kept = root.join("kept");
    fs::create_dir_all(&kept)?;
    for path in &keep {
        let rel = path.trim_start_matches('/');
        let to = kept.join(rel);
        fs::create_dir_all(to.parent().expect("a module path has a parent"))?;
        fs::copy(root.join(rel), &to).with_context(|| format!("copying {path}"))?;
    }
    fs::remove_dir_all(all.join("kernel"))?;
    cmd::run(
        Command::new("cp")
            .arg("-a")
            .arg(kept.join(format!("lib/modules/{version}/kernel")))
            .arg(&all),
    )?;
    fs::remove_dir_all(&kept)?;
    chroot(root, &["depmod", "-a", version])
}

/// What the systemd boot runs: pkeyfw-guest.service (the host's script,
/// then power off), enabled; no login prompt on the console it writes to.
fn systemd_boot(root: &Path) -> Result<()> {
    let script = include_str!("under-systemd.sh").replace("@MODULES@", &MODULES.join(" "));
    let runner = root.join("usr/local/sbin/pkeyfw-guest");
    fs::create_dir_all(runner.parent().expect("a parent"))?;
    fs::write(&runner, script)?;
    chmod_x(&runner)?;
    let units = root.join("etc/systemd/system");
    fs::write(
        units.join("pkeyfw-guest.service"),
        include_str!("pkeyfw-guest.service"),
    )?;
    let wants = units.join("multi-user.target.wants");
    fs::create_dir_all(&wants)?;
    std::os::unix::fs::symlink(
        "/etc/systemd/system/pkeyfw-guest.service",
        wants.join("pkeyfw-guest.service"),
    )?;
    for getty in ["serial-getty@ttyS0.service", "getty@tty1.service"] {
        std::os::unix::fs::symlink("/dev/null", units.join(getty))?;
    }
    Ok(())
}

fn chroot(root: &Path, args: &[&str]) -> Result<()> {
    cmd::run(Command::new("chroot").arg(root).args(args))
}

fn chmod_x(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Drops what a guest that lives for one run never reads: documentation,
/// locales, apt's caches.
fn slim(root: &Path) -> Result<()> {
    for dir in [
        "usr/share/doc",
        "usr/share/man",
        "usr/share/info",
        "usr/share/locale",
        "var/cache/apt",
        "var/lib/apt/lists",
    ] {
        let path = root.join(dir);
        if path.exists() {
            fs::remove_dir_all(&path)?;
            fs::create_dir_all(&path)?;
        }
    }
    Ok(())
}

/// The root as a newc cpio archive, zstd-compressed.
fn pack(root: &Path, to: &Path) -> Result<()> {
    let script = format!(
        "cd '{}' && find . -print0 | cpio --null -o -H newc --quiet | zstd -q -T0 -3 -o '{}' -f",
        root.display(),
        to.display()
    );
    cmd::run(Command::new("sh").args(["-c", &script])).context("packing the initramfs")
}
