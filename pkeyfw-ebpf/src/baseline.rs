//! Bench equipment, in an object of its own so that the production object
//! (`pkeyfw`) carries only the programs pkeyfw runs: an empty XDP_PASS
//! program, the least partition check an XDP program can make, which the
//! filter's per-packet cost is reported beside, and the live bench's
//! traffic generator.
#![no_std]
#![no_main]
#![feature(asm_experimental_arch)]

mod object;

use aya_ebpf::{
    bindings::xdp_action,
    btf_maps::Array,
    helpers::generated::bpf_redirect,
    macros::{btf_map, xdp},
    programs::XdpContext,
};
use pkeyfw_common::{
    abi::QPN_MASK,
    parse::{ROCE_V2_PORT, ethertype, proto},
    pkey,
};

/// The interface the generator sends to, set by the loader
/// (`EbpfLoader::override_global`).
#[unsafe(no_mangle)]
static TARGET_IFINDEX: u32 = 0;

/// QPNs the minimal check's table covers; a frame to a higher one is
/// dropped, as to any QP the table does not hold.
const MINIMAL_QPNS: usize = 1 << 16;

/// The minimal check's table: QPN → its QP's P_Key, 0 where there is no QP
/// (the invalid P_Key, which matches nothing).
#[btf_map]
static MINIMAL_QPS: Array<u16, MINIMAL_QPNS> = Array::new();

#[xdp]
pub fn pkeyfw_empty(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

/// The least an XDP program does to enforce partitions, as one would write
/// it by hand: Ethernet with at most one VLAN tag, IPv4 or IPv6 without
/// extension headers, UDP 4791, the BTH, its destination QP's P_Key from
/// an array, Table 16-2. What is not RoCE v2 passes; a RoCE v2 frame too
/// short for its BTH is dropped. No counters, no events, no Q_Key, opcode
/// or management-QP rules: the floor pkeyfw's cost is reported beside.
#[xdp]
pub fn pkeyfw_minimal(ctx: XdpContext) -> u32 {
    if minimal_pass(ctx.data(), ctx.data_end()) {
        xdp_action::XDP_PASS
    } else {
        xdp_action::XDP_DROP
    }
}

#[inline(always)]
fn minimal_pass(data: usize, end: usize) -> bool {
    if data + 14 > end {
        return true;
    }
    let mut l3 = data + 14;
    // SAFETY (every load below): within [data, end), checked just before.
    let mut ether_type = unsafe { be16(data + 12) };
    if ether_type == ethertype::VLAN {
        if l3 + 4 > end {
            return true;
        }
        ether_type = unsafe { be16(l3 + 2) };
        l3 += 4;
    }
    let udp = match ether_type {
        ethertype::IPV4 => {
            if l3 + 20 > end || unsafe { byte(l3 + 9) } != proto::UDP {
                return true;
            }
            l3 + usize::from(unsafe { byte(l3) } & 0x0f) * 4
        }
        ethertype::IPV6 => {
            if l3 + 40 > end || unsafe { byte(l3 + 6) } != proto::UDP {
                return true;
            }
            l3 + 40
        }
        _ => return true,
    };
    if udp + 8 > end || unsafe { be16(udp + 2) } != ROCE_V2_PORT {
        return true;
    }
    let bth = udp + 8;
    if bth + 12 > end {
        return false;
    }
    let pkey = unsafe { be16(bth + 2) };
    let qpn = unsafe { be32(bth + 4) } & QPN_MASK;
    MINIMAL_QPS
        .get(qpn)
        .is_some_and(|&qp_pkey| pkey::matches(pkey, qp_pkey))
}

/// The byte at packet address `at`.
///
/// # Safety
/// `at` must be packet memory the verifier has seen bounded.
#[inline(always)]
unsafe fn byte(at: usize) -> u8 {
    unsafe { *(at as *const u8) }
}

/// The big-endian u16 at packet address `at`, in one load (a Rust read of
/// bytes is compiled a byte at a time; C's header structs get one load,
/// which the verifier takes misaligned on x86-64 and arm64).
///
/// # Safety
/// `[at, at + 2)` must be packet memory the verifier has seen bounded.
#[inline(always)]
unsafe fn be16(at: usize) -> u16 {
    let v: u16;
    unsafe {
        core::arch::asm!(
            "{v} = *(u16 *)({p} + 0)",
            v = out(reg) v,
            p = in(reg) at,
            options(pure, readonly, nostack),
        )
    };
    u16::from_be(v)
}

/// The big-endian u32 at packet address `at`, in one load (see [`be16`]).
///
/// # Safety
/// `[at, at + 4)` must be packet memory the verifier has seen bounded.
#[inline(always)]
unsafe fn be32(at: usize) -> u32 {
    let v: u32;
    unsafe {
        core::arch::asm!(
            "{v} = *(u32 *)({p} + 0)",
            v = out(reg) v,
            p = in(reg) at,
            options(pure, readonly, nostack),
        )
    };
    u32::from_be(v)
}

/// Run by BPF_PROG_TEST_RUN in live-frames mode: each frame of the test run
/// goes out of `TARGET_IFINDEX`, as xdp-trafficgen sends.
#[xdp]
pub fn pkeyfw_generator(_ctx: XdpContext) -> u32 {
    // SAFETY: a plain read of a constant the loader sets; volatile so that
    // the compiler does not fold the initial 0 in.
    let ifindex = unsafe { core::ptr::read_volatile(&raw const TARGET_IFINDEX) };
    // SAFETY: a helper call with plain arguments.
    unsafe { bpf_redirect(ifindex, 0) as u32 }
}
