//! Wakes a foreground `pkeyfw attach` the moment a QP is created, so that
//! `[[bind]]` rules bind it before its peer learns its number, instead of
//! at the next RDMA-netlink poll. Attached as a return probe to
//! ib_create_qp_user and ib_create_qp_kernel: when they return, the QP is in
//! the restrack table that RDMA netlink reads.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_RB_FORCE_WAKEUP,
    btf_maps::RingBuf,
    helpers::bpf_get_current_pid_tgid,
    macros::{btf_map, kretprobe},
    programs::RetProbeContext,
};

/// The creating process's PID, per QP created.
#[btf_map]
static QP_CREATED: RingBuf<u32, 4096> = RingBuf::new();

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
