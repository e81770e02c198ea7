//! Where attachments live in bpffs, so that other pkeyfw processes (stats,
//! detach, reload) reach them and so that they outlive the process that made
//! them: `/sys/fs/bpf/pkeyfw/NETNS/IFACE/`, NETNS being the inode of the
//! interface's network namespace (so equal names in two namespaces never
//! meet), holds the program (`pkeyfw`), its maps by name, the XDP `link` and,
//! when stamping, the `egress-link`. Every attachment pins its links, a
//! foreground one too: only removing the pins (`pkeyfw detach`, or a
//! foreground attach stopped by Ctrl-C or SIGTERM) detaches it, never the
//! death of a process. Notes that are not BPF objects (the policy file, a
//! foreground attachment's process) are kept under `/run/pkeyfw/NETNS/`,
//! among them what a tenant host made ([`record`]).

pub mod record;

use std::{
    fs,
    os::{
        fd::AsRawFd as _,
        unix::fs::{DirBuilderExt as _, MetadataExt, PermissionsExt as _},
    },
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use aya::programs::{ProgramInfo, SchedClassifier, TcAttachType, links::PinnedLink, tc};

use crate::{
    host::{
        netlink::{self, XdpMode},
        netns::{self, NetnsId},
    },
    loading::programs::{INGRESS_PROGRAM, PROGRAM, STAMP_PROGRAM},
};

/// bpffs mount point.
pub const BPFFS: &str = "/sys/fs/bpf";
/// Run-time notes that are not BPF objects.
const RUN_DIR: &str = "/run/pkeyfw";
/// `statfs` magic of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The pins of one interface of one network namespace.
pub struct Pins {
    pub iface: String,
    pub netns: NetnsId,
    pub dir: PathBuf,
}

/// An attachment's policy history (`Pins::record`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PolicyRecord {
    /// When the policy in force was applied (Unix seconds; 0: unknown).
    pub applied_at: u64,
    /// Reloads applied, and refused (an invalid file, or the kernel said no).
    pub reloaded: u64,
    pub refused: u64,
}

/// What happened to a policy.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PolicyEvent {
    Attached,
    Reloaded,
    Refused,
}

/// What the kernel says of an interface's pins.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Our program is attached, held by its pinned link.
    Live { mode: XdpMode, holder: Holder },
    /// The program is no longer attached (the interface or its namespace
    /// went away, or something removed the link).
    Stale,
    /// A `pkeyfw attach`, this running process, is loading it: nothing is
    /// pinned yet (seconds on a slow machine).
    SettingUp(u32),
}

/// Who answers for a live attachment.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Holder {
    /// `attach --pin`: no process.
    Pinned,
    /// A foreground `pkeyfw attach`, this process, still running.
    Foreground(u32),
    /// A foreground `pkeyfw attach` whose process died without detaching
    /// (killed, crashed): the filter enforces on, nothing follows the QPs.
    Gone(u32),
}

impl Holder {
    /// "pinned", "foreground, process N", "foreground, process N gone".
    pub fn describe(self) -> String {
        match self {
            Holder::Pinned => "pinned".to_string(),
            Holder::Foreground(pid) => format!("foreground, process {pid}"),
            Holder::Gone(pid) => format!("foreground, process {pid} gone"),
        }
    }
}

impl Pins {
    /// The pins of `iface` in the calling thread's network namespace.
    pub fn of(iface: &str) -> Pins {
        // /proc is always there where pkeyfw can work at all.
        Pins::at(iface, NetnsId::current().unwrap_or(NetnsId(0)))
    }

    /// The pins of `iface` in network namespace `netns`.
    pub fn at(iface: &str, netns: NetnsId) -> Pins {
        Pins {
            iface: iface.to_string(),
            netns,
            dir: root().join(netns.0.to_string()).join(iface),
        }
    }

    /// The pins of a tenant host on uplink `iface` (its policy gives every
    /// tenant a device of its own: the uplink carries no filter, only the
    /// device guard): under `pkeyfw/tenants/`, which listings of
    /// attachments skip, its notes beside an attachment's of that name
    /// (the two never coexist).
    pub fn tenant_host(iface: &str) -> Pins {
        Pins::tenant_host_at(iface, NetnsId::current().unwrap_or(NetnsId(0)))
    }

    /// The pins of the tenant host on `iface` of network namespace `netns`.
    pub fn tenant_host_at(iface: &str, netns: NetnsId) -> Pins {
        Pins {
            iface: iface.to_string(),
            netns,
            dir: root().join("tenants").join(netns.0.to_string()).join(iface),
        }
    }

