//! Probes on the kernel's RDMA core for a foreground `pkeyfw attach`.
//!
//! - `pkeyfw_qp_created` wakes it the moment a QP is created, so that
//!   `[[bind]]` rules bind it before its peer learns its number, instead of
//!   at the next RDMA-netlink poll. A return probe on ib_create_qp_user and
//!   ib_create_qp_kernel: when they return, the QP is in the restrack table
//!   that RDMA netlink reads.
//! - `pkeyfw_qp_connect` records a connected QP's peer in the filter's
//!   `CONNS` the moment it is given one (ib_modify_qp_with_udata with a
//!   destination QPN), so the stamping program knows the QP's first frame.
//!   A program sends right after that call returns, far sooner than
//!   userspace could read the connection from RDMA netlink.
#![no_std]
#![no_main]

use aya_ebpf::{
    Global,
    bindings::BPF_RB_FORCE_WAKEUP,
    btf_maps::{Array, HashMap, RingBuf},
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel},
    macros::{btf_map, kprobe, kretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use pkeyfw_common::abi::{ConnKey, DEFAULT_QP_CAPACITY, GENERATIONS, QPN_MASK, QpLayout};

/// The creating process's PID, per QP created.
#[btf_map]
static QP_CREATED: RingBuf<u32, 4096> = RingBuf::new();

/// The filter's maps, shared through their pins (same definitions as in
/// the XDP object; the loader sets the real sizes).
#[btf_map]
static ACTIVE: Array<u32, 1> = Array::new();
#[btf_map]
static CONNS: HashMap<ConnKey, u32, { (GENERATIONS * DEFAULT_QP_CAPACITY) as usize }> =
    HashMap::new();

/// Set by the loader from the kernel's BTF.
#[unsafe(no_mangle)]
static LAYOUT: Global<QpLayout> = Global::new(QpLayout {
    qp_device: 0,
    qp_num: 0,
    device_index: 0,
    attr_dest_qp_num: 0,
    attr_dgid: 0,
    devices: [QpLayout::NO_DEVICE; QpLayout::DEVICES],
});

#[kprobe]
pub fn pkeyfw_qp_connect(ctx: ProbeContext) -> u32 {
    let _ = record_connection(&ctx);
    0
}

/// ib_modify_qp_with_udata(qp, attr, attr_mask, udata): when the mask gives
/// a destination QPN and the QP is on one of our devices, map (DestQP, peer
/// GID) to its QPN in the live generation. The GID of a RoCE v2 IPv4 peer is
/// its v4-mapped address, the key stamping looks up; without an address
/// vector in the call, the peer is unknown (all zeros), its fallback key.
fn record_connection(ctx: &ProbeContext) -> Option<()> {
    let qp: *const u8 = ctx.arg(0)?;
    let attr: *const u8 = ctx.arg(1)?;
    let mask: u32 = ctx.arg(2)?;
    if mask & QpLayout::MASK_DEST_QPN == 0 {
        return None;
    }
    let layout = LAYOUT.load();
    let device: *const u8 = read(qp, layout.qp_device)?;
    let index: u32 = read(device, layout.device_index)?;
    if !layout.devices.contains(&index) {
        return None;
    }
    let local: u32 = read(qp, layout.qp_num)?;
    let remote: u32 = read(attr, layout.attr_dest_qp_num)?;
    let addr: [u8; 16] = if mask & QpLayout::MASK_AV != 0 {
        read(attr, layout.attr_dgid)?
    } else {
        [0; 16]
    };
    let generation = *ACTIVE.get(0)? & 1;
    let key = ConnKey {
        generation,
        remote_qpn: remote & QPN_MASK,
        addr,
    };
    CONNS.insert(&key, &local, 0).ok()
}

/// A `T` at `base + offset` in kernel memory.
#[inline(always)]
fn read<T>(base: *const u8, offset: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel checks the address.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<T>()) }.ok()
}

#[kretprobe]
pub fn pkeyfw_qp_created(_ctx: RetProbeContext) -> u32 {
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // A full ring already holds a wake-up; losing this one changes nothing.
    let _ = QP_CREATED.output(&pid, BPF_RB_FORCE_WAKEUP as u64);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
