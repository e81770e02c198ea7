//! Building the guest from Debian's packages: the release the host runs (so
//! the host-built `pkeyfw` runs in it unchanged), its stock kernel with only
//! the modules soft-RoCE needs, and a debootstrap minbase root with the RDMA
//! userland and systemd, packed whole as a zstd initramfs (no disk, no disk
//! driver). It boots either way: /init, a shell script, runs the host's
//! script without an init system; or systemd runs it from a unit (for the
//! scenario that tests pkeyfw's own unit).

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
/// bridge (switch mode's switch), the clsact qdisc and the BPF classifier
/// (6.1 has no tcx, so the stamping program attaches through them), and
/// rdma_rxe with the CRC-32 implementations it asks for by name and the
/// rdma_cm user interface. Their dependencies come along (modprobe).
pub const MODULES: &[&str] = &[
    "virtio_pci",
    "9pnet_virtio",
    "9p",
    "veth",
    "bridge",
    "sch_ingress",
    "cls_bpf",
    "crc32_generic",
    "crc32_pclmul",
    "rdma_rxe",
    "ib_uverbs",
    "rdma_ucm",
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

/// The steps [`build`] shows progress by.
const STEPS: u64 = 4;

/// Builds the guest into `out` (vmlinuz + initrd.zst); `work` is scratch.
pub fn build(release: &str, work: &Path, out: &Path) -> Result<()> {
    let _ = fs::remove_dir_all(work);
    fs::create_dir_all(work)?;
    let progress = cmd::Progress::start(
        "building the guest",
        STEPS,
        &work.with_file_name("build.log"),
    );
    progress.step("debootstrap: the Debian userland");
    let root = work.join("root");
    let mirror = std::env::var("PKEYFW_DEBIAN_MIRROR")
        .unwrap_or_else(|_| "http://deb.debian.org/debian".to_string());
    cmd::run(
        Command::new("debootstrap")
            .args([
                "--variant=minbase",
                &format!("--include={}", PACKAGES.join(",")),
            ])
            .arg(release)
            .arg(&root)
            .arg(&mirror),
    )
    .context("debootstrap of the guest userland")?;

    progress.step("the kernel package");
    let (version, kernel) = kernel(work)?;
    progress.step("the modules");
    install_modules(&kernel, &root, &version)?;
    let init = include_str!("init.sh").replace("@MODULES@", &MODULES.join(" "));
    let init_path = root.join("init");
    fs::write(&init_path, init)?;
    chmod_x(&init_path)?;
    systemd_boot(&root)?;
    slim(&root)?;

    progress.step("packing the initramfs");
    fs::create_dir_all(out)?;
    fs::copy(
        kernel.join(format!("boot/vmlinuz-{version}")),
        out.join("vmlinuz"),
    )?;
    pack(&root, &out.join("initrd.zst"))?;
    let _ = fs::remove_dir_all(work);
    Ok(())
}

/// Downloads and unpacks the release's current kernel package (the one
/// linux-image-amd64 depends on); returns its version and where it is.
fn kernel(work: &Path) -> Result<(String, PathBuf)> {
    let depends = output(Command::new("apt-cache").args(["depends", "linux-image-amd64"]))
        .context("apt-cache depends linux-image-amd64")?;
    let package = depends
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        .filter(|p| p.starts_with("linux-image-"))
        .context("linux-image-amd64 depends on no linux-image package")?
        .to_string();
    let version = package.trim_start_matches("linux-image-").to_string();
    cmd::run(
        Command::new("apt-get")
            .args(["download", &package])
            .current_dir(work),
    )?;
    let deb = fs::read_dir(work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download left no .deb")?;
    let dir = work.join("kernel");
    cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&dir))?;
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
        let shown = output(Command::new("chroot").arg(root).args([
            "modprobe",
            "--set-version",
            version,
            "--show-depends",
            m,
        ]))
        .with_context(|| format!("the guest kernel {version} has no module {m}"))?;
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
