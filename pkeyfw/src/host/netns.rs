//! Network namespaces, as `ip -n` names them: `--netns NAME` is
//! `/run/netns/NAME`, anything with a `/` a path to an nsfs file. A live
//! namespace is identified by its nsfs inode ([`NetnsId`]), which keys the
//! pins (see [`pins`](crate::loading::pins)); what must outlive it (a
//! `netns` rule) holds its cookie, which is never reused ([`Netns::cookie`]).

use std::{
    fs::{self, File},
    os::{
        fd::{AsRawFd, FromRawFd as _},
        unix::fs::MetadataExt,
    },
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

/// Where `ip netns add` keeps named namespaces.
pub const NAMED: &str = "/run/netns";

/// A network namespace by its nsfs inode: unique among the live ones.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NetnsId(pub u64);

impl NetnsId {
    /// The calling thread's network namespace.
    pub fn current() -> Result<NetnsId> {
        NetnsId::of_path(Path::new("/proc/thread-self/ns/net"))
    }

    /// The host's: that of PID 1 (see [`host_pid`]).
    pub fn host() -> Result<NetnsId> {
        NetnsId::of_path(Path::new(&format!("/proc/{}/ns/net", host_pid())))
    }

    /// The namespace an nsfs file (or /run/netns entry) stands for.
    pub fn of_path(path: &Path) -> Result<NetnsId> {
        let meta = fs::metadata(path)
            .with_context(|| format!("no network namespace at {}", path.display()))?;
        Ok(NetnsId(meta.ino()))
    }

    /// The name `ip netns` gives it, if any.
    pub fn name(self) -> Option<String> {
        let entries = fs::read_dir(NAMED).ok()?;
        entries.filter_map(|e| e.ok()).find_map(|e| {
            (fs::metadata(e.path()).ok()?.ino() == self.0)
                .then(|| e.file_name().to_string_lossy().into_owned())
        })
    }

    /// How to show it: "host", its `ip netns` name, or `net:[INODE]`.
    pub fn label(self) -> String {
        if NetnsId::host().ok() == Some(self) {
            return "host".to_string();
        }
        self.name().unwrap_or_else(|| format!("net:[{}]", self.0))
    }

    /// Its label where a namespace is shown only when not the host's.
    pub fn unless_host(self) -> Option<String> {
        (NetnsId::host().ok() != Some(self)).then(|| self.label())
    }

    /// A way into it: this thread's, a named one, or a process's.
    pub fn find(self) -> Option<Netns> {
        let candidates = [
            PathBuf::from("/proc/thread-self/ns/net"),
            PathBuf::from(format!("/proc/{}/ns/net", host_pid())),
        ]
        .into_iter()
        .chain(namespace_files());
        for path in candidates {
            if NetnsId::of_path(&path).ok() == Some(self)
                && let Ok(ns) = Netns::at(&path)
                && ns.id == self
            {
                return Some(ns);
            }
        }
        None
    }
}

/// An open network namespace.
pub struct Netns {
    file: File,
    pub id: NetnsId,
    /// As given (`--netns`), or the path it was found at.
    pub spec: String,
}

impl Netns {
    /// `--netns NAME|PATH`, as `ip -n` takes it.
    pub fn open(spec: &str) -> Result<Netns> {
        let path = if spec.contains('/') {
            PathBuf::from(spec)
        } else {
            Path::new(NAMED).join(spec)
        };
        let mut ns = Netns::at(&path).with_context(|| {
            if spec.contains('/') {
                format!("--netns {spec}: not a network namespace file")
            } else {
                format!("--netns {spec}: no network namespace {spec} (`ip netns list` shows them)")
            }
        })?;
        ns.spec = spec.to_string();
        Ok(ns)
    }

    /// The namespace of an nsfs file (or /run/netns entry).
    pub fn at(path: &Path) -> Result<Netns> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let id = NetnsId(file.metadata()?.ino());
        Ok(Netns {
            file,
            id,
            spec: path.display().to_string(),
        })
    }

    /// Moves the calling thread into it (threads it starts later follow).
    pub fn enter(&self) -> Result<()> {
        // SAFETY: a valid fd; setns with CLONE_NEWNET affects this thread only.
        if unsafe { libc::setns(self.file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!(
                "entering network namespace {}: {}",
                self.spec,
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// Its cookie (SO_NETNS_COOKIE, Linux 5.14): an inode number goes to
    /// the next namespace made once this one is gone (an unprivileged
    /// `unshare -Urn` gets it), a cookie never while the system runs.
    pub fn cookie(&self) -> Result<u64> {
        self.run(current_cookie)?
            .with_context(|| format!("reading the cookie of network namespace {}", self.spec))
    }

    /// Runs `f` on a thread inside it; runs it right here when this thread
    /// is in it already.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        if NetnsId::current().ok() == Some(self.id) {
            return Ok(f());
        }
        std::thread::scope(|scope| {
            scope
                .spawn(|| -> Result<T> {
                    self.enter()?;
                    Ok(f())
                })
                .join()
                .map_err(|_| {
                    anyhow::anyhow!("a thread in network namespace {} panicked", self.spec)
                })?
        })
    }
}

impl AsRawFd for Netns {
    /// The open nsfs file, as `setns` and RDMA netlink's `NET_NS_FD` take
    /// it.
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }
}

/// The cookie of the calling thread's network namespace, as a socket made
/// here carries it.
pub fn current_cookie() -> Result<u64> {
    // SAFETY: plain system calls; the fd is closed by OwnedFd.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("socket");
    }
    let _fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let mut cookie = 0u64;
    let mut len = size_of::<u64>() as libc::socklen_t;
    // SAFETY: an 8-byte buffer and its length.
    let got = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &mut len,
        )
    };
    if got != 0 {
        return Err(std::io::Error::last_os_error())
            .context("getsockopt(SO_NETNS_COOKIE) (Linux 5.14 or later)");
    }
    Ok(cookie)
}

