//! Soft-RoCE devices made and removed, and RDMA devices moved between
//! network namespaces, over RDMA netlink: what `rdma link add NAME type rxe
//! netdev IFACE`, `rdma link delete`, `rdma dev set NAME netns NS` and
//! `rdma system show netns` do. Each call speaks from the calling thread's
//! network namespace, where the kernel looks names and indexes up (in
//! exclusive mode a device is seen only in its own): call it from there.

use std::os::fd::AsRawFd;

use anyhow::{Context as _, Result};

use super::{
    dump,
    nldev::{self, Doit, attr, command},
    socket::Connection,
};

/// Whether the RDMA subsystem is in exclusive network-namespace mode (each
/// device seen, and opened, only in its namespace), not shared (every
/// device in every namespace).
pub fn netns_exclusive() -> Result<bool> {
    let replies = Connection::open()?.request(Doit::new(command::SYS_GET))?;
    let reply = replies
        .first()
        .context("RDMA netlink sent no reply to `rdma system show`")?;
    nldev::netns_exclusive(&reply.attrs).context("decoding the RDMA subsystem's settings")
}

/// Makes soft-RoCE device `name` on `netdev`, a network device of this
/// namespace. The kernel registers it in the initial namespace.
pub fn add_rxe(name: &str, netdev: &str) -> Result<()> {
    Connection::open()?
        .request(
            Doit::new(command::NEWLINK)
                .string(attr::DEV_NAME, name)
                .string(attr::LINK_TYPE, "rxe")
                .string(attr::NDEV_NAME, netdev),
        )
        .with_context(|| format!("making soft-RoCE device {name} on {netdev}"))?;
    Ok(())
}

/// The index of RDMA device `name`, if this namespace sees it.
pub fn index_of(name: &str) -> Result<Option<u32>> {
    let mut nl = Connection::open()?;
    for reply in dump(&mut nl, command::GET, None)? {
        let info = nldev::device(&reply).context("decoding an RDMA device")?;
        if info.name == name {
            return Ok(Some(info.index));
        }
    }
    Ok(None)
}

/// Removes the soft device at `index` (rdma_rxe, siw).
pub fn delete(index: u32) -> Result<()> {
    Connection::open()?
        .request(Doit::new(command::DELLINK).u32(attr::DEV_INDEX, index))
        .with_context(|| format!("removing RDMA device {index}"))?;
    Ok(())
}

/// Moves the device at `index` into the network namespace `netns` (an
/// open nsfs file). Only exclusive mode moves devices, and only drivers
/// that allow it (rdma_rxe in Linux 6.12 and older does not: EOPNOTSUPP).
pub fn move_to(index: u32, netns: &impl AsRawFd) -> Result<()> {
    let fd = u32::try_from(netns.as_raw_fd()).context("a namespace's file descriptor")?;
    Connection::open()?
        .request(
            Doit::new(command::SET)
                .u32(attr::DEV_INDEX, index)
                .u32(attr::NET_NS_FD, fd),
        )
        .with_context(|| format!("moving RDMA device {index} to another network namespace"))?;
    Ok(())
}

/// The errno the kernel refused a request with, if that is what `e` is.
pub fn errno(e: &anyhow::Error) -> Option<i32> {
    e.root_cause()
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::raw_os_error)
}
