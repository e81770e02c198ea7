//! Bench equipment, in an object of its own so that the production object
//! (`pkeyfw`) carries only the programs pkeyfw runs: an empty XDP_PASS
//! program, which the per-packet cost of the filter is reported beside, and
//! the live bench's traffic generator.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::xdp_action, helpers::generated::bpf_redirect, macros::xdp, programs::XdpContext,
};

/// The interface the generator sends to, set by the loader
/// (`EbpfLoader::override_global`).
#[unsafe(no_mangle)]
static TARGET_IFINDEX: u32 = 0;

#[xdp]
pub fn pkeyfw_empty(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
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

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
