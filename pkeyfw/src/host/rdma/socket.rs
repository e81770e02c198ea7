//! A NETLINK_RDMA socket that runs nldev dumps and requests: send one
//! request, read datagrams until the dump's NLMSG_DONE or the request's
//! acknowledgement. Splitting and checking the datagrams is pure ([`read`]);
//! the socket only moves bytes.

use std::{fmt, io::ErrorKind};

use anyhow::{Context as _, Result, anyhow, bail};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkBuffer, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, NetlinkSerializable,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_RDMA};

use super::nldev::{Doit, Reply, Request};

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
        self.exchange(request, NLM_F_DUMP, End::Done)
    }

    /// A request that is no dump (a device made, moved or removed; the
    /// subsystem's settings): the replies before the kernel acknowledges
    /// it. A refusal is an error with the kernel's errno.
    pub fn request(&mut self, request: Doit) -> Result<Vec<Reply>> {
        self.exchange(request, NLM_F_ACK, End::Ack)
    }

    fn exchange<R: NetlinkSerializable>(
        &mut self,
        request: R,
        flags: u16,
        end: End,
    ) -> Result<Vec<Reply>> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
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
            if read(&datagram, self.seq, &mut replies, end)? {
                return Ok(replies);
            }
        }
    }
}

/// What ends an exchange: a dump's NLMSG_DONE, or a request's
/// acknowledgement (an NLMSG_ERROR of errno 0).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum End {
    Done,
    Ack,
}

/// [`read`] of a dump, as the tests drive it.
#[cfg(test)]
pub fn take(datagram: &[u8], seq: u32, replies: &mut Vec<Reply>) -> Result<bool> {
    read(datagram, seq, replies, End::Done)
}

/// Adds the replies in one datagram of the exchange numbered `seq` to
/// `replies`; true once it is over (`end`). A failed dump or request, a
/// reply to another request or an undecodable message is an error.
pub fn read(datagram: &[u8], seq: u32, replies: &mut Vec<Reply>, end: End) -> Result<bool> {
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
            NetlinkPayload::Error(e) => match (e.code, end) {
                (Some(code), _) => {
                    return Err(errno(code.get())).context("RDMA netlink refused the request");
                }
                (None, End::Ack) => return Ok(true),
                (None, End::Done) => {
                    bail!("RDMA netlink acknowledged a dump instead of answering it")
                }
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
