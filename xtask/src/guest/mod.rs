//! The soft-RoCE guest: a Debian kernel with rdma_rxe and a small RDMA
//! userland, booted under qemu to run one script from a folder the host
//! shares over 9p. This machine's kernel has no RDMA support; the guest's
//! does.

mod build;
pub mod pool;

use std::{
    fs,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

pub use build::{KERNELS, Kernel, PRIMARY, ensure_host_tools, ensure_tools};

/// What runs as PID 1.
#[derive(Copy, Clone, PartialEq, Eq)]
pub enum Init {
    /// /init, a shell script: the quickest boot.
    Shell,
    /// Debian's systemd, which runs the script from a unit.
    Systemd,
}

/// A built guest: its kernel and its whole root as an initramfs.
#[derive(Clone)]
pub struct Guest {
    dir: PathBuf,
}

impl Guest {
    /// The cached guest booting `kernel` for this recipe, built first if
    /// missing (about a minute for the first, most of it debootstrap; the
    /// userland is kept for the others).
    pub fn ensure(kernel: Kernel) -> Result<Guest> {
        Guest::ensure_with(kernel, &[])
    }

    /// [`Guest::ensure`], with Debian packages `extra` in its userland
    /// besides the soft-RoCE one (a root of its own, built once).
    pub fn ensure_with(kernel: Kernel, extra: &[&str]) -> Result<Guest> {
        ensure_host_tools()?;
        let release = build::host_release()?;
        let base = crate::cmd::root().join("target/rxe-guest");
        let hash = recipe_hash(&release, extra);
        let dir = base.join(format!("{release}-{}-{hash:016x}", kernel.name));
        let guest = Guest { dir };
        if guest.kernel().exists() && guest.initrd().exists() {
            return Ok(guest);
        }
        eprintln!(
            "xtask: building the soft-RoCE guest (Debian {release}, Linux {}) into {}",
            kernel.name,
            guest.dir.display()
        );
        let started = Instant::now();
        let root = base.join(format!("{release}-root-{hash:016x}"));
        let work = base.join(format!("work-{}", kernel.name));
        build::build(&release, kernel, extra, &root, &work, &guest.dir)
            .context("building the soft-RoCE guest")?;
        eprintln!(
            "xtask: guest built in {:.0} s",
            started.elapsed().as_secs_f64()
        );
        Ok(guest)
    }

    fn kernel(&self) -> PathBuf {
        self.dir.join("vmlinuz")
    }

    fn initrd(&self) -> PathBuf {
        self.dir.join("initrd.zst")
    }

    /// Boots the guest with `init` to run `share/guest.sh`, echoing its
    /// console (each line after `label`, where two guests run side by
    /// side), and returns the script's exit status. Fails, saying why,
    /// when the guest does not start, does not run the script, or outlives
    /// `timeout`.
    pub fn run(&self, share: &Path, timeout: Duration, init: Init, label: &str) -> Result<i32> {
        let status_file = share.join("status");
        let _ = fs::remove_file(&status_file);
        let accel = std::env::var("PKEYFW_GUEST_ACCEL").unwrap_or_else(|_| "tcg".to_string());
        let mut qemu = Command::new("qemu-system-x86_64");
        qemu.args(["-accel", &accel_option(&accel)])
            .args(["-cpu", if accel == "kvm" { "host" } else { "max" }])
            .args(["-smp", "2", "-m", "2048"])
            .args(["-nographic", "-no-reboot", "-nic", "none"])
            .arg("-kernel")
            .arg(self.kernel())
            .arg("-initrd")
            .arg(self.initrd())
            .arg("-append")
            .arg(match init {
                Init::Shell => "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init",
                Init::Systemd => {
                    "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/lib/systemd/systemd \
                     systemd.show_status=0"
                }
            })
            .arg("-virtfs")
            .arg(format!(
                "local,path={},mount_tag=share,security_model=none",
                share.display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        eprintln!("xtask: booting the guest for {label} ({accel})");
        let mut child = qemu.spawn().context("cannot start qemu-system-x86_64")?;
        let (lines, rx) = mpsc::channel();
        for stream in [
            Box::new(child.stdout.take().expect("piped")) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().expect("piped")),
        ] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = lines.send(line);
                }
            });
        }
        drop(lines);
        let deadline = Instant::now() + timeout;
        let mut tail = Vec::new();
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => {
                    let line = line.replace('\r', "");
                    println!("[{label}] {line}");
                    tail.push(line);
                    if tail.len() > 40 {
                        tail.remove(0);
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "the guest did not finish within {} s; its console ended with:\n{}",
                    timeout.as_secs(),
                    tail.join("\n")
                );
            }
        }
        let exit = child.wait()?;
        let status = fs::read_to_string(&status_file).ok();
        match status.and_then(|s| s.trim().parse().ok()) {
            Some(code) => Ok(code),
            None => bail!(
                "the guest never ran its script (qemu {exit}); its console ended with:\n{}",
                tail.join("\n")
            ),
        }
    }
}

fn accel_option(accel: &str) -> String {
    match accel {
        "tcg" => "tcg,thread=multi".to_string(),
        other => other.to_string(),
    }
}

/// Changes to the recipe (packages, modules, what either boot runs) make a
/// new guest; `extra` packages, another one.
fn recipe_hash(release: &str, extra: &[&str]) -> u64 {
    let packages = [build::PACKAGES, extra].concat();
    let recipe = format!(
        "{release}\n{}\n{}\n{}\n{}\n{}",
        packages.join(","),
        build::MODULES.join(","),
        include_str!("init.sh"),
        include_str!("under-systemd.sh"),
        include_str!("pkeyfw-guest.service"),
    );
    // FNV-1a: stable across builds, unlike std's hasher.
    recipe.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
