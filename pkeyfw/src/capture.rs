//! Reading frames from pcap and pcapng captures, as Ethernet frames.

use std::path::Path;

use anyhow::{Context as _, Result, bail};
use pcap_file::{
    DataLink,
    pcap::PcapReader,
    pcapng::{Block, PcapNgReader},
};

/// One captured frame.
pub struct Captured {
    /// 0-based position in the capture.
    pub index: usize,
    /// The frame, starting with its Ethernet header.
    pub data: Vec<u8>,
    /// The frame's length on the wire; larger than `data` when the capture
    /// was cut by its snap length.
    pub wire_len: usize,
}

/// Reads every frame of a pcap or pcapng file.
pub fn read(path: &Path) -> Result<Vec<Captured>> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("{}: cannot read the capture", path.display()))?;
    let frames = if bytes.starts_with(&[0x0a, 0x0d, 0x0d, 0x0a]) {
        read_pcapng(&bytes)
    } else {
        read_pcap(&bytes)
    };
    frames.with_context(|| format!("{}", path.display()))
}

fn read_pcap(bytes: &[u8]) -> Result<Vec<Captured>> {
    let mut reader = PcapReader::new(bytes).context("not a pcap or pcapng capture")?;
    let link = reader.header().datalink;
    let mut frames = Vec::new();
    while let Some(packet) = reader.next_packet() {
        let index = frames.len();
        let packet = packet.with_context(|| format!("frame {index} is unreadable"))?;
        frames.push(Captured {
            index,
            data: to_ethernet(link, &packet.data).with_context(|| format!("frame {index}"))?,
            wire_len: ethernet_len(link, packet.orig_len as usize),
        });
    }
    Ok(frames)
}

fn read_pcapng(bytes: &[u8]) -> Result<Vec<Captured>> {
    let mut reader = PcapNgReader::new(bytes).context("not a pcapng capture")?;
    let mut frames = Vec::new();
    while let Some(block) = reader.next_block() {
        let index = frames.len();
        let block = block.with_context(|| format!("block after frame {index} is unreadable"))?;
        let (interface, data, orig_len) = match block {
            Block::EnhancedPacket(p) => (p.interface_id, p.data.into_owned(), p.original_len),
            Block::SimplePacket(p) => (0, p.data.into_owned(), p.original_len),
            Block::Packet(p) => (p.interface_id.into(), p.data.into_owned(), p.original_len),
            _ => continue,
        };
        let link = reader
            .interfaces()
            .get(interface as usize)
            .map(|i| i.linktype)
            .with_context(|| format!("frame {index} names undeclared interface {interface}"))?;
        frames.push(Captured {
            index,
            data: to_ethernet(link, &data).with_context(|| format!("frame {index}"))?,
            wire_len: ethernet_len(link, orig_len as usize),
        });
    }
    Ok(frames)
}

/// Bytes a Linux cooked header takes beyond the Ethernet header it stands for.
fn cooked_extra(link: DataLink) -> usize {
    match link {
        DataLink::LINUX_SLL => SLL_LEN - ETH_LEN,
        DataLink::LINUX_SLL2 => SLL2_LEN - ETH_LEN,
        _ => 0,
    }
}

fn ethernet_len(link: DataLink, len: usize) -> usize {
    len.saturating_sub(cooked_extra(link))
}

const ETH_LEN: usize = 14;
const SLL_LEN: usize = 16;
const SLL2_LEN: usize = 20;

/// The frame as the XDP program would see it on an Ethernet interface. Linux
/// cooked captures (`tcpdump -i any`) get an Ethernet header with their
/// protocol and source address.
fn to_ethernet(link: DataLink, data: &[u8]) -> Result<Vec<u8>> {
    let (protocol, source, payload): (&[u8], &[u8], &[u8]) = match link {
        DataLink::ETHERNET => return Ok(data.to_vec()),
        DataLink::LINUX_SLL if data.len() >= SLL_LEN => {
            (&data[14..16], &data[6..12], &data[SLL_LEN..])
        }
        DataLink::LINUX_SLL2 if data.len() >= SLL2_LEN => {
            (&data[0..2], &data[12..18], &data[SLL2_LEN..])
        }
        DataLink::LINUX_SLL | DataLink::LINUX_SLL2 => {
            bail!(
                "a {} byte frame is shorter than its Linux cooked header",
                data.len()
            )
        }
        other => bail!(
            "unsupported link type {other:?}; expected Ethernet (1) or Linux cooked (113, 276)"
        ),
    };
    // Destination unknown: a cooked capture records only the source.
    let mut frame = vec![0u8; 6];
    frame.extend_from_slice(source);
    frame.extend_from_slice(protocol);
    frame.extend_from_slice(payload);
    Ok(frame)
}