/// The nsfs files of the namespaces `ip netns` names and of every
/// process's.
fn namespace_files() -> impl Iterator<Item = PathBuf> {
    let named = fs::read_dir(NAMED)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.path());
    let processes = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .as_encoded_bytes()
                .iter()
                .all(u8::is_ascii_digit)
        })
        .map(|e| e.path().join("ns/net"));
    named.chain(processes)
}

/// The cookies of every network namespace a process is in or a name
/// (`/run/netns`) holds: those in which a QP can still be made.
pub fn live_cookies() -> std::collections::HashSet<u64> {
    let mut seen = std::collections::HashSet::new();
    namespace_files()
        .filter(|p| fs::metadata(p).is_ok_and(|m| seen.insert(m.ino())))
        .filter_map(|p| Netns::at(&p).ok()?.cookie().ok())
        .collect()
}

/// The cookie of process `pid`'s network namespace; None once it is gone.
pub fn cookie_of_pid(pid: u32) -> Option<u64> {
    Netns::at(Path::new(&format!("/proc/{pid}/ns/net")))
        .ok()?
        .cookie()
        .ok()
}

/// The process whose namespaces are the host's: PID 1, else (where PID 1
/// cannot be looked at, as in a sandbox) the farthest ancestor of this
/// process whose namespaces can be read.
pub fn host_pid() -> u32 {
    let readable = |pid: u32| fs::metadata(format!("/proc/{pid}/ns/mnt")).is_ok();
    if readable(1) {
        return 1;
    }
    let parent = |pid: u32| -> Option<u32> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 1..];
        rest.split_whitespace().nth(1)?.parse().ok()
    };
    let mut best = std::process::id();
    let mut pid = best;
    while let Some(up) = parent(pid).filter(|&p| p > 1) {
        if readable(up) {
            best = up;
        }
        pid = up;
    }
    best
}
