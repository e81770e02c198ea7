//! Where attachments live in bpffs, so that other pkeyfw processes (stats,
//! detach, reload) reach them: `/sys/fs/bpf/pkeyfw/IFACE/` holds the program
//! (`pkeyfw`), its maps by name and, for `attach --pin`, the `link` that
//! keeps it attached without any process.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use aya::programs::{ProgramInfo, SchedClassifier, TcAttachType, links::PinnedLink, tc};

use crate::{
    control::netlink::{self, XdpMode},
    loading::filter::{INGRESS_PROGRAM, PROGRAM, STAMP_PROGRAM},
};

/// bpffs mount point.
pub const BPFFS: &str = "/sys/fs/bpf";
/// Run-time notes that are not BPF objects.
const RUN_DIR: &str = "/run/pkeyfw";
/// `statfs` magic of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The pins of one interface.
pub struct Pins {
    pub iface: String,
    pub dir: PathBuf,
}

/// What the kernel says of an interface's pins.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Our program is attached; `pinned` when bpffs holds the link, else a
    /// foreground `pkeyfw attach` holds it.
    Live { mode: XdpMode, pinned: bool },
    /// The program is no longer attached (its foreground process died).
    Stale,
}

impl Pins {
    pub fn of(iface: &str) -> Pins {
        Pins {
            iface: iface.to_string(),
            dir: Path::new(BPFFS).join("pkeyfw").join(iface),
        }
    }

    /// Every interface with pins, by name.
    pub fn list() -> Result<Vec<Pins>> {
        let root = Path::new(BPFFS).join("pkeyfw");
        let Ok(entries) = fs::read_dir(&root) else {
            return Ok(Vec::new());
        };
        let mut all: Vec<Pins> = entries
            .filter_map(|e| e.ok())
            .map(|e| Pins::of(&e.file_name().to_string_lossy()))
            .collect();
        all.sort_by(|a, b| a.iface.cmp(&b.iface));
        Ok(all)
    }

    pub fn exists(&self) -> bool {
        self.dir.exists()
    }

    pub fn link(&self) -> PathBuf {
        self.dir.join("link")
    }

    /// The TC ingress filter's pinned tcx link (`--mode skb`).
    pub fn ingress_link(&self) -> PathBuf {
        self.dir.join("ingress-link")
    }

    /// The stamping program's pinned tcx link.
    pub fn egress_link(&self) -> PathBuf {
        self.dir.join("egress-link")
    }

    /// Where the policy file an attachment was started with is remembered
    /// (bpffs holds only BPF objects), for `pkeyfw reload` without --policy.
    fn policy_note(&self) -> PathBuf {
        Path::new(RUN_DIR).join(format!("{}.policy", self.iface))
    }

    /// Remembers the attachment's policy file.
    pub fn remember_policy(&self, policy: &Path) -> Result<()> {
        let path = std::path::absolute(policy)?;
        fs::create_dir_all(RUN_DIR)?;
        fs::write(self.policy_note(), path.as_os_str().as_encoded_bytes())
            .with_context(|| format!("writing {}", self.policy_note().display()))
    }

    /// Where a foreground attachment notes its process, so that `pkeyfw
    /// reload` can ask it to reload (it alone follows the QPs).
    fn owner_note(&self) -> PathBuf {
        Path::new(RUN_DIR).join(format!("{}.pid", self.iface))
    }

    /// Notes this process as the foreground attachment's owner.
    pub fn remember_owner(&self) -> Result<()> {
        fs::create_dir_all(RUN_DIR)?;
        fs::write(self.owner_note(), std::process::id().to_string())
            .with_context(|| format!("writing {}", self.owner_note().display()))
    }

