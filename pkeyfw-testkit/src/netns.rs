//! Two network namespaces joined by a veth pair, and raw Ethernet frames sent
//! and captured inside them: the lab's and the tests' wire. Everything is
//! removed on drop; nothing leaves the namespaces.

use std::{
    fs::File,
    os::fd::AsRawFd,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// A veth pair `a` ⟷ `b`, `a` in namespace `ns_a` and `b` in `ns_b`.
pub struct VethPair {
    pub ns_a: String,
    pub ns_b: String,
    pub a: String,
    pub b: String,
}

/// Runs `ip` (iproute2) with `args`; its error output on failure.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl VethPair {
    /// Creates the namespaces `<tag>-a`/`<tag>-b` and the veths `<tag>a`/
    /// `<tag>b` (so `tag` must be short), replacing leftovers of a previous
    /// run. IPv6 is off on both ends so that no frame but the caller's
    /// crosses the wire.
    pub fn create(tag: &str) -> Result<VethPair> {
        let pair = VethPair {
            ns_a: format!("{tag}-a"),
            ns_b: format!("{tag}-b"),
            a: format!("{tag}a"),
            b: format!("{tag}b"),
        };
        pair.remove();
        pair.build().inspect_err(|_| pair.remove())?;
        Ok(pair)
    }

    fn build(&self) -> Result<()> {
        ip(&["netns", "add", &self.ns_a])?;
        ip(&["netns", "add", &self.ns_b])?;
        ip(&[
            "link", "add", &self.a, "netns", &self.ns_a, "type", "veth", "peer", "name", &self.b,
            "netns", &self.ns_b,
        ])?;
        for (ns, dev) in [(&self.ns_a, &self.a), (&self.ns_b, &self.b)] {
            in_netns(ns, || {
                std::fs::write(format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"), "1")
                    .context("disabling IPv6")
            })??;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(())
    }

    /// Sets both ends' MTU.
    pub fn set_mtu(&self, mtu: u32) -> Result<()> {
        for (ns, dev) in [(&self.ns_a, &self.a), (&self.ns_b, &self.b)] {
            ip(&["-n", ns, "link", "set", dev, "mtu", &mtu.to_string()])?;
        }
        Ok(())
    }

    /// Deletes both namespaces, and the veths with them.
    pub fn remove(&self) {
        for ns in [&self.ns_a, &self.ns_b] {
            let _ = ip(&["netns", "delete", ns]);
        }
    }

    /// The path that `nsenter --net=` takes for a namespace.
    pub fn netns_path(ns: &str) -> String {
        format!("/run/netns/{ns}")
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Runs `f` on a thread that has joined network namespace `ns` (only that
/// thread changes namespace).
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
    thread::scope(|scope| {
        scope
            .spawn(|| -> Result<T> {
                enter(ns)?;
                Ok(f())
            })
            .join()
            .map_err(|_| anyhow::anyhow!("thread in {ns} panicked"))?
    })
}

/// Moves the calling thread into network namespace `ns`.
fn enter(ns: &str) -> Result<()> {
    let path = VethPair::netns_path(ns);
    let file = File::open(&path).with_context(|| format!("opening {path}"))?;
    // SAFETY: a valid namespace fd; affects this thread only.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns {path}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The index of interface `name` in this thread's network namespace.
pub fn if_index(name: &str) -> Result<u32> {
    let c = std::ffi::CString::new(name).context("interface name")?;
    // SAFETY: a valid NUL-terminated string.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => bail!("no interface {name} in this network namespace"),
        index => Ok(index),
    }
}

/// A packet socket bound to one interface.
struct PacketSocket(std::os::fd::OwnedFd);

impl PacketSocket {
    fn bind(iface: &str) -> Result<PacketSocket> {
        let index = if_index(iface)?;
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket creation.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
        if fd < 0 {
            bail!("packet socket: {}", std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh socket we own.
        let sock = PacketSocket(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) });
        // SAFETY: sockaddr_ll is plain data; zero is a valid start.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = proto;
        addr.sll_ifindex = index as i32;
        // SAFETY: a valid address of the stated length.
        let rc = unsafe {
            libc::bind(
                fd,
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc != 0 {
            bail!("binding to {iface}: {}", std::io::Error::last_os_error());
        }
        let on: libc::c_int = 1;
        // SAFETY: a valid option value of the stated length.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_PACKET,
                libc::PACKET_AUXDATA,
                (&raw const on).cast(),
                size_of::<libc::c_int>() as u32,
            )
        };
        if rc != 0 {
            bail!("PACKET_AUXDATA: {}", std::io::Error::last_os_error());
        }
        Ok(sock)
    }

    fn send(&self, frame: &[u8]) -> Result<()> {
        // SAFETY: a valid buffer.
        let n = unsafe { libc::send(self.0.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if n < 0 {
            bail!("send: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next incoming frame, or `None` after `timeout` of silence.
    fn recv(&self, timeout: Duration) -> Result<Option<Vec<u8>>> {
        let mut pfd = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) } <= 0 {
            return Ok(None);
        }
        let mut buf = vec![0u8; 65536];
        let mut control = [0u64; 16];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: msghdr is plain data; zero is a valid start.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = size_of_val(&control);
        // SAFETY: msg points at live buffers of the stated sizes.
        let n = unsafe { libc::recvmsg(self.0.as_raw_fd(), &mut msg, 0) };
        if n < 0 {
            bail!("recvmsg: {}", std::io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        if let Some(tag) = stripped_vlan(&msg) {
            // Put back the tag the kernel moved into metadata, as libpcap does.
            buf.splice(12..12, tag);
        }
        Ok(Some(buf))
    }
}

/// The VLAN tag (TPID and TCI) the kernel stripped from a received frame,
/// from its PACKET_AUXDATA.
fn stripped_vlan(msg: &libc::msghdr) -> Option<[u8; 4]> {
    // SAFETY: walking the control messages recvmsg filled in.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !cmsg.is_null() {
        // SAFETY: a valid control message header.
        let c = unsafe { &*cmsg };
        if c.cmsg_level == libc::SOL_PACKET && c.cmsg_type == libc::PACKET_AUXDATA {
            // SAFETY: PACKET_AUXDATA carries a tpacket_auxdata.
            let aux = unsafe {
                std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::tpacket_auxdata>())
            };
            if aux.tp_status & libc::TP_STATUS_VLAN_VALID == 0 {
                return None;
            }
            let tpid = if aux.tp_status & libc::TP_STATUS_VLAN_TPID_VALID != 0 {
                aux.tp_vlan_tpid
            } else {
                0x8100
            };
            let [p0, p1] = tpid.to_be_bytes();
            let [t0, t1] = aux.tp_vlan_tci.to_be_bytes();
            return Some([p0, p1, t0, t1]);
        }
        // SAFETY: advancing within the same control buffer.
        cmsg = unsafe { libc::CMSG_NXTHDR(msg, cmsg) };
    }
    None
}

/// Sends `frames` out of `iface` in namespace `ns`.
pub fn send(ns: &str, iface: &str, frames: &[Vec<u8>]) -> Result<()> {
    in_netns(ns, || send_here(iface, frames))?
}

/// Sends `frames` out of `iface` in this thread's network namespace.
pub fn send_here(iface: &str, frames: &[Vec<u8>]) -> Result<()> {
    let sock = PacketSocket::bind(iface)?;
    frames.iter().try_for_each(|f| sock.send(f))
}

/// Captures what reaches `iface` in namespace `ns` (after XDP: packet sockets
/// see only what the program passed) while `during` runs, and after it until
/// `quiet` passes with nothing new. (However long `during` is silent, as
/// while it sends frames that are to be dropped, the capture goes on.)
pub fn capture_during<T>(
    ns: &str,
    iface: &str,
    quiet: Duration,
    during: impl FnOnce() -> T,
) -> Result<(T, Vec<Vec<u8>>)> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let done = Arc::new(AtomicBool::new(false));
    let (iface, ns, sent) = (iface.to_string(), ns.to_string(), done.clone());
    let capture = thread::spawn(move || -> Result<Vec<Vec<u8>>> {
        enter(&ns)?;
        let sock = PacketSocket::bind(&iface)?;
        ready_tx.send(()).ok();
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            // Read before the silence: a frame sent last is still taken.
            let finished = sent.load(Ordering::Acquire);
            match sock.recv(quiet)? {
                Some(frame) => got.push(frame),
                None if finished => break,
                None => {}
            }
        }
        Ok(got)
    });
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .context("the capture socket did not come up")?;
    let result = during();
    done.store(true, Ordering::Release);
    let got = capture
        .join()
        .map_err(|_| anyhow::anyhow!("capture thread panicked"))??;
    Ok((result, got))
}
