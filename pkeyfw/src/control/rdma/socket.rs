//! A NETLINK_RDMA socket that runs nldev dumps: send one request, read
//! datagrams until the dump's NLMSG_DONE. Splitting and checking the
//! datagrams is pure ([`take`]); the socket only moves bytes.

use std::{fmt, io::ErrorKind};

use anyhow::{Context as _, Result, anyhow, bail};
use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_RDMA};

use super::nldev::{Reply, Request};

/// The kernel has no RDMA netlink: ib_core is not loaded, so there is no
/// RDMA device either.
#[derive(Debug)]
pub struct NoRdmaNetlink;

impl fmt::Display for NoRdmaNetlink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no RDMA netlink (is ib_core loaded?)")
    }
}

impl std::error::Error for NoRdmaNetlink {}

/// A connection to the kernel's RDMA netlink, for a few dumps in a row.
pub struct Connection {
    socket: Socket,
    /// Sequence number of the last request.
    seq: u32,
}

impl Connection {
    pub fn open() -> Result<Connection> {
        let mut socket = Socket::new(NETLINK_RDMA).map_err(|e| match e.raw_os_error() {
            Some(libc::EPROTONOSUPPORT) => anyhow!(NoRdmaNetlink),
            _ => anyhow!(e).context("RDMA netlink socket"),
        })?;
        socket
            .bind_auto()
            .context("binding the RDMA netlink socket")?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .context("connecting the RDMA netlink socket")?;
        Ok(Connection { socket, seq: 0 })
    }

    /// Every reply message of a dump, in the kernel's order.
    pub fn dump(&mut self, request: Request) -> Result<Vec<Reply>> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        header.sequence_number = self.seq;
        let mut message = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(request));
        message.finalize();
        let mut buf = vec![0; message.buffer_len()];
        message.serialize(&mut buf);
        self.socket
            .send(&buf, 0)
            .context("sending to RDMA netlink")?;

        let mut replies = Vec::new();
        loop {
            let datagram = match self.socket.recv_from_full() {
                Ok((datagram, _)) => datagram,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).context("receiving from RDMA netlink"),
            };
            if take(&datagram, self.seq, &mut replies)? {
                return Ok(replies);
            }
        }
    }
}

/// Adds the replies in one datagram of the dump numbered `seq` to
/// `replies`; true once the dump is done. A failed dump, a reply to another
/// request or an undecodable message is an error.
pub fn take(datagram: &[u8], seq: u32, replies: &mut Vec<Reply>) -> Result<bool> {
    let mut rest = datagram;
    while !rest.is_empty() {
        let len = NetlinkBuffer::new_checked(rest)
            .context("a truncated RDMA netlink message")?
            .length() as usize;
        let message = NetlinkMessage::<Reply>::deserialize(&rest[..len])
            .context("decoding an RDMA netlink message")?;
        // Messages are 4-byte aligned; the last one may end the datagram.
        rest = &rest[len.next_multiple_of(4).min(rest.len())..];
        if message.header.sequence_number != seq {
            bail!(
                "RDMA netlink answered request {} while waiting for {seq}",
                message.header.sequence_number
            );
        }
        match message.payload {
            NetlinkPayload::InnerMessage(reply) => replies.push(reply),
            // A dump that fails once started ends with a negative errno here.
            NetlinkPayload::Done(done) if done.code < 0 => {
                return Err(errno(done.code)).context("RDMA netlink dump failed");
            }
            NetlinkPayload::Done(_) => return Ok(true),
            NetlinkPayload::Error(e) => match e.code {
                Some(code) => {
                    return Err(errno(code.get())).context("RDMA netlink refused the request");
                }
                None => bail!("RDMA netlink acknowledged a dump instead of answering it"),
            },
            NetlinkPayload::Noop => {}
            NetlinkPayload::Overrun(_) => bail!("RDMA netlink overran its reply"),
            other => bail!("unexpected RDMA netlink message {other:?}"),
        }
    }
    Ok(false)
}

/// A negative errno as an I/O error, for its text.
fn errno(code: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(code.saturating_neg())
}