    /// Where a tenant host notes the devices it made (JSON).
    fn tenants_note(&self) -> PathBuf {
        self.notes().join(format!("{}.tenants", self.iface))
    }

    /// What a tenant host noted (see [`Pins::note_tenants`]), if anything.
    pub fn tenants<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        fs::read(self.tenants_note())
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    }

    /// Notes what a tenant host made, whole (written by rename).
    pub fn note_tenants<T: serde::Serialize>(&self, what: &T) -> Result<()> {
        fs::create_dir_all(self.notes())?;
        let tmp = self
            .notes()
            .join(format!("{}.tenants.{}", self.iface, std::process::id()));
        fs::write(&tmp, serde_json::to_vec(what)?)
            .and_then(|()| fs::rename(&tmp, self.tenants_note()))
            .with_context(|| format!("writing {}", self.tenants_note().display()))
    }

    /// Every interface with pins, by namespace and name; only those of
    /// `netns` if given.
    pub fn list(netns: Option<NetnsId>) -> Result<Vec<Pins>> {
        let Ok(spaces) = fs::read_dir(root()) else {
            return Ok(Vec::new());
        };
        let mut all = Vec::new();
        for space in spaces.filter_map(|e| e.ok()) {
            let Ok(id) = space.file_name().to_string_lossy().parse::<u64>() else {
                continue;
            };
            if netns.is_some_and(|n| n.0 != id) {
                continue;
            }
            let Ok(ifaces) = fs::read_dir(space.path()) else {
                continue;
            };
            all.extend(
                ifaces
                    .filter_map(|e| e.ok())
                    .map(|e| Pins::at(&e.file_name().to_string_lossy(), NetnsId(id))),
            );
        }
        all.sort_by(|a, b| (a.netns, &a.iface).cmp(&(b.netns, &b.iface)));
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

    fn notes(&self) -> PathBuf {
        Path::new(RUN_DIR).join(self.netns.0.to_string())
    }

    /// Where the policy file an attachment was started with is remembered
    /// (bpffs holds only BPF objects), for `pkeyfw reload` without --policy.
    fn policy_note(&self) -> PathBuf {
        self.notes().join(format!("{}.policy", self.iface))
    }

    /// Where an attachment's policy history is noted: when the policy in
    /// force was applied, and reloads by result (JSON), whichever process
    /// applied or refused them.
    fn record_note(&self) -> PathBuf {
        self.notes().join(format!("{}.record", self.iface))
    }

    /// The attachment's policy history.
    pub fn record(&self) -> PolicyRecord {
        fs::read(self.record_note())
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Notes a policy applied (at attach or a reload) or refused. Written
    /// whole by rename; a failure to note changes nothing that enforces.
    pub fn note_policy(&self, what: PolicyEvent) {
        let mut r = self.record();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        match what {
            PolicyEvent::Attached => r.applied_at = now,
            PolicyEvent::Reloaded => (r.applied_at, r.reloaded) = (now, r.reloaded + 1),
            PolicyEvent::Refused => r.refused += 1,
        }
        let tmp = self
            .notes()
            .join(format!("{}.record.{}", self.iface, std::process::id()));
        let _ = fs::create_dir_all(self.notes())
            .and_then(|()| fs::write(&tmp, serde_json::to_vec(&r).unwrap_or_default()))
            .and_then(|()| fs::rename(&tmp, self.record_note()));
    }

    /// Remembers the attachment's policy file.
    pub fn remember_policy(&self, policy: &Path) -> Result<()> {
        let path = std::path::absolute(policy)?;
        fs::create_dir_all(self.notes())?;
        fs::write(self.policy_note(), path.as_os_str().as_encoded_bytes())
            .with_context(|| format!("writing {}", self.policy_note().display()))
    }

    /// Where a foreground attachment notes its process (PID and start
    /// time), so that `pkeyfw reload` can ask it to reload (it alone follows
    /// the QPs) and `stats` can tell when it is gone.
    fn owner_note(&self) -> PathBuf {
        self.notes().join(format!("{}.pid", self.iface))
    }

    /// The event reader's lock file.
    fn events_note(&self) -> PathBuf {
        self.notes().join(format!("{}.events", self.iface))
    }

    /// The right to read the attachment's `EVENTS` ring, which has one
    /// consumer position: whoever reads it takes each event from every
    /// other reader. An exclusive lock on a root-only file among the notes
    /// (no other user can open it, so none can hold the lock), held as long
    /// as the returned file is open (a process that dies lets go); `None`
    /// while another process holds it.
    pub fn events_reader(&self) -> Result<Option<fs::File>> {
        use std::os::unix::fs::OpenOptionsExt as _;
        fs::create_dir_all(self.notes())?;
        let path = self.events_note();
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: a valid descriptor; flock has no other precondition.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Some(file));
        }
        match std::io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(None),
            e => Err(e).with_context(|| format!("locking {}", path.display())),
        }
    }

    /// Notes this process as the attachment's owner: a foreground one's
    /// for as long as it runs, a pinned one's while it is set up.
    pub fn remember_owner(&self) -> Result<()> {
        let pid = std::process::id();
        let started = start_time(pid).unwrap_or_default();
        fs::create_dir_all(self.notes())?;
        fs::write(self.owner_note(), format!("{pid} {started}"))
            .with_context(|| format!("writing {}", self.owner_note().display()))
    }

    /// Forgets the owner, once a pinned attachment is set up: it has none.
    pub fn forget_owner(&self) {
        let _ = fs::remove_file(self.owner_note());
    }

    /// Forgets a former attachment's policy history.
    pub fn forget_record(&self) {
        let _ = fs::remove_file(self.record_note());
    }

    /// Who holds the attachment: a pinned one has no owner note.
    pub fn holder(&self) -> Holder {
        let Ok(text) = fs::read_to_string(self.owner_note()) else {
            return Holder::Pinned;
        };
        let mut words = text.split_whitespace();
        let Some(pid) = words.next().and_then(|w| w.parse::<u32>().ok()) else {
            return Holder::Pinned;
        };
        let started = words.next().and_then(|w| w.parse::<u64>().ok());
        // The same PID with another start time is another process.
        match start_time(pid) {
            Some(now) if started.is_none_or(|s| s == now) => Holder::Foreground(pid),
            _ => Holder::Gone(pid),
        }
    }

    /// The foreground attachment's process, if one noted itself and runs.
    pub fn owner(&self) -> Option<u32> {
        match self.holder() {
            Holder::Foreground(pid) => Some(pid),
            _ => None,
        }
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

    /// Whether the interface runs the pinned program, and how. Looks into
    /// the pins' network namespace; one that is gone leaves them stale.
    pub fn state(&self) -> Result<State> {
        // The owner is noted before anything is pinned.
        let program = self.dir.join(PROGRAM);
        if !program.exists()
            && let Holder::Foreground(pid) = self.holder()
        {
            return Ok(State::SettingUp(pid));
        }
        let ours = ProgramInfo::from_pin(program)
            .with_context(|| format!("opening the program pinned under {}", self.dir.display()))?
            .id();
        let Some(netns) = self.netns.find() else {
            return Ok(State::Stale);
        };
        let iface = self.iface.as_str();
        let attached = netns.run(|| match netlink::if_index(iface) {
            Ok(index) => netlink::xdp_attached(index),
            Err(_) => Ok(None),
        })??;
        Ok(match attached {
            Some(a) if a.prog_id == ours => State::Live {
                mode: a.mode,
                holder: self.holder(),
            },
            _ => self.tc_state(),
        })
    }

    /// The state of a TC ingress attachment (`--mode skb`): tcx (6.6+) says
    /// whether our program is on the hook; a clsact filter (before 6.6),
    /// which the kernel lists by name only and which no process holds, is
    /// taken as live while its pins are there.
    fn tc_state(&self) -> State {
        let Ok(ours) = ProgramInfo::from_pin(self.dir.join(INGRESS_PROGRAM)) else {
            return State::Stale;
        };
        let (Ok(name), Some(netns)) = (
            std::ffi::CString::new(self.iface.as_str()),
            self.netns.find(),
        ) else {
            return State::Stale;
        };
        let live = netns
            .run(|| SchedClassifier::query_tcx(name.as_c_str(), TcAttachType::Ingress).ok())
            .ok()
            .flatten()
            .is_none_or(|(_, programs)| programs.iter().any(|p| p.id() == ours.id()));
        if live {
            State::Live {
                mode: XdpMode::Tc,
                holder: self.holder(),
            }
        } else {
            State::Stale
        }
    }

    /// Creates the directory, mounting bpffs first if needed (refusing a
    /// bpffs that would not outlive this process, see [`host_bpffs`]).
    pub fn create(&self) -> Result<()> {
        host_bpffs("attach")?;
        trusted_dir(&root())?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        // Directories an earlier pkeyfw made 0755 become root's alone.
        for dir in self.dir.ancestors().take_while(|d| d.starts_with(root())) {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
                .with_context(|| format!("restricting {}", dir.display()))?;
        }
        Ok(())
    }

    /// Removes every pin and the directory. Removing `link` detaches a
    /// pinned attachment; the stamping program's clsact filter, which no pin
    /// holds (kernels before 6.6, or one an exited process left), is deleted
    /// by name. The clsact qdisc itself, harmless when empty, stays.
    pub fn remove(&self) -> Result<()> {
        unpin_links(&self.dir)?;
        if let Ok(name) = std::ffi::CString::new(self.iface.as_str())
            && let Some(netns) = self.netns.find()
        {
            // Failing is the usual case: no such filter, qdisc or interface.
            let _ = netns.run(|| {
                for (hook, program) in [
                    (TcAttachType::Egress, STAMP_PROGRAM),
                    (TcAttachType::Ingress, INGRESS_PROGRAM),
                ] {
                    let _ = tc::qdisc_detach_program(name.as_c_str(), hook.into(), program);
                }
            });
        }
        remove_files(&self.dir)?;
        let _ = fs::remove_file(self.policy_note());
        let _ = fs::remove_file(self.events_note());
        let _ = fs::remove_file(self.owner_note());
        let _ = fs::remove_file(self.record_note());
        let _ = fs::remove_file(self.tenants_note());
        let _ = fs::remove_dir(self.notes());
        let removed = match fs::remove_dir(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("removing {}", self.dir.display()))
            }
            _ => Ok(()),
        };
        // The namespace's directory goes with its last interface.
        if let Some(space) = self.dir.parent() {
            let _ = fs::remove_dir(space);
        }
        removed
    }
}

