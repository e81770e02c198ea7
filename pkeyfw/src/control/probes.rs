//! The RDMA-core probes of a foreground attachment: a wake-up on every QP
//! creation, so new QPs are bound at once rather than at the next poll, and
//! the connection probe, which writes a connected QP's peer into the
//! filter's `CONNS` as the QP is given it (see pkeyfw-ebpf's probes.rs).
//! Where the creation probe cannot attach (no ib_core, no kprobes), polling
//! alone remains; where the connection probe cannot (no ib_core BTF), the
//! peer is learnt from RDMA netlink at the next poll.

use std::{
    os::fd::{AsRawFd, RawFd},
    path::Path,
};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, RingBuf},
    programs::KProbe,
};
use pkeyfw_common::abi::{QpLayout, name};

use crate::{control::rdma, loading::btf::Btf};

/// The probes object built from pkeyfw-ebpf's `pkeyfw-probes`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pkeyfw-probes"));

/// Functions every QP creation returns through (user and kernel QPs).
const CREATORS: [&str; 2] = ["ib_create_qp_user", "ib_create_qp_kernel"];
/// The function every user QP's modify goes through (uverbs).
const CONNECTOR: &str = "ib_modify_qp_with_udata";

/// The probes and the ring buffer the creation probe signals through.
pub struct Probes {
    /// Holds the programs and their attachments.
    _ebpf: Ebpf,
    ring: RingBuf<MapData>,
    /// Why the connection probe is not attached, if it is not.
    pub connections: Result<(), String>,
}

impl Probes {
    /// Loads and attaches the probes for the filter pinned under `pins`,
    /// on interface `ifindex`.
    pub fn start(pins: &Path, ifindex: u32) -> Result<Probes> {
        let layout = layout(ifindex);
        let conns = pins.join(name::CONNS);
        let conns_size = MapData::from_pin(&conns)
            .and_then(|m| Ok(m.info()?.max_entries()))
            .with_context(|| format!("opening {}", conns.display()))?;
        let mut ebpf = EbpfLoader::new()
            .map_pin_path(name::ACTIVE, pins.join(name::ACTIVE))
            .map_pin_path(name::CONNS, conns)
            .map_max_entries(name::CONNS, conns_size)
            .override_global(
                "LAYOUT",
                layout.as_ref().unwrap_or(&QpLayout::default()),
                true,
            )
            .load(OBJECT)
            .context("loading the RDMA probes")?;
        let connections = layout.map_err(|e| format!("{e:#}")).and_then(|_| {
            let program: &mut KProbe = ebpf
                .program_mut("pkeyfw_qp_connect")
                .ok_or("the probes object has no connection probe")?
                .try_into()
                .map_err(|e| format!("{e}"))?;
            program.load().map_err(|e| format!("{e}"))?;
            program
                .attach(CONNECTOR, 0)
                .map(drop)
                .map_err(|e| format!("probing {CONNECTOR}: {e}"))
        });
        let program: &mut KProbe = ebpf
            .program_mut("pkeyfw_qp_created")
            .ok_or_else(|| anyhow!("the probes object has no program"))?
            .try_into()?;
        program.load().context("loading the QP-creation probe")?;
        for f in CREATORS {
            program
                .attach(f, 0)
                .with_context(|| format!("probing {f} (is ib_core loaded?)"))?;
        }
        let ring = RingBuf::try_from(
            ebpf.take_map("QP_CREATED")
                .ok_or_else(|| anyhow!("the probes object has no ring buffer"))?,
        )?;
        Ok(Probes {
            _ebpf: ebpf,
            ring,
            connections,
        })
    }

    /// Empties the ring; whether any QP was created since the last call.
    pub fn drain(&mut self) -> bool {
        let mut any = false;
        while self.ring.next().is_some() {
            any = true;
        }
        any
    }
}

/// Where the connection probe finds what it reads, and the RDMA devices on
/// the interface.
fn layout(ifindex: u32) -> Result<QpLayout> {
    let btf = Btf::of_module("ib_core")?;
    let devices = rdma::devices_on(ifindex)?;
    if devices.len() > QpLayout::DEVICES {
        anyhow::bail!(
            "{} RDMA devices on the interface; the probe follows at most {}",
            devices.len(),
            QpLayout::DEVICES
        );
    }
    let mut indices = [QpLayout::NO_DEVICE; QpLayout::DEVICES];
    for (slot, d) in indices.iter_mut().zip(&devices) {
        *slot = d.index;
    }
    Ok(QpLayout {
        qp_device: btf.offset("ib_qp", &["device"])?,
        qp_num: btf.offset("ib_qp", &["qp_num"])?,
        device_index: btf.offset("ib_device", &["index"])?,
        attr_dest_qp_num: btf.offset("ib_qp_attr", &["dest_qp_num"])?,
        attr_dgid: btf.offset("ib_qp_attr", &["ah_attr", "grh", "dgid"])?,
        devices: indices,
    })
}

impl AsRawFd for Probes {
    fn as_raw_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }
}
