//! A wake-up on every QP creation (a kernel return probe), so a foreground
//! attachment binds new QPs at once rather than at its next poll. Where the
//! probe cannot attach (no ib_core, no kprobes), polling alone remains.

use std::os::fd::{AsRawFd, RawFd};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf,
    maps::{MapData, RingBuf},
    programs::KProbe,
};

/// The watcher object built from pkeyfw-ebpf's `pkeyfw-watch`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pkeyfw-watch"));

/// Functions every QP creation returns through (user and kernel QPs).
const CREATORS: [&str; 2] = ["ib_create_qp_user", "ib_create_qp_kernel"];

/// The probe and the ring buffer it signals through.
pub struct QpWatch {
    /// Holds the program and its attachments.
    _ebpf: Ebpf,
    ring: RingBuf<MapData>,
}

impl QpWatch {
    /// Loads and attaches the probe.
    pub fn start() -> Result<QpWatch> {
        let mut ebpf = Ebpf::load(OBJECT).context("loading the QP-creation probe")?;
        let program: &mut KProbe = ebpf
            .program_mut("pkeyfw_qp_created")
            .ok_or_else(|| anyhow!("the watch object has no program"))?
            .try_into()?;
        program.load().context("loading the QP-creation probe")?;
        for f in CREATORS {
            program
                .attach(f, 0)
                .with_context(|| format!("probing {f} (is ib_core loaded?)"))?;
        }
        let ring = RingBuf::try_from(
            ebpf.take_map("QP_CREATED")
                .ok_or_else(|| anyhow!("the watch object has no ring buffer"))?,
        )?;
        Ok(QpWatch { _ebpf: ebpf, ring })
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

impl AsRawFd for QpWatch {
    fn as_raw_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }
}