    /// The foreground attachment's process, if one noted itself.
    pub fn owner(&self) -> Option<u32> {
        fs::read_to_string(self.owner_note())
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The policy file the attachment was started (or last reloaded) with.
    pub fn remembered_policy(&self) -> Result<PathBuf> {
        let note = self.policy_note();
        let text = fs::read_to_string(&note).with_context(|| {
            format!(
                "no policy remembered for {} ({}); give --policy",
                self.iface,
                note.display()
            )
        })?;
        Ok(PathBuf::from(text))
    }

    /// Whether the interface runs the pinned program, and how.
    pub fn state(&self) -> Result<State> {
        let ours = ProgramInfo::from_pin(self.dir.join(PROGRAM))
            .with_context(|| format!("opening the program pinned under {}", self.dir.display()))?
            .id();
        let Ok(index) = netlink::if_index(&self.iface) else {
            return Ok(State::Stale);
        };
        Ok(match netlink::xdp_attached(index)? {
            Some(a) if a.prog_id == ours => State::Live {
                mode: a.mode,
                pinned: self.link().exists(),
            },
            _ => self.tc_state(),
        })
    }

    /// The state of a TC ingress attachment (`--mode skb`): tcx (6.6+) says
    /// whether our program is on the hook; a clsact filter (before 6.6),
    /// which the kernel lists by name only, is taken as live while its owner
    /// runs or, pinned (no owner), while no XDP link pin says otherwise.
    fn tc_state(&self) -> State {
        let Ok(ours) = ProgramInfo::from_pin(self.dir.join(INGRESS_PROGRAM)) else {
            return State::Stale;
        };
        let Ok(name) = std::ffi::CString::new(self.iface.as_str()) else {
            return State::Stale;
        };
        let owner = self.owner();
        let live = match SchedClassifier::query_tcx(name.as_c_str(), TcAttachType::Ingress) {
            Ok((_, programs)) => programs.iter().any(|p| p.id() == ours.id()),
            Err(_) => match owner {
                Some(pid) => Path::new(&format!("/proc/{pid}")).exists(),
                None => !self.link().exists(),
            },
        };
        if live {
            State::Live {
                mode: XdpMode::Tc,
                pinned: owner.is_none(),
            }
        } else {
            State::Stale
        }
    }

    /// Creates the directory, mounting bpffs first if needed.
    pub fn create(&self) -> Result<()> {
        ensure_bpffs()?;
        fs::create_dir_all(&self.dir).with_context(|| format!("creating {}", self.dir.display()))
    }

    /// Removes every pin and the directory. Removing `link` detaches a
    /// pinned attachment; the stamping program's clsact filter, which no pin
    /// holds (kernels before 6.6, or one an exited process left), is deleted
    /// by name. The clsact qdisc itself, harmless when empty, stays.
    pub fn remove(&self) -> Result<()> {
        for link in [self.link(), self.ingress_link(), self.egress_link()] {
            if link.exists() {
                PinnedLink::from_pin(&link)
                    .context("opening the pinned link")?
                    .unpin()
                    .context("unpinning the link")?;
            }
        }
        if let Ok(name) = std::ffi::CString::new(self.iface.as_str()) {
            // Failing is the usual case: no such filter, qdisc or interface.
            let _ = tc::qdisc_detach_program(
                name.as_c_str(),
                TcAttachType::Egress.into(),
                STAMP_PROGRAM,
            );
            let _ = tc::qdisc_detach_program(
                name.as_c_str(),
                TcAttachType::Ingress.into(),
                INGRESS_PROGRAM,
            );
        }
        if let Ok(entries) = fs::read_dir(&self.dir) {
            for e in entries.filter_map(|e| e.ok()) {
                fs::remove_file(e.path())
                    .with_context(|| format!("removing {}", e.path().display()))?;
            }
        }
        let _ = fs::remove_file(self.policy_note());
        let _ = fs::remove_file(self.owner_note());
        match fs::remove_dir(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("removing {}", self.dir.display()))
            }
            _ => Ok(()),
        }
    }
}

/// Mounts bpffs at /sys/fs/bpf unless it is there already.
pub fn ensure_bpffs() -> Result<()> {
    if is_bpffs(Path::new(BPFFS)) {
        return Ok(());
    }
    let (src, target, fstype) = (c"bpf", c"/sys/fs/bpf", c"bpf");
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "mounting bpffs at {BPFFS}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes into a zeroed struct of the right type.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and output pointer.
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC }
}