/// The pins of an attachment being replaced, moved aside (see
/// [`Pins::set_aside`]).
pub struct Aside {
    pub dir: PathBuf,
}

impl Aside {
    pub fn link(&self) -> PathBuf {
        self.dir.join("link")
    }

    pub fn egress_link(&self) -> PathBuf {
        self.dir.join("egress-link")
    }

    /// Removes the old pins; the links detach unless the new filter took
    /// them over (and pinned them in its place).
    pub fn remove(&self) -> Result<()> {
        unpin_links(&self.dir)?;
        remove_files(&self.dir)?;
        fs::remove_dir(&self.dir).with_context(|| format!("removing {}", self.dir.display()))?;
        if let Some(replacing) = self.dir.parent() {
            let _ = fs::remove_dir(replacing);
        }
        Ok(())
    }

    /// Moves the pins back where they were (the new filter failed).
    pub fn restore(&self, pins: &Pins) -> Result<()> {
        let _ = fs::remove_dir(&pins.dir);
        fs::rename(&self.dir, &pins.dir)
            .with_context(|| format!("moving {} back", self.dir.display()))
    }
}

impl Pins {
    /// Moves the pins out of the way (under `pkeyfw/replacing/`, which
    /// listings skip; bpffs allows no dots in names), keeping the
    /// attachment: a replacement then loads into this directory and takes
    /// over the old links.
    pub fn set_aside(&self) -> Result<Aside> {
        let replacing = root().join("replacing");
        fs::create_dir_all(&replacing)
            .with_context(|| format!("creating {}", replacing.display()))?;
        let dir = replacing.join(format!(
            "{}-{}-{}",
            std::process::id(),
            self.netns.0,
            self.iface
        ));
        fs::rename(&self.dir, &dir)
            .with_context(|| format!("moving {} aside", self.dir.display()))?;
        Ok(Aside { dir })
    }
}

