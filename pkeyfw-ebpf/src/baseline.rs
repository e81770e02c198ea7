//! The bench's baseline: an empty XDP_PASS program, which the per-packet
//! cost of the filter is reported beside. An object of its own, so that the
//! production object (`pkeyfw`) carries only the programs pkeyfw runs.
#![no_std]
#![no_main]

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};

#[xdp]
pub fn pkeyfw_empty(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