/// Unpins the links under `dir`: each detaches unless pinned elsewhere too.
fn unpin_links(dir: &Path) -> Result<()> {
    for link in [
        dir.join("link"),
        dir.join("ingress-link"),
        dir.join("egress-link"),
    ] {
        if link.exists() {
            PinnedLink::from_pin(&link)
                .context("opening the pinned link")?
                .unpin()
                .context("unpinning the link")?;
        }
    }
    Ok(())
}

/// Removes the (remaining) pins under `dir`.
fn remove_files(dir: &Path) -> Result<()> {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.filter_map(|e| e.ok()) {
            fs::remove_file(e.path())
                .with_context(|| format!("removing {}", e.path().display()))?;
        }
    }
    Ok(())
}

fn root() -> PathBuf {
    Path::new(BPFFS).join("pkeyfw")
}

/// Makes `dir` (root only, 0700) or checks that only root may change it.
/// Removing a link's pin detaches the filter, so whoever may write the
/// directories above the pins can end enforcement; where /sys/fs/bpf is
/// world-writable (mode 1777), a local user could otherwise create
/// /sys/fs/bpf/pkeyfw first and own every pin pkeyfw makes in it.
fn trusted_dir(dir: &Path) -> Result<()> {
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match fs::DirBuilder::new().mode(0o700).create(dir) {
                // Another pkeyfw made it first (systemd starts instances
                // at once): it is checked as any existing one.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => trusted_dir(dir),
                made => made.with_context(|| format!("creating {}", dir.display())),
            }
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", dir.display())),
        Ok(meta) => {
            let mode = meta.permissions().mode();
            if !meta.is_dir() || meta.uid() != 0 || mode & 0o022 != 0 {
                bail!(
                    "{} is not a directory only root may change (owner uid {}, mode {:o}): whoever may change it could remove the pins that hold the filter. Remove it and attach again",
                    dir.display(),
                    meta.uid(),
                    mode & 0o7777
                );
            }
            Ok(())
        }
    }
}

/// The start time of process `pid` (in clock ticks after boot), which tells
/// it from a later process given the same PID.
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces): state is field 3,
    // starttime field 22.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Refuses to work with a bpffs whose pins would not outlive this process:
/// one of a private mount namespace (as `ip netns exec` makes, mounting a
/// fresh bpffs of its own) rather than the host's. The host's is that of PID
/// 1, or where PID 1 cannot be looked at (a sandbox), of this process's
/// farthest ancestor that can. In the host's mount namespace bpffs is
/// mounted if missing. `command` names the pkeyfw command for the fix the
/// message gives.
pub fn host_bpffs(command: &str) -> Result<()> {
    let mnt = |pid: &str| fs::metadata(format!("/proc/{pid}/ns/mnt")).map(|m| m.ino());
    let ours = mnt("thread-self").context("reading this process's mount namespace")?;
    let host = netns::host_pid();
    if mnt(&host.to_string()).ok() == Some(ours) {
        return ensure_bpffs();
    }
    // A bind mount of the host's bpffs (a container's, say) is the same one.
    let host_bpffs = PathBuf::from(format!("/proc/{host}/root/sys/fs/bpf"));
    let dev = |p: &Path| fs::metadata(p).map(|m| m.dev()).ok();
    if is_bpffs(Path::new(BPFFS))
        && is_bpffs(&host_bpffs)
        && dev(Path::new(BPFFS)).is_some()
        && dev(Path::new(BPFFS)) == dev(&host_bpffs)
    {
        return Ok(());
    }
    let what = if is_bpffs(Path::new(BPFFS)) {
        "a bpffs of its own"
    } else {
        "no bpffs"
    };
    bail!(
        "this process runs in a private mount namespace (as `ip netns exec` makes) whose {BPFFS} is {what}, not the host's: pins made there vanish when the process exits, and the filter with them; run without `ip netns exec`, use `pkeyfw {command} --netns NS …` (the interface work happens in network namespace NS, the pins stay in the host's bpffs)"
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs root (to own a directory as root, and to give one away).
    #[test]
    fn only_a_directory_only_root_may_change_holds_pins() {
        // SAFETY: no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "needs root, as every kernel test"
        );
        let tmp = tempfile::tempdir().unwrap();
        let made = tmp.path().join("made");
        trusted_dir(&made).unwrap();
        assert_eq!(
            fs::metadata(&made).unwrap().permissions().mode() & 0o777,
            0o700
        );
        trusted_dir(&made).unwrap();

        let open = tmp.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).unwrap();
        let e = trusted_dir(&open).unwrap_err().to_string();
        assert!(e.contains("mode 1777"), "{e}");

        let theirs = tmp.path().join("theirs");
        fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let e = trusted_dir(&theirs).unwrap_err().to_string();
        assert!(e.contains("owner uid 65534"), "{e}");
    }

    /// Attaches started at once (systemd starts its instances so) each
    /// make the root directory or find it made, never fail on the other.
    #[test]
    fn directories_made_at_once_are_all_made() {
        let tmp = tempfile::tempdir().unwrap();
        for round in 0..200 {
            let dir = tmp.path().join(round.to_string());
            let barrier = std::sync::Barrier::new(4);
            std::thread::scope(|s| {
                let made: Vec<_> = (0..4)
                    .map(|_| {
                        s.spawn(|| {
                            barrier.wait();
                            trusted_dir(&dir).map_err(|e| format!("{e:#}"))
                        })
                    })
                    .collect();
                for m in made {
                    m.join().unwrap().unwrap();
                }
            });
        }
    }
}
